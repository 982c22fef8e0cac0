/* SPDX-License-Identifier: MIT */
/*
 * The ready thread keeps a small reserve of zeroed, allocated heap pages so
 * that placing a page costs the caller only the mapping, not allocation and
 * zeroing (the kernel's own demand paging pays both on the faulting thread).
 *
 * What it does, in order of priority, never holding pool->lock while
 * touching memory (the pages are BUSY meanwhile):
 *   0. place the ranges queued by sb_buf_prefetch (prefetch.c);
 *   1. make ready the pages that allocations asked for next: the page
 *      after each growing run's last one (so that growth continues on a
 *      ready page and its mapping merges with the previous one), then,
 *      when all of those are ready, the page after that (so one late
 *      wake-up of this thread costs nothing); zero them (allocating
 *      what has no memory yet) through the heap file, not a mapping;
 *   2. when a run was started or a heap is nearly full, make ready the
 *      first page of the site where the next run will start (adding a heap
 *      ahead if none has room), so the next new run does not wait either;
 *      below a floor a client asked for (sb_pool_reserve), any free hole,
 *      even before the first allocation;
 *   3. punch free backed pages beyond the reserve target, up to 64 at a
 *      time (memory goes back to the system promptly after an unmap),
 *      except freed pages kept for page-ins: as many as page-ins took in
 *      the last 100 ms (a page-in overwrites one as it is, pool.c);
 *   4. zero freed (dirty) pages into the reserve;
 *   5. every 100 ms: release empty heaps but one spare; after a second in
 *      which no caller had to prepare a page itself, shrink the target;
 *      sweep the heaps' pool-side page-table entries (heap.c); once the
 *      disk tier is quiet, start giving freed spill slots' blocks back
 *      (spill.c).
 * The target grows by one page for every page a caller had to prepare or
 * wait for (pool.c), between 1 MiB and 64 MiB worth of pages: the reserve
 * follows the growth rate. It never takes the pool past its budget.
 *
 * Waking: while allocations keep coming the thread polls every millisecond
 * instead of being signalled, see ready_wait().
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum work { W_NONE, W_BACK, W_ZERO, W_PUNCH };	/* BACK, ZERO: zeroed */

/* The oldest want, or (newest) the last one pushed. */
static bool ring_pop(struct sbi_ring *q, sbi_pid *p, bool newest)
{
	if (q->head == q->tail)
		return false;
	if (newest) {
		q->tail = (q->tail + q->cap - 1) % q->cap;
		*p = q->pid[q->tail];
		return true;
	}
	*p = q->pid[q->head];
	q->head = (q->head + 1) % q->cap;
	return true;
}

/* First free page in state st, any earmark (sbi_pool_find_free). */
static bool find_state(struct sb_pool *pool, enum sbi_page_state st,
		       struct sbi_heap **hp, uint32_t *ip)
{
	sbi_pid p;

	if (!sbi_pool_find_free(pool, st, NULL, &p))
		return false;
	*hp = sbi_pid_heap(pool, p);
	*ip = sbi_pid_index(pool, p);
	return true;
}

/* Pages punched in one call: 1 MiB, at least one page. Punching frees
 * memory at 60 us per 256 KiB here (the kernel's shmem_undo_range), and
 * the pages wanted next wait meanwhile: 64 pages of 256 KiB took 3.8 ms,
 * in which a growing buffer's caller ran through the reserve. */
static uint32_t punch_max(const struct sb_pool *pool)
{
	uint32_t n = (uint32_t)((1u << 20) >> pool->page_shift);

	return n ? (n < 64 ? n : 64) : 1;
}

/*
 * The last stretch of free pages in state st, up to max pages and
 * punch_max: what punching gives back first. New runs start at the first
 * free extent (sbi_pool_find_site) and the reserve is zeroed from the
 * first freed pages on (pick_work), so memory given back from the far end
 * is memory no run was about to take: after a buffer is destroyed, its
 * first pages become the next run's ready pages instead of holes it must
 * fill again (bench/place: a tenth of the pages prepared by the caller,
 * when the punches took the front and the reserve sat at the back). The
 * earmark does not matter here. pool->lock held.
 */
