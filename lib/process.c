/* SPDX-License-Identifier: MIT */
/*
 * Per-process state: the list of pools and fork() handling (the default
 * pool, above, is pool_life.c's, which hooks its lock in here).
 *
 * fork(): a child must not see its parent's buffers. Placed pages are
 * MAP_SHARED heap pages, so an inherited mapping would let the child write
 * into the parent's data, and unplaced ranges lose their userfaultfd
 * registration in a child, so its touches would get silent zero pages. The
 * prepare handler therefore marks every buffer range MADV_DONTFORK (with
 * each pool's layout lock held for writing, so no placement races it), the
 * parent handler undoes the marks (they would stop new placements from
 * merging with old ones), and the child handler closes the pools'
 * descriptors and bumps sbi_fork_gen: calls on a parent's pool then return
 * -ECHILD, and sb_default_pool() builds a fresh pool for the child.
 * posix_spawn() and vfork() share the parent's memory and run none of this.
 */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

_Atomic unsigned sbi_fork_gen;

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sb_pool *pools;		/* pools_lock */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
/* The default pool's (pool_life.c), run first in prepare, last after. */
static const struct sbi_fork_hooks *outer;

int sbi_pool_check(const struct sb_pool *pool)
{
	return pool->fork_gen ==
			       atomic_load_explicit(&sbi_fork_gen,
						    memory_order_relaxed)
		       ? 0
		       : -ECHILD;
}

static void mark_buffers(struct sb_pool *pool, int advice)
{
	pthread_rwlock_rdlock(&pool->reg_lock);
	for (size_t i = 0; i < pool->nreg; i++)
		madvise((void *)pool->reg[i].start,
			pool->reg[i].end - pool->reg[i].start, advice);
	pthread_rwlock_unlock(&pool->reg_lock);
}

static void fork_prepare(void)
{
	if (outer)
		outer->prepare();
	pthread_mutex_lock(&pools_lock);
	for (struct sb_pool *p = pools; p; p = p->next_pool) {
		pthread_rwlock_wrlock(&p->layout);
		mark_buffers(p, MADV_DONTFORK);
	}
}

static void fork_parent(void)
{
	for (struct sb_pool *p = pools; p; p = p->next_pool) {
		mark_buffers(p, MADV_DOFORK);
		pthread_rwlock_unlock(&p->layout);
	}
	pthread_mutex_unlock(&pools_lock);
	if (outer)
		outer->parent();
}

static void fork_child(void)
{
	atomic_fetch_add(&sbi_fork_gen, 1);
	SBI_LK_FORK_CHILD();
	/* Only this thread exists now, and the locks held by the parent's
	 * other threads stay held forever: touch no lock of a pool. */
	for (struct sb_pool *p = pools; p; p = p->next_pool) {
		close(p->uffd);
		close(p->uffd_sigbus);
		close(p->quit_fd);
		if (p->stat_fd >= 0)
			close(p->stat_fd);
		/* The fault handlers' epoll sets and kick (fault_wait.c). */
		for (int i = 0; i < p->nwaiters; i++)
			if (p->faulters[i].ep >= 0)
				close(p->faulters[i].ep);
		if (p->nwaiters && p->fault_kick >= 0)
			close(p->fault_kick);
		for (uint32_t s = 0; s < p->heap_hi; s++)
			if (p->heaps[s])
				close(p->heaps[s]->fd);
		if (p->client)
			sbi_dclient_fork_child(p->client);
	}
	pools = NULL;
	pthread_mutex_init(&pools_lock, NULL);
	if (outer)
		outer->child();
}

static void install_atfork(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void sbi_process_fork_hooks(const struct sbi_fork_hooks *hooks)
{
	outer = hooks;
}

void sbi_process_add_pool(struct sb_pool *pool)
{
	pthread_once(&atfork_once, install_atfork);
	pthread_mutex_lock(&pools_lock);
	pool->next_pool = pools;
	pools = pool;
	pthread_mutex_unlock(&pools_lock);
}

void sbi_process_remove_pool(struct sb_pool *pool)
{
	pthread_mutex_lock(&pools_lock);
	for (struct sb_pool **pp = &pools; *pp; pp = &(*pp)->next_pool) {
		if (*pp == pool) {
			*pp = pool->next_pool;
			break;
		}
	}
	pthread_mutex_unlock(&pools_lock);
}

SB_API void sb_pool_opts_init_sz(struct sb_pool_opts *opts, size_t size)
{
	struct sb_pool_opts o;

	if (!opts)
		return;
	memset(&o, 0, sizeof(o));
	sbi_env_opts(&o, size);
	/* Too small for any release: left alone (sb_pool_create refuses
	 * it). */
	(void)sbi_struct_out(opts, size, &o, sizeof(o),
			     SBI_SIZE_POOL_OPTS_0_1);
}

SB_API void sb_pool_opts_init(struct sb_pool_opts *opts)
{
	sb_pool_opts_init_sz(opts, SBI_SIZE_POOL_OPTS_0_1);
}

