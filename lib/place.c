/* SPDX-License-Identifier: MIT */
/*
 * Placing pages in a buffer's empty pages: sb_buf_map's work, and the
 * background placements (prefetch, the growth watches). Pages whose data
 * is on disk are read in first; the rest are allocated (in runs of
 * consecutive heap pages, so that the kernel merges their mappings) and
 * mapped, with the buffer's lock held only to look at the page table and
 * to map. Below the buffer calls, prefetch and growth, which use it.
 */
#include "internal.h"
#include "trace.h"
#include "tsan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A range of a buffer's pages that map one run of heap pages. */
struct run {
	size_t idx, n;
	sbi_pid pid;
};

/* A stretch of unplaced pages, and the page placed before it (whose heap
 * run the new pages continue), or SBI_NOPAGE. */
struct seg {
	size_t idx, n;
	sbi_ptref after;
	bool urgent;	/* SBI_ALLOC_URGENT (sbi_grow_urgent) */
};

/* Nothing there: no page, no data on disk, no failed read. A page
 * poisoned by a failed zero-fill counts as empty (a map places one). */
static bool empty(uint64_t pte)
{
	return !sbi_pte_has_page(pte) &&
	       !(pte & (SBI_PTE_DISK | SBI_PTE_IOERR | SBI_PTE_KEEP));
}

static bool disk_used(struct sb_buf *buf)
{
	return buf->src || atomic_load_explicit(&buf->disk_used,
						memory_order_relaxed);
}

static size_t make_runs(const struct sb_pool *pool, const size_t *idx,
			const sbi_pid *pids, size_t n, struct run *runs)
{
	size_t nruns = 0;

	for (size_t k = 0; k < n;) {
		size_t len = 1;

		while (k + len < n && idx[k + len] == idx[k] + len &&
		       pids[k + len] == pids[k] + len &&
		       pids[k + len] % pool->pages_per_heap != 0)
			len++;
		runs[nruns++] = (struct run){idx[k], len, pids[k]};
		k += len;
	}
	return nruns;
}

/* Run r's pages are placed (mapped; buffer lock held): say so. */
static void commit_run(struct sb_buf *buf, const struct run *r)
{
	for (size_t i = 0; i < r->n; i++) {
		buf->pte[r->idx + i] = sbi_pte_placed(r->pid + (sbi_pid)i);
		sbi_rmap_note(buf, r->idx + i, r->pid + i);
		SBI_TRACE_MAP(buf, r->idx + i);
	}
	buf->nplaced += r->n;
	if (r->idx + r->n > buf->grow_hi)
		buf->grow_hi = r->idx + r->n;
	sbi_count(&buf->pool->n_maps, r->n);
}

/*
 * Three steps, so that the buffer lock is not held while pages are
 * allocated (which may mean preparing one, 100 us or more): under the lock,
 * find the unplaced pages and the page each stretch continues; without it,
 * allocate; under it again, place the pages still unplaced (a fault or a
 * prefetch may have placed some meanwhile: those pages go back).
 */
static long place(struct sb_buf *buf, size_t first, size_t end, bool wait);

long sbi_buf_place(struct sb_buf *buf, size_t first, size_t end, bool wait)
{
	/* wait: the owner's own placement (sb_buf_map); else the ready
	 * thread's, in the background, which lets the owner's go first. */
	if (!wait) {
		sbi_vma_bg_yield(buf->pool);
		return place(buf, first, end, false);
	}
	return place(buf, first, end, true);
}

