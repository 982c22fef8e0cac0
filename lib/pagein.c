/* SPDX-License-Identifier: MIT */
/*
 * Page-ins: bringing a page whose data is on disk (evicted to the spill
 * file, or never yet read from a buffer's file) back under its address.
 *
 *   1. Under the buffer's lock, take a pool page and mark the entry in
 *      flight (DISK | INFLIGHT | pid + 1); the request keeps the old entry
 *      (which spill slot, or the file). A touch of a page in flight adds
 *      nothing: the thread waits, on the userfaultfd, for that read.
 *   2. The read goes to the I/O engine: a spill page's or a home page's
 *      into one of the engine's read buffers when one is free (io.c says
 *      why), written into the pool page through the heap's file once
 *      checked; others straight into the pool page (the heaps' own
 *      mapping, O_DIRECT where the file allows).
 *   3. On the completion thread: check (CRC-32C for spill and save files;
 *      zeros past the end of a file), then, under the buffer's lock, if
 *      the entry is still the one we marked, map the page and wake the
 *      waiters. If the entry changed (unmap, destroy), the page goes back.
 *      A failed read or a bad checksum poisons the page: the toucher gets
 *      SIGBUS, io_errors rises, no other page is affected.
 *
 * Sequential touches read ahead: a fault right after the previous page
 * (or on a page still in flight, which means the reader is ahead of the
 * disk) starts reads for a window that doubles up to 32 MiB, so a
 * streaming reader keeps the queue deep while it waits.
 */
#include "internal.h"
#include "trace.h"
#include "uffd_compat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define RA_MIN_BYTES ((size_t)128 << 10)
#define RA_MAX_BYTES ((size_t)32 << 20)
#define BATCH 64
/* Reads go to the disk as soon as this many bytes are ready to go (and the
 * touched page's read at once): preparing a pool page can take a fresh
 * allocation, and the disk should not sit idle while a batch is built. */
#define SUBMIT_BYTES ((size_t)1 << 20)

/* Test hook: the next count page-in reads this process starts fail with
 * -err (reads ahead of a touch excepted: they are not asked for). */
static struct sbi_test_fault read_fault;

void sbi_test_io_fail(int err, unsigned count);
void sbi_test_io_fail(int err, unsigned count)
{
	sbi_test_arm(&read_fault, err, count);
}

/* Test hook: the next count writes of a read buffer into its page (a
 * home page's or a spill page's) stop half way with -err. */
static struct sbi_test_fault bounce_fault;

void sbi_test_bounce_fail(int err, unsigned count);
void sbi_test_bounce_fail(int err, unsigned count)
{
	sbi_test_arm(&bounce_fault, err, count);
}

/* Whether the read being started gets the injected failure: decided in
 * the order reads start (the touched page before its readahead). */
static int injected_failure(void)
{
	return sbi_test_failure(&read_fault);
}

/* ---- where the data is ----------------------------------------------------- */

void sbi_src_where(struct sb_buf *buf, size_t idx, uint64_t pte, int *fd,
		   uint64_t *off, size_t *len)
{
	struct sb_pool *pool = buf->pool;
	uint32_t slot1 = sbi_pte_slot1(pte);
	uint64_t at = (uint64_t)idx << pool->page_shift;
	struct sbi_src *src = buf->src;

	if (slot1) {
		struct sbi_disk *d = pool->disk;

		*fd = d->spill_fd;
		*off = sbi_spill_off(d, slot1 - 1);
		*len = pool->page_size;
		return;
	}
	*fd = src->fd;
	*off = src->base + at;
	*len = 0;
	if (at < src->size) {
		uint64_t left = src->size - at;

		/* Whole 4 KiB blocks (O_DIRECT); the end of the file cuts
		 * the read short, and the check zeroes the rest. */
		*len = left < pool->page_size ? (size_t)((left + 4095) & ~4095ull)
					      : pool->page_size;
	}
}

int sbi_src_check(struct sb_buf *buf, size_t idx, uint64_t src_pte,
		  void *mem, const sbi_pid *pool_side, ssize_t res)
{
	struct sb_pool *pool = buf->pool;
	size_t ps = pool->page_size;
	uint32_t slot1 = sbi_pte_slot1(src_pte);
	uint64_t at = (uint64_t)idx << pool->page_shift;
	struct sbi_src *src = buf->src;
	size_t valid;

	if (res < 0)
		return (int)res;
	if (slot1) {
		uint32_t crc;

		if ((size_t)res != ps)
			return -EIO;	/* the spill file lost data */
		if (!pool_side)
			crc = sbi_crc32c(mem, ps);
		else if (sbi_disk_page_crc(pool->disk, *pool_side, ps, &crc) < 0)
			return -EIO;
		return crc == sbi_spill_crc(pool->disk, slot1 - 1) ? 0
								   : -EBADMSG;
	}
	valid = at < src->size ? (size_t)(src->size - at) : 0;
	if (valid > ps)
		valid = ps;
	if (!src->save) {
		/* A plain file: what lay past its end when it was opened
		 * reads as zeros. A read cut shorter than that means the file
		 * shrank since: as with mmap(2), the touch gets SIGBUS, never
		 * zeros where there was data. */
		if ((size_t)res < valid)
			return -ENODATA;
		if (valid < ps)
			memset((char *)mem + valid, 0, ps - valid);
		return 0;
	}
	if (valid > (size_t)res)
		valid = (size_t)res;
	for (size_t b = 0; b < ps; b += 4096) {
		size_t blk = (size_t)((at + b) >> 12);
		bool present = blk < src->nblocks &&
			       (src->present[blk / 64] >> (blk % 64) & 1);

		if (!present) {
			memset((char *)mem + b, 0, 4096);	/* a hole */
			continue;
		}
		if (b + 4096 > valid)
			return -EIO;	/* the file was cut short */
		if (sbi_crc32c((char *)mem + b, 4096) != src->crc[blk])
			return -EBADMSG;
	}
	return 0;
}

