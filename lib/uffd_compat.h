/* SPDX-License-Identifier: MIT */
/*
 * userfaultfd definitions newer than the linux-libc-dev headers of Debian 12
 * (6.1). The kernel tells at run time (UFFDIO_API) which of them it has;
 * these only let the code name them.
 */
#ifndef SPARSEBUF_UFFD_COMPAT_H
#define SPARSEBUF_UFFD_COMPAT_H

#include <linux/userfaultfd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)	/* 6.4 */
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)		/* 6.6 */
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)		/* 6.7 */
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)		/* 6.8 */
#endif

#ifndef _UFFDIO_MOVE
#define _UFFDIO_MOVE (0x05)
#endif
#ifndef _UFFDIO_POISON
#define _UFFDIO_POISON (0x08)
#endif

#ifndef UFFDIO_POISON
struct uffdio_poison {
	struct uffdio_range range;
#define UFFDIO_POISON_MODE_DONTWAKE ((__u64)1 << 0)
	__u64 mode;
	__s64 updated;	/* bytes poisoned, or -errno */
};
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif

#ifndef UFFDIO_MOVE
struct uffdio_move {
	__u64 dst;
	__u64 src;
	__u64 len;
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
	__u64 mode;
	__s64 move;
};
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

#endif /* SPARSEBUF_UFFD_COMPAT_H */
