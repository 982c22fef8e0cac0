/* SPDX-License-Identifier: MIT */
/*
 * The KV module's own view of a sequence, shared by its files: kv.c (the
 * sequence), kv_save.c (save files), kv_cache.c (the prefix cache).
 */
#ifndef SPARSEBUF_KV_SEQ_H
#define SPARSEBUF_KV_SEQ_H

#include <stdbool.h>
#include <stddef.h>

#include "sparsebuf_kv.h"

struct sb_kv_seq {
	struct sb_pool *pool;
	struct sb_buf **buf;	/* (nregions): one sparse buffer per region,
				 * so each grows on its own heap run */
	struct sb_kv_config cfg;
	int *window;		/* (n_layers), owned copy */
	size_t row;		/* bytes per row */
	size_t page;		/* the pool's page size */
	size_t region;		/* bytes per region, page-aligned */
	size_t nregions;	/* 2 * n_layers: K of layer l is 2l, V 2l+1 */
	size_t lookahead;	/* positions */
	size_t len;		/* positions held */
	size_t *placed;		/* (nregions) bytes known placed from the
				 * region's start (the high-water mark) */
	size_t *asked;		/* (nregions) bytes asked of the prefetcher */
	struct sb_range *ranges;	/* (nregions) scratch for prefetch */
	size_t *start;		/* (n_layers) first position held */
	void *user;		/* restored: the saved user blob */
	size_t user_len;
};

/* A sequence's bookkeeping, no regions yet (cfg checked). */
struct sb_kv_seq *sbi_kv_alloc(struct sb_pool *pool,
			       const struct sb_kv_config *cfg, int *err);
/* alloc + every region created empty (nothing placed). */
struct sb_kv_seq *sbi_kv_new_empty(struct sb_pool *pool,
				   const struct sb_kv_config *cfg, int *err);
void sbi_kv_free(struct sb_kv_seq *s);
/* The flags a region of this configuration is created with. */
unsigned sbi_kv_region_flags(const struct sb_kv_config *cfg);
/* Positions per block: the fewest whole positions that fill whole pages
 * of a region (what a share, an eviction or a cache entry works in). */
size_t sbi_kv_block_positions(const struct sb_kv_seq *s);

/* kv_remote.c: a prefix cache's blocks in sparsebufd's machine-wide cache.
 * A block is per pages of every region of the store, from page p0. */
bool sbi_kvr_usable(struct sb_pool *pool, const struct sb_kv_seq *store,
		    size_t per, size_t ntok);
/* Copy the block in the store slot to the daemon's cache and map the
 * slot to the cache's pages. 0, -EEXIST (cached already), -errno. */
int sbi_kvr_publish(struct sb_kv_seq *store, size_t p0, size_t per,
		    uint64_t key, uint64_t pkey, uint32_t depth,
		    const int32_t *tokens, uint32_t ntok, uint64_t *gen);
/* Map the daemon's block (its tokens equal to tokens) in the store slot.
 * 0, -ENOENT (not cached), -errno. */
int sbi_kvr_fetch(struct sb_kv_seq *store, size_t p0, size_t per,
		  uint64_t key, uint64_t pkey, uint32_t depth,
		  const int32_t *tokens, uint32_t ntok, uint64_t *gen);

#endif
