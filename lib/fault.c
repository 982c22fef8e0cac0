/* SPDX-License-Identifier: MIT */
/*
 * The fault-handler thread: the GPU MMU's part. It reads fault messages
 * from the pool's userfaultfd and, for each:
 *
 *   missing page (a touch of an unplaced page of a non-strict buffer)
 *     1. look the address up in the registry (reg_lock, read);
 *     2. lock the buffer; if a racing map or fault placed the page
 *        meanwhile, just wake the thread;
 *     3. take a ready page from the pool, continuing the buffer's heap run;
 *     4. map it over the page (MAP_FIXED | MAP_POPULATE) and wake.
 *     If the budget (or memory) says no, poison the page: the thread gets
 *     SIGBUS, never a hang and never a silent zero page.
 *
 *   write-protect fault (the first write to a shared page)
 *     if other buffers still hold the page, copy it into a new pool page
 *     (through the heaps' own mappings, never the registered range) and
 *     map the copy; if this buffer is the last holder, just lift the
 *     protection. If no page can be had, writes to it raise SIGBUS.
 *
 * The thread touches no registered memory and takes only locks that a
 * thread stopped on a fault cannot hold (see internal.h). Strict buffers
 * are registered with the SIGBUS uffd and never reach this thread.
 */
#include "internal.h"
#include "trace.h"
#include "uffd_compat.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/*
 * A minor fault on a placed page: its mapping is one that eviction
 * registered before its write-out failed, and the kernel has since dropped
 * its page-table entries (swap, MADV_PAGEOUT, MADV_DONTNEED). The data is
 * in the heap: map it again. Waking alone would fault forever.
 */
static void service_minor_placed(struct sb_pool *pool, struct sb_buf *buf,
				 size_t idx)
{
	(void)pool;
	if (sbi_vma_continue(buf, idx) < 0)
		sbi_vma_place(buf, idx, 1, sbi_pte_page(buf->pte[idx]),
			      buf->flags & SBI_BUF_RO);
	sbi_vma_wake(buf, idx);
}

/*
 * No page for idx, the budget held by reads and writes in flight
 * (prefetches, read-ahead, other threads' evictions): their pages can go
 * once done, and a read's completion needs this buffer's lock, held here.
 * So the thread is left waiting, to fault again once one of them has
 * finished, rather than SIGBUS; a page-in's fault does the same
 * (sbi_pagein_fault). false: nothing in flight, fail now.
 */
static bool retry_after_io(struct sb_pool *pool, struct sb_buf *buf,
			   size_t idx, int r)
{
	struct sbi_disk *d = sbi_disk_peek(pool);

	return r == -ENOMEM && d &&
	       sbi_io_wake_later(d->io, pool->uffd,
				 (uintptr_t)buf->base +
					 (idx << pool->page_shift),
				 pool->page_size);
}

static void service_missing(struct sb_pool *pool, struct sb_buf *buf,
			    size_t idx, bool minor)
{
	uint64_t *pte = &buf->pte[idx];
	sbi_ptref hint = idx ? sbi_pte_ref(pte[-1]) : SBI_NOPAGE;
	sbi_pid pid;
	int r;

	if (sbi_pte_has_page(*pte)) {
		if (minor)
			service_minor_placed(pool, buf, idx);
		else
			sbi_vma_wake(buf, idx);	/* lost a race: placed */
		return;
	}
	if (*pte & SBI_PTE_DISK) {
		/* Read it in (the thread waits for the read), or wait for
		 * the read already in flight. */
		sbi_pagein_fault(buf, idx);
		return;
	}
	if (*pte & (SBI_PTE_KEEP | SBI_PTE_IOERR)) {
		/* Its read failed (a message that raced the poisoning, or a
		 * poison that did not hold): SIGBUS again, never a zero
		 * page where there was data. */
		r = -EIO;
		goto fail;
	}
	if (buf->flags & SB_BUF_STRICT) {
		/* Reached us only because a page was evicted here once. */
		r = -EFAULT;
		goto fail;
	}
	/* A growing buffer's owner that outran its watch: a ready page from
	 * elsewhere rather than one zeroed here (pool.c, steal_ready). */
	r = sbi_alloc(pool, buf, hint, 1, &pid,
		      sbi_grow_urgent(buf, idx) ? SBI_ALLOC_URGENT : 0, buf,
		      true);
	if (r == 0) {
		sbi_vma_fg_begin(pool);	/* a thread waits for this */
		r = sbi_vma_place(buf, idx, 1, pid, buf->flags & SBI_BUF_RO);
		sbi_vma_fg_end(pool);
		if (r < 0)
			sbi_pool_put1(pool, pid);
	}
fail:
	if (r < 0 && !(buf->flags & SB_BUF_STRICT) &&
	    retry_after_io(pool, buf, idx, r))
		return;
	if (r < 0) {
		sbi_sigbus_note(buf, idx, r, "fault");
		if (sbi_vma_poison(buf, idx) == 0)
			*pte |= SBI_PTE_POISON;
		return;
	}
	*pte = sbi_pte_placed(pid);
	buf->nplaced++;
	if (idx + 1 > buf->grow_hi)
		buf->grow_hi = idx + 1;
	sbi_rmap_note(buf, idx, pid);
	atomic_fetch_add_explicit(&pool->n_fault_places, 1,
				  memory_order_relaxed);
	/* The rest of the page, queued before the wake: the woken owner's
	 * unmap or destroy must find the request to cancel it. */
	sbi_touch_queue(buf, idx, idx + 1);
	sbi_vma_wake(buf, idx);
	sbi_grow_note(buf, idx);	/* after the wake: off its path */
}

