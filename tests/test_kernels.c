/* SPDX-License-Identifier: MIT */
/*
 * sbkernels attention: decode, batched decode and prefill, every variant
 * the CPU has against the scalar reference, and the reference against a
 * double-precision two-pass softmax. Then the properties the model runner
 * relies on: positions outside [pos_start, pos_end) are never read (a
 * child with PROT_NONE guard pages), batched results equal one-by-one
 * results bit for bit, results do not depend on the thread count, and the
 * SBK_ISA / SBK_THREADS environment is honoured.
 *
 * Tolerances (normalized mean squared error, sum (x - ref)^2 / sum ref^2,
 * as in ggml's test-backend-ops):
 *
 *	scalar reference vs double oracle	1e-10
 *	each variant vs scalar reference	1e-10
 *	prefill vs decode, same variant		1e-10
 *
 * The observed worst cases (printed) are 1e-12 .. 4e-12, on ranges of a
 * few thousand random positions where the output is an average of
 * thousands of random V rows (much cancellation); typical cases are
 * 1e-14 .. 1e-13. A wrong index, mask or rescale gives 1e-6 or more (the
 * test was checked against such mutations, e.g. a dropped rescale gives
 * 8e-6, a 0.1% error in one exp2 coefficient 3e-10).
 */
#include "harness.h"

#include <math.h>
#include <pthread.h>
#include <sys/mman.h>

#include "sbkernels.h"

#define TOL 1e-10

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

static float frand(void)
{
	return (float)((double)rnd32() / 2147483648.0 - 1.0);
}

static void *xalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p)
		FAIL("out of memory (%zu bytes)", n);
	return p;
}

static double nmse(const float *x, const float *ref, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		double d = (double)x[i] - ref[i];

		num += d * d;
		den += (double)ref[i] * ref[i];
	}
	return den > 0 ? num / den : num;
}

static const char *const dtname[] = {"f32", "f16", "bf16"};

static int isa_ok(int i)
{
	return sbk_isa_supported((enum sbk_isa)i);
}

static void use(int i)
{
	CHECK_EQ(sbk_set_isa((enum sbk_isa)i), 0);
}

/* ---- A KV cache for the tests -------------------------------------------- */

struct cache {
	int nkv, hd;
	enum sbk_dtype dt;
	int head_major;
	size_t max_pos;
	void *k, *v;
	float *kf, *vf; /* k and v decoded, for the oracle */
	struct sbk_kv kv;
};

/* Random K and V in [-1, 1); even dims of K ramp up by trend over the
 * cache so that the scores drift and the running maximum changes from
 * block to block and chunk to chunk, exercising the rescaling. */
static void cache_init(struct cache *c, int nkv, int hd, enum sbk_dtype dt,
		       int head_major, size_t max_pos, float trend)
{
	size_t n = (size_t)nkv * hd * max_pos, es = sbk_dtype_size(dt);
	float *tmp;

	c->nkv = nkv;
	c->hd = hd;
	c->dt = dt;
	c->head_major = head_major;
	c->max_pos = max_pos;
	c->k = xalloc(n * es);
	c->v = xalloc(n * es);
	c->kf = xalloc(n * sizeof(float));
	c->vf = xalloc(n * sizeof(float));
	c->kv = head_major ? sbk_kv_head_major(c->k, c->v, dt, max_pos, hd)
			   : sbk_kv_pos_major(c->k, c->v, dt, nkv, hd);
	for (int pass = 0; pass < 2; pass++) {
		tmp = pass ? c->vf : c->kf;
		for (size_t p = 0; p < max_pos; p++)
			for (int h = 0; h < nkv; h++)
				for (int d = 0; d < hd; d++)
					tmp[p * c->kv.pos_stride +
					    h * c->kv.head_stride + d] =
						frand() +
						(pass || d % 2
							 ? 0
							 : trend * p / max_pos);
		CHECK_EQ(sbk_store(pass ? c->v : c->k, dt, tmp, n), 0);
		CHECK_EQ(sbk_load(tmp, pass ? c->v : c->k, dt, n), 0);
	}
}

static void cache_free(struct cache *c)
{
	free(c->k);
	free(c->v);
	free(c->kf);
	free(c->vf);
}

/* Textbook attention in double over the decoded cache: two passes, no
 * online softmax. */
