/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the KV save files: sb_kv_restore (lib/kv_save.c), the lazy,
 * checked page-ins of the sequence it returns (each region an sb_buf_save
 * image, lib/save.c), and what can be done with that sequence (grow it,
 * evict it, save it again).
 *
 * Every input is tried twice:
 *
 *   raw      the bytes as they are: the checksums reject nearly every
 *            mutation of the headers and tables, but data mutations go
 *            through to the page-in checks;
 *   fixed    the checksums recomputed over the mutated bytes: each region
 *            image's header and tables CRC where its header lies in the
 *            file (and, for some inputs, the CRC of every present block),
 *            the KV table's CRC, the KV header's; for some inputs the
 *            derived header fields too (file_len, table_off, table_len,
 *            row), so that a mutated geometry gets through to what it
 *            makes.
 *
 * The contract checked, per restore:
 *   - it fails with a documented -errno (-EBADMSG for a bad file, -EINVAL;
 *     -ENOMEM is tolerated), or it gives a sequence, and then the file is
 *     well formed by the format in lib/kv_save.c's header comment
 *     (accepted implies valid), and the sequence is the file's: geometry
 *     (sb_kv_get_config: len <= max_ctx, start <= len, windows), row
 *     size, length, starts, user blob of the declared length and bytes;
 *   - rows [start, len) of every layer's K and V (at most MAX_POS
 *     positions, at most MAX_TOUCH pages a restore) are touched, page by
 *     page: a page raises SIGBUS exactly when one of its present blocks
 *     fails its CRC; a page that reads holds the image's bytes for its
 *     present blocks and zeros elsewhere (no silent zeros, no silent
 *     corruption);
 *   - depending on the input (bits of its CRC, so a replay does the
 *     same): the sequence grown by one position (sb_kv_prepare, the row
 *     written in every region, sb_kv_commit: length and window starts
 *     move as documented, the row reads back); evicted (sb_kv_evict) and
 *     read again; saved (sb_kv_save, with its own user blob or another)
 *     and that file restored: same geometry, length, starts, blob, rows;
 *   - destroying leaves the pool consistent (sbi_pool_verify) and no
 *     descriptor open on the files; libFuzzer's leak check sees the rest.
 *
 * Cost: the library bounds its work by what the file holds. This harness
 * found two exceptions, since fixed: a declared max_ctx cost time in
 * proportion to it (sb_buf_destroy walked every page-table entry of a
 * buffer with a source, sb_kv_evict unmapped the whole region past the
 * length: ~6 s a region at 2^40 positions), and a declared lookahead was
 * taken as it was (sb_kv_prepare placed that many rows ahead; a restored
 * one is now at most 16 pages of rows, tests/test_kv_session.c). To keep
 * each input cheap anyway, an input whose regions declare more than
 * AS_CAP in all is not restored, and one whose prepare would place more
 * than GROW_CAP is not grown; the checks touch at most MAX_TOUCH pages
 * (what evict and save then write).
 *
 * The pool is made once per process (page 16 KiB, the seeds are saved
 * with 4 KiB and 16 KiB pages: partial pages and tails are covered); the
 * files live in a private directory in /dev/shm, removed at exit (or,
 * after a crash, by the next run). Without userfaultfd the harness skips
 * (exit 77, "SKIP: why").
 *
 * The formats are mirrored here (struct kv_hdr, struct img_hdr): if
 * lib/kv_save.c or lib/save.c changes them, update the mirrors and
 * regenerate the seeds (tests/fuzz/mkseeds.c).
 */
#include "fuzz.h"
#include "sparsebuf.h"
#include "sparsebuf_kv.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

/* The library's own, for the checks. */
uint32_t sbi_crc32c(const void *p, size_t len);
int sbi_pool_verify(struct sb_pool *pool, char *why, size_t len);

#define BLOCK 4096u
#define PAGE  ((size_t)16 << 10)
/* Largest input tried (run.sh bounds -max_len well below). */
#define MAX_IN ((size_t)1 << 20)
/* Positions touched per layer, and pages touched per restore. */
#define MAX_POS	  4096
#define MAX_TOUCH 256
/* Declared address space of all regions together, and bytes a prepare
 * may place (see "Cost" above). */
#define AS_CAP	   ((uint64_t)4 << 30)
#define GROW_CAP   ((uint64_t)8 << 20)
#define MAX_LAYERS 65536
#define MAX_USER   ((uint64_t)1 << 30)

struct kv_hdr {
	char magic[8];
	uint32_t version;
	uint32_t block;
	int32_t n_layers;
	int32_t n_kv_heads;
	int32_t head_dim;
	int32_t dtype;
	uint32_t flags;
	uint32_t pad;
	uint64_t max_ctx;
	uint64_t lookahead;
	uint64_t row;
	uint64_t len;
	uint64_t page_size;
	uint64_t table_off;
	uint64_t table_len;
	uint64_t user_len;
	uint64_t file_len;
	uint32_t table_crc;
	uint32_t header_crc; /* of this struct with header_crc = 0 */
};

