/* SPDX-License-Identifier: MIT */
/*
 * Pages of sparsebufd's machine-wide prefix cache in this pool.
 *
 * The daemon keeps cached KV blocks in its own memfds (daemon/cache.c); a
 * client pool imports such a file as a heap of its own (a slot in
 * pool->heaps, every page FOREIGN), so that a buffer maps a cache page
 * exactly as it maps a page shared from another buffer: a pool page with
 * references, mapped MAP_PRIVATE and write-protected, copied on its first
 * write (sbi_pool_refs counts the cache as one more holder, so nothing
 * ever takes such a page over, writes it in place, evicts or punches it).
 *
 * Pins: the daemon frees a cache page only when no client pins it. A page
 * is pinned once for every put or get that handed it to this pool
 * (heap->owner[] counts them); when the last reference here goes
 * (sbi_pool_put, pool.c), all its pins go back at once. The daemon counts pins, so
 * a get racing that release is still right: its pin is counted after, and
 * its references keep the page held here.
 */
#include "internal.h"
#include "dproto.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The imported heap (window) of connection gen holding the daemon's page
 * idx of its heap id; pool->lock held. */
static struct sbi_heap *find(struct sb_pool *pool, uint64_t gen, uint32_t id,
			     uint32_t idx)
{
	for (uint32_t s = 0; s < pool->heap_hi; s++) {
		struct sbi_heap *h = pool->heaps[s];

		if (h && h->foreign && h->fid == id && h->fgen == gen &&
		    idx - h->fbase < h->npages)
			return h;
	}
	return NULL;
}

/* Import the daemon's cache heap id: one pool heap per window of
 * pages_per_heap pages (the cache's heaps may be larger than the pool's). */
static int import_heap(struct sb_pool *pool, uint64_t gen, uint32_t id)
{
	struct sbi_heap *w[64];
	size_t pph = pool->pages_per_heap, n = 0, npages;
	uint64_t bytes;
	int fd, r = 0;

	fd = sbi_dclient_cache_heap(pool->client, id, gen, &bytes);
	if (fd < 0)
		return fd;
	npages = bytes / pool->page_size;
	if (bytes % pool->page_size || !npages ||
	    (npages + pph - 1) / pph > sizeof(w) / sizeof(w[0])) {
		close(fd);
		return -EOPNOTSUPP;	/* pool heaps too small for the cache's */
	}
	for (size_t base = 0; base < npages && r == 0; base += pph) {
		size_t k = npages - base < pph ? npages - base : pph;
		bool last = base + k == npages;
		int wfd = last ? fd : fcntl(fd, F_DUPFD_CLOEXEC, 3);

		if (wfd < 0) {
			r = -errno;
			break;
		}
		if (last)
			fd = -1;	/* the last window's now */
		w[n] = sbi_heap_import(wfd, (off_t)(base * pool->page_size),
				       k * pool->page_size, pool->page_size,
				       pool->hugetlb, &r);
		if (!w[n])
			break;
		w[n]->fid = id;
		w[n]->fgen = gen;
		w[n]->fbase = (uint32_t)base;
		n++;
	}
	if (fd >= 0)
		close(fd);
	/* The windows this pool does not map already (another thread may
	 * have imported them meanwhile; a window nobody here used any more
	 * was let go of, the others stay). */
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n && r == 0; k++) {
		if (find(pool, gen, id, w[k]->fbase))
			continue;
		r = sbi_pool_add_foreign(pool, w[k]);
		if (r == 0)
			w[k] = NULL;
	}
	pthread_mutex_unlock(&pool->lock);
	for (size_t k = 0; k < n; k++)
		if (w[k])
			sbi_heap_destroy(&pool->source, w[k], pool->page_size);
	return r;
}

int sbi_import_refs(struct sb_pool *pool, uint64_t gen, const uint64_t *refs,
		    size_t n, sbi_ptref *out)
{
	int r = 0, tries = 0;

	if (!pool->client)
		return -EINVAL;
again:
	/* The heaps first: round trips, with no lock held. */
	for (size_t k = 0; k < n && r == 0; k++) {
		bool have;

		pthread_mutex_lock(&pool->lock);
		have = find(pool, gen, SBD_PREF_HEAP(refs[k]),
			    SBD_PREF_IDX(refs[k])) != NULL;
		pthread_mutex_unlock(&pool->lock);
		if (!have)
			r = import_heap(pool, gen, SBD_PREF_HEAP(refs[k]));
	}
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n && r == 0; k++) {
		if (find(pool, gen, SBD_PREF_HEAP(refs[k]),
			 SBD_PREF_IDX(refs[k])))
			continue;
		/* Let go of meanwhile (its last page here was put), or the
		 * daemon named a page past its heap. */
		r = ++tries < 4 ? -EAGAIN : -EPROTO;
	}
	if (r == -EAGAIN) {
		pthread_mutex_unlock(&pool->lock);
		r = 0;
		goto again;
	}
	if (r == 0) {
		for (size_t k = 0; k < n; k++) {
			struct sbi_heap *h =
				find(pool, gen, SBD_PREF_HEAP(refs[k]),
				     SBD_PREF_IDX(refs[k]));
			uint32_t i = SBD_PREF_IDX(refs[k]) - h->fbase;

			if (!h->refs[i]++)
				h->nheld++;
			h->owner[i]++;	/* this pin */
			out[k] = sbi_ptref_of(h->slot * pool->pages_per_heap +
					      i);
		}
	}
	pthread_mutex_unlock(&pool->lock);
	if (r < 0)
		for (size_t k = 0; k < n; k++)
			sbi_dclient_cache_unpin(pool->client, gen, refs[k], 1);
	return r;
}
