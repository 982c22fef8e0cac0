/* SPDX-License-Identifier: MIT */
/*
 * sbkernels, everything but attention: conversions, matrix products and
 * the vector kernels. Every variant the CPU has is compared with the
 * scalar reference, and the reference with a double-precision oracle.
 *
 * Tolerances, as normalized mean squared error (ggml test-backend-ops
 * style: sum (x - ref)^2 / sum ref^2):
 *
 *	conversions		bit-exact (NaN: any NaN)
 *	argmax			exact
 *	rope, swiglu		1e-12	(no long sums: a few ulp)
 *	rmsnorm			1e-11	(one sum of squares, under a sqrt)
 *	matvec, matmul		1e-10	(sums of up to 511 products)
 *	softmax			1e-10	(one sum of up to 2560 terms)
 *
 * each against the scalar reference and the reference against double
 * precision. A float sum of n terms is off by about sqrt(n) ulp, which
 * is where the observed worst cases sit (1e-12 .. 1e-13, printed); the
 * bounds leave two orders of magnitude, while an indexing or tail bug
 * shows up as 1e-4 or worse. matmul row t must equal matvec of x[t] bit
 * for bit, and results must not depend on the thread count.
 */
#include "harness.h"

#include <math.h>

#include "sbkernels.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

/* Uniform in [-1, 1). */
static float frand(void)
{
	return (float)((double)rnd32() / 2147483648.0 - 1.0);
}

static void fill(float *x, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		x[i] = frand() * scale;
}

