/* SPDX-License-Identifier: MIT */
/*
 * An owner that outran its growth watch (sb_buf_map or a touch of the page
 * at the growing end of an SB_BUF_GROWS buffer) and whose run's next page
 * needs zeroing takes a ready page from elsewhere instead of zeroing one on
 * its own thread or the fault handler's (pool.c, steal_ready): preferably
 * one no run continues into, never one of its own run, and at most one,
 * plus one per four runs' worth (16 MiB) placed, since each costs
 * mappings. The next page continues the run it left. Nothing else
 * steals: a buffer without SB_BUF_GROWS, several pages at once, a first
 * page, a hole refilled (of one page or several), pages under 64 KiB. The ready thread is held still (as sb_pool_trim does) so that
 * the run's next page stays unprepared.
 */
#include "harness.h"
#include "harness_internal.h"

#define PAGE (256 * KiB)	/* a run is 16 pages */
#define FLOOR 16	/* ready pages before the ready thread is held */

static int child(const char *name)
{
	(void)name;
	return 2;
}

static uint64_t steals(struct sb_pool *p)
{
	uint64_t n;

	pthread_mutex_lock(&p->lock);
	n = p->steals;
	pthread_mutex_unlock(&p->lock);
	return n;
}

/* Ready pages whose earmark is buf's (own) and others'. */
static void ready_pages(struct sb_pool *p, const struct sb_buf *buf,
			size_t *own, size_t *others)
{
	*own = *others = 0;
	pthread_mutex_lock(&p->lock);
	for (uint32_t s = 0; s < p->heap_hi; s++) {
		struct sbi_heap *h = p->heaps[s];

		for (uint32_t i = 0; h && i < h->npages; i++)
			if (h->state[i] == SBI_PG_READY)
				++*(h->owner[i] == buf->id ? own : others);
	}
	pthread_mutex_unlock(&p->lock);
}

static bool all_zero(const volatile char *a, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i])
			return false;
	return true;
}

static char *at(struct sb_buf *b, size_t page)
{
	return (char *)sb_buf_addr(b) + page * PAGE;
}

/* Make g's next page (after page 0) dirty: a freed page that needs zeroing
 * while the run's pages after it stay ready. */
static void dirty_next(struct sb_pool *p, struct sb_buf *g)
{
	sbi_pid pid;
	struct sbi_heap *h;
	uint32_t i;

	pthread_mutex_lock(&g->lock);
	pid = sbi_pte_page(g->pte[0]) + 1;
	pthread_mutex_unlock(&g->lock);
	pthread_mutex_lock(&p->lock);
	h = sbi_pid_heap(p, pid);
	i = sbi_pid_index(p, pid);
	CHECK_EQ(h->state[i], SBI_PG_READY);
	h->state[i] = SBI_PG_DIRTY;
	h->nready--;
	p->ready--;
	h->ndirty++;
	p->dirty++;
	pthread_mutex_unlock(&p->lock);
}

/* Only the buffer's own run has ready pages: they come in turn, so the
 * page is prepared on the caller's thread rather than taken out of turn. */
static void own_run_only(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *g = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	struct sb_stats st;
	size_t own, others;

	CHECK_EQ(sb_buf_map(g, 0, PAGE), 1);
	WAIT_FOR(stats(p).pages_ready >= 3, 10.0);
	usleep(100000);
	hold_ready(p, true);
	dirty_next(p, g);
	ready_pages(p, g, &own, &others);
	if (others) {
		printf("own run only: %zu ready pages not the run's, not "
		       "checked\n", others);
	} else {
		CHECK(own >= 1);
		st = stats(p);
		CHECK_EQ(sb_buf_map(g, PAGE, PAGE), 1);
		CHECK_EQ(steals(p), 0);
		CHECK_EQ(stats(p).sync_prepares, st.sync_prepares + 1);
	}
	hold_ready(p, false);
	VERIFY(p);
	sb_buf_destroy(g);
	sb_pool_destroy(p);
}

/* Pages under 64 KiB: zeroing one costs less than the mappings. */
static void small_pages(void)
{
	struct sb_pool *p = make_pool(16 * KiB, 64 * MiB, 0);
	struct sb_buf *g = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	struct sb_pool *q = make_pool(64 * KiB, 64 * MiB, 0);
	struct sb_buf *h = make_buf(q, 64 * MiB, SB_BUF_GROWS);

	CHECK_EQ(sb_buf_map(g, 0, 16 * KiB), 1);
	CHECK_EQ(sb_buf_map(h, 0, 64 * KiB), 1);
	pthread_mutex_lock(&g->lock);
	CHECK(!sbi_grow_urgent(g, 1));
	pthread_mutex_unlock(&g->lock);
	pthread_mutex_lock(&h->lock);
	CHECK(sbi_grow_urgent(h, 1));	/* the control */
	CHECK(!sbi_grow_urgent(h, 2));	/* not after a placed page */
	pthread_mutex_unlock(&h->lock);
	sb_buf_destroy(h);
	sb_buf_destroy(g);
	sb_pool_destroy(q);
	sb_pool_destroy(p);
}

