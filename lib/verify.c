/* SPDX-License-Identifier: MIT */
/*
 * Consistency check of a pool, for tests: every counter agrees with the
 * page states it summarises, and every page's reference count equals the
 * number of buffer pages that map it. Takes the layout lock for writing,
 * so no placement or fault is in flight while it looks.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define BAD(...) (snprintf(why, len, __VA_ARGS__), -EUCLEAN)

/* Whether page i of h has a hole (no memory) anywhere in it. */
static bool has_hole(const struct sbi_heap *h, uint32_t i, size_t page_size)
{
	off_t off = (off_t)h->foff + (off_t)((size_t)i * page_size);
	off_t hole = lseek(h->fd, off, SEEK_HOLE);

	return hole >= 0 && hole < off + (off_t)page_size;
}

static int check_heaps(struct sb_pool *pool, char *why, size_t len)
{
	size_t used = 0, ready = 0, dirty = 0, resident = 0, nheaps = 0;
	size_t evicted = 0;

	for (uint32_t s = 0; s < pool->heap_hi; s++) {
		struct sbi_heap *h = pool->heaps[s];
		uint32_t n[SBI_PG_EVICTED + 1] = {0};

		if (!h || h->foreign)
			continue;
		nheaps++;
		for (uint32_t i = 0; i < h->npages; i++) {
			bool held = h->state[i] == SBI_PG_USED ||
				    h->state[i] == SBI_PG_EVICTED;
			/* A home heap's page that no buffer page names,
			 * reserved for the heap (pool.c, reserve_home). */
			bool reserved = h->home &&
					h->state[i] == SBI_PG_EVICTED &&
					!h->refs[i];

			if (h->state[i] > SBI_PG_EVICTED)
				return BAD("heap %u page %u: state %u", s, i,
					   h->state[i]);
			/* Free, it could be written into beside the
			 * home's evicted pages (internal.h, sbi_heap). */
			if (h->home && !held)
				return BAD("heap %u page %u: free (state %u) "
					   "in a home heap",
					   s, i, h->state[i]);
			n[h->state[i]]++;
			/* A free page with memory (zeroed, or freed to be
			 * reused as it is by a copy) has it all: a copy
			 * through the pool side must not fault one in. */
			if ((h->state[i] == SBI_PG_READY ||
			     h->state[i] == SBI_PG_DIRTY) &&
			    has_hole(h, i, pool->page_size))
				return BAD("heap %u page %u: state %u, a hole "
					   "in its memory", s, i, h->state[i]);
			if (held != (h->refs[i] > 0) && !reserved)
				return BAD("heap %u page %u: state %u refs %u",
					   s, i, h->state[i], h->refs[i]);
		}
		if (n[SBI_PG_EVICTED] != h->nevicted)
			return BAD("heap %u: %u evicted, counter %u", s,
				   n[SBI_PG_EVICTED], h->nevicted);
		evicted += n[SBI_PG_EVICTED];
		if (n[SBI_PG_USED] != h->nused || n[SBI_PG_READY] != h->nready ||
		    n[SBI_PG_DIRTY] != h->ndirty || n[SBI_PG_BUSY] != h->nbusy)
			return BAD("heap %u: counters %u/%u/%u/%u, states "
				   "%u/%u/%u/%u (used/ready/dirty/busy)",
				   s, h->nused, h->nready, h->ndirty, h->nbusy,
				   n[SBI_PG_USED], n[SBI_PG_READY],
				   n[SBI_PG_DIRTY], n[SBI_PG_BUSY]);
		used += n[SBI_PG_USED];
		ready += n[SBI_PG_READY];
		dirty += n[SBI_PG_DIRTY];
		resident += n[SBI_PG_USED] + n[SBI_PG_READY] +
			    n[SBI_PG_DIRTY] + n[SBI_PG_BUSY];
	}
	if (used != pool->used || ready != pool->ready ||
	    dirty != pool->dirty || resident != pool->resident ||
	    nheaps != pool->nheaps)
		return BAD("pool: used %zu/%zu ready %zu/%zu dirty %zu/%zu "
			   "resident %zu/%zu heaps %zu/%u (counted/kept)",
			   used, pool->used, ready, pool->ready, dirty,
			   pool->dirty, resident, pool->resident, nheaps,
			   pool->nheaps);
	if (evicted != pool->evicted)
		return BAD("pool: %zu evicted, counter %zu", evicted,
			   pool->evicted);
	if (pool->resident > pool->max_pages)
		return BAD("resident %zu pages over the budget of %zu",
			   pool->resident, pool->max_pages);
	return 0;
}

