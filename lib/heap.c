/* SPDX-License-Identifier: MIT */
/*
 * One placement heap: a memfd of heap_size bytes, cut into pages, with a
 * pool-side mapping through which the library copies, checks and does I/O
 * on pages. Zeroing goes through the file (on hugetlbfs, which has no
 * write(2), through fallocate and the pool-side mapping). The pool side
 * keeps at most 2 MiB of page-table entries per heap between operations
 * (a huge-page heap: the pages zeroed since the last sweep), for at most
 * 100 ms (sbi_heap_unmap_pool). The pool-side mapping is never
 * registered with userfaultfd, so the handler thread may touch it. The
 * file comes from the pool's page source (source.c): the process's own
 * memfd (shmem or hugetlbfs), or a daemon's lease.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

static int heap_bind(char *map, size_t len, int node)
{
	unsigned long mask[64] = {0};

	if (node < 0 || numa_available() < 0)
		return 0;
	mask[node / (8 * sizeof(long))] |= 1ul << (node % (8 * sizeof(long)));
	/* On a shmem mapping this sets the file's shared policy: pages are
	 * allocated on the node whichever mapping or fallocate faults them. */
	if (mbind(map, len, MPOL_BIND, mask, sizeof(mask) * 8, 0) < 0)
		return -errno;
	return 0;
}

/* The heap's struct and its per-page tables, in one mapping: create and
 * destroy must agree on its size, or every heap released leaks a mapping. */
static size_t meta_bytes(uint32_t npages)
{
	return sizeof(struct sbi_heap) +
	       (size_t)npages * (sizeof(uintptr_t) + 2 * sizeof(uint32_t) + 2);
}

/* The struct over fd's bytes from off, mapped (fd not closed on failure). */
static struct sbi_heap *heap_map(int fd, off_t off, size_t bytes,
				 size_t page_size, bool hugetlb, int *err)
{
	uint32_t npages = (uint32_t)(bytes / page_size);
	struct sbi_heap *h = sbi_meta_alloc(meta_bytes(npages), true);

	if (!h) {
		*err = -ENOMEM;
		return NULL;
	}
	h->fd = fd;
	h->foff = off;
	h->npages = npages;
	h->raddr = (uintptr_t *)(h + 1);
	h->refs = (uint32_t *)(h->raddr + npages);
	h->owner = h->refs + npages;
	h->state = (uint8_t *)(h->owner + npages);
	h->rbit = h->state + npages;
	h->hugetlb = hugetlb;
	/* Without MAP_NORESERVE, a hugetlbfs mapping would reserve every
	 * huge page of the heap at once, used or not. */
	h->map = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		      MAP_SHARED | (hugetlb ? MAP_NORESERVE : 0), fd, off);
	if (h->map == MAP_FAILED) {
		*err = -errno;
		sbi_meta_free(h, meta_bytes(npages));
		return NULL;
	}
	madvise(h->map, bytes, MADV_DONTFORK);
	return h;
}

struct sbi_heap *sbi_heap_create(const struct sbi_page_source *src,
				 size_t heap_size, size_t page_size,
				 int numa_node, int *err)
{
	struct sbi_heap *h;
	int fd, r;

	fd = src->ops->heap_fd(src->ctx, heap_size);
	if (fd < 0) {
		*err = fd;
		return NULL;
	}
	h = heap_map(fd, 0, heap_size, page_size, src->ops->hugetlb, err);
	if (!h)
		goto fail;
	r = heap_bind(h->map, heap_size, numa_node);
	if (r < 0) {
		*err = r;
		munmap(h->map, heap_size);
		sbi_meta_free(h, meta_bytes(h->npages));
		goto fail;
	}
	return h;
fail:
	src->ops->heap_release(src->ctx, fd, heap_size);
	close(fd);
	return NULL;
}

struct sbi_heap *sbi_heap_import(int fd, off_t off, size_t bytes,
				 size_t page_size, bool hugetlb, int *err)
{
	struct sbi_heap *h = heap_map(fd, off, bytes, page_size, hugetlb, err);

	if (!h) {
		close(fd);
		return NULL;
	}
	h->foreign = true;
	h->nused = h->npages;
	memset(h->state, SBI_PG_FOREIGN, h->npages);
	return h;
}

