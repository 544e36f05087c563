/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_worker: the data plane of a worker lcore: client channels, transfers
 * and their segments, the planner, fences, the slowest-transfers table, the
 * messages exchanged with the main lcore, and the worker itself.
 *
 * Threading: a worker and everything it owns is touched only on its lcore,
 * except where a field says otherwise (relaxed reads by the main lcore).
 * Workers reach each other only through messages on their cross-worker
 * rings (kvp_worker_xsend()): a client belongs to one worker, which runs
 * its transfers from submission to DONE; bytes for its regions may land on
 * any worker, whose landing notice travels to the client's worker.
 *
 * Memory: every table is sized from the configuration at start-up; nothing
 * here allocates afterwards.
 */
#ifndef KVP_WORKER_H
#define KVP_WORKER_H

#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvp_config.h"
#include "kvp_log.h"
#include "kvp_region.h"
#include "kvp_rings.h"
#include "kvp_stats.h"
#include "kvp_wire.h"

struct kvp_worker;
struct rte_ring;
struct rte_mempool;

/**
 * A validated segment: @p count blocks of @p len bytes, block i at
 * src_off + i * src_stride and dst_off + i * dst_stride (count 1: one
 * contiguous range, strides equal to len). A strided segment whose blocks
 * touch on both sides is stored as one contiguous block. src holds a region
 * reference until the transfer ends.
 */
struct kvp_seg {
	struct kvp_region *src;
	uint64_t src_off;
	uint64_t dst_key;
	uint64_t dst_off;
	uint64_t len;
	uint64_t count;
	uint64_t src_stride;
	uint64_t dst_stride;
};

/** Payload bytes of a segment. */
static inline uint64_t
kvp_seg_bytes(const struct kvp_seg *s)
{
	return s->len * s->count;
}

/** Segments @p a then @p b can move as one: same regions, both ranges contiguous. */
static inline bool
kvp_seg_contiguous(const struct kvp_seg *a, const struct kvp_seg *b)
{
	return a->count == 1 && b->count == 1 && a->src == b->src &&
	       a->src_off + a->len == b->src_off && a->dst_key == b->dst_key &&
	       a->dst_off + a->len == b->dst_off;
}

/** Timestamps kept per transfer (kvp_mono_ns()); 0 = not reached. */
enum kvp_ts {
	KVP_TS_SUBMIT = 0, /**< client's submit_ns */
	KVP_TS_PICKUP,	   /**< taken from the submission ring (a slot was free) */
	KVP_TS_ADMIT,	   /**< the transport granted window and buffers (first frame queued) */
	KVP_TS_FIRST,	   /**< first byte handed to the transport (kernel took the first frame) */
	KVP_TS_POSTED,	   /**< last byte handed to the transport */
	KVP_TS_ACKED,	   /**< the destination acknowledged every byte */
	KVP_TS_DONE,	   /**< completion delivered to the client (or dropped: client gone) */
	KVP_TS_MAX
};

/**
 * Phases kept in histograms, per peer. Sending side: consecutive,
 * non-overlapping intervals between the timestamps above (QUEUE .. DELIVER
 * add up to TOTAL). Receiving side: RX_RECV and RX_DELIVER.
 */
enum kvp_hphase {
	KVP_HP_QUEUE = 0, /**< submit -> pickup */
	KVP_HP_ADMIT,	  /**< pickup -> admitted */
	KVP_HP_FIRST,	  /**< admitted -> first byte posted */
	KVP_HP_SEND,	  /**< first byte -> last byte posted */
	KVP_HP_WIRE,	  /**< last byte posted -> acknowledged */
	KVP_HP_DELIVER,	  /**< acknowledged -> completion delivered */
	KVP_HP_TOTAL,	  /**< submit -> completion delivered */
	KVP_HP_RX_RECV,	  /**< receiver: first byte received -> last byte landed (END) */
	KVP_HP_RX_DELIVER, /**< receiver: landed -> landing notice delivered */
	KVP_HP_MAX
};

