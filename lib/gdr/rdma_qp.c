/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Queue pairs. Each direction of each (peer, rail, index) is one RC QP
 * pair: the sender builds its end when its TCP connection to the peer comes
 * up and sends it (RDMA_QP); the receiver builds the other end, posts the
 * receives that take WRITE_WITH_IMM notices, and answers (RDMA_QP_OK). A QP
 * that fails is torn down and rebuilt with the next generation, so late
 * completions and frames of the old one are recognised and ignored.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "rdma_priv.h"

static uint32_t
rand_psn(void)
{
	uint32_t v = 0;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != sizeof(v))
		v = (uint32_t)kvp_mono_ns();
	return v & 0xffffff;
}

static struct ibv_qp *
qp_create(struct rdma_ctx *c, unsigned rail, uint32_t send_wr, uint32_t recv_wr, uint32_t *inl,
	  uint32_t *nsge)
{
	struct ibv_cq *cq = c->cq[gdr.rails[rail].dev].cq;
	int dev_sge = gdr.devs[gdr.rails[rail].dev].attr.max_sge;
	uint32_t sge = nsge && dev_sge > 1 ? (dev_sge < GDR_SGE ? (uint32_t)dev_sge : GDR_SGE) : 1;
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = send_wr, .max_recv_wr = recv_wr, .max_send_sge = sge,
			 .max_recv_sge = 1, .max_inline_data = inl ? *inl : 0 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
	};
	struct ibv_qp *qp = ibv_create_qp(gdr.devs[gdr.rails[rail].dev].pd, &a);

	if (!qp && a.cap.max_inline_data) {
		/* The device takes less inline data than configured: go without. */
		a.cap.max_inline_data = 0;
		qp = ibv_create_qp(gdr.devs[gdr.rails[rail].dev].pd, &a);
	}
	if (!qp)
		return NULL;
	if (inl)
		*inl = a.cap.max_inline_data; /* what the device granted */
	if (nsge)
		*nsge = a.cap.max_send_sge < GDR_SGE ? a.cap.max_send_sge : GDR_SGE;
	struct ibv_qp_attr m = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = gdr.rails[rail].port,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE,
	};
	if (ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					   IBV_QP_ACCESS_FLAGS) != 0) {
		ibv_destroy_qp(qp);
		return NULL;
	}
	return qp;
}

/* INIT -> RTR -> RTS towards the remote end @p q. @return 0 or negative errno */
static int
qp_connect(struct rdma_ctx *c, struct ibv_qp *qp, unsigned rail, uint32_t my_psn,
	   const struct kvp_wire_qp *q)
{
	const struct gdr_rail *r = &gdr.rails[rail];
	const struct kvp_config *cfg = c->w->cfg;
	struct ibv_qp_attr m = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = (enum ibv_mtu)(q->mtu < r->mtu ? q->mtu : r->mtu),
		.dest_qp_num = q->qpn,
		.rq_psn = q->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .dlid = q->lid, .sl = 0, .port_num = r->port },
	};

	if (q->mtu < IBV_MTU_256 || q->mtu > IBV_MTU_4096)
		return -EINVAL;
	if (r->link_layer == IBV_LINK_LAYER_ETHERNET || q->link_layer == IBV_LINK_LAYER_ETHERNET) {
		m.ah_attr.is_global = 1;
		memcpy(m.ah_attr.grh.dgid.raw, q->gid, sizeof(q->gid));
		m.ah_attr.grh.sgid_index = (uint8_t)r->gid_index;
		m.ah_attr.grh.hop_limit = 64;
	}
	if (ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					   IBV_QP_MIN_RNR_TIMER) != 0)
		return -errno;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTS;
	m.timeout = (uint8_t)cfg->rdma_timeout;
	m.retry_cnt = (uint8_t)cfg->rdma_retry;
	m.rnr_retry = 7; /* receives are reposted as they complete: wait, never fail */
	m.sq_psn = my_psn;
	m.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) != 0)
		return -errno;
	return 0;
}

static void
fill_wire(struct kvp_wire_qp *w, unsigned rail, struct ibv_qp *qp, uint32_t psn, uint32_t slot,
	  uint32_t gen)
{
	const struct gdr_rail *r = &gdr.rails[rail];

	memset(w, 0, sizeof(*w));
	memcpy(w->gid, r->gid.raw, sizeof(w->gid));
	w->qpn = qp ? qp->qp_num : 0;
	w->psn = psn;
	w->gen = gen;
	w->lid = r->lid;
	w->slot = (uint8_t)slot;
	w->rail = (uint8_t)rail;
	w->nrails = (uint8_t)gdr.nrails;
	w->mtu = r->mtu;
	w->link_layer = r->link_layer;
}

static bool
send_frame(struct rdma_ctx *c, uint16_t peer, bool outgoing, uint8_t type, const void *payload,
	   uint32_t len, uint64_t aux, uint32_t aux2, uint32_t rsvd)
{
	struct kvp_wire_hdr h;

	kvp_wire_hdr_init(&h, type, len, 0);
	h.aux = aux;
	h.aux2 = aux2;
	h.rsvd = rsvd;
	return kvp_pchan_send(c->w, peer, outgoing, &h, payload);
}

