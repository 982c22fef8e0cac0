/* SPDX-License-Identifier: MIT */
/*
 * A llama2.c model on sparsebuf: the checkpoint memory-mapped flat, the
 * forward pass of llama2.c's run.c on the sbkernels, and a KV cache that is
 * either dense (the full context allocated and zeroed up front, the
 * llama.cpp way) or sparse (sparsebuf_kv: pages placed as positions come).
 * Several sessions (sequences) decode in one batch; a session can fork
 * another that shares its prefix copy-on-write.
 */
#ifndef SPARSEBUF_RUNNER_MODEL_H
#define SPARSEBUF_RUNNER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "sbkernels.h"
#include "sparsebuf.h"
#include "sparsebuf_kv.h"

struct sbm_config {
	int dim;	/* transformer dimension */
	int hidden_dim;	/* FFN */
	int n_layers;
	int n_heads;
	int n_kv_heads;
	int vocab_size;
	int seq_len;	/* maximum context */
};

struct sbm_weights {
	const float *token_embedding;	/* (vocab_size, dim) */
	const float *rms_att;		/* (n_layers, dim) */
	const float *wq;		/* (n_layers, n_heads * head_size, dim) */
	const float *wk;		/* (n_layers, kv_dim, dim) */
	const float *wv;		/* (n_layers, kv_dim, dim) */
	const float *wo;		/* (n_layers, dim, n_heads * head_size) */
	const float *rms_ffn;		/* (n_layers, dim) */
	const float *w1;		/* (n_layers, hidden_dim, dim) */
	const float *w2;		/* (n_layers, dim, hidden_dim) */
	const float *w3;		/* (n_layers, hidden_dim, dim) */
	const float *rms_final;		/* (dim) */
	const float *wcls;		/* (vocab_size, dim) */
};

struct sbm_model {
	struct sbm_config c;
	struct sbm_weights w;
	int head_size, kv_dim;
	void *map;	/* the checkpoint, memory-mapped by sbm_load */
	size_t map_len;
	const char *why; /* after -EBADMSG: which check the file failed */
};

/* What the forward pass can run: its K/V scratch rows, the kernels'. */
#define SBM_MAX_KV_DIM 8192
#define SBM_MAX_HEAD_DIM SBK_MAX_HEAD_DIM

enum sbm_kv_kind { SBM_KV_DENSE, SBM_KV_SPARSE };

struct sbm_session {
	const struct sbm_model *m;
	enum sbm_kv_kind kind;
	enum sbk_dtype dtype;
	int pos;		/* positions in the cache */
	/* dense: (n_layers, seq_len, kv_dim) each; sparse: per layer */
	void *dense_k, *dense_v;
	size_t dense_bytes;
	struct sb_kv_seq *kv;
	/* activations */
	float *x, *xb, *xb2, *hb, *hb2, *q, *logits;	/* one token */
};

/*
 * The checkpoint loaders, safe on any input (tests/test_cli.c crafts bad
 * ones; a fuzzer may call sbm_bind() on its data). Every header field is
 * checked (positive, divisible as the geometry needs, within what the
 * forward pass runs: head size even and <= SBM_MAX_HEAD_DIM, kv_dim <=
 * SBM_MAX_KV_DIM) and the weights it implies, computed with overflow
 * checks, must lie within the file.
 *
 * sbm_bind: the checkpoint in memory [data, data + len), data 4-byte
 * aligned; m points into it (sbm_unload leaves it alone). Returns 0,
 * -EINVAL (NULL or misaligned data), -EBADMSG (not a llama2.c checkpoint
 * or inconsistent with its size: m->why says which check failed).
 *
 * sbm_load: the file at path, memory-mapped. Returns 0 or -errno: -ENODEV
 * when path is not a regular file (a FIFO is refused without blocking),
 * -EISDIR, -EBADMSG as sbm_bind, the open(2)/mmap(2) error.
 */
int sbm_bind(struct sbm_model *m, const void *data, size_t len);
int sbm_load(struct sbm_model *m, const char *path);
void sbm_unload(struct sbm_model *m);

/* A session with an empty KV cache. pool: for SBM_KV_SPARSE (NULL: the
 * default pool). max_ctx: positions (0 = the model's seq_len). */
