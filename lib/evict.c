/* SPDX-License-Identifier: MIT */
/*
 * Eviction: writing placed pages to the spill file and releasing them
 * (sb_buf_evict, SB_ADVICE_DONTNEED), and doing so by itself when a map or
 * a fault needs a page and the pool is at its budget (SB_BUF_EVICTABLE
 * buffers, and file-backed buffers, whose clean pages are just dropped).
 *
 * Writing out a page, under its buffer's lock, without ever replacing its
 * mapping: replacing a mapping (mmap MAP_FIXED, then registering the new
 * range with userfaultfd) leaves a moment in which a touch gets a private
 * zero page from the kernel, a wrong read or a lost write, which unmap may
 * allow but eviction may not. Instead:
 *   1. register the page's mapping (the heap page) with the pool's uffd,
 *      MISSING and WP, and write-protect it: a writer now waits, on the
 *      handler, for the buffer's lock; readers go on reading the data;
 *   2. checksum the page and write it from the heaps' own mapping (a batch
 *      per submission);
 *   3. on success punch the heap page: its memory goes back, the buffer
 *      still maps the (empty) page, which stays reserved (EVICTED), and the
 *      entry becomes DISK | KEEP | pid + 1 | slot + 1. The next touch is a
 *      MISSING fault (or a MINOR one, where the punch left part of a huge
 *      folio in place, zeroed: docs/design.md, "Heap folios"): the page-in
 *      reads into a new pool page and maps it over this one, complete, so
 *      its window only ever shows the data.
 *      On failure (ENOSPC, EIO) the protection is lifted: the data never
 *      leaves memory unless it is safely on disk.
 * A file's clean pages skip the write. A shared page is first given a
 * private copy (its other holders keep theirs).
 *
 * The policy is CLOCK (second chance) over the pool's pages. What the
 * runtime sees, it uses: a page placed, read in, or named by sb_buf_map /
 * sb_buf_prefetch gets its reference bit; the clock hand clears it on its
 * first pass and takes the page on the second. Application advice sets
 * the bit directly: COLD pages go first, HOT ones only when nothing else
 * is left. The kernel does not tell user space cheaply which mapped pages
 * were touched (pagemap has no accessed bit; idle page tracking needs
 * CONFIG_IDLE_PAGE_TRACKING and PFNs), so a page in use that the runtime
 * never hears of again looks as cold as one nobody uses: advice is how an
 * application says otherwise. Shared pages (copy-on-write) are not taken
 * automatically: evicting one holder's view would release nothing.
 */
#include "internal.h"
#include "trace.h"

#include "uffd_compat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define BATCH 64
#define MAX_CAND 256

static bool tracked(const struct sb_buf *buf)
{
	return buf->flags & (SB_BUF_EVICTABLE | SBI_BUF_RO);
}

void sbi_rmap_note(struct sb_buf *buf, size_t idx, sbi_pid pid)
{
	struct sb_pool *pool = buf->pool;
	struct sbi_heap *h;
	uint32_t i;

	if (!tracked(buf))
		return;
	h = sbi_pid_heap(pool, pid);
	i = sbi_pid_index(pool, pid);
	__atomic_store_n(&h->raddr[i],
			 (uintptr_t)buf->base + (idx << pool->page_shift),
			 __ATOMIC_RELAXED);
	__atomic_store_n(&h->rbit[i], SBI_RBIT_REF, __ATOMIC_RELAXED);
}

/* ---- writing pages out ----------------------------------------------------- */

/* The end of the run of consecutive pages that starts at idx[k]. */
static size_t run_end(const size_t *idx, size_t n, size_t k)
{
	size_t j = k + 1;

	while (j < n && idx[j] == idx[j - 1] + 1)
		j++;
	return j;
}

