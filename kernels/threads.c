/* SPDX-License-Identifier: MIT */
/*
 * The worker pool of the parallel kernels: n - 1 threads plus the caller,
 * created on first use, joined by sbk_shutdown() (registered with atexit)
 * or when the thread count changes.
 *
 * One job runs at a time (the submit lock); a caller that finds the pool
 * busy runs its items itself rather than wait. A job is published by
 * bumping gen (release) after its fields are written; every worker takes
 * part in every job and leaves it by decrementing pending (acq_rel), and
 * the submitter returns only when pending is 0, so the fields of the next
 * job are never written while a worker may still read the previous ones.
 *
 * Decode steps call kernels back to back (a matvec, then attention, ...),
 * so a worker spins for a while (SPIN_NS) before it sleeps on the condition
 * variable: a futex wake-up costs tens of microseconds in a VM.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define SPIN_NS	    200000

/* Held by the job's submitter; also guards the pool's life (workers,
 * nworkers, started). */
static pthread_mutex_t submit = PTHREAD_MUTEX_INITIALIZER;
/* Sleeping and waking only: taken around gen bumps and the last pending
 * decrement so that no wake-up is lost. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done = PTHREAD_COND_INITIALIZER;

static pthread_t *workers; /* (nworkers), under submit */
static int nworkers;	   /* under submit */
static bool started;	   /* under submit */

/* The job: written by the submitter before gen is bumped, read by workers
 * after they see the bump. */
static void (*job_fn)(void *ctx, int i);
static void *job_ctx;
static int job_n;
static atomic_int job_next; /* next item to hand out */
static atomic_int pending;  /* workers still in the current job */
static atomic_uint gen;	    /* bumped once per job */
static atomic_bool quit;    /* set (under mu) to stop the workers */

/* Thread count asked for: -1 not read from SBK_THREADS yet, 0 auto. */
static atomic_int want = -1;
static atomic_int ncpus; /* CPUs in the affinity mask, 0 unknown */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static long elapsed_ns(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000000000L +
	       (t.tv_nsec - t0->tv_nsec);
}

static void run_items(void)
{
	int i;

	while ((i = atomic_fetch_add_explicit(&job_next, 1,
					      memory_order_relaxed)) < job_n)
		job_fn(job_ctx, i);
}

/* Wait for a job newer than seen. Returns false when told to quit. */
static bool wait_job(unsigned *seen)
{
	struct timespec t0;
	unsigned g;
	int spins = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		g = atomic_load_explicit(&gen, memory_order_acquire);
		if (g != *seen) {
			*seen = g;
			return true;
		}
		if (atomic_load_explicit(&quit, memory_order_relaxed))
			return false;
		if (++spins % 64 == 0 && elapsed_ns(&t0) > SPIN_NS)
			break;
		__builtin_ia32_pause();
	}
	pthread_mutex_lock(&mu);
	while ((g = atomic_load_explicit(&gen, memory_order_acquire)) ==
		       *seen &&
	       !atomic_load_explicit(&quit, memory_order_relaxed))
		pthread_cond_wait(&wake, &mu);
	pthread_mutex_unlock(&mu);
	if (g == *seen)
		return false;
	*seen = g;
	return true;
}

static void *worker(void *arg)
{
	unsigned seen = (unsigned)(uintptr_t)arg;

	while (wait_job(&seen)) {
		run_items();
		if (atomic_fetch_sub_explicit(&pending, 1,
					      memory_order_acq_rel) == 1) {
			pthread_mutex_lock(&mu);
			pthread_cond_signal(&done);
			pthread_mutex_unlock(&mu);
		}
	}
	return NULL;
}

static void wait_done(void)
{
	struct timespec t0;
	int spins = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (atomic_load_explicit(&pending, memory_order_acquire)) {
		if (++spins % 64 == 0 && elapsed_ns(&t0) > SPIN_NS) {
			pthread_mutex_lock(&mu);
			while (atomic_load_explicit(&pending,
						    memory_order_acquire))
				pthread_cond_wait(&done, &mu);
			pthread_mutex_unlock(&mu);
			return;
		}
		__builtin_ia32_pause();
	}
}

static void stop_locked(void)
{
	if (!started)
		return;
	pthread_mutex_lock(&mu);
	atomic_store_explicit(&quit, true, memory_order_relaxed);
	pthread_cond_broadcast(&wake);
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < nworkers; i++)
		pthread_join(workers[i], NULL);
	free(workers);
	workers = NULL;
	nworkers = 0;
	started = false;
	atomic_store_explicit(&quit, false, memory_order_relaxed);
}

