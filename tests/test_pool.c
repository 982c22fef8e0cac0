/* The pool: heaps added on shortfall and released once empty (one spare
 * kept, trim gives back everything), the budget enforced all or nothing
 * with resident memory never above it, and a reserve of ready pages built
 * in the background and counted in bytes_resident. */
#include "harness.h"
#include "harness_internal.h"

#include <sys/resource.h>

#define PAGE (256 * KiB)

/* A floor with heaps of one page each, RLIMIT_NOFILE at 64: the floor's
 * heaps stop at a quarter of the limit (each is a descriptor); it once
 * took every one the process had left. */
static int child_floor_fds(void)
{
	struct rlimit was, rl;
	struct sb_pool *p;
	int fd;

	CHECK_EQ(getrlimit(RLIMIT_NOFILE, &was), 0);
	rl = was;
	rl.rlim_cur = 64;
	CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
	p = make_pool(PAGE, PAGE, 0);
	CHECK_EQ(sb_pool_reserve(p, 32 * MiB), 32 * MiB);
	WAIT_FOR(stats(p).heaps >= 16, 5.0);
	usleep(300 * 1000);
	CHECK(stats(p).heaps >= 8);
	CHECK(stats(p).heaps <= 16);
	fd = open("/dev/null", O_RDONLY);
	CHECK(fd >= 0);
	close(fd);
	/* Room again, and the floor said once more: it fills. On a client
	 * of sparsebufd, idle 2 s, it had given its lease back, and stayed
	 * stuck: the heap is tried only while the lease has room. */
	usleep(2500 * 1000);
	CHECK_EQ(setrlimit(RLIMIT_NOFILE, &was), 0);
	if (was.rlim_cur == RLIM_INFINITY || was.rlim_cur / 4 > 140) {
		CHECK_EQ(sb_pool_reserve(p, 0), 32 * MiB);
		WAIT_FOR(stats(p).pages_ready >= 32 * MiB / PAGE, 10.0);
		CHECK(stats(p).pages_ready >= 32 * MiB / PAGE);
	}
	VERIFY(p);
	sb_pool_destroy(p);
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "floor-fds"))
		return child_floor_fds();
	return 2;
}