static void service_wp(struct sb_pool *pool, struct sb_buf *buf, size_t idx,
		       uint32_t tid)
{
	uint64_t *pte = &buf->pte[idx];
	sbi_pid old, pid;
	int r;

	if (!sbi_pte_has_page(*pte)) {
		/* Evicted meanwhile: the retry faults as missing. */
		sbi_vma_wake(buf, idx);
		return;
	}
	if (*pte & SBI_PTE_WPFAIL) {
		/* A second message from a thread whose wait a signal (or
		 * task work) ended: its retry raises SIGBUS. Never lift the
		 * protection: the kernel lets this uffd lift the SIGBUS
		 * uffd's, and the write would land in a private copy. */
		sbi_vma_wake(buf, idx);
		return;
	}
	if (!(*pte & SBI_PTE_SHARED)) {
		/* Not shared (any more): an eviction that failed, or a
		 * stale message. Lifting the protection wakes the thread. */
		if (sbi_vma_unprotect(buf, idx, 1) < 0)
			sbi_vma_wake(buf, idx);
		return;
	}
	old = sbi_pte_page(*pte);
	if (sbi_pool_refs(pool, old) == 1) {
		/* The other holders let go: the page is ours alone. A private
		 * mapping must become a shared one again, or the kernel would
		 * copy on the next write, outside the pool. */
		if (*pte & SBI_PTE_PRIVMAP) {
			if (sbi_vma_place(buf, idx, 1, old, false) == 0) {
				*pte &= ~(SBI_PTE_SHARED | SBI_PTE_PRIVMAP);
				sbi_vma_wake(buf, idx);
				return;
			}
		} else if (sbi_vma_unprotect(buf, idx, 1) == 0) {
			*pte &= ~SBI_PTE_SHARED;
			return;
		}
	}
	/* Continue the buffer's own run if the previous page is private. */
	r = sbi_alloc(pool, buf,
		      idx && !(pte[-1] & SBI_PTE_SHARED) ? sbi_pte_ref(pte[-1])
							  : SBI_NOPAGE,
		      1, &pid, SBI_ALLOC_OVERWRITE, buf, true);
	if (r == 0) {
		memcpy(sbi_pid_mem(pool, pid), sbi_pid_mem(pool, old),
		       pool->page_size);
		sbi_pid_unmap_pool(pool, pid);
		sbi_pid_unmap_pool(pool, old);

		r = sbi_vma_place(buf, idx, 1, pid, false);
		if (r < 0)
			sbi_pool_put1(pool, pid);
	}
	if (r < 0 && retry_after_io(pool, buf, idx, r))
		return;
	if (r < 0) {
		sbi_sigbus_note(buf, idx, r, "copy-on-write");
		if (sbi_vma_wpfail(buf, idx, old, tid) == 0)
			*pte = (*pte & ~SBI_PTE_SHARED) | SBI_PTE_WPFAIL |
			       SBI_PTE_PRIVMAP;
		return;
	}
	*pte = sbi_pte_placed(pid);
	sbi_rmap_note(buf, idx, pid);
	sbi_pool_put1(pool, old);
	atomic_fetch_add_explicit(&pool->n_cow, 1, memory_order_relaxed);
	SBI_TRACE_COW(buf, idx);
	sbi_vma_wake(buf, idx);
}

