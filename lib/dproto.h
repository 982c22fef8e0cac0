/* SPDX-License-Identifier: MIT */
/*
 * The wire protocol between sparsebufd and its clients (the library's
 * client pools, sparsebufctl). Shared by lib/ and daemon/; docs/daemon.md
 * describes it for people.
 *
 * One AF_UNIX SOCK_SEQPACKET connection per client pool: message
 * boundaries are kept, a message is one header (struct sbd_msg) and an
 * optional payload, and a descriptor travels as SCM_RIGHTS beside the
 * message that announces it (hdr.nfds). Every integer is in host order:
 * the daemon and its clients are on one machine.
 *
 * Requests that want an answer carry seq != 0 and get one SBD_REPLY with
 * the same seq (err 0 or -errno). The daemon's own requests (SBD_RECLAIM)
 * carry seq 0 and are answered by a later SBD_RETURN.
 */
#ifndef SPARSEBUF_DPROTO_H
#define SPARSEBUF_DPROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBD_MAGIC 0x31444253u	/* "SBD1" */
#define SBD_VERSION 1u
#define SBD_MAX_PAYLOAD (64u << 10)
#define SBD_MAX_FDS 1
/* Sizes are bytes, multiples of 4 KiB, below 2^48 (256 TiB). */
#define SBD_MAX_BYTES ((uint64_t)1 << 48)

enum sbd_type {
	/* client -> daemon */
	SBD_HELLO = 1,	/* a: version, b: bytes held already (a reconnect),
			 * c: page size, d: flags (SBD_HELLO_*). Reply: a:
			 * client id, b: the daemon's max_bytes, c: its page
			 * size (its cache's; 0: no cache for this kind of
			 * heap, SBD_HELLO_HUGETLB), d: the lease it counts
			 * for the client (what b claimed, at most
			 * max_bytes). */
	SBD_LEASE,	/* a: bytes needed at least, b: bytes wanted, c/d:
			 * resident/used bytes. Reply a: bytes granted (>= a),
			 * or err -ENOMEM when nothing anywhere could be freed
			 * in time. a = 0: what is free now, maybe nothing,
			 * with neither a reclaim nor a wait (a reserve's
			 * floor, sb_pool_reserve). */
	SBD_RETURN,	/* a: bytes given back, b: 1 in answer to a
			 * RECLAIM, c/d: resident/used. No reply. */
	SBD_REPORT,	/* a: spilled bytes, c/d: resident/used. No reply. */
	SBD_HEAP,	/* a: bytes. Reply: a: heap id, one descriptor: a
			 * memfd of that size sealed against resizing. */
	SBD_HEAP_FREE,	/* a: heap id (every page punched). No reply. */
	SBD_STATUS,	/* Reply: payload struct sbd_status, then
			 * struct sbd_client_info[status.nclients]. */
	/* daemon -> client */
	SBD_RECLAIM,	/* a: bytes the budget needs back. */
	SBD_REPLY,	/* the answer to the request with the same seq */
	/* client -> daemon: the machine-wide prefix cache (daemon/cache.c).
	 * A block is opaque to the daemon: a chain key (which names the
	 * block and everything before it), its parent's key, its depth, its
	 * tokens (int32) and npages pages of the daemon's cache heaps, each
	 * named by a page reference (SBD_PREF). Blocks are per uid. */
	SBD_CACHE_PUT,	/* a: key, b: parent key, c: depth, d: npages,
			 * payload: int32 tokens. Reply a: npages, payload:
			 * uint64 page refs, pinned for the client, the block
			 * being filled (found by nobody) until CACHE_DONE;
			 * err -EEXIST (held or being filled), -ENOENT (no
			 * parent), -ENOSPC (no room in the budget). */
	SBD_CACHE_DONE,	/* a: key, b: 1 filled (findable from now on), 0
			 * abandoned (dropped with what follows). Reply: err
			 * 0. */
	SBD_CACHE_GET,	/* a: key, b: parent key, c: depth. Reply a: npages,
			 * b: tokens, payload: int32 tokens then uint64 page
			 * refs (8-byte aligned), pinned for the client; err
			 * -ENOENT. */
	SBD_CACHE_HEAP,	/* a: cache heap id. Reply a: bytes, one
			 * descriptor: the heap (the client's uid's only). */
	SBD_CACHE_UNPIN,	/* a: n, payload: n uint64 page refs, one pin
				 * each. No reply. */
	SBD_CACHE_MODEL,	/* a: a chain's root key, payload: the model
				 * id (for listings). No reply. */
	SBD_CACHE_LIST,	/* Reply: payload struct sbd_cache_entry[], one per
			 * cached prefix (a block without children), the
			 * most recently used first. */
	/* client -> daemon, right after HELLO (and again after a
	 * reconnection): the bytes of the budget reserved for this client
	 * (its floor; 0: none). Never taken back below it, and never leased
	 * to anyone else while it holds less. Reply: err 0; -EPERM (above
	 * the daemon's --max-floor), -ENOSPC (the floors would pass the
	 * budget). */
	SBD_FLOOR,	/* a: bytes, whole pages of the client's */
	SBD_TYPE_END
};

