/* SPDX-License-Identifier: MIT */
/*
 * The programs and what they read (issue 10: the tools' conventions and
 * the programs' part of defects 2, 3, 7 and 8). Each program is run as a
 * user runs it, in its own process group under a timeout, so that one
 * that hangs, crashes or starts working instead of refusing fails here
 * quickly; the loaders are also called directly on crafted input.
 *
 *  - every program we build (BUILD/bin/..., BUILD/bench/...) and every script
 *    in bench/: --help prints usage to stdout and exits 0, --version
 *    prints the name and the library's version, --bogus exits 2 naming
 *    it; bad values (-n abc, -t nan, --budget abc, --model-bytes lots,
 *    ...) exit 2 naming the value, and before any work is done;
 *  - the shared parsers (common/cli.h) accept exactly what they document;
 *  - sampling (defect 8): sbrun -t nan / -p nan refused; -t 1e-44 gives
 *    the greedy ids, not zeros; sbm_sample stays in [0, vocab) for NaN,
 *    infinite or flat logits with any top-p;
 *  - crafted checkpoints (defect 7): a 36-byte llama2.c file whose weight
 *    size wraps (sbrun used to take SIGSEGV), truncated and inconsistent
 *    headers, bad tokenizers, a flash header whose layout wraps to 12 KiB
 *    (sbgen --info used to print it): refused with status 1, no signal,
 *    no sanitizer report; random headers never accepted beyond the data;
 *  - FIFOs (defect 3): as a checkpoint, a tokenizer, a flash model, for
 *    sbgen --info: refused at once (they used to block in open(2));
 *  - sbgen's destination (defect 2): a FIFO, a device node and a directory
 *    are refused and left alone (a node like /dev/null used to be
 *    unlinked); kill -9 in the middle of a generation leaves the previous
 *    file intact (it used to be truncated first); success replaces a file
 *    atomically, and a symlink's target rather than the link.
 *
 * The programs are found next to this test (../bin, ../bench); the bench
 * scripts in the source tree ($SPARSEBUF_SRC, else the build directory's
 * parent, else the current directory). CLI_PARTS="fifos destinations"
 * runs only the parts named.
 */
#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "../flash/gen.h"
#include "../flash/model.h"
#include "cli.h"
#include "file.h"
#include "model.h"

#define MODEL "../shared/models/stories260K.bin"
#define TIMEOUT_S 20.0

static char build[PATH_MAX], src[PATH_MAX + 16], tmp[PATH_MAX];
static int have_model;

/* ---- running a program --------------------------------------------------- */

struct res {
	int code;	/* exit status, 128 + signal, or -1: timed out */
	char out[16384], err[16384];
};

static void slurp_into(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, buf, size - 1) : 0;

	buf[n > 0 ? n : 0] = 0;
	if (fd >= 0)
		close(fd);
}

/* Where the next run's stdout goes instead of a file to read back
 * (/dev/full: a full disk); reset by each run. */
static const char *stdout_to;

/* Run argv (NULL-terminated) in a process group of its own; kill the whole
 * group after timeout_s (scripts start children). */
static void run_argv(char *const *argv, double timeout_s, struct res *r)
{
	char out[PATH_MAX + 16], err[PATH_MAX + 16];
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	int status = 0;
	pid_t pid;
	double t0;

	snprintf(out, sizeof(out), "%s/stdout", tmp);
	snprintf(err, sizeof(err), "%s/stderr", tmp);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, stdout_to ? stdout_to : out,
					 O_WRONLY | O_CREAT | O_TRUNC, 0644);
	stdout_to = NULL;
	posix_spawn_file_actions_addopen(&fa, 2, err,
					 O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawnattr_init(&at);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
	posix_spawnattr_setpgroup(&at, 0);
	if (posix_spawn(&pid, argv[0], &fa, &at, argv, environ) != 0)
		FAIL("posix_spawn %s: %s", argv[0], strerror(errno));
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	t0 = now_s();
	r->code = -1;
	while (now_s() - t0 < timeout_s) {
		if (waitpid(pid, &status, WNOHANG) == pid) {
			r->code = WIFEXITED(status) ? WEXITSTATUS(status)
						    : 128 + WTERMSIG(status);
			break;
		}
		usleep(5000);
	}
	if (r->code == -1) {
		kill(-pid, SIGKILL);
		waitpid(pid, &status, 0);
	}
	slurp_into(out, r->out, sizeof(r->out));
	slurp_into(err, r->err, sizeof(r->err));
	/* Every child of a group that timed out goes too. */
	kill(-pid, SIGKILL);
}

/* run(timeout, prog, args..., NULL) */
static void run(struct res *r, double timeout_s, const char *prog, ...)
{
	char *argv[64];
	int n = 0;
	va_list ap;

	argv[n++] = (char *)prog;
	va_start(ap, prog);
	while (n < 63 && (argv[n] = va_arg(ap, char *)))
		n++;
	va_end(ap);
	argv[n] = NULL;
	run_argv(argv, timeout_s, r);
}

static void show(const char *what, const struct res *r)
{
	fprintf(stderr, "%s: exit %d\n--- stdout:\n%.2000s--- stderr:\n%.2000s",
		what, r->code, r->out, r->err);
}

/* No sanitizer report: an ASan build exits 1 on one, like a refusal. */
static void no_report(const char *what, const struct res *r)
{
	if (strstr(r->err, "Sanitizer") || strstr(r->err, "runtime error:")) {
		show(what, r);
		FAIL("%s: sanitizer report", what);
	}
}

static void expect(const char *what, const struct res *r, int code,
		   const char *needle)
{
	if (r->code == -1) {
		show(what, r);
		FAIL("%s: still running after %.0f s (killed): it should have "
		     "%s", what, TIMEOUT_S,
		     code == 2 ? "refused its arguments" : "finished");
	}
	no_report(what, r);
	if (r->code != code || (needle && !strstr(r->err, needle))) {
		show(what, r);
		FAIL("%s: want exit %d%s%s", what, code,
		     needle ? " and stderr naming " : "", needle ? needle : "");
	}
}

static const char *bin(const char *name)
{
	static char p[8][PATH_MAX + 64];
	static int k;

	k = (k + 1) % 8;
	snprintf(p[k], sizeof(p[k]), "%s/%s", build, name);
	return p[k];
}

static const char *tpath(const char *name)
{
	static char p[8][PATH_MAX + 64];
	static int k;

	k = (k + 1) % 8;
	snprintf(p[k], sizeof(p[k]), "%s/%s", tmp, name);
	return p[k];
}

/* ---- 1. the shared parsers ---------------------------------------------- */