static bool last_stretch(struct sb_pool *pool, enum sbi_page_state st,
			 size_t max, struct sbi_heap **hp, uint32_t *ip,
			 uint32_t *np)
{
	SBI_HELD(&pool->lock);
	for (uint32_t s = pool->heap_hi; s-- > 0;) {
		struct sbi_heap *h = pool->heaps[s];
		uint32_t i, n = 0;

		if (!h || !(st == SBI_PG_READY ? h->nready : h->ndirty))
			continue;
		for (i = h->npages; i-- > 0 && h->state[i] != st;)
			;
		while (n < max && n < punch_max(pool) && n <= i &&
		       h->state[i - n] == st)
			n++;
		*hp = h;
		*ip = i + 1 - n;
		*np = n;
		return true;
	}
	return false;
}

/* Mark [i, i+n) BUSY; pool->lock held. */
static void set_busy_run(struct sb_pool *pool, struct sbi_heap *h, uint32_t i,
			 uint32_t n)
{
	SBI_HELD(&pool->lock);
	for (uint32_t k = 0; k < n; k++)
		sbi_page_set_busy(pool, h, i + k);
}

/* Work on a page the allocator asked for; W_NONE if it needs none. */
static enum work want_work(struct sb_pool *pool, bool may_back,
			   struct sbi_heap *h, uint32_t i)
{
	if (!h)
		return W_NONE;
	if (h->state[i] == SBI_PG_DIRTY)
		return W_ZERO;	/* cheapest: the memory is there */
	if (h->state[i] == SBI_PG_UNBACKED && may_back &&
	    pool->resident < pool->max_pages)
		return W_BACK;
	return W_NONE;
}

/* The first free hole no run holds among pages [lo, top) of h. */
static bool floor_hole(const struct sbi_heap *h, uint32_t lo, uint32_t top,
		       uint32_t *ip)
{
	const uint8_t *p, *end;

	if (top > h->npages)
		top = h->npages;
	if (lo >= top)
		return false;
	p = h->state + lo;
	end = h->state + top;
	for (; p < end && (p = memchr(p, SBI_PG_UNBACKED, (size_t)(end - p)));
	     p++) {
		uint32_t i = (uint32_t)(p - h->state);

		if (!h->owner[i]) {
			*ip = i;
			return true;
		}
	}
	return false;
}

#define FLOOR_STUCK_MS 10000	/* a floor that could not grow: tried again */

/* Whether the floor may add a heap: each is a file descriptor, and the
 * floor's heaps are memory for a burst that may not come. The pool's heaps
 * stay within a quarter of what the process may open (RLIMIT_NOFILE), as
 * home heaps do (home.c): with small heaps a floor took every descriptor
 * the application had left (and, on a client of sparsebufd, the one the
 * daemon's next reply carried). Growth itself is not limited here. */
static bool floor_fd_room(const struct sb_pool *pool)
{
	struct rlimit rl;

	return getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
	       (rl.rlim_cur == RLIM_INFINITY ||
		pool->nheaps + 1 <= rl.rlim_cur / 4);
}

/*
 * A page without memory to make ready for the floor a client asked for
 * (sb_pool_reserve): the first free hole no run holds, in a new heap if
 * there is none. Runs start on ready pages (pool.c, ready_site), so a
 * floor set before the first allocation is where the first runs grow; the
 * other ways into the reserve follow allocations (the pages runs want
 * next, the next run's site) and an idle pool had none. pool->lock held.
 */
