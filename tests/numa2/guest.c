/* SPDX-License-Identifier: MIT */
/*
 * The /init of a small VM with two NUMA nodes (tests/test_numa2.c boots
 * it under qemu): pools bound to node 1 and to node 0 place pages, and
 * move_pages(2) says where each page really is. Prints one line
 * "NUMA2 RESULT ..." on the console and powers the VM off.
 */
#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <unistd.h>

#include "sparsebuf.h"

#define SIZE ((size_t)8 << 20)

/* Pages of [p, p + SIZE) on node (4 KiB each), of how many. */
static int on_node(char *p, int node, int *total)
{
	enum { N = SIZE / 4096 };
	static void *pages[N];
	static int status[N];
	int n = 0;

	for (int i = 0; i < N; i++)
		pages[i] = p + (size_t)i * 4096;
	if (move_pages(0, N, pages, NULL, status, 0) < 0)
		return -errno;
	for (int i = 0; i < N; i++)
		n += status[i] == node;
	*total = N;
	return n;
}

static int try_node(int node, int *total)
{
	struct sb_pool_opts o;
	struct sb_pool *pool;
	struct sb_buf *b;
	int err, n;

	sb_pool_opts_init(&o);
	o.page_size = 64 << 10;
	o.heap_size = 16 << 20;
	o.numa_node = node;
	pool = sb_pool_create(&o, &err);
	if (!pool)
		return err;
	b = sb_buf_create(pool, SIZE, 0, &err);
	if (!b)
		return err;
	if ((err = (int)sb_buf_map(b, 0, SIZE)) < 0)
		return err;
	memset(sb_buf_addr(b), 0x5a, SIZE);
	n = on_node(sb_buf_addr(b), node, total);
	sb_buf_destroy(b);
	sb_pool_destroy(pool);
	return n;
}

int main(int argc, char **argv)
{
	int t1 = 0, t0 = 0, n1, n0, nodes;

	if (argc < 2) {
		/* libnuma reads /sys in its constructor: mount first, then
		 * run again. */
		mount("proc", "/proc", "proc", 0, NULL);
		mount("sysfs", "/sys", "sysfs", 0, NULL);
		mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
		mount("tmpfs", "/tmp", "tmpfs", 0, NULL);
		setenv("TMPDIR", "/tmp", 1);
		execl(argv[0], argv[0], "run", (char *)NULL);
		printf("\nNUMA2 RESULT exec failed: %s pass=0\n",
		       strerror(errno));
		fflush(stdout);
		reboot(RB_POWER_OFF);
		return 1;
	}
	nodes = numa_available() < 0 ? 0 : numa_num_configured_nodes();
	n1 = try_node(1, &t1);
	n0 = try_node(0, &t0);
	printf("\nNUMA2 RESULT nodes=%d node1=%d/%d node0=%d/%d pass=%d\n",
	       nodes, n1, t1, n0, t0,
	       nodes == 2 && t1 > 0 && n1 == t1 && t0 > 0 && n0 == t0);
	fflush(stdout);
	sync();
	reboot(RB_POWER_OFF);
	return 0;
}
