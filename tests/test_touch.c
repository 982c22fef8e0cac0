/* The ready thread takes the first access to newly placed pages (touch.c,
 * forced on with SPARSEBUF_TOUCH=1 whatever the probe found):
 * pages placed by sb_buf_map, by a growth watch and by a served prefetch
 * are counted in pages_touched, each once; a touch never reaches a page
 * that was unmapped meanwhile (it would fault and place it again); unmap
 * and destroy while touches are queued or in flight leave the pool
 * consistent, also right after the fault that placed the page; pages
 * smaller than the touch's 16 KiB chunk are read within
 * their own page only; the pool's clock never evicts the page being
 * read, and a fault whose only candidate that page is, in its own buffer,
 * is served once the read is done; a copy-on-write page so skipped keeps
 * its write protection. */
#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define PAGE (64 * KiB)

/* Wait (at most 5 s) until the pool has touched `want` pages. */
static uint64_t touched_at_least(struct sb_pool *p, uint64_t want)
{
	for (int i = 0; i < 5000 && stats(p).pages_touched < want; i++)
		usleep(1000);
	return stats(p).pages_touched;
}

/* Test hooks, internal symbols of the static library (lib/touch.c,
 * lib/disk.c). */
unsigned sbi_test_touch_delay(unsigned us, unsigned count, unsigned *read);
void sbi_test_io_fail(int err, unsigned count);
void sbi_test_evict_fail(int err, unsigned count);

/* Wait (at most 5 s) until a touch delayed by the hook has begun (the
 * hook had counted d0 such waits). */
static void touch_waiting(unsigned d0)
{
	for (int i = 0;
	     i < 5000 && sbi_test_touch_delay(0, 0, NULL) == d0; i++)
		usleep(1000);
	CHECK(sbi_test_touch_delay(0, 0, NULL) > d0);
}

/*
 * The pool's clock never evicts the page the ready thread is reading. The
 * thread takes no signals: had the page gone, its read would fault, and a
 * page-in that failed there (a disk error; io_uring's cancel under a
 * storm of signals, test_chaos) would poison the page under it: SIGBUS, or
 * SIGSEGV while the poisoned page's mapping is being set up, and the
 * process dies (test_chaos under lockcheck, CI of 2026-11-29: "killed by
 * signal 11"). Here a touch waits 300 ms between finding its page placed
 * and reading it (a test hook) while the owner maps past the budget with
 * every read from disk failing: the eviction takes the other pages first,
 * then that one once read (the map returns only after the read); nobody
 * dies, and the pages read back whole.
 */
static int clock_child(void)
{
	struct sb_pool *p = disk_pool(PAGE, 4 * MiB, 4 * PAGE);
	struct sb_buf *a = make_buf(p, 16 * PAGE, SB_BUF_EVICTABLE);
	char *x = sb_buf_addr(a);
	unsigned d0, r0, r;
	double t0;

	alarm(60);
	d0 = sbi_test_touch_delay(300000, 1, &r0);
	CHECK_EQ(sb_buf_map(a, 0, 4 * PAGE), 4);
	touch_waiting(d0);
	for (size_t i = 0; i < 4; i++)
		disk_fill(x + i * PAGE, PAGE, 0x7100 + i);
	sbi_test_io_fail(EIO, 1000);
	t0 = now_s();
	/* At the budget: all four go out, the one being read only once
	 * read (before: at once, and the read faulted). */
	CHECK_EQ(sb_buf_map(a, 4 * PAGE, 4 * PAGE), 4);
	sbi_test_touch_delay(0, 0, &r);
	printf("clock and touch: 4 pages evicted at the budget in %.0f ms, "
	       "%llu out, %s\n",
	       (now_s() - t0) * 1e3, (unsigned long long)stats(p).pages_out,
	       r > r0 ? "the page being read kept until read"
		      : "the page being read evicted under the read");
	CHECK(r > r0);
	CHECK(stats(p).pages_out >= 4);
	sbi_test_io_fail(EIO, 0);
	for (size_t i = 0; i < 4; i++)
		CHECK_EQ(disk_check(x + i * PAGE, PAGE, 0x7100 + i), -1);
	CHECK_EQ(stats(p).sigbus, 0);
	VERIFY(p);
	sb_buf_destroy(a);
	sb_pool_destroy(p);
	alarm(0);
	return 0;
}

