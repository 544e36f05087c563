/* SPDX-License-Identifier: BSD-3-Clause */
/* Validation of frames received from other nodes: nothing is trusted before this. */
#include <errno.h>

#include "kvp_wire.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format is little-endian");

int
kvp_wire_check(const struct kvp_wire_hdr *h, uint32_t frame_max)
{
	if (h->magic != KVP_WIRE_MAGIC)
		return -EBADMSG;
	if (h->version != KVP_WIRE_VERSION)
		return -EPROTONOSUPPORT;
	switch (h->type) {
	case KVP_W_HELLO:
		return h->len == sizeof(struct kvp_wire_hello) ? 0 : -EMSGSIZE;
	case KVP_W_DATA:
		if (h->len == 0 || h->len > frame_max)
			return -EMSGSIZE;
		/* The range must not wrap; the region bound is checked on landing. */
		return h->off + h->len < h->off ? -EBADMSG : 0;
	case KVP_W_DATA2D: {
		if (h->len == 0 || h->len > frame_max)
			return -EMSGSIZE;
		/* Whole blocks that never overlap; their span must not wrap. */
		if (h->aux2 == 0 || h->len % h->aux2 != 0 || h->rsvd < h->aux2)
			return -EBADMSG;
		uint64_t span = (uint64_t)(h->len / h->aux2 - 1) * h->rsvd + h->aux2;
		return h->off + span < h->off ? -EBADMSG : 0;
	}
	case KVP_W_RDMA_QP:
	case KVP_W_RDMA_QP_OK:
		return h->len == sizeof(struct kvp_wire_qp) ? 0 : -EMSGSIZE;
	case KVP_W_RDMA_GRANT:
		return h->len == sizeof(struct kvp_wire_grant) ? 0 : -EMSGSIZE;
	case KVP_W_RDMA_REQ:
	case KVP_W_RDMA_RESET:
	case KVP_W_RDMA_REVOKE:
	case KVP_W_UNSUPPORTED:
	case KVP_W_END:
	case KVP_W_ACK:
	case KVP_W_ABORT:
	case KVP_W_PING:
	case KVP_W_PONG:
		return h->len == 0 ? 0 : -EMSGSIZE;
	default:
		return -EBADMSG;
	}
}
