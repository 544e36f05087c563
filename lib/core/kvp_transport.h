/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_transport: what a transport sees. Its ops table (one instance per
 * worker lcore), the worker's callbacks (a transfer ended, landed, a
 * connection went down), the planner that cuts transfers into pieces, and
 * the peer control channel: frames between the two nodes' instances that
 * one transport provides (TCP) and another one uses (RDMA's queue-pair
 * exchange, grants and acknowledgements), without either knowing the other.
 *
 * Threading: every op runs on its worker's lcore, except create/destroy
 * (start-up and teardown).
 */
#ifndef KVP_TRANSPORT_H
#define KVP_TRANSPORT_H

#include "kvp_worker.h"

/** Smallest power of two >= @p v (1 for 0). */
static inline uint32_t
kvp_pow2_ceil(uint32_t v)
{
	uint32_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

/** Transport capabilities. */
#define KVP_TCAP_HOST_MEM  0x1u /**< moves host memory */
#define KVP_TCAP_GPU_DIRECT 0x2u /**< reads/writes GPU memory without staging */

/** Largest payload of a peer control frame (kvp_pchan_send()). */
#define KVP_PCHAN_PAYLOAD 64

/**
 * The peer control channel a transport provides (TCP): small frames to the
 * same worker's instance on the peer, over connection (@p peer, @p outgoing).
 */
struct kvp_pchan_ops {
	/** Queue a frame (h->len <= KVP_PCHAN_PAYLOAD bytes of payload, copied). @return false if down or full */
	bool (*send)(void *tctx, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
		     const void *payload);
	/** Frames that can still be queued (0 if the connection is down). */
	uint32_t (*room)(void *tctx, uint16_t peer, bool outgoing);
	/** Fail the connection (its provider reconnects). */
	void (*fail)(void *tctx, uint16_t peer, bool outgoing, const char *why);
};

/**
 * A transport: one instance per worker lcore; every op is called on that
 * lcore except create/destroy. The worker offers each transfer to its
 * transports in order; the first that takes it owns it (x->tp) until it
 * ends, or hands it over (kvp_worker_handover()).
 */
struct kvp_transport_ops {
	const char *name;
	uint32_t caps;
	/** Create the per-worker instance, transport @p idx of the worker's list. @return 0 or negative errno */
	int (*create)(struct kvp_worker *w, unsigned idx, void **tctx);
	void (*destroy)(void *tctx);
	/**
	 * Take over handshaken connection @p link (< tcp.connections) of a
	 * peer (the fd is the transport's on success, the caller's on error);
	 * NULL for a transport without connections of its own. @return 0 or
	 * negative errno (-EEXIST: that link is up and this one a duplicate)
	 */
	int (*attach)(void *tctx, uint16_t peer, uint8_t link, int fd, bool outgoing,
		      uint64_t epoch);
	/**
	 * Take a transfer. The transport stamps x->ts[KVP_TS_ADMIT] (window and
	 * buffers granted), FIRST and POSTED (first and last byte handed over)
	 * and ACKED as it gets there; completions and histograms are built from them.
	 * @return 0; -EAGAIN (not this transport: the next one is asked);
	 *   -ENOTCONN (no connection to the peer)
	 */
	int (*post)(void *tctx, struct kvp_xfer *x);
	/** Move data and reap completions. @return units of work done (0 = idle) */
	int (*progress)(void *tctx);
	/** Abort a transfer it owns; the transport ends it through kvp_worker_xfer_end(). */
	void (*cancel)(void *tctx, struct kvp_xfer *x, int status);
	/** Before sleeping: flush submissions; @return an fd that turns readable on work, or -1 */
	int (*sleep_fd)(void *tctx);
	/** Close every connection to @p peer (main lcore asked); NULL: none of its own. */
	void (*disconnect)(void *tctx, uint16_t peer);
	/**
	 * Fence @p f was set (and is asked again each timer tick while
	 * pending): from now on refuse its transfers' bytes, and stop or
	 * revoke what is under way. With @p force (timeouts.peer_ms passed),
	 * make landing impossible at any cost (e.g. tear down queue pairs).
	 * @return landings of matching transfers that may still happen (0: none)
	 */
	uint32_t (*fence)(void *tctx, const struct kvp_fence *f, bool force);
	/** The peer control channel it provides, or NULL. */
	const struct kvp_pchan_ops *pchan;
};

/**
 * Re-offer @p x, owned by transport x->tp, to the transports after it (its
 * progress starts over: nothing of it was sent). Used by a transport that
 * learns mid-flight that it cannot move it (e.g. the receiver could not
 * register a region for RDMA). Ends it with KVP_EPEER if none takes it.
 */
void kvp_worker_handover(struct kvp_worker *w, struct kvp_xfer *x);

/* ---- the peer control channel (pchan.c) ---- */

/** Become the channel's subscriber (at most one; create time). @return 0, -EBUSY */
int kvp_pchan_subscribe(struct kvp_worker *w, const struct kvp_pchan_sub *sub);

/** Send a control frame to @p peer. @return false if there is no channel, it is down or full */
bool kvp_pchan_send(struct kvp_worker *w, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
		    const void *payload);

/** Frames the channel to @p peer can take now (0 without a channel). */
uint32_t kvp_pchan_room(struct kvp_worker *w, uint16_t peer, bool outgoing);

/** Fail the channel's connection to @p peer. */
void kvp_pchan_fail(struct kvp_worker *w, uint16_t peer, bool outgoing, const char *why);

/**
 * Provider side: a control frame (or an ACK of a transfer another
 * transport owns, or an ABORT) arrived. @return 0; -ENOTSUP when nobody
 * subscribed (the provider answers KVP_W_UNSUPPORTED); negative to fail
 * the connection
 */
int kvp_pchan_deliver(struct kvp_worker *w, uint16_t peer, bool outgoing,
		      const struct kvp_wire_hdr *h, const void *payload);

/** Provider side: the channel's connection to @p peer came up or is going down. */
void kvp_pchan_conn(struct kvp_worker *w, uint16_t peer, bool outgoing, bool up);

#endif /* KVP_TRANSPORT_H */
