/* SPDX-License-Identifier: MIT */
/*
 * sparsebufctl: ask sparsebufd how the machine's memory budget is spent.
 *
 *   sparsebufctl -s PATH status [--json]
 *   sparsebufctl -s PATH cache [--json]
 *   sparsebufctl -s PATH wait [--timeout MS]
 *
 * status: the budget, what is leased, resident and on disk, and one line
 * per client process (pid, uid, bytes leased, resident, in use, on disk,
 * idle time, page size and kind); where huge pages are in use, the
 * machine's (a second limit the budget does not count: docs/daemon.md). cache: the machine-wide prefix cache, one line per cached
 * prefix (model id, positions, bytes, pins, last use). A user other than
 * root and the daemon's sees only the processes and prefixes of its own
 * uid. wait: until a daemon answers at PATH (for
 * scripts that start one), exit 1 after the timeout.
 */
#include "cli.h"
#include "file.h"
#include "dproto.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { O_SOCKET = 1, O_JSON, O_TIMEOUT };

static const struct sbc_opt opts[] = {
	{O_SOCKET, "-s", "PATH", "the daemon's socket (default: "
	 "$SPARSEBUF_DAEMON)"},
	{O_SOCKET, "--socket", "PATH", "the same"},
	{O_JSON, "--json", NULL, "status as one JSON object"},
	{O_TIMEOUT, "--timeout", "MS", "wait: give up after MS (default 5000)"},
	{0, NULL, NULL, NULL},
};

static int connect_to(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	return fd;
}

/* Send m, wait for its reply into buf; the reply's size or -errno. */
static long ask(int fd, struct sbd_msg *m, char *buf, size_t cap)
{
	struct pollfd p = {fd, POLLIN, 0};
	struct sbd_msg rep;
	int rfd, r;
	long n;

	m->magic = SBD_MAGIC;
	r = sbd_send(fd, m, NULL, -1);
	if (r < 0)
		return r;
	if (poll(&p, 1, 5000) != 1)
		return -ETIMEDOUT;
	n = sbd_recv(fd, buf, cap, &rfd);
	if (rfd >= 0)
		close(rfd);
	if (n <= 0)
		return n ? n : -ECONNRESET;
	r = sbd_msg_check(buf, (size_t)n, rfd >= 0, true, &rep);
	if (r < 0)
		return r;
	if (rep.type != SBD_REPLY || rep.seq != m->seq)
		return -EPROTO;
	return rep.err < 0 ? rep.err : n;
}

static int hello(const char *path, char *buf, size_t cap)
{
	struct sbd_msg m = {.type = SBD_HELLO, .seq = 1, .a = SBD_VERSION,
			    .d = SBD_HELLO_CONTROL};
	int fd = connect_to(path);
	long n;

	if (fd < 0)
		return fd;
	n = ask(fd, &m, buf, cap);
	if (n < 0) {
		close(fd);
		return (int)n;
	}
	return fd;
}

static double mib(uint64_t b)
{
	return (double)b / (1 << 20);
}

/*
 * The reply's status and client list into *st and ci (at most max), in
 * this build's layout: a daemon before 0.3 sends both structs without
 * their flags (read as 0). false: not a status of either layout.
 */
static bool parse_status(const char *p, size_t len, struct sbd_status *st,
			 struct sbd_client_info *ci, size_t max)
{
	static const size_t sizes[2][2] = {
		{sizeof(struct sbd_status), sizeof(struct sbd_client_info)},
		{SBD_STATUS_V1_SIZE, SBD_CLIENT_INFO_V1_SIZE},
	};

	for (int v = 0; v < 2; v++) {
		size_t ss = sizes[v][0], cs = sizes[v][1];
		uint64_t nc;

		if (len < ss)
			continue;
		memcpy(&nc, p + offsetof(struct sbd_status, nclients),
		       sizeof(nc));
		if (nc > max || len != ss + nc * cs)
			continue;
		memset(st, 0, sizeof(*st));
		memcpy(st, p, ss);
		for (uint64_t i = 0; i < nc; i++) {
			memset(&ci[i], 0, sizeof(ci[i]));
			memcpy(&ci[i], p + ss + i * cs, cs);
		}
		return true;
	}
	return false;
}

