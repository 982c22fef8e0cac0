/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the sbflash checkpoint header (flash/format.h, flash/model.c
 * sbf_header_read) and, for headers it accepts, the run over the file
 * (flash/runner.c sbf_run: read the resident section, bind, decode).
 *
 * Input: a header (struct sbf_header), then bytes that fill the weights
 * (the file is extended to the size the header declares). Each input is
 * tried twice: raw, and with the derived fields (bundle,
 * offsets, sizes) recomputed by sbf_layout() from the mutated geometry,
 * as sbgen writes them: that gets past the consistency check to whatever
 * geometry the mutation made.
 *
 * The contract checked: sbf_header_read fails with -EBADMSG, or the
 * header's layout is the one its geometry gives, computed here without
 * overflow (128-bit): sections in order, aligned, bundles big enough for
 * their rows (a layout that wrapped around 64 bits got through before:
 * corpus/flash/regress-layout-wraps-64bit). A file of at most 1 MiB then
 * runs two steps in the resident, mmap_dense and mmap_sparse modes (and,
 * for some inputs, flash, when userfaultfd is there), as sbflash would;
 * it must not crash and may only fail with a -errno.
 */
#include "fuzz.h"
#include "../../flash/model.h"
#include "../../flash/runner.h"
#include "sbkernels.h"
#include "sparsebuf.h"

#include <fcntl.h>
#include <stddef.h>

typedef unsigned __int128 u128;

#define RUN_MAX ((size_t)1 << 20)

static int have_uffd;
static uint8_t *file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct sb_features f;

	(void)argc;
	(void)argv;
	sb_features_get(&f);
	have_uffd = f.uffd_mode != SB_UFFD_NONE;
	file = malloc(RUN_MAX);
	if (!file)
		abort();
	return 0;
}

static u128 align(u128 n)
{
	return (n + 4095) / 4096 * 4096;
}

static void check_layout(const struct sbf_header *h)
{
	u128 d = h->dim, kv, layer, res, ffn_off, ffn;

	FUZZ_CHECK(h->dim && h->n_layers && h->n_heads && h->n_kv_heads &&
			   h->hidden && h->vocab && h->rank,
		   "accepted a zero dimension");
	FUZZ_CHECK(h->dim % h->n_heads == 0 &&
			   h->n_heads % h->n_kv_heads == 0 &&
			   (h->dim / h->n_heads) % 2 == 0,
		   "accepted dim %u heads %u/%u", h->dim, h->n_heads,
		   h->n_kv_heads);
	kv = d / h->n_heads * h->n_kv_heads;
	layer = d + d * d + 2 * kv * d + d * d + d + h->hidden +
		(u128)h->rank * d + (u128)h->hidden * h->rank;
	res = ((u128)h->vocab * d + (u128)h->n_layers * layer + d) * 4;
	ffn_off = align(4096 + res);
	ffn = (u128)h->n_layers * h->hidden * h->bundle;
	FUZZ_CHECK(h->bundle % 4096 == 0 && h->bundle >= d * 4,
		   "bundle %u for dim %u", h->bundle, h->dim);
	FUZZ_CHECK(h->res_off == 4096 && h->res_bytes == res &&
			   h->ffn_off == ffn_off && h->ffn_bytes == ffn &&
			   h->file_bytes == ffn_off + ffn,
		   "accepted a layout that is not the geometry's (it wrapped "
		   "around?): dim %u layers %u heads %u/%u hidden %u vocab %u "
		   "rank %u: res_bytes %llu (true %.4g), file_bytes %llu (true "
		   "%.4g)",
		   h->dim, h->n_layers, h->n_heads, h->n_kv_heads, h->hidden,
		   h->vocab, h->rank, (unsigned long long)h->res_bytes,
		   (double)res, (unsigned long long)h->file_bytes,
		   (double)(ffn_off + ffn));
}

/* Run the file (file[0, len), written already) in the modes picked. */
static void run(size_t len, unsigned pick)
{
	static const enum sbf_mode modes[] = {SBF_RESIDENT, SBF_MMAP_DENSE,
					      SBF_MMAP_SPARSE, SBF_FLASH};

	for (size_t k = 0; k < 4; k++) {
		struct sbf_opts o = {0};
		struct sbf_result res;
		int r;

		if (modes[k] == SBF_FLASH && (!have_uffd || (pick & 3)))
			continue;
		o.path = fuzz_file(file, len);
		o.mode = modes[k];
		o.k = 1 + (int)(pick >> 2 & 3);
		o.steps = 2;
		o.seed = pick;
		o.measure = 1;
		o.madv_random = 1;
		r = sbf_run(&o, &res);
		FUZZ_CHECK(r == 0 || r == -ENOMEM || r == -EINVAL ||
				   r == -EBADMSG || r == -EIO,
			   "sbf_run(%s) failed with %d", sbf_mode_name(o.mode),
			   r);
		FUZZ_CHECK(fuzz_input_fds() == 1,
			   "sbf_run(%s) left the file "
			   "open",
			   sbf_mode_name(o.mode));
	}
}

/*
 * The file: the header bytes; when they are a whole header declaring at
 * most RUN_MAX bytes, the rest filled with the input's other bytes over
 * and over (and then run), else extended sparse to the declared size (up
 * to 2^40: a memfd costs nothing for holes), so that the size check
 * passes and the geometry checks are what decide.
 */
static void try_header(const uint8_t *head, size_t size, const uint8_t *rest,
		       size_t n, unsigned pick)
{
	struct sbf_header h;
	uint64_t declared = 0;
	size_t len = size;
	int r;

	if (size >= sizeof(h))
		memcpy(&declared,
		       head + offsetof(struct sbf_header, file_bytes),
		       sizeof(declared));
	if (declared > size && declared <= RUN_MAX) {
		len = (size_t)declared;
		memset(file, 0, len);
		memcpy(file, head, size);
		for (size_t i = size; n && i < len; i++)
			file[i] = rest[(i - size) % n];
		fuzz_file(file, len);
	} else {
		fuzz_file(head, size);
		if (declared > size && declared <= ((uint64_t)1 << 40) &&
		    ftruncate(fuzz_file_fd(), (off_t)declared) < 0)
			abort();
	}
	r = sbf_header_read(fuzz_file_fd(), &h);
	if (r < 0) {
		FUZZ_CHECK(r == -EBADMSG, "sbf_header_read failed with %d", r);
		return;
	}
	check_layout(&h);
	if (len == h.file_bytes)
		run(len, pick);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sbf_header h;
	size_t hs = sizeof(h);
	unsigned pick = size ? data[size - 1] : 0;

	try_header(data, size, data + (size > hs ? hs : size),
		   size > hs ? size - hs : 0, pick);
	if (size < hs)
		return 0;
	memcpy(&h, data, hs);
	/* sbf_layout() divides by n_heads (sbgen checks the geometry
	 * first); it computes in 64 bits and truncates the bundle to 32:
	 * what a buggy or hostile sbgen could write. */
	if (!h.n_heads)
		return 0;
	sbf_layout(&h);
	try_header((const uint8_t *)&h, hs, data + hs, size - hs, pick);
	return 0;
}
