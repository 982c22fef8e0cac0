/* SPDX-License-Identifier: MIT */
/*
 * Fuzz sparsebufd's message handling: the protocol's check of a received
 * message (sbd_msg_check, lib/dproto.c) and, behind it, the daemon's
 * state machine (daemon/server.c: connections, HELLO, heaps, status;
 * daemon/budget.c: leases, reclaims, parked requests), the real code on
 * real sockets. What a client sends is outside input: any process of a
 * member of the socket's group can connect and send anything.
 *
 * Every input is used twice:
 *
 *   raw       the bytes as one message, checked as sent by a client and
 *             by the daemon, with 0, 1 and 2 descriptors beside it;
 *   sequence  the bytes as a daemon's configuration and a sequence of
 *             steps, run against a struct sbd_server built here (its own
 *             event loop, no listening socket): a "client" is one end of
 *             an AF_UNIX SOCK_SEQPACKET socketpair, the other end handed
 *             to the daemon by sbd_server_adopt as if accepted.
 *
 * The sequence:
 *
 *   byte 0    the budget, max_bytes = (byte + 16) * 64 KiB (1 to 17 MiB)
 *   byte 1    bit 0: 3 clients (else 2); bit 1: --verbose; bits 2-4: the
 *             daemon's page size, 4 KiB << n; bit 5: --hugetlb (the
 *             cache on huge pages, the page size then 2 MiB)
 *   byte 2    the clients' uids, 2 bits each: root, the daemon's own
 *             (1000), 1001, 1002 (status lists others' clients to root
 *             and the daemon's user only)
 *   steps, until the input ends (at most MAX_STEPS), each a control byte:
 *     bits 0-1  the client (modulo their number)
 *     bits 2-3  what:
 *       0  a message, compact: type (modulo 11), seq (0: 0, else the
 *          client's next sequence number), then a, b, c, d as u16 each
 *          (little-endian): bits 0-13 a value, bits 14-15 its shift, 0,
 *          12, 20 or 35 (bytes, pages, MiB, near 2^48); magic filled in
 *       1  a message, raw: u16 n, bits 0-14 the bytes that follow (at
 *          most what is left), bit 15: padded with zeros to a header and
 *          SBD_MAX_PAYLOAD bytes, one more if n is odd (too large)
 *       2  hang up: the client's end closed (bit 4: after the daemon
 *          ran, its answers to deferred messages left unread: the
 *          daemon then reads ECONNRESET, not the end)
 *       3  the clock: one more byte, the daemon's time moves (byte + 1)
 *          * 25 ms (a request waits 3 s at most, a client is asked again
 *          after 1 s)
 *     bits 4 and 7 (messages): descriptors sent beside it, 0, 1, 2 or 5
 *          (compact: the header says so too)
 *     bit 5 (messages): deferred, the daemon does not run before the
 *          next step (messages pile up: up to 16 read at a wake-up)
 *     bit 6 (compact): taken from what the daemon said: a RETURN gives
 *          back the last RECLAIM's bytes and answers it (b = 1), a
 *          HEAP_FREE frees the last heap received, a HELLO claims what
 *          the client held when its last connection ended (a restart)
 *   A client's connection opens with its first message, and again after
 *   a hang-up (a restarted process), at most MAX_CONNS an input.
 *
 * After every step (deferred ones aside) the daemon's handlers run
 * (sbd_loop_once until nothing is ready), then every client's messages
 * are read, then sbd_budget_tick, and they are read again. The daemon's
 * clock is the harness's (sbd_fake_now_ms): runs are reproducible.
 *
 * The contract checked:
 *   - raw: sbd_msg_check returns 0, -EBADMSG or -EPROTO; a message it
 *     accepts has every property dproto.h documents (accepted implies
 *     valid), and is never accepted from both sides;
 *   - every message the daemon sends passes sbd_msg_check as from the
 *     daemon; a RECLAIM has seq 0 and goes to a client that said HELLO,
 *     not a control connection; a REPLY answers a request the client
 *     made on this connection (one with that seq, not answered yet) and
 *     fits it: HELLO: the client's id, max_bytes, page size; LEASE: bytes
 *     granted in [at least, at most], whole pages of the client's, or
 *     -ENOMEM (from sbd_budget_tick, only for more than the room it
 *     left: a parked request is not refused what fits); HEAP: a sealed
 *     memfd of the size asked (the only reply with a descriptor);
 *     STATUS: a payload of exactly the clients it lists, none of them
 *     another user's unless the asker may see them;
 *   - after every step: s->used is the sum of every client's lease, each
 *     a multiple of 4096, a control connection holds none, nclients is
 *     the list's length; used exceeds max_bytes by at most what the
 *     HELLOs claimed (the only way past the budget);
 *   - at the end, every client's end closed and the handlers run until
 *     the daemon dropped them all: used == 0, nclients == 0; after
 *     sbd_server_close and sbd_loop_free, as many descriptors open as
 *     before the input (the daemon leaks none); ASan sees the memory.
 *
 * The daemon's log goes to /dev/null (sbd_log_file): every dropped client
 * is logged, and libFuzzer's output would drown.
 *
 * This harness found three bugs in the daemon, since fixed: a message of
 * no bytes with a descriptor beside it read as the end of the stream and
 * the descriptor was never closed (one leaked per such message,
 * corpus/dmsg/regress-empty-message-with-fd); sbd_budget_tick refused a
 * parked request that fit, when an older one that did not fit held it
 * behind (corpus/dmsg/regress-tick-refused-what-fits); and a RECLAIM that
 * could not be sent (a client gone, or not reading) left that client the
 * idlest to ask, so one LEASE of 70 TiB had the daemon send to it need /
 * its lease times, 23 s of a stalled daemon for one message
 * (corpus/dmsg/regress-reclaim-spins-on-unreachable: libFuzzer's
 * -timeout is the check).
 */
