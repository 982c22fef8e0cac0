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
};

struct sb_kv_seq;

/* A new, empty sequence. Errors: -EINVAL (NULL, bad geometry, window longer
 * than max_ctx, sizes that overflow), -ENOMEM, -ECHILD, and those of
 * sb_buf_create and sb_buf_map. */
struct sb_kv_seq *sb_kv_create(struct sb_pool *pool,
			       const struct sb_kv_config *cfg, int *err);

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
int sb_kv_stats(const struct sb_kv_seq *seq, struct sb_kv_stats *st);

/* The buffer holding layer's K (v = 0) or V (v = 1) region, for
 * sb_buf_placed and friends. */
struct sb_buf *sb_kv_buf(const struct sb_kv_seq *seq, int layer, int v);

/* Wait until the pages asked for ahead are placed (the pool's background
 * thread places them): for tests and measurements that count pages.
 * Errors: -EINVAL (NULL), and those of sb_buf_prefetch with WAIT. */
int sb_kv_settle(const struct sb_kv_seq *seq);

#ifdef __cplusplus
}
#endif

#endif /* SPARSEBUF_KV_H */
