/* SPDX-License-Identifier: MIT */
/*
 * bench/pagecost: what a page read in and released costs the CPU here,
 * step by step, beside a touch of a page already mapped.
 *
 * LLM in a flash reads and releases about 3,000 pages of 8 KiB a token
 * (docs/flash.md), scattered over the FFN section; the KV cache places a
 * page at a time. Whether that is cheap depends on the host more than on
 * sparsebuf: on a VM whose hypervisor shadows the guest's page tables
 * (PVM), each step that writes a page-table entry, or reads one for the
 * first time from user mode, is a trip to the hypervisor. This benchmark
 * times the steps one by one on pages of a memfd, as sparse as the flash
 * runner's (one page in 16), so that docs can say where a token's time
 * goes on any machine:
 *
 *   write               pwrite of the page into the memfd (the disk tier
 *                       writes a read buffer into a home page so)
 *   touch, mapped       a read of each 4 KiB of pages already mapped: the
 *                       baseline every other step is a multiple of
 *   first touch         the same read of pages just written: the kernel's
 *                       fault maps a clean entry, and a shadowing
 *                       hypervisor then builds its own
 *   ... after populate  first touch after one process_madvise
 *                       (MADV_POPULATE_READ) over all the pages; the
 *                       populate's own time on its line
 *   ... after a thread  first touch after another thread of the process
 *                       touched the pages (shadow tables are the
 *                       process's, not a thread's); that thread's time on
 *                       its line
 *   drop entries        one process_madvise(MADV_DONTNEED) over all the
 *                       pages (one TLB flush)
 *   punch               fallocate(PUNCH_HOLE) of each page, entries gone
 *   punch, entries there  the same with the entries still there (each
 *                       punch zaps and flushes)
 *   read into fresh     read() into fresh anonymous memory, then the first
 *   memory, then touch  touch from user mode (what loading weights costs)
 *   anonymous, 4 KiB    MADV_POPULATE_WRITE of the same number of bytes of
 *     / 2 MiB pages     anonymous memory, then the first touch of each
 *                       4 KiB, with 4 KiB pages (MADV_NOHUGEPAGE) and with
 *                       transparent huge pages (MADV_HUGEPAGE, 2 MiB
 *                       aligned): a hypervisor that shadows page tables
 *                       builds one entry per mapping, so a page mapped by
 *                       its page directory costs it once per 2 MiB. n/a
 *                       when the system gives no huge pages for nearly all
 *                       of it (THP `never`, or none free), or the kernel
 *                       has no MADV_POPULATE_WRITE (before 5.14). The
 *                       first round's memory is fresh
 *                       from the kernel, the later rounds' freed by the
 *                       round before: the spread shows both
 *
 * Medians of --rounds rounds, microseconds a page. No target: the figures
 * explain others (docs/PERFORMANCE.md). process_madvise of this process
 * (Linux 6.13) missing: those lines say n/a. --spin keeps another thread
 * of the process busy meanwhile, as a decoding runner's other threads are:
 * a TLB flush then reaches a second CPU.
 *
 *   pagecost [--pages N] [--page-size SIZE] [--rounds R] [--spin]
 *   pagecost --help | --version
 */
#include "bench.h"
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define SPREAD 16	/* one page of every SPREAD is used */
#define MAX_ROUNDS 64

static size_t npages = 2048, page = 8192;
static int rounds = 7;

static int memfd;
static int datafd;	/* npages * page bytes of data, for the read */
static char *map;
static size_t *idx;	/* the pages used, ascending */
static size_t *dense_idx;	/* 0, 1, 2, ...: every page */
static struct iovec *iov;
static int pidfd = -1;

enum step {
	WRITE,
	TOUCH_MAPPED,
	FIRST_TOUCH,
	POPULATE,
	TOUCH_POPULATED,
	THREAD_TOUCH,
	TOUCH_AFTER_THREAD,
	DROP,
	PUNCH,
	PUNCH_MAPPED,
	READ_FRESH,
	TOUCH_READ,
	ANON_POPULATE,
	ANON_TOUCH,
	HUGE_POPULATE,
	HUGE_TOUCH,
	NSTEPS
};

