/*
 * Chaos with a content checker. Worker threads map, unmap, share
 * (copy-on-write), evict, prefetch, advise, save and restore, destroy and
 * recreate buffers, and read and write random pages, all at once, while a
 * signaller thread interrupts them with SIGUSR1 every few microseconds
 * (a thread waiting on a userfault or in a system call of the library is
 * interrupted and must retry, never fail or lose a write) and a forker
 * thread fork()s now and then (the child must see none of the buffers:
 * nothing mapped in their ranges, a touch raises SIGSEGV, calls return
 * -ECHILD; the parent carries on unaffected).
 *
 * Every page is NSEG segments; each segment holds the words of a seed that
 * names (buffer, page, version), or zeros. The test keeps a model of what
 * each segment must hold and checks every byte of a page on every read:
 * zeros after unmap, the source's contents after a share until written
 * (a partial write to a shared page must keep the other segments: the
 * copy), the last written version after eviction, page-in, save and
 * restore. Operations that change what a page holds (writes, unmap, the
 * destination and source of a share, save) take the test's per-page locks;
 * those that must not change it (map, evict, prefetch, advise, trim) take
 * none and race the writers and readers of the same pages, as the API
 * allows. So a mismatch is a bug of the library, never a race of the test.
 *
 * Configurations (each a child process, run with both pagers):
 *   plain:    no budget. No SIGBUS or SIGSEGV may happen at all.
 *   budget:   a budget a quarter of the working set, every buffer
 *             SB_BUF_EVICTABLE, shared pages bounded far below the budget:
 *             automatic eviction always has a candidate, so a SIGBUS (or
 *             -ENOMEM from sb_buf_map) is a bug. Fails before the fix of
 *             issue 10 defect 5 (SIGBUS while evictable pages exist).
 *   saveover: plain, but a buffer restored from a save file is saved back
 *             to that same file (continue a KV cache, save it again).
 *             Fails before the fix of issue 10 defect 1 (the save truncates
 *             its own source: -EIO, then SIGBUS on the unread pages).
 *
 * A file-backed buffer (sb_buf_open_file) takes part too: its pages read
 * as the file, unmap and eviction drop them, a write raises SIGSEGV, and
 * it can be a share's source. Every op in 16 drops page-table entries
 * (MADV_PAGEOUT, what reclaim does; MADV_DONTNEED): contents unchanged.
 * The fork()ed child also builds and uses a pool of its own.
 *
 * Before the configurations, the reductions of what this test found, each
 * a child of its own: map-count (sb_buf_map counts a page twice when an
 * unmap races it), orphan-share (pages shared and then let go by their
 * source are never evicted again: SIGBUS), evict-race (an allocation at
 * the budget gives up when another thread's eviction frees a page
 * meanwhile: SIGBUS, issue 10 defect 5), share-stall (a share marks its
 * source unevictable, then waits for the destination's lock, held by a
 * fault whose only eviction candidates are in the source: a 10 s stall,
 * then SIGBUS), fork-map (an eviction that maps a page in place from
 * sb_buf_map's page-in, without the layout lock, races fork(): the child
 * inherits the parent's page).
 *
 * At quiescent points (every 250 ms: workers parked) the pool's own
 * consistency check (sbi_pool_verify), its counters against the budget
 * and every byte of every page are checked. SB_CHAOS_SECONDS (default 2)
 * sets the time per run, SB_CHAOS_CONFIG one configuration, SB_CHAOS_SEED
 * the seed (printed by each run).
 */
#include "harness.h"
#include "harness_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)
#define NSEG 4
#define SEGW (PAGE / NSEG / 8)	/* words per segment */
#define NBUF 4		/* writable buffers */
#define FILEBUF NBUF	/* and a file-backed one (sb_buf_open_file) */
#define NALL (NBUF + 1)
#define NPAGES 48
#define BUFLEN (NPAGES * PAGE)
#define NWORKERS 4
#define HIST 4
/* Sharing: sources are pages [0, SHARE_SRC) of buffer 0 (or of buffer 1
 * itself), destinations pages [0, SHARE_DST) of buffer 1. A pool page
 * that is shared has a holder among those SHARE_DST pages, so at most
 * SHARE_DST pool pages are shared (never evicted automatically) at once. */
#define SHARE_SRC 8
#define SHARE_DST 8
#define BUDGET_PAGES (NBUF * NPAGES / 6)	/* 32 pages, 2 MiB */
#define MAXRUN 4	/* pages per map, unmap, evict, ... */

enum {
	C_BUDGET = 1 << 0,
	C_SAVE_OVER = 1 << 1,
};

struct model {
	uint64_t seg[NSEG];		/* seed of each segment, 0: zeros */
	uint64_t hist[NSEG][HIST];	/* earlier seeds, for the report */
};

struct pg {
	pthread_mutex_t lock;
	struct model m;
};

struct cbuf {
	pthread_rwlock_t life;	/* read: using b; write: replacing it */
	struct sb_buf *b;
	char *x;
	char file[512];		/* the save file it was restored from */
	int gen;		/* save file generation */
	struct pg pg[NPAGES];
};

static struct sb_pool *pool;
static struct cbuf bufs[NALL];
static unsigned config;
static double run_seconds;
/* Workers hold it for reading; the quiescent checks for writing (writers
 * preferred, or the workers' overlapping batches would starve them). */
static pthread_rwlock_t world;
static atomic_bool stop_all;
static _Atomic uint64_t version;
static char save_dir[512];
static char weights[600];	/* the file behind FILEBUF */

static _Atomic long n_ops[17], n_sigbus, n_sigsegv, n_forks, n_usr1,
	n_share_eagain;
static const char *const op_names[17] = {
	"write",    "write-part", "read",  "map",	"unmap",
	"evict",    "prefetch",	  "advise", "share",	"save",
	"reincarn", "recreate",	  "trim",   "placed",	"grow",
	"reclaim",  "ro-write",
};

static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

/* Report and end the child at once: other threads are still running, so
 * no exit handlers (the library's destructors would race them). */
#define CFAIL(...)                                                           \
	do {                                                                 \
		pthread_mutex_lock(&fail_lock);                              \
		fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);              \
		fprintf(stderr, __VA_ARGS__);                                \
		fprintf(stderr, "\n");                                       \
		fflush(stderr);                                              \
		fflush(stdout);                                              \
		_exit(1);                                                    \
	} while (0)

/* A wrong result that corrupts nothing the model checks (a count): say
 * so, carry on to find more, fail at the end. */
static _Atomic long n_late;

#define late_fail(...)                                                       \
	do {                                                                 \
		if (atomic_fetch_add(&n_late, 1) < 5) {                      \
			pthread_mutex_lock(&fail_lock);                      \
			fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);      \
			fprintf(stderr, __VA_ARGS__);                        \
			fprintf(stderr, "\n");                               \
			pthread_mutex_unlock(&fail_lock);                    \
		}                                                            \
	} while (0)

