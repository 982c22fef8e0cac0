/* SPDX-License-Identifier: MIT */
/*
 * A client pool's lease thread: keeps the lease a chunk ahead of need
 * while the pool grows, gives back what it does not use, reports what it
 * holds, and answers the daemon's reclaims (the budget is full and
 * another process needs pages): first the unused lease, then the ready
 * reserve, then cold pages of evictable buffers written to disk.
 *
 * Above evict.c (it evicts); the lease arithmetic is in lease.c, below.
 */
#include "lease.h"
#include "dproto.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#define TICK_MS 5	/* how often the lease is looked at */
#define REPORT_MS 1000
#define IDLE_MS 2000	/* no allocation for this long: keep no spare lease */
#define FLOOR_ASK_MS 500	/* a floor the lease lacks: asked this often */

/* ---- the connection's callbacks (its reader thread) ------------------------ */

static uint64_t cb_held(void *arg)
{
	struct sb_pool *pool = arg;
	uint64_t held;

	pthread_mutex_lock(&pool->lock);
	if (pool->daemon_local) {
		/* Back to a daemon: the lease is what the pool holds; the
		 * next allocation asks for more. */
		pool->daemon_local = false;
		sbi_lease_set(pool, pool->resident);
	}
	held = (uint64_t)pool->max_pages << pool->page_shift;
	pthread_mutex_unlock(&pool->lock);
	return held;
}

static void cb_reclaim(void *arg, uint64_t bytes)
{
	struct sb_pool *pool = arg;
	struct sbi_lease *l = pool->lease;

	pthread_mutex_lock(&l->lock);
	l->reclaim += bytes;
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&l->lock);
}

static void cb_reconnected(void *arg)
{
	struct sb_pool *pool = arg;
	struct sbi_lease *l = pool->lease;
	size_t accepted =
		(size_t)(sbi_dclient_accepted(pool->client) >> pool->page_shift);

	/* A new daemon with a smaller budget believed less than we hold:
	 * that is our lease (we are over it: what we allocate next asks for
	 * more, or evicts), and what we return stays within it. */
	pthread_mutex_lock(&pool->lock);
	if (!pool->daemon_local && accepted < pool->max_pages)
		sbi_lease_set(pool, accepted);
	pthread_mutex_unlock(&pool->lock);

	pthread_mutex_lock(&l->lock);
	l->report_now = true;	/* the new daemon learns what we hold */
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&l->lock);
}

/* ---- the lease thread ------------------------------------------------------ */

static void report(struct sb_pool *pool, uint64_t now, bool force)
{
	struct sbi_lease *l = pool->lease;
	struct sb_stats st;

	if (!force && now < l->report_ms + REPORT_MS)
		return;
	pthread_mutex_lock(&pool->lock);
	sbi_pool_stats_locked(pool, &st);
	pthread_mutex_unlock(&pool->lock);
	if (!force && st.pages_used == l->rep_used &&
	    st.bytes_resident >> pool->page_shift == l->rep_resident)
		return;
	l->report_ms = now;
	l->rep_used = st.pages_used;
	l->rep_resident = st.bytes_resident >> pool->page_shift;
	sbi_dclient_tell(pool->client, SBD_REPORT,
			 st.spill_bytes & ~(uint64_t)4095, 0,
			 st.bytes_resident, st.pages_used * st.page_size);
}

/* Give the lease back down to what the pool holds, in the same hold of
 * pool->lock as the caller freed memory, the ready thread paused by the
 * caller (pool->trimming raised) until the lease is cut: then resume it,
 * let the lock go and tell the daemon (reclaim: this RETURN answers its
 * RECLAIM). Returns the pages given. */
static size_t give_freed(struct sb_pool *pool, bool reclaim)
{
	SBI_HELD(&pool->lock);
	size_t give = sbi_lease_cut(pool, 0), resident = pool->resident,
	       used = pool->used;

	if (--pool->trimming == 0)
		pthread_cond_signal(&pool->ready_cond);
	pthread_mutex_unlock(&pool->lock);
	sbi_lease_tell(pool, give, reclaim, resident, used);
	return give;
}

