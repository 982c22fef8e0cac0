/* SPDX-License-Identifier: MIT */
/*
 * sparsebufd: one memory budget for every sparsebuf process on the
 * machine (docs/daemon.md).
 *
 *   sparsebufd --socket PATH --max-bytes SIZE [--page-size SIZE]
 *              [--hugetlb] [--max-floor SIZE] [--spill-dir DIR]
 *              [--group NAME] [--foreground] [--verbose]
 *
 * Client pools (SPARSEBUF_DAEMON=PATH, or sb_pool_connect) lease pages
 * from the budget, a chunk at a time; when it is full the daemon asks the
 * idlest clients to give pages back (their unused lease, their ready
 * reserve, then their evictable pages, written to disk) before it refuses
 * anyone. Faults stay in the clients: the daemon never touches their
 * memory. It only counts, and hands out heap files.
 */
#include "dproto.h"
#include "loop.h"
#include "server.h"
#include "cli.h"
#include "file.h"
#include "sparsebuf.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/vfs.h>
#include <syslog.h>
#include <unistd.h>

extern bool sbd_use_syslog;

enum {
	O_SOCKET = 1, O_MAX, O_PAGE, O_HUGETLB, O_FLOOR, O_SPILL, O_GROUP,
	O_FG, O_VERBOSE
};

static const struct sbc_opt opts[] = {
	{O_SOCKET, "--socket", "PATH", "the socket clients connect to "
	 "(SPARSEBUF_DAEMON=PATH); ignored under socket activation"},
	{O_MAX, "--max-bytes", "SIZE", "the machine's budget: every client's "
	 "pages, reserve and unused lease together (K/M/G/T)"},
	{O_PAGE, "--page-size", "SIZE", "the page size announced to clients "
	 "(default 256K, with --hugetlb the huge page size); a client may "
	 "use another: leases are in bytes"},
	{O_HUGETLB, "--hugetlb", NULL, "the prefix cache's pages are huge "
	 "pages (vm.nr_hugepages), for clients whose heaps are "
	 "(SPARSEBUF_HUGETLB=1); others then do not use the cache"},
	{O_FLOOR, "--max-floor", "SIZE", "the most of the budget one user's "
	 "clients may have reserved together (their SPARSEBUF_MIN_BYTES; "
	 "default 0: none)"},
	{O_SPILL, "--spill-dir", "DIR", "where cached prefixes nobody maps go "
	 "when the budget needs room (else they are dropped)"},
	{O_GROUP, "--group", "NAME", "the socket's group (mode 0660): its "
	 "members may connect"},
	{O_FG, "--foreground", NULL, "stay in the foreground, log to stderr "
	 "(else: detach, log to syslog)"},
	{O_VERBOSE, "--verbose", NULL, "log every connection and reclaim"},
	{0, NULL, NULL, NULL},
};

/* The size of the huge pages a hugetlbfs memfd gets (the system's
 * default), or 0 with errno set when none can be made. */
static uint64_t huge_page_bytes(void)
{
	struct statfs sf;
	int fd = sbd_heap_file("sparsebufd-probe", 0, true);
	uint64_t huge = 0;

	if (fd < 0) {
		errno = -fd;
		return 0;
	}
	if (fstatfs(fd, &sf) == 0 && sf.f_bsize > 0)
		huge = (uint64_t)sf.f_bsize;
	close(fd);
	if (!huge)
		errno = EOPNOTSUPP;
	return huge;
}

/* An unlinked file in dir, or -errno: nothing is left behind, whatever
 * way the daemon ends. */
static int spill_file(const char *dir)
{
	char path[4096];
	int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600), first;

	if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR &&
			errno != EINVAL))
		return fd >= 0 ? fd : -errno;
	first = errno;
	/* A file system without O_TMPFILE. */
	if (snprintf(path, sizeof(path), "%s/sparsebufd-XXXXXX", dir) >=
	    (int)sizeof(path))
		return -ENAMETOOLONG;
	fd = mkostemp(path, O_CLOEXEC);
	if (fd < 0)
		/* ENOENT for a directory that exists (procfs, sysfs: no
		 * files can be made there) would mislead: say O_TMPFILE's
		 * answer instead. */
		return errno == ENOENT ? -first : -errno;
	unlink(path);
	return fd;
}

static void on_tick(struct sbd_loop *loop, void *arg)
{
	(void)loop;
	sbd_budget_tick(arg);
}

