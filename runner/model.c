/* SPDX-License-Identifier: MIT */
/*
 * The llama2.c checkpoint and forward pass (run.c) on sbkernels, with a
 * dense or a sparse KV cache. Both caches use the same position-major
 * layout and the same kernels, so they produce bit-identical logits.
 */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"

/* ---- checkpoint ------------------------------------------------------------ */

#define HEADER_BYTES (7 * sizeof(int))

static int bad(struct sbm_model *m, const char *why)
{
	m->why = why;
	return -EBADMSG;
}

/* a * b + c, or false on overflow. */
static bool mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
	return !__builtin_mul_overflow(a, b, out) &&
	       !__builtin_add_overflow(*out, c, out);
}

int sbm_bind(struct sbm_model *m, const void *data, size_t len)
{
	const struct sbm_config *c = &m->c;
	uint64_t d, hid, kvd, L, V, per_layer = 0, n = 0, bytes;
	const float *p;
	int shared;

	memset(m, 0, sizeof(*m));
	if (!data || (uintptr_t)data % sizeof(float))
		return -EINVAL;
	if (len < HEADER_BYTES)
		return bad(m, "shorter than the 28-byte header");
	memcpy(&m->c, data, sizeof(m->c));
	/* A positive vocab_size means the classifier shares the embedding;
	 * INT_MIN has no positive counterpart. */
	if (m->c.vocab_size == 0 || m->c.vocab_size == INT_MIN)
		return bad(m, "vocab_size out of range");
	shared = m->c.vocab_size > 0;
	m->c.vocab_size = abs(m->c.vocab_size);
	if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 ||
	    c->n_heads <= 0 || c->n_kv_heads <= 0 || c->seq_len <= 0)
		return bad(m, "a dimension in the header is not positive");
	if (c->dim % c->n_heads || c->n_kv_heads > c->n_heads ||
	    c->n_heads % c->n_kv_heads)
		return bad(m, "dim, n_heads and n_kv_heads do not divide");
	m->head_size = c->dim / c->n_heads;
	if (m->head_size % 2 || m->head_size > SBM_MAX_HEAD_DIM)
		return bad(m, "head size odd or too large");
	/* Not dim * n_kv_heads / n_heads: that product can overflow. */
	if ((int64_t)m->head_size * c->n_kv_heads > SBM_MAX_KV_DIM)
		return bad(m, "kv_dim too large");
	m->kv_dim = m->head_size * c->n_kv_heads;
	d = (uint64_t)c->dim;
	hid = (uint64_t)c->hidden_dim;
	kvd = (uint64_t)m->kv_dim;
	L = (uint64_t)c->n_layers;
	V = (uint64_t)c->vocab_size;
	/* Floats per layer: rms_att, rms_ffn (dim each), wq, wo (dim x dim),
	 * wk, wv (kv_dim x dim), w1, w2, w3 (hidden x dim); then the model:
	 * embedding, layers, rms_final, freq_cis (seq_len x head_size, the
	 * real and imaginary halves), classifier unless shared. */
	if (!mul_add(d, 2, per_layer, &per_layer) ||
	    !mul_add(d * 2, d, per_layer, &per_layer) ||
	    !mul_add(d * 2, kvd, per_layer, &per_layer) ||
	    !mul_add(d * 3, hid, per_layer, &per_layer) ||
	    !mul_add(V, d, n, &n) || !mul_add(L, per_layer, n, &n) ||
	    !mul_add(1, d, n, &n) ||
	    !mul_add((uint64_t)c->seq_len, (uint64_t)m->head_size, n, &n) ||
	    !mul_add(shared ? 0 : V, d, n, &n) ||
	    !mul_add(n, sizeof(float), HEADER_BYTES, &bytes))
		return bad(m, "the weights' size overflows");
	if (bytes > len)
		return bad(m, "the header describes more weights than the "
			      "file holds");
	p = (const float *)((const char *)data + HEADER_BYTES);
	m->w.token_embedding = p;
	p += V * d;
	m->w.rms_att = p;
	p += L * d;
	m->w.wq = p;
	p += L * d * d;
	m->w.wk = p;
	p += L * d * kvd;
	m->w.wv = p;
	p += L * d * kvd;
	m->w.wo = p;
	p += L * d * d;
	m->w.rms_ffn = p;
	p += L * d;
	m->w.w1 = p;
	p += L * d * hid;
	m->w.w2 = p;
	p += L * hid * d;
	m->w.w3 = p;
	p += L * d * hid;
	m->w.rms_final = p;
	p += d;
	p += (uint64_t)c->seq_len * (uint64_t)m->head_size; /* unused */
	m->w.wcls = shared ? m->w.token_embedding : p;
	return 0;
}