struct img_hdr {
	char magic[8];
	uint32_t version;
	uint32_t block;
	uint64_t length;
	uint64_t nblocks;
	uint64_t present_off;
	uint64_t crc_off;
	uint64_t data_off;
	uint32_t tables_crc;
	uint32_t header_crc;
};

_Static_assert(sizeof(struct kv_hdr) == 120, "KV header mirror");
_Static_assert(sizeof(struct img_hdr) == 64, "image header mirror");

/* The table after the header, as kv_save.c lays it out (its header
 * comment lists the parts in another order): start[n] (u64),
 * region[2n][2] (offset, length: u64), window[n] (i32), the user blob. */
static uint64_t table_bytes(uint64_t n, uint64_t user_len)
{
	return n * 8 + n * 32 + n * 4 + user_len;
}

static struct sb_pool *pool;
static int can_wp;
/* The file as the library sees it. */
static uint8_t *file;
static char dir[64], in_path[96], out_path[96];
static char page_buf[PAGE];

static void remove_dir(void)
{
	unlink(in_path);
	unlink(out_path);
	rmdir(dir);
}

/* A harness that crashed left its directory, named by its pid: remove
 * those of processes gone. */
static void remove_stale(const char *parent)
{
	DIR *d = opendir(parent);
	struct dirent *e;

	while (d && (e = readdir(d))) {
		char p[300];
		long pid;

		if (strncmp(e->d_name, "sbfuzzkv-", 9))
			continue;
		pid = atol(e->d_name + 9);
		if (pid <= 0 || (kill((pid_t)pid, 0) < 0 && errno == ESRCH)) {
			snprintf(p, sizeof(p), "%s/%s/in", parent, e->d_name);
			unlink(p);
			snprintf(p, sizeof(p), "%s/%s/out", parent, e->d_name);
			unlink(p);
			snprintf(p, sizeof(p), "%s/%s", parent, e->d_name);
			rmdir(p);
		}
	}
	if (d)
		closedir(d);
}

static void write_file(const char *path, const void *p, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	size_t done = 0;

	if (fd < 0) {
		perror(path);
		abort();
	}
	while (done < n) {
		ssize_t w = write(fd, (const char *)p + done, n - done);

		if (w <= 0) {
			perror(path);
			abort();
		}
		done += (size_t)w;
	}
	close(fd);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct sb_pool_opts o;
	struct sb_features f;
	int err = 0;

	(void)argc;
	(void)argv;
	sb_features_get(&f);
	if (f.uffd_mode == SB_UFFD_NONE)
		FUZZ_SKIP("userfaultfd unavailable: %s",
			  strerror(-f.uffd_error));
	can_wp = f.wp_shmem;
	sb_pool_opts_init(&o);
	o.page_size = PAGE;
	o.heap_size = (size_t)1 << 20;
	/* No budget: no budget SIGBUS to tell apart from a checksum one.
	 * The caps above bound what one input places. */
	o.max_bytes = 0;
	o.numa_node = -1;
	pool = sb_pool_create(&o, &err);
	if (!pool)
		FUZZ_SKIP("sb_pool_create: %s", strerror(-err));
	remove_stale("/dev/shm");
	remove_stale("/tmp");
	snprintf(dir, sizeof(dir), "/dev/shm/sbfuzzkv-%d", (int)getpid());
	if (mkdir(dir, 0700) < 0) {
		snprintf(dir, sizeof(dir), "/tmp/sbfuzzkv-%d", (int)getpid());
		if (mkdir(dir, 0700) < 0) {
			perror(dir);
			abort();
		}
	}
	snprintf(in_path, sizeof(in_path), "%s/in", dir);
	snprintf(out_path, sizeof(out_path), "%s/out", dir);
	atexit(remove_dir);
	file = malloc(MAX_IN);
	if (!file)
		abort();
	return 0;
}

static uint64_t round_block(uint64_t n)
{
	return (n + BLOCK - 1) & ~(uint64_t)(BLOCK - 1);
}

static size_t dtype_size(int32_t t)
{
	return t == SB_KV_F32 ? 4 : t == SB_KV_F16 || t == SB_KV_BF16 ? 2 : 0;
}

static int present(const uint8_t *bitmap, uint64_t b)
{
	return bitmap[b / 8] >> (b % 8) & 1;
}

/* ---- fixing up the checksums ---------------------------------------------
 */

/* The region image at file[off, size): its tables' CRC (and, when
 * fix_blocks, every present block's that lies in the file) and its
 * header's, where they lie in the file. */
