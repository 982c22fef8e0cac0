/* SPDX-License-Identifier: MIT */
/*
 * A KV cache for your own engine: one sequence of a 4-layer model grown
 * position by position. Before each pass sb_kv_prepare places the pages
 * the pass writes (and asks for the next ones in the background); the
 * engine writes its K and V rows into flat position-major regions and
 * runs attention over them; sb_kv_commit advances the length. Memory
 * follows the positions used, not max_ctx.
 *
 *   cc kv_cache.c $(pkg-config --cflags --libs sparsebuf sbkernels) -o kv_cache
 */
#include <sbkernels.h>
#include <sparsebuf_kv.h>
#include <stdio.h>
#include <string.h>

enum { LAYERS = 4, HEADS = 8, KV_HEADS = 2, HEAD_DIM = 64, STEPS = 1000 };

int main(void)
{
	struct sb_kv_config cfg = {
		.n_layers = LAYERS,
		.n_kv_heads = KV_HEADS,
		.head_dim = HEAD_DIM,
		.dtype = SB_KV_F32,
		.max_ctx = 1 << 20,	/* a million positions: address space only */
	};
	struct sbk_attn attn = {HEADS, KV_HEADS, HEAD_DIM, 0};
	static float q[HEADS * HEAD_DIM], out[HEADS * HEAD_DIM];
	struct sb_kv_stats st;
	struct sb_kv_seq *seq;
	int err;

	seq = sb_kv_create(sb_default_pool(), &cfg, &err);
	if (!seq) {
		fprintf(stderr, "sb_kv_create: %s\n", strerror(-err));
		return 1;
	}
	for (int i = 0; i < HEADS * HEAD_DIM; i++)
		q[i] = 0.01f * (float)(i % 7);
	for (size_t pos = 0; pos < STEPS; pos++) {
		long r = sb_kv_prepare(seq, 1);

		if (r < 0) {
			fprintf(stderr, "sb_kv_prepare: %s\n", strerror((int)-r));
			return 1;
		}
		for (int l = 0; l < LAYERS; l++) {
			float *k = sb_kv_k(seq, l), *v = sb_kv_v(seq, l);
			struct sbk_kv kv = sbk_kv_pos_major(k, v, SBK_F32, KV_HEADS,
							    HEAD_DIM);

			/* This position's K and V: your projections go here. */
			for (int i = 0; i < KV_HEADS * HEAD_DIM; i++) {
				k[pos * KV_HEADS * HEAD_DIM + i] = 0.001f * (float)i;
				v[pos * KV_HEADS * HEAD_DIM + i] = 0.002f * (float)pos;
			}
			if (sbk_attn_decode(out, q, &attn, &kv,
					    sb_kv_start(seq, l), pos + 1) < 0)
				return 1;
		}
		sb_kv_commit(seq, 1);
	}
	sb_kv_stats(seq, &st);
	printf("kv_cache: %zu positions, %zu bytes of rows, %zu bytes placed "
	       "(max_ctx would be %zu bytes)\n",
	       st.len, st.bytes_exact, st.bytes_placed,
	       (size_t)2 * LAYERS * cfg.max_ctx * sb_kv_row_bytes(seq));
	sb_kv_destroy(seq);
	return st.bytes_placed < st.bytes_exact ? 1 : 0;
}
