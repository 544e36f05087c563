/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_rings: the client ABI shared between libkvproxy and kvproxyd.
 *
 * A client owns one channel: a shared-memory object created by kvproxyd and
 * handed to the client over the client socket (SCM_RIGHTS). The channel holds
 * a header, a submission ring (SQ, client -> daemon) and a completion ring
 * (CQ, daemon -> client). Both rings are single-producer single-consumer with
 * free-running 32-bit indices masked on use, producer and consumer indices on
 * separate cache lines (the rte_ring layout, reduced to SPSC).
 *
 * Threading: one producer thread and one consumer thread per ring. The
 * kvp_ring handle is process-local: sizes are copied out of shared memory at
 * attach time and never re-read, so a peer scribbling on the header cannot
 * make the other side index outside the slots. Indices read from shared
 * memory are checked on every use (-EPROTO when they are impossible).
 *
 * Memory: the channel belongs to kvproxyd; the client maps it. Nothing here
 * allocates. Layout changes append fields only; KVP_ABI_VERSION changes when
 * they do, and every structure is pinned with static_assert.
 *
 * C++: the header compiles from C++11 on. C++ has no _Atomic before C++23,
 * and C's <stdatomic.h> cannot be mixed with <atomic>, so there the shared
 * indices are plain uint32_t reached through the GCC/Clang __atomic builtins:
 * the same size, alignment and instructions as C11's atomic_*_explicit on
 * these naturally aligned 4-byte fields (the static_asserts below hold in
 * both languages), so the C ABI is the same whichever language a client uses.
 */
#ifndef KVP_RINGS_H
#define KVP_RINGS_H

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#define KVP_ATOMIC_U32		     uint32_t
#define KVP_LOAD_ACQUIRE(p)	     __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define KVP_LOAD_RELAXED(p)	     __atomic_load_n((p), __ATOMIC_RELAXED)
#define KVP_STORE_RELEASE(p, v)	     __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define KVP_STORE_RELAXED(p, v)	     __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define KVP_FENCE_SEQ_CST()	     __atomic_thread_fence(__ATOMIC_SEQ_CST)
#else
#include <stdalign.h>
#include <stdatomic.h>
#define KVP_ATOMIC_U32		     _Atomic uint32_t
#define KVP_LOAD_ACQUIRE(p)	     atomic_load_explicit((p), memory_order_acquire)
#define KVP_LOAD_RELAXED(p)	     atomic_load_explicit((p), memory_order_relaxed)
#define KVP_STORE_RELEASE(p, v)	     atomic_store_explicit((p), (v), memory_order_release)
#define KVP_STORE_RELAXED(p, v)	     atomic_store_explicit((p), (v), memory_order_relaxed)
#define KVP_FENCE_SEQ_CST()	     atomic_thread_fence(memory_order_seq_cst)
static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t) &&
		      alignof(_Atomic uint32_t) == alignof(uint32_t),
	      "C++ sees the ring indices as plain uint32_t");
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_ABI_VERSION	  2u /* 2: fences (KVP_OP_FENCE), strided segments (KVP_OP_SEG2D) */
#define KVP_CHAN_MAGIC	  0x314e414843505643ull /* "CVPCHAN1" little-endian */
#define KVP_CACHE_LINE	  64
#define KVP_SQE_SIZE	  64u
#define KVP_CQE_SIZE	  128u
#define KVP_NODE_ID_MAX	  32 /* including the terminating NUL */
#define KVP_XFER_SEGS_MAX 4096u /* hard ABI bound; the config may lower it */

/** Transfer status carried in completions (0 = success). */
enum kvp_status {
	KVP_OK = 0,
	KVP_EINVAL = 1,	   /**< bad descriptor: unknown region, out of bounds, bad length */
	KVP_ENOBUFS = 2,   /**< no staging buffers / window within admission_timeout */
	KVP_ETIMEDOUT = 3, /**< deadline passed */
	KVP_EPEER = 4,	   /**< peer unreachable, dead, or connection lost */
	KVP_ECANCELED = 5, /**< cancelled by the client or the admin */
	KVP_EREMOTE = 6,   /**< the destination node refused the data (e.g. bad dst key) */
	KVP_ESHUTDOWN = 7, /**< the node is draining or stopping */
	KVP_ENOPEER = 8,   /**< destination peer index is not configured */
	KVP_STATUS_MAX
};

