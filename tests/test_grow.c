/* SB_BUF_GROWS (issue 11): a buffer written at its end, by touch alone,
 * takes no fault after its first pages (the pool places each next page
 * ahead once the page before is entered) and never holds more than one page
 * beyond the one being written. Without the flag the same writes fault once
 * per page (the control). Data that begins with zeros is seen late, never
 * lost; unmap and destroy while a watch works leave the pool consistent. */
#include "harness.h"

#define PAGE (64 * KiB)
#define NPAGES 48
#define CHUNK (4 * KiB)

/* Write the buffer from its start, 4 KiB at a time with a pause between
 * (a decode step), checking after each chunk that the pool holds at most
 * one page beyond the page being written. Returns the faults taken. */
static uint64_t grow_by_touch(struct sb_pool *p, unsigned flags, int byte)
{
	struct sb_buf *b = make_buf(p, NPAGES * PAGE, flags);
	char *base = sb_buf_addr(b);
	uint64_t f0 = stats(p).faults, faults;
	size_t most_ahead = 0;

	for (size_t off = 0; off < NPAGES * PAGE; off += CHUNK) {
		size_t writing = off / PAGE + 1, used;

		memset(base + off, byte, CHUNK);
		usleep(300);
		used = stats(p).pages_used;
		if (used > writing && used - writing > most_ahead)
			most_ahead = used - writing;
		if (used > writing + 1)
			FAIL("flags %#x: %zu pages held while writing page %zu",
			     flags, used, writing);
	}
	for (size_t off = 0; off < NPAGES * PAGE; off++)
		if (base[off] != (char)byte)
			FAIL("byte %zu reads %d, wrote %d", off, base[off], byte);
	faults = stats(p).faults - f0;
	printf("flags %#x, %s data: %llu faults for %d pages, at most %zu "
	       "page ahead\n", flags, byte ? "nonzero" : "zero",
	       (unsigned long long)faults, NPAGES, most_ahead);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	return faults;
}

static int child(const char *name)
{
	(void)name;
	return 0;
}