/* ---- completion --------------------------------------------------------------- */

void sbi_pte_release(struct sb_buf *buf, uint64_t pte)
{
	struct sb_pool *pool = buf->pool;
	uint32_t slot1 = sbi_pte_slot1(pte);
	sbi_ptref kept = sbi_pte_kept(pte);

	if (pte & SBI_PTE_INFLIGHT)
		return;	/* the request gives them back when it finishes */
	if ((pte & (SBI_PTE_DISK | SBI_PTE_IOERR)) && slot1)
		sbi_spill_free(pool->disk, &(uint32_t){slot1 - 1}, 1);
	sbi_failed_read_gone(buf, pte);
	if (!sbi_ptref_none(kept))
		sbi_pool_drop_evicted(pool, &(sbi_pid){sbi_ptref_pid(kept)}, 1);
}

void sbi_failed_read_gone(struct sb_buf *buf, uint64_t pte)
{
	/* Counted so when it failed (pagein_done). */
	if ((pte & SBI_PTE_IOERR) && (sbi_pte_slot1(pte) || buf->src))
		atomic_fetch_sub(&buf->failed_reads, 1);
}

/* Make the touch of page idx raise SIGBUS. A page evicted in place (KEEP)
 * was write-protected when it was evicted; the marker must go first. */
static void poison(struct sb_buf *buf, size_t idx, bool kept)
{
	if (kept)
		sbi_vma_unprotect_nowake(buf, idx);
	sbi_vma_poison(buf, idx);
}

/*
 * Map a page read in over the kept page, complete: there is no moment at
 * which a touch could see anything else. Returns the page now placed
 * there, or -errno. Counted first: a thread that touches the page once it
 * is mapped takes no fault and waits for nothing, and its next
 * sb_pool_stats must include the page.
 *
 * A page evicted in place that kept its heap page still maps it: when no
 * mapping can be made (at vm.max_map_count the kernel refuses every mmap,
 * even one that replaces a mapping whole), the data is copied into that
 * page instead (UFFDIO_COPY, atomic as the mapping is), which changes no
 * mapping, and the page read into goes back. A process at its mapping
 * limit so still gets back the pages it evicted.
 */
static long map_in(struct sb_buf *buf, const struct sbi_io *io)
{
	struct sb_pool *pool = buf->pool;
	sbi_ptref kept = sbi_pte_kept(io->src_pte);
	long r;

	sbi_count(&pool->n_pages_in, 1);
	sbi_count(&pool->n_bytes_read, (uint64_t)io->res);
	/* A home page (home.c) was read into in place: map it there. A
	 * clean one is mapped by the touch that wants it (the kernel's own
	 * fault: a clean entry, which a release drops a batch at a time). */
	if (io->home && buf->home_clean)
		return (long)io->pid;
	if (io->home) {
		r = sbi_vma_continue(buf, io->idx);
		if (r == 0)
			return (long)io->pid;
		sbi_count(&pool->n_pages_in, (uint64_t)-1);
		sbi_count(&pool->n_bytes_read, -(uint64_t)io->res);
		return r;
	}
	r = sbi_vma_place(buf, io->idx, 1, io->pid, buf->flags & SBI_BUF_RO);
	if (r == 0)
		return (long)io->pid;
	if (r == -ENOMEM && !sbi_ptref_none(kept)) {
		sbi_pid k = sbi_ptref_pid(kept);

		r = sbi_vma_copy_in(buf, io->idx, sbi_pid_mem(pool, io->pid));
		if (r == -EEXIST && pool->can_minor) {
			/* The kept page's punch left a folio there (one
			 * larger than the page that could not split, the
			 * range zeroed): write the data into it through the
			 * file and map what is there. */
			r = sbi_heap_write(sbi_pid_heap(pool, k),
					   sbi_pid_index(pool, k),
					   sbi_pid_mem(pool, io->pid),
					   pool->page_size, pool->page_size);
			if (r == 0)
				r = sbi_vma_continue(buf, io->idx);
		}
		sbi_pid_unmap_pool(pool, io->pid);
		if (r == 0) {
			sbi_pool_swap_kept(pool, io->pid, k);
			return (long)k;
		}
		/* A part may be in (a page of several 4 KiB): the kept page
		 * holds no memory by the pool's count, and its entries go
		 * before the page is poisoned. */
		sbi_heap_punch(sbi_pid_heap(pool, k), sbi_pid_index(pool, k), 1,
			       pool->page_size);
	}
	sbi_count(&pool->n_pages_in, (uint64_t)-1);
	sbi_count(&pool->n_bytes_read, -(uint64_t)io->res);
	return r;
}

