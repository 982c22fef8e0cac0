/* SPDX-License-Identifier: MIT */
/*
 * The pool of placement heaps: creation and teardown, the page allocator,
 * references for shared pages, the budget, and the accounting.
 *
 * Allocation prefers, for a buffer page, the heap page right after the one
 * holding the buffer's previous page: consecutive buffer pages then sit on
 * consecutive heap pages and the kernel merges their mappings into one VMA.
 * To keep that room free while several buffers grow at once, a buffer that
 * starts a new run earmarks an extent of free heap pages (a "run"); other
 * buffers avoid earmarked pages unless nothing else is left. Earmarks cost
 * no memory: an earmarked page is a hole in the memfd until it is used.
 *
 * Budget: pages backed by memory (used, ready, dirty, busy) never exceed
 * max_pages, and an allocation fails up front, all or nothing, when used + n
 * would exceed it.
 */
#include "internal.h"
#include "uffd_compat.h"

#include <errno.h>
#include <limits.h>
#include <numa.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* Pages a new run earmarks: 4 MiB worth, at least one page, at most a heap. */
uint32_t sbi_run_pages(const struct sb_pool *pool)
{
	size_t r = ((size_t)4 << 20) >> pool->page_shift;

	if (r < 1)
		r = 1;
	if (r > pool->pages_per_heap)
		r = pool->pages_per_heap;
	return (uint32_t)r;
}

static bool page_free(const struct sbi_heap *h, uint32_t i)
{
	return h->state[i] != SBI_PG_USED && h->state[i] != SBI_PG_EVICTED;
}

/* ---- heaps ------------------------------------------------------------- */

/* Add a heap; pool->lock held. */
struct sbi_heap *sbi_pool_add_heap(struct sb_pool *pool, int *err)
{
	SBI_HELD(&pool->lock);
	struct sbi_heap *h;
	uint32_t slot;

	for (slot = 0; slot < pool->heap_hi && pool->heaps[slot]; slot++)
		;
	if (slot == pool->heap_cap) {
		*err = -ENOMEM;
		return NULL;
	}
	h = sbi_heap_create(&pool->source, pool->heap_size, pool->page_size,
			    pool->numa_node, err);
	if (!h) {
		sbi_warn("cannot add a heap of %zu bytes: %s", pool->heap_size,
			 strerror(-*err));
		return NULL;
	}
	h->slot = slot;
	h->serial = ++pool->heap_serial;
	pool->heaps[slot] = h;
	pool->nheaps++;
	if (slot == pool->heap_hi)
		pool->heap_hi++;
	return h;
}

/* ---- runs ---------------------------------------------------------------- */

void sbi_pool_drop_run(struct sb_pool *pool, struct sb_buf *buf)
{
	struct sbi_heap *h;

	if (!buf->run_serial)
		return;
	h = buf->run_slot < pool->heap_hi ? pool->heaps[buf->run_slot] : NULL;
	if (h && h->serial == buf->run_serial) {
		for (uint32_t i = buf->run_start; i < buf->run_end; i++)
			if (page_free(h, i) && h->owner[i] == buf->id)
				h->owner[i] = 0;
	}
	buf->run_serial = 0;
}

/*
 * Where the next run should start. Free, unearmarked extents are what runs
 * can use, but an extent right after a used or earmarked page is where
 * that page's run will grow: a new run starts there only halfway in, and
 * only if the extent is at least twice want long (so runs spread like a
 * buddy allocator and each keeps room to grow). An extent at the start of
 * a heap can be used from its first page. The first fit wins; false when
 * there is none (then a new heap is better), with the largest extent in
 * the out parameters as a last resort. pool->lock held.
 */
bool sbi_pool_find_site(struct sb_pool *pool, uint32_t want,
			struct sbi_heap **hp, uint32_t *startp, uint32_t *lenp)
{
	SBI_HELD(&pool->lock);
	struct sbi_heap *best = NULL;
	uint32_t best_start = 0, best_len = 0;

	if (want > pool->pages_per_heap)
		want = pool->pages_per_heap;
	for (uint32_t s = 0; s < pool->heap_hi; s++) {
		struct sbi_heap *h = pool->heaps[s];

		if (!h || h->nused + h->nevicted == h->npages)
			continue;
		for (uint32_t i = 0; i < h->npages;) {
			uint32_t j = i, start = i;

			while (j < h->npages && page_free(h, j) && !h->owner[j])
				j++;
			if (i > 0)
				start = j - i >= 2 * want ? i + (j - i) / 2 : j;
			if (start < j && j - start >= want) {
				*hp = h, *startp = start, *lenp = j - start;
				return true;
			}
			if (j - i > best_len)
				best = h, best_start = i, best_len = j - i;
			i = j + 1;
		}
	}
	*hp = best, *startp = best_start, *lenp = best_len;
	return false;
}