struct sbm_session *sbm_session_new(const struct sbm_model *m,
				    enum sbm_kv_kind kind, enum sbk_dtype dtype,
				    struct sb_pool *pool, size_t max_ctx,
				    int *err);
/* The sparse KV cache configuration of a session of m (max_ctx 0: the
 * model's seq_len). */
struct sb_kv_config sbm_kv_config(const struct sbm_model *m,
				  enum sbk_dtype dtype, size_t max_ctx);
/* A sparse session continuing kv (restored, or from a prefix cache) at
 * position sb_kv_len(kv); it owns kv from then on (also on success only:
 * on failure the caller still does). Errors: -EINVAL, -EBADMSG (kv is not
 * of this model's geometry or is longer than its seq_len), -ENOMEM. */
struct sbm_session *sbm_session_adopt(const struct sbm_model *m,
				      struct sb_kv_seq *kv, int *err);
/* A sparse session sharing s's positions [0, s->pos) (copy-on-write). */
struct sbm_session *sbm_session_fork(struct sbm_session *s, int *err);
void sbm_session_free(struct sbm_session *s);

/* Run token at the next position of each of n sessions (decoded as one
 * batch: attention for all of them in one call). Each session's logits
 * are in s[i]->logits. Returns 0 or -errno. */
int sbm_forward(struct sbm_session **s, const int *tokens, int n);

/* Bytes the KV cache commits now (dense: all of it; sparse: pages placed
 * in this session) and what a dense cache of the same length would. */
size_t sbm_kv_committed(const struct sbm_session *s);
size_t sbm_kv_dense_bytes(const struct sbm_session *s);

/* llama2.c's sampler: temperature 0 is greedy (argmax); otherwise softmax
 * of logits / temperature, then top-p (nucleus) sampling with topp in
 * (0, 1), else plain multinomial. Same xorshift generator as run.c.
 * sbm_sampler_init returns 0, -ENOMEM, or -EINVAL (vocab < 1, temperature
 * negative or not finite, topp not finite). sbm_sample returns a token in
 * [0, vocab) whatever the logits hold (NaN, infinities) and however small
 * the temperature: when logits / temperature overflows, the limit of the
 * distribution (the argmax) is what it samples. */
struct sbm_sampler {
	float temperature, topp;
	unsigned long long rng;
	int vocab;
	struct {
		float p;
		int i;
	} *probindex;	/* (vocab) scratch for top-p */
};

int sbm_sampler_init(struct sbm_sampler *sp, int vocab, float temperature,
		     float topp, unsigned long long seed);
void sbm_sampler_free(struct sbm_sampler *sp);
int sbm_sample(struct sbm_sampler *sp, float *logits);

/* llama2.c tokenizer files, for printing text. */
struct sbm_tokenizer {
	char **vocab;
	float *scores;
	int vocab_size;
	int max_token_length;
	unsigned char byte_pieces[512];
	const char *why; /* after -EBADMSG: what is wrong with the file */
};

/* The longest token a tokenizer file may declare. */
#define SBM_MAX_TOKEN_LENGTH 65536

/*
 * A tokenizer file: max_token_length (int, 1..SBM_MAX_TOKEN_LENGTH), then
 * vocab_size entries of score (finite float), length (int, 0 to
 * max_token_length) and that many bytes; what follows is ignored.
 *
 * sbm_tokenizer_parse: the file's bytes in memory [data, data + len).
 * Returns 0, -EINVAL (vocab_size < 1), -ENOMEM, -EBADMSG (truncated or
 * out of range: t->why says which). Nothing to free on failure.
 *
 * sbm_tokenizer_load: the file at path. As sbm_tokenizer_parse, and -ENODEV
 * when path is not a regular file (a FIFO is refused without blocking),
 * -EISDIR, the open(2)/read(2) error.
 */
int sbm_tokenizer_parse(struct sbm_tokenizer *t, const void *data, size_t len,
			int vocab_size);
int sbm_tokenizer_load(struct sbm_tokenizer *t, const char *path,
		       int vocab_size);
void sbm_tokenizer_free(struct sbm_tokenizer *t);
/* The text of token after prev (run.c's decode). */
const char *sbm_decode(struct sbm_tokenizer *t, int prev, int token);

#endif /* SPARSEBUF_RUNNER_MODEL_H */
