/* SPDX-License-Identifier: MIT */
/*
 * Conversions, AVX2 + F16C: f16 through VCVTPS2PH/VCVTPH2PS, bf16 with
 * integer arithmetic; tails through a small copy (no 16-bit masked
 * loads or stores in AVX2).
 */
#include "simd_avx2.h"

static inline __m128i f16_8(__m256 x)
{
	return _mm256_cvtps_ph(x,
			       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

void sbki_f32_to_f16_avx2(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i),
				 f16_8(_mm256_loadu_ps(src + i)));
	if (i < n) {
		uint16_t tmp[8];

		_mm_storeu_si128((__m128i *)tmp,
				 f16_8(_mm256_maskload_ps(
					 src + i, v8_mask((int)(n - i)))));
		memcpy(dst + i, tmp, (n - i) * sizeof(*tmp));
	}
}

void sbki_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, v8_load(src, i, SBK_F16));
	if (i < n)
		_mm256_maskstore_ps(dst + i, v8_mask((int)(n - i)),
				    v8_load_n(src, i, SBK_F16, (int)(n - i)));
}

/* As bf16_round in convert_avx512.c, 8 lanes. */
static inline __m128i bf16_8(__m256i x)
{
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16),
				       _mm256_set1_epi32(1));
	__m256i r = _mm256_add_epi32(
		x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
	/* |x| > inf as signed compare: both sides are non-negative */
	__m256i nan = _mm256_cmpgt_epi32(
		_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
		_mm256_set1_epi32(0x7f800000));

	r = _mm256_blendv_epi8(
		r, _mm256_or_si256(x, _mm256_set1_epi32(0x400000)), nan);
	r = _mm256_srli_epi32(r, 16);
	return _mm_packus_epi32(_mm256_castsi256_si128(r),
				_mm256_extracti128_si256(r, 1));
}

void sbki_f32_to_bf16_avx2(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128(
			(__m128i *)(dst + i),
			bf16_8(_mm256_loadu_si256((const __m256i *)(src + i))));
	if (i < n) {
		uint16_t tmp[8];

		_mm_storeu_si128((__m128i *)tmp,
				 bf16_8(_mm256_castps_si256(_mm256_maskload_ps(
					 src + i, v8_mask((int)(n - i))))));
		memcpy(dst + i, tmp, (n - i) * sizeof(*tmp));
	}
}

void sbki_bf16_to_f32_avx2(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, v8_load(src, i, SBK_BF16));
	if (i < n)
		_mm256_maskstore_ps(dst + i, v8_mask((int)(n - i)),
				    v8_load_n(src, i, SBK_BF16, (int)(n - i)));
}