static const char *const step_name[NSTEPS] = {
	"write (pwrite into the memfd)",
	"touch, mapped (baseline)",
	"first touch",
	"populate (one process_madvise)",
	"first touch after populate",
	"another thread's first touch (+ start)",
	"touch after that thread's",
	"drop entries (one process_madvise)",
	"punch, entries gone",
	"punch, entries there",
	"read() into fresh memory",
	"first touch after read()",
	"anonymous 4 KiB pages: populate",
	"... first touch",
	"anonymous 2 MiB pages: populate",
	"... first touch",
};

static double t_step[NSTEPS][MAX_ROUNDS];
static bool na[NSTEPS];

static void write_all(const char *src)
{
	for (size_t i = 0; i < npages; i++)
		if (pwrite(memfd, src, page, (off_t)(idx[i] * page)) !=
		    (ssize_t)page) {
			perror("pagecost: pwrite");
			exit(1);
		}
}

static void touch_all(const char *base, const size_t *at)
{
	for (size_t i = 0; i < npages; i++)
		for (size_t o = 0; o < page; o += 4096)
			(void)*(const volatile char *)(base + at[i] * page + o);
}

static void *touch_thread(void *arg)
{
	(void)arg;
	touch_all(map, idx);
	return NULL;
}

static void run_thread(pthread_t *th)
{
	int r = pthread_create(th, NULL, touch_thread, NULL);

	if (r) {
		fprintf(stderr, "pagecost: pthread_create: %s\n", strerror(r));
		exit(1);
	}
	pthread_join(*th, NULL);
}

static void punch_all(void)
{
	for (size_t i = 0; i < npages; i++)
		if (fallocate(memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      (off_t)(idx[i] * page), (off_t)page) < 0) {
			perror("pagecost: fallocate(PUNCH_HOLE)");
			exit(1);
		}
}

/* All of datafd into fresh memory `to`, as a loader reads weights. */
static void read_data(char *to, size_t len)
{
	for (size_t done = 0; done < len;) {
		ssize_t r = pread(datafd, to + done, len - done, (off_t)done);

		if (r <= 0) {
			fprintf(stderr, "pagecost: reading the data: %s\n",
				r < 0 ? strerror(errno) : "short file");
			exit(1);
		}
		done += (size_t)r;
	}
}

/* One process_madvise over every page (UIO_MAXIOV at a time): 0 or -1. */
static int advise_all(int advice)
{
	for (size_t i = 0; i < npages; i += 1024) {
		size_t n = npages - i < 1024 ? npages - i : 1024;

		if (pidfd < 0 ||
		    syscall(SYS_process_madvise, pidfd, iov + i, n, advice, 0) <
			    0)
			return -1;
	}
	return 0;
}

/* Run expr; its time in us a page. */
#define TIMED(expr)                                                           \
	({                                                                    \
		double t0_ = bench_now_us();                                  \
		expr;                                                         \
		(bench_now_us() - t0_) / (double)npages;                      \
	})

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define HUGE_SIZE ((size_t)2 << 20)

