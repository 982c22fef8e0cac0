/* SPDX-License-Identifier: MIT */
/*
 * Private declarations shared by the files of libsbkernels.
 *
 * Layout: each kernel has a driver (attn.c, matmul.c, vec.c, convert.c:
 * argument checks, threading, anything that must be identical for every
 * variant) and one file per instruction set with the inner loops
 * (*_scalar.c, *_avx2.c, *_avx512.c, and convert_avx512bf16.c). The
 * variants are gathered in one table per instruction set (dispatch.c); a
 * driver fetches the table once per call.
 *
 * Files named *_avx2.c / *_avx512.c / *_avx512bf16.c are the only ones
 * built with those instruction sets enabled (kernels.mk), and nothing in
 * them runs before dispatch.c has checked CPUID.
 */
#ifndef SBKERNELS_INTERNAL_H
#define SBKERNELS_INTERNAL_H

#include "sbkernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define SBK_API	    __attribute__((visibility("default")))
#define SBKI_INLINE static inline __attribute__((always_inline))

/* Positions per attention block: the scores of one block for every query
 * row of a KV head stay in L1, and the block's K and V rows are read from
 * memory once for all those rows. */
#define SBKI_ATTN_BLOCK 32

/* Positions per decode chunk. Each chunk's softmax state is computed from
 * scratch and the chunks of a sequence are merged in order, so a result
 * depends only on its range, never on how chunks were spread over threads
 * or batched with other sequences (a multiple of SBKI_ATTN_BLOCK). Small
 * enough to balance 2 threads on a few thousand positions; the merge costs
 * one head_dim-wide multiply-add per chunk and head. */
#define SBKI_ATTN_CHUNK 1024

/* log2(e): scores are kept in base 2 so the kernels can use exp2. */
#define SBKI_LOG2E 1.44269504088896340736f

/*
 * One block of positions of one KV head against nr query rows, folded into
 * the rows' online-softmax state. For row r and position p in the block:
 *
 *	s = scale * dot(q[r], k[p])		(scale includes log2(e))
 *	m' = max(m[r], s over the row's valid positions)
 *	l[r] = l[r] * 2^(m[r] - m') + sum 2^(s - m')
 *	acc[r] = acc[r] * 2^(m[r] - m') + sum 2^(s - m') v[p]
 *
 * m[r] = -INFINITY and l[r] = 0, acc[r] = 0 is the empty state. Rows with
 * no valid position in the block are left as they are. Every position of
 * the block may be read, also those outside a row's valid range (prefill
 * masks them): the driver only makes blocks of readable positions.
 */
struct sbki_attn_blk {
	const void *k; /* (np, stride) from the block's first row */
	const void *v; /* (np, stride) likewise */
	size_t stride; /* elements from one position to the next */
	enum sbk_dtype dtype;
	int np;		/* positions, 1..SBKI_ATTN_BLOCK */
	int nr;		/* query rows */
	int hd;		/* head_dim */
	float scale;	/* score scale times log2(e) */
	const float *q; /* (nr, hd) */
	const int *lo;	/* (nr) first valid position, or NULL: 0 */
	const int *hi;	/* (nr) end of the valid positions, or NULL: np */
	float *m;	/* (nr) running maximum score (base 2) */
	float *l;	/* (nr) running sum of 2^(s - m) */
	float *acc;	/* (nr, hd) running sum of 2^(s - m) v */
	float *s;	/* (nr, SBKI_ATTN_BLOCK) scratch */
	/* The K and V rows (same stride, hd, dtype) of a later block of this
	 * work item, to prefetch while this one is computed; pnp 0: none. A
	 * hint only: a variant may ignore it. */
	const void *pk, *pv;
	int pnp;
};

/* The inner loops of one instruction set. Row ranges of the matrix
 * products and every vector length are >= 0. */
struct sbki_ops {
	void (*attn_block)(const struct sbki_attn_blk *b);
	/* out[r] = dot(w[r], x), r < rows */
	void (*matvec)(float *out,     /* (rows) */
		       const float *w, /* (rows, cols) */
		       const float *x, /* (cols) */
		       int rows, int cols);
	/* out[t * ldo + r] = dot(w[r], x[t]): the same sums as matvec */
	void (*matmul)(float *out,		   /* (n, ldo) */
		       size_t ldo, const float *w, /* (rows, cols) */
		       const float *x,		   /* (n, cols) */
		       int n, int rows, int cols);
	void (*rmsnorm)(float *out,	/* (n) */
			const float *x, /* (n) */
			const float *w, /* (n) */
			int n, float eps);
	/* Pairs (i, i + 1): c, s are (head_dim) with each value twice, the
	 * sines negated at even i, so x' = x * c + swap_pairs(x) * s. NeoX:
	 * c, s are (head_dim / 2) and pair i with i + head_dim / 2. */
	void (*rope)(float *x, /* (n_heads, head_dim) */
		     const float *c, const float *s, int n_heads, int head_dim,
		     int neox);
	void (*swiglu)(float *out, const float *a, const float *b, int n);
	void (*softmax)(float *x, int n);
	int (*argmax)(const float *x, int n); /* n >= 1 */
	void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
	void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
	void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
	void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
};