static bool floor_page(struct sb_pool *pool, struct sbi_heap **hp,
		       uint32_t *ip)
{
	SBI_HELD(&pool->lock);
	uint32_t hi = pool->heap_hi;
	uint32_t first = pool->floor_cursor / pool->pages_per_heap;
	uint32_t at = sbi_pid_index(pool, pool->floor_cursor);
	uint64_t now;
	int err;

	if (first >= hi)
		first = at = 0;
	/* From the cursor on, round through the other heaps, and the part
	 * of the cursor's heap before it last (a page there may have lost
	 * its memory since). */
	for (uint32_t k = 0; hi && k <= hi; k++) {
		uint32_t s = (first + k) % hi;
		struct sbi_heap *h = pool->heaps[s];

		if (h && floor_hole(h, k ? 0 : at,
				    k == hi ? at : h->npages, ip)) {
			*hp = h;
			pool->floor_cursor = s * pool->pages_per_heap + *ip;
			pool->floor_stuck_ms = 0;
			return true;
		}
	}
	now = sbi_mono_ms();
	if (now < pool->floor_heap_ms)
		return false;
	*hp = floor_fd_room(pool) ? sbi_pool_add_heap(pool, &err) : NULL;
	if (!*hp) {
		pool->floor_heap_ms = now + 1000;
		pool->floor_stuck_ms = now + FLOOR_STUCK_MS;
		return false;
	}
	pool->floor_stuck_ms = 0;
	pool->floor_cursor = (*hp)->slot * pool->pages_per_heap;
	*ip = 0;
	return true;
}

/*
 * Choose the next piece of work and mark its pages BUSY; pool->lock held.
 * Latency first: pages that a growing buffer will need next; then memory
 * back to the system; then the reserve. Right after the growth watches
 * placed pages (backlog), the newest wants first: the oldest are the pages
 * the watches place next, in the same order, and a page made ready for one
 * of those went in the next burst, never lasting long enough for an owner
 * to take it out of turn. The newest are the pages after those just
 * placed, needed a whole page of growth later. (Older wants wait while
 * watches keep placing; they are the watches' next pages or stale: a want
 * is a hint, taken by the allocation that needs it if not ready.)
 */
static enum work pick_work(struct sb_pool *pool, bool may_back, bool backlog,
			   struct sbi_heap **hp, uint32_t *ip, uint32_t *np)
{
	SBI_HELD(&pool->lock);
	enum work w = W_NONE;
	size_t spare, excess_dirty;

