/* SPDX-License-Identifier: MIT */
/*
 * Counters for other processes (sparsebuf-stat): each pool publishes a
 * snapshot of sb_pool_stats in one page of a memfd named
 * "sparsebuf-stats", which another process (root, or the same user with
 * ptrace access, as for /proc/PID/mem) opens through /proc/PID/fd and maps
 * read-only. The pool's ready thread refreshes it at its 100 ms tick under
 * a sequence counter: the hot paths do nothing more than they did (the
 * counters they bump are the ones sb_pool_stats reads). A pool whose
 * memfd cannot be made runs without it.
 */
#include "internal.h"
#include "dproto.h"
#include "stat_page.h"

#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

void sbi_stat_open(struct sb_pool *pool)
{
	struct sbi_stat_page *p;
	long ps = sysconf(_SC_PAGESIZE);
	int fd;

	pool->stat = NULL;
	pool->stat_fd = -1;
	fd = sbd_fd_above_std(memfd_create(SBI_STAT_NAME, MFD_CLOEXEC), true);
	if (fd < 0)
		return;
	if (ftruncate(fd, ps) < 0) {
		close(fd);
		return;
	}
	p = mmap(NULL, (size_t)ps, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return;
	}
	memcpy(p->magic, SBI_STAT_MAGIC, sizeof(p->magic));
	p->version = 1;
	p->stats_size = sizeof(struct sb_stats);
	p->pid = (int32_t)getpid();
	p->pool_id = pool->id;
	p->period_ms = 100;
	pool->stat = p;
	pool->stat_fd = fd;
}

void sbi_stat_publish(struct sb_pool *pool)
{
	SBI_HELD(&pool->lock);
	struct sbi_stat_page *p = pool->stat;
	struct timespec ts;
	struct sb_stats st;

	if (!p)
		return;
	uint64_t *dst = (uint64_t *)&p->st, seq = p->seq, ns;
	const uint64_t *src = (const uint64_t *)&st;

	sbi_pool_stats_locked(pool, &st);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	/* A sequence lock without fences: the odd count first; each word
	 * after it a release store (so none is seen before the odd count);
	 * the even count last. */
	__atomic_store_n(&p->seq, seq + 1, __ATOMIC_RELAXED);
	for (size_t i = 0; i < sizeof(st) / sizeof(uint64_t); i++)
		__atomic_store_n(&dst[i], src[i], __ATOMIC_RELEASE);
	__atomic_store_n(&p->time_ns, ns, __ATOMIC_RELEASE);
	__atomic_store_n(&p->seq, seq + 2, __ATOMIC_RELEASE);
}

void sbi_stat_close(struct sb_pool *pool)
{
	if (pool->stat)
		munmap(pool->stat, (size_t)sysconf(_SC_PAGESIZE));
	if (pool->stat_fd >= 0)
		close(pool->stat_fd);
	pool->stat = NULL;
	pool->stat_fd = -1;
}
