/* SPDX-License-Identifier: MIT */
/*
 * sb_buf_prefetch without WAIT on a file-backed buffer starts the reads
 * itself and hands the ready thread nothing (prefetch.c). Before, it
 * counted each range's pages with a trylock of the buffer lock, and when
 * a read's completion held that lock (one page at a time), it queued the
 * whole range for the ready thread anyway, which then placed nothing and
 * spun up to 2 ms behind the caller's unmaps (sbi_vma_bg_yield): 14% of
 * the CPU of sbflash's decode on a 2-CPU machine.
 *
 * The ready thread is held still (as sb_pool_trim does), so a request
 * queued stays there to be counted. Many one-page ranges per call keep
 * completions coming while the ranges are counted; the data read must
 * still be the file's.
 */
#include "harness.h"
#include "harness_internal.h"

#include <fcntl.h>

#define PAGE (4 * KiB)
#define RANGES 1024	/* one-page ranges per call */
#define ROUNDS 24
#define FILE_BYTES ((size_t)ROUNDS * RANGES * PAGE)	/* 96 MiB */

/* Requests queued for the ready thread now. */
static uint32_t queued(struct sb_pool *p)
{
	uint32_t n;

	pthread_mutex_lock(&p->pf_lock);
	n = (p->pf_tail + p->pf_cap - p->pf_head) % p->pf_cap;
	pthread_mutex_unlock(&p->pf_lock);
	return n;
}

static const char *make_file(void)
{
	return disk_make_file("model.bin", FILE_BYTES, 7);
}

/* The buffer's page at byte `at` holds the file's bytes. */
static bool same_as_file(struct sb_buf *b, size_t at)
{
	const uint64_t *a =
		(const uint64_t *)((const char *)sb_buf_addr(b) + at);

	for (size_t w = 0; w < PAGE / 8; w++)
		if (a[w] != disk_word(7, at / 8 + w))
			return false;
	return true;
}

static int child(const char *name)
{
	struct sb_range r[RANGES];
	const char *path;
	struct sb_pool *p;
	struct sb_buf *b;
	uint32_t most = 0;
	int err = 0;
	long q;

	(void)name;
	path = make_file();
	p = disk_pool(PAGE, 16 * MiB, 0);
	b = sb_buf_open_file(p, path, 0, FILE_BYTES, 0, &err);
	if (!b)
		FAIL("sb_buf_open_file: %s", strerror(-err));
	hold_ready(p, true);
	for (int round = 0; round < ROUNDS; round++) {
		size_t first = (size_t)round * RANGES;
		uint32_t n;

		for (int k = 0; k < RANGES; k++)
			r[k] = (struct sb_range){(first + (size_t)k) * PAGE,
						 PAGE};
		q = sb_buf_prefetch(b, r, RANGES, 0);
		n = queued(p);
		if (n > most)
			most = n;
		/* Every page had to be read: each one counted once. */
		CHECK_EQ(q, RANGES);
		/* The reads finish without the ready thread. */
		sbi_pagein_drain(b);
		CHECK_EQ(sb_buf_placed(b, first * PAGE, RANGES * PAGE), RANGES);
	}
	CHECK_EQ(most, 0);
	hold_ready(p, false);
	/* What was read is the file's: a page of each round, and all of
	 * round 0's pages. */
	for (int round = 0; round < ROUNDS; round++)
		if (!same_as_file(b, ((size_t)round * RANGES + 17) * PAGE))
			FAIL("round %d: page 17 differs from the file", round);
	for (int k = 0; k < RANGES; k++)
		if (!same_as_file(b, (size_t)k * PAGE))
			FAIL("page %d differs from the file", k);
	/* Released and read again with WAIT: placed on return. */
	CHECK_EQ(sb_buf_unmap(b, PAGE, PAGE), 1);
	r[0] = (struct sb_range){PAGE, PAGE};
	CHECK_EQ(sb_buf_prefetch(b, r, 1, SB_PREFETCH_WAIT), 1);
	CHECK_EQ(sb_buf_placed(b, PAGE, PAGE), 1);
	CHECK(same_as_file(b, PAGE));
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	printf("prefetch of %d x %d one-page ranges queued nothing for the "
	       "ready thread\n", ROUNDS, RANGES);
	return 0;
}

static int main_test(void)
{
	return run_disk_body(120);
}
