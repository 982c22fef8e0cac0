/* SPDX-License-Identifier: MIT */
/*
 * sbkernels: CPU kernels for LLM inference over flat buffers: decode and
 * prefill attention over a KV cache in f32, f16 or bf16, matrix-vector and
 * matrix-matrix products, RMSNorm, RoPE, SwiGLU, softmax, argmax, a sparse
 * ReLU FFN over row-column bundles (LLM in a flash), and the conversions
 * used to write a KV cache.
 *
 * Every kernel has a scalar reference and AVX2 (+FMA+F16C) and AVX-512
 * variants; the best one the CPU supports is chosen at run time by CPUID,
 * or forced with sbk_set_isa() or the SBK_ISA environment variable
 * (scalar, avx2, avx512, avx512bf16; read once, at the first call).
 *
 * Large kernels run on a small persistent pool of threads (created on first
 * use, joined at exit or by sbk_shutdown()); small ones stay on the calling
 * thread. SBK_THREADS (read once) or sbk_set_threads() sets the count.
 * Results do not depend on the thread count: work is split at fixed
 * boundaries and partial results are combined in a fixed order.
 *
 * Conventions: functions returning int return >= 0 on success and -errno on
 * failure; errno is never the channel. Shapes are given llama2.c style,
 * row-major, outermost first: "(n_heads, head_dim)". Counts of elements
 * that can be large (positions, strides) are size_t. Kernels may be called
 * from several threads at once (they then share the pool, and a call that
 * finds it busy runs on its own thread).
 */
#ifndef SBKERNELS_H
#define SBKERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Dispatch and threads ------------------------------------------------ */

enum sbk_isa {
	SBK_ISA_AUTO = 0,    /* sbk_set_isa(): back to the default */
	SBK_ISA_SCALAR,	     /* plain C: the reference */
	SBK_ISA_AVX2,	     /* AVX2 + FMA + F16C */
	SBK_ISA_AVX512,	     /* AVX-512 F/BW/VL/DQ (+FMA, F16C) */
	SBK_ISA_AVX512_BF16, /* AVX512 + AVX512_BF16 conversions */
	SBK_ISA_COUNT
};

/* Use the given variant for every later call, in every thread. AUTO
 * restores the default: SBK_ISA if it was set and usable, else the best the
 * CPU supports. Returns 0, -ENOTSUP if the CPU lacks it, -EINVAL for an
 * unknown value. Meant for tests and benchmarks: do not switch while other
 * threads are inside a kernel if you need to know which variant they ran. */
int sbk_set_isa(enum sbk_isa isa);

/* The variant in use. */
enum sbk_isa sbk_get_isa(void);

/* 1 if this CPU can run the variant, else 0. AUTO and SCALAR: always 1. */
int sbk_isa_supported(enum sbk_isa isa);

/* "scalar", "avx2", "avx512", "avx512bf16" ("auto" for AUTO); "?" for
 * values out of range. */
const char *sbk_isa_name(enum sbk_isa isa);

/* Threads a parallel kernel may use, the caller included. 0 = one per CPU
 * in the calling process's affinity mask (the default unless SBK_THREADS
 * says otherwise). Returns 0 or -EINVAL (n < 0 or n > 256). Takes effect at
 * the next call; a pool of another size is stopped first (this waits for a
 * kernel running on it). */
int sbk_set_threads(int n);

/* The number of threads parallel kernels use now (>= 1). */
int sbk_get_threads(void);

/* Stop and join the worker threads. Kernels called later start them again.
 * Registered with atexit() when the pool is first started. */
void sbk_shutdown(void);

/* ---- Element types and conversions --------------------------------------- */

enum sbk_dtype {
	SBK_F32 = 0,
	SBK_F16,  /* IEEE half */
	SBK_BF16, /* bfloat16: the top half of an f32 */
};

/* Bytes per element; 0 for an unknown type. */
size_t sbk_dtype_size(enum sbk_dtype t);

/* Conversions round to nearest, ties to even, keep infinities, subnormals
 * and the sign of zero, and turn a NaN into a quiet NaN. Out of range
 * values become infinities (f16). dst and src must not overlap. */
void sbk_f32_to_f16(uint16_t *dst,    /* (n) */
		    const float *src, /* (n) */
		    size_t n);
void sbk_f16_to_f32(float *dst,		 /* (n) */
		    const uint16_t *src, /* (n) */
		    size_t n);
void sbk_f32_to_bf16(uint16_t *dst,    /* (n) */
		     const float *src, /* (n) */
		     size_t n);
void sbk_bf16_to_f32(float *dst,	  /* (n) */
		     const uint16_t *src, /* (n) */
		     size_t n);

/* Store n floats as dtype (how K and V are written into a cache), or load n
 * elements of dtype as floats. Returns 0 or -EINVAL (unknown dtype). */
