/* SPDX-License-Identifier: MIT */
/*
 * Placement in the background: sb_buf_prefetch queues ranges, the pool's
 * ready thread places them (before any other work of its own). A thread
 * that knows what it will touch next (a KV cache a few positions ahead, a
 * predictor choosing FFN neurons) then never pays for the mapping.
 *
 * Requests name their buffer; sb_buf_unmap and sb_buf_destroy cancel the
 * ones still queued for it and wait for the one in flight, so a request
 * can neither outlive its buffer nor place pages after a release.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>

static bool overlaps(const struct sbi_prefetch *p, const struct sb_buf *buf,
		     size_t first, size_t end)
{
	return p->buf == buf && p->first < end && first < p->end;
}

/* sbi_prefetch_cancel's work, pf_lock held (released while waiting). */
static void cancel_locked(struct sb_buf *buf, size_t first, size_t end)
{
	struct sb_pool *pool = buf->pool;
	uint32_t w;

	SBI_HELD(&pool->pf_lock);
	/* Compact the ring, dropping what overlaps. */
	w = pool->pf_head;
	for (uint32_t r = pool->pf_head; r != pool->pf_tail;
	     r = (r + 1) % pool->pf_cap) {
		if (overlaps(&pool->pf[r], buf, first, end))
			continue;
		pool->pf[w] = pool->pf[r];
		w = (w + 1) % pool->pf_cap;
	}
	if (w != pool->pf_tail) {
		/* wait_all() sleeps on pf_cond while anything is queued; what
		 * was just dropped will never be served (and broadcast). */
		pool->pf_tail = w;
		pthread_cond_broadcast(&pool->pf_cond);
	}
	sbi_grow_cancel(buf);
	while (pool->pf_inflight == buf)
		pthread_cond_wait(&pool->pf_cond, &pool->pf_lock);
	/* After the wait: what was in flight may have queued touches. */
	sbi_touch_cancel(buf, first, end);
}

void sbi_prefetch_cancel(struct sb_buf *buf, size_t first, size_t end)
{
	pthread_mutex_lock(&buf->pool->pf_lock);
	cancel_locked(buf, first, end);
	pthread_mutex_unlock(&buf->pool->pf_lock);
}

void sbi_bg_quiet_begin(struct sb_buf *buf, size_t first, size_t end)
{
	pthread_mutex_lock(&buf->pool->pf_lock);
	/* Quiet first: the wait below lets go of pf_lock, and a request
	 * queued meanwhile would outlive the cancel. */
	buf->bg_quiet++;
	if (first < end)
		cancel_locked(buf, first, end);
	pthread_mutex_unlock(&buf->pool->pf_lock);
}

void sbi_bg_quiet_end(struct sb_buf *buf)
{
	pthread_mutex_lock(&buf->pool->pf_lock);
	buf->bg_quiet--;
	pthread_mutex_unlock(&buf->pool->pf_lock);
}

/* Pages of [first, end) placed or on disk. -1 when a placement holds the
 * buffer lock and the caller must not wait for it (block false). */
static long count_placed(struct sb_buf *buf, size_t first, size_t end,
			 bool block)
{
	long n = 0;

	if (block)
		pthread_mutex_lock(&buf->lock);
	else if (pthread_mutex_trylock(&buf->lock) != 0)
		return -1;
	for (size_t i = first; i < end; i++)
		/* Placed, or on disk (a read was just queued for it). */
		n += sbi_pte_has_page(buf->pte[i]) || (buf->pte[i] & SBI_PTE_DISK);
	pthread_mutex_unlock(&buf->lock);
	return n;
}

static void wake_ready(struct sb_pool *pool);

/* Until nothing is queued or in flight for buf. */
static void wait_all(struct sb_buf *buf)
{
	struct sb_pool *pool = buf->pool;

	pthread_mutex_lock(&pool->pf_lock);
	for (;;) {
		bool pending = pool->pf_inflight == buf;

		for (uint32_t r = pool->pf_head; r != pool->pf_tail && !pending;
		     r = (r + 1) % pool->pf_cap)
			pending = pool->pf[r].buf == buf;
		if (!pending)
			break;
		pthread_mutex_unlock(&pool->pf_lock);
		wake_ready(pool);
		pthread_mutex_lock(&pool->pf_lock);
		if (pool->pf_inflight == buf || pool->pf_head != pool->pf_tail)
			pthread_cond_wait(&pool->pf_cond, &pool->pf_lock);
	}
	pthread_mutex_unlock(&pool->pf_lock);
}

/* Wake the ready thread if it sleeps long (not while it polls). */
static void wake_ready(struct sb_pool *pool)
{
	pthread_mutex_lock(&pool->lock);
	if (pool->ready_idle)
		pthread_cond_signal(&pool->ready_cond);
	pthread_mutex_unlock(&pool->lock);
}

