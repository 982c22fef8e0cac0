/* SPDX-License-Identifier: MIT */
/*
 * Starting the library's threads, all one way: they take no signals (those
 * are the program's), they have a name ("sb-..."), and their CPUs are set
 * explicitly: one CPU for a pinned fault handler, else every CPU the
 * process could use when the library was loaded. Left alone, a thread
 * inherits its creator's affinity, and the creator may be an application
 * thread pinned to one CPU, or a pinned fault handler that set up the
 * disk tier: the new thread would then compete with it for that CPU.
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>

__thread bool sbi_internal_thread;
__thread bool sbi_ready_self;

void sbi_thread_internal(void)
{
	sbi_internal_thread = true;
}

static cpu_set_t load_cpus;
static bool load_cpus_known;

__attribute__((constructor)) static void note_load_cpus(void)
{
	load_cpus_known =
		sched_getaffinity(0, sizeof(load_cpus), &load_cpus) == 0 &&
		CPU_COUNT(&load_cpus) > 0;
}

void sbi_process_cpus(cpu_set_t *set)
{
	if (load_cpus_known) {
		*set = load_cpus;
		return;
	}
	if (sched_getaffinity(0, sizeof(*set), set) < 0 || !CPU_COUNT(set)) {
		CPU_ZERO(set);
		for (int c = 0; c < CPU_SETSIZE; c++)
			CPU_SET(c, set);
	}
}

int sbi_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg,
		     const char *name, int cpu)
{
	pthread_attr_t attr;
	sigset_t all, old;
	cpu_set_t set;
	int r;

	if (cpu >= 0 && cpu < CPU_SETSIZE) {
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
	} else {
		sbi_process_cpus(&set);
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
	r = pthread_create(thread, &attr, fn, arg);
	pthread_attr_destroy(&attr);
	if (r == EINVAL) {
		/* The CPUs of load time are gone (a cpuset changed): the
		 * creator's will do. */
		r = pthread_create(thread, NULL, fn, arg);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r)
		return -r;
	pthread_setname_np(*thread, name);
	return 0;
}