#define KVP_HP_TX_MAX KVP_HP_RX_RECV

/** Name of a histogram phase ("queue", "wire", "rx_receive", ...). */
const char *kvp_hphase_name(int ph);

/** Slowest transfers kept per worker, with their timestamps. */
#define KVP_SLOWEST_N 32

/** One ended transfer in the slowest table (written under its seqlock). */
struct kvp_slow {
	uint32_t seq; /**< odd while the worker rewrites the entry */
	uint32_t client;
	uint64_t user_id;
	uint64_t tag;
	uint64_t bytes;
	uint64_t deadline_ns;
	uint64_t total_ns; /**< submit (or pickup) -> done */
	uint64_t ts[KVP_TS_MAX];
	uint32_t nseg;
	uint16_t peer; /**< the peer's handle (kvp_peer_handle()): a reused slot does not match */
	int16_t status;
};

struct kvp_slowest {
	struct kvp_slow e[KVP_SLOWEST_N];
	uint32_t used;
	uint32_t min_i;	      /**< entry with the smallest total */
	uint64_t oldest_done; /**< earliest TS_DONE among the entries */
};

struct kvp_xfer;

/**
 * Offer an ended transfer to the slowest table (writer lcore). It enters if
 * the table has room, or if it is slower than the fastest entry, or if an
 * entry is older than @p window_ns (which it then replaces).
 */
void kvp_slowest_offer(struct kvp_slowest *t, const struct kvp_xfer *x, uint64_t total_ns,
		       uint64_t now, uint64_t window_ns);

/**
 * Consistent copy of entry @p i (reader lcore).
 *
 * @return true if the entry is in use and was copied without a concurrent write
 */
bool kvp_slowest_read(const struct kvp_slowest *t, unsigned i, struct kvp_slow *out);

enum kvp_xfer_state {
	KVP_XS_FREE = 0,
	KVP_XS_ACTIVE,	 /**< owned by the transport (or waiting for its peer: KVP_XFER_TP_WAIT) */
	KVP_XS_BACKLOG, /**< ended; its completion waits for room in the CQ */
};

/** kvp_xfer.tp of a transfer no transport owns yet: it waits for its new peer's first link. */
#define KVP_XFER_TP_WAIT 0xffu

/** kvp_xfer.peer before the transfer's handle named an open peer slot. */
#define KVP_PEER_NONE 0xffffu

/** The handle clients name peer slot @p slot of generation @p gen by. */
static inline uint16_t
kvp_peer_handle(uint32_t slot, uint32_t gen)
{
	return (uint16_t)(slot | (gen << KVP_PEER_SLOT_BITS));
}

/** The slot a handle names (its generation may be stale). */
static inline uint32_t
kvp_peer_handle_slot(uint32_t handle)
{
	return handle & (KVP_PEERS_MAX - 1);
}

/** A transfer in flight on the sending node; slots are preallocated per worker. */
struct kvp_xfer {
	uint32_t idx; /**< slot in the worker's table; low half of the wire tag */
	uint32_t gen; /**< bumped on reuse; high half of the wire tag */
	uint8_t state;
	uint8_t tp; /**< the transport that owns it (index into kvp_worker.tp), or KVP_XFER_TP_WAIT */
	uint16_t peer;	 /**< peer slot, KVP_PEER_NONE until the handle named an open one */
	uint16_t handle; /**< the peer as the client named it (echoed in the completion) */
	int status; /**< first failure seen, KVP_OK otherwise */
	uint16_t detail;  /**< KVP_EINVAL: enum kvp_invalid; KVP_EPEER, KVP_ENOPEER: kvp_peer_why */
	uint32_t bad_seg; /**< KVP_EINVAL: the segment at fault */
	struct kvp_chan *chan; /**< NULL once the client has gone */
	uint32_t client;       /**< submitting client's id (kept when chan goes) */
	uint64_t user_id;
	uint64_t bytes;
	uint32_t nseg;
	struct kvp_seg *segs;
	uint64_t deadline_ns;
	uint64_t ts[KVP_TS_MAX];
	struct kvp_xfer *next; /**< backlog / transport queue link */
	/* Transport-private progress; the planner's cursor is (t_seg, t_blk, t_off). */
	uint32_t t_seg;
	uint32_t t_frames; /**< frames of this transfer not yet on the wire */
	uint64_t t_blk;	   /**< block of segment t_seg */
	uint64_t t_off;	   /**< byte in that block */
	uint8_t t_state;
	uint16_t t_conn; /**< the connection that carries it */
	bool t_acked;	 /**< the receiver acknowledged its last frame */
	bool waited;	 /**< counted in its client's waited (a slot or a staging buffer) */
};

