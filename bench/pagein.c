/* SPDX-License-Identifier: MIT */
/*
 * bench/pagein: the disk tier against fio and the kernel's mmap, in one run.
 *
 *   sequential  a file (default 2 GiB) read end to end through the faults
 *               of a sb_buf_open_file buffer (pages of --page-size, default
 *               1 MiB), against fio (io_uring, O_DIRECT, bs 1 MiB or the
 *               page size when larger, up to 4 MiB, depth 16, rw=read) on
 *               the same file and against plain mmap(MAP_SHARED, PROT_READ)
 *               with the kernel's read-ahead. Targets >= 0.8x fio, >= 1.0x
 *               mmap, CPU per GiB read <= 1.5x mmap's. Reported beside
 *               them: the same reads as fio's, io_uring O_DIRECT at depth
 *               16, into a fresh anonymous mapping of the file's size (the
 *               device into memory the process keeps; fio reuses its 16
 *               buffers and never pays for memory the file lands in:
 *               seq_direct says why that matters on a VM). With
 *               SPARSEBUF_HUGETLB=1 and --page-size 2M the pool's heaps are
 *               huge pages (bench/pagein.sh runs that too).
 *   random      64 KiB blocks in a seeded random order (no block twice; a
 *               quarter of the file), fetched with sb_buf_prefetch 32
 *               ranges at a time (64 KiB pages), pipelined: batch i+1 is
 *               queued (no WAIT) before batch i is touched, as a caller
 *               with a predictor one step ahead does; against fio randread
 *               bs 64 KiB depth 32 (its own random order over the same
 *               file: every block at most once, the same amount) and
 *               against mmap touching the same blocks in the same order.
 *               Targets >= 0.8x fio, >= 3x mmap. Also reported: the same
 *               with a pool budget of a quarter of the blocks (pages
 *               recycled, like fio's fixed buffers), one batch at a time
 *               with SB_PREFETCH_WAIT, mmap with madvise(MADV_WILLNEED) of
 *               each batch, and sparsebuf touching the blocks without
 *               prefetch (its faults alone), with how much more than the
 *               blocks it read.
 *   evict       a buffer of placed pages (256 MiB in 256 KiB pages) written,
 *               sb_buf_evict'ed, then touched again (in order, in random
 *               order, or brought back with one sb_buf_prefetch WAIT): us
 *               per page and the library's counters. Reference: the same
 *               by hand on anonymous memory (pwrite O_DIRECT + MADV_DONTNEED
 *               out, pread O_DIRECT back, one page at a time). The disk
 *               tier is set up (one page out and back) before timing.
 *   budget      reported too: the sequential read with a pool budget of a
 *               quarter of the file (clean pages dropped to make room).
 *
 * Every run starts from a cold cache: posix_fadvise(DONTNEED) of the file,
 * and, as root, echo 3 > /proc/sys/vm/drop_caches (not with --quick or
 * --no-drop-caches, which leave the rest of the machine's cache alone);
 * mincore() then checks that none of the file is cached. Each repetition
 * runs the contenders back to back (fio, sparsebuf, mmap), so that drift in
 * the VM hits all alike; the table gives medians and the spread.
 *
 * The reader (--touch): "word" (default) loads the first 8-byte word of
 * every 4 KiB and checks it against the file's generator; "sum" does that
 * and also sums every word. The same reader for sparsebuf and mmap. The
 * file is made once under --dir (reused when present, of the right size,
 * with the right contents): every word non-zero, a function of its offset.
 *
 * Usage: pagein [--dir D] [--size 2G] [--quick] [--reps N] [--page-size P]
 *               [--touch word|sum] [--no-drop-caches] [--no-settle] [--sweep]
 *               [--only seq,rand,evict] [--rand-blocks N] [--evict-size S]
 *               [--verbose]
 *   --quick  64 MiB file, 16 MiB evicted, one rep: a smoke run of seconds
 *   --sweep  sequential sparsebuf at 64K, 256K, 1M, 2M and 4M pages
 *   --verbose  CPU time of every thread of each sparsebuf run
 *   --run sb|mmap [--wait FIFO]  one cold sequential read, key=value
 *            counters on stdout (bench/pagein-perf.sh runs this under perf)
 *   --run rand|rand-budget  one cold random run (the pipelined target row,
 *            or the same with the budget row's pool budget), key=value
 *        pagein --help | --version
 * Exit status: 0, 3 when a target is missed, 1 when a run fails, 2 for a
 * bad option.
 */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "sparsebuf.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define RAND_BS (64 * KIB)
#define RAND_BATCH 32
#define MAX_REPS 32

static const char *dir = "/var/tmp/sparsebuf-bench";
static size_t fsize = 2 * GIB;
static size_t seq_page = 1 * MIB;
static size_t evict_size = 256 * MIB;
static size_t evict_page = 256 * KIB;
static size_t rand_blocks;		/* 0: a quarter of the file */
static int reps = 3;
static bool quick, sum_mode, drop_all = true, sweep, verbose;
static bool do_seq = true, do_rand = true, do_evict = true;
static char path[4096];
static int fd_buf = -1;		/* the file, through the page cache */
static const char *phase = "setup";

/* ---- the file's contents ------------------------------------------------- */

/* Word w of the file (its 8-byte index): never zero. */
static inline uint64_t gen(uint64_t w)
{
	uint64_t z = w + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (z ^ (z >> 31)) | 1;
}

struct tally {
	uint64_t sum;
	size_t bad;		/* 4 KiB blocks whose first word was wrong */
};

/* The reader: p holds bytes [off, off+len) of the file (4 KiB multiples). */
static void consume(const char *p, size_t len, uint64_t off, struct tally *t)
{
	uint64_t s = 0;
	size_t bad = 0;

	for (size_t o = 0; o < len; o += 4096) {
		const uint64_t *q = (const uint64_t *)(p + o);
		uint64_t first = q[0];

		bad += first != gen((off + o) / 8);
		if (sum_mode) {
			uint64_t a = 0, b = 0, c = 0, d = 0;

			for (size_t i = 0; i < 512; i += 4) {
				a += q[i];
				b += q[i + 1];
				c += q[i + 2];
				d += q[i + 3];
			}
			s += a + b + c + d;
		} else {
			s += first;
		}
	}
	t->sum += s;
	t->bad += bad;
}

static bool file_ok(int fd)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || (size_t)st.st_size != fsize)
		return false;
	for (int i = 0; i < 64; i++) {
		uint64_t w = (fsize / 8 - 1) / 63 * (uint64_t)i, v;

		if (pread(fd, &v, 8, (off_t)(w * 8)) != 8 || v != gen(w))
			return false;
	}
	return true;
}

static int make_file(void)
{
	size_t chunk = 4 * MIB;
	uint64_t *b;
	int fd;

	if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "pagein: mkdir %s: %s\n", dir, strerror(errno));
		return -1;
	}
	snprintf(path, sizeof(path), "%s/pagein-%zuM.dat", dir, fsize >> 20);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0 && file_ok(fd))
		return fd;
	if (fd >= 0)
		close(fd);
	fprintf(stderr, "pagein: writing %s (%zu MiB) ...\n", path, fsize >> 20);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	b = malloc(chunk);
	if (fd < 0 || !b) {
		fprintf(stderr, "pagein: %s: %s\n", path, strerror(errno));
		return -1;
	}
	for (size_t off = 0; off < fsize; off += chunk) {
		size_t n = fsize - off < chunk ? fsize - off : chunk;

		for (size_t i = 0; i < n / 8; i++)
			b[i] = gen(off / 8 + i);
		if (pwrite(fd, b, n, (off_t)off) != (ssize_t)n) {
			fprintf(stderr, "pagein: write %s: %s\n", path,
				strerror(errno));
			return -1;
		}
	}
	free(b);
	if (fsync(fd) < 0 || !file_ok(fd)) {
		fprintf(stderr, "pagein: %s: could not be written\n", path);
		return -1;
	}
	return fd;
}

