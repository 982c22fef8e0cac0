/* SPDX-License-Identifier: MIT */
/*
 * KV save files: sb_kv_save writes a whole sequence (geometry, length,
 * every region, a user blob) to one file; sb_kv_restore shows it as a new
 * sequence whose pages are read in lazily, checked, on touch or prepare.
 *
 * The format, all integers little-endian, every part 4 KiB-aligned:
 *
 *   0        header (one 4 KiB block): magic "SBKVSV01", version, the
 *            geometry (layers, KV heads, head size, element type, flags,
 *            max_ctx, lookahead, bytes per row), the length in positions,
 *            the page size it was saved with, where the table lies and
 *            its CRC-32C, the user blob's length, the file's length, and
 *            the header's own CRC-32C
 *   4096     table: start[n_layers] (uint64), offset and length of every
 *            region's image (uint64 each), window[n_layers] (int32), then
 *            the user blob
 *   ...      one sb_buf_save image (save.c) per region, K of layer l
 *            first, then its V: the pages covering rows [0, len); pages a
 *            sliding window released are holes. A region of an empty
 *            sequence has no image (offset and length 0).
 *
 * Each region is an image in the format sb_buf_save writes, so the lazy,
 * checked, hole-aware restore of save.c serves the regions too, through
 * one shared descriptor. The whole file is written unnamed and renamed
 * into place once it is durable (replace.c): a crash or a full disk
 * leaves the previous file.
 *
 * Restoring trusts nothing: the header and table are checked field by
 * field and by CRC before anything is created, geometry through the same
 * checks as sb_kv_create, and every image by save.c's own checks.
 */
#include "internal.h"
#include "kv_seq.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KV_MAGIC "SBKVSV01"
#define KV_VERSION 1
#define BLOCK 4096
/* A user blob is the caller's own small state (token ids, a sampler). */
#define MAX_USER ((uint64_t)1 << 30)
#define MAX_LAYERS 65536

struct kv_header {
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
	uint32_t header_crc;	/* of this struct with header_crc = 0 */
};

/* The table's parts, in one allocation. */
struct kv_table {
	void *mem;
	size_t len;
	int32_t *window;
	uint64_t *start;
	uint64_t (*region)[2];	/* offset, length */
	char *user;
};

static uint64_t round_block(uint64_t n)
{
	return (n + BLOCK - 1) & ~(uint64_t)(BLOCK - 1);
}

