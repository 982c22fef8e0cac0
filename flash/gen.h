/* SPDX-License-Identifier: MIT */
/* sbgen's generator as a function, so that tests can make small models. */
#ifndef SBFLASH_GEN_H
#define SBFLASH_GEN_H

#include <stdint.h>

#include "format.h"

struct sbf_gen_opts {
	uint64_t seed;
	uint32_t dim, n_layers, hidden, n_heads, n_kv_heads, vocab, rank;
	float active;	/* target fraction of neurons active per token */
	float margin;	/* predictor threshold, in units of the score sd */
	float noise;	/* off-subspace noise, relative to the signal */
	int threads;	/* 0: one per CPU */
	int progress;	/* on stderr: 1 a bar (a terminal), -1 a line per
			 * tenth of the layers, 0 none */
};

/* Defaults for a model of about model_bytes bytes (dim 4096 from 1 GiB up,
 * else 1024; hidden 6 * dim; layers to fill the size). */
void sbf_gen_defaults(struct sbf_gen_opts *o, uint64_t model_bytes);

/* Whether o makes a checkpoint sbf_header_check() accepts (the geometry
 * divides and is within its bounds, rank in [4, dim], active in (0, 1),
 * margin and noise finite). 0 or -EINVAL with *why saying what is wrong. */
int sbf_gen_check(const struct sbf_gen_opts *o, const char **why);

/* Write the checkpoint to path; the header (with the measured sparsity,
 * recall and precision) in *out when not NULL. The file is written under
 * a temporary name (common/file.h) and renamed to path only when complete:
 * a failure or a kill leaves what path named before intact, and nothing
 * but the temporary is ever removed. 0 or -errno: -EINVAL (o fails
 * sbf_gen_check), -EEXIST (path exists and is not a regular file: it is
 * left alone), -ENOMEM, the errors of creating and writing a file beside
 * path. */
int sbf_generate(const char *path, const struct sbf_gen_opts *o,
		 struct sbf_header *out);

#endif /* SBFLASH_GEN_H */
