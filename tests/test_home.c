/* SPDX-License-Identifier: MIT */
/*
 * Home mappings (lib/home.c): a file buffer's pages read in, released,
 * dropped by the budget and read again never change its mappings (one per
 * home heap), and always read as the file's bytes, also while another
 * thread touches them as they come and go. A page whose mapping had to be
 * replaced (shared into another buffer, then released) goes the common way
 * from then on, with the same guarantees; so does a page whose read
 * failed, once unmapped (SIGBUS until then, never zeros). A placed page
 * whose page-table entries the kernel dropped from a part only reads
 * whole again (sbi_vma_continue goes past the parts still mapped). The
 * pool's accounting holds at every step. Without descriptors to spare for
 * the home heaps, a buffer is mapped the common way. No page of a home
 * heap is ever free while its buffer lives (not the last heap's tail, not
 * a lost page's home page), where a write could make a large folio over
 * the home's evicted pages.
 */
#include "harness.h"
#include "harness_internal.h"

#include <fcntl.h>
#include <setjmp.h>
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define PAGE (16 * KiB)
#define HEAP (1 * MiB)			/* 64 pages a heap */
#define NPAGES 323			/* 6 heaps, the last one part used */
#define FILE_BYTES ((size_t)NPAGES * PAGE)
#define SEED 11
#define BUDGET (128 * PAGE)

void sbi_test_io_fail(int err, unsigned count);
void sbi_test_bounce_fail(int err, unsigned count);
size_t sbi_test_evicted_pages(struct sb_pool *pool);

/* Every read buffer back (none is kept by a read that finished), and at
 * least one made: home page-ins go through them. */
static void bounces_back(struct sb_buf *b)
{
	struct sbi_disk *d = sbi_disk_peek(b->pool);
	unsigned n, free;

	CHECK(d);
	CHECK(sb_buf_prefetch(b, NULL, 0, SB_PREFETCH_WAIT) >= 0);
	sbi_io_bounce_count(d->io, &n, &free);
	CHECK(n >= 8);
	CHECK_EQ(free, n);
}

/* Whether page i's home page holds memory (data in its memfd). */
/* Whether page i's home page holds anything: memory with a byte that is
 * not zero. A released home page is punched: a hole, or, in a folio larger
 * than the page that the kernel could not split (shmem_enabled, make
 * test-folios), zeros left in place (docs/design.md, "Heap folios"). */
static bool home_holds_data(struct sb_buf *b, size_t i)
{
	struct sb_pool *p = b->pool;
	static char page[PAGE];
	sbi_pid h;
	off_t off, at;
	int fd;

	pthread_mutex_lock(&b->lock);
	h = sbi_home_pid(b, i);
	pthread_mutex_unlock(&b->lock);
	off = (off_t)((size_t)sbi_pid_index(p, h) * PAGE);
	fd = sbi_pid_heap(p, h)->fd;
	at = lseek(fd, off, SEEK_DATA);
	if (at < 0 || at >= off + (off_t)PAGE)
		return false;
	CHECK_EQ(pread(fd, page, PAGE, off), PAGE);
	for (size_t k = 0; k < PAGE; k++)
		if (page[k])
			return true;
	return false;
}

/* Whether the 4 KiB at addr has a page-table entry (pagemap's present
 * bit). */
static bool pte_present(const void *addr)
{
	uint64_t e = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY);

	CHECK(fd >= 0);
	CHECK_EQ(pread(fd, &e, sizeof(e), (off_t)((uintptr_t)addr / 4096 *
						  sizeof(e))),
		 (ssize_t)sizeof(e));
	close(fd);
	return e >> 63;
}

static const char *make_file(void)
{
	return disk_make_file("weights.bin", FILE_BYTES, SEED);
}

/* Page i of the buffer holds the file's bytes (reading it: a fault reads
 * it in). */
static bool page_ok(struct sb_buf *b, size_t i)
{
	const volatile uint64_t *a = (const volatile uint64_t *)(
		(const char *)sb_buf_addr(b) + i * PAGE);

	for (size_t w = 0; w < PAGE / 8; w += 61)
		if (a[w] != disk_word(SEED, i * PAGE / 8 + w))
			return false;
	return a[PAGE / 8 - 1] == disk_word(SEED, (i + 1) * PAGE / 8 - 1);
}

static struct sb_buf *open_weights(struct sb_pool *p, const char *path)
{
	int err = 0;
	struct sb_buf *b = sb_buf_open_file(p, path, 0, FILE_BYTES, 0, &err);

	if (!b)
		FAIL("sb_buf_open_file: %s", strerror(-err));
	return b;
}

