/* SPDX-License-Identifier: MIT */
/*
 * The LLM-in-a-flash runner (flash/): a small generated model is
 *
 *  - deterministic from its seed (two generations, 1 and 2 threads, give
 *    the same bytes; another seed gives other bytes), sparse and
 *    predictable as its header claims;
 *  - bit-identical in its logits between resident mode and flash mode
 *    (FFN bundles paged in through a sparsebuf file buffer under a pool
 *    budget a third of the FFN's size, so bundles are released and read
 *    again), with every release policy, and mmap_sparse;
 *  - in flash mode, reads bundles through the pool, releases them, and
 *    reads no more than 2x the bytes of the bundles entering the window.
 */
#include "harness.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "../flash/gen.h"
#include "../flash/runner.h"
#include "sbkernels.h"

void sbi_test_io_fail(int err, unsigned count);

#define STEPS 12

static char dir[256];

static struct sbf_gen_opts small(uint64_t seed, int threads)
{
	struct sbf_gen_opts o;

	sbf_gen_defaults(&o, 32 * MiB);
	o.seed = seed;
	o.dim = 1024;
	o.n_layers = 2;
	o.hidden = 4096;
	o.n_heads = 8;
	o.n_kv_heads = 2;
	o.vocab = 512;
	o.threads = threads;
	return o;
}

static void *slurp(const char *path, size_t *len)
{
	struct stat st;
	int fd = open(path, O_RDONLY);
	char *p;

	CHECK(fd >= 0 && fstat(fd, &st) == 0);
	p = malloc((size_t)st.st_size);
	CHECK(p);
	CHECK(pread(fd, p, (size_t)st.st_size, 0) == st.st_size);
	close(fd);
	*len = (size_t)st.st_size;
	return p;
}

struct logits {
	float *v;
	int vocab;
};

static void keep(void *ctx, int step, const float *l, int n)
{
	struct logits *lg = ctx;

	lg->vocab = n;
	memcpy(lg->v + (size_t)step * n, l, (size_t)n * sizeof(*l));
}

static uint64_t ffn_third;
static int whole;	/* flash: --whole-bundles */
static int no_overlap;	/* flash: --no-overlap */

/* One run of the test's settings; 0 or -errno. */
static int try_run(const char *path, enum sbf_mode mode, uint64_t budget,
		   enum sbf_release rel, float *out, struct sbf_result *r)
{
	struct logits lg = {out, 0};
	struct sbf_opts o = {0};

	o.path = path;
	o.mode = mode;
	o.budget = budget;
	/* The pool: a third of the FFN, so that releasing is needed. Set
	 * outright: what the process holds (from which sbflash derives the
	 * pool from its budget) varies between runs, under ASan most. */
	if (mode == SBF_FLASH && budget)
		o.pool_bytes = ffn_third;
	o.k = 2;
	o.steps = STEPS;
	o.seed = 3;
	o.release = rel;
	o.whole_bundles = whole;
	o.no_overlap = no_overlap;
	o.measure = mode == SBF_RESIDENT;
	o.on_logits = keep;
	o.ctx = &lg;
	return sbf_run(&o, r);
}

static struct sbf_result run(const char *path, enum sbf_mode mode,
			     uint64_t budget, enum sbf_release rel, float *out)
{
	struct sbf_result r;
	int err = try_run(path, mode, budget, rel, out, &r);

	if (err < 0)
		FAIL("%s mode: %s", sbf_mode_name(mode), strerror(-err));
	return r;
}

/*
 * Use up this process's mappings but for 1024 and keep more (one page of a
 * region at a time, with alternating protections). NULL, said on stdout as
 * a skip, when vm.max_map_count is too large to use up or too few are
 * left; else the region, of *n pages, for munmap.
 */
