/* SPDX-License-Identifier: MIT */
/*
 * The I/O engine of the disk tier: reads and writes between heap pages and
 * files, many in flight at once, finished on one completion thread.
 *
 *   io_uring   one ring per pool; submitters prepare SQEs under io->lock
 *              and submit a batch with one io_uring_enter; requests that
 *              find the ring full wait in a software queue that the
 *              completion thread feeds in as completions free slots. So a
 *              submitter never waits for the disk, whatever locks it holds.
 *   fallback   pread/pwrite on a few worker threads, for kernels or
 *              sandboxes without io_uring (SPARSEBUF_PAGER=sync forces it).
 *
 * A request reads, writes, or punches a hole (the spill file's freed
 * slots). Either way a request's done() runs on the completion thread.
 * done() may refuse (return false) when it would have to wait for a lock:
 * a thread holding a buffer's lock may be waiting for one of our
 * completions, so this thread never blocks on a buffer lock; refused
 * requests are retried after the next round. Registered buffers are not
 * used: registering a heap pins every page of it, which would defeat the
 * holes the pool punches.
 *
 * Request memory comes from mmap'd slabs (never malloc: the fault path
 * submits) and is recycled through a free list.
 */
#include "internal.h"
#include "uffd_compat.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define RING_DEPTH 256
#define SLAB_IOS 256
#define NWORKERS 4
/* Read buffers: up to twice the ring (pages of 8 KiB; fewer for larger
 * ones, within 4 MiB: disk.c), since a read's buffer comes back only once
 * its done() has run, after the ring has taken more reads. */
#define BOUNCE_MAX (2 * RING_DEPTH)
#define WAKE_LATER 64	/* threads a fault left to wake (sbi_io_wake_later) */
/* ... woken anyway this long after, read or no read: memory freed some
 * other way (an unmap, a share ending) lets them retry; at most one retry
 * a millisecond or two, where a fault woken at once retries without end. */
#define WAKE_WITHIN_MS 1

struct slab {
	struct slab *next;
	struct sbi_io ios[SLAB_IOS];
};

struct sbi_ioq {
	struct sbi_io *head, *tail;
};

struct sbi_io_engine {
	bool uring;
	char name[48];
	struct io_uring ring;
	pthread_mutex_t lock;	/* everything below; never held for I/O */
	pthread_cond_t work_cond;	/* fallback workers: work or stop */
	struct sbi_ioq pending;	/* not yet in the ring / for the workers */
	struct sbi_ioq done;	/* fallback: finished, for the completer */
	unsigned in_ring;	/* SQEs submitted, CQE not reaped */
	unsigned busy;		/* requests anywhere in the engine */
	struct sbi_io *free;
	struct slab *slabs;
	/* Read buffers (sbi_io_bounce_init): nbounce of bounce_size bytes
	 * at bounce, the free ones' indexes a stack. */
	char *bounce;
	size_t bounce_size;
	unsigned nbounce, nbounce_free;
	uint16_t bounce_free[BOUNCE_MAX];
	bool stopping;
	bool can_punch;		/* hole punches as requests (not on io_uring
				 * before Linux 5.6) */
	unsigned punches;	/* hole punches among busy */
	uint64_t last_ms;	/* another request submitted or finished */
	int wake_fd;		/* eventfd: completer wake-up */
	/* Faulting threads to wake when a read or write finishes: what
	 * keeps them out is memory that requests in flight hold. */
	struct uffdio_range wake_range[WAKE_LATER];
	int wake_uffd[WAKE_LATER];
	unsigned nwake;
	uint64_t wake_since_ms;	/* the first of them asked */
	pthread_t completer;
	pthread_t workers[NWORKERS];
	int nworkers;
};

static void q_push(struct sbi_ioq *q, struct sbi_io *io)
{
	io->next = NULL;
	if (q->tail)
		q->tail->next = io;
	else
		q->head = io;
	q->tail = io;
}

static void q_push_front(struct sbi_ioq *q, struct sbi_io *io)
{
	io->next = q->head;
	q->head = io;
	if (!q->tail)
		q->tail = io;
}

static struct sbi_io *q_pop(struct sbi_ioq *q)
{
	struct sbi_io *io = q->head;

