/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * RDMA send side. A transfer asks the receiver for a grant per destination
 * region (REQ -> GRANT: address, length, rkey per receiver rail), then its
 * segments go out as RDMA WRITEs: large ones split at rdma.chunk and
 * striped round-robin over the QPs of unpaused rails, small contiguous ones
 * coalesced. WRs are chained per QP and posted once per iteration; a
 * completion is requested every rdma.signal_every WRs and on the last of
 * each batch, and a completion retires every earlier WR of its QP. When
 * every WRITE has completed, a zero-length WRITE_WITH_IMM tells the
 * receiver, whose ACK (over TCP) completes the transfer.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "rdma_priv.h"

static void
send_abort(struct rdma_ctx *c, uint16_t peer, uint64_t tag)
{
	struct kvp_wire_hdr h;

	kvp_wire_hdr_init(&h, KVP_W_ABORT, 0, tag);
	/* Lost only when the queue is full; the receiver then frees the grant on reuse. */
	kvp_pchan_send(c->w, peer, true, &h, NULL);
}

static void
list_append(struct rpeer *rp, struct kvp_xfer *x)
{
	x->next = NULL;
	if (rp->post_tail)
		rp->post_tail->next = x;
	else
		rp->post_head = x;
	rp->post_tail = x;
}

/*
 * A transfer whose WRITEs all completed goes before those still posting:
 * its notice is one WR, and behind their WRITEs it would wait until every
 * later transfer was posted (every landing held back to the end).
 */
static void
list_insert_flushed(struct rpeer *rp, struct kvp_xfer *x)
{
	struct kvp_xfer **pp = &rp->post_head, *prev = NULL;

	while (*pp && (*pp)->t_state == RS_FLUSH) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	x->next = *pp;
	*pp = x;
	if (rp->post_tail == prev)
		rp->post_tail = x;
}

static void
list_remove(struct rpeer *rp, struct kvp_xfer *x)
{
	struct kvp_xfer **pp = &rp->post_head, *prev = NULL;

	while (*pp && *pp != x) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	if (!*pp)
		return;
	*pp = x->next;
	if (rp->post_tail == x)
		rp->post_tail = prev;
	x->next = NULL;
}

/* End an RDMA transfer that holds no WR any more. */
static void
finish(struct rdma_ctx *c, struct kvp_xfer *x, int status, bool abort)
{
	list_remove(&c->peers[x->peer], x);
	if (abort)
		send_abort(c, x->peer, kvp_xfer_tag(x));
	kvp_worker_xfer_end(c->w, x, status);
}

/* A transfer's WRs all retired: post its notice, or end it if it failed. */
static void
settle(struct rdma_ctx *c, struct kvp_xfer *x)
{
	struct txs *t = &c->txs[x->idx];

	if (t->outstanding)
		return;
	if (x->t_state == RS_DRAIN)
		finish(c, x, x->status, true);
	else if (x->t_state == RS_FLUSH)
		list_insert_flushed(&c->peers[x->peer], x); /* tx_progress posts the imm */
}

int
tx_post(struct rdma_ctx *c, struct kvp_xfer *x)
{
	struct txs *t = &c->txs[x->idx];

	memset(t, 0, offsetof(struct txs, raddr));
	for (uint32_t i = 0; i < x->nseg; i++) {
		uint64_t k = x->segs[i].dst_key;
		uint8_t j;

		for (j = 0; j < t->nkeys && t->keys[j] != k; j++)
			;
		if (j < t->nkeys)
			continue;
		if (t->nkeys == GDR_DST_MAX)
			return -EAGAIN; /* too many destination regions: TCP takes it */
		t->keys[t->nkeys++] = k;
	}
	if (kvp_pchan_room(c->w, x->peer, true) < t->nkeys + 1u)
		return -EAGAIN;
	for (uint8_t j = 0; j < t->nkeys; j++) {
		struct kvp_wire_hdr h;

		kvp_wire_hdr_init(&h, KVP_W_RDMA_REQ, 0, kvp_xfer_tag(x));
		h.key = t->keys[j];
		h.off = x->bytes;
		h.aux = x->user_id;
		h.aux2 = x->nseg;
		h.rsvd = t->nkeys;
		kvp_pchan_send(c->w, x->peer, true, &h, NULL);
		t->reqs++;
	}
	t->last_slot = -1;
	x->t_state = RS_GRANT;
	x->next = NULL;
	KVP_STAT_ADD(c->w->stats.rdma_xfers, 1);
	return 0;
}