/* A fork()ed child has none of the workers: forget them (the locks may
 * have been held by threads that do not exist in the child). */
static void atfork_child(void)
{
	pthread_mutex_init(&submit, NULL);
	pthread_mutex_init(&mu, NULL);
	pthread_cond_init(&wake, NULL);
	pthread_cond_init(&done, NULL);
	free(workers);
	workers = NULL;
	nworkers = 0;
	started = false;
	atomic_store(&quit, false);
	atomic_store(&pending, 0);
}

static void register_exit(void)
{
	atexit(sbk_shutdown);
	pthread_atfork(NULL, NULL, atfork_child);
}

static int start_locked(int n)
{
	unsigned g = atomic_load_explicit(&gen, memory_order_relaxed);
	sigset_t all, old;
	int err = 0;

	pthread_once(&exit_once, register_exit);
	workers = calloc((size_t)n, sizeof(*workers));
	if (!workers)
		return -ENOMEM;
	/* Signals go to the application's threads, never to ours. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (nworkers = 0; nworkers < n; nworkers++) {
		err = pthread_create(&workers[nworkers], NULL, worker,
				     (void *)(uintptr_t)g);
		if (err)
			break;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	started = true;
	if (err) {
		stop_locked();
		return -err;
	}
	return 0;
}

void sbki_parallel(int n, void (*fn)(void *ctx, int i), void *ctx)
{
	int nt = sbk_get_threads();

	if (n <= 0)
		return;
	if (n == 1 || nt == 1 || pthread_mutex_trylock(&submit))
		goto serial;
	if (started && nworkers != nt - 1)
		stop_locked();
	if (!started && start_locked(nt - 1) < 0) {
		pthread_mutex_unlock(&submit);
		goto serial;
	}
	job_fn = fn;
	job_ctx = ctx;
	job_n = n;
	atomic_store_explicit(&job_next, 0, memory_order_relaxed);
	atomic_store_explicit(&pending, nworkers, memory_order_relaxed);
	pthread_mutex_lock(&mu);
	atomic_fetch_add_explicit(&gen, 1, memory_order_release);
	pthread_cond_broadcast(&wake);
	pthread_mutex_unlock(&mu);
	run_items();
	wait_done();
	pthread_mutex_unlock(&submit);
	return;
serial:
	for (int i = 0; i < n; i++)
		fn(ctx, i);
}

static int count_cpus(void)
{
	cpu_set_t set;
	long n;

	if (!sched_getaffinity(0, sizeof(set), &set))
		n = CPU_COUNT(&set);
	else
		n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

static void read_env(void)
{
	const char *s = getenv("SBK_THREADS");
	char *end;
	long n = 0;

	if (s && *s) {
		n = strtol(s, &end, 10);
		if (*end || n < 0 || n > MAX_THREADS) {
			fprintf(stderr,
				"sbkernels: SBK_THREADS=%s is not 0..%d: "
				"using 0 (one per CPU)\n",
				s, MAX_THREADS);
			n = 0;
		}
	}
	atomic_store(&want, (int)n);
}

SBK_API int sbk_get_threads(void)
{
	int w = atomic_load_explicit(&want, memory_order_relaxed), c;

	if (w < 0) {
		pthread_once(&env_once, read_env);
		w = atomic_load_explicit(&want, memory_order_relaxed);
	}
	if (w > 0)
		return w;
	c = atomic_load_explicit(&ncpus, memory_order_relaxed);
	if (!c) {
		c = count_cpus();
		atomic_store_explicit(&ncpus, c, memory_order_relaxed);
	}
	return c;
}

SBK_API int sbk_set_threads(int n)
{
	if (n < 0 || n > MAX_THREADS)
		return -EINVAL;
	pthread_once(&env_once, read_env);
	if (!n) /* the mask may have changed since it was counted */
		atomic_store(&ncpus, count_cpus());
	atomic_store(&want, n);
	pthread_mutex_lock(&submit);
	if (started && nworkers != sbk_get_threads() - 1)
		stop_locked();
	pthread_mutex_unlock(&submit);
	return 0;
}

SBK_API void sbk_shutdown(void)
{
	pthread_mutex_lock(&submit);
	stop_locked();
	pthread_mutex_unlock(&submit);
}
