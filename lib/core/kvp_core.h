/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_core: what every part of kvproxyd shares. It includes the pieces
 * that stand on their own — logging (kvp_log.h), configuration
 * (kvp_config.h), the wire protocol between nodes (kvp_wire.h), statistics
 * (kvp_stats.h), host topology (kvp_topo.h) — and holds the region table,
 * transfers, client channels, workers, the transport interface and the
 * node.
 *
 * Threading: the configuration and the region table are written only on the
 * main lcore; worker lcores read regions through kvp_region_get()/put(),
 * which is safe against concurrent removal (refcount + state re-check).
 * Statistics are written by one lcore each and read by the main lcore with
 * relaxed loads.
 *
 * Memory: everything here is sized from the configuration at start-up.
 */
#ifndef KVP_CORE_H
#define KVP_CORE_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvp_rings.h"

#include "kvp_config.h"
#include "kvp_log.h"
#include "kvp_stats.h"
#include "kvp_topo.h"
#include "kvp_wire.h"

/** Smallest power of two >= @p v (1 for 0). */
static inline uint32_t
kvp_pow2_ceil(uint32_t v)
{
	uint32_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

/* ---- region table ---- */

enum kvp_region_state {
	KVP_REGION_FREE = 0,
	KVP_REGION_ACTIVE,
	KVP_REGION_DEAD, /**< removed; unmapped once refs drops to 0 */
};

struct kvp_region {
	_Atomic uint64_t key;
	_Atomic uint32_t state;
	_Atomic uint32_t refs; /**< in-flight operations using the mapping */
	uint8_t *base;
	uint64_t len;
	uint32_t owner; /**< client id */
	uint32_t flags;
	void *map; /**< what to munmap (page-aligned start) */
	size_t map_len;
	int device;   /**< CUDA device of a GPU region */
	void *cookie; /**< GPU import, released through kvp_memops->release */
	void *xp;     /**< transport registration (RDMA memory regions), NULL if none */
	/* Only while kvp_region_hooks->on_add runs (host regions; -1 otherwise): */
	int fd;		   /**< the client's file */
	uint64_t fd_off;   /**< file offset of map */
};

/**
 * Registration hooks a transport installs to register regions with its
 * hardware once, when they are added (main lcore), not on the data path.
 */
struct kvp_region_hooks {
	void *arg;
	/**
	 * A region is about to be published. Failure is not fatal: the hook
	 * leaves r->xp NULL and the region's data takes the staging path.
	 */
	void (*on_add)(void *arg, struct kvp_region *r, uint32_t slot);
	/** The region is about to be unmapped (no transfer uses it any more). */
	void (*on_remove)(void *arg, struct kvp_region *r, uint32_t slot);
};

/** Registration counters a transport keeps (main lcore writes, readers relaxed). */
struct kvp_mr_stats {
	uint64_t regs;	   /**< memory regions registered */
	uint64_t failures; /**< regions left unregistered (their data is staged) */
	uint64_t dmabuf;   /**< of regs, GPU memory through dma-buf */
	uint64_t peermem;  /**< of regs, GPU memory through peer memory (device pointer) */
	uint64_t deregs;
	uint64_t reg_ns;   /**< total time spent registering */
	uint64_t reg_max_ns;
	char last_error[128];
};

/** Hooks in force (NULL: none). Set before the first region is added. */
extern const struct kvp_region_hooks *kvp_region_hooks;

/** Internal region flag: data moves through the staging pool, never zero-copy. */
#define KVP_REGION_F_STAGE 0x80000000u
/** Internal region flag: base is a device address (never dereferenced by the CPU). */
#define KVP_REGION_F_GPU 0x40000000u
#define KVP_REGION_F_INTERNAL (KVP_REGION_F_STAGE | KVP_REGION_F_GPU)

/**
 * Copies between a region and host memory, for regions that must be
 * staged (GPU memory; host memory when tcp.stage_host is set). The host
 * implementation is memcpy; the CUDA one replaces it without touching the
 * transports.
 */
struct kvp_memops {
	/** Copy [off, off+len) of @p r into @p dst. @return 0 or negative errno */
	int (*to_host)(void *dst, const struct kvp_region *r, uint64_t off, size_t len);
	/**
	 * Start the same copy without waiting (optional): @p dst is valid only
	 * after sync(). Lets many small copies share one wait.
	 * @return 0 or negative errno
	 */
	int (*to_host_async)(void *dst, const struct kvp_region *r, uint64_t off, size_t len);
	/** Wait for every copy this thread started with to_host_async. @return 0 or negative errno */
	int (*sync)(void);
	/** Copy @p len bytes of @p src to [off, off+len) of @p r. @return 0 or negative errno */
	int (*from_host)(const struct kvp_region *r, uint64_t off, const void *src, size_t len);
	/**
	 * 2-D copies (optional; kvp_copy_to_host()/kvp_copy_from_host() loop
	 * over rows without them): @p rows rows of @p width bytes, @p pitch
	 * bytes apart in the region, packed in host memory. The async one
	 * follows to_host_async's rules.
	 * @return 0 or negative errno
	 */
	int (*to_host_2d_async)(void *dst, const struct kvp_region *r, uint64_t off, uint64_t pitch,
				size_t width, size_t rows);
	int (*from_host_2d)(const struct kvp_region *r, uint64_t off, uint64_t pitch, const void *src,
			    size_t width, size_t rows);
	/** Called once for the whole staging pool at start (e.g. to pin it for DMA). */
	int (*register_pool)(void *base, size_t len);
	/**
	 * Import a client's GPU allocation (KVP_REGION_CUDA_IPC: @p ipc, the
	 * region starting @p offset bytes into it; KVP_REGION_CUDA_VMM: @p fd,
	 * offset 0). NULL where GPU memory is unsupported.
	 * @return 0 with *dptr and *cookie set; -ENODEV, -EINVAL with @p why
	 */
	int (*import)(uint32_t kind, int device, int fd, const uint8_t ipc[64], uint64_t offset,
		      uint64_t len, uint64_t *dptr, void **cookie, char *why, size_t whylen);
	/** Undo import(). */
	void (*release)(void *cookie);
	/**
	 * Export GPU region @p r as a dma-buf for RDMA registration (optional).
	 * @return 0 with *fd (the caller closes it) and *offset of r->base in
	 *   the buffer; negative errno when the driver cannot
	 */
	int (*dmabuf_fd)(const struct kvp_region *r, int *fd, uint64_t *offset);
	/**
	 * Make RDMA writes into GPU memory of @p device visible to the GPU
	 * before the data is reported landed (optional). @return 0 or negative errno
	 */
	int (*flush_writes)(int device);
};

/** Why GPU regions are refused on this node (set at start when CUDA is unusable). */
extern char kvp_gpu_unavailable[160];

/** The memops in force (host memcpy by default). */
extern const struct kvp_memops *kvp_memops;

/**
 * Copy @p rows rows of @p width bytes, @p pitch apart from @p off of @p r,
 * packed into @p dst (a staging buffer): asynchronously where the memops
 * can (then *@p async is set and the copy is valid after kvp_memops->sync()).
 * @return 0 or negative errno
 */
int kvp_copy_to_host(void *dst, const struct kvp_region *r, uint64_t off, uint64_t pitch,
		     uint64_t width, uint64_t rows, bool *async);

/** The reverse: packed @p src to @p rows rows, @p pitch apart. @return 0 or negative errno */
int kvp_copy_from_host(const struct kvp_region *r, uint64_t off, uint64_t pitch, const void *src,
		       uint64_t width, uint64_t rows);

struct kvp_region_table {
	uint32_t size;
	uint32_t used;
	struct kvp_region *slots;
};

/**
 * Allocate a table of @p max regions (max <= 65536).
 *
 * @return 0, -EINVAL, -ENOMEM
 */
int kvp_region_table_init(struct kvp_region_table *t, uint32_t max);

/** Unmap everything and free the table (no lcore may still use it). */
void kvp_region_table_fini(struct kvp_region_table *t);

/**
 * Map [off, off+len) of @p fd and publish it under a new random key (main lcore).
 *
 * @return 0; -EINVAL (empty or overflowing range, fd not mappable);
 *   -EPERM (fd not sealed against shrinking: F_SEAL_SHRINK); -ENOSPC
 *   (table full); -ENOMEM
 */
int kvp_region_add(struct kvp_region_table *t, uint32_t owner, int fd, uint64_t off,
		   uint64_t len, uint32_t flags, uint64_t *key);

/**
 * Publish GPU memory that kvp_memops->import() mapped (main lcore); the
 * region owns @p cookie from now on.
 *
 * @return 0; -ENOSPC (table full)
 */
int kvp_region_add_gpu(struct kvp_region_table *t, uint32_t owner, uint64_t dptr, uint64_t len,
		       int device, void *cookie, uint64_t *key);

/**
 * Remove one region of @p owner (main lcore).
 *
 * @return 0; -ENOENT if @p key is not an active region of @p owner;
 *   -EBUSY if transfers still use it
 */
int kvp_region_remove(struct kvp_region_table *t, uint64_t key, uint32_t owner);

/** Mark every region of @p owner dead (client gone); unmapping is deferred. */
void kvp_region_remove_owner(struct kvp_region_table *t, uint32_t owner);

/** Unmap dead regions nobody uses any more (main lcore, periodically). @return unmapped */
unsigned kvp_region_reap(struct kvp_region_table *t);

/** Regions of @p owner still present (active or dead). */
unsigned kvp_region_count(const struct kvp_region_table *t, uint32_t owner);

/**
 * Look up an active region and take a reference (any lcore).
 *
 * @return the region, or NULL if @p key is unknown or being removed
 */
struct kvp_region *kvp_region_get(struct kvp_region_table *t, uint64_t key);

/** Drop a reference taken by kvp_region_get(). */
static inline void
kvp_region_put(struct kvp_region *r)
{
	/* Pairs with the main lcore's load of refs in reap/remove. */
	atomic_fetch_sub_explicit(&r->refs, 1, memory_order_release);
}

/** True if [off, off+len) lies inside the region and len > 0. */
static inline bool
kvp_region_contains(const struct kvp_region *r, uint64_t off, uint64_t len)
{
	return len > 0 && off <= r->len && len <= r->len - off;
}

/* ---- transfers, client channels, workers ---- */

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
	uint16_t peer;
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
	KVP_XS_ACTIVE,	 /**< owned by the transport */
	KVP_XS_BACKLOG, /**< ended; its completion waits for room in the CQ */
};

