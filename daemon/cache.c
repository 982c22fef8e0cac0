/* SPDX-License-Identifier: MIT */
/*
 * The machine-wide prefix cache: blocks of KV pages that any process of
 * the same uid finds by key and maps, the same physical pages for all.
 *
 * A block is opaque here: a chain key (the client's hash of the model, the
 * geometry and every token up to the block's end), its parent's key, its
 * depth, its tokens (the client confirms a match with them) and its pages,
 * in the daemon's cache heaps: memfds of CACHE_HEAP_BYTES, one set per
 * uid (a client imports only its own uid's heaps, so no process sees
 * another user's prompts).
 *
 * Pages and pins. A client holds a pin on each cache page it maps (one
 * per CACHE_PUT or CACHE_GET that gave it the page, dropped by a
 * CACHE_UNPIN, or all at once when its connection ends: a SIGKILL drops
 * them). A page is in use while a block holds it; it is freed (punched,
 * back to the budget) once no block holds it and no pin is left, so a
 * block may be dropped while clients still map its pages: they keep
 * valid data, and the memory goes when the last of them lets go.
 *
 * Budget: the cache's pages count in the machine's budget beside the
 * leases (server.h, used). A put that does not fit first makes room from
 * the least recently used blocks nobody pins: with --spill-dir their pages
 * go to disk (the block stays findable: a get reads it back into new
 * pages), else, or when the disk refuses, they are dropped (leaves first:
 * a block without its parent could never be found). A lease that does not
 * fit does the same before asking clients for pages (budget.c). Blocks
 * stay after the process that put them exits, while they fit. The spill
 * file's I/O is synchronous, in the event loop: a spill or a read-back
 * stalls the daemon for its duration (a block of Qwen3-4B's geometry is
 * 18 MiB).
 */
#include "server.h"
#include "dproto.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CACHE_HEAP_BYTES ((uint64_t)8 << 20)
/* Blocks a client may be filling at once (a client fills one at a time;
 * more is a client that puts and never says DONE). */
#define MAX_FILLING 64
#define NBUCKETS 4096u
#define MAX_MODELS 256

struct sbd_cheap {
	uint32_t id;
	uid_t uid;
	int fd;
	uint32_t npages, nfree;
	uint32_t *pins;		/* per page: pins clients hold */
	uint8_t *inuse;		/* per page: a block holds it */
	struct sbd_block **blk;	/* per page: that block */
};

struct sbd_block {
	struct sbd_block *next;		/* hash bucket */
	struct sbd_block *parent;	/* NULL: depth 0 */
	struct sbd_block *child, *sibling;	/* the blocks after it */
	uint64_t key, pkey;
	uid_t uid;
	uint32_t depth, ntok, npages, children;
	uint32_t pins;			/* on its pages, all clients */
	bool spilled;			/* pages[] are spill-file offsets */
	struct sbd_client *filler;	/* being filled by it: unfindable */
	uint32_t guard;			/* a request under way relies on it
					 * (a put's parent): neither spilled
					 * nor dropped meanwhile */
	uint64_t last_ms;
	int32_t *tokens;
	uint64_t *pages;
};

struct model {
	uint64_t root;
	uid_t uid;
	char name[SBD_CACHE_MODEL_MAX];
};

/* A client's pins: page ref -> count, open addressing. */
struct sbd_pins {
	uint64_t *ref;		/* 0: empty (no heap has id 0) */
	uint32_t *cnt;
	size_t cap, n;
};

struct sbd_cache {
	uint64_t *spill_free;		/* free page slots of the spill file */
	size_t nspill_free, spill_cap;
	uint64_t spill_end;		/* the file's length */
	struct sbd_cheap **heaps;
	size_t nheaps, heap_cap;
	struct sbd_block *bucket[NBUCKETS];
	size_t nblocks;
	uint64_t heap_bytes;
	struct model models[MAX_MODELS];
	size_t nmodels;
};

static uint32_t bucket_of(uint64_t key, uid_t uid)
{
	uint64_t h = (key ^ ((uint64_t)uid * 0x9e3779b97f4a7c15ull)) *
		     0xbf58476d1ce4e5b9ull;

	return (uint32_t)(h >> 52) & (NBUCKETS - 1);
}

static struct sbd_cache *cache_of(struct sbd_server *s)
{
	if (!s->cache) {
		s->cache = calloc(1, sizeof(*s->cache));
		if (s->cache)
			s->cache->heap_bytes = s->page_size > CACHE_HEAP_BYTES
						       ? s->page_size
						       : CACHE_HEAP_BYTES;
	}
	return s->cache;
}

/* ---- heaps and pages ----------------------------------------------------------- */

static struct sbd_cheap *heap_by_id(struct sbd_cache *k, uint32_t id)
{
	for (size_t i = 0; i < k->nheaps; i++)
		if (k->heaps[i]->id == id)
			return k->heaps[i];
	return NULL;
}

