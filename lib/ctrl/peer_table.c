/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer table (main lcore): limits.max_peers slots, allocated at start,
 * that peers take when they join (the configuration, peer_add, a client
 * naming an address, a node connecting to us) and give back when they
 * leave. This is the one place where a slot is taken, opened on the
 * workers, drained and freed:
 *
 *   free -> active      peer_add(): every worker is told (PEER_OPEN) before
 *                       any connection of the slot reaches it
 *   active -> draining  peer_remove(): workers refuse new transfers at once,
 *                       let those in flight end, close its connections and
 *                       zero its rows (PEER_CLOSE)
 *   draining -> free    every worker answered PEER_CLOSED: the generation
 *                       moves on, so handles of the old peer name nothing
 *
 * Dialling and handshakes are peer.c's; it reads the table and calls here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <rte_mempool.h>

#include "ctrl_priv.h"

/* On-demand and inbound peers are looked at for forgetting this often. */
#define FORGET_PERIOD_NS 1000000000ull

static void slot_free(struct kvp_node *n, uint32_t slot);

const char *
peer_origin_name(int origin)
{
	switch (origin) {
	case KVP_PEER_CONFIG:
		return "config";
	case KVP_PEER_ADMIN:
		return "admin";
	case KVP_PEER_ON_DEMAND:
		return "on_demand";
	case KVP_PEER_INBOUND:
		return "inbound";
	default:
		return "?";
	}
}

/* Links this node keeps to each peer and accepts from each: tcp.connections per worker. */
unsigned
peer_node_links(const struct kvp_node *n)
{
	unsigned l = n->nworkers * n->cfg.tcp_conns;

	return l < KVP_LINKS_MAX ? l : KVP_LINKS_MAX;
}

bool
peer_live(const struct kvp_node *n, uint32_t slot)
{
	return slot < n->cfg.max_peers && n->peers[slot].slot_state != KVP_PS_FREE;
}

uint16_t
peer_handle(const struct kvp_node *n, uint32_t slot)
{
	return kvp_peer_handle(slot, n->peers[slot].gen);
}

const char *
peer_label(const struct kvp_node *n, uint32_t slot)
{
	const struct kvp_peer *p = &n->peers[slot];

	return p->node_id[0] ? p->node_id : p->addr;
}

int
peer_find(const struct kvp_node *n, const char *node_id, bool draining)
{
	for (uint32_t i = 0; i < n->cfg.max_peers; i++) {
		const struct kvp_peer *p = &n->peers[i];

		if ((p->slot_state == KVP_PS_ACTIVE ||
		     (draining && p->slot_state == KVP_PS_DRAINING)) &&
		    strcmp(p->node_id, node_id) == 0)
			return (int)i;
	}
	return -1;
}

/* Host names compare without case; addresses as written ("10.0.0.1" is not "010.0.0.1"). */
int
peer_find_addr(const struct kvp_node *n, const char *host, uint16_t port)
{
	for (uint32_t i = 0; i < n->cfg.max_peers; i++) {
		const struct kvp_peer *p = &n->peers[i];

		if (p->slot_state == KVP_PS_ACTIVE && p->host[0] && p->port == port &&
		    strcasecmp(p->host, host) == 0)
			return (int)i;
	}
	return -1;
}

int
peer_addr_refused(const struct kvp_node *n, int holder, const char *host, uint16_t port, char *why,
		  size_t whylen)
{
	if (holder < 0) {
		snprintf(why, whylen, "%s:%u is this node's own listen address", host, port);
		return -EINVAL;
	}
	snprintf(why, whylen, "%s:%u is already peer '%s' (%s)", host, port,
		 peer_label(n, (uint32_t)holder), peer_origin_name(n->peers[holder].origin));
	return -EEXIST;
}

int
peer_addr_check(const struct kvp_node *n, int self, const char *host, uint16_t port, char *why,
		size_t whylen)
{
	int slot;

	if (port == n->cfg.listen_port && strcasecmp(host, n->cfg.listen_host) == 0)
		return peer_addr_refused(n, -1, host, port, why, whylen);
	if ((slot = peer_find_addr(n, host, port)) >= 0 && slot != self)
		return peer_addr_refused(n, slot, host, port, why, whylen);
	return 0;
}

/* Tell every worker about slot @p slot (PEER_OPEN or PEER_WHY). @return 0, -ENOBUFS */
static int
tell_workers(struct kvp_node *n, uint32_t slot, int type)
{
	const struct kvp_peer *p = &n->peers[slot];
	struct kvp_msg *m[KVP_WORKERS_MAX];
	unsigned got = 0;

	/* All the messages first: a slot open on some workers only would refuse their links. */
	for (; got < n->nworkers; got++) {
		m[got] = ctrl_msg(n, type);
		if (!m[got])
			break;
	}
	if (got < n->nworkers) {
		for (unsigned i = 0; i < got; i++)
			rte_mempool_put(n->msg_pool, m[i]);
		return -ENOBUFS;
	}
	for (unsigned i = 0; i < n->nworkers; i++) {
		m[i]->peer = (uint16_t)slot;
		m[i]->handle = peer_handle(n, slot);
		m[i]->why = p->why;
		/* A new peer gets timeouts.connect_ms for a first link before transfers fail. */
		m[i]->until_ns =
			p->host[0] ? p->added_ns + (uint64_t)n->cfg.connect_timeout_ms * 1000000 :
				     0;
		/* For the workers' log lines: the node id, or the address while it is not known. */
		snprintf(m[i]->node_id, sizeof(m[i]->node_id), "%.31s",
			 p->node_id[0] ? p->node_id : p->addr);
		if (ctrl_send(n, i, m[i]) < 0)
			return -ENOBUFS;
	}
	return 0;
}