void sbi_heap_destroy(const struct sbi_page_source *src, struct sbi_heap *h,
		      size_t page_size)
{
	size_t heap_size = (size_t)h->npages * page_size;

	munmap(h->map, heap_size);
	if (h->fill)
		munmap(h->fill, heap_size);
	if (!h->foreign)
		src->ops->heap_release(src->ctx, h->fd, heap_size);
	close(h->fd);
	sbi_meta_free(h, meta_bytes(h->npages));
}

/* Where page idx starts in the heap's file: an imported window (import.c)
 * begins at foff, a heap of our own at 0. */
static off_t page_off(const struct sbi_heap *h, uint32_t idx, size_t page_size)
{
	return (off_t)h->foff + (off_t)((size_t)idx * page_size);
}

/* Never written: the zero page backs it, and every pwrite reads the same
 * cache-hot 4 KiB. */
static char zeros[64 << 10];

/*
 * hugetlbfs has no write(2). A huge page is allocated, and zeroed by the
 * kernel, by fallocate, which leaves a page that has memory as it is; out
 * of huge pages it fails with ENOSPC. It also fails with EINTR when the
 * calling thread has a signal pending as it starts a page (an application
 * thread placing a page, under a profiler's timer): tried again, as a
 * pwrite would be.
 */
static int huge_alloc(struct sbi_heap *h, off_t off, size_t len)
{
	while (fallocate(h->fd, FALLOC_FL_KEEP_SIZE, off, (off_t)len) < 0)
		if (errno != EINTR)
			return errno == ENOSPC ? -ENOMEM : -errno;
	return 0;
}

/* A huge page's bytes written through the pool's mapping: allocated first,
 * since a store to a hole of a MAP_NORESERVE mapping with no huge page
 * free would raise SIGBUS. Not punched and allocated again to zero it: in
 * between, another process could take the page. The pool-side entry (one
 * per huge page) goes at the ready thread's next sweep, within 100 ms,
 * not at once: a sweep per page would interrupt the other CPU each time
 * (sbi_heap_unmap_pool). */
static int huge_write(struct sbi_heap *h, off_t off, const void *src,
		      size_t len, size_t alloc)
{
	int r = huge_alloc(h, off, alloc);

	if (r < 0)
		return r;
	if (src)
		memcpy(h->map + (off - h->foff), src, len);
	else
		memset(h->map + (off - h->foff), 0, len);
	atomic_fetch_add_explicit(&h->pool_ptes, 1, memory_order_relaxed);
	return 0;
}

int sbi_heap_zero(struct sbi_heap *h, uint32_t idx, uint32_t n,
		  size_t page_size)
{
	struct iovec iov[16];
	size_t len = (size_t)n * page_size;
	off_t off = page_off(h, idx, page_size);

	if (h->hugetlb)
		return huge_write(h, off, NULL, len, len);

	/* Through the file rather than a mapping (measured on an AMD EPYC
	 * VM, 256 KiB pages: 80-105 us a page against 130-250 us for
	 * fallocate and MADV_POPULATE_WRITE, and the later placement costs
	 * the same, 22-39 us): no fault per 4 KiB, no page-table entry on
	 * the pool's side (RSS counts a placed page once), and no mmap lock,
	 * which a thread preempted while holding it would make every
	 * placement in the process wait for. shmem allocates what has no
	 * memory (under the heap's NUMA policy) and overwrites what has. */
	for (int k = 0; k < 16; k++)
		iov[k] = (struct iovec){zeros, sizeof(zeros)};
	while (len) {
		size_t want = len < sizeof(iov) / sizeof(iov[0]) * sizeof(zeros)
				      ? len
				      : sizeof(iov) / sizeof(iov[0]) * sizeof(zeros);
		int cnt = (int)((want + sizeof(zeros) - 1) / sizeof(zeros));
		ssize_t w;

		iov[cnt - 1].iov_len = want - (size_t)(cnt - 1) * sizeof(zeros);
		w = pwritev(h->fd, iov, cnt, off);
		iov[cnt - 1].iov_len = sizeof(zeros);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 && errno != ENOSPC ? -errno : -ENOMEM;
		off += w;
		len -= (size_t)w;
	}
	return 0;
}