/* A page reference: a cache heap's id and a page index in it. */
#define SBD_PREF(heap, idx) (((uint64_t)(heap) << 32) | (uint32_t)(idx))
#define SBD_PREF_HEAP(r) ((uint32_t)((r) >> 32))
#define SBD_PREF_IDX(r) ((uint32_t)(r))
/* Bounds of a block: tokens and pages (a reply's payload must fit). */
#define SBD_CACHE_MAX_TOKENS 1024u
#define SBD_CACHE_MAX_PAGES 4096u
#define SBD_CACHE_MAX_DEPTH (1u << 24)
#define SBD_CACHE_MODEL_MAX 128u

struct sbd_cache_entry {
	uint64_t root;		/* the chain's root key (model, geometry) */
	uint64_t positions;	/* tokens from the start to its end */
	uint64_t bytes;		/* pages of the whole prefix */
	uint64_t idle_ms;	/* since its last put or get */
	uint32_t uid;
	uint32_t pins;		/* pins on its last block's pages */
	char model[SBD_CACHE_MODEL_MAX];	/* "" if never told */
};

/* HELLO flags */
#define SBD_HELLO_CONTROL 1u	/* sparsebufctl: no budget, status only */
/* The client's heaps are huge pages (SB_POOL_HUGETLB): its HEAP replies
 * are hugetlbfs memfds, its page size a multiple of the huge page size.
 * The HELLO's reply then gives the cache's page size (c) only when the
 * daemon's cache is on huge pages too (sparsebufd --hugetlb), and 0 to
 * every client whose heaps are not of the cache's kind: such a client
 * does not use the cache. */
#define SBD_HELLO_HUGETLB 2u

struct sbd_msg {
	uint32_t magic;		/* SBD_MAGIC */
	uint16_t type;		/* enum sbd_type */
	uint16_t nfds;		/* descriptors that came with it */
	uint32_t seq;		/* request id; 0: no reply wanted */
	uint32_t len;		/* payload bytes after the header */
	int64_t err;		/* SBD_REPLY: 0 or -errno */
	uint64_t a, b, c, d;
};

struct sbd_status {
	uint64_t max_bytes;	/* the machine's budget */
	uint64_t bytes_used;	/* leased to clients (their resident pages
				 * and the reserve they hold) */
	uint64_t bytes_resident;	/* what clients report resident */
	uint64_t bytes_shared;	/* pages of the machine-wide cache */
	uint64_t bytes_spilled;	/* clients' pages on disk */
	uint64_t page_size;
	uint64_t nclients;	/* entries that follow */
	uint64_t uptime_ms;
	uint64_t reclaims;	/* RECLAIM requests sent */
	uint64_t refused;	/* leases answered -ENOMEM */
	uint64_t clients_total;	/* connections served since start */
	uint64_t cache_blocks;	/* blocks of the machine-wide cache */
	uint64_t cache_hits, cache_misses;	/* CACHE_GET answers */
	uint64_t floors;	/* the clients' floors, summed */
	uint64_t max_floor;	/* --max-floor */
	uint64_t flags;		/* SBD_STATUS_* (since 0.3; a daemon before
				 * sends the struct without it) */
};

