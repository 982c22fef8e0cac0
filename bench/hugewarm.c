/* SPDX-License-Identifier: MIT */
/*
 * bench/hugewarm: take every free huge page of the default size once, and
 * give it back, timing both rounds.
 *
 * Huge pages reserved with vm.nr_hugepages are the guest's, but a VM's host
 * may not back them until they are first written: on the AMD EPYC hosts of
 * this kind (balloon with free page reporting) the first use of a huge
 * page took 1.6-4.8 ms, every later one 0.1 ms (the kernel's zeroing). A
 * reserved huge page stays out of the buddy allocator, so the balloon
 * never reports it free and it stays backed. bench/hugetlb.sh runs this
 * once after reserving pages, so that the benchmarks that follow measure
 * placement, not the host's first backing; an administrator can do the
 * same at boot (docs/api.md, "Huge-page heaps"). Nothing is kept: the
 * pages are free again when it exits.
 *
 *   hugewarm
 *   hugewarm --help | --version
 */
#include "bench.h"
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

static long meminfo(const char *name)
{
	char line[128];
	size_t n = strlen(name);
	long v = -1;
	FILE *f = fopen("/proc/meminfo", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, name, n) && line[n] == ':')
			v = strtol(line + n + 1, NULL, 10);
	if (f)
		fclose(f);
	return v;
}

/* Allocate (and so zero) n huge pages of size bytes in a file of our own;
 * returns how many were had, *sec the time it took. */
static long take(long n, size_t size, double *sec)
{
	int fd = memfd_create("sparsebuf-hugewarm", MFD_HUGETLB | MFD_CLOEXEC);
	double t0 = bench_now_us();
	long got = 0;

	if (fd < 0 || ftruncate(fd, (off_t)n * (off_t)size) < 0) {
		fprintf(stderr, "hugewarm: a huge-page memfd: %s\n",
			strerror(errno));
		exit(1);
	}
	while (got < n && fallocate(fd, FALLOC_FL_KEEP_SIZE,
				    (off_t)got * (off_t)size,
				    (off_t)size) == 0)
		got++;
	*sec = (bench_now_us() - t0) / 1e6;
	close(fd);
	return got;
}

int main(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "hugewarm",
		.usage = "",
		.about = "Take every free huge page once and give it back (the "
			 "first use of a reserved\nhuge page is the host's "
			 "first backing of it on some VMs), timing two rounds.",
		.opts = (const struct sbc_opt[]){{0}},
	};
	const char *v;
	long kb, n, got[2];
	double sec[2];

	sbc_init(&cli, argc, argv);
	while (sbc_next(&cli, &v) != SBC_END)
		sbc_fail(&cli, "unexpected argument '%s'", v);
	kb = meminfo("Hugepagesize");
	n = meminfo("HugePages_Free");
	if (kb <= 0 || n <= 0) {
		printf("hugewarm: no free huge pages (vm.nr_hugepages): "
		       "nothing to do\n");
		return 0;
	}
	for (int r = 0; r < 2; r++)
		got[r] = take(n, (size_t)kb << 10, &sec[r]);
	printf("hugewarm: %ld huge pages of %ld KiB: first use %.2f ms a "
	       "page, then %.2f ms\n", got[0], kb,
	       got[0] ? sec[0] * 1e3 / (double)got[0] : 0.0,
	       got[1] ? sec[1] * 1e3 / (double)got[1] : 0.0);
	return 0;
}