static int status(const char *path, bool json)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	static struct sbd_client_info ci[SBD_MAX_PAYLOAD /
					 SBD_CLIENT_INFO_V1_SIZE];
	struct sbd_msg m = {.type = SBD_STATUS, .seq = 2};
	struct sbd_status sts, *st = &sts;
	int fd = hello(path, buf, sizeof(buf));
	bool huge;
	long n;

	if (fd < 0) {
		fprintf(stderr, "sparsebufctl: %s: %s\n", path, strerror(-fd));
		return 1;
	}
	n = ask(fd, &m, buf, sizeof(buf));
	close(fd);
	if (n < 0 || (size_t)n < sizeof(m) + SBD_STATUS_V1_SIZE) {
		fprintf(stderr, "sparsebufctl: %s: status: %s\n", path,
			strerror(n < 0 ? (int)-n : EPROTO));
		return 1;
	}
	if (!parse_status(buf + sizeof(m), (size_t)n - sizeof(m), st, ci,
			  sizeof(ci) / sizeof(ci[0]))) {
		fprintf(stderr, "sparsebufctl: %s: a malformed status\n", path);
		return 1;
	}
	huge = st->flags & SBD_STATUS_HUGETLB;
	for (uint64_t i = 0; i < st->nclients; i++)
		huge |= ci[i].flags & SBD_CLIENT_HUGETLB;
	if (json) {
		printf("{\"max_bytes\": %llu, \"bytes_used\": %llu, "
		       "\"bytes_resident\": %llu, \"bytes_shared\": %llu, "
		       "\"bytes_spilled\": %llu, \"page_size\": %llu, "
		       "\"uptime_ms\": %llu, \"reclaims\": %llu, "
		       "\"refused\": %llu, \"clients_total\": %llu, "
		       "\"cache_blocks\": %llu, \"cache_hits\": %llu, "
		       "\"cache_misses\": %llu, \"floors\": %llu, "
		       "\"max_floor\": %llu, \"cache_hugetlb\": %s, "
		       "\"huge_pages_total\": %ld, \"huge_pages_free\": %ld, "
		       "\"clients\": [",
		       (unsigned long long)st->max_bytes,
		       (unsigned long long)st->bytes_used,
		       (unsigned long long)st->bytes_resident,
		       (unsigned long long)st->bytes_shared,
		       (unsigned long long)st->bytes_spilled,
		       (unsigned long long)st->page_size,
		       (unsigned long long)st->uptime_ms,
		       (unsigned long long)st->reclaims,
		       (unsigned long long)st->refused,
		       (unsigned long long)st->clients_total,
		       (unsigned long long)st->cache_blocks,
		       (unsigned long long)st->cache_hits,
		       (unsigned long long)st->cache_misses,
		       (unsigned long long)st->floors,
		       (unsigned long long)st->max_floor,
		       st->flags & SBD_STATUS_HUGETLB ? "true" : "false",
		       sbc_meminfo("HugePages_Total"),
		       sbc_meminfo("HugePages_Free"));
		for (uint64_t i = 0; i < st->nclients; i++)
			printf("%s{\"pid\": %d, \"uid\": %u, \"id\": %u, "
			       "\"page_size\": %u, \"bytes\": %llu, "
			       "\"resident\": %llu, \"used\": %llu, "
			       "\"spilled\": %llu, \"idle_ms\": %llu, "
			       "\"floor\": %llu, \"hugetlb\": %s}",
			       i ? ", " : "", ci[i].pid, ci[i].uid, ci[i].id,
			       ci[i].page_size,
			       (unsigned long long)ci[i].bytes,
			       (unsigned long long)ci[i].resident,
			       (unsigned long long)ci[i].used,
			       (unsigned long long)ci[i].spilled,
			       (unsigned long long)ci[i].idle_ms,
			       (unsigned long long)ci[i].floor,
			       ci[i].flags & SBD_CLIENT_HUGETLB ? "true"
								: "false");
		printf("]}\n");
		return 0;
	}
	printf("budget %.1f MiB: leased %.1f MiB (%.0f%%), resident %.1f MiB, "
	       "shared %.1f MiB, on disk %.1f MiB\n",
	       mib(st->max_bytes), mib(st->bytes_used),
	       st->max_bytes ? 100.0 * (double)st->bytes_used /
				       (double)st->max_bytes
			     : 0.0,
	       mib(st->bytes_resident), mib(st->bytes_shared),
	       mib(st->bytes_spilled));
	printf("%llu client(s) now, %llu since start; %llu reclaim "
	       "request(s), %llu lease request(s) refused; up %.1f s\n",
	       (unsigned long long)st->nclients,
	       (unsigned long long)st->clients_total,
	       (unsigned long long)st->reclaims,
	       (unsigned long long)st->refused,
	       (double)st->uptime_ms / 1000);
	printf("cache: %llu block(s), %.1f MiB%s; %llu hit(s), %llu "
	       "miss(es)\n",
	       (unsigned long long)st->cache_blocks, mib(st->bytes_shared),
	       st->flags & SBD_STATUS_HUGETLB ? " on huge pages" : "",
	       (unsigned long long)st->cache_hits,
	       (unsigned long long)st->cache_misses);
	if (huge)
		printf("huge pages: %ld free of %ld (the machine's, %ld kB "
		       "each: a limit apart from the budget)\n",
		       sbc_meminfo("HugePages_Free"), sbc_meminfo("HugePages_Total"),
		       sbc_meminfo("Hugepagesize"));
	if (st->max_floor)
		printf("floors: %.1f MiB reserved, at most %.1f MiB a "
		       "client\n",
		       mib(st->floors), mib(st->max_floor));
	if (st->nclients)
		printf("%8s %6s %10s %10s %10s %10s %10s %8s %9s\n", "pid",
		       "uid", "MiB", "floor", "resident", "used", "on disk",
		       "idle s", "pages");
	for (uint64_t i = 0; i < st->nclients; i++)
		printf("%8d %6u %10.1f %10.1f %10.1f %10.1f %10.1f %8.1f "
		       "%6uK %s\n",
		       ci[i].pid, ci[i].uid, mib(ci[i].bytes),
		       mib(ci[i].floor), mib(ci[i].resident), mib(ci[i].used),
		       mib(ci[i].spilled), (double)ci[i].idle_ms / 1000,
		       ci[i].page_size >> 10,
		       ci[i].flags & SBD_CLIENT_HUGETLB ? "huge" : "");
	return 0;
}

