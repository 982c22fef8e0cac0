/* SPDX-License-Identifier: MIT */
/*
 * sbrun: generate with a llama2.c checkpoint, KV cache on sparsebuf.
 *
 *   sbrun CHECKPOINT [-n STEPS] [-t TEMPERATURE] [-s SEED] [-z TOKENIZER]
 *         [--kv dense|sparse] [--ids] [--prompt-ids 1,2,3] [--stats]
 *         [-p TOPP] [--kv-dtype f32|f16|bf16] [--sessions N]
 *         [--prompt-cache] [--save FILE] [--restore FILE]
 *   sbrun --help | --version
 *
 * Generation starts from BOS (1) followed by the prompt ids; STEPS counts
 * positions as llama2.c's run.c -n does (BOS and the prompt included,
 * default 256, 0 or more than the model's seq_len: seq_len); it stops
 * there or when BOS is sampled. Temperature (0 to 100) 0 is greedy and
 * deterministic; top-p is in [0, 1]. Values are parsed strictly (common/
 * cli.h): "-n abc", "-t nan" or "-p 2" end sbrun with status 2 before it
 * loads anything. The checkpoint and the tokenizer must be regular files
 * whose every header field checks out (runner/model.h); anything else is
 * refused with status 1.
 *
 * --ids prints the generated ids (not BOS, not the prompt) on one line of
 * stdout and nothing else there. Without it stdout gets the text when -z
 * names a tokenizer, else the ids. --stats prints to stderr the KV bytes
 * committed against a dense cache, pages placed, faults and tokens/s.
 * --sessions N (sparse only) forks N sessions from the prompt: they share
 * its KV pages, then decode together in one batch, session i seeded with
 * SEED + i; --ids prints one line per session. With --prompt-cache they
 * are not forked: each looks its prompt up in a prefix cache
 * (sb_kv_cache_get), computes only the positions it did not find, and puts
 * its prompt there for the next; the output is the same.
 *
 * --save FILE (one sparse session) writes the session at the end: its KV
 * cache, the ids generated, the next token and the sampler's state
 * (sb_kv_save, atomic). --restore FILE continues such a session, the KV
 * read in lazily: `sbrun M -n 100 --save s.kv` then `sbrun M -n 256
 * --restore s.kv` prints the ids of positions 100 to 255 of one `-n 256`
 * run (the same ids, greedy or with the same seed); both may be given to
 * continue and save again.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "model.h"

#define MAX_SESSIONS 64

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The ids of --prompt-ids: as many as there are commas and one. */
static int parse_ids(const struct sbc *c, const char *s, int **out)
{
	long long *v;
	int n = 1, *ids;

	for (const char *p = s; *p; p++)
		n += *p == ',';
	v = malloc((size_t)n * sizeof(*v));
	ids = malloc((size_t)n * sizeof(*ids));
	if (!v || !ids) {
		fprintf(stderr, "sbrun: out of memory\n");
		exit(1);
	}
	n = sbc_list(c, s, 0, 1 << 24, v, n);
	for (int i = 0; i < n; i++)
		ids[i] = (int)v[i];
	free(v);
	free(*out);
	*out = ids;
	return n;
}

/* What --save keeps beside the KV cache (the user blob of sb_kv_save),
 * followed by nout int32 ids. */
struct saved_run {
	char magic[8];		/* "SBRUNST1" */
	int32_t vocab, dim, n_layers, seq_len;	/* the model it ran */
	int32_t pos;		/* positions in the KV cache */
	int32_t token;		/* the next token to run at pos */
	int32_t done;		/* BOS was sampled: the run had ended */
	int32_t nout;		/* ids generated so far, all runs */
	uint64_t rng;		/* the sampler's state */
};

#define RUN_MAGIC "SBRUNST1"

