/* Sliding-window attention on the sparse KV cache: the kernel reads rows
 * [start, len) of one flat region (no ring buffer, no modulo), the result
 * equals windowed attention over a dense copy, and the pages older than
 * the window are gone (pool accounting, and a strict buffer would fault:
 * the kernel never touches them). */
#include "harness.h"
#include "sbkernels.h"
#include "sparsebuf_kv.h"

#include <math.h>

static int child(const char *name)
{
	(void)name;
	return 2;
}

static float frand(unsigned *s)
{
	*s = *s * 1664525u + 1013904223u;
	return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

static int main_test(void)
{
	enum { L = 2, KVH = 2, NH = 4, D = 64, WIN = 700, N = 3000 };
	int win[L] = {WIN, 0};
	struct sb_kv_config cfg = {L, KVH, D, SB_KV_BF16, 1 << 20, win, 0, 0};
	size_t row_elems = KVH * D;
	struct sbk_attn a = {NH, KVH, D, 0};
	struct sb_pool *p;
	struct sb_kv_seq *s;
	uint16_t *dk, *dv;
	float q[NH * D], kf[KVH * D], vf[KVH * D], o1[NH * D], o2[NH * D];
	unsigned seed = 7;
	int err;

	require_uffd();
	p = make_pool(64 * KiB, 4 * MiB, 0);
	s = sb_kv_create(p, &cfg, &err);
	CHECK(s != NULL);
	dk = calloc((size_t)N * row_elems, 2);
	dv = calloc((size_t)N * row_elems, 2);
	CHECK(dk && dv);
	for (int t = 0; t < N; t++) {
		CHECK(sb_kv_prepare(s, 1) >= 0);
		for (int l = 0; l < L; l++) {
			for (size_t i = 0; i < row_elems; i++) {
				kf[i] = frand(&seed);
				vf[i] = frand(&seed);
			}
			sbk_store((uint16_t *)sb_kv_k(s, l) + (size_t)t * row_elems,
				  SBK_BF16, kf, row_elems);
			sbk_store((uint16_t *)sb_kv_v(s, l) + (size_t)t * row_elems,
				  SBK_BF16, vf, row_elems);
			if (l == 0) {
				sbk_store(dk + (size_t)t * row_elems, SBK_BF16, kf,
					  row_elems);
				sbk_store(dv + (size_t)t * row_elems, SBK_BF16, vf,
					  row_elems);
			}
		}
		CHECK(sb_kv_commit(s, 1) >= 0);
		if (t % 97 == 0 || t == N - 1) {
			size_t end = (size_t)t + 1, start = sb_kv_start(s, 0);
			struct sbk_kv sk = sbk_kv_pos_major(sb_kv_k(s, 0),
							    sb_kv_v(s, 0),
							    SBK_BF16, KVH, D);
			struct sbk_kv dkv =
				sbk_kv_pos_major(dk, dv, SBK_BF16, KVH, D);

			CHECK_EQ(start, end > WIN ? end - WIN : 0);
			for (int i = 0; i < NH * D; i++)
				q[i] = frand(&seed);
			CHECK_EQ(sbk_attn_decode(o1, q, &a, &sk, start, end), 0);
			CHECK_EQ(sbk_attn_decode(o2, q, &a, &dkv, start, end), 0);
			CHECK(memcmp(o1, o2, sizeof(o1)) == 0);
		}
	}
	/* The windowed layer holds only the pages of its last WIN rows (256 B
	 * rows, 256 per 64 KiB page: at most 4 pages each for K and V, plus
	 * lookahead); the full layer holds all of them. */
	{
		long w, f;

		CHECK_EQ(sb_kv_settle(s), 0);
		w = sb_buf_placed(sb_kv_buf(s, 0, 0), 0, (size_t)N * 256);
		f = sb_buf_placed(sb_kv_buf(s, 1, 0), 0, (size_t)N * 256);
		printf("window %d of %d positions: K pages %ld (full layer %ld)\n",
		       WIN, N, w, f);
		CHECK(w <= 5);
		CHECK(f >= (N * 256 + 65535) / 65536);
		CHECK(f <= (N * 256 + 65535) / 65536 + 1);	/* lookahead */
		CHECK_EQ(sb_buf_placed(sb_kv_buf(s, 0, 0), 0,
				       (size_t)(N - WIN) / 256 * 65536),
			 0);
	}
	VERIFY(p);
	sb_kv_destroy(s);
	CHECK_EQ(stats(p).pages_used, 0);
	free(dk);
	free(dv);
	sb_pool_destroy(p);
	return 0;
}
