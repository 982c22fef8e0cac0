/* SPDX-License-Identifier: MIT */
/*
 * Helpers for the tests that look inside the library (they include
 * lib/internal.h): after harness.h.
 */
#ifndef SPARSEBUF_TEST_HARNESS_INTERNAL_H
#define SPARSEBUF_TEST_HARNESS_INTERNAL_H

#include "internal.h"

/* Hold the ready thread still (as sb_pool_trim does: it makes no page
 * ready, serves no prefetch or growth), or let it go. Holding waits 50 ms
 * for a page it was preparing. */
static inline void hold_ready(struct sb_pool *p, bool hold)
{
	pthread_mutex_lock(&p->lock);
	if (hold)
		p->trimming++;
	else
		p->trimming--;
	pthread_mutex_unlock(&p->lock);
	if (hold)
		usleep(50000);
}

#endif /* SPARSEBUF_TEST_HARNESS_INTERNAL_H */
