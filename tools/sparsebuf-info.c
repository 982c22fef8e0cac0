/* SPDX-License-Identifier: MIT */
/*
 * sparsebuf-info: what this kernel allows and what sparsebuf would do with
 * it, at a glance. Exit status 0 when pools can be created, 1 otherwise;
 * it takes no options but --help and --version (anything else: status 2).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "sparsebuf.h"

/* Feature bits of UFFDIO_API, by name (kernel 6.18 knows all of these). */
static const struct {
	int bit;
	const char *name;
} uffd_bits[] = {
	{0, "PAGEFAULT_FLAG_WP"}, {1, "EVENT_FORK"},
	{2, "EVENT_REMAP"},	  {3, "EVENT_REMOVE"},
	{4, "MISSING_HUGETLBFS"}, {5, "MISSING_SHMEM"},
	{6, "EVENT_UNMAP"},	  {7, "SIGBUS"},
	{8, "THREAD_ID"},	  {9, "MINOR_HUGETLBFS"},
	{10, "MINOR_SHMEM"},	  {11, "EXACT_ADDRESS"},
	{12, "WP_HUGETLBFS_SHMEM"}, {13, "WP_UNPOPULATED"},
	{14, "POISON"},		  {15, "WP_ASYNC"},
	{16, "MOVE"},
};

static const struct {
	int bit;
	const char *name;
} ioctl_bits[] = {
	{0, "REGISTER"}, {1, "UNREGISTER"}, {2, "WAKE"},     {3, "COPY"},
	{4, "ZEROPAGE"}, {5, "MOVE"},	    {6, "WRITEPROTECT"},
	{7, "CONTINUE"}, {8, "POISON"},	    {63, "API"},
};

static const char *mode_name(enum sb_uffd_mode m)
{
	switch (m) {
	case SB_UFFD_SYSCALL:
		return "userfaultfd(2), kernel-mode faults trapped too";
	case SB_UFFD_USER_ONLY:
		return "userfaultfd(UFFD_USER_MODE_ONLY): faults from system "
		       "calls (read(2) into an unplaced page) are not trapped";
	case SB_UFFD_DEVICE:
		return "/dev/userfaultfd";
	default:
		return "unavailable";
	}
}

static void why_unavailable(int err)
{
	printf("  why:            %s\n", strerror(-err));
	if (err == -EPERM) {
		printf("  fix:            vm.unprivileged_userfaultfd is 0 and "
		       "this process lacks CAP_SYS_PTRACE, and cannot open "
		       "/dev/userfaultfd; either\n"
		       "                  sysctl vm.unprivileged_userfaultfd=1,"
		       " or give this user read/write access to "
		       "/dev/userfaultfd,\n"
		       "                  or check for a seccomp filter "
		       "(containers often block userfaultfd)\n");
	} else if (err == -ENOSYS) {
		printf("  fix:            the kernel was built without "
		       "CONFIG_USERFAULTFD, or a seccomp filter hides it\n");
	}
}

static void print_size(const char *label, size_t v)
{
	if (v == 0)
		printf("%s unlimited\n", label);
	else if (v % (1u << 30) == 0)
		printf("%s %zu GiB\n", label, v >> 30);
	else if (v % (1u << 20) == 0)
		printf("%s %zu MiB\n", label, v >> 20);
	else if (v % (1u << 10) == 0)
		printf("%s %zu KiB\n", label, v >> 10);
	else
		printf("%s %zu bytes\n", label, v);
}

/* The bracketed word of a THP knob ("always [never] ..."), or "". */
static void thp_mode(const char *path, char *out, size_t len)
{
	char b[256] = "", *l, *r;
	FILE *f = fopen(path, "r");

	out[0] = 0;
	if (!f)
		return;
	if (fgets(b, sizeof(b), f) && (l = strchr(b, '[')) &&
	    (r = strchr(l, ']'))) {
		*r = 0;
		snprintf(out, len, "%s", l + 1);
	}
	fclose(f);
}

/*
 * Which folios the heaps get. The heaps are memfds: files of the kernel's
 * internal tmpfs mount, which follows the top-level shmem_enabled (2 MiB
 * folios); the per-size knobs (hugepages-*kB/shmem_enabled) are for
 * anonymous shared memory only. sparsebuf allocates heap pages by writing
 * through the heap file (lib/heap.c), so "always" and "within_size" give
 * it huge folios and "advise" does not (it needs a mapping with
 * MADV_HUGEPAGE). sparsebuf never changes the setting (bench/folios.sh
 * does, for its runs, and restores it; docs/design.md, "Heap folios").
 * Measured (docs/PERFORMANCE.md, disk tier): sequential page-in of 2 MiB
 * pages at 1.6-3.7 GB/s and 0.4-1.2 s of CPU per 2 GiB with within_size or
 * always, against 0.7-1.2 GB/s and 2.3-3.7 s without.
 */
