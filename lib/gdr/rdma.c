/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The RDMA transport: per-worker instance, completion queues and the poll
 * loop. Its control frames (QP exchange, grants, acknowledgements) travel
 * on the peer control channel another transport provides (kvp_pchan_*),
 * which also tells it when a peer's connection comes and goes; a transfer
 * it cannot move is refused or handed over (kvp_worker_handover()) to the
 * next transport. See kvp_gdr.h for the protocol.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rte_lcore.h>
#include <rte_malloc.h>

#include "rdma_priv.h"

static const char *
wc_status_name(int st)
{
	return ibv_wc_status_str((enum ibv_wc_status)st);
}

/* QPs of one direction on device @p d: every peer's slots on the rails there. */
static uint64_t
qps_on_dev(const struct rdma_ctx *c, unsigned d)
{
	uint64_t n = 0;

	for (unsigned r = 0; r < gdr.nrails; r++)
		n += gdr.rails[r].dev == d;
	return n * c->npeers * (c->nslots / gdr.nrails);
}

static void
rdma_destroy(void *tctx)
{
	struct rdma_ctx *c = tctx;

	if (!c)
		return;
	for (uint32_t p = 0; c->peers && p < c->npeers; p++) {
		struct rpeer *rp = &c->peers[p];

		for (uint32_t s = 0; rp->sq && s < c->nslots; s++) {
			if (rp->sq[s].qp)
				ibv_destroy_qp(rp->sq[s].qp);
			rte_free(rp->sq[s].ring);
		}
		for (uint32_t s = 0; s < GDR_SLOTS; s++)
			if (rp->rq[s].qp)
				ibv_destroy_qp(rp->rq[s].qp);
		rx_release_all(c, (uint16_t)p);
		rte_free(rp->sq);
		rte_free(rp->g);
	}
	for (unsigned d = 0; d < GDR_DEVS; d++) {
		if (c->cq[d].cq)
			ibv_destroy_cq(c->cq[d].cq);
		if (c->cq[d].ch)
			ibv_destroy_comp_channel(c->cq[d].ch);
	}
	if (c->epfd >= 0)
		close(c->epfd);
	if (c->evfd >= 0)
		close(c->evfd);
	rte_free(c->peers);
	rte_free(c->txs);
	rte_free(c);
}

/*
 * Queue depths within what the devices allow: a CQ must hold a completion
 * for every WR that can be outstanding on the QPs it serves, so deep queues
 * on many peers shrink rather than overflow it.
 */
static void
fit_depths(struct rdma_ctx *c)
{
	for (unsigned d = 0; d < gdr.ndevs; d++) {
		const struct ibv_device_attr *a = &gdr.devs[d].attr;
		uint64_t qps = qps_on_dev(c, d);

		if ((int)c->sq_depth + 1 > a->max_qp_wr)
			c->sq_depth = (uint32_t)a->max_qp_wr - 1;
		if ((int)c->rq_depth > a->max_qp_wr)
			c->rq_depth = (uint32_t)a->max_qp_wr;
		while (qps * (c->sq_depth + 1 + c->rq_depth) > (uint64_t)a->max_cqe &&
		       (c->sq_depth > 8 || c->rq_depth > 8)) {
			if (c->sq_depth >= c->rq_depth)
				c->sq_depth /= 2;
			else
				c->rq_depth /= 2;
		}
	}
	if (c->sq_depth != c->w->cfg->rdma_sq_depth || c->rq_depth != c->w->cfg->rdma_rq_depth)
		KVP_LOG(NOTICE, gdr, "queue depths fitted to the devices: send %u, receive %u",
			c->sq_depth, c->rq_depth);
	if (c->signal_every > c->sq_depth / 2)
		c->signal_every = c->sq_depth / 2 ? c->sq_depth / 2 : 1;
}

static int
make_cqs(struct rdma_ctx *c)
{
	struct epoll_event ev = { .events = EPOLLIN };

	for (unsigned d = 0; d < gdr.ndevs; d++) {
		struct rcq *q = &c->cq[d];
		uint64_t qps = qps_on_dev(c, d);
		uint64_t n = qps * (c->sq_depth + 1 + c->rq_depth);

		if (n == 0)
			continue;
		q->size = (uint32_t)(n < (uint64_t)gdr.devs[d].attr.max_cqe ? n
									   : (uint64_t)gdr.devs[d].attr.max_cqe);
		q->ch = ibv_create_comp_channel(gdr.devs[d].ctx);
		if (!q->ch)
			return -errno;
		q->cq = ibv_create_cq(gdr.devs[d].ctx, (int)q->size, NULL, q->ch, 0);
		if (!q->cq)
			return -errno;
		int fl = fcntl(q->ch->fd, F_GETFL);
		if (fl < 0 || fcntl(q->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0)
			return -errno;
		ev.data.u32 = d;
		if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, q->ch->fd, &ev) < 0)
			return -errno;
	}
	return 0;
}