/** A transfer in flight on the sending node; slots are preallocated per worker. */
struct kvp_xfer {
	uint32_t idx; /**< slot in the worker's table; low half of the wire tag */
	uint32_t gen; /**< bumped on reuse; high half of the wire tag */
	uint8_t state;
	uint16_t peer;
	int status; /**< first failure seen, KVP_OK otherwise */
	uint16_t detail;  /**< KVP_EINVAL: enum kvp_invalid */
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
};

/** A fence a client set on the transfers landing in its regions (worker-owned). */
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
};

static inline bool
kvp_fence_match(const struct kvp_fence *f, uint32_t owner, uint64_t user_id)
{
	return f->state != KVP_FENCE_FREE && f->owner == owner && (user_id & f->mask) == f->value;
}

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
};

/** Transport capabilities. */
#define KVP_TCAP_HOST_MEM  0x1u /**< moves host memory */
#define KVP_TCAP_GPU_DIRECT 0x2u /**< reads/writes GPU memory without staging */

/**
 * A transport: one instance per worker lcore; every op is called on that
 * lcore except create/destroy.
 */
struct kvp_transport_ops {
	const char *name;
	uint32_t caps;
	/** Create the per-worker instance. @return 0 or negative errno */
	int (*create)(struct kvp_worker *w, void **tctx);
	void (*destroy)(void *tctx);
	/**
	 * Take over handshaken connection @p link (< tcp.connections) of a
	 * peer (fd ownership passes). @return 0 or negative errno
	 */
	int (*attach)(void *tctx, uint16_t peer, uint8_t link, int fd, bool outgoing,
		      uint64_t epoch);
	/**
	 * Queue a transfer. The transport stamps x->ts[KVP_TS_ADMIT] (window and
	 * buffers granted), FIRST and POSTED (first and last byte handed over)
	 * and ACKED as it gets there; completions and histograms are built from them.
	 * @return 0; -ENOTCONN (no connection to the peer)
	 */
	int (*post)(void *tctx, struct kvp_xfer *x);
	/** Move data and reap completions. @return units of work done (0 = idle) */
	int (*progress)(void *tctx);
	/** Abort a transfer; the transport ends it through kvp_worker_xfer_end(). */
	void (*cancel)(void *tctx, struct kvp_xfer *x, int status);
	/** Before sleeping: flush submissions; @return an fd that turns readable on work */
	int (*sleep_fd)(void *tctx);
	/** Close every connection to @p peer (main lcore asked). */
	void (*disconnect)(void *tctx, uint16_t peer);
	/**
	 * Fence @p f was set (and is asked again each timer tick while
	 * pending): from now on refuse its transfers' bytes, and stop or
	 * revoke what is under way. With @p force (timeouts.peer_ms passed),
	 * make landing impossible at any cost (e.g. tear down queue pairs).
	 * @return landings of matching transfers that may still happen (0: none)
	 */
	uint32_t (*fence)(void *tctx, const struct kvp_fence *f, bool force);
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
};

