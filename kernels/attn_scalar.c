/* SPDX-License-Identifier: MIT */
/*
 * Attention block, scalar reference: the online-softmax update of
 * internal.h written as plainly as possible, one query row at a time.
 * The SIMD variants are tested against this.
 */
#include "internal.h"

void sbki_attn_block_scalar(const struct sbki_attn_blk *b)
{
	const int hd = b->hd;

	for (int r = 0; r < b->nr; r++) {
		const float *q = b->q + (size_t)r * hd;
		float *s = b->s + (size_t)r * SBKI_ATTN_BLOCK;
		float *acc = b->acc + (size_t)r * hd;
		int lo = b->lo ? b->lo[r] : 0, hi = b->hi ? b->hi[r] : b->np;
		float m = b->m[r], alpha, sum = 0;

		if (lo >= hi)
			continue;
		for (int p = lo; p < hi; p++) {
			size_t row = (size_t)p * b->stride;
			float dot = 0;

			for (int d = 0; d < hd; d++)
				dot += q[d] *
				       sbki_load1(b->k, row + d, b->dtype);
			s[p] = dot * b->scale;
			if (s[p] > m)
				m = s[p];
		}
		/* The first block of a row has nothing to rescale. */
		alpha = b->m[r] == -INFINITY ? 0 : exp2f(b->m[r] - m);
		for (int p = lo; p < hi; p++) {
			s[p] = exp2f(s[p] - m);
			sum += s[p];
		}
		b->m[r] = m;
		b->l[r] = b->l[r] * alpha + sum;
		for (int d = 0; d < hd; d++)
			acc[d] *= alpha;
		for (int p = lo; p < hi; p++) {
			size_t row = (size_t)p * b->stride;

			for (int d = 0; d < hd; d++)
				acc[d] += s[p] *
					  sbki_load1(b->v, row + d, b->dtype);
		}
	}
}
