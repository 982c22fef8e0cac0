/* The KV cache module: growth with memory within a page of the exact bytes
 * per region (plus the lookahead), data intact, sliding windows releasing
 * pages, truncate/rewind and free returning memory exactly, fork sharing
 * the prefix once with a copy-on-write partial page. */
#include "harness.h"
#include "sparsebuf_kv.h"

#define PAGE (64 * KiB)

static int child(const char *name)
{
	(void)name;
	return 2;
}

/* Row pattern: position p, region g, element i. */
static uint16_t val(size_t p, size_t g, size_t i)
{
	return (uint16_t)(p * 131 + g * 7 + i);
}

static void write_rows(struct sb_kv_seq *s, int layers, size_t from,
		       size_t to, size_t elems)
{
	for (int l = 0; l < layers; l++) {
		uint16_t *k = sb_kv_k(s, l), *v = sb_kv_v(s, l);

		for (size_t p = from; p < to; p++)
			for (size_t i = 0; i < elems; i++) {
				k[p * elems + i] = val(p, 2 * (size_t)l, i);
				v[p * elems + i] = val(p, 2 * (size_t)l + 1, i);
			}
	}
}

static int rows_ok(struct sb_kv_seq *s, int l, size_t from, size_t to,
		   size_t elems)
{
	const uint16_t *k = sb_kv_k(s, l), *v = sb_kv_v(s, l);

	for (size_t p = from; p < to; p++)
		for (size_t i = 0; i < elems; i += 7)
			if (k[p * elems + i] != val(p, 2 * (size_t)l, i) ||
			    v[p * elems + i] != val(p, 2 * (size_t)l + 1, i))
				return 0;
	return 1;
}

/* Wait for the lookahead placed in the background, before counting. */
static void settle(struct sb_kv_seq *s)
{
	CHECK_EQ(sb_kv_settle(s), 0);
}

/* Grow token by token like a decode loop. */
static void grow(struct sb_kv_seq *s, int layers, size_t n, size_t elems)
{
	for (size_t t = 0; t < n; t++) {
		size_t len = sb_kv_len(s);

		CHECK(sb_kv_prepare(s, 1) >= 0);
		write_rows(s, layers, len, len + 1, elems);
		CHECK(sb_kv_commit(s, 1) >= 0);
	}
}

