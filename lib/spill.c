/* SPDX-License-Identifier: MIT */
/*
 * The spill file: where evicted pages go. One unlinked file per pool
 * (O_TMPFILE, O_DIRECT when the file system takes it: no second copy in
 * the page cache), made at the first eviction, divided into slots of one
 * pool page. A slot keeps the CRC-32C of what was written to it.
 *
 * A freed slot's blocks go back to the file system (hole punch) once the
 * disk tier has been quiet for QUIET_MS, not on the thread that frees it:
 * on ext4 a punch waits for every direct I/O in flight on the file and
 * holds new ones off (inode_dio_wait), 220-400 us a slot and up to 7 ms
 * under load on an AMD EPYC VM, and the page-in completion that freed a
 * slot punched it before waking the page's waiter (docs/design.md, "A
 * page-in"). Freed slots are marked due; the ready thread starts punching
 * when nothing else has gone to the disk tier for QUIET_MS, one stretch
 * of due neighbours at a time through the I/O engine (io_uring's own
 * workers run it, or the fallback's), each completion starting the next
 * while it stays quiet. The slots of a stretch being punched count as in
 * use, so that no write lands in them before the punch. A slot taken
 * again before its punch keeps its blocks (the new write overwrites
 * them); an eviction that finds the file system full punches every due
 * slot itself and tries once more. So the file holds what evicted pages
 * hold plus the freed slots not yet punched, never more than the most
 * slots ever in use at once (the lowest free slot is taken first), and
 * only what evicted pages hold once the disk tier has rested.
 *
 * Slots get their blocks by fallocate just before they are written
 * (sbi_spill_prealloc), where the file is O_DIRECT. A direct write that
 * extends the file or fills a hole takes the inode lock exclusively on
 * ext4, and io_uring cannot issue it without blocking, so it hands each
 * one to a worker thread, where the batch's writes then queue on that
 * lock: the first eviction into a new file ran at 0.75x a plain pwrite
 * loop (bench/pagein). Into allocated (unwritten) blocks the writes take
 * the lock shared and go out together. The blocks are the slots' own, so
 * the file holds no more than before, and a full file system answers at
 * the fallocate, before anything is written.
 */
