/* SPDX-License-Identifier: MIT */
/*
 * A prefix cache for KV sequences: token ids -> the pages of a sequence
 * that computed them, shared (copy-on-write), never copied.
 *
 * Unit: a block, the fewest whole positions that fill whole pages of a
 * region (sbi_kv_block_positions: 8 positions of 2 KiB rows in 16 KiB
 * pages). A block's key is a chain hash, as vLLM's block hashes: the hash
 * of its parent's key and its own tokens, the first block's parent being
 * the model id and the geometry. So a key names a block and everything
 * before it. Keys only find candidates: a match is confirmed by comparing
 * the parent (by identity, which confirms everything before) and the
 * block's tokens in full.
 *
 * Storage: the cache's own regions (a sequence's bookkeeping, one buffer
 * per region, `cap` blocks long: address space only), a block in a slot.
 * put shares the sequence's pages into the block's slot; get shares the
 * slots of the longest match into a new sequence. The pages stay one copy
 * for every holder; whoever writes first gets a private copy (a new
 * sequence writes only past the hit, which lies on a block boundary, so in
 * practice nobody copies).
 *
 * Sliding windows: a layer with a window has released the rows before its
 * start, so a block stored from such a sequence may hold holes for that
 * layer (`complete` false; a later put from a sequence that holds it fills
 * it in). A hit of E positions needs every block within the longest
 * window before E complete: the longest match is cut back to the last end
 * where that holds (a hit never reads a hole as zeros).
 *
 * Memory: max_bytes bounds the pages only the cache holds (pages also
 * held by live sequences cost nothing more), checked at each put, where
 * the blocks just stored count whole (the sequence they came from usually
 * ends soon after: room is made for them now). Over it, the least recently
 * used blocks go first: to the pool's spill file when the pool has a disk
 * tier (a later get gives the new sequence their spill slots: each page
 * is read in, for it alone, when it first touches it, and the cache's copy
 * stays on disk), else they are released with the blocks after them. The
 * number of blocks kept (on disk included) is bounded by the slots (4x
 * max_bytes' worth, at least 256).
 *
 * On a client pool of sparsebufd the blocks also go to the daemon's
 * machine-wide cache (kv_remote.c): put publishes them and re-points the
 * store and the sequence at the daemon's copy; get asks the daemon for the
 * blocks after the local match. max_bytes then bounds what this process
 * keeps mapped of the machine's cache (which the daemon cannot let go of
 * while it is mapped): over it, such blocks are let go of here, never
 * written to this pool's disk; the daemon keeps them.
 *
 * Calls on one cache are serialized by its lock; the sequences it returns
 * are the caller's, as any sequence.
 */
#include "internal.h"
#include "kv_seq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MIN_SLOTS 256
#define MAX_SLOTS ((size_t)1 << 20)

struct block {
	uint64_t key;		/* chain hash */
	struct block *parent;	/* NULL: the first block */
	struct block *next;	/* in the hash bucket */
	int32_t *tokens;	/* (B) */
	size_t slot;
	size_t depth;		/* positions [depth * B, (depth + 1) * B) */
	uint64_t last_use;
	uint32_t children;
	bool complete;		/* every windowed layer's rows are in it */
	bool spilled;		/* its pages went to disk */
	bool doomed;		/* being dropped (drop_subtree) */
	bool remote;		/* its slot maps sparsebufd's cache pages, */
	uint64_t rgen;		/* of this connection (a new daemon has
				 * none of them: published again) */
};

struct sb_kv_cache {
	pthread_mutex_t lock;
	struct sb_pool *pool;
	struct sb_kv_seq *proto;	/* the configuration (no regions) */
	struct sb_kv_seq *store;	/* the cache's regions (no len) */
	char *model_id;
	uint64_t root;		/* key of "before the first block" */
	size_t B;		/* positions per block */
	size_t bb;		/* bytes per block per region */
	size_t max_bytes;
	size_t cap;		/* slots */
	struct block **slot;	/* (cap) slot -> block */
	size_t *free_slots;	/* stack */
	size_t nfree, next_slot;
	struct block **bucket;	/* (nbuckets), a power of two */
	size_t nbuckets;
	size_t nblocks;
	uint64_t tick;
	bool remote;		/* a client pool's: blocks go machine-wide */
};

