/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the save files: sb_buf_restore (lib/save.c), the lazy, checked
 * page-ins of the buffer it returns, and what can be done with that
 * buffer (write, save, evict).
 *
 * Every input is tried twice:
 *
 *   raw      the bytes as they are: the checksums reject nearly every
 *            mutation of the header and tables, but data mutations go
 *            through to the page-in checks;
 *   fixed    the header's and tables' CRC-32Cs recomputed over the mutated
 *            bytes (and, for most inputs, the CRC of every present block),
 *            the file extended to the length the header declares when
 *            that is at most CAP (with zeros, or for some inputs a hole,
 *            which the reader must refuse where the tables are): the
 *            mutations reach everything behind the checksums;
 *   hostile  a fixed header declaring more than CAP, up to 16 TiB, the
 *            file a hole past the input: refused, or cheap (defect 9).
 *
 * The contract checked, per restore:
 *   - it fails with a documented -errno (-EBADMSG for a bad file; -ENOMEM
 *     is tolerated), or it gives a buffer of the declared length rounded
 *     up to whole pages, and then the file is well formed by the format
 *     in lib/save.c's header comment (accepted implies valid);
 *   - every page of the buffer is touched: a page raises SIGBUS exactly
 *     when one of its present blocks fails its checksum (or, for a
 *     SB_BUF_STRICT buffer, when it has no present block); a page that
 *     reads holds the file's bytes for its present blocks and zeros
 *     elsewhere (no silent zeros, no silent corruption), and what was
 *     written through the buffer;
 *   - depending on the input (bits of its CRC, so a replay does the
 *     same): every page read in at once by sb_buf_prefetch; a byte
 *     written in every third page; the buffer saved, over
 *     the file it came from or to another, the save restored and
 *     compared, the original still reading right (its unread pages from
 *     the replaced file); the buffer evicted and read again;
 *   - destroying the buffers leaves the pool consistent (sbi_pool_verify)
 *     and no descriptor open on the files.
 *
 * The pool is made once per process (page 16 KiB: four blocks a page, so
 * partial pages and tails are covered); the files live in a private
 * directory in /dev/shm, removed at exit (or, after a crash, by the next
 * run). Without userfaultfd the harness
 * skips (exit 77, "SKIP: why").
 *
 * The format is mirrored here (struct save_hdr): if lib/save.c changes it,
 * update the mirror and regenerate the seeds (tests/fuzz/mkseeds.c).
 */
#include "fuzz.h"
#include "internal.h"
#include "sparsebuf.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#define BLOCK 4096u
#define PAGE  ((size_t)16 << 10)
/* Largest declared length the harness makes the file big enough for: the
 * touch of every page stays cheap, and a declared terabyte (issue 10,
 * defect 9: unbounded work) stays out until the library bounds it. */
#define CAP ((uint64_t)2 << 20)

struct save_hdr {
	char magic[8];
	uint32_t version;
	uint32_t block;
	uint64_t length;
	uint64_t nblocks;
	uint64_t present_off;
	uint64_t crc_off;
	uint64_t data_off;
	uint32_t tables_crc;
	uint32_t header_crc; /* of this struct with header_crc = 0 */
};

_Static_assert(sizeof(struct save_hdr) == 64, "save header mirror");

static struct sb_pool *pool;
static int can_wp;
/* The file as the library sees it, for the expectations: fixed-up copy
 * and its size (holes past the input read as zeros). */
static uint8_t *file;
static size_t file_cap;
/* A private directory on tmpfs: the input file, and where saves go. */
static char dir[64], in_path[96], out_path[96];

static void remove_dir(void)
{
	unlink(in_path);
	unlink(out_path);
	rmdir(dir);
}

/* A harness that crashed (the point of fuzzing) left its directory,
 * named by its pid: remove those of processes gone. */
