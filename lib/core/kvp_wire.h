/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_wire: the wire protocol between nodes (ABI): frame types, the frame
 * header, the HELLO and RDMA control payloads, and the header checks.
 */
#ifndef KVP_WIRE_H
#define KVP_WIRE_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvp_rings.h"

/* ---- wire protocol between nodes (little-endian, TCP control/data stream) ---- */

#define KVP_WIRE_MAGIC	 0x564bu /* "KV" */
#define KVP_WIRE_VERSION 2u /* 2: DATA carries the user id, DATA2D, RDMA_REVOKE */

enum kvp_wire_type {
	KVP_W_HELLO = 1, /**< payload struct kvp_wire_hello; first frame each way */
	KVP_W_DATA,	 /**< payload bytes for [off, off+len) of region key; aux = user_id */
	KVP_W_END,	 /**< transfer tag complete: aux = user_id, off = bytes, aux2 = nseg */
	KVP_W_ACK,	 /**< receiver -> sender: tag landed (or its ABORT taken), aux = enum kvp_status */
	KVP_W_ABORT,	 /**< sender gave up on tag; receiver forgets it (rsvd: KVP_ABORT_F_*) */
	KVP_W_PING,	 /**< liveness; answered by PONG */
	KVP_W_PONG,
	/*
	 * Peer control frames (kvp_wire_is_ctl()): the peer control channel
	 * carries them between two nodes' transports (the RDMA transport's today).
	 */
	KVP_W_RDMA_QP,	  /**< sender -> receiver: connect this QP (struct kvp_wire_qp) */
	KVP_W_RDMA_QP_OK, /**< receiver -> sender: its end of the QP (struct kvp_wire_qp) */
	KVP_W_RDMA_REQ,	  /**< sender -> receiver: grant key; off = bytes, aux = user_id,
			       aux2 = nseg, rsvd = destination regions in this transfer */
	KVP_W_RDMA_GRANT, /**< receiver -> sender: struct kvp_wire_grant for key */
	KVP_W_RDMA_RESET, /**< either way: QP slot aux (generation aux2) failed; rebuild it */
	KVP_W_RDMA_REVOKE, /**< receiver -> sender: a fence refuses tag; stop writing, ABORT it */
	/* Back to the data stream. */
	KVP_W_DATA2D, /**< len / aux2 blocks of aux2 bytes, landing dst_stride (rsvd) apart
		       from off of region key; aux = user_id */
	KVP_W_UNSUPPORTED, /**< control: nobody here takes control frames of type aux */
	KVP_W_TYPE_MAX
};

/** Peer control frames: what the peer control channel carries. */
static inline bool
kvp_wire_is_ctl(uint8_t type)
{
	return (type >= KVP_W_RDMA_QP && type <= KVP_W_RDMA_REVOKE) || type == KVP_W_UNSUPPORTED;
}

#define KVP_WIRE_RAILS_MAX 8 /**< rails a node may offer to one peer */

/** Payload of RDMA_QP and RDMA_QP_OK: one end of an RC queue pair. */
struct kvp_wire_qp {
	uint8_t gid[16];
	uint32_t qpn;
	uint32_t psn;
	uint32_t gen;	  /**< the sender's generation of this QP slot (echoed) */
	uint16_t lid;
	uint8_t slot;	  /**< QP slot among the sender's QPs to this peer */
	uint8_t rail;	  /**< rail (local to the frame's sender) the QP lives on */
	uint8_t nrails;	  /**< rails of the frame's sender */
	uint8_t mtu;	  /**< IBV_MTU_* of the port */
	uint8_t status;	  /**< QP_OK: 0, or 1 when the receiver could not build its end */
	uint8_t link_layer;
	uint32_t rsvd;
};

static_assert(sizeof(struct kvp_wire_qp) == 40, "wire ABI");

/** Payload of RDMA_GRANT: where the sender may write, per receiver rail. */
struct kvp_wire_grant {
	uint64_t addr; /**< region base as the receiver's NIC sees it */
	uint64_t len;  /**< region length */
	uint32_t imm;  /**< WRITE_WITH_IMM value that completes the transfer */
	uint8_t status; /**< enum kvp_grant_status */
	uint8_t nrails;
	uint16_t rsvd;
	uint32_t rkey[KVP_WIRE_RAILS_MAX];
};

