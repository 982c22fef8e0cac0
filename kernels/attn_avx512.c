/* SPDX-License-Identifier: MIT */
/*
 * Attention block, AVX-512. Query rows go in groups of R <= 4 (one GQA
 * group of 4 is one group).
 *
 * Scores: R rows x 16/R positions at a time (16 accumulators): each K
 * vector loaded and converted serves R rows, each q vector 16/R positions,
 * and the 16 dot products are reduced together by sum16 (30 instructions
 * instead of 16 separate horizontal sums).
 * V pass: R rows x 4 (R >= 3) or 8 chunks of 16 dims held in registers
 * while the block's positions go by: enough independent FMA chains to
 * hide the FMA latency, each V vector serving R rows.
 *
 * With 16 KV positions converted per 64 FMAs the loop is FMA-bound: about
 * 31 ns per position and KV head (4 rows, head_dim 128) from L2 on the
 * 2.4 GHz development VM, which retires only ~1.9 G 512-bit FMAs/s per
 * core: 64 per position and head is ~34 ns, so ~15 GB/s of bf16 KV per
 * thread is the compute ceiling. Measured no faster (bf16, from L2):
 * converting bf16 pairs with one shift and one mask instead of
 * zero-extend and shift (q and acc permuted to match); the same on 256-bit
 * vectors with the conversion on port 5 (the VM does 4.8 G 256-bit
 * FMAs/s, yet the kernel ran ~15% slower).
 */
#include "simd_avx512.h"

#define B SBKI_ATTN_BLOCK
_Static_assert(B == 32, "update() holds a block's scores in two vectors");

/* Horizontal sums of 16 vectors at once: lane 4l + e of the result is the
 * sum of a[4e + l]. Four rounds of shuffle-and-add, each halving the data:
 * 30 instructions instead of 16 separate reductions of 8 or more. */
SBKI_INLINE __m512 sum16(const __m512 *a)
{
	__m512 b[8], c[4], d[2];

	/* b[j], 128-bit lanes: a[2j] (0+1, 2+3), a[2j+1] (0+1, 2+3) */
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		b[j] = _mm512_add_ps(
			_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x88),
			_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xdd));
		/* c[j], 128-bit lane l: 4 floats summing to all of a[4j + l] */
#pragma GCC unroll 4
	for (int j = 0; j < 4; j++)
		c[j] = _mm512_add_ps(
			_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
			_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xdd));
		/* then a 4x4 transpose-and-add inside each 128-bit lane */
#pragma GCC unroll 2
	for (int j = 0; j < 2; j++)
		d[j] = _mm512_add_ps(
			_mm512_unpacklo_ps(c[2 * j], c[2 * j + 1]),
			_mm512_unpackhi_ps(c[2 * j], c[2 * j + 1]));
	return _mm512_add_ps(
		_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(d[0]),
						    _mm512_castps_pd(d[1]))),
		_mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(d[0]),
						    _mm512_castps_pd(d[1]))));
}

/* s[r][p] = scale * dot(q[r], k[p]) for the R rows from r0 and the P
 * positions from p, R * P = 16 or P = 1: each K vector loaded (and
 * converted) serves R rows, each q vector P positions, and R * P FMA
 * chains run side by side. With R * P = 16 the accumulator of (row i,
 * position j) is a[4m % 16 + m / 4], m = i * P + j, so that sum16 returns
 * the scores row by row. */
