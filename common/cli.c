/* SPDX-License-Identifier: MIT */
/*
 * The programs' command lines (cli.h): strict value parsers, the option
 * walk, --help and --version. Owns nothing but what argv points to.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparsebuf.h"

/* ---- Pure parsers ------------------------------------------------------ */

static bool is_digit(char ch)
{
	return ch >= '0' && ch <= '9';
}

/* The base of a number after its sign: 16 for "0x...", else 10. Octal is
 * not guessed from a leading 0: "010" is ten. */
static int base_of(const char *p)
{
	return p[0] == '0' && (p[1] == 'x' || p[1] == 'X') ? 16 : 10;
}

/* strtoll and strtoull skip leading spaces and take a sign anywhere the
 * number starts; check what they would be given first. */
static bool number_start(const char *s, bool sign_ok)
{
	const char *p = s;

	if (!s || !*s)
		return false;
	if (sign_ok && (*p == '-' || *p == '+'))
		p++;
	if (base_of(p) == 16)
		return p[2] && strchr("0123456789abcdefABCDEF", p[2]);
	return is_digit(*p);
}

int sbc_parse_int(const char *s, long long min, long long max,
		  long long *out)
{
	const char *p = s;
	char *end;
	long long v;

	if (!number_start(s, true))
		return -EINVAL;
	if (*p == '-' || *p == '+')
		p++;
	errno = 0;
	v = strtoll(s, &end, base_of(p));
	if (*end)
		return -EINVAL;
	if (errno == ERANGE || v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int sbc_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	unsigned long long v;
	char *end;

	/* No sign: strtoull would turn "-1" into the largest value. */
	if (!number_start(s, false))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, base_of(s));
	if (*end)
		return -EINVAL;
	if (errno == ERANGE || v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int sbc_parse_double(const char *s, double min, double max, double *out)
{
	bool digits = false;
	char *end;
	double v;

	if (!s || !*s)
		return -EINVAL;
	/* Plain decimal notation only: strtod also takes "nan", "inf",
	 * "infinity", hex floats and leading spaces. */
	for (const char *p = s; *p; p++) {
		if (is_digit(*p))
			digits = true;
		else if (!strchr(".eE+-", *p))
			return -EINVAL;
	}
	if (!digits || !(is_digit(*s) || strchr(".+-", *s)))
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (*end || end == s)
		return -EINVAL;
	/* Underflow to zero or a denormal is a value; overflow is not. */
	if (!isfinite(v) || (errno == ERANGE && fabs(v) > 1.0))
		return -ERANGE;
	if (!(v >= min && v <= max))
		return -ERANGE;
	*out = v;
	return 0;
}

int sbc_parse_size(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t ip = 0, frac = 0, scale = 1, mult = 1, v;
	unsigned __int128 part;
	const char *p = s;

	if (!s || !is_digit(*p))
		return -EINVAL;
	for (; is_digit(*p); p++)
		if (__builtin_mul_overflow(ip, 10, &ip) ||
		    __builtin_add_overflow(ip, (uint64_t)(*p - '0'), &ip))
			return -ERANGE;
	if (*p == '.') {
		if (!is_digit(*++p))
			return -EINVAL;
		/* 18 digits are exact in 64 bits and finer than a byte of a
		 * terabyte; the rest are checked and dropped. */
		for (int n = 0; is_digit(*p); p++, n++) {
			if (n < 18) {
				frac = frac * 10 + (uint64_t)(*p - '0');
				scale *= 10;
			}
		}
	}
	switch (*p) {
	case 'k': case 'K': mult = 1ull << 10; break;
	case 'm': case 'M': mult = 1ull << 20; break;
	case 'g': case 'G': mult = 1ull << 30; break;
	case 't': case 'T': mult = 1ull << 40; break;
	default: break;
	}
	if (mult > 1) {
		p++;
		if (*p == 'i' || *p == 'I')
			p++;
	}
	if (*p == 'b' || *p == 'B')
		p++;
	if (*p)
		return -EINVAL;
	part = (unsigned __int128)frac * mult / scale;
	if (__builtin_mul_overflow(ip, mult, &v) ||
	    __builtin_add_overflow(v, (uint64_t)part, &v))
		return -ERANGE;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int sbc_parse_choice(const char *s, const char *const *names)
{
	if (!s)
		return -EINVAL;
	for (int i = 0; names[i]; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -EINVAL;
}

/* The elements of a comma-separated list, one at a time, copied into buf
 * (an element longer than it is refused). Returns the element's length,
 * 0 at the end, -EINVAL for an empty element or one too long. */
static int list_next(const char **pp, char *buf, size_t size)
{
	const char *p = *pp, *e;
	size_t n;

	if (!p)
		return 0;
	e = strchr(p, ',');
	n = e ? (size_t)(e - p) : strlen(p);
	if (n == 0 || n >= size)
		return -EINVAL;
	memcpy(buf, p, n);
	buf[n] = 0;
	/* After a final comma an empty element follows: refused next. */
	*pp = e ? e + 1 : NULL;
	return (int)n;
}

int sbc_parse_list(const char *s, long long min, long long max, long long *v,
		   int max_n)
{
	char buf[64];
	int n = 0, r;

	if (!s || !*s)
		return -EINVAL;
	while ((r = list_next(&s, buf, sizeof(buf))) > 0) {
		long long x;

		if (n == max_n)
			return -E2BIG;
		r = sbc_parse_int(buf, min, max, &x);
		if (r < 0)
			return r;
		v[n++] = x;
	}
	return r < 0 ? r : n;
}

int sbc_parse_choice_list(const char *s, const char *const *names, int *v,
			  int max_n)
{
	char buf[64];
	int n = 0, r;

	if (!s || !*s)
		return -EINVAL;
	while ((r = list_next(&s, buf, sizeof(buf))) > 0) {
		int k = sbc_parse_choice(buf, names);

		if (k < 0)
			return k;
		if (n == max_n)
			return -E2BIG;
		v[n++] = k;
	}
	return r < 0 ? r : n;
}

/* ---- The walk ------------------------------------------------------------ */

static void __attribute__((noreturn)) finish(const struct sbc *c, int status)
{
	fflush(stdout);
	if (c->exit)
		c->exit(status);
	exit(status);
}

void sbc_fail(const struct sbc *c, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", c->prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (%s --help lists the options)\n", c->prog);
	finish(c, SBC_EXIT_USAGE);
}

static void print_usage(const struct sbc *c, FILE *f)
{
	const char *u = c->usage ? c->usage : "";

	fprintf(f, "usage: %s%s", c->prog, *u ? " " : "");
	for (; *u; u++) {
		fputc(*u, f);
		if (*u == '\n' && u[1])
			fprintf(f, "       %s ", c->prog);
	}
	fputc('\n', f);
}

static void help_line(const char *name, const char *arg, const char *help)
{
	char left[64];

	snprintf(left, sizeof(left), "%s%s%s", name, arg ? " " : "",
		 arg ? arg : "");
	printf("  %-24s %s\n", left, help ? help : "");
}

void sbc_help(const struct sbc *c)
{
	print_usage(c, stdout);
	if (c->about)
		printf("\n%s\n", c->about);
	printf("\noptions:\n");
	for (const struct sbc_opt *o = c->opts; o && o->name; o++)
		help_line(o->name, o->arg, o->help);
	help_line("--help", NULL, "print this help and exit");
	help_line("--version", NULL, "print the version and exit");
}

void sbc_init(struct sbc *c, int argc, char **argv)
{
	c->argc = argc;
	c->argv = argv;
	c->i = 1;
	c->only_args = 0;
	c->opt = NULL;
}

int sbc_next(struct sbc *c, const char **val)
{
	const char *a, *eq;
	size_t len;

	*val = NULL;
	if (c->i >= c->argc)
		return SBC_END;
	a = c->argv[c->i++];
	/* "-" alone is an argument (stdin, by the usual convention). */
	if (c->only_args || a[0] != '-' || !a[1]) {
		*val = a;
		return SBC_ARG;
	}
	if (!strcmp(a, "--")) {
		c->only_args = 1;
		return sbc_next(c, val);
	}
	if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
		sbc_help(c);
		finish(c, 0);
	}
	if (!strcmp(a, "--version")) {
		printf("%s (sparsebuf) %d.%d.%d\n", c->prog,
		       SPARSEBUF_VERSION_MAJOR, SPARSEBUF_VERSION_MINOR,
		       SPARSEBUF_VERSION_PATCH);
		finish(c, 0);
	}
	/* "--name=value", or "-nvalue" for a one-letter option. */
	eq = a[1] == '-' ? strchr(a, '=') : NULL;
	len = eq ? (size_t)(eq - a) : strlen(a);
	for (const struct sbc_opt *o = c->opts; o && o->name; o++) {
		size_t nl = strlen(o->name);
		bool joined = o->name[1] != '-' && o->arg && nl == 2 &&
			      !strncmp(a, o->name, 2) && a[2];

		if (!joined && (nl != len || strncmp(a, o->name, len)))
			continue;
		c->opt = o->name;
		if (!o->arg) {
			if (eq)
				sbc_fail(c, "option %s takes no value", o->name);
			return o->id;
		}
		if (joined)
			*val = a + 2;
		else if (eq)
			*val = eq + 1;
		else if (c->i < c->argc)
			*val = c->argv[c->i++];
		else
			sbc_fail(c, "option %s needs a value (%s)", o->name,
				 o->arg);
		return o->id;
	}
	c->opt = a;
	sbc_fail(c, "unknown option '%.*s'", (int)len, a);
}

void sbc_no_args(struct sbc *c, int argc, char **argv)
{
	const char *v;

	sbc_init(c, argc, argv);
	if (sbc_next(c, &v) == SBC_ARG)
		sbc_fail(c, "unexpected argument '%s'", v);
}

/* ---- Values of the current option -------------------------------------- */

static void bad_value(const struct sbc *c, const char *s, int err,
		      const char *what, const char *range)
{
	if (err == -ERANGE && range)
		sbc_fail(c, "%s: '%s' is out of range (%s)", c->opt, s, range);
	if (err == -E2BIG)
		sbc_fail(c, "%s: '%s' has too many elements", c->opt, s);
	sbc_fail(c, "%s: '%s' is not %s", c->opt, s, what);
}

long long sbc_int(const struct sbc *c, const char *s, long long min,
		  long long max)
{
	long long v;
	int r = sbc_parse_int(s, min, max, &v);
	char range[64];

	if (r < 0) {
		snprintf(range, sizeof(range), "%lld to %lld", min, max);
		bad_value(c, s, r, "an integer", range);
	}
	return v;
}

uint64_t sbc_u64(const struct sbc *c, const char *s, uint64_t min,
		 uint64_t max)
{
	uint64_t v;
	int r = sbc_parse_u64(s, min, max, &v);
	char range[64];

	if (r < 0) {
		snprintf(range, sizeof(range), "%llu to %llu",
			 (unsigned long long)min, (unsigned long long)max);
		bad_value(c, s, r, "a non-negative integer", range);
	}
	return v;
}

double sbc_double(const struct sbc *c, const char *s, double min, double max)
{
	double v;
	int r = sbc_parse_double(s, min, max, &v);
	char range[64];

	if (r < 0) {
		snprintf(range, sizeof(range), "%g to %g", min, max);
		bad_value(c, s, r, "a finite number", range);
	}
	return v;
}

uint64_t sbc_size(const struct sbc *c, const char *s, uint64_t min,
		  uint64_t max)
{
	uint64_t v;
	int r = sbc_parse_size(s, min, max, &v);
	char range[64];

	if (r < 0) {
		snprintf(range, sizeof(range), "%llu to %llu bytes",
			 (unsigned long long)min, (unsigned long long)max);
		bad_value(c, s, r, "a size (e.g. 4096, 512M, 4.5G)", range);
	}
	return v;
}

/* "a, b, c" into buf. */
static const char *names_text(const char *const *names, char *buf,
			      size_t size)
{
	size_t n = 0;

	buf[0] = 0;
	for (int i = 0; names[i] && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, "%s%s",
				      i ? ", " : "", names[i]);
	return buf;
}

int sbc_choice(const struct sbc *c, const char *s, const char *const *names)
{
	int r = sbc_parse_choice(s, names);
	char buf[256], what[300];

	if (r < 0) {
		snprintf(what, sizeof(what), "one of %s",
			 names_text(names, buf, sizeof(buf)));
		bad_value(c, s, r, what, NULL);
	}
	return r;
}

int sbc_list(const struct sbc *c, const char *s, long long min, long long max,
	     long long *v, int max_n)
{
	int r = sbc_parse_list(s, min, max, v, max_n);
	char range[64];

	if (r < 0) {
		snprintf(range, sizeof(range), "each %lld to %lld", min, max);
		bad_value(c, s, r, "a comma-separated list of integers",
			  range);
	}
	return r;
}

int sbc_choice_list(const struct sbc *c, const char *s,
		    const char *const *names, int *v, int max_n)
{
	int r = sbc_parse_choice_list(s, names, v, max_n);
	char buf[256], what[320];

	if (r < 0) {
		snprintf(what, sizeof(what),
			 "a comma-separated list of %s",
			 names_text(names, buf, sizeof(buf)));
		bad_value(c, s, r, what, NULL);
	}
	return r;
}
