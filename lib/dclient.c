/* SPDX-License-Identifier: MIT */
/*
 * A client pool's connection to sparsebufd: requests and their replies,
 * the daemon's own requests (RECLAIM), and reconnection.
 *
 * One reader thread per connection receives everything the daemon sends;
 * requests go one at a time (req_lock), each waiting for its reply on a
 * condition variable. When the daemon goes away the reader closes the
 * socket, fails the request in flight and tries to connect again (5 ms
 * after, then backing off to every 100 ms); a new daemon is told, in the HELLO, what the pool already holds,
 * and takes it into its accounting. Pages the pool holds stay valid
 * throughout: they are in memfds the pool has mapped, and its
 * userfaultfds are its own (docs/daemon.md, "Crashes").
 *
 * Nothing here knows about pools: what the connection needs from above
 * (bytes held, a reclaim request, a reconnection) goes through callbacks.
 */
#include "internal.h"
#include "dproto.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define RECONNECT_MS 100
/* Between HELLOs to a daemon that answers the connection but drops the
 * HELLO (one older than a flag we send, say) three times running: each
 * try costs it a line in its log. */
#define REFUSED_MS 2000
#define STASH_MAX 4
/* Requests whose wait timed out, remembered for their late replies: the
 * lease thread's LEASE and HEAP time out every 200 ms while the daemon
 * stalls (a spill in its loop), so seconds of them. */
#define STALE_MAX 32
/* Give-backs the socket had no room for, sent at the next flush. */
#define GIVEBACK_MAX 32

/*
 * A request nobody waits for any more. Its reply may still come, and
 * what it grants would stay the daemon's record of this client until
 * it disconnects: a lease counted against the machine's budget, a heap,
 * pinned cache pages, a block "being filled" (a client may fill 64 at
 * once). handle() gives each back.
 */
struct stale_req {
	uint32_t seq;		/* 0: a free slot */
	uint16_t type;
	uint64_t gen;		/* the connection it was sent on */
	uint64_t key;		/* CACHE_PUT: the block */
	uint64_t c, d;		/* LEASE: resident/used, for the RETURN */
};

struct dheap {
	int fd;
	uint32_t id;
	uint64_t gen;	/* the connection it came from */
};

struct sbi_dclient {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	size_t page_size;
	bool hugetlb;			/* heaps of huge pages (HELLO flag) */
	uint64_t floor;			/* asked for after every HELLO */
	int quit_fd;
	pthread_t reader;
	bool started;
	struct sbi_dclient_cbs cbs;

	pthread_mutex_t req_lock;	/* one request at a time */
	pthread_mutex_t lock;		/* all below */
	pthread_cond_t cond;		/* reply or connection changed */
	int sock;			/* -1: not connected */
	bool broken;			/* a send failed: the reader closes */
	uint64_t gen;			/* connections made so far */
	uint32_t id;			/* the daemon's name for us */
	uint64_t daemon_max;
	uint64_t daemon_page;		/* its page size (the cache's) */
	uint64_t accepted;		/* of what the HELLO claimed */
	uint64_t granted;		/* the floor this connection has */
	uint32_t next_seq, want_seq;
	bool have_reply;
	struct sbd_msg reply;
	char *reply_payload;		/* (SBD_MAX_PAYLOAD) */
	/* Pins on cache pages this process no longer maps, to be sent
	 * (sbi_dclient_cache_unpin is called under a pool's lock). */
	uint64_t *unpins;
	size_t nunpins, unpin_cap;
	struct stale_req stale[STALE_MAX];	/* free slots first, else
						 * the next in turn */
	unsigned stale_next;
	struct sbd_msg giveback[GIVEBACK_MAX];	/* queued, in order */
	size_t ngiveback;
	int reply_fd;
	struct dheap *heaps;
	size_t nheaps, heap_cap;
	/* Heap files fetched ahead (sbi_dclient_stash_heaps): a pool makes
	 * a heap under its lock, where no round trip may happen. */
	int stash[STASH_MAX];
	uint64_t stash_retry_ms;	/* lease thread only */
	uint64_t stash_bytes;
	int nstash;
};

static struct timespec deadline_ts(uint64_t deadline_ms)
{
	struct timespec ts = {(time_t)(deadline_ms / 1000),
			      (long)(deadline_ms % 1000) * 1000000};
	return ts;
}

static int sock_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (s < 0)
		return -errno;
	s = sbd_fd_above_std(s, false);
	if (s < 0)
		return s;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = -errno;

		close(s);
		return e;
	}
	return s;
}

/* Wait up to ms for s to be readable. 1, 0 (timeout) or -errno. */
static int wait_readable(int s, int ms)
{
	struct pollfd p = {s, POLLIN, 0};
	int r;

	do
		r = poll(&p, 1, ms);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : r;
}

/* Send *m on s, just connected (no reader yet), and wait up to 2 s for
 * its reply, into *m: 0, or -errno (the connection's, -EPROTO for a
 * reply that is not one). A RECLAIM that comes first (a new daemon over
 * its budget) is answered with nothing given, so that the daemon asks
 * others instead of waiting; held is what the pool holds. */
