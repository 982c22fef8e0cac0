/* SPDX-License-Identifier: MIT */
/*
 * The machine's budget: leases granted while they fit, and, when they do
 * not, pages taken back from other clients before anyone is refused.
 *
 * The invariant: the leases of all clients sum to at most max_bytes (a
 * client's pages, its ready reserve and its unused lease all count), with
 * one exception a new daemon inherits: clients that come back after a
 * restart bring what they hold, and if that is more than the budget, the
 * daemon asks for the difference at once.
 *
 * The machine-wide cache's pages count too (cache.c): blocks no process
 * maps are dropped, least recently used first, before anyone is asked.
 *
 * Whom to ask: first every client's unused lease (free to give), then the
 * clients that have been idle longest (their cold, evictable pages go to
 * disk, docs/daemon.md). The client asking is never asked: if nothing
 * else can be freed it is refused and evicts its own pages. A request
 * waits at most PARK_MS for the others' answers.
 *
 * Floors: a client may have part of the budget reserved (SBD_FLOOR,
 * granted from free room only, at most --max-floor for a user's clients
 * together: sbd_budget_floor). Nobody else is leased the part of a floor
 * its client does not hold (room), and no client is asked to give back
 * below its floor (giveable). So a client can always grow to its floor
 * without waiting for anyone.
 */
#include "server.h"

#include <errno.h>

#define PARK_MS 3000		/* a lease request waits at most this long */
#define RECLAIM_RETRY_MS 1000	/* ask a client again after this long */
#define DRY_MS 3000		/* one that gave nothing: not asked again */

/* What c may be asked to give back: its lease above its floor. */
static uint64_t giveable(const struct sbd_client *c)
{
	return c->lease > c->floor ? c->lease - c->floor : 0;
}

/* May c be asked for pages now? */
static bool askable(const struct sbd_client *c,
		    const struct sbd_client *except, uint64_t now)
{
	return c != except && !c->control && giveable(c) &&
	       !(c->reclaim_asked && now - c->reclaim_ms < RECLAIM_RETRY_MS) &&
	       !(c->dry_ms && now - c->dry_ms < DRY_MS);
}

uint64_t sbd_budget_reserved(const struct sbd_server *s,
			     const struct sbd_client *except)
{
	uint64_t r = 0;

	if (!s->floors)
		return 0;
	for (const struct sbd_client *c = s->clients; c; c = c->next)
		if (c != except && c->floor > c->lease)
			r += c->floor - c->lease;
	return r;
}

uint64_t sbd_budget_room(const struct sbd_server *s,
			 const struct sbd_client *c)
{
	uint64_t taken = s->used + sbd_budget_reserved(s, c);

	return taken < s->max_bytes ? s->max_bytes - taken : 0;
}

static uint64_t room(const struct sbd_server *s, const struct sbd_client *c)
{
	return sbd_budget_room(s, c);
}

/* Room kept from requests that need nothing now (min 0: a reserve's
 * floor): growth then finds it without a reclaim. Floors that took every
 * free byte made each step of another client's growth a reclaim of them:
 * 116 reclaims in 10 s for two clients growing to 100 MiB each beside
 * 150 MiB floors on a 256 MiB budget. */
#define SOFT_HEADROOM_SHIFT 3	/* an eighth of the budget */

/* Grant c what fits of [min, want] now. */
static bool try_grant(struct sbd_server *s, struct sbd_client *c,
		      uint32_t seq, uint64_t min, uint64_t want)
{
	uint64_t g = room(s, c), keep = s->max_bytes >> SOFT_HEADROOM_SHIFT;

	/* Nothing at all while a request is parked: the room that comes
	 * back from the clients it reclaimed from is that one's. */
	for (struct sbd_client *o = s->clients; !min && o; o = o->next)
		if (o->parked)
			keep = g;
	if (!min)
		g = g > keep ? g - keep : 0;
	if (g < min)
		return false;
	if (g > want)
		g = want;
	g -= g % c->page_size;
	if (g < min)
		g = min;	/* min is whole pages: it fits */
	c->lease += g;
	s->used += g;
	sbd_reply(s, c, seq, 0, g, 0, 0, -1);
	return true;
}

