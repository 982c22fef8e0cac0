/* SPDX-License-Identifier: MIT */
/*
 * Replacing a file at a path atomically (what sb_buf_save does to its
 * destination): the new file is written unnamed (O_TMPFILE) in the
 * target's directory, then given a short temporary name and swapped in
 * with one rename. Until then whatever happens (an error, a full disk,
 * kill -9) leaves the old file as it was and nothing else behind; readers
 * of the old file (open descriptors) keep reading it.
 *
 * Nothing that is not a regular file is ever replaced: the target's type
 * is checked when the save starts, and again at the rename, which swaps
 * the two names (RENAME_EXCHANGE) so that what was there can be looked at
 * and swapped back if it is no longer a regular file; a target that did
 * not exist is created with RENAME_NOREPLACE. The directory is held open
 * (O_PATH) from the start, so a rename or chdir meanwhile cannot send the
 * file elsewhere. A file that is replaced keeps its mode, and its owner
 * when the caller may set it; hard links to it, ACLs and extended
 * attributes stay with the old inode.
 *
 * A new target needs no temporary name at all: the unnamed file is linked
 * straight to it (linkat fails if the name appeared meanwhile). Replacing
 * one does: a kill -9 in the few microseconds between the link and the
 * swap (or the swap and the removal of the old file) leaves a
 * ".sbsave-PID-XXXXXXXX" behind, so each save first removes such names
 * left in its directory by processes that no longer exist.
 *
 * Fallbacks, each a little less safe, for where the kernel or the file
 * system lacks something: no O_TMPFILE, or no /proc to link an unnamed
 * file through (AT_EMPTY_PATH needs a capability): the new file has its
 * temporary name from the start, so a kill -9 can leave it behind (until
 * the next save there); no RENAME_EXCHANGE / RENAME_NOREPLACE: a plain
 * rename, after the check.
 */
#include "internal.h"
#include "dproto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

#define TEMP_PREFIX ".sbsave-"

/* A name of our own in the directory: short, whatever the target's is,
 * and naming this process (see remove_leftovers). */
static void temp_name(struct sbi_replace *r, unsigned tries)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(r->tmp, sizeof(r->tmp), TEMP_PREFIX "%d-%08lx", (int)getpid(),
		 ((unsigned long)ts.tv_nsec ^ (tries * 2654435761ul)) &
			 0xfffffffful);
}

/* Temporary files that a process killed mid-save left in the directory:
 * ours by their name, and only those of processes that are gone. */
static void remove_leftovers(int dirfd)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *e;
	DIR *d;

	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((e = readdir(d))) {
		char *end;
		long pid;

		if (strncmp(e->d_name, TEMP_PREFIX, strlen(TEMP_PREFIX)))
			continue;
		pid = strtol(e->d_name + strlen(TEMP_PREFIX), &end, 10);
		if (pid <= 0 || *end != '-' || strlen(end) != 9 ||
		    (kill((pid_t)pid, 0) == 0 || errno != ESRCH))
			continue;
		unlinkat(dirfd, e->d_name, 0);
	}
	closedir(d);
}

static bool proc_fd_works(void)
{
	return access("/proc/self/fd", X_OK) == 0;
}

/* Where the file goes: the directory (held open) and the last component,
 * symlinks to a file resolved. */
