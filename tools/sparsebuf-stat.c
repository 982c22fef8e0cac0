/* SPDX-License-Identifier: MIT */
/*
 * sparsebuf-stat: watch a running program's sparsebuf pools, as vmstat
 * watches the machine.
 *
 *   sparsebuf-stat PID [INTERVAL [COUNT]]
 *
 * Every pool publishes a snapshot of its counters, refreshed every 100 ms
 * by its own background thread, in a one-page memfd (lib/stat.c); this
 * finds them through /proc/PID/fd (root, or the same user with ptrace
 * access) and prints, every INTERVAL seconds (default 1; COUNT lines, or
 * until the process ends or Ctrl-C), one line per pool: pages in use,
 * ready and resident memory, the budget, pages on disk, and per second
 * over the interval: faults, pages placed by sb_buf_map and by faults,
 * copy-on-write copies, pages read in and written out, and MB read and
 * written.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "stat_page.h"

#define MAX_POOLS 64

struct pool_view {
	const struct sbi_stat_page *page;
	struct sb_stats last;
	uint64_t last_ns;
	bool seen;
};

static volatile sig_atomic_t stop;

static void on_int(int sig)
{
	(void)sig;
	stop = 1;
}

/* The pools of process pid: its "sparsebuf-stats" memfds written by pid
 * itself (a fork()ed child inherits its parent's). */
