/* SPDX-License-Identifier: MIT */
/*
 * The four modes of sbflash (runner.h): how the weights are reached, the
 * flash window, and what is counted.
 */
#include "runner.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "sbkernels.h"
#include "sparsebuf.h"

/* Memory the process will need beyond what it holds when the pool is
 * made (measured then: code, libraries, the resident weights): thread
 * stacks, the runtime's tables, the page cache of code in use, and room for
 * the kernel to reclaim in (a memory cgroup at its limit with nothing
 * reclaimable kills). Taken off the budget with the KV cache and the
 * kernel's share of the pool (below) before the pool gets the rest. It was
 * a fixed 96 MiB, then 32, that also stood for what is now counted, and
 * the pool then held fewer neurons than the kernel's page cache did for
 * mmap under the same budget (docs/flash.md). */
#define SLACK_BYTES ((uint64_t)12 << 20)

/* What the kernel charges to the budget per pool page: scattered pages are
 * a mapping each and one for the gap after (VMAs, their maple-tree nodes).
 * cgroup v1's kmem, less the page tables, over pool pages: 400 bytes a
 * page at 8 KiB and at 16 KiB (4.5 GiB model, 99,000 and 51,000 pages).
 * Page tables come on top: 8 bytes per 4 KiB of the FFN buffer and of the
 * pool's own mapping of its heaps (the FFN's pages are spread over all of
 * it). */
#define KERNEL_BYTES_PER_PAGE 448

/*
 * Keep the pool within vm.max_map_count: scattered pages are a mapping each
 * and one for the gap after (the kernel refuses a page-in's mmap past the
 * limit, and the touch of that page gets SIGBUS). A pool that would need
 * more mappings than the limit leaves gets fewer pages, said on stderr;
 * one with room for too few bundles is refused. *full_maps is the limit
 * that gives every page of the pool its two mappings: what each message
 * here and in fit_mappings asks for, so that following the advice once is
 * enough (asking for the least that passes the check at hand had a run
 * refused again at its first layer's reads). Returns 0 or -ENOMEM.
 */
#define MAP_MARGIN 1024	/* mappings left for the rest of the process */

static int fit_map_count(struct sb_pool_opts *po, uint64_t bundle,
			 uint64_t ffn_bytes, size_t *map_bytes,
			 size_t *full_maps)
{
	struct sb_features ft;
	size_t room, pages;

	*map_bytes = SIZE_MAX;
	*full_maps = 0;
	if (sb_features_get(&ft) < 0 || ft.max_map_count <= 0)
		return 0;
	room = ft.max_map_count > ft.map_count + MAP_MARGIN
		       ? (size_t)(ft.max_map_count - ft.map_count - MAP_MARGIN) / 2
		       : 0;
	*map_bytes = room * po->page_size;
	/* No more than the FFN section's pages, whatever the budget. */
	pages = (size_t)(ffn_bytes / po->page_size);
	if (po->max_bytes && po->max_bytes / po->page_size < pages)
		pages = po->max_bytes / po->page_size;
	*full_maps = (size_t)ft.map_count + MAP_MARGIN + 2 * pages;
	if (pages <= room)
		return 0;
	if ((uint64_t)room * po->page_size < 64 * bundle) {
		fprintf(stderr,
			"sbflash: vm.max_map_count=%ld leaves room for %zu "
			"pool pages, too few to run (each page is two mappings; "
			"raise it: sysctl vm.max_map_count=%zu)\n",
			ft.max_map_count, room, *full_maps);
		return -ENOMEM;
	}
	fprintf(stderr,
		"sbflash: vm.max_map_count=%ld: the pool gets %.1f MiB (%zu "
		"pages of two mappings each) instead of %.1f MiB; raise it "
		"for all of them: sysctl vm.max_map_count=%zu\n",
		ft.max_map_count, room * (double)po->page_size / 1048576.0, room,
		pages * (double)po->page_size / 1048576.0, *full_maps);
	po->max_bytes = room * po->page_size;
	return 0;
}

/* This process's resident bytes now (0 if unknown). */
static uint64_t rss_now(void)
{
	unsigned long pages_total, pages_res = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%lu %lu", &pages_total, &pages_res) != 2)
			pages_res = 0;
		fclose(f);
	}
	return (uint64_t)pages_res * (uint64_t)sysconf(_SC_PAGESIZE);
}

const char *sbf_mode_name(enum sbf_mode m)
{
	static const char *const n[] = {"resident", "flash", "mmap_dense",
					"mmap_sparse"};

	return (unsigned)m < 4 ? n[m] : "?";
}

/* CPU seconds of every thread of this process so far, user and system. */
static double cpu_s(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) < 0)
		return 0.0;
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void proc_faults(uint64_t *minflt, uint64_t *majflt)
{
	char buf[1024], *p;
	FILE *f = fopen("/proc/self/stat", "r");
	size_t n;

	*minflt = *majflt = 0;
	if (!f)
		return;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')'); /* the command may hold spaces */
	if (!p)
		return;
	/* After ")": state ppid pgrp session tty tpgid flags minflt cminflt
	 * majflt. */
	sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %lu %*u %lu",
	       (unsigned long *)minflt, (unsigned long *)majflt);
}

