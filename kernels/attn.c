/* SPDX-License-Identifier: MIT */
/*
 * Attention drivers: argument checks, the split of the work into items,
 * threads, and the merge of partial results. The arithmetic on one block
 * of positions is the variant's attn_block (attn_*.c).
 *
 * Decode: an item is (sequence, chunk of SBKI_ATTN_CHUNK positions, group
 * of KV heads), shaped by the layout so that each item reads long runs of
 * consecutive memory, which is what the hardware prefetchers follow:
 *
 *   position-major: all KV heads of a chunk in one item (blocks of
 *     positions outer, heads inner), so an item reads whole position rows
 *     front to back. Heads are split only when there are fewer chunks
 *     than threads. Giving each thread a few heads of every row instead
 *     reads 512 of every 2048 bytes and costs a third of the bandwidth.
 *   head-major: one KV head per item: one sequential stream for K and one
 *     for V.
 *
 * A sequence of one chunk accumulates straight into its output; longer
 * ones keep one partial softmax state per chunk and merge them in order
 * once all items are done. The split never changes the arithmetic.
 *
 * Prefill: an item is (KV head, tile of tokens); the tile's query rows (its
 * tokens times the heads of the group) share every K and V row it reads.
 */
#include "internal.h"

#include <errno.h>
#include <stdatomic.h>

/* Query rows per prefill item: each K/V row read serves this many dot
 * products, while scores and accumulators stay in L1/L2. */
#define PREFILL_ROWS 32
/* Below this much K and V (bytes) an attention call stays on the caller:
 * waking the pool would cost more than it saves. */
#define SERIAL_KV_BYTES ((size_t)256 << 10)

static int check_attn(const struct sbk_attn *a)
{
	if (!a || a->n_heads <= 0 || a->n_kv_heads <= 0 ||
	    a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
	    a->head_dim > SBK_MAX_HEAD_DIM || !(a->scale >= 0))
		return -EINVAL;
	return 0;
}

static int check_kv(const struct sbk_kv *kv)
{
	if (!kv || !kv->k || !kv->v || !sbki_dtype_size(kv->dtype))
		return -EINVAL;
	return 0;
}

/* Scores are kept in base 2: the scale folds in log2(e). */
static float attn_scale(const struct sbk_attn *a)
{
	float s = a->scale ? a->scale : 1.0f / sqrtf((float)a->head_dim);

	return s * SBKI_LOG2E;
}

static void state_init(float *m, float *l, float *acc, int rows, int hd)
{
	for (int r = 0; r < rows; r++) {
		m[r] = -INFINITY;
		l[r] = 0;
	}
	memset(acc, 0, (size_t)rows * hd * sizeof(*acc));
}

/* out = acc / l for rows rows (l > 0: every range is non-empty). */
static void normalize(float *out, const float *acc, const float *l, int rows,
		      int hd)
{
	for (int r = 0; r < rows; r++) {
		float inv = 1.0f / l[r];

		for (int d = 0; d < hd; d++)
			out[(size_t)r * hd + d] = acc[(size_t)r * hd + d] * inv;
	}
}

/* ---- Decode -------------------------------------------------------------- */

struct dec_seq {
	const struct sbk_attn_seq *s;
	size_t nchunks;
	int hsplit; /* KV head groups per chunk */
	/* (nchunks, 2 + hd, n_heads): per chunk m (n_heads), l (n_heads),
	 * acc (n_heads, hd); NULL for a sequence of one chunk. */
	float *part;
};

struct dec_item {
	int seq;
	int hgroup;
	size_t chunk;
};

struct dec_job {
	const struct sbki_ops *ops;
	int nh, nkv, g, hd;
	float scale;
	struct dec_seq *seq;
	struct dec_item *item;
	atomic_int err;
};

