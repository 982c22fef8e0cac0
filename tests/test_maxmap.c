/* Running out of vm.max_map_count: placements that cannot merge (every
 * other 4 KiB page) eventually fail with -ENOMEM and a clear message, never
 * a crash; accounting stays exact and everything can be released. */
#include "harness.h"
#include "harness_internal.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

static int cow_at_limit(void);
static int home_at_limit(void);

#ifdef __SANITIZE_ADDRESS__
/*
 * ASan's allocator grows its regions with mmap, and at the limit that
 * mmap fails and ASan dies ("ERROR: Failed to mmap"; CI once, in
 * release_racing_app's loop of maps and unmaps). With its quarantine a
 * free never makes room for the next malloc, so a loop at the limit that
 * allocates (sb_buf_map's scratch arrays) eats into the region until it
 * has to grow. Without it, freed chunks are reused and the regions stay
 * as they were when the limit was reached.
 */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "quarantine_size_mb=0";
}
#endif

static int child(const char *name)
{
	if (!strcmp(name, "cow_at_limit"))
		return cow_at_limit();
	if (!strcmp(name, "home_at_limit"))
		return home_at_limit();
	return 2;
}

/* A file of n pages of 4 KiB, page i filled with i % 200 + 1; its path
 * into path. */
static void make_file(char *path, size_t len, size_t n, size_t page)
{
	const char *tmp = getenv("TMPDIR");
	int fd;

	snprintf(path, len, "%s/sbt-maxmap-XXXXXX",
		 tmp && *tmp ? tmp : "/var/tmp");
	fd = mkstemp(path);
	CHECK(fd >= 0);
	for (size_t i = 0; i < n; i++) {
		char pg[4096];

		memset(pg, (int)(i % 200 + 1), sizeof(pg));
		CHECK(pwrite(fd, pg, sizeof(pg), (off_t)(i * page)) ==
		      (ssize_t)sizeof(pg));
	}
	close(fd);
}

/* The file opened in a pool made with env=0 (a feature off). */
static struct sb_buf *open_without(const char *env, const char *path,
				   size_t n, size_t page, struct sb_pool **pp)
{
	struct sb_buf *b;
	int err = 0;

	setenv(env, "0", 1);
	*pp = make_pool(page, 64 * MiB, 0);
	unsetenv(env);
	b = sb_buf_open_file(*pp, path, 0, n * page, 0, &err);
	if (!b)
		FAIL("sb_buf_open_file: %s", strerror(-err));
	return b;
}

/* Use up the mappings: every other page of a region protected apart,
 * until the kernel refuses the next split. */
