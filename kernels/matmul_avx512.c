/* SPDX-License-Identifier: MIT */
/*
 * Matrix products, AVX-512. Every output is one chain of FMAs over 16
 * columns at a time (a masked chain step for the last cols % 16), then a
 * horizontal sum: the same arithmetic in matvec and in every tile shape of
 * matmul. matmul works on tiles of 4 rows x 4 vectors (16 accumulators):
 * each W load serves 4 vectors and each x load 4 rows, and a 4-row stripe
 * of W stays in L1/L2 while all the vectors pass.
 */
#include "simd_avx512.h"

SBKI_INLINE void tile(float *out, size_t ldo, const float *w, const float *x,
		      int cols, const int R, const int T)
{
	const int full = cols & ~15;
	const __mmask16 tail = v16_mask(cols & 15);
	__m512 a[4][4];
	int c;

#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			a[i][t] = _mm512_setzero_ps();
	for (c = 0; c < full; c += 16) {
		__m512 xv[4];

#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			xv[t] = _mm512_loadu_ps(x + (size_t)t * cols + c);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m512 wv = _mm512_loadu_ps(w + (size_t)i * cols + c);

#pragma GCC unroll 4
			for (int t = 0; t < T; t++)
				a[i][t] = _mm512_fmadd_ps(wv, xv[t], a[i][t]);
		}
	}
	if (c < cols) {
		__m512 xv[4];

#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			xv[t] = _mm512_maskz_loadu_ps(tail,
						      x + (size_t)t * cols + c);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m512 wv = _mm512_maskz_loadu_ps(
				tail, w + (size_t)i * cols + c);

#pragma GCC unroll 4
			for (int t = 0; t < T; t++)
				a[i][t] = _mm512_fmadd_ps(wv, xv[t], a[i][t]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			out[t * ldo + i] = _mm512_reduce_add_ps(a[i][t]);
}

void sbki_matvec_avx512(float *out, const float *w, const float *x, int rows,
			int cols)
{
	int r = 0;

	for (; r + 4 <= rows; r += 4)
		tile(out + r, 1, w + (size_t)r * cols, x, cols, 4, 1);
	for (; r < rows; r++)
		tile(out + r, 1, w + (size_t)r * cols, x, cols, 1, 1);
}

void sbki_matmul_avx512(float *out, size_t ldo, const float *w, const float *x,
			int n, int rows, int cols)
{
	int r = 0, t;

	for (; r + 4 <= rows; r += 4) {
		const float *wr = w + (size_t)r * cols;

		for (t = 0; t + 4 <= n; t += 4)
			tile(out + t * ldo + r, ldo, wr, x + (size_t)t * cols,
			     cols, 4, 4);
		for (; t < n; t++)
			tile(out + t * ldo + r, ldo, wr, x + (size_t)t * cols,
			     cols, 4, 1);
	}
	for (; r < rows; r++) {
		const float *wr = w + (size_t)r * cols;

		for (t = 0; t + 4 <= n; t += 4)
			tile(out + t * ldo + r, ldo, wr, x + (size_t)t * cols,
			     cols, 1, 4);
		for (; t < n; t++)
			tile(out + t * ldo + r, ldo, wr, x + (size_t)t * cols,
			     cols, 1, 1);
	}
}