/* Step 1 for pages idx[0..n) (ascending, placed, private), in runs. */
static int freeze(struct sb_buf *buf, const size_t *idx, size_t n)
{
	struct sb_pool *pool = buf->pool;
	bool ro = buf->flags & SBI_BUF_RO;

	for (size_t k = 0; k < n;) {
		size_t j = run_end(idx, n, k);
		char *addr = buf->base + (idx[k] << pool->page_shift);
		size_t len = (j - k) << pool->page_shift;
		int r;

		/* MINOR too wherever the kernel has it, recycling or not:
		 * a punch inside a folio larger than the page (huge
		 * folios: shmem_enabled, an application's MADV_COLLAPSE)
		 * that the kernel cannot split zeroes the range and leaves
		 * it present, and only a minor fault then catches the
		 * touch; missing alone would let the page read as zeros. */
		r = sbi_uffd_register(pool->uffd, addr, len,
				      UFFDIO_REGISTER_MODE_MISSING |
					      (pool->can_minor
						       ? UFFDIO_REGISTER_MODE_MINOR
						       : 0) |
					      (ro ? 0 : UFFDIO_REGISTER_MODE_WP));
		if (r == 0 && !ro)
			r = sbi_uffd_wp(pool->uffd, addr, len, true);
		if (r < 0) {
			for (size_t t = 0; t < k; t++)
				if (!ro)
					sbi_uffd_wp(pool->uffd,
						    buf->base + (idx[t] <<
								 pool->page_shift),
						    pool->page_size, false);
			return r;
		}
		k = j;
	}
	return 0;
}

/* The one site of the evict probe (perf adds one event per name). */
static __attribute__((noinline)) void trace_evict(struct sb_buf *buf,
						  size_t i)
{
	SBI_TRACE_EVICT(buf, i);
}

/* Step 3: the pages are on disk (or clean): release their memory. */
static void release(struct sb_buf *buf, const size_t *idx, size_t n,
		    const uint32_t *slots)
{
	struct sb_pool *pool = buf->pool;
	sbi_pid pids[BATCH];

	for (size_t k = 0; k < n; k++) {
		pids[k] = sbi_pte_page(buf->pte[idx[k]]);
		/* Recycled: the entry keeps the mapping, not the page. */
		if (idx[k] >= buf->disk_hi)
			buf->disk_hi = idx[k] + 1;
		buf->pte[idx[k]] = SBI_PTE_DISK | SBI_PTE_KEEP |
				   (pool->can_recycle ? 0
						      : sbi_pte_placed(pids[k])) |
				   SBI_PTE_SLOT(slots ? slots[k] + 1 : 0);
		trace_evict(buf, idx[k]);
	}
	if (pool->can_recycle) {
		/* Clear the page-table entries: a touch now finds the page
		 * in the memfd but not mapped, a minor fault, and waits for
		 * the buffer's lock. Then the page is free, its contents
		 * left as they are: the next page-in overwrites them. */
		for (size_t k = 0, j; k < n; k = j) {
			j = run_end(idx, n, k);
			sbi_vma_drop_ptes(buf, idx[k], j - k);
		}
		sbi_ptref refs[BATCH];

		for (size_t k = 0; k < n; k++)
			refs[k] = sbi_ptref_of(pids[k]);
		sbi_pool_put(pool, refs, n);
	} else {
		/* Touches fault from here on (missing) and wait for the
		 * buffer lock. */
		sbi_pool_evicted(pool, pids, n);
	}
	buf->nplaced -= n;
	atomic_store(&buf->disk_used, true);
}

/* A shared page (or one mapped for sharing) gets a private copy first,
 * through the heaps' mappings; its other holders keep the old page. If
 * they have all let go, the page itself is mapped as a private one (as the
 * copy-on-write fault does then): no copy, no page needed. */