static char *eat_mappings(size_t page, size_t *len)
{
	struct sb_features f;
	size_t eat = 0;
	char *m;

	CHECK(sb_features_get(&f) == 0);
	*len = (size_t)f.max_map_count * 2 * page;
	m = mmap(NULL, *len, PROT_READ,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(m != MAP_FAILED);
	while (mprotect(m + (2 * eat + 1) * page, page, PROT_NONE) == 0)
		eat++;
	CHECK_EQ(errno, ENOMEM);
	return m;
}

/* One mapping again before the munmap: a sanitizer's own munmap of the
 * shadow of a range needs room for a split. */
static void free_mappings(char *m, size_t len)
{
	CHECK(mprotect(m, len, PROT_READ) == 0);
	munmap(m, len);
}

/*
 * Evicted pages come back at the limit. Without recycling (SPARSEBUF_RECYCLE
 * =0) a page evicted in place keeps its heap page and the buffer's mapping
 * of it; reading it back in used to map a new page over that one, which at
 * the limit the kernel refuses even when it would replace a mapping whole,
 * and the touch got SIGBUS. Now the data is copied into the kept page
 * (UFFDIO_COPY), no mapping made.
 */
static void evicted_back(void)
{
	size_t page = 4 * KiB, n = 256, mlen;
	struct sb_features f;
	struct sb_pool *p;
	struct sb_buf *b;
	char path[300], *x, *m;
	uint64_t in0;

	make_file(path, sizeof(path), n, page);
	b = open_without("SPARSEBUF_RECYCLE", path, n, page, &p);
	x = sb_buf_addr(b);
	for (size_t i = 0; i < n; i++)
		CHECK_EQ(x[i * page], (char)(i % 200 + 1));
	/* Counted from the eviction: a fault message of the loop above that
	 * the handler reads only after it (userfaultfd may deliver one touch
	 * twice) reads its page back in early, before the limit is reached
	 * (CI, once: 255 of 256 read in after it). */
	/* A page read whole can be touched before its read's completion
	 * marks it placed (a clean home, docs/design.md): wait for them. */
	CHECK(sb_buf_prefetch(b, NULL, 0, SB_PREFETCH_WAIT) >= 0);
	in0 = stats(p).pages_in;
	CHECK_EQ(sb_buf_evict(b, 0, n * page), (long)n);
	CHECK_EQ(sb_buf_placed(b, 0, n * page), 0);
	m = eat_mappings(page, &mlen);
	if (stats(p).pages_in != in0)
		printf("%llu read in before the limit was reached\n",
		       (unsigned long long)(stats(p).pages_in - in0));
	/* Read back, every other page first (each inside a mapping of
	 * evicted pages: a new mapping there would split it). */
	for (size_t i = 1; i < n; i += 2)
		CHECK_EQ(x[i * page], (char)(i % 200 + 1));
	for (size_t i = 0; i < n; i += 2)
		CHECK_EQ(x[i * page], (char)(i % 200 + 1));
	CHECK(sb_features_get(&f) == 0);
	printf("evicted pages back at the limit: %llu read in, %ld of %ld "
	       "mappings\n",
	       (unsigned long long)(stats(p).pages_in - in0), f.map_count,
	       f.max_map_count);
	CHECK(stats(p).pages_in - in0 >= n);
	CHECK_EQ(stats(p).sigbus, 0);
	free_mappings(m, mlen);
	CHECK_EQ(sb_buf_placed(b, 0, n * page), (long)n);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	unlink(path);
}

/*
 * sb_buf_map of a file buffer's pages at the limit, without home mappings
 * (each page read in gets a mapping of its own): the read works, the
 * mapping does not. The call used to return the page as placed while the
 * page was left on disk and a touch of it raised SIGBUS; now it fails
 * with -ENOMEM and the page stays on disk.
 */
static void file_map_at_limit(void)
{
	size_t page = 4 * KiB, n = 512, mlen;
	struct sb_pool *p;
	struct sb_buf *b;
	char path[300], *m;
	long ok = 0, refused = 0;

	make_file(path, sizeof(path), n, page);
	b = open_without("SPARSEBUF_HOME", path, n, page, &p);
	CHECK_EQ(sb_buf_map(b, 0, page), 1);	/* the disk tier up */
	m = eat_mappings(page, &mlen);
	/* Every other page: each needs a mapping of its own. */
	for (size_t i = 2; i < n; i += 2) {
		long r = sb_buf_map(b, i * page, page);

		if (r == 1) {
			CHECK_EQ(sb_buf_placed(b, i * page, page), 1);
			ok++;
		} else {
			CHECK_EQ(r, -ENOMEM);
			CHECK_EQ(sb_buf_placed(b, i * page, page), 0);
			refused++;
		}
	}
	printf("file pages mapped at the limit: %ld placed, %ld refused "
	       "(-ENOMEM)\n", ok, refused);
	CHECK(refused > 0);
	free_mappings(m, mlen);
	/* With room again, every page reads back its data. */
	for (size_t i = 0; i < n; i++)
		CHECK_EQ(((volatile char *)sb_buf_addr(b))[i * page],
			 (char)(i % 200 + 1));
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	unlink(path);
}

/* Past the limit (as after vm.max_map_count is lowered under a process):
 * single pages mapped until the kernel refuses even a new mapping. The
 * mappings made, to give back with over_limit_end. */
static char **over_limit(size_t *nmade)
{
	size_t cap = 64, n = 0;
	char **made = malloc(cap * sizeof(*made));

	CHECK(made);
	for (;;) {
		/* Alternate protections: neighbours never merge. */
		char *q = mmap(NULL, 4 * KiB, n % 2 ? PROT_READ : PROT_NONE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (q == MAP_FAILED)
			break;
		CHECK(n < cap);
		made[n++] = q;
	}
	CHECK_EQ(errno, ENOMEM);
	*nmade = n;
	return made;
}

static void over_limit_end(char **made, size_t n)
{
	for (size_t k = 0; k < n; k++)
		munmap(made[k], 4 * KiB);
	free(made);
}

/* Whether [a, a+len) is mapped (mincore fails with ENOMEM where not),
 * a 4 KiB page at a time (mincore writes a byte a page). */
static bool mapped(const char *a, size_t len)
{
	unsigned char v;

	for (size_t off = 0; off < len; off += 4 * KiB)
		if (mincore((void *)(a + off), 4 * KiB, &v) < 0)
			return false;
	return true;
}

/* Whether every page of the buffer is mapped: no hole. */
static bool no_hole(struct sb_buf *b)
{
	return mapped(sb_buf_addr(b), sb_buf_length(b));
}

/*
 * Releases past the limit, where every mmap fails. A release used to fall
 * back to munmap and mmap into the hole: the munmap of part of a mapping
 * only shrank it, the mmap after it failed too, and the page was left
 * unmapped while the buffer counted it placed (its touch: SIGSEGV); and
 * when the munmap did free room, another thread's mmap could take it, or
 * land in the hole. Now no release unmaps part of a buffer: the library
 * gives back mappings of its own (spares) to make room, and when it has
 * none left the release fails with -ENOMEM and changes nothing.
 */
static void release_over_limit(void)
{
	size_t page = 4 * KiB, n = 48, mlen, nmade;
	struct sb_pool *p = make_pool(page, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 64 * page, 0);
	char *x = sb_buf_addr(b), *m, **made;
	long ok = 0, refused = 0;

	CHECK_EQ(sb_buf_map(b, 0, n * page), (long)n);
	for (size_t i = 0; i < n; i++)
		memset(x + i * page, (int)(i + 1), page);
	CHECK_EQ(maps_in(x, n * page), 1);
	m = eat_mappings(page, &mlen);
	made = over_limit(&nmade);
	/* Pages inside the mapping: each release splits it in three. */
	for (size_t i = 1; i < n; i += 2) {
		long r = sb_buf_unmap(b, i * page, page);

		if (r == 1) {
			CHECK_EQ(sb_buf_placed(b, i * page, page), 0);
			ok++;
		} else {
			CHECK_EQ(r, -ENOMEM);
			CHECK_EQ(sb_buf_placed(b, i * page, page), 1);
			CHECK_EQ(x[i * page + page - 1], (char)(i + 1));
			refused++;
		}
		CHECK(no_hole(b));
	}
	over_limit_end(made, nmade);
	free_mappings(m, mlen);
	printf("past the limit (%zu mappings more): %ld releases made room "
	       "with spares, %ld refused (-ENOMEM), no hole\n",
	       nmade, ok, refused);
	CHECK(ok > 0);
	CHECK(refused > 0);
	for (size_t i = 0; i < n; i++)
		if (sb_buf_placed(b, i * page, page))
			CHECK_EQ(x[i * page], (char)(i + 1));
	CHECK_EQ(sb_buf_unmap(b, 0, sb_buf_length(b)),
		 (long)n - ok);
	CHECK_EQ(stats(p).pages_used, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
static void release_racing_app(void)
{
	/* An application's mmap that finds room at the limit makes the
	 * sanitizer map memory of its own, refused there and fatal:
	 * "ThreadSanitizer failed to allocate" and ASan's "ERROR: Failed to
	 * mmap", once each in CI. */
	printf("releases racing an application's mmaps: not under the "
	       "sanitizers\n");
}
#else
/* An application thread's own mappings, made and checked while the
 * library releases pages at the limit. */
struct app_racer {
	_Atomic bool go, stop, leave;
	long rounds, clobbered, inside;
	const char *lo, *hi;	/* the buffer's range */
};

static void *app_mmaps(void *arg)
{
	struct app_racer *a = arg;

	while (!atomic_load(&a->go))
		sched_yield();
	while (!atomic_load(&a->stop)) {
		char *q = mmap(NULL, 4 * KiB, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (q == MAP_FAILED)
			continue;
		if (q >= a->lo && q < a->hi)
			a->inside++;
		memset(q, 0x5a, 64);
		sched_yield();
		for (int k = 0; k < 64; k++)
			if (q[k] != 0x5a) {
				a->clobbered++;
				break;
			}
		munmap(q, 4 * KiB);
		a->rounds++;
	}
	/* Not gone before the process is back under the limit: a
	 * sanitizer maps afresh the shadow of a dead thread's stack, and
	 * ASan died so once in CI ("failed to allocate 0xff000 bytes",
	 * the shadow of 8 MiB). */
	while (!atomic_load(&a->leave))
		sched_yield();
	return NULL;
}

/*
 * The same with an application thread mapping and unmapping memory of its
 * own meanwhile (a malloc of a large block): its mappings never land in a
 * buffer, nothing of either is clobbered, and no buffer page is left
 * without a mapping.
 */
static void release_racing_app(void)
{
	size_t page = 4 * KiB, n = 64, mlen, nmade;
	struct sb_pool *p = make_pool(page, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, n * page, 0);
	char *x = sb_buf_addr(b), *m, **made;
	struct app_racer a = {.lo = x, .hi = x + n * page};
	long cycles = 0;
	pthread_t th;
	double t0;

	/* Every other page placed: each a mapping of its own. */
	for (size_t i = 0; i < n; i += 2) {
		CHECK_EQ(sb_buf_map(b, i * page, page), 1);
		memset(x + i * page, (int)(i + 1), page);
	}
	/* The thread first: a sanitizer's thread needs mappings. */
	atomic_init(&a.go, false);
	atomic_init(&a.stop, false);
	atomic_init(&a.leave, false);
	pthread_create(&th, NULL, app_mmaps, &a);
	m = eat_mappings(page, &mlen);
	made = over_limit(&nmade);
	atomic_store(&a.go, true);
	t0 = now_s();
	while (now_s() - t0 < 0.5) {
		size_t i = 2 * ((size_t)cycles % (n / 2));
		long r = sb_buf_unmap(b, i * page, page);

		CHECK(r == 1 || r == 0 || r == -ENOMEM);
		r = sb_buf_map(b, i * page, page);
		CHECK(r == 1 || r == 0 || r == -ENOMEM);
		cycles++;
	}
	atomic_store(&a.stop, true);
	CHECK(no_hole(b));
	over_limit_end(made, nmade);
	free_mappings(m, mlen);
	atomic_store(&a.leave, true);
	pthread_join(th, NULL);
	printf("releases racing an application's mmaps at the limit: %ld "
	       "cycles, %ld mmaps, %ld inside the buffer, %ld clobbered\n",
	       cycles, a.rounds, a.inside, a.clobbered);
	CHECK_EQ(a.inside, 0);
	CHECK_EQ(a.clobbered, 0);
	for (size_t i = 0; i < n; i += 2)
		if (sb_buf_placed(b, i * page, page))
			CHECK(x[i * page] == (char)(i + 1) || x[i * page] == 0);
	CHECK(sb_buf_unmap(b, 0, n * page) >= 0);
	CHECK_EQ(stats(p).pages_used, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}
#endif

/* Whether the mapping holding a is registered with userfaultfd (its
 * VmFlags in /proc/self/smaps say "um"). */
static bool registered(const void *a)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[512];
	bool in = false, um = false;

	CHECK(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' '))
			in = (uintptr_t)a >= lo && (uintptr_t)a < hi;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			um = strstr(line, " um") != NULL;
			break;
		}
	}
	fclose(f);
	return um;
}

/*
 * A page at a buffer's edge released at the limit. Its fresh anonymous
 * mapping used to merge with the application's mapping next to the buffer
 * (mmap's top-down placement puts the next one there), the registration
 * then needed a split the kernel refused, and the page was left
 * unregistered, reading zeros while counted placed (an adversarial test).
 * Guard pages keep every foreign mapping one page away: the release
 * either works, the page registered, or fails and changes nothing.
 */
static void edge_release_at_limit(unsigned flags)
{
	size_t page = 16 * KiB, mlen;
	struct sb_pool *p = make_pool(page, 64 * MiB, 0);
	struct sb_buf *b = make_buf(p, 4 * page, flags);
	char *x = sb_buf_addr(b), *m;
	long r;

	/* Nothing of anyone else's can lie right next to the buffer. */
	CHECK(mmap(x - 4 * KiB, 4 * KiB, PROT_READ,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
		   0) == MAP_FAILED);
	CHECK_EQ(errno, EEXIST);
	CHECK(mmap(x + 4 * page, 4 * KiB, PROT_READ,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1,
		   0) == MAP_FAILED);
	CHECK_EQ(errno, EEXIST);
	CHECK_EQ(sb_buf_map(b, 0, 2 * page), 2);
	memset(x, 0x77, 2 * page);
	m = eat_mappings(4 * KiB, &mlen);
	r = sb_buf_unmap(b, 0, page);
	if (r == 1) {
		CHECK_EQ(sb_buf_placed(b, 0, page), 0);
		CHECK(registered(x));
	} else {
		CHECK_EQ(r, -ENOMEM);
		CHECK_EQ(sb_buf_placed(b, 0, page), 1);
		CHECK_EQ(x[page - 1], 0x77);
	}
	CHECK(no_hole(b));
	free_mappings(m, mlen);
	printf("edge page released at the limit%s: %s\n",
	       flags & SB_BUF_STRICT ? " (strict)" : "",
	       r == 1 ? "registered" : "refused, as it was");
	CHECK_EQ(x[page], 0x77);
	CHECK(sb_buf_unmap(b, 0, 4 * page) >= 0);
	CHECK_EQ(stats(p).pages_used, 0);
	VERIFY(p);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
}

static void on_sigbus(int sig)
{
	(void)sig;
	_exit(EXIT_GOT_SIGBUS);
}

/*
 * A write to a shared page past the limit: the copy needs a mapping, and
 * so does the SIGBUS mapping that answers a refused copy. With neither, the
 * woken thread used to retry its write into the same fault for ever (an
 * adversarial test: a busy hang). Now it gets SIGBUS (sent to the thread,
 * so no address to check); exit 0 if the kernel let the copy through. A
 * child: the SIGBUS ends it, and a hang is killed by the harness.
 */
static int cow_at_limit(void)
{
	size_t page = 4 * KiB, mlen, nmade;
	struct sb_pool *p = make_pool(page, 16 * MiB, 0);
	struct sb_buf *a = make_buf(p, 4 * page, 0), *b = make_buf(p, 4 * page, 0);
	volatile char *y = sb_buf_addr(b);
	char *m, **made;

	memset(sb_buf_addr(a), 7, page);
	CHECK_EQ(sb_buf_share(b, 0, a, 0, page), 1);
	CHECK_EQ(y[0], 7);
	signal(SIGBUS, on_sigbus);
	m = eat_mappings(page, &mlen);
	made = over_limit(&nmade);
	y[1] = 8;
	over_limit_end(made, nmade);
	free_mappings(m, mlen);
	CHECK_EQ(y[1], 8);
	return 0;
}

/*
 * A file buffer of 4 home heaps opened with 14 mappings to spare: room for
 * its home mappings, not for a clean home's copy-in windows as well
 * (home.c). The home is made without them, registered MINOR; the windows,
 * made first, once took the room, and the pages were mapped one by one.
 */
static int home_at_limit(void)
{
	const size_t page = 16 * KiB, heap = 1 * MiB, n = 4 * 64;
	struct sb_pool *p = disk_pool(page, heap, 0);
	const char *path = disk_make_file("home-limit.bin", n * page, 3);
	struct sb_buf *w, *b;
	struct sb_features f;
	size_t eat = 0, len;
	int err = 0;
	char *m;

	/* The pool's own heaps and threads first: they take mappings. */
	w = sb_buf_open_file(p, path, 0, page, 0, &err);
	CHECK(w);
	CHECK(sb_buf_prefetch(w, NULL, 0, SB_PREFETCH_WAIT) >= 0);
	(void)*(volatile char *)sb_buf_addr(w);
	usleep(100000);
	CHECK_EQ(sb_features_get(&f), 0);
	len = (size_t)f.max_map_count * 2 * 4096;
	m = mmap(NULL, len, PROT_READ,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(m != MAP_FAILED);
	while (mprotect(m + (2 * eat + 1) * 4096, 4096, PROT_NONE) == 0)
		eat++;
	for (size_t k = 0; k < 7; k++)	/* 2 mappings each */
		CHECK_EQ(mprotect(m + (2 * (eat - 1 - k) + 1) * 4096, 4096,
				  PROT_READ),
			 0);
	b = sb_buf_open_file(p, path, 0, n * page, 0, &err);
	if (!b)
		FAIL("sb_buf_open_file with 14 mappings to spare: %s",
		     strerror(-err));
	printf("a file buffer of 4 heaps with 14 mappings to spare: home %s, "
	       "%s\n",
	       b->home ? "yes" : "no", b->home_clean ? "clean" : "MINOR");
	CHECK(b->home != NULL);
	/* No window left behind where the home is not clean. */
	for (size_t k = 0; k < 4 && !b->home_clean; k++)
		CHECK(p->heaps[b->home[k]]->fill == NULL);
	for (size_t i = 0; i < n; i += 37)
		CHECK_EQ(((volatile uint64_t *)sb_buf_addr(b))[i * page / 8],
			 disk_word(3, i * page / 8));
	munmap(m, len);
	return 0;
}

static int main_test(void)
{
	struct sb_features f;
	struct sb_pool *p;
	struct sb_buf *b;
	char *x;
	long placed = 0, r = 0;
	size_t page = 4 * KiB, i;

	require_uffd();
	sb_features_get(&f);
	if (f.max_map_count <= 0 || f.max_map_count > 300000)
		SKIP("vm.max_map_count=%ld: too large to exhaust in a test",
		     f.max_map_count);
	p = make_pool(page, 64 * MiB, 0);
	b = make_buf(p, (size_t)f.max_map_count * 4 * page, 0);
	x = sb_buf_addr(b);
	for (i = 0; i < (size_t)f.max_map_count * 2; i += 2) {
		r = sb_buf_map(b, i * page, page);
		if (r != 1)
			break;
		x[i * page] = (char)(i % 100 + 1);
		placed++;
	}
	printf("%ld separate placements, then %ld (%s); %ld mappings of %ld\n",
	       placed, r, strerror((int)-r), sb_features_get(&f) == 0 ? f.map_count : -1,
	       f.max_map_count);
	CHECK_EQ(r, -ENOMEM);
	CHECK(placed > f.max_map_count / 3);
	CHECK_EQ(stats(p).pages_used, placed);
	CHECK_EQ(sb_buf_placed(b, 0, sb_buf_length(b)), placed);
	for (size_t k = 0; k < i; k += 2)
		CHECK_EQ(x[k * page], (char)(k % 100 + 1));
	/* Releasing merges the anonymous ranges back: it always works. */
	CHECK_EQ(sb_buf_unmap(b, 0, sb_buf_length(b)), placed);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK(maps_in(x, sb_buf_length(b)) <= 2);
	VERIFY(p);
	/* And placing works again. */
	CHECK_EQ(sb_buf_map(b, 0, 64 * page), 64);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	evicted_back();
	file_map_at_limit();
	release_over_limit();
	release_racing_app();
	edge_release_at_limit(0);
	edge_release_at_limit(SB_BUF_STRICT);
#ifdef __SANITIZE_THREAD__
	/* TSan maps a signal context when the signal comes: refused there. */
	printf("a shared page written past the limit: not under TSan\n");
#else
	{
		int code = child_exit_code(run_child("cow_at_limit"));

		printf("a shared page written past the limit: %s\n",
		       code == EXIT_GOT_SIGBUS ? "SIGBUS"
		       : code == 0		? "copied"
						: "hung or failed");
		CHECK(code == EXIT_GOT_SIGBUS || code == 0);
	}
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
	/* The sanitizers' own allocations map memory, refused there. */
	printf("a file buffer's home at the limit: not under the "
	       "sanitizers\n");
#else
	{
		/* The disk tier's files (harness.h: run_pagers sets it
		 * elsewhere). */
		char dir[] = "/tmp/sbt-maxmap-XXXXXX";
		int code;

		CHECK(mkdtemp(dir) != NULL);
		setenv("SBT_DIR", dir, 1);
		code = child_exit_code(run_child("home_at_limit"));
		disk_rm_rf(dir);
		CHECK_EQ(code, 0);
	}
#endif
	return 0;
}
