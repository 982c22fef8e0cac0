/* SPDX-License-Identifier: MIT */
/*
 * Save files: sb_buf_save writes a range of a buffer to a file,
 * sb_buf_restore shows such a file as a writable buffer whose pages are
 * read in lazily (a KV cache carried over to the next run).
 *
 * The format, all integers little-endian:
 *
 *   0       header (one 4 KiB block): magic "SBSAVE01", version, block size
 *           (4096), length in bytes, number of blocks, offsets of the
 *           tables and of the data, the CRC-32C of the tables, and the
 *           header's own CRC-32C
 *   4096    presence bitmap, one bit per block (0: a hole, reads as zeros)
 *   ...     CRC-32C of every block (0 for holes)
 *   data    the blocks, at data_off + block * 4096; holes are file holes
 *
 * Checksums are per 4 KiB block, so a file saved with one page size can be
 * restored into a pool with another.
 *
 * A save is atomic (replace.c): the new file is written unnamed beside the
 * destination, made durable (data, then tables and header), and swapped
 * in by one rename. Whatever happens before (an error, a full disk,
 * kill -9) leaves the previous file as it was and nothing else behind; a
 * buffer restored from the previous file keeps reading it (its descriptor
 * holds the old inode), so "restore, continue, save to the same path"
 * loses nothing. A destination that is not a regular file is refused,
 * never replaced.
 *
 * Restoring trusts nothing in the file: the header is checked field by
 * field; the tables are read only where the file holds data (its holes
 * read as zeros, their CRC computed without reading them), into memory
 * that costs nothing until written, so a sparse file of a few KiB that
 * declares a terabyte costs what it holds, and a save file copied sparsely
 * restores as it was; every block is checked against its CRC when read.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SAVE_MAGIC "SBSAVE01"
#define SAVE_VERSION 1
#define BLOCK 4096
#define BATCH 64
/* 2^40 blocks: 4 PiB, beyond any address space. */
#define MAX_BLOCKS ((uint64_t)1 << 40)

struct save_header {
	char magic[8];
	uint32_t version;
	uint32_t block;
	uint64_t length;
	uint64_t nblocks;
	uint64_t present_off;
	uint64_t crc_off;
	uint64_t data_off;
	uint32_t tables_crc;
	uint32_t header_crc;	/* of this struct with header_crc = 0 */
};

static size_t round_block(size_t n)
{
	return (n + BLOCK - 1) & ~(size_t)(BLOCK - 1);
}

