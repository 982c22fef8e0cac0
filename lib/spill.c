/* SPDX-License-Identifier: MIT */
/*
 * The spill file: where evicted pages go. One unlinked file per pool
 * (O_TMPFILE, O_DIRECT when the file system takes it: no second copy in
 * the page cache), made at the first eviction, divided into slots of one
 * pool page. A slot keeps the CRC-32C of what was written to it. A freed
 * slot's blocks go back to the file system at once (hole punch), so the
 * file's allocated size is what evicted pages hold.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 16 M slots (slot + 1 fits the 24 bits a page-table entry has for it):
 * 64 GiB of 4 KiB pages, 4 TiB of 256 KiB pages. The tables are reserved,
 * backed as used. */
#define SLOT_CAP (((uint32_t)1 << 24) - 1)

static const char *spill_dir(const struct sb_pool *pool)
{
	const char *d = pool->spill_dir;

	if (!d || !*d)
		d = getenv("SPARSEBUF_SPILL_DIR");
	if (!d || !*d)
		d = getenv("TMPDIR");
	if (!d || !*d)
		d = "/tmp";
	return d;
}

/* An unlinked file in dir, O_DIRECT if possible. */
static int open_spill(const char *dir, bool *direct)
{
	int flags = O_RDWR | O_CLOEXEC;
	int fd;

	*direct = true;
	fd = open(dir, O_TMPFILE | O_DIRECT | flags, 0600);
	if (fd < 0 && errno == EINVAL) {	/* no O_DIRECT here (tmpfs) */
		*direct = false;
		fd = open(dir, O_TMPFILE | flags, 0600);
	}
	if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
		/* No O_TMPFILE: a named file, unlinked at once. */
		char path[4096];

		if (snprintf(path, sizeof(path), "%s/sparsebuf-spill-XXXXXX",
			     dir) >= (int)sizeof(path)) {
			errno = ENAMETOOLONG;
			return -1;
		}
		fd = mkostemp(path, O_CLOEXEC);
		if (fd < 0)
			return -1;
		unlink(path);
		*direct = fcntl(fd, F_SETFL, O_DIRECT) == 0;
	}
	return fd;
}

/*
 * Make the spill file on first need. A failure (directory missing, EMFILE,
 * ENOSPC) is not remembered: the next eviction tries again, so a cause
 * that goes away (the directory made, descriptors closed) does not leave
 * the pool unable to evict for good. The slot tables are reserved once
 * and kept (lazily backed, 80 MiB of address space at most).
 */
static int spill_init(struct sbi_disk *d)
{
	const char *dir;
	int err;

	if (d->spill_fd >= 0)
		return 0;
	if (!d->slot_bits) {
		uint64_t *bits = sbi_meta_alloc(SLOT_CAP / 8 + 8, false);
		uint32_t *crc = sbi_meta_alloc(SLOT_CAP * sizeof(uint32_t),
					       false);
		uint16_t *extra = sbi_meta_alloc(SLOT_CAP * sizeof(uint16_t),
						 false);

		if (!bits || !crc || !extra) {
			sbi_meta_free(bits, SLOT_CAP / 8 + 8);
			sbi_meta_free(crc, SLOT_CAP * sizeof(uint32_t));
			sbi_meta_free(extra, SLOT_CAP * sizeof(uint16_t));
			return -ENOMEM;
		}
		d->slot_bits = bits;
		d->slot_crc = crc;
		d->slot_extra = extra;
		d->slot_cap = SLOT_CAP;
	}
	dir = spill_dir(d->pool);
	d->spill_fd = open_spill(dir, &d->spill_direct);
	if (d->spill_fd < 0) {
		err = -errno;
		/* Once per cause, not once per eviction attempt. */
		if (err != d->spill_err)
			sbi_err("cannot make a spill file in %s: %s (set "
				"SPARSEBUF_SPILL_DIR); eviction fails until "
				"it can",
				dir, strerror(-err));
		d->spill_err = err;
		return err;
	}
	if (d->spill_err)
		sbi_warn("spill file in %s made after all", dir);
	d->spill_err = 0;
	sbi_info("spill file in %s%s", dir,
		 d->spill_direct ? " (O_DIRECT)" : "");
	return 0;
}