/*
 * The same, with the clock's caller holding the lock of the buffer read.
 * A fault at the budget (its handler holds the buffer's lock) finds one
 * candidate, the page the touch reads, and skips it. That page's write-out
 * failed once, which leaves its mapping registered for minor faults, and
 * the kernel has dropped its entries (MADV_DONTNEED here; reclaim or
 * MADV_PAGEOUT elsewhere): the touch's read faults to a handler that
 * needs the lock the first handler holds while it waits for the read.
 * Before the fix both waited 10 s, then the fault's thread got SIGBUS. Now
 * the skipping handler maps the page again and wakes the reader: the
 * fault is served once the touch has read (300 ms).
 */
static int held_child(void)
{
	struct sb_pool *p = disk_pool(PAGE, 4 * MiB, 4 * PAGE);
	struct sb_buf *b = make_buf(p, 16 * PAGE, SB_BUF_EVICTABLE);
	struct sb_buf *o = make_buf(p, 4 * PAGE, 0);
	volatile char *x = sb_buf_addr(b);
	unsigned d0, r0, r;
	double t0, ms;
	long e;

	alarm(60);
	CHECK_EQ(sb_buf_map(b, 0, PAGE), 1);
	CHECK_EQ(touched_at_least(p, 1), 1);
	disk_fill((char *)x, PAGE, 0x7200);
	/* Its write-out fails: kept placed, registered for minor faults. */
	sbi_test_evict_fail(EIO, 1);
	e = sb_buf_evict(b, 0, PAGE);
	CHECK_EQ(e, -EIO);
	CHECK_EQ(sb_buf_placed(b, 0, PAGE), 1);
	/* Pages 1-3 placed; the touch of the span starts at page 0, and
	 * waits there. */
	d0 = sbi_test_touch_delay(300000, 1, &r0);
	CHECK_EQ(sb_buf_map(b, 0, 4 * PAGE), 3);
	touch_waiting(d0);
	/* Shared out, pages 1-3 are never the clock's: page 0 is the only
	 * candidate, and the pool at its budget. */
	CHECK_EQ(sb_buf_share(o, 0, b, PAGE, 3 * PAGE), 3);
	CHECK_EQ(madvise((char *)x, PAGE, MADV_DONTNEED), 0);
	t0 = now_s();
	x[4 * PAGE] = 1;	/* the fault: SIGBUS kills the child */
	ms = (now_s() - t0) * 1e3;
	sbi_test_touch_delay(0, 0, &r);
	printf("clock and touch, the faulting buffer's page: served in %.0f "
	       "ms, %s\n",
	       ms, r > r0 ? "after the touch read" : "before the touch read");
	CHECK(r > r0);
	CHECK(ms < 5000);
	CHECK_EQ(disk_check((char *)x, PAGE, 0x7200), -1);
	CHECK_EQ(stats(p).sigbus, 0);
	VERIFY(p);
	sb_buf_destroy(o);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	alarm(0);
	return 0;
}

/*
 * The same skip, of a page write-protected for copy-on-write (shared out
 * once, its other holder gone) whose entries the kernel dropped: the
 * clock must leave its protection alone. Mapping it again there (the
 * first version of the fix above) made it writable under an entry that
 * still said shared; the next share from it then trusted that, and a
 * write through the source showed in the destination (found by review).
 */
