/* SPDX-License-Identifier: MIT */
/*
 * A pool's life and its public calls: sb_pool_create (the page source,
 * the userfaultfds, the fault-handler and ready threads), sb_pool_destroy
 * (every buffer, the disk tier, the threads, the heaps), sb_pool_stats,
 * sb_pool_trim, sb_pool_reserve. The top of the library: it starts and
 * stops what the layers below run; nothing below calls it.
 */
#include "internal.h"
#include "dproto.h"
#include "uffd_compat.h"

#include <errno.h>
#include <limits.h>
#include <numa.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* ---- creation and teardown ----------------------------------------------- */

static int check_numa(int node)
{
	if (node < 0)
		return 0;
	if (numa_available() < 0)
		return node == 0 ? 0 : -EINVAL;
	if (node > numa_max_node() ||
	    !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node))
		return -EINVAL;
	return 0;
}

static int start_threads(struct sb_pool *pool)
{
	int r = sbi_fault_start(pool);

	if (r == 0) {
		r = sbi_thread_start(&pool->ready_thread, sbi_ready_thread,
				     pool, "sb-ready", -1);
		if (r < 0)
			sbi_fault_stop(pool);
	}
	return r;
}

static void free_pool(struct sb_pool *pool)
{
	if (pool->lease) {
		sbi_lease_stop(pool);
		sbi_lease_close(pool);	/* and the connection */
	} else {
		sbi_dclient_close(pool->client);
	}
	sbi_stat_close(pool);
	if (pool->uffd >= 0)
		close(pool->uffd);
	if (pool->uffd_sigbus >= 0)
		close(pool->uffd_sigbus);
	if (pool->quit_fd >= 0)
		close(pool->quit_fd);
	sbi_meta_free(pool->heaps, pool->heap_cap * sizeof(*pool->heaps));
	for (int q = 0; q < 2; q++)
		sbi_meta_free(pool->wanted[q].pid,
			      pool->wanted[q].cap * sizeof(sbi_pid));
	sbi_meta_free(pool->pf, pool->pf_cap * sizeof(*pool->pf));
	free(pool->reg);
	free(pool->spill_dir);
	pthread_mutex_destroy(&pool->disk_lock);
	pthread_rwlock_destroy(&pool->layout);
	pthread_rwlock_destroy(&pool->reg_lock);
	pthread_mutex_destroy(&pool->lock);
	pthread_mutex_destroy(&pool->pf_lock);
	pthread_cond_destroy(&pool->pf_cond);
	pthread_cond_destroy(&pool->ready_cond);
	pthread_cond_destroy(&pool->busy_cond);
	free(pool);
}

static _Atomic unsigned next_pool_id;

static struct sb_pool *fail_client(struct sbi_dclient *client, int *err,
				   int e)
{
	sbi_dclient_close(client);
	if (err)
		*err = e;
	return NULL;
}

static struct sb_pool *fail(int *err, int e)
{
	if (err)
		*err = e;
	return NULL;
}

static struct sb_pool *pool_create(const struct sb_pool_opts *opts,
				   struct sbi_dclient *client, int *err);
static const struct sbi_fork_hooks default_hooks;
static void default_forget(struct sb_pool *pool);

SB_API struct sb_pool *sb_pool_create_sz(const struct sb_pool_opts *opts,
					 size_t size, int *err)
{
	struct sb_pool_opts o;
	int r;

	if (!opts)
		return fail(err, -EINVAL);
	r = sbi_struct_in(&o, sizeof(o), opts, size, SBI_SIZE_POOL_OPTS_0_1);
	if (r < 0)
		return fail(err, r);
	return pool_create(&o, NULL, err);
}

SB_API struct sb_pool *sb_pool_create(const struct sb_pool_opts *opts,
				      int *err)
{
	return sb_pool_create_sz(opts, SBI_SIZE_POOL_OPTS_0_1, err);
}

