/* The disk tier, explicit eviction: sb_buf_evict writes placed pages out
 * and releases them; a later touch (read or write, any thread), sb_buf_map
 * or sb_buf_prefetch(SB_PREFETCH_WAIT) brings the exact bytes back;
 * sb_buf_unmap of an evicted page discards it; strict buffers; a shared
 * page evicted from one holder; SB_ADVICE_DONTNEED / SB_ADVICE_WILLNEED;
 * many threads paging in at once (several buffers, the same page); unmap
 * and evict racing page-ins; writers interrupted by signals while their
 * pages are evicted lose no write. Every case runs twice: with the default
 * pager (io_uring) and with SPARSEBUF_PAGER=sync (pread/pwrite). */
#include "harness.h"

#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)

static uint64_t seed_of(unsigned tag, size_t page)
{
	return ((uint64_t)tag << 32) | page;
}

static void fill_pages(char *x, size_t first, size_t n, unsigned tag)
{
	for (size_t i = first; i < first + n; i++)
		disk_fill(x + i * PAGE, PAGE, seed_of(tag, i));
}

/* Every byte of pages [first, first+n) as fill_pages(tag) wrote them. */
static void check_pages_at(const char *x, size_t first, size_t n,
			   unsigned tag, int line)
{
	for (size_t i = first; i < first + n; i++) {
		long bad = disk_check(x + i * PAGE, PAGE, seed_of(tag, i));

		if (bad >= 0)
			FAIL("(line %d) page %zu differs at byte %ld: %s", line,
			     i, bad,
			     disk_check_zero(x + i * PAGE, PAGE) < 0
				     ? "the page reads as zeros"
				     : "wrong data");
	}
}
#define check_pages(x, first, n, tag)                                        \
	check_pages_at((x), (first), (n), (tag), __LINE__)

/* Bring page i back with a write (a write fault), then check every byte. */
static void write_touch_check(char *x, size_t i, unsigned tag)
{
	volatile uint64_t *last = (volatile uint64_t *)(x + (i + 1) * PAGE) - 1;
	uint64_t want = disk_word(seed_of(tag, i), PAGE / 8 - 1);
	long bad;

	*last = ~want;
	CHECK(*last == ~want);
	bad = disk_check(x + i * PAGE, PAGE - 8, seed_of(tag, i));
	if (bad >= 0)
		FAIL("page %zu (written first) differs at byte %ld", i, bad);
	*last = want;
}

static long spill_entries(void)
{
	char path[512];
	struct dirent *e;
	long n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "%s/spill", disk_dir());
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

/* ---- evict, then every way back ------------------------------------------ */

struct reader {
	char *x;
	size_t first, n;
	unsigned tag;
	long bad;
};

static void *read_pages(void *arg)
{
	struct reader *r = arg;

	for (size_t i = r->first; i < r->first + r->n; i++)
		r->bad += disk_check(r->x + i * PAGE, PAGE, seed_of(r->tag, i)) >=
			  0;
	return NULL;
}

