/* SPDX-License-Identifier: MIT */
/*
 * A tiny test harness. Each test is a program that exits 0 (pass), 1 (fail)
 * or 77 (skip, with the reason printed). tests/run.sh runs each under a
 * timeout and prints the summary.
 *
 * Child processes (SIGBUS, fork, environment cases) are this same program
 * started again with "--child NAME": a fresh process, so sanitizers and
 * threads behave, and a hang becomes a failed test after a timeout instead
 * of a stalled CI run.
 */
#ifndef SPARSEBUF_TEST_HARNESS_H
#define SPARSEBUF_TEST_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sparsebuf.h"

extern char **environ;

/* ThreadSanitizer builds run 5-15x slower: tests that repeat for volume
 * (not for a race's odds) do fewer rounds under it. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#else
#define UNDER_TSAN 0
#endif

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define TiB ((size_t)1 << 40)

#define FAIL(...)                                                            \
	do {                                                                 \
		fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);              \
		fprintf(stderr, __VA_ARGS__);                                \
		fprintf(stderr, "\n");                                       \
		exit(1);                                                     \
	} while (0)

#define CHECK(cond)                                                          \
	do {                                                                 \
		if (!(cond))                                                 \
			FAIL("CHECK failed: %s", #cond);                     \
	} while (0)

#define CHECK_EQ(a, b)                                                       \
	do {                                                                 \
		long long a_ = (long long)(a), b_ = (long long)(b);          \
		if (a_ != b_)                                                \
			FAIL("CHECK_EQ failed: %s == %lld, %s == %lld", #a,  \
			     a_, #b, b_);                                    \
	} while (0)

#define SKIP(...)                                                            \
	do {                                                                 \
		printf("SKIP: ");                                            \
		printf(__VA_ARGS__);                                         \
		printf("\n");                                                \
		exit(77);                                                    \
	} while (0)

/* Exit status of a child that took SIGBUS at the expected address. */
#define EXIT_GOT_SIGBUS 42
#define EXIT_GOT_SIGSEGV 43

static inline void require_uffd(void)
{
	struct sb_features f;

	sb_features_get(&f);
	if (f.uffd_mode == SB_UFFD_NONE)
		SKIP("userfaultfd unavailable: %s", strerror(-f.uffd_error));
}

static inline void require_cow(void)
{
	struct sb_features f;

	require_uffd();
	sb_features_get(&f);
	if (!f.wp_shmem)
		SKIP("kernel %s cannot write-protect shmem (copy-on-write)",
		     f.kernel);
}

static inline struct sb_pool *make_pool(size_t page, size_t heap,
					size_t max)
{
	struct sb_pool_opts o;
	struct sb_pool *p;
	int err = 0;

	sb_pool_opts_init(&o);
	o.page_size = page;
	o.heap_size = heap;
	o.max_bytes = max;
	o.numa_node = -1;
	/* scripts/test-daemon.sh: every test's pools are clients of a
	 * sparsebufd, so that every call is tried on a client pool. */
	if (getenv("SBTEST_DAEMON_POOLS") && getenv("SPARSEBUF_DAEMON"))
		p = sb_pool_connect(getenv("SPARSEBUF_DAEMON"), &o, &err);
	else
		p = sb_pool_create(&o, &err);
	if (!p)
		FAIL("sb_pool_create(page %zu, heap %zu, max %zu): %s", page,
		     heap, max, strerror(-err));
	return p;
}

static inline struct sb_buf *make_buf(struct sb_pool *p, size_t len,
				      unsigned flags)
{
	int err = 0;
	struct sb_buf *b = sb_buf_create(p, len, flags, &err);

	if (!b)
		FAIL("sb_buf_create(%zu): %s", len, strerror(-err));
	return b;
}

/* A thread writing byte 7 of every 4 KiB of [base, base+len), a new value
 * each pass, until stop: writes racing a share into that range
 * (test_share, test_hugetlb). Byte 7 is one the tests' fill checks skip. */
struct racing_writer {
	char *base;
	size_t len;
	atomic_bool stop;
};

static inline void *racing_writes(void *arg)
{
	struct racing_writer *r = arg;
	char v = 1;

	while (!atomic_load(&r->stop)) {
		for (size_t o = 0; o < r->len; o += 4096)
			r->base[o + 7] = v;
		v = (char)(v % 120 + 1);
	}
	return NULL;
}

