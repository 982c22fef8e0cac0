/* SPDX-License-Identifier: MIT */
/*
 * The pool's page allocator: its heaps (from the page source), runs,
 * allocation, references for shared pages, the budget, the counters. The
 * pool's life (creation, threads, teardown) and its public calls are in
 * pool_life.c, above everything that uses pages.
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
#include "dproto.h"
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
	return h->state[i] != SBI_PG_USED && h->state[i] != SBI_PG_EVICTED &&
	       h->state[i] != SBI_PG_FOREIGN;
}

/* ---- heaps ------------------------------------------------------------- */

/* A free heap slot, or heap_cap. */
static uint32_t free_slot(struct sb_pool *pool)
{
	uint32_t slot;

	for (slot = 0; slot < pool->heap_hi && pool->heaps[slot]; slot++)
		;
	return slot;
}

int sbi_pool_add_foreign(struct sb_pool *pool, struct sbi_heap *h)
{
	SBI_HELD(&pool->lock);
	uint32_t slot = free_slot(pool);

	if (slot == pool->heap_cap || h->npages > pool->pages_per_heap)
		return -ENOMEM;
	h->slot = slot;
	h->serial = ++pool->heap_serial;
	pool->heaps[slot] = h;
	if (slot == pool->heap_hi)
		pool->heap_hi++;
	return 0;
}

/* Put a heap of the pool's own in a free slot; pool->lock held. 0, or
 * -ENOMEM when every slot is taken. */
static int insert_heap(struct sb_pool *pool, struct sbi_heap *h)
{
	SBI_HELD(&pool->lock);
	uint32_t slot = free_slot(pool);

	if (slot == pool->heap_cap)
		return -ENOMEM;
	h->slot = slot;
	h->serial = ++pool->heap_serial;
	pool->heaps[slot] = h;
	pool->nheaps++;
	if (slot == pool->heap_hi)
		pool->heap_hi++;
	return 0;
}

/* Add a heap; pool->lock held. */
struct sbi_heap *sbi_pool_add_heap(struct sb_pool *pool, int *err)
{
	SBI_HELD(&pool->lock);
	struct sbi_heap *h;

