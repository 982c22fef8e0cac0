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
 * 2.4 GHz development VM. Converting bf16 pairs with one shift and one
 * mask instead of zero-extend and shift measured no faster.
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

/*
 * bf16 in pairs: a 512-bit load of 32 bf16 values holds dim 2i in the low
 * half of 32-bit lane i and dim 2i + 1 in the high half. As f32, dim 2i is
 * the lane shifted left by 16 and dim 2i + 1 the lane with its low half
 * cleared: one instruction per 16 values (and one load per 32) instead of
 * a zero-extending load and a shift per 16, which both compete with the
 * FMAs for ports 0 and 5. The dims come out split into evens and odds, so
 * q is permuted the same way once per block (pair_q), and the V
 * accumulators are permuted into that order when loaded and back when
 * stored (once per block as well).
 */
SBKI_INLINE __m512 bf16_even(__m512i x)
{
	return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

SBKI_INLINE __m512 bf16_odd(__m512i x)
{
	return _mm512_castsi512_ps(
		_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}

/* Indices for _mm512_permutex2var_ps: dims 0..15 in a and 16..31 in b to
 * evens (EVEN) or odds (ODD); evens in a and odds in b back to dims 0..15
 * (LO) or 16..31 (HI). */
#define PAIR_EVEN                                                              \
	_mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4,  \
			 2, 0)
#define PAIR_ODD                                                               \
	_mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5,  \
			 3, 1)
#define PAIR_LO                                                                \
	_mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16,  \
			 0)
#define PAIR_HI                                                                \
	_mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,   \
			 9, 24, 8)

/* qp = the R rows of q from r0, each 32 dims as 16 evens then 16 odds. */
SBKI_INLINE void pair_q(float *qp, const struct sbki_attn_blk *b, int r0,
			const int R)
{
	const float *q = b->q + (size_t)r0 * b->hd;

	for (int d = 0; d < R * b->hd; d += 32) {
		__m512 x = _mm512_loadu_ps(q + d), y = _mm512_loadu_ps(q + d + 16);

		_mm512_storeu_ps(qp + d, _mm512_permutex2var_ps(x, PAIR_EVEN, y));
		_mm512_storeu_ps(qp + d + 16,
				 _mm512_permutex2var_ps(x, PAIR_ODD, y));
	}
}

