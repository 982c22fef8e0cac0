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
 * the ready thread's affinity must exclude the main thread's CPU. Then a
 * KV cache grows by touch alone on another CPU (writes and sb_kv_commit,
 * nothing allocated by the thread): the ready thread must move off that
 * one (it once stayed, and preempted the decoding thread for 4 ms).
 */
#include "harness.h"
#include "sparsebuf_kv.h"

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

/* A KV cache that grows by touch alone: the decoding thread allocates
 * nothing (the growth watches place its pages), and calls only
 * sb_kv_commit. Made on CPU cpu, then decoded on another: the ready thread
 * must move off the new one. */
static void kv_by_touch(struct sb_pool *pool, int cpu, const cpu_set_t *all,
			pid_t tid)
{
	struct sb_kv_config cfg = {2, 1, 64, SB_KV_BF16, 4096, NULL, 0, 0};
	struct sb_kv_seq *seq;
	size_t row;
	cpu_set_t one;
	int cpu2 = -1, err;

	for (int c = 0; c < CPU_SETSIZE && cpu2 < 0; c++)
		if (c != cpu && CPU_ISSET(c, all))
			cpu2 = c;
	seq = sb_kv_create(pool, &cfg, &err);
	CHECK(seq != NULL);
	row = sb_kv_row_bytes(seq);
	CPU_ZERO(&one);
	CPU_SET(cpu2, &one);
	CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
	for (size_t t = 0; t < 1024; t++) {
		for (int l = 0; l < 2; l++) {
			memset((char *)sb_kv_k(seq, l) + t * row, 1, row);
			memset((char *)sb_kv_v(seq, l) + t * row, 2, row);
		}
		CHECK_EQ(sb_kv_commit(seq, 1), 0);
	}
	sleep_ms(3);
	if (!ready_avoids(tid, cpu2, 200))
		FAIL("a KV cache growing by touch on CPU %d: the ready thread "
		     "may still run there", cpu2);
	sb_kv_destroy(seq);
	printf("ready thread moved off CPU %d, where a KV cache grew by "
	       "touch\n", cpu2);
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
	printf("ready thread stayed off CPU %d through 64 prefetched placements\n",
	       cpu);
	kv_by_touch(pool, cpu, &all, tid);
	sb_pool_destroy(pool);
	return 0;
}
