/* SPDX-License-Identifier: MIT */
/*
 * sparsebuf: placement-sparse buffers for CPU LLM inference on Linux.
 *
 * A buffer is a huge range of virtual address space that costs no physical
 * memory until pages are placed in it. Pages come from a pool of placement
 * heaps (memfd files). Placing is explicit (sb_buf_map) or happens on first
 * touch, where a userfaultfd handler thread plays the GPU MMU's part. Pages
 * can be shared between buffers with copy-on-write (sb_buf_share).
 *
 * Conventions: functions returning int or long return a value >= 0 on
 * success and -errno on failure; errno is never the channel. Constructors
 * return NULL and store -errno in *err when err is not NULL. Every function
 * is thread-safe. See docs/api.md for one section per function.
 */
#ifndef SPARSEBUF_H
#define SPARSEBUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPARSEBUF_VERSION_MAJOR 0
#define SPARSEBUF_VERSION_MINOR 3
#define SPARSEBUF_VERSION_PATCH 0
#define SPARSEBUF_VERSION_STRING "0.3.0"

/* The library's version at run time ("0.2.0"), and as a number (MAJOR *
 * 10000 + MINOR * 100 + PATCH), to compare with the SPARSEBUF_VERSION_*
 * this program was compiled against. */
const char *sb_version(void);
int sb_version_number(void);

/*
 * Structs that grow. The structs a caller fills or receives (sb_pool_opts,
 * sb_stats, sb_features, sb_kv_config, sb_kv_stats) gain fields at their
 * end in later releases. Every function taking one has a _sz form that is
 * also told the struct's size as the caller knows it; the names without
 * _sz are inline functions in these headers that pass
 * sizeof(struct ...) as compiled, so source code needs no change. The
 * library reads the fields it and the caller both know, takes the ones
 * the caller does not know as 0 (their defaults), refuses a caller's
 * field it does not know that is not 0 (-E2BIG: a newer program asking
 * for something this library cannot do), and writes no further than the
 * caller's size. Programs built against 0.1 call the plain names, exported
 * with the 0.1 sizes. docs/api.md, "Versions and compatibility", has the rules.
 */

/* ---- Pools of placement heaps ------------------------------------------ */

struct sb_pool_opts {
	size_t page_size;	/* bytes per page */
	size_t heap_size;	/* bytes per heap, a multiple of page_size */
	size_t max_bytes;	/* physical budget; 0 = unlimited */
	int numa_node;		/* -1 = no binding */
	/* Where evicted pages go (an unlinked file per pool, O_DIRECT when
	 * the file system allows). NULL: SPARSEBUF_SPILL_DIR, else $TMPDIR,
	 * else /tmp. */
	const char *spill_dir;
	/* Since 0.3. A client of sparsebufd (sb_pool_connect): the part of
	 * the machine's budget reserved for this pool, its floor. Nobody
	 * else is given it, and this pool is never made to evict below it,
	 * so it grows to it without waiting. sb_pool_connect fails with
	 * -EPERM when this user's floors would pass the daemon's
	 * --max-floor, -ENOSPC when that much of its budget is not free.
	 * Rounded up to whole pages; at most max_bytes when that is set. A
	 * local pool has its budget to itself and ignores it. 0 = none;
	 * SPARSEBUF_MIN_BYTES. */
	size_t min_bytes;
	/* Since 0.3. SB_POOL_* below; 0 = none. */
	unsigned int flags;
};

/* Heaps of the system's huge pages (hugetlbfs, MFD_HUGETLB) rather than
 * shmem: each placed page is mapped by page-directory entries, one per
 * huge page, instead of one page-table entry per 4 KiB, so placing and
 * first touching a page costs a small fraction as much (docs/api.md,
 * "Huge-page heaps"; on a shadow-paging VM, 0.3 us a 4 KiB against 8).
 * page_size and heap_size must be multiples of the huge page size
 * (sb_features.hugetlb_page_size), and the pages come from the huge
 * pages the administrator reserved (vm.nr_hugepages), which the library
 * never changes: when they run out, placements fail with -ENOMEM as
 * at the budget, and faults raise SIGBUS. Not with a NUMA node
 * (-EINVAL). With sb_pool_connect, sparsebufd makes the heaps on
 * hugetlbfs (one older than 0.3: -EOPNOTSUPP). SPARSEBUF_HUGETLB=1. */
