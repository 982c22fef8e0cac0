/* SPDX-License-Identifier: MIT */
/*
 * Decode attention throughput, the evidence for the KV-cache layout.
 *
 * Qwen3-4B geometry: 36 layers, 32 query heads, 8 KV heads, head_dim 128.
 * One "token" is a decode step: sbk_attn_decode over positions [0, ctx)
 * in each of the 36 layers, each layer with its own K and V, so every
 * step streams the whole cache from memory (576 MiB at 4k bf16, 4.5 GiB
 * at 32k: well past the last-level cache).
 *
 * For each context, KV type, variant and thread count, the two layouts
 * are timed alternately (pos-major, head-major, pos-major, ...) after a
 * warm-up step of each, so that drift in the machine hits both alike;
 * the table shows the median step and the spread (max - min) / median.
 * GB/s counts the K and V bytes a step must read. The first lines give a
 * plain read of the same memory, the ceiling to compare with, as one
 * sequential stream per thread and as eight interleaved ones: a core keeps
 * more lines in flight with several streams (about 10 vs 18 GB/s here).
 *
 * The cache memory is 4 KiB pages by default, like sparsebuf's shmem
 * heaps; --backing thp uses transparent huge pages, --backing sparsebuf
 * a sparsebuf buffer (its default pool) with every page placed up front.
 *
 * --batch-layers N times what bench/kv does instead: one
 * sbk_attn_decode_batch over the first N layers per step (position-major,
 * the same q for every layer), and shows the best and the median step.
 *
 * Usage: kernels_attn [--ctx 4096,32768] [--dtype bf16,f16]
 *			[--isa scalar,avx2,avx512] [--threads 1,2]
 *			[--reps 5] [--backing anon|thp|sparsebuf]
 *			[--batch-layers 36]
 *        kernels_attn --help | --version
 */
#include "bench.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>

#include "cli.h"
#include "sbkernels.h"
#include "sparsebuf.h"

#define N_LAYERS 36
#define N_HEADS	 32
#define N_KV	 8
#define HEAD_DIM 128

static const char *const dt_names[] = {"f32", "f16", "bf16"};
static const char *const dt_names_list[] = {"f32", "f16", "bf16", NULL};

static size_t ctxs[8] = {4096, 32768};
static int n_ctx = 2;
static int dts[3] = {SBK_BF16, SBK_F16};
static int n_dt = 2;
static int isas[SBK_ISA_COUNT];
static int n_isa;
static int threads[8] = {1, 2};
static int n_threads = 2;
static int reps = 5;
static const char *backing = "anon";
static int batch_layers; /* 0: one sbk_attn_decode per layer */

/* ---- Memory -------------------------------------------------------------- */

struct region {
	char *base;
	size_t len;
	struct sb_buf *buf;
};

static int region_alloc(struct region *r, size_t len)
{
	memset(r, 0, sizeof(*r));
	r->len = len;
	if (!strcmp(backing, "sparsebuf")) {
		struct sb_pool *pool = sb_default_pool();
		int err = 0;

		if (!pool) {
			fprintf(stderr, "sparsebuf default pool: %s\n",
				strerror(-sb_default_pool_error()));
			return -1;
		}
		r->buf = sb_buf_create(pool, len, 0, &err);
		if (!r->buf || sb_buf_map(r->buf, 0, len) < 0) {
			fprintf(stderr, "sparsebuf buffer of %zu MiB: %s\n",
				len >> 20, strerror(-err));
			return -1;
		}
		r->base = sb_buf_addr(r->buf);
		return 0;
	}
	r->base = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->base == MAP_FAILED) {
		perror("mmap");
		return -1;
	}
	madvise(r->base, len,
		!strcmp(backing, "thp") ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	return 0;
}

static void region_free(struct region *r)
{
	if (r->buf)
		sb_buf_destroy(r->buf);
	else
		munmap(r->base, r->len);
}

/* Random values of type dt everywhere: a 1 MiB pattern copied over.
 * Real numbers, no subnormals, which could slow the arithmetic. */
static void region_fill(struct region *r, enum sbk_dtype dt)
{
	enum { PAT = 1 << 20 };
	size_t n = PAT / sbk_dtype_size(dt);
	float *f = malloc(n * sizeof(float));
	char *pat = malloc(PAT);
	uint64_t s = 88172645463325252ull;

	if (!f || !pat)
		abort();
	for (size_t i = 0; i < n; i++) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		f[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
	}
	sbk_store(pat, dt, f, n);
	for (size_t o = 0; o < r->len; o += PAT)
		memcpy(r->base + o, pat, r->len - o < PAT ? r->len - o : PAT);
	free(f);
	free(pat);
}

