/* SPDX-License-Identifier: MIT */
/*
 * The SPARSEBUF_* environment, read once by an ELF constructor so that a
 * program only has to link the library. The constructor parses and
 * validates; it commits no memory and starts no thread (the default pool is
 * created on first use). A bad value is reported here, on stderr, and
 * surfaces as -EINVAL at the first call that needs the pool. The option
 * checks read the system's huge page size (/proc/meminfo), which
 * SB_POOL_HUGETLB's pages must be multiples of.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static struct sb_pool_opts env_opts = {
	.page_size = 256 << 10,
	.heap_size = 64 << 20,
	.max_bytes = 0,
	.numa_node = -1,
};
static int env_error;

int sbi_parse_size(const char *s, size_t *out)
{
	unsigned long long v = 0, mult = 1;
	const char *p = s;

	if (!s || !*s)
		return -EINVAL;
	while (*p == ' ')
		p++;
	if (*p < '0' || *p > '9')
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (v > (~0ull - 9) / 10)
			return -ERANGE;
		v = v * 10 + (unsigned long long)(*p - '0');
	}
	switch (*p) {
	case 'k': case 'K': mult = 1ull << 10; p++; break;
	case 'm': case 'M': mult = 1ull << 20; p++; break;
	case 'g': case 'G': mult = 1ull << 30; p++; break;
	case 't': case 'T': mult = 1ull << 40; p++; break;
	default: break;
	}
	if (mult > 1 && (*p == 'i' || *p == 'I'))
		p++;
	if (*p == 'b' || *p == 'B')
		p++;
	while (*p == ' ')
		p++;
	if (*p)
		return -EINVAL;
	if (v > (unsigned long long)SIZE_MAX / mult)
		return -ERANGE;
	*out = (size_t)(v * mult);
	return 0;
}

static void env_size(const char *name, size_t *field)
{
	const char *s = getenv(name);
	size_t v;
	int r;

	if (!s)
		return;
	r = sbi_parse_size(s, &v);
	if (r < 0) {
		sbi_err("%s=\"%s\" is not a size (expected e.g. 256K, 64M, 2G)"
			"; pools created from the environment will fail with "
			"EINVAL", name, s);
		if (!env_error)
			env_error = -EINVAL;
		return;
	}
	*field = v;
}

static void env_log(void)
{
	static const char *const names[] = {"none", "error", "warn", "info",
					    "debug"};
	const char *s = getenv("SPARSEBUF_LOG");
	char *end;
	long v;

	if (!s || !*s)
		return;
	for (int i = 0; i < 5; i++) {
		if (!strcasecmp(s, names[i])) {
			sbi_log_level = i;
			return;
		}
	}
	if (!strcasecmp(s, "warning")) {
		sbi_log_level = SBI_LOG_WARN;
		return;
	}
	v = strtol(s, &end, 10);
	if (*end || v < 0 || v > 4) {
		sbi_err("SPARSEBUF_LOG=\"%s\": expected none, error, warn, info,"
			" debug or 0-4; keeping warn", s);
		return;
	}
	sbi_log_level = (int)v;
}

static void env_numa(void)
{
	const char *s = getenv("SPARSEBUF_NUMA_NODE");
	char *end;
	long v;

	if (!s || !*s)
		return;
	v = strtol(s, &end, 10);
	if (*end || v < -1 || v > 4095) {
		sbi_err("SPARSEBUF_NUMA_NODE=\"%s\": expected a node number or "
			"-1; pools created from the environment will fail with "
			"EINVAL", s);
		if (!env_error)
			env_error = -EINVAL;
		return;
	}
	env_opts.numa_node = (int)v;
}

/* The system's huge pages, which SB_POOL_HUGETLB's option checks and
 * SPARSEBUF_HUGETLB's default page size depend on. meminfo_value: a
 * "Name:   value" line of /proc/meminfo, the value as written (kB for
 * sizes, a count for HugePages_*); -1 when absent. */
