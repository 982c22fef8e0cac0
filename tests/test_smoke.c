/* Smoke test: the whole path once. Place explicitly, fault on touch,
 * share with copy-on-write, unmap, destroy; accounting at each step. */
#include "harness.h"

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	struct sb_pool *p;
	struct sb_buf *a, *b;
	struct sb_stats st;
	char *x, *y;

	require_uffd();
	p = make_pool(256 * KiB, 64 * MiB, 0);
	a = make_buf(p, HUGE_BUF, 0);
	x = sb_buf_addr(a);
	CHECK(((uintptr_t)x & (256 * KiB - 1)) == 0);
	CHECK_EQ(sb_buf_map(a, 0, 1 * MiB), 4);
	CHECK_EQ(sb_buf_map(a, 0, 1 * MiB), 0);
	x[0] = 1;
	x[1 * MiB - 1] = 2;
	st = stats(p);
	CHECK_EQ(st.pages_used, 4);
	CHECK_EQ(st.maps, 4);
	/* Demand placement. */
	x[10 * MiB] = 3;
	CHECK_EQ(x[10 * MiB], 3);
	CHECK_EQ(x[10 * MiB + 1], 0);
	st = stats(p);
	CHECK_EQ(st.pages_used, 5);
	CHECK(st.faults >= 1);
	CHECK_EQ(st.fault_places, 1);
	/* Sharing. */
	b = make_buf(p, 1 * GiB, 0);
	y = sb_buf_addr(b);
	CHECK_EQ(sb_buf_share(b, 0, a, 0, 1 * MiB), 4);
	CHECK_EQ(y[0], 1);
	CHECK_EQ(y[1 * MiB - 1], 2);
	st = stats(p);
	CHECK_EQ(st.pages_used, 5);
	y[0] = 9;	/* copy-on-write in b */
	CHECK_EQ(y[0], 9);
	CHECK_EQ(x[0], 1);
	CHECK_EQ(y[1 * MiB - 1], 2);
	st = stats(p);
	CHECK_EQ(st.pages_used, 6);
	CHECK_EQ(st.cow_copies, 1);
	x[1 * MiB - 1] = 7;	/* copy-on-write in a */
	CHECK_EQ(y[1 * MiB - 1], 2);
	CHECK_EQ(x[1 * MiB - 1], 7);
	st = stats(p);
	CHECK_EQ(st.pages_used, 7);
	CHECK_EQ(st.cow_copies, 2);
	CHECK_EQ(sb_buf_unmap(a, 0, 1 * GiB), 5);
	CHECK_EQ(x[0], 0);	/* a new zero page on demand */
	st = stats(p);
	CHECK_EQ(st.pages_used, 4 + 1);
	sb_buf_destroy(b);
	sb_buf_destroy(a);
	st = stats(p);
	CHECK_EQ(st.pages_used, 0);
	CHECK(sb_pool_trim(p) >= 0);
	st = stats(p);
	CHECK_EQ(st.bytes_resident, 0);
	CHECK_EQ(st.heaps, 0);
	sb_pool_destroy(p);
	printf("smoke ok\n");
	return 0;
}
