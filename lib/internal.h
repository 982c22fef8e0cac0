/* SPDX-License-Identifier: MIT */
/*
 * Private declarations shared by the files of libsparsebuf.
 *
 * Lock order (outer to inner), written down once, and checked by make
 * lockcheck (lockcheck.c: the ranks below, SBI_HELD in the functions that
 * need a lock):
 *
 *   a KV prefix cache's lock (kv_cache.c: held across buffer calls)
 *   pool->layout (rwlock: read by every VMA change, write by fork prepare;
 *       several pools' only in the fork handlers, newest pool first)
 *     -> pool->reg_lock (rwlock: the address -> buffer registry)
 *       -> buf->lock (mutex; two buffers: lower id first; holding one,
 *          never wait for another: try it (eviction), or let go and wait
 *          with nothing held (share))
 *         -> pool->lock (mutex: heaps, page states, budget)
 *           -> pool->pf_lock (mutex: the prefetch queue, a leaf)
 *           -> disk->spill_lock, io engine and wait locks (leaves)
 *
 * The disk tier adds one rule: the I/O completion thread never blocks on a
 * buffer lock or the layout lock (it tries, and retries later), because a
 * thread may wait for I/O while holding them (eviction writes a buffer's
 * pages out under its lock). Nobody waits for I/O holding pool->lock.
 *
 * The library never touches registered memory (a buffer's range) while it
 * holds any of these, so a thread stopped on a fault in a buffer never holds
 * one, and the fault-handler thread may take them all. The fault path
 * allocates with mmap only (never malloc), logs with write(2) only, and
 * waits on nothing a faulting thread could hold.
 */
#ifndef SPARSEBUF_INTERNAL_H
#define SPARSEBUF_INTERNAL_H

/* The library sees the _sz entry points and the 0.1 ones, not the inline
 * wrappers programs get (sparsebuf.h, "Structs that grow"). */
#define SPARSEBUF_BUILD 1
#include "sparsebuf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define SB_API __attribute__((visibility("default")))

/* ---- lockcheck.c: the lock order above, checked in make lockcheck -------*/

enum {
	SBI_RANK_API = 1,	/* a KV prefix cache's lock: held across calls */
	SBI_RANK_LAYOUT,
	SBI_RANK_REG,
	SBI_RANK_BUF,		/* two: lower buffer id first */
	SBI_RANK_POOL,
	SBI_RANK_LEAF,		/* pf_lock, spill, I/O and wait locks */
};

