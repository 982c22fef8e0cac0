/* Files that are not what they seem, and saves that must not lose data
 * (issue 10, defects 1, 2, 3, 9, 11, 12, 13, 16):
 *  - a save over the file its own buffer was restored from (the "continue
 *    the session, save it again" flow), and a save over the file behind a
 *    file-backed buffer: the save succeeds, the live buffers keep reading
 *    their old data (the pages not yet read included), the new file holds
 *    the new data, and nothing else is left in the directory;
 *  - a save that fails (a page whose data is lost) leaves the previous file
 *    as it was;
 *  - a destination that is a FIFO, a directory, a character device or a
 *    dangling symlink is refused and left alone; a symlink to a file saves
 *    into that file and stays a symlink;
 *  - a FIFO, a directory or a character device given to sb_buf_open_file
 *    or sb_buf_restore is refused at once (no blocking open);
 *  - a save file of a few KiB declaring a terabyte is refused with -EBADMSG
 *    without reading (or allocating) a terabyte's tables;
 *  - sb_pool_reserve past what a long can say, and sb_buf_open_file with an
 *    offset past the largest file offset, are refused up front;
 *  - a file that shrinks under its buffer raises SIGBUS (and io_errors)
 *    where data was, never zeros;
 *  - sb_buf_share from an evictable buffer while it is being evicted never
 *    returns -EAGAIN;
 *  - a SIGBUS because of the budget is logged at the default log level.
 * Runs with both pagers. */
#include "harness.h"

#include <dirent.h>
#include <limits.h>
#include <fcntl.h>
#include <setjmp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)

uint32_t sbi_crc32c(const void *p, size_t len);
uint32_t sbi_crc32c_zeros(uint32_t crc, uint64_t len);
int sbi_test_corrupt_spill(struct sb_buf *buf, size_t off);

static uint64_t seed_of(unsigned tag, size_t page)
{
	return ((uint64_t)tag << 32) | page;
}

static void fill_pages(char *x, size_t first, size_t n, unsigned tag)
{
	for (size_t i = first; i < first + n; i++)
		disk_fill(x + i * PAGE, PAGE, seed_of(tag, i));
}

static void check_pages_at(const char *x, size_t first, size_t n,
			   unsigned tag, int line)
{
	for (size_t i = first; i < first + n; i++) {
		long bad = disk_check(x + i * PAGE, PAGE, seed_of(tag, i));

		if (bad >= 0)
			FAIL("line %d: page %zu (tag %u) differs at byte %ld",
			     line, i, tag, bad);
	}
}
#define check_pages(x, first, n, tag) \
	check_pages_at(x, first, n, tag, __LINE__)

/* Entries of the scratch directory other than the expected ones. */
static int strangers(const char *const *expected, size_t n)
{
	DIR *d = opendir(disk_dir());
	struct dirent *e;
	int count = 0;

	CHECK(d != NULL);
	while ((e = readdir(d))) {
		bool known = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");

		for (size_t i = 0; i < n && !known; i++)
			known = !strcmp(e->d_name, expected[i]);
		if (!known) {
			fprintf(stderr, "left behind: %s\n", e->d_name);
			count++;
		}
	}
	closedir(d);
	return count;
}

/* A plain file of n pages, tag's pattern. */
static void write_file(const char *path, size_t n, unsigned tag)
{
	char *buf = malloc(n * PAGE);
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);

	CHECK(buf && fd >= 0);
	fill_pages(buf, 0, n, tag);
	CHECK_EQ(write(fd, buf, n * PAGE), (long)(n * PAGE));
	close(fd);
	free(buf);
}