/*
 * The waiters of a buffer's reads in flight; buf->lock held by both sides,
 * so a fault on page idx is either noted before its completion looks (which
 * then wakes it) or serviced after the page is placed (service_missing
 * wakes it then). A UFFDIO_WAKE costs 2-3 us; most pages read in, prefetched
 * or read ahead, are placed before anything touches them.
 */
static void note_waiter(struct sb_buf *buf, size_t idx)
{
	SBI_HELD(&buf->lock);
	for (unsigned k = 0; k < buf->nwaiters; k++)
		if (buf->waiters[k] == idx)
			return;
	if (buf->nwaiters < SBI_WAITERS)
		buf->waiters[buf->nwaiters++] = idx;
	else
		buf->waiters_lost = true;
}

/* Whether a thread may wait for page idx (its read completing now). */
static bool take_waiter(struct sb_buf *buf, size_t idx)
{
	SBI_HELD(&buf->lock);
	bool r = buf->waiters_lost;

	for (unsigned k = 0; k < buf->nwaiters; k++)
		if (buf->waiters[k] == idx) {
			buf->waiters[k] = buf->waiters[--buf->nwaiters];
			r = true;
			break;
		}
	/* The last read in flight (reads start under buf->lock): no thread
	 * can be waiting for another one. */
	if (atomic_load(&buf->inflight) == 1)
		buf->waiters_lost = false;
	return r;
}

/* A page read into a read buffer (io.c): into the heap now, through the
 * file (the memfd allocates what has no memory, unzeroed: the write
 * covers it). Every way out of pagein_done that does not map the page
 * gives it back: a home page punched again, a spill page's pool page
 * freed (zeroed, or wholly overwritten, before its next use). 0 or
 * -errno. */
static int bounce_write(struct sb_pool *pool, struct sbi_io *io)
{
	size_t len = pool->page_size;
	int fail = sbi_test_failure(&bounce_fault);
	int r;

	if (fail)
		len /= 2;
	r = sbi_heap_write(sbi_pid_heap(pool, io->pid),
			   sbi_pid_index(pool, io->pid), io->bounce, len,
			   pool->page_size);
	return r < 0 ? r : fail;
}

/*
 * A clean home's page (home.c) in from its read buffer: copied into the
 * heap's copy-in window (UFFDIO_COPY), not written through the file. The
 * copy puts the page in the memfd whole and at once, in folios of 4 KiB,
 * whatever shmem_enabled says. A write (pwrite) lets the kernel allocate
 * a folio as large as the empty range around the page when shmem_enabled
 * is within_size or always (whatever the write's size, and even if it was
 * never when the buffer was opened): the evicted pages beside it would
 * then hold zeros in the memfd, which a clean home, registered MISSING
 * alone, maps without a fault. Memory there already (such a folio, from
 * before): written through the file, into it. The window's entry goes at
 * the heap's next pool-side sweep (heap.c). 0 or -errno.
 */
static int home_fill(struct sb_pool *pool, struct sbi_io *io)
{
	struct sbi_heap *h = sbi_pid_heap(pool, io->pid);
	uint32_t i = sbi_pid_index(pool, io->pid);
	size_t len = pool->page_size;
	int fail;
	int r;

	if (!h->fill)	/* (never: a clean home's heaps all have one) */
		return bounce_write(pool, io);
	fail = sbi_test_failure(&bounce_fault);
	/* (A copy is of whole 4 KiB: half a page rounds down.) */
	if (fail)
		len = len / 2 / 4096 * 4096;
	r = len ? sbi_uffd_copy(pool->uffd_sigbus,
				h->fill + ((size_t)i << pool->page_shift),
				io->bounce, len)
		: 0;
	if (r == -EEXIST)
		r = sbi_heap_write(h, i, io->bounce, len, pool->page_size);
	sbi_heap_unmap_pool(h, pool->page_size);
	return r < 0 ? r : fail;
}

/* A failed page-in: counted, and said (the first, then one line a second
 * at most: a device that fails every read, or a caller that asks for a
 * bad page again and again, must not flood the log). */
static void log_failure(struct sb_buf *buf, size_t idx, int r)
{
	struct sb_pool *pool = buf->pool;
	uint64_t n = atomic_fetch_add_explicit(&pool->n_io_errors, 1,
					       memory_order_relaxed) + 1;

	if (!sbi_log_gate(SBI_LOG_ERROR, &pool->ioerr_log_ms))
		return;
	sbi_err("page-in of page %zu of buffer %u: %s (%llu I/O error%s in "
		"this pool so far)",
		idx, buf->id,
		r == -EBADMSG	? "checksum mismatch"
		: r == -ENODATA ? "the file is shorter than when it was opened"
				: strerror(-r),
		(unsigned long long)n, n == 1 ? "" : "s");
}