static void fix_image(uint64_t off, size_t size, int fix_blocks)
{
	uint64_t limit = size - off, bitmap, crcs;
	uint8_t *img = file + off;
	struct img_hdr h;

	if (off > size || limit < sizeof(h))
		return;
	memcpy(&h, img, sizeof(h));
	/* Tables that fit in the file, as the writer lays them out. */
	if (h.nblocks <= limit) {
		bitmap = round_block((h.nblocks + 63) / 64 * 8);
		crcs = round_block(h.nblocks * 4);
		if (BLOCK + bitmap + crcs <= limit) {
			for (uint64_t b = 0; fix_blocks && b < h.nblocks; b++) {
				uint64_t at = h.data_off + b * BLOCK;

				if (present(img + BLOCK, b) &&
				    h.data_off <= limit &&
				    b < (limit - h.data_off) / BLOCK &&
				    at + BLOCK <= limit)
					fuzz_put32(img + BLOCK + bitmap + b * 4,
						   sbi_crc32c(img + at, BLOCK));
			}
			h.tables_crc = sbi_crc32c(img + BLOCK, bitmap + crcs);
		}
	}
	h.header_crc = 0;
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	memcpy(img, &h, sizeof(h));
}

/* Recompute the checksums over the mutated bytes of file[0, size): the
 * images', the table's, the header's; for fix_fields, the derived
 * header fields too. */
static void fix_up(size_t size, int fix_blocks, int fix_fields)
{
	struct kv_hdr h;
	uint64_t n;

	memcpy(&h, file, sizeof(h));
	n = h.n_layers > 0 && h.n_layers <= MAX_LAYERS ? (uint64_t)h.n_layers
						       : 0;
	if (fix_fields) {
		size_t elt = dtype_size(h.dtype);

		h.file_len = size;
		h.table_off = BLOCK;
		if (n && h.user_len <= MAX_USER)
			h.table_len = table_bytes(n, h.user_len);
		if (elt && h.n_kv_heads > 0 && h.head_dim > 0)
			h.row = (uint64_t)elt * (uint64_t)h.n_kv_heads *
				(uint64_t)h.head_dim;
	}
	if (n && h.user_len <= MAX_USER && h.table_off == BLOCK &&
	    h.table_len == table_bytes(n, h.user_len) &&
	    BLOCK + h.table_len <= size) {
		const uint8_t *region = file + BLOCK + n * 8;

		for (uint64_t g = 0; g < 2 * n; g++) {
			uint64_t off = fuzz_le64(region + g * 16);

			if (off && off < size)
				fix_image(off, size, fix_blocks);
		}
		h.table_crc = sbi_crc32c(file + BLOCK, h.table_len);
	}
	h.header_crc = 0;
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	memcpy(file, &h, sizeof(h));
}

/* ---- what the sequence must show -----------------------------------------
 */

/* The file, parsed after the restore accepted it. */
struct model {
	struct kv_hdr h;
	size_t size;
	uint64_t n;	 /* layers */
	uint64_t region; /* bytes of a region at our page size */
	const uint8_t *start, *region_tab, *window, *user;
	struct img_hdr *img;  /* (2n) image headers (length 0: none) */
	const uint8_t **base; /* (2n) the image in the file */
	/* The row written by the grow step (grown: at position grown_at). */
	int grown;
	uint64_t grown_at;
	int any_bad; /* a page fails its CRC somewhere */
};

static uint8_t row_byte(uint64_t g, uint64_t i)
{
	return (uint8_t)(0x5a ^ (g * 29 + i * 7));
}

