/* The ABI (issue 13): structs that grow are met by size (older-sized
 * structs read with the new fields at 0 and written no further than their
 * end; newer-sized ones refused when they set a field this library does
 * not know); the 0.1 entry points use the 0.1 sizes; the version call
 * agrees with the header; every exported symbol is in the linker map's
 * version nodes, declared in a public header and given a man page, and
 * nothing else is exported. */
#include "harness.h"
#include "sparsebuf_kv.h"

#include <libgen.h>
#include <limits.h>

/* The 0.1 entry points, as a program built against 0.1 calls them (the
 * headers now wrap these names in inline functions passing sizes). */
extern struct sb_kv_seq *v01_kv_create(struct sb_pool *pool,
				       const struct sb_kv_config *cfg,
				       int *err) __asm__("sb_kv_create");
extern int v01_pool_stats(struct sb_pool *pool,
			  struct sb_stats *st) __asm__("sb_pool_stats");

#define KV_CONFIG_0_1 offsetof(struct sb_kv_config, flags)

static int child(const char *name)
{
	(void)name;
	return 2;
}

static void structs(void)
{
	struct sb_pool *p = make_pool(64 * KiB, 4 * MiB, 0);
	struct sb_pool_opts o;
	struct sb_kv_seq *s;
	int err = 0;
	/* A 0.1 program's sb_kv_config: no flags field; whatever follows it
	 * in the caller's memory is not the library's to read. */
	union {
		struct sb_kv_config cfg;
		unsigned char bytes[sizeof(struct sb_kv_config) + 64];
	} old;
	struct {
		struct sb_stats st;
		unsigned char tail[64];
	} big;

	memset(&old, 0xa5, sizeof(old));
	old.cfg.n_layers = 2;
	old.cfg.n_kv_heads = 1;
	old.cfg.head_dim = 64;
	old.cfg.dtype = SB_KV_F16;
	old.cfg.max_ctx = 4096;
	old.cfg.window = NULL;
	old.cfg.lookahead = 0;
	/* old.cfg.flags holds 0xa5a5a5a5: garbage past a 0.1 struct. */
	s = sb_kv_create_sz(p, &old.cfg, KV_CONFIG_0_1, &err);
	CHECK(s != NULL);
	sb_kv_destroy(s);
	s = v01_kv_create(p, &old.cfg, &err);
	CHECK(s != NULL);
	/* Read back into a 0.1-sized struct: nothing past it is written. */
	CHECK_EQ(sb_kv_get_config_sz(s, &old.cfg, KV_CONFIG_0_1), 0);
	CHECK_EQ(old.cfg.n_layers, 2);
	CHECK_EQ(old.cfg.flags, 0xa5a5a5a5u);
	for (size_t i = sizeof(struct sb_kv_config); i < sizeof(old); i++)
		CHECK_EQ(old.bytes[i], 0xa5);
	sb_kv_destroy(s);
	/* The same bytes at today's size: the garbage is an unknown flag. */
	CHECK(sb_kv_create(p, &old.cfg, &err) == NULL && err == -EINVAL);
	/* Too small for any release. */
	CHECK(sb_kv_create_sz(p, &old.cfg, 8, &err) == NULL && err == -EINVAL);

	/* A newer program's struct: a zero tail is fine, a set field this
	 * library does not know is -E2BIG, and output tails are zeroed. */
	{
		struct {
			struct sb_pool_opts o;
			uint64_t newer[4];
		} n;
		struct sb_pool *q;

		memset(&n, 0, sizeof(n));
		sb_pool_opts_init_sz(&n.o, sizeof(n));
		n.o.page_size = 64 * KiB;
		n.o.numa_node = -1;
		q = sb_pool_create_sz(&n.o, sizeof(n), &err);
		CHECK(q != NULL);
		sb_pool_destroy(q);
		n.newer[2] = 1;
		CHECK(sb_pool_create_sz(&n.o, sizeof(n), &err) == NULL &&
		      err == -E2BIG);
		CHECK(sb_pool_create_sz(&n.o, 4, &err) == NULL &&
		      err == -EINVAL);
	}
	memset(&big, 0xa5, sizeof(big));
	CHECK_EQ(sb_pool_stats_sz(p, &big.st, sizeof(big)), 0);
	CHECK_EQ(big.st.page_size, 64 * KiB);
	for (size_t i = 0; i < sizeof(big.tail); i++)
		CHECK_EQ(big.tail[i], 0);
	CHECK_EQ(v01_pool_stats(p, &big.st), 0);
	CHECK_EQ(sb_pool_stats_sz(p, &big.st, 3), -EINVAL);
	/* opts_init writes no further than the size it is told. */
	{
		union {
			struct sb_pool_opts o;
			unsigned char b[sizeof(struct sb_pool_opts) + 16];
		} u;

		memset(&u, 0x5a, sizeof(u));
		sb_pool_opts_init(&u.o);
		CHECK(u.o.page_size > 0);
		for (size_t i = sizeof(u.o); i < sizeof(u); i++)
			CHECK_EQ(u.b[i], 0x5a);
	}
	(void)o;
	VERIFY(p);
	sb_pool_destroy(p);
	printf("structs: older sizes read and written within, newer ones "
	       "checked\n");
}

