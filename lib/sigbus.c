/* SPDX-License-Identifier: MIT */
/*
 * A page that could not be given (no memory, the budget, a failed read)
 * answers its touch with SIGBUS: counted, and said once a second at most
 * without SPARSEBUF_LOG, so a program killed by it says why. Used by the
 * fault path and the page-ins alike, below both.
 */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <time.h>

void sbi_sigbus_note(struct sb_buf *buf, size_t idx, int err,
		     const char *what)
{
	struct sb_pool *pool = buf->pool;
	uint64_t n;
	bool at_budget, machine;

	/* Counted before the wake-up: the thread may look at once. */
	n = atomic_fetch_add_explicit(&pool->n_sigbus, 1,
				      memory_order_relaxed) + 1;
	sbi_debug("%s at page %zu of buffer %u: %s: SIGBUS", what, idx,
		  buf->id, strerror(-err));
	if (err != -ENOMEM)
		return;	/* I/O errors are logged where they happen */
	/* A program killed by SIGBUS should say why without SPARSEBUF_LOG:
	 * the first one, then at most one line a second. */
	if (!sbi_log_gate(SBI_LOG_WARN, &pool->sigbus_log_ms))
		return;
	pthread_mutex_lock(&pool->lock);
	at_budget = pool->used >= pool->max_pages;
	/* A client below its own max_bytes: the machine's budget is out. */
	machine = pool->client && pool->max_pages < pool->ceiling_pages;
	pthread_mutex_unlock(&pool->lock);
	if (!at_budget && pool->hugetlb)
		sbi_warn("pool %u: SIGBUS (%s at page %zu of buffer %u): no "
			 "huge page free (HugePages_Free in /proc/meminfo; "
			 "vm.nr_hugepages reserves them) and %s (%llu SIGBUS "
			 "so far)",
			 pool->id, what, idx, buf->id,
			 atomic_load(&pool->n_evictable)
				 ? "none the pool held could be freed"
				 : "no buffer is SB_BUF_EVICTABLE or a file's",
			 (unsigned long long)n);
	else if (!at_budget)
		sbi_warn("pool %u: SIGBUS (%s at page %zu of buffer %u): no "
			 "memory for a page, or no mapping for it "
			 "(vm.max_map_count) (%llu SIGBUS so far)",
			 pool->id, what, idx, buf->id, (unsigned long long)n);
	else if (machine)
		sbi_warn("pool %u: SIGBUS (%s at page %zu of buffer %u): the "
			 "machine's budget (sparsebufd) is in use, no other "
			 "process had pages to give back, and %s (%llu SIGBUS "
			 "so far)",
			 pool->id, what, idx, buf->id,
			 atomic_load(&pool->n_evictable)
				 ? "no page of an evictable buffer could go "
				   "to disk"
				 : "no buffer is SB_BUF_EVICTABLE",
			 (unsigned long long)n);
	else
		sbi_warn("pool %u: SIGBUS (%s at page %zu of buffer %u): the "
			 "budget of %zu KiB (max_bytes, SPARSEBUF_MAX_BYTES) is "
			 "in use and %s (%llu SIGBUS so far)",
			 pool->id, what, idx, buf->id, pool->max_bytes >> 10,
			 atomic_load(&pool->n_evictable)
				 ? "no page of an evictable buffer could go "
				   "to disk"
				 : "no buffer is SB_BUF_EVICTABLE",
			 (unsigned long long)n);
}

