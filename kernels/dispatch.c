/* SPDX-License-Identifier: MIT */
/*
 * Run-time choice of the instruction set: CPUID (through
 * __builtin_cpu_supports, which also checks that the OS saves the AVX and
 * AVX-512 registers), the SBK_ISA environment variable read once, and
 * sbk_set_isa() for tests and benchmarks.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPS(isa, bf16)                                                         \
	{                                                                      \
		.attn_block = sbki_attn_block_##isa,                           \
		.matvec = sbki_matvec_##isa, .matmul = sbki_matmul_##isa,      \
		.rmsnorm = sbki_rmsnorm_##isa, .rope = sbki_rope_##isa,        \
		.swiglu = sbki_swiglu_##isa, .softmax = sbki_softmax_##isa,    \
		.argmax = sbki_argmax_##isa,                                   \
		.f32_to_f16 = sbki_f32_to_f16_##isa,                           \
		.f16_to_f32 = sbki_f16_to_f32_##isa,                           \
		.f32_to_bf16 = sbki_f32_to_bf16_##bf16,                        \
		.bf16_to_f32 = sbki_bf16_to_f32_##isa,                         \
	}

static const struct sbki_ops ops_table[SBK_ISA_COUNT] = {
	[SBK_ISA_SCALAR] = OPS(scalar, scalar),
	[SBK_ISA_AVX2] = OPS(avx2, avx2),
	[SBK_ISA_AVX512] = OPS(avx512, avx512),
	/* AVX-512 with the one AVX512_BF16 kernel (f32 -> bf16). */
	[SBK_ISA_AVX512_BF16] = OPS(avx512, avx512bf16),
};

static const char *const names[SBK_ISA_COUNT] = {
	[SBK_ISA_AUTO] = "auto",
	[SBK_ISA_SCALAR] = "scalar",
	[SBK_ISA_AVX2] = "avx2",
	[SBK_ISA_AVX512] = "avx512",
	[SBK_ISA_AVX512_BF16] = "avx512bf16",
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool supported[SBK_ISA_COUNT]; /* written once, under once */
static enum sbk_isa default_isa;      /* likewise */
/* The variant in use: relaxed is enough, every table is immutable. */
static _Atomic(const struct sbki_ops *) cur_ops;
static atomic_int cur_isa;

static void detect(void)
{
	__builtin_cpu_init();
	supported[SBK_ISA_AUTO] = true;
	supported[SBK_ISA_SCALAR] = true;
	supported[SBK_ISA_AVX2] = __builtin_cpu_supports("avx2") &&
				  __builtin_cpu_supports("fma") &&
				  __builtin_cpu_supports("f16c");
	supported[SBK_ISA_AVX512] = supported[SBK_ISA_AVX2] &&
				    __builtin_cpu_supports("avx512f") &&
				    __builtin_cpu_supports("avx512bw") &&
				    __builtin_cpu_supports("avx512vl") &&
				    __builtin_cpu_supports("avx512dq");
	supported[SBK_ISA_AVX512_BF16] = supported[SBK_ISA_AVX512] &&
					 __builtin_cpu_supports("avx512bf16");
}

static enum sbk_isa best(enum sbk_isa at_most)
{
	enum sbk_isa i = at_most;

	while (i > SBK_ISA_SCALAR && !supported[i])
		i--;
	return i;
}

static void init(void)
{
	const char *env = getenv("SBK_ISA");
	enum sbk_isa want = SBK_ISA_AVX512_BF16;

	detect();
	if (env && *env && strcmp(env, "auto")) {
		int i;

		for (i = SBK_ISA_SCALAR; i < SBK_ISA_COUNT; i++)
			if (!strcmp(env, names[i]))
				break;
		if (i == SBK_ISA_COUNT)
			fprintf(stderr,
				"sbkernels: SBK_ISA=%s unknown (scalar, avx2, "
				"avx512, avx512bf16, auto): using auto\n",
				env);
		else if (!supported[i])
			fprintf(stderr,
				"sbkernels: SBK_ISA=%s: this CPU lacks it, "
				"using %s\n",
				env, names[best((enum sbk_isa)i)]);
		if (i < SBK_ISA_COUNT)
			want = (enum sbk_isa)i;
	}
	default_isa = best(want);
	atomic_store_explicit(&cur_isa, default_isa, memory_order_relaxed);
	atomic_store_explicit(&cur_ops, &ops_table[default_isa],
			      memory_order_relaxed);
}

const struct sbki_ops *sbki_ops(void)
{
	pthread_once(&once, init);
	return atomic_load_explicit(&cur_ops, memory_order_relaxed);
}

SBK_API int sbk_set_isa(enum sbk_isa isa)
{
	pthread_once(&once, init);
	if ((int)isa < 0 || isa >= SBK_ISA_COUNT)
		return -EINVAL;
	if (!supported[isa])
		return -ENOTSUP;
	if (isa == SBK_ISA_AUTO)
		isa = default_isa;
	atomic_store_explicit(&cur_isa, isa, memory_order_relaxed);
	atomic_store_explicit(&cur_ops, &ops_table[isa], memory_order_relaxed);
	return 0;
}

SBK_API enum sbk_isa sbk_get_isa(void)
{
	pthread_once(&once, init);
	return (enum sbk_isa)atomic_load_explicit(&cur_isa,
						  memory_order_relaxed);
}

SBK_API int sbk_isa_supported(enum sbk_isa isa)
{
	pthread_once(&once, init);
	if ((int)isa < 0 || isa >= SBK_ISA_COUNT)
		return 0;
	return supported[isa];
}

SBK_API const char *sbk_isa_name(enum sbk_isa isa)
{
	if ((int)isa < 0 || isa >= SBK_ISA_COUNT)
		return "?";
	return names[isa];
}