static void parsers(void)
{
	static const struct {
		const char *s;
		int r;
		long long v;
	} ints[] = {
		{"0", 0, 0},	     {"42", 0, 42},	  {"-7", 0, -7},
		{"+7", 0, 7},	     {"0x10", 0, 16},	  {"010", 0, 10},
		{"", -EINVAL, 0},    {" 1", -EINVAL, 0},  {"1 ", -EINVAL, 0},
		{"abc", -EINVAL, 0}, {"12abc", -EINVAL, 0}, {"1.5", -EINVAL, 0},
		{"0x", -EINVAL, 0},  {"-", -EINVAL, 0},	  {"1000", -ERANGE, 0},
		{"-1001", -ERANGE, 0},
		{"99999999999999999999999", -ERANGE, 0},
	};
	static const struct {
		const char *s;
		int r;
		double v;
	} dbls[] = {
		{"0.9", 0, 0.9},     {"1e-3", 0, 1e-3},	  {"-.5", 0, -0.5},
		{"1e-44", 0, 1e-44}, {"7", 0, 7},	  {"nan", -EINVAL, 0},
		{"NaN", -EINVAL, 0}, {"inf", -EINVAL, 0}, {"-inf", -EINVAL, 0},
		{"infinity", -EINVAL, 0}, {"0x1p3", -EINVAL, 0},
		{"", -EINVAL, 0},    {".", -EINVAL, 0},	  {"1e", -EINVAL, 0},
		{" 1", -EINVAL, 0},  {"1e999", -ERANGE, 0}, {"101", -ERANGE, 0},
		{"-101", -ERANGE, 0},
	};
	static const struct {
		const char *s;
		int r;
		uint64_t v;
	} sizes[] = {
		{"4096", 0, 4096},
		{"64K", 0, 64 << 10},
		{"64KiB", 0, 64 << 10},
		{"64kb", 0, 64 << 10},
		{"4.5G", 0, 4608ull << 20},
		{"1.5", 0, 1},
		{"16T", 0, 16ull << 40},
		{"0", 0, 0},
		{"lots", -EINVAL, 0},
		{"", -EINVAL, 0},
		{"-1", -EINVAL, 0},
		{"1X", -EINVAL, 0},
		{"1iB", -EINVAL, 0},
		{"1.", -EINVAL, 0},
		{"nan", -EINVAL, 0},
		{"99999999999999999999", -ERANGE, 0},
		{"17000000T", -ERANGE, 0},
	};
	static const char *const names[] = {"dense", "sparse", NULL};
	long long iv, lv[4];
	uint64_t uv;
	double dv;
	int cv[4];

	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
		int r = sbc_parse_int(ints[i].s, -1000, 999, &iv);

		if (r != ints[i].r || (!r && iv != ints[i].v))
			FAIL("sbc_parse_int(\"%s\") = %d (%lld)", ints[i].s, r,
			     iv);
	}
	CHECK_EQ(sbc_parse_u64("-1", 0, UINT64_MAX, &uv), -EINVAL);
	CHECK_EQ(sbc_parse_u64("18446744073709551615", 0, UINT64_MAX, &uv),
		 0);
	CHECK(uv == UINT64_MAX);
	CHECK_EQ(sbc_parse_u64("18446744073709551616", 0, UINT64_MAX, &uv),
		 -ERANGE);
	for (size_t i = 0; i < sizeof(dbls) / sizeof(dbls[0]); i++) {
		int r = sbc_parse_double(dbls[i].s, -100, 100, &dv);

		if (r != dbls[i].r || (!r && dv != dbls[i].v))
			FAIL("sbc_parse_double(\"%s\") = %d (%g)", dbls[i].s, r,
			     dv);
	}
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		int r = sbc_parse_size(sizes[i].s, 0, UINT64_MAX, &uv);

		if (r != sizes[i].r || (!r && uv != sizes[i].v))
			FAIL("sbc_parse_size(\"%s\") = %d (%llu)", sizes[i].s,
			     r, (unsigned long long)uv);
	}
	CHECK_EQ(sbc_parse_size("2M", 0, 1 << 20, &uv), -ERANGE);
	CHECK_EQ(sbc_parse_choice("sparse", names), 1);
	CHECK_EQ(sbc_parse_choice("Sparse", names), -EINVAL);
	CHECK_EQ(sbc_parse_list("1,2,3", 0, 9, lv, 4), 3);
	CHECK(lv[0] == 1 && lv[2] == 3);
	CHECK_EQ(sbc_parse_list("1,,2", 0, 9, lv, 4), -EINVAL);
	CHECK_EQ(sbc_parse_list("1,2,", 0, 9, lv, 4), -EINVAL);
	CHECK_EQ(sbc_parse_list("", 0, 9, lv, 4), -EINVAL);
	CHECK_EQ(sbc_parse_list("1,10", 0, 9, lv, 4), -ERANGE);
	CHECK_EQ(sbc_parse_list("1,2,3,4,5", 0, 9, lv, 4), -E2BIG);
	CHECK_EQ(sbc_parse_choice_list("sparse,dense", names, cv, 4), 2);
	CHECK(cv[0] == 1 && cv[1] == 0);
	CHECK_EQ(sbc_parse_choice_list("sparse,x", names, cv, 4), -EINVAL);
	printf("parsers: ok\n");
}

/* ---- 2. the conventions, for every program -------------------------------- */

/* What the version line must hold. */
static const char *version(void)
{
	static char v[32];

	snprintf(v, sizeof(v), "%d.%d.%d", SPARSEBUF_VERSION_MAJOR,
		 SPARSEBUF_VERSION_MINOR, SPARSEBUF_VERSION_PATCH);
	return v;
}

static void conventions_of(const char *path, const char *pre)
{
	const char *name = strrchr(path, '/') + 1;
	char what[PATH_MAX + 64];
	struct res r;

	snprintf(what, sizeof(what), "%s --help", name);
	run(&r, TIMEOUT_S, path, "--help", NULL);
	expect(what, &r, 0, NULL);
	if (!strstr(r.out, "usage:") || !strstr(r.out, "--version")) {
		show(what, &r);
		FAIL("%s: no usage with the options on stdout", what);
	}
	snprintf(what, sizeof(what), "%s --version", name);
	run(&r, TIMEOUT_S, path, "--version", NULL);
	expect(what, &r, 0, NULL);
	if (strncmp(r.out, name, strlen(name)) || !strstr(r.out, version())) {
		show(what, &r);
		FAIL("%s: want \"%s (sparsebuf) %s\"", what, name, version());
	}
	snprintf(what, sizeof(what), "%s %s--bogus", name, pre ? "BUILD " : "");
	if (pre)
		run(&r, TIMEOUT_S, path, pre, "--bogus", NULL);
	else
		run(&r, TIMEOUT_S, path, "--bogus", NULL);
	expect(what, &r, 2, "--bogus");
}

/* Every executable in dir (with suffix, when not NULL). */
static int each_program(const char *dir, const char *suffix,
			void (*fn)(const char *path))
{
	struct dirent *e;
	DIR *d = opendir(dir);
	int n = 0;

	if (!d)
		FAIL("opendir %s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		char p[PATH_MAX + 300];
		struct stat st;
		size_t l = strlen(e->d_name), sl = suffix ? strlen(suffix) : 0;

		if (e->d_name[0] == '.' ||
		    (suffix && (l < sl || strcmp(e->d_name + l - sl, suffix))))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		if (stat(p, &st) || !S_ISREG(st.st_mode) ||
		    !(st.st_mode & S_IXUSR))
			continue;	/* perf-lib.sh, cli-lib.sh: sourced */
		fn(p);
		n++;
	}
	closedir(d);
	return n;
}

static void binary_conventions(const char *path)
{
	conventions_of(path, NULL);
}

static void script_conventions(const char *path)
{
	/* pagein.sh hands options it does not know to BUILD/bench/pagein. */
	conventions_of(path, strstr(path, "/pagein.sh") ? build : NULL);
}

static void conventions(void)
{
	char d[PATH_MAX + 32];
	int n;

	snprintf(d, sizeof(d), "%s/bin", build);
	n = each_program(d, NULL, binary_conventions);
	CHECK(n >= 5);	/* sbrun sbgen sbflash sparsebuf-info -demo */
	snprintf(d, sizeof(d), "%s/bench", build);
	n += each_program(d, NULL, binary_conventions);
	printf("conventions: %d programs ok\n", n);
	if (!src[0]) {
		printf("conventions: bench scripts not found (set "
		       "SPARSEBUF_SRC): not checked\n");
		return;
	}
	snprintf(d, sizeof(d), "%s/bench", src);
	n = each_program(d, ".sh", script_conventions);
	CHECK(n >= 5);
	printf("conventions: %d scripts in %s ok\n", n, d);
}

/* ---- 3. bad values --------------------------------------------------------- */

