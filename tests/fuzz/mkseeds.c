/* SPDX-License-Identifier: MIT */
/*
 * Write the seed inputs of the harnesses: tests/fuzz/corpus/NAME/seed-*.
 * `make fuzz-seeds` runs it; rerun it when a format changes (the files it
 * writes are committed; finds kept in the corpus are left alone). Seeds
 * are small, valid inputs that reach deep: a fuzzer mutating a valid file
 * gets past the first checks.
 *
 *   save        sb_buf_save files of a few pages (needs userfaultfd; the
 *               save seeds are kept as they are without it), and the
 *               header and tables of an 8 MiB file whose data is a hole
 *   kvsave      sb_kv_save files of tiny sequences (1-3 layers, 1-2 KV
 *               heads, head_dim 8-32, f32/f16/bf16; a sliding window, an
 *               empty sequence, a user blob; saved with 4 KiB and 16 KiB
 *               pages), each under 128 KiB (needs userfaultfd, as save)
 *   checkpoint  handmade llama2.c checkpoints: tiny (a few KiB) with
 *               shared and separate classifiers, and a header alone
 *   tokenizer   a vocabulary count, then a llama2.c tokenizer file
 *   sampler     settings and logits for the sampler
 *   flash       sbflash headers of tiny geometries
 *   env         SPARSEBUF_* settings, one NAME=VALUE a line
 *   cli         a parser selector, a bounds selector, the text (for the
 *               walk: argv, NUL-separated)
 *   dmsg        sparsebufd's configuration and steps of 2-3 clients
 *               (tests/fuzz/fuzz_dmsg.c's encoding): leases, returns,
 *               heaps and status from two clients, a control connection,
 *               reclaims answered, partly answered and timed out, a
 *               restart, a batch, misbehaving clients; and single
 *               messages (HELLO, replies) for the raw check
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../flash/format.h"
#include "dproto.h"
#include "sbkernels.h"
#include "sparsebuf.h"
#include "sparsebuf_kv.h"

static const char *dir;

static void put(const char *name, const char *file, const void *p, size_t n)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/seed-%s", dir, name, file);
	f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
		perror(path);
		exit(1);
	}
}

static void put_str(const char *name, const char *file, const char *s)
{
	put(name, file, s, strlen(s));
}

/* ---- save files ------------------------------------------------------------
 */

/* Save pages of a buffer filled by pattern (NULL entries: holes) into the
 * corpus, through the library: the files are what sb_buf_save writes. */
static void save_seed(struct sb_pool *pool, size_t page, const char *file,
		      const char *pattern)
{
	size_t n = strlen(pattern);
	char tmp[] = "/tmp/sparsebuf-seed-XXXXXX";
	struct sb_buf *b;
	struct stat st;
	char *p, *data;
	int fd, err = 0;

	b = sb_buf_create(pool, n * page, 0, &err);
	if (!b) {
		fprintf(stderr, "sb_buf_create: %s\n", strerror(-err));
		exit(1);
	}
	p = sb_buf_addr(b);
	for (size_t i = 0; i < n; i++)
		if (pattern[i] != '.')
			for (size_t j = 0; j < page; j++)
				p[i * page + j] =
					(char)(pattern[i] + j * 7 + (j >> 12));
	fd = mkstemp(tmp);
	if (fd < 0 || (err = sb_buf_save(b, 0, n * page, tmp)) < 0) {
		fprintf(stderr, "sb_buf_save: %s\n", strerror(-err));
		exit(1);
	}
	close(fd);
	sb_buf_destroy(b);
	fd = open(tmp, O_RDONLY);
	if (fd < 0 || fstat(fd, &st) < 0 ||
	    !(data = malloc((size_t)st.st_size)) ||
	    read(fd, data, (size_t)st.st_size) != st.st_size) {
		perror(tmp);
		exit(1);
	}
	close(fd);
	unlink(tmp);
	put("save", file, data, (size_t)st.st_size);
	free(data);
}

static void save_seeds(void)
{
	struct sb_pool_opts o;
	struct sb_pool *pool;
	int err = 0;

	sb_pool_opts_init(&o);
	o.page_size = 4096;
	o.heap_size = (size_t)1 << 20;
	o.numa_node = -1;
	pool = sb_pool_create(&o, &err);
	if (!pool) {
		fprintf(stderr, "mkseeds: no pool (%s): save seeds kept\n",
			strerror(-err));
		return;
	}
	/* Letters: a page of data; '.': a hole. Five blocks: a restored
	 * 16 KiB page with a tail past the saved length. */
	save_seed(pool, 4096, "3pages", "a.c");
	save_seed(pool, 4096, "5blocks", "ab.de");
	save_seed(pool, 4096, "1block", "z");
	save_seed(pool, 4096, "holes", "....q...");
	sb_pool_destroy(pool);
}

/* A save file's header and tables for nblocks blocks, every block present
 * with the CRC of zeros, and no data: the data is what the harness makes
 * a hole (a hostile file declaring more than it holds). Built here, not by
 * the library, which writes only what it has. */