static struct sbd_cheap *heap_new(struct sbd_server *s, struct sbd_cache *k,
				  uid_t uid)
{
	struct sbd_cheap *h;
	uint32_t n = (uint32_t)(k->heap_bytes / s->page_size);

	if (k->nheaps == k->heap_cap) {
		size_t cap = k->heap_cap ? 2 * k->heap_cap : 16;
		struct sbd_cheap **v = realloc(k->heaps, cap * sizeof(*v));

		if (!v)
			return NULL;
		k->heaps = v;
		k->heap_cap = cap;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->pins = calloc(n, sizeof(*h->pins));
	h->inuse = calloc(n, 1);
	h->blk = calloc(n, sizeof(*h->blk));
	h->fd = sbd_heap_file("sparsebufd-cache", k->heap_bytes, s->hugetlb);
	if (!h->pins || !h->inuse || !h->blk || h->fd < 0) {
		if (h->fd >= 0)
			close(h->fd);
		free(h->pins);
		free(h->inuse);
		free(h->blk);
		free(h);
		return NULL;
	}
	if (++s->next_heap_id == 0)
		s->next_heap_id = 1;
	h->id = s->next_heap_id;
	h->uid = uid;
	h->npages = h->nfree = n;
	k->heaps[k->nheaps++] = h;
	return h;
}

/* Page idx of h has no block and no pin left: its memory back. A heap
 * left empty is closed (clients that imported it keep an empty file). */
static void page_free(struct sbd_server *s, struct sbd_cache *k,
		      struct sbd_cheap *h, uint32_t idx)
{
	fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		  (off_t)(idx * s->page_size), (off_t)s->page_size);
	h->nfree++;
	s->used -= s->page_size;
	s->cache_bytes -= s->page_size;
	if (h->nfree < h->npages)
		return;
	for (size_t i = 0; i < k->nheaps; i++)
		if (k->heaps[i] == h) {
			k->heaps[i] = k->heaps[--k->nheaps];
			break;
		}
	close(h->fd);
	free(h->pins);
	free(h->inuse);
	free(h->blk);
	free(h);
}

/* A block lets go of a page. */
static void page_release(struct sbd_server *s, struct sbd_cache *k,
			 uint64_t ref)
{
	struct sbd_cheap *h = heap_by_id(k, SBD_PREF_HEAP(ref));
	uint32_t i = SBD_PREF_IDX(ref);

	if (!h || i >= h->npages || !h->inuse[i])
		return;
	h->inuse[i] = 0;
	h->blk[i] = NULL;
	if (!h->pins[i])
		page_free(s, k, h, i);
}

/* n pages of uid's heaps, counted in the budget (room checked by the
 * caller). 0 or -ENOMEM. */
static int pages_take_once(struct sbd_server *s, struct sbd_cache *k,
			   uid_t uid, uint32_t n, uint64_t *out)
{
	uint32_t got = 0;
	bool ok;

	for (size_t i = 0; i < k->nheaps && got < n; i++) {
		struct sbd_cheap *h = k->heaps[i];

		if (h->uid != uid || !h->nfree)
			continue;
		for (uint32_t p = 0; p < h->npages && got < n; p++)
			if (!h->inuse[p] && !h->pins[p]) {
				h->inuse[p] = 1;
				h->nfree--;
				out[got++] = SBD_PREF(h->id, p);
			}
	}
	while (got < n) {
		struct sbd_cheap *h = heap_new(s, k, uid);

		if (!h)
			break;
		for (uint32_t p = 0; p < h->npages && got < n; p++) {
			h->inuse[p] = 1;
			h->nfree--;
			out[got++] = SBD_PREF(h->id, p);
		}
	}
	s->used += (uint64_t)got * s->page_size;
	s->cache_bytes += (uint64_t)got * s->page_size;
	/* Huge pages are allocated now, while an answer can still say no: a
	 * client writing a page of a hugetlbfs file that has none, when no
	 * huge page is free, gets SIGBUS. (A shmem page is allocated by the
	 * write that fills it.) */
	ok = got == n;
	for (uint32_t i = 0; s->hugetlb && ok && i < got; i++)
		ok = fallocate(heap_by_id(k, SBD_PREF_HEAP(out[i]))->fd, 0,
			       (off_t)(SBD_PREF_IDX(out[i]) * s->page_size),
			       (off_t)s->page_size) == 0;
	if (ok)
		return 0;
	for (uint32_t i = 0; i < got; i++)
		page_release(s, k, out[i]);
	return -ENOMEM;
}

/* The same; on huge pages, when the system has too few free (the budget
 * does not see them: they are the second limit of docs/daemon.md, "Huge
 * pages"), the cache's coldest blocks nobody maps make room first, as
 * they do for the budget, and it tries once more. */
static int pages_take(struct sbd_server *s, struct sbd_cache *k, uid_t uid,
		      uint32_t n, uint64_t *out)
{
	int r = pages_take_once(s, k, uid, n, out);

	if (r == -ENOMEM && s->hugetlb &&
	    sbd_cache_shrink(s, (uint64_t)n * s->page_size))
		r = pages_take_once(s, k, uid, n, out);
	return r;
}

/* count pins of page idx dropped. */
static void page_unpin(struct sbd_server *s, struct sbd_cache *k,
		       struct sbd_cheap *h, uint32_t idx, uint32_t count)
{
	if (count > h->pins[idx])
		count = h->pins[idx];
	if (!count)
		return;	/* none held: nothing changes (a free page stays
			 * free, never freed twice) */
	h->pins[idx] -= count;
	if (h->blk[idx])
		h->blk[idx]->pins -= count;
	if (!h->pins[idx] && !h->inuse[idx])
		page_free(s, k, h, idx);
}

/* ---- pins ------------------------------------------------------------------------ */