SBKI_INLINE void scores_rp(const struct sbki_attn_blk *b, int r0, int p,
			   const int R, const int P, const enum sbk_dtype t)
{
	const int hd = b->hd, full = hd & ~15, wide = R * P == 16;
	const __mmask16 tail = v16_mask(hd & 15);
	const float *q = b->q + (size_t)r0 * hd;
	float *s = b->s + (size_t)r0 * B + p;
	size_t row = (size_t)p * b->stride;
	__m512 a[16], k[16], scale = _mm512_set1_ps(b->scale);
	int d;

#define ACC(i, j)                                                              \
	a[wide ? 4 * (((i)*P + (j)) % 4) + ((i)*P + (j)) / 4 : (i)*P + (j)]
#pragma GCC unroll 16
	for (int j = 0; j < 16; j++)
		a[j] = _mm512_setzero_ps();
	for (d = 0; d < full; d += 16) {
#pragma GCC unroll 16
		for (int j = 0; j < P; j++)
			k[j] = v16_load(b->k, row + j * b->stride + d, t);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m512 qv = _mm512_loadu_ps(q + i * hd + d);

#pragma GCC unroll 16
			for (int j = 0; j < P; j++)
				ACC(i, j) =
					_mm512_fmadd_ps(qv, k[j], ACC(i, j));
		}
	}
	if (d < hd) {
#pragma GCC unroll 16
		for (int j = 0; j < P; j++)
			k[j] = v16_load_mask(b->k, row + j * b->stride + d, t,
					     tail);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m512 qv = _mm512_maskz_loadu_ps(tail, q + i * hd + d);

#pragma GCC unroll 16
			for (int j = 0; j < P; j++)
				ACC(i, j) =
					_mm512_fmadd_ps(qv, k[j], ACC(i, j));
		}
	}
#undef ACC
	if (wide) {
		float out[16];

		_mm512_storeu_ps(out, _mm512_mul_ps(sum16(a), scale));
#pragma GCC unroll 4
		for (int i = 0; i < R; i++)
			memcpy(s + i * B, out + i * P, P * sizeof(float));
		return;
	}
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
		s[i * B] = _mm512_reduce_add_ps(a[i]) * b->scale;
}

/* Prefetch rows [p0, p1) of the prefetch block's K and V (b->pk, b->pv)
 * into L1, where the next call will read them. */
SBKI_INLINE void prefetch_rows(const struct sbki_attn_blk *b, int p0, int p1,
			       const enum sbk_dtype t)
{
	const size_t es = sbki_dtype_size(t), rb = (size_t)b->hd * es;

	p1 = p1 < b->pnp ? p1 : b->pnp;
	for (int p = p0; p < p1; p++) {
		size_t at = (size_t)p * b->stride * es;
		const char *k = (const char *)b->pk + at;
		const char *v = (const char *)b->pv + at;

		for (size_t x = 0; x < rb; x += 64) {
			_mm_prefetch(k + x, _MM_HINT_T0);
			_mm_prefetch(v + x, _MM_HINT_T0);
		}
	}
}

/* Scores of every position for the R rows from r0. The first group of
 * rows also prefetches the next call's K and V rows, a few with each
 * batch of positions: spread over the work, the requests keep the line
 * fill buffers busy without a burst that would stall this block's own
 * loads (a burst of all of them before the call measured slower). */
SBKI_INLINE void scores(const struct sbki_attn_blk *b, int r0, const int R,
			const enum sbk_dtype t)
{
	const int pf = !r0 && b->pnp;
	int p = 0;

	if (R != 3)
		for (; p + 16 / R <= b->np; p += 16 / R) {
			scores_rp(b, r0, p, R, 16 / R, t);
			if (pf)
				prefetch_rows(b, p, p + 16 / R, t);
		}
	for (; p < b->np; p++) {
		scores_rp(b, r0, p, R, 1, t);
		if (pf)
			prefetch_rows(b, p, p + 1, t);
	}
	if (pf && p < b->pnp)
		prefetch_rows(b, p, b->pnp, t);
}

/* Fold row r's scores into its m and l; leave the weights 2^(s - m) in
 * s (0 outside the valid range) and return the factor for acc. */