int
peer_add(struct kvp_node *n, int origin, const char *node_id, const char *host, uint16_t port,
	 char *why, size_t whylen)
{
	int slot = -1;

	if (node_id[0] && !kvp_config_node_id_ok(node_id)) {
		snprintf(why, whylen, "bad node_id '%.40s': 1 to %d letters, digits, '-', '_', '.'",
			 node_id, KVP_NODE_ID_MAX - 1);
		return -EINVAL;
	}
	if (node_id[0] && strcmp(node_id, n->cfg.node_id) == 0) {
		snprintf(why, whylen, "'%s' is this node's own id", node_id);
		return -EINVAL;
	}
	if (node_id[0] && (slot = peer_find(n, node_id, true)) >= 0) {
		snprintf(why, whylen, "'%s' is already a peer (%s, %s%s)", node_id,
			 peer_origin_name(n->peers[slot].origin),
			 n->peers[slot].addr[0] ? n->peers[slot].addr : "no address",
			 n->peers[slot].slot_state == KVP_PS_DRAINING ? ", being removed" : "");
		return -EEXIST;
	}
	int rc = host[0] ? peer_addr_check(n, -1, host, port, why, whylen) : 0;

	if (rc < 0)
		return rc;
	/* The lowest free slot: configured peers keep the indices of the file's order. */
	for (uint32_t i = 0; i < n->cfg.max_peers && slot < 0; i++)
		if (n->peers[i].slot_state == KVP_PS_FREE)
			slot = (int)i;
	if (slot < 0) {
		n->peers_refused_full++;
		snprintf(why, whylen, "the peer table is full (limits.max_peers = %u)",
			 n->cfg.max_peers);
		return -ENOSPC;
	}
	struct kvp_peer *p = &n->peers[slot];
	uint8_t gen = p->gen;

	memset(p, 0, sizeof(*p));
	p->gen = gen;
	p->out_fd = -1;
	p->out_watch.fd = -1;
	p->links = (uint8_t)peer_node_links(n); /* every worker's share */
	p->origin = (uint8_t)origin;
	p->added_ns = p->idle_since_ns = kvp_mono_ns();
	p->why = host[0] ? KVP_PEER_WHY_CONNECT : KVP_PEER_WHY_NO_ADDR;
	snprintf(p->node_id, sizeof(p->node_id), "%s", node_id);
	snprintf(p->host, sizeof(p->host), "%s", host);
	p->port = host[0] ? port : 0;
	if (host[0])
		snprintf(p->addr, sizeof(p->addr), "%s:%u", host, port);
	if (tell_workers(n, (uint32_t)slot, KVP_MSG_PEER_OPEN) < 0) {
		/* No worker has it open, or a few do: close it again on all, as a removal. */
		snprintf(why, whylen,
			 "the workers cannot be told now (message pool or inbox full)");
		p->slot_state = KVP_PS_ACTIVE;
		n->npeers++;
		peer_remove(n, (uint32_t)slot, "could not be opened on every worker");
		return -ENOBUFS;
	}
	p->slot_state = KVP_PS_ACTIVE;
	n->npeers++;
	KVP_LOG(NOTICE, core, "peer %s%s%s added (%s, slot %d, handle %u)",
		node_id[0] ? node_id : p->addr, node_id[0] && host[0] ? " at " : "",
		node_id[0] ? p->addr : "", peer_origin_name(origin), slot,
		(unsigned)peer_handle(n, (uint32_t)slot));
	return slot;
}

/* Send the close to the workers it has not reached yet. */
static void
send_closes(struct kvp_node *n, uint32_t slot)
{
	struct kvp_peer *p = &n->peers[slot];

	for (unsigned w = 0; w < n->nworkers && p->close_unsent; w++) {
		if (!(p->close_unsent & (1ull << w)))
			continue;
		struct kvp_msg *m = ctrl_msg(n, KVP_MSG_PEER_CLOSE);

		if (!m)
			return; /* kvp_peer_table_timers() tries again */
		m->peer = (uint16_t)slot;
		if (ctrl_send(n, w, m) == 0)
			p->close_unsent &= ~(1ull << w);
	}
}

