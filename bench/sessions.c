/* SPDX-License-Identifier: MIT */
/*
 * bench/sessions: chat sessions sharing a system prompt, idle between
 * turns, under a memory budget, three ways in one run.
 *
 * Geometry of Qwen3-4B (36 layers, 32 query heads, 8 KV heads, head dim
 * 128, bf16: 144 KiB of KV per position), real kernels, synthetic
 * activations. M conversations of T turns; all start with the same
 * --prompt-token system prompt; a turn is --user tokens of the user's
 * message, run through prefill attention over everything before (its time
 * is the turn's time to first token), then --reply tokens of the answer,
 * whose K and V rows are written (their attention is the same work in
 * every strategy and is left out: it would only lengthen the run). Between
 * turns a conversation is idle; the conversations take turns round robin.
 *
 *   a recompute  every conversation computes the system prompt itself
 *                (prefill attention and KV writes) into its own dense
 *                cache and keeps it in memory: M copies of the prompt
 *   b slots      llama.cpp's slot save/restore: the prompt's state is
 *                read from a file written once (--prompt-cache), an idle
 *                conversation's whole state is written to a file with
 *                write(2) and its memory freed, and read back with read(2)
 *                at its next turn; the files are synced and dropped from
 *                the page cache, so that what is idle holds no memory
 *   c sparsebuf  the prompt computed once and put in a prefix cache
 *                (sb_kv_cache_put); each conversation starts from
 *                sb_kv_cache_get (its pages shared, not copied); an idle
 *                conversation is parked with sb_kv_evict (its own pages
 *                to the spill file; the shared prompt stays); a pool
 *                budget below all the KV (SB_KV_EVICTABLE regions)
 *
 * Computing the prompt (2048 positions of prefill over 36 layers) is the
 * longest step: it runs once for (c) and once for (a) (the other
 * conversations of (a) would repeat the same work: their memory is
 * counted, their time taken as that one's).
 *
 * Printed: time to first token per turn (the first turn and the later
 * ones; median, p99 = the worst of these few, and the spread), bytes read
 * and written, memory at the end (dense bytes for a, peak for b; the
 * pool's pages in use, its resident bytes and the process's RSS for c).
 * The memory and the times to first token also go to DIR/sessions.dat,
 * and with gnuplot to a chart, DIR/sessions.png (bench/sessions.gp).
 * Targets, each miss counted in the exit status:
 *   1 c holds the prompt's pages once: pool bytes in use <= the prompt +
 *     the conversations' own pages + 16 MiB
 *   2 c's first turn (a cache hit) <= 0.1x recomputing the prompt
 *   3 c's resumed turns read no more than the conversations' own pages
 *     (parked by sb_kv_evict) plus what the pool put out under its
 *     budget during those turns (read again); never the prompt's; and
 *     are faster than b's (median)
 *
 * Usage: sessions [--convs M] [--turns T] [--prompt-tokens P] [--user U]
 *                 [--reply R] [--layers L] [--budget-mib N] [--dir DIR]
 *        sessions --help | --version
 * Exit status: 0, 3 when a target is missed, 2 for a bad option.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "sbkernels.h"
#include "sparsebuf.h"
#include "sparsebuf_kv.h"

#define NH 32
#define KVH 8
#define HD 128
#define ROW ((size_t)KVH * HD * 2)	/* bytes of one position, one region */
#define MAXC 64
#define MAXT 64

static int M = 6, T = 3, L = 36;
static size_t P = 2048, U = 32, R = 32;
static size_t budget;	/* bytes; 0: chosen from the workload */
static const char *dir = "/var/tmp/sparsebuf-bench";

static const struct sbk_attn attn = {NH, KVH, HD, 0};
static float *qbuf, *obuf, *rowbuf;	/* scratch: (n, NH*HD), (n, KVH*HD) */

static size_t max_ctx(void)
{
	return P + (size_t)T * (U + R);
}

/* Per-position bytes over every region. */
static size_t pos_bytes(void)
{
	return 2 * (size_t)L * ROW;
}

