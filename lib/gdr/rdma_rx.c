/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * RDMA receive side. A REQ names a destination region; the grant answers
 * with where the sender may write (the region's registration, one rkey per
 * rail) and holds a reference on the region until the transfer ends, so the
 * memory the peer writes into cannot be unmapped under it. The sender's
 * WRITE_WITH_IMM names the grant (slot | sequence << 16); its arrival means
 * every WRITE before it has landed: the client is told, and the ACK goes
 * back over TCP.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "rdma_priv.h"

static void
release(struct rgrant *g)
{
	for (unsigned i = 0; i < GDR_DST_MAX; i++) {
		if (g->r[i]) {
			kvp_region_put(g->r[i]);
			g->r[i] = NULL;
		}
	}
	g->state = G_FREE;
	g->tag = 0;
}

static uint8_t
grant_region(struct rdma_ctx *c, struct rgrant *g, uint64_t key, struct kvp_wire_grant *out)
{
	struct kvp_region *r = NULL;

	for (unsigned i = 0; i < g->ngranted; i++)
		if (g->r[i] && g->r[i]->key == key)
			r = g->r[i]; /* named twice: answer again, no second reference */
	if (!r) {
		r = kvp_region_get(c->w->regions, key);
		if (!r)
			return KVP_GRANT_NOREGION;
		/* Refused whole (its bytes counted) the first time one of its regions is fenced. */
		if (kvp_worker_fenced(c->w, r->owner, g->user_id, g->ngranted ? 0 : g->bytes, 1)) {
			kvp_region_put(r);
			return KVP_GRANT_FENCED;
		}
		if (!r->xp) {
			kvp_region_put(r);
			return KVP_GRANT_NOMR;
		}
		g->r[g->ngranted] = r;
	}
	const struct gdr_mrs *m = region_mrs(r);
	out->addr = (uint64_t)(uintptr_t)r->base;
	out->len = r->len;
	out->nrails = (uint8_t)gdr.nrails;
	for (unsigned i = 0; i < gdr.nrails; i++)
		out->rkey[i] = m->mr[gdr.rails[i].dev]->rkey;
	return KVP_GRANT_OK;
}

int
rx_on_req(struct rdma_ctx *c, uint16_t peer, const struct kvp_wire_hdr *h)
{
	struct rpeer *rp = &c->peers[peer];
	uint32_t idx = (uint32_t)h->tag & c->gmask;
	struct rgrant *g = &rp->g[idx];
	struct kvp_wire_grant out;
	struct kvp_wire_hdr a;

	if (h->rsvd == 0 || h->rsvd > GDR_DST_MAX)
		return -EINVAL;
	memset(&out, 0, sizeof(out));
	if (g->state != G_FREE && g->tag != h->tag) {
		/* Same sender slot, newer generation: the old transfer is over there. */
		if ((uint32_t)g->tag == (uint32_t)h->tag)
			release(g);
		else
			out.status = KVP_GRANT_BUSY; /* the peer has more in flight than this table */
	}
	if (out.status == KVP_GRANT_OK) {
		if (g->state == G_FREE) {
			memset(g->r, 0, sizeof(g->r));
			g->tag = h->tag;
			g->seq++;
			g->state = G_OPEN;
			g->revoked = false;
			g->nkeys = (uint8_t)h->rsvd;
			g->ngranted = 0;
			g->nseg = h->aux2;
			g->user_id = h->aux;
			g->bytes = h->off;
			g->first_ns = kvp_mono_ns();
			g->key0 = h->key;
		} else if (g->nkeys != h->rsvd || g->ngranted >= g->nkeys) {
			return -EINVAL;
		}
		out.status = grant_region(c, g, h->key, &out);
		g->ngranted++;
		out.imm = ((uint32_t)g->seq << 16) | idx;
	}
	kvp_wire_hdr_init(&a, KVP_W_RDMA_GRANT, sizeof(out), h->tag);
	a.key = h->key;
	if (!kvp_pchan_send(c->w, peer, false, &a, &out))
		kvp_pchan_fail(c->w, peer, false, "control queue full");
	return 0;
}

void
rx_on_abort(struct rdma_ctx *c, uint16_t peer, uint64_t tag)
{
	struct rgrant *g = &c->peers[peer].g[tag & c->gmask];

	if (g->state != G_FREE && g->tag == tag)
		release(g);
}