static int make_private(struct sb_buf *buf, size_t idx)
{
	struct sb_pool *pool = buf->pool;
	uint64_t pte = buf->pte[idx];
	sbi_pid old = sbi_pte_page(pte), pid;
	int r;

	if (sbi_pool_refs(pool, old) == 1) {
		r = sbi_vma_place(buf, idx, 1, old, buf->flags & SBI_BUF_RO);
		if (r == 0)
			buf->pte[idx] = sbi_pte_placed(old);
		return r;
	}

	r = sbi_pool_alloc(pool, buf, SBI_NOPAGE, 1, &pid,
			   SBI_ALLOC_OVERWRITE);
	if (r < 0)
		return r;
	memcpy(sbi_pid_mem(pool, pid), sbi_pid_mem(pool, old),
	       pool->page_size);
	sbi_pid_unmap_pool(pool, pid);
	sbi_pid_unmap_pool(pool, old);
	/* The new mapping shows the same bytes: a touch meanwhile reads
	 * them, and a write (the old one was write-protected) lands in the
	 * copy, before the protection of step 1. */
	r = sbi_vma_place(buf, idx, 1, pid, buf->flags & SBI_BUF_RO);
	if (r < 0) {
		sbi_pool_put1(pool, pid);
		return r;
	}
	buf->pte[idx] = sbi_pte_placed(pid);
	sbi_pool_put1(pool, old);
	return 0;
}

/* Drop clean pages (a file's): their data is still in the file. Home
 * pages (home.c) are emptied in place. */
static long drop_pages(struct sb_buf *buf, const size_t *idx, size_t n)
{
	struct sb_pool *pool = buf->pool;
	size_t home[BATCH], other[BATCH], nh = 0, no = 0;
	int r;

	for (size_t k = 0; k < n; k++) {
		if (sbi_home_placed(buf, idx[k]))
			home[nh++] = idx[k];
		else
			other[no++] = idx[k];
	}
	if (nh) {
		sbi_home_release(buf, home, nh);
		for (size_t k = 0; k < nh; k++)
			trace_evict(buf, home[k]);
	}
	if (no) {
		r = freeze(buf, other, no);
		if (r < 0) {
			/* They stay: back on the clock (the caller puts
			 * back only what a whole failure kept). */
			if (nh)
				for (size_t k = 0; k < no; k++)
					sbi_rmap_note(buf, other[k],
						      sbi_pte_page(
							      buf->pte[other[k]]));
			sbi_count(&pool->n_dropped, nh);
			return nh ? (long)nh : r;
		}
		release(buf, other, no, NULL);
	}
	sbi_count(&pool->n_dropped, n);
	return (long)n;
}

/* Test hook: the next count write-outs fail with -err, their data
 * written or not. */
static struct sbi_test_fault write_fault;

void sbi_test_evict_fail(int err, unsigned count);
void sbi_test_evict_fail(int err, unsigned count)
{
	sbi_test_arm(&write_fault, err, count);
}

/* Write pages idx[0..n) (n <= BATCH, placed, private) to spill slots and
 * release them. All or nothing. *reclaimed: on -ENOSPC, the slots freed
 * earlier whose blocks this gave back; then, if first, the caller tries
 * again and the failure is not reported here. */