static int save_run(const char *path, struct sbm_session *s,
		    const struct sbm_sampler *sp, int token, int done,
		    const int *prev, int nprev, const int *out, int nout)
{
	const struct sbm_config *c = &s->m->c;
	size_t len = sizeof(struct saved_run) +
		     (size_t)(nprev + nout) * sizeof(int32_t);
	struct saved_run *r = calloc(1, len);
	int32_t *ids = (int32_t *)(r + 1);
	int e;

	if (!r)
		return -ENOMEM;
	memcpy(r->magic, RUN_MAGIC, sizeof(r->magic));
	r->vocab = c->vocab_size;
	r->dim = c->dim;
	r->n_layers = c->n_layers;
	r->seq_len = c->seq_len;
	r->pos = s->pos;
	r->token = token;
	r->done = done;
	r->nout = nprev + nout;
	r->rng = sp->rng;
	for (int i = 0; i < nprev; i++)
		ids[i] = prev[i];
	for (int i = 0; i < nout; i++)
		ids[nprev + i] = out[i];
	e = sb_kv_save(s->kv, path, r, len);
	free(r);
	return e;
}

/*
 * The pool of the sparse KV cache. Its page is the unit the cache grows,
 * shares and caches prefixes in, so it follows the model: a sixteenth of
 * a K or V region (seq_len rows), between 4 KiB and the default 256 KiB,
 * unless SPARSEBUF_PAGE_SIZE or SPARSEBUF_HUGETLB says otherwise.
 * stories260K's regions are 64 KiB: 4 KiB pages, where 256 KiB pages
 * would commit 4x a dense cache; a model with a 32k context keeps
 * 256 KiB.
 */
static struct sb_pool *default_pool(void)
{
	struct sb_pool *pool = sb_default_pool();

	if (!pool)
		fprintf(stderr, "sbrun: sparsebuf: %s\n",
			strerror(-sb_default_pool_error()));
	return pool;
}

static struct sb_pool *kv_pool(const struct sbm_model *m, enum sbk_dtype dtype)
{
	struct sb_pool_opts o;
	struct sb_pool *pool;
	size_t region, page = 4096;
	int err;

	if (getenv("SPARSEBUF_PAGE_SIZE"))
		return default_pool();
	sb_pool_opts_init(&o);
	/* SPARSEBUF_HUGETLB=1: pages of the huge page size, as asked. */
	if (o.flags & SB_POOL_HUGETLB)
		return default_pool();
	region = (size_t)m->c.seq_len * (size_t)m->kv_dim *
		 sbk_dtype_size(dtype);
	while (page * 2 <= region / 16 && page * 2 <= o.page_size)
		page *= 2;
	if (page == o.page_size || !o.page_size)
		return default_pool();
	o.page_size = page;
	pool = sb_pool_create(&o, &err);
	if (!pool)
		fprintf(stderr, "sbrun: a pool of %zu KiB pages: %s\n",
			page >> 10, strerror(-err));
	return pool;
}

/* The session a --save left, or NULL with the reason printed. */
static struct sbm_session *restore_run(const struct sbm_model *m,
				       struct sb_pool *pool, const char *path,
				       struct saved_run *st, int **prev)
{
	const struct sbm_config *c = &m->c;
	struct sbm_session *s;
	struct sb_kv_seq *kv;
	const struct saved_run *r;
	size_t len;
	int e;