/*
 * Start a new run for buf: at the site above, else in a new heap, else in
 * the largest extent, else on any free page (taking it from another run).
 * pool->lock held.
 */
static int claim_run(struct sb_pool *pool, struct sb_buf *buf, uint32_t want,
		     sbi_pid *out)
{
	SBI_HELD(&pool->lock);
	struct sbi_heap *h;
	uint32_t start, len;
	int err = 0;

	sbi_pool_drop_run(pool, buf);
	if (!sbi_pool_find_site(pool, want, &h, &start, &len)) {
		struct sbi_heap *nh = sbi_pool_add_heap(pool, &err);

		if (nh)
			h = nh, start = 0, len = nh->npages;
		/* else the largest extent, if any */
	}
	if (!len) {
		/* Every free page is earmarked: take one from another run. */
		for (uint32_t s = 0; s < pool->heap_hi && !len; s++) {
			struct sbi_heap *x = pool->heaps[s];

			for (uint32_t i = 0; x && i < x->npages; i++) {
				if (page_free(x, i)) {
					h = x, start = i, len = 1;
					break;
				}
			}
		}
	}
	if (!len)
		return err ? err : -ENOMEM;
	if (len > want)
		len = want;
	for (uint32_t i = start; i < start + len; i++)
		h->owner[i] = buf->id;
	buf->run_serial = h->serial;
	buf->run_slot = h->slot;
	buf->run_start = start;
	buf->run_end = start + len;
	buf->run_next = start;
	pool->want_site = true;
	*out = h->slot * pool->pages_per_heap + start;
	return 0;
}

/* ---- allocation ---------------------------------------------------------- */

enum prep { PREP_NONE, PREP_ZERO, PREP_BACK };

enum sbi_page_state sbi_page_unfree(struct sb_pool *pool, struct sbi_heap *h,
				    uint32_t i)
{
	enum sbi_page_state st = (enum sbi_page_state)h->state[i];

	switch (st) {
	case SBI_PG_READY:
		h->nready--;
		pool->ready--;
		break;
	case SBI_PG_DIRTY:
		h->ndirty--;
		pool->dirty--;
		break;
	default:	/* UNBACKED: about to get memory */
		pool->resident++;
		break;
	}
	return st;
}

/* Take free page i of h for one holder; pool->lock held. */
static enum prep take_page(struct sb_pool *pool, struct sbi_heap *h,
			   uint32_t i, unsigned flags)
{
	SBI_HELD(&pool->lock);
	enum sbi_page_state st = sbi_page_unfree(pool, h, i);
	enum prep prep = st == SBI_PG_READY   ? PREP_NONE
			 : st == SBI_PG_DIRTY ? PREP_ZERO
					      : PREP_BACK;

	if (prep == PREP_ZERO && (flags & SBI_ALLOC_OVERWRITE))
		prep = PREP_NONE;	/* recycled as it is */

	h->state[i] = SBI_PG_USED;
	h->refs[i] = 1;
	h->owner[i] = 0;
	/* Not evictable until a placement in an evictable buffer says so. */
	__atomic_store_n(&h->raddr[i], 0, __ATOMIC_RELAXED);
	h->nused++;
	pool->used++;
	return prep;
}

/* Give back a page taken by take_page that was never used. */
static void untake_page(struct sb_pool *pool, struct sbi_heap *h, uint32_t i,
			enum prep prep)
{
	h->nused--;
	pool->used--;
	h->refs[i] = 0;
	if (prep == PREP_BACK) {
		h->state[i] = SBI_PG_UNBACKED;
		pool->resident--;
	} else {
		h->state[i] = SBI_PG_DIRTY;
		h->ndirty++;
		pool->dirty++;
	}
}

/* Any free backed page that is not busy; pool->lock held. */
static bool find_backed(struct sb_pool *pool, sbi_pid *out, bool *busy)
{
	SBI_HELD(&pool->lock);
	*busy = false;
	for (uint32_t s = 0; s < pool->heap_hi; s++) {
		struct sbi_heap *h = pool->heaps[s];

		if (!h)
			continue;
		*busy |= h->nbusy > 0;
		if (!h->nready && !h->ndirty)
			continue;
		for (uint32_t i = 0; i < h->npages; i++) {
			if (h->state[i] == SBI_PG_READY ||
			    h->state[i] == SBI_PG_DIRTY) {
				*out = s * pool->pages_per_heap + i;
				return true;
			}
		}
	}
	return false;
}

/*
 * Wait for the ready thread to finish a BUSY page; pool->lock held. It needs
 * tens of microseconds, less than a cross-CPU wake-up costs in a VM, so
 * poll for a while before sleeping. Having to wait means the reserve was
 * not deep enough for this burst: it counts as a miss, which grows it.
 */
