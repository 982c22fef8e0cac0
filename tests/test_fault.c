/* The fault handler: demand placement, many threads faulting the same
 * pages, unmap racing faults, SIGBUS when the budget is exhausted (never a
 * hang, never a silent zero page, also when signals keep interrupting the
 * toucher's waits, with and without UFFDIO_POISON), recovery after it, and
 * clean shutdown with no thread or descriptor left behind. */
#include "harness.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>

#define PAGE (256 * KiB)

void sbi_test_no_poison(struct sb_pool *pool);

/*
 * Touches of unplaced pages that the budget refuses, while signals keep
 * interrupting the toucher's waits: every one raises a signal, none reads
 * a silent zero page or writes into one. With `fallback`, the way kernels
 * before 6.6 (no UFFDIO_POISON) are answered.
 */
static int budget_signals(bool fallback)
{
	enum { N = 32 };
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, N * PAGE);
	struct sb_buf *a = make_buf(p, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0);
	volatile char *y = sb_buf_addr(b);

	if (fallback)
		sbi_test_no_poison(p);
	if (sb_buf_map(a, 0, N * PAGE) != N)
		return 3;
	if (touch_signalled(y, PAGE, N, false).went_through)
		return 6;
	if (touch_signalled(y + N * PAGE, PAGE, N, true).went_through)
		return 7;
	return stats(p).pages_used == N ? 0 : 8;
}

static int child(const char *name)
{
	if (!strcmp(name, "budget-signals"))
		return budget_signals(false);
	if (!strcmp(name, "budget-signals-fallback"))
		return budget_signals(true);
	if (!strcmp(name, "budget")) {
		/* Three pages of budget, a fourth touched. */
		struct sb_pool *p = make_pool(PAGE, 64 * MiB, 3 * PAGE);
		struct sb_buf *b = make_buf(p, 1 * GiB, 0);
		volatile char *x = sb_buf_addr(b);

		for (int i = 0; i < 3; i++)
			x[(size_t)i * PAGE] = 1;
		if (stats(p).pages_used != 3)
			return 3;
		expect_signal_at((char *)x + 3 * PAGE, PAGE);
		x[3 * PAGE + 5] = 1;
		return 4;	/* neither SIGBUS nor a hang: a silent page */
	}
	if (!strcmp(name, "budget-read")) {
		/* A read of an unplaced page when the budget is gone. */
		struct sb_pool *p = make_pool(PAGE, 64 * MiB, PAGE);
		struct sb_buf *b = make_buf(p, 1 * GiB, 0);
		volatile char *x = sb_buf_addr(b);

		if (sb_buf_map(b, 0, PAGE) != 1)
			return 3;
		expect_signal_at((char *)x + 9 * PAGE, PAGE);
		return x[9 * PAGE + 1];
	}
	return 2;
}

/* ---- many threads, same pages ------------------------------------------- */

enum { NTHREADS = 8, NPAGES = 64 };

struct toucher {
	char *base;
	int id;
	pthread_barrier_t *go;
};

static void *touch_all(void *arg)
{
	struct toucher *t = arg;

	pthread_barrier_wait(t->go);
	for (int i = 0; i < NPAGES; i++) {
		/* Each thread writes its own slot of every page: a page
		 * placed twice would lose the earlier writes. */
		int *slot = (int *)(t->base + (size_t)i * PAGE) + t->id;

		*slot = t->id + 1000 * i;
	}
	return NULL;
}

static void same_pages(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	struct toucher t[NTHREADS];
	pthread_t th[NTHREADS];
	pthread_barrier_t go;
	struct sb_stats st;

	pthread_barrier_init(&go, NULL, NTHREADS);
	for (int i = 0; i < NTHREADS; i++) {
		t[i] = (struct toucher){sb_buf_addr(b), i, &go};
		pthread_create(&th[i], NULL, touch_all, &t[i]);
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&go);
	for (int i = 0; i < NPAGES; i++)
		for (int k = 0; k < NTHREADS; k++)
			CHECK_EQ(((int *)((char *)sb_buf_addr(b) +
					  (size_t)i * PAGE))[k],
				 k + 1000 * i);
	st = stats(p);
	CHECK_EQ(st.pages_used, NPAGES);
	CHECK_EQ(st.fault_places, NPAGES);	/* each page placed once */
	VERIFY(p);
	CHECK(st.faults >= NPAGES);
	printf("%d threads x %d pages: %llu fault messages, %llu placements\n",
	       NTHREADS, NPAGES, (unsigned long long)st.faults,
	       (unsigned long long)st.fault_places);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* ---- faults served on the faulting thread's CPU ------------------------------ */

int sbi_test_fault_first_cpu(struct sb_pool *pool);
int sbi_test_fault_polling(struct sb_pool *pool);
void sbi_test_fault_readd_fail(int err, unsigned count);
void sbi_test_fault_stall(unsigned ms, unsigned count);

static void pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	CHECK_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
}

