/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_tcp_stage: the TCP transport. Each worker lcore owns one io_uring and
 * the connections handed to it; data goes out as framed sendmsg gathers
 * straight from the source regions (host memory) and is received into a
 * bounded per-connection staging buffer, or directly into the destination
 * region for large payloads. One send per socket is in flight at a time, so
 * a partial send can never interleave two frames' bytes. Its connections'
 * link 0 also carries the peer control channel (kvp_transport.h) for the
 * transports that use one.
 *
 * Threading: every op runs on the owning worker's lcore (see
 * struct kvp_transport_ops). Memory: connection slots, frame queues and
 * receive buffers are allocated at create time from the configuration.
 */
#ifndef KVP_TCP_STAGE_H
#define KVP_TCP_STAGE_H

#include "kvp_transport.h"

/** The TCP transport's ops table. */
extern const struct kvp_transport_ops kvp_tcp_stage_ops;

#endif /* KVP_TCP_STAGE_H */