static int cow_child(void)
{
	struct sb_pool *p = disk_pool(PAGE, 4 * MiB, 4 * PAGE);
	struct sb_buf *b = make_buf(p, 16 * PAGE, SB_BUF_EVICTABLE);
	struct sb_buf *o = make_buf(p, 8 * PAGE, 0);
	struct sb_buf *o2 = make_buf(p, 8 * PAGE, 0);
	volatile char *x = sb_buf_addr(b), *y2 = sb_buf_addr(o2);
	unsigned d0, r0, r;

	alarm(60);
	CHECK_EQ(sb_buf_map(b, 0, PAGE), 1);
	CHECK_EQ(touched_at_least(p, 1), 1);
	memset((char *)x, 0x41, PAGE);
	CHECK_EQ(sb_buf_share(o, 0, b, 0, PAGE), 1);
	/* b's page 0: shared out once, now its only holder. */
	CHECK_EQ(sb_buf_unmap(o, 0, PAGE), 1);
	CHECK_EQ(sb_buf_map(b, 5 * PAGE, PAGE), 1);
	CHECK_EQ(touched_at_least(p, 2), 2);
	/* The touch of pages 0-2 waits at page 0; 1 and 2 shared out: the
	 * clock's candidates are pages 0 and 5. */
	d0 = sbi_test_touch_delay(300000, 1, &r0);
	CHECK_EQ(sb_buf_map(b, 0, 3 * PAGE), 2);
	touch_waiting(d0);
	CHECK_EQ(sb_buf_share(o, PAGE, b, PAGE, 2 * PAGE), 2);
	CHECK_EQ(madvise((char *)x, PAGE, MADV_DONTNEED), 0);
	x[8 * PAGE] = 1;	/* at the budget: page 0 skipped, 5 goes */
	for (int i = 0; i < 5000; i++, usleep(1000))
		if (sbi_test_touch_delay(0, 0, &r), r > r0)
			break;	/* the touch has read */
	CHECK(r > r0);
	CHECK_EQ(sb_buf_placed(b, 0, PAGE), 1);
	CHECK_EQ(sb_buf_share(o2, 0, b, 0, PAGE), 1);
	CHECK_EQ(y2[0], 0x41);
	x[0] = 0x55;	/* a copy: o2 keeps its 0x41 */
	printf("clock and touch, a copy-on-write page skipped: a write "
	       "through the source, the destination reads %#x\n", y2[0]);
	CHECK_EQ(y2[0], 0x41);
	CHECK_EQ(x[0], 0x55);
	VERIFY(p);
	sb_buf_destroy(o2);
	sb_buf_destroy(o);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	alarm(0);
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "cow"))
		return cow_child();
	if (!strcmp(name, "clock"))
		return clock_child();
	if (!strcmp(name, "held"))
		return held_child();
	return 2;
}

static void placed_pages_are_touched(size_t page)
{
	struct sb_pool *p = make_pool(page, 64 * page, 0);
	struct sb_buf *b = make_buf(p, 32 * page, 0);
	struct sb_buf *g = make_buf(p, 8 * page, SB_BUF_GROWS);
	char *base = sb_buf_addr(b);
	uint64_t t;

	/* sb_buf_map: every page placed is touched once. */
	CHECK_EQ(sb_buf_map(b, 0, 8 * page), 8);
	t = touched_at_least(p, 8);
	CHECK_EQ(t, 8);
	/* Mapped again: nothing new placed, nothing touched again. */
	CHECK_EQ(sb_buf_map(b, 0, 8 * page), 0);
	usleep(20000);
	CHECK_EQ(stats(p).pages_touched, 8);

	/* A prefetch served in the background. */
	{
		struct sb_range r = {8 * page, 4 * page};

		CHECK(sb_buf_prefetch(b, &r, 1, 0) >= 0);
		t = touched_at_least(p, 12);
		CHECK_EQ(t, 12);
	}

	/* A growth watch's page ahead. */
	CHECK_EQ(sb_buf_map(g, 0, 2 * page), 2);
	memset((char *)sb_buf_addr(g) + page, 1, 64);	/* enter the frontier */
	t = touched_at_least(p, 15);
	CHECK_EQ(t, 15);
	CHECK_EQ(stats(p).pages_used, 12 + 3);

	/* The touches read; the data is what the owner wrote. */
	for (size_t off = 0; off < 12 * page; off += 4096)
		CHECK_EQ(base[off], 0);
	CHECK_EQ(stats(p).faults, 0);
	sb_buf_destroy(g);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("page %zu KiB: sb_buf_map, prefetch and growth pages touched "
	       "once each\n", page / KiB);
}

/* Unmapped while queued or being touched: the touch must skip the page,
 * never fault on it (the handler would place it again: a page the owner
 * released, resident, and a fault counted). */
static void unmap_under_touch(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * PAGE, 0);
	uint64_t f0 = stats(p).faults;

	for (int i = 0; i < 400; i++) {
		struct sb_buf *b = make_buf(p, 16 * PAGE, 0);

		CHECK_EQ(sb_buf_map(b, 0, 16 * PAGE), 16);
		if (i % 4 == 1)
			usleep(200);	/* let a touch start */
		if (i % 2) {
			CHECK_EQ(sb_buf_unmap(b, 0, 16 * PAGE), 16);
			CHECK_EQ(stats(p).pages_used, 0);
		}
		sb_buf_destroy(b);
		CHECK_EQ(stats(p).pages_used, 0);
	}
	usleep(20000);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(stats(p).faults, f0);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("400 buffers unmapped or destroyed under touches: no fault, "
	       "nothing left placed\n");
}

