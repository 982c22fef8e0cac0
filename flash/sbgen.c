/* SPDX-License-Identifier: MIT */
/*
 * sbgen: write a synthetic sbflash checkpoint (see gen.c, format.h), or
 * print the header of one.
 *
 *   sbgen OUT [--model-bytes N] [--seed S] [--dim D] [--layers L]
 *             [--hidden H] [--heads N] [--kv-heads N] [--vocab V]
 *             [--rank R] [--active F] [--margin M] [--noise X]
 *             [--threads T] [--quiet] [--json]
 *   sbgen --info FILE [--json]
 *   sbgen --help | --version
 *
 * Values are parsed strictly (common/cli.h): a bad one ends sbgen with
 * status 2 before it writes anything, and so do options that make no
 * checkpoint a reader accepts (sbf_gen_check). OUT is replaced atomically
 * (sbf_generate); --info reads only regular files.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gen.h"
#include "model.h"

static void print_header(const char *path, const struct sbf_header *h,
			 int json)
{
	if (json) {
		printf("{\"model_bytes\": %llu, \"ffn_bytes\": %llu, "
		       "\"resident_bytes\": %llu, \"dim\": %u, \"layers\": %u, "
		       "\"hidden\": %u, \"bundle\": %u, \"rank\": %u, "
		       "\"seed\": %llu, \"sparsity\": %.4f, "
		       "\"predictor_recall\": %.4f, "
		       "\"predictor_precision\": %.4f, \"predicted\": %.4f}\n",
		       (unsigned long long)h->file_bytes,
		       (unsigned long long)h->ffn_bytes,
		       (unsigned long long)h->res_bytes, h->dim, h->n_layers,
		       h->hidden, h->bundle, h->rank,
		       (unsigned long long)h->seed, h->sparsity, h->recall,
		       h->precision, h->predicted);
		return;
	}
	printf("%s: %.1f MiB (resident %.1f MiB, FFN %.1f MiB), dim %u, "
	       "%u layers, %u heads (%u KV), %u neurons/layer of %u bytes, "
	       "vocab %u, seed %llu\n",
	       path, h->file_bytes / 1048576.0, h->res_bytes / 1048576.0,
	       h->ffn_bytes / 1048576.0, h->dim, h->n_layers, h->n_heads,
	       h->n_kv_heads, h->hidden, h->bundle, h->vocab,
	       (unsigned long long)h->seed);
	printf("  synthetic weights; measured on %u sampled (input, neuron) "
	       "pairs: sparsity %.1f%% zeros, predictor (rank %u) recall "
	       "%.3f, precision %.3f, predicts %.1f%% of neurons\n",
	       h->samples, 100.0 * h->sparsity, h->rank, h->recall,
	       h->precision, 100.0 * h->predicted);
}

enum {
	OPT_BYTES = 256, OPT_SEED, OPT_DIM, OPT_LAYERS, OPT_HIDDEN, OPT_HEADS,
	OPT_KV_HEADS, OPT_VOCAB, OPT_RANK, OPT_ACTIVE, OPT_MARGIN, OPT_NOISE,
	OPT_THREADS, OPT_QUIET, OPT_INFO, OPT_JSON,
};

static const struct sbc_opt opts[] = {
	{OPT_BYTES, "--model-bytes", "SIZE", "about this big (64M, 4.5G; "
					     "default 64M): sets the rest"},
	{OPT_SEED, "--seed", "S", "seed of every weight (default 1)"},
	{OPT_DIM, "--dim", "D", "model dimension (default 1024, 4096 from "
				"1 GiB)"},
	{OPT_LAYERS, "--layers", "L", "layers (default: to fill the size)"},
	{OPT_HIDDEN, "--hidden", "H", "FFN neurons per layer (default 6 x "
				      "dim)"},
	{OPT_HEADS, "--heads", "N", "attention heads (default dim / 128)"},
	{OPT_KV_HEADS, "--kv-heads", "N", "KV heads (default heads / 4)"},
	{OPT_VOCAB, "--vocab", "V", "vocabulary (default 4096)"},
	{OPT_RANK, "--rank", "R", "predictor rank, 4 to dim (default 64)"},
	{OPT_ACTIVE, "--active", "F", "fraction of neurons active, in (0, 1) "
				      "(default 0.03)"},
	{OPT_MARGIN, "--margin", "M", "predictor margin in score sds "
				      "(default 0.25)"},
	{OPT_NOISE, "--noise", "X", "off-subspace noise (default 0.1)"},
	{OPT_THREADS, "--threads", "T", "generator threads (default 0: one "
					"per CPU)"},
	{OPT_QUIET, "--quiet", NULL, "no progress bar, no summary"},
	{OPT_INFO, "--info", "FILE", "print FILE's header instead"},
	{OPT_JSON, "--json", NULL, "the header as JSON"},
	{0},
};

/* A geometry option: a positive 32-bit count. */
static uint32_t count(const struct sbc *c, const char *v, uint32_t max)
{
	return (uint32_t)sbc_u64(c, v, 1, max);
}

