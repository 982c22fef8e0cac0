/* SPDX-License-Identifier: MIT */
/*
 * Two sessions sharing a prompt: the prompt's KV is computed once, put in
 * a prefix cache, and each session starts from sb_kv_cache_get, whose
 * pages are the cached ones (shared, copy-on-write): the pool holds the
 * prompt once however many sessions use it.
 *
 *   cc shared_prompt.c $(pkg-config --cflags --libs sparsebuf) -o shared_prompt
 */
#include <sparsebuf_kv.h>
#include <stdio.h>
#include <string.h>

enum { LAYERS = 4, PROMPT = 1024 };

/* Stand-in for a forward pass: write rows [from, to) of every region. */
static void compute(struct sb_kv_seq *s, size_t from, size_t to)
{
	size_t row = sb_kv_row_bytes(s);

	sb_kv_prepare(s, to - from);
	for (int l = 0; l < LAYERS; l++) {
		memset((char *)sb_kv_k(s, l) + from * row, 1, (to - from) * row);
		memset((char *)sb_kv_v(s, l) + from * row, 2, (to - from) * row);
	}
	sb_kv_commit(s, to - from);
}

int main(void)
{
	struct sb_kv_config cfg = {.n_layers = LAYERS, .n_kv_heads = 8,
				   .head_dim = 128, .dtype = SB_KV_BF16,
				   .max_ctx = 32768};
	struct sb_pool *pool = sb_default_pool();
	static int32_t tokens[PROMPT];
	struct sb_kv_cache *cache;
	struct sb_kv_seq *first, *a, *b;
	struct sb_stats st;
	size_t hit_a, hit_b;
	int err;

	for (int i = 0; i < PROMPT; i++)
		tokens[i] = 100 + i;	/* the tokenizer's ids */
	cache = sb_kv_cache_create(pool, &cfg, "my-model-v1", 256 << 20, &err);
	first = sb_kv_create(pool, &cfg, &err);
	if (!cache || !first) {
		fprintf(stderr, "setup: %s\n", strerror(-err));
		return 1;
	}
	compute(first, 0, PROMPT);
	sb_kv_cache_put(cache, first, tokens, PROMPT);
	sb_kv_destroy(first);

	/* Two sessions: the prompt found, only their own positions computed. */
	a = sb_kv_cache_get(cache, tokens, PROMPT, &hit_a, &err);
	b = sb_kv_cache_get(cache, tokens, PROMPT, &hit_b, &err);
	if (!a || !b)
		return 1;
	compute(a, hit_a, PROMPT + 100);
	compute(b, hit_b, PROMPT + 300);
	sb_pool_stats(pool, &st);
	printf("shared_prompt: hits of %zu and %zu positions; the pool holds "
	       "%zu KiB for %zu KiB of KV in the two sessions\n",
	       hit_a, hit_b, st.pages_used * st.page_size >> 10,
	       (size_t)(2 * PROMPT + 400) * 2 * LAYERS * sb_kv_row_bytes(a) >>
		       10);
	sb_kv_destroy(a);
	sb_kv_destroy(b);
	sb_kv_cache_destroy(cache);
	return hit_a == 1024 && hit_b == 1024 ? 0 : 1;
}