int
tx_on_grant(struct rdma_ctx *c, uint16_t peer, const struct kvp_wire_hdr *h,
	    const struct kvp_wire_grant *g)
{
	struct kvp_xfer *x = kvp_worker_xfer_of(c->w, h->tag);

	if (!x || x->peer != peer || x->t_state != RS_GRANT) {
		/* The transfer ended meanwhile: free what the receiver holds for it. */
		if (g->status == KVP_GRANT_OK)
			send_abort(c, peer, h->tag);
		return 0;
	}
	struct txs *t = &c->txs[x->idx];
	uint8_t k;
	for (k = 0; k < t->nkeys && t->keys[k] != h->key; k++)
		;
	if (k == t->nkeys || t->granted == t->nkeys || g->nrails > GDR_RAILS)
		return -EINVAL; /* a grant nobody asked for */
	t->granted++;
	switch (g->status) {
	case KVP_GRANT_OK:
		t->raddr[k] = g->addr;
		t->rlen[k] = g->len;
		t->imm = g->imm;
		memcpy(t->rkey[k], g->rkey, sizeof(t->rkey[k]));
		break;
	case KVP_GRANT_NOMR:
	case KVP_GRANT_BUSY:
		t->fallback = true;
		break;
	default:
		if (x->status == KVP_OK)
			x->status = KVP_EREMOTE;
		break;
	}
	if (t->granted < t->nkeys)
		return 0;
	if (x->status != KVP_OK) {
		finish(c, x, x->status, true);
	} else if (t->fallback) {
		/* The receiver cannot take it by RDMA: the whole transfer goes by the next transport. */
		send_abort(c, peer, h->tag);
		KVP_STAT_ADD(c->w->stats.rdma_fallbacks, 1);
		kvp_worker_handover(c->w, x);
	} else {
		x->ts[KVP_TS_ADMIT] = kvp_mono_ns();
		x->t_state = RS_POST;
		list_append(&c->peers[peer], x);
	}
	return 0;
}

int
tx_on_ack(struct rdma_ctx *c, const struct kvp_wire_hdr *h)
{
	struct kvp_xfer *x = kvp_worker_xfer_of(c->w, h->tag);

	if (!x || x->t_state != RS_WAIT_ACK)
		return 0; /* ended meanwhile (cancelled, timed out) */
	x->ts[KVP_TS_ACKED] = kvp_mono_ns();
	kvp_worker_xfer_end(c->w, x, h->aux == KVP_OK ? KVP_OK : KVP_EREMOTE);
	return 0;
}

/* The receiver's client fenced the transfer: stop; the ABORT after the last WRITE frees its grant. */
void
tx_on_revoke(struct rdma_ctx *c, uint16_t peer, uint64_t tag)
{
	struct kvp_xfer *x = kvp_worker_xfer_of(c->w, tag);

	if (x && x->peer == peer && x->tp == c->idx)
		tx_cancel(c, x, KVP_EREMOTE);
}

static bool
rail_usable(const struct sqp *q)
{
	return q->state == QP_UP &&
	       !atomic_load_explicit(&gdr.rails[q->rail].paused, memory_order_relaxed);
}

/*
 * Next QP of the stripe with room for a WRITE (the last ring entry is kept
 * for an imm), among the rails in @p prefer (those behind a GPU's PCIe
 * switch) while any of them is usable, else among all.
 */
static int
pick_qp(struct rdma_ctx *c, struct rpeer *rp, uint32_t prefer)
{
	bool any_preferred = false;

	for (uint32_t s = 0; prefer && s < c->nslots && !any_preferred; s++)
		any_preferred = (prefer >> rp->sq[s].rail & 1) && rail_usable(&rp->sq[s]);
	for (uint32_t k = 0; k < c->nslots; k++) {
		uint32_t s = (rp->rr + k) % c->nslots;
		struct sqp *q = &rp->sq[s];

		if (any_preferred && !(prefer >> q->rail & 1))
			continue;
		/* Bounded in WRs and in bytes: a deep queue of large WRITEs only adds latency. */
		if (rail_usable(q) && q->head - q->tail < q->depth && q->bytes_out < c->window) {
			rp->rr = s + 1;
			return (int)s;
		}
	}
	return -1;
}

