/* SPDX-License-Identifier: MIT */
/*
 * sparsebufd with huge pages: client pools of SB_POOL_HUGETLB get their
 * heaps from the daemon as hugetlbfs memfds, and a daemon started with
 * --hugetlb keeps its prefix cache on huge pages, shared with such
 * clients (the same physical page in each), spilled to disk and read
 * back intact. Clients of the other kind work and leave the cache alone.
 *
 *   heaps         a huge-page client: pages from the daemon's heaps, in
 *                 huge pages, counted in its budget, all back at the end
 *   cache         two huge-page clients share a prompt's pages
 *   spill         a --hugetlb --spill-dir daemon: cached blocks go to
 *                 disk under its budget and come back intact
 *   short         no huge page free for the cache: a put is refused and
 *                 the prompt stays in the client, which gets no SIGBUS;
 *                 with a cold prompt cached, that one makes room
 *   other_kinds   a shmem client of a --hugetlb daemon, a huge-page
 *                 client of a shmem daemon: no cache, everything else
 *   wrong_kind    a daemon (a fake, in a thread) that hands a huge-page
 *                 client shmem heaps: each is given back, none is used
 *   old_daemon    one that drops a HELLO with the huge-page flag:
 *                 -EOPNOTSUPP, and no default pool running alone
 *
 * Needs huge pages reserved (tests/run.sh reserves them for the run when
 * it can): skips saying so otherwise. The daemon is build/bin/sparsebufd.
 */
#include "harness.h"

#include <pthread.h>
#include <sys/mman.h>

#define HUGE (2 * MiB)
#define NEED 64		/* huge pages the cases use at most, with slack */
/* The prompts (harness_daemon.h): Qwen-like rows of 2 KiB, so that a
 * block of 1024 positions is a huge page of each region. */
#define KV_L 2
#define KV_HEADS 8
#define KV_HEAD_DIM 128
#define KV_TOKENS 2048

#include "harness_daemon.h"

/* sparsebufd with a budget of max; --hugetlb when huge; --spill-dir when
 * spill. */
static void start(const char *max, bool huge, bool spill)
{
	char *extra[4] = {NULL};
	int n = 0;

	if (huge)
		extra[n++] = (char *)"--hugetlb";
	if (spill) {
		extra[n++] = (char *)"--spill-dir";
		extra[n++] = dir;
	}
	start_daemon_with(max, extra);
}

/* The daemon's status, and its first client's entry (zeroed if none). */
static struct sbd_status status_first(struct sbd_client_info *first)
{
	struct sbd_client_info ci = {0};
	struct sbd_status st;

	status(&st, &ci, 1);
	if (first)
		*first = ci;
	return st;
}

/* sparsebufctl status names the client's kind and the machine's huge
 * pages. */
static void ctl_says_huge(void)
{
	char cmd[2 * PATH_MAX], line[512];
	bool client = false, machine = false, cache = false;
	FILE *f;

	/* (.../bin/sparsebufd: its ctl beside it) */
	snprintf(cmd, sizeof(cmd), "%.*sctl -s %s status",
		 (int)strlen(daemon_bin) - 1, daemon_bin, sock_path);
	f = popen(cmd, "r");
	CHECK(f);
	while (fgets(line, sizeof(line), f)) {
		client |= strstr(line, " 2048K huge") != NULL;
		machine |= !strncmp(line, "huge pages: ", 12);
		cache |= strstr(line, "MiB on huge pages;") != NULL;
	}
	CHECK_EQ(pclose(f), 0);
	CHECK(client && machine && cache);
}

/* A client pool of 2 MiB pages: huge pages (heaps of 4 MiB: many heaps,
 * so most come from the daemon) or shmem (so that the kind of heap, not
 * the page size, is what differs from the daemon's). */
static struct sb_pool *client(bool huge, size_t ceiling)
{
	struct sb_pool_opts o;
	struct sb_pool *p;
	int err = 0;