static struct sb_buf *fail(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

/* ---- save ----------------------------------------------------------------------- */

struct saver {
	struct sb_buf *buf;
	struct sbi_io_engine *io;
	int fd;			/* data, O_DIRECT when possible */
	uint64_t base;		/* file offset of the image */
	uint64_t data_off;	/* from base */
	size_t first;		/* first page saved */
	uint64_t *present;
	uint32_t *crc;
	char *bounce;		/* BATCH pages, for data on disk */
};

/* Save pages [i, end) (end - i <= BATCH); buf->lock held. */
static int save_batch(struct saver *sv, size_t i, size_t end)
{
	SBI_HELD(&sv->buf->lock);
	struct sb_buf *buf = sv->buf;
	struct sb_pool *pool = buf->pool;
	size_t ps = pool->page_size;
	struct sbi_io *ios[BATCH];
	struct sbi_io_wait w;
	size_t n = 0;
	int r = 0;

	for (size_t k = i; k < end && r == 0; k++) {
		uint64_t pte = buf->pte[k];
		char *mem;

		/* A failed read: the spill copy (kept for that, pagein.c) or
		 * the file's page is read once more. */
		if ((pte & SBI_PTE_IOERR) && !sbi_pte_slot1(pte) && !buf->src) {
			r = -EIO;
			break;
		}
		if (sbi_pte_has_page(pte)) {
			mem = sbi_pid_mem(pool, sbi_pte_page(pte));
		} else if (pte & (SBI_PTE_DISK | SBI_PTE_IOERR)) {
			mem = sv->bounce + (k - i) * ps;
			r = sbi_pagein_read_sync(buf, k, mem);
			if (r < 0) {
				/* Lost (damaged, cut short): not savable. */
				if (r == -EBADMSG || r == -ENODATA)
					r = -EIO;
				break;
			}
		} else {
			continue;	/* nothing there: a hole */
		}
		for (size_t b = 0; b < ps; b += BLOCK) {
			size_t blk = ((k - sv->first) * ps + b) / BLOCK;

			sv->present[blk / 64] |= 1ull << (blk % 64);
			sv->crc[blk] = sbi_crc32c(mem + b, BLOCK);
		}
		ios[n] = sbi_io_get(sv->io);
		if (!ios[n])
			r = -ENOMEM;
		else {
			ios[n]->write = true;
			ios[n]->fd = sv->fd;
			ios[n]->mem = mem;
			ios[n]->len = ps;
			ios[n]->off = sv->base + sv->data_off + (k - sv->first) * ps;
			ios[n]->done = sbi_io_wait_done;
			ios[n]->wait = &w;
			n++;
		}
	}
	if (!n)
		return r;
	sbi_io_wait_init(&w, n);	/* before any request can finish */
	if (r < 0) {
		for (size_t k = 0; k < n; k++)
			sbi_io_put(sv->io, ios[k]);
		pthread_mutex_destroy(&w.lock);
		pthread_cond_destroy(&w.cond);
		return r;
	}
	sbi_io_submit(sv->io, ios, n);
	r = sbi_io_wait(&w);
	for (size_t k = 0; k < n; k++)
		sbi_io_put(sv->io, ios[k]);
	return r;
}

static bool range_inflight(struct sb_buf *buf, size_t first, size_t end)
{
	for (size_t i = first; i < end; i++)
		if (buf->pte[i] & SBI_PTE_INFLIGHT)
			return true;
	return false;
}

/* The data of pages [first, end), under the buffer's lock: a snapshot of
 * the range (faults in it wait until we are done). Reads in flight finish
 * first (they need the lock to land). */
static int save_data(struct saver *sv, struct sbi_disk *d, size_t first,
		     size_t end)
{
	struct sb_buf *buf = sv->buf;
	struct sb_pool *pool = buf->pool;
	int r = 0;

	for (;;) {
		pthread_rwlock_rdlock(&pool->layout);
		pthread_mutex_lock(&buf->lock);
		if (!range_inflight(buf, first, end))
			break;
		pthread_mutex_unlock(&buf->lock);
		pthread_rwlock_unlock(&pool->layout);
		sbi_disk_wait_until(d, sbi_disk_gen(d) + 1, 10);
	}
	for (size_t i = first; i < end && r == 0; i += BATCH) {
		size_t e = i + BATCH < end ? i + BATCH : end;

		r = save_batch(sv, i, e);
		/* Read through the pool side: leave it without entries. */
		for (size_t k = i; k < e; k++)
			if (sbi_pte_has_page(buf->pte[k]))
				sbi_pid_unmap_pool(pool,
						   sbi_pte_page(buf->pte[k]));
	}
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);
	return r;
}

/* The tables and the header, after the data. Not made durable here: the
 * caller syncs the whole file once before its rename makes it visible
 * (until then nobody can see it, so nothing needs ordering). */
static int save_tables(int fd, const struct saver *sv, size_t npages,
		       size_t ps, size_t bitmap_bytes, size_t crc_bytes)
{
	struct save_header h = {0};
	char *head;
	int r;

	r = sbi_file_write_all(fd, sv->present, bitmap_bytes, sv->base + BLOCK);
	if (r == 0)
		r = sbi_file_write_all(fd, sv->crc, crc_bytes,
				       sv->base + BLOCK + bitmap_bytes);
	if (r < 0)
		return r;
	memcpy(h.magic, SAVE_MAGIC, sizeof(h.magic));
	h.version = SAVE_VERSION;
	h.block = BLOCK;
	h.length = (uint64_t)npages * ps;
	h.nblocks = h.length / BLOCK;
	h.present_off = BLOCK;
	h.crc_off = BLOCK + bitmap_bytes;
	h.data_off = sv->data_off;
	/* One checksum over both tables, which lie back to back (and are
	 * allocated back to back, see sbi_save_image). */
	h.tables_crc = sbi_crc32c(sv->present, bitmap_bytes + crc_bytes);
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	head = calloc(1, BLOCK);
	if (!head)
		return -ENOMEM;
	memcpy(head, &h, sizeof(h));
	r = sbi_file_write_all(fd, head, BLOCK, sv->base);
	free(head);
	return r;
}

static void image_sizes(size_t npages, size_t ps, size_t *bitmap_bytes,
			size_t *crc_bytes)
{
	size_t nblocks = npages * (ps / BLOCK);

	*bitmap_bytes = round_block((nblocks + 63) / 64 * 8);
	*crc_bytes = round_block(nblocks * sizeof(uint32_t));
}