static void
flush_qp(struct rdma_ctx *c, uint16_t peer, uint32_t slot)
{
	struct sqp *q = &c->peers[peer].sq[slot];
	struct ibv_send_wr *bad = NULL;

	if (q->nb == 0)
		return;
	/* The batch's last WR is signaled, so nothing waits for a later post to retire. */
	q->wr[q->nb - 1].send_flags |= IBV_SEND_SIGNALED;
	q->unsig = 0;
	for (uint32_t i = 0; i + 1 < q->nb; i++)
		q->wr[i].next = &q->wr[i + 1];
	q->wr[q->nb - 1].next = NULL;
	int rc = ibv_post_send(q->qp, q->wr, &bad);
	q->nb = 0;
	if (rc) {
		KVP_LOG_RL(WARNING, gdr, "peer %u QP %u: post failed: %s", peer, slot, strerror(rc));
		qp_send_fail(c, peer, slot);
	}
}

/*
 * Make room in QP @p slot's batch. A failed post fails the QP and may end
 * @p x: @return false if the caller must stop (QP down, or x no longer in
 * @p state).
 */
static bool
batch_room(struct rdma_ctx *c, uint16_t peer, uint32_t slot, struct kvp_xfer *x, uint8_t state)
{
	struct sqp *q = &c->peers[peer].sq[slot];
	uint32_t gen = x->gen;

	if (q->nb == GDR_BATCH)
		flush_qp(c, peer, slot);
	return q->state == QP_UP && x->state == KVP_XS_ACTIVE && x->gen == gen && x->t_state == state;
}

/* Append one WR to QP @p slot's batch (batch_room() said yes) and record what it carries. */
static struct ibv_send_wr *
add_wr(struct rdma_ctx *c, uint16_t peer, uint32_t slot, struct kvp_xfer *x, uint32_t bytes,
       bool imm)
{
	struct sqp *q = &c->peers[peer].sq[slot];
	struct wr_rec *rec = &q->ring[q->head % (q->depth + 1)];
	*rec = (struct wr_rec){ .xfer = x->idx, .gen = x->gen, .bytes = bytes, .imm = imm };
	struct ibv_send_wr *wr = &q->wr[q->nb];
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = wrid_make(false, peer, slot, q->gen, q->head);
	wr->sg_list = q->sge[q->nb];
	q->head++;
	q->nb++;
	if (++q->unsig >= c->signal_every) {
		wr->send_flags |= IBV_SEND_SIGNALED;
		q->unsig = 0;
	}
	if (!imm)
		c->txs[x->idx].outstanding++;
	q->bytes_out += bytes;
	return wr;
}

/*
 * Post the next WRITE of x, as the planner cuts it: a contiguous range, or
 * blocks of a strided source gathered into one WRITE where they land
 * contiguously (a WRITE has one remote address: blocks apart at the
 * destination take one WRITE each). @return 1 posted, 0 no QP has room
 * (stop for this peer), -1 the transfer failed (destination out of its grant).
 */
