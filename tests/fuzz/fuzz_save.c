/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the save-file reader: sb_buf_restore (lib/file.c) and the lazy,
 * checked page-ins of the buffer it returns.
 *
 * Every input is tried twice:
 *
 *   raw      the bytes as they are: the checksums reject nearly every
 *            mutation of the header and tables, but data mutations go
 *            through to the page-in checks;
 *   fixed    the header's and tables' CRC-32Cs recomputed over the mutated
 *            bytes (and, for most inputs, the CRC of every present block),
 *            the file extended (sparse) to the length the header declares
 *            when that is at most CAP: the mutations reach everything
 *            behind the checksums.
 *
 * The contract checked, per restore:
 *   - it fails with a documented -errno (-EBADMSG for a bad file; -ENOMEM
 *     is tolerated), or it gives a buffer of the declared length rounded
 *     up to whole pages, and then the file is well formed by the format
 *     in lib/file.c's header comment (accepted implies valid);
 *   - every page of the buffer is touched: a page raises SIGBUS exactly
 *     when one of its present blocks fails its checksum (or, for a
 *     SB_BUF_STRICT buffer, when it has no present block); a page that
 *     reads holds the file's bytes for its present blocks and zeros
 *     elsewhere (no silent zeros, no silent corruption);
 *   - destroying the buffer leaves the pool consistent (sbi_pool_verify)
 *     and no descriptor of the file open.
 *
 * The pool is made once per process (page 16 KiB: four blocks a page, so
 * partial pages and tails are covered). Without userfaultfd the harness
 * skips (exit 77, "SKIP: why").
 *
 * The format is mirrored here (struct save_hdr): if lib/file.c changes it,
 * update the mirror and regenerate the seeds (tests/fuzz/mkseeds.c).
 */
#include "fuzz.h"
#include "internal.h"
#include "sparsebuf.h"

#include <fcntl.h>

#define BLOCK 4096u
#define PAGE ((size_t)16 << 10)
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
	uint32_t header_crc;	/* of this struct with header_crc = 0 */
};

_Static_assert(sizeof(struct save_hdr) == 64, "save header mirror");

static struct sb_pool *pool;
static int can_wp;
/* The file as the library sees it, for the expectations: fixed-up copy
 * and its size (holes past the input read as zeros). */