	sb_pool_opts_init(&o);
	o.page_size = HUGE;
	o.heap_size = huge ? 2 * HUGE : 16 * MiB;
	o.max_bytes = ceiling;
	o.spill_dir = dir;
	if (huge)
		o.flags |= SB_POOL_HUGETLB;
	p = sb_pool_connect(sock_path, &o, &err);
	if (!p)
		FAIL("sb_pool_connect(%s): %s", huge ? "huge pages" : "shmem",
		     strerror(-err));
	return p;
}

/* ---- the cases -------------------------------------------------------- */

/* Pages 0-11 of b placed and filled (page i with i + 1), two a heap with
 * a pause now and then: the lease thread fetches the daemon's heaps ahead
 * of the pool's need. */
static void place_twelve(struct sb_buf *b)
{
	char *x = sb_buf_addr(b);

	for (size_t i = 0; i < 12; i++) {
		CHECK_EQ(sb_buf_map(b, i * HUGE, HUGE), 1);
		memset(x + i * HUGE, (int)i + 1, HUGE);
		if (i % 2)
			usleep(20000);
	}
}

static void test_heaps(void)
{
	struct sbd_client_info ci;
	struct sbd_status st;
	long free0 = meminfo("HugePages_Free");
	struct sb_pool *p;
	struct sb_buf *b;
	char *x;

	start("256M", true, false);
	p = client(true, 0);
	b = make_buf(p, 64 * MiB, 0);
	x = sb_buf_addr(b);
	place_twelve(b);
	for (size_t i = 0; i < 12; i++)
		CHECK(x[i * HUGE] == (char)(i + 1) &&
		      x[i * HUGE + HUGE - 1] == (char)(i + 1));
	/* Every page a huge page, some from the daemon's files. */
	CHECK(free0 - meminfo("HugePages_Free") >= 12);
	CHECK(maps_count(x, 12 * HUGE, "sparsebufd-heap") > 0);
	st = status_first(&ci);
	CHECK_EQ(st.nclients, 1);
	CHECK_EQ(ci.page_size, HUGE);
	CHECK(ci.flags & SBD_CLIENT_HUGETLB);
	CHECK(st.flags & SBD_STATUS_HUGETLB);
	ctl_says_huge();
	CHECK(ci.bytes >= 12 * HUGE && st.bytes_used <= st.max_bytes);
	printf("heaps: 12 huge pages placed, %ld of the buffer's mappings "
	       "from the daemon's heaps, %llu MiB leased\n",
	       maps_count(x, 12 * HUGE, "sparsebufd-heap"),
	       (unsigned long long)(ci.bytes >> 20));
	VERIFY(p);
	sb_pool_destroy(p);
	WAIT_FOR(status_first(NULL).bytes_used == 0, 10);
	CHECK_EQ(status_first(NULL).bytes_used, 0);
	CHECK_EQ(meminfo("HugePages_Free"), free0);
	stop_daemon(SIGTERM);
}

static void test_cache(void)
{
	struct sb_kv_config cfg = kv_config();
	int32_t toks[KV_TOKENS];
	struct sb_kv_cache *ca, *cb;
	struct sb_kv_seq *sa, *sb;
	struct sb_pool *pa, *pb;
	struct sbd_status st;
	size_t hit = 0;
	int err = 0;

	start("256M", true, false);
	pa = client(true, 0);
	pb = client(true, 0);
	ca = sb_kv_cache_create(pa, &cfg, "test-model", 64 * MiB, &err);
	cb = sb_kv_cache_create(pb, &cfg, "test-model", 64 * MiB, &err);
	CHECK(ca && cb);
	sa = kv_compute(pa, 0, toks);
	CHECK_EQ(sb_kv_cache_put(ca, sa, toks, KV_TOKENS), KV_TOKENS);
	st = status_first(NULL);
	CHECK_EQ(st.cache_blocks, 2);
	CHECK_EQ(st.bytes_shared, 2 * 2 * KV_L * HUGE);
	sb = sb_kv_cache_get(cb, toks, KV_TOKENS, &hit, &err);
	CHECK(sb);
	CHECK_EQ(hit, KV_TOKENS);
	CHECK(kv_rows_ok_s(sb, 0, KV_TOKENS));
	/* One copy: the same frame under both processes' views (root). */
	if (pfn_of(sb_kv_k(sa, 1)))
		CHECK_EQ(pfn_of(sb_kv_k(sb, 1)), pfn_of(sb_kv_k(sa, 1)));
	CHECK(kv_rows_ok_s(sa, 0, KV_TOKENS));
	printf("cache: a prompt put by one huge-page client, found whole by "
	       "another, %llu MiB of huge pages held once\n",
	       (unsigned long long)(st.bytes_shared >> 20));
	sb_kv_destroy(sb);
	sb_kv_destroy(sa);
	sb_kv_cache_destroy(cb);
	sb_kv_cache_destroy(ca);
	VERIFY(pa);
	VERIFY(pb);
	sb_pool_destroy(pb);
	sb_pool_destroy(pa);
	stop_daemon(SIGTERM);
}

