/* SPDX-License-Identifier: MIT */
/*
 * The address-space operations on a buffer's range: the one owner of every
 * change of a buffer's mappings (mmap, userfaultfd's CONTINUE, WAKE,
 * WRITEPROTECT and POISON, MADV_DONTNEED), each retried while the kernel
 * answers EAGAIN. Each replaces mappings with MAP_FIXED or changes their
 * protection; the caller holds the buffer's lock and the pool's layout
 * lock (read, asserted in make lockcheck), and has already updated
 * nothing: these only touch the kernel.
 *
 *   placed page     MAP_SHARED mapping of a heap page (merged into runs)
 *   unplaced page   private anonymous memory registered MISSING with the
 *                   pool's uffd (or its SIGBUS uffd for a strict buffer)
 *   shared page     placed, registered WP with the pool's uffd and
 *                   write-protected: the first write faults, and the
 *                   handler copies. A page shared into a buffer (the dst
 *                   of sb_buf_share) is mapped MAP_PRIVATE, see
 *                   sbi_vma_place_shared
 *   poisoned page   unplaced, and a touch raises SIGBUS (UFFDIO_POISON, or
 *                   registration with the SIGBUS uffd where POISON is
 *                   missing)
 *   copy refused    a shared page whose copy the budget refused: mapped
 *                   MAP_PRIVATE, write-protected through the SIGBUS uffd
 *
 * A thread stopped on a fault can run again at any moment (a signal or
 * task work ends its wait) and retry its access. Whatever is handed to the
 * SIGBUS uffd is therefore unreachable until registered: a fresh mapping
 * would otherwise give the thread a silent zero page or a private copy.
 */
#include "internal.h"
#include "tsan.h"
#include "uffd_compat.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static char *page_addr(const struct sb_buf *buf, size_t idx)
{
	return buf->base + (idx << buf->pool->page_shift);
}

static size_t pages_len(const struct sb_buf *buf, size_t n)
{
	return n << buf->pool->page_shift;
}

/* A heap's pages are allocated before they are mapped: a hugetlbfs
 * mapping reserves nothing more (without MAP_NORESERVE it would reserve
 * every hole of the range, and fail when they are not free). */
static int heap_flags(const struct sbi_heap *h)
{
	return MAP_SHARED | (h->hugetlb ? MAP_NORESERVE : 0);
}

/* Every mapping change of a buffer's range goes through here. */
static void *fixed_map(void *addr, size_t len, int prot, int flags, int fd,
		       off_t off)
{
	void *p;

	SBI_MAP_BEGIN();
	p = mmap(addr, len, prot, flags | MAP_FIXED, fd, off);
	SBI_MAP_END();
	return p;
}

/* Pages [idx, idx+n) get a new mapping: a home page's (home.c) is home no
 * more. Every replacement of a buffer page's mapping says so here. */
static void home_lose(struct sb_buf *buf, size_t idx, size_t n)
{
	if (!buf->home_lost)
		return;
	for (size_t i = idx; i < idx + n; i++)
		buf->home_lost[i / 64] |= 1ull << (i % 64);
}

/* An mmap failure, explained: ENOMEM mostly means vm.max_map_count. */
static int map_error(int e)
{
	static _Atomic int warned;

	if (e == ENOMEM && !atomic_exchange(&warned, 1))
		sbi_err("mmap failed with ENOMEM: this process has %ld of "
			"vm.max_map_count=%ld mappings; raise the sysctl or use "
			"a larger page size",
			sbi_map_count(), sbi_max_map_count());
	return -e;
}

/*
 * Filling page tables by fault-around. MAP_POPULATE walks a shared mapping
 * a 4 KiB page at a time (looking each up, marking it accessed: 30 us per
 * 256 KiB on an AMD EPYC VM), where one read fault has the kernel map the
 * 16 pages around it from the page cache at once (4 faults, 14 us). The
 * entries come writable (shmem keeps no dirty accounting), so the owner's
 * writes take no fault either. The mapping is new and no thread has
 * reached it yet: it is registered with no uffd, so these faults never go
 * to a handler, and holding the buffer's lock meanwhile is safe, unlike a
 * touch of registered memory (internal.h). A placed page has its memory
 * already (made ready first), so a fault allocates page tables at most:
 * where that fails the kernel's OOM handling runs, as it would for the
 * owner's first access after a MAP_POPULATE that gave up. The faults an
 * application thread takes are counted (sb_stats.map_faults), so that
 * perf and the library agree. Pools use MAP_POPULATE where the kernel
 * maps fewer than 16 pages a fault or a first access is slow
 * (pool_life.c).
 */