int
peer_remove(struct kvp_node *n, uint32_t slot, const char *why)
{
	if (slot >= n->cfg.max_peers || n->peers[slot].slot_state != KVP_PS_ACTIVE)
		return -ENOENT;
	struct kvp_peer *p = &n->peers[slot];

	p->slot_state = KVP_PS_DRAINING;
	snprintf(p->removed_why, sizeof(p->removed_why), "%s", why);
	/* No more dials; the workers close the links once what is in flight has ended. */
	if (p->out_fd >= 0) {
		loop_unwatch(n, &p->out_watch);
		close(p->out_fd);
		p->out_fd = -1;
	}
	p->out_state = KVP_LINK_DOWN;
	p->closing = (uint16_t)n->nworkers;
	p->close_unsent = n->nworkers >= 64 ? ~0ull : (1ull << n->nworkers) - 1;
	KVP_LOG(NOTICE, core, "peer %s (slot %u) removed: %s; draining", peer_label(n, slot), slot,
		why);
	send_closes(n, slot);
	if (p->closing == 0)
		slot_free(n, slot); /* no worker to drain it */
	return 0;
}

/* Every worker has closed the slot: free it. */
static void
slot_free(struct kvp_node *n, uint32_t slot)
{
	struct kvp_peer *p = &n->peers[slot];

	KVP_LOG(NOTICE, core, "peer %s (slot %u) drained and closed; the slot is free",
		peer_label(n, slot), slot);
	/* A new generation: what clients still hold of this peer names nothing now. */
	uint8_t gen = (uint8_t)((p->gen + 1) & ((1u << (16 - KVP_PEER_SLOT_BITS)) - 1));

	memset(p, 0, sizeof(*p));
	p->gen = gen;
	p->out_fd = -1;
	p->out_watch.fd = -1;
	n->npeers--;
}

static void
on_closed(struct kvp_node *n, const struct kvp_msg *m)
{
	if (m->peer >= n->cfg.max_peers)
		return;
	struct kvp_peer *p = &n->peers[m->peer];

	if (p->slot_state == KVP_PS_DRAINING && p->closing > 0 && --p->closing == 0)
		slot_free(n, m->peer);
}

void
peer_set_why(struct kvp_node *n, uint32_t slot, uint8_t why)
{
	struct kvp_peer *p = &n->peers[slot];

	if (p->why == why || p->slot_state != KVP_PS_ACTIVE)
		return;
	p->why = why;
	/* Lost on a full pool: the workers then give the previous reason, no harm done. */
	tell_workers(n, slot, KVP_MSG_PEER_WHY);
}

void
peer_set_node_id(struct kvp_node *n, uint32_t slot, const char *node_id)
{
	struct kvp_peer *p = &n->peers[slot];

	snprintf(p->node_id, sizeof(p->node_id), "%s", node_id);
	tell_workers(n, slot, KVP_MSG_PEER_WHY);
}

/*
 * Closes that could not be sent, and forgetting: an on-demand or inbound
 * peer that has had no link either way for timeouts.peer_forget_ms leaves
 * the table (a client that names its address again dials it anew).
 */
static void
table_timer(struct kvp_node *n, uint64_t now)
{
	uint64_t forget = (uint64_t)n->cfg.peer_forget_ms * 1000000;

	for (uint32_t i = 0; i < n->cfg.max_peers; i++) {
		struct kvp_peer *p = &n->peers[i];

		if (p->slot_state == KVP_PS_DRAINING && p->close_unsent)
			send_closes(n, i);
		if (p->slot_state != KVP_PS_ACTIVE)
			continue;
		if (p->out_up || p->in_up) {
			p->idle_since_ns = 0;
			continue;
		}
		if (p->idle_since_ns == 0)
			p->idle_since_ns = now;
		if ((p->origin == KVP_PEER_ON_DEMAND || p->origin == KVP_PEER_INBOUND) &&
		    now - p->idle_since_ns >= forget) {
			char why[96];

			snprintf(why, sizeof(why),
				 "forgotten: no link for %u s (timeouts.peer_forget_ms)",
				 n->cfg.peer_forget_ms / 1000);
			n->peers_forgotten++;
			peer_remove(n, i, why);
		}
	}
}

int
peer_table_init(struct kvp_node *n, char *err, size_t errlen)
{
	char why[160];

	n->peers = calloc(n->cfg.max_peers, sizeof(*n->peers));
	if (!n->peers) {
		snprintf(err, errlen, "peer table: out of memory");
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n->cfg.max_peers; i++) {
		n->peers[i].out_fd = -1;
		n->peers[i].out_watch.fd = -1;
	}
	loop_on_msg(n, KVP_MSG_PEER_CLOSED, on_closed);
	loop_every(n, &n->peer_table_timer, FORGET_PERIOD_NS, table_timer);
	/* The file's peers first, in its order: slot i is the file's peer i. */
	for (uint32_t i = 0; i < n->cfg.npeers; i++) {
		const struct kvp_peer_conf *pc = &n->cfg.peers[i];
		int rc = peer_add(n, KVP_PEER_CONFIG, pc->node_id, pc->host, pc->port, why,
				  sizeof(why));

		if (rc < 0) {
			snprintf(err, errlen, "peer %s: %s", pc->node_id, why);
			return rc;
		}
	}
	return 0;
}

void
peer_table_fini(struct kvp_node *n)
{
	free(n->peers);
	n->peers = NULL;
}