/**
 * Phase durations reported in a completion (nanoseconds); 0 where a phase
 * did not happen (e.g. a transfer that failed before reaching the wire).
 *
 * On DONE completions: QUEUE + ADMIT + POST + WIRE + DELIVER == E2E, and
 * TOTAL == E2E - QUEUE. FIRST is the first part of POST.
 *
 * On LANDED completions (the receiving side) only WIRE (first byte received
 * -> last byte landed here), DELIVER (landed -> notice posted) and TOTAL
 * (first byte received -> notice posted) are set.
 *
 * Values 5..7 were reserved slots of phase_ns[] before; the layout of
 * struct kvp_cqe is unchanged and old clients simply ignore them.
 */
enum kvp_phase {
	KVP_PH_QUEUE = 0, /**< client submit -> daemon pickup */
	KVP_PH_ADMIT,	  /**< pickup -> admitted (window/buffers granted) */
	KVP_PH_POST,	  /**< admitted -> last byte handed to the transport */
	KVP_PH_WIRE,	  /**< last byte posted -> acknowledged by the destination */
	KVP_PH_TOTAL,	  /**< pickup -> completion posted */
	KVP_PH_FIRST,	  /**< admitted -> first byte handed to the transport */
	KVP_PH_DELIVER,	  /**< acknowledged -> completion posted (CQ backlog wait) */
	KVP_PH_E2E,	  /**< client submit -> completion posted */
	KVP_PH_MAX = 8
};

/* ---- submission entries (64 bytes each) ---- */

enum kvp_sqe_op {
	KVP_OP_XFER = 1,   /**< starts a transfer; nseg KVP_OP_SEG entries follow */
	KVP_OP_SEG = 2,	   /**< one segment of the preceding transfer */
	KVP_OP_CANCEL = 3, /**< cancel the in-flight transfer with user_id */
	KVP_OP_FENCE = 4,  /**< fence landings into this client's regions (struct kvp_sqe_fence) */
	KVP_OP_SEG2D = 5,  /**< one strided segment of the preceding transfer (struct kvp_sqe_seg2d) */
};

/** Transfer header; published together with its segments in one enqueue. */
struct kvp_sqe_xfer {
	uint8_t op; /**< KVP_OP_XFER or KVP_OP_CANCEL */
	uint8_t flags;
	uint16_t peer;	     /**< destination peer index (kvp_peer_lookup) */
	uint32_t nseg;	     /**< segment entries that follow */
	uint64_t user_id;    /**< client's transfer id, echoed in the completion */
	uint64_t timeout_ns; /**< relative deadline; 0 = the daemon's default */
	uint64_t submit_ns;  /**< client CLOCK_MONOTONIC at submit, for phase timing */
	uint8_t rsvd[32];
};

/** One segment: bytes [src_off, src_off+len) of src_key land at dst_off of dst_key. */
struct kvp_sqe_seg {
	uint8_t op; /**< KVP_OP_SEG */
	uint8_t rsvd0[7];
	uint64_t src_key;
	uint64_t src_off;
	uint64_t dst_key;
	uint64_t dst_off;
	uint64_t len;
	uint8_t rsvd1[16];
};

/**
 * A strided (2-D) segment: @p count blocks of @p len bytes, block i from
 * src_off + i * src_stride of src_key to dst_off + i * dst_stride of
 * dst_key. The fields shared with struct kvp_sqe_seg sit at its offsets.
 * Strides are at least @p len (blocks never overlap).
 */
struct kvp_sqe_seg2d {
	uint8_t op; /**< KVP_OP_SEG2D */
	uint8_t rsvd0[3];
	uint32_t count; /**< blocks, >= 1 */
	uint64_t src_key;
	uint64_t src_off;
	uint64_t dst_key;
	uint64_t dst_off;
	uint64_t len; /**< bytes per block */
	uint64_t src_stride;
	uint64_t dst_stride;
};

/**
 * Fence: nothing more of the transfers whose user_id matches
 * (user_id & mask) == (value & mask) lands in this client's regions; a
 * KVP_CQE_FENCE completion (user_id = fence_id) says when that holds.
 */
struct kvp_sqe_fence {
	uint8_t op; /**< KVP_OP_FENCE */
	uint8_t rsvd0[3];
	uint32_t hold_ms; /**< keep refusing matching transfers this long; 0 = the daemon's default */
	uint64_t fence_id;
	uint64_t value;
	uint64_t mask; /**< != 0 */
	uint8_t rsvd1[32];
};