/*
 * Software prefetch: each attn_block call is given the K and V rows of the
 * next call of its item (the next KV head of the block, or the first head
 * of the next block) and prefetches them into L1 while it computes, a few
 * rows per batch of scores (attn_*.c). Without it a call's loads miss
 * when it starts: the hardware prefetchers follow these strided rows (256
 * of every 2048 bytes per head, position-major) only partly, and the
 * out-of-order window covers a few positions, so the FMA-bound compute
 * and the memory reads ran mostly one after the other. 36-layer bf16
 * batch, Qwen3-4B, 2 threads: 12-14 -> 17-20 GB/s at 4k positions.
 * Prefetching two calls ahead measured slower, four slower still, and one
 * burst of prefetches before each call slower than spreading them.
 * Prefetches stay inside the item's chunk, so inside [pos_start,
 * pos_end).
 */
#define PF_AHEAD 1

/* Point b's prefetch block at the rows of the call PF_AHEAD after the one
 * for (block p, head h) in the item's order (heads h0..h1 - 1 inner,
 * blocks up to c1 outer); none past the item's end. */
static void next_block(struct sbki_attn_blk *b, const struct sbk_kv *kv,
		       size_t es, int h0, int h1, size_t c1, size_t p, int h)
{
	int n = h - h0 + PF_AHEAD;
	size_t pn = p + (size_t)(n / (h1 - h0)) * SBKI_ATTN_BLOCK;
	size_t off;

	h = h0 + n % (h1 - h0);
	b->pnp = 0;
	if (pn >= c1)
		return;
	b->pnp = c1 - pn < SBKI_ATTN_BLOCK ? (int)(c1 - pn) : SBKI_ATTN_BLOCK;
	off = (pn * kv->pos_stride + h * kv->head_stride) * es;
	b->pk = (const char *)kv->k + off;
	b->pv = (const char *)kv->v + off;
}

static void dec_item(void *ctx, int i)
{
	struct dec_job *j = ctx;
	const struct dec_item *it = &j->item[i];
	const struct dec_seq *ds = &j->seq[it->seq];
	const struct sbk_attn_seq *s = ds->s;
	const struct sbk_kv *kv = &s->kv;
	size_t es = sbki_dtype_size(kv->dtype);
	size_t c0 = s->pos_start + it->chunk * SBKI_ATTN_CHUNK;
	size_t c1 = s->pos_end - c0 > SBKI_ATTN_CHUNK ? c0 + SBKI_ATTN_CHUNK
						      : s->pos_end;
	int h0 = it->hgroup * j->nkv / ds->hsplit;
	int h1 = (it->hgroup + 1) * j->nkv / ds->hsplit;
	int g = j->g, hd = j->hd;
	float *tmp, *m, *l, *acc;
	struct sbki_attn_blk b = {
		.stride = kv->pos_stride,
		.dtype = kv->dtype,
		.nr = g,
		.hd = hd,
		.scale = j->scale,
	};

	tmp = sbki_scratch(SBKI_SCRATCH_ITEM,
			   (2 * (size_t)j->nh + (size_t)g * SBKI_ATTN_BLOCK) *
				   sizeof(float));
	if (!tmp) {
		atomic_store(&j->err, -ENOMEM);
		return;
	}
	if (ds->part) {
		m = ds->part + it->chunk * (size_t)j->nh * (2 + hd);
		l = m + j->nh;
		acc = l + j->nh;
	} else {
		m = tmp;
		l = tmp + j->nh;
		acc = s->out;
	}
	b.s = tmp + 2 * j->nh;
	state_init(m + h0 * g, l + h0 * g, acc + (size_t)h0 * g * hd,
		   (h1 - h0) * g, hd);
	for (size_t p = c0; p < c1; p += SBKI_ATTN_BLOCK) {
		b.np = c1 - p < SBKI_ATTN_BLOCK ? (int)(c1 - p)
						: SBKI_ATTN_BLOCK;
		for (int h = h0; h < h1; h++) {
			size_t off =
				(p * kv->pos_stride + h * kv->head_stride) * es;

			b.k = (const char *)kv->k + off;
			b.v = (const char *)kv->v + off;
			next_block(&b, kv, es, h0, h1, c1, p, h);
			b.q = s->q + (size_t)h * g * hd;
			b.m = m + h * g;
			b.l = l + h * g;
			b.acc = acc + (size_t)h * g * hd;
			j->ops->attn_block(&b);
		}
	}
	if (!ds->part)
		normalize(acc + (size_t)h0 * g * hd, acc + (size_t)h0 * g * hd,
			  l + h0 * g, (h1 - h0) * g, hd);
}