	*np = 1;
	if (pool->trimming)
		return W_NONE;
	for (int prio = 0; prio < 2 && w == W_NONE; prio++) {
		sbi_pid p;

		while (w == W_NONE && pool->ready < pool->ready_target &&
		       ring_pop(&pool->wanted[prio], &p, backlog)) {
			uint32_t slot = p / pool->pages_per_heap;

			*hp = slot < pool->heap_hi ? pool->heaps[slot] : NULL;
			*ip = sbi_pid_index(pool, p);
			if (!*hp)
				continue;
			w = want_work(pool, may_back, *hp, *ip);
			/* Keep the run ready further ahead (low priority,
			 * bounded by the target): polling every millisecond,
			 * a fast run needs more than two pages in hand. Not
			 * onto a page that is ready already: the pages ahead
			 * of it were seen to when it was made ready, and the
			 * run's own allocations ask for what comes after
			 * them. Walked again a page a turn after every
			 * allocation, a run inside a long stretch of ready
			 * pages (pool.c, ready_site; 4 KiB pages, thousands)
			 * kept this thread on the lock the allocations
			 * wait for: growth took twice as long. */
			if ((w != W_NONE || (*hp)->state[*ip] == SBI_PG_READY) &&
			    *ip + 1 < pool->pages_per_heap &&
			    (*hp)->state[*ip + 1] != SBI_PG_READY &&
			    (*hp)->state[*ip + 1] != SBI_PG_USED &&
			    (*hp)->state[*ip + 1] != SBI_PG_EVICTED)
				sbi_ready_want(pool, p + 1, 1);
		}
	}
	if (w == W_NONE && pool->ready < pool->ready_target &&
	    pool->want_site) {
		/* Ready the page where the next run will start (in a new
		 * heap if none has room), so a new run does not wait. */
		uint32_t len;
		int err;

		pool->want_site = false;
		if (!sbi_pool_find_site(pool, sbi_run_pages(pool), hp, ip,
					&len)) {
			*hp = sbi_pool_add_heap(pool, &err);
			*ip = 0;
		}
		w = want_work(pool, may_back, *hp, *ip);
	}
	if (w == W_NONE && pool->ready < pool->ready_floor && may_back &&
	    pool->resident < pool->max_pages && floor_page(pool, hp, ip))
		w = W_BACK;
	/* Freed pages that page-ins will take as they are (pool.c) are
	 * neither punched nor zeroed. */
	excess_dirty = pool->dirty > pool->dirty_keep
			       ? pool->dirty - pool->dirty_keep
			       : 0;
	spare = pool->ready + excess_dirty;
	if (w == W_NONE && pool->resident > pool->max_pages) {
		/* Above the budget: a lease cut below what the pool holds
		 * (a daemon back with a smaller budget believes a client up
		 * to what it has room for). Free pages go first, whatever
		 * the target and the floor say, or reclaims find nothing to
		 * take: a client held 56 MiB of a floor's ready pages
		 * against a 32 MiB lease for good. */
		size_t max = pool->resident - pool->max_pages;

		if (last_stretch(pool, SBI_PG_DIRTY, max, hp, ip, np) ||
		    last_stretch(pool, SBI_PG_READY, max, hp, ip, np))
			w = W_PUNCH;
	}
	if (w == W_NONE && spare > pool->ready_target) {
		/* Punch the excess, a stretch of dirty pages at a time (but
		 * not the freed pages kept), then ready pages. */
		size_t max = spare - pool->ready_target;

		if (excess_dirty &&
		    last_stretch(pool, SBI_PG_DIRTY,
				 max < excess_dirty ? max : excess_dirty, hp,
				 ip, np))
			w = W_PUNCH;
		else if (last_stretch(pool, SBI_PG_READY, max, hp, ip, np))
			w = W_PUNCH;
	} else if (w == W_NONE && excess_dirty &&
		   pool->ready < pool->ready_target) {
		if (find_state(pool, SBI_PG_DIRTY, hp, ip))
			w = W_ZERO;
	}
	if (w != W_NONE)
		set_busy_run(pool, *hp, *ip, *np);
	return w;
}

/* Page i of h, BUSY, made ready: backed (W_BACK: it holds zeros, it may
 * lack memory) or zeroed (W_ZERO). 0 or -errno. */
static int make_ready(struct sb_pool *pool, enum work w, struct sbi_heap *h,
		      uint32_t i)
{
	return w == W_BACK ? sbi_heap_back(h, i, 1, pool->page_size,
					   pool->big_folios)
			   : sbi_heap_zero(h, i, 1, pool->page_size);
}

/* Punch up to n free backed pages, freed ones first; pool->lock held
 * (let go for each punch). Returns how many went. */
static size_t punch_free(struct sb_pool *pool, size_t n)
{
	SBI_HELD(&pool->lock);
	size_t released = 0;

	while (released < n) {
		struct sbi_heap *h;
		uint32_t i;

		if (!find_state(pool, SBI_PG_DIRTY, &h, &i) &&
		    !find_state(pool, SBI_PG_READY, &h, &i))
			break;
		sbi_page_set_busy(pool, h, i);
		pthread_mutex_unlock(&pool->lock);
		sbi_heap_punch(h, i, 1, pool->page_size);
		pthread_mutex_lock(&pool->lock);
		sbi_page_set_done(pool, h, i, SBI_PG_UNBACKED);
		released++;
	}
	return released;
}