static uint8_t *file;
static size_t file_cap;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct sb_pool_opts o;
	struct sb_features f;
	int err = 0;

	(void)argc;
	(void)argv;
	sb_features_get(&f);
	if (f.uffd_mode == SB_UFFD_NONE)
		FUZZ_SKIP("userfaultfd unavailable: %s", strerror(-f.uffd_error));
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
	fuzz_file(NULL, 0);
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
 * (when fix_blocks) of the present blocks that lie in the file, the
 * tables' CRC, the header's. The file is file[0, size), extended with
 * zeros (a sparse file's holes) to the end the header declares when that
 * is at most CAP. Returns the file's new size.
 */
static size_t fix_up(size_t size, int fix_blocks)
{
	struct save_hdr h;
	uint64_t bitmap, crcs, end = size;

	memcpy(&h, file, sizeof(h));
	if (h.nblocks <= CAP / BLOCK) {
		table_sizes(h.nblocks, &bitmap, &crcs);
		if (h.data_off <= CAP && h.length <= CAP &&
		    h.data_off + h.length > end &&
		    h.data_off + h.length <= file_cap)
			end = h.data_off + h.length;
		if (fix_blocks && BLOCK + bitmap + crcs <= end) {
			uint8_t *present = file + BLOCK;
			uint8_t *crc = file + BLOCK + bitmap;

			for (uint64_t b = 0; b < h.nblocks; b++) {
				uint64_t at = h.data_off + b * BLOCK;

				if (present[b / 8] >> (b % 8) & 1)
					fuzz_put32(crc + b * 4,
						   file_crc(at, BLOCK, end));
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
		   (unsigned long long)h.length,
		   (unsigned long long)h.nblocks);
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

/* Before failing: what the library counted, what each block holds. */
static void explain(struct sb_buf *buf, const struct save_hdr *h, size_t off,
		    int bus)
{
	const uint8_t *present = file + h->present_off;
	const uint8_t *crc = file + h->crc_off;
	const char *base = sb_buf_addr(buf);
	struct sb_stats st;

	sb_pool_stats(pool, &st);
	fprintf(stderr, "pool: pages_in %llu io_errors %llu sigbus %llu\n",
		(unsigned long long)st.pages_in,
		(unsigned long long)st.io_errors,
		(unsigned long long)st.sigbus);
	for (size_t b = off / BLOCK; b < (off + PAGE) / BLOCK; b++) {
		int p = b < h->nblocks && present[b / 8] >> (b % 8) & 1;

		fprintf(stderr, "block %zu: %s, table crc %08x, file crc %08x",
			b, p ? "present" : "hole",
			b < h->nblocks ? fuzz_le32(crc + b * 4) : 0,
			b < h->nblocks ? sbi_crc32c(file + h->data_off +
							    b * BLOCK, BLOCK)
				       : 0);
		if (!bus)
			fprintf(stderr, ", memory crc %08x",
				sbi_crc32c(base + b * BLOCK, BLOCK));
		fprintf(stderr, "\n");
	}
}

/* Touch every page of a restored buffer; compare with the file. */
static void check_pages(struct sb_buf *buf, const struct save_hdr *h,
			unsigned flags)
{
	const uint8_t *present = file + h->present_off;
	const uint8_t *crc = file + h->crc_off;
	const char *base = sb_buf_addr(buf);
	size_t len = sb_buf_length(buf);
	struct fuzz_bus_guard g;

	/* Known bug "save-zero-fill": a fault message that reaches the
	 * handler after a failed page-in poisoned the page (a touch while
	 * the read was in flight) zero-fills it: the toucher reads zeros.
	 * Reading every page in first (and waiting) leaves no read in
	 * flight for a touch to meet. */
	if (fuzz_masked("save-zero-fill")) {
		struct sb_range all = {0, len};

		sb_buf_prefetch(buf, &all, 1, SB_PREFETCH_WAIT);
	}
	fuzz_bus_guard_on(&g);
	for (size_t off = 0; off < len; off += PAGE) {
		int bad = 0, any = 0, bus;

		for (size_t b = off / BLOCK; b < (off + PAGE) / BLOCK; b++) {
			if (b >= h->nblocks || !(present[b / 8] >> (b % 8) & 1))
				continue;
			any = 1;
			if (sbi_crc32c(file + h->data_off + b * BLOCK, BLOCK) !=
			    fuzz_le32(crc + b * 4))
				bad = 1;
		}
		if ((flags & SB_BUF_STRICT) && !any)
			bad = 1;
		bus = fuzz_touch(base + off);
		if (bus != bad)
			explain(buf, h, off, bus);
		FUZZ_CHECK(bus == bad,
			   "page at %zu of %zu, flags %#x: %s (present blocks "
			   "%d)", off, len, flags,
			   bus ? "SIGBUS, but its blocks are good"
			       : "read, but a block fails its CRC",
			   any);
		if (bus)
			continue;
		for (size_t b = off / BLOCK; b < (off + PAGE) / BLOCK; b++) {
			const char *m = base + b * BLOCK;

			if (b < h->nblocks && present[b / 8] >> (b % 8) & 1) {
				FUZZ_CHECK(!memcmp(m, file + h->data_off +
							      b * BLOCK,
						   BLOCK),
					   "block %zu differs from the file", b);
			} else {
				for (size_t i = 0; i < BLOCK; i++)
					FUZZ_CHECK(!m[i],
						   "hole block %zu: byte %zu is "
						   "%d, not 0", b, i, m[i]);
			}
		}
	}
	fuzz_bus_guard_off(&g);
}

static void try_restore(size_t size, unsigned flags)
{
	const char *path = fuzz_file(file, size);
	struct sb_buf *buf;
	struct save_hdr h;
	char why[512];
	int err = 0;

	buf = sb_buf_restore(pool, path, flags, &err);
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
		check_pages(buf, &h, flags);
		sb_buf_destroy(buf);
	}
	FUZZ_CHECK(sbi_pool_verify(pool, why, sizeof(why)) == 0, "pool: %s",
		   why);
	FUZZ_CHECK(fuzz_input_fds() == 1,
		   "%d descriptors left open on the save file",
		   fuzz_input_fds() - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* Choices that are not part of the file: from its checksum, so an
	 * input always replays the same way. */
	uint32_t pick = sbi_crc32c(data, size);
	unsigned flags = 0;

	if (size > CAP)
		return 0;	/* run.sh bounds -max_len well below */
	/* Known bug "save-strict": a restored SB_BUF_STRICT buffer raises
	 * SIGBUS on its saved pages instead of reading them. */
	if ((pick & 1) && !fuzz_masked("save-strict"))
		flags |= SB_BUF_STRICT;
	if ((pick & 2) && can_wp)
		flags |= SB_BUF_EVICTABLE;
	if (!file) {
		/* The largest file: CAP of data behind the tables of CAP. */
		file_cap = 3 * BLOCK + CAP + CAP / BLOCK * 4;
		file = malloc(file_cap);
		if (!file)
			abort();
	}
	/* Raw. */
	memcpy(file, data, size);
	memset(file + size, 0, file_cap - size);
	try_restore(size, flags);
	/* Fixed up; bytes past the input are the zeros of a sparse file. */
	if (size >= sizeof(struct save_hdr)) {
		memcpy(file, data, size);
		memset(file + size, 0, file_cap - size);
		try_restore(fix_up(size, (pick & 12) != 0), flags);
	}
	return 0;
}