static long meminfo_value(const char *name)
{
	char line[128];
	size_t n = strlen(name);
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, name, n) && line[n] == ':') {
			v = strtol(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

size_t sbi_hugetlb_page_bytes(void)
{
	long kb = meminfo_value("Hugepagesize");

	return kb > 0 ? (size_t)kb << 10 : 0;
}

long sbi_hugetlb_pages_free(void)
{
	/* Free counts pages that mappings have reserved (HugePages_Rsvd)
	 * and not yet taken: nobody else can have those. */
	long n = meminfo_value("HugePages_Free"),
	     r = meminfo_value("HugePages_Rsvd");

	n -= r > 0 ? r : 0;
	return n > 0 ? n : 0;
}

/* SPARSEBUF_HUGETLB=1: heaps of huge pages, in pages of the huge page size
 * unless SPARSEBUF_PAGE_SIZE says otherwise. An option of the pool, so a
 * bad value is an error, as for the sizes. */
static size_t env_shmem_page, env_shmem_heap;	/* without the variable */

static void env_hugetlb(void)
{
	const char *s = getenv("SPARSEBUF_HUGETLB");
	size_t huge;

	if (!s || !*s || strcmp(s, "0") == 0)
		return;
	if (strcmp(s, "1") != 0) {
		sbi_err("SPARSEBUF_HUGETLB=\"%s\": expected 0 or 1; pools "
			"created from the environment will fail with EINVAL",
			s);
		if (!env_error)
			env_error = -EINVAL;
		return;
	}
	env_opts.flags |= SB_POOL_HUGETLB;
	env_shmem_page = env_opts.page_size;
	env_shmem_heap = env_opts.heap_size;
	huge = sbi_hugetlb_page_bytes();
	if (huge && !getenv("SPARSEBUF_PAGE_SIZE")) {
		env_opts.page_size = huge;
		if (!getenv("SPARSEBUF_HEAP_SIZE") &&
		    env_opts.heap_size % huge)
			env_opts.heap_size = 32 * huge;
	}
}

static int env_fault_threads = 4;

static void env_threads(void)
{
	const char *s = getenv("SPARSEBUF_FAULT_THREADS");
	char *end;
	long v;

	if (!s || !*s)
		return;
	v = strtol(s, &end, 10);
	if (*end || v < 0 || v > 1024) {
		sbi_err("SPARSEBUF_FAULT_THREADS=\"%s\": expected 0 (one per "
			"CPU) to 1024; keeping %d", s, env_fault_threads);
		return;
	}
	env_fault_threads = (int)v;
}

/* ---- sparsebufd -------------------------------------------------------- */

static const char *env_daemon;		/* SPARSEBUF_DAEMON: its socket */
static bool env_daemon_fail;		/* SPARSEBUF_DAEMON_FALLBACK=fail */
static int env_daemon_wait_ms = 5000;	/* SPARSEBUF_DAEMON_WAIT_MS */

static void env_daemon_vars(void)
{
	const char *s = getenv("SPARSEBUF_DAEMON");
	char *end;
	long v;

	if (s && *s)
		env_daemon = s;
	s = getenv("SPARSEBUF_DAEMON_FALLBACK");
	if (s && *s) {
		if (strcmp(s, "fail") == 0) {
			env_daemon_fail = true;
		} else if (strcmp(s, "local") != 0) {
			sbi_err("SPARSEBUF_DAEMON_FALLBACK=\"%s\": expected "
				"local or fail", s);
			env_error = -EINVAL;
		}
	}
	s = getenv("SPARSEBUF_DAEMON_WAIT_MS");
	if (s && *s) {
		v = strtol(s, &end, 10);
		if (*end || v < 0 || v > 3600 * 1000) {
			sbi_err("SPARSEBUF_DAEMON_WAIT_MS=\"%s\": expected 0 to "
				"3600000", s);
			env_error = -EINVAL;
		} else {
			env_daemon_wait_ms = (int)v;
		}
	}
}

const char *sbi_env_daemon(void)
{
	return env_daemon;
}

bool sbi_env_daemon_fail(void)
{
	return env_daemon_fail;
}

int sbi_env_daemon_wait_ms(void)
{
	return env_daemon_wait_ms;
}

/* An on/off switch, on unless 0. Advice, read per pool: a value that is
 * neither 0 nor 1 is said (a typo must not pass for the default), never
 * fatal. */
static bool env_switch(const char *name)
{
	const char *s = getenv(name);

	if (!s || !*s || strcmp(s, "1") == 0)
		return true;
	if (strcmp(s, "0") == 0)
		return false;
	sbi_warn("%s=\"%s\" is not 0 or 1; using 1", name, s);
	return true;
}

bool sbi_env_daemon_cache(void)
{
	return env_switch("SPARSEBUF_DAEMON_CACHE");
}

bool sbi_env_recycle(void)
{
	return env_switch("SPARSEBUF_RECYCLE");
}

bool sbi_env_home(void)
{
	return env_switch("SPARSEBUF_HOME");
}

bool sbi_env_pager_sync(void)
{
	const char *s = getenv("SPARSEBUF_PAGER");

	if (!s || !*s || strcmp(s, "io_uring") == 0)
		return false;
	if (strcmp(s, "sync") == 0)
		return true;
	sbi_warn("SPARSEBUF_PAGER=\"%s\" is not sync or io_uring; using "
		 "io_uring where the kernel has it", s);
	return false;
}

int sbi_env_touch(void)
{
	const char *s = getenv("SPARSEBUF_TOUCH");

	if (!s || !*s || strcmp(s, "auto") == 0)
		return -1;
	if (strcmp(s, "0") == 0 || strcmp(s, "1") == 0)
		return s[0] - '0';
	/* Advice, read per pool: a typo is said, not fatal. */
	sbi_warn("SPARSEBUF_TOUCH=\"%s\" is not 0, 1 or auto; using auto", s);
	return -1;
}

int sbi_env_fault_threads(void)
{
	return env_fault_threads;
}

__attribute__((constructor)) static void sparsebuf_init_env(void)
{
	env_log();
	env_size("SPARSEBUF_PAGE_SIZE", &env_opts.page_size);
	env_size("SPARSEBUF_HEAP_SIZE", &env_opts.heap_size);
	env_size("SPARSEBUF_MAX_BYTES", &env_opts.max_bytes);
	env_size("SPARSEBUF_MIN_BYTES", &env_opts.min_bytes);
	env_numa();
	env_hugetlb();
	env_threads();
	env_daemon_vars();
	if (!env_error) {
		const char *why = sbi_opts_check(&env_opts);

		if (why) {
			sbi_err("SPARSEBUF_* settings rejected: %s; pools "
				"created from the environment will fail with "
				"EINVAL", why);
			env_error = -EINVAL;
		}
	}
}

void sbi_env_opts(struct sb_pool_opts *opts, size_t size)
{
	*opts = env_opts;
	/* SPARSEBUF_HUGETLB lives in flags, which a program built against
	 * 0.2 or older cannot carry to sb_pool_create: its pools get shmem
	 * heaps and the page size they would have had without the variable,
	 * never huge pages' size on shmem. Said once. */
	if ((env_opts.flags & SB_POOL_HUGETLB) &&
	    size < offsetof(struct sb_pool_opts, flags) + sizeof(opts->flags)) {
		static atomic_bool said;

		opts->flags &= ~SB_POOL_HUGETLB;
		opts->page_size = env_shmem_page;
		opts->heap_size = env_shmem_heap;
		if (!atomic_exchange(&said, true))
			sbi_warn("SPARSEBUF_HUGETLB=1 does not apply to this "
				 "program's own pools: it was built against "
				 "sparsebuf 0.2 or older, whose sb_pool_opts "
				 "has no flags (shmem heaps instead)");
	}
	/* Poison the page size so the error surfaces at sb_pool_create. */
	if (env_error)
		opts->page_size = 0;
}

const char *sbi_opts_check(const struct sb_pool_opts *o)
{
	if (o->page_size < SBI_MIN_PAGE)
		return "page size below 4 KiB";
	if (o->page_size & (o->page_size - 1))
		return "page size not a power of two";
	if (o->heap_size < o->page_size)
		return "heap size smaller than the page size";
	if (o->heap_size % o->page_size)
		return "heap size not a multiple of the page size";
	if (o->heap_size / o->page_size > SBI_MAX_HEAP_PAGES)
		return "heap holds more than 4M pages";
	if (o->numa_node < -1)
		return "NUMA node below -1";
	if (o->max_bytes && o->min_bytes > o->max_bytes)
		return "min_bytes (SPARSEBUF_MIN_BYTES) above max_bytes";
	if (o->flags & ~SB_POOL_HUGETLB)
		return "unknown flags";
	if (o->flags & SB_POOL_HUGETLB) {
		size_t huge = sbi_hugetlb_page_bytes();

		/* mbind sets a shmem file's policy, which every allocation
		 * follows; a hugetlbfs file has none, and fallocate, which
		 * allocates the heaps' huge pages, follows the thread's. */
		if (o->numa_node >= 0)
			return "huge-page heaps (SPARSEBUF_HUGETLB) cannot be "
			       "bound to a NUMA node (SPARSEBUF_NUMA_NODE)";
		if (!huge)
			return "huge-page heaps (SPARSEBUF_HUGETLB), and this "
			       "kernel has no huge pages";
		if (o->page_size % huge)
			return "huge-page heaps (SPARSEBUF_HUGETLB) need a "
			       "page size that is a multiple of the huge page "
			       "size (Hugepagesize in /proc/meminfo)";
	}
	return NULL;
}

int sbi_env_error(void)
{
	return env_error;
}