SB_API struct sb_pool *sb_pool_connect_sz(const char *path,
					  const struct sb_pool_opts *opts,
					  size_t size, int *err)
{
	struct sbi_dclient *c;
	struct sb_pool_opts o;
	int r;

	if (!opts || !path)
		return fail(err, -EINVAL);
	r = sbi_struct_in(&o, sizeof(o), opts, size, SBI_SIZE_POOL_OPTS_0_1);
	if (r < 0)
		return fail(err, r);
	if (sbi_opts_check(&o))
		return pool_create(&o, NULL, err);	/* says why */
	/* A floor is whole pages (the pool's budget is counted in them),
	 * and a size the protocol carries. */
	if (o.min_bytes > SBD_MAX_BYTES - o.page_size) {
		sbi_err("sb_pool_connect: min_bytes %zu is above the largest "
			"floor sparsebufd can grant (%llu)",
			o.min_bytes,
			(unsigned long long)(SBD_MAX_BYTES - o.page_size));
		return fail(err, -EINVAL);
	}
	if (o.min_bytes % o.page_size)
		o.min_bytes += o.page_size - o.min_bytes % o.page_size;
	c = sbi_dclient_open(path, o.page_size, o.flags & SB_POOL_HUGETLB,
			     o.min_bytes, &r);
	if (!c && o.min_bytes && (r == -EPERM || r == -ENOSPC)) {
		/* Asked for explicitly: said whatever the log level. */
		sbi_err("sb_pool_connect: sparsebufd at %s refused a floor of "
			"%zu KiB (min_bytes, SPARSEBUF_MIN_BYTES): %s",
			path, o.min_bytes >> 10,
			r == -EPERM ? "this user's floors would pass its "
				      "--max-floor"
				    : "that much of its budget is not free");
		return fail(err, r);
	}
	if (!c) {
		sbi_info("sb_pool_connect: sparsebufd at %s: %s", path,
			 strerror(-r));
		return fail(err, r);
	}
	return pool_create(&o, c, err);	/* owns c now */
}

static struct sb_pool *pool_create(const struct sb_pool_opts *opts,
				   struct sbi_dclient *client, int *err)
{
	const struct sb_features *f = sbi_features();
	struct sb_pool *pool;
	const char *why;
	pthread_condattr_t ca;
	size_t folio;
	bool big_folios, hugetlb;
	int r;