/* Accepted implies well formed: the format rules, on our copy. */
static void check_valid(struct model *m)
{
	struct kv_hdr h = m->h;
	uint32_t want = h.header_crc;
	uint64_t n, pos;
	size_t elt;

	h.header_crc = 0;
	FUZZ_CHECK(!memcmp(h.magic, "SBKVSV01", 8) && h.version == 1 &&
			   h.block == BLOCK,
		   "accepted a header with magic/version/block %.8s/%u/%u",
		   h.magic, h.version, h.block);
	FUZZ_CHECK(sbi_crc32c(&h, sizeof(h)) == want,
		   "accepted a header whose CRC is wrong");
	FUZZ_CHECK(h.n_layers > 0 && h.n_layers <= MAX_LAYERS &&
			   h.n_kv_heads > 0 && h.head_dim > 0,
		   "accepted layers %d, KV heads %d, head_dim %d", h.n_layers,
		   h.n_kv_heads, h.head_dim);
	elt = dtype_size(h.dtype);
	FUZZ_CHECK(elt && h.row == elt * (uint64_t)h.n_kv_heads *
					   (uint64_t)h.head_dim,
		   "accepted dtype %d, row %llu", h.dtype,
		   (unsigned long long)h.row);
	FUZZ_CHECK(!(h.flags & ~SB_KV_EVICTABLE), "accepted flags %#x",
		   h.flags);
	FUZZ_CHECK(h.max_ctx && h.len <= h.max_ctx,
		   "accepted len %llu, max_ctx %llu", (unsigned long long)h.len,
		   (unsigned long long)h.max_ctx);
	FUZZ_CHECK(h.file_len == m->size && h.table_off == BLOCK &&
			   h.user_len <= MAX_USER,
		   "accepted file_len %llu (file %zu), table_off %llu, "
		   "user_len %llu",
		   (unsigned long long)h.file_len, m->size,
		   (unsigned long long)h.table_off,
		   (unsigned long long)h.user_len);
	FUZZ_CHECK(h.page_size >= BLOCK && h.page_size <= (1u << 30) &&
			   !(h.page_size & (h.page_size - 1)),
		   "accepted page_size %llu", (unsigned long long)h.page_size);
	n = (uint64_t)h.n_layers;
	FUZZ_CHECK(h.table_len == table_bytes(n, h.user_len) &&
			   BLOCK + round_block(h.table_len) <= m->size,
		   "accepted table_len %llu for %llu layers",
		   (unsigned long long)h.table_len, (unsigned long long)n);
	FUZZ_CHECK(sbi_crc32c(file + BLOCK, h.table_len) == h.table_crc,
		   "accepted a table whose CRC is wrong");
	m->n = n;
	m->start = file + BLOCK;
	m->region_tab = m->start + n * 8;
	m->window = m->region_tab + n * 32;
	m->user = m->window + n * 4;
	pos = BLOCK + round_block(h.table_len);
	for (uint64_t g = 0; g < 2 * n; g++) {
		uint64_t off = fuzz_le64(m->region_tab + g * 16),
			 len = fuzz_le64(m->region_tab + g * 16 + 8);

		if (!off && !len)
			continue;
		FUZZ_CHECK(h.len && off % BLOCK == 0 && off >= pos &&
				   off <= m->size && len <= m->size - off &&
				   len >= BLOCK,
			   "accepted region %llu at %llu, %llu bytes",
			   (unsigned long long)g, (unsigned long long)off,
			   (unsigned long long)len);
		pos = off + len;
	}
	for (uint64_t l = 0; l < n; l++) {
		int32_t w = (int32_t)fuzz_le32(m->window + l * 4);
		uint64_t s = fuzz_le64(m->start + l * 8);

		FUZZ_CHECK(w >= 0 && (uint64_t)w <= h.max_ctx && s <= h.len &&
				   (w || !s),
			   "accepted layer %llu: window %d, start %llu",
			   (unsigned long long)l, w, (unsigned long long)s);
	}
}

/* The images of an accepted file: each one well formed too, and no
 * longer than its region at the page size it was saved with. */
static void load_images(struct model *m)
{
	uint64_t max = (m->region + m->h.page_size - 1) / m->h.page_size *
		       m->h.page_size;

	m->img = calloc(2 * m->n, sizeof(*m->img));
	m->base = calloc(2 * m->n, sizeof(*m->base));
	if (!m->img || !m->base)
		abort();
	for (uint64_t g = 0; g < 2 * m->n; g++) {
		uint64_t off = fuzz_le64(m->region_tab + g * 16),
			 len = fuzz_le64(m->region_tab + g * 16 + 8);
		struct img_hdr *h = &m->img[g];
		uint64_t limit = m->size - off, bitmap, crcs;
		uint32_t want;

		if (!len)
			continue;
		memcpy(h, file + off, sizeof(*h));
		m->base[g] = file + off;
		want = h->header_crc;
		h->header_crc = 0;
		FUZZ_CHECK(!memcmp(h->magic, "SBSAVE01", 8) &&
				   h->version == 1 && h->block == BLOCK &&
				   sbi_crc32c(h, sizeof(*h)) == want,
			   "accepted region %llu whose image header is bad",
			   (unsigned long long)g);
		h->header_crc = want;
		FUZZ_CHECK(h->length && h->length % BLOCK == 0 &&
				   h->nblocks == h->length / BLOCK &&
				   h->length <= max,
			   "accepted region %llu: image of %llu bytes, "
			   "%llu blocks (region %llu)",
			   (unsigned long long)g, (unsigned long long)h->length,
			   (unsigned long long)h->nblocks,
			   (unsigned long long)max);
		bitmap = round_block((h->nblocks + 63) / 64 * 8);
		crcs = round_block(h->nblocks * 4);
		FUZZ_CHECK(h->present_off == BLOCK &&
				   h->crc_off == BLOCK + bitmap &&
				   h->data_off == h->crc_off + crcs &&
				   h->data_off <= limit &&
				   h->length <= limit - h->data_off,
			   "accepted region %llu: image tables at %llu %llu "
			   "%llu, %llu bytes in the file",
			   (unsigned long long)g,
			   (unsigned long long)h->present_off,
			   (unsigned long long)h->crc_off,
			   (unsigned long long)h->data_off,
			   (unsigned long long)limit);
		FUZZ_CHECK(sbi_crc32c(m->base[g] + BLOCK, bitmap + crcs) ==
				   h->tables_crc,
			   "accepted region %llu: image tables CRC wrong",
			   (unsigned long long)g);
		/* Any damaged block: what makes -EIO an answer of prepare,
		 * evict and save. Bounded by the file. */
		for (uint64_t b = 0; b < h->nblocks && !m->any_bad; b++)
			m->any_bad =
				present(m->base[g] + BLOCK, b) &&
				sbi_crc32c(m->base[g] + h->data_off + b * BLOCK,
					   BLOCK) !=
					fuzz_le32(m->base[g] + h->crc_off +
						  b * 4);
	}
}