uint64_t sbi_save_image_size(const struct sb_pool *pool, size_t npages)
{
	size_t bitmap_bytes, crc_bytes;

	image_sizes(npages, pool->page_size, &bitmap_bytes, &crc_bytes);
	return BLOCK + bitmap_bytes + crc_bytes +
	       (uint64_t)npages * pool->page_size;
}

int sbi_save_image(struct sb_buf *buf, size_t first, size_t npages, int fd,
		   int data_fd, uint64_t base)
{
	struct sb_pool *pool = buf->pool;
	size_t ps = pool->page_size;
	struct saver sv = {0};
	struct sbi_disk *d;
	size_t bitmap_bytes, crc_bytes;
	char *tables = NULL;
	int r = 0;

	d = sbi_disk_get(pool, &r);
	if (!d)
		return r;
	image_sizes(npages, ps, &bitmap_bytes, &crc_bytes);
	sv.buf = buf;
	sv.io = d->io;
	sv.first = first;
	sv.fd = data_fd >= 0 ? data_fd : fd;
	sv.base = base;
	sv.data_off = BLOCK + bitmap_bytes + crc_bytes;
	/* The two tables in one allocation, as they lie in the file. */
	if (posix_memalign((void **)&tables, BLOCK, bitmap_bytes + crc_bytes) ||
	    posix_memalign((void **)&sv.bounce, BLOCK, BATCH * ps)) {
		r = -ENOMEM;
		goto out;
	}
	memset(tables, 0, bitmap_bytes + crc_bytes);
	sv.present = (uint64_t *)tables;
	sv.crc = (uint32_t *)(tables + bitmap_bytes);
	r = save_data(&sv, d, first, first + npages);
	if (r == 0)
		r = save_tables(fd, &sv, npages, ps, bitmap_bytes, crc_bytes);
out:
	free(tables);
	free(sv.bounce);
	return r;
}

SB_API int sb_buf_save(struct sb_buf *buf, size_t off, size_t len,
		       const char *path)
{
	struct sbi_replace t;
	int data_fd = -1;
	struct sbi_span pg;
	size_t npages;
	int r = 0;

	if (!path || !*path)
		return -EINVAL;
	if ((r = sbi_check_buf(buf)) < 0 ||
	    (r = sbi_check_range(buf, off, len)) < 0)
		return r;
	if ((off & (buf->pool->page_size - 1)) || !len)
		return -EINVAL;
	if (!sbi_disk_get(buf->pool, &r))
		return r;
	pg = sbi_span_touched(buf->pool, off, len);
	npages = pg.end - pg.first;
	r = sbi_replace_begin(&t, path);
	if (r < 0)
		goto out;
	/* The data through a second description of the new file, with
	 * O_DIRECT where the file system takes it. */
	data_fd = sbi_file_reopen_direct(t.fd, O_WRONLY);
	/* The full length now: trailing holes read as holes. */
	if (ftruncate(t.fd, (off_t)sbi_save_image_size(buf->pool, npages)) < 0) {
		r = -errno;
		goto out;
	}
	r = sbi_save_image(buf, pg.first, npages, t.fd, data_fd, 0);
	/* One file, whichever description wrote it: durable before the
	 * rename shows it. */
	if (r == 0 && fdatasync(t.fd) < 0)
		r = -errno;
	if (r == 0)
		r = sbi_replace_commit(&t);
out:
	if (data_fd >= 0)
		close(data_fd);
	sbi_replace_end(&t);
	return r;
}

/* ---- restore --------------------------------------------------------------------- */

/* Data extents of the bitmap that were read: mark_present looks only
 * there (the rest of the bitmap is holes, zeros). */
struct extents {
	uint64_t (*e)[2];	/* offset, length */
	size_t n, cap;
};

static int extents_add(struct extents *x, uint64_t off, uint64_t len)
{
	if (x->n == x->cap) {
		size_t cap = x->cap ? 2 * x->cap : 16;
		void *e = realloc(x->e, cap * sizeof(x->e[0]));

		if (!e)
			return -ENOMEM;
		x->e = e;
		x->cap = cap;
	}
	x->e[x->n][0] = off;
	x->e[x->n][1] = len;
	x->n++;
	return 0;
}

/*
 * Read the tables [BLOCK, data_off) into memory that reads as zeros until
 * written, extent by extent: the file's holes (SEEK_DATA, SEEK_HOLE) are
 * not read, their CRC is computed in O(log n). A save file copied into a
 * sparse file (cp --sparse=always) keeps working, and a few KiB of file
 * that declare a terabyte cost what they hold. Where the file system
 * cannot tell holes from data, everything is read.
 */