/* scores_rp for bf16, head_dim a multiple of 32, q from pair_q. */
SBKI_INLINE void scores_pairs(const struct sbki_attn_blk *b, const float *qp,
			      int r0, int p, const int R, const int P)
{
	const int hd = b->hd, wide = R * P == 16;
	const uint16_t *k = (const uint16_t *)b->k + (size_t)p * b->stride;
	float *s = b->s + (size_t)r0 * B + p;
	__m512 a[16], ke[16], ko[16], scale = _mm512_set1_ps(b->scale);

#define ACC(i, j)                                                              \
	a[wide ? 4 * (((i)*P + (j)) % 4) + ((i)*P + (j)) / 4 : (i)*P + (j)]
#pragma GCC unroll 16
	for (int j = 0; j < 16; j++)
		a[j] = _mm512_setzero_ps();
	for (int d = 0; d < hd; d += 32) {
#pragma GCC unroll 16
		for (int j = 0; j < P; j++) {
			__m512i x = _mm512_loadu_si512(k + j * b->stride + d);

			ke[j] = bf16_even(x);
			ko[j] = bf16_odd(x);
		}
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m512 qe = _mm512_loadu_ps(qp + i * hd + d);
			__m512 qo = _mm512_loadu_ps(qp + i * hd + d + 16);

#pragma GCC unroll 16
			for (int j = 0; j < P; j++)
				ACC(i, j) = _mm512_fmadd_ps(
					qo, ko[j],
					_mm512_fmadd_ps(qe, ke[j], ACC(i, j)));
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

/* accum for bf16, head_dim a multiple of 32: G groups of 32 dims from d,
 * each held as evens and odds (2 * R * G <= 16 chains). */
SBKI_INLINE void accum_pairs(const struct sbki_attn_blk *b, int r0,
			     const int R, const float *alpha, int d,
			     const int G)
{
	const float *w = b->s + (size_t)r0 * B;
	const uint16_t *v = (const uint16_t *)b->v + d;
	float *acc = b->acc + (size_t)r0 * b->hd + d;
	__m512 a[16], ve[4], vo[4];

#pragma GCC unroll 4
	for (int i = 0; i < R; i++) {
		__m512 al = _mm512_set1_ps(alpha[i]);

#pragma GCC unroll 4
		for (int g = 0; g < G; g++) {
			const float *o = acc + i * b->hd + 32 * g;
			__m512 x = _mm512_loadu_ps(o);
			__m512 y = _mm512_loadu_ps(o + 16);

			a[2 * (i * G + g)] = _mm512_mul_ps(
				_mm512_permutex2var_ps(x, PAIR_EVEN, y), al);
			a[2 * (i * G + g) + 1] = _mm512_mul_ps(
				_mm512_permutex2var_ps(x, PAIR_ODD, y), al);
		}
	}
	for (int p = 0; p < b->np; p++) {
#pragma GCC unroll 4
		for (int g = 0; g < G; g++) {
			__m512i x = _mm512_loadu_si512(
				v + (size_t)p * b->stride + 32 * g);

			ve[g] = bf16_even(x);
			vo[g] = bf16_odd(x);
		}
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m512 wv = _mm512_set1_ps(w[i * B + p]);

#pragma GCC unroll 4
			for (int g = 0; g < G; g++) {
				a[2 * (i * G + g)] = _mm512_fmadd_ps(
					wv, ve[g], a[2 * (i * G + g)]);
				a[2 * (i * G + g) + 1] = _mm512_fmadd_ps(
					wv, vo[g], a[2 * (i * G + g) + 1]);
			}
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 4
		for (int g = 0; g < G; g++) {
			float *o = acc + i * b->hd + 32 * g;
			__m512 e = a[2 * (i * G + g)];
			__m512 od = a[2 * (i * G + g) + 1];

			_mm512_storeu_ps(o, _mm512_permutex2var_ps(e, PAIR_LO,
								  od));
			_mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(
							 e, PAIR_HI, od));
		}
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

SBKI_INLINE void scores(const struct sbki_attn_blk *b, int r0, const int R,
			const enum sbk_dtype t)
{
	int p = 0;

	if (R != 3)
		for (; p + 16 / R <= b->np; p += 16 / R)
			scores_rp(b, r0, p, R, 16 / R, t);
	for (; p < b->np; p++)
		scores_rp(b, r0, p, R, 1, t);
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

	if (t == SBK_BF16 && !(hd & 31)) {
		float qp[4 * SBK_MAX_HEAD_DIM];
		const int G = R >= 3 ? 2 : 4;
		int p = 0;

		pair_q(qp, b, r0, R);
		if (R != 3)
			for (; p + 16 / R <= b->np; p += 16 / R)
				scores_pairs(b, qp, r0, p, R, 16 / R);
		for (; p < b->np; p++)
			scores_pairs(b, qp, r0, p, R, 1);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++)
			alpha[i] = update(b, r0 + i);
		for (; d + 32 * G <= hd; d += 32 * G)
			accum_pairs(b, r0, R, alpha, d, G);
		for (; d < hd; d += 32)
			accum_pairs(b, r0, R, alpha, d, 1);
		return;
	}
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

#ifdef TOUCH_ONLY
static volatile float touch_sink;
#endif
void sbki_attn_block_avx512(const struct sbki_attn_blk *b)
{
#ifdef TOUCH_ONLY
	{
		__m512 x = _mm512_setzero_ps();
		for (int p = 0; p < b->np; p++)
			for (int d = 0; d < b->hd; d += 32)
				x = _mm512_add_ps(x, _mm512_loadu_ps((const uint16_t *)b->k + p * b->stride + d));
		for (int p = 0; p < b->np; p++)
			for (int d = 0; d < b->hd; d += 32)
				x = _mm512_add_ps(x, _mm512_loadu_ps((const uint16_t *)b->v + p * b->stride + d));
		touch_sink = _mm512_reduce_add_ps(x);
		return;
	}
#endif
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
