/* SPDX-License-Identifier: MIT */
/*
 * sparsebufd and its clients, across processes: one budget that is never
 * exceeded, pages of an idle process given to a busy one, a refusal when
 * nothing anywhere can be freed, a killed client's pages back to the
 * budget, a killed daemon (pages stay valid, the fallbacks, a restarted
 * daemon takes the client back), garbage on the socket, the default pool
 * from SPARSEBUF_DAEMON, and the socket's permissions.
 *
 * The daemon is build/bin/sparsebufd, started by this test on a socket in
 * a temporary directory; clients are this program again (--child).
 */
#include "harness.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/resource.h>

#define PAGE (256 * KiB)
/* The prompts (harness_daemon.h): 2 blocks of 1024 positions, 256-byte
 * rows. */
#define KV_L 4
#define KV_HEADS 2
#define KV_HEAD_DIM 64
#define KV_TOKENS 2048

#include "harness_daemon.h"

/* lib/lease.c: a client pool that a daemon holds now (not alone). */
bool sbi_pool_is_leased(struct sb_pool *pool);

static uint64_t used_now(void)
{
	struct sbd_status st;

	status(&st, NULL, 0);
	return st.bytes_used;
}

/* A client pool with a ceiling and a floor (0: none). */
static struct sb_pool *connect_floor(size_t ceiling, size_t floor, int *err)
{
	struct sb_pool_opts o;

	sb_pool_opts_init(&o);
	o.page_size = PAGE;
	o.heap_size = 16 * MiB;
	o.max_bytes = ceiling;
	o.min_bytes = floor;
	o.spill_dir = dir;
	return sb_pool_connect(sock_path, &o, err);
}

static struct sb_pool *connect_pool(size_t ceiling, int *err)
{
	return connect_floor(ceiling, 0, err);
}

static void fill(char *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i += 4096)
		memcpy(p + i, &(uint64_t){seed * 1000003ull + i}, 8);
}

static bool check_fill(const char *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i += 4096) {
		uint64_t v;

		memcpy(&v, p + i, 8);
		if (v != seed * 1000003ull + i)
			return false;
	}
	return true;
}

/* A file a child writes when it is ready, or the parent when the child
 * may go on. */
static void mark(const char *name)
{
	char p[PATH_MAX + 32];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	close(fd);
}

static bool marked(const char *name)
{
	char p[PATH_MAX + 32];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

static void wait_mark(const char *name, double timeout_s)
{
	WAIT_FOR(marked(name), timeout_s);
	if (!marked(name))
		FAIL("no '%s' after %.0f s", name, timeout_s);
}

/* Start "self --child name" in the background (environment extra). */
static pid_t spawn_child(const char *name, char *const *extra)
{
	char *argv[] = {(char *)self_exe, (char *)"--child", (char *)name,
			NULL};
	char *envp[512];
	int n = 0;
	pid_t pid;

	for (char **e = environ; *e && n < 400; e++)
		envp[n++] = *e;
	for (; extra && *extra; extra++)
		envp[n++] = *extra;
	envp[n] = NULL;
	if (posix_spawn(&pid, self_exe, NULL, NULL, argv, envp))
		FAIL("spawn %s", name);
	return pid;
}

static int reap(pid_t pid, double timeout_s)
{
	double t0 = now_s();
	int st;

	while (waitpid(pid, &st, WNOHANG) != pid) {
		if (now_s() - t0 > timeout_s) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			FAIL("child %d hung", (int)pid);
		}
		usleep(2000);
	}
	return child_exit_code(st);
}

/* Start sparsebufd with a budget of max and --max-floor floor. */
static void start_daemon_floor(const char *max, const char *floor)
{
	char *extra[] = {(char *)"--max-floor", (char *)floor, NULL};

	start_daemon_with(max, extra);
}

/* ---- the machine-wide prefix cache -------------------------------------- */

/* A client pool with a ceiling, and a cache of max bytes on it. */
static struct sb_kv_cache *cache_client(size_t ceiling, size_t max,
					struct sb_pool **pp)
{
	struct sb_kv_config cfg = kv_config();
	struct sb_kv_cache *c;
	int err = 0;

	*pp = connect_pool(ceiling, &err);
	CHECK(*pp);
	c = sb_kv_cache_create(*pp, &cfg, "test-model", max, &err);
	CHECK(c);
	return c;
}

static int32_t kv_token(size_t p)
{
	return kv_token_s(0, p);
}

static uint8_t kv_pat(size_t p, size_t g, size_t j)
{
	return kv_pat_s(0, p, g, j);
}

static bool kv_rows_ok(struct sb_kv_seq *s, size_t upto)
{
	return kv_rows_ok_s(s, 0, upto);
}

/* The file where churner BASE writes the prompt it is putting. */
static void churn_path(char *p, size_t n, unsigned base)
{
	snprintf(p, n, "%s/churn-%u", dir, base);
}

/* Puts prompts SBD_CHURN_BASE, +1, ... in a loop until killed, getting
 * the shared prompt between puts (pins taken and dropped). Before each
 * put, its prompt's number is written to churn_path: the verifier looks
 * for those only (each miss costs a sequence made and destroyed). */
static int child_cache_churn(void)
{
	unsigned seed = (unsigned)atoi(getenv("SBD_CHURN_BASE"));
	int32_t toks[KV_TOKENS], base[KV_TOKENS];
	char path[PATH_MAX + 32];
	struct sb_kv_cache *c;
	struct sb_pool *p;
	int err = 0, fd;

	churn_path(path, sizeof(path), seed);
	fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	c = cache_client(256 * MiB, 64 * MiB, &p);
	for (size_t i = 0; i < KV_TOKENS; i++)
		base[i] = kv_token(i);
	mark("churning");
	for (;; seed++) {
		struct sb_kv_seq *s = kv_compute(p, seed, toks), *g;
		char num[16];
		size_t hit = 0;

		/* Fixed width: a number written over a longer one. */
		snprintf(num, sizeof(num), "%10u\n", seed);
		CHECK_EQ(pwrite(fd, num, 11, 0), 11);
		CHECK_EQ(sb_kv_cache_put(c, s, toks, KV_TOKENS), KV_TOKENS);
		sb_kv_destroy(s);
		g = sb_kv_cache_get(c, base, KV_TOKENS, &hit, &err);
		CHECK(g && hit == KV_TOKENS && kv_rows_ok(g, KV_TOKENS));
		sb_kv_destroy(g);
	}
	return 0;
}

/* Puts prompts 1..SBD_PUT_N, one after the other, and exits. */
static int child_cache_putn(void)
{
	unsigned n = (unsigned)atoi(getenv("SBD_PUT_N"));
	struct sb_kv_cache *c;
	struct sb_pool *p;

	c = cache_client(64 * MiB, 8 * MiB, &p);
	kv_put_range(c, p, 1, n);
	sb_kv_cache_destroy(c);
	sb_pool_destroy(p);
	return 0;
}

/* Every prompt 0..SBD_CHURN_MAX found in the cache reads as computed;
 * prompt 0 is found whole (SBD_WANT_ALL: every one is). SBD_CHURN_RANGES
 * ("1-7,101-104"): prompt 0 and those only. */
static int child_cache_verify(void)
{
	unsigned max = (unsigned)atoi(getenv("SBD_CHURN_MAX"));
	const char *ranges = getenv("SBD_CHURN_RANGES");
	struct sb_kv_cache *c;
	struct sb_pool *p;
	unsigned tried = 0;
	int found = 0;

	/* Small: what it found it lets go of soon (a budget of 32 MiB). */
	c = cache_client(256 * MiB, 4 * MiB, &p);
	for (unsigned seed = getenv("SBD_FROM1") ? 1 : 0; seed <= max;
	     seed++) {
		size_t hit;

		if (seed && ranges) {
			unsigned lo, hi;
			bool in = false;

			for (const char *r = ranges; r && !in;
			     r = strchr(r, ','), r = r ? r + 1 : r)
				in = sscanf(r, "%u-%u", &lo, &hi) == 2 &&
				     seed >= lo && seed <= hi;
			if (!in)
				continue;
		}
		hit = kv_get_checked(c, seed);
		if (!seed || getenv("SBD_WANT_ALL"))
			CHECK_EQ(hit, KV_TOKENS);
		found += hit > 0;
		tried++;
	}
	printf("cache: %d of %u prompts found, every one intact\n",
	       found, tried);
	sb_kv_cache_destroy(c);
	sb_pool_destroy(p);
	return 0;
}

/* A prompt computed (written) and put in the cache; exits at once: the
 * prefix outlives it. */