size_t sbi_ready_trim(struct sb_pool *pool, bool keep_spare, bool all_ready)
{
	SBI_HELD(&pool->lock);
	bool kept = false;
	size_t released = 0;

	if (all_ready) {
		/* Forget what was wanted, pause the ready thread and let it
		 * finish the page in its hands. */
		pool->wanted[0].head = pool->wanted[0].tail;
		pool->wanted[1].head = pool->wanted[1].tail;
		/* The next run's first page too: kept, it would have the
		 * ready thread create a heap right after the trim. */
		pool->want_site = false;
		pool->ready_target = pool->ready_min > pool->ready_floor
					     ? pool->ready_min
					     : pool->ready_floor;
		pool->trimming++;
		for (;;) {
			uint32_t busy = 0;

			for (uint32_t s = 0; s < pool->heap_hi; s++)
				if (pool->heaps[s])
					busy += pool->heaps[s]->nbusy;
			if (!busy)
				break;
			pthread_cond_wait(&pool->busy_cond, &pool->lock);
		}
	}
	for (uint32_t s = 0; s < pool->heap_hi; s++) {
		struct sbi_heap *h = pool->heaps[s];
		size_t backed;

		if (!h || h->nused || h->nbusy || h->nevicted)
			continue;
		/* The ready thread's tick leaves a heap that holds more than
		 * 4 MiB of freed pages (about a millisecond of punching) to
		 * pick_work's punches, a megabyte at a time: punched whole,
		 * a destroyed buffer's 64 MiB heap took 7.5 ms, in which a
		 * buffer growing meanwhile found no page ready. Such a heap
		 * is the spare kept. Ready pages go with their heap, as
		 * before: at most the reserve's cap, and a client of
		 * sparsebufd that kept them would hold its lease from the
		 * machine's budget. A heap whose ready pages the floor
		 * needs (sb_pool_reserve) stays too, or it would be refilled
		 * at once. */
		if (!all_ready &&
		    ((size_t)h->ndirty << pool->page_shift > ((size_t)4 << 20) ||
		     (h->nready && pool->ready - h->nready < pool->ready_floor))) {
			kept = true;
			continue;
		}
		if (keep_spare && !kept) {
			kept = true;
			continue;
		}
		backed = (size_t)h->nready + h->ndirty;
		pool->resident -= backed;
		pool->ready -= h->nready;
		pool->dirty -= h->ndirty;
		pool->heaps[s] = NULL;
		pool->nheaps--;
		while (pool->heap_hi && !pool->heaps[pool->heap_hi - 1])
			pool->heap_hi--;
		released += backed;
		pthread_mutex_unlock(&pool->lock);
		sbi_heap_destroy(&pool->source, h, pool->page_size);
		pthread_mutex_lock(&pool->lock);
	}
	if (all_ready)
		released += punch_free(pool, SIZE_MAX);
	if (all_ready && --pool->trimming == 0)
		pthread_cond_signal(&pool->ready_cond);	/* touches may wait */
	return released;
}

size_t sbi_ready_release(struct sb_pool *pool, size_t n)
{
	SBI_HELD(&pool->lock);
	size_t released = 0;

	/* Paused meanwhile (as a trim): it would make ready again what goes
	 * here, with the lease about to be given back. */
	pool->trimming++;
	released = punch_free(pool, n);
	if (--pool->trimming == 0)
		pthread_cond_signal(&pool->ready_cond);
	return released;
}

/* Every 100 ms. The target shrinks by an eighth of its excess after a
 * whole second without a miss: growth often comes in bursts (every region
 * of a KV cache crosses a page boundary at the same position) separated by
 * long computations, and a reserve that decayed in between would miss the
 * next burst entirely. */