static void basic(void)
{
	enum { N = 32, LEN = 48 };
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0);
	char *x = sb_buf_addr(b);
	struct sb_range r = {24 * PAGE, 6 * PAGE};
	struct reader rd[2] = {{x, 22, 2, 1, 0}, {x, 30, 2, 1, 0}};
	struct sb_stats s0, s1;
	pthread_t th[2];

	/* Arguments. */
	CHECK_EQ(sb_buf_evict(NULL, 0, PAGE), -EINVAL);
	CHECK_EQ(sb_buf_evict(b, 0, 64 * MiB + 1), -ERANGE);
	CHECK_EQ(sb_buf_evict(b, 64 * MiB, 1), -ERANGE);
	CHECK_EQ(sb_buf_evict(b, SIZE_MAX - PAGE, 2 * PAGE), -ERANGE);
	CHECK_EQ(sb_buf_evict(b, 0, 0), 0);
	CHECK_EQ(sb_buf_evict(b, 0, 64 * MiB), 0);	/* nothing placed */

	CHECK_EQ(sb_buf_map(b, 0, N * PAGE), N);
	fill_pages(x, 0, N, 1);
	s0 = stats(p);
	CHECK_EQ(s0.pages_used, N);
	CHECK_EQ(s0.pages_out, 0);
	CHECK_EQ(s0.spill_bytes, 0);
	/* Pages wholly inside the range only; pages N..LEN never placed are
	 * skipped. */
	CHECK_EQ(sb_buf_evict(b, PAGE / 2, 2 * PAGE), 1);
	CHECK_EQ(sb_buf_placed(b, 0, 3 * PAGE), 2);
	CHECK_EQ(sb_buf_placed(b, PAGE, 1), 0);
	CHECK_EQ(stats(p).pages_used, N - 1);
	CHECK_EQ(sb_buf_evict(b, 0, LEN * PAGE), N - 1);
	CHECK_EQ(sb_buf_evict(b, 0, LEN * PAGE), 0);	/* already out */
	CHECK_EQ(sb_buf_placed(b, 0, 64 * MiB), 0);
	s1 = stats(p);
	CHECK_EQ(s1.pages_used, 0);
	CHECK_EQ(s1.pages_out - s0.pages_out, N);
	CHECK(s1.bytes_written - s0.bytes_written >= N * PAGE);
	CHECK(s1.spill_bytes >= N * PAGE);
	CHECK_EQ(s1.pages_in, s0.pages_in);
	CHECK_EQ(s1.io_errors, 0);
	/* The spill file is unlinked: nothing shows in the directory. */
	CHECK_EQ(spill_entries(), 0);
	VERIFY(p);

	/* sb_buf_map reads the data back before it returns. */
	CHECK_EQ(sb_buf_map(b, 16 * PAGE, 6 * PAGE), 6);
	CHECK_EQ(sb_buf_placed(b, 16 * PAGE, 6 * PAGE), 6);
	s0 = stats(p);
	CHECK(s0.pages_in - s1.pages_in >= 6);
	CHECK(s0.bytes_read - s1.bytes_read >= 6 * PAGE);
	/* So does sb_buf_prefetch with SB_PREFETCH_WAIT. */
	CHECK_EQ(sb_buf_prefetch(b, &r, 1, SB_PREFETCH_WAIT), 6);
	CHECK_EQ(sb_buf_placed(b, 24 * PAGE, 6 * PAGE), 6);
	CHECK(stats(p).pages_in - s0.pages_in >= 6);
	check_pages(x, 16, 6, 1);
	check_pages(x, 24, 6, 1);
	/* Touches: reads (pages 0..7), writes (8..15), other threads (22,
	 * 23, 30, 31). */
	check_pages(x, 0, 8, 1);
	for (size_t i = 8; i < 16; i++)
		write_touch_check(x, i, 1);
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, read_pages, &rd[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	CHECK_EQ(rd[0].bad + rd[1].bad, 0);
	s0 = stats(p);
	CHECK_EQ(sb_buf_placed(b, 0, N * PAGE), N);
	CHECK_EQ(s0.pages_used, N);
	CHECK_EQ(s0.pages_in - s1.pages_in, N);	/* each page read once */
	CHECK(s0.bytes_read - s1.bytes_read >= N * PAGE);
	CHECK_EQ(s0.io_errors, 0);
	check_pages(x, 0, N, 1);
	VERIFY(p);

	/* Round trips with new contents each time: the spill space is
	 * reused, not grown. */
	for (unsigned t = 2; t < 7; t++) {
		fill_pages(x, 0, N, t);
		CHECK_EQ(sb_buf_evict(b, 0, LEN * PAGE), N);
		/* Every page out is on disk, but a page may be back already:
		 * a handler preempted since the last round may only now
		 * serve a fault message it read then (a duplicate of one
		 * served), and a missing page on disk is read in. Stats
		 * first: a page read in meanwhile then counts once. */
		s0 = stats(p);
		CHECK(s0.spill_bytes >=
		      (N - (size_t)sb_buf_placed(b, 0, N * PAGE)) * PAGE);
		CHECK(s0.spill_bytes <= 2 * N * PAGE);
		if (t % 2)
			check_pages(x, 0, N, t);
		else
			for (size_t i = 0; i < N; i++)
				write_touch_check(x, i, t);
	}
	CHECK_EQ(stats(p).pages_used, N);

	/* sb_buf_unmap of evicted pages discards them: zeros, spill space
	 * given back, nothing read. */
	fill_pages(x, 0, 8, 9);
	CHECK_EQ(sb_buf_evict(b, 0, 8 * PAGE), 8);
	s0 = stats(p);
	CHECK(sb_buf_unmap(b, 0, 8 * PAGE) >= 0);
	s1 = stats(p);
	CHECK(s1.spill_bytes + 8 * PAGE <= s0.spill_bytes);
	CHECK_EQ(s1.pages_used, N - 8);
	CHECK_EQ(sb_buf_placed(b, 0, 8 * PAGE), 0);
	for (size_t i = 0; i < 8; i++)
		CHECK_EQ(disk_check_zero(x + i * PAGE, PAGE), -1);
	CHECK_EQ(stats(p).pages_in, s1.pages_in);
	check_pages(x, 8, N - 8, 6);	/* the others untouched */
	/* A page never placed in an evicted range is still a zero page. */
	CHECK_EQ(disk_check_zero(x + 40 * PAGE, PAGE), -1);
	VERIFY(p);

	/* Destroying a buffer with evicted pages frees their spill space. */
	CHECK_EQ(sb_buf_evict(b, 0, 64 * MiB), N + 1);
	CHECK(stats(p).spill_bytes >= (N + 1) * PAGE);
	sb_buf_destroy(b);
	s0 = stats(p);
	CHECK_EQ(s0.pages_used, 0);
	CHECK_EQ(s0.spill_bytes, 0);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("evict: %d pages out and back by map, prefetch, reads, writes "
	       "and threads\n",
	       N);
}

