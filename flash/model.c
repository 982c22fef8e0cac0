/* SPDX-License-Identifier: MIT */
/*
 * One decode step of the sbflash model with the sbkernels: predictor, then
 * attention, then the sparse ReLU FFN, per layer. See model.h.
 */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"
#include "sbkernels.h"

#define EPS 1e-5f

static int bad(const char **why, const char *what)
{
	if (why)
		*why = what;
	return -EBADMSG;
}

static int unit_fraction(float x)
{
	return x >= 0.0f && x <= 1.0f;	/* false for NaN */
}

int sbf_geometry_check(const struct sbf_header *h, const char **why)
{
	if (!h->dim || !h->n_layers || !h->n_heads || !h->n_kv_heads ||
	    !h->hidden || !h->vocab || !h->rank)
		return bad(why, "a dimension is zero");
	if (h->dim > SBF_MAX_DIM || h->hidden > SBF_MAX_HIDDEN ||
	    h->vocab > SBF_MAX_VOCAB || h->n_layers > SBF_MAX_LAYERS ||
	    h->rank > h->dim)
		return bad(why, "a dimension is too large");
	if (h->dim % h->n_heads || h->n_kv_heads > h->n_heads ||
	    h->n_heads % h->n_kv_heads)
		return bad(why, "dim, n_heads and n_kv_heads do not divide");
	if ((h->dim / h->n_heads) % 2 || h->dim / h->n_heads > 1024)
		return bad(why, "head size odd or above 1024");
	return 0;
}

int sbf_header_check(const struct sbf_header *h, uint64_t file_bytes,
		     const char **why)
{
	struct sbf_header want;
	int r;

	if (memcmp(h->magic, SBF_MAGIC, 8))
		return bad(why, "no SBFLASH1 magic");
	if (h->version != SBF_VERSION)
		return bad(why, "unknown version");
	if ((r = sbf_geometry_check(h, why)) < 0)
		return r;
	if (h->dtype != SBK_F16)
		return bad(why, "FFN weights not f16");
	if (!isfinite(h->rope_theta) || !(h->rope_theta > 0) ||
	    !isfinite(h->pred_margin))
		return bad(why, "rope_theta or pred_margin not a finite "
				"number");
	if (!unit_fraction(h->sparsity) || !unit_fraction(h->recall) ||
	    !unit_fraction(h->precision) || !unit_fraction(h->predicted))
		return bad(why, "a measured fraction outside [0, 1]");
	/* Within the bounds above the layout is below 2^60 bytes: the
	 * arithmetic of sbf_layout() cannot wrap, and its results must be
	 * the header's own. */
	want = *h;
	sbf_layout(&want);
	if (want.bundle != h->bundle || want.res_off != h->res_off ||
	    want.res_bytes != h->res_bytes || want.ffn_off != h->ffn_off ||
	    want.ffn_bytes != h->ffn_bytes || want.file_bytes != h->file_bytes)
		return bad(why, "offsets or sizes disagree with the geometry");
	if (h->file_bytes > file_bytes)
		return bad(why, "shorter than its header says");
	return 0;
}

static int header_read(int fd, struct sbf_header *h, const char **why)
{
	struct stat st;
	ssize_t n = pread(fd, h, sizeof(*h), 0);

	if (n < 0)
		return -errno;
	if ((size_t)n < sizeof(*h))
		return bad(why, "shorter than a header");
	if (fstat(fd, &st) < 0)
		return -errno;
	return sbf_header_check(h, (uint64_t)st.st_size, why);
}

int sbf_header_read(int fd, struct sbf_header *h)
{
	return header_read(fd, h, NULL);
}

int sbf_open(const char *path, struct sbf_header *h, const char **why)
{
	int fd = sbc_open_regular(path, NULL), r;

	if (fd < 0)
		return fd;
	r = header_read(fd, h, why);
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}