static void oracle(float *out, const float *q, const struct sbk_attn *a,
		   const struct cache *c, size_t ps, size_t pe)
{
	const struct sbk_kv *kv = &c->kv;
	int g = a->n_heads / a->n_kv_heads, hd = a->head_dim;
	double scale = a->scale ? a->scale : 1 / sqrt((double)hd);
	double *s = xalloc((pe - ps + 1) * sizeof(double));
	double *o = xalloc(hd * sizeof(double));

	for (int h = 0; h < a->n_heads; h++) {
		size_t base = (size_t)(h / g) * kv->head_stride;
		double m = -INFINITY, l = 0;

		for (size_t p = ps; p < pe; p++) {
			double dot = 0;

			for (int d = 0; d < hd; d++)
				dot += (double)q[h * hd + d] *
				       c->kf[base + p * kv->pos_stride + d];
			s[p - ps] = dot * scale;
			m = s[p - ps] > m ? s[p - ps] : m;
		}
		memset(o, 0, hd * sizeof(double));
		for (size_t p = ps; p < pe; p++) {
			double w = exp(s[p - ps] - m);

			l += w;
			for (int d = 0; d < hd; d++)
				o[d] += w *
					c->vf[base + p * kv->pos_stride + d];
		}
		for (int d = 0; d < hd; d++)
			out[h * hd + d] = pe > ps ? (float)(o[d] / l) : 0;
	}
	free(s);
	free(o);
}

/* Worst error seen per variant: [0] vs reference, [1] prefill vs decode. */
static double worst[SBK_ISA_COUNT][2];

static void check_err(int isa, int kind, const char *what, double e)
{
	if (!(e <= TOL))
		FAIL("%s: %s: nmse %.3g > %.0e", sbk_isa_name(isa), what, e,
		     TOL);
	if (e > worst[isa][kind])
		worst[isa][kind] = e;
}

/* ---- Decode against the reference ---------------------------------------- */

static void test_decode(void)
{
	static const int hds[] = {1, 17, 64, 96, 100, 128};
	static const int gs[] = {1, 2, 4, 8};
	static const size_t ranges[][2] = {
		{0, 1},	      {0, 33},	    {5, 100}, {37, 2100},
		{1000, 1031}, {2047, 2050}, {31, 64}, {3, 4},
	};
	int ncase = 0;

	for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++)
		for (size_t gi = 0; gi < sizeof(gs) / sizeof(gs[0]); gi++)
			for (int dt = 0; dt < 3; dt++)
				for (int hm = 0; hm < 2; hm++, ncase++) {
					const size_t *r = ranges[ncase % 8];
					int nkv = 1 + ncase % 3, hd = hds[hi];
					struct sbk_attn a = {gs[gi] * nkv, nkv,
							     hd, 0};
					size_t nq = (size_t)a.n_heads * hd;
					float *q = xalloc(nq * 4);
					float *ref = xalloc(nq * 4);
					float *out = xalloc(nq * 4);
					float *orc = xalloc(nq * 4);
					float qs = ncase % 5 ? 1 : 8;
					struct cache c;
					char what[160];

					if (ncase % 7 == 3)
						a.scale = 0.3f;
					cache_init(&c, nkv, hd, dt, hm,
						   r[1] + 3, 2.0f);
					for (size_t i = 0; i < nq; i++)
						q[i] = frand() * qs;
					snprintf(what, sizeof(what),
						 "decode hd %d heads %d/%d %s "
						 "%s [%zu, %zu)",
						 hd, a.n_heads, nkv, dtname[dt],
						 hm ? "head-major"
						    : "pos-major",
						 r[0], r[1]);
					oracle(orc, q, &a, &c, r[0], r[1]);
					use(SBK_ISA_SCALAR);
					CHECK_EQ(sbk_attn_decode(ref, q, &a,
								 &c.kv, r[0],
								 r[1]),
						 0);
					check_err(SBK_ISA_SCALAR, 0, what,
						  nmse(ref, orc, nq));
					for (int i = SBK_ISA_AVX2;
					     i < SBK_ISA_COUNT; i++) {
						if (!isa_ok(i))
							continue;
						use(i);
						CHECK_EQ(sbk_attn_decode(
								 out, q, &a,
								 &c.kv, r[0],
								 r[1]),
							 0);
						check_err(i, 0, what,
							  nmse(out, ref, nq));
					}
					cache_free(&c);
					free(q);
					free(ref);
					free(out);
					free(orc);
				}
	printf("decode: %d cases\n", ncase);
}

