/* SPDX-License-Identifier: MIT */
/*
 * Growth by touch, placed ahead (SB_BUF_GROWS). A buffer that places the
 * page right after a placed one is growing at its end (a KV cache written
 * one row at a time without sb_kv_prepare). Every region of such a cache
 * crosses into its next page at the same step, and a fault costs a round
 * trip through the handler thread (70 us on a 2-vCPU VM): 72 regions made
 * one step stall 5 ms. So the pool's ready thread watches each growing
 * buffer's frontier (its last page placed by the owner or by the watch):
 * once the owner has entered it, it places the next page, which becomes
 * the frontier. Growth then takes no fault at all, and a buffer holds at
 * most one page beyond the one being written. Placements in the
 * background (prefetch, the watch itself) move no frontier: only the
 * owner's own (sb_buf_map, a fault) and its writes do.
 *
 * Entered means the first bytes of the page ahead are no longer all zero,
 * read through the buffer's own mapping (placed: no fault; grow_serve.c
 * says why it stays so while read). A buffer that writes zeros there is seen
 * late: its next page then faults as before, and the watch continues from
 * that fault. A watch ends when the buffer is unmapped or destroyed
 * (sbi_prefetch_cancel) or reaches its end; it holds at most one page per
 * watched buffer beyond what was touched. A buffer that pauses (a chat
 * waiting for its user, a benchmark measuring) keeps its watch: one that
 * ended would leave the next page to the owner's own placement, and after
 * a pause every region crosses into it (measured: 0.5-0.8 ms steps after
 * bench/kv's pause at 4096 tokens). An idle watch is looked at less often
 * (every 10 ms after 2 s without progress, every 100 ms after 30 s), and
 * gives up its slot only when another buffer needs one and none is free.
 *
 * Only buffers created SB_BUF_GROWS are watched: the page ahead is memory
 * the owner did not ask for, and sb_buf_map then finds it placed. Such a
 * buffer is neither evictable (eviction has its own say over what stays
 * placed) nor strict (its touches never reach the handler).
 */
#include "internal.h"
#include "grow.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void sbi_grow_note(struct sb_buf *buf, size_t idx)
{
	struct sb_pool *pool = buf->pool;
	uint32_t k, free_k = SBI_GROW_MAX, idle_k = SBI_GROW_MAX;
	uint64_t now;

	if (!idx || idx + 1 >= buf->npages || !grow_watchable(buf) ||
	    !sbi_pte_has_page(buf->pte[idx - 1]))
		return;
	now = sbi_mono_ms();
	pthread_mutex_lock(&pool->pf_lock);
	/* A thread changing the buffer's mappings cancelled its watch
	 * (sbi_bg_quiet_begin): a note now (a fault's, after its wake-up)
	 * would start it again on a page about to go. The next placement at
	 * the end notes it again. */
	if (buf->bg_quiet) {
		pthread_mutex_unlock(&pool->pf_lock);
		return;
	}
	for (k = 0; k < SBI_GROW_MAX; k++) {
		const struct sbi_grow *g = &pool->grow[k];

		if (g->buf == buf)
			break;
		if (!g->buf && free_k == SBI_GROW_MAX)
			free_k = k;
		/* The longest idle, if idle at all: its slot can go. */
		if (g->buf && g->since_ms + IDLE_MS < now &&
		    (idle_k == SBI_GROW_MAX ||
		     g->since_ms < pool->grow[idle_k].since_ms))
			idle_k = k;
	}
	if (k == SBI_GROW_MAX && free_k == SBI_GROW_MAX && idle_k != SBI_GROW_MAX) {
		/* Every slot taken: an idle buffer's next page will fault
		 * (a serve under way for it finds the slot changed). */
		pool->grow[idle_k] = (struct sbi_grow){0};
		__atomic_sub_fetch(&pool->ngrow, 1, __ATOMIC_RELAXED);
		free_k = idle_k;
	}
	if (k == SBI_GROW_MAX)
		k = free_k;	/* full: this one grows by faults */
	if (k < SBI_GROW_MAX && (k == free_k || pool->grow[k].cur < idx)) {
		/* The owner placed a page past the frontier itself (the
		 * one the watch was about to, or further): it outran the
		 * watch, whose next page then goes first from now on. The
		 * mark stays: such an owner asks early at every page. */
		bool urgent = k != free_k;

		pool->grow[k] = (struct sbi_grow){buf, idx, now, 0, urgent};
		if (free_k == k)
			__atomic_add_fetch(&pool->ngrow, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&pool->pf_lock);
}

bool sbi_grow_urgent(const struct sb_buf *buf, size_t idx)
{
	SBI_HELD(&buf->lock);
	const struct sb_pool *pool = buf->pool;
	uint32_t stolen = __atomic_load_n(&buf->steals, __ATOMIC_RELAXED);

	/* At the growing end: the page before placed, nothing ever placed
	 * from here on (a hole in the middle is refilled from the run as
	 * ever). Pages of 64 KiB and more: below, zeroing one costs less
	 * than the mappings. One page out of turn, and one per four runs'
	 * worth placed (up to three mappings each; 16 MiB at most pages). */
	return grow_watchable(buf) && pool->page_size >= 64 * 1024 &&
	       idx && idx < buf->npages && idx >= buf->grow_hi &&
	       sbi_pte_has_page(buf->pte[idx - 1]) &&
	       (idx + 1 == buf->npages ||
		!sbi_pte_has_page(buf->pte[idx + 1])) &&
	       stolen < 1 + buf->nplaced / (4 * (size_t)sbi_run_pages(pool));
}

void sbi_grow_cancel(struct sb_buf *buf)
{
	SBI_HELD(&buf->pool->pf_lock);
	struct sb_pool *pool = buf->pool;

	/* pf_lock held by the caller (sbi_prefetch_cancel). */
	for (uint32_t k = 0; k < SBI_GROW_MAX && pool->ngrow; k++) {
		if (pool->grow[k].buf == buf) {
			pool->grow[k] = (struct sbi_grow){0};
			__atomic_sub_fetch(&pool->ngrow, 1, __ATOMIC_RELAXED);
		}
	}
}