__attribute__((no_sanitize("address", "thread"))) static void
fill_by_faults(struct sb_pool *pool, const char *p, size_t len,
	       size_t stride)
{
	struct rusage r0, r1;
	/* An application thread's faults are counted (sb_buf_map, a
	 * prefetch it waits for, an eviction's private copy): the library's
	 * own threads' are theirs, not the application's. */
	bool counted = !sbi_internal_thread &&
		       getrusage(RUSAGE_THREAD, &r0) == 0;
	uintptr_t a = (uintptr_t)p, end = a + len;

	/* One read in each stride-aligned window the range overlaps: the
	 * kernel maps the window around a fault, not the range after it. */
	for (; a < end; a = (a & ~(uintptr_t)(stride - 1)) + stride)
		(void)*(const volatile char *)a;
	if (counted && getrusage(RUSAGE_THREAD, &r1) == 0)
		sbi_count(&pool->n_map_faults,
			  (uint64_t)(r1.ru_minflt - r0.ru_minflt) +
				  (uint64_t)(r1.ru_majflt - r0.ru_majflt));
}

/*
 * Page tables that a system call makes, walked at once. A hypervisor that
 * shadows the guest's page tables (PVM: the AMD EPYC hosts of this kind)
 * write-protects each page directory and counts the writes to it; after a
 * few in a row with no fault through the directory in between, it drops
 * that directory's whole shadow (KVM's write-flooding heuristic). Every
 * entry under that gigabyte, hot KV pages and model pages alike, then
 * costs its first access again: 5-10 us a 4 KiB. A populate that needs a
 * new page table writes one directory entry, and the ready thread places
 * the next page of every region of a KV cache together: at each 2 MiB of
 * growth, 72 directory entries in a row, and the decoding thread spent
 * 0.5-2 ms a step for the next 16 steps re-faulting pages it had written
 * long before (bench/kv, every 1024th step; design.md, "Page tables on a
 * shadow-paging host"). A read of a page just populated is a fault through
 * its directory, which resets the count: so a placement populates 2 MiB
 * (one page table) at a time and reads the first byte of each. Without
 * shadow paging the read is one cache miss. The read is of an entry just
 * written, in a mapping registered with no uffd (as in fill_by_faults),
 * so it never waits for a handler, which may need the buffer lock held
 * here.
 */
#define TABLE_SPAN ((uintptr_t)2 << 20)

__attribute__((no_sanitize("address", "thread"))) static void
populate_walked(struct sb_pool *pool, const char *p, size_t len,
		bool populated)
{
	uintptr_t a = (uintptr_t)p, end = a + len;

	while (a < end) {
		uintptr_t next = (a & ~(TABLE_SPAN - 1)) + TABLE_SPAN;

		if (next > end)
			next = end;
		/* MADV_POPULATE_READ fills a mapping as MAP_POPULATE does a
		 * shared one. A kernel without it (before 5.14) says EINVAL:
		 * a read of each 4 KiB then, each a fault through the
		 * directory. Other errors leave the entries to the owner's
		 * faults, as MAP_POPULATE did. */
		if (populated ||
		    madvise((void *)a, next - a, MADV_POPULATE_READ) == 0)
			(void)*(const volatile char *)a;
		else if (errno == EINVAL)
			fill_by_faults(pool, (const char *)a, next - a, 4096);
		a = next;
	}
}

int sbi_uffd_register(int uffd, void *addr, size_t len, uint64_t mode)
{
	struct uffdio_register reg = {
		.range = {.start = (uintptr_t)addr, .len = len},
		.mode = mode,
	};

	return ioctl(uffd, UFFDIO_REGISTER, &reg) < 0 ? -errno : 0;
}

