/* SPDX-License-Identifier: MIT */
/*
 * The first access to newly placed pages, paid in the background. On a VM
 * that shadows the guest's page tables (PVM: the AMD EPYC hosts of this
 * kind), the first access to each 4 KiB after its page-table entry was
 * written costs 6-14 us inside the hypervisor: no fault, no context switch,
 * nothing the guest can count. A KV cache writing 72 regions paid it on
 * every step (36 new 4 KiB a step, 0.3-0.8 ms; 4009 of 8192 steps over
 * 0.5 ms in bench/kv). The shadow entries belong to the process, not to
 * the CPU: once the ready thread has read one byte of each 4 KiB, the
 * owner's first write costs 0.03-0.04 us. Without shadow paging a touch is
 * 64 cache misses per 256 KiB page.
 *
 * Placements queue their pages here (sb_buf_map, the growth watches,
 * served prefetches, the fault handler's zero-fills); the ready thread
 * touches them when it has nothing else to do, a chunk at a time: placing
 * the next pages, which saves a fault, and refilling the reserve come
 * first. A machine where the ready
 * thread cannot keep up leaves the rest to the owner, spread over its
 * writes as before. Requests are advice: a full queue drops them, unmap
 * and destroy cancel them (sbi_prefetch_cancel, which owns the in-flight
 * handshake, pf_inflight: they wait for a touch of the buffer in flight).
 *
 * The read itself holds no lock (internal.h: the library never touches
 * registered memory holding one), yet it must never fault: this thread
 * takes no signals, and a page that cannot be read back (a failed
 * page-in poisons it: SIGBUS, or SIGSEGV while its new mapping is being
 * set up) would kill the process. The owner's own unplacing (unmap,
 * evict, destroy) cannot race it: each cancels first, and every request
 * is queued before the owner can see the placement (the fault handler
 * queues before its wake-up). The pool's clock, the only other unplacer,
 * skips the page being read (pool->touch_addr), and maps it again should
 * the kernel have dropped its entries (evict.c).
 */
#include "internal.h"
#include "tsan.h"

#include <unistd.h>

/* Bytes touched per turn: 4 reads of 4 KiB, 30-60 us on a shadow-paging
 * VM, what an owner's sb_buf_map on the buffer may wait for. */
#define CHUNK (16u << 10)

void sbi_touch_queue(struct sb_buf *buf, size_t first, size_t end)
{
	struct sb_pool *pool = buf->pool;
	uint32_t next;
	bool idle;

	if (first >= end || !pool->touch_placed)
		return;
	pthread_mutex_lock(&pool->pf_lock);
	next = (pool->tq_tail + 1) % SBI_TOUCH_MAX;
	/* Not while a thread changes the buffer's mappings
	 * (sbi_bg_quiet_begin): the page may be unplaced before the read. */
	if (next != pool->tq_head && !buf->bg_quiet) {
		pool->tq[pool->tq_tail] = (struct sbi_touch){buf, first, end, 0};
		pool->tq_tail = next;
	}
	/* Read under pf_lock, which the ready thread holds to set it and
	 * look at the queue (sbi_touch_set_idle): one sees the other. */
	idle = __atomic_load_n(&pool->ready_idle, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&pool->pf_lock);
	/* A ready thread asleep for long would touch them too late. */
	if (idle) {
		pthread_mutex_lock(&pool->lock);
		if (pool->ready_idle)
			pthread_cond_signal(&pool->ready_cond);
		pthread_mutex_unlock(&pool->lock);
	}
}

bool sbi_touch_set_idle(struct sb_pool *pool, bool idle)
{
	bool pending;

	pthread_mutex_lock(&pool->pf_lock);
	__atomic_store_n(&pool->ready_idle, idle, __ATOMIC_RELAXED);
	pending = pool->tq_head != pool->tq_tail;
	pthread_mutex_unlock(&pool->pf_lock);
	return pending;
}

void sbi_touch_cancel(struct sb_buf *buf, size_t first, size_t end)
{
	struct sb_pool *pool = buf->pool;
	uint32_t w = pool->tq_head;

	SBI_HELD(&pool->pf_lock);
	for (uint32_t r = pool->tq_head; r != pool->tq_tail;
	     r = (r + 1) % SBI_TOUCH_MAX)
		if (pool->tq[r].buf != buf || pool->tq[r].end <= first ||
		    end <= pool->tq[r].first) {
			pool->tq[w] = pool->tq[r];
			w = (w + 1) % SBI_TOUCH_MAX;
		}
	pool->tq_tail = w;
}