static_assert(sizeof(struct kvp_sqe_xfer) == KVP_SQE_SIZE, "SQE ABI");
static_assert(sizeof(struct kvp_sqe_seg2d) == KVP_SQE_SIZE, "SQE ABI");
static_assert(sizeof(struct kvp_sqe_fence) == KVP_SQE_SIZE, "SQE ABI");
static_assert(offsetof(struct kvp_sqe_seg2d, len) == offsetof(struct kvp_sqe_seg, len), "SQE ABI");
static_assert(sizeof(struct kvp_sqe_seg) == KVP_SQE_SIZE, "SQE ABI");
static_assert(offsetof(struct kvp_sqe_seg, src_key) == 8, "SQE ABI");

/* ---- completion entries (128 bytes each) ---- */

enum kvp_cqe_kind {
	KVP_CQE_DONE = 1,   /**< a transfer this client submitted has ended */
	KVP_CQE_LANDED = 2, /**< a transfer into this client's region has landed */
	KVP_CQE_FENCE = 3,  /**< a fence holds: user_id = fence_id, bytes = bytes refused so far */
};

struct kvp_cqe {
	uint8_t kind; /**< enum kvp_cqe_kind */
	uint8_t rsvd0;
	uint16_t peer;	  /**< DONE: destination peer; LANDED: source peer index */
	int32_t status;	  /**< enum kvp_status */
	uint64_t user_id; /**< the submitter's transfer id (also for LANDED) */
	uint64_t bytes;	  /**< payload bytes moved */
	uint64_t dst_key; /**< LANDED: destination region of the first segment */
	uint32_t nseg;
	uint16_t detail; /**< DONE with KVP_EINVAL: enum kvp_invalid, what was wrong; with
			      KVP_EPEER or KVP_ENOPEER: enum kvp_peer_why (0: not said) */
	uint16_t rsvd1;
	uint64_t phase_ns[KVP_PH_MAX];
	uint32_t bad_seg; /**< DONE with KVP_EINVAL: index of the segment at fault */
	uint8_t rsvd2[20];
};

/** Why a transfer was refused with KVP_EINVAL (struct kvp_cqe.detail). */
enum kvp_invalid {
	KVP_INVAL_NONE = 0,
	KVP_INVAL_OP,	  /**< a segment entry is neither KVP_OP_SEG nor KVP_OP_SEG2D */
	KVP_INVAL_LEN,	  /**< zero length */
	KVP_INVAL_DST,	  /**< destination key 0 */
	KVP_INVAL_COUNT,  /**< strided block count 0 or above limits.max_blocks */
	KVP_INVAL_STRIDE, /**< a stride smaller than a block, or count x stride overflows */
	KVP_INVAL_BOUNDS, /**< outside the source region, or the destination range overflows */
	KVP_INVAL_SRC,	  /**< unknown source region, or not this client's */
	KVP_INVAL_NSEG,	  /**< more segments than limits.max_segments */
	KVP_INVAL_MEMORY, /**< the source region's memory went away under the send (a hole) */
	KVP_INVAL_MAX
};

/**
 * Why a transfer failed with KVP_EPEER or KVP_ENOPEER (struct kvp_cqe.detail),
 * where the daemon knew it when it refused the transfer.
 */
enum kvp_peer_why {
	KVP_PEER_WHY_NONE = 0,
	KVP_PEER_WHY_UNKNOWN,	/**< no-peer: no peer has this index (never had, or not any more) */
	KVP_PEER_WHY_REMOVED,	/**< no-peer: the peer is being removed (peer_remove, reload, replaced) */
	KVP_PEER_WHY_DOWN,	/**< peer: its links are down (lost; being redialled) */
	KVP_PEER_WHY_CONNECT,	/**< peer: no connection within timeouts.connect_ms (refused, unreachable) */
	KVP_PEER_WHY_HANDSHAKE, /**< peer: connected, but the handshake was refused (node id, limits) */
	KVP_PEER_WHY_AUTH,	/**< peer: authentication failed (secrets differ) */
	KVP_PEER_WHY_NO_ADDR,	/**< peer: it connected to this node; there is no address to dial it */
	KVP_PEER_WHY_MAX
};

