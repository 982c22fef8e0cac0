/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the llama2.c checkpoint loaders (runner/model.c sbm_bind on the
 * bytes in memory, sbm_load on the file): the input is the checkpoint, 7
 * ints of header then f32 weights.
 *
 * The contract checked: both loaders agree; they fail with -EBADMSG (and
 * say why), or every
 * header field is usable (positive, dim divisible by n_heads, n_heads by
 * n_kv_heads, an even head size) and every weight array it points at lies
 * inside the file, computed here without overflow (128-bit). A model that
 * passes then runs from an exact-size heap copy: a dense session, three
 * tokens through sbm_forward (ASan and UBSan watch the kernels). That is what
 * sbrun does with a file it was given, and the file is small, so the model is
 * too.
 */
#include "fuzz.h"
#include "../../runner/model.h"

typedef unsigned __int128 u128;

/* [p, p + n floats) inside [base, base + len)? */
static int inside(const void *base, size_t len, const float *p, u128 n)
{
	const char *b = base, *q = (const char *)p;

	return q >= b && q <= b + len &&
	       n * sizeof(float) <= (u128)(size_t)(b + len - q);
}

static void check_model(const struct sbm_model *m, const void *base,
			size_t size)
{
	const struct sbm_config *c = &m->c;
	const struct sbm_weights *w = &m->w;
	u128 d = (u128)c->dim, L = (u128)c->n_layers, h = (u128)c->hidden_dim;
	u128 V = (u128)c->vocab_size, kvd, need;
	int shared;

	FUZZ_CHECK(c->dim > 0 && c->hidden_dim > 0 && c->n_layers > 0 &&
			   c->n_heads > 0 && c->n_kv_heads > 0 &&
			   c->vocab_size > 0 && c->seq_len > 0,
		   "accepted a nonpositive field (dim %d hidden %d layers %d "
		   "heads %d kv_heads %d vocab %d seq %d)",
		   c->dim, c->hidden_dim, c->n_layers, c->n_heads,
		   c->n_kv_heads, c->vocab_size, c->seq_len);
	FUZZ_CHECK(c->dim % c->n_heads == 0 &&
			   c->n_heads % c->n_kv_heads == 0 &&
			   (c->dim / c->n_heads) % 2 == 0,
		   "accepted dim %d, heads %d, kv_heads %d", c->dim, c->n_heads,
		   c->n_kv_heads);
	FUZZ_CHECK(m->head_size == c->dim / c->n_heads &&
			   (u128)m->kv_dim ==
				   d * (u128)c->n_kv_heads / (u128)c->n_heads,
		   "head_size %d, kv_dim %d for dim %d heads %d/%d",
		   m->head_size, m->kv_dim, c->dim, c->n_heads, c->n_kv_heads);
	kvd = (u128)m->kv_dim;
	shared = w->wcls == w->token_embedding;
	/* run.c's layout: embedding, per-layer arrays, final norm, the
	 * unused RoPE tables, the classifier unless shared. */
	need = V * d + L * (2 * d + 2 * d * d + 2 * d * kvd + 3 * d * h) + d +
	       (u128)c->seq_len * (u128)m->head_size + (shared ? 0 : V * d);
	FUZZ_CHECK(28 + need * 4 <= size,
		   "accepted a file of %zu bytes whose header needs more "
		   "(dim %d hidden %d layers %d heads %d/%d vocab %d seq %d)",
		   size, c->dim, c->hidden_dim, c->n_layers, c->n_heads,
		   c->n_kv_heads, c->vocab_size, c->seq_len);
#define IN(p, n)                                                               \
	FUZZ_CHECK(inside(base, size, (p), (n)),                               \
		   "%s (%llu floats) is outside the file", #p,                 \
		   (unsigned long long)(n))
	IN(w->token_embedding, V * d);
	IN(w->rms_att, L * d);
	IN(w->wq, L * d * d);
	IN(w->wk, L * d * kvd);
	IN(w->wv, L * d * kvd);
	IN(w->wo, L * d * d);
	IN(w->rms_ffn, L * d);
	IN(w->w1, L * d * h);
	IN(w->w2, L * h * d);
	IN(w->w3, L * d * h);
	IN(w->rms_final, d);
	IN(w->wcls, V * d);
#undef IN
}

/* Three tokens through a dense session, as sbrun --kv dense would. */
static void run_model(const struct sbm_model *m)
{
	struct sbm_session *s;
	int err = 0;

	s = sbm_session_new(m, SBM_KV_DENSE, SBK_F32, NULL,
			    m->c.seq_len < 3 ? (size_t)m->c.seq_len : 3, &err);
	if (!s) {
		FUZZ_CHECK(err == -ENOMEM || err == -EINVAL,
			   "sbm_session_new: %d", err);
		return;
	}
	for (int t = 0; t < 3 && t < m->c.seq_len; t++) {
		int tok = (t * 7 + 1) % m->c.vocab_size;
		int r = sbm_forward(&s, &tok, 1);

		if (r < 0) {
			/* The geometry is beyond what the forward pass runs
			 * (a documented refusal, not a crash). */
			FUZZ_CHECK(r == -EINVAL || r == -ENOMEM,
				   "sbm_forward: %d", r);
			break;
		}
		for (int i = 0; i < m->c.vocab_size; i++)
			(void)*(volatile float *)&s->logits[i];
	}
	sbm_session_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* An exact-size heap copy: ASan sees any read past the file. */
	void *copy = malloc(size ? size : 1);
	struct sbm_model mb, ml;
	int rb, rl;

	if (!copy)
		abort();
	memcpy(copy, data, size);
	rb = sbm_bind(&mb, copy, size);
	rl = sbm_load(&ml, fuzz_file(data, size));
	FUZZ_CHECK(fuzz_input_fds() == 1, "sbm_load left the file open");
	FUZZ_CHECK(rb == rl, "sbm_bind says %d, sbm_load %d", rb, rl);
	if (rb < 0) {
		FUZZ_CHECK(rb == -EBADMSG && mb.why && ml.why,
			   "refused with %d, why \"%s\"", rb,
			   mb.why ? mb.why : "(none)");
	} else {
		FUZZ_CHECK(ml.map && ml.map_len == size,
			   "map %p of %zu bytes for %zu", ml.map, ml.map_len,
			   size);
		check_model(&mb, copy, size);
		check_model(&ml, ml.map, ml.map_len);
		run_model(&mb);
		sbm_unload(&ml);
		sbm_unload(&mb);
	}
	free(copy);
	return 0;
}