static bool pagein_done(struct sbi_io *io)
{
	struct sb_buf *buf = io->buf;
	struct sb_pool *pool = buf->pool;
	struct sbi_disk *d = pool->disk;
	uint64_t *pte = &buf->pte[io->idx];
	uint32_t slot1 = sbi_pte_slot1(io->src_pte);
	sbi_ptref kept = sbi_pte_kept(io->src_pte);
	/* A home page's read is into the kept page itself. */
	bool drop_slot = slot1 != 0,
	     drop_kept = !sbi_ptref_none(kept) && !io->home;
	bool wake = false;	/* besides a waiter: a poisoned page */
	long placed;

	if (!io->checked) {
		int r;

		if (io->inject)
			io->res = io->inject;
		r = sbi_src_check(buf, io->idx, io->src_pte,
				  io->bounce ? io->bounce : io->mem,
				  io->bounce ? NULL : &io->pid, io->res);
		if (r == 0 && io->bounce)
			r = io->must_bounce ? home_fill(pool, io)
					    : bounce_write(pool, io);
		io->ok = r == 0;
		io->checked = true;
		if (io->bounce) {
			sbi_io_bounce_put(d->io, io);
		} else {
			/* Read into the pool side (the read maps it there). */
			sbi_pid_unmap_pool(pool, io->pid);
		}
		if (r < 0)
			log_failure(buf, io->idx, r);
	}
	/* A thread may hold these while it waits for one of our writes. */
	if (pthread_rwlock_tryrdlock(&pool->layout) != 0)
		return false;
	if (pthread_mutex_trylock(&buf->lock) != 0) {
		if (!io->refused) {
			io->refused = true;
			atomic_fetch_add(&buf->io_refused, 1);
		}
		pthread_rwlock_unlock(&pool->layout);
		return false;
	}
	if (io->refused)
		atomic_fetch_sub(&buf->io_refused, 1);
	sbi_pool_mark_io(pool, io->pid, false);
	if (io->home && sbi_home_cancelled(buf, io->idx)) {
		/* Released meanwhile (the entry stayed in flight, so no
		 * other read of it could start): empty again. */
		sbi_pool_evicted(pool, &io->pid, 1);
		*pte = io->src_pte;
	} else if (*pte != io->pte) {
		/* Unmapped or destroyed meanwhile: nobody wants the data,
		 * and what the entry held is ours to give back. Never a
		 * page the entry names now (a home page, home.c, placed
		 * or kept there: an unmap leaves its entry naming it). */
		bool named = (uint32_t)(*pte & SBI_PTE_PID) == kept.v;

		if (named)
			drop_kept = false;
		if (!io->home || !named)
			sbi_pool_put1(pool, io->pid);
		else if (*pte & SBI_PTE_KEEP)	/* empty again */
			sbi_pool_evicted(pool, &io->pid, 1);
	} else if (io->ok && (placed = map_in(buf, io)) >= 0) {
		sbi_pid pid = (sbi_pid)placed;

		if (pid != io->pid)	/* the kept page holds it now */
			drop_kept = false;
		*pte = sbi_pte_placed(pid);
		buf->nplaced++;
		sbi_rmap_note(buf, io->idx, pid);
		SBI_TRACE_PAGEIN(buf, io->idx);
	} else {
		/* A home page stays its buffer page's, empty again. */
		if (io->home)
			sbi_pool_evicted(pool, &io->pid, 1);
		else
			sbi_pool_put1(pool, io->pid);
		if (io->ok) {
			/* Read but not mappable (vm.max_map_count): the data
			 * stays on disk, and a sb_buf_map that asked for it
			 * gets -ENOMEM (map_failures). A touch waiting for
			 * it gets SIGBUS (the entry says so, for unmap);
			 * with no toucher the entry is left as it
			 * was, and the next touch reads it in again. */
			wake = take_waiter(buf, io->idx);
			*pte = io->src_pte | (wake ? SBI_PTE_POISON : 0);
			drop_slot = drop_kept = false;
			atomic_fetch_add(&buf->map_failures, 1);
		} else {
			/* The kept page (if any) stays, poisoned; so does
			 * the spill slot: the copy on disk may read back
			 * whole next time (a transient error), and
			 * sb_buf_map, sb_buf_prefetch(WAIT) and
			 * sb_buf_share try again (reread_failed), as they
			 * do a file's page. */
			*pte = SBI_PTE_POISON | SBI_PTE_IOERR |
			       (io->src_pte & (SBI_PTE_KEEP | SBI_PTE_PID)) |
			       SBI_PTE_SLOT(slot1);
			drop_slot = drop_kept = false;
			if (slot1 || buf->src)
				atomic_fetch_add(&buf->failed_reads, 1);
			wake = true;
		}
		if (wake) {
			sbi_count(&pool->n_sigbus, 1);
			poison(buf, io->idx,
			       (io->src_pte & SBI_PTE_KEEP) != 0);
		}
	}
	if (drop_slot)
		sbi_spill_free(d, &(uint32_t){slot1 - 1}, 1);
	if (drop_kept)
		sbi_pool_drop_evicted(pool, &(sbi_pid){sbi_ptref_pid(kept)}, 1);
	if (take_waiter(buf, io->idx) || wake)
		sbi_vma_wake(buf, io->idx);
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);
	atomic_fetch_sub(&buf->inflight, 1);	/* buf may go after this */
	sbi_io_put(d->io, io);
	sbi_disk_signal(d);
	return true;
}