struct kvp_msg {
	int type;
	uint16_t peer;
	uint8_t link;
	bool outgoing;
	int fd;
	uint64_t epoch;
	struct kvp_chan *chan;
	uint32_t client;  /**< CANCEL: client id */
	uint64_t user_id; /**< CANCEL */
	char reason[128];
};

struct kvp_worker {
	unsigned idx;
	unsigned lcore;
	const struct kvp_config *cfg;
	struct kvp_region_table *regions;
	const struct kvp_transport_ops *tops;
	void *tctx;
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
	struct kvp_seg *segs; /**< nxfers * max_segments */
	struct kvp_sqe_seg *sqe_scratch;

	struct kvp_chan **chans; /**< by client slot */
	uint32_t nchans;
	uint32_t chan_slots;
	uint8_t peer_links[KVP_PEERS_MAX]; /**< outgoing connections up per peer */

	uint64_t next_timer_ns;
	volatile bool quit;
	bool draining; /**< set by the main lcore: refuse new submissions (relaxed) */
	struct kvp_fence *fences; /**< cfg->max_fences slots */
	uint32_t nfences;	  /**< slots in use */
	uint32_t fences_pending;  /**< of them, not yet known to hold */
	struct kvp_worker_stats stats;
	struct kvp_hist *hist; /**< [peer * KVP_HP_MAX + phase], one row per configured peer */
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
		    struct kvp_region_table *regions, const struct kvp_transport_ops *tops,
		    struct rte_mempool *msg_pool);