static int request_sync(int s, struct sbd_msg *m, uint64_t held)
{
	char buf[sizeof(struct sbd_msg) + 64];
	uint32_t seq = m->seq;
	int r = sbd_send(s, m, NULL, -1), fd;
	long n;

	while (r == 0) {
		r = wait_readable(s, 2000);
		if (r == 0)
			return -ETIMEDOUT;
		if (r < 0)
			return r;
		n = sbd_recv(s, buf, sizeof(buf), &fd);
		if (fd >= 0)
			close(fd);
		r = n < 0 ? (int)n : n == 0 ? -ECONNRESET : 0;
		if (r == 0)
			r = sbd_msg_check(buf, (size_t)n, fd >= 0, true, m);
		if (r == 0 && m->type == SBD_RECLAIM) {
			struct sbd_msg none = {
				.magic = SBD_MAGIC, .type = SBD_RETURN,
				.b = 1, .c = held, .d = held,
			};

			r = sbd_send(s, &none, NULL, -1);
			continue;
		}
		if (r == 0 && (m->type != SBD_REPLY || m->seq != seq))
			r = -EPROTO;
		if (r == 0)
			return 0;
	}
	return r;
}

/* Connect and say HELLO, with what the pool holds already (cbs.held,
 * asked once connected: a reconnection), then ask for the floor. The
 * socket, or -errno. Run before the reader starts, or by the reader
 * itself. */
static int hello(struct sbi_dclient *c)
{
	struct sbd_msg m = {
		.magic = SBD_MAGIC, .type = SBD_HELLO, .seq = 1,
		.a = SBD_VERSION, .c = c->page_size,
		.d = c->hugetlb ? SBD_HELLO_HUGETLB : 0,
	};
	struct sbd_msg fm = {
		.magic = SBD_MAGIC, .type = SBD_FLOOR, .seq = 2,
		.a = c->floor,
	};
	uint64_t held = 0, granted = c->floor;
	int s = sock_connect(c->path), r;

	if (s < 0)
		return s;
	if (c->cbs.held)
		held = c->cbs.held(c->cbs.arg) & ~(uint64_t)4095;
	m.b = held;
	r = request_sync(s, &m, held);
	if (r == 0)
		r = (int)m.err;
	if (c->hugetlb && !c->gen && (r == -ECONNRESET || r == -EPROTO)) {
		/* Dropped for a flag it does not know. */
		sbi_warn("sparsebufd at %s does not serve pools of huge pages "
			 "(older than this library?)", c->path);
		r = -EOPNOTSUPP;
	}
	if (r < 0)
		goto fail;
	if (c->floor) {
		r = request_sync(s, &fm, held);
		if (r == 0)
			r = (int)fm.err;
		if (!c->gen && (r == -ECONNRESET || r == -EPROTO)) {
			/* Dropped for a message it does not know. */
			sbi_warn("sparsebufd at %s does not grant floors "
				 "(older than this library?)", c->path);
			r = -EPROTO;
		}
		if ((r == -EPERM || r == -ENOSPC) && c->gen) {
			/* A new daemon that grants less: the pages held
			 * matter more than the reservation. */
			sbi_warn("sparsebufd at %s: the floor of %llu KiB "
				 "was refused after reconnecting (%s); going "
				 "on without one",
				 c->path, (unsigned long long)(c->floor >> 10),
				 strerror(-r));
			granted = 0;
			r = 0;
		}
		if (r < 0)
			goto fail;
	}
	pthread_mutex_lock(&c->lock);
	c->id = (uint32_t)m.a;
	c->daemon_max = m.b;
	c->daemon_page = m.c;
	c->accepted = m.d;
	c->granted = granted;
	/* Unpins and give-backs meant for the daemon before: this one
	 * never pinned or granted. */
	c->nunpins = 0;
	c->ngiveback = 0;
	pthread_mutex_unlock(&c->lock);
	return s;
fail:
	close(s);
	return r;
}

/* Is the connection up? c->lock held. */
static bool up(const struct sbi_dclient *c)
{
	return c->sock >= 0 && !c->broken;
}

/* A send failed: the connection is gone. Only the reader closes the
 * socket (it may be in poll() on it, which a close() from another thread
 * would not wake); shutdown() wakes it. c->lock held. */
static void broken_locked(struct sbi_dclient *c)
{
	if (up(c))
		shutdown(c->sock, SHUT_RDWR);
	c->broken = true;
	pthread_cond_broadcast(&c->cond);
}

/* The reader's part: close it. c->lock held. */
static void drop_locked(struct sbi_dclient *c)
{
	if (c->sock >= 0)
		close(c->sock);
	c->sock = -1;
	c->broken = false;
	pthread_cond_broadcast(&c->cond);
}

/* Pins to send back: n page references at refs (unaligned); c->lock
 * held. Sent now when the socket takes them, else at the next flush. */
static void queue_unpins_locked(struct sbi_dclient *c, const char *refs,
				uint64_t n);
static void flush_pending_locked(struct sbi_dclient *c);

/* Send the give-back r (no reply wanted, or one nobody waits for) after
 * any queued before it; c->lock held. A full socket (the daemon stalled:
 * when late replies come) queues it for the next flush: a closed
 * connection would make the daemon drop every pin of ours, the pages we
 * still map included. Past the queue, it is lost (the daemon keeps that
 * record until we disconnect, as before any give-back). */