int sbi_vma_place(struct sb_buf *buf, size_t idx, size_t n, sbi_pid pid,
		  bool read_only)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	struct sb_pool *pool = buf->pool;
	struct sbi_heap *h = sbi_pid_heap(pool, pid);
	int prot = PROT_READ | (read_only ? 0 : PROT_WRITE);
	void *p;

	/* The heap page is already allocated and zeroed, so filling its
	 * page-table entries is all that is left, and the caller's first
	 * touches take no fault. */
	home_lose(buf, idx, n);
	if (!pool->fault_around) {
		char *addr = page_addr(buf, idx);
		size_t len = pages_len(buf, n);
		uintptr_t a = (uintptr_t)addr;
		/* Within one page table, MAP_POPULATE does it in one call. */
		bool one_table = (a ^ (a + len - 1)) < TABLE_SPAN;

		p = fixed_map(addr, len, prot,
			      heap_flags(h) | (one_table ? MAP_POPULATE : 0),
			      h->fd, sbi_pid_off(pool, pid));
		if (p == MAP_FAILED)
			return map_error(errno);
		populate_walked(pool, p, len, one_table);
		return 0;
	}
	p = fixed_map(page_addr(buf, idx), pages_len(buf, n), prot,
		      heap_flags(h), h->fd, sbi_pid_off(pool, pid));
	if (p == MAP_FAILED)
		return map_error(errno);
	fill_by_faults(pool, p, pages_len(buf, n), pool->fault_around);
	return 0;
}

static int buf_prot(const struct sb_buf *buf)
{
	return buf->flags & SBI_BUF_RO ? PROT_READ : PROT_READ | PROT_WRITE;
}

int sbi_vma_map_home(struct sb_buf *buf, size_t idx, size_t n,
		     const struct sbi_heap *h)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	char *addr = page_addr(buf, idx);
	size_t len = pages_len(buf, n);

	/* Nothing can touch the range yet (the buffer is not returned), so
	 * no page appears in a hole before the registration. MINOR: a page
	 * being read into (in the memfd, not yet mapped here) faults to the
	 * handler too, which waits for the read. Not for a clean home
	 * (home.c): its pages appear in the memfd only whole and checked,
	 * and the kernel maps them where they are touched. */
	if (fixed_map(addr, len, buf_prot(buf), heap_flags(h), h->fd, 0) ==
	    MAP_FAILED)
		return map_error(errno);
	return sbi_uffd_register(buf->pool->uffd, addr, len,
				 UFFDIO_REGISTER_MODE_MISSING |
					 (buf->home_clean
						  ? 0
						  : UFFDIO_REGISTER_MODE_MINOR));
}

/*
 * Room for releases at the mapping limit. There the kernel refuses every
 * mmap, even one that replaces mappings whole (a process gets past the
 * limit by itself: a placement that splits a mapping at one below it
 * makes two). munmap of part of a buffer is never safe: it leaves a hole
 * that another thread's mmap can take before the range is mapped again
 * (a library thread's heap, an application's malloc), and a hole touched
 * is SIGSEGV. So the library keeps a few mappings of its own, made
 * while there is room: giving one back lets the next mmap over a buffer
 * range through. Shared anonymous mappings, each its own object: they
 * never merge with a neighbour, so each munmap frees one.
 */
#define SPARES 4

static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static void *spares[SPARES];
static _Atomic int nspares;

void sbi_vma_spares_fill(void)
{
	if (atomic_load_explicit(&nspares, memory_order_relaxed) == SPARES)
		return;
	pthread_mutex_lock(&spare_lock);
	while (atomic_load(&nspares) < SPARES) {
		void *p = mmap(NULL, 4096, PROT_NONE,
			       MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1,
			       0);

		if (p == MAP_FAILED)
			break;
		spares[atomic_load(&nspares)] = p;
		atomic_fetch_add(&nspares, 1);
	}
	pthread_mutex_unlock(&spare_lock);
}

/* One spare given back to the kernel; false when none is left. (A spare
 * whose munmap fails, which only a program that mapped over it can
 * cause, is forgotten and the next one tried.) */
static bool spare_release(void)
{
	bool done = false;

	pthread_mutex_lock(&spare_lock);
	while (!done && atomic_load(&nspares) > 0) {
		int k = atomic_fetch_sub(&nspares, 1) - 1;

		done = munmap(spares[k], 4096) == 0;
	}
	pthread_mutex_unlock(&spare_lock);
	return done;
}

