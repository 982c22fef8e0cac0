/* What a fork()ed child sees (docs/api.md, "fork"): none of its parent's
 * buffers (their ranges are not mapped: a touch raises SIGSEGV), -ECHILD
 * from calls on the parent's pools, none of their descriptors, and a fresh
 * default pool of its own.
 * The parent is unaffected and its mappings merge as before. */
#include "harness.h"

#include <dirent.h>
#include <sys/wait.h>

#define PAGE (256 * KiB)

static int child(const char *name)
{
	(void)name;
	return 2;
}

/* Fork and run fn in the child; returns its wait status. */
static int in_child(int (*fn)(void *), void *arg)
{
	pid_t pid = fork();
	int st = 0;

	CHECK(pid >= 0);
	if (pid == 0)
		_exit(fn(arg));
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	return st;
}

struct ctx {
	struct sb_pool *pool;
	struct sb_buf *buf;
	char *x;
};

static int touch_placed(void *arg)
{
	struct ctx *c = arg;

	expect_signal_at(c->x, PAGE);
	return c->x[1];	/* placed in the parent: not mapped here */
}

static int touch_unplaced(void *arg)
{
	struct ctx *c = arg;

	expect_signal_at(c->x + 10 * PAGE, PAGE);
	return c->x[10 * PAGE];
}

/* The parent's pools leave no descriptor in the child: their uffds, quit
 * and kick eventfds, the fault handlers' epoll sets (fault_wait.c once
 * left these) are anonymous inodes. 0, or how many there are. */
static int no_pool_fds(void *arg)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	(void)arg;
	if (!d)
		return 100;
	while ((e = readdir(d))) {
		char path[300], to[256] = "";

		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		if (readlink(path, to, sizeof(to) - 1) > 0 &&
		    (strstr(to, "[eventpoll]") || strstr(to, "[eventfd]") ||
		     strstr(to, "userfaultfd")))
			n++;
	}
	closedir(d);
	return n;
}

static int use_api(void *arg)
{
	struct ctx *c = arg;
	struct sb_stats st;
	struct sb_pool *dp;
	struct sb_buf *b;
	char *y;

	if (sb_buf_map(c->buf, 0, PAGE) != -ECHILD)
		return 10;
	if (sb_pool_stats(c->pool, &st) != -ECHILD)
		return 11;
	if (sb_buf_create(c->pool, PAGE, 0, NULL) != NULL)
		return 12;
	sb_buf_destroy(c->buf);		/* a no-op in the child */
	sb_pool_destroy(c->pool);	/* likewise */
	/* The child has a default pool of its own. */
	dp = sb_default_pool();
	if (!dp || dp == c->pool)
		return 13;
	b = sb_buf_create(dp, 64 * MiB, 0, NULL);
	if (!b)
		return 14;
	y = sb_buf_addr(b);
	y[3 * MiB] = 5;	/* a fault served by the child's own handler */
	if (y[3 * MiB] != 5 || sb_pool_stats(dp, &st) < 0 || st.faults < 1)
		return 15;
	sb_buf_destroy(b);
	return 0;
}

static int main_test(void)
{
	struct ctx c;
	long m0;
	int st;

	require_uffd();
	c.pool = make_pool(PAGE, 64 * MiB, 0);
	c.buf = make_buf(c.pool, 1 * GiB, 0);
	c.x = sb_buf_addr(c.buf);
	CHECK_EQ(sb_buf_map(c.buf, 0, 4 * PAGE), 4);
	memset(c.x, 'p', 4 * PAGE);
	m0 = maps_in(c.x, 1 * GiB);

	st = in_child(touch_placed, &c);
	CHECK(WIFEXITED(st));
	CHECK_EQ(WEXITSTATUS(st), EXIT_GOT_SIGSEGV);
	st = in_child(touch_unplaced, &c);
	CHECK(WIFEXITED(st));
	CHECK_EQ(WEXITSTATUS(st), EXIT_GOT_SIGSEGV);
	st = in_child(no_pool_fds, &c);
	CHECK(WIFEXITED(st));
	CHECK_EQ(WEXITSTATUS(st), 0);
	st = in_child(use_api, &c);
	CHECK(WIFEXITED(st));
	CHECK_EQ(WEXITSTATUS(st), 0);

	/* The parent: data intact, everything still works, and the fork
	 * marks are gone so new placements merge with old ones. */
	CHECK_EQ(c.x[4 * PAGE - 1], 'p');
	CHECK_EQ(sb_buf_map(c.buf, 4 * PAGE, 4 * PAGE), 4);
	c.x[20 * PAGE] = 1;	/* fault */
	CHECK_EQ(maps_in(c.x, 1 * GiB), m0 + 2);
	CHECK_EQ(stats(c.pool).pages_used, 9);
	sb_buf_destroy(c.buf);
	sb_pool_destroy(c.pool);
	printf("fork: the child sees no buffer, gets -ECHILD and its own pool\n");
	return 0;
}
