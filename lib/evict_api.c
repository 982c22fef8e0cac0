/* SPDX-License-Identifier: MIT */
/*
 * The public calls of the eviction policy: sb_buf_evict (pages to the
 * spill file now), sb_buf_advise (hints for the CLOCK, or evict / read
 * ahead), and sb_kv_evict's variant that leaves shared pages alone. Above
 * eviction (evict.c) and prefetch, which they call.
 */
#include "internal.h"

#include <errno.h>
#include <unistd.h>

/* Evict the runs of [first, end) whose pages nobody else holds; locks
 * held. */
static long evict_sole_locked(struct sb_buf *buf, size_t first, size_t end)
{
	long total = 0;

	for (size_t i = first; i < end;) {
		size_t j = i;
		long r;

		while (j < end && sbi_pte_has_page(buf->pte[j]) &&
		       sbi_pool_refs(buf->pool, sbi_pte_page(buf->pte[j])) ==
			       1)
			j++;
		if (j == i) {
			i++;
			continue;
		}
		r = sbi_evict_locked(buf, i, j);
		if (r < 0)
			return r;
		total += r;
		i = j;
	}
	return total;
}

static long evict_range(struct sb_buf *buf, size_t off, size_t len,
			bool sole)
{
	struct sb_pool *pool;
	struct sbi_span sp;
	int r2 = 0;
	long r;

	if ((r = sbi_check_buf(buf)) < 0 ||
	    (r = sbi_check_range(buf, off, len)) < 0)
		return r;
	pool = buf->pool;
	if (!pool->can_wp && !(buf->flags & SBI_BUF_RO))
		return -EOPNOTSUPP;	/* no write-protect on shmem */
	if (!sbi_disk_get(pool, &r2))
		return r2;
	/* Only pages lying wholly inside the range, as sb_buf_unmap. */
	sp = sbi_span_inside(pool, off, len);
	if (sp.first >= sp.end)
		return 0;
	/* No touch of what goes (prefetch.c). */
	sbi_bg_quiet_begin(buf, sp.first, sp.end);
	/* A share reading from this buffer finishes first: it holds its
	 * pages in memory for a moment (buf.c). */
	while (atomic_load(&buf->sharing))
		usleep(100);
	pthread_rwlock_rdlock(&pool->layout);
	pthread_mutex_lock(&buf->lock);
	r = sole ? evict_sole_locked(buf, sp.first, sp.end)
		 : sbi_evict_locked(buf, sp.first, sp.end);
	pthread_mutex_unlock(&buf->lock);
	pthread_rwlock_unlock(&pool->layout);
	sbi_bg_quiet_end(buf);
	return r;
}

SB_API long sb_buf_evict(struct sb_buf *buf, size_t off, size_t len)
{
	return evict_range(buf, off, len, false);
}

long sbi_buf_evict_sole(struct sb_buf *buf, size_t off, size_t len)
{
	return evict_range(buf, off, len, true);
}

SB_API long sb_buf_advise(struct sb_buf *buf, size_t off, size_t len,
			  enum sb_advice advice)
{
	struct sb_pool *pool;
	struct sbi_span sp;
	long n = 0, r;
	uint8_t bit;

	if ((r = sbi_check_buf(buf)) < 0 ||
	    (r = sbi_check_range(buf, off, len)) < 0)
		return r;
	pool = buf->pool;
	if (!len)
		return 0;
	sp = sbi_span_touched(pool, off, len);
	switch (advice) {
	case SB_ADVICE_DONTNEED:
		return sb_buf_evict(buf, off, len);
	case SB_ADVICE_WILLNEED:
		return sb_buf_prefetch(buf, &(struct sb_range){off, len}, 1, 0);
	case SB_ADVICE_NORMAL:
		bit = SBI_RBIT_REF;
		break;
	case SB_ADVICE_HOT:
		bit = SBI_RBIT_HOT;
		break;
	case SB_ADVICE_COLD:
		bit = SBI_RBIT_COLD;
		break;
	case SB_ADVICE_RANDOM:
		return sbi_readahead_set(buf, sp.first, sp.end, false);
	default:
		return -EINVAL;
	}
	if (advice == SB_ADVICE_NORMAL &&
	    (r = sbi_readahead_set(buf, sp.first, sp.end, true)) < 0)
		return r;
	pthread_mutex_lock(&buf->lock);
	for (size_t i = sp.first; i < sp.end; i++) {
		sbi_pid p = sbi_pte_page(buf->pte[i]);

		if (!sbi_pte_has_page(buf->pte[i]))
			continue;
		__atomic_store_n(&sbi_pid_heap(pool, p)
					  ->rbit[sbi_pid_index(pool, p)],
				 bit, __ATOMIC_RELAXED);
		n++;
	}
	pthread_mutex_unlock(&buf->lock);
	return n;
}