struct steerer {
	char *base;	/* its own pages */
	int cpu, n;
	pthread_barrier_t *go;
};

static void *touch_pinned(void *arg)
{
	struct steerer *t = arg;

	pin(t->cpu);
	pthread_barrier_wait(t->go);
	for (int i = 0; i < t->n; i++) {
		volatile int *w = (int *)(t->base + (size_t)i * PAGE);

		if (*w != 0)
			FAIL("page %d on CPU %d: placed, not zero", i, t->cpu);
		*w = t->cpu + 1000 * i;
	}
	return NULL;
}

/*
 * A fault wakes one handler, steered to the CPU its thread runs on
 * (lib/fault_wait.c): a thread pinned to each CPU in turn has its CPU's
 * handler first within 64 faults (a lookup every 8th a handler serves).
 * Then a thread on each of two CPUs faults at once, the order flipping
 * under them: every page placed once, with its data. Then the handler
 * woken cannot run, and another serves the fault; then a registration
 * is lost, and its handler polls.
 */
static void steered(void)
{
	enum { N = 256 };
	struct sb_pool *p = make_pool(PAGE, 256 * MiB, 0);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	char *x = sb_buf_addr(b);
	cpu_set_t all;
	int cpus[2], n = 0, used = 0;
	struct steerer t[2];
	pthread_t th[2];
	pthread_barrier_t go;

	CHECK_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
	for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
		if (CPU_ISSET(c, &all))
			cpus[n++] = c;
	if (n < 2) {
		printf("steered: one CPU, nothing to steer between: not "
		       "tested\n");
		sb_buf_destroy(b);
		sb_pool_destroy(p);
		return;
	}
	for (int round = 0; round < 4; round++) {
		int c = cpus[round % 2], i;

		pin(c);
		/* A lookup every 8th fault a handler serves: within 16 if
		 * the two share them; 64 leaves room for a loaded machine. */
		for (i = 0; i < 64 && sbi_test_fault_first_cpu(p) != c;
		     i++, used++)
			((volatile char *)x)[(size_t)used * PAGE] = 1;
		if (sbi_test_fault_first_cpu(p) != c)
			FAIL("%d faults from CPU %d, and the handler a fault "
			     "wakes first is still CPU %d's", i, c,
			     sbi_test_fault_first_cpu(p));
	}
	CHECK(sched_setaffinity(0, sizeof(all), &all) == 0);
	pthread_barrier_init(&go, NULL, 2);
	for (int i = 0; i < 2; i++) {
		t[i] = (struct steerer){x + (size_t)(used + i * N) * PAGE,
					cpus[i], N, &go};
		pthread_create(&th[i], NULL, touch_pinned, &t[i]);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&go);
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < N; k++)
			CHECK_EQ(*(int *)(t[i].base + (size_t)k * PAGE),
				 cpus[i] + 1000 * k);
	CHECK_EQ(stats(p).fault_places, (uint64_t)(used + 2 * N));
	used += 2 * N;
	CHECK_EQ(sbi_test_fault_polling(p), 0);
	/* The handler a fault wakes cannot get its CPU (the hook: it sleeps
	 * 1.5 s before reading): another finds the fault by its safety net's
	 * timeout (2 or 100 ms) and serves it meanwhile. Not a timing claim:
	 * a fault served only by the sleeper takes the whole 1.5 s. */
	for (int i = 0; i < 2; i++) {
		double t0, waited;
		volatile int *w = (int *)(x + (size_t)used * PAGE);

		pin(cpus[i]);
		sbi_test_fault_stall(1500, 1);
		t0 = now_s();
		CHECK_EQ(*w, 0);
		waited = now_s() - t0;
		*w = used++;
		if (waited > 1.0)
			FAIL("a fault waited %.0f ms for the handler it woke",
			     waited * 1e3);
		usleep(1600 * 1000);	/* the sleeper wakes, finds none */
		sbi_test_fault_stall(0, 0);
	}
	CHECK(sched_setaffinity(0, sizeof(all), &all) == 0);
	CHECK_EQ(sbi_test_fault_polling(p), 0);
	/* A registration that cannot be made again (ENOMEM, the watch
	 * limit): its handler polls, and faults on both CPUs are served
	 * (a hang here is the test's timeout). */
	sbi_test_fault_readd_fail(ENOMEM, 2);
	for (int round = 0; round < 16 && !sbi_test_fault_polling(p); round++) {
		pin(cpus[(sbi_test_fault_first_cpu(p) == cpus[0]) ? 1 : 0]);
		for (int i = 0; i < 9; i++, used++) {
			volatile int *w = (int *)(x + (size_t)used * PAGE);

			CHECK_EQ(*w, 0);
			*w = used;
		}
	}
	CHECK_EQ(sbi_test_fault_polling(p), 1);
	for (int i = 0; i < 2; i++) {
		pin(cpus[i]);
		for (int k = 0; k < 16; k++, used++)
			((volatile char *)x)[(size_t)used * PAGE] = 1;
	}
	CHECK(sched_setaffinity(0, sizeof(all), &all) == 0);
	CHECK_EQ(stats(p).fault_places, (uint64_t)used);
	VERIFY(p);
	printf("steered: faults served first on CPU %d and %d as their "
	       "thread moved; 2 x %d concurrent faults placed once each; "
	       "served while the handler woken could not run; a handler "
	       "whose registration was lost polls\n",
	       cpus[0], cpus[1], N);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* ---- unmap racing faults --------------------------------------------------- */