/* The daemon wants bytes back. */
static void serve_reclaim(struct sb_pool *pool, uint64_t bytes)
{
	size_t want = (size_t)((bytes + pool->page_size - 1) >>
			       pool->page_shift),
	       got, used;

	got = sbi_lease_give_back(pool, 0, false);
	if (got < want) {
		/* Ready pages, as many as the daemon still wants (trimmed
		 * whole, a reclaim of 7 MiB took a 150 MiB floor), and the
		 * lease cut before the ready thread may run again: let go
		 * in between, the lock went to it, it made the floor's
		 * pages ready again with the lease they had freed, nothing
		 * was left to give, and the daemon, taking this client for
		 * dry, refused the grower (test_daemon reserve, 8 runs in
		 * 41). */
		pthread_mutex_lock(&pool->lock);
		pool->trimming++;
		sbi_ready_release(pool, want - got);
		got += give_freed(pool, false);
	}
	if (got < want && atomic_load(&pool->n_evictable)) {
		/* Never below the floor: the daemon asks for no more than
		 * the lease above it, but what went first (unused lease,
		 * the ready reserve) may have been part of that. */
		size_t floor = (size_t)(sbi_dclient_floor(pool->client) >>
					pool->page_shift),
		       n = want - got;

		pthread_mutex_lock(&pool->lock);
		used = pool->used;
		pthread_mutex_unlock(&pool->lock);
		if (n > (used > floor ? used - floor : 0))
			n = used > floor ? used - floor : 0;
		if (n)
			sbi_evict_some(pool, n);
		pthread_mutex_lock(&pool->lock);
		pool->trimming++;
		sbi_ready_trim(pool, false, true);
	} else {
		pthread_mutex_lock(&pool->lock);
		pool->trimming++;
	}
	/* The answer, even when nothing could go, with what the eviction
	 * freed: in a RETURN of their own before it, those pages left an
	 * answer of nothing, which a daemon that had asked again meanwhile
	 * took for "has nothing" (daemon/server.c, sbd_send_reclaim). The
	 * lease is cut before the ready thread may refill what went. */
	give_freed(pool, true);
}

/* n pages, but no more than a share of the machine's budget (under a
 * small budget a fast grower must not lease it all ahead), nor less than
 * base. */
static size_t budget_share(struct sb_pool *pool, size_t n, size_t base,
			   unsigned share)
{
	size_t cap = (size_t)(sbi_dclient_max(pool->client) / share) >>
		     pool->page_shift;

	if (n > cap)
		n = cap;
	return n > base ? n : base;
}

/* The least slack kept while growing: 8 MiB, or 3 looks' growth (at most
 * 1/32 of the machine's budget). */
static size_t low_mark(struct sb_pool *pool)
{
	return budget_share(pool, 3 * pool->lease->rate, sbi_lease_low(pool),
			    32);
}

/* Keep the lease a chunk ahead of a growing pool; give back the rest. */
static void maintain(struct sb_pool *pool, uint64_t now)
{
	struct sbi_lease *l = pool->lease;
	size_t have, resident, used, slack, chunk, floor_due;
	uint64_t granted;
	bool active;
	int r;

	pthread_mutex_lock(&pool->lock);
	if (pool->daemon_local) {
		pthread_mutex_unlock(&pool->lock);
		return;
	}
	have = pool->max_pages;
	resident = pool->resident;
	used = pool->used;
	/* The part of sb_pool_reserve's floor the ready thread has yet to
	 * fill: lease it asked for, spoken for though not yet resident. Not
	 * counted, the first look after a large floor (idle, nothing backed
	 * yet) gave all but 16 MiB of it back. */
	floor_due = sbi_lease_floor_due(pool);
	pthread_mutex_unlock(&pool->lock);
	/* A floor the lease does not cover (granted in part, or taken by a
	 * reclaim): asked for again from what the budget has free, at most
	 * every FLOOR_ASK_MS. */
	if (resident + floor_due > have && now >= l->floor_ask_ms) {
		l->floor_ask_ms = now + FLOOR_ASK_MS;
		sbi_lease_floor(pool);
		pthread_mutex_lock(&pool->lock);
		have = pool->max_pages;
		pthread_mutex_unlock(&pool->lock);
	}
	/* Growing: more pages in use than at the last look. (Not any
	 * allocation: pages read back after a reclaim are not growth, and
	 * asking for lease then would take it back from the busy process the
	 * reclaim was for.) */
	active = used > l->seen_used;
	/* How fast it grows: the lease is kept a few looks' growth ahead,
	 * so that a fast grower (a decode loop placing KV as fast as memory
	 * allows) never has to ask itself, a round trip on its own path. */
	l->rate -= l->rate / 8;
	if (active && used - l->seen_used > l->rate)
		l->rate = used - l->seen_used;
	l->seen_used = used;
	slack = have > resident + floor_due ? have - resident - floor_due : 0;
	/* Growth asks by the lease it has free, the floor's unfilled part
	 * included: the floor's own lease comes only from free room
	 * (above). With that part counted as taken, a growing client whose
	 * floor a reclaim had emptied asked at once for a chunk more, which
	 * the daemon took from another client with a floor, which did the
	 * same: 54 reclaims in 15 s for two floors that did not fit. */
	if (active && (have > resident ? have - resident : 0) < low_mark(pool) &&
	    have < pool->ceiling_pages && now >= l->refused_until_ms) {
		/* 16 MiB, or 6 looks' growth (at most 1/16 of the
		 * machine's budget). */
		chunk = budget_share(pool, 6 * l->rate, sbi_lease_chunk(pool),
				     16);
		if (chunk > pool->ceiling_pages - have)
			chunk = pool->ceiling_pages - have;
		r = sbi_dclient_lease(pool->client,
				      (uint64_t)chunk << pool->page_shift,
				      (uint64_t)chunk << pool->page_shift,
				      (uint64_t)resident << pool->page_shift,
				      (uint64_t)used << pool->page_shift, 200,
				      &granted);
		if (r < 0) {
			l->refused_until_ms = now + 100;
			return;
		}
		pthread_mutex_lock(&pool->lock);
		if (!pool->daemon_local)
			sbi_lease_set(pool,
				      pool->max_pages +
					      (size_t)(granted >> pool->page_shift));
		pthread_mutex_unlock(&pool->lock);
		l->idle_since_ms = now;
		return;
	}
	if (active)
		l->idle_since_ms = now;
	if (slack > sbi_lease_high(pool) + 6 * l->rate)
		sbi_lease_give_back(pool, sbi_lease_chunk(pool) + floor_due,
				    false);
	else if (slack && now - l->idle_since_ms > IDLE_MS)
		sbi_lease_give_back(pool, floor_due, false);
}