static int child_cache_put(void)
{
	struct sb_kv_config cfg = kv_config();
	int32_t toks[KV_TOKENS];
	struct sb_kv_cache *c;
	struct sb_kv_seq *s;
	struct sb_pool *p;
	size_t row;
	int err = 0;

	p = connect_pool(256 * MiB, &err);
	CHECK(p);
	s = sb_kv_create(p, &cfg, &err);
	CHECK(s);
	c = sb_kv_cache_create(p, &cfg, "test-model", 64 * MiB, &err);
	CHECK(c);
	CHECK(sb_kv_prepare(s, KV_TOKENS) >= 0);
	row = sb_kv_row_bytes(s);
	for (size_t i = 0; i < KV_TOKENS; i++)
		toks[i] = kv_token(i);
	for (int l = 0; l < KV_L; l++)
		for (int v = 0; v < 2; v++) {
			uint8_t *b = v ? sb_kv_v(s, l) : sb_kv_k(s, l);

			for (size_t q = 0; q < KV_TOKENS; q++)
				for (size_t j = 0; j < row; j++)
					b[q * row + j] = kv_pat(q, 2 * l + v, j);
		}
	CHECK(sb_kv_commit(s, KV_TOKENS) >= 0);
	CHECK_EQ(sb_kv_cache_put(c, s, toks, KV_TOKENS), KV_TOKENS);
	/* The sequence now maps the machine's copy: still its rows. */
	CHECK(kv_rows_ok(s, KV_TOKENS));
	sb_kv_destroy(s);
	sb_kv_cache_destroy(c);
	sb_pool_destroy(p);
	return 0;
}

/* The directory of sparsebufd (and sparsebufctl). */
static const char *bin_dir(void)
{
	static char d[PATH_MAX];

	if (!*d) {
		char tmp[PATH_MAX];

		snprintf(tmp, sizeof(tmp), "%s", daemon_bin);
		snprintf(d, sizeof(d), "%s", dirname(tmp));
	}
	return d;
}

/* Mappings of sparsebufd's cache heaps in this process. */
static int cache_maps(void)
{
	char line[512];
	int n = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	CHECK(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "sparsebufd-cache") != NULL;
	fclose(f);
	return n;
}

static bool sb_pool_is_leased_pub(struct sb_pool *p)
{
	return sbi_pool_is_leased(p);
}

/* Finds the prompt, checks it, writes the frame of its first K page to
 * pfn-NAME; with SBD_CACHE_HOLD waits (pinned) for the mark "release";
 * then writes a row (copy-on-write: the cache's copy is unchanged). */
static int child_cache_get(void)
{
	const char *name = getenv("SBD_CACHE_NAME");
	int32_t toks[KV_TOKENS];
	struct sb_kv_cache *c;
	struct sb_kv_seq *s;
	struct sb_pool *p;
	size_t hit = 0;
	char path[PATH_MAX];
	uint8_t *k0;
	uint64_t pfn;
	FILE *f;
	int err = 0;

	c = cache_client(256 * MiB, 64 * MiB, &p);
	for (size_t i = 0; i < KV_TOKENS; i++)
		toks[i] = kv_token(i);
	s = sb_kv_cache_get(c, toks, KV_TOKENS, &hit, &err);
	CHECK(s);
	CHECK_EQ(hit, KV_TOKENS);
	CHECK(kv_rows_ok(s, KV_TOKENS));
	k0 = sb_kv_k(s, 0);
	pfn = pfn_of(k0);
	snprintf(path, sizeof(path), "%s/pfn-%s", dir, name ? name : "x");
	f = fopen(path, "w");
	CHECK(f);
	fprintf(f, "%llu\n", (unsigned long long)pfn);
	fclose(f);
	if (getenv("SBD_CACHE_HOLD")) {
		mark("holding");
		wait_mark("release", 60);
	}
	k0[0] ^= 0xff;	/* copy-on-write: a page of our own */
	CHECK_EQ(k0[0], (uint8_t)(kv_pat(0, 0, 0) ^ 0xff));
	CHECK(!pfn || pfn_of(k0) != pfn);
	sb_kv_destroy(s);
	sb_kv_cache_destroy(c);
	/* Nothing of the daemon's stays mapped here once nothing uses it. */
	CHECK_EQ(cache_maps(), 0);
	sb_pool_destroy(p);
	return 0;
}

/* Puts the prompt, keeps its sequence and cache across a daemon restart
 * (marks "put", waits for "restarted"), puts it again: the new daemon has
 * it then (mark "again"). */
static int child_cache_republish(void)
{
	int32_t toks[KV_TOKENS];
	struct sb_kv_cache *c;
	struct sb_kv_seq *s;
	struct sb_pool *p;

	c = cache_client(256 * MiB, 64 * MiB, &p);
	s = kv_compute(p, 0, toks);
	CHECK_EQ(sb_kv_cache_put(c, s, toks, KV_TOKENS), KV_TOKENS);
	mark("put");
	wait_mark("restarted", 60);
	/* The pages stay valid through the restart. */
	CHECK(kv_rows_ok(s, KV_TOKENS));
	for (double t0 = now_s(); !sb_pool_is_leased_pub(p);) {
		if (now_s() - t0 > 10)
			FAIL("not connected to the new daemon");
		usleep(5000);
	}
	CHECK_EQ(sb_kv_cache_put(c, s, toks, KV_TOKENS), KV_TOKENS);
	mark("again");
	wait_mark("republish-exit", 60);
	sb_kv_destroy(s);
	sb_kv_cache_destroy(c);
	sb_pool_destroy(p);
	return 0;
}

static uint64_t read_pfn(const char *name)
{
	char path[PATH_MAX];
	unsigned long long v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/pfn-%s", dir, name);
	f = fopen(path, "r");
	CHECK(f);
	CHECK(fscanf(f, "%llu", &v) == 1);
	fclose(f);
	return v;
}

/* Appends "BASE-LAST," to the ranges: the prompts churner BASE began to
 * put (none if it was killed before its first). */
static void churned(char *ranges, size_t size, unsigned base)
{
	char path[PATH_MAX + 32];
	unsigned last = 0;
	size_t n = strlen(ranges);
	FILE *f;

	churn_path(path, sizeof(path), base);
	f = fopen(path, "r");
	if (!f)
		return;
	if (fscanf(f, "%u", &last) == 1 && last >= base)
		snprintf(ranges + n, size - n, "%u-%u,", base, last);
	fclose(f);
	CHECK(strlen(ranges) < size - 1);
}