/* Queue a request for the ready thread (a full queue drops it: advice). */
static bool enqueue(struct sb_buf *buf, size_t first, size_t end)
{
	struct sb_pool *pool = buf->pool;
	bool queued = false;

	pthread_mutex_lock(&pool->pf_lock);
	if ((pool->pf_tail + 1) % pool->pf_cap != pool->pf_head) {
		pool->pf[pool->pf_tail] =
			(struct sbi_prefetch){buf, first, end};
		pool->pf_tail = (pool->pf_tail + 1) % pool->pf_cap;
		queued = true;
	}
	pthread_mutex_unlock(&pool->pf_lock);
	/* A racy read is fine here: a missed flag costs at most one poll
	 * period of the ready thread. */
	sbi_pool_note_caller(pool);
	if (__atomic_load_n(&pool->ready_idle, __ATOMIC_RELAXED))
		wake_ready(pool);
	return queued;
}

bool sbi_prefetch_serve(struct sb_pool *pool)
{
	struct sbi_prefetch p;

	pthread_mutex_lock(&pool->pf_lock);
	if (pool->pf_head == pool->pf_tail) {
		pthread_mutex_unlock(&pool->pf_lock);
		return false;
	}
	p = pool->pf[pool->pf_head];
	pool->pf_head = (pool->pf_head + 1) % pool->pf_cap;
	pool->pf_inflight = p.buf;
	pthread_mutex_unlock(&pool->pf_lock);
	pthread_mutex_unlock(&pool->lock);
	/* Best effort: a failure (budget) surfaces at the caller's own
	 * sb_buf_map or fault later. */
	if (sbi_buf_place(p.buf, p.first, p.end, false) > 0)	/* reads: no wait */
		sbi_touch_queue(p.buf, p.first, p.end);
	pthread_mutex_lock(&pool->pf_lock);
	pool->pf_inflight = NULL;
	pthread_cond_broadcast(&pool->pf_cond);
	pthread_mutex_unlock(&pool->pf_lock);
	pthread_mutex_lock(&pool->lock);
	return true;
}

SB_API long sb_buf_prefetch(struct sb_buf *buf, const struct sb_range *ranges,
			    size_t n, unsigned flags)
{
	struct sb_pool *pool;
	long queued = 0;
	bool disk;

	if (!buf || (!ranges && n) || (flags & ~SB_PREFETCH_WAIT))
		return -EINVAL;
	if (sbi_pool_check(buf->pool) < 0)
		return -ECHILD;
	pool = buf->pool;
	for (size_t i = 0; i < n; i++)
		if (ranges[i].off > buf->length ||
		    ranges[i].len > buf->length - ranges[i].off)
			return -ERANGE;
	disk = n && (buf->src || atomic_load(&buf->disk_used));
	/* Data on disk: every range's reads in one submission. */
	if (disk) {
		struct sbi_span *sp = malloc(n * sizeof(*sp));
		size_t nsp = 0;
		long r;

		if (!sp)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++)
			if (ranges[i].len)
				sp[nsp++] = sbi_span_touched(
					pool, ranges[i].off, ranges[i].len);
		r = sbi_pagein_spans(buf, sp, nsp,
				     flags & SB_PREFETCH_WAIT);
		free(sp);
		/* Without WAIT a read that cannot be had now (the budget,
		 * busy buffers) is dropped, as a full queue drops requests:
		 * prefetch is advice. */
		if (r < 0 && (flags & SB_PREFETCH_WAIT))
			return r;
		if (r > 0)
			queued += r;
	}
	for (size_t i = 0; i < n; i++) {
		struct sbi_span sp;
		long placed;

		if (!ranges[i].len)
			continue;
		sp = sbi_span_touched(pool, ranges[i].off, ranges[i].len);
		/* With data on disk the reads above took the lock already,
		 * and hold it only briefly: wait for it, rather than hand the
		 * ready thread ranges that are all being read. Their reads'
		 * completions take it, one page at a time. */
		placed = count_placed(buf, sp.first, sp.end, disk);
		if ((size_t)placed == sp.end - sp.first)
			continue;
		if (flags & SB_PREFETCH_WAIT) {
			long r = sbi_buf_place(buf, sp.first, sp.end, true);

			if (r < 0)
				return r;
			if (r > 0)
				sbi_touch_queue(buf, sp.first, sp.end);
			queued += r;
			continue;
		}
		/* With the buffer lock busy the count is unknown: the range's
		 * pages on disk were counted above (so none is counted twice),
		 * and without data on disk every page counts. */
		if (enqueue(buf, sp.first, sp.end))
			queued += placed >= 0 ? (long)(sp.end - sp.first) - placed
				  : disk      ? 0
					      : (long)(sp.end - sp.first);
	}
	if (flags & SB_PREFETCH_WAIT) {
		wait_all(buf);
		/* And every read in flight for it (readahead included). */
		if (atomic_load(&pool->disk))
			sbi_pagein_drain(buf);
	}
	return queued;
}
