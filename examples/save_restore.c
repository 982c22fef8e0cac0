/* SPDX-License-Identifier: MIT */
/*
 * Saving and restoring a session: sb_kv_save writes the whole sequence
 * and your own state (here the token ids) to one file, atomically;
 * sb_kv_restore brings it back in this or another process, reading pages
 * only as they are touched, each checked.
 *
 *   cc save_restore.c $(pkg-config --cflags --libs sparsebuf) -o save_restore
 *   ./save_restore [FILE]
 */
#include <sparsebuf_kv.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { LAYERS = 2, N = 500 };

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "session.kv";
	struct sb_kv_config cfg = {.n_layers = LAYERS, .n_kv_heads = 2,
				   .head_dim = 64, .dtype = SB_KV_F16,
				   .max_ctx = 8192};
	struct sb_pool *pool = sb_default_pool();
	static int32_t ids[N];
	struct sb_kv_seq *s, *r;
	struct sb_kv_stats st;
	const int32_t *back;
	size_t len, row;
	int err, bad = 0;

	s = sb_kv_create(pool, &cfg, &err);
	if (!s)
		return 1;
	row = sb_kv_row_bytes(s);
	sb_kv_prepare(s, N);
	for (int l = 0; l < LAYERS; l++)
		for (size_t p = 0; p < N; p++) {
			memset((char *)sb_kv_k(s, l) + p * row, (int)(p % 251), row);
			memset((char *)sb_kv_v(s, l) + p * row, l, row);
		}
	sb_kv_commit(s, N);
	for (int i = 0; i < N; i++)
		ids[i] = i * 3;
	err = sb_kv_save(s, path, ids, sizeof(ids));
	sb_kv_destroy(s);
	if (err < 0) {
		fprintf(stderr, "sb_kv_save %s: %s\n", path, strerror(-err));
		return 1;
	}

	r = sb_kv_restore(pool, path, &err);
	if (!r) {
		fprintf(stderr, "sb_kv_restore %s: %s\n", path, strerror(-err));
		return 1;
	}
	back = sb_kv_user(r, &len);
	sb_kv_stats(r, &st);
	printf("save_restore: %zu positions back, %zu bytes of ids, %zu pages "
	       "read so far\n", sb_kv_len(r), len, st.pages_placed);
	for (int l = 0; l < LAYERS; l++)	/* touched: read in */
		for (size_t p = 0; p < N; p++)
			bad += ((unsigned char *)sb_kv_k(r, l))[p * row] != p % 251;
	bad += len != sizeof(ids) || memcmp(back, ids, sizeof(ids));
	sb_kv_stats(r, &st);
	printf("save_restore: after reading every row, %zu pages; %d "
	       "differences\n", st.pages_placed, bad);
	sb_kv_destroy(r);
	remove(path);
	return bad ? 1 : 0;
}
