/* SPDX-License-Identifier: MIT */
/*
 * The I/O engine's deferred wake-ups (sbi_io_wake_later): a fault that
 * finds the budget held by reads in flight leaves its thread stopped until
 * one of them finishes, or a millisecond or so has passed, instead of
 * waking it to fault again at once, over and over. Here a thread stops on
 * a userfaultfd page while a read from a pipe is in flight: it is woken
 * again at most about once a millisecond while the read waits, and when
 * the pipe is written and the read completes; with nothing in flight the
 * engine declines (the caller wakes the thread). (The fallback engine's
 * reads cannot wait on a pipe: with it, the test skips.)
 */
#include "harness.h"
#include "harness_internal.h"
#include "uffd_compat.h"

#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#define PG 4096

static char *page;
static _Atomic int read_done;

static bool done_cb(struct sbi_io *io)
{
	(void)io;
	atomic_store(&read_done, 1);
	return true;
}

static void *toucher(void *arg)
{
	(void)arg;
	/* Stops on the missing page until the test fills it. */
	CHECK(*(volatile char *)page == 0);
	return NULL;
}

/* A read of a page from the pipe fd into mem: in flight until the pipe
 * is written. */
static void pipe_read(struct sbi_io_engine *e, int fd, void *mem)
{
	struct sbi_io *io = sbi_io_get(e);

	CHECK(io);
	io->fd = fd;
	io->mem = mem;
	io->len = PG;
	io->done = done_cb;
	sbi_io_submit(e, &io, 1);
	CHECK(sbi_io_busy(e));
}

static double now_ms_f(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Whether a fault message arrives within ms milliseconds (and take it). */
static bool fault_within(int uffd, int ms)
{
	struct pollfd p = {.fd = uffd, .events = POLLIN};
	struct uffd_msg msg;

	if (poll(&p, 1, ms) != 1)
		return false;
	CHECK(read(uffd, &msg, sizeof(msg)) == sizeof(msg));
	CHECK(msg.event == UFFD_EVENT_PAGEFAULT);
	CHECK((msg.arg.pagefault.address & ~(uint64_t)(PG - 1)) ==
	      (uintptr_t)page);
	return true;
}

static int child(const char *name)
{
	(void)name;
	return 1;	/* none */
}

static int main_test(void)
{
	struct uffdio_api api = {.api = UFFD_API};
	struct uffdio_register reg;
	struct uffdio_zeropage zp;
	struct sbi_io_engine *e;
	pthread_t t;
	void *mem;
	int uffd, fds[2], err = 0;

	uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0)
		SKIP("userfaultfd unavailable: %s", strerror(errno));
	CHECK(ioctl(uffd, UFFDIO_API, &api) == 0);
	page = mmap(NULL, PG, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(page != MAP_FAILED);
	reg = (struct uffdio_register){
		.range = {.start = (uintptr_t)page, .len = PG},
		.mode = UFFDIO_REGISTER_MODE_MISSING};
	CHECK(ioctl(uffd, UFFDIO_REGISTER, &reg) == 0);

	e = sbi_io_create(&err);
	CHECK(e);
	if (strcmp(sbi_io_name(e), "io_uring") != 0)
		SKIP("needs io_uring, for a read that waits on a pipe (%s)",
		     sbi_io_name(e));

	/* Nothing in flight: the caller must wake the thread itself. */
	CHECK(!sbi_io_wake_later(e, uffd, (uintptr_t)page, PG));

	/* A read that stays in flight until the pipe is written. */
	CHECK(pipe(fds) == 0);
	CHECK(posix_memalign(&mem, PG, PG) == 0);
	pipe_read(e, fds[0], mem);

	CHECK(pthread_create(&t, NULL, toucher, NULL) == 0);
	CHECK(fault_within(uffd, 5000));
	/* While the read is in flight, a fault left waiting each time it
	 * comes back is woken again a millisecond or two later, not at once
	 * (woken at once, it would fault back tens of thousands of times in
	 * these 300 ms). */
	{
		double t0 = now_ms_f(), t1;
		long n = 0;

		do {
			CHECK(sbi_io_wake_later(e, uffd, (uintptr_t)page, PG));
			CHECK(fault_within(uffd, 5000));
			n++;
		} while ((t1 = now_ms_f()) - t0 < 300);
		printf("%ld wake-ups in %.0f ms with a read in flight\n", n,
		       t1 - t0);
		CHECK(n >= 2 && n <= (long)(t1 - t0) + 5);
	}
	CHECK(sbi_io_wake_later(e, uffd, (uintptr_t)page, PG));

	/* The read finishes: the thread is woken and faults again. */
	CHECK(write(fds[1], "x", 1) == 1);
	CHECK(fault_within(uffd, 5000));
	for (int i = 0; i < 500 && !atomic_load(&read_done); i++)
		usleep(10000);
	CHECK(atomic_load(&read_done));
	for (int i = 0; i < 500 && sbi_io_wakes_pending(e); i++)
		usleep(10000);	/* made after its done() */
	CHECK(sbi_io_wakes_pending(e) == 0);
	for (int i = 0; i < 500 && sbi_io_busy(e); i++)
		usleep(10000);	/* counted after its done() */
	CHECK(!sbi_io_busy(e));
	CHECK(!sbi_io_wake_later(e, uffd, (uintptr_t)page, PG));

	/* Let the thread go. */
	zp = (struct uffdio_zeropage){
		.range = {.start = (uintptr_t)page, .len = PG}};
	CHECK(ioctl(uffd, UFFDIO_ZEROPAGE, &zp) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	sbi_io_destroy(e);
	free(mem);
	close(fds[0]);
	close(fds[1]);
	close(uffd);
	printf("PASS: a fault's wake-up waits for the read in flight\n");
	return 0;
}