/* ---- Read ceiling -------------------------------------------------------- */

/* One load per 64-byte line: the cost is fetching the lines. A thread
 * reads its part as `streams` interleaved sequential streams: a core keeps
 * more lines in flight with several streams than with one. */
struct reader {
	const char *p;
	size_t len;
	int streams;
	uint64_t sum;
};

static void *read_part(void *arg)
{
	struct reader *rd = arg;
	size_t per = rd->len / rd->streams / 64 * 64;
	uint64_t sum = 0;

	for (size_t o = 0; o < per; o += 64)
		for (int s = 0; s < rd->streams; s++)
			sum += *(const volatile uint64_t *)(rd->p + s * per +
							    o);
	rd->sum = sum;
	return NULL;
}

static volatile uint64_t sink;

/* GB/s of reading the region once with nt threads, best of 3. */
static double read_bw(const struct region *r, int nt, int streams)
{
	double best = 0;

	for (int k = 0; k < 3; k++) {
		struct reader rd[8];
		pthread_t tid[8];
		size_t per = r->len / nt;
		double t0 = bench_now_us(), g;

		for (int i = 0; i < nt; i++) {
			rd[i] = (struct reader){r->base + i * per, per, streams,
						0};
			pthread_create(&tid[i], NULL, read_part, &rd[i]);
		}
		for (int i = 0; i < nt; i++) {
			pthread_join(tid[i], NULL);
			sink += rd[i].sum;
		}
		g = r->len / ((bench_now_us() - t0) * 1e-6) * 1e-9;
		best = g > best ? g : best;
	}
	return best;
}

/* ---- Attention ----------------------------------------------------------- */

struct model {
	struct sbk_attn a;
	struct sbk_kv kv[2][N_LAYERS]; /* [head_major][layer] */
	float *q, *out;		       /* (N_LAYERS, N_HEADS, HEAD_DIM) */
	size_t ctx;
};

static void model_views(struct model *m, const struct region *r, size_t ctx,
			enum sbk_dtype dt)
{
	size_t layer = ctx * N_KV * HEAD_DIM * sbk_dtype_size(dt);

	for (int l = 0; l < N_LAYERS; l++) {
		const char *k = r->base + 2 * l * layer, *v = k + layer;

		m->kv[0][l] = sbk_kv_pos_major(k, v, dt, N_KV, HEAD_DIM);
		m->kv[1][l] = sbk_kv_head_major(k, v, dt, ctx, HEAD_DIM);
	}
	m->ctx = ctx;
}

/* Seconds for one decode step over all layers. */
static double step(const struct model *m, int hm)
{
	double t0 = bench_now_us();

	for (int l = 0; l < N_LAYERS; l++) {
		size_t off = (size_t)l * N_HEADS * HEAD_DIM;
		int err = sbk_attn_decode(m->out + off, m->q + off, &m->a,
					  &m->kv[hm][l], 0, m->ctx);

		if (err) {
			fprintf(stderr, "sbk_attn_decode: %s\n",
				strerror(-err));
			exit(1);
		}
	}
	return (bench_now_us() - t0) * 1e-6;
}

/* Seconds for one sbk_attn_decode_batch over the first batch_layers
 * layers, position-major, every layer with layer 0's q (as bench/kv). */
static double batch_step(const struct model *m)
{
	struct sbk_attn_seq seq[N_LAYERS];
	double t0;
	int err;

	for (int l = 0; l < batch_layers; l++)
		seq[l] = (struct sbk_attn_seq){
			.out = m->out + (size_t)l * N_HEADS * HEAD_DIM,
			.q = m->q,
			.kv = m->kv[0][l],
			.pos_start = 0,
			.pos_end = m->ctx,
		};
	t0 = bench_now_us();
	err = sbk_attn_decode_batch(seq, batch_layers, &m->a);
	if (err) {
		fprintf(stderr, "sbk_attn_decode_batch: %s\n", strerror(-err));
		exit(1);
	}
	return (bench_now_us() - t0) * 1e-6;
}

/* Best and median of nreps batch steps after a warm-up one. */
static void measure_batch(const struct model *m, int nreps, double *best,
			  double *med)
{
	double t[64];

	batch_step(m);
	for (int i = 0; i < nreps; i++)
		t[i] = batch_step(m);
	*med = median(t, nreps);
	*best = t[0]; /* sorted by median() */
}