static void wait_busy(struct sb_pool *pool, unsigned flags)
{
	SBI_HELD(&pool->lock);
	uint64_t gen = pool->busy_gen;
	int spins = flags & SBI_ALLOC_NOSPIN ? 0 : 200;

	pool->misses++;
	if (pool->ready_target < sbi_ready_cap(pool))
		pool->ready_target++;

	for (int spin = 0; spin < spins && pool->busy_gen == gen; spin++) {
		pthread_mutex_unlock(&pool->lock);
		for (int k = 0; k < 200; k++)
			__builtin_ia32_pause();
		pthread_mutex_lock(&pool->lock);
	}
	if (pool->busy_gen == gen)
		pthread_cond_wait(&pool->busy_cond, &pool->lock);
}

/*
 * Without a page to continue from (the buffer page before is unplaced),
 * take the next free page of the buffer's current run: scattered
 * placements then claim one run per run_pages pages, not one each.
 */
static bool run_cursor(struct sb_pool *pool, struct sb_buf *buf, sbi_pid *out)
{
	struct sbi_heap *h;

	if (!buf->run_serial || buf->run_slot >= pool->heap_hi)
		return false;
	h = pool->heaps[buf->run_slot];
	if (!h || h->serial != buf->run_serial)
		return false;
	for (; buf->run_next < buf->run_end; buf->run_next++) {
		uint32_t i = buf->run_next;

		if (page_free(h, i) && (!h->owner[i] || h->owner[i] == buf->id)) {
			*out = h->slot * pool->pages_per_heap + i;
			return true;
		}
	}
	return false;
}

/*
 * Pick and take one page for buf, trying the continuation hint first.
 * Returns the prep the page needs, or -errno. pool->lock held; may wait on
 * busy_cond (the ready thread finishing a page), never on anything a
 * faulting thread holds.
 */
/* Can buf take page i of h (free, and not earmarked by another buffer)? */
static bool usable(const struct sbi_heap *h, uint32_t i,
		   const struct sb_buf *buf)
{
	return h && i < h->npages && page_free(h, i) &&
	       (!h->owner[i] || h->owner[i] == buf->id);
}

static struct sbi_heap *hint_heap(struct sb_pool *pool, sbi_pid p)
{
	return p / pool->pages_per_heap < pool->heap_hi ? sbi_pid_heap(pool, p)
							 : NULL;
}

/* Pages of a buffer's next run: a buffer that keeps growing through its
 * runs gets runs twice as long each time, up to a whole heap (earmarks cost
 * nothing), so a long sequential buffer claims a run every few hundred
 * pages, not every 16. */
static uint32_t next_run_pages(const struct sb_pool *pool,
			       const struct sb_buf *buf)
{
	uint32_t base = sbi_run_pages(pool), want = base;

	if (buf->run_serial && buf->run_next >= buf->run_end &&
	    buf->run_end - buf->run_start >= base)
		want = 2 * (buf->run_end - buf->run_start);
	return want < pool->pages_per_heap ? want : pool->pages_per_heap;
}

static int alloc_one(struct sb_pool *pool, struct sb_buf *buf, sbi_pid *hint,
		     bool have_hint, sbi_pid *out, unsigned flags)
{
	bool tried_cursor = false;

	for (;;) {
		struct sbi_heap *h = NULL;
		uint32_t i = 0;
		bool busy;
		int r;

		if (have_hint) {
			h = hint_heap(pool, *hint);
			i = sbi_pid_index(pool, *hint);
		}
		if (usable(h, i, buf)) {
			if (h->state[i] == SBI_PG_BUSY) {
				wait_busy(pool, flags);
				continue;
			}
			if (h->state[i] != SBI_PG_UNBACKED ||
			    pool->resident < pool->max_pages) {
				if (h->serial == buf->run_serial &&
				    i >= buf->run_next && i < buf->run_end)
					buf->run_next = i + 1;
				*out = *hint;
				return take_page(pool, h, i, flags);
			}
		}
		if (pool->resident >= pool->max_pages) {
			/* At the budget: only a page that already has
			 * memory will do, wherever it is. */
			if (find_backed(pool, out, &busy)) {
				h = sbi_pid_heap(pool, *out);
				return take_page(pool, h,
						 sbi_pid_index(pool, *out),
						 flags);
			}
			if (!busy)
				return -EDQUOT;	/* the budget */
			wait_busy(pool, flags);
			continue;
		}
		/* No page to continue from: the buffer's current run (which
		 * may have been claimed ahead, see sbi_pool_alloc), else a
		 * new run. */
		if (!tried_cursor) {
			tried_cursor = true;
			if (run_cursor(pool, buf, hint)) {
				have_hint = true;
				continue;
			}
		}
		r = claim_run(pool, buf, next_run_pages(pool, buf), hint);
		if (r < 0)
			return r;
		have_hint = true;
	}
}