static double now_ms(void)
{
	return bench_now_us() / 1e3;
}

/* ---- the work of a turn, on any layout ------------------------------------------ */

/* Where layer l's K and V rows live. */
struct layers {
	void *k[128], *v[128];
};

/* Write K and V rows [pos0, pos0 + n) of every layer (synthetic values
 * that depend on the position), then, with attend, prefill attention for
 * them over [0, pos0 + n). */
static int compute(const struct layers *ly, size_t pos0, size_t n,
		   bool attend)
{
	for (int l = 0; l < L; l++) {
		struct sbk_kv kv = sbk_kv_pos_major(ly->k[l], ly->v[l], SBK_BF16,
						    KVH, HD);

		for (size_t t = 0; t < n; t++) {
			for (size_t i = 0; i < KVH * HD; i++)
				rowbuf[i] = (float)((pos0 + t + i + (size_t)l) %
						    97) *
					    0.01f;
			sbk_store((char *)ly->k[l] + (pos0 + t) * ROW, SBK_BF16,
				  rowbuf, KVH * HD);
			sbk_store((char *)ly->v[l] + (pos0 + t) * ROW, SBK_BF16,
				  rowbuf, KVH * HD);
		}
		if (attend && sbk_attn_prefill(obuf, qbuf, &attn, &kv, 0, pos0,
					       (int)n, 0) < 0)
			return -1;
	}
	return 0;
}

/* Prefill in chunks of at most 256 tokens (as engines do: bounded
 * scratch). */
static int compute_chunked(const struct layers *ly, size_t pos0, size_t n)
{
	for (size_t done = 0; done < n;) {
		size_t k = n - done < 256 ? n - done : 256;

		if (compute(ly, pos0 + done, k, true) < 0)
			return -1;
		done += k;
	}
	return 0;
}

/* ---- figures ----------------------------------------------------------------------- */

struct times {
	double v[MAXC * MAXT];
	int n;
};

static void add(struct times *t, double ms)
{
	t->v[t->n++] = ms;
}

static void summary(const char *what, struct times *t)
{
	double med, lo, hi;

	if (!t->n) {
		printf("  %-34s -\n", what);
		return;
	}
	qsort(t->v, (size_t)t->n, sizeof(double), cmp_double);
	med = median(t->v, t->n);
	lo = t->v[0];
	hi = t->v[t->n - 1];
	printf("  %-34s median %9.2f ms  p99 %9.2f ms  (%d turns, %.2f-%.2f)\n",
	       what, med, hi, t->n, lo, hi);
}

static double med_of(struct times *t)
{
	if (!t->n)
		return 0;
	qsort(t->v, (size_t)t->n, sizeof(double), cmp_double);
	return median(t->v, t->n);
}

/* ---- a: recompute, dense ------------------------------------------------------------ */

struct dense {
	char *mem;	/* (2L, max_ctx, ROW) */
	size_t len;
	struct layers ly;
};