uint32_t sbi_crc32c(const void *p, size_t len);

static void hostile_seed(const char *file, uint64_t nblocks)
{
	static const char zeros[4096];
	uint64_t bitmap = (nblocks + 63) / 64 * 8, crcs = nblocks * 4;
	size_t len;
	char *p;
	struct {
		char magic[8];
		uint32_t version, block;
		uint64_t length, nblocks, present_off, crc_off, data_off;
		uint32_t tables_crc, header_crc;
	} h;

	memset(&h, 0, sizeof(h));
	memcpy(h.magic, "SBSAVE01", 8);
	h.version = 1;
	h.block = 4096;
	bitmap = (bitmap + 4095) & ~(uint64_t)4095;
	crcs = (crcs + 4095) & ~(uint64_t)4095;
	len = (size_t)(4096 + bitmap + crcs);
	p = calloc(1, len);
	if (!p)
		exit(1);
	memset(p + 4096, 0xff, (size_t)(nblocks / 8));
	for (uint64_t b = 0; b < nblocks; b++) {
		uint32_t c = sbi_crc32c(zeros, sizeof(zeros));

		memcpy(p + 4096 + bitmap + b * 4, &c, 4);
	}
	h.length = nblocks * 4096;
	h.nblocks = nblocks;
	h.present_off = 4096;
	h.crc_off = 4096 + bitmap;
	h.data_off = 4096 + bitmap + crcs;
	h.tables_crc = sbi_crc32c(p + 4096, (size_t)(bitmap + crcs));
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	memcpy(p, &h, sizeof(h));
	put("save", file, p, len);
	free(p);
}

static void hostile_seeds(void)
{
	/* 8 MiB declared, its tables in the file, its data a hole. */
	hostile_seed("hole-8m", 2048);
}

/* ---- KV save files ---------------------------------------------------------
 */

/* Read a whole file into the corpus as seed-file of name, and remove it. */
static void put_file(const char *name, const char *file, const char *path)
{
	struct stat st;
	char *data;
	int fd = open(path, O_RDONLY);

	if (fd < 0 || fstat(fd, &st) < 0 ||
	    !(data = malloc((size_t)st.st_size + 1)) ||
	    read(fd, data, (size_t)st.st_size) != st.st_size) {
		perror(path);
		exit(1);
	}
	close(fd);
	unlink(path);
	put(name, file, data, (size_t)st.st_size);
	free(data);
}

/* A sequence of geometry cfg grown to len positions (every row of every
 * region a pattern), saved by sb_kv_save with user (ulen bytes). */
static void kv_seed(struct sb_pool *pool, const char *file,
		    const struct sb_kv_config *cfg, size_t len,
		    const void *user, size_t ulen)
{
	char tmp[] = "/tmp/sparsebuf-kvseed-XXXXXX";
	struct sb_kv_seq *s;
	size_t row;
	int fd, err = 0;

	s = sb_kv_create(pool, cfg, &err);
	if (!s) {
		fprintf(stderr, "sb_kv_create: %s\n", strerror(-err));
		exit(1);
	}
	row = sb_kv_row_bytes(s);
	/* A few positions a pass, as a decoder after its prompt. */
	for (size_t at = 0; at < len;) {
		size_t n = len - at < 7 ? len - at : 7;
		long r = sb_kv_prepare(s, n);

		if (r < 0) {
			fprintf(stderr, "sb_kv_prepare: %s\n",
				strerror((int)-r));
			exit(1);
		}
		for (int l = 0; l < cfg->n_layers; l++)
			for (size_t i = at * row; i < (at + n) * row; i++) {
				((char *)sb_kv_k(s, l))[i] =
					(char)(l * 16 + i * 3 + 1);
				((char *)sb_kv_v(s, l))[i] =
					(char)(l * 16 + i * 5 + 2);
			}
		r = sb_kv_commit(s, n);
		if (r < 0) {
			fprintf(stderr, "sb_kv_commit: %s\n",
				strerror((int)-r));
			exit(1);
		}
		at += n;
	}
	fd = mkstemp(tmp);
	if (fd < 0 || (err = sb_kv_save(s, tmp, user, ulen)) < 0) {
		fprintf(stderr, "sb_kv_save: %s\n", strerror(-err));
		exit(1);
	}
	close(fd);
	sb_kv_destroy(s);
	put_file("kvsave", file, tmp);
}

static struct sb_pool *kv_pool(size_t page)
{
	struct sb_pool_opts o;
	struct sb_pool *pool;
	int err = 0;

	sb_pool_opts_init(&o);
	o.page_size = page;
	o.heap_size = (size_t)1 << 20;
	o.numa_node = -1;
	pool = sb_pool_create(&o, &err);
	if (!pool)
		fprintf(stderr, "mkseeds: no pool (%s): kvsave seeds kept\n",
			strerror(-err));
	return pool;
}

