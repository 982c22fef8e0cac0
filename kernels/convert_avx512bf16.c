/* SPDX-License-Identifier: MIT */
/*
 * f32 -> bf16 with VCVTNEPS2BF16 (AVX512_BF16), chosen only when CPUID
 * reports it (SBK_ISA_AVX512_BF16). The instruction rounds to nearest
 * even and quiets NaNs like the reference but treats subnormal inputs as
 * zero; a vector holding any goes through the integer path instead.
 */
#include "simd_avx512.h"

/* The integer path of convert_avx512.c. */
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

static inline __m256i cvt(__m512 x)
{
	__m512i b = _mm512_castps_si512(x);
	/* exponent 0 and mantissa not 0 */
	__mmask16 sub = _mm512_mask_test_epi32_mask(
		_mm512_testn_epi32_mask(b, _mm512_set1_epi32(0x7f800000)), b,
		_mm512_set1_epi32(0x007fffff));

	if (__builtin_expect(sub != 0, 0))
		return bf16_round(b);
	return (__m256i)_mm512_cvtneps_pbh(x);
}

void sbki_f32_to_bf16_avx512bf16(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(dst + i),
				    cvt(_mm512_loadu_ps(src + i)));
	if (i < n) {
		__mmask16 k = v16_mask((int)(n - i));

		_mm256_mask_storeu_epi16(
			dst + i, k, cvt(_mm512_maskz_loadu_ps(k, src + i)));
	}
}