#ifdef SBI_LOCK_DEBUG
void sbi_lk_rank(const void *lock, int rank, uint64_t key);
bool sbi_lk_held(const void *lock);
bool sbi_lk_holds_rank(int rank);
void sbi_lk_fail(const char *what, const char *file, int line);
void sbi_lk_fork_child(void);
#define SBI_LK_RANK(lock, rank, key) sbi_lk_rank((lock), (rank), (key))
/* The caller must hold lock (a mutex, or a rwlock for reading or writing). */
#define SBI_HELD(lock)                                                     \
	((void)(sbi_lk_held(lock) ||                                       \
		(sbi_lk_fail(#lock " not held", __FILE__, __LINE__), 0)))
/* The caller must hold no lock of this rank. */
#define SBI_NOT_HOLDING(rank)                                              \
	((void)(!sbi_lk_holds_rank(rank) ||                                \
		(sbi_lk_fail("a " #rank " lock held", __FILE__, __LINE__), 0)))
#define SBI_LK_FORK_CHILD() sbi_lk_fork_child()
#else
#define SBI_LK_RANK(lock, rank, key) ((void)(lock), (void)(rank), (void)(key))
#define SBI_HELD(lock) ((void)(lock))
#define SBI_NOT_HOLDING(rank) ((void)(rank))
#define SBI_LK_FORK_CHILD() ((void)0)
#endif

#define SBI_MIN_PAGE ((size_t)4096)
#define SBI_MAX_HEAP_PAGES ((uint32_t)1 << 22)

/* ---- log.c ---------------------------------------------------------------*/

enum { SBI_LOG_NONE, SBI_LOG_ERROR, SBI_LOG_WARN, SBI_LOG_INFO, SBI_LOG_DEBUG };
extern int sbi_log_level;
/* Formats into a stack buffer and write(2)s it: safe on the fault path. */
void sbi_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* CLOCK_MONOTONIC in milliseconds. */
uint64_t sbi_mono_ms(void);
/* Whether a line at `level` that could repeat without end (an I/O error a
 * read, a SIGBUS a touch) may be said now: the first through *last_ms (0
 * until then), then one a second at most; the caller says how many so
 * far. A level not logged takes nothing from the gate. */
bool sbi_log_gate(int level, _Atomic uint64_t *last_ms);
#define sbi_err(...) sbi_log(SBI_LOG_ERROR, __VA_ARGS__)
#define sbi_warn(...) sbi_log(SBI_LOG_WARN, __VA_ARGS__)
#define sbi_info(...) sbi_log(SBI_LOG_INFO, __VA_ARGS__)
#define sbi_debug(...) sbi_log(SBI_LOG_DEBUG, __VA_ARGS__)

/* ---- thread.c: the library's threads ------------------------------------*/

#include <sched.h>
/* The CPUs the process could use when the library was loaded. */
void sbi_process_cpus(cpu_set_t *set);
/* Start a library thread: every signal blocked, named name (15 characters
 * at most), on CPU cpu, or (cpu < 0) on the process's CPUs. 0 or -errno. */
int sbi_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg,
		     const char *name, int cpu);

/* ---- config.c: SPARSEBUF_* environment ------------------------------------*/

/* Parse "123", "256K", "64M", "2G", "1T" (binary units, optional "iB"/"B").
 * Returns 0 or -EINVAL (garbage) / -ERANGE (overflow). */
int sbi_parse_size(const char *s, size_t *out);
/* Options from the environment as parsed by the constructor, for a caller
 * whose struct sb_pool_opts is size bytes (SPARSEBUF_HUGETLB only where
 * it has flags), and the -errno of the first bad variable (0 if none). */
void sbi_env_opts(struct sb_pool_opts *opts, size_t size);
int sbi_env_error(void);
/* SPARSEBUF_FAULT_THREADS: handler threads per pool (0 = one per CPU). */
int sbi_env_fault_threads(void);
/* SPARSEBUF_DAEMON (NULL when unset), SPARSEBUF_DAEMON_FALLBACK=fail,
 * SPARSEBUF_DAEMON_WAIT_MS (default 5000). */
const char *sbi_env_daemon(void);
bool sbi_env_daemon_fail(void);
int sbi_env_daemon_wait_ms(void);
/* SPARSEBUF_DAEMON_CACHE=0: a client pool's KV caches stay local. */
bool sbi_env_daemon_cache(void);
/* SPARSEBUF_RECYCLE: false when set to 0 (read at each pool's creation). */
bool sbi_env_recycle(void);
bool sbi_env_home(void);
/* SPARSEBUF_PAGER=sync: the pread/pwrite pager even where io_uring works
 * (read where a pool sets up its disk tier, and by the probe). Any value
 * but sync and io_uring is logged and read as io_uring. Likewise the
 * switches above: a value but 0 and 1 is logged and read as 1. */
bool sbi_env_pager_sync(void);
/* SPARSEBUF_TOUCH: 1 (always), 0 (never) or -1 (unset or auto: when the
 * first access to a mapped page is slow, touch.c). */
int sbi_env_touch(void);
/* NULL if the options are valid, else why not. */
const char *sbi_opts_check(const struct sb_pool_opts *opts);
/* The system's default huge page size (0: none), and how many of them are
 * free now (/proc/meminfo; config.c). */
size_t sbi_hugetlb_page_bytes(void);
long sbi_hugetlb_pages_free(void);

/* ---- probe.c: what the kernel allows --------------------------------------*/

const struct sb_features *sbi_features(void);
/* Open a userfaultfd the way the probe found to work, negotiate features
 * (a subset of what the kernel offers). Returns the fd or -errno. */
int sbi_uffd_open(uint64_t features);
long sbi_map_count(void);
/* vm.max_map_count, read now (no probe: safe on the fault path). */
long sbi_max_map_count(void);
/* The folios the heaps (memfds) may get, in bytes, as the system's
 * shmem_enabled says now: 0 for 4 KiB ones. Read now; sparsebuf never
 * sets it. */
size_t sbi_shmem_folio_bytes(void);

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
	SBI_PG_EVICTED,		/* its data went to disk, its memory back:
				 * reserved, because the evicted buffer page
				 * still maps it (see evict.c); with no
				 * reference, a home heap's page that no
				 * buffer page names, reserved for the heap
				 * (sbi_heap.home) */
	SBI_PG_FOREIGN,		/* a page of an imported heap (import.c):
				 * never allocated, punched or evicted here */
};

/* heap->owner of a USED page being filled by a page-in (for the check). */
#define SBI_OWNER_IO 0xffffffffu

struct sbi_heap {
	int fd;			/* memfd: can cross a UNIX socket (daemon) */
	uint32_t slot;		/* index in pool->heaps */
	uint32_t npages;
	/* Imported (import.c): sparsebufd's cache heap `fid` from
	 * connection `fgen`. Every page FOREIGN, nused = npages (so no
	 * scan of free or used pages ever picks one), owner[] the pins
	 * this pool holds on each page at the daemon. */
	bool foreign;
	/* A live buffer's home heap (home.c): no page of it is ever free.
	 * One written into through the file or the pool side could get a
	 * folio spanning the holes of the home's evicted pages beside it,
	 * zeros that a clean home maps without a fault (docs/design.md,
	 * "Heap folios"). A page no buffer page names (the heap's tail past
	 * the buffer's pages, a lost page's home let go by its last holder)
	 * stays EVICTED with no reference. pool->lock. */
	bool home;
	uint32_t fid;
	uint64_t fgen;
	/* The file offset of page 0 (an imported heap larger than the
	 * pool's heaps is a window each; 0 otherwise), and for an imported
	 * window, the daemon's index of its page 0. */
	off_t foff;
	uint32_t fbase;
	uint32_t nheld;		/* imported: pages with references (none:
				 * the window is let go of, pool.c) */
	uint64_t serial;	/* unique per pool: stale run hints detect reuse */
	char *map;		/* pool-side mapping, never registered */
	/* A clean home heap's copy-in window (home.c): a second pool-side
	 * mapping, registered MISSING with the pool's SIGBUS userfaultfd,
	 * that page-ins copy their pages into (UFFDIO_COPY); NULL else. */
	char *fill;
	bool hugetlb;		/* a hugetlbfs file (sbi_page_source_ops) */
	/* Pages accessed through map since its last sweep (heap.c). */
	_Atomic uint32_t pool_ptes;
	/* Protected by pool->lock. */
	uint32_t nused;		/* pages in state USED */
	uint32_t nready, ndirty, nbusy, nevicted;
	uint32_t *refs;		/* holders of each USED page */
	uint32_t *owner;	/* run earmark of a free page (buffer id, 0) */
	uint8_t *state;		/* enum sbi_page_state */
	/* Eviction's reverse map (disk tier): where a USED page of an
	 * evictable buffer is placed (0: nowhere evictable), and its clock
	 * bit. Written under the buffer's lock, read under pool->lock:
	 * relaxed atomics, validated against the page table before use. */
	uintptr_t *raddr;
	uint8_t *rbit;		/* SBI_RBIT_* */
};

enum { SBI_RBIT_COLD = 0, SBI_RBIT_REF = 1, SBI_RBIT_HOT = 2 };

/* ---- source.c: where a pool's physical pages come from -------------------*/

struct sbi_page_source_ops {
	const char *name;
	/* Heaps on hugetlbfs (SB_POOL_HUGETLB): files with no write(2), so
	 * pages are allocated and zeroed by fallocate (heap.c), and mapped
	 * MAP_NORESERVE (the pool allocates before it maps). */
	bool hugetlb;
	/* A file of `bytes` (sized, sealed against resizing) the pool maps
	 * MAP_SHARED and places pages from. Returns it, or -errno. */
	int (*heap_fd)(void *ctx, size_t bytes);
	/* Every page of such a file is free: give the memory back (the pool
	 * closes the descriptor after). */
	void (*heap_release)(void *ctx, int fd, size_t bytes);
	/* Bytes the pool may hold (0: no limit), given what it was asked
	 * to hold (sb_pool_opts.max_bytes). */
	size_t (*budget)(void *ctx, size_t asked);
};

struct sbi_page_source {
	const struct sbi_page_source_ops *ops;
	void *ctx;
};

/* The process's own memfds; hugetlb: on the system's huge pages. */
struct sbi_page_source sbi_memfd_source(bool hugetlb);
struct sbi_dclient;
/* Heaps from sparsebufd through c, the process's own memfds while it is
 * away (a heap is address space; memory is what the lease counts);
 * hugetlb: on the system's huge pages, both. */
struct sbi_page_source sbi_daemon_source(struct sbi_dclient *c, bool hugetlb);

/* ---- dclient.c: a client pool's connection to sparsebufd ----------------*/

/* What the connection needs from the pool above it (called on the
 * connection's reader thread, with no lock of the connection held). */
struct sbi_dclient_cbs {
	void *arg;
	/* Bytes the pool holds now: told to a new daemon on reconnection. */
	uint64_t (*held)(void *arg);
	/* The daemon wants this many bytes back (answer with SBD_RETURN). */
	void (*reclaim)(void *arg, uint64_t bytes);
	/* The connection was lost, or made again. */
	void (*lost)(void *arg);
	void (*reconnected)(void *arg);
};

/* Connect to the daemon at path and say HELLO, then ask for a floor of
 * floor bytes when not 0: the connection, or NULL with *err (-ENOENT,
 * -ECONNREFUSED: no daemon; -EACCES; -EPROTO; the floor refused: -EPERM,
 * -ENOSPC). */
struct sbi_dclient *sbi_dclient_open(const char *path, size_t page_size,
				     bool hugetlb, uint64_t floor, int *err);
/* Start its reader thread (replies, reclaims, reconnection). */
int sbi_dclient_start(struct sbi_dclient *c, const struct sbi_dclient_cbs *cbs);
void sbi_dclient_close(struct sbi_dclient *c);
/* In a fork()ed child: close the descriptors, touch no lock. */
void sbi_dclient_fork_child(struct sbi_dclient *c);
bool sbi_dclient_connected(struct sbi_dclient *c);
const char *sbi_dclient_path(const struct sbi_dclient *c);
/* Ask for at least min, at most want more bytes; waits up to wait_ms for
 * an answer, through a daemon restart. 0 with *granted, -ENOMEM (refused:
 * nothing anywhere could be freed), -ENOTCONN or -ETIMEDOUT (no daemon). */
int sbi_dclient_lease(struct sbi_dclient *c, uint64_t min, uint64_t want,
		      uint64_t resident, uint64_t used, int wait_ms,
		      uint64_t *granted);
/* A message that wants no reply (SBD_RETURN, SBD_REPORT); dropped when
 * there is no daemon. */
void sbi_dclient_tell(struct sbi_dclient *c, unsigned type, uint64_t a,
		      uint64_t b, uint64_t resident, uint64_t used);
/* A heap file of bytes from the daemon: its descriptor, or -errno. */
int sbi_dclient_heap(struct sbi_dclient *c, uint64_t bytes, int wait_ms);
/* Keep want heap files of bytes fetched ahead (the lease thread), and take
 * one without a round trip (the page source, under the pool's lock):
 * -EAGAIN when none is at hand. */
void sbi_dclient_stash_heaps(struct sbi_dclient *c, uint64_t bytes, int want);
int sbi_dclient_take_heap(struct sbi_dclient *c, uint64_t bytes);
/* The heap file fd is given back (every page punched). */
void sbi_dclient_heap_free(struct sbi_dclient *c, int fd);
/* The machine-wide prefix cache (daemon/cache.c; lib/dproto.h describes
 * the messages). Round trips: never under a pool's lock. gen: the
 * connection a page reference belongs to. */
/* The machine's budget (the daemon's max_bytes). */
uint64_t sbi_dclient_max(struct sbi_dclient *c);
/* The floor the daemon granted this connection (0: none). */
uint64_t sbi_dclient_floor(struct sbi_dclient *c);
/* The lease the daemon counted for us at the last HELLO. */
uint64_t sbi_dclient_accepted(struct sbi_dclient *c);
/* The connection's generation (one more at each reconnection). */
uint64_t sbi_dclient_gen(struct sbi_dclient *c);
/* The daemon's page size (the cache's), 0 when not connected. */
size_t sbi_dclient_cache_page(struct sbi_dclient *c);
/* Start putting a block: npages pages (refs, pinned) to fill, then
 * sbi_dclient_cache_done. -EEXIST, -ENOENT, -ENOSPC, -ENOTCONN... */
int sbi_dclient_cache_put(struct sbi_dclient *c, uint64_t key, uint64_t pkey,
			  uint32_t depth, const int32_t *tokens, uint32_t ntok,
			  uint32_t npages, uint64_t *refs, uint64_t *gen);
int sbi_dclient_cache_done(struct sbi_dclient *c, uint64_t key, bool ok,
			   uint64_t gen);
/* A block of ntok tokens and npages pages (refs, pinned), or -ENOENT. */
int sbi_dclient_cache_get(struct sbi_dclient *c, uint64_t key, uint64_t pkey,
			  uint32_t depth, int32_t *tokens, uint32_t ntok,
			  uint64_t *refs, uint32_t npages, uint64_t *gen);
/* A cache heap's descriptor (and *bytes), or -errno (-ESTALE: the
 * connection is not gen any more). */
int sbi_dclient_cache_heap(struct sbi_dclient *c, uint32_t id, uint64_t gen,
			   uint64_t *bytes);
/* Drop count pins of ref: queued (callable under a pool's lock), sent by
 * sbi_dclient_cache_flush or once many are queued. */
void sbi_dclient_cache_unpin(struct sbi_dclient *c, uint64_t gen,
			     uint64_t ref, uint32_t count);
void sbi_dclient_cache_flush(struct sbi_dclient *c);
/* Name a chain's root for listings (best effort). */
void sbi_dclient_cache_model(struct sbi_dclient *c, uint64_t root,
			     const char *name);

/* ---- heap.c -------------------------------------------------------------------*/

/* A heap of heap_size bytes on a file from src (bound to numa_node when
 * >= 0). */
struct sbi_heap *sbi_heap_create(const struct sbi_page_source *src,
				 size_t heap_size, size_t page_size,
				 int numa_node, int *err);
/* A heap of bytes over fd (taken: closed on failure too), imported from
 * sparsebufd's cache: every page FOREIGN. hugetlb: fd is on hugetlbfs
 * (the pool's own heaps are). */
struct sbi_heap *sbi_heap_import(int fd, off_t off, size_t bytes,
				 size_t page_size, bool hugetlb, int *err);
/* Unmap it and give its file back to src (an imported heap's file is
 * only closed). */
void sbi_heap_destroy(const struct sbi_page_source *src, struct sbi_heap *heap,
		      size_t page_size);
/* Make pages [idx, idx+n) hold zeros, allocating what has no memory yet:
 * written through the file (pwrite; on hugetlbfs, which has no write(2),
 * punched and allocated again by fallocate, which zeroes), never through a
 * mapping, so that no page-table entry is made on the pool's side and the
 * mmap lock is never taken. Returns 0, or -ENOMEM when memory cannot be had (a fault that
 * cannot allocate would raise SIGBUS instead); pages may then be partly
 * allocated (punch them). */
int sbi_heap_zero(struct sbi_heap *heap, uint32_t idx, uint32_t n,
		  size_t page_size);
/* Write len bytes (at most a page) from src into page idx of the heap,
 * through the file (pwrite; on hugetlbfs, allocated by fallocate and then
 * copied through the pool's mapping). 0, or -ENOMEM when memory cannot be had, or
 * -errno. */
int sbi_heap_write(struct sbi_heap *heap, uint32_t idx, const void *src,
		   size_t len, size_t page_size);
/* The CRC-32C of the first len bytes of page idx, read through the heap's
 * file (sbi_file_read_all) into scratch, n bytes at a time: 0 or -errno.
 * Not through the pool-side mapping: a read from user mode
 * there maps each 4 KiB into it, which on a host that shadows page tables
 * costs 7-9 us of the hypervisor's per 4 KiB (bench/pagecost), 0.5 ms a
 * 256 KiB page, and the entries must then be swept again
 * (sbi_heap_unmap_pool). */
int sbi_heap_crc32c(const struct sbi_heap *heap, uint32_t idx, size_t len,
		    size_t page_size, void *scratch, size_t n, uint32_t *crc);
/* Back unbacked pages (their data is zero): sbi_heap_zero, unless the heap's
 * folios may be larger than a page (big_folios) and the range has memory
 * already. */
int sbi_heap_back(struct sbi_heap *heap, uint32_t idx, uint32_t n,
		  size_t page_size, bool big_folios);
/* After the library read or wrote a page of the heap through sbi_pid_mem:
 * its pool-side page-table entry is to go, so that a page placed in a
 * buffer is mapped once and the process's RSS counts it once. They go in
 * batches: every SBI_POOL_SWEEP_BYTES of pages noted, one MADV_DONTNEED of
 * the whole pool-side mapping (sbi_heap_sweep_pool), because each madvise
 * costs a TLB shootdown (see heap.c). The data stays (shmem); an access
 * through the pool side meanwhile faults the entry back in. The caller
 * holds a page of the heap (so the heap outlives the call). */
#define SBI_POOL_SWEEP_BYTES ((size_t)2 << 20)
void sbi_heap_unmap_pool(struct sbi_heap *heap, size_t page_size);
/* Drop every pool-side entry of the heap now, if any page was noted since
 * the last sweep. pool->lock held, or a page of the heap held. */
void sbi_heap_sweep_pool(struct sbi_heap *heap, size_t page_size);
/* Give the physical memory back (hole punch). */
void sbi_heap_punch(struct sbi_heap *heap, uint32_t idx, uint32_t n,
		    size_t page_size);

/* ---- pool.c ----------------------------------------------------------------*/

/* A page id names a page of the pool: slot * pages_per_heap + index. */
typedef uint32_t sbi_pid;

/* A page reference: the form a buffer's page table stores, the page id
 * plus one, so that 0 means "no page". A struct, so that the compiler
 * tells it from a page id: passing one for the other does not build. */
typedef struct {
	uint32_t v;
} sbi_ptref;

#define SBI_NOPAGE ((sbi_ptref){0})

static inline sbi_ptref sbi_ptref_of(sbi_pid pid)
{
	return (sbi_ptref){pid + 1};
}

static inline bool sbi_ptref_none(sbi_ptref r)
{
	return r.v == 0;
}

/* The page id of a reference that names a page. */
static inline sbi_pid sbi_ptref_pid(sbi_ptref r)
{
	return r.v - 1;
}

/* A page-table entry that says: page pid is placed here. */
static inline uint64_t sbi_pte_placed(sbi_pid pid)
{
	return (uint64_t)pid + 1;
}

struct sbi_reg {
	uintptr_t start, end;
	struct sb_buf *buf;
};

/* A growth watch (grow.c). */
#define SBI_GROW_MAX 256	/* buffers watched at once, per pool */
#define SBI_TOUCH_MAX 512	/* touch requests queued, per pool */

struct sbi_grow {
	struct sb_buf *buf;	/* NULL: free slot */
	size_t cur;		/* the frontier: the next goes once it is written */
	uint64_t since_ms;	/* last progress */
	uint64_t due_ms;	/* not looked at again before */
	bool urgent;		/* its owner once placed the page ahead itself:
				 * served before the others (grow_serve.c) */
};

struct sbi_stat_page;

/* A request for the ready thread: place [first, end) (prefetch.c). */
struct sbi_prefetch {
	struct sb_buf *buf;
	size_t first, end;	/* page indices */
};

/* Pages to touch (touch.c): [first, end), the first from byte off. */
struct sbi_touch {
	struct sb_buf *buf;
	size_t first, end;	/* page indices */
	size_t off;		/* bytes of page first already touched */
};

struct sb_pool {
	/* Immutable after creation. */
	unsigned id;		/* 1, 2, ... in the process: names it in logs */
	struct sbi_stat_page *stat;	/* stat.c: counters for other processes */
	int stat_fd;
	struct sbi_page_source source;	/* source.c: where heaps come from */
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
	/* Eviction keeps a page's memory for the pool instead of punching
	 * it: minor faults on shmem (UFFD_FEATURE_MINOR_SHMEM, Linux 5.14)
	 * catch a touch of the buffer page it leaves. SPARSEBUF_RECYCLE=0
	 * turns it off. See evict.c. */
	bool can_recycle;
	/* Minor faults on shmem (UFFD_FEATURE_MINOR_SHMEM): an evicted page
	 * is registered for them too, recycled or not (evict.c, freeze). */
	bool can_minor;
	/* File buffers get home mappings (home.c): SPARSEBUF_HOME, a pool
	 * of its own heaps, minor faults on shmem (Linux 5.14), pages of
	 * 64 KiB or less. */
	bool can_home;
	/* Heaps on hugetlbfs (SB_POOL_HUGETLB). */
	bool hugetlb;
	/* Such a pool found no huge page free in the system at its last
	 * try (alloc.c): what it holds is its budget for now, and
	 * read-ahead stays within a quarter of it (pagein.c). */
	_Atomic bool hugetlb_short;
	/* The ready thread takes placed pages' first access (touch.c):
	 * SPARSEBUF_TOUCH, or a probe that found it slow. */
	bool touch_placed;
	/* Bytes one read fault maps on a placed page (the kernel's
	 * fault-around, sb_features.fault_around_pages): placements fill
	 * their page tables with a read every so many bytes, 0 = with
	 * MAP_POPULATE (vma.c, sbi_vma_place). */
	size_t fault_around;
	unsigned fork_gen;	/* sbi_fork_gen at creation */
	pthread_t ready_thread;
	int nfault;		/* fault-handler threads, one per CPU */
	struct sbi_fault_thread *faulters;
	int nwaiters;		/* faulters set up, fixed while they run */
	int fault_kick;		/* eventfd: the handlers' order changed, -1 */
	int fault_first_cpu;	/* whose handler a fault wakes first (atomic) */
	bool fault_steering;	/* a handler reorders them (atomic) */
	uint64_t fault_last_ms;	/* a fault served then (atomic) */

	pthread_rwlock_t layout;
	pthread_rwlock_t reg_lock;
	struct sbi_reg *reg;	/* sorted by start; reg_lock */
	size_t nreg, reg_cap;
	uint32_t next_buf_id;	/* reg_lock (write) */

	pthread_mutex_t lock;
	pthread_cond_t ready_cond;	/* work for the ready thread */
	pthread_cond_t busy_cond;	/* a BUSY page changed state */
	uint64_t busy_gen;		/* bumped when a BUSY page is done */
	/* Bumped by the allocations and frees that give the ready thread
	 * work (the reserve drawn on, pages freed); not by a home page's
	 * (home.c), which needs nothing made ready. The ready thread polls
	 * while it moves, and a polling thread keeps the process on the
	 * other CPU: every TLB flush (a release's punch) then interrupts it,
	 * 40 us more a flush in a VM (docs/design.md, "The ready thread"). */
	uint64_t alloc_seq;
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
	size_t evicted;		/* pages in state EVICTED */
	size_t ready_target;	/* adaptive reserve, see ready.c */
	size_t ready_min, ready_max;
	/* The heaps' folios may be larger than a page (shmem_enabled): an
	 * unbacked page may have memory already (sbi_heap_back). */
	bool big_folios;
	size_t ready_floor;	/* sb_pool_reserve: target never below */
	/* No heap added for the floor before this (ready.c, floor_page): a
	 * heap that could not be created is not retried at every poll. */
	uint64_t floor_heap_ms;
	/* Where floor_page looks first: the last hole it took. Only a
	 * starting point (the search wraps round), so that filling a floor
	 * is not a scan of every full heap before it for each page (a 4 GiB
	 * floor of 4 KiB pages took 26 s when each search began at 0). */
	sbi_pid floor_cursor;
	/* Until then the floor cannot grow: no heap could be added for it
	 * (file descriptors, memory). Its unfilled part is meanwhile not
	 * lease spoken for (sbi_lease_floor_due): a client would hold the
	 * machine's budget for pages it cannot make. A time, not a flag:
	 * the heap is only tried while the lease has room, which a stuck
	 * floor gives back, so a flag never cleared (a client's floor
	 * stayed stuck after the limit was raised). */
	uint64_t floor_stuck_ms;
	size_t misses;		/* sync prepares since the last tick */
	/* Page-ins (SBI_ALLOC_OVERWRITE) since the last tick, and the freed
	 * pages the ready thread keeps for them rather than punch (ready.c:
	 * a page-in overwrites a freed page as it is). */
	size_t overwrites, dirty_keep;
	uint64_t steals;	/* ready pages taken out of turn (pool.c) */
	/* The target stays within max(ready_max, ready_floor): the adaptive
	 * part never adds to an explicit floor. */
	unsigned quiet_ticks;	/* ticks in a row without a miss */
	/* sb_buf_prefetch requests, served by the ready thread first. Their
	 * own lock, held for a push or a pop only: the thread that queues
	 * must not wait behind the ready thread's longer work. */
	pthread_mutex_t pf_lock;
	pthread_cond_t pf_cond;		/* pf_inflight changed */
	struct sbi_prefetch *pf;	/* pf_lock */
	uint32_t pf_head, pf_tail, pf_cap;	/* pf_lock */
	struct sb_buf *pf_inflight;	/* pf_lock: the buffer being placed for */
	struct sbi_grow grow[SBI_GROW_MAX];	/* pf_lock: growth watches */
	/* pf_lock: pages placed, to be touched by the ready thread (touch.c) */
	struct sbi_touch tq[SBI_TOUCH_MAX];
	uint32_t tq_head, tq_tail;
	/* The page the ready thread is reading (touch.c), 0 when none; set
	 * under its buffer's lock, so the clock never evicts it meanwhile
	 * (evict.c): a page-in that failed there would poison the page
	 * under the read, and a library thread, which takes no signals,
	 * meeting SIGBUS or SIGSEGV kills the process. */
	uintptr_t touch_addr;
	unsigned ngrow;			/* pf_lock to change; read racily */
	uint32_t grow_rr;		/* ready thread only: where to start */
	uint64_t grow_due_ms;		/* ready thread only: next watch due */
	/* Threads changing a buffer's mappings for its owner (sb_buf_map,
	 * sb_buf_unmap, the fault handler): the ready thread's placements in
	 * the background wait for them (sbi_vma_bg_yield). */
	_Atomic int fg_vma;
	/* Pages worth making ready: [0] the next page of each growing run,
	 * [1] the one after (served only when [0] is empty). */
	struct sbi_ring {
		sbi_pid *pid;
		uint32_t head, tail, cap;
	} wanted[2];

	/* Counters: relaxed atomics, read by sb_pool_stats. */
	_Atomic uint64_t n_faults, n_maps, n_unmaps, n_cow, n_fault_places, n_touched,
		n_sigbus, n_sync_prepares, n_map_faults;
	_Atomic uint64_t sigbus_log_ms;	/* last budget SIGBUS logged */
	_Atomic uint64_t heap_log_ms;	/* last "no memory for a heap page" */
	_Atomic uint64_t ioerr_log_ms;	/* last page-in error logged */
	_Atomic uint64_t evict_log_ms;	/* last failed eviction logged */
	_Atomic uint64_t n_evict_failures; /* write-outs that failed */

	/* The disk tier, set up at first use (disk.c). */
	pthread_mutex_t disk_lock;	/* creation of disk only */
	struct sbi_disk *_Atomic disk;
	_Atomic unsigned n_evictable;	/* live evictable / file buffers */
	size_t clock_hand;		/* pool->lock: eviction's clock */
	size_t evicting;	/* pool->lock: pages the clock handed out to
				 * evictions that have not finished */
	char *spill_dir;		/* opts.spill_dir, copied */
	_Atomic uint64_t n_pages_in, n_pages_out, n_bytes_read,
		n_bytes_written, n_io_errors, n_dropped;

	/* sparsebufd (lease.c, lease_serve.c): NULL for a local pool. A
	 * client pool's max_pages is its lease, changed under pool->lock
	 * (atomically: some readers hold no lock). */
	struct sbi_dclient *client;
	size_t ceiling_pages;	/* opts.max_bytes; SIZE_MAX: none */
	bool daemon_local;	/* pool->lock: no daemon, fallback local */
	struct sbi_lease *lease;

	struct sb_pool *next_pool;	/* global list, for fork handling */
};

/* Add to a statistics counter (struct sb_stats); no ordering needed. */
static inline void sbi_count(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* The most pages the ready reserve may aim for; pool->lock held. */
static inline size_t sbi_ready_cap(const struct sb_pool *pool)
{
	return pool->ready_floor > pool->ready_max ? pool->ready_floor
						   : pool->ready_max;
}

static inline struct sbi_heap *sbi_pid_heap(struct sb_pool *pool, sbi_pid p)
{
	return pool->heaps[p / pool->pages_per_heap];
}

static inline uint32_t sbi_pid_index(struct sb_pool *pool, sbi_pid p)
{
	return p % pool->pages_per_heap;
}

/* The offset of page p in its heap's file. */
static inline off_t sbi_pid_off(struct sb_pool *pool, sbi_pid p)
{
	return sbi_pid_heap(pool, p)->foff +
	       (off_t)((size_t)sbi_pid_index(pool, p) << pool->page_shift);
}

static inline char *sbi_pid_mem(struct sb_pool *pool, sbi_pid p)
{
	return sbi_pid_heap(pool, p)->map +
	       ((size_t)sbi_pid_index(pool, p) << pool->page_shift);
}

/* The pool side's page-table entries of page p dropped (sbi_heap_unmap_pool):
 * after every access through sbi_pid_mem. */
static inline void sbi_pid_unmap_pool(struct sb_pool *pool, sbi_pid p)
{
	sbi_heap_unmap_pool(sbi_pid_heap(pool, p), pool->page_size);
}

/* ---- process.c: per-process state, fork, the default pool -----------------*/

/* 0, or -ECHILD for a pool its creator had before fork()ing this child. */
int sbi_pool_check(const struct sb_pool *pool);

/* The argument checks every sb_buf_* call makes: -EINVAL for no buffer,
 * the pool's own state (sbi_pool_check), -ERANGE for a range that does
 * not lie inside the buffer. */
int sbi_check_buf(const struct sb_buf *buf);

int sbi_check_range(const struct sb_buf *buf, size_t off, size_t len);
extern _Atomic unsigned sbi_fork_gen;
/* Handlers of the layer above (the default pool) that process.c's fork
 * handlers run: prepare first, parent and child last. */
struct sbi_fork_hooks {
	void (*prepare)(void);
	void (*parent)(void);
	void (*child)(void);
};
void sbi_process_fork_hooks(const struct sbi_fork_hooks *hooks);
void sbi_process_add_pool(struct sb_pool *pool);
void sbi_process_remove_pool(struct sb_pool *pool);

/* Take n pages for buf, continuing the heap run after hint (the buffer's
 * previous page, or SBI_NOPAGE). out[] receives plain pids of pages
 * that are zeroed, backed and referenced once. All or nothing: -EDQUOT
 * when the budget says no (never returned by the API: sbi_alloc makes it
 * -ENOMEM once eviction cannot help), -ENOMEM (or another -errno) when the
 * kernel does. */
int sbi_pool_alloc(struct sb_pool *pool, struct sb_buf *buf, sbi_ptref hint,
		   size_t n, sbi_pid *out, unsigned flags);
/* sbi_pool_alloc flags. OVERWRITE: the caller writes every byte of the
 * pages (a read from disk, a copy), so a free page's old contents may stay
 * (no zeroing: a recycled page costs nothing). NOSPIN: waiting for the
 * ready thread to finish a page sleeps at once rather than polling first
 * (a page-in waits for the disk anyway; a fault on an empty page should
 * not pay a wake-up). */
#define SBI_ALLOC_OVERWRITE (1u << 0)
#define SBI_ALLOC_NOSPIN (1u << 1)
#define SBI_ALLOC_PAGEIN (SBI_ALLOC_OVERWRITE | SBI_ALLOC_NOSPIN)
/* NOWAIT (sbi_alloc): at the budget, one round of eviction, then give up
 * rather than wait for busy buffers: for reads nobody waits for (read
 * ahead, prefetch without WAIT), which must not hold their buffer's lock
 * while another buffer is busy. */
#define SBI_ALLOC_NOWAIT (1u << 2)
/* A daemon's client at its lease: a free page that has memory anywhere
 * will do. Without it, a client pool whose lease may grow asks for more
 * (-EDQUOT) rather than break the buffer's run of heap pages (which would
 * cost a mapping). Set by sbi_alloc once the daemon said no. */
#define SBI_ALLOC_LEASED (1u << 3)
/* SCATTER (with OVERWRITE): the first page of a page-in request, which may
 * take a freed page anywhere in the pool rather than allocate the next page
 * of a run (pool.c). */
#define SBI_ALLOC_SCATTER (1u << 4)
/* URGENT: one page that an owner waits for at its growing buffer's end,
 * past its growth watch (sbi_grow_urgent). If the next page of its run
 * needs zeroing, a ready page elsewhere will do, even one earmarked for
 * another buffer's run: more mappings instead of zeroing on the owner's
 * thread (pool.c, steal_ready). */
#define SBI_ALLOC_URGENT (1u << 5)
/* One page, the home page hint names (home.c), EVICTED: it is taken. */
#define SBI_ALLOC_HOME (1u << 6)
/* BACKED: only a free page that has memory will do, wherever it is
 * (-EDQUOT when none is free, as at the budget: sbi_alloc evicts). Set
 * by sbi_alloc when the system had none to give (a pool of huge pages,
 * vm.nr_hugepages all taken). */
#define SBI_ALLOC_BACKED (1u << 7)
/* Add / drop one reference to each page (SBI_NOPAGE entries skipped). A
 * page whose last reference goes returns to the pool. */
void sbi_pool_ref(struct sb_pool *pool, const sbi_ptref *refs, size_t n);
void sbi_pool_put(struct sb_pool *pool, const sbi_ptref *refs, size_t n);
/* The same for one page. */
void sbi_pool_put1(struct sb_pool *pool, sbi_pid pid);
uint32_t sbi_pool_refs(struct sb_pool *pool, sbi_pid p);
/* Eviction (plain pids): punch the memory of USED pages, then make them
 * EVICTED; and give EVICTED pages back to the pool (free, unbacked; in a
 * home heap, reserved for it). */
void sbi_pool_evicted(struct sb_pool *pool, const sbi_pid *pids, size_t n);
/* The second half of that: pages whose memory the caller punched. */
void sbi_pool_mark_evicted(struct sb_pool *pool, const sbi_pid *pids,
			   size_t n);
void sbi_pool_drop_evicted(struct sb_pool *pool, const sbi_pid *pids,
			   size_t n);
/* A page-in copied its data from page `from` (USED, its only holder the
 * caller) into the EVICTED page `kept`: `from`'s memory goes (punched)
 * and the two swap states, so that the counts stay as they were. */
void sbi_pool_swap_kept(struct sb_pool *pool, sbi_pid from, sbi_pid kept);
/* Home heaps (home.c): new heaps for npages pages, each page EVICTED (held
 * for the buffer page that maps it, no memory; the last heap's tail held
 * by nobody, reserved); slots[] gets the heaps' slots, one per
 * pages_per_heap pages. 0, or -errno with none added. */
int sbi_pool_add_home(struct sb_pool *pool, size_t npages, uint32_t *slots);
/* Their buffer is going (or never got them): the heaps are the pool's
 * like any other, their pages reserved for nobody free (unbacked). The
 * pages buffer pages still name are the caller's to give back. */
void sbi_pool_home_gone(struct sb_pool *pool, const uint32_t *slots,
			size_t nheaps);
/* Mark (or unmark) a USED page as held by a page-in in flight. */
void sbi_pool_mark_io(struct sb_pool *pool, sbi_pid pid, bool on);
/* The first free page in state st (READY or DIRTY), heap by heap, whose
 * run earmark lets buf have it (buf NULL: any); pool->lock held. */
bool sbi_pool_find_free(struct sb_pool *pool, enum sbi_page_state st,
			const struct sb_buf *buf, sbi_pid *out);
/* A free page leaves its free state (for USED or BUSY): its counter goes
 * down, an unbacked one becomes resident. Returns the state it had.
 * pool->lock held. */
enum sbi_page_state sbi_page_unfree(struct sb_pool *pool, struct sbi_heap *h,
				    uint32_t i);
/* A free page taken for work without pool->lock (zeroing, a punch): BUSY
 * until sbi_page_set_done gives it state st, READY or UNBACKED, and wakes
 * the threads waiting for busy pages. pool->lock held. */
void sbi_page_set_busy(struct sb_pool *pool, struct sbi_heap *h, uint32_t i);
void sbi_page_set_done(struct sb_pool *pool, struct sbi_heap *h, uint32_t i,
		       enum sbi_page_state st);
/* Run sites and heaps, for the ready thread; pool->lock held. */
uint32_t sbi_run_pages(const struct sb_pool *pool);
bool sbi_pool_find_site(struct sb_pool *pool, uint32_t want,
			struct sbi_heap **hp, uint32_t *startp, uint32_t *lenp);
struct sbi_heap *sbi_pool_add_heap(struct sb_pool *pool, int *err);
/* Add an imported heap in a free slot; pool->lock held. 0 or -ENOMEM. */
int sbi_pool_add_foreign(struct sb_pool *pool, struct sbi_heap *h);

/* ---- import.c: pages of sparsebufd's machine-wide cache -------------------*/

/* The pages refs[n] the daemon pinned for this pool on connection gen,
 * as pool pages: out[], each referenced once for the caller, who installs them in buffers (sbi_buf_install) or puts
 * them. Imports the heaps it has not seen (round trips: no lock held).
 * On failure every pin goes back. 0 or -errno. */
int sbi_import_refs(struct sb_pool *pool, uint64_t gen, const uint64_t *refs,
		    size_t n, sbi_ptref *out);

/* Record the calling thread's CPU: the ready thread keeps off it. The
 * library's own threads (marked with sbi_thread_internal) are never
 * recorded: the ready thread, placing a prefetch, would otherwise note its
 * own CPU and move onto the application's. */
void sbi_pool_note_caller(struct sb_pool *pool);
/* Around the mapping changes done for a buffer's owner (fg_vma). */
void sbi_vma_fg_begin(struct sb_pool *pool);
void sbi_vma_fg_end(struct sb_pool *pool);
/* Before a placement in the background: wait (up to 2 ms) while a thread
 * changes mappings for an owner. Every mmap takes the process's mmap lock
 * for writing; back to back, the ready thread's placements would take it
 * again each time before a woken owner gets to run (waking a thread on
 * another vCPU takes tens of microseconds), and the owner's one mmap would
 * wait for milliseconds (seen: 34 wake-ups in 1.6 ms). */
void sbi_vma_bg_yield(struct sb_pool *pool);
void sbi_thread_internal(void);
/* Set in the library's own threads (thread.c). */
extern __thread bool sbi_internal_thread;
/* Set in a pool's ready thread: its placements are ahead of need, and the
 * pages it zeroes for them are not a caller's (sb_stats.sync_prepares). */
extern __thread bool sbi_ready_self;
/* Wait until at least pages pages are ready (or timeout_ms passes). */
void sbi_pool_wait_ready(struct sb_pool *pool, size_t pages, int timeout_ms);
/* Forget buf's run earmark (the buffer is going away). */
void sbi_pool_drop_run(struct sb_pool *pool, struct sb_buf *buf);
/* Look up the buffer that owns addr; the caller holds reg_lock. */
struct sb_buf *sbi_pool_lookup(struct sb_pool *pool, uintptr_t addr);
struct sbi_src;
/* Make dst's pages [d0, d0+n) show refs[] (each already referenced for
 * dst; SBI_NOPAGE: no page), shared: mapped MAP_PRIVATE and
 * write-protected, copied on their first write, as sb_buf_share's
 * destination. What dst had there is released. 0 or -errno (the
 * references of pages not installed are put). */
int sbi_buf_install(struct sb_buf *dst, size_t d0, size_t n,
		    sbi_ptref *refs);
/* sb_buf_create with internal flags and a source of pages. */
struct sb_buf *sbi_buf_create(struct sb_pool *pool, size_t length,
			      unsigned flags, struct sbi_src *src, int *err);

/* Give dst's empty pages [d0, d0 + n) the spill slots of src's pages
 * [s0, s0 + n) that are on disk: each is read in for dst, privately, when
 * dst touches or maps it, and the slot stays src's. Pages of src not on
 * disk are left alone (the caller shares those). Same pool; dst not
 * strict. Returns how many pages were given. */
long sbi_buf_share_disk(struct sb_buf *dst, size_t d0, struct sb_buf *src,
			size_t s0, size_t n);
/* Bytes of the buffer's source file (a save image's length), 0: none. */
uint64_t sbi_buf_src_bytes(const struct sb_buf *buf);

/* Pages of [first, end) placed in buf and held by nobody else (what
 * releasing them would give back). */
/* Pages of [first, end) no other buffer of the pool holds (pages of
 * sparsebufd's cache included: the daemon is not counted). */
long sbi_buf_sole_pages(struct sb_buf *buf, size_t first, size_t end);

/* ---- save.c: images of a buffer range in a file ----------------------------*/

/* Bytes an image of npages pages takes (header, tables, data). */
uint64_t sbi_save_image_size(const struct sb_pool *pool, size_t npages);
/* Write pages [first, first + npages) of buf as an image at file offset
 * base (4 KiB-aligned) of fd; the data through data_fd (O_DIRECT) when it
 * is >= 0. Nothing is synced. */
int sbi_save_image(struct sb_buf *buf, size_t first, size_t npages, int fd,
		   int data_fd, uint64_t base);
/* A buffer of max(image length, min_length) bytes showing the image at
 * base of the file (tables read through table_fd, a buffered descriptor;
 * pages through data_fd, O_DIRECT if direct). limit: the bytes of file
 * from base; an image longer than max_length (0: no limit) is -EBADMSG.
 * data_fd is the new buffer's (closed with
 * it, or on failure) unless fd_refs counts its holders: then the buffer
 * takes a reference. */
struct sb_buf *sbi_restore_image(struct sb_pool *pool, int table_fd,
				 int data_fd, bool direct,
				 atomic_int *fd_refs, uint64_t base,
				 uint64_t limit, size_t min_length,
				 size_t max_length, unsigned flags, int *err);

/* ---- stat.c: counters other processes read (sparsebuf-stat) ---------------*/

void sbi_stat_open(struct sb_pool *pool);
/* A snapshot into the page; pool->lock held (the ready thread's tick). */
void sbi_stat_publish(struct sb_pool *pool);
void sbi_stat_close(struct sb_pool *pool);
/* sb_pool_stats with pool->lock held. */
void sbi_pool_stats_locked(struct sb_pool *pool, struct sb_stats *st);

/* ---- abi.c: structs that grow ----------------------------------------------*/

/* The sizes of the public structs in 0.1 (what the plain-named entry
 * points of 0.1 programs pass). */
#define SBI_SIZE_POOL_OPTS_0_1 offsetof(struct sb_pool_opts, min_bytes)
#define SBI_SIZE_STATS_0_1 offsetof(struct sb_stats, pages_touched)
#define SBI_SIZE_FEATURES_0_1 offsetof(struct sb_features, first_access_ns)
#define SBI_SIZE_KV_CONFIG_0_1 offsetof(struct sb_kv_config, flags)
#define SBI_SIZE_KV_STATS_0_1 sizeof(struct sb_kv_stats)

/* A caller's struct of `size` bytes into ours of `known` (zeroed first):
 * -EINVAL when smaller than the first release's (`min`), -E2BIG when the
 * caller set a field past what this library knows. */
int sbi_struct_in(void *ours, size_t known, const void *theirs, size_t size,
		  size_t min);
/* Ours out to a caller's struct of `size` bytes: no further than it, its
 * fields past ours zeroed. -EINVAL when smaller than `min`. */
int sbi_struct_out(void *theirs, size_t size, const void *ours, size_t known,
		   size_t min);

/* ---- verify.c ---------------------------------------------------------------*/

/* For tests: 0 if every counter and reference agrees, else -EUCLEAN with
 * the first disagreement described in why. */
int sbi_pool_verify(struct sb_pool *pool, char *why, size_t len);

/* ---- lease.c, lease_serve.c: a client pool's lease from sparsebufd --------*/

/* At the budget (-EDQUOT), before evicting: ask the daemon for more lease
 * (enough for n more pages). 1: max_pages was raised, try again; 0: no
 * lease (a local pool, the ceiling, or the machine's budget is full and
 * nothing elsewhere could be freed): evict locally; -ENOMEM: no daemon and
 * SPARSEBUF_DAEMON_FALLBACK=fail. nowait: not while the daemon is away.
 * No pool lock held. */
int sbi_lease_more(struct sb_pool *pool, size_t n, bool nowait);
/* The floor's unfilled part (sb_pool_reserve): ready_floor - ready, or 0
 * (also while the floor is stuck). pool->lock held. */
size_t sbi_lease_floor_due(const struct sb_pool *pool);
/* Ask sparsebufd for the lease that sb_pool_reserve's floor lacks, out of
 * what its budget has free: no reclaim from another process, no wait for
 * one. A floor is memory kept for bursts that may never come; it must not
 * push out another process's data, and two floors that do not fit the
 * machine together must not take turns reclaiming each other. Partial
 * grants are kept. No pool lock held; a local pool's is a no-op. */
void sbi_lease_floor(struct sb_pool *pool);
/* For tests: a client pool a daemon holds (connected, not fallen back). */
bool sbi_pool_is_leased(struct sb_pool *pool);
/* Give back the lease beyond resident + keep pages. Returns pages. */
size_t sbi_lease_give_back(struct sb_pool *pool, size_t keep, bool reclaim);
/* Become a client of c (the pool's source is c's): start the lease
 * thread. 0 or -errno. */
int sbi_lease_start(struct sb_pool *pool, struct sbi_dclient *c);
/* Stop the lease thread (sb_pool_destroy, before the buffers go). */
void sbi_lease_stop(struct sb_pool *pool);
/* Close the connection (the daemon takes the whole lease back) and free
 * the lease: after the heaps are gone. */
void sbi_lease_close(struct sb_pool *pool);
/* Evict up to want cold pages of evictable buffers (a reclaim from the
 * daemon). Returns pages written out. No lock held. */
size_t sbi_evict_some(struct sb_pool *pool, size_t want);

/* ---- ready.c: the reserve of zeroed pages ----------------------------------*/

void *sbi_ready_thread(void *arg);
/* Queue a free page worth making ready (prio 0: needed next, 1: after
 * that); caller holds pool->lock. */
void sbi_ready_want(struct sb_pool *pool, sbi_pid p, int prio);
/* Release empty heaps and reserve pages; caller holds pool->lock and gets
 * it back. Returns pages released. keep_spare keeps one empty heap. */
size_t sbi_ready_trim(struct sb_pool *pool, bool keep_spare, bool all_ready);
/* Punch up to n free backed pages, freed ones first, then ready ones (a
 * reclaim by sparsebufd that wants no more); returns how many went.
 * pool->lock held. */
size_t sbi_ready_release(struct sb_pool *pool, size_t n);

/* Test hooks (the sbi_test_* calls): take one from a count of injected
 * events; false once it is 0. */
static inline bool sbi_test_take(_Atomic unsigned *count)
{
	unsigned n = atomic_load_explicit(count, memory_order_relaxed);

	while (n)
		if (atomic_compare_exchange_weak(count, &n, n - 1))
			return true;
	return false;
}

/* A test hook's injected failures: the next `count` events fail, -err. */
struct sbi_test_fault {
	_Atomic unsigned count;
	_Atomic int err;
};

static inline void sbi_test_arm(struct sbi_test_fault *f, int err,
				unsigned count)
{
	atomic_store(&f->err, err);
	atomic_store(&f->count, count);
}

/* -err if this event is to fail, else 0. */
static inline int sbi_test_failure(struct sbi_test_fault *f)
{
	return sbi_test_take(&f->count) ? -atomic_load(&f->err) : 0;
}

/* ---- buf.c -----------------------------------------------------------------*/

/* Page-table entry of a buffer page. */
#define SBI_PTE_PID 0xffffffffull	/* pid + 1; 0 = no page */
#define SBI_PTE_SHARED (1ull << 32)	/* write-protected: copy on write */
#define SBI_PTE_POISON (1ull << 33)	/* a fault failed: SIGBUS on touch */
#define SBI_PTE_WPFAIL (1ull << 34)	/* a copy failed: SIGBUS on write */
#define SBI_PTE_PRIVMAP (1ull << 35)	/* mapped MAP_PRIVATE (shared in) */
/* Not placed; the data is on disk: in spill slot (bits 40-63) - 1, or, when
 * those bits are 0, in the buffer's own file (buf->src). */
#define SBI_PTE_DISK (1ull << 36)
/* With DISK: a read is in flight; the request owns the slot and the kept
 * page, and holds the pool page it fills. */
#define SBI_PTE_INFLIGHT (1ull << 37)
/* With POISON: the read failed. A spill page's entry keeps its slot
 * (bits 40-63), for sb_buf_map to read again. */
#define SBI_PTE_IOERR (1ull << 38)
/* With DISK or POISON: the buffer page still maps the heap page it was
 * evicted from, registered with the pool's uffd (eviction never replaces a
 * mapping: evict.c says why). The low 32 bits name that page, reserved in
 * state EVICTED with its memory punched (a touch: missing fault; minor
 * where the punch left a huge folio in place, zeroed), or are 0
 * when the pool recycled it (pool->can_recycle; a touch: minor fault). A
 * home page (home.c) that holds no data is such an entry too, naming its
 * home page. */
#define SBI_PTE_KEEP (1ull << 39)
#define SBI_PTE_SLOT_SHIFT 40
#define SBI_PTE_SLOT(slot1) ((uint64_t)(slot1) << SBI_PTE_SLOT_SHIFT)

/* Internal buffer flags (beside the public SB_BUF_*). */
#define SBI_BUF_RO (1u << 30)		/* read-only: a file's pages */
/* The guard page on each side of a buffer's range (buf.c, reserve). */
#define SBI_GUARD 4096

/* The page placed, SBI_NOPAGE when nothing is placed. */
static inline sbi_ptref sbi_pte_ref(uint64_t pte)
{
	return pte & (SBI_PTE_DISK | SBI_PTE_KEEP)
		       ? SBI_NOPAGE
		       : (sbi_ptref){(uint32_t)(pte & SBI_PTE_PID)};
}

static inline bool sbi_pte_has_page(uint64_t pte)
{
	return !sbi_ptref_none(sbi_pte_ref(pte));
}

/* The page id of an entry that holds a placed page. */
static inline sbi_pid sbi_pte_page(uint64_t pte)
{
	return sbi_ptref_pid(sbi_pte_ref(pte));
}

/* The EVICTED page a KEEP entry holds, else SBI_NOPAGE. */
static inline sbi_ptref sbi_pte_kept(uint64_t pte)
{
	return pte & SBI_PTE_KEEP ? (sbi_ptref){(uint32_t)(pte & SBI_PTE_PID)}
				  : SBI_NOPAGE;
}

/* Spill slot + 1 of a DISK (or IOERR) entry, 0 for the buffer's file. */
static inline uint32_t sbi_pte_slot1(uint64_t pte)
{
	return (uint32_t)(pte >> SBI_PTE_SLOT_SHIFT);
}

/* Where a file-backed or restored buffer's pages come from. */
struct sbi_src {
	int fd;
	bool direct;		/* opened O_DIRECT */
	bool save;		/* a sb_buf_save file: checksums, holes */
	uint64_t base;		/* file offset of the buffer's first byte */
	uint64_t size;		/* bytes of file from base; past it: zeros */
	size_t nblocks;		/* save: 4 KiB blocks */
	uint32_t *crc;		/* save: per block */
	uint64_t *present;	/* save: bitmap, 0 = hole (zeros) */
	void *tables;		/* save: both, in sbi_meta memory */
	size_t tables_len;
	atomic_int *fd_refs;	/* NULL: fd is this source's own; else
				 * holders of a shared fd (malloc'ed), the
				 * last one closes it and frees this */
};

#define SBI_WAITERS 16	/* sb_buf.waiters */

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
	size_t disk_hi;		/* buf->lock: one past the last page ever on
				 * disk (destroy looks no further: a buffer
				 * may be terabytes of address space) */
	/* Run earmark (buf->lock): the heap extent this buffer grows into. */
	uint64_t run_serial;
	uint32_t run_slot, run_start, run_end;
	uint32_t run_next;	/* first page of the run not yet taken */
	/* Ready pages taken out of turn (SBI_ALLOC_URGENT; atomic: counted
	 * under pool->lock, bounded under buf->lock by sbi_grow_urgent),
	 * and whether the next allocation goes back to the run they left
	 * (pool->lock). */
	uint32_t steals;
	bool run_resume;
	uint64_t steal_fail;	/* pool->lock: busy_gen + 1 of a search
				 * that found nothing (not repeated until
				 * a page is made ready) */
	size_t grow_hi;		/* buf->lock: one past the highest page
				 * ever placed by sbi_buf_place or a fault */
	/* Disk tier. */
	struct sbi_src *src;	/* immutable; NULL: pages start empty */
	_Atomic unsigned inflight;	/* page-ins holding this buffer */
	/* buf->lock: pages whose read is in flight and that a thread faulted
	 * on (it sleeps in the kernel until a UFFDIO_WAKE); only those are
	 * woken when the read completes (pagein.c). More than fit: every
	 * completion wakes until no read is in flight. */
	size_t waiters[SBI_WAITERS];
	uint8_t nwaiters;
	bool waiters_lost;
	size_t ra_next;		/* buf->lock: readahead, next expected page */
	size_t ra_win;		/* buf->lock: readahead window, pages */
	/* buf->lock: a bit a page, SB_ADVICE_RANDOM (no readahead); NULL
	 * until that advice is first given. */
	uint64_t *ra_off;
	_Atomic bool disk_used;	/* pages of it went to disk once */
	/* sb_buf_share calls reading from this buffer: eviction leaves it
	 * alone meanwhile (a page read in for the share would otherwise go
	 * straight back to disk, again and again). */
	_Atomic unsigned sharing;
	/* pool->pf_lock: threads changing this buffer's mappings now
	 * (sbi_bg_quiet_begin): no touch or growth watch is queued for it
	 * meanwhile, so the cancel each of them made first holds until the
	 * change is done. */
	unsigned bg_quiet;
	/* Page-in completions that found buf->lock held (they only try it,
	 * every millisecond): a thread about to take the lock lets them in
	 * first (sbi_buf_let_io_in), or one that takes it again and again
	 * would keep a faulting thread waiting for its page indefinitely. */
	_Atomic unsigned io_refused;
	/* Page-ins whose data was read but could not be mapped
	 * (vm.max_map_count): a waiting sbi_pagein_spans reports -ENOMEM,
	 * not the page as placed. */
	_Atomic unsigned map_failures;
	/* Pages whose read failed that can be read again (a spill copy kept
	 * for that, or the buffer's file), for sb_buf_map,
	 * sb_buf_prefetch(WAIT) and sb_buf_share (pagein.c): a
	 * hint, never less than there are (counted down when such an entry
	 * is read again or released: sbi_failed_read_gone), so a map of a
	 * buffer that has none looks for none. */
	_Atomic unsigned failed_reads;
	/* buf->lock: 1 + the highest page index ever shared in or out (a
	 * bound for finding pages whose other holders let go). */
	size_t shared_hi;
	/* Home mapping (home.c): a file buffer's page i maps, from creation,
	 * heap page home[i / pages_per_heap] * pages_per_heap + i %
	 * pages_per_heap, and is filled and emptied there in place. NULL:
	 * none. home_lost (buf->lock, vma.c): a bit a page whose mapping
	 * was replaced since, which is home no more; home_cancel (buf->lock):
	 * a bit a page released while its read was in flight, which the
	 * read empties again when it finishes (pagein.c). Immutable as
	 * pointers once set, freed at destroy. */
	uint32_t *home;
	uint64_t *home_lost, *home_cancel;
	size_t home_heaps;	/* counted against the descriptors (home.c) */
	/* Home pages mapped by the kernel's own faults, clean (home.c,
	 * "Clean home mappings"): registered MISSING only, every read
	 * through a read buffer. Immutable once the buffer is returned. */
	bool home_clean;
};

/* Pages [first, end) of a buffer. */
struct sbi_span {
	size_t first, end;	/* page indices */
};

/* The pages that bytes [off, off + len) touch; len > 0. */
static inline struct sbi_span sbi_span_touched(const struct sb_pool *pool,
					       size_t off, size_t len)
{
	return (struct sbi_span){off >> pool->page_shift,
				 ((off + len - 1) >> pool->page_shift) + 1};
}

/* The pages lying wholly inside bytes [off, off + len) (what unmap and
 * evict release); first >= end when there are none. */
static inline struct sbi_span sbi_span_inside(const struct sb_pool *pool,
					      size_t off, size_t len)
{
	return (struct sbi_span){
		(off >> pool->page_shift) + !!(off & (pool->page_size - 1)),
		(off + len) >> pool->page_shift};
}

/* Place a page under every unplaced page of [first, end) (page indices):
 * sb_buf_map after argument checks. Data on disk is read back (and waited
 * for when wait). Takes the layout and buffer locks. */
long sbi_buf_place(struct sb_buf *buf, size_t first, size_t end, bool wait);
/* Before taking buf->lock with no buffer lock held: give page-in
 * completions refused that lock a moment to finish (bounded). */
void sbi_buf_let_io_in(struct sb_buf *buf);

/* ---- prefetch.c: placement in the background -------------------------------*/


/* Drop queued requests of buf overlapping [first, end) and wait for one in
 * flight on buf. Takes pool->pf_lock; call with no buffer lock held. */
void sbi_prefetch_cancel(struct sb_buf *buf, size_t first, size_t end);
/* Around a change of buf's mappings (unmap, share into it, eviction):
 * begin before it, end once it is done. Begin cancels the requests for
 * [first, end) as sbi_prefetch_cancel does (nothing when first >= end);
 * until end, no touch and no growth watch is queued for buf: a request
 * queued after the cancel (another thread's fault, a fault's watch noted
 * after its wake-up) would read or watch a page this change then
 * unplaces. Both take pool->pf_lock; no buffer lock held. */
void sbi_bg_quiet_begin(struct sb_buf *buf, size_t first, size_t end);
void sbi_bg_quiet_end(struct sb_buf *buf);
/* The ready thread: serve one request if any. Called with pool->lock
 * held; released while placing. Returns true if it did something. */
bool sbi_prefetch_serve(struct sb_pool *pool);

/* ---- touch.c: the first access to placed pages, in the background -------*/

/* Queue the pages [first, end) just placed, for the ready thread (woken if
 * it sleeps: takes pool->lock, so hold none of pool->lock, pf_lock). */
void sbi_touch_queue(struct sb_buf *buf, size_t first, size_t end);
/* The ready thread, before it sleeps: set pool->ready_idle under pf_lock
 * and say whether touches are queued (then it must not sleep). */
bool sbi_touch_set_idle(struct sb_pool *pool, bool idle);
/* Drop buf's requests overlapping [first, end); pf_lock held
 * (sbi_prefetch_cancel, after the touch in flight). */
void sbi_touch_cancel(struct sb_buf *buf, size_t first, size_t end);
/* The ready thread: touch one page if any is queued. pool->lock held,
 * released while touching. Returns true if it did. */
bool sbi_touch_serve(struct sb_pool *pool);

/* ---- grow.c: growth by touch, placed ahead ---------------------------------*/

/* The owner placed page idx of an SB_BUF_GROWS buffer (a fault, or its own
 * sb_buf_map): if the page before is placed, the buffer grows at its end;
 * watch it from idx. Holds buf->lock; takes pf_lock. Never allocates. */
void sbi_grow_note(struct sb_buf *buf, size_t idx);
/* Should the owner's own placement of page idx alone take a ready page out
 * of turn (SBI_ALLOC_URGENT)? A growing buffer's page at its growing end,
 * within the buffer's allowance of such pages; buf->lock held. */
bool sbi_grow_urgent(const struct sb_buf *buf, size_t idx);
/* End buf's watch; pf_lock held (sbi_prefetch_cancel). */
void sbi_grow_cancel(struct sb_buf *buf);
/* The ready thread, at most once a millisecond: every watch. Called with
 * pool->lock held; released meanwhile. Returns true if it placed a page. */
bool sbi_grow_serve(struct sb_pool *pool);

/* ---- home.c: file buffers' pages filled and emptied in place --------------*/

/* Give a new file buffer (every entry DISK, nothing mapped yet) its home
 * mapping when the pool allows: its pages' entries become DISK | KEEP |
 * home page. Without one (the pool does not, or no memory), nothing
 * changes; 0, or -errno when the range could not be put back as it was. */
int sbi_home_setup(struct sb_buf *buf);
void sbi_home_free(struct sb_buf *buf);
/* Page i is home (see home.c); its home page. buf->lock held. */
bool sbi_home_is(const struct sb_buf *buf, size_t i);
sbi_pid sbi_home_pid(const struct sb_buf *buf, size_t i);
/* Home, and empty (nothing placed, no read in flight, no error). */
bool sbi_home_empty(const struct sb_buf *buf, size_t i);
/* Home, empty, and poisoned by a failed page-in (the budget, a read
 * error): a touch raises SIGBUS until a release makes it empty again. */
bool sbi_home_poisoned(const struct sb_buf *buf, size_t i);
/* Home, and its home page placed there, held by this page alone. */
bool sbi_home_placed(struct sb_buf *buf, size_t i);
/* Home, and its read in flight into its home page: mark it released (the
 * read empties it when it finishes), and true; false otherwise. Whether
 * such a mark was made, cleared. */
bool sbi_home_cancel(struct sb_buf *buf, size_t i);
bool sbi_home_cancelled(struct sb_buf *buf, size_t i);
/* A page in flight asked for again: its read places it after all. */
void sbi_home_uncancel(struct sb_buf *buf, size_t i);
#define SBI_HOME_BATCH 256
/* Empty pages idx[0..n) (ascending, each sbi_home_placed, n <=
 * SBI_HOME_BATCH) in place. The caller fires the probes. */
void sbi_home_release(struct sb_buf *buf, const size_t *idx, size_t n);

/* ---- vma.c: the address-space operations on a buffer's range ---------------*/

/* Make the spare mappings that let a release through at vm.max_map_count
 * (vma.c, anon_over) while there is room; cheap when they exist. */
void sbi_vma_spares_fill(void);

/* Map n pages of heap memory starting at pid over pages [idx, idx+n),
 * page-table entries filled. read_only maps without write permission (the
 * first step of sharing). */
int sbi_vma_place(struct sb_buf *buf, size_t idx, size_t n, sbi_pid pid,
		  bool read_only);


/* Map n pages that other buffers also show, write-protected through uffd
 * (the pool's: writes copy; the SIGBUS one: writes fail), with no window
 * in which a write could reach the shared page. */
int sbi_vma_place_shared(struct sb_buf *buf, size_t idx, size_t n,
			 sbi_pid pid, int uffd);
/* sbi_vma_place_shared in two steps, so that runs of pages from many
 * places are protected together: map n pages at pid MAP_PRIVATE over
 * [idx, idx+n), unprotected (no write can reach the shared page, but the
 * range must be finished before the buffer's lock goes); then protect a
 * range of such mappings, however many, through uffd. */
int sbi_vma_map_private(struct sb_buf *buf, size_t idx, size_t n, sbi_pid pid);
int sbi_vma_share_finish(struct sb_buf *buf, size_t idx, size_t n, int uffd);
/* Map heap h's pages [0, n) over pages [idx, idx+n), registered MISSING
 * and MINOR with the pool's uffd: a new file buffer's home mapping
 * (home.c). */
int sbi_vma_map_home(struct sb_buf *buf, size_t idx, size_t n,
		     const struct sbi_heap *h);
/* Put registered anonymous memory back over [idx, idx+n). */
int sbi_vma_unplace(struct sb_buf *buf, size_t idx, size_t n);
/* Make [idx, idx+n) inaccessible (PROT_NONE): the last resort when what is
 * mapped there may not stay visible and cannot be unplaced. 0 or -errno. */
int sbi_vma_inaccessible(struct sb_buf *buf, size_t idx, size_t n);
/* The same, registered with the given uffd (eviction of a strict
 * buffer's page: its touch must reach the handler, which reads it in). */
int sbi_vma_unplace_uffd(struct sb_buf *buf, size_t idx, size_t n, int uffd);
/* Write-protect placed pages [idx, idx+n) so a write faults (WP mode). */
int sbi_vma_protect(struct sb_buf *buf, size_t idx, size_t n, int uffd);
int sbi_vma_unprotect(struct sb_buf *buf, size_t idx, size_t n);
/* Make a touch of unplaced page idx raise SIGBUS, and wake its waiters. */
int sbi_vma_poison(struct sb_buf *buf, size_t idx);
/* Undo sbi_vma_poison of a home page (home.c) whose mapping it left in
 * place: the kernel's poison marker goes (a punch leaves markers). */
int sbi_vma_unpoison(struct sb_buf *buf, size_t idx);
/* Make writes to placed page idx raise SIGBUS (copy impossible). */
int sbi_vma_wpfail(struct sb_buf *buf, size_t idx, sbi_pid pid, uint32_t tid);
void sbi_vma_wake(struct sb_buf *buf, size_t idx);
int sbi_uffd_register(int uffd, void *addr, size_t len, uint64_t mode);
int sbi_uffd_wp(int uffd, void *addr, size_t len, bool on);
/* Lift a page's write protection without waking its waiters (poisoning a
 * kept page: the poison wakes them). */
int sbi_vma_unprotect_nowake(struct sb_buf *buf, size_t idx);
/* Map page idx again from its heap page (UFFDIO_CONTINUE, a minor fault);
 * 0 if it is mapped already. */
int sbi_vma_continue(struct sb_buf *buf, size_t idx);
/* Fill the punched heap page that page idx, evicted in place, still maps,
 * with src's data (UFFDIO_COPY: no mapping changes). No wake. */
int sbi_vma_copy_in(struct sb_buf *buf, size_t idx, const void *src);
/* UFFDIO_COPY of len bytes from src to dst (a range registered with uffd),
 * no wake; tried again while the kernel asks. 0 or -errno (EEXIST: a
 * page there already, those before it copied). */
int sbi_uffd_copy(int uffd, void *dst, const void *src, size_t len);
/* Drop the page-table entries of [idx, idx + n) (MADV_DONTNEED). */
int sbi_vma_drop_ptes(struct sb_buf *buf, size_t idx, size_t n);
/* Wake the threads stopped on a fault in [start, start + len) (a buffer
 * destroyed under them: they fault again on what is there now). */
void sbi_vma_wake_range(struct sb_pool *pool, uintptr_t start, size_t len);

/* ---- fault.c ---------------------------------------------------------------*/

/* One handler per CPU the process may run on (up to SPARSEBUF_FAULT_THREADS,
 * default 4), each pinned: a fault wakes one, steered to the faulting
 * thread's CPU (fault_wait.c), so a fault costs two context switches on
 * one CPU instead of cross-CPU wake-ups (tens of microseconds each in a
 * VM). */
struct sbi_fault_thread {
	struct sb_pool *pool;
	pthread_t thread;
	int cpu;		/* pinned CPU, -1 = not pinned */
	/* fault_wait.c: its epoll set (-1: it polls); ep_lost (atomic, set
	 * by a steering handler): its registration is gone, it polls; faults
	 * served since it last looked up where their thread runs. */
	int ep;
	bool ep_lost;
	unsigned since_steer;
};

void *sbi_fault_thread(void *arg);
/* fault_wait.c: the handlers' wait, one woken a fault, steered to the
 * faulting thread's CPU, with a safety net. init and fini: every handler's
 * (pool->faulters[0..nwaiters) set up, their threads not running). wait:
 * 1 the uffd may be read, 2 read it anyway (the net's timeout), 0 try
 * again, -ESHUTDOWN the pool goes, else -errno. served: after a batch of
 * faults, the last one's thread, and whether the net found them. */
void sbi_fault_wait_init(struct sb_pool *pool);
void sbi_fault_wait_fini(struct sb_pool *pool);
int sbi_fault_wait(struct sbi_fault_thread *t);
void sbi_fault_served(struct sbi_fault_thread *t, pid_t tid, bool rescued);
/* A touch of page idx of buf is answered with SIGBUS because of err: count
 * it, and say why (at warning level, at most once a second per pool, for a
 * budget or memory shortage; I/O errors are logged where they occur). */
void sbi_sigbus_note(struct sb_buf *buf, size_t idx, int err,
		     const char *what);
/* Start the handlers; returns 0 or -errno (none left running). */
int sbi_fault_start(struct sb_pool *pool);
void sbi_fault_stop(struct sb_pool *pool);

/* ---- crc32c.c --------------------------------------------------------------*/

uint32_t sbi_crc32c(const void *p, size_t len);
/* The CRC-32C of what crc covered followed by p[0..len) (crc 0: nothing
 * before), and followed by len zero bytes, in O(log len). */
uint32_t sbi_crc32c_update(uint32_t crc, const void *p, size_t len);
uint32_t sbi_crc32c_zeros(uint32_t crc, uint64_t len);
uint32_t sbi_crc32c_sw(const void *p, size_t len);	/* the table (tests) */

/* ---- io.c: the disk tier's I/O engine ---------------------------------------*/

struct sbi_io_engine;

/* Waiting for a batch of requests: done = sbi_io_wait_done. */
struct sbi_io_wait {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t left;
	int err;		/* first error; a short write is -ENOSPC */
};

struct sbi_io {
	struct sbi_io *next;	/* engine queues */
	/* Runs on the completion thread; false: cannot finish now (a lock
	 * is busy), call again later. Must not block on buffer locks. */
	bool (*done)(struct sbi_io *io);
	int fd;
	bool write;
	bool punch;		/* a hole punch of [off, off+len): mem unused */
	void *ctx;		/* for done(): the disk, for a punch */
	void *mem;		/* page-aligned */
	size_t len;
	uint64_t off;
	ssize_t res;		/* bytes or -errno */
	struct sbi_io_wait *wait;
	/* Page-ins (pagein.c). */
	struct sb_buf *buf;
	size_t idx;
	sbi_pid pid;
	uint64_t pte;		/* the entry while in flight */
	uint64_t src_pte;	/* the entry before: where the data was */
	bool checked;
	bool ok;
	bool refused;		/* counted in buf->io_refused */
	bool home;		/* into the page's home page (home.c) */
	/* A read may go into one of the engine's read buffers instead of
	 * mem (sbi_io_bounce_init says why): asked for with may_bounce; the
	 * engine sets bounce when the read enters the ring, and done() gives
	 * it back (sbi_io_bounce_put) once it has taken the data. */
	bool may_bounce;
	/* And waits for one rather than go straight into mem: a clean home
	 * page (home.c) must not appear in the memfd before its data is
	 * checked and whole. Only where the engine has read buffers of at
	 * least len bytes (sbi_io_bounce_fits). */
	bool must_bounce;
	void *bounce;
	int inject;		/* test hook: fail with this -errno */
	uint8_t retries;	/* resubmitted after a cancel (io.c) */
};

struct sbi_io_engine *sbi_io_create(int *err);
void sbi_io_destroy(struct sbi_io_engine *e);
const char *sbi_io_name(const struct sbi_io_engine *e);
/* Never NULL unless mmap fails; zeroed. */
struct sbi_io *sbi_io_get(struct sbi_io_engine *e);
void sbi_io_put(struct sbi_io_engine *e, struct sbi_io *io);
/* Queue n requests (one io_uring_enter); never waits for the disk. */
void sbi_io_submit(struct sbi_io_engine *e, struct sbi_io **ios, size_t n);
/* Nothing but hole punches in flight, and no other request submitted or
 * finished for ms milliseconds. */
bool sbi_io_quiet(struct sbi_io_engine *e, unsigned ms);
/* Whether reads or writes are in the engine (punches aside). */
bool sbi_io_busy(struct sbi_io_engine *e);
/* For a fault that found the budget held by requests in flight: wake the
 * thread stopped on [start, start + len) of userfaultfd uffd once one of
 * the reads or writes in the engine now has finished, or a millisecond or
 * two later (memory freed some other way), rather than let it fault again
 * at once, over and over. false: none is in flight (or too
 * many threads wait already); the caller wakes it now. */
bool sbi_io_wake_later(struct sbi_io_engine *e, int uffd, uintptr_t start,
		       size_t len);
/* For tests: wake-ups not yet made. */
unsigned sbi_io_wakes_pending(struct sbi_io_engine *e);
/* Read buffers of size bytes (a page of 1 MiB or less), at most n, for
 * reads that allow one (sbi_io.may_bounce), given out as reads enter the
 * ring. 0 or -errno (reads then go straight into their mem). */
int sbi_io_bounce_init(struct sbi_io_engine *e, size_t size, unsigned n);
void sbi_io_bounce_put(struct sbi_io_engine *e, struct sbi_io *io);
/* Whether the engine has read buffers of at least len bytes. */
bool sbi_io_bounce_fits(struct sbi_io_engine *e, size_t len);
/* For tests: read buffers made, and those not given out now. */
void sbi_io_bounce_count(struct sbi_io_engine *e, unsigned *n,
			 unsigned *free);
/* Whether the engine takes hole punches (sbi_io.punch). */
bool sbi_io_can_punch(const struct sbi_io_engine *e);
void sbi_io_wait_init(struct sbi_io_wait *w, size_t n);
bool sbi_io_wait_done(struct sbi_io *io);
/* Until every request of the batch is done; the first error or 0. */
int sbi_io_wait(struct sbi_io_wait *w);

/* ---- disk.c, spill.c, pagein.c, evict.c, file.c: the disk tier ---------------*/

struct sbi_disk {
	struct sb_pool *pool;
	struct sbi_io_engine *io;
	pthread_mutex_t spill_lock;	/* a leaf: the slots below */
	int spill_fd;		/* -1 until the first eviction */
	int spill_err;		/* why the last attempt to make the spill
				 * file failed (0: made, or not tried);
				 * logged once per cause, tried again at
				 * the next eviction */
	bool spill_direct;
	bool prealloc_off;	/* the file system cannot fallocate */
	uint64_t *slot_bits;	/* 1 = in use, or being punched */
	/* 1 = freed, its blocks not yet given back (spill.c) */
	uint64_t *punch_bits;
	uint32_t punch_pending;	/* slots set in punch_bits */
	uint32_t punch_from;	/* no slot below is due */
	uint32_t punching;	/* slots being punched (set in slot_bits) */
	bool punch_busy;	/* a punch is in flight (punch_cond: done) */
	uint32_t punch_busy_n;	/* of that many slots */
	bool punch_hold;	/* test hook: punches wait before they start */
	struct sbi_io *punch_parked;	/* the one waiting */
	pthread_cond_t punch_cond;
	bool punch_off;		/* the file system cannot punch holes */
	bool closing;		/* sbi_disk_destroy: no new punch */
	uint32_t *slot_crc;
	uint16_t *slot_extra;	/* holders beyond the first (a KV prefix read
				 * back lazily by several sequences) */
	uint32_t slot_cap, slot_hi, slot_hint, slots_used;
	/* Page-in completions, for threads waiting on a range: done_gen
	 * counts them; a waiter sleeps until it reaches its target, and
	 * done_want is the lowest target asleep (UINT64_MAX: none), so that
	 * a completion wakes the waiters only when one of them may be done
	 * (a read of 1100 pages woke its waiter 1100 times, each wake-up a
	 * rescan of its ranges under the buffer's lock). */
	pthread_mutex_t done_lock;
	pthread_cond_t done_cond;
	uint64_t done_gen, done_want;
	/* Where the spill checksums are read (sbi_disk_page_crc): not the
	 * caller's stack (an application thread's eviction may have 16 KiB
	 * of it), nor an allocation (a page-in's check at vm.max_map_count,
	 * where one that needs a mapping fails). */
	pthread_mutex_t crc_lock;	/* a leaf */
	char crc_buf[64 << 10];
};

/* The CRC-32C of the first len bytes of page pid, read through its heap's
 * file (sbi_heap_crc32c) into d's buffer: 0 or -errno. */
int sbi_disk_page_crc(struct sbi_disk *d, sbi_pid pid, size_t len,
		      uint32_t *crc);

/* The pool's disk tier, set up on first use; NULL and *err on failure. It
 * starts threads and allocates: application threads only (the first
 * evictable buffer, file or save, explicit eviction), never the fault
 * path, which uses sbi_disk_peek. */
struct sbi_disk *sbi_disk_get(struct sb_pool *pool, int *err);
/* The disk tier if it is set up, else NULL. */
static inline struct sbi_disk *sbi_disk_peek(struct sb_pool *pool)
{
	return atomic_load_explicit(&pool->disk, memory_order_acquire);
}
void sbi_disk_destroy(struct sb_pool *pool);
size_t sbi_disk_spill_bytes(struct sb_pool *pool);
/* A page-in finished: wake range waiters. */
void sbi_disk_signal(struct sbi_disk *d);

uint64_t sbi_disk_gen(struct sbi_disk *d);
/* Sleep until done_gen reaches target, or timeout_ms. A thread waiting for
 * n pages in flight asks for the generation it read before counting them,
 * plus n: each of them bumps it once when it finishes, so the target is
 * never later than its last one. */
void sbi_disk_wait_until(struct sbi_disk *d, uint64_t target, int timeout_ms);

/* Spill slots (spill.c), each one pool page of the spill file. */
/* n slots into slots[]; bit k of kept[(n + 63) / 64] set when slots[k]
 * still has its blocks (freed, not yet punched). */
int sbi_spill_alloc(struct sbi_disk *d, size_t n, uint32_t *slots,
		    uint64_t *kept);
/* Give slots[0..n) that have no blocks (kept, from sbi_spill_alloc) their
 * blocks before they are written (spill.c says why): 0, -ENOSPC, or
 * -errno. */
int sbi_spill_prealloc(struct sbi_disk *d, const uint32_t *slots,
		       const uint64_t *kept, size_t n);
/* Drop one holder of each slot; the last one frees it. Its blocks go back
 * to the file system later, once the disk tier is quiet (spill.c). */
void sbi_spill_free(struct sbi_disk *d, const uint32_t *slots, size_t n);
/* Start giving the blocks of freed slots back if the disk tier has been
 * quiet for a while (the ready thread, every 100 ms); never waits. */
void sbi_spill_punch(struct sbi_disk *d);
/* Punch every slot due now, on this thread (an eviction that found the
 * file system full); returns the slots punched. */
size_t sbi_spill_punch_now(struct sbi_disk *d);
/* No punch starts from now on (sbi_disk_destroy, before the engine goes). */
void sbi_spill_close(struct sbi_disk *d);
/* One more holder of a slot in use: -EMLINK when it has 65535. */
int sbi_spill_ref(struct sbi_disk *d, uint32_t slot);
static inline uint64_t sbi_spill_off(const struct sbi_disk *d, uint32_t slot)
{
	return (uint64_t)slot << d->pool->page_shift;
}
void sbi_spill_set_crc(struct sbi_disk *d, uint32_t slot, uint32_t crc);
uint32_t sbi_spill_crc(struct sbi_disk *d, uint32_t slot);

/* Page-ins (pagein.c). Start reading buffer page idx (DISK, not in flight)
 * into a new pool page; buf->lock held (so is reg_lock when reg_held). The
 * request goes to *out (submitted by the caller with sbi_io_submit).
 * ahead: read ahead of a touch (no test failure injected); nowait: nobody
 * waits for this read (read ahead, prefetch without WAIT), so at the budget
 * it does not wait for busy buffers (SBI_ALLOC_NOWAIT); first: the first
 * page of its request (a touch, or a prefetch range), which may take a
 * freed page anywhere (SBI_ALLOC_SCATTER). Returns 0 or -errno (the page
 * is then left as it was). */
int sbi_pagein_start(struct sb_buf *buf, size_t idx, struct sbi_io **out,
		     bool reg_held, bool ahead, bool nowait, bool first);
/* Fault on a DISK page: start its read (and readahead), or just wait for
 * the read in flight. buf->lock and reg_lock held. */
void sbi_pagein_fault(struct sb_buf *buf, size_t idx);
/* SB_ADVICE_RANDOM (on: false) or NORMAL (on: true) for pages [first,
 * end): whether a fault there reads ahead. Takes the buffer's lock.
 * Returns the pages of the range, or -ENOMEM. */
long sbi_readahead_set(struct sb_buf *buf, size_t first, size_t end, bool on);
/* Read every DISK page of [first, end) (one submission); wait until none
 * is in flight when wait. Takes the buffer's lock. Returns pages queued,
 * or -EIO (wait: a read failed), -ENOMEM. */
long sbi_pagein_range(struct sb_buf *buf, size_t first, size_t end,
		      bool wait);
long sbi_pagein_spans(struct sb_buf *buf, const struct sbi_span *sp,
		      size_t nsp, bool wait);
/* Wait until no page-in holds buf (sb_buf_destroy). */
void sbi_pagein_drain(struct sb_buf *buf);

/* Eviction (evict.c). */
/* Note a page placed in buf at idx for the clock (evictable buffers). */
void sbi_rmap_note(struct sb_buf *buf, size_t idx, sbi_pid pid);
/* What one round of sbi_evict_cold did. */
struct sbi_evict_round {
	size_t picked;		/* candidates the clock gave */
	size_t done;		/* pages evicted */
	size_t busy;		/* candidates skipped: their buffer was busy */
	bool failed;		/* a write-out failed */
};
/* Evict up to want cold pages of evictable buffers (the clock's choice).
 * held: the buffer whose lock the caller holds (or NULL); reg_held: the
 * caller holds reg_lock (read). */
void sbi_evict_cold(struct sb_pool *pool, size_t want, struct sb_buf *held,
		    bool reg_held, struct sbi_evict_round *rd);
/* Put back on the clock the pages of evictable buffers that were shared
 * and are one buffer's alone now; returns how many. */
size_t sbi_evict_renote(struct sb_pool *pool, struct sb_buf *held,
			bool reg_held);

/* Allocation under the budget (alloc.c): sbi_pool_alloc that, at the
 * budget, asks the daemon for more lease (a client) or evicts cold pages
 * of evictable buffers, and retries; -ENOMEM when nothing more can be had.
 * held, reg_held: as for sbi_evict_cold. */
int sbi_alloc(struct sb_pool *pool, struct sb_buf *buf, sbi_ptref hint,
	      size_t n, sbi_pid *out, unsigned flags, struct sb_buf *held,
	      bool reg_held);

/* Evict the placed pages of [first, end); buf->lock held. */
long sbi_evict_locked(struct sb_buf *buf, size_t first, size_t end);
/* sb_buf_evict of the pages nobody else holds (a page shared with another
 * buffer stays: writing it out would give no memory back). */
long sbi_buf_evict_sole(struct sb_buf *buf, size_t off, size_t len);
/* An entry that is not placed is being discarded (unmap, destroy, share):
 * give back its spill slot and kept page (not for one in flight: its
 * request owns them). */
void sbi_pte_release(struct sb_buf *buf, uint64_t pte);
/* An entry that was a failed, readable page (failed_reads) is one no more:
 * counted down. */
void sbi_failed_read_gone(struct sb_buf *buf, uint64_t pte);

/* Files (file.c). */
/* 0 if st is a regular file (or, with allow_blk, a block device), else
 * -EISDIR for a directory, -ENODEV for anything else (FIFO, socket,
 * character device). */
int sbi_file_kind(const struct stat *st, bool allow_blk);
/* Open path read-only, but only if it is what sbi_file_kind accepts: it
 * is looked at first (O_PATH) and never opened otherwise (a FIFO's open
 * would wait for a writer, a device's driver would run). st receives its
 * fstat. Returns the descriptor or -errno (-EAGAIN: without /proc, the
 * path named another file by the time it was opened). */
int sbi_file_open_input(const char *path, bool allow_blk, struct stat *st);
/* A new O_DIRECT description of fd's own file (through /proc/self/fd),
 * or -1. */
int sbi_file_reopen_direct(int fd, int flags);
/* Bytes in the file or block device (BLKGETSIZE64). 0 or -errno. */
int sbi_file_size(int fd, const struct stat *st, uint64_t *size);
/* pwrite / pread all of n bytes at off: 0 or -errno (a read that meets the
 * end of the file: -EBADMSG). */
int sbi_file_write_all(int fd, const void *p, size_t n, uint64_t off);
int sbi_file_read_all(int fd, void *p, size_t n, uint64_t off);

/* Replacing a file atomically (replace.c). begin: resolve path (refusing
 * what is not a regular file) and open a new, unnamed file in its
 * directory (fd: read-write). commit: swap it in. end: close, and remove
 * the new file unless it was committed. Each returns 0 or -errno. */
struct sbi_replace {
	int dirfd;		/* the target's directory (O_PATH) */
	char name[256];		/* the target's last component */
	char tmp[32];		/* the new file's temporary name, if it has one */
	bool named;		/* tmp names the new file */
	bool existed;		/* a regular file was there ... */
	struct stat old;	/* ... this one */
	int fd;
};
int sbi_replace_begin(struct sbi_replace *r, const char *path);
int sbi_replace_commit(struct sbi_replace *r);
void sbi_replace_end(struct sbi_replace *r);

/* Read the data of a DISK page (not in flight) into mem (ps bytes, aligned)
 * synchronously and check it: save. 0 or -EIO. */
int sbi_pagein_read_sync(struct sb_buf *buf, size_t idx, void *mem);
/* Check the data of page idx read from src into mem (res bytes): zero what
 * lies past the data, verify checksums. 0 or -EIO (pagein.c). pool_side:
 * mem is the pool side of that page, whose spill checksum is then read
 * through the heap's file (sbi_heap_crc32c); else NULL. */
int sbi_src_check(struct sb_buf *buf, size_t idx, uint64_t src_pte,
		  void *mem, const sbi_pid *pool_side, ssize_t res);
/* The file position of a DISK entry's data. */
void sbi_src_where(struct sb_buf *buf, size_t idx, uint64_t pte, int *fd,
		   uint64_t *off, size_t *len);
void sbi_src_free(struct sbi_src *src);

/* ---- trace.h has the USDT probes -------------------------------------------*/

#endif /* SPARSEBUF_INTERNAL_H */