static char *use_up_mappings(const char *what, long keep, size_t *n)
{
	struct sb_features f;
	long left;
	char *m;

	CHECK(sb_features_get(&f) == 0);
	if (f.max_map_count <= 0 || f.max_map_count > 300000) {
		printf("%s: skipped, vm.max_map_count=%ld is too large to use "
		       "up in a test\n", what, f.max_map_count);
		return NULL;
	}
	left = f.max_map_count - f.map_count - 1024 - keep;
	if (left < 64) {
		printf("%s: skipped, %ld of %ld mappings in use\n", what,
		       f.map_count, f.max_map_count);
		return NULL;
	}
	*n = (size_t)left;
	m = mmap(NULL, *n * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		 0);
	CHECK(m != MAP_FAILED);
	for (size_t i = 1; i < *n; i += 2)
		CHECK(mprotect(m + i * 4096, 4096, PROT_NONE) == 0);
	return m;
}

/*
 * Few mappings left under vm.max_map_count: sbflash's pool, which would
 * hold every FFN page without a budget (two mappings each when scattered),
 * gets only as many pages as the limit leaves (a page-in past the limit
 * cannot be mapped and its touch gets SIGBUS). The mappings are used up
 * first, one page of a region at a time with alternating protections, so
 * that room is left for an eighth of the FFN's pages.
 */
static void few_mappings(const char *path, const struct sbf_header *h,
			 const float *ref, float *got, size_t nl)
{
	struct sb_features f;
	size_t page = h->bundle / 2, pages = h->ffn_bytes / page, eat;
	struct sbf_result r;
	char *m = use_up_mappings("few mappings", 2 * (long)(pages / 8), &eat);

	if (!m)
		return;
	ffn_third = 0;	/* no budget at all: the limit alone binds */
	memset(got, 0, nl * sizeof(float));
	r = run(path, SBF_FLASH, 0, SBF_RELEASE_AUTO, got);
	CHECK(sb_features_get(&f) == 0);
	printf("few mappings: %ld of %ld in use with the pool at %.2f MiB "
	       "(FFN %.2f MiB), read %.2f MiB/token, faults %llu\n",
	       f.map_count, f.max_map_count, r.pool_bytes / 1048576.0,
	       h->ffn_bytes / 1048576.0, r.bytes_read / 1048576.0 / STEPS,
	       (unsigned long long)r.faults);
	munmap(m, eat * 4096);
	if (memcmp(ref, got, nl * sizeof(float)))
		FAIL("few mappings: logits differ from resident");
	CHECK(r.pool_bytes > 0 && r.pool_bytes <= h->ffn_bytes / 8 + page);
	CHECK(r.unmapped > 0);
}

/*
 * Fewer mappings left than the window's reads need (a model of 3 layers of
 * 6144 neurons, a fortieth of its FFN's pages' worth of mappings left):
 * the pool gets what the limit leaves, less than a layer's reads, and the
 * pages it drops to make room keep a mapping each until the window lets
 * them go. Before, such a run died of SIGBUS (a page-in past the limit);
 * now the window counts those pages, lets other layers' pages go when the
 * process's mappings near the limit, and where that is not enough stops
 * with -ENOMEM and a message. Either way the process lives, and a run
 * that completes gives the resident logits.
 */
static void fewest_mappings(const char *path)
{
	struct sbf_gen_opts go = small(9, 0);
	struct sbf_header h;
	struct sb_features f;
	struct sbf_result r;
	size_t eat, nl;
	float *ref, *got;
	char *m;
	int err;

	CHECK(sb_features_get(&f) == 0);
	if (f.max_map_count <= 0 || f.max_map_count > 300000) {
		printf("fewest mappings: skipped, vm.max_map_count=%ld is too "
		       "large to use up in a test\n", f.max_map_count);
		return;
	}
	go.n_layers = 3;
	go.hidden = 6144;
	CHECK(sbf_generate(path, &go, &h) == 0);
	nl = (size_t)STEPS * h.vocab;
	ref = calloc(nl, sizeof(float));
	got = calloc(nl, sizeof(float));
	CHECK(ref && got);
	run(path, SBF_RESIDENT, 0, SBF_RELEASE_AUTO, ref);

	m = use_up_mappings("fewest mappings",
			    2 * (long)(h.ffn_bytes / 4096 / 40), &eat);
	if (!m) {
		free(ref), free(got);
		unlink(path);
		return;
	}
	err = try_run(path, SBF_FLASH, 0, SBF_RELEASE_AUTO, got, &r);
	CHECK(sb_features_get(&f) == 0);
	munmap(m, eat * 4096);
	printf("fewest mappings: %s; %ld of %ld in use after, pool %.2f MiB "
	       "(FFN %.2f MiB), read %.2f MiB/token\n",
	       err ? strerror(-err) : "ran", f.map_count, f.max_map_count,
	       r.pool_bytes / 1048576.0, h.ffn_bytes / 1048576.0,
	       err ? 0.0 : r.bytes_read / 1048576.0 / STEPS);
	if (err && err != -ENOMEM)
		FAIL("fewest mappings: %s", strerror(-err));
	if (!err && memcmp(ref, got, nl * sizeof(float)))
		FAIL("fewest mappings: logits differ from resident");
	CHECK(f.map_count <= f.max_map_count);
	free(ref), free(got);
	unlink(path);
}