int sbi_pool_alloc(struct sb_pool *pool, struct sb_buf *buf, sbi_pid hint1,
		   size_t n, sbi_pid *out, unsigned flags)
{
	uint8_t prep_small[64], *prep = prep_small;
	sbi_pid hint = hint1 ? hint1 - 1 : 0;
	bool have_hint = hint1 != 0;
	size_t got = 0, misses = 0;
	int r = 0;

	if (n > sizeof(prep_small)) {
		/* Only sb_buf_map asks for more than one page at a time;
		 * the fault path asks for one. */
		prep = sbi_meta_alloc(n, false);
		if (!prep)
			return -ENOMEM;
	}
	pthread_mutex_lock(&pool->lock);
	if (pool->used + n > pool->max_pages) {
		r = -EDQUOT;	/* the budget */
		goto out_unlock;
	}
	for (got = 0; got < n; got++) {
		/* Continue after the previous page, within its heap. */
		if (have_hint && sbi_pid_index(pool, ++hint) == 0)
			have_hint = false;
		r = alloc_one(pool, buf, &hint, have_hint, &out[got], flags);
		if (r < 0)
			break;
		prep[got] = (uint8_t)r;
		hint = out[got];
		have_hint = true;
		misses += r != PREP_NONE;
		r = 0;
	}
	if (r < 0) {
		while (got--)
			untake_page(pool, sbi_pid_heap(pool, out[got]),
				    sbi_pid_index(pool, out[got]),
				    (enum prep)prep[got]);
		goto out_unlock;
	}
	/* The pages after the last one are what this buffer needs next: ask
	 * for two, so that one late wake-up of the ready thread costs
	 * nothing. If the next one cannot be had (the run ends there), claim
	 * the next run now and ask for its first pages instead: the next
	 * allocation continues there, on a page made ready meanwhile, rather
	 * than claiming and preparing one on the spot (every region of a KV
	 * cache would otherwise do that at the same position). */
	{
		struct sbi_heap *h = sbi_pid_heap(pool, hint);
		uint32_t i = sbi_pid_index(pool, hint);
		sbi_pid next;

		if (usable(h, i + 1, buf)) {
			sbi_ready_want(pool, hint + 1, 0);
			if (usable(h, i + 2, buf))
				sbi_ready_want(pool, hint + 2, 1);
		} else if (claim_run(pool, buf, next_run_pages(pool, buf),
				     &next) == 0) {
			sbi_ready_want(pool, next, 0);
			if (usable(sbi_pid_heap(pool, next),
				   sbi_pid_index(pool, next) + 1, buf))
				sbi_ready_want(pool, next + 1, 1);
		}
	}
	if (misses) {
		pool->misses += misses;
		pool->ready_target += misses;
		if (pool->ready_target > sbi_ready_cap(pool))
			pool->ready_target = sbi_ready_cap(pool);
	}
	/* While the pool is active the ready thread polls (ready.c): waking
	 * it would cost this thread a cross-CPU wake-up, tens of us in a VM. */
	pool->alloc_seq++;
	sbi_pool_note_caller(pool);
	if (pool->ready_idle)
		pthread_cond_signal(&pool->ready_cond);
	pthread_mutex_unlock(&pool->lock);

	/* Zeroing and allocation happen outside the lock, through the heap
	 * file (sbi_heap_zero: cheaper than letting the placement's
	 * MAP_POPULATE zero-fill it, 80-105 us against 95-112 us more per
	 * 256 KiB page, and an error rather than SIGBUS when memory runs
	 * out). */
	for (size_t k = 0; k < n && r == 0; k++) {
		struct sbi_heap *h = sbi_pid_heap(pool, out[k]);
		uint32_t i = sbi_pid_index(pool, out[k]);

		if (prep[k] != PREP_NONE)
			r = sbi_heap_zero(h, i, 1, pool->page_size);
	}
	if (r < 0) {
		sbi_warn("no memory for a heap page: %s", strerror(-r));
		for (size_t k = 0; k < n; k++)	/* partial allocations */
			if (prep[k] != PREP_NONE)
				sbi_heap_punch(sbi_pid_heap(pool, out[k]),
					       sbi_pid_index(pool, out[k]), 1,
					       pool->page_size);
		pthread_mutex_lock(&pool->lock);
		for (size_t k = 0; k < n; k++)	/* punched: unbacked */
			untake_page(pool, sbi_pid_heap(pool, out[k]),
				    sbi_pid_index(pool, out[k]),
				    prep[k] != PREP_NONE ? PREP_BACK : PREP_NONE);
		pthread_mutex_unlock(&pool->lock);
	} else if (misses) {
		atomic_fetch_add_explicit(&pool->n_sync_prepares, misses,
					  memory_order_relaxed);
	}
	goto out;
out_unlock:
	pthread_mutex_unlock(&pool->lock);
out:
	if (prep != prep_small)
		sbi_meta_free(prep, n);
	return r;
}

