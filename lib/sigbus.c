/* SPDX-License-Identifier: MIT */
/*
 * A page that could not be given (no memory, the budget, a failed read)
 * answers its touch with SIGBUS: counted, and said once a second at most
 * without SPARSEBUF_LOG, so a program killed by it says why. Used by the
 * fault path and the page-ins alike, below both.
 */
#include "internal.h"

#include <stdio.h>

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
	/* Why there was no page, then what could not be freed. */
	bool evictable = atomic_load(&pool->n_evictable) != 0;
	const char *cause, *left = "";
	char budget[96];

	if (!at_budget && pool->hugetlb) {
		cause = "no huge page free (HugePages_Free in /proc/meminfo; "
			"vm.nr_hugepages reserves them)";
		left = evictable ? " and none the pool held could be freed"
				 : " and no buffer is SB_BUF_EVICTABLE or a "
				   "file's";
	} else if (!at_budget) {
		cause = "no memory for a page, or no mapping for it "
			"(vm.max_map_count)";
	} else {
		if (machine)
			cause = "the machine's budget (sparsebufd) is in use, "
				"no other process had pages to give back,";
		else {
			snprintf(budget, sizeof(budget),
				 "the budget of %zu KiB (max_bytes, "
				 "SPARSEBUF_MAX_BYTES) is in use",
				 pool->max_bytes >> 10);
			cause = budget;
		}
		left = evictable ? " and no page of an evictable buffer could "
				   "go to disk"
				 : " and no buffer is SB_BUF_EVICTABLE";
	}
	sbi_warn("pool %u: SIGBUS (%s at page %zu of buffer %u): %s%s (%llu "
		 "SIGBUS so far)",
		 pool->id, what, idx, buf->id, cause, left,
		 (unsigned long long)n);
}

