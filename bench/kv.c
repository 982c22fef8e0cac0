/* SPDX-License-Identifier: MIT */
/*
 * bench/kv: a KV cache grown token by token, six ways, in one run, with the
 * same kernels. Geometry of Qwen3-4B: 36 layers, 8 KV heads, head dim 128,
 * bf16: 2 KiB per row, 144 KiB per token (K and V of every layer).
 *
 *   1 dense       the full context allocated and zeroed up front (llama.cpp)
 *   2 chunks      grow-and-copy in 256-token chunks (mlx-lm); new blocks
 *                 are populated huge pages, the cheapest fresh memory
 *   3 doubling    doubling up to 4096 cells, then +1 GiB steps, copying each
 *                 time (the llama.cpp dynamic-resize patch)
 *   4 demand      mmap(MAP_NORESERVE) of the full context: the kernel's
 *                 demand paging (first touch allocates and zeroes)
 *   5 sparsebuf   sb_kv_prepare: placement ahead of use
 *   6 fault       sparsebuf placement on fault only
 *
 * Every step writes the token's K and V rows into all 72 regions (timed,
 * with the strategy's growth work: its "stall"); every --attn-every steps
 * (default 64) the real decode-attention kernel runs over every layer (not
 * timed). Growth time of a step = the strategy's grow call plus its writes,
 * minus what the same writes cost the dense strategy at that step (a write
 * that faults is growth). Committed memory at 1k, 4k, 16k and 32k tokens:
 * the strategy's own accounting (pool pages for sparsebuf) and the
 * process's PSS growth. Attention throughput at 4k and 32k relative to
 * dense. Then 8 sessions of different lengths sharing a 2k-token prompt.
 *
 * Writes a table with targets (PASS/FAIL) to stdout, and two charts
 * (gnuplot, PNG): committed memory vs tokens, per-step stall vs tokens.
 *
 * The decoding thread is pinned to CPU 0 (--no-pin: not), as inference
 * engines pin theirs: on two vCPUs the scheduler otherwise moves it onto
 * the CPU where the pool's background thread works, and time-slices them.
 *
 * Usage: kv [--tokens N] [--attn-every N] [--out DIR] [--strategies 1,5]
 *           [--no-pin]
 *        kv --help | --version
 * Exit status: 0, 3 when a target is missed, 2 for a bad option.
 */
#include "bench.h"

#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli.h"
#include "sbkernels.h"
#include "sparsebuf.h"
#include "sparsebuf_kv.h"

#define LAYERS 36
#define KVH 8
#define HD 128
#define NH 32
#define ROW_ELEMS (KVH * HD)
#define ROW ((size_t)ROW_ELEMS * 2)	/* bf16: 2 KiB */
#define REGIONS (2 * LAYERS)
#define NSTRAT 6

static size_t max_tok = 32768;
static int attn_every = 64;
static const char *out_dir = "build/bench-kv";
static bool pin = true;
static bool run_strat[NSTRAT + 1] = {false, true, true, true, true, true, true};

/* ---- strategies --------------------------------------------------------- */

struct strat {
	int id;
	const char *name;
	size_t cap;		/* positions each region can hold now */
	char *k[LAYERS], *v[LAYERS];
	size_t committed;	/* bytes the strategy holds (its accounting) */
	/* 4: one reservation; 5, 6: sparsebuf */
	char *base;
	struct sb_pool *pool;
	struct sb_kv_seq *seq;
	struct sb_buf *buf;
	double setup_us;	/* up-front allocation (dense) */
};

static long last_prepare;

static size_t gib_tokens(void)
{
	return ((size_t)1 << 30) / (REGIONS * ROW);
}

/* Regions in one block of memory: K of layer l at 2l, V at 2l+1. */
static void set_regions(struct strat *s, char *base, size_t cap)
{
	for (int l = 0; l < LAYERS; l++) {
		s->k[l] = base + (size_t)(2 * l) * cap * ROW;
		s->v[l] = base + (size_t)(2 * l + 1) * cap * ROW;
	}
}

/* memset through a volatile pointer: the compiler must not turn malloc +
 * memset(0) into calloc, which would commit nothing up front. */
