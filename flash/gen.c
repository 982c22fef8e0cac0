/* SPDX-License-Identifier: MIT */
/*
 * Synthetic sbflash checkpoints (format.h) whose ReLU FFNs are sparse and
 * predictable by construction.
 *
 * The residual stream lives near an s-dimensional subspace S (s = rank)
 * spanned by random sign vectors e_j (unit norm, nearly orthogonal): token
 * embeddings, attention outputs (wo's columns) and FFN outputs (down
 * columns) are random combinations of a few e_j plus a little noise off S.
 * Neuron i's up row is alpha * sum over 4 directions j of g_ij e_j (plus
 * noise), so its pre-activation is nearly a linear function of the s
 * coordinates E x; a negative bias puts it above zero for about `active`
 * of the inputs. The predictor is therefore built, not fitted: A = alpha E
 * (s x dim), B = the g_ij (hidden x s), score = B (A x) + bias. What makes
 * it imperfect: the noise off S, f16 rounding of the weights, and that it
 * reads the layer input before attention while the FFN sees it after.
 * Recall and precision are measured on sampled inputs (layer 0, through
 * the runtime's own kernel) and written into the header.
 *
 * Every random stream is seeded from (seed, layer, kind, row), so the file
 * does not depend on the thread count. The generator writes each layer
 * with large sequential writes and both cores fill the buffers.
 */
#include "gen.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file.h"
#include "model.h"
#include "sbkernels.h"

#define DIRS 4 /* subspace directions per neuron */

enum { K_BASIS = 1, K_EMB, K_WQ, K_WK, K_WV, K_WO, K_NEURON, K_SAMPLE };

static inline uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

struct rng {
	uint64_t s;
	uint32_t spare;
	int have;
};

static void rng_seed(struct rng *r, uint64_t seed, uint32_t layer, int kind,
		     uint64_t row)
{
	r->s = mix(seed ^ mix(((uint64_t)layer << 40) ^ ((uint64_t)kind << 32) ^
			      row));
	r->have = 0;
}

/* Uniform in [-1, 1): two per 64-bit draw. */
static inline float unif(struct rng *r)
{
	uint32_t u;

	if (r->have) {
		r->have = 0;
		u = r->spare;
	} else {
		uint64_t x = mix(r->s += 0x9e3779b97f4a7c15ull);

		r->spare = (uint32_t)(x >> 32);
		r->have = 1;
		u = (uint32_t)x;
	}
	return (float)(int32_t)u * 0x1p-31f;
}

/* Unit variance (uniform; the sums below make it Gaussian enough). */
static inline float unit(struct rng *r)
{
	return unif(r) * 1.7320508f;
}

void sbf_gen_defaults(struct sbf_gen_opts *o, uint64_t model_bytes)
{
	struct sbf_header h;
	uint64_t per_layer, fixed;

	memset(o, 0, sizeof(*o));
	o->seed = 1;
	o->dim = model_bytes >= ((uint64_t)1 << 30) ? 4096 : 1024;
	o->hidden = 6 * o->dim;
	o->n_heads = o->dim / 128;
	o->n_kv_heads = o->n_heads / 4 ? o->n_heads / 4 : 1;
	o->vocab = 4096;
	o->rank = 64;
	o->active = 0.03f;
	o->margin = 0.25f;
	o->noise = 0.1f;
	memset(&h, 0, sizeof(h));
	h.dim = o->dim, h.n_heads = o->n_heads, h.n_kv_heads = o->n_kv_heads;
	h.hidden = o->hidden, h.vocab = o->vocab, h.rank = o->rank;
	h.n_layers = 1;
	sbf_layout(&h);
	fixed = ((uint64_t)h.vocab * h.dim + h.dim) * 4 + 2 * SBF_ALIGN;
	per_layer = sbf_layer_floats(&h) * 4 + (uint64_t)h.hidden * h.bundle;
	o->n_layers = model_bytes > fixed
			      ? (uint32_t)((model_bytes - fixed + per_layer / 2) /
					   per_layer)
			      : 1;
	if (!o->n_layers)
		o->n_layers = 1;
}