static void kv_seeds(void)
{
	static const char tokens[] =
		"token ids 1 15043 29892 3186 "
		"sampler t=0.8 p=0.9 seed=42 rng=0x2545f491";
	/* Layer 0 slides over 16 positions: with 64-byte rows, its first
	 * page is released by position 80, a hole in the save. */
	static const int slide[2] = {16, 0};
	static const int mixed[3] = {0, 4, 0};
	struct sb_pool *pool = kv_pool(4096), *big;
	struct sb_kv_config c;

	if (!pool)
		return;
	/* 1 layer, 1 KV head of 8, f32: rows of 32 bytes. */
	c = (struct sb_kv_config){.n_layers = 1,
				  .n_kv_heads = 1,
				  .head_dim = 8,
				  .dtype = SB_KV_F32,
				  .max_ctx = 64};
	kv_seed(pool, "f32-1layer", &c, 10, NULL, 0);
	/* 2 layers, 2 KV heads of 16, f16: two pages a region. */
	c = (struct sb_kv_config){.n_layers = 2,
				  .n_kv_heads = 2,
				  .head_dim = 16,
				  .dtype = SB_KV_F16,
				  .max_ctx = 1024};
	kv_seed(pool, "f16-2layers", &c, 100, NULL, 0);
	/* 2 layers, bf16 head of 32, a sliding window on layer 0. */
	c = (struct sb_kv_config){.n_layers = 2,
				  .n_kv_heads = 1,
				  .head_dim = 32,
				  .dtype = SB_KV_BF16,
				  .max_ctx = 512,
				  .window = slide};
	kv_seed(pool, "bf16-window", &c, 90, NULL, 0);
	/* 3 layers, f16 head of 8, a window of 4 on layer 1. */
	c = (struct sb_kv_config){.n_layers = 3,
				  .n_kv_heads = 1,
				  .head_dim = 8,
				  .dtype = SB_KV_F16,
				  .max_ctx = 256,
				  .window = mixed};
	kv_seed(pool, "f16-3layers", &c, 20, NULL, 0);
	/* Empty: no region images at all. */
	c = (struct sb_kv_config){.n_layers = 2,
				  .n_kv_heads = 2,
				  .head_dim = 8,
				  .dtype = SB_KV_F32,
				  .max_ctx = 4096};
	kv_seed(pool, "empty", &c, 0, NULL, 0);
	/* A user blob, evictable regions. */
	c = (struct sb_kv_config){.n_layers = 1,
				  .n_kv_heads = 2,
				  .head_dim = 8,
				  .dtype = SB_KV_F32,
				  .max_ctx = 128,
				  .flags = SB_KV_EVICTABLE};
	kv_seed(pool, "user-blob", &c, 5, tokens, sizeof(tokens));
	sb_pool_destroy(pool);
	/* Saved with 16 KiB pages: 100 rows of 64 bytes, one page. */
	big = kv_pool((size_t)16 << 10);
	if (!big)
		return;
	c = (struct sb_kv_config){.n_layers = 1,
				  .n_kv_heads = 1,
				  .head_dim = 16,
				  .dtype = SB_KV_F32,
				  .max_ctx = 300,
				  .lookahead = 8};
	kv_seed(big, "page16k", &c, 100, "u", 1);
	sb_pool_destroy(big);
}

/* ---- llama2.c checkpoints and tokenizers -----------------------------------
 */