static_assert(sizeof(struct kvp_wire_grant) == 56, "wire ABI");

enum kvp_grant_status {
	KVP_GRANT_OK = 0,
	KVP_GRANT_NOREGION, /**< unknown region: the transfer fails (remote refusal) */
	KVP_GRANT_NOMR,	    /**< region not registered for RDMA: the sender stages it over TCP */
	KVP_GRANT_BUSY,	    /**< no grant slot free: the sender stages it over TCP */
	KVP_GRANT_FENCED,   /**< a fence of the receiving client refuses it (remote refusal) */
};

struct kvp_wire_hdr {
	uint16_t magic;
	uint8_t version;
	uint8_t type;
	uint32_t len;  /**< payload bytes after the header */
	uint64_t tag;  /**< sender's transfer tag */
	uint64_t key;  /**< DATA: destination region; END: first destination region */
	uint64_t off;  /**< DATA: destination offset; END: total bytes */
	uint64_t aux;  /**< END: user_id; ACK: status */
	uint32_t aux2; /**< END: segment count */
	uint32_t rsvd;
};

static_assert(sizeof(struct kvp_wire_hdr) == 48, "wire ABI");

struct kvp_wire_hello {
	char node_id[KVP_NODE_ID_MAX]; /**< sender's node id */
	char to_node[KVP_NODE_ID_MAX]; /**< node id the sender believes it talks to */
	uint64_t epoch;		       /**< random per connection attempt */
	uint32_t max_inflight;	       /**< transfers the sender may have in flight */
	uint32_t frame_max;	       /**< largest DATA payload the sender will send */
	uint32_t status;	       /**< reply only: 0 or a kvp_hello_err */
	uint32_t flags;		       /**< KVP_HELLO_F_* */
	uint8_t nonce[32];	       /**< random challenge (authenticated handshakes) */
	uint8_t mac[32];	       /**< HMAC-SHA256 answer to the other side's nonce */
};

/**
 * ABORT rsvd flag: the cancelled transfer's last frame (it had bytes on the
 * wire). The receiver answers with an ACK once it has processed it, after
 * every earlier byte of the tag, so the sender can complete the transfer
 * knowing nothing more of it will land.
 */
#define KVP_ABORT_F_ACK 0x1u

/**
 * PING aux flag: the receiver leaves a DATA header unread until a receive
 * staging buffer frees, so the sender's bytes wait for it (its send does
 * not move, by design). Sent every peer_ms / 4 while that lasts, and not
 * answered: the sender takes it as progress of its send instead of cutting
 * the link as stalled.
 */
#define KVP_PING_RXWAIT 0x1u

#define KVP_HELLO_F_AUTH 0x1u /**< the sender holds the shared secret */
/* Bits 8-15: the link a dialer's HELLO opens; bits 16-23: the sender's tcp.connections. */
#define KVP_HELLO_LINK(f)  (((f) >> 8) & 0xffu)
#define KVP_HELLO_LINKS(f) (((f) >> 16) & 0xffu)
#define KVP_HELLO_F_LINK(l, n) (((uint32_t)(l) << 8) | ((uint32_t)(n) << 16))

static_assert(sizeof(struct kvp_wire_hello) == 152, "wire ABI");

/**
 * Check a received header before trusting any field.
 *
 * @return 0; -EBADMSG (magic, type), -EPROTONOSUPPORT (version),
 *   -EMSGSIZE (payload larger than allowed for the type)
 */
int kvp_wire_check(const struct kvp_wire_hdr *h, uint32_t frame_max);

/** Fill a header (magic/version set, the rest as given). */
static inline void
kvp_wire_hdr_init(struct kvp_wire_hdr *h, uint8_t type, uint32_t len, uint64_t tag)
{
	*h = (struct kvp_wire_hdr){ .magic = KVP_WIRE_MAGIC,
				    .version = KVP_WIRE_VERSION,
				    .type = type,
				    .len = len,
				    .tag = tag };
}

#endif /* KVP_WIRE_H */
