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

/*
 * The checkpoint loaders, safe on any input (tests/test_cli.c crafts bad
 * headers; a fuzzer may call sbf_header_check() on its data).
 *
 * sbf_geometry_check: the dimensions alone (positive, dividing, head size
 * even and <= 1024, rank <= dim, within the bounds below). 0 or -EBADMSG.
 *
 * sbf_header_check: h as read from a file of file_bytes bytes. Every field
 * is checked: the magic and version, the geometry (positive, dividing,
 * head size even and <= 1024, rank <= dim, and within the bounds below,
 * which keep every size the format derives far from 64-bit overflow), the
 * derived offsets and sizes equal to what sbf_layout() computes, the whole
 * layout within file_bytes, the floats finite (rope_theta > 0, the
 * measured fractions in [0, 1]). Returns 0 or -EBADMSG with *why (when why
 * is not NULL) saying which check failed.
 *
 * sbf_header_read: the header of an open checkpoint, checked against the
 * file's size. 0 or -errno (-EBADMSG as above, pread(2)/fstat(2) errors).
 *
 * sbf_open: open the checkpoint at path and read its header. Returns the
 * descriptor (O_CLOEXEC) or -errno: -ENODEV when path is not a regular
 * file (a FIFO is refused without blocking), -EISDIR, -EBADMSG (*why set),
 * the open(2) error.
 */
#define SBF_MAX_DIM (1u << 16)
#define SBF_MAX_HIDDEN (1u << 24)
#define SBF_MAX_VOCAB (1u << 24)
#define SBF_MAX_LAYERS (1u << 16)
int sbf_geometry_check(const struct sbf_header *h, const char **why);
int sbf_header_check(const struct sbf_header *h, uint64_t file_bytes,
		     const char **why);
int sbf_header_read(int fd, struct sbf_header *h);
int sbf_open(const char *path, struct sbf_header *h, const char **why);

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
	/* When set, called after ready with the activations of the
	 * predicted neurons, computed from their up rows alone
	 * (sbk_ffn_sparse_act): the FFN then reads the down column of each
	 * neuron with act[j] > 0 and of no other, and this is the time to
	 * fetch those. */
	int (*fired)(void *ctx, int layer, const int32_t *idx,
		     const float *act, int n);
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