/* A page placed by a fault is queued for its touch before the faulting
 * thread is woken: the owner's unmap or destroy right after the fault must
 * find and cancel it (a touch queued later would read a destroyed buffer,
 * or fault an unmapped page back in). */
static void release_after_fault(void)
{
	cpu_set_t all, one;
	struct sb_pool *p;
	uint64_t f0;
	int n = 2000;

	/* One CPU for us and the pool's threads (they inherit it): the woken
	 * owner preempts the handler right after its wake-up, which is when
	 * a late request would come. */
	CHECK_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
	CPU_ZERO(&one);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &all)) {
			CPU_SET(c, &one);
			break;
		}
	CHECK_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
	p = make_pool(PAGE, 64 * PAGE, 0);
	f0 = stats(p).faults;

	for (int i = 0; i < n; i++) {
		struct sb_buf *b = make_buf(p, 8 * PAGE, 0);
		char *last = (char *)sb_buf_addr(b) + 7 * PAGE;

		last[PAGE - 1] = 1;	/* a fault places page 7 */
		if (i % 2)
			CHECK_EQ(sb_buf_unmap(b, 7 * PAGE, PAGE), 1);
		sb_buf_destroy(b);
	}
	usleep(20000);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(stats(p).faults, f0 + (uint64_t)n);
	VERIFY(p);
	sb_pool_destroy(p);
	CHECK_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
	printf("%d buffers unmapped or destroyed just after a fault: no "
	       "touch after, no fault but ours\n", n);
}

/* sb_buf_share over pages queued for touches, from a source with holes
 * there: the share releases them, and must wait for a touch in flight
 * and drop the queued ones first (as unmap does). A touch reading a page
 * released meanwhile would fault a zero page back in, or, in a strict
 * buffer (SIGBUS on unplaced pages), kill the process from the ready
 * thread. Found by an adversarial review: 4 in 3000 before the fix. */
static void share_over_touches(unsigned flags)
{
	struct sb_pool *p = make_pool(PAGE, 64 * PAGE, 0);
	struct sb_buf *dst = make_buf(p, 16 * PAGE, flags);
	struct sb_buf *src = make_buf(p, 16 * PAGE, 0);	/* all holes */
	uint64_t f0 = stats(p).faults;
	int n = 3000;

	for (int i = 0; i < n; i++) {
		CHECK_EQ(sb_buf_map(dst, 0, 16 * PAGE), 16);
		if (i & 1)
			usleep(50);	/* let a touch start */
		CHECK_EQ(sb_buf_share(dst, 0, src, 0, 16 * PAGE), 0);
		usleep(200);	/* a touch that read too late has faulted */
		CHECK_EQ(sb_buf_placed(dst, 0, 16 * PAGE), 0);
	}
	usleep(20000);
	CHECK_EQ(sb_buf_placed(dst, 0, 16 * PAGE), 0);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(stats(p).faults, f0);
	sb_buf_destroy(dst);
	sb_buf_destroy(src);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("%d shares of holes over touched pages%s: nothing placed "
	       "again, no fault\n", n, flags ? " (strict buffer)" : "");
}

/* Pages touched after mapping 16 with SPARSEBUF_TOUCH=value: waited
 * for when they should be, else given 50 ms to show up. */
static uint64_t touched_with(const char *value, bool on)
{
	struct sb_pool *p;
	struct sb_buf *b;
	uint64_t n;

	CHECK_EQ(setenv("SPARSEBUF_TOUCH", value, 1), 0);
	p = make_pool(PAGE, 64 * PAGE, 0);
	b = make_buf(p, 16 * PAGE, 0);
	CHECK_EQ(sb_buf_map(b, 0, 16 * PAGE), 16);
	if (on) {
		n = touched_at_least(p, 16);
	} else {
		usleep(50000);
		n = stats(p).pages_touched;
	}
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	CHECK_EQ(setenv("SPARSEBUF_TOUCH", "1", 1), 0);
	return n;
}

