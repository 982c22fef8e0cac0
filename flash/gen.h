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
	int progress;	/* a progress bar on stderr */
};

/* Defaults for a model of about model_bytes bytes (dim 4096 from 1 GiB up,
 * else 1024; hidden 6 * dim; layers to fill the size). */
void sbf_gen_defaults(struct sbf_gen_opts *o, uint64_t model_bytes);

/* Write the checkpoint to path; the header (with the measured sparsity,
 * recall and precision) in *out when not NULL. 0 or -errno. */
int sbf_generate(const char *path, const struct sbf_gen_opts *o,
		 struct sbf_header *out);

/* A size from the command line: a number with an optional K, M, G or T
 * suffix (powers of 1024; "4.5G" is fine). */
uint64_t sbf_parse_size(const char *s);

#endif /* SBFLASH_GEN_H */
