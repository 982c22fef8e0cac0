/* SPDX-License-Identifier: MIT */
/*
 * Files the programs read and write, opened the careful way:
 *
 *  - inputs (checkpoints, tokenizers) must be regular files, and finding
 *    out never blocks: open(2) of a FIFO with no writer waits forever, so
 *    the open is O_NONBLOCK and the type is checked before anything else;
 *  - outputs (sbgen's checkpoints) are written to a new file in the same
 *    directory and renamed over the destination only when complete, so a
 *    failure or a kill -9 leaves what the path named before intact, and
 *    nothing that was not created here is ever unlinked.
 */
#ifndef SPARSEBUF_COMMON_FILE_H
#define SPARSEBUF_COMMON_FILE_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

/* Open path read-only (O_CLOEXEC) if it is a regular file, without
 * blocking whatever it is. Returns the descriptor, in blocking mode, with
 * the file's size in *size when size is not NULL; or -errno: -EISDIR for
 * a directory, -ENODEV for anything else that is not a regular file (a
 * FIFO, a socket, a device: the errno lib/file.c uses too), the open(2)
 * or fstat(2) error. */
int sbc_open_regular(const char *path, uint64_t *size);

/* A "Name:   value" line of /proc/meminfo: the value as written (kB for
 * sizes, a count for HugePages_*), -1 when absent. (lib/config.c keeps
 * its own: the library does not link this.) */
long sbc_meminfo(const char *name);

/* A file being written to replace a path (sbc_out_open .. commit). */
struct sbc_out {
	int fd;			/* open for reading and writing */
	char dest[PATH_MAX];	/* the path to replace (symlinks resolved) */
	char tmp[PATH_MAX];	/* its temporary name; "" while unnamed */
};

/*
 * Start a file that will replace path. The new file is unnamed (O_TMPFILE)
 * or, where the file system cannot do that, a hidden ".NAME.XXXXXX" beside
 * path; either way path is not touched until sbc_out_commit(). A symlink
 * to a regular file is followed: its target is replaced. Returns 0, or
 * -errno: -EEXIST when path exists and is not a regular file (it is left
 * alone), -ENAMETOOLONG, the open(2) errors of creating a file in path's
 * directory. mode: as for open(2), less the umask.
 */
int sbc_out_open(struct sbc_out *o, const char *path, mode_t mode);

/* Flush the new file to disk, name it path (rename(2): atomic; a reader
 * sees the old file or the new one) and close it. 0, or -errno with the
 * new file dropped as by sbc_out_abort() and path left as it was. */
int sbc_out_commit(struct sbc_out *o);

/* Drop the new file: close it and remove its temporary name if it has
 * one. Never removes path. */
void sbc_out_abort(struct sbc_out *o);

#endif /* SPARSEBUF_COMMON_FILE_H */
