/* SPDX-License-Identifier: MIT */
/*
 * Home mappings: a file buffer's pages filled and emptied in place, with
 * no change of mappings.
 *
 * A file buffer's pages come and go all the time (LLM in a flash reads and
 * releases thousands a token). Placing a page the common way replaces its
 * anonymous mapping with one of a heap page (mmap MAP_FIXED), releasing it
 * puts anonymous memory back and registers it (mmap, UFFDIO_REGISTER,
 * MADV_DONTNEED): three to four system calls a page, two of them under the
 * process's mmap lock for writing, which every other placement, release
 * and page fault of the process then waits for. With one thread reading
 * pages in and another releasing them, that lock was the bottleneck.
 *
 * So a file buffer, when it is created, gets heaps of its own (home heaps)
 * and maps them whole, once, registered MISSING and MINOR: page i's home is
 * page i % pages_per_heap of heap home[i / pages_per_heap], reserved for it
 * (EVICTED: held, no memory) and empty (a hole in the memfd: a touch is a
 * missing fault). Then:
 *   - a page-in takes the home page (under the budget, as any allocation)
 *     and reads into one of the disk tier's read buffers, then writes it
 *     into the home page through the file (pwrite; straight into the page
 *     through the heap's own mapping when no read buffer is free: io.c,
 *     sbi_io_bounce_init, says why); a touch meanwhile, a missing or a
 *     minor fault, waits for the read; done, the page is mapped where it
 *     is (UFFDIO_CONTINUE: mmap lock for reading). A clean home
 *     (buf->home_clean, where no folio is larger than a page) is
 *     registered MISSING only and maps nothing: its page-ins always go
 *     through a read buffer, checked there, and are copied from it into
 *     the heap's copy-in window (fill_window, UFFDIO_COPY), so a page
 *     appears in the memfd only whole, at once, in folios of 4 KiB
 *     whatever shmem_enabled says by then (pagein.c, home_fill, says why
 *     not pwrite), and the first touch takes the kernel's own fault,
 *     which maps it clean;
 *   - a release (unmap, or eviction of the clean page) punches the home
 *     page (fallocate: no mmap lock at all), which takes its page-table
 *     entries with it, and reserves it again. A clean home drops a whole
 *     batch's entries first, one TLB flush (drop_entries), where a punch
 *     of a mapped page costs a flush each.
 * The buffer keeps one mapping per heap, whatever its pages do. The price:
 * a page read in gets fresh memory from the memfd (a write that covers it
 * leaves it unzeroed), where the common way reads into a page freed
 * earlier, as it is.
 *
 * Anything that replaces a page's mapping the common way (sharing its page
 * into another buffer and then releasing it, a fallback after an error)
 * marks the page lost (vma.c), and from then on it is placed and released
 * the common way. Its home page, once its last holder lets go, is punched
 * and reserved for its heap again, as is the last heap's tail past the
 * buffer's pages: no page of a home heap is free while its buffer lives
 * (pool.c, reserve_home, says why). A page is home only while it is not
 * lost and its entry names its home page, placed or kept.
 */
#include "internal.h"
#include "uffd_compat.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

bool sbi_home_is(const struct sb_buf *buf, size_t i)
{
	return buf->home && !(buf->home_lost[i / 64] >> (i % 64) & 1);
}

sbi_pid sbi_home_pid(const struct sb_buf *buf, size_t i)
{
	uint32_t pph = buf->pool->pages_per_heap;

	return buf->home[i / pph] * pph + (sbi_pid)(i % pph);
}

bool sbi_home_poisoned(const struct sb_buf *buf, size_t i)
{
	SBI_HELD(&buf->lock);
	uint64_t pte = buf->pte[i];

	/* A failed read's entry has no DISK (pagein.c); the page-in that
	 * could not start keeps it. */
	return sbi_home_is(buf, i) && (pte & SBI_PTE_POISON) &&
	       (pte & ~(SBI_PTE_POISON | SBI_PTE_IOERR | SBI_PTE_DISK)) ==
		       (SBI_PTE_KEEP | sbi_pte_placed(sbi_home_pid(buf, i)));
}