/* Merge the chunk states of a sequence in chunk order, then normalize. */
static void dec_merge(const struct dec_seq *ds, int nh, int hd)
{
	size_t rec = (size_t)nh * (2 + hd);

	for (int r = 0; r < nh; r++) {
		const float *p = ds->part;
		float *o = ds->s->out + (size_t)r * hd;
		float m = p[r], l = p[nh + r], inv;

		memcpy(o, p + 2 * nh + (size_t)r * hd, hd * sizeof(*o));
		for (size_t c = 1; c < ds->nchunks; c++) {
			const float *pc = p + c * rec;
			const float *acc = pc + 2 * nh + (size_t)r * hd;
			float mc = pc[r], mn = m > mc ? m : mc;
			float x = exp2f(m - mn), y = exp2f(mc - mn);

			l = l * x + pc[nh + r] * y;
			for (int d = 0; d < hd; d++)
				o[d] = o[d] * x + acc[d] * y;
			m = mn;
		}
		inv = 1.0f / l;
		for (int d = 0; d < hd; d++)
			o[d] *= inv;
	}
}

/* KV head groups per chunk of a sequence (see the top of the file). */
static int head_split(const struct sbk_kv *kv, int nkv, size_t nchunks,
		      int nthreads)
{
	int h;

	if (kv->head_stride > kv->pos_stride) /* head-major */
		return nkv;
	if (nchunks >= (size_t)nthreads)
		return 1;
	h = (int)((nthreads + nchunks - 1) / nchunks);
	return h < nkv ? h : nkv;
}

static int decode(const struct sbk_attn_seq *seq, int n_seq,
		  const struct sbk_attn *a)
{
	struct dec_job j = {.err = 0};
	size_t nchunks = 0, nparts = 0, kv_bytes = 0, n_items = 0, bytes;
	int nthreads, err;
	char *mem;

	err = check_attn(a);
	if (err)
		return err;
	if (n_seq < 0 || (n_seq && !seq))
		return -EINVAL;
	for (int i = 0; i < n_seq; i++) {
		const struct sbk_attn_seq *s = &seq[i];
		size_t len = s->pos_end - s->pos_start;
		size_t c = (len + SBKI_ATTN_CHUNK - 1) / SBKI_ATTN_CHUNK;

		if (!s->out || !s->q || s->pos_start > s->pos_end)
			return -EINVAL;
		err = check_kv(&s->kv);
		if (err)
			return err;
		nchunks += c;
		if (c > 1)
			nparts += c;
		kv_bytes += 2 * len * a->n_kv_heads * a->head_dim *
			    sbki_dtype_size(s->kv.dtype);
	}
	j.ops = sbki_ops();
	j.nh = a->n_heads;
	j.nkv = a->n_kv_heads;
	j.g = a->n_heads / a->n_kv_heads;
	j.hd = a->head_dim;
	j.scale = attn_scale(a);
	nthreads = kv_bytes < SERIAL_KV_BYTES ? 1 : sbk_get_threads();
	if (nchunks * j.nkv > (size_t)1 << 30)
		return -EINVAL;

	bytes = n_seq * sizeof(*j.seq) + nchunks * j.nkv * sizeof(*j.item);
	bytes = (bytes + 63) & ~(size_t)63;
	mem = sbki_scratch(SBKI_SCRATCH_CALL,
			   bytes + nparts * j.nh * (2 + j.hd) * sizeof(float));
	if (!mem)
		return -ENOMEM;
	j.seq = (struct dec_seq *)mem;
	j.item = (struct dec_item *)(j.seq + n_seq);
	{
		float *part = (float *)(mem + bytes);

		for (int i = 0; i < n_seq; i++) {
			const struct sbk_attn_seq *s = &seq[i];
			struct dec_seq *ds = &j.seq[i];

			ds->s = s;
			ds->nchunks = (s->pos_end - s->pos_start +
				       SBKI_ATTN_CHUNK - 1) /
				      SBKI_ATTN_CHUNK;
			ds->hsplit =
				head_split(&s->kv, j.nkv, nchunks, nthreads);
			ds->part = NULL;
			if (ds->nchunks > 1) {
				ds->part = part;
				part += ds->nchunks * j.nh * (2 + j.hd);
			}
			if (!ds->nchunks)
				memset(s->out, 0,
				       (size_t)j.nh * j.hd * sizeof(float));
			for (size_t c = 0; c < ds->nchunks; c++)
				for (int h = 0; h < ds->hsplit; h++)
					j.item[n_items++] =
						(struct dec_item){i, h, c};
		}
	}
	if (nthreads == 1)
		for (size_t i = 0; i < n_items; i++)
			dec_item(&j, (int)i);
	else
		sbki_parallel((int)n_items, dec_item, &j);
	err = atomic_load(&j.err);
	if (err)
		return err;
	for (int i = 0; i < n_seq; i++)
		if (j.seq[i].part)
			dec_merge(&j.seq[i], j.nh, j.hd);
	return 0;
}

