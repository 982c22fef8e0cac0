/* SPDX-License-Identifier: MIT */
/*
 * Lock rules, checked (make lockcheck: built with SBI_LOCK_DEBUG and
 * linked with --wrap for the pthread lock calls; compiled to nothing
 * otherwise).
 *
 * Every lock the library takes goes through the wrappers below, which
 * keep, per thread, the locks it holds. Locks given a rank
 * (sbi_lk_rank, at their init: internal.h's lock order, outer to inner)
 * are checked on every blocking acquisition: taking a lock of rank r
 * while holding one of a higher rank, or one of rank r again (except two
 * buffer locks in increasing buffer id, as sb_buf_share takes them, and
 * the layout locks of several pools newest first, as the fork handlers
 * take them), or the same lock twice, is a potential deadlock and aborts
 * with both locks named. A try-lock never waits, so it is never an order violation.
 * Functions that need a lock say so with SBI_HELD(&lock), checked here;
 * sbi_io_wait checks that no pool lock is held (design.md: nobody waits
 * for I/O holding pool->lock).
 */
#include "internal.h"

#ifdef SBI_LOCK_DEBUG

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __real_pthread_mutex_trylock(pthread_mutex_t *m);
int __real_pthread_mutex_unlock(pthread_mutex_t *m);
int __real_pthread_mutex_destroy(pthread_mutex_t *m);
int __real_pthread_rwlock_rdlock(pthread_rwlock_t *l);
int __real_pthread_rwlock_wrlock(pthread_rwlock_t *l);
int __real_pthread_rwlock_tryrdlock(pthread_rwlock_t *l);
int __real_pthread_rwlock_trywrlock(pthread_rwlock_t *l);
int __real_pthread_rwlock_unlock(pthread_rwlock_t *l);
int __real_pthread_rwlock_destroy(pthread_rwlock_t *l);

int __wrap_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_trylock(pthread_mutex_t *m);
int __wrap_pthread_mutex_unlock(pthread_mutex_t *m);
int __wrap_pthread_mutex_destroy(pthread_mutex_t *m);
int __wrap_pthread_rwlock_rdlock(pthread_rwlock_t *l);
int __wrap_pthread_rwlock_wrlock(pthread_rwlock_t *l);
int __wrap_pthread_rwlock_tryrdlock(pthread_rwlock_t *l);
int __wrap_pthread_rwlock_trywrlock(pthread_rwlock_t *l);
int __wrap_pthread_rwlock_unlock(pthread_rwlock_t *l);
int __wrap_pthread_rwlock_destroy(pthread_rwlock_t *l);

/* ---- ranks: lock address -> (rank, key) ---------------------------------- */

#define NSLOTS 65536	/* open addressing; locks live in far fewer */

struct rank_slot {
	const void *lock;	/* NULL: empty; TOMB: deleted */
	int rank;
	uint64_t key;
};

static struct rank_slot ranks[NSLOTS];
static pthread_mutex_t ranks_lock = PTHREAD_MUTEX_INITIALIZER;
#define TOMB ((const void *)1)

/* fork(): the child inherits ranks_lock as it was; a thread that held it
 * is gone there, and the child's first lock would wait forever (test_chaos
 * forks while other threads lock). Registered before any pool's handlers
 * (a constructor), so it runs last in prepare, after the pool handlers
 * took their locks through the wrappers, and first after. */
static void ranks_prepare(void)
{
	__real_pthread_mutex_lock(&ranks_lock);
}

static void ranks_after(void)
{
	__real_pthread_mutex_unlock(&ranks_lock);
}

__attribute__((constructor)) static void ranks_atfork(void)
{
	pthread_atfork(ranks_prepare, ranks_after, ranks_after);
}

static size_t slot_of(const void *lock)
{
	uint64_t h = (uint64_t)(uintptr_t)lock * 0x9e3779b97f4a7c15ull;

	return (size_t)(h >> 48) & (NSLOTS - 1);
}