/* Test hook: the next `count` touches wait `us` between finding their
 * page placed and reading it; returns how many such waits have begun and,
 * in *read, how many touches read their page after one. */
static _Atomic unsigned test_delay_us, test_delay_count, test_delays,
	test_delays_read;

unsigned sbi_test_touch_delay(unsigned us, unsigned count, unsigned *read);
unsigned sbi_test_touch_delay(unsigned us, unsigned count, unsigned *read)
{
	if (count) {
		atomic_store(&test_delay_us, us);
		atomic_store(&test_delay_count, count);
	}
	if (read)
		*read = atomic_load(&test_delays_read);
	return atomic_load(&test_delays);
}

static bool test_delay(void)
{
	if (!sbi_test_take(&test_delay_count))
		return false;
	atomic_fetch_add(&test_delays, 1);
	usleep(atomic_load(&test_delay_us));
	return true;
}

/* Read bytes [off, off + len) of page idx once a 4 KiB, if it is placed.
 * The buffer stays alive meanwhile (pf_inflight). */
static bool touch(struct sb_buf *buf, size_t idx, size_t off, size_t len)
{
	struct sb_pool *pool = buf->pool;
	const char *p = buf->base + (idx << pool->page_shift);
	unsigned sum = 0;
	bool placed, delayed;

	pthread_rwlock_rdlock(&pool->layout);
	pthread_mutex_lock(&buf->lock);
	placed = sbi_pte_has_page(buf->pte[idx]) &&
		 !(buf->pte[idx] & SBI_PTE_POISON);
	/* Kept from the clock until read (sbi_evict_cold): the read never
	 * faults. */
	if (placed)
		__atomic_store_n(&pool->touch_addr, (uintptr_t)p,
				 __ATOMIC_RELAXED);
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);
	if (!placed)
		return false;
	delayed = test_delay();
	SBI_TOUCH_BEGIN();
	for (size_t o = off; o < off + len; o += 4096)
		sum += (unsigned char)__atomic_load_n(p + o, __ATOMIC_RELAXED);
	SBI_TOUCH_END();
	__atomic_store_n(&pool->touch_addr, 0, __ATOMIC_RELEASE);
	if (delayed)
		atomic_fetch_add(&test_delays_read, 1);
	(void)sum;
	return true;
}

/*
 * One chunk of the oldest request, which then goes to the back of the
 * queue: requests advance together, a chunk each per round. A KV cache
 * writes every region at the same offset, so the front of every page
 * queued is touched before the back of any.
 */
bool sbi_touch_serve(struct sb_pool *pool)
{
	struct sbi_touch t;
	size_t len;

	SBI_HELD(&pool->lock);
	pthread_mutex_lock(&pool->pf_lock);
	if (pool->tq_head == pool->tq_tail) {
		pthread_mutex_unlock(&pool->pf_lock);
		return false;
	}
	t = pool->tq[pool->tq_head];
	pool->tq_head = (pool->tq_head + 1) % SBI_TOUCH_MAX;
	pool->pf_inflight = t.buf;	/* unmap and destroy wait for it */
	pthread_mutex_unlock(&pool->pf_lock);
	pthread_mutex_unlock(&pool->lock);

	len = pool->page_size - t.off < CHUNK ? pool->page_size - t.off : CHUNK;
	if (!touch(t.buf, t.first, t.off, len)) {
		t.off = 0;	/* unplaced meanwhile: on to the next page */
		t.first++;
	} else if ((t.off += len) >= pool->page_size) {
		sbi_count(&pool->n_touched, 1);
		t.off = 0;
		t.first++;
	}

	pthread_mutex_lock(&pool->pf_lock);
	/* Back of the queue, unless done (a cancel waiting for pf_inflight
	 * drops it once woken). */
	if (t.first < t.end &&
	    (pool->tq_tail + 1) % SBI_TOUCH_MAX != pool->tq_head) {
		pool->tq[pool->tq_tail] = t;
		pool->tq_tail = (pool->tq_tail + 1) % SBI_TOUCH_MAX;
	}
	pool->pf_inflight = NULL;
	pthread_cond_broadcast(&pool->pf_cond);
	pthread_mutex_unlock(&pool->pf_lock);
	pthread_mutex_lock(&pool->lock);
	return true;
}
