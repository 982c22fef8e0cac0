/* The disk tier, automatic eviction: a SB_BUF_EVICTABLE buffer in a pool
 * with a budget works on a working set four times the budget (random
 * pages, reads and writes from two threads, every byte checked) while
 * bytes_resident stays within the budget (sampled all along); buffers
 * without the flag still fail as before (-ENOMEM, SIGBUS) and their pages
 * are never evicted; SB_ADVICE_COLD pages go before SB_ADVICE_HOT ones.
 * Every case runs with both pagers (io_uring and SPARSEBUF_PAGER=sync). */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)
#define BUDGET (1 * MiB)		/* 16 pages */
#define WS_PAGES (4 * BUDGET / PAGE)	/* the working set: 64 pages */

static uint64_t seed_of(unsigned ver, size_t page)
{
	return ((uint64_t)ver << 32) | page;
}

/* ---- a working set 4x the budget ---------------------------------------------- */

struct worker {
	struct sb_buf *b;
	size_t first, n;	/* its pages */
	unsigned ver[WS_PAGES];	/* current version of each page */
	unsigned seed;
	long ops, bad, over, map_err;
	size_t max_bytes;
};

static unsigned rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

static void sample(struct worker *w)
{
	struct sb_stats st;

	if (sb_pool_stats(sb_buf_pool(w->b), &st) == 0 &&
	    st.bytes_resident > w->max_bytes)
		w->over++;
}

/* What a wrong page holds instead, for the report: how many words differ,
 * how long the first wrong run is, and which version (or zeros) its first
 * word comes from. */
static void explain(const char *page, size_t pg, unsigned ver, long off)
{
	const uint64_t *w = (const uint64_t *)page;
	size_t first = (size_t)off / 8, run = 0, nbad = 0;
	int from = -1;

	for (size_t i = 0; i < PAGE / 8; i++)
		nbad += w[i] != disk_word(seed_of(ver, pg), i);
	while (first + run < PAGE / 8 &&
	       w[first + run] != disk_word(seed_of(ver, pg), first + run))
		run++;
	for (unsigned v = 0; v < ver && from < 0; v++)
		if (w[first] == disk_word(seed_of(v, pg), first))
			from = (int)v;
	if (!run) {
		fprintf(stderr,
			"page %zu (version %u) differed from byte %ld, but "
			"reads right there now (%zu words still wrong): it "
			"changed under the reader\n",
			pg, ver, off, nbad);
		return;
	}
	fprintf(stderr,
		"page %zu (version %u) differs from byte %ld: %zu of %zu words "
		"wrong, the first run %zu words, holding %s %d\n",
		pg, ver, off, nbad, PAGE / 8, run,
		w[first] == 0 ? "zeros, version" : "version", from);
}

static void check_page(struct worker *w, size_t pg)
{
	char *x = sb_buf_addr(w->b);
	long off = disk_check(x + pg * PAGE, PAGE, seed_of(w->ver[pg], pg));

	if (off >= 0 && w->bad++ < 5)
		explain(x + pg * PAGE, pg, w->ver[pg], off);
}

static void *work(void *arg)
{
	struct worker *w = arg;
	char *x = sb_buf_addr(w->b);

	/* Write every page once (faults on fresh pages). */
	for (size_t pg = w->first; pg < w->first + w->n; pg++) {
		w->ver[pg] = 1;
		disk_fill(x + pg * PAGE, PAGE, seed_of(1, pg));
		sample(w);
	}
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 150; i++) {
			unsigned r = rnd(&w->seed);
			size_t pg = w->first + r % w->n;

			switch ((r >> 8) % 5) {
			case 0:
			case 1:	/* rewrite the page: a write fault */
				w->ver[pg]++;
				disk_fill(x + pg * PAGE, PAGE,
					  seed_of(w->ver[pg], pg));
				break;
			case 2: {	/* place it first, then read */
				long m = sb_buf_map(w->b, pg * PAGE, PAGE);

				if (m < 0 && w->map_err++ < 5)
					fprintf(stderr, "sb_buf_map: %s\n",
						strerror((int)-m));
				check_page(w, pg);
				break;
			}
			case 3: {	/* prefetch and wait, then read */
				struct sb_range rg = {pg * PAGE, PAGE};
				long m = sb_buf_prefetch(w->b, &rg, 1,
							 SB_PREFETCH_WAIT);

				if (m < 0 && w->map_err++ < 5)
					fprintf(stderr, "sb_buf_prefetch: %s\n",
						strerror((int)-m));
				check_page(w, pg);
				break;
			}
			default:	/* read: a read fault */
				check_page(w, pg);
				break;
			}
			w->ops++;
			sample(w);
		}
		/* Every byte of every page, each round. */
		for (size_t pg = w->first; pg < w->first + w->n; pg++) {
			check_page(w, pg);
			sample(w);
		}
	}
	return NULL;
}

