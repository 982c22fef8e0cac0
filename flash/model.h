/* SPDX-License-Identifier: MIT */
/*
 * The sbflash model: a view of a checkpoint (format.h) and one decode step
 * with the FFN left to the caller's storage. The same code runs every mode
 * (resident, flash, mmap_dense, mmap_sparse): only where the FFN bundles
 * live and what happens before attention and before the FFN differ, so two
 * modes that pick the same neurons produce bit-identical logits.
 */
#ifndef SBFLASH_MODEL_H
#define SBFLASH_MODEL_H

#include <stdint.h>

#include "format.h"

struct sbf_layer {
	const float *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *bias, *pa, *pb;
};

struct sbf_model {
	struct sbf_header h;
	const float *emb, *rms_final;
	struct sbf_layer *layer; /* (n_layers) */
};

/* Read and check the header of an open checkpoint. 0 or -errno (-EBADMSG:
 * not an sbflash checkpoint or inconsistent sizes). */
int sbf_header_read(int fd, struct sbf_header *h);

/* Point m at the weights of the resident section res (res_bytes long). */
int sbf_model_bind(struct sbf_model *m, const struct sbf_header *h,
		   const float *res);
void sbf_model_free(struct sbf_model *m);

struct sbf_hooks {
	/* Called per layer with the neurons the FFN will use, before
	 * attention: the time to start fetching them. */
	int (*fetch)(void *ctx, int layer, const int32_t *idx, int n);
	/* Called before the FFN reads the layer's bundles. */
	int (*ready)(void *ctx, int layer);
	void *ctx;
};

struct sbf_run {
	const struct sbf_model *m;
	const char *ffn;	/* the FFN section: bundles of every layer */
	int dense;		/* use every neuron, not the predicted ones */
	int measure;		/* also compute every neuron (recall) */
	struct sbf_hooks hooks;
	int max_pos;
	/* Scratch and state. */
	float *h, *xb, *q, *att, *o, *pt, *score, *logits, *act, *kc, *vc;
	float *all_act;		/* (hidden), measure only */
	int32_t *active, *all_idx;
	/* Counts over the run. */
	uint64_t n_computed;	/* neurons computed */
	uint64_t n_nonzero;	/* of those, with a nonzero activation */
	uint64_t n_true;	/* measure: truly active neurons */
	uint64_t n_true_pred;	/* measure: truly active and predicted */
};

/* Allocate the state for up to max_pos positions. */
int sbf_run_init(struct sbf_run *r, const struct sbf_model *m,
		 const void *ffn, int max_pos);
void sbf_run_free(struct sbf_run *r);

/* Decode one token at position pos; logits in r->logits (vocab). */
int sbf_step(struct sbf_run *r, int token, int pos);

#endif /* SBFLASH_MODEL_H */
