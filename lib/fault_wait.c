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
 * fs.epoll.max_user_watches) has its handler kicked (the pool's kick
 * eventfd, edge-triggered in every set) into polling the uffd, as all
 * did before; so does a handler whose set cannot be made at start
 * (EMFILE).
 *
 * The one woken may not get its CPU: a real-time thread spinning there,
 * or many runnable ones. Woken together, another handler served such a
 * fault at once; woken alone, it waited for that CPU (up to 0.93 s behind
 * a SCHED_FIFO spinner, the RT throttle's bound, in a review's test). So
 * the handlers that are not first wait with a timeout and then read the
 * uffd whatever woke them: 2 ms while faults come (one served in the last
 * 100 ms), 100 ms otherwise (as the ready thread's idle tick). A message
 * found so is a rescue; its handler looks up the faulting thread's CPU at
 * once and steers.
 */
#include "internal.h"
#include "dproto.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Look up the faulting thread's CPU at a handler's first fault and then
 * every this many. */
#define STEER_EVERY 8
/* The safety net's timeouts (ms), and how recent a fault makes it hot. */
#define NET_HOT_MS 2
#define NET_IDLE_MS 100
#define HOT_WINDOW_MS 100

enum { EV_UFFD, EV_QUIT, EV_KICK };

static struct sbi_test_fault test_readd;
static _Atomic unsigned test_stall_ms, test_stall_count;

static int add_uffd(struct sb_pool *pool, int ep)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE,
				 .data.u32 = EV_UFFD};

	return epoll_ctl(ep, EPOLL_CTL_ADD, pool->uffd, &ev);
}

/* A registration made again after EPOLL_CTL_DEL (test hook: failed). */
static int readd_uffd(struct sb_pool *pool, int ep)
{
	int err = sbi_test_failure(&test_readd);

	if (err) {
		errno = -err;
		return -1;
	}
	return add_uffd(pool, ep);
}

static int make_set(struct sb_pool *pool)
{
	struct epoll_event quit = {.events = EPOLLIN, .data.u32 = EV_QUIT};
	struct epoll_event kick = {.events = EPOLLIN | EPOLLET,
				   .data.u32 = EV_KICK};
	int ep = sbd_fd_above_std(epoll_create1(EPOLL_CLOEXEC), false);

	if (ep < 0)
		return -1;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, pool->quit_fd, &quit) < 0 ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, pool->fault_kick, &kick) < 0 ||
	    add_uffd(pool, ep) < 0) {
		close(ep);
		return -1;
	}
	return ep;
}

void sbi_fault_wait_init(struct sb_pool *pool)
{
	pool->fault_first_cpu = pool->faulters[0].cpu;
	for (int i = 0; i < pool->nwaiters; i++) {
		pool->faulters[i].ep = -1;
		pool->faulters[i].ep_lost = false;
		pool->faulters[i].since_steer = STEER_EVERY;
	}
	/* One handler: nothing to choose between. Else each in its own set,
	 * registered in order: the first CPU's handler is woken first until
	 * a fault says otherwise. A handler without a set polls. */
	if (pool->nwaiters < 2)
		return;
	pool->fault_kick = sbd_fd_above_std(
		eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), false);
	if (pool->fault_kick < 0)
		return;
	for (int i = 0; i < pool->nwaiters; i++)
		pool->faulters[i].ep = make_set(pool);
}

void sbi_fault_wait_fini(struct sb_pool *pool)
{
	for (int i = 0; i < pool->nwaiters; i++) {
		if (pool->faulters[i].ep >= 0)
			close(pool->faulters[i].ep);
		pool->faulters[i].ep = -1;
	}
	if (pool->fault_kick >= 0)
		close(pool->fault_kick);
	pool->fault_kick = -1;
}

/* How long this handler may sleep: for ever if a fault wakes it (the
 * first, or one that polls), else the safety net's timeout. */
static int wait_ms(struct sbi_fault_thread *t)
{
	struct sb_pool *pool = t->pool;
	uint64_t last;

	if (t->cpu == __atomic_load_n(&pool->fault_first_cpu, __ATOMIC_RELAXED))
		return -1;
	last = __atomic_load_n(&pool->fault_last_ms, __ATOMIC_RELAXED);
	return sbi_mono_ms() - last < HOT_WINDOW_MS ? NET_HOT_MS : NET_IDLE_MS;
}