static void
sq_destroy(struct rdma_ctx *c, uint16_t peer, uint32_t slot)
{
	struct sqp *q = &c->peers[peer].sq[slot];

	if (q->state == QP_UP)
		KVP_STAT_SET(c->w->stats.rail[q->rail].qps_up, c->w->stats.rail[q->rail].qps_up - 1);
	if (q->qp) {
		struct ibv_qp_attr m = { .qp_state = IBV_QPS_ERR };

		/* Stop the hardware before the memory its WRs name can go. */
		ibv_modify_qp(q->qp, &m, IBV_QP_STATE);
		ibv_destroy_qp(q->qp);
		q->qp = NULL;
	}
	q->state = QP_DOWN;
	q->since_ns = kvp_mono_ns();
}

/* Build and announce every send QP of @p peer that is down. */
void
qp_peer_up(struct rdma_ctx *c, uint16_t peer)
{
	struct rpeer *rp = &c->peers[peer];
	struct kvp_wire_qp w;

	if (!rp->out_up || rp->no_rdma)
		return;
	for (uint32_t s = 0; s < c->nslots; s++) {
		struct sqp *q = &rp->sq[s];

		if (q->state != QP_DOWN)
			continue;
		if (q->qp || q->head != q->tail) {
			sq_destroy(c, peer, s);
			tx_retire_all(c, peer, s, KVP_EPEER);
		}
		q->inl = c->inline_max;
		q->qp = qp_create(c, q->rail, q->depth + 1, 1, &q->inl, &q->nsge);
		if (!q->qp) {
			KVP_LOG_RL(WARNING, gdr, "peer %u: cannot create send QP %u on rail %u: %s",
				   peer, s, q->rail, strerror(errno));
			continue;
		}
		q->gen++;
		q->psn = rand_psn();
		q->head = q->tail = q->unsig = 0;
		q->bytes_out = 0;
		q->nb = 0;
		fill_wire(&w, q->rail, q->qp, q->psn, s, q->gen);
		if (!send_frame(c, peer, true, KVP_W_RDMA_QP, &w, sizeof(w), 0, 0, 0)) {
			sq_destroy(c, peer, s);
			continue;
		}
		q->state = QP_CONNECTING;
		q->since_ns = kvp_mono_ns();
	}
}

/* Send QP @p slot failed: stop it, fail what it carried, build the next generation. */
void
qp_send_fail(struct rdma_ctx *c, uint16_t peer, uint32_t slot)
{
	struct sqp *q = &c->peers[peer].sq[slot];

	KVP_STAT_ADD(c->w->stats.rail[q->rail].qp_resets, 1);
	sq_destroy(c, peer, slot);
	tx_retire_all(c, peer, slot, KVP_EPEER);
	qp_peer_up(c, peer);
}

void
qp_send_down(struct rdma_ctx *c, uint16_t peer, const char *why)
{
	struct rpeer *rp = &c->peers[peer];

	for (uint32_t s = 0; s < c->nslots; s++) {
		if (rp->sq[s].state == QP_DOWN && !rp->sq[s].qp)
			continue;
		sq_destroy(c, peer, s);
		tx_retire_all(c, peer, s, KVP_EPEER);
	}
	tx_peer_down(c, peer);
	KVP_LOG(INFO, gdr, "peer %u: send QPs down (%s)", peer, why);
}

static void
rq_destroy(struct rdma_ctx *c, uint16_t peer, uint32_t slot)
{
	struct rqp *q = &c->peers[peer].rq[slot];

	if (q->qp) {
		struct ibv_qp_attr m = { .qp_state = IBV_QPS_ERR };

		ibv_modify_qp(q->qp, &m, IBV_QP_STATE);
		ibv_destroy_qp(q->qp);
		q->qp = NULL;
	}
	q->up = false;
}

void
qp_recv_down(struct rdma_ctx *c, uint16_t peer)
{
	for (uint32_t s = 0; s < GDR_SLOTS; s++)
		rq_destroy(c, peer, s);
}

void
qp_send_reset(struct rdma_ctx *c, uint16_t peer, uint32_t slot, int status, const char *why)
{
	if (slot >= GDR_SLOTS)
		return;
	uint16_t gen = c->peers[peer].rq[slot].gen;

	rq_destroy(c, peer, slot);
	/* Tell the sender, unless it told us (status < 0). */
	if (status >= 0 && why &&
	    !send_frame(c, peer, false, KVP_W_RDMA_RESET, NULL, 0, slot, gen, (uint32_t)status))
		kvp_pchan_fail(c->w, peer, false, "control queue full");
}