#define CCHECK(cond)                                                         \
	do {                                                                 \
		if (!(cond))                                                 \
			CFAIL("CHECK failed: %s", #cond);                    \
	} while (0)

static unsigned buf_flags(void)
{
	return config & C_BUDGET ? SB_BUF_EVICTABLE : 0;
}

static uint64_t rnd64(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static size_t rnd(uint64_t *s, size_t n)
{
	return (size_t)(rnd64(s) % n);
}

/* A seed no other write has used: buffer, page and a global version. */
static uint64_t new_seed(int b, size_t p)
{
	return ((uint64_t)(b + 1) << 56) | ((uint64_t)p << 44) |
	       (atomic_fetch_add(&version, 1) + 1);
}

/* What page p of the file behind FILEBUF holds, every segment. */
static uint64_t file_seed(size_t p)
{
	return ((uint64_t)(FILEBUF + 1) << 56) | ((uint64_t)p << 44) | 1;
}

static void set_seg(struct model *m, int s, uint64_t seed)
{
	memmove(&m->hist[s][1], &m->hist[s][0],
		(HIST - 1) * sizeof(m->hist[s][0]));
	m->hist[s][0] = m->seg[s];
	m->seg[s] = seed;
}

/* The page now holds what `to` says (a share, a restore): segments that
 * change keep their history. */
static void set_model(struct model *m, const struct model *to)
{
	for (int s = 0; s < NSEG; s++)
		if (m->seg[s] != to->seg[s])
			set_seg(m, s, to->seg[s]);
}

static uint64_t word_of(uint64_t seed, size_t w)
{
	return seed ? disk_word(seed, w) : 0;
}

/* ---- guarded accesses: SIGBUS/SIGSEGV in the page being touched --------- */

static __thread sigjmp_buf g_jmp;
static __thread volatile int g_armed;
static __thread volatile uintptr_t g_lo, g_hi, g_addr;
static __thread volatile int g_sig;

static void say(const char *s)
{
	ssize_t r = write(2, s, strlen(s));

	(void)r;
}

static void on_fault(int sig, siginfo_t *si, void *ctx)
{
	uintptr_t a = (uintptr_t)si->si_addr;

	(void)ctx;
	if (!g_armed || a < g_lo || a >= g_hi) {
		say(sig == SIGBUS ? "chaos: SIGBUS outside a guarded access\n"
				  : "chaos: SIGSEGV outside a guarded access\n");
		_exit(sig == SIGBUS ? 50 : 51);
	}
	g_sig = sig;
	g_addr = a;
	g_armed = 0;
	siglongjmp(g_jmp, 1);
}

static void on_usr1(int sig)
{
	(void)sig;
}

/*
 * What a wrong segment holds instead: zeros, an earlier version of this
 * segment, or something else; how much of it is wrong.
 */
static void explain(const char *what_page, int s, const uint64_t *w,
		    size_t first, const struct model *m)
{
	size_t nbad = 0, run = 0;
	const char *what = "unknown data";
	char hbuf[80] = "";

	for (size_t k = 0; k < SEGW; k++)
		nbad += w[k] != word_of(m->seg[s], (size_t)s * SEGW + k);
	while (first + run < SEGW &&
	       w[first + run] !=
		       word_of(m->seg[s], (size_t)s * SEGW + first + run))
		run++;
	if (w[first] == 0)
		what = "zeros";
	for (int h = 0; h < HIST; h++)
		if (m->hist[s][h] &&
		    w[first] == word_of(m->hist[s][h], (size_t)s * SEGW + first)) {
			snprintf(hbuf, sizeof(hbuf),
				 "what it held %d change(s) before (seed "
				 "%#llx)",
				 h + 1, (unsigned long long)m->hist[s][h]);
			what = hbuf;
			break;
		}
	fprintf(stderr,
		"%s segment %d: want seed %#llx, word %zu holds %#llx: %zu of "
		"%d words wrong, the first run %zu words, holding %s%s\n",
		what_page, s, (unsigned long long)m->seg[s],
		(size_t)s * SEGW + first, (unsigned long long)w[first], nbad,
		(int)SEGW, run, what,
		run == 0 ? " (it changed under the reader)" : "");
}

/* The first segment of the page at x that differs from the model, or -1;
 * with `what_page`, the difference is explained on stderr. */
static int check_page(const char *x, const struct model *m,
		      const char *what_page)
{
	const volatile uint64_t *w = (const volatile uint64_t *)x;

	for (int s = 0; s < NSEG; s++)
		for (size_t k = 0; k < SEGW; k++) {
			size_t i = (size_t)s * SEGW + k;

			if (w[i] == word_of(m->seg[s], i))
				continue;
			if (what_page) {
				uint64_t copy[SEGW];

				for (size_t j = 0; j < SEGW; j++)
					copy[j] = w[(size_t)s * SEGW + j];
				explain(what_page, s, copy, k, m);
			}
			return s;
		}
	return -1;
}

static void fill_seg(char *x, int s, uint64_t seed)
{
	volatile uint64_t *w = (volatile uint64_t *)x;

	for (size_t k = 0; k < SEGW; k++)
		w[(size_t)s * SEGW + k] = word_of(seed, (size_t)s * SEGW + k);
}

/*
 * Run an access to the page at x (page p of sbuf) under the guard. A
 * SIGBUS or SIGSEGV in the page is counted and reported; the page is then
 * placed with sb_buf_map (which also clears a poisoned page) and the
 * access is done again. The caller holds the page's lock, so redoing it
 * is what the model expects. Every such signal fails the run at its end.
 */
#define GUARDED(sbuf, x, what, stmt)                                         \
	do {                                                                 \
		volatile int tries_ = 0;                                     \
		g_lo = (uintptr_t)(x);                                       \
		g_hi = g_lo + PAGE;                                          \
		while (sigsetjmp(g_jmp, 1) != 0) {                           \
			long r_;                                             \
			if (g_sig == SIGBUS)                                 \
				atomic_fetch_add(&n_sigbus, 1);              \
			else                                                 \
				atomic_fetch_add(&n_sigsegv, 1);             \
			fprintf(stderr, "%s at byte %zu of %s\n",            \
				g_sig == SIGBUS ? "SIGBUS" : "SIGSEGV",      \
				(size_t)(g_addr - g_lo), (what));            \
			if (++tries_ > 20)                                   \
				CFAIL("%s: a signal on each of 20 tries, "   \
				      "sb_buf_map between them (the first "   \
				      "one is the bug)",                      \
				      (what));                                \
			r_ = sb_buf_map((sbuf),                              \
					g_lo - (uintptr_t)sb_buf_addr(sbuf), \
					PAGE);                               \
			if (r_ < 0)                                          \
				fprintf(stderr, "sb_buf_map after it: %s\n", \
					strerror((int)-r_));                 \
			usleep(1000);                                        \
		}                                                            \
		g_armed = 1;                                                 \
		stmt;                                                        \
		g_armed = 0;                                                 \
	} while (0)

/* The two accesses, each in a frame of its own (nothing the jump could
 * clobber): check the page at x against m, and write `seed` into the
 * segments of mask. */
static int guarded_check(struct sb_buf *sbuf, char *x, const struct model *m,
			 const char *what)
{
	volatile int bad = -1;

	GUARDED(sbuf, x, what, bad = check_page(x, m, NULL));
	return bad;
}

static void guarded_fill(struct sb_buf *sbuf, char *x, unsigned mask,
			 uint64_t seed, const char *what)
{
	GUARDED(sbuf, x, what, {
		for (int s = 0; s < NSEG; s++)
			if (mask >> s & 1)
				fill_seg(x, s, seed);
	});
}

/* Page frame pfn (root: /proc/kpage*): its map count and flags, and for a
 * part of a larger folio its head and size (a large folio in a clean home
 * was how a zero page got there: docs/design.md, "Heap folios"); then
 * every mapping of a memfd, in every process, that maps it (up to 1 GiB
 * of each mapping looked at). */
static void who_maps(uint64_t pfn)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int kc = open("/proc/kpagecount", O_RDONLY | O_CLOEXEC);
	int kf = open("/proc/kpageflags", O_RDONLY | O_CLOEXEC);
	uint64_t cnt = 0, fl = 0;

	if (kc >= 0 && pread(kc, &cnt, 8, (off_t)(pfn * 8)) == 8 && kf >= 0 &&
	    pread(kf, &fl, 8, (off_t)(pfn * 8)) == 8)
		fprintf(stderr, "  pfn %#llx: mapcount %llu, flags %#llx\n",
			(unsigned long long)pfn, (unsigned long long)cnt,
			(unsigned long long)fl);
	if (kf >= 0 && (fl >> 16 & 1)) {
		uint64_t h = pfn, hf = 0, n = 1, tf = 0;

		while (h > 0 && pread(kf, &hf, 8, (off_t)(h * 8)) == 8 &&
		       !(hf >> 15 & 1) && pfn - h < 4096)
			h--;
		while (pread(kf, &tf, 8, (off_t)((h + n) * 8)) == 8 &&
		       (tf >> 16 & 1) && n < 8192)
			n++;
		fprintf(stderr, "  head pfn %#llx flags %#llx, %llu pages\n",
			(unsigned long long)h, (unsigned long long)hf,
			(unsigned long long)n);
	}
	if (kc >= 0)
		close(kc);
	if (kf >= 0)
		close(kf);
	while (d && (de = readdir(d))) {
		char path[300], line[512];
		FILE *f;
		int pm;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/maps", de->d_name);
		f = fopen(path, "r");
		snprintf(path, sizeof(path), "/proc/%s/pagemap", de->d_name);
		pm = open(path, O_RDONLY | O_CLOEXEC);
		while (f && pm >= 0 && fgets(line, sizeof(line), f)) {
			unsigned long lo, hi;

			if (!strstr(line, "memfd:") ||
			    sscanf(line, "%lx-%lx", &lo, &hi) != 2)
				continue;
			if (hi - lo > (1ul << 30))
				hi = lo + (1ul << 30);
			for (unsigned long a = lo; a < hi; a += 4096) {
				uint64_t e = 0;

				if (pread(pm, &e, 8, (off_t)(a / 4096 * 8)) == 8 &&
				    (e >> 63 & 1) &&
				    (e & ((1ull << 55) - 1)) == pfn) {
					char comm[64] = "?";
					char cp[300];
					FILE *c;

					snprintf(cp, sizeof(cp), "/proc/%s/comm",
						 de->d_name);
					c = fopen(cp, "r");
					if (c) {
						if (!fgets(comm, sizeof(comm), c))
							comm[0] = 0;
						fclose(c);
					}
					comm[strcspn(comm, "\n")] = 0;
					fprintf(stderr,
						"  mapped by pid %s (%s) at %#lx "
						"in %s",
						de->d_name, comm, a, line);
				}
			}
		}
		if (f)
			fclose(f);
		if (pm >= 0)
			close(pm);
	}
	if (d)
		closedir(d);
}

/*
 * A page found wrong, described for whoever reads the log (CI's failures
 * happen once in hundreds of runs): every segment, whether the library
 * says the page is placed, whether it is still wrong 50 ms later (a window
 * that closed, or data lost), and for the file-backed buffer whether the
 * file itself still holds the page (a write or punch that went to the
 * wrong descriptor). Under the page's lock: nothing of the test changes it.
 */
static void diagnose(struct sb_buf *sbuf, char *x, const struct model *m,
		     const char *what)
{
	size_t off = (size_t)(x - (char *)sb_buf_addr(sbuf));
	bool file = sbuf == bufs[FILEBUF].b;

	for (int s = 0; s < NSEG; s++) {
		const volatile uint64_t *w =
			(const volatile uint64_t *)x + (size_t)s * SEGW;
		size_t right = 0, zeros = 0;

		for (size_t k = 0; k < SEGW; k++) {
			right += w[k] == word_of(m->seg[s], (size_t)s * SEGW + k);
			zeros += w[k] == 0;
		}
		fprintf(stderr, "  segment %d: %zu of %d words right, %zu zero\n",
			s, right, (int)SEGW, zeros);
	}
	fprintf(stderr, "  sb_buf_placed says %ld page(s) placed there\n",
		sb_buf_placed(sbuf, off, PAGE));
	{
		/* The library's entry, the kernel's mapping there and its
		 * first 4 KiB's page-table entry, the pool's uffd. */
		uintptr_t a = (uintptr_t)x;
		char line[512], link[128], fdp[64];
		FILE *f = fopen("/proc/self/maps", "r");
		uint64_t e = 0;
		int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		ssize_t n;

		bool in = false;

		pthread_mutex_lock(&sbuf->lock);
		for (size_t i = off / PAGE ? off / PAGE - 1 : 0;
		     i <= off / PAGE + 1 && i < sbuf->npages; i++)
			fprintf(stderr, "  entry of page %zu: %#llx\n", i,
				(unsigned long long)sbuf->pte[i]);
		{
			uint64_t pte = sbuf->pte[off / PAGE];
			uint32_t v = (uint32_t)(pte & SBI_PTE_PID);

			pthread_mutex_unlock(&sbuf->lock);
			if (v) {
				sbi_pid k = v - 1;
				struct sbi_heap *h;
				uint32_t i;

				pthread_mutex_lock(&pool->lock);
				h = sbi_pid_heap(pool, k);
				i = sbi_pid_index(pool, k);
				fprintf(stderr,
					"  pool page %u: state %u refs %u owner "
					"%u; home %s, lost %d, clean %d\n",
					k, h->state[i], h->refs[i], h->owner[i],
					sbuf->home ? "yes" : "no",
					sbuf->home_lost
						? (int)(sbuf->home_lost[off / PAGE / 64] >>
							(off / PAGE % 64) & 1)
						: -1,
					(int)sbuf->home_clean);
				/* What the heap's file holds there. */
				{
					int hfd = h->fd;
					off_t ho = sbi_pid_off(pool, k);
					off_t sd = lseek(hfd, ho, SEEK_DATA);
					static uint64_t hb[PAGE / 8];
					ssize_t got = pread(hfd, hb, PAGE, ho);
					size_t nz = 0;

					for (size_t w = 0;
					     got == PAGE && w < PAGE / 8; w++)
						nz += hb[w] != 0;
					fprintf(stderr,
						"  heap fd %d at %#llx: SEEK_DATA "
						"%lld, pread %zd, %zu nonzero "
						"words\n",
						hfd, (unsigned long long)ho,
						(long long)sd, got, nz);
				}
				pthread_mutex_unlock(&pool->lock);
			}
		}
		if (f)
			fclose(f);
		/* smaps: the mapping and its VmFlags (um: registered for
		 * missing faults, ui: minor, uw: write-protect). */
		f = fopen("/proc/self/smaps", "r");
		while (f && fgets(line, sizeof(line), f)) {
			unsigned long lo, hi;
			bool head = sscanf(line, "%lx-%lx ", &lo, &hi) == 2;

			if (head)
				in = lo < a + PAGE && a < hi;
			if (in && (head || !strncmp(line, "VmFlags", 7) ||
				   !strncmp(line, "Rss", 3)))
				fprintf(stderr, "  smaps: %s", line);
		}
		if (f)
			fclose(f);
		if (pm >= 0 && pread(pm, &e, 8, (off_t)(a / 4096 * 8)) == 8)
			fprintf(stderr,
				"  pagemap: present %d, file/shared %d, "
				"exclusive %d, uffd-wp %d, pfn %#llx\n",
				(int)(e >> 63 & 1), (int)(e >> 61 & 1),
				(int)(e >> 56 & 1), (int)(e >> 57 & 1),
				(unsigned long long)(e & ((1ull << 55) - 1)));
		if (pm >= 0)
			close(pm);
		if (e >> 63 & 1)
			who_maps(e & ((1ull << 55) - 1));
		snprintf(fdp, sizeof(fdp), "/proc/self/fd/%d", pool->uffd);
		n = readlink(fdp, link, sizeof(link) - 1);
		link[n > 0 ? n : 0] = 0;
		fprintf(stderr, "  the pool's uffd (%d): %s\n", pool->uffd,
			link);
	}
	if (file) {
		char *page = malloc(PAGE);
		int fd = open(weights, O_RDONLY | O_CLOEXEC);
		struct model fm = {0};

		for (int s = 0; s < NSEG; s++)
			fm.seg[s] = file_seed(off / PAGE);
		if (fd < 0 || !page ||
		    pread(fd, page, PAGE, (off_t)off) != (ssize_t)PAGE)
			fprintf(stderr, "  the file: unreadable (%s)\n",
				strerror(errno));
		else
			fprintf(stderr, "  the file: %s\n",
				check_page(page, &fm, NULL) < 0
					? "holds the page as written"
					: "does NOT hold the page any more");
		if (fd >= 0)
			close(fd);
		free(page);
	}
	usleep(50000);
	fprintf(stderr, "  50 ms later the page is %s\n",
		guarded_check(sbuf, x, m, what) < 0 ? "right (a window)"
						    : "still wrong");
}

/* Check the page at x (of sbuf) against m; fail with `why` if it differs. */
static void check_or_fail(struct sb_buf *sbuf, char *x, const struct model *m,
			  const char *what, const char *why)
{
	if (guarded_check(sbuf, x, m, what) >= 0) {
		check_page(x, m, what);
		diagnose(sbuf, x, m, what);
		CFAIL("%s: %s", what, why);
	}
}

static char *page_name(char *s, size_t len, int b, size_t p)
{
	snprintf(s, len, "buffer %d page %zu", b, p);
	return s;
}

/* A write into the file-backed buffer: SIGSEGV (the range is read-only),
 * and the page unchanged. */
static void op_ro_write(struct cbuf *cb, size_t p)
{
	char *x = cb->x + p * PAGE, what[64];

	page_name(what, sizeof(what), FILEBUF, p);
	pthread_mutex_lock(&cb->pg[p].lock);
	g_lo = (uintptr_t)x;
	g_hi = g_lo + PAGE;
	g_sig = 0;
	if (sigsetjmp(g_jmp, 1) == 0) {
		g_armed = 1;
		((volatile uint64_t *)x)[1] = 0x5eadbeef;
		g_armed = 0;
	}
	if (g_sig != SIGSEGV)
		CFAIL("a write into the file-backed %s: %s", what,
		      g_sig ? "SIGBUS" : "went through");
	check_or_fail(cb->b, x, &cb->pg[p].m, what,
		      "changed by a write that raised SIGSEGV");
	pthread_mutex_unlock(&cb->pg[p].lock);
}

/* ---- the operations ------------------------------------------------------- */

static void lock_pages(struct cbuf *cb, size_t p, size_t n)
{
	for (size_t i = p; i < p + n; i++)
		pthread_mutex_lock(&cb->pg[i].lock);
}

static void unlock_pages(struct cbuf *cb, size_t p, size_t n)
{
	for (size_t i = p; i < p + n; i++)
		pthread_mutex_unlock(&cb->pg[i].lock);
}

static void op_write(struct cbuf *cb, int b, size_t p, uint64_t *rs,
		     bool partial)
{
	struct model *m = &cb->pg[p].m;
	unsigned mask = partial ? (unsigned)(1 + rnd(rs, (1 << NSEG) - 2))
				: (1u << NSEG) - 1;
	uint64_t seed = new_seed(b, p);
	char *x = cb->x + p * PAGE, what[64];

	page_name(what, sizeof(what), b, p);
	pthread_mutex_lock(&cb->pg[p].lock);
	guarded_fill(cb->b, x, mask, seed, what);
	for (int s = 0; s < NSEG; s++)
		if (mask >> s & 1)
			set_seg(m, s, seed);
	/* Read back at once: the segments not written must be what they
	 * were (a copy-on-write copies them), the others what was written. */
	check_or_fail(cb->b, x, m, what, "wrong right after a write");
	pthread_mutex_unlock(&cb->pg[p].lock);
}

static void op_read(struct cbuf *cb, int b, size_t p)
{
	char what[64];

	page_name(what, sizeof(what), b, p);
	pthread_mutex_lock(&cb->pg[p].lock);
	check_or_fail(cb->b, cb->x + p * PAGE, &cb->pg[p].m, what,
		      "wrong contents on a read");
	pthread_mutex_unlock(&cb->pg[p].lock);
}

static void expect_ok(long r, const char *what, int b, size_t p, size_t n)
{
	if (r < 0)
		CFAIL("%s(buffer %d, pages %zu..%zu): %s%s", what, b, p, p + n - 1,
		      strerror((int)-r),
		      r == -ENOMEM && (config & C_BUDGET)
			      ? " (every buffer is evictable and few pages "
				"are shared: issue 10 defect 5)"
			      : "");
}

static void op_unmap(struct cbuf *cb, int b, size_t p, size_t n)
{
	static const struct model zero;
	long r;

	lock_pages(cb, p, n);
	r = sb_buf_unmap(cb->b, p * PAGE, n * PAGE);
	expect_ok(r, "sb_buf_unmap", b, p, n);
	if (r > (long)n)
		late_fail("sb_buf_unmap(buffer %d, pages %zu..%zu) returned "
			  "%ld pages released",
			  b, p, p + n - 1, r);
	/* A file's pages are read again: unmap drops copies only. */
	if (b != FILEBUF)
		for (size_t i = p; i < p + n; i++)
			set_model(&cb->pg[i].m, &zero);
	unlock_pages(cb, p, n);
}

/*
 * A KV cache's growth: release a run of pages, then write each of them
 * whole, in order (fresh pages: a fault each, under a budget an eviction
 * each). Issue 10 defect 5: with evictable pages in the pool, such writes
 * must never get SIGBUS.
 */
static void op_grow(struct cbuf *cb, int b, size_t p, size_t n)
{
	static const struct model zero;
	char what[64];
	long r;

	lock_pages(cb, p, n);
	r = sb_buf_unmap(cb->b, p * PAGE, n * PAGE);
	expect_ok(r, "sb_buf_unmap", b, p, n);
	for (size_t i = p; i < p + n; i++) {
		uint64_t seed = new_seed(b, i);

		set_model(&cb->pg[i].m, &zero);
		page_name(what, sizeof(what), b, i);
		guarded_fill(cb->b, cb->x + i * PAGE, (1u << NSEG) - 1, seed,
			     what);
		for (int s = 0; s < NSEG; s++)
			set_seg(&cb->pg[i].m, s, seed);
	}
	for (size_t i = p; i < p + n; i++) {
		page_name(what, sizeof(what), b, i);
		check_or_fail(cb->b, cb->x + i * PAGE, &cb->pg[i].m, what,
			      "wrong after its growth");
	}
	unlock_pages(cb, p, n);
}

/*
 * Share n pages of src (at sp) into dst (at dp): dst's pages then hold
 * what src's held. Both ranges locked (buffer 0 before 1, pages in order;
 * a self-share uses ranges that do not overlap).
 */
static void op_share(int si, size_t sp, int di, size_t dp, size_t n)
{
	struct cbuf *src = &bufs[si], *dst = &bufs[di];
	struct model snap[MAXRUN];
	bool dst_first = si == di && sp > dp;
	long r;

	if (dst_first)
		lock_pages(dst, dp, n);
	lock_pages(src, sp, n);
	if (!dst_first)
		lock_pages(dst, dp, n);
	for (size_t i = 0; i < n; i++)
		snap[i] = src->pg[sp + i].m;
	r = sb_buf_share(dst->b, dp * PAGE, src->b, sp * PAGE, n * PAGE);
	if (r > (long)n)
		late_fail("sb_buf_share(%d pages %zu.., into %d pages %zu..%zu) "
			  "returned %ld pages shared",
			  si, sp, di, dp, dp + n - 1, r);
	if (r >= 0) {
		for (size_t i = 0; i < n; i++)
			set_model(&dst->pg[dp + i].m, &snap[i]);
	} else if (r == -EAGAIN) {
		/* Issue 10 defect 13: -EAGAIN is not documented for
		 * sb_buf_share (it comes from an eviction racing the share).
		 * Counted and reported at the end; meanwhile each dst page
		 * must be either as it was or the source's. */
		atomic_fetch_add(&n_share_eagain, 1);
		for (size_t i = 0; i < n; i++) {
			struct model *m = &dst->pg[dp + i].m;
			char *x = dst->x + (dp + i) * PAGE, what[64];
			page_name(what, sizeof(what), di, dp + i);
			if (guarded_check(dst->b, x, m, what) < 0)
				continue;
			set_model(m, &snap[i]);
			check_or_fail(dst->b, x, m, what,
				      "after a failed share, neither its old "
				      "contents nor the source's");
		}
	} else {
		expect_ok(r, "sb_buf_share", di, dp, n);
	}
	unlock_pages(dst, dp, n);
	unlock_pages(src, sp, n);
}

/*
 * Save pages [p, p+n) (locked: a save is a snapshot of a quiet range),
 * restore the file as a new buffer and check every page against the
 * snapshot. With C_SAVE_OVER: leave the restored buffer's last page
 * unread (its data only in the file), write its first page, save it back
 * over the file it was restored from, and check every page of the live
 * buffer and of the file restored again.
 */
static void op_save(struct cbuf *cb, int b, size_t p, size_t n, int tid)
{
	static _Atomic unsigned serial;
	struct model snap[MAXRUN];
	char path[600], what[96];
	int err = 0, rc;

	snprintf(path, sizeof(path), "%s/save-%d-%u", save_dir, tid,
		 atomic_fetch_add(&serial, 1));
	lock_pages(cb, p, n);
	for (size_t i = 0; i < n; i++)
		snap[i] = cb->pg[p + i].m;
	rc = sb_buf_save(cb->b, p * PAGE, n * PAGE, path);
	unlock_pages(cb, p, n);
	expect_ok(rc, "sb_buf_save", b, p, n);

	for (int round = 0; round < 2; round++) {
		struct sb_buf *r = sb_buf_restore(
			pool, path, config & C_BUDGET ? SB_BUF_EVICTABLE : 0,
			&err);
		bool over = (config & C_SAVE_OVER) && round == 0;
		size_t unread = over && n > 1 ? 1 : 0;
		char *x;

		if (!r)
			CFAIL("sb_buf_restore(%s) of buffer %d pages "
			      "%zu..%zu: %s",
			      path, b, p, p + n - 1, strerror(-err));
		CCHECK(sb_buf_length(r) == n * PAGE);
		x = sb_buf_addr(r);
		for (size_t i = 0; i < n - unread; i++) {
			snprintf(what, sizeof(what),
				 "restored page %zu (of buffer %d page %zu)", i,
				 b, p + i);
			check_or_fail(r, x + i * PAGE, &snap[i], what,
				      "differs from what was saved");
		}
		if (!over) {
			sb_buf_destroy(r);
			break;
		}
		{
			uint64_t seed = new_seed(b, p);

			snprintf(what, sizeof(what), "restored page 0");
			guarded_fill(r, x, (1u << NSEG) - 1, seed, what);
			for (int s = 0; s < NSEG; s++)
				set_seg(&snap[0], s, seed);
		}
		rc = sb_buf_save(r, 0, n * PAGE, path);
		if (rc < 0)
			CFAIL("sb_buf_save of a restored buffer over its own "
			      "file %s: %s (issue 10 defect 1)",
			      path, strerror(-rc));
		for (size_t i = 0; i < n; i++) {
			snprintf(what, sizeof(what),
				 "restored page %zu (of buffer %d page %zu)", i,
				 b, p + i);
			check_or_fail(r, x + i * PAGE, &snap[i], what,
				      "differs after the buffer was saved "
				      "over its own file (issue 10 defect 1)");
		}
		sb_buf_destroy(r);
	}
	unlink(path);
}

/*
 * Replace buffer b by itself: save it whole, destroy it, restore the file
 * (its pages then come in lazily from the file). The model does not
 * change. Without C_SAVE_OVER the save goes to the other of two files;
 * with it, over the file the buffer was restored from.
 */
static void op_reincarnate(int b)
{
	struct cbuf *cb = &bufs[b];
	char path[512], old[512];
	struct sb_buf *nb;
	int err = 0, rc;

	pthread_rwlock_wrlock(&cb->life);
	if ((config & C_SAVE_OVER) && cb->file[0])
		snprintf(path, sizeof(path), "%s", cb->file);
	else
		snprintf(path, sizeof(path), "%.400s/buf%d-%d", save_dir, b,
			 ++cb->gen % 2);
	rc = sb_buf_save(cb->b, 0, BUFLEN, path);
	if (rc < 0)
		CFAIL("sb_buf_save(buffer %d, whole, %s): %s%s", b, path,
		      strerror(-rc),
		      !strcmp(path, cb->file) ? " (saved over the file it "
						"was restored from: issue "
						"10 defect 1)"
					      : "");
	sb_buf_destroy(cb->b);
	nb = sb_buf_restore(pool, path, buf_flags(), &err);
	if (!nb)
		CFAIL("sb_buf_restore(%s): %s", path, strerror(-err));
	CCHECK(sb_buf_length(nb) == BUFLEN);
	snprintf(old, sizeof(old), "%s", cb->file);
	cb->b = nb;
	cb->x = sb_buf_addr(nb);
	snprintf(cb->file, sizeof(cb->file), "%s", path);
	if (old[0] && strcmp(old, path))
		unlink(old);
	pthread_rwlock_unlock(&cb->life);
}

static void op_recreate(int b)
{
	static const struct model zero;
	struct cbuf *cb = &bufs[b];

	pthread_rwlock_wrlock(&cb->life);
	sb_buf_destroy(cb->b);
	cb->b = make_buf(pool, BUFLEN, buf_flags());
	cb->x = sb_buf_addr(cb->b);
	for (size_t p = 0; p < NPAGES; p++)
		set_model(&cb->pg[p].m, &zero);
	if (cb->file[0])
		unlink(cb->file);
	cb->file[0] = 0;
	pthread_rwlock_unlock(&cb->life);
}

/* ---- threads ----------------------------------------------------------------- */

struct worker {
	int id;
	pthread_t th;
	uint64_t rs;
};

static struct worker workers[NWORKERS];

static void one_op(struct worker *w)
{
	uint64_t *rs = &w->rs;
	int b = (int)rnd(rs, NALL);
	struct cbuf *cb = &bufs[b];
	size_t n = 1 + rnd(rs, MAXRUN);
	size_t p = rnd(rs, NPAGES - n + 1);
	unsigned r = (unsigned)rnd(rs, 1000);
	int op;
	long ret;

	/* Replacing a buffer excludes everything else on it: outside the
	 * buffer's read lock. */
	if (b == FILEBUF && r < 90)
		r = 90 + (unsigned)rnd(rs, 910);	/* not replaced */
	if (b == FILEBUF && r >= 90 && r < 300)
		r = 300 + (unsigned)rnd(rs, 700);	/* not grown */
	if (r < 4) {
		op_reincarnate(b);
		atomic_fetch_add(&n_ops[10], 1);
		return;
	}
	if (r < 6) {
		op_recreate(b);
		atomic_fetch_add(&n_ops[11], 1);
		return;
	}
	if (r < 90) {	/* share: buffer 0, 1 or the file into buffer 1 */
		static const int srcs[] = {0, 1, FILEBUF};
		int si = srcs[rnd(rs, 3)], lo = si < 1 ? si : 1;
		int hi = si > 1 ? si : 1;
		size_t sp = rnd(rs, SHARE_SRC - n + 1);
		size_t dp = rnd(rs, SHARE_DST - n + 1);

		if (si == 1 && sp < dp + n && dp < sp + n)
			return;	/* overlapping self-share: not defined */
		pthread_rwlock_rdlock(&bufs[lo].life);
		if (hi != lo)
			pthread_rwlock_rdlock(&bufs[hi].life);
		op_share(si, sp, 1, dp, n);
		if (hi != lo)
			pthread_rwlock_unlock(&bufs[hi].life);
		pthread_rwlock_unlock(&bufs[lo].life);
		atomic_fetch_add(&n_ops[8], 1);
		return;
	}

	pthread_rwlock_rdlock(&cb->life);
	if (rnd(rs, 16) == 0) {
		/* What memory pressure does to the page tables (MADV_PAGEOUT
		 * unmaps the pages even without swap), or an application's
		 * MADV_DONTNEED: the contents must not change. */
		op = 15;
		if (madvise(cb->x + p * PAGE, n * PAGE,
			    rnd(rs, 2) ? MADV_PAGEOUT : MADV_DONTNEED) < 0)
			CFAIL("madvise: %s", strerror(errno));
	} else if (r < 130) {
		size_t gn = 8;

		op = 14;
		p = rnd(rs, NPAGES - gn + 1);
		op_grow(cb, b, p, gn);
	} else if (r < 300) {
		op = 0;
		op_write(cb, b, p, rs, false);
	} else if (r < 450 && b == FILEBUF) {
		op = 16;
		op_ro_write(cb, p);
	} else if (r < 450) {
		op = 1;
		op_write(cb, b, p, rs, true);
	} else if (r < 650) {
		op = 2;
		op_read(cb, b, p);
	} else if (r < 720) {
		op = 3;
		ret = sb_buf_map(cb->b, p * PAGE, n * PAGE);
		expect_ok(ret, "sb_buf_map", b, p, n);
		if (ret > (long)n)
			late_fail("sb_buf_map(buffer %d, pages %zu..%zu) "
				  "returned %ld pages newly placed",
				  b, p, p + n - 1, ret);
	} else if (r < 770) {
		op = 4;
		op_unmap(cb, b, p, n);
	} else if (r < 850) {
		op = 5;
		ret = sb_buf_evict(cb->b, p * PAGE, n * PAGE);
		expect_ok(ret, "sb_buf_evict", b, p, n);
		if (ret > (long)n)
			late_fail("sb_buf_evict(buffer %d, pages %zu..%zu) "
				  "returned %ld pages evicted",
				  b, p, p + n - 1, ret);
	} else if (r < 920) {
		struct sb_range rg[2] = {{p * PAGE, n * PAGE},
					 {rnd(rs, NPAGES) * PAGE, PAGE}};
		unsigned fl = rnd(rs, 2) ? SB_PREFETCH_WAIT : 0;

		op = 6;
		ret = sb_buf_prefetch(cb->b, rg, 1 + rnd(rs, 2), fl);
		expect_ok(ret, fl ? "sb_buf_prefetch(WAIT)" : "sb_buf_prefetch",
			  b, p, n);
	} else if (r < 950) {
		static const enum sb_advice adv[] = {
			SB_ADVICE_NORMAL, SB_ADVICE_HOT, SB_ADVICE_COLD,
			SB_ADVICE_WILLNEED, SB_ADVICE_DONTNEED};

		op = 7;
		ret = sb_buf_advise(cb->b, p * PAGE, n * PAGE,
				    adv[rnd(rs, 5)]);
		expect_ok(ret, "sb_buf_advise", b, p, n);
	} else if (r < 975) {
		op = 9;
		op_save(cb, b, p, n, w->id);
	} else if (r < 985) {
		op = 12;
		ret = sb_pool_trim(pool);
		expect_ok(ret, "sb_pool_trim", b, 0, 1);
	} else {
		op = 13;
		ret = sb_buf_placed(cb->b, p * PAGE, n * PAGE);
		expect_ok(ret, "sb_buf_placed", b, p, n);
		if (ret > (long)n)
			late_fail("sb_buf_placed(buffer %d, pages %zu..%zu) "
				  "returned %ld",
				  b, p, p + n - 1, ret);
	}
	pthread_rwlock_unlock(&cb->life);
	atomic_fetch_add(&n_ops[op], 1);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	while (!atomic_load(&stop_all)) {
		pthread_rwlock_rdlock(&world);
		for (int i = 0; i < 16 && !atomic_load(&stop_all); i++)
			one_op(w);
		pthread_rwlock_unlock(&world);
	}
	return NULL;
}

static pthread_t forker_th;

/* SIGUSR1 to every worker and to the forker, a few microseconds apart. */
static void *signaller_main(void *arg)
{
	uint64_t rs = 0x5157u;

	(void)arg;
	while (!atomic_load(&stop_all)) {
		int k = (int)rnd(&rs, NWORKERS + 1);

		pthread_kill(k < NWORKERS ? workers[k].th : forker_th, SIGUSR1);
		atomic_fetch_add(&n_usr1, 1);
		usleep(5 + (unsigned)rnd(&rs, 30));
	}
	return NULL;
}

/* ---- fork --------------------------------------------------------------------- */

struct range {
	uintptr_t lo, hi;
};

static char maps_buf[1 << 20];

/* In the child: is anything of [lo, hi) mapped? Plain system calls only
 * (the parent's other threads may have held locks when it forked). */
static bool child_mapped(const struct range *r, int n)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	size_t got = 0;
	ssize_t k;
	char *s;

	if (fd < 0)
		_exit(70);
	while (got < sizeof(maps_buf) - 1 &&
	       (k = read(fd, maps_buf + got, sizeof(maps_buf) - 1 - got)) > 0)
		got += (size_t)k;
	close(fd);
	maps_buf[got] = 0;
	for (s = maps_buf; *s;) {
		char *line = s, *eol;
		uintptr_t lo = strtoull(s, &s, 16), hi;

		if (*s != '-')
			_exit(71);
		hi = strtoull(s + 1, &s, 16);
		for (int i = 0; i < n; i++) {
			if (lo >= r[i].hi || hi <= r[i].lo)
				continue;
			/* Say which (plain system calls: a forked child). */
			eol = strchr(line, '\n');
			say("fork()ed child: mapped in a parent's buffer: ");
			if (write(2, line, eol ? (size_t)(eol - line + 1)
					       : strlen(line)) < 0)
				_exit(72);
			return true;
		}
		while (*s && *s != '\n')
			s++;
		if (*s)
			s++;
	}
	return false;
}

