/* SPDX-License-Identifier: MIT */
/*
 * sbgen: write a synthetic sbflash checkpoint (see gen.c, format.h), or
 * print the header of one.
 *
 *   sbgen OUT [--model-bytes N] [--seed S] [--dim D] [--layers L]
 *             [--hidden H] [--vocab V] [--rank R] [--active F]
 *             [--margin M] [--noise X] [--threads T] [--quiet]
 *   sbgen --info FILE [--json]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int main(int argc, char **argv)
{
	struct sbf_gen_opts o;
	struct sbf_header h;
	const char *out = NULL, *info = NULL;
	uint64_t bytes = (uint64_t)64 << 20;
	int quiet = 0, json = 0, err;

	/* First pass: the size decides the defaults the rest override. */
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--model-bytes") && i + 1 < argc)
			bytes = sbf_parse_size(argv[i + 1]);
	sbf_gen_defaults(&o, bytes);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--quiet")) {
			quiet = 1;
			continue;
		}
		if (!strcmp(a, "--json")) {
			json = 1;
			continue;
		}
		if (a[0] != '-') {
			out = a;
			continue;
		}
		if (!v) {
			fprintf(stderr, "sbgen: %s needs a value\n", a);
			return 2;
		}
		i++;
		if (!strcmp(a, "--model-bytes"))
			;
		else if (!strcmp(a, "--info"))
			info = v;
		else if (!strcmp(a, "--seed"))
			o.seed = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--dim"))
			o.dim = (uint32_t)atoi(v);
		else if (!strcmp(a, "--layers"))
			o.n_layers = (uint32_t)atoi(v);
		else if (!strcmp(a, "--hidden"))
			o.hidden = (uint32_t)atoi(v);
		else if (!strcmp(a, "--heads"))
			o.n_heads = (uint32_t)atoi(v);
		else if (!strcmp(a, "--kv-heads"))
			o.n_kv_heads = (uint32_t)atoi(v);
		else if (!strcmp(a, "--vocab"))
			o.vocab = (uint32_t)atoi(v);
		else if (!strcmp(a, "--rank"))
			o.rank = (uint32_t)atoi(v);
		else if (!strcmp(a, "--active"))
			o.active = strtof(v, NULL);
		else if (!strcmp(a, "--margin"))
			o.margin = strtof(v, NULL);
		else if (!strcmp(a, "--noise"))
			o.noise = strtof(v, NULL);
		else if (!strcmp(a, "--threads"))
			o.threads = atoi(v);
		else {
			fprintf(stderr, "sbgen: unknown option %s\n", a);
			return 2;
		}
	}
	if (info) {
		int fd = open(info, O_RDONLY | O_CLOEXEC);

		if (fd < 0 || (err = sbf_header_read(fd, &h)) < 0) {
			fprintf(stderr, "sbgen: %s: %s\n", info,
				fd < 0 ? strerror(errno) : strerror(-err));
			return 1;
		}
		close(fd);
		print_header(info, &h, json);
		return 0;
	}
	if (!out) {
		fprintf(stderr,
			"usage: sbgen OUT [--model-bytes N] [--seed S] [--dim D] "
			"[--layers L] [--hidden H] [--vocab V] [--rank R]\n"
			"             [--active F] [--margin M] [--noise X] "
			"[--threads T] [--quiet]\n"
			"       sbgen --info FILE [--json]\n");
		return 2;
	}
	o.progress = !quiet && isatty(2);
	err = sbf_generate(out, &o, &h);
	if (err < 0) {
		fprintf(stderr, "sbgen: %s: %s\n", out, strerror(-err));
		return 1;
	}
	if (!quiet)
		print_header(out, &h, json);
	return 0;
}
