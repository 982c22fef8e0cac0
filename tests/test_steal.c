/* SPDX-License-Identifier: MIT */
/*
 * An owner that outran its growth watch (sb_buf_map or a touch of the
 * page after its last, in an SB_BUF_GROWS buffer) and whose run's next
 * page is not ready takes a ready page from elsewhere instead of zeroing
 * one on its own thread or the fault handler's (pool.c, steal_ready): two
 * per buffer, and one more per 32 pages allocated for it, since each
 * costs mappings. Nothing else steals: a buffer without SB_BUF_GROWS,
 * several pages at once, a first page. The ready thread is held still (as sb_pool_trim does) so that the
 * run's next page stays unprepared.
 */
#include "harness.h"
#include "internal.h"

#define PAGE (256 * KiB)
#define FLOOR 16	/* ready pages before the ready thread is held */

static void hold_ready(struct sb_pool *p, bool hold)
{
	pthread_mutex_lock(&p->lock);
	if (hold)
		p->trimming++;
	else
		p->trimming--;
	pthread_mutex_unlock(&p->lock);
}

static uint64_t steals(struct sb_pool *p)
{
	uint64_t n;

	pthread_mutex_lock(&p->lock);
	n = p->steals;
	pthread_mutex_unlock(&p->lock);
	return n;
}

static bool all_zero(const volatile char *a, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i])
			return false;
	return true;
}

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	struct sb_pool *p;
	struct sb_buf *warm, *g, *touch, *plain, *multi, *many;
	struct sb_stats st;
	uint64_t s0;

	require_uffd();
	p = make_pool(PAGE, 64 * MiB, 0);
	warm = make_buf(p, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(warm, 0, PAGE), 1);	/* the pool is active */
	CHECK_EQ(sb_pool_reserve(p, FLOOR * PAGE), FLOOR * PAGE);
	WAIT_FOR(stats(p).pages_ready >= FLOOR, 10.0);
	CHECK(stats(p).pages_ready >= FLOOR);
	hold_ready(p, true);
	usleep(50000);	/* a page it was preparing finishes */

	/* The owner's own page after its last: one ready page out of turn,
	 * nothing prepared on this thread. */
	g = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	CHECK_EQ(sb_buf_map(g, 0, PAGE), 1);
	st = stats(p);
	s0 = steals(p);
	CHECK_EQ(sb_buf_map(g, PAGE, PAGE), 1);
	CHECK_EQ(steals(p), s0 + 1);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares);
	CHECK_EQ(stats(p).pages_ready, st.pages_ready - 1);
	CHECK(all_zero((char *)sb_buf_addr(g) + PAGE, PAGE));	/* a ready page */
	CHECK_EQ(sb_buf_map(g, 2 * PAGE, PAGE), 1);
	CHECK_EQ(steals(p), s0 + 2);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares);
	/* Two per buffer until it has 32 more: the next is prepared here. */
	CHECK_EQ(sb_buf_map(g, 3 * PAGE, PAGE), 1);
	CHECK_EQ(steals(p), s0 + 2);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares + 1);
	for (int i = 0; i < 4; i++)
		memset((char *)sb_buf_addr(g) + (size_t)i * PAGE, 'a' + i, PAGE);
	for (int i = 0; i < 4; i++)
		CHECK_EQ(((char *)sb_buf_addr(g))[(size_t)i * PAGE + PAGE - 1],
			 'a' + i);

	/* The same for a touch: the fault handler places a ready page. */
	touch = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	CHECK_EQ(sb_buf_map(touch, 0, PAGE), 1);
	st = stats(p);
	s0 = steals(p);
	((volatile char *)sb_buf_addr(touch))[PAGE] = 1;
	CHECK_EQ(stats(p).faults, st.faults + 1);
	CHECK_EQ(steals(p), s0 + 1);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares);
	CHECK_EQ(((char *)sb_buf_addr(touch))[PAGE], 1);
	CHECK(all_zero((char *)sb_buf_addr(touch) + PAGE + 1, PAGE - 1));

	/* No steal without SB_BUF_GROWS, nor for several pages at once. */
	s0 = steals(p);
	plain = make_buf(p, 64 * MiB, 0);
	CHECK_EQ(sb_buf_map(plain, 0, PAGE), 1);
	CHECK_EQ(sb_buf_map(plain, PAGE, PAGE), 1);
	multi = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	CHECK_EQ(sb_buf_map(multi, 0, PAGE), 1);
	CHECK_EQ(sb_buf_map(multi, PAGE, 2 * PAGE), 2);
	CHECK_EQ(steals(p), s0);

	/* Grown page by page past the reserve: 2 + 129 / 32 steals at most,
	 * and never more than the ready pages left. */
	many = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	s0 = steals(p);
	for (size_t i = 0; i < 130; i++)
		CHECK_EQ(sb_buf_map(many, i * PAGE, PAGE), 1);
	CHECK(steals(p) - s0 >= 1);
	CHECK(steals(p) - s0 <= 6);
	hold_ready(p, false);

	VERIFY(p);
	sb_buf_destroy(many);
	sb_buf_destroy(multi);
	sb_buf_destroy(plain);
	sb_buf_destroy(touch);
	sb_buf_destroy(g);
	sb_buf_destroy(warm);
	sb_pool_destroy(p);
	printf("steal: an owner past its watch took a ready page out of turn, "
	       "within its bound\n");
	return 0;
}
