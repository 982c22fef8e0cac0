/* SPDX-License-Identifier: MIT */
/*
 * sparsebufd's event loop, in the shape of Redis's ae.c: a table of
 * descriptors by number, each with a read handler, one epoll set, and a
 * periodic timer run between waits. Single-threaded: every handler runs
 * to completion, so the daemon's state needs no lock.
 */
#include "loop.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

struct handler {
	sbd_io_fn fn;
	void *arg;
};

struct sbd_loop {
	int ep;
	bool stop;
	struct handler *h;	/* by descriptor */
	int cap;
	unsigned tick_ms;
	uint64_t next_tick;
	sbd_tick_fn tick;
	void *tick_arg;
};

uint64_t sbd_fake_now_ms;

uint64_t sbd_now_ms(void)
{
	struct timespec ts;

	if (sbd_fake_now_ms)
		return sbd_fake_now_ms;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct sbd_loop *sbd_loop_new(void)
{
	struct sbd_loop *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->ep = epoll_create1(EPOLL_CLOEXEC);
	if (l->ep < 0) {
		free(l);
		return NULL;
	}
	return l;
}

void sbd_loop_free(struct sbd_loop *l)
{
	if (!l)
		return;
	close(l->ep);
	free(l->h);
	free(l);
}

int sbd_loop_add(struct sbd_loop *l, int fd, sbd_io_fn fn, void *arg)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};

	if (fd < 0)
		return -EBADF;
	if (fd >= l->cap) {
		int cap = l->cap ? l->cap : 64;
		struct handler *h;

		while (cap <= fd)
			cap *= 2;
		h = realloc(l->h, (size_t)cap * sizeof(*h));
		if (!h)
			return -ENOMEM;
		memset(h + l->cap, 0, (size_t)(cap - l->cap) * sizeof(*h));
		l->h = h;
		l->cap = cap;
	}
	if (epoll_ctl(l->ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		return -errno;
	l->h[fd] = (struct handler){fn, arg};
	return 0;
}

void sbd_loop_del(struct sbd_loop *l, int fd)
{
	if (fd < 0 || fd >= l->cap || !l->h[fd].fn)
		return;
	epoll_ctl(l->ep, EPOLL_CTL_DEL, fd, NULL);
	l->h[fd] = (struct handler){0};
}

void sbd_loop_every(struct sbd_loop *l, unsigned ms, sbd_tick_fn fn,
		    void *arg)
{
	l->tick_ms = ms;
	l->tick = fn;
	l->tick_arg = arg;
	l->next_tick = sbd_now_ms() + ms;
}

void sbd_loop_stop(struct sbd_loop *l)
{
	l->stop = true;
}

int sbd_loop_once(struct sbd_loop *l, int timeout_ms)
{
	struct epoll_event ev[64];
	int n;

	if (l->tick) {
		uint64_t now = sbd_now_ms();

		if (now >= l->next_tick) {
			l->next_tick = now + l->tick_ms;
			l->tick(l, l->tick_arg);
			return 0;
		}
		if (timeout_ms < 0 || l->next_tick - now < (uint64_t)timeout_ms)
			timeout_ms = (int)(l->next_tick - now);
	}
	n = epoll_wait(l->ep, ev, 64, timeout_ms);
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	for (int i = 0; i < n && !l->stop; i++) {
		int fd = ev[i].data.fd;

		/* A handler before this one may have closed fd. */
		if (fd < l->cap && l->h[fd].fn)
			l->h[fd].fn(l, fd, l->h[fd].arg);
	}
	return n;
}

int sbd_loop_run(struct sbd_loop *l)
{
	while (!l->stop) {
		int r = sbd_loop_once(l, -1);

		if (r < 0)
			return r;
	}
	return 0;
}
