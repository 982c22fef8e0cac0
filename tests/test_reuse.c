/* SPDX-License-Identifier: MIT */
/*
 * The pages a buffer's run had made ready ahead of itself, when the buffer
 * goes away, are where the next run starts (pool.c, ready_site): they fill
 * the ready reserve, so the ready thread readies nothing more while they
 * sit there, and a run started elsewhere had its caller zero or allocate a
 * tenth of its pages itself (bench/place, a buffer grown right after
 * another was destroyed). The ready thread is held still once the pages
 * ahead are ready, so that only the allocator's choice decides.
 */
#include "harness.h"
#include "harness_internal.h"

#define PAGE (256 * KiB)

static int child(const char *name)
{
	(void)name;
	return 2;
}

/* Up to max ready pages whose earmark is buf's, into pids; how many. */
static size_t ready_of(struct sb_pool *p, const struct sb_buf *buf,
		       sbi_pid *pids, size_t max)
{
	size_t n = 0;

	pthread_mutex_lock(&p->lock);
	for (uint32_t s = 0; s < p->heap_hi; s++) {
		struct sbi_heap *h = p->heaps[s];

		for (uint32_t i = 0; h && i < h->npages; i++)
			if (h->state[i] == SBI_PG_READY &&
			    h->owner[i] == buf->id && n < max)
				pids[n++] = s * p->pages_per_heap + i;
	}
	pthread_mutex_unlock(&p->lock);
	return n;
}

static void next_run_takes_pages_left_ready(void)
{
	struct sb_pool *p = make_pool(PAGE, 16 * MiB, 0);
	struct sb_buf *a = make_buf(p, 1 * GiB, 0), *b;
	sbi_pid ahead[8], got;
	size_t n = 0;
	uint64_t sync0;
	bool found = false;

	/* A grows a page at a time; the ready thread readies the pages
	 * after its last one (its run's, earmarked for it). */
	for (size_t i = 0; i < 4; i++) {
		CHECK_EQ(sb_buf_map(a, i * PAGE, PAGE), 1);
		usleep(20000);
	}
	WAIT_FOR((n = ready_of(p, a, ahead, 8)) >= 1, 5.0);
	CHECK(n >= 1);
	hold_ready(p, true);
	n = ready_of(p, a, ahead, 8);
	CHECK(n >= 1);
	sb_buf_destroy(a);

	/* B's first page: one of those, taken as it is. */
	b = make_buf(p, 1 * GiB, 0);
	sync0 = stats(p).sync_prepares;
	CHECK_EQ(sb_buf_map(b, 0, PAGE), 1);
	pthread_mutex_lock(&b->lock);
	got = sbi_pte_page(b->pte[0]);
	pthread_mutex_unlock(&b->lock);
	for (size_t k = 0; k < n; k++)
		found |= ahead[k] == got;
	CHECK(found);
	CHECK_EQ(stats(p).sync_prepares, sync0);
	/* And its next pages continue the run from there. */
	CHECK_EQ(sb_buf_map(b, PAGE, PAGE), 1);
	pthread_mutex_lock(&b->lock);
	CHECK_EQ(sbi_pte_page(b->pte[1]), got + 1);
	pthread_mutex_unlock(&b->lock);
	hold_ready(p, false);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static int main_test(void)
{
	require_uffd();
	next_run_takes_pages_left_ready();
	printf("ok\n");
	return 0;
}