static void shmem_folios(size_t page_size)
{
	char top[32], hp[32] = "";
	FILE *f;
	unsigned long kib = 0;
	const char *k = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

	thp_mode(k, top, sizeof(top));
	f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r");
	if (f) {
		unsigned long b;

		if (fscanf(f, "%lu", &b) == 1)
			kib = b >> 10;
		fclose(f);
	}
	if (!top[0] || !kib) {
		printf("  heap folios:    4 KiB (no transparent huge pages)\n");
		return;
	}
	snprintf(hp, sizeof(hp), "%lu KiB", kib);
	if (!strcmp(top, "always") || !strcmp(top, "within_size") ||
	    !strcmp(top, "force")) {
		printf("  heap folios:    %s (shmem_enabled=%s)\n", hp, top);
		if (page_size < (size_t)kib << 10)
			printf("                  pages smaller than that share "
			       "a folio: a released page's memory may stay "
			       "(zeroed) while another part is in use, up to "
			       "%s more than bytes_resident per folio; use "
			       "pages of %s or more\n", hp, hp);
	} else {
		printf("  heap folios:    4 KiB (shmem_enabled=%s; always or "
		       "within_size would give %s folios to pages of that "
		       "size or more; sparsebuf never sets it)\n", top, hp);
	}
}