static void on_signal(struct sbd_loop *loop, int fd, void *arg)
{
	struct signalfd_siginfo si;

	(void)arg;
	if (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
		sbd_log("signal %u: stopping", si.ssi_signo);
	sbd_loop_stop(loop);
}

/* Detach: a child in a new session, stdio on /dev/null. */
static int detach(void)
{
	pid_t pid = fork();
	int fd;

	if (pid < 0)
		return -errno;
	if (pid > 0)
		_exit(0);
	if (setsid() < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0)
		_exit(0);
	if (chdir("/") < 0)
		return -errno;
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		dup2(fd, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		if (fd > 2)
			close(fd);
	}
	openlog("sparsebufd", LOG_PID, LOG_DAEMON);
	sbd_use_syslog = true;
	return 0;
}

int main(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "sparsebufd",
		.usage = "--socket PATH --max-bytes SIZE [OPTION]...",
		.about = "One memory budget for every sparsebuf process on the "
			 "machine: client pools lease pages from it, and pages "
			 "of idle processes go back to busy ones.",
		.opts = opts,
	};
	struct sbd_server s = {.page_size = 256 << 10, .group = (gid_t)-1};
	bool fg = false;
	const char *floor_arg = NULL, *page_arg = NULL;
	const char *val;
	struct rlimit rl;
	sigset_t mask;
	int id, sfd, r;

	sbc_init(&cli, argc, argv);
	while ((id = sbc_next(&cli, &val)) != SBC_END) {
		switch (id) {
		case O_SOCKET:
			s.socket_path = val;
			break;
		case O_MAX:
			s.max_bytes = sbc_size(&cli, val, 1 << 20,
					       (uint64_t)1 << 46);
			break;
		case O_PAGE:
			s.page_size = sbc_size(&cli, val, 4096, 1 << 30);
			if (s.page_size & (s.page_size - 1))
				sbc_fail(&cli, "--page-size %s: not a power "
					 "of two", val);
			page_arg = val;
			break;
		case O_HUGETLB:
			s.hugetlb = true;
			break;
		case O_FLOOR:
			s.max_floor = sbc_size(&cli, val, 0,
					       (uint64_t)1 << 46);
			floor_arg = val;
			break;
		case O_GROUP: {
			struct group *g = getgrnam(val);

			if (!g)
				sbc_fail(&cli, "--group %s: no such group",
					 val);
			s.group = g->gr_gid;
			break;
		}
		case O_FG:
			fg = true;
			break;
		case O_VERBOSE:
			s.verbose = true;
			break;
		case O_SPILL:
			s.spill_fd = spill_file(val);
			if (s.spill_fd < 0)
				sbc_fail(&cli, "--spill-dir %s: %s", val,
					 strerror(-s.spill_fd));
			s.spill = true;
			break;
		default:
			sbc_fail(&cli, "unexpected argument '%s'", val);
		}
	}
	if (!s.max_bytes)
		sbc_fail(&cli, "--max-bytes is required");
	if (s.hugetlb) {
		uint64_t huge = huge_page_bytes();

		if (!huge)
			sbc_fail(&cli, "--hugetlb: this kernel makes no "
				 "hugetlbfs memfd (MFD_HUGETLB): %s",
				 strerror(errno));
		if (!page_arg)
			s.page_size = huge;
		if (s.page_size % huge)
			sbc_fail(&cli, "--page-size %s: not a multiple of the "
				 "huge page size (%llu KiB), as --hugetlb needs",
				 page_arg, (unsigned long long)(huge >> 10));
	}
	s.max_bytes &= ~(uint64_t)4095;
	s.max_floor &= ~(uint64_t)4095;
	if (s.max_floor > s.max_bytes)
		sbc_fail(&cli, "--max-floor %s is above --max-bytes",
			 floor_arg);
	if (!s.socket_path && !getenv("LISTEN_FDS"))
		sbc_fail(&cli, "--socket is required");
	if (!s.socket_path)
		s.socket_path = "(socket activation)";
	/* Every client's heap crosses our descriptor table once. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	signal(SIGPIPE, SIG_IGN);
	s.loop = sbd_loop_new();
	if (!s.loop) {
		sbd_log("cannot create the event loop: %s", strerror(errno));
		return 1;
	}
	r = sbd_server_listen(&s);
	if (r < 0) {
		sbd_log("%s: %s%s", s.socket_path, strerror(-r),
			r == -EADDRINUSE ? " (a daemon is running there)"
			: r == -EEXIST	 ? " (exists and is not a socket)"
					 : "");
		return 1;
	}
	if (!fg && (r = detach()) < 0) {
		sbd_log("cannot detach: %s", strerror(-r));
		return 1;
	}
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0 || sbd_loop_add(s.loop, sfd, on_signal, NULL) < 0) {
		sbd_log("signalfd: %s", strerror(errno));
		return 1;
	}
	sbd_loop_every(s.loop, 50, on_tick, &s);
	sbd_log("listening on %s: budget %llu MiB, %llu KiB pages%s (pid %d)",
		s.socket_path, (unsigned long long)(s.max_bytes >> 20),
		(unsigned long long)(s.page_size >> 10),
		s.hugetlb ? " (the cache's: huge pages)" : "", (int)getpid());
	if (s.hugetlb && sbc_meminfo("HugePages_Free") == 0)
		sbd_log("warning: --hugetlb, and no huge page is free "
			"(vm.nr_hugepages): the cache refuses every prompt "
			"until some are");
	r = sbd_loop_run(s.loop);
	sbd_server_close(&s);
	sbd_loop_free(s.loop);
	close(sfd);
	return r < 0 ? 1 : 0;
}
