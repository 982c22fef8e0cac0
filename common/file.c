/* SPDX-License-Identifier: MIT */
/*
 * Careful opens of the programs' input and output files (file.h).
 */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int not_regular(mode_t m)
{
	return S_ISDIR(m) ? -EISDIR : -ENODEV;
}

int sbc_open_regular(const char *path, uint64_t *size)
{
	struct stat st;
	int fd, fl;

	/* Look before opening, so that a device is not even opened (opening
	 * one can have effects); fstat below settles the type for good. */
	if (stat(path, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return not_regular(st.st_mode);
	/* O_NONBLOCK: if path became a FIFO meanwhile, open(2) returns at
	 * once instead of waiting for a writer. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		int e = errno;

		close(fd);
		return S_ISREG(st.st_mode) ? -e : not_regular(st.st_mode);
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	if (size)
		*size = (uint64_t)st.st_size;
	return fd;
}

/* ---- Replacing a file ---------------------------------------------------- */

/* The directory part of path into dir ("." when it has none). */
static void dir_of(const char *path, char *dir, size_t size)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		snprintf(dir, size, ".");
	else if (slash == path)
		snprintf(dir, size, "/");
	else
		snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

static const char *base_of(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

/* The process's umask without changing it (umask(2) can only set it,
 * which would race with threads creating files). */
static mode_t current_umask(void)
{
	char line[128];
	unsigned um;
	FILE *f = fopen("/proc/self/status", "re");
	mode_t m;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "Umask: %o", &um) == 1) {
			fclose(f);
			return (mode_t)um;
		}
	if (f)
		fclose(f);
	m = umask(022);
	umask(m);
	return m;
}

int sbc_out_open(struct sbc_out *o, const char *path, mode_t mode)
{
	char dir[PATH_MAX], proc[64];
	struct stat st;

	memset(o, 0, sizeof(*o));
	o->fd = -1;
	if (strlen(path) >= sizeof(o->dest))
		return -ENAMETOOLONG;
	snprintf(o->dest, sizeof(o->dest), "%s", path);
	if (lstat(path, &st) == 0) {
		if (S_ISLNK(st.st_mode) && stat(path, &st) == 0) {
			/* Replace the link's target, keep the link. */
			if (!S_ISREG(st.st_mode))
				return -EEXIST;
			if (!realpath(path, o->dest))
				return -errno;
		} else if (!S_ISLNK(st.st_mode) && !S_ISREG(st.st_mode)) {
			/* A FIFO, a device, a directory: not ours to
			 * replace, and certainly not to unlink. */
			return -EEXIST;
		}
	} else if (errno != ENOENT) {
		return -errno;
	}
	dir_of(o->dest, dir, sizeof(dir));
	o->fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
	if (o->fd >= 0) {
		/* The commit names it through /proc; without /proc, use a
		 * named temporary instead. */
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", o->fd);
		if (access(proc, F_OK) == 0)
			return 0;
		close(o->fd);
		o->fd = -1;
	} else if (errno != EOPNOTSUPP && errno != EISDIR &&
		   errno != EINVAL) {
		return -errno;
	}
	/* No O_TMPFILE here: a hidden name beside path, which a kill -9
	 * can leave behind (path itself is intact). */
	if (snprintf(o->tmp, sizeof(o->tmp), "%s/.%s.XXXXXX", dir,
		     base_of(o->dest)) >= (int)sizeof(o->tmp))
		return -ENAMETOOLONG;
	o->fd = mkostemp(o->tmp, O_CLOEXEC);
	if (o->fd < 0) {
		int e = errno;

		o->tmp[0] = 0;
		return -e;
	}
	if (fchmod(o->fd, mode & ~current_umask()) < 0) {
		int e = errno;

		sbc_out_abort(o);
		return -e;
	}
	return 0;
}

/* Give the unnamed file a hidden name beside dest, for rename(2). */
static int name_it(struct sbc_out *o)
{
	char dir[PATH_MAX], proc[64];
	unsigned x = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);

	dir_of(o->dest, dir, sizeof(dir));
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", o->fd);
	for (int tries = 0; tries < 64; tries++) {
		x = x * 1664525u + 1013904223u;
		if (snprintf(o->tmp, sizeof(o->tmp), "%s/.%s.%08x", dir,
			     base_of(o->dest), x) >= (int)sizeof(o->tmp)) {
			o->tmp[0] = 0;
			return -ENAMETOOLONG;
		}
		if (linkat(AT_FDCWD, proc, AT_FDCWD, o->tmp,
			   AT_SYMLINK_FOLLOW) == 0)
			return 0;
		if (errno != EEXIST) {
			int e = errno;

			o->tmp[0] = 0;
			return -e;
		}
	}
	o->tmp[0] = 0;
	return -EEXIST;
}

int sbc_out_commit(struct sbc_out *o)
{
	char dir[PATH_MAX];
	struct stat st;
	int r = 0, dfd;

	if (fdatasync(o->fd) < 0)
		r = -errno;
	if (!r && !o->tmp[0])
		r = name_it(o);
	/* Look again: something that is not a regular file may have taken
	 * the path since sbc_out_open(); it stays. */
	if (!r && lstat(o->dest, &st) == 0 && !S_ISREG(st.st_mode))
		r = -EEXIST;
	if (!r && rename(o->tmp, o->dest) < 0)
		r = -errno;
	if (r) {
		sbc_out_abort(o);
		return r;
	}
	o->tmp[0] = 0;
	/* The rename itself to disk (best effort: the data already is). */
	dir_of(o->dest, dir, sizeof(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	/* The file is in place and its data on disk: nothing left to
	 * report. */
	close(o->fd);
	o->fd = -1;
	return 0;
}

void sbc_out_abort(struct sbc_out *o)
{
	if (o->tmp[0])
		unlink(o->tmp);	/* ours: made by mkostemp or linkat */
	o->tmp[0] = 0;
	if (o->fd >= 0)
		close(o->fd);
	o->fd = -1;
}

long sbc_meminfo(const char *name)
{
	char line[256];
	size_t len = strlen(name);
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, len) && line[len] == ':') {
			v = strtol(line + len + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}