static void remove_stale(const char *parent)
{
	DIR *d = opendir(parent);
	struct dirent *e;

	while (d && (e = readdir(d))) {
		char p[300];
		long pid;

		if (strncmp(e->d_name, "sbfuzz-", 7))
			continue;
		pid = atol(e->d_name + 7);
		if (pid <= 0 || (kill((pid_t)pid, 0) < 0 && errno == ESRCH)) {
			snprintf(p, sizeof(p), "%s/%s/in", parent, e->d_name);
			unlink(p);
			snprintf(p, sizeof(p), "%s/%s/out", parent, e->d_name);
			unlink(p);
			snprintf(p, sizeof(p), "%s/%s", parent, e->d_name);
			rmdir(p);
		}
	}
	if (d)
		closedir(d);
}

/* Write the first n bytes of p and make the file size bytes long: the
 * rest (zeros in p) a hole. */
static void write_file(const char *path, const void *p, size_t n, size_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	size_t done = 0;

	if (fd < 0) {
		perror(path);
		abort();
	}
	if (ftruncate(fd, (off_t)size) < 0) {
		perror(path);
		abort();
	}
	while (done < n) {
		ssize_t w = write(fd, (const char *)p + done, n - done);

		if (w <= 0) {
			perror(path);
			abort();
		}
		done += (size_t)w;
	}
	close(fd);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct sb_pool_opts o;
	struct sb_features f;
	int err = 0;

	(void)argc;
	(void)argv;
	sb_features_get(&f);
	if (f.uffd_mode == SB_UFFD_NONE)
		FUZZ_SKIP("userfaultfd unavailable: %s",
			  strerror(-f.uffd_error));
	can_wp = f.wp_shmem;
	sb_pool_opts_init(&o);
	o.page_size = PAGE;
	o.heap_size = (size_t)1 << 20;
	/* Room for the largest restore whole, read-ahead included: no
	 * budget SIGBUS to tell apart from a checksum one. */
	o.max_bytes = (size_t)(4 * CAP);
	o.numa_node = -1;
	pool = sb_pool_create(&o, &err);
	if (!pool)
		FUZZ_SKIP("sb_pool_create: %s", strerror(-err));
	remove_stale("/dev/shm");
	remove_stale("/tmp");
	snprintf(dir, sizeof(dir), "/dev/shm/sbfuzz-%d", (int)getpid());
	if (mkdir(dir, 0700) < 0) {
		snprintf(dir, sizeof(dir), "/tmp/sbfuzz-%d", (int)getpid());
		if (mkdir(dir, 0700) < 0) {
			perror(dir);
			abort();
		}
	}
	snprintf(in_path, sizeof(in_path), "%s/in", dir);
	snprintf(out_path, sizeof(out_path), "%s/out", dir);
	atexit(remove_dir);
	/* The largest file: CAP of data behind the tables of CAP. */
	file_cap = 3 * BLOCK + CAP + CAP / BLOCK * 4;
	file = malloc(file_cap);
	if (!file)
		abort();
	return 0;
}

static uint64_t round_block(uint64_t n)
{
	return (n + BLOCK - 1) & ~(uint64_t)(BLOCK - 1);
}

/* Sizes of the tables for nblocks, as the writer lays them out. */
static void table_sizes(uint64_t nblocks, uint64_t *bitmap, uint64_t *crcs)
{
	*bitmap = round_block((nblocks + 63) / 64 * 8);
	*crcs = round_block(nblocks * 4);
}

static uint32_t file_crc(uint64_t off, uint64_t len, uint64_t size)
{
	if (off > size || len > size - off)
		return 0;
	return sbi_crc32c(file + off, len);
}

/*
 * Recompute the checksums over the mutated bytes of the file: block CRCs
 * (when fix_blocks) of the present blocks, the tables' CRC when the
 * tables lie in the file, the header's. The file is file[0, size),
 * extended with zeros to the end the header declares when that is at
 * most CAP (blocks past the end are taken as zeros too: try_hostile
 * makes them a hole). Returns the file's new size.
 */