static void bad_values(void)
{
	/* Programs that take a path get one that works, so that a value
	 * that is not refused shows as a run, not as a missing file. */
	const char *model = have_model ? MODEL : "/nonexistent-model";
	const char *fm = tpath("m.flash"), *out = tpath("never.bin");
	static const char *const cases[][10] = {
		/* needle, program, args... */
		{"abc", "bin/sbrun", "@model", "-n", "abc"},
		{"-5", "bin/sbrun", "@model", "-n", "-5"},
		{"nan", "bin/sbrun", "@model", "-t", "nan"},
		{"inf", "bin/sbrun", "@model", "-t", "inf"},
		{"-1", "bin/sbrun", "@model", "-t", "-1"},
		{"1e999", "bin/sbrun", "@model", "-t", "1e999"},
		{"nan", "bin/sbrun", "@model", "-p", "nan"},
		{"1.5", "bin/sbrun", "@model", "-p", "1.5"},
		{"12abc", "bin/sbrun", "@model", "-s", "12abc"},
		{"-1", "bin/sbrun", "@model", "-s", "-1"},
		{"0", "bin/sbrun", "@model", "--sessions", "0"},
		{"65", "bin/sbrun", "@model", "--sessions", "65"},
		{"foo", "bin/sbrun", "@model", "--kv", "foo"},
		{"f64", "bin/sbrun", "@model", "--kv-dtype", "f64"},
		{"1,,2", "bin/sbrun", "@model", "--prompt-ids", "1,,2"},
		{"1,x", "bin/sbrun", "@model", "--prompt-ids", "1,x"},
		{"-n", "bin/sbrun", "@model", "-n"},
		{"CHECKPOINT", "bin/sbrun", "-n", "4"},
		{"abc", "bin/sbflash", "@flash", "--budget", "abc"},
		{"0", "bin/sbflash", "@flash", "--steps", "0"},
		{"x", "bin/sbflash", "@flash", "-k", "x"},
		{"1000", "bin/sbflash", "@flash", "--threads", "1000"},
		{"foo", "bin/sbflash", "@flash", "--mode", "foo"},
		{"x", "bin/sbflash", "@flash", "--release", "x"},
		{"-1", "bin/sbflash", "@flash", "--seed", "-1"},
		{"is the model", "bin/sbflash", "@flash", "--trace", "@flash"},
		{"is the model", "bin/sbflash", "@flash", "--logits", "@flash"},
		{"same file", "bin/sbflash", "@flash", "--logits", "@out",
		 "--trace", "@out"},
		{"--mode flash", "bin/sbflash", "@flash", "--mode", "resident",
		 "--trace", "@out"},
		{"--whole-bundles", "bin/sbflash", "@flash", "--whole-bundles",
		 "--trace", "@out"},
		/* The model's bundles are too small for the split fetch. */
		{"split fetch", "bin/sbflash", "@flash", "--trace", "@out"},
		{"lots", "bin/sbgen", "@out", "--model-bytes", "lots"},
		{"abc", "bin/sbgen", "@out", "--dim", "abc"},
		{"1.5", "bin/sbgen", "@out", "--active", "1.5"},
		{"nan", "bin/sbgen", "@out", "--active", "nan"},
		{"inf", "bin/sbgen", "@out", "--margin", "inf"},
		{"x", "bin/sbgen", "@out", "--threads", "x"},
		{"divide", "bin/sbgen", "@out", "--dim", "1000", "--heads",
		 "3"},
		{"extra", "bin/sparsebuf-info", "extra"},
		{"extra", "bin/sparsebuf-demo", "extra"},
		{"abc", "bench/kv", "--tokens", "abc"},
		{"5000", "bench/kv", "--tokens", "5000"},
		{"9", "bench/kv", "--strategies", "1,9"},
		{"0", "bench/place", "--rounds", "0"},
		{"x", "bench/place", "--size-mib", "x"},
		{"nan", "bench/place", "--spacing-us", "nan"},
		{"abc", "bench/pagein", "--reps", "abc"},
		{"3M", "bench/pagein", "--size", "3M"},
		{"3000", "bench/pagein", "--page-size", "3000"},
		{"x", "bench/pagein", "--touch", "x"},
		{"foo", "bench/pagein", "--only", "seq,foo"},
		{"x", "bench/pagein", "--run", "x"},
		{"x", "bench/fault_workload", "--pages", "x"},
		{"70000", "bench/pagecost", "--pages", "70000"},
		{"3000", "bench/pagecost", "--page-size", "3000"},
		{"99", "bench/pagecost", "--rounds", "99"},
		{"power of two", "bench/pagecost", "--page-size", "12K"},
		{"256 MiB", "bench/pagecost", "--pages", "65536", "--page-size",
		 "32K"},
		{"0", "bench/kernels_attn", "--reps", "0"},
		{"1,,2", "bench/kernels_attn", "--ctx", "1,,2"},
		{"f64", "bench/kernels_attn", "--dtype", "f64"},
		{"foo", "bench/kernels_attn", "--isa", "foo"},
		{"x", "bench/kernels_attn", "--backing", "x"},
		{"x", "bench/kernels_matvec", "--reps", "x"},
		{"foo", "bench/kernels_matvec", "--isa", "foo"},
		{"lots", "@src/bench/flash.sh", "--model-bytes", "lots"},
		{"nan", "@src/bench/flash.sh", "--budget-fraction", "nan"},
		{"x", "@src/bench/flash.sh", "--steps", "x"},
		{"999", "@src/bench/flash.sh", "--threads", "999"},
		{"--seed", "@src/bench/flash.sh", "--seed"},
		{"--dir", "@src/bench/pagein-perf.sh", "@build", "--dir"},
	};
	struct sbf_gen_opts o;
	struct stat st;
	int n = 0;

	/* A small valid flash model, so that sbflash's values are what
	 * is wrong. */
	sbf_gen_defaults(&o, 4 * MiB);
	o.dim = 128, o.n_heads = 2, o.n_kv_heads = 1, o.hidden = 512;
	o.vocab = 64, o.rank = 8, o.n_layers = 1, o.threads = 1;
	CHECK_EQ(sbf_generate(fm, &o, NULL), 0);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *argv[12], what[512] = "";
		char p[PATH_MAX + 64];
		struct res r;
		int k = 0;

		if (!strncmp(cases[i][1], "@src/", 5)) {
			if (!src[0])
				continue;
			snprintf(p, sizeof(p), "%s/%s", src, cases[i][1] + 5);
		} else {
			snprintf(p, sizeof(p), "%s/%s", build, cases[i][1]);
		}
		argv[k++] = p;
		for (int j = 2; j < 10 && cases[i][j]; j++) {
			const char *a = cases[i][j];

			argv[k++] = (char *)(!strcmp(a, "@model")   ? model
					     : !strcmp(a, "@flash") ? fm
					     : !strcmp(a, "@out")   ? out
					     : !strcmp(a, "@build") ? build
								    : a);
		}
		argv[k] = NULL;
		for (int j = 0; j < k; j++)
			snprintf(what + strlen(what), sizeof(what) - strlen(what),
				 "%s%s", j ? " " : "",
				 j ? argv[j] : strrchr(argv[j], '/') + 1);
		run_argv(argv, TIMEOUT_S, &r);
		expect(what, &r, 2, cases[i][0]);
		n++;
	}
	/* An output that is a FIFO nobody reads: refused at once, not
	 * waited on (fopen would block in open(2) forever). */
	{
		const char *fifo = tpath("logits.fifo");
		char p[PATH_MAX + 64];
		char *argv[] = {p, (char *)fm, "--logits", (char *)fifo, NULL};
		struct res r;

		snprintf(p, sizeof(p), "%s/bin/sbflash", build);
		CHECK(mkfifo(fifo, 0600) == 0);
		run_argv(argv, TIMEOUT_S, &r);
		expect("sbflash --logits FIFO", &r, 1, "nobody reads");
		unlink(fifo);
		n++;
	}
	/* A full disk: said so (a step's logits go past stdio's buffer
	 * straight to the file, and their error was lost). */
	if (access("/dev/full", W_OK) == 0) {
		char p[PATH_MAX + 64];
		char *argv[] = {p, (char *)fm, "--mode", "resident",
				"--logits", "/dev/full", "--steps", "2", NULL};
		struct res r;

		snprintf(p, sizeof(p), "%s/bin/sbflash", build);
		run_argv(argv, TIMEOUT_S, &r);
		expect("sbflash --logits /dev/full", &r, 1,
		       "No space left on device");
		n++;
	}
	/* The report itself on a full disk: said so, status 1 (it was 0). */
	if (access("/dev/full", W_OK) == 0) {
		char p[PATH_MAX + 64], q[PATH_MAX + 64];
		char *argv[] = {p, (char *)fm, "--mode", "resident", "--json",
				"--steps", "2", NULL};
		char *argv2[] = {q, "--pages", "64", "--rounds", "3", NULL};
		struct res r;

		snprintf(p, sizeof(p), "%s/bin/sbflash", build);
		stdout_to = "/dev/full";
		run_argv(argv, TIMEOUT_S, &r);
		expect("sbflash --json > /dev/full", &r, 1,
		       "No space left on device");
		snprintf(q, sizeof(q), "%s/bench/pagecost", build);
		stdout_to = "/dev/full";
		run_argv(argv2, TIMEOUT_S, &r);
		expect("pagecost > /dev/full", &r, 1, "No space left on device");
		n += 2;
	}
	/* sbgen refused before creating anything; sbflash left its model
	 * whole when told to write over it. */
	CHECK(stat(out, &st) < 0 && errno == ENOENT);
	CHECK(stat(fm, &st) == 0 && st.st_size > 4096);
	unlink(fm);
	printf("bad values: %d refused with status 2\n", n);
}