static int main_test(void)
{
	struct sb_pool *p;
	int err = 0;
	uint64_t f;

	require_uffd();
	p = make_pool(PAGE, 16 * MiB, 0);

	CHECK(!sb_buf_create(p, PAGE, SB_BUF_GROWS | SB_BUF_STRICT, &err));
	CHECK_EQ(err, -EINVAL);
	CHECK(!sb_buf_create(p, PAGE, SB_BUF_GROWS | SB_BUF_EVICTABLE, &err));
	CHECK_EQ(err, -EINVAL);

	/* The control: one fault per page. */
	f = grow_by_touch(p, 0, 7);
	CHECK(f >= NPAGES - 1);
	/* Growing: the first two pages fault (the second starts the
	 * watch), then none, unless the watch was late (a page or two on a
	 * loaded machine). */
	f = grow_by_touch(p, SB_BUF_GROWS, 7);
	if (f > 6)
		FAIL("SB_BUF_GROWS: %llu faults for %d pages",
		     (unsigned long long)f, NPAGES);
	/* Zeros are not seen as entered: pages fault as without the flag,
	 * and read back as written. */
	f = grow_by_touch(p, SB_BUF_GROWS, 0);
	CHECK(f >= NPAGES / 2);
	VERIFY(p);

	/* A slow grower (a page every 160 ms, a decode step's pace: the
	 * watch looks at its frontier through the buffer's mapping some 160
	 * times a page, while the owner writes it) still finds each next
	 * page placed: no fault after the first two, never more than one
	 * page ahead; then, written at full speed, it outruns the watch and
	 * places pages itself, all read back as written. */
	{
		struct sb_buf *b = make_buf(p, 16 * PAGE, SB_BUF_GROWS);
		char *base = sb_buf_addr(b);
		uint64_t f0 = stats(p).faults;
		size_t off;

		for (off = 0; off < 8 * PAGE; off += CHUNK) {
			memset(base + off, 3, CHUNK);
			usleep(10 * 1000);
			if (stats(p).pages_used > off / PAGE + 2)
				FAIL("slow grower: %zu pages held at page %zu",
				     (size_t)stats(p).pages_used, off / PAGE + 1);
		}
		printf("slow grower: %llu faults for 8 pages\n",
		       (unsigned long long)(stats(p).faults - f0));
		if (stats(p).faults - f0 > 3)
			FAIL("slow grower: %llu faults for 8 pages",
			     (unsigned long long)(stats(p).faults - f0));
		for (; off < 16 * PAGE; off += CHUNK)
			memset(base + off, 4, CHUNK);
		for (off = 0; off < 16 * PAGE; off++)
			if (base[off] != (off < 8 * PAGE ? 3 : 4))
				FAIL("slow grower: byte %zu reads %d", off,
				     base[off]);
		sb_buf_destroy(b);
		CHECK_EQ(stats(p).pages_used, 0);
	}

	/* A pause longer than a watch's idle time (2 s: a chat waiting for
	 * its user) does not end the watch: once the owner enters the page
	 * placed ahead before the pause, the next one is placed, with no
	 * fault and nothing else from the owner. */
	{
		struct sb_buf *b = make_buf(p, 8 * PAGE, SB_BUF_GROWS);
		char *base = sb_buf_addr(b);
		uint64_t f0;

		CHECK_EQ(sb_buf_map(b, 0, 2 * PAGE), 2);
		memset(base + PAGE, 1, 64);	/* enter the frontier */
		for (int i = 0; i < 1000 && stats(p).pages_used < 3; i++)
			usleep(1000);
		CHECK_EQ(stats(p).pages_used, 3);
		usleep(2500 * 1000);
		f0 = stats(p).faults;
		memset(base + 2 * PAGE, 1, 64);	/* placed ahead: no fault */
		for (int i = 0; i < 1000 && stats(p).pages_used < 4; i++)
			usleep(1000);
		CHECK_EQ(stats(p).pages_used, 4);
		CHECK_EQ(stats(p).faults, f0);
		sb_buf_destroy(b);
		CHECK_EQ(stats(p).pages_used, 0);
	}

	/* An owner that once outran its watch (placed the page ahead
	 * itself) is served first when every buffer enters its page at the
	 * same moment: a client mapping ahead of its writes then finds its
	 * page placed. URGENT_N buffers start watches; the last created
	 * (the last slot in the ready thread's round) outruns its watch.
	 * Then all enter their frontier, the fast one first. Without the
	 * urgency it is served last, after all the others; with it, before
	 * them, except that a round of the ready thread can straddle the
	 * writes (the fast one looked at just before its write, the others
	 * just after theirs), which lets one burst of others (8) go first. */
	{
		enum { URGENT_N = 40 };
		struct sb_buf *b[URGENT_N];
		struct sb_pool *q = make_pool(PAGE, 16 * MiB, 0);
		const int X = URGENT_N - 1;
		int before = 0, seen = 0;

		for (int i = 0; i < URGENT_N; i++) {
			b[i] = make_buf(q, 8 * PAGE, SB_BUF_GROWS);
			CHECK_EQ(sb_buf_map(b[i], 0, 2 * PAGE), 2);
		}
		/* Before its frontier (page 1) is entered: its own map. */
		CHECK_EQ(sb_buf_map(b[X], 2 * PAGE, PAGE), 1);
		memset((char *)sb_buf_addr(b[X]) + 2 * PAGE, 1, 64);
		for (int i = 0; i < X; i++)
			memset((char *)sb_buf_addr(b[i]) + PAGE, 1, 64);
		for (int t = 0; t < 20000 && seen < X; t++) {
			/* Others read first: an other placed, then the fast
			 * one not, is an other placed before it. */
			seen = 0;
			for (int i = 0; i < X; i++)
				seen += sb_buf_placed(b[i], 2 * PAGE, PAGE) == 1;
			if (seen && sb_buf_placed(b[X], 3 * PAGE, PAGE) != 1)
				before = seen;
			usleep(50);
		}
		printf("urgent watch: %d of %d others placed before it\n",
		       before, X);
		CHECK_EQ(seen, X);
		CHECK(before < X / 2);
		CHECK_EQ(sb_buf_placed(b[X], 3 * PAGE, PAGE), 1);
		for (int i = 0; i < URGENT_N; i++)
			sb_buf_destroy(b[i]);
		VERIFY(q);
		sb_pool_destroy(q);
	}

	/* An unmap ends the watch for good: a page faulted in and entered
	 * just before it (the fault notes the watch after waking its
	 * thread, which may be in the unmap by then), and nothing of the
	 * range placed again after the unmap returns, by the watch or a
	 * touch (sbi_bg_quiet_begin holds them off until the unmap is done). */
	for (int i = 0; i < 200; i++) {
		struct sb_buf *b = make_buf(p, 8 * PAGE, SB_BUF_GROWS);
		char *base = sb_buf_addr(b);

		CHECK_EQ(sb_buf_map(b, 0, PAGE), 1);
		base[PAGE] = 1;	/* a fault: page 1 placed, and entered */
		CHECK(sb_buf_unmap(b, 0, 8 * PAGE) >= 2);
		usleep(i % 4 ? 300 : 3000);
		if (sb_buf_placed(b, 0, 8 * PAGE) != 0)
			FAIL("round %d: %ld pages placed after the unmap", i,
			     sb_buf_placed(b, 0, 8 * PAGE));
		sb_buf_destroy(b);
	}
	CHECK_EQ(stats(p).pages_used, 0);

	/* Released under a working watch: 300 buffers each entered, then
	 * unmapped or destroyed at once. */
	for (int i = 0; i < 300; i++) {
		struct sb_buf *b = make_buf(p, 8 * PAGE, SB_BUF_GROWS);
		char *base = sb_buf_addr(b);

		CHECK_EQ(sb_buf_map(b, 0, 2 * PAGE), 2);
		memset(base + PAGE, 1, 64);	/* enter the frontier */
		if (i % 3 == 0)
			usleep(1500);	/* let the watch place ahead */
		if (i % 2)
			CHECK(sb_buf_unmap(b, 0, 8 * PAGE) >= 2);
		sb_buf_destroy(b);
	}
	usleep(20000);
	CHECK_EQ(stats(p).pages_used, 0);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("ok\n");
	return 0;
}