static size_t fix_up(size_t size, int fix_blocks)
{
	static const char zeros[BLOCK];
	struct save_hdr h;
	uint64_t bitmap, crcs, end = size;

	memcpy(&h, file, sizeof(h));
	if (h.nblocks <= ((uint64_t)1 << 32)) {
		table_sizes(h.nblocks, &bitmap, &crcs);
		if (h.data_off <= CAP && h.length <= CAP &&
		    h.data_off + h.length > end &&
		    h.data_off + h.length <= file_cap)
			end = h.data_off + h.length;
		if (BLOCK + bitmap + crcs <= end && fix_blocks) {
			uint8_t *present = file + BLOCK;
			uint8_t *crc = file + BLOCK + bitmap;

			for (uint64_t b = 0; b < h.nblocks; b++) {
				uint64_t at = h.data_off + b * BLOCK;

				if (present[b / 8] >> (b % 8) & 1)
					fuzz_put32(crc + b * 4,
						   at + BLOCK <= end
							   ? file_crc(at, BLOCK,
								      end)
							   : sbi_crc32c(zeros,
									BLOCK));
			}
		}
		if (BLOCK + bitmap + crcs <= end)
			h.tables_crc = file_crc(BLOCK, bitmap + crcs, end);
	}
	h.header_crc = 0;
	h.header_crc = sbi_crc32c(&h, sizeof(h));
	memcpy(file, &h, sizeof(h));
	return (size_t)end;
}

/* Accepted implies well formed: the format rules, checked on our copy. */
static void check_valid(const struct save_hdr *h0, size_t size)
{
	struct save_hdr h = *h0;
	uint32_t want = h.header_crc;
	uint64_t bitmap, crcs;

	h.header_crc = 0;
	FUZZ_CHECK(!memcmp(h.magic, "SBSAVE01", 8) && h.version == 1 &&
			   h.block == BLOCK,
		   "accepted a header with magic/version/block %.8s/%u/%u",
		   h.magic, h.version, h.block);
	FUZZ_CHECK(sbi_crc32c(&h, sizeof(h)) == want,
		   "accepted a header whose CRC is wrong");
	FUZZ_CHECK(h.length && h.length % BLOCK == 0 &&
			   h.nblocks == h.length / BLOCK,
		   "accepted length %llu, nblocks %llu",
		   (unsigned long long)h.length, (unsigned long long)h.nblocks);
	table_sizes(h.nblocks, &bitmap, &crcs);
	FUZZ_CHECK(h.present_off == BLOCK && h.crc_off == BLOCK + bitmap &&
			   h.data_off == h.crc_off + crcs,
		   "accepted offsets %llu %llu %llu for %llu blocks",
		   (unsigned long long)h.present_off,
		   (unsigned long long)h.crc_off,
		   (unsigned long long)h.data_off,
		   (unsigned long long)h.nblocks);
	FUZZ_CHECK(h.data_off + h.length <= size,
		   "accepted a file of %zu bytes declaring %llu", size,
		   (unsigned long long)(h.data_off + h.length));
	FUZZ_CHECK(file_crc(BLOCK, bitmap + crcs, size) == h.tables_crc,
		   "accepted tables whose CRC is wrong");
}

/*
 * What the restored buffer must show: exp (len bytes) for every page that
 * reads, and which pages must raise SIGBUS instead (a present block that
 * fails its CRC; for a SB_BUF_STRICT buffer, no present block at all).
 * Writes through the buffer update exp.
 */
struct model {
	size_t len;
	char *exp;
	uint8_t *bad;  /* (len / PAGE) 1: SIGBUS, 0: reads, 2: either */
	uint8_t *lost; /* (len / PAGE) a block fails its CRC */
	uint8_t *none; /* (len / PAGE) zeros: another buffer's bad */
	int any_bad;   /* a block fails its CRC */
};