static float *falloc(size_t n)
{
	float *p = calloc(n ? n : 1, sizeof(float));

	if (!p)
		FAIL("out of memory");
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

static double nmse_d(const float *x, const double *ref, size_t n)
{
	double num = 0, den = 0;

	for (size_t i = 0; i < n; i++) {
		double d = x[i] - ref[i];

		num += d * d;
		den += ref[i] * ref[i];
	}
	return den > 0 ? num / den : num;
}

/* Worst error seen per kernel and variant, for the summary. */
enum { K_MATVEC, K_MATMUL, K_RMS, K_ROPE, K_NEOX, K_SWIGLU, K_SOFTMAX, NK };
static const char *const kname[NK] = {"matvec",	   "matmul", "rmsnorm", "rope",
				      "rope_neox", "swiglu", "softmax"};
static const double tol[NK] = {1e-10, 1e-10, 1e-11, 1e-12, 1e-12, 1e-12, 1e-10};
static double worst[SBK_ISA_COUNT][NK];

static enum sbk_isa isa; /* variant under test */

static void check_err(int k, const char *what, double e)
{
	if (!(e <= tol[k]))
		FAIL("%s %s (%s): nmse %.3g > %.3g", sbk_isa_name(isa),
		     kname[k], what, e, tol[k]);
	if (e > worst[isa][k])
		worst[isa][k] = e;
}

static void use(enum sbk_isa i)
{
	CHECK_EQ(sbk_set_isa(i), 0);
}

/* ---- Conversions --------------------------------------------------------- */

static int same_bits_f32(float a, float b)
{
	uint32_t x, y;

	if (isnan(a) || isnan(b))
		return isnan(a) && isnan(b);
	memcpy(&x, &a, 4);
	memcpy(&y, &b, 4);
	return x == y;
}

static int is_nan16(uint16_t h, int bf16)
{
	return bf16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

static uint32_t bits32(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float f32_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* Known roundings: the reference itself must be right. */
static void test_convert_known(void)
{
	static const struct {
		uint32_t f;
		uint16_t h, b;
	} v[] = {
		{0x3f800000, 0x3c00, 0x3f80}, /* 1 */
		{0xbf800000, 0xbc00, 0xbf80}, /* -1 */
		{0x00000000, 0x0000, 0x0000}, /* 0 */
		{0x80000000, 0x8000, 0x8000}, /* -0 */
		{0x477fe000, 0x7bff, 0x4780}, /* 65504: f16 max */
		{0x477ff000, 0x7c00, 0x4780}, /* 65520: ties up to inf */
		{0x477fefff, 0x7bff, 0x4780}, /* just below */
		{0x33800000, 0x0001, 0x3380}, /* 2^-24: f16 min subnormal */
		{0x33000000, 0x0000, 0x3300}, /* 2^-25: tie to even 0 */
		{0x33c00000, 0x0002, 0x33c0}, /* 1.5 * 2^-24: tie to 2 */
		{0x3f801000, 0x3c00, 0x3f80}, /* 1 + 2^-11: tie, even */
		{0x3f803000, 0x3c02, 0x3f80}, /* 1 + 3 * 2^-11: tie, up */
		{0x3f808000, 0x3c04, 0x3f80}, /* bf16 tie, even */
		{0x3f818000, 0x3c0c, 0x3f82}, /* bf16 tie, up */
		{0x7f800000, 0x7c00, 0x7f80}, /* inf */
		{0xff800000, 0xfc00, 0xff80}, /* -inf */
		{0x7f7fffff, 0x7c00, 0x7f80}, /* FLT_MAX: bf16 rounds up */
		{0x00000001, 0x0000, 0x0000}, /* min subnormal f32 */
		{0x00400000, 0x0000, 0x0040}, /* f32 subnormal */
		{0x387fc000, 0x03ff, 0x3880}, /* f16 max subnormal */
		{0x387fe000, 0x0400, 0x3880}, /* tie up into f16 normal */
	};

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		float f = f32_of(v[i].f);
		uint16_t h, b;

		sbk_f32_to_f16(&h, &f, 1);
		sbk_f32_to_bf16(&b, &f, 1);
		if (h != v[i].h || b != v[i].b)
			FAIL("%s: f32 %08x -> f16 %04x (want %04x), bf16 %04x "
			     "(want %04x)",
			     sbk_isa_name(isa), v[i].f, h, v[i].h, b, v[i].b);
	}
}

/* Every 16-bit pattern back to f32, and f32 patterns (random, near the
 * f16 and bf16 rounding boundaries, specials) to 16 bits: bit-exact
 * against the scalar reference, any NaN for a NaN. Odd lengths exercise
 * the tails. */
static void test_convert(void)
{
	enum { N = 1 << 16, M = 1 << 18 };
	uint16_t *h = malloc(N * 2), *a = malloc(M * 2), *b = malloc(M * 2);
	float *f = falloc(M), *g = falloc(M), *r = falloc(N);

	CHECK(h && a && b);
	for (int i = 0; i < N; i++)
		h[i] = (uint16_t)i;
	for (int bf = 0; bf < 2; bf++) {
		use(SBK_ISA_SCALAR);
		(bf ? sbk_bf16_to_f32 : sbk_f16_to_f32)(r, h, N);
		use(isa);
		for (size_t len = 1; len <= 40; len += 3)
			(bf ? sbk_bf16_to_f32 : sbk_f16_to_f32)(g, h + 1000,
								len);
		(bf ? sbk_bf16_to_f32 : sbk_f16_to_f32)(g, h, N);
		for (int i = 0; i < N; i++)
			if (!same_bits_f32(g[i], r[i]))
				FAIL("%s: %s %04x -> %a, reference %a",
				     sbk_isa_name(isa), bf ? "bf16" : "f16", i,
				     g[i], r[i]);
	}
	for (int i = 0; i < M; i++) {
		uint32_t u = rnd32() << 1 ^ rnd32();

		switch (i % 4) {
		case 0: /* anything, NaNs and subnormals included */
			break;
		case 1: /* near f16 rounding points: low 13 bits */
			u = (u & 0xffffe000u) | (i & 8 ? 0x1000u : 0x0fffu);
			break;
		case 2: /* near bf16 rounding points */
			u = (u & 0xffff0000u) | (i & 8 ? 0x8000u : 0x7fffu);
			break;
		case 3: /* f16 range and subnormals */
			u = (u & 0x8fffffffu) | 0x30000000u;
			break;
		}
		f[i] = f32_of(u);
	}
	for (int bf = 0; bf < 2; bf++) {
		void (*cv)(uint16_t *, const float *, size_t) =
			bf ? sbk_f32_to_bf16 : sbk_f32_to_f16;

		use(SBK_ISA_SCALAR);
		cv(a, f, M);
		use(isa);
		memset(b, 0xa5, M * 2);
		cv(b, f, M - 5);
		for (int i = 0; i < M - 5; i++)
			if (a[i] != b[i] &&
			    !(is_nan16(a[i], bf) && is_nan16(b[i], bf)))
				FAIL("%s: f32 %08x -> %s %04x, reference %04x",
				     sbk_isa_name(isa), bits32(f[i]),
				     bf ? "bf16" : "f16", b[i], a[i]);
		for (int i = M - 5; i < M; i++)
			CHECK_EQ(b[i], 0xa5a5); /* no write past the end */
	}
	test_convert_known();
	CHECK_EQ(sbk_store(a, SBK_BF16, f, 3), 0);
	CHECK_EQ(sbk_load(g, a, SBK_BF16, 3), 0);
	CHECK_EQ(sbk_store(a, (enum sbk_dtype)7, f, 3), -EINVAL);
	CHECK_EQ(sbk_dtype_size(SBK_F16), 2);
	CHECK_EQ(sbk_dtype_size(SBK_F32), 4);
	free(h);
	free(a);
	free(b);
	free(f);
	free(g);
	free(r);
}

/* ---- Matrix products ----------------------------------------------------- */

static const int dims[] = {1, 7, 17, 64, 172, 511};
#define NDIMS ((int)(sizeof(dims) / sizeof(dims[0])))

static void oracle_matvec(double *out, const float *w, const float *x, int rows,
			  int cols)
{
	for (int r = 0; r < rows; r++) {
		double v = 0;

		for (int c = 0; c < cols; c++)
			v += (double)w[(size_t)r * cols + c] * x[c];
		out[r] = v;
	}
}

static void test_matmul(void)
{
	enum { NT = 5 };
	float *w = falloc(511 * 511), *x = falloc(NT * 511);
	float *ref = falloc(NT * 511), *out = falloc(NT * 511);
	float *mv = falloc(511);
	double *o = malloc(511 * sizeof(double));

	CHECK(o);
	for (int ri = 0; ri < NDIMS; ri++)
		for (int ci = 0; ci < NDIMS; ci++) {
			int rows = dims[ri], cols = dims[ci];

			fill(w, (size_t)rows * cols, 1);
			fill(x, (size_t)NT * cols, 1);
			use(SBK_ISA_SCALAR);
			sbk_matvec(ref, w, x, rows, cols);
			oracle_matvec(o, w, x, rows, cols);
			if (isa == SBK_ISA_SCALAR)
				check_err(K_MATVEC, "vs double",
					  nmse_d(ref, o, rows));
			use(isa);
			sbk_matvec(out, w, x, rows, cols);
			check_err(K_MATVEC, "vs scalar", nmse(out, ref, rows));
			use(SBK_ISA_SCALAR);
			sbk_matmul(ref, w, x, NT, rows, cols);
			use(isa);
			sbk_matmul(out, w, x, NT, rows, cols);
			check_err(K_MATMUL, "vs scalar",
				  nmse(out, ref, (size_t)NT * rows));
			for (int t = 0; t < NT; t++) {
				sbk_matvec(mv, w, x + (size_t)t * cols, rows,
					   cols);
				if (memcmp(mv, out + (size_t)t * rows,
					   rows * sizeof(float)))
					FAIL("%s: matmul row %d of %dx%d != "
					     "matvec",
					     sbk_isa_name(isa), t, rows, cols);
			}
		}
	free(w);
	free(x);
	free(ref);
	free(out);
	free(mv);
	free(o);
}

/* Large enough to be split over threads: same bits with 1 and 2. */
static void test_matmul_threads(void)
{
	int rows = 1031, cols = 700, n = 9;
	float *w = falloc((size_t)rows * cols), *x = falloc((size_t)n * cols);
	float *a = falloc((size_t)n * rows), *b = falloc((size_t)n * rows);

	fill(w, (size_t)rows * cols, 1);
	fill(x, (size_t)n * cols, 1);
	use(isa);
	CHECK_EQ(sbk_set_threads(1), 0);
	sbk_matvec(a, w, x, rows, cols);
	sbk_matmul(a + rows, w, x, n - 1, rows, cols);
	CHECK_EQ(sbk_set_threads(2), 0);
	sbk_matvec(b, w, x, rows, cols);
	sbk_matmul(b + rows, w, x, n - 1, rows, cols);
	CHECK_EQ(sbk_set_threads(0), 0);
	if (memcmp(a, b, (size_t)n * rows * sizeof(float)))
		FAIL("%s: matvec/matmul differ between 1 and 2 threads",
		     sbk_isa_name(isa));
	if (memcmp(a, a + rows, rows * sizeof(float)))
		FAIL("%s: threaded matmul row 0 != matvec", sbk_isa_name(isa));
	free(w);
	free(x);
	free(a);
	free(b);
}

/* ---- Vector kernels ------------------------------------------------------ */

static const int lens[] = {1, 7, 17, 64, 172, 511, 2560};
#define NLENS ((int)(sizeof(lens) / sizeof(lens[0])))

static void test_rmsnorm(void)
{
	enum { ROWS = 3 };
	float *x = falloc(ROWS * 2560), *w = falloc(2560);
	float *ref = falloc(ROWS * 2560), *out = falloc(ROWS * 2560);
	double *o = malloc(ROWS * 2560 * sizeof(double));

	CHECK(o);
	for (int li = 0; li < NLENS; li++) {
		int n = lens[li];

		fill(x, (size_t)ROWS * n, 3);
		fill(w, n, 1);
		for (int r = 0; r < ROWS; r++) {
			double ss = 0;

			for (int j = 0; j < n; j++)
				ss += (double)x[r * n + j] * x[r * n + j];
			ss = 1 / sqrt(ss / n + 1e-5);
			for (int j = 0; j < n; j++)
				o[r * n + j] = x[r * n + j] * ss * w[j];
		}
		use(SBK_ISA_SCALAR);
		sbk_rmsnorm(ref, x, w, ROWS, n, 1e-5f);
		check_err(K_RMS, "scalar vs double",
			  nmse_d(ref, o, (size_t)ROWS * n));
		use(isa);
		memcpy(out, x, (size_t)ROWS * n * sizeof(float));
		sbk_rmsnorm(out, out, w, ROWS, n, 1e-5f); /* in place */
		check_err(K_RMS, "vs scalar", nmse(out, ref, (size_t)ROWS * n));
	}
	free(x);
	free(w);
	free(ref);
	free(out);
	free(o);
}

static void test_rope(void)
{
	static const int hds[] = {2, 18, 64, 96, 100, 128, 256};
	enum { NH = 3 };
	float x[NH * 256], ref[NH * 256], out[NH * 256];
	double o[NH * 256];

	for (int neox = 0; neox < 2; neox++)
		for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++) {
			int hd = hds[hi], k = neox ? K_NEOX : K_ROPE;
			int pos = (int)(rnd32() % 5000);
			float theta = hi % 2 ? 10000.0f : 1e6f;

			fill(x, NH * hd, 2);
			/* Oracle: the same float angles (llama2.c), double
			 * arithmetic for the rotation. */
			for (int h = 0; h < NH; h++)
				for (int i = 0; i < hd / 2; i++) {
					float freq = 1.0f /
						     powf(theta,
							  (float)(2 * i) / hd);
					float val = pos * freq;
					int a = neox ? i : 2 * i;
					int b = neox ? i + hd / 2 : 2 * i + 1;
					double c = cosf(val), s = sinf(val);
					double v0 = x[h * hd + a];
					double v1 = x[h * hd + b];

					o[h * hd + a] = v0 * c - v1 * s;
					o[h * hd + b] = v0 * s + v1 * c;
				}
			use(SBK_ISA_SCALAR);
			memcpy(ref, x, sizeof(x));
			(neox ? sbk_rope_neox : sbk_rope)(ref, NH, hd, pos,
							  theta);
			check_err(k, "scalar vs double",
				  nmse_d(ref, o, NH * hd));
			use(isa);
			memcpy(out, x, sizeof(x));
			(neox ? sbk_rope_neox : sbk_rope)(out, NH, hd, pos,
							  theta);
			check_err(k, "vs scalar", nmse(out, ref, NH * hd));
		}
}

static void test_swiglu_softmax(void)
{
	float *a = falloc(2560), *b = falloc(2560);
	float *ref = falloc(2560), *out = falloc(2560);
	double *o = malloc(2560 * sizeof(double));

	CHECK(o);
	for (int li = 0; li < NLENS; li++) {
		int n = lens[li];
		double mx = -INFINITY, sum = 0;

		fill(a, n, 12);
		fill(b, n, 2);
		if (n > 3)
			a[n - 1] = -95.0f; /* e^95 overflows: silu -> -0 */
		for (int i = 0; i < n; i++)
			o[i] = a[i] / (1 + exp(-(double)a[i])) * b[i];
		use(SBK_ISA_SCALAR);
		sbk_swiglu(ref, a, b, n);
		check_err(K_SWIGLU, "scalar vs double", nmse_d(ref, o, n));
		use(isa);
		sbk_swiglu(out, a, b, n);
		check_err(K_SWIGLU, "vs scalar", nmse(out, ref, n));
		memcpy(out, a, n * sizeof(float));
		sbk_swiglu(out, out, b, n); /* in place */
		check_err(K_SWIGLU, "in place", nmse(out, ref, n));

		fill(a, n, 30);
		for (int i = 0; i < n; i++)
			mx = a[i] > mx ? a[i] : mx;
		for (int i = 0; i < n; i++)
			sum += exp(a[i] - mx);
		for (int i = 0; i < n; i++)
			o[i] = exp(a[i] - mx) / sum;
		use(SBK_ISA_SCALAR);
		memcpy(ref, a, n * sizeof(float));
		sbk_softmax(ref, n);
		check_err(K_SOFTMAX, "scalar vs double", nmse_d(ref, o, n));
		use(isa);
		memcpy(out, a, n * sizeof(float));
		sbk_softmax(out, n);
		check_err(K_SOFTMAX, "vs scalar", nmse(out, ref, n));
		sum = 0;
		for (int i = 0; i < n; i++)
			sum += out[i];
		CHECK(fabs(sum - 1) < 1e-5);
	}
	free(a);
	free(b);
	free(ref);
	free(out);
	free(o);
}

/* First index of the largest non-NaN element, 0 if there is none. */
static int ref_argmax(const float *x, int n)
{
	int best = -1;

	for (int i = 0; i < n; i++)
		if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
			best = i;
	return best < 0 ? 0 : best;
}

static void test_argmax(void)
{
	float x[600];

	use(isa);
	for (int li = 0; li < NLENS - 1; li++) {
		int n = lens[li], want;

		fill(x, n, 1);
		want = (int)(rnd32() % n);
		x[want] = 2;
		CHECK_EQ(sbk_argmax(x, n), want);
		/* ties: the first */
		if (want + 1 < n) {
			x[n - 1] = 2;
			CHECK_EQ(sbk_argmax(x, n), want);
		}
		/* NaNs are skipped, wherever they are */
		x[0] = NAN;
		if (n > 2)
			x[n / 2] = NAN;
		CHECK_EQ(sbk_argmax(x, n), ref_argmax(x, n));
		for (int i = 0; i < n; i++)
			x[i] = -INFINITY;
		x[0] = NAN;
		CHECK_EQ(sbk_argmax(x, n), n > 1 ? 1 : 0);
		for (int i = 0; i < n; i++)
			x[i] = NAN;
		CHECK_EQ(sbk_argmax(x, n), 0);
	}
	CHECK_EQ(sbk_argmax(x, 0), -1);
}

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	static const char *const lacks[SBK_ISA_COUNT] = {
		[SBK_ISA_AVX2] = "AVX2, FMA or F16C",
		[SBK_ISA_AVX512] = "AVX-512 F/BW/VL/DQ",
		[SBK_ISA_AVX512_BF16] = "AVX512_BF16",
	};
	int tested = 0;

	for (int i = SBK_ISA_SCALAR; i < SBK_ISA_COUNT; i++) {
		isa = (enum sbk_isa)i;
		if (!sbk_isa_supported(isa)) {
			printf("SKIP variant %s: this CPU lacks %s\n",
			       sbk_isa_name(isa), lacks[i]);
			CHECK_EQ(sbk_set_isa(isa), -ENOTSUP);
			continue;
		}
		test_convert();
		test_matmul();
		test_matmul_threads();
		test_rmsnorm();
		test_rope();
		test_swiglu_softmax();
		test_argmax();
		tested++;
		printf("%-10s", sbk_isa_name(isa));
		for (int k = 0; k < NK; k++)
			printf(" %s %.1e", kname[k], worst[isa][k]);
		printf("\n");
	}
	CHECK_EQ(sbk_set_isa(SBK_ISA_AUTO), 0);
	CHECK_EQ(sbk_set_isa((enum sbk_isa)99), -EINVAL);
	printf("tolerance ");
	for (int k = 0; k < NK; k++)
		printf(" %s %.0e", kname[k], tol[k]);
	printf("\nkernels ops ok: %d variants (worst nmse per kernel above)\n",
	       tested);
	return 0;
}
