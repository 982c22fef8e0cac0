/* SPDX-License-Identifier: MIT */
/*
 * Sparse ReLU FFN, scalar reference: one f32 sum per neuron in element
 * order, then the down column added element by element.
 */
#include "ffn_sparse.h"

void sbki_ffn_chunk_scalar(float *out, const float *x, const void *bundles,
			   size_t stride, enum sbk_dtype t, const float *bias,
			   const int32_t *idx, int n, int dim, float *act)
{
	if (out)
		memset(out, 0, (size_t)dim * sizeof(*out));
	for (int j = 0; j < n; j++) {
		const char *b = (const char *)bundles + (size_t)idx[j] * stride;
		const void *down = b + (size_t)dim * sbki_dtype_size(t);
		float s = 0.0f, h;

		for (int d = 0; d < dim; d++)
			s += sbki_load1(b, (size_t)d, t) * x[d];
		h = s + (bias ? bias[idx[j]] : 0.0f);
		h = h > 0.0f ? h : 0.0f;
		if (act)
			act[j] = h;
		if (h == 0.0f || !out)
			continue; /* adds nothing; skip the read */
		for (int d = 0; d < dim; d++)
			out[d] += h * sbki_load1(down, (size_t)d, t);
	}
}