int
qp_post_recvs(struct rdma_ctx *c, uint16_t peer, uint32_t slot, uint32_t n)
{
	struct rqp *q = &c->peers[peer].rq[slot];
	struct ibv_recv_wr wr[GDR_BATCH], *bad;

	while (n > 0) {
		uint32_t k = n < GDR_BATCH ? n : GDR_BATCH;

		for (uint32_t i = 0; i < k; i++) {
			/* No scatter list: a WRITE_WITH_IMM consumes the WR, the data went by WRITE. */
			wr[i] = (struct ibv_recv_wr){ .wr_id = wrid_make(true, peer, slot, q->gen, 0),
						      .next = i + 1 < k ? &wr[i + 1] : NULL };
		}
		int rc = ibv_post_recv(q->qp, wr, &bad);
		if (rc)
			return -rc;
		n -= k;
	}
	return 0;
}

/* The peer announced its send QP: build our end, post receives, answer. */
int
qp_on_qp(struct rdma_ctx *c, uint16_t peer, const struct kvp_wire_qp *in)
{
	struct kvp_wire_qp w;
	uint32_t slot = in->slot;
	unsigned rail = in->rail % gdr.nrails;

	if (slot >= GDR_SLOTS)
		return -EINVAL;
	struct rqp *q = &c->peers[peer].rq[slot];
	rq_destroy(c, peer, slot);
	q->gen = (uint16_t)in->gen;
	q->rail = (uint8_t)rail;
	uint32_t psn = rand_psn();
	int rc = -ENOSPC;
	/* CQs are sized for peers with as many QP slots as this node has. */
	if (slot < c->nslots) {
		q->qp = qp_create(c, rail, 1, c->rq_depth, NULL, NULL);
		rc = q->qp ? qp_connect(c, q->qp, rail, psn, in) : -errno;
		if (rc == 0)
			rc = qp_post_recvs(c, peer, slot, c->rq_depth);
	}
	fill_wire(&w, rail, q->qp, psn, slot, in->gen);
	if (rc < 0) {
		KVP_LOG_RL(WARNING, gdr, "peer %u: cannot build receive QP %u on rail %u: %s", peer,
			   slot, rail, strerror(-rc));
		rq_destroy(c, peer, slot);
		w.status = 1;
	} else {
		q->up = true;
	}
	if (!send_frame(c, peer, false, KVP_W_RDMA_QP_OK, &w, sizeof(w), 0, 0, 0)) {
		rq_destroy(c, peer, slot);
		return -ENOBUFS;
	}
	return 0;
}

/* The receiver built its end of our send QP: connect ours. */
int
qp_on_qp_ok(struct rdma_ctx *c, uint16_t peer, const struct kvp_wire_qp *in)
{
	struct rpeer *rp = &c->peers[peer];

	if (in->slot >= c->nslots)
		return -EINVAL;
	struct sqp *q = &rp->sq[in->slot];
	if (q->state != QP_CONNECTING || q->gen != (uint16_t)in->gen)
		return 0; /* an answer for a generation we gave up on */
	int rc = in->status ? -ECONNREFUSED : qp_connect(c, q->qp, q->rail, q->psn, in);
	if (rc < 0) {
		KVP_LOG_RL(WARNING, gdr, "peer %u: send QP %u on rail %u not connected: %s", peer,
			   in->slot, q->rail,
			   in->status ? "the peer could not build its end" : strerror(-rc));
		sq_destroy(c, peer, in->slot);
		return 0;
	}
	q->rrail = in->rail;
	rp->rnrails = in->nrails;
	q->state = QP_UP;
	KVP_STAT_ADD(c->w->stats.rail[q->rail].qps_up, 1);
	KVP_LOG(INFO, gdr, "peer %u: send QP %u up (rail %u -> peer rail %u, qpn %u -> %u)", peer,
		in->slot, q->rail, in->rail, q->qp->qp_num, in->qpn);
	return 0;
}

/* Rebuild send QPs that went down; give up on answers that never came. */
void
qp_tick(struct rdma_ctx *c, uint64_t now)
{
	const struct kvp_config *cfg = c->w->cfg;
	uint64_t retry_ns = (uint64_t)cfg->reconnect_ms * 1000000;
	uint64_t connect_ns = (uint64_t)cfg->connect_timeout_ms * 1000000;

	for (uint16_t p = 0; p < c->npeers; p++) {
		struct rpeer *rp = &c->peers[p];
		bool rebuild = false;

		if (!rp->out_up || rp->no_rdma)
			continue;
		for (uint32_t s = 0; s < c->nslots; s++) {
			struct sqp *q = &rp->sq[s];

			if (q->state == QP_CONNECTING && now - q->since_ns > connect_ns) {
				KVP_LOG_RL(WARNING, gdr, "peer %u: send QP %u: no answer in %u ms", p,
					   s, cfg->connect_timeout_ms);
				sq_destroy(c, p, s);
			} else if (q->state == QP_DOWN && now - q->since_ns > retry_ns) {
				rebuild = true;
			}
		}
		if (rebuild)
			qp_peer_up(c, p);
	}
}