static_assert(sizeof(struct kvp_cqe) == KVP_CQE_SIZE, "CQE ABI");
static_assert(offsetof(struct kvp_cqe, bad_seg) == 104, "CQE ABI");
static_assert(offsetof(struct kvp_cqe, phase_ns) == 40, "CQE ABI");

/* ---- ring in shared memory ---- */

/** Shared part of one SPSC ring; the slots live elsewhere in the channel. */
struct kvp_ring_shm {
	/* Written by the producer (release), read by the consumer (acquire). */
	alignas(KVP_CACHE_LINE) KVP_ATOMIC_U32 prod;
	/* Written by the consumer (release), read by the producer (acquire). */
	alignas(KVP_CACHE_LINE) KVP_ATOMIC_U32 cons;
	/*
	 * Set by the consumer before it blocks; the producer reads it after a
	 * seq_cst fence that follows its publish of prod (Dekker pairing with
	 * the consumer's fence between setting it and re-checking prod).
	 */
	alignas(KVP_CACHE_LINE) KVP_ATOMIC_U32 need_wakeup;
	/* Entries the producer dropped because the ring was full (CQ only). */
	KVP_ATOMIC_U32 overflow;
	/*
	 * The other direction of need_wakeup: set by the producer before it
	 * sleeps on a full ring (kvproxyd parking a client that does not read
	 * its CQ); the consumer reads it after a seq_cst fence that follows its
	 * release of cons (Dekker pairing with the producer's fence between
	 * setting it and re-checking cons), and then rings the producer's
	 * doorbell. Was padding before: a consumer that never looks at it only
	 * makes the producer wait for its own timeout.
	 */
	KVP_ATOMIC_U32 room_wakeup;
};

static_assert(sizeof(struct kvp_ring_shm) == 3 * KVP_CACHE_LINE, "ring ABI");
static_assert(offsetof(struct kvp_ring_shm, cons) == KVP_CACHE_LINE, "ring ABI");
static_assert(offsetof(struct kvp_ring_shm, need_wakeup) == 2 * KVP_CACHE_LINE, "ring ABI");
static_assert(offsetof(struct kvp_ring_shm, overflow) == 2 * KVP_CACHE_LINE + 4, "ring ABI");
static_assert(offsetof(struct kvp_ring_shm, room_wakeup) == 2 * KVP_CACHE_LINE + 8, "ring ABI");

/** Channel header at offset 0 of the shared object. */
struct kvp_chan_hdr {
	uint64_t magic; /**< KVP_CHAN_MAGIC */
	uint32_t version;
	uint32_t hdr_size;
	uint32_t sq_entries;
	uint32_t sq_esize;
	uint32_t cq_entries;
	uint32_t cq_esize;
	uint64_t sq_off;
	uint64_t cq_off;
	uint64_t size;
	uint32_t client_id;
	uint32_t rsvd;
	alignas(KVP_CACHE_LINE) struct kvp_ring_shm sq;
	struct kvp_ring_shm cq;
};

static_assert(offsetof(struct kvp_chan_hdr, sq) == KVP_CACHE_LINE, "channel ABI");
static_assert(sizeof(struct kvp_chan_hdr) == 7 * KVP_CACHE_LINE, "channel ABI");

/** Process-local view of one ring. */
struct kvp_ring {
	struct kvp_ring_shm *shm;
	uint8_t *slots;
	uint32_t size; /**< entries, power of two */
	uint32_t mask;
	uint32_t esize;
	uint32_t local;	 /**< producer: next prod; consumer: next cons */
	uint32_t cached; /**< producer: last seen cons; consumer: last seen prod */
	uint32_t bad;	 /**< the other side's index as read when a call returned -EPROTO */
};

/**
 * Lay out a new channel in @p mem (kvproxyd side).
 *
 * @param mem      zeroed memory of at least kvp_chan_size() bytes, page aligned
 * @param sq_entries, cq_entries  ring sizes, powers of two
 * @return 0, or -EINVAL if a size is not a power of two or is too large
 */
int kvp_chan_init(void *mem, size_t len, uint32_t sq_entries, uint32_t cq_entries,
		  uint32_t client_id);

/** Bytes needed for a channel with these ring sizes (0 if invalid). */
size_t kvp_chan_size(uint32_t sq_entries, uint32_t cq_entries);

/**
 * Validate a mapped channel and set up process-local ring views.
 *
 * @param daemon  true on the kvproxyd side (SQ consumer, CQ producer)
 * @return 0; -EBADMSG on wrong magic or a length shorter than the header, -EPROTONOSUPPORT on a version
 *   mismatch, -EINVAL if sizes or offsets do not fit @p len
 */