static int check_refs(struct sb_pool *pool, char *why, size_t len)
{
	size_t npids = (size_t)pool->heap_hi * pool->pages_per_heap;
	uint32_t *count = calloc(npids ? npids : 1, sizeof(*count));
	int r = 0;

	if (!count) {
		snprintf(why, len, "no memory for the check");
		return -ENOMEM;
	}
	for (size_t b = 0; b < pool->nreg && !r; b++) {
		struct sb_buf *buf = pool->reg[b].buf;
		size_t placed = 0;

		for (size_t i = 0; i < buf->npages && !r; i++) {
			uint64_t pte = buf->pte[i];
			/* Placed, or an evicted page kept mapped. */
			sbi_ptref ref = {(uint32_t)(pte & SBI_PTE_PID)};
			sbi_pid p = sbi_ptref_pid(ref);

			if (sbi_ptref_none(ref))
				continue;
			placed += sbi_pte_has_page(pte);
			if (p >= npids ||
			    !pool->heaps[p / pool->pages_per_heap])
				r = BAD("buffer %u page %zu: no pool page %u",
					buf->id, i, p);
			else if (sbi_pte_has_page(pte) &&
				 !pool->heaps[p / pool->pages_per_heap]
					  ->foreign &&
				 has_hole(pool->heaps[p / pool->pages_per_heap],
					  p % pool->pages_per_heap,
					  pool->page_size))
				/* A placed page's memory went (a punch or a
				 * lost read): its mapping reads zeros. */
				r = BAD("buffer %u page %zu: placed, pool page "
					"%u has a hole",
					buf->id, i, p);
			else
				count[p]++;
		}
		if (!r && placed != buf->nplaced)
			r = BAD("buffer %u: %zu pages placed, nplaced %zu",
				buf->id, placed, buf->nplaced);
	}
	for (size_t p = 0; p < npids && !r; p++) {
		struct sbi_heap *h = pool->heaps[p / pool->pages_per_heap];

		/* A page-in in flight holds the page it fills. */
		if (h && h->state[p % pool->pages_per_heap] == SBI_PG_USED &&
		    h->owner[p % pool->pages_per_heap] == SBI_OWNER_IO)
			count[p]++;

		if (h && p % pool->pages_per_heap >= h->npages) {
			if (count[p])
				r = BAD("pool page %zu: past its heap", p);
			continue;
		}
		if (h && h->refs[p % pool->pages_per_heap] != count[p])
			r = BAD("pool page %zu: %u references, %u mappings", p,
				h->refs[p % pool->pages_per_heap], count[p]);
	}
	free(count);
	return r;
}

int sbi_pool_verify(struct sb_pool *pool, char *why, size_t len)
{
	int r;

	pthread_rwlock_wrlock(&pool->layout);
	pthread_rwlock_rdlock(&pool->reg_lock);
	pthread_mutex_lock(&pool->lock);
	r = check_heaps(pool, why, len);
	if (r == 0)
		r = check_refs(pool, why, len);
	pthread_mutex_unlock(&pool->lock);
	pthread_rwlock_unlock(&pool->reg_lock);
	pthread_rwlock_unlock(&pool->layout);
	return r;
}

/* For tests: pages held in state EVICTED (reserved for the buffer pages
 * that still map them, and a live home heap's pages no buffer page names;
 * 0 when eviction recycles and no file buffer has home heaps). */
size_t sbi_test_evicted_pages(struct sb_pool *pool);
size_t sbi_test_evicted_pages(struct sb_pool *pool)
{
	size_t n;

	pthread_mutex_lock(&pool->lock);
	n = pool->evicted;
	pthread_mutex_unlock(&pool->lock);
	return n;
}

/* For tests: whether eviction recycles pages (pool->can_recycle). */
bool sbi_test_recycles(struct sb_pool *pool);
bool sbi_test_recycles(struct sb_pool *pool)
{
	return pool->can_recycle;
}

/* For tests: answer a fault the budget refuses as a kernel without
 * UFFDIO_POISON (before 6.6) would, through the SIGBUS uffd. */
void sbi_test_no_poison(struct sb_pool *pool);
void sbi_test_no_poison(struct sb_pool *pool)
{
	pthread_mutex_lock(&pool->lock);
	pool->can_poison = false;
	pthread_mutex_unlock(&pool->lock);
}