/* ---- A tiny parallel-for on pthreads ------------------------------------ */

struct pfor {
	void (*fn)(void *ctx, uint64_t lo, uint64_t hi);
	void *ctx;
	uint64_t n;
	int nt, t;
};

static void *pfor_main(void *arg)
{
	struct pfor *p = arg;
	uint64_t lo = p->n * (uint64_t)p->t / (uint64_t)p->nt;
	uint64_t hi = p->n * (uint64_t)(p->t + 1) / (uint64_t)p->nt;

	p->fn(p->ctx, lo, hi);
	return NULL;
}

static void parallel_for(int nt, uint64_t n,
			 void (*fn)(void *ctx, uint64_t lo, uint64_t hi),
			 void *ctx)
{
	pthread_t th[64];
	struct pfor p[64];
	int started = 0;

	if (nt > 64)
		nt = 64;
	for (int t = 0; t < nt; t++)
		p[t] = (struct pfor){fn, ctx, n, nt, t};
	for (int t = 1; t < nt; t++)
		if (!pthread_create(&th[t], NULL, pfor_main, &p[t]))
			started |= 1 << (t & 31);
		else
			pfor_main(&p[t]);
	pfor_main(&p[0]);
	for (int t = 1; t < nt; t++)
		if (started & (1 << (t & 31)))
			pthread_join(th[t], NULL);
}

/* ---- The weights --------------------------------------------------------- */

struct gen {
	const struct sbf_gen_opts *o;
	struct sbf_header *h;
	float *basis;	/* (rank, dim): the e_j */
	float alpha;	/* up rows: alpha * sum g e_j */
	float beta;	/* down columns */
	float tau;	/* bias = -tau * |g_i| */
	uint32_t layer;
	float *res;	/* the layer's resident floats */
	char *ffn;	/* the layer's bundles */
	float *pb;	/* (hidden, rank) into res */
	float *bias;	/* (hidden) into res */
};

/* A random sign vector of unit norm. */
static void basis_fill(struct gen *g)
{
	uint32_t d = g->h->dim;
	float v = 1.0f / sqrtf((float)d);

	for (uint32_t j = 0; j < g->h->rank; j++) {
		struct rng r;

		rng_seed(&r, g->o->seed, 0xffffff, K_BASIS, j);
		for (uint32_t k = 0; k < d; k++)
			g->basis[(size_t)j * d + k] = unif(&r) < 0 ? -v : v;
	}
}

/* DIRS distinct directions and their coefficients. */
static void pick_dirs(struct rng *r, uint32_t rank, uint32_t *dir, float *c)
{
	for (int a = 0; a < DIRS; a++) {
		int dup;

		do {
			dir[a] = (uint32_t)((unif(r) + 1.0f) * 0.5f * rank) %
				 rank;
			dup = 0;
			for (int b = 0; b < a; b++)
				dup |= dir[b] == dir[a];
		} while (dup);
		c[a] = unit(r);
	}
}

