/* SPDX-License-Identifier: MIT */
/*
 * The llama2.c checkpoint and forward pass (run.c) on sbkernels, with a
 * dense or a sparse KV cache. Both caches use the same position-major
 * layout and the same kernels, so they produce bit-identical logits.
 */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- checkpoint ------------------------------------------------------------ */

int sbm_load(struct sbm_model *m, const char *path)
{
	struct stat sb;
	const float *p;
	size_t need, hs, kvd, L;
	int fd, shared;

	memset(m, 0, sizeof(*m));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &sb) < 0 || (size_t)sb.st_size < 7 * sizeof(int)) {
		close(fd);
		return -EINVAL;
	}
	m->map_len = (size_t)sb.st_size;
	m->map = mmap(NULL, m->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (m->map == MAP_FAILED) {
		m->map = NULL;
		return -errno;
	}
	memcpy(&m->c, m->map, sizeof(m->c));
	/* A positive vocab_size means the classifier shares the embedding. */
	shared = m->c.vocab_size > 0;
	m->c.vocab_size = abs(m->c.vocab_size);
	if (m->c.dim <= 0 || m->c.n_heads <= 0 || m->c.n_kv_heads <= 0 ||
	    m->c.dim % m->c.n_heads || m->c.n_heads % m->c.n_kv_heads ||
	    m->c.n_layers <= 0 || m->c.hidden_dim <= 0 ||
	    m->c.vocab_size <= 0 || m->c.seq_len <= 0 ||
	    (m->c.dim / m->c.n_heads) % 2)
		goto bad;
	m->head_size = m->c.dim / m->c.n_heads;
	m->kv_dim = m->c.dim * m->c.n_kv_heads / m->c.n_heads;
	hs = (size_t)m->head_size;
	kvd = (size_t)m->kv_dim;
	L = (size_t)m->c.n_layers;
	need = (size_t)m->c.vocab_size * m->c.dim +
	       L * ((size_t)m->c.dim * 2 + (size_t)m->c.dim * m->c.dim * 2 +
		    (size_t)m->c.dim * kvd * 2 +
		    (size_t)m->c.dim * m->c.hidden_dim * 3) +
	       (size_t)m->c.dim + (size_t)m->c.seq_len * hs +
	       (shared ? 0 : (size_t)m->c.vocab_size * m->c.dim);
	if (7 * sizeof(int) + need * sizeof(float) > m->map_len)
		goto bad;
	p = (const float *)((const char *)m->map + 7 * sizeof(int));
	m->w.token_embedding = p;
	p += (size_t)m->c.vocab_size * m->c.dim;
	m->w.rms_att = p;
	p += L * m->c.dim;
	m->w.wq = p;
	p += L * m->c.dim * m->c.dim;
	m->w.wk = p;
	p += L * m->c.dim * kvd;
	m->w.wv = p;
	p += L * m->c.dim * kvd;
	m->w.wo = p;
	p += L * m->c.dim * m->c.dim;
	m->w.rms_ffn = p;
	p += L * m->c.dim;
	m->w.w1 = p;
	p += L * m->c.dim * m->c.hidden_dim;
	m->w.w2 = p;
	p += L * m->c.hidden_dim * m->c.dim;
	m->w.w3 = p;
	p += L * m->c.dim * m->c.hidden_dim;
	m->w.rms_final = p;
	p += m->c.dim;
	p += (size_t)m->c.seq_len * hs;	/* freq_cis_real, _imag: unused */
	m->w.wcls = shared ? m->w.token_embedding : p;
	return 0;
bad:
	munmap(m->map, m->map_len);
	m->map = NULL;
	return -EINVAL;
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
	if (kind == SBM_KV_DENSE) {
		/* llama.cpp: the whole context allocated and zeroed now. */
		s->dense_bytes = (size_t)m->c.n_layers * max_ctx *
				 (size_t)m->kv_dim * elt;
		s->dense_k = malloc(s->dense_bytes);
		s->dense_v = malloc(s->dense_bytes);
		if (!s->dense_k || !s->dense_v) {
			sbm_session_free(s);
			return fail(err, -ENOMEM);
		}
		memset(s->dense_k, 0, s->dense_bytes);
		memset(s->dense_v, 0, s->dense_bytes);
	} else {
		struct sb_kv_config cfg = {
			.n_layers = m->c.n_layers,
			.n_kv_heads = m->c.n_kv_heads,
			.head_dim = m->head_size,
			.dtype = (enum sb_kv_dtype)dtype,
			.max_ctx = max_ctx,
		};
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
		s->dense_bytes = (size_t)m->c.n_layers * max_ctx *
				 (size_t)m->kv_dim * elt;
	}
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

	if (sp->temperature == 0.0f)
		return sbk_argmax(logits, sp->vocab);
	for (int q = 0; q < sp->vocab; q++)
		logits[q] /= sp->temperature;
	sbk_softmax(logits, sp->vocab);
	coin = random_f32(&sp->rng);
	if (sp->topp <= 0 || sp->topp >= 1)
		return sample_mult(logits, sp->vocab, coin);
	return sample_topp(sp, logits, coin);
}

/* ---- tokenizer (run.c) ----------------------------------------------------- */

int sbm_tokenizer_load(struct sbm_tokenizer *t, const char *path,
		       int vocab_size)
{
	FILE *f = fopen(path, "rb");
	int max_len, len, r = -EINVAL;

	memset(t, 0, sizeof(*t));
	if (!f)
		return -errno;
	t->vocab_size = vocab_size;
	t->vocab = calloc((size_t)vocab_size, sizeof(*t->vocab));
	t->scores = calloc((size_t)vocab_size, sizeof(*t->scores));
	if (!t->vocab || !t->scores) {
		r = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < 256; i++) {
		t->byte_pieces[i * 2] = (unsigned char)i;
		t->byte_pieces[i * 2 + 1] = 0;
	}
	if (fread(&max_len, sizeof(int), 1, f) != 1)
		goto out;
	for (int i = 0; i < vocab_size; i++) {
		if (fread(&t->scores[i], sizeof(float), 1, f) != 1 ||
		    fread(&len, sizeof(int), 1, f) != 1 || len < 0 ||
		    len > 1 << 16)
			goto out;
		t->vocab[i] = malloc((size_t)len + 1);
		if (!t->vocab[i] || fread(t->vocab[i], 1, (size_t)len, f) !=
					    (size_t)len)
			goto out;
		t->vocab[i][len] = 0;
	}
	r = 0;
out:
	fclose(f);
	if (r < 0)
		sbm_tokenizer_free(t);
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
