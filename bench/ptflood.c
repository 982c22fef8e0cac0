/* SPDX-License-Identifier: MIT */
/*
 * bench/ptflood: page-directory writes on a host that shadows the guest's
 * page tables (PVM, the AMD EPYC hosts of this kind; design.md, "Page
 * tables on a shadow-paging host").
 *
 * bench/kv's KV cache has 72 regions (a K and a V per layer) that cross a
 * page boundary within a few tokens of each other, and the pool places the
 * next page of each back to back. This benchmark does the same: 72 regions
 * 16 MiB apart grow a page at a time, a round placing the next page of
 * every region together and then writing each 4 KiB of them once (the
 * decoding thread's first writes). After each round the previous round's
 * pages, written already, are written again, and that is timed: a few
 * microseconds normally. A round whose pages start a new 2 MiB needs a new
 * page table in every region, which writes 72 entries of one page
 * directory (one per gigabyte). A hypervisor with KVM's write-flooding
 * heuristic drops that directory's whole shadow when it sees several such
 * writes in a row with no fault through it, and the rewrite then pays a
 * first access for every 4 KiB, as do the decoding thread and attention.
 *
 * Two ways, in one run, over the same geometry:
 *   mmap            one mmap(MAP_FIXED | MAP_POPULATE) of a memfd page per
 *                   region (how sparsebuf placed a page before 2026-11-29)
 *   sparsebuf       sb_buf_map of the page, in each of 72 buffers
 * For each: the median rewrite after rounds within page tables that exist,
 * the median after rounds that start new ones, and their ratio. Target:
 * sparsebuf's ratio <= 2 (exit status 3 when missed). Without shadow
 * paging both ratios are near 1.
 *
 *   ptflood [--rounds N]
 *   ptflood --help | --version
 */
#include "bench.h"
#include "cli.h"
#include "sparsebuf.h"

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define REGIONS 72
#define REGION_BYTES ((size_t)16 << 20)
#define TABLE_SPAN ((size_t)2 << 20)

static int rounds = 64;
static size_t page;

/* One way of placing page p of region g. */
struct way {
	const char *name;
	char *base[REGIONS];
	int (*place)(struct way *w, int g, int p);
	/* mmap: */
	int fd;
	/* sparsebuf: */
	struct sb_buf *buf[REGIONS];
};

static int place_mmap(struct way *w, int g, int p)
{
	off_t off = ((off_t)g * rounds + p) * (off_t)page;

	return mmap(w->base[g] + (size_t)p * page, page,
		    PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
		    w->fd, off) == MAP_FAILED
		       ? -errno
		       : 0;
}

static int place_sparsebuf(struct way *w, int g, int p)
{
	long r = sb_buf_map(w->buf[g], (size_t)p * page, page);

	return r < 0 ? (int)r : 0;
}

static void write_page(struct way *w, int g, int p, char v)
{
	char *q = w->base[g] + (size_t)p * page;

	for (size_t o = 0; o < page; o += 4096)
		*(volatile char *)(q + o) = v;
}

/*
 * Grow every region by `rounds` pages. Returns, in us, the median rewrite
 * of the previous round's pages after rounds within existing page tables
 * (*same) and after rounds that started new ones (*fresh).
 */
static int run(struct way *w, double *same, double *fresh)
{
	double s[256], f[256];
	int ns = 0, nf = 0;

	for (int p = 0; p < rounds; p++) {
		double t0;

		for (int g = 0; g < REGIONS; g++) {
			int r = w->place(w, g, p);

			if (r < 0) {
				fprintf(stderr, "%s: placing: %s\n", w->name,
					strerror(-r));
				return -1;
			}
		}
		for (int g = 0; g < REGIONS; g++)
			write_page(w, g, p, 1);
		if (p == 0)
			continue;
		t0 = bench_now_us();
		for (int g = 0; g < REGIONS; g++)
			write_page(w, g, p - 1, 2);
		t0 = bench_now_us() - t0;
		if ((size_t)p * page % TABLE_SPAN == 0)
			f[nf++] = t0;
		else
			s[ns++] = t0;
	}
	*same = median(s, ns);
	*fresh = median(f, nf);
	return 0;
}

