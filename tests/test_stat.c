/* sparsebuf-stat (issue 13): another process sees this one's pools, their
 * pages in use and their rates, through the counters each pool publishes
 * (lib/stat.c); a fork()ed child's copy of the parent's page is not taken
 * for the child's. */
#include "harness.h"

#include <libgen.h>
#include <limits.h>
#include <pthread.h>

static atomic_bool stop_maps;

static int child(const char *name)
{
	(void)name;
	return 2;
}

/* Keeps placing and releasing pages while the tool watches: rates. */
static void *mapper(void *arg)
{
	struct sb_buf *b = arg;

	while (!atomic_load(&stop_maps)) {
		sb_buf_map(b, 0, 64 * 4096);
		sb_buf_unmap(b, 0, 64 * 4096);
		usleep(1000);
	}
	return NULL;
}

/* Run the tool on pid; its stdout into out. */
static int run_stat(const char *tool, int pid, const char *interval,
		    const char *count, char *out, size_t len)
{
	char cmd[PATH_MAX + 128];
	FILE *p;
	size_t n;

	snprintf(cmd, sizeof(cmd), "'%s' %d %s %s 2>&1", tool, pid, interval,
		 count);
	p = popen(cmd, "r");
	if (!p)
		FAIL("popen");
	n = fread(out, 1, len - 1, p);
	out[n] = 0;
	return pclose(p);
}

static int main_test(void)
{
	char self[PATH_MAX], tool[PATH_MAX + 32], out[8192];
	ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	struct sb_pool *a, *b;
	struct sb_buf *x, *y;
	pthread_t t;
	double used;
	unsigned id;
	int st, lines = 0;
	char *line;

	require_uffd();
	CHECK(len > 0);
	self[len] = 0;
	snprintf(tool, sizeof(tool), "%s/bin/sparsebuf-stat",
		 dirname(dirname(self)));
	if (access(tool, X_OK))
		SKIP("%s not built", tool);
	a = make_pool(4096, 4 * MiB, 0);
	b = make_pool(4096, 4 * MiB, 0);
	x = make_buf(a, 64 * MiB, 0);
	y = make_buf(b, 64 * MiB, 0);
	CHECK_EQ(sb_buf_map(x, 0, 3 * MiB), 768);
	CHECK_EQ(sb_buf_map(y, 0, 5 * MiB), 1280);
	usleep(300 * 1000);	/* a 100 ms tick publishes it */
	pthread_create(&t, NULL, mapper, y);
	st = run_stat(tool, getpid(), "0.3", "2", out, sizeof(out));
	atomic_store(&stop_maps, true);
	pthread_join(t, NULL);
	printf("%s", out);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* Two pools, two lines each, the header first. */
	for (line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		double rdy, res, disk, faults, maps;

		if (strstr(line, "pool"))
			continue;
		CHECK(sscanf(line, "%u %lf %lf %lf %*s %lf %lf %lf", &id, &used,
			     &rdy, &res, &disk, &faults, &maps) == 7);
		if (used < 4)
			CHECK(used >= 2.9 && used <= 3.1);	/* pool a */
		else
			CHECK(maps > 1000);	/* pool b, its mapper running */
		lines++;
	}
	CHECK_EQ(lines, 4);

	/* A process without pools, and one that does not exist. */
	st = run_stat(tool, 1, "0.1", "1", out, sizeof(out));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(out, "no sparsebuf pool"));
	st = run_stat(tool, 4194303, "0.1", "1", out, sizeof(out));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);

	/* A fork()ed child inherits the descriptors of its parent's stats
	 * pages, not the pools: the tool must not show them as the child's. */
	{
		pid_t pid = fork();

		if (pid == 0) {
			sleep(2);
			_exit(0);
		}
		usleep(100 * 1000);
		st = run_stat(tool, pid, "0.1", "1", out, sizeof(out));
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 &&
		      strstr(out, "no sparsebuf pool"));
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	sb_buf_destroy(x);
	sb_buf_destroy(y);
	sb_pool_destroy(a);
	sb_pool_destroy(b);
	printf("ok\n");
	return 0;
}