int sbk_store(void *dst,			      /* (n) of dtype */
	      enum sbk_dtype dtype, const float *src, /* (n) */
	      size_t n);
int sbk_load(float *dst,      /* (n) */
	     const void *src, /* (n) of dtype */
	     enum sbk_dtype dtype, size_t n);

/* ---- Attention ----------------------------------------------------------- */

/* The geometry of one attention layer. */
struct sbk_attn {
	int n_heads;	/* query heads */
	int n_kv_heads; /* KV heads; divides n_heads (grouped-query) */
	int head_dim;	/* 1..SBK_MAX_HEAD_DIM */
	float scale;	/* score scale; 0 means 1/sqrt(head_dim) */
};

#define SBK_MAX_HEAD_DIM 1024

/*
 * A view of one layer's K and V caches: element (pos, kv_head, d) of K is
 *
 *	k[pos * pos_stride + kv_head * head_stride + d]	  (elements of dtype)
 *
 * and the same for V. Both layouts are views:
 *
 *	position-major	pos_stride = n_kv_heads * head_dim, head_stride =
 *head_dim head-major	pos_stride = head_dim, head_stride = max_pos * head_dim
 *
 * k and v point at position 0 even when it is not mapped: kernels only read
 * the positions they are given (a sliding window leaves the pages before
 * the window unmapped).
 */
struct sbk_kv {
	const void *k; /* see above */
	const void *v; /* see above */
	enum sbk_dtype dtype;
	size_t pos_stride;  /* elements from one position to the next */
	size_t head_stride; /* elements from one KV head to the next */
};

static inline struct sbk_kv sbk_kv_pos_major(const void *k, const void *v,
					     enum sbk_dtype dtype,
					     int n_kv_heads, int head_dim)
{
	struct sbk_kv kv = {k, v, dtype, (size_t)n_kv_heads * head_dim,
			    (size_t)head_dim};

	return kv;
}

static inline struct sbk_kv sbk_kv_head_major(const void *k, const void *v,
					      enum sbk_dtype dtype,
					      size_t max_pos, int head_dim)
{
	struct sbk_kv kv = {k, v, dtype, (size_t)head_dim,
			    max_pos * (size_t)head_dim};

	return kv;
}

/*
 * Decode attention for one new token: each query head attends to the
 * positions [pos_start, pos_end) of its KV head (query head h uses KV head
 * h / (n_heads / n_kv_heads)), with a numerically stable softmax computed
 * online in one pass over the positions. The causal limit is pos_end: the
 * token's own K and V must already be written at pos_end - 1. Positions
 * outside the range are never read. An empty range gives zeros. out must
 * not overlap q or the caches.
 *
 * Returns 0, or -EINVAL (bad geometry, NULL pointers, pos_start > pos_end,
 * unknown dtype), -ENOMEM (scratch memory).
 */
int sbk_attn_decode(float *out,	    /* (n_heads, head_dim) */
		    const float *q, /* (n_heads, head_dim) */
		    const struct sbk_attn *a, const struct sbk_kv *kv,
		    size_t pos_start, size_t pos_end);

/* One sequence of a batched decode. */
struct sbk_attn_seq {
	float *out;	  /* (n_heads, head_dim) */
	const float *q;	  /* (n_heads, head_dim) */
	struct sbk_kv kv; /* this sequence's cache */
	size_t pos_start; /* first position read */
	size_t pos_end;	  /* one past the last (the new token) */
};

/* sbk_attn_decode for n_seq sequences of any lengths in one call, without
 * padding: the work of all of them is spread over the threads. The result
 * for each sequence is bit-identical to a separate sbk_attn_decode. */
int sbk_attn_decode_batch(const struct sbk_attn_seq *seq, /* (n_seq) */
			  int n_seq, const struct sbk_attn *a);

/*
 * Prefill attention for n_tokens new tokens at positions pos0 ..
 * pos0 + n_tokens - 1, whose K and V are already written. Token t (at
 * position p = pos0 + t) attends causally to
 *
 *	[max(pos_start, p + 1 - window), p + 1)		(window 0: no limit)
 *
 * so the result for each token equals sbk_attn_decode over that range (to
 * rounding). pos_start is the first position that may be read. Returns 0
 * or -EINVAL (also when pos_start > pos0), -ENOMEM.
 */
int sbk_attn_prefill(float *out,     /* (n_tokens, n_heads, head_dim) */
		     const float *q, /* (n_tokens, n_heads, head_dim) */
		     const struct sbk_attn *a, const struct sbk_kv *kv,
		     size_t pos_start, size_t pos0, int n_tokens,
		     size_t window);

/* ---- Matrix products (f32 weights) --------------------------------------- */

/* out = W x: out[r] = sum_c w[r * cols + c] * x[c]. out must not overlap w
 * or x. Rows are split over the threads when W is large. */
