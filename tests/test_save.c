/* The disk tier, session save and restore: sb_buf_save writes a range
 * (placed and evicted pages; unplaced pages read back as zeros and take no
 * room) and sb_buf_restore opens it as a writable buffer of that length
 * whose pages come in lazily on touch; writes to the restored buffer stay
 * out of the file; restore in another process (checksum) and back; errors
 * (-EBADMSG for random bytes, an empty file, a cut header; -ENOENT; bad
 * arguments); a corrupted data byte in the file gives SIGBUS on the touch
 * of that page only (in a child), io_errors rises, other pages read
 * correctly. Every case runs with both pagers (io_uring and
 * SPARSEBUF_PAGER=sync). */
#include "harness.h"

#include <fcntl.h>
#include <setjmp.h>
#include <sys/stat.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)

static uint64_t seed_of(unsigned tag, size_t page)
{
	return ((uint64_t)tag << 32) | page;
}

static int restore_err(struct sb_pool *p, const char *path)
{
	int err = 0;
	struct sb_buf *b = sb_buf_restore(p, path, 0, &err);

	if (b) {
		sb_buf_destroy(b);
		return 0;
	}
	return err;
}

/* Page i of x: filled with (tag, base + i), or zeros when i is in holes. */
static void check_saved_at(const char *x, size_t n, unsigned tag, size_t base,
			   const size_t *holes, size_t nholes, int line)
{
	for (size_t i = 0; i < n; i++) {
		int hole = 0;
		long bad;

		for (size_t h = 0; h < nholes; h++)
			hole |= holes[h] == i;
		bad = hole ? disk_check_zero(x + i * PAGE, PAGE)
			   : disk_check(x + i * PAGE, PAGE,
					seed_of(tag, base + i));
		if (bad >= 0)
			FAIL("(line %d) page %zu (%s) differs at byte %ld", line,
			     i, hole ? "a hole: zeros" : "data", bad);
	}
}
#define check_saved(x, n, tag, base, holes, nholes)                          \
	check_saved_at((x), (n), (tag), (base), (holes), (nholes), __LINE__)

static void write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);

	CHECK(fd >= 0);
	CHECK_EQ(write(fd, data, len), (long)len);
	close(fd);
}

static uint64_t fnv(const volatile char *p, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
	return h;
}

/* ---- round trips ------------------------------------------------------------- */

static void round_trip(void)
{
	enum { N = 16 };
	static const size_t holes[] = {5, 9}, holes4[] = {1, 5};
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0), *r;
	char *x = sb_buf_addr(b), *y;
	const char *path = disk_path("s1.sbs"), *path2 = disk_path("s2.sbs");
	struct sb_stats s0;

	CHECK_EQ(sb_buf_map(b, 0, N * PAGE), N);
	CHECK_EQ(sb_buf_unmap(b, 5 * PAGE, PAGE), 1);
	CHECK_EQ(sb_buf_unmap(b, 9 * PAGE, PAGE), 1);
	for (size_t i = 0; i < N; i++)
		if (i != 5 && i != 9)
			disk_fill(x + i * PAGE, PAGE, seed_of(40, i));
	/* Evicted pages are saved too. */
	CHECK_EQ(sb_buf_evict(b, 12 * PAGE, 2 * PAGE), 2);
	CHECK_EQ(sb_buf_save(b, 0, N * PAGE, path), 0);
	/* The source is unchanged. */
	for (size_t i = 0; i < N; i++)
		if (i != 5 && i != 9)
			CHECK_EQ(disk_check(x + i * PAGE, PAGE, seed_of(40, i)),
				 -1);
	CHECK_EQ(sb_buf_placed(b, 0, N * PAGE), N - 2);

	/* Restored: the same length and bytes, read in lazily. */
	r = disk_restore(p, path);
	y = sb_buf_addr(r);
	CHECK(r != b && y != x);
	CHECK_EQ(sb_buf_length(r), N * PAGE);
	CHECK_EQ(sb_buf_placed(r, 0, N * PAGE), 0);
	s0 = stats(p);
	CHECK_EQ(disk_check(y + 3 * PAGE, PAGE, seed_of(40, 3)), -1);
	CHECK_EQ(sb_buf_placed(r, 3 * PAGE, PAGE), 1);
	CHECK(sb_buf_placed(r, 0, N * PAGE) >= 1);
	CHECK(stats(p).pages_in - s0.pages_in >= 1);
	CHECK(stats(p).bytes_read - s0.bytes_read >= PAGE);
	check_saved(y, N, 40, 0, holes, 2);
	CHECK_EQ(stats(p).io_errors, 0);
	/* Writable; the writes are the restored buffer's own. */
	for (size_t i = 0; i < N; i++)
		disk_fill(y + i * PAGE, PAGE, seed_of(41, i));
	check_saved(y, N, 41, 0, NULL, 0);
	for (size_t i = 0; i < N; i++)
		if (i != 5 && i != 9)
			CHECK_EQ(disk_check(x + i * PAGE, PAGE, seed_of(40, i)),
				 -1);
	/* A restored buffer evicts and reads back like any other. */
	CHECK_EQ(sb_buf_evict(r, 0, N * PAGE), N);
	CHECK_EQ(sb_buf_placed(r, 0, N * PAGE), 0);
	check_saved(y, N, 41, 0, NULL, 0);
	sb_buf_destroy(r);
	/* The save file did not take those writes. */
	r = disk_restore(p, path);
	check_saved(sb_buf_addr(r), N, 40, 0, holes, 2);
	sb_buf_destroy(r);

	/* Part of a buffer: pages 4..11 (holes at 5 and 9: 1 and 5). */
	CHECK_EQ(sb_buf_save(b, 4 * PAGE, 8 * PAGE, path2), 0);
	r = disk_restore(p, path2);
	CHECK_EQ(sb_buf_length(r), 8 * PAGE);
	CHECK_EQ(sb_buf_placed(r, 0, 8 * PAGE), 0);
	check_saved(sb_buf_addr(r), 8, 40, 4, holes4, 2);
	sb_buf_destroy(r);
	VERIFY(p);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
}

