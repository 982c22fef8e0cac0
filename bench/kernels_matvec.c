/* SPDX-License-Identifier: MIT */
/*
 * Matrix-vector and matrix-matrix throughput, f32 weights, Qwen3-4B
 * shapes (dim 2560, 32 x 128 query and 8 x 128 KV projections, FFN 9728).
 *
 * cold: each call uses the next of several copies of the matrix, enough
 *	to exceed the last-level cache several times over, as a model's
 *	layers do: DRAM bandwidth bound, GB/s is the number to watch.
 * hot:	one small matrix again and again (in L2): compute bound.
 * matmul: W times 64 vectors (prefill), compute bound.
 *
 * Median of the repetitions after a warm-up pass. GFLOP/s counts
 * 2 * rows * cols per vector.
 *
 * Usage: kernels_matvec [--isa scalar,avx2,avx512] [--threads 1,2]
 *			  [--reps 7]
 *        kernels_matvec --help | --version
 */
#include "bench.h"

#include <stdint.h>
#include <sys/mman.h>

#include "cli.h"
#include "sbkernels.h"

#define COLD_BYTES ((size_t)768 << 20) /* 7x the 105 MiB L3 here */
#define MAX_COPIES 64

static int isas[SBK_ISA_COUNT];
static int n_isa;
static int threads[8] = {1, 2};
static int n_threads = 2;
static int reps = 7;

struct shape {
	const char *name;
	int rows, cols, n; /* n > 1: matmul of n vectors */
	int cold;
};

static const struct shape shapes[] = {
	{"wq   4096x2560", 4096, 2560, 1, 1},
	{"wkv  1024x2560", 1024, 2560, 1, 1},
	{"wo   2560x4096", 2560, 4096, 1, 1},
	{"w1   9728x2560", 9728, 2560, 1, 1},
	{"w2   2560x9728", 2560, 9728, 1, 1},
	{"hot   512x512", 512, 512, 1, 0},
	{"hot  1024x1024", 1024, 1024, 1, 0},
	{"mm   2560x2560 x64", 2560, 2560, 64, 0},
	{"mm   9728x2560 x64", 9728, 2560, 64, 0},
};

static float *alloc_f(size_t n)
{
	float *p = mmap(NULL, n * sizeof(float), PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	for (size_t i = 0; i < n; i++)
		p[i] = (float)((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
	return p;
}

/* Seconds per call, median over reps passes of ncopies calls each. */
static double run(const struct shape *s, float **w, int ncopies, float *x,
		  float *out)
{
	double t[64];

	for (int r = -1; r < reps; r++) {
		double t0 = bench_now_us();

		for (int c = 0; c < ncopies; c++) {
			if (s->n > 1)
				sbk_matmul(out, w[c], x, s->n, s->rows,
					   s->cols);
			else
				sbk_matvec(out, w[c], x, s->rows, s->cols);
		}
		if (r >= 0)
			t[r] = (bench_now_us() - t0) * 1e-6 / ncopies;
	}
	return median(t, reps);
}

enum { OPT_ISA = 1, OPT_THREADS, OPT_REPS };

static const struct sbc_opt opts[] = {
	{OPT_ISA, "--isa", "scalar,avx2,avx512", "variants (default: all "
						 "this CPU runs)"},
	{OPT_THREADS, "--threads", "1,2", "thread counts, 0 to 256 (0: one "
					  "per CPU)"},
	{OPT_REPS, "--reps", "7", "passes timed per case, 1 to 64"},
	{0},
};

static void parse(int argc, char **argv)
{
	static const char *const isa_names[] = {"scalar", "avx2", "avx512",
						"avx512bf16", NULL};
	struct sbc cli = {
		.prog = "kernels_matvec",
		.usage = "[options]",
		.about = "Matrix-vector and matrix products with f32 weights, "
			 "hot and cold, per variant\nand thread count.",
		.opts = opts,
	};
	const char *v;
	long long l[8];
	int opt, k[SBK_ISA_COUNT], n;

	for (int i = SBK_ISA_SCALAR; i <= SBK_ISA_AVX512; i++)
		if (sbk_isa_supported((enum sbk_isa)i))
			isas[n_isa++] = i;
	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			sbc_fail(&cli, "unexpected argument '%s'", v);
		case OPT_THREADS:
			n_threads = sbc_list(&cli, v, 0, 256, l, 8);
			for (int i = 0; i < n_threads; i++)
				threads[i] = (int)l[i];
			break;
		case OPT_REPS:
			reps = (int)sbc_int(&cli, v, 1, 64);
			break;
		case OPT_ISA:
			n = sbc_choice_list(&cli, v, isa_names, k,
					    SBK_ISA_COUNT);
			n_isa = 0;
			for (int i = 0; i < n; i++) {
				enum sbk_isa isa = (enum sbk_isa)(k[i] + 1);

				if (!sbk_isa_supported(isa))
					printf("skipping %s: not supported by "
					       "this CPU\n",
					       isa_names[k[i]]);
				else
					isas[n_isa++] = (int)isa;
			}
			break;
		}
	}
}

int main(int argc, char **argv)
{
	float *x = alloc_f((size_t)64 * 9728), *out = alloc_f(64 * 9728);

	setvbuf(stdout, NULL, _IOLBF, 0);
	parse(argc, argv);
	printf("matvec / matmul, f32 weights; median of %d passes; cold = a "
	       "new copy of W per call (%zu MiB in all)\n\n",
	       reps, COLD_BYTES >> 20);
	printf("%-20s %-10s %3s %10s %9s %8s\n", "shape", "isa", "thr",
	       "us/call", "GFLOP/s", "GB/s W");
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const struct shape *s = &shapes[si];
		size_t n = (size_t)s->rows * s->cols;
		int ncopies = 1;
		float *w[MAX_COPIES];

		if (s->cold) {
			ncopies = (int)((COLD_BYTES + n * 4 - 1) / (n * 4));
			ncopies = ncopies > MAX_COPIES ? MAX_COPIES : ncopies;
		} else if (s->n == 1) {
			ncopies = 1;
		}
		for (int c = 0; c < ncopies; c++)
			w[c] = alloc_f(n);
		for (int ii = 0; ii < n_isa; ii++)
			for (int ti = 0; ti < n_threads; ti++) {
				double sec;

				/* scalar matmul is slow: one thread is
				 * enough to show it */
				if (isas[ii] == SBK_ISA_SCALAR && s->n > 1 &&
				    ti)
					continue;
				sbk_set_isa((enum sbk_isa)isas[ii]);
				sbk_set_threads(threads[ti]);
				if (!s->cold && s->n == 1) {
					/* hot: many calls per timing */
					float *ws[MAX_COPIES];

					for (int c = 0; c < MAX_COPIES; c++)
						ws[c] = w[0];
					sec = run(s, ws, MAX_COPIES, x, out);
				} else {
					sec = run(s, w, ncopies, x, out);
				}
				printf("%-20s %-10s %3d %10.1f %9.2f %8.2f\n",
				       s->name, sbk_isa_name(isas[ii]),
				       threads[ti], sec * 1e6,
				       2.0 * n * s->n / sec * 1e-9,
				       n * 4.0 / sec * 1e-9);
			}
		for (int c = 0; c < ncopies; c++)
			munmap(w[c], n * sizeof(float));
	}
	sbk_shutdown();
	return 0;
}