static void test_cache(void)
{
	char ranges[1024];
	char *hold[] = {(char *)"SBD_CACHE_NAME=held",
			(char *)"SBD_CACHE_HOLD=1", NULL};
	char *b[] = {(char *)"SBD_CACHE_NAME=b", NULL};
	char *c2[] = {(char *)"SBD_CACHE_NAME=c", NULL};
	struct sbd_status st;
	uint64_t shared, pfn_b, pfn_c;
	pid_t pid;

	start_daemon("1G");
	CHECK_EQ(reap(spawn_child("cache_put", NULL), 30), 0);
	status(&st, NULL, 0);
	/* 2 blocks x 8 regions x one 256 KiB page, after the putter left. */
	shared = st.bytes_shared;
	CHECK_EQ(st.cache_blocks, 2);
	CHECK_EQ(shared, 2 * 2 * KV_L * PAGE);
	CHECK_EQ(st.bytes_used, shared);
	/* Two processes find it: the same physical page, each copying on
	 * its own write, the cache's copy intact for the next. */
	CHECK_EQ(reap(spawn_child("cache_get", b), 30), 0);
	CHECK_EQ(reap(spawn_child("cache_get", c2), 30), 0);
	pfn_b = read_pfn("b");
	pfn_c = read_pfn("c");
	if (geteuid() == 0) {
		CHECK(pfn_b != 0);
		CHECK_EQ(pfn_b, pfn_c);
	}
	status(&st, NULL, 0);
	CHECK_EQ(st.cache_hits, 2 * 2);
	CHECK_EQ(st.bytes_shared, shared);
	/* A holder killed: its pins go, the prefix stays. */
	pid = spawn_child("cache_get", hold);
	wait_mark("holding", 30);
	{
		char cmd[PATH_MAX * 2];

		snprintf(cmd, sizeof(cmd),
			 "%s/sparsebufctl -s %s cache --json | "
			 "grep -q '\"positions\": 2048, .*\"pins\": [1-9]'",
			 bin_dir(), sock_path);
		CHECK_EQ(system(cmd), 0);	/* listed, pinned */
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	{
		char cmd[PATH_MAX * 2];
		double t0 = now_s();

		snprintf(cmd, sizeof(cmd),
			 "%s/sparsebufctl -s %s cache --json | "
			 "grep -q '\"positions\": 2048, .*\"pins\": 0,'",
			 bin_dir(), sock_path);
		while (system(cmd) != 0)
			if (now_s() - t0 > 1)
				FAIL("pins of a killed client still held "
				     "after 1 s");
	}
	status(&st, NULL, 0);
	CHECK_EQ(st.cache_blocks, 2);
	CHECK_EQ(st.bytes_shared, shared);
	/* Clients putting prompts killed at random points (mid-put,
	 * mid-fill, holding pins), two at a time: what is found reads as
	 * put, the budget counts only the cache, nothing stays pinned. */
	srand(12345);
	strcpy(ranges, "SBD_CHURN_RANGES=");
	for (int round = 0; round < 8; round++) {
		char base1[40], base2[40];
		char *e1[] = {base1, NULL}, *e2[] = {base2, NULL};
		pid_t k1, k2;

		snprintf(base1, sizeof(base1), "SBD_CHURN_BASE=%d",
			 1 + round * 200);
		snprintf(base2, sizeof(base2), "SBD_CHURN_BASE=%d",
			 101 + round * 200);
		k1 = spawn_child("cache_churn", e1);
		k2 = spawn_child("cache_churn", e2);
		usleep(100000 + (useconds_t)(rand() % 400) * 1000);
		kill(k1, SIGKILL);
		usleep((useconds_t)(rand() % 50) * 1000);
		kill(k2, SIGKILL);
		waitpid(k1, NULL, 0);
		waitpid(k2, NULL, 0);
		churned(ranges, sizeof(ranges), 1 + (unsigned)round * 200);
		churned(ranges, sizeof(ranges), 101 + (unsigned)round * 200);
	}
	{
		char max[40];
		char *e[] = {max, ranges, NULL};
		uint64_t t0 = (uint64_t)(now_s() * 1000);

		snprintf(max, sizeof(max), "SBD_CHURN_MAX=%d", 8 * 200);
		CHECK_EQ(reap(spawn_child("cache_verify", e), 120), 0);
		/* Every client gone: only the cache is counted. */
		for (;;) {
			status(&st, NULL, 0);
			if (st.bytes_used == st.bytes_shared && !st.nclients)
				break;
			if ((uint64_t)(now_s() * 1000) - t0 > 5000)
				FAIL("used %llu, cache %llu, %llu clients",
				     (unsigned long long)st.bytes_used,
				     (unsigned long long)st.bytes_shared,
				     (unsigned long long)st.nclients);
			usleep(10000);
		}
	}
	{
		char cmd[PATH_MAX * 2];

		snprintf(cmd, sizeof(cmd),
			 "%s/sparsebufctl -s %s cache --json | "
			 "grep -q '\"pins\": [1-9]'",
			 bin_dir(), sock_path);
		CHECK(system(cmd) != 0);	/* nothing pinned */
	}
	/* A daemon restarted under a process holding a prompt: its pages
	 * stay valid, and its next put gives the new daemon the prompt. */
	pid = spawn_child("cache_republish", NULL);
	wait_mark("put", 30);
	stop_daemon(SIGKILL);
	start_daemon("1G");
	mark("restarted");
	wait_mark("again", 30);
	CHECK_EQ(reap(spawn_child("cache_get", b), 30), 0);
	mark("republish-exit");
	CHECK_EQ(reap(pid, 30), 0);
	printf("cache: a prompt put by one process found by two others in "
	       "the same physical pages (pfn %llu), copy-on-write, pins of "
	       "a killed one dropped, the prefix kept\n",
	       (unsigned long long)pfn_b);
	stop_daemon(SIGTERM);
}

/* A budget of 32 MiB and 12 prompts of 4 MiB put one after the other:
 * with --spill-dir the older ones go to disk and come back whole;
 * without, they are dropped, and what is found is intact. */
static void test_cache_spill(void)
{
	char *put[] = {(char *)"SBD_PUT_N=12", NULL};
	char *all[] = {(char *)"SBD_CHURN_MAX=12", (char *)"SBD_WANT_ALL=1",
		       NULL};
	char *some[] = {(char *)"SBD_CHURN_MAX=12", NULL};
	char *spill[] = {(char *)"--spill-dir", dir, NULL};
	struct sbd_status st;

	start_daemon_with("32M", spill);
	CHECK_EQ(reap(spawn_child("cache_putn", put), 60), 0);
	status(&st, NULL, 0);
	CHECK(st.bytes_used <= st.max_bytes);
	CHECK(st.bytes_spilled > 0);
	CHECK_EQ(st.cache_blocks, 12 * 2);
	printf("cache spill: %llu MiB in memory, %llu MiB on disk\n",
	       (unsigned long long)(st.bytes_shared >> 20),
	       (unsigned long long)(st.bytes_spilled >> 20));
	/* Prompt 0 was never put: found nowhere, the rest whole. */
	all[0] = (char *)"SBD_CHURN_MAX=12";
	CHECK_EQ(reap(spawn_child("cache_verify_from1", all), 60), 0);
	status(&st, NULL, 0);
	CHECK(st.bytes_used <= st.max_bytes);
	stop_daemon(SIGTERM);
	/* Without a spill directory: dropped, never wrong. */
	start_daemon("32M");
	CHECK_EQ(reap(spawn_child("cache_putn", put), 60), 0);
	status(&st, NULL, 0);
	CHECK(st.bytes_used <= st.max_bytes);
	CHECK_EQ(st.bytes_spilled, 0);
	CHECK(st.cache_blocks < 12 * 2);
	CHECK_EQ(reap(spawn_child("cache_verify_from1", some), 60), 0);
	stop_daemon(SIGTERM);
	/* A spill directory that fills up (a 6 MiB tmpfs, as root): what
	 * fits goes there, the rest is dropped, nothing found is wrong. */
	{
		char mnt[PATH_MAX], cmd[PATH_MAX + 64];

		snprintf(mnt, sizeof(mnt), "%s/full", dir);
		mkdir(mnt, 0700);
		snprintf(cmd, sizeof(cmd),
			 "mount -t tmpfs -o size=6m sbtest %s 2>/dev/null",
			 mnt);
		if (geteuid() != 0 || system(cmd) != 0) {
			printf("cache spill to a full disk: SKIP (needs root "
			       "and tmpfs)\n");
			rmdir(mnt);
			return;
		}
		spill[1] = mnt;
		start_daemon_with("32M", spill);
		CHECK_EQ(reap(spawn_child("cache_putn", put), 60), 0);
		status(&st, NULL, 0);
		CHECK(st.bytes_used <= st.max_bytes);
		CHECK(st.bytes_spilled > 0 &&
		      st.bytes_spilled <= 6 * MiB);
		CHECK(st.cache_blocks < 12 * 2);
		CHECK_EQ(reap(spawn_child("cache_verify_from1", some), 60), 0);
		stop_daemon(SIGTERM);
		snprintf(cmd, sizeof(cmd), "umount %s", mnt);
		CHECK_EQ(system(cmd), 0);
		rmdir(mnt);
		printf("cache spill to a full disk: what fit went there, the "
		       "rest dropped, all found intact\n");
	}
}

/* ---- children ---------------------------------------------------------- */

/* Idle with 40 MiB of evictable pages (seed), a floor of floor bytes:
 * says `ready`, waits for `check`, then finds its data whole. Pages above
 * the floor went to disk when a busy client needed them. */
static int idle_client(size_t floor, unsigned seed, const char *ready,
		       const char *check)
{
	int err = 0;
	struct sb_pool *pool = connect_floor(0, floor, &err);
	struct sb_buf *b;
	char *x;

	if (!pool)
		FAIL("sb_pool_connect (floor %zu): %s", floor, strerror(-err));
	b = make_buf(pool, 1 * GiB, SB_BUF_EVICTABLE);
	x = sb_buf_addr(b);
	CHECK_EQ(sb_buf_map(b, 0, 40 * MiB), 40 * MiB / PAGE);
	fill(x, 40 * MiB, seed);
	mark(ready);
	wait_mark(check, 60);
	CHECK(check_fill(x, 40 * MiB, seed));
	CHECK(stats(pool).pages_out > 0);	/* it did go to disk */
	VERIFY(pool);
	sb_pool_destroy(pool);
	return 0;
}

static int child_idle_evictable(void)
{
	return idle_client(0, 7, "idle-ready", "idle-check");
}

static int child_idle_floor(void)
{
	return idle_client(32 * MiB, 11, "floor-ready", "floor-check");
}

/* Holds 40 MiB it cannot give back until told to exit. */
static int child_hog(void)
{
	int err = 0;
	struct sb_pool *pool = connect_pool(0, &err);
	struct sb_buf *b;

	CHECK(pool);
	b = make_buf(pool, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(b, 0, 40 * MiB), 40 * MiB / PAGE);
	fill(sb_buf_addr(b), 40 * MiB, 3);
	mark("hog-ready");
	wait_mark("hog-exit", 60);
	sb_pool_destroy(pool);
	return 0;
}

/* The default pool, a client through SPARSEBUF_DAEMON. */
static int child_default(void)
{
	struct sb_pool *pool = sb_default_pool();
	struct sb_buf *b;

	CHECK(pool);
	b = make_buf(pool, 1 * GiB, 0);
	memset(sb_buf_addr(b), 1, 8 * MiB);	/* faults */
	mark("default-ready");
	wait_mark("default-exit", 60);
	return 0;
}

/* The daemon dies under it: pages stay, new ones per the fallback. */
static int child_daemon_dies(void)
{
	const char *fb = getenv("SPARSEBUF_DAEMON_FALLBACK");
	bool fail = fb && !strcmp(fb, "fail");
	int err = 0;
	struct sb_pool *pool = connect_pool(0, &err);
	struct sb_buf *b;
	char *x;
	double t0;
	long r;

	CHECK(pool);
	b = make_buf(pool, 1 * GiB, 0);
	x = sb_buf_addr(b);
	CHECK_EQ(sb_buf_map(b, 0, 16 * MiB), 16 * MiB / PAGE);
	fill(x, 16 * MiB, 5);
	mark(fail ? "dies-fail-ready" : "dies-ready");
	wait_mark(fail ? "dies-fail-killed" : "dies-killed", 60);
	/* Every page still valid, none zero. */
	CHECK(check_fill(x, 16 * MiB, 5));
	t0 = now_s();
	/* Failing needs more than the lease held ahead (a few looks'
	 * growth: this process grew 16 MiB at once). */
	r = sb_buf_map(b, 64 * MiB, fail ? 512 * MiB : 64 * MiB);
	if (fail) {
		CHECK_EQ(r, -ENOMEM);
	} else {
		CHECK_EQ(r, 64 * MiB / PAGE);
		fill(x + 64 * MiB, 64 * MiB, 6);
	}
	/* The wait is bounded by SPARSEBUF_DAEMON_WAIT_MS (300). */
	CHECK(now_s() - t0 < 5);
	printf("map with no daemon: %s after %.0f ms\n",
	       fail ? "-ENOMEM" : "placed", (now_s() - t0) * 1e3);
	if (!fail) {
		mark("dies-mapped");
		wait_mark("dies-restarted", 60);
		/* A new daemon takes us back, and more pages are leased. */
		WAIT_FOR(sbi_pool_is_leased(pool), 10);
		CHECK(sbi_pool_is_leased(pool));
		CHECK_EQ(sb_buf_map(b, 200 * MiB, 8 * MiB), 8 * MiB / PAGE);
		CHECK(check_fill(x + 64 * MiB, 64 * MiB, 6));
		mark("dies-back");
		wait_mark("dies-exit", 60);
	}
	CHECK(check_fill(x, 16 * MiB, 5));
	VERIFY(pool);
	sb_pool_destroy(pool);
	return 0;
}

/* Grows without end (faults and maps, an evictable buffer) until killed. */
static int child_grower(void)
{
	int err = 0;
	struct sb_pool *pool = connect_pool(0, &err);
	struct sb_buf *b, *e;
	char *x;

	CHECK(pool);
	b = make_buf(pool, 4 * GiB, 0);
	e = make_buf(pool, 4 * GiB, SB_BUF_EVICTABLE);
	x = sb_buf_addr(b);
	mark("grower-up");
	for (size_t off = 0;; off += PAGE) {
		if (off >= 96 * MiB) {
			sb_buf_unmap(b, 0, 4 * GiB);
			off = 0;
		}
		x[off] = 1;	/* a fault */
		sb_buf_map(e, off, PAGE);
		((char *)sb_buf_addr(e))[off + 1] = 2;
	}
	return 0;
}

/* Holds 24 MiB and checks it whenever told, until told to exit. */
static int child_witness(void)
{
	int err = 0;
	/* SBD_WITNESS_FLOOR: with a floor of 32 MiB, which it asks for
	 * again from every new daemon. */
	struct sb_pool *pool = connect_floor(
		0, getenv("SBD_WITNESS_FLOOR") ? 32 * MiB : 0, &err);
	struct sb_buf *b;
	char *x;

	CHECK(pool);
	b = make_buf(pool, 1 * GiB, 0);
	x = sb_buf_addr(b);
	CHECK_EQ(sb_buf_map(b, 0, 24 * MiB), 24 * MiB / PAGE);
	fill(x, 24 * MiB, 11);
	mark("witness-up");
	while (!marked("witness-exit")) {
		CHECK(check_fill(x, 24 * MiB, 11));
		usleep(20000);
	}
	CHECK(check_fill(x, 24 * MiB, 11));
	VERIFY(pool);
	sb_pool_destroy(pool);
	return 0;
}

/* Not root: the socket (0660 root:root) refuses us. */
static int child_other_user(void)
{
	int err = 0;
	struct sb_pool *pool;

	if (setgid(65534) < 0 || setuid(65534) < 0)
		return 3;
	pool = connect_pool(0, &err);
	CHECK(!pool);
	CHECK_EQ(err, -EACCES);
	return 0;
}

/* ---- the tests ---------------------------------------------------------- */

static void test_basic(void)
{
	struct sbd_client_info ci[4];
	struct sbd_status st;
	struct sb_pool *pool;
	struct sb_buf *b;
	int err = 0;

	start_daemon("256M");
	pool = connect_pool(0, &err);
	if (!pool)
		FAIL("sb_pool_connect: %s", strerror(-err));
	b = make_buf(pool, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(b, 0, 32 * MiB), 32 * MiB / PAGE);
	memset((char *)sb_buf_addr(b) + 32 * MiB, 1, 16 * MiB);	/* faults */
	CHECK_EQ(status(&st, ci, 4), 1);
	CHECK_EQ(ci[0].pid, getpid());
	CHECK(ci[0].bytes >= stats(pool).bytes_resident);
	CHECK(ci[0].bytes >= 48 * MiB);
	CHECK(st.bytes_used == ci[0].bytes && st.bytes_used <= st.max_bytes);
	CHECK_EQ(st.max_bytes, 256 * MiB);
	/* The pool's own max_bytes (none), not its lease. */
	CHECK_EQ(stats(pool).max_bytes, 0);
	VERIFY(pool);
	/* Over the budget: refused (nothing evictable anywhere). */
	CHECK_EQ(sb_buf_map(b, 512 * MiB, 256 * MiB), -ENOMEM);
	CHECK(used_now() <= 256 * MiB);
	sb_buf_destroy(b);
	/* The unused lease goes back within the idle time (2 s). */
	WAIT_FOR(used_now() < 16 * MiB, 5);
	CHECK(used_now() < 16 * MiB);
	sb_pool_destroy(pool);
	WAIT_FOR(used_now() == 0, 2);
	CHECK_EQ(used_now(), 0);
	stop_daemon(SIGTERM);
	CHECK(access(sock_path, F_OK) != 0);	/* it removed its socket */
	printf("basic: lease follows use, refused past the budget\n");
}

/* An idle process's evictable pages go to disk for a busy one. */
static void test_idle_gives(void)
{
	struct sb_pool *pool;
	struct sb_buf *b;
	uint64_t worst = 0;
	int err = 0;
	pid_t idle;

	start_daemon("64M");
	idle = spawn_child("idle_evictable", NULL);
	wait_mark("idle-ready", 30);
	pool = connect_pool(0, &err);
	CHECK(pool);
	b = make_buf(pool, 1 * GiB, 0);
	/* 40 MiB in 4 MiB steps while the idle one holds 40 of the 64. */
	for (size_t off = 0; off < 40 * MiB; off += 4 * MiB) {
		uint64_t u;

		CHECK_EQ(sb_buf_map(b, off, 4 * MiB), 4 * MiB / PAGE);
		u = used_now();
		worst = u > worst ? u : worst;
		CHECK(u <= 64 * MiB);
	}
	fill(sb_buf_addr(b), 40 * MiB, 9);
	printf("idle gives: 40 MiB placed under a 64 MiB budget beside an "
	       "idle 40 MiB client; worst use %.1f MiB\n",
	       (double)worst / MiB);
	/* Now we let go, and the idle one reads its pages back. */
	CHECK(check_fill(sb_buf_addr(b), 40 * MiB, 9));
	sb_pool_destroy(pool);
	mark("idle-check");
	CHECK_EQ(reap(idle, 60), 0);
	stop_daemon(SIGTERM);
}

/* ---- a client spoken for by hand (the protocol, no library) ----------- */

/* A client of PAGE pages that holds lease bytes and answers reclaims by
 * hand, so that a test orders the messages as a slow client would. */
struct raw_client {
	int fd;
	uint32_t seq;
	uint64_t lease;
};

static void raw_send(struct raw_client *c, uint16_t type, uint64_t a,
		     uint64_t b)
{
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = type, .a = a,
			    .b = b};

	if (type == SBD_HELLO || type == SBD_LEASE)
		m.seq = ++c->seq;
	if (type == SBD_HELLO) {
		m.a = SBD_VERSION;
		m.c = PAGE;
	} else {
		/* What it holds, all in use (no unused lease to ask). */
		m.c = m.d = c->lease;
	}
	CHECK_EQ(sbd_send(c->fd, &m, NULL, -1), 0);
}

