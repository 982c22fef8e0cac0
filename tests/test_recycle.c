/* The disk tier, recycling: where the kernel has minor faults on shmem,
 * an evicted or dropped page's memory goes straight back to the pool (no
 * hole punch, no page kept reserved) and the next page-in reuses it without
 * zeroing. Checked here: no page is held in state EVICTED after evictions
 * (with SPARSEBUF_RECYCLE=0, the other run, every evicted page is); every
 * byte comes back, through reads and writes of evicted pages, under a
 * budget a quarter of the working set; bytes_resident stays within the
 * budget (sampled all along); a write to a recycled page lands (its write-protect marker gives
 * way to the page-in); a page whose memory was reused elsewhere and then
 * touched reads its own data, not the other page's. */
#include "harness.h"

#include <linux/userfaultfd.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)
#define BUDGET (1 * MiB)		/* 16 pages */
#define NPAGES (4 * BUDGET / PAGE)	/* 64 pages */

size_t sbi_test_evicted_pages(struct sb_pool *pool);
bool sbi_test_recycles(struct sb_pool *pool);

static uint64_t seed_of(unsigned tag, size_t page)
{
	return ((uint64_t)tag << 32) | page;
}

static void check_page(const char *x, size_t i, unsigned tag)
{
	long bad = disk_check(x + i * PAGE, PAGE, seed_of(tag, i));

	if (bad >= 0)
		FAIL("page %zu (tag %u) differs at byte %ld", i, tag, bad);
}

/* Whether pool p recycles, checked against what it should do: recycle
 * where the kernel has minor faults on shmem, unless SPARSEBUF_RECYCLE=0
 * says not to. */
static bool recycling(struct sb_pool *p)
{
	struct sb_features f;
	const char *env = getenv("SPARSEBUF_RECYCLE");
	bool want = !(env && !strcmp(env, "0")) &&
		    sb_features_get(&f) == 0 &&
		    (f.uffd_features & UFFD_FEATURE_MINOR_SHMEM);

	CHECK_EQ(sbi_test_recycles(p), want);
	return want;
}

static int body(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, BUDGET);
	struct sb_buf *b = make_buf(p, NPAGES * PAGE, SB_BUF_EVICTABLE);
	char *x = sb_buf_addr(b);
	bool rec = recycling(p);
	struct budget_watch w;
	struct sb_stats s;
	unsigned tag[NPAGES];

	printf("recycling: %s\n", rec ? "on" : "off");
	budget_watch_start(&w, p);
	/* Four budgets' worth of writes: the clock evicts as it goes. */
	for (size_t i = 0; i < NPAGES; i++) {
		tag[i] = 1;
		disk_fill(x + i * PAGE, PAGE, seed_of(tag[i], i));
	}
	s = stats(p);
	CHECK(s.pages_out >= NPAGES - BUDGET / PAGE);
	CHECK(s.bytes_resident <= BUDGET);
	if (rec)
		CHECK_EQ(sbi_test_evicted_pages(p), 0);
	else
		CHECK(sbi_test_evicted_pages(p) > 0);
	VERIFY(p);

	/* Every page back, in an order that makes each page-in reuse the
	 * memory of a page evicted just before. */
	for (size_t i = 0; i < NPAGES; i++)
		check_page(x, (i * 37) % NPAGES, tag[(i * 37) % NPAGES]);
	CHECK(stats(p).pages_in >= NPAGES - BUDGET / PAGE);
	CHECK(stats(p).bytes_resident <= BUDGET);

	/* Writes to evicted pages (a write-protect marker is left where a
	 * writable page was evicted in place): each lands, and stays. */
	CHECK(sb_buf_evict(b, 0, NPAGES * PAGE) > 0);
	CHECK_EQ(sb_buf_placed(b, 0, NPAGES * PAGE), 0);
	for (size_t i = 0; i < NPAGES; i += 3) {
		tag[i] = 2;
		disk_fill(x + i * PAGE, PAGE, seed_of(tag[i], i));
	}
	for (size_t i = 0; i < NPAGES; i++)
		check_page(x, i, tag[i]);

	/* Evict one page, reuse its memory for others, touch it: its own
	 * bytes, never those of the page now in its old memory. */
	for (int round = 0; round < 8; round++) {
		size_t v = (size_t)round * 5 % NPAGES;

		check_page(x, v, tag[v]);
		CHECK_EQ(sb_buf_evict(b, v * PAGE, PAGE), 1);
		for (size_t k = 1; k <= BUDGET / PAGE; k++)
			check_page(x, (v + k) % NPAGES, tag[(v + k) % NPAGES]);
		check_page(x, v, tag[v]);
	}
	if (rec)
		CHECK_EQ(sbi_test_evicted_pages(p), 0);
	budget_watch_stop(&w, BUDGET);
	CHECK(stats(p).bytes_resident <= BUDGET);
	CHECK_EQ(stats(p).io_errors, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(sbi_test_evicted_pages(p), 0);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("recycle: every byte back, within the budget\n");
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "body"))
		return body();
	return 2;
}

static int main_test(void)
{
	return run_disk_body(120);
}