static inline struct sb_stats stats(struct sb_pool *p)
{
	struct sb_stats st;

	if (sb_pool_stats(p, &st) < 0)
		FAIL("sb_pool_stats failed");
	return st;
}

/* The pool's own consistency check (lib/verify.c; tests link the static
 * library, which has it). */
int sbi_pool_verify(struct sb_pool *pool, char *why, size_t len);

#define VERIFY(pool)                                                         \
	do {                                                                 \
		char why_[512];                                              \
		if (sbi_pool_verify((pool), why_, sizeof(why_)) != 0)        \
			FAIL("pool inconsistent: %s", why_);                 \
	} while (0)

static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whether shmem_enabled gives memfds (the heaps) folios larger than 4 KiB
 * (tests/test_folios.c and make test-folios set it): pages released from
 * them may leave zeros in place or split (docs/design.md, "Heap folios"). */
static inline bool shmem_folios_big(void)
{
	char line[256] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled",
			"r");

	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
	}
	/* The setting in brackets; then the per-size ones (a size that is
	 * always or within_size gives folios whatever the above says). */
	if (line[0] && !strstr(line, "[never]") && !strstr(line, "[deny]"))
		return true;
	for (int kb = 8; kb <= 2048; kb *= 2) {
		char path[128];

		snprintf(path, sizeof(path),
			 "/sys/kernel/mm/transparent_hugepage/hugepages-%dkB/"
			 "shmem_enabled",
			 kb);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
		if (strstr(line, "[always]") || strstr(line, "[within_size]"))
			return true;
	}
	return false;
}

/* Wait (up to timeout_s) until cond holds; background work is async. */
#define WAIT_FOR(cond, timeout_s)                                            \
	do {                                                                 \
		double t0_ = now_s();                                        \
		while (!(cond) && now_s() - t0_ < (timeout_s))               \
			usleep(1000);                                        \
	} while (0)

/* A socket listening at path (SOCK_SEQPACKET, as sparsebufd's): a fake
 * daemon's. */
static inline int listen_unix(const char *path, int backlog)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	CHECK(ls >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path);
	CHECK_EQ(bind(ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
	CHECK_EQ(listen(ls, backlog), 0);
	return ls;
}

/* A "Name:   value" line of /proc/meminfo: the value as written (kB for
 * sizes, a count for HugePages_*), -1 when absent. */
static inline long meminfo(const char *name)
{
	char line[128];
	size_t n = strlen(name);
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "r");

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, n) && line[n] == ':')
			v = strtol(line + n + 1, NULL, 10);
	fclose(f);
	return v;
}

/* Lines of /proc/self/maps that overlap [lo, lo + len) (len 0: any) and
 * contain `what` (NULL: any). */
static inline long maps_count(const void *lo, size_t len, const char *what)
{
	uintptr_t a, b, l = (uintptr_t)lo, h = l + len;
	char line[512];
	long n = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (len && (sscanf(line, "%lx-%lx", &a, &b) != 2 || a >= h ||
			    b <= l))
			continue;
		n += !what || strstr(line, what) != NULL;
	}
	fclose(f);
	return n;
}

/* Mappings of a buffer; mappings named `what`; all mappings. */
static inline long maps_in(const void *lo, size_t len)
{
	return maps_count(lo, len, NULL);
}

static inline long maps_named(const char *what)
{
	return maps_count(NULL, 0, what);
}

static inline long maps_total(void)
{
	return maps_count(NULL, 0, NULL);
}

/* ThreadSanitizer confines mappings to its application ranges (about
 * 1.5 TiB on x86-64): "huge" is smaller there. */
#if defined(__SANITIZE_THREAD__)
#define HUGE_BUF (128 * GiB)
#else
#define HUGE_BUF (64 * TiB)
#endif

/* Sanitizer runtimes map memory of their own as a test runs. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MAPS_SLACK 256
#else
#define MAPS_SLACK 4
#endif

static const char *self_exe;

/* A hung child, before it is killed: where each of its threads is, so a
 * hang that happens once in fifty runs can be read from the log. The
 * kernel's view always (wchan, /proc stack for root); gdb's backtraces when
 * gdb is installed and allowed to attach. */