/* Huge pages of the process now, from /proc/self/smaps_rollup, in KiB. */
static long anon_huge_kib(void)
{
	char line[256];
	long kib = -1;
	FILE *f = fopen("/proc/self/smaps_rollup", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "AnonHugePages: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* Anonymous memory of len bytes (2 MiB aligned), populated, then touched
 * once a 4 KiB: the times of both in *pop and *touch, us a page. false:
 * huge was asked for and the kernel gave none. */
static bool anon_round(size_t len, bool huge, double *pop, double *touch)
{
	size_t span = len + HUGE_SIZE;
	char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *p;
	long before;
	bool got = true, populated = false;

	if (raw == MAP_FAILED) {
		perror("pagecost: mmap");
		exit(1);
	}
	p = (char *)(((uintptr_t)raw + HUGE_SIZE - 1) & ~(HUGE_SIZE - 1));
	if (madvise(p, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) < 0)
		got = !huge;	/* no THP in this kernel */
	before = anon_huge_kib();
	/* len may pass the round's pages: its time a page of len. A
	 * kernel without MADV_POPULATE_WRITE (before 5.14): n/a. */
	*pop = TIMED(populated = madvise(p, len, MADV_POPULATE_WRITE) == 0) *
	       (double)npages / (double)(len / page);
	if (!populated)
		got = false;
	/* Huge only if nearly all of it is: a mix measures neither. */
	if (huge && anon_huge_kib() - before < (long)(len >> 10) * 9 / 10)
		got = false;
	*touch = TIMED(touch_all(p, dense_idx));
	munmap(raw, span);
	return got;
}

static void round_once(int r, const char *src)
{
	pthread_t th;
	size_t len = npages * page;
	char *fresh;

	/* Written, touched, touched again; dropped and punched. */
	t_step[WRITE][r] = TIMED(write_all(src));
	t_step[FIRST_TOUCH][r] = TIMED(touch_all(map, idx));
	t_step[TOUCH_MAPPED][r] = TIMED(touch_all(map, idx));
	t_step[DROP][r] = TIMED(na[DROP] |= advise_all(MADV_DONTNEED) < 0);
	if (na[DROP])	/* the punch below is timed without entries */
		for (size_t i = 0; i < npages; i++)
			madvise(map + idx[i] * page, page, MADV_DONTNEED);
	t_step[PUNCH][r] = TIMED(punch_all());
	/* Populated first. */
	write_all(src);
	t_step[POPULATE][r] =
		TIMED(na[POPULATE] |= advise_all(MADV_POPULATE_READ) < 0);
	t_step[TOUCH_POPULATED][r] = TIMED(touch_all(map, idx));
	/* Punched with its entries there. */
	t_step[PUNCH_MAPPED][r] = TIMED(punch_all());
	/* Touched by another thread first. */
	write_all(src);
	t_step[THREAD_TOUCH][r] = TIMED(run_thread(&th));
	t_step[TOUCH_AFTER_THREAD][r] = TIMED(touch_all(map, idx));
	punch_all();
	/* Loading: read() into fresh anonymous memory, then touched. */
	fresh = mmap(NULL, len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (fresh == MAP_FAILED) {
		perror("pagecost: mmap");
		exit(1);
	}
	t_step[READ_FRESH][r] = TIMED(read_data(fresh, len));
	t_step[TOUCH_READ][r] = TIMED(touch_all(fresh, dense_idx));
	munmap(fresh, len);
	/* Anonymous memory, 4 KiB pages and 2 MiB pages: whole huge pages,
	 * as many bytes as cover the round's pages. */
	len = (len + HUGE_SIZE - 1) & ~(HUGE_SIZE - 1);
	if (!anon_round(len, false, &t_step[ANON_POPULATE][r],
			&t_step[ANON_TOUCH][r]))
		na[ANON_POPULATE] = na[ANON_TOUCH] = true;
	if (!anon_round(len, true, &t_step[HUGE_POPULATE][r],
			&t_step[HUGE_TOUCH][r]))
		na[HUGE_POPULATE] = na[HUGE_TOUCH] = true;
}

/* --spin: a thread of this process kept busy meanwhile, as a runner's
 * other threads are, so that each TLB flush also reaches another CPU. */
static bool spin;
static atomic_bool spinning;

static void *spin_thread(void *arg)
{
	(void)arg;
	while (atomic_load_explicit(&spinning, memory_order_relaxed))
		__asm__ volatile("" ::: "memory");
	return NULL;
}

enum { OPT_PAGES = 1, OPT_PAGE_SIZE, OPT_ROUNDS, OPT_SPIN };

static const struct sbc_opt opts[] = {
	{OPT_PAGES, "--pages", "N", "pages per round, 64 to 65536 (default 2048)"},
	{OPT_PAGE_SIZE, "--page-size", "SIZE",
	 "a power of two from 4K to 1M (default 8K)"},
	{OPT_ROUNDS, "--rounds", "R", "rounds, 3 to 64 (default 7)"},
	{OPT_SPIN, "--spin", NULL,
	 "keep another thread of the process busy meanwhile"},
	{0},
};

static void parse(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "pagecost",
		.usage = "[options]",
		.about = "What a page read in and released costs the CPU on "
			 "this host, step by step,\nbeside a touch of a page "
			 "already mapped (microseconds a page, medians).",
		.opts = opts,
	};
	const char *v;
	int opt;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			sbc_fail(&cli, "unexpected argument '%s'", v);
		case OPT_PAGES:
			npages = (size_t)sbc_int(&cli, v, 64, 65536);
			break;
		case OPT_PAGE_SIZE:
			page = (size_t)sbc_size(&cli, v, 4096, 1 << 20);
			if (page & (page - 1))
				sbc_fail(&cli, "--page-size %s: not a power of "
					       "two", v);
			break;
		case OPT_ROUNDS:
			rounds = (int)sbc_int(&cli, v, 3, MAX_ROUNDS);
			break;
		case OPT_SPIN:
			spin = true;
			break;
		}
	}
	/* A round holds three times that: the pages in the memfd, the data
	 * read and the fresh memory it is read into. */
	if (npages > ((size_t)256 << 20) / page)
		sbc_fail(&cli, "--pages %zu of %zu KiB: more than 256 MiB a "
			       "round", npages, page >> 10);
}

