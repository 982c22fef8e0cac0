/* Sharing with copy-on-write: both directions, pages counted once, the last
 * holder keeps the page without a copy, dst replaced, unplaced sources,
 * same-buffer shares, chains, a KV-style shared prompt, concurrent writers
 * on both sides, writes racing a share into its destination, and SIGBUS
 * when a copy cannot be had, also for writers whose fault waits signals
 * keep interrupting (no write may be lost). */
#include "harness.h"

#include <pthread.h>

#define PAGE (256 * KiB)

static void fill(char *p, size_t len, int seed)
{
	for (size_t i = 0; i < len; i += 512)
		p[i] = (char)(seed + (int)(i / 512) % 97);
}

static int check_fill(const char *p, size_t len, int seed)
{
	for (size_t i = 0; i < len; i += 512)
		if (p[i] != (char)(seed + (int)(i / 512) % 97))
			return 0;
	return 1;
}

/*
 * Every write to a shared page whose copy cannot be had raises a signal at
 * that page, also when signals keep interrupting the writer's wait: none
 * may seem to succeed (and be lost). Exit codes: 0 all signalled, 6 a write
 * went through, 7 a read afterwards was wrong.
 */
static int cow_budget_signals(void)
{
	enum { N = 64 };
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, N * PAGE);
	struct sb_buf *a = make_buf(p, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0);
	volatile char *y = sb_buf_addr(b);

	if (sb_buf_map(a, 0, N * PAGE) != N)
		return 3;
	fill(sb_buf_addr(a), N * PAGE, 5);
	if (sb_buf_share(b, 0, a, 0, N * PAGE) != N)
		return 4;
	if (touch_signalled(y, PAGE, N, true).went_through)
		return 6;
	return check_fill((const char *)y, N * PAGE, 5) ? 0 : 7;
}

static int child(const char *name)
{
	if (!strcmp(name, "cow-budget-signals"))
		return cow_budget_signals();
	if (!strcmp(name, "cow-budget")) {
		/* Four pages of budget, all in use by a shared pair: the
		 * first write cannot get its copy. Reads still work. */
		struct sb_pool *p = make_pool(PAGE, 64 * MiB, 4 * PAGE);
		struct sb_buf *a = make_buf(p, 64 * MiB, 0);
		struct sb_buf *b = make_buf(p, 64 * MiB, 0);
		volatile char *y = sb_buf_addr(b);

		if (sb_buf_map(a, 0, 4 * PAGE) != 4)
			return 3;
		fill(sb_buf_addr(a), 4 * PAGE, 5);
		if (sb_buf_share(b, 0, a, 0, 4 * PAGE) != 4)
			return 4;
		if (!check_fill((const char *)y, 4 * PAGE, 5))
			return 5;
		expect_signal_at((char *)y + PAGE, PAGE);
		y[PAGE + 3] = 1;
		return 6;
	}
	return 2;
}

static void both_directions(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *a = make_buf(p, 1 * GiB, 0), *b = make_buf(p, 1 * GiB, 0);
	char *x = sb_buf_addr(a), *y = sb_buf_addr(b);
	struct sb_stats st;

	CHECK_EQ(sb_buf_map(a, 0, 8 * PAGE), 8);
	fill(x, 8 * PAGE, 1);
	CHECK_EQ(sb_buf_share(b, 0, a, 0, 8 * PAGE), 8);
	CHECK(check_fill(y, 8 * PAGE, 1));
	st = stats(p);
	CHECK_EQ(st.pages_used, 8);	/* once */
	CHECK_EQ(sb_buf_placed(b, 0, 8 * PAGE), 8);

	/* dst -> private copy; src unchanged. */
	y[3 * PAGE + 100] = 'd';
	CHECK(check_fill(x, 8 * PAGE, 1));
	CHECK_EQ(x[3 * PAGE + 100], 0);	/* fill() writes every 512th byte */
	CHECK_EQ(y[3 * PAGE + 100], 'd');
	CHECK_EQ(y[3 * PAGE], x[3 * PAGE]);	/* rest of the page copied */
	/* src -> private copy; dst unchanged. */
	x[5 * PAGE] = 's';
	CHECK_EQ(y[5 * PAGE], (char)(1 + (5 * PAGE / 512) % 97));
	CHECK_EQ(x[5 * PAGE], 's');
	st = stats(p);
	CHECK_EQ(st.cow_copies, 2);
	CHECK_EQ(st.pages_used, 10);
	VERIFY(p);
	/* A second write to a copied page costs nothing more. */
	y[3 * PAGE + 200] = 'e';
	x[5 * PAGE + 1] = 't';
	CHECK_EQ(stats(p).cow_copies, 2);

	/* The last holder keeps the page without a copy. */
	sb_buf_destroy(a);
	st = stats(p);
	CHECK_EQ(st.pages_used, 8);
	y[0] = 'z';
	y[7 * PAGE] = 'z';
	st = stats(p);
	CHECK_EQ(st.cow_copies, 2);
	CHECK_EQ(st.pages_used, 8);
	CHECK(st.faults >= 4);	/* the unprotect faults */
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
}

