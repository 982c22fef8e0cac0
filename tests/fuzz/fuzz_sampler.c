/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the llama2.c sampler (runner/model.c sbm_sampler_init, sbm_sample):
 * its settings come from sbrun's command line (-t, -p, -s) and its logits
 * from a checkpoint, both outside input.
 *
 * Input: u16 vocabulary size (1 to 1024), f32 temperature, f32 top-p, u64
 * seed, then logits (f32, repeated to fill the vocabulary; zeros if none).
 * The contract checked: sbm_sampler_init refuses the settings with -EINVAL
 * (or -ENOMEM), or every sample, whatever the logits hold, is a token in
 * [0, vocab). (Issue 10, defect 8: NaN or tiny temperatures read before
 * the candidates array; so did flat logits with a small top-p, which this
 * harness found: tests/fuzz/corpus/sampler/regress-uniform-small-topp.)
 */
#include "fuzz.h"
#include "../../runner/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sbm_sampler sp;
	float t, p, *logits, *work;
	uint64_t seed;
	int vocab, r;

	if (size < 18)
		return 0;
	vocab = (int)(fuzz_le32(data) & 0xffff) % 1024 + 1;
	memcpy(&t, data + 2, 4);
	memcpy(&p, data + 6, 4);
	seed = fuzz_le64(data + 10);
	data += 18, size -= 18;
	logits = malloc((size_t)vocab * sizeof(float));
	work = malloc((size_t)vocab * sizeof(float));
	if (!logits || !work)
		abort();
	for (int i = 0; i < vocab; i++) {
		logits[i] = 0.0f;
		if (size >= 4)
			memcpy(&logits[i], data + (size_t)i * 4 % (size & ~3u),
			       4);
	}
	r = sbm_sampler_init(&sp, vocab, t, p, seed);
	if (r < 0) {
		FUZZ_CHECK(r == -EINVAL || r == -ENOMEM,
			   "sbm_sampler_init failed with %d", r);
		goto out;
	}
	for (int k = 0; k < 4; k++) {
		int tok;

		memcpy(work, logits, (size_t)vocab * sizeof(float));
		tok = sbm_sample(&sp, work);
		FUZZ_CHECK(tok >= 0 && tok < vocab,
			   "sampled %d of %d (temperature %g, top-p %g)", tok,
			   vocab, (double)t, (double)p);
	}
	sbm_sampler_free(&sp);
out:
	free(logits);
	free(work);
	return 0;
}