void sbi_lk_rank(const void *lock, int rank, uint64_t key)
{
	size_t i = slot_of(lock), tomb = NSLOTS;

	__real_pthread_mutex_lock(&ranks_lock);
	for (size_t n = 0; n < NSLOTS; n++, i = (i + 1) & (NSLOTS - 1)) {
		if (ranks[i].lock == lock) {
			tomb = i;
			break;
		}
		if (ranks[i].lock == TOMB && tomb == NSLOTS)
			tomb = i;
		if (!ranks[i].lock) {
			if (tomb == NSLOTS)
				tomb = i;
			break;
		}
	}
	if (tomb < NSLOTS)
		ranks[tomb] = (struct rank_slot){lock, rank, key};
	__real_pthread_mutex_unlock(&ranks_lock);
}

static bool find_rank(const void *lock, int *rank, uint64_t *key)
{
	size_t i = slot_of(lock);
	bool found = false;

	__real_pthread_mutex_lock(&ranks_lock);
	for (size_t n = 0; n < NSLOTS && ranks[i].lock;
	     n++, i = (i + 1) & (NSLOTS - 1))
		if (ranks[i].lock == lock) {
			*rank = ranks[i].rank;
			*key = ranks[i].key;
			found = true;
			break;
		}
	__real_pthread_mutex_unlock(&ranks_lock);
	return found;
}

static void forget(const void *lock)
{
	size_t i = slot_of(lock);

	__real_pthread_mutex_lock(&ranks_lock);
	for (size_t n = 0; n < NSLOTS && ranks[i].lock;
	     n++, i = (i + 1) & (NSLOTS - 1))
		if (ranks[i].lock == lock) {
			ranks[i].lock = TOMB;
			break;
		}
	__real_pthread_mutex_unlock(&ranks_lock);
}

/* ---- what this thread holds ------------------------------------------------- */

#define MAX_HELD 32

struct held {
	const void *lock;
	int rank;	/* 0: unranked */
	uint64_t key;
	void *where;	/* return address of the acquisition */
};

static __thread struct held held[MAX_HELD];
static __thread int nheld;

void sbi_lk_fail(const char *what, const char *file, int line)
{
	fprintf(stderr, "sparsebuf lock check: %s at %s:%d; this thread holds",
		what, file, line);
	for (int i = 0; i < nheld; i++)
		fprintf(stderr, " %p (rank %d, taken at %p)", held[i].lock,
			held[i].rank, held[i].where);
	fprintf(stderr, "\n");
	abort();
}

void sbi_lk_fork_child(void)
{
	/* The child's only thread: the locks the fork handlers took in the
	 * parent are abandoned (process.c), not released. */
	nheld = 0;
}

bool sbi_lk_held(const void *lock)
{
	for (int i = 0; i < nheld; i++)
		if (held[i].lock == lock)
			return true;
	return false;
}

bool sbi_lk_holds_rank(int rank)
{
	for (int i = 0; i < nheld; i++)
		if (held[i].rank == rank)
			return true;
	return false;
}

/* Before a blocking acquisition of lock: the order rule. */
static void check_order(const void *lock, int rank, uint64_t key, void *where)
{
	char msg[256];

	for (int i = 0; i < nheld; i++) {
		const struct held *h = &held[i];

		if (h->lock == lock) {
			snprintf(msg, sizeof(msg),
				 "lock %p taken again (first at %p, now at %p)",
				 lock, h->where, where);
			sbi_lk_fail(msg, __FILE__, __LINE__);
		}
		if (!rank || !h->rank)
			continue;
		/* Equal ranks: two buffers in increasing id (sb_buf_share),
		 * several pools' layout locks newest pool first (the fork
		 * handlers, process.c, in the pools list's order). */
		if (h->rank > rank ||
		    (h->rank == rank &&
		     !(rank == SBI_RANK_BUF && key > h->key) &&
		     !(rank == SBI_RANK_LAYOUT && key < h->key))) {
			snprintf(msg, sizeof(msg),
				 "lock order: %p (rank %d, key %llu) taken at %p "
				 "while holding %p (rank %d, key %llu) taken at "
				 "%p",
				 lock, rank, (unsigned long long)key, where,
				 h->lock, h->rank, (unsigned long long)h->key,
				 h->where);
			sbi_lk_fail(msg, __FILE__, __LINE__);
		}
	}
}

