/* SPDX-License-Identifier: MIT */
/* A client pool's lease state (lease.c, lease_serve.c). */
#ifndef SPARSEBUF_LEASE_H
#define SPARSEBUF_LEASE_H

#include "internal.h"

struct sbi_lease {
	pthread_t thread;
	pthread_mutex_t lock;	/* the fields below; a leaf */
	pthread_cond_t cond;	/* work for the lease thread */
	bool stop;
	bool report_now;	/* a new daemon: tell it what we hold */
	uint64_t reclaim;	/* bytes the daemon asked back */
	/* Lease thread only. */
	size_t seen_used;	/* pool->used at the last look */
	size_t rate;		/* growth per look, pages (decaying max) */
	uint64_t report_ms;
	size_t rep_resident, rep_used;
	uint64_t refused_until_ms;	/* no background lease before */
	uint64_t idle_since_ms;		/* last allocation seen */
	uint64_t floor_ask_ms;		/* no floor request before */
	int wait_ms;			/* SPARSEBUF_DAEMON_WAIT_MS */
	bool fail;			/* SPARSEBUF_DAEMON_FALLBACK=fail */
	_Atomic bool warned;
};

/* Pages the lease is grown by, kept unused at least (low) and at most
 * (high) beyond what the pool holds. */
size_t sbi_lease_chunk(const struct sb_pool *pool);
size_t sbi_lease_low(const struct sb_pool *pool);
size_t sbi_lease_high(const struct sb_pool *pool);
/* The lease is pages now; pool->lock held. */
void sbi_lease_set(struct sb_pool *pool, size_t pages);
/* sbi_lease_give_back in two steps, for a caller that must cut the lease
 * in the same hold of pool->lock as it freed memory: lower the lease to
 * resident + keep (pool->lock held; returns the pages cut), then tell the
 * daemon (no lock; reclaim: this RETURN answers its RECLAIM). */
size_t sbi_lease_cut(struct sb_pool *pool, size_t keep);
void sbi_lease_tell(struct sb_pool *pool, size_t give, bool reclaim,
		    size_t resident, size_t used);

#endif
