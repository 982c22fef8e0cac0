/* SPDX-License-Identifier: MIT */
/* Vector kernels, AVX2 + FMA: 8 lanes, masked tails. */
#include "simd_avx2.h"

void sbki_rmsnorm_avx2(float *out, const float *x, const float *w, int n,
		       float eps)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, sv;
	int i = 0;
	float ss;

	for (; i + 16 <= n; i += 16) {
		__m256 x0 = _mm256_loadu_ps(x + i),
		       x1 = _mm256_loadu_ps(x + i + 8);

		a0 = _mm256_fmadd_ps(x0, x0, a0);
		a1 = _mm256_fmadd_ps(x1, x1, a1);
	}
	for (; i < n; i += 8) {
		__m256 x0 = _mm256_maskload_ps(x + i, v8_mask(n - i));

		a0 = _mm256_fmadd_ps(x0, x0, a0);
	}
	ss = v8_sum(_mm256_add_ps(a0, a1));
	ss /= n;
	ss += eps;
	ss = 1.0f / sqrtf(ss);
	sv = _mm256_set1_ps(ss);
	for (i = 0; i < n; i += 8) {
		__m256i k = v8_mask(n - i);

		_mm256_maskstore_ps(
			out + i, k,
			_mm256_mul_ps(_mm256_maskload_ps(w + i, k),
				      _mm256_mul_ps(sv, _mm256_maskload_ps(
								x + i, k))));
	}
}

void sbki_rope_avx2(float *x, const float *c, const float *s, int n_heads,
		    int head_dim, int neox)
{
	int half = head_dim / 2;

	for (int h = 0; h < n_heads; h++) {
		float *v = x + (size_t)h * head_dim;

		if (neox) {
			for (int i = 0; i < half; i += 8) {
				__m256i k = v8_mask(half - i);
				__m256 cv = _mm256_maskload_ps(c + i, k);
				__m256 sv = _mm256_maskload_ps(s + i, k);
				__m256 v0 = _mm256_maskload_ps(v + i, k);
				__m256 v1 = _mm256_maskload_ps(v + i + half, k);

				_mm256_maskstore_ps(
					v + i, k,
					_mm256_fmsub_ps(v0, cv,
							_mm256_mul_ps(v1, sv)));
				_mm256_maskstore_ps(
					v + i + half, k,
					_mm256_fmadd_ps(v0, sv,
							_mm256_mul_ps(v1, cv)));
			}
			continue;
		}
		for (int i = 0; i < head_dim; i += 8) {
			__m256i k = v8_mask(head_dim - i);
			__m256 xv = _mm256_maskload_ps(v + i, k);
			__m256 sw = _mm256_permute_ps(xv, 0xb1);

			_mm256_maskstore_ps(
				v + i, k,
				_mm256_fmadd_ps(
					xv, _mm256_maskload_ps(c + i, k),
					_mm256_mul_ps(sw, _mm256_maskload_ps(
								  s + i, k))));
		}
	}
}

void sbki_swiglu_avx2(float *out, const float *a, const float *b, int n)
{
	const __m256 one = _mm256_set1_ps(1.0f);

	for (int i = 0; i < n; i += 8) {
		__m256i k = v8_mask(n - i);
		__m256 v = _mm256_maskload_ps(a + i, k);
		__m256 e = v8_exp(_mm256_sub_ps(_mm256_setzero_ps(), v));

		v = _mm256_mul_ps(v, _mm256_div_ps(one, _mm256_add_ps(one, e)));
		_mm256_maskstore_ps(
			out + i, k,
			_mm256_mul_ps(v, _mm256_maskload_ps(b + i, k)));
	}
}

void sbki_softmax_avx2(float *x, int n)
{
	__m256 ninf = _mm256_set1_ps(-INFINITY), mv = ninf,
	       sum = _mm256_setzero_ps(), sv;

	for (int i = 0; i < n; i += 8) {
		__m256i k = v8_mask(n - i);

		mv = _mm256_max_ps(
			mv, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, k),
					     _mm256_castsi256_ps(k)));
	}
	mv = _mm256_set1_ps(v8_max(mv));
	for (int i = 0; i < n; i += 8) {
		__m256i k = v8_mask(n - i);
		__m256 e = _mm256_and_ps(
			_mm256_castsi256_ps(k),
			v8_exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, k),
					     mv)));

		_mm256_maskstore_ps(x + i, k, e);
		sum = _mm256_add_ps(sum, e);
	}
	sv = _mm256_set1_ps(v8_sum(sum));
	for (int i = 0; i < n; i += 8) {
		__m256i k = v8_mask(n - i);

		_mm256_maskstore_ps(
			x + i, k,
			_mm256_div_ps(_mm256_maskload_ps(x + i, k), sv));
	}
}

int sbki_argmax_avx2(const float *x, int n)
{
	__m256 ninf = _mm256_set1_ps(-INFINITY), mv = ninf, m;
	int i;

	/* max(x, mv) returns mv where x is NaN: NaNs are skipped. */
	for (i = 0; i < n; i += 8) {
		__m256i k = v8_mask(n - i);
		__m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, k),
					    _mm256_castsi256_ps(k));

		mv = _mm256_max_ps(v, mv);
	}
	m = _mm256_set1_ps(v8_max(mv));
	for (i = 0; i < n; i += 8) {
		__m256i k = v8_mask(n - i);
		__m256 eq = _mm256_and_ps(
			_mm256_castsi256_ps(k),
			_mm256_cmp_ps(_mm256_maskload_ps(x + i, k), m,
				      _CMP_EQ_OQ));
		int bits = _mm256_movemask_ps(eq);

		if (bits)
			return i + __builtin_ctz(bits);
	}
	return 0; /* all NaN */
}