/* Unplaced pages take no room in the file. */
static void sparse_file(void)
{
	enum { N = 64 };
	static const size_t ends[] = {0, N - 1};
	size_t holes[N - 2], nh = 0;
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0), *r;
	char *x = sb_buf_addr(b);
	const char *path = disk_path("sparse.sbs");
	struct stat st;

	for (size_t k = 0; k < 2; k++) {
		CHECK_EQ(sb_buf_map(b, ends[k] * PAGE, PAGE), 1);
		disk_fill(x + ends[k] * PAGE, PAGE, seed_of(45, ends[k]));
	}
	for (size_t i = 1; i < N - 1; i++)
		holes[nh++] = i;
	CHECK_EQ(sb_buf_save(b, 0, N * PAGE, path), 0);
	CHECK(stat(path, &st) == 0);
	printf("save: %d pages, 2 placed: file of %lld bytes, %lld allocated\n",
	       N, (long long)st.st_size, (long long)st.st_blocks * 512);
	CHECK((size_t)st.st_blocks * 512 < 16 * PAGE);
	r = disk_restore(p, path);
	CHECK_EQ(sb_buf_length(r), N * PAGE);
	check_saved(sb_buf_addr(r), N, 45, 0, holes, nh);
	sb_buf_destroy(r);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static void errors(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 16 * MiB, 0);
	const char *good = disk_path("good.sbs"), *bad = disk_path("bad.sbs");
	const char *junk = disk_path("junk.bin"), *empty = disk_path("empty");
	const char *cut = disk_path("cut.sbs"), *none = disk_path("missing");
	const char *nodir = disk_path("no-dir/x.sbs");
	char *rnd = malloc(PAGE), head[4];
	FILE *f;

	CHECK(rnd != NULL);
	CHECK_EQ(sb_buf_map(b, 0, 2 * PAGE), 2);
	disk_fill(sb_buf_addr(b), 2 * PAGE, 1);
	CHECK_EQ(sb_buf_save(NULL, 0, PAGE, bad), -EINVAL);
	CHECK_EQ(sb_buf_save(b, 0, PAGE, NULL), -EINVAL);
	CHECK_EQ(sb_buf_save(b, 0, 16 * MiB + PAGE, bad), -ERANGE);
	CHECK_EQ(sb_buf_save(b, SIZE_MAX - PAGE, 2 * PAGE, bad), -ERANGE);
	CHECK_EQ(sb_buf_save(b, 0, PAGE, nodir), -ENOENT);
	CHECK_EQ(sb_buf_save(b, 0, 2 * PAGE, good), 0);

	CHECK_EQ(restore_err(NULL, good), -EINVAL);
	CHECK_EQ(restore_err(p, NULL), -EINVAL);
	CHECK_EQ(restore_err(p, none), -ENOENT);
	disk_fill(rnd, PAGE, 77);
	write_file(junk, rnd, PAGE);
	CHECK_EQ(restore_err(p, junk), -EBADMSG);
	write_file(empty, "", 0);
	CHECK_EQ(restore_err(p, empty), -EBADMSG);
	f = fopen(good, "rb");
	CHECK(f != NULL);
	CHECK_EQ(fread(head, 1, sizeof(head), f), sizeof(head));
	fclose(f);
	write_file(cut, head, sizeof(head));	/* a header cut short */
	CHECK_EQ(restore_err(p, cut), -EBADMSG);
	CHECK_EQ(restore_err(p, good), 0);	/* the good one still opens */
	CHECK_EQ(stats(p).pages_used, 2);
	free(rnd);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* ---- another process --------------------------------------------------------- */

