/* SPDX-License-Identifier: MIT */
/* Vector kernels, scalar reference (llama2.c's formulas). */
#include "internal.h"

void sbki_rmsnorm_scalar(float *out, const float *x, const float *w, int n,
			 float eps)
{
	float ss = 0;

	for (int j = 0; j < n; j++)
		ss += x[j] * x[j];
	ss /= n;
	ss += eps;
	ss = 1.0f / sqrtf(ss);
	for (int j = 0; j < n; j++)
		out[j] = w[j] * (ss * x[j]);
}

void sbki_rope_scalar(float *x, const float *c, const float *s, int n_heads,
		      int head_dim, int neox)
{
	int half = head_dim / 2;

	for (int h = 0; h < n_heads; h++) {
		float *v = x + (size_t)h * head_dim;

		for (int i = 0; i < half; i++) {
			if (neox) {
				float v0 = v[i], v1 = v[i + half];

				v[i] = v0 * c[i] - v1 * s[i];
				v[i + half] = v0 * s[i] + v1 * c[i];
			} else {
				float v0 = v[2 * i], v1 = v[2 * i + 1];

				/* s[2i] = -sin, s[2i + 1] = sin */
				v[2 * i] = v0 * c[2 * i] + v1 * s[2 * i];
				v[2 * i + 1] =
					v1 * c[2 * i + 1] + v0 * s[2 * i + 1];
			}
		}
	}
}

void sbki_swiglu_scalar(float *out, const float *a, const float *b, int n)
{
	for (int i = 0; i < n; i++) {
		float v = a[i];

		v *= 1.0f / (1.0f + expf(-v));
		out[i] = v * b[i];
	}
}

void sbki_softmax_scalar(float *x, int n)
{
	float max = x[0], sum = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > max)
			max = x[i];
	for (int i = 0; i < n; i++) {
		x[i] = expf(x[i] - max);
		sum += x[i];
	}
	for (int i = 0; i < n; i++)
		x[i] /= sum;
}

int sbki_argmax_scalar(const float *x, int n)
{
	int best = -1;

	for (int i = 0; i < n; i++)
		if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
			best = i;
	return best < 0 ? 0 : best;
}
