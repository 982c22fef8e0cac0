/* SPDX-License-Identifier: MIT */
/*
 * sbk_ffn_sparse, the sparse ReLU FFN over row-column bundles: every
 * variant the CPU has against the scalar reference (f32, f16, bf16; odd
 * dims, odd neuron counts, lists in any order, with and without bias),
 * the reference against a double-precision oracle, results independent of
 * the thread count (bit for bit), no read past a bundle's end (PROT_NONE
 * guard page), and the argument checks.
 *
 * Tolerances, normalized mean squared error sum (x - ref)^2 / sum ref^2:
 *
 *	scalar reference vs double oracle	1e-10
 *	each variant vs scalar reference	1e-10
 *
 * Sums differ only in order (SIMD lanes, FMA), about 1e-14 typically; a
 * neuron whose pre-activation is within rounding of 0 may be active in
 * one variant and not the other, which costs at most its tiny activation.
 * A wrong index, a skipped neuron or a missing bias gives 1e-3 or more.
 */
#include "harness.h"

#include <math.h>
#include <sys/mman.h>

#include "sbkernels.h"

#define TOL 1e-10

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(uint32_t)(rng >> 16) / 2147483648.0 - 1.0);
}

static double nmse(const float *x, const double *ref, int n)
{
	double num = 0, den = 0;

	for (int i = 0; i < n; i++) {
		num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return den > 0 ? num / den : num;
}

static double nmsef(const float *x, const float *ref, int n)
{
	double num = 0, den = 0;

	for (int i = 0; i < n; i++) {
		num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
		den += (double)ref[i] * ref[i];
	}
	return den > 0 ? num / den : num;
}

struct ffn {
	int dim, neurons;
	size_t stride;
	enum sbk_dtype t;
	char *b;
	float *bias;
};

static double elem(const struct ffn *f, int i, int k)
{
	float v;

	sbk_load(&v, f->b + (size_t)i * f->stride + (size_t)k *
			       sbk_dtype_size(f->t), f->t, 1);
	return v;
}

static void make(struct ffn *f, int dim, int neurons, enum sbk_dtype t,
		 size_t pad)
{
	size_t esz = sbk_dtype_size(t);
	float *tmp = malloc((size_t)2 * dim * sizeof(float));

	f->dim = dim, f->neurons = neurons, f->t = t;
	f->stride = 2 * (size_t)dim * esz + pad;
	f->b = calloc((size_t)neurons, f->stride);
	f->bias = malloc((size_t)neurons * sizeof(float));
	CHECK(tmp && f->b && f->bias);
	for (int i = 0; i < neurons; i++) {
		for (int k = 0; k < 2 * dim; k++)
			tmp[k] = frand();
		CHECK(sbk_store(f->b + (size_t)i * f->stride, t, tmp,
				(size_t)2 * dim) == 0);
		/* About half the neurons fire. */
		f->bias[i] = 0.3f * frand() * sqrtf((float)dim);
	}
	free(tmp);
}

static void oracle(double *out, const struct ffn *f, const float *x,
		   const int32_t *idx, int n, int bias)
{
	for (int k = 0; k < f->dim; k++)
		out[k] = 0;
	for (int j = 0; j < n; j++) {
		double s = bias ? f->bias[idx[j]] : 0;

		for (int k = 0; k < f->dim; k++)
			s += elem(f, idx[j], k) * x[k];
		if (s <= 0)
			continue;
		for (int k = 0; k < f->dim; k++)
			out[k] += s * elem(f, idx[j], f->dim + k);
	}
}

static const enum sbk_isa isas[] = {SBK_ISA_SCALAR, SBK_ISA_AVX2,
				    SBK_ISA_AVX512};

static void check_case(int dim, int neurons, int n, enum sbk_dtype t,
		       int use_bias, double *worst)
{
	struct ffn f;
	float *x = malloc((size_t)dim * 4), *ref = malloc((size_t)dim * 4);
	float *out = malloc((size_t)dim * 4), *act = malloc((size_t)n * 4 + 4);
	float *ract = malloc((size_t)n * 4 + 4);
	double *orc = malloc((size_t)dim * sizeof(double));
	int32_t *idx = malloc((size_t)n * 4 + 4);
	double e;

	CHECK(x && ref && out && act && ract && orc && idx);
	/* Odd padding, in whole elements (bundles stay aligned). */
	make(&f, dim, neurons, t, (size_t)(dim % 3) * sbk_dtype_size(t));
	for (int k = 0; k < dim; k++)
		x[k] = frand();
	for (int j = 0; j < n; j++) /* any order, repeats allowed */
		idx[j] = (int32_t)((uint32_t)(rng = rng * 6364136223846793005ull +
							  1442695040888963407ull) %
				   (uint32_t)neurons);
	CHECK(sbk_set_isa(SBK_ISA_SCALAR) == 0);
	CHECK(sbk_ffn_sparse(ref, x, f.b, f.stride, t,
			     use_bias ? f.bias : NULL, idx, n, dim, ract) == 0);
	oracle(orc, &f, x, idx, n, use_bias);
	e = nmse(ref, orc, dim);
	if (e > TOL)
		FAIL("scalar vs oracle: dim %d n %d dtype %d bias %d: nmse %g",
		     dim, n, t, use_bias, e);
	if (e > worst[0])
		worst[0] = e;
	for (size_t v = 1; v < sizeof(isas) / sizeof(isas[0]); v++) {
		if (!sbk_isa_supported(isas[v]))
			continue;
		CHECK(sbk_set_isa(isas[v]) == 0);
		CHECK(sbk_ffn_sparse(out, x, f.b, f.stride, t,
				     use_bias ? f.bias : NULL, idx, n, dim,
				     act) == 0);
		e = nmsef(out, ref, dim);
		if (e > TOL)
			FAIL("%s vs scalar: dim %d n %d dtype %d bias %d: nmse "
			     "%g",
			     sbk_isa_name(isas[v]), dim, n, t, use_bias, e);
		if (e > worst[v])
			worst[v] = e;
		for (int j = 0; j < n; j++)
			if (fabsf(act[j] - ract[j]) >
			    1e-4f * (1.0f + fabsf(ract[j])))
				FAIL("%s: activation %d: %g vs %g",
				     sbk_isa_name(isas[v]), j, act[j], ract[j]);
	}
	/* The activations alone: the same bits as the full kernel's, on
	 * every variant (a caller fetches the down columns they select). */
	for (size_t v = 0; v < sizeof(isas) / sizeof(isas[0]); v++) {
		float *full = v ? act : ract;

		if (!sbk_isa_supported(isas[v]))
			continue;
		CHECK(sbk_set_isa(isas[v]) == 0);
		if (v)
			CHECK(sbk_ffn_sparse(out, x, f.b, f.stride, t,
					     use_bias ? f.bias : NULL, idx, n,
					     dim, act) == 0);
		memset(out, 0xff, (size_t)dim * 4);
		CHECK(sbk_ffn_sparse_act((float *)out, x, f.b, f.stride, t,
					 use_bias ? f.bias : NULL, idx,
					 n < dim ? n : dim, dim) == 0);
		if (memcmp(out, full, (size_t)(n < dim ? n : dim) * 4))
			FAIL("%s: sbk_ffn_sparse_act differs from the "
			     "activations of sbk_ffn_sparse (dim %d n %d)",
			     sbk_isa_name(isas[v]), dim, n);
	}
	sbk_set_isa(SBK_ISA_AUTO);
	free(f.b), free(f.bias), free(x), free(ref), free(out), free(act);
	free(ract), free(orc), free(idx);
}

/* Same list, 1 thread or 2: the same bits (the runner's bit-identity
 * between modes relies on it). */
static void check_threads(void)
{
	struct ffn f;
	int dim = 1000, n = 3000;
	float *x = malloc(dim * 4), *a = malloc(dim * 4), *b = malloc(dim * 4);
	int32_t *idx = malloc(n * 4);

	CHECK(x && a && b && idx);
	make(&f, dim, n, SBK_F16, 0);
	for (int k = 0; k < dim; k++)
		x[k] = frand();
	for (int j = 0; j < n; j++)
		idx[j] = n - 1 - j;
	CHECK(sbk_set_threads(1) == 0);
	CHECK(sbk_ffn_sparse(a, x, f.b, f.stride, SBK_F16, f.bias, idx, n, dim,
			     NULL) == 0);
	CHECK(sbk_set_threads(2) == 0);
	CHECK(sbk_ffn_sparse(b, x, f.b, f.stride, SBK_F16, f.bias, idx, n, dim,
			     NULL) == 0);
	if (memcmp(a, b, dim * 4))
		FAIL("1 thread and 2 threads differ");
	CHECK(sbk_set_threads(0) == 0);
	free(f.b), free(f.bias), free(x), free(a), free(b), free(idx);
}

/* The last bundle ends at a PROT_NONE page: no variant reads past it. */
static void check_guard(void)
{
	long pg = sysconf(_SC_PAGESIZE);

	for (int dim = 1; dim <= 67; dim += 11)
		for (int t = SBK_F32; t <= SBK_BF16; t++) {
			size_t stride = 2 * (size_t)dim * sbk_dtype_size(t);
			size_t len = ((4 * stride + pg - 1) / pg) * pg;
			char *m = mmap(NULL, len + pg, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			char *b;
			float x[67], out[67];
			int32_t idx[2] = {3, 0};

			CHECK(m != MAP_FAILED);
			CHECK(mprotect(m + len, pg, PROT_NONE) == 0);
			b = m + len - 4 * stride;
			for (int k = 0; k < dim; k++)
				x[k] = 1.0f;
			memset(b, 0, 4 * stride);
			if (t == SBK_F32)
				for (size_t k = 0; k < 8 * (size_t)dim; k++)
					((float *)b)[k] = 0.5f;
			else
				for (size_t k = 0; k < 8 * (size_t)dim; k++)
					((uint16_t *)b)[k] =
						t == SBK_F16 ? 0x3800 : 0x3f00;
			for (size_t v = 0; v < 3; v++) {
				if (!sbk_isa_supported(isas[v]))
					continue;
				CHECK(sbk_set_isa(isas[v]) == 0);
				CHECK(sbk_ffn_sparse(out, x, b, stride,
						     (enum sbk_dtype)t, NULL,
						     idx, 2, dim, NULL) == 0);
				/* h = dim / 2 per neuron, down 0.5. */
				for (int k = 0; k < dim; k++)
					CHECK(fabsf(out[k] - dim * 0.5f) <
					      1e-3f * dim);
			}
			sbk_set_isa(SBK_ISA_AUTO);
			munmap(m, len + pg);
		}
}

/* sbk_ffn_sparse_act reads up rows only: a bundle whose down column is
 * PROT_NONE does not fault, and a firing neuron's activation comes out. */
static void check_act_up_only(void)
{
	long pg = sysconf(_SC_PAGESIZE);
	int dim = (int)(pg / 4);
	char *m = mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	float *x = malloc((size_t)dim * 4), act[2];
	int32_t idx[2] = {0, 0};

	CHECK(m != MAP_FAILED && x);
	for (int k = 0; k < dim; k++)
		x[k] = 1.0f, ((float *)m)[k] = k % 2 ? 0.5f : 1.0f;
	CHECK(mprotect(m + pg, pg, PROT_NONE) == 0);
	for (size_t v = 0; v < sizeof(isas) / sizeof(isas[0]); v++) {
		if (!sbk_isa_supported(isas[v]))
			continue;
		CHECK(sbk_set_isa(isas[v]) == 0);
		act[0] = act[1] = -1.0f;
		CHECK(sbk_ffn_sparse_act(act, x, m, 2 * (size_t)pg, SBK_F32,
					 NULL, idx, 2, dim) == 0);
		if (fabsf(act[0] - 0.75f * dim) > 1e-3f * dim || act[1] != act[0])
			FAIL("%s: activation %g, want %g",
			     sbk_isa_name(isas[v]), act[0], 0.75 * dim);
	}
	sbk_set_isa(SBK_ISA_AUTO);
	CHECK(sbk_ffn_sparse_act(NULL, x, m, 2 * (size_t)pg, SBK_F32, NULL,
				 idx, 1, dim) == -EINVAL);
	CHECK(sbk_ffn_sparse_act(act, x, m, 4, SBK_F32, NULL, idx, 1, dim) ==
	      -EINVAL);
	munmap(m, 2 * (size_t)pg);
	free(x);
}

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	static const int dims[] = {1, 7, 16, 33, 100, 257, 1023, 2048};
	double worst[3] = {0};
	float out[8], x[8] = {0};
	int32_t idx[1] = {0};
	char b[64] = {0};

	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
		for (int t = SBK_F32; t <= SBK_BF16; t++) {
			check_case(dims[d], 97, 1, (enum sbk_dtype)t, 1, worst);
			check_case(dims[d], 97, 63, (enum sbk_dtype)t, 0, worst);
			check_case(dims[d], 301, 200, (enum sbk_dtype)t, 1,
				   worst);
		}
	printf("worst nmse: scalar vs oracle %.2g", worst[0]);
	for (size_t v = 1; v < 3; v++)
		if (sbk_isa_supported(isas[v]))
			printf(", %s vs scalar %.2g", sbk_isa_name(isas[v]),
			       worst[v]);
		else
			printf(", %s: not on this CPU", sbk_isa_name(isas[v]));
	printf("\n");
	check_threads();
	check_guard();
	check_act_up_only();

	/* n = 0: zeros; bad arguments: -EINVAL. */
	out[0] = 1;
	CHECK(sbk_ffn_sparse(out, x, NULL, 0, SBK_F32, NULL, NULL, 0, 8,
			     NULL) == 0);
	CHECK(out[0] == 0);
	CHECK(sbk_ffn_sparse(out, x, b, 63, SBK_F32, NULL, idx, 1, 8, NULL) ==
	      -EINVAL);
	CHECK(sbk_ffn_sparse(out, x, b, 66, SBK_F32, NULL, idx, 1, 8, NULL) ==
	      -EINVAL);
	CHECK(sbk_ffn_sparse(out, x, b, 64, (enum sbk_dtype)9, NULL, idx, 1, 8,
			     NULL) == -EINVAL);
	CHECK(sbk_ffn_sparse(out, x, b, 64, SBK_F32, NULL, idx, 1, 0, NULL) ==
	      -EINVAL);
	CHECK(sbk_ffn_sparse(NULL, x, b, 64, SBK_F32, NULL, idx, 1, 8, NULL) ==
	      -EINVAL);
	printf("ok\n");
	return 0;
}