/* Ask clients other than except for need bytes. */
static void reclaim(struct sbd_server *s, struct sbd_client *except,
		    uint64_t need)
{
	uint64_t now = sbd_now_ms(), asked = 0;

	/* What others are already giving counts. */
	for (struct sbd_client *c = s->clients; c; c = c->next)
		if (c != except && c->reclaim_asked &&
		    now - c->reclaim_ms < RECLAIM_RETRY_MS)
			asked += c->reclaim_asked;
	if (asked >= need)
		return;
	need -= asked;
	/* Unused lease first: free to give. */
	for (struct sbd_client *c = s->clients; c && need; c = c->next) {
		uint64_t slack;

		if (!askable(c, except, now))
			continue;
		slack = c->lease > c->resident ? c->lease - c->resident : 0;
		if (slack > giveable(c))
			slack = giveable(c);
		if (!slack)
			continue;
		sbd_send_reclaim(s, c, slack);
		need = need > slack ? need - slack : 0;
	}
	/* Then the idlest clients' pages. */
	while (need) {
		struct sbd_client *idlest = NULL;

		for (struct sbd_client *c = s->clients; c; c = c->next) {
			if (!askable(c, except, now))
				continue;
			if (!idlest || c->active_ms < idlest->active_ms)
				idlest = c;
		}
		if (!idlest)
			break;
		{
			uint64_t ask = need < giveable(idlest)
					       ? need
					       : giveable(idlest);

			ask = (ask + 4095) & ~(uint64_t)4095;
			sbd_send_reclaim(s, idlest, ask);
			need = need > ask ? need - ask : 0;
		}
	}
}

/* Is anything still being asked for, that could free pages? */
static bool reclaim_pending(const struct sbd_server *s,
			    const struct sbd_client *except)
{
	uint64_t now = sbd_now_ms();

	for (const struct sbd_client *c = s->clients; c; c = c->next)
		if (c != except && c->reclaim_asked &&
		    now - c->reclaim_ms < RECLAIM_RETRY_MS * 2)
			return true;
	return false;
}

void sbd_budget_lease(struct sbd_server *s, struct sbd_client *c,
		      uint32_t seq, uint64_t min, uint64_t want)
{
	c->active_ms = sbd_now_ms();
	if (c->parked) {
		/* One request at a time per client: the old one is stale
		 * (the client timed out and asked again). */
		c->parked = false;
	}
	if (try_grant(s, c, seq, min, want))
		return;
	/* The cache's blocks nobody maps first: a prefix is worth less
	 * than a process's pages. */
	sbd_cache_shrink(s, min - room(s, c));
	if (try_grant(s, c, seq, min, want))
		return;
	reclaim(s, c, min - room(s, c));
	if (!reclaim_pending(s, c)) {
		if (s->verbose)
			sbd_log("client %u (pid %d): %llu KiB refused at once "
				"(room %llu KiB, nobody to ask)", c->id,
				(int)c->pid, (unsigned long long)(min >> 10),
				(unsigned long long)(room(s, c) >> 10));
		s->refused++;
		sbd_reply(s, c, seq, -ENOMEM, 0, 0, 0, -1);
		return;
	}
	c->parked = true;
	c->park_seq = seq;
	c->park_min = min;
	c->park_want = want;
	c->park_ms = sbd_now_ms();
}

/* Grant parked requests, oldest first, while they fit. */
static void grant_parked(struct sbd_server *s)
{
	for (;;) {
		struct sbd_client *oldest = NULL;

		for (struct sbd_client *c = s->clients; c; c = c->next)
			if (c->parked &&
			    (!oldest || c->park_ms < oldest->park_ms))
				oldest = c;
		if (!oldest || !try_grant(s, oldest, oldest->park_seq,
					  oldest->park_min, oldest->park_want))
			return;
		oldest->parked = false;
	}
}

void sbd_budget_return(struct sbd_server *s, struct sbd_client *c,
		       uint64_t bytes, bool answer)
{
	c->lease -= bytes;
	s->used -= bytes;
	c->reclaim_got += bytes;
	if (answer) {
		if (s->verbose)
			sbd_log("client %u (pid %d): gave %llu KiB of the %llu "
				"asked", c->id, (int)c->pid,
				(unsigned long long)(c->reclaim_got >> 10),
				(unsigned long long)(c->reclaim_asked >> 10));
		/* Dry only when it gave nothing since it was first asked
		 * (asked again meanwhile, it counts on: sbd_send_reclaim).
		 * A part of what was asked is often all a client has free
		 * at that instant (its ready thread was preparing the pages
		 * its eviction freed, seen under load), and it may be asked
		 * again at once: marking it dry refused everyone for DRY_MS
		 * while it had pages. One that gives is no longer dry. */
		if (!c->reclaim_got && c->reclaim_asked)
			c->dry_ms = sbd_now_ms();
		else if (c->reclaim_got)
			c->dry_ms = 0;
		c->reclaim_asked = 0;
		c->reclaim_got = 0;
	}
	grant_parked(s);
}

