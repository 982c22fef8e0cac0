/* SPDX-License-Identifier: MIT */
/*
 * Attention block, AVX2 + FMA + F16C: the structure of attn_avx512.c with
 * 8 lanes and 16 registers, so 8 accumulators: scores for R rows x 8/R
 * positions, the V pass over R rows x 8/R chunks of 8 dims (2 for R = 3).
 */
#include "simd_avx2.h"

#define B SBKI_ATTN_BLOCK
_Static_assert(B == 32, "update() holds a block's scores in four vectors");

/* Horizontal sums of 8 vectors at once: lane j of the result is the sum
 * of a[j]. One hadd tree instead of 8 separate reductions. */
SBKI_INLINE __m256 sum8(const __m256 *a)
{
	__m256 lo = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]),
				   _mm256_hadd_ps(a[2], a[3]));
	__m256 hi = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]),
				   _mm256_hadd_ps(a[6], a[7]));

	/* 128-bit halves: lo = (0-3 of a[0..3] low, a[0..3] high) */
	return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20),
			     _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* s[r][p] = scale * dot(q[r], k[p]) for the R rows from r0 and the P
 * positions from p, R * P = 8 or P = 1: each K vector loaded serves R
 * rows, each q vector P positions, with R * P FMA chains side by side
 * (accumulator of row i, position j: a[i * P + j]). */
SBKI_INLINE void scores_rp(const struct sbki_attn_blk *b, int r0, int p,
			   const int R, const int P, const enum sbk_dtype t)
{
	const int hd = b->hd, full = hd & ~7, rest = hd & 7;
	const __m256i tail = v8_mask(rest);
	const float *q = b->q + (size_t)r0 * hd;
	float *s = b->s + (size_t)r0 * B + p;
	size_t row = (size_t)p * b->stride;
	__m256 a[8], k[8];
	int d;

#pragma GCC unroll 8
	for (int j = 0; j < 8; j++)
		a[j] = _mm256_setzero_ps();
	for (d = 0; d < full; d += 8) {
#pragma GCC unroll 8
		for (int j = 0; j < P; j++)
			k[j] = v8_load(b->k, row + j * b->stride + d, t);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m256 qv = _mm256_loadu_ps(q + i * hd + d);

#pragma GCC unroll 8
			for (int j = 0; j < P; j++)
				a[i * P + j] =
					_mm256_fmadd_ps(qv, k[j], a[i * P + j]);
		}
	}
	if (rest) {
#pragma GCC unroll 8
		for (int j = 0; j < P; j++)
			k[j] = v8_load_n(b->k, row + j * b->stride + d, t,
					 rest);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m256 qv = _mm256_maskload_ps(q + i * hd + d, tail);

#pragma GCC unroll 8
			for (int j = 0; j < P; j++)
				a[i * P + j] =
					_mm256_fmadd_ps(qv, k[j], a[i * P + j]);
		}
	}
	if (R * P == 8) {
		float out[8];

		_mm256_storeu_ps(
			out, _mm256_mul_ps(sum8(a), _mm256_set1_ps(b->scale)));
#pragma GCC unroll 4
		for (int i = 0; i < R; i++)
			memcpy(s + i * B, out + i * P, P * sizeof(float));
		return;
	}
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
		s[i * B] = v8_sum(a[i]) * b->scale;
}

/* Prefetch rows [p0, p1) of the next call's K and V into L1, as
 * attn_avx512.c does (see there). */
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