SBK_API int sbk_attn_decode(float *out, const float *q,
			    const struct sbk_attn *a, const struct sbk_kv *kv,
			    size_t pos_start, size_t pos_end)
{
	struct sbk_attn_seq s;

	if (!kv)
		return -EINVAL;
	s.out = out;
	s.q = q;
	s.kv = *kv;
	s.pos_start = pos_start;
	s.pos_end = pos_end;
	return decode(&s, 1, a);
}

SBK_API int sbk_attn_decode_batch(const struct sbk_attn_seq *seq, int n_seq,
				  const struct sbk_attn *a)
{
	return decode(seq, n_seq, a);
}

/* ---- Prefill ------------------------------------------------------------- */

struct pf_job {
	const struct sbki_ops *ops;
	const struct sbk_kv *kv;
	const float *q;
	float *out;
	size_t pos_start, pos0, window;
	int nh, nkv, g, hd, n_tokens, tile, ntiles;
	float scale;
	atomic_int err;
};

/* The positions token t attends to: [*lo, *hi). */
static void pf_range(const struct pf_job *j, int t, size_t *lo, size_t *hi)
{
	size_t p = j->pos0 + t;

	*hi = p + 1;
	*lo = j->pos_start;
	if (j->window && p + 1 - *lo > j->window)
		*lo = p + 1 - j->window;
}

