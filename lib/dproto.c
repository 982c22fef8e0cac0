/* SPDX-License-Identifier: MIT */
/*
 * sparsebufd's wire protocol: checking, sending and receiving messages
 * (lib/dproto.h). No state: used by the client pools (dclient.c), the
 * daemon and sparsebufctl, and fuzzed (tests/fuzz/fuzz_dmsg.c). Also what
 * the library and the daemon share below the protocol: heap files, and
 * keeping every descriptor of data off 0-2 (sbd_fd_above_std).
 */
#include "dproto.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *const names[SBD_TYPE_END] = {
	[SBD_HELLO] = "hello",	     [SBD_LEASE] = "lease",
	[SBD_RETURN] = "return",     [SBD_REPORT] = "report",
	[SBD_HEAP] = "heap",	     [SBD_HEAP_FREE] = "heap-free",
	[SBD_STATUS] = "status",     [SBD_RECLAIM] = "reclaim",
	[SBD_REPLY] = "reply",
	[SBD_CACHE_PUT] = "cache-put",	     [SBD_CACHE_DONE] = "cache-done",
	[SBD_CACHE_GET] = "cache-get",	     [SBD_CACHE_HEAP] = "cache-heap",
	[SBD_CACHE_UNPIN] = "cache-unpin", [SBD_CACHE_MODEL] = "cache-model",
	[SBD_CACHE_LIST] = "cache-list",
	[SBD_FLOOR] = "floor",
};

const char *sbd_type_name(unsigned type)
{
	return type && type < SBD_TYPE_END ? names[type] : "unknown";
}

static bool size_ok(uint64_t v, bool zero_ok)
{
	return (v || zero_ok) && v <= SBD_MAX_BYTES && !(v & 4095);
}

int sbd_msg_check(const void *buf, size_t n, unsigned nfds, bool from_daemon,
		  struct sbd_msg *m)
{
	if (!buf || n < sizeof(*m))
		return -EBADMSG;
	memcpy(m, buf, sizeof(*m));
	if (m->magic != SBD_MAGIC || m->len > SBD_MAX_PAYLOAD ||
	    m->len != n - sizeof(*m) || m->nfds != nfds || nfds > SBD_MAX_FDS)
		return -EBADMSG;
	if (!m->type || m->type >= SBD_TYPE_END)
		return -EBADMSG;
	if (from_daemon != (m->type == SBD_RECLAIM || m->type == SBD_REPLY))
		return -EPROTO;
	/* Descriptors: only the reply to a HEAP request carries one, and
	 * the receiver knows which reply that is. */
	if (nfds && m->type != SBD_REPLY)
		return -EPROTO;
	/* Payloads: replies, and the cache's messages that say so. */
	if (m->len && m->type != SBD_REPLY && m->type != SBD_CACHE_PUT &&
	    m->type != SBD_CACHE_UNPIN && m->type != SBD_CACHE_MODEL)
		return -EBADMSG;
	switch (m->type) {
	case SBD_HELLO:
		if (!m->seq || m->a != SBD_VERSION || !size_ok(m->b, true) ||
		    (m->c & (m->c - 1)) || m->c > ((uint64_t)1 << 30) ||
		    (m->d & ~(uint64_t)(SBD_HELLO_CONTROL |
					       SBD_HELLO_HUGETLB)) ||
		    (m->d & SBD_HELLO_CONTROL && m->d & SBD_HELLO_HUGETLB))
			return -EBADMSG;
		if (!(m->d & SBD_HELLO_CONTROL) && m->c < 4096)
			return -EBADMSG;
		break;
	case SBD_LEASE:
		if (!m->seq || !size_ok(m->a, true) || !size_ok(m->b, false) ||
		    m->b < m->a || !size_ok(m->c, true) || !size_ok(m->d, true))
			return -EBADMSG;
		break;
	case SBD_RETURN:
		if (!size_ok(m->a, true) || m->b > 1 || !size_ok(m->c, true) ||
		    !size_ok(m->d, true))
			return -EBADMSG;
		break;
	case SBD_REPORT:
		if (!size_ok(m->a, true) || !size_ok(m->c, true) ||
		    !size_ok(m->d, true))
			return -EBADMSG;
		break;
	case SBD_HEAP:
		if (!m->seq || !size_ok(m->a, false))
			return -EBADMSG;
		break;
	case SBD_HEAP_FREE:
		if (!m->a || m->a > UINT32_MAX)
			return -EBADMSG;
		break;
	case SBD_STATUS:
		if (!m->seq)
			return -EBADMSG;
		break;
	case SBD_RECLAIM:
		if (!size_ok(m->a, false))
			return -EBADMSG;
		break;
	case SBD_REPLY:
		if (!m->seq || m->err > 0 || m->err < -4095)
			return -EBADMSG;
		break;
	case SBD_CACHE_PUT:
		if (!m->seq || m->c >= SBD_CACHE_MAX_DEPTH || !m->d ||
		    m->d > SBD_CACHE_MAX_PAGES || !m->len || m->len % 4 ||
		    m->len / 4 > SBD_CACHE_MAX_TOKENS)
			return -EBADMSG;
		break;
	case SBD_CACHE_DONE:
		if (!m->seq || m->b > 1)
			return -EBADMSG;
		break;
	case SBD_CACHE_GET:
		if (!m->seq || m->c >= SBD_CACHE_MAX_DEPTH)
			return -EBADMSG;
		break;
	case SBD_CACHE_HEAP:
		if (!m->seq || !m->a || m->a > UINT32_MAX)
			return -EBADMSG;
		break;
	case SBD_CACHE_UNPIN:
		if (!m->a || m->a > SBD_MAX_PAYLOAD / 8 || m->len != m->a * 8)
			return -EBADMSG;
		break;
	case SBD_CACHE_MODEL:
		if (!m->len || m->len > SBD_CACHE_MODEL_MAX - 1)
			return -EBADMSG;
		break;
	case SBD_CACHE_LIST:
		if (!m->seq)
			return -EBADMSG;
		break;
	case SBD_FLOOR:
		if (!m->seq || !size_ok(m->a, true))
			return -EBADMSG;
		break;
	}
	return 0;
}

