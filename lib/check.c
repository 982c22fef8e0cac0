/* SPDX-License-Identifier: MIT */
/*
 * The argument checks every public call of a buffer starts with: a buffer
 * of a pool that is this process's (not a fork()ed child's copy), a range
 * inside it. Below everything that takes a buffer.
 */
#include "internal.h"

#include <errno.h>

int sbi_check_range(const struct sb_buf *buf, size_t off, size_t len)
{
	return off > buf->length || len > buf->length - off ? -ERANGE : 0;
}

int sbi_check_buf(const struct sb_buf *buf)
{
	return buf ? sbi_pool_check(buf->pool) : -EINVAL;
}


uint64_t sbi_buf_src_bytes(const struct sb_buf *buf)
{
	return buf->src ? buf->src->size : 0;
}