/* ---- 4. sampling (defect 8) --------------------------------------------- */

static void sampler_edges(void)
{
	enum { V = 512 };
	static float lg[V];
	struct sbm_sampler sp;
	const float topps[] = {0.9f, 1e-6f, 0.0f, 1.0f, 0.999999f};

	CHECK_EQ(sbm_sampler_init(&sp, V, NAN, 0.9f, 1), -EINVAL);
	CHECK_EQ(sbm_sampler_init(&sp, V, 1.0f, NAN, 1), -EINVAL);
	CHECK_EQ(sbm_sampler_init(&sp, V, -1.0f, 0.9f, 1), -EINVAL);
	CHECK_EQ(sbm_sampler_init(&sp, V, INFINITY, 0.9f, 1), -EINVAL);
	CHECK_EQ(sbm_sampler_init(&sp, 0, 1.0f, 0.9f, 1), -EINVAL);
	for (size_t t = 0; t < sizeof(topps) / sizeof(topps[0]); t++) {
		const float temps[] = {1.0f, 1e-44f, 1e-30f, 1e30f};

		for (size_t k = 0; k < sizeof(temps) / sizeof(temps[0]); k++) {
			CHECK_EQ(sbm_sampler_init(&sp, V, temps[k], topps[t],
						  7),
				 0);
			for (int c = 0; c < 6; c++) {
				int tok;

				for (int i = 0; i < V; i++)
					lg[i] = c == 0	 ? NAN
						: c == 1 ? (i == 5 ? INFINITY
								   : 0.0f)
						: c == 2 ? -INFINITY
						: c == 3 ? 0.0f	/* flat */
						: c == 4 ? (float)(i % 7) * 3e37f
							 : (float)i * 0.01f;
				tok = sbm_sample(&sp, lg);
				if (tok < 0 || tok >= V)
					FAIL("topp %g, temperature %g, logits "
					     "case %d: token %d",
					     (double)topps[t], (double)temps[k],
					     c, tok);
			}
			sbm_sampler_free(&sp);
		}
	}
	/* The limit of a vanishing temperature is the argmax: the first 100
	 * of (i * 37) % 101 is at i = 30. */
	CHECK_EQ(sbm_sampler_init(&sp, V, 1e-44f, 0.9f, 7), 0);
	for (int i = 0; i < V; i++)
		lg[i] = (float)((i * 37) % 101);
	CHECK_EQ(sbm_sample(&sp, lg), 30);
	sbm_sampler_free(&sp);
}

static void sampling(void)
{
	struct res g, r;

	sampler_edges();
	printf("sampler: in range for NaN, infinite, flat logits, any top-p "
	       "and temperature\n");
	if (!have_model) {
		printf("sampling: %s not found: sbrun not run\n", MODEL);
		return;
	}
	run(&g, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "40", "-t", "0",
	    "--ids", NULL);
	expect("sbrun -t 0", &g, 0, NULL);
	CHECK(strlen(g.out) > 10);
	/* Denormal temperatures: logits / t overflow. run.c's sampler then
	 * read probindex[-1] and sbrun printed zeros. */
	for (int i = 0; i < 2; i++) {
		const char *t = i ? "1e-40" : "1e-44";
		char what[64];

		snprintf(what, sizeof(what), "sbrun -t %s", t);
		run(&r, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "40", "-t", t,
		    "-s", "3", "--ids", NULL);
		expect(what, &r, 0, NULL);
		if (strcmp(r.out, g.out)) {
			show(what, &r);
			FAIL("%s: want the greedy ids %s", what, g.out);
		}
	}
	run(&r, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "40", "-t", "0.8",
	    "-p", "0.000001", "-s", "3", "--ids", NULL);
	expect("sbrun -p 0.000001", &r, 0, NULL);
	CHECK(strlen(r.out) > 10);
	printf("sampling: sbrun -t 1e-44 and 1e-40 give the greedy ids\n");
}

/* ---- sessions: --save, --restore, --prompt-cache (issue 14) ---------------- */

/* The ids of out after skipping `skip` of them equal want's. */
static bool ids_tail_equal(const char *full, int skip, const char *tail)
{
	const char *p = full;

	for (int i = 0; i < skip; i++) {
		p = strchr(p, ' ');
		if (!p)
			return false;
		p++;
	}
	return strcmp(p, tail) == 0;
}

static void sessions(void)
{
	struct res full, a, b, r, c1, c2;
	const char *kv = tpath("s.kv");
	static const char *prompt =
		"5,9,14,200,7,7,31,64,2,90,11,12,13,14,15,16,17,18,19,20,21,22,"
		"23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43";

	if (!have_model) {
		printf("sessions: %s not found: sbrun not run\n", MODEL);
		return;
	}
	/* Greedy: one run of 256 against 100, saved, then continued. */
	run(&full, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "256", "-t", "0",
	    "--ids", NULL);
	expect("sbrun -n 256", &full, 0, NULL);
	run(&a, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "100", "-t", "0",
	    "--ids", "--save", kv, NULL);
	expect("sbrun -n 100 --save", &a, 0, NULL);
	run(&b, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "256", "-t", "0",
	    "--ids", "--restore", kv, NULL);
	expect("sbrun -n 256 --restore", &b, 0, NULL);
	if (strncmp(full.out, a.out, strlen(a.out) - 1) ||
	    !ids_tail_equal(full.out, 100, b.out)) {
		show("full", &full);
		show("saved", &a);
		show("restored", &b);
		FAIL("save at 100 + restore to 256 != one run of 256");
	}
	/* Sampled, in three runs: the sampler's state travels too. */
	run(&full, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "200", "-s", "42",
	    "--ids", NULL);
	run(&a, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "77", "-s", "42",
	    "--ids", "--save", kv, NULL);
	run(&b, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "150", "-s", "42",
	    "--ids", "--restore", kv, "--save", kv, NULL);
	expect("sbrun --restore --save (same file)", &b, 0, NULL);
	run(&r, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "200", "-s", "42",
	    "--ids", "--restore", kv, NULL);
	expect("sbrun --restore (third)", &r, 0, NULL);
	{
		static char joined[3 * sizeof(full.out) + 8];

		snprintf(joined, sizeof(joined), "%.*s %.*s %s",
			 (int)strlen(a.out) - 1, a.out, (int)strlen(b.out) - 1,
			 b.out, r.out);
		if (strcmp(joined, full.out)) {
			fprintf(stderr, "one run: %s\nthree: %s\n", full.out,
				joined);
			FAIL("-s 42: 77 + 150 + 200 saved and restored != one "
			     "run of 200");
		}
	}
	/* Refusals. */
	run(&r, TIMEOUT_S, bin("bin/sbrun"), MODEL, "--restore",
	    tpath("none.kv"), NULL);
	expect("sbrun --restore missing", &r, 1, "No such file");
	run(&r, TIMEOUT_S, bin("bin/sbrun"), MODEL, "--restore", MODEL, NULL);
	expect("sbrun --restore a checkpoint", &r, 1, "not a session");
	run(&r, TIMEOUT_S, bin("bin/sbrun"), MODEL, "--kv", "dense", "--save",
	    kv, NULL);
	expect("sbrun --kv dense --save", &r, 2, "one sparse session");
	run(&r, TIMEOUT_S, bin("bin/sbrun"), MODEL, "--restore", kv,
	    "--prompt-ids", "3,4", NULL);
	expect("sbrun --restore --prompt-ids", &r, 2, "--restore");
	/* The prompt cache: the same ids as forking, with hits. 4 KiB
	 * pages: the prompt spans whole blocks of this tiny model. */
	setenv("SPARSEBUF_PAGE_SIZE", "4K", 1);
	run(&c1, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "120", "-s", "5",
	    "--ids", "--sessions", "4", "--prompt-ids", prompt, NULL);
	expect("sbrun --sessions 4", &c1, 0, NULL);
	run(&c2, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "120", "-s", "5",
	    "--ids", "--sessions", "4", "--prompt-ids", prompt,
	    "--prompt-cache", "--stats", NULL);
	unsetenv("SPARSEBUF_PAGE_SIZE");
	expect("sbrun --sessions 4 --prompt-cache", &c2, 0, "3 hit(s)");
	if (strcmp(c1.out, c2.out)) {
		show("forked", &c1);
		show("cached", &c2);
		FAIL("--prompt-cache changed the ids");
	}
	printf("sessions: save at 100 + restore = one run; three runs with "
	       "sampling = one; prompt cache: 3 hits, same ids\n");
}