#include "fuzz.h"
#include "dproto.h"
#include "../../daemon/server.h"

#include <fcntl.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

#define MAX_SLOTS 3
#define MAX_CONNS 16
#define MAX_STEPS 512
#define NREQ 64		/* requests remembered per connection */
#define SELF_UID 1000
#define CLOCK_START 1000000	/* ms: any time but 0 (the real clock) */

/* One request a client made, until it is answered. */
struct req {
	bool live;
	uint16_t type;
	uint32_t seq;
	uint64_t a, b, c, d;
};

struct slot {
	int fd;			/* the client's end; -1: not connected */
	uint32_t id;		/* the daemon's id of the connection */
	uid_t uid;
	uint32_t next_seq;
	uint64_t page;		/* its page size, once HELLO is answered */
	bool control;		/* a control connection, by that HELLO */
	bool hugetlb;		/* its heaps are huge pages, by that HELLO */
	uint64_t reclaim;	/* the last RECLAIM's bytes */
	uint64_t heap_id;	/* the last heap received */
	/* The cache: the last key put, a page reference received. */
	uint64_t key, pref;
	uint64_t held;		/* its lease when its last connection ended */
	struct req req[NREQ];
	unsigned nreq;		/* next entry of req to use */
	bool lost, dup;		/* a request forgotten; a seq used twice */
};

struct run {
	struct sbd_server s;
	struct slot slot[MAX_SLOTS];
	unsigned nslots, nconns;
	int nullfd;		/* what travels as a descriptor */
	uint64_t hello_bytes;	/* what HELLOs claimed, in all */
	/* Reading what sbd_budget_tick sent: the room it left (at most
	 * the room when it refused a parked request: only grants move
	 * used, up). */
	bool in_tick;
	uint64_t tick_room;
};

/* The daemon's messages, read into this. */
static union {
	struct sbd_msg m;
	uint8_t b[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
} rbuf;

/* A message sent, of header and payload (a padded raw one). */
static uint8_t sbuf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD + 1];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	signal(SIGPIPE, SIG_IGN);	/* as sparsebufd's main() */
	sbd_log_file = fopen("/dev/null", "w");
	if (!sbd_log_file) {
		perror("/dev/null");
		abort();
	}
	return 0;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1;	/* opendir's own */
}

/* ---- raw: sbd_msg_check alone ---------------------------------------------
 */

static bool size_ok(uint64_t v, bool zero_ok)
{
	return (v || zero_ok) && v <= SBD_MAX_BYTES && v % 4096 == 0;
}

/* m, accepted from n bytes at buf with nfds descriptors: is it what
 * dproto.h documents? */