static void *lease_thread(void *arg)
{
	struct sb_pool *pool = arg;
	struct sbi_lease *l = pool->lease;
	struct timespec ts;

	sbi_thread_internal();
	pthread_mutex_lock(&l->lock);
	while (!l->stop) {
		uint64_t reclaim, now;
		bool report_now;

		if (!l->reclaim) {
			clock_gettime(CLOCK_MONOTONIC, &ts);
			ts.tv_nsec += TICK_MS * 1000000L;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&l->cond, &l->lock, &ts);
		}
		if (l->stop)
			break;
		reclaim = l->reclaim;
		report_now = l->report_now;
		l->reclaim = 0;
		l->report_now = false;
		pthread_mutex_unlock(&l->lock);
		now = sbi_mono_ms();
		if (reclaim) {
			serve_reclaim(pool, reclaim);
			report(pool, now, true);
		} else if (sbi_dclient_connected(pool->client)) {
			maintain(pool, now);
			report(pool, now, report_now);
			/* The next heap ready (source.c takes it). */
			sbi_dclient_stash_heaps(pool->client, pool->heap_size,
						1);
			/* Pins on cache pages let go of (import.c). */
			sbi_dclient_cache_flush(pool->client);
		}
		pthread_mutex_lock(&l->lock);
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

int sbi_lease_start(struct sb_pool *pool, struct sbi_dclient *c)
{
	struct sbi_lease *l = calloc(1, sizeof(*l));
	struct sbi_dclient_cbs cbs = {
		.arg = pool,
		.held = cb_held,
		.reclaim = cb_reclaim,
		.reconnected = cb_reconnected,
	};
	pthread_condattr_t ca;
	int r;

	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->lock, NULL);
	SBI_LK_RANK(&l->lock, SBI_RANK_LEAF, pool->id);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&l->cond, &ca);
	pthread_condattr_destroy(&ca);
	l->wait_ms = sbi_env_daemon_wait_ms();
	l->fail = sbi_env_daemon_fail();
	l->idle_since_ms = sbi_mono_ms();
	pool->lease = l;
	pool->client = c;
	r = sbi_dclient_start(c, &cbs);
	if (r == 0) {
		r = sbi_thread_start(&l->thread, lease_thread, pool, "sb-lease",
				     -1);
		if (r == 0)
			return 0;
	}
	/* The connection's reader may be running: sbi_lease_close stops
	 * it before freeing l. */
	l->stop = true;
	l->thread = 0;
	return r;
}

void sbi_lease_stop(struct sb_pool *pool)
{
	struct sbi_lease *l = pool->lease;

	if (!l || l->stop)
		return;
	pthread_mutex_lock(&l->lock);
	l->stop = true;
	pthread_cond_signal(&l->cond);
	pthread_mutex_unlock(&l->lock);
	pthread_join(l->thread, NULL);
}

void sbi_lease_close(struct sb_pool *pool)
{
	struct sbi_lease *l = pool->lease;

	sbi_dclient_close(pool->client);
	pool->client = NULL;
	if (!l)
		return;
	pthread_cond_destroy(&l->cond);
	pthread_mutex_destroy(&l->lock);
	free(l);
	pool->lease = NULL;
}
