/* NUMA placement: a pool bound to a node allocates its heap pages there
 * (checked page by page with get_mempolicy), on a one-node machine too; a
 * node that does not exist is refused. */
#include "harness.h"

#include <numa.h>
#include <numaif.h>

#define PAGE (256 * KiB)

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	struct sb_pool_opts o;
	struct sb_pool *p;
	struct sb_buf *b;
	char *x;
	int err, node, mode, n, last;

	require_uffd();
	if (numa_available() < 0)
		SKIP("libnuma reports no NUMA support on this kernel");
	n = numa_num_configured_nodes();
	last = numa_max_node();
	printf("%d NUMA node(s), highest %d\n", n, last);

	sb_pool_opts_init(&o);
	o.page_size = PAGE;
	o.heap_size = 16 * MiB;
	o.numa_node = last + 1;
	CHECK(sb_pool_create(&o, &err) == NULL);
	CHECK_EQ(err, -EINVAL);

	for (int want = 0; want <= last; want++) {
		if (!numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)want))
			continue;
		o.numa_node = want;
		p = sb_pool_create(&o, &err);
		if (!p)
			FAIL("pool on node %d: %s", want, strerror(-err));
		b = make_buf(p, 1 * GiB, 0);
		x = sb_buf_addr(b);
		CHECK_EQ(sb_buf_map(b, 0, 8 * PAGE), 8);
		memset(x, 1, 8 * PAGE);
		x[40 * PAGE] = 1;	/* and one placed by a fault */
		for (size_t off = 0; off < 8 * PAGE; off += 64 * KiB) {
			CHECK_EQ(get_mempolicy(&node, NULL, 0, x + off,
					       MPOL_F_NODE | MPOL_F_ADDR),
				 0);
			CHECK_EQ(node, want);
			CHECK_EQ(get_mempolicy(&mode, NULL, 0, x + off,
					       MPOL_F_ADDR),
				 0);
			CHECK_EQ(mode, MPOL_BIND);
		}
		CHECK_EQ(get_mempolicy(&node, NULL, 0, x + 40 * PAGE,
				       MPOL_F_NODE | MPOL_F_ADDR),
			 0);
		CHECK_EQ(node, want);
		sb_buf_destroy(b);
		sb_pool_destroy(p);
		printf("node %d: every page bound and allocated there\n", want);
	}
	return 0;
}