/* Neurons [lo, hi) of the layer: bundle, bias, predictor row. */
static void neurons(void *ctx, uint64_t lo, uint64_t hi)
{
	struct gen *g = ctx;
	const struct sbf_header *h = g->h;
	uint32_t d = h->dim, s = h->rank;
	float *up = malloc(d * sizeof(float)), *dn = malloc(d * sizeof(float));
	float un = g->o->noise * 2.0f / sqrtf((float)d); /* score sd ~ 2 */
	float dnn = g->o->noise * g->beta * 2.0f / sqrtf((float)d);

	if (!up || !dn)
		abort();
	for (uint64_t i = lo; i < hi; i++) {
		uint16_t *b = (uint16_t *)(g->ffn + i * h->bundle);
		uint32_t dir[DIRS], ddir[DIRS];
		float c[DIRS], dc[DIRS], norm = 0.0f;
		struct rng r;

		rng_seed(&r, g->o->seed, g->layer, K_NEURON, i);
		pick_dirs(&r, s, dir, c);
		pick_dirs(&r, s, ddir, dc);
		for (uint32_t k = 0; k < d; k++) {
			up[k] = un * unif(&r);
			dn[k] = dnn * unif(&r);
		}
		for (int a = 0; a < DIRS; a++) {
			const float *e = g->basis + (size_t)dir[a] * d;
			const float *f = g->basis + (size_t)ddir[a] * d;
			float ca = g->alpha * c[a], da = g->beta * dc[a];

			for (uint32_t k = 0; k < d; k++) {
				up[k] += ca * e[k];
				dn[k] += da * f[k];
			}
			norm += c[a] * c[a];
		}
		sbk_f32_to_f16(b, up, d);
		sbk_f32_to_f16(b + d, dn, d);
		memset(b + 2 * d, 0, h->bundle - 4 * (size_t)d);
		memset(g->pb + i * s, 0, s * sizeof(float));
		for (int a = 0; a < DIRS; a++)
			g->pb[i * s + dir[a]] = c[a];
		g->bias[i] = -g->tau * sqrtf(norm);
	}
	free(up);
	free(dn);
}

/* Rows [lo, hi) of a (rows, dim) uniform matrix, entries of sd `sd`. */
struct mat_job {
	struct gen *g;
	float *w;
	int kind;
	float sd;
};

static void mat_rows(void *ctx, uint64_t lo, uint64_t hi)
{
	struct mat_job *j = ctx;
	uint32_t d = j->g->h->dim;
	float a = j->sd * 1.7320508f;

	for (uint64_t row = lo; row < hi; row++) {
		struct rng r;
		float *w = j->w + row * d;

		rng_seed(&r, j->g->o->seed, j->g->layer, j->kind, row);
		for (uint32_t k = 0; k < d; k++)
			w[k] = a * unif(&r);
	}
}

static void fill_mat(struct gen *g, float *w, uint64_t rows, int kind,
		     float sd)
{
	struct mat_job j = {g, w, kind, sd};

	parallel_for(g->o->threads, rows, mat_rows, &j);
}

/* wo (dim, dim): column k = gamma * sum of 2 directions, plus noise. */
static void fill_wo(struct gen *g, float *wo)
{
	uint32_t d = g->h->dim, s = g->h->rank;
	float gamma = 0.3f * sqrtf((float)s) / sqrtf(2.0f * d);
	struct rng r;

	fill_mat(g, wo, d, K_WO, g->o->noise * gamma * sqrtf(2.0f / d));
	rng_seed(&r, g->o->seed, g->layer, K_WO, 0xffffffffull);
	for (uint32_t k = 0; k < d; k++)
		for (int a = 0; a < 2; a++) {
			uint32_t j = (uint32_t)((unif(&r) + 1.0f) * 0.5f * s) % s;
			float c = gamma * unit(&r);
			const float *e = g->basis + (size_t)j * d;

			for (uint32_t row = 0; row < d; row++)
				wo[(size_t)row * d + k] += c * e[row];
		}
}

/* Token embeddings: sum of unit coefficients on every e_j, plus noise. */
static void emb_rows(void *ctx, uint64_t lo, uint64_t hi)
{
	struct gen *g = ctx;
	uint32_t d = g->h->dim, s = g->h->rank;
	float nz = g->o->noise * sqrtf((float)s) / sqrtf((float)d) * 1.7320508f;

	for (uint64_t t = lo; t < hi; t++) {
		float *w = g->res + t * d;
		struct rng r;

		rng_seed(&r, g->o->seed, 0xfffffe, K_EMB, t);
		for (uint32_t k = 0; k < d; k++)
			w[k] = nz * unif(&r);
		for (uint32_t j = 0; j < s; j++) {
			float c = unit(&r);
			const float *e = g->basis + (size_t)j * d;

			for (uint32_t k = 0; k < d; k++)
				w[k] += c * e[k];
		}
	}
}