static sigjmp_buf child_jmp;
static volatile int child_sig;

static void child_on_fault(int sig)
{
	child_sig = sig;
	siglongjmp(child_jmp, 1);
}

/* What a fork()ed child must see; exit codes say what went wrong. */
static int fork_child(struct sb_buf **b, const struct range *r)
{
	struct sigaction sa = {.sa_handler = child_on_fault};
	struct sb_stats st;
	unsigned char vec;

	if (child_mapped(r, NALL))
		return 10;
	for (int i = 0; i < NALL; i++) {
		/* Nothing there: mincore says so, a touch faults. */
		if (mincore((void *)r[i].lo, 4096, &vec) == 0 || errno != ENOMEM)
			return 11;
		sigaction(SIGSEGV, &sa, NULL);
		sigaction(SIGBUS, &sa, NULL);
		child_sig = 0;
		if (sigsetjmp(child_jmp, 1) == 0) {
			(void)*(volatile char *)(r[i].lo + PAGE + 8);
			return 12;	/* read something */
		}
		if (child_sig != SIGSEGV)
			return 13;
		if (sb_buf_map(b[i], 0, PAGE) != -ECHILD)
			return 14;
		if (sb_buf_evict(b[i], 0, PAGE) != -ECHILD)
			return 15;
		if (sb_buf_placed(b[i], 0, PAGE) != -ECHILD)
			return 16;
	}
	if (sb_pool_stats(pool, &st) != -ECHILD)
		return 17;
	if (sb_buf_share(b[1], 0, b[0], 0, PAGE) != -ECHILD)
		return 18;
	sb_buf_destroy(b[2]);	/* does nothing in a child */
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
	/* A pool of its own works: a server forking workers. Not under the
	 * sanitizers: ThreadSanitizer forbids threads in the child of a
	 * multithreaded process, and GCC 12's AddressSanitizer does not lock
	 * its allocator around fork(), so a child whose parent had a thread
	 * inside malloc deadlocks in its first allocations (seen: the new
	 * pool's threads waiting forever in SizeClassAllocator64's mutex,
	 * once in about ten runs). test_fork covers the child's pool there,
	 * forked from a quiet parent. */
	{
		struct sb_pool *cp = getpid() & 1 ? NULL
							     : sb_default_pool();
		struct sb_pool_opts o;
		struct sb_buf *cb;
		volatile char *x;
		int err = 0;

		if (!cp) {
			sb_pool_opts_init(&o);
			o.page_size = PAGE;
			o.heap_size = HEAP;
			cp = sb_pool_create(&o, &err);
		}
		if (!cp || cp == pool)
			return 20;
		if (sb_pool_stats(cp, &st) != 0)
			return 24;
		cb = sb_buf_create(cp, 16 * MiB, 0, &err);
		if (!cb)
			return 21;
		x = sb_buf_addr(cb);
		x[st.page_size + 5] = 7;	/* a fault */
		if (x[st.page_size + 5] != 7 || x[st.page_size + 6] != 0)
			return 22;
		if (sb_buf_map(cb, 0, 2 * st.page_size) != 1)
			return 23;
		sb_buf_destroy(cb);
	}
#endif
	return 0;
}