/** Free what kvp_worker_init() allocated. */
void kvp_worker_fini(struct kvp_worker *w);

/** Handle messages from the main lcore. @return messages handled */
int kvp_worker_inbox(struct kvp_worker *w);

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

/** Client slot of a client id (index into kvp_worker.chans). */
static inline uint32_t
kvp_client_slot(uint32_t id)
{
	return id & 0xffffu;
}

/* ---- the node: control plane on the main lcore ---- */

/** KVP_LINK_UP: no dial in progress; every link up or waiting for a retry. */
enum kvp_peer_link {
	KVP_LINK_DOWN = 0,
	KVP_LINK_CONNECTING, /**< TCP connect in progress */
	KVP_LINK_HELLO,	     /**< connected, handshake in progress */
	KVP_LINK_UP,	     /**< handed to a worker */
};

/**
 * Control-plane state of one configured peer. Its links are dialled one at
 * a time, lowest missing first; the out_* dial state is the current one's.
 */
struct kvp_peer {
	int out_state; /**< enum kvp_peer_link, the dial in progress */
	int out_fd;
	uint8_t out_link;  /**< link being dialled */
	uint8_t links;	   /**< links kept: ours, or fewer if the peer accepts fewer */
	uint32_t out_up;   /**< bit per outgoing link handed to the worker */
	uint32_t in_up;	   /**< bit per link of the peer's connections to us */
	uint64_t epoch;
	uint64_t deadline_ns;  /**< connect/handshake deadline */
	uint64_t next_try_ns;  /**< reconnect time while down */
	uint32_t backoff_ms;
	uint8_t nonce[32];     /**< our challenge */
	uint32_t have;	       /**< handshake bytes received */
	alignas(8) uint8_t buf[sizeof(struct kvp_wire_hdr) + sizeof(struct kvp_wire_hello)];
	uint64_t connects;
	uint64_t disconnects;
	uint64_t handshake_failures;
	char last_error[96];
};

/** An accepted peer connection whose HELLO has not arrived yet. */
struct kvp_pending_conn {
	int fd;
	int peer;      /**< -1 until the HELLO named a configured peer */
	uint8_t link;
	bool auth;     /**< HELLO answered; waiting for the peer's proof */
	uint64_t epoch;
	uint8_t nonce[32]; /**< our challenge */
	uint8_t their_nonce[32];
	uint64_t deadline_ns;
	uint32_t have;
	alignas(8) uint8_t buf[sizeof(struct kvp_wire_hdr) + sizeof(struct kvp_wire_hello)];
};