static inline void dump_hung(pid_t pid)
{
	char cmd[1024];

	fprintf(stderr, "-- threads of hung child %d\n", (int)pid);
	fflush(stderr);
	snprintf(cmd, sizeof(cmd),
		 "for t in /proc/%d/task/*; do "
		 "echo \"  task ${t##*/} $(cat $t/comm 2>/dev/null) "
		 "wchan=$(cat $t/wchan 2>/dev/null)\"; "
		 "sed 's/^/    /' $t/stack 2>/dev/null | head -12; done >&2; "
		 "command -v gdb >/dev/null || { echo '  (no gdb: no "
		 "backtraces)' >&2; exit 0; }; "
		 "f=$(mktemp /tmp/sbhung-XXXXXX); "
		 "timeout -k 5 60 gdb -q -batch -nx "
		 "-iex 'set debuginfod enabled off' -p %d "
		 "-ex 'thread apply all bt 20' </dev/null >$f 2>&1; "
		 "echo \"  gdb: exit $?\" >&2; "
		 "grep -E '^(Thread|#)' $f >&2 || tail -n 20 $f >&2; "
		 "rm -f $f",
		 (int)pid, (int)pid);
	if (system(cmd) < 0)
		fprintf(stderr, "dump_hung: system: %s\n", strerror(errno));
}

/* Run "self --child name" with extra environment entries (NULL-terminated
 * list, may be NULL); return its wait status, or -1 on timeout (killed).
 * With out, the child's stdout and stderr are captured there. */
static inline int run_child_env(const char *name, char *const *env_extra,
				double timeout_s, char *out, size_t outlen)
{
	char *argv[] = {(char *)self_exe, (char *)"--child", (char *)name,
			NULL};
	char *envp[512];
	int n = 0, status = 0, pfd[2] = {-1, -1};
	posix_spawn_file_actions_t fa;
	pid_t pid;
	double t0;

	for (char **e = environ; *e && n < 400; e++)
		envp[n++] = *e;
	for (; env_extra && *env_extra && n < 510; env_extra++)
		envp[n++] = *env_extra;
	envp[n] = NULL;
	posix_spawn_file_actions_init(&fa);
	if (out) {
		if (pipe(pfd) < 0)
			FAIL("pipe");
		posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
		posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
		posix_spawn_file_actions_addclose(&fa, pfd[0]);
	}
	if (posix_spawn(&pid, self_exe, &fa, NULL, argv, envp) != 0)
		FAIL("posix_spawn %s", self_exe);
	posix_spawn_file_actions_destroy(&fa);
	if (out)
		close(pfd[1]);
	t0 = now_s();
	for (size_t got = 0;;) {
		bool exited = false;

		if (out && pfd[0] >= 0) {
			struct pollfd pf = {.fd = pfd[0], .events = POLLIN};

			if (poll(&pf, 1, 2) > 0) {
				ssize_t r = read(pfd[0], out + got,
						 outlen - got - 1);

				if (r > 0 && got + (size_t)r < outlen - 1) {
					got += (size_t)r;
				} else {
					close(pfd[0]);	/* EOF or full */
					pfd[0] = -1;
				}
				out[got] = 0;
			}
		} else {
			usleep(2000);
		}
		if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
			pid = 0;	/* reaped; keep draining the pipe */
			exited = true;
		}
		if (pid == 0 && (!out || pfd[0] < 0 || now_s() - t0 > timeout_s))
			return status;
		if (!exited && pid > 0 && now_s() - t0 > timeout_s) {
			dump_hung(pid);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			if (out && pfd[0] >= 0)
				close(pfd[0]);
			fprintf(stderr, "child %s hung: killed after %.0f s\n",
				name, timeout_s);
			return -1;
		}
	}
}

static inline int run_child(const char *name)
{
	return run_child_env(name, NULL, 30, NULL, 0);
}

