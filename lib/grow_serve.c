/* SPDX-License-Identifier: MIT */
/*
 * Placing ahead for the growth watches (grow.c says how they work): the
 * pool's ready thread looks at each watch's frontier and places the next
 * page once the owner has entered the current one. Above placement
 * (place.c), which notes growth in the watches.
 */
#include "internal.h"
#include "grow.h"
#include "tsan.h"

#include <stdlib.h>
#include <time.h>

/*
 * Has the owner written the first bytes of page idx? Read through the
 * buffer's own mapping, as the touches are (touch.c), with no lock held:
 * the page is mapped before its entry says placed (place.c), and every
 * thread that unplaces pages of the buffer first cancels its watch and
 * waits for the one in flight (pf_inflight) with bg_quiet raised, so no
 * watch is started again before the change is done (a fault's handler
 * notes the watch after its wake-up, and could otherwise restart it
 * between an unmap's cancel and its unplacing; prefetch.c), and a
 * growing buffer is never on the pool's clock (SB_BUF_GROWS is alone).
 * The read never faults so: this thread takes no signals, and a SIGBUS
 * here would end the process (design.md, "never fault"). Not under
 * buf->lock: a read that faults to the handler, which takes that lock,
 * would wait for it forever. A word
 * at a time, relaxed, as the owner may be writing there. It was a pread
 * of the heap file: 2-5 us a look, and with 72 growing regions looked at
 * every millisecond, a quarter of the ready thread's time (bench/kv at
 * 3 ms a token, perf: shmem_file_read_iter 27 %).
 */
static bool entered(const struct sb_buf *buf, size_t idx)
{
	const uint64_t *p =
		(const uint64_t *)(buf->base + (idx << buf->pool->page_shift));
	uint64_t any = 0;

	SBI_TOUCH_BEGIN();
	for (size_t k = 0; k < PEEK / sizeof(*p); k++)
		any |= __atomic_load_n(p + k, __ATOMIC_RELAXED);
	SBI_TOUCH_END();
	return any != 0;
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

	if (!sbi_pte_has_page(pte))
		return (struct sbi_grow){0};	/* released, poisoned */
	if (!entered(buf, g.cur)) {
		/* since_ms may be later than now (noted meanwhile). */
		g.due_ms = now + grow_poll_ms(now > g.since_ms ? now - g.since_ms : 0);
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
	if (r > 0)
		sbi_touch_queue(buf, g.cur + 1, g.cur + 2);
	g.cur++;
	g.since_ms = now;
	g.due_ms = now + 1;
	return g;
}

bool sbi_grow_serve(struct sb_pool *pool)
{
	int nplaced = 0;
	uint64_t now, due = UINT64_MAX;
	uint64_t first_pass[SBI_GROW_MAX / 64] = {0};	/* slots taken */

	if (!__atomic_load_n(&pool->ngrow, __ATOMIC_RELAXED)) {
		pool->grow_due_ms = UINT64_MAX;
		return false;
	}
	now = sbi_mono_ms();
	pthread_mutex_unlock(&pool->lock);
	/* Round robin, the urgent watches first (their owners outran the
	 * watch before: a client mapping ahead of its writes, which finds
	 * its page unplaced, places it itself and waits for the mmap lock
	 * behind this thread's placements); a burst cut short resumes
	 * where it stopped. The second pass takes every slot the first did
	 * not, urgent or not: a watch made urgent between the two passes
	 * is served all the same. */
	for (uint32_t n = 0; n < 2 * SBI_GROW_MAX; n++) {
		uint32_t k = (pool->grow_rr + n) % SBI_GROW_MAX;
		bool urgent_pass = n < SBI_GROW_MAX;
		struct sbi_grow g;
		struct sb_buf *buf;
		bool placed = false;

		if (!urgent_pass && (first_pass[k / 64] >> (k % 64) & 1))
			continue;
		pthread_mutex_lock(&pool->pf_lock);
		g = pool->grow[k];
		buf = g.buf;
		if (urgent_pass && (!buf || !g.urgent)) {
			pthread_mutex_unlock(&pool->pf_lock);
			continue;
		}
		if (urgent_pass)
			first_pass[k / 64] |= 1ull << (k % 64);
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
				g.urgent |= pool->grow[k].urgent;
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
