/* The disk tier, a full spill disk: with the spill directory on a 1 MiB
 * tmpfs, and again on an ext4 file system with 1 MiB left (O_DIRECT, slots
 * preallocated), evicting 2 MiB fails with -ENOSPC and every page of the range stays
 * resident with its data (no page-in needed, no spill space kept); the
 * process keeps working (a smaller eviction fits and reads back, new pages
 * place, the pool verifies); destroying the pool lets go of the file
 * system; a page left mapped by the failed eviction and then cleared from
 * the page tables (MADV_DONTNEED) reads back; an eviction that finds the
 * file system full while freed slots still hold blocks gives them back and
 * fits. Needs root to mount (skipped
 * otherwise, with the reason). Runs with both pagers (io_uring and
 * SPARSEBUF_PAGER=sync). */
#include "harness.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)
#define N 32	/* 2 MiB */

static char mnt[600];

static uint64_t seed_of(unsigned tag, size_t page)
{
	return ((uint64_t)tag << 32) | page;
}

static void check_pages(const char *x, size_t first, size_t n, unsigned tag)
{
	for (size_t i = first; i < first + n; i++) {
		long bad = disk_check(x + i * PAGE, PAGE, seed_of(tag, i));

		if (bad >= 0)
			FAIL("page %zu differs at byte %ld", i, bad);
	}
}

/* On any exit of the child (a failed CHECK included): let go of the mount. */
static void unmount_mnt(void)
{
	if (mnt[0])
		umount2(mnt, MNT_DETACH);
}

/* Bytes free on the spill file system. */
static size_t fs_free(void)
{
	struct statvfs v;

	CHECK(statvfs(mnt, &v) == 0);
	return (size_t)v.f_bavail * v.f_frsize;
}

/*
 * Slots freed by page-ins keep their blocks until the disk tier has been
 * quiet for 100 ms (spill.c). An eviction that finds the file system full
 * meanwhile gives those blocks back itself and tries again: it succeeds
 * where the room is there. Pages 0-3 go out and back (their slots punched
 * after a rest), then pages 4-7 (their slots 4-7 due, 256 KiB held); a
 * file leaves 128 KiB free; pages 8-11 take the punched slots 0-3, need
 * 256 KiB, find 128: -ENOSPC, then the due slots are punched and the
 * second try fits.
 */
static void due_slots_make_room(void)
{
	struct sb_pool *p = disk_pool_in(PAGE, HEAP, 0, mnt);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0);
	char *x = sb_buf_addr(b), path[700];
	size_t room;
	int fd;

	CHECK_EQ(sb_buf_map(b, 0, 12 * PAGE), 12);
	/* Each touch reads its own page only. */
	CHECK_EQ(sb_buf_advise(b, 0, 12 * PAGE, SB_ADVICE_RANDOM), 12);
	for (size_t i = 0; i < 12; i++)
		disk_fill(x + i * PAGE, PAGE, seed_of(81, i));
	CHECK_EQ(sb_buf_evict(b, 0, 8 * PAGE), 8);
	check_pages(x, 0, 4, 81);	/* slots 0-3 due */
	usleep(400000);			/* quiet: punched */
	check_pages(x, 4, 4, 81);	/* slots 4-7 due, blocks held */
	room = fs_free();
	CHECK(room >= 128 * KiB);
	snprintf(path, sizeof(path), "%s/filler", mnt);
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	CHECK(fd >= 0);
	CHECK(fallocate(fd, 0, 0, (off_t)(room - 128 * KiB)) == 0);
	close(fd);
	CHECK_EQ(sb_buf_evict(b, 8 * PAGE, 4 * PAGE), 4);
	check_pages(x, 0, 12, 81);
	unlink(path);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	printf("a full spill file system: freed slots' blocks given back, "
	       "the eviction fits\n");
}

/* mnt: a 1 MiB tmpfs (no O_DIRECT: the spill file is written through the
 * page cache), or an ext4 file system on a loop device with 1 MiB left
 * (O_DIRECT: slots get their blocks by fallocate before the write, and
 * that is where the file system says it is full). */
static void mount_tmpfs(void)
{
	if (mount("none", mnt, "tmpfs", 0, "size=1m,mode=0700") < 0) {
		int e = errno;

		mnt[0] = 0;
		SKIP("cannot mount a 1 MiB tmpfs: %s", strerror(e));
	}
}