static void test_spill(void)
{
	struct sb_kv_config cfg = kv_config();
	struct sb_kv_cache *c;
	struct sbd_status st;
	struct sb_pool *p;
	int err = 0, found = 0;
	const unsigned n = 8;	/* 16 MiB each: 128 MiB against 96 */

	start("96M", true, true);
	p = client(true, 32 * MiB);
	/* A small local cache: what it put it lets go of (unpinned). */
	c = sb_kv_cache_create(p, &cfg, "test-model", 8 * MiB, &err);
	CHECK(c);
	kv_put_range(c, p, 1, n);
	sb_kv_cache_destroy(c);
	sb_pool_destroy(p);
	st = status_first(NULL);
	CHECK(st.bytes_used <= st.max_bytes);
	CHECK(st.bytes_spilled > 0);
	printf("spill: %llu MiB of cached huge pages in memory, %llu MiB on "
	       "disk\n", (unsigned long long)(st.bytes_shared >> 20),
	       (unsigned long long)(st.bytes_spilled >> 20));
	/* Each found one read back (into huge pages, through a mapping:
	 * hugetlbfs has no write) as it was put. */
	p = client(true, 32 * MiB);
	c = sb_kv_cache_create(p, &cfg, "test-model", 4 * MiB, &err);
	CHECK(c);
	for (unsigned seed = 1; seed <= n; seed++)
		found += kv_get_checked(c, seed) == KV_TOKENS;
	CHECK_EQ(found, (int)n);
	printf("spill: all %u prompts found whole and intact\n", n);
	sb_kv_cache_destroy(c);
	VERIFY(p);
	sb_pool_destroy(p);
	stop_daemon(SIGTERM);
}

/* Every huge page free but `leave` taken by an anonymous hugetlb mapping
 * of this process (touched: allocated, not only reserved); *len: its
 * size, for munmap. */
static void *hog_huge_pages(long leave, size_t *len)
{
	long n = meminfo("HugePages_Free") - meminfo("HugePages_Rsvd") - leave;
	char *m;

	CHECK(n > 0);
	*len = (size_t)n * HUGE;
	m = mmap(NULL, *len, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	CHECK(m != MAP_FAILED);
	for (size_t off = 0; off < *len; off += HUGE)
		m[off] = 1;
	return m;
}

static void test_short(void)
{
	struct sb_kv_config cfg = kv_config();
	int32_t toks[KV_TOKENS];
	struct sb_kv_cache *c;
	struct sb_kv_seq *s, *g;
	struct sbd_status st;
	struct sb_pool *p;
	size_t hit = 0, len;
	int err = 0;
	void *hog;

	start("256M", true, false);
	p = client(true, 0);
	c = sb_kv_cache_create(p, &cfg, "test-model", 64 * MiB, &err);
	CHECK(c);
	s = kv_compute(p, 0, toks);
	/* The cache needs 8 huge pages for it (4 a block); 2 are left, and
	 * what the client gives back when refused (its ready pages). The
	 * cache's pages are allocated before the client may write them:
	 * without that, the client's copy into them took SIGBUS. */
	hog = hog_huge_pages(2, &len);
	CHECK_EQ(sb_kv_cache_put(c, s, toks, KV_TOKENS), KV_TOKENS);
	st = status_first(NULL);
	CHECK(st.cache_blocks < 2);
	CHECK_EQ(st.bytes_shared, st.cache_blocks * 2 * KV_L * HUGE);
	g = sb_kv_cache_get(c, toks, KV_TOKENS, &hit, &err);
	CHECK(g && hit == KV_TOKENS && kv_rows_ok_s(g, 0, KV_TOKENS));
	CHECK(kv_rows_ok_s(s, 0, KV_TOKENS));
	munmap(hog, len);
	printf("short: with 2 huge pages free the daemon took %llu of the "
	       "prompt's 2 blocks; the rest stayed in the client, intact\n",
	       (unsigned long long)st.cache_blocks);
	sb_kv_destroy(g);
	sb_kv_destroy(s);
	sb_kv_cache_destroy(c);
	VERIFY(p);
	sb_pool_destroy(p);
	stop_daemon(SIGTERM);
}

/* The cache page size the daemon tells a client of 2 MiB pages, huge or
 * not, in answer to its HELLO (0: no cache for it). */
static uint64_t hello_cache_page(bool huge)
{
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_HELLO, .seq = 1,
			    .a = SBD_VERSION, .c = HUGE,
			    .d = huge ? SBD_HELLO_HUGETLB : 0};

	return hello_once(m).c;
}