/* Page k (our page size) of region g: 1 if a present block fails its
 * CRC. */
static int page_bad(const struct model *m, uint64_t g, uint64_t k)
{
	const struct img_hdr *h = &m->img[g];
	const uint8_t *img = m->base[g];

	if (!h->length)
		return 0;
	for (uint64_t b = k * (PAGE / BLOCK);
	     b < (k + 1) * (PAGE / BLOCK) && b < h->nblocks; b++)
		if (present(img + h->present_off, b) &&
		    sbi_crc32c(img + h->data_off + b * BLOCK, BLOCK) !=
			    fuzz_le32(img + h->crc_off + b * 4))
			return 1;
	return 0;
}

/* What page k of region g must hold when it reads: the image's present
 * blocks, zeros elsewhere, and the row the grow step wrote. */
static void page_expect(const struct model *m, uint64_t g, uint64_t k,
			char *out)
{
	const struct img_hdr *h = &m->img[g];
	const uint8_t *img = m->base[g];

	memset(out, 0, PAGE);
	for (uint64_t b = k * (PAGE / BLOCK);
	     h->length && b < (k + 1) * (PAGE / BLOCK) && b < h->nblocks; b++)
		if (present(img + h->present_off, b))
			memcpy(out + (b - k * (PAGE / BLOCK)) * BLOCK,
			       img + h->data_off + b * BLOCK, BLOCK);
	if (m->grown) {
		uint64_t lo = m->grown_at * m->h.row, hi = lo + m->h.row;

		for (uint64_t o = lo > k * PAGE ? lo : k * PAGE;
		     o < hi && o < (k + 1) * PAGE; o++)
			out[o - k * PAGE] = (char)row_byte(g, o - lo);
	}
}

/* Region g's address. */
static char *region_addr(struct sb_kv_seq *seq, uint64_t g)
{
	return g & 1 ? sb_kv_v(seq, (int)(g / 2)) : sb_kv_k(seq, (int)(g / 2));
}

/* The pages of rows [lo, hi) of a region that a check touches: all of
 * them, or when more than per, the first and the last per / 2. */
struct span {
	uint64_t first, end, per;
};

static struct span rows_span(const struct model *m, uint64_t lo, uint64_t hi)
{
	struct span s;
	uint64_t per = MAX_TOUCH / (2 * m->n);

	if (hi > lo + MAX_POS)
		hi = lo + MAX_POS;
	s.first = lo * m->h.row / PAGE;
	s.end = hi > lo ? (hi * m->h.row + PAGE - 1) / PAGE : s.first;
	s.per = per ? per : 1;
	return s;
}

static int span_skip(const struct span *s, uint64_t k)
{
	return s->end - s->first > s->per && k >= s->first + s->per / 2 + 1 &&
	       k < s->end - s->per / 2;
}

/* Touch rows [start, len) of every layer's K and V: a page raises SIGBUS
 * exactly when a present block of it fails its CRC, and holds what the
 * model says when it reads. */
static void check_rows(struct sb_kv_seq *seq, struct model *m,
		       const uint64_t *lo, const char *when)
{
	uint64_t len = sb_kv_len(seq);
	struct fuzz_bus_guard g;
	int touched = 0;

	fuzz_bus_guard_on(&g);
	for (uint64_t r = 0; r < 2 * m->n && touched < MAX_TOUCH; r++) {
		struct span s = rows_span(m, lo[r / 2], len);
		const char *base = region_addr(seq, r);

		for (uint64_t k = s.first; k < s.end; k++) {
			const char *p = base + k * PAGE;
			int bus, bad;
			size_t i = 0;

			if (span_skip(&s, k))
				continue;
			if (++touched > MAX_TOUCH)
				break;
			bus = fuzz_touch(p);
			bad = page_bad(m, r, k);
			FUZZ_CHECK(bus == bad, "%s: region %llu page %llu: %s",
				   when, (unsigned long long)r,
				   (unsigned long long)k,
				   bus ? "SIGBUS, but its blocks are good"
				       : "read, but a block fails its CRC");
			if (bus)
				continue;
			page_expect(m, r, k, page_buf);
			/* memcmp first: a byte loop is slow under the
			 * fuzzer's comparison tracing. */
			if (memcmp(p, page_buf, PAGE))
				while (i < PAGE && p[i] == page_buf[i])
					i++;
			else
				i = PAGE;
			FUZZ_CHECK(i == PAGE,
				   "%s: region %llu page %llu byte %zu is %d, "
				   "not %d (len %llu)",
				   when, (unsigned long long)r,
				   (unsigned long long)k, i, p[i], page_buf[i],
				   (unsigned long long)len);
		}
	}
	fuzz_bus_guard_off(&g);
}