static void giveback_locked(struct sbi_dclient *c, const struct sbd_msg *r)
{
	if (c->ngiveback < GIVEBACK_MAX)
		c->giveback[c->ngiveback++] = *r;
	flush_pending_locked(c);
}

/* A reply to LEASE seq has come: the daemon has answered or dropped
 * every earlier one (it keeps one LEASE a client, the newest), so their
 * slots are free. c->lock held. */
static void forget_older_leases_locked(struct sbi_dclient *c, uint32_t seq)
{
	for (size_t i = 0; i < STALE_MAX; i++)
		if (c->stale[i].seq && c->stale[i].type == SBD_LEASE &&
		    (int32_t)(seq - c->stale[i].seq) > 0)
			c->stale[i].seq = 0;
}

/* What the late reply m to st grants goes back; c->lock held,
 * connected. Granted: err 0, or a heap made whose descriptor did not
 * reach us (-EMFILE: sbi_dclient_heap frees that one too). */
static void undo_late_locked(struct sbi_dclient *c,
			     const struct stale_req *st,
			     const struct sbd_msg *m, const char *payload)
{
	struct sbd_msg r = {.magic = SBD_MAGIC};
	uint64_t tok_bytes;

	if (m->err && !(st->type == SBD_HEAP && m->err == -EMFILE))
		return;
	switch (st->type) {
	case SBD_LEASE:
		if (!m->a)
			return;
		r.type = SBD_RETURN, r.a = m->a, r.c = st->c, r.d = st->d;
		break;
	case SBD_HEAP:
		if (!m->a || m->a > UINT32_MAX)
			return;
		r.type = SBD_HEAP_FREE, r.a = m->a;
		break;
	case SBD_CACHE_PUT:
		/* The block is ours to fill: abandoned (with its pages'
		 * pins). Its reply, to a seq nobody waits for, is dropped. */
		if (m->a <= SBD_CACHE_MAX_PAGES && m->len == m->a * 8)
			queue_unpins_locked(c, payload, m->a);
		if (++c->next_seq == 0)
			c->next_seq = 1;
		r.type = SBD_CACHE_DONE, r.seq = c->next_seq, r.a = st->key;
		break;
	case SBD_CACHE_GET:
		/* tokens (int32, padded to 8 bytes), then the pinned refs */
		tok_bytes = (m->b * 4 + 7) & ~(uint64_t)7;
		if (m->a <= SBD_CACHE_MAX_PAGES &&
		    m->b <= SBD_CACHE_MAX_TOKENS &&
		    tok_bytes + m->a * 8 == m->len)
			queue_unpins_locked(c, payload + tok_bytes, m->a);
		flush_pending_locked(c);
		return;
	default:
		return;
	}
	giveback_locked(c, &r);
}