/*
 * Private anonymous memory over [addr, addr+len), in one mmap that
 * replaces what is there (no moment without a mapping). Refused with
 * ENOMEM at the mapping limit: then spares are given back one at a time
 * and the mmap tried again; when none is left (or another thread's mmap
 * took the room each time) it fails and nothing has changed.
 */
static int anon_over(char *addr, size_t len, int prot)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

	for (;;) {
		if (fixed_map(addr, len, prot, flags, -1, 0) != MAP_FAILED)
			return 0;
		if (errno != ENOMEM || !spare_release())
			return -1;
	}
}

/*
 * File pages replaced by anonymous memory that already holds their data:
 * made apart, filled from the heaps (pread: no mapping of registered
 * memory touched), then moved over the range in one step
 * (mremap takes the old mapping away and puts the new one there under
 * the mmap lock). A touch before the registration reads the page's own
 * bytes, never the zero page that a fresh anonymous mapping gives there;
 * the caller drops them once registered. 1 when done; 0 when a page of
 * the run holds no data (the caller goes the plain way); -errno, nothing
 * changed, when it cannot be done (at vm.max_map_count: the temporary
 * mapping, and mremap wants room for splits).
 */
static int anon_over_filled(struct sb_buf *buf, size_t idx, size_t n)
{
	struct sb_pool *pool = buf->pool;
	size_t len = pages_len(buf, n), ps = pool->page_size;
	char *tmp;
	int e = 0;

	for (size_t i = idx; i < idx + n; i++)
		if (!sbi_pte_has_page(buf->pte[i]))
			return 0;
	tmp = mmap(NULL, len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (tmp == MAP_FAILED)
		return -errno;
	for (size_t k = 0; k < n && e == 0; k++) {
		sbi_pid pid = sbi_pte_page(buf->pte[idx + k]);

		e = sbi_file_read_all(sbi_pid_heap(pool, pid)->fd,
				      tmp + k * ps, ps,
				      (uint64_t)sbi_pid_off(pool, pid));
	}
	if (e == 0 && buf_prot(buf) != (PROT_READ | PROT_WRITE) &&
	    mprotect(tmp, len, buf_prot(buf)) < 0)
		e = -errno;
	if (e < 0) {
		munmap(tmp, len);
		return e;
	}
	/* The copy is memory outside the budget, up to a run of 256
	 * pages, dropped again once registered. */
	SBI_MAP_BEGIN();
	if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED,
		   page_addr(buf, idx)) != MAP_FAILED) {
		SBI_MAP_END();
		return 1;
	}
	SBI_MAP_END();
	e = -errno;
	munmap(tmp, len);
	/* The mapping limit is checked before anything changes; only an
	 * allocation failing after the kernel took the old mapping away
	 * leaves a hole, which the plain way must fill at once. */
	if (mincore(page_addr(buf, idx), 1, &(unsigned char){0}) < 0 &&
	    errno == ENOMEM)
		return 0;
	return e;
}

/* Test hooks: the next count protections of shares (sbi_vma_share_finish),
 * or releases of pages (sbi_vma_unplace), fail with -err before they
 * change anything. */
static struct sbi_test_fault share_fault, unplace_fault;

void sbi_test_share_fail(int err, unsigned count);
void sbi_test_share_fail(int err, unsigned count)
{
	sbi_test_arm(&share_fault, err, count);
}

void sbi_test_unplace_fail(int err, unsigned count);
void sbi_test_unplace_fail(int err, unsigned count)
{
	sbi_test_arm(&unplace_fault, err, count);
}

