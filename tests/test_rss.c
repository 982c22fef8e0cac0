/* The process's RSS counts each placed page once (issue 11): what the pool
 * holds (bytes_resident) and what the kernel says this process maps of
 * shared memory (RssShmem) agree, after growth from pages the ready thread
 * prepared, after copy-on-write copies, and after pages went to disk and
 * came back. Before the fix the pool's own mapping of its heaps kept a
 * page-table entry for every page the library had zeroed, copied or read
 * in, so RSS counted those pages twice (RssShmem up to 2x the pool).
 *
 * Runs under both pagers (run_disk_body) for the page-in part. */
#include "harness.h"

#define PAGE (256 * KiB)
#define NPAGES 61

/* RssShmem of this process, in bytes. */
static size_t rss_shmem(void)
{
	char line[256];
	long kib = -1;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		FAIL("/proc/self/status: %s", strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssShmem: %ld", &kib) == 1)
			break;
	fclose(f);
	if (kib < 0)
		SKIP("no RssShmem in /proc/self/status");
	return (size_t)kib * KiB;
}

/* RSS of shared memory grown since base, against the pool's holdings:
 * equal up to a page (of the kernel's own accounting lag), never above,
 * once the ready thread has swept the pool side's page-table entries (up
 * to 2 MiB per heap may stay between its sweeps, every 100 ms: NPAGES is
 * not a multiple of the pages per sweep, so some do). */
static void agree(const char *what, struct sb_pool *p, size_t base,
		  size_t placed)
{
	struct sb_stats st = stats(p);
	size_t rss = rss_shmem() - base;

	/* Pages mapped once each: the placed ones (the pool's reserve is
	 * zeroed through the file and mapped nowhere). */
	for (int t = 0; t < 40 && rss > placed * PAGE + PAGE; t++) {
		usleep(10 * 1000);
		st = stats(p);
		rss = rss_shmem() - base;
	}
	if (rss > placed * PAGE + PAGE)
		FAIL("%s: RSS grew by %zu KiB for %zu KiB placed: pool-side "
		     "entries left after the ready thread's sweep",
		     what, rss / KiB, placed * PAGE / KiB);

	printf("%-40s RssShmem +%6zu KiB, pool holds %6zu KiB (ready %zu "
	       "KiB)\n", what, rss / KiB, st.bytes_resident / KiB,
	       st.pages_ready * PAGE / KiB);
	if (rss > st.bytes_resident + PAGE)
		FAIL("%s: RSS grew by %zu KiB for %zu KiB the pool holds: "
		     "pages counted twice", what, rss / KiB,
		     st.bytes_resident / KiB);
}

static void touch_all(char *p, size_t len, char v)
{
	for (size_t o = 0; o < len; o += 4096)
		p[o] = v;
}

static int child(const char *name)
{
	size_t base = rss_shmem();
	struct sb_pool *p;
	struct sb_buf *a, *b, *e;
	size_t ready0;

	if (strcmp(name, "body"))
		FAIL("unknown child %s", name);
	p = disk_pool(PAGE, 64 * MiB, 0);
	/* Growth from ready pages: the ready thread zeroes a reserve, the
	 * buffer takes them one page at a time. */
	sb_pool_reserve(p, 8 * (long)MiB);
	/* On a pool no buffer has used yet (a loaded CI machine: its ready
	 * thread may take long). */
	WAIT_FOR(stats(p).pages_ready >= 16, 30);
	ready0 = stats(p).pages_ready;
	CHECK(ready0 >= 16);
	a = make_buf(p, NPAGES * PAGE, 0);
	for (size_t i = 0; i < NPAGES; i++) {
		CHECK_EQ(sb_buf_map(a, i * PAGE, PAGE), 1);
		touch_all((char *)sb_buf_addr(a) + i * PAGE, PAGE, 1);
	}
	/* The first run starts on the ready pages. */
	CHECK(stats(p).sync_prepares <= NPAGES - 16);
	agree("grown by sb_buf_map from ready pages", p, base, NPAGES);

	/* Copy-on-write: every shared page written, so copied. */
	b = make_buf(p, NPAGES * PAGE, 0);
	if (sb_buf_share(b, 0, a, 0, NPAGES * PAGE) >= 0) {
		touch_all(sb_buf_addr(b), NPAGES * PAGE, 2);
		CHECK(stats(p).cow_copies >= NPAGES / 2);
		agree("after copy-on-write of every page", p, base, 2 * NPAGES);
	}
	sb_buf_destroy(b);

	/* To disk and back. */
	e = make_buf(p, NPAGES * PAGE, SB_BUF_EVICTABLE);
	disk_fill(sb_buf_addr(e), NPAGES * PAGE, 7);
	CHECK(sb_buf_evict(e, 0, NPAGES * PAGE) > 0);
	CHECK_EQ(disk_check(sb_buf_addr(e), NPAGES * PAGE, 7), -1);
	CHECK(stats(p).pages_in > 0);
	agree("after eviction and page-in", p, base, 2 * NPAGES);

	sb_buf_destroy(e);
	sb_buf_destroy(a);
	sb_pool_destroy(p);
	return 0;
}

static int main_test(void)
{
	return run_disk_body(120);
}
