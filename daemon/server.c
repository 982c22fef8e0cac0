/* SPDX-License-Identifier: MIT */
/*
 * sparsebufd's clients: the listening socket, connections, and every
 * message they send, checked (lib/dproto.c) before it is believed. A
 * client that sends anything malformed, or something its state does not
 * allow (a RETURN of more than it holds, a heap that is not its own), is
 * dropped; the others keep being served.
 */
#include "server.h"
#include "dproto.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#define MAX_CLIENTS 4096
#define MAX_HEAPS 65536			/* per client */
#define MAX_HEAP_BYTES ((uint64_t)1 << 40)

bool sbd_use_syslog;
FILE *sbd_log_file;

void sbd_log(const char *fmt, ...)
{
	FILE *f = sbd_log_file ? sbd_log_file : stderr;
	va_list ap;

	va_start(ap, fmt);
	if (sbd_use_syslog) {
		vsyslog(LOG_INFO, fmt, ap);
	} else {
		fputs("sparsebufd: ", f);
		vfprintf(f, fmt, ap);
		fputc('\n', f);
	}
	va_end(ap);
}

int sbd_reply(struct sbd_server *s, struct sbd_client *c, uint32_t seq,
	      int64_t err, uint64_t a, uint64_t b, uint64_t cc, int fd)
{
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_REPLY,
			    .nfds = fd >= 0, .seq = seq, .err = err,
			    .a = a, .b = b, .c = cc};

	(void)s;
	return sbd_send(c->fd, &m, NULL, fd);
}

void sbd_send_reclaim(struct sbd_server *s, struct sbd_client *c,
		      uint64_t bytes)
{
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_RECLAIM,
			    .a = bytes};

	if (sbd_send(c->fd, &m, NULL, -1) < 0) {
		/* It is going away (its hang-up comes next), or not
		 * reading: not asked again for a while, as one that had
		 * nothing (else budget.c's reclaim picks it again and
		 * again, need / its lease times). */
		c->dry_ms = sbd_now_ms();
		return;
	}
	/* Asked again before it answered (its eviction took more than
	 * budget.c's RECLAIM_RETRY_MS): what it returned since the first
	 * ask still counts. The answer that comes next may be the first
	 * ask's, its pages in the RETURNs before it; counted from zero
	 * here, that answer read as "gave nothing" and the client was not
	 * asked for DRY_MS, everyone refused while it had pages. */
	if (!c->reclaim_asked)
		c->reclaim_got = 0;
	c->reclaim_asked = bytes;
	c->reclaim_ms = sbd_now_ms();
	s->reclaims++;
	if (s->verbose)
		sbd_log("client %u (pid %d): reclaim %llu KiB", c->id,
			(int)c->pid, (unsigned long long)(bytes >> 10));
}

