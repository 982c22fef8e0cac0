/* SPDX-License-Identifier: MIT */
/*
 * Vector kernels of a transformer block: RMSNorm, RoPE, SwiGLU, softmax,
 * argmax. They are small (a model dimension, a vocabulary) and run on the
 * calling thread. RoPE's angles are computed here, once per call and the
 * same for every variant, with llama2.c's float formulas.
 */
#include "internal.h"

SBK_API void sbk_rmsnorm(float *out, const float *x, const float *w, int rows,
			 int n, float eps)
{
	const struct sbki_ops *ops = sbki_ops();

	if (n <= 0)
		return;
	for (int r = 0; r < rows; r++)
		ops->rmsnorm(out + (size_t)r * n, x + (size_t)r * n, w, n, eps);
}

/* cos and sin of pos * theta^(-2i / head_dim) for i < head_dim / 2. */
static void angles(float *c, float *s, int head_dim, int pos, float theta)
{
	for (int i = 0; i < head_dim / 2; i++) {
		float freq = 1.0f / powf(theta, (float)(2 * i) / head_dim);
		float val = pos * freq;

		c[i] = cosf(val);
		s[i] = sinf(val);
	}
}

SBK_API void sbk_rope(float *x, int n_heads, int head_dim, int pos, float theta)
{
	float c[SBK_MAX_HEAD_DIM], s[SBK_MAX_HEAD_DIM];
	int half = head_dim / 2;

	if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > SBK_MAX_HEAD_DIM)
		return;
	angles(c, s, head_dim, pos, theta);
	/* Spread in place from the top: c[2i], c[2i+1] = c[i]; the sines
	 * of even lanes negated so x' = x * c + swap_pairs(x) * s. */
	for (int i = half - 1; i >= 0; i--) {
		c[2 * i + 1] = c[2 * i] = c[i];
		s[2 * i + 1] = s[i];
		s[2 * i] = -s[i];
	}
	sbki_ops()->rope(x, c, s, n_heads, head_dim, 0);
}

SBK_API void sbk_rope_neox(float *x, int n_heads, int head_dim, int pos,
			   float theta)
{
	float c[SBK_MAX_HEAD_DIM / 2], s[SBK_MAX_HEAD_DIM / 2];

	if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 ||
	    head_dim > SBK_MAX_HEAD_DIM)
		return;
	angles(c, s, head_dim, pos, theta);
	sbki_ops()->rope(x, c, s, n_heads, head_dim, 1);
}

SBK_API void sbk_swiglu(float *out, const float *a, const float *b, int n)
{
	if (n > 0)
		sbki_ops()->swiglu(out, a, b, n);
}

SBK_API void sbk_softmax(float *x, int n)
{
	if (n > 0)
		sbki_ops()->softmax(x, n);
}

SBK_API int sbk_argmax(const float *x, int n)
{
	return n > 0 ? sbki_ops()->argmax(x, n) : -1;
}
