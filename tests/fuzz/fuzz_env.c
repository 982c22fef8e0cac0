/* SPDX-License-Identifier: MIT */
/*
 * Fuzz the SPARSEBUF_* environment parser (lib/config.c): the size parser
 * sbi_parse_size, the constructor that reads every variable, the options
 * it hands to sb_pool_opts_init, and a pool made from them.
 *
 * Input: lines "SPARSEBUF_NAME=VALUE" (any of the variables but
 * SPARSEBUF_SPILL_DIR, which would have the fuzzer create files in
 * whatever directory it names); a line "pool" also creates a pool from
 * the result, writes a few pages, evicts them and reads them back (with
 * the pager and recycling chosen), and destroys it.
 *
 * The constructor is static and runs once per process, so this file
 * includes lib/config.c itself (its object is then not taken from the
 * library) and calls it once per input, with the file's statics put back
 * to the defaults before (reset() names them: update it when config.c
 * changes).
 *
 * The contract checked: a size that parses prints back to the same value
 * and parses again; every variable's bad value leaves page_size 0 in the
 * options (so sb_pool_create reports -EINVAL), a good set passes
 * sbi_opts_check; a pool from good options works or fails with a
 * documented -errno.
 */
#include "fuzz.h"

#include "config.c"

#define MAX_LINES 16

static const char *const names[] = {
	"SPARSEBUF_PAGE_SIZE", "SPARSEBUF_HEAP_SIZE", "SPARSEBUF_MAX_BYTES",
	"SPARSEBUF_NUMA_NODE", "SPARSEBUF_LOG",	      "SPARSEBUF_FAULT_THREADS",
	"SPARSEBUF_RECYCLE",   "SPARSEBUF_PAGER",     "SPARSEBUF_HUGETLB",
};
#define NNAMES (sizeof(names) / sizeof(names[0]))

static struct sb_pool_opts saved_opts;
static int saved_threads, saved_log;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* run.sh starts us without SPARSEBUF_*: the constructor that ran
	 * at load left the defaults. */
	for (size_t i = 0; i < NNAMES; i++)
		if (getenv(names[i]))
			FUZZ_SKIP(
				"%s is set: run without SPARSEBUF_* variables",
				names[i]);
	saved_opts = env_opts;
	saved_threads = env_fault_threads;
	saved_log = sbi_log_level;
	return 0;
}

static void reset(void)
{
	for (size_t i = 0; i < NNAMES; i++)
		unsetenv(names[i]);
	env_opts = saved_opts;
	env_error = 0;
	env_fault_threads = saved_threads;
	env_shmem_page = env_shmem_heap = 0;
	sbi_log_level = saved_log;
}

/* A size that parses prints back to itself. */
static void check_size(const char *s)
{
	size_t v, again;
	char buf[32];
	int r = sbi_parse_size(s, &v);

	FUZZ_CHECK(r == 0 || r == -EINVAL || r == -ERANGE,
		   "sbi_parse_size(\"%s\") returned %d", s, r);
	if (r < 0)
		return;
	snprintf(buf, sizeof(buf), "%zu", v);
	FUZZ_CHECK(sbi_parse_size(buf, &again) == 0 && again == v,
		   "\"%s\" parses to %zu, which does not parse back", s, v);
	/* Plain digits are exactly their value. */
	if (strspn(s, "0123456789") == strlen(s))
		FUZZ_CHECK(v == strtoull(s, NULL, 10), "\"%s\" parses to %zu",
			   s, v);
}

static void use_pool(void)
{
	struct sb_pool_opts o;
	struct sb_pool *p;
	struct sb_buf *b;
	int err = 0;

	sb_pool_opts_init(&o);
	/* A pool's fixed cost grows with these: keep a run cheap. */
	if (o.page_size > ((size_t)2 << 20) ||
	    o.heap_size > ((size_t)64 << 20) || env_fault_threads == 0 ||
	    env_fault_threads > 4)
		return;
	/* Huge pages are the machine's, reserved or not: not the parser's
	 * business (tests/test_hugetlb.c). */
	if (o.flags & SB_POOL_HUGETLB)
		return;
	p = sb_pool_create(&o, &err);
	if (!p) {
		FUZZ_CHECK(err == -EINVAL || err == -ENOSYS || err == -EPERM ||
				   err == -ENOMEM || err == -EMFILE,
			   "sb_pool_create: %d", err);
		return;
	}
	b = sb_buf_create(p, 4 * o.page_size, 0, &err);
	if (b) {
		struct fuzz_bus_guard g;
		char *a = sb_buf_addr(b), v;
		int wrote[4] = {0};

		sb_buf_map(b, 0, o.page_size);
		fuzz_bus_guard_on(&g);
		/* A budget below a page or two: SIGBUS is the answer. */
		for (size_t i = 0; i < 4; i++)
			wrote[i] =
				!fuzz_write(a + i * o.page_size, (char)(i + 1));
		/* Out to the spill file and back, with the pager and the
		 * recycling the environment chose: the same bytes, or (no
		 * room to read a page back in) SIGBUS. */
		sb_buf_evict(b, 0, 4 * o.page_size);
		for (size_t i = 0; i < 4; i++)
			if (wrote[i] && !fuzz_read(a + i * o.page_size, &v))
				FUZZ_CHECK(v == (char)(i + 1),
					   "page %zu reads %d after eviction, "
					   "not %d",
					   i, v, (int)(i + 1));
		fuzz_bus_guard_off(&g);
		sb_buf_destroy(b);
	}
	sb_pool_destroy(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1), *line, *save = NULL;
	struct sb_pool_opts o;
	int pool = 0, lines = 0;

	if (!text)
		abort();
	memcpy(text, data, size);
	text[size] = 0;
	reset();
	for (line = strtok_r(text, "\n", &save); line && lines < MAX_LINES;
	     line = strtok_r(NULL, "\n", &save), lines++) {
		char *eq = strchr(line, '=');

		if (!strcmp(line, "pool")) {
			pool = 1;
			continue;
		}
		if (!eq)
			continue;
		*eq = 0;
		for (size_t i = 0; i < NNAMES; i++)
			if (!strcmp(line, names[i]))
				setenv(line, eq + 1, 1);
		if (strstr(line, "SIZE") || strstr(line, "BYTES"))
			check_size(eq + 1);
	}
	sparsebuf_init_env();
	sbi_env_opts(&o, sizeof(o));
	if (sbi_env_error()) {
		FUZZ_CHECK(sbi_env_error() == -EINVAL && o.page_size == 0,
			   "bad environment: error %d, page_size %zu",
			   sbi_env_error(), o.page_size);
	} else {
		const char *why = sbi_opts_check(&o);

		FUZZ_CHECK(!why, "accepted options that fail their check: %s",
			   why);
		FUZZ_CHECK(env_fault_threads >= 0 && env_fault_threads <= 1024,
			   "%d fault threads", env_fault_threads);
		FUZZ_CHECK(sbi_log_level >= SBI_LOG_NONE &&
				   sbi_log_level <= SBI_LOG_DEBUG,
			   "log level %d", sbi_log_level);
		(void)sbi_env_recycle();
		if (pool)
			use_pool();
	}
	reset();
	free(text);
	return 0;
}
