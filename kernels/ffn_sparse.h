/* SPDX-License-Identifier: MIT */
/*
 * Private declarations of the sparse FFN kernel (ffn_sparse*.c). Kept out
 * of internal.h so that the shared ops table is untouched: the driver picks
 * its variant from sbk_get_isa() itself.
 */
#ifndef SBKERNELS_FFN_SPARSE_H
#define SBKERNELS_FFN_SPARSE_H

#include "internal.h"

/* Neurons per work item. Each item's partial output is computed from zero
 * and the partials are added in item order, so a result depends only on
 * the index list, never on the thread count. */
#define SBKI_FFN_CHUNK 64

/*
 * One chunk: out (dim, overwritten) = sum over j < n, in order, of
 * relu(dot(up(idx[j]), x) + bias[idx[j]]) * down(idx[j]), where the bundle
 * of neuron i starts at (const char *)bundles + i * stride with the up row
 * (dim elements of t) followed by the down column (dim elements of t).
 * bias may be NULL (0). act, when not NULL, receives the n activations.
 * out NULL: the activations only (act not NULL), no down column read; the
 * dot products are the same code, so the same bits.
 */
#define SBKI_DECLARE_FFN(isa)                                                  \
	void sbki_ffn_chunk_##isa(float *out, const float *x,                  \
				  const void *bundles, size_t stride,          \
				  enum sbk_dtype t, const float *bias,         \
				  const int32_t *idx, int n, int dim,          \
				  float *act);

SBKI_DECLARE_FFN(scalar)
SBKI_DECLARE_FFN(avx2)
SBKI_DECLARE_FFN(avx512)

#endif /* SBKERNELS_FFN_SPARSE_H */
