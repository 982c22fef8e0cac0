/* SPDX-License-Identifier: MIT */
/*
 * sbflash: run an sbflash checkpoint (sbgen) in one mode and report speed,
 * bytes read, faults and memory (runner.h says what the modes are).
 *
 *   sbflash MODEL [--mode resident|flash|mmap_dense|mmap_sparse]
 *           [--budget BYTES] [-k K] [--threads N] [--steps S] [--seed S]
 *           [--release auto|always|never|advise] [--measure] [--logits FILE]
 *           [--madv-normal] [--no-overlap] [--json] [--progress|--no-progress]
 *
 * The input tokens are a seeded pseudo-random sequence (the same in every
 * mode); the logits of every step can be written to a file (f32, steps x
 * vocab) to compare modes with cmp(1).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen.h"
#include "runner.h"
#include "sbkernels.h"

static void write_logits(void *ctx, int step, const float *logits, int n)
{
	(void)step;
	if (fwrite(logits, sizeof(*logits), (size_t)n, ctx) != (size_t)n)
		fprintf(stderr, "sbflash: writing logits: %s\n",
			strerror(errno));
}

static void usage(void)
{
	fprintf(stderr,
		"usage: sbflash MODEL [--mode resident|flash|mmap_dense|"
		"mmap_sparse] [--budget BYTES]\n"
		"               [-k K] [--threads N] [--steps S] [--seed S] "
		"[--release auto|always|never|advise]\n"
		"               [--measure] [--madv-normal] [--no-overlap] [--logits FILE] [--json] "
		"[--progress|--no-progress]\n");
}

int main(int argc, char **argv)
{
	struct sbf_opts o = {0};
	struct sbf_result r;
	const char *logits = NULL;
	FILE *lf = NULL;
	int json = 0, threads = 0, err;
	double bundle_mib;

	o.mode = SBF_FLASH;
	o.k = 5;
	o.steps = 32;
	o.seed = 1;
	/* The stronger mmap_sparse baseline on this machine (bench at 1 GiB:
	 * 4.1 tok/s against 1.0 with the kernel's read-around). */
	o.madv_random = 1;
	o.progress = isatty(2);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--json"))
			json = 1;
		else if (!strcmp(a, "--no-overlap"))
			o.no_overlap = 1;
		else if (!strcmp(a, "--madv-normal"))
			o.madv_random = 0;
		else if (!strcmp(a, "--measure"))
			o.measure = 1;
		else if (!strcmp(a, "--progress"))
			o.progress = 1;
		else if (!strcmp(a, "--no-progress"))
			o.progress = 0;
		else if (a[0] != '-')
			o.path = a;
		else if (!v) {
			usage();
			return 2;
		} else {
			i++;
			if (!strcmp(a, "--mode")) {
				if (!strcmp(v, "resident"))
					o.mode = SBF_RESIDENT;
				else if (!strcmp(v, "flash") ||
					 !strcmp(v, "sparsebuf"))
					o.mode = SBF_FLASH;
				else if (!strcmp(v, "mmap_dense"))
					o.mode = SBF_MMAP_DENSE;
				else if (!strcmp(v, "mmap_sparse"))
					o.mode = SBF_MMAP_SPARSE;
				else {
					usage();
					return 2;
				}
			} else if (!strcmp(a, "--budget"))
				o.budget = sbf_parse_size(v);
			else if (!strcmp(a, "-k"))
				o.k = atoi(v);
			else if (!strcmp(a, "--threads"))
				threads = atoi(v);
			else if (!strcmp(a, "--steps"))
				o.steps = atoi(v);
			else if (!strcmp(a, "--seed"))
				o.seed = strtoull(v, NULL, 0);
			else if (!strcmp(a, "--logits"))
				logits = v;
			else if (!strcmp(a, "--release")) {
				if (!strcmp(v, "auto"))
					o.release = SBF_RELEASE_AUTO;
				else if (!strcmp(v, "always"))
					o.release = SBF_RELEASE_ALWAYS;
				else if (!strcmp(v, "never"))
					o.release = SBF_RELEASE_NEVER;
				else if (!strcmp(v, "advise"))
					o.release = SBF_RELEASE_ADVISE;
				else {
					usage();
					return 2;
				}
			} else {
				usage();
				return 2;
			}
		}
	}
	if (!o.path || o.steps < 1 || o.k < 1) {
		usage();
		return 2;
	}
	if (threads > 0 && sbk_set_threads(threads) < 0) {
		fprintf(stderr, "sbflash: bad --threads %d\n", threads);
		return 2;
	}
	if (logits) {
		lf = fopen(logits, "wb");
		if (!lf) {
			fprintf(stderr, "sbflash: %s: %s\n", logits,
				strerror(errno));
			return 1;
		}
		o.on_logits = write_logits;
		o.ctx = lf;
	}
	err = sbf_run(&o, &r);
	if (lf && fclose(lf) && !err)
		err = -EIO;
	if (err < 0) {
		fprintf(stderr, "sbflash: %s mode failed: %s\n",
			sbf_mode_name(o.mode), strerror(-err));
		return 1;
	}
	bundle_mib = r.h.bundle / 1048576.0;
	if (json) {
		printf("{\"mode\": \"%s\", \"model_bytes\": %llu, "
		       "\"ffn_bytes\": %llu, \"budget_bytes\": %llu, "
		       "\"steps\": %d, \"k\": %d, \"threads\": %d, "
		       "\"tokens_per_s\": %.4f, \"bytes_read_per_token\": %llu, "
		       "\"peak_rss_bytes\": %llu, \"faults\": %llu, "
		       "\"minflt\": %llu, \"majflt\": %llu, "
		       "\"new_bytes_per_token\": %llu, "
		       "\"neurons_per_token\": %.1f, \"active_fraction\": %.4f, "
		       "\"precision\": %.4f, \"recall\": ",
		       o.mode == SBF_FLASH ? "sparsebuf" : sbf_mode_name(o.mode),
		       (unsigned long long)r.h.file_bytes,
		       (unsigned long long)r.h.ffn_bytes,
		       (unsigned long long)o.budget, o.steps, o.k,
		       sbk_get_threads(), r.tokens_per_s,
		       (unsigned long long)(r.bytes_read / (uint64_t)o.steps),
		       (unsigned long long)r.peak_rss,
		       (unsigned long long)r.faults,
		       (unsigned long long)r.minflt,
		       (unsigned long long)r.majflt,
		       (unsigned long long)(r.new_neurons * r.h.bundle /
					    (uint64_t)o.steps),
		       (double)r.computed / o.steps,
		       (double)r.computed / o.steps /
			       ((double)r.h.hidden * r.h.n_layers),
		       r.computed ? (double)r.nonzero / r.computed : 0.0);
		if (r.n_true)
			printf("%.4f", (double)r.n_true_pred / r.n_true);
		else
			printf("null");
		printf(", \"header_recall\": %.4f, \"header_precision\": %.4f, "
		       "\"header_sparsity\": %.4f, \"pool_bytes\": %llu, "
		       "\"pool_peak_bytes\": %llu, \"unmapped_pages\": %llu, "
		       "\"dropped_pages\": %llu, \"prefetched_pages\": %llu, "
		       "\"window_shrinks\": %llu}\n",
		       r.h.recall, r.h.precision, r.h.sparsity,
		       (unsigned long long)r.pool_bytes,
		       (unsigned long long)r.pool_peak,
		       (unsigned long long)r.unmapped,
		       (unsigned long long)r.dropped,
		       (unsigned long long)r.prefetched,
		       (unsigned long long)r.shrunk);
		return 0;
	}
	printf("%s: %s mode, %d tokens in %.2f s: %.3f tokens/s\n", o.path,
	       sbf_mode_name(o.mode), o.steps, r.seconds, r.tokens_per_s);
	printf("  read %.2f MiB/token (new bundles entering the window: %.2f "
	       "MiB/token), faults %llu (minflt %llu, majflt %llu), peak RSS "
	       "%.0f MiB\n",
	       r.bytes_read / 1048576.0 / o.steps,
	       r.new_neurons * bundle_mib / o.steps,
	       (unsigned long long)r.faults, (unsigned long long)r.minflt,
	       (unsigned long long)r.majflt, r.peak_rss / 1048576.0);
	printf("  %.0f neurons computed per token (%.2f%% of all), %.1f%% of "
	       "them active",
	       (double)r.computed / o.steps,
	       100.0 * r.computed / o.steps / ((double)r.h.hidden * r.h.n_layers),
	       r.computed ? 100.0 * r.nonzero / r.computed : 0.0);
	if (r.n_true)
		printf("; predictor recall on this run %.4f",
		       (double)r.n_true_pred / r.n_true);
	printf("\n");
	if (o.mode == SBF_FLASH)
		printf("  pool budget %.0f MiB, peak %.0f MiB; %llu pages "
		       "prefetched, %llu released by the window, %llu dropped "
		       "by the pool; window shrunk %llu times\n",
		       r.pool_bytes / 1048576.0, r.pool_peak / 1048576.0,
		       (unsigned long long)r.prefetched,
		       (unsigned long long)r.unmapped,
		       (unsigned long long)r.dropped,
		       (unsigned long long)r.shrunk);
	if (o.mode == SBF_FLASH)
		printf("  per token: %.1f ms releasing, %.1f ms submitting "
		       "reads, %.1f ms waiting for them, %.1f ms the rest\n",
		       1e3 * r.t_release / o.steps, 1e3 * r.t_prefetch / o.steps,
		       1e3 * r.t_wait / o.steps,
		       1e3 * (r.seconds - r.t_release - r.t_prefetch - r.t_wait) /
			       o.steps);
	return 0;
}
