/* SPDX-License-Identifier: MIT */
/*
 * Matrix products, AVX2 + FMA: as matmul_avx512.c with 8 columns per step
 * and tiles of 4 rows x 2 vectors (8 accumulators of the 16 registers).
 */
#include "simd_avx2.h"

SBKI_INLINE void tile(float *out, size_t ldo, const float *w, const float *x,
		      int cols, const int R, const int T)
{
	const int full = cols & ~7;
	const __m256i tail = v8_mask(cols & 7);
	__m256 a[4][2];
	int c;

#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			a[i][t] = _mm256_setzero_ps();
	for (c = 0; c < full; c += 8) {
		__m256 xv[2];

#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			xv[t] = _mm256_loadu_ps(x + (size_t)t * cols + c);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m256 wv = _mm256_loadu_ps(w + (size_t)i * cols + c);

#pragma GCC unroll 4
			for (int t = 0; t < T; t++)
				a[i][t] = _mm256_fmadd_ps(wv, xv[t], a[i][t]);
		}
	}
	if (c < cols) {
		__m256 xv[2];

#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			xv[t] = _mm256_maskload_ps(x + (size_t)t * cols + c,
						   tail);
#pragma GCC unroll 4
		for (int i = 0; i < R; i++) {
			__m256 wv = _mm256_maskload_ps(w + (size_t)i * cols + c,
						       tail);

#pragma GCC unroll 4
			for (int t = 0; t < T; t++)
				a[i][t] = _mm256_fmadd_ps(wv, xv[t], a[i][t]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < R; i++)
#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			out[t * ldo + i] = v8_sum(a[i][t]);
}

void sbki_matvec_avx2(float *out, const float *w, const float *x, int rows,
		      int cols)
{
	int r = 0;

	for (; r + 4 <= rows; r += 4)
		tile(out + r, 1, w + (size_t)r * cols, x, cols, 4, 1);
	for (; r < rows; r++)
		tile(out + r, 1, w + (size_t)r * cols, x, cols, 1, 1);
}

void sbki_matmul_avx2(float *out, size_t ldo, const float *w, const float *x,
		      int n, int rows, int cols)
{
	int r = 0, t;

	for (; r + 4 <= rows; r += 4) {
		const float *wr = w + (size_t)r * cols;

		for (t = 0; t + 2 <= n; t += 2)
			tile(out + t * ldo + r, ldo, wr, x + (size_t)t * cols,
			     cols, 4, 2);
		for (; t < n; t++)
			tile(out + t * ldo + r, ldo, wr, x + (size_t)t * cols,
			     cols, 4, 1);
	}
	for (; r < rows; r++) {
		const float *wr = w + (size_t)r * cols;

		for (t = 0; t + 2 <= n; t += 2)
			tile(out + t * ldo + r, ldo, wr, x + (size_t)t * cols,
			     cols, 1, 2);
		for (; t < n; t++)
			tile(out + t * ldo + r, ldo, wr, x + (size_t)t * cols,
			     cols, 1, 1);
	}
}