static int rdma_on_frame(void *arg, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
			 const void *payload);
static void rdma_on_conn(void *arg, uint16_t peer, bool outgoing, bool up);

static int
rdma_create(struct kvp_worker *w, unsigned idx, void **tctx)
{
	const struct kvp_config *cfg = w->cfg;
	int socket = rte_socket_id();
	struct rdma_ctx *c;
	int rc;

	if (gdr.nrails == 0)
		return -ENODEV;
	c = rte_zmalloc_socket("kvp_rdma", sizeof(*c), 64, socket);
	if (!c)
		return -ENOMEM;
	c->epfd = c->evfd = -1;
	c->w = w;
	c->idx = (uint8_t)idx;
	c->npeers = cfg->max_peers; /* every peer slot: one that joins at run time finds its QP slots */
	c->nslots = gdr.nrails * cfg->rdma_qps_per_rail;
	c->gmask = kvp_pow2_ceil(cfg->max_inflight) - 1;
	c->sq_depth = cfg->rdma_sq_depth;
	c->rq_depth = cfg->rdma_rq_depth;
	c->signal_every = cfg->rdma_signal_every;
	c->chunk = cfg->rdma_chunk;
	c->window = cfg->rdma_window > cfg->rdma_chunk ? cfg->rdma_window : cfg->rdma_chunk;
	c->inline_max = cfg->rdma_inline;
	rc = kvp_pchan_subscribe(w, &(struct kvp_pchan_sub){ .arg = c, .on_frame = rdma_on_frame,
							     .on_conn = rdma_on_conn });
	if (rc < 0)
		goto err;
	fit_depths(c);
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	c->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->epfd < 0 || c->evfd < 0) {
		rc = -errno;
		goto err;
	}
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = UINT32_MAX };
	if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->evfd, &ev) < 0) {
		rc = -errno;
		goto err;
	}
	rc = make_cqs(c);
	if (rc < 0)
		goto err;
	c->txs = rte_zmalloc_socket("kvp_rdma_txs", sizeof(*c->txs) * w->nxfers, 64, socket);
	c->peers = rte_zmalloc_socket("kvp_rdma_peers", sizeof(*c->peers) * (c->npeers ? c->npeers : 1),
				      64, socket);
	if (!c->txs || !c->peers) {
		rc = -ENOMEM;
		goto err;
	}
	for (uint32_t p = 0; p < c->npeers; p++) {
		struct rpeer *rp = &c->peers[p];

		rp->sq = rte_zmalloc_socket("kvp_rdma_sq", sizeof(*rp->sq) * c->nslots, 64, socket);
		rp->g = rte_zmalloc_socket("kvp_rdma_grants", sizeof(*rp->g) * (c->gmask + 1), 64,
					   socket);
		if (!rp->sq || !rp->g) {
			rc = -ENOMEM;
			goto err;
		}
		for (uint32_t s = 0; s < c->nslots; s++) {
			struct sqp *q = &rp->sq[s];

			q->rail = (uint8_t)(s / cfg->rdma_qps_per_rail);
			q->depth = c->sq_depth;
			q->ring = rte_zmalloc_socket("kvp_rdma_ring", sizeof(*q->ring) * (q->depth + 1), 64,
						     socket);
			if (!q->ring) {
				rc = -ENOMEM;
				goto err;
			}
		}
	}
	*tctx = c;
	return 0;
err:
	if (rc == 0)
		rc = -ENOMEM;
	rdma_destroy(c);
	return rc;
}

/* Can x go by RDMA? Every source registered, a QP up, few enough destinations. */
static bool
rdma_eligible(struct rdma_ctx *c, const struct kvp_xfer *x)
{
	const struct rpeer *rp = &c->peers[x->peer];
	bool up = false;

	if (!rp->out_up || !rp->in_up || rp->no_rdma)
		return false;
	for (uint32_t s = 0; s < c->nslots && !up; s++)
		up = rp->sq[s].state == QP_UP && !atomic_load_explicit(&gdr.rails[rp->sq[s].rail].paused,
								       memory_order_relaxed);
	if (!up)
		return false;
	for (uint32_t i = 0; i < x->nseg; i++)
		if (!x->segs[i].src->xp)
			return false;
	return true;
}