static void build_model(struct model *m, const struct save_hdr *h,
			unsigned flags, size_t len)
{
	const uint8_t *present = file + h->present_off;
	const uint8_t *crc = file + h->crc_off;

	m->len = len;
	m->exp = calloc(1, len);
	m->bad = calloc(1, len / PAGE);
	m->lost = calloc(1, len / PAGE);
	m->none = calloc(1, len / PAGE);
	m->any_bad = 0;
	if (!m->exp || !m->bad || !m->lost || !m->none)
		abort();
	for (size_t k = 0; k < len / PAGE; k++) {
		int any = 0;

		for (size_t b = k * (PAGE / BLOCK);
		     b < (k + 1) * (PAGE / BLOCK); b++) {
			const uint8_t *d = file + h->data_off + b * BLOCK;

			if (b >= h->nblocks || !(present[b / 8] >> (b % 8) & 1))
				continue;
			any = 1;
			memcpy(m->exp + b * BLOCK, d, BLOCK);
			if (sbi_crc32c(d, BLOCK) != fuzz_le32(crc + b * 4))
				m->lost[k] = m->bad[k] = 1, m->any_bad = 1;
		}
		if ((flags & SB_BUF_STRICT) && !any)
			m->bad[k] = 1;
	}
}

static void free_model(struct model *m)
{
	free(m->exp);
	free(m->bad);
	free(m->lost);
	free(m->none);
}

/* Before failing: what the library counted, what page k holds. */
static void explain(const struct model *m, const char *base, size_t k, int bus)
{
	struct sb_stats st;

	sb_pool_stats(pool, &st);
	fprintf(stderr, "pool: pages_in %llu io_errors %llu sigbus %llu\n",
		(unsigned long long)st.pages_in,
		(unsigned long long)st.io_errors,
		(unsigned long long)st.sigbus);
	for (size_t b = k * (PAGE / BLOCK);
	     !bus && b < (k + 1) * (PAGE / BLOCK); b++)
		fprintf(stderr, "block %zu: expected crc %08x, memory %08x\n",
			b, sbi_crc32c(m->exp + b * BLOCK, BLOCK),
			sbi_crc32c(base + b * BLOCK, BLOCK));
}

/* Touch every page of buf; bad[k]: page k must raise SIGBUS (1), or hold
 * exp (0), or either (2). */
static void check_pages(struct sb_buf *buf, const struct model *m,
			const uint8_t *bad, const char *when)
{
	const char *base = sb_buf_addr(buf);
	struct fuzz_bus_guard g;

	FUZZ_CHECK(sb_buf_length(buf) == m->len, "%s: %zu bytes, not %zu", when,
		   sb_buf_length(buf), m->len);
	fuzz_bus_guard_on(&g);
	for (size_t k = 0; k < m->len / PAGE; k++) {
		const char *p = base + k * PAGE;
		int bus = fuzz_touch(p);
		size_t i = 0;

		if (bad[k] != 2) {
			if (bus != bad[k])
				explain(m, base, k, bus);
			FUZZ_CHECK(bus == bad[k], "%s: page %zu of %zu: %s",
				   when, k, m->len / PAGE,
				   bus ? "SIGBUS, but its blocks are good"
				       : "read, but a block fails its CRC");
		}
		if (bus)
			continue;
		while (i < PAGE && p[i] == m->exp[k * PAGE + i])
			i++;
		if (i < PAGE)
			explain(m, base, k, 0);
		FUZZ_CHECK(i == PAGE, "%s: page %zu, byte %zu is %d, not %d",
			   when, k, i, p[i], m->exp[k * PAGE + i]);
	}
	fuzz_bus_guard_off(&g);
}

/* Change a byte in every third page that reads (a write faults the page
 * in first). */
