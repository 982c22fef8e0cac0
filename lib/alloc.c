/* SPDX-License-Identifier: MIT */
/*
 * Allocation under the budget: pages from the pool (pool.c) and, when the
 * budget says no, from wherever they can be had. A daemon's client first
 * asks for more lease (lease.c); refused, or alone, the pool evicts cold
 * pages of evictable buffers (evict.c) and tries again, until nothing
 * anywhere can go. Every path that needs a page (a fault, a placement, a
 * page-in) comes through here.
 */
#include "internal.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

/* How long an allocation keeps trying while every candidate it finds is
 * busy (or being evicted by someone else) without one page going out. */
#define STALL_MS 10000

int sbi_alloc(struct sb_pool *pool, struct sb_buf *buf, sbi_ptref hint1,
	      size_t n, sbi_pid *out, unsigned flags, struct sb_buf *held,
	      bool reg_held)
{
	/* Evict in batches: each write-out waits for the disk once. Up to
	 * 1 MiB, and a 16th of the budget: the clock's choice should decide
	 * what goes, not the batch. */
	size_t batch = ((size_t)1 << 20) >> pool->page_shift;
	uint64_t stalled_since = 0;
	bool renoted = false;
	int r;

	size_t max_pages = __atomic_load_n(&pool->max_pages, __ATOMIC_RELAXED);

	if (batch > max_pages / 16)
		batch = max_pages / 16;
	if (batch < 1)
		batch = 1;
	for (;;) {
		struct sbi_evict_round rd = {0};
		size_t others;
		bool room;

		r = sbi_pool_alloc(pool, buf, hint1, n, out, flags);
		if (r == -ENOMEM && pool->hugetlb)
			atomic_store_explicit(&pool->hugetlb_short, true,
					      memory_order_relaxed);
		if (r == -ENOMEM && pool->hugetlb &&
		    !(flags & (SBI_ALLOC_BACKED | SBI_ALLOC_NOWAIT)) &&
		    atomic_load(&pool->n_evictable)) {
			/* No huge page free in the system: as at the
			 * budget, pages the pool holds, freed or evicted
			 * (a file's clean pages dropped, others written
			 * out), rather than SIGBUS. Not for reads nobody
			 * waits for (read-ahead, a prefetch served in the
			 * background): evicting for those took every page
			 * the pool held, and a fault then found none to
			 * evict (helper-53). Nor for more pages than the
			 * pool holds: those evictions would be in vain. */
			pthread_mutex_lock(&pool->lock);
			room = n <= pool->resident;
			pthread_mutex_unlock(&pool->lock);
			if (!room)
				return r;
			flags |= SBI_ALLOC_BACKED;
			continue;
		}
		if (r != -EDQUOT)
			return r;	/* a page, or the kernel said no */
		if (pool->client && !(flags & SBI_ALLOC_LEASED)) {
			/* A daemon's client: more lease first (lease.c);
			 * refused, any page with memory, then eviction. */
			r = sbi_lease_more(pool, n,
					   flags & SBI_ALLOC_NOWAIT);
			if (r < 0)
				return r;
			if (r == 0)
				flags |= SBI_ALLOC_LEASED;
			continue;
		}
		if (!atomic_load(&pool->n_evictable) ||
		    n > __atomic_load_n(&pool->max_pages, __ATOMIC_RELAXED))
			return -ENOMEM;
		sbi_evict_cold(pool, n > batch ? n : batch, held, reg_held,
			       &rd);
		if (rd.done) {
			stalled_since = 0;
			/* Evicted pages that were punched (no recycling)
			 * went back to the system: ask it again. */
			if (!pool->can_recycle)
				flags &= ~SBI_ALLOC_BACKED;
			continue;
		}
		if (rd.failed || (flags & SBI_ALLOC_NOWAIT))
			return -ENOMEM;	/* the spill file takes no more, or
					 * nobody waits for this page */
		/* Nothing went out here. Pages another thread evicted since
		 * our try (room under the budget now), pages being evicted
		 * by another thread, candidates of a buffer busy for a
		 * moment, or candidates that changed under us are all worth
		 * another try; only a whole pass of the clock that found
		 * nothing, with no eviction under way elsewhere and no page
		 * whose other holders let go, means there is nothing to
		 * evict. */
		pthread_mutex_lock(&pool->lock);
		others = pool->evicting;
		/* (Short of huge pages, the budget is not what is full.) */
		room = !(flags & SBI_ALLOC_BACKED) &&
		       pool->used + n <= pool->max_pages;
		pthread_mutex_unlock(&pool->lock);
		if (!room && !rd.picked && !others) {
			if (renoted || !sbi_evict_renote(pool, held, reg_held))
				return -ENOMEM;
			renoted = true;
			continue;
		}
		if (!stalled_since) {
			stalled_since = sbi_mono_ms();
		} else if (sbi_mono_ms() - stalled_since > STALL_MS) {
			sbi_warn("pool %u: no page could be evicted for %d s "
				 "(every candidate busy)",
				 pool->id, STALL_MS / 1000);
			return -ENOMEM;
		}
		if (!room && (rd.busy || others))
			usleep(rd.busy ? 200 : 50);
	}
}