void sbi_buf_let_io_in(struct sb_buf *buf)
{
	/* The completer tries again every millisecond: a few of its tries,
	 * never more (it may be refused for another reason). */
	for (int i = 0; i < 40 && atomic_load(&buf->io_refused); i++)
		usleep(100);
}

/* ---- starting page-ins ---------------------------------------------------------- */

int sbi_pagein_start(struct sb_buf *buf, size_t idx, struct sbi_io **out,
		     bool reg_held, bool ahead, bool nowait, bool first)
{
	struct sb_pool *pool = buf->pool;
	struct sbi_disk *d = pool->disk;
	uint64_t old = buf->pte[idx];
	sbi_ptref hint = idx ? sbi_pte_ref(buf->pte[idx - 1]) : SBI_NOPAGE;
	struct sbi_io *io;
	bool home = sbi_home_empty(buf, idx);
	sbi_pid pid;
	int r;

	io = sbi_io_get(d->io);
	if (!io)
		return -ENOMEM;
	/* A home page (home.c) is read into in place. */
	if (home)
		hint = sbi_ptref_of(sbi_home_pid(buf, idx));
	r = sbi_alloc(pool, buf, hint, 1, &pid,
		      (home ? SBI_ALLOC_HOME : 0) | SBI_ALLOC_PAGEIN |
			      (nowait ? SBI_ALLOC_NOWAIT : 0) |
			      (first ? SBI_ALLOC_SCATTER : 0),
		      buf, reg_held);
	if (r < 0) {
		sbi_io_put(d->io, io);
		return r;
	}
	/* Eviction of this buffer's pages (to make room) leaves this entry
	 * alone: it is not placed. */
	io->done = pagein_done;
	io->buf = buf;
	io->idx = idx;
	io->pid = pid;
	io->src_pte = old;
	io->pte = old | SBI_PTE_INFLIGHT;
	io->home = home;
	/* (A home page is named by the entry: no mark needed.) */
	if (!home)
		sbi_pool_mark_io(pool, pid, true);
	io->mem = sbi_pid_mem(pool, pid);
	/* A home page's read goes through a read buffer when one is free
	 * (io.c, sbi_io_bounce_init, says why), else straight into it; a
	 * clean one's always (home.c): it waits for a buffer. So does a
	 * spill page's: its checksum is then taken from the buffer, and the
	 * pool side gets no entries (pinned for the read, then swept). A
	 * plain file's large pages go straight in: a copy costs them more
	 * CPU than it saves (docs/design.md, "A page-in"). */
	io->may_bounce = home || sbi_pte_slot1(old);
	io->must_bounce = home && buf->home_clean;
	io->inject = ahead ? 0 : injected_failure();
	sbi_src_where(buf, idx, old, &io->fd, &io->off, &io->len);
	buf->pte[idx] = io->pte;
	atomic_fetch_add(&buf->inflight, 1);
	*out = io;
	return 0;
}

static bool wants_read(uint64_t pte)
{
	return (pte & SBI_PTE_DISK) && !(pte & SBI_PTE_INFLIGHT);
}

/* Does a fault on page i read ahead? buf->lock held. */
static bool reads_ahead(const struct sb_buf *buf, size_t i)
{
	return !buf->ra_off || !(buf->ra_off[i / 64] >> (i % 64) & 1);
}

long sbi_readahead_set(struct sb_buf *buf, size_t first, size_t end, bool on)
{
	pthread_mutex_lock(&buf->lock);
	if (!buf->ra_off && !on) {
		buf->ra_off = calloc((buf->npages + 63) / 64, sizeof(uint64_t));
		if (!buf->ra_off) {
			pthread_mutex_unlock(&buf->lock);
			return -ENOMEM;
		}
	}
	for (size_t i = first; i < end && buf->ra_off; i++) {
		if (on)
			buf->ra_off[i / 64] &= ~(1ull << (i % 64));
		else
			buf->ra_off[i / 64] |= 1ull << (i % 64);
	}
	pthread_mutex_unlock(&buf->lock);
	return (long)(end - first);
}