static void mount_ext4(void)
{
	char cmd[4000], img[700], path[700];
	size_t room;
	int fd;

	snprintf(img, sizeof(img), "%s/ext4.img", disk_dir());
	snprintf(cmd, sizeof(cmd),
		 "truncate -s 16M %s && mkfs.ext4 -q -F -m 0 %s >/dev/null 2>&1"
		 " && mount -o loop %s %s 2>/dev/null",
		 img, img, img, mnt);
	if (system(cmd) != 0) {
		mnt[0] = 0;
		SKIP("cannot make and mount an ext4 image on a loop device "
		     "(mkfs.ext4, a loop device, root)");
	}
	/* Leave 1 MiB, as the tmpfs has. */
	room = fs_free();
	CHECK(room > 1 * MiB);
	snprintf(path, sizeof(path), "%s/base", mnt);
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	CHECK(fd >= 0);
	CHECK(fallocate(fd, 0, 0, (off_t)(room - 1 * MiB)) == 0);
	close(fd);
	CHECK(fs_free() <= 1 * MiB + 64 * KiB);
}

static int body(bool ext4)
{
	struct sb_pool *p;
	struct sb_buf *b;
	char *x;
	struct sb_stats s0, s1;
	long r;

	snprintf(mnt, sizeof(mnt), "%s/mnt", disk_dir());
	if (mkdir(mnt, 0700) < 0)
		FAIL("mkdir %s: %s", mnt, strerror(errno));
	if (ext4)
		mount_ext4();
	else
		mount_tmpfs();
	atexit(unmount_mnt);

	p = disk_pool_in(PAGE, HEAP, 0, mnt);
	b = make_buf(p, 64 * MiB, 0);
	x = sb_buf_addr(b);
	CHECK_EQ(sb_buf_map(b, 0, N * PAGE), N);
	for (size_t i = 0; i < N; i++)
		disk_fill(x + i * PAGE, PAGE, seed_of(80, i));
	s0 = stats(p);

	/* 2 MiB into 1 MiB: -ENOSPC, every page still resident. */
	r = sb_buf_evict(b, 0, N * PAGE);
	CHECK_EQ(r, -ENOSPC);
	s1 = stats(p);
	CHECK_EQ(sb_buf_placed(b, 0, N * PAGE), N);
	CHECK_EQ(s1.pages_used, s0.pages_used);
	CHECK_EQ(s1.spill_bytes, 0);
	check_pages(x, 0, N, 80);
	CHECK_EQ(stats(p).pages_in, s1.pages_in);	/* no page came back */
	VERIFY(p);
	/* The failed eviction left the pages' mappings registered with the
	 * pool's uffd (minor faults too, where the pool recycles). When the
	 * kernel drops their page-table entries (here MADV_DONTNEED; swap
	 * elsewhere), a touch maps the data again: never a fault forever. */
	CHECK_EQ(madvise(x, N * PAGE, MADV_DONTNEED), 0);
	check_pages(x, 0, N, 80);
	CHECK_EQ(sb_buf_placed(b, 0, N * PAGE), N);
	/* Again: same answer, nothing lost. */
	CHECK_EQ(sb_buf_evict(b, 0, N * PAGE), -ENOSPC);
	CHECK_EQ(sb_buf_placed(b, 0, N * PAGE), N);
	check_pages(x, 0, N, 80);

	/* The process keeps working: 256 KiB fits, and reads back. */
	CHECK_EQ(sb_buf_evict(b, 0, 4 * PAGE), 4);
	CHECK_EQ(sb_buf_placed(b, 0, N * PAGE), N - 4);
	CHECK(stats(p).spill_bytes >= 4 * PAGE);
	check_pages(x, 0, N, 80);
	CHECK_EQ(sb_buf_placed(b, 0, N * PAGE), N);
	/* New pages, writes, unmaps. */
	CHECK_EQ(sb_buf_map(b, N * PAGE, 4 * PAGE), 4);
	((volatile char *)x)[(N + 8) * PAGE] = 3;	/* a fault */
	CHECK_EQ(((volatile char *)x)[(N + 8) * PAGE], 3);
	CHECK_EQ(sb_buf_unmap(b, N * PAGE, 16 * PAGE), 5);
	check_pages(x, 0, N, 80);
	VERIFY(p);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK_EQ(stats(p).spill_bytes, 0);
	sb_pool_destroy(p);
	due_slots_make_room();
	/* The pool closed its spill file: the file system is not busy. */
	if (umount2(mnt, 0) < 0)
		FAIL("umount %s after sb_pool_destroy: %s", mnt,
		     strerror(errno));
	mnt[0] = 0;
	printf("spill full: -ENOSPC, data resident, still working\n");
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "body"))
		return body(false);
	if (!strcmp(name, "body-ext4"))
		return body(true);
	return 2;
}

/* After each run, whatever happened to the child. */
static void cleanup(const char *dir)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/mnt", dir);
	umount2(path, MNT_DETACH);
}

static int main_test(void)
{
	require_uffd();
	if (geteuid() != 0)
		SKIP("mounting a tiny tmpfs for the spill directory needs root");
	if (run_pagers("body", 60, cleanup) | run_pagers("body-ext4", 60, cleanup))
		SKIP("a run skipped (see above)");
	return 0;
}
