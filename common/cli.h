/* SPDX-License-Identifier: MIT */
/*
 * The command line of every program we build (sbrun, sbgen, sbflash,
 * sparsebuf-info, sparsebuf-demo, the benchmarks), one convention:
 *
 *   --help, -h   usage and one line per option on stdout, exit 0
 *   --version    "PROG (sparsebuf) X.Y.Z" on stdout, exit 0
 *   an unknown option, a missing or a bad value: one line on stderr that
 *   names the option and the value, exit status 2 (SBC_EXIT_USAGE)
 *
 * Options are a table; sbc_next() walks argv: "--name VALUE",
 * "--name=VALUE", "-n VALUE", "-nVALUE", positional arguments anywhere,
 * "--" ends the options. Values are parsed strictly: the whole string,
 * range-checked, NaN and infinities refused, sizes with K/M/G/T suffixes.
 *
 * Two layers. sbc_parse_*() are pure: 0 (or a count, an index) or -errno,
 * nothing printed, nothing exits; that is what a fuzzer calls. sbc_int()
 * and friends wrap them for a main(): a bad value prints the message and
 * exits 2 (through sbc.exit when set, so a harness can longjmp out).
 */
#ifndef SPARSEBUF_COMMON_CLI_H
#define SPARSEBUF_COMMON_CLI_H

#include <stdint.h>

#define SBC_EXIT_USAGE 2

/* ---- Pure parsers: 0 or -errno, *out written only on success ----------- */

/* A decimal integer (or 0x hex), optional sign, in [min, max]. -EINVAL:
 * not an integer (empty, spaces, trailing characters); -ERANGE: outside
 * [min, max]. */
int sbc_parse_int(const char *s, long long min, long long max,
		  long long *out);

/* The same for unsigned 64-bit values (seeds); a sign is refused. */
int sbc_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* A finite decimal number ("0.9", "1e-3") in [min, max]. -EINVAL: not a
 * number, or "nan", "inf", hex floats; -ERANGE: outside [min, max] or too
 * large for a double. */
int sbc_parse_double(const char *s, double min, double max, double *out);

/* A byte count: digits, an optional fraction, an optional K, M, G or T
 * (powers of 1024, optionally followed by "i" and "B": 64K, 64KiB, 4.5G),
 * rounded down to whole bytes, in [min, max]. -EINVAL, -ERANGE. */
int sbc_parse_size(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* The index of s in names (a NULL-terminated list), or -EINVAL. */
int sbc_parse_choice(const char *s, const char *const *names);

/* A comma-separated list of integers in [min, max] ("1,2,3"): the count
 * written to v, or -EINVAL (an empty element, a stray comma), -ERANGE, or
 * -E2BIG (more than max_n). */
int sbc_parse_list(const char *s, long long min, long long max, long long *v,
		   int max_n);

/* A comma-separated list of names out of names: indexes in v, the count
 * or -EINVAL, -E2BIG. */
int sbc_parse_choice_list(const char *s, const char *const *names, int *v,
			  int max_n);

/* ---- The option table and the walk over argv --------------------------- */

struct sbc_opt {
	int id;			/* returned by sbc_next(); > 0 */
	const char *name;	/* "--kv", "-n"; NULL ends the table */
	const char *arg;	/* the value in --help ("N", "dense|sparse");
				 * NULL: a flag, which takes no value */
	const char *help;	/* one line */
};

struct sbc {
	const char *prog;	/* in messages and --version */
	const char *usage;	/* what follows "usage: PROG "; a '\n' starts
				 * another synopsis line */
	const char *about;	/* printed by --help before the options; NULL:
				 * nothing */
	const struct sbc_opt *opts;
	/* Called instead of exit() when --help, --version or a usage error
	 * ends the program (status 0 or SBC_EXIT_USAGE); it must not
	 * return (a fuzzing harness longjmps). NULL: exit(3). */
	void (*exit)(int status);
	/* The walk's state (sbc_init). */
	int argc, i, only_args;
	char **argv;
	const char *opt;	/* the option being handled, for messages */
};

enum { SBC_END = 0, SBC_ARG = -1 };

/* Start a walk over argv[1..argc). */
void sbc_init(struct sbc *c, int argc, char **argv);

/* The next option's id with its value in *val (NULL for a flag), SBC_ARG
 * with a positional argument in *val, or SBC_END. Answers --help and
 * --version itself; an unknown option, a flag given a value or an option
 * without its value end the program with status 2. */
int sbc_next(struct sbc *c, const char **val);

/* Print the usage and the options to stdout (what --help prints). */
void sbc_help(const struct sbc *c);

/* End the program with a usage error: "PROG: <message>" on stderr and a
 * pointer to --help, status 2. */
void sbc_fail(const struct sbc *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3), noreturn));

/* ---- Values of the option being handled (c->opt): the pure parsers,
 * with a bad value ending the program (status 2, the option and the
 * value named) ---------------------------------------------------------- */

long long sbc_int(const struct sbc *c, const char *s, long long min,
		  long long max);
uint64_t sbc_u64(const struct sbc *c, const char *s, uint64_t min,
		 uint64_t max);
double sbc_double(const struct sbc *c, const char *s, double min, double max);
uint64_t sbc_size(const struct sbc *c, const char *s, uint64_t min,
		  uint64_t max);
int sbc_choice(const struct sbc *c, const char *s, const char *const *names);
int sbc_list(const struct sbc *c, const char *s, long long min, long long max,
	     long long *v, int max_n);
int sbc_choice_list(const struct sbc *c, const char *s,
		    const char *const *names, int *v, int max_n);

/* Walk argv of a program that takes no options and no arguments (but
 * --help and --version). */
void sbc_no_args(struct sbc *c, int argc, char **argv);

#endif /* SPARSEBUF_COMMON_CLI_H */