static struct sb_kv_seq *fail(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

static size_t table_bytes(size_t n_layers, uint64_t user_len)
{
	return n_layers * (sizeof(int32_t) + sizeof(uint64_t)) +
	       2 * n_layers * 2 * sizeof(uint64_t) + (size_t)user_len;
}

static int table_alloc(struct kv_table *t, size_t n_layers, uint64_t user_len)
{
	char *p;

	t->len = table_bytes(n_layers, user_len);
	/* Rounded up to whole blocks, zeroed: the file's table block. */
	t->mem = calloc(1, (size_t)round_block(t->len));
	if (!t->mem)
		return -ENOMEM;
	p = t->mem;
	t->start = (uint64_t *)p;
	p += n_layers * sizeof(uint64_t);
	t->region = (uint64_t(*)[2])p;
	p += 2 * n_layers * 2 * sizeof(uint64_t);
	t->window = (int32_t *)p;
	p += n_layers * sizeof(int32_t);
	t->user = p;
	return 0;
}

/* ---- save ----------------------------------------------------------------------- */

SB_API int sb_kv_save(struct sb_kv_seq *s, const char *path, const void *user,
		      size_t user_len)
{
	struct kv_header h = {0};
	struct kv_table t = {0};
	struct sbi_replace rep;
	size_t n_layers, npages;
	uint64_t pos, image;
	char *head = NULL;
	int data_fd = -1, r;

	if (!s || !path || !*path || (user_len && !user) ||
	    user_len > MAX_USER)
		return -EINVAL;
	n_layers = (size_t)s->cfg.n_layers;
	/* The pages holding rows [0, len): all a restore needs. */
	npages = (s->len * s->row + s->page - 1) / s->page;
	r = table_alloc(&t, n_layers, user_len);
	if (r < 0)
		return r;
	for (size_t l = 0; l < n_layers; l++) {
		t.window[l] = s->window[l];
		t.start[l] = s->start[l];
	}
	if (user_len)
		memcpy(t.user, user, user_len);
	pos = BLOCK + round_block(t.len);
	image = npages ? sbi_save_image_size(s->pool, npages) : 0;
	for (size_t g = 0; g < s->nregions; g++) {
		t.region[g][0] = npages ? pos : 0;
		t.region[g][1] = image;
		pos += image;
	}
	memcpy(h.magic, KV_MAGIC, sizeof(h.magic));
	h.version = KV_VERSION;
	h.block = BLOCK;
	h.n_layers = s->cfg.n_layers;
	h.n_kv_heads = s->cfg.n_kv_heads;
	h.head_dim = s->cfg.head_dim;
	h.dtype = (int32_t)s->cfg.dtype;
	h.flags = s->cfg.flags;
	h.max_ctx = s->cfg.max_ctx;
	h.lookahead = s->cfg.lookahead;
	h.row = s->row;
	h.len = s->len;
	h.page_size = s->page;
	h.table_off = BLOCK;
	h.table_len = t.len;
	h.user_len = user_len;
	h.file_len = pos;
	h.table_crc = sbi_crc32c(t.mem, t.len);
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	head = calloc(1, BLOCK);
	if (!head) {
		free(t.mem);
		return -ENOMEM;
	}
	memcpy(head, &h, sizeof(h));

	r = sbi_replace_begin(&rep, path);
	if (r < 0)
		goto out;
	data_fd = sbi_file_reopen_direct(rep.fd, O_WRONLY);
	if (ftruncate(rep.fd, (off_t)pos) < 0) {
		r = -errno;
		goto out;
	}
	r = sbi_file_write_all(rep.fd, head, BLOCK, 0);
	if (r == 0)
		r = sbi_file_write_all(rep.fd, t.mem, (size_t)round_block(t.len),
				       BLOCK);
	for (size_t g = 0; g < s->nregions && r == 0 && npages; g++)
		r = sbi_save_image(s->buf[g], 0, npages, rep.fd, data_fd,
				   t.region[g][0]);
	if (r == 0 && fdatasync(rep.fd) < 0)
		r = -errno;
	if (r == 0)
		r = sbi_replace_commit(&rep);
out:
	if (data_fd >= 0)
		close(data_fd);
	sbi_replace_end(&rep);
	free(head);
	free(t.mem);
	return r;
}

/* ---- restore --------------------------------------------------------------------- */

static size_t pool_page(struct sb_pool *pool)
{
	struct sb_stats st;

	return sb_pool_stats(pool, &st) == 0 ? st.page_size : 4096;
}

static bool pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

/* Read and check the header and the table. */
static int load(int fd, uint64_t size, struct kv_header *h,
		struct kv_table *t)
{
	uint32_t want;
	size_t n_layers;
	uint64_t pos;
	int r;

	if (size < BLOCK)
		return -EBADMSG;
	r = sbi_file_read_all(fd, h, sizeof(*h), 0);
	if (r < 0)
		return r;
	want = h->header_crc;
	h->header_crc = 0;
	if (memcmp(h->magic, KV_MAGIC, sizeof(h->magic)) ||
	    h->version != KV_VERSION || h->block != BLOCK ||
	    sbi_crc32c(h, sizeof(*h)) != want)
		return -EBADMSG;
	h->header_crc = want;
	if (h->n_layers <= 0 || h->n_layers > MAX_LAYERS ||
	    h->user_len > MAX_USER || h->len > h->max_ctx ||
	    h->table_off != BLOCK || h->file_len != size ||
	    !pow2(h->page_size) || h->page_size < BLOCK ||
	    h->page_size > ((uint64_t)1 << 30))
		return -EBADMSG;
	n_layers = (size_t)h->n_layers;
	if (h->table_len != table_bytes(n_layers, h->user_len) ||
	    size - BLOCK < round_block(h->table_len))
		return -EBADMSG;
	r = table_alloc(t, n_layers, h->user_len);
	if (r < 0)
		return r;
	r = sbi_file_read_all(fd, t->mem, t->len, BLOCK);
	if (r < 0)
		return r;
	if (sbi_crc32c(t->mem, t->len) != h->table_crc)
		return -EBADMSG;
	/* Regions: in order, block-aligned, inside the file, apart. */
	pos = BLOCK + round_block(t->len);
	for (size_t g = 0; g < 2 * n_layers; g++) {
		uint64_t off = t->region[g][0], len = t->region[g][1];

		/* A sequence that holds rows has an image per region. */
		if (!off && !len && !h->len)
			continue;
		if (!h->len || off % BLOCK || off < pos || off > size ||
		    len > size - off || len < BLOCK)
			return -EBADMSG;
		pos = off + len;
	}
	for (size_t l = 0; l < n_layers; l++) {
		int32_t w = t->window[l];

		/* Where the window starts: len - window, or later after a
		 * rewind; a full layer from 0. */
		if (w < 0 || (uint64_t)w > h->max_ctx || t->start[l] > h->len ||
		    (!w && t->start[l]) ||
		    (w && h->len > (uint64_t)w && t->start[l] < h->len - (uint64_t)w))
			return -EBADMSG;
	}
	return 0;
}

/* Every region from its image, or empty. */
static int restore_regions(struct sb_kv_seq *s, const struct kv_table *t,
			   int fd, int data_fd, bool direct, atomic_int *refs,
			   uint64_t saved_page)
{
	unsigned flags = sbi_kv_region_flags(&s->cfg);
	/* Never longer than the region at the page size it was saved with. */
	size_t max = (s->region + saved_page - 1) / saved_page * saved_page;
	/* The page the next row lands in is read back by the next prepare
	 * (as after sb_kv_evict), the pages before on touch. */
	size_t floor = s->len * s->row / s->page * s->page;
	int e = 0;

	s->buf = calloc(s->nregions, sizeof(*s->buf));
	if (!s->buf)
		return -ENOMEM;
	for (size_t g = 0; g < s->nregions; g++) {
		if (t->region[g][1])
			/* The image must lie within its own entry. */
			s->buf[g] = sbi_restore_image(s->pool, fd, data_fd,
						      direct, refs,
						      t->region[g][0],
						      t->region[g][1],
						      s->region, max, flags,
						      &e);
		else
			s->buf[g] = sb_buf_create(s->pool, s->region, flags,
						  &e);
		if (!s->buf[g])
			return e == -ENODATA ? -EBADMSG : e;
		/* The image covers every row held. */
		if (t->region[g][1] &&
		    sbi_buf_src_bytes(s->buf[g]) < (uint64_t)s->len * s->row)
			return -EBADMSG;
		s->placed[g] = s->asked[g] = floor;
	}
	return 0;
}

SB_API struct sb_kv_seq *sb_kv_restore(struct sb_pool *pool, const char *path,
				       int *err)
{
	struct kv_header h;
	struct kv_table t = {0};
	struct sb_kv_config cfg = {0};
	struct sb_kv_seq *s = NULL;
	atomic_int *refs = NULL;
	struct stat st;
	int fd, data_fd = -1, direct, r;

	if (!pool || !path)
		return fail(err, -EINVAL);
	if ((r = sbi_pool_check(pool)) < 0)
		return fail(err, r);
	if (!sbi_disk_get(pool, &r))
		return fail(err, r);
	fd = sbi_file_open_input(path, false, &st);
	if (fd < 0)
		return fail(err, fd);
	r = load(fd, (uint64_t)st.st_size, &h, &t);
	if (r < 0)
		goto out;
	cfg.n_layers = h.n_layers;
	cfg.n_kv_heads = h.n_kv_heads;
	cfg.head_dim = h.head_dim;
	cfg.dtype = (enum sb_kv_dtype)h.dtype;
	cfg.max_ctx = (size_t)h.max_ctx;
	/* The file's lookahead is advice from whoever wrote it: at most 16
	 * pages of rows (a hostile one would have every prepare place
	 * gigabytes ahead). */
	cfg.lookahead = (size_t)h.lookahead;
	if (h.row && h.lookahead > 16 * (uint64_t)pool_page(pool) / h.row + 16)
		cfg.lookahead = (size_t)(16 * pool_page(pool) / h.row + 16);
	cfg.flags = h.flags;
	cfg.window = t.window;
	if (h.max_ctx > SIZE_MAX || h.lookahead > SIZE_MAX) {
		r = -EBADMSG;
		goto out;
	}
	s = sbi_kv_alloc(pool, &cfg, &r);
	if (!s) {
		/* A geometry sb_kv_create refuses: damaged, or not ours. */
		if (r == -EINVAL)
			r = -EBADMSG;
		goto out;
	}
	if (s->row != h.row) {
		r = -EBADMSG;
		goto out;
	}
	s->len = (size_t)h.len;
	for (int l = 0; l < h.n_layers; l++)
		s->start[l] = (size_t)t.start[l];
	if (h.user_len) {
		s->user = malloc((size_t)h.user_len);
		if (!s->user) {
			r = -ENOMEM;
			goto out;
		}
		memcpy(s->user, t.user, (size_t)h.user_len);
		s->user_len = (size_t)h.user_len;
	}
	/* One descriptor for every region's pages (O_DIRECT when the file
	 * system takes it), never reopened by name: the path may name a
	 * newer save by then. */
	direct = sbi_file_reopen_direct(fd, O_RDONLY);
	data_fd = direct >= 0 ? direct : fcntl(fd, F_DUPFD_CLOEXEC, 3);
	refs = malloc(sizeof(*refs));
	if (data_fd < 0 || !refs) {
		r = data_fd < 0 ? -errno : -ENOMEM;
		goto out;
	}
	atomic_init(refs, 1);	/* ours, until the regions hold theirs */
	r = restore_regions(s, &t, fd, data_fd, direct >= 0, refs,
			    h.page_size);
out:
	if (refs && atomic_fetch_sub(refs, 1) == 1) {
		close(data_fd);
		free(refs);
	} else if (!refs && data_fd >= 0) {
		close(data_fd);
	}
	close(fd);
	free(t.mem);
	if (r < 0) {
		sbi_kv_free(s);
		return fail(err, r);
	}
	return s;
}

SB_API const void *sb_kv_user(const struct sb_kv_seq *s, size_t *len)
{
	if (len)
		*len = s && s->user ? s->user_len : 0;
	return s ? s->user : NULL;
}
