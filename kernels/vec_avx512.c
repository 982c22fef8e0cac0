/* SPDX-License-Identifier: MIT */
/* Vector kernels, AVX-512: 16 lanes, masked tails. */
#include "simd_avx512.h"

void sbki_rmsnorm_avx512(float *out, const float *x, const float *w, int n,
			 float eps)
{
	__m512 a0 = _mm512_setzero_ps(), a1 = a0, sv;
	int i = 0;
	float ss;

	/* Two chains: the sum is latency-bound otherwise. */
	for (; i + 32 <= n; i += 32) {
		__m512 x0 = _mm512_loadu_ps(x + i),
		       x1 = _mm512_loadu_ps(x + i + 16);

		a0 = _mm512_fmadd_ps(x0, x0, a0);
		a1 = _mm512_fmadd_ps(x1, x1, a1);
	}
	for (; i < n; i += 16) {
		__m512 x0 = _mm512_maskz_loadu_ps(
			v16_mask(n - i < 16 ? n - i : 16), x + i);

		a0 = _mm512_fmadd_ps(x0, x0, a0);
	}
	ss = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
	ss /= n;
	ss += eps;
	ss = 1.0f / sqrtf(ss);
	sv = _mm512_set1_ps(ss);
	for (i = 0; i < n; i += 16) {
		__mmask16 k = v16_mask(n - i < 16 ? n - i : 16);

		_mm512_mask_storeu_ps(
			out + i, k,
			_mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + i),
				      _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(
								k, x + i))));
	}
}

void sbki_rope_avx512(float *x, const float *c, const float *s, int n_heads,
		      int head_dim, int neox)
{
	int half = head_dim / 2;

	for (int h = 0; h < n_heads; h++) {
		float *v = x + (size_t)h * head_dim;

		if (neox) {
			for (int i = 0; i < half; i += 16) {
				__mmask16 k =
					v16_mask(half - i < 16 ? half - i : 16);
				__m512 cv = _mm512_maskz_loadu_ps(k, c + i);
				__m512 sv = _mm512_maskz_loadu_ps(k, s + i);
				__m512 v0 = _mm512_maskz_loadu_ps(k, v + i);
				__m512 v1 =
					_mm512_maskz_loadu_ps(k, v + i + half);

				_mm512_mask_storeu_ps(
					v + i, k,
					_mm512_fmsub_ps(v0, cv,
							_mm512_mul_ps(v1, sv)));
				_mm512_mask_storeu_ps(
					v + i + half, k,
					_mm512_fmadd_ps(v0, sv,
							_mm512_mul_ps(v1, cv)));
			}
			continue;
		}
		for (int i = 0; i < head_dim; i += 16) {
			__mmask16 k =
				v16_mask(head_dim - i < 16 ? head_dim - i : 16);
			__m512 xv = _mm512_maskz_loadu_ps(k, v + i);
			/* (x1, x0, x3, x2, ...): each pair swapped */
			__m512 sw = _mm512_permute_ps(xv, 0xb1);

			_mm512_mask_storeu_ps(
				v + i, k,
				_mm512_fmadd_ps(
					xv, _mm512_maskz_loadu_ps(k, c + i),
					_mm512_mul_ps(sw, _mm512_maskz_loadu_ps(
								  k, s + i))));
		}
	}
}

void sbki_swiglu_avx512(float *out, const float *a, const float *b, int n)
{
	const __m512 one = _mm512_set1_ps(1.0f);

	for (int i = 0; i < n; i += 16) {
		__mmask16 k = v16_mask(n - i < 16 ? n - i : 16);
		__m512 v = _mm512_maskz_loadu_ps(k, a + i);
		__m512 e = v16_exp(_mm512_sub_ps(_mm512_setzero_ps(), v));

		v = _mm512_mul_ps(v, _mm512_div_ps(one, _mm512_add_ps(one, e)));
		_mm512_mask_storeu_ps(
			out + i, k,
			_mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, b + i)));
	}
}

void sbki_softmax_avx512(float *x, int n)
{
	__m512 mv = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps(), sv;

	for (int i = 0; i < n; i += 16) {
		__mmask16 k = v16_mask(n - i < 16 ? n - i : 16);

		mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(mv, k, x + i));
	}
	mv = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
	for (int i = 0; i < n; i += 16) {
		__mmask16 k = v16_mask(n - i < 16 ? n - i : 16);
		__m512 e = _mm512_maskz_mov_ps(
			k, v16_exp(_mm512_sub_ps(
				   _mm512_maskz_loadu_ps(k, x + i), mv)));

		_mm512_mask_storeu_ps(x + i, k, e);
		sum = _mm512_add_ps(sum, e);
	}
	sv = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
	for (int i = 0; i < n; i += 16) {
		__mmask16 k = v16_mask(n - i < 16 ? n - i : 16);

		_mm512_mask_storeu_ps(
			x + i, k,
			_mm512_div_ps(_mm512_maskz_loadu_ps(k, x + i), sv));
	}
}

int sbki_argmax_avx512(const float *x, int n)
{
	__m512 mv = _mm512_set1_ps(-INFINITY), m;
	int i;

	/* max(x, mv) returns mv where x is NaN: NaNs are skipped. */
	for (i = 0; i < n; i += 16) {
		__mmask16 k = v16_mask(n - i < 16 ? n - i : 16);

		mv = _mm512_max_ps(_mm512_mask_loadu_ps(mv, k, x + i), mv);
	}
	m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
	for (i = 0; i < n; i += 16) {
		__mmask16 k = v16_mask(n - i < 16 ? n - i : 16);
		__mmask16 eq = _mm512_mask_cmp_ps_mask(
			k, _mm512_maskz_loadu_ps(k, x + i), m, _CMP_EQ_OQ);

		if (eq)
			return i + __builtin_ctz(eq);
	}
	return 0; /* all NaN */
}
