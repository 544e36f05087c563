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
 * The slots themselves are peer_table.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <rte_mempool.h>

#include "ctrl_priv.h"

#define BACKOFF_MAX_MS 5000u
#define HELLO_LEN      (sizeof(struct kvp_wire_hdr) + sizeof(struct kvp_wire_hello))

enum hello_err {
	HELLO_OK = 0,
	HELLO_UNKNOWN_NODE = 1,
	HELLO_WRONG_TARGET = 2,
	HELLO_LIMITS = 3,
	HELLO_AUTH = 4,
	HELLO_LINK = 5,
	HELLO_FULL = 6,
};

static const char *
hello_err_str(uint32_t e)
{
	switch (e) {
	case HELLO_UNKNOWN_NODE:
		return "we are not a configured peer of the remote node";
	case HELLO_WRONG_TARGET:
		return "the remote node has a different node_id than configured";
	case HELLO_LIMITS:
		return "limits mismatch (max_inflight / tcp.frame_max larger than the remote's)";
	case HELLO_AUTH:
		return "authentication failed (auth secrets differ or are set on one side only)";
	case HELLO_LINK:
		return "link index beyond the remote's workers x tcp.connections";
	case HELLO_FULL:
		return "the remote's peer table is full (limits.max_peers)";
	default:
		return "refused";
	}
}

static int
resolve(const char *host, uint16_t port, bool passive, struct sockaddr_storage *ss,
	socklen_t *len)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	char pstr[8];

	hints.ai_flags = passive ? AI_PASSIVE : 0;
	snprintf(pstr, sizeof(pstr), "%u", port);
	if (getaddrinfo(host, pstr, &hints, &res) != 0)
		return -EHOSTUNREACH;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static void on_listen(struct kvp_node *n, void *arg, uint32_t events);

/* The worker that owns link @p link of peer @p peer, in either direction. */
static unsigned
link_worker(const struct kvp_node *n, uint16_t peer, uint8_t link)
{
	(void)peer; /* every peer's links go round the workers alike */
	return kvp_link_worker(link, n->nworkers);
}

int
kvp_peer_listen(struct kvp_node *n, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int one = 1, fd;

	if (resolve(n->cfg.listen_host, n->cfg.listen_port, true, &ss, &len) < 0) {
		snprintf(err, errlen, "listen: cannot resolve '%s'", n->cfg.listen_host);
		return -EINVAL;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 64) < 0) {
		int e = errno;

		snprintf(err, errlen, "listen %s:%u: %s", n->cfg.listen_host, n->cfg.listen_port,
			 strerror(e));
		if (fd >= 0)
			close(fd);
		return -e;
	}
	n->peer_lfd = fd;
	return loop_watch(n, &n->peer_lw, fd, EPOLLIN, on_listen, NULL);
}

static void
fill_hello(struct kvp_node *n, uint8_t *buf, const char *to, uint8_t link, uint64_t epoch,
	   uint32_t status, const uint8_t *nonce, const uint8_t *mac)
{
	struct kvp_wire_hdr *h = (struct kvp_wire_hdr *)buf;
	struct kvp_wire_hello *m = (struct kvp_wire_hello *)(buf + sizeof(*h));

	kvp_wire_hdr_init(h, KVP_W_HELLO, sizeof(*m), 0);
	memset(m, 0, sizeof(*m));
	snprintf(m->node_id, sizeof(m->node_id), "%s", n->cfg.node_id);
	snprintf(m->to_node, sizeof(m->to_node), "%s", to);
	m->epoch = epoch;
	m->max_inflight = n->cfg.max_inflight;
	m->frame_max = n->cfg.tcp_frame_max;
	m->status = status;
	m->flags = (n->cfg.auth_secret[0] ? KVP_HELLO_F_AUTH : 0) |
		   KVP_HELLO_F_LINK(link, peer_node_links(n));
	if (nonce)
		memcpy(m->nonce, nonce, sizeof(m->nonce));
	if (mac)
		memcpy(m->mac, mac, sizeof(m->mac));
}

/*
 * Proof of the shared secret: HMAC-SHA256 over the role, the challenge being
 * answered, our own challenge and both node ids, so a proof is bound to one
 * handshake and one direction and cannot be replayed or reflected.
 */
static void
hello_mac(const struct kvp_node *n, char role, const uint8_t *challenge, const uint8_t *own,
	  const char *from, const char *to, uint8_t mac[32])
{
	uint8_t msg[1 + 32 + 32 + 2 * KVP_NODE_ID_MAX];
	unsigned mlen = 32;

	memset(msg, 0, sizeof(msg));
	msg[0] = (uint8_t)role;
	memcpy(msg + 1, challenge, 32);
	memcpy(msg + 33, own, 32);
	strncpy((char *)msg + 65, from, KVP_NODE_ID_MAX - 1);
	strncpy((char *)msg + 65 + KVP_NODE_ID_MAX, to, KVP_NODE_ID_MAX - 1);
	HMAC(EVP_sha256(), n->cfg.auth_secret, (int)strlen(n->cfg.auth_secret), msg, sizeof(msg),
	     mac, &mlen);
}