/* Huge pages short with a cold prompt in the cache that nobody maps: the
 * cache lets it go for the new one, as it would for its budget. */
static void test_short_shrink(void)
{
	struct sb_kv_config cfg = kv_config();
	int32_t toks[KV_TOKENS];
	struct sb_kv_cache *c;
	struct sb_kv_seq *s;
	struct sb_pool *p;
	size_t len, old;
	int err = 0;
	void *hog;

	start("256M", true, false);
	p = client(true, 0);
	c = sb_kv_cache_create(p, &cfg, "test-model", 64 * MiB, &err);
	CHECK(c);
	kv_put_range(c, p, 1, 1);
	sb_kv_cache_destroy(c);
	sb_pool_destroy(p);	/* its pins gone: prompt 1 is cold */
	CHECK_EQ(status_first(NULL).cache_blocks, 2);
	p = client(true, 0);
	c = sb_kv_cache_create(p, &cfg, "test-model", 64 * MiB, &err);
	CHECK(c);
	s = kv_compute(p, 2, toks);
	hog = hog_huge_pages(0, &len);
	CHECK_EQ(sb_kv_cache_put(c, s, toks, KV_TOKENS), KV_TOKENS);
	munmap(hog, len);
	CHECK(status_first(NULL).cache_blocks <= 3);
	sb_kv_destroy(s);
	sb_kv_cache_destroy(c);
	sb_pool_destroy(p);
	/* Another process finds prompt 2 in the daemon, whole; prompt 1
	 * made room for it. */
	p = client(true, 0);
	c = sb_kv_cache_create(p, &cfg, "test-model", 4 * MiB, &err);
	CHECK(c);
	CHECK_EQ(kv_get_checked(c, 2), KV_TOKENS);
	old = kv_get_checked(c, 1);
	CHECK(old < KV_TOKENS);
	printf("short: with no huge page free, a cold prompt's blocks made "
	       "room for a new one (%zu of its positions left)\n", old);
	sb_kv_cache_destroy(c);
	VERIFY(p);
	sb_pool_destroy(p);
	stop_daemon(SIGTERM);
}

/* A client whose heaps are not of the daemon cache's kind (the same page
 * size): it works, and its puts stay in its own process. */