SBKI_INLINE void scores(const struct sbki_attn_blk *b, int r0, const int R,
			const enum sbk_dtype t)
{
	const int pf = !r0 && b->pnp;
	int p = 0;

	if (R != 3)
		for (; p + 8 / R <= b->np; p += 8 / R) {
			scores_rp(b, r0, p, R, 8 / R, t);
			if (pf)
				prefetch_rows(b, p, p + 8 / R, t);
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
	__m256 x[4], k[4], mx, sum, mv;
	float m, mn, alpha;

	if (lo >= hi) {
		for (int j = 0; j < 4; j++)
			_mm256_storeu_ps(s + 8 * j, _mm256_setzero_ps());
		return 1.0f;
	}
	mx = _mm256_set1_ps(-INFINITY);
	for (int j = 0; j < 4; j++) {
		__m256i idx = _mm256_add_epi32(
			_mm256_set1_epi32(8 * j),
			_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));

		k[j] = _mm256_castsi256_ps(_mm256_and_si256(
			_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1)),
			_mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx)));
		/* Invalid lanes may hold garbage: blend in -inf. */
		x[j] = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY),
					_mm256_loadu_ps(s + 8 * j), k[j]);
		mx = _mm256_max_ps(mx, x[j]);
	}
	m = b->m[r];
	mn = v8_max(mx);
	mn = m > mn ? m : mn;
	alpha = m == -INFINITY ? 0 : exp2f(m - mn);
	mv = _mm256_set1_ps(mn);
	sum = _mm256_setzero_ps();
	for (int j = 0; j < 4; j++) {
		x[j] = _mm256_and_ps(k[j], v8_exp2(_mm256_sub_ps(x[j], mv)));
		_mm256_storeu_ps(s + 8 * j, x[j]);
		sum = _mm256_add_ps(sum, x[j]);
	}
	b->m[r] = mn;
	b->l[r] = b->l[r] * alpha + v8_sum(sum);
	return alpha;
}

/* acc[r] = acc[r] * alpha[r] + sum_p w[r][p] v[p] for the R rows from r0
 * and D chunks of 8 dims from d, the last one n (1..8) wide: R * D <= 8
 * independent FMA chains, each V vector loaded serving R rows. */
SBKI_INLINE void accum(const struct sbki_attn_blk *b, int r0, const int R,
		       const float *alpha, int d, const int D, int n,
		       const enum sbk_dtype t)
{
	const float *w = b->s + (size_t)r0 * B;
	float *acc = b->acc + (size_t)r0 * b->hd + d;
	__m256i k = v8_mask(n);
	__m256 a[8], v[8];

#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 8
		for (int c = 0; c < D; c++)
			a[i * D + c] = _mm256_mul_ps(
				c == D - 1 ? _mm256_maskload_ps(
						     acc + i * b->hd + 8 * c, k)
					   : _mm256_loadu_ps(acc + i * b->hd +
							     8 * c),
				_mm256_set1_ps(alpha[i]));
	for (int p = 0; p < b->np; p++) {
		size_t at = (size_t)p * b->stride + d;

#pragma GCC unroll 8
		for (int c = 0; c < D; c++)
			v[c] = c == D - 1 && n < 8
				       ? v8_load_n(b->v, at + 8 * c, t, n)
				       : v8_load(b->v, at + 8 * c, t);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m256 wv = _mm256_set1_ps(w[i * B + p]);

#pragma GCC unroll 8
			for (int c = 0; c < D; c++)
				a[i * D + c] =
					_mm256_fmadd_ps(wv, v[c], a[i * D + c]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 8
		for (int c = 0; c < D; c++) {
			if (c == D - 1)
				_mm256_maskstore_ps(acc + i * b->hd + 8 * c, k,
						    a[i * D + c]);
			else
				_mm256_storeu_ps(acc + i * b->hd + 8 * c,
						 a[i * D + c]);
		}
}

SBKI_INLINE void group(const struct sbki_attn_blk *b, int r0, const int R,
		       const enum sbk_dtype t)
{
	const int hd = b->hd, D = R >= 3 ? 2 : 8 / R, full = hd & ~7;
	float alpha[4];
	int d = 0;

	scores(b, r0, R, t);
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
		alpha[i] = update(b, r0 + i);
	for (; d + 8 * D <= full; d += 8 * D)
		accum(b, r0, R, alpha, d, D, 8, t);
	for (; d < full; d += 8)
		accum(b, r0, R, alpha, d, 1, 8, t);
	if (d < hd)
		accum(b, r0, R, alpha, d, 1, hd - d, t);
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

void sbki_attn_block_avx2(const struct sbki_attn_blk *b)
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