/* -EAGAIN: not by RDMA; the next transport (TCP staging) is asked. */
static int
rdma_post(void *tctx, struct kvp_xfer *x)
{
	struct rdma_ctx *c = tctx;

	if (x->peer < c->npeers && rdma_eligible(c, x)) {
		int rc = tx_post(c, x);

		if (rc != -EAGAIN)
			return rc;
	}
	if (x->peer < c->npeers && c->peers[x->peer].out_up && !c->peers[x->peer].no_rdma)
		KVP_STAT_ADD(c->w->stats.rdma_fallbacks, 1);
	return -EAGAIN;
}

void
rdma_wc_error(struct rdma_ctx *c, const struct ibv_wc *wc)
{
	uint32_t peer = WRID_PEER(wc->wr_id), slot = WRID_SLOT(wc->wr_id);
	uint16_t gen = WRID_GEN(wc->wr_id);
	struct kvp_worker_stats *st = &c->w->stats;
	char why[96];

	if (peer >= c->npeers || slot >= GDR_SLOTS)
		return;
	struct rpeer *rp = &c->peers[peer];
	if (wc->wr_id & WRID_RECV) {
		struct rqp *q = &rp->rq[slot];

		if (!q->up || q->gen != gen)
			return; /* flushed from a QP we already tore down */
		KVP_STAT_ADD(st->wc_errors[wc->status < KVP_WC_STATUS_MAX ? wc->status : 0], 1);
		KVP_STAT_ADD(st->rail[q->rail].wc_errors, 1);
		snprintf(why, sizeof(why), "receive completion error: %s", wc_status_name(wc->status));
		KVP_LOG_RL(WARNING, gdr, "peer %u receive QP %u: %s", peer, slot, why);
		qp_send_reset(c, (uint16_t)peer, slot, 0, why);
		return;
	}
	if (slot >= c->nslots)
		return;
	struct sqp *q = &rp->sq[slot];
	if (q->state == QP_DOWN || q->gen != gen)
		return;
	KVP_STAT_ADD(st->wc_errors[wc->status < KVP_WC_STATUS_MAX ? wc->status : 0], 1);
	KVP_STAT_ADD(st->rail[q->rail].wc_errors, 1);
	KVP_LOG_RL(WARNING, gdr, "peer %u send QP %u (rail %u): work completion error %s (vendor "
		   "%u): its transfers fail, the QP is rebuilt", peer, slot, q->rail,
		   wc_status_name(wc->status), wc->vendor_err);
	qp_send_fail(c, (uint16_t)peer, slot);
}

static void
dispatch_wc(struct rdma_ctx *c, const struct ibv_wc *wc)
{
	if (wc->status != IBV_WC_SUCCESS)
		rdma_wc_error(c, wc);
	else if (wc->wr_id & WRID_RECV)
		rx_recv_wc(c, wc);
	else
		tx_send_wc(c, wc);
}

/* Reap completions in batches; acknowledge completion-channel events first. */
static int
poll_cqs(struct rdma_ctx *c)
{
	struct ibv_wc wc[32];
	int work = 0;

	if (c->stash_rung) {
		uint64_t v;

		if (read(c->evfd, &v, sizeof(v)) < 0)
			v = 0; /* nothing to clear */
		c->stash_rung = false;
	}
	for (unsigned i = 0; i < c->nstash; i++)
		dispatch_wc(c, &c->stash[i]);
	work += (int)c->nstash;
	c->nstash = 0;
	for (unsigned d = 0; d < gdr.ndevs; d++) {
		struct rcq *q = &c->cq[d];

		if (!q->cq)
			continue;
		if (q->armed) {
			struct ibv_cq *ecq;
			void *ectx;

			while (ibv_get_cq_event(q->ch, &ecq, &ectx) == 0)
				ibv_ack_cq_events(ecq, 1);
			q->armed = false;
		}
		int n;
		while ((n = ibv_poll_cq(q->cq, 32, wc)) > 0) {
			for (int i = 0; i < n; i++)
				dispatch_wc(c, &wc[i]);
			work += n;
		}
	}
	return work;
}

static int
rdma_progress(void *tctx)
{
	struct rdma_ctx *c = tctx;
	int work = poll_cqs(c);

	work += tx_progress(c);
	uint64_t now = kvp_mono_ns();
	if (now >= c->next_tick_ns) {
		c->next_tick_ns = now + 10 * 1000000ull;
		qp_tick(c, now);
	}
	return work;
}

static void
rdma_cancel(void *tctx, struct kvp_xfer *x, int status)
{
	tx_cancel(tctx, x, status);
}

/*
 * Before sleeping: arm every CQ, then look once more — a completion that
 * arrived before arming raises no event, so it is kept and the doorbell
 * rung, and poll() returns at once.
 */