bool sbi_home_empty(const struct sb_buf *buf, size_t i)
{
	SBI_HELD(&buf->lock);
	return sbi_home_is(buf, i) &&
	       buf->pte[i] == (SBI_PTE_DISK | SBI_PTE_KEEP |
			       sbi_pte_placed(sbi_home_pid(buf, i)));
}

bool sbi_home_placed(struct sb_buf *buf, size_t i)
{
	SBI_HELD(&buf->lock);
	sbi_pid h;

	if (!sbi_home_is(buf, i))
		return false;
	h = sbi_home_pid(buf, i);
	if (buf->pte[i] != sbi_pte_placed(h))
		return false;
	/* Never shared out: this page is its only holder. */
	return i >= buf->shared_hi || sbi_pool_refs(buf->pool, h) == 1;
}

bool sbi_home_cancel(struct sb_buf *buf, size_t i)
{
	SBI_HELD(&buf->lock);
	if (!sbi_home_is(buf, i) ||
	    buf->pte[i] != (SBI_PTE_DISK | SBI_PTE_KEEP | SBI_PTE_INFLIGHT |
			    sbi_pte_placed(sbi_home_pid(buf, i))))
		return false;
	buf->home_cancel[i / 64] |= 1ull << (i % 64);
	return true;
}

void sbi_home_uncancel(struct sb_buf *buf, size_t i)
{
	SBI_HELD(&buf->lock);
	if (buf->home_cancel)
		buf->home_cancel[i / 64] &= ~(1ull << (i % 64));
}

bool sbi_home_cancelled(struct sb_buf *buf, size_t i)
{
	SBI_HELD(&buf->lock);
	uint64_t bit = 1ull << (i % 64);

	if (!buf->home_cancel || !(buf->home_cancel[i / 64] & bit))
		return false;
	buf->home_cancel[i / 64] &= ~bit;
	return true;
}

/* Each heap holds a file descriptor: the home heaps of all the process's
 * buffers may take at most a quarter of what it may open (RLIMIT_NOFILE),
 * and 256 (16 GiB of 64 MiB heaps); a buffer past that is mapped the
 * common way (larger heaps make room). Counted until the buffer goes. */
static _Atomic size_t home_heaps;	/* of every buffer of the process */

static bool fds_to_spare(size_t nheaps)
{
	struct rlimit rl;
	size_t cap = 256, had;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return false;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < cap)
		cap = rl.rlim_cur / 4;
	had = atomic_load(&home_heaps);
	do {
		if (had + nheaps > cap)
			return false;
	} while (!atomic_compare_exchange_weak(&home_heaps, &had,
					       had + nheaps));
	return true;
}

/* A clean home heap's copy-in window (pagein.c, home_fill): the heap
 * mapped once more, registered MISSING with the pool's SIGBUS
 * userfaultfd, so that nothing but a copy ever fills a page through it
 * (anything else that touched it would get SIGBUS, never a zero page made
 * in the memfd). Made once per heap; goes with the heap (heap.c). */
static int fill_window(struct sb_pool *pool, struct sbi_heap *h)
{
	size_t bytes = (size_t)h->npages * pool->page_size;
	char *m;
	int r;

	if (h->fill)
		return 0;
	m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd,
		 h->foff);
	if (m == MAP_FAILED)
		return -errno;
	madvise(m, bytes, MADV_DONTFORK);
	r = sbi_uffd_register(pool->uffd_sigbus, m, bytes,
			      UFFDIO_REGISTER_MODE_MISSING);
	if (r < 0) {
		munmap(m, bytes);
		return r;
	}
	/* The ready thread sweeps every heap's pool-side entries under
	 * the lock (heap.c). */
	pthread_mutex_lock(&pool->lock);
	h->fill = m;
	pthread_mutex_unlock(&pool->lock);
	return 0;
}

/* The windows of a buffer's home heaps, gone again before its first
 * page-in (the mappings they take are wanted for the home itself). */