static inline uint64_t
kvp_xfer_tag(const struct kvp_xfer *x)
{
	return ((uint64_t)x->gen << 32) | x->idx;
}

/* ---- the planner: how a transfer is cut into wire operations ---- */

/**
 * One piece of a transfer for one wire operation: @p nblk blocks of @p len
 * bytes, block i at src_off + i * src_stride of seg->src and dst_off + i *
 * dst_stride of seg->dst_key. nblk 1: one contiguous range of len bytes
 * (possibly several coalesced contiguous segments).
 */
struct kvp_piece {
	const struct kvp_seg *seg; /**< the (first) segment it comes from */
	uint64_t src_off;
	uint64_t dst_off;
	uint64_t len;
	uint64_t nblk;
	uint64_t src_stride;
	uint64_t dst_stride;
};

/** kvp_plan_next() flag: only pieces whose destination is one contiguous range. */
#define KVP_PLAN_DST_CONTIG 0x1u

/**
 * Cut the next piece of @p x, at most @p limit bytes, and advance its
 * cursor (t_seg, t_blk, t_off). A contiguous range is cut at @p limit; a
 * whole segment absorbs the contiguous segments that follow it while they
 * fit. Blocks of a strided segment that are smaller than @p limit go
 * together, at most @p max_blocks of them (and, with KVP_PLAN_DST_CONTIG,
 * only where the destination blocks touch); larger blocks are cut like
 * contiguous ranges.
 *
 * @return false when nothing is left to cut
 */
bool kvp_plan_next(struct kvp_xfer *x, uint64_t limit, uint64_t max_blocks, unsigned flags,
		   struct kvp_piece *p);

/** Payload bytes of @p x the planner has not cut yet. */
uint64_t kvp_plan_left(const struct kvp_xfer *x);

/* ---- fences: landings a client refused ---- */

enum kvp_fence_state {
	KVP_FENCE_FREE = 0,
	KVP_FENCE_PENDING, /**< a transport may still land matching bytes */
	KVP_FENCE_HOLD,	   /**< nothing can land; completion delivered (or owed), still refusing */
	KVP_FENCE_DYING,   /**< expired or its client gone; the other workers are still to be told */
};

/**
 * A fence a client set on the transfers landing in its regions. The
 * client's worker owns it; every other worker of the node holds a mirror
 * (its own links land bytes into the client's regions too), set up and torn
 * down by cross-worker messages, which says when nothing can land through
 * that worker's links any more.
 */