void sbi_pagein_fault(struct sb_buf *buf, size_t idx)
{
	struct sb_pool *pool = buf->pool;
	struct sbi_io *ios[BATCH];
	size_t n = 0, win = 1, end;
	uint64_t prev = idx ? buf->pte[idx - 1] : 0;
	bool retry = false;
	/* Sequential: the page after the last fault's, or after a page
	 * placed or being read. Never where the application said it reads
	 * at random (SB_ADVICE_RANDOM): a neighbour placed there is one it
	 * asked for, not a sign of what comes next. */
	bool seq = reads_ahead(buf, idx) &&
		   (idx == buf->ra_next ||
		    (idx && (sbi_pte_has_page(prev) ||
			     (prev & SBI_PTE_INFLIGHT))));
	/* A fault on the last fault's page again (its thread touched it
	 * once more before the read completed, or the kernel reported the
	 * fault twice, which userfaultfd allows) says nothing about the
	 * access pattern, and must leave the window as it is: counted as a
	 * random access, it reset read-ahead, and an in-order reader then
	 * read 2 pages a fault where the window should have doubled (test_file
	 * random_advice, 1 run in 300: 8 pages read for 8 touched). */
	bool again = idx + 1 == buf->ra_next;

	if (again) {
		/* win 1: the page itself, if it is not being read already */
	} else if (seq) {
		size_t lo = RA_MIN_BYTES >> pool->page_shift;
		size_t hi = RA_MAX_BYTES >> pool->page_shift;

		/* Never more than a quarter of the budget ahead (a
		 * daemon's client: of its ceiling, its lease grows). */
		size_t budget = pool->client
					? pool->ceiling_pages
					: __atomic_load_n(&pool->max_pages,
							  __ATOMIC_RELAXED);

		/* A pool of huge pages the system has run out of: what it
		 * holds is its budget. */
		if (atomic_load_explicit(&pool->hugetlb_short,
					 memory_order_relaxed)) {
			size_t held;

			pthread_mutex_lock(&pool->lock);
			held = pool->resident;
			pthread_mutex_unlock(&pool->lock);
			if (held < budget)
				budget = held;
		}
		if (budget != SIZE_MAX && hi > budget / 4)
			hi = budget / 4;
		if (lo < 1)
			lo = 1;
		if (hi < lo)
			hi = lo;
		buf->ra_win = buf->ra_win ? 2 * buf->ra_win : lo;
		if (buf->ra_win > hi)
			buf->ra_win = hi;
		win = buf->ra_win;
	} else {
		buf->ra_win = 0;
	}
	buf->ra_next = idx + 1;	/* (unchanged when again) */
	end = idx + win < buf->npages ? idx + win : buf->npages;
	for (size_t j = idx; j < end; j++) {
		int r;

		if (j != idx && !reads_ahead(buf, j))
			break;	/* read-ahead stops where it is off */
		if (!wants_read(buf->pte[j]))
			continue;
		r = sbi_pagein_start(buf, j, &ios[n], true, j != idx, j != idx,
				     j == idx);
		if (r < 0) {
			if (j == idx && r == -ENOMEM &&
			    sbi_io_busy(pool->disk->io)) {
				/* The budget is held by reads in flight
				 * (prefetches of other threads): their
				 * pages can go once placed, which may need
				 * this buffer's lock. The thread touches
				 * again, and faults anew, once woken: when
				 * one of them has finished. */
				retry = true;
			} else if (j == idx) {
				/* The touched page cannot be read in:
				 * SIGBUS, as for a zero-fill page. Its
				 * entry says so: its unmap then empties a
				 * home page in place (buf.c) or replaces
				 * the mapping, and the poison with it. */
				sbi_sigbus_note(buf, idx, r, "page-in");
				poison(buf, idx,
				       (buf->pte[idx] & SBI_PTE_KEEP) != 0);
				buf->pte[idx] |= SBI_PTE_POISON;
			}
			break;	/* readahead is best effort */
		}
		if (++n == BATCH || j == idx ||
		    n << pool->page_shift >= SUBMIT_BYTES) {
			sbi_io_submit(pool->disk->io, ios, n);
			n = 0;
		}
	}
	sbi_io_submit(pool->disk->io, ios, n);
	/* This thread sleeps until the read (ours, or one already in
	 * flight) completes: its completion must wake it, and place the
	 * page even if an unmap came meanwhile (home.c). */
	if (buf->pte[idx] & SBI_PTE_INFLIGHT) {
		sbi_home_uncancel(buf, idx);
		note_waiter(buf, idx);
	}
	else if (retry &&
		 !sbi_io_wake_later(pool->disk->io, pool->uffd,
				    (uintptr_t)buf->base +
					    (idx << pool->page_shift),
				    pool->page_size))
		sbi_vma_wake(buf, idx);
}

/* Whether page i is in one of the spans before sp[k] (named twice). */
static bool named_before(const struct sbi_span *sp, size_t k, size_t i)
{
	while (k--)
		if (i >= sp[k].first && i < sp[k].end)
			return true;
	return false;
}

/* Whether some span begins before the end of the one before it: spans
 * out of order, or naming a page twice. */
static bool spans_overlap(const struct sbi_span *sp, size_t nsp)
{
	for (size_t k = 1; k < nsp; k++)
		if (sp[k].first < sp[k - 1].end)
			return true;
	return false;
}

/* Pages of the spans in flight; whether one failed to read, and whether
 * one is still to be read in (its read could not be mapped). */
