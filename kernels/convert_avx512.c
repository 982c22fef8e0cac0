/* SPDX-License-Identifier: MIT */
/*
 * Conversions, AVX-512: f16 through VCVTPS2PH/VCVTPH2PS (round to nearest
 * even), bf16 with integer arithmetic (the AVX512_BF16 instruction lives
 * in convert_avx512bf16.c behind its own CPUID check).
 */
#include "simd_avx512.h"

void sbki_f32_to_f16_avx512(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(dst + i),
				    _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
						    _MM_FROUND_TO_NEAREST_INT |
							    _MM_FROUND_NO_EXC));
	if (i < n) {
		__mmask16 k = v16_mask((int)(n - i));

		_mm256_mask_storeu_epi16(
			dst + i, k,
			_mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i),
					_MM_FROUND_TO_NEAREST_INT |
						_MM_FROUND_NO_EXC));
	}
}

void sbki_f16_to_f32_avx512(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, v16_load(src, i, SBK_F16));
	if (i < n) {
		__mmask16 k = v16_mask((int)(n - i));

		_mm512_mask_storeu_ps(dst + i, k,
				      v16_load_mask(src, i, SBK_F16, k));
	}
}

/* Round to nearest even on the bits: add 0x7fff plus the lowest kept bit,
 * keep the top half; NaNs keep their top bits and are made quiet. */
static inline __m256i bf16_round(__m512i x)
{
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16),
				       _mm512_set1_epi32(1));
	__m512i r = _mm512_add_epi32(
		x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
	__mmask16 nan = _mm512_cmpgt_epu32_mask(
		_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
		_mm512_set1_epi32(0x7f800000));

	r = _mm512_mask_or_epi32(r, nan, x, _mm512_set1_epi32(0x400000));
	return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

void sbki_f32_to_bf16_avx512(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(dst + i),
				    bf16_round(_mm512_loadu_si512(src + i)));
	if (i < n) {
		__mmask16 k = v16_mask((int)(n - i));

		_mm256_mask_storeu_epi16(
			dst + i, k,
			bf16_round(_mm512_maskz_loadu_epi32(k, src + i)));
	}
}

void sbki_bf16_to_f32_avx512(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dst + i, v16_load(src, i, SBK_BF16));
	if (i < n) {
		__mmask16 k = v16_mask((int)(n - i));

		_mm512_mask_storeu_ps(dst + i, k,
				      v16_load_mask(src, i, SBK_BF16, k));
	}
}