SBKI_INLINE float update(const struct sbki_attn_blk *b, int r)
{
	float *s = b->s + (size_t)r * B;
	int lo = b->lo ? b->lo[r] : 0, hi = b->hi ? b->hi[r] : b->np;
	__m512 x0, x1, ninf = _mm512_set1_ps(-INFINITY), mv;
	__mmask16 k0, k1;
	uint32_t valid;
	float m, mn, alpha;

	if (lo >= hi) {
		_mm512_storeu_ps(s, _mm512_setzero_ps());
		_mm512_storeu_ps(s + 16, _mm512_setzero_ps());
		return 1.0f;
	}
	valid = (uint32_t)((((uint64_t)1 << hi) - 1) &
			   ~(((uint64_t)1 << lo) - 1));
	k0 = (__mmask16)valid;
	k1 = (__mmask16)(valid >> 16);
	x0 = _mm512_mask_loadu_ps(ninf, k0, s);
	x1 = _mm512_mask_loadu_ps(ninf, k1, s + 16);
	m = b->m[r];
	mn = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
	mn = m > mn ? m : mn;
	alpha = m == -INFINITY ? 0 : exp2f(m - mn);
	mv = _mm512_set1_ps(mn);
	x0 = _mm512_maskz_mov_ps(k0, v16_exp2(_mm512_sub_ps(x0, mv)));
	x1 = _mm512_maskz_mov_ps(k1, v16_exp2(_mm512_sub_ps(x1, mv)));
	_mm512_storeu_ps(s, x0);
	_mm512_storeu_ps(s + 16, x1);
	b->m[r] = mn;
	b->l[r] = b->l[r] * alpha + _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
	return alpha;
}

/* acc[r] = acc[r] * alpha[r] + sum_p w[r][p] v[p] for the R rows from r0
 * and D chunks of 16 dims from d (the last one masked by k): R * D <= 16
 * independent FMA chains, each V vector loaded serving R rows. */
SBKI_INLINE void accum(const struct sbki_attn_blk *b, int r0, const int R,
		       const float *alpha, int d, const int D, __mmask16 k,
		       const int masked, const enum sbk_dtype t)
{
	const float *w = b->s + (size_t)r0 * B;
	float *acc = b->acc + (size_t)r0 * b->hd + d;
	__m512 a[16], v[8];

#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 8
		for (int c = 0; c < D; c++)
			a[i * D + c] = _mm512_mul_ps(
				_mm512_maskz_loadu_ps(c == D - 1 ? k : 0xffff,
						      acc + i * b->hd + 16 * c),
				_mm512_set1_ps(alpha[i]));
	for (int p = 0; p < b->np; p++) {
		size_t at = (size_t)p * b->stride + d;

#pragma GCC unroll 8
		for (int c = 0; c < D; c++)
			v[c] = masked && c == D - 1
				       ? v16_load_mask(b->v, at + 16 * c, t, k)
				       : v16_load(b->v, at + 16 * c, t);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m512 wv = _mm512_set1_ps(w[i * B + p]);

#pragma GCC unroll 8
			for (int c = 0; c < D; c++)
				a[i * D + c] =
					_mm512_fmadd_ps(wv, v[c], a[i * D + c]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 8
		for (int c = 0; c < D; c++)
			_mm512_mask_storeu_ps(acc + i * b->hd + 16 * c,
					      c == D - 1 ? k : 0xffff,
					      a[i * D + c]);
}

SBKI_INLINE void group(const struct sbki_attn_blk *b, int r0, const int R,
		       const enum sbk_dtype t)
{
	const int hd = b->hd, D = R >= 3 ? 4 : 8, full = hd & ~15;
	float alpha[4];
	int d = 0;

	scores(b, r0, R, t);
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
		alpha[i] = update(b, r0 + i);
	for (; d + 16 * D <= full; d += 16 * D)
		accum(b, r0, R, alpha, d, D, 0xffff, 0, t);
	for (; d < full; d += 16)
		accum(b, r0, R, alpha, d, 1, 0xffff, 0, t);
	if (d < hd)
		accum(b, r0, R, alpha, d, 1, v16_mask(hd & 15), 1, t);
}

SBKI_INLINE void block(const struct sbki_attn_blk *b, const enum sbk_dtype t)
{
	int r = 0;

	for (; r + 4 <= b->nr; r += 4)
		group(b, r, 4, t);
	switch (b->nr - r) {
	case 3:
		group(b, r, 3, t);
		break;
	case 2:
		group(b, r, 2, t);
		break;
	case 1:
		group(b, r, 1, t);
		break;
	}
}

void sbki_attn_block_avx512(const struct sbki_attn_blk *b)
{
	switch (b->dtype) {
	case SBK_F32:
		block(b, SBK_F32);
		break;
	case SBK_F16:
		block(b, SBK_F16);
		break;
	default:
		block(b, SBK_BF16);
		break;
	}
}