int sbi_vma_unplace_uffd(struct sb_buf *buf, size_t idx, size_t n, int uffd)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	char *addr = page_addr(buf, idx);
	size_t len = pages_len(buf, n);
	/* A touch of a page handed to the SIGBUS uffd (a strict buffer's,
	 * a poisoned one) raises SIGBUS, never reads zeros: inaccessible
	 * (SIGSEGV) until registered. */
	bool sigbus = uffd == buf->pool->uffd_sigbus;
	int r = sbi_test_failure(&unplace_fault), filled = 0;

	if (r < 0)
		return r;
	home_lose(buf, idx, n);
	/* Pages of a file buffer with home mappings that lost their home
	 * (home.c): a touch racing the release reads their bytes, as it
	 * would a home page's. Not every file buffer's: the filled mapping
	 * has memory of its own once (an anon_vma), so it never merges with
	 * its neighbours again, and a buffer released page by page would
	 * end up with a mapping a page (vm.max_map_count); lost pages are
	 * few. Where it cannot be done the release fails, rather than open
	 * the window it closes. */
	if (!sigbus && buf->home && (buf->flags & SBI_BUF_RO))
		filled = anon_over_filled(buf, idx, n);
	if (filled < 0)
		return map_error(-filled);
	if (!filled &&
	    anon_over(addr, len, sigbus ? PROT_NONE : buf_prot(buf)) < 0)
		return map_error(errno);
	/* The new mapping is the range exactly (guard pages keep foreign
	 * mappings from merging with it), so registering it splits
	 * nothing; should the kernel still want room, spares give it. */
	do
		r = sbi_uffd_register(uffd, addr, len,
				      UFFDIO_REGISTER_MODE_MISSING);
	while (r == -ENOMEM && spare_release());
	if (r == 0 && sigbus && mprotect(addr, len, buf_prot(buf)) < 0)
		r = -errno;
	if (r < 0) {
		/* Unregistered anonymous memory would hand out silent zero
		 * pages; make the range inaccessible instead. */
		sbi_err("cannot hand %zu bytes to userfaultfd: %s", len,
			strerror(-r));
		mprotect(addr, len, PROT_NONE);
		return r;
	}
	/* A thread touching the range between the mmap and the registration
	 * got a private zero page: drop it, so the next touch faults to us.
	 * Its write raced with the unmap and is lost, as unmap promises. */
	if (!sigbus)
		madvise(addr, len, MADV_DONTNEED);
	/* The registration merged the range with its neighbours: room,
	 * maybe, for spares given back at the limit. */
	sbi_vma_spares_fill();
	return 0;
}

int sbi_vma_unplace(struct sb_buf *buf, size_t idx, size_t n)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	struct sb_pool *pool = buf->pool;

	return sbi_vma_unplace_uffd(buf, idx, n,
				    buf->flags & SB_BUF_STRICT
					    ? pool->uffd_sigbus
					    : pool->uffd);
}

static int uffd_wp_mode(int uffd, void *addr, size_t len, uint64_t mode)
{
	struct uffdio_writeprotect wp = {
		.range = {.start = (uintptr_t)addr, .len = len},
		.mode = mode,
	};

	for (int tries = 0; tries < 1000; tries++) {
		if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) == 0)
			return 0;
		if (errno != EAGAIN)
			return -errno;
	}
	return -EAGAIN;
}

/* UFFDIO_WRITEPROTECT, retried while the kernel answers EAGAIN (a range
 * being changed under it). */
int sbi_uffd_wp(int uffd, void *addr, size_t len, bool on)
{
	return uffd_wp_mode(uffd, addr, len,
			    on ? UFFDIO_WRITEPROTECT_MODE_WP : 0);
}

int sbi_vma_unprotect_nowake(struct sb_buf *buf, size_t idx)
{
	SBI_HELD(&buf->lock);
	return uffd_wp_mode(buf->pool->uffd, page_addr(buf, idx),
			    pages_len(buf, 1),
			    UFFDIO_WRITEPROTECT_MODE_DONTWAKE);
}

/*
 * Map page idx from the page cache where its page-table entries are
 * missing. The kernel's CONTINUE stops at the first 4 KiB entry present:
 * EEXIST with none mapped before it, else EAGAIN with `mapped` the part
 * mapped (and woken). Entries can be missing from any part of a page: the
 * kernel drops them one 4 KiB folio at a time (MADV_PAGEOUT, reclaim,
 * migration), and an application may MADV_DONTNEED a part. A present
 * entry maps the right page (a shared mapping of the page cache): step
 * over it. Stopping there instead would leave a thread that faulted on a
 * later part faulting again for ever.
 */