	if (io) {
		q->head = io->next;
		if (!q->head)
			q->tail = NULL;
	}
	return io;
}

static void wake_completer(struct sbi_io_engine *e)
{
	uint64_t one = 1;

	if (write(e->wake_fd, &one, sizeof(one)) < 0) {
		/* The counter is saturated: it is readable anyway. */
	}
}

/* ---- request memory --------------------------------------------------------- */

struct sbi_io *sbi_io_get(struct sbi_io_engine *e)
{
	struct sbi_io *io;

	pthread_mutex_lock(&e->lock);
	if (!e->free) {
		struct slab *s = sbi_meta_alloc(sizeof(*s), false);

		if (!s) {
			pthread_mutex_unlock(&e->lock);
			return NULL;
		}
		s->next = e->slabs;
		e->slabs = s;
		for (int i = 0; i < SLAB_IOS; i++) {
			s->ios[i].next = e->free;
			e->free = &s->ios[i];
		}
	}
	io = e->free;
	e->free = io->next;
	pthread_mutex_unlock(&e->lock);
	memset(io, 0, sizeof(*io));
	return io;
}

void sbi_io_put(struct sbi_io_engine *e, struct sbi_io *io)
{
	pthread_mutex_lock(&e->lock);
	io->next = e->free;
	e->free = io;
	pthread_mutex_unlock(&e->lock);
}

/* ---- read buffers ------------------------------------------------------------ */

/*
 * Read buffers for page-ins into fresh memfd pages (home pages, home.c).
 * Read straight into such a page, a read faults it into the heap through
 * the pool's mapping: shmem allocates and zeroes each 4 KiB, and the pool
 * side gets page-table entries that must be dropped again (a TLB
 * shootdown), all on the thread that submits. Read into a buffer of these
 * and then written into the heap through the file (pwrite, by the read's
 * done()), the page is allocated unzeroed (the write covers it) and never
 * mapped on the pool's side: 30-38% less CPU for random 64 KiB page-ins
 * (docs/PERFORMANCE.md). A spill page-in gains the same way, and its
 * checksum is read from the buffer instead of through the heap's file:
 * one copy (pwrite) in place of two (pread, and the kernel pinning the
 * pool side). Given out as reads enter the ring (reads waiting for a slot
 * hold none); a read that finds none free goes straight into its page,
 * as before.
 */
