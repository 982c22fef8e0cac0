/* Huge folios under a pool's pages, made by the application: MADV_COLLAPSE
 * on a buffer turns its 4 KiB heap pages into one 2 MiB folio, whatever the
 * system's shmem_enabled says (docs/design.md, "Heap folios"). Evicting a
 * page then punches part of that folio, and while a neighbour is pinned
 * (here by vmsplice; in a pool, by I/O in flight) the kernel cannot split
 * it: it zeroes the range and leaves it present, so no missing fault comes.
 * Checked, with recycling and without (SPARSEBUF_RECYCLE=0, the second
 * run): every evicted page reads back its own bytes, and without recycling
 * also at the vm.max_map_count limit, where the page read in goes into the
 * page the evicted one kept (through the file, then UFFDIO_CONTINUE). Before
 * the fix such a page read as zeros (issue found by an adversarial review:
 * 64 of 64 evicted pages). */
#include "harness.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define PAGE (4 * KiB)
#define HEAP (8 * MiB)
#define NPAGES 1024	/* 4 MiB: a whole 2 MiB-aligned folio inside */
#define ROUNDS 32	/* 16 read back at once, 16 at the mapping limit */

bool sbi_test_recycles(struct sb_pool *pool);

static char byte_of(size_t i)
{
	return (char)(i % 250 + 1);
}

static void check_page(const char *x, size_t i)
{
	for (size_t o = 0; o < PAGE; o += 512)
		if (x[i * PAGE + o] != byte_of(i))
			FAIL("page %zu reads %d at byte %zu, wrote %d", i,
			     x[i * PAGE + o], o, byte_of(i));
}

/* Evict pages [ev, ev + n) while page pinned is held by a pipe (vmsplice
 * takes a reference to it): the folio they share cannot be split
 * meanwhile. */
static void evict_pinned(struct sb_buf *b, size_t ev, size_t n,
			 size_t pinned)
{
	char *x = sb_buf_addr(b);
	struct iovec iov = {x + pinned * PAGE, PAGE};
	int pp[2];

	CHECK(pipe(pp) == 0);
	CHECK_EQ(vmsplice(pp[1], &iov, 1, 0), PAGE);
	CHECK_EQ(sb_buf_evict(b, ev * PAGE, n * PAGE), (long)n);
	close(pp[0]);
	close(pp[1]);
}

/* Use up the process's mappings: every other page of a region protected
 * apart, until the kernel refuses the next split. Returns the region. */
static char *eat_mappings(size_t *len)
{
	struct sb_features f;
	size_t eat = 0;
	char *m;

	CHECK(sb_features_get(&f) == 0);
	*len = (size_t)f.max_map_count * 2 * PAGE;
	m = mmap(NULL, *len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS |
		 MAP_NORESERVE, -1, 0);
	CHECK(m != MAP_FAILED);
	while (mprotect(m + (2 * eat + 1) * PAGE, PAGE, PROT_NONE) == 0)
		eat++;
	CHECK_EQ(errno, ENOMEM);
	return m;
}

static int body(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, NPAGES * PAGE, SB_BUF_EVICTABLE);
	char *x = sb_buf_addr(b), *a, *m;
	bool rec = sbi_test_recycles(p);
	struct sb_features f;
	size_t base, len;

	for (size_t i = 0; i < NPAGES; i++)
		memset(x + i * PAGE, byte_of(i), PAGE);
	a = (char *)(((uintptr_t)x + (2 << 20) - 1) &
		     ~(uintptr_t)((2 << 20) - 1));
	if (madvise(a, 2 << 20, MADV_COLLAPSE) != 0)
		SKIP("MADV_COLLAPSE on the buffer: %s (needs Linux 6.1 and "
		     "transparent huge pages)", strerror(errno));
	base = (size_t)(a - x) / PAGE;
	/* Half the pages evicted and read back one at a time. */
	for (size_t r = 0; r < ROUNDS / 2; r++) {
		evict_pinned(b, base + 16 * r + 5, 1, base + 16 * r + 8);
		check_page(x, base + 16 * r + 5);
	}
	printf("folios: %d pages evicted beside a pinned neighbour in a "
	       "collapsed folio read back right (recycling %s)\n",
	       ROUNDS / 2, rec ? "on" : "off");
	CHECK(sb_features_get(&f) == 0);
	if (rec || f.max_map_count <= 0 || f.max_map_count > 300000) {
		/* Recycled pages keep no page to read into at the limit
		 * (test_maxmap sets SPARSEBUF_RECYCLE=0 for that too). */
		printf("folios: at the mapping limit: not checked (%s)\n",
		       rec ? "recycling" : "vm.max_map_count too large");
	} else {
		/* The other half evicted three at a time (one mapping
		 * for the three), then read back, the middle one first,
		 * with no mapping left to spare: a mapping of its own
		 * would split theirs, so the data goes into the page it
		 * kept, where the punch left the folio. */
		for (size_t r = ROUNDS / 2; r < ROUNDS; r++)
			evict_pinned(b, base + 16 * r + 4, 3,
				     base + 16 * r + 8);
		m = eat_mappings(&len);
		for (size_t r = ROUNDS / 2; r < ROUNDS; r++)
			for (size_t k = 0; k < 3; k++)
				check_page(x, base + 16 * r + 4 + (k + 1) % 3);
		/* One mapping again before the munmap (a sanitizer's
		 * munmap of its shadow needs room for a split). */
		CHECK(mprotect(m, len, PROT_READ) == 0);
		munmap(m, len);
		printf("folios: %d more read back at the vm.max_map_count "
		       "limit\n", 3 * ROUNDS / 2);
	}
	CHECK_EQ(stats(p).sigbus, 0);
	CHECK_EQ(stats(p).io_errors, 0);
	for (size_t i = 0; i < NPAGES; i++)
		check_page(x, i);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
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
	require_uffd();
	return run_disk_body(120);
}