void sbi_pool_ref(struct sb_pool *pool, const sbi_pid *pids, size_t n)
{
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n; k++)
		if (pids[k])
			sbi_pid_heap(pool, pids[k] - 1)
				->refs[sbi_pid_index(pool, pids[k] - 1)]++;
	pthread_mutex_unlock(&pool->lock);
}

/* pids are stored plus one (page-table form); 0 entries are skipped. */
void sbi_pool_put(struct sb_pool *pool, const sbi_pid *pids, size_t n)
{
	bool freed = false;

	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n; k++) {
		struct sbi_heap *h;
		uint32_t i;

		if (!pids[k])
			continue;
		h = sbi_pid_heap(pool, pids[k] - 1);
		i = sbi_pid_index(pool, pids[k] - 1);
		if (--h->refs[i])
			continue;
		h->state[i] = SBI_PG_DIRTY;
		h->owner[i] = 0;	/* a page-in's mark */
		h->nused--;
		h->ndirty++;
		pool->used--;
		pool->dirty++;
		freed = true;
	}
	pool->alloc_seq++;
	if (freed && pool->ready_idle)
		pthread_cond_signal(&pool->ready_cond);
	pthread_mutex_unlock(&pool->lock);
}

void sbi_pool_evicted(struct sb_pool *pool, const sbi_pid *pids, size_t n)
{
	/* The memory goes first: the accounting never shows less than the
	 * pool holds. Nothing else touches these pages meanwhile. */
	for (size_t k = 0; k < n; k++)
		sbi_heap_punch(sbi_pid_heap(pool, pids[k]),
			       sbi_pid_index(pool, pids[k]), 1, pool->page_size);
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n; k++) {
		struct sbi_heap *h = sbi_pid_heap(pool, pids[k]);
		uint32_t i = sbi_pid_index(pool, pids[k]);

		h->state[i] = SBI_PG_EVICTED;
		h->nused--;
		h->nevicted++;
		pool->used--;
		pool->resident--;
		pool->evicted++;
		__atomic_store_n(&h->raddr[i], 0, __ATOMIC_RELAXED);
	}
	pool->alloc_seq++;
	pthread_mutex_unlock(&pool->lock);
}

void sbi_pool_drop_evicted(struct sb_pool *pool, const sbi_pid *pids,
			   size_t n)
{
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n; k++) {
		struct sbi_heap *h = sbi_pid_heap(pool, pids[k]);
		uint32_t i = sbi_pid_index(pool, pids[k]);

		h->state[i] = SBI_PG_UNBACKED;	/* punched at eviction */
		h->refs[i] = 0;
		h->owner[i] = 0;
		h->nevicted--;
		pool->evicted--;
	}
	pool->alloc_seq++;
	pthread_mutex_unlock(&pool->lock);
}

void sbi_pool_mark_io(struct sb_pool *pool, sbi_pid pid, bool on)
{
	pthread_mutex_lock(&pool->lock);
	sbi_pid_heap(pool, pid)->owner[sbi_pid_index(pool, pid)] =
		on ? SBI_OWNER_IO : 0;
	pthread_mutex_unlock(&pool->lock);
}

uint32_t sbi_pool_refs(struct sb_pool *pool, sbi_pid p)
{
	uint32_t r;

	pthread_mutex_lock(&pool->lock);
	r = sbi_pid_heap(pool, p)->refs[sbi_pid_index(pool, p)];
	pthread_mutex_unlock(&pool->lock);
	return r;
}

/* ---- creation and teardown ----------------------------------------------- */

static int check_numa(int node)
{
	if (node < 0)
		return 0;
	if (numa_available() < 0)
		return node == 0 ? 0 : -EINVAL;
	if (node > numa_max_node() ||
	    !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node))
		return -EINVAL;
	return 0;
}

static int start_threads(struct sb_pool *pool)
{
	int r = sbi_fault_start(pool);

	if (r == 0) {
		r = sbi_thread_start(&pool->ready_thread, sbi_ready_thread,
				     pool, "sb-ready", -1);
		if (r < 0)
			sbi_fault_stop(pool);
	}
	return r;
}

static void free_pool(struct sb_pool *pool)
{
	sbi_stat_close(pool);
	if (pool->uffd >= 0)
		close(pool->uffd);
	if (pool->uffd_sigbus >= 0)
		close(pool->uffd_sigbus);
	if (pool->quit_fd >= 0)
		close(pool->quit_fd);
	sbi_meta_free(pool->heaps, pool->heap_cap * sizeof(*pool->heaps));
	for (int q = 0; q < 2; q++)
		sbi_meta_free(pool->wanted[q].pid,
			      pool->wanted[q].cap * sizeof(sbi_pid));
	sbi_meta_free(pool->pf, pool->pf_cap * sizeof(*pool->pf));
	free(pool->reg);
	free(pool->spill_dir);
	pthread_mutex_destroy(&pool->disk_lock);
	pthread_rwlock_destroy(&pool->layout);
	pthread_rwlock_destroy(&pool->reg_lock);
	pthread_mutex_destroy(&pool->lock);
	pthread_mutex_destroy(&pool->pf_lock);
	pthread_cond_destroy(&pool->pf_cond);
	pthread_cond_destroy(&pool->ready_cond);
	pthread_cond_destroy(&pool->busy_cond);
	free(pool);
}