static void replace_and_holes(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *a = make_buf(p, 64 * MiB, 0), *b = make_buf(p, 64 * MiB, 0);
	char *x = sb_buf_addr(a), *y = sb_buf_addr(b);

	/* dst had its own pages: replaced and released. */
	CHECK_EQ(sb_buf_map(b, 0, 4 * PAGE), 4);
	memset(y, 'o', 4 * PAGE);
	/* src has pages 0, 2 placed, 1, 3 not. */
	CHECK_EQ(sb_buf_map(a, 0, PAGE), 1);
	CHECK_EQ(sb_buf_map(a, 2 * PAGE, PAGE), 1);
	memset(x, 'a', PAGE);
	memset(x + 2 * PAGE, 'c', PAGE);
	CHECK_EQ(stats(p).pages_used, 6);
	CHECK_EQ(sb_buf_share(b, 0, a, 0, 4 * PAGE - 1), 2);	/* rounded */
	CHECK_EQ(stats(p).pages_used, 2);
	CHECK_EQ(sb_buf_placed(b, 0, 4 * PAGE), 2);
	CHECK_EQ(y[10], 'a');
	CHECK_EQ(y[2 * PAGE + 10], 'c');
	CHECK_EQ(y[PAGE + 10], 0);	/* unplaced in src: fresh zero page */
	CHECK_EQ(y[3 * PAGE], 0);
	CHECK_EQ(stats(p).pages_used, 4);
	CHECK(stats(p).unmaps >= 4);
	VERIFY(p);

	/* Same buffer, other place: a[8..10) shows a[0..2). */
	CHECK_EQ(sb_buf_share(a, 8 * PAGE, a, 0, 2 * PAGE), 1);
	CHECK_EQ(x[8 * PAGE + 5], 'a');
	x[8 * PAGE + 5] = 'q';
	CHECK_EQ(x[5], 'a');
	CHECK_EQ(x[8 * PAGE + 5], 'q');
	/* Chains: b's shared page shared again into a third buffer. */
	{
		struct sb_buf *c = make_buf(p, 64 * MiB, 0);
		char *z = sb_buf_addr(c);
		size_t used = stats(p).pages_used;

		CHECK_EQ(sb_buf_share(c, 0, b, 2 * PAGE, PAGE), 1);
		CHECK_EQ(stats(p).pages_used, used);
		CHECK_EQ(z[1], 'c');
		z[1] = 'Z';
		CHECK_EQ(y[2 * PAGE + 1], 'c');
		CHECK_EQ(x[2 * PAGE + 1], 'c');
		sb_buf_destroy(c);
	}
	sb_buf_destroy(a);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
}

/* Eight sessions with a common 2k-token prompt (16 pages of 2 KiB rows),
 * each continuing on its own. */