static int
post_write(struct rdma_ctx *c, struct rpeer *rp, struct kvp_xfer *x)
{
	struct txs *t = &c->txs[x->idx];
	const struct kvp_seg *s = &x->segs[x->t_seg];
	uint32_t prefer = (s->src->flags & KVP_REGION_F_GPU) && s->src->device >= 0 &&
					  s->src->device < KVP_GPUS_MAX
				  ? gdr.gpu_rails[s->src->device]
				  : 0;
	int slot = pick_qp(c, rp, prefer);

	if (slot < 0 || !batch_room(c, x->peer, (uint32_t)slot, x, RS_POST))
		return 0;
	struct sqp *q = &rp->sq[slot];
	struct kvp_piece p;

	kvp_plan_next(x, c->chunk, q->nsge, KVP_PLAN_DST_CONTIG, &p);
	uint64_t len = p.len * p.nblk;
	uint8_t k;
	for (k = 0; k < t->nkeys && t->keys[k] != p.seg->dst_key; k++)
		;
	if (p.dst_off > t->rlen[k] || len > t->rlen[k] - p.dst_off) {
		KVP_LOG_RL(WARNING, gdr, "transfer %016" PRIx64 ": destination range beyond the "
			   "granted region (off %" PRIu64 " len %" PRIu64 " of %" PRIu64 ")",
			   kvp_xfer_tag(x), p.dst_off, len, t->rlen[k]);
		return -1;
	}
	struct ibv_send_wr *wr = add_wr(c, x->peer, (uint32_t)slot, x, (uint32_t)len, false);
	const struct gdr_mrs *m = region_mrs(p.seg->src);
	uint32_t lkey = m->mr[gdr.rails[q->rail].dev]->lkey;
	/* One gather entry for a contiguous piece, one per block otherwise. */
	uint32_t nsge = p.nblk > 1 && p.src_stride != p.len ? (uint32_t)p.nblk : 1;
	for (uint32_t j = 0; j < nsge; j++) {
		wr->sg_list[j].addr = (uint64_t)(uintptr_t)(p.seg->src->base + p.src_off +
							   j * p.src_stride);
		wr->sg_list[j].length = nsge > 1 ? (uint32_t)p.len : (uint32_t)len;
		wr->sg_list[j].lkey = lkey;
	}
	wr->num_sge = (int)nsge;
	wr->opcode = IBV_WR_RDMA_WRITE;
	wr->wr.rdma.remote_addr = t->raddr[k] + p.dst_off;
	wr->wr.rdma.rkey = t->rkey[k][q->rrail];
	if (len <= c->inline_max && len <= q->inl && !m->gpu)
		wr->send_flags |= IBV_SEND_INLINE;
	KVP_STAT_ADD(c->w->stats.rail[q->rail].tx_wrs, 1);
	t->last_slot = slot;
	if (!x->ts[KVP_TS_FIRST])
		x->ts[KVP_TS_FIRST] = kvp_mono_ns();
	return 1;
}

/* The notice after the last WRITE: on the last WRITE's QP if usable, else any. */
static bool
post_imm(struct rdma_ctx *c, struct rpeer *rp, struct kvp_xfer *x)
{
	struct txs *t = &c->txs[x->idx];
	int slot = -1;

	if (t->last_slot >= 0 && rp->sq[t->last_slot].state == QP_UP &&
	    rp->sq[t->last_slot].head - rp->sq[t->last_slot].tail <= rp->sq[t->last_slot].depth)
		slot = t->last_slot;
	for (uint32_t s = 0; slot < 0 && s < c->nslots; s++)
		if (rp->sq[s].state == QP_UP && rp->sq[s].head - rp->sq[s].tail <= rp->sq[s].depth)
			slot = (int)s;
	if (slot < 0 || !batch_room(c, x->peer, (uint32_t)slot, x, RS_FLUSH))
		return false;
	struct ibv_send_wr *wr = add_wr(c, x->peer, (uint32_t)slot, x, 0, true);
	wr->num_sge = 0;
	wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr->imm_data = htonl(t->imm);
	wr->wr.rdma.remote_addr = t->raddr[0];
	wr->wr.rdma.rkey = t->rkey[0][rp->sq[slot].rrail];
	wr->send_flags |= IBV_SEND_SIGNALED;
	x->t_state = RS_WAIT_ACK;
	return true;
}

static int
peer_progress(struct rdma_ctx *c, uint16_t peer)
{
	struct rpeer *rp = &c->peers[peer];
	int work = 0;

	while (rp->post_head) {
		struct kvp_xfer *x = rp->post_head;

		if (x->t_state == RS_FLUSH) {
			if (!post_imm(c, rp, x))
				break;
			list_remove(rp, x);
			work++;
			continue;
		}
		int rc = post_write(c, rp, x);
		if (rc == 0)
			break;
		work++;
		if (rc < 0) {
			if (x->status == KVP_OK)
				x->status = KVP_EREMOTE;
			list_remove(rp, x);
			x->t_state = RS_DRAIN;
			settle(c, x);
			continue;
		}
		if (x->t_seg == x->nseg) {
			list_remove(rp, x);
			x->ts[KVP_TS_POSTED] = kvp_mono_ns();
			x->t_state = RS_FLUSH;
			/* Completions arrive after this flush, never before: settle() re-queues it. */
		}
	}
	for (uint32_t s = 0; s < c->nslots; s++)
		flush_qp(c, peer, s);
	return work;
}