struct racer {
	struct sb_buf *b;
	atomic_int *stop;
	long ops;
};

static void *race_touch(void *arg)
{
	struct racer *r = arg;
	volatile char *x = sb_buf_addr(r->b);

	while (!atomic_load(r->stop)) {
		for (int i = 0; i < 16; i++)
			__atomic_store_n(&x[(size_t)i * PAGE +
					    (size_t)(r->ops % 4096)],
					 1, __ATOMIC_RELAXED);
		r->ops++;
	}
	return NULL;
}

static void *race_unmap(void *arg)
{
	struct racer *r = arg;

	while (!atomic_load(r->stop)) {
		CHECK(sb_buf_unmap(r->b, 0, 16 * PAGE) >= 0);
		CHECK(sb_buf_map(r->b, (size_t)(r->ops % 16) * PAGE, PAGE) >=
		      0);
		r->ops++;
	}
	return NULL;
}

static void unmap_during_faults(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 64 * MiB, 0);
	atomic_int stop = 0;
	struct racer r[4] = {{b, &stop, 0}, {b, &stop, 0}, {b, &stop, 0},
			     {b, &stop, 0}};
	pthread_t th[4];
	double t0 = now_s();

	pthread_create(&th[0], NULL, race_touch, &r[0]);
	pthread_create(&th[1], NULL, race_touch, &r[1]);
	pthread_create(&th[2], NULL, race_unmap, &r[2]);
	pthread_create(&th[3], NULL, race_unmap, &r[3]);
	while (now_s() - t0 < 1.5)
		usleep(10000);
	atomic_store(&stop, 1);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	printf("unmap racing faults: %ld touches, %ld unmaps, %llu faults\n",
	       r[0].ops + r[1].ops, r[2].ops + r[3].ops,
	       (unsigned long long)stats(p).faults);
	CHECK(r[0].ops > 0 && r[2].ops > 0);
	/* The page table and the pool agree, once the handler is done: when
	 * both touchers fault on one page, the placement for the first
	 * message wakes both; if an unmap then comes before the second
	 * message is served, serving it places the page again, after its
	 * toucher has moved on, even exited. Messages are readable only
	 * while their thread waits, so after the joins only those already
	 * read remain: microseconds of work. */
	usleep(50 * 1000);
	WAIT_FOR(stats(p).pages_used == (size_t)sb_buf_placed(b, 0, 64 * MiB),
		 5);
	CHECK_EQ(stats(p).pages_used, sb_buf_placed(b, 0, 64 * MiB));
	VERIFY(p);
	CHECK(sb_buf_unmap(b, 0, 64 * MiB) >= 0);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

/* ---- SIGBUS in this process, then recovery ------------------------------- */