	kv = sb_kv_restore(pool, path, &e);
	if (!kv) {
		fprintf(stderr, "sbrun: %s: %s\n", path,
			e == -EBADMSG ? "not a session saved by sbrun --save, "
					"or damaged"
				      : strerror(-e));
		return NULL;
	}
	r = sb_kv_user(kv, &len);
	if (!r || len < sizeof(*r) || memcmp(r->magic, RUN_MAGIC, 8) ||
	    r->nout < 0 ||
	    len != sizeof(*r) + (size_t)r->nout * sizeof(int32_t) ||
	    r->pos < 0 || (size_t)r->pos != sb_kv_len(kv) || r->token < 0 ||
	    r->token >= c->vocab_size) {
		fprintf(stderr, "sbrun: %s: not a session saved by sbrun "
				"--save\n", path);
		sb_kv_destroy(kv);
		return NULL;
	}
	if (r->vocab != c->vocab_size || r->dim != c->dim ||
	    r->n_layers != c->n_layers || r->seq_len != c->seq_len) {
		fprintf(stderr, "sbrun: %s: saved with another model\n", path);
		sb_kv_destroy(kv);
		return NULL;
	}
	*st = *r;
	*prev = malloc((size_t)(r->nout ? r->nout : 1) * sizeof(int));
	if (!*prev) {
		sb_kv_destroy(kv);
		return NULL;
	}
	for (int i = 0; i < r->nout; i++)
		(*prev)[i] = ((const int32_t *)(r + 1))[i];
	s = sbm_session_adopt(m, kv, &e);
	if (!s) {
		fprintf(stderr, "sbrun: %s: %s\n", path,
			e == -EBADMSG ? "saved with another model"
				      : strerror(-e));
		sb_kv_destroy(kv);
		return NULL;
	}
	return s;
}

/* A loader's error, as someone running sbrun needs it. */
static void load_error(const char *path, int r, const char *what,
		       const char *why)
{
	if (r == -ENODEV)
		fprintf(stderr, "sbrun: %s: not a regular file\n", path);
	else if (r == -EBADMSG)
		fprintf(stderr, "sbrun: %s: not a llama2.c %s: %s\n", path,
			what, why ? why : "?");
	else
		fprintf(stderr, "sbrun: %s: %s\n", path, strerror(-r));
}

enum {
	OPT_STEPS = 'n', OPT_TEMP = 't', OPT_SEED = 's', OPT_TOK = 'z',
	OPT_TOPP = 'p', OPT_KV = 256, OPT_IDS, OPT_PROMPT, OPT_STATS,
	OPT_DTYPE, OPT_SESSIONS, OPT_SAVE, OPT_RESTORE, OPT_PCACHE,
};

static const struct sbc_opt opts[] = {
	{OPT_STEPS, "-n", "STEPS", "positions to run, BOS and the prompt "
				   "included (default 256; 0: seq_len)"},
	{OPT_TEMP, "-t", "TEMPERATURE", "0 to 100; 0 is greedy (default 1)"},
	{OPT_TOPP, "-p", "TOPP", "top-p in [0, 1]; 0 or 1: plain sampling "
				 "(default 0.9)"},
	{OPT_SEED, "-s", "SEED", "random seed (default 0: the time)"},
	{OPT_TOK, "-z", "TOKENIZER", "llama2.c tokenizer file: print text"},
	{OPT_KV, "--kv", "dense|sparse", "KV cache kind (default sparse)"},
	{OPT_DTYPE, "--kv-dtype", "f32|f16|bf16", "KV cache element type "
						  "(default f32)"},
	{OPT_PROMPT, "--prompt-ids", "1,2,3", "prompt token ids after BOS"},
	{OPT_SESSIONS, "--sessions", "N", "fork N sessions (1..64) from the "
					  "prompt (sparse only)"},
	{OPT_PCACHE, "--prompt-cache", NULL, "with --sessions: sessions find "
					     "the prompt in a prefix cache"},
	{OPT_SAVE, "--save", "FILE", "save the session (KV, ids, sampler) at "
				     "the end"},
	{OPT_RESTORE, "--restore", "FILE", "continue a session saved with "
					   "--save"},
	{OPT_IDS, "--ids", NULL, "print the generated ids, not text"},
	{OPT_STATS, "--stats", NULL, "print KV bytes, faults and tokens/s "
				     "to stderr"},
	{0},
};

/* --prompt-cache: each session looks the prompt (BOS and the prompt ids)
 * up in a prefix cache, computes the positions it did not find and its
 * first token, and puts the prompt there for the next session. */
