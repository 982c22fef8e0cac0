/* SPDX-License-Identifier: MIT */
/*
 * Private declarations shared by the files of libsparsebuf.
 *
 * Lock order (outer to inner), written down once:
 *
 *   pool->layout (rwlock: read by every VMA change, write by fork prepare)
 *     -> pool->reg_lock (rwlock: the address -> buffer registry)
 *       -> buf->lock (mutex; two buffers: lower id first)
 *         -> pool->lock (mutex: heaps, page states, budget)
 *           -> pool->pf_lock (mutex: the prefetch queue, a leaf)
 *
 * The library never touches registered memory (a buffer's range) while it
 * holds any of these, so a thread stopped on a fault in a buffer never holds
 * one, and the fault-handler thread may take them all. The fault path
 * allocates with mmap only (never malloc), logs with write(2) only, and
 * waits on nothing a faulting thread could hold.
 */
#ifndef SPARSEBUF_INTERNAL_H
#define SPARSEBUF_INTERNAL_H

#include "sparsebuf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define SB_API __attribute__((visibility("default")))

#define SBI_MIN_PAGE ((size_t)4096)
#define SBI_MAX_HEAP_PAGES ((uint32_t)1 << 22)

/* ---- log.c ---------------------------------------------------------------*/

enum { SBI_LOG_NONE, SBI_LOG_ERROR, SBI_LOG_WARN, SBI_LOG_INFO, SBI_LOG_DEBUG };
extern int sbi_log_level;
/* Formats into a stack buffer and write(2)s it: safe on the fault path. */
void sbi_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
#define sbi_err(...) sbi_log(SBI_LOG_ERROR, __VA_ARGS__)
#define sbi_warn(...) sbi_log(SBI_LOG_WARN, __VA_ARGS__)
#define sbi_info(...) sbi_log(SBI_LOG_INFO, __VA_ARGS__)
#define sbi_debug(...) sbi_log(SBI_LOG_DEBUG, __VA_ARGS__)

/* ---- config.c: SPARSEBUF_* environment ------------------------------------*/

/* Parse "123", "256K", "64M", "2G", "1T" (binary units, optional "iB"/"B").
 * Returns 0 or -EINVAL (garbage) / -ERANGE (overflow). */
int sbi_parse_size(const char *s, size_t *out);
/* Options from the environment as parsed by the constructor, and the -errno
 * of the first bad variable (0 if none). */
void sbi_env_opts(struct sb_pool_opts *opts);
int sbi_env_error(void);
/* SPARSEBUF_FAULT_THREADS: handler threads per pool (0 = one per CPU). */
int sbi_env_fault_threads(void);
/* NULL if the options are valid, else why not. */
const char *sbi_opts_check(const struct sb_pool_opts *opts);

/* ---- probe.c: what the kernel allows --------------------------------------*/

const struct sb_features *sbi_features(void);
/* Open a userfaultfd the way the probe found to work, negotiate features
 * (a subset of what the kernel offers). Returns the fd or -errno. */
int sbi_uffd_open(uint64_t features);
long sbi_map_count(void);

/* ---- meta.c: library metadata memory (mmap, never malloc) -----------------*/

/* Zeroed, lazily backed; inherited by fork()ed children only if asked.
 * Safe on the fault path because it takes no user-space lock. */
void *sbi_meta_alloc(size_t bytes, bool inherit);
void sbi_meta_free(void *p, size_t bytes);

/* ---- heap.c: one placement heap (a memfd) ---------------------------------*/

enum sbi_page_state {
	SBI_PG_UNBACKED = 0,	/* free, no physical memory (a hole) */
	SBI_PG_DIRTY,		/* free, backed, old contents: zero before use */
	SBI_PG_READY,		/* free, backed, zeroed */
	SBI_PG_BUSY,		/* free, being zeroed/backed/punched, off lock */
	SBI_PG_USED,		/* holds data for >= 1 buffer page */
};

struct sbi_heap {
	int fd;			/* memfd: can cross a UNIX socket (daemon) */
	uint32_t slot;		/* index in pool->heaps */
	uint32_t npages;
	uint64_t serial;	/* unique per pool: stale run hints detect reuse */
	char *map;		/* pool-side mapping, never registered */
	/* Protected by pool->lock. */
	uint32_t nused;		/* pages in state USED */
	uint32_t nready, ndirty, nbusy;
	uint32_t *refs;		/* holders of each USED page */
	uint32_t *owner;	/* run earmark of a free page (buffer id, 0) */
	uint8_t *state;		/* enum sbi_page_state */
};