static int dense_alloc(struct dense *d)
{
	size_t region = max_ctx() * ROW;

	d->mem = mmap(NULL, 2 * (size_t)L * region, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (d->mem == MAP_FAILED)
		return -errno;
	for (int l = 0; l < L; l++) {
		d->ly.k[l] = d->mem + (2 * (size_t)l) * region;
		d->ly.v[l] = d->mem + (2 * (size_t)l + 1) * region;
	}
	d->len = 0;
	return 0;
}

static void dense_free(struct dense *d)
{
	if (d->mem && d->mem != MAP_FAILED)
		munmap(d->mem, 2 * (size_t)L * max_ctx() * ROW);
	d->mem = NULL;
}

static double run_recompute(double *prompt_ms, struct times *first,
			    struct times *later, size_t *bytes)
{
	struct dense d = {0};
	double t0;

	/* One conversation computes everything; the others would do the
	 * same work (their memory counted below). */
	if (dense_alloc(&d) < 0)
		return -1;
	t0 = now_ms();
	if (compute_chunked(&d.ly, 0, P) < 0)
		return -1;
	*prompt_ms = now_ms() - t0;
	for (int t = 0; t < T; t++) {
		size_t pos = P + (size_t)t * (U + R);

		t0 = now_ms();
		compute_chunked(&d.ly, pos, U);
		add(t ? later : first, (now_ms() - t0) + (t ? 0 : *prompt_ms));
		compute(&d.ly, pos + U, R, false);
	}
	dense_free(&d);
	*bytes = (size_t)M * 2 * (size_t)L * max_ctx() * ROW;
	return 0;
}

/* ---- b: slot save/restore ------------------------------------------------------------ */

static int write_all(int fd, const void *p, size_t n, size_t *count)
{
	for (size_t done = 0; done < n;) {
		ssize_t w = write(fd, (const char *)p + done, n - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		done += (size_t)w;
	}
	*count += n;
	return 0;
}

static int read_all(int fd, void *p, size_t n, size_t *count)
{
	for (size_t done = 0; done < n;) {
		ssize_t r = read(fd, (char *)p + done, n - done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		done += (size_t)r;
	}
	*count += n;
	return 0;
}

/* llama.cpp's state file: every layer's K and V rows [0, len). Synced,
 * then dropped from the page cache: an idle slot holds no memory. */
static int slot_save(const struct dense *d, const char *path, size_t *wr)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600), r = 0;

	if (fd < 0)
		return -1;
	for (int l = 0; l < L && r == 0; l++) {
		r = write_all(fd, d->ly.k[l], d->len * ROW, wr);
		if (r == 0)
			r = write_all(fd, d->ly.v[l], d->len * ROW, wr);
	}
	if (r == 0)
		r = fdatasync(fd);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	return r;
}

static int slot_load(struct dense *d, const char *path, size_t len,
		     size_t *rd)
{
	int fd = open(path, O_RDONLY), r = 0;

	if (fd < 0)
		return -1;
	for (int l = 0; l < L && r == 0; l++) {
		r = read_all(fd, d->ly.k[l], len * ROW, rd);
		if (r == 0)
			r = read_all(fd, d->ly.v[l], len * ROW, rd);
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	d->len = len;
	return r;
}

static int run_slots(struct times *first, struct times *later, size_t *rd,
		     size_t *wr, size_t *peak)
{
	char path[512];
	struct dense d = {0};
	size_t len[MAXC] = {0}, pw = 0;

	/* The prompt's state, computed once and written (untimed: the
	 * prompt-cache file of a server that ran before). */
	if (dense_alloc(&d) < 0)
		return -1;
	compute_chunked(&d.ly, 0, P);
	d.len = P;
	snprintf(path, sizeof(path), "%s/sessions-prompt.state", dir);
	if (slot_save(&d, path, &pw) < 0)
		return -1;
	dense_free(&d);
	for (int t = 0; t < T; t++)
		for (int c = 0; c < M; c++) {
			double t0 = now_ms();
			size_t pos;

			if (dense_alloc(&d) < 0)
				return -1;
			if (t == 0) {
				snprintf(path, sizeof(path),
					 "%s/sessions-prompt.state", dir);
				if (slot_load(&d, path, P, rd) < 0)
					return -1;
			} else {
				snprintf(path, sizeof(path),
					 "%s/sessions-%d.state", dir, c);
				if (slot_load(&d, path, len[c], rd) < 0)
					return -1;
			}
			pos = d.len;
			compute_chunked(&d.ly, pos, U);
			add(t ? later : first, now_ms() - t0);
			compute(&d.ly, pos + U, R, false);
			d.len = pos + U + R;
			len[c] = d.len;
			snprintf(path, sizeof(path), "%s/sessions-%d.state", dir,
				 c);
			if (slot_save(&d, path, wr) < 0)
				return -1;
			dense_free(&d);
		}
	for (int c = 0; c < M; c++) {
		snprintf(path, sizeof(path), "%s/sessions-%d.state", dir, c);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/sessions-prompt.state", dir);
	unlink(path);
	*peak = 2 * (size_t)L * max_ctx() * ROW;
	return 0;
}

/* ---- c: sparsebuf ---------------------------------------------------------------------- */

static struct layers seq_layers(struct sb_kv_seq *s)
{
	struct layers ly;

	for (int l = 0; l < L; l++) {
		ly.k[l] = sb_kv_k(s, l);
		ly.v[l] = sb_kv_v(s, l);
	}
	return ly;
}

/* A pass of n positions on a sequence: prepare, rows (and attention),
 * commit. */
static int seq_pass(struct sb_kv_seq *s, size_t n, bool attend)
{
	struct layers ly = seq_layers(s);
	long r = sb_kv_prepare(s, n);

	if (r < 0) {
		fprintf(stderr, "sb_kv_prepare: %s\n", strerror((int)-r));
		return -1;
	}
	if (attend ? compute_chunked(&ly, sb_kv_len(s), n) < 0
		   : compute(&ly, sb_kv_len(s), n, false) < 0)
		return -1;
	return sb_kv_commit(s, n) < 0 ? -1 : 0;
}

struct sb_result {
	double prompt_ms;
	size_t in_use, resident, own_bytes, prompt_bytes;
	long rss_kib, pss_kib;
	size_t rd_resume, own_evicted, own_at_resume, rd, wr;
	size_t wr_resume;	/* written by the pool itself during those turns
				 * (its budget): what it may read again */
	long hits;
};

static int run_sparsebuf(struct times *first, struct times *later,
			 struct sb_result *res)
{
	struct sb_kv_config cfg = {
		.n_layers = L,
		.n_kv_heads = KVH,
		.head_dim = HD,
		.dtype = SB_KV_BF16,
		.max_ctx = max_ctx(),
		.flags = SB_KV_EVICTABLE,
	};
	struct sb_pool_opts o;
	struct sb_pool *pool;
	struct sb_kv_cache *cache;
	struct sb_kv_seq *warm, *conv[MAXC];
	struct sb_stats s0, s1;
	int32_t *tokens;
	long rss0, pss0, rss1, pss1;
	double t0;
	int err;

	bench_rollup_kib(&rss0, &pss0);
	sb_pool_opts_init(&o);
	o.max_bytes = budget;
	o.spill_dir = dir;
	pool = sb_pool_create(&o, &err);
	if (!pool) {
		fprintf(stderr, "sb_pool_create: %s\n", strerror(-err));
		return -1;
	}
	tokens = malloc(P * sizeof(*tokens));
	for (size_t i = 0; i < P; i++)
		tokens[i] = (int32_t)(1000 + i * 7 % 30000);
	/* The prompt, once, into the cache. */
	cache = sb_kv_cache_create(pool, &cfg, "qwen3-4b-synthetic",
				   P * pos_bytes() + (16u << 20), &err);
	warm = sb_kv_create(pool, &cfg, &err);
	if (!cache || !warm) {
		fprintf(stderr, "sparsebuf setup: %s\n", strerror(-err));
		return -1;
	}
	t0 = now_ms();
	if (seq_pass(warm, P, true) < 0)
		return -1;
	res->prompt_ms = now_ms() - t0;
	if (sb_kv_cache_put(cache, warm, tokens, P) < 0)
		return -1;
	sb_kv_destroy(warm);
	sb_pool_stats(pool, &s0);
	for (int t = 0; t < T; t++)
		for (int c = 0; c < M; c++) {
			size_t hit = 0;

			sb_pool_stats(pool, &s1);
			if (t) {
				/* Its own pages (on disk or not): what the
				 * pass may have to read, the prompt's not. */
				size_t pg = s1.page_size;
				size_t end = (sb_kv_len(conv[c]) * ROW + pg - 1) / pg;

				res->own_at_resume +=
					(end - P * ROW / pg) * pg * 2 * (size_t)L;
			}
			t0 = now_ms();
			if (t == 0) {
				conv[c] = sb_kv_cache_get(cache, tokens, P,
							  &hit, &err);
				if (!conv[c]) {
					fprintf(stderr, "get: %s\n",
						strerror(-err));
					return -1;
				}
				res->hits += hit == P;
			}
			if (seq_pass(conv[c], U, true) < 0)
				return -1;
			add(t ? later : first, now_ms() - t0);
			if (t) {
				struct sb_stats s2;

				sb_pool_stats(pool, &s2);
				res->rd_resume += s2.bytes_read - s1.bytes_read;
				res->wr_resume +=
					s2.bytes_written - s1.bytes_written;
			}
			if (seq_pass(conv[c], R, false) < 0)
				return -1;
			/* Idle: park it. */
			if (t < T - 1) {
				long n = sb_kv_evict(conv[c]);

				if (n < 0) {
					fprintf(stderr, "sb_kv_evict: %s\n",
						strerror((int)-n));
					return -1;
				}
				res->own_evicted += (size_t)n * s0.page_size;
			}
		}
	sb_pool_stats(pool, &s1);
	res->in_use = s1.pages_used * s1.page_size;
	res->resident = s1.bytes_resident;
	bench_rollup_kib(&rss1, &pss1);
	res->rss_kib = rss1 - rss0;
	res->pss_kib = pss1 - pss0;
	res->rd = s1.bytes_read - s0.bytes_read;
	res->wr = s1.bytes_written - s0.bytes_written;
	res->prompt_bytes = (P * ROW + s1.page_size - 1) / s1.page_size *
			    s1.page_size * 2 * (size_t)L;
	/* The conversations' own pages: from the prompt's last page on. */
	res->own_bytes = 0;
	for (int c = 0; c < M; c++) {
		size_t from = P * ROW / s1.page_size * s1.page_size;

		for (int l = 0; l < L; l++)
			for (int v = 0; v < 2; v++) {
				struct sb_buf *b = sb_kv_buf(conv[c], l, v);
				long n = sb_buf_placed(
					b, from, sb_buf_length(b) - from);

				if (n > 0)
					res->own_bytes +=
						(size_t)n * s1.page_size;
			}
	}
	for (int c = 0; c < M; c++)
		sb_kv_destroy(conv[c]);
	sb_kv_cache_destroy(cache);
	sb_pool_destroy(pool);
	free(tokens);
	return 0;
}

/* ---- main ---------------------------------------------------------------------------- */

enum { OPT_CONVS = 1, OPT_TURNS, OPT_PROMPT, OPT_USER, OPT_REPLY, OPT_LAYERS,
       OPT_BUDGET, OPT_DIR };

static const struct sbc_opt opts[] = {
	{OPT_CONVS, "--convs", "M", "conversations, 1 to 64 (default 6)"},
	{OPT_TURNS, "--turns", "T", "turns each, 1 to 64 (default 3)"},
	{OPT_PROMPT, "--prompt-tokens", "P", "system prompt positions "
					     "(default 2048)"},
	{OPT_USER, "--user", "U", "user tokens a turn (default 32)"},
	{OPT_REPLY, "--reply", "R", "reply tokens a turn (default 32)"},
	{OPT_LAYERS, "--layers", "L", "layers, 1 to 128 (default 36)"},
	{OPT_BUDGET, "--budget-mib", "N", "sparsebuf's pool budget (default: "
					  "the prompt + 2 conversations)"},
	{OPT_DIR, "--dir", "DIR", "state files and spill (default "
				  "/var/tmp/sparsebuf-bench)"},
	{0},
};

static void parse(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "sessions",
		.usage = "[options]",
		.about = "Chat sessions sharing a system prompt, idle between "
			 "turns, under a budget:\nrecompute, slot save/restore "
			 "and sparsebuf's prefix cache with sb_kv_evict.\nExit "
			 "status 3 when a target is missed.",
		.opts = opts,
	};
	const char *v;
	int opt;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			sbc_fail(&cli, "unexpected argument '%s'", v);
		case OPT_CONVS:
			M = (int)sbc_int(&cli, v, 1, MAXC);
			break;
		case OPT_TURNS:
			T = (int)sbc_int(&cli, v, 1, MAXT);
			break;
		case OPT_PROMPT:
			P = (size_t)sbc_int(&cli, v, 1, 1 << 20);
			break;
		case OPT_USER:
			U = (size_t)sbc_int(&cli, v, 1, 4096);
			break;
		case OPT_REPLY:
			R = (size_t)sbc_int(&cli, v, 0, 1 << 16);
			break;
		case OPT_LAYERS:
			L = (int)sbc_int(&cli, v, 1, 128);
			break;
		case OPT_BUDGET:
			budget = (size_t)sbc_int(&cli, v, 1, 1 << 24) << 20;
			break;
		case OPT_DIR:
			dir = v;
			break;
		}
	}
}

