/* SPDX-License-Identifier: MIT */
/*
 * sbflash: run an sbflash checkpoint (sbgen) in one mode and report speed,
 * bytes read, faults and memory (runner.h says what the modes are).
 *
 *   sbflash MODEL [--mode resident|flash|mmap_dense|mmap_sparse]
 *           [--budget BYTES] [-k K] [--threads N] [--steps S] [--seed S]
 *           [--release auto|always|never|advise] [--measure] [--logits FILE]
 *           [--trace FILE]
 *           [--madv-normal] [--no-overlap] [--whole-bundles]
 *           [--json] [--progress|--no-progress]
 *   sbflash --help | --version
 *
 * Values are parsed strictly (common/cli.h): "--budget abc" or "--steps 0"
 * end sbflash with status 2 before it reads anything. MODEL must be a
 * regular file whose header checks out (flash/model.h).
 *
 * The input tokens are a seeded pseudo-random sequence (the same in every
 * mode); the logits of every step can be written to a file (f32, steps x
 * vocab) to compare modes with cmp(1).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "model.h"
#include "runner.h"
#include "sbkernels.h"

/* The first error writing the logits (a write too large for stdio's
 * buffer goes straight to the file: its errno is not kept in the FILE). */
static int logits_errno;

static void write_logits(void *ctx, int step, const float *logits, int n)
{
	(void)step;
	if (fwrite(logits, sizeof(*logits), (size_t)n, ctx) != (size_t)n &&
	    !logits_errno)
		logits_errno = errno ? errno : EIO;
}

enum {
	OPT_MODE = 256, OPT_BUDGET, OPT_K, OPT_THREADS, OPT_STEPS, OPT_SEED,
	OPT_RELEASE, OPT_MEASURE, OPT_LOGITS, OPT_MADV_NORMAL, OPT_NO_OVERLAP,
	OPT_WHOLE, OPT_TRACE,
	OPT_JSON, OPT_PROGRESS, OPT_NO_PROGRESS,
};

static const struct sbc_opt opts[] = {
	{OPT_MODE, "--mode", "resident|flash|mmap_dense|mmap_sparse",
	 "how the weights are reached (default flash)"},
	{OPT_BUDGET, "--budget", "SIZE", "memory budget of the process "
					 "(583M, 2G; default 0: none)"},
	{OPT_K, "-k", "K", "window: the last K tokens' neurons stay "
			   "(default 5)"},
	{OPT_THREADS, "--threads", "N", "kernel threads, 1 to 256 (default "
					"0: one per CPU)"},
	{OPT_STEPS, "--steps", "S", "tokens to decode (default 32)"},
	{OPT_SEED, "--seed", "S", "seed of the input tokens (default 1)"},
	{OPT_RELEASE, "--release", "auto|always|never|advise",
	 "what the window does with leavers (default auto)"},
	{OPT_MEASURE, "--measure", NULL, "resident: also the predictor's "
					 "recall"},
	{OPT_LOGITS, "--logits", "FILE", "write every step's logits (f32) to "
					 "FILE"},
	{OPT_MADV_NORMAL, "--madv-normal", NULL, "mmap_sparse: keep the "
						 "kernel's read-around"},
	{OPT_NO_OVERLAP, "--no-overlap", NULL, "flash: wait for the reads "
					       "before attention"},
	{OPT_WHOLE, "--whole-bundles", NULL, "flash: read whole bundles before "
					     "attention (default: up rows "
					     "before it, the down columns of "
					     "the neurons that fire after it)"},
	{OPT_TRACE, "--trace", "FILE", "flash, split fetch: write each "
				       "layer's predicted and firing neurons "
				       "to FILE (bench/flash_policy.py)"},
	{OPT_JSON, "--json", NULL, "one JSON object on stdout"},
	{OPT_PROGRESS, "--progress", NULL, "progress bar on stderr"},
	{OPT_NO_PROGRESS, "--no-progress", NULL, "no progress bar"},
	{0},
};

/* The report reached stdout: 0, or 1 with a message (a full disk, a
 * closed pipe), as for --logits. */
static int report_done(void)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return 0;
	fprintf(stderr, "sbflash: writing the report: %s\n", strerror(errno));
	return 1;
}

/* The CPUs this process may run on: what a token's CPU time is shared
 * among. */
static long usable_cpus(void)
{
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		return CPU_COUNT(&set);
	return sysconf(_SC_NPROCESSORS_ONLN);
}

