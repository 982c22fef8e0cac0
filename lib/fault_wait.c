/* SPDX-License-Identifier: MIT */
/*
 * Where the fault handlers wait, and which of them a fault wakes.
 *
 * A handler pinned to each CPU, all waiting on the pool's userfaultfd:
 * woken together (poll), the one on the faulting thread's CPU wins, but
 * the faulting thread first pays for waking every other one. On a VM
 * whose other CPU is idle that is an IPI to a halted vCPU: traced on an
 * Intel KVM host, 13 us on the faulting thread's path before it switched
 * to the local handler, and the remote handler sometimes took the message
 * and served the fault from the other CPU, waking the thread back across
 * (a fault 36 us without the extra wake-up, 64 us with it).
 *
 * So each handler waits in its own epoll set, holding the uffd with
 * EPOLLEXCLUSIVE: a fault wakes one handler, the first in the uffd's wait
 * queue that is asleep in epoll_wait (a busy one lets the wake-up pass on,
 * so concurrent faults still find a handler each). Which is first is the
 * order of registration, and that is steered: after its faults, a handler
 * looks up every 8th time on which CPU the faulting thread runs
 * (/proc/self/task/TID/stat, 1.5-3.5 us, off the fault's path: after the
 * wake-up) and, when that CPU's handler is not first, moves every other
 * handler's registration to the queue's tail. A thread that stays on one
 * CPU then has its faults served there, without a cross-CPU wake-up
 * either way.
 *
 * Left: a handler preempted by the thread it has just woken is not in
 * epoll_wait at that thread's next fault, and the wake-up goes to another
 * CPU's handler (a quarter of bench/place's faults, traced). A short CPU
 * slice for the handlers (sched_setattr's sched_runtime, 0.1 ms) did not
 * keep them from being preempted there: tried and left out.
 *
 * Moving a registration (EPOLL_CTL_DEL then ADD) loses no fault: the
 * others stay registered meanwhile, and ADD reports a uffd that is
 * readable already. A registration that cannot be made again (ENOMEM,
 * fs.epoll.max_user_watches) has its handler kicked (an eventfd in its
 * set) into polling the uffd, as all did before; so does a handler
 * whose set cannot be made at start (EMFILE).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Look up the faulting thread's CPU at a handler's first fault and then
 * every this many. */
#define STEER_EVERY 8

enum { EV_UFFD, EV_QUIT, EV_KICK };

static int add_uffd(struct sb_pool *pool, int ep)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE,
				 .data.u32 = EV_UFFD};

	return epoll_ctl(ep, EPOLL_CTL_ADD, pool->uffd, &ev);
}

/* Test hook (tests/test_fault.c): the next `count` moves of a
 * registration fail with -err. */
static struct sbi_test_fault test_readd;

void sbi_test_fault_readd_fail(int err, unsigned count);
void sbi_test_fault_readd_fail(int err, unsigned count)
{
	sbi_test_arm(&test_readd, err, count);
}

static int readd_uffd(struct sb_pool *pool, int ep)
{
	int err = sbi_test_failure(&test_readd);

	if (err) {
		errno = -err;
		return -1;
	}
	return add_uffd(pool, ep);
}

void sbi_fault_wait_init(struct sb_pool *pool, struct sbi_fault_thread *t)
{
	struct epoll_event quit = {.events = EPOLLIN, .data.u32 = EV_QUIT};
	struct epoll_event kick = {.events = EPOLLIN, .data.u32 = EV_KICK};

	t->ep = t->kick = -1;
	t->stat_fd = -1;
	t->stat_tid = 0;
	t->since_steer = 0;
	t->ep_lost = false;
	/* One handler: nothing to choose between. */
	if (t->cpu < 0)
		return;
	t->ep = epoll_create1(EPOLL_CLOEXEC);
	t->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (t->ep < 0 || t->kick < 0 ||
	    epoll_ctl(t->ep, EPOLL_CTL_ADD, pool->quit_fd, &quit) < 0 ||
	    epoll_ctl(t->ep, EPOLL_CTL_ADD, t->kick, &kick) < 0 ||
	    add_uffd(pool, t->ep) < 0)
		sbi_fault_wait_fini(t);	/* it polls */
}

void sbi_fault_wait_fini(struct sbi_fault_thread *t)
{
	if (t->ep >= 0)
		close(t->ep);
	if (t->kick >= 0)
		close(t->kick);
	if (t->stat_fd >= 0)
		close(t->stat_fd);
	t->ep = t->kick = t->stat_fd = -1;
}

int sbi_fault_wait(struct sbi_fault_thread *t)
{
	struct sb_pool *pool = t->pool;

	if (t->ep >= 0 && !__atomic_load_n(&t->ep_lost, __ATOMIC_ACQUIRE)) {
		struct epoll_event ev[3];
		int n = epoll_wait(t->ep, ev, 3, -1), r = 0;

		if (n < 0)
			return errno == EINTR ? 0 : -errno;
		for (int i = 0; i < n; i++)
			if (ev[i].data.u32 == EV_QUIT)
				return -ESHUTDOWN;
			else if (ev[i].data.u32 == EV_UFFD)
				r = 1;
		/* EV_KICK: its uffd is lost, it polls from now on. */
		return r;
	} else {
		struct pollfd pfd[2] = {
			{.fd = pool->uffd, .events = POLLIN},
			{.fd = pool->quit_fd, .events = POLLIN},
		};

		if (poll(pfd, 2, -1) < 0)
			return errno == EINTR ? 0 : -errno;
		if (pfd[1].revents)
			return -ESHUTDOWN;
		return 1;
	}
}