/* ---- strict buffers --------------------------------------------------------- */

static void strict(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 16 * MiB, SB_BUF_STRICT);
	char *x = sb_buf_addr(b);

	CHECK_EQ(sb_buf_map(b, 0, 4 * PAGE), 4);
	fill_pages(x, 0, 4, 11);
	CHECK_EQ(sb_buf_evict(b, 0, 4 * PAGE), 4);
	CHECK_EQ(sb_buf_placed(b, 0, 4 * PAGE), 0);
	/* Evicted is not unplaced: the touch reads the data, no SIGBUS. */
	check_pages(x, 0, 2, 11);
	write_touch_check(x, 2, 11);
	write_touch_check(x, 3, 11);
	CHECK_EQ(sb_buf_placed(b, 0, 4 * PAGE), 4);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	/* Unmapped after eviction: unplaced, so SIGBUS. */
	CHECK_EQ(child_exit_code(run_child("strict-discard")), EXIT_GOT_SIGBUS);
}

/* ---- shared pages ------------------------------------------------------------ */

static void shared_one_way(struct sb_pool *p, int evict_src)
{
	struct sb_buf *src = make_buf(p, 16 * MiB, 0);
	struct sb_buf *dst = make_buf(p, 16 * MiB, 0);
	struct sb_buf *ev = evict_src ? src : dst, *keep = evict_src ? dst : src;
	char *xe = sb_buf_addr(ev), *xk = sb_buf_addr(keep);
	unsigned tag = 20 + (unsigned)evict_src;
	size_t used0 = stats(p).pages_used;
	struct sb_stats s0, s1;

	CHECK_EQ(sb_buf_map(src, 0, 4 * PAGE), 4);
	fill_pages(sb_buf_addr(src), 0, 4, tag);
	CHECK_EQ(sb_buf_share(dst, 0, src, 0, 4 * PAGE), 4);
	CHECK_EQ(stats(p).pages_used, used0 + 4);
	s0 = stats(p);
	CHECK_EQ(sb_buf_evict(ev, 0, 4 * PAGE), 4);	/* for ev only */
	s1 = stats(p);
	CHECK_EQ(s1.pages_out - s0.pages_out, 4);
	CHECK_EQ(sb_buf_placed(ev, 0, 4 * PAGE), 0);
	CHECK_EQ(sb_buf_placed(keep, 0, 4 * PAGE), 4);
	CHECK_EQ(s1.pages_used, used0 + 4);	/* keep still holds them */
	/* The other holder keeps its page and its view: nothing read. */
	check_pages(xk, 0, 4, tag);
	CHECK_EQ(stats(p).pages_in, s1.pages_in);
	/* The evicting holder reads its copy back. */
	check_pages(xe, 0, 2, tag);
	write_touch_check(xe, 2, tag);
	write_touch_check(xe, 3, tag);
	CHECK_EQ(stats(p).pages_in - s1.pages_in, 4);
	CHECK_EQ(sb_buf_placed(ev, 0, 4 * PAGE), 4);
	/* Writes by either side after that stay on that side. */
	((volatile uint64_t *)xe)[5] = 0x1111;
	((volatile uint64_t *)(xk + PAGE))[5] = 0x2222;
	((volatile uint64_t *)(xk + 3 * PAGE))[7] = 0x3333;
	CHECK(((volatile uint64_t *)xk)[5] == disk_word(seed_of(tag, 0), 5));
	CHECK(((volatile uint64_t *)(xe + PAGE))[5] ==
	      disk_word(seed_of(tag, 1), 5));
	CHECK(((volatile uint64_t *)(xe + 3 * PAGE))[7] ==
	      disk_word(seed_of(tag, 3), 7));
	CHECK(((volatile uint64_t *)xe)[5] == 0x1111);
	CHECK(((volatile uint64_t *)(xk + PAGE))[5] == 0x2222);
	((uint64_t *)xe)[5] = disk_word(seed_of(tag, 0), 5);
	((uint64_t *)(xk + PAGE))[5] = disk_word(seed_of(tag, 1), 5);
	((uint64_t *)(xk + 3 * PAGE))[7] = disk_word(seed_of(tag, 3), 7);
	check_pages(xe, 0, 4, tag);
	check_pages(xk, 0, 4, tag);
	VERIFY(p);
	sb_buf_destroy(src);
	sb_buf_destroy(dst);
	CHECK_EQ(stats(p).pages_used, used0);
}