/* The memory and the times to first token as a chart (bench/sessions.gp)
 * beside the files, when gnuplot is there. */
static void chart(size_t mem_a, size_t mem_b, size_t mem_c, struct times *fa,
		  struct times *la, struct times *fb, struct times *lb,
		  struct times *fc, struct times *lc)
{
	char path[1024], cmd[1200];
	FILE *f;

	snprintf(path, sizeof(path), "%s/sessions.dat", dir);
	f = fopen(path, "w");
	if (!f)
		return;
	fprintf(f, "# way memory_MiB first_turn_ms resumed_ms\n");
	/* A way with no resumed turns (--turns 1) gets a bar of 0: none. */
	fprintf(f, "a %.1f %.3f %.3f\n", mem_a / 1048576.0, med_of(fa),
		med_of(la));
	fprintf(f, "b %.1f %.3f %.3f\n", mem_b / 1048576.0, med_of(fb),
		med_of(lb));
	fprintf(f, "c %.1f %.3f %.3f\n", mem_c / 1048576.0, med_of(fc),
		med_of(lc));
	fclose(f);
	snprintf(cmd, sizeof(cmd),
		 "command -v gnuplot >/dev/null && "
		 "gnuplot -e \"dir='%s'\" bench/sessions.gp 2>/dev/null",
		 dir);
	if (system(cmd) == 0)
		printf("\nchart: %s/sessions.png\n", dir);
	else
		printf("\nchart: gnuplot not installed (data in %s)\n", path);
}