struct kvp_fence {
	uint8_t state;	 /**< enum kvp_fence_state */
	bool owed;	 /**< its completion waits for room in the CQ */
	bool forced;	 /**< timeouts.peer_ms passed: the transports were told to force it */
	uint8_t status;	 /**< of its completion: KVP_OK, or KVP_ETIMEDOUT if it could not hold */
	uint32_t owner;	 /**< the fencing client */
	uint64_t value;	 /**< user_id & mask == value */
	uint64_t mask;
	uint64_t id;	       /**< the client's fence_id, echoed in the completion */
	uint64_t started_ns;
	uint64_t expires_ns;   /**< forgotten after */
	uint64_t dropped;      /**< bytes refused */
	uint32_t xid;	       /**< serial on its owning worker: names it in cross-worker messages */
	uint8_t origin;	       /**< the owning worker (a mirror's, or this worker's own) */
	bool mirror;	       /**< a copy of another worker's fence */
	bool local_clear;      /**< own: this worker's transports can land nothing more of it */
	bool clear_owed;       /**< mirror: its CLEAR waits for room towards the owner */
	uint64_t waiting;      /**< own: other workers whose CLEAR has not come (bit per worker) */
	uint64_t del_owed;     /**< own, DYING: other workers not yet told to drop their mirror */
};

static inline bool
kvp_fence_match(const struct kvp_fence *f, uint32_t owner, uint64_t user_id)
{
	return (f->state == KVP_FENCE_PENDING || f->state == KVP_FENCE_HOLD) &&
	       f->owner == owner && (user_id & f->mask) == f->value;
}

/* ---- several workers: links, clients and the messages between workers ---- */

/**
 * The worker that owns link @p link of a peer, in either direction: links
 * go round the workers, so each worker holds tcp.connections links of
 * every peer it sends to, and the links a peer dials spread over the
 * workers that receive.
 */
static inline unsigned
kvp_link_worker(unsigned link, unsigned nworkers)
{
	return link % nworkers;
}

/** The place of link @p link among its worker's links of that peer (0 carries the peer control channel). */
static inline unsigned
kvp_link_slot(unsigned link, unsigned nworkers)
{
	return link / nworkers;
}

/** Messages between two workers (one SPSC rte_ring per ordered pair, by value). */
enum kvp_xmsg_type {
	KVP_XM_LANDED = 1, /**< a transfer landed in a region of one of your clients */
	KVP_XM_FENCE_SET,  /**< owner -> others: hold a mirror of this fence */
	KVP_XM_FENCE_DEL,  /**< owner -> others: drop the mirror (fence expired or client gone) */
	KVP_XM_FENCE_CLEAR, /**< mirror -> owner: nothing of it can land through my links any more */
	KVP_XM_LOST,	    /**< worker -> owner: notices for a client lost (full ring) */
};

struct kvp_xmsg {
	uint8_t type;	  /**< enum kvp_xmsg_type */
	uint8_t from;	  /**< the sending worker */
	uint16_t peer;	  /**< LANDED: the peer it came from */
	uint32_t owner;	  /**< the client */
	uint64_t user_id; /**< LANDED: the transfer's; FENCE_SET: the fence's value */
	uint64_t key;	  /**< LANDED: the first destination region; FENCE_SET: the mask */
	uint64_t bytes;	  /**< LANDED: payload; FENCE_CLEAR: refused; LOST: notices */
	uint64_t t0;	  /**< LANDED: first byte in; FENCE_SET: when it was set */
	uint64_t t1;	  /**< LANDED: last byte landed; FENCE_SET: when it expires */
	uint32_t nseg;	  /**< LANDED */
	uint32_t xid;	  /**< FENCE_*: the fence's serial on its owner */
	uint32_t flags;	  /**< FENCE_CLEAR: KVP_XM_F_FORCED */
	uint16_t handle;  /**< LANDED: the peer's handle (the slot's generation) where it landed */
	uint16_t rsvd;
};

#define KVP_XM_F_FORCED 0x1u /**< the mirror had to force its transports */

static_assert(sizeof(struct kvp_xmsg) == 64, "one cache line per cross-worker message");

/** Landing notices lost towards one worker for one client slot. */
struct kvp_xlost {
	uint32_t owner; /**< the client (its generation: a reused slot starts over) */
	uint32_t count;
};

