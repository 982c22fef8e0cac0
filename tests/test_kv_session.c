/* KV sessions (issue 14): save and restore byte-exact (placed, evicted,
 * shared and unplaced pages; f32/f16/bf16; sliding windows; the user
 * blob; into another process; into a pool of another page size), lazily;
 * damaged or truncated files refused; sb_kv_evict and resume under a
 * budget with automatic eviction; the prefix cache: hits shorter, equal
 * and longer, divergence inside a block, model ids, copy-on-write, pages
 * shared not copied, LRU under max_bytes with and without a disk tier,
 * windows. */
#include "harness.h"
#include "sparsebuf_kv.h"

#include <fcntl.h>
#include <pthread.h>

#define PAGE (16 * KiB)
#define L 4

static char dir[64];
static int err_unused;

/* Byte j of row p of region g, from the token at p (so that a cache that
 * hands out the wrong prefix is seen). */
static uint8_t pat(int32_t tok, size_t p, size_t g, size_t j)
{
	uint64_t z = ((uint64_t)(uint32_t)tok << 32) ^ (p * 0x9e3779b1u) ^
		     (g << 20) ^ j;

	z ^= z >> 29;
	z *= 0xbf58476d1ce4e5b9ull;
	return (uint8_t)(z >> 40);
}

static int32_t tok_of(const int32_t *toks, size_t p)
{
	return toks ? toks[p] : (int32_t)(p * 7 + 1);
}

static void write_rows(struct sb_kv_seq *s, const int32_t *toks, size_t from,
		       size_t to)
{
	size_t row = sb_kv_row_bytes(s);

	for (int l = 0; l < L; l++)
		for (int v = 0; v < 2; v++) {
			uint8_t *b = v ? sb_kv_v(s, l) : sb_kv_k(s, l);
			size_t g = 2 * (size_t)l + (size_t)v;

			for (size_t p = from; p < to; p++)
				for (size_t j = 0; j < row; j++)
					b[p * row + j] =
						pat(tok_of(toks, p), p, g, j);
		}
}

/* Rows each layer holds, [start, len), as written. */
static int rows_ok(struct sb_kv_seq *s, const int32_t *toks, size_t upto)
{
	size_t row = sb_kv_row_bytes(s);

	for (int l = 0; l < L; l++)
		for (int v = 0; v < 2; v++) {
			const uint8_t *b = v ? sb_kv_v(s, l) : sb_kv_k(s, l);
			size_t g = 2 * (size_t)l + (size_t)v;

			for (size_t p = sb_kv_start(s, l); p < upto; p++)
				for (size_t j = 0; j < row; j += 5)
					if (b[p * row + j] !=
					    pat(tok_of(toks, p), p, g, j)) {
						fprintf(stderr,
							"layer %d %c row %zu "
							"byte %zu differs\n",
							l, v ? 'V' : 'K', p, j);
						return 0;
					}
		}
	return 1;
}

/* Decode-loop growth to `to` positions. */
static void grow(struct sb_kv_seq *s, const int32_t *toks, size_t to)
{
	while (sb_kv_len(s) < to) {
		size_t p = sb_kv_len(s);

		CHECK(sb_kv_prepare(s, 1) >= 0);
		write_rows(s, toks, p, p + 1);
		CHECK(sb_kv_commit(s, 1) >= 0);
	}
}

static struct sb_kv_config config(enum sb_kv_dtype t, const int *win,
				  unsigned flags)
{
	struct sb_kv_config c = {
		.n_layers = L,
		.n_kv_heads = 2,
		.head_dim = 64,
		.dtype = t,
		.max_ctx = 1 << 16,
		.window = win,
		.flags = flags,
	};
	return c;
}

static struct sb_kv_seq *restore(struct sb_pool *p, const char *path)
{
	int err = 0;
	struct sb_kv_seq *s = sb_kv_restore(p, path, &err);

	if (!s)
		FAIL("sb_kv_restore(%s): %s", path, strerror(-err));
	return s;
}

static size_t in_use(struct sb_pool *p)
{
	struct sb_stats st = stats(p);

	return st.pages_used * st.page_size;
}

static const char blob[] = "token ids and a sampler's state";

/* ---- save and restore ------------------------------------------------------ */