static void *forker_main(void *arg)
{
	uint64_t rs = 0xf04c;

	(void)arg;
	while (!atomic_load(&stop_all)) {
		struct sb_buf *b[NALL];
		struct range r[NALL];
		int st = 0, code;
		double t0;
		pid_t pid;

		/* SIGUSR1 cuts sleeps short: sleep to a deadline. */
		t0 = now_s() + 0.02 + (double)rnd(&rs, 60) * 1e-3;
		while (now_s() < t0 && !atomic_load(&stop_all))
			usleep(1000);
		if (atomic_load(&stop_all))
			break;
		for (int i = 0; i < NALL; i++) {
			pthread_rwlock_rdlock(&bufs[i].life);
			b[i] = bufs[i].b;
			r[i].lo = (uintptr_t)bufs[i].x;
			r[i].hi = r[i].lo + BUFLEN;
		}
		pid = fork();
		if (pid == 0)
			_exit(fork_child(b, r));
		for (int i = NALL - 1; i >= 0; i--)
			pthread_rwlock_unlock(&bufs[i].life);
		if (pid < 0)
			CFAIL("fork: %s", strerror(errno));
		t0 = now_s();
		for (;;) {
			pid_t w = waitpid(pid, &st, WNOHANG);

			if (w == pid)
				break;
			if (w < 0 && errno != EINTR)
				CFAIL("waitpid: %s", strerror(errno));
			if (now_s() - t0 > 20) {
				dump_hung(pid);
				kill(pid, SIGKILL);
				waitpid(pid, &st, 0);
				CFAIL("a fork()ed child hung");
			}
			usleep(500);
		}
		code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		if (code != 0)
			CFAIL("fork()ed child: %s %d", WIFEXITED(st) ? "exit"
								     : "signal",
			      WIFEXITED(st) ? code : WTERMSIG(st));
		atomic_fetch_add(&n_forks, 1);
	}
	return NULL;
}