static void other_kind(bool daemon_huge)
{
	struct sb_kv_config cfg = kv_config();
	int32_t toks[KV_TOKENS];
	struct sb_kv_cache *c;
	struct sb_kv_seq *s, *g;
	struct sb_pool *p;
	long free0 = meminfo("HugePages_Free");
	size_t hit = 0;
	int err = 0;

	if (daemon_huge) {
		start("256M", true, false);
	} else {
		char *two[] = {(char *)"--page-size", (char *)"2M", NULL};

		start_daemon_with("256M", two);
	}
	CHECK_EQ(hello_cache_page(daemon_huge), HUGE);
	CHECK_EQ(hello_cache_page(!daemon_huge), 0);
	p = client(!daemon_huge, 0);
	{
		struct sbd_client_info ci;
		struct sbd_status st = status_first(&ci);

		CHECK_EQ(!!(ci.flags & SBD_CLIENT_HUGETLB), !daemon_huge);
		CHECK_EQ(!!(st.flags & SBD_STATUS_HUGETLB), daemon_huge);
	}
	c = sb_kv_cache_create(p, &cfg, "test-model", 64 * MiB, &err);
	CHECK(c);
	s = kv_compute(p, 0, toks);
	CHECK_EQ(sb_kv_cache_put(c, s, toks, KV_TOKENS), KV_TOKENS);
	CHECK_EQ(status_first(NULL).cache_blocks, 0);
	g = sb_kv_cache_get(c, toks, KV_TOKENS, &hit, &err);
	CHECK(g && hit == KV_TOKENS && kv_rows_ok_s(g, 0, KV_TOKENS));
	/* The client's own pages are of its kind. */
	if (daemon_huge)
		CHECK_EQ(meminfo("HugePages_Free"), free0);
	else
		CHECK(free0 - meminfo("HugePages_Free") >= 2 * 2 * KV_L);
	sb_kv_destroy(g);
	sb_kv_destroy(s);
	sb_kv_cache_destroy(c);
	VERIFY(p);
	sb_pool_destroy(p);
	stop_daemon(SIGTERM);
}

static void test_other_kinds(void)
{
	other_kind(true);
	other_kind(false);
	printf("other kinds: a shmem client of a --hugetlb daemon and a "
	       "huge-page client of a shmem daemon work, their prompts "
	       "cached in their own process only\n");
}

/* ---- a daemon that hands out the wrong kind of heap --------------------- */

static _Atomic int fake_heaps, fake_freed;

/* Serves one client on listening socket *arg: grants every lease, answers
 * every HEAP with a shmem memfd, counts HEAP_FREEs; until the client
 * hangs up. */
static void *fake_daemon(void *arg)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	int ls = *(int *)arg, s = accept(ls, NULL, NULL), rfd;
	uint32_t next_id = 1;
	long n;

	CHECK(s >= 0);
	while ((n = sbd_recv(s, buf, sizeof(buf), &rfd)) > 0) {
		struct sbd_msg m, r = {.magic = SBD_MAGIC, .type = SBD_REPLY};
		int fd = -1;

		if (rfd >= 0)
			close(rfd);
		CHECK_EQ(sbd_msg_check(buf, (size_t)n, 0, false, &m), 0);
		r.seq = m.seq;
		switch (m.type) {
		case SBD_HELLO:
			CHECK(m.d & SBD_HELLO_HUGETLB);
			r.a = 1, r.b = GiB, r.c = 0, r.d = 0;
			break;
		case SBD_LEASE:
			r.a = m.b;
			break;
		case SBD_HEAP:
			fd = sbd_heap_file("fake-shmem-heap", m.a, false);
			CHECK(fd >= 0);
			r.a = next_id++;
			fake_heaps++;
			break;
		case SBD_HEAP_FREE:
			fake_freed++;
			break;
		default:
			break;
		}
		r.nfds = fd >= 0;
		if (m.seq)
			CHECK_EQ(sbd_send(s, &r, NULL, fd), 0);
		if (fd >= 0)
			close(fd);
	}
	close(s);
	return NULL;
}

static void test_wrong_kind(void)
{
	long free0 = meminfo("HugePages_Free");
	int ls = listen_unix(sock_path, 1);
	struct sb_pool *p;
	struct sb_buf *b;
	pthread_t th;
	char *x;

	CHECK_EQ(pthread_create(&th, NULL, fake_daemon, &ls), 0);
	p = client(true, 0);
	b = make_buf(p, 64 * MiB, 0);
	x = sb_buf_addr(b);
	place_twelve(b);
	CHECK(fake_heaps > 0);
	WAIT_FOR(fake_freed == fake_heaps, 5);
	CHECK_EQ(fake_freed, fake_heaps);
	CHECK_EQ(maps_count(x, 12 * HUGE, "fake-shmem-heap"), 0);
	CHECK(free0 - meminfo("HugePages_Free") >= 12);
	for (size_t i = 0; i < 12; i++)
		CHECK(x[i * HUGE] == (char)(i + 1));
	printf("wrong kind: %d shmem heaps handed to a huge-page client, "
	       "every one given back unused\n", (int)fake_heaps);
	VERIFY(p);
	sb_pool_destroy(p);
	pthread_join(th, NULL);
	close(ls);
	unlink(sock_path);
}