static void shared_prompt(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *parent = make_buf(p, 1 * GiB, 0), *s[8];
	size_t prompt = 16 * PAGE;

	CHECK_EQ(sb_buf_map(parent, 0, prompt), 16);
	fill(sb_buf_addr(parent), prompt, 9);
	for (int i = 0; i < 8; i++) {
		s[i] = make_buf(p, 1 * GiB, 0);
		CHECK_EQ(sb_buf_share(s[i], 0, parent, 0, prompt), 16);
	}
	CHECK_EQ(stats(p).pages_used, 16);
	for (int i = 0; i < 8; i++) {
		char *q = sb_buf_addr(s[i]);

		CHECK(check_fill(q, prompt, 9));
		CHECK_EQ(sb_buf_map(s[i], prompt, (size_t)(i + 1) * PAGE),
			 i + 1);
		memset(q + prompt, i, (size_t)(i + 1) * PAGE);
	}
	CHECK_EQ(stats(p).pages_used, 16 + 36);
	CHECK_EQ(stats(p).cow_copies, 0);
	VERIFY(p);
	sb_buf_destroy(parent);
	CHECK_EQ(stats(p).pages_used, 16 + 36);
	for (int i = 0; i < 8; i++)
		sb_buf_destroy(s[i]);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
}

struct writer {
	char *base;
	int seed;
};

static void *write_pages(void *arg)
{
	struct writer *w = arg;

	for (int i = 0; i < 64; i++)
		for (size_t o = 0; o < PAGE; o += 4096)
			w->base[(size_t)i * PAGE + o + (size_t)w->seed] =
				(char)w->seed;
	return NULL;
}

static void concurrent_writers(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *a = make_buf(p, 64 * MiB, 0), *b = make_buf(p, 64 * MiB, 0);
	struct writer w[4] = {{sb_buf_addr(a), 1}, {sb_buf_addr(a), 2},
			      {sb_buf_addr(b), 3}, {sb_buf_addr(b), 4}};
	pthread_t th[4];

	CHECK_EQ(sb_buf_map(a, 0, 64 * PAGE), 64);
	memset(sb_buf_addr(a), 0x11, 64 * PAGE);
	CHECK_EQ(sb_buf_share(b, 0, a, 0, 64 * PAGE), 64);
	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, write_pages, &w[i]);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	/* Each side sees its own writers' bytes and the old data. */
	for (int i = 0; i < 64; i++) {
		for (size_t o = 0; o < PAGE; o += 4096) {
			char *xa = (char *)sb_buf_addr(a) + (size_t)i * PAGE + o;
			char *xb = (char *)sb_buf_addr(b) + (size_t)i * PAGE + o;

			CHECK(xa[1] == 1 && xa[2] == 2);
			CHECK(xa[3] == 0x11 && xa[4] == 0x11);
			CHECK(xb[3] == 3 && xb[4] == 4);
			CHECK(xb[1] == 0x11 && xb[2] == 0x11);
			CHECK(xa[100] == 0x11 && xb[100] == 0x11);
		}
	}
	CHECK_EQ(stats(p).pages_used, 128);
	VERIFY(p);
	CHECK(stats(p).cow_copies >= 64);	/* a last holder needs none */
	sb_buf_destroy(a);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
}

/*
 * Writes into dst racing a share into it: each is ordered before the share
 * (the share's data replaces it) or after (a copy on write of the share's
 * page, which the pool knows of). A private copy the kernel made for a
 * write between the share's mapping and its protection must not outlive
 * the share (vma.c, drop_copies): dst would show a byte that its pages do
 * not hold, and a share from dst would not show it.
 */
void sbi_test_pagemap_fail(unsigned count);