int sbi_io_bounce_init(struct sbi_io_engine *e, size_t size, unsigned n)
{
	char *m;

	if (n > BOUNCE_MAX)
		n = BOUNCE_MAX;
	if (!n || size % 4096)
		return -EINVAL;
	m = mmap(NULL, (size_t)n * size, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return -errno;
	madvise(m, (size_t)n * size, MADV_DONTFORK);
	pthread_mutex_lock(&e->lock);
	if (e->bounce) {
		pthread_mutex_unlock(&e->lock);
		munmap(m, (size_t)n * size);
		return -EBUSY;
	}
	e->bounce = m;
	e->bounce_size = size;
	e->nbounce = e->nbounce_free = n;
	for (unsigned k = 0; k < n; k++)
		e->bounce_free[k] = (uint16_t)(n - 1 - k);
	pthread_mutex_unlock(&e->lock);
	return 0;
}

/* A read buffer for io if it may have one and one is free; e->lock held. */
static void bounce_take(struct sbi_io_engine *e, struct sbi_io *io)
{
	SBI_HELD(&e->lock);
	if (io->may_bounce && !io->bounce && e->nbounce_free &&
	    io->len <= e->bounce_size)
		io->bounce = e->bounce +
			     (size_t)e->bounce_free[--e->nbounce_free] *
				     e->bounce_size;
}

/* Whether io may start now: one that must have a read buffer waits for
 * one to be free (one is given back as each read finishes). */
static bool may_start(const struct sbi_io_engine *e, const struct sbi_io *io)
{
	SBI_HELD(&e->lock);
	return !io->must_bounce || io->bounce || e->nbounce_free;
}

bool sbi_io_bounce_fits(struct sbi_io_engine *e, size_t len)
{
	bool r;

	pthread_mutex_lock(&e->lock);
	r = e->nbounce && len <= e->bounce_size;
	pthread_mutex_unlock(&e->lock);
	return r;
}

static unsigned fill_ring(struct sbi_io_engine *e);
static void submit_ring(struct sbi_io_engine *e);

void sbi_io_bounce_put(struct sbi_io_engine *e, struct sbi_io *io)
{
	if (!io->bounce)
		return;
	pthread_mutex_lock(&e->lock);
	e->bounce_free[e->nbounce_free++] =
		(uint16_t)(((char *)io->bounce - e->bounce) / e->bounce_size);
	/* A read waiting for a buffer goes now: nothing else might move
	 * it (the ring may hold nothing else to finish). */
	if (e->pending.head && e->pending.head->must_bounce) {
		if (e->uring) {
			if (fill_ring(e))
				submit_ring(e);
		} else {
			pthread_cond_broadcast(&e->work_cond);
		}
	}
	pthread_mutex_unlock(&e->lock);
	io->bounce = NULL;
}

void sbi_io_bounce_count(struct sbi_io_engine *e, unsigned *n,
			 unsigned *free)
{
	pthread_mutex_lock(&e->lock);
	*n = e->nbounce;
	*free = e->nbounce_free;
	pthread_mutex_unlock(&e->lock);
}

/* ---- submission ------------------------------------------------------------- */

static void prep_sqe(struct io_uring_sqe *sqe, struct sbi_io *io)
{
	if (io->punch)
		io_uring_prep_fallocate(sqe, io->fd,
					FALLOC_FL_PUNCH_HOLE |
						FALLOC_FL_KEEP_SIZE,
					(off_t)io->off, (off_t)io->len);
	else if (io->write)
		io_uring_prep_write(sqe, io->fd, io->mem, (unsigned)io->len,
				    io->off);
	else
		io_uring_prep_read(sqe, io->fd,
				   io->bounce ? io->bounce : io->mem,
				   (unsigned)io->len, io->off);
	io_uring_sqe_set_data(sqe, io);
}

/* Move pending requests into free SQEs; e->lock held. Returns how many. */
static unsigned fill_ring(struct sbi_io_engine *e)
{
	SBI_HELD(&e->lock);
	unsigned n = 0;

	while (e->pending.head && e->in_ring < RING_DEPTH &&
	       may_start(e, e->pending.head)) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
		struct sbi_io *io;

		if (!sqe)
			break;
		io = q_pop(&e->pending);
		bounce_take(e, io);
		prep_sqe(sqe, io);
		e->in_ring++;
		n++;
	}
	return n;
}

static void submit_ring(struct sbi_io_engine *e)
{
	for (int tries = 0; tries < 100; tries++) {
		int r = io_uring_submit(&e->ring);

		if (r >= 0 || (r != -EAGAIN && r != -EINTR && r != -EBUSY))
			return;
	}
}

void sbi_io_submit(struct sbi_io_engine *e, struct sbi_io **ios, size_t n)
{
	uint64_t now;

	if (!n)
		return;
	now = sbi_mono_ms();
	pthread_mutex_lock(&e->lock);
	for (size_t k = 0; k < n; k++) {
		q_push(&e->pending, ios[k]);
		if (ios[k]->punch)
			e->punches++;
		else
			e->last_ms = now;
	}
	e->busy += (unsigned)n;
	if (e->uring) {
		if (fill_ring(e))
			submit_ring(e);
	} else {
		pthread_cond_broadcast(&e->work_cond);
	}
	pthread_mutex_unlock(&e->lock);
}

bool sbi_io_can_punch(const struct sbi_io_engine *e)
{
	return e->can_punch;
}

bool sbi_io_quiet(struct sbi_io_engine *e, unsigned ms)
{
	uint64_t now = sbi_mono_ms();
	bool r;

	pthread_mutex_lock(&e->lock);
	r = e->busy == e->punches && now - e->last_ms >= ms;
	pthread_mutex_unlock(&e->lock);
	return r;
}

bool sbi_io_wake_later(struct sbi_io_engine *e, int uffd, uintptr_t start,
		       size_t len)
{
	bool r;

	pthread_mutex_lock(&e->lock);
	r = e->busy > e->punches && e->nwake < WAKE_LATER;
	if (r) {
		if (!e->nwake)
			e->wake_since_ms = sbi_mono_ms();
		e->wake_range[e->nwake] =
			(struct uffdio_range){.start = start, .len = len};
		e->wake_uffd[e->nwake++] = uffd;
	}
	pthread_mutex_unlock(&e->lock);
	/* The completer then looks every millisecond (WAKE_WITHIN_MS). */
	if (r)
		wake_completer(e);
	return r;
}

