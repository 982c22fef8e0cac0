/* Initialisation from SPARSEBUF_* in the library's constructor: good values
 * configure the default pool; bad ones are reported on stderr, never crash
 * the program, and surface as -EINVAL at the first call needing the pool. */
#include "harness.h"
#include "internal.h"

static int env_child(const char *name)
{
	struct sb_pool_opts o;
	struct sb_pool *p = sb_default_pool();
	struct sb_stats st;

	sb_pool_opts_init(&o);
	if (!strcmp(name, "good")) {
		/* SPARSEBUF_PAGE_SIZE=64K HEAP_SIZE=8M MAX_BYTES=1M */
		struct sb_buf *b;

		if (!p || sb_default_pool_error() != 0)
			return 10;
		if (o.page_size != 64 * KiB || o.heap_size != 8 * MiB ||
		    o.max_bytes != 1 * MiB || o.numa_node != -1)
			return 11;
		sb_pool_stats(p, &st);
		if (st.page_size != 64 * KiB || st.max_bytes != 1 * MiB)
			return 12;
		b = sb_buf_create(p, 1 * GiB, 0, NULL);
		if (!b || sb_buf_map(b, 0, 1 * MiB) != 16)
			return 13;
		if (sb_buf_map(b, 1 * MiB, 1) != -ENOMEM)
			return 14;
		if (sb_default_pool() != p)	/* one per process */
			return 15;
		sb_buf_destroy(b);
		return 0;
	}
	if (!strcmp(name, "bad")) {
		int err = 0;

		if (p != NULL || sb_default_pool_error() != -EINVAL)
			return 20;
		if (o.page_size != 0)
			return 21;
		if (sb_pool_create(&o, &err) != NULL || err != -EINVAL)
			return 22;
		return 0;
	}
	if (!strcmp(name, "nonode")) {
		/* The node parses but does not exist: pool creation says so. */
		return p == NULL && sb_default_pool_error() == -EINVAL ? 0 : 30;
	}
	return 2;
}

/* Linking the library commits nothing and starts no thread of its own
 * (sanitizer runtimes may have threads: look at names). */
static int lazy_child(void)
{
	FILE *p = popen("cat /proc/$PPID/task/*/comm", "r");
	char name[64];
	int ours = 0, all = 0;

	while (p && fgets(name, sizeof(name), p)) {
		all++;
		ours += !strncmp(name, "sb-", 3);
	}
	if (p)
		pclose(p);
	return all >= 1 && ours == 0 ? 0 : 40;
}

static int child(const char *name)
{
	if (!strcmp(name, "lazy"))
		return lazy_child();
	return env_child(name);
	return 2;
}

static void parse(const char *s, size_t want)
{
	size_t v = 12345;

	if (sbi_parse_size(s, &v) != 0)
		FAIL("parse \"%s\" failed", s);
	if (v != want)
		FAIL("parse \"%s\" = %zu, want %zu", s, v, want);
}

static void parse_bad(const char *s, int err)
{
	size_t v = 12345;
	int r = sbi_parse_size(s, &v);

	if (r != err)
		FAIL("parse \"%s\" = %d, want %d", s, r, err);
	CHECK_EQ(v, 12345);
}

/* Run child `name` with env; it must exit 0 and, if `says` is not NULL,
 * say it on stderr. */
static void expect(const char *name, char *const *env, const char *says)
{
	char out[4096];
	int st = run_child_env(name, env, 30, out, sizeof(out));

	if (child_exit_code(st) != 0)
		FAIL("child %s: status %d, stderr: %s", name, st, out);
	if (says && !strstr(out, says))
		FAIL("child %s: stderr lacks \"%s\": %s", name, says, out);
}