/* The CPU thread tid last ran on, or -1. Field 39 of its stat, counted
 * after the ')' that ends the name (which may hold spaces and parens). */
static int thread_cpu(struct sbi_fault_thread *t, pid_t tid)
{
	char buf[1024], *p;
	ssize_t n;
	int field = 2, cpu = -1;

	if (t->stat_tid != tid) {
		char path[64];

		if (t->stat_fd >= 0)
			close(t->stat_fd);
		snprintf(path, sizeof(path), "/proc/self/task/%d/stat",
			 (int)tid);
		t->stat_fd = open(path, O_RDONLY | O_CLOEXEC);
		t->stat_tid = tid;
	}
	if (t->stat_fd < 0)
		return -1;
	n = pread(t->stat_fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0) {	/* the thread is gone */
		close(t->stat_fd);
		t->stat_fd = -1;
		return -1;
	}
	buf[n] = '\0';
	p = strrchr(buf, ')');
	if (!p)
		return -1;
	for (p++; *p && field < 39; p++)
		if (*p == ' ')
			field++;
	if (field == 39 && sscanf(p, "%d", &cpu) != 1)
		cpu = -1;
	return cpu;
}

/* Make the handler on cpu the first its faults wake: every other
 * handler's registration moves to the tail, in order. */
static void steer_to(struct sb_pool *pool, int cpu)
{
	struct sbi_fault_thread *target = NULL;

	for (int i = 0; i < pool->nwaiters; i++)
		if (pool->faulters[i].cpu == cpu &&
		    pool->faulters[i].ep >= 0 &&
		    !__atomic_load_n(&pool->faulters[i].ep_lost,
				     __ATOMIC_RELAXED))
			target = &pool->faulters[i];
	if (!target)
		return;
	for (int i = 0; i < pool->nwaiters; i++) {
		struct sbi_fault_thread *o = &pool->faulters[i];

		if (o == target || o->ep < 0 ||
		    __atomic_load_n(&o->ep_lost, __ATOMIC_RELAXED))
			continue;
		epoll_ctl(o->ep, EPOLL_CTL_DEL, pool->uffd, NULL);
		if (readd_uffd(pool, o->ep) < 0 && readd_uffd(pool, o->ep) < 0) {
			uint64_t one = 1;

			/* ENOMEM or max_user_watches. A fault whose wake-up
			 * it had taken would wait for the next fault: kicked,
			 * it polls the uffd from now on, woken with every
			 * fault as before this file, and is never moved or
			 * chosen again. */
			sbi_warn("fault handler on CPU %d: epoll: %s; it "
				 "polls instead", o->cpu, strerror(errno));
			__atomic_store_n(&o->ep_lost, true, __ATOMIC_RELEASE);
			if (write(o->kick, &one, sizeof(one)) < 0)
				abort();	/* 2^64 - 1 kicks */
		}
	}
	__atomic_store_n(&pool->fault_first_cpu, cpu, __ATOMIC_RELAXED);
}

void sbi_fault_steer(struct sbi_fault_thread *t, pid_t tid)
{
	struct sb_pool *pool = t->pool;
	int cpu;

	if (t->ep < 0 || tid <= 0 ||
	    __atomic_load_n(&t->ep_lost, __ATOMIC_RELAXED))
		return;
	/* Counted over every thread's faults: threads that take turns (a
	 * prefill on several) would otherwise cost a lookup each, and turn
	 * the order over at every fault. */
	if (t->stat_tid && ++t->since_steer < STEER_EVERY)
		return;
	t->since_steer = 0;
	cpu = thread_cpu(t, tid);
	if (cpu < 0 ||
	    cpu == __atomic_load_n(&pool->fault_first_cpu, __ATOMIC_RELAXED))
		return;
	/* One handler steers at a time; another busy at it does the same. */
	if (__atomic_exchange_n(&pool->fault_steering, true, __ATOMIC_ACQUIRE))
		return;
	steer_to(pool, cpu);
	__atomic_store_n(&pool->fault_steering, false, __ATOMIC_RELEASE);
}

/* Test hooks (tests/test_fault.c): the CPU whose handler a fault wakes
 * first; how many handlers lost their registration and poll. */
int sbi_test_fault_first_cpu(struct sb_pool *pool);
int sbi_test_fault_first_cpu(struct sb_pool *pool)
{
	return __atomic_load_n(&pool->fault_first_cpu, __ATOMIC_RELAXED);
}

int sbi_test_fault_polling(struct sb_pool *pool);
int sbi_test_fault_polling(struct sb_pool *pool)
{
	int n = 0;

	for (int i = 0; i < pool->nwaiters; i++)
		n += pool->faulters[i].ep < 0 ||
		     __atomic_load_n(&pool->faulters[i].ep_lost,
				     __ATOMIC_RELAXED);
	return n;
}
