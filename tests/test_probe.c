/* The feature probe and sparsebuf-info. With userfaultfd hidden by a
 * seccomp filter (as containers do), sb_pool_create fails with a clear
 * error and sparsebuf-info says why; with only the syscall hidden, the
 * library falls back to /dev/userfaultfd. */
#include "harness.h"

#include <fcntl.h>
#include <libgen.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)

static char info_path[4096];

/* Make userfaultfd(2) fail with EPERM, and also the /dev/userfaultfd
 * ioctl when block_dev is set. */
static int hide_uffd(int block_dev)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
			 offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_userfaultfd, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
			 offsetof(struct seccomp_data, args[1])),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K,
			 block_dev ? USERFAULTFD_IOC_NEW : 0xffffffff, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {sizeof(f) / sizeof(f[0]), f};

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return -1;
	return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* build/bin/sparsebuf-info beside build/tests/this-test. */
static void find_info(void)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	CHECK(n > 0);
	self[n] = 0;
	snprintf(info_path, sizeof(info_path), "%s/../bin/sparsebuf-info",
		 dirname(self));
}

static int child(const char *name)
{
	struct sb_features f;
	int err = 0;

	find_info();
	if (!strcmp(name, "none")) {
		struct sb_pool_opts o;

		if (hide_uffd(1) < 0)
			return 3;
		sb_features_get(&f);
		if (f.uffd_mode != SB_UFFD_NONE || f.uffd_error != -EPERM)
			return 10;
		sb_pool_opts_init(&o);
		if (sb_pool_create(&o, &err) != NULL || err != -EPERM)
			return 11;
		if (sb_default_pool() != NULL ||
		    sb_default_pool_error() != -EPERM)
			return 12;
		/* sparsebuf-info under the same filter (it is inherited). */
		execl(info_path, info_path, (char *)NULL);
		return 13;
	}
	if (!strcmp(name, "device")) {
		struct sb_pool *p;
		struct sb_buf *b;

		if (hide_uffd(0) < 0)
			return 3;
		sb_features_get(&f);
		if (f.uffd_mode != SB_UFFD_DEVICE)
			return 20;
		p = sb_default_pool();
		if (!p)
			return 21;
		b = sb_buf_create(p, 64 * MiB, 0, NULL);
		if (!b)
			return 22;
		((volatile char *)sb_buf_addr(b))[5 * MiB] = 1;	/* fault */
		sb_buf_destroy(b);
		return 0;
	}
	return 2;
}

static int main_test(void)
{
	struct sb_features f;
	char out[8192];
	int st;

	CHECK_EQ(sb_features_get(&f), 0);
	printf("kernel %s, uffd mode %d, features %#llx, ioctls %#llx\n",
	       f.kernel, f.uffd_mode, (unsigned long long)f.uffd_features,
	       (unsigned long long)f.uffd_ioctls);
	CHECK(f.max_map_count > 0);
	CHECK(f.map_count > 0);
	CHECK(f.kernel[0] != 0);
	CHECK(f.io_uring == 1 || f.io_uring < 0);
	CHECK(f.numa_nodes >= 0);
	if (f.uffd_mode == SB_UFFD_NONE)
		SKIP("userfaultfd unavailable: %s", strerror(-f.uffd_error));
	CHECK(f.uffd_error == 0);
	CHECK(f.uffd_features & (1 << 7));	/* SIGBUS, since 4.14 */
	CHECK(f.uffd_ioctls & (1ull << 2));	/* WAKE */

	find_info();
	if (access(info_path, X_OK) != 0)
		FAIL("%s not built", info_path);
	{
		FILE *p = popen(info_path, "r");
		size_t got;

		CHECK(p != NULL);
		got = fread(out, 1, sizeof(out) - 1, p);
		out[got] = 0;
		CHECK_EQ(pclose(p), 0);
		printf("%s", out);
		CHECK(strstr(out, "userfaultfd:"));
		CHECK(strstr(out, "io_uring:"));
		CHECK(strstr(out, "vm.max_map_count="));
		CHECK(strstr(out, "default pool:     ready"));
	}

	if (geteuid() != 0) {
		printf("not root: the seccomp fallback cases need "
		       "/dev/userfaultfd access; skipped\n");
		return 0;
	}
	/* No userfaultfd at all: clear errors, and the tool says why. */
	{
		char *env[] = {NULL};

		st = run_child_env("none", env, 30, out, sizeof(out));
	}
	printf("--- sparsebuf-info with userfaultfd hidden ---\n%s", out);
	CHECK(WIFEXITED(st));
	CHECK_EQ(WEXITSTATUS(st), 1);	/* sparsebuf-info: no pool */
	CHECK(strstr(out, "unavailable"));
	CHECK(strstr(out, "Operation not permitted"));
	CHECK(strstr(out, "seccomp"));
	/* Only the syscall hidden: /dev/userfaultfd still works. */
	st = run_child("device");
	CHECK_EQ(child_exit_code(st), 0);
	printf("probe: ok\n");
	return 0;
}