struct ckpt_cfg {
	int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

/* A checkpoint of the given geometry with small weights; vocab_size < 0
 * means a separate classifier, as in llama2.c. */
static void ckpt_seed(const char *file, struct ckpt_cfg c)
{
	size_t d = (size_t)c.dim, h = (size_t)c.hidden_dim,
	       L = (size_t)c.n_layers, V = (size_t)abs(c.vocab_size);
	size_t hs = d / (size_t)c.n_heads;
	size_t kvd = d * (size_t)c.n_kv_heads / (size_t)c.n_heads;
	size_t n = V * d + L * (2 * d + 2 * d * d + 2 * d * kvd + 3 * d * h) +
		   d + (size_t)c.seq_len * hs + (c.vocab_size < 0 ? V * d : 0);
	size_t bytes = sizeof(c) + n * sizeof(float);
	char *p = calloc(1, bytes);
	float *w = (float *)(p + sizeof(c));

	if (!p)
		exit(1);
	memcpy(p, &c, sizeof(c));
	for (size_t i = 0; i < n; i++)
		w[i] = (float)((int)(i % 17) - 8) / 64.0f;
	put("checkpoint", file, p, bytes);
	free(p);
}

static void tokenizer_seed(const char *file, int vocab)
{
	char buf[4096];
	size_t n = 0;
	int max_len = 8;

	/* The harness's prefix: the vocabulary size the loader is told. */
	memcpy(buf + n, &vocab, 4), n += 4;
	memcpy(buf + n, &max_len, 4), n += 4;
	for (int i = 0; i < vocab; i++) {
		char piece[16];
		float score = -(float)i;
		int len;

		if (i < 3)
			len = snprintf(piece, sizeof(piece), "%s",
				       i == 0	? "<unk>"
				       : i == 1 ? "<s>"
						: "</s>");
		else if (i < 3 + 4)
			len = snprintf(piece, sizeof(piece), "<0x%02X>",
				       i * 37);
		else
			len = snprintf(piece, sizeof(piece), " w%d", i);
		memcpy(buf + n, &score, 4), n += 4;
		memcpy(buf + n, &len, 4), n += 4;
		memcpy(buf + n, piece, (size_t)len), n += (size_t)len;
	}
	put("tokenizer", file, buf, n);
}

/* Sampler input: vocab (u16), temperature, topp (floats), seed (u64),
 * then logits (floats) repeated to fill the vocabulary. */
static void sampler_seed(const char *file, uint16_t vocab, float t, float p,
			 int nlogits)
{
	char buf[1024];
	size_t n = 0;
	uint64_t seed = 42;

	memcpy(buf + n, &vocab, 2), n += 2;
	memcpy(buf + n, &t, 4), n += 4;
	memcpy(buf + n, &p, 4), n += 4;
	memcpy(buf + n, &seed, 8), n += 8;
	for (int i = 0; i < nlogits; i++) {
		float l = (float)(i % 5) - 2.0f;

		memcpy(buf + n, &l, 4), n += 4;
	}
	put("sampler", file, buf, n);
}

/* ---- flash headers
 * ------------------------------------------------------------ */

static void flash_seed(const char *file, uint32_t dim, uint32_t layers,
		       uint32_t heads, uint32_t kv_heads, uint32_t hidden,
		       uint32_t vocab, uint32_t rank)
{
	struct sbf_header h;

	memset(&h, 0, sizeof(h));
	memcpy(h.magic, SBF_MAGIC, 8);
	h.version = SBF_VERSION;
	h.dim = dim, h.n_layers = layers, h.n_heads = heads;
	h.n_kv_heads = kv_heads, h.hidden = hidden, h.vocab = vocab;
	h.rank = rank;
	h.dtype = SBK_F16;
	h.seed = 1;
	h.rope_theta = 10000.0f;
	h.pred_margin = 0.0f;
	sbf_layout(&h);
	put("flash", file, &h, sizeof(h));
}

/* cli input: selector, bounds, then text of len bytes (NULs kept). */
static void cli_seed(const char *file, int sel, int bounds, const char *text,
		     size_t len)
{
	char buf[512];

	buf[0] = (char)sel;
	buf[1] = (char)bounds;
	memcpy(buf + 2, text, len);
	put("cli", file, buf, len + 2);
}

#define CLI(file, sel, bounds, text)                                           \
	cli_seed(file, sel, bounds, text, sizeof(text) - 1)

/* ---- sparsebufd's messages -------------------------------------------------
 *
 * tests/fuzz/fuzz_dmsg.c's encoding (its header comment): three bytes of
 * configuration, then steps.
 */

static uint8_t dm[8192];
static size_t dm_len;

/* Step bits: descriptors beside a message, deferred, "from the daemon". */
#define DM_FD 0x10
#define DM_DEFER 0x20
#define DM_ANSWER 0x40

static void dm_add(const void *p, size_t n)
{
	if (dm_len + n > sizeof(dm)) {
		fprintf(stderr, "mkseeds: dmsg seed too long\n");
		exit(1);
	}
	memcpy(dm + dm_len, p, n);
	dm_len += n;
}

/* budget: max_bytes = (budget + 16) * 64 KiB; flags: bit 0 three
 * clients, bit 1 verbose, bits 2-4 the daemon's page size (4 KiB << n);
 * uids: 2 bits a client (root, the daemon's, 1001, 1002). */
static void dm_begin(uint8_t budget, uint8_t flags, uint8_t uids)
{
	dm_len = 0;
	dm_add(&budget, 1);
	dm_add(&flags, 1);
	dm_add(&uids, 1);
}

/* A value as a compact field: 14 bits and a shift of 0, 12, 20 or 35. */
static void dm_field(uint64_t v)
{
	static const unsigned shift[4] = {0, 12, 20, 35};
	uint8_t b[2];

	for (unsigned k = 0; k < 4; k++)
		if (!(v & (((uint64_t)1 << shift[k]) - 1)) &&
		    v >> shift[k] < 0x4000) {
			unsigned x = (unsigned)(v >> shift[k]) | k << 14;

			b[0] = (uint8_t)x;
			b[1] = (uint8_t)(x >> 8);
			dm_add(b, 2);
			return;
		}
	fprintf(stderr, "mkseeds: %llu: no compact field\n",
		(unsigned long long)v);
	exit(1);
}

/* A compact message from client cl (seq: its next sequence number). */
static void dm_msg(unsigned cl, unsigned bits, unsigned type, bool seq,
		   uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	uint8_t h[3] = {(uint8_t)(cl | bits), (uint8_t)type, seq};

	dm_add(h, 3);
	dm_field(a);
	dm_field(b);
	dm_field(c);
	dm_field(d);
}

/* A raw message: n bytes at p; big: padded past the largest message. */
static void dm_raw(unsigned cl, unsigned bits, const void *p, size_t n,
		   bool big)
{
	uint8_t h[3] = {(uint8_t)(cl | 4 | bits), (uint8_t)n,
			(uint8_t)(n >> 8 | (big ? 0x80 : 0))};

	dm_add(h, 3);
	dm_add(p, n);
}

/* unread: after the daemon ran, its answers left unread. */
static void dm_hangup(unsigned cl, bool unread)
{
	uint8_t h = (uint8_t)(cl | 8 | (unread ? DM_FD : 0));

	dm_add(&h, 1);
}

/* The daemon's clock moves ms (a multiple of 25, at most 6400). */
static void dm_clock(unsigned ms)
{
	uint8_t h[2] = {12, (uint8_t)(ms / 25 - 1)};

	dm_add(h, 2);
}

static void dm_put(const char *file)
{
	put("dmsg", file, dm, dm_len);
}

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)