static void heaps_come_and_go(void)
{
	/* 1 MiB heaps: four pages each. */
	struct sb_pool *p = make_pool(PAGE, 1 * MiB, 0);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	struct sb_stats st;

	CHECK_EQ(stats(p).heaps, 0);	/* nothing until needed */
	CHECK_EQ(sb_buf_map(b, 0, 10 * PAGE), 10);
	st = stats(p);
	CHECK(st.heaps >= 3);
	CHECK(st.bytes_resident >= 10 * PAGE);
	VERIFY(p);
	CHECK_EQ(sb_buf_unmap(b, 0, 10 * PAGE), 10);
	/* The ready thread releases empty heaps (keeping one spare) on its
	 * next tick. */
	WAIT_FOR(stats(p).heaps <= 1, 5.0);
	st = stats(p);
	CHECK(st.heaps <= 1);
	CHECK_EQ(st.pages_used, 0);
	CHECK(sb_pool_trim(p) >= 0);
	st = stats(p);
	CHECK_EQ(st.heaps, 0);
	CHECK_EQ(st.bytes_resident, 0);
	CHECK_EQ(st.pages_ready, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static void budget(void)
{
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 10 * PAGE);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	struct sb_buf *c = make_buf(p, 1 * GiB, 0);
	struct sb_stats st;

	st = stats(p);
	CHECK_EQ(st.max_bytes, 10 * PAGE);
	CHECK_EQ(sb_buf_map(b, 0, 8 * PAGE), 8);
	/* [6, 12) has four unplaced pages, two of budget left: nothing. */
	CHECK_EQ(sb_buf_map(b, 6 * PAGE, 6 * PAGE), -ENOMEM);
	CHECK_EQ(sb_buf_placed(b, 0, 1 * GiB), 8);
	st = stats(p);
	CHECK_EQ(st.pages_used, 8);
	CHECK_EQ(st.maps, 8);
	CHECK(st.bytes_resident <= 10 * PAGE);
	/* Exactly the budget works; one more does not. */
	CHECK_EQ(sb_buf_map(c, 0, 2 * PAGE), 2);
	CHECK_EQ(sb_buf_map(c, 2 * PAGE, 1), -ENOMEM);
	CHECK(stats(p).bytes_resident <= 10 * PAGE);
	/* Release, and the budget is there again, reserve or not. */
	CHECK_EQ(sb_buf_unmap(b, 0, 8 * PAGE), 8);
	CHECK_EQ(sb_buf_map(c, 2 * PAGE, 8 * PAGE), 8);
	for (int i = 0; i < 50; i++) {
		CHECK(stats(p).bytes_resident <= 10 * PAGE);
		usleep(1000);
	}
	VERIFY(p);
	sb_buf_destroy(b);
	sb_buf_destroy(c);
	sb_pool_destroy(p);
}

static void reserve(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	struct sb_stats st;

	/* After the first placement the ready thread prepares the pages
	 * this buffer will need next, off the caller's thread. */
	CHECK_EQ(sb_buf_map(b, 0, PAGE), 1);
	WAIT_FOR(stats(p).pages_ready >= 2, 5.0);
	st = stats(p);
	CHECK(st.pages_ready >= 2);
	/* Ready pages are memory the pool holds: counted as resident. */
	CHECK(st.bytes_resident >= (st.pages_used + st.pages_ready) * PAGE);
	/* The next placement uses one of them: no preparation needed. */
	CHECK_EQ(sb_buf_map(b, PAGE, PAGE), 1);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* A floor set before the first allocation is filled all the same (it
 * waited for a run to start before, test_rss), across heaps, and stays:
 * the tick's release of empty heaps keeps the ones it needs. The first
 * buffer then grows on those pages. */
static void reserve_idle(void)
{
	struct sb_pool *p = make_pool(PAGE, 4 * PAGE, 0);
	struct sb_buf *b;
	struct sb_stats st;

	CHECK_EQ(sb_pool_reserve(p, 10 * PAGE), 10 * PAGE);
	WAIT_FOR(stats(p).pages_ready >= 10, 10.0);
	CHECK(stats(p).pages_ready >= 10);
	usleep(350 * 1000);	/* three ticks */
	st = stats(p);
	CHECK(st.pages_ready >= 10);
	CHECK(st.bytes_resident <= 12 * PAGE);
	b = make_buf(p, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(b, 0, 4 * PAGE), 4);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares);
	VERIFY(p);
	sb_pool_destroy(p);
	/* A floor above the lease's high mark (64 MiB), on a pool that is
	 * idle: under sparsebufd (make test-daemon) the lease it asked for
	 * is kept while the ready thread fills it (it once gave all but 16
	 * MiB back at the first look, and the floor stayed at 16 MiB). */
	p = make_pool(PAGE, 64 * MiB, 0);
	CHECK_EQ(sb_pool_reserve(p, 96 * MiB), 96 * MiB);
	WAIT_FOR(stats(p).pages_ready >= 96 * MiB / PAGE, 10.0);
	CHECK(stats(p).pages_ready >= 96 * MiB / PAGE);
	usleep(350 * 1000);
	CHECK(stats(p).pages_ready >= 96 * MiB / PAGE);
	/* Lowered to 0: back to the adaptive reserve (at most 12 MiB, and
	 * the heap that holds it) within a few ticks, not an eighth a
	 * second from the old floor. */
	CHECK_EQ(sb_pool_reserve(p, -96 * (long)MiB), 0);
	WAIT_FOR(stats(p).pages_ready <= 12 * MiB / PAGE, 3.0);
	CHECK(stats(p).pages_ready <= 12 * MiB / PAGE);
	CHECK(stats(p).bytes_resident <= 64 * MiB);
	VERIFY(p);
	sb_pool_destroy(p);
}

/* A client that knows its bursts raises the reserve's floor. */
static void reserve_floor(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_pool *q = make_pool(PAGE, 64 * MiB, 4 * PAGE);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);

	CHECK_EQ(sb_pool_reserve(NULL, 1), -EINVAL);
	CHECK_EQ(sb_pool_reserve(p, 0), 0);
	CHECK_EQ(sb_buf_map(b, 0, PAGE), 1);	/* the pool is active */
	CHECK_EQ(sb_pool_reserve(p, 12 * PAGE - 1), 12 * PAGE);	/* rounds up */
	WAIT_FOR(stats(p).pages_ready >= 12, 5.0);
	CHECK(stats(p).pages_ready >= 12);
	CHECK_EQ(sb_pool_reserve(p, -100 * (long)PAGE), 0);	/* floors at 0 */
	/* Whole pages away from zero both ways: x, then -x, is no change. */
	CHECK_EQ(sb_pool_reserve(p, 1), PAGE);
	CHECK_EQ(sb_pool_reserve(p, -1), 0);
	CHECK_EQ(sb_pool_reserve(p, PAGE + 1), 2 * PAGE);
	CHECK_EQ(sb_pool_reserve(p, -(long)PAGE - 1), 0);
	/* Never past the budget: 4 pages, one in use. */
	b = make_buf(q, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(b, 0, PAGE), 1);
	CHECK_EQ(sb_pool_reserve(q, 16 * PAGE), 16 * PAGE);
	usleep(300000);
	CHECK(stats(q).bytes_resident <= 4 * PAGE);
	CHECK_EQ(sb_buf_map(b, PAGE, 3 * PAGE), 3);	/* the budget is usable */
	VERIFY(q);
	sb_pool_destroy(q);
	sb_pool_destroy(p);
}

/* sync_prepares counts what a caller had to prepare, not the pages the
 * ready thread zeroed for its own placements ahead (a prefetch without
 * WAIT on a fresh pool: nearly every page needs zeroing). */
static void background_prepares(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	struct sb_range r = {0, 128 * PAGE};
	uint64_t before;

	CHECK_EQ(sb_buf_prefetch(b, &r, 1, 0), 128);
	WAIT_FOR(sb_buf_placed(b, 0, 128 * PAGE) == 128, 10.0);
	CHECK_EQ(sb_buf_placed(b, 0, 128 * PAGE), 128);
	CHECK_EQ(stats(p).sync_prepares, 0);
	/* The caller's own: more pages at once than the reserve holds, the
	 * ready thread held off meanwhile (else, with the caller slowed
	 * down, ThreadSanitizer on a slow host, it kept ahead of it). */
	hold_ready(p, true);
	before = stats(p).pages_ready;
	CHECK_EQ(sb_buf_map(b, 256 * PAGE, (before + 64) * PAGE),
		 (long)before + 64);
	hold_ready(p, false);
	CHECK(stats(p).sync_prepares > 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static int main_test(void)
{
	require_uffd();
	heaps_come_and_go();
	budget();
	reserve();
	reserve_floor();
	reserve_idle();
	CHECK_EQ(child_exit_code(run_child("floor-fds")), 0);
	background_prepares();
	printf("pool: heaps, budget and reserve ok\n");
	return 0;
}