int kvp_chan_attach(void *mem, size_t len, bool daemon, struct kvp_ring *sq, struct kvp_ring *cq);

/** Producer side: entries that can be enqueued now, or -EPROTO. */
static inline int
kvp_ring_free(struct kvp_ring *r)
{
	/* Pairs with the consumer's release store of cons. */
	uint32_t cons = KVP_LOAD_ACQUIRE(&r->shm->cons);
	uint32_t used = r->local - cons;

	/*
	 * Never cache an impossible index: the enqueue fast path trusts
	 * r->cached. cons only moves forward, from the last value seen up to
	 * prod; one that went back would pin the producer's entries forever.
	 */
	if (used > r->size || cons - r->cached > r->local - r->cached) {
		r->bad = cons;
		return -EPROTO;
	}
	r->cached = cons;
	return (int)(r->size - used);
}

/*
 * Write into the slot a page ahead of the next one, if it is free: a ring
 * of several pages walks into a page it last wrote a whole ring ago, and
 * on the 2-CPU VM the first write there cost microseconds (every 32nd
 * one-at-a-time transfer, a 4 KiB page of 128-byte CQEs on the sender's
 * and on the receiver's ring, took 8 us more; a read or a prefetch ahead
 * did not help, a write did: p99 24 -> 19 us). The byte written is in a
 * slot the consumer released (cons seen past it), which only the producer
 * touches until it fills it.
 */
static inline void
kvp_ring_warm_ahead(struct kvp_ring *r)
{
	uint32_t ahead = 4096 / r->esize;

	if (ahead && r->size > ahead && r->local + ahead - r->cached < r->size)
		*(volatile uint8_t *)(r->slots + (size_t)((r->local + ahead) & r->mask) * r->esize) = 0;
}

/**
 * Enqueue exactly @p n entries of r->esize bytes, or none.
 *
 * @return n; 0 if there is no room (try later); -EPROTO if the consumer's
 *   index is impossible
 */
static inline int
kvp_ring_enqueue_bulk(struct kvp_ring *r, const void *objs, uint32_t n)
{
	uint32_t prod = r->local;

	if (r->size - (prod - r->cached) < n) {
		int room = kvp_ring_free(r);

		if (room < 0)
			return room;
		if ((uint32_t)room < n)
			return 0;
	}
	uint32_t idx = prod & r->mask;
	uint32_t first = r->size - idx < n ? r->size - idx : n;

	memcpy(r->slots + (size_t)idx * r->esize, objs, (size_t)first * r->esize);
	if (first < n)
		memcpy(r->slots, (const uint8_t *)objs + (size_t)first * r->esize,
		       (size_t)(n - first) * r->esize);
	r->local = prod + n;
	/* Pairs with the consumer's acquire load of prod in kvp_ring_count(). */
	KVP_STORE_RELEASE(&r->shm->prod, r->local);
	kvp_ring_warm_ahead(r);
	return (int)n;
}

/** Consumer side: entries ready now, or -EPROTO if the producer's index is impossible. */
static inline int
kvp_ring_count(struct kvp_ring *r)
{
	/* Pairs with the producer's release store of prod. */
	uint32_t prod = KVP_LOAD_ACQUIRE(&r->shm->prod);
	uint32_t avail = prod - r->local;

	/* Never cache an impossible index: the dequeue fast path trusts r->cached. */
	if (avail > r->size) {
		r->bad = prod;
		return -EPROTO;
	}
	r->cached = prod;
	return (int)avail;
}

/** Consumer side: pointer to the i-th ready entry (i < last kvp_ring_count()). */
static inline const void *
kvp_ring_peek(const struct kvp_ring *r, uint32_t i)
{
	return r->slots + (size_t)((r->local + i) & r->mask) * r->esize;
}

/** Consumer side: release @p n entries back to the producer. */
static inline void
kvp_ring_consume(struct kvp_ring *r, uint32_t n)
{
	r->local += n;
	/* Pairs with the producer's acquire load of cons in kvp_ring_free(). */
	KVP_STORE_RELEASE(&r->shm->cons, r->local);
}

/**
 * Dequeue up to @p n entries into @p objs (copied out of shared memory).
 * May return fewer than are ready: prod is re-read only once the entries
 * seen last time are used up.
 *
 * @return entries dequeued (0 if empty), or -EPROTO
 */