static long write_once(struct sb_buf *buf, const size_t *idx, size_t n,
		       bool first, size_t *reclaimed)
{
	struct sb_pool *pool = buf->pool;
	struct sbi_disk *d;
	uint32_t slots[BATCH];
	uint64_t kept[(BATCH + 63) / 64];
	struct sbi_io *ios[BATCH];
	struct sbi_io_wait w;
	size_t nio = 0;
	int r = 0;

	/* Set up by an application thread: this may be the fault path. */
	d = sbi_disk_peek(pool);
	if (!d)
		return -EIO;
	r = sbi_spill_alloc(d, n, slots, kept);
	if (r < 0)
		return r;
	r = freeze(buf, idx, n);
	if (r < 0) {
		sbi_spill_free(d, slots, n);
		return r;
	}
	r = sbi_spill_prealloc(d, slots, kept, n);
	if (r < 0)
		goto failed;
	sbi_io_wait_init(&w, n);
	for (size_t k = 0; k < n; k++) {
		struct sbi_io *io = sbi_io_get(d->io);
		sbi_pid pid = sbi_pte_page(buf->pte[idx[k]]);
		uint32_t crc;

		if (!io) {
			r = -ENOMEM;
			break;
		}
		io->write = true;
		io->fd = d->spill_fd;
		io->off = sbi_spill_off(d, slots[k]);
		io->mem = sbi_pid_mem(pool, pid);
		io->len = pool->page_size;
		io->wait = &w;
		io->done = sbi_io_wait_done;
		/* Write-protected: the bytes cannot change under us. Read
		 * through the heap's file, not the pool side (heap.c). */
		r = sbi_disk_page_crc(d, pid, io->len, &crc);
		if (r < 0) {
			sbi_io_put(d->io, io);
			break;
		}
		sbi_spill_set_crc(d, slots[k], crc);
		ios[nio++] = io;
	}
	if (r < 0) {
		/* Not one was submitted. */
		for (size_t k = 0; k < nio; k++)
			sbi_io_put(d->io, ios[k]);
		pthread_mutex_destroy(&w.lock);
		pthread_cond_destroy(&w.cond);
	} else {
		sbi_io_submit(d->io, ios, nio);
		r = sbi_io_wait(&w);
		if (r == 0)
			r = sbi_test_failure(&write_fault);
		for (size_t k = 0; k < nio; k++)
			sbi_io_put(d->io, ios[k]);
	}
	/* Written from the pool side (the write maps it there). */
	for (size_t k = 0; k < nio; k++)
		sbi_pid_unmap_pool(pool, sbi_pte_page(buf->pte[idx[k]]));
failed:
	if (r < 0) {
		/* Lift the protection (waking blocked writers): the pages
		 * stay as they were. */
		for (size_t k = 0; k < n; k++)
			sbi_uffd_wp(pool->uffd,
				    buf->base + (idx[k] << pool->page_shift),
				    pool->page_size, false);
		/* A full file system: the blocks of slots freed earlier and
		 * not yet punched (spill.c) go back now, and so do those
		 * this batch took before it failed. */
		if (r == -ENOSPC)
			*reclaimed = sbi_spill_punch_now(d);
		sbi_spill_free(d, slots, n);
		if (r == -ENOSPC)
			sbi_spill_punch_now(d);
		else
			sbi_count(&pool->n_io_errors, 1);
		/* (The first, then one line a second at most: a full or
		 * failing disk under steady eviction says so, and how
		 * often, without a line a try.) */
		if (!(r == -ENOSPC && first && *reclaimed)) {
			uint64_t k = atomic_fetch_add_explicit(
					     &pool->n_evict_failures, 1,
					     memory_order_relaxed) +
				     1;

			if (sbi_log_gate(SBI_LOG_WARN, &pool->evict_log_ms))
				sbi_warn("eviction of %zu pages of buffer %u: "
					 "%s; kept in memory (%llu failed "
					 "eviction%s in this pool so far)",
					 n, buf->id, strerror(-r),
					 (unsigned long long)k,
					 k == 1 ? "" : "s");
		}
		return r;
	}
	release(buf, idx, n, slots);
	sbi_count(&pool->n_pages_out, n);
	sbi_count(&pool->n_bytes_written, n * pool->page_size);
	return (long)n;
}

static long write_pages(struct sb_buf *buf, const size_t *idx, size_t n)
{
	size_t reclaimed = 0;
	long r = write_once(buf, idx, n, true, &reclaimed);

	/* Once more if room was made: freed slots held blocks. */
	if (r == -ENOSPC && reclaimed)
		r = write_once(buf, idx, n, false, &reclaimed);
	return r;
}

static long evict_pages(struct sb_buf *buf, const size_t *idx, size_t n)
{
	return buf->flags & SBI_BUF_RO ? drop_pages(buf, idx, n)
				       : write_pages(buf, idx, n);
}

long sbi_evict_locked(struct sb_buf *buf, size_t first, size_t end)
{
	SBI_HELD(&buf->lock);
	size_t idx[BATCH], n = 0;
	long done = 0, r;

	for (size_t i = first; i < end; i++) {
		uint64_t pte = buf->pte[i];

		if (!sbi_pte_has_page(pte))
			continue;
		/* A page of sparsebufd's cache (import.c) is the daemon's:
		 * it counts in the machine's budget, not this pool's, and
		 * nothing is freed here by writing a copy of it to disk. */
		if (sbi_pid_heap(buf->pool, sbi_pte_page(pte))->foreign)
			continue;
		if ((pte & (SBI_PTE_SHARED | SBI_PTE_PRIVMAP |
			    SBI_PTE_WPFAIL)) &&
		    make_private(buf, i) < 0)
			continue;	/* no page for the copy: stays */
		idx[n++] = i;
		if (n == BATCH || i + 1 == end) {
			r = evict_pages(buf, idx, n);
			if (r < 0)
				return done ? done : r;
			done += r;
			n = 0;
		}
	}
	if (n) {
		r = evict_pages(buf, idx, n);
		if (r < 0)
			return done ? done : r;
		done += r;
	}
	return done;
}