static int
rdma_sleep_fd(void *tctx)
{
	struct rdma_ctx *c = tctx;
	uint64_t one = 1;

	for (unsigned d = 0; d < gdr.ndevs && c->nstash < GDR_DEVS; d++) {
		struct rcq *q = &c->cq[d];

		if (!q->cq)
			continue;
		if (!q->armed && ibv_req_notify_cq(q->cq, 0) == 0)
			q->armed = true;
		if (ibv_poll_cq(q->cq, 1, &c->stash[c->nstash]) == 1)
			c->nstash++;
	}
	if (c->nstash && !c->stash_rung)
		c->stash_rung = write(c->evfd, &one, sizeof(one)) == sizeof(one);
	return c->epfd;
}


static uint32_t
rdma_fence(void *tctx, const struct kvp_fence *f, bool force)
{
	return rx_fence(tctx, f, force);
}

/* ---- the peer control channel ---- */

/* Control frames travel one way: requests to the receiver, answers back. */
static bool
direction_ok(bool outgoing, uint8_t type)
{
	switch (type) {
	case KVP_W_RDMA_QP:
	case KVP_W_RDMA_REQ:
		return !outgoing;
	case KVP_W_RDMA_QP_OK:
	case KVP_W_RDMA_GRANT:
	case KVP_W_RDMA_REVOKE:
		return outgoing;
	default:
		return true;
	}
}

static int
rdma_on_frame(void *arg, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
	      const void *payload)
{
	struct rdma_ctx *c = arg;
	struct kvp_wire_qp q;
	struct kvp_wire_grant g;

	if (peer >= c->npeers || !direction_ok(outgoing, h->type))
		return -EINVAL;
	switch (h->type) {
	case KVP_W_UNSUPPORTED:
		/* The peer has nobody for our QP exchange: everything to it goes over TCP. */
		if (h->aux != KVP_W_RDMA_QP)
			return 0;
		if (!c->peers[peer].no_rdma)
			KVP_LOG(NOTICE, gdr, "peer %u has no RDMA: its transfers go over TCP", peer);
		c->peers[peer].no_rdma = true;
		qp_send_down(c, peer, "peer has no RDMA");
		return 0;
	case KVP_W_RDMA_QP:
		memcpy(&q, payload, sizeof(q));
		return qp_on_qp(c, peer, &q);
	case KVP_W_RDMA_QP_OK:
		memcpy(&q, payload, sizeof(q));
		return qp_on_qp_ok(c, peer, &q);
	case KVP_W_RDMA_REQ:
		return rx_on_req(c, peer, h);
	case KVP_W_RDMA_GRANT:
		memcpy(&g, payload, sizeof(g));
		return tx_on_grant(c, peer, h, &g);
	case KVP_W_RDMA_RESET:
		if (h->aux >= GDR_SLOTS)
			return -EINVAL;
		if (outgoing) {
			/* The receiver lost its end of our send QP: fail what used it, rebuild. */
			if (h->aux < c->nslots && c->peers[peer].sq[h->aux].state != QP_DOWN)
				qp_send_fail(c, peer, (uint32_t)h->aux);
		} else {
			qp_send_reset(c, peer, (uint32_t)h->aux, -1, NULL);
		}
		return 0;
	case KVP_W_RDMA_REVOKE:
		tx_on_revoke(c, peer, h->tag);
		return 0;
	case KVP_W_ACK:
		return tx_on_ack(c, h);
	case KVP_W_ABORT:
		if (!outgoing)
			rx_on_abort(c, peer, h->tag);
		return 0;
	default:
		return -EINVAL;
	}
}

static void
rdma_on_conn(void *arg, uint16_t peer, bool outgoing, bool up)
{
	struct rdma_ctx *c = arg;

	if (peer >= c->npeers)
		return;
	struct rpeer *rp = &c->peers[peer];
	if (outgoing) {
		rp->out_up = up;
		if (up) {
			rp->no_rdma = false;
			qp_peer_up(c, peer);
		} else {
			qp_send_down(c, peer, "connection lost");
		}
	} else {
		rp->in_up = up;
		if (!up) {
			qp_recv_down(c, peer);
			rx_release_all(c, peer);
		}
	}
}

const struct kvp_transport_ops kvp_rdma_ops = {
	.name = "rdma",
	.caps = KVP_TCAP_HOST_MEM | KVP_TCAP_GPU_DIRECT,
	.create = rdma_create,
	.destroy = rdma_destroy,
	.post = rdma_post,
	.progress = rdma_progress,
	.cancel = rdma_cancel,
	.sleep_fd = rdma_sleep_fd,
	.fence = rdma_fence,
};
