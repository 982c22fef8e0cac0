/* SPDX-License-Identifier: MIT */
/*
 * Sparse ReLU FFN, AVX2 + FMA + F16C: 8 elements per step, two
 * accumulators for the dot product (FMA latency), a masked tail.
 */
#include "ffn_sparse.h"
#include "simd_avx2.h"

SBKI_INLINE float dot(const void *up, const float *x, enum sbk_dtype t,
		      int dim)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
	int d = 0;

	for (; d + 16 <= dim; d += 16) {
		a0 = _mm256_fmadd_ps(v8_load(up, (size_t)d, t),
				     _mm256_loadu_ps(x + d), a0);
		a1 = _mm256_fmadd_ps(v8_load(up, (size_t)d + 8, t),
				     _mm256_loadu_ps(x + d + 8), a1);
	}
	for (; d < dim; d += 8) {
		int m = dim - d < 8 ? dim - d : 8;

		a0 = _mm256_fmadd_ps(v8_load_n(up, (size_t)d, t, m),
				     _mm256_maskload_ps(x + d, v8_mask(m)), a0);
	}
	return v8_sum(_mm256_add_ps(a0, a1));
}

SBKI_INLINE void axpy(float *out, float h, const void *down, enum sbk_dtype t,
		      int dim)
{
	const __m256 hv = _mm256_set1_ps(h);
	int d = 0;

	for (; d + 8 <= dim; d += 8)
		_mm256_storeu_ps(out + d,
				 _mm256_fmadd_ps(hv, v8_load(down, (size_t)d, t),
						 _mm256_loadu_ps(out + d)));
	if (d < dim) {
		__m256i k = v8_mask(dim - d);
		__m256 o = _mm256_maskload_ps(out + d, k);

		o = _mm256_fmadd_ps(hv, v8_load_n(down, (size_t)d, t, dim - d),
				    o);
		_mm256_maskstore_ps(out + d, k, o);
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

/* One copy per element type, so the loads fold to one instruction. */
void sbki_ffn_chunk_avx2(float *out, const float *x, const void *bundles,
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
