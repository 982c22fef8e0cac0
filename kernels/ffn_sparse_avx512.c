/* SPDX-License-Identifier: MIT */
/*
 * Sparse ReLU FFN, AVX-512: 16 elements per step, two accumulators for
 * the dot product, masked tails (no read past the bundle's end).
 */
#include "ffn_sparse.h"
#include "simd_avx512.h"

SBKI_INLINE float dot(const void *up, const float *x, enum sbk_dtype t,
		      int dim)
{
	__m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
	int d = 0;

	for (; d + 32 <= dim; d += 32) {
		a0 = _mm512_fmadd_ps(v16_load(up, (size_t)d, t),
				     _mm512_loadu_ps(x + d), a0);
		a1 = _mm512_fmadd_ps(v16_load(up, (size_t)d + 16, t),
				     _mm512_loadu_ps(x + d + 16), a1);
	}
	for (; d < dim; d += 16) {
		__mmask16 k = v16_mask(dim - d < 16 ? dim - d : 16);

		a0 = _mm512_fmadd_ps(v16_load_mask(up, (size_t)d, t, k),
				     _mm512_maskz_loadu_ps(k, x + d), a0);
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

SBKI_INLINE void axpy(float *out, float h, const void *down, enum sbk_dtype t,
		      int dim)
{
	const __m512 hv = _mm512_set1_ps(h);
	int d = 0;

	for (; d + 16 <= dim; d += 16)
		_mm512_storeu_ps(out + d,
				 _mm512_fmadd_ps(hv, v16_load(down, (size_t)d, t),
						 _mm512_loadu_ps(out + d)));
	if (d < dim) {
		__mmask16 k = v16_mask(dim - d);
		__m512 o = _mm512_maskz_loadu_ps(k, out + d);

		o = _mm512_fmadd_ps(hv, v16_load_mask(down, (size_t)d, t, k), o);
		_mm512_mask_storeu_ps(out + d, k, o);
	}
}

SBKI_INLINE void chunk(float *out, const float *x, const void *bundles,
		       size_t stride, enum sbk_dtype t, const float *bias,
		       const int32_t *idx, int n, int dim, float *act)
{
	if (out)
		memset(out, 0, (size_t)dim * sizeof(*out));
	for (int j = 0; j < n; j++) {
		const char *b = (const char *)bundles + (size_t)idx[j] * stride;
		float h = dot(b, x, t, dim) + (bias ? bias[idx[j]] : 0.0f);

		h = h > 0.0f ? h : 0.0f;
		if (act)
			act[j] = h;
		if (h != 0.0f && out)
			axpy(out, h, b + (size_t)dim * sbki_dtype_size(t), t,
			     dim);
	}
}

void sbki_ffn_chunk_avx512(float *out, const float *x, const void *bundles,
			   size_t stride, enum sbk_dtype t, const float *bias,
			   const int32_t *idx, int n, int dim, float *act)
{
	if (t == SBK_F16)
		chunk(out, x, bundles, stride, SBK_F16, bias, idx, n, dim, act);
	else if (t == SBK_BF16)
		chunk(out, x, bundles, stride, SBK_BF16, bias, idx, n, dim,
		      act);
	else
		chunk(out, x, bundles, stride, SBK_F32, bias, idx, n, dim, act);
}