static size_t count_inflight(struct sb_buf *buf, const struct sbi_span *sp,
			     size_t nsp, bool *ioerr, bool *unread)
{
	/* A page named twice is one read: counted twice, the wait for the
	 * disk's completions would wait for one that never comes (100 ms,
	 * helper-42). */
	bool overlap = spans_overlap(sp, nsp);
	size_t n = 0;

	*ioerr = *unread = false;
	pthread_mutex_lock(&buf->lock);
	for (size_t k = 0; k < nsp; k++) {
		for (size_t i = sp[k].first; i < sp[k].end; i++) {
			n += (buf->pte[i] & SBI_PTE_INFLIGHT) &&
			     !(overlap && named_before(sp, k, i));
			*ioerr |= (buf->pte[i] & SBI_PTE_IOERR) != 0;
			*unread |= wants_read(buf->pte[i]);
		}
	}
	pthread_mutex_unlock(&buf->lock);
	return n;
}

/*
 * Page i, if its last read failed (IOERR, poisoned) and it can be read
 * again (a spill copy kept for that, or the buffer's file), is on disk
 * again, to be read by the caller: a transient error (a flaky device, a
 * read the kernel gave up on) must not lose the data, nor keep a file's
 * page failed until it is released. The poison marker goes first
 * (MADV_DONTNEED), so a touch meanwhile faults and waits for the read.
 * Without UFFDIO_POISON the page was handed to the SIGBUS uffd instead,
 * and stays poisoned. A home page (home.c) goes back to its empty state,
 * in place, as unmap_home leaves it.
 */
static void reread_failed(struct sb_buf *buf, size_t i)
{
	SBI_HELD(&buf->lock);
	uint64_t pte = buf->pte[i];

	if (!(pte & SBI_PTE_IOERR) || !(sbi_pte_slot1(pte) || buf->src) ||
	    sbi_vma_unpoison(buf, i) < 0)
		return;
	sbi_failed_read_gone(buf, pte);
	buf->pte[i] = SBI_PTE_DISK | (pte & ~(SBI_PTE_POISON | SBI_PTE_IOERR));
}

/* Pages whose reads were someone else's, in flight as a waited call
 * looked (start_reads): the call reads them again if they fail. */
struct others {
	size_t *idx;
	size_t n, cap;
	bool lost;	/* one could not be noted (no memory) */
};

static void note_other(struct others *o, size_t i)
{
	if (o->n == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 16;
		size_t *p = realloc(o->idx, cap * sizeof(*p));

		if (!p) {
			o->lost = true;
			return;
		}
		o->idx = p;
		o->cap = cap;
	}
	o->idx[o->n++] = i;
}

/* Start the read of page i if it wants one: 1 if started, 0 if not, or
 * -errno. buf->lock held. */
static int start_one(struct sb_buf *buf, size_t i, bool wait, bool first,
		     struct sbi_io **ios, size_t *n)
{
	struct sb_pool *pool = buf->pool;
	int r;

	SBI_HELD(&buf->lock);
	if (!wants_read(buf->pte[i]))
		return 0;
	r = sbi_pagein_start(buf, i, &ios[*n], true, false, !wait, first);
	if (r < 0)
		return r;
	if (++*n == BATCH || *n << pool->page_shift >= SUBMIT_BYTES) {
		sbi_io_submit(pool->disk->io, ios, *n);
		*n = 0;
	}
	return 1;
}

/*
 * Start the reads of the spans' pages that want one, in one submission (up
 * to BATCH). may_reread (a waited call, with UFFDIO_POISON): a failed page
 * is read once more (reread_failed); others (if not NULL): a page whose
 * read is in flight, someone else's, is noted there. The number of reads
 * started; *err: 0, or -errno where a read could not be started (and none
 * after it was).
 */
static long start_reads(struct sb_buf *buf, const struct sbi_span *sp,
			size_t nsp, bool wait, bool may_reread,
			struct others *others, int *err)
{
	struct sb_pool *pool = buf->pool;
	struct sbi_io *ios[BATCH];
	size_t n = 0;
	long queued = 0;
	/* Spans in order without overlap (the usual case): a page in flight
	 * as this call looks was not started by it. */
	bool reread, overlap = spans_overlap(sp, nsp);
	int r = 0;

	/* The layout lock too, as for every change of a buffer's mappings:
	 * making room may evict pages and map a shared one as a private
	 * one, and a mapping made while fork() marks the ranges would be
	 * inherited. */
	pthread_rwlock_rdlock(&pool->layout);
	pthread_rwlock_rdlock(&pool->reg_lock);
	pthread_mutex_lock(&buf->lock);
	/* Under the lock that a failed read's completion counts under: a
	 * read that failed before this point is seen here, failed. */
	reread = may_reread &&
		 atomic_load_explicit(&buf->failed_reads, memory_order_relaxed);
	for (size_t k = 0; k < nsp && r >= 0; k++) {
		for (size_t i = sp[k].first; i < sp[k].end; i++) {
			if (reread)
				reread_failed(buf, i);
			if (buf->pte[i] & SBI_PTE_INFLIGHT) {
				/* Asked for again: placed after all. */
				sbi_home_uncancel(buf, i);
				if (others &&
				    !(overlap && named_before(sp, k, i)))
					note_other(others, i);
				continue;
			}
			r = start_one(buf, i, wait, i == sp[k].first, ios, &n);
			if (r < 0)
				break;
			queued += r;
		}
	}
	sbi_io_submit(pool->disk->io, ios, n);
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->reg_lock);
	pthread_rwlock_unlock(&pool->layout);
	*err = r < 0 ? r : 0;
	return queued;
}