static inline int
kvp_ring_dequeue_burst(struct kvp_ring *r, void *objs, uint32_t n)
{
	uint32_t avail = r->cached - r->local;

	if (avail == 0) {
		int c = kvp_ring_count(r);

		if (c <= 0)
			return c;
		avail = (uint32_t)c;
	}
	if (n > avail)
		n = avail;
	uint32_t idx = r->local & r->mask;
	uint32_t first = r->size - idx < n ? r->size - idx : n;

	memcpy(objs, r->slots + (size_t)idx * r->esize, (size_t)first * r->esize);
	if (first < n)
		memcpy((uint8_t *)objs + (size_t)first * r->esize, r->slots,
		       (size_t)(n - first) * r->esize);
	kvp_ring_consume(r, n);
	return (int)n;
}

/**
 * Consumer side, before blocking: announce the wait, then re-check.
 *
 * @return true if the ring is still empty and the caller may block; false
 *   if entries arrived (the flag is cleared again)
 */
static inline bool
kvp_ring_prepare_wait(struct kvp_ring *r)
{
	KVP_STORE_RELAXED(&r->shm->need_wakeup, 1u);
	/* Pairs with the fence in kvp_ring_wakeup_needed(). */
	KVP_FENCE_SEQ_CST();
	if (kvp_ring_count(r) != 0) {
		KVP_STORE_RELAXED(&r->shm->need_wakeup, 0u);
		return false;
	}
	return true;
}

/** Consumer side, after waking up. */
static inline void
kvp_ring_finish_wait(struct kvp_ring *r)
{
	KVP_STORE_RELAXED(&r->shm->need_wakeup, 0u);
}

/** Producer side, after an enqueue: true if the consumer must be woken. */
static inline bool
kvp_ring_wakeup_needed(struct kvp_ring *r)
{
	/* Pairs with the fence in kvp_ring_prepare_wait(). */
	KVP_FENCE_SEQ_CST();
	return KVP_LOAD_RELAXED(&r->shm->need_wakeup) != 0;
}

/**
 * Producer side, before sleeping on a ring with fewer than @p want free
 * entries: ask the consumer to ring the producer's doorbell when it frees
 * some (kvp_ring_room_wakeup_needed()), then re-check.
 *
 * @return true if fewer than @p want entries are free still and the caller
 *   may sleep; false if room appeared or the consumer's index is impossible
 *   (the flag is cleared again; the caller looks at the ring once more)
 */
static inline bool
kvp_ring_prepare_wait_room(struct kvp_ring *r, uint32_t want)
{
	KVP_STORE_RELAXED(&r->shm->room_wakeup, 1u);
	/* Pairs with the fence in kvp_ring_room_wakeup_needed(). */
	KVP_FENCE_SEQ_CST();
	int room = kvp_ring_free(r);

	if (room < 0 || (uint32_t)room >= want) {
		KVP_STORE_RELAXED(&r->shm->room_wakeup, 0u);
		return false;
	}
	return true;
}

/** Producer side, after waking up from kvp_ring_prepare_wait_room(). */
static inline void
kvp_ring_finish_wait_room(struct kvp_ring *r)
{
	KVP_STORE_RELAXED(&r->shm->room_wakeup, 0u);
}

/**
 * Consumer side, after a dequeue freed entries: true if the producer sleeps
 * waiting for room and must be woken (the flag is cleared, so one wakeup
 * per sleep).
 */
static inline bool
kvp_ring_room_wakeup_needed(struct kvp_ring *r)
{
	/* Pairs with the fence in kvp_ring_prepare_wait_room(). */
	KVP_FENCE_SEQ_CST();
	if (KVP_LOAD_RELAXED(&r->shm->room_wakeup) == 0)
		return false;
	KVP_STORE_RELAXED(&r->shm->room_wakeup, 0u);
	return true;
}

/* ---- client socket protocol (UNIX stream, fixed-size messages) ---- */

#define KVP_CTRL_MAGIC	0x4b56u /* "KV" */
#define KVP_CTRL_MSGLEN 256u
#define KVP_ERRMSG_MAX	160

/*
 * A connection kvproxyd refuses before it has read its HELLO (credentials,
 * limits.max_clients reached, no file descriptor left) gets a HELLO reply
 * with err and errmsg and seq 1 (libkvproxy's HELLO is a connection's first
 * request, seq 1) and is closed; the client may find its own HELLO refused
 * by the closed socket, and reads that reply all the same.
 */