#define SBD_STATUS_HUGETLB 1u	/* sparsebufd --hugetlb: its cache is on
				 * huge pages */

struct sbd_client_info {
	int32_t pid;
	uint32_t uid;
	uint32_t id;
	uint32_t page_size;
	uint64_t bytes;		/* leased */
	uint64_t resident, used, spilled;
	uint64_t idle_ms;	/* since its last lease or report with growth */
	uint64_t floor;		/* bytes reserved for it (SBD_FLOOR) */
	uint32_t flags;		/* SBD_CLIENT_* (since 0.3, as above) */
	uint32_t reserved;
};

#define SBD_CLIENT_HUGETLB 1u	/* its heaps are huge pages */

/* The structs' sizes before their flags (sparsebufctl reads both). */
#define SBD_STATUS_V1_SIZE offsetof(struct sbd_status, flags)
#define SBD_CLIENT_INFO_V1_SIZE offsetof(struct sbd_client_info, flags)

#define SBD_MAX_CLIENTS_LISTED \
	((SBD_MAX_PAYLOAD - sizeof(struct sbd_status)) / \
	 sizeof(struct sbd_client_info))

/*
 * Check a message as received: n bytes at buf, nfds descriptors beside it,
 * sent by the daemon (from_daemon) or by a client. Fills *m and returns 0,
 * or -EBADMSG (malformed: sizes, magic, unknown type, a field out of
 * range) or -EPROTO (a type that side may not send, descriptors where none
 * belong). The payload follows the header in buf. Semantic checks (does
 * this heap id belong to this client) are the receiver's.
 */
int sbd_msg_check(const void *buf, size_t n, unsigned nfds, bool from_daemon,
		  struct sbd_msg *m);

/* Send m (its len bytes of payload at payload) with fd (>= 0) attached.
 * 0 or -errno. Never raises SIGPIPE. */
int sbd_send(int sock, const struct sbd_msg *m, const void *payload, int fd);

/*
 * Receive one message into buf (cap bytes, at least sizeof(struct
 * sbd_msg) + SBD_MAX_PAYLOAD to never truncate) and the descriptor that
 * came with it (*fd, -1 if none; the caller owns it). Returns the message's
 * size, 0 at end of stream, or -errno (-EAGAIN on a non-blocking socket
 * with nothing to read, -EMSGSIZE for a truncated message or one with too
 * many descriptors, which are closed). A message whose descriptor could
 * not be received (this process at RLIMIT_NOFILE) is returned whole with
 * *fd = -EMFILE.
 */
/* The same without waiting for room (a message that wants no reply, sent
 * under a lock): -EAGAIN when the peer is not reading. */
int sbd_send_nowait(int sock, const struct sbd_msg *m);
int sbd_send_nowait_payload(int sock, const struct sbd_msg *m,
			    const void *payload);

long sbd_recv(int sock, void *buf, size_t cap, int *fd);

const char *sbd_type_name(unsigned type);

/* A heap file: a memfd of bytes, sealed against growing and shrinking
 * (a descriptor that crossed a socket must keep its size). The
 * descriptor, or -errno. Both a pool's own heaps and the daemon's;
 * hugetlb: of the system's default huge pages (MFD_HUGETLB), bytes a
 * multiple of their size. */
int sbd_heap_file(const char *name, uint64_t bytes, bool hugetlb);

/* fd itself, or, when it is 0, 1 or 2, a copy of it at 3 or above; -errno
 * (fd closed) if no copy can be made; a negative fd is passed through.
 * Every descriptor the library or the daemon keeps data behind (heaps,
 * spill, save and counter files, sockets) goes through it. A program that
 * closed its standard descriptors (a daemon leaving its terminal) would
 * otherwise have the next descriptor made take one of them, and the
 * library's log lines (write(2) on stderr), or the program's own output,
 * land in a heap's pages or a file of the disk tier. The low slot gets
 * /dev/null (close-on-exec, so that a program run later sees it closed as
 * before), never a later descriptor of ours. fresh: fd is a new empty file,
 * truncated again after the move: what another thread wrote to the low
 * descriptor meanwhile is dropped. */
int sbd_fd_above_std(int fd, bool fresh);

#endif