void sbd_budget_drop(struct sbd_server *s, struct sbd_client *c)
{
	s->used -= c->lease;
	c->lease = 0;
	s->floors -= c->floor;
	c->floor = 0;
	c->parked = false;
	grant_parked(s);
}

void sbd_budget_check(struct sbd_server *s)
{
	uint64_t taken = s->used + sbd_budget_reserved(s, NULL);

	if (taken <= s->max_bytes)
		return;
	/* Cold cached blocks first, then the clients above their
	 * floors. */
	taken -= sbd_cache_shrink(s, taken - s->max_bytes);
	if (taken > s->max_bytes)
		reclaim(s, NULL, taken - s->max_bytes);
}

/* The floors of uid's clients but except. */
static uint64_t floors_of(const struct sbd_server *s, uid_t uid,
			  const struct sbd_client *except)
{
	uint64_t sum = 0;

	for (const struct sbd_client *c = s->clients; c; c = c->next)
		if (c != except && c->uid == uid)
			sum += c->floor;
	return sum;
}

/*
 * A floor is granted only from room that is free now (cold cache blocks
 * nobody maps are dropped for it): no process's pages are taken for a
 * reservation, and one that could not be backed (pages that cannot be
 * evicted, cache blocks someone maps) is never promised. --max-floor
 * bounds a user's clients together, so that more connections reserve no
 * more.
 */
void sbd_budget_floor(struct sbd_server *s, struct sbd_client *c,
		      uint32_t seq, uint64_t bytes)
{
	uint64_t need = bytes > c->lease ? bytes - c->lease : 0;
	const char *why = NULL;
	int err = 0;

	if (floors_of(s, c->uid, c) + bytes > s->max_floor) {
		err = -EPERM;
		why = "its user's floors would pass --max-floor";
	} else if (need > sbd_budget_room(s, c)) {
		sbd_cache_shrink(s, need - sbd_budget_room(s, c));
		if (need > sbd_budget_room(s, c)) {
			err = -ENOSPC;
			why = "that much of the budget is not free";
		}
	}
	if (err) {
		sbd_log("client %u (pid %d, uid %u): a floor of %llu KiB "
			"refused: %s (--max-floor %llu KiB, the user's "
			"floors %llu KiB, free %llu KiB of %llu KiB)", c->id,
			(int)c->pid, (unsigned)c->uid,
			(unsigned long long)(bytes >> 10), why,
			(unsigned long long)(s->max_floor >> 10),
			(unsigned long long)(floors_of(s, c->uid, c) >> 10),
			(unsigned long long)(sbd_budget_room(s, c) >> 10),
			(unsigned long long)(s->max_bytes >> 10));
		sbd_reply(s, c, seq, err, 0, 0, 0, -1);
		return;
	}
	s->floors = s->floors - c->floor + bytes;
	c->floor = bytes;
	if (s->verbose)
		sbd_log("client %u (pid %d): floor %llu KiB", c->id,
			(int)c->pid, (unsigned long long)(bytes >> 10));
	sbd_reply(s, c, seq, 0, bytes, 0, 0, -1);
}

void sbd_budget_tick(struct sbd_server *s)
{
	uint64_t now = sbd_now_ms();

	grant_parked(s);
	for (struct sbd_client *c = s->clients; c; c = c->next) {
		if (!c->parked)
			continue;
		if (now - c->park_ms < PARK_MS && !reclaim_pending(s, c) &&
		    room(s, c) < c->park_min)
			reclaim(s, c, c->park_min - room(s, c));	/* others */
		if (now - c->park_ms >= PARK_MS || !reclaim_pending(s, c)) {
			/* Everyone answered, or too slowly: nothing more
			 * will come. Granted if it fits now (an older
			 * request that does not kept it waiting in
			 * grant_parked), else refused. */
			c->parked = false;
			if (try_grant(s, c, c->park_seq, c->park_min,
				      c->park_want))
				continue;
			if (s->verbose)
				sbd_log("client %u (pid %d): %llu KiB refused "
					"after %llu ms (room %llu KiB)", c->id,
					(int)c->pid,
					(unsigned long long)(c->park_min >> 10),
					(unsigned long long)(now - c->park_ms),
					(unsigned long long)(room(s, c) >> 10));
			s->refused++;
			sbd_reply(s, c, c->park_seq, -ENOMEM, 0, 0, 0, -1);
		}
	}
	sbd_budget_check(s);
}
