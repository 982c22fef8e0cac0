/* SPDX-License-Identifier: MIT */
/*
 * The sbflash checkpoint: a llama-style decoder with ReLU FFNs, laid out
 * for LLM-in-a-flash offloading. All integers and floats little-endian.
 *
 *   0          header (struct sbf_header, padded to 4 KiB)
 *   res_off    resident section (4 KiB-aligned), f32, in this order:
 *                tok_emb (vocab, dim)          also the classifier
 *                per layer:
 *                  rms_att (dim)
 *                  wq (dim, dim)  wk (kv_dim, dim)  wv (kv_dim, dim)
 *                  wo (dim, dim)
 *                  rms_ffn (dim)
 *                  bias (hidden)               FFN up-projection bias
 *                  pred_a (rank, dim)          predictor, low rank:
 *                  pred_b (hidden, rank)       score = B (A x) + bias
 *                rms_final (dim)
 *   ffn_off    FFN section (4 KiB-aligned): for layer l and neuron i, one
 *              row-column bundle at ffn_off + (l * hidden + i) * bundle:
 *                up row i (dim f16) | down column i (dim f16) | zero pad
 *              bundle is a multiple of 4 KiB (O_DIRECT, page granularity)
 *
 * The predictor reads rmsnorm(h, rms_ffn) of the layer's *input* h (before
 * attention), so the fetch can start before attention runs; neuron i is
 * predicted active when B_i (A x) + bias_i > pred_margin.
 */
#ifndef SBFLASH_FORMAT_H
#define SBFLASH_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define SBF_MAGIC "SBFLASH1"
#define SBF_VERSION 1
#define SBF_ALIGN ((uint64_t)4096)

struct sbf_header {
	char magic[8];
	uint32_t version;
	uint32_t dim, n_layers, n_heads, n_kv_heads, hidden, vocab, rank;
	uint32_t bundle; /* bytes per neuron bundle, a multiple of 4 KiB */
	uint32_t dtype;	 /* enum sbk_dtype of the FFN weights (SBK_F16) */
	uint64_t seed;
	uint64_t res_off, res_bytes, ffn_off, ffn_bytes, file_bytes;
	float rope_theta;
	float pred_margin;
	/* Measured by sbgen on sampled layer inputs (see gen.c). */
	float sparsity;	   /* fraction of neurons whose ReLU output is 0 */
	float recall;	   /* of truly active neurons, fraction predicted */
	float precision;   /* of predicted neurons, fraction truly active */
	float predicted;   /* fraction of neurons predicted active */
	uint32_t samples;  /* inputs x neurons the figures come from */
	uint32_t reserved[31];
};

static inline uint64_t sbf_align(uint64_t n)
{
	return (n + SBF_ALIGN - 1) & ~(SBF_ALIGN - 1);
}

static inline uint64_t sbf_kv_dim(const struct sbf_header *h)
{
	return (uint64_t)h->dim / h->n_heads * h->n_kv_heads;
}

/* Floats of one layer in the resident section. */
static inline uint64_t sbf_layer_floats(const struct sbf_header *h)
{
	uint64_t d = h->dim, kv = sbf_kv_dim(h);

	return d + d * d + 2 * kv * d + d * d + d + h->hidden +
	       (uint64_t)h->rank * d + (uint64_t)h->hidden * h->rank;
}

static inline uint64_t sbf_res_floats(const struct sbf_header *h)
{
	return (uint64_t)h->vocab * h->dim + h->n_layers * sbf_layer_floats(h) +
	       h->dim;
}

/* Fill the derived fields (bundle, offsets, sizes) from the geometry. */
static inline void sbf_layout(struct sbf_header *h)
{
	h->bundle = (uint32_t)sbf_align((uint64_t)h->dim * 2 * 2);
	h->res_off = SBF_ALIGN;
	h->res_bytes = sbf_res_floats(h) * sizeof(float);
	h->ffn_off = sbf_align(h->res_off + h->res_bytes);
	h->ffn_bytes = (uint64_t)h->n_layers * h->hidden * h->bundle;
	h->file_bytes = h->ffn_off + h->ffn_bytes;
}

#endif /* SBFLASH_FORMAT_H */