/* ---- cold cache ------------------------------------------------------------ */

static size_t cached_pages(void)
{
	size_t n = (fsize + 4095) / 4096, in = 0;
	unsigned char *v = malloc(n);
	void *m = mmap(NULL, fsize, PROT_READ, MAP_SHARED, fd_buf, 0);

	if (v && m != MAP_FAILED && mincore(m, fsize, v) == 0)
		for (size_t i = 0; i < n; i++)
			in += v[i] & 1;
	if (m != MAP_FAILED)
		munmap(m, fsize);
	free(v);
	return in;
}

/*
 * Freed memory. Where the kernel has free page reporting (virtio-balloon;
 * the AMD EPYC VMs here: page_reporting_order 9), 2 MiB blocks the guest
 * frees go back to the host within seconds, and the next first touch of
 * them faults on the host: 5.7-6.7 us per 4 KiB against 2.0 us for memory
 * freed just before (docs/PERFORMANCE.md, Page-ins under churn). Which
 * contender got memory the previous one had just freed was then luck: it
 * moved mmap's CPU time for the same read by 20x between runs. So every
 * contender starts once reporting has caught up (--no-settle: at once):
 * fresh memory is then as cold for each as on a machine up for hours.
 */
static const char reported_path[] =
	"/sys/module/page_reporting/parameters/reported_kib";
static bool settle_free = true;

static long long reported_kib(void)
{
	long long v = -1;
	FILE *f = fopen(reported_path, "r");

	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* Wait until free page reporting has stood still for a second: it starts
 * 2 s after a free (the kernel's PAGE_REPORTING_DELAY). At most 20 s. */
static void settle(void)
{
	long long last = reported_kib(), now;
	int still = 0;

	if (!settle_free || last < 0)
		return;
	usleep(2500 * 1000);
	for (int t = 0; t < 70 && still < 4; t++) {
		usleep(250 * 1000);
		now = reported_kib();
		still = now == last ? still + 1 : 0;
		last = now;
	}
}

static void cold(void)
{
	size_t in;

	posix_fadvise(fd_buf, 0, 0, POSIX_FADV_DONTNEED);
	if (drop_all && geteuid() == 0) {
		int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);

		sync();
		if (fd < 0 || write(fd, "3\n", 2) != 2)
			drop_all = false;	/* not allowed here */
		if (fd >= 0)
			close(fd);
	}
	in = cached_pages();
	if (in)
		fprintf(stderr, "pagein: warning: %zu KiB of %s still cached\n",
			in * 4, path);
	if (drop_all)
		settle();
}

/* ---- clocks ------------------------------------------------------------------ */

static double cpu_s(void)	/* CPU time of the whole process */
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

/* CPU time of each thread of the process, by name (schedstat: ns on a
 * CPU): where a sparsebuf run's time goes (--verbose). */
#define MAX_THR 64
struct thr {
	int n;
	int tid[MAX_THR];
	char name[MAX_THR][20];
	double ms[MAX_THR];
};

static void threads_now(struct thr *t)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	char p[300], b[128];

	t->n = 0;
	while (d && (e = readdir(d)) && t->n < MAX_THR) {
		unsigned long long ns = 0;
		int tid = atoi(e->d_name);
		FILE *f;

		if (tid <= 0)
			continue;
		snprintf(p, sizeof(p), "/proc/self/task/%d/schedstat", tid);
		f = fopen(p, "r");
		if (!f)
			continue;
		if (fscanf(f, "%llu", &ns) != 1)
			ns = 0;
		fclose(f);
		snprintf(p, sizeof(p), "/proc/self/task/%d/comm", tid);
		f = fopen(p, "r");
		b[0] = 0;
		if (f) {
			if (!fgets(b, sizeof(b), f))
				b[0] = 0;
			fclose(f);
		}
		b[strcspn(b, "\n")] = 0;
		t->tid[t->n] = tid;
		snprintf(t->name[t->n], sizeof(t->name[0]), "%s",
			 tid == getpid() ? "reader" : b);
		t->ms[t->n++] = (double)ns / 1e6;
	}
	if (d)
		closedir(d);
}

static void threads_print(const struct thr *a, const struct thr *b,
			  double wall_ms)
{
	if (!verbose)
		return;
	printf("      threads (ms on CPU of %.0f ms):", wall_ms);
	for (int i = 0; i < b->n; i++) {
		double before = 0;

		for (int j = 0; j < a->n; j++)
			if (a->tid[j] == b->tid[i])
				before = a->ms[j];
		if (b->ms[i] - before >= 0.5)
			printf(" %s %.0f", b->name[i], b->ms[i] - before);
	}
	printf("\n");
}

static void on_alarm(int sig)
{
	char msg[160];
	int n = snprintf(msg, sizeof(msg),
			 "pagein: timeout in phase '%s' (a hang?)\n", phase);

	(void)sig;
	if (write(2, msg, (size_t)n) < 0) {
		/* nothing to do */
	}
	_exit(3);
}

static void watchdog(const char *what, unsigned s)
{
	phase = what;
	alarm(s);
}

/* ---- fio --------------------------------------------------------------------- */

static bool have_fio;

/* Bytes per second of a fio job on the file, or -1; *cpu: usr+sys %. */
static double fio_run(const char *rw, size_t bs, int depth, size_t io_size,
		      double *cpu)
{
	char out[4200], cmd[9000], *js = NULL, *p;
	double bw = -1, usr = 0, sys = 0;
	FILE *f;
	long n;

	snprintf(out, sizeof(out), "%s/pagein-fio.json", dir);
	snprintf(cmd, sizeof(cmd),
		 "fio --name=pagein --filename='%s' --readonly "
		 "--ioengine=io_uring --direct=1 --rw=%s --bs=%zu "
		 "--iodepth=%d --size=%zu --io_size=%zu --randrepeat=1 "
		 "--output-format=json --output='%s' >/dev/null 2>&1",
		 path, rw, bs, depth, fsize, io_size, out);
	if (system(cmd) != 0)
		return -1;
	f = fopen(out, "r");
	if (!f)
		return -1;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	js = calloc(1, (size_t)n + 1);
	if (js && fread(js, 1, (size_t)n, f) == (size_t)n) {
		/* jobs[0].read.bw_bytes; usr_cpu, sys_cpu of the job. */
		p = strstr(js, "\"jobs\"");
		p = p ? strstr(p, "\"read\"") : NULL;
		p = p ? strstr(p, "\"bw_bytes\"") : NULL;
		if (p && (p = strchr(p, ':')))
			bw = strtod(p + 1, NULL);
		p = strstr(js, "\"usr_cpu\"");
		if (p && (p = strchr(p, ':')))
			usr = strtod(p + 1, NULL);
		p = strstr(js, "\"sys_cpu\"");
		if (p && (p = strchr(p, ':')))
			sys = strtod(p + 1, NULL);
	}
	free(js);
	fclose(f);
	unlink(out);
	*cpu = usr + sys;
	return bw > 0 ? bw : -1;
}

/* ---- sparsebuf ------------------------------------------------------------------ */

static struct sb_pool *new_pool(size_t page, size_t max_bytes)
{
	struct sb_pool_opts o;
	struct sb_pool *pool;
	int err;

	sb_pool_opts_init(&o);
	o.page_size = page;
	if (o.heap_size < page || o.heap_size % page)
		o.heap_size = page > 64 * MIB ? page : 64 * MIB;
	o.max_bytes = max_bytes;
	o.spill_dir = dir;
	pool = sb_pool_create(&o, &err);
	if (!pool) {
		fprintf(stderr, "pagein: sb_pool_create: %s\n", strerror(-err));
		exit(1);
	}
	return pool;
}

