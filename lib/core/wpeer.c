/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A worker's view of its peers: the slots the main lcore opens and closes
 * (KVP_MSG_PEER_*), the handle a client names a peer by (a removed peer's
 * handle never names the one that reuses its slot), transfers that wait for
 * a new peer's first link (at most until the main lcore's wait_until, that
 * is timeouts.connect_ms after the peer was opened), and a closing peer's
 * drain: new transfers are refused at once, those in flight end by their
 * deadline or complete, then its connections close, its counters and
 * histograms are zeroed and the main lcore is told, so the slot comes back
 * clean. The worker's lcore only; nothing allocates.
 */
#include <stdio.h>
#include <string.h>

#include "kvp_transport.h"
#include "worker_priv.h"

/* Relaxed stores of zero: the main lcore reads these rows with relaxed loads. */
static void
zero_words(void *p, size_t len)
{
	uint64_t *q = p;

	for (size_t i = 0; i < len / sizeof(*q); i++)
		__atomic_store_n(&q[i], 0, __ATOMIC_RELAXED);
}

static void
rows_zero(struct kvp_worker *w, uint32_t slot)
{
	zero_words(&w->stats.peer[slot], sizeof(w->stats.peer[slot]));
	zero_words(kvp_worker_hist(w, (uint16_t)slot, 0), sizeof(struct kvp_hist) * KVP_HP_MAX);
}

void
kvp_worker_peer_open(struct kvp_worker *w, const struct kvp_msg *m)
{
	if (m->peer >= w->npeers)
		return;
	struct kvp_worker_peer *p = &w->peers[m->peer];

	/* Zeroed when it closed; again here, should a closing connection have counted late. */
	rows_zero(w, m->peer);
	p->state = KVP_WP_OPEN;
	p->handle = m->handle;
	p->why = m->why;
	p->wait_until_ns = m->until_ns;
	p->inflight = 0;
	p->close_due = false;
	snprintf(p->node_id, sizeof(p->node_id), "%s", m->node_id);
}

void
wpeer_why(struct kvp_worker *w, const struct kvp_msg *m)
{
	if (m->peer >= w->npeers || w->peers[m->peer].state != KVP_WP_OPEN)
		return;
	struct kvp_worker_peer *p = &w->peers[m->peer];

	p->why = m->why;
	if (m->node_id[0])
		snprintf(p->node_id, sizeof(p->node_id), "%s", m->node_id);
}

/* Take the waiting list of @p p (its transfers are then the caller's). */
static struct kvp_xfer *
take_waiting(struct kvp_worker *w, struct kvp_worker_peer *p)
{
	struct kvp_xfer *x = p->wait_head;

	for (struct kvp_xfer *y = x; y; y = y->next)
		w->nwaiting--;
	p->wait_head = p->wait_tail = NULL;
	return x;
}

/* End every waiting transfer of @p p with @p status and @p why. */
static int
fail_waiting(struct kvp_worker *w, struct kvp_worker_peer *p, int status, uint8_t why)
{
	int n = 0;

	for (struct kvp_xfer *x = take_waiting(w, p), *next; x; x = next) {
		next = x->next;
		x->next = NULL;
		x->tp = 0;
		x->detail = why;
		kvp_worker_xfer_end(w, x, status);
		n++;
	}
	return n;
}

/* Nothing of the peer is in flight any more: close its connections and give the slot back. */
static void
finish_close(struct kvp_worker *w, uint32_t slot)
{
	struct kvp_worker_peer *p = &w->peers[slot];

	route_disconnect(w, (uint16_t)slot);
	rows_zero(w, slot);
	p->state = KVP_WP_FREE;
	p->links = 0;
	p->handle = KVP_PEER_NONE;
	p->close_due = false;
	worker_send_main(w, KVP_MSG_PEER_CLOSED, (uint16_t)slot, 0, false, NULL, NULL);
}