static int write_all(int fd, const void *p, size_t n, uint64_t off)
{
	while (n) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p = (const char *)p + w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

/* Sparsity, recall and precision on NS sampled layer inputs: h in S plus
 * noise, shifted by an attention-like output (0.3 of its norm, also in S)
 * between the predictor's input and the FFN's. Layer 0, the first
 * `neurons` neurons, through the runtime's own FFN kernel. */
#define NS 64
static void measure(struct gen *g, const float *res_layer0,
		    const char *ffn_layer0, uint32_t neurons)
{
	struct sbf_header *h = g->h;
	uint32_t d = h->dim, s = h->rank;
	float *hv = malloc(d * 4), *xp = malloc(d * 4), *xt = malloc(d * 4);
	float *ones = malloc(d * 4), *out = malloc(d * 4);
	float *act = malloc(neurons * 4), *pt = malloc(s * 4);
	float *score = malloc((size_t)h->hidden * 4);
	int32_t *idx = malloc(neurons * 4);
	uint64_t kv = sbf_kv_dim(h);
	const float *pa = res_layer0 + d + 2 * (uint64_t)d * d + 2 * kv * d +
			  d + h->hidden;
	const float *bias = pa - h->hidden;
	const float *pb = pa + (uint64_t)s * d;
	uint64_t n_true = 0, n_pred = 0, n_both = 0, n = 0;

	if (!hv || !xp || !xt || !ones || !out || !act || !pt || !score || !idx)
		abort();
	for (uint32_t k = 0; k < d; k++)
		ones[k] = 1.0f;
	for (uint32_t i = 0; i < neurons; i++)
		idx[i] = (int32_t)i;
	for (int t = 0; t < NS; t++) {
		struct rng r;
		float nz = g->o->noise * sqrtf((float)s) / sqrtf((float)d) *
			   1.7320508f;

		rng_seed(&r, g->o->seed, 0xfffffd, K_SAMPLE, (uint64_t)t);
		for (uint32_t k = 0; k < d; k++)
			hv[k] = nz * unif(&r);
		for (uint32_t j = 0; j < s; j++) {
			float c = unit(&r);

			for (uint32_t k = 0; k < d; k++)
				hv[k] += c * g->basis[(size_t)j * d + k];
		}
		sbk_rmsnorm(xp, hv, ones, 1, (int)d, 1e-5f);
		for (uint32_t j = 0; j < s; j++) {
			float c = 0.3f * unit(&r);

			for (uint32_t k = 0; k < d; k++)
				hv[k] += c * g->basis[(size_t)j * d + k];
		}
		sbk_rmsnorm(xt, hv, ones, 1, (int)d, 1e-5f);
		sbk_matvec(pt, pa, xp, (int)s, (int)d);
		sbk_matvec(score, pb, pt, (int)h->hidden, (int)s);
		sbk_ffn_sparse(out, xt, ffn_layer0, h->bundle, SBK_F16, bias,
			       idx, (int)neurons, (int)d, act);
		for (uint32_t i = 0; i < neurons; i++) {
			int tr = act[i] > 0.0f;
			int pr = score[i] + bias[i] > h->pred_margin;

			n_true += (uint64_t)tr;
			n_pred += (uint64_t)pr;
			n_both += (uint64_t)(tr && pr);
			n++;
		}
	}
	h->sparsity = 1.0f - (float)n_true / (float)n;
	h->recall = n_true ? (float)n_both / (float)n_true : 1.0f;
	h->precision = n_pred ? (float)n_both / (float)n_pred : 1.0f;
	h->predicted = (float)n_pred / (float)n;
	h->samples = (uint32_t)n;
	free(hv), free(xp), free(xt), free(ones), free(out), free(act);
	free(pt), free(score), free(idx);
}

static void progress(const struct sbf_gen_opts *o, uint32_t done,
		     uint32_t total)
{
	if (!o->progress)
		return;
	if (o->progress < 0) {
		/* Not a terminal (a log, a script): a line per tenth. */
		if (done == total || 10 * done / total != 10 * (done - 1) / total)
			fprintf(stderr, "sbgen: layer %u/%u\n", done, total);
		return;
	}
	fprintf(stderr, "\rsbgen: layer %u/%u [%-40.*s]", done, total,
		(int)(40 * done / total), "########################################");
	if (done == total)
		fputc('\n', stderr);
}

int sbf_gen_check(const struct sbf_gen_opts *o, const char **why)
{
	struct sbf_header h;
	const char *w = NULL;

	if (o->rank < DIRS || o->rank > o->dim)
		w = "the rank must be at least 4 and at most dim";
	else if (!(o->active > 0 && o->active < 1))
		w = "the active fraction must be in (0, 1)";
	else if (!isfinite(o->margin) || !isfinite(o->noise) ||
		 o->noise < 0)
		w = "margin and noise must be finite, noise >= 0";
	if (w) {
		if (why)
			*why = w;
		return -EINVAL;
	}
	/* The rest is what a reader checks (before sbf_layout(), which is
	 * exact only within the geometry's bounds). */
	memset(&h, 0, sizeof(h));
	h.dim = o->dim, h.n_layers = o->n_layers, h.hidden = o->hidden;
	h.n_heads = o->n_heads, h.n_kv_heads = o->n_kv_heads;
	h.vocab = o->vocab, h.rank = o->rank;
	if (sbf_geometry_check(&h, why) < 0)
		return -EINVAL;
	return 0;
}

int sbf_generate(const char *path, const struct sbf_gen_opts *o,
		 struct sbf_header *out)
{
	struct sbf_header h;
	struct sbf_gen_opts oo = *o;
	struct gen g = {0};
	uint64_t d, kv, lf, off;
	float *res = NULL, *first_res = NULL;
	char *ffn = NULL, *first_ffn = NULL;
	struct sbc_out of;
	int fd, err = 0;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	if (sbf_gen_check(o, NULL) < 0)
		return -EINVAL;
	if (oo.threads <= 0)
		oo.threads = ncpu > 0 ? (int)ncpu : 1;
	memset(&h, 0, sizeof(h));
	memcpy(h.magic, SBF_MAGIC, 8);
	h.version = SBF_VERSION;
	h.dim = o->dim, h.n_layers = o->n_layers, h.hidden = o->hidden;
	h.n_heads = o->n_heads, h.n_kv_heads = o->n_kv_heads;
	h.vocab = o->vocab, h.rank = o->rank;
	h.dtype = SBK_F16;
	h.seed = o->seed;
	h.rope_theta = 10000.0f;
	sbf_layout(&h);
	d = h.dim, kv = sbf_kv_dim(&h), lf = sbf_layer_floats(&h);

	g.o = &oo;
	g.h = &h;
	/* Scores have sd ~ |g_i| when alpha * |E x| per direction is ~1:
	 * rmsnorm makes |x| = sqrt(dim), so E x has sd sqrt(dim / rank). */
	g.alpha = sqrtf((float)h.rank / (float)d);
	/* The FFN output should be ~0.3 of the residual (norm sqrt(rank)):
	 * active neurons have activation ~0.5 sd of a score (~2). */
	g.beta = 0.3f * sqrtf((float)h.rank) /
		 sqrtf(o->active * h.hidden * DIRS + 1.0f);
	/* Quantile of a standard normal at 1 - active (Acklam-free: a
	 * rational fit good to 1e-3 on 1e-4..0.5), in units of |g_i|. */
	{
		double p = o->active, t = sqrt(-2.0 * log(p));

		g.tau = (float)(t - (2.515517 + 0.802853 * t + 0.010328 * t * t) /
					    (1 + 1.432788 * t + 0.189269 * t * t +
					     0.001308 * t * t * t));
	}
	/* The predictor's threshold sits below 0 by margin score sds (~2). */
	h.pred_margin = -2.0f * o->margin;

	g.basis = malloc(h.rank * d * sizeof(float));
	res = malloc((size_t)(lf > h.vocab * d ? lf : h.vocab * d) * 4);
	ffn = malloc((size_t)h.hidden * h.bundle);
	first_res = malloc((size_t)lf * 4);
	first_ffn = malloc((size_t)(h.hidden < 4096 ? h.hidden : 4096) *
			   h.bundle);
	if (!g.basis || !res || !ffn || !first_res || !first_ffn) {
		err = -ENOMEM;
		goto out;
	}
	/* A new file beside path, renamed over it once complete: what path
	 * named stays intact until then, and is never unlinked. */
	err = sbc_out_open(&of, path, 0644);
	if (err < 0)
		goto out;
	fd = of.fd;
	basis_fill(&g);

	/* Embeddings. */
	g.res = res;
	parallel_for(oo.threads, h.vocab, emb_rows, &g);
	err = write_all(fd, res, (size_t)h.vocab * d * 4, h.res_off);
	off = h.res_off + (uint64_t)h.vocab * d * 4;
	for (uint32_t l = 0; l < h.n_layers && !err; l++) {
		float *p = res;
		uint64_t nn = h.hidden < 4096 ? h.hidden : 4096;

		g.layer = l;
		for (uint64_t k = 0; k < d; k++)
			p[k] = 1.0f; /* rms_att */
		p += d;
		fill_mat(&g, p, d, K_WQ, 1.0f / sqrtf((float)d));
		p += d * d;
		fill_mat(&g, p, kv, K_WK, 1.0f / sqrtf((float)d));
		p += kv * d;
		fill_mat(&g, p, kv, K_WV, 1.0f / sqrtf((float)d));
		p += kv * d;
		fill_wo(&g, p);
		p += d * d;
		for (uint64_t k = 0; k < d; k++)
			p[k] = 1.0f; /* rms_ffn */
		p += d;
		g.bias = p;
		p += h.hidden;
		for (uint64_t j = 0; j < h.rank; j++) /* A = alpha E */
			for (uint64_t k = 0; k < d; k++)
				p[j * d + k] = g.alpha * g.basis[j * d + k];
		p += (uint64_t)h.rank * d;
		g.pb = p;
		g.ffn = ffn;
		parallel_for(oo.threads, h.hidden, neurons, &g);
		if (l == 0) {
			memcpy(first_res, res, (size_t)lf * 4);
			memcpy(first_ffn, ffn, (size_t)nn * h.bundle);
		}
		err = write_all(fd, res, (size_t)lf * 4, off);
		off += lf * 4;
		if (!err)
			err = write_all(fd, ffn, (size_t)h.hidden * h.bundle,
					h.ffn_off + (uint64_t)l * h.hidden *
							    h.bundle);
		progress(&oo, l + 1, h.n_layers);
	}
	if (!err) {
		for (uint64_t k = 0; k < d; k++)
			res[k] = 1.0f; /* rms_final */
		err = write_all(fd, res, d * 4, off);
	}
	if (!err) {
		measure(&g, first_res, first_ffn,
			h.hidden < 4096 ? h.hidden : 4096);
		char blk[SBF_ALIGN];

		memset(blk, 0, sizeof(blk));
		memcpy(blk, &h, sizeof(h));
		err = write_all(fd, blk, sizeof(blk), 0);
	}
	if (!err && ftruncate(fd, (off_t)h.file_bytes) < 0)
		err = -errno;
	if (!err && fdatasync(fd) < 0)
		err = -errno;
	/* Leave the page cache as a reader would find it: cold. */
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	if (!err)
		err = sbc_out_commit(&of);
	else
		sbc_out_abort(&of);
	if (!err && out)
		*out = h;
out:
	free(g.basis), free(res), free(ffn), free(first_res), free(first_ffn);
	return err;
}