/* pagemap_fails: drop_copies cannot read pagemap (its fallback). */
static void writes_racing_share(bool pagemap_fails)
{
	/* TSan makes a round 4 times slower; the race is the same. */
	enum { N = 16, ROUNDS = UNDER_TSAN ? 30 : 100 };
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *a = make_buf(p, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0);
	struct sb_buf *c = make_buf(p, 64 * MiB, 0);
	char *xb = sb_buf_addr(b), *xc = sb_buf_addr(c);
	int bad = 0;

	CHECK_EQ(sb_buf_map(a, 0, N * PAGE), N);
	CHECK_EQ(sb_buf_map(b, 0, N * PAGE), N);
	fill(xb, N * PAGE, 99);
	for (int round = 0; round < ROUNDS; round++) {
		struct racing_writer r = {xb, N * PAGE, false};
		pthread_t th;

		fill(sb_buf_addr(a), N * PAGE, round);
		sbi_test_pagemap_fail(pagemap_fails ? 1000 : 0);
		pthread_create(&th, NULL, racing_writes, &r);
		CHECK_EQ(sb_buf_share(b, 0, a, 0, N * PAGE), N);
		atomic_store(&r.stop, true);
		pthread_join(th, NULL);
		CHECK(check_fill(xb, N * PAGE, round));
		CHECK(check_fill(sb_buf_addr(a), N * PAGE, round));
		/* What b shows is what its pages hold. */
		CHECK_EQ(sb_buf_share(c, 0, b, 0, N * PAGE), N);
		bad += memcmp(xb, xc, N * PAGE) != 0;
	}
	CHECK_EQ(bad, 0);
	VERIFY(p);
	sb_buf_destroy(a);
	sb_buf_destroy(b);
	sb_buf_destroy(c);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
	sbi_test_pagemap_fail(0);
	printf("writes racing %d shares%s: dst held what it showed each "
	       "time\n",
	       ROUNDS, pagemap_fails ? " (no pagemap)" : "");
}

/*
 * A share whose protection fails must not leave dst showing pages it gave
 * back: the pool hands them to the next buffer, and dst would read that
 * one's data. The range is unplaced; where that fails too (at
 * vm.max_map_count), it is made inaccessible (lib/buf.c, install_finish).
 */
void sbi_test_share_fail(int err, unsigned count);
void sbi_test_unplace_fail(int err, unsigned count);

static void share_unprotected(void)
{
	enum { N = 8 };
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *a = make_buf(p, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0);
	struct sb_buf *c = make_buf(p, 64 * MiB, 0);
	char *xb = sb_buf_addr(b);
	struct signalled_touches t;

	CHECK_EQ(sb_buf_map(a, 0, N * PAGE), N);
	fill(sb_buf_addr(a), N * PAGE, 7);
	/* Unplaced: dst's range is holes again, which read as zeros. */
	sbi_test_share_fail(ENOMEM, 1);
	CHECK_EQ(sb_buf_share(b, 0, a, 0, N * PAGE), -ENOMEM);
	CHECK_EQ(stats(p).pages_used, N);
	CHECK_EQ(xb[0], 0);
	CHECK_EQ(xb[(N - 1) * PAGE + 512], 0);
	CHECK_EQ(sb_buf_unmap(b, 0, N * PAGE), 2);
	/* Not even that: inaccessible, the references given back all the
	 * same, and a's pages, freed and taken by c, never read through b. */
	sbi_test_share_fail(ENOMEM, 1);
	sbi_test_unplace_fail(ENOMEM, 1);
	CHECK_EQ(sb_buf_share(b, 0, a, 0, N * PAGE), -ENOMEM);
	sbi_test_unplace_fail(0, 0);
	CHECK_EQ(stats(p).pages_used, N);
	sb_buf_destroy(a);
	CHECK_EQ(sb_buf_map(c, 0, N * PAGE), N);
	fill(sb_buf_addr(c), N * PAGE, 11);
	t = touch_signalled(xb, PAGE, N, false);
	CHECK_EQ(t.went_through, 0);
	CHECK_EQ(t.sigsegv, N);
	/* The range is usable again once placed anew. */
	CHECK_EQ(sb_buf_map(b, 0, N * PAGE), N);
	CHECK_EQ(xb[0], 0);
	CHECK_EQ(xb[(N - 1) * PAGE + 512], 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_buf_destroy(c);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
	printf("a share that could not be protected: unplaced, or "
	       "inaccessible, never another buffer's data\n");
}

static int main_test(void)
{
	require_cow();
	both_directions();
	replace_and_holes();
	shared_prompt();
	concurrent_writers();
	writes_racing_share(false);
	writes_racing_share(true);
	share_unprotected();
	CHECK_EQ(child_exit_code(run_child("cow-budget")), EXIT_GOT_SIGBUS);
	CHECK_EQ(child_exit_code(run_child("cow-budget-signals")), 0);
	printf("sharing: ok\n");
	return 0;
}