static void working_set(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, BUDGET);
	struct sb_buf *b = make_buf(p, 1 * GiB, SB_BUF_EVICTABLE);
	static struct worker w[2];
	struct budget_watch wt;
	pthread_t th[2];
	struct sb_stats st;
	double t0;

	CHECK_EQ(stats(p).max_bytes, BUDGET);
	for (int i = 0; i < 2; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].b = b;
		w[i].first = (size_t)i * WS_PAGES / 2;
		w[i].n = WS_PAGES / 2;
		w[i].seed = 17u + (unsigned)i;
		w[i].max_bytes = BUDGET;
	}
	budget_watch_start(&wt, p);
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, work, &w[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	budget_watch_stop(&wt, BUDGET);
	st = stats(p);
	printf("working set %zu KiB, budget %zu KiB: %ld operations, %llu "
	       "pages out, %llu in, bytes_resident at most %zu KiB "
	       "(%ld samples)\n",
	       WS_PAGES * PAGE / KiB, BUDGET / KiB, w[0].ops + w[1].ops,
	       (unsigned long long)st.pages_out,
	       (unsigned long long)st.pages_in, wt.max_seen / KiB,
	       wt.samples);
	CHECK_EQ(w[0].bad + w[1].bad, 0);
	CHECK_EQ(w[0].map_err + w[1].map_err, 0);
	CHECK_EQ(w[0].over + w[1].over, 0);
	CHECK(st.bytes_resident <= BUDGET);
	CHECK(st.pages_used <= BUDGET / PAGE);
	CHECK(st.pages_out >= WS_PAGES - BUDGET / PAGE);
	CHECK(st.pages_in > 0);
	CHECK_EQ(st.io_errors, 0);
	CHECK(st.spill_bytes > 0);
	/* Read-ahead still in flight holds pages not placed yet: settle. */
	t0 = now_s();
	WAIT_FOR(stats(p).pages_used == (size_t)sb_buf_placed(b, 0, 1 * GiB),
		 5);
	if (now_s() - t0 > 0.001)
		printf("(pages_used settled after %.0f ms)\n",
		       (now_s() - t0) * 1e3);
	CHECK_EQ(stats(p).pages_used, sb_buf_placed(b, 0, 1 * GiB));
	VERIFY(p);
	/* Once more from this thread, every byte. */
	for (int i = 0; i < 2; i++)
		for (size_t pg = w[i].first; pg < w[i].first + w[i].n; pg++)
			check_page(&w[i], pg);
	CHECK_EQ(w[0].bad + w[1].bad, 0);
	CHECK(stats(p).bytes_resident <= BUDGET);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(stats(p).spill_bytes, 0);
	sb_pool_destroy(p);
}

/* ---- buffers without the flag ---------------------------------------------- */

static void not_evictable(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, BUDGET);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	struct sb_buf *e;
	char *x = sb_buf_addr(b);
	struct worker w;
	pthread_t th;
	struct sb_stats st;

	/* Alone in the pool: the budget fails as it always did. */
	CHECK_EQ(sb_buf_map(b, 0, BUDGET), BUDGET / PAGE);
	CHECK_EQ(sb_buf_map(b, BUDGET, PAGE), -ENOMEM);
	CHECK_EQ(sb_buf_placed(b, 0, 1 * GiB), BUDGET / PAGE);
	CHECK_EQ(stats(p).pages_out, 0);
	CHECK(sb_buf_unmap(b, 0, 1 * GiB) >= 0);

	/* Next to an evictable buffer at work, its pages are never
	 * evicted. */
	CHECK_EQ(sb_buf_map(b, 0, 6 * PAGE), 6);
	for (size_t i = 0; i < 6; i++)
		disk_fill(x + i * PAGE, PAGE, seed_of(99, i));
	e = make_buf(p, 1 * GiB, SB_BUF_EVICTABLE);
	memset(&w, 0, sizeof(w));
	w.b = e;
	w.first = 0;
	w.n = 24;	/* 2.4 times the room left */
	w.seed = 5;
	w.max_bytes = BUDGET;
	pthread_create(&th, NULL, work, &w);
	pthread_join(th, NULL);
	CHECK_EQ(w.bad, 0);
	CHECK_EQ(w.map_err, 0);
	CHECK_EQ(w.over, 0);
	st = stats(p);
	CHECK(st.pages_out > 0);
	CHECK_EQ(sb_buf_placed(b, 0, 1 * GiB), 6);
	for (size_t i = 0; i < 6; i++)
		CHECK_EQ(disk_check(x + i * PAGE, PAGE, seed_of(99, i)), -1);
	VERIFY(p);
	sb_buf_destroy(e);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	/* A fault beyond the budget in a buffer without the flag. */
	CHECK_EQ(child_exit_code(run_child("noevict-fault")), EXIT_GOT_SIGBUS);
}