static int resolve(struct sbi_replace *r, const char *path)
{
	char full[PATH_MAX], dir[PATH_MAX];
	const char *slash, *base;
	struct stat st;
	int e;

	if (stat(path, &st) == 0) {
		e = sbi_file_kind(&st, false);
		if (e < 0)
			return e;
		if (!realpath(path, full))
			return -errno;
		r->existed = true;
	} else if (errno == ENOENT) {
		/* A dangling symlink is not ours to replace. */
		if (lstat(path, &st) == 0)
			return -ENOENT;
		if (strlen(path) >= sizeof(full))
			return -ENAMETOOLONG;
		snprintf(full, sizeof(full), "%s", path);
	} else {
		return -errno;
	}
	slash = strrchr(full, '/');
	base = slash ? slash + 1 : full;
	if (!*base)
		return -EISDIR;
	if (strlen(base) > NAME_MAX)
		return -ENAMETOOLONG;
	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == full)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - full), full);
	snprintf(r->name, sizeof(r->name), "%s", base);
	r->dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (r->dirfd < 0)
		return -errno;
	if (r->existed) {
		/* What the name holds now, in the directory we hold. */
		if (fstatat(r->dirfd, r->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return errno == ENOENT ? -EAGAIN : -errno;
		e = sbi_file_kind(&st, false);
		if (e < 0)
			return e;
		r->old = st;
	}
	return 0;
}

/* The new file, named from the start (no O_TMPFILE, or no way to name an
 * unnamed one later). The kernel applies the umask to its mode. */
static int create_named(struct sbi_replace *r)
{
	for (unsigned tries = 0; tries < 100; tries++) {
		temp_name(r, tries);
		r->fd = openat(r->dirfd, r->tmp,
			       O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (r->fd >= 0) {
			r->named = true;
			r->fd = sbd_fd_above_std(r->fd, true);
			return r->fd < 0 ? r->fd : 0;
		}
		if (errno != EEXIST)
			return -errno;
	}
	return -EEXIST;
}

int sbi_replace_begin(struct sbi_replace *r, const char *path)
{
	int e;

	memset(r, 0, sizeof(*r));
	r->dirfd = r->fd = -1;
	if (!path || !*path)
		return -EINVAL;
	e = resolve(r, path);
	if (e < 0)
		return e;
	remove_leftovers(r->dirfd);
	r->fd = proc_fd_works()
			? openat(r->dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC,
				 0644)
			: -1;
	if (r->fd >= 0 && (r->fd = sbd_fd_above_std(r->fd, true)) < 0)
		return r->fd;
	if (r->fd < 0) {
		if (proc_fd_works() && errno != EOPNOTSUPP &&
		    errno != EISDIR && errno != EINVAL)
			return -errno;	/* a real error: EACCES, ENOSPC */
		e = create_named(r);
		if (e < 0)
			return e;
	}
	if (r->existed) {
		/* The file it replaces keeps its owner (where we may set it)
		 * and its mode: a 0600 file stays private. Owner first: a
		 * chown clears set-id bits. */
		if ((r->old.st_uid != geteuid() ||
		     r->old.st_gid != getegid()) &&
		    fchown(r->fd, r->old.st_uid, r->old.st_gid) < 0) {
			/* Not allowed: the new file is the caller's. */
		}
		if (fchmod(r->fd, r->old.st_mode & 07777) < 0)
			return -errno;
	}
	return 0;
}

/* Give the unnamed file a name: 0, or -errno (-EEXIST: taken). */
static int link_as(struct sbi_replace *r, const char *name)
{
	char proc[64];

	if (linkat(r->fd, "", r->dirfd, name, AT_EMPTY_PATH) == 0)
		return 0;
	if (errno == EEXIST)
		return -EEXIST;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", r->fd);
	return linkat(AT_FDCWD, proc, r->dirfd, name, AT_SYMLINK_FOLLOW) == 0
		       ? 0
		       : -errno;
}

/* Give the unnamed file its temporary name. */
static int link_tmp(struct sbi_replace *r)
{
	for (unsigned tries = 0; tries < 100; tries++) {
		int e;

		temp_name(r, tries);
		e = link_as(r, r->tmp);
		if (e == 0) {
			r->named = true;
			return 0;
		}
		if (e != -EEXIST)
			return e;
	}
	return -EEXIST;
}

/* Swap the new file in over a regular file. What was swapped out is looked
 * at: if it is not a regular file (replaced meanwhile), it goes back. */
static int swap_in(struct sbi_replace *r)
{
	struct stat st;
	int e;

	if (renameat2(r->dirfd, r->tmp, r->dirfd, r->name, RENAME_EXCHANGE) <
	    0) {
		if (errno != EINVAL)
			return -errno;
		/* No exchange here: the check at the start stands. */
		if (renameat(r->dirfd, r->tmp, r->dirfd, r->name) < 0)
			return -errno;
		r->named = false;
		return 0;
	}
	if (fstatat(r->dirfd, r->tmp, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    (e = sbi_file_kind(&st, false)) < 0) {
		renameat2(r->dirfd, r->tmp, r->dirfd, r->name, RENAME_EXCHANGE);
		return e;
	}
	/* Our file is the target now; the old one goes, as with rename. */
	r->named = false;
	unlinkat(r->dirfd, r->tmp, 0);
	return 0;
}

int sbi_replace_commit(struct sbi_replace *r)
{
	struct stat st;
	int e = 0, dfd;

	if (!r->named && !r->existed) {
		/* A new target: the unnamed file takes its name at once, with
		 * no temporary name for a kill to leave behind. */
		e = link_as(r, r->name);
		if (e == 0) {
			goto durable;
		}
		if (e != -EEXIST)
			return e;
		/* Something appeared meanwhile: replace it only if it is a
		 * regular file. */
		if (fstatat(r->dirfd, r->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return -errno;
		e = sbi_file_kind(&st, false);
		if (e < 0)
			return e;
		r->existed = true;
	}
	if (!r->named && (e = link_tmp(r)) < 0)
		return e;
	if (!r->existed) {
		if (renameat2(r->dirfd, r->tmp, r->dirfd, r->name,
			      RENAME_NOREPLACE) == 0) {
			r->named = false;
		} else if (errno == EINVAL) {
			if (renameat(r->dirfd, r->tmp, r->dirfd, r->name) < 0)
				return -errno;
			r->named = false;
		} else if (errno != EEXIST) {
			return -errno;
		} else {
			/* Something appeared meanwhile: replace it only if
			 * it is a regular file. */
			if (fstatat(r->dirfd, r->name, &st,
				    AT_SYMLINK_NOFOLLOW) < 0)
				return -errno;
			e = sbi_file_kind(&st, false);
			if (e < 0)
				return e;
			e = swap_in(r);
		}
	} else {
		e = swap_in(r);
	}
	if (e < 0)
		return e;
durable:
	/* The rename is durable once the directory is. */
	dfd = openat(r->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		if (fsync(dfd) < 0) {
			/* The data is safe; only the name may lag. */
		}
		close(dfd);
	}
	return 0;
}

void sbi_replace_end(struct sbi_replace *r)
{
	if (r->fd >= 0)
		close(r->fd);
	if (r->named)
		unlinkat(r->dirfd, r->tmp, 0);	/* ours, never the target */
	if (r->dirfd >= 0)
		close(r->dirfd);
	r->fd = r->dirfd = -1;
	r->named = false;
}
