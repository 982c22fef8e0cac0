/* SPDX-License-Identifier: MIT */
/*
 * What this kernel allows, probed once per process: how a userfaultfd can be
 * opened (syscall, user-mode-only, /dev/userfaultfd), its feature bits and
 * range ioctls, write-protect on shmem, poison, io_uring, NUMA nodes, the
 * mapping limit, and what the first access to a newly mapped page costs.
 * Pools open their userfaultfds through sbi_uffd_open so that they use
 * the same route the probe found.
 */
#include "internal.h"
#include "uffd_compat.h"

#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif

/*
 * The probe fills `features` under probe_lock. An answer for good is
 * copied once into `published` and never written again. A probe that
 * failed for want of a resource (EMFILE, ENFILE, ENOMEM: the process, not
 * the kernel, was short) is not the answer for good: its result goes to
 * the calling thread's own copy, and the next call probes again, so that a
 * program whose first pool failed at its descriptor limit gets pools once
 * descriptors are back. No reader ever sees a struct being written.
 */
static struct sb_features features;	/* the probe's scratch */
static struct sb_features published;	/* the answer, once final */
static __thread struct sb_features transient_copy;
static bool transient;			/* the probe met a shortage */
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool final_flag;		/* published holds the answer */

static void note_error(int e)
{
	if (e == -EMFILE || e == -ENFILE || e == -ENOMEM || e == -EAGAIN)
		transient = true;
}

static int uffd_raw(enum sb_uffd_mode mode)
{
	int fd, dev, flags = O_CLOEXEC | O_NONBLOCK;

	switch (mode) {
	case SB_UFFD_SYSCALL:
		fd = (int)syscall(SYS_userfaultfd, flags);
		return fd < 0 ? -errno : fd;
	case SB_UFFD_USER_ONLY:
		fd = (int)syscall(SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY);
		return fd < 0 ? -errno : fd;
	case SB_UFFD_DEVICE:
		dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
		if (dev < 0)
			return -errno;
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
		fd = fd < 0 ? -errno : fd;
		close(dev);
		return fd;
	default:
		return -ENOSYS;
	}
}

int sbi_uffd_open(uint64_t want)
{
	const struct sb_features *f = sbi_features();
	struct uffdio_api api = {.api = UFFD_API};
	int fd;

	if (f->uffd_mode == SB_UFFD_NONE)
		return f->uffd_error ? f->uffd_error : -ENOSYS;
	fd = uffd_raw(f->uffd_mode);
	if (fd < 0)
		return fd;
	api.features = want & f->uffd_features;
	if (ioctl(fd, UFFDIO_API, &api) < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}

/* Register a scratch mapping to learn the range ioctls and whether shmem
 * can be write-protected (needed for copy-on-write). */
static void probe_ioctls(void)
{
	struct uffdio_api api = {.api = UFFD_API};
	struct uffdio_register reg;
	size_t len = 4096;
	void *p;
	int fd, mfd;

	fd = uffd_raw(features.uffd_mode);
	if (fd < 0) {
		note_error(fd);
		return;
	}
	api.features = features.uffd_features &
		       (UFFD_FEATURE_WP_HUGETLBFS_SHMEM |
			UFFD_FEATURE_PAGEFAULT_FLAG_WP);
	if (ioctl(fd, UFFDIO_API, &api) < 0)
		goto out;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED) {
		reg = (struct uffdio_register){
			.range = {.start = (uintptr_t)p, .len = len},
			.mode = UFFDIO_REGISTER_MODE_MISSING |
				UFFDIO_REGISTER_MODE_WP};
		if (ioctl(fd, UFFDIO_REGISTER, &reg) < 0) {
			reg.mode = UFFDIO_REGISTER_MODE_MISSING;
			reg.ioctls = 0;
			if (ioctl(fd, UFFDIO_REGISTER, &reg) < 0)
				reg.ioctls = 0;
		}
		features.uffd_ioctls = reg.ioctls;
		munmap(p, len);
	}
	mfd = memfd_create("sparsebuf-probe", MFD_CLOEXEC);
	if (mfd < 0)
		note_error(-errno);
	if (mfd >= 0 && ftruncate(mfd, (off_t)len) == 0) {
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
		if (p != MAP_FAILED) {
			reg = (struct uffdio_register){
				.range = {.start = (uintptr_t)p, .len = len},
				.mode = UFFDIO_REGISTER_MODE_WP};
			features.wp_shmem =
				ioctl(fd, UFFDIO_REGISTER, &reg) == 0 &&
				(reg.ioctls &
				 (1ull << _UFFDIO_WRITEPROTECT));
			munmap(p, len);
		}
	}
	if (mfd >= 0)
		close(mfd);
out:
	close(fd);
}