/* ---- 5. crafted checkpoints (defect 7) ------------------------------------ */

static void write_file(const char *path, const void *p, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	CHECK(fd >= 0);
	CHECK(write(fd, p, n) == (ssize_t)n);
	close(fd);
}

static void *read_model(size_t *len)
{
	struct stat st;
	int fd = open(MODEL, O_RDONLY);
	void *p;

	CHECK(fd >= 0 && fstat(fd, &st) == 0);
	p = aligned_alloc(64, ((size_t)st.st_size + 63) & ~(size_t)63);
	CHECK(p && read(fd, p, (size_t)st.st_size) == st.st_size);
	close(fd);
	*len = (size_t)st.st_size;
	return p;
}

/* Where an accepted checkpoint's weights end. */
static const char *weights_end(const struct sbm_model *m)
{
	uint64_t d = (uint64_t)m->c.dim, V = (uint64_t)m->c.vocab_size;
	const char *a = (const char *)(m->w.rms_final + d +
				       (uint64_t)m->c.seq_len *
					       (uint64_t)m->head_size);
	const char *b = (const char *)(m->w.wcls + V * d);

	return a > b ? a : b;
}

/* An accepted checkpoint's weights all lie in [data, data + len). */
static void check_extent(const struct sbm_model *m, const void *data,
			 size_t len)
{
	if (weights_end(m) > (const char *)data + len)
		FAIL("accepted a header whose weights pass the end: dim %d "
		     "hidden %d layers %d heads %d/%d vocab %d seq %d, %zu bytes",
		     m->c.dim, m->c.hidden_dim, m->c.n_layers, m->c.n_heads,
		     m->c.n_kv_heads, m->c.vocab_size, m->c.seq_len, len);
}

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* A header field a fuzzer would try: small, a power of two, an edge. */
static int field(void)
{
	static const int edge[] = {0, 1, 2, 3, 4, 8, 64, 128, 256, 512,
				   -1, INT_MAX, INT_MIN, 1 << 30, 1 << 29,
				   46341, 65536, 2147483637};

	switch (rnd() % 4) {
	case 0:
		return edge[rnd() % (sizeof(edge) / sizeof(edge[0]))];
	case 1:
		return (int)(rnd() % 130) - 1;
	case 2:
		return 1 << (rnd() % 31);
	default:
		return (int)(uint32_t)rnd();
	}
}

static void llama_headers(void)
{
	/* dim, hidden, layers, heads, kv_heads, vocab, seq_len */
	static const struct {
		int h[7];
		const char *what;
	} bad[] = {
		/* 36 bytes: the weights' size wraps to 0 mod 2^64; sbrun
		 * accepted it and read 4 GiB past the mapping. */
		{{1 << 30, 1, 1, 1 << 29, 1, 2147483637, 1 << 29}, "wrap"},
		{{1 << 30, 1 << 30, 1 << 30, 2, 2, 32000, 1 << 30}, "huge"},
		{{64, 64, 1, 8, 4, INT_MIN, 64}, "vocab INT_MIN"},
		{{0, 0, 0, 0, 0, 0, 0}, "zeros"},
		{{64, 172, 5, 8, 16, 512, 512}, "kv_heads > heads"},
		{{64, 172, 5, 7, 7, 512, 512}, "dim % heads"},
		{{66, 172, 5, 2, 2, 512, 512}, "odd head size"},
		{{65536, 1, 1, 1, 1, 1, 1}, "head size > 1024"},
		{{64, 172, 5, 8, 4, 512, -1}, "negative seq_len"},
		{{64, 172, -5, 8, 4, 512, 512}, "negative layers"},
		{{INT_MAX - 1, 1, 1, 1073741823, 1, 1, 1}, "kv_dim overflow"},
	};
	static float buf[16384 / sizeof(float)];	/* aligned, zeros */
	struct sbm_model m;
	int accepted = 0;
	size_t len;
	void *real;
	struct res r;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memcpy(buf, bad[i].h, sizeof(bad[i].h));
		CHECK_EQ(sbm_bind(&m, buf, 36), -EBADMSG);
		CHECK(m.why != NULL);
		CHECK_EQ(sbm_bind(&m, buf, sizeof(buf)), -EBADMSG);
		write_file(tpath("bad.bin"), buf, 36);
		run(&r, TIMEOUT_S, bin("bin/sbrun"), tpath("bad.bin"), "-n", "4",
		    "-t", "0", NULL);
		expect(bad[i].what, &r, 1, "not a llama2.c checkpoint");
	}
	CHECK_EQ(sbm_bind(&m, (char *)buf + 1, 1024), -EINVAL);
	CHECK_EQ(sbm_bind(&m, buf, 27), -EBADMSG);
	/* Random headers: whatever is accepted lies within the data. */
	for (int i = 0; i < 200000; i++) {
		static const size_t lens[] = {28, 36, 4096, sizeof(buf)};
		int h[7];

		for (int k = 0; k < 7; k++)
			h[k] = field();
		if (i % 4 == 0) {	/* a plausible geometry, one field off */
			int ok[7] = {8, 16, 1, 2, 1, 4, 4};

			memcpy(h, ok, sizeof(ok));
			h[rnd() % 7] = field();
		}
		memcpy(buf, h, sizeof(h));
		len = lens[rnd() % 4];
		if (sbm_bind(&m, buf, len) == 0) {
			check_extent(&m, buf, len);
			accepted++;
		}
	}
	printf("checkpoints: crafted llama2.c headers refused; of 200000 "
	       "random ones, %d accepted, none past the data\n", accepted);
	if (!have_model)
		return;
	real = read_model(&len);
	CHECK_EQ(sbm_bind(&m, real, len), 0);
	check_extent(&m, real, len);
	{
		size_t need = (size_t)(weights_end(&m) - (const char *)real);

		/* Every cut short of the weights is refused. */
		for (size_t cut = 0; cut < need; cut += need / 97 + 1)
			CHECK_EQ(sbm_bind(&m, real, cut), -EBADMSG);
		CHECK_EQ(sbm_bind(&m, real, need - 1), -EBADMSG);
		CHECK_EQ(sbm_bind(&m, real, need), 0);
	}
	write_file(tpath("cut.bin"), real, len / 2);
	run(&r, TIMEOUT_S, bin("bin/sbrun"), tpath("cut.bin"), "-n", "4", "-t",
	    "0", NULL);
	expect("sbrun on half the model", &r, 1, "not a llama2.c checkpoint");
	free(real);
}

/* A tokenizer file for vocab entries: token i is "<i>"; edit() may spoil
 * entry `at`. Returns its length in buf. */
static size_t tokenizer(unsigned char *buf, int vocab, int max_len, int at,
			int bad_len, float bad_score)
{
	size_t n = 0;

	memcpy(buf, &max_len, 4);
	n += 4;
	for (int i = 0; i < vocab; i++) {
		char piece[32];
		float score = i == at ? bad_score : (float)i;
		int len = snprintf(piece, sizeof(piece), "<%d>", i);
		int wlen = i == at && bad_len != INT_MIN ? bad_len : len;

		memcpy(buf + n, &score, 4);
		memcpy(buf + n + 4, &wlen, 4);
		memcpy(buf + n + 8, piece, (size_t)len);
		n += 8 + (size_t)len;
	}
	return n;
}

