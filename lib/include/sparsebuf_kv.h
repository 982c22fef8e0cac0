/* SPDX-License-Identifier: MIT */
/*
 * sparsebuf_kv: a KV cache on sparse buffers.
 *
 * A sequence holds, for every layer, a K region and a V region of max_ctx
 * rows each, each region its own sparse buffer. A row is one position's K (or V) for
 * all KV heads: (n_kv_heads, head_dim) elements, so a region is position-
 * major, (max_ctx, n_kv_heads, head_dim), and grows at its end only: the
 * memory a sequence commits is its positions rounded up to a page per
 * region (plus at most one page of lookahead, placed by the pool's
 * background thread), and attention reads rows
 * [start, len) of one flat region. max_ctx only costs address space.
 *
 * Per forward pass: sb_kv_prepare(seq, n) before (places the pages the pass
 * writes, and a little ahead, so growth stays off the critical path), write
 * rows [len, len+n) of every region, run attention, sb_kv_commit(seq, n)
 * after (advances len and releases pages that slid out of a layer's
 * window). Same conventions as sparsebuf.h: >= 0 or -errno.
 */
#ifndef SPARSEBUF_KV_H
#define SPARSEBUF_KV_H

#include <stddef.h>
#include <stdint.h>

#include "sparsebuf.h"

