/* SPDX-License-Identifier: MIT */
/*
 * Opening what a caller names without trusting it (a FIFO would block
 * open(2) forever, a directory or a device is not a file of data), whole
 * reads and writes, O_DIRECT descriptors, and freeing a buffer's source
 * file: what buffers, save files and the disk tier share. Below them all.
 */
#include "internal.h"
#include "dproto.h"

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

void sbi_src_free(struct sbi_src *src)
{
	if (!src)
		return;
	/* A descriptor shared by several buffers (the regions of one KV
	 * save file) is closed by the last. */
	if (src->fd >= 0 &&
	    (!src->fd_refs || atomic_fetch_sub(src->fd_refs, 1) == 1)) {
		close(src->fd);
		free(src->fd_refs);
	}
	sbi_meta_free(src->tables, src->tables_len);
	free(src);
}

int sbi_file_kind(const struct stat *st, bool allow_blk)
{
	if (S_ISREG(st->st_mode) || (allow_blk && S_ISBLK(st->st_mode)))
		return 0;
	return S_ISDIR(st->st_mode) ? -EISDIR : -ENODEV;
}

int sbi_file_open_input(const char *path, bool allow_blk, struct stat *st)
{
	/* O_PATH: look at what the path names without opening it, which has
	 * effects of its own (a FIFO's open waits for a writer, or releases
	 * one; a device's driver runs). Only a regular file or a block
	 * device is then opened, and the very inode that was checked. */
	int pfd = open(path, O_PATH | O_CLOEXEC), fd, r;
	char proc[64];
	struct stat again;

	if (pfd < 0)
		return -errno;
	if (fstat(pfd, st) < 0) {
		r = -errno;
		close(pfd);
		return r;
	}
	r = sbi_file_kind(st, allow_blk);
	if (r < 0) {
		close(pfd);
		return r;
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", pfd);
	fd = open(proc, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0 && errno == ENOENT) {
		/* No /proc: by name again, and it must be the same file. */
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
		if (fd >= 0 &&
		    (fstat(fd, &again) < 0 || again.st_dev != st->st_dev ||
		     again.st_ino != st->st_ino ||
		     fcntl(fd, F_SETFL, 0) < 0)) {
			close(fd);
			close(pfd);
			return -EAGAIN;	/* replaced meanwhile */
		}
	}
	r = fd < 0 ? -errno : sbd_fd_above_std(fd, false);
	close(pfd);
	return r;
}

int sbi_file_reopen_direct(int fd, int flags)
{
	char proc[64];

	/* A second open file description of the same inode (not of the
	 * same path, which may name another file by now), with O_DIRECT:
	 * no second copy of the data in the page cache. */
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	fd = sbd_fd_above_std(open(proc, flags | O_CLOEXEC | O_DIRECT), false);
	if (fd < -1) {
		errno = -fd;
		fd = -1;
	}
	return fd;
}

int sbi_file_size(int fd, const struct stat *st, uint64_t *size)
{
	if (S_ISBLK(st->st_mode)) {
		/* fstat says 0 for a block device. */
		if (ioctl(fd, BLKGETSIZE64, size) < 0)
			return -errno;
		return 0;
	}
	*size = (uint64_t)st->st_size;
	return 0;
}

int sbi_file_write_all(int fd, const void *p, size_t n, uint64_t off)
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

int sbi_file_read_all(int fd, void *p, size_t n, uint64_t off)
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

