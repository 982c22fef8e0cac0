/* SPDX-License-Identifier: MIT */
/*
 * Placed pages' page tables filled by fault-around (vma.c, fill_by_faults):
 * after sb_buf_map, every 4 KiB of the page can be read and written with
 * no fault on the calling thread; the faults sb_buf_map itself took are
 * exactly the ones counted in map_faults, a read every fault_around_pages
 * (4 per 256 KiB page where the kernel maps 16 pages a fault); the pages
 * hold zeros, then what was written, at every page size. A placement by
 * fault (the handler fills the page tables on its own thread) leaves the
 * owner one fault per page. Where the kernel maps fewer than 16 pages a
 * fault, or the host makes a first access slow, pools use MAP_POPULATE
 * and the test checks that instead: no fault on the caller after the map,
 * map_faults 0. With huge shmem folios one fault may map a whole 2 MiB:
 * the counts are bounds then. A prefetch the caller waits for counts its
 * faults too. A run across 2 MiB boundaries (several page tables) is
 * filled whole.
 */
#include "harness.h"

#include <sys/resource.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static int child(const char *name)
{
	(void)name;
	return 2;
}

static long thread_faults(void)
{
	struct rusage r;

	if (getrusage(RUSAGE_THREAD, &r) < 0)
		FAIL("getrusage");
	return r.ru_minflt + r.ru_majflt;
}

/* shmem_enabled gives folios larger than 4 KiB (tests/test_folios.c and
 * make test-folios set it). */
static bool huge_folios;

/* Aligned windows of w bytes that [a, a + len) overlaps. */
static long windows(uintptr_t a, size_t len, size_t w)
{
	return (long)(((a + len + w - 1) / w) - a / w);
}

/* Place pages [first, first + n) of b with sb_buf_map; check the faults
 * taken then and after, and the contents. by_faults: the pool fills by
 * fault-around, with fa pages a fault. */
static void map_and_write(struct sb_pool *p, struct sb_buf *b, size_t page,
			  size_t first, size_t n, bool by_faults, long fa)
{
	volatile char *x = (char *)sb_buf_addr(b) + first * page;
	size_t len = n * page;
	uint64_t mf0 = stats(p).map_faults;
	long f0, f1, f2;
	long want;

	f0 = thread_faults();
	CHECK_EQ(sb_buf_map(b, first * page, len), (long)n);
	f1 = thread_faults();
	/* A read in each window of fa pages the range overlaps: the kernel
	 * maps the window around the fault. Where shmem gives the heaps
	 * huge folios, one fault may map a whole 2 MiB (a PMD): at most
	 * that many then, at least one. */
	want = by_faults ? windows((uintptr_t)x, len, (size_t)fa * 4096) : 0;
	/* The library's own first touches of its bookkeeping (a heap's
	 * tables) are faults of this thread too, outside the buffer. */
	if (!huge_folios) {
		CHECK(f1 - f0 >= want);
		CHECK_EQ(stats(p).map_faults - mf0, (uint64_t)want);
	} else {
		CHECK(stats(p).map_faults - mf0 <= (uint64_t)want);
		CHECK(stats(p).map_faults - mf0 >= (uint64_t)(want > 0));
		CHECK(f1 - f0 >= (long)(stats(p).map_faults - mf0));
	}
	for (size_t o = 0; o < len; o += 4096)
		CHECK_EQ(x[o], 0);
	for (size_t o = 0; o < len; o += 4096)
		x[o + o / 4096 % 4000] = (char)(1 + o / 4096 % 200);
	f2 = thread_faults();
	CHECK_EQ(f2 - f1, 0);	/* written through entries already there */
	for (size_t o = 0; o < len; o += 4096)
		CHECK_EQ(x[o + o / 4096 % 4000], (char)(1 + o / 4096 % 200));
}