static void *(*volatile zero_fill)(void *, int, size_t) = memset;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* A fresh block for a copy strategy: the fastest new memory Linux offers,
 * transparent huge pages populated in one call (3x faster here than
 * malloc's block faulted in 4 KiB at a time by the copy), so that these
 * baselines pay for the copy and the cheapest possible allocation. */
static char *fresh_block(size_t bytes)
{
	char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		abort();
	madvise(p, bytes, MADV_HUGEPAGE);
	madvise(p, bytes, MADV_POPULATE_WRITE);
	return p;
}

/* Copy-on-grow (2, 3): a new block per region, copy, (the new part is
 * already zero), free the old, one region at a time (as the mlx-lm
 * concatenation and the llama.cpp patch's per-layer staging do). */
static void grow_copy(struct strat *s, size_t ncap, size_t len)
{
	for (int l = 0; l < LAYERS; l++) {
		for (int kv = 0; kv < 2; kv++) {
			char **r = kv ? &s->v[l] : &s->k[l];
			char *n = fresh_block(ncap * ROW);

			if (*r) {
				memcpy(n, *r, len * ROW);
				munmap(*r, s->cap * ROW);
			}
			*r = n;
		}
	}
	s->cap = ncap;
	s->committed = ncap * ROW * REGIONS;
}

static void strat_init(struct strat *s, int id)
{
	memset(s, 0, sizeof(*s));
	s->id = id;
	switch (id) {
	case 1: {
		double t0 = bench_now_us();

		s->name = "dense (llama.cpp)";
		s->base = malloc(max_tok * ROW * REGIONS);
		if (!s->base)
			abort();
		zero_fill(s->base, 0, max_tok * ROW * REGIONS);
		s->setup_us = bench_now_us() - t0;
		s->cap = max_tok;
		set_regions(s, s->base, s->cap);
		s->committed = max_tok * ROW * REGIONS;
		break;
	}
	case 2:
	case 3:
		s->name = id == 2 ? "chunks of 256 (mlx-lm)"
				  : "doubling, +1 GiB (llama.cpp patch)";
		s->cap = 0;	/* the first grow allocates */
		break;
	case 4:
		s->name = "kernel demand paging";
		s->base = mmap(NULL, max_tok * ROW * REGIONS,
			       PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (s->base == MAP_FAILED)
			abort();
		s->cap = max_tok;
		set_regions(s, s->base, s->cap);
		break;
	case 5:
	case 6: {
		struct sb_kv_config cfg = {LAYERS, KVH, HD, SB_KV_BF16,
					   max_tok, NULL, 0};
		struct sb_pool_opts o;
		int err;

		s->name = id == 5 ? "sparsebuf, prepare ahead"
				  : "sparsebuf, on fault only";
		sb_pool_opts_init(&o);
		s->pool = sb_pool_create(&o, &err);
		if (!s->pool) {
			fprintf(stderr, "sb_pool_create: %s\n", strerror(-err));
			exit(1);
		}
		s->seq = sb_kv_create(s->pool, &cfg, &err);
		if (!s->seq)
			abort();
		s->buf = sb_kv_buf(s->seq, 0, 0);
		for (int l = 0; l < LAYERS; l++) {
			s->k[l] = sb_kv_k(s->seq, l);
			s->v[l] = sb_kv_v(s->seq, l);
		}
		s->cap = max_tok;
		break;
	}
	}
}

/* The growth work before writing position len (the decode thread's). */
static void strat_grow(struct strat *s, size_t len)
{
	switch (s->id) {
	case 2:
		if (len >= s->cap)
			grow_copy(s, s->cap + 256, len);
		break;
	case 3:
		if (len >= s->cap) {
			size_t n = s->cap < 4096 ? (s->cap ? 2 * s->cap : 256)
						 : s->cap + gib_tokens();

			grow_copy(s, n > max_tok ? max_tok : n, len);
		}
		break;
	case 5:
		if ((last_prepare = sb_kv_prepare(s->seq, 1)) < 0)
			abort();
		break;
	default:
		break;
	}
}

static void strat_commit(struct strat *s)
{
	if (s->seq && sb_kv_commit(s->seq, 1) < 0)
		abort();
}

/* Bytes the strategy commits by its own accounting. */
static size_t strat_committed(struct strat *s, size_t len)
{
	struct sb_stats st;

	switch (s->id) {
	case 4:	/* what the kernel allocated: every 4 KiB touched */
		return (len * ROW + 4095) / 4096 * 4096 * REGIONS;
	case 5:
	case 6:
		sb_pool_stats(s->pool, &st);
		return st.pages_used * st.page_size;
	default:
		return s->committed;
	}
}

static void strat_fini(struct strat *s)
{
	switch (s->id) {
	case 1:
		free(s->base);
		break;
	case 2:
	case 3:
		for (int l = 0; l < LAYERS; l++) {
			munmap(s->k[l], s->cap * ROW);
			munmap(s->v[l], s->cap * ROW);
		}
		break;
	case 4:
		munmap(s->base, max_tok * ROW * REGIONS);
		break;
	default:
		sb_kv_destroy(s->seq);
		sb_pool_destroy(s->pool);
		break;
	}
}

/* ---- measurement helpers -------------------------------------------------- */

/* This thread on CPU 0 only (cpu0), or on every CPU it may use. */
static void affinity(bool cpu0)
{
	static cpu_set_t all;
	static bool saved;
	cpu_set_t one;

	if (!saved) {
		sched_getaffinity(0, sizeof(all), &all);
		saved = true;
	}
	CPU_ZERO(&one);
	CPU_SET(0, &one);
	sched_setaffinity(0, sizeof(cpu_set_t), cpu0 ? &one : &all);
}

static long pss_kib(void)
{
	char line[256];
	long v = -1;
	FILE *f = fopen("/proc/self/smaps_rollup", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "Pss: %ld", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

/* Lines of /proc/self/maps inside [lo, lo + len). */
static long maps_in(const void *lo, size_t len)
{
	uintptr_t a, b, l = (uintptr_t)lo, h = l + len;
	char line[512];
	long n = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx", &a, &b) == 2 && a < h && b > l)
			n++;
	if (f)
		fclose(f);
	return n;
}

static uint16_t rows_src[REGIONS][ROW_ELEMS];

static void write_token(struct strat *s, size_t pos)
{
	for (int l = 0; l < LAYERS; l++) {
		memcpy(s->k[l] + pos * ROW, rows_src[2 * l], ROW);
		memcpy(s->v[l] + pos * ROW, rows_src[2 * l + 1], ROW);
	}
}

static float q[NH * HD];
static const struct sbk_attn attn = {NH, KVH, HD, 0};

/* Decode attention for every layer, as one batch (one dispatch to the
 * kernel's threads; results identical to one call per layer). */
static void attention_all_layers(struct strat *s, size_t len)
{
	static struct sbk_attn_seq seq[LAYERS];
	static float out[LAYERS][NH * HD];

	for (int l = 0; l < LAYERS; l++)
		seq[l] = (struct sbk_attn_seq){
			.out = out[l],
			.q = q,
			.kv = sbk_kv_pos_major(s->k[l], s->v[l], SBK_BF16, KVH,
					       HD),
			.pos_start = 0,
			.pos_end = len,
		};
	if (sbk_attn_decode_batch(seq, LAYERS, &attn) < 0)
		abort();
}

static struct strat dense_kept;	/* strategy 1, alive for the pairs */

/* Tokens/s of attention over every layer at len positions, for s and for
 * the dense cache in alternation (the same moment, the same conditions),
 * best of reps each; returns s's and stores dense's. */
static double attention_rate(struct strat *s, size_t len, int reps,
			     double *dense_rate)
{
	double best = 0, bestd = 0;

	for (int r = 0; r < reps; r++) {
		double t0 = bench_now_us(), rate;

		attention_all_layers(s, len);
		rate = 1e6 / (bench_now_us() - t0);
		if (rate > best)
			best = rate;
		if (s == &dense_kept)
			continue;
		t0 = bench_now_us();
		attention_all_layers(&dense_kept, len);
		rate = 1e6 / (bench_now_us() - t0);
		if (rate > bestd)
			bestd = rate;
	}
	*dense_rate = s == &dense_kept ? best : bestd;
	return best;
}

/* ---- the run ------------------------------------------------------------------ */

#define NCHECK 4
static const size_t checkpoints[NCHECK] = {1024, 4096, 16384, 32768};

struct result {
	bool ran;
	double setup_us;
	double total_growth_us;
	double worst_us, p99_us;
	size_t committed[NCHECK];
	long pss_kib[NCHECK];
	double attn4k, attn32k;	/* tokens/s */
	double dense4k, dense32k;	/* dense's, measured in the same pairs */
	long mappings;		/* kernel mappings of the buffer at the end */
	size_t worst_at;	/* the step of the worst stall */
	float *stall;		/* (max_tok) us */
	float *mem_mib;		/* (max_tok / 256) committed, MiB */
};

static struct result res[NSTRAT + 1];
static float *dense_write;	/* (max_tok) us: writes, no growth */

static void run(int id)
{
	struct strat local, *sp = id == 1 ? &dense_kept : &local;
#define s (*sp)
	struct result *r = &res[id];
	long pss0 = pss_kib();
	size_t nsamples = max_tok / 256 + 1;
	double *sorted;

	r->stall = calloc(max_tok, sizeof(float));
	r->mem_mib = calloc(nsamples, sizeof(float));
	sorted = calloc(max_tok, sizeof(double));
	if (!r->stall || !r->mem_mib || !sorted)
		abort();
	/* The strategy's threads (a pool's) start with every CPU; then the
	 * decoding thread goes to CPU 0 (see the top comment). */
	affinity(false);
	strat_init(&s, id);
	if (pin)
		affinity(true);
	r->setup_us = s.setup_us;
	fprintf(stderr, "  %-36s", s.name);
	for (size_t t = 0; t < max_tok; t++) {
		double t0 = bench_now_us(), dt, t_grow;

		strat_grow(&s, t);
		t_grow = bench_now_us() - t0;
		write_token(&s, t);
		dt = bench_now_us() - t0;
		if (getenv("KV_DEBUG") && dt > 500) {
			fprintf(stderr, "\n step %zu: %.0f us (grow %.0f), last "
				"prepare placed %ld", t, dt, t_grow,
				last_prepare);
		}
		strat_commit(&s);
		if (id == 1)
			dense_write[t] = (float)dt;
		/* Growth: what this step cost beyond the plain writes. */
		dt -= dense_write[t];
		r->stall[t] = (float)(dt > 0 ? dt : 0);
		r->total_growth_us += r->stall[t];
		if ((t + 1) % 256 == 0 || t == 0)
			r->mem_mib[(t + 1) / 256] =
				(float)strat_committed(&s, t + 1) / (1 << 20);
		for (int c = 0; c < NCHECK; c++) {
			if (t + 1 == checkpoints[c]) {
				r->committed[c] = strat_committed(&s, t + 1);
				r->pss_kib[c] = pss_kib() - pss0;
			}
		}
		if (attn_every && (t + 1) % (size_t)attn_every == 0)
			attention_all_layers(&s, t + 1);
		if (t + 1 == 4096 || t + 1 == max_tok) {
			double rate;

			double drate;

			/* Measured with the machine quiet: the same pause for
			 * every strategy lets background work finish. */
			usleep(300000);
			rate = attention_rate(&s, t + 1, 5, &drate);
			if (t + 1 == 4096) {
				r->attn4k = rate;
				r->dense4k = drate;
			}
			if (t + 1 == max_tok) {
				r->attn32k = rate;
				r->dense32k = drate;
			}
		}
		if ((t + 1) % 4096 == 0)
			fputc('.', stderr);
	}
	if (s.buf) {
		struct sb_stats st;

		/* Mappings of every region's buffer. */
		r->mappings = 0;
		for (int l = 0; l < LAYERS; l++)
			for (int v = 0; v < 2; v++) {
				struct sb_buf *b = sb_kv_buf(s.seq, l, v);

				r->mappings += maps_in(sb_buf_addr(b),
						       sb_buf_length(b));
			}
		sb_pool_stats(s.pool, &st);
		fprintf(stderr, " [placed %llu, faults %llu, caller-prepared "
			"%llu, ready %zu, resident %zu MiB]",
			(unsigned long long)(st.maps + st.fault_places),
			(unsigned long long)st.faults,
			(unsigned long long)st.sync_prepares, st.pages_ready,
			st.bytes_resident >> 20);
	}
	for (size_t t = 0; t < max_tok; t++)
		sorted[t] = r->stall[t];
	qsort(sorted, max_tok, sizeof(double), cmp_double);
	r->worst_us = sorted[max_tok - 1];
	for (size_t t = 0; t < max_tok; t++) {
		if (r->stall[t] == (float)r->worst_us) {
			r->worst_at = t;
			break;
		}
	}
	r->p99_us = sorted[max_tok * 99 / 100];
	free(sorted);
	if (id != 1)
		strat_fini(&s);	/* dense stays for the attention pairs */
	r->ran = true;
#undef s
	fprintf(stderr, " done\n");
}

/* ---- 8 sessions sharing a 2k-token prompt ---------------------------------- */

static void sessions_table(void)
{
	enum { NS = 8 };
	static const size_t suffix[NS] = {64, 256, 512, 1024, 2048, 3072,
					  4096, 6144};
	size_t prompt = 2048, ctx = 8192, exact = 0, dense, chunks = 0,
	       doubling = 0, demand = 0;
	struct sb_pool_opts o;
	struct sb_pool *pool;
	struct sb_kv_seq *base, *seq[NS];
	struct sb_kv_config cfg = {LAYERS, KVH, HD, SB_KV_BF16, 0, NULL, 0};
	struct sb_stats st;
	size_t independent = 0;
	int err;

	cfg.max_ctx = ctx;
	sb_pool_opts_init(&o);
	pool = sb_pool_create(&o, &err);
	if (!pool)
		abort();
	base = sb_kv_create(pool, &cfg, &err);
	for (size_t t = 0; t < prompt; t++) {
		sb_kv_prepare(base, 1);
		for (int l = 0; l < LAYERS; l++) {
			memcpy((char *)sb_kv_k(base, l) + t * ROW, rows_src[0], ROW);
			memcpy((char *)sb_kv_v(base, l) + t * ROW, rows_src[1], ROW);
		}
		sb_kv_commit(base, 1);
	}
	for (int i = 0; i < NS; i++) {
		size_t len = prompt + suffix[i];

		seq[i] = sb_kv_fork(base, prompt, &err);
		if (!seq[i])
			abort();
		for (size_t t = prompt; t < len; t++) {
			sb_kv_prepare(seq[i], 1);
			for (int l = 0; l < LAYERS; l++) {
				memcpy((char *)sb_kv_k(seq[i], l) + t * ROW,
				       rows_src[2], ROW);
				memcpy((char *)sb_kv_v(seq[i], l) + t * ROW,
				       rows_src[3], ROW);
			}
			sb_kv_commit(seq[i], 1);
		}
		exact += len * ROW * REGIONS;
		chunks += (len + 255) / 256 * 256 * ROW * REGIONS;
		{
			size_t cap = 256;

			while (cap < len)
				cap = cap < 4096 ? 2 * cap : cap + gib_tokens();
			doubling += cap * ROW * REGIONS;
		}
		demand += (len * ROW + 4095) / 4096 * 4096 * REGIONS;
		independent += (len * ROW + 256 * 1024 - 1) / (256 * 1024) *
			       (256 * 1024) * REGIONS;
	}
	sb_kv_destroy(base);	/* the prompt lives on in the forks */
	sb_pool_stats(pool, &st);
	dense = NS * ctx * ROW * REGIONS;
	printf("\n8 sessions of %zu-token prompt + %zu..%zu tokens each "
	       "(context %zu), Qwen3-4B bf16:\n",
	       prompt, suffix[0], suffix[NS - 1], ctx);
	printf("%-36s %12s %10s\n", "strategy", "committed", "vs exact");
	printf("%-36s %9.1f MiB %9.2fx\n", "exact bytes (no sharing)",
	       (double)exact / (1 << 20), 1.0);
	printf("%-36s %9.1f MiB %9.2fx\n", "dense (llama.cpp)",
	       (double)dense / (1 << 20), (double)dense / (double)exact);
	printf("%-36s %9.1f MiB %9.2fx\n", "chunks of 256 (mlx-lm)",
	       (double)chunks / (1 << 20), (double)chunks / (double)exact);
	printf("%-36s %9.1f MiB %9.2fx\n", "doubling, +1 GiB (llama.cpp patch)",
	       (double)doubling / (1 << 20), (double)doubling / (double)exact);
	printf("%-36s %9.1f MiB %9.2fx\n", "kernel demand paging",
	       (double)demand / (1 << 20), (double)demand / (double)exact);
	printf("%-36s %9.1f MiB %9.2fx\n", "sparsebuf without sharing",
	       (double)independent / (1 << 20),
	       (double)independent / (double)exact);
	printf("%-36s %9.1f MiB %9.2fx   prompt pages held once: %s\n",
	       "sparsebuf, prompt shared (measured)",
	       (double)(st.pages_used * st.page_size) / (1 << 20),
	       (double)(st.pages_used * st.page_size) / (double)exact,
	       st.pages_used * st.page_size <
			       independent - (NS - 1) * prompt * ROW * REGIONS +
				       NS * REGIONS * st.page_size
		       ? "PASS"
		       : "FAIL");
	for (int i = 0; i < NS; i++)
		sb_kv_destroy(seq[i]);
	sb_pool_destroy(pool);
}

/* ---- output --------------------------------------------------------------------- */

static void charts(void)
{
	char path[512], cmd[1024];
	FILE *f;

	snprintf(cmd, sizeof(cmd), "mkdir -p %s", out_dir);
	if (system(cmd) != 0)
		return;
	snprintf(path, sizeof(path), "%s/memory.dat", out_dir);
	f = fopen(path, "w");
	for (size_t i = 0; f && i <= max_tok / 256; i++) {
		fprintf(f, "%zu", i * 256);
		for (int id = 1; id <= NSTRAT; id++)
			fprintf(f, " %.1f", res[id].ran ? res[id].mem_mib[i] : 0);
		fprintf(f, "\n");
	}
	if (f)
		fclose(f);
	snprintf(path, sizeof(path), "%s/stall.dat", out_dir);
	f = fopen(path, "w");
	for (size_t t = 0; f && t < max_tok; t++) {
		fprintf(f, "%zu", t + 1);
		for (int id = 1; id <= NSTRAT; id++)
			fprintf(f, " %.2f",
				res[id].ran ? (double)res[id].stall[t] + 0.1 : 0.1);
		fprintf(f, "\n");
	}
	if (f)
		fclose(f);
	snprintf(cmd, sizeof(cmd), "command -v gnuplot >/dev/null && "
		 "gnuplot -e \"dir='%s'\" bench/kv.gp 2>/dev/null",
		 out_dir);
	if (system(cmd) == 0)
		printf("\ncharts: %s/memory.png, %s/stall.png\n", out_dir,
		       out_dir);
	else
		printf("\ncharts: gnuplot not installed (data in %s/*.dat)\n",
		       out_dir);
}

enum { OPT_TOKENS = 1, OPT_ATTN, OPT_OUT, OPT_NO_PIN, OPT_STRAT };

static const struct sbc_opt opts[] = {
	{OPT_TOKENS, "--tokens", "N", "tokens to grow to: a multiple of 256, "
				      "4096 or more (default 32768)"},
	{OPT_ATTN, "--attn-every", "N", "run attention every N steps "
					"(default 64)"},
	{OPT_OUT, "--out", "DIR", "charts and data (default build/bench-kv)"},
	{OPT_STRAT, "--strategies", "1,5", "which of the six to run (1, the "
					   "baseline, always runs)"},
	{OPT_NO_PIN, "--no-pin", NULL, "leave the decoding thread unpinned"},
	{0},
};

static void parse(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "kv",
		.usage = "[options]",
		.about = "A KV cache grown token by token six ways (dense, "
			 "chunks, doubling, kernel demand\npaging, sparsebuf "
			 "ahead, sparsebuf on fault), Qwen3-4B geometry; a "
			 "table with\ntargets on stdout, charts under --out. "
			 "Exit status 3 when a target is missed.",
		.opts = opts,
	};
	const char *v;
	long long ids[NSTRAT];
	int opt, n;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			sbc_fail(&cli, "unexpected argument '%s'", v);
		case OPT_TOKENS:
			max_tok = (size_t)sbc_int(&cli, v, 4096, 1 << 22);
			if (max_tok % 256)
				sbc_fail(&cli, "--tokens: %s is not a multiple "
					 "of 256", v);
			break;
		case OPT_ATTN:
			attn_every = (int)sbc_int(&cli, v, 1, 1 << 22);
			break;
		case OPT_OUT:
			out_dir = v;
			break;
		case OPT_NO_PIN:
			pin = false;
			break;
		case OPT_STRAT:
			n = sbc_list(&cli, v, 1, NSTRAT, ids, NSTRAT);
			memset(run_strat, 0, sizeof(run_strat));
			run_strat[1] = true;	/* the baseline */
			for (int i = 0; i < n; i++)
				run_strat[ids[i]] = true;
			break;
		}
	}
}

int main(int argc, char **argv)
{
	int fails = 0;
	unsigned seed = 1;

	parse(argc, argv);
	/* The kernels' threads: counted and started now, with every CPU
	 * allowed. Started later, from the decoding thread pinned to CPU 0,
	 * they would count one CPU and run attention single-threaded. */
	sbk_set_threads(sbk_get_threads());
	{
		/* Big enough (2 MiB of K and V) to go parallel. */
		static uint16_t kv1[2][512 * KVH * HD];
		static float o1[NH * HD];
		struct sbk_attn_seq one = {
			.out = o1,
			.q = q,
			.kv = sbk_kv_pos_major(kv1[0], kv1[1], SBK_BF16, KVH,
					       HD),
			.pos_start = 0,
			.pos_end = 512,
		};

		sbk_attn_decode_batch(&one, 1, &attn);
	}
	for (int g = 0; g < REGIONS; g++)
		for (int i = 0; i < ROW_ELEMS; i++) {
			seed = seed * 1664525u + 1013904223u;
			rows_src[g][i] = (uint16_t)(0x3c00 | (seed >> 22));
		}
	for (int i = 0; i < NH * HD; i++)
		q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
	dense_write = calloc(max_tok, sizeof(float));

	printf("KV cache growth, Qwen3-4B geometry (%d layers, %d KV heads, "
	       "head dim %d, bf16: %zu KiB per token), %zu tokens, attention "
	       "over every layer every %d steps, kernels: %s x %d threads\n",
	       LAYERS, KVH, HD, ROW * REGIONS / 1024, max_tok, attn_every,
	       sbk_isa_name(sbk_get_isa()), sbk_get_threads());
	/* Start the kernels' worker threads now, from an unpinned thread, so
	 * that they keep every CPU (one attention pass over a scratch cache
	 * large enough to run in parallel). */
	{
		struct strat w = {0};
		char *scratch = calloc(2048 * REGIONS, ROW);

		set_regions(&w, scratch, 2048);
		attention_all_layers(&w, 2048);
		free(scratch);
	}
	fprintf(stderr, "running (dots: 4096 tokens):\n");
	for (int id = 1; id <= NSTRAT; id++)
		if (run_strat[id])
			run(id);

	printf("\n%-36s", "committed memory (own accounting)");
	for (int c = 0; c < NCHECK; c++)
		if (checkpoints[c] <= max_tok)
			printf(" %9zuk", checkpoints[c] / 1024);
	printf("   PSS at the end\n");
	for (int id = 1; id <= NSTRAT; id++) {
		if (!res[id].ran)
			continue;
		printf("%-36s", id == 5 ? "sparsebuf, prepare ahead" :
				id == 6	? "sparsebuf, on fault only" :
				id == 1	? "dense (llama.cpp)" :
				id == 2	? "chunks of 256 (mlx-lm)" :
				id == 3	? "doubling, +1 GiB (llama.cpp patch)" :
					  "kernel demand paging");
		for (int c = 0; c < NCHECK; c++)
			if (checkpoints[c] <= max_tok)
				printf(" %7.0f MiB",
				       (double)res[id].committed[c] / (1 << 20));
		for (int c = NCHECK - 1; c >= 0; c--) {
			if (checkpoints[c] <= max_tok) {
				printf("   %7.0f MiB\n",
				       (double)res[id].pss_kib[c] / 1024);
				break;
			}
		}
	}
	{
		/* Exact bytes and the target: within one page per region. */
		printf("%-36s", "exact bytes");
		for (int c = 0; c < NCHECK; c++)
			if (checkpoints[c] <= max_tok)
				printf(" %7.0f MiB",
				       (double)(checkpoints[c] * ROW * REGIONS) /
					       (1 << 20));
		printf("\n");
	}

	printf("\nattention over all %d layers, dense: %.1f tokens/s at 4k "
	       "(%.1f GB/s of KV), %.1f tokens/s at %zuk (%.1f GB/s)\n",
	       LAYERS, res[1].attn4k,
	       res[1].attn4k * 4096.0 * ROW * REGIONS / 1e9, res[1].attn32k,
	       max_tok / 1024,
	       res[1].attn32k * (double)max_tok * ROW * REGIONS / 1e9);
	printf("\n%-36s %10s %10s %10s %10s %9s %9s %6s\n", "growth on the "
	       "decode thread", "setup ms", "total ms", "worst ms", "p99 ms",
	       "attn 4k", "attn end", "maps");
	printf("(attention: tokens/s relative to the dense cache, measured in "
	       "alternation with it)\n");
	for (int id = 1; id <= NSTRAT; id++) {
		struct result *r = &res[id];

		if (!r->ran)
			continue;
		printf("%-36s %10.1f %10.1f %10.3f %10.3f %8.3fx %8.3fx %6ld\n",
		       id == 5 ? "sparsebuf, prepare ahead" :
		       id == 6 ? "sparsebuf, on fault only" :
		       id == 1 ? "dense (llama.cpp)" :
		       id == 2 ? "chunks of 256 (mlx-lm)" :
		       id == 3 ? "doubling, +1 GiB (llama.cpp patch)" :
				 "kernel demand paging",
		       r->setup_us / 1e3, r->total_growth_us / 1e3,
		       r->worst_us / 1e3, r->p99_us / 1e3,
		       r->attn4k / r->dense4k, r->attn32k / r->dense32k,
		       r->mappings);
	}

	if (res[5].ran) {
		struct result *s = &res[5];
		size_t slack = REGIONS * 256 * 1024;	/* one page per region */
		bool mem_ok = true;
		bool worst_ok = s->worst_us < 1000 &&
				(!res[3].ran || s->worst_us <= 0.1 * res[3].worst_us);
		bool total_ok = !res[4].ran ||
				s->total_growth_us <= 0.25 * res[4].total_growth_us;
		bool attn_ok = s->attn4k >= 0.98 * s->dense4k &&
			       s->attn32k >= 0.98 * s->dense32k;

		for (int c = 0; c < NCHECK; c++)
			if (checkpoints[c] <= max_tok &&
			    s->committed[c] > checkpoints[c] * ROW * REGIONS + slack)
				mem_ok = false;
		printf("\ntargets for sparsebuf with prepare:\n");
		printf("  %-58s %s\n", "committed within one page per K and per V "
		       "per layer", mem_ok ? "PASS" : "FAIL");
		printf("  %-58s %.3f ms (step %zu) vs %.1f ms: %s\n",
		       "worst stall < 1 ms and <= 0.1x doubling's",
		       s->worst_us / 1e3, s->worst_at,
		       res[3].ran ? res[3].worst_us / 1e3 : 0,
		       worst_ok ? "PASS" : "FAIL");
		printf("  %-58s %.2fx: %s\n",
		       "total growth time <= 0.25x kernel demand paging's",
		       res[4].ran ? s->total_growth_us / res[4].total_growth_us : 0,
		       total_ok ? "PASS" : "FAIL");
		printf("  %-58s %.3fx, %.3fx: %s\n",
		       "attention at 4k and 32k >= 0.98x dense (paired runs)",
		       s->attn4k / s->dense4k, s->attn32k / s->dense32k,
		       attn_ok ? "PASS" : "FAIL");
		fails += !mem_ok + !worst_ok + !total_ok + !attn_ok;
	}
	if (res[1].ran)
		strat_fini(&dense_kept);
	sessions_table();
	charts();
	return fails ? 3 : 0;
}
