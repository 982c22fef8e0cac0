/* SPDX-License-Identifier: MIT */
/*
 * Where a pool's physical pages come from: the page source. A pool asks
 * its source for heap files (each one memfd-like file it maps MAP_SHARED
 * and cuts into pages, heap.c) and gives them back when a heap is empty;
 * the source also says how many bytes the pool may hold (its budget).
 * Buffers, faults, eviction and the disk tier see only heaps and pages,
 * never the source.
 *
 * Two sources: the process's own memfds (shmem, or hugetlbfs for a pool
 * of huge pages), the budget being the pool's max_bytes; and sparsebufd (dclient.c), which owns one budget for every
 * process on the machine and passes memfds over a UNIX socket (hence
 * files, sealed against resizing: a descriptor that crossed a socket must
 * keep its size). A client pool's budget is its lease (lease.c).
 */
#include "internal.h"
#include "dproto.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the process's own memfds ------------------------------------------------ */

static int memfd_heap_fd(void *ctx, size_t bytes)
{
	(void)ctx;
	return sbd_heap_file("sparsebuf-heap", bytes, false);
}

static int hugetlb_heap_fd(void *ctx, size_t bytes)
{
	(void)ctx;
	return sbd_heap_file("sparsebuf-heap", bytes, true);
}

static void memfd_heap_release(void *ctx, int fd, size_t bytes)
{
	(void)ctx;
	/* Punched before the caller closes it: a fork()ed child that still
	 * holds the descriptor must not keep the memory alive. */
	fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
		  (off_t)bytes);
}

static size_t memfd_budget(void *ctx, size_t asked)
{
	(void)ctx;
	return asked;	/* the pool's own max_bytes, as asked */
}

static const struct sbi_page_source_ops memfd_ops = {
	.name = "memfd",
	.heap_fd = memfd_heap_fd,
	.heap_release = memfd_heap_release,
	.budget = memfd_budget,
};

/* The same on hugetlbfs (SB_POOL_HUGETLB): the pages are the system's
 * reserved huge pages, which the heaps allocate with fallocate and give
 * back with the same punch. */
static const struct sbi_page_source_ops hugetlb_ops = {
	.name = "memfd (huge pages)",
	.hugetlb = true,
	.heap_fd = hugetlb_heap_fd,
	.heap_release = memfd_heap_release,
	.budget = memfd_budget,
};

struct sbi_page_source sbi_memfd_source(bool hugetlb)
{
	return (struct sbi_page_source){hugetlb ? &hugetlb_ops : &memfd_ops,
					NULL};
}

/* ---- heaps from sparsebufd ------------------------------------------------ */

/* A heap the lease thread fetched ahead (the pool makes heaps under its
 * lock, where no round trip may happen); none at hand, or no daemon: the
 * pool makes it itself. A heap is address space: the budget is held by
 * the lease (lease.c), not by where heap files come from. */
static int daemon_heap_fd(void *ctx, size_t bytes)
{
	int fd = sbi_dclient_take_heap(ctx, bytes);

	return fd >= 0 ? fd : memfd_heap_fd(NULL, bytes);
}

static int daemon_hugetlb_heap_fd(void *ctx, size_t bytes)
{
	int fd = sbi_dclient_take_heap(ctx, bytes);

	return fd >= 0 ? fd : hugetlb_heap_fd(NULL, bytes);
}

static void daemon_heap_release(void *ctx, int fd, size_t bytes)
{
	memfd_heap_release(NULL, fd, bytes);
	sbi_dclient_heap_free(ctx, fd);
}

static size_t daemon_budget(void *ctx, size_t asked)
{
	(void)ctx;
	return asked;	/* a ceiling; the lease is what the pool may hold */
}

static const struct sbi_page_source_ops daemon_ops = {
	.name = "sparsebufd",
	.heap_fd = daemon_heap_fd,
	.heap_release = daemon_heap_release,
	.budget = daemon_budget,
};

/* The daemon's hugetlbfs memfds (the client said SBD_HELLO_HUGETLB; the
 * connection takes no other kind, dclient.c). */
static const struct sbi_page_source_ops daemon_hugetlb_ops = {
	.name = "sparsebufd (huge pages)",
	.hugetlb = true,
	.heap_fd = daemon_hugetlb_heap_fd,
	.heap_release = daemon_heap_release,
	.budget = daemon_budget,
};

struct sbi_page_source sbi_daemon_source(struct sbi_dclient *c,
					 bool hugetlb)
{
	return (struct sbi_page_source){
		hugetlb ? &daemon_hugetlb_ops : &daemon_ops, c};
}