int sbi_vma_continue(struct sb_buf *buf, size_t idx)
{
	uintptr_t at = (uintptr_t)page_addr(buf, idx);
	const uintptr_t end = at + pages_len(buf, 1);
	const size_t step = (size_t)getpagesize();
	int again = 0;

	SBI_HELD(&buf->lock);
	while (at < end) {
		struct uffdio_continue cont = {
			.range = {.start = at, .len = end - at},
		};

		if (ioctl(buf->pool->uffd, UFFDIO_CONTINUE, &cont) == 0)
			return 0;	/* the rest of the page */
		if (cont.mapped > 0)
			at += (uintptr_t)cont.mapped;	/* a part */
		else if (errno == EEXIST)
			at += step;	/* present: mapped already */
		else if (errno != EAGAIN || ++again == 1000)
			return -errno;
	}
	return 0;
}

/* A page evicted in place still maps its heap page, punched and registered
 * MISSING (evict.c): fill that page with src's data and map it, atomically,
 * with no change of mappings (UFFDIO_COPY), and wake nobody: the caller
 * wakes the thread that waits. */
int sbi_uffd_copy(int uffd, void *dst, const void *src, size_t len)
{
	struct uffdio_copy copy = {.mode = UFFDIO_COPY_MODE_DONTWAKE};
	size_t done = 0;

	for (int tries = 0; tries < 1000; tries++) {
		copy.dst = (uintptr_t)dst + done;
		copy.src = (uintptr_t)src + done;
		copy.len = len - done;
		copy.copy = 0;
		if (ioctl(uffd, UFFDIO_COPY, &copy) == 0)
			return 0;
		if (errno != EAGAIN)
			return -errno;
		if (copy.copy > 0)	/* a part is in: the rest */
			done += (size_t)copy.copy;
	}
	return -EAGAIN;
}

int sbi_vma_copy_in(struct sb_buf *buf, size_t idx, const void *src)
{
	SBI_HELD(&buf->lock);
	return sbi_uffd_copy(buf->pool->uffd, page_addr(buf, idx), src,
			     pages_len(buf, 1));
}

int sbi_vma_drop_ptes(struct sb_buf *buf, size_t idx, size_t n)
{
	SBI_HELD(&buf->lock);
	return madvise(page_addr(buf, idx), pages_len(buf, n),
		       MADV_DONTNEED) < 0
		       ? -errno
		       : 0;
}

void sbi_vma_wake_range(struct sb_pool *pool, uintptr_t start, size_t len)
{
	struct uffdio_range range = {.start = start, .len = len};

	ioctl(pool->uffd, UFFDIO_WAKE, &range);
}

int sbi_vma_protect(struct sb_buf *buf, size_t idx, size_t n, int uffd)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	char *addr = page_addr(buf, idx);
	size_t len = pages_len(buf, n);
	int r;

	/* The registration becomes WP alone: a home page's is not its
	 * home's any more (MISSING and MINOR gone). */
	home_lose(buf, idx, n);
	r = sbi_uffd_register(uffd, addr, len, UFFDIO_REGISTER_MODE_WP);
	if (r == 0)
		r = sbi_uffd_wp(uffd, addr, len, true);
	return r;
}

int sbi_vma_unprotect(struct sb_buf *buf, size_t idx, size_t n)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	/* Also wakes the threads waiting on the write fault. */
	return sbi_uffd_wp(buf->pool->uffd, page_addr(buf, idx),
			    pages_len(buf, n), false);
}

void sbi_vma_wake(struct sb_buf *buf, size_t idx)
{
	struct uffdio_range range = {
		.start = (uintptr_t)page_addr(buf, idx),
		.len = pages_len(buf, 1),
	};

	ioctl(buf->pool->uffd, UFFDIO_WAKE, &range);
}

int sbi_vma_map_private(struct sb_buf *buf, size_t idx, size_t n, sbi_pid pid)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	struct sb_pool *pool = buf->pool;

	/*
	 * The new mapping exists, unprotected, until sbi_vma_share_finish.
	 * Mapped MAP_PRIVATE, a write meanwhile gets a private copy from the
	 * kernel and can never reach the page that other buffers show; the
	 * finish drops such copies. No MAP_POPULATE: it would copy every
	 * page (a write populate).
	 */
	home_lose(buf, idx, n);
	if (fixed_map(page_addr(buf, idx), pages_len(buf, n),
		      PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | (heap_flags(sbi_pid_heap(pool, pid)) &
				     MAP_NORESERVE),
		      sbi_pid_heap(pool, pid)->fd, sbi_pid_off(pool, pid)) ==
	    MAP_FAILED)
		return map_error(errno);
	return 0;
}