static int read_tables(int fd, uint64_t base, const struct save_header *h,
		       char *tables, size_t bitmap_bytes, struct extents *bx)
{
	uint64_t pos = BLOCK, end = h->data_off;
	uint32_t crc = 0;
	int r;

	while (pos < end) {
		off_t d = lseek(fd, (off_t)(base + pos), SEEK_DATA), e;

		if (d < 0)
			d = errno == ENXIO ? (off_t)end : (off_t)pos;
		else
			d -= (off_t)base;
		if ((uint64_t)d > end)
			d = (off_t)end;
		if ((uint64_t)d < pos)
			d = (off_t)pos;
		crc = sbi_crc32c_zeros(crc, (uint64_t)d - pos);
		pos = (uint64_t)d;
		if (pos >= end)
			break;
		e = lseek(fd, (off_t)(base + pos), SEEK_HOLE);
		if (e >= 0)
			e -= (off_t)base;
		if (e < 0 || (uint64_t)e > end || (uint64_t)e <= pos)
			e = (off_t)end;
		r = sbi_file_read_all(fd, tables + (pos - BLOCK),
				      (uint64_t)e - pos, base + pos);
		if (r < 0)
			return r;
		crc = sbi_crc32c_update(crc, tables + (pos - BLOCK),
					(uint64_t)e - pos);
		if (pos - BLOCK < bitmap_bytes) {
			uint64_t to = (uint64_t)e - BLOCK < bitmap_bytes
					      ? (uint64_t)e - BLOCK
					      : bitmap_bytes;

			r = extents_add(bx, pos - BLOCK, to - (pos - BLOCK));
			if (r < 0)
				return r;
		}
		pos = (uint64_t)e;
	}
	return crc == h->tables_crc ? 0 : -EBADMSG;
}

/* Read and check the header and tables into src. */
static int load_tables(int fd, uint64_t base, uint64_t limit,
		       struct sbi_src *src, uint64_t *length,
		       struct extents *bx)
{
	struct save_header h;
	size_t bitmap_bytes, crc_bytes;
	uint32_t want;
	int r;

	if (limit < BLOCK)
		return -EBADMSG;
	r = sbi_file_read_all(fd, &h, sizeof(h), base);
	if (r < 0)
		return r;
	want = h.header_crc;
	h.header_crc = 0;
	if (memcmp(h.magic, SAVE_MAGIC, sizeof(h.magic)) ||
	    h.version != SAVE_VERSION || h.block != BLOCK ||
	    sbi_crc32c(&h, sizeof(h)) != want)
		return -EBADMSG;
	h.header_crc = want;
	if (!h.length || h.length % BLOCK || h.nblocks != h.length / BLOCK ||
	    h.nblocks > MAX_BLOCKS || h.length > SIZE_MAX)
		return -EBADMSG;
	bitmap_bytes = round_block((size_t)(h.nblocks + 63) / 64 * 8);
	crc_bytes = round_block((size_t)h.nblocks * sizeof(uint32_t));
	if (h.present_off != BLOCK || h.crc_off != BLOCK + bitmap_bytes ||
	    h.data_off != h.crc_off + crc_bytes ||
	    limit < h.data_off || limit - h.data_off < h.length)
		return -EBADMSG;
	src->tables_len = bitmap_bytes + crc_bytes;
	src->tables = sbi_meta_alloc(src->tables_len, false);
	if (!src->tables) {
		src->tables_len = 0;
		return -ENOMEM;
	}
	r = read_tables(fd, base, &h, src->tables, bitmap_bytes, bx);
	if (r < 0)
		return r;
	src->present = src->tables;
	src->crc = (uint32_t *)((char *)src->tables + bitmap_bytes);
	src->nblocks = (size_t)h.nblocks;
	src->base = base + h.data_off;
	src->size = h.length;
	src->save = true;
	*length = h.length;
	return 0;
}

/* Mark the pages that hold data (a present block) as on disk; the rest
 * stay empty (holes read as zeros). Only the bitmap's data extents are
 * looked at, a word at a time. */