static _Atomic unsigned next_pool_id;

static struct sb_pool *fail(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

static struct sb_pool *pool_create(const struct sb_pool_opts *opts,
				   int *err);

SB_API struct sb_pool *sb_pool_create_sz(const struct sb_pool_opts *opts,
					 size_t size, int *err)
{
	struct sb_pool_opts o;
	int r;

	if (!opts)
		return fail(err, -EINVAL);
	r = sbi_struct_in(&o, sizeof(o), opts, size, SBI_SIZE_POOL_OPTS_0_1);
	if (r < 0)
		return fail(err, r);
	return pool_create(&o, err);
}

SB_API struct sb_pool *sb_pool_create(const struct sb_pool_opts *opts,
				      int *err)
{
	return sb_pool_create_sz(opts, SBI_SIZE_POOL_OPTS_0_1, err);
}

static struct sb_pool *pool_create(const struct sb_pool_opts *opts,
				   int *err)
{
	const struct sb_features *f = sbi_features();
	struct sb_pool *pool;
	const char *why;
	pthread_condattr_t ca;
	int r;

	if (!opts)
		return fail(err, -EINVAL);
	why = sbi_opts_check(opts);
	if (why) {
		sbi_info("sb_pool_create: %s", why);
		return fail(err, -EINVAL);
	}
	if (check_numa(opts->numa_node) < 0) {
		sbi_info("sb_pool_create: NUMA node %d does not exist",
			 opts->numa_node);
		return fail(err, -EINVAL);
	}
	if (f->uffd_mode == SB_UFFD_NONE) {
		sbi_err("userfaultfd is unavailable (%s); run sparsebuf-info",
			strerror(-f->uffd_error));
		return fail(err, f->uffd_error ? f->uffd_error : -ENOSYS);
	}
	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return fail(err, -ENOMEM);
	pool->uffd = pool->uffd_sigbus = pool->quit_fd = -1;
	pool->id = atomic_fetch_add(&next_pool_id, 1) + 1;
	sbi_stat_open(pool);
	pool->page_size = opts->page_size;
	pool->heap_size = opts->heap_size;
	pool->page_shift = (uint32_t)__builtin_ctzl(opts->page_size);
	pool->pages_per_heap = (uint32_t)(opts->heap_size / opts->page_size);
	/* The pages come from the page source; so does the budget. */
	pool->source = sbi_memfd_source();
	pool->max_bytes =
		pool->source.ops->budget(pool->source.ctx, opts->max_bytes);
	pool->max_pages =
		pool->max_bytes ? pool->max_bytes >> pool->page_shift : SIZE_MAX;
	pool->numa_node = opts->numa_node;
	pool->can_wp = f->wp_shmem;
	pool->can_poison = f->poison;
	pool->can_recycle = sbi_env_recycle() &&
			    (f->uffd_features & UFFD_FEATURE_MINOR_SHMEM);
	pool->fork_gen = atomic_load(&sbi_fork_gen);
	/* Page ids plus one must fit in 32 bits. */
	pool->heap_cap = (uint32_t)(0xfffffffeu / pool->pages_per_heap);
	if (pool->heap_cap > (1u << 20))
		pool->heap_cap = 1u << 20;
	pool->ready_min = ((size_t)1 << 20) >> pool->page_shift;
	if (pool->ready_min < 1)
		pool->ready_min = 1;
	/* 12 MiB: what a pool holds beyond its pages in use stays small
	 * (docs/design.md, "The ready reserve"; a KV cache's lookahead adds
	 * up to a page per region). Growth that outruns it has the caller
	 * prepare pages: tens of microseconds each. */
	pool->ready_max = ((size_t)12 << 20) >> pool->page_shift;
	if (pool->ready_max < 2 * pool->ready_min)
		pool->ready_max = 2 * pool->ready_min;
	pool->ready_target = pool->ready_min;
	pool->grow_due_ms = UINT64_MAX;
	pool->wanted[0].cap = pool->wanted[1].cap = 4096;
	pool->pf_cap = 4096;
	pool->caller_cpu = -1;
	pool->next_buf_id = 1;

	pthread_rwlock_init(&pool->layout, NULL);
	pthread_rwlock_init(&pool->reg_lock, NULL);
	pthread_mutex_init(&pool->lock, NULL);
	pthread_mutex_init(&pool->pf_lock, NULL);
	pthread_mutex_init(&pool->disk_lock, NULL);
	SBI_LK_RANK(&pool->layout, SBI_RANK_LAYOUT, pool->id);
	SBI_LK_RANK(&pool->reg_lock, SBI_RANK_REG, pool->id);
	SBI_LK_RANK(&pool->lock, SBI_RANK_POOL, pool->id);
	SBI_LK_RANK(&pool->pf_lock, SBI_RANK_LEAF, pool->id);
	pthread_cond_init(&pool->pf_cond, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pool->ready_cond, &ca);
	pthread_cond_init(&pool->busy_cond, &ca);
	pthread_condattr_destroy(&ca);

	pool->heaps = sbi_meta_alloc(pool->heap_cap * sizeof(*pool->heaps),
				     true);
	for (int q = 0; q < 2; q++)
		pool->wanted[q].pid = sbi_meta_alloc(
			pool->wanted[q].cap * sizeof(sbi_pid), false);
	pool->pf = sbi_meta_alloc(pool->pf_cap * sizeof(*pool->pf), false);
	if (opts->spill_dir && !(pool->spill_dir = strdup(opts->spill_dir))) {
		r = -ENOMEM;
		goto out;
	}
	if (!pool->heaps || !pool->wanted[0].pid || !pool->wanted[1].pid ||
	    !pool->pf) {
		r = -ENOMEM;
		goto out;
	}
	pool->uffd = r = sbi_uffd_open(UFFD_FEATURE_WP_HUGETLBFS_SHMEM |
				       UFFD_FEATURE_POISON |
				       UFFD_FEATURE_MINOR_SHMEM);
	if (r < 0)
		goto out;
	pool->uffd_sigbus = r = sbi_uffd_open(UFFD_FEATURE_SIGBUS |
					      UFFD_FEATURE_WP_HUGETLBFS_SHMEM);
	if (r < 0)
		goto out;
	pool->quit_fd = r = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (r < 0) {
		r = -errno;
		goto out;
	}
	r = start_threads(pool);
	if (r < 0)
		goto out;
	sbi_process_add_pool(pool);
	return pool;
out:
	free_pool(pool);
	return fail(err, r);
}

SB_API void sb_pool_destroy(struct sb_pool *pool)
{
	if (!pool)
		return;
	if (sbi_pool_check(pool) < 0) {
		/* A child's copy of its parent's pool: the fork handler
		 * already closed its descriptors; nothing else is ours. */
		return;
	}
	sbi_process_remove_pool(pool);
	for (;;) {
		struct sb_buf *buf = NULL;

		pthread_rwlock_rdlock(&pool->reg_lock);
		if (pool->nreg)
			buf = pool->reg[0].buf;
		pthread_rwlock_unlock(&pool->reg_lock);
		if (!buf)
			break;
		sb_buf_destroy(buf);
	}
	sbi_disk_destroy(pool);
	pthread_mutex_lock(&pool->lock);
	pool->stopping = true;
	pthread_cond_broadcast(&pool->ready_cond);
	pthread_mutex_unlock(&pool->lock);
	sbi_fault_stop(pool);
	pthread_join(pool->ready_thread, NULL);
	for (uint32_t s = 0; s < pool->heap_hi; s++)
		if (pool->heaps[s])
			sbi_heap_destroy(&pool->source, pool->heaps[s],
					 pool->page_size);
	free_pool(pool);
}

/* ---- accounting ------------------------------------------------------------ */

static uint64_t counter(_Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

static int pool_stats(struct sb_pool *pool, struct sb_stats *st);

SB_API int sb_pool_stats_sz(struct sb_pool *pool, struct sb_stats *st,
			    size_t size)
{
	struct sb_stats s;
	int r;

	if (!pool || !st)
		return -EINVAL;
	r = pool_stats(pool, &s);
	if (r < 0)
		return r;
	return sbi_struct_out(st, size, &s, sizeof(s), SBI_SIZE_STATS_0_1);
}

SB_API int sb_pool_stats(struct sb_pool *pool, struct sb_stats *st)
{
	return sb_pool_stats_sz(pool, st, SBI_SIZE_STATS_0_1);
}

static int pool_stats(struct sb_pool *pool, struct sb_stats *st)
{
	int r;

	if (!pool || !st)
		return -EINVAL;
	if ((r = sbi_pool_check(pool)) < 0)
		return r;
	pthread_mutex_lock(&pool->lock);
	sbi_pool_stats_locked(pool, st);
	pthread_mutex_unlock(&pool->lock);
	return 0;
}

void sbi_pool_stats_locked(struct sb_pool *pool, struct sb_stats *st)
{
	SBI_HELD(&pool->lock);
	memset(st, 0, sizeof(*st));
	st->page_size = pool->page_size;
	st->heaps = pool->nheaps;
	st->pages_used = pool->used;
	st->bytes_resident = pool->resident << pool->page_shift;
	st->pages_ready = pool->ready;
	st->max_bytes = pool->max_bytes;
	st->faults = counter(&pool->n_faults);
	st->maps = counter(&pool->n_maps);
	st->unmaps = counter(&pool->n_unmaps);
	st->cow_copies = counter(&pool->n_cow);
	st->fault_places = counter(&pool->n_fault_places);
	st->sigbus = counter(&pool->n_sigbus);
	st->sync_prepares = counter(&pool->n_sync_prepares);
	st->pages_in = counter(&pool->n_pages_in);
	st->pages_out = counter(&pool->n_pages_out);
	st->bytes_read = counter(&pool->n_bytes_read);
	st->bytes_written = counter(&pool->n_bytes_written);
	st->io_errors = counter(&pool->n_io_errors);
	st->pages_dropped = counter(&pool->n_dropped);
	st->spill_bytes = sbi_disk_spill_bytes(pool);
}

SB_API long sb_pool_trim(struct sb_pool *pool)
{
	size_t pages;
	int r;

	if (!pool)
		return -EINVAL;
	if ((r = sbi_pool_check(pool)) < 0)
		return r;
	pthread_mutex_lock(&pool->lock);
	pages = sbi_ready_trim(pool, false, true);
	pthread_mutex_unlock(&pool->lock);
	return (long)(pages << pool->page_shift);
}

SB_API long sb_pool_reserve(struct sb_pool *pool, long delta_bytes)
{
	long pages;
	int r;

	if (!pool)
		return -EINVAL;
	if ((r = sbi_pool_check(pool)) < 0)
		return r;
	pages = delta_bytes / (long)pool->page_size +
		(delta_bytes % (long)pool->page_size > 0);
	pthread_mutex_lock(&pool->lock);
	if (pages < 0 && (size_t)-pages > pool->ready_floor) {
		pool->ready_floor = 0;
	} else if (pages > 0 &&
		   (size_t)pages > (size_t)(LONG_MAX >> pool->page_shift) -
					   pool->ready_floor) {
		/* The floor in bytes would not fit the return value. */
		pthread_mutex_unlock(&pool->lock);
		return -ERANGE;
	} else {
		pool->ready_floor = (size_t)((long)pool->ready_floor + pages);
	}
	if (pool->ready_target < pool->ready_floor)
		pool->ready_target = pool->ready_floor;
	pthread_cond_signal(&pool->ready_cond);
	pages = (long)pool->ready_floor;
	pthread_mutex_unlock(&pool->lock);
	return pages * (long)pool->page_size;
}

static __thread bool internal_thread;

void sbi_thread_internal(void)
{
	internal_thread = true;
}

void sbi_pool_note_caller(struct sb_pool *pool)
{
	if (internal_thread)
		return;
	__atomic_store_n(&pool->caller_cpu, sched_getcpu(), __ATOMIC_RELAXED);
}

void sbi_vma_fg_begin(struct sb_pool *pool)
{
	atomic_fetch_add_explicit(&pool->fg_vma, 1, memory_order_relaxed);
}

void sbi_vma_fg_end(struct sb_pool *pool)
{
	atomic_fetch_sub_explicit(&pool->fg_vma, 1, memory_order_relaxed);
}

void sbi_vma_bg_yield(struct sb_pool *pool)
{
	struct timespec t0, t;

	if (!atomic_load_explicit(&pool->fg_vma, memory_order_relaxed))
		return;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		for (int k = 0; k < 64; k++)
			__builtin_ia32_pause();
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (atomic_load_explicit(&pool->fg_vma, memory_order_relaxed) &&
		 (t.tv_sec - t0.tv_sec) * 1000000000L + t.tv_nsec - t0.tv_nsec <
			 2000000L);
}

void sbi_pool_wait_ready(struct sb_pool *pool, size_t pages, int timeout_ms)
{
	struct timespec until;

	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&pool->lock);
	if (pages > sbi_ready_cap(pool))
		pages = sbi_ready_cap(pool);
	if (pool->ready_idle)
		pthread_cond_signal(&pool->ready_cond);
	while (pool->ready < pages && pool->resident < pool->max_pages &&
	       pthread_cond_timedwait(&pool->busy_cond, &pool->lock, &until) !=
		       ETIMEDOUT)
		;
	pthread_mutex_unlock(&pool->lock);
}

struct sb_buf *sbi_pool_lookup(struct sb_pool *pool, uintptr_t addr)
{
	SBI_HELD(&pool->reg_lock);
	size_t lo = 0, hi = pool->nreg;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (addr < pool->reg[mid].start)
			hi = mid;
		else if (addr >= pool->reg[mid].end)
			lo = mid + 1;
		else
			return pool->reg[mid].buf;
	}
	return NULL;
}