struct sbi_heap *sbi_heap_create(size_t heap_size, size_t page_size,
				 int numa_node, int *err);
void sbi_heap_destroy(struct sbi_heap *heap, size_t page_size);
/* Allocate physical memory for pages [idx, idx+n): returns 0 or -ENOMEM /
 * -ENOSPC without crashing, unlike a fault that fails to allocate. */
int sbi_heap_back(struct sbi_heap *heap, uint32_t idx, uint32_t n,
		  size_t page_size);
/* Make a backed range read as zeros. fresh: just allocated (fault it in
 * and let the kernel zero); else overwrite old contents. */
void sbi_heap_zero(struct sbi_heap *heap, uint32_t idx, uint32_t n,
		   size_t page_size, bool fresh);
/* Give the physical memory back (hole punch). */
void sbi_heap_punch(struct sbi_heap *heap, uint32_t idx, uint32_t n,
		    size_t page_size);

/* ---- pool.c ----------------------------------------------------------------*/

/* A page id names a page of the pool: slot * pages_per_heap + index. In a
 * buffer's page table it is stored plus one, so that 0 means "no page". */
typedef uint32_t sbi_pid;

struct sbi_reg {
	uintptr_t start, end;
	struct sb_buf *buf;
};

struct sb_pool {
	/* Immutable after creation. */
	size_t page_size;
	size_t heap_size;
	uint32_t page_shift;
	uint32_t pages_per_heap;
	size_t max_pages;	/* budget in pages; SIZE_MAX = unlimited */
	size_t max_bytes;
	int numa_node;
	int uffd;		/* MISSING and WP faults: the handler thread */
	int uffd_sigbus;	/* UFFD_FEATURE_SIGBUS: strict buffers */
	int quit_fd;		/* eventfd: stops the handler thread */
	bool can_wp;		/* copy-on-write supported */
	bool can_poison;
	unsigned fork_gen;	/* sbi_fork_gen at creation */
	pthread_t ready_thread;
	int nfault;		/* fault-handler threads, one per CPU */
	struct sbi_fault_thread *faulters;

	pthread_rwlock_t layout;
	pthread_rwlock_t reg_lock;
	struct sbi_reg *reg;	/* sorted by start; reg_lock */
	size_t nreg, reg_cap;
	uint32_t next_buf_id;	/* reg_lock (write) */

	pthread_mutex_t lock;
	pthread_cond_t ready_cond;	/* work for the ready thread */
	pthread_cond_t busy_cond;	/* a BUSY page changed state */
	uint64_t busy_gen;		/* bumped when a BUSY page is done */
	uint64_t alloc_seq;		/* bumped by every allocation and free */
	int caller_cpu;			/* CPU of the last allocating thread */
	bool ready_idle;		/* the ready thread sleeps long: wake it */
	bool stopping;
	bool want_site;		/* a run was claimed: ready the next site */
	unsigned trimming;	/* sb_pool_trim running: ready thread idles */
	struct sbi_heap **heaps;	/* by slot, NULL = free slot */
	uint32_t heap_cap;	/* slots reserved (lazily backed) */
	uint32_t heap_hi;	/* 1 + highest slot in use: loops stop here */
	uint32_t nheaps;
	uint64_t heap_serial;
	size_t used;		/* pages in state USED */
	size_t resident;	/* pages backed: USED + DIRTY + READY + BUSY */
	size_t ready;		/* pages in state READY */
	size_t dirty;		/* pages in state DIRTY */
	size_t ready_target;	/* adaptive reserve, see ready.c */
	size_t ready_min, ready_max;
	size_t ready_floor;	/* sb_pool_reserve: target never below */
	size_t misses;		/* sync prepares since the last tick */
	unsigned quiet_ticks;	/* ticks in a row without a miss */
	/* sb_buf_prefetch requests, served by the ready thread first. Their
	 * own lock, held for a push or a pop only: the thread that queues
	 * must not wait behind the ready thread's longer work. */
	pthread_mutex_t pf_lock;
	pthread_cond_t pf_cond;		/* pf_inflight changed */
	struct sbi_prefetch *pf;	/* pf_lock */
	uint32_t pf_head, pf_tail, pf_cap;	/* pf_lock */
	struct sb_buf *pf_inflight;	/* pf_lock: the buffer being placed for */
	/* Pages worth making ready: [0] the next page of each growing run,
	 * [1] the one after (served only when [0] is empty). */
	struct sbi_ring {
		sbi_pid *pid;
		uint32_t head, tail, cap;
	} wanted[2];