/* Whether paths a and b name one file that an output would truncate or
 * mix with another: one existing file (links, other spellings), or the same
 * path. A device such as /dev/null is not. */
static int same_file(const char *a, const char *b)
{
	struct stat sa, sb;

	if (stat(a, &sa) < 0 || stat(b, &sb) < 0)
		return !strcmp(a, b);
	return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino &&
	       !S_ISCHR(sa.st_mode);
}

/*
 * An output file, truncated. A FIFO with nobody reading it is refused
 * (ENXIO) rather than waited on forever, as fopen would; one with a reader
 * is written like a file.
 */
static FILE *open_out(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK |
				    O_CLOEXEC, 0644);
	FILE *f;

	if (fd < 0) {
		int e = errno;
		struct stat st;

		fprintf(stderr, "sbflash: %s: %s\n", path,
			e == ENXIO && stat(path, &st) == 0 &&
					S_ISFIFO(st.st_mode)
				? "a FIFO that nobody reads"
				: strerror(e));
		return NULL;
	}
	if (fcntl(fd, F_SETFL, 0) < 0 || !(f = fdopen(fd, "wb"))) {
		fprintf(stderr, "sbflash: %s: %s\n", path, strerror(errno));
		close(fd);
		return NULL;
	}
	return f;
}

/* Close an output; 0, or -errno with the reason on stderr (a full disk says
 * so, not "Input/output error"). known: the first write's error, if any. */
static int close_out(FILE *f, const char *path, int known)
{
	int e = known;

	if (fflush(f) && !e)
		e = errno;
	if (ferror(f) && !e)
		e = EIO;
	if (fclose(f) && !e)
		e = errno;
	if (e)
		fprintf(stderr, "sbflash: writing %s: %s\n", path,
			strerror(e));
	return -e;
}