/* ---- quiescent checks ------------------------------------------------------------ */

static void check_all(const char *when)
{
	struct sb_stats st;
	char why[512];
	long placed = 0;

	/* Let queued prefetches and read-ahead land first. */
	for (int b = 0; b < NALL; b++)
		expect_ok(sb_buf_prefetch(bufs[b].b, NULL, 0, SB_PREFETCH_WAIT),
			  "sb_buf_prefetch(WAIT, none)", b, 0, 1);
	if (sbi_pool_verify(pool, why, sizeof(why)) != 0)
		CFAIL("%s: pool inconsistent: %s", when, why);
	for (int b = 0; b < NALL; b++)
		placed += sb_buf_placed(bufs[b].b, 0, BUFLEN);
	CCHECK(sb_pool_stats(pool, &st) == 0);
	if (st.pages_used > (size_t)placed)
		CFAIL("%s: %zu pages used, %ld placed in the buffers", when,
		      st.pages_used, placed);
	if (st.max_bytes && st.bytes_resident > st.max_bytes)
		CFAIL("%s: bytes_resident %zu over the budget %zu", when,
		      st.bytes_resident, st.max_bytes);
	if (st.io_errors)
		CFAIL("%s: %llu I/O errors", when,
		      (unsigned long long)st.io_errors);
	/* Every byte of every page. */
	for (int b = 0; b < NALL; b++)
		for (size_t p = 0; p < NPAGES; p++)
			op_read(&bufs[b], b, p);
}

