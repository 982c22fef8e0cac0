/* SPDX-License-Identifier: MIT */
/*
 * A client pool's lease: the pages sparsebufd lets it hold. The pool's
 * budget (max_pages) is the lease, capped by its own max_bytes (the
 * ceiling); the allocator enforces it as it enforces a local pool's.
 *
 * The lease is grown a chunk at a time ahead of need, in the background
 * (lease_serve.c), so that growth takes pages from a local lease at the
 * cost of a local allocation; an allocation that finds it spent asks
 * synchronously (sbi_lease_more, one socket round trip, ~20 us), before
 * any local eviction. Unused lease beyond a high-water mark goes back.
 *
 * No daemon (it died, or is restarting): the request waits up to
 * SPARSEBUF_DAEMON_WAIT_MS for one, then follows
 * SPARSEBUF_DAEMON_FALLBACK: "local" (the default) makes the ceiling the
 * budget until a daemon takes the pool back; "fail" refuses the pages
 * (-ENOMEM, SIGBUS on a fault).
 */
#include "lease.h"
#include "dproto.h"

#include <errno.h>
#include <time.h>

static size_t mib_pages(const struct sb_pool *pool, size_t mib)
{
	size_t p = (mib << 20) >> pool->page_shift;

	return p ? p : 1;
}

size_t sbi_lease_chunk(const struct sb_pool *pool)
{
	return mib_pages(pool, 16);
}

size_t sbi_lease_low(const struct sb_pool *pool)
{
	return mib_pages(pool, 8);
}

size_t sbi_lease_high(const struct sb_pool *pool)
{
	return mib_pages(pool, 64);
}

void sbi_lease_set(struct sb_pool *pool, size_t pages)
{
	SBI_HELD(&pool->lock);
	/* (max_bytes stays the pool's own, as sb_pool_stats reports it.) */
	__atomic_store_n(&pool->max_pages, pages, __ATOMIC_RELAXED);
}

/* No daemon answered: the fallback. pool->lock held. */
static int fall_back(struct sb_pool *pool)
{
	struct sbi_lease *l = pool->lease;

	if (l->fail)
		return -ENOMEM;
	if (!pool->daemon_local) {
		pool->daemon_local = true;
		sbi_lease_set(pool, pool->ceiling_pages);
		if (!atomic_exchange(&l->warned, true))
			sbi_warn("pool %u: no sparsebufd at %s for %d ms: "
				 "running on its own budget (%s) until one "
				 "takes it back (SPARSEBUF_DAEMON_FALLBACK)",
				 pool->id, sbi_dclient_path(pool->client),
				 l->wait_ms,
				 pool->ceiling_pages == SIZE_MAX
					 ? "no limit"
					 : "SPARSEBUF_MAX_BYTES");
	}
	return 1;
}

int sbi_lease_more(struct sb_pool *pool, size_t n, bool nowait)
{
	struct sbi_lease *l = pool->lease;
	size_t used, resident, have, min, want;
	uint64_t granted = 0;
	int r;

	if (!pool->client || (nowait && !sbi_dclient_connected(pool->client)))
		return 0;
	pthread_mutex_lock(&pool->lock);
	if (pool->daemon_local) {
		pthread_mutex_unlock(&pool->lock);
		return 0;	/* the ceiling is the budget: evict */
	}
	used = pool->used;
	resident = pool->resident;
	have = pool->max_pages;
	pthread_mutex_unlock(&pool->lock);
	/* Enough for the n pages (used + n, or resident + n when nothing
	 * backed is free), and a chunk more for the pages after them. */
	min = (used > resident ? used : resident) + n;
	min = min > have ? min - have : n;
	if (have >= pool->ceiling_pages || min > pool->ceiling_pages - have)
		return 0;	/* the pool's own max_bytes */
	want = min + sbi_lease_chunk(pool);
	if (want > pool->ceiling_pages - have)
		want = pool->ceiling_pages - have;
	r = sbi_dclient_lease(pool->client, (uint64_t)min << pool->page_shift,
			      (uint64_t)want << pool->page_shift,
			      (uint64_t)resident << pool->page_shift,
			      (uint64_t)used << pool->page_shift, l->wait_ms,
			      &granted);
	pthread_mutex_lock(&pool->lock);
	if (r == 0) {
		if (!pool->daemon_local)
			sbi_lease_set(pool, pool->max_pages +
						(size_t)(granted >> pool->page_shift));
		r = 1;
	} else if (r == -ENOMEM || r == -EPROTO) {
		r = 0;	/* the machine's budget is spent: evict here */
	} else {
		r = fall_back(pool);
	}
	pthread_mutex_unlock(&pool->lock);
	return r;
}