static struct sb_kv_cache *fail_c(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

static struct sb_kv_seq *fail_s(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

/* ---- keys ---------------------------------------------------------------------- */

static uint64_t mix(uint64_t h, uint64_t v)
{
	/* splitmix64's finaliser over h ^ v, then a rotate-multiply step:
	 * a block's key depends on every token and on their order. */
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h ^= h >> 30;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 27;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 31;
	return h;
}

static uint64_t block_key(uint64_t parent, const int32_t *t, size_t B)
{
	uint64_t h = mix(parent, B);

	for (size_t i = 0; i < B; i++)
		h = mix(h, (uint32_t)t[i]);
	return h;
}

static uint64_t root_key(const char *model_id, const struct sb_kv_seq *s)
{
	uint64_t h = 0x53424b5643414348ull;	/* "SBKVCACH" */

	for (const char *c = model_id; *c; c++)
		h = mix(h, (unsigned char)*c);
	h = mix(h, (uint64_t)s->cfg.n_layers);
	h = mix(h, (uint64_t)s->cfg.n_kv_heads);
	h = mix(h, (uint64_t)s->cfg.head_dim);
	h = mix(h, (uint64_t)s->cfg.dtype);
	for (int l = 0; l < s->cfg.n_layers; l++)
		h = mix(h, (uint64_t)s->window[l]);
	return h;
}

static struct block *find(struct sb_kv_cache *c, uint64_t key,
			  const struct block *parent, const int32_t *t)
{
	for (struct block *b = c->bucket[key & (c->nbuckets - 1)]; b;
	     b = b->next)
		if (b->key == key && b->parent == parent &&
		    !memcmp(b->tokens, t, c->B * sizeof(*t)))
			return b;
	return NULL;
}

/* The cached blocks of tokens' first nb blocks, in chain (as many as
 * match, returned), each marked used by this call. */
static size_t match(struct sb_kv_cache *c, const int32_t *tokens, size_t nb,
		    struct block **chain)
{
	struct block *parent = NULL;
	uint64_t key = c->root;
	size_t i;

	for (i = 0; i < nb; i++) {
		struct block *b;

		key = block_key(key, tokens + i * c->B, c->B);
		b = find(c, key, parent, tokens + i * c->B);
		if (!b)
			break;
		b->last_use = c->tick;
		chain[i] = parent = b;
	}
	return i;
}

/* ---- slots and pages ------------------------------------------------------------ */

/* Pages of the block's slot only the cache holds, over every region. */
static size_t sole_pages(struct sb_kv_cache *c, const struct block *b)
{
	size_t per = c->bb / c->store->page, n = 0;

	for (size_t g = 0; g < c->store->nregions; g++) {
		long r = sbi_buf_sole_pages(c->store->buf[g], b->slot * per,
					    (b->slot + 1) * per);

		if (r > 0)
			n += (size_t)r;
	}
	return n;
}

/* Pages placed in the block's slot, over every region. */
static size_t placed_pages(struct sb_kv_cache *c, const struct block *b)
{
	size_t n = 0;

	for (size_t g = 0; g < c->store->nregions; g++) {
		long r = sb_buf_placed(c->store->buf[g], b->slot * c->bb, c->bb);

		if (r > 0)
			n += (size_t)r;
	}
	return n;
}

static void unlink_block(struct sb_kv_cache *c, struct block *b)
{
	struct block **pp = &c->bucket[b->key & (c->nbuckets - 1)];

	while (*pp != b)
		pp = &(*pp)->next;
	*pp = b->next;
	if (b->parent)
		b->parent->children--;
	c->slot[b->slot] = NULL;
	c->free_slots[c->nfree++] = b->slot;
	c->nblocks--;
	free(b->tokens);
	free(b);
}

/* Release a block's pages and forget it (it has no children). */
static void drop(struct sb_kv_cache *c, struct block *b)
{
	for (size_t g = 0; g < c->store->nregions; g++)
		(void)sb_buf_unmap(c->store->buf[g], b->slot * c->bb, c->bb);
	unlink_block(c, b);
}

/* The least recently used block with no children, not used by the call
 * in progress. */
static struct block *lru_leaf(struct sb_kv_cache *c)
{
	struct block *best = NULL;

	for (size_t i = 0; i < c->next_slot; i++) {
		struct block *b = c->slot[i];

		if (!b || b->children || b->last_use == c->tick)
			continue;
		if (!best || b->last_use < best->last_use)
			best = b;
	}
	return best;
}

static int by_depth_desc(const void *x, const void *y)
{
	const struct block *a = *(struct block *const *)x;
	const struct block *b = *(struct block *const *)y;

	return a->depth < b->depth ? 1 : a->depth > b->depth ? -1 : 0;
}

/* Drop b and every block after it (a block without its parent could
 * never be found). They were used no more recently than b. Returns the
 * pages only the cache held among them, from mine[] (by slot). */
static size_t drop_subtree(struct sb_kv_cache *c, struct block *b,
			   const size_t *mine)
{
	struct block **doomed;
	size_t n = 0, pages = 0;
	bool changed = true;

	doomed = malloc(c->nblocks * sizeof(*doomed));
	if (!doomed)
		return 0;
	doomed[n++] = b;
	b->doomed = true;
	/* Marked parents mark their children, a level per pass. */
	while (changed) {
		changed = false;
		for (size_t i = 0; i < c->next_slot; i++) {
			struct block *d = c->slot[i];

			if (d && !d->doomed && d->parent && d->parent->doomed) {
				d->doomed = true;
				doomed[n++] = d;
				changed = true;
			}
		}
	}
	/* Children before their parents. */
	qsort(doomed, n, sizeof(*doomed), by_depth_desc);
	for (size_t i = 0; i < n; i++) {
		if (!doomed[i]->spilled)
			pages += mine[doomed[i]->slot];
		drop(c, doomed[i]);
	}
	free(doomed);
	return pages;
}

static int by_last_use(const void *x, const void *y, void *arg)
{
	struct sb_kv_cache *c = arg;
	const struct block *a = c->slot[*(const size_t *)x];
	const struct block *b = c->slot[*(const size_t *)y];

	if (a->last_use != b->last_use)
		return a->last_use < b->last_use ? -1 : 1;
	/* Deeper first: the end of a prefix before its beginning. */
	return a->depth < b->depth ? 1 : a->depth > b->depth ? -1 : 0;
}

/* Bring the pages only the cache holds within max_bytes. The least
 * recently used blocks that hold such pages go first: to disk when the
 * pool has a disk tier (any block may: it stays findable), else released
 * with the blocks after them. Blocks whose pages live sequences hold too
 * cost nothing and stay. */
static void trim(struct sb_kv_cache *c)
{
	bool disk = atomic_load(&c->pool->disk) != NULL;
	size_t n = c->next_slot, nc = 0, pages = 0;
	size_t max_pages = c->max_bytes / c->store->page;
	size_t *mine, *order;

	mine = calloc(n ? n : 1, sizeof(*mine));
	order = calloc(n ? n : 1, sizeof(*order));
	if (!mine || !order)
		goto out;
	for (size_t i = 0; i < n; i++) {
		struct block *b = c->slot[i];

		if (!b || b->spilled)
			continue;
		/* The blocks of this call are counted whole, though the
		 * sequence they came from holds them too: it usually goes
		 * away soon after, and the older blocks must make room for
		 * them then. They are never the ones to go. */
		if (b->last_use == c->tick) {
			pages += placed_pages(c, b);
			continue;
		}
		mine[i] = sole_pages(c, b);
		pages += mine[i];
		if (mine[i])
			order[nc++] = i;
	}
	if (pages <= max_pages)
		goto out;
	qsort_r(order, nc, sizeof(*order), by_last_use, c);
	for (size_t k = 0; k < nc && pages > max_pages; k++) {
		struct block *b = c->slot[order[k]];
		/* A block in sparsebufd's cache is let go of here, never
		 * written to this pool's disk: the daemon keeps it (and
		 * may, now that nothing here pins it, spill or drop it). */
		bool ok = disk && !b->remote;

		if (!b || b->spilled || b->doomed)
			continue;
		for (size_t g = 0; ok && g < c->store->nregions; g++)
			ok = sb_buf_evict(c->store->buf[g], b->slot * c->bb,
					  c->bb) >= 0;
		if (ok) {
			b->spilled = true;
			pages -= mine[b->slot];
			continue;
		}
		/* No disk tier, or it failed (full): release. A block used
		 * by this call is never dropped (a subtree of an older
		 * block holds none: a use touches the whole chain). */
		pages -= drop_subtree(c, b, mine);
	}
out:
	free(mine);
	free(order);
}

/* A free slot, making room if every slot is taken. */
static bool take_slot(struct sb_kv_cache *c, size_t *slot)
{
	struct block *b;

	if (c->nfree) {
		*slot = c->free_slots[--c->nfree];
		return true;
	}
	if (c->next_slot < c->cap) {
		*slot = c->next_slot++;
		return true;
	}
	b = lru_leaf(c);
	if (!b)
		return false;
	drop(c, b);
	*slot = c->free_slots[--c->nfree];
	return true;
}

/* Share blocks [i, j) between a sequence's regions (positions from
 * i * B) and their slots, in runs of consecutive slots: to the cache
 * (put) or from it (get). */
/* Pages of a store range on disk (the store is the cache's alone and
 * never evicted by the pool: stable under the cache's lock). */
static size_t disk_pages(const struct sb_buf *cb, size_t first, size_t n)
{
	size_t k = 0;

	for (size_t i = first; i < first + n; i++)
		k += (cb->pte[i] & SBI_PTE_DISK) != 0;
	return k;
}

/* Share blocks [i, j) between a sequence's regions (positions from
 * i * B) and their slots, in runs of consecutive slots: to the cache
 * (put) or from it (get). A get of blocks on disk is lazy: the sequence
 * gets their spill slots, and reads each page in when it first touches
 * it (sbi_buf_share_disk); the cache's copy stays on disk. */
static long share_blocks(struct sb_kv_cache *c, struct sb_kv_seq *s,
			 struct block **chain, size_t i, size_t j, bool put)
{
	size_t per = c->bb / c->store->page;

	while (i < j) {
		size_t k = i + 1;
		bool lazy = !put && chain[i]->spilled, eager = false;

		while (k < j && chain[k]->slot == chain[k - 1]->slot + 1 &&
		       chain[k]->spilled == chain[i]->spilled)
			k++;
		for (size_t g = 0; g < s->nregions; g++) {
			struct sb_buf *sb = s->buf[g];
			struct sb_buf *cb = c->store->buf[g];
			size_t so = i * c->bb, co = chain[i]->slot * c->bb;
			size_t len = (k - i) * c->bb, n = (k - i) * per;
			long r;

			if (lazy &&
			    sbi_buf_share_disk(sb, so / c->store->page, cb,
					       co / c->store->page, n) ==
				    (long)disk_pages(cb, co / c->store->page,
						     n))
				continue;
			/* Resident, or a slot that could not take another
			 * holder: shared now (pages on disk read in). */
			eager |= lazy;
			r = put ? sb_buf_share(cb, co, sb, so, len)
				: sb_buf_share(sb, so, cb, co, len);
			if (r < 0)
				return r;
		}
		for (size_t t = i; t < k; t++)
			if (!lazy || eager)
				chain[t]->spilled = false;
		i = k;
	}
	return 0;
}

/* ---- the API --------------------------------------------------------------------- */

SB_API struct sb_kv_cache *sb_kv_cache_create_sz(struct sb_pool *pool,
						 const struct sb_kv_config *ucfg,
						 size_t cfg_size,
						 const char *model_id,
						 size_t max_bytes, int *err)
{
	struct sb_kv_cache *c;
	struct sb_kv_config sc, cfgv, *cfg = &cfgv;
	struct sb_kv_seq *probe;
	size_t per_block;
	int e;

	if (!pool || !ucfg || !model_id)
		return fail_c(err, -EINVAL);
	e = sbi_struct_in(&cfgv, sizeof(cfgv), ucfg, cfg_size,
			  SBI_SIZE_KV_CONFIG_0_1);
	if (e < 0)
		return fail_c(err, e);
	/* The geometry, checked as sb_kv_create does. */
	probe = sbi_kv_alloc(pool, cfg, err);
	if (!probe)
		return NULL;
	c = calloc(1, sizeof(*c));
	if (!c) {
		sbi_kv_free(probe);
		return fail_c(err, -ENOMEM);
	}
	pthread_mutex_init(&c->lock, NULL);
	SBI_LK_RANK(&c->lock, SBI_RANK_API, 0);
	c->pool = pool;
	c->B = sbi_kv_block_positions(probe);
	c->bb = c->B * probe->row;
	c->max_bytes = max_bytes;
	c->root = root_key(model_id, probe);
	per_block = c->bb * probe->nregions;
	c->cap = max_bytes / per_block * 4;
	if (c->cap < MIN_SLOTS)
		c->cap = MIN_SLOTS;
	if (c->cap > MAX_SLOTS)
		c->cap = MAX_SLOTS;
	/* The store: the same regions, cap blocks long, never evicted by
	 * the pool on its own (the cache says what goes to disk). */
	sc = *cfg;
	sc.window = probe->window;
	sc.flags = 0;
	sc.max_ctx = c->cap * c->B;
	sc.lookahead = 0;
	c->store = sbi_kv_alloc(pool, &sc, &e);
	c->proto = probe;
	c->model_id = strdup(model_id);
	c->slot = calloc(c->cap, sizeof(*c->slot));
	c->free_slots = calloc(c->cap, sizeof(*c->free_slots));
	c->nbuckets = 1024;
	c->bucket = calloc(c->nbuckets, sizeof(*c->bucket));
	if (!c->store || !c->model_id || !c->slot || !c->free_slots ||
	    !c->bucket) {
		e = c->store ? -ENOMEM : e;
		sb_kv_cache_destroy(c);
		return fail_c(err, e);
	}
	c->store->buf = calloc(c->store->nregions, sizeof(*c->store->buf));
	if (!c->store->buf) {
		sb_kv_cache_destroy(c);
		return fail_c(err, -ENOMEM);
	}
	for (size_t g = 0; g < c->store->nregions; g++) {
		c->store->buf[g] = sb_buf_create(pool, c->store->region, 0, &e);
		if (!c->store->buf[g]) {
			sb_kv_cache_destroy(c);
			return fail_c(err, e);
		}
	}
	/* On a client pool the blocks also go to sparsebufd's cache, where
	 * every process of this uid finds them (kv_remote.c). */
	c->remote = sbi_kvr_usable(pool, c->store, c->bb / c->store->page,
				   c->B) &&
		    sbi_env_daemon_cache();
	if (c->remote)
		sbi_dclient_cache_model(pool->client, c->root, model_id);
	return c;
}

SB_API void sb_kv_cache_destroy(struct sb_kv_cache *c)
{
	if (!c)
		return;
	for (size_t i = 0; c->slot && i < c->next_slot; i++)
		if (c->slot[i]) {
			free(c->slot[i]->tokens);
			free(c->slot[i]);
		}
	sbi_kv_free(c->store);	/* releases every page it holds */
	sbi_kv_free(c->proto);
	free(c->model_id);
	free(c->slot);
	free(c->free_slots);
	free(c->bucket);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* The sequence's geometry is the cache's. */
static bool same_geometry(const struct sb_kv_cache *c,
			  const struct sb_kv_seq *s)
{
	const struct sb_kv_seq *t = c->proto;

	if (s->pool != c->pool || s->cfg.n_layers != t->cfg.n_layers ||
	    s->cfg.n_kv_heads != t->cfg.n_kv_heads ||
	    s->cfg.head_dim != t->cfg.head_dim || s->cfg.dtype != t->cfg.dtype)
		return false;
	for (int l = 0; l < s->cfg.n_layers; l++)
		if (s->window[l] != t->window[l])
			return false;
	return true;
}

/* Block i's rows are held by s in every windowed layer: the block's
 * first page was not released (pages wholly before the start are). */
static bool block_held(const struct sb_kv_cache *c, const struct sb_kv_seq *s,
		       size_t i)
{
	size_t p0 = i * c->bb / s->page;

	for (int l = 0; l < s->cfg.n_layers; l++)
		if (s->window[l] && (p0 + 1) * s->page <= s->start[l] * s->row)
			return false;
	return true;
}

/* The longest window of the geometry, in positions. */
static size_t max_window(const struct sb_kv_seq *s)
{
	size_t w = 0;

	for (int l = 0; l < s->cfg.n_layers; l++)
		if ((size_t)s->window[l] > w)
			w = (size_t)s->window[l];
	return w;
}

/* Refill a block stored with holes from a sequence that holds it. */
static void complete_block(struct sb_kv_cache *c, struct sb_kv_seq *s,
			   struct block *b, size_t i)
{
	for (size_t g = 0; g < s->nregions; g++)
		if (sb_buf_share(c->store->buf[g], b->slot * c->bb, s->buf[g],
				 i * c->bb, c->bb) < 0)
			return;
	b->complete = true;
	b->spilled = false;
}

/* A new block for chain[i] (tokens' i-th block, after chain[i - 1]), in
 * a slot of its own, used by this call: NULL when out of memory or of
 * slots. Its pages are the caller's to place. */
static struct block *new_block(struct sb_kv_cache *c, struct block **chain,
			       size_t i, const int32_t *tokens)
{
	struct block *b = calloc(1, sizeof(*b));
	size_t slot;

	if (b)
		b->tokens = malloc(c->B * sizeof(*b->tokens));
	if (!b || !b->tokens || !take_slot(c, &slot)) {
		if (b)
			free(b->tokens);
		free(b);
		return NULL;
	}
	b->key = block_key(i ? chain[i - 1]->key : c->root, tokens + i * c->B,
			   c->B);
	memcpy(b->tokens, tokens + i * c->B, c->B * sizeof(*b->tokens));
	b->parent = i ? chain[i - 1] : NULL;
	b->slot = slot;
	b->depth = i;
	b->last_use = c->tick;
	b->next = c->bucket[b->key & (c->nbuckets - 1)];
	c->bucket[b->key & (c->nbuckets - 1)] = b;
	c->slot[slot] = b;
	c->nblocks++;
	if (b->parent)
		b->parent->children++;
	chain[i] = b;
	return b;
}

/* ---- machine-wide: a client pool's cache (kv_remote.c) --------------------------- */

/*
 * Publish the blocks of chain[0, n) not in sparsebufd's cache yet, and
 * share each back into s (which holds it): s then maps the machine's copy,
 * and its own pages go. A chain is published from its start, without a
 * gap: the first block that cannot go (incomplete, on disk, no room on the
 * machine) ends it. A block someone else cached first is fetched instead.
 */
static void publish(struct sb_kv_cache *c, struct sb_kv_seq *s,
		    struct block **chain, size_t n)
{
	size_t per = c->bb / c->store->page;

	for (size_t k = 0; k < n && c->remote; k++) {
		struct block *b = chain[k];
		uint64_t pkey = k ? chain[k - 1]->key : c->root;
		uint64_t gen = 0;
		int r;

		if (b->remote &&
		    b->rgen == sbi_dclient_gen(c->pool->client))
			continue;
		if (!b->complete || b->spilled)
			break;
		r = sbi_kvr_publish(c->store, b->slot * per, per, b->key, pkey,
				    (uint32_t)k, b->tokens, (uint32_t)c->B,
				    &gen);
		if (r == -EEXIST)
			r = sbi_kvr_fetch(c->store, b->slot * per, per, b->key,
					  pkey, (uint32_t)k, b->tokens,
					  (uint32_t)c->B, &gen);
		if (r == -EOPNOTSUPP) {
			sbi_warn("KV cache \"%s\": this pool's heaps are "
				 "smaller than sparsebufd's cache heaps; the "
				 "cache stays in this process", c->model_id);
			c->remote = false;
		}
		if (r < 0)
			break;
		b->remote = true;
		b->rgen = gen;
		if (k * c->B < s->len && block_held(c, s, k))
			for (size_t g = 0; g < s->nregions; g++)
				(void)sb_buf_share(s->buf[g], k * c->bb,
						   c->store->buf[g],
						   b->slot * c->bb, c->bb);
	}
}

/* Extend the match chain[0, i) with the daemon's blocks for tokens'
 * blocks from i on; returns the new length. */
static size_t fetch_more(struct sb_kv_cache *c, const int32_t *tokens,
			 size_t i, size_t nb, struct block **chain)
{
	size_t per = c->bb / c->store->page;

	for (; i < nb && c->remote; i++) {
		struct block *b = new_block(c, chain, i, tokens);
		uint64_t gen = 0;
		int r;

		if (!b)
			break;
		r = sbi_kvr_fetch(c->store, b->slot * per, per, b->key,
				  i ? chain[i - 1]->key : c->root, (uint32_t)i,
				  b->tokens, (uint32_t)c->B, &gen);
		if (r < 0) {
			drop(c, b);
			if (r == -EOPNOTSUPP)
				c->remote = false;
			break;
		}
		b->remote = b->complete = true;
		b->rgen = gen;
	}
	return i;
}

SB_API long sb_kv_cache_put(struct sb_kv_cache *c, struct sb_kv_seq *s,
			    const int32_t *tokens, size_t n)
{
	struct block **chain = NULL;
	size_t nb, i, fresh;
	long r = 0;

	if (!c || !s || (n && !tokens))
		return -EINVAL;
	if (!same_geometry(c, s))
		return -EINVAL;
	if (n > s->len)
		return -ERANGE;
	nb = n / c->B;
	if (!nb)
		return 0;
	chain = calloc(nb, sizeof(*chain));
	if (!chain)
		return -ENOMEM;
	pthread_mutex_lock(&c->lock);
	c->tick++;
	/* The blocks already cached; those stored with holes that this
	 * sequence holds are filled in. */
	i = match(c, tokens, nb, chain);
	for (size_t k = 0; k < i; k++)
		if (!chain[k]->complete && block_held(c, s, k))
			complete_block(c, s, chain[k], k);
	/* The rest, new: a slot each, then their pages shared in. */
	for (fresh = i; i < nb; i++) {
		struct block *b = new_block(c, chain, i, tokens);

		if (!b) {
			/* Out of memory, or of slots (every one in use by
			 * this call): keep what fits. */
			r = c->nfree || c->next_slot < c->cap ? -ENOMEM : 0;
			break;
		}
		b->complete = block_held(c, s, i);
	}
	if (i > fresh) {
		long e = share_blocks(c, s, chain, fresh, i, true);

		if (e < 0) {
			/* Forget the new blocks, deepest first. */
			while (i > fresh)
				drop(c, chain[--i]);
			r = e;
		}
	}
	if (c->remote && i > 0)
		publish(c, s, chain, i);
	if (r == 0 || i > 0)
		trim(c);
	pthread_mutex_unlock(&c->lock);
	free(chain);
	return r < 0 && i == 0 ? r : (long)(i * c->B);
}

SB_API struct sb_kv_seq *sb_kv_cache_get(struct sb_kv_cache *c,
					 const int32_t *tokens, size_t n,
					 size_t *hit, int *err)
{
	struct block **chain = NULL;
	struct sb_kv_seq *s;
	size_t nb, i, end = 0;
	long r;
	int e;

	if (hit)
		*hit = 0;
	if (!c || (n && !tokens) || !hit)
		return fail_s(err, -EINVAL);
	s = sbi_kv_new_empty(c->pool, &c->proto->cfg, &e);
	if (!s)
		return fail_s(err, e);
	if (n > s->cfg.max_ctx)
		n = s->cfg.max_ctx;
	nb = n / c->B;
	if (nb && !(chain = calloc(nb, sizeof(*chain)))) {
		sb_kv_destroy(s);
		return fail_s(err, -ENOMEM);
	}
	pthread_mutex_lock(&c->lock);
	c->tick++;
	i = match(c, tokens, nb, chain);
	if (c->remote && i < nb) {
		size_t local = i;

		i = fetch_more(c, tokens, i, nb, chain);
		/* What this process maps of the machine's cache stays
		 * within max_bytes: older blocks let go of. */
		if (i > local)
			trim(c);
	}
	/* The longest end whose window holds no hole. */
	for (end = i; end > 0; end--) {
		size_t pos = end * c->B, w = max_window(c->proto), j;
		bool ok = true;

		for (j = pos > w ? (pos - w) / c->B : 0; j < end && ok; j++)
			ok = chain[j]->complete;
		if (ok)
			break;
	}
	r = end ? share_blocks(c, s, chain, 0, end, false) : 0;
	pthread_mutex_unlock(&c->lock);
	free(chain);
	if (r < 0) {
		sb_kv_destroy(s);
		return fail_s(err, (int)r);
	}
	s->len = end * c->B;
	for (size_t g = 0; g < s->nregions; g++)
		s->placed[g] = s->asked[g] = s->len * s->row;
	for (int l = 0; l < s->cfg.n_layers; l++) {
		size_t w = (size_t)s->window[l];

		s->start[l] = w && s->len > w ? s->len - w : 0;
	}
	*hit = s->len;
	return s;
}