unsigned sbi_io_wakes_pending(struct sbi_io_engine *e)
{
	unsigned n;

	pthread_mutex_lock(&e->lock);
	n = e->nwake;
	pthread_mutex_unlock(&e->lock);
	return n;
}

bool sbi_io_busy(struct sbi_io_engine *e)
{
	bool r;

	pthread_mutex_lock(&e->lock);
	r = e->busy > e->punches;
	pthread_mutex_unlock(&e->lock);
	return r;
}

/* ---- the fallback's workers ---------------------------------------------------- */

static ssize_t do_sync(struct sbi_io *io)
{
	size_t done = 0;

	if (io->punch)
		return fallocate(io->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				 (off_t)io->off, (off_t)io->len) < 0
			       ? -errno
			       : 0;

	while (done < io->len) {
		char *mem = io->bounce ? io->bounce : io->mem;
		ssize_t r = io->write ? pwrite(io->fd, mem + done,
					       io->len - done,
					       (off_t)(io->off + done))
				      : pread(io->fd, mem + done,
					      io->len - done,
					      (off_t)(io->off + done));

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;	/* end of file */
		done += (size_t)r;
	}
	return (ssize_t)done;
}

static void *worker(void *arg)
{
	struct sbi_io_engine *e = arg;

	sbi_thread_internal();
	pthread_mutex_lock(&e->lock);
	for (;;) {
		struct sbi_io *io = e->pending.head;

		if (!io || (!may_start(e, io) && !e->stopping)) {
			if (!io && e->stopping)
				break;
			pthread_cond_wait(&e->work_cond, &e->lock);
			continue;
		}
		q_pop(&e->pending);
		bounce_take(e, io);
		pthread_mutex_unlock(&e->lock);
		/* Stopping, with no read buffer for a read that must have
		 * one: never straight into its page (nothing is left to
		 * read for by then: buffers go first). */
		io->res = io->must_bounce && !io->bounce ? -ECANCELED
							 : do_sync(io);
		pthread_mutex_lock(&e->lock);
		q_push(&e->done, io);
		wake_completer(e);
	}
	pthread_mutex_unlock(&e->lock);
	return NULL;
}

/* ---- completion ---------------------------------------------------------------- */

/* Resubmissions of a request the kernel failed for its submitter's sake
 * (reap). */
#define MAX_RETRIES 3

/* Test hook: the next count completions from the ring read as canceled
 * by the kernel (their work done or not). */
static _Atomic unsigned test_cancel_count;

void sbi_test_io_cancel(unsigned count);
void sbi_test_io_cancel(unsigned count)
{
	atomic_store(&test_cancel_count, count);
}

static bool transient(int res)
{
	return res == -ECANCELED || res == -EFAULT || res == -EINTR ||
	       res == -EAGAIN;
}

/* Finished requests, in a list; waits up to timeout_ms (-1: forever). */
static struct sbi_io *reap(struct sbi_io_engine *e, int timeout_ms)
{
	struct sbi_ioq got = {0};