static long prefetch_pages(struct sb_buf *b, const size_t *idx, size_t n,
			   unsigned flags)
{
	struct sb_range r[NPAGES];

	for (size_t k = 0; k < n; k++)
		r[k] = (struct sb_range){idx[k] * PAGE, PAGE};
	return sb_buf_prefetch(b, r, n, flags);
}

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Rounds of: read in a random seventh of the pages (what stays placed, check them, release a
 * stays under the budget: no drops), check them, release a random half
 * of what is placed (in runs, as sbflash's window does). */
static void cycles(struct sb_buf *b, long maps0, int rounds)
{
	struct sb_pool *p = sb_buf_pool(b);
	uint64_t s = 0x9e3779b97f4a7c15ull;
	size_t idx[NPAGES];
	struct sb_range ranges[NPAGES];

	for (int round = 0; round < rounds; round++) {
		size_t n = 0;

		for (size_t i = 0; i < NPAGES; i++)
			if (rng_next(&s) % 7 == 0)
				idx[n++] = i;
		CHECK(prefetch_pages(b, idx, n, SB_PREFETCH_WAIT) >= 0);
		for (size_t k = 0; k < n; k++) {
			CHECK_EQ(sb_buf_placed(b, idx[k] * PAGE, PAGE), 1);
			if (!page_ok(b, idx[k]))
				FAIL("round %d: page %zu is not the file's",
				     round, idx[k]);
		}
		/* Odd rounds: the runs in one sb_buf_unmap_ranges. */
		n = 0;
		for (size_t i = 0; i < NPAGES;) {
			size_t run = 1 + rng_next(&s) % 4;

			if (i + run > NPAGES)
				run = NPAGES - i;
			if (rng_next(&s) % 2 && round % 2)
				ranges[n++] = (struct sb_range){i * PAGE,
								run * PAGE};
			else if (rng_next(&s) % 2)
				CHECK(sb_buf_unmap(b, i * PAGE, run * PAGE) >=
				      0);
			i += run;
		}
		if (n)
			CHECK(sb_buf_unmap_ranges(b, ranges, n) >= 0);
		if (maps0 >= 0)
			CHECK_EQ(maps_in(sb_buf_addr(b), FILE_BYTES), maps0);
		VERIFY(p);
	}
}

/* ---- a reader racing the releases and the reads -------------------------- */

struct racer {
	struct sb_buf *b;
	atomic_bool stop;
	long reads, bad;
};

static void *race_reader(void *arg)
{
	struct racer *r = arg;
	uint64_t s = 0x2545f4914f6cdd1dull;

	while (!atomic_load(&r->stop)) {
		size_t i = rng_next(&s) % NPAGES;

		if (!page_ok(r->b, i)) {
			const volatile uint64_t *a = (const volatile uint64_t *)(
				(const char *)sb_buf_addr(r->b) + i * PAGE);

			printf("page %zu: first word %llx, the file's %llx\n",
			       i, (unsigned long long)a[0],
			       (unsigned long long)disk_word(SEED,
							     i * PAGE / 8));
			r->bad++;
		}
		r->reads++;
	}
	return NULL;
}

static void race(struct sb_buf *b, long maps0, double seconds)
{
	struct racer r = {.b = b, .reads = 0, .bad = 0};
	uint64_t s = 42;
	pthread_t th;
	double t0 = now_s();
	long unmaps = 0;

	atomic_init(&r.stop, false);
	pthread_create(&th, NULL, race_reader, &r);
	while (now_s() - t0 < seconds) {
		size_t i = rng_next(&s) % NPAGES, run = 1 + rng_next(&s) % 8;
		size_t idx[8], n = 0;

		if (i + run > NPAGES)
			run = NPAGES - i;
		for (size_t k = 0; k < run; k++)
			idx[n++] = i + k;
		/* Without waiting: the reader may touch them in flight. */
		CHECK(prefetch_pages(b, idx, n, 0) >= 0);
		i = rng_next(&s) % NPAGES;
		CHECK(sb_buf_unmap(b, i * PAGE, PAGE) >= 0);
		unmaps++;
	}
	atomic_store(&r.stop, true);
	pthread_join(th, NULL);
	printf("race: %ld reads, %ld wrong; %ld unmaps\n", r.reads, r.bad,
	       unmaps);
	CHECK_EQ(r.bad, 0);
	CHECK(r.reads > 0);
	CHECK_EQ(maps_in(sb_buf_addr(b), FILE_BYTES), maps0);
	sbi_pagein_drain(b);
	VERIFY(sb_buf_pool(b));
}

/* Page i is still home (home.c), not gone the common way. */
static bool still_home(struct sb_buf *b, size_t i)
{
	bool r;

	pthread_mutex_lock(&b->lock);
	r = sbi_home_is(b, i);
	pthread_mutex_unlock(&b->lock);
	return r;
}

/*
 * A page that lost its home (shared into another buffer, then released
 * here) is placed and released the common way. A touch racing such a
 * release read the zero page of the fresh anonymous mapping until it was
 * registered (an adversarial test: 2 runs in 6); now the new mapping is
 * filled with the page's bytes before it replaces the old one.
 */
static void *lost_reader(void *arg)
{
	struct racer *r = arg;
	size_t i = 3;

	while (!atomic_load(&r->stop)) {
		if (!page_ok(r->b, i))
			r->bad++;
		r->reads++;
	}
	return NULL;
}

static void lost_home_race(struct sb_pool *p, struct sb_buf *b)
{
	struct racer r = {.b = b, .reads = 0, .bad = 0};
	struct sb_buf *dst;
	pthread_t th;
	double t0;
	long unmaps = 0;
	int err = 0;

	dst = sb_buf_create(p, PAGE, 0, &err);
	if (!dst)
		FAIL("sb_buf_create: %s", strerror(-err));
	CHECK_EQ(sb_buf_map(b, 3 * PAGE, PAGE), 1);
	CHECK_EQ(sb_buf_share(dst, 0, b, 3 * PAGE, PAGE), 1);
	CHECK(sb_buf_unmap(b, 3 * PAGE, PAGE) >= 0);
	CHECK(!still_home(b, 3));
	atomic_init(&r.stop, false);
	pthread_create(&th, NULL, lost_reader, &r);
	t0 = now_s();
	while (now_s() - t0 < (UNDER_TSAN ? 0.5 : 0.3)) {
		CHECK(sb_buf_map(b, 3 * PAGE, PAGE) >= 0);
		CHECK(sb_buf_unmap(b, 3 * PAGE, PAGE) >= 0);
		unmaps++;
	}
	atomic_store(&r.stop, true);
	pthread_join(th, NULL);
	printf("a page without its home: %ld reads racing %ld unmaps, %ld "
	       "wrong\n", r.reads, unmaps, r.bad);
	CHECK_EQ(r.bad, 0);
	sb_buf_destroy(dst);
	sbi_pagein_drain(b);
	VERIFY(p);
}

/* ---- a failed read ---------------------------------------------------------- */

static sigjmp_buf jb;

static void on_sigbus(int sig)
{
	siglongjmp(jb, sig);
}

/* 1: the page's bytes, 0: wrong bytes, -1: SIGBUS. */
static int touch_page(struct sb_buf *b, size_t i)
{
	struct sigaction sa = {.sa_handler = on_sigbus}, old;
	int r;

	sigaction(SIGBUS, &sa, &old);
	if (sigsetjmp(jb, 1) == 0)
		r = page_ok(b, i) ? 1 : 0;
	else
		r = -1;
	sigaction(SIGBUS, &old, NULL);
	return r;
}

/* ---- home heaps kept whole -------------------------------------------------- */

/* Whether pool page pid is in one of b's home heaps. */
static bool in_home_heaps(struct sb_buf *b, sbi_pid pid)
{
	for (size_t k = 0; k < b->home_heaps; k++)
		if (pid / b->pool->pages_per_heap == b->home[k])
			return true;
	return false;
}

/* The state of pool page pid, and its references. */
static int page_state(struct sb_pool *p, sbi_pid pid, uint32_t *refs)
{
	int st;

	pthread_mutex_lock(&p->lock);
	st = sbi_pid_heap(p, pid)->state[sbi_pid_index(p, pid)];
	*refs = sbi_pid_heap(p, pid)->refs[sbi_pid_index(p, pid)];
	pthread_mutex_unlock(&p->lock);
	return st;
}

/* Free pages of the pool outside b's home heaps. */
static size_t free_elsewhere(struct sb_buf *b)
{
	struct sb_pool *p = b->pool;
	size_t n = 0;

	pthread_mutex_lock(&p->lock);
	for (uint32_t s = 0; s < p->heap_hi; s++)
		for (uint32_t i = 0; p->heaps[s] && i < p->heaps[s]->npages;
		     i++)
			n += p->heaps[s]->state[i] != SBI_PG_USED &&
			     p->heaps[s]->state[i] != SBI_PG_EVICTED &&
			     !in_home_heaps(b, s * p->pages_per_heap + i);
	pthread_mutex_unlock(&p->lock);
	return n;
}

/* The lowest descriptor free: with RLIMIT_NOFILE there, none can be
 * made. */
static rlim_t next_fd(void)
{
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	CHECK(fd >= 0);
	close(fd);
	return (rlim_t)fd;
}

/*
 * No page of a live buffer's home heaps is ever free (pool.c,
 * reserve_home). Written into through the file or the pool side, such a
 * page could get a folio spanning the holes of the home's evicted pages
 * beside it, once shmem gives large folios (shmem_enabled set to
 * within_size while the buffer is open), and a clean home maps those
 * zeros without a fault (an adversarial review read them, with a
 * huge=within_size tmpfs standing in for the setting). Neither the last
 * home heap's tail past the buffer's pages, which the allocator took when
 * it could make no heap, nor the home page of a page that lost its home,
 * let go by its last holder, which a read of that page took next (it
 * continues from the page before).
 */
static void home_heaps_whole(const char *path)
{
	const uint32_t pph = HEAP / PAGE;
	struct sb_pool *p = disk_pool(PAGE, HEAP, BUDGET);
	struct sb_buf *b = open_weights(p, path), *other, *dst;
	struct rlimit old, none;
	sbi_pid tail, hx;
	uint32_t refs;
	size_t got = 0;
	const size_t x = pph + 6;	/* in the second heap */

	CHECK(b->home != NULL);
	hold_ready(p, true);
	/* The tail: reserved, held by no page. */
	tail = b->home[b->home_heaps - 1] * pph + NPAGES % pph;
	CHECK_EQ(page_state(p, tail, &refs), SBI_PG_EVICTED);
	CHECK_EQ(refs, 0);
	VERIFY(p);
	/* No descriptor for a new heap: another buffer gets the pages
	 * free elsewhere, then an error, never a page of the tail. */
	CHECK(free_elsewhere(b) < BUDGET / PAGE);
	other = make_buf(p, BUDGET, 0);
	CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
	none = old;
	none.rlim_cur = next_fd();
	CHECK(setrlimit(RLIMIT_NOFILE, &none) == 0);
	while (got < BUDGET / PAGE && sb_buf_map(other, got * PAGE, PAGE) == 1)
		got++;
	CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
	printf("no heap to be made: %zu pages placed elsewhere, then an "
	       "error\n", got);
	CHECK(got < BUDGET / PAGE);
	pthread_mutex_lock(&other->lock);
	for (size_t i = 0; i < got; i++)
		CHECK(!in_home_heaps(b, sbi_pte_page(other->pte[i])));
	pthread_mutex_unlock(&other->lock);
	VERIFY(p);
	CHECK(sb_buf_unmap(other, 0, BUDGET) >= 0);
	hold_ready(p, false);

	/* A lost page's home page, let go by its last holder: reserved
	 * again, empty; the page read in again goes elsewhere. */
	dst = make_buf(p, PAGE, 0);
	CHECK_EQ(touch_page(b, x - 1), 1);
	CHECK_EQ(touch_page(b, x), 1);
	CHECK(sb_buf_prefetch(b, NULL, 0, SB_PREFETCH_WAIT) >= 0);
	CHECK_EQ(sb_buf_placed(b, (x - 1) * PAGE, 2 * PAGE), 2);
	CHECK_EQ(sb_buf_share(dst, 0, b, x * PAGE, PAGE), 1);
	CHECK(sb_buf_unmap(b, x * PAGE, PAGE) >= 0);
	CHECK(!still_home(b, x));
	hx = b->home[x / pph] * pph + (sbi_pid)(x % pph);
	CHECK_EQ(page_state(p, hx, &refs), SBI_PG_USED);
	sb_buf_destroy(dst);
	CHECK_EQ(page_state(p, hx, &refs), SBI_PG_EVICTED);
	CHECK_EQ(refs, 0);
	CHECK(!home_holds_data(b, x));
	VERIFY(p);
	CHECK_EQ(touch_page(b, x), 1);
	CHECK(sb_buf_prefetch(b, NULL, 0, SB_PREFETCH_WAIT) >= 0);
	pthread_mutex_lock(&b->lock);
	CHECK(sbi_pte_has_page(b->pte[x]));
	CHECK(!in_home_heaps(b, sbi_pte_page(b->pte[x])));
	pthread_mutex_unlock(&b->lock);
	CHECK_EQ(page_state(p, hx, &refs), SBI_PG_EVICTED);
	VERIFY(p);

	/* Gone with the buffer: nothing stays reserved. */
	sb_buf_destroy(b);
	VERIFY(p);
	CHECK_EQ(sbi_test_evicted_pages(p), 0);
	sb_buf_destroy(other);
	sb_pool_destroy(p);
}

static int child(const char *name)
{
	const char *path = make_file();
	/* A budget of 128 pages: about two fifths of the file. */
	struct sb_pool *p = disk_pool(PAGE, HEAP, BUDGET);
	struct sb_buf *b = open_weights(p, path), *dst;
	const long nheaps = (NPAGES + HEAP / PAGE - 1) / (HEAP / PAGE);
	struct sb_stats s0, s1;
	long maps0;
	int err = 0;

	(void)name;
	pthread_mutex_lock(&b->lock);
	if (!b->home) {
		pthread_mutex_unlock(&b->lock);
		SKIP("no home mapping (SPARSEBUF_HOME=0, or userfaultfd "
		     "minor faults on shmem, Linux 5.14, missing)");
	}
	for (size_t i = 0; i < NPAGES; i++)
		CHECK(sbi_home_empty(b, i));
	pthread_mutex_unlock(&b->lock);
	/* One mapping per home heap, nothing else. */
	maps0 = maps_in(sb_buf_addr(b), FILE_BYTES);
	CHECK_EQ(maps0, nheaps);
	/* Clean (pages mapped by the kernel's faults) wherever a punch
	 * frees what it punches. */
	CHECK_EQ(b->home_clean, !p->big_folios &&
				       sbi_shmem_folio_bytes() <= PAGE);
	printf("home mapping: %s\n",
	       b->home_clean ? "clean (kernel faults)" : "UFFDIO_CONTINUE");

	/* 0. sb_buf_unmap_ranges: a bad range releases nothing; then the
	 * pages of every range go, their entries and memory with them,
	 * and read as the file's bytes again. */
	{
		size_t idx8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
		char *x = sb_buf_addr(b);
		struct sb_range bad[2] = {{0, 2 * PAGE}, {FILE_BYTES, PAGE}};
		struct sb_range good[3] = {
			{0, PAGE}, {2 * PAGE, PAGE}, {4 * PAGE, 2 * PAGE}};

		CHECK(prefetch_pages(b, idx8, 8, SB_PREFETCH_WAIT) >= 0);
		for (size_t i = 0; i < 8; i++)
			CHECK(page_ok(b, i));
		CHECK_EQ(sb_buf_unmap_ranges(b, bad, 2), -ERANGE);
		CHECK_EQ(sb_buf_unmap_ranges(b, NULL, 1), -EINVAL);
		CHECK_EQ(sb_buf_unmap_ranges(b, NULL, 0), 0);
		CHECK_EQ(sb_buf_placed(b, 0, 8 * PAGE), 8);
		CHECK_EQ(sb_buf_unmap_ranges(b, good, 3), 4);
		CHECK_EQ(sb_buf_placed(b, 0, 8 * PAGE), 4);
		for (size_t i = 0; i < 8; i++) {
			bool gone = i == 0 || i == 2 || i == 4 || i == 5;

			/* (A punch inside a huge folio unmaps all of it:
			 * the pages kept fault back in, minor faults.) */
			if (gone || b->home_clean)
				CHECK_EQ(pte_present(x + i * PAGE), !gone);
			CHECK_EQ(home_holds_data(b, i), !gone);
		}
		for (size_t i = 0; i < 8; i++)
			CHECK(page_ok(b, i));
		/* A clean home page reads whole as soon as it is in the
		 * memfd, before its read's completion counts it placed:
		 * wait for that (and the read-ahead) before counting. */
		CHECK(sb_buf_prefetch(b, NULL, 0, SB_PREFETCH_WAIT) >= 0);
		/* Overlapping ranges: each page released once. */
		{
			struct sb_range over[3] = {{0, 2 * PAGE},
						   {PAGE, 2 * PAGE},
						   {0, PAGE}};
			uint64_t used = stats(p).pages_used;

			CHECK_EQ(sb_buf_unmap_ranges(b, over, 3), 3);
			CHECK_EQ(stats(p).pages_used, used - 3);
			VERIFY(p);
		}
		CHECK_EQ(sb_buf_unmap(b, 0, 8 * PAGE), 5);
		VERIFY(p);
	}

	/* 1. Read in, released, read in again: the mappings stay. */
	s0 = stats(p);
	cycles(b, maps0, 12);
	s1 = stats(p);
	CHECK(s1.pages_in - s0.pages_in > 12 * NPAGES / 10);
	CHECK(s1.unmaps > s0.unmaps);
	printf("12 rounds: %llu pages read in, %llu released, %ld mappings\n",
	       (unsigned long long)(s1.pages_in - s0.pages_in),
	       (unsigned long long)(s1.unmaps - s0.unmaps), maps0);

	/* 2. Every page touched in turn, three times the budget: the pool
	 * drops clean pages to make room, in place too. */
	CHECK_EQ(sb_buf_unmap(b, 0, FILE_BYTES) >= 0, 1);
	s0 = stats(p);
	for (size_t i = 0; i < NPAGES; i++) {
		if (!page_ok(b, i))
			FAIL("touched in turn: page %zu is not the file's", i);
	}
	s1 = stats(p);
	CHECK(s1.pages_dropped > s0.pages_dropped);
	CHECK(s1.bytes_resident <= BUDGET);
	CHECK_EQ(maps_in(sb_buf_addr(b), FILE_BYTES), maps0);
	VERIFY(p);

	/* 3. A reader racing reads and releases: never a wrong byte, no
	 * SIGBUS (the budget all in reads in flight: the fault waits), and
	 * the mappings stay (a page released with its read in flight is
	 * emptied when the read finishes). */
	race(b, maps0, UNDER_TSAN ? 1.0 : 1.5);
	bounces_back(b);

	/* 4. A failed read: SIGBUS until unmapped or read again by
	 * sb_buf_map or sb_buf_prefetch, then the file's bytes;
	 * the unmap empties the page in place (its poison marker dropped),
	 * so it stays home: a touch racing a later release only faults.
	 * (Before Linux 6.6, no UFFDIO_POISON: the page is handed to the
	 * SIGBUS uffd, which replaces its mapping, and it is home no more.) */
	CHECK(sb_buf_unmap(b, 0, FILE_BYTES) >= 0);
	sbi_test_io_fail(EIO, 1);
	CHECK_EQ(touch_page(b, 40), -1);
	CHECK_EQ(stats(p).io_errors >= 1, 1);
	CHECK_EQ(touch_page(b, 40), -1);
	VERIFY(p);
	/* sb_buf_map reads the file's page once more, and so does
	 * sb_buf_prefetch: the file's bytes, in place (still home). */
	if (p->can_poison) {
		CHECK(sb_buf_map(b, 40 * PAGE, PAGE) >= 0);
		CHECK_EQ(sb_buf_placed(b, 40 * PAGE, PAGE), 1);
		CHECK_EQ(touch_page(b, 40), 1);
		CHECK(still_home(b, 40));
		CHECK(sb_buf_unmap(b, 40 * PAGE, PAGE) >= 0);
		sbi_test_io_fail(EIO, 1);
		CHECK_EQ(touch_page(b, 40), -1);
		CHECK(sb_buf_prefetch(b, &(struct sb_range){40 * PAGE, PAGE},
				      1, SB_PREFETCH_WAIT) >= 0);
		CHECK_EQ(touch_page(b, 40), 1);
		CHECK(still_home(b, 40));
		CHECK(sb_buf_unmap(b, 40 * PAGE, PAGE) >= 0);
		sbi_test_io_fail(EIO, 1);
		CHECK_EQ(touch_page(b, 40), -1);
		VERIFY(p);
	}
	CHECK(sb_buf_unmap(b, 40 * PAGE, PAGE) >= 0);
	CHECK(still_home(b, 40) || !p->can_poison);
	/* No failed page left: maps look for none (a hint, counted down). */
	CHECK_EQ(atomic_load(&b->failed_reads), 0);
	CHECK_EQ(touch_page(b, 40), 1);
	CHECK(still_home(b, 40) || !p->can_poison);
	VERIFY(p);

	/* 4a. The same for a page that lost its home (shared out, then
	 * released: registered anonymous memory): its unmap drops the poison
	 * where it is, no new mapping (a fresh one reads zeros until it is
	 * registered), and the next touch reads it in. */
	{
		struct sb_buf *out = sb_buf_create(p, PAGE, 0, &err);

		if (!out)
			FAIL("sb_buf_create: %s", strerror(-err));
		CHECK_EQ(touch_page(b, 44), 1);
		CHECK_EQ(sb_buf_share(out, 0, b, 44 * PAGE, PAGE), 1);
		CHECK(sb_buf_unmap(b, 44 * PAGE, PAGE) >= 0);
		sb_buf_destroy(out);
		CHECK(!still_home(b, 44));
		sbi_test_io_fail(EIO, 1);
		CHECK_EQ(touch_page(b, 44), -1);
		CHECK_EQ(touch_page(b, 44), -1);
		CHECK_EQ(sb_buf_unmap(b, 44 * PAGE, PAGE), 0);
		CHECK_EQ(touch_page(b, 44), 1);
		CHECK_EQ(sb_buf_placed(b, 44 * PAGE, PAGE), 1);
		VERIFY(p);
	}

	/* 4b. The read is good but its write into the home page stops half
	 * way: the same, and the half written is punched again. */
	CHECK(sb_buf_unmap(b, 0, FILE_BYTES) >= 0);
	bounces_back(b);
	CHECK(!home_holds_data(b, 42));
	sbi_test_bounce_fail(ENOSPC, 1);
	CHECK_EQ(touch_page(b, 42), -1);
	CHECK(!home_holds_data(b, 42));
	CHECK_EQ(touch_page(b, 42), -1);
	VERIFY(p);
	CHECK(sb_buf_unmap(b, 42 * PAGE, PAGE) >= 0);
	CHECK_EQ(touch_page(b, 42), 1);
	bounces_back(b);
	VERIFY(p);

	/* 5. A read the budget refuses (all of it held by another buffer):
	 * SIGBUS; once room is made and the page unmapped, its bytes. */
	{
		struct sb_buf *hog = sb_buf_create(p, BUDGET, 0, &err);

		if (!hog)
			FAIL("sb_buf_create: %s", strerror(-err));
		CHECK(sb_buf_unmap(b, 0, FILE_BYTES) >= 0);
		CHECK_EQ(sb_buf_map(hog, 0, BUDGET), (long)(BUDGET / PAGE));
		CHECK_EQ(touch_page(b, 41), -1);
		sb_buf_destroy(hog);
		CHECK_EQ(touch_page(b, 41), -1);
		CHECK(sb_buf_unmap(b, 41 * PAGE, PAGE) >= 0);
		CHECK(still_home(b, 41) || !p->can_poison);
		CHECK_EQ(touch_page(b, 41), 1);
		CHECK(still_home(b, 41) || !p->can_poison);
		VERIFY(p);
	}

	/* 6. Released while its read is in flight, then asked for again:
	 * placed when sb_buf_map returns, and home still. */
	maps0 = maps_in(sb_buf_addr(b), FILE_BYTES);
	for (size_t i = 50; i < 60; i++) {
		size_t one = i;

		CHECK(sb_buf_unmap(b, i * PAGE, PAGE) >= 0);
		CHECK(prefetch_pages(b, &one, 1, 0) >= 0);
		CHECK(sb_buf_unmap(b, i * PAGE, PAGE) >= 0);
		CHECK(sb_buf_map(b, i * PAGE, PAGE) >= 0);
		CHECK_EQ(sb_buf_placed(b, i * PAGE, PAGE), 1);
		CHECK_EQ(touch_page(b, i), 1);
	}
	CHECK_EQ(maps_in(sb_buf_addr(b), FILE_BYTES), maps0);
	VERIFY(p);

	/* 6b. A placed page whose page-table entries went from a part only
	 * (an application's MADV_DONTNEED over a part; MADV_PAGEOUT and
	 * reclaim drop them one 4 KiB folio at a time): reading the rest
	 * maps it. The kernel's CONTINUE stops at the first entry present;
	 * stopping there too left the reader faulting for ever (SIGALRM,
	 * which kills the test, after 20 s). */
	{
		const size_t sub = (size_t)getpagesize(), nsub = PAGE / sub;
		char *pg = (char *)sb_buf_addr(b) + 60 * PAGE;

		CHECK_EQ(touch_page(b, 60), 1);
		alarm(20);
		for (size_t keep = 0; keep < nsub && nsub > 1; keep++) {
			/* Drop every 4 KiB part but `keep`; then every part
			 * from `keep` on (those before it stay mapped). */
			CHECK(madvise(pg, PAGE, MADV_DONTNEED) == 0);
			CHECK_EQ(touch_page(b, 60), 1);
			for (size_t k = 0; k < nsub; k++)
				if (k != keep)
					CHECK(madvise(pg + k * sub, sub,
						      MADV_DONTNEED) == 0);
			CHECK_EQ(touch_page(b, 60), 1);
			CHECK(madvise(pg + keep * sub, PAGE - keep * sub,
				      MADV_DONTNEED) == 0);
			CHECK_EQ(touch_page(b, 60), 1);
		}
		alarm(0);
		pthread_mutex_lock(&b->lock);
		CHECK(sbi_home_is(b, 60));
		pthread_mutex_unlock(&b->lock);
		VERIFY(p);
	}

	/* 7. A page shared into another buffer, then released here: its
	 * mapping is replaced (the copy in dst keeps the page), and from
	 * then on it goes the common way, still the file's bytes. */
	dst = sb_buf_create(p, 4 * PAGE, 0, &err);
	if (!dst)
		FAIL("sb_buf_create: %s", strerror(-err));
	CHECK(touch_page(b, 7) == 1 && touch_page(b, 8) == 1);
	if (sb_buf_share(dst, 0, b, 7 * PAGE, 2 * PAGE) == 2) {
		CHECK(sb_buf_unmap(b, 7 * PAGE, 2 * PAGE) >= 0);
		pthread_mutex_lock(&b->lock);
		CHECK(!sbi_home_is(b, 7) && !sbi_home_is(b, 8));
		pthread_mutex_unlock(&b->lock);
		for (size_t w = 0; w < 2 * PAGE / 8; w++)
			CHECK_EQ(((const uint64_t *)sb_buf_addr(dst))[w],
				 disk_word(SEED, 7 * PAGE / 8 + w));
		VERIFY(p);
		CHECK_EQ(touch_page(b, 7), 1);
		CHECK_EQ(touch_page(b, 8), 1);
		CHECK(sb_buf_unmap(b, 7 * PAGE, 2 * PAGE) >= 0);
		CHECK_EQ(touch_page(b, 8), 1);
		cycles(b, -1, 3);
	}
	sb_buf_destroy(dst);
	VERIFY(p);

	/* 7b. A touch racing releases of a page without its home: its bytes,
	 * never zeros. */
	lost_home_race(p, b);

	/* 7c. A clean home's page-ins copy into its heaps' copy-in windows
	 * (UFFDIO_COPY: 4 KiB folios whatever shmem_enabled says, pagein.c
	 * home_fill), registered so that nothing else fills a page there: a
	 * touch of an empty page through one is SIGBUS, and leaves the
	 * memfd's hole as it was (a zero page made there would be what a
	 * clean home maps without a fault). */
	if (b->home_clean) {
		struct sbi_heap *h;
		volatile char *w;
		size_t one = 99;
		sbi_pid hp;

		CHECK(sb_buf_unmap(b, 0, FILE_BYTES) >= 0);
		bounces_back(b);
		pthread_mutex_lock(&b->lock);
		hp = sbi_home_pid(b, 99);
		pthread_mutex_unlock(&b->lock);
		h = sbi_pid_heap(p, hp);
		CHECK(h->fill != NULL);
		w = h->fill + (size_t)sbi_pid_index(p, hp) * PAGE;
		{
			struct sigaction sa = {.sa_handler = on_sigbus}, old;

			sigaction(SIGBUS, &sa, &old);
			if (sigsetjmp(jb, 1) == 0) {
				(void)w[8];
				FAIL("a touch of an empty page in a copy-in "
				     "window did not raise SIGBUS");
			}
			sigaction(SIGBUS, &old, NULL);
		}
		CHECK(!home_holds_data(b, 99));
		CHECK(prefetch_pages(b, &one, 1, SB_PREFETCH_WAIT) >= 0);
		CHECK(home_holds_data(b, 99));
		CHECK(page_ok(b, 99));
		CHECK(w[8] ==
		      ((const volatile char *)sb_buf_addr(b))[99 * PAGE + 8]);
		CHECK(sb_buf_unmap(b, 99 * PAGE, PAGE) >= 0);
		CHECK(!home_holds_data(b, 99));
		VERIFY(p);
	}

	/* 8. Gone with the buffer: no page stays reserved. */
	sb_buf_destroy(b);
	VERIFY(p);
	CHECK_EQ(sbi_test_evicted_pages(p), 0);

	sb_pool_destroy(p);

	/* 9. Too few descriptors to spare for the home heaps (a quarter of
	 * RLIMIT_NOFILE): mapped the common way, the same bytes. Heaps of 4
	 * pages: 81 of them, more than a quarter of the open descriptors
	 * plus 64. */
	{
		struct rlimit old, low;
		long open_fds = 0;
		DIR *d = opendir("/proc/self/fd");

		CHECK(d != NULL);
		while (readdir(d))
			open_fds++;
		closedir(d);
		p = disk_pool(PAGE, 4 * PAGE, BUDGET);
		CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
		low = old;
		low.rlim_cur = (rlim_t)open_fds + 64;
		CHECK(low.rlim_cur / 4 < (NPAGES + 3) / 4);
		CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
		b = open_weights(p, path);
		CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
		CHECK(b->home == NULL);
		cycles(b, -1, 2);
		printf("without home heaps: %ld mappings after 2 rounds\n",
		       maps_in(sb_buf_addr(b), FILE_BYTES));
		sb_buf_destroy(b);
		VERIFY(p);
	}
	sb_pool_destroy(p);

	/* 10. No page of a home heap is ever free while its buffer lives:
	 * the last heap's tail and a lost page's home page stay reserved. */
	home_heaps_whole(path);
	return 0;
}

static int main_test(void)
{
	return run_disk_body(180);
}