/* Every region of a KV cache on 2 MiB pages enters its page at once: the
 * watches' backlog keeps the ready thread for tens of milliseconds (each
 * next page zeroed), and an owner that maps its next page meanwhile takes
 * a ready page out of turn. Between bursts the reserve gets a page the
 * watches do not place next (ready.c, pick_work). Before, the bursts ran
 * back to back on a reserve they had emptied, and such an owner zeroed
 * 2 MiB on its own thread (0.29 ms a page in bench/kv on huge pages). */
#define BIG (2 * MiB)
#define NBIG 48

enum backlog_res { BL_STOLEN, BL_PREPARED, BL_UNCHECKED };

static enum backlog_res backlog_once(void)
{
	struct sb_pool *p = make_pool(BIG, 64 * MiB, 0);
	struct sb_buf *b[NBIG];
	enum backlog_res res = BL_UNCHECKED;
	double t0;

	for (int k = 0; k < NBIG; k++) {
		b[k] = make_buf(p, 8 * BIG, SB_BUF_GROWS);
		CHECK_EQ(sb_buf_map(b[k], 0, 2 * BIG), 2);
	}
	WAIT_FOR(stats(p).pages_ready >= 1, 10.0);
	usleep(200000);	/* the reserve made up */
	for (int k = 0; k < NBIG; k++)	/* each enters its page 1 */
		((volatile char *)sb_buf_addr(b[k]))[BIG] = 1;
	t0 = now_s();
	while (res == BL_UNCHECKED) {
		int placed = 0, last = -1;
		struct sb_stats st;
		size_t ready;
		uint64_t s0;
		long n;

		for (int k = 0; k < NBIG; k++) {
			pthread_mutex_lock(&b[k]->lock);
			if (sbi_pte_has_page(b[k]->pte[2]))
				placed++;
			else
				last = k;
			pthread_mutex_unlock(&b[k]->lock);
		}
		if (last < 0)
			break;	/* the watches were first */
		if (placed < 16) {	/* two bursts */
			/* The watches place a burst a millisecond: 16
			 * pages take seconds only if they stopped. */
			if (now_s() - t0 > 30)
				FAIL("backlog: the watches placed %d next pages "
				     "of %d in 30 s", placed, NBIG);
			usleep(50);
			continue;
		}
		st = stats(p);
		s0 = steals(p);
		ready = st.pages_ready;
		n = sb_buf_map(b[last], 2 * BIG, BIG);
		CHECK(n == 0 || n == 1);
		if (n == 1) {
			CHECK(all_zero((char *)sb_buf_addr(b[last]) + 2 * BIG,
				       BIG));
			if (stats(p).sync_prepares == st.sync_prepares) {
				CHECK_EQ(steals(p), s0 + 1);
				res = BL_STOLEN;
			} else {
				printf("backlog: buffer %d of %d prepared its "
				       "page (%d placed by the watches, %zu "
				       "ready just before)\n",
				       last, NBIG, placed, ready);
				res = BL_PREPARED;
			}
		}
	}
	VERIFY(p);
	for (int k = 0; k < NBIG; k++)
		sb_buf_destroy(b[k]);
	sb_pool_destroy(p);
	return res;
}

/* The owner's map can race with its own watch, which the watches reach
 * sooner on a slow machine (TSan on a loaded host: once in a CI run).
 * Before the change every try prepared: it fails at the third try that
 * prepared, passes at the first that stole, and says so if neither came
 * in 5 (the watches placed every page before the owner could map). */
static void backlog(void)
{
	int prepared = 0;

	for (int t = 0; t < 5; t++) {
		enum backlog_res r = backlog_once();

		if (r == BL_STOLEN)
			return;
		if (r == BL_PREPARED && ++prepared == 3)
			FAIL("backlog: an owner past its watch prepared its "
			     "own page in 3 tries of %d", t + 1);
	}
	printf("backlog: not checked (%d of 5 tries prepared, the others "
	       "found the watches done first)\n", prepared);
}