/* Long ranges over several chunks, Qwen3-4B-like heads. */
static void test_decode_long(void)
{
	struct sbk_attn a = {32, 8, 128, 0};
	size_t nq = 32 * 128;
	float *q = xalloc(nq * 4), *ref = xalloc(nq * 4), *out = xalloc(nq * 4);
	float *orc = xalloc(nq * 4);

	for (int hm = 0; hm < 2; hm++) {
		struct cache c;

		cache_init(&c, 8, 128, hm ? SBK_F16 : SBK_BF16, hm, 6200, 2.0f);
		for (size_t i = 0; i < nq; i++)
			q[i] = frand() * 4;
		oracle(orc, q, &a, &c, 777, 6200);
		use(SBK_ISA_SCALAR);
		CHECK_EQ(sbk_attn_decode(ref, q, &a, &c.kv, 777, 6200), 0);
		check_err(SBK_ISA_SCALAR, 0, "long decode", nmse(ref, orc, nq));
		for (int i = SBK_ISA_AVX2; i < SBK_ISA_COUNT; i++) {
			if (!isa_ok(i))
				continue;
			use(i);
			CHECK_EQ(sbk_attn_decode(out, q, &a, &c.kv, 777, 6200),
				 0);
			check_err(i, 0, "long decode", nmse(out, ref, nq));
		}
		cache_free(&c);
	}
	free(q);
	free(ref);
	free(out);
	free(orc);
}

/* ---- Batched decode == one by one, for any thread count ------------------ */

enum { NSEQ = 7 };

static void test_batch(void)
{
	static const size_t ranges[NSEQ][2] = {
		{0, 1},	     {0, 17}, {5, 300},	    {0, 2049},
		{100, 2600}, {4, 4},  {2000, 6200},
	};
	struct sbk_attn a = {12, 3, 100, 0};
	size_t nq = 12 * 100;
	struct cache c[NSEQ];
	struct sbk_attn_seq s[NSEQ];
	float *q = xalloc(NSEQ * nq * 4), *one = xalloc(NSEQ * nq * 4);
	float *first = xalloc(NSEQ * nq * 4), *out = xalloc(NSEQ * nq * 4);

	for (int i = 0; i < NSEQ; i++) {
		cache_init(&c[i], 3, 100, i % 3, i % 2, ranges[i][1] + 1, 2.0f);
		s[i] = (struct sbk_attn_seq){out + i * nq, q + i * nq, c[i].kv,
					     ranges[i][0], ranges[i][1]};
	}
	for (size_t i = 0; i < NSEQ * nq; i++)
		q[i] = frand() * 3;
	for (int isa = SBK_ISA_SCALAR; isa < SBK_ISA_COUNT; isa++) {
		if (!isa_ok(isa))
			continue;
		use(isa);
		for (int i = 0; i < NSEQ; i++)
			CHECK_EQ(sbk_attn_decode(one + i * nq, q + i * nq, &a,
						 &c[i].kv, ranges[i][0],
						 ranges[i][1]),
				 0);
		for (int nt = 1; nt <= 3; nt++) {
			CHECK_EQ(sbk_set_threads(nt), 0);
			memset(out, 0xff, NSEQ * nq * 4);
			CHECK_EQ(sbk_attn_decode_batch(s, NSEQ, &a), 0);
			for (int i = 0; i < NSEQ; i++)
				if (memcmp(out + i * nq, one + i * nq, nq * 4))
					FAIL("%s: batched sequence %d (%zu, "
					     "%zu) with %d threads differs "
					     "from its own decode",
					     sbk_isa_name(isa), i, ranges[i][0],
					     ranges[i][1], nt);
			/* single-sequence decode with nt threads */
			CHECK_EQ(sbk_attn_decode(out, q, &a, &c[6].kv, 2000,
						 6200),
				 0);
			if (nt == 1)
				memcpy(first, out, nq * 4);
			else if (memcmp(first, out, nq * 4))
				FAIL("%s: decode with %d threads differs from "
				     "1 thread",
				     sbk_isa_name(isa), nt);
		}
		CHECK_EQ(sbk_set_threads(0), 0);
		/* the empty range gives zeros */
		for (size_t i = 0; i < nq; i++)
			CHECK(one[5 * nq + i] == 0);
	}
	for (int i = 0; i < NSEQ; i++)
		cache_free(&c[i]);
	free(q);
	free(one);
	free(first);
	free(out);
}

