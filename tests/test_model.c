/* The llama2.c runner on the real stories260K model:
 *  - greedy ids equal those of an independent naive forward pass written
 *    the way llama2.c's run.c is (the oracle below), for 256 steps;
 *  - sbrun --kv sparse and --kv dense print identical ids, with and
 *    without --prompt-ids;
 *  - sessions forked from a shared prompt produce the same tokens as
 *    independent runs while the pool holds the prompt's full pages once;
 *  - batched decode of sessions of different lengths equals decoding them
 *    one by one (bit for bit);
 *  - rewinding and decoding again reproduces the same ids, and freeing
 *    returns every page. */
#include "harness.h"
#include "model.h"

#include <libgen.h>
#include <math.h>

#define MODEL "../shared/models/stories260K.bin"

static int child(const char *name)
{
	(void)name;
	return 2;
}

/* ---- the oracle: run.c's forward, plain loops, its own dense cache ------ */

struct oracle {
	const struct sbm_model *m;
	float *kc, *vc, *x, *xb, *xb2, *hb, *hb2, *q, *k, *v, *att, *logits;
};

static void o_matmul(float *xout, const float *x, const float *w, int n, int d)
{
	for (int i = 0; i < d; i++) {
		float val = 0.0f;

		for (int j = 0; j < n; j++)
			val += w[(size_t)i * n + j] * x[j];
		xout[i] = val;
	}
}

static void o_rmsnorm(float *o, const float *x, const float *w, int size)
{
	float ss = 0.0f;

	for (int j = 0; j < size; j++)
		ss += x[j] * x[j];
	ss /= (float)size;
	ss += 1e-5f;
	ss = 1.0f / sqrtf(ss);
	for (int j = 0; j < size; j++)
		o[j] = w[j] * (ss * x[j]);
}

static void o_softmax(float *x, int size)
{
	float max = x[0], sum = 0.0f;

	for (int i = 1; i < size; i++)
		if (x[i] > max)
			max = x[i];
	for (int i = 0; i < size; i++) {
		x[i] = expf(x[i] - max);
		sum += x[i];
	}
	for (int i = 0; i < size; i++)
		x[i] /= sum;
}

static float *o_forward(struct oracle *o, int token, int pos)
{
	const struct sbm_config *p = &o->m->c;
	const struct sbm_weights *w = &o->m->w;
	int dim = p->dim, kv_dim = o->m->kv_dim, hs = o->m->head_size;
	int kv_mul = p->n_heads / p->n_kv_heads, hid = p->hidden_dim;

	memcpy(o->x, w->token_embedding + (size_t)token * dim,
	       (size_t)dim * sizeof(float));
	for (int l = 0; l < p->n_layers; l++) {
		size_t loff = (size_t)l * p->seq_len * kv_dim;
		float *k = o->kc + loff + (size_t)pos * kv_dim;
		float *v = o->vc + loff + (size_t)pos * kv_dim;

		o_rmsnorm(o->xb, o->x, w->rms_att + (size_t)l * dim, dim);
		o_matmul(o->q, o->xb, w->wq + (size_t)l * dim * dim, dim, dim);
		o_matmul(k, o->xb, w->wk + (size_t)l * dim * kv_dim, dim,
			 kv_dim);
		o_matmul(v, o->xb, w->wv + (size_t)l * dim * kv_dim, dim,
			 kv_dim);
		for (int i = 0; i < dim; i += 2) {
			int hd = i % hs;
			float freq = 1.0f / powf(10000.0f, (float)hd / (float)hs);
			float val = (float)pos * freq, fcr = cosf(val),
			      fci = sinf(val);
			int rotn = i < kv_dim ? 2 : 1;

			for (int vv = 0; vv < rotn; vv++) {
				float *vec = vv == 0 ? o->q : k;
				float v0 = vec[i], v1 = vec[i + 1];

				vec[i] = v0 * fcr - v1 * fci;
				vec[i + 1] = v0 * fci + v1 * fcr;
			}
		}
		for (int h = 0; h < p->n_heads; h++) {
			float *q = o->q + h * hs, *att = o->att, *xb = o->xb + h * hs;

			for (int t = 0; t <= pos; t++) {
				float *kt = o->kc + loff + (size_t)t * kv_dim +
					    (h / kv_mul) * hs;
				float score = 0.0f;

				for (int i = 0; i < hs; i++)
					score += q[i] * kt[i];
				att[t] = score / sqrtf((float)hs);
			}
			o_softmax(att, pos + 1);
			memset(xb, 0, (size_t)hs * sizeof(float));
			for (int t = 0; t <= pos; t++) {
				float *vt = o->vc + loff + (size_t)t * kv_dim +
					    (h / kv_mul) * hs;

				for (int i = 0; i < hs; i++)
					xb[i] += att[t] * vt[i];
			}
		}
		o_matmul(o->xb2, o->xb, w->wo + (size_t)l * dim * dim, dim, dim);
		for (int i = 0; i < dim; i++)
			o->x[i] += o->xb2[i];
		o_rmsnorm(o->xb, o->x, w->rms_ffn + (size_t)l * dim, dim);
		o_matmul(o->hb, o->xb, w->w1 + (size_t)l * dim * hid, dim, hid);
		o_matmul(o->hb2, o->xb, w->w3 + (size_t)l * dim * hid, dim, hid);
		for (int i = 0; i < hid; i++) {
			float val = o->hb[i];

			val *= 1.0f / (1.0f + expf(-val));
			o->hb[i] = val * o->hb2[i];
		}
		o_matmul(o->xb, o->hb, w->w2 + (size_t)l * dim * hid, hid, dim);
		for (int i = 0; i < dim; i++)
			o->x[i] += o->xb[i];
	}
	o_rmsnorm(o->x, o->x, w->rms_final, dim);
	o_matmul(o->logits, o->x, w->wcls, dim, p->vocab_size);
	return o->logits;
}

