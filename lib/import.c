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
#include <stdlib.h>
#include <unistd.h>

/* The imported heap of connection gen with the daemon's id; pool->lock
 * held. */
static struct sbi_heap *find(struct sb_pool *pool, uint64_t gen, uint32_t id)
{
	for (uint32_t s = 0; s < pool->heap_hi; s++) {
		struct sbi_heap *h = pool->heaps[s];

		if (h && h->foreign && h->fid == id && h->fgen == gen)
			return h;
	}
	return NULL;
}

static int import_heap(struct sb_pool *pool, uint64_t gen, uint32_t id)
{
	struct sbi_heap *h;
	uint64_t bytes;
	int fd, r = 0;

	fd = sbi_dclient_cache_heap(pool->client, id, gen, &bytes);
	if (fd < 0)
		return fd;
	if (bytes % pool->page_size ||
	    bytes / pool->page_size > pool->pages_per_heap) {
		close(fd);
		return -EOPNOTSUPP;	/* heaps too small for the cache's */
	}
	h = sbi_heap_import(fd, bytes, pool->page_size, &r);
	if (!h)
		return r;
	h->fid = id;
	h->fgen = gen;
	pthread_mutex_lock(&pool->lock);
	if (find(pool, gen, id))
		r = 1;	/* another thread imported it meanwhile */
	else
		r = sbi_pool_add_foreign(pool, h);
	pthread_mutex_unlock(&pool->lock);
	if (r)
		sbi_heap_destroy(&pool->source, h, pool->page_size);
	return r < 0 ? r : 0;
}

int sbi_import_refs(struct sb_pool *pool, uint64_t gen, const uint64_t *refs,
		    size_t n, sbi_pid *out)
{
	int r = 0;

	if (!pool->client)
		return -EINVAL;
	/* The heaps first: round trips, with no lock held. */
	for (size_t k = 0; k < n && r == 0; k++) {
		bool have;

		if (k && SBD_PREF_HEAP(refs[k]) == SBD_PREF_HEAP(refs[k - 1]))
			continue;
		pthread_mutex_lock(&pool->lock);
		have = find(pool, gen, SBD_PREF_HEAP(refs[k])) != NULL;
		pthread_mutex_unlock(&pool->lock);
		if (!have)
			r = import_heap(pool, gen, SBD_PREF_HEAP(refs[k]));
	}
	pthread_mutex_lock(&pool->lock);
	for (size_t k = 0; k < n && r == 0; k++) {
		struct sbi_heap *h = find(pool, gen, SBD_PREF_HEAP(refs[k]));

		if (!h || SBD_PREF_IDX(refs[k]) >= h->npages)
			r = -EPROTO;
	}
	if (r == 0) {
		for (size_t k = 0; k < n; k++) {
			struct sbi_heap *h =
				find(pool, gen, SBD_PREF_HEAP(refs[k]));
			uint32_t i = SBD_PREF_IDX(refs[k]);

			h->refs[i]++;
			h->owner[i]++;	/* this pin */
			out[k] = h->slot * pool->pages_per_heap + i + 1;
		}
	}
	pthread_mutex_unlock(&pool->lock);
	if (r < 0)
		for (size_t k = 0; k < n; k++)
			sbi_dclient_cache_unpin(pool->client, gen, refs[k], 1);
	return r;
}