static void probe_uffd(void)
{
	static const enum sb_uffd_mode order[] = {
		SB_UFFD_SYSCALL, SB_UFFD_USER_ONLY, SB_UFFD_DEVICE};
	struct uffdio_api api = {.api = UFFD_API};
	int fd = -ENOSYS;

	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		fd = uffd_raw(order[i]);
		if (fd >= 0) {
			features.uffd_mode = order[i];
			break;
		}
		/* Keep the most telling error: EPERM beats ENOENT. */
		if (features.uffd_error != -EPERM)
			features.uffd_error = fd;
		note_error(fd);
	}
	if (fd < 0)
		return;
	if (ioctl(fd, UFFDIO_API, &api) < 0) {
		features.uffd_error = -errno;
		features.uffd_mode = SB_UFFD_NONE;
		close(fd);
		return;
	}
	close(fd);
	features.uffd_error = 0;
	features.uffd_features = api.features;
	features.poison = !!(api.features & UFFD_FEATURE_POISON);
	probe_ioctls();
}

static void probe_io_uring(void)
{
	/*
	 * Asks for a ring of no entries: the kernel checks whether io_uring
	 * is allowed (sysctl io_uring_disabled, seccomp) before it refuses
	 * the size with EINVAL. A real ring would cost more than its setup:
	 * its teardown runs later in a kernel worker, which sends this thread
	 * task work that ends whatever interruptible wait it is in then,
	 * a wait on a userfault included. struct io_uring_params is 120
	 * bytes.
	 */
	unsigned char params[120] = {0};
	long r = syscall(__NR_io_uring_setup, 0, params);
	int e = r < 0 ? errno : 0;

	if (r >= 0)	/* a kernel that accepts no entries: fine too */
		close((int)r);
	if (r < 0 && e != EINVAL) {
		features.io_uring = -e;
		snprintf(features.pager, sizeof(features.pager),
			 "pread/pwrite (io_uring: %s)", strerror(e));
		return;
	}
	features.io_uring = 1;
	/* The engine (io.c) makes the same choice per pool. */
	snprintf(features.pager, sizeof(features.pager), "%s",
		 sbi_env_pager_sync() ? "pread/pwrite (SPARSEBUF_PAGER=sync)"
			 : "io_uring");
}

static long read_long(const char *path)
{
	char buf[64];
	long v = -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n > 0) {
		buf[n] = 0;
		sscanf(buf, "%ld", &v);
	}
	return v;
}

long sbi_map_count(void)
{
	char buf[65536];
	long lines = 0;
	ssize_t n;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		for (ssize_t i = 0; i < n; i++)
			lines += buf[i] == '\n';
	close(fd);
	return lines;
}

static int cmp_ns(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;

	return (x > y) - (x < y);
}

/*
 * The median time of the first write to a 4 KiB page of a memfd the
 * kernel has just mapped (MAP_POPULATE: what a placement does). Tens of
 * nanoseconds on bare metal and most VMs; 6-14 us on a VM whose host
 * shadows the guest's page tables (touch.c). The median of 64 pages, each
 * timed alone: a preemption during the probe moves one sample, not the
 * answer. 0 when the probe cannot run (no memfd, no memory). Not
 * instrumented: a sanitizer's first write to its own shadow of the page
 * would be timed too (3.7 us under TSan).
 */