int sbm_load(struct sbm_model *m, const char *path)
{
	uint64_t size;
	void *map;
	int fd, r;

	memset(m, 0, sizeof(*m));
	fd = sbc_open_regular(path, &size);
	if (fd < 0)
		return fd;
	if (size < HEADER_BYTES || size > SIZE_MAX) {
		close(fd);
		return bad(m, "shorter than the 28-byte header");
	}
	map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
	r = -errno;
	close(fd);
	if (map == MAP_FAILED)
		return r;
	r = sbm_bind(m, map, (size_t)size);
	if (r < 0) {
		munmap(map, (size_t)size);
		return r;
	}
	m->map = map;
	m->map_len = (size_t)size;
	return 0;
}

void sbm_unload(struct sbm_model *m)
{
	if (m->map)
		munmap(m->map, m->map_len);
	m->map = NULL;
}

/* ---- sessions ---------------------------------------------------------------- */

static struct sbm_session *fail(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

static int alloc_activations(struct sbm_session *s)
{
	const struct sbm_config *c = &s->m->c;

	s->x = calloc((size_t)c->dim, sizeof(float));
	s->xb = calloc((size_t)c->dim, sizeof(float));
	s->xb2 = calloc((size_t)c->dim, sizeof(float));
	s->hb = calloc((size_t)c->hidden_dim, sizeof(float));
	s->hb2 = calloc((size_t)c->hidden_dim, sizeof(float));
	s->q = calloc((size_t)c->dim, sizeof(float));
	s->logits = calloc((size_t)c->vocab_size, sizeof(float));
	return s->x && s->xb && s->xb2 && s->hb && s->hb2 && s->q && s->logits
		       ? 0
		       : -ENOMEM;
}

struct sbm_session *sbm_session_new(const struct sbm_model *m,
				    enum sbm_kv_kind kind, enum sbk_dtype dtype,
				    struct sb_pool *pool, size_t max_ctx,
				    int *err)
{
	struct sbm_session *s = calloc(1, sizeof(*s));
	size_t elt = sbk_dtype_size(dtype);

	if (!s)
		return fail(err, -ENOMEM);
	if (!elt) {
		free(s);
		return fail(err, -EINVAL);
	}
	s->m = m;
	s->kind = kind;
	s->dtype = dtype;
	if (!max_ctx)
		max_ctx = (size_t)m->c.seq_len;
	if (alloc_activations(s) < 0) {
		sbm_session_free(s);
		return fail(err, -ENOMEM);
	}
	/* Per K or V: (n_layers, max_ctx, kv_dim); a checkpoint with a huge
	 * seq_len must fail here, not wrap. */
	if (__builtin_mul_overflow((size_t)m->c.n_layers, max_ctx,
				   &s->dense_bytes) ||
	    __builtin_mul_overflow(s->dense_bytes, (size_t)m->kv_dim * elt,
				   &s->dense_bytes)) {
		sbm_session_free(s);
		return fail(err, -ENOMEM);
	}
	if (kind == SBM_KV_DENSE) {
		/* llama.cpp: the whole context allocated and zeroed now. */
		s->dense_k = malloc(s->dense_bytes);
		s->dense_v = malloc(s->dense_bytes);
		if (!s->dense_k || !s->dense_v) {
			sbm_session_free(s);
			return fail(err, -ENOMEM);
		}
		memset(s->dense_k, 0, s->dense_bytes);
		memset(s->dense_v, 0, s->dense_bytes);
	} else {
		struct sb_kv_config cfg = sbm_kv_config(m, dtype, max_ctx);
		int e;

		if (!pool)
			pool = sb_default_pool();
		if (!pool) {
			sbm_session_free(s);
			return fail(err, sb_default_pool_error());
		}
		s->kv = sb_kv_create(pool, &cfg, &e);
		if (!s->kv) {
			sbm_session_free(s);
			return fail(err, e);
		}
	}
	return s;
}

struct sb_kv_config sbm_kv_config(const struct sbm_model *m,
				  enum sbk_dtype dtype, size_t max_ctx)
{
	struct sb_kv_config cfg = {
		.n_layers = m->c.n_layers,
		.n_kv_heads = m->c.n_kv_heads,
		.head_dim = m->head_size,
		.dtype = (enum sb_kv_dtype)dtype,
		.max_ctx = max_ctx ? max_ctx : (size_t)m->c.seq_len,
	};
	return cfg;
}

struct sbm_session *sbm_session_adopt(const struct sbm_model *m,
				      struct sb_kv_seq *kv, int *err)
{
	struct sb_kv_config cfg;
	struct sbm_session *s;

	if (!m || !kv || sb_kv_get_config(kv, &cfg) < 0)
		return fail(err, -EINVAL);
	/* This model's geometry, and a length it can continue from. */
	if (cfg.n_layers != m->c.n_layers || cfg.n_kv_heads != m->c.n_kv_heads ||
	    cfg.head_dim != m->head_size ||
	    cfg.max_ctx < (size_t)m->c.seq_len ||
	    sb_kv_len(kv) > (size_t)m->c.seq_len)
		return fail(err, -EBADMSG);
	/* This runner's layers attend to everything: no sliding window. */
	for (int l = 0; cfg.window && l < cfg.n_layers; l++)
		if (cfg.window[l])
			return fail(err, -EBADMSG);
	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(err, -ENOMEM);
	s->m = m;
	s->kind = SBM_KV_SPARSE;
	s->dtype = (enum sbk_dtype)cfg.dtype;	/* the same numbering */
	s->dense_bytes = (size_t)m->c.n_layers * (size_t)m->c.seq_len *
			 (size_t)m->kv_dim * sbk_dtype_size(s->dtype);
	if (alloc_activations(s) < 0) {
		sbm_session_free(s);
		return fail(err, -ENOMEM);
	}
	s->kv = kv;
	s->pos = (int)sb_kv_len(kv);
	return s;
}

struct sbm_session *sbm_session_fork(struct sbm_session *p, int *err)
{
	struct sbm_session *s;
	int e;

	if (!p || p->kind != SBM_KV_SPARSE)
		return fail(err, -EINVAL);
	s = calloc(1, sizeof(*s));
	if (!s)
		return fail(err, -ENOMEM);
	s->m = p->m;
	s->kind = p->kind;
	s->dtype = p->dtype;
	s->dense_bytes = p->dense_bytes;
	if (alloc_activations(s) < 0) {
		sbm_session_free(s);
		return fail(err, -ENOMEM);
	}
	s->kv = sb_kv_fork(p->kv, (size_t)p->pos, &e);
	if (!s->kv) {
		sbm_session_free(s);
		return fail(err, e);
	}
	s->pos = p->pos;
	return s;
}

void sbm_session_free(struct sbm_session *s)
{
	if (!s)
		return;
	free(s->dense_k);
	free(s->dense_v);
	sb_kv_destroy(s->kv);
	free(s->x);
	free(s->xb);
	free(s->xb2);
	free(s->hb);
	free(s->hb2);
	free(s->q);
	free(s->logits);
	free(s);
}

size_t sbm_kv_committed(const struct sbm_session *s)
{
	struct sb_kv_stats st;

	if (s->kind == SBM_KV_DENSE)
		return 2 * s->dense_bytes;
	if (sb_kv_stats(s->kv, &st) < 0)
		return 0;
	return st.bytes_placed;
}

size_t sbm_kv_dense_bytes(const struct sbm_session *s)
{
	return 2 * s->dense_bytes;
}

/* Layer l's K and V: position-major (max_ctx, n_kv_heads, head_size). */
static struct sbk_kv layer_kv(const struct sbm_session *s, int l)
{
	const struct sbm_model *m = s->m;
	const void *k, *v;

	if (s->kind == SBM_KV_DENSE) {
		size_t off = (size_t)l * (s->dense_bytes / (size_t)m->c.n_layers);

		k = (const char *)s->dense_k + off;
		v = (const char *)s->dense_v + off;
	} else {
		k = sb_kv_k(s->kv, l);
		v = sb_kv_v(s->kv, l);
	}
	return sbk_kv_pos_major(k, v, s->dtype, m->c.n_kv_heads,
				m->head_size);
}

static void *row_at(const void *base, enum sbk_dtype t, size_t row_elems,
		    int pos)
{
	return (char *)base + (size_t)pos * row_elems * sbk_dtype_size(t);
}

/* ---- forward --------------------------------------------------------------- */

int sbm_forward(struct sbm_session **ss, const int *tokens, int n)
{
	const struct sbm_model *m = ss[0]->m;
	const struct sbm_config *c = &m->c;
	const struct sbm_weights *w = &m->w;
	int dim = c->dim, kvd = m->kv_dim, hid = c->hidden_dim;
	struct sbk_attn attn = {c->n_heads, c->n_kv_heads, m->head_size, 0};
	struct sbk_attn_seq seq[64];
	float kbuf[8192], vbuf[8192];
	int r;

	if (n < 1 || n > 64 || kvd > 8192)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		struct sbm_session *s = ss[i];

		if (tokens[i] < 0 || tokens[i] >= c->vocab_size ||
		    s->pos >= c->seq_len)
			return -EINVAL;
		/* Place what this pass writes before it runs. */
		if (s->kind == SBM_KV_SPARSE &&
		    (r = (int)sb_kv_prepare(s->kv, 1)) < 0)
			return r;
		memcpy(s->x, w->token_embedding + (size_t)tokens[i] * dim,
		       (size_t)dim * sizeof(float));
	}
	for (int l = 0; l < c->n_layers; l++) {
		size_t lw = (size_t)l * dim;

		for (int i = 0; i < n; i++) {
			struct sbm_session *s = ss[i];
			struct sbk_kv kv = layer_kv(s, l);

			sbk_rmsnorm(s->xb, s->x, w->rms_att + lw, 1, dim, 1e-5f);
			sbk_matvec(s->q, w->wq + lw * dim, s->xb, dim, dim);
			sbk_matvec(kbuf, w->wk + lw * kvd, s->xb, kvd, dim);
			sbk_matvec(vbuf, w->wv + lw * kvd, s->xb, kvd, dim);
			sbk_rope(s->q, c->n_heads, m->head_size, s->pos,
				 10000.0f);
			sbk_rope(kbuf, c->n_kv_heads, m->head_size, s->pos,
				 10000.0f);
			/* Write this position's K and V into the cache. */
			sbk_store(row_at(kv.k, s->dtype, (size_t)kvd, s->pos),
				  s->dtype, kbuf, (size_t)kvd);
			sbk_store(row_at(kv.v, s->dtype, (size_t)kvd, s->pos),
				  s->dtype, vbuf, (size_t)kvd);
			seq[i] = (struct sbk_attn_seq){
				.out = s->xb,
				.q = s->q,
				.kv = kv,
				.pos_start = 0,
				.pos_end = (size_t)s->pos + 1,
			};
		}
		/* Every session's attention in one call, no padding. */
		r = sbk_attn_decode_batch(seq, n, &attn);
		if (r < 0)
			return r;
		for (int i = 0; i < n; i++) {
			struct sbm_session *s = ss[i];

			sbk_matvec(s->xb2, w->wo + lw * dim, s->xb, dim, dim);
			for (int j = 0; j < dim; j++)
				s->x[j] += s->xb2[j];
			sbk_rmsnorm(s->xb, s->x, w->rms_ffn + lw, 1, dim, 1e-5f);
			sbk_matvec(s->hb, w->w1 + (size_t)l * dim * hid, s->xb,
				   hid, dim);
			sbk_matvec(s->hb2, w->w3 + (size_t)l * dim * hid, s->xb,
				   hid, dim);
			sbk_swiglu(s->hb, s->hb, s->hb2, hid);
			sbk_matvec(s->xb, w->w2 + (size_t)l * dim * hid, s->hb,
				   dim, hid);
			for (int j = 0; j < dim; j++)
				s->x[j] += s->xb[j];
		}
	}
	for (int i = 0; i < n; i++) {
		struct sbm_session *s = ss[i];

		sbk_rmsnorm(s->x, s->x, w->rms_final, 1, dim, 1e-5f);
		sbk_matvec(s->logits, w->wcls, s->x, c->vocab_size, dim);
		s->pos++;
		if (s->kind == SBM_KV_SPARSE &&
		    (r = (int)sb_kv_commit(s->kv, 1)) < 0)
			return r;
	}
	return 0;
}

