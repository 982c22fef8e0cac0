/* Review of issue 10's atomic save (lib/save.c): saves and save files that
 * a user meets and that fail today. Each part is a child of its own:
 *  - long-name: a path whose last component is 250 bytes (legal: open(2)
 *    makes it) is refused with -ENAMETOOLONG: the temporary name
 *    ".NAME.sbsave-XXXXXX" beside it is longer than NAME_MAX;
 *  - sparse-copy: a save file copied the usual ways (cp --sparse=always,
 *    rsync -S, fallocate --dig-holes, a compressing file system) has holes
 *    where its tables hold zeros; restore refuses it with -EBADMSG although
 *    every byte reads back the same;
 *  - umask-fallback: on a file system without O_TMPFILE (NFS, vfat, older
 *    FUSE; simulated by making open(O_TMPFILE) fail with EOPNOTSUPP) the
 *    new file gets 0644 whatever the umask (fchmod ignores it), where the
 *    documentation promises "0644 less the umask";
 *  - no-proc: with no /proc mounted (a chroot, a sandbox) every save fails
 *    with -ENOENT: the O_TMPFILE is linked through /proc/self/fd. Needs
 *    root for a private mount namespace (skipped otherwise).
 */
#include "harness.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)

/* ---- a file system without O_TMPFILE ------------------------------------- */

static atomic_bool no_tmpfile;

/* Every open(2) of the library goes through here (the executable's symbol
 * wins over libc's): with no_tmpfile set, O_TMPFILE fails as on NFS. */
int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	va_list ap;

	va_start(ap, flags);
	if (flags & (O_CREAT | O_TMPFILE))
		mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	if (atomic_load(&no_tmpfile) && (flags & O_TMPFILE) == O_TMPFILE) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

/* The same for openat(2), which the library uses relative to the
 * target's directory. */
int openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;
	va_list ap;

	va_start(ap, flags);
	if (flags & (O_CREAT | O_TMPFILE))
		mode = (mode_t)va_arg(ap, int);
	va_end(ap);
	if (atomic_load(&no_tmpfile) && (flags & O_TMPFILE) == O_TMPFILE) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return (int)syscall(SYS_openat, dirfd, path, flags, mode);
}

/* ---- helpers ---------------------------------------------------------------- */

static struct sb_buf *filled(struct sb_pool *p, size_t npages, size_t nfill)
{
	struct sb_buf *b = make_buf(p, npages * PAGE, 0);

	for (size_t i = 0; i < nfill; i++)
		disk_fill((char *)sb_buf_addr(b) + i * PAGE, PAGE, 100 + i);
	return b;
}

static void check_restore(struct sb_pool *p, const char *path, size_t npages,
			  size_t nfill)
{
	int err = 0;
	struct sb_buf *r = sb_buf_restore(p, path, 0, &err);

	if (!r)
		FAIL("sb_buf_restore(%s): %s", path, strerror(-err));
	CHECK_EQ(sb_buf_length(r), npages * PAGE);
	for (size_t i = 0; i < npages; i++) {
		const char *x = (const char *)sb_buf_addr(r) + i * PAGE;
		long bad = i < nfill ? disk_check(x, PAGE, 100 + i)
				     : disk_check_zero(x, PAGE);

		if (bad >= 0)
			FAIL("restored page %zu differs at byte %ld", i, bad);
	}
	sb_buf_destroy(r);
}

/* ---- the parts ------------------------------------------------------------- */

static int long_name(void)
{
	struct sb_pool *p = make_pool(PAGE, HEAP, 0);
	struct sb_buf *b = filled(p, 4, 2);
	char path[PATH_MAX];
	size_t n = (size_t)snprintf(path, sizeof(path), "%s/", disk_dir());
	int fd;
	long r;

	memset(path + n, 'n', 250);
	path[n + 250] = 0;
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0)
		SKIP("this file system refuses a 250-byte name: %s",
		     strerror(errno));
	close(fd);
	r = sb_buf_save(b, 0, 4 * PAGE, path);
	printf("save over a file with a 250-byte name: %ld\n", r);
	CHECK_EQ(r, 0);
	check_restore(p, path, 4, 2);
	unlink(path);
	r = sb_buf_save(b, 0, 4 * PAGE, path);
	printf("save to a new file with a 250-byte name: %ld\n", r);
	CHECK_EQ(r, 0);
	check_restore(p, path, 4, 2);
	return 0;
}

/* Punch every 4 KiB block of zeros, as cp --sparse=always does. */
static size_t dig_holes(const char *path)
{
	static char blk[4096], zero[4096];
	int fd = open(path, O_RDWR);
	size_t holes = 0;
	struct stat st;

	if (fd < 0 || fstat(fd, &st) < 0)
		FAIL("open %s: %s", path, strerror(errno));
	for (off_t o = 0; o + 4096 <= st.st_size; o += 4096) {
		if (pread(fd, blk, sizeof(blk), o) != (ssize_t)sizeof(blk))
			FAIL("pread: %s", strerror(errno));
		if (memcmp(blk, zero, sizeof(blk)))
			continue;
		if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      o, 4096) < 0)
			SKIP("no hole punching here: %s", strerror(errno));
		holes++;
	}
	close(fd);
	return holes;
}