/*
 * A read of the FFN weights that fails (injected: the first page-in the
 * run starts) is read again when the layer's pages are waited for
 * (flash_ready names its ranges; with --no-overlap the fetch waits and
 * names them again), and the run goes on with the same bits; every read
 * failing, the run stops with -EIO, where touching the failed page would
 * raise SIGBUS (before: the process died of it). Without UFFDIO_POISON a
 * failed page stays failed: -EIO at the first.
 */
static void read_errors(const char *path, uint64_t budget, const float *ref,
			float *got, size_t nl)
{
	struct sb_features ft;
	struct sbf_result r;
	int err;

	CHECK(sb_features_get(&ft) == 0);
	for (no_overlap = 0; no_overlap < 2; no_overlap++) {
		sbi_test_io_fail(EIO, 1);
		memset(got, 0, nl * sizeof(float));
		err = try_run(path, SBF_FLASH, budget, SBF_RELEASE_AUTO, got,
			      &r);
		sbi_test_io_fail(0, 0);
		if (!ft.poison) {
			no_overlap = 0;
			CHECK_EQ(err, -EIO);
			printf("a failed read: -EIO (no UFFDIO_POISON: not "
			       "read again)\n");
			return;
		}
		if (err < 0)
			FAIL("one failed read (no_overlap %d): %s", no_overlap,
			     strerror(-err));
		CHECK_EQ(r.io_errors, 1);
		if (memcmp(ref, got, nl * sizeof(float)))
			FAIL("one failed read (no_overlap %d): logits differ "
			     "from resident", no_overlap);
		/* (The failed read counts no bytes; the second its page.) */
		CHECK_EQ(r.bytes_read, r.new_bytes);
	}
	no_overlap = 0;

	sbi_test_io_fail(EIO, 1u << 30);
	err = try_run(path, SBF_FLASH, budget, SBF_RELEASE_AUTO, got, &r);
	sbi_test_io_fail(0, 0);
	CHECK_EQ(err, -EIO);
	printf("a failed read: read again, same logits; every read failing: "
	       "%s\n", strerror(-err));
}

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	const char *tmp = getenv("TMPDIR");
	char a[300], b[300], c[300];
	struct sbf_gen_opts o;
	struct sbf_header h;
	struct sbf_result rr, rf;
	size_t la, lb, lc, nl;
	char *pa, *pb, *pc;
	float *ref, *got;
	uint64_t budget;

	require_uffd();
	snprintf(dir, sizeof(dir), "%s/sbflash-test-XXXXXX",
		 tmp && *tmp ? tmp : "/var/tmp");
	if (!mkdtemp(dir))
		FAIL("mkdtemp %s: %s", dir, strerror(errno));
	snprintf(a, sizeof(a), "%s/a.bin", dir);
	snprintf(b, sizeof(b), "%s/b.bin", dir);
	snprintf(c, sizeof(c), "%s/c.bin", dir);

	/* Deterministic from the seed, whatever the thread count. */
	o = small(7, 1);
	CHECK(sbf_generate(a, &o, &h) == 0);
	o = small(7, 2);
	CHECK(sbf_generate(b, &o, NULL) == 0);
	o = small(8, 2);
	CHECK(sbf_generate(c, &o, NULL) == 0);
	pa = slurp(a, &la), pb = slurp(b, &lb), pc = slurp(c, &lc);
	CHECK(la == h.file_bytes && lb == la && lc == la);
	if (memcmp(pa, pb, la))
		FAIL("same seed, different bytes");
	if (!memcmp(pa + h.ffn_off, pc + h.ffn_off, h.ffn_bytes))
		FAIL("another seed, same FFN bytes");
	free(pa), free(pb), free(pc);
	unlink(b), unlink(c);
	printf("model: %.1f MiB (FFN %.1f MiB), sparsity %.3f, recall %.3f, "
	       "precision %.3f, predicted %.3f\n",
	       h.file_bytes / 1048576.0, h.ffn_bytes / 1048576.0, h.sparsity,
	       h.recall, h.precision, h.predicted);
	CHECK(h.sparsity > 0.90 && h.sparsity < 0.99);
	CHECK(h.recall > 0.85);
	CHECK(h.precision > 0.3);

	/* Resident is the reference; flash under a pool a third the FFN's
	 * size must give the same bits. */
	nl = (size_t)STEPS * 512;
	ref = calloc(nl, sizeof(float));
	got = calloc(nl, sizeof(float));
	CHECK(ref && got);
	rr = run(a, SBF_RESIDENT, 0, SBF_RELEASE_AUTO, ref);
	printf("resident: %.1f tok/s, %.0f neurons/token, %.1f%% active, "
	       "recall on the run %.3f\n",
	       rr.tokens_per_s, (double)rr.computed / STEPS,
	       100.0 * rr.nonzero / rr.computed,
	       (double)rr.n_true_pred / rr.n_true);
	CHECK(rr.n_true > 0 && rr.computed > 0);
	CHECK((double)rr.n_true_pred / rr.n_true > 0.8);

	budget = h.res_bytes + (uint64_t)2 * 2 * STEPS * 1024 * 4 + 96 * MiB +
		 h.ffn_bytes / 3;
	ffn_third = h.ffn_bytes / 3;
	for (int rel = SBF_RELEASE_AUTO; rel <= SBF_RELEASE_NEVER; rel++) {
		memset(got, 0, nl * sizeof(float));
		rf = run(a, SBF_FLASH, budget, (enum sbf_release)rel, got);
		printf("flash (release %d): %.1f tok/s, pool %.1f MiB, read "
		       "%.2f MiB/token, new bundles %.2f MiB/token, faults %llu, "
		       "released %llu, dropped %llu\n",
		       rel, rf.tokens_per_s, rf.pool_bytes / 1048576.0,
		       rf.bytes_read / 1048576.0 / STEPS,
		       rf.new_neurons * (double)h.bundle / 1048576.0 / STEPS,
		       (unsigned long long)rf.faults,
		       (unsigned long long)rf.unmapped,
		       (unsigned long long)rf.dropped);
		if (memcmp(ref, got, nl * sizeof(float)))
			FAIL("flash (release %d) logits differ from resident",
			     rel);
		CHECK(rf.computed == rr.computed);
		CHECK(rf.bytes_read > 0 && rf.new_neurons > 0);
		CHECK(rf.pool_bytes < h.ffn_bytes / 2);
		if (rel != SBF_RELEASE_NEVER)
			CHECK(rf.unmapped > 0);
		else
			CHECK(rf.dropped > 0);
		CHECK(rf.bytes_read <= 2 * rf.new_neurons * h.bundle +
					       rf.faults * 64 * (uint64_t)h.bundle);
	}

	/* A pool that holds a layer's reads but not a token's: before the
	 * pool would have to drop pages (which the window counts on, so
	 * they fault back in when touched, neighbours and all through fault
	 * read-ahead, and push out the next layer's), the window lets go of
	 * the other layers' least wanted pages. The old runner released only
	 * the reading layer's own: dropped and faulted pages every token. */
	ffn_third = h.ffn_bytes * 3 / 64;
	memset(got, 0, nl * sizeof(float));
	rf = run(a, SBF_FLASH, budget, SBF_RELEASE_AUTO, got);
	printf("pool below a token's reads: pool %.2f MiB, read %.2f "
	       "MiB/token, faults %llu, dropped %llu\n",
	       rf.pool_bytes / 1048576.0, rf.bytes_read / 1048576.0 / STEPS,
	       (unsigned long long)rf.faults, (unsigned long long)rf.dropped);
	if (memcmp(ref, got, nl * sizeof(float)))
		FAIL("pool below a token's reads: logits differ");
	/* (A token's neurons, whole bundles.) */
	CHECK(rf.pool_bytes < rr.computed / STEPS * h.bundle);
	CHECK_EQ(rf.dropped, 0);
	/* Nothing read but what the window asked for: no page read again
	 * by a fault. */
	CHECK_EQ(rf.bytes_read, rf.new_bytes);
	/* And no fault at all, unless the heaps' folios are larger than a
	 * page: then a release that splits one unmaps the folio's other
	 * pages (the kernel leaves a file's pages to fault back), and the
	 * next touch of each is a minor fault that maps it again, no read
	 * (docs/design.md, "Heap folios"; 48 such in one CI run). */
	if (!shmem_folios_big())
		CHECK_EQ(rf.faults, 0);

	memset(got, 0, nl * sizeof(float));
	run(a, SBF_MMAP_SPARSE, 0, SBF_RELEASE_AUTO, got);
	if (memcmp(ref, got, nl * sizeof(float)))
		FAIL("mmap_sparse logits differ from resident");
	run(a, SBF_MMAP_DENSE, 0, SBF_RELEASE_AUTO, got);
	printf("logits: resident == flash == mmap_sparse (bit for bit)\n");
	read_errors(a, budget, ref, got, nl);
	unlink(a);

	/* The split fetch: up rows before attention, the down columns of the
	 * neurons that fire after it. Bundles of 8 KiB (dim 2048) halve into
	 * 4 KiB pages. Same bits as resident; fewer bytes read than whole
	 * bundles under the same pool, since the down column of a predicted
	 * neuron that does not fire is never read; nothing read twice. */
	o = small(9, 2);
	o.dim = 2048;
	o.hidden = 1024;
	CHECK(sbf_generate(a, &o, &h) == 0);
	ffn_third = h.ffn_bytes / 3;
	rr = run(a, SBF_RESIDENT, 0, SBF_RELEASE_AUTO, ref);
	{
		struct sbf_result rw;

		memset(got, 0, nl * sizeof(float));
		rf = run(a, SBF_FLASH, 1, SBF_RELEASE_AUTO, got);
		if (memcmp(ref, got, nl * sizeof(float)))
			FAIL("split fetch: logits differ from resident");
		whole = 1;
		memset(got, 0, nl * sizeof(float));
		rw = run(a, SBF_FLASH, 1, SBF_RELEASE_AUTO, got);
		whole = 0;
		if (memcmp(ref, got, nl * sizeof(float)))
			FAIL("whole bundles: logits differ from resident");
		printf("split fetch: read %.2f MiB/token (whole bundles %.2f), "
		       "asked %.2f, faults %llu\n",
		       rf.bytes_read / 1048576.0 / STEPS,
		       rw.bytes_read / 1048576.0 / STEPS,
		       rf.new_bytes / 1048576.0 / STEPS,
		       (unsigned long long)rf.faults);
		CHECK(rf.split && !rw.split);
		CHECK(rf.computed == rr.computed && rw.computed == rr.computed);
		CHECK(rf.unmapped > 0);
		CHECK(rf.bytes_read < rw.bytes_read);
		CHECK(rf.bytes_read <= rf.new_bytes + rf.faults * 64 * 4096ull);
	}
	few_mappings(a, &h, ref, got, nl);
	fewest_mappings(b);

	free(ref), free(got);
	unlink(a);
	rmdir(dir);
	return 0;
}