void
wpeer_close(struct kvp_worker *w, uint16_t slot)
{
	if (slot >= w->npeers)
		return;
	struct kvp_worker_peer *p = &w->peers[slot];

	if (p->state == KVP_WP_FREE) {
		worker_send_main(w, KVP_MSG_PEER_CLOSED, slot, 0, false, NULL, NULL);
		return;
	}
	p->state = KVP_WP_CLOSING;
	fail_waiting(w, p, KVP_ENOPEER, KVP_PEER_WHY_REMOVED);
	/* Outside the transports' callbacks here: close at once rather than at the tick. */
	if (p->inflight == 0) {
		if (p->close_due) {
			p->close_due = false;
			w->closes_due--;
		}
		finish_close(w, slot);
	}
}

int
wpeer_admit(struct kvp_worker *w, struct kvp_xfer *x, uint64_t now)
{
	uint32_t slot = kvp_peer_handle_slot(x->handle);
	struct kvp_worker_peer *p = slot < w->npeers ? &w->peers[slot] : NULL;

	if (!p || p->state == KVP_WP_FREE || p->handle != x->handle) {
		x->detail = KVP_PEER_WHY_UNKNOWN;
		return KVP_ENOPEER;
	}
	if (p->state == KVP_WP_CLOSING) {
		x->detail = KVP_PEER_WHY_REMOVED;
		return KVP_ENOPEER;
	}
	x->peer = (uint16_t)slot;
	p->inflight++;
	if (p->links)
		return KVP_OK;
	if (now < p->wait_until_ns) {
		/* A new peer: wait for its first link rather than fail while it dials. */
		x->tp = KVP_XFER_TP_WAIT;
		x->next = NULL;
		if (p->wait_tail)
			p->wait_tail->next = x;
		else
			p->wait_head = x;
		p->wait_tail = x;
		w->nwaiting++;
		return WPEER_WAIT;
	}
	x->detail = p->why ? p->why : KVP_PEER_WHY_DOWN;
	return KVP_EPEER;
}

void
wpeer_ended(struct kvp_worker *w, uint16_t slot)
{
	struct kvp_worker_peer *p = &w->peers[slot];

	if (p->inflight > 0)
		p->inflight--;
	/*
	 * Closing waits for the worker's next tick: this runs inside the
	 * transports' callbacks, which must not see their connections go.
	 */
	if (p->state == KVP_WP_CLOSING && p->inflight == 0 && !p->close_due) {
		p->close_due = true;
		w->closes_due++;
	}
}

void
wpeer_link_up(struct kvp_worker *w, uint16_t slot)
{
	struct kvp_worker_peer *p = &w->peers[slot];

	p->links++;
	for (struct kvp_xfer *x = take_waiting(w, p), *next; x; x = next) {
		next = x->next;
		x->next = NULL;
		x->tp = 0;
		if (route_post(w, x) < 0) {
			x->detail = KVP_PEER_WHY_DOWN;
			kvp_worker_xfer_end(w, x, KVP_EPEER);
		}
	}
}

void
wpeer_link_down(struct kvp_worker *w, uint16_t slot)
{
	if (slot < w->npeers && w->peers[slot].links > 0)
		w->peers[slot].links--;
}

void
wpeer_unwait(struct kvp_worker *w, struct kvp_xfer *x)
{
	struct kvp_worker_peer *p = &w->peers[x->peer];
	struct kvp_xfer **pp = &p->wait_head, *prev = NULL;

	while (*pp && *pp != x) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	if (!*pp)
		return;
	*pp = x->next;
	if (p->wait_tail == x)
		p->wait_tail = prev;
	x->next = NULL;
	x->tp = 0;
	w->nwaiting--;
}

int
wpeer_timers(struct kvp_worker *w, uint64_t now)
{
	int work = 0;

	if (w->nwaiting == 0 && w->closes_due == 0)
		return 0;
	for (uint32_t i = 0; i < w->npeers && (w->nwaiting || w->closes_due); i++) {
		struct kvp_worker_peer *p = &w->peers[i];

		if (p->wait_head && now >= p->wait_until_ns)
			work += fail_waiting(w, p, KVP_EPEER,
					     p->why ? p->why : KVP_PEER_WHY_CONNECT);
		if (p->close_due) {
			w->closes_due--;
			p->close_due = false;
			if (p->state == KVP_WP_CLOSING && p->inflight == 0)
				finish_close(w, i);
			work++;
		}
	}
	return work;
}