static int prompt_from_cache(const struct sbm_model *m, struct sb_pool *pool,
			     enum sbk_dtype dtype,
			     const int *prompt, int nprompt, int steps,
			     int nsess, struct sbm_session **s,
			     struct sbm_sampler *sp, int *token, int *done,
			     int **out, int *nout, double *ttft,
			     struct sb_kv_cache **cache, long *hits,
			     long *reused, long *tokens_run)
{
	int n = nprompt + 1 < steps ? nprompt + 1 : steps;
	struct sb_kv_config cfg = sbm_kv_config(m, dtype, 0);
	const struct sbm_config *c = &m->c;
	int32_t *toks;
	char model_id[96];
	uint32_t h = 2166136261u;
	int r = 0;

	if (!pool)
		return -ENOMEM;
	/* The model: its shape and a hash of its first weights. */
	for (int i = 0; i < 4096 && i < c->dim * c->dim; i++) {
		uint32_t w;

		memcpy(&w, &m->w.wq[i], sizeof(w));
		h = (h ^ w) * 16777619u;
	}
	snprintf(model_id, sizeof(model_id), "llama2.c %d/%d/%d/%d/%d %08x",
		 c->dim, c->hidden_dim, c->n_layers, c->vocab_size, c->seq_len,
		 h);
	*cache = sb_kv_cache_create(pool, &cfg, model_id, (size_t)256 << 20,
				    &r);
	if (!*cache)
		return r;
	toks = malloc((size_t)n * sizeof(*toks));
	if (!toks)
		return -ENOMEM;
	toks[0] = 1;
	for (int i = 1; i < n; i++)
		toks[i] = prompt[i - 1];
	for (int i = 0; i < nsess && r >= 0; i++) {
		double ti = now_s();
		struct sb_kv_seq *kv;
		size_t hit;
		long put;

		/* Without the last position: it gives the logits. */
		kv = sb_kv_cache_get(*cache, toks, (size_t)n - 1, &hit, &r);
		if (!kv)
			break;
		s[i] = sbm_session_adopt(m, kv, &r);
		if (!s[i]) {
			sb_kv_destroy(kv);
			break;
		}
		*hits += hit > 0;
		*reused += (long)hit;
		for (int p = (int)hit; p < n && r >= 0; p++) {
			int t = toks[p];

			r = sbm_forward(&s[i], &t, 1);
			++*tokens_run;
		}
		if (r < 0)
			break;
		put = sb_kv_cache_put(*cache, s[i]->kv, toks, (size_t)n);
		if (put < 0) {
			r = (int)put;
			break;
		}
		if (n < steps) {
			int next = sbm_sample(&sp[i], s[i]->logits);

			if (next == 1) {
				done[i] = 1;
			} else {
				out[i][nout[i]++] = next;
				token[i] = next;
			}
		} else {
			done[i] = 1;
		}
		ttft[i] = now_s() - ti;
	}
	free(toks);
	return r < 0 ? r : 0;
}