static void write_some(struct sb_buf *buf, struct model *m, uint32_t pick)
{
	char *base = sb_buf_addr(buf);

	for (size_t k = 0; k < m->len / PAGE; k++) {
		size_t at = k * PAGE + (k * 131 + pick) % PAGE;

		if (m->bad[k] || (k + pick) % 3)
			continue;
		m->exp[at] = (char)(m->exp[at] ^ 0x5a);
		base[at] = m->exp[at];
	}
}

/*
 * Save the buffer (to the file it came from, or another) and restore what
 * was saved: the new buffer shows exp everywhere. The old one must go on
 * reading its pages, the unread ones from the file it was restored from
 * even when the save replaced that path (issue 10, defect 1).
 */
static void round_trip(struct sb_buf *buf, const struct model *m, int own)
{
	const char *to = own ? in_path : out_path;
	struct sb_buf *again;
	int r, err = 0;

	r = sb_buf_save(buf, 0, m->len, to);
	FUZZ_CHECK(r == 0, "sb_buf_save to %s: %d (%s)",
		   own ? "its own file" : "another file", r, strerror(-r));
	again = sb_buf_restore(pool, to, 0, &err);
	FUZZ_CHECK(again, "restoring what sb_buf_save wrote: %d (%s)", err,
		   strerror(-err));
	check_pages(again, m, m->none, "restored after a save");
	sb_buf_destroy(again);
}

/* Every phase on a restored buffer; pick says which. */
static void exercise(struct sb_buf *buf, const struct save_hdr *h,
		     unsigned flags, uint32_t pick)
{
	struct model m;
	long r;

	build_model(&m, h, flags, sb_buf_length(buf));
	/* Pages in through sb_buf_prefetch (one submission, waited for)
	 * rather than faults. It places the holes too, so a strict
	 * buffer's touch of a hole no longer raises SIGBUS. */
	if (pick & 0x200) {
		struct sb_range all = {0, m.len};

		r = sb_buf_prefetch(buf, &all, 1, SB_PREFETCH_WAIT);
		FUZZ_CHECK(r >= 0 || (r == -EIO && m.any_bad),
			   "sb_buf_prefetch: %ld", r);
		/* After -EIO (a page failed its CRC) the rest is as after a
		 * failed sb_buf_map: holes placed or not. */
		for (size_t k = 0; k < m.len / PAGE; k++)
			if (m.bad[k] && !m.lost[k])
				m.bad[k] = r < 0 ? 2 : 0;
	}
	if (pick & 0x10)
		write_some(buf, &m, pick);
	/* Not with bad pages: their data is lost, the save says -EIO. */
	if ((pick & 0x40) && !m.any_bad)
		round_trip(buf, &m, (pick & 0x80) != 0);
	check_pages(buf, &m, m.bad, "restored");
	if (pick & 0x20) {
		r = sb_buf_evict(buf, 0, m.len);
		FUZZ_CHECK(r >= 0 || r == -EIO || (r == -EOPNOTSUPP && !can_wp),
			   "sb_buf_evict: %ld", r);
		check_pages(buf, &m, m.bad, "evicted");
	}
	free_model(&m);
}

/* The file is file[0, size); what lies past the input (in, zeros) is
 * written out, or for some inputs left a hole of a sparse file. */
static void try_restore(size_t size, size_t in, unsigned flags, uint32_t pick)
{
	struct sb_buf *buf;
	struct save_hdr h;
	char why[512];
	int err = 0;

	write_file(in_path, file, (pick & 0x100) && in < size ? in : size,
		   size);
	buf = sb_buf_restore(pool, in_path, flags, &err);
	if (!buf) {
		FUZZ_CHECK(err == -EBADMSG || err == -ENOMEM,
			   "sb_buf_restore failed with %d (%s)", err,
			   strerror(-err));
	} else {
		memcpy(&h, file, sizeof(h));
		check_valid(&h, size);
		FUZZ_CHECK(sb_buf_length(buf) ==
				   (h.length + PAGE - 1) / PAGE * PAGE,
			   "buffer of %zu bytes for a declared %llu",
			   sb_buf_length(buf), (unsigned long long)h.length);
		exercise(buf, &h, flags, pick);
		sb_buf_destroy(buf);
	}
	FUZZ_CHECK(sbi_pool_verify(pool, why, sizeof(why)) == 0, "pool: %s",
		   why);
	FUZZ_CHECK(fuzz_fds_on(dir) == 0, "%d descriptors left open in %s",
		   fuzz_fds_on(dir), dir);
}