static void roundtrip(enum sb_kv_dtype t, unsigned flags)
{
	static const int win[L] = {0, 100, 0, 300};
	struct sb_kv_config cfg = config(t, win, flags);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	struct sb_pool *q = make_pool(64 * KiB, 4 * MiB, 0);
	struct sb_kv_seq *s, *f, *r;
	struct sb_kv_stats st;
	char path[128], path2[128];
	const char *u;
	size_t ulen;
	long ev;
	int err;

	snprintf(path, sizeof(path), "%s/s%d.kv", dir, (int)t);
	snprintf(path2, sizeof(path2), "%s/f%d.kv", dir, (int)t);
	s = sb_kv_create(p, &cfg, &err);
	CHECK(s != NULL);
	grow(s, NULL, 1000);
	/* Shared pages: a fork of the first 500 positions. */
	f = sb_kv_fork(s, 500, &err);
	CHECK(f != NULL);
	/* Evicted pages: the first pages of layer 0's K. */
	ev = sb_buf_evict(sb_kv_buf(s, 0, 0), 0, 4 * PAGE);
	CHECK(ev > 0);
	CHECK_EQ(sb_kv_save(s, path, blob, sizeof(blob)), 0);
	CHECK_EQ(sb_kv_save(f, path2, NULL, 0), 0);
	/* The sequence is unchanged. */
	CHECK_EQ(sb_kv_len(s), 1000);
	CHECK(rows_ok(s, NULL, 1000));

	/* Into a pool of another page size: lazily, byte-exact. */
	r = restore(q, path);
	CHECK_EQ(sb_kv_len(r), 1000);
	CHECK_EQ(sb_kv_row_bytes(r), sb_kv_row_bytes(s));
	for (int l = 0; l < L; l++)
		CHECK_EQ(sb_kv_start(r, l), sb_kv_start(s, l));
	CHECK_EQ(sb_kv_start(r, 1), 900);
	u = sb_kv_user(r, &ulen);
	CHECK(u && ulen == sizeof(blob) && !memcmp(u, blob, ulen));
	CHECK_EQ(sb_kv_stats(r, &st), 0);
	CHECK_EQ(st.pages_placed, 0);	/* nothing read yet */
	CHECK(rows_ok(r, NULL, 1000));
	CHECK_EQ(sb_kv_stats(r, &st), 0);
	CHECK(st.pages_placed > 0);
	/* Continued: it grows and slides as the original would. */
	grow(r, NULL, 1300);
	CHECK(rows_ok(r, NULL, 1300));
	CHECK_EQ(sb_kv_start(r, 1), 1200);
	sb_kv_destroy(r);

	/* The fork's file: shared pages saved as any. */
	r = restore(p, path2);
	CHECK_EQ(sb_kv_len(r), 500);
	CHECK(sb_kv_user(r, &ulen) == NULL && ulen == 0);
	CHECK(rows_ok(r, NULL, 500));
	sb_kv_destroy(r);
	CHECK(sb_kv_user(s, &ulen) == NULL && ulen == 0);

	/* A save over the previous file; the restored sequence keeps
	 * reading the file it was restored from. */
	r = restore(p, path);
	grow(s, NULL, 1100);
	CHECK_EQ(sb_kv_save(s, path, NULL, 0), 0);
	CHECK(rows_ok(r, NULL, 1000));
	sb_kv_destroy(r);
	r = restore(p, path);
	CHECK_EQ(sb_kv_len(r), 1100);
	CHECK(rows_ok(r, NULL, 1100));
	sb_kv_destroy(r);

	/* An empty sequence saves and restores. */
	sb_kv_destroy(f);
	f = sb_kv_create(p, &cfg, &err);
	CHECK_EQ(sb_kv_save(f, path2, "x", 1), 0);
	sb_kv_destroy(f);
	r = restore(p, path2);
	CHECK_EQ(sb_kv_len(r), 0);
	grow(r, NULL, 70);
	CHECK(rows_ok(r, NULL, 70));
	sb_kv_destroy(r);

	sb_kv_destroy(s);
	VERIFY(p);
	VERIFY(q);
	sb_pool_destroy(p);
	sb_pool_destroy(q);
	printf("round trip dtype %d flags %u: ok\n", (int)t, flags);
}