static int main_test(void)
{
	enum { L = 4, H = 2, D = 64 };
	size_t elems = H * D, row = elems * 2;	/* f16: 256 B, 256 rows/page */
	struct sb_kv_config cfg = {L, H, D, SB_KV_F16, 1 << 24, NULL, 0, 0};
	struct sb_pool *p;
	struct sb_kv_seq *s, *c;
	struct sb_kv_stats st;
	int err, win[L] = {0, 300, 0, 1000};

	require_cow();
	p = make_pool(PAGE, 4 * MiB, 0);
	CHECK(sb_kv_create(NULL, &cfg, &err) == NULL && err == -EINVAL);
	{
		struct sb_kv_config bad = cfg;

		bad.head_dim = 0;
		CHECK(sb_kv_create(p, &bad, &err) == NULL && err == -EINVAL);
		bad = cfg;
		bad.dtype = (enum sb_kv_dtype)9;
		CHECK(sb_kv_create(p, &bad, &err) == NULL && err == -EINVAL);
	}

	/* Growth: memory follows the tokens. */
	s = sb_kv_create(p, &cfg, &err);
	CHECK(s != NULL);
	CHECK_EQ(sb_kv_row_bytes(s), row);
	/* 16 M positions reserved, two pages per region placed. */
	CHECK_EQ(stats(p).pages_used, 2 * 2 * L);
	grow(s, L, 1000, elems);
	settle(s);
	CHECK_EQ(sb_kv_len(s), 1000);
	for (int l = 0; l < L; l++)
		CHECK(rows_ok(s, l, 0, 1000, elems));
	CHECK_EQ(sb_kv_stats(s, &st), 0);
	CHECK_EQ(st.bytes_exact, 2 * L * 1000 * row);
	printf("1000 positions: %zu bytes exact, %zu placed (%zu pages)\n",
	       st.bytes_exact, st.bytes_placed, st.pages_placed);
	/* Within a page per region of the exact bytes, plus the lookahead
	 * (at most one more page per region). */
	CHECK(st.bytes_placed >= st.bytes_exact);
	CHECK(st.bytes_placed <= st.bytes_exact + 2 * 2 * L * PAGE);
	CHECK_EQ(stats(p).pages_used, st.pages_placed);
	/* At a page boundary, the rounding is gone: only the lookahead. */
	grow(s, L, 1024 - 1000, elems);
	settle(s);
	CHECK_EQ(sb_kv_stats(s, &st), 0);
	CHECK(st.bytes_placed <= st.bytes_exact + 2 * L * PAGE);

	/* Rewind: pages past the new length go back, exactly. */
	CHECK(sb_kv_truncate(s, 300) > 0);
	CHECK_EQ(sb_kv_len(s), 300);
	CHECK_EQ(sb_kv_stats(s, &st), 0);
	CHECK_EQ(st.pages_placed, 2 * L * 2);	/* 300 rows: 2 pages each */
	CHECK(rows_ok(s, 1, 0, 300, elems));
	CHECK_EQ(sb_kv_truncate(s, 400), -ERANGE);
	grow(s, L, 200, elems);	/* and continue from there */
	CHECK(rows_ok(s, 2, 0, 500, elems));

	/* Fork at 500: every page covering [0, 500) shared, once. */
	{
		size_t used = stats(p).pages_used;

		settle(s);
		used = stats(p).pages_used;
		c = sb_kv_fork(s, 500, &err);
		CHECK(c != NULL);
		CHECK_EQ(sb_kv_len(c), 500);
		CHECK_EQ(stats(p).pages_used, used);
		CHECK(rows_ok(c, 3, 0, 500, elems));
		/* Both continue: the shared partial page (rows 256..511)
		 * is copied by whichever writes first. */
		grow(c, L, 10, elems);
		{
			uint16_t *k = sb_kv_k(c, 0);

			k[505 * elems] = 0xbeef;
		}
		CHECK(rows_ok(s, 0, 0, 500, elems));
		CHECK(((uint16_t *)sb_kv_k(s, 0))[505 * elems] != 0xbeef);
		grow(s, L, 10, elems);
		CHECK(((uint16_t *)sb_kv_k(c, 0))[505 * elems] == 0xbeef);
		CHECK(stats(p).cow_copies >= 2 * L);
		VERIFY(p);
		sb_kv_destroy(c);
	}
	sb_kv_destroy(s);
	CHECK_EQ(stats(p).pages_used, 0);

	/* Sliding windows: pages wholly before len - window go back. */
	cfg.window = win;
	s = sb_kv_create(p, &cfg, &err);
	CHECK(s != NULL);
	grow(s, L, 3000, elems);
	settle(s);
	CHECK_EQ(sb_kv_start(s, 0), 0);
	CHECK_EQ(sb_kv_start(s, 1), 2700);
	CHECK_EQ(sb_kv_start(s, 3), 2000);
	CHECK(rows_ok(s, 1, 2700, 3000, elems));
	CHECK(rows_ok(s, 3, 2000, 3000, elems));
	/* Layer 1 holds rows [2700, 3000): pages 10..11 (256 rows each),
	 * plus lookahead; nothing before page 10. */
	CHECK_EQ(sb_buf_placed(sb_kv_buf(s, 1, 0), 0, 2560 * row), 0);
	CHECK_EQ(sb_kv_stats(s, &st), 0);
	CHECK_EQ(st.bytes_exact, 2 * (3000 + 300 + 3000 + 1000) * row);
	CHECK(st.bytes_placed <= st.bytes_exact + 2 * 2 * L * PAGE);
	CHECK_EQ(stats(p).pages_used, st.pages_placed);
	VERIFY(p);
	sb_kv_destroy(s);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
	printf("kv cache: ok\n");
	return 0;
}