static void push(const void *lock, int rank, uint64_t key, void *where)
{
	if (nheld == MAX_HELD)
		sbi_lk_fail("more than 32 locks held", __FILE__, __LINE__);
	held[nheld++] = (struct held){lock, rank, key, where};
}

static void pop(const void *lock)
{
	for (int i = nheld - 1; i >= 0; i--)
		if (held[i].lock == lock) {
			memmove(&held[i], &held[i + 1],
				(size_t)(nheld - i - 1) * sizeof(held[0]));
			nheld--;
			return;
		}
	/* Released by a thread that did not take it (or taken before the
	 * wrappers saw it): nothing to drop. */
}

static int acquire(const void *lock, void *where, bool block,
		   int (*real)(void *), void *arg)
{
	int rank = 0, r;
	uint64_t key = 0;

	find_rank(lock, &rank, &key);
	if (block)
		check_order(lock, rank, key, where);
	r = real(arg);
	if (r == 0)
		push(lock, rank, key, where);
	return r;
}

static int real_mutex_lock(void *m)
{
	return __real_pthread_mutex_lock(m);
}

static int real_mutex_trylock(void *m)
{
	return __real_pthread_mutex_trylock(m);
}

static int real_rdlock(void *l)
{
	return __real_pthread_rwlock_rdlock(l);
}

static int real_wrlock(void *l)
{
	return __real_pthread_rwlock_wrlock(l);
}

static int real_tryrdlock(void *l)
{
	return __real_pthread_rwlock_tryrdlock(l);
}

static int real_trywrlock(void *l)
{
	return __real_pthread_rwlock_trywrlock(l);
}

int __wrap_pthread_mutex_lock(pthread_mutex_t *m)
{
	return acquire(m, __builtin_return_address(0), true, real_mutex_lock,
		       m);
}

int __wrap_pthread_mutex_trylock(pthread_mutex_t *m)
{
	return acquire(m, __builtin_return_address(0), false,
		       real_mutex_trylock, m);
}

int __wrap_pthread_mutex_unlock(pthread_mutex_t *m)
{
	pop(m);
	return __real_pthread_mutex_unlock(m);
}

int __wrap_pthread_mutex_destroy(pthread_mutex_t *m)
{
	forget(m);
	return __real_pthread_mutex_destroy(m);
}

int __wrap_pthread_rwlock_rdlock(pthread_rwlock_t *l)
{
	return acquire(l, __builtin_return_address(0), true, real_rdlock, l);
}

int __wrap_pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
	return acquire(l, __builtin_return_address(0), true, real_wrlock, l);
}

int __wrap_pthread_rwlock_tryrdlock(pthread_rwlock_t *l)
{
	return acquire(l, __builtin_return_address(0), false, real_tryrdlock,
		       l);
}

int __wrap_pthread_rwlock_trywrlock(pthread_rwlock_t *l)
{
	return acquire(l, __builtin_return_address(0), false, real_trywrlock,
		       l);
}

int __wrap_pthread_rwlock_unlock(pthread_rwlock_t *l)
{
	pop(l);
	return __real_pthread_rwlock_unlock(l);
}

int __wrap_pthread_rwlock_destroy(pthread_rwlock_t *l)
{
	forget(l);
	return __real_pthread_rwlock_destroy(l);
}

#else

/* The checks are compiled in by make lockcheck only. */
typedef int sbi_lockcheck_unused;

#endif
