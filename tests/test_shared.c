/* The shared library: linked with -lsparsebuf (no LD_PRELOAD), its
 * constructor reads SPARSEBUF_*; it exports the public API and nothing
 * else. */
#include "harness.h"

#include <dlfcn.h>

static int child(const char *name)
{
	struct sb_pool *p = sb_default_pool();
	struct sb_stats st;
	struct sb_buf *b;

	(void)name;
	if (!p || sb_pool_stats(p, &st) < 0 || st.page_size != 16 * KiB)
		return 10;
	b = sb_buf_create(p, 1 * GiB, 0, NULL);
	if (!b)
		return 11;
	((volatile char *)sb_buf_addr(b))[5 * MiB] = 1;
	sb_buf_destroy(b);
	return 0;
}

static int main_test(void)
{
	char *env[] = {"SPARSEBUF_PAGE_SIZE=16K", NULL};
	Dl_info info;
	const char *internal[] = {"sbi_pool_alloc", "sbi_parse_size",
				  "sbi_log", "sbi_fault_thread"};

	require_uffd();
	/* The public API resolves to libsparsebuf.so. */
	CHECK(dladdr((void *)sb_buf_map, &info) != 0);
	printf("sb_buf_map from %s\n", info.dli_fname);
	CHECK(strstr(info.dli_fname, "libsparsebuf.so") != NULL);
	CHECK(dlsym(RTLD_DEFAULT, "sb_pool_create") != NULL);
	for (size_t i = 0; i < sizeof(internal) / sizeof(internal[0]); i++)
		if (dlsym(RTLD_DEFAULT, internal[i]) != NULL)
			FAIL("%s is exported", internal[i]);
	CHECK_EQ(child_exit_code(run_child_env("use", env, 30, NULL, 0)), 0);
	printf("shared library: constructor configured the default pool\n");
	return 0;
}