static void tokenizers(void)
{
	static unsigned char buf[65536];
	static const struct {
		int max_len, at, len;
		float score;
		size_t cut;	/* bytes taken off the end */
		const char *what;
	} bad[] = {
		{16, 3, -1, 0, 0, "negative length"},
		{16, 3, 17, 0, 0, "longer than max_token_length"},
		{16, 3, 1 << 20, 0, 0, "huge length"},
		{16, 3, INT_MIN, NAN, 0, "NaN score"},
		{16, 3, INT_MIN, INFINITY, 0, "infinite score"},
		{0, -1, INT_MIN, 0, 0, "max_token_length 0"},
		{-5, -1, INT_MIN, 0, 0, "negative max_token_length"},
		{16, -1, INT_MIN, 0, 3, "truncated"},
		{16, -1, INT_MIN, 0, 9, "truncated in an entry"},
	};
	struct sbm_tokenizer t;
	struct sbm_model m;
	size_t n;
	int vocab = 512;
	struct res r;

	if (have_model) {
		CHECK_EQ(sbm_load(&m, MODEL), 0);
		vocab = m.c.vocab_size;
		sbm_unload(&m);
	}
	n = tokenizer(buf, vocab, 16, -1, INT_MIN, 0);
	CHECK_EQ(sbm_tokenizer_parse(&t, buf, n, vocab), 0);
	CHECK(!strcmp(sbm_decode(&t, 0, 42), "<42>"));
	sbm_tokenizer_free(&t);
	CHECK_EQ(sbm_tokenizer_parse(&t, buf, n, vocab + 1), -EBADMSG);
	CHECK_EQ(sbm_tokenizer_parse(&t, buf, n, 0), -EINVAL);
	CHECK_EQ(sbm_tokenizer_parse(&t, buf, n, INT_MAX), -EBADMSG);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char what[96];

		n = tokenizer(buf, vocab, bad[i].max_len, bad[i].at, bad[i].len,
			      bad[i].score) -
		    bad[i].cut;
		if (sbm_tokenizer_parse(&t, buf, n, vocab) != -EBADMSG)
			FAIL("tokenizer with a %s accepted", bad[i].what);
		CHECK(t.why != NULL);
		if (!have_model)
			continue;
		write_file(tpath("tok.bin"), buf, n);
		snprintf(what, sizeof(what), "sbrun -z (%s)", bad[i].what);
		run(&r, TIMEOUT_S, bin("bin/sbrun"), MODEL, "-n", "4", "-t", "0",
		    "-z", tpath("tok.bin"), NULL);
		expect(what, &r, 1, "not a llama2.c tokenizer");
	}
	/* Random damage: parsed or refused, never read past the data. */
	n = tokenizer(buf, 64, 16, -1, INT_MIN, 0);
	for (int i = 0; i < 20000; i++) {
		static unsigned char d[4096];
		size_t len = n - rnd() % (n + 1);

		memcpy(d, buf, n);
		for (int k = 0; k < 3; k++)
			d[rnd() % n] = (unsigned char)rnd();
		if (sbm_tokenizer_parse(&t, d, len, 64) == 0) {
			for (int k = 0; k < 64; k++)
				CHECK((int)strlen(t.vocab[k]) <=
				      t.max_token_length);
			sbm_tokenizer_free(&t);
		}
	}
	printf("tokenizers: crafted files refused, 20000 damaged ones parsed "
	       "within bounds\n");
}

/* The layout of h computed without wrapping; 0 when it does not fit in
 * 64 bits. */
static unsigned __int128 true_file_bytes(const struct sbf_header *h)
{
	unsigned __int128 d = h->dim, kv = d / h->n_heads * h->n_kv_heads;
	unsigned __int128 lf = d + d * d + 2 * kv * d + d * d + d + h->hidden +
			       (unsigned __int128)h->rank * d +
			       (unsigned __int128)h->hidden * h->rank;
	unsigned __int128 res = ((unsigned __int128)h->vocab * d +
				 h->n_layers * lf + d) * 4;
	unsigned __int128 ffn_off = (4096 + res + 4095) / 4096 * 4096;

	return ffn_off + (unsigned __int128)h->n_layers * h->hidden *
				 ((d * 4 + 4095) / 4096 * 4096);
}

static void set_geometry(struct sbf_header *h, int k, uint32_t v)
{
	switch (k) {
	case 0: h->dim = v; break;
	case 1: h->n_layers = v; break;
	case 2: h->n_heads = v; break;
	case 3: h->n_kv_heads = v; break;
	case 4: h->hidden = v; break;
	case 5: h->vocab = v; break;
	default: h->rank = v; break;
	}
}

static void flash_headers(void)
{
	struct sbf_header good, h;
	struct sbf_gen_opts o;
	const char *why;
	int fd, accepted = 0;
	struct res r;

	sbf_gen_defaults(&o, 4 * MiB);
	o.dim = 128, o.n_heads = 2, o.n_kv_heads = 1, o.hidden = 512;
	o.vocab = 64, o.rank = 8, o.n_layers = 1, o.threads = 1;
	CHECK_EQ(sbf_generate(tpath("good.flash"), &o, &good), 0);
	fd = sbf_open(tpath("good.flash"), &h, &why);
	CHECK(fd >= 0);
	close(fd);
	/* Its layout wraps: 2^31 layers and a rank of 2095102 put every
	 * size at 0 mod 2^64 but 12 KiB. The old check recomputed the same
	 * wrapped sums and agreed; sbgen --info printed it. */
	h = good;
	h.dim = 1024, h.n_layers = 1u << 31, h.n_heads = 8, h.n_kv_heads = 8;
	h.hidden = 1u << 21, h.vocab = 1, h.rank = 2095102;
	sbf_layout(&h);
	CHECK(h.file_bytes == 12288);	/* wrapped: the bug's premise */
	CHECK_EQ(sbf_header_check(&h, 12288, &why), -EBADMSG);
	{
		static char file[12288];

		memcpy(file, &h, sizeof(h));
		write_file(tpath("wrap.flash"), file, sizeof(file));
	}
	run(&r, TIMEOUT_S, bin("bin/sbgen"), "--info", tpath("wrap.flash"),
	    NULL);
	expect("sbgen --info on a wrapped layout", &r, 1,
	       "not an sbflash checkpoint");
	run(&r, TIMEOUT_S, bin("bin/sbflash"), tpath("wrap.flash"), "--mode",
	    "resident", "--steps", "1", "--no-progress", NULL);
	expect("sbflash on a wrapped layout", &r, 1,
	       "not an sbflash checkpoint");
	/* Cut short: refused, not SIGBUS under mmap. */
	h = good;
	CHECK_EQ(sbf_header_check(&h, h.file_bytes - 1, &why), -EBADMSG);
	CHECK(truncate(tpath("good.flash"), (off_t)good.file_bytes - 4096) ==
	      0);
	run(&r, TIMEOUT_S, bin("bin/sbflash"), tpath("good.flash"), "--mode",
	    "mmap_dense", "--steps", "1", "--no-progress", NULL);
	expect("sbflash on a truncated model", &r, 1, "shorter");
	/* Non-finite floats. */
	h = good, h.rope_theta = NAN;
	CHECK_EQ(sbf_header_check(&h, UINT64_MAX, &why), -EBADMSG);
	h = good, h.recall = INFINITY;
	CHECK_EQ(sbf_header_check(&h, UINT64_MAX, &why), -EBADMSG);
	/* Random fields over a good header: what is accepted is laid out
	 * without wrapping and within the file. */
	for (int i = 0; i < 200000; i++) {
		h = good;
		for (int k = 0, n = 1 + (int)(rnd() % 3); k < n; k++)
			set_geometry(&h, (int)(rnd() % 7),
				     rnd() % 2 ? (uint32_t)field()
					       : (uint32_t)(1u << (rnd() % 32)));
		if (rnd() % 2 && h.n_heads)
			sbf_layout(&h);	/* a consistent liar */
		if (sbf_header_check(&h, UINT64_MAX, &why) < 0)
			continue;
		if (true_file_bytes(&h) != h.file_bytes)
			FAIL("accepted a wrapped layout: dim %u layers %u "
			     "hidden %u vocab %u rank %u", h.dim, h.n_layers,
			     h.hidden, h.vocab, h.rank);
		accepted++;
	}
	unlink(tpath("good.flash"));
	unlink(tpath("wrap.flash"));
	printf("flash headers: wrapped and truncated layouts refused; of "
	       "200000 random ones, %d accepted, none wrapped\n", accepted);
}