/* Test hook: the next count reads of pagemap (drop_copies) fail, as where
 * /proc is not mounted. */
static struct sbi_test_fault pagemap_fault;

void sbi_test_pagemap_fail(unsigned count);
void sbi_test_pagemap_fail(unsigned count)
{
	sbi_test_arm(&pagemap_fault, ENOENT, count);
}

/* Pagemap's bits for a 4 KiB entry. */
#define PM_PRESENT (1ull << 63)
#define PM_SWAP (1ull << 62)
#define PM_FILE (1ull << 61)

/*
 * Drop the private copies that writes made in [addr, addr+len) between the
 * mapping and its protection: such a write is ordered before the share,
 * whose result replaces it. /proc/self/pagemap tells them apart: not a
 * file's page (bit 61), present or swapped out (or being migrated). The
 * buffer page that holds one goes whole (a huge page's mapping cannot drop
 * 4 KiB of it) and is read in again, so that no write-protect marker is
 * left where a page was (a stale minor fault's CONTINUE would map the
 * file's page there without the protection). Nothing else writes there
 * meanwhile: a write after the protection faults to a handler, which waits
 * for the buffer's lock, held here. 0, or -errno when pagemap cannot be
 * read or a page not dropped (the caller then drops the whole range).
 */
static int drop_copies(char *addr, size_t len, size_t page_size)
{
	enum { N = 512 };
	uint64_t e[N];
	uintptr_t a = (uintptr_t)addr, end = a + len, dropped = 0;
	int fd, r = sbi_test_failure(&pagemap_fault);

	if (r < 0)
		return r;
	fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (a < end && r == 0) {
		size_t n = (end - a) / 4096 < N ? (end - a) / 4096 : N;
		ssize_t got = pread(fd, e, n * sizeof(e[0]),
				    (off_t)(a / 4096 * sizeof(e[0])));

		if (got != (ssize_t)(n * sizeof(e[0]))) {
			r = got < 0 ? -errno : -EIO;
			break;
		}
		for (size_t i = 0; i < n && r == 0; i++) {
			uintptr_t pg = (a + i * 4096) &
				       ~(uintptr_t)(page_size - 1);

			if (!(e[i] & (PM_PRESENT | PM_SWAP)) ||
			    (e[i] & PM_FILE) || (dropped && pg == dropped))
				continue;
			if (madvise((void *)pg, page_size, MADV_DONTNEED) < 0)
				r = -errno;
			else
				madvise((void *)pg, page_size,
					MADV_POPULATE_READ);
			dropped = pg;
		}
		a += n * 4096;
	}
	close(fd);
	return r;
}

int sbi_vma_inaccessible(struct sb_buf *buf, size_t idx, size_t n)
{
	SBI_HELD(&buf->lock);
	return mprotect(page_addr(buf, idx), pages_len(buf, n), PROT_NONE) < 0
		       ? -errno
		       : 0;
}

int sbi_vma_share_finish(struct sb_buf *buf, size_t idx, size_t n, int uffd)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	char *addr = page_addr(buf, idx);
	size_t len = pages_len(buf, n);
	int r = sbi_test_failure(&share_fault);

	if (r < 0)
		return r;

	/*
	 * Reads first, while no uffd is registered there: a read fault then
	 * maps the 16 pages around it (fault-around). Once registered for
	 * write-protection the kernel maps one 4 KiB page a fault, through
	 * the markers the protection leaves: a populate after it was 60% of
	 * the prompt cache's get (perf, 2026-12-01). A read populate copies
	 * nothing. Not a table at a time with a read of each
	 * (populate_walked): a share is mostly a few pages, and that read
	 * cost the get 3x (design.md, "Page tables on a shadow-paging host").
	 */
	madvise(addr, len, MADV_POPULATE_READ);
	/* One registration and one protection for the whole range, however
	 * many mappings make it up: a prompt's pages come from sparsebufd's
	 * heaps a few at a time. */
	r = sbi_vma_protect(buf, idx, n, uffd);
	if (r < 0)
		return r;
	if (drop_copies(addr, len, buf->pool->page_size) < 0) {
		/* No pagemap (or a page it named that would not go): every
		 * entry goes (those of a racing write's copies with them),
		 * and is filled again. The zapped entries keep their
		 * write-protect markers, so the next write faults to the
		 * handler. */
		madvise(addr, len, MADV_DONTNEED);
		madvise(addr, len, MADV_POPULATE_READ);
	}
	return 0;
}