static void drop(struct sbd_server *s, struct sbd_client *c, const char *why)
{
	struct sbd_client **pp;

	if (why || s->verbose)
		sbd_log("client %u (pid %d, uid %u): %s; %llu KiB back to the "
			"budget", c->id, (int)c->pid, (unsigned)c->uid,
			why ? why : "gone",
			(unsigned long long)(c->lease >> 10));
	sbd_budget_drop(s, c);
	sbd_cache_drop_client(s, c);
	sbd_loop_del(s->loop, c->fd);
	close(c->fd);
	for (pp = &s->clients; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	s->nclients--;
	free(c->heaps);
	free(c);
}

/* Other users' clients are listed to root and the daemon's user only. */
static bool may_see(const struct sbd_server *s, const struct sbd_client *who,
		    const struct sbd_client *c)
{
	return who->uid == 0 || who->uid == s->self_uid || who->uid == c->uid;
}

static void status(struct sbd_server *s, struct sbd_client *who, uint32_t seq)
{
	static char buf[SBD_MAX_PAYLOAD];
	struct sbd_status *st = (struct sbd_status *)buf;
	struct sbd_client_info *ci = (struct sbd_client_info *)(st + 1);
	struct sbd_msg m = {.magic = SBD_MAGIC, .type = SBD_REPLY, .seq = seq};
	uint64_t now = sbd_now_ms();
	size_t n = 0;

	memset(st, 0, sizeof(*st));
	st->max_bytes = s->max_bytes;
	st->bytes_used = s->used;
	st->page_size = s->page_size;
	st->uptime_ms = now - s->start_ms;
	st->reclaims = s->reclaims;
	st->refused = s->refused;
	st->clients_total = s->clients_total;
	st->bytes_shared = s->cache_bytes;
	st->bytes_spilled = s->cache_spilled;	/* + the clients', below */
	st->cache_blocks = sbd_cache_blocks(s);
	st->cache_hits = s->cache_hits;
	st->cache_misses = s->cache_misses;
	st->floors = s->floors;
	st->max_floor = s->max_floor;
	st->flags = s->hugetlb ? SBD_STATUS_HUGETLB : 0;
	for (struct sbd_client *c = s->clients; c; c = c->next) {
		if (c->control)
			continue;
		st->bytes_resident += c->resident;
		st->bytes_spilled += c->spilled;
		if (!may_see(s, who, c) || n == SBD_MAX_CLIENTS_LISTED)
			continue;
		ci[n++] = (struct sbd_client_info){
			.pid = (int32_t)c->pid, .uid = (uint32_t)c->uid,
			.id = c->id, .page_size = (uint32_t)c->page_size,
			.bytes = c->lease, .resident = c->resident,
			.used = c->used, .spilled = c->spilled,
			.idle_ms = now - c->active_ms, .floor = c->floor,
			.flags = c->hugetlb ? SBD_CLIENT_HUGETLB : 0,
		};
	}
	st->nclients = n;
	m.len = (uint32_t)(sizeof(*st) + n * sizeof(*ci));
	sbd_send(who->fd, &m, buf, -1);
}

/* A HEAP request: a new memfd, the client's. */
static void heap(struct sbd_server *s, struct sbd_client *c, uint32_t seq,
		 uint64_t bytes)
{
	int fd;

	if (bytes > MAX_HEAP_BYTES || c->nheaps >= MAX_HEAPS) {
		sbd_reply(s, c, seq, -E2BIG, 0, 0, 0, -1);
		return;
	}
	if (c->nheaps == c->heap_cap) {
		size_t cap = c->heap_cap ? 2 * c->heap_cap : 16;
		struct sbd_heap *h = realloc(c->heaps, cap * sizeof(*h));

		if (!h) {
			sbd_reply(s, c, seq, -ENOMEM, 0, 0, 0, -1);
			return;
		}
		c->heaps = h;
		c->heap_cap = cap;
	}
	/* A huge-page client's heaps are hugetlbfs files (the client checks
	 * the kind: dclient.c); a size that is not whole huge pages, or no
	 * hugetlbfs here, is an error it falls back from. */
	fd = sbd_heap_file("sparsebufd-heap", bytes, c->hugetlb);
	if (fd < 0) {
		sbd_reply(s, c, seq, fd, 0, 0, 0, -1);
		return;
	}
	if (++s->next_heap_id == 0)
		s->next_heap_id = 1;
	c->heaps[c->nheaps++] = (struct sbd_heap){s->next_heap_id, bytes};
	sbd_reply(s, c, seq, 0, s->next_heap_id, 0, 0, fd);
	/* The client holds it now. (A later step keeps the daemon's copy,
	 * for pages shared across processes.) */
	close(fd);
}

static bool heap_free(struct sbd_client *c, uint64_t id)
{
	for (size_t i = 0; i < c->nheaps; i++)
		if (c->heaps[i].id == id) {
			c->heaps[i] = c->heaps[--c->nheaps];
			return true;
		}
	return false;
}

static void note_usage(struct sbd_client *c, const struct sbd_msg *m)
{
	if (m->d > c->used)
		c->active_ms = sbd_now_ms();
	c->resident = m->c;
	c->used = m->d;
}

/* One message from c; false: drop c (why set). */
static bool serve(struct sbd_server *s, struct sbd_client *c,
		  const struct sbd_msg *m, const void *payload,
		  const char **why)
{
	if (!c->hello && m->type != SBD_HELLO) {
		*why = "spoke before HELLO";
		return false;
	}
	switch (m->type) {
	case SBD_HELLO:
		if (c->hello) {
			*why = "a second HELLO";
			return false;
		}
		c->hello = true;
		c->control = m->d & SBD_HELLO_CONTROL;
		c->hugetlb = m->d & SBD_HELLO_HUGETLB;
		c->page_size = c->control ? 4096 : m->c;
		if (!c->control && m->b) {
			/* Back after a restart, holding pages already. What
			 * it says cannot be checked: at most the budget less
			 * the other clients' unused floors is believed (a
			 * client claiming the machine would otherwise shut
			 * every other one out), and the client is told what
			 * was. */
			uint64_t most = s->max_bytes -
					sbd_budget_reserved(s, c),
				 claim = m->b < most ? m->b : most;

			claim -= claim % c->page_size;
			c->lease = claim;
			s->used += claim;
			sbd_log("client %u (pid %d): back, holding %llu KiB%s",
				c->id, (int)c->pid,
				(unsigned long long)(claim >> 10),
				claim < m->b ? " (claimed more: capped)" : "");
		} else if (s->verbose) {
			sbd_log("client %u (pid %d, uid %u): %s, %llu KiB "
				"pages%s", c->id, (int)c->pid, (unsigned)c->uid,
				c->control ? "control" : "connected",
				(unsigned long long)(c->page_size >> 10),
				c->hugetlb ? " (huge pages)" : "");
		}
		{
			/* The cache's page size, to clients whose heaps are
			 * of the cache's kind: a cache page is placed in the
			 * client's buffers as one of its own heap's. */
			struct sbd_msg r = {.magic = SBD_MAGIC,
					    .type = SBD_REPLY, .seq = m->seq,
					    .a = c->id, .b = s->max_bytes,
					    .c = c->hugetlb == s->hugetlb
							 ? s->page_size
							 : 0,
					    .d = c->lease};

			sbd_send(c->fd, &r, NULL, -1);
		}
		/* A claim over the budget is asked back at the next tick
		 * (50 ms): by then a client with a floor has said so, and
		 * is not asked below it. */
		return true;
	case SBD_STATUS:
		status(s, c, m->seq);
		return true;
	case SBD_CACHE_LIST:
		sbd_cache_list(s, c, m);
		return true;
	}
	if (c->control) {
		*why = "a control connection asked for pages";
		return false;
	}
	switch (m->type) {
	case SBD_LEASE:
		if ((m->a | m->b) % c->page_size) {
			*why = "a lease of part of a page";
			return false;
		}
		note_usage(c, m);
		sbd_budget_lease(s, c, m->seq, m->a, m->b);
		return true;
	case SBD_RETURN:
		if (m->a > c->lease) {
			*why = "returned more than it held";
			return false;
		}
		note_usage(c, m);
		sbd_budget_return(s, c, m->a, m->b);
		return true;
	case SBD_FLOOR:
		if (m->a % c->page_size) {
			*why = "a floor of part of a page";
			return false;
		}
		sbd_budget_floor(s, c, m->seq, m->a);
		return true;
	case SBD_REPORT:
		note_usage(c, m);
		c->spilled = m->a;
		return true;
	case SBD_HEAP:
		heap(s, c, m->seq, m->a);
		return true;
	case SBD_HEAP_FREE:
		if (!heap_free(c, m->a)) {
			*why = "freed a heap that is not its own";
			return false;
		}
		return true;
	case SBD_CACHE_PUT:
	case SBD_CACHE_DONE:
	case SBD_CACHE_GET:
	case SBD_CACHE_HEAP:
	case SBD_CACHE_UNPIN:
	case SBD_CACHE_MODEL:
		if (c->page_size != s->page_size) {
			*why = "used the cache with another page size";
			return false;
		}
		if (c->hugetlb != s->hugetlb) {
			*why = "used the cache with another kind of heap "
			       "(huge pages or not)";
			return false;
		}
		return sbd_cache_serve(s, c, m, payload, why);
	}
	*why = "a message only the daemon sends";
	return false;
}

static void on_client(struct sbd_loop *loop, int fd, void *arg)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	struct sbd_client *c = arg;
	struct sbd_server *s = c->srv;
	const char *why = NULL;
	struct sbd_msg m;
	int mfd, r;
	long n;

	(void)loop;
	/* A few messages per wake-up, then the others' turn. */
	for (int k = 0; k < 16; k++) {
		n = sbd_recv(fd, buf, sizeof(buf), &mfd);
		/* No client sends descriptors. One may come with a message
		 * of no bytes, which reads as the end (n == 0). */
		if (mfd >= 0)
			close(mfd);
		if (n == -EAGAIN)
			return;
		if (n == 0 || n == -ECONNRESET) {
			drop(s, c, NULL);
			return;
		}
		if (n < 0) {
			drop(s, c, n == -EMSGSIZE ? "a message too large"
						  : "a receive error");
			return;
		}
		r = sbd_msg_check(buf, (size_t)n, mfd >= 0, false, &m);
		if (r < 0) {
			drop(s, c, r == -EPROTO ? "a message it may not send"
						: "a malformed message");
			return;
		}
		if (!serve(s, c, &m, buf + sizeof(m), &why)) {
			drop(s, c, why);
			return;
		}
	}
}

