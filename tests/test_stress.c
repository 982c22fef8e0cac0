/* Long runs: one million map/unmap cycles (or as many as 40 s allow, at
 * least 100k) leave no leak (pool usage back to zero, resident memory
 * bounded, the number of mappings bounded), and a steady state of growth
 * and release does not fragment the address space. */
#include "harness.h"

static int child(const char *name)
{
	(void)name;
	return 2;
}

static long cycles(void)
{
	const char *e = getenv("SB_STRESS_CYCLES");

	if (e)
		return atol(e);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	return 100000;	/* same code paths, slower instrumentation */
#else
	return 1000000;
#endif
}

static int main_test(void)
{
	size_t page = 64 * KiB;
	struct sb_pool *p;
	struct sb_buf *b;
	struct sb_stats st;
	long n = cycles(), maps0, bufmaps = 0;
	size_t max_resident = 0;
	char *x;
	double t0;

	require_uffd();
	p = make_pool(page, 4 * MiB, 0);
	b = make_buf(p, 1 * GiB, 0);
	x = sb_buf_addr(b);
	maps0 = maps_total();
	t0 = now_s();
	for (long i = 0; i < n; i++) {
		/* A window of 8 pages sliding over 64: map the head, touch
		 * it, release the tail, as a sliding-window cache does. */
		if (i % 1000 == 0 && i >= 100000 && now_s() - t0 > 40) {
			/* A host that shadows page tables takes 140 us a
			 * cycle (5 us elsewhere): enough after 40 s. Every
			 * cycle leaves 7 pages placed, as the last would. */
			printf("  stopped after %ld cycles, 40 s\n", i);
			n = i;
			break;
		}
		size_t head = (size_t)(i % 64) * page;
		size_t tail = (size_t)((i + 57) % 64) * page;

		if (sb_buf_map(b, head, page) != 1)
			FAIL("cycle %ld: map failed", i);
		x[head + (size_t)(i % 1000)] = 1;
		if (i >= 7 && sb_buf_unmap(b, tail, page) != 1)
			FAIL("cycle %ld: unmap failed", i);
		if (i >= 7 && (i % 100000 == 7 || i == n - 1)) {
			long m = maps_in(x, 1 * GiB);

			st = stats(p);
			if (st.bytes_resident > max_resident)
				max_resident = st.bytes_resident;
			if (m > bufmaps)
				bufmaps = m;
			CHECK_EQ(st.pages_used, 7);
			VERIFY(p);
			CHECK(m <= 2 * 8 + 2);
			CHECK(maps_total() <= maps0 + 2 * 8 + MAPS_SLACK);
			/* Progress, every 100k cycles (a few seconds). */
			printf("  %ld of %ld cycles, %.1f s\n", i, n,
			       now_s() - t0);
		}
	}
	CHECK_EQ(sb_buf_unmap(b, 0, 1 * GiB), 7);
	st = stats(p);
	CHECK_EQ(st.pages_used, 0);
	CHECK_EQ(st.maps, (uint64_t)n);
	CHECK_EQ(st.unmaps, (uint64_t)n);
	/* Resident memory: the pages in use plus the ready reserve (at most
	 * 64 MiB), never growing with the cycle count. */
	CHECK(max_resident <= 8 * page + 64 * MiB + 8 * page);
	printf("%ld map/unmap cycles in %.1f s (%.1f us per cycle), at most %ld "
	       "mappings in the buffer, resident at most %zu KiB\n",
	       n, now_s() - t0, (now_s() - t0) * 1e6 / (double)n, bufmaps,
	       max_resident / 1024);
	sb_buf_destroy(b);
	CHECK(sb_pool_trim(p) >= 0);
	CHECK_EQ(stats(p).bytes_resident, 0);
	CHECK_EQ(stats(p).heaps, 0);
	/* And stays so: the ready thread (awake, polling after the cycles)
	 * has nothing left that it was asked for, not even the site of a
	 * next run, for which it would create a heap. */
	usleep(50000);
	CHECK_EQ(stats(p).bytes_resident, 0);
	CHECK_EQ(stats(p).heaps, 0);
	sb_pool_destroy(p);
	return 0;
}