int main(int argc, char **argv)
{
	static const char *const kinds[] = {"dense", "sparse", NULL};
	static const char *const dtypes[] = {"f32", "f16", "bf16", NULL};
	static const enum sbk_dtype dtype_of[] = {SBK_F32, SBK_F16, SBK_BF16};
	struct sbc cli = {
		.prog = "sbrun",
		.usage = "CHECKPOINT [options]",
		.about = "Generate with a llama2.c checkpoint, the KV cache on "
			 "sparsebuf. Without -z or with --ids,\nstdout gets "
			 "the generated ids; with -z the text.",
		.opts = opts,
	};
	const char *ckpt = NULL, *tokpath = NULL, *val;
	int steps = 256, ids = 0, stats = 0, nsess = 1, nprompt = 0, opt, r;
	int *prompt = NULL, *prev_ids = NULL, nprev = 0, pcache = 0;
	const char *save_path = NULL, *restore_path = NULL;
	struct saved_run saved;
	struct sb_kv_cache *cache = NULL;
	struct sb_pool *pool = NULL;
	long cache_hits = 0, cache_reused = 0;
	double ttft[MAX_SESSIONS] = {0};
	float temperature = 1.0f, topp = 0.9f;
	unsigned long long seed = 0;
	enum sbm_kv_kind kind = SBM_KV_SPARSE;
	enum sbk_dtype dtype = SBK_F32;
	struct sbm_model m;
	struct sbm_tokenizer tok;
	struct sbm_session *s[MAX_SESSIONS];
	struct sbm_sampler sp[MAX_SESSIONS];
	int token[MAX_SESSIONS], done[MAX_SESSIONS] = {0};
	int *out[MAX_SESSIONS], nout[MAX_SESSIONS] = {0};
	int pos = 0, active;
	double t0, t_gen = 0;
	long tokens_run = 0, tokens_decode = 0;
	float *first_logits;

	memset(&saved, 0, sizeof(saved));
	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &val)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			if (ckpt)
				sbc_fail(&cli, "one CHECKPOINT expected, "
					 "'%s' is a second", val);
			ckpt = val;
			break;
		case OPT_STEPS:
			steps = (int)sbc_int(&cli, val, 0, 1 << 30);
			break;
		case OPT_TEMP:
			temperature = (float)sbc_double(&cli, val, 0, 100);
			break;
		case OPT_TOPP:
			topp = (float)sbc_double(&cli, val, 0, 1);
			break;
		case OPT_SEED:
			seed = sbc_u64(&cli, val, 0, UINT64_MAX);
			break;
		case OPT_TOK:
			tokpath = val;
			break;
		case OPT_KV:
			kind = sbc_choice(&cli, val, kinds) ? SBM_KV_SPARSE
							    : SBM_KV_DENSE;
			break;
		case OPT_DTYPE:
			dtype = dtype_of[sbc_choice(&cli, val, dtypes)];
			break;
		case OPT_PROMPT:
			nprompt = parse_ids(&cli, val, &prompt);
			break;
		case OPT_SESSIONS:
			nsess = (int)sbc_int(&cli, val, 1, MAX_SESSIONS);
			break;
		case OPT_IDS:
			ids = 1;
			break;
		case OPT_SAVE:
			save_path = val;
			break;
		case OPT_RESTORE:
			restore_path = val;
			break;
		case OPT_PCACHE:
			pcache = 1;
			break;
		case OPT_STATS:
			stats = 1;
			break;
		}
	}
	if (!ckpt)
		sbc_fail(&cli, "no CHECKPOINT given");
	if (nsess > 1 && kind != SBM_KV_SPARSE)
		sbc_fail(&cli, "--sessions needs --kv sparse");
	if ((save_path || restore_path) &&
	    (nsess > 1 || kind != SBM_KV_SPARSE))
		sbc_fail(&cli, "--save and --restore work on one sparse "
			 "session");
	if (pcache && kind != SBM_KV_SPARSE)
		sbc_fail(&cli, "--prompt-cache needs --kv sparse");
	if (restore_path && (nprompt || pcache))
		sbc_fail(&cli, "--restore continues a saved session: no "
			 "--prompt-ids or --prompt-cache");

	if (!seed)
		seed = (unsigned long long)time(NULL);
	r = sbm_load(&m, ckpt);
	if (r < 0) {
		load_error(ckpt, r, "checkpoint", m.why);
		return 1;
	}
	for (int i = 0; i < nprompt; i++) {
		if (prompt[i] >= m.c.vocab_size) {
			fprintf(stderr, "sbrun: prompt id %d >= vocab %d\n",
				prompt[i], m.c.vocab_size);
			return 2;
		}
	}
	if (steps <= 0 || steps > m.c.seq_len)
		steps = m.c.seq_len;
	if (tokpath && (r = sbm_tokenizer_load(&tok, tokpath,
					       m.c.vocab_size)) < 0) {
		load_error(tokpath, r, "tokenizer for this model", tok.why);
		return 1;
	}
	first_logits = malloc((size_t)m.c.vocab_size * sizeof(float));
	if (!first_logits)
		return 1;
	if (kind == SBM_KV_SPARSE) {
		pool = kv_pool(&m, dtype);
		if (!pool)
			return 1;
	}
	if (restore_path) {
		s[0] = restore_run(&m, pool, restore_path, &saved, &prev_ids);
		if (!s[0]) {
			free(first_logits);
			if (pool != sb_default_pool())
				sb_pool_destroy(pool);
			return 1;
		}
		nprev = saved.nout;
		dtype = s[0]->dtype;
	} else if (!pcache) {
		s[0] = sbm_session_new(&m, kind, dtype, pool, 0, &r);
		if (!s[0]) {
			fprintf(stderr, "sbrun: KV cache: %s\n",
				strerror(-r));
			free(first_logits);
			if (pool && pool != sb_default_pool())
				sb_pool_destroy(pool);
			return 1;
		}
	}
	for (int i = 0; i < nsess; i++) {
		r = sbm_sampler_init(&sp[i], m.c.vocab_size, temperature, topp,
				     seed + (unsigned long long)i);
		if (r < 0) {
			fprintf(stderr, "sbrun: sampler: %s\n", strerror(-r));
			return 1;
		}
		out[i] = malloc((size_t)steps * sizeof(int));
		if (!out[i])
			return 1;
	}

	t0 = now_s();
	if (restore_path) {
		/* Where the saved run stopped. */
		sp[0].rng = saved.rng;
		pos = saved.pos;
		token[0] = saved.token;
		done[0] = saved.done;
		goto decode;
	}
	if (pcache) {
		r = prompt_from_cache(&m, pool, dtype, prompt, nprompt, steps, nsess,
				      s, sp, token, done, out, nout, ttft,
				      &cache, &cache_hits, &cache_reused,
				      &tokens_run);
		if (r < 0)
			goto fail;
		pos = nprompt + 1 < steps ? nprompt + 1 : steps;
		goto decode;
	}
	/* The prompt: BOS then the prompt ids, in session 0. */
	token[0] = 1;
	for (; pos < steps; pos++) {
		int next;

		if ((r = sbm_forward(&s[0], &token[0], 1)) < 0)
			goto fail;
		tokens_run++;
		if (pos < nprompt) {
			token[0] = prompt[pos];
			continue;
		}
		/* Sampling scales the logits in place: forks sample a copy. */
		memcpy(first_logits, s[0]->logits,
		       (size_t)m.c.vocab_size * sizeof(float));
		next = sbm_sample(&sp[0], s[0]->logits);
		if (next == 1) {
			done[0] = 1;
			break;
		}
		out[0][nout[0]++] = next;
		token[0] = next;
		pos++;
		break;	/* the first generated token: fork here */
	}
	/* Fork the other sessions from the prompt (plus that first token
	 * computed by session 0, which they sample differently). */
	for (int i = 1; i < nsess; i++) {
		s[i] = sbm_session_fork(s[0], &r);
		if (!s[i])
			goto fail;
		memcpy(s[i]->logits, first_logits,
		       (size_t)m.c.vocab_size * sizeof(float));
		r = sbm_sample(&sp[i], s[i]->logits);
		token[i] = r;
		if (r == 1)
			done[i] = 1;
		else
			out[i][nout[i]++] = r;
	}
