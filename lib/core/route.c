/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Routing a worker's transfers over its transports: each transfer is offered
 * to them in order (the faster first: RDMA, then TCP), the first that takes
 * it owns it, and one that learns mid-flight that it cannot move it hands it
 * to the next. Every other per-transfer call goes to its owner; the
 * per-worker ones (progress, fences, connections) to all of them.
 */
#include <errno.h>
#include <string.h>

#include "kvp_transport.h"
#include "worker_priv.h"

int
kvp_worker_transports(struct kvp_worker *w, const struct kvp_transport_ops *const *ops,
		      unsigned n)
{
	if (n == 0 || n > KVP_TP_MAX)
		return -EINVAL;
	w->conn_tp = w->pchan_tp = -1;
	for (unsigned i = 0; i < n; i++) {
		int rc = ops[i]->create(w, i, &w->tp[i].tctx);

		if (rc < 0) {
			route_destroy(w);
			return rc;
		}
		w->tp[i].ops = ops[i];
		w->ntp = i + 1;
		if (ops[i]->attach && w->conn_tp < 0)
			w->conn_tp = (int)i;
		if (ops[i]->pchan && w->pchan_tp < 0)
			w->pchan_tp = (int)i;
	}
	return 0;
}

void
route_destroy(struct kvp_worker *w)
{
	for (unsigned i = w->ntp; i-- > 0;) {
		w->tp[i].ops->destroy(w->tp[i].tctx);
		w->tp[i].tctx = NULL;
	}
	w->ntp = 0;
}

/* Offer x to transports [from, ntp). @return 0 taken; negative: none could */
static int
offer(struct kvp_worker *w, struct kvp_xfer *x, unsigned from)
{
	int rc = -ENOTCONN;

	for (unsigned i = from; i < w->ntp; i++) {
		x->tp = (uint8_t)i;
		rc = w->tp[i].ops->post(w->tp[i].tctx, x);
		if (rc != -EAGAIN)
			return rc;
	}
	return rc;
}

int
route_post(struct kvp_worker *w, struct kvp_xfer *x)
{
	return offer(w, x, 0);
}

void
kvp_worker_handover(struct kvp_worker *w, struct kvp_xfer *x)
{
	x->t_seg = x->t_frames = 0;
	x->t_blk = x->t_off = 0;
	x->t_state = 0;
	x->next = NULL;
	if (offer(w, x, x->tp + 1u) < 0)
		kvp_worker_xfer_end(w, x, KVP_EPEER);
}

void
route_cancel(struct kvp_worker *w, struct kvp_xfer *x, int status)
{
	if (x->tp == KVP_XFER_TP_WAIT) {
		/* No transport has it yet: it waits for its peer's first link. */
		wpeer_unwait(w, x);
		kvp_worker_xfer_end(w, x, status);
		return;
	}
	w->tp[x->tp].ops->cancel(w->tp[x->tp].tctx, x, status);
}

void
route_disconnect(struct kvp_worker *w, uint16_t peer)
{
	for (unsigned i = 0; i < w->ntp; i++)
		if (w->tp[i].ops->disconnect)
			w->tp[i].ops->disconnect(w->tp[i].tctx, peer);
}

int
route_attach(struct kvp_worker *w, uint16_t peer, uint8_t link, int fd, bool outgoing,
	     uint64_t epoch)
{
	if (w->conn_tp < 0)
		return -ENOTSUP;
	const struct kvp_tp *t = &w->tp[w->conn_tp];

	return t->ops->attach(t->tctx, peer, link, fd, outgoing, epoch);
}

int
kvp_worker_progress(struct kvp_worker *w)
{
	int work = 0;

	for (unsigned i = 0; i < w->ntp; i++)
		work += w->tp[i].ops->progress(w->tp[i].tctx);
	/* After the transports submitted their work (the receiver's ACKs leave first). */
	worker_flush_notify(w);
	return work;
}

unsigned
kvp_worker_sleep_fds(struct kvp_worker *w, int *fds, unsigned max)
{
	unsigned n = 0;

	for (unsigned i = 0; i < w->ntp && n < max; i++) {
		int fd = w->tp[i].ops->sleep_fd(w->tp[i].tctx);

		if (fd >= 0)
			fds[n++] = fd;
	}
	return n;
}

uint32_t
route_fence(struct kvp_worker *w, const struct kvp_fence *f, bool force)
{
	uint32_t busy = 0;

	for (unsigned i = 0; i < w->ntp; i++)
		if (w->tp[i].ops->fence)
			busy += w->tp[i].ops->fence(w->tp[i].tctx, f, force);
	return busy;
}