enum kvp_ctrl_op {
	KVP_CTRL_HELLO = 1,	 /**< -> channel fd, SQ doorbell fd, CQ notify fd */
	KVP_CTRL_REG = 2,	 /**< fd attached: map it as a region -> key */
	KVP_CTRL_DEREG = 3,	 /**< key -> status */
	KVP_CTRL_PEER_LOOKUP = 4, /**< node id -> peer index */
	KVP_CTRL_PEER_ADDR = 5,	  /**< "host:port" -> peer index; dialled on demand (kvp_peer_lookup) */
	KVP_CTRL_NODE_ADDR = 6,	  /**< -> this node's listen address (kvp_listen_addr) */
};

/** Longest "host:port" of KVP_CTRL_PEER_ADDR and KVP_CTRL_NODE_ADDR, NUL included. */
#define KVP_ADDR_MAX 80

enum kvp_region_flags {
	KVP_REGION_HOST = 0x1, /**< host memory behind a shareable fd (memfd, shm, hugetlbfs) */
	KVP_REGION_CUDA_IPC = 0x2, /**< cudaMalloc memory: a CUDA IPC handle in reg.ipc */
	KVP_REGION_CUDA_VMM = 0x4, /**< CUDA VMM allocation exported as a POSIX fd (attached) */
};

/** Request, client -> daemon. */
struct kvp_ctrl_req {
	uint16_t magic;
	uint16_t op;
	uint32_t abi_version;
	uint64_t seq;
	union {
		struct {
			uint32_t sq_entries; /**< 0 = daemon default */
			uint32_t cq_entries;
			int32_t pid;
		} hello;
		struct {
			uint64_t fd_offset; /**< offset into the passed fd */
			uint64_t len;
			uint32_t flags;	 /**< enum kvp_region_flags */
			int32_t device;	 /**< CUDA device ordinal (GPU regions) */
			uint8_t ipc[64]; /**< CUDA IPC memory handle (KVP_REGION_CUDA_IPC) */
		} reg;
		struct {
			uint64_t key;
		} dereg;
		struct {
			char node_id[KVP_NODE_ID_MAX];
		} peer;
		struct {
			char addr[KVP_ADDR_MAX]; /**< "host:port" of the peer's listener */
		} peer_addr;
		uint8_t raw[KVP_CTRL_MSGLEN - 16];
	} u;
};

/** Reply, daemon -> client; fds for HELLO travel with it. */
struct kvp_ctrl_rep {
	uint16_t magic;
	uint16_t op;
	int32_t err; /**< 0 or negative errno */
	uint64_t seq;
	union {
		struct {
			uint64_t chan_size;
			uint32_t client_id;
			uint32_t max_segs; /**< segments per transfer this daemon accepts */
			char node_id[KVP_NODE_ID_MAX];
		} hello;
		struct {
			uint64_t key;
		} reg;
		struct {
			uint16_t peer;
			uint8_t rsvd[6];
			/** PEER_ADDR: the node id learned from its handshake, "" while not yet known */
			char node_id[KVP_NODE_ID_MAX];
		} peer;
		struct {
			char addr[KVP_ADDR_MAX]; /**< "host:port" peers reach this node at */
		} node_addr;
		uint8_t raw[KVP_CTRL_MSGLEN - 16 - KVP_ERRMSG_MAX];
	} u;
	char errmsg[KVP_ERRMSG_MAX]; /**< NUL-terminated reason when err != 0 */
};

static_assert(sizeof(struct kvp_ctrl_req) == KVP_CTRL_MSGLEN, "ctrl ABI");
static_assert(sizeof(struct kvp_ctrl_rep) == KVP_CTRL_MSGLEN, "ctrl ABI");

/** Name of a transfer status ("ok", "invalid", "no-buffers", ...). */
const char *kvp_status_str(int status);

/** What a KVP_EINVAL detail means ("zero length", ...); "" for KVP_INVAL_NONE. */
const char *kvp_invalid_str(int detail);

/** What a KVP_EPEER / KVP_ENOPEER detail means (enum kvp_peer_why); "" for KVP_PEER_WHY_NONE. */
const char *kvp_peer_why_str(int detail);

#ifdef __cplusplus
}
#endif

#endif /* KVP_RINGS_H */