/**
 * Admission counts of one client (its worker writes, the main lcore reads
 * relaxed): transfers given a slot, those that had to wait for a slot or a
 * staging buffer first, and those refused with "no-buffers" after waiting
 * limits.admission_ms.
 */
struct kvp_chan_stats {
	uint64_t admitted;
	uint64_t waited;
	uint64_t refused;
};

/** A connected client as its worker sees it. */
struct kvp_chan {
	uint32_t id; /**< client id (slot | generation << 16) */
	int32_t pid;
	void *mem;
	size_t len;
	struct kvp_ring sq;
	struct kvp_ring cq;
	int notify_fd; /**< eventfd the client blocks on */
	uint32_t inflight;
	bool broken; /**< protocol violation; the main lcore disconnects it */
	bool broken_sent;
	char broken_why[128]; /**< which index or entry was impossible, with its value */
	struct kvp_xfer *backlog_head;
	struct kvp_xfer *backlog_tail;
	/* Worker-owned from CHAN_ADD on: */
	struct kvp_worker *w;	      /**< the worker polling it */
	uint32_t act_idx;	      /**< its place in w->act */
	bool head_waited;	      /**< the transfer at the SQ head has been counted as waiting */
	bool notify_owed;	      /**< a completion was posted; the eventfd is rung after the pass */
	struct kvp_chan *notify_next; /**< w->notify list */
	struct kvp_chan_stats stats;
};

/** Transports a worker may run, in the order it offers them each transfer. */
#define KVP_TP_MAX 4

struct kvp_transport_ops;

/** One of a worker's transports. */
struct kvp_tp {
	const struct kvp_transport_ops *ops;
	void *tctx;
};

/**
 * A transport that uses the channel (RDMA). It gets the peer control
 * frames (kvp_wire_is_ctl(): checked, payload whole), the ACKs of transfers
 * it owns, every ABORT, and the channel's connection events.
 */
struct kvp_pchan_sub {
	void *arg;
	/** @return 0, or negative to fail the connection (the frame makes no sense) */
	int (*on_frame)(void *arg, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
			const void *payload);
	/** The channel's connection to @p peer came up, or is going down (before its frames stop). */
	void (*on_conn)(void *arg, uint16_t peer, bool outgoing, bool up);
};

/** Messages between the main lcore and a worker (rte_ring of pointers). */
enum kvp_msg_type {
	KVP_MSG_CHAN_ADD = 1, /**< main -> worker: poll this channel */
	KVP_MSG_CHAN_DEL,     /**< main -> worker: client gone; reply CHAN_GONE */
	KVP_MSG_CHAN_GONE,    /**< worker -> main: channel no longer referenced */
	KVP_MSG_CHAN_BROKEN,  /**< worker -> main: client broke the ring protocol */
	KVP_MSG_CONN_ADD,     /**< main -> worker: handshaken connection */
	KVP_MSG_CONN_DOWN,    /**< worker -> main: connection closed */
	KVP_MSG_QUIT,
	KVP_MSG_CANCEL, /**< main -> worker: cancel (client, user_id) from the admin socket */
	KVP_MSG_PEER_OPEN,   /**< main -> worker: peer slot in use (handle, why, until_ns, node_id) */
	KVP_MSG_PEER_WHY,    /**< main -> worker: why it has no link now; its node id once learned */
	KVP_MSG_PEER_CLOSE,  /**< main -> worker: drain the peer, then close it; reply PEER_CLOSED */
	KVP_MSG_PEER_CLOSED, /**< worker -> main: nothing of the peer left here; its rows are zero */
	KVP_MSG_TYPES
};