/* JSON string: the model ids are printable ASCII (the daemon keeps them
 * so); quotes and backslashes escaped. */
static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			putchar('\\');
		putchar(*s);
	}
	putchar('"');
}

static int cache(const char *path, bool json)
{
	static char buf[sizeof(struct sbd_msg) + SBD_MAX_PAYLOAD];
	struct sbd_msg m = {.type = SBD_CACHE_LIST, .seq = 2}, rep;
	const struct sbd_cache_entry *e;
	int fd = hello(path, buf, sizeof(buf));
	long n;

	if (fd < 0) {
		fprintf(stderr, "sparsebufctl: %s: %s\n", path, strerror(-fd));
		return 1;
	}
	n = ask(fd, &m, buf, sizeof(buf));
	close(fd);
	if (n < 0) {
		fprintf(stderr, "sparsebufctl: %s: cache: %s\n", path,
			strerror((int)-n));
		return 1;
	}
	memcpy(&rep, buf, sizeof(rep));
	e = (const struct sbd_cache_entry *)(buf + sizeof(rep));
	if (rep.len != rep.a * sizeof(*e)) {
		fprintf(stderr, "sparsebufctl: %s: a malformed listing\n",
			path);
		return 1;
	}
	if (json) {
		printf("{\"prefixes\": [");
		for (uint64_t i = 0; i < rep.a; i++) {
			char model[SBD_CACHE_MODEL_MAX];

			memcpy(model, e[i].model, sizeof(model));
			model[sizeof(model) - 1] = 0;
			printf("%s{\"model\": ", i ? ", " : "");
			json_str(model);
			printf(", \"root\": \"%016llx\", \"positions\": %llu, "
			       "\"bytes\": %llu, \"pins\": %u, \"uid\": %u, "
			       "\"idle_ms\": %llu}",
			       (unsigned long long)e[i].root,
			       (unsigned long long)e[i].positions,
			       (unsigned long long)e[i].bytes, e[i].pins,
			       e[i].uid, (unsigned long long)e[i].idle_ms);
		}
		printf("]}\n");
		return 0;
	}
	printf("%llu cached prefix(es)\n", (unsigned long long)rep.a);
	if (rep.a)
		printf("%-24s %10s %10s %6s %6s %8s\n", "model", "positions",
		       "MiB", "pins", "uid", "idle s");
	for (uint64_t i = 0; i < rep.a; i++) {
		char model[SBD_CACHE_MODEL_MAX];

		memcpy(model, e[i].model, sizeof(model));
		model[sizeof(model) - 1] = 0;
		printf("%-24s %10llu %10.1f %6u %6u %8.1f\n",
		       *model ? model : "?",
		       (unsigned long long)e[i].positions, mib(e[i].bytes),
		       e[i].pins, e[i].uid, (double)e[i].idle_ms / 1000);
	}
	return 0;
}

