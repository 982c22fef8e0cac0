/* SPDX-License-Identifier: MIT */
/*
 * A daemon that answers after the client stopped waiting. What each late
 * reply grants would stay the daemon's record of this client, counted
 * and never used, until it disconnects; the client gives it back
 * (lib/dclient.c, handle()):
 *
 *   lease       a late grant: RETURNed (the bytes granted)
 *   heap        two requests timed out back to back, their replies both
 *               late: both heaps freed (HEAP_FREE with their ids); then
 *               12 in a row (more than the 8 the first version kept)
 *   full        a late heap whose HEAP_FREE finds the socket full (the
 *               daemon not reading): queued and sent once it reads, the
 *               connection kept (closing it drops every pin)
 *   cache_put   a block granted for filling: abandoned (CACHE_DONE, not
 *               filled) and its pages' pins given back
 *   cache_get   a prompt found: its pages' pins given back
 *
 * And a daemon replaced by one that drops the client's HELLO (an older
 * one, refusing a flag): the client tries again, but not every 100 ms
 * for ever (each try is a line in that daemon's log).
 *
 *   refused     HELLOs dropped for 3 s: at most 8 tries
 *
 * The daemon is a fake in a thread, speaking lib/dproto.h, that counts
 * what comes back. Needs no kernel feature.
 */
#include "harness.h"
#include "harness_internal.h"
#include "dproto.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/un.h>

static char sock_path[100];
static _Atomic int delay_ms;	/* before each LEASE/HEAP/CACHE reply */
static _Atomic bool stall_after_heap;	/* then read nothing until clear */
static _Atomic int heaps_sent;
static _Atomic uint64_t returned, done_key, done_ok = 99;
static _Atomic int freed_mask, unpins, dones, cache_pins = 0;

#define PUT_PAGES 5
#define GET_PAGES 3
#define GET_TOKENS 3
#define PUT_KEY 0x5eed

static void *fake_daemon(void *arg)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	static char out[SBD_MAX_PAYLOAD];
	int ls = *(int *)arg, s = accept(ls, NULL, NULL), rfd;
	uint32_t next_id = 1;
	long n;

	CHECK(s >= 0);
	while ((n = sbd_recv(s, buf, sizeof(buf), &rfd)) > 0) {
		struct sbd_msg m, r = {.magic = SBD_MAGIC, .type = SBD_REPLY};
		const char *pay = buf + sizeof(struct sbd_msg);
		uint32_t len = 0;
		int fd = -1;

		if (rfd >= 0)
			close(rfd);
		CHECK_EQ(sbd_msg_check(buf, (size_t)n, 0, false, &m), 0);
		r.seq = m.seq;
		switch (m.type) {
		case SBD_HELLO:
			r.a = 1, r.b = GiB, r.c = 4096, r.d = 0;
			break;
		case SBD_LEASE:
			usleep((useconds_t)delay_ms * 1000);
			r.a = m.b;
			break;
		case SBD_RETURN:
			returned += m.a;
			break;
		case SBD_HEAP:
			usleep((useconds_t)delay_ms * 1000);
			fd = sbd_heap_file("late-heap", m.a, false);
			CHECK(fd >= 0);
			r.a = next_id++;
			break;
		case SBD_HEAP_FREE:
			CHECK(m.a >= 1 && m.a <= 30);
			CHECK(!(freed_mask & 1 << m.a));
			freed_mask |= 1 << m.a;
			break;
		case SBD_CACHE_PUT:
			usleep((useconds_t)delay_ms * 1000);
			CHECK_EQ(m.d, PUT_PAGES);
			for (uint32_t i = 0; i < PUT_PAGES; i++) {
				uint64_t ref = SBD_PREF(7, i);

				memcpy(out + 8 * i, &ref, 8);
			}
			cache_pins += PUT_PAGES;
			r.a = PUT_PAGES, len = PUT_PAGES * 8;
			break;
		case SBD_CACHE_GET: {
			int32_t tok[4] = {11, 12, 13, 0};

			usleep((useconds_t)delay_ms * 1000);
			memcpy(out, tok, 16);	/* 3 tokens, padded to 8 */
			for (uint32_t i = 0; i < GET_PAGES; i++) {
				uint64_t ref = SBD_PREF(9, i);

				memcpy(out + 16 + 8 * i, &ref, 8);
			}
			cache_pins += GET_PAGES;
			r.a = GET_PAGES, r.b = GET_TOKENS;
			len = 16 + GET_PAGES * 8;
			break;
		}
		case SBD_CACHE_DONE:
			done_key = m.a;
			done_ok = m.b;
			dones++;
			break;
		case SBD_CACHE_UNPIN:
			CHECK_EQ(m.len, m.a * 8);
			for (uint64_t i = 0; i < m.a; i++) {
				uint64_t ref;

				memcpy(&ref, pay + 8 * i, 8);
				CHECK(SBD_PREF_HEAP(ref) == 7 ||
				      SBD_PREF_HEAP(ref) == 9);
			}
			unpins += (int)m.a;
			cache_pins -= (int)m.a;
			break;
		default:
			break;
		}
		r.nfds = fd >= 0;
		r.len = len;
		if (m.seq)
			CHECK_EQ(sbd_send(s, &r, len ? out : NULL, fd), 0);
		if (fd >= 0)
			close(fd);
		if (m.type == SBD_HEAP) {
			heaps_sent++;
			while (stall_after_heap)
				usleep(1000);
		}
	}
	close(s);
	return NULL;
}