int main(int argc, char **argv)
{
	pthread_t spinner;
	size_t span;
	int e;
	char *src;
	double base;

	parse(argc, argv);
	span = npages * SPREAD * page;
	memfd = memfd_create("pagecost", MFD_CLOEXEC);
	if (memfd < 0 || ftruncate(memfd, (off_t)span) < 0) {
		perror("pagecost: memfd");
		return 1;
	}
	map = mmap(NULL, span, PROT_READ, MAP_SHARED, memfd, 0);
	idx = malloc(npages * sizeof(*idx));
	dense_idx = malloc(npages * sizeof(*dense_idx));
	iov = malloc(npages * sizeof(*iov));
	src = malloc(page);
	if (map == MAP_FAILED || !idx || !dense_idx || !iov || !src) {
		perror("pagecost");
		return 1;
	}
	memset(src, 0x5a, page);
	/* The data the read step reads: whole pages, not holes. */
	datafd = memfd_create("pagecost-data", MFD_CLOEXEC);
	if (datafd < 0) {
		perror("pagecost: memfd");
		return 1;
	}
	for (size_t i = 0; i < npages; i++)
		if (pwrite(datafd, src, page, (off_t)(i * page)) != (ssize_t)page) {
			perror("pagecost: pwrite");
			return 1;
		}
	for (size_t i = 0; i < npages; i++)
		dense_idx[i] = i;
	/* One page in each SPREAD, at a varying place: neighbours never. */
	srand(1);
	for (size_t i = 0; i < npages; i++) {
		idx[i] = i * SPREAD + 1 + (size_t)rand() % (SPREAD - 2);
		iov[i] = (struct iovec){map + idx[i] * page, page};
	}
	pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	{
		cpu_set_t set;

		if (spin && sched_getaffinity(0, sizeof(set), &set) == 0 &&
		    CPU_COUNT(&set) < 2)
			fprintf(stderr, "pagecost: --spin with one CPU: the "
					"busy thread only takes turns with "
					"this one\n");
	}
	atomic_store(&spinning, spin);
	if (spin && (e = pthread_create(&spinner, NULL, spin_thread, NULL))) {
		fprintf(stderr, "pagecost: pthread_create: %s\n", strerror(e));
		return 1;
	}
	for (int r = 0; r < rounds; r++)
		round_once(r, src);
	if (spin) {
		atomic_store(&spinning, false);
		pthread_join(spinner, NULL);
	}
	na[TOUCH_POPULATED] = na[POPULATE];

	printf("pagecost: %zu pages of %zu KiB, one in %d of a memfd, %d "
	       "rounds%s; microseconds a page (medians, [min-max])\n\n",
	       npages, page >> 10, SPREAD, rounds,
	       spin ? ", another thread busy" : "");
	printf("%-38s %10s %18s %12s\n", "step", "us/page", "[spread]",
	       "x baseline");
	{
		double v[MAX_ROUNDS];

		memcpy(v, t_step[TOUCH_MAPPED], sizeof(v));
		base = median(v, rounds);
	}
	for (int s = 0; s < NSTEPS; s++) {
		double v[MAX_ROUNDS], med;

		if (na[s]) {
			printf("%-38s %10s\n", step_name[s], "n/a");
			continue;
		}
		memcpy(v, t_step[s], sizeof(v));
		med = median(v, rounds);
		printf("%-38s %10.2f   [%6.2f-%6.2f] %11.1fx\n", step_name[s],
		       med, v[0], v[rounds - 1], base > 0 ? med / base : 0.0);
	}
	free(src);
	free(iov);
	free(dense_idx);
	free(idx);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "pagecost: writing the report: %s\n",
			strerror(errno));
		return 1;
	}
	return 0;
}