enum kvp_client_state {
	KVP_CL_FREE = 0,
	KVP_CL_OPEN,	  /**< connected, no channel yet */
	KVP_CL_ACTIVE,	  /**< channel handed to a worker */
	KVP_CL_DETACHING, /**< socket closed; waiting for the worker to let go */
};

/** Control-plane state of one client. */
struct kvp_client_conn {
	int state; /**< enum kvp_client_state */
	uint32_t id;
	uint16_t gen;
	int sock;
	int32_t pid;
	unsigned worker;
	struct kvp_chan *chan;
	int pending_fd; /**< fd received ahead of its message */
	uint64_t hello_deadline_ns; /**< an OPEN client must say HELLO by then */
	uint32_t rlen;
	uint8_t rbuf[KVP_CTRL_MSGLEN];
};

#define KVP_ADMIN_CONNS	  16
#define KVP_ADMIN_LINEMAX (64u << 10)
#define KVP_PENDING_MAX	  16

/** One admin connection (main lcore); see admin_conn.c for its bounds. */
struct kvp_admin_conn {
	int fd;
	uint32_t len;	     /**< bytes of unanswered input in buf */
	char *buf;	     /**< KVP_ADMIN_LINEMAX bytes, allocated at start */
	uint64_t active_ns;  /**< accepted or last answered: the idle bound runs from here */
	uint64_t partial_ns; /**< first byte of the unfinished request line; 0 = none */
	char *out;	     /**< reply bytes the socket has not taken yet (malloc'd), or NULL */
	size_t out_len;
	size_t out_off;
	uint64_t out_ns; /**< since when out waits for the client to read */
};

/** Admin connections cut off, by reason (main lcore). */
struct kvp_admin_stats {
	uint64_t accepted;
	uint64_t refused;  /**< KVP_ADMIN_CONNS already open */
	uint64_t slow;	   /**< a request line or a reply took longer than timeouts.admin_ms */
	uint64_t idle;	   /**< nothing to do for timeouts.admin_idle_ms */
	uint64_t too_long; /**< a request line longer than KVP_ADMIN_LINEMAX */
	uint64_t no_fds;   /**< refused: kvproxyd had no file descriptor left */
};

/** An RDMA port as found at start (filled by the application from its probe). */
struct kvp_rail_info {
	char dev[64];
	uint8_t port;
	bool active;
	int numa_node; /**< -1 if unknown */
	char pci[32];  /**< "" if unknown */
	int rail;      /**< index among the RDMA transport's rails, -1 if it does not use the port */
	int gid_index; /**< GID the transport uses on it, -1 if none */
	int mtu;       /**< active MTU in bytes */
	bool paused;   /**< rail_pause: no new writes go through it */
};

#define KVP_RAILS_MAX 16

#define KVP_GPUS_MAX 16

/** A GPU as the CUDA driver describes it (filled at start, for doctor). */
struct kvp_gpu_info {
	int ordinal;
	char name[96];
	char pci[32];
	int dmabuf;	    /**< dma-buf export supported */
	int gpudirect_rdma; /**< GPUDirect RDMA supported */
	uint64_t total_mem;
};

struct kvp_node {
	struct kvp_config cfg;
	uint64_t start_ns;
	int epfd;
	int evfd; /**< workers ring it after posting to their outbox */
	int client_lfd;
	int admin_lfd;
	int peer_lfd;
	int lock_fd;
	struct kvp_region_table regions;
	const struct kvp_transport_ops *tops;
	struct rte_mempool *msg_pool;
	struct kvp_worker *workers;
	unsigned nworkers;
	unsigned next_worker;
	struct kvp_client_conn *clients;
	uint32_t nclients;
	struct kvp_peer peers[KVP_PEERS_MAX];
	struct kvp_pending_conn pending[KVP_PENDING_MAX];
	struct kvp_admin_conn admin[KVP_ADMIN_CONNS];
	struct kvp_admin_stats admin_stats;
	uint64_t bad_handshakes;
	uint64_t auth_failures;
	uint64_t clients_refused_cred;	/**< client connections from a uid/group not allowed */
	uint64_t clients_refused_limit; /**< client connections beyond limits.max_clients */
	uint64_t clients_refused_fds;	/**< clients refused for want of file descriptors */
	uint64_t client_handshake_failures; /**< HELLOs refused or missing (protocol, rings, time) */
	uint64_t ring_violations;	/**< clients disconnected for breaking the ring protocol */
	uint64_t client_accept_pauses;	/**< times the client listener left epoll (no fds) */
	int spare_fd;			/**< given up to accept (and refuse) a connection when out of fds */
	bool client_accept_paused;
	uint64_t client_accept_retry_ns;
	bool admin_accept_paused;
	uint64_t admin_accept_retry_ns;
	uint64_t next_reap_ns;
	volatile bool quit;