static void measure(const struct model *m, int nreps, double med[2],
		    double spread[2])
{
	double t[2][64], s[64];

	step(m, 0);
	step(m, 1);
	for (int i = 0; i < nreps; i++)
		for (int hm = 0; hm < 2; hm++)
			t[hm][i] = step(m, hm);
	for (int hm = 0; hm < 2; hm++) {
		double lo = t[hm][0], hi = t[hm][0];

		for (int i = 0; i < nreps; i++) {
			lo = t[hm][i] < lo ? t[hm][i] : lo;
			hi = t[hm][i] > hi ? t[hm][i] : hi;
			s[i] = t[hm][i];
		}
		med[hm] = median(s, nreps);
		spread[hm] = (hi - lo) / med[hm];
	}
}

/* ---- Arguments ----------------------------------------------------------- */

enum { OPT_CTX = 1, OPT_DTYPE, OPT_ISA, OPT_THREADS, OPT_REPS, OPT_BACKING,
       OPT_BATCH };

static const struct sbc_opt opts[] = {
	{OPT_CTX, "--ctx", "4096,32768", "contexts (positions)"},
	{OPT_DTYPE, "--dtype", "bf16,f16", "KV types: f32, f16, bf16"},
	{OPT_ISA, "--isa", "scalar,avx2,avx512", "variants (default: all "
						 "this CPU runs)"},
	{OPT_THREADS, "--threads", "1,2", "thread counts, 0 to 256 (0: one "
					  "per CPU)"},
	{OPT_REPS, "--reps", "5", "steps timed per case, 1 to 64"},
	{OPT_BACKING, "--backing", "anon|thp|sparsebuf", "the cache's memory "
							 "(default anon)"},
	{OPT_BATCH, "--batch-layers", "36", "one batched call over N layers "
					    "per step instead"},
	{0},
};