/* Defects 1 and 2: saves over their own source; a failed save. */
static void save_over_source(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *a = make_buf(p, 64 * MiB, SB_BUF_EVICTABLE);
	const char *save = disk_path("kv.save"), *model = disk_path("model");
	const char *const expected[] = {"kv.save", "model", "spill"};
	struct sb_buf *r, *r2, *f;
	char *x = sb_buf_addr(a), *y, *z;

	CHECK_EQ(sb_buf_map(a, 0, 8 * PAGE), 8);
	fill_pages(x, 0, 8, 1);
	CHECK_EQ(sb_buf_save(a, 0, 8 * PAGE, save), 0);

	/* Restore, continue (one page written), save to the same path. */
	r = disk_restore(p, save);
	y = sb_buf_addr(r);
	fill_pages(y, 0, 1, 2);
	CHECK_EQ(sb_buf_save(r, 0, 8 * PAGE, save), 0);
	check_pages(y, 0, 1, 2);
	check_pages(y, 1, 7, 1);	/* never read before the save */
	r2 = disk_restore(p, save);
	z = sb_buf_addr(r2);
	check_pages(z, 0, 1, 2);
	check_pages(z, 1, 7, 1);
	/* And again, the restored copy saved over the file it came from. */
	fill_pages(z, 7, 1, 3);
	CHECK_EQ(sb_buf_save(r2, 0, 8 * PAGE, save), 0);
	sb_buf_destroy(r2);
	r2 = disk_restore(p, save);
	z = sb_buf_addr(r2);
	check_pages(z, 0, 1, 2);
	check_pages(z, 1, 6, 1);
	check_pages(z, 7, 1, 3);
	sb_buf_destroy(r2);

	/* A save over the file behind a file-backed buffer. */
	write_file(model, 4, 4);
	{
		int err = 0;

		f = sb_buf_open_file(p, model, 0, 4 * PAGE, 0, &err);
		if (!f)
			FAIL("sb_buf_open_file: %s", strerror(-err));
	}
	CHECK_EQ(sb_buf_save(a, 0, 4 * PAGE, model), 0);
	check_pages((char *)sb_buf_addr(f), 0, 4, 4);	/* the old data */
	sb_buf_destroy(f);
	CHECK_EQ(strangers(expected, 3), 0);

	/* A save that fails leaves the previous file as it was. */
	CHECK_EQ(sb_buf_evict(a, 2 * PAGE, PAGE), 1);
	CHECK_EQ(sbi_test_corrupt_spill(a, 2 * PAGE), 0);
	CHECK_EQ(sb_buf_save(a, 0, 8 * PAGE, save), -EIO);
	r2 = disk_restore(p, save);
	z = sb_buf_addr(r2);
	check_pages(z, 0, 1, 2);
	check_pages(z, 1, 6, 1);
	check_pages(z, 7, 1, 3);
	sb_buf_destroy(r2);
	CHECK_EQ(strangers(expected, 3), 0);
	sb_buf_destroy(r);
	sb_buf_destroy(a);
	sb_pool_destroy(p);
}

/* What a saver killed between naming its new file and renaming it leaves
 * (".sbsave-PID-XXXXXXXX") is removed by the next save in the directory,
 * and only when PID is gone: not a live process's, not other names. */
static void leftovers(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *a = make_buf(p, 4 * PAGE, 0);
	char dead[64], live[64], other[64];
	const char *save = disk_path("kv2.save");
	pid_t gone = fork();
	struct stat st;
	int fd;

	if (gone == 0)
		_exit(0);
	CHECK(gone > 0 && waitpid(gone, NULL, 0) == gone);
	snprintf(dead, sizeof(dead), ".sbsave-%d-0badcafe", (int)gone);
	snprintf(live, sizeof(live), ".sbsave-%d-0badcafe", (int)getpid());
	snprintf(other, sizeof(other), ".sbsave-notes");
	for (int i = 0; i < 3; i++) {
		const char *n = i == 0 ? dead : i == 1 ? live : other;

		fd = open(disk_path(n), O_CREAT | O_WRONLY, 0600);
		CHECK(fd >= 0);
		close(fd);
	}
	CHECK_EQ(sb_buf_map(a, 0, 4 * PAGE), 4);
	CHECK_EQ(sb_buf_save(a, 0, 4 * PAGE, save), 0);
	CHECK(stat(disk_path(dead), &st) < 0 && errno == ENOENT);
	CHECK(stat(disk_path(live), &st) == 0);
	CHECK(stat(disk_path(other), &st) == 0);
	unlink(disk_path(live));
	unlink(disk_path(other));
	unlink(save);
	sb_buf_destroy(a);
	sb_pool_destroy(p);
}

