/* SPDX-License-Identifier: BSD-3-Clause */
/* The ABI layout as the C compiler sees it, for test_cxx.cpp to compare with its own. */
#include <stddef.h>

#include "kvproxy.h"

const size_t kvp_test_c_layout[] = {
	sizeof(struct kvp_ring_shm),
	offsetof(struct kvp_ring_shm, prod),
	offsetof(struct kvp_ring_shm, cons),
	offsetof(struct kvp_ring_shm, need_wakeup),
	offsetof(struct kvp_ring_shm, overflow),
	offsetof(struct kvp_ring_shm, room_wakeup),
	_Alignof(struct kvp_ring_shm),
	sizeof(struct kvp_chan_hdr),
	offsetof(struct kvp_chan_hdr, sq),
	offsetof(struct kvp_chan_hdr, cq),
	sizeof(struct kvp_ring),
	sizeof(struct kvp_cqe),
	sizeof(struct kvp_sqe_xfer),
	sizeof(struct kvp_ctrl_req),
	sizeof(struct kvp_ctrl_rep),
	sizeof(struct kvp_connect_opts),
	sizeof(struct kvp_xfer_desc),
	sizeof(struct kvp_segment),
};
