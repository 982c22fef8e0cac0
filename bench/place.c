/* SPDX-License-Identifier: MIT */
/*
 * Placement benchmark: what growing a buffer costs the calling thread.
 *
 * 1 GiB is grown one page (256 KiB) at a time with about 200 us of
 * unrelated computation between pages, the steady state of a decode loop.
 * Timed on the calling thread: the placement call plus the first touch of
 * every 4 KiB. Baseline, in the same run: the kernel's own anonymous demand
 * paging (mmap MAP_NORESERVE, first touch allocates and zeroes).
 *
 *   explicit   sb_buf_map of the page, then the touches
 *   demand     the touches only: the fault handler places the page
 *   burst      both again without the computation (reported only)
 *
 * Then a streaming read over 1 GiB of placed pages against the same read
 * over plain anonymous memory (the two grown in turn, from the same
 * CPU's free lists: grow_in_turn says why), and what a page of fresh heap memory costs
 * the ready thread to prepare (fresh_writes; reported only).
 *
 * With --daemon PATH, the explicit and demand cases again on a pool that
 * is a client of the sparsebufd at PATH, against the local pool's times in
 * the same rounds (target: within 1.2x).
 *
 * Usage: place [--size-mib N] [--spacing-us U] [--rounds R] [--daemon PATH]
 *        place --help | --version
 * Exit status: 0, 3 when a target is missed, 2 for a bad option.
 */
#include "bench.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli.h"
#include "sparsebuf.h"

static size_t total = 1 << 30;
static size_t page = 256 << 10;
static double spacing = 200;
static int rounds = 3;
static const char *daemon_path;

enum mode { KERNEL, EXPLICIT, DEMAND };

static void touch(volatile char *p, size_t len)
{
	for (size_t o = 0; o < len; o += 4096)
		p[o] = 1;
}

/* Microseconds on the calling thread per page. */
static double grow(enum mode m, struct sb_pool *pool, double space,
		   struct sb_stats *delta)
{
	size_t npages = total / page;
	struct sb_stats s0, s1;
	struct sb_buf *buf = NULL;
	double acc = 0;
	char *base;

