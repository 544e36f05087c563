/* SPDX-License-Identifier: BSD-3-Clause */
/* Worker internals shared by worker.c and fence.c (the worker's lcore only). */
#ifndef WORKER_PRIV_H
#define WORKER_PRIV_H

#include "kvp_transport.h"

/* Post @p c to the client's CQ and wake it; false if the CQ is full. */
bool chan_post(struct kvp_chan *ch, const struct kvp_cqe *c);

/* route.c: the worker's transports */
int route_post(struct kvp_worker *w, struct kvp_xfer *x);
void route_cancel(struct kvp_worker *w, struct kvp_xfer *x, int status);
int route_attach(struct kvp_worker *w, uint16_t peer, uint8_t link, int fd, bool outgoing,
		 uint64_t epoch);
uint32_t route_fence(struct kvp_worker *w, const struct kvp_fence *f, bool force);
void route_destroy(struct kvp_worker *w);

/* fence.c */
void fence_add(struct kvp_worker *w, struct kvp_chan *ch, const struct kvp_sqe_fence *f,
	       uint64_t now);
int fence_timers(struct kvp_worker *w, uint64_t now);
void fence_chan_gone(struct kvp_worker *w, struct kvp_chan *ch);

#endif /* WORKER_PRIV_H */