static void pf_item(void *ctx, int i)
{
	struct pf_job *j = ctx;
	/* Last tiles first: they attend to the most positions. */
	int tile = j->ntiles - 1 - i / j->nkv, h = i % j->nkv;
	int t0 = tile * j->tile;
	int t1 = t0 + j->tile < j->n_tokens ? t0 + j->tile : j->n_tokens;
	int g = j->g, hd = j->hd, rows = (t1 - t0) * g;
	size_t es = sbki_dtype_size(j->kv->dtype), klo, khi, lo, hi;
	float *q, *acc, *m, *l;
	int *rlo, *rhi;
	struct sbki_attn_blk b = {
		.stride = j->kv->pos_stride,
		.dtype = j->kv->dtype,
		.nr = rows,
		.hd = hd,
		.scale = j->scale,
	};

	q = sbki_scratch(SBKI_SCRATCH_ITEM,
			 (size_t)rows * (2 * hd + 2 + SBKI_ATTN_BLOCK + 2) *
				 sizeof(float));
	if (!q) {
		atomic_store(&j->err, -ENOMEM);
		return;
	}
	acc = q + (size_t)rows * hd;
	m = acc + (size_t)rows * hd;
	l = m + rows;
	b.s = l + rows;
	rlo = (int *)(b.s + (size_t)rows * SBKI_ATTN_BLOCK);
	rhi = rlo + rows;
	for (int t = t0; t < t1; t++)
		memcpy(q + (size_t)(t - t0) * g * hd,
		       j->q + ((size_t)t * j->nh + (size_t)h * g) * hd,
		       (size_t)g * hd * sizeof(*q));
	state_init(m, l, acc, rows, hd);
	pf_range(j, t0, &klo, &hi);
	pf_range(j, t1 - 1, &lo, &khi);
	b.q = q;
	b.m = m;
	b.l = l;
	b.acc = acc;
	b.lo = rlo;
	b.hi = rhi;
	for (size_t p = klo; p < khi; p += SBKI_ATTN_BLOCK) {
		size_t off =
			(p * j->kv->pos_stride + h * j->kv->head_stride) * es;

		b.np = khi - p < SBKI_ATTN_BLOCK ? (int)(khi - p)
						 : SBKI_ATTN_BLOCK;
		for (int t = t0; t < t1; t++) {
			int vlo, vhi;

			pf_range(j, t, &lo, &hi);
			vlo = lo <= p		       ? 0
			      : lo - p >= (size_t)b.np ? b.np
						       : (int)(lo - p);
			vhi = hi <= p		       ? 0
			      : hi - p >= (size_t)b.np ? b.np
						       : (int)(hi - p);
			for (int r = (t - t0) * g; r < (t - t0 + 1) * g; r++) {
				rlo[r] = vlo;
				rhi[r] = vhi;
			}
		}
		b.k = (const char *)j->kv->k + off;
		b.v = (const char *)j->kv->v + off;
		j->ops->attn_block(&b);
	}
	for (int t = t0; t < t1; t++)
		normalize(j->out + ((size_t)t * j->nh + (size_t)h * g) * hd,
			  acc + (size_t)(t - t0) * g * hd, l + (t - t0) * g, g,
			  hd);
}

SBK_API int sbk_attn_prefill(float *out, const float *q,
			     const struct sbk_attn *a, const struct sbk_kv *kv,
			     size_t pos_start, size_t pos0, int n_tokens,
			     size_t window)
{
	struct pf_job j = {.err = 0};
	size_t work;
	int err, n_items;

	err = check_attn(a);
	if (!err)
		err = check_kv(kv);
	if (err)
		return err;
	if (n_tokens < 0 || pos_start > pos0 || (n_tokens && (!out || !q)))
		return -EINVAL;
	if (!n_tokens)
		return 0;
	j.ops = sbki_ops();
	j.kv = kv;
	j.q = q;
	j.out = out;
	j.pos_start = pos_start;
	j.pos0 = pos0;
	j.window = window;
	j.nh = a->n_heads;
	j.nkv = a->n_kv_heads;
	j.g = a->n_heads / a->n_kv_heads;
	j.hd = a->head_dim;
	j.n_tokens = n_tokens;
	j.tile = j.g >= PREFILL_ROWS ? 1 : PREFILL_ROWS / j.g;
	j.ntiles = (n_tokens + j.tile - 1) / j.tile;
	j.scale = attn_scale(a);
	if ((size_t)j.ntiles * j.nkv > (size_t)1 << 30)
		return -EINVAL;
	n_items = j.ntiles * j.nkv;
	/* Positions read per K/V head summed over tokens, roughly. */
	work = (pos0 - pos_start + (size_t)n_tokens) * n_tokens * j.nh * j.hd;
	if (work < SERIAL_KV_BYTES * 16)
		for (int i = 0; i < n_items; i++)
			pf_item(&j, i);
	else
		sbki_parallel(n_items, pf_item, &j);
	return atomic_load(&j.err);
}