	if (e->uring) {
		struct io_uring_cqe *cqe;
		struct pollfd pfd = {.fd = e->wake_fd, .events = POLLIN};
		unsigned head, n = 0;

		/* Sleep in poll on both the ring's fd and the wake-up fd. */
		if (!io_uring_cq_ready(&e->ring)) {
			struct pollfd two[2] = {
				{.fd = e->ring.ring_fd, .events = POLLIN},
				pfd,
			};

			poll(two, 2, timeout_ms);
		}
		if (poll(&pfd, 1, 0) == 1) {
			uint64_t v;

			if (read(e->wake_fd, &v, sizeof(v)) < 0) {
				/* Raced with another read: nothing to do. */
			}
		}
		/* Under the lock the submitter released after filling the
		 * request: the hand-over through the kernel is then ordered
		 * for ThreadSanitizer too. */
		pthread_mutex_lock(&e->lock);
		io_uring_for_each_cqe(&e->ring, head, cqe)
		{
			struct sbi_io *io = io_uring_cqe_get_data(cqe);
			int res = cqe->res;

			n++;
			if (sbi_test_take(&test_cancel_count))
				res = -ECANCELED;
			/* Failed by the submitting thread's state, not the
			 * request's: io_uring could not start an io-wq worker
			 * for it (create_io_thread fails while a signal is
			 * pending, three times, then the work queued for it
			 * is canceled: a thread under a storm of signals),
			 * or the thread exited before the request's task
			 * work ran (-EFAULT: our memory is the pool's own or
			 * a read buffer, never a bad address). The library
			 * cancels nothing in the ring. Try again from this
			 * thread, which takes no signals and does not exit. */
			if (transient(res) && io->retries < MAX_RETRIES) {
				io->retries++;
				q_push_front(&e->pending, io);
				continue;
			}
			io->res = res;
			q_push(&got, io);
		}
		io_uring_cq_advance(&e->ring, n);
		e->in_ring -= n;
		if (fill_ring(e))
			submit_ring(e);
		pthread_mutex_unlock(&e->lock);
	} else {
		struct pollfd pfd = {.fd = e->wake_fd, .events = POLLIN};
		uint64_t v;

		pthread_mutex_lock(&e->lock);
		if (!e->done.head) {
			pthread_mutex_unlock(&e->lock);
			poll(&pfd, 1, timeout_ms);
			pthread_mutex_lock(&e->lock);
		}
		if (read(e->wake_fd, &v, sizeof(v)) < 0) {
			/* Not readable: fine. */
		}
		got = e->done;
		e->done.head = e->done.tail = NULL;
		pthread_mutex_unlock(&e->lock);
	}
	return got.head;
}

/* Wake every fault left waiting (sbi_io_wake_later); e->lock held, and
 * let go. */
static void wake_list(struct sbi_io_engine *e)
{
	SBI_HELD(&e->lock);
	struct uffdio_range wake[WAKE_LATER];
	int uffd[WAKE_LATER];
	unsigned n;

	n = e->nwake;
	memcpy(wake, e->wake_range, n * sizeof(wake[0]));
	memcpy(uffd, e->wake_uffd, n * sizeof(uffd[0]));
	e->nwake = 0;
	pthread_mutex_unlock(&e->lock);
	/* The thread faults again and tries; a range gone meanwhile has
	 * nobody to wake. */
	for (unsigned k = 0; k < n; k++)
		ioctl(uffd[k], UFFDIO_WAKE, &wake[k]);
}

static void *completer(void *arg)
{
	struct sbi_io_engine *e = arg;
	struct sbi_ioq refused = {0};

	sbi_thread_internal();
	for (;;) {
		struct sbi_io *io, *next, *retry = refused.head;
		unsigned finished = 0, punched = 0;
		bool stop, wake = false;

		refused.head = refused.tail = NULL;
		pthread_mutex_lock(&e->lock);
		wake = e->nwake != 0;
		pthread_mutex_unlock(&e->lock);
		io = reap(e, retry || wake ? 1 : -1);
		wake = false;
		/* Earlier refusals first: they have waited longest. */
		for (int pass = 0; pass < 2; pass++) {
			for (struct sbi_io *p = pass ? io : retry; p; p = next) {
				bool punch = p->punch;	/* p may go in done() */

				next = p->next;
				if (!p->done(p)) {
					q_push(&refused, p);
					continue;
				}
				finished++;
				punched += punch;
			}
		}
		pthread_mutex_lock(&e->lock);
		/* Counted for the round: until then a finished request still
		 * counts as busy, and the engine as not quiet. */
		e->busy -= finished;
		e->punches -= punched;
		if (finished > punched) {
			e->last_ms = sbi_mono_ms();
			/* What a read or write held may be had now. */
			wake = e->nwake != 0;
		}
		if (e->nwake &&
		    sbi_mono_ms() - e->wake_since_ms >= WAKE_WITHIN_MS)
			wake = true;
		stop = e->stopping && !e->busy;
		if (wake)
			wake_list(e);	/* lets e->lock go */
		else
			pthread_mutex_unlock(&e->lock);
		if (stop)
			break;
	}
	return NULL;
}

/* ---- waiting for a batch -------------------------------------------------------- */