static int chaos(void)
{
	const char *cs = getenv("SB_CHAOS_CONFIG");
	const char *seed_env = getenv("SB_CHAOS_SEED");
	struct sigaction sa = {.sa_sigaction = on_fault,
			       .sa_flags = SA_SIGINFO | SA_NODEFER};
	struct sigaction su = {.sa_handler = on_usr1};	/* no SA_RESTART */
	struct budget_watch bw;
	pthread_t sig_th;
	uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0)
				 : (uint64_t)time(NULL) * 2654435761u ^
					   (uint64_t)getpid();
	size_t budget;
	struct sb_stats st;
	double t0, next_check;
	long total = 0;
	int checks = 0;

	config = !strcmp(cs, "budget")	   ? C_BUDGET
		 : !strcmp(cs, "saveover") ? C_SAVE_OVER
					   : 0;
	budget = config & C_BUDGET ? BUDGET_PAGES * PAGE : 0;
	if (!seed)
		seed = 1;
	printf("chaos %s: seed %#llx, %.1f s\n", cs, (unsigned long long)seed,
	       run_seconds);
	snprintf(save_dir, sizeof(save_dir), "%s/saves", disk_dir());
	if (mkdir(save_dir, 0700) < 0)
		CFAIL("mkdir %s: %s", save_dir, strerror(errno));
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGUSR1, &su, NULL);

	{
		pthread_rwlockattr_t a;

		pthread_rwlockattr_init(&a);
		pthread_rwlockattr_setkind_np(
			&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
		pthread_rwlock_init(&world, &a);
	}
	pool = disk_pool(PAGE, HEAP, budget);
	for (int b = 0; b < NBUF; b++) {
		pthread_rwlock_init(&bufs[b].life, NULL);
		for (size_t p = 0; p < NPAGES; p++)
			pthread_mutex_init(&bufs[b].pg[p].lock, NULL);
		bufs[b].b = make_buf(pool, BUFLEN, buf_flags());
		bufs[b].x = sb_buf_addr(bufs[b].b);
	}
	/* The file-backed buffer: every page of the file its own seed. */
	{
		struct cbuf *cb = &bufs[FILEBUF];
		char *page = malloc(PAGE);
		int fd, err = 0;

		snprintf(weights, sizeof(weights), "%s/weights.bin", disk_dir());
		fd = open(weights, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			  0600);
		CCHECK(fd >= 0 && page);
		for (size_t p = 0; p < NPAGES; p++) {
			for (int sg = 0; sg < NSEG; sg++)
				fill_seg(page, sg, file_seed(p));
			CCHECK(write(fd, page, PAGE) == (ssize_t)PAGE);
		}
		close(fd);
		free(page);
		pthread_rwlock_init(&cb->life, NULL);
		for (size_t p = 0; p < NPAGES; p++) {
			pthread_mutex_init(&cb->pg[p].lock, NULL);
			for (int sg = 0; sg < NSEG; sg++)
				cb->pg[p].m.seg[sg] = file_seed(p);
		}
		cb->b = sb_buf_open_file(pool, weights, 0, BUFLEN, 0, &err);
		if (!cb->b)
			CFAIL("sb_buf_open_file(%s): %s", weights,
			      strerror(-err));
		cb->x = sb_buf_addr(cb->b);
	}
	if (budget)
		budget_watch_start(&bw, pool);
	for (int i = 0; i < NWORKERS; i++) {
		workers[i].id = i;
		workers[i].rs = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
		if (pthread_create(&workers[i].th, NULL, worker_main,
				   &workers[i]))
			CFAIL("pthread_create");
	}
	if (pthread_create(&forker_th, NULL, forker_main, NULL) ||
	    pthread_create(&sig_th, NULL, signaller_main, NULL))
		CFAIL("pthread_create");

	t0 = now_s();
	next_check = t0 + 0.25;
	/* The run lasts its time, and longer (up to 5 times, on a machine
	 * too loaded to schedule the workers) until it has forked, evicted
	 * and read at least once: the checks below ask for each. */
	while (now_s() - t0 < run_seconds ||
	       (now_s() - t0 < 5 * run_seconds &&
		(!atomic_load(&n_forks) || !atomic_load(&n_ops[2]) ||
		 !atomic_load(&n_ops[5])))) {
		usleep(10000);
		if (now_s() < next_check)
			continue;
		pthread_rwlock_wrlock(&world);
		check_all("quiescent point");
		checks++;
		pthread_rwlock_unlock(&world);
		next_check = now_s() + 0.25;
	}
	atomic_store(&stop_all, true);
	for (int i = 0; i < NWORKERS; i++)
		pthread_join(workers[i].th, NULL);
	pthread_join(forker_th, NULL);
	pthread_join(sig_th, NULL);
	if (budget)
		budget_watch_stop(&bw, budget);
	check_all("the end");

	for (int i = 0; i < 17; i++)
		total += atomic_load(&n_ops[i]);
	st = stats(pool);
	printf("%ld operations in %.1f s:", total, now_s() - t0);
	for (int i = 0; i < 17; i++)
		printf(" %s %ld", op_names[i], atomic_load(&n_ops[i]));
	printf("\n%ld forks, %ld SIGUSR1, %d quiescent checks; pool: %llu "
	       "faults, %llu cow copies, %llu out, %llu in, %llu sigbus, "
	       "%llu io errors\n",
	       atomic_load(&n_forks), atomic_load(&n_usr1), checks,
	       (unsigned long long)st.faults, (unsigned long long)st.cow_copies,
	       (unsigned long long)st.pages_out, (unsigned long long)st.pages_in,
	       (unsigned long long)st.sigbus, (unsigned long long)st.io_errors);
	if (atomic_load(&n_sigbus) || atomic_load(&n_sigsegv))
		CFAIL("%ld SIGBUS and %ld SIGSEGV in pages that must never "
		      "raise them%s",
		      atomic_load(&n_sigbus), atomic_load(&n_sigsegv),
		      config & C_BUDGET ? " (every buffer is evictable and "
					  "few pages are shared: issue 10 "
					  "defect 5)"
					: "");
	if (atomic_load(&n_share_eagain))
		CFAIL("sb_buf_share returned -EAGAIN %ld times (not "
		      "documented: issue 10 defect 13)",
		      atomic_load(&n_share_eagain));
	if (atomic_load(&n_late))
		CFAIL("%ld wrong results (the first ones above)",
		      atomic_load(&n_late));
	CCHECK(st.sigbus == 0);
	CCHECK(atomic_load(&n_forks) > 0);
	CCHECK(atomic_load(&n_ops[2]) > 0 && atomic_load(&n_ops[5]) > 0);

	/* Everything goes back. */
	for (int b = 0; b < NALL; b++) {
		sb_buf_destroy(bufs[b].b);
		if (bufs[b].file[0])
			unlink(bufs[b].file);
	}
	unlink(weights);
	st = stats(pool);
	if (st.pages_used || st.spill_bytes)
		CFAIL("all buffers destroyed: %zu pages used, %llu spill "
		      "bytes",
		      st.pages_used, (unsigned long long)st.spill_bytes);
	{
		char why[512];

		if (sbi_pool_verify(pool, why, sizeof(why)) != 0)
			CFAIL("after destroying everything: %s", why);
	}
	sb_pool_destroy(pool);
	/* No file left: saves were removed, the spill file is unlinked. */
	{
		char d[600];
		DIR *dir;
		struct dirent *e;

		for (int k = 0; k < 2; k++) {
			snprintf(d, sizeof(d), "%s/%s", disk_dir(),
				 k ? "saves" : "spill");
			dir = opendir(d);
			if (!dir)
				continue;
			while ((e = readdir(dir)))
				if (strcmp(e->d_name, ".") &&
				    strcmp(e->d_name, ".."))
					CFAIL("left behind: %s/%s", d,
					      e->d_name);
			closedir(dir);
		}
	}
	return 0;
}