static int main_test(void)
{
	parse("4096", 4096);
	parse("256K", 256 * KiB);
	parse("256k", 256 * KiB);
	parse("64M", 64 * MiB);
	parse("64MiB", 64 * MiB);
	parse("64mb", 64 * MiB);
	parse("2G", 2 * GiB);
	parse("1T", 1 * TiB);
	parse("0", 0);
	parse(" 8K ", 8 * KiB);
	parse_bad("", -EINVAL);
	parse_bad("K", -EINVAL);
	parse_bad("-1", -EINVAL);
	parse_bad("12Q", -EINVAL);
	parse_bad("1.5G", -EINVAL);
	parse_bad("12 K x", -EINVAL);
	parse_bad("99999999999999999999999", -ERANGE);
	parse_bad("17179869184G", -ERANGE);
	parse_bad(NULL, -EINVAL);

	require_uffd();
	{
		char *good[] = {"SPARSEBUF_PAGE_SIZE=64K",
				"SPARSEBUF_HEAP_SIZE=8M",
				"SPARSEBUF_MAX_BYTES=1M", "SPARSEBUF_LOG=debug",
				NULL};
		char *bad_page[] = {"SPARSEBUF_PAGE_SIZE=abc", NULL};
		char *bad_pow2[] = {"SPARSEBUF_PAGE_SIZE=12K", NULL};
		char *bad_small[] = {"SPARSEBUF_PAGE_SIZE=1K", NULL};
		char *bad_heap[] = {"SPARSEBUF_HEAP_SIZE=1000K", NULL};
		char *bad_max[] = {"SPARSEBUF_MAX_BYTES=lots", NULL};
		char *bad_node[] = {"SPARSEBUF_NUMA_NODE=zero", NULL};
		char *no_node[] = {"SPARSEBUF_NUMA_NODE=4000", NULL};
		char *bad_log[] = {"SPARSEBUF_LOG=loud",
				   "SPARSEBUF_PAGE_SIZE=64K",
				   "SPARSEBUF_HEAP_SIZE=8M",
				   "SPARSEBUF_MAX_BYTES=1M", NULL};
		char *bad_threads[] = {"SPARSEBUF_FAULT_THREADS=many",
				       "SPARSEBUF_PAGE_SIZE=64K",
				       "SPARSEBUF_HEAP_SIZE=8M",
				       "SPARSEBUF_MAX_BYTES=1M", NULL};

		expect("good", good, NULL);
		expect("bad", bad_page, "SPARSEBUF_PAGE_SIZE=\"abc\"");
		expect("bad", bad_pow2, "not a power of two");
		expect("bad", bad_small, "below 4 KiB");
		expect("bad", bad_heap, "not a multiple");
		expect("bad", bad_max, "SPARSEBUF_MAX_BYTES");
		expect("bad", bad_node, "SPARSEBUF_NUMA_NODE");
		expect("nonode", no_node, "default pool is unavailable");
		expect("good", bad_log, "SPARSEBUF_LOG");
		expect("good", bad_threads, "SPARSEBUF_FAULT_THREADS");
		/* Switches: a value they do not know is said, and read as the
		 * default (an outsider's SPARSEBUF_PAGER=bogus passed in
		 * silence). */
		{
			static const char *const sw[][2] = {
				{"SPARSEBUF_RECYCLE=2", "SPARSEBUF_RECYCLE=\"2\""},
				{"SPARSEBUF_HOME=zz", "SPARSEBUF_HOME=\"zz\""},
				{"SPARSEBUF_PAGER=bogus",
				 "SPARSEBUF_PAGER=\"bogus\""},
			};

			for (size_t i = 0; i < 3; i++) {
				char *env[] = {(char *)sw[i][0],
					       "SPARSEBUF_PAGE_SIZE=64K",
					       "SPARSEBUF_HEAP_SIZE=8M",
					       "SPARSEBUF_MAX_BYTES=1M", NULL};

				expect("good", env, sw[i][1]);
			}
		}
		expect("lazy", NULL, NULL);
	}
	printf("environment: parsed, validated, reported\n");
	return 0;
}