#define SB_POOL_HUGETLB 0x1u

/* Fill *opts with the defaults (256 KiB pages, 64 MiB heaps, no budget, no
 * NUMA binding), then apply the SPARSEBUF_* environment variables. When a
 * variable is bad, page_size is left 0 so that sb_pool_create reports
 * -EINVAL; the library's constructor has already logged why. */
void sb_pool_opts_init_sz(struct sb_pool_opts *opts, size_t opts_size);

/* Create a pool. Starts its fault-handler and ready-page threads (their
 * CPUs set by the library, not inherited from the caller); commits no
 * memory until pages are placed. Errors: -EINVAL (bad options), -ENOSYS,
 * -EPERM or -EACCES (userfaultfd unavailable: sparsebuf-info says why),
 * -ENOMEM, -EMFILE, -ENFILE, -EAGAIN (no thread). */
struct sb_pool *sb_pool_create_sz(const struct sb_pool_opts *opts,
				  size_t opts_size, int *err);

/* Create a pool that is a client of sparsebufd listening at path
 * (docs/daemon.md): its pages count against the daemon's machine-wide
 * budget, leased ahead in chunks, and when that budget is full the daemon
 * takes pages back from idle processes (their evictable pages go to disk)
 * before this pool is refused. opts as for sb_pool_create; max_bytes is
 * this pool's own ceiling within the machine's budget. Every call works
 * on it as on a local pool. If the daemon goes away, pages held stay
 * valid; new pages wait up to SPARSEBUF_DAEMON_WAIT_MS for a daemon, then
 * follow SPARSEBUF_DAEMON_FALLBACK. Errors: as sb_pool_create, and
 * -ENOENT or -ECONNREFUSED (no daemon at path), -EACCES (the socket's
 * permissions), -EPROTO (not a sparsebufd, or another version). */
struct sb_pool *sb_pool_connect_sz(const char *path,
				   const struct sb_pool_opts *opts,
				   size_t opts_size, int *err);

/* Destroy a pool and every buffer still alive in it (their addresses become
 * invalid). NULL is a no-op. */
void sb_pool_destroy(struct sb_pool *pool);

/* The process-wide pool configured by SPARSEBUF_* variables, created on the
 * first call. NULL if initialisation failed; sb_default_pool_error() says
 * why. A fork()ed child gets a fresh default pool of its own. */
struct sb_pool *sb_default_pool(void);

/* 0 if the default pool is (or can be) created, else the -errno that made
 * it fail (bad SPARSEBUF_* value, userfaultfd unavailable, ...). */
int sb_default_pool_error(void);

struct sb_stats {
	size_t page_size;
	size_t heaps;		/* heaps allocated now */
	size_t pages_used;	/* pages holding data; a shared page counts once */
	size_t bytes_resident;	/* physical bytes the pool holds now */
	size_t max_bytes;
	uint64_t faults;	/* faults serviced */
	uint64_t maps;		/* pages placed by sb_buf_map */
	uint64_t unmaps;	/* pages released */
	uint64_t cow_copies;	/* copy-on-write copies */
	/* Additions beyond the core contract. */
	size_t pages_ready;	/* zeroed pages kept ready (in bytes_resident) */
	uint64_t fault_places;	/* pages placed by faults (zero-fill) */
	uint64_t sigbus;	/* faults answered with SIGBUS (budget, I/O) */
	uint64_t sync_prepares;	/* pages the caller had to zero or allocate
				 * itself because no ready page was at hand */
	/* The disk tier. */
	uint64_t pages_in;	/* pages read in (spill, file, save file) */
	uint64_t pages_out;	/* pages written out to spill */
	uint64_t bytes_read;
	uint64_t bytes_written;
	uint64_t io_errors;	/* failed reads/writes, checksum mismatches */
	uint64_t pages_dropped;	/* clean pages released without a write */
	size_t spill_bytes;	/* spill file space holding evicted pages */
	/* Pages placed whose first access the ready thread took ahead of
	 * their owner (one read a 4 KiB; docs/design.md says why). */
	uint64_t pages_touched;
	/* New in 0.3: page faults the program's threads took inside the
	 * library to fill placed pages' page-table entries (sb_buf_map, a
	 * prefetch with SB_PREFETCH_WAIT): a read every fault_around_pages
	 * (sb_features), 4 per 256 KiB page, cheaper than MAP_POPULATE
	 * (docs/design.md, "Filling page tables by fault-around"). perf
	 * counts them with the handler's faults. */
	uint64_t map_faults;
};