__attribute__((no_sanitize("address", "thread"))) static long
probe_first_access_ns(void)
{
	enum { N = 64 };
	long t[N];
	char *p;
	int fd = memfd_create("sparsebuf-probe", MFD_CLOEXEC);

	if (fd < 0)
		return 0;
	if (ftruncate(fd, (off_t)N * 4096) < 0) {
		close(fd);
		return 0;
	}
	p = mmap(NULL, (size_t)N * 4096, PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return 0;
	for (int i = 0; i < N; i++) {
		struct timespec a, b;

		clock_gettime(CLOCK_MONOTONIC, &a);
		*(volatile char *)(p + (size_t)i * 4096) = 1;
		clock_gettime(CLOCK_MONOTONIC, &b);
		t[i] = (b.tv_sec - a.tv_sec) * 1000000000L +
		       (b.tv_nsec - a.tv_nsec);
	}
	munmap(p, (size_t)N * 4096);
	qsort(t, N, sizeof(t[0]), cmp_ns);
	return t[N / 2];
}

/*
 * How many 4 KiB pages one read fault maps on a shared memfd mapping: the
 * kernel's fault-around (fault_around_bytes in debugfs, 64 KiB unless an
 * administrator changed it), read back from /proc/self/pagemap's present
 * bits, which every process may read. 0 when the probe cannot run.
 */
__attribute__((no_sanitize("address", "thread"))) static long
probe_fault_around_pages(void)
{
	enum { N = 64 };
	static const char zero[4096];
	uint64_t e[N];
	long n = 0;
	char *p, *res;
	int pm, fd = memfd_create("sparsebuf-probe", MFD_CLOEXEC);

	if (fd < 0)
		return 0;
	/* Written, not fallocated: fault-around maps only pages that are
	 * up to date, as a heap's ready pages are. */
	for (int i = 0; i < N; i++)
		if (pwrite(fd, zero, sizeof(zero), (off_t)i * 4096) !=
		    (ssize_t)sizeof(zero)) {
			close(fd);
			return 0;
		}
	/* At a 256 KiB boundary: fault-around stops at the end of a page
	 * table (2 MiB), and from the last pages before one it maps fewer
	 * (a probe at a random address read 1-14 pages in 11 of 300
	 * processes). */
	res = mmap(NULL, (size_t)2 * N * 4096, PROT_NONE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	p = res == MAP_FAILED
		    ? MAP_FAILED
		    : mmap((char *)(((uintptr_t)res + N * 4096 - 1) &
				    ~((uintptr_t)N * 4096 - 1)),
			   (size_t)N * 4096, PROT_READ, MAP_SHARED | MAP_FIXED,
			   fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		if (res != MAP_FAILED)
			munmap(res, (size_t)2 * N * 4096);
		return 0;
	}
	(void)*(volatile char *)p;
	pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pm >= 0 && pread(pm, e, sizeof(e),
			     (off_t)((uintptr_t)p / 4096 * sizeof(e[0]))) ==
			       (ssize_t)sizeof(e))
		for (int i = 0; i < N; i++)
			n += (long)(e[i] >> 63);
	if (pm >= 0)
		close(pm);
	munmap(res, (size_t)2 * N * 4096);
	return n;
}

static void probe(void)
{
	struct utsname u;

	probe_uffd();
	probe_io_uring();
	features.numa_nodes =
		numa_available() < 0 ? 0 : numa_num_configured_nodes();
	features.max_map_count = read_long("/proc/sys/vm/max_map_count");
	features.first_access_ns = probe_first_access_ns();
	features.fault_around_pages = probe_fault_around_pages();
	if (uname(&u) == 0) {
		size_t n = strnlen(u.release, sizeof(features.kernel) - 1);

		memcpy(features.kernel, u.release, n);
		features.kernel[n] = 0;
	}
}

const struct sb_features *sbi_features(void)
{
	const struct sb_features *f = &published;

	if (atomic_load_explicit(&final_flag, memory_order_acquire))
		return f;
	pthread_mutex_lock(&probe_lock);
	if (!atomic_load_explicit(&final_flag, memory_order_relaxed)) {
		memset(&features, 0, sizeof(features));
		transient = false;
		probe();
		if (transient) {
			transient_copy = features;
			f = &transient_copy;
			sbi_debug("feature probe short of a resource (%s): "
				  "probing again at the next call",
				  strerror(-features.uffd_error));
		} else {
			published = features;
			atomic_store_explicit(&final_flag, true,
					      memory_order_release);
		}
	}
	pthread_mutex_unlock(&probe_lock);
	return f;
}

long sbi_max_map_count(void)
{
	return read_long("/proc/sys/vm/max_map_count");
}

size_t sbi_shmem_folio_bytes(void)
{
	char line[128];
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled",
			"re");
	bool big = false;
	long pmd;

	/* memfds are files of the kernel's internal tmpfs mount: this
	 * top-level setting decides their folios (the per-size knobs are
	 * for anonymous shared memory). With always, within_size and force
	 * a heap page gets a folio of up to the PMD size, as large as the
	 * write or fault and the heap's size allow (Linux 6.14 tmpfs large
	 * folios; before, PMD-sized ones only); advise asks for a mapping. */
	if (!f)
		return 0;
	if (fgets(line, sizeof(line), f))
		big = strstr(line, "[always]") ||
		      strstr(line, "[within_size]") || strstr(line, "[force]");
	fclose(f);
	if (!big)
		return 0;
	pmd = read_long("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
	return pmd > 0 ? (size_t)pmd : (size_t)2 << 20;
}

SB_API int sb_features_get_sz(struct sb_features *f, size_t size)
{
	struct sb_features o;

	if (!f)
		return -EINVAL;
	o = *sbi_features();
	o.map_count = sbi_map_count();
	o.hugetlb_page_size = sbi_hugetlb_page_bytes();
	o.hugetlb_pages_free = sbi_hugetlb_pages_free();
	return sbi_struct_out(f, size, &o, sizeof(o), SBI_SIZE_FEATURES_0_1);
}

SB_API int sb_features_get(struct sb_features *f)
{
	return sb_features_get_sz(f, SBI_SIZE_FEATURES_0_1);
}
