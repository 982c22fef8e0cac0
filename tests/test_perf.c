/* Fault counts measured with perf agree with the library's counters:
 * runs bench/perf-faults.sh --check (skips when perf or uprobes are not
 * available, as on a fresh CI machine without linux-perf). */
#include "harness.h"

#include <libgen.h>

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	char self[4096], cmd[8192], top[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	int st;

	require_uffd();
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	SKIP("perf counts are checked in the plain build");
#endif
	CHECK(n > 0);
	self[n] = 0;
	/* build/tests/test_perf -> build */
	snprintf(top, sizeof(top), "%s", dirname(dirname(self)));
	if (system("command -v perf >/dev/null 2>&1") != 0)
		SKIP("perf is not installed (apt-get install linux-perf)");
	snprintf(cmd, sizeof(cmd), "bench/perf-faults.sh --check %s", top);
	st = system(cmd);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
		SKIP("perf cannot attach uprobes here");
	CHECK(WIFEXITED(st));
	CHECK_EQ(WEXITSTATUS(st), 0);
	return 0;
}
