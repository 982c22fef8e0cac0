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
 * read through the heap file (pread: no mapping, no fault, nothing the
 * owner's thread can notice). A buffer that writes zeros there is seen
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

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Bytes looked at to tell whether the page ahead was entered. */
#define PEEK 256
/* A watch with no progress for this long is idle: looked at every
 * IDLE_POLL_MS, and after LONG_IDLE_MS every LONG_POLL_MS (a page of
 * growth still leaves that much time: 128 rows of a KV region). */
#define IDLE_MS 2000
#define IDLE_POLL_MS 10
#define LONG_IDLE_MS 30000
#define LONG_POLL_MS 100
/* Placements per millisecond at most: a burst (every region of a KV cache
 * entered its page while this thread slept) spreads over a few
 * milliseconds instead of holding the mmap lock back to back. A page is
 * placed a whole page of growth ahead of need: there is time. */
#define BURST 4

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static bool watchable(const struct sb_buf *buf)
{
	return (buf->flags & SB_BUF_GROWS) && !buf->src;
}

/* Milliseconds until an unchanged watch is looked at again. */
static uint64_t poll_ms(uint64_t idle)
{
	return idle < IDLE_MS ? 1 : idle < LONG_IDLE_MS ? IDLE_POLL_MS : LONG_POLL_MS;
}

void sbi_grow_note(struct sb_buf *buf, size_t idx)
{
	struct sb_pool *pool = buf->pool;
	uint32_t k, free_k = SBI_GROW_MAX, idle_k = SBI_GROW_MAX;
	uint64_t now;

	if (!idx || idx + 1 >= buf->npages || !watchable(buf) ||
	    !sbi_pte_pid(buf->pte[idx - 1]))
		return;
	now = mono_ms();
	pthread_mutex_lock(&pool->pf_lock);
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
		pool->grow[k] = (struct sbi_grow){buf, idx, now, 0};
		if (free_k == k)
			__atomic_add_fetch(&pool->ngrow, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&pool->pf_lock);
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

/* Has the owner written the first bytes of page pid? */
static bool entered(struct sb_pool *pool, sbi_pid pid)
{
	static const char zero[PEEK];
	char peek[PEEK];
	struct sbi_heap *h = sbi_pid_heap(pool, pid);
	off_t off = (off_t)((size_t)sbi_pid_index(pool, pid) << pool->page_shift);

	return pread(h->fd, peek, sizeof(peek), off) == (ssize_t)sizeof(peek) &&
	       memcmp(peek, zero, sizeof(peek)) != 0;
}

/*
 * One watch: once the owner has entered the frontier page, place the page
 * after it and make that the frontier. Returns the watch's next state (buf
 * NULL: ended) and whether a page was placed. No lock held; the buffer
 * stays alive meanwhile (pf_inflight: unmap and destroy wait for it).
 */
static struct sbi_grow serve_one(struct sb_pool *pool, struct sbi_grow g,
				 uint64_t now, bool *placed)
{
	struct sb_buf *buf = g.buf;
	uint64_t pte;
	long r;

	pthread_rwlock_rdlock(&pool->layout);
	pthread_mutex_lock(&buf->lock);
	pte = buf->pte[g.cur];
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);

	if (!sbi_pte_pid(pte))
		return (struct sbi_grow){0};	/* released, poisoned */
	if (!entered(pool, sbi_pte_pid(pte) - 1)) {
		/* since_ms may be later than now (noted meanwhile). */
		g.due_ms = now + poll_ms(now > g.since_ms ? now - g.since_ms : 0);
		return g;
	}
	if (g.cur + 1 >= buf->npages)
		return (struct sbi_grow){0};
	/* Advice, as a prefetch: at the budget it does not wait. Already
	 * placed (the owner was first) counts as progress too. */
	r = sbi_buf_place(buf, g.cur + 1, g.cur + 2, false);
	if (r < 0)
		return (struct sbi_grow){0};
	*placed = r > 0;
	g.cur++;
	g.since_ms = now;
	g.due_ms = now + 1;
	return g;
}

bool sbi_grow_serve(struct sb_pool *pool)
{
	int nplaced = 0;
	uint64_t now, due = UINT64_MAX;

	if (!__atomic_load_n(&pool->ngrow, __ATOMIC_RELAXED)) {
		pool->grow_due_ms = UINT64_MAX;
		return false;
	}
	now = mono_ms();
	pthread_mutex_unlock(&pool->lock);
	/* Round robin: a burst cut short resumes where it stopped. */
	for (uint32_t n = 0; n < SBI_GROW_MAX; n++) {
		uint32_t k = (pool->grow_rr + n) % SBI_GROW_MAX;
		struct sbi_grow g;
		struct sb_buf *buf;
		bool placed = false;

		pthread_mutex_lock(&pool->pf_lock);
		g = pool->grow[k];
		buf = g.buf;
		if (!buf || g.due_ms > now || nplaced == BURST) {
			if (buf)	/* not due, or left for the next round */
				due = due < g.due_ms ? due : g.due_ms;
			pthread_mutex_unlock(&pool->pf_lock);
			continue;
		}
		pool->pf_inflight = buf;
		pthread_mutex_unlock(&pool->pf_lock);

		g = serve_one(pool, g, now, &placed);
		if (placed && ++nplaced == BURST)
			pool->grow_rr = (k + 1) % SBI_GROW_MAX;

		pthread_mutex_lock(&pool->pf_lock);
		/* Unless cancelled meanwhile (an unmap waits for us, then
		 * finds the slot empty or another buffer's). */
		if (pool->grow[k].buf == buf) {
			if (g.buf) {
				if (pool->grow[k].cur > g.cur) {	/* noted */
					g.cur = pool->grow[k].cur;
					g.since_ms = pool->grow[k].since_ms;
					g.due_ms = 0;
				}
				pool->grow[k] = g;
				due = due < g.due_ms ? due : g.due_ms;
			} else {
				pool->grow[k] = (struct sbi_grow){0};
				__atomic_sub_fetch(&pool->ngrow, 1,
						   __ATOMIC_RELAXED);
			}
		}
		pool->pf_inflight = NULL;
		pthread_cond_broadcast(&pool->pf_cond);
		pthread_mutex_unlock(&pool->pf_lock);
	}
	pool->grow_due_ms = due;
	pthread_mutex_lock(&pool->lock);
	return nplaced > 0;
}