int main(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "sbgen",
		.usage = "OUT [options]\n--info FILE [--json]",
		.about = "Write a synthetic sbflash checkpoint (LLM in a flash, "
			 "docs/flash.md) to OUT, or print the\nheader of one. "
			 "OUT is written under a temporary name and renamed "
			 "into place\nwhen complete; an OUT that exists and is "
			 "not a regular file is refused.",
		.opts = opts,
	};
	/* The options as given, applied over the defaults that the size
	 * decides, whatever their order. */
	struct {
		uint64_t seed;
		uint32_t dim, n_layers, hidden, n_heads, n_kv_heads, vocab, rank;
		double active, margin, noise;
		int threads;
	} set = {0};
	unsigned given = 0;
	struct sbf_gen_opts o;
	struct sbf_header h;
	const char *out = NULL, *info = NULL, *v, *why = NULL;
	uint64_t bytes = (uint64_t)64 << 20;
	int quiet = 0, json = 0, err, opt;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		if (opt >= OPT_BYTES && opt < OPT_QUIET)
			given |= 1u << (opt - OPT_BYTES);
		switch (opt) {
		case SBC_ARG:
			if (out)
				sbc_fail(&cli, "one OUT expected, '%s' is a "
					 "second", v);
			out = v;
			break;
		case OPT_BYTES:
			bytes = sbc_size(&cli, v, 1, (uint64_t)1 << 50);
			break;
		case OPT_SEED:
			set.seed = sbc_u64(&cli, v, 0, UINT64_MAX);
			break;
		case OPT_DIM:
			set.dim = count(&cli, v, SBF_MAX_DIM);
			break;
		case OPT_LAYERS:
			set.n_layers = count(&cli, v, SBF_MAX_LAYERS);
			break;
		case OPT_HIDDEN:
			set.hidden = count(&cli, v, SBF_MAX_HIDDEN);
			break;
		case OPT_HEADS:
			set.n_heads = count(&cli, v, SBF_MAX_DIM);
			break;
		case OPT_KV_HEADS:
			set.n_kv_heads = count(&cli, v, SBF_MAX_DIM);
			break;
		case OPT_VOCAB:
			set.vocab = count(&cli, v, SBF_MAX_VOCAB);
			break;
		case OPT_RANK:
			set.rank = count(&cli, v, SBF_MAX_DIM);
			break;
		case OPT_ACTIVE:
			set.active = sbc_double(&cli, v, 1e-6, 1 - 1e-6);
			break;
		case OPT_MARGIN:
			set.margin = sbc_double(&cli, v, -100, 100);
			break;
		case OPT_NOISE:
			set.noise = sbc_double(&cli, v, 0, 100);
			break;
		case OPT_THREADS:
			set.threads = (int)sbc_int(&cli, v, 0, 1024);
			break;
		case OPT_QUIET:
			quiet = 1;
			break;
		case OPT_INFO:
			info = v;
			break;
		case OPT_JSON:
			json = 1;
			break;
		}
	}
	if (info) {
		int fd;

		if (out)
			sbc_fail(&cli, "--info takes no OUT");
		fd = sbf_open(info, &h, &why);
		if (fd < 0) {
			fprintf(stderr, "sbgen: %s: %s%s\n", info,
				fd == -ENODEV	 ? "not a regular file"
				: fd == -EBADMSG ? "not an sbflash checkpoint: "
						 : strerror(-fd),
				fd == -EBADMSG ? why : "");
			return 1;
		}
		close(fd);
		print_header(info, &h, json);
		return 0;
	}
	if (!out)
		sbc_fail(&cli, "no OUT given");
	sbf_gen_defaults(&o, bytes);
#define TAKE(opt, field) \
	if (given & (1u << ((opt) - OPT_BYTES))) \
		o.field = set.field
	TAKE(OPT_SEED, seed);
	TAKE(OPT_DIM, dim);
	TAKE(OPT_LAYERS, n_layers);
	TAKE(OPT_HIDDEN, hidden);
	TAKE(OPT_HEADS, n_heads);
	TAKE(OPT_KV_HEADS, n_kv_heads);
	TAKE(OPT_VOCAB, vocab);
	TAKE(OPT_RANK, rank);
	TAKE(OPT_ACTIVE, active);
	TAKE(OPT_MARGIN, margin);
	TAKE(OPT_NOISE, noise);
	TAKE(OPT_THREADS, threads);
#undef TAKE
	if (sbf_gen_check(&o, &why) < 0) {
		fprintf(stderr, "sbgen: these options make no checkpoint: %s\n",
			why);
		return 2;
	}
	o.progress = quiet ? 0 : isatty(2) ? 1 : -1;
	err = sbf_generate(out, &o, &h);
	if (err < 0) {
		fprintf(stderr, "sbgen: %s: %s\n", out,
			err == -EEXIST ? "exists and is not a regular file: "
					 "not replaced"
				       : strerror(-err));
		return 1;
	}
	if (!quiet)
		print_header(out, &h, json);
	return 0;
}