static struct sb_buf *open_buf(struct sb_pool *pool)
{
	int err;
	struct sb_buf *buf = sb_buf_open_file(pool, path, 0, fsize, 0, &err);

	if (!buf) {
		fprintf(stderr, "pagein: sb_buf_open_file: %s\n", strerror(-err));
		exit(1);
	}
	return buf;
}

static void delta(struct sb_stats *d, const struct sb_stats *a,
		  const struct sb_stats *b)
{
	*d = *b;
	d->faults -= a->faults;
	d->maps -= a->maps;
	d->fault_places -= a->fault_places;
	d->pages_in -= a->pages_in;
	d->pages_out -= a->pages_out;
	d->bytes_read -= a->bytes_read;
	d->bytes_written -= a->bytes_written;
	d->io_errors -= a->io_errors;
	d->sigbus -= a->sigbus;
	d->pages_dropped -= a->pages_dropped;
	d->sync_prepares -= a->sync_prepares;
}

struct run {
	double bps;		/* bytes per second */
	double cpu;		/* CPU seconds of the process */
	struct sb_stats st;	/* counters of the run (sparsebuf) */
	struct tally t;
};

/* A timed sparsebuf run over the file: a cold cache, a new pool, the
 * counters and clocks started, the file opened as a buffer (timed too). */
struct sb_run {
	struct sb_pool *pool;
	struct sb_buf *buf;
	struct sb_stats s0;
	struct thr ta;
	double t0, c0;
};

static char *sb_run_begin(struct sb_run *k, size_t page, size_t budget,
			  struct run *r)
{
	k->pool = new_pool(page, budget);
	memset(r, 0, sizeof(*r));
	cold();
	sb_pool_stats(k->pool, &k->s0);
	threads_now(&k->ta);
	k->c0 = cpu_s();
	k->t0 = bench_now_us();
	k->buf = open_buf(k->pool);
	return sb_buf_addr(k->buf);
}

/* Stop the clocks after bytes were read; counters into r; tear down. */
static void sb_run_end(struct sb_run *k, size_t bytes, struct run *r)
{
	struct sb_stats s1;
	struct thr tb;

	r->bps = (double)bytes / (bench_now_us() - k->t0) * 1e6;
	r->cpu = cpu_s() - k->c0;
	threads_now(&tb);
	threads_print(&k->ta, &tb, (double)bytes / r->bps * 1e3);
	sb_pool_stats(k->pool, &s1);
	delta(&r->st, &k->s0, &s1);
	sb_buf_destroy(k->buf);
	sb_pool_destroy(k->pool);
}

/* One cold sequential read through a file-backed buffer. */
static void seq_sb(size_t page, size_t budget, struct run *r)
{
	struct sb_run run;

	consume(sb_run_begin(&run, page, budget, r), fsize, 0, &r->t);
	sb_run_end(&run, fsize, r);
}

/* The mmap baselines' start: a cold cache, the clocks, the file mapped. */
static char *mmap_cold(struct run *r, double *t0, double *c0)
{
	char *m;

	memset(r, 0, sizeof(*r));
	cold();
	*c0 = cpu_s();
	*t0 = bench_now_us();
	m = mmap(NULL, fsize, PROT_READ, MAP_SHARED, fd_buf, 0);
	if (m == MAP_FAILED) {
		perror("pagein: mmap");
		exit(1);
	}
	return m;
}

static void seq_mmap(struct run *r)
{
	double t0, c0;
	char *m = mmap_cold(r, &t0, &c0);

	consume(m, fsize, 0, &r->t);
	r->bps = (double)fsize / (bench_now_us() - t0) * 1e6;
	r->cpu = cpu_s() - c0;
	munmap(m, fsize);
}

/*
 * The device into memory the process keeps: the file read with io_uring,
 * O_DIRECT, fio's block size and depth 16, into a fresh anonymous mapping
 * of its size, then the same reader over it. fio reads into its 16 buffers
 * again and again and never lands the file in memory; every way of having
 * the file in memory (ours, mmap's page cache, this) first touches as
 * many fresh pages as the file has. On a VM whose host backs the guest's
 * memory 4 KiB at a time and takes back what the guest frees (free page
 * reporting), a fresh page can cost the guest microseconds the first time
 * (docs/PERFORMANCE.md, "Sequential page-in against the device into fresh
 * memory"): this row says what that leaves of fio's rate on the machine at
 * hand.
 */
static size_t seq_fio_bs(void);

static void seq_direct(struct run *r)
{
	size_t bs = seq_fio_bs(), next = 0, done = 0;
	unsigned inflight = 0;
	struct io_uring ring;
	double t0, c0;
	char *m;
	int fd, err;

	memset(r, 0, sizeof(*r));
	r->bps = -1;	/* n/a, unless it runs */
	cold();
	fd = open(path, O_RDONLY | O_DIRECT);
	if (fd < 0) {
		fprintf(stderr, "pagein: direct read: %s: %s\n", path,
			strerror(errno));
		return;
	}
	err = io_uring_queue_init(16, &ring, 0);
	if (err < 0) {
		fprintf(stderr, "pagein: direct read: io_uring: %s\n",
			strerror(-err));
		close(fd);
		return;
	}
	c0 = cpu_s();
	t0 = bench_now_us();
	m = mmap(NULL, fsize, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		perror("pagein: direct read: mmap");
		exit(1);
	}
	while (done < fsize) {
		struct io_uring_cqe *cqe;
		struct io_uring_sqe *sqe;

		/* Depth 16, as fio's: a read enters as one completes. */
		while (next < fsize && inflight < 16 &&
		       (sqe = io_uring_get_sqe(&ring))) {
			size_t n = fsize - next < bs ? fsize - next : bs;

			io_uring_prep_read(sqe, fd, m + next, (unsigned)n,
					   (uint64_t)next);
			io_uring_sqe_set_data64(sqe, n);
			next += n;
			inflight++;
		}
		err = io_uring_submit_and_wait(&ring, 1);
		if (err >= 0)
			err = io_uring_peek_cqe(&ring, &cqe);
		/* A short read: the file changed under the benchmark. */
		if (err == 0 &&
		    (uint64_t)cqe->res != io_uring_cqe_get_data64(cqe))
			err = cqe->res < 0 ? cqe->res : -EIO;
		if (err < 0) {
			fprintf(stderr, "pagein: direct read: %s\n",
				strerror(-err));
			exit(1);
		}
		done += (size_t)cqe->res;
		inflight--;
		io_uring_cqe_seen(&ring, cqe);
	}
	consume(m, fsize, 0, &r->t);
	r->bps = (double)fsize / (bench_now_us() - t0) * 1e6;
	r->cpu = cpu_s() - c0;
	munmap(m, fsize);
	io_uring_queue_exit(&ring);
	close(fd);
}

/* ---- random ------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng(void)
{
	uint64_t x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

/* The first n of a seeded random permutation of [0, total). */
static size_t *perm(size_t total, size_t n, uint64_t seed)
{
	size_t *all = malloc(total * sizeof(*all));

	if (!all)
		abort();
	rng_state = seed;
	for (size_t i = 0; i < total; i++)
		all[i] = i;
	for (size_t i = 0; i < n && i < total; i++) {
		size_t j = i + (size_t)(rng() % (total - i)), t = all[i];

		all[i] = all[j];
		all[j] = t;
	}
	return all;
}

/* The random test's pool budget: a quarter of the blocks, at least 8 MiB.
 * Like fio's 32 buffers, a bounded pool recycles its pages (clean file
 * pages are dropped, nothing written): the steady state of a reader that
 * streams more than it keeps. */
static size_t rand_budget(size_t n)
{
	return n * RAND_BS / 4 > 8 * MIB ? n * RAND_BS / 4 : 8 * MIB;
}

