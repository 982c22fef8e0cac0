/* SPDX-License-Identifier: MIT */
/*
 * The page a pool publishes its counters in, for sparsebuf-stat to read
 * from another process (lib/stat.c). One page of a memfd named
 * "sparsebuf-stats", found through /proc/PID/fd. The layout is versioned
 * here: the tool refuses what it does not know.
 */
#ifndef SPARSEBUF_STAT_PAGE_H
#define SPARSEBUF_STAT_PAGE_H

#include <stdint.h>

#include "sparsebuf.h"

#define SBI_STAT_MAGIC "SBSTAT01"
#define SBI_STAT_NAME "sparsebuf-stats"

struct sbi_stat_page {
	char magic[8];
	uint32_t version;	/* 1 */
	uint32_t stats_size;	/* sizeof(struct sb_stats) written below */
	int32_t pid;		/* the process whose pool this is (a fork()ed
				 * child inherits the descriptor: skip it) */
	uint32_t pool_id;	/* 1, 2, ... in that process */
	/* Odd while the ready thread writes a snapshot; a reader copies
	 * between two equal even values. */
	uint64_t seq;
	uint64_t time_ns;	/* CLOCK_MONOTONIC of the snapshot */
	uint64_t period_ms;	/* how often it is refreshed */
	struct sb_stats st;	/* 8-byte words only: copied word by word */
};

_Static_assert(sizeof(struct sb_stats) % sizeof(uint64_t) == 0,
	       "sb_stats is published word by word");

#endif