static size_t pin_slot(const struct sbd_pins *p, uint64_t ref)
{
	/* Every bit of the ref mixed in (splitmix64's finaliser): a
	 * product's low bits alone depend on the page index only, which put
	 * every heap's page 0 in one cluster. */
	uint64_t h = ref;
	size_t i;

	h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
	h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
	h ^= h >> 31;
	i = (size_t)h & (p->cap - 1);

	while (p->ref[i] && p->ref[i] != ref)
		i = (i + 1) & (p->cap - 1);
	return i;
}

static bool pins_grow(struct sbd_pins *p)
{
	struct sbd_pins q = {.cap = p->cap ? 2 * p->cap : 256};

	q.ref = calloc(q.cap, sizeof(*q.ref));
	q.cnt = calloc(q.cap, sizeof(*q.cnt));
	if (!q.ref || !q.cnt) {
		free(q.ref);
		free(q.cnt);
		return false;
	}
	for (size_t i = 0; i < p->cap; i++)
		if (p->ref[i]) {
			size_t j = pin_slot(&q, p->ref[i]);

			q.ref[j] = p->ref[i];
			q.cnt[j] = p->cnt[i];
			q.n++;
		}
	free(p->ref);
	free(p->cnt);
	*p = q;
	return true;
}

static bool pin(struct sbd_client *c, struct sbd_cheap *h, uint64_t ref)
{
	struct sbd_pins *p = c->pins;
	size_t i;

	if (!p && !(p = c->pins = calloc(1, sizeof(*p))))
		return false;
	if ((p->n + 1) * 2 > p->cap && !pins_grow(p))
		return false;
	i = pin_slot(p, ref);
	if (!p->ref[i]) {
		p->ref[i] = ref;
		p->cnt[i] = 0;
		p->n++;
	}
	p->cnt[i]++;
	h->pins[SBD_PREF_IDX(ref)]++;
	if (h->blk[SBD_PREF_IDX(ref)])
		h->blk[SBD_PREF_IDX(ref)]->pins++;
	return true;
}

/* Drop count pins of ref held by c (no more than it holds). */
static void unpin(struct sbd_server *s, struct sbd_cache *k,
		  struct sbd_client *c, uint64_t ref, uint32_t count)
{
	struct sbd_pins *p = c->pins;
	struct sbd_cheap *h;
	size_t i, j;
	uint32_t idx = SBD_PREF_IDX(ref);

	if (!p || !p->cap || !ref)
		return;
	i = pin_slot(p, ref);
	if (!p->ref[i])
		return;		/* not held: an earlier daemon's page */
	if (count > p->cnt[i])
		count = p->cnt[i];
	p->cnt[i] -= count;
	h = heap_by_id(k, SBD_PREF_HEAP(ref));
	if (h && idx < h->npages)
		page_unpin(s, k, h, idx, count);
	if (p->cnt[i])
		return;
	/* Remove, then re-place the rest of the cluster: an entry moves
	 * with its count, and the slot it leaves keeps none (the next ref
	 * placed there would start from it: pins this client never took,
	 * given back for others', freeing pages they still map). */
	p->ref[i] = 0;
	p->n--;
	for (j = (i + 1) & (p->cap - 1); p->ref[j]; j = (j + 1) & (p->cap - 1)) {
		uint64_t r = p->ref[j];
		uint32_t n = p->cnt[j];
		size_t t;

		p->ref[j] = 0;
		p->cnt[j] = 0;
		t = pin_slot(p, r);
		p->ref[t] = r;
		p->cnt[t] = n;
	}
}

/* ---- blocks ---------------------------------------------------------------------- */

static struct sbd_block *block_find(struct sbd_cache *k, uid_t uid,
				    uint64_t key)
{
	for (struct sbd_block *b = k->bucket[bucket_of(key, uid)]; b;
	     b = b->next)
		if (b->key == key && b->uid == uid)
			return b;
	return NULL;
}

/* ---- the spill file (--spill-dir) ----------------------------------------------- */

/* The file may grow to this many times the budget; past it, blocks are
 * dropped instead. */
#define SPILL_FACTOR 4

static void spill_forget(struct sbd_server *s, struct sbd_cache *k,
			 const uint64_t *off, uint32_t n)
{
	if (k->nspill_free + n > k->spill_cap) {
		size_t cap = (k->nspill_free + n) * 2;
		uint64_t *v = realloc(k->spill_free, cap * sizeof(*v));

		if (!v)
			return;	/* slots lost until the daemon restarts */
		k->spill_free = v;
		k->spill_cap = cap;
	}
	for (uint32_t i = 0; i < n; i++) {
		/* The disk space back now. */
		fallocate(s->spill_fd,
			  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			  (off_t)off[i], (off_t)s->page_size);
		k->spill_free[k->nspill_free++] = off[i];
	}
	s->cache_spilled -= (uint64_t)n * s->page_size;
}

static bool copy_page(int from, off_t from_off, int to, off_t to_off,
		      char *buf, size_t len)
{
	return pread(from, buf, len, from_off) == (ssize_t)len &&
	       pwrite(to, buf, len, to_off) == (ssize_t)len;
}

/* A spilled page read back into page off of cache heap fd. hugetlbfs has
 * no write(2): there the page (allocated by pages_take) is read into
 * through a mapping of it, made for the copy alone. */