static void wait_spans(struct sb_buf *buf, const struct sbi_span *sp,
		       size_t nsp, bool *ioerr, bool *unread)
{
	struct sbi_disk *d = buf->pool->disk;

	for (;;) {
		uint64_t gen = sbi_disk_gen(d);
		size_t left = count_inflight(buf, sp, nsp, ioerr, unread);

		if (!left)
			break;
		sbi_disk_wait_until(d, gen + left, 100);
	}
}

long sbi_pagein_spans(struct sb_buf *buf, const struct sbi_span *sp,
		      size_t nsp, bool wait)
{
	struct sb_pool *pool = buf->pool;
	struct others others = {0};
	long queued;
	int r, r2;
	bool ioerr, unread;
	unsigned map_failures = atomic_load(&buf->map_failures);
	/* Waited for (sb_buf_map, sb_buf_prefetch with WAIT, sb_buf_share:
	 * the caller hears how it went), a failed page named is read once
	 * more. Not for advice or the ready thread: a caller that prefetches
	 * a bad page every step would read it every step. */
	bool may_reread = wait && pool->can_poison;

	/* Only a buffer with data on disk comes here, and the disk tier was
	 * set up when that data went there. */
	if (!sbi_disk_peek(pool))
		return 0;
	queued = start_reads(buf, sp, nsp, wait, may_reread,
			     may_reread ? &others : NULL, &r);
	if ((r < 0 && !queued) || !wait) {
		free(others.idx);
		return r < 0 && !queued ? r : queued;
	}
	wait_spans(buf, sp, nsp, &ioerr, &unread);
	/* A read that was someone else's (a prefetch without WAIT,
	 * read-ahead) failed while this call waited: not yet tried again
	 * for it. Once more, as for a page that had failed before: a flaky
	 * device must not fail the first waiter that names a page another
	 * read just failed on. (This call's own failed reads are not: they
	 * were its try.) */
	if (ioerr && (others.n || others.lost)) {
		struct sbi_span *sp2 = others.lost
					       ? NULL
					       : malloc(others.n * sizeof(*sp2));

		for (size_t k = 0; sp2 && k < others.n; k++)
			sp2[k] = (struct sbi_span){others.idx[k],
						   others.idx[k] + 1};
		/* Without the list (no memory), every failed page named:
		 * the call's own too, this once. */
		queued += sp2 ? start_reads(buf, sp2, others.n, true, true,
					    NULL, &r2)
			      : start_reads(buf, sp, nsp, true, true, NULL,
					    &r2);
		if (r2 < 0 && r == 0)
			r = r2;
		wait_spans(buf, sp, nsp, &ioerr, &unread);
		free(sp2);
	}
	free(others.idx);
	if (ioerr)
		return -EIO;
	/* A page read but not mapped (the mapping limit) is not placed:
	 * its entry says DISK again (one read again meanwhile was in
	 * flight above, and waited for). */
	if (unread && atomic_load(&buf->map_failures) != map_failures)
		return -ENOMEM;
	return r < 0 ? r : queued;
}

long sbi_pagein_range(struct sb_buf *buf, size_t first, size_t end,
		      bool wait)
{
	struct sbi_span sp = {first, end};

	return sbi_pagein_spans(buf, &sp, 1, wait);
}

void sbi_pagein_drain(struct sb_buf *buf)
{
	struct sbi_disk *d = buf->pool->disk;

	while (atomic_load(&buf->inflight)) {
		uint64_t gen = sbi_disk_gen(d);
		unsigned n = atomic_load(&buf->inflight);

		if (!n)
			break;
		sbi_disk_wait_until(d, gen + n, 100);
	}
}

/* ---- synchronous reads (save) ------------------------------------------------- */

int sbi_pagein_read_sync(struct sb_buf *buf, size_t idx, void *mem)
{
	struct sbi_disk *d = buf->pool->disk;
	uint64_t pte = buf->pte[idx];
	struct sbi_io_wait w;
	struct sbi_io *io = sbi_io_get(d->io);
	int r;

	if (!io)
		return -ENOMEM;
	sbi_src_where(buf, idx, pte, &io->fd, &io->off, &io->len);
	io->mem = mem;
	io->wait = &w;
	io->done = sbi_io_wait_done;
	sbi_io_wait_init(&w, 1);
	sbi_io_submit(d->io, &io, 1);
	r = sbi_io_wait(&w);
	if (r == 0)
		r = sbi_src_check(buf, idx, pte, mem, NULL, io->res);
	sbi_io_put(d->io, io);
	return r;
}