static void other_process(void)
{
	enum { N = 8 };
	static const size_t hole[] = {2}, hole_from1[] = {1};
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 16 * MiB, 0), *r;
	char *x = sb_buf_addr(b), *y, *want = calloc(N, PAGE);
	const char *path = disk_path("to-child.sbs");
	const char *back = disk_path("from-child.sbs");
	char e_file[600], e_sum[64], e_next[600];
	char *env[] = {e_file, e_sum, e_next, NULL};

	CHECK(want != NULL);
	for (size_t i = 0; i < N; i++) {
		if (i == hole[0])
			continue;
		CHECK_EQ(sb_buf_map(b, i * PAGE, PAGE), 1);
		disk_fill(x + i * PAGE, PAGE, seed_of(50, i));
		disk_fill(want + i * PAGE, PAGE, seed_of(50, i));
	}
	CHECK_EQ(sb_buf_save(b, 0, N * PAGE, path), 0);
	snprintf(e_file, sizeof(e_file), "SBT_FILE=%s", path);
	snprintf(e_sum, sizeof(e_sum), "SBT_SUM=%llx",
		 (unsigned long long)fnv(want, N * PAGE));
	snprintf(e_next, sizeof(e_next), "SBT_NEXT=%s", back);
	CHECK_EQ(child_exit_code(run_child_env("restore-other", env, 30, NULL,
					       0)),
		 0);
	/* Back here: the child's save of what it restored, page 0 changed. */
	r = disk_restore(p, back);
	y = sb_buf_addr(r);
	CHECK_EQ(sb_buf_length(r), N * PAGE);
	CHECK_EQ(sb_buf_placed(r, 0, N * PAGE), 0);
	CHECK_EQ(disk_check(y, PAGE, seed_of(51, 0)), -1);
	check_saved(y + PAGE, N - 1, 50, 1, hole_from1, 1);
	sb_buf_destroy(r);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	free(want);
}

static int restore_other(void)
{
	const char *path = getenv("SBT_FILE"), *sum = getenv("SBT_SUM");
	const char *next = getenv("SBT_NEXT");
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *r;
	char got[32];
	int err = 0;

	if (!path || !sum || !next)
		return 3;
	r = sb_buf_restore(p, path, 0, &err);
	if (!r) {
		fprintf(stderr, "restore in the child: %s\n", strerror(-err));
		return 4;
	}
	if (sb_buf_length(r) != 8 * PAGE)
		return 5;
	if (sb_buf_placed(r, 0, 8 * PAGE) != 0)
		return 6;
	snprintf(got, sizeof(got), "%llx",
		 (unsigned long long)fnv(sb_buf_addr(r), 8 * PAGE));
	if (strcmp(got, sum)) {
		fprintf(stderr, "checksum in the child %s, want %s\n", got,
			sum);
		return 7;
	}
	disk_fill(sb_buf_addr(r), PAGE, seed_of(51, 0));
	if (sb_buf_save(r, 0, 8 * PAGE, next) != 0)
		return 8;
	sb_buf_destroy(r);
	sb_pool_destroy(p);
	return 0;
}

/* ---- a corrupted save file --------------------------------------------------- */