static bool copy_in(struct sbd_server *s, off_t from_off, int fd, off_t off,
		    char *buf)
{
	void *p;
	bool ok;

	if (!s->hugetlb)
		return copy_page(s->spill_fd, from_off, fd, off, buf,
				 s->page_size);
	p = mmap(NULL, s->page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		 off);
	if (p == MAP_FAILED)
		return false;
	ok = pread(s->spill_fd, p, s->page_size, from_off) ==
	     (ssize_t)s->page_size;
	munmap(p, s->page_size);
	return ok;
}

/* b's pages to the spill file, their memory back; b stays findable.
 * false (nothing changed) when the file is full or the disk refuses. */
static bool block_spill(struct sbd_server *s, struct sbd_cache *k,
			struct sbd_block *b)
{
	uint64_t *off = malloc(b->npages * sizeof(*off));
	char *buf = malloc(s->page_size);
	bool failed = false;
	uint32_t i;

	if (!off || !buf)
		goto fail;
	for (i = 0; i < b->npages; i++) {
		struct sbd_cheap *h = heap_by_id(k, SBD_PREF_HEAP(b->pages[i]));

		if (k->nspill_free) {
			off[i] = k->spill_free[--k->nspill_free];
		} else if (k->spill_end + s->page_size <=
			   SPILL_FACTOR * s->max_bytes) {
			off[i] = k->spill_end;
			k->spill_end += s->page_size;
		} else {
			break;
		}
		s->cache_spilled += s->page_size;
		if (!h || !copy_page(h->fd,
				     (off_t)(SBD_PREF_IDX(b->pages[i]) *
					     s->page_size),
				     s->spill_fd, (off_t)off[i], buf,
				     s->page_size)) {
			/* (its slot is forgotten with the others: i + 1) */
			failed = true;
			i++;
			break;
		}
	}
	if (failed || i < b->npages || fdatasync(s->spill_fd) < 0) {
		spill_forget(s, k, off, i);
		goto fail;
	}
	for (i = 0; i < b->npages; i++)
		page_release(s, k, b->pages[i]);
	free(b->pages);
	b->pages = off;
	b->spilled = true;
	free(buf);
	return true;
fail:
	free(off);
	free(buf);
	return false;
}

static uint64_t room(const struct sbd_server *s);

/* b's pages read back into new pages of the cache. 0 or -errno. */
static int block_unspill(struct sbd_server *s, struct sbd_cache *k,
			 struct sbd_block *b)
{
	uint64_t bytes = (uint64_t)b->npages * s->page_size;
	uint64_t *pages = malloc(b->npages * sizeof(*pages));
	/* (copy_in reads a huge page in place) */
	char *buf = s->hugetlb ? NULL : malloc(s->page_size);
	int r = 0;

	if (!pages || (!s->hugetlb && !buf)) {
		r = -ENOMEM;
		goto out;
	}
	b->last_ms = sbd_now_ms();	/* not the one to make room */
	b->guard++;	/* (nor one dropped with its parent: the shrink) */
	if (room(s) < bytes)
		sbd_cache_shrink(s, bytes - room(s));
	if (room(s) < bytes)
		r = -ENOSPC;
	else
		r = pages_take(s, k, b->uid, b->npages, pages);
	b->guard--;
	if (r < 0)
		goto out;
	for (uint32_t i = 0; i < b->npages && r == 0; i++) {
		struct sbd_cheap *h = heap_by_id(k, SBD_PREF_HEAP(pages[i]));

		if (!copy_in(s, (off_t)b->pages[i], h->fd,
			     (off_t)(SBD_PREF_IDX(pages[i]) * s->page_size),
			     buf))
			r = -EIO;
	}
	if (r < 0) {
		for (uint32_t i = 0; i < b->npages; i++)
			page_release(s, k, pages[i]);
		goto out;
	}
	spill_forget(s, k, b->pages, b->npages);
	free(b->pages);
	b->pages = pages;
	pages = NULL;
	b->spilled = false;
	for (uint32_t i = 0; i < b->npages; i++)
		heap_by_id(k, SBD_PREF_HEAP(b->pages[i]))
			->blk[SBD_PREF_IDX(b->pages[i])] = b;
out:
	free(pages);
	free(buf);
	return r;
}

static void block_drop(struct sbd_server *s, struct sbd_cache *k,
		       struct sbd_block *b)
{
	struct sbd_block **pp = &k->bucket[bucket_of(b->key, b->uid)];

	while (*pp != b)
		pp = &(*pp)->next;
	*pp = b->next;
	if (b->parent) {
		for (pp = &b->parent->child; *pp != b; pp = &(*pp)->sibling)
			;
		*pp = b->sibling;
		b->parent->children--;
	}
	if (b->filler)
		b->filler->nfilling--;
	if (b->spilled)
		spill_forget(s, k, b->pages, b->npages);
	else
		for (uint32_t i = 0; i < b->npages; i++)
			page_release(s, k, b->pages[i]);
	k->nblocks--;
	free(b->tokens);
	free(b->pages);
	free(b);
}

/* Drop b and every block after it (a block without its parent could
 * never be found, and one whose parent was never filled holds nothing
 * worth finding). */