static void dmsg_seeds(void)
{
	struct sbd_msg m;
	uint8_t big[sizeof(m) + 1];
	struct {
		struct sbd_msg m;
		struct sbd_status st;
		struct sbd_client_info ci;
	} status;

	/* Two clients (uids 1001 and 1002, 4 KiB and 16 KiB pages), a
	 * budget of 2 MiB, the daemon's pages 256 KiB: every request. */
	dm_begin(16, 6 << 2, 2 | 3 << 2);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 16 * KiB, 0);
	dm_msg(0, 0, SBD_LEASE, true, 64 * KiB, 256 * KiB, 0, 0);
	dm_msg(1, 0, SBD_LEASE, true, 256 * KiB, MiB, 0, 0);
	dm_msg(0, 0, SBD_REPORT, false, 0, 0, 64 * KiB, 64 * KiB);
	dm_msg(0, 0, SBD_RETURN, false, 64 * KiB, 0, 64 * KiB, 64 * KiB);
	dm_msg(1, 0, SBD_HEAP, true, MiB, 0, 0, 0);
	dm_msg(1, DM_ANSWER, SBD_HEAP_FREE, false, 0, 0, 0, 0);
	dm_msg(0, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_msg(1, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_put("two-clients");

	/* The machine-wide cache: clients 0 and 1 of uid 1001, 2 of 1002,
	 * 64 KiB pages, a budget of 2 MiB. 0 names a model, puts a block of
	 * 4 pages and one after it of 1 page, fetches the cache heap; 1
	 * finds the first block, fetches the heap, unpins a page; 2 (another
	 * uid) finds nothing and is refused the heap; 0 hangs up (its pins
	 * go, its blocks stay); 1 lists, puts the same key again (exists),
	 * then asks for the whole budget as a lease: the unpinned blocks
	 * are dropped to make room. */
	dm_begin(16, 1 | 4 << 2, 2 | 2 << 2 | 3 << 4);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 64 * KiB, 0);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 64 * KiB, 0);
	dm_msg(2, 0, SBD_HELLO, true, 1, 0, 64 * KiB, 0);
	dm_msg(0, 0, SBD_CACHE_MODEL, false, 7, 0, 0, 0);
	dm_msg(0, 0, SBD_CACHE_PUT, true, 100, 7, 0, 3);
	dm_msg(0, DM_ANSWER, SBD_CACHE_HEAP, true, 0, 0, 0, 0);
	dm_msg(0, DM_ANSWER, SBD_CACHE_DONE, true, 0, 1, 0, 0);
	dm_msg(0, DM_ANSWER, SBD_CACHE_PUT, true, 101, 0, 1, 0);
	dm_msg(0, DM_ANSWER, SBD_CACHE_DONE, true, 0, 1, 0, 0);
	dm_msg(1, 0, SBD_CACHE_GET, true, 100, 7, 0, 0);
	dm_msg(1, DM_ANSWER, SBD_CACHE_HEAP, true, 0, 0, 0, 0);
	dm_msg(1, 0, SBD_CACHE_UNPIN, false, 0, 0, 0, 0);
	dm_msg(2, 0, SBD_CACHE_GET, true, 100, 7, 0, 0);
	dm_msg(2, 0, SBD_CACHE_HEAP, true, 1, 0, 0, 0);
	dm_hangup(0, false);
	dm_msg(1, 0, SBD_CACHE_LIST, true, 0, 0, 0, 0);
	dm_msg(1, 0, SBD_FLOOR, true, 1 * MiB, 0, 0, 0);
	dm_msg(1, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_msg(1, 0, SBD_CACHE_PUT, true, 100, 7, 0, 0);
	dm_msg(1, 0, SBD_LEASE, true, 2 * MiB, 2 * MiB, 0, 0);
	dm_put("cache");

	/* A client that dies while filling two blocks: both dropped, the
	 * other finds nothing, the budget back. */
	dm_begin(16, 4 << 2, 2 | 2 << 2);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 64 * KiB, 0);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 64 * KiB, 0);
	dm_msg(0, 0, SBD_CACHE_PUT, true, 5, 7, 0, 1);
	dm_msg(0, DM_ANSWER, SBD_CACHE_PUT, true, 6, 0, 1, 1);
	dm_msg(1, 0, SBD_CACHE_PUT, true, 8, 5, 1, 0);
	dm_hangup(0, true);
	dm_msg(1, 0, SBD_CACHE_GET, true, 5, 7, 0, 0);
	dm_msg(1, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_put("cache-filler-dies");

	/* A --hugetlb daemon (2 MiB pages): a client of huge pages gets a
	 * heap of whole huge pages as a hugetlbfs file, one of 3 MiB is
	 * refused, its cache put is served (or refused: no huge page free);
	 * a control connection that says huge pages is malformed; a shmem
	 * client of the same page size that puts is dropped (another kind
	 * of heap). */
	dm_begin(255, 0x20, 0);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 2 * MiB, SBD_HELLO_HUGETLB);
	dm_msg(0, 0, SBD_LEASE, true, 2 * MiB, 4 * MiB, 0, 0);
	dm_msg(0, 0, SBD_HEAP, true, 4 * MiB, 0, 0, 0);
	dm_msg(0, 0, SBD_HEAP, true, 3 * MiB, 0, 0, 0);
	dm_msg(0, 0, SBD_CACHE_PUT, true, 5, 0, 0, 1);
	dm_msg(0, DM_ANSWER, SBD_CACHE_DONE, true, 0, 1, 0, 0);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 0,
	       SBD_HELLO_CONTROL | SBD_HELLO_HUGETLB);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 2 * MiB, 0);
	dm_msg(1, 0, SBD_HEAP, true, 4 * MiB, 0, 0, 0);
	dm_msg(1, 0, SBD_CACHE_PUT, true, 6, 0, 0, 1);
	dm_put("hugetlb-daemon");

	/* A shmem daemon: a client of huge pages gets hugetlbfs heaps and
	 * no cache (told a cache page size of 0). */
	dm_begin(255, 7 << 2, 0);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 2 * MiB, SBD_HELLO_HUGETLB);
	dm_msg(0, 0, SBD_HEAP, true, 2 * MiB, 0, 0, 0);
	dm_msg(0, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_put("hugetlb-client");

	/* A control connection (root) beside two clients, asking status,
	 * then asking for pages: dropped. */
	dm_begin(0, 1 | 2, 0 | 2 << 2 | 3 << 4);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 0, SBD_HELLO_CONTROL);
	dm_msg(0, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_LEASE, true, 128 * KiB, 512 * KiB, 0, 0);
	dm_msg(2, 0, SBD_HELLO, true, 1, 0, 64 * KiB, 0);
	dm_msg(2, 0, SBD_LEASE, true, 64 * KiB, 64 * KiB, 0, 0);
	dm_msg(2, 0, SBD_REPORT, false, 0, 0, 64 * KiB, 64 * KiB);
	dm_msg(0, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_msg(2, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_msg(0, 0, SBD_LEASE, true, 4 * KiB, 4 * KiB, 0, 0);
	dm_put("control");

	/* A budget of 1 MiB, all of it leased to client 0; client 1's
	 * lease waits while 0 is asked, 0 answers with all it was asked:
	 * 1 is granted. */
	dm_begin(0, 0, 2 | 2 << 2);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(0, 0, SBD_LEASE, true, MiB, MiB, 0, 0);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_LEASE, true, 256 * KiB, 512 * KiB, 0, 0);
	dm_msg(0, DM_ANSWER, SBD_RETURN, false, 0, 0, 0, 0);
	dm_msg(0, 0, SBD_LEASE, true, 64 * KiB, 128 * KiB, 0, 0);
	dm_msg(1, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_put("reclaim-answer");

	/* The same, client 0 busy (no unused lease: its idle pages are
	 * asked for), answering with half: refused; 0 is not asked again
	 * for 3 s; then asked and silent: the request times out. */
	dm_begin(0, 1, 2 | 2 << 2 | 2 << 4);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(0, 0, SBD_LEASE, true, MiB, MiB, MiB, MiB);
	dm_msg(2, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_clock(100);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_LEASE, true, 512 * KiB, 512 * KiB, 0, 0);
	dm_msg(0, 0, SBD_RETURN, false, 256 * KiB, 1, 768 * KiB, 768 * KiB);
	dm_msg(1, 0, SBD_LEASE, true, 512 * KiB, 512 * KiB, 0, 0);
	dm_clock(3200);
	dm_msg(1, 0, SBD_LEASE, true, 512 * KiB, 512 * KiB, 0, 0);
	dm_clock(1100);
	dm_clock(2000);
	dm_msg(1, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_put("reclaim-timeout");

	/* A restarted daemon: client 0 comes back holding 2 MiB of a
	 * 1 MiB budget; everyone is asked; 0 hangs up and comes back
	 * holding what it held; 1 hangs up with a reply unread. */
	dm_begin(0, 0, 0 | 1 << 2);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_LEASE, true, 256 * KiB, 512 * KiB, 0, 0);
	dm_msg(0, 0, SBD_HELLO, true, 1, 2 * MiB, 4 * KiB, 0);
	dm_msg(1, DM_ANSWER, SBD_RETURN, false, 0, 0, 0, 0);
	dm_hangup(0, false);
	dm_msg(0, DM_ANSWER, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, DM_DEFER, SBD_STATUS, true, 0, 0, 0, 0);
	dm_hangup(1, true);
	dm_msg(0, 0, SBD_RETURN, false, 1536 * KiB, 0, 0, 0);
	dm_msg(0, 0, SBD_LEASE, true, 4 * KiB, 8 * KiB, 0, 0);
	dm_put("restart");

	/* Three clients, the budget held, all of it resident: the idlest
	 * is asked for 2's lease; then 1 waits for more than 0 gives back,
	 * and 2, behind it, for less. */
	dm_begin(0, 1, 2 | 2 << 2 | 2 << 4);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(0, 0, SBD_LEASE, true, 512 * KiB, 512 * KiB, 512 * KiB, 0);
	dm_clock(100);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_LEASE, true, 512 * KiB, 512 * KiB, 512 * KiB, 0);
	dm_clock(100);
	dm_msg(2, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(2, 0, SBD_LEASE, true, 256 * KiB, 256 * KiB, 0, 0);
	dm_msg(0, DM_ANSWER, SBD_RETURN, false, 0, 0, 256 * KiB, 0);
	dm_clock(100);
	dm_msg(1, 0, SBD_LEASE, true, 512 * KiB, 512 * KiB, 512 * KiB, 0);
	dm_clock(100);
	dm_msg(2, 0, SBD_LEASE, true, 64 * KiB, 64 * KiB, 0, 0);
	dm_msg(0, 0, SBD_RETURN, false, 128 * KiB, 1, 128 * KiB, 0);
	dm_clock(1000);
	dm_clock(2500);
	dm_put("parked");

	/* Heaps: too large, many (the table grows), freed, one of another
	 * client's. */
	dm_begin(0, 0, 0);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(0, 0, SBD_HEAP, true, (uint64_t)1 << 41, 0, 0, 0);
	for (int i = 0; i < 17; i++)
		dm_msg(0, 0, SBD_HEAP, true, 64 * KiB, 0, 0, 0);
	dm_msg(0, DM_ANSWER, SBD_HEAP_FREE, false, 0, 0, 0, 0);
	dm_msg(0, 0, SBD_HEAP_FREE, false, 1, 0, 0, 0);
	dm_msg(0, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_HEAP, true, (uint64_t)1 << 40, 0, 0, 0);
	dm_msg(1, 0, SBD_HEAP_FREE, false, 2, 0, 0, 0);
	dm_put("heaps");

	/* Messages piled up before the daemon reads: more than one
	 * wake-up's worth. */
	dm_begin(32, 1, 0);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, DM_DEFER, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	for (int i = 0; i < 20; i++) {
		dm_msg(0, DM_DEFER, SBD_LEASE, true, 4 * KiB, 64 * KiB,
		       (uint64_t)i * 4 * KiB, 0);
		if (i < 8)
			dm_msg(1, DM_DEFER, SBD_REPORT, false, 0, 0,
			       (uint64_t)i * 4 * KiB, 0);
	}
	dm_msg(0, DM_DEFER, SBD_STATUS, true, 0, 0, 0, 0);
	dm_msg(2, 0, SBD_STATUS, true, 0, 0, 0, 0);
	dm_put("batch");

	/* Misbehaving clients: a descriptor, messages of the largest size
	 * and of one byte more (truncated), a RETURN of more than held,
	 * speaking before HELLO, a second HELLO, a heap that is not its
	 * own, a daemon's message. */
	memset(&m, 0, sizeof(m));
	m.magic = SBD_MAGIC;
	m.type = SBD_HELLO;
	m.seq = 7;
	m.a = SBD_VERSION;
	m.c = 4096;
	memcpy(big, &m, sizeof(m));
	big[sizeof(m)] = 1;
	dm_begin(0, 1, 0xff);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(0, DM_FD, SBD_LEASE, true, 4 * KiB, 4 * KiB, 0, 0);
	dm_raw(1, 0, &m, sizeof(m), false);
	dm_raw(1, 0, &m, sizeof(m), true);
	dm_raw(1, 0, &m, sizeof(m), false);
	dm_raw(1, 0, big, sizeof(m) + 1, true);
	dm_raw(1, 0, &m, sizeof(m), false);
	dm_msg(1, 0, SBD_RETURN, false, 4 * KiB, 0, 0, 0);
	dm_msg(2, 0, SBD_LEASE, true, 4 * KiB, 4 * KiB, 0, 0);
	dm_raw(2, 0, &m, sizeof(m), false);
	dm_raw(2, 0, &m, sizeof(m), false);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(0, 0, SBD_HEAP_FREE, false, 5, 0, 0, 0);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(0, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_HELLO, true, 1, 0, 4 * KiB, 0);
	dm_msg(1, 0, SBD_RECLAIM, false, 4 * KiB, 0, 0, 0);
	dm_put("misbehave");

	/* Single messages, for the raw check: a HELLO, a heap's reply (one
	 * descriptor), a status reply with one client. */
	put("dmsg", "msg-hello", &m, sizeof(m));
	memset(&m, 0, sizeof(m));
	m.magic = SBD_MAGIC;
	m.type = SBD_REPLY;
	m.nfds = 1;
	m.seq = 3;
	m.a = 1;
	put("dmsg", "msg-heap-reply", &m, sizeof(m));
	memset(&status, 0, sizeof(status));
	status.m.magic = SBD_MAGIC;
	status.m.type = SBD_REPLY;
	status.m.seq = 9;
	status.m.len = sizeof(status) - sizeof(status.m);
	status.st.max_bytes = 8 * MiB;
	status.st.bytes_used = MiB;
	status.st.page_size = 256 * KiB;
	status.st.nclients = 1;
	status.ci = (struct sbd_client_info){.pid = 42,
					     .uid = 1000,
					     .id = 1,
					     .page_size = 4096,
					     .bytes = MiB};
	put("dmsg", "msg-status-reply", &status, sizeof(status));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: mkseeds CORPUS_DIR\n");
		return 2;
	}
	dir = argv[1];
	mkdir(dir, 0755);
	save_seeds();
	hostile_seeds();
	kv_seeds();

	ckpt_seed("tiny-shared", (struct ckpt_cfg){8, 16, 1, 2, 2, 8, 4});
	ckpt_seed("tiny-gqa-cls", (struct ckpt_cfg){8, 12, 2, 2, 1, -6, 3});
	{
		/* The header alone: what the size checks see first. */
		struct ckpt_cfg c = {288, 768, 6, 6, 6, 32000, 256};

		put("checkpoint", "header-only", &c, sizeof(c));
	}

	tokenizer_seed("small", 12);
	tokenizer_seed("one", 1);

	sampler_seed("greedy", 8, 0.0f, 0.9f, 8);
	sampler_seed("topp", 16, 1.0f, 0.9f, 16);
	sampler_seed("multinomial", 5, 0.8f, 1.0f, 5);
	sampler_seed("cold", 32, 0.01f, 0.5f, 7);

	flash_seed("tiny", 8, 1, 2, 2, 16, 8, 2);
	flash_seed("gqa", 16, 2, 4, 2, 32, 10, 4);

	put_str("env", "sizes",
		"SPARSEBUF_PAGE_SIZE=64K\nSPARSEBUF_HEAP_SIZE"
		"=4MiB\nSPARSEBUF_MAX_BYTES=1G\n");
	put_str("env", "all",
		"SPARSEBUF_PAGE_SIZE=4096\nSPARSEBUF_HEAP_SIZE"
		"=1M\nSPARSEBUF_MAX_BYTES=0\nSPARSEBUF_NUMA_NODE=-1\n"
		"SPARSEBUF_LOG=debug\nSPARSEBUF_FAULT_THREADS=2\n"
		"SPARSEBUF_RECYCLE=0\nSPARSEBUF_PAGER=sync\n");
	put_str("env", "bad",
		"SPARSEBUF_PAGE_SIZE=12K\nSPARSEBUF_LOG=7\n"
		"SPARSEBUF_NUMA_NODE=x\n");
	put_str("env", "pool",
		"SPARSEBUF_PAGE_SIZE=8K\nSPARSEBUF_HEAP_SIZE="
		"64K\nSPARSEBUF_MAX_BYTES=16K\nSPARSEBUF_FAULT_THREADS=1\n"
		"pool\n");

	CLI("int", 0, 0, "123");
	CLI("int-neg", 0, 3, "-1");
	CLI("u64-hex", 1, 0, "0x2a");
	CLI("double", 2, 1, "0.9");
	CLI("double-exp", 2, 0, "1e-3");
	CLI("size", 3, 1, "4.5G");
	CLI("size-kib", 3, 0, "64KiB");
	CLI("choice", 4, 0, "sparse");
	CLI("list", 5, 2, "1,2,3");
	CLI("names", 6, 0, "dense,f16");
	CLI("walk", 7, 0,
	    "model.bin\0-n\000256\0--kv=dense\0-t0.8\0--ids\0"
	    "--seed\00042\0--budget=1G\0--prompt-ids\0001,2\0--modes\0"
	    "f32,bf16\0--\0-x");
	CLI("walk-bad", 7, 0, "--bogus");
	CLI("walk-help", 7, 0, "--help");

	dmsg_seeds();
	return 0;
}
