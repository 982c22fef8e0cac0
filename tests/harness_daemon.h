/* SPDX-License-Identifier: MIT */
/*
 * sparsebufd in the tests that start their own (test_daemon,
 * test_daemon_hugetlb): the daemon, build/bin/sparsebufd, on a socket in
 * a temporary directory, killed with the test whatever ends it; its
 * status; and the KV prompts they put in and find in its cache, of a
 * geometry the test defines before including this: KV_L layers of
 * KV_HEADS x KV_HEAD_DIM f16 rows, KV_TOKENS positions. After harness.h.
 */
#ifndef SPARSEBUF_TEST_HARNESS_DAEMON_H
#define SPARSEBUF_TEST_HARNESS_DAEMON_H

#include "dproto.h"
#include "sparsebuf_kv.h"

#include <libgen.h>
#include <limits.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>

static char dir[64], sock_path[100], daemon_bin[PATH_MAX];
static pid_t daemon_pid;

/* ---- the daemon ------------------------------------------------------- */

static inline int connect_sock(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* A failed check exits: the daemon must not outlive the test. */
static inline void kill_daemon(void)
{
	if (daemon_pid > 0)
		kill(daemon_pid, SIGKILL);
}

/* The daemon next to this program (../bin/sparsebufd), a temporary
 * directory made from tmpl (with the socket, `sock`, in it), and the
 * daemon killed at exit. */
static inline void daemon_test_init(const char *tmpl)
{
	char exe[PATH_MAX];

	if (!realpath("/proc/self/exe", exe))
		FAIL("realpath /proc/self/exe");
	snprintf(daemon_bin, sizeof(daemon_bin), "%s/../bin/sparsebufd",
		 dirname(exe));
	if (access(daemon_bin, X_OK) != 0)
		FAIL("%s: not built (make)", daemon_bin);
	snprintf(dir, sizeof(dir), "%s", tmpl);
	CHECK(mkdtemp(dir));
	snprintf(sock_path, sizeof(sock_path), "%s/sock", dir);
	signal(SIGPIPE, SIG_IGN);
	atexit(kill_daemon);
}

/* The directory removed, at the end of a test that passed. */
static inline void daemon_test_done(void)
{
	char cmd[PATH_MAX + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

/* Start sparsebufd with a budget of max and the options in extra (NULL,
 * or at most 8 words, NULL-terminated); wait until it listens. It gets
 * SIGKILL when this process dies. SBD_TEST_VERBOSE=1: it logs every
 * lease and reclaim. */
static inline void start_daemon_with(const char *max, char *const *extra)
{
	char *argv[16] = {daemon_bin, (char *)"--socket", sock_path,
			  (char *)"--max-bytes", (char *)max,
			  (char *)"--foreground"};
	int n = 6;
	double t0 = now_s();
	pid_t parent = getpid();
	int fd;

	for (; extra && *extra; extra++) {
		CHECK(n < 14);
		argv[n++] = *extra;
	}
	if (getenv("SBD_TEST_VERBOSE"))
		argv[n++] = (char *)"--verbose";
	daemon_pid = fork();
	CHECK(daemon_pid >= 0);
	if (daemon_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		execv(daemon_bin, argv);
		_exit(127);
	}
	while ((fd = connect_sock(sock_path)) < 0) {
		if (now_s() - t0 > 10)
			FAIL("sparsebufd did not listen on %s", sock_path);
		usleep(5000);
	}
	close(fd);
}

static inline void start_daemon(const char *max)
{
	start_daemon_with(max, NULL);
}

static inline void stop_daemon(int sig)
{
	int st;

	kill(daemon_pid, sig);
	waitpid(daemon_pid, &st, 0);
	if (sig == SIGTERM)
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	daemon_pid = 0;
}

/* Ask for the status; returns the number of clients listed (into ci). */
static inline int status(struct sbd_status *st, struct sbd_client_info *ci, int max)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_HELLO, .seq = 1,
			    .a = SBD_VERSION, .d = SBD_HELLO_CONTROL};
	int fd = connect_sock(sock_path), rfd;
	long n;

	CHECK(fd >= 0);
	for (int k = 0; k < 2; k++) {
		struct sbd_msg rep;

		CHECK_EQ(sbd_send(fd, &m, NULL, -1), 0);
		n = sbd_recv(fd, buf, sizeof(buf), &rfd);
		CHECK(n > 0 && rfd < 0);
		CHECK_EQ(sbd_msg_check(buf, (size_t)n, 0, true, &rep), 0);
		CHECK_EQ(rep.err, 0);
		m = (struct sbd_msg){.magic = SBD_MAGIC, .type = SBD_STATUS,
				     .seq = 2};
	}
	close(fd);
	CHECK((size_t)n >= sizeof(m) + sizeof(*st));
	memcpy(st, buf + sizeof(m), sizeof(*st));
	CHECK_EQ((size_t)n, sizeof(m) + sizeof(*st) +
				    st->nclients * sizeof(*ci));
	for (int i = 0; i < (int)st->nclients && i < max; i++)
		memcpy(&ci[i], buf + sizeof(m) + sizeof(*st) + i * sizeof(*ci),
		       sizeof(*ci));
	return (int)st->nclients;
}


/* m, a HELLO, on a connection of its own: the daemon's answer, a
 * well-formed reply without error (checked); the connection is closed
 * after it. */
static inline struct sbd_msg hello_once(struct sbd_msg m)
{
	char buf[sizeof(struct sbd_msg) + 64];
	int fd = connect_sock(sock_path), rfd;
	struct sbd_msg rep;
	long n;

	CHECK(fd >= 0);
	CHECK_EQ(sbd_send(fd, &m, NULL, -1), 0);
	n = sbd_recv(fd, buf, sizeof(buf), &rfd);
	CHECK(n > 0 && rfd < 0);
	CHECK_EQ(sbd_msg_check(buf, (size_t)n, 0, true, &rep), 0);
	CHECK_EQ(rep.err, 0);
	close(fd);
	return rep;
}

/* ---- KV prompts ------------------------------------------------------- */

static inline struct sb_kv_config kv_config(void)
{
	struct sb_kv_config c = {
		.n_layers = KV_L, .n_kv_heads = KV_HEADS,
		.head_dim = KV_HEAD_DIM,
		.dtype = SB_KV_F16, .max_ctx = 1 << 14,
	};
	return c;
}

/* Prompt `seed`'s tokens and rows (seed 0: the shared prompt). */
static inline int32_t kv_token_s(unsigned seed, size_t p)
{
	return (int32_t)(p * 7 + 3 + seed * 100003u);
}

static inline uint8_t kv_pat_s(unsigned seed, size_t p, size_t g, size_t j)
{
	return (uint8_t)(p * 31 + g * 7 + j + 1 + seed * 13);
}

/* The physical frame of the page at p (root: /proc/self/pagemap), 0 if
 * not present or not readable. */
static inline uint64_t pfn_of(const void *p)
{
	uint64_t e = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	if (pread(fd, &e, 8, (off_t)((uintptr_t)p / 4096 * 8)) != 8)
		e = 0;
	close(fd);
	return e >> 63 ? e & ((1ull << 55) - 1) : 0;
}

static inline bool kv_rows_ok_s(struct sb_kv_seq *s, unsigned seed, size_t upto)
{
	size_t row = sb_kv_row_bytes(s);

	for (int l = 0; l < KV_L; l++)
		for (int v = 0; v < 2; v++) {
			const uint8_t *b = v ? sb_kv_v(s, l) : sb_kv_k(s, l);
			size_t g = 2 * (size_t)l + (size_t)v;

			for (size_t p = 0; p < upto; p++)
				for (size_t j = 0; j < row; j += 17)
					if (b[p * row + j] !=
					    kv_pat_s(seed, p, g, j))
						return false;
		}
	return true;
}

/* Prompt seed computed (written) into a new sequence of p. */
static inline struct sb_kv_seq *kv_compute(struct sb_pool *p, unsigned seed,
				    int32_t *toks)
{
	struct sb_kv_config cfg = kv_config();
	struct sb_kv_seq *s;
	size_t row;
	int err = 0;

	s = sb_kv_create(p, &cfg, &err);
	CHECK(s);
	CHECK(sb_kv_prepare(s, KV_TOKENS) >= 0);
	row = sb_kv_row_bytes(s);
	for (size_t i = 0; i < KV_TOKENS; i++)
		toks[i] = kv_token_s(seed, i);
	for (int l = 0; l < KV_L; l++)
		for (int v = 0; v < 2; v++) {
			uint8_t *b = v ? sb_kv_v(s, l) : sb_kv_k(s, l);

			for (size_t q = 0; q < KV_TOKENS; q++)
				for (size_t j = 0; j < row; j++)
					b[q * row + j] =
						kv_pat_s(seed, q, 2 * l + v, j);
		}
	CHECK(sb_kv_commit(s, KV_TOKENS) >= 0);
	return s;
}

/* Prompts first..last computed in new sequences of p, one after the
 * other, each put in c whole and its sequence ended. */
static inline void kv_put_range(struct sb_kv_cache *c, struct sb_pool *p,
				unsigned first, unsigned last)
{
	int32_t toks[KV_TOKENS];

	for (unsigned seed = first; seed <= last; seed++) {
		struct sb_kv_seq *s = kv_compute(p, seed, toks);

		CHECK_EQ(sb_kv_cache_put(c, s, toks, KV_TOKENS), KV_TOKENS);
		sb_kv_destroy(s);
	}
}

/* Prompt seed looked up in c: the positions found, every row of them
 * checked (a mismatch fails the test). */
static inline size_t kv_get_checked(struct sb_kv_cache *c, unsigned seed)
{
	int32_t toks[KV_TOKENS];
	struct sb_kv_seq *s;
	size_t hit = 0;
	int err = 0;

	for (size_t i = 0; i < KV_TOKENS; i++)
		toks[i] = kv_token_s(seed, i);
	s = sb_kv_cache_get(c, toks, KV_TOKENS, &hit, &err);
	if (!s)
		FAIL("prompt %u: sb_kv_cache_get: %s", seed, strerror(-err));
	if (!kv_rows_ok_s(s, seed, hit))
		FAIL("prompt %u: %zu positions found, not as put", seed, hit);
	sb_kv_destroy(s);
	return hit;
}

#endif
