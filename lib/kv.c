/* SPDX-License-Identifier: MIT */
/*
 * A KV cache on sparse buffers (sparsebuf_kv.h). The layout is chosen by
 * measurement (docs/kv.md): position-major regions, one per layer for K and
 * one for V, each its own sparse buffer (so that each grows through its own
 * runs of heap pages: one kernel mapping per run, and the pool keeps the
 * next page of every region ready).
 *
 * Growth: every region grows by one row per position, so all of them cross
 * a page boundary at the same position. Placing 2 * n_layers pages at that
 * one step would stall it (72 x ~15 us for Qwen3-4B); instead region r
 * places its next page a staggered few positions early (r-th fraction of
 * the lookahead), spreading the placements over several steps.
 */
#include "internal.h"
#include "kv_seq.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static size_t dtype_size(enum sb_kv_dtype t)
{
	switch (t) {
	case SB_KV_F32:
		return 4;
	case SB_KV_F16:
	case SB_KV_BF16:
		return 2;
	default:
		return 0;
	}
}

static size_t round_up(size_t v, size_t to)
{
	return (v + to - 1) / to * to;
}

static struct sb_kv_seq *fail(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

void sbi_kv_free(struct sb_kv_seq *s)
{
	if (!s)
		return;
	for (size_t g = 0; s->buf && g < s->nregions; g++)
		sb_buf_destroy(s->buf[g]);
	free(s->buf);
	free(s->window);
	free(s->placed);
	free(s->asked);
	free(s->ranges);
	free(s->start);
	free(s->user);
	free(s);
}

struct sb_kv_seq *sbi_kv_alloc(struct sb_pool *pool,
			       const struct sb_kv_config *cfg, int *err)
{
	struct sb_stats st;
	struct sb_kv_seq *s;
	size_t elt, page, rows_per_page;
	int r;

	if (!pool || !cfg || cfg->n_layers <= 0 || cfg->n_kv_heads <= 0 ||
	    cfg->head_dim <= 0 || cfg->max_ctx == 0 ||
	    (cfg->flags & ~SB_KV_EVICTABLE))
		return fail(err, -EINVAL);
	elt = dtype_size(cfg->dtype);
	if (!elt)
		return fail(err, -EINVAL);
	if ((r = sb_pool_stats(pool, &st)) < 0)
		return fail(err, r);
	page = st.page_size;
	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(err, -ENOMEM);
	s->pool = pool;
	s->page = page;
	s->cfg = *cfg;
	s->row = elt * (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim;
	if (cfg->max_ctx > SIZE_MAX / s->row / 4 / (size_t)cfg->n_layers) {
		free(s);
		return fail(err, -EINVAL);
	}
	s->region = round_up(cfg->max_ctx * s->row, page);
	s->nregions = 2 * (size_t)cfg->n_layers;
	rows_per_page = page / s->row ? page / s->row : 1;
	/* A page of rows, staggered over the regions: every region's next
	 * page is asked of the pool's background thread at a different
	 * position in the page before, so the requests spread over the whole
	 * page's worth of steps (and over the attention passes between,
	 * which keep the CPUs busy), and each region holds at most one page
	 * ahead. */
	s->lookahead = cfg->lookahead;
	if (!s->lookahead)
		s->lookahead = rows_per_page;
	s->window = calloc((size_t)cfg->n_layers, sizeof(*s->window));
	s->placed = calloc(s->nregions, sizeof(*s->placed));
	s->asked = calloc(s->nregions, sizeof(*s->asked));
	s->ranges = calloc(s->nregions, sizeof(*s->ranges));
	s->start = calloc((size_t)cfg->n_layers, sizeof(*s->start));
	if (!s->window || !s->placed || !s->asked || !s->ranges || !s->start) {
		sbi_kv_free(s);
		return fail(err, -ENOMEM);
	}
	for (int l = 0; l < cfg->n_layers; l++) {
		int w = cfg->window ? cfg->window[l] : 0;

		if (w < 0 || (size_t)w > cfg->max_ctx) {
			sbi_kv_free(s);
			return fail(err, -EINVAL);
		}
		s->window[l] = w;
	}
	s->cfg.window = s->window;
	return s;
}

static int place_first(struct sb_kv_seq *s);

static struct sb_kv_seq *kv_new(struct sb_pool *pool,
				const struct sb_kv_config *cfg, bool first,
				int *err)
{
	struct sb_kv_seq *s = sbi_kv_alloc(pool, cfg, err);
	int e;

	if (!s)
		return NULL;
	s->buf = calloc(s->nregions, sizeof(*s->buf));
	if (!s->buf) {
		sbi_kv_free(s);
		return fail(err, -ENOMEM);
	}
	for (size_t g = 0; g < s->nregions; g++) {
		s->buf[g] = sb_buf_create(pool, s->region,
					  sbi_kv_region_flags(cfg), &e);
		if (!s->buf[g]) {
			sbi_kv_free(s);
			return fail(err, e);
		}
	}
	/* No reserve of its own: every region's next page is asked of the
	 * pool's background thread at a different step (sb_kv_prepare), so
	 * there is no burst to hold pages for, and what the pool holds beyond
	 * the pages in use stays within its adaptive reserve (12 MiB). */
	if (first && (e = place_first(s)) < 0) {
		sbi_kv_free(s);
		return fail(err, e);
	}
	/* Setup, like a dense cache's allocation: let the pool build its
	 * reserve before the first pass (bounded in pages and time). */
	if (first)
		sbi_pool_wait_ready(pool, 2 * s->nregions, 500);
	return s;
}

struct sb_kv_seq *sbi_kv_new_empty(struct sb_pool *pool,
				   const struct sb_kv_config *cfg, int *err)
{
	return kv_new(pool, cfg, false, err);
}

unsigned sbi_kv_region_flags(const struct sb_kv_config *cfg)
{
	/* Growth by touch alone (no sb_kv_prepare) takes no fault: the
	 * pool keeps each region's next page placed ahead. An evictable
	 * region cannot have that (eviction decides what stays placed):
	 * sb_kv_prepare's requests ahead do the same for it. */
	return cfg->flags & SB_KV_EVICTABLE ? SB_BUF_EVICTABLE : SB_BUF_GROWS;
}

size_t sbi_kv_block_positions(const struct sb_kv_seq *s)
{
	size_t a = s->page, b = s->row;

	while (b) {	/* gcd(page, row) */
		size_t t = a % b;

		a = b;
		b = t;
	}
	return s->page / a;
}

SB_API struct sb_kv_seq *sb_kv_create_sz(struct sb_pool *pool,
					 const struct sb_kv_config *cfg,
					 size_t size, int *err)
{
	struct sb_kv_config c;
	int r;

	if (!cfg)
		return fail(err, -EINVAL);
	r = sbi_struct_in(&c, sizeof(c), cfg, size, SBI_SIZE_KV_CONFIG_0_1);
	if (r < 0)
		return fail(err, r);
	return kv_new(pool, &c, true, err);
}

SB_API struct sb_kv_seq *sb_kv_create(struct sb_pool *pool,
				      const struct sb_kv_config *cfg, int *err)
{
	return sb_kv_create_sz(pool, cfg, SBI_SIZE_KV_CONFIG_0_1, err);
}

/* A sequence's first pages, placed at creation (setup, as a dense cache's
 * allocation is): two per region, or the whole region if smaller. The
 * first passes then place nothing, while the pool's background thread
 * builds the reserve for the bursts that follow. */
static int place_first(struct sb_kv_seq *s)
{
	size_t first = 2 * s->page < s->region ? 2 * s->page : s->region;

	for (size_t g = 0; g < s->nregions; g++) {
		long r = sb_buf_map(s->buf[g], 0, first);

		if (r < 0)
			return (int)r;
		s->placed[g] = s->asked[g] = first;
	}
	return 0;
}

SB_API void sb_kv_destroy(struct sb_kv_seq *s)
{
	sbi_kv_free(s);
}

/* Place region r's pages up to byte `upto` from its start, now. */
static long place_upto(struct sb_kv_seq *s, size_t r, size_t upto)
{
	long n;

	if (upto <= s->placed[r])
		return 0;
	n = sb_buf_map(s->buf[r], s->placed[r], upto - s->placed[r]);
	if (n >= 0) {
		s->placed[r] = round_up(upto, s->page);
		if (s->asked[r] < s->placed[r])
			s->asked[r] = s->placed[r];
	}
	return n;
}

SB_API long sb_kv_prepare(struct sb_kv_seq *s, size_t n)
{
	size_t end, nr = 0;
	long total = 0, r;

	if (!s)
		return -EINVAL;
	if (n > s->cfg.max_ctx || s->len > s->cfg.max_ctx - n)
		return -ERANGE;
	end = s->len + n;
	/* The decoding thread: the pool's background thread keeps off its
	 * CPU (a thread may move; this is called every step). */
	sbi_pool_note_caller(s->pool);
	/* What the pass writes: required, placed now if the prefetcher has
	 * not done it yet (then this finds the pages placed and costs a
	 * lock and a look at the page table, once per page). */
	for (size_t g = 0; g < s->nregions; g++) {
		r = place_upto(s, g, end * s->row);
		if (r < 0)
			return r;
		total += r;
	}
	/* A deadline for the background thread, staggered the same way: by
	 * 1 + g/nregions of half the lookahead before it is needed, region
	 * g's next page is placed here if the background thread has not yet
	 * (memory slow to fault in, as on a VM whose host took back freed
	 * memory, or CPUs busy with other work). A late background thread
	 * then costs this thread about one placement a step, instead of one
	 * per region all at the step where every region crosses into its
	 * next page. Advice: an error is left for the pass that needs the
	 * rows. */
	for (size_t g = 0; g < s->nregions; g++) {
		size_t half = s->lookahead / 2 ? s->lookahead / 2 : 1;
		size_t due = end + 1 + g * (half - 1) / s->nregions;

		if (due > s->cfg.max_ctx)
			due = s->cfg.max_ctx;
		r = place_upto(s, g, due * s->row);
		if (r > 0)
			total += r;
	}
	/* Ahead, staggered: region g looks (1 + g/nregions) / 2 of the
	 * lookahead ahead, so the regions' next pages are asked for on
	 * different steps, and asked of the pool's background thread, so
	 * this thread does not place them. Never less than half the
	 * lookahead: a burst of other work (an attention pass on every CPU)
	 * may keep the background thread off the CPUs for a while right
	 * after the request, and it must still be done in time. */
	for (size_t g = 0; g < s->nregions; g++) {
		size_t half = s->lookahead / 2 ? s->lookahead / 2 : 1;
		size_t want = end + half + g * half / s->nregions;

		if (want > s->cfg.max_ctx)
			want = s->cfg.max_ctx;
		want = round_up(want * s->row, s->page);
		if (want <= s->asked[g])
			continue;
		s->ranges[0] = (struct sb_range){s->asked[g],
						 want - s->asked[g]};
		/* Advice only: if it fails, the pass places what it needs
		 * itself. */
		if (sb_buf_prefetch(s->buf[g], s->ranges, 1, 0) >= 0)
			s->asked[g] = want;
		nr++;
	}
	(void)nr;
	return total;
}

/* Release the pages of layer l's regions wholly before position `start`. */
static long release_before(struct sb_kv_seq *s, int l, size_t start)
{
	long total = 0;

	/* Only when the window start crosses a page boundary is there
	 * anything to release. */
	if (start * s->row / s->page == s->start[l] * s->row / s->page) {
		s->start[l] = start;
		return 0;
	}
	for (size_t g = 2 * (size_t)l; g < 2 * (size_t)l + 2; g++) {
		long r = sb_buf_unmap(s->buf[g], 0, start * s->row);

		if (r < 0)
			return r;
		total += r;
	}
	s->start[l] = start;
	return total;
}

SB_API long sb_kv_commit(struct sb_kv_seq *s, size_t n)
{
	long total = 0;

	if (!s)
		return -EINVAL;
	if (n > s->cfg.max_ctx - s->len)
		return -ERANGE;
	/* The decoding thread, as in sb_kv_prepare: a cache that grows by
	 * touch alone (no prepare) calls only this, and the pool's
	 * background thread, placing its pages ahead after every crossing,
	 * must keep off this thread's CPU too (make demo: five steps of
	 * 3.4-4.1 ms, each a few steps after a crossing, "preempted"). */
	sbi_pool_note_caller(s->pool);
	s->len += n;
	for (int l = 0; l < s->cfg.n_layers; l++) {
		long r;

		if (!s->window[l] || s->len <= (size_t)s->window[l])
			continue;
		r = release_before(s, l, s->len - (size_t)s->window[l]);
		if (r < 0)
			return r;
		total += r;
	}
	return total;
}

SB_API long sb_kv_truncate(struct sb_kv_seq *s, size_t n)
{
	size_t keep;
	long total = 0;

	if (!s)
		return -EINVAL;
	if (n > s->len)
		return -ERANGE;
	keep = round_up(n * s->row, s->page);
	for (size_t g = 0; g < s->nregions; g++) {
		size_t hi = s->placed[g] > s->asked[g] ? s->placed[g]
						       : s->asked[g];
		long r;

		/* The unmap also cancels prefetches still queued there. */
		if (hi > keep) {
			r = sb_buf_unmap(s->buf[g], keep, hi - keep);
			if (r < 0)
				return r;
			total += r;
		}
		if (s->placed[g] > keep)
			s->placed[g] = keep;
		if (s->asked[g] > keep)
			s->asked[g] = keep;
	}
	s->len = n;
	for (int l = 0; l < s->cfg.n_layers; l++)
		if (s->start[l] > n)
			s->start[l] = n;
	return total;
}

SB_API struct sb_kv_seq *sb_kv_fork(struct sb_kv_seq *s, size_t n, int *err)
{
	struct sb_kv_seq *c;

	if (!s)
		return fail(err, -EINVAL);
	if (n > s->len)
		return fail(err, -ERANGE);
	c = kv_new(s->pool, &s->cfg, false, err);
	if (!c)
		return NULL;
	for (size_t g = 0; g < s->nregions; g++) {
		size_t bytes = round_up(n * s->row, s->page);
		long r;

		if (!bytes)
			continue;
		r = sb_buf_share(c->buf[g], 0, s->buf[g], 0, bytes);
		if (r < 0) {
			sbi_kv_free(c);
			return fail(err, (int)r);
		}
		c->placed[g] = c->asked[g] = bytes;
	}
	c->len = n;
	for (int l = 0; l < s->cfg.n_layers; l++)
		c->start[l] = s->start[l] < n ? s->start[l] : n;
	return c;
}

SB_API size_t sb_kv_len(const struct sb_kv_seq *s)
{
	return s ? s->len : 0;
}

SB_API size_t sb_kv_start(const struct sb_kv_seq *s, int layer)
{
	if (!s || layer < 0 || layer >= s->cfg.n_layers)
		return 0;
	return s->start[layer];
}

SB_API void *sb_kv_k(const struct sb_kv_seq *s, int layer)
{
	if (!s || layer < 0 || layer >= s->cfg.n_layers)
		return NULL;
	return sb_buf_addr(s->buf[2 * (size_t)layer]);
}

SB_API void *sb_kv_v(const struct sb_kv_seq *s, int layer)
{
	if (!s || layer < 0 || layer >= s->cfg.n_layers)
		return NULL;
	return sb_buf_addr(s->buf[2 * (size_t)layer + 1]);
}

SB_API size_t sb_kv_row_bytes(const struct sb_kv_seq *s)
{
	return s ? s->row : 0;
}

SB_API struct sb_buf *sb_kv_buf(const struct sb_kv_seq *s, int layer, int v)
{
	if (!s || layer < 0 || layer >= s->cfg.n_layers || (v != 0 && v != 1))
		return NULL;
	return s->buf[2 * (size_t)layer + (size_t)v];
}

SB_API int sb_kv_settle(const struct sb_kv_seq *s)
{
	if (!s)
		return -EINVAL;
	for (size_t g = 0; g < s->nregions; g++) {
		long r = sb_buf_prefetch(s->buf[g], NULL, 0, SB_PREFETCH_WAIT);

		if (r < 0)
			return (int)r;
	}
	return 0;
}

static int kv_stats(const struct sb_kv_seq *s, struct sb_kv_stats *st);

SB_API int sb_kv_stats_sz(const struct sb_kv_seq *s, struct sb_kv_stats *st,
			  size_t size)
{
	struct sb_kv_stats o;
	int r;

	if (!s || !st)
		return -EINVAL;
	r = kv_stats(s, &o);
	if (r < 0)
		return r;
	return sbi_struct_out(st, size, &o, sizeof(o), SBI_SIZE_KV_STATS_0_1);
}

SB_API int sb_kv_stats(const struct sb_kv_seq *s, struct sb_kv_stats *st)
{
	return sb_kv_stats_sz(s, st, SBI_SIZE_KV_STATS_0_1);
}

static int kv_stats(const struct sb_kv_seq *s, struct sb_kv_stats *st)
{
	long placed;

	memset(st, 0, sizeof(*st));
	placed = 0;
	for (size_t g = 0; g < s->nregions; g++) {
		long r = sb_buf_placed(s->buf[g], 0, s->region);

		if (r < 0)
			return (int)r;
		placed += r;
	}
	st->len = s->len;
	for (int l = 0; l < s->cfg.n_layers; l++)
		st->bytes_exact += 2 * (s->len - s->start[l]) * s->row;
	st->pages_placed = (size_t)placed;
	st->bytes_placed = (size_t)placed * s->page;
	st->regions = s->nregions;
	return 0;
}

SB_API long sb_kv_evict(struct sb_kv_seq *s)
{
	size_t floor, held;
	long total = 0;

	if (!s)
		return -EINVAL;
	floor = s->len * s->row / s->page * s->page;
	held = round_up(s->len * s->row, s->page);
	for (size_t g = 0; g < s->nregions; g++) {
		size_t blen = sb_buf_length(s->buf[g]);
		/* Placed or asked for ahead, and the page the pool's growth
		 * watch may hold beyond: never the whole region (max_ctx may
		 * be terabytes of address space). */
		size_t hi = (s->placed[g] > s->asked[g] ? s->placed[g]
							: s->asked[g]) +
			    s->page;
		long r;

		if (hi > blen)
			hi = blen;
		/* Pages past the length (placed ahead) hold no row: they are
		 * released, not written and read back. */
		if (hi > held) {
			r = sb_buf_unmap(s->buf[g], held, hi - held);
			if (r < 0)
				return r;
		}
		r = sbi_buf_evict_sole(s->buf[g], 0, held);
		if (r < 0)
			return r;
		total += r;
	}
	/* What was placed is on disk now, read back on touch. The next
	 * prepare places (reads back) the page its first row lands in, and
	 * asks ahead again from there. */
	for (size_t g = 0; g < s->nregions; g++) {
		if (s->placed[g] > floor)
			s->placed[g] = floor;
		if (s->asked[g] > floor)
			s->asked[g] = floor;
	}
	return total;
}

SB_API int sb_kv_get_config_sz(const struct sb_kv_seq *s,
				struct sb_kv_config *cfg, size_t size)
{
	if (!s || !cfg)
		return -EINVAL;
	/* window: the sequence's own copy. */
	return sbi_struct_out(cfg, size, &s->cfg, sizeof(s->cfg),
			      SBI_SIZE_KV_CONFIG_0_1);
}