decode:
	t_gen = now_s();
	/* Decode: every session still going, in one batch per position. */
	for (active = 0; pos < steps; pos++) {
		struct sbm_session *batch[MAX_SESSIONS];
		int btok[MAX_SESSIONS], who[MAX_SESSIONS];

		active = 0;
		for (int i = 0; i < nsess; i++) {
			if (!done[i]) {
				who[active] = i;
				batch[active] = s[i];
				btok[active++] = token[i];
			}
		}
		if (!active)
			break;
		if ((r = sbm_forward(batch, btok, active)) < 0)
			goto fail;
		tokens_run += active;
		tokens_decode += active;
		for (int b = 0; b < active; b++) {
			int i = who[b], next = sbm_sample(&sp[i], s[i]->logits);

			if (next == 1) {
				done[i] = 1;
				continue;
			}
			out[i][nout[i]++] = next;
			token[i] = next;
		}
	}
	t_gen = now_s() - t_gen;

	for (int i = 0; i < nsess; i++) {
		if (ids || !tokpath) {
			for (int k = 0; k < nout[i]; k++)
				printf(k ? " %d" : "%d", out[i][k]);
			printf("\n");
		} else {
			int prev = nprev     ? prev_ids[nprev - 1]
				   : nprompt ? prompt[nprompt - 1]
					     : 1;

			for (int k = 0; k < nout[i]; k++) {
				fputs(sbm_decode(&tok, prev, out[i][k]),
				      stdout);
				prev = out[i][k];
			}
			printf("\n");
		}
	}
	if (save_path) {
		r = save_run(save_path, s[0], &sp[0], token[0], done[0],
			     prev_ids, nprev, out[0], nout[0]);
		if (r < 0) {
			fprintf(stderr, "sbrun: --save %s: %s\n", save_path,
				strerror(-r));
			return 1;
		}
	}
	if (stats) {
		struct sb_stats st;
		size_t committed = 0, dense = 0;

		for (int i = 0; i < nsess; i++) {
			committed += sbm_kv_committed(s[i]);
			dense += sbm_kv_dense_bytes(s[i]);
		}
		fprintf(stderr,
			"kv: %s %s, %d session(s), %d positions in session 0\n",
			kind == SBM_KV_DENSE ? "dense" : "sparse",
			sbk_dtype_size(dtype) == 4 ? "f32" : "16-bit",
			nsess, s[0]->pos);
		fprintf(stderr, "kv bytes committed: %zu (dense would commit "
				"%zu: %.1f%%)%s\n",
			committed, dense,
			dense ? 100.0 * (double)committed / (double)dense : 0,
			nsess > 1 ? "; shared pages counted in each session"
				  : "");
		if (kind == SBM_KV_SPARSE &&
		    sb_pool_stats(pool, &st) == 0)
			fprintf(stderr,
				"pool: %zu pages of %zu KiB in use = %zu bytes "
				"(shared pages once), %zu bytes resident, %llu "
				"pages placed, %llu faults, %llu copies\n",
				st.pages_used, st.page_size >> 10,
				st.pages_used * st.page_size, st.bytes_resident,
				(unsigned long long)(st.maps + st.fault_places),
				(unsigned long long)st.faults,
				(unsigned long long)st.cow_copies);
		if (restore_path)
			fprintf(stderr, "restored: %d positions from %s, "
					"%d ids before\n",
				saved.pos, restore_path, nprev);
		if (pcache) {
			double sum = 0;

			for (int i = 1; i < nsess; i++)
				sum += ttft[i];
			fprintf(stderr,
				"prompt cache: %ld hit(s) in %d session(s), %ld "
				"positions reused; time to first token %.2f ms "
				"(session 0), %.2f ms (mean of the others)\n",
				cache_hits, nsess, cache_reused, ttft[0] * 1e3,
				nsess > 1 ? sum / (nsess - 1) * 1e3 : 0.0);
		}
		fprintf(stderr, "tokens/s: %.1f (%ld positions run in %.3f s;"
				" batched decode %.1f tokens/s)\n",
			(double)tokens_run / (now_s() - t0), tokens_run,
			now_s() - t0,
			t_gen > 0 ? (double)tokens_decode / t_gen : 0.0);
	}
	for (int i = 0; i < nsess; i++) {
		sbm_session_free(s[i]);
		sbm_sampler_free(&sp[i]);
		free(out[i]);
	}
	sb_kv_cache_destroy(cache);
	if (pool && pool != sb_default_pool())
		sb_pool_destroy(pool);
	free(prev_ids);
	if (tokpath)
		sbm_tokenizer_free(&tok);
	free(first_logits);
	free(prompt);
	sbm_unload(&m);
	return 0;
fail:
	fprintf(stderr, "sbrun: %s\n", strerror(-r));
	return 1;
}