static void shared(void)
{
	struct sb_features f;
	struct sb_pool *p;

	sb_features_get(&f);
	if (!f.wp_shmem) {
		printf("shared: not run, kernel %s has no write-protect on "
		       "shmem\n",
		       f.kernel);
		return;
	}
	p = disk_pool(PAGE, HEAP, 0);
	shared_one_way(p, 1);	/* evicted from the source of the share */
	shared_one_way(p, 0);	/* evicted from the destination */
	CHECK_EQ(stats(p).spill_bytes, 0);
	sb_pool_destroy(p);
}

/* ---- advice ------------------------------------------------------------------ */

static void advice(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 16 * MiB, 0);
	char *x = sb_buf_addr(b);
	struct sb_stats s0, s1;

	CHECK_EQ(sb_buf_advise(NULL, 0, PAGE, SB_ADVICE_COLD), -EINVAL);
	CHECK_EQ(sb_buf_advise(b, 0, 16 * MiB + 1, SB_ADVICE_HOT), -ERANGE);
	CHECK_EQ(sb_buf_advise(b, 0, PAGE, (enum sb_advice)99), -EINVAL);

	CHECK_EQ(sb_buf_map(b, 0, 8 * PAGE), 8);
	fill_pages(x, 0, 8, 30);
	s0 = stats(p);
	CHECK_EQ(sb_buf_advise(b, 0, 8 * PAGE, SB_ADVICE_DONTNEED), 8);
	s1 = stats(p);
	CHECK_EQ(sb_buf_placed(b, 0, 8 * PAGE), 0);
	CHECK_EQ(s1.pages_out - s0.pages_out, 8);
	CHECK_EQ(s1.pages_used, 0);
	/* WILLNEED reads them back in the background: no touch needed. */
	CHECK_EQ(sb_buf_advise(b, 0, 8 * PAGE, SB_ADVICE_WILLNEED), 8);
	WAIT_FOR(sb_buf_placed(b, 0, 8 * PAGE) == 8, 10);
	CHECK_EQ(sb_buf_placed(b, 0, 8 * PAGE), 8);
	CHECK_EQ(stats(p).pages_in - s1.pages_in, 8);
	check_pages(x, 0, 8, 30);
	CHECK_EQ(stats(p).pages_in - s1.pages_in, 8);	/* no fault read */
	/* The count is of pages queued, each once, even when a completion
	 * holds the buffer's lock as the prefetch looks (it counted the
	 * pages on disk twice then). */
	for (int round = 0; round < 200; round++) {
		long q;

		CHECK_EQ(sb_buf_evict(b, 0, 8 * PAGE), 8);
		q = sb_buf_advise(b, 0, 8 * PAGE, SB_ADVICE_WILLNEED);
		if (q != 8)
			FAIL("round %d: WILLNEED of 8 pages on disk queued %ld",
			     round, q);
		WAIT_FOR(sb_buf_placed(b, 0, 8 * PAGE) == 8, 10);
	}
	check_pages(x, 0, 8, 30);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* ---- many threads at once --------------------------------------------------- */