/* The next message from the daemon. */
static struct sbd_msg raw_recv(struct raw_client *c)
{
	char buf[sizeof(struct sbd_msg) + 64];
	struct sbd_msg m;
	int rfd;
	long n = sbd_recv(c->fd, buf, sizeof(buf), &rfd);

	CHECK(n > 0 && rfd < 0);
	CHECK_EQ(sbd_msg_check(buf, (size_t)n, 0, true, &m), 0);
	return m;
}

static void raw_connect(struct raw_client *c)
{
	*c = (struct raw_client){.fd = connect_sock(sock_path)};
	CHECK(c->fd >= 0);
	raw_send(c, SBD_HELLO, 0, 0);
	CHECK_EQ(raw_recv(c).err, 0);
}

/* Give back what a RECLAIM of bytes asks (whole pages, at most the
 * lease), without the answer yet. */
static void raw_give(struct raw_client *c, uint64_t bytes)
{
	uint64_t give = (bytes + PAGE - 1) / PAGE * PAGE;

	if (give > c->lease)
		give = c->lease;
	c->lease -= give;
	raw_send(c, SBD_RETURN, give, 0);
}

/* The reply to busy's LEASE of bytes, while idle answers every RECLAIM
 * at once: 0 or the daemon's error. */
static int64_t raw_lease_wait(struct raw_client *busy,
			      struct raw_client *idle, uint64_t bytes)
{
	for (;;) {
		struct pollfd p[2] = {{busy->fd, POLLIN, 0},
				      {idle->fd, POLLIN, 0}};
		struct sbd_msg m;

		CHECK(poll(p, 2, 10000) > 0);
		if (p[1].revents) {
			m = raw_recv(idle);
			CHECK_EQ(m.type, SBD_RECLAIM);
			raw_give(idle, m.a);
			raw_send(idle, SBD_RETURN, 0, 1);
			continue;
		}
		m = raw_recv(busy);
		CHECK_EQ(m.type, SBD_REPLY);
		CHECK_EQ(m.seq, busy->seq);
		if (m.err == 0) {
			CHECK(m.a >= bytes);
			busy->lease += m.a;
		}
		return m.err;
	}
}