struct kvp_msg {
	int type;
	uint16_t peer; /**< peer slot */
	uint8_t link;
	bool outgoing;
	int fd;
	uint64_t epoch;
	struct kvp_chan *chan;
	uint32_t client;  /**< CANCEL: client id */
	uint64_t user_id; /**< CANCEL */
	uint16_t handle;  /**< PEER_OPEN */
	uint8_t why;	  /**< PEER_OPEN, PEER_WHY: enum kvp_peer_why */
	uint64_t until_ns; /**< PEER_OPEN: transfers wait for a first link until then */
	char node_id[KVP_NODE_ID_MAX]; /**< PEER_OPEN, PEER_WHY ("": unchanged or not known) */
	char reason[128];
};

enum kvp_worker_peer_state {
	KVP_WP_FREE = 0,
	KVP_WP_OPEN,
	KVP_WP_CLOSING, /**< refuses new transfers; closes once those in flight ended */
};

/**
 * A worker's view of one peer slot (its lcore only), opened and closed by
 * the main lcore's messages (wpeer.c).
 */
struct kvp_worker_peer {
	uint8_t state;	     /**< enum kvp_worker_peer_state */
	uint8_t links;	     /**< outgoing connections up on this worker */
	uint8_t why;	     /**< enum kvp_peer_why: why transfers fail while no link is up */
	bool close_due;	     /**< CLOSING and nothing in flight: close at the next tick */
	uint16_t handle;     /**< what clients name it by */
	uint32_t inflight;   /**< transfers to it that have not ended */
	uint64_t wait_until_ns; /**< a transfer finding no link waits for one until then */
	struct kvp_xfer *wait_head; /**< transfers waiting for the first link, in order */
	struct kvp_xfer *wait_tail;
	char node_id[KVP_NODE_ID_MAX]; /**< for log lines; "" until known */
};

struct kvp_worker {
	unsigned idx;
	unsigned lcore;
	unsigned nworkers;	 /**< workers of the node (kvp_workers_join()) */
	struct kvp_worker *all;	 /**< the node's workers, [0, nworkers) */
	/** By client slot: the worker that owns the client (written by the main lcore before
	 *  the client's channel or regions exist; read relaxed). */
	const uint8_t *client_worker;
	struct rte_ring **xin;	 /**< [from]: messages from each other worker (NULL for itself) */
	int sleeping;		 /**< set while blocked: a cross-worker sender rings evfd */
	const struct kvp_config *cfg;
	struct kvp_region_table *regions;
	struct kvp_tp tp[KVP_TP_MAX]; /**< its transports, in the order transfers are offered */
	unsigned ntp;
	int conn_tp;		      /**< the one that takes the peers' connections, -1: none */
	int pchan_tp;		      /**< the one that provides the peer control channel, -1: none */
	struct kvp_pchan_sub pchan_sub; /**< who uses it (on_frame NULL: nobody) */
	struct rte_ring *inbox;	 /**< from the main lcore */
	struct rte_ring *outbox; /**< to the main lcore */
	struct rte_mempool *msg_pool; /**< struct kvp_msg, shared with the main lcore */
	int evfd;		 /**< doorbell: clients and the main lcore write it */
	int main_evfd;		 /**< the main lcore's doorbell, rung after an outbox post */

	struct kvp_xfer *xfers;
	uint32_t nxfers;
	uint32_t *free_idx;
	uint32_t nfree;
	uint32_t nbacklog; /**< of the slots in use, transfers ended and waiting for CQ room */
	uint64_t done_ns;  /**< a transfer's DONE last reached its client's CQ */
	struct kvp_seg *segs; /**< nxfers * max_segments */
	struct kvp_sqe_seg *sqe_scratch;

	struct kvp_chan **chans; /**< by client slot */
	uint32_t nchans;
	uint32_t chan_slots;
	struct kvp_worker_peer *peers; /**< cfg->max_peers slots */
	uint32_t npeers;               /**< slots (limits.max_peers) */
	uint32_t nwaiting;             /**< transfers waiting for a peer's first link */
	uint32_t closes_due;           /**< peers with close_due set */
	struct kvp_chan **act;   /**< the nchans channels, densely: admission turns go round it */
	uint32_t rr;             /**< the act[] index whose turn is next */
	struct kvp_chan *notify; /**< channels whose eventfd is owed a ring */

