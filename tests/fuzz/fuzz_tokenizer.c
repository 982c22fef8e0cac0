/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the llama2.c tokenizer loaders and decoder (runner/model.c
 * sbm_tokenizer_parse on the bytes in memory, sbm_tokenizer_load on the
 * file, sbm_decode). Input: a little-endian int, the
 * vocabulary size the loader is told (sbrun passes the checkpoint's; kept
 * within [-2, 4096] so a mutated size costs no more than the file), then
 * the tokenizer file.
 *
 * The contract checked: both loaders agree; they fail with -EINVAL,
 * -EBADMSG or -ENOMEM and leave nothing to free, or every token decodes (after
 * any previous token, BOS included) to a NUL-terminated string, and ids out of
 * range to "".
 */
#include "fuzz.h"
#include "../../runner/model.h"

static void check_decode(struct sbm_tokenizer *t)
{
	for (int i = -1; i <= t->vocab_size; i++) {
		const char *a = sbm_decode(t, i ? i - 1 : 1, i);
		const char *b = sbm_decode(t, 1, i);

		FUZZ_CHECK(a && b, "token %d decodes to NULL", i);
		/* strlen reads up to the NUL: ASan checks the piece. */
		(void)(strlen(a) + strlen(b));
		if (i < 0 || i >= t->vocab_size)
			FUZZ_CHECK(!*a && !*b,
				   "token %d is out of range but "
				   "decodes to \"%s\"",
				   i, a);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sbm_tokenizer tp, tl;
	void *copy;
	int32_t vocab;
	int rp, rl;

	if (size < 4)
		return 0;
	vocab = (int32_t)fuzz_le32(data);
	if (vocab < -2 || vocab > 4096)
		vocab = (int32_t)((uint32_t)vocab % 4097);
	data += 4, size -= 4;
	/* An exact-size heap copy: ASan sees any read past the file. */
	copy = malloc(size ? size : 1);
	if (!copy)
		abort();
	memcpy(copy, data, size);
	rp = sbm_tokenizer_parse(&tp, copy, size, vocab);
	rl = sbm_tokenizer_load(&tl, fuzz_file(data, size), vocab);
	FUZZ_CHECK(fuzz_input_fds() == 1, "the loader left the file open");
	FUZZ_CHECK(rp == rl, "sbm_tokenizer_parse says %d, _load %d", rp, rl);
	if (rp < 0) {
		FUZZ_CHECK(rp == -EINVAL || rp == -EBADMSG || rp == -ENOMEM,
			   "refused with %d", rp);
		FUZZ_CHECK(!tp.vocab && !tp.scores && !tl.vocab && !tl.scores,
			   "failed, but kept memory");
	} else {
		FUZZ_CHECK(vocab > 0 && tp.vocab_size == vocab &&
				   tl.vocab_size == vocab,
			   "loaded %d tokens for a vocabulary of %d",
			   tp.vocab_size, vocab);
		check_decode(&tp);
		check_decode(&tl);
		sbm_tokenizer_free(&tp);
		sbm_tokenizer_free(&tl);
	}
	free(copy);
	return 0;
}