enum { NB = 3, NP = 24, NT = 6, ROUNDS = 50 };

struct conc {
	char *x[NB];
	int id;
	pthread_barrier_t *go;
	long bad;
};

static void *conc_reader(void *arg)
{
	struct conc *c = arg;

	pthread_barrier_wait(c->go);
	for (size_t j = 0; j < NB * NP; j++) {
		/* 7 is prime to NB * NP: a permutation, different per thread. */
		size_t k = (j * 7 + (size_t)c->id * 11) % (NB * NP);
		size_t bi = k / NP, pg = k % NP;

		c->bad += disk_check(c->x[bi] + pg * PAGE, PAGE,
				     seed_of(40 + (unsigned)bi, pg)) >= 0;
	}
	return NULL;
}

static void *same_page_reader(void *arg)
{
	struct conc *c = arg;

	for (int r = 0; r < ROUNDS; r++) {
		pthread_barrier_wait(c->go);	/* page evicted */
		c->bad += disk_check(c->x[0] + (size_t)(r % NP) * PAGE, PAGE,
				     seed_of(40, (size_t)(r % NP))) >= 0;
		pthread_barrier_wait(c->go);	/* both done */
	}
	return NULL;
}

static void threads(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b[NB];
	struct conc c[NT];
	pthread_t th[NT];
	pthread_barrier_t go;
	struct sb_stats s0, s1;

	for (int i = 0; i < NB; i++) {
		b[i] = make_buf(p, 16 * MiB, 0);
		CHECK_EQ(sb_buf_map(b[i], 0, NP * PAGE), NP);
		fill_pages(sb_buf_addr(b[i]), 0, NP, 40 + (unsigned)i);
		CHECK_EQ(sb_buf_evict(b[i], 0, NP * PAGE), NP);
	}
	s0 = stats(p);
	CHECK_EQ(s0.pages_used, 0);
	/* NT threads read every evicted page of every buffer, each in its
	 * own order, all at once. */
	pthread_barrier_init(&go, NULL, NT);
	for (int t = 0; t < NT; t++) {
		c[t] = (struct conc){.id = t, .go = &go};
		for (int i = 0; i < NB; i++)
			c[t].x[i] = sb_buf_addr(b[i]);
		pthread_create(&th[t], NULL, conc_reader, &c[t]);
	}
	for (int t = 0; t < NT; t++)
		pthread_join(th[t], NULL);
	pthread_barrier_destroy(&go);
	for (int t = 0; t < NT; t++)
		if (c[t].bad)
			FAIL("thread %d read %ld wrong pages", t, c[t].bad);
	s1 = stats(p);
	/* A touch of a page already being read waits for that read. */
	CHECK_EQ(s1.pages_in - s0.pages_in, NB * NP);
	CHECK_EQ(s1.pages_used, NB * NP);
	for (int i = 0; i < NB; i++)
		CHECK_EQ(sb_buf_placed(b[i], 0, NP * PAGE), NP);
	VERIFY(p);

	/* Two threads touching the same evicted page at the same moment. */
	pthread_barrier_init(&go, NULL, 3);
	for (int t = 0; t < 2; t++) {
		c[t] = (struct conc){.id = t, .go = &go};
		c[t].x[0] = sb_buf_addr(b[0]);
		pthread_create(&th[t], NULL, same_page_reader, &c[t]);
	}
	s0 = stats(p);
	for (int r = 0; r < ROUNDS; r++) {
		CHECK_EQ(sb_buf_evict(b[0], (size_t)(r % NP) * PAGE, PAGE), 1);
		pthread_barrier_wait(&go);
		pthread_barrier_wait(&go);
	}
	for (int t = 0; t < 2; t++)
		pthread_join(th[t], NULL);
	pthread_barrier_destroy(&go);
	CHECK_EQ(c[0].bad + c[1].bad, 0);
	s1 = stats(p);
	CHECK_EQ(s1.pages_in - s0.pages_in, ROUNDS);	/* one read each */
	CHECK_EQ(sb_buf_placed(b[0], 0, NP * PAGE), NP);
	VERIFY(p);
	for (int i = 0; i < NB; i++)
		sb_buf_destroy(b[i]);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(stats(p).spill_bytes, 0);
	sb_pool_destroy(p);
	printf("threads: %d threads x %d evicted pages, %d same-page rounds\n",
	       NT, NB * NP, ROUNDS);
}