/* ---- 6. FIFOs (defect 3) ----------------------------------------------- */

static void fifos(void)
{
	const char *fifo = tpath("fifo");
	const char *model = have_model ? MODEL : "/nonexistent-model";
	char env[PATH_MAX + 16], *envp[] = {env, NULL};
	struct res r;
	int st;

	CHECK(mkfifo(fifo, 0600) == 0);
	/* Nobody writes to it: open(2) without O_NONBLOCK waits forever. */
	run(&r, TIMEOUT_S, bin("bin/sbrun"), fifo, "-n", "4", NULL);
	expect("sbrun FIFO", &r, 1, "not a regular file");
	if (have_model) {
		run(&r, TIMEOUT_S, bin("bin/sbrun"), model, "-n", "4", "-t", "0",
		    "-z", fifo, NULL);
		expect("sbrun -z FIFO", &r, 1, "not a regular file");
	}
	run(&r, TIMEOUT_S, bin("bin/sbflash"), fifo, "--steps", "1",
	    "--no-progress", NULL);
	expect("sbflash FIFO", &r, 1, "not a regular file");
	run(&r, TIMEOUT_S, bin("bin/sbgen"), "--info", fifo, NULL);
	expect("sbgen --info FIFO", &r, 1, "not a regular file");
	/* The loaders themselves, in a child in case one blocks. */
	snprintf(env, sizeof(env), "CLI_FIFO=%s", fifo);
	st = run_child_env("fifo_loaders", envp, TIMEOUT_S, NULL, 0);
	CHECK_EQ(child_exit_code(st), 0);
	unlink(fifo);
	printf("FIFOs: refused at once by sbrun, sbrun -z, sbflash, sbgen "
	       "--info and the loaders\n");
}

/* ---- 7. sbgen's destination (defect 2) ------------------------------------ */

static void sbgen_small(struct res *r, const char *out)
{
	run(r, TIMEOUT_S, bin("bin/sbgen"), out, "--model-bytes", "4M",
	    "--dim", "128", "--heads", "2", "--kv-heads", "1", "--hidden",
	    "512", "--vocab", "64", "--rank", "8", "--layers", "1",
	    "--threads", "1", "--quiet", NULL);
}

static int entries(const char *dir)
{
	struct dirent *e;
	DIR *d = opendir(dir);
	int n = 0;

	CHECK(d != NULL);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

static void destinations(void)
{
	const char *fifo = tpath("out.fifo"), *node = tpath("out.null");
	const char *dir = tpath("out.dir"), *keep = tpath("keep.bin");
	char sub[PATH_MAX + 32], old[64] = "the previous model, to be kept";
	struct stat st;
	struct res r;
	pid_t pid;
	int fd;

	CHECK(mkfifo(fifo, 0600) == 0);
	sbgen_small(&r, fifo);
	expect("sbgen over a FIFO", &r, 1, "not a regular file");
	CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
	unlink(fifo);
	CHECK(mkdir(dir, 0700) == 0);
	sbgen_small(&r, dir);
	expect("sbgen over a directory", &r, 1, NULL);
	CHECK(lstat(dir, &st) == 0 && S_ISDIR(st.st_mode));
	rmdir(dir);
	/* A node like /dev/null (in our directory, never the real one):
	 * sbgen wrote the model into it, failed to truncate it and
	 * unlinked it. */
	if (mknod(node, S_IFCHR | 0600, makedev(1, 3)) == 0) {
		sbgen_small(&r, node);
		expect("sbgen over a character device", &r, 1,
		       "not a regular file");
		CHECK(lstat(node, &st) == 0 && S_ISCHR(st.st_mode));
		unlink(node);
	} else {
		printf("destinations: mknod: %s: device node not tried\n",
		       strerror(errno));
	}

	/* kill -9 in the middle: the previous file is intact. */
	snprintf(sub, sizeof(sub), "%s/kill", tmp);
	CHECK(mkdir(sub, 0700) == 0);
	snprintf(sub, sizeof(sub), "%s/kill/model.bin", tmp);
	write_file(sub, old, sizeof(old));
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int dn = open("/dev/null", O_WRONLY);

		dup2(dn, 1);
		dup2(dn, 2);
		execl(bin("bin/sbgen"), "sbgen", sub, "--model-bytes", "2G",
		      "--dim", "1024", "--threads", "1", "--quiet",
		      (char *)NULL);
		_exit(127);
	}
	usleep(400 * 1000);
	{
		int status;

		/* Still generating (2 GiB on one thread takes seconds). */
		CHECK_EQ(waitpid(pid, &status, WNOHANG), 0);
		kill(pid, SIGKILL);
		CHECK(waitpid(pid, &status, 0) == pid);
	}
	{
		char got[sizeof(old)] = "";

		fd = open(sub, O_RDONLY);
		CHECK(fd >= 0);
		if (read(fd, got, sizeof(got)) != (ssize_t)sizeof(old) ||
		    memcmp(got, old, sizeof(old)))
			FAIL("kill -9 during sbgen: the previous file was "
			     "overwritten");
		CHECK(fstat(fd, &st) == 0 && st.st_size == sizeof(old));
		close(fd);
	}
	snprintf(sub, sizeof(sub), "%s/kill", tmp);
	printf("destinations: after kill -9 the old file is intact (%d "
	       "entries in its directory)\n", entries(sub));

	/* Success replaces the file; through a symlink, its target. */
	write_file(keep, old, sizeof(old));
	CHECK(symlink("keep.bin", tpath("link.bin")) == 0);
	sbgen_small(&r, tpath("link.bin"));
	expect("sbgen through a symlink", &r, 0, NULL);
	CHECK(lstat(tpath("link.bin"), &st) == 0 && S_ISLNK(st.st_mode));
	run(&r, TIMEOUT_S, bin("bin/sbgen"), "--info", keep, NULL);
	expect("sbgen --info on the replaced file", &r, 0, NULL);
	CHECK(strstr(r.out, "dim 128") != NULL);
	CHECK(stat(keep, &st) == 0 && (st.st_mode & 0777) != 0 &&
	      st.st_size > 4096);
	unlink(tpath("link.bin"));
	unlink(keep);
	printf("destinations: FIFO, directory and device refused and left "
	       "alone; regular files and symlinks replaced\n");
}

/* ---- main ------------------------------------------------------------------ */

static int child(const char *name)
{
	const char *fifo = getenv("CLI_FIFO");
	struct sbm_model m;
	struct sbm_tokenizer t;
	struct sbf_header h;
	const char *why;

	if (strcmp(name, "fifo_loaders") || !fifo)
		return 2;
	if (sbm_load(&m, fifo) != -ENODEV)
		return 3;
	if (sbm_tokenizer_load(&t, fifo, 512) != -ENODEV)
		return 4;
	if (sbf_open(fifo, &h, &why) != -ENODEV)
		return 5;
	if (sbc_open_regular(fifo, NULL) != -ENODEV)
		return 6;
	if (sbm_load(&m, "/") != -EISDIR)
		return 7;
	if (sbm_load(&m, "/dev/null") != -ENODEV)
		return 8;
	return 0;
}

/* ---- system settings a script changes and puts back (scripts/knob.sh) -- */

/* The value in the knob file (a stand-in for /proc/sys/vm/max_map_count). */
static long knob_read(const char *path)
{
	char b[64];

	slurp_into(path, b, sizeof(b));
	return strtol(b, NULL, 10);
}

/* One shell snippet (K: knob.sh, F: the knob file) and what its stdout
 * must be, its stderr hold (NULL: anything). */
static void knob_case(const char *what, const char *knob, const char *body,
		      const char *out, const char *err_has)
{
	char sh[PATH_MAX * 2 + 1024];
	struct res r;

	snprintf(sh, sizeof(sh), "K=%s/scripts/knob.sh; F=%s; %s", src, knob,
		 body);
	run(&r, TIMEOUT_S, "/bin/sh", "-c", sh, NULL);
	if (r.code != 0 || strcmp(r.out, out) ||
	    (err_has && !strstr(r.err, err_has))) {
		show(what, &r);
		FAIL("%s: stdout not \"%s\"", what, out);
	}
}