static void bad_files(void)
{
	struct sb_kv_config cfg = config(SB_KV_F16, NULL, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	struct sb_kv_seq *s;
	char path[128], bad[128], cmd[512];
	struct stat sb;
	int err, fd;
	static const long cuts[] = {0, 1, 100, 4095, 4096, 8191, 8192, -4096,
				    -1};

	snprintf(path, sizeof(path), "%s/good.kv", dir);
	snprintf(bad, sizeof(bad), "%s/bad.kv", dir);
	s = sb_kv_create(p, &cfg, &err);
	grow(s, NULL, 300);
	CHECK_EQ(sb_kv_save(s, path, blob, sizeof(blob)), 0);
	CHECK_EQ(stat(path, &sb), 0);

	CHECK(sb_kv_restore(p, "/nonexistent/x.kv", &err) == NULL &&
	      err == -ENOENT);
	CHECK(sb_kv_restore(NULL, path, &err) == NULL && err == -EINVAL);
	CHECK(sb_kv_restore(p, dir, &err) == NULL && err == -EISDIR);
	CHECK(sb_kv_save(NULL, path, NULL, 0) == -EINVAL);
	CHECK(sb_kv_save(s, path, NULL, 5) == -EINVAL);
	CHECK(sb_kv_save(s, "", NULL, 0) == -EINVAL);
	/* A buffer's save file is not a KV save file. */
	CHECK_EQ(sb_buf_save(sb_kv_buf(s, 0, 0), 0, PAGE, bad), 0);
	CHECK(sb_kv_restore(p, bad, &err) == NULL && err == -EBADMSG);

	/* Cut short anywhere. */
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		off_t len = cuts[i] >= 0 ? cuts[i] : sb.st_size + cuts[i];

		snprintf(cmd, sizeof(cmd), "cp %s %s", path, bad);
		CHECK_EQ(system(cmd), 0);
		CHECK_EQ(truncate(bad, len), 0);
		CHECK(sb_kv_restore(p, bad, &err) == NULL);
		CHECK_EQ(err, -EBADMSG);
	}
	/* A byte changed in the header or the table. */
	/* The table: windows, starts, regions, the blob. */
	for (off_t at = 0; at < (off_t)(4096 + L * 12 + 4 * L * 8 + sizeof(blob));
	     at += at < 120 ? 3 : 13) {
		unsigned char c;

		if (at >= 120 && at < 4096)
			continue;	/* past the header (120 bytes): padding */
		snprintf(cmd, sizeof(cmd), "cp %s %s", path, bad);
		CHECK_EQ(system(cmd), 0);
		fd = open(bad, O_RDWR);
		CHECK(pread(fd, &c, 1, at) == 1);
		c ^= 0x41;
		CHECK(pwrite(fd, &c, 1, at) == 1);
		close(fd);
		if (sb_kv_restore(p, bad, &err))
			FAIL("a changed byte at %ld restored", (long)at);
		CHECK_EQ(err, -EBADMSG);
	}
	sb_kv_destroy(s);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("damaged and truncated files: -EBADMSG\n");
}

uint32_t sbi_crc32c(const void *p, size_t len);

/* A file edited by hand, its checksums recomputed (lib/kv_save.c's
 * layout: the header's len at 64, its table CRC at 112 and own CRC at
 * 116; the table at 4096: start[] first, then the regions). */
static int restore_edited(struct sb_pool *p, const char *good,
			  const char *bad, void (*edit)(char *f, size_t n))
{
	static char f[1 << 22];
	uint64_t table_len;
	uint32_t crc;
	size_t n;
	FILE *in = fopen(good, "rb"), *out;
	int err = 0;
	struct sb_kv_seq *s;

	CHECK(in != NULL);
	n = fread(f, 1, sizeof(f), in);
	fclose(in);
	edit(f, n);
	memcpy(&table_len, f + 88, 8);
	crc = sbi_crc32c(f + 4096, table_len);
	memcpy(f + 112, &crc, 4);
	memset(f + 116, 0, 4);
	crc = sbi_crc32c(f, 120);
	memcpy(f + 116, &crc, 4);
	out = fopen(bad, "wb");
	CHECK(out && fwrite(f, 1, n, out) == n);
	fclose(out);
	s = sb_kv_restore(p, bad, &err);
	if (s) {
		sb_kv_destroy(s);
		return 0;
	}
	return err;
}

static void edit_start(char *f, size_t n)
{
	(void)n;
	memset(f + 4096 + 8, 0, 8);	/* start[1]: 200 -> 0 */
}

static void edit_len(char *f, size_t n)
{
	uint64_t len = 1000;	/* the images hold 300 rows */

	(void)n;
	memcpy(f + 64, &len, 8);
	memset(f + 4096 + 8, 0, 8);
	len = 900;
	memcpy(f + 4096 + 8, &len, 8);	/* a start the window allows */
}

static void edit_region(char *f, size_t n)
{
	(void)n;
	memset(f + 4096 + L * 8, 0, 16);	/* region 0: no image */
}