struct sbd_client *sbd_server_adopt(struct sbd_server *s, int fd, pid_t pid,
				    uid_t uid, gid_t gid)
{
	struct sbd_client *c;

	if (s->nclients >= MAX_CLIENTS || !(c = calloc(1, sizeof(*c)))) {
		close(fd);
		return NULL;
	}
	c->srv = s;
	c->fd = fd;
	c->pid = pid;
	c->uid = uid;
	c->gid = gid;
	c->id = ++s->next_id ? s->next_id : ++s->next_id;
	c->active_ms = sbd_now_ms();
	c->page_size = 4096;
	if (sbd_loop_add(s->loop, fd, on_client, c) < 0) {
		close(fd);
		free(c);
		return NULL;
	}
	c->next = s->clients;
	s->clients = c;
	s->nclients++;
	s->clients_total++;
	return c;
}

static void on_listen(struct sbd_loop *loop, int fd, void *arg)
{
	struct sbd_server *s = arg;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	/* Above 2 (dproto.h says why): a client's socket at descriptor 2
	 * would get the daemon's log lines as messages. */
	int cfd = sbd_fd_above_std(
		accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), false);

	(void)loop;
	if (cfd < 0)
		return;	/* EAGAIN, or a client that gave up */
	if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		close(cfd);
		return;
	}
	sbd_server_adopt(s, cfd, cred.pid, cred.uid, cred.gid);
}