/* How rand_sb fetches: not at all (the faults read), one batch at a time
 * with SB_PREFETCH_WAIT, or pipelined (batch i+1 queued without waiting
 * before batch i is touched; a touch of a page still being read waits for
 * that read): what a caller with a predictor one step ahead does. */
enum { RS_TOUCH, RS_WAIT, RS_PIPE };

static long rand_prefetch(struct sb_buf *buf, const size_t *blk, size_t n,
			  size_t i, unsigned flags)
{
	struct sb_range rg[RAND_BATCH];
	size_t k;
	long q;

	if (i >= n)
		return 0;
	k = n - i < RAND_BATCH ? n - i : RAND_BATCH;
	for (size_t j = 0; j < k; j++)
		rg[j] = (struct sb_range){blk[i + j] * RAND_BS, RAND_BS};
	q = sb_buf_prefetch(buf, rg, k, flags);
	if (q < 0) {
		fprintf(stderr, "pagein: sb_buf_prefetch: %s\n", strerror((int)-q));
		exit(1);
	}
	return q;
}

static void rand_sb(const size_t *blk, size_t n, int mode, size_t budget,
		    struct run *r)
{
	struct sb_run run;
	char *base = sb_run_begin(&run, RAND_BS, budget, r);
	struct sb_buf *buf = run.buf;

	if (mode == RS_PIPE)
		rand_prefetch(buf, blk, n, 0, 0);
	for (size_t i = 0; i < n; i += RAND_BATCH) {
		size_t k = n - i < RAND_BATCH ? n - i : RAND_BATCH;

		if (mode == RS_WAIT)
			rand_prefetch(buf, blk, n, i, SB_PREFETCH_WAIT);
		else if (mode == RS_PIPE)
			rand_prefetch(buf, blk, n, i + RAND_BATCH, 0);
		for (size_t j = 0; j < k; j++)
			consume(base + blk[i + j] * RAND_BS, RAND_BS,
				blk[i + j] * RAND_BS, &r->t);
	}
	sb_run_end(&run, n * RAND_BS, r);
}

static void rand_mmap(const size_t *blk, size_t n, bool willneed,
		      struct run *r)
{
	double t0, c0;
	char *m = mmap_cold(r, &t0, &c0);

	for (size_t i = 0; i < n; i += RAND_BATCH) {
		size_t k = n - i < RAND_BATCH ? n - i : RAND_BATCH;

		for (size_t j = 0; willneed && j < k; j++)
			madvise(m + blk[i + j] * RAND_BS, RAND_BS,
				MADV_WILLNEED);
		for (size_t j = 0; j < k; j++)
			consume(m + blk[i + j] * RAND_BS, RAND_BS,
				blk[i + j] * RAND_BS, &r->t);
	}
	r->bps = (double)(n * RAND_BS) / (bench_now_us() - t0) * 1e6;
	r->cpu = cpu_s() - c0;
	munmap(m, fsize);
}

/* ---- evict and page back in ------------------------------------------------------- */

enum { EV_OUT, EV_SEQ, EV_RAND, EV_PREFETCH, EV_N };
static const char *const ev_name[EV_N] = {
	"evict", "page-in, touch in order", "page-in, touch random order",
	"page-in, one sb_buf_prefetch WAIT"};

struct ev_run {
	double us[EV_N];	/* per page */
	struct sb_stats st[EV_N];
	size_t bad;
};

/* The buffer's contents: word w of the buffer holds gen(w) ^ key. */
static void fill(char *p, size_t len, uint64_t key)
{
	uint64_t *q = (uint64_t *)p;

	for (size_t w = 0; w < len / 8; w++)
		q[w] = gen(w) ^ key;
}

static size_t check(const char *p, size_t off, size_t len, uint64_t key)
{
	size_t bad = 0;

	for (size_t o = 0; o < len; o += 4096)
		bad += *(const uint64_t *)(p + off + o) != (gen((off + o) / 8) ^ key);
	return bad;
}

static void evict_sb(const size_t *order, struct ev_run *r)
{
	struct sb_pool *pool = new_pool(evict_page, 0);
	size_t np = evict_size / evict_page;
	struct sb_stats s0, s1;
	struct sb_buf *buf;
	double t0;
	char *p;
	int err;
	long n;

	memset(r, 0, sizeof(*r));
	buf = sb_buf_create(pool, evict_size, 0, &err);
	if (!buf || sb_buf_map(buf, 0, evict_size) < 0) {
		fprintf(stderr, "pagein: evict buffer: %s\n",
			strerror(buf ? ENOMEM : -err));
		exit(1);
	}
	p = sb_buf_addr(buf);
	fill(p, evict_size, 0x5a5a);
	/* Set the disk tier up (I/O engine, spill file) before timing: one
	 * page out and back in. */
	if (sb_buf_evict(buf, evict_size - evict_page, evict_page) != 1) {
		fprintf(stderr, "pagein: sb_buf_evict failed\n");
		exit(1);
	}
	r->bad += check(p, evict_size - evict_page, evict_page, 0x5a5a);
	for (int m = EV_SEQ; m < EV_N; m++) {
		sb_pool_stats(pool, &s0);
		t0 = bench_now_us();
		n = sb_buf_evict(buf, 0, evict_size);
		if (n < 0 || (size_t)n != np) {
			fprintf(stderr, "pagein: sb_buf_evict: %ld of %zu\n", n, np);
			exit(1);
		}
		if (m == EV_SEQ) {	/* the write-out, timed once */
			r->us[EV_OUT] = (bench_now_us() - t0) / (double)np;
			sb_pool_stats(pool, &s1);
			delta(&r->st[EV_OUT], &s0, &s1);
		}
		if (drop_all && geteuid() == 0)
			cold();	/* the spill file is O_DIRECT; in case not */
		sb_pool_stats(pool, &s0);
		t0 = bench_now_us();
		if (m == EV_SEQ) {
			for (size_t i = 0; i < np; i++)
				r->bad += check(p, i * evict_page, evict_page, 0x5a5a);
		} else if (m == EV_RAND) {
			for (size_t i = 0; i < np; i++)
				r->bad += check(p, order[i] * evict_page,
						evict_page, 0x5a5a);
		} else {
			struct sb_range all = {0, evict_size};

			if (sb_buf_prefetch(buf, &all, 1, SB_PREFETCH_WAIT) < 0) {
				fprintf(stderr, "pagein: sb_buf_prefetch failed\n");
				exit(1);
			}
		}
		r->us[m] = (bench_now_us() - t0) / (double)np;
		sb_pool_stats(pool, &s1);
		delta(&r->st[m], &s0, &s1);
		if (m == EV_PREFETCH)
			r->bad += check(p, 0, evict_size, 0x5a5a);
	}
	sb_buf_destroy(buf);
	sb_pool_destroy(pool);
}

/* The same by hand: anonymous memory, pwrite + MADV_DONTNEED out, pread
 * back (O_DIRECT, one page at a time, no read-ahead). */