/* Defects 2 and 3: destinations and inputs that are not regular files. */
static void not_regular(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *a = make_buf(p, 4 * PAGE, 0);
	const char *fifo = disk_path("fifo"), *dir = disk_path("dir");
	const char *chr = disk_path("null"), *dangling = disk_path("dangling");
	const char *link = disk_path("link"), *target = disk_path("target");
	struct stat st;
	int err;

	CHECK_EQ(sb_buf_map(a, 0, 4 * PAGE), 4);
	fill_pages(sb_buf_addr(a), 0, 4, 6);
	CHECK(mkfifo(fifo, 0600) == 0);
	CHECK(mkdir(dir, 0700) == 0);
	CHECK(symlink("nowhere", dangling) == 0);
	write_file(target, 1, 7);
	CHECK(symlink("target", link) == 0);

	CHECK_EQ(sb_buf_save(a, 0, 4 * PAGE, fifo), -ENODEV);
	CHECK(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
	CHECK_EQ(sb_buf_save(a, 0, 4 * PAGE, dir), -EISDIR);
	CHECK(stat(dir, &st) == 0 && S_ISDIR(st.st_mode));
	CHECK_EQ(sb_buf_save(a, 0, 4 * PAGE, dangling), -ENOENT);
	CHECK(lstat(dangling, &st) == 0 && S_ISLNK(st.st_mode));
	CHECK_EQ(sb_buf_save(a, 0, 4 * PAGE, link), 0);
	CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
	{
		struct sb_buf *r = disk_restore(p, target);

		check_pages((char *)sb_buf_addr(r), 0, 4, 6);
		sb_buf_destroy(r);
	}
	/* A character device (the same one as /dev/null), as root. */
	if (mknod(chr, S_IFCHR | 0600, makedev(1, 3)) == 0) {
		CHECK_EQ(sb_buf_save(a, 0, 4 * PAGE, chr), -ENODEV);
		CHECK(stat(chr, &st) == 0 && S_ISCHR(st.st_mode));
		err = 0;
		CHECK(!sb_buf_open_file(p, chr, 0, PAGE, 0, &err));
		CHECK_EQ(err, -ENODEV);
		CHECK(!sb_buf_restore(p, chr, 0, &err));
		CHECK_EQ(err, -ENODEV);
	} else {
		printf("no character device case: mknod: %s\n",
		       strerror(errno));
	}
	/* Inputs: refused at once, not a blocking open. */
	err = 0;
	CHECK(!sb_buf_open_file(p, fifo, 0, PAGE, 0, &err));
	CHECK_EQ(err, -ENODEV);
	CHECK(!sb_buf_restore(p, fifo, 0, &err));
	CHECK_EQ(err, -ENODEV);
	CHECK(!sb_buf_open_file(p, dir, 0, PAGE, 0, &err));
	CHECK_EQ(err, -EISDIR);
	CHECK(!sb_buf_restore(p, dir, 0, &err));
	CHECK_EQ(err, -EISDIR);
	sb_buf_destroy(a);
	sb_pool_destroy(p);
}

/* The save file header (lib/save.c). */
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
	uint32_t header_crc;
};