size_t sbi_lease_floor_due(const struct sb_pool *pool)
{
	SBI_HELD(&pool->lock);
	return pool->ready_floor > pool->ready &&
			       pool->floor_stuck_ms <= sbi_mono_ms()
		       ? pool->ready_floor - pool->ready
		       : 0;
}

void sbi_lease_floor(struct sb_pool *pool)
{
	size_t have, resident, used, need = 0;
	uint64_t granted = 0;

	if (!pool->client || !sbi_dclient_connected(pool->client))
		return;
	pthread_mutex_lock(&pool->lock);
	have = pool->max_pages;
	resident = pool->resident;
	used = pool->used;
	if (!pool->daemon_local && resident + sbi_lease_floor_due(pool) > have)
		need = resident + sbi_lease_floor_due(pool) - have;
	if (have >= pool->ceiling_pages)
		need = 0;
	else if (need > pool->ceiling_pages - have)
		need = pool->ceiling_pages - have;
	pthread_mutex_unlock(&pool->lock);
	/* min 0: the daemon grants what is free now, maybe nothing, and
	 * neither reclaims nor parks the request (daemon/budget.c). */
	if (!need || sbi_dclient_lease(pool->client, 0,
				       (uint64_t)need << pool->page_shift,
				       (uint64_t)resident << pool->page_shift,
				       (uint64_t)used << pool->page_shift,
				       200, &granted) < 0 ||
	    !granted)
		return;
	pthread_mutex_lock(&pool->lock);
	if (!pool->daemon_local)
		sbi_lease_set(pool, pool->max_pages +
					    (size_t)(granted >> pool->page_shift));
	pthread_cond_signal(&pool->ready_cond);	/* lease to fill it with */
	pthread_mutex_unlock(&pool->lock);
}

size_t sbi_lease_cut(struct sb_pool *pool, size_t keep)
{
	SBI_HELD(&pool->lock);
	size_t give = 0;

	if (!pool->daemon_local && pool->max_pages > pool->resident + keep) {
		give = pool->max_pages - pool->resident - keep;
		sbi_lease_set(pool, pool->resident + keep);
	}
	return give;
}

void sbi_lease_tell(struct sb_pool *pool, size_t give, bool reclaim,
		    size_t resident, size_t used)
{
	if (give || reclaim)
		sbi_dclient_tell(pool->client, SBD_RETURN,
				 (uint64_t)give << pool->page_shift, reclaim,
				 (uint64_t)resident << pool->page_shift,
				 (uint64_t)used << pool->page_shift);
}

size_t sbi_lease_give_back(struct sb_pool *pool, size_t keep, bool reclaim)
{
	size_t give, resident, used;

	pthread_mutex_lock(&pool->lock);
	give = sbi_lease_cut(pool, keep);
	resident = pool->resident;
	used = pool->used;
	pthread_mutex_unlock(&pool->lock);
	sbi_lease_tell(pool, give, reclaim, resident, used);
	return give;
}

bool sbi_pool_is_leased(struct sb_pool *pool)
{
	bool r;

	pthread_mutex_lock(&pool->lock);
	r = pool->client && !pool->daemon_local &&
	    sbi_dclient_connected(pool->client);
	pthread_mutex_unlock(&pool->lock);
	return r;
}