static void drop_subtree(struct sbd_server *s, struct sbd_cache *k,
			 struct sbd_block *b)
{
	/* Iterative, deepest first: a chain may be as long as the budget
	 * has blocks. */
	while (b->child) {
		struct sbd_block *x = b->child;

		while (x->child)
			x = x->child;
		block_drop(s, k, x);
	}
	block_drop(s, k, b);
}

/* Nothing in b's subtree is pinned, being filled or guarded. */
static bool subtree_idle(const struct sbd_block *b)
{
	const struct sbd_block *x = b;

	for (;;) {
		if (x->pins || x->filler || x->guard)
			return false;
		if (x->child) {
			x = x->child;
			continue;
		}
		while (x != b && !x->sibling)
			x = x->parent;
		if (x == b)
			return true;
		x = x->sibling;
	}
}

static int by_last_ms(const void *x, const void *y)
{
	const struct sbd_block *a = *(struct sbd_block *const *)x;
	const struct sbd_block *b = *(struct sbd_block *const *)y;

	if (a->last_ms != b->last_ms)
		return a->last_ms < b->last_ms ? -1 : 1;
	/* The end of a prefix before its beginning. */
	return a->depth < b->depth ? 1 : a->depth > b->depth ? -1 : 0;
}

uint64_t sbd_cache_shrink(struct sbd_server *s, uint64_t need)
{
	struct sbd_cache *k = s->cache;
	uint64_t before = s->cache_bytes;

	if (!k)
		return 0;
	/* Rounds over the candidates, least recently used first (a sort
	 * each, not a scan per block): any cold block may go to disk (it
	 * stays findable); only a leaf may be dropped, and a parent becomes
	 * one once its children went, in the next round. */
	/* Cleared once a round could spill nothing (the disk full, or the
	 * file at its bound): the rounds after it only drop, rather than
	 * each try every candidate on a disk that refuses them all. */
	bool spill = s->spill;

	for (bool progress = true;
	     progress && before - s->cache_bytes < need;) {
		struct sbd_block **v = malloc(k->nblocks * sizeof(*v));
		size_t n = 0;

		progress = false;
		if (!v)
			break;
		for (uint32_t i = 0; i < NBUCKETS; i++)
			for (struct sbd_block *b = k->bucket[i]; b;
			     b = b->next)
				if (!b->filler && !b->pins && !b->spilled &&
				    !b->guard)
					v[n++] = b;
		qsort(v, n, sizeof(*v), by_last_ms);
		for (size_t j = 0; j < n && before - s->cache_bytes < need;
		     j++) {
			struct sbd_block *b = v[j];
			uint64_t t = b->last_ms;

			if (spill && block_spill(s, k, b)) {
				if (s->verbose)
					sbd_log("cache: a block to disk (uid "
						"%u, depth %u)",
						(unsigned)b->uid, b->depth);
				progress = true;
				continue;
			}
			/* A leaf goes, then each parent it leaves childless
			 * that is a candidate too and was used before it:
			 * such a parent came earlier in v, which is never
			 * looked at again this round (one used at the same
			 * millisecond comes after its child: its own turn). */
			while (b && !b->children && !b->filler && !b->pins &&
			       !b->spilled && !b->guard &&
			       before - s->cache_bytes < need) {
				struct sbd_block *up = b->parent;

				if (s->verbose)
					sbd_log("cache: dropped a block (uid %u, "
						"depth %u)", (unsigned)b->uid,
						b->depth);
				block_drop(s, k, b);
				s->cache_dropped++;
				progress = true;
				b = up && up->last_ms < t ? up : NULL;
			}
		}
		/* Stuck: what is left in memory is pinned, or parents of
		 * blocks on disk, and the disk takes no more (full, an I/O
		 * error, or the file at SPILL_FACTOR times the budget). A parent cannot be
		 * dropped while its children may be found, so the coldest
		 * such parent goes with everything after it, the disk's
		 * blocks too (their room back). */
		if (!progress)
			spill = false;
		for (size_t j = 0; !progress && j < n; j++) {
			size_t was = k->nblocks;

			if (!v[j]->children || !subtree_idle(v[j]))
				continue;
			if (s->verbose)
				sbd_log("cache: dropped a block and what follows "
					"it (uid %u, depth %u): the spill file "
					"takes no more",
					(unsigned)v[j]->uid, v[j]->depth);
			drop_subtree(s, k, v[j]);
			s->cache_dropped += was - k->nblocks;
			progress = true;
		}
		free(v);
	}
	return before - s->cache_bytes;
}

/* What the cache may take: the clients' unused floors are theirs. */
static uint64_t room(const struct sbd_server *s)
{
	return sbd_budget_room(s, NULL);
}

/* ---- messages -------------------------------------------------------------------- */

static void reply_payload(struct sbd_client *c, uint32_t seq, int64_t err,
			  uint64_t a, uint64_t b, const void *p, size_t len)
{
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_REPLY,
			    .seq = seq, .err = err, .a = a, .b = b,
			    .len = (uint32_t)len};

	sbd_send(c->fd, &m, p, -1);
}

/* A block of n pages (room made from the cache's own cold blocks, never
 * a lease) with room for tokbytes of tokens, its pages taken: 0, or
 * -ENOSPC (no room in the budget), -EBUSY (c fills too many), -ENOMEM. */
static int block_new(struct sbd_server *s, struct sbd_cache *k,
		     struct sbd_client *c, uint32_t n, uint32_t tokbytes,
		     struct sbd_block **out)
{
	uint64_t bytes = (uint64_t)n * s->page_size;
	struct sbd_block *b;