static int o_argmax(const float *v, int n)
{
	int best = 0;

	for (int i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return best;
}

/* Greedy ids the run.c way: BOS, prompt, then samples; steps positions. */
static int oracle_ids(const struct sbm_model *m, const int *prompt, int np,
		      int steps, int *out)
{
	struct oracle o = {.m = m};
	size_t cache = (size_t)m->c.n_layers * m->c.seq_len * m->kv_dim;
	int n = 0, token = 1;

	o.kc = calloc(cache, sizeof(float));
	o.vc = calloc(cache, sizeof(float));
	o.x = calloc((size_t)m->c.dim, sizeof(float));
	o.xb = calloc((size_t)m->c.dim, sizeof(float));
	o.xb2 = calloc((size_t)m->c.dim, sizeof(float));
	o.hb = calloc((size_t)m->c.hidden_dim, sizeof(float));
	o.hb2 = calloc((size_t)m->c.hidden_dim, sizeof(float));
	o.q = calloc((size_t)m->c.dim, sizeof(float));
	o.att = calloc((size_t)m->c.seq_len, sizeof(float));
	o.logits = calloc((size_t)m->c.vocab_size, sizeof(float));
	for (int pos = 0; pos < steps; pos++) {
		float *logits = o_forward(&o, token, pos);
		int next = pos < np ? prompt[pos]
				    : o_argmax(logits, m->c.vocab_size);

		if (pos >= np) {
			if (next == 1)
				break;
			out[n++] = next;
		}
		token = next;
	}
	free(o.kc), free(o.vc), free(o.x), free(o.xb), free(o.xb2);
	free(o.hb), free(o.hb2), free(o.q), free(o.att), free(o.logits);
	return n;
}

/* ---- through the library --------------------------------------------- */

static int session_ids(struct sbm_session *s, const int *prompt, int np,
		       int steps, int *out)
{
	struct sbm_sampler sp;
	int n = 0, token = 1;

	CHECK_EQ(sbm_sampler_init(&sp, s->m->c.vocab_size, 0.0f, 0.9f, 1), 0);
	for (int pos = s->pos; pos < steps; pos++) {
		int next;

		CHECK_EQ(sbm_forward(&s, &token, 1), 0);
		next = pos < np ? prompt[pos] : sbm_sample(&sp, s->logits);
		if (pos >= np) {
			if (next == 1)
				break;
			out[n++] = next;
		}
		token = next;
	}
	sbm_sampler_free(&sp);
	return n;
}

static void run_sbrun(const char *sbrun, const char *args, char *out,
		      size_t len)
{
	char cmd[1024];
	FILE *p;
	size_t got;

	snprintf(cmd, sizeof(cmd), "%s %s %s", sbrun, MODEL, args);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	got = fread(out, 1, len - 1, p);
	out[got] = 0;
	CHECK_EQ(pclose(p), 0);
	CHECK(got > 10);
}

/* Pages placed in a session's KV cache. */
static size_t kv_pages(const struct sbm_session *s)
{
	struct sb_kv_stats st;

	CHECK_EQ(sb_kv_stats(s->kv, &st), 0);
	return st.pages_placed;
}

/* The pool's pages in use and, in *placed, the session's, read when
 * neither changed over 5 ms. The pool counts a page as used when the
 * background thread takes it, the session only once it is placed, so a
 * single pair of reads can catch a page between the two (seen under
 * lockcheck: the pool 3 pages ahead, the session 4). */
static size_t pool_and_base(struct sb_pool *pool, const struct sbm_session *s,
			    size_t *placed)
{
	size_t used = stats(pool).pages_used;

	*placed = kv_pages(s);
	for (;;) {
		size_t used2, placed2;

		usleep(5000);
		used2 = stats(pool).pages_used;
		placed2 = kv_pages(s);
		if (used2 == used && placed2 == *placed)
			return used;
		used = used2;
		*placed = placed2;
	}
}

static int main_test(void)
{
	static int ref[512], got[512], a[512], b[512];
	static char o1[16384], o2[16384];
	int prompt[] = {378, 455, 473, 456, 435}, np = 5, n, n2, err;
	char self[4096], sbrun[4200];
	ssize_t sl;
	struct sbm_model m;
	struct sb_pool *pool;

	require_cow();
	if (access(MODEL, R_OK) != 0)
		SKIP("%s not found (run from the repository root)", MODEL);
	CHECK_EQ(sbm_load(&m, MODEL), 0);
	CHECK_EQ(m.c.dim, 64);
	pool = make_pool(4 * KiB, 4 * MiB, 0);

	/* 1. The oracle and the library agree, sparse and dense. */
	n = oracle_ids(&m, NULL, 0, 256, ref);
	printf("oracle: %d greedy ids from BOS\n", n);
	CHECK(n > 100);
	for (int kind = 0; kind < 2; kind++) {
		struct sbm_session *s =
			sbm_session_new(&m, kind ? SBM_KV_SPARSE : SBM_KV_DENSE,
					SBK_F32, pool, 0, &err);

		CHECK(s != NULL);
		n2 = session_ids(s, NULL, 0, 256, got);
		CHECK_EQ(n2, n);
		CHECK(memcmp(got, ref, (size_t)n * sizeof(int)) == 0);
		sbm_session_free(s);
	}
	n = oracle_ids(&m, prompt, np, 256, ref);
	{
		struct sbm_session *s = sbm_session_new(&m, SBM_KV_SPARSE,
							SBK_F32, pool, 0, &err);

		n2 = session_ids(s, prompt, np, 256, got);
		CHECK_EQ(n2, n);
		CHECK(memcmp(got, ref, (size_t)n * sizeof(int)) == 0);
		/* 5. Rewind to the prompt and decode again: same ids. */
		CHECK(sb_kv_truncate(s->kv, (size_t)np + 1) >= 0);
		s->pos = np + 1;
		{
			int token = prompt[np - 1], k = 0;
			struct sbm_sampler sp;

			/* Position np's logits again, then continue. */
			CHECK(sb_kv_truncate(s->kv, (size_t)np) >= 0);
			s->pos = np;
			sbm_sampler_init(&sp, m.c.vocab_size, 0, 0.9f, 1);
			for (int pos = np; pos < 256; pos++) {
				int next;

				CHECK_EQ(sbm_forward(&s, &token, 1), 0);
				next = sbm_sample(&sp, s->logits);
				if (next == 1)
					break;
				CHECK_EQ(next, ref[k]);
				k++;
				token = next;
			}
			CHECK_EQ(k, n);
			sbm_sampler_free(&sp);
		}
		sbm_session_free(s);
		CHECK_EQ(stats(pool).pages_used, 0);
	}

	/* 2. sbrun, sparse vs dense, as a user runs it. */
	sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(sl > 0);
	self[sl] = 0;
	snprintf(sbrun, sizeof(sbrun), "%s/../bin/sbrun", dirname(self));
	run_sbrun(sbrun, "-n 256 -t 0 --ids --kv sparse", o1, sizeof(o1));
	run_sbrun(sbrun, "-n 256 -t 0 --ids --kv dense", o2, sizeof(o2));
	CHECK(strcmp(o1, o2) == 0);
	run_sbrun(sbrun, "-n 256 -t 0 --ids --kv sparse --prompt-ids "
			 "378,455,473,456,435", o1, sizeof(o1));
	run_sbrun(sbrun, "-n 256 -t 0 --ids --kv dense --prompt-ids "
			 "378,455,473,456,435", o2, sizeof(o2));
	CHECK(strcmp(o1, o2) == 0);
	{
		/* ... and they are the oracle's ids. */
		char *p = o1;

		for (int i = 0; i < n; i++) {
			long v = strtol(p, &p, 10);

			CHECK_EQ(v, ref[i]);
		}
	}
	/* -z: text through a llama2.c tokenizer file (a synthetic one:
	 * token i is "<i>", and 300 is the raw byte 'A'). */
	{
		char tok[] = "/tmp/sbrun-test-tokXXXXXX", args[256];
		int fd = mkstemp(tok), maxlen = 16;
		FILE *f = fdopen(fd, "wb");

		CHECK(f != NULL);
		fwrite(&maxlen, sizeof(int), 1, f);
		for (int i = 0; i < m.c.vocab_size; i++) {
			char piece[32];
			float score = 0;
			int len = i == 300 ? snprintf(piece, sizeof(piece),
						      "<0x41>")
					   : snprintf(piece, sizeof(piece),
						      "<%d>", i);

			fwrite(&score, sizeof(float), 1, f);
			fwrite(&len, sizeof(int), 1, f);
			fwrite(piece, 1, (size_t)len, f);
		}
		fclose(f);
		snprintf(args, sizeof(args), "-n 20 -t 0 -z %s", tok);
		run_sbrun(sbrun, args, o2, sizeof(o2));
		unlink(tok);
		printf("with -z: %s", o2);
		/* The text is the greedy ids, each decoded. */
		run_sbrun(sbrun, "-n 20 -t 0 --ids", o1, sizeof(o1));
		{
			char want[4096] = "", *p = o1;
			size_t w = 0;

			for (int i = 0; i < 19; i++) {
				long id = strtol(p, &p, 10);

				w += (size_t)snprintf(want + w, sizeof(want) - w,
						      id == 300 ? "A" : "<%ld>",
						      id);
			}
			CHECK(strncmp(o2, want, w) == 0);
		}
	}
	run_sbrun(sbrun, "-n 64 -t 0.9 -s 42 --ids --kv sparse", o1,
		  sizeof(o1));
	run_sbrun(sbrun, "-n 64 -t 0.9 -s 42 --ids --kv dense", o2,
		  sizeof(o2));
	CHECK(strcmp(o1, o2) == 0);

	/* 3. Forks from a shared prompt: same tokens as independent runs,
	 * the prompt's full pages held once. */
	{
		int long_prompt[200];
		struct sbm_session *base, *f1, *f2, *i1;
		size_t used_base, pages_prompt, base_placed;
		int tok1, tok2, lp = 200;

		for (int i = 0; i < lp; i++)
			long_prompt[i] = ref[i % n];
		base = sbm_session_new(&m, SBM_KV_SPARSE, SBK_F32, pool, 0,
				       &err);
		for (int pos = 0, token = 1; pos < lp; pos++) {
			CHECK_EQ(sbm_forward(&base, &token, 1), 0);
			token = long_prompt[pos];
		}
		/* 200 positions of 128-byte rows: 6 full 4 KiB pages per
		 * region plus a partial one, plus the lookahead placed in the
		 * background (settled before counting). */
		CHECK_EQ(sb_kv_settle(base->kv), 0);
		used_base = pool_and_base(pool, base, &base_placed);
		f1 = sbm_session_fork(base, &err);
		f2 = sbm_session_fork(base, &err);
		CHECK(f1 && f2);
		/* The forks share every page: the pool grows only by what
		 * the background thread placed ahead for base meanwhile (its
		 * growth watch may still be on its way, more so on a busy
		 * machine). */
		{
			size_t placed_now, used_now;

			used_now = pool_and_base(pool, base, &placed_now);
			CHECK_EQ(used_now - used_base, placed_now - base_placed);
			used_base = used_now;
		}
		pages_prompt = (size_t)(lp * 128 / 4096) * 10;
		/* Both forks take a step: each copies the shared partial
		 * page of each of the 10 regions, and nothing else. */
		tok1 = long_prompt[lp - 1];
		tok2 = 300;
		CHECK_EQ(sbm_forward(&f1, &tok1, 1), 0);
		CHECK_EQ(sbm_forward(&f2, &tok2, 1), 0);
		CHECK_EQ(sb_kv_settle(f1->kv), 0);
		CHECK_EQ(sb_kv_settle(f2->kv), 0);
		{
			struct sb_stats st = stats(pool);

			printf("prompt of %d positions: %zu pages; 3 sessions "
			       "after a step each: %zu pages (independent "
			       "sessions: %zu); %zu full prompt pages held "
			       "once\n",
			       lp, used_base, st.pages_used, 3 * used_base,
			       pages_prompt);
			/* Exactly one copy per region per fork (the partial
			 * page); beyond that each fork holds at most its own
			 * lookahead (a page per region): nowhere near the
			 * three times used_base of independent sessions. */
			CHECK_EQ(st.cow_copies, 2 * 10);
			CHECK(st.pages_used >= used_base + 2 * 10);
			CHECK(st.pages_used <= used_base + 2 * 10 + 2 * 10);
		}
		/* f1 computes what an independent session computes. */
		i1 = sbm_session_new(&m, SBM_KV_SPARSE, SBK_F32, pool, 0, &err);
		for (int pos = 0, token = 1; pos <= lp; pos++) {
			CHECK_EQ(sbm_forward(&i1, &token, 1), 0);
			token = pos < lp - 1 ? long_prompt[pos] : tok1;
		}
		CHECK(memcmp(i1->logits, f1->logits,
			     (size_t)m.c.vocab_size * sizeof(float)) == 0);
		VERIFY(pool);
		sbm_session_free(i1);
		sbm_session_free(f1);
		sbm_session_free(f2);
		sbm_session_free(base);
		CHECK_EQ(stats(pool).pages_used, 0);
	}

	/* 4. Batched decode of sessions of different lengths equals
	 * decoding them one by one. */
	{
		struct sbm_session *bs[3], *ss[3];
		int lens[3] = {3, 40, 170}, toks[3];

		for (int i = 0; i < 3; i++) {
			bs[i] = sbm_session_new(&m, SBM_KV_SPARSE, SBK_F32, pool,
						0, &err);
			ss[i] = sbm_session_new(&m, SBM_KV_DENSE, SBK_F32, pool,
						0, &err);
			for (int pos = 0, token = 1; pos < lens[i]; pos++) {
				CHECK_EQ(sbm_forward(&bs[i], &token, 1), 0);
				CHECK_EQ(sbm_forward(&ss[i], &token, 1), 0);
				token = ref[pos % n];
			}
		}
		for (int step = 0; step < 20; step++) {
			for (int i = 0; i < 3; i++)
				toks[i] = ref[(step * 7 + i) % n];
			CHECK_EQ(sbm_forward(bs, toks, 3), 0);
			for (int i = 0; i < 3; i++) {
				CHECK_EQ(sbm_forward(&ss[i], &toks[i], 1), 0);
				CHECK(memcmp(bs[i]->logits, ss[i]->logits,
					     (size_t)m.c.vocab_size *
						     sizeof(float)) == 0);
			}
		}
		for (int i = 0; i < 3; i++) {
			sbm_session_free(bs[i]);
			sbm_session_free(ss[i]);
		}
	}
	CHECK_EQ(stats(pool).pages_used, 0);
	(void)a;
	(void)b;
	sb_pool_destroy(pool);
	sbm_unload(&m);
	printf("model: ok\n");
	return 0;
}