static uint64_t proc_field(const char *path, const char *key)
{
	char line[256];
	size_t kl = strlen(key);
	uint64_t v = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, kl)) {
			v = strtoull(line + kl, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/*
 * Touch each page of a copy, so that loading ends with the weights ready
 * to use. On a host that shadows the guest's page tables (PVM) a page the
 * kernel filled through read() still costs a trip to the hypervisor at its
 * first touch from user mode, about 6 us a 4 KiB (bench/pagecost, "first
 * touch after read()"): for the 1 GiB model's 417 MB resident section,
 * 0.3-0.5 s that otherwise fell in the first token timed and showed as
 * compute. Every mode that copies the resident section pays it before the
 * clock starts. Once everything is loaded, and the resident section last:
 * the FFN, read in after it, wrote new page tables into page directories
 * the section shares, and the hypervisor then dropped what it had built
 * for the section (bench/ptflood's write flooding), so touched first the
 * section cost as much again in the first token (resident mode: 15-17
 * tokens/s over 16 tokens before, 26-30 touched as read, 56-59 last).
 */
static void touch_pages(const void *p, size_t n)
{
	for (size_t i = 0; i < n; i += 4096)
		(void)*((const volatile char *)p + i);
	if (n)	/* the last page, when p is not page-aligned (malloc) */
		(void)*((const volatile char *)p + n - 1);
}

static int read_all(int fd, void *p, size_t n, uint64_t off)
{
	while (n) {
		ssize_t r = pread(fd, p, n > (1u << 30) ? (1u << 30) : n,
				  (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EIO;
		p = (char *)p + r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* ---- The flash window ---------------------------------------------------- */

struct flash {
	struct sb_buf *buf;
	struct sb_pool *pool;
	const struct sbf_header *h;
	int k;
	enum sbf_release release;
	int tok;		/* current token index */
	int32_t *last;		/* (layers, hidden): last token that used
				 * the neuron while we hold it; -1: not held */
	int32_t *fresh;		/* (hidden) scratch: neurons to read */
	uint8_t *uses;		/* (layers, hidden): tokens that used the
				 * neuron while held, saturating at 255 */
	uint32_t *age_count;	/* (AGE_BUCKETS) scratch: release_lru */
	struct sb_range *ranges;/* (hidden) */
	size_t nranges;		/* the reading layer's, for flash_ready */
	/* Split fetch: half is the bytes of an up row (= of a down column,
	 * = the pool's page), 0 for whole bundles; down (layers, hidden) says
	 * whether a held neuron's down column is held too. */
	size_t half;
	uint8_t *down;
	int32_t *fired;		/* (layers, hidden) split: the last token
				 * whose FFN the neuron fired in */
	uint64_t new_neurons, new_bytes, unmapped, prefetched, pool_peak;
	uint64_t shrunk;	/* times the window had to shrink */
	size_t held;		/* bytes of the up rows (or bundles) and down
				 * columns the window holds: placed, being
				 * read, or dropped by the pool meanwhile */
	int no_overlap;		/* wait for the reads before attention */
	double t_release, t_prefetch, t_wait; /* seconds in each */
	FILE *trace;		/* sbf_opts.trace */
	int trace_errno;	/* its first write error */
	size_t max_bytes;
	size_t map_bytes;	/* what vm.max_map_count leaves room for */
	size_t full_maps;	/* the limit that would leave room for all */
	size_t page_size;	/* the pool's */
	/* Ranges to unmap, gathered and released in one call (unmap_flush):
	 * a file buffer releases its pages a batch of runs at a time. */
	struct sb_range ur[512];
	size_t nur;
};

static size_t bundle_off(const struct flash *f, int l, int32_t i)
{
	return ((size_t)l * f->h->hidden + (size_t)i) * f->h->bundle;
}

/* Append [off, off+len) to the range list, merging with the previous range
 * when adjacent (one bigger read). */
static size_t add_range(struct flash *f, size_t nr, size_t off, size_t len)
{
	if (nr && f->ranges[nr - 1].off + f->ranges[nr - 1].len == off) {
		f->ranges[nr - 1].len += len;
		return nr;
	}
	f->ranges[nr].off = off;
	f->ranges[nr].len = len;
	return nr + 1;
}

/* Neuron i of layer l is no longer held (its bundle unmapped or left). */
static void forget(struct flash *f, int l, int32_t i)
{
	size_t g = (size_t)l * f->h->hidden + (size_t)i;

	if (f->last[g] >= 0)
		f->held -= f->half ? f->half : f->h->bundle;
	f->last[g] = -1;
	if (f->half && f->down[g]) {
		f->held -= f->half;
		f->down[g] = 0;
	}
}

/* Unmap the ranges gathered, counting the pages. */
static int unmap_flush(struct flash *f)
{
	long r = f->nur ? sb_buf_unmap_ranges(f->buf, f->ur, f->nur) : 0;

	f->nur = 0;
	if (r < 0)
		return (int)r;
	f->unmapped += (uint64_t)r;
	return 0;
}

/* Unmap [off, off+len) of the FFN buffer: gathered, merged with the range
 * before when adjacent; unmap_flush releases them. */
static int unmap_bytes(struct flash *f, size_t off, size_t len)
{
	struct sb_range *last = f->nur ? &f->ur[f->nur - 1] : NULL;

	if (last && last->off + last->len == off) {
		last->len += len;
		return 0;
	}
	if (f->nur == sizeof(f->ur) / sizeof(f->ur[0])) {
		int r = unmap_flush(f);

		if (r < 0)
			return r;
	}
	f->ur[f->nur++] = (struct sb_range){off, len};
	return 0;
}

/* Release, in runs, the bundles of layer l that none of the last k tokens
 * used. */
static int release_leavers(struct flash *f, int l, int k)
{
	int32_t *last = f->last + (size_t)l * f->h->hidden;
	int32_t H = (int32_t)f->h->hidden, old = f->tok - k;

	for (int32_t i = 0; i < H;) {
		int32_t j;
		long r;

		if (last[i] < 0 || last[i] > old) {
			i++;
			continue;
		}
		for (j = i; j < H && last[j] >= 0 && last[j] <= old; j++)
			forget(f, l, j);
		if (f->release != SBF_RELEASE_ADVISE) {
			int e = unmap_bytes(f, bundle_off(f, l, i),
					    (size_t)(j - i) * f->h->bundle);

			if (e < 0)
				return e;
			i = j;
			continue;
		}
		/* Keep the data, but let the pool's CLOCK hand drop these
		 * first when it needs room. */
		r = sb_buf_advise(f->buf,
				  ((size_t)l * f->h->hidden + (size_t)i) *
					  f->h->bundle,
				  (size_t)(j - i) * f->h->bundle, SB_ADVICE_COLD);
		if (r < 0)
			return (int)r;
		f->unmapped += (uint64_t)r;
		i = j;
	}
	return unmap_flush(f);
}

/*
 * Release held bundles of layer l, least valuable first, until at least
 * need bytes went (or nothing unused this token is left). Value is
 * recency, then frequency: a bundle unused for a tokens counts as unused
 * for a - 2 * floor(log2(uses)) tokens, so one that many tokens used
 * outlasts one used once at about the same time (the kernel's page cache
 * keeps twice-touched pages on its active list likewise). This spends the
 * whole budget on what was used lately and often, rather than releasing
 * every bundle older than k tokens at once. Returns 0 or -errno.
 */
#define AGE_BUCKETS 2048
#define DOWN_KEYS 1024	/* keys of down columns: [DOWN_KEYS, AGE_BUCKETS) */

static int lru_key(const struct flash *f, size_t g, int32_t last)
{
	int a = f->tok - last, u = f->uses[g], lg = 0;

	while (u > 1 && lg < 8) {
		u >>= 1;
		lg++;
	}
	a -= 2 * lg;
	if (a < 1)
		a = 1;
	return a < DOWN_KEYS ? a : DOWN_KEYS - 1;
}

/*
 * The key of a held down column (split fetch): tokens since its neuron
 * last fired, above every up row's key, so that down columns go first. An
 * up row is read again whenever its neuron is predicted, a down column
 * only when it also fires: with the predictor's precision at 0.46, a held
 * up row saves about twice the reads of a held down column (fewer when
 * neurons are predicted in streaks). Replaying one decode's trace of 16
 * tokens at the 1 GiB model's budget (170 MiB of pages) with
 * bench/flash_policy.py: LRU over both, which is what the kernel's page
 * cache does for mmap, 24.74 MiB read per token; down columns first,
 * 24.13 (docs/flash.md).
 */
static int down_key(const struct flash *f, int32_t fired)
{
	int a = f->tok - fired;

	if (a < 1)
		a = 1;
	return DOWN_KEYS + (a < AGE_BUCKETS - DOWN_KEYS ? a
						 : AGE_BUCKETS - DOWN_KEYS - 1);
}

static int release_lru(struct flash *f, int l, size_t need, bool done)
{
	size_t base = (size_t)l * f->h->hidden, freed = 0, want;
	int32_t *last = f->last + base, H = (int32_t)f->h->hidden;
	/* Split fetch: down columns age apart from their up rows, by when
	 * their neuron last fired (the FFN reads one only then): a neuron
	 * predicted often but firing rarely keeps its up row and loses its
	 * down column, as the kernel's page cache would. */
	const int32_t *fired = f->half ? f->fired + base : NULL;
	uint8_t *down = f->half ? f->down + base : NULL;
	size_t unit = f->half ? f->half : f->h->bundle;
	/* This token's neurons stay, unless layer l is done with them. */
	int32_t lim = f->tok + (done ? 1 : 0);
	int cut;

	if (!need)
		return 0;
	memset(f->age_count, 0, AGE_BUCKETS * sizeof(*f->age_count));
	for (int32_t i = 0; i < H; i++) {
		if (last[i] >= 0 && last[i] < lim)
			f->age_count[lru_key(f, base + (size_t)i, last[i])]++;
		if (down && down[i] && fired[i] < lim)
			f->age_count[down_key(f, fired[i])]++;
	}
	/* The smallest key whose pages and all older ones free enough. */
	want = (need + unit - 1) / unit;
	for (cut = AGE_BUCKETS - 1; cut > 1; cut--) {
		freed += f->age_count[cut];
		if (freed >= want)
			break;
	}
	/* What goes, gathered for one sb_buf_unmap_ranges. */
	for (int32_t i = 0; i < H; i++) {
		size_t off = bundle_off(f, l, i), len = 0;
		int r;

		if (last[i] >= 0 && last[i] < lim &&
		    lru_key(f, base + (size_t)i, last[i]) >= cut) {
			len = f->h->bundle;	/* a down column goes too */
			forget(f, l, i);
			f->uses[base + (size_t)i] = 0;
		} else if (down && down[i] && fired[i] < lim &&
			   down_key(f, fired[i]) >= cut) {
			off += f->half;
			len = f->half;
			down[i] = 0;
			f->held -= f->half;
		}
		/* (unmap_bytes merges neighbours: a down column and the
		 * next neuron's up row are) */
		if (len && (r = unmap_bytes(f, off, len)) < 0)
			return r;
	}
	return unmap_flush(f);
}

/* What the window holds, in bytes: its own count, or the pool's pages in
 * use if more (read-ahead). Not bytes_resident: that includes the zeroed
 * pages the pool keeps ready for growth (up to 12 MiB), which at the
 * budget go to page-ins like any freed page, so the window may count on
 * them. Nor the pool's pages alone: a page the pool dropped to make room
 * (the window's reads outran it) stays mapped until the window lets it go
 * (docs/design.md, eviction), one mapping each. Counting those keeps the
 * mappings within twice the pool's pages, which fit_map_count assumes. */
static size_t held_bytes(const struct flash *f, const struct sb_stats *st)
{
	size_t used = st->pages_used * f->page_size;

	return f->held > used ? f->held : used;
}

/* What the window may hold: the pool's budget less 1% (pages of a layer's
 * requests still being released when the next is made). */
static size_t fill_goal(const struct flash *f)
{
	return f->max_bytes / 100 * 99;
}

/*
 * The window's pages are a mapping or two each, those the pool dropped
 * included, until the window lets them go. While the window holds no more
 * pages than fit_map_count left room for at two mappings each, nothing is
 * checked. Past that, the process's mappings are counted before a layer's
 * reads of `bytes` in `units` runs, and compared with what the reads can
 * add at worst: a mapping a page and one more a run (a run of pages on
 * scattered heap pages between unplaced ones), and two for each page the
 * pool will have to drop to make room (marking a dropped page inside a
 * mapping splits it). While that would pass the limit less MAP_MARGIN / 2,
 * the other layers' least used pages go, round after round; if nothing is
 * left to let go, the run stops here with a message, where a read past
 * the limit would raise SIGBUS. Returns 0 or -ENOMEM.
 */
static long maps_over(const struct flash *f, size_t bytes, size_t units,
		      struct sb_features *ft)
{
	struct sb_stats st;
	size_t held, drops = 0;
	long need;

	if (sb_features_get(ft) < 0 || ft->max_map_count <= 0)
		return 0;
	sb_pool_stats(f->pool, &st);
	held = held_bytes(f, &st) + bytes;
	if (f->max_bytes != SIZE_MAX && held > f->max_bytes)
		drops = (held - f->max_bytes) / f->page_size + 1;
	need = (long)(bytes / f->page_size + units + 2 * drops);
	return ft->map_count + need - (ft->max_map_count - MAP_MARGIN / 2);
}

/* The d-th other layer to take pages from before layer l's reads
 * (1 <= d < layers): the one just done first, whose pages are wanted
 * again last (a token goes through the layers in order), and the next
 * layer last. */
static int other_layer(const struct flash *f, int l, int d)
{
	int L = (int)f->h->n_layers;

	return (l - d + L) % L;
}

static int fit_mappings(struct flash *f, int l, size_t bytes, size_t units)
{
	int L = (int)f->h->n_layers;
	struct sb_features ft;
	struct sb_stats st;
	long over;

	if (f->map_bytes == SIZE_MAX)
		return 0;
	sb_pool_stats(f->pool, &st);
	if (held_bytes(f, &st) + bytes <= f->map_bytes)
		return 0;
	while ((over = maps_over(f, bytes, units, &ft)) > 0) {
		size_t before = f->held;

		/* A page let go lowers the count by one at least. A layer
		 * before l is done with this token's neurons. */
		for (int d = 1; d < L && over > 0; d++) {
			int l2 = other_layer(f, l, d);
			int r = release_lru(f, l2, (size_t)over * f->page_size,
					    l2 < l);

			if (r < 0)
				return r;
			over = maps_over(f, bytes, units, &ft);
		}
		if (over <= 0)
			return 0;
		if (f->held == before)
			break;	/* nothing more to let go */
	}
	if (over <= 0)
		return 0;
	{
		/* What the reads may take, and what is left (none when the
		 * process is past the margin already). */
		long left = ft.max_map_count - MAP_MARGIN / 2 - ft.map_count;

		long want = ft.max_map_count + over;

		if ((size_t)want < f->full_maps)
			want = (long)f->full_maps;
		fprintf(stderr,
			"sbflash: layer %d reads %.1f MiB (%zu runs), which "
			"can take %ld more mappings; this process has %ld "
			"left under vm.max_map_count=%ld; raise it: sysctl "
			"vm.max_map_count=%ld\n",
			l, bytes / 1048576.0, units, over + left,
			left > 0 ? left : 0, ft.max_map_count, want);
	}
	return -ENOMEM;
}

/* Before bytes more are read for layer l: release what the policy says so
 * that the window stays within fill_goal. Returns 0 or -errno. */
static int make_room(struct flash *f, int l, size_t bytes, size_t units)
{
	int L = (int)f->h->n_layers;
	double t0 = now_s();

	if (f->release != SBF_RELEASE_NEVER) {
		struct sb_stats st;
		int over = 1;

		if (f->release == SBF_RELEASE_AUTO ||
		    f->release == SBF_RELEASE_ADVISE) {
			sb_pool_stats(f->pool, &st);
			if (st.bytes_resident > f->pool_peak)
				f->pool_peak = st.bytes_resident;
			over = held_bytes(f, &st) + bytes > fill_goal(f);
		}
		/* Auto: least recently and frequently used first, just
		 * enough to make room (the whole budget stays in use): this
		 * layer's down to the goal, then, when that is not enough
		 * (the first token, when all it holds is this token's), the
		 * other layers' down to the pool's budget, in the order their
		 * pages will be wanted again. Else the pool would drop pages
		 * the window counts on, which fault back in when touched and
		 * push out pages of layers still to come. */
		if (over && f->release == SBF_RELEASE_AUTO) {
			size_t goal = fill_goal(f),
			       have = held_bytes(f, &st) + bytes;
			int r = release_lru(f, l, have > goal ? have - goal : 0,
					    false);

			for (int d = 1; d < L && r == 0; d++) {
				int l2 = other_layer(f, l, d);

				sb_pool_stats(f->pool, &st);
				have = held_bytes(f, &st) + bytes;
				if (have <= f->max_bytes)
					break;
				r = release_lru(f, l2, have - f->max_bytes,
						l2 < l);
			}
			if (r < 0)
				return f->t_release += now_s() - t0, r;
			over = 0;
		}
		/* Under pressure the window shrinks (k, k - 1, ..., 1 tokens)
		 * rather than let the pool drop bundles still in use. */
		for (int kk = f->k; over && kk >= 1; kk--) {
			int r = release_leavers(f, l, kk);

			if (r < 0)
				return f->t_release += now_s() - t0, r;
			if (f->release != SBF_RELEASE_AUTO)
				break;
			sb_pool_stats(f->pool, &st);
			over = held_bytes(f, &st) + bytes > fill_goal(f);
			if (over && kk > 1)
				f->shrunk++;
		}
	}
	f->t_release += now_s() - t0;
	return fit_mappings(f, l, bytes, units);
}

/* One record of the trace (sbf_opts.trace): the neurons of idx[] whose
 * act[] is above 0, or all of them when act is NULL. 0, or -errno when a
 * write failed (a full disk: the run stops rather than leave a trace cut
 * short without saying so). */
static int trace_layer(struct flash *f, int kind, int l, const int32_t *idx,
		       const float *act, int n)
{
	int32_t hd[4] = {kind, f->tok, l, 0};
	bool ok;

	for (int j = 0; j < n; j++)
		hd[3] += !act || act[j] > 0.0f;
	errno = 0;
	ok = fwrite(hd, sizeof(hd[0]), 4, f->trace) == 4;
	for (int j = 0; j < n && ok; j++)
		if (!act || act[j] > 0.0f)
			ok = fwrite(&idx[j], sizeof(idx[j]), 1, f->trace) == 1;
	if (!ok && !f->trace_errno)
		f->trace_errno = errno ? errno : EIO;
	return ok ? 0 : -f->trace_errno;
}

/* Read the ranges and wait. A read that fails is this call's try: named
 * again, it is read once more (the library reads a failed page again for a
 * waited call); a second failure is the run's -EIO. */
static long read_wait(struct flash *f, size_t nr)
{
	long q = sb_buf_prefetch(f->buf, f->ranges, nr, SB_PREFETCH_WAIT);

	if (q == -EIO)
		q = sb_buf_prefetch(f->buf, f->ranges, nr, SB_PREFETCH_WAIT);
	return q;
}

static int flash_fetch(void *ctx, int l, const int32_t *idx, int n)
{
	struct flash *f = ctx;
	int32_t *last = f->last + (size_t)l * f->h->hidden;
	/* A fresh neuron's bundle, or with the split fetch its up row. */
	size_t nf = 0, nr = 0, unit = f->half ? f->half : f->h->bundle;
	double t1;
	long q;
	int r;

	if (f->trace && (r = trace_layer(f, 0, l, idx, NULL, n)) < 0)
		return r;
	for (int j = 0; j < n; j++) {
		uint8_t *u = &f->uses[(size_t)l * f->h->hidden + (size_t)idx[j]];

		if (last[idx[j]] < 0)
			f->fresh[nf++] = idx[j];
		else if (last[idx[j]] != f->tok)
			last[idx[j]] = f->tok;
		else
			continue;	/* named twice */
		if (*u < 255)
			(*u)++;
	}
	r = make_room(f, l, nf * unit, nf);
	if (r < 0)
		return r;
	t1 = now_s();
	f->held += nf * unit;
	for (size_t j = 0; j < nf; j++) {
		last[f->fresh[j]] = f->tok;
		nr = add_range(f, nr, bundle_off(f, l, f->fresh[j]), unit);
	}
	f->new_neurons += nf;
	f->new_bytes += nf * unit;
	f->nranges = f->no_overlap ? 0 : nr;
	if (!nr)
		return 0;
	/* One submission for the layer; attention runs while it reads. */
	q = f->no_overlap ? read_wait(f, nr)
			  : sb_buf_prefetch(f->buf, f->ranges, nr, 0);
	f->t_prefetch += now_s() - t1;
	if (q < 0)
		return (int)q;
	f->prefetched += (uint64_t)q;
	return 0;
}

/*
 * Split fetch, after attention: the down columns of the neurons that fire
 * (act > 0) and are not held yet, read now and waited for. The FFN reads
 * no other down column, so a predicted neuron that does not fire costs
 * only its up row: as with mmap, which reads 4 KiB pages as they are
 * touched. One more round trip to the disk per layer.
 */
static int flash_fired(void *ctx, int l, const int32_t *idx, const float *act,
		       int n)
{
	struct flash *f = ctx;
	uint8_t *down = f->down + (size_t)l * f->h->hidden;
	size_t nd = 0, nr = 0;
	double t0;
	long q;
	int r;

	if (f->trace && (r = trace_layer(f, 1, l, idx, act, n)) < 0)
		return r;
	for (int j = 0; j < n; j++) {
		if (act[j] <= 0.0f)
			continue;
		f->fired[(size_t)l * f->h->hidden + (size_t)idx[j]] = f->tok;
		if (!down[idx[j]]) {
			down[idx[j]] = 1;
			f->fresh[nd++] = idx[j];
		}
	}
	if (!nd)
		return 0;
	r = make_room(f, l, nd * f->half, nd);
	if (r < 0)
		return r;
	f->held += nd * f->half;
	for (size_t j = 0; j < nd; j++)
		nr = add_range(f, nr, bundle_off(f, l, f->fresh[j]) + f->half,
			       f->half);
	f->new_bytes += nd * f->half;
	t0 = now_s();
	q = read_wait(f, nr);
	f->t_wait += now_s() - t0;
	if (q < 0)
		return (int)q;
	f->prefetched += (uint64_t)q;
	return 0;
}

static int flash_ready(void *ctx, int l)
{
	struct flash *f = ctx;
	double t0 = now_s();
	long r;

	(void)l;
	/* Wait for this layer's reads (and anything queued before) so the
	 * kernel's threads touch placed pages, not in-flight ones. Its
	 * ranges named again: a read the advice above could not start (no
	 * page to be had at that moment) starts now, and a read of the
	 * advice's that failed is tried once more by the library (for a
	 * waited call, someone else's failed read is); failing again, the
	 * run stops with EIO where a touch would raise SIGBUS. Pages placed
	 * cost a look each. */
	r = sb_buf_prefetch(f->buf, f->ranges, f->nranges, SB_PREFETCH_WAIT);
	f->nranges = 0;
	f->t_wait += now_s() - t0;
	return r < 0 ? (int)r : 0;
}

/* ---- Running ------------------------------------------------------------- */

static uint64_t token_at(uint64_t seed, int t, uint32_t vocab)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + (uint64_t)t + 1;

	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return (x ^ (x >> 31)) % vocab;
}

static void bar(int done, int total, double t0)
{
	double el = now_s() - t0;

	fprintf(stderr, "\rsbflash: %d/%d tokens [%-30.*s] %.2f tok/s ", done,
		total, 30 * done / total, "##############################",
		el > 0 ? done / el : 0.0);
	if (done == total)
		fputc('\n', stderr);
}

int sbf_splits(const struct sbf_header *h, int whole_bundles)
{
	return !whole_bundles && !(h->bundle & (h->bundle - 1)) &&
	       h->bundle >= 8192;
}

int sbf_run(const struct sbf_opts *o, struct sbf_result *res)
{
	struct sbf_header h;
	struct sbf_model m = {0};
	struct sbf_run r = {0};
	struct flash fl = {0};
	struct sb_stats st0, st1;
	uint64_t mn0, mj0, mn1, mj1, io0 = 0, io1 = 0;
	float *resmem = NULL;
	char *ffnmem = NULL, *map = MAP_FAILED;
	const char *ffn, *why = NULL;
	int fd, err;
	double t0, c0;

	memset(res, 0, sizeof(*res));
	/* A regular file (a FIFO is refused, not waited on) whose header
	 * checks out, the whole layout within the file (a cut-short file
	 * would SIGBUS under mmap). */
	fd = sbf_open(o->path, &h, &why);
	if (fd < 0) {
		fprintf(stderr, "sbflash: %s: %s%s\n", o->path,
			fd == -ENODEV	? "not a regular file"
			: fd == -EBADMSG ? "not an sbflash checkpoint: "
					 : strerror(-fd),
			fd == -EBADMSG ? why : "");
		return fd;
	}
	res->h = h;
	if (o->steps <= 0 || o->k < 1) {
		close(fd);
		return -EINVAL;
	}
	/* mmap_sparse differs from flash only in how FFN bundles arrive:
	 * its resident section is read into memory too. mmap_dense is the
	 * naive way: everything through the mapping. */
	if (o->mode != SBF_MMAP_DENSE) {
		resmem = malloc(h.res_bytes);
		if (!resmem) {
			err = -ENOMEM;
			goto out;
		}
		err = read_all(fd, resmem, h.res_bytes, h.res_off);
		if (err < 0)
			goto out;
		/* The copy is what counts: the page cache it came through
		 * would otherwise stay charged to a memory cgroup's budget
		 * and be reclaimed page by page while the tokens run. */
		(void)posix_fadvise(fd, (off_t)h.res_off, (off_t)h.res_bytes,
				    POSIX_FADV_DONTNEED);
		err = sbf_model_bind(&m, &h, resmem);
		if (err < 0)
			goto out;
	}
	if (o->mode == SBF_MMAP_DENSE || o->mode == SBF_MMAP_SPARSE) {
		map = mmap(NULL, h.file_bytes, PROT_READ, MAP_SHARED, fd, 0);
		if (map == MAP_FAILED) {
			err = -errno;
			goto out;
		}
		if (o->mode == SBF_MMAP_DENSE) {
			err = sbf_model_bind(&m, &h,
					     (const float *)(map + h.res_off));
			if (err < 0)
				goto out;
		} else if (o->madv_random) {
			madvise(map + h.ffn_off, h.ffn_bytes, MADV_RANDOM);
		}
	}

	if (o->mode == SBF_RESIDENT) {
		ffnmem = malloc(h.ffn_bytes);
		if (!ffnmem) {
			err = -ENOMEM;
			goto out;
		}
		err = read_all(fd, ffnmem, h.ffn_bytes, h.ffn_off);
		if (err < 0)
			goto out;
		ffn = ffnmem;
	} else if (o->mode == SBF_FLASH) {
		struct sb_pool_opts po;
		uint64_t kv = (uint64_t)h.n_layers * o->steps * sbf_kv_dim(&h) *
			      8;
		uint64_t held = rss_now(),
			 fixed = (held > h.res_bytes ? held : h.res_bytes) +
				 kv + SLACK_BYTES;

		sb_pool_opts_init(&po);
		/* Split: an up row and a down column per page. */
		if (sbf_splits(&h, o->whole_bundles))
			fl.half = h.bundle / 2;
		po.page_size = fl.half ? fl.half
			       : (h.bundle & (h.bundle - 1)) ? 4096
							     : h.bundle;
		po.heap_size = (size_t)64 << 20;
		po.numa_node = -1;
		if (o->pool_bytes) {
			po.max_bytes = (size_t)o->pool_bytes & ~(po.page_size - 1);
		} else if (o->budget) {
			/* The pool's pages and the kernel's share of each:
			 * max (1 + 448 / page + 1 / 512) = room. */
			uint64_t taken = fixed + h.ffn_bytes / 512,
				 room = o->budget > taken ? o->budget - taken
							  : 0;

			po.max_bytes = (size_t)(room /
						(po.page_size +
						 KERNEL_BYTES_PER_PAGE +
						 po.page_size / 512) *
						po.page_size);
			if (po.max_bytes < 64 * (uint64_t)h.bundle) {
				fprintf(stderr,
					"sbflash: budget %.1f MiB leaves %.1f MiB "
					"for FFN pages, less than 64 bundles "
					"(%.1f MiB): the process holds %.1f MiB "
					"once the resident section is loaded, "
					"KV and slack take %.1f MiB, page tables "
					"%.1f MiB\n",
					o->budget / 1048576.0,
					po.max_bytes / 1048576.0,
					64.0 * h.bundle / 1048576.0,
					(fixed - kv - SLACK_BYTES) / 1048576.0,
					(kv + SLACK_BYTES) / 1048576.0,
					h.ffn_bytes / 512 / 1048576.0);
				err = -ENOMEM;
				goto out;
			}
		}
		err = fit_map_count(&po, (uint64_t)h.bundle, h.ffn_bytes,
				    &fl.map_bytes, &fl.full_maps);
		if (err < 0)
			goto out;
		fl.pool = sb_pool_create(&po, &err);
		if (!fl.pool) {
			fprintf(stderr, "sbflash: sb_pool_create: %s\n",
				strerror(-err));
			goto out;
		}
		fl.buf = sb_buf_open_file(fl.pool, o->path, h.ffn_off,
					  h.ffn_bytes, 0, &err);
		if (!fl.buf) {
			fprintf(stderr, "sbflash: sb_buf_open_file: %s\n",
				strerror(-err));
			goto out;
		}
		/* The window reads what it needs; a page faulted in (one the
		 * pool dropped) brings no neighbours, which would push out
		 * the next layers' pages (as MADV_RANDOM for mmap_sparse). */
		if (sb_buf_advise(fl.buf, 0, h.ffn_bytes, SB_ADVICE_RANDOM) <
		    0)
			fprintf(stderr, "sbflash: sb_buf_advise(RANDOM) "
					"failed: fault read-ahead stays on\n");
		fl.h = &m.h;
		fl.k = o->k;
		fl.release = o->release;
		fl.no_overlap = o->no_overlap;
		if (o->trace && !fl.half) {
			fprintf(stderr, "sbflash: --trace records the split "
					"fetch, which needs bundles of a power "
					"of two from 8 KiB (this model's are "
					"%u bytes)\n", h.bundle);
			err = -EINVAL;
			goto out;
		}
		fl.trace = o->trace;
		fl.max_bytes = po.max_bytes ? po.max_bytes : SIZE_MAX;
		fl.page_size = po.page_size;
		fl.last = malloc((size_t)h.n_layers * h.hidden * 4);
		fl.fresh = malloc((size_t)h.hidden * 4);
		fl.uses = calloc((size_t)h.n_layers * h.hidden, 1);
		fl.down = calloc((size_t)h.n_layers * h.hidden, 1);
		fl.fired = calloc((size_t)h.n_layers * h.hidden, 4);
		fl.age_count = malloc(AGE_BUCKETS * sizeof(*fl.age_count));
		fl.ranges = malloc((size_t)h.hidden * sizeof(*fl.ranges));
		if (!fl.last || !fl.fresh || !fl.ranges || !fl.uses || !fl.down ||
		    !fl.fired ||
		    !fl.age_count) {
			err = -ENOMEM;
			goto out;
		}
		memset(fl.last, 0xff, (size_t)h.n_layers * h.hidden * 4);
		res->pool_bytes = po.max_bytes;
		ffn = sb_buf_addr(fl.buf);
	} else {
		ffn = map + h.ffn_off;
	}

	/* Loading is done: the copies are touched now, the resident section
	 * last (touch_pages). */
	if (ffnmem)
		touch_pages(ffnmem, h.ffn_bytes);
	if (resmem)
		touch_pages(resmem, h.res_bytes);
	err = sbf_run_init(&r, &m, ffn, o->steps);
	if (err < 0)
		goto out;
	r.dense = o->mode == SBF_MMAP_DENSE;
	r.measure = o->measure && o->mode == SBF_RESIDENT;
	if (o->mode == SBF_FLASH)
		r.hooks = (struct sbf_hooks){flash_fetch, flash_ready,
					     fl.half ? flash_fired : NULL, &fl};

	if (fl.pool)
		sb_pool_stats(fl.pool, &st0);
	proc_faults(&mn0, &mj0);
	io0 = proc_field("/proc/self/io", "read_bytes: ");
	c0 = cpu_s();
	t0 = now_s();
	for (int t = 0; t < o->steps; t++) {
		fl.tok = t;
		err = sbf_step(&r, (int)token_at(o->seed, t, h.vocab), t);
		if (err < 0) {
			fprintf(stderr, "sbflash: step %d: %s%s\n", t,
				o->mode == SBF_FLASH && err == -EIO &&
						!fl.trace_errno
					? "reading FFN weights: "
					: "",
				strerror(-err));
			if (fl.pool) {
				sb_pool_stats(fl.pool, &st1);
				res->io_errors = st1.io_errors - st0.io_errors;
			}
			goto out;
		}
		if (o->on_logits)
			o->on_logits(o->ctx, t, r.logits, (int)h.vocab);
		if (o->progress)
			bar(t + 1, o->steps, t0);
	}
	res->seconds = now_s() - t0;
	res->cpu_seconds = cpu_s() - c0;
	io1 = proc_field("/proc/self/io", "read_bytes: ");
	proc_faults(&mn1, &mj1);
	res->tokens_per_s = o->steps / res->seconds;
	res->minflt = mn1 - mn0;
	res->majflt = mj1 - mj0;
	res->computed = r.n_computed;
	res->nonzero = r.n_nonzero;
	res->n_true = r.n_true;
	res->n_true_pred = r.n_true_pred;
	if (fl.pool) {
		sb_pool_stats(fl.pool, &st1);
		res->bytes_read = st1.bytes_read - st0.bytes_read;
		res->faults = st1.faults - st0.faults;
		res->dropped = st1.pages_dropped - st0.pages_dropped;
		res->io_errors = st1.io_errors - st0.io_errors;
		res->new_neurons = fl.new_neurons;
		res->new_bytes = fl.new_bytes;
		res->split = fl.half != 0;
		res->unmapped = fl.unmapped;
		res->prefetched = fl.prefetched;
		res->shrunk = fl.shrunk;
		res->t_release = fl.t_release;
		res->t_prefetch = fl.t_prefetch;
		res->t_wait = fl.t_wait;
		res->pool_peak = fl.pool_peak > st1.bytes_resident
					 ? fl.pool_peak
					 : st1.bytes_resident;
	} else {
		res->bytes_read = io1 - io0;
		res->faults = res->minflt + res->majflt;
	}
	res->peak_rss = proc_field("/proc/self/status", "VmHWM:") * 1024;
out:
	res->trace_errno = fl.trace_errno;
	sbf_run_free(&r);
	sb_buf_destroy(fl.buf);
	sb_pool_destroy(fl.pool);
	free(fl.last), free(fl.fresh), free(fl.ranges);
	free(fl.uses), free(fl.down), free(fl.fired), free(fl.age_count);
	if (map != MAP_FAILED)
		munmap(map, h.file_bytes);
	free(resmem);
	free(ffnmem);
	sbf_model_free(&m);
	close(fd);
	return err;
}