	if (!opts)
		return fail_client(client, err, -EINVAL);
	why = sbi_opts_check(opts);
	if (why) {
		sbi_info("sb_pool_create: %s", why);
		return fail_client(client, err, -EINVAL);
	}
	if (check_numa(opts->numa_node) < 0) {
		sbi_info("sb_pool_create: NUMA node %d does not exist",
			 opts->numa_node);
		return fail_client(client, err, -EINVAL);
	}
	if (f->uffd_mode == SB_UFFD_NONE) {
		sbi_err("userfaultfd is unavailable (%s); run sparsebuf-info",
			strerror(-f->uffd_error));
		return fail_client(client, err,
				   f->uffd_error ? f->uffd_error : -ENOSYS);
	}
	/* Heap folios larger than a page (shmem_enabled): releasing a page
	 * punches part of a folio, which the kernel splits, or, when it
	 * cannot (another part pinned by I/O), zeroes and keeps. The page
	 * then reads as zeros without a fault: only a minor fault catches
	 * the touch of an evicted page (evict.c, freeze). Without minor
	 * faults, refuse rather than risk it. (An application's
	 * MADV_COLLAPSE, or the setting changed later, can still make such
	 * folios there: on such a kernel nothing catches that.) */
	hugetlb = opts->flags & SB_POOL_HUGETLB;
	/* hugetlbfs heaps have no folio smaller than a page (their pages are
	 * whole huge pages), whatever shmem_enabled says. */
	folio = hugetlb ? 0 : sbi_shmem_folio_bytes();
	big_folios = folio > opts->page_size;
	if (big_folios && !(f->uffd_features & UFFD_FEATURE_MINOR_SHMEM)) {
		sbi_err("shmem_enabled gives the heaps folios of up to %zu "
			"KiB, more than a page (%zu KiB), and this kernel has "
			"no minor faults on shmem (Linux 5.14): a released "
			"page could read as zeros. Set /sys/kernel/mm/"
			"transparent_hugepage/shmem_enabled to never or "
			"advise, or use pages of %zu KiB",
			folio >> 10, opts->page_size >> 10, folio >> 10);
		return fail_client(client, err, -EOPNOTSUPP);
	}
	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return fail_client(client, err, -ENOMEM);
	pool->uffd = pool->uffd_sigbus = pool->quit_fd = -1;
	pool->client = client;	/* closed by free_pool from here on */
	pool->id = atomic_fetch_add(&next_pool_id, 1) + 1;
	sbi_stat_open(pool);
	sbi_vma_spares_fill();	/* room for releases at the mapping limit */
	pool->page_size = opts->page_size;
	pool->heap_size = opts->heap_size;
	pool->page_shift = (uint32_t)__builtin_ctzl(opts->page_size);
	pool->pages_per_heap = (uint32_t)(opts->heap_size / opts->page_size);
	pool->big_folios = big_folios;
	/* The pages come from the page source; so does the budget. */
	pool->hugetlb = hugetlb;
	pool->source = client ? sbi_daemon_source(client, hugetlb)
			      : sbi_memfd_source(hugetlb);
	pool->max_bytes =
		pool->source.ops->budget(pool->source.ctx, opts->max_bytes);
	pool->max_pages =
		pool->max_bytes ? pool->max_bytes >> pool->page_shift : SIZE_MAX;
	if (client) {
		/* The budget is the lease (lease.c), within the ceiling. */
		pool->ceiling_pages = pool->max_pages;
		pool->max_pages = 0;
	}
	pool->numa_node = opts->numa_node;
	pool->can_wp = f->wp_shmem;
	pool->can_poison = f->poison;
	pool->can_minor = f->uffd_features &
			  (hugetlb ? UFFD_FEATURE_MINOR_HUGETLBFS
				   : UFFD_FEATURE_MINOR_SHMEM);
	pool->can_recycle = sbi_env_recycle() && pool->can_minor;
	/* Beyond 64 KiB a page read in costs more in fresh memory (the home
	 * page's, zeroed) than the mappings save: 1 MiB pages read in order
	 * took 20% more CPU. */
	pool->can_home = sbi_env_home() && !client &&
			 (f->uffd_features & UFFD_FEATURE_MINOR_SHMEM) &&
			 pool->page_size <= ((size_t)64 << 10);
	{
		int t = sbi_env_touch();

		/* 1 us: 20 times what it costs without shadow paging, a
		 * seventh of what it costs with. */
		pool->touch_placed = t == 1 ||
				     (t < 0 && f->first_access_ns > 1000);
		/* A huge page's first access maps it whole, at once. */
		if (hugetlb)
			pool->touch_placed = false;
	}
	/* A read fault maps 16 pages here (64 KiB), for 0.22 us a page
	 * against 0.47 us for MAP_POPULATE's walk, which looks up and marks
	 * each page accessed. Where the first access to a newly mapped page
	 * is slow (shadow paging), the reads would pay it on the placing
	 * thread, so the walk is kept there. Fewer pages a fault and the
	 * faults cost more than the walk. */
	if (!pool->touch_placed && f->fault_around_pages >= 16)
		pool->fault_around = (size_t)f->fault_around_pages << 12;
	pool->fork_gen = atomic_load(&sbi_fork_gen);
	/* Page ids plus one must fit in 32 bits. */
	pool->heap_cap = (uint32_t)(0xfffffffeu / pool->pages_per_heap);
	if (pool->heap_cap > (1u << 20))
		pool->heap_cap = 1u << 20;
	pool->ready_min = ((size_t)1 << 20) >> pool->page_shift;
	if (pool->ready_min < 1)
		pool->ready_min = 1;
	/* 12 MiB: what a pool holds beyond its pages in use stays small
	 * (docs/design.md, "The ready reserve"; a KV cache's lookahead adds
	 * up to a page per region). Growth that outruns it has the caller
	 * prepare pages: tens of microseconds each. */
	pool->ready_max = ((size_t)12 << 20) >> pool->page_shift;
	if (pool->ready_max < 2 * pool->ready_min)
		pool->ready_max = 2 * pool->ready_min;
	pool->ready_target = pool->ready_min;
	pool->grow_due_ms = UINT64_MAX;
	pool->wanted[0].cap = pool->wanted[1].cap = 4096;
	pool->pf_cap = 4096;
	pool->caller_cpu = -1;
	pool->next_buf_id = 1;