/* ---- reductions: what the chaos found, each alone --------------------------- */

/*
 * sb_buf_map of one evicted page while another thread unmaps it: the
 * page-in counts it, the unmap empties it, the placement counts it again.
 * sb_buf_map returned 2 (up to n + 2 for n pages) on the first try.
 */
static struct sb_buf *mc_buf;
static atomic_bool mc_stop;

static void *mc_unmapper(void *arg)
{
	(void)arg;
	while (!atomic_load(&mc_stop))
		sb_buf_unmap(mc_buf, 0, PAGE);
	return NULL;
}

static int map_count(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 0);
	volatile char *x;
	pthread_t th;
	long worst = 0, it;
	double t0 = now_s();

	mc_buf = make_buf(p, 16 * MiB, 0);
	x = sb_buf_addr(mc_buf);
	pthread_create(&th, NULL, mc_unmapper, NULL);
	for (it = 0; now_s() - t0 < 0.5 && worst <= 1; it++) {
		long r;

		x[0] = 1;
		sb_buf_evict(mc_buf, 0, PAGE);
		r = sb_buf_map(mc_buf, 0, PAGE);
		if (r > worst)
			worst = r;
	}
	atomic_store(&mc_stop, true);
	pthread_join(th, NULL);
	if (worst > 1)
		FAIL("sb_buf_map of one page, an unmap racing it: returned %ld "
		     "pages newly placed (iteration %ld)",
		     worst, it);
	sb_buf_destroy(mc_buf);
	sb_pool_destroy(p);
	return 0;
}

/*
 * Pages shared into c, then let go by their source (unmapped, or the
 * source destroyed: a session that forked a prompt ends). c alone holds
 * them, c is evictable, so they are evictable: a fresh page in c must
 * evict one. The clock still names the source's address for them; the
 * hand takes them, finds the source no longer maps them, and drops them
 * from the clock for good: SIGBUS.
 */
static int orphan_share(void)
{
	for (int destroy = 0; destroy < 2; destroy++) {
		struct sb_pool *p = disk_pool(PAGE, HEAP, 8 * PAGE);
		struct sb_buf *a = make_buf(p, 16 * MiB, SB_BUF_EVICTABLE);
		struct sb_buf *c = make_buf(p, 16 * MiB, SB_BUF_EVICTABLE);
		volatile char *y = sb_buf_addr(c);

		CHECK_EQ(sb_buf_map(a, 0, 8 * PAGE), 8);
		for (size_t i = 0; i < 8; i++)
			disk_fill(sb_buf_addr(a) + i * PAGE, PAGE,
				  new_seed(0, i));
		CHECK_EQ(sb_buf_share(c, 0, a, 0, 8 * PAGE), 8);
		if (destroy)
			sb_buf_destroy(a);
		else
			CHECK_EQ(sb_buf_unmap(a, 0, 8 * PAGE), 8);
		CHECK_EQ(stats(p).pages_used, 8);
		printf("orphan-share (source %s): a fresh page in the "
		       "buffer that alone holds the budget's 8 pages\n",
		       destroy ? "destroyed" : "unmapped");
		fflush(stdout);
		expect_signal_at((char *)y + 20 * PAGE, PAGE);
		y[20 * PAGE] = 1;
		CHECK_EQ(y[20 * PAGE], 1);
		CHECK(stats(p).pages_out > 0);
		sb_buf_destroy(c);
		if (!destroy)
			sb_buf_destroy(a);
		sb_pool_destroy(p);
	}
	return 0;
}

/*
 * Three threads each growing an evictable buffer at the budget. An
 * allocation fails its budget check, another thread's eviction frees a
 * page, and sbi_alloc, seeing pages used below the budget, takes the
 * failure for the kernel's ("not the budget") and returns -ENOMEM
 * without evicting: SIGBUS in every run.
 */
#define ER_PAGES 1000
static struct sb_buf *er_bufs[3];
static atomic_int er_go;

static void *er_grow(void *arg)
{
	volatile char *x = sb_buf_addr(er_bufs[(intptr_t)arg]);

	while (!atomic_load(&er_go))
		;
	for (size_t i = 0; i < ER_PAGES; i++)
		x[i * PAGE] = 1;
	return NULL;
}