static void tick(struct sb_pool *pool)
{
	if (pool->misses) {
		pool->quiet_ticks = 0;
	} else if (++pool->quiet_ticks >= 10) {
		size_t low = pool->ready_min > pool->ready_floor
				     ? pool->ready_min
				     : pool->ready_floor;

		if (pool->ready_target > low) {
			size_t step = (pool->ready_target - low) / 8;

			pool->ready_target -= step ? step : 1;
		}
		pool->quiet_ticks = 0;
	}
	pool->misses = 0;
	/* Freed pages kept for page-ins: as many as the last tick's took,
	 * halving each tick they stop (gone within a second). */
	pool->dirty_keep = pool->overwrites > pool->dirty_keep / 2
				   ? pool->overwrites
				   : pool->dirty_keep / 2;
	/* No more than the reserve may hold: bytes_resident keeps within
	 * the pages in use + a page per region + the reserve's cap. */
	if (pool->dirty_keep > sbi_ready_cap(pool))
		pool->dirty_keep = sbi_ready_cap(pool);
	pool->overwrites = 0;
	sbi_ready_trim(pool, true, false);
	/* Pool-side entries left from the last burst (heap.c); heaps leave
	 * pool->heaps under the lock, so none goes away meanwhile. */
	for (uint32_t s = 0; s < pool->heap_hi; s++)
		if (pool->heaps[s])
			sbi_heap_sweep_pool(pool->heaps[s], pool->page_size);
}

/* Sleep until work may be there. While allocations keep coming (the last
 * one less than HOT_POLLS polls ago) poll every millisecond, a timer
 * wake-up on this thread's own CPU, so that allocating threads never pay
 * for waking this one; afterwards sleep long and let the next allocation
 * signal. pool->lock held. */
#define HOT_POLLS 200

static void ready_wait(struct sb_pool *pool, uint64_t *seen, unsigned *polls)
{
	SBI_HELD(&pool->lock);
	struct timespec ts;
	long ns;

	if (pool->alloc_seq != *seen) {
		*seen = pool->alloc_seq;
		*polls = 0;
	}
	/* Set with the touch queue's lock held: a touch queued since we
	 * looked either is seen here or sees the flag (touch.c). Not while
	 * sb_pool_trim runs: the loop leaves touches alone then, and going
	 * round again without this wait would keep pool->lock, which the
	 * trim waits for, for ever (it signals when it is done). */
	if (sbi_touch_set_idle(pool, ++*polls > HOT_POLLS) &&
	    !pool->trimming) {
		__atomic_store_n(&pool->ready_idle, false, __ATOMIC_RELAXED);
		return;
	}
	ns = pool->ready_idle ? 100 * 1000000L : 1000000L;
	/* A growth watch due sooner (grow.c) shortens the sleep: a paused
	 * buffer's owner allocates nothing when it resumes, its pages were
	 * placed ahead; the watch must notice by itself. */
	if (pool->grow_due_ms != UINT64_MAX) {
		uint64_t now = sbi_mono_ms();
		long left = pool->grow_due_ms > now
				    ? (long)(pool->grow_due_ms - now) * 1000000L
				    : 1000000L;

		if (left < ns)
			ns = left;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += ns;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&pool->ready_cond, &pool->lock, &ts);
	__atomic_store_n(&pool->ready_idle, false, __ATOMIC_RELAXED);
}

/*
 * Stay off the CPU of the thread that allocated last. Sharing a CPU with
 * the thread it serves, this one would be time-sliced against it and stall
 * it for milliseconds (or hold the pool lock while descheduled); on
 * another CPU its work overlaps the caller's. It runs at normal priority:
 * an idle-priority thread that holds the pool lock could be starved on a
 * busy machine and stall every allocation, and one at a lower weight
 * (measured with nice 10) gets too little CPU next to compute threads to
 * keep up with a growing KV cache. pool->lock held.
 */
static void avoid_cpu(struct sb_pool *pool, int *avoided)
{
	cpu_set_t set;
	int cpu = __atomic_load_n(&pool->caller_cpu, __ATOMIC_RELAXED);

	if (cpu < 0 || cpu == *avoided || cpu >= CPU_SETSIZE)
		return;
	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return;
	/* Give back the one avoided before, avoid this one, unless it is
	 * the only CPU left. */
	if (*avoided >= 0)
		CPU_SET(*avoided, &set);
	if (CPU_COUNT(&set) < 2 || !CPU_ISSET(cpu, &set))
		return;
	CPU_CLR(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) == 0)
		*avoided = cpu;
}