/* The sequence is the file's: geometry, length, starts, user blob. */
static void check_seq(struct sb_kv_seq *seq, const struct model *m)
{
	const struct kv_hdr *h = &m->h;
	struct sb_kv_config c;
	size_t ulen = 12345;
	const void *user;
	int r;

	memset(&c, 0, sizeof(c));
	r = sb_kv_get_config(seq, &c);
	FUZZ_CHECK(r == 0, "sb_kv_get_config: %d", r);
	FUZZ_CHECK(c.n_layers == h->n_layers && c.n_kv_heads == h->n_kv_heads &&
			   c.head_dim == h->head_dim &&
			   (int32_t)c.dtype == h->dtype &&
			   c.max_ctx == h->max_ctx &&
			   /* the file's, or at most 16 pages of rows */
			   (c.lookahead == h->lookahead ||
			    (c.lookahead < h->lookahead &&
			     c.lookahead == 16 * PAGE / h->row + 16)) &&
			   c.flags == h->flags,
		   "config %d/%d/%d/%d max_ctx %zu lookahead %zu flags %#x "
		   "is not the file's",
		   c.n_layers, c.n_kv_heads, c.head_dim, (int)c.dtype,
		   c.max_ctx, c.lookahead, c.flags);
	FUZZ_CHECK(sb_kv_len(seq) == h->len && sb_kv_len(seq) <= c.max_ctx,
		   "len %zu, file %llu, max_ctx %zu", sb_kv_len(seq),
		   (unsigned long long)h->len, c.max_ctx);
	FUZZ_CHECK(sb_kv_row_bytes(seq) == h->row, "row %zu, file %llu",
		   sb_kv_row_bytes(seq), (unsigned long long)h->row);
	for (uint64_t l = 0; l < m->n; l++) {
		int32_t w = (int32_t)fuzz_le32(m->window + l * 4);
		size_t s = sb_kv_start(seq, (int)l);
		struct sb_buf *k, *v;

		FUZZ_CHECK(c.window && c.window[l] == w,
			   "layer %llu: window %d, file %d",
			   (unsigned long long)l, c.window ? c.window[l] : -1,
			   w);
		FUZZ_CHECK(s == fuzz_le64(m->start + l * 8) &&
				   s <= sb_kv_len(seq),
			   "layer %llu: start %zu, file %llu, len %zu",
			   (unsigned long long)l, s,
			   (unsigned long long)fuzz_le64(m->start + l * 8),
			   sb_kv_len(seq));
		k = sb_kv_buf(seq, (int)l, 0);
		v = sb_kv_buf(seq, (int)l, 1);
		FUZZ_CHECK(sb_kv_k(seq, (int)l) == sb_buf_addr(k) &&
				   sb_kv_v(seq, (int)l) == sb_buf_addr(v),
			   "layer %llu: regions not at their buffers",
			   (unsigned long long)l);
		FUZZ_CHECK(sb_buf_length(k) >= m->region &&
				   sb_buf_length(v) >= m->region,
			   "layer %llu: regions of %zu and %zu bytes, not %llu",
			   (unsigned long long)l, sb_buf_length(k),
			   sb_buf_length(v), (unsigned long long)m->region);
	}
	user = sb_kv_user(seq, &ulen);
	FUZZ_CHECK(ulen == h->user_len && (ulen ? user != NULL : user == NULL),
		   "user blob %p of %zu bytes, file %llu", user, ulen,
		   (unsigned long long)h->user_len);
	FUZZ_CHECK(!ulen || !memcmp(user, m->user, ulen),
		   "user blob not the file's");
}

/* Grow by one position: prepare, the row written in every region,
 * commit. Length and window starts move as documented; the row reads
 * back (check_rows, through the model). */