/* Snapshot of the pool's accounting. Errors: -EINVAL, -ECHILD (a parent's
 * pool in a fork()ed child; so for every call below). */
int sb_pool_stats_sz(struct sb_pool *pool, struct sb_stats *st,
		     size_t st_size);

/* Give back what the pool holds without using it: the ready reserve and
 * every heap with no page in use. Returns the number of bytes released.
 * Errors: -EINVAL, -ECHILD. */
long sb_pool_trim(struct sb_pool *pool);

/* Keep at least this much more (delta_bytes > 0) or less (< 0) memory in
 * zeroed pages ready for growth: a floor under the pool's adaptive reserve,
 * for a client that knows its bursts (a KV cache whose every region crosses
 * a page boundary at the same position). The pool's thread fills it in
 * the background, before the first allocation too. Ready pages count in
 * bytes_resident and against the budget. Returns the floor in bytes.
 * Errors: -EINVAL, -ECHILD, -ERANGE (the floor would not fit a long; it is
 * left as it was). */
long sb_pool_reserve(struct sb_pool *pool, long delta_bytes);

/* ---- Sparse buffers ----------------------------------------------------- */

#define SB_BUF_STRICT	(1u << 0)	/* unplaced touch -> SIGBUS */
#define SB_BUF_EVICTABLE (1u << 1)	/* cold pages may go to disk when
					 * the pool is at its budget */
/* Grows at its end (a KV cache region written row by row): once a page is
 * placed (by a touch or sb_buf_map) right after a placed one, the pool's
 * background thread keeps the next page placed ahead, and places the one
 * after as soon as the first bytes of that page are written. Growth by
 * touch then takes no fault; the buffer holds at most one page beyond what
 * was placed for it (so sb_buf_map may find that page placed and count 0
 * for it). Not with SB_BUF_STRICT or SB_BUF_EVICTABLE. */
#define SB_BUF_GROWS	(1u << 2)

/* Reserve length bytes (rounded up to whole pages; terabytes are fine) of
 * address space aligned to the pool's page size. No physical memory is
 * committed. The pool's first SB_BUF_EVICTABLE buffer sets up its disk tier
 * (I/O threads) here, so that no fault has to. Errors: -EINVAL (NULL pool,
 * zero length, unknown flag, SB_BUF_GROWS with another flag), -ENOMEM (no address space), -EOPNOTSUPP
 * (SB_BUF_EVICTABLE without write-protect on shmem), -ECHILD, and for an
 * evictable buffer -EMFILE, -ENFILE, -EAGAIN (setting up the disk tier). */
struct sb_buf *sb_buf_create(struct sb_pool *pool, size_t length,
			     unsigned flags, int *err);

/* Release every page of the buffer and its address range. NULL is a no-op.
 * Threads blocked on a fault in the buffer are woken and fault again on an
 * unmapped address (SIGSEGV): destroying a buffer in use is a bug. */
void sb_buf_destroy(struct sb_buf *buf);

/* The buffer's base address (aligned to the pool's page size; it never
 * changes), its length (whole pages) and its pool. NULL or 0 for NULL. */
void *sb_buf_addr(const struct sb_buf *buf);
size_t sb_buf_length(const struct sb_buf *buf);
struct sb_pool *sb_buf_pool(const struct sb_buf *buf);