static struct sbi_dclient *cl;

static void test_lease(void)
{
	uint64_t granted = 0;

	delay_ms = 150;
	CHECK_EQ(sbi_dclient_lease(cl, 1 * MiB, 3 * MiB, 0, 0, 50, &granted),
		 -ETIMEDOUT);
	WAIT_FOR(returned == 3 * MiB, 5);
	CHECK_EQ(returned, 3 * MiB);
	printf("lease: a grant that came 100 ms late returned, %llu MiB\n",
	       (unsigned long long)(returned / MiB));
}

static void test_heap(void)
{
	delay_ms = 150;
	CHECK_EQ(sbi_dclient_heap(cl, 4 * MiB, 50), -ETIMEDOUT);
	CHECK_EQ(sbi_dclient_heap(cl, 4 * MiB, 50), -ETIMEDOUT);
	WAIT_FOR(freed_mask == (1 << 1 | 1 << 2), 5);
	CHECK_EQ(freed_mask, 1 << 1 | 1 << 2);
	/* 12 in a row, each answered 30 ms after the client gave up. */
	delay_ms = 40;
	for (int i = 0; i < 12; i++)
		CHECK_EQ(sbi_dclient_heap(cl, 4 * MiB, 10), -ETIMEDOUT);
	WAIT_FOR(freed_mask == 0x7ffe, 5);
	CHECK_EQ(freed_mask, 0x7ffe);
	printf("heap: two heaps made after their requests timed out, both "
	       "freed; then 12 in a row, all freed\n");
}

/* The socket full when a late HEAP reply comes: its HEAP_FREE waits in
 * the client's queue, and the connection stays. */
static void test_full(void)
{
	int sent;

	delay_ms = 100;
	stall_after_heap = true;
	sent = heaps_sent;
	CHECK_EQ(sbi_dclient_heap(cl, 4 * MiB, 10), -ETIMEDOUT);
	/* While the daemon sleeps on it, fill the socket (REPORTs that
	 * find it full are dropped, as they should be). */
	for (int i = 0; i < 20000; i++)
		sbi_dclient_tell(cl, SBD_REPORT, 0, 0, 0, 0);
	WAIT_FOR(heaps_sent > sent, 5);
	usleep(300000);	/* the reader has the late reply by now */
	CHECK(sbi_dclient_connected(cl));
	CHECK(!(freed_mask & 1 << 15));
	stall_after_heap = false;
	/* The lease thread flushes so; here, by hand. */
	for (double t0 = now_s(); !(freed_mask & 1 << 15) && now_s() - t0 < 5;
	     usleep(1000))
		sbi_dclient_cache_flush(cl);
	CHECK(freed_mask & 1 << 15);
	CHECK(sbi_dclient_connected(cl));
	printf("full: a give-back that found the socket full sent once it "
	       "drained, the connection kept\n");
}