static void grow(struct sb_kv_seq *seq, struct model *m, uint64_t *lo)
{
	uint64_t len = sb_kv_len(seq), row = m->h.row;
	struct fuzz_bus_guard g;
	long r;

	r = sb_kv_prepare(seq, 1);
	FUZZ_CHECK(r >= 0 || r == -ENOMEM || (r == -EIO && m->any_bad),
		   "sb_kv_prepare(1) at %llu of %llu: %ld (%s)",
		   (unsigned long long)len, (unsigned long long)m->h.max_ctx, r,
		   strerror((int)-r));
	if (r < 0)
		return;
	fuzz_bus_guard_on(&g);
	for (uint64_t reg = 0; reg < 2 * m->n; reg++) {
		char *base = region_addr(seq, reg);
		uint64_t o = len * row, end = o + row;

		while (o < end) {
			uint64_t k = o / PAGE, stop = (k + 1) * PAGE;
			int bus;

			if (stop > end)
				stop = end;
			bus = fuzz_write(base + o,
					 (char)row_byte(reg, o - len * row));
			FUZZ_CHECK(bus == page_bad(m, reg, k),
				   "writing row %llu, region %llu page %llu: "
				   "%s",
				   (unsigned long long)len,
				   (unsigned long long)reg,
				   (unsigned long long)k,
				   bus ? "SIGBUS, but its blocks are good"
				       : "written, but a block fails its CRC");
			for (uint64_t i = o + 1; !bus && i < stop; i++)
				base[i] = (char)row_byte(reg, i - len * row);
			o = stop;
		}
	}
	fuzz_bus_guard_off(&g);
	m->grown = 1;
	m->grown_at = len;
	r = sb_kv_commit(seq, 1);
	FUZZ_CHECK(r >= 0, "sb_kv_commit(1): %ld (%s)", r, strerror((int)-r));
	FUZZ_CHECK(sb_kv_len(seq) == len + 1, "len %zu after commit at %llu",
		   sb_kv_len(seq), (unsigned long long)len);
	for (uint64_t l = 0; l < m->n; l++) {
		uint64_t w = fuzz_le32(m->window + l * 4);
		size_t want = w && len + 1 > w ? len + 1 - w : lo[l];

		FUZZ_CHECK(sb_kv_start(seq, (int)l) == want,
			   "layer %llu (window %llu): start %zu after commit "
			   "at %llu, not %zu",
			   (unsigned long long)l, (unsigned long long)w,
			   sb_kv_start(seq, (int)l), (unsigned long long)len,
			   want);
		/* A start that moved back exposes rows a window released
		 * (sb_kv_truncate does the same): look from the old one. */
		if (want > lo[l])
			lo[l] = want;
	}
}

/* Save the sequence, restore the save: the same sequence. */
static void round_trip(struct sb_kv_seq *seq, struct model *m,
		       const uint64_t *lo, const uint8_t *data, size_t size,
		       uint32_t pick)
{
	struct sb_kv_config c1, c2;
	const void *user, *u2;
	size_t ulen, u2len;
	struct sb_kv_seq *again;
	struct fuzz_bus_guard g;
	int r, err = 0;

	user = sb_kv_user(seq, &ulen);
	if (pick & 0x80) {
		user = size ? data : NULL;
		ulen = size < 300 ? size : 300;
	}
	r = sb_kv_save(seq, out_path, user, ulen);
	FUZZ_CHECK(r == 0 || (r == -EIO && m->any_bad) || r == -ENOMEM,
		   "sb_kv_save: %d (%s)", r, strerror(-r));
	if (r < 0)
		return;
	again = sb_kv_restore(pool, out_path, &err);
	FUZZ_CHECK(again, "restoring what sb_kv_save wrote: %d (%s)", err,
		   strerror(-err));
	sb_kv_get_config(seq, &c1);
	sb_kv_get_config(again, &c2);
	FUZZ_CHECK(
		c1.n_layers == c2.n_layers && c1.n_kv_heads == c2.n_kv_heads &&
			c1.head_dim == c2.head_dim && c1.dtype == c2.dtype &&
			c1.max_ctx == c2.max_ctx &&
			c1.lookahead == c2.lookahead && c1.flags == c2.flags &&
			!memcmp(c1.window, c2.window,
				(size_t)c1.n_layers * sizeof(int)) &&
			sb_kv_len(seq) == sb_kv_len(again) &&
			sb_kv_row_bytes(seq) == sb_kv_row_bytes(again),
		"the restored save has another geometry or length");
	u2 = sb_kv_user(again, &u2len);
	FUZZ_CHECK(u2len == ulen && (!ulen || !memcmp(u2, user, ulen)),
		   "the restored save's user blob: %zu bytes, saved %zu", u2len,
		   ulen);
	fuzz_bus_guard_on(&g);
	for (uint64_t reg = 0; reg < 2 * m->n; reg++) {
		uint64_t l = reg / 2;
		struct span s = rows_span(m, lo[l], sb_kv_len(seq));
		const char *a = region_addr(seq, reg),
			   *b = region_addr(again, reg);

		FUZZ_CHECK(sb_kv_start(seq, (int)l) ==
				   sb_kv_start(again, (int)l),
			   "layer %llu: start %zu, saved %zu",
			   (unsigned long long)l, sb_kv_start(again, (int)l),
			   sb_kv_start(seq, (int)l));
		for (uint64_t k = s.first; k < s.end; k++) {
			int bus_a, bus_b;

			if (span_skip(&s, k))
				continue;
			bus_a = fuzz_touch(a + k * PAGE);
			bus_b = fuzz_touch(b + k * PAGE);
			/* The save read every page below the length. */
			FUZZ_CHECK(!bus_a && !bus_b,
				   "region %llu page %llu after a save: "
				   "SIGBUS (%d, restored %d)",
				   (unsigned long long)reg,
				   (unsigned long long)k, bus_a, bus_b);
			FUZZ_CHECK(!memcmp(a + k * PAGE, b + k * PAGE, PAGE),
				   "region %llu page %llu: the restored save "
				   "differs",
				   (unsigned long long)reg,
				   (unsigned long long)k);
		}
	}
	fuzz_bus_guard_off(&g);
	sb_kv_destroy(again);
}