#define SBKI_DECLARE_OPS(isa)                                                  \
	void sbki_attn_block_##isa(const struct sbki_attn_blk *b);             \
	void sbki_matvec_##isa(float *out, const float *w, const float *x,     \
			       int rows, int cols);                            \
	void sbki_matmul_##isa(float *out, size_t ldo, const float *w,         \
			       const float *x, int n, int rows, int cols);     \
	void sbki_rmsnorm_##isa(float *out, const float *x, const float *w,    \
				int n, float eps);                             \
	void sbki_rope_##isa(float *x, const float *c, const float *s,         \
			     int n_heads, int head_dim, int neox);             \
	void sbki_swiglu_##isa(float *out, const float *a, const float *b,     \
			       int n);                                         \
	void sbki_softmax_##isa(float *x, int n);                              \
	int sbki_argmax_##isa(const float *x, int n);                          \
	void sbki_f32_to_f16_##isa(uint16_t *dst, const float *src, size_t n); \
	void sbki_f16_to_f32_##isa(float *dst, const uint16_t *src, size_t n); \
	void sbki_f32_to_bf16_##isa(uint16_t *dst, const float *src,           \
				    size_t n);                                 \
	void sbki_bf16_to_f32_##isa(float *dst, const uint16_t *src, size_t n);

SBKI_DECLARE_OPS(scalar)
SBKI_DECLARE_OPS(avx2)
SBKI_DECLARE_OPS(avx512)
/* The one kernel that uses AVX512_BF16 (its own CPUID check). */
void sbki_f32_to_bf16_avx512bf16(uint16_t *dst, const float *src, size_t n);

/* ---- dispatch.c ---------------------------------------------------------- */

/* The table of the variant in use (reads SBK_ISA on the first call). */
const struct sbki_ops *sbki_ops(void);

/* ---- threads.c ----------------------------------------------------------- */

/* Run fn(ctx, i) for every i in [0, n) on up to sbk_get_threads() threads,
 * the caller included, and return when all have returned. Items are handed
 * out in increasing order, one at a time. Runs everything on the caller
 * when there is one thread, one item, or the pool is busy with another
 * caller's job. */
void sbki_parallel(int n, void (*fn)(void *ctx, int i), void *ctx);

/* ---- scratch.c ----------------------------------------------------------- */

/* Per-thread scratch memory, 64-byte aligned, at least bytes long, kept
 * for the next call (freed when the thread exits). Slot 0 is for work
 * items, slot 1 for a driver's per-call data that items on other threads
 * read while the caller runs items too. Contents are not preserved when
 * the slot grows. NULL when out of memory. */
enum { SBKI_SCRATCH_ITEM, SBKI_SCRATCH_CALL, SBKI_SCRATCH_SLOTS };
void *sbki_scratch(int slot, size_t bytes);

/* ---- Scalar element conversions (the reference for every variant) -------- */

SBKI_INLINE uint32_t sbki_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

SBKI_INLINE float sbki_bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Round to nearest even like F16C (VCVTPS2PH with imm 0): NaNs are quieted
 * and keep the top of their payload. */
SBKI_INLINE uint16_t sbki_f32_to_f16_1(float f)
{
	uint32_t x = sbki_f32_bits(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t ax = x & 0x7fffffffu;

	if (ax > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
	if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) {
		/* Subnormal or zero in f16: adding 0.5f lines the 10 result
		 * bits up at the bottom of the mantissa, and the FPU's own
		 * round-to-nearest-even does the rounding. */
		float t = sbki_bits_f32(ax) + 0.5f;

		return (uint16_t)(sign | (sbki_f32_bits(t) - 0x3f000000u));
	}
	ax -= (uint32_t)(127 - 15) << 23; /* rebias the exponent */
	ax += 0xfffu + ((ax >> 13) & 1u); /* ties to even */
	return (uint16_t)(sign | (ax >> 13));
}

SBKI_INLINE float sbki_f16_to_f32_1(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;

	if (e == 0x1f) /* infinity, or NaN made quiet like F16C */
		return sbki_bits_f32(sign | 0x7f800000u | (m << 13) |
				     (m ? 0x400000u : 0));
	if (e == 0) /* zero or subnormal: exactly m * 2^-24 */
		return sbki_bits_f32(sign | sbki_f32_bits((float)m * 0x1p-24f));
	return sbki_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* Round to nearest even; NaNs are quieted (as VCVTNEPS2BF16 does). */
SBKI_INLINE uint16_t sbki_f32_to_bf16_1(float f)
{
	uint32_t x = sbki_f32_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

SBKI_INLINE float sbki_bf16_to_f32_1(uint16_t h)
{
	return sbki_bits_f32((uint32_t)h << 16);
}

SBKI_INLINE size_t sbki_dtype_size(enum sbk_dtype t)
{
	return t == SBK_F32 ? 4 : t == SBK_F16 || t == SBK_BF16 ? 2 : 0;
}

/* Element i of a buffer of dtype, as f32 (scalar code). */
SBKI_INLINE float sbki_load1(const void *p, size_t i, enum sbk_dtype t)
{
	if (t == SBK_F32)
		return ((const float *)p)[i];
	if (t == SBK_F16)
		return sbki_f16_to_f32_1(((const uint16_t *)p)[i]);
	return sbki_bf16_to_f32_1(((const uint16_t *)p)[i]);
}

#endif /* SBKERNELS_INTERNAL_H */
