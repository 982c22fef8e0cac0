/* SPDX-License-Identifier: MIT */
/*
 * The pool's ready thread keeps off the CPU of the application thread that
 * allocates (docs/design.md, threads): sharing it, it would time-slice
 * that thread and stall it for milliseconds. Only application threads
 * count: the ready thread itself allocates when it places a prefetched
 * page, and it once recorded its own CPU then, moved onto the
 * application's and preempted it hundreds of times a second (bench/kv's
 * worst growth stall: 2.9 ms instead of 0.05 ms).
 *
 * Here the main thread is pinned to one CPU and asks for pages with
 * sb_buf_prefetch, which the ready thread places; after every placement
 * the ready thread's affinity must exclude the main thread's CPU.
 */
#include "harness.h"

#include <dirent.h>
#include <sched.h>

/* The tid of the one thread called "sb-ready", or 0. */
static pid_t ready_tid(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	pid_t tid = 0;

	CHECK(d != NULL);
	while ((e = readdir(d))) {
		char path[300], comm[32] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm",
			 e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && !strncmp(comm, "sb-ready", 8))
			tid = atoi(e->d_name);
		fclose(f);
	}
	closedir(d);
	return tid;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {0, ms * 1000000L};

	nanosleep(&ts, NULL);
}

/* Whether the ready thread keeps off cpu within timeout_ms. */
static bool ready_avoids(pid_t tid, int cpu, int timeout_ms)
{
	for (int t = 0; t < timeout_ms; t++) {
		cpu_set_t set;

		CHECK(sched_getaffinity(tid, sizeof(set), &set) == 0);
		if (!CPU_ISSET(cpu, &set))
			return true;
		sleep_ms(1);
	}
	return false;
}

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	const size_t page = 256 * KiB;
	struct sb_pool_opts o;
	struct sb_pool *pool;
	struct sb_buf *buf;
	cpu_set_t all, one;
	int cpu = -1, err;
	pid_t tid;

	require_uffd();
	CHECK(sched_getaffinity(0, sizeof(all), &all) == 0);
	if (CPU_COUNT(&all) < 2)
		SKIP("needs 2 CPUs to keep apart, this process may use %d",
		     CPU_COUNT(&all));
	for (int c = 0; c < CPU_SETSIZE && cpu < 0; c++)
		if (CPU_ISSET(c, &all))
			cpu = c;
	/* The pool first: its threads inherit the creator's CPUs, and the
	 * ready thread can only keep off a CPU if it may use another. */
	sb_pool_opts_init(&o);
	o.page_size = page;
	pool = sb_pool_create(&o, &err);
	CHECK(pool != NULL);
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
	buf = sb_buf_create(pool, 64 * MiB, 0, &err);
	CHECK(buf != NULL);
	tid = ready_tid();
	CHECK(tid > 0);

	for (size_t i = 0; i < 64; i++) {
		struct sb_range r = {i * page, page};
		int waited = 0;

		CHECK(sb_buf_prefetch(buf, &r, 1, 0) >= 0);
		/* Placed by the ready thread (or, if it is late, by nobody
		 * yet: wait for it). */
		while (sb_buf_placed(buf, r.off, r.len) != 1) {
			CHECK(++waited < 5000);
			sleep_ms(1);
		}
		/* Let it go round its loop, where it picks its CPUs. */
		sleep_ms(3);
		if (!ready_avoids(tid, cpu, 200))
			FAIL("after placing page %zu the ready thread may run on "
			     "CPU %d, the application thread's", i, cpu);
	}
	sb_buf_destroy(buf);
	sb_pool_destroy(pool);
	printf("ready thread stayed off CPU %d through 64 prefetched placements\n",
	       cpu);
	return 0;
}
