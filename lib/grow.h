/* SPDX-License-Identifier: MIT */
/*
 * What grow.c (the watches) and grow_serve.c (placing ahead) share: the
 * timing of a watch.
 */
#ifndef SPARSEBUF_GROW_H
#define SPARSEBUF_GROW_H

#include <stdint.h>
#include <time.h>

/* Bytes looked at to tell whether the page ahead was entered. */
#define PEEK 256
/* A watch with no progress for this long is idle: looked at every
 * IDLE_POLL_MS, and after LONG_IDLE_MS every LONG_POLL_MS (a page of
 * growth still leaves that much time: 128 rows of a KV region). */
#define IDLE_MS 2000
#define IDLE_POLL_MS 10
#define LONG_IDLE_MS 30000
#define LONG_POLL_MS 100
/* Placements per millisecond at most: a burst (every region of a KV cache
 * entered its page while this thread slept) spreads over a few
 * milliseconds instead of holding the mmap lock back to back. A page is
 * placed a whole page of growth ahead of need, but a client that maps
 * ahead itself asks sooner: bench/kv's core-API client maps its 72
 * regions' next pages from 41 steps (10-16 ms) after they entered the
 * current one, and at 4 a millisecond 110-277 maps a run found the page
 * unplaced (and placed it themselves, behind this thread's mmap lock).
 * At 8, with the urgent watches first (grow_serve.c), 1-6 on a quiet
 * host, nearly all in the first crossings (7-30 when the host takes this
 * thread's vCPU for milliseconds). Longer bursts (16) kept this thread on
 * its CPU for up to 4 ms when the pages needed zeroing. */
#define BURST 8

static inline bool grow_watchable(const struct sb_buf *buf)
{
	return (buf->flags & SB_BUF_GROWS) && !buf->src;
}

/* Milliseconds until an unchanged watch is looked at again. */
static inline uint64_t grow_poll_ms(uint64_t idle)
{
	return idle < IDLE_MS ? 1 : idle < LONG_IDLE_MS ? IDLE_POLL_MS : LONG_POLL_MS;
}

#endif