static void drop_windows(struct sb_pool *pool, const uint32_t *home,
			 size_t nheaps)
{
	for (size_t k = 0; k < nheaps; k++) {
		struct sbi_heap *h = pool->heaps[home[k]];
		char *m;

		pthread_mutex_lock(&pool->lock);
		m = h->fill;
		h->fill = NULL;
		pthread_mutex_unlock(&pool->lock);
		if (m)
			munmap(m, (size_t)h->npages * pool->page_size);
	}
}

int sbi_home_setup(struct sb_buf *buf)
{
	struct sb_pool *pool = buf->pool;
	uint32_t pph = pool->pages_per_heap;
	size_t nheaps = (buf->npages + pph - 1) / pph, k;
	uint32_t *home;
	uint64_t *lost, *cancel;
	struct sbi_disk *d = sbi_disk_peek(pool);
	int r = 0;

	if (!pool->can_home || !fds_to_spare(nheaps))
		return 0;
	/* Clean where every read can go through a read buffer, and where a
	 * punch frees what it punches (no folio larger than a page, which
	 * a punch could leave zeroed in place: only a minor fault catches
	 * the touch of that). */
	buf->home_clean = d && sbi_io_bounce_fits(d->io, pool->page_size) &&
			  !pool->big_folios &&
			  sbi_shmem_folio_bytes() <= pool->page_size;
	buf->home_heaps = nheaps;
	home = calloc(nheaps, sizeof(*home));
	lost = calloc((buf->npages + 63) / 64, sizeof(*lost));
	cancel = calloc((buf->npages + 63) / 64, sizeof(*cancel));
	if (!home || !lost || !cancel ||
	    sbi_pool_add_home(pool, buf->npages, home) < 0) {
		/* The common way, then. */
		free(home);
		free(lost);
		free(cancel);
		sbi_home_free(buf);
		return 0;
	}
	/* A clean home's page-ins copy into its heaps' windows: without
	 * all of them (vm.max_map_count), it registers MINOR as any home. */
	for (k = 0; k < nheaps && buf->home_clean; k++)
		if (fill_window(pool, pool->heaps[home[k]]) < 0) {
			drop_windows(pool, home, nheaps);
			buf->home_clean = false;
		}
	pthread_rwlock_rdlock(&pool->layout);
	pthread_mutex_lock(&buf->lock);
	for (int tries = 0; tries < 2; tries++) {
		for (k = 0, r = 0; k < nheaps && r == 0; k++) {
			size_t first = k * pph;
			size_t n = buf->npages - first < pph
					   ? buf->npages - first
					   : pph;

			r = sbi_vma_map_home(buf, first, n,
					     pool->heaps[home[k]]);
		}
		if (r == 0 || !buf->home_clean)
			break;
		/* The windows took the room the home needed: the home
		 * without them (MINOR), from the common layout again. */
		if (sbi_vma_unplace(buf, 0, buf->npages) < 0)
			break;
		drop_windows(pool, home, nheaps);
		buf->home_clean = false;
	}
	if (r == 0) {
		buf->home = home;
		buf->home_lost = lost;
		buf->home_cancel = cancel;
		for (size_t i = 0; i < buf->npages; i++)
			buf->pte[i] = SBI_PTE_DISK | SBI_PTE_KEEP |
				      sbi_pte_placed(sbi_home_pid(buf, i));
	} else {
		/* vm.max_map_count, most likely: the common layout back
		 * (one mapping), and the reservations go. */
		sbi_warn("buffer %u: no home mapping (%s); pages are mapped "
			 "one by one",
			 buf->id, strerror(-r));
		buf->home_clean = false;
		r = sbi_vma_unplace(buf, 0, buf->npages);
	}
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);
	if (!buf->home) {
		sbi_pid pids[256];

		sbi_pool_home_gone(pool, home, nheaps);
		for (size_t i = 0; i < buf->npages;) {
			size_t n = 0;

			for (; i < buf->npages && n < 256; i++)
				pids[n++] = home[i / pph] * pph +
					    (sbi_pid)(i % pph);
			sbi_pool_drop_evicted(pool, pids, n);
		}
		free(home);
		free(lost);
		free(cancel);
		sbi_home_free(buf);
	}
	return r;
}