	pthread_rwlock_init(&pool->layout, NULL);
	pthread_rwlock_init(&pool->reg_lock, NULL);
	pthread_mutex_init(&pool->lock, NULL);
	pthread_mutex_init(&pool->pf_lock, NULL);
	pthread_mutex_init(&pool->disk_lock, NULL);
	SBI_LK_RANK(&pool->layout, SBI_RANK_LAYOUT, pool->id);
	SBI_LK_RANK(&pool->reg_lock, SBI_RANK_REG, pool->id);
	SBI_LK_RANK(&pool->lock, SBI_RANK_POOL, pool->id);
	SBI_LK_RANK(&pool->pf_lock, SBI_RANK_LEAF, pool->id);
	pthread_cond_init(&pool->pf_cond, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pool->ready_cond, &ca);
	pthread_cond_init(&pool->busy_cond, &ca);
	pthread_condattr_destroy(&ca);

	pool->heaps = sbi_meta_alloc(pool->heap_cap * sizeof(*pool->heaps),
				     true);
	for (int q = 0; q < 2; q++)
		pool->wanted[q].pid = sbi_meta_alloc(
			pool->wanted[q].cap * sizeof(sbi_pid), false);
	pool->pf = sbi_meta_alloc(pool->pf_cap * sizeof(*pool->pf), false);
	if (opts->spill_dir && !(pool->spill_dir = strdup(opts->spill_dir))) {
		r = -ENOMEM;
		goto out;
	}
	if (!pool->heaps || !pool->wanted[0].pid || !pool->wanted[1].pid ||
	    !pool->pf) {
		r = -ENOMEM;
		goto out;
	}
	/* THREAD_ID: a copy-on-write that can get no mapping signals the
	 * writing thread itself (fault.c, service_wp). */
	pool->uffd = r = sbi_uffd_open(UFFD_FEATURE_WP_HUGETLBFS_SHMEM |
				       UFFD_FEATURE_POISON |
				       UFFD_FEATURE_MINOR_SHMEM |
				       UFFD_FEATURE_MINOR_HUGETLBFS |
				       UFFD_FEATURE_THREAD_ID);
	if (r < 0)
		goto out;
	pool->uffd_sigbus = r = sbi_uffd_open(UFFD_FEATURE_SIGBUS |
					      UFFD_FEATURE_WP_HUGETLBFS_SHMEM);
	if (r < 0)
		goto out;
	pool->quit_fd = r = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (r < 0) {
		r = -errno;
		goto out;
	}
	if (client && (r = sbi_lease_start(pool, client)) < 0)
		goto out;
	r = start_threads(pool);
	if (r < 0)
		goto out;
	sbi_process_fork_hooks(&default_hooks);
	sbi_process_add_pool(pool);
	return pool;
out:
	free_pool(pool);
	return fail(err, r);
}

SB_API void sb_pool_destroy(struct sb_pool *pool)
{
	if (!pool)
		return;
	if (sbi_pool_check(pool) < 0) {
		/* A child's copy of its parent's pool: the fork handler
		 * already closed its descriptors; nothing else is ours. */
		return;
	}
	sbi_process_remove_pool(pool);
	default_forget(pool);
	sbi_lease_stop(pool);	/* no reclaim while the buffers go */
	for (;;) {
		struct sb_buf *buf = NULL;

		pthread_rwlock_rdlock(&pool->reg_lock);
		if (pool->nreg)
			buf = pool->reg[0].buf;
		pthread_rwlock_unlock(&pool->reg_lock);
		if (!buf)
			break;
		sb_buf_destroy(buf);
	}
	sbi_disk_destroy(pool);
	pthread_mutex_lock(&pool->lock);
	pool->stopping = true;
	pthread_cond_broadcast(&pool->ready_cond);
	pthread_mutex_unlock(&pool->lock);
	sbi_fault_stop(pool);
	pthread_join(pool->ready_thread, NULL);
	for (uint32_t s = 0; s < pool->heap_hi; s++)
		if (pool->heaps[s])
			sbi_heap_destroy(&pool->source, pool->heaps[s],
					 pool->page_size);
	free_pool(pool);
}