/* Place a page under every page of [off, off+len) that has none. Returns
 * the number of pages newly placed. All or nothing for the pages it
 * allocates: on an error none is placed; pages whose data was on disk are
 * read back first and stay placed even if the call then fails; a page
 * whose earlier read failed (a spill copy, a file's page) is read once
 * more. Errors: -EINVAL,
 * -ERANGE (the range reaches past the end), -ENOMEM (budget with nothing
 * evictable, memory, or vm.max_map_count), -EIO (a page whose read
 * failed), -ECHILD. */
long sb_buf_map(struct sb_buf *buf, size_t off, size_t len);

/* Release the pages lying wholly inside [off, off+len). Returns how many
 * were released. Their contents are gone: a later touch sees zeros (SIGBUS
 * for a strict buffer). Also clears pages poisoned by a failed fault.
 * Errors: -EINVAL, -ERANGE, -ECHILD, -ENOMEM (the mapping limit, splitting
 * a run; pages released before stay released). */
long sb_buf_unmap(struct sb_buf *buf, size_t off, size_t len);

/* Make [dst_off, dst_off+len) of dst show the physical pages of
 * [src_off, src_off+len) of src (dst may be src). Offsets must be
 * page-aligned (-EINVAL); len is rounded up to whole pages. Whatever dst had
 * there is released; unplaced source pages leave dst unplaced. The first
 * write through either side gives the writer a private copy (counted in
 * cow_copies). Returns the number of pages shared. Source pages on disk are
 * read in first (one whose earlier read failed once more, as by
 * sb_buf_map); eviction leaves src alone meanwhile. Errors: -EINVAL,
 * -ERANGE, -EXDEV (different pools), -EOPNOTSUPP (no write-protect on
 * shmem), -ENOMEM (no page for a source page on disk, or the mapping
 * limit), -EIO (a source page's data lost), -EAGAIN (a source page kept
 * going back to disk: not seen in practice), -ECHILD. */
long sb_buf_share(struct sb_buf *dst, size_t dst_off, struct sb_buf *src,
		  size_t src_off, size_t len);

/* Number of pages of [off, off+len) (every page intersecting it) that have
 * a page placed. Errors: -EINVAL, -ERANGE, -ECHILD. */
long sb_buf_placed(const struct sb_buf *buf, size_t off, size_t len);

struct sb_range {
	size_t off;
	size_t len;
};

#define SB_PREFETCH_WAIT (1u << 0)	/* return when the data is placed */

/* Ask for the pages of n ranges to be placed ahead of use, in the
 * background (the pool's ready thread), so that the thread that will touch
 * them pays nothing: the placement-ahead half of a decode loop. Returns
 * the number of pages queued (pages already placed are not counted; a
 * full queue drops the rest: prefetch is advice). With SB_PREFETCH_WAIT
 * the pages are placed before it returns, and so is everything queued
 * earlier for this buffer (n = 0 just waits for those). A later
 * sb_buf_unmap of a range cancels what is still queued for it. With WAIT,
 * a page whose earlier read failed is read once more, as by sb_buf_map.
 * Errors:
 * -EINVAL, -ERANGE (as sb_buf_map, for any range), -ECHILD, and with WAIT
 * those of sb_buf_map (-ENOMEM, -EIO). */
long sb_buf_prefetch(struct sb_buf *buf, const struct sb_range *ranges,
		     size_t n, unsigned flags);

/* Since 0.3. sb_buf_unmap of n ranges in one call: every range is checked
 * first (an error releases nothing), then the pages lying wholly inside
 * each are released. Returns how many. Cheaper than one call a range when
 * the ranges are many and small: a file buffer's pages are released a
 * batch at a time (one TLB flush for up to 256 runs of pages, where a
 * call of its own costs one each). Errors: those of sb_buf_unmap. */
long sb_buf_unmap_ranges(struct sb_buf *buf, const struct sb_range *ranges,
			 size_t n);

/* ---- The disk tier ------------------------------------------------------ */