/* ---- Prefill == decode position by position ------------------------------ */

static void test_prefill(void)
{
	static const struct {
		int hd, g, nkv, T;
		size_t pos_start, pos0, window;
	} cf[] = {
		{64, 4, 2, 1, 0, 0, 0},		{128, 4, 2, 37, 0, 0, 0},
		{100, 1, 3, 5, 10, 50, 0},	{96, 8, 1, 40, 0, 2100, 0},
		{128, 2, 2, 37, 0, 60, 7},	{17, 4, 2, 9, 3, 3, 100},
		{128, 4, 8, 33, 500, 2040, 64}, {64, 3, 2, 70, 0, 0, 33},
	};
	int ncase = 0;

	for (size_t ci = 0; ci < sizeof(cf) / sizeof(cf[0]); ci++)
		for (int dt = 0; dt < 3; dt++)
			for (int hm = 0; hm < 2; hm++, ncase++) {
				int hd = cf[ci].hd, T = cf[ci].T;
				struct sbk_attn a = {cf[ci].g * cf[ci].nkv,
						     cf[ci].nkv, hd, 0};
				size_t nq = (size_t)a.n_heads * hd;
				size_t p0 = cf[ci].pos0, w = cf[ci].window;
				float *q = xalloc(T * nq * 4);
				float *ref = xalloc(T * nq * 4);
				float *out = xalloc(T * nq * 4);
				float *dec = xalloc(nq * 4);
				struct cache c;
				char what[160];

				cache_init(&c, a.n_kv_heads, hd, dt, hm,
					   p0 + T + 2, 2.0f);
				for (size_t i = 0; i < T * nq; i++)
					q[i] = frand() * 3;
				snprintf(what, sizeof(what),
					 "prefill hd %d heads %d/%d %s %s T "
					 "%d at %zu from %zu window %zu",
					 hd, a.n_heads, a.n_kv_heads,
					 dtname[dt],
					 hm ? "head-major" : "pos-major", T, p0,
					 cf[ci].pos_start, w);
				use(SBK_ISA_SCALAR);
				CHECK_EQ(sbk_attn_prefill(ref, q, &a, &c.kv,
							  cf[ci].pos_start, p0,
							  T, w),
					 0);
				for (int isa = SBK_ISA_SCALAR;
				     isa < SBK_ISA_COUNT; isa++) {
					if (!isa_ok(isa))
						continue;
					use(isa);
					CHECK_EQ(sbk_attn_prefill(
							 out, q, &a, &c.kv,
							 cf[ci].pos_start, p0,
							 T, w),
						 0);
					check_err(isa, 0, what,
						  nmse(out, ref, T * nq));
					for (int t = 0; t < T; t++) {
						size_t p = p0 + t, lo;

						lo = cf[ci].pos_start;
						if (w && p + 1 - lo > w)
							lo = p + 1 - w;
						CHECK_EQ(sbk_attn_decode(
								 dec,
								 q + t * nq, &a,
								 &c.kv, lo,
								 p + 1),
							 0);
						check_err(isa, 1, what,
							  nmse(out + t * nq,
							       dec, nq));
					}
				}
				cache_free(&c);
				free(q);
				free(ref);
				free(out);
				free(dec);
			}
	printf("prefill: %d cases\n", ncase);
}

/* ---- Arguments, threads -------------------------------------------------- */