static void mark_present(struct sb_buf *buf, const struct sbi_src *src,
			 const struct extents *bx)
{
	size_t per = buf->pool->page_size / BLOCK;	/* blocks per page */
	size_t nwords = (src->nblocks + 63) / 64;

	for (size_t x = 0; x < bx->n; x++) {
		size_t w0 = (size_t)(bx->e[x][0] / 8);
		size_t w1 = (size_t)((bx->e[x][0] + bx->e[x][1] + 7) / 8);

		for (size_t w = w0; w < w1 && w < nwords; w++) {
			uint64_t bits = src->present[w];

			while (bits) {
				size_t blk = w * 64 +
					     (size_t)__builtin_ctzll(bits);
				size_t page = blk / per;

				if (blk >= src->nblocks)
					break;
				buf->pte[page] = SBI_PTE_DISK;
				if (page >= buf->disk_hi)
					buf->disk_hi = page + 1;
				/* Skip the rest of this page's blocks. */
				if ((page + 1) * per >= (w + 1) * 64)
					break;
				bits &= ~0ull << ((page + 1) * per - w * 64);
			}
		}
	}
}

/* A strict buffer's range is registered with the SIGBUS uffd: a touch of
 * a page that is in the file must reach the handler instead, which reads
 * it in (as for a strict buffer's evicted page). Layout and buffer locks
 * held; nobody has the buffer yet. */
static int strict_pages_in(struct sb_buf *buf)
{
	for (size_t i = 0; i < buf->npages;) {
		size_t j = i;
		int r;

		if (!(buf->pte[i] & SBI_PTE_DISK)) {
			i++;
			continue;
		}
		while (j < buf->npages && (buf->pte[j] & SBI_PTE_DISK))
			j++;
		r = sbi_vma_unplace_uffd(buf, i, j - i, buf->pool->uffd);
		if (r < 0)
			return r;
		i = j;
	}
	return 0;
}

struct sb_buf *sbi_restore_image(struct sb_pool *pool, int table_fd,
				 int data_fd, bool direct,
				 atomic_int *fd_refs, uint64_t base,
				 uint64_t limit, size_t min_length,
				 size_t max_length, unsigned flags, int *err)
{
	struct sbi_src *src;
	struct sb_buf *buf;
	struct extents bx = {0};
	uint64_t length = 0;
	int r;

	src = calloc(1, sizeof(*src));
	if (!src) {
		if (!fd_refs)
			close(data_fd);
		return fail(err, -ENOMEM);
	}
	/* From here src holds data_fd (or a reference to it). */
	src->fd = data_fd;
	src->direct = direct;
	src->fd_refs = fd_refs;
	if (fd_refs)
		atomic_fetch_add(fd_refs, 1);
	r = load_tables(table_fd, base, limit, src, &length, &bx);
	if (r == 0 && max_length && length > max_length)
		r = -EBADMSG;
	if (r < 0)
		goto out;
	buf = sbi_buf_create(pool, length > min_length ? (size_t)length
						       : min_length,
			     flags, src, &r);
	if (!buf)
		goto out;
	pthread_rwlock_rdlock(&pool->layout);
	pthread_mutex_lock(&buf->lock);
	mark_present(buf, src, &bx);
	r = flags & SB_BUF_STRICT ? strict_pages_in(buf) : 0;
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);
	free(bx.e);
	if (r < 0) {
		sb_buf_destroy(buf);	/* frees src */
		return fail(err, r);
	}
	return buf;
out:
	free(bx.e);
	sbi_src_free(src);
	return fail(err, r);
}

SB_API struct sb_buf *sb_buf_restore(struct sb_pool *pool, const char *path,
				     unsigned flags, int *err)
{
	struct sb_buf *buf;
	struct stat st;
	int fd, data_fd, direct, r = 0;

	if (!pool || !path || (flags & ~(SB_BUF_STRICT | SB_BUF_EVICTABLE)))
		return fail(err, -EINVAL);
	if ((r = sbi_pool_check(pool)) < 0)
		return fail(err, r);
	if (!sbi_disk_get(pool, &r))
		return fail(err, r);
	fd = sbi_file_open_input(path, false, &st);
	if (fd < 0)
		return fail(err, fd);
	/* Pages are read through a second description of the same file
	 * (never reopened by name: the path may name a newer save by then),
	 * O_DIRECT when the file system takes it; the tables through the
	 * first. */
	direct = sbi_file_reopen_direct(fd, O_RDONLY);
	data_fd = direct >= 0 ? direct : fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (data_fd < 0) {
		r = -errno;
		close(fd);
		return fail(err, r);
	}
	buf = sbi_restore_image(pool, fd, data_fd, direct >= 0, NULL, 0,
				(uint64_t)st.st_size, 0, 0, flags, &r);
	close(fd);
	return buf ? buf : fail(err, r);
}