static long maxrss_kib(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

/* Defect 9: a sparse file of a few KiB that declares a terabyte. */
static void hostile_save(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	const char *path = disk_path("huge.save");
	/* A terabyte (less under ThreadSanitizer, whose address space is
	 * smaller: the restore reserves what the file declares). */
	const uint64_t declared = HUGE_BUF < TiB ? HUGE_BUF / 2 : TiB;
	uint64_t nblocks = declared / 4096;
	uint64_t bitmap = ((nblocks + 63) / 64 * 8 + 4095) & ~4095ull;
	uint64_t crcs = (nblocks * 4 + 4095) & ~4095ull;
	struct save_header h = {.version = 1, .block = 4096};
	char block[4096] = {0};
	long rss0 = maxrss_kib();
	double t0 = now_s();
	int fd, err = 0;

	memcpy(h.magic, "SBSAVE01", 8);
	h.length = declared;
	h.nblocks = nblocks;
	h.present_off = 4096;
	h.crc_off = 4096 + bitmap;
	h.data_off = h.crc_off + crcs;
	h.tables_crc = 0x12345678;
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	memcpy(block, &h, sizeof(h));
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	CHECK(fd >= 0);
	CHECK_EQ(write(fd, block, sizeof(block)), (long)sizeof(block));
	CHECK(ftruncate(fd, (off_t)(h.data_off + h.length)) == 0);
	close(fd);
	CHECK(!sb_buf_restore(p, path, 0, &err));
	CHECK_EQ(err, -EBADMSG);
	printf("a 4 KiB file declaring %llu GiB: refused in %.3f s, max RSS "
	       "%ld -> %ld KiB\n",
	       (unsigned long long)(declared >> 30), now_s() - t0, rss0,
	       maxrss_kib());
	/* Reading its tables would have taken declared / 1024 bytes. */
	CHECK(maxrss_kib() - rss0 < 64 * 1024);

	/* The same with the tables' CRC forged right (the CRC of a GiB of
	 * zeros, computed without one): a valid save of a terabyte of holes.
	 * It restores, cheaply, and reads as zeros. */
	{
		char *zeros = calloc(1, 12345);

		CHECK(zeros != NULL);
		CHECK_EQ(sbi_crc32c_zeros(0, 12345), sbi_crc32c(zeros, 12345));
		free(zeros);
	}
	h.tables_crc = sbi_crc32c_zeros(0, bitmap + crcs);
	h.header_crc = 0;
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	memcpy(block, &h, sizeof(h));
	fd = open(path, O_WRONLY);
	CHECK(fd >= 0);
	CHECK_EQ(pwrite(fd, block, sizeof(block), 0), (long)sizeof(block));
	close(fd);
	t0 = now_s();
	{
		struct sb_buf *b = sb_buf_restore(p, path, 0, &err);

		if (!b)
			FAIL("restore of a terabyte of holes: %s",
			     strerror(-err));
		CHECK_EQ(sb_buf_length(b), declared);
		CHECK_EQ(disk_check_zero((char *)sb_buf_addr(b) + 12345 * PAGE,
					 PAGE),
			 -1);
		printf("a 4 KiB file declaring %llu GiB of holes: restored in "
		       "%.3f s, max RSS %ld KiB\n",
		       (unsigned long long)(declared >> 30), now_s() - t0,
		       maxrss_kib());
		CHECK(maxrss_kib() - rss0 < 64 * 1024);
		sb_buf_destroy(b);
	}
	sb_pool_destroy(p);
}

/* Defect 11: limits refused up front. */
static void limits(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	const char *path = disk_path("small");
	struct sb_buf *b;
	int err = 0;

	CHECK_EQ(sb_pool_reserve(p, LONG_MAX), -ERANGE);
	CHECK_EQ(sb_pool_reserve(p, 0), 0);	/* unchanged */
	CHECK_EQ(sb_pool_reserve(p, 2 * PAGE), 2 * PAGE);
	CHECK_EQ(sb_pool_reserve(p, LONG_MAX - PAGE), -ERANGE);
	CHECK_EQ(sb_pool_reserve(p, LONG_MIN), 0);
	write_file(path, 1, 8);
	CHECK(!sb_buf_open_file(p, path, (uint64_t)INT64_MAX & ~4095ull, PAGE,
				0, &err));
	CHECK_EQ(err, -EOVERFLOW);
	CHECK(!sb_buf_open_file(p, path, 1ull << 63, PAGE, 0, &err));
	CHECK_EQ(err, -EOVERFLOW);
	CHECK(!sb_buf_open_file(p, path, ~4095ull, PAGE, 0, &err));
	CHECK_EQ(err, -EOVERFLOW);
	/* Far past the end of the file, but a file offset: zeros. */
	b = sb_buf_open_file(p, path, 1ull << 40, PAGE, 0, &err);
	CHECK(b != NULL);
	CHECK_EQ(disk_check_zero(sb_buf_addr(b), PAGE), -1);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* Defect 13: share while the source is evicted, never -EAGAIN. */
struct evictor {
	struct sb_buf *b;
	atomic_int stop;
	long rounds;
};

static void *evict_loop(void *arg)
{
	struct evictor *e = arg;

	while (!atomic_load(&e->stop)) {
		sb_buf_evict(e->b, 0, 8 * PAGE);
		e->rounds++;
	}
	return NULL;
}

static void share_evicted(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *src = make_buf(p, 8 * PAGE, SB_BUF_EVICTABLE);
	struct sb_buf *dst = make_buf(p, 8 * PAGE, 0);
	static struct evictor e;
	long ok = 0, again = 0, other = 0;
	pthread_t th;
	double t0;

	CHECK_EQ(sb_buf_map(src, 0, 8 * PAGE), 8);
	fill_pages(sb_buf_addr(src), 0, 8, 9);
	memset(&e, 0, sizeof(e));
	e.b = src;
	CHECK(pthread_create(&th, NULL, evict_loop, &e) == 0);
	t0 = now_s();
	while (now_s() - t0 < 1.0) {
		long r = sb_buf_share(dst, 0, src, 0, 8 * PAGE);

		if (r == 8)
			ok++;
		else if (r == -EAGAIN)
			again++;
		else
			other++;
		if (r == 8)
			check_pages((char *)sb_buf_addr(dst), 0, 8, 9);
		sb_buf_unmap(dst, 0, 8 * PAGE);
	}
	atomic_store(&e.stop, 1);
	pthread_join(th, NULL);
	printf("share while evicting: %ld shared, %ld -EAGAIN, %ld other, "
	       "%ld eviction rounds\n",
	       ok, again, other, e.rounds);
	CHECK_EQ(again, 0);
	CHECK_EQ(other, 0);
	CHECK(ok > 0);
	check_pages((char *)sb_buf_addr(src), 0, 8, 9);
	VERIFY(p);
	sb_pool_destroy(p);
}

static int body(void)
{
	save_over_source();
	leftovers();
	not_regular();
	hostile_save();
	limits();
	share_evicted();
	printf("files: ok\n");
	return 0;
}

/* ---- children that take SIGBUS -------------------------------------------- */

static sigjmp_buf jb;

static void on_bus(int sig)
{
	(void)sig;
	siglongjmp(jb, 1);
}

/* 1 if reading page i of x raises SIGBUS, 0 if it reads as tag's data,
 * 2 if it reads anything else (zeros). */
static int touch(const char *x, size_t i, unsigned tag)
{
	if (sigsetjmp(jb, 1))
		return 1;
	return disk_check(x + i * PAGE, PAGE, seed_of(tag, i)) >= 0 ? 2 : 0;
}

/* Defect 12: the file shrinks under its buffer. */
static int shrink_child(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	const char *path = disk_path("shrinks");
	struct sb_buf *f;
	struct sb_stats s0, s1;
	int err = 0, r1, r2, r3;
	char *x;

	signal(SIGBUS, on_bus);
	write_file(path, 4, 11);
	f = sb_buf_open_file(p, path, 0, 4 * PAGE, 0, &err);
	if (!f)
		return 3;
	x = sb_buf_addr(f);
	/* Page 1 keeps 100 bytes, pages 2 and 3 none. */
	if (truncate(path, PAGE + 100) < 0)
		return 4;
	s0 = stats(p);
	r1 = touch(x, 0, 11);
	r2 = touch(x, 2, 11);
	r3 = touch(x, 1, 11);
	s1 = stats(p);
	printf("file cut to 1 page + 100 bytes: page 0 %s, page 1 %s, page 2 "
	       "%s; io_errors %llu -> %llu\n",
	       r1 ? "wrong" : "reads", r3 == 1 ? "SIGBUS" : "no SIGBUS",
	       r2 == 1 ? "SIGBUS" : "no SIGBUS",
	       (unsigned long long)s0.io_errors,
	       (unsigned long long)s1.io_errors);
	if (r1 != 0)
		return 10;
	if (r2 != 1 || r3 != 1)
		return 11;	/* zeros where there was data */
	if (s1.io_errors < s0.io_errors + 2)
		return 12;
	if (touch(x, 2, 11) != 1)
		return 13;	/* and again on the next touch */
	return 0;
}

/* Defect 16: a budget SIGBUS says why at the default log level. */
static int budget_child(void)
{
	struct sb_pool *p = make_pool(PAGE, HEAP, 2 * PAGE);
	struct sb_buf *b = make_buf(p, 8 * PAGE, 0);
	char *x = sb_buf_addr(b);

	expect_signal_at(x + 2 * PAGE, PAGE);
	memset(x, 1, 3 * PAGE);
	return 5;	/* the third page went through */
}

static int child(const char *name)
{
	static const struct {
		const char *name;
		void (*fn)(void);
	} cases[] = {
		{"save-over-source", save_over_source},
		{"leftovers", leftovers},
		{"not-regular", not_regular},
		{"hostile-save", hostile_save},
		{"limits", limits},
		{"share-evicted", share_evicted},
	};

	if (!strcmp(name, "body"))
		return body();
	/* One case alone (SBT_DIR set by hand): to see it fail. */
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (!strcmp(name, cases[i].name)) {
			cases[i].fn();
			return 0;
		}
	}
	if (!strcmp(name, "shrink"))
		return shrink_child();
	if (!strcmp(name, "budget"))
		return budget_child();
	return 2;
}

static void budget_logged(void)
{
	char out[4096] = "";
	int st;

	unsetenv("SPARSEBUF_LOG");
	st = run_child_env("budget", NULL, 30, out, sizeof(out));
	printf("budget child said: %s", out);
	CHECK_EQ(child_exit_code(st), EXIT_GOT_SIGBUS);
	CHECK(strstr(out, "SIGBUS") != NULL);
	CHECK(strstr(out, "budget of 128 KiB") != NULL);
	CHECK(strstr(out, "pool ") != NULL);
}

static int main_test(void)
{
	require_uffd();
	budget_logged();
	if (run_pagers("body", 120, NULL))
		SKIP("a run skipped (see above)");
	if (run_pagers("shrink", 30, NULL))
		SKIP("a run skipped (see above)");
	return 0;
}