static void test_errors(void)
{
	struct sbk_attn a = {8, 2, 64, 0}, bad;
	float q[8 * 64] = {0}, out[8 * 64];
	uint16_t k[4 * 2 * 64] = {0};
	struct sbk_kv kv = sbk_kv_pos_major(k, k, SBK_BF16, 2, 64);

	CHECK_EQ(sbk_attn_decode(out, q, &a, &kv, 0, 4), 0);
	for (int i = 0; i < 8 * 64; i++) /* all-zero V: zero output */
		CHECK(out[i] == 0);
	CHECK_EQ(sbk_attn_decode(out, q, &a, &kv, 3, 2), -EINVAL);
	CHECK_EQ(sbk_attn_decode(out, q, NULL, &kv, 0, 4), -EINVAL);
	CHECK_EQ(sbk_attn_decode(out, q, &a, NULL, 0, 4), -EINVAL);
	bad = a;
	bad.n_kv_heads = 3;
	CHECK_EQ(sbk_attn_decode(out, q, &bad, &kv, 0, 4), -EINVAL);
	bad = a;
	bad.head_dim = SBK_MAX_HEAD_DIM + 1;
	CHECK_EQ(sbk_attn_decode(out, q, &bad, &kv, 0, 4), -EINVAL);
	bad = a;
	bad.scale = -1;
	CHECK_EQ(sbk_attn_decode(out, q, &bad, &kv, 0, 4), -EINVAL);
	kv.dtype = (enum sbk_dtype)9;
	CHECK_EQ(sbk_attn_decode(out, q, &a, &kv, 0, 4), -EINVAL);
	kv.dtype = SBK_BF16;
	CHECK_EQ(sbk_attn_prefill(out, q, &a, &kv, 2, 1, 1, 0), -EINVAL);
	CHECK_EQ(sbk_attn_prefill(out, q, &a, &kv, 0, 0, 0, 0), 0);
	CHECK_EQ(sbk_attn_decode_batch(NULL, 0, &a), 0);
	CHECK_EQ(sbk_attn_decode_batch(NULL, 1, &a), -EINVAL);
	CHECK_EQ(sbk_set_threads(-1), -EINVAL);
	CHECK_EQ(sbk_set_threads(100000), -EINVAL);
	CHECK_EQ(sbk_set_isa((enum sbk_isa) - 1), -EINVAL);
	CHECK_EQ(sbk_set_isa(SBK_ISA_COUNT), -EINVAL);
	CHECK(!strcmp(sbk_isa_name(SBK_ISA_SCALAR), "scalar"));
	CHECK(!strcmp(sbk_isa_name((enum sbk_isa)42), "?"));
	for (int i = SBK_ISA_AVX2; i < SBK_ISA_COUNT; i++)
		if (!isa_ok(i))
			CHECK_EQ(sbk_set_isa((enum sbk_isa)i), -ENOTSUP);
}

/* Several application threads share the pool: whoever finds it busy runs
 * alone, and the bits must not change. */
struct racer {
	const struct sbk_attn *a;
	const struct cache *c;
	const float *q, *want;
	int bad;
};

static void *race(void *arg)
{
	struct racer *r = arg;
	size_t nq = (size_t)r->a->n_heads * r->a->head_dim;
	float *out = xalloc(nq * 4);

	for (int i = 0; i < 20; i++) {
		if (sbk_attn_decode(out, r->q, r->a, &r->c->kv, 3, 3000) ||
		    memcmp(out, r->want, nq * 4))
			r->bad++;
		if (i == 10)
			sbk_shutdown(); /* and started again on demand */
	}
	free(out);
	return NULL;
}

static void test_threads(void)
{
	struct sbk_attn a = {32, 8, 128, 0};
	size_t nq = 32 * 128;
	float *q = xalloc(nq * 4), *want = xalloc(nq * 4);
	struct racer r[3];
	pthread_t t[3];
	struct cache c;

	CHECK(sbk_get_threads() >= 1);
	cache_init(&c, 8, 128, SBK_BF16, 0, 3000, 0);
	for (size_t i = 0; i < nq; i++)
		q[i] = frand();
	CHECK_EQ(sbk_set_isa(SBK_ISA_AUTO), 0);
	CHECK_EQ(sbk_set_threads(1), 0);
	CHECK_EQ(sbk_get_threads(), 1);
	CHECK_EQ(sbk_attn_decode(want, q, &a, &c.kv, 3, 3000), 0);
	CHECK_EQ(sbk_set_threads(2), 0);
	for (int i = 0; i < 3; i++) {
		r[i] = (struct racer){&a, &c, q, want, 0};
		CHECK_EQ(pthread_create(&t[i], NULL, race, &r[i]), 0);
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		CHECK_EQ(r[i].bad, 0);
	}
	CHECK_EQ(sbk_set_threads(0), 0);
	cache_free(&c);
	free(q);
	free(want);
}

/* ---- Guard pages: nothing outside [pos_start, pos_end) is read ----------- */

static size_t gcd(size_t a, size_t b)
{
	while (b) {
		size_t t = a % b;

		a = b;
		b = t;
	}
	return a;
}

/* K and V in one mapping, PROT_NONE but for the pages of the positions
 * [ps, pe) of each head; run every variant over that range. */
