/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peer connections (main lcore). Each node dials every peer of its table
 * that has an address, for the data it sends, and accepts the peers'
 * connections for the data it receives: tcp.connections links per worker
 * each way, so several streams share the path and every worker sends on
 * links of its own (the dialer keeps the smaller of both ends' counts).
 * Both ends exchange a versioned HELLO that names sender, target and link;
 * only then is the socket handed to the worker that owns the link
 * (link_worker()). Links are dialled one at a time and failed attempts
 * retried with exponential backoff (failed authentication too).
 *
 * A peer named by address only (on demand) is dialled with no target: its
 * node id comes from its authenticated HELLO. A node that is not in the
 * table and authenticates gets an inbound slot (accept_unknown_peers).
 * The slots themselves are peer_table.c's, the accepting side
 * peer_accept.c's, the HELLO and the hand-over peer_hello.c's.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_mempool.h>

#include "ctrl_priv.h"

#define BACKOFF_MAX_MS 5000u

/* A dial failed: close it, say why (to the workers too, by @p code), retry after the backoff. */
static void
out_fail(struct kvp_node *n, uint16_t i, const char *why, uint8_t code)
{
	struct kvp_peer *p = &n->peers[i];
	uint64_t now = kvp_mono_ns();

	if (p->out_fd >= 0) {
		loop_unwatch(n, &p->out_watch);
		close(p->out_fd);
		p->out_fd = -1;
	}
	if (strcmp(p->last_error, why) != 0)
		KVP_LOG(WARNING, core, "peer %s (%s) link %u: %s; retrying", peer_label(n, i),
			p->addr, p->out_link, why);
	snprintf(p->last_error, sizeof(p->last_error), "%s", why);
	if (!p->out_up)
		peer_set_why(n, i, code);
	p->out_state = KVP_LINK_DOWN;
	p->dns_ok = false; /* a name is resolved again: its address may have moved */
	p->next_try_ns = now + (uint64_t)p->backoff_ms * 1000000;
	p->backoff_ms = p->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : p->backoff_ms * 2;
}

/* The lowest link not up, or -1 when all are. */
static int
missing_link(const struct kvp_peer *p)
{
	for (uint8_t l = 0; l < p->links; l++)
		if (!(p->out_up & (1ull << l)))
			return l;
	return -1;
}

static void out_start(struct kvp_node *n, uint16_t i, uint64_t now);

void
peer_resolved(struct kvp_node *n, uint16_t i, int rc, const struct sockaddr_storage *ss,
	      socklen_t len)
{
	struct kvp_peer *p = &n->peers[i];

	if (rc < 0) {
		out_fail(n, i, "cannot resolve its host name", KVP_PEER_WHY_CONNECT);
		return;
	}
	p->dns_addr = *ss;
	p->dns_len = len;
	p->dns_ok = true;
	out_start(n, i, kvp_mono_ns());
}

static void
out_start(struct kvp_node *n, uint16_t i, uint64_t now)
{
	struct kvp_peer *p = &n->peers[i];
	struct sockaddr_storage ss;
	socklen_t len;
	int fd, link;

	if (!p->out_up)
		p->links = (uint8_t)peer_node_links(n); /* a restarted remote may accept more */
	link = missing_link(p);
	if (link < 0) {
		p->out_state = KVP_LINK_UP;
		return;
	}
	p->out_link = (uint8_t)link;
	if (p->backoff_ms == 0)
		p->backoff_ms = n->cfg.reconnect_ms;
	if (p->dns_ok) {
		ss = p->dns_addr;
		len = p->dns_len;
	} else {
		int rc = peer_resolve(p->host, p->port, false, true, &ss, &len);

		if (rc == -EAGAIN) {
			/* A name: the resolver may block for seconds, so a thread asks it. */
			p->out_state = KVP_LINK_RESOLVING;
			peer_dns_next(n);
			return;
		}
		if (rc < 0) {
			out_fail(n, i, "cannot resolve address", KVP_PEER_WHY_CONNECT);
			return;
		}
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		out_fail(n, i, strerror(errno), KVP_PEER_WHY_CONNECT);
		return;
	}
	p->out_fd = fd;
	if (connect(fd, (struct sockaddr *)&ss, len) < 0 && errno != EINPROGRESS) {
		out_fail(n, i, strerror(errno), KVP_PEER_WHY_CONNECT);
		return;
	}
	p->out_state = KVP_LINK_CONNECTING;
	p->deadline_ns = now + (uint64_t)n->cfg.connect_timeout_ms * 1000000;
	p->have = 0;
	peer_out_watch(n, i, EPOLLOUT | EPOLLIN);
}

/*
 * An on-demand peer's handshake named node @p id: keep it as the slot's
 * node id. The first time, a node id another slot has is resolved: an
 * inbound slot (it connected to us first) gives way to this one, which has
 * an address; an addressed one means two addresses reach one node and this
 * dial is refused. A node id other than the one learned before means the
 * node at the address was replaced: this slot drains and a new one takes
 * the address. @return the slot that carries on with the dial (i, or the new
 * one), or -1 (refused, the dial failed with the reason)
 */
static int
learn_id(struct kvp_node *n, uint16_t i, const char *id)
{
	struct kvp_peer *p = &n->peers[i];
	char why[160];

	if (p->node_id[0] == '\0') {
		int k = peer_find(n, id, true);

		if (k >= 0 && n->peers[k].slot_state == KVP_PS_ACTIVE &&
		    n->peers[k].origin == KVP_PEER_INBOUND) {
			snprintf(why, sizeof(why), "it is reached at %s now (on demand)", p->addr);
			peer_remove(n, (uint32_t)k, why);
		} else if (k >= 0) {
			snprintf(why, sizeof(why),
				 "this address is node %s, already a peer (%s%s%s)", id,
				 n->peers[k].addr[0] ? "at " : "", n->peers[k].addr,
				 n->peers[k].slot_state == KVP_PS_DRAINING ? ", being removed" :
									     "");
			p->handshake_failures++;
			out_fail(n, i, why, KVP_PEER_WHY_HANDSHAKE);
			return -1;
		}
		KVP_LOG(NOTICE, core, "peer at %s is node %s", p->addr, id);
		peer_set_node_id(n, i, id);
		return i;
	}
	/* Replaced: the old node's slot drains; a new one takes the address (and this link). */
	char host[sizeof(p->host)];
	uint16_t port = p->port;

	snprintf(host, sizeof(host), "%s", p->host);
	snprintf(why, sizeof(why), "the node at %s is now %s", p->addr, id);
	KVP_LOG(NOTICE, core, "peer %s: %s; its slot drains, a new one takes the address",
		p->node_id, why);
	peer_remove(n, i, why);
	int j = peer_add(n, KVP_PEER_ON_DEMAND, "", host, port, why, sizeof(why));

	if (j < 0) {
		KVP_LOG(WARNING, core, "node %s at %s:%u not kept: %s", id, host, port, why);
		return -1;
	}
	return learn_id(n, (uint16_t)j, id);
}

/* The dial of peer @p i has its HELLO reply in p->buf: check it, prove ourselves, hand it over. */
static void
out_hello(struct kvp_node *n, uint16_t i)
{
	struct kvp_peer *p = &n->peers[i];
	const struct kvp_wire_hello *m =
		(const struct kvp_wire_hello *)(p->buf + sizeof(struct kvp_wire_hdr));
	char id[KVP_NODE_ID_MAX];

	memcpy(id, m->node_id, sizeof(id));
	id[sizeof(id) - 1] = '\0';
	/* Keep no more links than the remote accepts (an old remote says 0: one). */
	uint32_t theirs = KVP_HELLO_LINKS(m->flags) ? KVP_HELLO_LINKS(m->flags) : 1;
	if (theirs < p->links) {
		KVP_LOG(INFO, core, "peer %s accepts %u connections; using %u instead of %u",
			peer_label(n, i), theirs, theirs, p->links);
		p->links = (uint8_t)theirs;
		if (theirs < n->nworkers)
			KVP_LOG(WARNING, core,
				"peer %s accepts %u links, fewer than this node's %u workers: "
				"workers %u..%u cannot send to it (their transfers fail with "
				"\"peer\"); give it workers x tcp.connections >= %u",
				peer_label(n, i), theirs, n->nworkers, theirs, n->nworkers - 1,
				n->nworkers);
	}
	if (m->status != PEER_HELLO_OK) {
		p->handshake_failures++;
		if (m->status == PEER_HELLO_AUTH)
			n->auth_failures++;
		out_fail(n, i, peer_hello_err_str(m->status),
			 m->status == PEER_HELLO_AUTH ? KVP_PEER_WHY_AUTH : KVP_PEER_WHY_HANDSHAKE);
		return;
	}
	/* By address, the node id is the remote's to tell; by name it must match. */
	bool learn = p->origin == KVP_PEER_ON_DEMAND && strcmp(id, p->node_id) != 0;
	const char *bad = NULL;

	if (!learn && strcmp(id, p->node_id) != 0)
		bad = "the remote answered with another node_id";
	else if (learn && !kvp_config_node_id_ok(id))
		bad = "the remote's node_id is malformed";
	else if (learn && strcmp(id, n->cfg.node_id) == 0)
		bad = "this address is this node itself";
	if (bad) {
		p->handshake_failures++;
		out_fail(n, i, bad, KVP_PEER_WHY_HANDSHAKE);
		return;
	}
	if (n->cfg.auth_secret[0]) {
		uint8_t want[32], proof[PEER_HELLO_LEN], mac[32];

		/* The proof covers the node id it claims: a learned id is an authenticated one. */
		peer_hello_mac(n, 'A', p->nonce, m->nonce, id, n->cfg.node_id, want);
		if (!(m->flags & KVP_HELLO_F_AUTH) || !peer_mac_ok(want, m->mac)) {
			p->handshake_failures++;
			n->auth_failures++;
			out_fail(n, i, "the remote failed authentication", KVP_PEER_WHY_AUTH);
			return;
		}
		/* Our proof answers its challenge; the acceptor checks it before use. */
		peer_hello_mac(n, 'D', m->nonce, p->nonce, n->cfg.node_id, id, mac);
		peer_fill_hello(n, proof, id, p->out_link, p->epoch, PEER_HELLO_OK, p->nonce, mac);
		if (send(p->out_fd, proof, sizeof(proof), MSG_DONTWAIT | MSG_NOSIGNAL) !=
		    (ssize_t)sizeof(proof)) {
			out_fail(n, i, "cannot send the authentication proof",
				 KVP_PEER_WHY_CONNECT);
			return;
		}
	}
	if (p->out_link >= p->links) {
		out_fail(n, i, "link beyond the remote's workers x tcp.connections",
			 KVP_PEER_WHY_HANDSHAKE);
		p->out_state = KVP_LINK_UP; /* nothing left to dial */
		return;
	}
	int fd = p->out_fd;
	uint8_t link = p->out_link, links = p->links;
	uint64_t epoch = p->epoch;

	loop_unwatch(n, &p->out_watch);
	p->out_fd = -1;
	p->out_state = KVP_LINK_DOWN;
	if (learn) {
		int j = learn_id(n, i, id);

		if (j < 0) {
			close(fd);
			return;
		}
		i = (uint16_t)j;
		p = &n->peers[i];
		p->links = links;
		p->out_link = link;
		p->epoch = epoch;
	}
	if (peer_hand_over(n, i, link, fd, true, epoch) < 0) {
		close(fd);
		out_fail(n, i, "worker inbox full", KVP_PEER_WHY_DOWN);
		return;
	}
	uint64_t now = kvp_mono_ns();

	p->out_up |= 1ull << link;
	p->backoff_ms = n->cfg.reconnect_ms;
	p->connects++;
	p->last_error[0] = '\0';
	peer_set_why(n, i, KVP_PEER_WHY_DOWN); /* from now on, no link means it went down */
	if (!p->first_up_ns) {
		p->first_up_ns = now;
		KVP_LOG(NOTICE, core, "peer %s: first link up %.1f ms after it was added (%s)",
			peer_label(n, i), (double)(now - p->added_ns) / 1e6,
			peer_origin_name(p->origin));
	}
	KVP_LOG(INFO, core, "peer %s: link %u connected", peer_label(n, i), link);
	/* The next missing link, at once. */
	out_start(n, i, now);
}

void
kvp_peer_out_event(struct kvp_node *n, uint16_t i, uint32_t events)
{
	struct kvp_peer *p = &n->peers[i];
	int rc;

	if (p->out_state == KVP_LINK_CONNECTING) {
		int soerr = 0;
		socklen_t sl = sizeof(soerr);

		if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return;
		getsockopt(p->out_fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
		if (soerr || (events & (EPOLLERR | EPOLLHUP))) {
			out_fail(n, i, soerr ? strerror(soerr) : "connection failed",
				 KVP_PEER_WHY_CONNECT);
			return;
		}
		uint8_t buf[PEER_HELLO_LEN];
		peer_random_bytes(&p->epoch, sizeof(p->epoch));
		peer_random_bytes(p->nonce, sizeof(p->nonce));
		/* By address: no target, whoever listens there answers with its id. */
		peer_fill_hello(n, buf, p->origin == KVP_PEER_ON_DEMAND ? "" : p->node_id,
				p->out_link, p->epoch, PEER_HELLO_OK, p->nonce, NULL);
		if (send(p->out_fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_NOSIGNAL) !=
		    (ssize_t)sizeof(buf)) {
			out_fail(n, i, "cannot send HELLO", KVP_PEER_WHY_CONNECT);
			return;
		}
		loop_rewatch(n, &p->out_watch, EPOLLIN | EPOLLRDHUP);
		p->out_state = KVP_LINK_HELLO;
		return;
	}
	if (p->out_state != KVP_LINK_HELLO)
		return;
	rc = peer_read_hello(p->out_fd, p->buf, &p->have);
	if (rc == 0)
		return;
	if (rc < 0) {
		p->handshake_failures++;
		out_fail(n, i, rc == -EBADMSG ? "malformed HELLO reply" : strerror(-rc),
			 KVP_PEER_WHY_HANDSHAKE);
		return;
	}
	out_hello(n, i);
}

void
kvp_peer_conn_down(struct kvp_node *n, uint16_t i, uint8_t link, bool outgoing, const char *why)
{
	if (i >= n->cfg.max_peers || link >= KVP_LINKS_MAX)
		return;
	struct kvp_peer *p = &n->peers[i];

	if (!outgoing) {
		p->in_up &= ~(1ull << link);
		return;
	}
	p->out_up &= ~(1ull << link);
	/* A draining peer's links close for good; an active one's are dialled again. */
	if (p->slot_state != KVP_PS_ACTIVE)
		return;
	p->disconnects++;
	p->backoff_ms = n->cfg.reconnect_ms;
	/* A dial in progress for another link goes on; this one is next. */
	if (p->out_state == KVP_LINK_UP) {
		p->out_link = link;
		out_fail(n, i, why, KVP_PEER_WHY_DOWN);
	}
}

void
kvp_peer_timers(struct kvp_node *n, uint64_t now)
{
	for (uint16_t i = 0; i < n->cfg.max_peers; i++) {
		struct kvp_peer *p = &n->peers[i];

		/* Only an active peer with an address is dialled. */
		if (p->slot_state != KVP_PS_ACTIVE || !p->host[0])
			continue;
		if ((p->out_state == KVP_LINK_DOWN ||
		     (p->out_state == KVP_LINK_UP && missing_link(p) >= 0)) &&
		    now >= p->next_try_ns)
			out_start(n, i, now);
		else if ((p->out_state == KVP_LINK_CONNECTING || p->out_state == KVP_LINK_HELLO) &&
			 now >= p->deadline_ns)
			out_fail(n, i,
				 p->out_state == KVP_LINK_CONNECTING ? "connect timeout" :
								       "handshake timeout",
				 p->out_state == KVP_LINK_CONNECTING ? KVP_PEER_WHY_CONNECT :
								       KVP_PEER_WHY_HANDSHAKE);
	}
	peer_pending_timers(n, now);
}

void
kvp_peer_close_all(struct kvp_node *n)
{
	for (uint32_t i = 0; n->peers && i < n->cfg.max_peers; i++) {
		if (n->peers[i].out_fd >= 0) {
			close(n->peers[i].out_fd);
			n->peers[i].out_fd = -1;
		}
	}
	peer_accept_close_all(n);
}

const char *
kvp_peer_state_name(const struct kvp_node *n, uint16_t i)
{
	const struct kvp_peer *p = &n->peers[i];

	if (p->slot_state == KVP_PS_DRAINING)
		return "draining";
	/* Up while any link carries transfers; the stats say how many. */
	if (p->out_up)
		return "up";
	/* It connected to us and there is no address to dial back. */
	if (!p->host[0])
		return p->in_up ? "inbound" : "down";
	switch (p->out_state) {
	case KVP_LINK_RESOLVING:
	case KVP_LINK_CONNECTING:
	case KVP_LINK_HELLO:
		return "connecting";
	default:
		return "down";
	}
}

static void
on_out(struct kvp_node *n, void *arg, uint32_t events)
{
	struct kvp_peer *p = arg;

	kvp_peer_out_event(n, (uint16_t)(p - n->peers), events);
}

int
peer_out_watch(struct kvp_node *n, uint16_t i, uint32_t events)
{
	struct kvp_peer *p = &n->peers[i];

	return loop_watch(n, &p->out_watch, p->out_fd, events, on_out, p);
}

static void
on_conn_down(struct kvp_node *n, const struct kvp_msg *m)
{
	kvp_peer_conn_down(n, m->peer, m->link, m->outgoing, m->reason);
}

int
peer_init(struct kvp_node *n, char *err, size_t errlen)
{
	loop_on_msg(n, KVP_MSG_CONN_DOWN, on_conn_down);
	loop_every(n, &n->peer_timer, 0, kvp_peer_timers);
	return kvp_peer_listen(n, err, errlen);
}