static void handle(struct sbi_dclient *c, const struct sbd_msg *m,
		   const char *payload, int fd)
{
	if (m->type == SBD_RECLAIM) {
		if (c->cbs.reclaim)
			c->cbs.reclaim(c->cbs.arg, m->a);
		if (fd >= 0)
			close(fd);
		return;
	}
	/* A reply. */
	pthread_mutex_lock(&c->lock);
	if (m->seq == c->want_seq && !c->have_reply) {
		c->reply = *m;
		memcpy(c->reply_payload, payload, m->len);
		c->reply_fd = fd;
		c->have_reply = true;
		pthread_cond_broadcast(&c->cond);
		fd = -1;
	} else if (m->seq) {
		for (size_t i = 0; i < STALE_MAX; i++) {
			struct stale_req *st = &c->stale[i];

			if (st->seq != m->seq)
				continue;
			st->seq = 0;
			if (st->type == SBD_LEASE)
				forget_older_leases_locked(c, m->seq);
			if (st->gen == c->gen && up(c))
				undo_late_locked(c, st, m, payload);
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (fd >= 0)
		close(fd);	/* a reply nobody waits for any more */
}

static void *reader(void *arg)
{
	struct sbi_dclient *c = arg;
	char *buf = malloc(sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD);
	bool warned = false, said_refused = false;
	int retry_ms = 5, refused = 0;

	sbi_thread_internal();
	if (!buf)
		return NULL;
	for (;;) {
		struct pollfd p[2] = {{c->quit_fd, POLLIN, 0}, {-1, POLLIN, 0}};
		struct sbd_msg m;
		bool lost_fd;
		int fd, r;
		long n;

		pthread_mutex_lock(&c->lock);
		p[1].fd = c->sock;
		pthread_mutex_unlock(&c->lock);
		r = poll(p, p[1].fd >= 0 ? 2 : 1, p[1].fd >= 0 ? -1 : retry_ms);
		if (r < 0 && errno != EINTR)
			break;
		if (p[0].revents)
			break;	/* stopping */
		if (p[1].fd < 0) {
			/* Not connected: try again, telling the new daemon
			 * what we hold. */
			int s = hello(c);

			if (s < 0) {
				/* 5 ms, doubling to 100: a daemon that
				 * restarts at once is found at once. */
				retry_ms = retry_ms * 2 > RECONNECT_MS
						   ? RECONNECT_MS
						   : retry_ms * 2;
				refused = s == -ECONNRESET || s == -EPROTO ||
						  s == -EBADMSG
					  ? refused + 1
					  : 0;
				if (refused >= 3) {
					if (!said_refused)
						sbi_warn("sparsebufd at %s "
							 "drops this client's "
							 "HELLO (%s; older "
							 "than this library?):"
							 " trying again every "
							 "%d s",
							 c->path, strerror(-s),
							 REFUSED_MS / 1000);
					said_refused = true;
					retry_ms = REFUSED_MS;
				}
				continue;
			}
			retry_ms = 5;
			refused = 0;
			said_refused = false;
			pthread_mutex_lock(&c->lock);
			c->sock = s;
			c->gen++;
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			sbi_info("sparsebufd at %s: connected again (client "
				 "%u)", c->path, c->id);
			warned = false;
			if (c->cbs.reconnected)
				c->cbs.reconnected(c->cbs.arg);
			continue;
		}
		if (!(p[1].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		n = sbd_recv(p[1].fd, buf, sizeof(struct sbd_msg) +
					       SBD_MAX_PAYLOAD, &fd);
		if (n == -EAGAIN || n == -EINTR)
			continue;
		lost_fd = fd == -EMFILE;
		if (lost_fd)
			fd = -1;
		r = n <= 0 ? -ECONNRESET
			   : sbd_msg_check(buf, (size_t)n, fd >= 0 || lost_fd,
					   true, &m);
		if (r == 0 && lost_fd) {
			/* A reply whose descriptor did not fit: its request
			 * fails with EMFILE; the connection is fine. */
			if (m.type != SBD_REPLY)
				continue;
			m.err = -EMFILE;
		}
		if (r < 0) {
			if (fd >= 0)
				close(fd);
			if (!warned)
				sbi_warn("sparsebufd at %s: connection lost "
					 "(%s); pages held stay valid, "
					 "reconnecting",
					 c->path, n <= 0 ? "closed"
							 : "bad message");
			warned = true;
			pthread_mutex_lock(&c->lock);
			if (c->sock == p[1].fd)
				drop_locked(c);
			pthread_mutex_unlock(&c->lock);
			if (c->cbs.lost)
				c->cbs.lost(c->cbs.arg);
			continue;
		}
		handle(c, &m, buf + sizeof(m), fd);
	}
	free(buf);
	return NULL;
}

struct sbi_dclient *sbi_dclient_open(const char *path, size_t page_size,
				     bool hugetlb, uint64_t floor, int *err)
{
	struct sbi_dclient *c;
	int s;

	if (!path || !*path ||
	    strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		*err = -EINVAL;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		*err = -ENOMEM;
		return NULL;
	}
	strcpy(c->path, path);
	c->page_size = page_size;
	c->hugetlb = hugetlb;
	c->floor = floor;
	c->sock = -1;
	c->reply_fd = -1;
	c->reply_payload = malloc(SBD_MAX_PAYLOAD);
	if (!c->reply_payload) {
		free(c);
		*err = -ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&c->req_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	SBI_LK_RANK(&c->req_lock, SBI_RANK_POOL, 0);
	SBI_LK_RANK(&c->lock, SBI_RANK_LEAF, 0);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&c->cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	c->quit_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s = c->quit_fd < 0 ? -errno : hello(c);
	if (s < 0) {
		*err = s;
		sbi_dclient_close(c);
		return NULL;
	}
	c->sock = s;
	c->gen = 1;
	return c;
}

int sbi_dclient_start(struct sbi_dclient *c, const struct sbi_dclient_cbs *cbs)
{
	int r;

	c->cbs = *cbs;
	r = sbi_thread_start(&c->reader, reader, c, "sb-daemon", -1);
	if (r == 0)
		c->started = true;
	return r;
}

void sbi_dclient_close(struct sbi_dclient *c)
{
	if (!c)
		return;
	if (c->started) {
		uint64_t one = 1;

		if (write(c->quit_fd, &one, sizeof(one)) < 0)
			sbi_warn("sparsebufd client: cannot stop the reader");
		pthread_join(c->reader, NULL);
	}
	if (c->quit_fd >= 0)
		close(c->quit_fd);
	if (c->sock >= 0)
		close(c->sock);
	if (c->reply_fd >= 0)
		close(c->reply_fd);
	while (c->nstash)
		close(c->stash[--c->nstash]);
	free(c->heaps);
	free(c->reply_payload);
	free(c->unpins);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->req_lock);
	free(c);
}

void sbi_dclient_fork_child(struct sbi_dclient *c)
{
	/* The child has no reader thread and must not talk on its parent's
	 * connection: only the descriptors go (no lock: another thread of
	 * the parent may have held one). */
	if (c->sock >= 0)
		close(c->sock);
	close(c->quit_fd);
	for (int i = 0; i < c->nstash; i++)
		close(c->stash[i]);
}

bool sbi_dclient_connected(struct sbi_dclient *c)
{
	bool is_up;

	pthread_mutex_lock(&c->lock);
	is_up = up(c);
	pthread_mutex_unlock(&c->lock);
	return is_up;
}

const char *sbi_dclient_path(const struct sbi_dclient *c)
{
	return c->path;
}

/*
 * Send req and wait for its reply until deadline_ms, through daemon
 * restarts. Returns 0 with *rep (and *fd, the caller's) filled, or -errno:
 * -ENOTCONN when no daemon answered in time.
 */
static void remember_stale_locked(struct sbi_dclient *c,
				  const struct sbd_msg *req, uint64_t gen)
{
	struct stale_req *st;

	if (req->type != SBD_LEASE && req->type != SBD_HEAP &&
	    req->type != SBD_CACHE_PUT && req->type != SBD_CACHE_GET)
		return;	/* nothing the daemon keeps for us */
	st = NULL;
	for (size_t i = 0; i < STALE_MAX && !st; i++)
		if (!c->stale[i].seq)
			st = &c->stale[i];
	if (!st)	/* all waiting: the next in turn goes */
		st = &c->stale[c->stale_next++ % STALE_MAX];
	*st = (struct stale_req){.seq = req->seq, .type = req->type,
				 .gen = gen, .key = req->a, .c = req->c,
				 .d = req->d};
}

static int request_p(struct sbi_dclient *c, struct sbd_msg *req,
		     const void *payload, uint64_t deadline_ms,
		     struct sbd_msg *rep, int *fd, uint64_t *gen_out,
		     void *rpay, size_t rcap)
{
	struct timespec dl = deadline_ts(deadline_ms);
	int r = 0;

	pthread_mutex_lock(&c->req_lock);
	pthread_mutex_lock(&c->lock);
	for (;;) {
		uint64_t gen;

		while (!up(c) && r != ETIMEDOUT)
			r = pthread_cond_timedwait(&c->cond, &c->lock, &dl);
		if (!up(c)) {
			r = -ENOTCONN;
			break;
		}
		req->magic = SBD_MAGIC;
		if (++c->next_seq == 0)
			c->next_seq = 1;
		req->seq = c->want_seq = c->next_seq;
		c->have_reply = false;
		gen = c->gen;
		r = sbd_send(c->sock, req, payload, -1);
		if (r < 0) {
			broken_locked(c);	/* the reader reconnects */
			r = 0;
			continue;
		}
		while (!c->have_reply && c->gen == gen && up(c) &&
		       r != ETIMEDOUT)
			r = pthread_cond_timedwait(&c->cond, &c->lock, &dl);
		if (c->have_reply) {
			if (req->type == SBD_LEASE)
				forget_older_leases_locked(c, req->seq);
			*rep = c->reply;
			if (rpay)
				memcpy(rpay, c->reply_payload,
				       rep->len < rcap ? rep->len : rcap);
			*fd = c->reply_fd;
			c->reply_fd = -1;
			c->have_reply = false;
			c->want_seq = 0;
			if (gen_out)
				*gen_out = gen;
			r = 0;
			break;
		}
		c->want_seq = 0;
		if (r == ETIMEDOUT) {
			/* What a late reply grants would be the daemon's
			 * record of us and never used: the reader gives it
			 * back when it comes (handle()). */
			if (up(c) && c->gen == gen)
				remember_stale_locked(c, req, gen);
			r = !up(c) ? -ENOTCONN : -ETIMEDOUT;
			break;
		}
		r = 0;	/* the connection changed: ask the new daemon */
	}
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&c->req_lock);
	return r;
}

static int request(struct sbi_dclient *c, struct sbd_msg *req,
		   uint64_t deadline_ms, struct sbd_msg *rep, int *fd,
		   uint64_t *gen_out)
{
	return request_p(c, req, NULL, deadline_ms, rep, fd, gen_out, NULL,
			 0);
}

int sbi_dclient_lease(struct sbi_dclient *c, uint64_t min, uint64_t want,
		      uint64_t resident, uint64_t used, int wait_ms,
		      uint64_t *granted)
{
	struct sbd_msg m = {.type = SBD_LEASE, .a = min, .b = want,
			    .c = resident, .d = used}, rep;
	int fd = -1, r;

	*granted = 0;
	r = request(c, &m, sbi_mono_ms() + (uint64_t)wait_ms, &rep, &fd, NULL);
	if (fd >= 0)
		close(fd);
	if (r < 0)
		return r;
	if (rep.err < 0)
		return (int)rep.err;
	if (rep.a < min || rep.a > want || (rep.a & 4095))
		return -EPROTO;
	*granted = rep.a;
	return 0;
}

void sbi_dclient_tell(struct sbi_dclient *c, unsigned type, uint64_t a,
		      uint64_t b, uint64_t resident, uint64_t used)
{
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = (uint16_t)type,
			    .a = a, .b = b, .c = resident, .d = used};

	pthread_mutex_lock(&c->lock);
	/* Lost when there is no daemon: a new one learns what we hold from
	 * the HELLO. Never waits (callers may hold a pool's lock): a daemon
	 * that stopped reading misses it, and counts more than we hold. */
	if (up(c)) {
		int r = sbd_send_nowait(c->sock, &m);

		if (r < 0 && r != -EAGAIN)
			broken_locked(c);
	}
	pthread_mutex_unlock(&c->lock);
}

#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif

/* Is fd a memfd of `bytes`, sealed against resizing, and of the kind of
 * heap this client asked for (hugetlbfs or not)? A shmem file mapped as a
 * huge-page heap would be zeroed with fallocate, which leaves its data,
 * and a hugetlbfs one as shmem would refuse every write(2). */
static bool heap_fd_ok(const struct sbi_dclient *c, int fd, uint64_t bytes)
{
	struct statfs sf;
	struct stat st;
	int seals = fcntl(fd, F_GET_SEALS);

	if (fstatfs(fd, &sf) < 0 ||
	    (sf.f_type == HUGETLBFS_MAGIC) != c->hugetlb ||
	    (c->hugetlb && (sf.f_bsize <= 0 || c->page_size % sf.f_bsize)))
		return false;	/* (or of huge pages larger than ours) */
	return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
	       (uint64_t)st.st_size == bytes && seals >= 0 &&
	       (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) ==
		       (F_SEAL_SHRINK | F_SEAL_GROW) &&
	       !(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
}

int sbi_dclient_heap(struct sbi_dclient *c, uint64_t bytes, int wait_ms)
{
	struct sbd_msg m = {.type = SBD_HEAP, .a = bytes}, rep;
	uint64_t gen = 0;
	int fd = -1, r;
	bool ok, id_ok;

	r = request(c, &m, sbi_mono_ms() + (uint64_t)wait_ms, &rep, &fd, &gen);
	if (r < 0)
		return r;
	id_ok = rep.a && rep.a <= UINT32_MAX;
	ok = !rep.err && id_ok && fd >= 0 && heap_fd_ok(c, fd, bytes);
	if (id_ok && !ok && (!rep.err || rep.err == -EMFILE)) {
		/* Made, but its file did not reach us (the reader marks a
		 * reply whose descriptor this process had no room for), or
		 * is not one we can use (not of our kind): the daemon's
		 * record of it goes, or every try would leave one. */
		struct sbd_msg f = {.magic = SBD_MAGIC, .type = SBD_HEAP_FREE,
				    .a = rep.a};

		pthread_mutex_lock(&c->lock);
		if (gen == c->gen && up(c)) {
			r = sbd_send_nowait(c->sock, &f);
			if (r < 0 && r != -EAGAIN)
				broken_locked(c);
		}
		pthread_mutex_unlock(&c->lock);
	}
	if (!ok) {
		if (fd >= 0)
			close(fd);
		return rep.err < 0 ? (int)rep.err : -EPROTO;
	}
	pthread_mutex_lock(&c->lock);
	if (c->nheaps == c->heap_cap) {
		size_t cap = c->heap_cap ? 2 * c->heap_cap : 16;
		struct dheap *h = realloc(c->heaps, cap * sizeof(*h));

		if (!h) {
			pthread_mutex_unlock(&c->lock);
			close(fd);
			return -ENOMEM;
		}
		c->heaps = h;
		c->heap_cap = cap;
	}
	c->heaps[c->nheaps++] = (struct dheap){fd, (uint32_t)rep.a, gen};
	pthread_mutex_unlock(&c->lock);
	return fd;
}

void sbi_dclient_heap_free(struct sbi_dclient *c, int fd)
{
	uint32_t id = 0;
	uint64_t gen = 0;

	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < c->nheaps; i++)
		if (c->heaps[i].fd == fd) {
			id = c->heaps[i].id;
			gen = c->heaps[i].gen;
			c->heaps[i] = c->heaps[--c->nheaps];
			break;
		}
	/* A heap from an earlier daemon is not this one's to free. */
	if (id && gen == c->gen && up(c)) {
		struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_HEAP_FREE,
				    .a = id};

		int r = sbd_send_nowait(c->sock, &m);

		if (r < 0 && r != -EAGAIN)
			broken_locked(c);
	}
	pthread_mutex_unlock(&c->lock);
}

int sbi_dclient_take_heap(struct sbi_dclient *c, uint64_t bytes)
{
	int fd = -EAGAIN;

	pthread_mutex_lock(&c->lock);
	if (c->nstash && c->stash_bytes == bytes)
		fd = c->stash[--c->nstash];
	pthread_mutex_unlock(&c->lock);
	return fd;
}

void sbi_dclient_stash_heaps(struct sbi_dclient *c, uint64_t bytes, int want)
{
	if (want > STASH_MAX)
		want = STASH_MAX;
	for (;;) {
		int n, fd;

		pthread_mutex_lock(&c->lock);
		n = c->stash_bytes == bytes ? c->nstash : 0;
		pthread_mutex_unlock(&c->lock);
		if (n >= want || sbi_mono_ms() < c->stash_retry_ms)
			return;
		fd = sbi_dclient_heap(c, bytes, 200);
		/* Not every 5 ms while we are full, or while the daemon
		 * cannot make what we ask (hugetlbfs): the pool makes its
		 * heaps meanwhile. */
		if (fd < 0 && fd != -ETIMEDOUT && fd != -ENOTCONN)
			c->stash_retry_ms = sbi_mono_ms() + 1000;
		if (fd < 0)
			return;
		pthread_mutex_lock(&c->lock);
		if (c->stash_bytes != bytes) {
			while (c->nstash)
				close(c->stash[--c->nstash]);
			c->stash_bytes = bytes;
		}
		if (c->nstash < STASH_MAX) {
			c->stash[c->nstash++] = fd;
			fd = -1;
		}
		pthread_mutex_unlock(&c->lock);
		if (fd >= 0)
			sbi_dclient_heap_free(c, fd);	/* (cannot happen) */
	}
}

/* ---- the machine-wide prefix cache (daemon/cache.c) ------------------------ */

#define CACHE_WAIT_MS 2000

/* A field of c, read under its lock (the reader thread writes it). */
static uint64_t locked(struct sbi_dclient *c, const uint64_t *field)
{
	uint64_t v;

	pthread_mutex_lock(&c->lock);
	v = *field;
	pthread_mutex_unlock(&c->lock);
	return v;
}

uint64_t sbi_dclient_max(struct sbi_dclient *c)
{
	return locked(c, &c->daemon_max);
}

uint64_t sbi_dclient_floor(struct sbi_dclient *c)
{
	return locked(c, &c->granted);
}

uint64_t sbi_dclient_accepted(struct sbi_dclient *c)
{
	return locked(c, &c->accepted);
}

uint64_t sbi_dclient_gen(struct sbi_dclient *c)
{
	return locked(c, &c->gen);
}

size_t sbi_dclient_cache_page(struct sbi_dclient *c)
{
	size_t p;

	pthread_mutex_lock(&c->lock);
	p = up(c) ? (size_t)c->daemon_page : 0;
	pthread_mutex_unlock(&c->lock);
	return p;
}

/* A reply's page references: n of them, none naming heap 0. */
static bool refs_ok(const uint64_t *refs, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (!SBD_PREF_HEAP(refs[i]))
			return false;
	return true;
}

int sbi_dclient_cache_put(struct sbi_dclient *c, uint64_t key, uint64_t pkey,
			  uint32_t depth, const int32_t *tokens, uint32_t ntok,
			  uint32_t npages, uint64_t *refs, uint64_t *gen)
{
	struct sbd_msg m = {.type = SBD_CACHE_PUT, .a = key, .b = pkey,
			    .c = depth, .d = npages,
			    .len = ntok * (uint32_t)sizeof(*tokens)}, rep;
	int fd = -1, r;

	if (!ntok || ntok > SBD_CACHE_MAX_TOKENS || !npages ||
	    npages > SBD_CACHE_MAX_PAGES || depth >= SBD_CACHE_MAX_DEPTH)
		return -E2BIG;
	r = request_p(c, &m, tokens, sbi_mono_ms() + CACHE_WAIT_MS, &rep, &fd,
		      gen, refs, (size_t)npages * sizeof(*refs));
	if (fd >= 0)
		close(fd);
	if (r < 0)
		return r;
	if (rep.err < 0)
		return (int)rep.err;
	if (rep.a != npages || rep.len != npages * sizeof(*refs) ||
	    !refs_ok(refs, npages))
		return -EPROTO;
	return 0;
}

int sbi_dclient_cache_done(struct sbi_dclient *c, uint64_t key, bool ok,
			   uint64_t gen)
{
	struct sbd_msg m = {.type = SBD_CACHE_DONE, .a = key, .b = ok}, rep;
	uint64_t g = 0;
	int fd = -1, r;

	r = request(c, &m, sbi_mono_ms() + CACHE_WAIT_MS, &rep, &fd, &g);
	if (fd >= 0)
		close(fd);
	if (r == 0 && g != gen)
		r = -ESTALE;	/* a new daemon never saw the put */
	return r < 0 ? r : (int)rep.err;
}

int sbi_dclient_cache_get(struct sbi_dclient *c, uint64_t key, uint64_t pkey,
			  uint32_t depth, int32_t *tokens, uint32_t ntok,
			  uint64_t *refs, uint32_t npages, uint64_t *gen)
{
	struct sbd_msg m = {.type = SBD_CACHE_GET, .a = key, .b = pkey,
			    .c = depth}, rep;
	size_t tok_bytes = ((size_t)ntok * 4 + 7) & ~(size_t)7;
	char *buf = malloc(SBD_MAX_PAYLOAD);
	int fd = -1, r;

	if (!buf)
		return -ENOMEM;
	bool replied;

	r = request_p(c, &m, NULL, sbi_mono_ms() + CACHE_WAIT_MS, &rep, &fd,
		      gen, buf, SBD_MAX_PAYLOAD);
	replied = r == 0;
	if (fd >= 0)
		close(fd);
	if (r == 0 && rep.err < 0)
		r = (int)rep.err;
	/* Another geometry under the same key (a hash collision, or a
	 * client that lied): not a match. */
	if (r == 0 && (rep.a != npages || rep.b != ntok ||
		       rep.len != tok_bytes + (size_t)npages * 8))
		r = -ENOENT;
	if (r == 0) {
		memcpy(tokens, buf, (size_t)ntok * 4);
		memcpy(refs, buf + tok_bytes, (size_t)npages * 8);
		if (!refs_ok(refs, npages))
			r = -EPROTO;
	}
	if (r < 0 && replied && rep.err == 0) {
		/* The daemon pinned what it sent: the pins go back. */
		size_t tb = ((size_t)rep.b * 4 + 7) & ~(size_t)7;

		for (uint64_t i = 0; rep.b <= SBD_CACHE_MAX_TOKENS &&
				     i < rep.a && tb + 8 * (i + 1) <= rep.len;
		     i++) {
			uint64_t ref;

			memcpy(&ref, buf + tb + 8 * i, 8);
			sbi_dclient_cache_unpin(c, *gen, ref, 1);
		}
	}
	free(buf);
	return r;
}

int sbi_dclient_cache_heap(struct sbi_dclient *c, uint32_t id, uint64_t gen,
			   uint64_t *bytes)
{
	struct sbd_msg m = {.type = SBD_CACHE_HEAP, .a = id}, rep;
	uint64_t g = 0;
	int fd = -1, r;

	r = request(c, &m, sbi_mono_ms() + CACHE_WAIT_MS, &rep, &fd, &g);
	if (r == 0 && g != gen)
		r = -ESTALE;	/* another daemon: its id names another heap */
	if (r == 0 && rep.err < 0)
		r = (int)rep.err;
	if (r == 0 && (fd < 0 || !rep.a || rep.a > SBD_MAX_BYTES ||
		       !heap_fd_ok(c, fd, rep.a)))
		r = -EPROTO;
	if (r < 0) {
		if (fd >= 0)
			close(fd);
		return r;
	}
	*bytes = rep.a;
	return fd;
}

/* Send what is queued (give-backs, in order, then unpins), without
 * waiting; c->lock held. */
static void flush_pending_locked(struct sbi_dclient *c)
{
	size_t max = SBD_MAX_PAYLOAD / sizeof(uint64_t), sent = 0;

	while (sent < c->ngiveback && up(c)) {
		int r = sbd_send_nowait(c->sock, &c->giveback[sent]);

		if (r == -EAGAIN)
			break;
		if (r < 0) {
			broken_locked(c);
			return;
		}
		sent++;
	}
	memmove(c->giveback, c->giveback + sent,
		(c->ngiveback - sent) * sizeof(c->giveback[0]));
	c->ngiveback -= sent;
	if (c->ngiveback)
		return;	/* unpins after: none overtakes a DONE */

	while (c->nunpins && up(c)) {
		size_t n = c->nunpins < max ? c->nunpins : max;
		struct sbd_msg m = {.magic = SBD_MAGIC,
				    .type = SBD_CACHE_UNPIN, .a = n,
				    .len = (uint32_t)(n * sizeof(uint64_t))};
		int r = sbd_send_nowait_payload(c->sock, &m,
						c->unpins + c->nunpins - n);

		if (r == -EAGAIN)
			return;	/* the next flush */
		if (r < 0) {
			broken_locked(c);
			return;
		}
		c->nunpins -= n;
	}
}

static bool queue_unpin_locked(struct sbi_dclient *c, uint64_t ref)
{
	if (c->nunpins == c->unpin_cap) {
		size_t cap = c->unpin_cap ? 2 * c->unpin_cap : 256;
		uint64_t *v = realloc(c->unpins, cap * sizeof(*v));

		if (!v)
			return false;
		c->unpins = v;
		c->unpin_cap = cap;
	}
	c->unpins[c->nunpins++] = ref;
	return true;
}

static void queue_unpins_locked(struct sbi_dclient *c, const char *refs,
				uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		uint64_t ref;

		memcpy(&ref, refs + 8 * i, 8);
		if (SBD_PREF_HEAP(ref) && !queue_unpin_locked(c, ref))
			return;
	}
}