/* ---- accounting ------------------------------------------------------------ */

/* ---- accounting ------------------------------------------------------------ */


static int pool_stats(struct sb_pool *pool, struct sb_stats *st);

SB_API int sb_pool_stats_sz(struct sb_pool *pool, struct sb_stats *st,
			    size_t size)
{
	struct sb_stats s;
	int r;

	if (!pool || !st)
		return -EINVAL;
	r = pool_stats(pool, &s);
	if (r < 0)
		return r;
	return sbi_struct_out(st, size, &s, sizeof(s), SBI_SIZE_STATS_0_1);
}

SB_API int sb_pool_stats(struct sb_pool *pool, struct sb_stats *st)
{
	return sb_pool_stats_sz(pool, st, SBI_SIZE_STATS_0_1);
}

static int pool_stats(struct sb_pool *pool, struct sb_stats *st)
{
	int r;

	if (!pool || !st)
		return -EINVAL;
	if ((r = sbi_pool_check(pool)) < 0)
		return r;
	pthread_mutex_lock(&pool->lock);
	sbi_pool_stats_locked(pool, st);
	pthread_mutex_unlock(&pool->lock);
	return 0;
}

SB_API long sb_pool_trim(struct sb_pool *pool)
{
	size_t pages;
	int r;

	if (!pool)
		return -EINVAL;
	if ((r = sbi_pool_check(pool)) < 0)
		return r;
	pthread_mutex_lock(&pool->lock);
	pages = sbi_ready_trim(pool, false, true);
	pthread_mutex_unlock(&pool->lock);
	return (long)(pages << pool->page_shift);
}

SB_API long sb_pool_reserve(struct sb_pool *pool, long delta_bytes)
{
	long pages;
	int r;

	if (!pool)
		return -EINVAL;
	if ((r = sbi_pool_check(pool)) < 0)
		return r;
	/* Whole pages, rounded away from zero both ways: a reserve of x
	 * bytes and then of -x leaves the floor as it was. */
	pages = delta_bytes / (long)pool->page_size +
		(delta_bytes % (long)pool->page_size > 0) -
		(delta_bytes % (long)pool->page_size < 0);
	pthread_mutex_lock(&pool->lock);
	if (pages < 0 && (size_t)-pages > pool->ready_floor) {
		pool->ready_floor = 0;
	} else if (pages > 0 &&
		   (size_t)pages > (size_t)(LONG_MAX >> pool->page_shift) -
					   pool->ready_floor) {
		/* The floor in bytes would not fit the return value. */
		pthread_mutex_unlock(&pool->lock);
		return -ERANGE;
	} else {
		pool->ready_floor = (size_t)((long)pool->ready_floor + pages);
	}
	/* A new floor is tried at once, however the last one fared. */
	pool->floor_stuck_ms = 0;
	pool->floor_heap_ms = 0;
	/* The target follows the floor both ways (internal.h: it stays
	 * within sbi_ready_cap); lowered, it would otherwise decay an
	 * eighth a quiet second and hold the old floor's pages for long. */
	if (pool->ready_target < pool->ready_floor)
		pool->ready_target = pool->ready_floor;
	else if (pool->ready_target > sbi_ready_cap(pool))
		pool->ready_target = sbi_ready_cap(pool);
	pthread_cond_signal(&pool->ready_cond);
	pages = (long)pool->ready_floor;
	pthread_mutex_unlock(&pool->lock);
	/* A client of sparsebufd: the lease must cover the floor. Asked
	 * here, from what the machine's budget has free (the ready thread
	 * never waits for the daemon); what is not granted now the lease
	 * thread asks for again while the floor lacks it (lease_serve.c). */
	sbi_lease_floor(pool);
	return pages * (long)pool->page_size;
}