static void edited(void)
{
	static const int win[L] = {0, 100, 0, 0};
	struct sb_kv_config cfg = config(SB_KV_F16, win, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	struct sb_kv_seq *s = sb_kv_create(p, &cfg, &err_unused);
	char good[128], bad[128];

	snprintf(good, sizeof(good), "%s/edit-good.kv", dir);
	snprintf(bad, sizeof(bad), "%s/edit-bad.kv", dir);
	grow(s, NULL, 300);
	CHECK_EQ(sb_kv_save(s, good, NULL, 0), 0);
	sb_kv_destroy(s);
	/* Consistent with the file but not with what it holds: refused,
	 * never rows that read as zeros. */
	CHECK_EQ(restore_edited(p, good, bad, edit_start), -EBADMSG);
	CHECK_EQ(restore_edited(p, good, bad, edit_len), -EBADMSG);
	CHECK_EQ(restore_edited(p, good, bad, edit_region), -EBADMSG);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("edited files (checksums recomputed): -EBADMSG\n");
}

/* A damaged page: the touch that reads it gets SIGBUS, never zeros. */
static int child_damaged(void)
{
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	const char *path = getenv("SBKV_FILE");
	struct sb_kv_seq *r = restore(p, path);
	volatile uint8_t *k = sb_kv_k(r, 0);
	uint8_t sum = 0;

	expect_signal_at((const void *)k, 300 * sb_kv_row_bytes(r));
	for (size_t i = 0; i < 300 * sb_kv_row_bytes(r); i += 64)
		sum += k[i];
	printf("read through a damaged page: %u\n", sum);
	return 3;
}

static void damaged_data(void)
{
	struct sb_kv_config cfg = config(SB_KV_F16, NULL, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	struct sb_kv_seq *s;
	char path[128], var[160];
	char *env[] = {var, NULL};
	struct stat sb;
	unsigned char c;
	int err, fd, st;

	snprintf(path, sizeof(path), "%s/dmg.kv", dir);
	s = sb_kv_create(p, &cfg, &err);
	grow(s, NULL, 300);
	CHECK_EQ(sb_kv_save(s, path, NULL, 0), 0);
	sb_kv_destroy(s);
	sb_pool_destroy(p);
	/* The first region's data: its image starts after the header and
	 * the table block; its own header and tables take 3 blocks. */
	CHECK_EQ(stat(path, &sb), 0);
	fd = open(path, O_RDWR);
	CHECK(pread(fd, &c, 1, 2 * 4096 + 3 * 4096 + 100) == 1);
	c ^= 0xff;
	CHECK(pwrite(fd, &c, 1, 2 * 4096 + 3 * 4096 + 100) == 1);
	close(fd);
	snprintf(var, sizeof(var), "SBKV_FILE=%s", path);
	st = run_child_env("damaged", env, 30, NULL, 0);
	CHECK_EQ(child_exit_code(st), EXIT_GOT_SIGBUS);
	printf("damaged page: SIGBUS on touch\n");
}

/* In another process: restore and check. */
static int child_restore(void)
{
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	struct sb_kv_seq *r = restore(p, getenv("SBKV_FILE"));
	size_t ulen;
	const char *u = sb_kv_user(r, &ulen);

	CHECK(u && ulen == sizeof(blob) && !memcmp(u, blob, ulen));
	CHECK_EQ(sb_kv_len(r), 777);
	CHECK(rows_ok(r, NULL, 777));
	grow(r, NULL, 800);
	CHECK(rows_ok(r, NULL, 800));
	sb_kv_destroy(r);
	sb_pool_destroy(p);
	return 0;
}

static void other_process(void)
{
	struct sb_kv_config cfg = config(SB_KV_BF16, NULL, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	struct sb_kv_seq *s;
	char path[128], var[160];
	char *env[] = {var, NULL};
	int err;

	snprintf(path, sizeof(path), "%s/proc.kv", dir);
	s = sb_kv_create(p, &cfg, &err);
	grow(s, NULL, 777);
	CHECK_EQ(sb_kv_save(s, path, blob, sizeof(blob)), 0);
	sb_kv_destroy(s);
	sb_pool_destroy(p);
	snprintf(var, sizeof(var), "SBKV_FILE=%s", path);
	CHECK_EQ(child_exit_code(run_child_env("restore", env, 30, NULL, 0)),
		 0);
	printf("restored in another process: ok\n");
}

/* ---- park and resume ----------------------------------------------------------- */

static void evict_resume(void)
{
	struct sb_kv_config cfg = config(SB_KV_F16, NULL, SB_KV_EVICTABLE);
	/* 8 regions x 256 B rows: 2 KiB a position, 2 MiB for 1000; three
	 * sequences under a 4 MiB budget. */
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 4 * MiB);
	struct sb_kv_seq *s[3];
	int32_t toks[3][1200];
	struct sb_stats a;
	size_t u0, u1;
	long n;
	int err;

	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 1200; k++)
			toks[i][k] = i * 100000 + k;
	for (int i = 0; i < 3; i++) {
		s[i] = sb_kv_create(p, &cfg, &err);
		CHECK(s[i] != NULL);
		grow(s[i], toks[i], 1000);
	}
	/* The budget held: the pool put the coldest pages on disk. */
	a = stats(p);
	CHECK(a.bytes_resident <= 4 * MiB);
	for (int i = 0; i < 3; i++)
		CHECK(rows_ok(s[i], toks[i], 1000));
	/* Park one on purpose: its pages go, then come back as used. */
	CHECK(sb_kv_evict(NULL) == -EINVAL);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(sb_kv_settle(s[i]), 0);
	u0 = in_use(p);
	/* The most recently used: the pool has put the others' coldest
	 * pages on disk already. */
	n = sb_kv_evict(s[2]);
	CHECK(n > 0);
	u1 = in_use(p);
	printf("parked %ld pages, in use %zu -> %zu KiB\n", n, u0 / 1024,
	       u1 / 1024);
	/* Its pages went; those placed ahead, past its length, too
	 * (released: nothing to write). */
	CHECK(u1 + (size_t)n * PAGE <= u0 &&
	      u1 + (size_t)n * PAGE + 2 * L * PAGE >= u0);
	CHECK_EQ(sb_buf_placed(sb_kv_buf(s[2], 1, 1), 0, 1000 * 256), 0);
	/* Resume: the next pass reads what it writes, only that. */
	a = stats(p);
	grow(s[2], toks[2], 1001);
	printf("resume: %lu pages read for one position\n",
	       (unsigned long)(stats(p).pages_in - a.pages_in));
	/* The page each region writes next: not the 1000 rows before. */
	CHECK(stats(p).pages_in - a.pages_in <= 2 * L);
	CHECK(rows_ok(s[2], toks[2], 1001));
	grow(s[2], toks[2], 1200);
	for (int i = 0; i < 3; i++)
		CHECK(rows_ok(s[i], toks[i], sb_kv_len(s[i])));
	/* Without SB_KV_EVICTABLE, sb_kv_evict parks as well. */
	{
		struct sb_kv_config c0 = config(SB_KV_F32, NULL, 0);
		struct sb_kv_seq *z = sb_kv_create(p, &c0, &err);

		CHECK(z != NULL);
		grow(z, NULL, 300);
		CHECK(sb_kv_evict(z) > 0);
		CHECK_EQ(sb_buf_placed(sb_kv_buf(z, 0, 0), 0, 300 * 512), 0);
		grow(z, NULL, 400);
		CHECK(rows_ok(z, NULL, 400));
		sb_kv_destroy(z);
	}
	/* Pages shared with another sequence stay: writing them out would
	 * give nothing back. */
	{
		struct sb_kv_config c0 = config(SB_KV_F16, NULL, 0);
		struct sb_kv_seq *z = sb_kv_create(p, &c0, &err), *f;
		long own;

		grow(z, NULL, 256);	/* 4 pages a region */
		f = sb_kv_fork(z, 256, &err);
		CHECK(f != NULL);
		grow(f, NULL, 600);
		CHECK_EQ(sb_kv_settle(f), 0);
		own = sb_buf_placed(sb_kv_buf(f, 0, 0), 4 * PAGE,
				    sb_buf_length(sb_kv_buf(f, 0, 0)) -
					    4 * PAGE);
		n = sb_kv_evict(f);
		/* Its own pages (some regions have one more placed ahead). */
		CHECK(n >= 2 * L * (own - 1) && n <= 2 * L * (own + 1));
		CHECK_EQ(sb_buf_placed(sb_kv_buf(f, 2, 1), 0, 4 * PAGE), 4);
		CHECK_EQ(sb_buf_placed(sb_kv_buf(f, 2, 1), 4 * PAGE, PAGE), 0);
		grow(f, NULL, 650);
		CHECK(rows_ok(f, NULL, 650));
		CHECK(rows_ok(z, NULL, 256));
		sb_kv_destroy(f);
		sb_kv_destroy(z);
	}
	for (int i = 0; i < 3; i++)
		sb_kv_destroy(s[i]);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("evict and resume under a budget: ok\n");
}

/* ---- the prefix cache ------------------------------------------------------------ */

static struct sb_kv_seq *get(struct sb_kv_cache *c, const int32_t *t,
			     size_t n, size_t *hit)
{
	int err = 0;
	struct sb_kv_seq *s = sb_kv_cache_get(c, t, n, hit, &err);

	if (!s)
		FAIL("sb_kv_cache_get: %s", strerror(-err));
	CHECK_EQ(sb_kv_len(s), *hit);
	return s;
}

static void cache_basics(void)
{
	struct sb_kv_config cfg = config(SB_KV_F16, NULL, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	/* f16, 2 x 64: 256 B rows, 64 positions a 16 KiB block. */
	enum { B = 64, N = 300 };
	struct sb_kv_cache *c, *other;
	struct sb_kv_seq *a, *g, *h;
	int32_t t[2 * N], u[2 * N];
	size_t s0, s1, hit;
	uint8_t *k;
	int err;

	for (int i = 0; i < 2 * N; i++)
		t[i] = u[i] = 1000 + i * 3;
	u[100] = 7;	/* diverges inside the second block */
	c = sb_kv_cache_create(p, &cfg, "model-a", 64 * MiB, &err);
	CHECK(c != NULL);
	other = sb_kv_cache_create(p, &cfg, "model-b", 64 * MiB, &err);
	CHECK(other != NULL);
	CHECK(sb_kv_cache_create(p, &cfg, NULL, 0, &err) == NULL &&
	      err == -EINVAL);
	a = sb_kv_create(p, &cfg, &err);
	grow(a, t, N);
	CHECK(sb_kv_cache_put(c, a, t, N + 1) == -ERANGE);
	CHECK_EQ(sb_kv_cache_put(c, a, t, N), 4 * B);
	CHECK_EQ(sb_kv_cache_put(c, a, t, N), 4 * B);	/* again: kept */

	/* Equal, shorter, longer, diverging, too short. */
	g = get(c, t, N, &hit);
	CHECK_EQ(hit, 4 * B);
	CHECK(rows_ok(g, t, hit));
	sb_kv_destroy(g);
	g = get(c, t, 200, &hit);
	CHECK_EQ(hit, 3 * B);
	CHECK(rows_ok(g, t, hit));
	sb_kv_destroy(g);
	g = get(c, t, 2 * N, &hit);
	CHECK_EQ(hit, 4 * B);
	sb_kv_destroy(g);
	g = get(c, u, N, &hit);
	CHECK_EQ(hit, B);
	sb_kv_destroy(g);
	g = get(c, t, B - 1, &hit);
	CHECK_EQ(hit, 0);
	sb_kv_destroy(g);
	/* Another model never matches. */
	g = get(other, t, N, &hit);
	CHECK_EQ(hit, 0);
	sb_kv_destroy(g);

	/* Pages shared, not copied: a hit costs no memory until written. */
	sb_kv_destroy(a);
	s0 = in_use(p);
	g = get(c, t, N, &hit);
	h = get(c, t, N, &hit);
	s1 = in_use(p);
	printf("two hits of %zu positions: pool %zu -> %zu KiB in use\n", hit,
	       s0 / 1024, s1 / 1024);
	CHECK_EQ(s1, s0);
	/* Copy-on-write: a write into a hit's rows stays its own. */
	k = sb_kv_k(g, 0);
	k[10 * 256] ^= 0xff;
	CHECK(!rows_ok(g, t, hit));
	CHECK(rows_ok(h, t, hit));
	sb_kv_destroy(h);
	h = get(c, t, N, &hit);
	CHECK(rows_ok(h, t, hit));
	/* A hit continues as any sequence: the rest of the prompt. */
	grow(h, t, N + 50);
	CHECK(rows_ok(h, t, N + 50));
	/* And can be cached in turn: the longer prompt extends the chain. */
	CHECK_EQ(sb_kv_cache_put(c, h, t, N + 50), 5 * B);
	sb_kv_destroy(h);
	h = get(c, t, 2 * N, &hit);
	CHECK_EQ(hit, 5 * B);
	CHECK(rows_ok(h, t, hit));
	sb_kv_destroy(h);
	sb_kv_destroy(g);

	/* Another geometry is refused. */
	{
		struct sb_kv_config c2 = config(SB_KV_F32, NULL, 0);
		struct sb_kv_seq *z = sb_kv_create(p, &c2, &err);

		grow(z, t, 100);
		CHECK(sb_kv_cache_put(c, z, t, 100) == -EINVAL);
		sb_kv_destroy(z);
	}
	/* A sequence from the cache outlives it. */
	h = get(c, t, N, &hit);
	sb_kv_cache_destroy(other);
	sb_kv_cache_destroy(c);
	CHECK(rows_ok(h, t, hit));
	grow(h, t, N + 10);
	CHECK(rows_ok(h, t, N + 10));
	sb_kv_destroy(h);
	CHECK_EQ(in_use(p), 0);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("cache: hits, divergence, model ids, copy-on-write: ok\n");
}

/* LRU under max_bytes: 4 prompts of one block each, room for 2. With a
 * disk tier the old ones go to disk (and still hit), without it they are
 * gone. */
static void cache_lru(bool disk)
{
	struct sb_kv_config cfg = config(SB_KV_F16, NULL, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	enum { B = 64 };
	/* A block: 8 regions x 16 KiB. */
	size_t block = 2 * L * PAGE;
	struct sb_kv_cache *c;
	struct sb_buf *ev = NULL;
	int32_t t[4][B];
	size_t hit;
	int err;

	bool machine = getenv("SBTEST_MACHINE_CACHE") != NULL;

	if (disk)	/* an evictable buffer sets up the disk tier */
		ev = make_buf(p, PAGE, SB_BUF_EVICTABLE);
	c = sb_kv_cache_create(p, &cfg, machine ? (disk ? "m-disk" : "m-mem") : "m",
			       2 * block, &err);
	CHECK(c != NULL);
	for (int i = 0; i < 4; i++) {
		struct sb_kv_seq *s = sb_kv_create(p, &cfg, &err);

		for (int k = 0; k < B; k++)
			t[i][k] = i * 1000 + k;
		grow(s, t[i], B);
		CHECK_EQ(sb_kv_cache_put(c, s, t[i], B), B);
		sb_kv_destroy(s);
		/* What only the cache holds stays within max_bytes. */
		CHECK(in_use(p) <= 2 * block);
	}
	for (int i = 3; i >= 0; i--) {
		struct sb_kv_seq *s = get(c, t[i], B, &hit);

		printf("lru %s: prompt %d hit %zu\n", disk ? "disk" : "memory",
		       i, hit);
		if (disk && i < 2 && !machine) {
			/* On disk: the hit comes back lazily, page by page
			 * as the sequence touches it, for each sequence. */
			struct sb_kv_seq *s2 = get(c, t[i], B, &hit);
			struct sb_kv_stats ks;
			uint64_t in0 = stats(p).pages_in;

			CHECK_EQ(hit, B);
			CHECK_EQ(sb_kv_stats(s, &ks), 0);
			CHECK_EQ(ks.pages_placed, 0);
			CHECK(rows_ok(s, t[i], B));
			CHECK_EQ(stats(p).pages_in - in0, 2 * L);
			CHECK(rows_ok(s2, t[i], B));
			CHECK_EQ(stats(p).pages_in - in0, 4 * L);
			/* Written to: its own copy; the next hit reads the
			 * cache's. */
			((uint8_t *)sb_kv_k(s2, 0))[7] ^= 1;
			sb_kv_destroy(s2);
			s2 = get(c, t[i], B, &hit);
			CHECK(rows_ok(s2, t[i], B));
			sb_kv_destroy(s2);
		} else if (i >= 2 || disk || machine) {
			/* (A client pool's cache is also sparsebufd's: what
			 * went from this process is found on the machine.) */
			CHECK_EQ(hit, B);
			CHECK(rows_ok(s, t[i], B));
		} else {
			CHECK_EQ(hit, 0);
		}
		sb_kv_destroy(s);
	}
	if (disk && !machine)
		CHECK(stats(p).pages_out > 0);
	sb_kv_cache_destroy(c);
	sb_buf_destroy(ev);
	/* Every spill slot went back, shared ones included. */
	CHECK_EQ(stats(p).spill_bytes, 0);
	VERIFY(p);
	sb_pool_destroy(p);
}

/* A prefix stored from a sequence whose window slid ends only where every
 * windowed layer held its whole window. */
static void cache_window(void)
{
	static const int win[L] = {0, 100, 0, 0};
	struct sb_kv_config cfg = config(SB_KV_F16, win, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	enum { B = 64 };
	struct sb_kv_cache *c;
	struct sb_kv_seq *s, *g;
	int32_t t[600];
	size_t hit;
	int err;

	for (int i = 0; i < 600; i++)
		t[i] = 5 * i + 2;
	c = sb_kv_cache_create(p, &cfg, "w", 64 * MiB, &err);
	s = sb_kv_create(p, &cfg, &err);
	grow(s, t, 4 * B);	/* layer 1 holds [156, 256) */
	CHECK_EQ(sb_kv_cache_put(c, s, t, 4 * B), 4 * B);
	g = get(c, t, 600, &hit);
	CHECK_EQ(hit, 4 * B);
	CHECK_EQ(sb_kv_start(g, 1), 4 * B - 100);
	CHECK(rows_ok(g, t, hit));
	grow(g, t, 500);
	CHECK(rows_ok(g, t, 500));
	sb_kv_destroy(g);
	/* A shorter prefix would need rows layer 1 no longer had. */
	g = get(c, t, 3 * B, &hit);
	CHECK_EQ(hit, 0);
	sb_kv_destroy(g);
	sb_kv_destroy(s);
	/* Blocks stored with holes (from a sequence that had slid past
	 * them) are never a hit's window, and a later put from a sequence
	 * that holds them fills them in: the hit then reads real rows, not
	 * zeros (found by an adversarial run). */
	{
		int32_t u[600];
		struct sb_kv_seq *a, *b;

		for (int i = 0; i < 600; i++)
			u[i] = 9 * i + 4;
		a = sb_kv_create(p, &cfg, &err);
		grow(a, u, 400);	/* layer 1 holds [300, 400) */
		CHECK_EQ(sb_kv_cache_put(c, a, u, 320), 5 * B);
		sb_kv_destroy(a);
		g = get(c, u, 320, &hit);
		CHECK_EQ(hit, 0);	/* its window [220, 320) was released */
		sb_kv_destroy(g);
		g = get(c, u, 192, &hit);
		CHECK_EQ(hit, 0);	/* [92, 192) lies in holes */
		sb_kv_destroy(g);
		b = sb_kv_create(p, &cfg, &err);
		grow(b, u, 192);	/* layer 1 holds [92, 192) */
		CHECK_EQ(sb_kv_cache_put(c, b, u, 192), 3 * B);
		sb_kv_destroy(b);
		g = get(c, u, 192, &hit);
		CHECK_EQ(hit, 3 * B);
		CHECK_EQ(sb_kv_start(g, 1), 92);
		CHECK(rows_ok(g, u, hit));
		sb_kv_destroy(g);
	}
	sb_kv_cache_destroy(c);
	VERIFY(p);
	sb_pool_destroy(p);
	printf("cache with sliding windows: ok\n");
}

/* Several threads putting and getting on one cache: every hit holds the
 * rows of the prompt it was asked for. */
struct racer {
	struct sb_kv_cache *c;
	struct sb_pool *p;
	int id;
	int hits;
};

static void *race(void *arg)
{
	struct racer *r = arg;
	struct sb_kv_config cfg = config(SB_KV_F16, NULL, 0);
	int32_t t[4][200];
	int err;

	for (int k = 0; k < 4; k++)
		for (int i = 0; i < 200; i++)	/* shared first block */
			t[k][i] = i < 64 ? i : k * 1000 + i;
	for (int round = 0; round < 20; round++) {
		int k = (round + r->id) % 4;
		size_t hit;
		struct sb_kv_seq *s = get(r->c, t[k], 200, &hit);

		if (!rows_ok(s, t[k], hit))
			FAIL("thread %d: a hit of %zu with other rows", r->id,
			     hit);
		r->hits += hit > 0;
		grow(s, t[k], 200);
		CHECK(sb_kv_cache_put(r->c, s, t[k], 200) >= 0);
		sb_kv_destroy(s);
	}
	(void)cfg;
	(void)err;
	return NULL;
}

static void cache_threads(void)
{
	struct sb_kv_config cfg = config(SB_KV_F16, NULL, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	struct racer r[3];
	pthread_t th[3];
	int err;
	/* Room for a few blocks: puts evict while others get. */
	struct sb_kv_cache *c = sb_kv_cache_create(p, &cfg, "t", 6 * 2 * L * PAGE,
						   &err);

	CHECK(c != NULL);
	for (int i = 0; i < 3; i++) {
		r[i] = (struct racer){c, p, i, 0};
		pthread_create(&th[i], NULL, race, &r[i]);
	}
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	printf("cache threads: %d, %d, %d hits of 20 each\n", r[0].hits,
	       r[1].hits, r[2].hits);
	CHECK(r[0].hits + r[1].hits + r[2].hits > 30);
	sb_kv_cache_destroy(c);
	VERIFY(p);
	sb_pool_destroy(p);
}

/* max_ctx costs address space only: parking, saving, restoring and
 * freeing a sequence of terabytes of regions do work that follows what it
 * holds (the fuzzer found evict and a restored sequence's destroy walking
 * every page of the region). Run under alarm(): a walk would take
 * minutes. */
static int child_huge(void)
{
	struct sb_kv_config cfg = config(SB_KV_F16, NULL, 0);
	struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
	struct sb_kv_seq *s, *r;
	char path[160];
	int err;

	alarm(20);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* Their runtimes take much of the address space: 64 GiB a region. */
	cfg.max_ctx = (size_t)1 << 28;
#else
	cfg.max_ctx = (size_t)1 << 32;	/* 1 TiB a region */
#endif
	s = sb_kv_create(p, &cfg, &err);
	if (!s)
		FAIL("sb_kv_create of 8 TiB: %s", strerror(-err));
	grow(s, NULL, 300);
	CHECK(sb_kv_evict(s) > 0);
	grow(s, NULL, 310);
	snprintf(path, sizeof(path), "%s/huge.kv", getenv("SBKV_DIR"));
	CHECK_EQ(sb_kv_save(s, path, NULL, 0), 0);
	r = restore(p, path);
	CHECK(rows_ok(r, NULL, 310));
	CHECK(sb_kv_evict(r) > 0);
	sb_kv_destroy(r);
	sb_kv_destroy(s);
	sb_pool_destroy(p);
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "huge"))
		return child_huge();
	if (!strcmp(name, "restore"))
		return child_restore();
	if (!strcmp(name, "damaged"))
		return child_damaged();
	return 2;
}

static int main_test(void)
{
	require_cow();
	snprintf(dir, sizeof(dir), "/tmp/sbkv-XXXXXX");
	if (!mkdtemp(dir))
		FAIL("mkdtemp");
	roundtrip(SB_KV_F32, 0);
	roundtrip(SB_KV_F16, SB_KV_EVICTABLE);
	roundtrip(SB_KV_BF16, 0);
	bad_files();
	edited();
	damaged_data();
	other_process();
	evict_resume();
	cache_basics();
	cache_lru(false);
	cache_lru(true);
	cache_window();
	cache_threads();
	{
		char var[96];
		char *env[] = {var, NULL};
		int st;

		snprintf(var, sizeof(var), "SBKV_DIR=%s", dir);
		st = run_child_env("huge", env, 60, NULL, 0);
		CHECK_EQ(child_exit_code(st), 0);
		printf("a max_ctx of terabytes: evict, save, restore, "
		       "destroy follow what is held\n");
	}
	disk_rm_rf(dir);
	printf("ok\n");
	return 0;
}
