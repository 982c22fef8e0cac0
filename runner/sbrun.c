/* SPDX-License-Identifier: MIT */
/*
 * sbrun: generate with a llama2.c checkpoint, KV cache on sparsebuf.
 *
 *   sbrun CHECKPOINT [-n STEPS] [-t TEMPERATURE] [-s SEED] [-z TOKENIZER]
 *         [--kv dense|sparse] [--ids] [--prompt-ids 1,2,3] [--stats]
 *         [-p TOPP] [--kv-dtype f32|f16|bf16] [--sessions N]
 *
 * Generation starts from BOS (1) followed by the prompt ids; STEPS counts
 * positions as llama2.c's run.c -n does (BOS and the prompt included,
 * default 256, at most the model's seq_len); it stops there or when BOS is
 * sampled. Temperature 0 is greedy and deterministic.
 *
 * --ids prints the generated ids (not BOS, not the prompt) on one line of
 * stdout and nothing else there. Without it stdout gets the text when -z
 * names a tokenizer, else the ids. --stats prints to stderr the KV bytes
 * committed against a dense cache, pages placed, faults and tokens/s.
 * --sessions N (sparse only) forks N sessions from the prompt: they share
 * its KV pages, then decode together in one batch, session i seeded with
 * SEED + i; --ids prints one line per session.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

#define MAX_SESSIONS 64

static void usage(void)
{
	fprintf(stderr,
		"usage: sbrun CHECKPOINT [-n STEPS] [-t TEMPERATURE] [-s SEED] "
		"[-z TOKENIZER]\n"
		"             [--kv dense|sparse] [--ids] [--prompt-ids 1,2,3] "
		"[--stats]\n"
		"             [-p TOPP] [--kv-dtype f32|f16|bf16] "
		"[--sessions N]\n");
	exit(2);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_ids(const char *s, int **out)
{
	int n = 0, cap = 16, *v = malloc((size_t)cap * sizeof(int));
	char *end;

	while (v && *s) {
		long x = strtol(s, &end, 10);

		if (end == s || x < 0 || x > 1 << 24)
			goto bad;
		if (n == cap && !(v = realloc(v, (size_t)(cap *= 2) *
						     sizeof(int))))
			return -1;
		v[n++] = (int)x;
		s = end;
		if (*s == ',')
			s++;
		else if (*s)
			goto bad;
	}
	*out = v;
	return n;
bad:
	free(v);
	return -1;
}

int main(int argc, char **argv)
{
	static const struct option longs[] = {
		{"kv", required_argument, NULL, 'k'},
		{"ids", no_argument, NULL, 'i'},
		{"prompt-ids", required_argument, NULL, 'P'},
		{"stats", no_argument, NULL, 'S'},
		{"kv-dtype", required_argument, NULL, 'd'},
		{"sessions", required_argument, NULL, 'N'},
		{NULL, 0, NULL, 0},
	};
	const char *ckpt, *tokpath = NULL;
	int steps = 256, ids = 0, stats = 0, nsess = 1, nprompt = 0, opt, r;
	int *prompt = NULL;
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

	while ((opt = getopt_long(argc, argv, "n:t:s:z:p:", longs, NULL)) !=
	       -1) {
		switch (opt) {
		case 'n': steps = atoi(optarg); break;
		case 't': temperature = strtof(optarg, NULL); break;
		case 's': seed = strtoull(optarg, NULL, 10); break;
		case 'z': tokpath = optarg; break;
		case 'p': topp = strtof(optarg, NULL); break;
		case 'i': ids = 1; break;
		case 'S': stats = 1; break;
		case 'N': nsess = atoi(optarg); break;
		case 'k':
			if (!strcmp(optarg, "dense"))
				kind = SBM_KV_DENSE;
			else if (!strcmp(optarg, "sparse"))
				kind = SBM_KV_SPARSE;
			else
				usage();
			break;
		case 'd':
			if (!strcmp(optarg, "f32"))
				dtype = SBK_F32;
			else if (!strcmp(optarg, "f16"))
				dtype = SBK_F16;
			else if (!strcmp(optarg, "bf16"))
				dtype = SBK_BF16;
			else
				usage();
			break;
		case 'P':
			nprompt = parse_ids(optarg, &prompt);
			if (nprompt < 0) {
				fprintf(stderr, "sbrun: bad --prompt-ids\n");
				return 2;
			}
			break;
		default:
			usage();
		}
	}
	if (optind != argc - 1 || temperature < 0 || nsess < 1 ||
	    nsess > MAX_SESSIONS || (nsess > 1 && kind != SBM_KV_SPARSE))
		usage();
	ckpt = argv[optind];
	if (!seed)
		seed = (unsigned long long)time(NULL);
	r = sbm_load(&m, ckpt);
	if (r < 0) {
		fprintf(stderr, "sbrun: %s: %s\n", ckpt,
			r == -EINVAL ? "not a llama2.c checkpoint"
				     : strerror(-r));
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
		fprintf(stderr, "sbrun: %s: %s\n", tokpath, strerror(-r));
		return 1;
	}
	first_logits = malloc((size_t)m.c.vocab_size * sizeof(float));
	if (!first_logits)
		return 1;
	s[0] = sbm_session_new(&m, kind, dtype, NULL, 0, &r);
	if (!s[0]) {
		fprintf(stderr, "sbrun: KV cache: %s\n", strerror(-r));
		return 1;
	}
	for (int i = 0; i < nsess; i++) {
		if (sbm_sampler_init(&sp[i], m.c.vocab_size, temperature, topp,
				     seed + (unsigned long long)i) < 0)
			return 1;
		out[i] = malloc((size_t)steps * sizeof(int));
		if (!out[i])
			return 1;
	}

	/* The prompt: BOS then the prompt ids, in session 0. */
	t0 = now_s();
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
			int prev = nprompt ? prompt[nprompt - 1] : 1;

			for (int k = 0; k < nout[i]; k++) {
				fputs(sbm_decode(&tok, prev, out[i][k]),
				      stdout);
				prev = out[i][k];
			}
			printf("\n");
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
		    sb_pool_stats(sb_default_pool(), &st) == 0)
			fprintf(stderr,
				"pool: %zu pages of %zu KiB in use = %zu bytes "
				"(shared pages once), %zu bytes resident, %llu "
				"pages placed, %llu faults, %llu copies\n",
				st.pages_used, st.page_size >> 10,
				st.pages_used * st.page_size, st.bytes_resident,
				(unsigned long long)(st.maps + st.fault_places),
				(unsigned long long)st.faults,
				(unsigned long long)st.cow_copies);
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
