/* SPDX-License-Identifier: MIT */
/*
 * A KV prefix cache's blocks in sparsebufd's machine-wide cache
 * (daemon/cache.c), for a cache made on a client pool (kv_cache.c keeps
 * the index; this file moves one block's pages).
 *
 * Publish: the daemon hands out pages for the block (pinned for us, found
 * by nobody yet); we copy the block's rows into them through the pool's
 * mapping of the imported heap, say it is done (now any process of our
 * uid finds it), and re-point the cache's store slot at those pages. The
 * caller then shares them into the sequence that computed them, whose
 * private pages go: the prompt is held once on the machine.
 *
 * Fetch: the daemon answers a key with the block's tokens (confirmed here
 * against ours) and pages (pinned for us); they are installed in the store
 * slot, shared and write-protected: the same physical pages in every
 * process that fetched them, copied on a first write (import.c).
 */
#include "internal.h"
#include "dproto.h"
#include "kv_seq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Pages of a block, region by region (per pages each). */
static size_t block_pages(const struct sb_kv_seq *store, size_t per)
{
	return store->nregions * per;
}

/* Install refs (referenced) in the store slot starting at page p0 of
 * every region. */
static int install(struct sb_kv_seq *store, size_t p0, size_t per,
		   sbi_ptref *refs)
{
	for (size_t g = 0; g < store->nregions; g++) {
		int r = sbi_buf_install(store->buf[g], p0, per,
					refs + g * per);

		if (r < 0) {
			/* The regions not reached: their references go. */
			sbi_pool_put(store->pool, refs + (g + 1) * per,
				     (store->nregions - g - 1) * per);
			return r;
		}
	}
	return 0;
}

bool sbi_kvr_usable(struct sb_pool *pool, const struct sb_kv_seq *store,
		    size_t per, size_t ntok)
{
	return pool->client && pool->can_wp &&
	       sbi_dclient_cache_page(pool->client) == pool->page_size &&
	       block_pages(store, per) <= SBD_CACHE_MAX_PAGES &&
	       ntok <= SBD_CACHE_MAX_TOKENS;
}

int sbi_kvr_publish(struct sb_kv_seq *store, size_t p0, size_t per,
		    uint64_t key, uint64_t pkey, uint32_t depth,
		    const int32_t *tokens, uint32_t ntok, uint64_t *gen_out)
{
	struct sb_pool *pool = store->pool;
	size_t n = block_pages(store, per);
	uint64_t *refs = malloc(n * sizeof(*refs)), gen = 0;
	/* refs: the daemon's names of the pages; local: this pool's. */
	sbi_ptref *local = malloc(n * sizeof(*local));
	int r;

	if (!refs || !local) {
		r = -ENOMEM;
		goto out;
	}
	r = sbi_dclient_cache_put(pool->client, key, pkey, depth, tokens,
				  ntok, (uint32_t)n, refs, &gen);
	if (r == -ENOSPC && sbi_lease_give_back(pool, 0, false))
		/* The budget is full, partly with lease this pool holds
		 * unused: back (told before the request), and again. */
		r = sbi_dclient_cache_put(pool->client, key, pkey, depth,
					  tokens, ntok, (uint32_t)n, refs, &gen);
	if (r < 0)
		goto out;
	r = sbi_import_refs(pool, gen, refs, n, local);
	if (r < 0) {
		sbi_dclient_cache_done(pool->client, key, false, gen);
		goto out;
	}
	for (size_t g = 0; g < store->nregions; g++) {
		const char *src = (const char *)sb_buf_addr(store->buf[g]) +
				  p0 * pool->page_size;

		for (size_t k = 0; k < per; k++) {
			sbi_pid p = sbi_ptref_pid(local[g * per + k]);

			/* Rows the slot does not hold (never happens for a
			 * complete block) read as zeros: a copy of them. */
			memcpy(sbi_pid_mem(pool, p), src + k * pool->page_size,
			       pool->page_size);
			sbi_pid_unmap_pool(pool, p);
		}
	}
	r = sbi_dclient_cache_done(pool->client, key, true, gen);
	if (r < 0) {
		sbi_pool_put(pool, local, n);
		goto out;
	}
	r = install(store, p0, per, local);
	*gen_out = gen;
out:
	free(refs);
	free(local);
	return r;
}

int sbi_kvr_fetch(struct sb_kv_seq *store, size_t p0, size_t per,
		  uint64_t key, uint64_t pkey, uint32_t depth,
		  const int32_t *tokens, uint32_t ntok, uint64_t *gen_out)
{
	struct sb_pool *pool = store->pool;
	size_t n = block_pages(store, per);
	uint64_t *refs = malloc(n * sizeof(*refs)), gen = 0;
	/* refs: the daemon's names of the pages; local: this pool's. */
	sbi_ptref *local = malloc(n * sizeof(*local));
	int32_t *got = malloc(ntok * sizeof(*got));
	int r;

	if (!refs || !local || !got) {
		r = -ENOMEM;
		goto out;
	}
	r = sbi_dclient_cache_get(pool->client, key, pkey, depth, got, ntok,
				  refs, (uint32_t)n, &gen);
	if (r == -ENOSPC && sbi_lease_give_back(pool, 0, false))
		/* A block on the daemon's disk, no room to read it back in:
		 * our unused lease back, and again. */
		r = sbi_dclient_cache_get(pool->client, key, pkey, depth, got,
					  ntok, refs, (uint32_t)n, &gen);
	if (r < 0)
		goto out;
	if (memcmp(got, tokens, ntok * sizeof(*got))) {
		/* The key's hash collided: not our block. */
		for (size_t k = 0; k < n; k++)
			sbi_dclient_cache_unpin(pool->client, gen, refs[k], 1);
		r = -ENOENT;
		goto out;
	}
	r = sbi_import_refs(pool, gen, refs, n, local);
	if (r == 0)
		r = install(store, p0, per, local);
	*gen_out = gen;
out:
	free(refs);
	free(local);
	free(got);
	return r;
}