int sbi_vma_place_shared(struct sb_buf *buf, size_t idx, size_t n,
			 sbi_pid pid, int uffd)
{
	int r = sbi_vma_map_private(buf, idx, n, pid);

	return r < 0 ? r : sbi_vma_share_finish(buf, idx, n, uffd);
}

int sbi_vma_poison(struct sb_buf *buf, size_t idx)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	struct sb_pool *pool = buf->pool;
	char *addr = page_addr(buf, idx);
	size_t len = pages_len(buf, 1);
	int r;

	if (pool->can_poison) {
		for (int tries = 0; tries < 1000; tries++) {
			struct uffdio_poison poison = {
				.range = {.start = (uintptr_t)addr,
					  .len = len},
			};

			if (ioctl(pool->uffd, UFFDIO_POISON, &poison) == 0)
				return 0;
			if (errno == EEXIST)	/* a stray zero page */
				madvise(addr, len, MADV_DONTNEED);
			else if (errno != EAGAIN)
				break;
		}
	}
	/* No POISON (before 6.6): hand the page to the SIGBUS uffd. */
	r = sbi_vma_unplace_uffd(buf, idx, 1, pool->uffd_sigbus);
	sbi_vma_wake(buf, idx);
	return r;
}

int sbi_vma_unpoison(struct sb_buf *buf, size_t idx)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);

	/* MADV_DONTNEED drops poison markers where a punch keeps them. */
	if (madvise(page_addr(buf, idx), pages_len(buf, 1), MADV_DONTNEED) < 0)
		return -errno;
	return 0;
}

int sbi_vma_wpfail(struct sb_buf *buf, size_t idx, sbi_pid pid, uint32_t tid)
{
	SBI_HELD(&buf->lock);
	SBI_HELD(&buf->pool->layout);
	struct sb_pool *pool = buf->pool;
	char *addr = page_addr(buf, idx);
	size_t len = pages_len(buf, 1);
	int r;

	/*
	 * The same page mapped afresh, write-protected through the SIGBUS
	 * uffd: reads still work, writes raise SIGBUS. The faulting thread
	 * can run before the wake-up below: a signal ends its wait, and it
	 * retries the write at once. A writable mapping not yet protected
	 * would give it a private copy, dropped a moment later: a write that
	 * seemed to succeed. So the mapping stays read-only until the
	 * protection is in place (a write in those three system calls gets
	 * SIGSEGV instead of SIGBUS), and write-protected entries stay so
	 * when PROT_WRITE comes.
	 */
	home_lose(buf, idx, 1);
	if (fixed_map(addr, len, PROT_READ,
		      MAP_PRIVATE | (heap_flags(sbi_pid_heap(pool, pid)) &
				     MAP_NORESERVE),
		      sbi_pid_heap(pool, pid)->fd, sbi_pid_off(pool, pid)) ==
	    MAP_FAILED)
		r = map_error(errno);
	else if ((r = sbi_vma_protect(buf, idx, 1, pool->uffd_sigbus)) == 0 &&
		 mprotect(addr, len, PROT_READ | PROT_WRITE) < 0)
		r = -errno;
	if (r == 0)	/* reads then take no fault */
		madvise(addr, len, MADV_POPULATE_READ);
	/*
	 * Refused (past vm.max_map_count every mmap fails): the page stays
	 * shared and write-protected, and the woken thread would retry its
	 * write into the same fault for ever (1.2 million messages and no
	 * progress, an adversarial test of 2026-11-29). It gets its SIGBUS
	 * directly, pending before the wake-up: tid is the faulting thread
	 * (UFFD_FEATURE_THREAD_ID), si_code SI_TKILL, no address.
	 */
	if (r < 0 && tid)
		syscall(SYS_tgkill, getpid(), (pid_t)tid, SIGBUS);
	sbi_vma_wake(buf, idx);
	return r;
}