static const char *verdict(bool ok)
{
	return ok ? "PASS" : "FAIL";
}

int main(int argc, char **argv)
{
	struct times fa = {0}, la = {0}, fb = {0}, lb = {0}, fc = {0}, lc = {0};
	struct sb_result c = {0};
	double prompt_a = 0;
	size_t dense_bytes = 0, rd_b = 0, wr_b = 0, peak_b = 0, own_kv;
	int fails = 0;
	bool ok;

	parse(argc, argv);
	own_kv = (size_t)T * (U + R) * pos_bytes();
	if (!budget)
		budget = P * pos_bytes() + 2 * own_kv + ((size_t)64 << 20);
	mkdir(dir, 0755);
	qbuf = calloc(256 * NH * HD, sizeof(float));
	obuf = calloc(256 * NH * HD, sizeof(float));
	rowbuf = calloc(KVH * HD, sizeof(float));
	for (size_t i = 0; i < 256 * NH * HD; i++)
		qbuf[i] = (float)(i % 13) * 0.05f - 0.3f;
	printf("sessions: %d conversations x %d turns, a %zu-token system "
	       "prompt, %zu user + %zu reply tokens a turn; %d layers, "
	       "%zu KiB of KV a position (bf16)\n",
	       M, T, P, U, R, L, pos_bytes() >> 10);
	printf("all KV without sharing: %zu MiB; sparsebuf's budget %zu MiB; "
	       "files in %s\n",
	       (size_t)M * (P * pos_bytes() + own_kv) >> 20, budget >> 20, dir);
	fflush(stdout);
	if (run_sparsebuf(&fc, &lc, &c) < 0) {
		fprintf(stderr, "sessions: the sparsebuf run failed\n");
		return 1;
	}
	if (run_slots(&fb, &lb, &rd_b, &wr_b, &peak_b) < 0) {
		fprintf(stderr, "sessions: the slot run failed: %s\n",
			strerror(errno));
		return 1;
	}
	if (run_recompute(&prompt_a, &fa, &la, &dense_bytes) < 0) {
		fprintf(stderr, "sessions: the recompute run failed\n");
		return 1;
	}

	printf("\nprompt computed (prefill attention and KV writes): "
	       "%.1f ms (a), %.1f ms (c, once, into the cache)\n",
	       prompt_a, c.prompt_ms);
	printf("\ntime to first token\n");
	summary("a recompute: first turn", &fa);
	summary("a recompute: later turns", &la);
	summary("b slots: first turn (prompt file)", &fb);
	summary("b slots: resumed turns", &lb);
	summary("c sparsebuf: first turn (hit)", &fc);
	summary("c sparsebuf: resumed turns", &lc);
	printf("\nI/O: b read %.1f MiB, wrote %.1f MiB; c read %.1f MiB "
	       "(%.1f MiB in resumed turns), wrote %.1f MiB (%.1f MiB "
	       "parked)\n",
	       rd_b / 1048576.0, wr_b / 1048576.0, c.rd / 1048576.0,
	       c.rd_resume / 1048576.0, c.wr / 1048576.0,
	       c.own_evicted / 1048576.0);
	printf("memory at the end: a %zu MiB (M dense caches, every prompt "
	       "its own); b %zu MiB at most (one slot in memory); c pool "
	       "%zu MiB in use, %zu MiB resident, PSS +%ld MiB, RSS +%ld MiB "
	       "(RSS counts a shared page once per mapping: the cache's and "
	       "each conversation's); the prompt %zu MiB once, own pages %zu "
	       "MiB\n",
	       dense_bytes >> 20, peak_b >> 20, c.in_use >> 20, c.resident >> 20,
	       c.pss_kib >> 10, c.rss_kib >> 10, c.prompt_bytes >> 20,
	       c.own_bytes >> 20);

	chart(dense_bytes, peak_b, c.in_use, &fa, &la, &fb, &lb, &fc, &lc);

	printf("\ntargets\n");
	ok = c.in_use <= c.prompt_bytes + c.own_bytes + ((size_t)16 << 20) &&
	     c.hits == M;
	fails += !ok;
	printf("  %s the prompt's pages held once for all %d: %zu MiB in use "
	       "<= %zu + %zu + 16 MiB (a holds %d copies); %ld/%d hits\n",
	       verdict(ok), M, c.in_use >> 20, c.prompt_bytes >> 20,
	       c.own_bytes >> 20, M, c.hits, M);
	ok = med_of(&fc) <= 0.1 * prompt_a;
	fails += !ok;
	printf("  %s first turn with a cache hit %.2f ms <= 0.1x recomputing "
	       "the prompt (%.1f ms): %.4fx\n",
	       verdict(ok), med_of(&fc), prompt_a, med_of(&fc) / prompt_a);
	if (T > 1) {
		ok = c.rd_resume <= c.own_at_resume + c.wr_resume &&
		     med_of(&lc) < med_of(&lb);
		fails += !ok;
		printf("  %s resumed turns read %.1f MiB <= their own pages, "
		       "%.1f MiB, + what the budget put out during them, %.1f "
		       "MiB (none of the prompt's %zu MiB x %d turns; b read "
		       "%.1f MiB), and take %.2f ms < b's %.2f ms: %.3fx\n",
		       verdict(ok), c.rd_resume / 1048576.0,
		       c.own_at_resume / 1048576.0, c.wr_resume / 1048576.0,
		       c.prompt_bytes >> 20, M * (T - 1), rd_b / 1048576.0,
		       med_of(&lc), med_of(&lb), med_of(&lc) / med_of(&lb));
	}
	return fails ? 3 : 0;
}