static sigjmp_buf jb;
static volatile void *bus_addr;

static void on_bus(int sig, siginfo_t *si, void *ctx)
{
	(void)sig;
	(void)ctx;
	bus_addr = si->si_addr;
	siglongjmp(jb, 1);
}

/* Touch *p; returns 1 if it raised SIGBUS. */
static int touch_bus(volatile char *p)
{
	if (sigsetjmp(jb, 1))
		return 1;
	*p = 7;
	return 0;
}

static void poison_and_recover(void)
{
	struct sb_pool *p = make_pool(PAGE, 64 * MiB, 2 * PAGE);
	struct sb_buf *b = make_buf(p, 1 * GiB, 0);
	volatile char *x = sb_buf_addr(b);
	struct sigaction sa, old;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_bus;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGBUS, &sa, &old);
	CHECK_EQ(touch_bus(x), 0);
	CHECK_EQ(touch_bus(x + PAGE), 0);
	CHECK_EQ(touch_bus(x + 5 * PAGE), 1);	/* over budget */
	CHECK(bus_addr == x + 5 * PAGE);
	CHECK_EQ(stats(p).sigbus, 1);
	CHECK_EQ(stats(p).pages_used, 2);
	/* Memory freed, but the page stays poisoned until it is placed or
	 * unmapped: a SIGBUS handler that returns must not loop silently. */
	CHECK_EQ(sb_buf_unmap(b, 0, PAGE), 1);
	CHECK_EQ(touch_bus(x + 5 * PAGE), 1);
	CHECK_EQ(sb_buf_placed(b, 5 * PAGE, 1), 0);
	/* sb_buf_unmap clears the poison (it releases no page there). */
	CHECK_EQ(sb_buf_unmap(b, 5 * PAGE, PAGE), 0);
	CHECK_EQ(touch_bus(x + 5 * PAGE), 0);	/* a fault places it now */
	CHECK_EQ(x[5 * PAGE], 7);
	CHECK_EQ(x[5 * PAGE + 1], 0);
	/* sb_buf_map also clears it. */
	CHECK_EQ(touch_bus(x + 6 * PAGE), 1);
	CHECK_EQ(sb_buf_unmap(b, 0, 2 * PAGE), 1);
	CHECK_EQ(sb_buf_map(b, 6 * PAGE, 1), 1);
	CHECK_EQ(touch_bus(x + 6 * PAGE), 0);
	VERIFY(p);
	sigaction(SIGBUS, &old, NULL);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).pages_used, 0);
	sb_pool_destroy(p);
}

/* ---- shutdown ----------------------------------------------------------------- */

static int count_dir(const char *path)
{
	DIR *d = opendir(path);
	int n = 0;

	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n;
}

static void create_destroy_loop(void)
{
	int fds0 = count_dir("/proc/self/fd"), th0 = count_dir("/proc/self/task");
	long maps0 = maps_total();

	for (int i = 0; i < 100; i++) {
		struct sb_pool *p = make_pool(PAGE, 4 * MiB, 0);
		struct sb_buf *b = make_buf(p, 1 * GiB, 0);

		((volatile char *)sb_buf_addr(b))[(size_t)i * PAGE] = 1;
		CHECK_EQ(sb_buf_map(b, 0, 32 * PAGE), 31 + (i >= 32));
		/* Destroying the pool destroys its buffers too. */
		if (i % 2)
			sb_buf_destroy(b);
		sb_pool_destroy(p);
	}
	CHECK_EQ(count_dir("/proc/self/fd"), fds0);
	CHECK_EQ(count_dir("/proc/self/task"), th0);
	CHECK_EQ(maps_named("sparsebuf-heap"), 0);
	CHECK(maps_total() <= maps0 + MAPS_SLACK);
}

static int main_test(void)
{
	require_uffd();
	same_pages();
	steered();
	unmap_during_faults();
	poison_and_recover();
	create_destroy_loop();
	CHECK_EQ(child_exit_code(run_child("budget")), EXIT_GOT_SIGBUS);
	CHECK_EQ(child_exit_code(run_child("budget-read")), EXIT_GOT_SIGBUS);
	CHECK_EQ(child_exit_code(run_child("budget-signals")), 0);
	CHECK_EQ(child_exit_code(run_child("budget-signals-fallback")), 0);
	printf("faults: ok\n");
	return 0;
}