/* ---- the clock ---------------------------------------------------------------- */

struct cand {
	uintptr_t addr;
	sbi_pid pid;
};

/* By address, in place: qsort may malloc (glibc does above 1 KiB), and
 * this runs on the fault path. Shell sort: at most MAX_CAND entries. */
static void sort_cands(struct cand *c, size_t n)
{
	static const size_t gaps[] = {57, 23, 10, 4, 1};

	for (size_t g = 0; g < sizeof(gaps) / sizeof(gaps[0]); g++) {
		size_t gap = gaps[g];

		for (size_t i = gap; i < n; i++) {
			struct cand t = c[i];
			size_t j = i;

			for (; j >= gap && c[j - gap].addr > t.addr; j -= gap)
				c[j] = c[j - gap];
			c[j] = t;
		}
	}
}

/* Up to want pages the clock would take; pool->lock held. Each is taken
 * off the clock (and counted in pool->evicting) until its eviction is
 * done or given up. */
static size_t pick(struct sb_pool *pool, struct cand *c, size_t want)
{
	SBI_HELD(&pool->lock);
	size_t total = (size_t)pool->heap_hi * pool->pages_per_heap, got = 0;

	for (size_t step = 0; step < 3 * total && got < want; step++) {
		size_t p = pool->clock_hand++ % total;
		struct sbi_heap *h = pool->heaps[p / pool->pages_per_heap];
		uint32_t i = (uint32_t)(p % pool->pages_per_heap);
		uintptr_t addr;
		uint8_t bit;

		if (!h || h->state[i] != SBI_PG_USED || h->refs[i] != 1)
			continue;
		addr = __atomic_load_n(&h->raddr[i], __ATOMIC_RELAXED);
		if (!addr)
			continue;
		bit = __atomic_load_n(&h->rbit[i], __ATOMIC_RELAXED);
		if (bit == SBI_RBIT_HOT && step < 2 * total)
			continue;	/* only when nothing else is left */
		if (bit == SBI_RBIT_REF) {
			__atomic_store_n(&h->rbit[i], SBI_RBIT_COLD,
					 __ATOMIC_RELAXED);
			continue;	/* second chance */
		}
		/* Off the clock while it is being evicted: the hand may come
		 * round again in this same call. */
		__atomic_store_n(&h->raddr[i], 0, __ATOMIC_RELAXED);
		c[got++] = (struct cand){addr, (sbi_pid)p};
	}
	pool->evicting += got;
	return got;
}

/* Candidates [k, j) are done with (evicted, kept, or given back). */
static void picked_done(struct sb_pool *pool, size_t n)
{
	pthread_mutex_lock(&pool->lock);
	pool->evicting -= n;
	pthread_mutex_unlock(&pool->lock);
}

/* Evict pages idx[0..m) of buf (locked); pages that stay (a failed write)
 * go back on the clock. Returns how many went; *failed is set when the
 * write failed (a full spill disk): retrying would fail again. */
static size_t evict_or_keep(struct sb_buf *buf, const size_t *idx, size_t m,
			    bool *failed)
{
	long r = evict_pages(buf, idx, m);

	if (r > 0)
		return (size_t)r;
	*failed = true;
	for (size_t k = 0; k < m; k++)
		if (sbi_pte_has_page(buf->pte[idx[k]]))
			sbi_rmap_note(buf, idx[k],
				      sbi_pte_page(buf->pte[idx[k]]));
	return 0;
}

