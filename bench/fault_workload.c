/* SPDX-License-Identifier: MIT */
/*
 * A workload with known fault counts, for bench/perf-faults.sh:
 *   N pages grown by touching them (demand faults, one per page),
 *   M pages placed with sb_buf_map (which may fill their page tables
 *   by read faults on the calling thread, counted in map_faults), then
 *   all released,
 *   K pages shared into a second buffer and written through it
 *   (K copy-on-write faults),
 * and, for comparison, the same N pages of plain anonymous memory touched
 * every 4 KiB (the kernel's demand paging: one fault per 4 KiB).
 * It prints the library's counters as key=value lines on stdout.
 *
 * Usage: fault_workload [--pages N] [--maps M] [--cow K] [--anon]
 *                       [--wait FIFO]
 *        fault_workload --help | --version
 *   --anon  touch only the anonymous memory (the kernel's demand paging)
 *   --wait  once set up (pool threads started), block until a byte can be
 *           read from FIFO: perf-faults.sh attaches perf meanwhile
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli.h"
#include "sparsebuf.h"

enum { OPT_PAGES = 1, OPT_MAPS, OPT_COW, OPT_ANON, OPT_WAIT };

static const struct sbc_opt opts[] = {
	{OPT_PAGES, "--pages", "N", "pages grown by touch (default 256)"},
	{OPT_MAPS, "--maps", "M", "pages placed with sb_buf_map (default "
				  "256)"},
	{OPT_COW, "--cow", "K", "pages shared and written through (default "
				"64)"},
	{OPT_ANON, "--anon", NULL, "only anonymous memory (the kernel's "
				   "demand paging)"},
	{OPT_WAIT, "--wait", "FIFO", "once set up, wait for a byte from "
				     "FIFO (perf attaches)"},
	{0},
};

int main(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "fault_workload",
		.usage = "[options]",
		.about = "A workload with known fault counts for "
			 "bench/perf-faults.sh; the library's\ncounters as "
			 "key=value lines on stdout.",
		.opts = opts,
	};
	long n = 256, m = 256, k = 64;
	int anon = 0, err, opt;
	const char *fifo = NULL, *v;
	struct sb_pool_opts o;
	struct sb_pool *pool;
	struct sb_buf *a, *b;
	struct sb_stats st;
	size_t page;
	char *x, *y;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			sbc_fail(&cli, "unexpected argument '%s'", v);
		case OPT_PAGES:
			n = (long)sbc_int(&cli, v, 0, 1 << 20);
			break;
		case OPT_MAPS:
			m = (long)sbc_int(&cli, v, 0, 1 << 20);
			break;
		case OPT_COW:
			k = (long)sbc_int(&cli, v, 0, 1 << 20);
			break;
		case OPT_ANON:
			anon = 1;
			break;
		case OPT_WAIT:
			/* A FIFO on purpose: the open blocks until
			 * perf-faults.sh writes to it. */
			fifo = v;
			break;
		}
	}
	sb_pool_opts_init(&o);
	page = o.page_size ? o.page_size : 256 << 10;
	pool = sb_pool_create(&o, &err);
	if (!pool) {
		fprintf(stderr, "sb_pool_create: %s\n", strerror(-err));
		return 1;
	}
	if (anon) {
		x = mmap(NULL, (size_t)n * page + 1, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (x == MAP_FAILED)
			return 1;
		a = b = NULL;
		y = x;
	} else {
		/* One spare page so the baseline run (all 0) has buffers. */
		a = sb_buf_create(pool, (size_t)(n + m + k + 1) * page, 0, &err);
		b = sb_buf_create(pool, (size_t)(k + 1) * page, 0, &err);
		if (!a || !b)
			return 1;
		x = sb_buf_addr(a);
		y = sb_buf_addr(b);
	}
	/* Where faults count: perf-faults.sh filters the kernel's fault
	 * tracepoint to these ranges. */
	fprintf(stderr, "ranges=%p %p %p %p\n", (void *)x,
		(void *)(x + (a ? sb_buf_length(a) : (size_t)n * page)),
		(void *)y, (void *)(y + (b ? sb_buf_length(b) : 0)));
	if (fifo) {
		char go;
		int fd = open(fifo, O_RDONLY);

		if (fd < 0 || read(fd, &go, 1) != 1)
			return 1;
		close(fd);
	}
	if (anon) {
		for (size_t off = 0; off < (size_t)n * page; off += 4096)
			x[off] = 1;
		printf("anon_pages=%ld\nanon_expected_faults=%zu\n", n,
		       (size_t)n * page / 4096);
		return 0;
	}
	/* Demand: every 4 KiB of N pages; one fault per page. */
	for (size_t off = 0; off < (size_t)n * page; off += 4096)
		x[off] = 1;
	/* Explicit: M pages, touched (no faults: sb_buf_map filled their
	 * page tables, by read faults of its own, map_faults), then
	 * released. */
	if (sb_buf_map(a, (size_t)n * page, (size_t)m * page) != m)
		return 1;
	memset(x + (size_t)n * page, 2, (size_t)m * page);
	/* Copy-on-write: K pages shared, then written through b. */
	if (sb_buf_map(a, (size_t)(n + m) * page, (size_t)k * page) != k ||
	    sb_buf_share(b, 0, a, (size_t)(n + m) * page, (size_t)k * page) !=
		    k)
		return 1;
	for (long i = 0; i < k; i++)
		y[(size_t)i * page] = 3;
	if (sb_buf_unmap(a, 0, (size_t)(n + m + k) * page) != n + m + k)
		return 1;
	/* Pages released by sharing over them and by destroying a buffer
	 * count as unmaps too (and fire the probe): one page placed in a's
	 * spare slot is shared over b's first copy, then both go. */
	if (sb_buf_map(a, (size_t)(n + m + k) * page, page) != 1 ||
	    (k && sb_buf_share(b, 0, a, (size_t)(n + m + k) * page, page) != 1))
		return 1;
	sb_buf_destroy(b);
	sb_buf_destroy(a);
	sb_pool_stats(pool, &st);
	printf("page_size=%zu\nfaults=%llu\nfault_places=%llu\nmaps=%llu\n"
	       "unmaps=%llu\ncow_copies=%llu\nmap_faults=%llu\n"
	       "thread_faults=%llu\nexpected_faults=%ld\n",
	       page, (unsigned long long)st.faults,
	       (unsigned long long)st.fault_places,
	       (unsigned long long)st.maps, (unsigned long long)st.unmaps,
	       (unsigned long long)st.cow_copies,
	       (unsigned long long)st.map_faults,
	       (unsigned long long)(st.faults + st.map_faults), n + k);
	sb_pool_destroy(pool);
	return 0;
}