int sbi_fault_wait(struct sbi_fault_thread *t)
{
	struct sb_pool *pool = t->pool;

	if (t->ep >= 0 && !__atomic_load_n(&t->ep_lost, __ATOMIC_ACQUIRE)) {
		struct epoll_event ev[3];
		int n = epoll_wait(t->ep, ev, 3, wait_ms(t)), r = 0;

		if (n < 0)
			return errno == EINTR ? 0 : -errno;
		if (n == 0)
			return 2;	/* the safety net: read anyway */
		for (int i = 0; i < n; i++)
			if (ev[i].data.u32 == EV_QUIT)
				return -ESHUTDOWN;
			else if (ev[i].data.u32 == EV_UFFD)
				r = 1;
		/* EV_KICK: wait again, with the timeout that is now right,
		 * or by polling if its uffd is lost. */
		if (r && sbi_test_take(&test_stall_count))
			usleep(atomic_load(&test_stall_ms) * 1000);
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
 * after the ')' that ends the name (which may hold spaces and parens).
 * Opened each time (every 8th fault): a descriptor kept would count
 * against the program's limit, could take a slot 0-2 it had closed, and
 * would stay with a fork()ed child. */
static int thread_cpu(pid_t tid)
{
	char path[64], buf[1024], *p;
	ssize_t n;
	int fd, field = 2, cpu = -1;

	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	if (n <= 0)
		return -1;
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

/* Every handler in a set wakes once (edge-triggered) and waits again as
 * it now should: the one that was first had chosen to sleep without a
 * timeout, and first no more, it would leave a fault whose handler
 * cannot run to wait (test_fault's stalled handler under TSan, 2 in 8
 * runs); one whose registration is lost goes to polling. The counter is
 * never read: 2^64 - 2 steerings. */
static void kick(struct sb_pool *pool)
{
	uint64_t one = 1;

	if (write(pool->fault_kick, &one, sizeof(one)) < 0)
		abort();
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
			/* ENOMEM or max_user_watches. A fault whose wake-up
			 * it had taken would wait for the net: kicked, it
			 * polls the uffd from now on, woken with every fault
			 * as before this file, and is never moved or chosen
			 * again. */
			sbi_warn("fault handler on CPU %d: epoll: %s; it "
				 "polls instead", o->cpu, strerror(errno));
			__atomic_store_n(&o->ep_lost, true, __ATOMIC_RELEASE);
		}
	}
	__atomic_store_n(&pool->fault_first_cpu, cpu, __ATOMIC_RELAXED);
	kick(pool);
}

void sbi_fault_served(struct sbi_fault_thread *t, pid_t tid, bool rescued)
{
	struct sb_pool *pool = t->pool;
	int cpu;

	__atomic_store_n(&pool->fault_last_ms, sbi_mono_ms(), __ATOMIC_RELAXED);
	if (rescued)
		t->since_steer = STEER_EVERY;	/* steer now */
	if (t->ep < 0 || tid <= 0 ||
	    __atomic_load_n(&t->ep_lost, __ATOMIC_RELAXED))
		return;
	/* Counted over every thread's faults: threads that take turns (a
	 * prefill on several) would otherwise cost a lookup each, and turn
	 * the order over at every fault. */
	if (++t->since_steer < STEER_EVERY)
		return;
	t->since_steer = 0;
	cpu = thread_cpu(tid);
	if (cpu < 0 ||
	    cpu == __atomic_load_n(&pool->fault_first_cpu, __ATOMIC_RELAXED))
		return;
	/* One handler steers at a time; another busy at it does the same. */
	if (__atomic_exchange_n(&pool->fault_steering, true, __ATOMIC_ACQUIRE))
		return;
	steer_to(pool, cpu);
	__atomic_store_n(&pool->fault_steering, false, __ATOMIC_RELEASE);
}

/* ---- test hooks (tests/test_fault.c) ---------------------------------------- */

/* The next `count` moves of a registration fail with -err. */
void sbi_test_fault_readd_fail(int err, unsigned count);
void sbi_test_fault_readd_fail(int err, unsigned count)
{
	sbi_test_arm(&test_readd, err, count);
}

/* The next `count` handlers woken for a fault sleep `ms` before reading
 * (a CPU they cannot get); count 0 disarms. */
void sbi_test_fault_stall(unsigned ms, unsigned count);
void sbi_test_fault_stall(unsigned ms, unsigned count)
{
	atomic_store(&test_stall_ms, ms);
	atomic_store(&test_stall_count, count);
}

/* The CPU whose handler a fault wakes first. */
int sbi_test_fault_first_cpu(struct sb_pool *pool);
int sbi_test_fault_first_cpu(struct sb_pool *pool)
{
	return __atomic_load_n(&pool->fault_first_cpu, __ATOMIC_RELAXED);
}

/* How many handlers poll (no set, or their registration lost). */
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