/* Candidates [k, j) of a buffer we could not lock: back on the clock. */
static void unpick(struct sb_pool *pool, const struct cand *c, size_t k,
		   size_t j)
{
	/* Under the pool's lock, and only for a page still held as it was
	 * picked: without its buffer's lock, the page may have been freed
	 * since, and its heap trimmed away (the slot empty, or another
	 * heap's: helper-52). A page let go meanwhile is noted again by
	 * its next placement. */
	pthread_mutex_lock(&pool->lock);
	for (; k < j; k++) {
		uint32_t slot = c[k].pid / pool->pages_per_heap;
		struct sbi_heap *h =
			slot < pool->heap_hi ? pool->heaps[slot] : NULL;
		uint32_t i = sbi_pid_index(pool, c[k].pid);

		if (h && h->state[i] == SBI_PG_USED && h->refs[i] == 1 &&
		    !__atomic_load_n(&h->raddr[i], __ATOMIC_RELAXED))
			__atomic_store_n(&h->raddr[i], c[k].addr,
					 __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&pool->lock);
}

/*
 * Lock a candidate's buffer. A thread that holds no buffer lock (a map)
 * may wait for it: whoever holds a buffer lock waits only for the disk or
 * retries. One that holds a buffer lock (a fault or a page-in being
 * served) only tries: two such threads, each wanting the other's pages,
 * would otherwise wait for each other forever. A busy buffer's candidates
 * go back on the clock, and the allocation tries again (sbi_alloc,
 * alloc.c).
 */
static bool lock_cand_buf(struct sb_buf *buf, struct sb_buf *held)
{
	if (buf == held)
		return true;
	if (pthread_mutex_trylock(&buf->lock) == 0)
		return true;
	if (held)
		return false;
	pthread_mutex_lock(&buf->lock);
	return true;
}

void sbi_evict_cold(struct sb_pool *pool, size_t want, struct sb_buf *held,
		    bool reg_held, struct sbi_evict_round *rd)
{
	/* Eviction changes mappings (make_private) and registrations:
	 * never while fork() marks the buffers (process.c). */
	SBI_HELD(&pool->layout);
	struct cand c[MAX_CAND];
	size_t n;

	if (want > MAX_CAND)
		want = MAX_CAND;
	pthread_mutex_lock(&pool->lock);
	n = pick(pool, c, want);
	pthread_mutex_unlock(&pool->lock);
	rd->picked = n;
	if (!n)
		return;
	sort_cands(c, n);
	if (!reg_held)
		pthread_rwlock_rdlock(&pool->reg_lock);
	for (size_t k = 0; k < n;) {
		struct sb_buf *buf = sbi_pool_lookup(pool, c[k].addr);
		size_t idx[BATCH], m = 0, j = k, k0 = k;

		/* The candidates of one buffer, together. */
		while (j < n && buf && c[j].addr < (uintptr_t)buf->base +
							   buf->length)
			j++;
		if (!buf || !tracked(buf)) {
			k = j > k ? j : k + 1;
			picked_done(pool, k - k0);
			continue;
		}
		/* A buffer being shared from keeps its pages, except to its
		 * own page-ins (the share's reads among them). */
		if ((buf != held && atomic_load(&buf->sharing)) ||
		    !lock_cand_buf(buf, held)) {
			unpick(pool, c, k, j);
			rd->busy += j - k;
			k = j;
			picked_done(pool, k - k0);
			continue;
		}
		for (; k < j; k++) {
			size_t i = (c[k].addr - (uintptr_t)buf->base) >>
				   pool->page_shift;

			/* Still that page, placed here? (The clock took it
			 * only if it has one holder: a page shared in or
			 * out whose other holders let go is mapped as a
			 * private one first.) */
			if (!sbi_pte_has_page(buf->pte[i]) ||
			    sbi_pte_page(buf->pte[i]) != c[k].pid ||
			    (buf->pte[i] & SBI_PTE_INFLIGHT))
				continue;
			/* The ready thread reads it (touch.c): later. If
			 * we hold its buffer's lock, that read may wait for
			 * us: a page whose entries the kernel dropped (a
			 * failed write-out left it registered for minor
			 * faults) faults to a handler, which needs this
			 * lock. Map it again and wake the reader, as that
			 * handler would: else both wait until our stall
			 * limit (alloc.c), and this allocation fails. Not
			 * a page write-protected for copy-on-write (its
			 * mapping is registered for that alone, and the
			 * kernel answers a read there itself): the
			 * continue would map it writable over the kernel's
			 * write-protect marker, and a later share would
			 * trust a protection that is gone. */
			if (__atomic_load_n(&pool->touch_addr,
					    __ATOMIC_ACQUIRE) == c[k].addr) {
				if (buf == held && pool->can_minor &&
				    !(buf->pte[i] &
				      (SBI_PTE_SHARED | SBI_PTE_PRIVMAP |
				       SBI_PTE_WPFAIL)) &&
				    sbi_vma_continue(buf, i) == 0)
					sbi_vma_wake(buf, i);
				sbi_rmap_note(buf, i, c[k].pid);
				rd->busy++;
				continue;
			}
			if ((buf->pte[i] & (SBI_PTE_SHARED | SBI_PTE_PRIVMAP |
					    SBI_PTE_WPFAIL)) &&
			    make_private(buf, i) < 0)
				continue;
			idx[m++] = i;
			if (m == BATCH) {
				rd->done += evict_or_keep(buf, idx, m,
							  &rd->failed);
				m = 0;
			}
		}
		if (m)
			rd->done += evict_or_keep(buf, idx, m, &rd->failed);
		if (buf != held)
			pthread_mutex_unlock(&buf->lock);
		picked_done(pool, k - k0);
	}
	if (!reg_held)
		pthread_rwlock_unlock(&pool->reg_lock);
}

/*
 * Pages shared between buffers are off the clock (evicting one holder's
 * view releases nothing), and the clock remembers one address per page.
 * When the other holders let go (a forked session ends, a source is
 * unmapped), the page is one buffer's alone but the clock does not know
 * where. Before an allocation gives up, look for such pages in the ranges
 * of evictable buffers that were ever shared (shared_hi) and put them on
 * the clock under their holder's address. Returns how many.
 */
size_t sbi_evict_renote(struct sb_pool *pool, struct sb_buf *held,
			bool reg_held)
{
	size_t found = 0;

	if (!reg_held)
		pthread_rwlock_rdlock(&pool->reg_lock);
	for (size_t b = 0; b < pool->nreg; b++) {
		struct sb_buf *buf = pool->reg[b].buf;

		if (!tracked(buf) || !buf->shared_hi)
			continue;
		if (buf != held && !lock_cand_buf(buf, held))
			continue;
		for (size_t i = 0; i < buf->shared_hi && i < buf->npages; i++) {
			uint64_t pte = buf->pte[i];
			sbi_pid p = sbi_pte_page(pte);

			if (!sbi_pte_has_page(pte) ||
			    (pte & SBI_PTE_INFLIGHT) ||
			    !(pte & (SBI_PTE_SHARED | SBI_PTE_PRIVMAP |
				     SBI_PTE_WPFAIL)))
				continue;
			if (sbi_pool_refs(pool, p) != 1)
				continue;
			sbi_rmap_note(buf, i, p);
			found++;
		}
		if (buf != held)
			pthread_mutex_unlock(&buf->lock);
	}
	if (!reg_held)
		pthread_rwlock_unlock(&pool->reg_lock);
	return found;
}

size_t sbi_evict_some(struct sb_pool *pool, size_t want)
{
	size_t done = 0;

	for (int round = 0; done < want && round < 64; round++) {
		struct sbi_evict_round rd = {0};

		if (!atomic_load(&pool->n_evictable))
			break;
		/* The layout lock, as every other eviction has it (a fault's,
		 * a placement's): a page mapped private here while fork()
		 * marked the buffers would be the child's too. (The lease
		 * thread's reclaims, sparsebufd's clients only, evicted
		 * without it: helper-52.) */
		pthread_rwlock_rdlock(&pool->layout);
		sbi_evict_cold(pool, want - done, NULL, false, &rd);
		pthread_rwlock_unlock(&pool->layout);
		done += rd.done;
		if (!rd.done && (rd.failed || !rd.busy))
			break;
		if (!rd.done)
			usleep(200);
	}
	return done;
}