static inline int child_exit_code(int status)
{
	return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* In a child: turn SIGBUS at `expect` into exit code EXIT_GOT_SIGBUS, and
 * any other SIGBUS/SIGSEGV into distinct failures. */
static volatile uintptr_t expect_lo, expect_hi;

static void on_signal(int sig, siginfo_t *si, void *ctx)
{
	uintptr_t a = (uintptr_t)si->si_addr;

	(void)ctx;
	if (a < expect_lo || a >= expect_hi)
		_exit(sig == SIGBUS ? 50 : 51);
	_exit(sig == SIGBUS ? EXIT_GOT_SIGBUS : EXIT_GOT_SIGSEGV);
}

static inline void expect_signal_at(const void *lo, size_t len)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_signal;
	sa.sa_flags = SA_SIGINFO;
	expect_lo = (uintptr_t)lo;
	expect_hi = (uintptr_t)lo + len;
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
}

/*
 * In a child: touch one byte in each of n pages (write or read) while
 * another thread sends this one SIGUSR1 every 20 us. Each signal ends the
 * toucher's wait on its fault, and it retries the access at once, before
 * the handler has answered: what a signal or io_uring task work does to
 * any thread. Counts how each touch ended; a touch that "went through"
 * was expected to raise a signal and did not.
 */
struct signalled_touches {
	int sigbus, sigsegv, went_through;
};

static sigjmp_buf st_jmp;
static volatile sig_atomic_t st_sig;
static volatile uintptr_t st_lo, st_hi;
static atomic_bool st_stop;

static void st_on_fault(int sig, siginfo_t *si, void *ctx)
{
	uintptr_t a = (uintptr_t)si->si_addr;

	(void)ctx;
	if (a < st_lo || a >= st_hi)
		_exit(50);
	st_sig = sig;
	siglongjmp(st_jmp, 1);
}

/* SIGUSR1 does nothing but end a wait (test_evict uses it too). */
static void st_on_usr1(int sig)
{
	(void)sig;
}

static void *st_signaller(void *arg)
{
	pthread_t toucher = *(pthread_t *)arg;

	while (!atomic_load(&st_stop)) {
		pthread_kill(toucher, SIGUSR1);
		usleep(20);
	}
	return NULL;
}

static inline struct signalled_touches
touch_signalled(volatile char *base, size_t page, int n, bool write)
{
	struct sigaction sa = {.sa_sigaction = st_on_fault,
			       .sa_flags = SA_SIGINFO};
	struct sigaction su = {.sa_handler = st_on_usr1};
	pthread_t self = pthread_self(), th;
	volatile int went = 0, nbus = 0, nsegv = 0;

	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGUSR1, &su, NULL);
	atomic_store(&st_stop, false);
	pthread_create(&th, NULL, st_signaller, &self);
	for (int i = 0; i < n; i++) {
		volatile char *b = base + (size_t)i * page;

		st_lo = (uintptr_t)b;
		st_hi = st_lo + page;
		st_sig = 0;
		if (sigsetjmp(st_jmp, 1) == 0) {
			if (write)
				b[3] = 1;
			else
				(void)b[3];
			went++;
		} else if (st_sig == SIGBUS) {
			nbus++;
		} else {
			nsegv++;
		}
	}
	atomic_store(&st_stop, true);
	pthread_join(th, NULL);
	printf("%d %s: %d SIGBUS, %d SIGSEGV, %d went through\n", n,
	       write ? "writes" : "reads", nbus, nsegv, went);
	return (struct signalled_touches){nbus, nsegv, went};
}

/* Test programs define main_test() and child(); this dispatches. */
static int main_test(void);
static int child(const char *name);

int main(int argc, char **argv)
{
	self_exe = "/proc/self/exe";
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 2 && !strcmp(argv[1], "--child"))
		return child(argv[2]);
	return main_test();
}

/* ---- The disk tier (test_evict, test_autoevict, test_file, test_save,
 * test_diskerr, test_spillfull) ------------------------------------------- */

#include <ftw.h>
#include <sys/stat.h>