	uint64_t next_timer_ns;
	volatile bool quit;
	bool draining; /**< set by the main lcore: refuse new submissions (relaxed) */
	/*
	 * Landing notices lost on a full ring towards another worker, by
	 * [worker * chan_slots + client slot]: sent on as LOST once there is
	 * room, and before any CLEAR, so that the client's CQ overflow counts
	 * them ahead of a fence's completion.
	 */
	struct kvp_xlost *xlost;
	uint64_t xlost_to; /**< a bit per worker that xlost owes a LOST */
	struct kvp_fence *fences; /**< cfg->max_fences * nworkers slots: its own and mirrors */
	uint32_t nfences;	  /**< slots in use */
	uint32_t nfences_own;	  /**< of them, its own clients' (at most cfg->max_fences) */
	uint32_t fences_pending;  /**< of them, not yet known to hold */
	uint32_t fence_xid;	  /**< last serial given to one of its fences */
	struct kvp_worker_stats stats;
	struct kvp_hist *hist; /**< [peer slot * KVP_HP_MAX + phase], limits.max_peers rows */
	struct kvp_slowest slowest;
};

/** Histogram of @p phase for @p peer on worker @p w. */
static inline struct kvp_hist *
kvp_worker_hist(const struct kvp_worker *w, uint16_t peer, int phase)
{
	return &w->hist[(size_t)peer * KVP_HP_MAX + (size_t)phase];
}

/**
 * Allocate a worker's tables from the configuration (start-up only).
 *
 * @return 0, -ENOMEM
 */
int kvp_worker_init(struct kvp_worker *w, unsigned idx, const struct kvp_config *cfg,
		    struct kvp_region_table *regions, struct rte_mempool *msg_pool);

/**
 * Make @p n initialised workers one node's (start-up only, before their
 * transports): each learns the others, gets a ring from each other worker
 * and a fence table with room for mirrors of theirs.
 *
 * @param client_worker  by client slot, the worker owning the client (the caller's)
 * @return 0, -ENOMEM
 */
int kvp_workers_join(struct kvp_worker *all, unsigned n, const uint8_t *client_worker);

/**
 * Create the worker's transports, in the order transfers are offered to
 * them (start-up only).
 *
 * @return 0, or the first create() error (those created are destroyed)
 */
int kvp_worker_transports(struct kvp_worker *w, const struct kvp_transport_ops *const *ops,
			  unsigned n);

/** Destroy its transports and free what kvp_worker_init() allocated. */
void kvp_worker_fini(struct kvp_worker *w);

/** Move data on every transport and reap their completions. @return work done */
int kvp_worker_progress(struct kvp_worker *w);

/** Before sleeping: the fds of its transports to wait on (up to @p max). @return how many */
unsigned kvp_worker_sleep_fds(struct kvp_worker *w, int *fds, unsigned max);

/** Handle messages from the main lcore and from the other workers. @return messages handled */
int kvp_worker_inbox(struct kvp_worker *w);

/**
 * Post a message to worker @p to (wakes it if it sleeps). @return 0;
 * -ENOBUFS if the ring towards it is full (counted in stats.xmsg_lost)
 */
int kvp_worker_xsend(struct kvp_worker *w, unsigned to, const struct kvp_xmsg *m);

/**
 * Send worker @p to the LOST counts owed to it. @return true when none is
 * owed any more; false while its ring is full
 */
bool kvp_worker_xlost_flush(struct kvp_worker *w, unsigned to);

/** Messages the ring towards worker @p to can take now. */
unsigned kvp_worker_xroom(const struct kvp_worker *w, unsigned to);
/** Transfers in flight: slots taken and not ended (backlogged ones have ended). */
static inline uint32_t
kvp_worker_inflight(const struct kvp_worker *w)
{
	return w->nxfers - w->nfree - w->nbacklog;
}