int sbi_heap_write(struct sbi_heap *h, uint32_t idx, const void *src,
		   size_t len, size_t page_size)
{
	off_t off = page_off(h, idx, page_size);
	size_t done = 0;

	if (h->hugetlb)
		return huge_write(h, off, src, len, page_size);
	while (done < len) {
		ssize_t w = pwrite(h->fd, (const char *)src + done, len - done,
				   off + (off_t)done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 && errno != ENOSPC ? -errno : -ENOMEM;
		done += (size_t)w;
	}
	return 0;
}

int sbi_heap_crc32c(const struct sbi_heap *h, uint32_t idx, size_t len,
		    size_t page_size, void *scratch, size_t n, uint32_t *crc)
{
	uint64_t off = (uint64_t)page_off(h, idx, page_size);
	uint32_t c = 0;

	for (size_t done = 0; done < len; done += n) {
		size_t want = len - done < n ? len - done : n;
		int r = sbi_file_read_all(h->fd, scratch, want, off + done);

		if (r < 0)
			return r;
		c = sbi_crc32c_update(c, scratch, want);
	}
	*crc = c;
	return 0;
}

int sbi_heap_back(struct sbi_heap *h, uint32_t idx, uint32_t n,
		  size_t page_size, bool big_folios)
{
	off_t off = page_off(h, idx, page_size);
	off_t end = off + (off_t)((size_t)n * page_size);

	if (h->hugetlb)	/* no folio smaller than a page, nothing to split */
		return huge_alloc(h, off, (size_t)(end - off));

	/* An unbacked page reads as zeros: a hole, or the zeroed part of
	 * a large folio whose other pages hold memory (a punch that cannot
	 * split the folio zeroes the range instead, and a folio allocated
	 * for a neighbour's write is zero where it was not written). In
	 * the latter case its memory is there already: writing zeros would
	 * only hold the folio's lock, which every placement of the folio's
	 * other pages (MAP_POPULATE) then waits for. */
	if (big_folios && lseek(h->fd, off, SEEK_HOLE) >= end)
		return 0;
	return sbi_heap_zero(h, idx, n, page_size);
}

/*
 * The pool side's entries go in sweeps of the whole mapping rather than a
 * madvise per page: every madvise that drops entries ends with a TLB
 * shootdown, an IPI to each other CPU running one of the process's threads,
 * which costs 15-20 us in the VMs measured (2 us without another thread
 * running): more than reading the page in. A sweep every 2 MiB of pages
 * costs one. Between sweeps up to 2 MiB per heap is mapped twice (RSS counts
 * it twice); the ready thread sweeps every heap each 100 ms, so the excess
 * does not outlast a burst.
 */
void sbi_heap_unmap_pool(struct sbi_heap *h, size_t page_size)
{
	uint32_t batch = (uint32_t)(SBI_POOL_SWEEP_BYTES / page_size);
	uint32_t noted = atomic_fetch_add_explicit(&h->pool_ptes, 1,
						   memory_order_relaxed) +
			 1;

	if (noted >= (batch ? batch : 1))
		sbi_heap_sweep_pool(h, page_size);
}

void sbi_heap_sweep_pool(struct sbi_heap *h, size_t page_size)
{
	if (atomic_load_explicit(&h->pool_ptes, memory_order_relaxed) &&
	    atomic_exchange_explicit(&h->pool_ptes, 0, memory_order_relaxed)) {
		madvise(h->map, (size_t)h->npages * page_size, MADV_DONTNEED);
		if (h->fill)	/* a clean home's copy-ins (home.c) */
			madvise(h->fill, (size_t)h->npages * page_size,
				MADV_DONTNEED);
	}
}

void sbi_heap_punch(struct sbi_heap *h, uint32_t idx, uint32_t n,
		    size_t page_size)
{
	fallocate(h->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		  page_off(h, idx, page_size), (off_t)((size_t)n * page_size));
}