	/* Counters: relaxed atomics, read by sb_pool_stats. */
	_Atomic uint64_t n_faults, n_maps, n_unmaps, n_cow, n_fault_places,
		n_sigbus, n_sync_prepares;

	struct sb_pool *next_pool;	/* global list, for fork handling */
};

static inline struct sbi_heap *sbi_pid_heap(struct sb_pool *pool, sbi_pid p)
{
	return pool->heaps[p / pool->pages_per_heap];
}

static inline uint32_t sbi_pid_index(struct sb_pool *pool, sbi_pid p)
{
	return p % pool->pages_per_heap;
}

static inline char *sbi_pid_mem(struct sb_pool *pool, sbi_pid p)
{
	return sbi_pid_heap(pool, p)->map +
	       ((size_t)sbi_pid_index(pool, p) << pool->page_shift);
}

/* ---- process.c: per-process state, fork, the default pool -----------------*/

/* 0, or -ECHILD for a pool its creator had before fork()ing this child. */
int sbi_pool_check(const struct sb_pool *pool);
extern _Atomic unsigned sbi_fork_gen;
void sbi_process_add_pool(struct sb_pool *pool);
void sbi_process_remove_pool(struct sb_pool *pool);

/* Take n pages for buf, continuing the heap run after hint1 (the pid + 1
 * of the buffer's previous page, or 0). out[] receives plain pids of pages
 * that are zeroed, backed and referenced once. All or nothing: -ENOMEM
 * when the budget or the kernel says no. */
int sbi_pool_alloc(struct sb_pool *pool, struct sb_buf *buf, sbi_pid hint1,
		   size_t n, sbi_pid *out);
/* Add / drop one reference to each page. These take page-table form (pid
 * + 1, entries of 0 skipped). A page whose last reference goes returns to
 * the pool. */
void sbi_pool_ref(struct sb_pool *pool, const sbi_pid *pids, size_t n);
void sbi_pool_put(struct sb_pool *pool, const sbi_pid *pids, size_t n);
uint32_t sbi_pool_refs(struct sb_pool *pool, sbi_pid p);
/* A free page leaves its free state (for USED or BUSY): its counter goes
 * down, an unbacked one becomes resident. Returns the state it had.
 * pool->lock held. */
enum sbi_page_state sbi_page_unfree(struct sb_pool *pool, struct sbi_heap *h,
				    uint32_t i);
/* Run sites and heaps, for the ready thread; pool->lock held. */
uint32_t sbi_run_pages(const struct sb_pool *pool);
bool sbi_pool_find_site(struct sb_pool *pool, uint32_t want,
			struct sbi_heap **hp, uint32_t *startp, uint32_t *lenp);
struct sbi_heap *sbi_pool_add_heap(struct sb_pool *pool, int *err);
/* Record the calling thread's CPU: the ready thread keeps off it. */
void sbi_pool_note_caller(struct sb_pool *pool);
/* Wait until at least pages pages are ready (or timeout_ms passes). */
void sbi_pool_wait_ready(struct sb_pool *pool, size_t pages, int timeout_ms);
/* Forget buf's run earmark (the buffer is going away). */
void sbi_pool_drop_run(struct sb_pool *pool, struct sb_buf *buf);
/* Look up the buffer that owns addr; the caller holds reg_lock. */
struct sb_buf *sbi_pool_lookup(struct sb_pool *pool, uintptr_t addr);

/* ---- verify.c ---------------------------------------------------------------*/

/* For tests: 0 if every counter and reference agrees, else -EUCLEAN with
 * the first disagreement described in why. */
int sbi_pool_verify(struct sb_pool *pool, char *why, size_t len);

/* ---- ready.c: the reserve of zeroed pages ----------------------------------*/

void *sbi_ready_thread(void *arg);
/* Queue a free page worth making ready (prio 0: needed next, 1: after
 * that); caller holds pool->lock. */
void sbi_ready_want(struct sb_pool *pool, sbi_pid p, int prio);
/* Release empty heaps and reserve pages; caller holds pool->lock and gets
 * it back. Returns pages released. keep_spare keeps one empty heap. */
size_t sbi_ready_trim(struct sb_pool *pool, bool keep_spare, bool all_ready);

/* ---- buf.c -----------------------------------------------------------------*/

