/* SPDX-License-Identifier: MIT */
/*
 * Sparse ReLU FFN over row-column bundles (the LLM-in-a-flash layout): the
 * driver. Neurons are cut into fixed chunks of SBKI_FFN_CHUNK; each chunk's
 * partial output is computed from zero (on any thread) and the partials
 * are then added in chunk order by the caller, so the result depends on
 * the index list only, not on the thread count or which thread ran what.
 */
#include "ffn_sparse.h"

#include <errno.h>

/* Multiply-adds below which the kernel stays on the calling thread. */
#define SERIAL_MACS ((size_t)1 << 18)

typedef void (*ffn_chunk_fn)(float *out, const float *x, const void *bundles,
			     size_t stride, enum sbk_dtype t,
			     const float *bias, const int32_t *idx, int n,
			     int dim, float *act);

struct ffn_job {
	ffn_chunk_fn fn;
	float *part; /* (chunks, dim) */
	const float *x;
	const void *bundles;
	size_t stride;
	enum sbk_dtype t;
	const float *bias;
	const int32_t *idx;
	int n, dim;
	float *act;
};

static ffn_chunk_fn pick(void)
{
	switch (sbk_get_isa()) {
	case SBK_ISA_AVX512:
	case SBK_ISA_AVX512_BF16:
		return sbki_ffn_chunk_avx512;
	case SBK_ISA_AVX2:
		return sbki_ffn_chunk_avx2;
	default:
		return sbki_ffn_chunk_scalar;
	}
}

static void item(void *ctx, int c)
{
	const struct ffn_job *j = ctx;
	int j0 = c * SBKI_FFN_CHUNK;
	int n = j->n - j0 < SBKI_FFN_CHUNK ? j->n - j0 : SBKI_FFN_CHUNK;

	j->fn(j->part + (size_t)c * j->dim, j->x, j->bundles, j->stride, j->t,
	      j->bias, j->idx + j0, n, j->dim, j->act ? j->act + j0 : NULL);
}

SBK_API int sbk_ffn_sparse(float *out, const float *x, const void *bundles,
			   size_t stride, enum sbk_dtype dtype,
			   const float *bias, const int32_t *idx, int n,
			   int dim, float *act)
{
	struct ffn_job j = {pick(), NULL, x, bundles, stride, dtype, bias,
			    idx, n, dim, act};
	size_t esz = sbki_dtype_size(dtype);
	int chunks, c;

	if (!out || !x || dim <= 0 || n < 0 || !esz || (n && (!bundles || !idx)))
		return -EINVAL;
	if (n && (stride < 2 * (size_t)dim * esz || stride % esz))
		return -EINVAL;
	if (!n) {
		memset(out, 0, (size_t)dim * sizeof(*out));
		return 0;
	}
	chunks = (n + SBKI_FFN_CHUNK - 1) / SBKI_FFN_CHUNK;
	if (chunks == 1) {
		/* The one partial is the result: no scratch, no copy. */
		j.fn(out, x, bundles, stride, dtype, bias, idx, n, dim, act);
		return 0;
	}
	j.part = sbki_scratch(SBKI_SCRATCH_CALL,
			      (size_t)chunks * dim * sizeof(float));
	if (!j.part)
		return -ENOMEM;
	if ((size_t)n * dim * 2 < SERIAL_MACS || sbk_get_threads() == 1)
		for (c = 0; c < chunks; c++)
			item(&j, c);
	else
		sbki_parallel(chunks, item, &j);
	memcpy(out, j.part, (size_t)dim * sizeof(*out));
	for (c = 1; c < chunks; c++) {
		const float *p = j.part + (size_t)c * dim;

		for (int d = 0; d < dim; d++)
			out[d] += p[d];
	}
	return 0;
}

static void act_item(void *ctx, int c)
{
	const struct ffn_job *j = ctx;
	int j0 = c * SBKI_FFN_CHUNK;
	int n = j->n - j0 < SBKI_FFN_CHUNK ? j->n - j0 : SBKI_FFN_CHUNK;

	j->fn(NULL, j->x, j->bundles, j->stride, j->t, j->bias, j->idx + j0, n,
	      j->dim, j->act + j0);
}

SBK_API int sbk_ffn_sparse_act(float *act, const float *x, const void *bundles,
			       size_t stride, enum sbk_dtype dtype,
			       const float *bias, const int32_t *idx, int n,
			       int dim)
{
	struct ffn_job j = {pick(), NULL, x, bundles, stride, dtype, bias,
			    idx, n, dim, act};
	size_t esz = sbki_dtype_size(dtype);
	int chunks;

	if (!act || !x || dim <= 0 || n < 0 || !esz ||
	    (n && (!bundles || !idx)))
		return -EINVAL;
	if (n && (stride < 2 * (size_t)dim * esz || stride % esz))
		return -EINVAL;
	chunks = (n + SBKI_FFN_CHUNK - 1) / SBKI_FFN_CHUNK;
	if ((size_t)n * dim < SERIAL_MACS || sbk_get_threads() == 1)
		for (int c = 0; c < chunks; c++)
			act_item(&j, c);
	else
		sbki_parallel(chunks, act_item, &j);
	return 0;
}