/* 0: no touches, whatever the probe found; auto, and a value that is
 * none of 0, 1, auto (logged): what the probe found. */
static void touch_settings(long first_access_ns)
{
	bool on = first_access_ns > 1000;
	uint64_t want = on ? 16 : 0;

	CHECK_EQ(touched_with("0", false), 0);
	CHECK_EQ(touched_with("auto", on), want);
	CHECK_EQ(touched_with("yes please", on), want);
	printf("SPARSEBUF_TOUCH=0: nothing touched; auto and a bad value: "
	       "%llu of 16 (the probe's choice)\n", (unsigned long long)want);
}

/*
 * sb_pool_trim while touches are queued: the ready thread leaves touches
 * alone while a trim runs, and it used to go round its loop again at once
 * when touches were queued, never sleeping, so never letting go of
 * pool->lock, which the trim (between two punches) waited for: every
 * thread of the pool hung (test_chaos on a shadow-paging host, where
 * touches are on by default). A hang here is killed by the alarm.
 */
static _Atomic bool trim_stop;

static void *trimmer(void *arg)
{
	struct sb_pool *p = arg;
	long n = 0;

	while (!atomic_load(&trim_stop)) {
		CHECK(sb_pool_trim(p) >= 0);
		n++;
	}
	return (void *)n;
}

static void trim_under_touch(void)
{
	struct sb_pool *p = make_pool(PAGE, 256 * PAGE, 0);
	struct sb_buf *b[2] = {make_buf(p, 64 * PAGE, 0),
			       make_buf(p, 64 * PAGE, 0)};
	uint64_t t0;
	pthread_t t;
	void *trims;
	int rounds = 0;

	alarm(60);
	atomic_store(&trim_stop, false);
	CHECK_EQ(pthread_create(&t, NULL, trimmer, p), 0);
	/* One buffer's pages placed (their touches queued) while the
	 * other's are freed (pages for the trim to punch). */
	CHECK_EQ(sb_buf_map(b[0], 0, 64 * PAGE), 64);
	for (double end = now_s() + 1.5; now_s() < end; rounds++) {
		CHECK_EQ(sb_buf_map(b[(rounds + 1) % 2], 0, 64 * PAGE), 64);
		CHECK_EQ(sb_buf_unmap(b[rounds % 2], 0, 64 * PAGE), 64);
	}
	atomic_store(&trim_stop, true);
	CHECK_EQ(pthread_join(t, &trims), 0);
	/* And touches go on after the trims. */
	t0 = stats(p).pages_touched;
	CHECK_EQ(sb_buf_map(b[(rounds + 1) % 2], 0, 16 * PAGE), 16);
	CHECK(touched_at_least(p, t0 + 1) > t0);
	alarm(0);
	CHECK_EQ(stats(p).pages_used, 80);
	VERIFY(p);
	sb_buf_destroy(b[0]);
	sb_buf_destroy(b[1]);
	sb_pool_destroy(p);
	printf("%d rounds of 64 pages placed and freed beside %ld trims: no "
	       "hang\n",
	       rounds, (long)trims);
}

static int main_test(void)
{
	struct sb_features f;

	require_uffd();
	CHECK_EQ(sb_features_get(&f), 0);
	CHECK(f.first_access_ns >= 0 && f.first_access_ns < 100000000);
	printf("first access to a mapped 4 KiB: %ld ns (median of 64)\n",
	       f.first_access_ns);
	/* Whatever this machine's first access costs. */
	CHECK_EQ(setenv("SPARSEBUF_TOUCH", "1", 1), 0);
	touch_settings(f.first_access_ns);
	placed_pages_are_touched(PAGE);
	/* Smaller than a touch chunk: reads stay within the page (the
	 * next buffer page is unplaced: a read there would fault). */
	placed_pages_are_touched(4 * KiB);
	if (f.wp_shmem) {
		share_over_touches(0);
		share_over_touches(SB_BUF_STRICT);
	} else {
		printf("share cases skipped: no write-protect on shmem here\n");
	}
	unmap_under_touch();
	release_after_fault();
	trim_under_touch();
	if (run_pagers("clock", 60, NULL) + run_pagers("held", 60, NULL) +
	    (f.wp_shmem ? run_pagers("cow", 60, NULL) : 0))
		SKIP("a run skipped (see above)");
	printf("ok\n");
	return 0;
}