static int64_t raw_lease(struct raw_client *busy, struct raw_client *idle,
			 uint64_t bytes)
{
	raw_send(busy, SBD_LEASE, bytes, bytes);
	return raw_lease_wait(busy, idle, bytes);
}

/* A client asked again before it answered (its eviction slow, under
 * load) gives its pages in RETURNs, then answers: the answer may be the
 * first RECLAIM's, with nothing in it. Counted from the second RECLAIM,
 * that read as "gave nothing", and the next request, with the idle client
 * still holding evictable pages, was refused at once for 3 s
 * (test_idle_gives failed so in CI). */
static void test_reclaim_late_answer(void)
{
	struct raw_client idle, busy;
	struct sbd_msg m;

	start_daemon("64M");
	raw_connect(&idle);
	/* It says it uses all 40 MiB as it asks (no unused lease to give:
	 * what it gives, it evicts). */
	idle.lease = 40 * MiB;
	raw_send(&idle, SBD_LEASE, 40 * MiB, 40 * MiB);
	m = raw_recv(&idle);
	CHECK_EQ(m.err, 0);
	CHECK_EQ(m.a, 40 * MiB);
	raw_connect(&busy);
	/* 32 MiB: 8 from the idle one, given but not answered yet. */
	raw_send(&busy, SBD_LEASE, 32 * MiB, 32 * MiB);
	m = raw_recv(&idle);
	CHECK_EQ(m.type, SBD_RECLAIM);
	raw_give(&idle, m.a);
	m = raw_recv(&busy);
	CHECK_EQ(m.err, 0);
	busy.lease = m.a;
	/* A second later (RECLAIM_RETRY_MS), the daemon asks it again; then
	 * the first answer comes. */
	usleep(1200 * 1000);
	raw_send(&busy, SBD_LEASE, 4 * MiB, 4 * MiB);
	m = raw_recv(&idle);
	CHECK_EQ(m.type, SBD_RECLAIM);
	raw_send(&idle, SBD_RETURN, 0, 1);
	raw_give(&idle, m.a);
	raw_send(&idle, SBD_RETURN, 0, 1);
	/* Granted, and so is the next one, more than the room: the idle
	 * client still gives. (Taken for dry, it was refused: at once, or
	 * by the next tick if that came before the pages.) */
	CHECK_EQ(raw_lease_wait(&busy, &idle, 4 * MiB), 0);
	CHECK_EQ(raw_lease(&busy, &idle, 8 * MiB), 0);
	CHECK(idle.lease > 0);
	close(busy.fd);
	close(idle.fd);
	WAIT_FOR(used_now() == 0, 2);
	CHECK_EQ(used_now(), 0);
	stop_daemon(SIGTERM);
	printf("reclaim, late answer: the client asked twice is asked again "
	       "(not taken for dry)\n");
}

static uint64_t lease_of(pid_t pid)
{
	struct sbd_client_info ci[16];
	struct sbd_status st;
	int n = status(&st, ci, 16);

	for (int i = 0; i < n && i < 16; i++)
		if (ci[i].pid == pid)
			return ci[i].bytes;
	return 0;
}

/* Map 4 MiB steps into b from off until refused or at most max: the
 * bytes placed. The budget is never passed meanwhile. */
static size_t map_until_refused(struct sb_buf *b, size_t off, size_t max,
				uint64_t budget)
{
	size_t done = 0;

	while (done < max) {
		long r = sb_buf_map(b, off + done, 4 * MiB);

		CHECK(used_now() <= budget);
		if (r == -ENOMEM)
			break;
		CHECK_EQ(r, 4 * MiB / PAGE);
		done += 4 * MiB;
	}
	return done;
}

/* Floors: a part of the budget reserved for a client. Nobody else is
 * given it while the client holds less, and the client is never asked
 * below it; floors beyond --max-floor or the budget are refused. */