static void service(struct sb_pool *pool, const struct uffd_msg *msg)
{
	uintptr_t addr = (uintptr_t)msg->arg.pagefault.address;
	uint64_t flags = msg->arg.pagefault.flags;
	struct sb_buf *buf;

	/* Counters move before any wake-up: the woken thread may read them. */
	atomic_fetch_add_explicit(&pool->n_faults, 1, memory_order_relaxed);
	pthread_rwlock_rdlock(&pool->layout);
	pthread_rwlock_rdlock(&pool->reg_lock);
	buf = sbi_pool_lookup(pool, addr);
	SBI_TRACE_FAULT(buf, addr, flags);
	if (!buf) {
		/* The buffer was destroyed meanwhile: let the thread fault
		 * again on whatever is there now. */
		sbi_vma_wake_range(pool,
				   addr & ~(uintptr_t)(pool->page_size - 1),
				   pool->page_size);
	} else {
		size_t idx = (addr - (uintptr_t)buf->base) >> pool->page_shift;

		pthread_mutex_lock(&buf->lock);
		if (flags & UFFD_PAGEFAULT_FLAG_WP)
			service_wp(pool, buf, idx,
				   msg->arg.pagefault.feat.ptid);
		else
			service_missing(pool, buf, idx,
					flags & UFFD_PAGEFAULT_FLAG_MINOR);
		pthread_mutex_unlock(&buf->lock);
	}
	pthread_rwlock_unlock(&pool->reg_lock);
	pthread_rwlock_unlock(&pool->layout);
}

/* Never leave: a handler that exits leaves faulting threads hung. */
static void backoff(const char *what)
{
	sbi_err("fault thread: %s: %s; retrying", what, strerror(errno));
	usleep(10000);
}

void *sbi_fault_thread(void *arg)
{
	struct sbi_fault_thread *self = arg;
	struct sb_pool *pool = self->pool;
	struct uffd_msg msgs[32];

	sbi_thread_internal();
	for (;;) {
		pid_t tid = 0;
		ssize_t n;
		int r = sbi_fault_wait(self);
		bool served = false;

		if (r == -ESHUTDOWN)
			break;
		if (r <= 0) {
			if (r < 0) {
				errno = -r;
				backoff("waiting for faults");
			}
			continue;
		}
		n = read(pool->uffd, msgs, sizeof(msgs));
		if (n < 0) {
			if (errno != EAGAIN && errno != EINTR)
				backoff("read");
			continue;
		}
		for (size_t i = 0; i < (size_t)n / sizeof(msgs[0]); i++) {
			switch (msgs[i].event) {
			case UFFD_EVENT_PAGEFAULT:
				service(pool, &msgs[i]);
				tid = (pid_t)msgs[i].arg.pagefault.feat.ptid;
				served = true;
				break;
			default:
				/* No non-cooperative event is enabled. */
				sbi_warn("unexpected userfaultfd event %u",
					 msgs[i].event);
				break;
			}
		}
		/* After the wake-ups: off the faulting thread's path. */
		if (served)
			sbi_fault_served(self, tid, r == 2);
	}
	return NULL;
}

/* CPUs this process may run on, in order, at most max (0 = all). */
static int allowed_cpus(int *cpus, int max)
{
	cpu_set_t set;
	int n = 0;

	/* The process's CPUs, not the caller's: a pool created by a pinned
	 * thread still gets a handler on every CPU. */
	sbi_process_cpus(&set);
	for (int c = 0; c < CPU_SETSIZE && (max == 0 || n < max); c++)
		if (CPU_ISSET(c, &set))
			cpus[n++] = c;
	return n;
}

int sbi_fault_start(struct sb_pool *pool)
{
	int cpus[CPU_SETSIZE];
	int n, r = 0;

	n = allowed_cpus(cpus, sbi_env_fault_threads());
	if (n < 1) {
		n = 1;
		cpus[0] = -1;
	}
	pool->faulters = calloc((size_t)n, sizeof(*pool->faulters));
	if (!pool->faulters)
		return -ENOMEM;
	/* All set before any starts: a handler steers them all. */
	for (int i = 0; i < n; i++) {
		pool->faulters[i].pool = pool;
		pool->faulters[i].cpu = n > 1 ? cpus[i] : -1;
	}
	pool->nwaiters = n;
	pool->fault_kick = -1;
	sbi_fault_wait_init(pool);
	for (pool->nfault = 0; pool->nfault < n; pool->nfault++) {
		struct sbi_fault_thread *t = &pool->faulters[pool->nfault];
		char name[16];

		snprintf(name, sizeof(name), "sb-fault/%d", t->cpu);
		r = sbi_thread_start(&t->thread, sbi_fault_thread, t, name,
				     t->cpu);
		if (r < 0)
			break;
	}
	if (r < 0) {
		sbi_fault_stop(pool);
		return r;
	}
	return 0;
}

void sbi_fault_stop(struct sb_pool *pool)
{
	uint64_t one = 1;

	if (!pool->faulters)
		return;
	/* The eventfd stays readable: every handler sees it and leaves. */
	if (write(pool->quit_fd, &one, sizeof(one)) < 0)
		abort();
	for (int i = 0; i < pool->nfault; i++)
		pthread_join(pool->faulters[i].thread, NULL);
	sbi_fault_wait_fini(pool);
	free(pool->faulters);
	pool->faulters = NULL;
	pool->nfault = pool->nwaiters = 0;
}