static int wait_daemon(const char *path, long long timeout_ms)
{
	static char buf[sizeof(struct sbd_msg) + 64];
	struct timespec t0, t;
	int fd;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		fd = hello(path, buf, sizeof(buf));
		if (fd >= 0) {
			close(fd);
			return 0;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 +
			    (t.tv_nsec - t0.tv_nsec) / 1000000 >=
		    timeout_ms) {
			fprintf(stderr, "sparsebufctl: no daemon at %s after "
				"%lld ms: %s\n", path, timeout_ms,
				strerror(-fd));
			return 1;
		}
		usleep(20000);
	}
}

int main(int argc, char **argv)
{
	struct sbc cli = {
		.prog = "sparsebufctl",
		.usage = "-s PATH status [--json]\n-s PATH cache [--json]\n"
			 "-s PATH wait [--timeout MS]",
		.about = "Ask sparsebufd how the machine's memory budget is "
			 "spent, or wait for one to answer.",
		.opts = opts,
	};
	const char *path = getenv("SPARSEBUF_DAEMON"), *cmd = NULL, *val;
	long long timeout = 5000;
	bool json = false;
	int id;

	sbc_init(&cli, argc, argv);
	while ((id = sbc_next(&cli, &val)) != SBC_END) {
		switch (id) {
		case O_SOCKET:
			path = val;
			break;
		case O_JSON:
			json = true;
			break;
		case O_TIMEOUT:
			timeout = sbc_int(&cli, val, 0, 3600 * 1000);
			break;
		case SBC_ARG:
			if (cmd)
				sbc_fail(&cli, "unexpected argument '%s'", val);
			cmd = val;
			break;
		}
	}
	if (!path || !*path)
		sbc_fail(&cli, "no socket: -s PATH or SPARSEBUF_DAEMON");
	if (!cmd || !strcmp(cmd, "status"))
		return status(path, json);
	if (!strcmp(cmd, "cache"))
		return cache(path, json);
	if (!strcmp(cmd, "wait"))
		return wait_daemon(path, timeout);
	sbc_fail(&cli, "unknown command '%s' (status, cache, wait)", cmd);
}
