/* SPDX-License-Identifier: MIT */
/*
 * Inline helpers of the AVX2 kernels (included only by *_avx2.c): loads of
 * 8 elements of any KV type as f32, a masked tail that never touches
 * memory past the end, horizontal sums, and exp/exp2 to about 2 ulp.
 */
#ifndef SBKERNELS_SIMD_AVX2_H
#define SBKERNELS_SIMD_AVX2_H

#include <immintrin.h>

#include "internal.h"

/* Lanes 0..n-1 set (n in 0..8), for maskload/maskstore. */
SBKI_INLINE __m256i v8_mask(int n)
{
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(n),
				  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

SBKI_INLINE __m256 v8_bf16(__m128i h)
{
	return _mm256_castsi256_ps(
		_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 elements of type t at element index i of p, as f32 (t is a constant
 * at every call site). */
SBKI_INLINE __m256 v8_load(const void *p, size_t i, enum sbk_dtype t)
{
	const uint16_t *h = (const uint16_t *)p + i;

	if (t == SBK_F32)
		return _mm256_loadu_ps((const float *)p + i);
	if (t == SBK_F16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
	return v8_bf16(_mm_loadu_si128((const __m128i *)h));
}

/* The first n (0..8) elements, the other lanes 0. f32 uses a masked load
 * (no fault past the end); 16-bit types have none in AVX2, so they go
 * through a small copy. */
SBKI_INLINE __m256 v8_load_n(const void *p, size_t i, enum sbk_dtype t, int n)
{
	uint16_t tmp[8] = {0};

	if (t == SBK_F32)
		return _mm256_maskload_ps((const float *)p + i, v8_mask(n));
	memcpy(tmp, (const uint16_t *)p + i, (size_t)n * sizeof(*tmp));
	if (t == SBK_F16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tmp));
	return v8_bf16(_mm_loadu_si128((const __m128i *)tmp));
}

SBKI_INLINE float v8_sum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
			      _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

SBKI_INLINE float v8_max(__m256 v)
{
	__m128 s = _mm_max_ps(_mm256_castps256_ps128(v),
			      _mm256_extractf128_ps(v, 1));

	s = _mm_max_ps(s, _mm_movehl_ps(s, s));
	s = _mm_max_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* p * 2^n for integral n in [-151, 129]: applied as two factors so both
 * are normal floats, which gives subnormal results and infinity right. */
SBKI_INLINE __m256 v8_scale2(__m256 p, __m256 n)
{
	__m256i ni = _mm256_cvtps_epi32(n);
	__m256i n1 = _mm256_srai_epi32(ni, 1);
	__m256i n2 = _mm256_sub_epi32(ni, n1);
	__m256i bias = _mm256_set1_epi32(127);
	__m256 f1 = _mm256_castsi256_ps(
		_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
	__m256 f2 = _mm256_castsi256_ps(
		_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));

	return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

/* 2^x, as v16_exp2 in simd_avx512.h. NaN stays NaN. */
SBKI_INLINE __m256 v8_exp2(__m256 x)
{
	__m256 n, f, p, nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);

	x = _mm256_max_ps(x, _mm256_set1_ps(-151.0f));
	x = _mm256_min_ps(x, _mm256_set1_ps(129.0f));
	n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	f = _mm256_sub_ps(x, n);
	p = _mm256_set1_ps(1.535336188319500e-4f);
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
	p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
	return _mm256_or_ps(v8_scale2(p, n), nan);
}

/* e^x, as v16_exp in simd_avx512.h. */
SBKI_INLINE __m256 v8_exp(__m256 x)
{
	__m256 n, r, p, nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);

	x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
	x = _mm256_min_ps(x, _mm256_set1_ps(89.0f));
	n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(SBKI_LOG2E)),
			    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
	p = _mm256_set1_ps(1.9875691500e-4f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
	p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
	p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
	return _mm256_or_ps(v8_scale2(p, n), nan);
}

#endif /* SBKERNELS_SIMD_AVX2_H */