static void test_floors(void)
{
	struct sbd_client_info ci[4];
	struct sbd_status st;
	struct sb_pool *r, *p, *q;
	struct sb_buf *rb, *pb;
	size_t got;
	int err = 0;
	pid_t idle;

	start_daemon_floor("64M", "32M");
	/* Refused: above --max-floor, alone or with the same user's other
	 * floors (more connections reserve no more). */
	CHECK(!connect_floor(0, 48 * MiB, &err) && err == -EPERM);
	r = connect_floor(0, 24 * MiB, &err);
	CHECK(r);
	CHECK(!connect_floor(0, 16 * MiB, &err) && err == -EPERM);
	/* Bad options: above the pool's own ceiling, above what the
	 * protocol carries. */
	CHECK(!connect_floor(16 * MiB, 24 * MiB, &err) && err == -EINVAL);
	CHECK(!connect_floor(0, SIZE_MAX - 4096, &err) && err == -EINVAL);
	CHECK_EQ(status(&st, ci, 4), 1);
	CHECK_EQ(st.floors, 24 * MiB);
	CHECK_EQ(st.max_floor, 32 * MiB);
	CHECK_EQ(ci[0].floor, 24 * MiB);
	/* A client "back after a restart" claiming the whole budget is
	 * believed up to the budget less the unused floor. */
	{
		struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_HELLO,
				    .seq = 1, .a = SBD_VERSION,
				    .b = 64 * MiB, .c = PAGE};

		CHECK_EQ(hello_once(m).d, 40 * MiB);
		WAIT_FOR(used_now() == 0, 2);
	}
	/* The floor holds nothing yet: another pool gets the rest only. */
	p = connect_pool(0, &err);
	CHECK(p);
	pb = make_buf(p, 1 * GiB, 0);
	got = map_until_refused(pb, 0, 64 * MiB, 64 * MiB);
	printf("floors: a pool beside an unused 24 MiB floor placed %zu "
	       "MiB of a 64 MiB budget\n", got / MiB);
	CHECK(got >= 24 * MiB && got <= 40 * MiB);
	/* No room is free now: a floor is refused rather than promised
	 * out of pages nobody can take back. */
	q = connect_floor(0, 8 * MiB, &err);
	if (q)
		FAIL("a floor granted with %llu KiB used of 64 MiB",
		     (unsigned long long)(used_now() >> 10));
	CHECK_EQ(err, -ENOSPC);
	/* The floor's pool grows into it, though the other pool's pages
	 * cannot be evicted: without the floor, that one would have taken
	 * the whole budget and this map would fail. */
	rb = make_buf(r, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(rb, 0, 20 * MiB), 20 * MiB / PAGE);
	CHECK(used_now() <= 64 * MiB);
	sb_pool_destroy(r);
	sb_pool_destroy(p);
	WAIT_FOR(used_now() == 0, 2);
	CHECK_EQ(used_now(), 0);

	/* An idle client with 40 MiB of evictable pages and a floor of
	 * 32: a busy one gets the 8 above the floor (to disk), then is
	 * refused. */
	idle = spawn_child("idle_floor", NULL);
	wait_mark("floor-ready", 30);
	p = connect_pool(0, &err);
	CHECK(p);
	pb = make_buf(p, 1 * GiB, 0);
	got = map_until_refused(pb, 0, 64 * MiB, 64 * MiB);
	printf("floors: beside an idle 40 MiB client with a 32 MiB floor, "
	       "%zu MiB placed; the idle one kept %.1f MiB\n",
	       got / MiB, (double)lease_of(idle) / MiB);
	CHECK(lease_of(idle) >= 32 * MiB);
	CHECK(got >= 24 * MiB && got <= 32 * MiB);
	sb_pool_destroy(p);
	mark("floor-check");
	CHECK_EQ(reap(idle, 60), 0);
	WAIT_FOR(used_now() == 0, 2);
	CHECK_EQ(used_now(), 0);
	stop_daemon(SIGTERM);
}

static size_t ready_mib(struct sb_pool *p)
{
	return stats(p).pages_ready * PAGE / MiB;
}

/*
 * sb_pool_reserve on clients (lib/lease.c, sbi_lease_floor): a floor's
 * lease comes out of what the budget has free, less an eighth kept for
 * growth, in part when that is all there is; a reclaim for another's
 * growth takes no more of it than it asks; taken, it is asked for again
 * once there is room.
 */
static void test_reserve(void)
{
	struct sb_pool *a, *b;
	struct sb_buf *bb;
	int err = 0;

	start_daemon("64M");
	a = connect_pool(0, &err);
	CHECK(a);
	/* Above the budget: it once got nothing at all (the whole floor
	 * was its least, refused). */
	CHECK_EQ(sb_pool_reserve(a, 96 * MiB), 96 * MiB);
	WAIT_FOR(ready_mib(a) >= 56, 10);
	CHECK_EQ(ready_mib(a), 56);
	CHECK(used_now() <= 64 * MiB);
	CHECK_EQ(sb_pool_reserve(a, -56 * (long)MiB), 40 * MiB);
	WAIT_FOR(ready_mib(a) <= 40 && used_now() <= 40 * MiB, 10);
	CHECK(ready_mib(a) == 40 && used_now() <= 40 * MiB);
	/* Another client grows 32 MiB (its ceiling: no lease ahead), 8
	 * more than is free. A reclaim once trimmed every ready page, the
	 * whole floor. */
	b = connect_pool(32 * MiB, &err);
	CHECK(b);
	bb = make_buf(b, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(bb, 0, 32 * MiB), 32 * MiB / PAGE);
	printf("reserve: a 40 MiB floor kept %zu MiB ready beside 32 MiB "
	       "of growth on a 64 MiB budget\n", ready_mib(a));
	CHECK(ready_mib(a) >= 32);
	CHECK(used_now() <= 64 * MiB);
	sb_pool_destroy(b);
	/* Room again: the floor is asked for anew (it was not, on an
	 * idle pool, until it grew). */
	WAIT_FOR(ready_mib(a) >= 40, 10);
	CHECK_EQ(ready_mib(a), 40);
	/* A daemon back with a smaller budget believes the pool up to it:
	 * the floor's pages above that go. They stayed (56 MiB resident
	 * against a 32 MiB lease), and reclaims found nothing to take. */
	stop_daemon(SIGKILL);
	start_daemon("24M");
	WAIT_FOR(sbi_pool_is_leased(a) &&
			 stats(a).bytes_resident <= 24 * MiB,
		 10);
	CHECK(stats(a).bytes_resident <= 24 * MiB);
	VERIFY(a);
	sb_pool_destroy(a);
	WAIT_FOR(used_now() == 0, 2);
	stop_daemon(SIGTERM);
}

/* A reply whose descriptor cannot be received (the client at its
 * RLIMIT_NOFILE) fails its request; the connection stays. It used to be
 * taken for a lost connection, reconnected at once, and lost again. */
static int child_fd_limit(void)
{
	struct rlimit rl;
	struct sb_pool *p;
	struct sb_buf *b;
	int err = 0, fds[4096], n = 0;
	long r;

	p = connect_pool(0, &err);
	CHECK(p);
	b = make_buf(p, 1 * GiB, 0);
	CHECK_EQ(sb_buf_map(b, 0, PAGE), 1);	/* the first heap */
	usleep(100 * 1000);	/* the lease thread fetches the next */
	CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = 256;
	CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
	while (n < 4096 && (fds[n] = open("/dev/null", O_RDONLY)) >= 0)
		n++;
	CHECK(n < 4096);
	/* Past the first heap (64 MiB): the one fetched ahead, if it was;
	 * the lease thread then asks for the next, whose file the daemon's
	 * reply cannot bring. */
	r = sb_buf_map(b, PAGE, 100 * MiB);
	printf("fd limit: a map of 100 MiB at the limit: %ld\n", r);
	usleep(300 * 1000);
	CHECK(sbi_pool_is_leased(p));
	while (n--)
		close(fds[n]);
	CHECK_EQ(sb_buf_map(b, 256 * MiB, PAGE), 1);
	CHECK(sbi_pool_is_leased(p));
	sb_pool_destroy(p);
	return 0;
}

static void test_fd_limit(void)
{
	struct sbd_status st0, st1;

	start_daemon("256M");
	status(&st0, NULL, 0);
	CHECK_EQ(reap(spawn_child("fd_limit", NULL), 60), 0);
	status(&st1, NULL, 0);
	/* The client's one connection, and this status's. */
	printf("fd limit: %llu connection(s) meanwhile\n",
	       (unsigned long long)(st1.clients_total - st0.clients_total));
	CHECK(st1.clients_total - st0.clients_total <= 2);
	stop_daemon(SIGTERM);
}

/* A client killed with SIGKILL: its pages back within 1 s. */
static void test_client_killed(void)
{
	pid_t hog;
	double t0;
	int err = 0;
	struct sb_pool *pool;
	struct sb_buf *b;

	start_daemon("64M");
	hog = spawn_child("hog", NULL);
	wait_mark("hog-ready", 30);
	CHECK(used_now() >= 40 * MiB);
	/* Nothing of the hog's can go: a request past it is refused, in
	 * bounded time. */
	pool = connect_pool(0, &err);
	CHECK(pool);
	b = make_buf(pool, 1 * GiB, 0);
	t0 = now_s();
	CHECK_EQ(sb_buf_map(b, 0, 32 * MiB), -ENOMEM);
	CHECK(now_s() - t0 < 10);
	printf("refused in %.0f ms with a hog holding 40 of 64 MiB\n",
	       (now_s() - t0) * 1e3);
	kill(hog, SIGKILL);
	t0 = now_s();
	waitpid(hog, NULL, 0);
	/* Back without the killed client's help (how fast is bench/daemon's
	 * figure, against its 1 s target: a timed check here failed under a
	 * loaded CI machine at 1.24 s). */
	WAIT_FOR(used_now() < 24 * MiB, 10);
	CHECK(used_now() < 24 * MiB);
	printf("killed client's pages back in %.1f ms\n", (now_s() - t0) * 1e3);
	CHECK_EQ(sb_buf_map(b, 0, 32 * MiB), 32 * MiB / PAGE);
	sb_pool_destroy(pool);
	stop_daemon(SIGTERM);
}