#ifdef __cplusplus
extern "C" {
#endif

enum sb_kv_dtype {
	SB_KV_F32 = 0,	/* same numbering as sbkernels' enum sbk_dtype */
	SB_KV_F16,
	SB_KV_BF16,
};

struct sb_kv_config {
	int n_layers;
	int n_kv_heads;
	int head_dim;
	enum sb_kv_dtype dtype;
	size_t max_ctx;		/* positions; may be huge (address space) */
	const int *window;	/* (n_layers): sliding window in positions,
				 * 0 = full attention; NULL = all full */
	size_t lookahead;	/* positions placed ahead of use, in the
				 * background, staggered over the regions;
				 * 0 = default (a page of rows) */
	unsigned flags;		/* SB_KV_* below; 0 = none */
};

/* In sb_kv_config.flags: the regions may go to disk (the pool's spill
 * file) when the pool is at its budget, and sb_kv_evict parks them there
 * on purpose. Without it a region's pages stay in memory unless
 * sb_kv_evict is called. */
#define SB_KV_EVICTABLE (1u << 0)

struct sb_kv_seq;

/* A new, empty sequence. Errors: -EINVAL (NULL, bad geometry, window longer
 * than max_ctx, sizes that overflow), -ENOMEM, -ECHILD, and those of
 * sb_buf_create and sb_buf_map. */
struct sb_kv_seq *sb_kv_create_sz(struct sb_pool *pool,
				  const struct sb_kv_config *cfg,
				  size_t cfg_size, int *err);

/* Free a sequence; its pages return to the pool (pages shared with other
 * sequences stay with them). NULL is a no-op. */
void sb_kv_destroy(struct sb_kv_seq *seq);

/* A new sequence whose first n positions (n <= sb_kv_len(seq)) are those
 * of seq: every page covering them is shared, copy-on-write. The two then
 * continue on their own; a write into a shared partial page copies it.
 * Errors: -EINVAL (NULL), -ERANGE (n > len), and those of sb_kv_create and
 * sb_buf_share. */
struct sb_kv_seq *sb_kv_fork(struct sb_kv_seq *seq, size_t n, int *err);

/* Before a pass that writes positions [len, len + n): place every page
 * those rows touch, and eagerly the pages needed a few positions later.
 * Returns the number of pages placed. Errors: -EINVAL (NULL), -ERANGE (past
 * max_ctx), -ENOMEM (budget: nothing placed for the pass's own rows), and
 * the rest of sb_buf_map's (-EIO, -ECHILD). */
long sb_kv_prepare(struct sb_kv_seq *seq, size_t n);

/* After the pass: the sequence holds len + n positions (prepared before).
 * Layers with a window release the pages wholly before len + n - window.
 * Returns the number of pages released. Errors: -EINVAL (NULL), -ERANGE
 * (past max_ctx), and those of sb_buf_unmap. */
long sb_kv_commit(struct sb_kv_seq *seq, size_t n);

/* Rewind to n positions (n <= len): pages wholly past n are released.
 * Returns the number of pages released. Errors: -EINVAL (NULL), -ERANGE
 * (n > len), and those of sb_buf_unmap. */
long sb_kv_truncate(struct sb_kv_seq *seq, size_t n);

/* Positions held. */
size_t sb_kv_len(const struct sb_kv_seq *seq);

/* First position layer still holds: 0, or len - window for a sliding
 * layer (its attention reads rows [start, len)). */
size_t sb_kv_start(const struct sb_kv_seq *seq, int layer);

/* A layer's K and V regions: (max_ctx, n_kv_heads, head_dim) of dtype. The
 * addresses never change. Rows before sb_kv_start and from sb_kv_len on
 * must not be read. */
void *sb_kv_k(const struct sb_kv_seq *seq, int layer);
void *sb_kv_v(const struct sb_kv_seq *seq, int layer);

/* The sequence's configuration (a restored one's comes from its file):
 * cfg->window points into the sequence (valid until sb_kv_destroy).
 * Errors: -EINVAL (NULL). */
int sb_kv_get_config_sz(const struct sb_kv_seq *seq, struct sb_kv_config *cfg,
			size_t cfg_size);

/* Bytes of one row: n_kv_heads * head_dim * element size. */
size_t sb_kv_row_bytes(const struct sb_kv_seq *seq);

struct sb_kv_stats {
	size_t len;		/* positions held */
	size_t bytes_exact;	/* rows held * row bytes, over all regions */
	size_t bytes_placed;	/* pages placed in this sequence (a page
				 * shared with another sequence counts in
				 * both; the pool counts it once) */
	size_t pages_placed;
	size_t regions;		/* 2 * n_layers */
};

/* Errors: -EINVAL (NULL). */
int sb_kv_stats_sz(const struct sb_kv_seq *seq, struct sb_kv_stats *st,
		   size_t st_size);

/* The buffer holding layer's K (v = 0) or V (v = 1) region, for
 * sb_buf_placed and friends. */
struct sb_buf *sb_kv_buf(const struct sb_kv_seq *seq, int layer, int v);

/* Wait until the pages asked for ahead are placed (the pool's background
 * thread places them): for tests and measurements that count pages.
 * Errors: -EINVAL (NULL), and those of sb_buf_prefetch with WAIT. */
int sb_kv_settle(const struct sb_kv_seq *seq);

/* ---- Sessions: save, continue, park ------------------------------------- */

/* Write the whole sequence to one file at path: its geometry, length,
 * every page of every region holding rows [0, len) (placed or evicted;
 * unplaced pages, such as those a sliding window released, are holes) and
 * an opaque user blob (user_len bytes: the caller's own state, such as
 * token ids and sampler state; at most 1 GiB). Atomic, as sb_buf_save: a
 * new file is written beside path and renamed into place once durable,
 * so an error, a full disk or a kill leaves the previous file as it was.
 * The sequence is unchanged. Do not run a pass on it meanwhile. Errors:
 * -EINVAL, and those of sb_buf_save (-EIO, -ENOSPC, -EISDIR, -ENODEV,
 * -ENOENT, -EACCES, -ENOMEM, ...). */
int sb_kv_save(struct sb_kv_seq *seq, const char *path, const void *user,
	       size_t user_len);

/* A new sequence from a file sb_kv_save wrote: the same geometry
 * (flags included; a lookahead over 16 pages of rows is taken as that
 * much), length and sliding-window starts, in this pool (whose page size
 * may differ from the saving pool's). Nothing is read beyond
 * the header and tables: pages are read in lazily on touch or prepare,
 * each checked against its CRC-32C (a damaged page raises SIGBUS on
 * touch, -EIO from prepare). The file may be replaced or removed
 * afterwards. Errors: the open(2) error, -EBADMSG (not a KV save file,
 * damaged or truncated), -EINVAL, -ENODEV, -EISDIR, -ENOMEM, -ECHILD. */
struct sb_kv_seq *sb_kv_restore(struct sb_pool *pool, const char *path,
				int *err);

/* The user blob of a restored sequence (its length in *len if len is not
 * NULL). NULL and 0 for a sequence that was not restored or was saved
 * with none. Valid until sb_kv_destroy. */
const void *sb_kv_user(const struct sb_kv_seq *seq, size_t *len);

/* Park an idle sequence: write the placed pages only it holds to the
 * pool's spill file and release them (sb_buf_evict on every region).
 * Addresses stay; the next prepare or touch reads back what it needs,
 * only that. Pages it shares with other sequences or a prefix cache stay
 * placed: writing them would give no memory back, and they are at hand
 * when it resumes. Pages past the length (placed ahead) are released
 * without a write.
 * Works with or without SB_KV_EVICTABLE (which adds eviction by the pool
 * under its budget). Returns the number of pages written out. Errors:
 * -EINVAL, and those of sb_buf_evict (-ENOSPC: the pages of the failing
 * batch stay resident, -EIO, -EOPNOTSUPP, ...). */
long sb_kv_evict(struct sb_kv_seq *seq);

/* ---- A prefix cache: token ids -> pages ---------------------------------- */

/* Remembers the pages of prefixes that sequences computed, keyed by their
 * token ids, and gives them to new sequences that start with the same
 * tokens: shared (copy-on-write), never copied. Its unit is a block: the
 * fewest whole positions that fill whole pages of a region (page size /
 * gcd(page size, row bytes)). Keys are chain hashes of the model id, the
 * geometry and each block's tokens with everything before (as vLLM's
 * block hashes), confirmed by comparing the tokens in full. Calls on one
 * cache are serialized (thread-safe). */
struct sb_kv_cache;

/* A cache for sequences of geometry cfg (flags: those of the sequences
 * sb_kv_cache_get returns) and model model_id (prefixes of different
 * models never match). It holds at most max_bytes of pages that only it
 * holds (pages also held by live sequences cost nothing more; checked at
 * each put, where the prefix just stored counts whole), keeping the most
 * recently used: the least recently used go to disk first when
 * the pool has a disk tier (an evictable buffer, a save or restore set it
 * up), and a sequence a get returns reads such a page in lazily, when it
 * first touches it (the cache's copy stays on disk); else they are
 * released.
 * Errors: -EINVAL (NULL, bad geometry), -ENOMEM, and those of
 * sb_buf_create. */
struct sb_kv_cache *sb_kv_cache_create_sz(struct sb_pool *pool,
					  const struct sb_kv_config *cfg,
					  size_t cfg_size,
					  const char *model_id,
					  size_t max_bytes, int *err);

/* Forget everything; pages also held by sequences stay with them. NULL is
 * a no-op. */
void sb_kv_cache_destroy(struct sb_kv_cache *cache);

/* Remember the first n positions of seq (n <= sb_kv_len(seq)), computed
 * from tokens[0..n), sharing their pages. Blocks already cached are kept
 * as they are. Returns the positions stored: n rounded down to whole
 * blocks. Errors: -EINVAL (NULL, a sequence of another geometry or pool),
 * -ERANGE (n > len), -ENOMEM, and those of sb_buf_share. */
long sb_kv_cache_put(struct sb_kv_cache *cache, struct sb_kv_seq *seq,
		     const int32_t *tokens, size_t n);

/* A new sequence (the cache's geometry) holding the longest cached prefix
 * of tokens[0..n), its pages shared; *hit = its length in positions (a
 * whole number of blocks; 0: an empty sequence). The caller computes
 * positions [hit, n) itself (to get logits for the last token, ask with
 * n - 1 tokens). A prefix stored from a sequence whose sliding window had
 * released rows ends only where every windowed layer held its window.
 * Errors: -EINVAL, -ENOMEM, and those of sb_kv_create and sb_buf_share. */
struct sb_kv_seq *sb_kv_cache_get(struct sb_kv_cache *cache,
				  const int32_t *tokens, size_t n, size_t *hit,
				  int *err);

/* The plain names, for the struct sizes this program is compiled with
 * (sparsebuf.h, "Structs that grow"). */
#ifndef SPARSEBUF_BUILD
static inline struct sb_kv_seq *sb_kv_create(struct sb_pool *pool,
					     const struct sb_kv_config *cfg,
					     int *err)
{
	return sb_kv_create_sz(pool, cfg, sizeof(struct sb_kv_config), err);
}

static inline int sb_kv_stats(const struct sb_kv_seq *seq,
			      struct sb_kv_stats *st)
{
	return sb_kv_stats_sz(seq, st, sizeof(struct sb_kv_stats));
}

static inline int sb_kv_get_config(const struct sb_kv_seq *seq,
				   struct sb_kv_config *cfg)
{
	return sb_kv_get_config_sz(seq, cfg, sizeof(struct sb_kv_config));
}

static inline struct sb_kv_cache *
sb_kv_cache_create(struct sb_pool *pool, const struct sb_kv_config *cfg,
		   const char *model_id, size_t max_bytes, int *err)
{
	return sb_kv_cache_create_sz(pool, cfg, sizeof(struct sb_kv_config),
				     model_id, max_bytes, err);
}
#else
/* The library's own: the 0.1 entry points (0.1 sizes). */
struct sb_kv_seq *sb_kv_create(struct sb_pool *pool,
			       const struct sb_kv_config *cfg, int *err);
int sb_kv_stats(const struct sb_kv_seq *seq, struct sb_kv_stats *st);
#endif

#ifdef __cplusplus
}
#endif

#endif /* SPARSEBUF_KV_H */