static void check_accepted(const uint8_t *buf, size_t n, unsigned nfds,
			   bool from_daemon, const struct sbd_msg *m)
{
	bool ok = true;

	FUZZ_CHECK(!memcmp(m, buf, sizeof(*m)), "the header not as sent");
	FUZZ_CHECK(m->magic == SBD_MAGIC && m->len <= SBD_MAX_PAYLOAD &&
			   m->len == n - sizeof(*m) && m->nfds == nfds &&
			   nfds <= SBD_MAX_FDS,
		   "accepted: magic %#x, len %u of %zu bytes, nfds %u of %u",
		   m->magic, m->len, n, m->nfds, nfds);
	FUZZ_CHECK(m->type && m->type < SBD_TYPE_END &&
			   from_daemon == (m->type == SBD_RECLAIM ||
					   m->type == SBD_REPLY),
		   "accepted type %u from the %s", m->type,
		   from_daemon ? "daemon" : "client");
	FUZZ_CHECK(m->type == SBD_REPLY ||
			   (!nfds && (!m->len || m->type == SBD_CACHE_PUT ||
				      m->type == SBD_CACHE_UNPIN ||
				      m->type == SBD_CACHE_MODEL)),
		   "accepted a %s with %u descriptors, %u bytes of payload",
		   sbd_type_name(m->type), nfds, m->len);
	switch (m->type) {
	case SBD_HELLO:
		ok = m->a == SBD_VERSION && size_ok(m->b, true) &&
		      !(m->c & (m->c - 1)) && m->c <= ((uint64_t)1 << 30) &&
		      !(m->d & ~(uint64_t)(SBD_HELLO_CONTROL |
					    SBD_HELLO_HUGETLB)) &&
		      !((m->d & SBD_HELLO_CONTROL) &&
			(m->d & SBD_HELLO_HUGETLB)) &&
		      ((m->d & SBD_HELLO_CONTROL) || m->c >= 4096);
		break;
	case SBD_LEASE:
		ok = size_ok(m->a, false) && size_ok(m->b, false) &&
		      m->a <= m->b && size_ok(m->c, true) &&
		      size_ok(m->d, true);
		break;
	case SBD_RETURN:
		ok = size_ok(m->a, true) && m->b <= 1 &&
		      size_ok(m->c, true) && size_ok(m->d, true);
		break;
	case SBD_REPORT:
		ok = size_ok(m->a, true) && size_ok(m->c, true) &&
		      size_ok(m->d, true);
		break;
	case SBD_HEAP:
		ok = size_ok(m->a, false);
		break;
	case SBD_HEAP_FREE:
		ok = m->a && m->a <= UINT32_MAX;
		break;
	case SBD_RECLAIM:
		ok = size_ok(m->a, false);
		break;
	case SBD_REPLY:
		ok = m->err <= 0 && m->err >= -4095;
		break;
	case SBD_CACHE_PUT:
		ok = m->c < SBD_CACHE_MAX_DEPTH && m->d &&
		     m->d <= SBD_CACHE_MAX_PAGES && m->len && m->len % 4 == 0 &&
		     m->len / 4 <= SBD_CACHE_MAX_TOKENS;
		break;
	case SBD_CACHE_DONE:
		ok = m->b <= 1;
		break;
	case SBD_CACHE_GET:
		ok = m->c < SBD_CACHE_MAX_DEPTH;
		break;
	case SBD_CACHE_HEAP:
		ok = m->a && m->a <= UINT32_MAX;
		break;
	case SBD_CACHE_UNPIN:
		ok = m->a && m->len == m->a * 8;
		break;
	case SBD_CACHE_MODEL:
		ok = m->len && m->len < SBD_CACHE_MODEL_MAX;
		break;
	case SBD_FLOOR:
		ok = size_ok(m->a, true);
		break;
	}
	FUZZ_CHECK(ok, "accepted a %s out of range: a %#llx b %#llx c %#llx "
			"d %#llx err %lld",
		   sbd_type_name(m->type), (unsigned long long)m->a,
		   (unsigned long long)m->b, (unsigned long long)m->c,
		   (unsigned long long)m->d, (long long)m->err);
	switch (m->type) {
	case SBD_HELLO:
	case SBD_LEASE:
	case SBD_HEAP:
	case SBD_STATUS:
	case SBD_REPLY:
	case SBD_CACHE_PUT:
	case SBD_CACHE_DONE:
	case SBD_CACHE_GET:
	case SBD_CACHE_HEAP:
	case SBD_CACHE_LIST:
	case SBD_FLOOR:
		FUZZ_CHECK(m->seq, "accepted a %s without seq",
			   sbd_type_name(m->type));
		break;
	}
}