/* Everything on a restored sequence; pick says which. */
static void exercise(struct sb_kv_seq *seq, struct model *m,
		     const uint8_t *data, size_t size, uint32_t pick)
{
	uint64_t *lo = calloc(m->n, sizeof(*lo));
	uint64_t ahead, pos;
	long r;

	if (!lo)
		abort();
	for (uint64_t l = 0; l < m->n; l++)
		lo[l] = sb_kv_start(seq, (int)l);
	check_rows(seq, m, lo, "restored");
	/* What a prepare places at most: up to the lookahead, all regions. */
	ahead = m->h.lookahead ? m->h.lookahead : PAGE / m->h.row + 1;
	pos = m->h.len + 2 + ahead;
	if (pos > m->h.max_ctx)
		pos = m->h.max_ctx;
	if ((pick & 0x10) && m->h.len < m->h.max_ctx &&
	    pos * m->h.row <= GROW_CAP / (2 * m->n)) {
		grow(seq, m, lo);
		check_rows(seq, m, lo, "grown");
	}
	if (pick & 0x20) {
		r = sb_kv_evict(seq);
		FUZZ_CHECK(r >= 0 || (r == -EIO && m->any_bad) ||
				   (r == -EOPNOTSUPP && !can_wp),
			   "sb_kv_evict: %ld (%s)", r, strerror((int)-r));
		check_rows(seq, m, lo, "evicted");
	}
	if (pick & 0x40)
		round_trip(seq, m, lo, data, size, pick);
	free(lo);
}

static void try_restore(size_t size, const uint8_t *data, size_t in_size,
			uint32_t pick)
{
	struct sb_kv_seq *seq;
	struct model m;
	char why[512];
	int err = 0;

	memset(&m, 0, sizeof(m));
	if (size >= sizeof(m.h)) {
		/* Declared address space past the cap, in a header the
		 * library takes: not restored (see "Cost" above). */
		uint32_t want;
		size_t elt;
		uint64_t rs;

		memcpy(&m.h, file, sizeof(m.h));
		want = m.h.header_crc;
		m.h.header_crc = 0;
		elt = dtype_size(m.h.dtype);
		if (sbi_crc32c(&m.h, sizeof(m.h)) == want && elt &&
		    m.h.n_layers > 0 && m.h.n_kv_heads > 0 &&
		    m.h.head_dim > 0) {
			rs = (uint64_t)elt * (uint64_t)m.h.n_kv_heads *
			     (uint64_t)m.h.head_dim;
			if (rs > AS_CAP || m.h.max_ctx > AS_CAP / rs ||
			    (m.h.max_ctx * rs + PAGE) * 2 *
					    (uint64_t)m.h.n_layers >
				    AS_CAP)
				return;
		}
	}
	write_file(in_path, file, size);
	seq = sb_kv_restore(pool, in_path, &err);
	if (!seq) {
		FUZZ_CHECK(err == -EBADMSG || err == -ENOMEM ||
				   err == -EINVAL ||
				   (err == -EOPNOTSUPP && !can_wp),
			   "sb_kv_restore failed with %d (%s)", err,
			   strerror(-err));
	} else {
		FUZZ_CHECK(size >= BLOCK, "accepted a file of %zu bytes", size);
		memcpy(&m.h, file, sizeof(m.h));
		m.size = size;
		check_valid(&m);
		m.region = (m.h.max_ctx * m.h.row + PAGE - 1) / PAGE * PAGE;
		load_images(&m);
		check_seq(seq, &m);
		exercise(seq, &m, data, in_size, pick);
		sb_kv_destroy(seq);
		free(m.img);
		free(m.base);
	}
	FUZZ_CHECK(sbi_pool_verify(pool, why, sizeof(why)) == 0, "pool: %s",
		   why);
	FUZZ_CHECK(fuzz_fds_on(dir) == 0, "%d descriptors left open in %s",
		   fuzz_fds_on(dir), dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* Choices that are not part of the file: from its checksum, so an
	 * input always replays the same way. */
	uint32_t pick = sbi_crc32c(data, size);

	if (size > MAX_IN)
		return 0;
	/* Raw. */
	memcpy(file, data, size);
	try_restore(size, data, size, pick);
	/* Fixed up; the other choice of each step (a valid file, such as a
	 * seed, then goes through both). */
	if (size >= sizeof(struct kv_hdr)) {
		memcpy(file, data, size);
		fix_up(size, (pick & 3) != 0, (pick & 4) != 0);
		try_restore(size, data, size, pick ^ 0xf0);
	}
	return 0;
}