/* ---- sampling (run.c) ---------------------------------------------------- */

int sbm_sampler_init(struct sbm_sampler *sp, int vocab, float temperature,
		     float topp, unsigned long long seed)
{
	sp->probindex = NULL;
	if (vocab < 1 || !isfinite(temperature) || temperature < 0 ||
	    !isfinite(topp))
		return -EINVAL;
	sp->vocab = vocab;
	sp->temperature = temperature;
	sp->topp = topp;
	sp->rng = seed;
	sp->probindex = calloc((size_t)vocab, sizeof(*sp->probindex));
	return sp->probindex ? 0 : -ENOMEM;
}

void sbm_sampler_free(struct sbm_sampler *sp)
{
	free(sp->probindex);
	sp->probindex = NULL;
}

static unsigned random_u32(unsigned long long *state)
{
	*state ^= *state >> 12;
	*state ^= *state << 25;
	*state ^= *state >> 27;
	return (unsigned)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float random_f32(unsigned long long *state)
{
	return (float)(random_u32(state) >> 8) / 16777216.0f;
}

static int sample_mult(const float *p, int n, float coin)
{
	float cdf = 0.0f;

	for (int i = 0; i < n; i++) {
		cdf += p[i];
		if (coin < cdf)
			return i;
	}
	return n - 1;
}

static int cmp_prob(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x > y ? -1 : x < y;
}

/* run.c's nucleus sampling. Every index it reads was written: with NaN
 * probabilities, or a cutoff nothing reaches, no token passes the cut and
 * the argmax stands in (run.c read probindex[-1] there). */
static int sample_topp(struct sbm_sampler *sp, const float *p, float coin)
{
	int n0 = 0, last;
	float cutoff = (1.0f - sp->topp) / (float)(sp->vocab - 1), cum = 0.0f,
	      r, cdf = 0.0f;

	for (int i = 0; i < sp->vocab; i++) {
		if (p[i] >= cutoff) {
			sp->probindex[n0].i = i;
			sp->probindex[n0].p = p[i];
			n0++;
		}
	}
	if (n0 == 0)
		return sbk_argmax(p, sp->vocab);
	qsort(sp->probindex, (size_t)n0, sizeof(*sp->probindex), cmp_prob);
	last = n0 - 1;
	for (int i = 0; i < n0; i++) {
		cum += sp->probindex[i].p;
		if (cum > sp->topp) {
			last = i;
			break;
		}
	}
	r = coin * cum;
	for (int i = 0; i <= last; i++) {
		cdf += sp->probindex[i].p;
		if (r < cdf)
			return sp->probindex[i].i;
	}
	return sp->probindex[last].i;
}

int sbm_sample(struct sbm_sampler *sp, float *logits)
{
	float coin;
	int best;
	bool finite = true;

	/* !(t > 0): a sampler set up by hand with a NaN is greedy too. */
	if (!(sp->temperature > 0.0f))
		return sbk_argmax(logits, sp->vocab);
	/* Division by a tiny temperature overflows to infinities, and the
	 * softmax of those is NaN: the distribution's limit is the argmax,
	 * taken before dividing (the order survives it, ties do not). Logits
	 * already NaN or infinite have no distribution: the argmax (which
	 * skips NaN) too. */
	best = sbk_argmax(logits, sp->vocab);
	for (int q = 0; q < sp->vocab; q++) {
		logits[q] /= sp->temperature;
		finite = finite && isfinite(logits[q]);
	}
	if (!finite)
		return best;
	sbk_softmax(logits, sp->vocab);
	coin = random_f32(&sp->rng);
	if (!(sp->topp > 0 && sp->topp < 1))
		return sample_mult(logits, sp->vocab, coin);
	return sample_topp(sp, logits, coin);
}

/* ---- tokenizer (run.c) ----------------------------------------------------- */

static int tok_bad(struct sbm_tokenizer *t, const char *why)
{
	sbm_tokenizer_free(t);
	t->why = why;
	return -EBADMSG;
}

int sbm_tokenizer_parse(struct sbm_tokenizer *t, const void *data, size_t len,
			int vocab_size)
{
	const unsigned char *p = data, *end = p + len;
	int len_i;

	memset(t, 0, sizeof(*t));
	if (vocab_size < 1 || (!data && len))
		return -EINVAL;
	if (len < sizeof(int))
		return tok_bad(t, "shorter than its 4-byte header");
	memcpy(&t->max_token_length, p, sizeof(int));
	p += sizeof(int);
	if (t->max_token_length < 1 ||
	    t->max_token_length > SBM_MAX_TOKEN_LENGTH)
		return tok_bad(t, "max_token_length out of range");
	/* Each entry takes at least 8 bytes: a file too short for the
	 * model's vocabulary is refused before anything is allocated. */
	if ((size_t)(end - p) / 8 < (size_t)vocab_size)
		return tok_bad(t, "fewer tokens than the model's vocabulary");
	t->vocab_size = vocab_size;
	t->vocab = calloc((size_t)vocab_size, sizeof(*t->vocab));
	t->scores = calloc((size_t)vocab_size, sizeof(*t->scores));
	if (!t->vocab || !t->scores) {
		sbm_tokenizer_free(t);
		return -ENOMEM;
	}
	for (int i = 0; i < 256; i++) {
		t->byte_pieces[i * 2] = (unsigned char)i;
		t->byte_pieces[i * 2 + 1] = 0;
	}
	for (int i = 0; i < vocab_size; i++) {
		if ((size_t)(end - p) < sizeof(float) + sizeof(int))
			return tok_bad(t, "truncated");
		memcpy(&t->scores[i], p, sizeof(float));
		memcpy(&len_i, p + sizeof(float), sizeof(int));
		p += sizeof(float) + sizeof(int);
		if (!isfinite(t->scores[i]))
			return tok_bad(t, "a score is not a finite number");
		if (len_i < 0 || len_i > t->max_token_length)
			return tok_bad(t, "a token is longer than "
					  "max_token_length, or negative");
		if ((size_t)(end - p) < (size_t)len_i)
			return tok_bad(t, "truncated");
		t->vocab[i] = malloc((size_t)len_i + 1);
		if (!t->vocab[i]) {
			sbm_tokenizer_free(t);
			return -ENOMEM;
		}
		memcpy(t->vocab[i], p, (size_t)len_i);
		t->vocab[i][len_i] = 0;
		p += len_i;
	}
	return 0;
}

int sbm_tokenizer_load(struct sbm_tokenizer *t, const char *path,
		       int vocab_size)
{
	uint64_t size, cap;
	unsigned char *buf;
	size_t got = 0;
	int fd, r;

	memset(t, 0, sizeof(*t));
	if (vocab_size < 1)
		return -EINVAL;
	fd = sbc_open_regular(path, &size);
	if (fd < 0)
		return fd;
	/* Read no more than the largest file the vocabulary can use (what
	 * follows is ignored anyway). */
	cap = sizeof(int) + (uint64_t)vocab_size *
				    (sizeof(float) + sizeof(int) +
				     SBM_MAX_TOKEN_LENGTH);
	if (size > cap)
		size = cap;
	buf = malloc(size ? (size_t)size : 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	for (r = 0; got < size;) {
		ssize_t n = read(fd, buf + got, (size_t)size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		if (n == 0)
			break;	/* shrunk meanwhile: parse what is there */
		got += (size_t)n;
	}
	close(fd);
	if (!r)
		r = sbm_tokenizer_parse(t, buf, got, vocab_size);
	free(buf);
	return r;
}

void sbm_tokenizer_free(struct sbm_tokenizer *t)
{
	for (int i = 0; t->vocab && i < t->vocab_size; i++)
		free(t->vocab[i]);
	free(t->vocab);
	free(t->scores);
	t->vocab = NULL;
	t->scores = NULL;
}

const char *sbm_decode(struct sbm_tokenizer *t, int prev, int token)
{
	const char *piece;
	unsigned char byte;

	if (token < 0 || token >= t->vocab_size || !t->vocab[token])
		return "";
	piece = t->vocab[token];
	/* After BOS, SentencePiece strips the leading space. */
	if (prev == 1 && piece[0] == ' ')
		piece++;
	if (sscanf(piece, "<0x%02hhX>", &byte) == 1)
		piece = (const char *)t->byte_pieces + byte * 2;
	return piece;
}