static long place(struct sb_buf *buf, size_t first, size_t end, bool wait)
{
	struct sb_pool *pool = buf->pool;
	size_t n = 0, k = 0, nsegs = 0, kept, nruns, done = 0, nin = 0;
	struct run *runs = NULL;
	struct seg *segs = NULL;
	size_t *idx = NULL;
	sbi_pid *pids = NULL;
	long r = 0;

	/* Data on disk comes back first (and a failed read is an error,
	 * never a zero page). Page-ins take the locks themselves. */
	if (disk_used(buf)) {
		r = sbi_pagein_range(buf, first, end, wait);
		if (r < 0)
			return r;
		nin = (size_t)r;	/* read back in: placed by this call */
		r = 0;
	}
	pthread_rwlock_rdlock(&pool->layout);
	pthread_mutex_lock(&buf->lock);
	for (size_t i = first; i < end; i++) {
		n += empty(buf->pte[i]);
		if (buf->pte[i] & SBI_PTE_IOERR)
			r = -EIO;
		else if (sbi_pte_has_page(buf->pte[i]))	/* named again */
			sbi_rmap_note(buf, i, sbi_pte_page(buf->pte[i]));
	}
	if (r < 0)
		n = 0;
	if (n) {
		pids = malloc(n * sizeof(*pids));
		idx = malloc(n * sizeof(*idx));
		runs = malloc(n * sizeof(*runs));
		segs = malloc(n * sizeof(*segs));
	}
	if (n && (!pids || !idx || !runs || !segs)) {
		r = -ENOMEM;
		n = 0;
	}
	/* Each stretch of unplaced pages continues the heap run of the page
	 * before it. */
	for (size_t i = first; i < end && n;) {
		size_t j = i;

		if (!empty(buf->pte[i])) {
			i++;
			continue;
		}
		while (j < end && empty(buf->pte[j]))
			idx[k++] = j++;
		segs[nsegs++] = (struct seg){
			i, j - i,
			i ? sbi_pte_ref(buf->pte[i - 1]) : SBI_NOPAGE,
			wait && j - i == 1 && sbi_grow_urgent(buf, i)};
		i = j;
	}
	pthread_mutex_unlock(&buf->lock);
	if (!n) {
		if (r == 0)
			r = (long)nin;
		goto out_unlocked;
	}

	for (size_t sg = 0, got = 0; sg < nsegs; got += segs[sg++].n) {
		/* A prefetch served in the background (!wait) is advice:
		 * at the budget it does not wait for busy buffers. */
		unsigned flags = wait ? 0 : SBI_ALLOC_NOWAIT;

		if (segs[sg].urgent)
			flags |= SBI_ALLOC_URGENT;
		r = sbi_alloc(pool, buf, segs[sg].after, segs[sg].n, pids + got,
			      flags, NULL, false);
		if (r < 0) {
			n = got;	/* what to give back */
			goto out_put;
		}
	}

	pthread_mutex_lock(&buf->lock);
	/* Keep the pages still unplaced; return the others' pids. */
	kept = 0;
	for (k = 0; k < n; k++) {
		if (!empty(buf->pte[idx[k]])) {
			sbi_pool_put1(pool, pids[k]);
			continue;
		}
		idx[kept] = idx[k];
		pids[kept++] = pids[k];
	}
	n = kept;
	nruns = make_runs(pool, idx, pids, n, runs);
	/* Only around the mapping itself: while the owner waits for a page
	 * being made ready, the ready thread must not wait for the owner. */
	if (wait)
		sbi_vma_fg_begin(pool);
	for (done = 0; done < nruns; done++) {
		r = sbi_vma_place(buf, runs[done].idx, runs[done].n,
				  runs[done].pid, false);
		if (r < 0)
			break;
	}
	if (wait)
		sbi_vma_fg_end(pool);
	if (r < 0)
		goto out_unplace;
	for (size_t t = 0; t < nruns; t++)
		commit_run(buf, &runs[t]);
	if (nruns && wait)	/* the owner's own: watch from its last page */
		sbi_grow_note(buf, runs[nruns - 1].idx + runs[nruns - 1].n - 1);
	/* A page read in above and then unmapped by another thread was
	 * placed twice by this call: count pages, not placements. */
	r = (long)(n + nin < end - first ? n + nin : end - first);
	pthread_mutex_unlock(&buf->lock);
	goto out_unlocked;
out_unplace:
	/* All or nothing: the runs mapped so far go again. One whose
	 * mapping the kernel will not replace (the mapping limit: vma.c,
	 * anon_over) stays placed instead, with its pages: a buffer must
	 * never map a page the pool hands out again. */
	kept = 0;
	for (size_t t = 0, off = 0; t < nruns; off += runs[t++].n) {
		if (t < done &&
		    sbi_vma_unplace(buf, runs[t].idx, runs[t].n) < 0) {
			commit_run(buf, &runs[t]);
			continue;
		}
		memmove(pids + kept, pids + off, runs[t].n * sizeof(*pids));
		kept += runs[t].n;
	}
	n = kept;
	pthread_mutex_unlock(&buf->lock);
out_put:
	for (k = 0; k < n; k++)
		sbi_pool_put1(pool, pids[k]);
out_unlocked:
	pthread_rwlock_unlock(&pool->layout);
	free(pids);
	free(idx);
	free(runs);
	free(segs);
	return r;
}