static int send_flags(int sock, const struct sbd_msg *m, const void *payload,
		      int fd, int flags);

int sbd_send(int sock, const struct sbd_msg *m, const void *payload, int fd)
{
	return send_flags(sock, m, payload, fd, 0);
}

int sbd_send_nowait(int sock, const struct sbd_msg *m)
{
	return send_flags(sock, m, NULL, -1, MSG_DONTWAIT);
}

int sbd_send_nowait_payload(int sock, const struct sbd_msg *m,
			    const void *payload)
{
	return send_flags(sock, m, payload, -1, MSG_DONTWAIT);
}

static int send_flags(int sock, const struct sbd_msg *m, const void *payload,
		      int fd, int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov[2] = {
		{(void *)m, sizeof(*m)},
		{(void *)payload, m->len},
	};
	struct msghdr mh = {
		.msg_iov = iov,
		.msg_iovlen = m->len ? 2 : 1,
	};
	ssize_t r;

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	do
		r = sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	return (size_t)r == sizeof(*m) + m->len ? 0 : -EMSGSIZE;
}

long sbd_recv(int sock, void *buf, size_t cap, int *fd)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {buf, cap};
	struct msghdr mh = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = ctl.buf,
		.msg_controllen = sizeof(ctl.buf),
	};
	int got[8], ngot = 0;
	ssize_t r;

	*fd = -1;
	do
		r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c;
	     c = CMSG_NXTHDR(&mh, c)) {
		size_t k;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k && ngot < 8; i++)
			memcpy(&got[ngot++], CMSG_DATA(c) + i * sizeof(int),
			       sizeof(int));
	}
	if ((mh.msg_flags & MSG_TRUNC) || ngot > SBD_MAX_FDS) {
		while (ngot--)
			close(got[ngot]);
		return -EMSGSIZE;
	}
	if (mh.msg_flags & MSG_CTRUNC) {
		/* The bytes came whole, the descriptor not: this process is
		 * at RLIMIT_NOFILE. The message stands, marked; a reply
		 * then fails its request rather than the connection (a
		 * client at its limit reconnected over and over). */
		while (ngot--)
			close(got[ngot]);
		*fd = -EMFILE;
		return (long)r;
	}
	if (ngot && (*fd = sbd_fd_above_std(got[0], false)) < 0)
		return *fd;
	return (long)r;
}

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

int sbd_fd_above_std(int fd, bool fresh)
{
	int hi, null, e;

	if (fd < 0 || fd > 2)
		return fd;
	hi = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	e = errno;
	/* The slot stays taken (the program had it closed: /dev/null reads
	 * nothing and takes writes), so the next descriptor we make is not
	 * there either; without /dev/null it is closed. Only this slot: a
	 * closed one may be another thread's next descriptor any moment. */
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || dup3(null, fd, O_CLOEXEC) < 0)
		close(fd);
	if (null > 2)
		close(null);	/* (below 3 it fills another closed slot) */
	if (hi < 0)
		return -e;
	if (fresh && ftruncate(hi, 0) < 0) {
		e = errno;
		close(hi);
		return -e;
	}
	return hi;
}

int sbd_heap_file(const char *name, uint64_t bytes, bool hugetlb)
{
	unsigned int huge = hugetlb ? MFD_HUGETLB : 0;
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING |
					    MFD_NOEXEC_SEAL | huge);

	/* Kernels before 6.3 reject MFD_NOEXEC_SEAL. */
	if (fd < 0 && errno == EINVAL)
		fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | huge);
	if (fd < 0)
		return -errno;
	fd = sbd_fd_above_std(fd, true);
	if (fd < 0)
		return fd;
	if (ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}