/*
 * A fixed-up header declaring more than CAP (up to 2^44 bytes): the file
 * made that long with a hole after the input, as a hostile file would be.
 * The reader must refuse it or take work and memory in proportion to what
 * the file holds (issue 10, defect 9: a terabyte declared cost 27 s and
 * 2 GiB; libFuzzer's -timeout and -rss_limit_mb bound both here). Tables
 * lying in the hole read as zeros (a sparse copy of a save file is valid),
 * so a header whose table CRC is that of zeros is accepted: the buffer
 * then has the declared length; its first and last pages are touched
 * (SIGBUS or not: what matters is that it ends).
 */
static void try_hostile(size_t size, unsigned flags)
{
	struct fuzz_bus_guard g;
	uint64_t bitmap, crcs, end;
	struct sb_buf *buf;
	struct save_hdr h;
	char why[512];
	int err = 0;

	memcpy(&h, file, sizeof(h));
	end = h.data_off + h.length;
	if (h.length <= CAP || end < h.length || end > ((uint64_t)1 << 44))
		return;
	write_file(in_path, file, size, end);
	buf = sb_buf_restore(pool, in_path, flags, &err);
	if (!buf) {
		FUZZ_CHECK(err == -EBADMSG || err == -ENOMEM,
			   "sb_buf_restore failed with %d (%s)", err,
			   strerror(-err));
	} else {
		const char *base = sb_buf_addr(buf);
		size_t len = sb_buf_length(buf);

		table_sizes(h.nblocks, &bitmap, &crcs);
		FUZZ_CHECK(h.nblocks == h.length / BLOCK &&
				   h.data_off == BLOCK + bitmap + crcs,
			   "accepted %llu blocks with tables of %llu bytes "
			   "and data at %llu",
			   (unsigned long long)h.nblocks,
			   (unsigned long long)(bitmap + crcs),
			   (unsigned long long)h.data_off);
		FUZZ_CHECK(len == (h.length + PAGE - 1) / PAGE * PAGE,
			   "buffer of %zu bytes for a declared %llu", len,
			   (unsigned long long)h.length);
		fuzz_bus_guard_on(&g);
		fuzz_touch(base);
		fuzz_touch(base + len - PAGE);
		fuzz_bus_guard_off(&g);
		sb_buf_destroy(buf);
	}
	FUZZ_CHECK(sbi_pool_verify(pool, why, sizeof(why)) == 0, "pool: %s",
		   why);
	FUZZ_CHECK(fuzz_fds_on(dir) == 0, "%d descriptors left open in %s",
		   fuzz_fds_on(dir), dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* Choices that are not part of the file: from its checksum, so an
	 * input always replays the same way. */
	uint32_t pick = sbi_crc32c(data, size);
	unsigned flags = 0;

	if (size > CAP)
		return 0; /* run.sh bounds -max_len well below */
	if (pick & 1)
		flags |= SB_BUF_STRICT;
	if ((pick & 2) && can_wp)
		flags |= SB_BUF_EVICTABLE;
	/* Raw. */
	memcpy(file, data, size);
	memset(file + size, 0, file_cap - size);
	try_restore(size, size, flags, pick);
	/* Fixed up; bytes past the input are the zeros of a sparse file. */
	if (size >= sizeof(struct save_hdr)) {
		memcpy(file, data, size);
		memset(file + size, 0, file_cap - size);
		try_restore(fix_up(size, (pick & 12) != 0), size, flags, pick);
		try_hostile(size, flags);
	}
	return 0;
}
