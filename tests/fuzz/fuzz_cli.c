/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the programs' command line (common/cli.c): the strict value
 * parsers every option goes through, and the walk over argv.
 *
 * Input: a selector byte, a bounds byte, then the text. Selectors 0-6 give
 * the text (up to its first NUL) to one parser, with bounds picked from a
 * small table (full range, the programs' typical ranges, empty ranges);
 * selector 7 and up split the text at NULs into argv and walk it with an
 * option table that has every kind of option (flag, short and long with a
 * value, each value type), as a program's main() would, the walk's exit()
 * turned into a longjmp.
 *
 * The contract checked, for every parser: it returns 0 or -EINVAL/-ERANGE
 * (-E2BIG for lists); what it accepts lies in [min, max], prints back to
 * text that parses to the same value (lists: the same elements), matches
 * what the C library makes of plain decimal text, and never came from
 * "nan", "inf" or a sign where none is allowed. The walk ends normally or
 * through exit status 0 (--help, --version) or 2 (a usage error), never
 * anything else.
 */
#include "fuzz.h"
#include "cli.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>

#define MAX_TEXT 256
#define MAX_ARGS 32
#define MAX_LIST 8

static const struct {
	long long min, max;
} int_bounds[] = {
	{LLONG_MIN, LLONG_MAX},
	{0, INT_MAX},
	{1, 1 << 24},
	{-1, 4095},
	{5, 5},
	{1, 0},
};

static const struct {
	uint64_t min, max;
} u64_bounds[] = {
	{0, UINT64_MAX},
	{1, (uint64_t)1 << 40},
	{4096, 4096},
	{1, 0},
};

static const struct {
	double min, max;
} dbl_bounds[] = {
	{-HUGE_VAL, HUGE_VAL}, {0.0, 2.0}, {0.0, 1.0},
	{-1e-300, 1e-300},     {1.0, 0.0},
};

static const char *const names[] = {"dense", "sparse", "f32", "f16",
				    "bf16",  "",       NULL};

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void check_int(const char *s, unsigned b)
{
	long long min = int_bounds[b % N(int_bounds)].min;
	long long max = int_bounds[b % N(int_bounds)].max;
	long long v = 0, again = 0;
	char buf[32];
	int r = sbc_parse_int(s, min, max, &v);

	FUZZ_CHECK(r == 0 || r == -EINVAL || r == -ERANGE,
		   "sbc_parse_int(\"%s\") returned %d", s, r);
	if (r < 0)
		return;
	FUZZ_CHECK(v >= min && v <= max, "\"%s\": %lld not in [%lld, %lld]", s,
		   v, min, max);
	FUZZ_CHECK(strspn(s, "+-0123456789abcdefABCDEFxX") == strlen(s),
		   "accepted \"%s\"", s);
	snprintf(buf, sizeof(buf), "%lld", v);
	FUZZ_CHECK(sbc_parse_int(buf, min, max, &again) == 0 && again == v,
		   "\"%s\" gave %lld, which does not parse back", s, v);
	if (!strpbrk(s, "xX"))
		FUZZ_CHECK(v == strtoll(s, NULL, 10), "\"%s\" gave %lld", s, v);
}

static void check_u64(const char *s, unsigned b)
{
	uint64_t min = u64_bounds[b % N(u64_bounds)].min;
	uint64_t max = u64_bounds[b % N(u64_bounds)].max;
	uint64_t v = 0, again = 0;
	char buf[32];
	int r = sbc_parse_u64(s, min, max, &v);

	FUZZ_CHECK(r == 0 || r == -EINVAL || r == -ERANGE,
		   "sbc_parse_u64(\"%s\") returned %d", s, r);
	if (r < 0)
		return;
	FUZZ_CHECK(v >= min && v <= max && isdigit((unsigned char)s[0]),
		   "\"%s\" gave %llu", s, (unsigned long long)v);
	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
	FUZZ_CHECK(sbc_parse_u64(buf, min, max, &again) == 0 && again == v,
		   "\"%s\" gave %llu, which does not parse back", s,
		   (unsigned long long)v);
	if (!strpbrk(s, "xX"))
		FUZZ_CHECK(v == strtoull(s, NULL, 10), "\"%s\" gave %llu", s,
			   (unsigned long long)v);
}

static void check_double(const char *s, unsigned b)
{
	double min = dbl_bounds[b % N(dbl_bounds)].min;
	double max = dbl_bounds[b % N(dbl_bounds)].max;
	double v = 0, again = 0;
	char buf[64];
	int r = sbc_parse_double(s, min, max, &v);

	FUZZ_CHECK(r == 0 || r == -EINVAL || r == -ERANGE,
		   "sbc_parse_double(\"%s\") returned %d", s, r);
	if (r < 0)
		return;
	FUZZ_CHECK(isfinite(v) && v >= min && v <= max,
		   "\"%s\" gave %g outside [%g, %g]", s, v, min, max);
	FUZZ_CHECK(strspn(s, "+-.0123456789eE") == strlen(s), "accepted \"%s\"",
		   s);
	snprintf(buf, sizeof(buf), "%.17g", v);
	FUZZ_CHECK(sbc_parse_double(buf, min, max, &again) == 0 && again == v,
		   "\"%s\" gave %.17g, which does not parse back", s, v);
	FUZZ_CHECK(v == strtod(s, NULL), "\"%s\" gave %.17g", s, v);
}

static void check_size(const char *s, unsigned b)
{
	uint64_t min = u64_bounds[b % N(u64_bounds)].min;
	uint64_t max = u64_bounds[b % N(u64_bounds)].max;
	uint64_t v = 0, again = 0;
	char buf[32];
	int r = sbc_parse_size(s, min, max, &v);
	size_t digits = strspn(s, "0123456789");

	FUZZ_CHECK(r == 0 || r == -EINVAL || r == -ERANGE,
		   "sbc_parse_size(\"%s\") returned %d", s, r);
	if (r < 0)
		return;
	FUZZ_CHECK(v >= min && v <= max, "\"%s\" gave %llu", s,
		   (unsigned long long)v);
	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
	FUZZ_CHECK(sbc_parse_size(buf, min, max, &again) == 0 && again == v,
		   "\"%s\" gave %llu, which does not parse back", s,
		   (unsigned long long)v);
	/* Whole numbers of a unit are exact: digits times the unit. */
	if (digits && s[digits] && strchr("kKmMgGtT", s[digits]) &&
	    (!s[digits + 1] || !strcmp(s + digits + 1, "B") ||
	     !strcmp(s + digits + 1, "iB"))) {
		int shift = strchr("kK", s[digits])   ? 10
			    : strchr("mM", s[digits]) ? 20
			    : strchr("gG", s[digits]) ? 30
						      : 40;

		FUZZ_CHECK(v == strtoull(s, NULL, 10) << shift,
			   "\"%s\" gave %llu", s, (unsigned long long)v);
	} else if (digits == strlen(s)) {
		FUZZ_CHECK(v == strtoull(s, NULL, 10), "\"%s\" gave %llu", s,
			   (unsigned long long)v);
	}
}

static void check_choice(const char *s)
{
	int r = sbc_parse_choice(s, names);

	FUZZ_CHECK(r == -EINVAL || (r >= 0 && r < (int)N(names) - 1 &&
				    !strcmp(names[r], s)),
		   "sbc_parse_choice(\"%s\") returned %d", s, r);
}

static void check_list(const char *s, unsigned b)
{
	long long min = int_bounds[b % N(int_bounds)].min;
	long long max = int_bounds[b % N(int_bounds)].max;
	long long v[MAX_LIST], again[MAX_LIST];
	char buf[MAX_LIST * 24];
	size_t n = 0;
	int r = sbc_parse_list(s, min, max, v, MAX_LIST);

	FUZZ_CHECK(r == -EINVAL || r == -ERANGE || r == -E2BIG ||
			   (r >= 1 && r <= MAX_LIST),
		   "sbc_parse_list(\"%s\") returned %d", s, r);
	if (r < 0)
		return;
	for (int i = 0; i < r; i++) {
		FUZZ_CHECK(v[i] >= min && v[i] <= max,
			   "\"%s\": element %d "
			   "is %lld",
			   s, i, v[i]);
		n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%lld",
				      i ? "," : "", v[i]);
	}
	FUZZ_CHECK(sbc_parse_list(buf, min, max, again, MAX_LIST) == r &&
			   !memcmp(v, again, (size_t)r * sizeof(v[0])),
		   "\"%s\" gave \"%s\", which does not parse back", s, buf);
}