/* ---- the default pool ------------------------------------------------------- */

static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sb_pool *default_pool;	/* default_lock */
static int default_err;			/* default_lock */
static unsigned default_gen = ~0u;	/* default_lock */

/* fork(): default_lock is held across it (taken before the pools', so in
 * the order make_default takes them), and a child starts without one. */
static void default_prepare(void)
{
	pthread_mutex_lock(&default_lock);
}

static void default_parent(void)
{
	pthread_mutex_unlock(&default_lock);
}

static void default_child(void)
{
	default_pool = NULL;
	pthread_mutex_init(&default_lock, NULL);
}

static const struct sbi_fork_hooks default_hooks = {
	default_prepare, default_parent, default_child,
};

/* The default pool destroyed: the next call builds a new one. */
static void default_forget(struct sb_pool *pool)
{
	pthread_mutex_lock(&default_lock);
	if (default_pool == pool) {
		default_pool = NULL;
		default_gen = ~0u;
	}
	pthread_mutex_unlock(&default_lock);
}

/* default_lock held. */
static void make_default(void)
{
	struct sb_pool_opts opts;
	int err = sbi_env_error();

	default_gen = atomic_load(&sbi_fork_gen);
	default_pool = NULL;
	if (err) {
		default_err = err;
		return;
	}
	sbi_env_opts(&opts, sizeof(opts));
	if (sbi_env_daemon()) {
		/* SPARSEBUF_DAEMON: a client of sparsebufd. No daemon now:
		 * SPARSEBUF_DAEMON_FALLBACK says whether to run alone. With
		 * a floor asked for (SPARSEBUF_MIN_BYTES), only when there is
		 * no daemon: one that refuses the floor, or cannot be spoken
		 * to, is there, and running alone would not give the
		 * reservation either. Nor when it does not serve pools of
		 * huge pages (-EOPNOTSUPP, an older daemon): running alone
		 * would leave the machine's budget without saying so. */
		default_pool = sb_pool_connect_sz(sbi_env_daemon(), &opts,
						  sizeof(opts), &err);
		if (default_pool || sbi_env_daemon_fail() || err == -EINVAL ||
		    err == -EOPNOTSUPP ||
		    (opts.min_bytes && err != -ENOENT &&
		     err != -ECONNREFUSED)) {
			default_err = default_pool ? 0 : err;
			if (!default_pool)
				sbi_err("the default pool is unavailable: "
					"sparsebufd at %s: %s",
					sbi_env_daemon(), strerror(-err));
			return;
		}
		sbi_warn("no sparsebufd at %s (%s): the default pool runs on "
			 "its own budget (SPARSEBUF_DAEMON_FALLBACK=local)",
			 sbi_env_daemon(), strerror(-err));
	}
	/* The whole struct: the exported sb_pool_create takes 0.1's, which
	 * has no flags (SPARSEBUF_HUGETLB). */
	default_pool = sb_pool_create_sz(&opts, sizeof(opts), &err);
	default_err = default_pool ? 0 : err;
	if (!default_pool)
		sbi_err("the default pool is unavailable: %s", strerror(-err));
}

SB_API struct sb_pool *sb_default_pool(void)
{
	struct sb_pool *pool;

	pthread_mutex_lock(&default_lock);
	if (default_gen != atomic_load(&sbi_fork_gen))
		make_default();
	pool = default_pool;
	pthread_mutex_unlock(&default_lock);
	return pool;
}

SB_API int sb_default_pool_error(void)
{
	int err;

	pthread_mutex_lock(&default_lock);
	if (default_gen != atomic_load(&sbi_fork_gen))
		make_default();
	err = default_err;
	pthread_mutex_unlock(&default_lock);
	return err;
}