static void guard_case(enum sbk_dtype dt, int hm, int hd)
{
	const size_t pg = 4096, es = sbk_dtype_size(dt);
	int nkv = 2, T = 5;
	struct sbk_attn a = {4 * nkv, nkv, hd, 0};
	size_t row = (hm ? (size_t)hd : (size_t)nkv * hd) * es;
	size_t unit = pg / gcd(row, pg), ps = 2 * unit, pe = 5 * unit;
	size_t max_pos = hm ? pe + unit : pe, len, nq = (size_t)a.n_heads * hd;
	struct sbk_attn_seq s[2];
	struct sbk_kv kv;
	float *q = xalloc(nq * T * 4), *out = xalloc(nq * T * 4);
	char *m;

	len = ((size_t)nkv * max_pos * hd * es + pg) & ~(pg - 1);
	len += pg; /* a guard page after the last position too */
	m = mmap(NULL, 2 * len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED);
	kv = hm ? sbk_kv_head_major(m, m + len, dt, max_pos, hd)
		: sbk_kv_pos_major(m, m + len, dt, nkv, hd);
	for (int half = 0; half < 2; half++)
		for (int h = 0; h < (hm ? nkv : 1); h++) {
			size_t lo =
				(h * kv.head_stride + ps * kv.pos_stride) * es;
			size_t hi =
				(h * kv.head_stride + pe * kv.pos_stride) * es;
			char *base = m + half * len;

			CHECK(lo % pg == 0 && hi % pg == 0);
			CHECK_EQ(mprotect(base + lo, hi - lo,
					  PROT_READ | PROT_WRITE),
				 0);
			for (size_t i = lo; i < hi; i += es) {
				float f = frand();

				sbk_store(base + i, dt, &f, 1);
			}
		}
	for (size_t i = 0; i < nq * T; i++)
		q[i] = frand();
	expect_signal_at(m, 2 * len);
	for (int i = 0; i < 2; i++)
		s[i] = (struct sbk_attn_seq){out + i * nq, q + i * nq, kv,
					     ps + i, pe - i};
	for (int isa = SBK_ISA_SCALAR; isa < SBK_ISA_COUNT; isa++) {
		if (!isa_ok(isa))
			continue;
		use(isa);
		for (int nt = 1; nt <= 2; nt++) {
			CHECK_EQ(sbk_set_threads(nt), 0);
			CHECK_EQ(sbk_attn_decode(out, q, &a, &kv, ps, pe), 0);
			CHECK_EQ(sbk_attn_decode_batch(s, 2, &a), 0);
			CHECK_EQ(sbk_attn_prefill(out, q, &a, &kv, ps, pe - T,
						  T, 0),
				 0);
			CHECK_EQ(sbk_attn_prefill(out, q, &a, &kv, ps, pe - T,
						  T, 3),
				 0);
		}
	}
	CHECK_EQ(sbk_set_threads(0), 0);
	munmap(m, 2 * len);
	free(q);
	free(out);
}

static int child_guard(void)
{
	static const int hds[] = {128, 100, 17, 1};

	for (int dt = 0; dt < 3; dt++)
		for (int hm = 0; hm < 2; hm++)
			for (size_t i = 0; i < sizeof(hds) / sizeof(hds[0]);
			     i++)
				guard_case(dt, hm, hds[i]);
	return 0;
}

/* SBK_ISA and SBK_THREADS are read once; EXPECT_* say what they give. */
static int child_env(void)
{
	const char *isa = getenv("EXPECT_ISA"), *nt = getenv("EXPECT_THREADS");
	struct sbk_attn a = {4, 2, 8, 0};
	float q[32] = {1}, out[32], k[2 * 16] = {0};
	struct sbk_kv kv = sbk_kv_pos_major(k, k, SBK_F32, 2, 8);

	if (isa && strcmp(sbk_isa_name(sbk_get_isa()), isa)) {
		fprintf(stderr, "SBK_ISA=%s gave %s, expected %s\n",
			getenv("SBK_ISA"), sbk_isa_name(sbk_get_isa()), isa);
		return 1;
	}
	if (nt && sbk_get_threads() != atoi(nt)) {
		fprintf(stderr, "SBK_THREADS=%s gave %d, expected %s\n",
			getenv("SBK_THREADS"), sbk_get_threads(), nt);
		return 1;
	}
	return sbk_attn_decode(out, q, &a, &kv, 0, 2) ? 1 : 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "guard"))
		return child_guard();
	if (!strcmp(name, "env"))
		return child_env();
	return 2;
}