/* Write the placed pages of [off, off+len) (pages wholly inside) to the
 * pool's spill file and release them; a later touch, sb_buf_map or
 * sb_buf_prefetch reads the data back before the thread continues. Pages of
 * a file-backed buffer are clean: they are released without a write.
 * Returns the number of pages released. A shared page is written for this
 * buffer only; the other holders keep it. Errors: -EINVAL, -ERANGE,
 * -ENOSPC (spill disk full: the pages of the failing batch stay resident),
 * -EIO, -EOPNOTSUPP (no write-protect on shmem), -ENOMEM or -EAGAIN (the
 * mapping limit; pages stay resident), the open(2) error of the spill file
 * (-ENOENT, -EACCES, -EMFILE, ...: tried again at the next eviction),
 * -ECHILD. */
long sb_buf_evict(struct sb_buf *buf, size_t off, size_t len);

/* Show len bytes of the file (or block device) at path, from file_off (a
 * multiple of 4 KiB), as a read-only buffer whose pages are read in through
 * io_uring on touch (sequential touches read ahead). Bytes past the end of
 * the file as it was when opened read as zeros; if the file shrinks later, a
 * touch of a page whose data is gone raises SIGBUS (as with mmap). Clean
 * pages are dropped, without a write, when the pool needs room. A write
 * into the buffer raises SIGSEGV. Errors: -EINVAL, -ENODEV (not a regular
 * file or block device: a FIFO is refused without blocking), -EISDIR,
 * -EOVERFLOW (file_off + len past the largest file offset), the open(2)
 * error, -ENOMEM, -ECHILD. */
struct sb_buf *sb_buf_open_file(struct sb_pool *pool, const char *path,
				uint64_t file_off, size_t len, unsigned flags,
				int *err);

/* Write [off, off+len) (whole pages) of buf to a file at path: the placed
 * and evicted pages, with a checksum per 4 KiB; unplaced pages are holes.
 * Atomic: a new file is written beside path and renamed over it, so an
 * error or a kill leaves the previous file intact, and buffers reading the
 * previous file (restored from it, or sb_buf_open_file) keep reading it. A
 * replaced file's mode (and owner, where allowed) carry over; the
 * directory must be writable. A path that is not a regular file is
 * refused, never replaced.
 * Errors: -EINVAL, -ERANGE, -EIO (a page's data lost), -ENODEV (a FIFO,
 * socket or device), -EISDIR, -ENOENT (no such directory, or a dangling
 * symlink), -ENAMETOOLONG, open(2)/write(2)/rename(2) errors (-ENOSPC,
 * -EACCES, ...), -ENOMEM, -ECHILD. */
int sb_buf_save(struct sb_buf *buf, size_t off, size_t len, const char *path);

/* Open a file written by sb_buf_save as a writable buffer of the saved
 * length whose pages are read in lazily on touch (and checked). The work
 * and memory it takes follow what the file really holds. Errors: -EINVAL,
 * the open(2) error, -ENODEV (a FIFO, socket or device), -EISDIR, -EBADMSG
 * (not a sparsebuf save file, or a damaged or inconsistent header or
 * tables), -ENOMEM, -ECHILD. */
struct sb_buf *sb_buf_restore(struct sb_pool *pool, const char *path,
			      unsigned flags, int *err);

enum sb_advice {
	SB_ADVICE_NORMAL = 0,
	SB_ADVICE_HOT,		/* evict last */
	SB_ADVICE_COLD,		/* evict first */
	SB_ADVICE_WILLNEED,	/* read in now, in the background */
	SB_ADVICE_DONTNEED,	/* evict now (sb_buf_evict) */
	/* Since 0.3: a fault on a page on disk reads that page alone, no
	 * read-ahead (the application prefetches what it needs, as an LLM
	 * in a flash runner does); NORMAL turns read-ahead back on. */
	SB_ADVICE_RANDOM,
};

/* Tell the eviction policy about [off, off+len). Returns the number of
 * pages affected (WILLNEED, DONTNEED: what sb_buf_prefetch, sb_buf_evict
 * return, errors included; RANDOM: the pages of the range). Errors:
 * -EINVAL, -ERANGE, -ECHILD, -ENOMEM (RANDOM: no memory for the buffer's
 * table of such pages, a bit a page). */
long sb_buf_advise(struct sb_buf *buf, size_t off, size_t len,
		   enum sb_advice advice);