/* Deterministic contents: 64-bit word i of a region filled with seed s. */
static inline uint64_t disk_word(uint64_t seed, size_t i)
{
	uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* len is a multiple of 8. */
static inline void disk_fill(void *p, size_t len, uint64_t seed)
{
	uint64_t *w = p;

	for (size_t i = 0; i < len / 8; i++)
		w[i] = disk_word(seed, i);
}

/* Byte offset of the first word that differs from disk_fill(seed), or -1. */
static inline long disk_check(const void *p, size_t len, uint64_t seed)
{
	const volatile uint64_t *w = p;

	for (size_t i = 0; i < len / 8; i++)
		if (w[i] != disk_word(seed, i))
			return (long)(i * 8);
	return -1;
}

/* Byte offset of the first nonzero byte, or -1. */
static inline long disk_check_zero(const void *p, size_t len)
{
	const volatile char *c = p;

	for (size_t i = 0; i < len; i++)
		if (c[i])
			return (long)i;
	return -1;
}

/* The scratch directory of a disk test (files, spill): $SBT_DIR, made
 * fresh for each run by run_pagers(). */
static inline const char *disk_dir(void)
{
	const char *d = getenv("SBT_DIR");

	if (!d || !*d)
		FAIL("SBT_DIR is not set (run through run_pagers)");
	return d;
}

/* A pool like make_pool() spilling into dir (NULL: $SBT_DIR/spill). */
static inline struct sb_pool *disk_pool_in(size_t page, size_t heap,
					   size_t max, const char *dir)
{
	static char spill[512];
	static int shown;
	struct sb_pool_opts o;
	struct sb_features f;
	struct sb_pool *p;
	int err = 0;

	if (!dir) {
		snprintf(spill, sizeof(spill), "%s/spill", disk_dir());
		if (mkdir(spill, 0700) < 0 && errno != EEXIST)
			FAIL("mkdir %s: %s", spill, strerror(errno));
		dir = spill;
	}
	sb_pool_opts_init(&o);
	o.page_size = page;
	o.heap_size = heap;
	o.max_bytes = max;
	o.numa_node = -1;
	o.spill_dir = dir;
	p = sb_pool_create(&o, &err);
	if (!p)
		FAIL("sb_pool_create(page %zu, heap %zu, max %zu, spill %s): %s",
		     page, heap, max, dir, strerror(-err));
	if (!shown && sb_features_get(&f) == 0) {
		printf("pager: %s\n", f.pager);
		shown = 1;
	}
	return p;
}

/* A file $SBT_DIR/name of `bytes` bytes of disk_fill(seed), on disk;
 * returns its path (static storage, one at a time). */
static inline const char *disk_make_file(const char *name, size_t bytes,
					 uint64_t seed)
{
	static char path[512];
	char *buf = malloc(bytes);
	int fd;

	CHECK(buf != NULL);
	disk_fill(buf, bytes, seed);
	snprintf(path, sizeof(path), "%s/%s", disk_dir(), name);
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	if (fd < 0)
		FAIL("create %s: %s", path, strerror(errno));
	for (size_t done = 0; done < bytes;) {
		ssize_t w = write(fd, buf + done, bytes - done);

		if (w <= 0)
			FAIL("write %s: %s", path, strerror(errno));
		done += (size_t)w;
	}
	CHECK(fsync(fd) == 0);
	close(fd);
	free(buf);
	return path;
}

/* $SBT_DIR/name (16 slots of static storage, reused in turn). */
static inline const char *disk_path(const char *name)
{
	static char paths[16][512];
	static int next;
	char *s = paths[next++ % 16];

	snprintf(s, sizeof(paths[0]), "%s/%s", disk_dir(), name);
	return s;
}

/* sb_buf_restore that fails the test when it fails. */
static inline struct sb_buf *disk_restore(struct sb_pool *p, const char *path)
{
	int err = 0;
	struct sb_buf *b = sb_buf_restore(p, path, 0, &err);

	if (!b)
		FAIL("sb_buf_restore(%s): %s", path, strerror(-err));
	return b;
}

static inline struct sb_pool *disk_pool(size_t page, size_t heap, size_t max)
{
	return disk_pool_in(page, heap, max, NULL);
}

static inline int disk_rm_one(const char *path, const struct stat *st,
			      int type, struct FTW *ftw)
{
	(void)st, (void)ftw;
	if (type == FTW_DP)
		rmdir(path);
	else
		unlink(path);
	return 0;
}

static inline void disk_rm_rf(const char *dir)
{
	nftw(dir, disk_rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* Run child `name` twice, each in a fresh directory $SBT_DIR under /tmp:
 * with the defaults (io_uring; eviction recycles pages where the kernel
 * has minor faults on shmem), and with SPARSEBUF_PAGER=sync (the
 * pread/pwrite fallback) and SPARSEBUF_RECYCLE=0 (evicted pages punched
 * and kept reserved): both ways of each. cleanup(dir), if given, runs
 * before the directory is removed. Fails the test if a run fails or hangs;
 * returns the number of runs that skipped (exit 77, having said why). */
static inline int run_pagers(const char *name, double timeout_s,
			     void (*cleanup)(const char *dir))
{
	static const char *const pagers[] = {NULL, "sync"};
	int skipped = 0, failed = 0;

	unsetenv("SPARSEBUF_PAGER");	/* the children get theirs */
	unsetenv("SPARSEBUF_RECYCLE");
	unsetenv("SBT_DIR");
	for (int i = 0; i < 2; i++) {
		char dir[] = "/tmp/sbtest-XXXXXX";
		char dirvar[64], pagervar[64];
		char *env[4] = {dirvar, NULL, NULL, NULL};
		const char *pname = pagers[i] ? pagers[i] : "default";
		int st, code;

		if (!mkdtemp(dir))
			FAIL("mkdtemp: %s", strerror(errno));
		snprintf(dirvar, sizeof(dirvar), "SBT_DIR=%s", dir);
		if (pagers[i]) {
			snprintf(pagervar, sizeof(pagervar),
				 "SPARSEBUF_PAGER=%s", pagers[i]);
			env[1] = pagervar;
			env[2] = "SPARSEBUF_RECYCLE=0";
		}
		printf("-- %s, pager %s%s\n", name, pname,
		       pagers[i] ? ", no recycling" : "");
		st = run_child_env(name, env, timeout_s, NULL, 0);
		if (cleanup)
			cleanup(dir);
		disk_rm_rf(dir);
		code = child_exit_code(st);
		if (code == 77) {
			skipped++;
		} else if (code != 0) {
			fprintf(stderr, "FAILED: %s with pager %s: %s %d\n",
				name, pname,
				st < 0		     ? "hung, status"
				: WIFSIGNALED(st) ? "killed by signal"
						  : "exit",
				st < 0		     ? st
				: WIFSIGNALED(st) ? WTERMSIG(st)
						  : code);
			failed++;
		}
	}
	if (failed)
		FAIL("%s: %d of 2 runs failed", name, failed);
	return skipped;
}

/* The main_test of a disk test: child "body" under both pagers (and both
 * eviction paths), killed as hung after timeout_s. */
static inline int run_disk_body(double timeout_s)
{
	require_uffd();
	if (run_pagers("body", timeout_s, NULL))
		SKIP("a run skipped (see above)");
	return 0;
}

/* ---- the budget watcher: bytes_resident sampled all along ---------------- */

struct budget_watch {
	struct sb_pool *p;
	pthread_t thread;
	atomic_int stop;
	size_t max_seen;	/* the most bytes_resident seen */
	long samples;
};

static inline void *budget_watcher(void *arg)
{
	struct budget_watch *w = arg;

	while (!atomic_load(&w->stop)) {
		struct sb_stats st;

		if (sb_pool_stats(w->p, &st) == 0) {
			if (st.bytes_resident > w->max_seen)
				w->max_seen = st.bytes_resident;
			w->samples++;
		}
		usleep(200);
	}
	return NULL;
}

static inline void budget_watch_start(struct budget_watch *w,
				      struct sb_pool *p)
{
	memset(w, 0, sizeof(*w));
	w->p = p;
	if (pthread_create(&w->thread, NULL, budget_watcher, w) != 0)
		FAIL("pthread_create: the budget watcher");
}

/* Stop sampling; fails the test if bytes_resident ever went past max. */
static inline void budget_watch_stop(struct budget_watch *w, size_t max)
{
	atomic_store(&w->stop, 1);
	pthread_join(w->thread, NULL);
	CHECK(w->samples > 0);
	if (w->max_seen > max)
		FAIL("bytes_resident reached %zu KiB, over the budget of %zu KiB",
		     w->max_seen / KiB, max / KiB);
}

#endif /* SPARSEBUF_TEST_HARNESS_H */
