/* SPDX-License-Identifier: MIT */
/*
 * Inline helpers of the AVX-512 kernels (included only by *_avx512.c):
 * loads of 16 elements of any KV type as f32, and exp/exp2 to about 2 ulp.
 */
#ifndef SBKERNELS_SIMD_AVX512_H
#define SBKERNELS_SIMD_AVX512_H

#include <immintrin.h>

#include "internal.h"

/* Mask of the first n (0..16) lanes. */
SBKI_INLINE __mmask16 v16_mask(int n)
{
	return (__mmask16)((1u << n) - 1);
}

/* 16 elements of type t at element index i of p, as f32. t is a constant
 * at every call site, so the switch folds away. */
SBKI_INLINE __m512 v16_load(const void *p, size_t i, enum sbk_dtype t)
{
	const uint16_t *h = (const uint16_t *)p + i;

	if (t == SBK_F32)
		return _mm512_loadu_ps((const float *)p + i);
	if (t == SBK_F16)
		return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
	return _mm512_castsi512_ps(_mm512_slli_epi32(
		_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h)),
		16));
}

/* The same for the lanes of k; the others are 0 and their memory is not
 * touched (masked loads suppress faults). */
SBKI_INLINE __m512 v16_load_mask(const void *p, size_t i, enum sbk_dtype t,
				 __mmask16 k)
{
	const uint16_t *h = (const uint16_t *)p + i;

	if (t == SBK_F32)
		return _mm512_maskz_loadu_ps(k, (const float *)p + i);
	if (t == SBK_F16)
		return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, h));
	return _mm512_castsi512_ps(_mm512_slli_epi32(
		_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, h)), 16));
}

/* 2^x: x = n + f with n an integer and |f| <= 1/2, 2^f by the Cephes exp2f
 * polynomial (relative error about 1e-7), and scalef applies 2^n with
 * correct overflow to infinity and underflow through the subnormals. NaN
 * stays NaN. */
SBKI_INLINE __m512 v16_exp2(__m512 x)
{
	__m512 n, f, p;

	x = _mm512_max_ps(_mm512_set1_ps(-151.0f), x);
	x = _mm512_min_ps(_mm512_set1_ps(129.0f), x);
	n = _mm512_roundscale_ps(x,
				 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	f = _mm512_sub_ps(x, n);
	p = _mm512_set1_ps(1.535336188319500e-4f);
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
	return _mm512_scalef_ps(p, n);
}

/* e^x: n = round(x / ln 2), r = x - n ln 2 in two parts (Cody-Waite) so r
 * is exact, e^r by the Cephes expf polynomial, then scalef by 2^n. */
SBKI_INLINE __m512 v16_exp(__m512 x)
{
	__m512 n, r, p;

	x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
	x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
	n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(SBKI_LOG2E)),
				 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
	p = _mm512_set1_ps(1.9875691500e-4f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
	p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
	p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
	return _mm512_scalef_ps(p, n);
}

#endif /* SBKERNELS_SIMD_AVX512_H */