void sbi_dclient_cache_unpin(struct sbi_dclient *c, uint64_t gen,
			     uint64_t ref, uint32_t count)
{
	pthread_mutex_lock(&c->lock);
	/* Pins of an earlier daemon went with it. */
	if (gen == c->gen && up(c)) {
		while (count--)
			if (!queue_unpin_locked(c, ref))
				break;	/* held until we exit */
		if (c->nunpins >= 1024)
			flush_pending_locked(c);
	}
	pthread_mutex_unlock(&c->lock);
}

void sbi_dclient_cache_flush(struct sbi_dclient *c)
{
	pthread_mutex_lock(&c->lock);
	flush_pending_locked(c);
	pthread_mutex_unlock(&c->lock);
}

void sbi_dclient_cache_model(struct sbi_dclient *c, uint64_t root,
			     const char *name)
{
	size_t len = strlen(name);
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_CACHE_MODEL,
			    .a = root};

	if (len > SBD_CACHE_MODEL_MAX - 1)
		len = SBD_CACHE_MODEL_MAX - 1;
	if (!len)
		return;
	m.len = (uint32_t)len;
	pthread_mutex_lock(&c->lock);
	if (up(c)) {
		int r = sbd_send_nowait_payload(c->sock, &m, name);

		if (r < 0 && r != -EAGAIN)
			broken_locked(c);	/* (-EAGAIN: unnamed) */
	}
	pthread_mutex_unlock(&c->lock);
}