void sbi_home_free(struct sb_buf *buf)
{
	buf->home_clean = false;
	atomic_fetch_sub(&home_heaps, buf->home_heaps);
	buf->home_heaps = 0;
	free(buf->home);
	free(buf->home_lost);
	free(buf->home_cancel);
	buf->home = NULL;
	buf->home_lost = buf->home_cancel = NULL;
}

/* process_madvise(MADV_DONTNEED) on this process: refused before Linux
 * 6.13 (the advice was not allowed), then never asked again; once it has
 * worked, a refusal is about those ranges (mlock: EINVAL) and the next
 * batch asks again. */
static _Atomic bool no_self_madvise, self_madvise_works;

/*
 * Drop the page-table entries of pages idx[0..n) (runs of neighbours), in
 * one system call. A punch zaps the entries of what it frees and flushes
 * the TLB once per call: with a page per call, that flush was most of a
 * release (11 us a page with the other CPU idle, 50 us with a thread of
 * this process running there, on a host that shadows page tables). The
 * kernel batches the flush of clean entries across the ranges of one
 * process_madvise (dirty shared entries it must flush one range at a
 * time, and UFFDIO_CONTINUE makes every entry dirty: hence clean homes).
 * Best effort: what is left, the punch zaps. buf->lock held.
 */
static void drop_entries(struct sb_buf *buf, const size_t *idx, size_t n)
{
	struct sb_pool *pool = buf->pool;
	struct iovec iov[SBI_HOME_BATCH];
	size_t m = 0;
	int pidfd;

	if (atomic_load_explicit(&no_self_madvise, memory_order_relaxed))
		return;
	for (size_t k = 0, j; k < n; k = j) {
		for (j = k + 1; j < n && idx[j] == idx[j - 1] + 1; j++)
			;
		iov[m].iov_base = buf->base + (idx[k] << pool->page_shift);
		iov[m++].iov_len = (j - k) << pool->page_shift;
	}
	/* Opened each time: a descriptor kept would name the parent in a
	 * child after fork, and this costs two system calls a batch. */
	pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
	if (pidfd < 0)
		return;
	if (syscall(SYS_process_madvise, pidfd, iov, m, MADV_DONTNEED, 0) >=
	    0)
		atomic_store(&self_madvise_works, true);
	else if (!atomic_load(&self_madvise_works) &&
		 (errno == EINVAL || errno == ENOSYS || errno == EPERM))
		atomic_store(&no_self_madvise, true);
	close(pidfd);
}

void sbi_home_release(struct sb_buf *buf, const size_t *idx, size_t n)
{
	SBI_HELD(&buf->lock);
	struct sb_pool *pool = buf->pool;
	sbi_pid pids[SBI_HOME_BATCH];

	if (!n)
		return;
	for (size_t k = 0; k < n; k++)
		pids[k] = sbi_home_pid(buf, idx[k]);
	/* A touch meanwhile maps the page again (it is whole in the memfd
	 * until the punch); the punch then zaps that entry too. */
	if (buf->home_clean)
		drop_entries(buf, idx, n);
	/* The memory first (the accounting never shows less than the pool
	 * holds), a run of neighbours at a time. The punch takes the
	 * buffer's page-table entries too: a touch from here on is a
	 * missing fault, which waits for buf->lock, then reads the page in. */
	for (size_t k = 0, j; k < n; k = j) {
		for (j = k + 1; j < n && pids[j] == pids[j - 1] + 1 &&
				sbi_pid_index(pool, pids[j]) != 0;
		     j++)
			;
		struct sbi_heap *h = sbi_pid_heap(pool, pids[k]);

		/* Copy-ins' entries in the heap's window first (pagein.c,
		 * home_fill), all at once: each is dirty, and a punch that
		 * found one would flush the TLB for its run alone. */
		sbi_heap_sweep_pool(h, pool->page_size);
		sbi_heap_punch(h, sbi_pid_index(pool, pids[k]),
			       (uint32_t)(j - k), pool->page_size);
	}
	sbi_pool_mark_evicted(pool, pids, n);
	for (size_t k = 0; k < n; k++)
		buf->pte[idx[k]] = SBI_PTE_DISK | SBI_PTE_KEEP |
				   sbi_pte_placed(pids[k]);
	buf->nplaced -= n;
}