/* An older daemon: it drops a client whose HELLO has a flag it does not
 * know. Serves *arg's first two connections so. */
static void *old_daemon(void *arg)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	int ls = *(int *)arg, rfd;

	for (int i = 0; i < 2; i++) {
		int s = accept(ls, NULL, NULL);

		CHECK(s >= 0);
		if (sbd_recv(s, buf, sizeof(buf), &rfd) > 0 && rfd >= 0)
			close(rfd);
		close(s);
	}
	return NULL;
}

/* -EOPNOTSUPP, said, from sb_pool_connect and for the default pool
 * (SPARSEBUF_HUGETLB=1 with SPARSEBUF_DAEMON), which does not run alone
 * then: the machine's budget would not be kept. */
static void test_old_daemon(void)
{
	char env[sizeof(sock_path) + 32];
	char *extra[] = {env, (char *)"SPARSEBUF_HUGETLB=1", NULL};
	int ls = listen_unix(sock_path, 2), err = 0;
	struct sb_pool_opts o;
	pthread_t th;

	CHECK_EQ(pthread_create(&th, NULL, old_daemon, &ls), 0);
	sb_pool_opts_init(&o);
	o.page_size = HUGE;
	o.flags = SB_POOL_HUGETLB;
	CHECK(sb_pool_connect(sock_path, &o, &err) == NULL);
	CHECK_EQ(err, -EOPNOTSUPP);
	snprintf(env, sizeof(env), "SPARSEBUF_DAEMON=%s", sock_path);
	CHECK_EQ(child_exit_code(run_child_env("default_old", extra, 60, NULL,
					       0)),
		 0);
	pthread_join(th, NULL);
	close(ls);
	unlink(sock_path);
	printf("old daemon: a huge-page client refused with -EOPNOTSUPP, its "
	       "default pool unavailable rather than alone\n");
}

static int child(const char *name)
{
	if (!strcmp(name, "default_old")) {
		CHECK(sb_default_pool() == NULL);
		CHECK_EQ(sb_default_pool_error(), -EOPNOTSUPP);
		return 0;
	}
	return 1;
}

static int main_test(void)
{
	long size = meminfo("Hugepagesize"), nfree;

	require_uffd();
	if (size != (long)(HUGE >> 10))
		SKIP("the default huge page size is %ld kB, not 2048 "
		     "(Hugepagesize in /proc/meminfo)", size);
	nfree = meminfo("HugePages_Free") - meminfo("HugePages_Rsvd");
	if (nfree < NEED)
		SKIP("%ld huge pages free, %d needed: reserve some (echo %d "
		     "> /proc/sys/vm/nr_hugepages, as root; tests/run.sh "
		     "does that for the run when it can)",
		     nfree, NEED, NEED + 16);
	daemon_test_init("/tmp/sbd-hugetlb-XXXXXX");
	/* The pools here say what they are, and the children are told their
	 * default pool's settings (make test-daemon sets its own, which
	 * getenv would find first). */
	unsetenv("SPARSEBUF_DAEMON");
	unsetenv("SPARSEBUF_HUGETLB");
	unsetenv("SPARSEBUF_PAGE_SIZE");
	unsetenv("SPARSEBUF_HEAP_SIZE");
	test_heaps();
	test_cache();
	test_spill();
	test_short();
	test_short_shrink();
	test_other_kinds();
	test_wrong_kind();
	test_old_daemon();
	daemon_test_done();
	printf("sparsebufd on huge pages: every case passed\n");
	return 0;
}
