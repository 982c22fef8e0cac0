/* SPDX-License-Identifier: MIT */
/*
 * sparsebuf-demo: the core promises in one run.
 *
 *   1. reserve a 1 TiB buffer: no memory committed;
 *   2. grow it the way a KV cache grows, explicitly and on first touch;
 *   3. share its prefix with a second buffer: the pages are held once;
 *   4. write through the second buffer: copy-on-write gives it a private
 *      page, the first buffer still reads its old data;
 *   5. slide a window: pages that fall out of it go back to the pool;
 *   6. evict the window to disk and touch it again: the same pointer
 *      reads the same bytes, paged back in through io_uring;
 *   7. free everything.
 *
 * Each step prints the pool's accounting, the process's RSS and the
 * fault counters.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sparsebuf.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define TiB ((size_t)1 << 40)

static struct sb_pool *pool;

static long rss_kib(void)
{
	char line[256];
	long v = -1;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

static void show(const char *what)
{
	struct sb_stats st;

	sb_pool_stats(pool, &st);
	printf("  %-46s pages used %5zu  resident %6.1f MiB  RSS %6.1f MiB\n"
	       "  %-46s faults %4llu  mapped %4llu  released %4llu  "
	       "copies %2llu\n",
	       what, st.pages_used, (double)st.bytes_resident / MiB,
	       (double)rss_kib() / 1024, "",
	       (unsigned long long)st.faults, (unsigned long long)st.maps,
	       (unsigned long long)st.unmaps,
	       (unsigned long long)st.cow_copies);
}

static void die(const char *what, long err)
{
	fprintf(stderr, "sparsebuf-demo: %s: %s\n", what, strerror((int)-err));
	exit(1);
}

int main(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "sparsebuf-demo",
		.usage = "",
		.about = "The core promises in one run: a 1 TiB buffer reserved, "
			 "grown, shared with\ncopy-on-write, slid as a window, "
			 "evicted to disk and read back, freed; the pool's\n"
			 "accounting, RSS and fault counters after each step. "
			 "SPARSEBUF_* variables apply.",
	};
	size_t page, row = 2 * KiB;	/* one token of one layer's K */
	struct sb_buf *kv, *fork;
	struct sb_stats st;
	char *a, *b;
	int err;
	long r;

	sbc_no_args(&cli, argc, argv);
	pool = sb_default_pool();
	if (!pool)
		die("default pool", sb_default_pool_error());
	sb_pool_stats(pool, &st);
	page = st.page_size;
	printf("sparsebuf demo: %zu KiB pages (SPARSEBUF_PAGE_SIZE), "
	       "run sparsebuf-info for what the kernel allows\n\n",
	       page / KiB);

	printf("1. reserve a 1 TiB buffer\n");
	kv = sb_buf_create(pool, 1 * TiB, 0, &err);
	if (!kv)
		die("sb_buf_create", err);
	a = sb_buf_addr(kv);
	printf("  address %p, length %zu GiB, nothing placed\n", (void *)a,
	       sb_buf_length(kv) >> 30);
	show("after sb_buf_create");

	printf("\n2. grow it: 1000 tokens of 2 KiB placed ahead with "
	       "sb_buf_map, 500 more on first touch\n");
	for (size_t t = 0; t < 1000; t++) {
		r = sb_buf_map(kv, t * row, row);
		if (r < 0)
			die("sb_buf_map", r);
		memset(a + t * row, (int)(t % 250) + 1, row);
	}
	show("1000 tokens, explicit placement");
	for (size_t t = 1000; t < 1500; t++)
		memset(a + t * row, (int)(t % 250) + 1, row);
	show("1500 tokens, the rest placed by faults");

	printf("\n3. share the first 1024 tokens (the system prompt) with a "
	       "second session\n");
	fork = sb_buf_create(pool, 1 * TiB, 0, &err);
	if (!fork)
		die("sb_buf_create", err);
	b = sb_buf_addr(fork);
	r = sb_buf_share(fork, 0, kv, 0, 1024 * row);
	if (r < 0)
		die("sb_buf_share", r);
	printf("  %ld pages shared; session 2 reads token 7 = %d (session 1: "
	       "%d)\n",
	       r, b[7 * row], a[7 * row]);
	show("after sb_buf_share");

	printf("\n4. session 2 writes its own token 1023: copy-on-write\n");
	memset(b + 1023 * row, 0x7f, row);
	printf("  session 2 reads %d, session 1 still reads %d\n",
	       b[1023 * row], a[1023 * row]);
	show("after the first write through session 2");

	printf("\n5. sliding window of 512 tokens over session 1: release what "
	       "fell out\n");
	r = sb_buf_unmap(kv, 0, 988 * row);
	if (r < 0)
		die("sb_buf_unmap", r);
	printf("  %ld pages released (session 2 still holds its shared "
	       "copies), session 2 reads token 7 = %d\n",
	       r, b[7 * row]);
	show("after sb_buf_unmap of tokens [0, 988)");

	printf("\n6. cold pages go to disk and come back: evict session 1's "
	       "window, touch it again\n");
	{
		long sum0 = 0, sum1 = 0;

		for (size_t t = 988; t < 1000; t++)
			sum0 += a[t * row];
		r = sb_buf_evict(kv, 0, sb_buf_length(kv));
		if (r < 0)
			die("sb_buf_evict", r);
		sb_pool_stats(pool, &st);
		printf("  %ld pages written out (%llu bytes, spill file holds "
		       "%zu KiB); the buffer's address is unchanged\n",
		       r, (unsigned long long)st.bytes_written,
		       st.spill_bytes / KiB);
		show("after sb_buf_evict");
		for (size_t t = 988; t < 1000; t++)
			sum1 += a[t * row];	/* faults: paged back in */
		sb_pool_stats(pool, &st);
		printf("  touched again: %llu pages read in (%llu bytes, CRC-32C "
		       "checked), checksum of the window %s\n",
		       (unsigned long long)st.pages_in,
		       (unsigned long long)st.bytes_read,
		       sum0 == sum1 ? "unchanged" : "CHANGED (bug)");
		show("after the touch");
	}

	printf("\n7. free both sessions and trim the pool\n");
	sb_buf_destroy(fork);
	sb_buf_destroy(kv);
	sb_pool_trim(pool);
	show("after sb_buf_destroy and sb_pool_trim");
	return 0;
}