	if (m == KERNEL) {
		base = mmap(NULL, total, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (base == MAP_FAILED)
			abort();
	} else {
		buf = sb_buf_create(pool, total, 0, NULL);
		if (!buf)
			abort();
		base = sb_buf_addr(buf);
		sb_pool_stats(pool, &s0);
	}
	for (size_t i = 0; i < npages; i++) {
		double t0;

		if (space > 0)
			bench_compute(space);
		t0 = bench_now_us();
		if (m == EXPLICIT && sb_buf_map(buf, i * page, page) != 1)
			abort();
		touch(base + i * page, page);
		acc += bench_now_us() - t0;
	}
	if (m == KERNEL) {
		munmap(base, total);
	} else {
		sb_pool_stats(pool, &s1);
		delta->sync_prepares = s1.sync_prepares - s0.sync_prepares;
		delta->faults = s1.faults - s0.faults;
		sb_buf_destroy(buf);
	}
	return acc / (double)npages;
}

static double read_pass(const char *p, size_t len)
{
	const uint64_t *q = (const uint64_t *)p;
	uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	double t0 = bench_now_us();

	for (size_t i = 0; i < len / 8; i += 4) {
		s0 += q[i];
		s1 += q[i + 1];
		s2 += q[i + 2];
		s3 += q[i + 3];
	}
	bench_sink = (double)(s0 + s1 + s2 + s3);
	return (double)len / (bench_now_us() - t0) / 1e3;	/* GB/s */
}

/*
 * How fast memory streams depends on how contiguous it is (on this VM the
 * same two mappings read 0.87x one way round and 1.13x the other: the
 * host's nested page walks, DRAM pages), and that depends on the free
 * lists it came from, not on where it is mapped. The pool's ready thread
 * prepares its pages on a CPU other than the caller's (ready.c), from
 * that CPU's lists; memory faulted in on the caller's CPU comes from
 * other lists, in other runs (8 pages to the ready thread's 2 here). So
 * the anonymous baseline is faulted in by a helper thread kept off the
 * caller's CPU too, page by page in turn with the buffer's growth: both
 * take their memory from the same lists, in the same stretch of time.
 */
struct turn {
	char *a;
	size_t next, done;
	pthread_mutex_t lock;
	pthread_cond_t cond;
};

static void *fault_anon(void *arg)
{
	struct turn *t = arg;

	for (;;) {
		size_t off;

		pthread_mutex_lock(&t->lock);
		while (t->next == t->done)
			pthread_cond_wait(&t->cond, &t->lock);
		off = t->next;
		pthread_mutex_unlock(&t->lock);
		if (off == SIZE_MAX)
			return NULL;
		memset(t->a + off, 1, page);
		pthread_mutex_lock(&t->lock);
		t->done = off;
		pthread_cond_broadcast(&t->cond);
		pthread_mutex_unlock(&t->lock);
	}
}

static void grow_in_turn(char *a, struct sb_buf *buf)
{
	struct turn t = {.a = a, .next = SIZE_MAX - 1, .done = SIZE_MAX - 1,
			 .lock = PTHREAD_MUTEX_INITIALIZER,
			 .cond = PTHREAD_COND_INITIALIZER};
	int cpu = sched_getcpu();
	pthread_attr_t attr;
	pthread_t th;
	cpu_set_t set;

	pthread_attr_init(&attr);
	if (cpu >= 0 && sched_getaffinity(0, sizeof(set), &set) == 0 &&
	    CPU_COUNT(&set) > 1) {
		CPU_CLR(cpu, &set);
		pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
	}
	if (pthread_create(&th, &attr, fault_anon, &t))
		abort();
	pthread_attr_destroy(&attr);
	for (size_t off = 0; off < total; off += page) {
		pthread_mutex_lock(&t.lock);
		t.next = off;
		pthread_cond_broadcast(&t.cond);
		while (t.done != off)
			pthread_cond_wait(&t.cond, &t.lock);
		pthread_mutex_unlock(&t.lock);
		if (sb_buf_map(buf, off, page) < 0)
			abort();
		memset(sb_buf_addr(buf) + off, 1, page);
	}
	pthread_mutex_lock(&t.lock);
	t.next = SIZE_MAX;
	pthread_cond_broadcast(&t.cond);
	pthread_mutex_unlock(&t.lock);
	pthread_join(th, NULL);
}

/*
 * The share of 4 KiB pages of [p, p + len) whose frame follows the frame
 * of the page before (/proc/self/pagemap): how contiguous the memory the
 * streaming read goes over is. -1 without the frame numbers (not root).
 */
static double contiguous(const char *p, size_t len)
{
	size_t n = len / 4096, next = 0;
	uint64_t *e = malloc(n * sizeof(*e));
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	const uint64_t pfn = (1ull << 55) - 1;
	bool ok = e && fd >= 0 &&
		  pread(fd, e, n * sizeof(*e),
			(off_t)((uintptr_t)p / 4096 * sizeof(*e))) ==
			  (ssize_t)(n * sizeof(*e));

	if (fd >= 0)
		close(fd);
	for (size_t i = 1; ok && i < n; i++)
		next += (e[i] & pfn) && (e[i] & pfn) == (e[i - 1] & pfn) + 1;
	ok = ok && (e[0] & pfn);
	free(e);
	return ok ? (double)next / (double)(n - 1) : -1;
}

/*
 * What the ready thread pays to prepare a page of fresh heap memory: a
 * pwrite of the page's zeros into a new memfd, one page at a time with
 * the computation between. Reported beside the placements, since it
 * depends on the machine: where shmem gives the heaps 2 MiB folios
 * (shmem_enabled, docs/design.md "Heap folios"), the write that starts a
 * folio allocates all of it, and on a VM whose balloon hands free memory
 * back to the host each such folio is memory the host must fault in.
 * The writes at 2 MiB boundaries are shown apart. Microseconds: median,
 * p90, p99 of all; median and p90 at boundaries.
 */
static void fresh_writes(double space, double out[5])
{
	size_t n = total / page, per = ((size_t)2 << 20) / page, nb = 0;
	double *all = malloc(n * sizeof(*all)), *at = malloc(n * sizeof(*at));
	char *zeros = calloc(1, page);
	int fd = memfd_create("place-fresh", MFD_CLOEXEC);

	if (!all || !at || !zeros || fd < 0 || ftruncate(fd, (off_t)total) < 0)
		abort();
	for (size_t i = 0; i < n; i++) {
		double t0 = bench_now_us();

		if (pwrite(fd, zeros, page, (off_t)(i * page)) != (ssize_t)page)
			abort();
		all[i] = bench_now_us() - t0;
		if (!per || i % per == 0)
			at[nb++] = all[i];
		bench_compute(space);
	}
	qsort(all, n, sizeof(*all), cmp_double);
	qsort(at, nb, sizeof(*at), cmp_double);
	out[0] = all[n / 2];
	out[1] = all[n * 9 / 10];
	out[2] = all[n * 99 / 100];
	out[3] = at[nb / 2];
	out[4] = at[nb * 9 / 10];
	close(fd);
	free(zeros);
	free(at);
	free(all);
}

enum { OPT_SIZE = 1, OPT_SPACING, OPT_ROUNDS, OPT_DAEMON };

static const struct sbc_opt opts[] = {
	{OPT_SIZE, "--size-mib", "N", "MiB to grow (default 1024)"},
	{OPT_SPACING, "--spacing-us", "U", "microseconds of computation "
					   "between pages (default 200)"},
	{OPT_ROUNDS, "--rounds", "R", "rounds, 1 to 16; the median is shown "
				      "(default 3)"},
	{OPT_DAEMON, "--daemon", "PATH", "also on a pool that is a client of "
					 "the sparsebufd at PATH"},
	{0},
};

static void parse(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "place",
		.usage = "[options]",
		.about = "What growing a buffer costs the calling thread: "
			 "sb_buf_map and fault placement\nagainst the kernel's "
			 "demand paging, then a streaming read of placed "
			 "pages.\nExit status 3 when a target is missed.",
		.opts = opts,
	};
	const char *v;
	int opt;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			sbc_fail(&cli, "unexpected argument '%s'", v);
		case OPT_SIZE:
			total = (size_t)sbc_int(&cli, v, 1, 1 << 20) << 20;
			break;
		case OPT_SPACING:
			spacing = sbc_double(&cli, v, 0, 1e6);
			break;
		case OPT_ROUNDS:
			rounds = (int)sbc_int(&cli, v, 1, 16);
			break;
		case OPT_DAEMON:
			daemon_path = v;
			break;
		}
	}
}

