/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_tcp_stage: the TCP transport. Each worker lcore owns one io_uring and
 * the connections handed to it; data goes out as framed sendmsg gathers
 * straight from the source regions (host memory) and is received into a
 * bounded per-connection staging buffer, or directly into the destination
 * region for large payloads. One send per socket is in flight at a time, so
 * a partial send can never interleave two frames' bytes.
 *
 * Threading: every op runs on the owning worker's lcore (see
 * struct kvp_transport_ops). Memory: connection slots, frame queues and
 * receive buffers are allocated at create time from the configuration.
 */
#ifndef KVP_TCP_STAGE_H
#define KVP_TCP_STAGE_H

#include "kvp_core.h"

/** The TCP transport's ops table. */
extern const struct kvp_transport_ops kvp_tcp_stage_ops;

/*
 * Extension interface: a transport that moves data by other means (RDMA)
 * and uses these connections as its control channel. It sees the frames
 * of its own types, ACK and ABORT of its transfers, and connection events,
 * and queues header-plus-small-payload frames of its own.
 */

/** kvp_xfer.t_state values from this one up belong to the extension. */
#define KVP_TCP_XS_EXT 16

/** Largest payload of an extension frame. */
#define KVP_TCP_EXT_PAYLOAD 64

struct kvp_tcp_ext {
	void *arg;
	/**
	 * A frame for the extension arrived on the connection (@p peer,
	 * @p outgoing): its own types (payload complete, already checked by
	 * kvp_wire_check), ACK of a transfer whose t_state >= KVP_TCP_XS_EXT,
	 * and every ABORT. @return 0, or negative to fail the connection.
	 */
	int (*on_frame)(void *arg, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
			const void *payload);
	/** A connection came up, or is going down (before its transfers end). */
	void (*on_conn)(void *arg, uint16_t peer, bool outgoing, bool up);
};

/** Install the extension on a worker's TCP instance (before any connection). */
void kvp_tcp_set_ext(void *tctx, const struct kvp_tcp_ext *ext);

/**
 * Queue a frame on connection (@p peer, @p outgoing); @p payload holds
 * h->len (<= KVP_TCP_EXT_PAYLOAD) bytes, copied.
 *
 * @return true; false if the connection is not up or its queue is full
 */
bool kvp_tcp_send(void *tctx, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
		  const void *payload);

/** Frames that can still be queued on connection (@p peer, @p outgoing); 0 if it is down. */
uint32_t kvp_tcp_room(void *tctx, uint16_t peer, bool outgoing);

/** Fail connection (@p peer, @p outgoing) with @p why (the main lcore reconnects). */
void kvp_tcp_fail(void *tctx, uint16_t peer, bool outgoing, const char *why);

#endif /* KVP_TCP_STAGE_H */