static void test_cache_put(void)
{
	int32_t tok[4] = {1, 2, 3, 4};
	uint64_t refs[PUT_PAGES], gen = 0;

	delay_ms = 2300;	/* past CACHE_WAIT_MS */
	CHECK_EQ(sbi_dclient_cache_put(cl, PUT_KEY, 0, 0, tok, 4, PUT_PAGES,
				       refs, &gen),
		 -ETIMEDOUT);
	WAIT_FOR(dones == 1 && unpins == PUT_PAGES, 5);
	CHECK_EQ(dones, 1);
	CHECK_EQ(done_key, PUT_KEY);
	CHECK_EQ(done_ok, 0);
	CHECK_EQ(unpins, PUT_PAGES);
	printf("cache put: a block granted late abandoned, its %d pins given "
	       "back\n", PUT_PAGES);
}

static void test_cache_get(void)
{
	int32_t tok[GET_TOKENS];
	uint64_t refs[GET_PAGES], gen = 0;

	delay_ms = 2300;
	CHECK_EQ(sbi_dclient_cache_get(cl, 77, 0, 0, tok, GET_TOKENS, refs,
				       GET_PAGES, &gen),
		 -ETIMEDOUT);
	WAIT_FOR(unpins == PUT_PAGES + GET_PAGES, 5);
	CHECK_EQ(unpins, PUT_PAGES + GET_PAGES);
	CHECK_EQ(cache_pins, 0);
	CHECK_EQ(dones, 1);
	printf("cache get: a prompt found late, its %d pins given back\n",
	       GET_PAGES);
}

static _Atomic int hellos_dropped;

/* Answers the first connection's HELLO, then hangs up on it and on every
 * later connection's HELLO, for 3 s. */
static void *dropping_daemon(void *arg)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	int ls = *(int *)arg, s = accept(ls, NULL, NULL), rfd;
	struct sbd_msg m, r = {.magic = SBD_MAGIC, .type = SBD_REPLY,
			       .seq = 1, .a = 1, .b = GiB, .c = 4096};
	long n = sbd_recv(s, buf, sizeof(buf), &rfd);
	double t0;

	CHECK(n > 0);
	CHECK_EQ(sbd_msg_check(buf, (size_t)n, 0, false, &m), 0);
	CHECK_EQ(m.type, SBD_HELLO);
	CHECK_EQ(sbd_send(s, &r, NULL, -1), 0);
	usleep(100000);
	close(s);
	t0 = now_s();
	while (now_s() - t0 < 3) {
		struct pollfd p = {ls, POLLIN, 0};

		if (poll(&p, 1, 50) != 1)
			continue;
		s = accept(ls, NULL, NULL);
		CHECK(s >= 0);
		if (sbd_recv(s, buf, sizeof(buf), &rfd) > 0)
			hellos_dropped++;
		close(s);
	}
	return NULL;
}

static void test_refused(void)
{
	char path[sizeof(sock_path) + 8];
	struct sbi_dclient_cbs cbs = {0};
	struct sbi_dclient *c;
	pthread_t th;
	int ls, err = 0;

	snprintf(path, sizeof(path), "%s.old", sock_path);
	ls = listen_unix(path, 4);
	CHECK_EQ(pthread_create(&th, NULL, dropping_daemon, &ls), 0);
	c = sbi_dclient_open(path, 4096, false, 0, &err);
	CHECK(c != NULL);
	CHECK_EQ(sbi_dclient_start(c, &cbs), 0);
	pthread_join(th, NULL);
	sbi_dclient_close(c);
	close(ls);
	unlink(path);
	CHECK(hellos_dropped >= 3 && hellos_dropped <= 8);
	printf("refused: %d HELLOs tried in 3 s against a daemon that drops "
	       "them\n", (int)hellos_dropped);
}

static int main_test(void)
{
	struct sbi_dclient_cbs cbs = {0};
	int ls, err = 0;
	pthread_t th;

	snprintf(sock_path, sizeof(sock_path), "/tmp/sbd-late-%d.sock",
		 (int)getpid());
	ls = listen_unix(sock_path, 1);
	CHECK_EQ(pthread_create(&th, NULL, fake_daemon, &ls), 0);
	cl = sbi_dclient_open(sock_path, 4096, false, 0, &err);
	CHECK(cl != NULL);
	CHECK_EQ(sbi_dclient_start(cl, &cbs), 0);
	test_lease();
	test_heap();
	test_full();
	test_cache_put();
	test_cache_get();
	sbi_dclient_close(cl);
	pthread_join(th, NULL);
	close(ls);
	unlink(sock_path);
	test_refused();
	printf("late replies: everything they granted given back\n");
	return 0;
}

static int child(const char *name)
{
	(void)name;
	return 1;
}