/* The daemon killed under a client, and restarted. */
static void test_daemon_killed(void)
{
	char *env_local[] = {(char *)"SPARSEBUF_DAEMON_WAIT_MS=300", NULL};
	char *env_fail[] = {(char *)"SPARSEBUF_DAEMON_WAIT_MS=300",
			    (char *)"SPARSEBUF_DAEMON_FALLBACK=fail", NULL};
	struct sbd_client_info ci[4];
	struct sbd_status st;
	pid_t c;

	/* fallback=local, then a new daemon takes the client back */
	start_daemon("256M");
	c = spawn_child("daemon_dies", env_local);
	wait_mark("dies-ready", 30);
	stop_daemon(SIGKILL);
	mark("dies-killed");
	wait_mark("dies-mapped", 30);
	start_daemon("256M");
	mark("dies-restarted");
	wait_mark("dies-back", 30);
	CHECK_EQ(status(&st, ci, 4), 1);
	CHECK_EQ(ci[0].pid, c);
	/* It brought what it holds into the new daemon's accounting. */
	CHECK(ci[0].bytes >= 16 * MiB + 64 * MiB + 8 * MiB);
	CHECK(st.bytes_used <= st.max_bytes);
	mark("dies-exit");
	CHECK_EQ(reap(c, 30), 0);
	WAIT_FOR(used_now() == 0, 2);
	CHECK_EQ(used_now(), 0);

	/* fallback=fail */
	c = spawn_child("daemon_dies", env_fail);
	wait_mark("dies-fail-ready", 30);
	stop_daemon(SIGKILL);
	mark("dies-fail-killed");
	CHECK_EQ(reap(c, 30), 0);
	printf("daemon killed: pages intact, fallback local and fail, "
	       "taken back by a new daemon\n");
}


/* Clients killed at random points, over and over (mid-fault, mid-lease,
 * mid-eviction): each time the budget is back to the survivor's lease
 * within 1 s, never above the budget, and the survivor's data intact. */
static void test_kill_loop(void)
{
	pid_t witness, g;
	unsigned seed = 12345;
	double worst = 0;

	start_daemon("96M");
	witness = spawn_child("witness", NULL);
	wait_mark("witness-up", 30);
	for (int i = 0; i < 12; i++) {
		char up[32];
		double t0;

		unlink(strcat(strcpy(up, dir), "/grower-up"));
		g = spawn_child("grower", NULL);
		wait_mark("grower-up", 30);
		seed = seed * 1103515245 + 12345;
		usleep((seed >> 8) % 60000);
		CHECK(used_now() <= 96 * MiB);
		kill(g, SIGKILL);
		t0 = now_s();
		waitpid(g, NULL, 0);
		WAIT_FOR(used_now() == lease_of(witness), 1.0);
		CHECK_EQ(used_now(), lease_of(witness));
		worst = now_s() - t0 > worst ? now_s() - t0 : worst;
	}
	mark("witness-exit");
	CHECK_EQ(reap(witness, 30), 0);
	WAIT_FOR(used_now() == 0, 2);
	CHECK_EQ(used_now(), 0);
	stop_daemon(SIGTERM);
	printf("kill loop: 12 clients killed mid-growth, budget back each "
	       "time (worst %.0f ms), the survivor's data intact\n",
	       worst * 1e3);
}

/* The daemon killed and restarted under a growing client, three times:
 * the client never stops, its data stays, and the last daemon counts
 * what it holds. */
static void test_daemon_restarts(void)
{
	char *floor_env[] = {(char *)"SBD_WITNESS_FLOOR=1", NULL};
	struct sbd_client_info ci[4];
	struct sbd_status st;
	pid_t witness;

	start_daemon_floor("256M", "64M");
	witness = spawn_child("witness", floor_env);
	wait_mark("witness-up", 30);
	for (int i = 0; i < 3; i++) {
		usleep(100000);
		stop_daemon(SIGKILL);
		usleep(30000);
		start_daemon_floor("256M", "64M");
	}
	WAIT_FOR(lease_of(witness) >= 24 * MiB, 5);
	CHECK(lease_of(witness) >= 24 * MiB);
	/* The FLOOR follows the HELLO that counted the lease. */
	WAIT_FOR(status(&st, ci, 4) == 1 && ci[0].floor == 32 * MiB, 5);
	CHECK_EQ(status(&st, ci, 4), 1);
	CHECK_EQ(ci[0].floor, 32 * MiB);
	CHECK_EQ(st.floors, 32 * MiB);
	mark("witness-exit");
	CHECK_EQ(reap(witness, 30), 0);
	stop_daemon(SIGTERM);
	printf("daemon killed 3 times under a client: its data intact, "
	       "counted again by the last daemon, its floor too\n");
}

/* Garbage on the socket: that connection is dropped, others served. */
static void test_garbage(void)
{
	static const unsigned char junk[][64] = {
		{0},
		{'h', 'e', 'l', 'l', 'o'},
		{0x31, 0x44, 0x42, 0x53, 99, 0},
	};
	struct sb_pool *pool;
	struct sb_buf *b;
	int err = 0;
	char buf[256];

	start_daemon("64M");
	pool = connect_pool(0, &err);
	CHECK(pool);
	b = make_buf(pool, 1 * GiB, 0);
	for (size_t k = 0; k < sizeof(junk) / sizeof(junk[0]); k++) {
		int fd = connect_sock(sock_path);

		CHECK(fd >= 0);
		CHECK(send(fd, junk[k], sizeof(junk[k]), 0) > 0);
		/* The daemon hangs up on it. */
		CHECK_EQ(recv(fd, buf, sizeof(buf), 0), 0);
		close(fd);
	}
	{
		/* A well-formed LEASE before HELLO, and a RETURN of more
		 * than was leased. */
		struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_LEASE,
				    .seq = 5, .a = PAGE, .b = PAGE};
		int fd = connect_sock(sock_path);

		CHECK_EQ(sbd_send(fd, &m, NULL, -1), 0);
		CHECK_EQ(recv(fd, buf, sizeof(buf), 0), 0);
		close(fd);
	}
	CHECK_EQ(sb_buf_map(b, 0, 8 * MiB), 8 * MiB / PAGE);
	CHECK(used_now() >= 8 * MiB);
	sb_pool_destroy(pool);
	stop_daemon(SIGTERM);
	printf("garbage: dropped, the other client still served\n");
}

/* A daemon before 0.3 (a fake, in a thread): its status has no flags.
 * Answers *arg's first two connections' HELLO and STATUS: one client
 * listed, then none. */
static void *status_v1_daemon(void *arg)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	char out[SBD_STATUS_V1_SIZE + SBD_CLIENT_INFO_V1_SIZE] = {0};
	struct sbd_status st = {.max_bytes = 64 * MiB, .nclients = 1};
	struct sbd_client_info ci = {.pid = 4242, .page_size = 16384,
				     .bytes = 3 * MiB};
	int ls = *(int *)arg, rfd;
	long n;

	for (int k = 0; k < 2; k++) {
		int s = accept(ls, NULL, NULL);

		CHECK(s >= 0);
		st.nclients = k == 0;
		memcpy(out, &st, SBD_STATUS_V1_SIZE);
		memcpy(out + SBD_STATUS_V1_SIZE, &ci,
		       SBD_CLIENT_INFO_V1_SIZE);
		while ((n = sbd_recv(s, buf, sizeof(buf), &rfd)) > 0) {
			struct sbd_msg m, r = {.magic = SBD_MAGIC,
					       .type = SBD_REPLY};

			CHECK_EQ(sbd_msg_check(buf, (size_t)n, 0, false, &m),
				 0);
			r.seq = m.seq;
			if (m.type == SBD_STATUS)
				r.len = (uint32_t)(SBD_STATUS_V1_SIZE +
						   st.nclients *
							   SBD_CLIENT_INFO_V1_SIZE);
			CHECK_EQ(sbd_send(s, &r, r.len ? out : NULL, -1), 0);
		}
		close(s);
	}
	return NULL;
}

/* sparsebufctl reads an older daemon's status (no flags) as well as
 * this one's, which says which clients and cache are on huge pages. */