/* Page-table entry of a buffer page. */
#define SBI_PTE_PID 0xffffffffull	/* pid + 1; 0 = no page */
#define SBI_PTE_SHARED (1ull << 32)	/* write-protected: copy on write */
#define SBI_PTE_POISON (1ull << 33)	/* a fault failed: SIGBUS on touch */
#define SBI_PTE_WPFAIL (1ull << 34)	/* a copy failed: SIGBUS on write */
#define SBI_PTE_PRIVMAP (1ull << 35)	/* mapped MAP_PRIVATE (shared in) */

struct sb_buf {
	struct sb_pool *pool;	/* immutable */
	char *base;		/* immutable, aligned to page_size */
	size_t length;		/* immutable, whole pages */
	size_t npages;
	unsigned flags;
	uint32_t id;		/* nonzero, unique in the pool */
	pthread_mutex_t lock;
	uint64_t *pte;		/* buf->lock; sbi_meta memory */
	size_t nplaced;		/* buf->lock */
	/* Run earmark (buf->lock): the heap extent this buffer grows into. */
	uint64_t run_serial;
	uint32_t run_slot, run_start, run_end;
	uint32_t run_next;	/* first page of the run not yet taken */
};

/* Place a page under every unplaced page of [first, end) (page indices):
 * sb_buf_map after argument checks. Takes the layout and buffer locks. */
long sbi_buf_place(struct sb_buf *buf, size_t first, size_t end);

/* ---- prefetch.c: placement in the background -------------------------------*/

struct sbi_prefetch {
	struct sb_buf *buf;
	size_t first, end;	/* page indices */
};

/* Drop queued requests of buf overlapping [first, end) and wait for one in
 * flight on buf. Takes pool->lock; call with no buffer lock held. */
void sbi_prefetch_cancel(struct sb_buf *buf, size_t first, size_t end);
/* The ready thread: serve one request if any. Called with pool->lock
 * held; released while placing. Returns true if it did something. */
bool sbi_prefetch_serve(struct sb_pool *pool);

/* ---- vma.c: the address-space operations on a buffer's range ---------------*/

/* Map n pages of heap memory starting at pid over pages [idx, idx+n).
 * read_only maps without write permission (the first step of sharing). */
int sbi_vma_place(struct sb_buf *buf, size_t idx, size_t n, sbi_pid pid,
		  bool read_only);
/* Map n pages that other buffers also show, write-protected through uffd
 * (the pool's: writes copy; the SIGBUS one: writes fail), with no window
 * in which a write could reach the shared page. */
int sbi_vma_place_shared(struct sb_buf *buf, size_t idx, size_t n,
			 sbi_pid pid, int uffd);
/* Put registered anonymous memory back over [idx, idx+n). */
int sbi_vma_unplace(struct sb_buf *buf, size_t idx, size_t n);
/* Write-protect placed pages [idx, idx+n) so a write faults (WP mode). */
int sbi_vma_protect(struct sb_buf *buf, size_t idx, size_t n, int uffd);
int sbi_vma_unprotect(struct sb_buf *buf, size_t idx, size_t n);
/* Make a touch of unplaced page idx raise SIGBUS, and wake its waiters. */
int sbi_vma_poison(struct sb_buf *buf, size_t idx);
/* Make writes to placed page idx raise SIGBUS (copy impossible). */
int sbi_vma_wpfail(struct sb_buf *buf, size_t idx, sbi_pid pid);
void sbi_vma_wake(struct sb_buf *buf, size_t idx);
int sbi_uffd_register(int uffd, void *addr, size_t len, uint64_t mode);

/* ---- fault.c ---------------------------------------------------------------*/

/* One handler per CPU the process may run on (up to SPARSEBUF_FAULT_THREADS,
 * default 4), each pinned: every handler polls the pool's uffd, and the one
 * on the faulting thread's CPU wins the race, so a fault costs two context
 * switches on one CPU instead of two cross-CPU wake-ups (tens of
 * microseconds each in a VM). */
struct sbi_fault_thread {
	struct sb_pool *pool;
	pthread_t thread;
	int cpu;		/* pinned CPU, -1 = not pinned */
};

void *sbi_fault_thread(void *arg);
/* Start the handlers; returns 0 or -errno (none left running). */
int sbi_fault_start(struct sb_pool *pool);
void sbi_fault_stop(struct sb_pool *pool);

/* ---- trace.h has the USDT probes -------------------------------------------*/

#endif /* SPARSEBUF_INTERNAL_H */