/**
 * True within @p window_ns of a DONE reaching its client while nothing is in
 * flight on this worker: the poll loop spins then instead of yielding (the
 * client's next submission is likely to follow at once).
 */
bool kvp_worker_spin_after_done(const struct kvp_worker *w, uint64_t now, uint64_t window_ns);

/** Pick up submissions from every channel. @return SQ entries consumed */
int kvp_worker_poll_chans(struct kvp_worker *w);

/** Fail transfers past their deadline, retry CQ backlogs. @return work done */
int kvp_worker_timers(struct kvp_worker *w, uint64_t now);

/** Before sleeping: arm every channel's wakeup. @return false if work arrived */
bool kvp_worker_prepare_sleep(struct kvp_worker *w);

/** After sleeping. */
void kvp_worker_finish_sleep(struct kvp_worker *w);

/** The active transfer with wire tag @p tag, or NULL (ended, reused, or no such slot). */
static inline struct kvp_xfer *
kvp_worker_xfer_of(struct kvp_worker *w, uint64_t tag)
{
	uint32_t idx = (uint32_t)tag;

	if (idx >= w->nxfers)
		return NULL;
	struct kvp_xfer *x = &w->xfers[idx];
	if (x->state != KVP_XS_ACTIVE || kvp_xfer_tag(x) != tag)
		return NULL;
	return x;
}

/** Slow path of kvp_worker_fenced(). */
bool kvp_worker_fence_drop(struct kvp_worker *w, uint32_t owner, uint64_t user_id,
			   uint64_t bytes, unsigned xfers);

/**
 * Transport check before landing bytes of transfer @p user_id in a region of
 * client @p owner: true if a fence refuses them; they are then counted as
 * dropped (@p bytes, and @p xfers transfers: 1 the first time a transfer is
 * refused). Costs a load when no fence is set.
 */
static inline bool
kvp_worker_fenced(struct kvp_worker *w, uint32_t owner, uint64_t user_id, uint64_t bytes,
		  unsigned xfers)
{
	return w->nfences && kvp_worker_fence_drop(w, owner, user_id, bytes, xfers);
}

/**
 * Transport callback: transfer @p x waits for a resource the transport
 * shares among the worker's clients (staging buffers). Counted once per
 * transfer in its client's "waited".
 */
static inline void
kvp_worker_xfer_waited(struct kvp_xfer *x)
{
	if (x->waited)
		return;
	x->waited = true;
	if (x->chan)
		KVP_STAT_ADD(x->chan->stats.waited, 1);
}

/** Transport callback: a transfer has ended (acked or failed). */
void kvp_worker_xfer_end(struct kvp_worker *w, struct kvp_xfer *x, int status);

/**
 * Transport callback: a transfer from @p peer landed in region @p dst_key of
 * client @p owner; its first byte arrived at @p first_ns (kvp_mono_ns()).
 */
void kvp_worker_landed(struct kvp_worker *w, uint16_t peer, uint32_t owner, uint64_t user_id,
		       uint64_t dst_key, uint64_t bytes, uint32_t nseg, uint64_t first_ns);

/** Transport callback: a connection closed; the main lcore reconnects. */
void kvp_worker_conn_down(struct kvp_worker *w, uint16_t peer, uint8_t link, bool outgoing,
			  const char *reason);

/**
 * Open peer slot @p slot on a worker that is not running yet (start-up; at
 * run time the main lcore sends KVP_MSG_PEER_OPEN instead).
 */
void kvp_worker_peer_open(struct kvp_worker *w, const struct kvp_msg *m);

/** Client slot of a client id (index into kvp_worker.chans). */
static inline uint32_t
kvp_client_slot(uint32_t id)
{
	return id & 0xffffu;
}

#endif /* KVP_WORKER_H */