int main(int argc, char **argv)
{
	static const char *const modes[] = {"resident", "flash", "mmap_dense",
					    "mmap_sparse", "sparsebuf", NULL};
	static const enum sbf_mode mode_of[] = {SBF_RESIDENT, SBF_FLASH,
						SBF_MMAP_DENSE,
						SBF_MMAP_SPARSE, SBF_FLASH};
	static const char *const releases[] = {"auto", "always", "never",
					       "advise", NULL};
	static const enum sbf_release release_of[] = {
		SBF_RELEASE_AUTO, SBF_RELEASE_ALWAYS, SBF_RELEASE_NEVER,
		SBF_RELEASE_ADVISE};
	struct sbc cli = {
		.prog = "sbflash",
		.usage = "MODEL [options]",
		.about = "Run an sbflash checkpoint (sbgen) in one mode and "
			 "report speed, bytes read, faults\nand memory "
			 "(docs/flash.md). MODEL must be a regular file.",
		.opts = opts,
	};
	struct sbf_opts o = {0};
	struct sbf_result r = {0};
	const char *logits = NULL, *trace = NULL, *v;
	FILE *lf = NULL;
	int json = 0, threads = 0, err, e, opt;
	long cpus;

	o.mode = SBF_FLASH;
	o.k = 5;
	o.steps = 32;
	o.seed = 1;
	/* The stronger mmap_sparse baseline on this machine (bench at 1 GiB:
	 * 4.1 tok/s against 1.0 with the kernel's read-around). */
	o.madv_random = 1;
	o.progress = isatty(2);
	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &v)) != SBC_END) {
		switch (opt) {
		case SBC_ARG:
			if (o.path)
				sbc_fail(&cli, "one MODEL expected, '%s' is a "
					 "second", v);
			o.path = v;
			break;
		case OPT_MODE:
			o.mode = mode_of[sbc_choice(&cli, v, modes)];
			break;
		case OPT_BUDGET:
			o.budget = sbc_size(&cli, v, 0, (uint64_t)1 << 60);
			break;
		case OPT_K:
			o.k = (int)sbc_int(&cli, v, 1, 1 << 20);
			break;
		case OPT_THREADS:
			threads = (int)sbc_int(&cli, v, 0, 256);
			break;
		case OPT_STEPS:
			o.steps = (int)sbc_int(&cli, v, 1, 1 << 20);
			break;
		case OPT_SEED:
			o.seed = sbc_u64(&cli, v, 0, UINT64_MAX);
			break;
		case OPT_RELEASE:
			o.release = release_of[sbc_choice(&cli, v, releases)];
			break;
		case OPT_MEASURE:
			o.measure = 1;
			break;
		case OPT_LOGITS:
			logits = v;
			break;
		case OPT_MADV_NORMAL:
			o.madv_random = 0;
			break;
		case OPT_NO_OVERLAP:
			o.no_overlap = 1;
			break;
		case OPT_WHOLE:
			o.whole_bundles = 1;
			break;
		case OPT_TRACE:
			trace = v;
			break;
		case OPT_JSON:
			json = 1;
			break;
		case OPT_PROGRESS:
			o.progress = 1;
			break;
		case OPT_NO_PROGRESS:
			o.progress = 0;
			break;
		}
	}
	if (!o.path)
		sbc_fail(&cli, "no MODEL given");
	/* An output opened for writing is truncated: never the model, never
	 * the other output. */
	if (logits && same_file(logits, o.path))
		sbc_fail(&cli, "--logits %s is the model", logits);
	if (trace && same_file(trace, o.path))
		sbc_fail(&cli, "--trace %s is the model", trace);
	if (logits && trace && same_file(logits, trace))
		sbc_fail(&cli, "--logits and --trace name the same file");
	if (trace && o.mode != SBF_FLASH)
		sbc_fail(&cli, "--trace is for --mode flash");
	if (trace && o.whole_bundles)
		sbc_fail(&cli, "--trace records the split fetch, not "
			       "--whole-bundles");
	if (threads > 0 && sbk_set_threads(threads) < 0) {
		fprintf(stderr, "sbflash: bad --threads %d\n", threads);
		return 2;
	}
	/* The model is looked at before any output is opened (truncated):
	 * a run that cannot start leaves them as they were. */
	if (logits || trace) {
		struct sbf_header h;
		const char *why = NULL;
		int fd = sbf_open(o.path, &h, &why);

		if (fd < 0) {
			fprintf(stderr, "sbflash: %s: %s\n", o.path,
				why ? why : strerror(-fd));
			return 1;
		}
		close(fd);
		if (trace && !sbf_splits(&h, o.whole_bundles))
			sbc_fail(&cli, "--trace records the split fetch, which "
				       "needs bundles of a power of two from "
				       "8 KiB (this model's are %u bytes)",
				 h.bundle);
	}
	/* A reader that goes away is a write error (EPIPE), not a kill. */
	signal(SIGPIPE, SIG_IGN);
	if (logits) {
		lf = open_out(logits);
		if (!lf)
			return 1;
		o.on_logits = write_logits;
		o.ctx = lf;
	}
	if (trace) {
		struct stat a, b;

		o.trace = open_out(trace);
		if (!o.trace) {
			if (lf)
				fclose(lf);
			return 1;
		}
		/* Both made just now (not there to compare before). */
		if (lf && fstat(fileno(lf), &a) == 0 &&
		    fstat(fileno(o.trace), &b) == 0 && a.st_dev == b.st_dev &&
		    a.st_ino == b.st_ino && !S_ISCHR(a.st_mode)) {
			fclose(lf);
			fclose(o.trace);
			sbc_fail(&cli, "--logits and --trace name the same file");
		}
	}
	err = sbf_run(&o, &r);
	if (lf && (e = close_out(lf, logits, logits_errno)) < 0 && !err)
		err = e;
	if (o.trace && (e = close_out(o.trace, trace, r.trace_errno)) < 0 &&
	    !err)
		err = e;
	if (err < 0) {
		fprintf(stderr, "sbflash: %s mode failed: %s\n",
			sbf_mode_name(o.mode), strerror(-err));
		return 1;
	}
	cpus = usable_cpus();
	if (json) {
		printf("{\"mode\": \"%s\", \"model_bytes\": %llu, "
		       "\"ffn_bytes\": %llu, \"budget_bytes\": %llu, "
		       "\"steps\": %d, \"k\": %d, \"threads\": %d, "
		       "\"tokens_per_s\": %.4f, \"bytes_read_per_token\": %llu, "
		       "\"peak_rss_bytes\": %llu, \"faults\": %llu, "
		       "\"minflt\": %llu, \"majflt\": %llu, "
		       "\"new_bytes_per_token\": %llu, "
		       "\"neurons_per_token\": %.1f, \"active_fraction\": %.4f, "
		       "\"precision\": %.4f, \"recall\": ",
		       o.mode == SBF_FLASH ? "sparsebuf" : sbf_mode_name(o.mode),
		       (unsigned long long)r.h.file_bytes,
		       (unsigned long long)r.h.ffn_bytes,
		       (unsigned long long)o.budget, o.steps, o.k,
		       sbk_get_threads(), r.tokens_per_s,
		       (unsigned long long)(r.bytes_read / (uint64_t)o.steps),
		       (unsigned long long)r.peak_rss,
		       (unsigned long long)r.faults,
		       (unsigned long long)r.minflt,
		       (unsigned long long)r.majflt,
		       (unsigned long long)(r.new_bytes / (uint64_t)o.steps),
		       (double)r.computed / o.steps,
		       (double)r.computed / o.steps /
			       ((double)r.h.hidden * r.h.n_layers),
		       r.computed ? (double)r.nonzero / r.computed : 0.0);
		if (r.n_true)
			printf("%.4f", (double)r.n_true_pred / r.n_true);
		else
			printf("null");
		printf(", \"header_recall\": %.4f, \"header_precision\": %.4f, "
		       "\"header_sparsity\": %.4f, \"pool_bytes\": %llu, "
		       "\"pool_peak_bytes\": %llu, \"unmapped_pages\": %llu, "
		       "\"dropped_pages\": %llu, \"prefetched_pages\": %llu, "
		       "\"window_shrinks\": %llu, \"split_fetch\": %s, "
		       "\"read_unit_bytes\": %llu, \"cpu_s_per_token\": %.6f, "
		       "\"cpus\": %ld}\n",
		       r.h.recall, r.h.precision, r.h.sparsity,
		       (unsigned long long)r.pool_bytes,
		       (unsigned long long)r.pool_peak,
		       (unsigned long long)r.unmapped,
		       (unsigned long long)r.dropped,
		       (unsigned long long)r.prefetched,
		       (unsigned long long)r.shrunk,
		       r.split ? "true" : "false",
		       (unsigned long long)(r.split ? r.h.bundle / 2
						    : r.h.bundle),
		       r.cpu_seconds / o.steps, cpus);
		return report_done();
	}
	printf("%s: %s mode, %d tokens in %.2f s: %.3f tokens/s\n", o.path,
	       sbf_mode_name(o.mode), o.steps, r.seconds, r.tokens_per_s);
	printf("  read %.2f MiB/token (asked of the disk: %.2f MiB/token), "
	       "faults %llu (minflt %llu, majflt %llu), peak RSS %.0f MiB\n",
	       r.bytes_read / 1048576.0 / o.steps,
	       r.new_bytes / 1048576.0 / o.steps,
	       (unsigned long long)r.faults, (unsigned long long)r.minflt,
	       (unsigned long long)r.majflt, r.peak_rss / 1048576.0);
	printf("  %.0f neurons computed per token (%.2f%% of all), %.1f%% of "
	       "them active",
	       (double)r.computed / o.steps,
	       100.0 * r.computed / o.steps / ((double)r.h.hidden * r.h.n_layers),
	       r.computed ? 100.0 * r.nonzero / r.computed : 0.0);
	if (r.n_true)
		printf("; predictor recall on this run %.4f",
		       (double)r.n_true_pred / r.n_true);
	printf("\n");
	printf("  CPU %.1f ms a token, every thread (%.2f of the %ld CPUs "
	       "busy)\n",
	       1e3 * r.cpu_seconds / o.steps,
	       r.seconds > 0 ? r.cpu_seconds / r.seconds : 0.0, cpus);
	if (o.mode == SBF_FLASH)
		printf("  pool budget %.0f MiB, peak %.0f MiB; %llu pages "
		       "prefetched, %llu released by the window, %llu dropped "
		       "by the pool; window shrunk %llu times\n",
		       r.pool_bytes / 1048576.0, r.pool_peak / 1048576.0,
		       (unsigned long long)r.prefetched,
		       (unsigned long long)r.unmapped,
		       (unsigned long long)r.dropped,
		       (unsigned long long)r.shrunk);
	if (o.mode == SBF_FLASH)
		printf("  per token: %.1f ms releasing, %.1f ms submitting "
		       "reads, %.1f ms waiting for them, %.1f ms the rest\n",
		       1e3 * r.t_release / o.steps, 1e3 * r.t_prefetch / o.steps,
		       1e3 * r.t_wait / o.steps,
		       1e3 * (r.seconds - r.t_release - r.t_prefetch - r.t_wait) /
			       o.steps);
	return report_done();
}
