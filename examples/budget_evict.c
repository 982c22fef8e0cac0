/* SPDX-License-Identifier: MIT */
/*
 * A memory budget with eviction to disk: a pool of 16 MiB serving 48 MiB
 * of evictable buffers. When the pool is full, the coldest pages go to its
 * spill file (O_DIRECT, checksummed) and come back on the next touch; the
 * program only sees the same bytes at the same addresses.
 *
 *   cc budget_evict.c $(pkg-config --cflags --libs sparsebuf) -o budget_evict
 */
#include <sparsebuf.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { BUFS = 3, MIB = 1 << 20, SIZE = 16 * MIB };

int main(void)
{
	struct sb_pool_opts o;
	struct sb_pool *pool;
	struct sb_buf *b[BUFS];
	struct sb_stats st;
	int err, bad = 0;

	sb_pool_opts_init(&o);
	o.page_size = 64 << 10;
	o.max_bytes = 16 * MIB;		/* the budget */
	pool = sb_pool_create(&o, &err);
	if (!pool) {
		fprintf(stderr, "sb_pool_create: %s\n", strerror(-err));
		return 1;
	}
	for (int i = 0; i < BUFS; i++) {
		uint64_t *p;

		b[i] = sb_buf_create(pool, SIZE, SB_BUF_EVICTABLE, &err);
		if (!b[i]) {
			fprintf(stderr, "sb_buf_create: %s\n", strerror(-err));
			return 1;
		}
		p = sb_buf_addr(b[i]);
		for (size_t k = 0; k < SIZE / 8; k++)	/* touch: placed */
			p[k] = k * 31 + (uint64_t)i;
	}
	/* Everything reads back, from memory or from disk. */
	for (int i = 0; i < BUFS; i++) {
		const uint64_t *p = sb_buf_addr(b[i]);

		for (size_t k = 0; k < SIZE / 8; k++)
			bad += p[k] != k * 31 + (uint64_t)i;
	}
	sb_pool_stats(pool, &st);
	printf("budget_evict: %d MiB written under a %zu MiB budget: %zu MiB "
	       "resident, %llu pages out, %llu pages in, %d wrong words\n",
	       BUFS * SIZE / MIB, st.max_bytes / MIB, st.bytes_resident / MIB,
	       (unsigned long long)st.pages_out,
	       (unsigned long long)st.pages_in, bad);
	sb_pool_destroy(pool);
	return bad || !st.pages_out ? 1 : 0;
}