static void page_size_case(size_t page, bool by_faults, long fa)
{
	struct sb_pool *p = make_pool(page, 64 * page > 4 * MiB ? 64 * page
							       : 4 * MiB,
				      0);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);

	/* One page, then a run of three (one mapping), then one far off. */
	map_and_write(p, b, page, 0, 1, by_faults, fa);
	map_and_write(p, b, page, 1, 3, by_faults, fa);
	map_and_write(p, b, page, 100, 1, by_faults, fa);
	/* A run across page tables, starting a page before a 2 MiB
	 * boundary: populated a table at a time (vma.c, populate_walked),
	 * every part of it. */
	map_and_write(p, b, page, 64 * MiB / page - 1, 2 * MiB / page + 2,
		      by_faults, fa);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* A prefetch the caller waits for places the pages on the caller's
 * thread: its faults count too, and the pages are complete after it. */
static void prefetch_wait(size_t page, long fa)
{
	struct sb_pool *p = make_pool(page, 4 * MiB, 0);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	volatile char *x = sb_buf_addr(b);
	struct sb_range r = {8 * page, 4 * page};
	long f0, f1, want = windows((uintptr_t)x + 8 * page, 4 * page,
				     (size_t)fa * 4096);
	uint64_t mf0 = stats(p).map_faults;

	CHECK_EQ(sb_buf_prefetch(b, &r, 1, SB_PREFETCH_WAIT), 4);
	CHECK_EQ(sb_buf_placed(b, 8 * page, 4 * page), 4);
	if (!huge_folios)
		CHECK_EQ(stats(p).map_faults - mf0, (uint64_t)want);
	f0 = thread_faults();
	for (size_t o = 0; o < 4 * page; o += 4096)
		x[8 * page + o] = 9;
	f1 = thread_faults();
	CHECK_EQ(f1 - f0, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* Growth by touch: the handler thread fills the page tables, so the owner
 * takes its one fault a page and nothing more, and map_faults stays 0. */
static void by_fault(size_t page)
{
	struct sb_pool *p = make_pool(page, 4 * MiB, 0);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	volatile char *x = sb_buf_addr(b);
	long f0 = thread_faults();

	for (size_t i = 0; i < 4; i++)
		for (size_t o = 0; o < page; o += 4096)
			x[i * page + o] = 7;
	CHECK_EQ(thread_faults() - f0, 4);
	CHECK_EQ(stats(p).faults, 4);
	CHECK_EQ(stats(p).map_faults, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static int main_test(void)
{
	struct sb_features f;
	const char *touch;
	bool by_faults, touched;

	require_uffd();
	CHECK_EQ(sb_features_get(&f), 0);
	/* The probe reads what the kernel maps around one read fault: 16
	 * pages unless fault_around_bytes was changed; never more than the
	 * 64 it looks at. */
	CHECK(f.fault_around_pages >= 0 && f.fault_around_pages <= 64);
	/* As pool_life.c decides (SPARSEBUF_TOUCH: 1, 0 or auto). */
	touch = getenv("SPARSEBUF_TOUCH");
	touched = touch && *touch && strcmp(touch, "auto")
			  ? strcmp(touch, "0") != 0
			  : f.first_access_ns > 1000;
	by_faults = f.fault_around_pages >= 16 && !touched;
	printf("fault-around: %ld pages a read fault; placements fill page "
	       "tables %s\n",
	       f.fault_around_pages,
	       by_faults ? "by read faults" : "with MAP_POPULATE");
	huge_folios = shmem_folios_big();
	if (SANITIZED)
		SKIP("fault counts: the sanitizer's shadow memory faults in "
		     "on this thread too");
	page_size_case(4 * KiB, by_faults, f.fault_around_pages);
	page_size_case(64 * KiB, by_faults, f.fault_around_pages);
	page_size_case(256 * KiB, by_faults, f.fault_around_pages);
	page_size_case(2 * MiB, by_faults, f.fault_around_pages);
	if (by_faults)
		prefetch_wait(256 * KiB, f.fault_around_pages);
	by_fault(256 * KiB);
	printf("ok\n");
	return 0;
}