	if (free_slot(pool) == pool->heap_cap) {
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
	insert_heap(pool, h);	/* the slot found above is still free */
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
 * A site that starts at a ready page no run holds, with room for want
 * pages, and not where a page in use will grow: the pages a run made
 * ready ahead of itself before its buffer went away. They fill the
 * reserve, so the ready thread readies nothing more while they sit
 * there, and a run started elsewhere prepared a tenth of its pages on
 * the caller (bench/place, the buffer grown after another was
 * destroyed); started here, it takes them. pool->lock held.
 */
static bool ready_site(struct sb_pool *pool, uint32_t want,
		       struct sbi_heap **hp, uint32_t *startp, uint32_t *lenp)
{
	SBI_HELD(&pool->lock);
	for (uint32_t s = 0; s < pool->heap_hi; s++) {
		struct sbi_heap *h = pool->heaps[s];
		const uint8_t *p, *end;

		if (!h || !h->nready)
			continue;
		end = h->state + h->npages;
		for (p = h->state; (p = memchr(p, SBI_PG_READY,
					       (size_t)(end - p)));
		     p++) {
			uint32_t i = (uint32_t)(p - h->state), j = i;

			if (h->owner[i] ||
			    (i && (!page_free(h, i - 1) || h->owner[i - 1])))
				continue;
			while (j < h->npages && page_free(h, j) && !h->owner[j])
				j++;
			if (j - i >= want) {
				*hp = h, *startp = i, *lenp = j - i;
				return true;
			}
		}
	}
	return false;
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
	if (ready_site(pool, want, hp, startp, lenp))
		return true;
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

/* A free page worth making ready, for the ready thread (prio 0: needed
 * next, 1: after that). */
void sbi_ready_want(struct sb_pool *pool, sbi_pid p, int prio)
{
	SBI_HELD(&pool->lock);
	struct sbi_ring *q = &pool->wanted[prio];
	uint32_t next = (q->tail + 1) % q->cap;

	if (next == q->head)
		return;	/* full: a hint, not a promise */
	q->pid[q->tail] = p;
	q->tail = next;
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

void sbi_page_set_busy(struct sb_pool *pool, struct sbi_heap *h, uint32_t i)
{
	SBI_HELD(&pool->lock);
	sbi_page_unfree(pool, h, i);
	h->state[i] = SBI_PG_BUSY;
	h->nbusy++;
}

void sbi_page_set_done(struct sb_pool *pool, struct sbi_heap *h, uint32_t i,
		       enum sbi_page_state st)
{
	SBI_HELD(&pool->lock);
	h->state[i] = (uint8_t)st;
	h->nbusy--;
	pool->busy_gen++;
	if (st == SBI_PG_READY) {
		h->nready++;
		pool->ready++;
	} else {	/* UNBACKED */
		pool->resident--;
	}
	pthread_cond_broadcast(&pool->busy_cond);
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

bool sbi_pool_find_free(struct sb_pool *pool, enum sbi_page_state st,
			const struct sb_buf *buf, sbi_pid *out)
{
	SBI_HELD(&pool->lock);
	for (uint32_t s = 0; s < pool->heap_hi; s++) {
		struct sbi_heap *h = pool->heaps[s];
		const uint8_t *p, *end;

		if (!h || !(st == SBI_PG_READY ? h->nready : h->ndirty))
			continue;
		end = h->state + h->npages;
		for (p = h->state; (p = memchr(p, st, (size_t)(end - p))); p++) {
			uint32_t i = (uint32_t)(p - h->state);

			if (!buf || !h->owner[i] || h->owner[i] == buf->id) {
				*out = s * pool->pages_per_heap + i;
				return true;
			}
		}
	}
	return false;
}

/* Any free backed page, a freed one first for a page that will be
 * overwritten (a zeroed one first otherwise: no zeroing either way); else
 * whether some page is busy (one may come free); pool->lock held. */
static bool find_backed(struct sb_pool *pool, sbi_pid *out, bool *busy,
			unsigned flags)
{
	enum sbi_page_state first = flags & SBI_ALLOC_OVERWRITE ? SBI_PG_DIRTY
								: SBI_PG_READY;

	SBI_HELD(&pool->lock);
	if (sbi_pool_find_free(pool, first, NULL, out) ||
	    sbi_pool_find_free(pool, first == SBI_PG_DIRTY ? SBI_PG_READY
							  : SBI_PG_DIRTY,
			       NULL, out))
		return true;
	*busy = false;
	for (uint32_t s = 0; s < pool->heap_hi; s++)
		*busy |= pool->heaps[s] && pool->heaps[s]->nbusy > 0;
	return false;
}

/* Whether a page-in should take a freed page rather than allocate one. */
static bool overwrite_dirty(const struct sb_pool *pool, unsigned flags)
{
	return (flags & SBI_ALLOC_OVERWRITE) && pool->dirty;
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
 * Take the EVICTED page p (a home page, home.c: its buffer page reads into
 * it) for one holder, under the budget: -EDQUOT when used pages leave no
 * room. Its memory comes when the read fills it; if the pool holds its
 * budget's worth of memory already, a free page's memory goes first
 * (punched, BUSY meanwhile). pool->lock held.
 */
static int take_home(struct sb_pool *pool, sbi_pid p, unsigned flags)
{
	SBI_HELD(&pool->lock);
	struct sbi_heap *h = sbi_pid_heap(pool, p);
	uint32_t i = sbi_pid_index(pool, p);

	/* The lock is let go below: others may take the room meanwhile. */
	while (pool->used + 1 <= pool->max_pages &&
	       pool->resident >= pool->max_pages) {
		struct sbi_heap *fh;
		sbi_pid f;
		bool busy;

		/* Used pages leave room, so some free page holds memory,
		 * or is being given some. */
		if (!find_backed(pool, &f, &busy, SBI_ALLOC_OVERWRITE)) {
			if (!busy)
				return -EDQUOT;	/* never wait for nothing */
			wait_busy(pool, flags);
			continue;
		}
		fh = sbi_pid_heap(pool, f);
		sbi_page_set_busy(pool, fh, sbi_pid_index(pool, f));
		pthread_mutex_unlock(&pool->lock);
		sbi_heap_punch(fh, sbi_pid_index(pool, f), 1, pool->page_size);
		pthread_mutex_lock(&pool->lock);
		sbi_page_set_done(pool, fh, sbi_pid_index(pool, f),
				  SBI_PG_UNBACKED);
	}
	if (pool->used + 1 > pool->max_pages)
		return -EDQUOT;
	h->state[i] = SBI_PG_USED;
	h->nevicted--;
	h->nused++;
	pool->evicted--;
	pool->used++;
	pool->resident++;
	return 0;
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

/*
 * An owner at its growing buffer's end waits for this page, past its
 * growth watch (SBI_ALLOC_URGENT), and the next page of its run needs
 * zeroing: take a ready page elsewhere instead. Zeroing 256 KiB here cost
 * the owner 0.24-1.08 ms at a crossing where every region of a KV cache
 * wants a page; a mapping of a ready page costs 0.1-0.2 ms. The price is
 * mappings (the run breaks around the page, and the other run's may too),
 * hence the owner's allowance (sbi_grow_urgent). Preference, so that no
 * one pays soon for what this owner saves: a ready page that nobody's run
 * continues into (not earmarked, not right after a used page), then a
 * page another run needs only after its next one, then another run's next
 * page (that buffer's watch prepares another in the background); never one
 * of its own run, which comes in turn. One scan, stopped at the first page
 * of the best kind; a scan that found nothing is not repeated until the
 * ready thread made another page ready (steal_fail). The next allocation
 * goes back to the run (run_resume). Sets *out; pool->lock held.
 */
static bool steal_ready(struct sb_pool *pool, struct sb_buf *buf,
			const struct sbi_heap *hh, uint32_t hi, unsigned flags,
			sbi_pid *out)
{
	SBI_HELD(&pool->lock);
	int best = 3;	/* the preference class of *out; 3: none */

	if (!(flags & SBI_ALLOC_URGENT) || !pool->ready ||
	    (hh->state[hi] != SBI_PG_UNBACKED &&
	     hh->state[hi] != SBI_PG_DIRTY) ||
	    buf->steal_fail == pool->busy_gen + 1)
		return false;	/* ready, being made ready (soon), or no
				 * page made ready since the last search */
	for (uint32_t s = 0; s < pool->heap_hi && best; s++) {
		struct sbi_heap *h = pool->heaps[s];
		const uint8_t *p, *end;

		if (!h || !h->nready)
			continue;
		end = h->state + h->npages;
		for (p = h->state; best && (p = memchr(p, SBI_PG_READY,
						      (size_t)(end - p)));
		     p++) {
			uint32_t i = (uint32_t)(p - h->state);
			uint32_t o = h->owner[i];
			bool next = i && h->state[i - 1] == SBI_PG_USED;
			int cls = next ? 2 : o ? 1 : 0;

			if (o != buf->id && cls < best) {
				best = cls;
				*out = s * pool->pages_per_heap + i;
			}
		}
	}
	if (best == 3) {
		buf->steal_fail = pool->busy_gen + 1;
		return false;
	}
	__atomic_add_fetch(&buf->steals, 1, __ATOMIC_RELAXED);
	buf->run_resume = true;
	pool->steals++;
	return true;
}

static int alloc_one(struct sb_pool *pool, struct sb_buf *buf, sbi_pid *hint,
		     bool have_hint, sbi_pid *out, unsigned flags,
		     bool *scattered)
{
	bool tried_cursor = false;

	/* The first page of a page-in request (SCATTER) overwrites every
	 * byte: a freed page as it is costs nothing, where the next page of
	 * a run, unbacked, costs an allocation and zeroing (and memory
	 * punched meanwhile comes back from the host cold). Pages freed
	 * lately are kept for this (ready.c). The request's other pages,
	 * read ahead or in its range, continue the run from there: a
	 * sequential stream keeps one mapping per request, not one per page
	 * (vm.max_map_count). */
	if ((flags & SBI_ALLOC_SCATTER) && overwrite_dirty(pool, flags) &&
	    !(have_hint && usable(hint_heap(pool, *hint),
				  sbi_pid_index(pool, *hint), buf) &&
	      hint_heap(pool, *hint)->state[sbi_pid_index(pool, *hint)] !=
		      SBI_PG_UNBACKED) &&
	    sbi_pool_find_free(pool, SBI_PG_DIRTY, buf, out)) {
		*scattered = true;
		return take_page(pool, sbi_pid_heap(pool, *out),
				 sbi_pid_index(pool, *out), flags);
	}
	/* The page before was taken out of turn (steal_ready): continue the
	 * run it left, or claim a new one, not the page after it (someone
	 * else's next). Cleared once an allocation succeeds (the caller
	 * may retry this one: a client's lease, a failed zeroing). */
	if (buf->run_resume) {
		tried_cursor = true;
		have_hint = run_cursor(pool, buf, hint);
	}

	for (;;) {
		struct sbi_heap *h = NULL;
		uint32_t i = 0;
		bool busy;
		int r;

		if (flags & SBI_ALLOC_BACKED) {
			if (find_backed(pool, out, &busy, flags))
				return take_page(pool, sbi_pid_heap(pool, *out),
						 sbi_pid_index(pool, *out),
						 flags);
			if (!busy)
				return -EDQUOT;
			wait_busy(pool, flags);
			continue;
		}
		if (have_hint) {
			h = hint_heap(pool, *hint);
			i = sbi_pid_index(pool, *hint);
		}
		if (usable(h, i, buf)) {
			if (steal_ready(pool, buf, h, i, flags, out))
				return take_page(pool, sbi_pid_heap(pool, *out),
						 sbi_pid_index(pool, *out),
						 flags);
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
			/* A client whose lease may grow: more lease first
			 * (sbi_alloc), the run kept. */
			if (pool->client && !(flags & SBI_ALLOC_LEASED) &&
			    !pool->daemon_local &&
			    pool->max_pages < pool->ceiling_pages)
				return -EDQUOT;
			/* At the budget: only a page that already has
			 * memory will do, wherever it is. */
			if (find_backed(pool, out, &busy, flags)) {
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

int sbi_pool_alloc(struct sb_pool *pool, struct sb_buf *buf, sbi_ptref hint1,
		   size_t n, sbi_pid *out, unsigned flags)
{
	uint8_t prep_small[64], *prep = prep_small;
	bool have_hint = !sbi_ptref_none(hint1);
	sbi_pid hint = have_hint ? sbi_ptref_pid(hint1) : 0;
	size_t got = 0, misses = 0;
	uint64_t steals;
	bool scattered = false;
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
	if (flags & SBI_ALLOC_HOME) {
		r = take_home(pool, hint, flags);
		out[0] = hint;
		goto out_unlock;
	}
	steals = pool->steals;
	for (got = 0; got < n; got++) {
		/* Continue after the previous page, within its heap. */
		if (have_hint && sbi_pid_index(pool, ++hint) == 0)
			have_hint = false;
		scattered = false;
		r = alloc_one(pool, buf, &hint, have_hint, &out[got], flags,
			      &scattered);
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
	if (pool->steals == steals)
		buf->run_resume = false;	/* back in its run */
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

		if (scattered) {
			/* A freed page taken out of any run: the next
			 * page-in takes one too, nothing to make ready. */
		} else if (buf->run_resume) {
			/* A page taken out of turn: the next comes from the
			 * run it left (alloc_one), or from the next run. */
			if (run_cursor(pool, buf, &next) ||
			    claim_run(pool, buf, next_run_pages(pool, buf),
				      &next) == 0) {
				sbi_ready_want(pool, next, 0);
				if (usable(sbi_pid_heap(pool, next),
					   sbi_pid_index(pool, next) + 1, buf))
					sbi_ready_want(pool, next + 1, 1);
			}
		} else if (usable(h, i + 1, buf)) {
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
	if (flags & SBI_ALLOC_OVERWRITE)
		pool->overwrites += n;
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

		if (prep[k] == PREP_BACK)
			r = sbi_heap_back(h, i, 1, pool->page_size,
					  pool->big_folios);
		else if (prep[k] == PREP_ZERO)
			r = sbi_heap_zero(h, i, 1, pool->page_size);
	}
	if (r < 0) {
		/* Said at most once a second: out of huge pages (a pool of
		 * them) is as ordinary as a full budget, and every placement
		 * then comes here. */
		if (sbi_log_gate(SBI_LOG_WARN, &pool->heap_log_ms))
			sbi_warn("no memory for a heap page: %s%s",
				 strerror(-r),
				 pool->hugetlb ? " (no huge page free: "
						 "vm.nr_hugepages)"
					       : "");
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
	} else {
		if (misses && !sbi_ready_self)
			atomic_fetch_add_explicit(&pool->n_sync_prepares,
						  misses, memory_order_relaxed);
		/* The system gave a huge page again (alloc.c). */
		for (size_t k = 0; pool->hugetlb && k < n; k++)
			if (prep[k] == PREP_BACK) {
				atomic_store_explicit(&pool->hugetlb_short,
						      false,
						      memory_order_relaxed);
				break;
			}
	}
	goto out;
out_unlock:
	pthread_mutex_unlock(&pool->lock);
out:
	if (prep != prep_small)
		sbi_meta_free(prep, n);
	return r;
}

void sbi_pool_ref(struct sb_pool *pool, const sbi_ptref *refs, size_t n)
{
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n; k++)
		if (!sbi_ptref_none(refs[k])) {
			sbi_pid pid = sbi_ptref_pid(refs[k]);
			struct sbi_heap *h = sbi_pid_heap(pool, pid);

			if (!h->refs[sbi_pid_index(pool, pid)]++ &&
			    h->foreign)
				h->nheld++;
		}
	pthread_mutex_unlock(&pool->lock);
}

/* An imported window nothing here references: out of the pool (its
 * mapping and descriptor go after the lock, sbi_pool_put). */
static bool drop_foreign(struct sb_pool *pool, struct sbi_heap *h)
{
	SBI_HELD(&pool->lock);
	if (pool->heaps[h->slot] != h)
		return false;
	pool->heaps[h->slot] = NULL;
	while (pool->heap_hi && !pool->heaps[pool->heap_hi - 1])
		pool->heap_hi--;
	return true;
}

/*
 * Page i of the home heap h (home.c), which no buffer page holds any more:
 * a page that lost its home, let go by its last holder. Reserved for the
 * heap again (EVICTED, no reference), never free: another allocation
 * would write into it through the file or the pool side, and with large
 * folios (shmem_enabled set to within_size or always while the buffer is
 * open) get one spanning the holes of the evicted homes beside it, zeros
 * that a clean home maps without a fault. Punched under the lock, so that
 * it is never free, nor counted without the memory it has: only a page
 * shared out of a file buffer and let go on both sides comes here.
 * pool->lock held.
 */
static void reserve_home(struct sb_pool *pool, struct sbi_heap *h, uint32_t i)
{
	SBI_HELD(&pool->lock);
	sbi_heap_punch(h, i, 1, pool->page_size);
	h->state[i] = SBI_PG_EVICTED;
	h->owner[i] = 0;
	__atomic_store_n(&h->raddr[i], 0, __ATOMIC_RELAXED);
	h->nused--;
	h->nevicted++;
	pool->used--;
	pool->resident--;
	pool->evicted++;
}

void sbi_pool_put(struct sb_pool *pool, const sbi_ptref *refs, size_t n)
{
	struct sbi_heap *gone[8];
	size_t ngone = 0;
	bool freed = false;

	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n; k++) {
		struct sbi_heap *h;
		uint32_t i;

		if (sbi_ptref_none(refs[k]))
			continue;
		h = sbi_pid_heap(pool, sbi_ptref_pid(refs[k]));
		i = sbi_pid_index(pool, sbi_ptref_pid(refs[k]));
		if (--h->refs[i])
			continue;
		if (h->foreign) {
			/* An imported cache page (import.c) nobody here maps
			 * any more: the daemon's pins on it go. */
			if (h->owner[i])
				sbi_dclient_cache_unpin(pool->client, h->fgen,
							SBD_PREF(h->fid,
								 h->fbase + i),
							h->owner[i]);
			h->owner[i] = 0;
			/* The window's last page here: the window goes, so
			 * that no memory of the daemon's (a page the cache
			 * dropped, an earlier daemon's heap) stays alive
			 * through this process. */
			if (!--h->nheld && ngone < 8 && drop_foreign(pool, h))
				gone[ngone++] = h;
			continue;
		}
		if (h->home) {
			reserve_home(pool, h, i);
			continue;
		}
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
	while (ngone)
		sbi_heap_destroy(&pool->source, gone[--ngone], pool->page_size);
}

void sbi_pool_put1(struct sb_pool *pool, sbi_pid pid)
{
	sbi_ptref r = sbi_ptref_of(pid);

	sbi_pool_put(pool, &r, 1);
}

void sbi_pool_evicted(struct sb_pool *pool, const sbi_pid *pids, size_t n)
{
	/* The memory goes first: the accounting never shows less than the
	 * pool holds. Nothing else touches these pages meanwhile. */
	for (size_t k = 0; k < n; k++)
		sbi_heap_punch(sbi_pid_heap(pool, pids[k]),
			       sbi_pid_index(pool, pids[k]), 1, pool->page_size);
	sbi_pool_mark_evicted(pool, pids, n);
}

void sbi_pool_mark_evicted(struct sb_pool *pool, const sbi_pid *pids,
			   size_t n)
{
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
	pthread_mutex_unlock(&pool->lock);
}

void sbi_pool_drop_evicted(struct sb_pool *pool, const sbi_pid *pids,
			   size_t n)
{
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n; k++) {
		struct sbi_heap *h = sbi_pid_heap(pool, pids[k]);
		uint32_t i = sbi_pid_index(pool, pids[k]);

		h->refs[i] = 0;
		h->owner[i] = 0;
		if (h->home)
			continue;	/* reserved for it (reserve_home) */
		h->state[i] = SBI_PG_UNBACKED;	/* punched at eviction */
		h->nevicted--;
		pool->evicted--;
	}
	pthread_mutex_unlock(&pool->lock);
}

void sbi_pool_swap_kept(struct sb_pool *pool, sbi_pid from, sbi_pid kept)
{
	struct sbi_heap *fh = sbi_pid_heap(pool, from),
			*kh = sbi_pid_heap(pool, kept);
	uint32_t fi = sbi_pid_index(pool, from), ki = sbi_pid_index(pool, kept);

	/* The copy is in already: for a moment the pool holds one page more
	 * than it counts, never less. */
	sbi_heap_punch(fh, fi, 1, pool->page_size);
	pthread_mutex_lock(&pool->lock);
	fh->state[fi] = SBI_PG_UNBACKED;
	fh->refs[fi] = 0;
	fh->owner[fi] = 0;
	fh->nused--;
	__atomic_store_n(&fh->raddr[fi], 0, __ATOMIC_RELAXED);
	kh->state[ki] = SBI_PG_USED;
	kh->refs[ki] = 1;
	kh->owner[ki] = 0;
	kh->nevicted--;
	kh->nused++;
	pool->evicted--;
	pthread_mutex_unlock(&pool->lock);
}

/* ---- home heaps (home.c) --------------------------------------------------- */

int sbi_pool_add_home(struct sb_pool *pool, size_t npages, uint32_t *slots)
{
	uint32_t pph = pool->pages_per_heap;
	size_t nheaps = (npages + pph - 1) / pph, k, made;
	struct sbi_heap **h;
	int err = 0;

	if (!nheaps)
		return 0;
	h = calloc(nheaps, sizeof(*h));
	if (!h)
		return -ENOMEM;
	/* The memfds and their mappings first, without the pool's lock:
	 * up to 256 of them, which would hold up every allocation and fault
	 * of the pool meanwhile. Only the memfd source has home heaps. */
	for (made = 0; made < nheaps; made++) {
		h[made] = sbi_heap_create(&pool->source, pool->heap_size,
					  pool->page_size, pool->numa_node,
					  &err);
		if (!h[made]) {
			sbi_warn("cannot add a heap of %zu bytes: %s",
				 pool->heap_size, strerror(-err));
			break;
		}
	}
	pthread_mutex_lock(&pool->lock);
	for (k = 0; k < made && made == nheaps; k++) {
		uint32_t n = (uint32_t)(npages - k * pph < pph ? npages - k * pph
							       : pph);

		if (insert_heap(pool, h[k]) < 0) {
			err = -ENOMEM;
			break;
		}
		/* Each page reserved for the buffer page that maps it: held
		 * (one reference), no memory, never free for another. So is
		 * the last heap's tail, held by nobody (sbi_heap.home says
		 * why): a hole, which costs no memory and no budget. */
		memset(h[k]->state, SBI_PG_EVICTED, h[k]->npages);
		for (uint32_t i = 0; i < n; i++)
			h[k]->refs[i] = 1;
		h[k]->nevicted = h[k]->npages;
		h[k]->home = true;
		pool->evicted += h[k]->npages;
		slots[k] = h[k]->slot;
		h[k] = NULL;	/* the pool's */
	}
	if (k < nheaps) {
		/* Given back: empty heaps, which the ready thread lets go. */
		while (k--) {
			struct sbi_heap *g = pool->heaps[slots[k]];

			pool->evicted -= g->nevicted;
			memset(g->state, SBI_PG_UNBACKED, g->nevicted);
			memset(g->refs, 0, g->nevicted * sizeof(*g->refs));
			g->nevicted = 0;
			g->home = false;
		}
	}
	pthread_mutex_unlock(&pool->lock);
	for (k = 0; k < made; k++)
		if (h[k])
			sbi_heap_destroy(&pool->source, h[k], pool->page_size);
	free(h);
	return err;
}

void sbi_pool_home_gone(struct sb_pool *pool, const uint32_t *slots,
			size_t nheaps)
{
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < nheaps; k++) {
		struct sbi_heap *h = pool->heaps[slots[k]];

		h->home = false;
		for (uint32_t i = 0; i < h->npages; i++) {
			if (h->state[i] != SBI_PG_EVICTED || h->refs[i])
				continue;
			h->state[i] = SBI_PG_UNBACKED;	/* a hole already */
			h->nevicted--;
			pool->evicted--;
		}
	}
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

	struct sbi_heap *h;

	pthread_mutex_lock(&pool->lock);
	h = sbi_pid_heap(pool, p);
	/* An imported page has one more holder: the machine-wide cache. It
	 * is never anybody's alone (written in place, evicted, punched). */
	r = h->refs[sbi_pid_index(pool, p)] + h->foreign;
	pthread_mutex_unlock(&pool->lock);
	return r;
}

/* ---- accounting ------------------------------------------------------------ */

static uint64_t counter(_Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
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
	st->pages_touched = counter(&pool->n_touched);
	st->map_faults = counter(&pool->n_map_faults);
}

void sbi_pool_note_caller(struct sb_pool *pool)
{
	if (sbi_internal_thread)
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