static bool
mac_ok(const uint8_t *a, const uint8_t *b)
{
	return CRYPTO_memcmp(a, b, 32) == 0;
}

static void
random_bytes(void *p, size_t len)
{
	while (getrandom(p, len, 0) != (ssize_t)len)
		;
}

/* Read what is available of a HELLO; @return 1 complete, 0 partial, <0 error. */
static int
read_hello(int fd, uint8_t *buf, uint32_t *have)
{
	ssize_t r = recv(fd, buf + *have, HELLO_LEN - *have, MSG_DONTWAIT);

	if (r < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	if (r == 0)
		return -ECONNRESET;
	*have += (uint32_t)r;
	if (*have < HELLO_LEN)
		return 0;
	const struct kvp_wire_hdr *h = (const struct kvp_wire_hdr *)buf;
	if (kvp_wire_check(h, 0) < 0 || h->type != KVP_W_HELLO)
		return -EBADMSG;
	return 1;
}

/* Hand a handshaken socket to the worker; the socket becomes blocking for io_uring. */
static int
hand_over(struct kvp_node *n, uint16_t peer, uint8_t link, int fd, bool outgoing, uint64_t epoch)
{
	struct kvp_msg *m = ctrl_msg(n, KVP_MSG_CONN_ADD);
	int one = 1;

	if (!m)
		return -ENOBUFS;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	/* tcp.congestion: e.g. no BBR pacing on loopback and veth, where it halves the rate. */
	if (n->cfg.tcp_congestion[0] &&
	    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, n->cfg.tcp_congestion,
		       (socklen_t)strlen(n->cfg.tcp_congestion)) < 0)
		KVP_LOG_RL(WARNING, core, "peer %u link %u: tcp.congestion \"%s\" refused (%s); "
			   "the system's default stays", peer, link, n->cfg.tcp_congestion,
			   strerror(errno));
	m->peer = peer;
	m->link = link;
	m->fd = fd;
	m->outgoing = outgoing;
	m->epoch = epoch;
	return ctrl_send(n, link_worker(n, peer, link), m);
}

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
		KVP_LOG(WARNING, core, "peer %s (%s) link %u: %s; retrying", peer_label(n, i), p->addr,
			p->out_link, why);
	snprintf(p->last_error, sizeof(p->last_error), "%s", why);
	if (!p->out_up)
		peer_set_why(n, i, code);
	p->out_state = KVP_LINK_DOWN;
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
	if (resolve(p->host, p->port, false, &ss, &len) < 0) {
		out_fail(n, i, "cannot resolve address", KVP_PEER_WHY_CONNECT);
		return;
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
			snprintf(why, sizeof(why), "this address is node %s, already a peer (%s%s%s)", id,
				 n->peers[k].addr[0] ? "at " : "", n->peers[k].addr,
				 n->peers[k].slot_state == KVP_PS_DRAINING ? ", being removed" : "");
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
	if (m->status != HELLO_OK) {
		p->handshake_failures++;
		if (m->status == HELLO_AUTH)
			n->auth_failures++;
		out_fail(n, i, hello_err_str(m->status),
			 m->status == HELLO_AUTH ? KVP_PEER_WHY_AUTH : KVP_PEER_WHY_HANDSHAKE);
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
		uint8_t want[32], proof[HELLO_LEN], mac[32];

		/* The proof covers the node id it claims: a learned id is an authenticated one. */
		hello_mac(n, 'A', p->nonce, m->nonce, id, n->cfg.node_id, want);
		if (!(m->flags & KVP_HELLO_F_AUTH) || !mac_ok(want, m->mac)) {
			p->handshake_failures++;
			n->auth_failures++;
			out_fail(n, i, "the remote failed authentication", KVP_PEER_WHY_AUTH);
			return;
		}
		/* Our proof answers its challenge; the acceptor checks it before use. */
		hello_mac(n, 'D', m->nonce, p->nonce, n->cfg.node_id, id, mac);
		fill_hello(n, proof, id, p->out_link, p->epoch, HELLO_OK, p->nonce, mac);
		if (send(p->out_fd, proof, sizeof(proof), MSG_DONTWAIT | MSG_NOSIGNAL) !=
		    (ssize_t)sizeof(proof)) {
			out_fail(n, i, "cannot send the authentication proof", KVP_PEER_WHY_CONNECT);
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
	if (hand_over(n, i, link, fd, true, epoch) < 0) {
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
		uint8_t buf[HELLO_LEN];
		random_bytes(&p->epoch, sizeof(p->epoch));
		random_bytes(p->nonce, sizeof(p->nonce));
		/* By address: no target, whoever listens there answers with its id. */
		fill_hello(n, buf, p->origin == KVP_PEER_ON_DEMAND ? "" : p->node_id, p->out_link,
			   p->epoch, HELLO_OK, p->nonce, NULL);
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
	rc = read_hello(p->out_fd, p->buf, &p->have);
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

static void
on_pending(struct kvp_node *n, void *arg, uint32_t events)
{
	struct kvp_pending_conn *pc = arg;

	(void)events;
	kvp_peer_pending_input(n, (uint32_t)(pc - n->pending));
}

int
peer_take_pending(struct kvp_node *n, int fd)
{
	for (uint32_t i = 0; i < KVP_PENDING_MAX; i++) {
		struct kvp_pending_conn *pc = &n->pending[i];

		if (pc->fd >= 0)
			continue;
		pc->fd = fd;
		pc->have = 0;
		pc->peer = -1;
		pc->unknown = false;
		pc->auth = false;
		pc->deadline_ns = kvp_mono_ns() + (uint64_t)n->cfg.connect_timeout_ms * 1000000;
		loop_watch(n, &pc->watch, fd, EPOLLIN | EPOLLRDHUP, on_pending, pc);
		return (int)i;
	}
	n->bad_handshakes++;
	KVP_LOG_RL(WARNING, core, "too many peer handshakes in progress; connection refused");
	close(fd);
	return -ENOSPC;
}

void
kvp_peer_accept(struct kvp_node *n)
{
	int fd = accept4(n->peer_lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd >= 0)
		peer_take_pending(n, fd);
}

static void
pending_close(struct kvp_node *n, struct kvp_pending_conn *pc, bool handed)
{
	loop_unwatch(n, &pc->watch);
	if (!handed)
		close(pc->fd);
	pc->fd = -1;
}

static void
pending_refuse(struct kvp_node *n, struct kvp_pending_conn *pc, const char *who, uint32_t status)
{
	uint8_t buf[HELLO_LEN];

	n->bad_handshakes++;
	if (status == HELLO_AUTH)
		n->auth_failures++;
	fill_hello(n, buf, who, pc->link, 0, status, NULL, NULL);
	if (send(pc->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		/* The refusal is a courtesy; the close says the same. */
	}
	KVP_LOG_RL(WARNING, core, "peer '%s' refused: %s", who, hello_err_str(status));
	pending_close(n, pc, false);
}

static void
pending_accept(struct kvp_node *n, struct kvp_pending_conn *pc)
{
	int fd = pc->fd, idx = pc->peer;
	char why[160];

	pending_close(n, pc, true);
	/* Removed while it shook hands: the slot is not its any more. */
	if (idx >= 0 && (n->peers[idx].slot_state != KVP_PS_ACTIVE || n->peers[idx].gen != pc->gen)) {
		KVP_LOG_RL(NOTICE, core, "peer %s: removed during its handshake; link refused",
			   pc->node_id);
		close(fd);
		return;
	}
	if (pc->unknown) {
		/* Authenticated now: it takes a slot (or another of its links already did). */
		idx = peer_find(n, pc->node_id, false);
		if (idx < 0)
			idx = peer_add(n, KVP_PEER_INBOUND, pc->node_id, "", 0, why, sizeof(why));
		if (idx < 0) {
			n->bad_handshakes++;
			KVP_LOG_RL(WARNING, core, "peer %s refused: %s", pc->node_id, why);
			close(fd);
			return;
		}
	}
	if (hand_over(n, (uint16_t)idx, pc->link, fd, false, pc->epoch) < 0) {
		close(fd);
		return;
	}
	n->peers[idx].in_up |= 1ull << pc->link;
	KVP_LOG(INFO, core, "peer %s: accepted its link %u%s", pc->node_id, pc->link,
		n->cfg.auth_secret[0] ? " (authenticated)" : "");
}

/* Is there a slot for a node not in the table (checked again when it has authenticated)? */
static bool
table_has_room(const struct kvp_node *n)
{
	return n->npeers < n->cfg.max_peers;
}

void
kvp_peer_pending_input(struct kvp_node *n, uint32_t slot)
{
	struct kvp_pending_conn *pc = &n->pending[slot];
	int rc = read_hello(pc->fd, pc->buf, &pc->have);

	if (rc == 0)
		return;
	if (rc < 0) {
		n->bad_handshakes++;
		KVP_LOG_RL(WARNING, core, "incoming peer handshake failed: %s",
			   rc == -EBADMSG ? "malformed HELLO" : strerror(-rc));
		pending_close(n, pc, false);
		return;
	}
	struct kvp_wire_hello m;
	memcpy(&m, pc->buf + sizeof(struct kvp_wire_hdr), sizeof(m));
	m.node_id[sizeof(m.node_id) - 1] = '\0';
	m.to_node[sizeof(m.to_node) - 1] = '\0';
	bool secret = n->cfg.auth_secret[0] != '\0';

	if (pc->auth) {
		/* Second message: the dialer's proof for our challenge. */
		uint8_t want[32];
		const char *who = pc->node_id;

		hello_mac(n, 'D', pc->nonce, pc->their_nonce, who, n->cfg.node_id, want);
		if (strcmp(m.node_id, who) != 0 || !mac_ok(want, m.mac)) {
			n->bad_handshakes++;
			n->auth_failures++;
			KVP_LOG_RL(WARNING, core, "peer '%s' refused: bad authentication proof", who);
			pending_close(n, pc, false);
			return;
		}
		pending_accept(n, pc);
		return;
	}
	int idx = peer_find(n, m.node_id, false);
	uint32_t status = HELLO_OK;

	pc->link = (uint8_t)KVP_HELLO_LINK(m.flags);
	pc->unknown = false;
	/*
	 * A node not in the table may join (accept_unknown_peers) once it
	 * authenticates; one being removed may not until its slot is free.
	 */
	if (idx < 0 && (!n->cfg.accept_unknown || !kvp_config_node_id_ok(m.node_id) ||
			strcmp(m.node_id, n->cfg.node_id) == 0 || peer_find(n, m.node_id, true) >= 0))
		status = HELLO_UNKNOWN_NODE;
	else if (idx < 0 && !table_has_room(n))
		status = HELLO_FULL;
	/* No target: the dialer named this node by its address. */
	else if (m.to_node[0] && strcmp(m.to_node, n->cfg.node_id) != 0)
		status = HELLO_WRONG_TARGET;
	else if (m.max_inflight > n->cfg.max_inflight || m.frame_max > n->cfg.tcp_frame_max)
		status = HELLO_LIMITS;
	else if (secret != ((m.flags & KVP_HELLO_F_AUTH) != 0))
		status = HELLO_AUTH;
	else if (pc->link >= peer_node_links(n))
		status = HELLO_LINK;
	if (status != HELLO_OK) {
		if (status == HELLO_FULL)
			n->peers_refused_full++;
		pending_refuse(n, pc, m.node_id, status);
		return;
	}

	uint8_t buf[HELLO_LEN], mac[32];
	pc->peer = idx;
	pc->gen = idx >= 0 ? n->peers[idx].gen : 0;
	pc->unknown = idx < 0;
	snprintf(pc->node_id, sizeof(pc->node_id), "%s", m.node_id);
	pc->epoch = m.epoch;
	if (secret) {
		memcpy(pc->their_nonce, m.nonce, sizeof(pc->their_nonce));
		random_bytes(pc->nonce, sizeof(pc->nonce));
		hello_mac(n, 'A', pc->their_nonce, pc->nonce, n->cfg.node_id, m.node_id, mac);
	}
	fill_hello(n, buf, m.node_id, pc->link, m.epoch, HELLO_OK, secret ? pc->nonce : NULL,
		   secret ? mac : NULL);
	if (send(pc->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof(buf)) {
		n->bad_handshakes++;
		pending_close(n, pc, false);
		return;
	}
	if (secret) {
		pc->auth = true;
		pc->have = 0;
		return;
	}
	pending_accept(n, pc);
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
				 p->out_state == KVP_LINK_CONNECTING ? "connect timeout"
								     : "handshake timeout",
				 p->out_state == KVP_LINK_CONNECTING ? KVP_PEER_WHY_CONNECT
								     : KVP_PEER_WHY_HANDSHAKE);
	}
	for (uint32_t i = 0; i < KVP_PENDING_MAX; i++) {
		struct kvp_pending_conn *pc = &n->pending[i];

		if (pc->fd >= 0 && now >= pc->deadline_ns) {
			n->bad_handshakes++;
			pending_close(n, pc, false);
		}
	}
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
	for (uint32_t i = 0; i < KVP_PENDING_MAX; i++) {
		if (n->pending[i].fd >= 0) {
			close(n->pending[i].fd);
			n->pending[i].fd = -1;
		}
	}
	if (n->peer_lfd >= 0) {
		close(n->peer_lfd);
		n->peer_lfd = -1;
	}
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
	case KVP_LINK_CONNECTING:
	case KVP_LINK_HELLO:
		return "connecting";
	default:
		return "down";
	}
}

static void
on_listen(struct kvp_node *n, void *arg, uint32_t events)
{
	(void)arg;
	(void)events;
	kvp_peer_accept(n);
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
