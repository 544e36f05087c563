/* SPDX-License-Identifier: BSD-3-Clause */
/* Worker internals shared by worker.c, submit.c, chan.c, xmsg.c and fence.c (the worker's lcore only). */
#ifndef WORKER_PRIV_H
#define WORKER_PRIV_H

#include "kvp_transport.h"

/* chan.c: a client's channel */
/* Post @p c to the client's CQ and wake it; false if the CQ is full. */
bool chan_post(struct kvp_chan *ch, const struct kvp_cqe *c);
/* Wake the client if it waits for completions, once the worker's pass is done. */
void chan_notify(struct kvp_chan *ch);
/* Ring the eventfds chan_notify() owes (end of each of the worker's entry points). */
void worker_flush_notify(struct kvp_worker *w);
/* The client broke the ring protocol: record why (the first reason wins). */
void chan_break(struct kvp_chan *ch, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* kvp_ring_count() refused the SQ producer index / kvp_ring_free() the CQ consumer index. */
void chan_sq_broken(struct kvp_chan *ch);
void chan_cq_broken(struct kvp_chan *ch);
/* Arm the channel's wakeups; false if it has work now. */
bool chan_prepare_sleep(struct kvp_chan *ch);

/* worker.c */
/* An event for the main lcore (message pool and outbox; lost with a log line when full). */
void worker_send_main(struct kvp_worker *w, int type, uint16_t peer, uint8_t link, bool outgoing,
		      struct kvp_chan *ch, const char *reason);
/* Cancel @p ch's transfer @p user_id, if it is in flight. */
void worker_cancel_user(struct kvp_worker *w, struct kvp_chan *ch, uint64_t user_id);

/* xmsg.c: messages from the other workers */
/* Deliver what the other workers sent, in the order each sent it. @return messages handled */
int worker_xinbox(struct kvp_worker *w);
/* Messages from another worker are waiting (a reason not to sleep). */
bool worker_xpending(const struct kvp_worker *w);

/* route.c: the worker's transports */
int route_post(struct kvp_worker *w, struct kvp_xfer *x);
void route_cancel(struct kvp_worker *w, struct kvp_xfer *x, int status);
int route_attach(struct kvp_worker *w, uint16_t peer, uint8_t link, int fd, bool outgoing,
		 uint64_t epoch);
uint32_t route_fence(struct kvp_worker *w, const struct kvp_fence *f, bool force);
/* Close every connection of peer slot @p peer on every transport. */
void route_disconnect(struct kvp_worker *w, uint16_t peer);
void route_destroy(struct kvp_worker *w);

/* wpeer.c: the worker's peer slots */
/* wpeer_admit(): the transfer waits for its peer's first link (a private value, not a status). */
#define WPEER_WAIT (-1)
/*
 * Resolve x->handle to its open peer slot (x->peer) and count it in flight
 * there. @return KVP_OK (post it), WPEER_WAIT (parked until a link comes up
 * or the peer's wait ends), KVP_ENOPEER or KVP_EPEER (x->detail says why)
 */
int wpeer_admit(struct kvp_worker *w, struct kvp_xfer *x, uint64_t now);
/* A transfer counted by wpeer_admit() has ended (it left the transfer table). */
void wpeer_ended(struct kvp_worker *w, uint16_t slot);
void wpeer_why(struct kvp_worker *w, const struct kvp_msg *m);
void wpeer_close(struct kvp_worker *w, uint16_t slot);
/* An outgoing connection of the peer came up (waiting transfers go) or went down. */
void wpeer_link_up(struct kvp_worker *w, uint16_t slot);
void wpeer_link_down(struct kvp_worker *w, uint16_t slot);
/* Take a waiting transfer off its peer's list (cancel, deadline). */
void wpeer_unwait(struct kvp_worker *w, struct kvp_xfer *x);
/* Waits that ended, closes that are due. @return work done */
int wpeer_timers(struct kvp_worker *w, uint64_t now);

/* fence.c */
void fence_add(struct kvp_worker *w, struct kvp_chan *ch, const struct kvp_sqe_fence *f,
	       uint64_t now);
int fence_timers(struct kvp_worker *w, uint64_t now);
void fence_chan_gone(struct kvp_worker *w, struct kvp_chan *ch);
/* A fence message from another worker (set, drop or clear a mirror). */
void fence_xmsg(struct kvp_worker *w, const struct kvp_xmsg *m);

#endif /* WORKER_PRIV_H */