/* ---- more waiters than the buffer notes --------------------------------------------- */

/* A thread faulting on a page whose read is in flight sleeps until the
 * read's completion wakes it; only pages a thread faulted on are woken, and
 * a buffer notes 16 (pagein.c). WT threads, each on its own page, all at
 * once: first on evicted pages (the fault starts the read), then on pages
 * a prefetch has just queued (the fault finds the read in flight). A
 * missed wake-up hangs a thread: the run is killed as hung. */
enum { WT = 40, WROUNDS = 20 };

struct waiter {
	char *x;
	int id;
	pthread_barrier_t *go;
	long bad;
};

static void *waiter_touch(void *arg)
{
	struct waiter *w = arg;

	for (int r = 0; r < 2 * WROUNDS; r++) {
		pthread_barrier_wait(w->go);	/* pages evicted (queued) */
		w->bad += disk_check(w->x + (size_t)w->id * PAGE, PAGE,
				     seed_of(60, (size_t)w->id)) >= 0;
		pthread_barrier_wait(w->go);	/* all read */
	}
	return NULL;
}

static void many_waiters(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, WT * PAGE, 0);
	struct sb_range all = {0, WT * PAGE};
	struct waiter w[WT];
	pthread_t th[WT];
	pthread_barrier_t go;
	long bad = 0;

	CHECK_EQ(sb_buf_map(b, 0, WT * PAGE), WT);
	fill_pages(sb_buf_addr(b), 0, WT, 60);
	pthread_barrier_init(&go, NULL, WT + 1);
	for (int t = 0; t < WT; t++) {
		w[t] = (struct waiter){.x = sb_buf_addr(b), .id = t, .go = &go};
		pthread_create(&th[t], NULL, waiter_touch, &w[t]);
	}
	for (int r = 0; r < 2 * WROUNDS; r++) {
		CHECK_EQ(sb_buf_evict(b, 0, WT * PAGE), WT);
		if (r & 1)	/* reads in flight before the touches */
			CHECK(sb_buf_prefetch(b, &all, 1, 0) >= 0);
		pthread_barrier_wait(&go);
		pthread_barrier_wait(&go);
		CHECK_EQ(sb_buf_placed(b, 0, WT * PAGE), WT);
	}
	for (int t = 0; t < WT; t++) {
		pthread_join(th[t], NULL);
		bad += w[t].bad;
	}
	pthread_barrier_destroy(&go);
	CHECK_EQ(bad, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	printf("many waiters: %d threads on their own pages, %d rounds\n", WT,
	       2 * WROUNDS);
}

/* ---- unmap and evict racing page-ins -------------------------------------------- */

struct racer {
	struct sb_buf *b;
	atomic_int *stop;
	long ops;
};

static void *race_touch(void *arg)
{
	struct racer *r = arg;
	volatile char *x = sb_buf_addr(r->b);

	while (!atomic_load(r->stop)) {
		for (size_t i = 0; i < 16; i++) {
			size_t o = i * PAGE + (size_t)(r->ops * 4096 % PAGE);

			if (r->ops % 2)
				__atomic_store_n(&x[o], 1, __ATOMIC_RELAXED);
			else
				(void)__atomic_load_n(&x[o], __ATOMIC_RELAXED);
		}
		r->ops++;
	}
	return NULL;
}

static void *race_evict(void *arg)
{
	struct racer *r = arg;

	while (!atomic_load(r->stop)) {
		CHECK(sb_buf_map(r->b, (size_t)(r->ops % 8) * PAGE, 8 * PAGE) >=
		      0);
		CHECK(sb_buf_evict(r->b, 0, 16 * PAGE) >= 0);
		r->ops++;
	}
	return NULL;
}

