/* SPDX-License-Identifier: MIT */
/*
 * Sparse buffers: a reserved, page-aligned range of address space with a
 * page table saying which pool page backs each buffer page. Explicit
 * placement (map), release (unmap) and sharing live here; demand placement
 * and copy-on-write live in fault.c. The page table and every change of the
 * range's mappings are protected by buf->lock.
 */
#include "internal.h"
#include "trace.h"
#include "tsan.h"
#include "uffd_compat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>



static bool disk_used(struct sb_buf *buf)
{
	return buf->src || atomic_load_explicit(&buf->disk_used,
						memory_order_relaxed);
}

/* ---- registry -------------------------------------------------------------- */

static int reg_insert(struct sb_pool *pool, struct sb_buf *buf)
{
	size_t i;

	if (pool->nreg == pool->reg_cap) {
		size_t cap = pool->reg_cap ? 2 * pool->reg_cap : 16;
		struct sbi_reg *r = realloc(pool->reg, cap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		pool->reg = r;
		pool->reg_cap = cap;
	}
	for (i = pool->nreg; i > 0 && pool->reg[i - 1].start >
					      (uintptr_t)buf->base; i--)
		pool->reg[i] = pool->reg[i - 1];
	pool->reg[i] = (struct sbi_reg){(uintptr_t)buf->base,
					(uintptr_t)buf->base + buf->length,
					buf};
	pool->nreg++;
	/* Ids are never 0 and unique among live buffers (run earmarks). */
	do {
		buf->id = pool->next_buf_id++;
	} while (!buf->id);
	SBI_LK_RANK(&buf->lock, SBI_RANK_BUF, buf->id);
	return 0;
}

static void reg_remove(struct sb_pool *pool, struct sb_buf *buf)
{
	for (size_t i = 0; i < pool->nreg; i++) {
		if (pool->reg[i].buf == buf) {
			memmove(&pool->reg[i], &pool->reg[i + 1],
				(pool->nreg - i - 1) * sizeof(pool->reg[0]));
			pool->nreg--;
			return;
		}
	}
}

/* ---- create / destroy ------------------------------------------------------- */

static struct sb_buf *fail(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

#define PMD_BYTES ((size_t)2 << 20)

/*
 * Reserve len bytes aligned to align (a power of two >= 4 KiB), between two
 * guard pages. A release maps fresh anonymous memory over a page and then
 * registers it; at a buffer's edge that memory would merge with a
 * neighbour of the same kind (an application's mapping, another buffer's
 * page being released), and at vm.max_map_count the registration, which
 * must split the merged mapping again, would fail and leave the page
 * unregistered: zeros, outside the budget (an adversarial test,
 * 2026-11-29). A guard is a page of shared anonymous memory, an object of
 * its own that merges with nothing, never accessible.
 */
static char *reserve(size_t len, size_t align, int prot)
{
	int guard = MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED;
	char *p, *aligned, *end;
	size_t slack;

	/* A range of 2 MiB or more starts on a 2 MiB boundary, as the
	 * kernel would place it without the guards: heap folios of that
	 * size can then be mapped whole (PMD) into it. */
	if (len >= PMD_BYTES && align < PMD_BYTES)
		align = PMD_BYTES;
	slack = align - 4096 + 2 * SBI_GUARD;

	if (len > SIZE_MAX - slack)
		return NULL;
	SBI_MAP_BEGIN();	/* a terabyte of shadow to reset, not write */
	p = mmap(NULL, len + slack, prot,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	SBI_MAP_END();
	if (p == MAP_FAILED)
		return NULL;
	aligned = (char *)(((uintptr_t)p + SBI_GUARD + align - 1) &
			   ~(uintptr_t)(align - 1));
	end = aligned + len + SBI_GUARD;
	if (mmap(aligned - SBI_GUARD, SBI_GUARD, PROT_NONE, guard, -1, 0) ==
		    MAP_FAILED ||
	    mmap(aligned + len, SBI_GUARD, PROT_NONE, guard, -1, 0) ==
		    MAP_FAILED) {
		munmap(p, len + slack);
		return NULL;
	}
	if (aligned - SBI_GUARD > p)
		munmap(p, (size_t)(aligned - SBI_GUARD - p));
	if (p + len + slack > end)
		munmap(end, (size_t)(p + len + slack - end));
	return aligned;
}

/* A buffer's range given back, guards and all. */
static void unreserve(char *base, size_t len)
{
	munmap(base - SBI_GUARD, len + 2 * SBI_GUARD);
}

/*
 * Whether mlockall(MCL_FUTURE) is in effect: the kernel then locks every
 * new mapping and (without MCL_ONFAULT) populates it as it is made, before
 * userfaultfd could see a fault, so a sparse range would hand out zero
 * pages or all its memory at once, and MADV_DONTNEED, which releases
 * pages, refuses locked ranges. A locked probe page says so (EINVAL).
 */
static bool mlock_future(void)
{
	void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	bool locked;

	/* EAGAIN: locked, and RLIMIT_MEMLOCK used up. */
	if (p == MAP_FAILED)
		return errno == EAGAIN;
	locked = madvise(p, 4096, MADV_DONTNEED) < 0 && errno == EINVAL;
	munmap(p, 4096);
	return locked;
}

struct sb_buf *sbi_buf_create(struct sb_pool *pool, size_t length,
			      unsigned flags, struct sbi_src *src, int *err)
{
	struct sb_buf *buf;
	size_t len;
	int r;

	if (!pool || !length)
		return fail(err, -EINVAL);
	/* Eviction write-protects pages while it writes them out. */
	if ((flags & SB_BUF_EVICTABLE) && !(flags & SBI_BUF_RO) &&
	    !pool->can_wp)
		return fail(err, -EOPNOTSUPP);
	if ((r = sbi_pool_check(pool)) < 0)
		return fail(err, r);
	if (length > SIZE_MAX - (pool->page_size - 1))
		return fail(err, -ENOMEM);
	if (mlock_future()) {
		sbi_err("no sparse buffer while mlockall(MCL_FUTURE) is in "
			"effect: the kernel would fill and lock it as it is "
			"made; lock other memory with mlock() instead");
		return fail(err, -EOPNOTSUPP);
	}
	/* Its pages may go to disk from a fault: the disk tier (threads,
	 * memory) is set up now, on this application thread. */
	if ((flags & SB_BUF_EVICTABLE) && !sbi_disk_get(pool, &r))
		return fail(err, r);
	len = (length + pool->page_size - 1) & ~(pool->page_size - 1);
	buf = calloc(1, sizeof(*buf));
	if (!buf)
		return fail(err, -ENOMEM);
	buf->pool = pool;
	buf->length = len;
	buf->npages = len >> pool->page_shift;
	buf->flags = flags;
	buf->src = src;
	pthread_mutex_init(&buf->lock, NULL);
	buf->pte = sbi_meta_alloc(buf->npages * sizeof(*buf->pte), false);
	if (!buf->pte) {
		r = -ENOMEM;
		goto out_free;
	}
	pthread_rwlock_rdlock(&pool->layout);
	buf->base = reserve(len, pool->page_size,
			    flags & SBI_BUF_RO ? PROT_READ
					       : PROT_READ | PROT_WRITE);
	if (!buf->base) {
		r = -ENOMEM;
		goto out_unlock;
	}
	r = sbi_uffd_register(flags & SB_BUF_STRICT ? pool->uffd_sigbus
						    : pool->uffd,
			      buf->base, len, UFFDIO_REGISTER_MODE_MISSING);
	if (r < 0) {
		sbi_err("cannot register a buffer of %zu bytes: %s", len,
			strerror(-r));
		goto out_unmap;
	}
	pthread_rwlock_wrlock(&pool->reg_lock);
	r = reg_insert(pool, buf);
	pthread_rwlock_unlock(&pool->reg_lock);
	if (r < 0)
		goto out_unmap;
	pthread_rwlock_unlock(&pool->layout);
	if (flags & (SB_BUF_EVICTABLE | SBI_BUF_RO))
		atomic_fetch_add(&pool->n_evictable, 1);
	return buf;
out_unmap:
	unreserve(buf->base, len);
out_unlock:
	pthread_rwlock_unlock(&pool->layout);
out_free:
	sbi_meta_free(buf->pte, buf->npages * sizeof(*buf->pte));
	pthread_mutex_destroy(&buf->lock);
	free(buf);
	return fail(err, r);
}

SB_API struct sb_buf *sb_buf_create(struct sb_pool *pool, size_t length,
				    unsigned flags, int *err)
{
	if (flags & ~(SB_BUF_STRICT | SB_BUF_EVICTABLE | SB_BUF_GROWS))
		return fail(err, -EINVAL);
	if ((flags & SB_BUF_GROWS) && (flags & ~SB_BUF_GROWS))
		return fail(err, -EINVAL);	/* see grow.c */
	return sbi_buf_create(pool, length, flags, NULL, err);
}

/* The one site of the unmap probe (perf adds one event per name): every
 * page released (unmap, destroy, share over it) passes here, so perf
 * counts what stats.unmaps counts. */
static __attribute__((noinline)) void trace_unmap(struct sb_buf *buf,
						  size_t i)
{
	SBI_TRACE_UNMAP(buf, i);
}

/* Collect the page references of [first, end) into refs and clear those
 * entries. Returns how many pages were placed. */
static __attribute__((noinline)) size_t take_ptes(struct sb_buf *buf,
						   size_t first, size_t end,
						   sbi_ptref *refs)
{
	size_t placed = 0;

	for (size_t i = first; i < end; i++) {
		refs[i - first] = sbi_pte_ref(buf->pte[i]);
		if (!sbi_ptref_none(refs[i - first])) {
			placed++;
			trace_unmap(buf, i);
		}
		buf->pte[i] = 0;
	}
	buf->nplaced -= placed;
	return placed;
}

SB_API void sb_buf_destroy(struct sb_buf *buf)
{
	struct sb_pool *pool;
	size_t released = 0;

	if (sbi_check_buf(buf) < 0)
		return;
	pool = buf->pool;
	sbi_prefetch_cancel(buf, 0, buf->npages);
	pthread_rwlock_rdlock(&pool->layout);
	/* After this the handler no longer finds the buffer; a handler busy
	 * with one of its faults holds reg_lock, so we wait for it here. */
	pthread_rwlock_wrlock(&pool->reg_lock);
	reg_remove(pool, buf);
	pthread_rwlock_unlock(&pool->reg_lock);
	pthread_rwlock_unlock(&pool->layout);
	/* A handler's work after its last wake-up here (a growth watch
	 * noted) came before reg_remove: drop it, now that none can come. */
	sbi_prefetch_cancel(buf, 0, buf->npages);
	pthread_rwlock_rdlock(&pool->layout);
	/* Reads in flight finish into the range (not yet unmapped). */
	if (pool->disk)
		sbi_pagein_drain(buf);

	pthread_mutex_lock(&buf->lock);
	unreserve(buf->base, buf->length);
	/* Nothing maps its home heaps now: the pool's, like any heap. */
	if (buf->home)
		sbi_pool_home_gone(pool, buf->home, buf->home_heaps);
	if (disk_used(buf))
		for (size_t i = 0; i < buf->disk_hi; i++)
			if (!sbi_pte_has_page(buf->pte[i]))
				sbi_pte_release(buf, buf->pte[i]);
	/* Threads stopped on a fault here would wait forever: wake them to
	 * fault again on the now unmapped range. */
	sbi_vma_wake_range(pool, (uintptr_t)buf->base, buf->length);
	if (buf->nplaced) {
		/* Release in batches: a page table can be huge and sparse. */
		sbi_ptref batch[256];

		for (size_t i = 0; i < buf->npages && buf->nplaced;
		     i += 256) {
			size_t end = i + 256 < buf->npages ? i + 256
							   : buf->npages;

			released += take_ptes(buf, i, end, batch);
			sbi_pool_put(pool, batch, end - i);
		}
	}
	pthread_mutex_lock(&pool->lock);
	sbi_pool_drop_run(pool, buf);
	pthread_mutex_unlock(&pool->lock);
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);

	sbi_count(&pool->n_unmaps, released);
	if (buf->flags & (SB_BUF_EVICTABLE | SBI_BUF_RO))
		atomic_fetch_sub(&pool->n_evictable, 1);
	sbi_src_free(buf->src);
	sbi_home_free(buf);
	sbi_meta_free(buf->pte, buf->npages * sizeof(*buf->pte));
	free(buf->ra_off);
	pthread_mutex_destroy(&buf->lock);
	free(buf);
}

SB_API void *sb_buf_addr(const struct sb_buf *buf)
{
	return buf ? buf->base : NULL;
}

SB_API size_t sb_buf_length(const struct sb_buf *buf)
{
	return buf ? buf->length : 0;
}

SB_API struct sb_pool *sb_buf_pool(const struct sb_buf *buf)
{
	return buf ? buf->pool : NULL;
}

/* ---- map ---------------------------------------------------------------------- */

/* Group pages idx[k] <- pids[k] (idx ascending) into runs that one mmap
 * can place: consecutive buffer pages on consecutive pages of one heap. */
SB_API long sb_buf_map(struct sb_buf *buf, size_t off, size_t len)
{
	struct sbi_span sp;
	long r;

	if ((r = sbi_check_buf(buf)) < 0)
		return r;
	if ((r = sbi_check_range(buf, off, len)) < 0 || !len)
		return r;
	sp = sbi_span_touched(buf->pool, off, len);
	r = sbi_buf_place(buf, sp.first, sp.end, true);
	/* The first access to each 4 KiB, paid by the ready thread. */
	if (r > 0)
		sbi_touch_queue(buf, sp.first, sp.end);
	return r;
}

/* ---- unmap ---------------------------------------------------------------- */

/* Whether page pte's release has anything to do. A file's page that is
 * only on disk is as a release leaves it (registered anonymous memory):
 * left out of a home buffer's runs, so that those runs (pages that lost
 * their home) are of placed pages, whose new mapping is made with their
 * bytes (vma.c, anon_over_filled). */
static bool occupied(const struct sb_buf *buf, uint64_t pte)
{
	/* (Only with home mappings: elsewhere such a page would split the
	 * runs of a sparse reader's releases into a mapping change each.) */
	if (buf->home && (buf->flags & SBI_BUF_RO) && pte == SBI_PTE_DISK)
		return false;
	return pte & (SBI_PTE_PID | SBI_PTE_POISON | SBI_PTE_DISK |
		      SBI_PTE_KEEP);
}

/* Pages a home mapping (home.c) empties in place, collected. */
struct home_batch {
	size_t idx[SBI_HOME_BATCH];
	size_t n, released;
};

static void home_flush(struct sb_buf *buf, struct home_batch *hb)
{
	sbi_home_release(buf, hb->idx, hb->n);
	for (size_t k = 0; k < hb->n; k++)
		trace_unmap(buf, hb->idx[k]);
	hb->released += hb->n;
	hb->n = 0;
}

/* Page i, if home: emptied in place (batched), left as it is if empty
 * already, emptied by its read in flight when that finishes. false: the
 * page goes the common way. */
static bool unmap_home(struct sb_buf *buf, size_t i, struct home_batch *hb)
{
	if (sbi_home_empty(buf, i) || sbi_home_cancel(buf, i))
		return true;
	/* Poisoned by a failed page-in: empty again, in place. Replacing
	 * the mapping the common way would lose the home, and with it the
	 * promise that a touch racing a release only ever faults (an
	 * anonymous mapping reads zeros until it is registered). */
	if (sbi_home_poisoned(buf, i) && sbi_vma_unpoison(buf, i) == 0) {
		sbi_failed_read_gone(buf, buf->pte[i]);
		buf->pte[i] = SBI_PTE_DISK | SBI_PTE_KEEP |
			      sbi_pte_placed(sbi_home_pid(buf, i));
		return true;
	}
	if (!sbi_home_placed(buf, i))
		return false;
	hb->idx[hb->n++] = i;
	/* Empty from here on (sbi_home_release writes it so too): a range
	 * of sb_buf_unmap_ranges over this page again finds it empty and
	 * does not batch it twice. */
	buf->pte[i] = SBI_PTE_DISK | SBI_PTE_KEEP |
		      sbi_pte_placed(sbi_home_pid(buf, i));
	if (hb->n == SBI_HOME_BATCH)
		home_flush(buf, hb);
	return true;
}

/*
 * Page i of a file buffer with home mappings, released where it is if its
 * mapping is the one a release would make: a page that lost its home,
 * was released (registered anonymous memory) and has not been placed
 * since, only read into (in flight) or poisoned by a failed page-in. The
 * common way would replace that mapping with a fresh one, in which a
 * racing touch reads zeros until it is registered; here nothing is
 * mapped anew. A poison marker goes with MADV_DONTNEED (without
 * UFFDIO_POISON the page was handed to the SIGBUS uffd: the common way);
 * a read in flight gives its slot back when it finishes. false: the page
 * goes the common way.
 */
static bool unmap_unplaced(struct sb_buf *buf, size_t i)
{
	uint64_t pte = buf->pte[i];

	/* No page, none kept: on disk, in flight, or poisoned (a failed
	 * read's entry has no DISK, pagein.c). */
	if (!buf->home || !(buf->flags & SBI_BUF_RO) ||
	    (pte & (SBI_PTE_KEEP | SBI_PTE_PID)) ||
	    !(pte & (SBI_PTE_DISK | SBI_PTE_POISON)))
		return false;
	if (pte & SBI_PTE_POISON) {
		if (!buf->pool->can_poison || sbi_vma_unpoison(buf, i) < 0)
			return false;
	}
	sbi_pte_release(buf, pte);
	buf->pte[i] = SBI_PTE_DISK;
	return true;
}

/* Page i released without a mapping change (home pages into hb). */
static bool unmap_in_place(struct sb_buf *buf, size_t i,
			   struct home_batch *hb)
{
	return unmap_home(buf, i, hb) || unmap_unplaced(buf, i);
}

/* Release the pages of span sp (locks held): home pages into hb, the
 * rest the common way. Adds to *released; 0 or -errno. */
static long unmap_span(struct sb_buf *buf, struct sbi_span sp,
		       struct home_batch *hb, size_t *released)
{
	struct sb_pool *pool = buf->pool;
	sbi_ptref batch[256];
	long r = 0;

	SBI_HELD(&buf->lock);
	for (size_t i = sp.first, next; i < sp.end && r >= 0; i = next) {
		size_t j = i + 1;
		bool home_ends = false;

		next = i + 1;
		if (!occupied(buf, buf->pte[i]) || unmap_in_place(buf, i, hb))
			continue;
		/* A run of pages that go the common way; a page released in
		 * place ends it (and is taken care of). */
		while (j < sp.end && j - i < 256 && occupied(buf, buf->pte[j]) &&
		       !(home_ends = unmap_in_place(buf, j, hb)))
			j++;
		next = home_ends ? j + 1 : j;
		r = sbi_vma_unplace(buf, i, j - i);
		if (r < 0)
			break;
		/* Evicted data dies with it (a read in flight gives its
		 * slot back when it finishes). */
		for (size_t t = i; t < j; t++)
			if (!sbi_pte_has_page(buf->pte[t]))
				sbi_pte_release(buf, buf->pte[t]);
		*released += take_ptes(buf, i, j, batch);
		/* A file's pages can always be read again. */
		if (buf->flags & SBI_BUF_RO)
			for (size_t t = i; t < j; t++)
				buf->pte[t] = SBI_PTE_DISK;
		sbi_pool_put(pool, batch, j - i);
	}
	return r;
}

/* Release the pages lying wholly inside each of n ranges, checked: one
 * taking of the locks, and a file buffer's home pages released in batches
 * across the ranges (home.c: a batch costs a TLB flush, not a page). */
static long unmap(struct sb_buf *buf, const struct sb_range *ranges,
		  size_t n)
{
	struct sb_pool *pool = buf->pool;
	struct home_batch hb = {.n = 0, .released = 0};
	size_t released = 0;
	long r = 0;

	/* An earlier prefetch must not place pages after this release, nor
	 * a touch or a watch read them (sbi_bg_quiet_begin). */
	for (size_t k = 0; k < n; k++) {
		struct sbi_span sp =
			sbi_span_inside(pool, ranges[k].off, ranges[k].len);

		if (k == 0)
			sbi_bg_quiet_begin(buf, sp.first, sp.end);
		else if (sp.first < sp.end)
			sbi_prefetch_cancel(buf, sp.first, sp.end);
	}
	pthread_rwlock_rdlock(&pool->layout);
	pthread_mutex_lock(&buf->lock);
	for (size_t k = 0; k < n && r >= 0; k++) {
		struct sbi_span sp =
			sbi_span_inside(pool, ranges[k].off, ranges[k].len);

		if (sp.first < sp.end)
			r = unmap_span(buf, sp, &hb, &released);
	}
	if (hb.n)
		home_flush(buf, &hb);
	released += hb.released;
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);
	if (n)
		sbi_bg_quiet_end(buf);
	sbi_count(&pool->n_unmaps, released);
	return r < 0 ? r : (long)released;
}

SB_API long sb_buf_unmap(struct sb_buf *buf, size_t off, size_t len)
{
	return sb_buf_unmap_ranges(buf, &(struct sb_range){off, len}, 1);
}

SB_API long sb_buf_unmap_ranges(struct sb_buf *buf,
				const struct sb_range *ranges, size_t n)
{
	long r;

	if ((r = sbi_check_buf(buf)) < 0)
		return r;
	if (n && !ranges)
		return -EINVAL;
	/* Every range checked before anything is released. */
	for (size_t k = 0; k < n; k++)
		if ((r = sbi_check_range(buf, ranges[k].off, ranges[k].len)) <
		    0)
			return r;
	sbi_vma_fg_begin(buf->pool);
	r = unmap(buf, ranges, n);
	sbi_vma_fg_end(buf->pool);
	return r;
}

SB_API long sb_buf_placed(const struct sb_buf *cbuf, size_t off, size_t len)
{
	struct sb_buf *buf = (struct sb_buf *)cbuf;	/* for its lock */
	struct sbi_span sp;
	size_t n = 0;
	long r;

	if ((r = sbi_check_buf(buf)) < 0)
		return r;
	if ((r = sbi_check_range(buf, off, len)) < 0 || !len)
		return r;
	sp = sbi_span_touched(buf->pool, off, len);
	pthread_mutex_lock(&buf->lock);
	for (size_t i = sp.first; i < sp.end; i++)
		n += sbi_pte_has_page(buf->pte[i]);
	pthread_mutex_unlock(&buf->lock);
	return (long)n;
}

long sbi_buf_sole_pages(struct sb_buf *buf, size_t first, size_t end)
{
	size_t n = 0;

	pthread_mutex_lock(&buf->lock);
	for (size_t i = first; i < end && i < buf->npages; i++) {
		sbi_ptref r = sbi_pte_ref(buf->pte[i]);
		sbi_pid p = sbi_ptref_pid(r);

		/* Held by this buffer alone in this process (a page of
		 * sparsebufd's cache counts too: what it keeps mapped here
		 * the daemon cannot let go of). */
		n += !sbi_ptref_none(r) &&
		     sbi_pool_refs(buf->pool, p) -
				     sbi_pid_heap(buf->pool, p)->foreign ==
			     1;
	}
	pthread_mutex_unlock(&buf->lock);
	return (long)n;
}

/* ---- share ------------------------------------------------------------------ */

/* Write-protect the placed, not yet protected pages of src's [s0, s0+n) so
 * that their first write copies. */
static int protect_src(struct sb_buf *src, size_t s0, size_t n)
{
	struct sb_pool *pool = src->pool;
	int r = 0;

	for (size_t i = s0; i < s0 + n && r == 0;) {
		uint64_t pte = src->pte[i];
		size_t j = i + 1;

		if (!sbi_pte_has_page(pte) || (pte & SBI_PTE_SHARED)) {
			i++;
			continue;
		}
		if (pte & SBI_PTE_WPFAIL) {
			/* Still shared, protected through the SIGBUS uffd:
			 * map it afresh, protected through ours. */
			r = sbi_vma_place_shared(
				src, i, 1, sbi_ptref_pid(sbi_pte_ref(pte)),
				pool->uffd);
			if (r == 0)
				src->pte[i] = (pte & ~SBI_PTE_WPFAIL) |
					      SBI_PTE_SHARED;
			i++;
			continue;
		}
		while (j < s0 + n && sbi_pte_has_page(src->pte[j]) &&
		       !(src->pte[j] & (SBI_PTE_SHARED | SBI_PTE_WPFAIL)))
			j++;
		r = sbi_vma_protect(src, i, j - i, pool->uffd);
		if (r == 0) {
			for (size_t t = i; t < j; t++)
				src->pte[t] |= SBI_PTE_SHARED;
			if (j > src->shared_hi)
				src->shared_hi = j;
		}
		i = j;
	}
	return r;
}

/* Enter snap[b0, b1) in dst's table at d0 + b0, the mappings made: dst's
 * evicted data there dies, as with unmap, and the pages it held go. */
static void install_enter(struct sb_buf *dst, size_t d0, size_t b0,
			  size_t b1, const sbi_ptref *snap, size_t *released)
{
	struct sb_pool *pool = dst->pool;
	sbi_ptref old[256];

	for (size_t k = b0; k < b1;) {
		size_t run = b1 - k < 256 ? b1 - k : 256;

		for (size_t t = d0 + k; t < d0 + k + run; t++)
			if (!sbi_pte_has_page(dst->pte[t]))
				sbi_pte_release(dst, dst->pte[t]);
		*released += take_ptes(dst, d0 + k, d0 + k + run, old);
		for (size_t t = 0; t < run; t++) {
			if (!sbi_ptref_none(snap[k + t])) {
				dst->pte[d0 + k + t] = snap[k + t].v |
						       SBI_PTE_SHARED |
						       SBI_PTE_PRIVMAP;
				dst->nplaced++;
				if (d0 + k + t + 1 > dst->shared_hi)
					dst->shared_hi = d0 + k + t + 1;
			}
		}
		sbi_pool_put(pool, old, run);
		k += run;
	}
}

/* Protect the shares mapped over snap[b0, b1) together and enter them.
 * One that cannot be protected must not show: the range goes back to
 * unplaced pages (or, failing that, becomes inaccessible), and its
 * references with it. */
static int install_finish(struct sb_buf *dst, size_t d0, size_t b0,
			  size_t b1, sbi_ptref *snap, size_t *released)
{
	struct sb_pool *pool = dst->pool;
	int r;

	if (b0 == b1)
		return 0;
	r = sbi_vma_share_finish(dst, d0 + b0, b1 - b0, pool->uffd);
	/* The references go only once the range no longer shows the pages:
	 * a page given back is another buffer's next, and a mapping left
	 * on it would read that one's data. Failing both ways (at
	 * vm.max_map_count, say), the buffer keeps them, unprotected: its
	 * own writes are then private copies the library does not see
	 * (lost if the page goes to disk), never another's data. */
	if (r < 0 && (sbi_vma_unplace(dst, d0 + b0, b1 - b0) == 0 ||
		      sbi_vma_inaccessible(dst, d0 + b0, b1 - b0) == 0)) {
		sbi_pool_put(pool, snap + b0, b1 - b0);
		for (size_t t = b0; t < b1; t++)
			snap[t] = SBI_NOPAGE;
	} else if (r < 0) {
		sbi_err("a share could neither be protected nor undone: its "
			"%zu pages stay, unprotected", b1 - b0);
	}
	install_enter(dst, d0, b0, b1, snap, released);
	return r;
}

/* Make dst's [d0, d0+n) show snap[] (already referenced for dst). Returns
 * 0 or -errno; entries done so far stay consistent. The shares between two
 * runs of holes are mapped one run of a heap's pages at a time, then
 * protected at once (install_finish). */
static int install_dst(struct sb_buf *dst, size_t d0, size_t n,
		       sbi_ptref *snap, size_t *released)
{
	struct sb_pool *pool = dst->pool;
	size_t b0 = 0, k = 0;	/* [b0, k): mapped, not yet protected */
	int r = 0;

	while (k < n && r == 0) {
		size_t run = 1;

		if (!sbi_ptref_none(snap[k])) {
			sbi_pid p = sbi_ptref_pid(snap[k]);

			/* Consecutive pages of one heap: one mapping. */
			while (k + run < n && run < 256 &&
			       sbi_ptref_pid(snap[k + run]) == p + run &&
			       (p + run) % pool->pages_per_heap)
				run++;
			r = sbi_vma_map_private(dst, d0 + k, run, p);
			if (r == 0)
				k += run;
			continue;
		}
		/* Holes: the shares before them are finished first. */
		r = install_finish(dst, d0, b0, k, snap, released);
		b0 = k;
		if (r < 0)
			break;
		while (k + run < n && run < 256 &&
		       sbi_ptref_none(snap[k + run]))
			run++;
		r = sbi_vma_unplace(dst, d0 + k, run);
		if (r < 0)
			break;
		install_enter(dst, d0, k, k + run, snap, released);
		k += run;
		b0 = k;
	}
	/* The shares mapped last, and those before a mapping that failed. */
	if (b0 < k) {
		int f = install_finish(dst, d0, b0, k, snap, released);

		if (r == 0)
			r = f;
	}
	if (r < 0)
		/* Drop the references meant for pages not done. */
		sbi_pool_put(pool, snap + k, n - k);
	return r;
}

/*
 * Two buffers' locks, lower id first (first may be second), never waiting
 * for the second while holding the first. Its holder may be a fault or a
 * page-in that needs a page evicted from the first buffer: it can only try
 * that lock (it holds one already), so it would try for as long as we
 * held on. Wait for the second with no lock held, then start again.
 */
static void lock_pair(struct sb_buf *first, struct sb_buf *second)
{
	for (;;) {
		pthread_mutex_lock(&first->lock);
		if (second == first ||
		    pthread_mutex_trylock(&second->lock) == 0)
			return;
		pthread_mutex_unlock(&first->lock);
		pthread_mutex_lock(&second->lock);
		pthread_mutex_unlock(&second->lock);
	}
}

static bool lock_pair_try(struct sb_buf *first, struct sb_buf *second)
{
	if (pthread_mutex_trylock(&first->lock) != 0)
		return false;
	if (second != first && pthread_mutex_trylock(&second->lock) != 0) {
		pthread_mutex_unlock(&first->lock);
		return false;
	}
	return true;
}

static void unlock_pair(struct sb_buf *first, struct sb_buf *second)
{
	if (second != first)
		pthread_mutex_unlock(&second->lock);
	pthread_mutex_unlock(&first->lock);
}

long sbi_buf_share_disk(struct sb_buf *dst, size_t d0, struct sb_buf *src,
			size_t s0, size_t n)
{
	struct sb_pool *pool = src->pool;
	struct sbi_disk *d = sbi_disk_peek(pool);
	struct sb_buf *first = dst->id < src->id ? dst : src;
	struct sb_buf *second = first == dst ? src : dst;
	long given = 0;

	if (!d || dst == src || dst->pool != pool ||
	    (dst->flags & (SB_BUF_STRICT | SBI_BUF_RO)) ||
	    d0 + n > dst->npages || s0 + n > src->npages)
		return 0;
	pthread_rwlock_rdlock(&pool->layout);
	lock_pair(first, second);
	for (size_t k = 0; k < n; k++) {
		uint64_t pte = src->pte[s0 + k];
		uint32_t slot1 = sbi_pte_slot1(pte);

		/* On disk in a spill slot, not being read: the slot gets a
		 * second holder; dst reads it in on its first touch. */
		if (!(pte & SBI_PTE_DISK) || (pte & SBI_PTE_INFLIGHT) ||
		    !slot1 || dst->pte[d0 + k])
			continue;
		if (sbi_spill_ref(d, slot1 - 1) < 0)
			continue;	/* left for the caller to share */
		dst->pte[d0 + k] = SBI_PTE_DISK | SBI_PTE_SLOT(slot1);
		if (d0 + k >= dst->disk_hi)
			dst->disk_hi = d0 + k + 1;
		given++;
	}
	if (given)
		atomic_store(&dst->disk_used, true);
	unlock_pair(first, second);
	pthread_rwlock_unlock(&pool->layout);
	return given;
}

SB_API long sb_buf_share(struct sb_buf *dst, size_t dst_off,
			 struct sb_buf *src, size_t src_off, size_t len)
{
	struct sb_pool *pool;
	struct sb_buf *first, *second;
	size_t n, d0, s0, shared = 0, released = 0;
	sbi_ptref *snap;
	int tries = 0;
	bool held_off;
	long r;

	if ((r = sbi_check_buf(dst)) < 0 || (r = sbi_check_buf(src)) < 0)
		return r;
	pool = dst->pool;
	if (src->pool != pool)
		return -EXDEV;
	if ((dst_off | src_off) & (pool->page_size - 1))
		return -EINVAL;
	if (!len)
		return 0;
	if (len > SIZE_MAX - (pool->page_size - 1))
		return -ERANGE;
	len = (len + pool->page_size - 1) & ~(pool->page_size - 1);
	if (sbi_check_range(dst, dst_off, len) < 0 ||
	    sbi_check_range(src, src_off, len) < 0)
		return -ERANGE;
	if (!pool->can_wp)
		return -EOPNOTSUPP;	/* no copy-on-write on this kernel */
	if (dst->flags & SBI_BUF_RO)
		return -EINVAL;		/* a file's pages are read-only */
	n = len >> pool->page_shift;
	d0 = dst_off >> pool->page_shift;
	s0 = src_off >> pool->page_shift;
	snap = malloc(n * sizeof(*snap));
	if (!snap)
		return -ENOMEM;
	first = dst->id < src->id ? dst : src;
	second = first == dst ? src : dst;
	/* dst's pages there are replaced or released below: no prefetch may
	 * place into them after, no touch may read them meanwhile. */
	sbi_bg_quiet_begin(dst, d0, d0 + n);
again:
	r = 0;
	held_off = false;
	/* What the source has on disk is shared from memory: read it in,
	 * with eviction holding off src meanwhile (else the pages read in
	 * could go straight back to disk, again and again). */
	if (disk_used(src)) {
		atomic_fetch_add(&src->sharing, 1);
		held_off = true;
		r = sbi_pagein_range(src, s0, s0 + n, true);
		if (r < 0) {
			atomic_fetch_sub(&src->sharing, 1);
			sbi_bg_quiet_end(dst);
			free(snap);
			return r;
		}
	}
	sbi_buf_let_io_in(dst);
	sbi_buf_let_io_in(src);
	pthread_rwlock_rdlock(&pool->layout);
	/* Never wait for a buffer lock while eviction holds off src: its
	 * holder may be a fault that needs one of src's pages evicted. */
	if (held_off && !lock_pair_try(first, second)) {
		atomic_fetch_sub(&src->sharing, 1);
		held_off = false;
		lock_pair(first, second);
	} else if (!held_off) {
		lock_pair(first, second);
	}
	/* A page read in above went to disk again before we took the locks
	 * (an eviction that had started, or one that came after we let
	 * eviction back in): read again. */
	for (size_t k = 0; k < n && r >= 0; k++)
		if (src->pte[s0 + k] & SBI_PTE_DISK)
			r = -EAGAIN;
	if (r == -EAGAIN && tries++ < 64) {
		unlock_pair(first, second);
		pthread_rwlock_unlock(&pool->layout);
		if (held_off)
			atomic_fetch_sub(&src->sharing, 1);
		goto again;
	}
	/* Protect the source first: from here on a write through it copies,
	 * so nothing it writes can show through dst. */
	if (r >= 0)
		r = protect_src(src, s0, n);
	if (r == 0) {
		for (size_t k = 0; k < n; k++) {
			snap[k] = sbi_pte_ref(src->pte[s0 + k]);
			shared += !sbi_ptref_none(snap[k]);
		}
		sbi_pool_ref(pool, snap, n);
		r = install_dst(dst, d0, n, snap, &released);
	}
	unlock_pair(first, second);
	pthread_rwlock_unlock(&pool->layout);
	if (held_off)
		atomic_fetch_sub(&src->sharing, 1);
	sbi_bg_quiet_end(dst);
	free(snap);
	sbi_count(&pool->n_unmaps, released);
	return r < 0 ? r : (long)shared;
}

int sbi_buf_install(struct sb_buf *dst, size_t d0, size_t n,
		    sbi_ptref *refs)
{
	struct sb_pool *pool = dst->pool;
	size_t released = 0;
	int r;

	if (d0 + n > dst->npages || n > dst->npages ||
	    (dst->flags & (SB_BUF_STRICT | SBI_BUF_RO)) || !pool->can_wp) {
		sbi_pool_put(pool, refs, n);
		return -EINVAL;
	}
	sbi_bg_quiet_begin(dst, d0, d0 + n);	/* as sb_buf_share */
	pthread_rwlock_rdlock(&pool->layout);
	pthread_mutex_lock(&dst->lock);
	r = install_dst(dst, d0, n, refs, &released);
	pthread_mutex_unlock(&dst->lock);
	pthread_rwlock_unlock(&pool->layout);
	sbi_bg_quiet_end(dst);
	sbi_count(&pool->n_unmaps, released);
	return r;
}