void *sbi_ready_thread(void *arg)
{
	struct sb_pool *pool = arg;
	uint64_t last_tick = sbi_mono_ms(), no_back_until = 0, seen = 0,
		 last_grow = 0;
	unsigned polls = HOT_POLLS;
	int avoided = -1;

	sbi_thread_internal();
	sbi_ready_self = true;
	pthread_mutex_lock(&pool->lock);
	while (!pool->stopping) {
		uint64_t now = sbi_mono_ms();
		struct sbi_heap *h;
		uint32_t i, n;
		enum work w;
		bool grew;	/* the watches placed pages */

		if (now - last_tick >= 100) {
			struct sbi_disk *d;

			tick(pool);
			sbi_stat_publish(pool);
			last_tick = now;
			/* Looked up and used under pool->lock, which keeps
			 * the disk tier from going (sbi_disk_destroy; tick
			 * may let the lock go). This never waits. */
			d = sbi_disk_peek(pool);
			if (d)
				sbi_spill_punch(d);
		}
		avoid_cpu(pool, &avoided);
		/* Placements a thread asked for come first: it will touch
		 * them soon. */
		if (!pool->trimming && sbi_prefetch_serve(pool))
			continue;
		/* Then the growing buffers' pages ahead (grow.c), looked at
		 * once a millisecond. A backlog of them (every region of a
		 * KV cache entered its page at once) is served a burst at a
		 * time, and between bursts the reserve gets a page while it
		 * is short: an owner that outruns its watch takes a ready
		 * page out of turn (pool.c, steal_ready) instead of zeroing
		 * one itself. Bursts back to back left it empty: on 2 MiB
		 * pages, 72 watches took this thread 21 ms, and the four
		 * owners that came meanwhile zeroed 0.29 ms each. */
		grew = false;
		if (!pool->trimming && now != last_grow) {
			last_grow = now;
			grew = sbi_grow_serve(pool);
			if (grew && pool->ready >= pool->ready_target)
				continue;
		}
		w = pick_work(pool, now >= no_back_until, grew, &h, &i, &n);
		if (w == W_NONE && grew)
			continue;	/* the next burst, not a wait */
		if (w == W_NONE) {
			/* Last, the first access to pages placed (touch.c). */
			if (!pool->trimming && sbi_touch_serve(pool))
				continue;
			ready_wait(pool, &seen, &polls);
			continue;
		}
		pthread_mutex_unlock(&pool->lock);
		if (w == W_PUNCH) {
			sbi_heap_punch(h, i, n, pool->page_size);
		} else if (make_ready(pool, w, h, i) < 0) {
			/* Out of memory: stop reserving for a while;
			 * allocations report the error themselves. What was
			 * written goes back (a dirty page that could not be
			 * overwritten is not zero either). */
			sbi_heap_punch(h, i, 1, pool->page_size);
			pthread_mutex_lock(&pool->lock);
			sbi_page_set_done(pool, h, i, SBI_PG_UNBACKED);
			no_back_until = sbi_mono_ms() + 1000;
			continue;
		}
		if (w == W_BACK && pool->hugetlb)	/* one to be had (alloc.c) */
			atomic_store_explicit(&pool->hugetlb_short, false,
					      memory_order_relaxed);
		pthread_mutex_lock(&pool->lock);
		for (uint32_t k = 0; k < n; k++)
			sbi_page_set_done(pool, h, i + k,
					  w == W_PUNCH ? SBI_PG_UNBACKED
						       : SBI_PG_READY);
	}
	pthread_mutex_unlock(&pool->lock);
	return NULL;
}