static void *race_unmap(void *arg)
{
	struct racer *r = arg;

	while (!atomic_load(r->stop)) {
		CHECK(sb_buf_unmap(r->b, (size_t)(r->ops % 4) * 4 * PAGE,
				   4 * PAGE) >= 0);
		r->ops++;
	}
	return NULL;
}

static void races(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 16 * MiB, 0);
	atomic_int stop = 0;
	struct racer r[4] = {{b, &stop, 0}, {b, &stop, 0}, {b, &stop, 0},
			     {b, &stop, 0}};
	void *(*fn[4])(void *) = {race_touch, race_touch, race_evict,
				  race_unmap};
	pthread_t th[4];
	double t0 = now_s();

	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, fn[i], &r[i]);
	while (now_s() - t0 < 1.5)
		usleep(10000);
	atomic_store(&stop, 1);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	printf("races: %ld touch rounds, %ld evicts, %ld unmaps, %llu pages "
	       "in\n",
	       r[0].ops + r[1].ops, r[2].ops, r[3].ops,
	       (unsigned long long)stats(p).pages_in);
	CHECK(r[0].ops > 0 && r[2].ops > 0 && r[3].ops > 0);
	/* Reads still in flight hold pages not placed yet: settle. They are
	 * read-ahead of the last faults, and reads a late fault message
	 * starts: userfaultfd may report a fault twice, and the second
	 * message can reach the handler after its thread has moved on (even
	 * exited), for a page evicted since. So settle until the counts
	 * agree and no page was read in for 20 ms. */
	t0 = now_s();
	for (uint64_t in = ~0ull; now_s() - t0 < 5;) {
		uint64_t now_in = stats(p).pages_in;
		long placed = sb_buf_placed(b, 0, 16 * MiB);

		if (now_in == in && stats(p).pages_used == (size_t)placed)
			break;
		in = now_in;
		usleep(20000);
	}
	if (now_s() - t0 > 0.03)
		printf("(pages_used settled after %.0f ms)\n",
		       (now_s() - t0) * 1e3);
	CHECK_EQ(stats(p).pages_used, sb_buf_placed(b, 0, 16 * MiB));
	CHECK_EQ(stats(p).io_errors, 0);
	VERIFY(p);
	CHECK(sb_buf_unmap(b, 0, 16 * MiB) >= 0);
	CHECK_EQ(sb_buf_placed(b, 0, 16 * MiB), 0);
	/* A read started by such a message just before the unmap gives its
	 * page and slot back when it completes. */
	WAIT_FOR(stats(p).pages_used == 0 && stats(p).spill_bytes == 0, 5);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(stats(p).spill_bytes, 0);
	VERIFY(p);
	/* Still usable. */
	CHECK_EQ(disk_check_zero((char *)sb_buf_addr(b) + 3 * PAGE, PAGE), -1);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* ---- writers interrupted by signals while pages are evicted ------------ */

/*
 * A signal (or io_uring task work) ends a thread's wait on a fault, and the
 * thread retries its access at once, while the handler may be halfway
 * through changing the page's mapping. Each writer keeps a count in its
 * pages and checks, before each write, that the last one is still there:
 * a write that seemed to succeed but was dropped shows as an old count.
 */
struct sig_writer {
	struct sb_buf *b;
	atomic_int *stop;
	size_t first, n;
	long rounds, lost;
};

static void *sig_write(void *arg)
{
	struct sig_writer *w = arg;
	char *x = sb_buf_addr(w->b);

	for (uint64_t v = 1; !atomic_load(w->stop); v++) {
		for (size_t i = w->first; i < w->first + w->n; i++) {
			volatile uint64_t *c =
				(volatile uint64_t *)(x + i * PAGE +
						      (v % 16) * 64);
			volatile uint64_t *last =
				(volatile uint64_t *)(x + i * PAGE +
						      ((v - 1) % 16) * 64);

			if (*last != v - 1)
				w->lost++;
			*c = v;
		}
		w->rounds++;
	}
	return NULL;
}

