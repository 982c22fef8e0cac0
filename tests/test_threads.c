/* The library's threads (issue 10, defect 14): created by an application
 * thread pinned to one CPU, every library thread still gets its CPUs set
 * explicitly (a fault handler pinned to each CPU of the process, the
 * ready thread and the disk tier's threads on all of them), every one
 * blocks every signal, and the disk tier exists as soon as the first
 * evictable buffer does: before any fault, so the fault path never sets
 * it up. */
#include "harness.h"

#include <dirent.h>
#include <sched.h>

struct lthread {
	char comm[32];
	cpu_set_t cpus;
	char sigblk[32];
};

/* The threads of this process whose name starts with "sb-". */
static int library_threads(struct lthread *t, int max)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	CHECK(d != NULL);
	while ((e = readdir(d)) && n < max) {
		char path[300], line[256];
		FILE *f;
		pid_t tid = (pid_t)atoi(e->d_name);

		if (tid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%d/comm", tid);
		f = fopen(path, "r");
		if (!f)
			continue;	/* gone meanwhile */
		if (!fgets(t[n].comm, sizeof(t[n].comm), f))
			t[n].comm[0] = 0;
		fclose(f);
		t[n].comm[strcspn(t[n].comm, "\n")] = 0;
		if (strncmp(t[n].comm, "sb-", 3))
			continue;
		if (sched_getaffinity(tid, sizeof(t[n].cpus), &t[n].cpus) < 0)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%d/status", tid);
		f = fopen(path, "r");
		t[n].sigblk[0] = 0;
		while (f && fgets(line, sizeof(line), f))
			if (!strncmp(line, "SigBlk:", 7))
				sscanf(line + 7, "%31s", t[n].sigblk);
		if (f)
			fclose(f);
		n++;
	}
	closedir(d);
	return n;
}

static int count_named(const struct lthread *t, int n, const char *prefix)
{
	int k = 0;

	for (int i = 0; i < n; i++)
		k += !strncmp(t[i].comm, prefix, strlen(prefix));
	return k;
}

static int main_test(void)
{
	cpu_set_t all, one;
	struct lthread t[64];
	struct sb_pool *p;
	struct sb_buf *b;
	int n, ncpu, pinned = 0;

	require_uffd();
	CHECK(sched_getaffinity(0, sizeof(all), &all) == 0);
	ncpu = CPU_COUNT(&all);
	if (ncpu < 2)
		SKIP("one CPU: nothing to tell apart");
	/* This thread (the application's) runs on its last CPU only. */
	CPU_ZERO(&one);
	for (int c = CPU_SETSIZE - 1; c >= 0; c--) {
		if (CPU_ISSET(c, &all)) {
			CPU_SET(c, &one);
			break;
		}
	}
	CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);

	p = make_pool(64 * KiB, 4 * MiB, 1 * MiB);
	n = library_threads(t, 64);
	CHECK_EQ(count_named(t, n, "sb-io"), 0);	/* no disk tier yet */
	b = make_buf(p, 64 * MiB, SB_BUF_EVICTABLE);
	n = library_threads(t, 64);
	/* The disk tier came with the evictable buffer, before any fault. */
	CHECK(count_named(t, n, "sb-io") >= 1);
	CHECK_EQ(stats(p).faults, 0);
	CHECK_EQ(count_named(t, n, "sb-fault/"), ncpu > 4 ? 4 : ncpu);
	CHECK_EQ(count_named(t, n, "sb-ready"), 1);
	for (int i = 0; i < n; i++) {
		printf("%-12s CPUs %d, signals blocked %s\n", t[i].comm,
		       CPU_COUNT(&t[i].cpus), t[i].sigblk);
		/* Every signal blocked but those that cannot be (SIGKILL,
		 * SIGSTOP) and glibc's own two (32, 33). */
		{
			uint64_t m = strtoull(t[i].sigblk, NULL, 16);

			for (int sig = 1; sig <= 64; sig++) {
				if (sig == SIGKILL || sig == SIGSTOP ||
				    sig == 32 || sig == 33)
					continue;
				if (!(m >> (sig - 1) & 1))
					FAIL("%s takes signal %d", t[i].comm,
					     sig);
			}
		}
		if (!strncmp(t[i].comm, "sb-fault/", 9)) {
			CHECK_EQ(CPU_COUNT(&t[i].cpus), 1);
			pinned++;
		} else {
			/* The ready thread gives up the application's CPU
			 * while it allocates (ready.c), so it may have one
			 * fewer; never only the application's one. */
			CHECK(CPU_COUNT(&t[i].cpus) >= ncpu - 1);
			CHECK(!CPU_EQUAL(&t[i].cpus, &one));
		}
	}
	CHECK(pinned >= 2);
	/* And the pool works from here: a fault, an eviction, a read. */
	memset(sb_buf_addr(b), 7, 2 * MiB);
	CHECK(stats(p).pages_out > 0);
	CHECK_EQ(((volatile char *)sb_buf_addr(b))[0], 7);
	sb_pool_destroy(p);
	return 0;
}

static int child(const char *name)
{
	(void)name;
	return 2;
}