	/* Observability (main lcore). */
	bool draining;
	uint64_t drain_since_ns;
	uint64_t next_stats_ns;	 /**< next periodic write of cfg.stats_file */
	uint64_t stats_writes;	 /**< stats files written */
	uint64_t stats_write_errors;
	char *stats_buf;	 /**< KVP_STATS_TEXT_MAX bytes, allocated at start */
	char transport_why[256]; /**< why this transport was chosen (for doctor) */
	const char *cores_why;	 /**< where the lcores run and why (for doctor), or NULL */
	int rdma_ports;		 /**< RDMA probe result: ports found, or -errno */
	char rdma_why[160];	 /**< the probe's reason when it found nothing */
	unsigned nrails;
	struct kvp_rail_info rails[KVP_RAILS_MAX];
	/** Pause or resume an RDMA rail (NULL without the RDMA transport). @return 0, -ENOENT */
	int (*rail_pause)(unsigned rail, bool pause);
	/** RDMA memory registrations so far (main lcore; NULL without RDMA). */
	const struct kvp_mr_stats *mr_stats;
	int cuda_driver;	 /**< CUDA driver version, 0 if none */
	int ngpus;		 /**< GPUs found, or -errno (kvp_gpu_unavailable says why) */
	struct kvp_gpu_info gpus[KVP_GPUS_MAX];
};

/** Size of the Prometheus text buffer (stats file, admin "stats" with format prometheus). */
#define KVP_STATS_TEXT_MAX (4u << 20)

/**
 * Build the node: sockets, region table, message pool, workers and their
 * transports (not launched). Call after rte_eal_init().
 *
 * @param err  receives the reason on failure
 * @return 0 or negative errno
 */
int kvp_node_init(struct kvp_node *n, const struct kvp_config *cfg,
		  const struct kvp_transport_ops *tops, unsigned nworkers, char *err,
		  size_t errlen);

/**
 * Open files a node with this configuration may need at once: per client
 * its socket, completion eventfd and one fd it sent ahead of its request;
 * per peer both directions' links and a dial; admin connections, pending
 * peer handshakes, and a reserve for the EAL, the transports and the CUDA
 * driver.
 */
uint64_t kvp_node_fd_need(const struct kvp_config *cfg);

/**
 * Settle RLIMIT_NOFILE before start: with @p raise, lift the soft limit to
 * the hard one (never lowers it); then compare with kvp_node_fd_need().
 *
 * @param msg  receives what was found (and done), or why it is not enough
 * @return 0; -EMFILE if the limit cannot cover the configuration
 */
int kvp_node_fd_limit(const struct kvp_config *cfg, bool raise, char *msg, size_t msglen);

/**
 * Out of file descriptors: give up the node's spare one and accept one
 * connection on @p lfd, to refuse it with the reason (the caller closes it).
 * @return the connection, or -1 (no spare, or nothing to accept)
 */
int kvp_node_accept_spare(struct kvp_node *n, int lfd);

/** Take the spare descriptor back after kvp_node_accept_spare(). @return false if none was left */
bool kvp_node_spare_restore(struct kvp_node *n);

/** Run the control plane for up to @p timeout_ms (one epoll round plus timers). */
void kvp_node_poll(struct kvp_node *n, int timeout_ms);

/** Ask every worker to stop (their loops return). */
void kvp_node_stop_workers(struct kvp_node *n);

/** Tear down after the workers have returned. */
void kvp_node_fini(struct kvp_node *n);

/** Post a message to a worker and ring its doorbell. @return 0, -ENOBUFS */
int kvp_node_send(struct kvp_node *n, unsigned worker, struct kvp_msg *m);

/** A message from the pool (main lcore). NULL if the pool is empty. */
struct kvp_msg *kvp_node_msg(struct kvp_node *n, int type);

