/* SPDX-License-Identifier: MIT */
/*
 * Per-thread scratch memory for the kernels: kept between calls so that a
 * decode step allocates (and page-faults) nothing after the first, freed by
 * a thread-specific-data destructor when the thread exits.
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

struct slot {
	void *p;
	size_t n;
};

static _Thread_local struct slot slots[SBKI_SCRATCH_SLOTS];
static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void free_slots(void *arg)
{
	struct slot *s = arg;

	for (int i = 0; i < SBKI_SCRATCH_SLOTS; i++) {
		free(s[i].p);
		s[i].p = NULL;
		s[i].n = 0;
	}
}

static void make_key(void)
{
	pthread_key_create(&key, free_slots);
}

void *sbki_scratch(int slot, size_t bytes)
{
	struct slot *s = &slots[slot];
	void *p;

	if (s->n >= bytes)
		return s->p;
	pthread_once(&key_once, make_key);
	free(s->p);
	s->p = NULL;
	s->n = 0;
	/* Grow by half again so a slowly growing context does not
	 * reallocate at every step. */
	bytes += bytes / 2;
	bytes = (bytes + 4095) & ~(size_t)4095;
	if (posix_memalign(&p, 64, bytes))
		return NULL;
	s->p = p;
	s->n = bytes;
	pthread_setspecific(key, slots);
	return p;
}