int
tx_progress(struct rdma_ctx *c)
{
	int work = 0;

	for (uint16_t p = 0; p < c->npeers; p++)
		if (c->peers[p].post_head)
			work += peer_progress(c, p);
	return work;
}

/* Retire WRs of QP @p q up to and including sequence @p seq. */
static void
retire(struct rdma_ctx *c, uint16_t peer, struct sqp *q, uint32_t upto, int status)
{
	struct kvp_worker *w = c->w;

	while (q->tail != upto) {
		struct wr_rec *rec = &q->ring[q->tail % (q->depth + 1)];
		struct kvp_xfer *x = &w->xfers[rec->xfer];

		q->tail++;
		q->bytes_out -= rec->bytes;
		if (x->state != KVP_XS_ACTIVE || x->gen != rec->gen || x->tp != c->idx || rec->imm)
			continue;
		c->txs[x->idx].outstanding--;
		if (status == KVP_OK) {
			KVP_STAT_ADD(w->stats.rail[q->rail].tx_bytes, rec->bytes);
			KVP_STAT_ADD(w->stats.peer[peer].tx_bytes, rec->bytes);
		} else {
			if (x->status == KVP_OK)
				x->status = status;
			if (x->t_state == RS_POST || x->t_state == RS_FLUSH)
				list_remove(&c->peers[peer], x);
			x->t_state = RS_DRAIN;
		}
		settle(c, x);
	}
}

void
tx_send_wc(struct rdma_ctx *c, const struct ibv_wc *wc)
{
	uint32_t peer = WRID_PEER(wc->wr_id), slot = WRID_SLOT(wc->wr_id);

	if (peer >= c->npeers || slot >= c->nslots)
		return;
	struct sqp *q = &c->peers[peer].sq[slot];
	if (q->state == QP_DOWN || q->gen != WRID_GEN(wc->wr_id))
		return; /* a QP generation already torn down */
	/* Sequence numbers carry 24 bits: rebuild the full one from the tail. */
	uint32_t n = ((WRID_SEQ(wc->wr_id) - q->tail) & 0xffffffu) + 1;
	if (n > q->head - q->tail)
		return;
	retire(c, (uint16_t)peer, q, q->tail + n, KVP_OK);
}

void
tx_retire_all(struct rdma_ctx *c, uint16_t peer, uint32_t slot, int status)
{
	struct sqp *q = &c->peers[peer].sq[slot];

	q->nb = 0;
	retire(c, peer, q, q->head, status);
}

void
tx_cancel(struct rdma_ctx *c, struct kvp_xfer *x, int status)
{
	struct txs *t = &c->txs[x->idx];

	if (x->status == KVP_OK)
		x->status = status;
	switch (x->t_state) {
	case RS_GRANT:
		finish(c, x, status, true);
		break;
	case RS_POST:
	case RS_FLUSH:
		list_remove(&c->peers[x->peer], x);
		x->t_state = RS_DRAIN;
		if (!t->outstanding)
			finish(c, x, x->status, true);
		break;
	case RS_WAIT_ACK:
		/* The notice is out: the receiver lands it; its late ACK finds the tag stale. */
		kvp_worker_xfer_end(c->w, x, status);
		break;
	default:
		break; /* RS_DRAIN: ends when its WRs retire */
	}
}

void
tx_peer_down(struct rdma_ctx *c, uint16_t peer)
{
	struct kvp_worker *w = c->w;

	for (uint32_t i = 0; i < w->nxfers; i++) {
		struct kvp_xfer *x = &w->xfers[i];

		if (x->state == KVP_XS_ACTIVE && x->peer == peer && x->tp == c->idx &&
		    c->txs[i].outstanding == 0)
			finish(c, x, KVP_EPEER, false);
	}
}
