/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer control channel: one of a worker's transports (TCP) carries small
 * control frames between two nodes, and another one (RDMA: queue pairs,
 * grants, acknowledgements) uses it, neither naming the other. Frames of
 * the control types go to the subscriber; without one the provider answers
 * KVP_W_UNSUPPORTED, which tells the other side's subscriber that this node
 * has nothing to talk to.
 */
#include <errno.h>

#include "kvp_transport.h"

int
kvp_pchan_subscribe(struct kvp_worker *w, const struct kvp_pchan_sub *sub)
{
	if (w->pchan_sub.on_frame)
		return -EBUSY;
	w->pchan_sub = *sub;
	return 0;
}

static const struct kvp_tp *
provider(const struct kvp_worker *w)
{
	return w->pchan_tp >= 0 ? &w->tp[w->pchan_tp] : NULL;
}

bool
kvp_pchan_send(struct kvp_worker *w, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
	       const void *payload)
{
	const struct kvp_tp *p = provider(w);

	return p && h->len <= KVP_PCHAN_PAYLOAD && p->ops->pchan->send(p->tctx, peer, outgoing, h, payload);
}

uint32_t
kvp_pchan_room(struct kvp_worker *w, uint16_t peer, bool outgoing)
{
	const struct kvp_tp *p = provider(w);

	return p ? p->ops->pchan->room(p->tctx, peer, outgoing) : 0;
}

void
kvp_pchan_fail(struct kvp_worker *w, uint16_t peer, bool outgoing, const char *why)
{
	const struct kvp_tp *p = provider(w);

	if (p)
		p->ops->pchan->fail(p->tctx, peer, outgoing, why);
}

int
kvp_pchan_deliver(struct kvp_worker *w, uint16_t peer, bool outgoing,
		  const struct kvp_wire_hdr *h, const void *payload)
{
	if (!w->pchan_sub.on_frame)
		return -ENOTSUP;
	return w->pchan_sub.on_frame(w->pchan_sub.arg, peer, outgoing, h, payload);
}

void
kvp_pchan_conn(struct kvp_worker *w, uint16_t peer, bool outgoing, bool up)
{
	if (w->pchan_sub.on_conn)
		w->pchan_sub.on_conn(w->pchan_sub.arg, peer, outgoing, up);
}
