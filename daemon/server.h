/* SPDX-License-Identifier: MIT */
/* sparsebufd's state: the budget, the clients (server.c, budget.c). */
#ifndef SBD_SERVER_H
#define SBD_SERVER_H

#include "loop.h"

struct sbd_msg;

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

struct sbd_heap {
	uint32_t id;
	uint64_t bytes;
};

struct sbd_client {
	struct sbd_client *next;
	struct sbd_server *srv;
	int fd;
	uint32_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	bool hello;		/* said HELLO */
	bool control;		/* sparsebufctl: no budget */
	bool hugetlb;		/* its heaps are huge pages (SBD_HELLO_HUGETLB) */
	uint64_t page_size;
	uint64_t lease;		/* bytes it may hold: counted in the budget */
	uint64_t floor;		/* bytes reserved for it (SBD_FLOOR) */
	uint64_t resident, used, spilled;	/* as it reported */
	uint64_t active_ms;	/* its last lease request or growth */
	/* A RECLAIM sent and not answered yet. */
	uint64_t reclaim_asked, reclaim_ms;
	uint64_t reclaim_got;	/* returned since it was first asked */
	uint64_t dry_ms;	/* it last gave nothing when asked: not again soon */
	/* A LEASE request waiting for other clients to give pages back. */
	bool parked;
	uint32_t park_seq;
	uint64_t park_min, park_want, park_ms;
	struct sbd_heap *heaps;
	size_t nheaps, heap_cap;
	struct sbd_pins *pins;	/* cache.c: cache pages it maps */
	uint32_t nfilling;	/* cache.c: blocks it is filling */
};

struct sbd_server {
	struct sbd_loop *loop;
	int listen_fd;
	bool own_socket;	/* we bound it: unlink at exit */
	const char *socket_path;
	uint64_t max_bytes;
	uint64_t max_floor;	/* --max-floor: the largest floor granted */
	uint64_t floors;	/* the clients' floors, summed */
	uint64_t page_size;
	bool hugetlb;		/* --hugetlb: the cache's heaps are huge pages */
	gid_t group;		/* --group, else (gid_t)-1 */
	uid_t self_uid;
	struct sbd_client *clients;
	unsigned nclients;
	uint64_t used;		/* sum of leases and cache_bytes */
	uint64_t cache_bytes;	/* pages of the machine-wide cache */
	struct sbd_cache *cache;	/* cache.c */
	uint64_t cache_hits, cache_misses, cache_dropped;
	bool spill;		/* --spill-dir given: */
	int spill_fd;		/* an unlinked file in it */
	uint64_t cache_spilled;	/* bytes of cached blocks on disk */
	uint32_t next_id, next_heap_id;
	uint64_t start_ms;
	uint64_t reclaims, refused, clients_total;
	bool verbose;
};

/* server.c */
int sbd_server_listen(struct sbd_server *s);
/* Serve fd, a client's connected socket (non-blocking), from now on: the
 * new client, or NULL (too many clients, no memory) and fd is closed. */
struct sbd_client *sbd_server_adopt(struct sbd_server *s, int fd, pid_t pid,
				    uid_t uid, gid_t gid);
void sbd_server_close(struct sbd_server *s);
int sbd_reply(struct sbd_server *s, struct sbd_client *c, uint32_t seq,
	      int64_t err, uint64_t a, uint64_t b, uint64_t cc, int fd);
void sbd_send_reclaim(struct sbd_server *s, struct sbd_client *c,
		      uint64_t bytes);
void sbd_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Where sbd_log writes when not to syslog; NULL: stderr. */
extern FILE *sbd_log_file;

/* budget.c: leases, reclaims, parked requests. */
void sbd_budget_lease(struct sbd_server *s, struct sbd_client *c,
		      uint32_t seq, uint64_t min, uint64_t want);
void sbd_budget_return(struct sbd_server *s, struct sbd_client *c,
		       uint64_t bytes, bool answer);
/* c is gone: its lease back to the budget. */
void sbd_budget_drop(struct sbd_server *s, struct sbd_client *c);
/* Over the budget (a new daemon took back clients holding more than
 * it allows): ask for the difference. */
void sbd_budget_check(struct sbd_server *s);
/* Parked requests: grant what fits, refuse what waited too long. */
void sbd_budget_tick(struct sbd_server *s);
/* A FLOOR request: c's floor set to bytes, or refused. */
void sbd_budget_floor(struct sbd_server *s, struct sbd_client *c,
		      uint32_t seq, uint64_t bytes);
/* The floors of clients other than except, in the part they do not
 * hold. */
uint64_t sbd_budget_reserved(const struct sbd_server *s,
			     const struct sbd_client *except);
/* Bytes that may be given to c now (NULL: to the machine-wide cache):
 * the budget less what is used and the floors others hold unused. */
uint64_t sbd_budget_room(const struct sbd_server *s,
			 const struct sbd_client *c);

/* cache.c: the machine-wide prefix cache. */
/* A cache message from c (payload: m->len bytes); false: drop c. */
bool sbd_cache_serve(struct sbd_server *s, struct sbd_client *c,
		     const struct sbd_msg *m, const void *payload,
		     const char **why);
void sbd_cache_list(struct sbd_server *s, struct sbd_client *c,
		    const struct sbd_msg *m);
/* c is gone: its pins dropped, blocks it was filling forgotten. */
void sbd_cache_drop_client(struct sbd_server *s, struct sbd_client *c);
/* Drop least recently used blocks nobody pins until need bytes are
 * free; returns the bytes freed. */
uint64_t sbd_cache_shrink(struct sbd_server *s, uint64_t need);
uint64_t sbd_cache_blocks(const struct sbd_server *s);
void sbd_cache_free(struct sbd_server *s);
/* Its invariants (pages, pins, blocks, bytes): NULL, or what is wrong. */
const char *sbd_cache_check(const struct sbd_server *s);

#endif
