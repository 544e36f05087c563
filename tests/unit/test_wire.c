/* SPDX-License-Identifier: BSD-3-Clause */
/* Frame header validation: every field a peer controls is checked. */
#include <errno.h>

#include "kvp_wire.h"
#include "kvp_test.h"

int
main(void)
{
	struct kvp_wire_hdr h;

	kvp_wire_hdr_init(&h, KVP_W_DATA, 4096, 7);
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), 0);
	h.len = 0;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EMSGSIZE);
	h.len = (1 << 20) + 1;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EMSGSIZE);
	h.len = 4096;
	h.off = UINT64_MAX - 100;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EBADMSG);
	h.off = 0;
	h.magic = 0x1234;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EBADMSG);
	h.magic = KVP_WIRE_MAGIC;
	h.version = 9;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EPROTONOSUPPORT);
	h.version = KVP_WIRE_VERSION;
	h.type = 0;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EBADMSG);
	h.type = KVP_W_TYPE_MAX;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EBADMSG);

	/* DATA2D: whole blocks (aux2 bytes each), dst stride (rsvd) >= block, span must not wrap. */
	kvp_wire_hdr_init(&h, KVP_W_DATA2D, 4096, 7);
	h.aux2 = 256;
	h.rsvd = 512;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), 0);
	h.aux2 = 0;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EBADMSG);
	h.aux2 = 1000; /* 4096 is not a multiple */
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EBADMSG);
	h.aux2 = 256;
	h.rsvd = 255; /* blocks would overlap */
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EBADMSG);
	h.rsvd = 512;
	h.off = UINT64_MAX - 4096; /* 16 blocks span 7936 bytes */
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EBADMSG);
	h.off = 0;
	h.len = 0;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EMSGSIZE);
	h.len = 2u << 20;
	CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EMSGSIZE);

	/* Control frames carry no payload, or exactly their fixed-size one. */
	for (uint8_t t = KVP_W_END; t < KVP_W_TYPE_MAX; t++) {
		if (t == KVP_W_DATA2D)
			continue;
		uint32_t want = t == KVP_W_RDMA_QP || t == KVP_W_RDMA_QP_OK ? sizeof(struct kvp_wire_qp)
				: t == KVP_W_RDMA_GRANT			      ? sizeof(struct kvp_wire_grant)
									      : 0;

		kvp_wire_hdr_init(&h, t, want, 1);
		CHECK_EQ(kvp_wire_check(&h, 1 << 20), 0);
		h.len = want + 1;
		CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EMSGSIZE);
		if (want) {
			h.len = want - 1;
			CHECK_EQ(kvp_wire_check(&h, 1 << 20), -EMSGSIZE);
		}
	}
	kvp_wire_hdr_init(&h, KVP_W_HELLO, sizeof(struct kvp_wire_hello), 0);
	CHECK_EQ(kvp_wire_check(&h, 0), 0);
	h.len = 1 << 30;
	CHECK_EQ(kvp_wire_check(&h, 0), -EMSGSIZE);
	return kvp_test_result("test_wire");
}
