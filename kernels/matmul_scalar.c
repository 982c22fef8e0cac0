/* SPDX-License-Identifier: MIT */
/* Matrix products, scalar reference (llama2.c's matmul). */
#include "internal.h"

void sbki_matvec_scalar(float *out, const float *w, const float *x, int rows,
			int cols)
{
	for (int r = 0; r < rows; r++) {
		const float *wr = w + (size_t)r * cols;
		float v = 0;

		for (int c = 0; c < cols; c++)
			v += wr[c] * x[c];
		out[r] = v;
	}
}

void sbki_matmul_scalar(float *out, size_t ldo, const float *w, const float *x,
			int n, int rows, int cols)
{
	for (int t = 0; t < n; t++)
		sbki_matvec_scalar(out + t * ldo, w, x + (size_t)t * cols, rows,
				   cols);
}