static int evict_race(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 16 * PAGE);
	pthread_t th[3];

	for (int i = 0; i < 3; i++)
		er_bufs[i] = make_buf(p, ER_PAGES * PAGE, SB_BUF_EVICTABLE);
	/* Any SIGBUS in the buffers fails the child (exit 42). */
	expect_signal_at((void *)0, ~(size_t)0);
	for (intptr_t i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, er_grow, (void *)i);
	atomic_store(&er_go, 1);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	CHECK_EQ(stats(p).sigbus, 0);
	for (int i = 0; i < 3; i++)
		sb_buf_destroy(er_bufs[i]);
	sb_pool_destroy(p);
	return 0;
}

/*
 * A share from S into D, racing a page-in fault in D, with every
 * evictable page in S. sb_buf_share marks S "sharing" (no eviction from
 * it) and then waits for D's lock; the fault handler holds D's lock and
 * waits for an eviction, whose every candidate is in S: busy. Neither
 * moves until the allocation gives up after 10 s: the faulting thread
 * stalls 10 s, then gets SIGBUS. Every run.
 */
static struct sb_buf *ss_src, *ss_dst;
static atomic_bool ss_stop;

static void *ss_sharer(void *arg)
{
	(void)arg;
	while (!atomic_load(&ss_stop))
		sb_buf_share(ss_dst, 8 * PAGE, ss_src, 0, PAGE);
	return NULL;
}

static int share_stall(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 8 * PAGE);
	volatile char *d;
	double worst = 0, t0 = now_s();
	pthread_t th;
	long it;

	ss_src = make_buf(p, 64 * PAGE, SB_BUF_EVICTABLE);
	ss_dst = make_buf(p, 64 * PAGE, SB_BUF_EVICTABLE);
	d = sb_buf_addr(ss_dst);
	d[0] = 1;
	CHECK_EQ(sb_buf_evict(ss_dst, 0, PAGE), 1);
	CHECK_EQ(sb_buf_map(ss_src, 0, 8 * PAGE), 8);	/* the budget: all S */
	expect_signal_at((void *)0, ~(size_t)0);	/* SIGBUS: exit 42 */
	pthread_create(&th, NULL, ss_sharer, NULL);
	for (it = 0; now_s() - t0 < 1 && worst < 1; it++) {
		double t = now_s();

		CHECK_EQ(d[0], 1);	/* a page-in: evicts one of S's pages */
		if (now_s() - t > worst)
			worst = now_s() - t;
		CHECK_EQ(sb_buf_evict(ss_dst, 0, PAGE), 1);
		sb_buf_map(ss_src, 0, 8 * PAGE);	/* S fills it again */
	}
	atomic_store(&ss_stop, true);
	pthread_join(th, NULL);
	if (worst >= 1)
		FAIL("a page-in fault took %.1f s while a share ran", worst);
	sb_buf_destroy(ss_dst);
	sb_buf_destroy(ss_src);
	sb_pool_destroy(p);
	return 0;
}

/*
 * Pages shared into A and let go by their source are A's alone; with a
 * budget of exactly those pages, a page-in by sb_buf_map in another
 * buffer must evict one, and eviction first maps such a page private in
 * place (mmap MAP_FIXED in A's range). sb_buf_map's page-ins allocate
 * without the pool's layout lock, which the fork() prepare handler holds
 * while it marks every buffer range MADV_DONTFORK: a mapping made in
 * between is inherited, and the child sees (for a writable buffer: may
 * write) the parent's page. Meanwhile this process forks, and each child
 * looks for anything mapped in A's range.
 */
static struct sb_buf *fm_a, *fm_b, *fm_c;
static atomic_bool fm_stop;

static void *fm_churn(void *arg)
{
	(void)arg;
	while (!atomic_load(&fm_stop)) {
		sb_buf_map(fm_b, 0, 4 * PAGE);
		sb_buf_share(fm_a, 0, fm_b, 0, 4 * PAGE);	/* B's pages */
		sb_buf_unmap(fm_b, 0, 4 * PAGE);		/* A's alone */
		sb_buf_evict(fm_c, 0, PAGE);
		sb_buf_map(fm_c, 0, PAGE);	/* a page-in: evicts one of A's */
	}
	return NULL;
}

static int fork_map(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, 4 * PAGE);
	struct range r;
	double t0 = now_s();
	long forks = 0, bad = 0;
	pthread_t th;

	fm_a = make_buf(p, 64 * PAGE, SB_BUF_EVICTABLE);
	fm_b = make_buf(p, 64 * PAGE, SB_BUF_EVICTABLE);
	fm_c = make_buf(p, 64 * PAGE, SB_BUF_EVICTABLE);
	r.lo = (uintptr_t)sb_buf_addr(fm_a);
	r.hi = r.lo + 64 * PAGE;
	((volatile char *)sb_buf_addr(fm_c))[0] = 1;
	pthread_create(&th, NULL, fm_churn, NULL);
	while (now_s() - t0 < 3 && !bad) {
		pid_t pid = fork();
		int st = 0;

		if (pid == 0)
			_exit(child_mapped(&r, 1));
		CHECK(pid > 0);
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
		forks++;
	}
	atomic_store(&fm_stop, true);
	pthread_join(th, NULL);
	if (bad)
		FAIL("fork %ld: the child saw a mapping in a parent's buffer "
		     "(above)",
		     forks);
	sb_buf_destroy(fm_a);
	sb_buf_destroy(fm_b);
	sb_buf_destroy(fm_c);
	sb_pool_destroy(p);
	return 0;
}

static int child(const char *name)
{
	const char *s = getenv("SB_CHAOS_SECONDS");

	run_seconds = s ? atof(s) : 2.0;
	if (!strcmp(name, "chaos"))
		return chaos();
	if (!strcmp(name, "map-count"))
		return map_count();
	if (!strcmp(name, "orphan-share"))
		return orphan_share();
	if (!strcmp(name, "evict-race"))
		return evict_race();
	if (!strcmp(name, "share-stall"))
		return share_stall();
	if (!strcmp(name, "fork-map"))
		return fork_map();
	return 2;
}

static int main_test(void)
{
	static const char *const configs[] = {"plain", "budget", "saveover"};
	const char *o = getenv("SB_CHAOS_CONFIG");
	char only[64];
	const char *s = getenv("SB_CHAOS_SECONDS");
	double secs = s ? atof(s) : 2.0;
	int failed = 0, skipped = 0;

	snprintf(only, sizeof(only), "%s", o ? o : "");
	require_cow();
	/* The reductions first, each in a process of its own (a SIGBUS is
	 * exit 42). */
	for (int i = 0; i < 5 && !o; i++) {
		static const char *const red[] = {"map-count", "orphan-share",
						  "evict-race", "share-stall",
						  "fork-map"};
		static const char *const why[] = {
			"sb_buf_map counts a page twice when an unmap races it",
			"pages shared, then let go by their source, are never "
			"evicted again",
			"an allocation at the budget fails when another "
			"thread's eviction frees a page meanwhile (issue 10 "
			"defect 5)",
			"a page-in fault stalls 10 s, then SIGBUS, while a "
			"share from the buffer holding every evictable page "
			"waits for the faulting buffer's lock",
			"a page mapped by an eviction in sb_buf_map's page-in "
			"(no layout lock) escapes fork()'s MADV_DONTFORK: the "
			"child sees the parent's page"};
		char dir[] = "/tmp/sbtest-XXXXXX", var[64];
		char *env[] = {var, NULL};
		int st, code;

		/* Once each, with the default pager: they are about the
		 * pool, not the I/O. */
		if (!mkdtemp(dir))
			FAIL("mkdtemp: %s", strerror(errno));
		snprintf(var, sizeof(var), "SBT_DIR=%s", dir);
		printf("-- %s\n", red[i]);
		st = run_child_env(red[i], env, 60, NULL, 0);
		disk_rm_rf(dir);
		code = child_exit_code(st);
		if (code != 0 && code != 77) {
			fprintf(stderr, "FAILED: %s (%s %d): %s\n", red[i],
				st < 0		     ? "hung"
				: WIFSIGNALED(st) ? "signal"
						  : "exit",
				st < 0		     ? 0
				: WIFSIGNALED(st) ? WTERMSIG(st)
						  : code,
				why[i]);
			failed++;
		}
	}
	for (int i = 0; i < (int)(sizeof(configs) / sizeof(configs[0])); i++) {
		if (o && strcmp(only, configs[i]))
			continue;
		setenv("SB_CHAOS_CONFIG", configs[i], 1);
		/* run_pagers fails the whole test at the first failing
		 * configuration; run each in a child of its own so every
		 * configuration reports. */
		{
			pid_t pid = fork();
			int st = 0;

			if (pid == 0)
				_exit(run_pagers("chaos", 4 * secs + 60, NULL)
					      ? 77
					      : 0);
			waitpid(pid, &st, 0);
			if (child_exit_code(st) == 77)
				skipped++;
			else if (child_exit_code(st) != 0) {
				fprintf(stderr, "FAILED: configuration %s\n",
					configs[i]);
				failed++;
			}
		}
	}
	if (failed)
		FAIL("%d configuration(s) failed", failed);
	if (skipped)
		SKIP("a run skipped (see above)");
	return 0;
}