#include "internal.h"
#include "dproto.h"

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
	if (fd >= 0 && (fd = sbd_fd_above_std(fd, true)) < 0) {
		errno = -fd;
		return -1;
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
		uint64_t *punch = sbi_meta_alloc(SLOT_CAP / 8 + 8, false);
		uint32_t *crc = sbi_meta_alloc(SLOT_CAP * sizeof(uint32_t),
					       false);
		uint16_t *extra = sbi_meta_alloc(SLOT_CAP * sizeof(uint16_t),
						 false);

		if (!bits || !punch || !crc || !extra) {
			sbi_meta_free(bits, SLOT_CAP / 8 + 8);
			sbi_meta_free(punch, SLOT_CAP / 8 + 8);
			sbi_meta_free(crc, SLOT_CAP * sizeof(uint32_t));
			sbi_meta_free(extra, SLOT_CAP * sizeof(uint16_t));
			return -ENOMEM;
		}
		d->slot_bits = bits;
		d->punch_bits = punch;
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

static bool punch_due(const struct sbi_disk *d, uint32_t s)
{
	return d->punch_bits[s / 64] >> (s % 64) & 1;
}

static void set_punch(struct sbi_disk *d, uint32_t s, bool due)
{
	if (due == punch_due(d, s))
		return;
	d->punch_bits[s / 64] ^= 1ull << (s % 64);
	if (due) {
		d->punch_pending++;
		if (s < d->punch_from)
			d->punch_from = s;
	} else {
		d->punch_pending--;
	}
}

int sbi_spill_alloc(struct sbi_disk *d, size_t n, uint32_t *slots,
		    uint64_t *kept)
{
	size_t got = 0;
	int r;

	memset(kept, 0, (n + 63) / 64 * sizeof(*kept));
	pthread_mutex_lock(&d->spill_lock);
	r = spill_init(d);
	if (r < 0)
		goto out;
	if (n > d->slot_cap - d->slots_used - d->punching) {
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
			if (punch_due(d, s))	/* its blocks are reused */
				kept[got / 64] |= 1ull << (got % 64);
			set_punch(d, s, false);
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

static bool kept_bit(const uint64_t *kept, size_t k)
{
	return kept[k / 64] >> (k % 64) & 1;
}

int sbi_spill_prealloc(struct sbi_disk *d, const uint32_t *slots,
		       const uint64_t *kept, size_t n)
{
	if (!d->spill_direct || __atomic_load_n(&d->prealloc_off,
						__ATOMIC_RELAXED))
		return 0;
	/* Runs of consecutive slots without blocks: a slot that kept its
	 * blocks needs no fallocate, which takes the inode lock and on ext4
	 * waits for the direct I/O in flight on the file
	 * (inode_dio_wait). */
	for (size_t k = 0, e; k < n; k = e) {
		int r;

		if (kept_bit(kept, k)) {
			e = k + 1;
			continue;
		}
		for (e = k + 1; e < n && !kept_bit(kept, e) &&
				slots[e] == slots[e - 1] + 1;
		     e++)
			;
		do
			r = fallocate(d->spill_fd, 0,
				      (off_t)sbi_spill_off(d, slots[k]),
				      (off_t)((e - k) << d->pool->page_shift));
		while (r < 0 && errno == EINTR);
		if (r < 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
			__atomic_store_n(&d->prealloc_off, true,
					 __ATOMIC_RELAXED);
			return 0;
		}
		if (r < 0)
			return errno == ENOSPC ? -ENOSPC : -errno;
	}
	return 0;
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

/* A punch gives back this many slots at most (a stretch of the file): a
 * read that comes meanwhile waits for it. */
#define PUNCH_RUN 256
/* Punches start after this long without other disk-tier I/O. */
#define QUIET_MS 100

static void punch_next(struct sbi_disk *d);

/* Take the first stretch of due slots, at most PUNCH_RUN, for a punch:
 * in use until punched (no write may land in them before), no longer due.
 * spill_lock held, punch_pending > 0. Returns its start; *end its end. */
static uint32_t reserve_stretch(struct sbi_disk *d, uint32_t *end)
{
	uint32_t s = d->punch_from, e;

	for (;; s = (s / 64 + 1) * 64) {	/* no slot below is due */
		uint64_t w = d->punch_bits[s / 64] >> (s % 64);

		if (w) {
			s += (uint32_t)__builtin_ctzll(w);
			break;
		}
	}
	for (e = s + 1; e < d->slot_hi && e - s < PUNCH_RUN && punch_due(d, e);
	     e++)
		;
	for (uint32_t t = s; t < e; t++) {
		set_punch(d, t, false);
		d->slot_bits[t / 64] |= 1ull << (t % 64);
	}
	d->punch_from = e;
	d->punching += e - s;
	*end = e;
	return s;
}

/* Slots [s, e) punched (res: 0 or -errno): free again. A failed punch
 * leaves them due (tried again at a later tick), except where the file
 * system cannot punch at all. spill_lock not held. */
static void punch_finish(struct sbi_disk *d, uint32_t s, uint32_t e, int res)
{
	pthread_mutex_lock(&d->spill_lock);
	for (uint32_t t = s; t < e; t++)
		d->slot_bits[t / 64] &= ~(1ull << (t % 64));
	if (s < d->slot_hint)
		d->slot_hint = s;
	d->punching -= e - s;
	if (res == -EOPNOTSUPP) {
		/* This file system keeps its blocks: stop trying. */
		d->punch_off = true;
		memset(d->punch_bits, 0, ((size_t)d->slot_hi + 63) / 64 * 8);
		d->punch_pending = 0;
	} else if (res < 0) {
		for (uint32_t t = s; t < e; t++)
			set_punch(d, t, true);
	}
	pthread_mutex_unlock(&d->spill_lock);
}

/* The punch in flight is over; spill_lock held. */
static void punch_over(struct sbi_disk *d)
{
	d->punch_busy = false;
	pthread_cond_broadcast(&d->punch_cond);
}

/* A punch finished, on the completion thread: the next one starts, unless
 * this one failed (the next tick tries again). */
static bool punch_done(struct sbi_io *io)
{
	struct sbi_disk *d = io->ctx;
	uint32_t s = (uint32_t)(io->off >> d->pool->page_shift);
	int res = (int)(io->res < 0 ? io->res : 0);

	punch_finish(d, s, s + (uint32_t)(io->len >> d->pool->page_shift), res);
	pthread_mutex_lock(&d->spill_lock);
	punch_over(d);
	pthread_mutex_unlock(&d->spill_lock);
	sbi_io_put(d->io, io);
	if (res == 0)
		punch_next(d);
	return true;
}

/* Start punching the next stretch of due slots, unless one is in flight or
 * the disk tier is busy. Never waits: the ready thread calls it holding
 * pool->lock. */
static void punch_next(struct sbi_disk *d)
{
	size_t ps = d->pool->page_size;
	struct sbi_io *io;
	uint32_t s, e;

	/* Checked first: the engine's lock and this one are both leaves. */
	if (!sbi_io_can_punch(d->io) || !sbi_io_quiet(d->io, QUIET_MS))
		return;
	pthread_mutex_lock(&d->spill_lock);
	if (d->punch_busy || !d->punch_pending || d->closing) {
		pthread_mutex_unlock(&d->spill_lock);
		return;
	}
	s = reserve_stretch(d, &e);
	d->punch_busy = true;
	d->punch_busy_n = e - s;
	pthread_mutex_unlock(&d->spill_lock);

	io = sbi_io_get(d->io);
	if (!io) {	/* no request memory: due again, a later tick */
		punch_finish(d, s, e, -ENOMEM);
		pthread_mutex_lock(&d->spill_lock);
		punch_over(d);
		pthread_mutex_unlock(&d->spill_lock);
		return;
	}
	io->punch = true;
	io->done = punch_done;
	io->ctx = d;
	io->fd = d->spill_fd;
	io->off = (uint64_t)s * ps;
	io->len = (size_t)(e - s) * ps;
	pthread_mutex_lock(&d->spill_lock);
	if (d->punch_hold) {
		d->punch_parked = io;	/* sbi_test_spill_hold */
		io = NULL;
	}
	pthread_mutex_unlock(&d->spill_lock);
	if (io)
		sbi_io_submit(d->io, &io, 1);
}

/* Test hook: punches stop before they start (hold), or go on. */
void sbi_test_spill_hold(struct sbi_disk *d, bool hold);
void sbi_test_spill_hold(struct sbi_disk *d, bool hold)
{
	struct sbi_io *io;

	pthread_mutex_lock(&d->spill_lock);
	d->punch_hold = hold;
	io = hold ? NULL : d->punch_parked;
	if (!hold)
		d->punch_parked = NULL;
	pthread_mutex_unlock(&d->spill_lock);
	if (io)
		sbi_io_submit(d->io, &io, 1);
}

void sbi_spill_free(struct sbi_disk *d, const uint32_t *slots, size_t n)
{
	pthread_mutex_lock(&d->spill_lock);
	for (size_t k = 0; k < n; k++) {
		/* Another holder: the slot stays. */
		if (d->slot_extra[slots[k]]) {
			d->slot_extra[slots[k]]--;
			continue;
		}
		d->slot_bits[slots[k] / 64] &= ~(1ull << (slots[k] % 64));
		if (!d->punch_off)
			set_punch(d, slots[k], true);
		if (slots[k] < d->slot_hint)
			d->slot_hint = slots[k];
		d->slots_used--;
	}
	pthread_mutex_unlock(&d->spill_lock);
	/* An engine that cannot punch (io_uring before Linux 5.6): here, as
	 * before punches were deferred. */
	if (!sbi_io_can_punch(d->io))
		sbi_spill_punch_now(d);
}

void sbi_spill_punch(struct sbi_disk *d)
{
	punch_next(d);
}

size_t sbi_spill_punch_now(struct sbi_disk *d)
{
	size_t ps = d->pool->page_size, punched = 0;

	/* A punch in flight gives its slots back first: wait for it (its
	 * completion takes no lock a caller may hold). */
	pthread_mutex_lock(&d->spill_lock);
	if (d->punch_busy && !d->punch_parked) {
		punched += d->punch_busy_n;
		while (d->punch_busy)
			pthread_cond_wait(&d->punch_cond, &d->spill_lock);
	}
	/* Then every due stretch, one punch at a time, the lock let go
	 * meanwhile (the stretch is reserved). */
	while (d->punch_pending && !d->punch_off) {
		uint32_t s, e;
		int r;

		s = reserve_stretch(d, &e);
		pthread_mutex_unlock(&d->spill_lock);
		r = fallocate(d->spill_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			      (off_t)s * (off_t)ps, (off_t)(e - s) * (off_t)ps);
		r = r < 0 ? -errno : 0;
		punch_finish(d, s, e, r);
		pthread_mutex_lock(&d->spill_lock);
		if (r < 0)
			break;	/* due again; not in a loop here */
		punched += e - s;
	}
	pthread_mutex_unlock(&d->spill_lock);
	return punched;
}

void sbi_spill_close(struct sbi_disk *d)
{
	pthread_mutex_lock(&d->spill_lock);
	d->closing = true;
	pthread_mutex_unlock(&d->spill_lock);
}

void sbi_spill_set_crc(struct sbi_disk *d, uint32_t slot, uint32_t crc)
{
	__atomic_store_n(&d->slot_crc[slot], crc, __ATOMIC_RELAXED);
}

uint32_t sbi_spill_crc(struct sbi_disk *d, uint32_t slot)
{
	return __atomic_load_n(&d->slot_crc[slot], __ATOMIC_RELAXED);
}
