/* SPDX-License-Identifier: MIT */
/* Conversions, scalar reference: the helpers of internal.h in a loop. */
#include "internal.h"

void sbki_f32_to_f16_scalar(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = sbki_f32_to_f16_1(src[i]);
}

void sbki_f16_to_f32_scalar(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = sbki_f16_to_f32_1(src[i]);
}

void sbki_f32_to_bf16_scalar(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = sbki_f32_to_bf16_1(src[i]);
}

void sbki_bf16_to_f32_scalar(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = sbki_bf16_to_f32_1(src[i]);
}