	if (room(s) < bytes)
		sbd_cache_shrink(s, bytes - room(s));
	if (room(s) < bytes)
		return -ENOSPC;
	if (c->nfilling >= MAX_FILLING)
		return -EBUSY;
	b = calloc(1, sizeof(*b));
	if (b) {
		b->tokens = malloc(tokbytes);
		b->pages = malloc(n * sizeof(*b->pages));
	}
	if (!b || !b->tokens || !b->pages ||
	    pages_take(s, k, c->uid, n, b->pages) < 0) {
		if (b) {
			free(b->tokens);
			free(b->pages);
		}
		free(b);
		return -ENOMEM;
	}
	*out = b;
	return 0;
}

static void put(struct sbd_server *s, struct sbd_client *c,
		const struct sbd_msg *m, const void *payload)
{
	struct sbd_cache *k = cache_of(s);
	uint32_t n = (uint32_t)m->d, ntok = m->len / 4;
	struct sbd_block *parent = NULL, *b;
	int r;

	if (!k) {
		sbd_reply(s, c, m->seq, -ENOMEM, 0, 0, 0, -1);
		return;
	}
	if (block_find(k, c->uid, m->a)) {
		sbd_reply(s, c, m->seq, -EEXIST, 0, 0, 0, -1);
		return;
	}
	if (m->c) {
		/* A parent someone else is still filling holds nothing yet:
		 * if that one dies, the parent and what follows it go. */
		parent = block_find(k, c->uid, m->b);
		if (!parent || parent->depth + 1 != m->c ||
		    (parent->filler && parent->filler != c)) {
			sbd_reply(s, c, m->seq, -ENOENT, 0, 0, 0, -1);
			return;
		}
	}
	/* The parent is used now: whatever makes room (the budget's, or
	 * the huge pages' in pages_take) keeps it. */
	if (parent) {
		parent->last_ms = sbd_now_ms();
		parent->guard++;
	}
	r = block_new(s, k, c, n, m->len, &b);
	if (parent)
		parent->guard--;
	if (r < 0) {
		sbd_reply(s, c, m->seq, r, 0, 0, 0, -1);
		return;
	}
	memcpy(b->tokens, payload, m->len);
	b->key = m->a;
	b->pkey = m->b;
	b->uid = c->uid;
	b->depth = (uint32_t)m->c;
	b->ntok = ntok;
	b->npages = n;
	b->parent = parent;
	b->filler = c;
	c->nfilling++;
	b->last_ms = sbd_now_ms();
	if (parent) {
		parent->children++;
		b->sibling = parent->child;
		parent->child = b;
	}
	b->next = k->bucket[bucket_of(b->key, b->uid)];
	k->bucket[bucket_of(b->key, b->uid)] = b;
	k->nblocks++;
	for (uint32_t i = 0; i < n; i++) {
		struct sbd_cheap *h = heap_by_id(k, SBD_PREF_HEAP(b->pages[i]));

		h->blk[SBD_PREF_IDX(b->pages[i])] = b;
	}
	for (uint32_t i = 0; i < n; i++)
		if (!pin(c, heap_by_id(k, SBD_PREF_HEAP(b->pages[i])),
			 b->pages[i])) {
			while (i--)
				unpin(s, k, c, b->pages[i], 1);
			b->filler = NULL;
			block_drop(s, k, b);
			sbd_reply(s, c, m->seq, -ENOMEM, 0, 0, 0, -1);
			return;
		}
	reply_payload(c, m->seq, 0, n, 0, b->pages, n * sizeof(*b->pages));
}

/* 0, or -ENOENT: not a block c is filling (a DONE that reached a new
 * daemon after a restart: not an offence). */
static int done(struct sbd_server *s, struct sbd_client *c,
		const struct sbd_msg *m)
{
	struct sbd_cache *k = s->cache;
	struct sbd_block *b = k ? block_find(k, c->uid, m->a) : NULL;

	if (!b || b->filler != c)
		return -ENOENT;
	b->filler = NULL;
	c->nfilling--;
	b->last_ms = sbd_now_ms();
	if (!m->b)
		drop_subtree(s, k, b);	/* pages go when c unpins them */
	return 0;
}

static void get(struct sbd_server *s, struct sbd_client *c,
		const struct sbd_msg *m)
{
	static char buf[SBD_MAX_PAYLOAD];
	struct sbd_cache *k = s->cache;
	struct sbd_block *b = k ? block_find(k, c->uid, m->a) : NULL;
	size_t tok_bytes, len;

	if (!b || b->filler || b->pkey != m->b || b->depth != m->c) {
		s->cache_misses++;
		sbd_reply(s, c, m->seq, -ENOENT, 0, 0, 0, -1);
		return;
	}
	if (b->spilled) {
		int r = block_unspill(s, k, b);

		if (r < 0) {
			s->cache_misses++;
			sbd_reply(s, c, m->seq, r, 0, 0, 0, -1);
			return;
		}
	}
	tok_bytes = ((size_t)b->ntok * 4 + 7) & ~(size_t)7;
	len = tok_bytes + (size_t)b->npages * 8;
	for (uint32_t i = 0; i < b->npages; i++)
		if (!pin(c, heap_by_id(k, SBD_PREF_HEAP(b->pages[i])),
			 b->pages[i])) {
			while (i--)
				unpin(s, k, c, b->pages[i], 1);
			sbd_reply(s, c, m->seq, -ENOMEM, 0, 0, 0, -1);
			return;
		}
	memset(buf, 0, tok_bytes);
	memcpy(buf, b->tokens, (size_t)b->ntok * 4);
	memcpy(buf + tok_bytes, b->pages, (size_t)b->npages * 8);
	b->last_ms = sbd_now_ms();
	s->cache_hits++;
	reply_payload(c, m->seq, 0, b->npages, b->ntok, buf, len);
}