int sbf_model_bind(struct sbf_model *m, const struct sbf_header *h,
		   const float *res)
{
	uint64_t d = h->dim, kv = sbf_kv_dim(h);
	const float *p = res;

	m->h = *h;
	m->layer = calloc(h->n_layers, sizeof(*m->layer));
	if (!m->layer)
		return -ENOMEM;
	m->emb = p;
	p += (uint64_t)h->vocab * d;
	for (uint32_t l = 0; l < h->n_layers; l++) {
		struct sbf_layer *L = &m->layer[l];

		L->rms_att = p, p += d;
		L->wq = p, p += d * d;
		L->wk = p, p += kv * d;
		L->wv = p, p += kv * d;
		L->wo = p, p += d * d;
		L->rms_ffn = p, p += d;
		L->bias = p, p += h->hidden;
		L->pa = p, p += (uint64_t)h->rank * d;
		L->pb = p, p += (uint64_t)h->hidden * h->rank;
	}
	m->rms_final = p;
	return 0;
}

void sbf_model_free(struct sbf_model *m)
{
	free(m->layer);
	m->layer = NULL;
}

static void *zalloc(size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, 64, n ? n : 64))
		return NULL;
	memset(p, 0, n);
	return p;
}

int sbf_run_init(struct sbf_run *r, const struct sbf_model *m,
		 const void *ffn, int max_pos)
{
	const struct sbf_header *h = &m->h;
	size_t d = h->dim, kv = sbf_kv_dim(h), H = h->hidden, cache;

	memset(r, 0, sizeof(*r));
	/* K or V: (n_layers, max_pos, kv_dim) floats. */
	if (max_pos < 1 ||
	    __builtin_mul_overflow((size_t)h->n_layers, (size_t)max_pos,
				   &cache) ||
	    __builtin_mul_overflow(cache, kv * sizeof(float), &cache))
		return -EINVAL;
	r->m = m;
	r->ffn = ffn;
	r->max_pos = max_pos;
	r->h = zalloc(d * 4);
	r->xb = zalloc(d * 4);
	r->q = zalloc(d * 4);
	r->att = zalloc(d * 4);
	r->o = zalloc(d * 4);
	r->pt = zalloc(h->rank * 4);
	r->score = zalloc(H * 4);
	r->act = zalloc(H * 4);
	r->all_act = zalloc(H * 4);
	r->logits = zalloc((size_t)h->vocab * 4);
	r->kc = zalloc(cache);
	r->vc = zalloc(cache);
	r->active = zalloc(H * 4);
	r->all_idx = zalloc(H * 4);
	if (!r->h || !r->xb || !r->q || !r->att || !r->o || !r->pt ||
	    !r->score || !r->act || !r->all_act || !r->logits || !r->kc ||
	    !r->vc || !r->active || !r->all_idx) {
		sbf_run_free(r);
		return -ENOMEM;
	}
	for (size_t i = 0; i < H; i++)
		r->all_idx[i] = (int32_t)i;
	return 0;
}

void sbf_run_free(struct sbf_run *r)
{
	free(r->h), free(r->xb), free(r->q), free(r->att), free(r->o);
	free(r->pt), free(r->score), free(r->act), free(r->all_act);
	free(r->logits), free(r->kc), free(r->vc), free(r->active);
	free(r->all_idx);
	memset(r, 0, sizeof(*r));
}

/* The predictor on the layer input: the active set, ascending. */
static int predict(struct sbf_run *r, const struct sbf_layer *L)
{
	const struct sbf_header *h = &r->m->h;
	int n = 0;

	sbk_rmsnorm(r->xb, r->h, L->rms_ffn, 1, (int)h->dim, EPS);
	sbk_matvec(r->pt, L->pa, r->xb, (int)h->rank, (int)h->dim);
	sbk_matvec(r->score, L->pb, r->pt, (int)h->hidden, (int)h->rank);
	for (uint32_t i = 0; i < h->hidden; i++)
		if (r->score[i] + L->bias[i] > h->pred_margin)
			r->active[n++] = (int32_t)i;
	return n;
}

