/* SPDX-License-Identifier: MIT */
/*
 * Buffers whose pages come from a file: a read-only view of any file
 * (sb_buf_open_file: model weights), and a writable buffer restored from a
 * sb_buf_save file (a KV cache carried over to the next run).
 *
 * The save file, all integers little-endian:
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
 * restored into a pool with another. The header is written last, after
 * the data is on disk (fdatasync): a save cut short is not a save file.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SAVE_MAGIC "SBSAVE01"
#define SAVE_VERSION 1
#define BLOCK 4096
#define BATCH 64

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

void sbi_src_free(struct sbi_src *src)
{
	if (!src)
		return;
	if (src->fd >= 0)
		close(src->fd);
	free(src->crc);
	free(src->present);
	free(src);
}

/* Open for reading, O_DIRECT when the file system takes it. */
static int open_read(const char *path, bool *direct)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);

	*direct = fd >= 0;
	if (fd < 0 && errno == EINVAL)
		fd = open(path, O_RDONLY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static struct sb_buf *fail(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

/* ---- a file as a read-only buffer -------------------------------------------- */

SB_API struct sb_buf *sb_buf_open_file(struct sb_pool *pool, const char *path,
				       uint64_t file_off, size_t len,
				       unsigned flags, int *err)
{
	struct sbi_src *src;
	struct sb_buf *buf;
	struct stat st;
	int r = 0;

	if (!pool || !path || !len || (file_off & (BLOCK - 1)) ||
	    (flags & ~SB_BUF_EVICTABLE))
		return fail(err, -EINVAL);
	if ((r = sbi_pool_check(pool)) < 0)
		return fail(err, r);
	if (!sbi_disk_get(pool, &r))
		return fail(err, r);
	src = calloc(1, sizeof(*src));
	if (!src)
		return fail(err, -ENOMEM);
	src->fd = open_read(path, &src->direct);
	if (src->fd < 0) {
		r = src->fd;
		src->fd = -1;
		goto out;
	}
	if (fstat(src->fd, &st) < 0) {
		r = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
		r = -EINVAL;
		goto out;
	}
	src->base = file_off;
	if ((uint64_t)st.st_size > file_off)
		src->size = (uint64_t)st.st_size - file_off;
	if (src->size > len)
		src->size = len;
	buf = sbi_buf_create(pool, len, SBI_BUF_RO, src, &r);
	if (!buf)
		goto out;
	/* Every page starts on disk (past the end: zeros, read as such).
	 * Under the lock, which the fault handler takes too. */
	pthread_mutex_lock(&buf->lock);
	for (size_t i = 0; i < buf->npages; i++)
		buf->pte[i] = SBI_PTE_DISK;
	pthread_mutex_unlock(&buf->lock);
	return buf;
out:
	sbi_src_free(src);
	return fail(err, r);
}

/* ---- save ----------------------------------------------------------------------- */

/* Write n bytes at off, all or an error. */
static int write_all(int fd, const void *p, size_t n, uint64_t off)
{
	for (size_t done = 0; done < n;) {
		ssize_t w = pwrite(fd, (const char *)p + done, n - done,
				   (off_t)(off + done));

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		done += (size_t)w;
	}
	return 0;
}

struct saver {
	struct sb_buf *buf;
	struct sbi_io_engine *io;
	int fd;			/* data, O_DIRECT when possible */
	uint64_t data_off;
	size_t first;		/* first page saved */
	uint64_t *present;
	uint32_t *crc;
	char *bounce;		/* BATCH pages, for data on disk */
};

/* Save pages [i, end) (end - i <= BATCH); buf->lock held. */
static int save_batch(struct saver *sv, size_t i, size_t end)
{
	struct sb_buf *buf = sv->buf;
	struct sb_pool *pool = buf->pool;
	size_t ps = pool->page_size;
	struct sbi_io *ios[BATCH];
	struct sbi_io_wait w;
	size_t n = 0;
	int r = 0;

	for (size_t k = i; k < end && r == 0; k++) {
		uint64_t pte = buf->pte[k];
		sbi_pid p = sbi_pte_pid(pte);
		char *mem;

		if (pte & SBI_PTE_IOERR) {
			r = -EIO;
			break;
		}
		if (p) {
			mem = sbi_pid_mem(pool, p - 1);
		} else if (pte & SBI_PTE_DISK) {
			mem = sv->bounce + (k - i) * ps;
			r = sbi_pagein_read_sync(buf, k, mem);
			if (r < 0) {
				r = r == -EBADMSG ? -EIO : r;
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
			ios[n]->off = sv->data_off + (k - sv->first) * ps;
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

SB_API int sb_buf_save(struct sb_buf *buf, size_t off, size_t len,
		       const char *path)
{
	struct sb_pool *pool;
	struct sbi_disk *d;
	struct saver sv = {0};
	struct save_header h = {0};
	struct sbi_span pg;
	size_t npages, ps, nblocks, bitmap_bytes, crc_bytes;
	char *head = NULL;
	int fd = -1, r = 0;

	if (!path)
		return -EINVAL;
	if ((r = sbi_check_buf(buf)) < 0 ||
	    (r = sbi_check_range(buf, off, len)) < 0)
		return r;
	pool = buf->pool;
	ps = pool->page_size;
	if (off & (ps - 1))
		return -EINVAL;
	if (!len)
		return -EINVAL;
	pg = sbi_span_touched(pool, off, len);
	npages = pg.end - pg.first;
	d = sbi_disk_get(pool, &r);
	if (!d)
		return r;
	nblocks = npages * (ps / BLOCK);
	bitmap_bytes = round_block((nblocks + 63) / 64 * 8);
	crc_bytes = round_block(nblocks * sizeof(uint32_t));
	sv.buf = buf;
	sv.fd = -1;
	sv.io = d->io;
	sv.first = pg.first;
	sv.data_off = BLOCK + bitmap_bytes + crc_bytes;
	if (posix_memalign((void **)&sv.present, BLOCK, bitmap_bytes) ||
	    posix_memalign((void **)&sv.crc, BLOCK, crc_bytes) ||
	    posix_memalign((void **)&sv.bounce, BLOCK, BATCH * ps) ||
	    posix_memalign((void **)&head, BLOCK, BLOCK)) {
		r = -ENOMEM;
		goto out;
	}
	memset(sv.present, 0, bitmap_bytes);
	memset(sv.crc, 0, crc_bytes);
	memset(head, 0, BLOCK);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	sv.fd = open(path, O_WRONLY | O_CLOEXEC | O_DIRECT);
	if (sv.fd < 0)
		sv.fd = open(path, O_WRONLY | O_CLOEXEC);
	if (sv.fd < 0) {
		r = -errno;
		goto out;
	}
	/* The full length now: trailing holes read as holes. */
	if (ftruncate(fd, (off_t)(sv.data_off + npages * ps)) < 0) {
		r = -errno;
		goto out;
	}
	/* A snapshot of the range: faults in it wait until we are done.
	 * Reads in flight finish first (they need the lock to land). */
	for (;;) {
		pthread_rwlock_rdlock(&pool->layout);
		pthread_mutex_lock(&buf->lock);
		if (!range_inflight(buf, pg.first, pg.end))
			break;
		pthread_mutex_unlock(&buf->lock);
		pthread_rwlock_unlock(&pool->layout);
		sbi_disk_wait_gen(d, sbi_disk_gen(d), 10);
	}
	for (size_t i = pg.first; i < pg.end && r == 0; i += BATCH)
		r = save_batch(&sv, i, i + BATCH < pg.end ? i + BATCH : pg.end);
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);
	if (r < 0)
		goto out;
	r = write_all(fd, sv.present, bitmap_bytes, BLOCK);
	if (r == 0)
		r = write_all(fd, sv.crc, crc_bytes, BLOCK + bitmap_bytes);
	if (r == 0 && fdatasync(sv.fd) < 0)
		r = -errno;
	if (r < 0)
		goto out;
	memcpy(h.magic, SAVE_MAGIC, sizeof(h.magic));
	h.version = SAVE_VERSION;
	h.block = BLOCK;
	h.length = (uint64_t)npages * ps;
	h.nblocks = nblocks;
	h.present_off = BLOCK;
	h.crc_off = BLOCK + bitmap_bytes;
	h.data_off = sv.data_off;
	/* One checksum over both tables, which lie back to back. */
	{
		char *tables = malloc(bitmap_bytes + crc_bytes);

		if (!tables) {
			r = -ENOMEM;
			goto out;
		}
		memcpy(tables, sv.present, bitmap_bytes);
		memcpy(tables + bitmap_bytes, sv.crc, crc_bytes);
		h.tables_crc = sbi_crc32c(tables, bitmap_bytes + crc_bytes);
		free(tables);
	}
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	memcpy(head, &h, sizeof(h));
	r = write_all(fd, head, BLOCK, 0);
	if (r == 0 && fdatasync(fd) < 0)
		r = -errno;
out:
	if (sv.fd >= 0)
		close(sv.fd);
	if (fd >= 0) {
		close(fd);
		if (r < 0)
			unlink(path);
	}
	free(sv.present);
	free(sv.crc);
	free(sv.bounce);
	free(head);
	return r;
}

/* ---- restore --------------------------------------------------------------------- */

static int read_all(int fd, void *p, size_t n, uint64_t off)
{
	for (size_t done = 0; done < n;) {
		ssize_t got = pread(fd, (char *)p + done, n - done,
				    (off_t)(off + done));

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -errno;
		if (got == 0)
			return -EBADMSG;	/* shorter than it says */
		done += (size_t)got;
	}
	return 0;
}

/* Read and check the header and tables into src. */
static int load_tables(int fd, struct sbi_src *src, uint64_t *length)
{
	struct save_header h;
	struct stat st;
	size_t bitmap_bytes, crc_bytes;
	uint32_t want;
	char *tables;
	int r;

	if (fstat(fd, &st) < 0)
		return -errno;
	if ((size_t)st.st_size < BLOCK)
		return -EBADMSG;
	r = read_all(fd, &h, sizeof(h), 0);
	if (r < 0)
		return r;
	want = h.header_crc;
	h.header_crc = 0;
	if (memcmp(h.magic, SAVE_MAGIC, sizeof(h.magic)) ||
	    h.version != SAVE_VERSION || h.block != BLOCK ||
	    sbi_crc32c(&h, sizeof(h)) != want)
		return -EBADMSG;
	if (!h.length || h.nblocks != h.length / BLOCK ||
	    h.length % BLOCK || h.nblocks > ((uint64_t)1 << 40))
		return -EBADMSG;
	bitmap_bytes = round_block((size_t)(h.nblocks + 63) / 64 * 8);
	crc_bytes = round_block((size_t)h.nblocks * sizeof(uint32_t));
	if (h.present_off != BLOCK || h.crc_off != BLOCK + bitmap_bytes ||
	    h.data_off != h.crc_off + crc_bytes ||
	    (uint64_t)st.st_size < h.data_off + h.length)
		return -EBADMSG;
	tables = malloc(bitmap_bytes + crc_bytes);
	if (!tables)
		return -ENOMEM;
	r = read_all(fd, tables, bitmap_bytes + crc_bytes, BLOCK);
	if (r == 0 && sbi_crc32c(tables, bitmap_bytes + crc_bytes) !=
			      h.tables_crc)
		r = -EBADMSG;
	if (r == 0) {
		src->present = malloc(bitmap_bytes);
		src->crc = malloc(crc_bytes);
		if (!src->present || !src->crc)
			r = -ENOMEM;
	}
	if (r == 0) {
		memcpy(src->present, tables, bitmap_bytes);
		memcpy(src->crc, tables + bitmap_bytes, crc_bytes);
		src->nblocks = (size_t)h.nblocks;
		src->base = h.data_off;
		src->size = h.length;
		src->save = true;
		*length = h.length;
	}
	free(tables);
	return r;
}

static bool page_present(const struct sbi_src *src, size_t idx, size_t ps)
{
	size_t b0 = idx * (ps / BLOCK), b1 = b0 + ps / BLOCK;

	if (b1 > src->nblocks)
		b1 = src->nblocks;
	for (size_t b = b0; b < b1; b++)
		if (src->present[b / 64] >> (b % 64) & 1)
			return true;
	return false;
}

SB_API struct sb_buf *sb_buf_restore(struct sb_pool *pool, const char *path,
				     unsigned flags, int *err)
{
	struct sbi_src *src;
	struct sb_buf *buf;
	uint64_t length = 0;
	int fd, r = 0;

	if (!pool || !path || (flags & ~(SB_BUF_STRICT | SB_BUF_EVICTABLE)))
		return fail(err, -EINVAL);
	if ((r = sbi_pool_check(pool)) < 0)
		return fail(err, r);
	if (!sbi_disk_get(pool, &r))
		return fail(err, r);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(err, -errno);
	src = calloc(1, sizeof(*src));
	if (!src) {
		close(fd);
		return fail(err, -ENOMEM);
	}
	src->fd = -1;
	r = load_tables(fd, src, &length);
	close(fd);
	if (r < 0)
		goto out;
	src->fd = open_read(path, &src->direct);
	if (src->fd < 0) {
		r = src->fd;
		src->fd = -1;
		goto out;
	}
	if (length > SIZE_MAX) {
		r = -EBADMSG;
		goto out;
	}
	buf = sbi_buf_create(pool, (size_t)length, flags, src, &r);
	if (!buf)
		goto out;
	pthread_mutex_lock(&buf->lock);
	for (size_t i = 0; i < buf->npages; i++)
		if (page_present(src, i, pool->page_size))
			buf->pte[i] = SBI_PTE_DISK;
	pthread_mutex_unlock(&buf->lock);
	return buf;
out:
	sbi_src_free(src);
	return fail(err, r);
}