static int sparse_copy(void)
{
	struct sb_pool *p = make_pool(PAGE, HEAP, 0);
	size_t npages = 128;	/* 8 MiB: a CRC table of 8 KiB, half zeros */
	struct sb_buf *b = filled(p, npages, 1);
	char path[512];

	snprintf(path, sizeof(path), "%s/kv.sbsave", disk_dir());
	CHECK_EQ(sb_buf_save(b, 0, npages * PAGE, path), 0);
	check_restore(p, path, npages, 1);	/* as written: fine */
	printf("blocks of zeros made holes: %zu\n", dig_holes(path));
	/* Same bytes, fewer blocks allocated. */
	check_restore(p, path, npages, 1);
	return 0;
}

static int umask_fallback(void)
{
	struct sb_pool *p = make_pool(PAGE, HEAP, 0);
	struct sb_buf *b = filled(p, 4, 1);
	char path[512];
	struct stat st;

	snprintf(path, sizeof(path), "%s/private.sbsave", disk_dir());
	umask(077);
	atomic_store(&no_tmpfile, true);
	CHECK_EQ(sb_buf_save(b, 0, 4 * PAGE, path), 0);
	atomic_store(&no_tmpfile, false);
	if (stat(path, &st) < 0)
		FAIL("stat %s: %s", path, strerror(errno));
	printf("umask 077, no O_TMPFILE: the save has mode %o\n",
	       (unsigned)(st.st_mode & 0777));
	CHECK_EQ(st.st_mode & 0777, 0600);	/* 0644 less the umask */
	check_restore(p, path, 4, 1);
	return 0;
}

void __lsan_do_leak_check(void) __attribute__((weak));

static int no_proc(void)
{
	struct sb_pool *p;
	struct sb_buf *b;
	char path[512];
	long r;

	if (geteuid() != 0)
		SKIP("needs root for a mount namespace");
	if (unshare(CLONE_NEWNS) < 0 ||
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		SKIP("no private mount namespace: %s", strerror(errno));
	/* LeakSanitizer checks at exit through /proc, which this namespace
	 * is about to lose: check now, once (it then does not run again). */
	if (__lsan_do_leak_check)
		__lsan_do_leak_check();
	if (umount2("/proc", MNT_DETACH) < 0)
		SKIP("cannot unmount /proc here: %s", strerror(errno));
	if (access("/proc/self/fd", F_OK) == 0)
		SKIP("/proc is still there");
	p = make_pool(PAGE, HEAP, 0);
	b = filled(p, 4, 2);
	snprintf(path, sizeof(path), "%s/kv.sbsave", disk_dir());
	r = sb_buf_save(b, 0, 4 * PAGE, path);
	printf("save with no /proc: %ld (%s)\n", r, r < 0 ? strerror(-r) : "ok");
	CHECK_EQ(r, 0);
	check_restore(p, path, 4, 2);
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "long-name"))
		return long_name();
	if (!strcmp(name, "sparse-copy"))
		return sparse_copy();
	if (!strcmp(name, "umask-fallback"))
		return umask_fallback();
	if (!strcmp(name, "no-proc"))
		return no_proc();
	return 2;
}

static int main_test(void)
{
	static const char *const parts[] = {"long-name", "sparse-copy",
					    "umask-fallback", "no-proc"};
	int failed = 0, skipped = 0;

	require_uffd();
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		char dir[] = "/tmp/sbtest-XXXXXX", var[64];
		char *env[] = {var, NULL};
		int st, code;

		if (!mkdtemp(dir))
			FAIL("mkdtemp: %s", strerror(errno));
		snprintf(var, sizeof(var), "SBT_DIR=%s", dir);
		printf("-- %s\n", parts[i]);
		st = run_child_env(parts[i], env, 60, NULL, 0);
		disk_rm_rf(dir);
		code = child_exit_code(st);
		if (code == 77) {
			skipped++;
		} else if (code != 0) {
			fprintf(stderr, "FAILED: %s (%s %d)\n", parts[i],
				st < 0 ? "hung" : WIFSIGNALED(st) ? "signal" : "exit",
				st < 0 ? 0 : WIFSIGNALED(st) ? WTERMSIG(st) : code);
			failed++;
		}
	}
	if (failed)
		FAIL("%d part(s) failed", failed);
	if (skipped == (int)(sizeof(parts) / sizeof(parts[0])))
		SKIP("every part skipped");
	return 0;
}