static void attention(struct sbf_run *r, const struct sbf_layer *L, int l,
		      int pos)
{
	const struct sbf_header *h = &r->m->h;
	int d = (int)h->dim, kv = (int)sbf_kv_dim(h);
	int hd = d / (int)h->n_heads;
	size_t lo = (size_t)l * r->max_pos * kv;
	float *k = r->kc + lo + (size_t)pos * kv, *v = r->vc + lo + (size_t)pos * kv;
	struct sbk_attn a = {(int)h->n_heads, (int)h->n_kv_heads, hd, 0.0f};
	struct sbk_kv c = sbk_kv_pos_major(r->kc + lo, r->vc + lo, SBK_F32,
					   (int)h->n_kv_heads, hd);

	sbk_rmsnorm(r->xb, r->h, L->rms_att, 1, d, EPS);
	sbk_matvec(r->q, L->wq, r->xb, d, d);
	sbk_matvec(k, L->wk, r->xb, kv, d);
	sbk_matvec(v, L->wv, r->xb, kv, d);
	sbk_rope(r->q, (int)h->n_heads, hd, pos, h->rope_theta);
	sbk_rope(k, (int)h->n_kv_heads, hd, pos, h->rope_theta);
	sbk_attn_decode(r->att, r->q, &a, &c, 0, (size_t)pos + 1);
	sbk_matvec(r->o, L->wo, r->att, d, d);
	for (int i = 0; i < d; i++)
		r->h[i] += r->o[i];
}

int sbf_step(struct sbf_run *r, int token, int pos)
{
	const struct sbf_model *m = r->m;
	const struct sbf_header *h = &m->h;
	int d = (int)h->dim, err;

	if (token < 0 || (uint32_t)token >= h->vocab || pos < 0 ||
	    pos >= r->max_pos)
		return -EINVAL;
	memcpy(r->h, m->emb + (size_t)token * d, (size_t)d * sizeof(float));
	for (uint32_t l = 0; l < h->n_layers; l++) {
		const struct sbf_layer *L = &m->layer[l];
		const char *base = r->ffn + (size_t)l * h->hidden * h->bundle;
		const int32_t *idx = r->dense ? r->all_idx : r->active;
		int n = r->dense ? (int)h->hidden : predict(r, L);

		if (r->hooks.fetch &&
		    (err = r->hooks.fetch(r->hooks.ctx, (int)l, idx, n)) < 0)
			return err;
		attention(r, L, (int)l, pos);
		if (r->hooks.ready &&
		    (err = r->hooks.ready(r->hooks.ctx, (int)l)) < 0)
			return err;
		sbk_rmsnorm(r->xb, r->h, L->rms_ffn, 1, d, EPS);
		if (r->measure && !r->dense) {
			/* Every neuron, for the predictor's recall: the
			 * output is thrown away (r->o is free here). */
			err = sbk_ffn_sparse(r->o, r->xb, base, h->bundle,
					     SBK_F16, L->bias, r->all_idx,
					     (int)h->hidden, d, r->all_act);
			if (err < 0)
				return err;
			for (int j = 0, i = 0; i < (int)h->hidden; i++) {
				int pred = j < n && idx[j] == i;

				j += pred;
				if (r->all_act[i] > 0.0f) {
					r->n_true++;
					r->n_true_pred += pred;
				}
			}
		}
		if (r->hooks.fired && !r->dense) {
			err = sbk_ffn_sparse_act(r->act, r->xb, base, h->bundle,
						 SBK_F16, L->bias, idx, n, d);
			if (err == 0)
				err = r->hooks.fired(r->hooks.ctx, (int)l, idx,
						     r->act, n);
			if (err < 0)
				return err;
		}
		err = sbk_ffn_sparse(r->o, r->xb, base, h->bundle, SBK_F16,
				     L->bias, idx, n, d, r->act);
		if (err < 0)
			return err;
		r->n_computed += (uint64_t)n;
		for (int j = 0; j < n; j++)
			r->n_nonzero += r->act[j] > 0.0f;
		for (int i = 0; i < d; i++)
			r->h[i] += r->o[i];
	}
	sbk_rmsnorm(r->xb, r->h, m->rms_final, 1, d, EPS);
	sbk_matvec(r->logits, m->emb, r->xb, (int)h->vocab, d);
	return 0;
}