static void check_raw(const uint8_t *buf, size_t n)
{
	FUZZ_CHECK(sbd_type_name(n >= 6 ? (unsigned)buf[4] | buf[5] << 8 : 0),
		   "no name");
	for (unsigned nfds = 0; nfds < 3; nfds++) {
		bool ok[2];

		for (int side = 0; side < 2; side++) {
			struct sbd_msg m;
			int r = sbd_msg_check(buf, n, nfds, side, &m);

			FUZZ_CHECK(r == 0 || r == -EBADMSG || r == -EPROTO,
				   "sbd_msg_check returned %d", r);
			ok[side] = r == 0;
			if (!r)
				check_accepted(buf, n, nfds, side, &m);
		}
		FUZZ_CHECK(!(ok[0] && ok[1]), "accepted from both sides");
	}
}

/* ---- the daemon --------------------------------------------------------------
 */

static struct sbd_client *client_by_id(struct run *h, uint32_t id)
{
	for (struct sbd_client *c = h->s.clients; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

/* Run the daemon's handlers until nothing is ready. */
static void pump(struct run *h)
{
	for (int k = 0; k < 64; k++) {
		int r = sbd_loop_once(h->s.loop, 0);

		FUZZ_CHECK(r >= 0, "sbd_loop_once: %s", strerror(-r));
		if (!r)
			return;
	}
}

static void slot_reset(struct slot *sl)
{
	sl->fd = -1;
	sl->id = 0;
	sl->next_seq = 0;
	sl->page = 0;
	sl->control = false;
	sl->hugetlb = false;
	sl->reclaim = 0;
	sl->heap_id = 0;
	sl->key = sl->pref = 0;
	memset(sl->req, 0, sizeof(sl->req));
	sl->nreq = 0;
	sl->lost = sl->dup = false;
}

/* The client's end closed; what it held is remembered for a restart. */
static void slot_close(struct run *h, struct slot *sl)
{
	struct sbd_client *c = client_by_id(h, sl->id);

	sl->held = c ? c->lease : 0;
	close(sl->fd);
	slot_reset(sl);
}

static bool slot_open(struct run *h, struct slot *sl)
{
	struct sbd_client *c;
	int sv[2];

	if (h->nconns == MAX_CONNS)
		return false;
	FUZZ_CHECK(socketpair(AF_UNIX,
			      SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC,
			      0, sv) == 0,
		   "socketpair: %s", strerror(errno));
	h->nconns++;
	c = sbd_server_adopt(&h->s, sv[1], (pid_t)(4200 + h->nconns),
			     sl->uid, (gid_t)sl->uid);
	FUZZ_CHECK(c && c->fd == sv[1] && c->id, "sbd_server_adopt failed");
	slot_reset(sl);
	sl->fd = sv[0];
	sl->id = c->id;
	return true;
}

static const struct req *find_req(struct slot *sl, uint32_t seq)
{
	for (unsigned k = 0; k < NREQ; k++) {
		/* Newest first. */
		struct req *r = &sl->req[(sl->nreq + NREQ - 1 - k) % NREQ];

		if (r->live && r->seq == seq)
			return r;
	}
	return NULL;
}

/* Remember a message sent with seq != 0: it may be answered. */
static void note_sent(struct run *h, struct slot *sl, const uint8_t *buf,
		      size_t n)
{
	struct sbd_msg m;
	struct req *r;

	if (n < sizeof(m))
		return;
	memcpy(&m, buf, sizeof(m));
	if (m.type == SBD_HELLO)
		h->hello_bytes = h->hello_bytes + m.b < h->hello_bytes
					 ? UINT64_MAX
					 : h->hello_bytes + m.b;
	if (!m.seq)
		return;
	if (find_req(sl, m.seq))
		sl->dup = true;
	r = &sl->req[sl->nreq++ % NREQ];
	if (r->live)
		sl->lost = true;
	*r = (struct req){true, m.type, m.seq, m.a, m.b, m.c, m.d};
}

/* Does reply m (descriptor fd) answer request r, and rightly? */
static bool answers(struct run *h, struct slot *sl, const struct req *r,
		    const struct sbd_msg *m, const uint8_t *payload, int fd)
{
	switch (r->type) {
	case SBD_HELLO:
		/* The cache's page size to clients of its kind (huge pages
		 * or not), 0 to the others. */
		return !m->err && fd < 0 && !m->len && m->a == sl->id &&
		       m->b == h->s.max_bytes &&
		       m->c == (!!(r->d & SBD_HELLO_HUGETLB) == h->s.hugetlb
					? h->s.page_size
					: 0) &&
		       m->d <= h->s.max_bytes && m->d <= r->b;
	case SBD_LEASE:
		if (fd >= 0 || m->len)
			return false;
		/* Refused only when it does not fit (docs/daemon.md). */
		if (m->err)
			return m->err == -ENOMEM &&
			       !(h->in_tick && r->a <= h->tick_room);
		return m->a >= r->a && m->a <= r->b && sl->page &&
		       m->a % sl->page == 0;
	case SBD_HEAP: {
		struct statfs sf;
		struct stat st;
		int seals;

		if (m->len)
			return false;
		if (m->err)
			return fd < 0;
		if (fd < 0)
			return false;
		seals = fcntl(fd, F_GET_SEALS);
		/* Of the client's kind: hugetlbfs for a client of huge
		 * pages, shmem for the others. */
		if (fstatfs(fd, &sf) < 0 ||
		    (sf.f_type == HUGETLBFS_MAGIC) != sl->hugetlb)
			return false;
		return m->a && m->a <= UINT32_MAX && fstat(fd, &st) == 0 &&
		       S_ISREG(st.st_mode) && (uint64_t)st.st_size == r->a &&
		       seals >= 0 &&
		       (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) ==
			       (F_SEAL_SHRINK | F_SEAL_GROW);
	}
	case SBD_CACHE_PUT:
		if (fd >= 0)
			return false;
		if (m->err)
			return !m->len && (m->err == -EEXIST ||
					   m->err == -ENOENT ||
					   m->err == -ENOSPC ||
					   m->err == -EBUSY ||
					   m->err == -ENOMEM);
		return m->a == r->d && m->len == r->d * 8;
	case SBD_CACHE_GET:
		if (fd >= 0)
			return false;
		if (m->err)
			return !m->len && (m->err == -ENOENT ||
					   m->err == -ENOMEM);
		return m->a && m->b && m->b <= SBD_CACHE_MAX_TOKENS &&
		       m->len == ((m->b * 4 + 7) & ~7ull) + m->a * 8;
	case SBD_CACHE_DONE:
		return fd < 0 && !m->len && (!m->err || m->err == -ENOENT);
	case SBD_CACHE_HEAP: {
		struct stat st;

		if (m->len)
			return false;
		if (m->err)
			return fd < 0 && m->err == -ENOENT;
		return fd >= 0 && fstat(fd, &st) == 0 &&
		       (uint64_t)st.st_size == m->a;
	}
	case SBD_FLOOR:
		/* Granted in full, or refused for a reason the protocol
		 * names. */
		if (fd >= 0 || m->len)
			return false;
		if (m->err)
			return m->err == -EPERM || m->err == -ENOSPC;
		return m->a == r->a && r->a <= h->s.max_floor;
	case SBD_CACHE_LIST:
		return !m->err && fd < 0 &&
		       m->len == m->a * sizeof(struct sbd_cache_entry);
	case SBD_STATUS: {
		struct sbd_status st;
		struct sbd_client_info ci;
		bool all = sl->uid == 0 || sl->uid == SELF_UID;

		if (m->err || fd >= 0 || m->len < sizeof(st))
			return false;
		memcpy(&st, payload, sizeof(st));
		/* Listed then: some may have gone since. */
		if (st.nclients > h->nconns ||
		    m->len != sizeof(st) + st.nclients * sizeof(ci) ||
		    st.max_bytes != h->s.max_bytes ||
		    st.page_size != h->s.page_size)
			return false;
		for (uint64_t k = 0; k < st.nclients; k++) {
			memcpy(&ci, payload + sizeof(st) + k * sizeof(ci),
			       sizeof(ci));
			if (!ci.id || ci.bytes % 4096 ||
			    (!all && ci.uid != sl->uid))
				return false;
		}
		return true;
	}
	}
	return false;	/* no reply to the others */
}

/* One message from the daemon to the client of slot sl. */
static void on_daemon_msg(struct run *h, struct slot *sl, size_t n, int fd)
{
	struct sbd_msg m;
	int r = sbd_msg_check(rbuf.b, n, fd >= 0, true, &m);

	FUZZ_CHECK(r == 0, "the daemon sent a bad message (%d): type %u",
		   r, rbuf.m.type);
	if (m.type == SBD_RECLAIM) {
		FUZZ_CHECK(!m.seq, "a RECLAIM with seq %u", m.seq);
		/* Only a client holding a lease is asked. */
		FUZZ_CHECK(!sl->control && (sl->page || sl->lost),
			   "a RECLAIM to client %u, %s", sl->id,
			   sl->control ? "a control connection"
				       : "before its HELLO");
		sl->reclaim = m.a;
		return;
	}
	/* SBD_REPLY: every request it matches was answered at most once. */
	for (unsigned k = 0; k < NREQ; k++) {
		struct req *q = &sl->req[k];

		if (q->live && q->seq == m.seq &&
		    answers(h, sl, q, &m, rbuf.b + sizeof(m), fd)) {
			q->live = false;
			if (q->type == SBD_HELLO) {
				sl->control = q->d & SBD_HELLO_CONTROL;
				sl->hugetlb = q->d & SBD_HELLO_HUGETLB;
				sl->page = sl->control ? 4096 : q->c;
			}
			if (q->type == SBD_HEAP && !m.err)
				sl->heap_id = m.a;
			if ((q->type == SBD_CACHE_PUT ||
			     q->type == SBD_CACHE_GET) && !m.err && m.len >= 8)
				memcpy(&sl->pref, rbuf.b + sizeof(m) + m.len - 8,
				       8);
			if (q->type == SBD_CACHE_PUT && !m.err)
				sl->key = q->a;
			return;
		}
	}
	FUZZ_CHECK(sl->lost || sl->dup,
		   "a reply (seq %u, err %lld, a %llu, fd %d, %u bytes%s) "
		   "that answers no request of client %u rightly",
		   m.seq, (long long)m.err, (unsigned long long)m.a, fd, m.len,
		   h->in_tick ? ", from sbd_budget_tick" : "", sl->id);
}

/* Read what the daemon sent the client of slot sl. */
static void drain(struct run *h, struct slot *sl)
{
	while (sl->fd >= 0) {
		int fd;
		long n = sbd_recv(sl->fd, rbuf.b, sizeof(rbuf.b), &fd);

		if (n == -EAGAIN)
			return;
		if (n == 0 || n == -ECONNRESET) {
			/* Dropped by the daemon. */
			FUZZ_CHECK(!client_by_id(h, sl->id),
				   "client %u hung up on and still served",
				   sl->id);
			slot_close(h, sl);
			return;
		}
		FUZZ_CHECK(n > 0, "receiving from the daemon: %s",
			   strerror((int)-n));
		on_daemon_msg(h, sl, (size_t)n, fd);
		if (fd >= 0)
			close(fd);
	}
}

static void drain_all(struct run *h)
{
	for (unsigned i = 0; i < h->nslots; i++)
		drain(h, &h->slot[i]);
}

static void check_state(struct run *h)
{
	uint64_t sum = 0, floors = 0, max = h->s.max_bytes;
	unsigned n = 0;

	for (struct sbd_client *c = h->s.clients; c; c = c->next, n++) {
		FUZZ_CHECK(c->lease % 4096 == 0,
			   "client %u holds %llu bytes, not whole pages",
			   c->id, (unsigned long long)c->lease);
		FUZZ_CHECK(!c->lease || (c->hello && !c->control),
			   "client %u (%s) holds %llu bytes", c->id,
			   c->hello ? "control" : "no HELLO",
			   (unsigned long long)c->lease);
		FUZZ_CHECK(!c->parked || (c->hello && !c->control &&
					  c->park_min <= c->park_want),
			   "client %u parked wrongly", c->id);
		FUZZ_CHECK(c->floor <= h->s.max_floor &&
				   (!c->floor || (c->hello && !c->control)),
			   "client %u (%s) has a floor of %llu bytes", c->id,
			   c->control ? "control" : "a client",
			   (unsigned long long)c->floor);
		sum += c->lease;
		floors += c->floor;
	}
	FUZZ_CHECK(floors == h->s.floors && floors <= max,
		   "floors %llu, counted %llu, budget %llu",
		   (unsigned long long)floors,
		   (unsigned long long)h->s.floors, (unsigned long long)max);
	FUZZ_CHECK(n == h->s.nclients, "%u clients listed, nclients %u", n,
		   h->s.nclients);
	FUZZ_CHECK(h->s.used == sum + h->s.cache_bytes,
		   "used %llu, the leases sum to %llu, the cache holds %llu",
		   (unsigned long long)h->s.used, (unsigned long long)sum,
		   (unsigned long long)h->s.cache_bytes);
	{
		const char *why = sbd_cache_check(&h->s);

		FUZZ_CHECK(!why, "the cache: %s", why ? why : "");
	}
	FUZZ_CHECK(h->s.used <= max ||
			   h->s.used - max <= h->hello_bytes,
		   "used %llu of %llu, HELLOs claimed %llu",
		   (unsigned long long)h->s.used, (unsigned long long)max,
		   (unsigned long long)h->hello_bytes);
}

/* After a step: the daemon runs, its messages are read, it ticks. */
static void settle(struct run *h)
{
	pump(h);
	drain_all(h);
	sbd_budget_tick(&h->s);
	h->in_tick = true;
	/* Less than any one client's room (every floor counted). */
	h->tick_room = sbd_budget_room(&h->s, NULL);
	drain_all(h);
	h->in_tick = false;
	check_state(h);
}

/* Send n bytes at buf with nfds descriptors on the client's end. */
static int send_fds(int sock, const void *buf, size_t n, unsigned nfds,
		    int fd)
{
	union {
		char buf[CMSG_SPACE(5 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {(void *)buf, n};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r;

	if (nfds) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		for (unsigned k = 0; k < nfds; k++)
			memcpy(CMSG_DATA(c) + k * sizeof(int), &fd,
			       sizeof(int));
	}
	do
		r = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : 0;
}

/* A message from the client of slot sl (if connected). */
static void deliver(struct run *h, struct slot *sl, const uint8_t *buf,
		    size_t n, unsigned nfds)
{
	int r;

	if (sl->fd < 0)
		return;
	note_sent(h, sl, buf, n);
	r = send_fds(sl->fd, buf, n, nfds, h->nullfd);
	if (r == -EAGAIN) {
		/* The daemon's queue is full: let it read. */
		pump(h);
		drain(h, sl);
		if (sl->fd < 0)
			return;
		r = send_fds(sl->fd, buf, n, nfds, h->nullfd);
	}
	if (r == -EPIPE || r == -ECONNRESET || r == -ECONNREFUSED) {
		/* Dropped, and not read yet. */
		drain(h, sl);
		if (sl->fd >= 0)
			slot_close(h, sl);
		return;
	}
	FUZZ_CHECK(r == 0 || r == -EAGAIN, "sending %zu bytes: %s", n,
		   strerror(-r));
}

static uint64_t field(const uint8_t *p)
{
	static const unsigned shift[4] = {0, 12, 20, 35};
	unsigned v = (unsigned)p[0] | (unsigned)p[1] << 8;

	return (uint64_t)(v & 0x3fff) << shift[v >> 14];
}

static void run_steps(struct run *h, const uint8_t *data, size_t size)
{
	static const unsigned nfds_of[4] = {0, 1, 2, 5};
	size_t at = 0;

	for (int step = 0; step < MAX_STEPS && at < size; step++) {
		unsigned ctl = data[at++];
		unsigned i = (ctl & 3) % h->nslots;
		unsigned nfds = nfds_of[(ctl >> 4 & 1) | (ctl >> 6 & 2)];
		struct slot *sl = &h->slot[i];
		bool defer = false;

		/* A message opens the connection, if it is not. */
		if ((ctl >> 2 & 3) < 2 && sl->fd < 0)
			slot_open(h, sl);	/* too many: sent nowhere */
		switch (ctl >> 2 & 3) {
		case 0: {
			struct sbd_msg m = {.magic = SBD_MAGIC};

			if (size - at < 10)
				return;
			m.type = data[at] % SBD_TYPE_END;
			m.nfds = (uint16_t)nfds;
			m.seq = data[at + 1] ? ++sl->next_seq : 0;
			m.a = field(data + at + 2);
			m.b = field(data + at + 4);
			m.c = field(data + at + 6);
			m.d = field(data + at + 8);
			at += 10;
			if (ctl & 0x40) {
				if (m.type == SBD_RETURN) {
					m.a = sl->reclaim;
					m.b = 1;
				} else if (m.type == SBD_HEAP_FREE) {
					m.a = sl->heap_id;
				} else if (m.type == SBD_HELLO) {
					m.b = sl->held;
				} else if (m.type == SBD_CACHE_PUT) {
					m.b = sl->key;	/* after the last */
				} else if (m.type == SBD_CACHE_DONE ||
					   m.type == SBD_CACHE_GET) {
					m.a = sl->key;
				} else if (m.type == SBD_CACHE_HEAP) {
					m.a = SBD_PREF_HEAP(sl->pref);
				}
			}
			{
				/* The cache's payloads: a token (d's low
				 * bits), npages 1-8; one reference to unpin;
				 * a model id. */
				uint8_t msg[sizeof(m) + 8];
				size_t len = 0;

				if (m.type == SBD_CACHE_PUT) {
					m.d = (m.d & 7) + 1;
					len = 4;
					memcpy(msg + sizeof(m), &m.a, 4);
				} else if (m.type == SBD_CACHE_UNPIN) {
					m.a = 1;
					len = 8;
					memcpy(msg + sizeof(m), &sl->pref, 8);
				} else if (m.type == SBD_CACHE_MODEL) {
					len = 5;
					memcpy(msg + sizeof(m), "qwen3", 5);
				}
				m.len = (uint32_t)len;
				memcpy(msg, &m, sizeof(m));
				deliver(h, sl, msg, sizeof(m) + len, nfds);
			}
			defer = ctl & 0x20;
			break;
		}
		case 1: {
			size_t n, len;

			if (size - at < 2)
				return;
			n = (size_t)data[at] | (size_t)data[at + 1] << 8;
			at += 2;
			len = n & 0x7fff;
			if (len > size - at)
				len = size - at;
			memcpy(sbuf, data + at, len);
			at += len;
			check_raw(sbuf, len);
			if (n & 0x8000) {
				size_t full = sizeof(struct sbd_msg) +
					      SBD_MAX_PAYLOAD + (n & 1);

				memset(sbuf + len, 0, full - len);
				len = full;
			}
			deliver(h, sl, sbuf, len, nfds);
			defer = ctl & 0x20;
			break;
		}
		case 2:
			if (ctl & 0x10)
				pump(h);
			if (sl->fd >= 0)
				slot_close(h, sl);
			break;
		case 3:
			if (at == size)
				return;
			sbd_fake_now_ms += ((uint64_t)data[at++] + 1) * 25;
			break;
		}
		if (!defer)
			settle(h);
	}
}

static void run_sequence(const uint8_t *data, size_t size)
{
	struct run *h;
	int fds;

	if (size < 3)
		return;
	fds = count_fds();
	h = calloc(1, sizeof(*h));
	FUZZ_CHECK(h, "no memory");
	sbd_fake_now_ms = CLOCK_START;
	h->s.loop = sbd_loop_new();
	FUZZ_CHECK(h->s.loop, "sbd_loop_new: %s", strerror(errno));
	h->s.listen_fd = -1;
	h->s.socket_path = "(fuzz)";
	h->s.max_bytes = ((uint64_t)data[0] + 16) << 16;
	h->s.page_size = (uint64_t)4096 << (data[1] >> 2 & 7);
	h->s.hugetlb = data[1] & 0x20;
	if (h->s.hugetlb)	/* as sparsebufd --hugetlb on x86-64 */
		h->s.page_size = (uint64_t)2 << 20;
	h->s.max_floor = h->s.max_bytes / 2;
	h->s.verbose = data[1] & 2;
	h->s.group = (gid_t)-1;
	h->s.self_uid = SELF_UID;
	h->s.start_ms = sbd_now_ms();
	h->nslots = data[1] & 1 ? 3 : 2;
	h->nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	FUZZ_CHECK(h->nullfd >= 0, "/dev/null: %s", strerror(errno));
	for (unsigned i = 0; i < MAX_SLOTS; i++) {
		static const uid_t uids[4] = {0, SELF_UID, 1001, 1002};

		slot_reset(&h->slot[i]);
		h->slot[i].uid = uids[data[2] >> (2 * i) & 3];
	}
	run_steps(h, data + 3, size - 3);
	settle(h);

	/* Every client goes: the daemon must give back every lease. */
	for (unsigned i = 0; i < h->nslots; i++)
		if (h->slot[i].fd >= 0)
			slot_close(h, &h->slot[i]);
	for (int k = 0; k < 1000 && h->s.nclients; k++)
		FUZZ_CHECK(sbd_loop_once(h->s.loop, 0) >= 0, "sbd_loop_once");
	FUZZ_CHECK(!h->s.nclients && !h->s.clients,
		   "%u clients still served, all hung up", h->s.nclients);
	/* What stays is the cache's blocks (they outlive their clients). */
	FUZZ_CHECK(h->s.used == h->s.cache_bytes,
		   "every client gone, %llu bytes still used, the cache "
		   "holds %llu", (unsigned long long)h->s.used,
		   (unsigned long long)h->s.cache_bytes);
	{
		const char *why = sbd_cache_check(&h->s);

		FUZZ_CHECK(!why, "the cache, every client gone: %s",
			   why ? why : "");
	}
	sbd_budget_tick(&h->s);
	sbd_server_close(&h->s);
	sbd_loop_free(h->s.loop);
	close(h->nullfd);
	free(h);
	sbd_fake_now_ms = 0;
	FUZZ_CHECK(count_fds() == fds, "%d descriptors open, %d before",
		   count_fds(), fds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_raw(data, size);
	run_sequence(data, size);
	return 0;
}