static bool slot_used(const struct sbi_disk *d, uint32_t s)
{
	return d->slot_bits[s / 64] >> (s % 64) & 1;
}

int sbi_spill_alloc(struct sbi_disk *d, size_t n, uint32_t *slots)
{
	size_t got = 0;
	int r;

	pthread_mutex_lock(&d->spill_lock);
	r = spill_init(d);
	if (r < 0)
		goto out;
	if (n > d->slot_cap - d->slots_used) {
		r = -ENOSPC;
		goto out;
	}
	/* Lowest free slots first (every slot below the hint is in use):
	 * the file stays compact. */
	for (uint32_t s = d->slot_hint; got < n;) {
		if (s % 64 == 0 && d->slot_bits[s / 64] == ~0ull) {
			s += 64;	/* a full word */
			continue;
		}
		if (!slot_used(d, s)) {
			d->slot_bits[s / 64] |= 1ull << (s % 64);
			slots[got++] = s;
			if (s + 1 > d->slot_hi)
				d->slot_hi = s + 1;
		}
		s++;
	}
	d->slots_used += (uint32_t)n;
	d->slot_hint = slots[n - 1] + 1;
out:
	pthread_mutex_unlock(&d->spill_lock);
	return r;
}

int sbi_spill_ref(struct sbi_disk *d, uint32_t slot)
{
	int r = 0;

	pthread_mutex_lock(&d->spill_lock);
	if (slot >= d->slot_hi || !slot_used(d, slot))
		r = -EINVAL;
	else if (d->slot_extra[slot] == UINT16_MAX)
		r = -EMLINK;
	else
		d->slot_extra[slot]++;
	pthread_mutex_unlock(&d->spill_lock);
	return r;
}

void sbi_spill_free(struct sbi_disk *d, const uint32_t *slots, size_t n)
{
	size_t ps = d->pool->page_size;

	pthread_mutex_lock(&d->spill_lock);
	for (size_t k = 0; k < n; k++) {
		/* Another holder: the slot stays (not punched below). */
		if (d->slot_extra[slots[k]]) {
			d->slot_extra[slots[k]]--;
			continue;
		}
		d->slot_bits[slots[k] / 64] &= ~(1ull << (slots[k] % 64));
		if (slots[k] < d->slot_hint)
			d->slot_hint = slots[k];
		d->slots_used--;
	}
	pthread_mutex_unlock(&d->spill_lock);
	/* Punch outside the lock: it is a file-system call. Neighbours in
	 * one call. A slot reused meanwhile is not punched: its new write
	 * started after we freed it, and a punch would lose it; so the
	 * check is repeated under the lock, per stretch. */
	for (size_t k = 0; k < n;) {
		size_t j = k + 1;

		while (j < n && slots[j] == slots[j - 1] + 1)
			j++;
		pthread_mutex_lock(&d->spill_lock);
		for (size_t t = k; t < j; t++) {
			if (slot_used(d, slots[t]))
				continue;	/* reused: keep */
			/* Holding the lock keeps a new owner from writing
			 * into the slot while we punch it. */
			fallocate(d->spill_fd,
				  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				  (off_t)slots[t] * (off_t)ps, (off_t)ps);
		}
		pthread_mutex_unlock(&d->spill_lock);
		k = j;
	}
}

void sbi_spill_set_crc(struct sbi_disk *d, uint32_t slot, uint32_t crc)
{
	__atomic_store_n(&d->slot_crc[slot], crc, __ATOMIC_RELAXED);
}

uint32_t sbi_spill_crc(struct sbi_disk *d, uint32_t slot)
{
	return __atomic_load_n(&d->slot_crc[slot], __ATOMIC_RELAXED);
}