static void signalled_writers(void)
{
	enum { NW = 2, NPW = 8 };
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 16 * MiB, 0);
	struct sigaction su = {.sa_handler = st_on_usr1};
	struct sig_writer w[NW];
	pthread_t th[NW];
	atomic_int stop = 0;
	long evicts = 0, rounds = 0, lost = 0;
	double t0 = now_s();

	sigaction(SIGUSR1, &su, NULL);
	CHECK_EQ(sb_buf_map(b, 0, NW * NPW * PAGE), NW * NPW);
	for (int i = 0; i < NW; i++) {
		w[i] = (struct sig_writer){b, &stop, (size_t)i * NPW, NPW, 0,
					   0};
		pthread_create(&th[i], NULL, sig_write, &w[i]);
	}
	while (now_s() - t0 < 1.0) {
		CHECK(sb_buf_evict(b, 0, NW * NPW * PAGE) >= 0);
		evicts++;
		for (int k = 0; k < 20; k++) {
			for (int i = 0; i < NW; i++)
				pthread_kill(th[i], SIGUSR1);
			usleep(20);
		}
	}
	atomic_store(&stop, 1);
	for (int i = 0; i < NW; i++) {
		pthread_join(th[i], NULL);
		rounds += w[i].rounds;
		lost += w[i].lost;
	}
	printf("signalled writers: %ld rounds, %ld evictions, %ld lost "
	       "writes\n",
	       rounds, evicts, lost);
	CHECK(rounds > 0 && evicts > 0);
	CHECK_EQ(lost, 0);
	CHECK_EQ(stats(p).io_errors, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* Eviction, and the page-ins it is waited for, from a thread with the
 * smallest stack POSIX allows (16 KiB here): the write-out's checksum
 * once took 16 KiB of stack of its own, and such a thread's sb_buf_evict
 * died of SIGSEGV. Sanitizers' frames are larger: four times that. */
static struct sb_buf *ss_buf;

static void *small_stack_evict(void *arg)
{
	struct sb_range r = {0, 8 * PAGE};

	(void)arg;
	CHECK_EQ(sb_buf_evict(ss_buf, 0, 8 * PAGE), 8);
	CHECK(sb_buf_prefetch(ss_buf, &r, 1, SB_PREFETCH_WAIT) >= 0);
	return NULL;
}

static void small_stack(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	size_t stack = PTHREAD_STACK_MIN;
	pthread_attr_t at;
	pthread_t th;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	stack *= 4;
#endif
	ss_buf = make_buf(p, 64 * PAGE, SB_BUF_EVICTABLE);
	fill_pages(sb_buf_addr(ss_buf), 0, 8, 21);
	CHECK(pthread_attr_init(&at) == 0);
	CHECK(pthread_attr_setstacksize(&at, stack) == 0);
	CHECK(pthread_create(&th, &at, small_stack_evict, NULL) == 0);
	pthread_join(th, NULL);
	pthread_attr_destroy(&at);
	check_pages(sb_buf_addr(ss_buf), 0, 8, 21);
	printf("eviction and its page-ins from a thread with a %zu KiB stack\n",
	       stack >> 10);
	sb_buf_destroy(ss_buf);
	sb_pool_destroy(p);
}

static int child(const char *name)
{
	if (!strcmp(name, "body")) {
		small_stack();
		basic();
		strict();
		shared();
		advice();
		threads();
		many_waiters();
		races();
		signalled_writers();
		printf("evict: ok\n");
		return 0;
	}
	if (!strcmp(name, "strict-discard")) {
		struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
		struct sb_buf *b = make_buf(p, 16 * MiB, SB_BUF_STRICT);
		char *x = sb_buf_addr(b);

		if (sb_buf_map(b, 0, 2 * PAGE) != 2)
			return 3;
		fill_pages(x, 0, 2, 12);
		if (sb_buf_evict(b, 0, 2 * PAGE) != 2)
			return 4;
		if (sb_buf_unmap(b, 0, PAGE) < 0)
			return 5;
		if (disk_check(x + PAGE, PAGE, seed_of(12, 1)) >= 0)
			return 6;	/* page 1 still evicted: its data */
		expect_signal_at(x, PAGE);
		return ((volatile char *)x)[100] + 7;	/* no SIGBUS */
	}
	return 2;
}

static int main_test(void)
{
	return run_disk_body(120);
}