static void knobs(void)
{
	char sh[PATH_MAX * 2 + 512];
	const char *knob = tpath("knob"), *notes = tpath("knob-notes");
	struct res r;
	FILE *f;

	if (!src[0]) {
		printf("knobs: no scripts here, skipped\n");
		return;
	}
	CHECK((f = fopen(knob, "w")) && fputs("100\n", f) >= 0 &&
	      fclose(f) == 0);
	CHECK(setenv("SPARSEBUF_KNOB_DIR", notes, 1) == 0);
	/* A run killed by kill -9 leaves the setting changed: no trap. */
	snprintf(sh, sizeof(sh),
		 ". %s/scripts/knob.sh; trap knob_restore EXIT; "
		 "knob_set %s 500; knob_set %s 600; kill -9 $$",
		 src, knob, knob);
	run(&r, TIMEOUT_S, "/bin/sh", "-c", sh, NULL);
	if (r.code != 128 + SIGKILL || knob_read(knob) != 600) {
		show("knob_set, then kill -9", &r);
		FAIL("the kill left %ld", knob_read(knob));
	}
	/* The next script that looks puts back the first value, and says. */
	snprintf(sh, sizeof(sh), ". %s/scripts/knob.sh; knob_stale", src);
	run(&r, TIMEOUT_S, "/bin/sh", "-c", sh, NULL);
	if (r.code != 0 || knob_read(knob) != 100 ||
	    !strstr(r.err, "put back to 100")) {
		show("knob_stale", &r);
		FAIL("after knob_stale: %ld", knob_read(knob));
	}
	/* A run that lives keeps its change from another's look, and from
	 * another's change to a different value (refused, status 2); its
	 * exit trap puts it back. */
	knob_case("knob_stale and knob_set beside a live run", knob,
		  "sh -c \". $K; trap knob_restore EXIT; knob_set $F 700; "
		  "sleep 1\" & sleep 0.3; sh -c \". $K; knob_stale\"; cat $F; "
		  "sh -c \". $K; knob_set $F 800\"; echo $?; cat $F; wait; "
		  "cat $F",
		  "700\n2\n700\n100\n", NULL);
	/* Raised by two runs: it stays raised until the last one ends. */
	knob_case("two runs raising", knob,
		  "sh -c \". $K; trap knob_restore EXIT; knob_set $F 500 raise; "
		  "sleep 0.6\" & sleep 0.3; sh -c \". $K; trap knob_restore "
		  "EXIT; knob_set $F 400 raise; sleep 0.6; cat $F\"; wait; "
		  "cat $F",
		  "500\n100\n", NULL);
	/* A setting the kernel takes only in part (vm.nr_hugepages when
	 * memory is short; here a knob_value that caps at 300): what it
	 * took is what is put back from. */
	knob_case("a setting taken in part", knob,
		  "sh -c \". $K; knob_value() { v=\\$(cat \\$1); "
		  "[ \\$v -gt 300 ] && v=300 && echo 300 >\\$1; echo \\$v; }; "
		  "trap knob_restore EXIT; knob_set $F 500 raise; cat $F\"; "
		  "cat $F",
		  "300\n100\n", NULL);
	/* Set by someone else after a killed run: left as it is. */
	knob_case("knob_stale after a change by someone else", knob,
		  "sh -c \". $K; knob_set $F 500; kill -9 \\$\\$\"; "
		  "echo 900 >$F; sh -c \". $K; knob_stale\"; cat $F",
		  "900\n", "left at 900");
	/* Huge pages: never more than free memory can give (nothing
	 * changed, the reason said), root or not. */
	knob_case("knob_hugepages beyond memory", knob,
		  "hp=$(cat /proc/sys/vm/nr_hugepages); . $K; "
		  "knob_hugepages 100000000; echo $?; "
		  "[ \"$(cat /proc/sys/vm/nr_hugepages)\" = \"$hp\" ] && echo same; "
		  "echo \"$knob_why\" | grep -qE 'available|not writable|no 2 MiB' "
		  "&& echo said",
		  "1\nsame\nsaid\n", NULL);
	/* bench/pagein.sh whose run cannot start (its directory) reserves
	 * no huge pages and leaves shmem_enabled alone for the runs it
	 * would compare, and says it skipped both. (Changing shmem_enabled
	 * for nothing once gave test_chaos's pools, beside this test, huge
	 * heap folios mid-run.) */
	{
		char pb[PATH_MAX + 32], sh2[PATH_MAX * 5 + 1024];

		snprintf(pb, sizeof(pb), "%s/bench/pagein", build);
		snprintf(sh2, sizeof(sh2),
			 "hp=$(cat /proc/sys/vm/nr_hugepages); "
			 "%s/bench/pagein.sh %s --dir /nonexistent/sparsebuf-x "
			 "--only seq 2>/dev/null </dev/null >%s/pagein.out; "
			 "[ \"$(cat /proc/sys/vm/nr_hugepages)\" = \"$hp\" ] && "
			 "! grep -q 'shmem_enabled is set' %s/pagein.out && "
			 "grep -c 'the run above failed: skipped' %s/pagein.out",
			 src, build, tmp, tmp, tmp);
		if (access(pb, X_OK) == 0) {
			run(&r, TIMEOUT_S, "/bin/sh", "-c", sh2, NULL);
			if (r.code != 0 || strcmp(r.out, "2\n")) {
				show("pagein.sh with a bad --dir", &r);
				FAIL("pagein.sh reserved huge pages or changed "
				     "shmem_enabled, or did not say it "
				     "skipped them");
			}
		}
	}
	{
		/* Nothing left but the lock file. */
		char lk[PATH_MAX + 64];

		snprintf(lk, sizeof(lk), "%s/.lock", notes);
		unlink(lk);
		if (rmdir(notes) != 0 && errno != ENOENT)
			FAIL("notes left in %s: %s", notes, strerror(errno));
	}
	unsetenv("SPARSEBUF_KNOB_DIR");
	printf("knobs: put back after kill -9, kept while a run lives, "
	       "raised until the last run ends, put back when taken in "
	       "part, left when set since\n");
}

static void locate(void)
{
	char self[PATH_MAX], p[PATH_MAX + 32];
	const char *t = getenv("TMPDIR"), *s = getenv("SPARSEBUF_SRC");
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	CHECK(n > 0);
	self[n] = 0;
	/* BUILD/tests/test_cli -> BUILD */
	snprintf(build, sizeof(build), "%s", dirname(dirname(self)));
	if (s && *s) {
		snprintf(src, sizeof(src), "%s", s);
	} else {
		snprintf(p, sizeof(p), "%s/../bench/run.sh", build);
		if (access(p, X_OK) == 0)
			snprintf(src, sizeof(src), "%s/..", build);
		else if (access("bench/run.sh", X_OK) == 0)
			snprintf(src, sizeof(src), ".");
	}
	snprintf(tmp, sizeof(tmp), "%s/sbcli-test-XXXXXX",
		 t && *t ? t : "/var/tmp");
	if (!mkdtemp(tmp))
		FAIL("mkdtemp %s: %s", tmp, strerror(errno));
	have_model = access(MODEL, R_OK) == 0;
	printf("programs in %s, scripts in %s, scratch in %s%s\n", build,
	       src[0] ? src : "(none)", tmp,
	       have_model ? "" : "; no model (" MODEL ")");
}

static int main_test(void)
{
	static const struct {
		const char *name;
		void (*fn)(void);
	} parts[] = {
		{"parsers", parsers},	    {"conventions", conventions},
		{"bad_values", bad_values}, {"sampling", sampling},
		{"llama_headers", llama_headers}, {"tokenizers", tokenizers},
		{"flash_headers", flash_headers}, {"fifos", fifos},
		{"destinations", destinations}, {"sessions", sessions},
		{"knobs", knobs},
	};
	/* CLI_PARTS="fifos sampling": only those (to see one fail alone
	 * against older programs). */
	const char *only = getenv("CLI_PARTS");

	locate();
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		if (!only || strstr(only, parts[i].name))
			parts[i].fn();
	disk_rm_rf(tmp);
	printf("cli: ok\n");
	return 0;
}