static void test_env(void)
{
	char best[32], ncpu[32], isa_env[64], exp_isa[64], out[4096];
	int best_i = SBK_ISA_SCALAR, status;

	for (int i = SBK_ISA_SCALAR; i < SBK_ISA_COUNT; i++)
		if (isa_ok(i))
			best_i = i;
	snprintf(best, sizeof(best), "EXPECT_ISA=%s", sbk_isa_name(best_i));
	CHECK_EQ(sbk_set_threads(0), 0);
	snprintf(ncpu, sizeof(ncpu), "EXPECT_THREADS=%d", sbk_get_threads());
	for (int i = SBK_ISA_SCALAR; i < SBK_ISA_COUNT; i++) {
		int want = i;
		char *env[] = {isa_env, exp_isa, NULL};

		while (!isa_ok(want))
			want--;
		snprintf(isa_env, sizeof(isa_env), "SBK_ISA=%s",
			 sbk_isa_name(i));
		snprintf(exp_isa, sizeof(exp_isa), "EXPECT_ISA=%s",
			 sbk_isa_name(want));
		status = run_child_env("env", env, 30, out, sizeof(out));
		if (child_exit_code(status))
			FAIL("%s: %s", isa_env, out);
	}
	{
		char *env[] = {"SBK_ISA=pentium", best, "SBK_THREADS=3",
			       "EXPECT_THREADS=3", NULL};

		status = run_child_env("env", env, 30, out, sizeof(out));
		if (child_exit_code(status))
			FAIL("SBK_ISA=pentium: %s", out);
		CHECK(strstr(out, "SBK_ISA=pentium unknown"));
	}
	{
		char *env[] = {"SBK_THREADS=lots", ncpu, best, NULL};

		status = run_child_env("env", env, 30, out, sizeof(out));
		if (child_exit_code(status))
			FAIL("SBK_THREADS=lots: %s", out);
		CHECK(strstr(out, "SBK_THREADS=lots"));
	}
	{
		char *env[] = {"SBK_THREADS=1", "EXPECT_THREADS=1", NULL};

		status = run_child_env("env", env, 30, out, sizeof(out));
		if (child_exit_code(status))
			FAIL("SBK_THREADS=1: %s", out);
	}
}

static int main_test(void)
{
	static const char *const lacks[SBK_ISA_COUNT] = {
		[SBK_ISA_AVX2] = "AVX2, FMA or F16C",
		[SBK_ISA_AVX512] = "AVX-512 F/BW/VL/DQ",
		[SBK_ISA_AVX512_BF16] = "AVX512_BF16",
	};
	int status;

	/* The children get their own SBK_* settings. */
	unsetenv("SBK_ISA");
	unsetenv("SBK_THREADS");
	for (int i = SBK_ISA_AVX2; i < SBK_ISA_COUNT; i++)
		if (!isa_ok(i))
			printf("SKIP variant %s: this CPU lacks %s\n",
			       sbk_isa_name(i), lacks[i]);
	test_errors();
	test_decode();
	/* Numerics over 6200 positions and long prefills, one thread:
	 * checked in the other builds; under TSan they take most of a
	 * minute and race nothing (test_batch and test_threads race the
	 * kernels' threads). */
	if (!UNDER_TSAN)
		test_decode_long();
	test_batch();
	if (!UNDER_TSAN)
		test_prefill();
	else
		printf("TSan build: long decode and prefill numerics left to "
		       "the other builds\n");
	test_threads();
	test_env();
	status = run_child_env("guard", NULL, 120, NULL, 0);
	if (child_exit_code(status) == EXIT_GOT_SIGSEGV)
		FAIL("attention read a PROT_NONE page outside [pos_start, "
		     "pos_end)");
	if (child_exit_code(status))
		FAIL("guard child failed: status %#x", status);
	printf("guard pages: no read outside [pos_start, pos_end)\n");
	for (int i = SBK_ISA_SCALAR; i < SBK_ISA_COUNT; i++)
		if (isa_ok(i))
			printf("%-10s worst nmse %s %.1e, prefill vs decode "
			       "%.1e (tolerance %.0e)\n",
			       sbk_isa_name(i),
			       i == SBK_ISA_SCALAR ? "vs double" : "vs scalar",
			       worst[i][0], worst[i][1], TOL);
	CHECK_EQ(sbk_set_isa(SBK_ISA_AUTO), 0);
	sbk_shutdown();
	printf("kernels attention ok\n");
	return 0;
}
