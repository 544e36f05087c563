/* SPDX-License-Identifier: BSD-3-Clause */
/* Worker internals shared by worker.c and fence.c (the worker's lcore only). */
#ifndef WORKER_PRIV_H
#define WORKER_PRIV_H

#include "kvp_core.h"

/* Post @p c to the client's CQ and wake it; false if the CQ is full. */
bool chan_post(struct kvp_chan *ch, const struct kvp_cqe *c);

/* fence.c */
void fence_add(struct kvp_worker *w, struct kvp_chan *ch, const struct kvp_sqe_fence *f,
	       uint64_t now);
int fence_timers(struct kvp_worker *w, uint64_t now);
void fence_chan_gone(struct kvp_worker *w, struct kvp_chan *ch);

#endif /* WORKER_PRIV_H */