int main(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "sparsebuf-info",
		.usage = "",
		.about = "What this kernel allows (userfaultfd route and "
			 "features, copy-on-write, poison,\nio_uring, NUMA, "
			 "the mapping limit) and the configuration SPARSEBUF_* "
			 "gives.\nExit status 0 when pools can be created, 1 "
			 "otherwise.",
	};
	struct sb_features f;
	struct sb_pool_opts o;
	int err, ok;

	sbc_no_args(&cli, argc, argv);
	sb_features_get(&f);
	printf("sparsebuf %d.%d.%d on Linux %s\n\n", SPARSEBUF_VERSION_MAJOR,
	       SPARSEBUF_VERSION_MINOR, SPARSEBUF_VERSION_PATCH, f.kernel);

	printf("userfaultfd:      %s\n", mode_name(f.uffd_mode));
	if (f.uffd_mode == SB_UFFD_NONE) {
		why_unavailable(f.uffd_error);
	} else {
		printf("  features:      ");
		for (size_t i = 0; i < sizeof(uffd_bits) / sizeof(uffd_bits[0]);
		     i++)
			if (f.uffd_features & (1ull << uffd_bits[i].bit))
				printf(" %s", uffd_bits[i].name);
		printf("\n  range ioctls:   (anonymous range, MISSING|WP)\n"
		       "                ");
		for (size_t i = 0;
		     i < sizeof(ioctl_bits) / sizeof(ioctl_bits[0]); i++)
			if (f.uffd_ioctls & (1ull << ioctl_bits[i].bit))
				printf(" %s", ioctl_bits[i].name);
		printf("\n  copy-on-write:  %s\n",
		       f.wp_shmem ? "yes (write-protect on shmem)"
				  : "no: sb_buf_share returns EOPNOTSUPP");
		printf("  SIGBUS on a failed fault: %s\n",
		       f.poison ? "UFFDIO_POISON"
				: "re-registration with a SIGBUS userfaultfd "
				  "(no UFFDIO_POISON before 6.6)");
		printf("  evicted pages:  %s\n",
		       !(f.uffd_features & (1ull << 10))	/* MINOR_SHMEM */
			       ? "punched (no minor faults on shmem before 5.14)"
		       : getenv("SPARSEBUF_RECYCLE") &&
				       !strcmp(getenv("SPARSEBUF_RECYCLE"), "0")
			       ? "punched (SPARSEBUF_RECYCLE=0)"
			       : "recycled for the next page-in (minor faults "
				 "on shmem)");
		printf("  file buffers:   %s\n",
		       !(f.uffd_features & (1ull << 10))	/* MINOR_SHMEM */
			       ? "pages mapped one by one (no minor faults on "
				 "shmem before 5.14)"
		       : getenv("SPARSEBUF_HOME") &&
				       !strcmp(getenv("SPARSEBUF_HOME"), "0")
			       ? "pages mapped one by one (SPARSEBUF_HOME=0)"
			       : "home mappings: pages read in and released in "
				 "place (pool pages of 64 KiB or less), "
				 "through up to 4 MiB of read buffers; mapped "
				 "by the kernel's own faults and released a "
				 "batch per TLB flush where the heap folios "
				 "are 4 KiB (below), else by UFFDIO_CONTINUE");
	}
	if (f.io_uring == 1)
		printf("io_uring:         available\n");
	else
		printf("io_uring:         unavailable (%s)\n",
		       strerror(-f.io_uring));
	printf("disk tier I/O:    %s\n", f.pager);
	if (f.numa_nodes > 0)
		printf("NUMA nodes:       %d\n", f.numa_nodes);
	else
		printf("NUMA nodes:       libnuma reports no NUMA support\n");
	printf("mappings:         %ld of vm.max_map_count=%ld\n", f.map_count,
	       f.max_map_count);
	if (f.hugetlb_page_size)
		printf("huge pages:       %zu KiB, %ld free (vm.nr_hugepages); "
		       "heaps use them with SPARSEBUF_HUGETLB=1\n",
		       f.hugetlb_page_size >> 10, f.hugetlb_pages_free);
	else
		printf("huge pages:       none in this kernel\n");
	{
		const char *t = getenv("SPARSEBUF_TOUCH");
		bool on = t && *t && strcmp(t, "auto") ? strcmp(t, "0") != 0
						       : f.first_access_ns > 1000;

		printf("first access:     %ld ns per 4 KiB newly mapped (median "
		       "of 64)%s\n", f.first_access_ns,
		       f.first_access_ns > 1000 ? ": the host shadows page "
						  "tables" : "");
		printf("  placed pages:   %s\n",
		       on ? "first access taken by the ready thread"
			  : "first access left to their owner");
		printf("fault-around:     %ld pages of 4 KiB mapped by one read "
		       "fault\n", f.fault_around_pages);
		printf("  placed pages:   page tables filled %s\n",
		       !on && f.fault_around_pages >= 16
			       ? "by read faults (sb_stats.map_faults)"
			       : "by MAP_POPULATE");
	}

	printf("\nconfiguration (defaults, then SPARSEBUF_*):\n");
	sb_pool_opts_init(&o);
	err = sb_default_pool_error();
	if (o.page_size)
		print_size("  page size:     ", o.page_size);
	else
		printf("  page size:      invalid (see the message above)\n");
	if (o.page_size && (o.flags & SB_POOL_HUGETLB))
		printf("  heaps:          huge pages of %zu KiB "
		       "(SPARSEBUF_HUGETLB=1): %ld free now%s\n",
		       f.hugetlb_page_size >> 10, f.hugetlb_pages_free,
		       f.hugetlb_pages_free ? ""
					    : ": every placement will fail "
					      "with ENOMEM until some are "
					      "reserved (vm.nr_hugepages)");
	else if (o.page_size)
		shmem_folios(o.page_size);
	print_size("  heap size:     ", o.heap_size);
	print_size("  budget:        ", o.max_bytes);
	if (o.numa_node < 0)
		printf("  NUMA node:      none\n");
	else
		printf("  NUMA node:      %d\n", o.numa_node);
	printf("  spill dir:      %s\n",
	       o.spill_dir ? o.spill_dir
	       : getenv("SPARSEBUF_SPILL_DIR") ? getenv("SPARSEBUF_SPILL_DIR")
	       : getenv("TMPDIR")		? getenv("TMPDIR")
						: "/tmp");
	if (getenv("SPARSEBUF_DAEMON") && *getenv("SPARSEBUF_DAEMON")) {
		const char *fb = getenv("SPARSEBUF_DAEMON_FALLBACK");

		printf("  daemon:         %s (SPARSEBUF_DAEMON; without it: "
		       "%s)\n", getenv("SPARSEBUF_DAEMON"),
		       fb && !strcmp(fb, "fail") ? "fail" : "a local pool");
	} else {
		printf("  daemon:         none (a local pool)\n");
	}
	ok = err == 0;
	printf("default pool:     %s%s\n", ok ? "ready" : "unavailable: ",
	       ok ? "" : strerror(-err));
	return ok ? 0 : 1;
}