static int find_pools(int pid, struct pool_view *v, int max)
{
	char dir[64], link[64 + 256 + 2], target[256];
	long ps = sysconf(_SC_PAGESIZE);
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
	d = opendir(dir);
	if (!d)
		return -errno;
	while ((e = readdir(d)) && n < max) {
		const struct sbi_stat_page *p;
		ssize_t len;
		int fd;

		if (e->d_name[0] == '.')
			continue;
		snprintf(link, sizeof(link), "%s/%s", dir, e->d_name);
		len = readlink(link, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = 0;
		if (!strstr(target, "/memfd:" SBI_STAT_NAME))
			continue;
		fd = open(link, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		p = mmap(NULL, (size_t)ps, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (p == MAP_FAILED)
			continue;
		if (memcmp(p->magic, SBI_STAT_MAGIC, 8) || p->version != 1 ||
		    p->pid != pid) {
			munmap((void *)p, (size_t)ps);
			continue;
		}
		memset(&v[n], 0, sizeof(v[n]));
		v[n++].page = p;
	}
	closedir(d);
	return n;
}

/* A consistent copy of the snapshot. */
static bool snapshot(const struct sbi_stat_page *p, struct sb_stats *st,
		     uint64_t *ns)
{
	for (int tries = 0; tries < 1000; tries++) {
		uint64_t a = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE), b;
		size_t n = p->stats_size < sizeof(*st) ? p->stats_size
						       : sizeof(*st);

		if (a & 1)
			continue;
		memset(st, 0, sizeof(*st));
		/* Acquire loads: none moves after the second count's. */
		for (size_t i = 0; i < n / sizeof(uint64_t); i++)
			((uint64_t *)st)[i] = __atomic_load_n(
				&((const uint64_t *)&p->st)[i], __ATOMIC_ACQUIRE);
		*ns = __atomic_load_n(&p->time_ns, __ATOMIC_ACQUIRE);
		b = __atomic_load_n(&p->seq, __ATOMIC_RELAXED);
		if (a == b)
			return a != 0;	/* 0: never published yet */
	}
	return false;
}

static double mib(size_t b)
{
	return (double)b / 1048576.0;
}

static void header(void)
{
	printf("%4s %9s %8s %9s %8s %8s %9s %8s %8s %6s %8s %8s %8s %8s\n",
	       "pool", "used_MiB", "rdy_MiB", "res_MiB", "budget", "disk_MiB",
	       "faults/s", "maps/s", "fplc/s", "cow/s", "in/s", "out/s",
	       "rd_MB/s", "wr_MB/s");
}

static void line(const struct sbi_stat_page *p, const struct sb_stats *s,
		 const struct sb_stats *o, double dt)
{
	char budget[16];

	if (s->max_bytes)
		snprintf(budget, sizeof(budget), "%.0fM", mib(s->max_bytes));
	else
		snprintf(budget, sizeof(budget), "-");
#define RATE(f) (dt > 0 ? (double)(s->f - o->f) / dt : 0.0)
	printf("%4u %9.1f %8.1f %9.1f %8s %8.1f %9.0f %8.0f %8.0f %6.0f %8.0f "
	       "%8.0f %8.1f %8.1f\n",
	       p->pool_id, mib(s->pages_used * s->page_size),
	       mib(s->pages_ready * s->page_size), mib(s->bytes_resident),
	       budget, mib(s->spill_bytes), RATE(faults), RATE(maps),
	       RATE(fault_places), RATE(cow_copies), RATE(pages_in),
	       RATE(pages_out), RATE(bytes_read) / 1e6,
	       RATE(bytes_written) / 1e6);
#undef RATE
}

static const struct sbc_opt opts[] = {{0}};

int main(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "sparsebuf-stat",
		.usage = "PID [INTERVAL [COUNT]]",
		.about = "Watch the sparsebuf pools of a running process, as "
			 "vmstat does the machine:\none line per pool every "
			 "INTERVAL seconds (default 1), COUNT times (default: "
			 "until it\nends or Ctrl-C); rates per second over the "
			 "interval. Needs access to\n/proc/PID/fd (root, or the "
			 "same user).",
		.opts = opts,
	};
	struct pool_view v[MAX_POOLS];
	const char *val, *args[3] = {NULL};
	double interval = 1;
	long count = -1;
	int nargs = 0, pid, n, opt;

	sbc_init(&cli, argc, argv);
	while ((opt = sbc_next(&cli, &val)) != SBC_END) {
		if (opt != SBC_ARG)
			continue;
		if (nargs == 3)
			sbc_fail(&cli, "unexpected argument '%s'", val);
		args[nargs++] = val;
	}
	if (!nargs)
		sbc_fail(&cli, "no PID given");
	pid = (int)sbc_int(&cli, args[0], 1, 1 << 22);
	if (args[1])
		interval = sbc_double(&cli, args[1], 0.01, 86400);
	if (args[2])
		count = (long)sbc_int(&cli, args[2], 1, 1L << 40);
	n = find_pools(pid, v, MAX_POOLS);
	if (n < 0) {
		fprintf(stderr, "sparsebuf-stat: /proc/%d/fd: %s\n", pid,
			strerror(-n));
		return 1;
	}
	if (n == 0) {
		fprintf(stderr, "sparsebuf-stat: process %d has no sparsebuf "
				"pool (or a library older than 0.2)\n", pid);
		return 1;
	}
	signal(SIGINT, on_int);
	signal(SIGTERM, on_int);
	header();
	/* Pass 0 primes the rates; each later pass prints. */
	for (long k = 0; (count < 0 || k <= count) && !stop; k++) {
		char proc[32];

		if (k) {
			struct timespec ts = {(time_t)interval,
					      (long)((interval -
						      (double)(time_t)interval) *
						     1e9)};

			nanosleep(&ts, NULL);
			if (stop)
				break;
		}
		for (int i = 0; i < n; i++) {
			struct sb_stats s;
			uint64_t ns;

			if (!snapshot(v[i].page, &s, &ns))
				continue;
			if (v[i].seen)
				line(v[i].page, &s, &v[i].last,
				     (double)(ns - v[i].last_ns) / 1e9);
			v[i].last = s;
			v[i].last_ns = ns;
			v[i].seen = true;
		}
		fflush(stdout);
		snprintf(proc, sizeof(proc), "/proc/%d", pid);
		if (access(proc, F_OK) != 0) {
			fprintf(stderr, "sparsebuf-stat: process %d ended\n", pid);
			break;
		}
	}
	return 0;
}
