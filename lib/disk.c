/* SPDX-License-Identifier: MIT */
/*
 * The disk tier of a pool: its I/O engine and spill file, set up at the
 * first use (an eviction, a file-backed or restored buffer), so that a pool
 * that never touches the disk has no extra threads or files.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sbi_disk *sbi_disk_get(struct sb_pool *pool, int *err)
{
	struct sbi_disk *d = atomic_load(&pool->disk);

	if (d)
		return d;
	pthread_mutex_lock(&pool->disk_lock);
	d = atomic_load(&pool->disk);
	if (!d) {
		d = calloc(1, sizeof(*d));
		if (!d) {
			*err = -ENOMEM;
			goto out;
		}
		d->pool = pool;
		d->spill_fd = -1;
		pthread_mutex_init(&d->spill_lock, NULL);
		pthread_mutex_init(&d->done_lock, NULL);
		SBI_LK_RANK(&d->spill_lock, SBI_RANK_LEAF, 0);
		SBI_LK_RANK(&d->done_lock, SBI_RANK_LEAF, 0);
		pthread_mutex_init(&d->crc_lock, NULL);
		SBI_LK_RANK(&d->crc_lock, SBI_RANK_LEAF, 0);
		pthread_cond_init(&d->done_cond, NULL);
		d->done_want = UINT64_MAX;
		pthread_cond_init(&d->punch_cond, NULL);
		d->io = sbi_io_create(err);
		if (!d->io) {
			pthread_mutex_destroy(&d->spill_lock);
			pthread_mutex_destroy(&d->done_lock);
			pthread_mutex_destroy(&d->crc_lock);
			pthread_cond_destroy(&d->done_cond);
			pthread_cond_destroy(&d->punch_cond);
			free(d);
			d = NULL;
			goto out;
		}
		/* Read buffers for home and spill page-ins (io.c says why):
		 * a ring's worth of small pages, within 4 MiB (four of 1
		 * MiB; larger pages go straight into the pool page). */
		if (pool->page_size <= (1u << 20))
			sbi_io_bounce_init(d->io, pool->page_size,
					   (unsigned)((4u << 20) /
						      pool->page_size));
		sbi_info("disk tier: %s", sbi_io_name(d->io));
		atomic_store(&pool->disk, d);
	}
out:
	pthread_mutex_unlock(&pool->disk_lock);
	return d;
}

int sbi_disk_page_crc(struct sbi_disk *d, sbi_pid pid, size_t len,
		      uint32_t *crc)
{
	struct sb_pool *pool = d->pool;
	int r;

	pthread_mutex_lock(&d->crc_lock);
	r = sbi_heap_crc32c(sbi_pid_heap(pool, pid), sbi_pid_index(pool, pid),
			    len, pool->page_size, d->crc_buf,
			    sizeof(d->crc_buf), crc);
	pthread_mutex_unlock(&d->crc_lock);
	return r;
}

void sbi_disk_destroy(struct sb_pool *pool)
{
	struct sbi_disk *d = atomic_load(&pool->disk);

	if (!d)
		return;
	/* No punch starts from here on; a punch in flight finishes when the
	 * engine stops. */
	sbi_spill_close(d);
	/* Detached under the pool lock before anything goes: the ready
	 * thread looks it up under that lock, to read the spill counter
	 * (stat.c) and to start punches, until the pool stops. Every buffer
	 * is gone, so no page-in is left to look for it either. */
	pthread_mutex_lock(&pool->lock);
	atomic_store(&pool->disk, NULL);
	pthread_mutex_unlock(&pool->lock);
	sbi_io_destroy(d->io);
	if (d->spill_fd >= 0)
		close(d->spill_fd);
	sbi_meta_free(d->slot_bits, (size_t)d->slot_cap / 8 + 8);
	sbi_meta_free(d->punch_bits, (size_t)d->slot_cap / 8 + 8);
	sbi_meta_free(d->slot_crc, (size_t)d->slot_cap * sizeof(uint32_t));
	sbi_meta_free(d->slot_extra, (size_t)d->slot_cap * sizeof(uint16_t));
	pthread_mutex_destroy(&d->spill_lock);
	pthread_mutex_destroy(&d->done_lock);
	pthread_mutex_destroy(&d->crc_lock);
	pthread_cond_destroy(&d->done_cond);
	pthread_cond_destroy(&d->punch_cond);
	free(d);
}

void sbi_disk_signal(struct sbi_disk *d)
{
	pthread_mutex_lock(&d->done_lock);
	if (++d->done_gen >= d->done_want) {
		d->done_want = UINT64_MAX;	/* the rest ask again */
		pthread_cond_broadcast(&d->done_cond);
	}
	pthread_mutex_unlock(&d->done_lock);
}

uint64_t sbi_disk_gen(struct sbi_disk *d)
{
	uint64_t g;

	pthread_mutex_lock(&d->done_lock);
	g = d->done_gen;
	pthread_mutex_unlock(&d->done_lock);
	return g;
}

void sbi_disk_wait_until(struct sbi_disk *d, uint64_t target, int timeout_ms)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_nsec += (long)timeout_ms * 1000000;
	until.tv_sec += until.tv_nsec / 1000000000;
	until.tv_nsec %= 1000000000;
	pthread_mutex_lock(&d->done_lock);
	while (d->done_gen < target) {
		if (target < d->done_want)
			d->done_want = target;
		if (pthread_cond_timedwait(&d->done_cond, &d->done_lock,
					   &until) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&d->done_lock);
}

size_t sbi_disk_spill_bytes(struct sb_pool *pool)
{
	struct sbi_disk *d = atomic_load(&pool->disk);
	size_t n;

	if (!d)
		return 0;
	pthread_mutex_lock(&d->spill_lock);
	n = d->slots_used;
	pthread_mutex_unlock(&d->spill_lock);
	return n << pool->page_shift;
}

/* Test hook: flip a byte of the spilled copy of the page at off. */
int sbi_test_corrupt_spill(struct sb_buf *buf, size_t off);
int sbi_test_corrupt_spill(struct sb_buf *buf, size_t off)
{
	struct sb_pool *pool = buf->pool;
	size_t idx = off >> pool->page_shift;
	struct sbi_disk *d = atomic_load(&pool->disk);
	uint64_t pte;
	uint32_t slot1;
	void *mem;
	int r = 0;

	pthread_mutex_lock(&buf->lock);
	pte = buf->pte[idx];
	slot1 = sbi_pte_slot1(pte);
	if (!d || !(pte & SBI_PTE_DISK) || (pte & SBI_PTE_INFLIGHT) ||
	    !slot1) {
		pthread_mutex_unlock(&buf->lock);
		return -ENOENT;
	}
	if (posix_memalign(&mem, 4096, pool->page_size)) {
		pthread_mutex_unlock(&buf->lock);
		return -ENOMEM;
	}
	if (pread(d->spill_fd, mem, pool->page_size,
		  (off_t)sbi_spill_off(d, slot1 - 1)) != (ssize_t)pool->page_size)
		r = -EIO;
	((unsigned char *)mem)[pool->page_size / 2] ^= 0x5a;
	if (!r && pwrite(d->spill_fd, mem, pool->page_size,
			 (off_t)sbi_spill_off(d, slot1 - 1)) !=
			  (ssize_t)pool->page_size)
		r = -EIO;
	pthread_mutex_unlock(&buf->lock);
	free(mem);
	return r;
}