static void test_ctl_status(void)
{
	char path[sizeof(dir) + 16], cmd[2 * PATH_MAX], out[4096];
	struct sb_pool *pool;
	int ls;
	pthread_t th;
	int err = 0;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/old", dir);
	ls = listen_unix(path, 1);
	CHECK_EQ(pthread_create(&th, NULL, status_v1_daemon, &ls), 0);
	snprintf(cmd, sizeof(cmd), "%s/sparsebufctl -s %s status --json",
		 bin_dir(), path);
	f = popen(cmd, "r");
	CHECK(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = 0;
	CHECK_EQ(pclose(f), 0);
	CHECK(strstr(out, "\"pid\": 4242,") &&
	      strstr(out, "\"bytes\": 3145728,") &&
	      strstr(out, "\"hugetlb\": false}") &&
	      strstr(out, "\"cache_hugetlb\": false,"));
	/* The same daemon with no client to list (what a user with no
	 * process of its own sees). */
	f = popen(cmd, "r");
	CHECK(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = 0;
	CHECK_EQ(pclose(f), 0);
	CHECK(strstr(out, "\"clients\": []}"));
	pthread_join(th, NULL);
	close(ls);
	unlink(path);
	/* This daemon: a shmem client, no flags. */
	start_daemon("64M");
	pool = connect_pool(0, &err);
	CHECK(pool);
	snprintf(cmd, sizeof(cmd), "%s/sparsebufctl -s %s status", bin_dir(),
		 sock_path);
	f = popen(cmd, "r");
	CHECK(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = 0;
	CHECK_EQ(pclose(f), 0);
	CHECK(strstr(out, "   256K \n") && !strstr(out, "huge"));
	sb_pool_destroy(pool);
	stop_daemon(SIGTERM);
	printf("ctl status: an older daemon's status read, this one's says "
	       "each client's pages\n");
}

static void test_default_pool(void)
{
	char env[PATH_MAX + 32];
	char *extra[] = {env, (char *)"SPARSEBUF_MIN_BYTES=10100K", NULL};
	struct sbd_client_info ci[4];
	struct sbd_status st;
	pid_t c;

	snprintf(env, sizeof(env), "SPARSEBUF_DAEMON=%s", sock_path);
	start_daemon_floor("128M", "16M");
	c = spawn_child("default", extra);
	wait_mark("default-ready", 30);
	CHECK_EQ(status(&st, ci, 4), 1);
	CHECK_EQ(ci[0].pid, c);
	CHECK(ci[0].bytes >= 8 * MiB);
	/* SPARSEBUF_MIN_BYTES, rounded up to whole (256 KiB) pages. */
	CHECK_EQ(ci[0].floor, 10 * MiB);
	mark("default-exit");
	CHECK_EQ(reap(c, 30), 0);
	stop_daemon(SIGTERM);
	printf("SPARSEBUF_DAEMON: the default pool is a client\n");
}

static void test_permissions(void)
{
	struct stat sst;
	int st;

	start_daemon("64M");
	CHECK_EQ(stat(sock_path, &sst), 0);
	CHECK_EQ(sst.st_mode & 0777, 0660);
	if (geteuid() != 0) {
		printf("permissions: mode 0660 (not root: no other user to "
		       "try)\n");
	} else {
		/* nobody may search the directory, not the socket */
		chmod(dir, 0755);
		st = run_child_env("other_user", NULL, 30, NULL, 0);
		CHECK_EQ(child_exit_code(st), 0);
		printf("permissions: 0660, another user refused (EACCES)\n");
	}
	stop_daemon(SIGTERM);
}

static int child(const char *name)
{
	snprintf(dir, sizeof(dir), "%.40s", getenv("SBD_TEST_DIR"));
	snprintf(sock_path, sizeof(sock_path), "%s/sock", dir);
	if (!strcmp(name, "idle_evictable"))
		return child_idle_evictable();
	if (!strcmp(name, "idle_floor"))
		return child_idle_floor();
	if (!strcmp(name, "fd_limit"))
		return child_fd_limit();
	if (!strcmp(name, "hog"))
		return child_hog();
	if (!strcmp(name, "default"))
		return child_default();
	if (!strcmp(name, "daemon_dies"))
		return child_daemon_dies();
	if (!strcmp(name, "other_user"))
		return child_other_user();
	if (!strcmp(name, "grower"))
		return child_grower();
	if (!strcmp(name, "witness"))
		return child_witness();
	if (!strcmp(name, "cache_put"))
		return child_cache_put();
	if (!strcmp(name, "cache_get"))
		return child_cache_get();
	if (!strcmp(name, "cache_churn"))
		return child_cache_churn();
	if (!strcmp(name, "cache_verify"))
		return child_cache_verify();
	if (!strcmp(name, "cache_putn"))
		return child_cache_putn();
	if (!strcmp(name, "cache_republish"))
		return child_cache_republish();
	if (!strcmp(name, "cache_verify_from1")) {
		setenv("SBD_FROM1", "1", 1);
		return child_cache_verify();
	}
	return 2;
}

/* Hostile options: each refused at start, exit 2, with a message that
 * names the option and the real cause. */
/* sparsebufd with args refused: exit status 2, saying `says` and naming
 * what it refused (args past their first word). */
static void refused(const char *args, const char *says)
{
	char cmd[PATH_MAX + 512], out[1024];
	size_t got;
	FILE *f;
	int st;

	snprintf(cmd, sizeof(cmd),
		 "%s --socket %s/bad.sock --max-bytes 64M %s --foreground 2>&1",
		 daemon_bin, dir, args);
	f = popen(cmd, "r");
	CHECK(f);
	got = fread(out, 1, sizeof(out) - 1, f);
	out[got] = 0;
	st = pclose(f);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !strstr(out, says) ||
	    !strstr(out, strchr(args, ' ') + 1))
		FAIL("sparsebufd %s: exit %d, said: %s (expected exit 2 and "
		     "\"%s\")",
		     args, WIFEXITED(st) ? WEXITSTATUS(st) : -1, out, says);
}

static void test_bad_options(void)
{
	static const struct {
		const char *args, *says;
	} cases[] = {
		{"--spill-dir /nonexistent-sbd", "No such file"},
		{"--spill-dir /etc/passwd", "Not a directory"},
		/* procfs has no O_TMPFILE and no new files: not "No such
		 * file", which would send the user looking for a typo. */
		{"--spill-dir /proc", "not supported"},
		{"--max-bytes 0", "out of range"},
		{"--max-bytes 12Q", "not a size"},
		{"--page-size 5000", "not a power of two"},
		{"--group no-such-group-sbd", "no such group"},
		{"--max-floor 128M", "above --max-bytes"},
	};
	size_t n = sizeof(cases) / sizeof(cases[0]);
	int fd;

	for (size_t i = 0; i < n; i++)
		refused(cases[i].args, cases[i].says);
	/* Where hugetlbfs memfds can be made (else --hugetlb is refused for
	 * that). */
	fd = sbd_heap_file("sbd-test-probe", 0, true);
	if (fd >= 0) {
		close(fd);
		refused("--hugetlb --page-size 256K",
			"not a multiple of the huge page size");
		n++;
	}
	printf("bad options: %zu refused with their cause\n", n);
}

/* SBD_TEST_ONLY=name[,name]: run only those cases (a hunt for a rare
 * failure). */
static bool wanted(const char *name)
{
	const char *p = getenv("SBD_TEST_ONLY");
	size_t n = strlen(name);

	if (!p)
		return true;
	while (*p) {
		size_t len = strcspn(p, ",");

		if (len == n && !strncmp(p, name, n))
			return true;
		p += len + (p[len] == ',');
	}
	return false;
}

/* A case of this test, unless SBD_TEST_ONLY leaves it out. */
#define RUN_CASE(name)                  \
	do {                            \
		if (wanted(#name))      \
			test_##name();  \
	} while (0)

static int main_test(void)
{
	require_uffd();
	daemon_test_init("/tmp/sbd-test-XXXXXX");
	setenv("SBD_TEST_DIR", dir, 1);

	RUN_CASE(bad_options);
	RUN_CASE(cache);
	RUN_CASE(cache_spill);
	RUN_CASE(basic);
	RUN_CASE(idle_gives);
	RUN_CASE(reclaim_late_answer);
	RUN_CASE(floors);
	RUN_CASE(reserve);
	RUN_CASE(fd_limit);
	RUN_CASE(client_killed);
	RUN_CASE(daemon_killed);
	RUN_CASE(kill_loop);
	RUN_CASE(garbage);
	RUN_CASE(ctl_status);
	RUN_CASE(default_pool);
	RUN_CASE(permissions);
	unlink(strcat(strcpy((char[80]){0}, dir), "/witness-exit"));
	unlink(strcat(strcpy((char[80]){0}, dir), "/witness-up"));
	RUN_CASE(daemon_restarts);

	if (daemon_pid)
		stop_daemon(SIGTERM);
	daemon_test_done();
	printf("sparsebufd: every case passed\n");
	return 0;
}