/* Is a daemon answering at path? */
static bool someone_listens(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	bool yes;

	if (fd < 0)
		return false;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	yes = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return yes;
}

int sbd_server_listen(struct sbd_server *s)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	const char *lp = getenv("LISTEN_PID"), *lf = getenv("LISTEN_FDS");
	struct stat st;
	int fd, r;

	s->start_ms = sbd_now_ms();
	s->self_uid = geteuid();
	if (lp && lf && atol(lp) == (long)getpid() && atoi(lf) >= 1) {
		/* Socket activation (sparsebufd.socket): systemd listens on
		 * fd 3, and keeps listening while we restart. */
		fd = 3;
		fcntl(fd, F_SETFD, FD_CLOEXEC);
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
		unsetenv("LISTEN_PID");
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_FDNAMES");
	} else {
		if (strlen(s->socket_path) >= sizeof(sa.sun_path))
			return -ENAMETOOLONG;
		memcpy(sa.sun_path, s->socket_path,
		       strlen(s->socket_path) + 1);
		if (lstat(s->socket_path, &st) == 0) {
			if (!S_ISSOCK(st.st_mode))
				return -EEXIST;	/* not ours to remove */
			if (someone_listens(s->socket_path))
				return -EADDRINUSE;
			unlink(s->socket_path);	/* a dead daemon's */
		}
		fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC |
					     SOCK_NONBLOCK, 0);
		if (fd < 0)
			return -errno;
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
		    chmod(s->socket_path, 0660) < 0 ||
		    (s->group != (gid_t)-1 &&
		     chown(s->socket_path, (uid_t)-1, s->group) < 0) ||
		    listen(fd, 128) < 0) {
			r = -errno;
			close(fd);
			unlink(s->socket_path);
			return r;
		}
		s->own_socket = true;
	}
	s->listen_fd = fd;
	return sbd_loop_add(s->loop, fd, on_listen, s);
}

void sbd_server_close(struct sbd_server *s)
{
	while (s->clients)
		drop(s, s->clients, NULL);
	sbd_loop_del(s->loop, s->listen_fd);
	close(s->listen_fd);
	if (s->own_socket)
		unlink(s->socket_path);
	sbd_cache_free(s);
}
