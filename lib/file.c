/* SPDX-License-Identifier: MIT */
/*
 * The read-only view of a file or block device (sb_buf_open_file: model
 * weights), paged in through the disk tier. Opening files carefully is in
 * fileio.c, the save format in save.c.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLOCK 4096

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
	uint64_t size;
	int fd, direct, r = 0;

	if (!pool || !path || !len || (file_off & (BLOCK - 1)) ||
	    (flags & ~SB_BUF_EVICTABLE))
		return fail(err, -EINVAL);
	if ((r = sbi_pool_check(pool)) < 0)
		return fail(err, r);
	/* Every byte of the range must have a file offset (off_t), or its
	 * reads fail with EINVAL at the first touch. */
	if (len > SIZE_MAX - (pool->page_size - 1) ||
	    file_off > (uint64_t)INT64_MAX ||
	    ((len + pool->page_size - 1) & ~(pool->page_size - 1)) >
		    (uint64_t)INT64_MAX - file_off)
		return fail(err, -EOVERFLOW);
	if (!sbi_disk_get(pool, &r))
		return fail(err, r);
	fd = sbi_file_open_input(path, true, &st);
	if (fd < 0)
		return fail(err, fd);
	r = sbi_file_size(fd, &st, &size);
	if (r < 0) {
		close(fd);
		return fail(err, r);
	}
	src = calloc(1, sizeof(*src));
	if (!src) {
		close(fd);
		return fail(err, -ENOMEM);
	}
	direct = sbi_file_reopen_direct(fd, O_RDONLY);
	if (direct >= 0) {
		close(fd);
		src->fd = direct;
		src->direct = true;
	} else {
		src->fd = fd;
	}
	src->base = file_off;
	if (size > file_off)
		src->size = size - file_off;
	if (src->size > len)
		src->size = len;
	buf = sbi_buf_create(pool, len, SBI_BUF_RO, src, &r);
	if (!buf) {
		sbi_src_free(src);
		return fail(err, r);
	}
	/* Every page starts on disk (past the end: zeros, read as such).
	 * Under the lock, which the fault handler takes too. */
	pthread_mutex_lock(&buf->lock);
	for (size_t i = 0; i < buf->npages; i++)
		buf->pte[i] = SBI_PTE_DISK;
	buf->disk_hi = buf->npages;
	pthread_mutex_unlock(&buf->lock);
	/* Pages filled and emptied in place, where the pool allows. */
	r = sbi_home_setup(buf);
	if (r < 0) {
		sb_buf_destroy(buf);
		return fail(err, r);
	}
	return buf;
}
