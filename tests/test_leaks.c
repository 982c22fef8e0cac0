/* Nothing the library maps outlives its use (issue 10, defect 6): 1000
 * cycles of a heap added and released (a page placed, released, the pool
 * trimmed), 1000 pools created and destroyed (with a heap, a buffer, and a
 * disk tier every tenth time), and 100 spill files that could not be made
 * leave /proc/self/maps as it was: the same number of lines and the same
 * bytes mapped. Before the fix each released heap left a page of its
 * metadata mapped, and about 16k cycles exhausted vm.max_map_count. */
#include "harness.h"

/* Bytes mapped by this process (the sum over /proc/self/maps). */
static size_t maps_bytes(void)
{
	uintptr_t a, b;
	char line[512];
	size_t n = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		FAIL("/proc/self/maps: %s", strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx", &a, &b) == 2)
			n += b - a;
	fclose(f);
	return n;
}

struct mark {
	long lines;
	size_t bytes;
};

static struct mark mark(void)
{
	return (struct mark){maps_total(), maps_bytes()};
}

static void same(const char *what, struct mark before, struct mark after)
{
	printf("%s: %ld -> %ld mappings, %zu -> %zu KiB mapped\n", what,
	       before.lines, after.lines, before.bytes / KiB,
	       after.bytes / KiB);
	if (after.lines > before.lines + MAPS_SLACK)
		FAIL("%s: %ld mappings left behind", what,
		     after.lines - before.lines);
	if (after.bytes > before.bytes + MAPS_SLACK * 64 * KiB)
		FAIL("%s: %zu KiB left mapped", what,
		     (after.bytes - before.bytes) / KiB);
}

/* The defaults (256 KiB pages in 64 MiB heaps): a heap's metadata is two
 * pages there, which is what the old size mismatch leaked one of. */
static struct sb_pool *default_pool_opts(size_t max, const char *spill)
{
	struct sb_pool_opts o;
	struct sb_pool *p;
	int err = 0;

	sb_pool_opts_init(&o);
	o.page_size = 256 * KiB;
	o.heap_size = 64 * MiB;
	o.max_bytes = max;
	o.numa_node = -1;
	o.spill_dir = spill;
	p = sb_pool_create(&o, &err);
	if (!p)
		FAIL("sb_pool_create: %s", strerror(-err));
	return p;
}

/* Trim until no heap is left for 100 ms: the ready thread may add one
 * ahead of the next run (a placement asks it to) just after a trim. */
static void settle(struct sb_pool *p)
{
	int quiet = 0;

	for (int i = 0; i < 500 && quiet < 5; i++) {
		CHECK(sb_pool_trim(p) >= 0);
		quiet = stats(p).heaps == 0 ? quiet + 1 : 0;
		usleep(20000);
	}
	if (quiet < 5)
		FAIL("heaps stay after 10 s of trimming");
}

static void heap_cycles(int n)
{
	struct sb_pool *p = default_pool_opts(0, NULL);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	struct mark m0 = {0};

	for (int i = 0; i < n; i++) {
		CHECK_EQ(sb_buf_map(b, 0, 256 * KiB), 1);
		CHECK_EQ(sb_buf_unmap(b, 0, 256 * KiB), 1);
		CHECK(sb_pool_trim(p) >= 0);
		if (i == 9) {
			settle(p);
			m0 = mark();	/* after the first cycles warm up */
		}
	}
	settle(p);
	same("heap added and released x1000", m0, mark());
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static void pool_cycles(int n)
{
	struct mark m0 = {0};

	for (int i = 0; i < n; i++) {
		struct sb_pool *p = default_pool_opts(0, "/tmp");
		struct sb_buf *b;

		if (i % 10 == 0) {
			/* A disk tier too: an evictable buffer, a page out. */
			b = make_buf(p, 1 * GiB, SB_BUF_EVICTABLE);
			CHECK_EQ(sb_buf_map(b, 0, 256 * KiB), 1);
			CHECK_EQ(sb_buf_evict(b, 0, 256 * KiB), 1);
		} else {
			b = make_buf(p, 1 * GiB, 0);
			CHECK_EQ(sb_buf_map(b, 0, 256 * KiB), 1);
		}
		if (i % 2)
			sb_buf_destroy(b);	/* else the pool destroys it */
		sb_pool_destroy(p);
		if (i == 9)
			m0 = mark();
	}
	same("pool created and destroyed x1000", m0, mark());
}

/* A spill file that cannot be made, again and again. */
static void spill_failures(int n)
{
	struct sb_pool *p = default_pool_opts(0, "/nonexistent/sparsebuf");
	struct sb_buf *b = make_buf(p, 1 * GiB, SB_BUF_EVICTABLE);
	struct mark m0 = {0};

	CHECK_EQ(sb_buf_map(b, 0, 256 * KiB), 1);
	for (int i = 0; i < n; i++) {
		CHECK_EQ(sb_buf_evict(b, 0, 256 * KiB), -ENOENT);
		if (i == 9)
			m0 = mark();
	}
	same("spill file refused x100", m0, mark());
	sb_pool_destroy(p);
}

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	require_uffd();
	heap_cycles(1000);
	pool_cycles(1000);
	spill_failures(100);
	return 0;
}