/* client_srv.c */
void kvp_client_accept(struct kvp_node *n);
/** Watch the client listener again after a pause for want of file descriptors. */
void kvp_client_accept_resume(struct kvp_node *n);
void kvp_client_input(struct kvp_node *n, uint32_t slot);
void kvp_client_drop(struct kvp_node *n, struct kvp_client_conn *c, const char *why);
void kvp_client_gone(struct kvp_node *n, struct kvp_chan *ch);
void kvp_client_broken(struct kvp_node *n, struct kvp_chan *ch, const char *why);
void kvp_client_timers(struct kvp_node *n, uint64_t now);

/* peer.c */
int kvp_peer_listen(struct kvp_node *n, char *err, size_t errlen);
void kvp_peer_accept(struct kvp_node *n);
void kvp_peer_pending_input(struct kvp_node *n, uint32_t slot);
void kvp_peer_out_event(struct kvp_node *n, uint16_t peer, uint32_t events);
void kvp_peer_conn_down(struct kvp_node *n, uint16_t peer, uint8_t link, bool outgoing,
			const char *why);
void kvp_peer_timers(struct kvp_node *n, uint64_t now);
void kvp_peer_close_all(struct kvp_node *n);
const char *kvp_peer_state_name(const struct kvp_node *n, uint16_t peer);

/* admin_conn.c */
void kvp_admin_accept(struct kvp_node *n);
/** Input or output room on admin connection @p slot (epoll @p events). */
void kvp_admin_event(struct kvp_node *n, uint32_t slot, uint32_t events);
/** Close admin connections past their bounds (timeouts.admin_ms, admin_idle_ms). */
void kvp_admin_timers(struct kvp_node *n, uint64_t now);
void kvp_admin_close_all(struct kvp_node *n);
/** Admin connections open now. */
unsigned kvp_admin_open(const struct kvp_node *n);

/* admin.c */

/**
 * Handle one JSON-RPC request line; the reply (one line, no newline) is
 * written to @p out. A result that does not fit becomes a "reply too large"
 * error with the request's id. Used by the admin socket and by tests.
 *
 * @return reply length (at most @p outlen); 0 when the request was a
 *   notification, or when @p outlen cannot hold even the error reply
 */
size_t kvp_admin_handle(struct kvp_node *n, const char *line, size_t len, char *out,
			size_t outlen);

/** Render every metric in Prometheus text format. @return bytes written (truncated at outlen) */
size_t kvp_stats_prometheus(const struct kvp_node *n, char *out, size_t outlen);

/**
 * Write the Prometheus text to cfg.stats_file (temporary file + rename, the
 * node_exporter textfile convention). The temporary file gets an
 * unpredictable name in the target's directory and is created with O_EXCL |
 * O_NOFOLLOW; rename() replaces the target name itself, never what a link
 * there points to. Main lcore.
 *
 * @return 0; -ENOENT if no file is configured; negative errno on I/O failure
 */
int kvp_stats_write_file(struct kvp_node *n);

/** Run the doctor's checks and log them (warnings for misplaced lcores); main lcore. */
void kvp_node_log_doctor(struct kvp_node *n);

/** Start (true) or stop (false) draining: new submissions fail with "shutdown". */
void kvp_node_set_draining(struct kvp_node *n, bool on);

/* epoll tags: kind << 32 | index */
enum kvp_ep_kind {
	KVP_EP_EVFD = 1,
	KVP_EP_CLIENT_LISTEN,
	KVP_EP_CLIENT,
	KVP_EP_ADMIN_LISTEN,
	KVP_EP_ADMIN,
	KVP_EP_PEER_LISTEN,
	KVP_EP_PEER_PENDING,
	KVP_EP_PEER_OUT,
};

static inline uint64_t
kvp_ep_tag(enum kvp_ep_kind k, uint32_t idx)
{
	return ((uint64_t)k << 32) | idx;
}

/** Add @p fd to the node's epoll set. @return 0 or negative errno */
int kvp_node_watch(struct kvp_node *n, int fd, uint32_t events, enum kvp_ep_kind k, uint32_t idx);

/** Change the events watched on @p fd (tag as given). @return 0 or negative errno */
int kvp_node_rewatch(struct kvp_node *n, int fd, uint32_t events, enum kvp_ep_kind k,
		     uint32_t idx);

/** Remove @p fd from the epoll set. */
void kvp_node_unwatch(struct kvp_node *n, int fd);

#endif /* KVP_CORE_H */