static void check_choice_list(const char *s)
{
	int v[MAX_LIST];
	int r = sbc_parse_choice_list(s, names, v, MAX_LIST);

	FUZZ_CHECK(r == -EINVAL || r == -E2BIG || (r >= 1 && r <= MAX_LIST),
		   "sbc_parse_choice_list(\"%s\") returned %d", s, r);
	for (int i = 0; i < r; i++)
		FUZZ_CHECK(v[i] >= 0 && v[i] < (int)N(names) - 1,
			   "\"%s\": element %d is %d", s, i, v[i]);
}

/* ---- the walk ------------------------------------------------------------ */

enum { O_FLAG = 1, O_INT, O_U64, O_DBL, O_SIZE, O_CHOICE, O_LIST, O_NAMES };

static const struct sbc_opt opts[] = {
	{O_FLAG, "--ids", NULL, "a flag"},
	{O_FLAG, "-i", NULL, "a short flag"},
	{O_INT, "-n", "N", "an integer"},
	{O_INT, "--steps", "N", "an integer"},
	{O_U64, "--seed", "S", "a seed"},
	{O_DBL, "-t", "T", "a number"},
	{O_SIZE, "--budget", "BYTES", "a size"},
	{O_CHOICE, "--kv", "dense|sparse", "a choice"},
	{O_LIST, "--prompt-ids", "1,2,3", "a list"},
	{O_NAMES, "--modes", "a,b", "a list of names"},
	{0, NULL, NULL, NULL},
};