int main(int argc, char **argv)
{
	struct sb_pool_opts o;
	struct sb_pool *pool, *client = NULL;
	struct sb_stats d = {0};
	double k[2][16], e[2][16], dm[2][16], ce[16], cd[16];
	/* Pages the caller prepared itself (no ready page): explicit, demand. */
	unsigned long long prep[2][2] = {{0}};
	int err, fails = 0;

	parse(argc, argv);
	sb_pool_opts_init(&o);
	/* SPARSEBUF_HUGETLB=1: the pool's huge pages, a page at a time. */
	if (o.flags & SB_POOL_HUGETLB)
		page = o.page_size;
	o.page_size = page;
	pool = sb_pool_create(&o, &err);
	if (!pool) {
		fprintf(stderr, "sb_pool_create: %s\n", strerror(-err));
		return 1;
	}
	if (daemon_path) {
		client = sb_pool_connect(daemon_path, &o, &err);
		if (!client) {
			fprintf(stderr, "sb_pool_connect %s: %s\n",
				daemon_path, strerror(-err));
			return 1;
		}
	}
	printf("placement: %zu MiB grown %zu KiB at a time, %.0f us of "
	       "computation between pages; median of %d rounds\n",
	       total >> 20, page >> 10, spacing, rounds);
	/* Interleave the strategies so drift in the VM hits all alike. */
	for (int r = 0; r < rounds; r++) {
		for (int b = 0; b < 2; b++) {
			double sp = b ? 0 : spacing;

			k[b][r] = grow(KERNEL, NULL, sp, &d);
			e[b][r] = grow(EXPLICIT, pool, sp, &d);
			prep[b][0] += d.sync_prepares;
			dm[b][r] = grow(DEMAND, pool, sp, &d);
			prep[b][1] += d.sync_prepares;
		}
		if (client) {
			ce[r] = grow(EXPLICIT, client, spacing, &d);
			cd[r] = grow(DEMAND, client, spacing, &d);
		}
	}
	{
		double ks = median(k[0], rounds), es = median(e[0], rounds),
		       ds = median(dm[0], rounds), kb = median(k[1], rounds),
		       eb = median(e[1], rounds), db = median(dm[1], rounds);
		bool ok1 = es / ks <= 0.25, ok2 = ds / ks <= 0.5;

		printf("\n%-34s %12s %8s %8s %6s\n", "case", "us/page", "ratio",
		       "target", "");
		printf("%-34s %12.1f %8s %8s\n", "kernel demand paging (baseline)",
		       ks, "1.00x", "");
		printf("%-34s %12.1f %7.2fx %7s %6s  caller-prepared %llu of %zu\n",
		       "sparsebuf explicit sb_buf_map", es, es / ks, "<=0.25x",
		       ok1 ? "PASS" : "FAIL", prep[0][0],
		       rounds * (total / page));
		printf("%-34s %12.1f %7.2fx %7s %6s  caller-prepared %llu of %zu\n",
		       "sparsebuf demand (fault)", ds, ds / ks, "<=0.50x",
		       ok2 ? "PASS" : "FAIL", prep[0][1], rounds * (total / page));
		printf("%-34s %12.1f %8s\n", "burst: kernel demand paging", kb,
		       "1.00x");
		printf("%-34s %12.1f %7.2fx %8s %6s\n", "burst: sparsebuf explicit", eb,
		       eb / kb, "report", "");
		printf("%-34s %12.1f %7.2fx %8s %6s\n", "burst: sparsebuf demand", db,
		       db / kb, "report", "");
		fails += !ok1 + !ok2;
		if (client) {
			double cs = median(ce, rounds), cds = median(cd, rounds);
			bool ok3 = cs / es <= 1.2, ok4 = cds / ds <= 1.2;

			printf("%-34s %12.1f %7.2fx %7s %6s  (ratio: to the "
			       "local pool's)\n",
			       "sparsebufd client, explicit", cs, cs / es,
			       "<=1.2x", ok3 ? "PASS" : "FAIL");
			printf("%-34s %12.1f %7.2fx %7s %6s\n",
			       "sparsebufd client, demand", cds, cds / ds,
			       "<=1.2x", ok4 ? "PASS" : "FAIL");
			fails += !ok3 + !ok4;
		}
	}
	{
		struct sb_buf *buf = sb_buf_create(pool, total, 0, NULL);
		char *a = mmap(NULL, total, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		double gs[16], ga[16], rs, ra;

		if (!buf || a == MAP_FAILED)
			abort();
		grow_in_turn(a, buf);
		/* Interleaved passes; the best of each, since noise in a VM
		 * only ever slows a pass down. */
		ra = rs = 0;
		for (int r = 0; r < 16; r++) {
			ga[r] = read_pass(a, total);
			gs[r] = read_pass(sb_buf_addr(buf), total);
			ra = ga[r] > ra ? ga[r] : ra;
			rs = gs[r] > rs ? gs[r] : rs;
		}
		printf("\n%-34s %12s %8s %8s\n", "streaming read (best of 16)",
		       "GB/s", "ratio", "target");
		printf("%-34s %12.2f %8s\n", "anonymous memory (baseline)", ra,
		       "1.00x");
		printf("%-34s %12.2f %7.3fx %7s %6s\n", "sparsebuf placed pages", rs,
		       rs / ra, ">=0.98x", rs / ra >= 0.98 ? "PASS" : "FAIL");
		{
			double ca = contiguous(a, total),
			       cs = contiguous(sb_buf_addr(buf), total);

			if (ca >= 0 && cs >= 0)
				printf("%-34s %12s %.2f anonymous, %.2f sparsebuf "
				       "(report)\n",
				       "4 KiB pages physically after the one before",
				       "", ca, cs);
		}
		fails += rs / ra < 0.98;
		munmap(a, total);
		sb_buf_destroy(buf);
	}
	{
		double w[5];

		fresh_writes(spacing, w);
		printf("\n%-34s %8s %8s %8s %12s\n",
		       "fresh heap memory, first write", "median", "p90", "p99",
		       "at 2 MiB");
		printf("%-34s %8.1f %8.1f %8.1f %5.0f / %.0f  us a page (report)\n",
		       "pwrite of a page into a new memfd", w[0], w[1], w[2], w[3],
		       w[4]);
	}
	sb_pool_destroy(pool);
	sb_pool_destroy(client);
	return fails ? 3 : 0;
}