/* Names the map lists (every "name;" line inside a node, not local). */
static int map_names(const char *path, char names[][64], int max)
{
	FILE *f = fopen(path, "r");
	char line[256];
	int n = 0;

	if (!f)
		FAIL("%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f) && n < max) {
		char name[64];

		if (sscanf(line, " %63[a-z_0-9];", name) == 1 &&
		    !strncmp(name, "sb_", 3))
			snprintf(names[n++], 64, "%s", name);
	}
	fclose(f);
	return n;
}

static bool declared(const char *src, const char name[64])
{
	static const char *const headers[] = {"sparsebuf.h", "sparsebuf_kv.h"};
	char path[PATH_MAX + 64], line[512], want[96];

	snprintf(want, sizeof(want), "%.63s(", name);
	for (size_t h = 0; h < 2; h++) {
		FILE *f;

		snprintf(path, sizeof(path), "%s/lib/include/%s", src,
			 headers[h]);
		f = fopen(path, "r");
		if (!f)
			FAIL("%s: %s", path, strerror(errno));
		while (fgets(line, sizeof(line), f))
			if (strstr(line, want)) {
				fclose(f);
				return true;
			}
		fclose(f);
	}
	return false;
}

static void symbols(void)
{
	static char names[256][64];
	char self[PATH_MAX], build[PATH_MAX], src[PATH_MAX + 8], cmd[PATH_MAX * 2],
		path[PATH_MAX + 128], line[256];
	ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
	int n, exported = 0;
	FILE *p;

	CHECK(len > 0);
	self[len] = 0;
	snprintf(build, sizeof(build), "%s", dirname(dirname(self)));
	snprintf(src, sizeof(src), "%s/..", build);
	snprintf(path, sizeof(path), "%s/lib/sparsebuf.map", src);
	if (access(path, R_OK))
		SKIP("no source tree beside %s", build);
	n = map_names(path, names, 256);
	CHECK(n > 40);
	for (int i = 0; i < n; i++)
		if (!declared(src, names[i]))
			FAIL("%s is in the map but in no public header",
			     names[i]);
	snprintf(cmd, sizeof(cmd),
		 "nm -D --defined-only '%s/lib/libsparsebuf.so' 2>&1", build);
	p = popen(cmd, "r");
	if (!p)
		SKIP("cannot run nm");
	while (fgets(line, sizeof(line), p)) {
		char type, sym[128];
		bool found = false;

		if (sscanf(line, "%*s %c %127s", &type, sym) != 2 ||
		    (type != 'T' && type != 'W'))
			continue;
		if (strchr(sym, '@'))
			*strchr(sym, '@') = 0;
		for (int i = 0; i < n && !found; i++)
			found = !strcmp(sym, names[i]);
		if (!found)
			FAIL("%s is exported but not in lib/sparsebuf.map", sym);
		exported++;
	}
	pclose(p);
	if (!exported)
		SKIP("nm listed nothing for %s/lib/libsparsebuf.so", build);
	CHECK_EQ(exported, n);
	/* A section 3 page for each (make man, part of every build). */
	for (int i = 0; i < n; i++) {
		struct stat st;

		snprintf(path, sizeof(path), "%s/man/man3/%.63s.3", build,
			 names[i]);
		if (stat(path, &st) || st.st_size < 20)
			FAIL("no man page %s", path);
	}
	printf("symbols: %d exported, each in the map, a header and a man "
	       "page\n", exported);
}

static int main_test(void)
{
	require_uffd();
	CHECK(!strcmp(sb_version(), SPARSEBUF_VERSION_STRING));
	CHECK_EQ(sb_version_number(), SPARSEBUF_VERSION_MAJOR * 10000 +
					      SPARSEBUF_VERSION_MINOR * 100 +
					      SPARSEBUF_VERSION_PATCH);
	structs();
	symbols();
	printf("ok\n");
	return 0;
}
