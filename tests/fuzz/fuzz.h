/* SPDX-License-Identifier: MIT */
/*
 * Shared pieces of the libFuzzer harnesses (tests/fuzz/fuzz_*.c).
 *
 * Each harness defines LLVMFuzzerTestOneInput (and, when it needs setup,
 * LLVMFuzzerInitialize). Built with -fsanitize=fuzzer it is a fuzzer; built
 * with tests/fuzz/replay.c instead it is a plain regression runner over
 * files and directories (no clang needed). Either way a broken invariant
 * is a crash (FUZZ_CHECK aborts), so libFuzzer keeps the input.
 *
 * Loaders that take a path get the input through one memfd per process,
 * named by /proc/self/fd/N: no file system, nothing left behind.
 */
#ifndef SPARSEBUF_FUZZ_H
#define SPARSEBUF_FUZZ_H

#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A broken invariant: say which, then abort so the fuzzer keeps the input
 * and the sanitizer prints the stack. */
#define FUZZ_CHECK(cond, ...)                                                  \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr,                                        \
				"%s:%d: invariant broken: %s: ", __FILE__,     \
				__LINE__, #cond);                              \
			fprintf(stderr, __VA_ARGS__);                          \
			fprintf(stderr, "\n");                                 \
			abort();                                               \
		}                                                              \
	} while (0)

/* A harness that cannot run here (no userfaultfd): run.sh prints "skipped"
 * for exit status 77 with the first line starting "SKIP: ". */
#define FUZZ_SKIP(...)                                                         \
	do {                                                                   \
		printf("SKIP: ");                                              \
		printf(__VA_ARGS__);                                           \
		printf("\n");                                                  \
		fflush(stdout);                                                \
		_exit(77);                                                     \
	} while (0)

/*
 * Known bugs, reported and not fixed yet, that a harness would otherwise
 * trip over at every other input: run.sh passes the names listed for the
 * harness in tests/fuzz/known-bugs in SBFUZZ_MASK while it replays the
 * corpus and fuzzes, and the harness steers around them (documented at
 * each use). The reproducers in tests/fuzz/crashes/ run without the mask,
 * so they fail until the bug is fixed; then delete the line.
 */
static inline int fuzz_masked(const char *bug)
{
	const char *m = getenv("SBFUZZ_MASK");
	size_t n = strlen(bug);

	for (; m && *m; m += strcspn(m, " ")) {
		m += strspn(m, " ");
		if (!strncmp(m, bug, n) && (m[n] == ' ' || !m[n]))
			return 1;
	}
	return 0;
}

/* The process's memfd, and its name for the loaders that take a path. */
static int fuzz_fd = -1;
static char fuzz_path[64];

/* Refill the memfd with data; returns its /proc/self/fd path. The loaders
 * reopen it by that path. */
static inline const char *fuzz_file(const void *data, size_t size)
{
	size_t done = 0;

	if (fuzz_fd < 0) {
		fuzz_fd = memfd_create("sparsebuf-fuzz", MFD_CLOEXEC);
		if (fuzz_fd < 0) {
			perror("memfd_create");
			abort();
		}
		snprintf(fuzz_path, sizeof(fuzz_path), "/proc/self/fd/%d",
			 fuzz_fd);
	}
	if (ftruncate(fuzz_fd, 0) < 0) {
		perror("ftruncate");
		abort();
	}
	while (done < size) {
		ssize_t w = pwrite(fuzz_fd, (const char *)data + done,
				   size - done, (off_t)done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			perror("pwrite");
			abort();
		}
		done += (size_t)w;
	}
	return fuzz_path;
}

/* The descriptor behind fuzz_file's path (after a first call). */
static inline int fuzz_file_fd(void)
{
	return fuzz_fd;
}

/* Descriptors open on files whose /proc/self/fd link starts with prefix:
 * a loader that leaks its descriptor of the input raises the count.
 * (Other descriptors come and go with the library's heaps.) */
static inline int fuzz_fds_on(const char *prefix)
{
	DIR *d = opendir("/proc/self/fd");
	size_t n = strlen(prefix);
	struct dirent *e;
	int count = 0;

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		char link[300], what[4096];
		ssize_t k;

		snprintf(link, sizeof(link), "/proc/self/fd/%s", e->d_name);
		k = readlink(link, what, sizeof(what) - 1);
		if (k <= 0)
			continue;
		what[k] = 0;
		count += !strncmp(what, prefix, n);
	}
	closedir(d);
	return count;
}

/* Descriptors on the input memfd, fuzz_file's own included. */
static inline int fuzz_input_fds(void)
{
	return fuzz_fds_on("/memfd:sparsebuf-fuzz");
}

/* ---- touching memory that may raise SIGBUS --------------------------------
 *
 * A sparsebuf page whose data failed its checksum raises SIGBUS on touch:
 * documented, not a bug. fuzz_touch() reads one byte with our own SIGBUS
 * handler installed for the duration (the sanitizers' and libFuzzer's
 * handlers would report it as a crash) and says whether it faulted. The
 * read is a plain volatile load, not an intercepted call, so the jump out
 * of the handler leaves no sanitizer state half-updated.
 */
static sigjmp_buf fuzz_bus_jmp;
static volatile sig_atomic_t fuzz_bus_armed;

static inline void fuzz_bus_handler(int sig, siginfo_t *si, void *uc)
{
	(void)si;
	(void)uc;
	if (fuzz_bus_armed) {
		fuzz_bus_armed = 0;
		siglongjmp(fuzz_bus_jmp, 1);
	}
	/* Not ours: die of it as the process would have. */
	signal(sig, SIG_DFL);
	raise(sig);
}

struct fuzz_bus_guard {
	struct sigaction old;
};

static inline void fuzz_bus_guard_on(struct fuzz_bus_guard *g)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = fuzz_bus_handler;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &g->old);
}

static inline void fuzz_bus_guard_off(struct fuzz_bus_guard *g)
{
	sigaction(SIGBUS, &g->old, NULL);
}

/* Read the byte at p into *v (guard on): 1 if it raised SIGBUS, else 0.
 * Not inlined: the jump back lands in a frame that holds nothing else. */
static __attribute__((noinline, unused)) int fuzz_read(const volatile char *p,
						       char *v)
{
	if (sigsetjmp(fuzz_bus_jmp, 1))
		return 1;
	fuzz_bus_armed = 1;
	*v = *p;
	fuzz_bus_armed = 0;
	return 0;
}

/* Write v at p (guard on): 1 if it raised SIGBUS, else 0. */
static __attribute__((noinline, unused)) int fuzz_write(volatile char *p,
							char v)
{
	if (sigsetjmp(fuzz_bus_jmp, 1))
		return 1;
	fuzz_bus_armed = 1;
	*p = v;
	fuzz_bus_armed = 0;
	return 0;
}

static inline int fuzz_touch(const volatile char *p)
{
	char v;

	return fuzz_read(p, &v);
}

/* Little-endian field access in a byte string (inputs are not aligned). */
static inline uint32_t fuzz_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline uint64_t fuzz_le64(const uint8_t *p)
{
	return (uint64_t)fuzz_le32(p) | (uint64_t)fuzz_le32(p + 4) << 32;
}

static inline void fuzz_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

#endif /* SPARSEBUF_FUZZ_H */