/* ---- hot and cold ------------------------------------------------------------ */

/* A budget of NP pages, all placed; half marked COLD, half HOT; one more
 * page placed must evict a COLD one. cold_last: the COLD half is the one
 * placed and touched last, so plain LRU order would pick a HOT page. */
static void hot_cold(int cold_last)
{
	enum { NP = 8 };
	struct sb_pool *p = disk_pool(PAGE, HEAP, NP * PAGE);
	struct sb_buf *b = make_buf(p, 64 * MiB, SB_BUF_EVICTABLE);
	char *x = sb_buf_addr(b);
	size_t hot = cold_last ? 0 : NP / 2, cold = cold_last ? NP / 2 : 0;
	struct sb_stats s0, s1;

	CHECK_EQ(sb_buf_map(b, 0, NP * PAGE), NP);
	for (size_t i = 0; i < NP; i++)
		disk_fill(x + i * PAGE, PAGE, seed_of(7, i));
	for (size_t i = 0; i < NP; i++)	/* in order: page NP-1 is newest */
		CHECK_EQ(disk_check(x + i * PAGE, PAGE, seed_of(7, i)), -1);
	CHECK_EQ(sb_buf_advise(b, cold * PAGE, NP / 2 * PAGE, SB_ADVICE_COLD),
		 NP / 2);
	CHECK_EQ(sb_buf_advise(b, hot * PAGE, NP / 2 * PAGE, SB_ADVICE_HOT),
		 NP / 2);
	s0 = stats(p);
	CHECK_EQ(s0.pages_out, 0);
	CHECK_EQ(sb_buf_placed(b, 0, 64 * MiB), NP);
	/* One more page: the budget forces an eviction. */
	((volatile char *)x)[NP * PAGE + 5] = 1;
	s1 = stats(p);
	CHECK(s1.pages_out > 0);
	CHECK(s1.bytes_resident <= NP * PAGE);
	CHECK_EQ(sb_buf_placed(b, NP * PAGE, PAGE), 1);
	if (sb_buf_placed(b, hot * PAGE, NP / 2 * PAGE) != NP / 2)
		FAIL("cold %s: a HOT page was evicted (HOT placed %ld, COLD "
		     "placed %ld)",
		     cold_last ? "last" : "first",
		     sb_buf_placed(b, hot * PAGE, NP / 2 * PAGE),
		     sb_buf_placed(b, cold * PAGE, NP / 2 * PAGE));
	CHECK(sb_buf_placed(b, cold * PAGE, NP / 2 * PAGE) < NP / 2);
	/* Everything still reads back. */
	for (size_t i = 0; i < NP; i++)
		CHECK_EQ(disk_check(x + i * PAGE, PAGE, seed_of(7, i)), -1);
	CHECK_EQ(((volatile char *)x)[NP * PAGE + 5], 1);
	CHECK(stats(p).bytes_resident <= NP * PAGE);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static int child(const char *name)
{
	if (!strcmp(name, "body")) {
		working_set();
		not_evictable();
		hot_cold(0);
		hot_cold(1);
		printf("autoevict: ok\n");
		return 0;
	}
	if (!strcmp(name, "noevict-fault")) {
		struct sb_pool *p = disk_pool(PAGE, HEAP, BUDGET);
		struct sb_buf *b = make_buf(p, 1 * GiB, 0);
		volatile char *x = sb_buf_addr(b);

		for (size_t i = 0; i < BUDGET / PAGE; i++)
			x[i * PAGE] = 1;
		if (stats(p).pages_used != BUDGET / PAGE)
			return 3;
		expect_signal_at((char *)x + BUDGET, PAGE);
		x[BUDGET + 9] = 1;
		return 4;	/* a page beyond the budget, silently */
	}
	return 2;
}

static int main_test(void)
{
	return run_disk_body(120);
}