static void corrupted(void)
{
	enum { N = 8 };
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sb_buf *b = make_buf(p, 16 * MiB, 0);
	char *x = sb_buf_addr(b);
	const char *path = disk_path("damaged.sbs");
	char e_file[600];
	char *env[] = {e_file, NULL};
	struct stat st;
	unsigned char c;
	int fd;

	/* Fully placed, the last page full of data. */
	CHECK_EQ(sb_buf_map(b, 0, N * PAGE), N);
	for (size_t i = 0; i < N; i++)
		disk_fill(x + i * PAGE, PAGE, seed_of(60, i));
	CHECK_EQ(sb_buf_save(b, 0, N * PAGE, path), 0);
	/* Flip one byte near the end of the file (in the data). */
	CHECK(stat(path, &st) == 0);
	CHECK(st.st_size > (off_t)(N * PAGE));
	fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	CHECK_EQ(pread(fd, &c, 1, st.st_size - 100), 1);
	c ^= 0x5a;
	CHECK_EQ(pwrite(fd, &c, 1, st.st_size - 100), 1);
	close(fd);
	snprintf(e_file, sizeof(e_file), "SBT_FILE=%s", path);
	CHECK_EQ(child_exit_code(run_child_env("corrupt", env, 30, NULL, 0)),
		 0);
	/* The buffer that was saved is unaffected. */
	for (size_t i = 0; i < N; i++)
		CHECK_EQ(disk_check(x + i * PAGE, PAGE, seed_of(60, i)), -1);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static sigjmp_buf jb;
static volatile uintptr_t bus_addr;

static void on_bus(int sig, siginfo_t *si, void *ctx)
{
	(void)sig, (void)ctx;
	bus_addr = (uintptr_t)si->si_addr;
	siglongjmp(jb, 1);
}

/* Read page i of x: 0 when exact, 1 on SIGBUS inside the page, 2 when the
 * data is wrong (silently), 3 on SIGBUS elsewhere. */
static int read_page(const char *x, size_t i, uint64_t seed)
{
	bus_addr = 0;
	if (sigsetjmp(jb, 1))
		return bus_addr >= (uintptr_t)x + i * PAGE &&
				       bus_addr < (uintptr_t)x + (i + 1) * PAGE
			       ? 1
			       : 3;
	return disk_check(x + i * PAGE, PAGE, seed) >= 0 ? 2 : 0;
}

static int corrupt_child(void)
{
	enum { N = 8 };
	const char *path = getenv("SBT_FILE");
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	struct sigaction sa;
	struct sb_stats s0, s1;
	struct sb_buf *r;
	int err = 0, nbad = 0, bad = -1;
	char *y;

	if (!path)
		return 3;
	r = sb_buf_restore(p, path, 0, &err);
	if (!r) {
		fprintf(stderr, "restore of the damaged file: %s\n",
			strerror(-err));
		return 4;
	}
	y = sb_buf_addr(r);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_bus;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGBUS, &sa, NULL);
	s0 = stats(p);
	for (size_t i = 0; i < N; i++) {
		int res = read_page(y, i, seed_of(60, i));

		if (res == 1) {
			nbad++;
			bad = (int)i;
		} else if (res) {
			fprintf(stderr, "page %zu: %s\n", i,
				res == 2 ? "wrong data, no SIGBUS"
					 : "SIGBUS at another address");
			return 10 + (int)i;
		}
	}
	s1 = stats(p);
	printf("corrupted save file: page %d raised SIGBUS, io_errors %llu -> "
	       "%llu\n",
	       bad, (unsigned long long)s0.io_errors,
	       (unsigned long long)s1.io_errors);
	if (nbad != 1)
		return 20;	/* the damage is in exactly one page */
	if (s1.io_errors <= s0.io_errors)
		return 21;
	/* Still SIGBUS, never zeros, on the next touch. */
	if (read_page(y, (size_t)bad, seed_of(60, (size_t)bad)) != 1)
		return 22;
	/* The good pages are still there. */
	for (size_t i = 0; i < N; i++)
		if ((int)i != bad && read_page(y, i, seed_of(60, i)) != 0)
			return 23;
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "body")) {
		round_trip();
		sparse_file();
		errors();
		other_process();
		corrupted();
		printf("save: ok\n");
		return 0;
	}
	if (!strcmp(name, "restore-other"))
		return restore_other();
	if (!strcmp(name, "corrupt"))
		return corrupt_child();
	return 2;
}

static int main_test(void)
{
	return run_disk_body(120);
}