/* ---- What this kernel allows -------------------------------------------- */

enum sb_uffd_mode {
	SB_UFFD_NONE = 0,	/* userfaultfd unavailable: see uffd_error */
	SB_UFFD_SYSCALL,	/* userfaultfd(2), kernel faults trapped too */
	SB_UFFD_USER_ONLY,	/* userfaultfd(UFFD_USER_MODE_ONLY) */
	SB_UFFD_DEVICE,		/* /dev/userfaultfd */
};

struct sb_features {
	enum sb_uffd_mode uffd_mode;
	int uffd_error;		/* -errno of the last attempt when NONE */
	uint64_t uffd_features;	/* UFFDIO_API feature bits of this kernel */
	uint64_t uffd_ioctls;	/* ioctls allowed on a registered range */
	int wp_shmem;		/* write-protect on shmem: copy-on-write */
	int poison;		/* UFFDIO_POISON: SIGBUS on a chosen page */
	int io_uring;		/* 1 if io_uring_setup works, else -errno */
	char pager[48];		/* the disk tier's I/O path, e.g. "io_uring" or
				 * "pread/pwrite (io_uring: ...)" */
	int numa_nodes;		/* configured NUMA nodes (0: libnuma says no) */
	long max_map_count;	/* vm.max_map_count */
	long map_count;		/* mappings this process has now */
	char kernel[64];	/* uname release */
	/* New in 0.3: the median nanoseconds of the first write to a 4 KiB
	 * page the kernel has just mapped. Microseconds on a VM whose host
	 * shadows the guest's page tables: pools then have their ready
	 * thread take each placed page's first access (SPARSEBUF_TOUCH). */
	long first_access_ns;
	/* New in 0.3: 4 KiB pages one read fault maps on a shared memfd
	 * mapping (the kernel's fault-around, 16 by default; 0: not
	 * measured). Pools fill placed pages' page tables that way when it
	 * is at least 16 and first_access_ns is small, else MAP_POPULATE. */
	long fault_around_pages;
	/* New in 0.3: the system's default huge page size, which
	 * SB_POOL_HUGETLB heaps use (0: the kernel has none), and how many
	 * of those pages are free now and not reserved by a mapping
	 * (HugePages_Free - HugePages_Rsvd, read fresh on each call; 0
	 * unless the administrator reserved some). */
	size_t hugetlb_page_size;
	long hugetlb_pages_free;
};

/* Probe once per process (cached; a probe that ran short of descriptors or
 * memory is repeated at the next call); map_count is read fresh on each
 * call. Errors: -EINVAL (NULL). */
int sb_features_get_sz(struct sb_features *f, size_t f_size);

#ifndef SPARSEBUF_BUILD
/* The plain names, for the struct sizes this program is compiled with. */
static inline void sb_pool_opts_init(struct sb_pool_opts *opts)
{
	sb_pool_opts_init_sz(opts, sizeof(struct sb_pool_opts));
}

static inline struct sb_pool *sb_pool_create(const struct sb_pool_opts *opts,
					     int *err)
{
	return sb_pool_create_sz(opts, sizeof(struct sb_pool_opts), err);
}

static inline struct sb_pool *sb_pool_connect(const char *path,
					      const struct sb_pool_opts *opts,
					      int *err)
{
	return sb_pool_connect_sz(path, opts, sizeof(struct sb_pool_opts), err);
}

static inline int sb_pool_stats(struct sb_pool *pool, struct sb_stats *st)
{
	return sb_pool_stats_sz(pool, st, sizeof(struct sb_stats));
}

static inline int sb_features_get(struct sb_features *f)
{
	return sb_features_get_sz(f, sizeof(struct sb_features));
}
#else
void sb_pool_opts_init(struct sb_pool_opts *opts);
struct sb_pool *sb_pool_create(const struct sb_pool_opts *opts, int *err);
int sb_pool_stats(struct sb_pool *pool, struct sb_stats *st);
int sb_features_get(struct sb_features *f);
#endif

#ifdef __cplusplus
}
#endif

#endif /* SPARSEBUF_H */
