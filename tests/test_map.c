/* Explicit placement: sb_buf_map / sb_buf_unmap semantics, contents,
 * terabyte buffers costing nothing, merged mappings, every page size, a
 * thousand buffers at once, strict buffers. */
#include "harness.h"

static long rss_kib(void)
{
	char line[256];
	long v = -1;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

static int child(const char *name)
{
	struct sb_pool *p = make_pool(64 * KiB, 4 * MiB, 0);
	struct sb_buf *b = make_buf(p, 1 * GiB, SB_BUF_STRICT);
	volatile char *x = sb_buf_addr(b);

	if (sb_buf_map(b, 0, 64 * KiB) != 1)
		return 3;
	x[100] = 1;	/* placed: fine */
	if (!strcmp(name, "strict-unplaced")) {
		expect_signal_at((char *)x + 5 * MiB, 64 * KiB);
		x[5 * MiB + 7] = 1;
		return 4;	/* no SIGBUS */
	}
	if (!strcmp(name, "strict-unmapped")) {
		/* Placed, then released: a strict buffer faults again. */
		if (sb_buf_unmap(b, 0, 64 * KiB) != 1)
			return 5;
		expect_signal_at((char *)x, 64 * KiB);
		(void)x[100];
		return 4;
	}
	return 2;
}

/* Map then unmap one buffer in a pool of the given geometry. */
static void page_size_case(size_t page, size_t heap)
{
	struct sb_pool *p = make_pool(page, heap, 0);
	size_t len = 16 * page < 64 * MiB ? 64 * MiB : 16 * page;
	struct sb_buf *b = make_buf(p, len, 0);
	char *x = sb_buf_addr(b);
	size_t n = len / page;
	long m;

	CHECK(((uintptr_t)x & (page - 1)) == 0);	/* aligned to a page */
	CHECK_EQ(sb_buf_map(b, 0, len), (long)n);
	for (size_t i = 0; i < n; i++)
		memset(x + i * page, (int)(i % 100) + 1, 64);
	for (size_t i = 0; i < n; i++)
		CHECK_EQ(x[i * page + 63], (int)(i % 100) + 1);
	/* Consecutive heap pages: the kernel merges them into few VMAs. */
	m = maps_in(x, len);
	if (m > (long)(len / heap) + 2)
		FAIL("page %zu heap %zu: %ld mappings for %zu pages", page,
		     heap, m, n);
	CHECK_EQ(stats(p).pages_used, n);
	CHECK_EQ(sb_buf_unmap(b, 0, len), (long)n);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(x[0], 0);	/* demand placement gives a zero page */
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static int main_test(void)
{
	size_t page = 256 * KiB;
	struct sb_pool *p;
	struct sb_buf *b;
	struct sb_stats st;
	char *x, *addr;
	long rss0;

	require_uffd();
	p = make_pool(page, 64 * MiB, 0);

	/* Terabytes of address space cost nothing. */
	rss0 = rss_kib();
	b = make_buf(p, HUGE_BUF, 0);
	x = addr = sb_buf_addr(b);
	CHECK_EQ(sb_buf_length(b), HUGE_BUF);
	CHECK_EQ(sb_buf_map(b, HUGE_BUF - page, page), 1);
	x[HUGE_BUF - 1] = 42;
	CHECK_EQ(sb_buf_map(b, HUGE_BUF / 4 + 5, 1), 1);
	x[HUGE_BUF / 4 + 5] = 43;
	CHECK(rss_kib() - rss0 < 16 * 1024);
	st = stats(p);
	CHECK_EQ(st.pages_used, 2);
	CHECK(st.bytes_resident >= 2 * page);
	CHECK_EQ(x[HUGE_BUF - 1], 42);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);

	/* Return values: pages newly placed, pages wholly released. */
	b = make_buf(p, 64 * MiB, 0);
	x = sb_buf_addr(b);
	CHECK_EQ(sb_buf_map(b, 0, 1), 1);
	CHECK_EQ(sb_buf_map(b, 0, page), 0);
	CHECK_EQ(sb_buf_map(b, page - 1, 2), 1);	/* spans pages 0, 1 */
	CHECK_EQ(sb_buf_map(b, 0, 4 * page), 2);
	CHECK_EQ(sb_buf_placed(b, 0, 64 * MiB), 4);
	CHECK_EQ(sb_buf_placed(b, page + 1, 1), 1);
	CHECK_EQ(sb_buf_unmap(b, 1, 2 * page), 1);	/* only page 1 inside */
	CHECK_EQ(sb_buf_placed(b, 0, 4 * page), 3);
	CHECK_EQ(sb_buf_unmap(b, page, page), 0);	/* already released */
	CHECK_EQ(sb_buf_map(b, 0, 8 * page), 5);	/* holes filled */
	/* Contents stay until released, then read as zeros. */
	memset(x, 0x5a, 8 * page);
	CHECK_EQ(sb_buf_unmap(b, 2 * page, page), 1);
	CHECK_EQ(x[2 * page + 10], 0);	/* a fresh zero page (fault) */
	CHECK_EQ((unsigned char)x[3 * page], 0x5a);
	CHECK_EQ((unsigned char)x[page - 1], 0x5a);
	CHECK(sb_buf_addr(b) == x);	/* the address never changes */
	CHECK_EQ(sb_buf_unmap(b, 0, 64 * MiB), 8);
	CHECK_EQ(stats(p).pages_used, 0);

	/* Growth one page at a time merges into one mapping. */
	for (size_t i = 0; i < 200; i++)
		CHECK_EQ(sb_buf_map(b, i * page, page), 1);
	CHECK(maps_in(x, 64 * MiB) <= 3);	/* placed + the unplaced rest */
	VERIFY(p);
	sb_buf_destroy(b);

	/* A thousand buffers alive at once. */
	{
		enum { NBUF = 1000 };
		static struct sb_buf *bufs[NBUF];

		for (int i = 0; i < NBUF; i++) {
			bufs[i] = make_buf(p, 1 * GiB, 0);
			CHECK_EQ(sb_buf_map(bufs[i], (size_t)i * MiB, 1), 1);
			((int *)sb_buf_addr(bufs[i]))[(size_t)i * MiB / 4] = i;
		}
		CHECK_EQ(stats(p).pages_used, NBUF);
		VERIFY(p);
		for (int i = 0; i < NBUF; i++)
			CHECK_EQ(((int *)sb_buf_addr(bufs[i]))[(size_t)i * MiB /
								4],
				 i);
		for (int i = 0; i < NBUF; i += 2)
			sb_buf_destroy(bufs[i]);
		CHECK_EQ(stats(p).pages_used, NBUF / 2);
		for (int i = 1; i < NBUF; i += 2)
			sb_buf_destroy(bufs[i]);
		CHECK_EQ(stats(p).pages_used, 0);
	}
	sb_pool_destroy(p);

	/* Every page size from 4 KiB to the heap size. */
	page_size_case(4 * KiB, 1 * MiB);
	page_size_case(16 * KiB, 64 * MiB);
	page_size_case(64 * KiB, 64 * MiB);
	page_size_case(256 * KiB, 4 * MiB);
	page_size_case(2 * MiB, 64 * MiB);
	page_size_case(8 * MiB, 8 * MiB);

	/* Strict buffers: a touch of an unplaced page raises SIGBUS. */
	CHECK_EQ(child_exit_code(run_child("strict-unplaced")),
		 EXIT_GOT_SIGBUS);
	CHECK_EQ(child_exit_code(run_child("strict-unmapped")),
		 EXIT_GOT_SIGBUS);
	printf("placement: ok\n");
	return 0;
}