static void evict_diy(const size_t *order, struct ev_run *r)
{
	size_t np = evict_size / evict_page;
	char tmp[4200];
	double t0;
	char *p;
	int fd;

	memset(r, 0, sizeof(*r));
	snprintf(tmp, sizeof(tmp), "%s/pagein-diy.XXXXXX", dir);
	fd = mkstemp(tmp);
	if (fd >= 0 && fcntl(fd, F_SETFL, O_DIRECT) < 0) {
		close(fd);
		fd = -1;
	}
	p = mmap(NULL, evict_size, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (fd < 0 || p == MAP_FAILED) {
		fprintf(stderr, "pagein: %s: %s\n", tmp, strerror(errno));
		exit(1);
	}
	unlink(tmp);
	fill(p, evict_size, 0x5a5a);
	for (int m = EV_SEQ; m < EV_N; m++) {
		t0 = bench_now_us();
		for (size_t i = 0; i < np; i++) {
			if (pwrite(fd, p + i * evict_page, evict_page,
				   (off_t)(i * evict_page)) != (ssize_t)evict_page) {
				perror("pagein: pwrite");
				exit(1);
			}
			madvise(p + i * evict_page, evict_page, MADV_DONTNEED);
		}
		if (m == EV_SEQ)
			r->us[EV_OUT] = (bench_now_us() - t0) / (double)np;
		t0 = bench_now_us();
		for (size_t i = 0; i < np; i++) {
			size_t at = (m == EV_RAND ? order[i] : i) * evict_page;

			if (pread(fd, p + at, evict_page, (off_t)at) !=
			    (ssize_t)evict_page) {
				perror("pagein: pread");
				exit(1);
			}
			if (m != EV_PREFETCH)
				r->bad += check(p, at, evict_page, 0x5a5a);
		}
		r->us[m] = (bench_now_us() - t0) / (double)np;
		if (m == EV_PREFETCH)
			r->bad += check(p, 0, evict_size, 0x5a5a);
	}
	munmap(p, evict_size);
	close(fd);
}

/* ---- the table ------------------------------------------------------------------- */

static int fails;

static double med(const double *v, int n)
{
	double c[MAX_REPS];

	memcpy(c, v, (size_t)n * sizeof(*v));
	return median(c, n);
}

static void spread(const double *v, int n, double scale, char *out, size_t sz)
{
	double lo = v[0], hi = v[0];

	for (int i = 1; i < n; i++) {
		lo = v[i] < lo ? v[i] : lo;
		hi = v[i] > hi ? v[i] : hi;
	}
	snprintf(out, sz, scale < 1 ? "%.0f-%.0f" : "%.2f-%.2f", lo * scale,
		 hi * scale);
}

static void header(void)
{
	printf("\n%-34s %-24s %8s %8s %8s %8s %s\n", "test (MB/s)", "baseline",
	       "base", "ours", "ratio", "target", "result");
}

/* A row, values in MB/s (higher is better): PASS when ours / base >=
 * target; target <= 0: report only; base <= 0: baseline unavailable. */
static void row(const char *test, const char *bl, double base, double ours,
		double target)
{
	char b[32], tg[16], res[8];
	double ratio = base > 0 ? ours / base : 0;

	snprintf(b, sizeof(b), base > 0 ? "%.0f" : "n/a", base / 1e6);
	snprintf(tg, sizeof(tg), target > 0 ? ">=%.2fx" : "report", target);
	if (target <= 0)
		res[0] = 0;
	else if (base <= 0)
		snprintf(res, sizeof(res), "SKIP");
	else
		snprintf(res, sizeof(res), "%s", ratio >= target ? "PASS" : "FAIL");
	if (target > 0 && base > 0 && ratio < target)
		fails++;
	printf("%-34s %-24s %8s %8.0f %7.2fx %8s %s\n", test, bl, b, ours / 1e6,
	       ratio, tg, res);
}

/* CPU seconds per GiB read, ours against mmap's: at most `limit` times. */
static void cpu_row(double base, double ours, double limit)
{
	double ratio = base > 0 ? ours / base : 0;
	bool pass = ratio <= limit;
	char tg[16];

	if (base > 0 && !pass)
		fails++;
	snprintf(tg, sizeof(tg), "<=%.2fx", limit);
	printf("%-34s %-24s %8.2f %8.2f %7.2fx %8s %s\n",
	       "seq, CPU s per GiB read", "mmap + read-ahead", base, ours, ratio,
	       tg, base <= 0 ? "SKIP" : pass ? "PASS" : "FAIL");
}

/* ---- the parts --------------------------------------------------------------------- */

static bool sb_env_is(const char *name, const char *value)
{
	const char *v = getenv(name);

	return v && !strcmp(v, value);
}

struct seq_res {
	double fio[MAX_REPS], sb[MAX_REPS], mm[MAX_REPS], bud[MAX_REPS];
	double sbcpu[MAX_REPS], mmcpu[MAX_REPS];	/* s per GiB read */
	double direct[MAX_REPS], dcpu[MAX_REPS];	/* into fresh memory */
	bool fio_ok;
};

/* fio's block size for the sequential row: 1 MiB (the target's), or the
 * page size when pages are larger (up to 4 MiB: 16 such reads in flight
 * are 64 MiB of fio's buffers), so that neither side reads in larger
 * requests than the other. */
static size_t seq_fio_bs(void)
{
	return seq_page <= MIB ? MIB : seq_page <= 4 * MIB ? seq_page : 4 * MIB;
}

static const char *seq_fio_name(void)
{
	static char s[48];

	snprintf(s, sizeof(s), "fio io_uring %zuM x16", seq_fio_bs() >> 20);
	return s;
}

static void print_counters(const char *what, const struct run *r)
{
	printf("    %s: faults %" PRIu64 ", pages_in %" PRIu64 ", bytes_read %"
	       PRIu64 " MiB, fault_places %" PRIu64 ", pages_dropped %" PRIu64
	       ", io_errors %" PRIu64 ", sigbus %" PRIu64 "\n",
	       what, r->st.faults, r->st.pages_in, r->st.bytes_read >> 20,
	       r->st.fault_places, r->st.pages_dropped, r->st.io_errors,
	       r->st.sigbus);
}

static void check_tally(const char *what, const struct tally *t)
{
	if (t->bad) {
		printf("    %s: %zu blocks read WRONG data\n", what, t->bad);
		fails++;
	}
}

static void part_seq(struct seq_res *R)
{
	struct run r, rb, rm, rd;
	double fcpu = 0, sbcpu;

	printf("\nsequential: %zu MiB, sparsebuf pages of %zu KiB%s, fio bs %zu "
	       "MiB depth 16, reader: %s\n",
	       fsize >> 20, seq_page >> 10,
	       sb_env_is("SPARSEBUF_HUGETLB", "1") ? " (SPARSEBUF_HUGETLB=1)"
						   : "",
	       seq_fio_bs() >> 20,
	       sum_mode ? "sum of every word" : "one word per 4 KiB");
	R->fio_ok = have_fio;
	for (int i = 0; i < reps; i++) {
		watchdog("sequential fio", 600);
		cold();
		R->fio[i] = have_fio ? fio_run("read", seq_fio_bs(), 16, fsize,
					       &fcpu)
				     : -1;
		if (R->fio[i] < 0)
			R->fio_ok = false;
		watchdog("sequential sparsebuf", 600);
		seq_sb(seq_page, 0, &r);
		R->sb[i] = r.bps;
		sbcpu = r.cpu;
		check_tally("sparsebuf", &r.t);
		watchdog("sequential mmap", 600);
		seq_mmap(&rm);
		R->mm[i] = rm.bps;
		R->sbcpu[i] = sbcpu / ((double)fsize / GIB);
		R->mmcpu[i] = rm.cpu / ((double)fsize / GIB);
		check_tally("mmap", &rm.t);
		watchdog("sequential direct into fresh memory", 600);
		seq_direct(&rd);
		R->direct[i] = rd.bps;
		R->dcpu[i] = rd.cpu / ((double)fsize / GIB);
		check_tally("direct", &rd.t);
		watchdog("sequential sparsebuf with a budget", 600);
		seq_sb(seq_page, fsize / 4, &rb);
		R->bud[i] = rb.bps;
		check_tally("sparsebuf (budget)", &rb.t);
		printf("  rep %d: fio %.0f MB/s (cpu %.0f%%), sparsebuf %.0f MB/s "
		       "(cpu %.2f s), mmap %.0f MB/s (cpu %.2f s), direct into "
		       "fresh memory %.0f MB/s (cpu %.2f s; -1: n/a), sparsebuf "
		       "budget 1/4 %.0f MB/s\n",
		       i + 1, R->fio[i] / 1e6, fcpu, r.bps / 1e6, sbcpu,
		       rm.bps / 1e6, rm.cpu, rd.bps > 0 ? rd.bps / 1e6 : -1.0,
		       rd.cpu, rb.bps / 1e6);
		if (i == 0) {
			print_counters("sparsebuf", &r);
			print_counters("budget 1/4", &rb);
		}
		fflush(stdout);
	}
	alarm(0);
}

struct rand_res {
	double fio[MAX_REPS], sb[MAX_REPS], pipe[MAX_REPS], mm[MAX_REPS];
	double wn[MAX_REPS], bud[MAX_REPS];
	size_t budget;
	double touch[MAX_REPS], amp[MAX_REPS];
	bool fio_ok;
	size_t n;
};

static void part_rand(struct rand_res *R)
{
	size_t total = fsize / RAND_BS;
	size_t n = rand_blocks ? rand_blocks : total / 4;
	struct run r, rp, rb, rm, rw, rt;
	double fcpu = 0;
	size_t *blk;

	if (n > total)
		n = total;
	R->n = n;
	R->budget = rand_budget(n);
	blk = perm(total, n, 42);
	printf("\nrandom: %zu blocks of 64 KiB (%zu MiB) of %zu, sparsebuf "
	       "prefetch %d at a time (64 KiB pages; WAIT each batch, or pipelined: the\n"
	       "next batch queued before this one is touched), fio randread depth 32\n",
	       n, n * RAND_BS >> 20, total, RAND_BATCH);
	R->fio_ok = have_fio;
	for (int i = 0; i < reps; i++) {
		watchdog("random fio", 600);
		cold();
		R->fio[i] = have_fio ? fio_run("randread", RAND_BS, 32,
					       n * RAND_BS, &fcpu)
				     : -1;
		if (R->fio[i] < 0)
			R->fio_ok = false;
		watchdog("random sparsebuf", 600);
		rand_sb(blk, n, RS_WAIT, 0, &r);
		R->sb[i] = r.bps;
		check_tally("sparsebuf", &r.t);
		watchdog("random sparsebuf pipelined", 600);
		rand_sb(blk, n, RS_PIPE, 0, &rp);
		R->pipe[i] = rp.bps;
		check_tally("sparsebuf pipelined", &rp.t);
		watchdog("random sparsebuf pipelined, budget", 600);
		rand_sb(blk, n, RS_PIPE, R->budget, &rb);
		R->bud[i] = rb.bps;
		check_tally("sparsebuf pipelined, budget", &rb.t);
		watchdog("random mmap", 900);
		rand_mmap(blk, n, false, &rm);
		R->mm[i] = rm.bps;
		check_tally("mmap", &rm.t);
		watchdog("random mmap WILLNEED", 900);
		rand_mmap(blk, n, true, &rw);
		R->wn[i] = rw.bps;
		check_tally("mmap WILLNEED", &rw.t);
		watchdog("random sparsebuf touch", 900);
		rand_sb(blk, n, RS_TOUCH, 0, &rt);
		R->touch[i] = rt.bps;
		R->amp[i] = (double)rt.st.bytes_read / (double)(n * RAND_BS);
		check_tally("sparsebuf touch", &rt.t);
		printf("  rep %d: fio %.0f MB/s (cpu %.0f%%), sparsebuf WAIT %.0f "
		       "MB/s (cpu %.2f s), pipelined %.0f MB/s (cpu %.2f s), "
		       "pipelined with budget %.0f MB/s (cpu %.2f s), mmap "
		       "%.0f MB/s, mmap+WILLNEED %.0f MB/s, sparsebuf touch only "
		       "%.0f MB/s (read %.2fx)\n",
		       i + 1, R->fio[i] / 1e6, fcpu, r.bps / 1e6, r.cpu,
		       rp.bps / 1e6, rp.cpu, rb.bps / 1e6, rb.cpu, rm.bps / 1e6,
		       rw.bps / 1e6, rt.bps / 1e6, R->amp[i]);
		if (i == 0) {
			print_counters("sparsebuf", &r);
			print_counters("pipelined", &rp);
			print_counters("with budget", &rb);
			print_counters("touch only", &rt);
		}
		fflush(stdout);
	}
	alarm(0);
	free(blk);
}

struct ev_res {
	double sb[EV_N][MAX_REPS], diy[EV_N][MAX_REPS];
	struct ev_run first;
};

static void part_evict(struct ev_res *R)
{
	size_t np = evict_size / evict_page;
	size_t *order = perm(np, np, 7);
	struct ev_run r;

	printf("\nevict and page back in: %zu MiB in %zu pages of %zu KiB, spill "
	       "in %s\n",
	       evict_size >> 20, np, evict_page >> 10, dir);
	for (int i = 0; i < reps; i++) {
		watchdog("evict sparsebuf", 600);
		evict_sb(order, &r);
		if (i == 0)
			R->first = r;
		if (r.bad) {
			printf("    sparsebuf: %zu blocks read back WRONG\n", r.bad);
			fails++;
		}
		for (int m = 0; m < EV_N; m++)
			R->sb[m][i] = r.us[m];
		watchdog("evict by hand", 600);
		evict_diy(order, &r);
		if (r.bad) {
			printf("    by hand: %zu blocks read back WRONG\n", r.bad);
			fails++;
		}
		for (int m = 0; m < EV_N; m++)
			R->diy[m][i] = r.us[m];
		printf("  rep %d: us/page sparsebuf / by hand:", i + 1);
		for (int m = 0; m < EV_N; m++)
			printf(" %s %.1f/%.1f", m == EV_OUT ? "out" : m == EV_SEQ ? "in-seq" : m == EV_RAND ? "in-rand" : "in-prefetch",
			       R->sb[m][i], R->diy[m][i]);
		printf("\n");
	}
	alarm(0);
	for (int m = 0; m < EV_N; m++) {
		const struct sb_stats *s = &R->first.st[m];

		printf("    %-34s pages_out %" PRIu64 ", bytes_written %" PRIu64
		       " MiB, pages_in %" PRIu64 ", bytes_read %" PRIu64
		       " MiB, faults %" PRIu64 "\n",
		       ev_name[m], s->pages_out, s->bytes_written >> 20,
		       s->pages_in, s->bytes_read >> 20, s->faults);
	}
	free(order);
}

/* ---- one run for perf (bench/pagein-perf.sh) ---------------------------------------- */

static int run_one(const char *what, const char *fifo)
{
	struct sb_pool *pool = NULL;
	struct sb_stats s0, s1, d;
	struct sb_buf *buf = NULL;
	struct tally t = {0};
	double t0, secs;
	char *p;

	if (!strcmp(what, "rand") || !strcmp(what, "rand-budget")) {
		/* The random test's target row alone (pipelined prefetch),
		 * or its budget row (a quarter of the blocks). */
		size_t total = fsize / RAND_BS;
		size_t n = rand_blocks ? rand_blocks : total / 4;
		size_t *blk = perm(total, n, 42);
		size_t budget = strcmp(what, "rand") ? rand_budget(n) : 0;
		struct run r;

		rand_sb(blk, n, RS_PIPE, budget, &r);
		printf("what=rand\nbytes=%zu\nMBps=%.0f\ncpu=%.2f\nbad=%zu\n"
		       "pages_in=%" PRIu64 "\nsync_prepares=%" PRIu64 "\n",
		       n * RAND_BS, r.bps / 1e6, r.cpu, r.t.bad, r.st.pages_in,
		       r.st.sync_prepares);
		free(blk);
		return r.t.bad != 0;
	}
	cold();
	if (!strcmp(what, "sb")) {
		pool = new_pool(seq_page, 0);
		buf = open_buf(pool);
		p = sb_buf_addr(buf);
		sb_pool_stats(pool, &s0);
	} else {
		p = mmap(NULL, fsize, PROT_READ, MAP_SHARED, fd_buf, 0);
		if (p == MAP_FAILED)
			return 1;
	}
	fprintf(stderr, "ranges=%p %p\n", (void *)p, (void *)(p + fsize));
	if (fifo) {
		char go;
		int f = open(fifo, O_RDONLY);

		if (f < 0 || read(f, &go, 1) < 0)
			return 1;
		close(f);
	}
	t0 = bench_now_us();
	consume(p, fsize, 0, &t);
	secs = (bench_now_us() - t0) * 1e-6;
	printf("what=%s\nbytes=%zu\npage_size=%zu\nseconds=%.3f\nMBps=%.0f\n"
	       "bad=%zu\n",
	       what, fsize, pool ? seq_page : 4096, secs,
	       (double)fsize / secs / 1e6, t.bad);
	if (pool) {
		sb_pool_stats(pool, &s1);
		delta(&d, &s0, &s1);
		printf("faults=%" PRIu64 "\nmaps=%" PRIu64 "\npages_in=%" PRIu64
		       "\nbytes_read=%" PRIu64 "\nfault_places=%" PRIu64
		       "\nunmaps=%" PRIu64 "\n",
		       d.faults, d.maps, d.pages_in, d.bytes_read,
		       d.fault_places, s1.unmaps - s0.unmaps);
		sb_buf_destroy(buf);
		sb_pool_destroy(pool);
	} else {
		munmap(p, fsize);
	}
	return t.bad ? 1 : 0;
}

/* ---- main --------------------------------------------------------------------------- */

enum {
	OPT_DIR = 1, OPT_SIZE, OPT_QUICK, OPT_REPS, OPT_PAGE, OPT_TOUCH,
	OPT_NO_DROP, OPT_SWEEP, OPT_ONLY, OPT_RAND_BLOCKS, OPT_EVICT_SIZE,
	OPT_VERBOSE, OPT_RUN, OPT_WAIT, OPT_NO_SETTLE, OPT_FILE_BYTES,
};

static const struct sbc_opt opts[] = {
	{OPT_DIR, "--dir", "D", "where the file is made (default "
				"/var/tmp/sparsebuf-bench)"},
	{OPT_SIZE, "--size", "SIZE", "the file: 4M or more, whole MiB "
				     "(default 2G)"},
	{OPT_QUICK, "--quick", NULL, "64 MiB, one rep: a smoke run of "
				     "seconds"},
	{OPT_REPS, "--reps", "N", "repetitions, 1 to 32 (default 3)"},
	{OPT_PAGE, "--page-size", "SIZE", "sequential pages, a power of two "
					  ">= 4K (default 1M)"},
	{OPT_TOUCH, "--touch", "word|sum", "what the reader does (default "
					   "word)"},
	{OPT_NO_DROP, "--no-drop-caches", NULL, "leave the machine's page "
						"cache alone"},
	{OPT_NO_SETTLE, "--no-settle", NULL, "start each run at once, not "
					     "once free page reporting has "
					     "settled"},
	{OPT_SWEEP, "--sweep", NULL, "sequential sparsebuf at 64K..4M pages"},
	{OPT_ONLY, "--only", "seq,rand,evict", "run only these parts"},
	{OPT_RAND_BLOCKS, "--rand-blocks", "N", "random blocks (default a "
						"quarter of the file)"},
	{OPT_EVICT_SIZE, "--evict-size", "SIZE", "evicted: whole 256K pages "
						 "(default 256M)"},
	{OPT_VERBOSE, "--verbose", NULL, "CPU time of every thread"},
	{OPT_RUN, "--run", "sb|mmap|rand|rand-budget", "one cold run, "
						       "key=value on stdout"},
	{OPT_WAIT, "--wait", "FIFO", "with --run sb|mmap: wait for a byte "
				     "from FIFO first"},
	{OPT_FILE_BYTES, "--file-bytes", NULL, "print the file's size in "
					       "bytes for these options and "
					       "exit (bench/pagein.sh)"},
	{0},
};

int main(int argc, char **argv)
{
	static const char *const touches[] = {"word", "sum", NULL};
	static const char *const parts[] = {"seq", "rand", "evict", NULL};
	static const char *const runs[] = {"sb", "mmap", "rand",
					   "rand-budget", NULL};
	struct sbc cli = {
		.prog = "pagein",
		.usage = "[options]\n--run sb|mmap|rand|rand-budget [--wait "
			 "FIFO] [--dir D] [--size S] [--page-size P]",
		.about = "The disk tier against fio and the kernel's mmap: "
			 "sequential, random and evict\nruns from a cold "
			 "cache, one table of ratios and targets. Exit status "
			 "3 when a\ntarget is missed.",
		.opts = opts,
	};
	const char *run = NULL, *fifo = NULL, *val;
	bool size_set = false, reps_set = false, evict_set = false;
	bool file_bytes = false;
	struct seq_res *sq = calloc(1, sizeof(*sq));
	struct rand_res *rd = calloc(1, sizeof(*rd));
	struct ev_res *ev = calloc(1, sizeof(*ev));
	char rak[64] = "?";
	int opt, part[3], n;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &val)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			sbc_fail(&cli, "unexpected argument '%s'", val);
		case OPT_QUICK:
			quick = true;
			break;
		case OPT_NO_DROP:
			drop_all = false;
			break;
		case OPT_NO_SETTLE:
			settle_free = false;
			break;
		case OPT_SWEEP:
			sweep = true;
			break;
		case OPT_VERBOSE:
			verbose = true;
			break;
		case OPT_FILE_BYTES:
			file_bytes = true;
			break;
		case OPT_DIR:
			dir = val;
			break;
		case OPT_SIZE:
			fsize = sbc_size(&cli, val, 4 * MIB, (size_t)1 << 44);
			if (fsize % MIB)
				sbc_fail(&cli, "--size: %s is not whole MiB",
					 val);
			size_set = true;
			break;
		case OPT_REPS:
			reps = (int)sbc_int(&cli, val, 1, MAX_REPS);
			reps_set = true;
			break;
		case OPT_PAGE:
			seq_page = sbc_size(&cli, val, 4096, GIB);
			if (seq_page & (seq_page - 1))
				sbc_fail(&cli, "--page-size: %s is not a power "
					 "of two", val);
			break;
		case OPT_RAND_BLOCKS:
			rand_blocks = sbc_size(&cli, val, 1, (size_t)1 << 32);
			break;
		case OPT_EVICT_SIZE:
			evict_size = sbc_size(&cli, val, evict_page,
					      (size_t)1 << 40);
			if (evict_size % evict_page)
				sbc_fail(&cli, "--evict-size: %s is not whole "
					 "256K pages", val);
			evict_set = true;
			break;
		case OPT_TOUCH:
			sum_mode = sbc_choice(&cli, val, touches) == 1;
			break;
		case OPT_ONLY:
			n = sbc_choice_list(&cli, val, parts, part, 3);
			do_seq = do_rand = do_evict = false;
			for (int i = 0; i < n; i++) {
				do_seq |= part[i] == 0;
				do_rand |= part[i] == 1;
				do_evict |= part[i] == 2;
			}
			break;
		case OPT_RUN:
			run = runs[sbc_choice(&cli, val, runs)];
			break;
		case OPT_WAIT:
			fifo = val;	/* a FIFO on purpose: see --run */
			break;
		}
	}
	if (quick) {
		/* A smoke run: a few seconds, the rest of the machine's
		 * cache left alone. */
		drop_all = false;
		if (!size_set)
			fsize = 64 * MIB;
		if (!reps_set)
			reps = 1;
		if (!evict_set)
			evict_size = 16 * MIB;
	}
	if (file_bytes) {
		printf("%zu\n", fsize);
		return 0;
	}
	/* The random runs pick distinct blocks of the file. */
	if (rand_blocks > fsize / RAND_BS)
		sbc_fail(&cli, "--rand-blocks: %zu is more than the file's %zu "
			 "blocks of 64 KiB", rand_blocks, fsize / RAND_BS);
	signal(SIGALRM, on_alarm);
	watchdog("making the file", 900);
	fd_buf = make_file();
	alarm(0);
	if (fd_buf < 0)
		return 1;
	if (run)
		return run_one(run, fifo);
	have_fio = system("fio --version >/dev/null 2>&1") == 0;
	{
		FILE *f = fopen("/sys/block/vda/queue/read_ahead_kb", "r");

		if (f) {
			if (fgets(rak, sizeof(rak), f))
				rak[strcspn(rak, "\n")] = 0;
			fclose(f);
		}
	}
	printf("pagein: file %s (%zu MiB), %d rep(s), cold cache by "
	       "posix_fadvise(DONTNEED)%s; read_ahead_kb %s (vda)%s\n",
	       path, fsize >> 20, reps,
	       drop_all && geteuid() == 0 ? " + drop_caches" : "", rak,
	       have_fio ? "" : "; fio NOT installed (make deps-bench): its rows are skipped");
	if (drop_all && settle_free && reported_kib() >= 0)
		printf("pagein: free page reporting is on (%s): every run "
		       "starts once it has settled, on memory as cold as a "
		       "long-running machine's (--no-settle: at once)\n",
		       reported_path);
	if (sweep) {
		static const size_t ps[] = {64 * KIB, 256 * KIB, 1 * MIB, 2 * MIB,
					    4 * MIB};
		double v[5][MAX_REPS], f[MAX_REPS], fcpu;
		struct run r;

		printf("\nsweep: sequential sparsebuf by page size (MB/s)\n");
		for (int i = 0; i < reps; i++) {
			cold();
			f[i] = have_fio ? fio_run("read", MIB, 16, fsize, &fcpu) : -1;
			printf("  rep %d: fio %.0f", i + 1, f[i] / 1e6);
			for (int k = 0; k < 5; k++) {
				watchdog("sweep", 600);
				seq_sb(ps[k], 0, &r);
				v[k][i] = r.bps;
				check_tally("sweep", &r.t);
				printf(", %zuK %.0f (cpu %.2f s)", ps[k] >> 10,
				       r.bps / 1e6, r.cpu);
				fflush(stdout);
			}
			printf("\n");
		}
		alarm(0);
		printf("  median: fio %.0f MB/s", med(f, reps) / 1e6);
		for (int k = 0; k < 5; k++)
			printf(", %zuK %.0f (%.2fx)", ps[k] >> 10,
			       med(v[k], reps) / 1e6,
			       med(v[k], reps) / med(f, reps));
		printf("\n");
		return 0;
	}
	if (do_seq)
		part_seq(sq);
	if (do_rand)
		part_rand(rd);
	if (do_evict)
		part_evict(ev);

	printf("\nresults: median of %d rep(s); MB/s = 10^6 bytes/s; [spread "
	       "min-max over reps]\n", reps);
	header();
	if (do_seq) {
		char t[64], s1[32], s2[32], s3[32];
		double sb = med(sq->sb, reps);
		/* The direct reads' reps that ran (one that could not is
		 * n/a, not a rate of -1 in the median). */
		double dok[MAX_REPS], dcpu[MAX_REPS];
		int nd = 0;

		for (int i = 0; i < reps; i++)
			if (sq->direct[i] > 0) {
				dcpu[nd] = sq->dcpu[i];
				dok[nd++] = sq->direct[i];
			}

		snprintf(t, sizeof(t), "seq %zu MiB, %zuK pages", fsize >> 20,
			 seq_page >> 10);
		row(t, seq_fio_name(), sq->fio_ok ? med(sq->fio, reps) : -1,
		    sb, 0.8);
		row(t, "mmap + read-ahead", med(sq->mm, reps), sb, 1.0);
		row(t, "io_uring into fresh mem",
		    nd ? med(dok, nd) : -1, sb, -1);
		cpu_row(med(sq->mmcpu, reps), med(sq->sbcpu, reps), 1.5);
		row("seq, pool budget 1/4 of file", seq_fio_name(),
		    sq->fio_ok ? med(sq->fio, reps) : -1, med(sq->bud, reps), -1);
		spread(sq->fio, reps, 1e-6, s1, sizeof(s1));
		spread(sq->sb, reps, 1e-6, s2, sizeof(s2));
		spread(sq->mm, reps, 1e-6, s3, sizeof(s3));
		printf("    spread: fio [%s], sparsebuf [%s], mmap [%s]\n",
		       sq->fio_ok ? s1 : "n/a", s2, s3);
		spread(sq->sbcpu, reps, 1, s2, sizeof(s2));
		spread(sq->mmcpu, reps, 1, s3, sizeof(s3));
		printf("    CPU s per GiB: sparsebuf [%s], mmap [%s]\n", s2, s3);
		spread(dok, nd, 1e-6, s2, sizeof(s2));
		spread(dcpu, nd, 1, s3, sizeof(s3));
		if (nd)	/* else n/a, said above */
			printf("    io_uring O_DIRECT into fresh memory (%s, "
			       "depth 16): MB/s [%s], CPU s per GiB [%s]\n",
			       seq_fio_name(), s2, s3);
	}
	if (do_rand) {
		char s1[32], s2[32], s3[32], s4[32];
		double sb = med(rd->sb, reps), pp = med(rd->pipe, reps);
		double pb = med(rd->bud, reps);
		char t[64];

		row("rand 64K, prefetch x32 pipelined", "fio randread 64K x32",
		    rd->fio_ok ? med(rd->fio, reps) : -1, pp, 0.8);
		row("rand 64K, prefetch x32 pipelined", "mmap touch",
		    med(rd->mm, reps), pp, 3.0);
		row("rand 64K, prefetch x32 pipelined", "mmap + MADV_WILLNEED",
		    med(rd->wn, reps), pp, -1);
		snprintf(t, sizeof(t), "rand 64K, pipelined, pool %zu MiB",
			 rd->budget >> 20);
		row(t, "fio randread 64K x32", rd->fio_ok ? med(rd->fio, reps) : -1,
		    pb, -1);
		row("rand 64K, prefetch WAIT x32", "fio randread 64K x32",
		    rd->fio_ok ? med(rd->fio, reps) : -1, sb, -1);
		row("rand 64K, prefetch WAIT x32", "mmap touch", med(rd->mm, reps),
		    sb, -1);
		row("rand 64K, touch only (no prefetch)", "mmap touch",
		    med(rd->mm, reps), med(rd->touch, reps), -1);
		printf("    touch only: the library read %.2fx the bytes touched "
		       "(sequential read-ahead)\n", med(rd->amp, reps));
		spread(rd->fio, reps, 1e-6, s1, sizeof(s1));
		spread(rd->pipe, reps, 1e-6, s2, sizeof(s2));
		spread(rd->mm, reps, 1e-6, s3, sizeof(s3));
		spread(rd->wn, reps, 1e-6, s4, sizeof(s4));
		printf("    spread: fio [%s], pipelined [%s], mmap [%s], "
		       "mmap+WILLNEED "
		       "[%s]\n", rd->fio_ok ? s1 : "n/a", s2, s3, s4);
	}
	if (do_evict) {
		printf("\n%-34s %-24s %8s %8s %8s\n", "evict round trip (us/page)",
		       "baseline", "base", "ours", "ratio");
		for (int m = 0; m < EV_N; m++) {
			double s = med(ev->sb[m], reps), d = med(ev->diy[m], reps);

			printf("%-34s %-24s %8.1f %8.1f %7.2fx %8s\n", ev_name[m],
			       "anon, by hand, depth 1", d, s, s / d, "report");
		}
	}
	printf("\n%s\n", fails ? "pagein: FAIL" : "pagein: PASS");
	free(sq);
	free(rd);
	free(ev);
	return fails ? 3 : 0;
}
