/* SPDX-License-Identifier: MIT */
/* A program that closed its standard descriptors (a daemon leaving its
 * terminal) loses nothing: no heap, spill, save or counter file of the
 * library's stays at descriptor 0, 1 or 2 (each is moved above 2 and its
 * slot given /dev/null), so neither the library's log lines (write(2) on
 * stderr) nor the program's own writes there, from any thread, land in a
 * buffer's pages or a file. Before, a heap made after close(2) became
 * descriptor 2 and the next log line overwrote the first bytes of its
 * pages. Run under both pagers: new heaps, the disk tier, another pool, a
 * save and its restore, all after the close. */
#include "harness.h"
#include "harness_internal.h"

#include <pthread.h>
#include <stdatomic.h>

#define PAGE (64 * KiB)
#define HEAP (1 * MiB)	/* a new heap every 16 pages */
#define NPAGES 64

/* What a write to descriptors 0-2 may reach: /dev/null, or a descriptor
 * of the library's that refuses write(2) (userfaultfd, eventfd,
 * io_uring). */
static void write_std(const char *what)
{
	char line[128];
	int n = snprintf(line, sizeof(line),
			 "a stray line written to fd 0-2 after %s\n", what);

	for (int fd = 0; fd <= 2; fd++)
		if (write(fd, line, (size_t)n) < 0) {
			/* closed, or not a file of data */
		}
	sbi_log(SBI_LOG_ERROR, "a log line after %s", what);
}

static void fill(char *x, size_t first, size_t n, unsigned tag)
{
	for (size_t i = first; i < first + n; i++)
		disk_fill(x + i * PAGE, PAGE, ((uint64_t)tag << 32) | i);
}

static size_t bad_pages(const char *x, size_t n, unsigned tag)
{
	static char want[PAGE];
	size_t bad = 0;

	for (size_t i = 0; i < n; i++) {
		disk_fill(want, PAGE, ((uint64_t)tag << 32) | i);
		bad += memcmp(x + i * PAGE, want, PAGE) != 0;
	}
	return bad;
}

/* Descriptors 0-2 as the library left them, for the report; data_file:
 * one is neither /dev/null nor an anonymous inode (a heap, a file). */
static void std_fds(char *out, size_t len, bool *data_file)
{
	size_t at = 0;

	*data_file = false;
	out[0] = 0;
	for (int fd = 0; fd <= 2; fd++) {
		char proc[32], target[256] = "closed";
		ssize_t n;

		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
		n = readlink(proc, target, sizeof(target) - 1);
		if (n >= 0) {
			target[n] = 0;
			*data_file |= strncmp(target, "anon_inode:", 11) &&
				      strcmp(target, "/dev/null");
		}
		at += (size_t)snprintf(out + at, len - at, "%sfd %d: %s",
				       fd ? ", " : "", fd, target);
		if (at >= len)
			break;
	}
}

/* Another thread of the program writing to 0-2 all along, while the
 * library makes its descriptors: a write that lands in one between its
 * making and its move above 2 is dropped (a new file is truncated again).
 * Not under TSan, which rightly calls a write racing a dup3 of the same
 * slot a race: the program's, not the library's. */
#if defined(__SANITIZE_THREAD__)
#define HAMMER 0
#else
#define HAMMER 1
#endif

static atomic_int hammer_stop;

static void *hammer(void *arg)
{
	static const char line[] = "a stray line from another thread\n";

	(void)arg;
	while (!atomic_load(&hammer_stop))
		for (int fd = 0; fd <= 2; fd++)
			if (write(fd, line, sizeof(line) - 1) < 0) {
				/* closed, or not a file of data */
			}
	return NULL;
}

static int closed_child(void)
{
	struct sb_pool *a = disk_pool(PAGE, HEAP, 0), *b;
	struct sb_buf *ba, *bb, *saved = NULL;
	const char *path = disk_path("save");
	size_t bad_a, bad_b, bad_saved = 0;
	int report, err = 0, r_save;
	bool data_file, all_open = true;
	char fds[1024];
	pthread_t th;
	char *x, *y;

	ba = make_buf(a, NPAGES * PAGE, 0);
	x = sb_buf_addr(ba);
	CHECK_EQ(sb_buf_map(ba, 0, PAGE), 1);	/* one heap before */
	fflush(NULL);
	report = fcntl(2, F_DUPFD_CLOEXEC, 10);
	CHECK(report >= 10);
	sbi_log_level = SBI_LOG_INFO;	/* and the library's own lines */
	close(0);
	close(1);
	close(2);
	if (HAMMER && pthread_create(&th, NULL, hammer, NULL) != 0)
		_exit(3);

	/* New heaps, the spill file, a page-in, another pool. */
	CHECK_EQ(sb_buf_map(ba, 0, NPAGES * PAGE), NPAGES - 1);
	fill(x, 0, NPAGES, 1);
	CHECK_EQ(sb_buf_evict(ba, 0, NPAGES / 2 * PAGE), NPAGES / 2);
	b = make_pool(PAGE, HEAP, 0);
	bb = make_buf(b, NPAGES * PAGE, 0);
	y = sb_buf_addr(bb);
	CHECK_EQ(sb_buf_map(bb, 0, NPAGES * PAGE), NPAGES);
	fill(y, 0, NPAGES, 2);
	/* By now every closed slot holds something: the library's threads
	 * make no more descriptors there (the pools' locks order what they
	 * made before these writes). */
	stats(a);
	stats(b);
	for (int fd = 0; fd <= 2; fd++)
		all_open &= fcntl(fd, F_GETFD) >= 0;
	if (all_open)
		write_std("new heaps, an eviction and a new pool");
	r_save = sb_buf_save(ba, 0, NPAGES * PAGE, path);
	if (all_open)
		write_std("a save");
	if (r_save == 0) {
		saved = sb_buf_restore(a, path, 0, &err);
		if (all_open)
			write_std("a restore");
		if (saved)
			bad_saved = bad_pages(sb_buf_addr(saved), NPAGES, 1);
	}
	if (HAMMER) {
		atomic_store(&hammer_stop, 1);
		pthread_join(th, NULL);
	}
	bad_a = bad_pages(x, NPAGES, 1);
	bad_b = bad_pages(y, NPAGES, 2);
	std_fds(fds, sizeof(fds), &data_file);

	/* Reported through the test's stderr kept aside: 0-2 now hold
	 * /dev/null or descriptors of the library's that refuse a write. */
#define EXPECT(c)                                                             \
	do {                                                                  \
		if (!(c)) {                                                   \
			dprintf(report, "%s:%d: %s (%s)\n", __FILE__,          \
				__LINE__, #c, fds);                            \
			_exit(1);                                             \
		}                                                             \
	} while (0)
	EXPECT(!data_file);
	EXPECT(all_open);
	EXPECT(r_save == 0);
	EXPECT(saved != NULL);
	EXPECT(bad_a == 0);
	EXPECT(bad_b == 0);
	EXPECT(bad_saved == 0);
	dprintf(report, "standard descriptors after: %s\n", fds);
	dprintf(report, "stdin, stdout, stderr closed: %d pages in two pools "
		"and a save file whole after stray writes to fd 0-2%s\n",
		2 * NPAGES, HAMMER ? ", from another thread too" : "");
	sb_buf_destroy(saved);
	sb_buf_destroy(ba);
	sb_buf_destroy(bb);
	sb_pool_destroy(a);
	sb_pool_destroy(b);
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "closed"))
		return closed_child();
	return 2;
}

static int main_test(void)
{
	require_uffd();
	if (run_pagers("closed", 60, NULL))
		SKIP("a run skipped (see above)");
	return 0;
}
