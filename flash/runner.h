/* SPDX-License-Identifier: MIT */
/*
 * One run of the sbflash model in one of four modes over a checkpoint:
 *
 *   resident     every weight read into memory first (the upper bound)
 *   flash        resident section in memory, FFN bundles in a sparsebuf
 *                file buffer: predicted neurons prefetched per layer, the
 *                last k tokens' neurons kept (the LLM-in-a-flash scheme)
 *   mmap_dense   the whole file mmap()ed, every neuron computed (naive)
 *   mmap_sparse  resident section in memory, the FFN section mmap()ed,
 *                the predicted neurons computed (kernel demand paging of
 *                the same bundles)
 *
 * resident, flash and mmap_sparse compute the same neurons with the same
 * kernels in the same order: their logits are bit-identical.
 */
#ifndef SBFLASH_RUNNER_H
#define SBFLASH_RUNNER_H

#include <stdint.h>
#include <stdio.h>

#include "format.h"

enum sbf_mode { SBF_RESIDENT, SBF_FLASH, SBF_MMAP_DENSE, SBF_MMAP_SPARSE };

enum sbf_release {
	SBF_RELEASE_AUTO,   /* unmap leavers when the pool is near budget */
	SBF_RELEASE_ALWAYS, /* unmap every leaver at once */
	SBF_RELEASE_NEVER,  /* leave it to the pool's clean-page dropping */
	SBF_RELEASE_ADVISE, /* mark leavers cold; the pool drops them */
};

struct sbf_opts {
	const char *path;
	enum sbf_mode mode;
	uint64_t budget;	/* bytes for the whole process; 0: none */
	uint64_t pool_bytes;	/* flash: the pool's budget outright (tests:
				 * what the process holds varies, under ASan
				 * most); 0: derived from budget */
	int k;			/* window: neurons of the last k tokens stay */
	int steps;
	uint64_t seed;		/* of the input token sequence */
	enum sbf_release release;
	int measure;		/* resident: also the predictor's recall */
	int no_overlap;		/* flash: wait for the reads before attention
				 * (to measure what the overlap is worth) */
	int whole_bundles;	/* flash: fetch whole bundles before
				 * attention, not up rows before it and the
				 * down columns of the neurons that fire
				 * after it (which needs halves of a power
				 * of two, 4 KiB or more) */
	int madv_random;	/* mmap_sparse: MADV_RANDOM on the FFN (no
				 * read-around of 128 KiB per fault) */
	int progress;		/* progress bar on stderr */
	/* flash, split fetch: each layer's predicted neurons and those that
	 * fire, as int32 records {kind (0 predicted, 1 fired), token, layer,
	 * n, n indices}, for bench/flash_policy.py; NULL: none. */
	FILE *trace;
	/* Called after each step with its logits (vocab floats). */
	void (*on_logits)(void *ctx, int step, const float *logits, int n);
	void *ctx;
};

struct sbf_result {
	struct sbf_header h;
	double seconds;		/* the decode loop */
	double cpu_seconds;	/* CPU time of every thread of the process
				 * during the loop (getrusage: user + system) */
	double tokens_per_s;
	uint64_t bytes_read;	/* during the loop: pool reads (flash),
				 * /proc/self/io read_bytes (others) */
	uint64_t faults;	/* pool faults (flash), minflt + majflt */
	uint64_t minflt, majflt;
	uint64_t peak_rss;	/* VmHWM */
	uint64_t new_neurons;	/* bundles that entered the window */
	uint64_t new_bytes;	/* flash: bytes asked of the disk (bundles,
				 * or up rows and down columns) */
	int split;		/* flash: up rows and down columns apart */
	uint64_t computed;	/* neurons computed */
	uint64_t nonzero;	/* of those, active */
	uint64_t n_true, n_true_pred; /* measure */
	uint64_t pool_bytes;	/* flash: the pool's budget */
	uint64_t pool_peak;	/* flash: most bytes_resident seen */
	uint64_t unmapped;	/* flash: pages released by the window */
	uint64_t dropped;	/* flash: pages the pool dropped itself */
	uint64_t io_errors;	/* flash: failed reads (read again) */
	uint64_t prefetched;	/* flash: pages queued by prefetch */
	uint64_t shrunk;	/* flash: window shrinks under pressure */
	double t_release;	/* flash: seconds releasing leavers */
	double t_prefetch;	/* flash: seconds submitting prefetches */
	double t_wait;		/* flash: seconds waiting for reads */
	int trace_errno;	/* flash: the first error writing the trace
				 * (the run stopped there), or 0 */
};

/* 0 or -errno; a message on stderr says what failed. */
int sbf_run(const struct sbf_opts *o, struct sbf_result *res);

const char *sbf_mode_name(enum sbf_mode m);
/* Whether flash mode fetches this model's up rows and down columns apart
 * (the split fetch, which --trace records): bundles a power of two from
 * 8 KiB, and no whole_bundles. */
int sbf_splits(const struct sbf_header *h, int whole_bundles);

#endif /* SBFLASH_RUNNER_H */