/* 72 regions of 16 MiB, each 2 MiB-aligned, in one reservation. */
static int setup_mmap(struct way *w)
{
	size_t len = REGIONS * REGION_BYTES + TABLE_SPAN;
	char *p = mmap(NULL, len, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED)
		return -errno;
	p = (char *)(((uintptr_t)p + TABLE_SPAN - 1) & ~(TABLE_SPAN - 1));
	for (int g = 0; g < REGIONS; g++)
		w->base[g] = p + (size_t)g * REGION_BYTES;
	w->fd = memfd_create("ptflood", MFD_CLOEXEC);
	if (w->fd < 0)
		return -errno;
	if (ftruncate(w->fd, (off_t)REGIONS * rounds * (off_t)page) < 0)
		return -errno;
	return 0;
}

static int setup_sparsebuf(struct way *w, struct sb_pool *pool)
{
	for (int g = 0; g < REGIONS; g++) {
		int err;

		w->buf[g] = sb_buf_create(pool, REGION_BYTES, 0, &err);
		if (!w->buf[g])
			return err;
		w->base[g] = sb_buf_addr(w->buf[g]);
	}
	return 0;
}

enum { OPT_ROUNDS = 1 };

static const struct sbc_opt opts[] = {
	{OPT_ROUNDS, "--rounds", "N",
	 "pages grown per region, 16 to 64 (default 64)"},
	{0},
};

static void parse(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "ptflood",
		.usage = "[options]",
		.about = "Page-directory writes on a shadow-paging host: the "
			 "rewrite of pages written\nbefore, after 72 regions "
			 "each get a new page table, with mmap(MAP_POPULATE)\n"
			 "and with sparsebuf. Exit status 3 when a target is "
			 "missed.",
		.opts = opts,
	};
	const char *v;
	int opt;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			sbc_fail(&cli, "unexpected argument '%s'", v);
		case OPT_ROUNDS:
			rounds = (int)sbc_int(&cli, v, 16, 64);
			break;
		}
	}
}

int main(int argc, char **argv)
{
	struct way ways[2] = {{.name = "mmap(MAP_POPULATE) (baseline)",
			       .place = place_mmap},
			      {.name = "sparsebuf sb_buf_map",
			       .place = place_sparsebuf}};
	double same[2], fresh[2];
	struct sb_features f;
	struct sb_pool_opts o;
	struct sb_stats st;
	struct sb_pool *pool;
	int err, r;

	parse(argc, argv);
	sb_pool_opts_init(&o);
	/* As much memory as both ways place, without waiting on the
	 * budget. */
	pool = sb_pool_create(&o, &err);
	if (!pool || sb_pool_stats(pool, &st) < 0) {
		fprintf(stderr, "sb_pool_create: %s\n", strerror(-err));
		return 1;
	}
	page = st.page_size;
	if (page > TABLE_SPAN || (size_t)rounds * page > REGION_BYTES) {
		fprintf(stderr, "ptflood: a page of %zu bytes does not fit "
				"this benchmark's geometry\n", page);
		return 1;
	}
	r = setup_mmap(&ways[0]);
	if (r == 0)
		r = setup_sparsebuf(&ways[1], pool);
	if (r < 0) {
		fprintf(stderr, "ptflood: setup: %s\n", strerror(-r));
		return 1;
	}
	for (int i = 0; i < 2; i++)
		if (run(&ways[i], &same[i], &fresh[i]) < 0)
			return 1;

	sb_features_get(&f);
	printf("ptflood: %d regions, %d pages of %zu KiB each; the previous "
	       "round's pages (%zu x 4 KiB)\nwritten again after each round "
	       "of placements (first access to a newly mapped 4 KiB: %ld "
	       "ns)\n\n",
	       REGIONS, rounds, page >> 10,
	       (size_t)REGIONS * (page / 4096), f.first_access_ns);
	printf("%-32s %14s %18s %8s   %s\n", "way", "same tables us",
	       "new tables us", "ratio", "target");
	for (int i = 0; i < 2; i++) {
		double ratio = fresh[i] / same[i];

		printf("%-32s %14.1f %18.1f %7.1fx   %s\n", ways[i].name,
		       same[i], fresh[i], ratio,
		       i == 0 ? "" : ratio <= 2.0 ? "<= 2x   PASS"
						  : "<= 2x   FAIL");
	}
	printf("sparsebuf against the baseline after new tables: %.3fx\n",
	       fresh[1] / fresh[0]);
	for (int g = 0; g < REGIONS; g++)
		sb_buf_destroy(ways[1].buf[g]);
	sb_pool_destroy(pool);
	return fresh[1] / same[1] <= 2.0 ? 0 : 3;
}