bool sbi_io_wait_done(struct sbi_io *io)
{
	struct sbi_io_wait *w = io->wait;

	pthread_mutex_lock(&w->lock);
	if (io->res < 0 && !w->err)
		w->err = (int)io->res;
	else if (io->write && (size_t)io->res < io->len && !w->err)
		w->err = -ENOSPC;	/* a short write: the disk is full */
	if (--w->left == 0)
		pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return true;
}

void sbi_io_wait_init(struct sbi_io_wait *w, size_t n)
{
	pthread_mutex_init(&w->lock, NULL);
	SBI_LK_RANK(&w->lock, SBI_RANK_LEAF, 0);
	pthread_cond_init(&w->cond, NULL);
	w->left = n;
	w->err = 0;
}

int sbi_io_wait(struct sbi_io_wait *w)
{
	/* Nobody waits for I/O holding pool->lock (design.md). */
	SBI_NOT_HOLDING(SBI_RANK_POOL);
	int err;

	pthread_mutex_lock(&w->lock);
	while (w->left)
		pthread_cond_wait(&w->cond, &w->lock);
	err = w->err;
	pthread_mutex_unlock(&w->lock);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	return err;
}

/* ---- creation -------------------------------------------------------------------- */

const char *sbi_io_name(const struct sbi_io_engine *e)
{
	return e->name;
}

/* Set up a ring, or say why not (-errno). */
static int setup_ring(struct sbi_io_engine *e)
{
	if (sbi_env_pager_sync())
		return -ENOTSUP;
	return io_uring_queue_init(RING_DEPTH, &e->ring, 0);
}

struct sbi_io_engine *sbi_io_create(int *err)
{
	struct sbi_io_engine *e = calloc(1, sizeof(*e));
	int r;

	if (!e) {
		*err = -ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&e->lock, NULL);
	SBI_LK_RANK(&e->lock, SBI_RANK_LEAF, 0);
	pthread_cond_init(&e->work_cond, NULL);
	e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (e->wake_fd < 0) {
		*err = -errno;
		goto out_free;
	}
	r = setup_ring(e);
	e->uring = r == 0;
	e->can_punch = true;
	if (e->uring) {
		struct io_uring_probe *pr = io_uring_get_probe_ring(&e->ring);

		e->can_punch = pr && io_uring_opcode_supported(
					     pr, IORING_OP_FALLOCATE);
		if (pr)
			io_uring_free_probe(pr);
	}
	if (e->uring)
		snprintf(e->name, sizeof(e->name), "io_uring");
	else
		snprintf(e->name, sizeof(e->name), "pread/pwrite (io_uring: %s)",
			 r == -ENOTSUP ? "off" : strerror(-r));
	r = sbi_thread_start(&e->completer, completer, e, "sb-io-done", -1);
	for (; r == 0 && !e->uring && e->nworkers < NWORKERS; e->nworkers++) {
		if (sbi_thread_start(&e->workers[e->nworkers], worker, e,
				     "sb-io", -1) < 0)
			break;	/* fewer workers will do */
	}
	if (r < 0) {
		*err = r;
		goto out_ring;
	}
	if (!e->uring && e->nworkers == 0) {
		sbi_io_destroy(e);
		*err = -EAGAIN;
		return NULL;
	}
	return e;
out_ring:
	if (e->uring)
		io_uring_queue_exit(&e->ring);
	close(e->wake_fd);
out_free:
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->work_cond);
	free(e);
	return NULL;
}

/* Waits for every request in flight to finish (their done() run). */
void sbi_io_destroy(struct sbi_io_engine *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	e->stopping = true;
	pthread_cond_broadcast(&e->work_cond);
	pthread_mutex_unlock(&e->lock);
	wake_completer(e);
	pthread_join(e->completer, NULL);
	for (int i = 0; i < e->nworkers; i++)
		pthread_join(e->workers[i], NULL);
	if (e->uring)
		io_uring_queue_exit(&e->ring);
	close(e->wake_fd);
	if (e->bounce)
		munmap(e->bounce, (size_t)e->nbounce * e->bounce_size);
	while (e->slabs) {
		struct slab *s = e->slabs;

		e->slabs = s->next;
		sbi_meta_free(s, sizeof(*s));
	}
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->work_cond);
	free(e);
}