static int main_test(void)
{
	struct sb_pool *p;
	struct sb_buf *warm, *g, *touch, *plain, *multi, *hole, *many;
	struct sb_stats st, w;
	uint64_t s0;

	require_uffd();
	own_run_only();
	backlog();

	p = make_pool(PAGE, 64 * MiB, 0);
	warm = make_buf(p, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(warm, 0, PAGE), 1);	/* the pool is active */
	CHECK_EQ(sb_pool_reserve(p, FLOOR * PAGE), FLOOR * PAGE);
	WAIT_FOR(stats(p).pages_ready >= FLOOR, 10.0);
	CHECK(stats(p).pages_ready >= FLOOR);
	hold_ready(p, true);

	/* The owner's own page after its last: one ready page out of turn,
	 * nothing prepared on this thread, and not warm's next page (a page
	 * some run continues into goes last). */
	g = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	CHECK_EQ(sb_buf_map(g, 0, PAGE), 1);
	st = stats(p);
	s0 = steals(p);
	CHECK_EQ(sb_buf_map(g, PAGE, PAGE), 1);
	CHECK_EQ(steals(p), s0 + 1);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares);
	CHECK_EQ(stats(p).pages_ready, st.pages_ready - 1);
	CHECK(all_zero(at(g, 1), PAGE));
	w = stats(p);
	CHECK_EQ(sb_buf_map(warm, PAGE, PAGE), 1);
	CHECK_EQ(stats(p).sync_prepares, w.sync_prepares);
	CHECK_EQ(maps_in(sb_buf_addr(warm), 2 * PAGE), 1);
	/* One until a run's worth is placed: the next is prepared here, and
	 * continues g's run where the stolen page left it (page 0's heap
	 * page and page 2's are consecutive). */
	st = stats(p);
	CHECK_EQ(sb_buf_map(g, 2 * PAGE, PAGE), 1);
	CHECK_EQ(steals(p), s0 + 1);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares + 1);
	pthread_mutex_lock(&g->lock);
	CHECK_EQ(sbi_pte_page(g->pte[2]), sbi_pte_page(g->pte[0]) + 1);
	pthread_mutex_unlock(&g->lock);
	for (int i = 0; i < 3; i++)
		memset(at(g, (size_t)i), 'a' + i, PAGE);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(at(g, (size_t)i)[PAGE - 1], 'a' + i);

	/* The same for a touch: the fault handler places a ready page. */
	touch = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	CHECK_EQ(sb_buf_map(touch, 0, PAGE), 1);
	st = stats(p);
	s0 = steals(p);
	((volatile char *)at(touch, 1))[0] = 1;
	CHECK_EQ(stats(p).faults, st.faults + 1);
	CHECK_EQ(steals(p), s0 + 1);
	CHECK_EQ(stats(p).sync_prepares, st.sync_prepares);
	CHECK_EQ(at(touch, 1)[0], 1);
	CHECK(all_zero(at(touch, 1) + 1, PAGE - 1));

	/* No steal without SB_BUF_GROWS, for several pages at once, for a
	 * hole refilled (not the growing end). */
	s0 = steals(p);
	plain = make_buf(p, 64 * MiB, 0);
	CHECK_EQ(sb_buf_map(plain, 0, PAGE), 1);
	CHECK_EQ(sb_buf_map(plain, PAGE, PAGE), 1);
	multi = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	CHECK_EQ(sb_buf_map(multi, 0, PAGE), 1);
	CHECK_EQ(sb_buf_map(multi, PAGE, 2 * PAGE), 2);
	hole = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	CHECK_EQ(sb_buf_map(hole, 0, 8 * PAGE), 8);
	CHECK_EQ(sb_buf_unmap(hole, PAGE, PAGE), 1);
	CHECK_EQ(sb_buf_map(hole, PAGE, PAGE), 1);
	CHECK_EQ(sb_buf_unmap(hole, 2 * PAGE, 4 * PAGE), 4);
	for (size_t i = 2; i < 6; i++)	/* from the front: each looks like */
		CHECK_EQ(sb_buf_map(hole, i * PAGE, PAGE), 1);	/* an end */
	CHECK_EQ(maps_in(sb_buf_addr(hole), 8 * PAGE), 1);
	CHECK_EQ(steals(p), s0);

	/* Grown page by page past the reserve: one out of turn, and one
	 * more per 64 pages placed: 1 for 48. */
	many = make_buf(p, 64 * MiB, SB_BUF_GROWS);
	s0 = steals(p);
	for (size_t i = 0; i < 48; i++)
		CHECK_EQ(sb_buf_map(many, i * PAGE, PAGE), 1);
	CHECK_EQ(steals(p) - s0, 1);
	/* Its runs (16 pages, then 32) and two more mappings per page
	 * taken out of turn, the run resumed after each. */
	CHECK(maps_in(sb_buf_addr(many), 48 * PAGE) <=
	      2 + 2 * (long)(steals(p) - s0));
	hold_ready(p, false);
	small_pages();

	VERIFY(p);
	sb_buf_destroy(many);
	sb_buf_destroy(hole);
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