static sigjmp_buf walk_jmp;
static int walk_status;
static FILE *null_file, *real_out, *real_err;

static void walk_exit(int status)
{
	walk_status = status;
	siglongjmp(walk_jmp, 1);
}

/* The usage errors and --help of half the inputs would flood the log and
 * slow the fuzzer: while the walk runs, stdout and stderr (the streams,
 * not the descriptors: a sanitizer report still reaches fd 2) go to
 * /dev/null. */
static void quiet(int on)
{
	if (on) {
		fflush(stdout);
		fflush(stderr);
		real_out = stdout, real_err = stderr;
		stdout = stderr = null_file;
	} else {
		stdout = real_out, stderr = real_err;
	}
}

#define WALK_CHECK(cond, ...)                                                  \
	do {                                                                   \
		if (!(cond))                                                   \
			quiet(0);                                              \
		FUZZ_CHECK(cond, __VA_ARGS__);                                 \
	} while (0)

static void walk(char *text, size_t len)
{
	static struct sbc c; /* static: survives the longjmp */
	static char *argv[MAX_ARGS + 1];
	int argc = 0;
	const char *v;
	int id;

	argv[argc++] = "fuzz";
	for (size_t i = 0; i < len && argc < MAX_ARGS;
	     i += strlen(text + i) + 1)
		argv[argc++] = text + i;
	argv[argc] = NULL;
	memset(&c, 0, sizeof(c));
	c.prog = "fuzz";
	c.usage = "[options] FILE";
	c.opts = opts;
	c.exit = walk_exit;
	walk_status = -1;
	if (sigsetjmp(walk_jmp, 0)) {
		quiet(0);
		FUZZ_CHECK(walk_status == 0 || walk_status == SBC_EXIT_USAGE,
			   "exit status %d", walk_status);
		return;
	}
	quiet(1);
	sbc_init(&c, argc, argv);
	while ((id = sbc_next(&c, &v)) != SBC_END) {
		long long list[MAX_LIST];
		int idx[MAX_LIST];

		WALK_CHECK(id == SBC_ARG || (id >= O_FLAG && id <= O_NAMES),
			   "sbc_next returned %d", id);
		WALK_CHECK(id == O_FLAG ? !v : v != NULL,
			   "option %d with value %p", id, (const void *)v);
		switch (id) {
		case O_INT:
			sbc_int(&c, v, 0, 1 << 20);
			break;
		case O_U64:
			sbc_u64(&c, v, 0, UINT64_MAX);
			break;
		case O_DBL:
			sbc_double(&c, v, 0.0, 2.0);
			break;
		case O_SIZE:
			sbc_size(&c, v, 4096, (uint64_t)1 << 50);
			break;
		case O_CHOICE:
			sbc_choice(&c, v, names);
			break;
		case O_LIST:
			sbc_list(&c, v, 0, 1 << 24, list, MAX_LIST);
			break;
		case O_NAMES:
			sbc_choice_list(&c, v, names, idx, MAX_LIST);
			break;
		default:
			break;
		}
	}
	quiet(0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	null_file = fopen("/dev/null", "w");
	if (!null_file)
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char text[MAX_TEXT + 1];
	unsigned sel, b;
	size_t len;

	if (size < 2 || size - 2 > MAX_TEXT)
		return 0;
	sel = data[0], b = data[1];
	len = size - 2;
	memcpy(text, data + 2, len);
	text[len] = 0;
	switch (sel) {
	case 0:
		check_int(text, b);
		break;
	case 1:
		check_u64(text, b);
		break;
	case 2:
		check_double(text, b);
		break;
	case 3:
		check_size(text, b);
		break;
	case 4:
		check_choice(text);
		break;
	case 5:
		check_list(text, b);
		break;
	case 6:
		check_choice_list(text);
		break;
	default:
		walk(text, len);
		break;
	}
	return 0;
}