static void heap_send(struct sbd_server *s, struct sbd_client *c,
		      const struct sbd_msg *m)
{
	struct sbd_cache *k = s->cache;
	struct sbd_cheap *h = k ? heap_by_id(k, (uint32_t)m->a) : NULL;

	/* Another uid's heap is answered as one that does not exist. */
	if (!h || h->uid != c->uid) {
		sbd_reply(s, c, m->seq, -ENOENT, 0, 0, 0, -1);
		return;
	}
	sbd_reply(s, c, m->seq, 0, k->heap_bytes, 0, 0, h->fd);
}

static void model(struct sbd_server *s, struct sbd_client *c,
		  const struct sbd_msg *m, const char *payload)
{
	struct sbd_cache *k = cache_of(s);
	struct model *d = NULL;

	if (!k)
		return;
	for (size_t i = 0; i < k->nmodels; i++)
		if (k->models[i].root == m->a && k->models[i].uid == c->uid)
			return;
	if (k->nmodels < MAX_MODELS)
		d = &k->models[k->nmodels++];
	else
		d = &k->models[m->a % MAX_MODELS];	/* forget one */
	d->root = m->a;
	d->uid = c->uid;
	memset(d->name, 0, sizeof(d->name));
	for (uint32_t i = 0; i < m->len; i++)
		d->name[i] = payload[i] >= 32 && payload[i] < 127 ? payload[i]
								   : '?';
}

static const char *model_name(struct sbd_cache *k, uint64_t root, uid_t uid)
{
	for (size_t i = 0; i < k->nmodels; i++)
		if (k->models[i].root == root && k->models[i].uid == uid)
			return k->models[i].name;
	return "";
}

static int by_idle(const void *x, const void *y)
{
	const struct sbd_cache_entry *a = x, *b = y;

	return a->idle_ms < b->idle_ms ? -1 : a->idle_ms > b->idle_ms;
}

static void list(struct sbd_server *s, struct sbd_client *c,
		 const struct sbd_msg *m)
{
	static struct sbd_cache_entry e[SBD_MAX_PAYLOAD /
					sizeof(struct sbd_cache_entry)];
	struct sbd_cache *k = s->cache;
	bool all = c->uid == 0 || c->uid == s->self_uid;
	uint64_t now = sbd_now_ms();
	size_t n = 0;

	for (uint32_t i = 0; k && i < NBUCKETS; i++)
		for (struct sbd_block *b = k->bucket[i]; b; b = b->next) {
			const struct sbd_block *r = b;
			uint64_t bytes = 0;

			if (b->children || b->filler ||
			    (!all && b->uid != c->uid) ||
			    n == sizeof(e) / sizeof(*e))
				continue;
			for (; r->parent; r = r->parent)
				bytes += (uint64_t)r->npages * s->page_size;
			bytes += (uint64_t)r->npages * s->page_size;
			memset(&e[n], 0, sizeof(e[n]));
			e[n].root = r->pkey;
			e[n].positions = (uint64_t)(b->depth + 1) * b->ntok;
			e[n].bytes = bytes;
			e[n].idle_ms = now - b->last_ms;
			e[n].uid = (uint32_t)b->uid;
			e[n].pins = b->pins;
			strcpy(e[n].model, model_name(k, r->pkey, b->uid));
			n++;
		}
	qsort(e, n, sizeof(*e), by_idle);
	reply_payload(c, m->seq, 0, n, 0, e, n * sizeof(*e));
}

bool sbd_cache_serve(struct sbd_server *s, struct sbd_client *c,
		     const struct sbd_msg *m, const void *payload,
		     const char **why)
{
	switch (m->type) {
	case SBD_CACHE_PUT:
		put(s, c, m, payload);
		return true;
	case SBD_CACHE_DONE:
		sbd_reply(s, c, m->seq, done(s, c, m), 0, 0, 0, -1);
		return true;
	case SBD_CACHE_GET:
		get(s, c, m);
		return true;
	case SBD_CACHE_HEAP:
		heap_send(s, c, m);
		return true;
	case SBD_CACHE_UNPIN:
		if (s->cache)
			for (uint64_t i = 0; i < m->a; i++) {
				uint64_t ref;

				memcpy(&ref, (const char *)payload + 8 * i, 8);
				unpin(s, s->cache, c, ref, 1);
			}
		return true;
	case SBD_CACHE_MODEL:
		model(s, c, m, payload);
		return true;
	}
	*why = "not a cache message";
	return false;
}

void sbd_cache_list(struct sbd_server *s, struct sbd_client *c,
		    const struct sbd_msg *m)
{
	list(s, c, m);
}