static void parse(int argc, char **argv)
{
	static const char *const isa_names[] = {"scalar", "avx2", "avx512",
						"avx512bf16", NULL};
	static const char *const backings[] = {"anon", "thp", "sparsebuf",
					       NULL};
	struct sbc cli = {
		.prog = "kernels_attn",
		.usage = "[options]",
		.about = "Decode attention throughput over a Qwen3-4B-shaped KV "
			 "cache, position-major\nagainst head-major, per "
			 "context, KV type, variant and thread count.",
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
		case OPT_CTX:
			n_ctx = sbc_list(&cli, v, 1, 1 << 20, l, 8);
			for (int i = 0; i < n_ctx; i++)
				ctxs[i] = (size_t)l[i];
			break;
		case OPT_THREADS:
			n_threads = sbc_list(&cli, v, 0, 256, l, 8);
			for (int i = 0; i < n_threads; i++)
				threads[i] = (int)l[i];
			break;
		case OPT_REPS:
			reps = (int)sbc_int(&cli, v, 1, 64);
			break;
		case OPT_BATCH:
			batch_layers = (int)sbc_int(&cli, v, 1, N_LAYERS);
			break;
		case OPT_BACKING:
			backing = backings[sbc_choice(&cli, v, backings)];
			break;
		case OPT_DTYPE:
			n_dt = sbc_choice_list(&cli, v, dt_names_list, dts, 3);
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

/* The --batch-layers table: position-major only. */
static int run_batch(struct model *m, struct region *r)
{
	printf("one sbk_attn_decode_batch of %d layers per step, "
	       "position-major; best and median of %d steps\n\n",
	       batch_layers, reps);
	printf("%6s %-5s %-10s %3s | %8s %6s | %8s %6s\n", "ctx", "kv", "isa",
	       "thr", "best ms", "GB/s", "med ms", "GB/s");
	for (int di = 0; di < n_dt; di++) {
		enum sbk_dtype dt = (enum sbk_dtype)dts[di];

		if (di)
			region_fill(r, dt);
		for (int ci = 0; ci < n_ctx; ci++) {
			double bytes = 2.0 * batch_layers * ctxs[ci] * N_KV *
				       HEAD_DIM * sbk_dtype_size(dt);

			model_views(m, r, ctxs[ci], dt);
			for (int ii = 0; ii < n_isa; ii++)
				for (int ti = 0; ti < n_threads; ti++) {
					double best, med;

					sbk_set_isa((enum sbk_isa)isas[ii]);
					sbk_set_threads(threads[ti]);
					measure_batch(m, reps, &best, &med);
					printf("%6zu %-5s %-10s %3d | %8.2f "
					       "%6.2f | %8.2f %6.2f\n",
					       ctxs[ci], dt_names[dt],
					       sbk_isa_name(isas[ii]),
					       threads[ti], best * 1e3,
					       bytes / best * 1e-9, med * 1e3,
					       bytes / med * 1e-9);
				}
		}
	}
	sbk_shutdown();
	region_free(r);
	free(m->q);
	free(m->out);
	return 0;
}

int main(int argc, char **argv)
{
	size_t max_ctx = 0, es = 2;
	struct region r;
	struct model m = {.a = {N_HEADS, N_KV, HEAD_DIM, 0}};
	size_t nq = (size_t)N_LAYERS * N_HEADS * HEAD_DIM;

	setvbuf(stdout, NULL, _IOLBF, 0);
	parse(argc, argv);
	for (int i = 0; i < n_ctx; i++)
		max_ctx = ctxs[i] > max_ctx ? ctxs[i] : max_ctx;
	for (int i = 0; i < n_dt; i++)
		es = sbk_dtype_size(dts[i]) > es ? sbk_dtype_size(dts[i]) : es;
	m.q = malloc(nq * sizeof(float));
	m.out = malloc(nq * sizeof(float));
	if (!m.q || !m.out)
		abort();
	for (size_t i = 0; i < nq; i++)
		m.q[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
	/* One region for the largest context; smaller ones use its front. */
	if (region_alloc(&r,
			 (size_t)N_LAYERS * 2 * max_ctx * N_KV * HEAD_DIM * es))
		return 1;
	region_fill(&r, dts[0]);
	printf("decode attention, Qwen3-4B geometry: %d layers, %d heads, %d "
	       "KV heads, head_dim %d; %s memory, %d CPUs\n",
	       N_LAYERS, N_HEADS, N_KV, HEAD_DIM, backing, sbk_get_threads());
	if (batch_layers) /* no read ceiling: keep the run short */
		return run_batch(&m, &r);
	printf("read ceiling, the cache region (%zu MiB) read once, GB/s:\n"
	       "  1 stream/thread:  1 thread %5.2f, 2 threads %5.2f\n"
	       "  8 streams/thread: 1 thread %5.2f, 2 threads %5.2f\n",
	       r.len >> 20, read_bw(&r, 1, 1), read_bw(&r, 2, 1),
	       read_bw(&r, 1, 8), read_bw(&r, 2, 8));
	printf("median of %d steps per layout, layouts alternated; spread = "
	       "(max - min) / median\n\n",
	       reps);
	printf("%6s %-5s %-10s %3s | %-27s | %-27s | %s\n", "", "", "", "",
	       "position-major", "head-major", "head/pos");
	printf("%6s %-5s %-10s %3s | %8s %7s %5s %4s | %8s %7s %5s %4s | "
	       "%s\n",
	       "ctx", "kv", "isa", "thr", "ms/tok", "tok/s", "GB/s", "+-%",
	       "ms/tok", "tok/s", "GB/s", "+-%", "time");
	for (int di = 0; di < n_dt; di++) {
		enum sbk_dtype dt = (enum sbk_dtype)dts[di];

		if (di)
			region_fill(&r, dt);
		for (int ci = 0; ci < n_ctx; ci++) {
			double bytes = 2.0 * N_LAYERS * ctxs[ci] * N_KV *
				       HEAD_DIM * sbk_dtype_size(dt);

			model_views(&m, &r, ctxs[ci], dt);
			for (int ii = 0; ii < n_isa; ii++)
				for (int ti = 0; ti < n_threads; ti++) {
					double med[2], spr[2];
					/* the scalar reference is slow on
					 * long contexts: fewer steps */
					int n = isas[ii] == SBK_ISA_SCALAR &&
								ctxs[ci] > 8192
							? (reps < 3 ? reps : 3)
							: reps;

					sbk_set_isa((enum sbk_isa)isas[ii]);
					sbk_set_threads(threads[ti]);
					measure(&m, n, med, spr);
					printf("%6zu %-5s %-10s %3d | %8.2f "
					       "%7.2f %5.2f %4.1f | %8.2f "
					       "%7.2f %5.2f %4.1f | %.3f\n",
					       ctxs[ci], dt_names[dt],
					       sbk_isa_name(isas[ii]),
					       threads[ti], med[0] * 1e3,
					       1 / med[0],
					       bytes / med[0] * 1e-9,
					       spr[0] * 100, med[1] * 1e3,
					       1 / med[1],
					       bytes / med[1] * 1e-9,
					       spr[1] * 100, med[1] / med[0]);
				}
		}
	}
	sbk_shutdown();
	region_free(&r);
	free(m.q);
	free(m.out);
	return 0;
}