void sbk_matvec(float *out,	/* (rows) */
		const float *w, /* (rows, cols) */
		const float *x, /* (cols) */
		int rows, int cols);

/* out[t] = W x[t] for n vectors at once (prefill): W is read once per
 * block of rows instead of once per vector. out[t] equals sbk_matvec of
 * x[t] bit for bit. */
void sbk_matmul(float *out,	/* (n, rows) */
		const float *w, /* (rows, cols) */
		const float *x, /* (n, cols) */
		int n, int rows, int cols);

/* ---- Vector kernels ------------------------------------------------------ */

/* RMSNorm of each of rows vectors (llama2.c: eps 1e-5f):
 * out = x * w / sqrt(mean(x^2) + eps). out may equal x. */
void sbk_rmsnorm(float *out,	 /* (rows, n) */
		 const float *x, /* (rows, n) */
		 const float *w, /* (n) */
		 int rows, int n, float eps);

/* Rotary position embedding in place, llama2.c convention: within each head
 * the pairs (i, i+1), i even, are rotated by pos * theta^(-i/head_dim)
 * (theta 10000 for llama2, 1e6 for Qwen3), angles computed in float as
 * llama2.c does. head_dim must be even and at most SBK_MAX_HEAD_DIM;
 * otherwise x is left alone. */
void sbk_rope(float *x, /* (n_heads, head_dim) */
	      int n_heads, int head_dim, int pos, float theta);

/* The same with the NeoX / Qwen / HF pairing: (i, i + head_dim/2) rotated
 * by pos * theta^(-2i/head_dim), i < head_dim/2. */
void sbk_rope_neox(float *x, /* (n_heads, head_dim) */
		   int n_heads, int head_dim, int pos, float theta);

/* out = silu(a) * b = a / (1 + exp(-a)) * b. out may equal a or b. */
void sbk_swiglu(float *out,	/* (n) */
		const float *a, /* (n) */
		const float *b, /* (n) */
		int n);

/* Softmax in place, stable (the maximum is subtracted first). */
void sbk_softmax(float *x, /* (n) */
		 int n);

/* The first index of the maximum, NaNs skipped (greedy sampling). 0 when
 * every element is NaN, -1 when n <= 0. */
int sbk_argmax(const float *x, /* (n) */
	       int n);

/* ---- Sparse ReLU FFN (LLM in a flash) -------------------------------------- */

/*
 * out = sum over j < n of relu(dot(up(i), x) + bias[i]) * down(i), i =
 * idx[j]: a ReLU FFN computed only for the listed neurons. Neuron i's
 * weights are one row-column bundle at (const char *)bundles + i * stride:
 * its up-projection row (dim elements of dtype) followed by its
 * down-projection column (dim elements of dtype), so one read brings a
 * neuron. Sums are f32. A neuron whose activation is 0 adds nothing and
 * its down column is not read. bias may be NULL (no bias). act, when not
 * NULL, receives the n activations (after the ReLU), in list order.
 *
 * Neurons are taken in list order, in fixed chunks whose partial sums are
 * added in order: the result depends on the list, never on the thread
 * count (so two runs with the same list are bit-identical). The list may
 * hold any neurons in any order; n = 0 gives zeros. bundles must be
 * aligned to the element size. Returns 0, -EINVAL (NULL pointers, dim <=
 * 0, n < 0, stride < 2 * dim elements or not a multiple of the element
 * size, unknown dtype) or -ENOMEM (scratch).
 */
int sbk_ffn_sparse(float *out,		 /* (dim) */
		   const float *x,	 /* (dim) */
		   const void *bundles,	 /* (neurons, stride bytes) */
		   size_t stride, enum sbk_dtype dtype,
		   const float *bias,	 /* (neurons) or NULL */
		   const int32_t *idx,	 /* (n) */
		   int n, int dim, float *act /* (n) or NULL */);

/*
 * The activations alone: act[j] = relu(dot(up(i), x) + bias[i]), i =
 * idx[j], bit for bit what sbk_ffn_sparse stores in its act for the same
 * arguments, reading only the up rows. A caller that fetches weights on
 * demand computes these first and reads the down columns of the neurons
 * that fire (act[j] > 0) before calling sbk_ffn_sparse, which reads no
 * other. Returns 0 or -EINVAL (as sbk_ffn_sparse; act must not be NULL).
 */
int sbk_ffn_sparse_act(float *act,	     /* (n) */
		       const float *x,	     /* (dim) */
		       const void *bundles,  /* (neurons, stride bytes) */
		       size_t stride, enum sbk_dtype dtype,
		       const float *bias,    /* (neurons) or NULL */
		       const int32_t *idx,   /* (n) */
		       int n, int dim);

#ifdef __cplusplus
}
#endif

#endif /* SBKERNELS_H */
