/* SPDX-License-Identifier: MIT */
/*
 * Element conversions between f32 and the 16-bit KV types, used to write K
 * and V into a cache. Rounding is to nearest even in every variant; the
 * scalar helpers in internal.h are the reference.
 */
#include "internal.h"

#include <errno.h>

SBK_API size_t sbk_dtype_size(enum sbk_dtype t)
{
	return sbki_dtype_size(t);
}

SBK_API void sbk_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
	sbki_ops()->f32_to_f16(dst, src, n);
}

SBK_API void sbk_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	sbki_ops()->f16_to_f32(dst, src, n);
}

SBK_API void sbk_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
	sbki_ops()->f32_to_bf16(dst, src, n);
}

SBK_API void sbk_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	sbki_ops()->bf16_to_f32(dst, src, n);
}

SBK_API int sbk_store(void *dst, enum sbk_dtype dtype, const float *src,
		      size_t n)
{
	switch (dtype) {
	case SBK_F32:
		memmove(dst, src, n * sizeof(float));
		return 0;
	case SBK_F16:
		sbk_f32_to_f16(dst, src, n);
		return 0;
	case SBK_BF16:
		sbk_f32_to_bf16(dst, src, n);
		return 0;
	}
	return -EINVAL;
}

SBK_API int sbk_load(float *dst, const void *src, enum sbk_dtype dtype,
		     size_t n)
{
	switch (dtype) {
	case SBK_F32:
		memmove(dst, src, n * sizeof(float));
		return 0;
	case SBK_F16:
		sbk_f16_to_f32(dst, src, n);
		return 0;
	case SBK_BF16:
		sbk_bf16_to_f32(dst, src, n);
		return 0;
	}
	return -EINVAL;
}