void
rx_recv_wc(struct rdma_ctx *c, const struct ibv_wc *wc)
{
	uint32_t peer = WRID_PEER(wc->wr_id), slot = WRID_SLOT(wc->wr_id);
	struct kvp_worker *w = c->w;

	if (peer >= c->npeers || slot >= GDR_SLOTS)
		return;
	struct rpeer *rp = &c->peers[peer];
	struct rqp *q = &rp->rq[slot];
	if (!q->up || q->gen != WRID_GEN(wc->wr_id))
		return;
	if (qp_post_recvs(c, (uint16_t)peer, slot, 1) < 0) {
		qp_send_reset(c, (uint16_t)peer, slot, 0, "cannot repost a receive");
		return;
	}
	if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc->wc_flags & IBV_WC_WITH_IMM)) {
		KVP_STAT_ADD(w->stats.peer[peer].bad_frames, 1);
		return;
	}
	uint32_t imm = ntohl(wc->imm_data), idx = imm & 0xffffu;
	struct rgrant *g = idx <= c->gmask ? &rp->g[idx] : NULL;
	if (!g || g->state != G_OPEN || g->seq != (uint16_t)(imm >> 16)) {
		/* A notice for a transfer its sender gave up on (cancelled, timed out). */
		KVP_LOG_RL(INFO, gdr, "peer %u: completion notice %08x for no open transfer", peer,
			   imm);
		return;
	}
	int status = g->ngranted == g->nkeys ? KVP_OK : KVP_EREMOTE;
	/* Fenced after the grant: the data is there, but its client disowned it. */
	if (status == KVP_OK && g->r[0] &&
	    kvp_worker_fenced(w, g->r[0]->owner, g->user_id, g->bytes, g->revoked ? 0 : 1))
		status = KVP_EREMOTE;
	for (unsigned i = 0; i < g->ngranted && status == KVP_OK; i++) {
		if (!g->r[i])
			status = KVP_EREMOTE;
		else if (region_mrs(g->r[i])->gpu && kvp_memops->flush_writes &&
			 kvp_memops->flush_writes(g->r[i]->device) < 0)
			status = KVP_EREMOTE; /* GPUDirect writes could not be made visible */
	}
	if (status == KVP_OK) {
		KVP_STAT_ADD(w->stats.peer[peer].rx_bytes, g->bytes);
		KVP_STAT_ADD(w->stats.rail[q->rail].rx_imms, 1);
		kvp_worker_landed(w, (uint16_t)peer, g->r[0]->owner, g->user_id, g->key0, g->bytes,
				  g->nseg, g->first_ns);
	}
	struct kvp_wire_hdr a;
	kvp_wire_hdr_init(&a, KVP_W_ACK, 0, g->tag);
	a.aux = (uint64_t)status;
	release(g);
	if (!kvp_pchan_send(c->w, (uint16_t)peer, false, &a, NULL))
		kvp_pchan_fail(c->w, (uint16_t)peer, false, "control queue full");
}

static bool
grant_fenced(const struct rgrant *g, const struct kvp_fence *f)
{
	if (g->state != G_OPEN)
		return false;
	for (unsigned i = 0; i < g->ngranted; i++)
		if (g->r[i] && kvp_fence_match(f, g->r[i]->owner, g->user_id))
			return true;
	return false;
}

/*
 * Fence @p f: grants given out for its transfers may still be written to.
 * Each such sender is asked once to stop (RDMA_REVOKE): it ends the
 * transfer once its posted WRITEs completed and says so with an ABORT,
 * which releases the grant. Forced, the receive QPs from that peer are
 * torn down (to ERR: nothing more lands through them; the sender rebuilds
 * them) and the grants released.
 */
uint32_t
rx_fence(struct rdma_ctx *c, const struct kvp_fence *f, bool force)
{
	uint32_t busy = 0;

	for (uint16_t p = 0; p < c->npeers; p++) {
		struct rpeer *rp = &c->peers[p];
		bool reset = false;

		for (uint32_t i = 0; rp->g && i <= c->gmask; i++) {
			struct rgrant *g = &rp->g[i];

			if (!grant_fenced(g, f))
				continue;
			if (force) {
				reset = true;
				continue;
			}
			busy++;
			if (!g->revoked) {
				struct kvp_wire_hdr h;

				kvp_wire_hdr_init(&h, KVP_W_RDMA_REVOKE, 0, g->tag);
				if (kvp_pchan_send(c->w, p, false, &h, NULL)) {
					g->revoked = true;
					KVP_STAT_ADD(c->w->stats.fenced_xfers, 1);
				}
			}
		}
		if (!reset)
			continue;
		KVP_LOG_RL(WARNING, gdr, "peer %u: fence %" PRIu64 " forced: receive QPs torn down",
			   p, f->id);
		for (uint32_t s = 0; s < GDR_SLOTS; s++)
			if (rp->rq[s].qp)
				qp_send_reset(c, p, s, 0, "fence forced");
		for (uint32_t i = 0; i <= c->gmask; i++)
			if (grant_fenced(&rp->g[i], f))
				release(&rp->g[i]);
	}
	return busy;
}

void
rx_release_all(struct rdma_ctx *c, uint16_t peer)
{
	struct rpeer *rp = &c->peers[peer];

	for (uint32_t i = 0; rp->g && i <= c->gmask; i++)
		if (rp->g[i].state != G_FREE)
			release(&rp->g[i]);
}