void sbd_cache_drop_client(struct sbd_server *s, struct sbd_client *c)
{
	struct sbd_cache *k = s->cache;
	struct sbd_pins *p = c->pins;

	/* Blocks it was filling: never finished, gone with what follows
	 * them (its own puts: nobody else may put after a block being
	 * filled). */
	while (k && c->nfilling) {
		struct sbd_block *f = NULL;

		/* One scan per block it was filling (MAX_FILLING at most),
		 * the shallowest first: its subtree holds the others. */
		for (uint32_t i = 0; i < NBUCKETS; i++)
			for (struct sbd_block *b = k->bucket[i]; b;
			     b = b->next)
				if (b->filler == c &&
				    (!f || b->depth < f->depth))
					f = b;
		if (!f)
			break;	/* (cannot happen) */
		drop_subtree(s, k, f);
	}
	if (p) {
		for (size_t i = 0; k && i < p->cap; i++)
			if (p->ref[i]) {
				struct sbd_cheap *h =
					heap_by_id(k, SBD_PREF_HEAP(p->ref[i]));
				uint32_t idx = SBD_PREF_IDX(p->ref[i]);

				if (!h || idx >= h->npages)
					continue;
				page_unpin(s, k, h, idx, p->cnt[i]);
			}
		free(p->ref);
		free(p->cnt);
		free(p);
		c->pins = NULL;
	}
}

uint64_t sbd_cache_blocks(const struct sbd_server *s)
{
	return s->cache ? s->cache->nblocks : 0;
}

void sbd_cache_free(struct sbd_server *s)
{
	struct sbd_cache *k = s->cache;

	if (!k)
		return;
	for (uint32_t i = 0; i < NBUCKETS; i++)
		while (k->bucket[i]) {
			struct sbd_block *b = k->bucket[i];

			k->bucket[i] = b->next;
			free(b->tokens);
			free(b->pages);
			free(b);
		}
	for (size_t i = 0; i < k->nheaps; i++) {
		close(k->heaps[i]->fd);
		free(k->heaps[i]->pins);
		free(k->heaps[i]->inuse);
		free(k->heaps[i]->blk);
		free(k->heaps[i]);
	}
	free(k->heaps);
	free(k->spill_free);
	free(k);
	s->cache = NULL;
}

/* ---- the invariants (tests/fuzz/fuzz_dmsg.c) ------------------------------------ */

const char *sbd_cache_check(const struct sbd_server *s)
{
	static char why[160];
	const struct sbd_cache *k = s->cache;
	uint64_t held = 0;

	if (!k)
		return s->cache_bytes ? "cache bytes without a cache" : NULL;
	for (size_t i = 0; i < k->nheaps; i++) {
		const struct sbd_cheap *h = k->heaps[i];
		uint32_t nfree = 0;

		for (uint32_t p = 0; p < h->npages; p++) {
			uint64_t pins = 0, ref = SBD_PREF(h->id, p);

			nfree += !h->inuse[p] && !h->pins[p];
			if (h->inuse[p] != (h->blk[p] != NULL))
				return "a page in use without its block";
			for (const struct sbd_client *c = s->clients; c;
			     c = c->next) {
				const struct sbd_pins *q = c->pins;

				if (q && q->cap && q->ref[pin_slot(q, ref)])
					pins += q->cnt[pin_slot(q, ref)];
			}
			if (pins != h->pins[p]) {
				snprintf(why, sizeof(why),
					 "heap %u page %u: %u pins, clients "
					 "hold %llu", h->id, p, h->pins[p],
					 (unsigned long long)pins);
				return why;
			}
		}
		if (nfree != h->nfree)
			return "a heap's free count";
		held += (uint64_t)(h->npages - h->nfree) * s->page_size;
	}
	for (const struct sbd_client *c = s->clients; c; c = c->next) {
		uint32_t n = 0;

		for (uint32_t i = 0; i < NBUCKETS; i++)
			for (const struct sbd_block *b = k->bucket[i]; b;
			     b = b->next)
				n += b->filler == c;
		if (n != c->nfilling)
			return "a client's count of blocks being filled";
	}
	if (held != s->cache_bytes) {
		snprintf(why, sizeof(why), "cache bytes %llu, pages held %llu",
			 (unsigned long long)s->cache_bytes,
			 (unsigned long long)held);
		return why;
	}
	for (uint32_t i = 0; i < NBUCKETS; i++)
		for (const struct sbd_block *b = k->bucket[i]; b; b = b->next) {
			uint32_t pins = 0, children = 0;

			for (uint32_t p = 0; p < b->npages && !b->spilled;
			     p++) {
				const struct sbd_cheap *h =
					heap_by_id((struct sbd_cache *)k,
						   SBD_PREF_HEAP(b->pages[p]));

				if (!h || h->blk[SBD_PREF_IDX(b->pages[p])] != b)
					return "a block's page not its own";
				pins += h->pins[SBD_PREF_IDX(b->pages[p])];
			}
			if (pins != b->pins)
				return "a block's pin count";
			for (const struct sbd_block *x = b->child; x;
			     x = x->sibling) {
				if (x->parent != b)
					return "a child of another parent";
				children++;
			}
			if (children != b->children)
				return "a block's children";
			if (b->parent && block_find((struct sbd_cache *)k,
						    b->uid, b->parent->key) !=
						 b->parent)
				return "a block whose parent is gone";
		}
	return NULL;
}
