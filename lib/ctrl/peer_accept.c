/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The accepting side of peer links (main lcore): the listener, handshakes
 * in progress (at most KVP_PENDING_MAX, each with a deadline), the checks
 * of a dialer's HELLO (known node or a free slot for an authenticated
 * stranger, target, limits, authentication, link index), the challenge
 * for its proof, and the hand-over of the link to its worker.
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

static void on_listen(struct kvp_node *n, void *arg, uint32_t events);

int
kvp_peer_listen(struct kvp_node *n, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int one = 1, fd;

	if (peer_resolve(n->cfg.listen_host, n->cfg.listen_port, true, false, &ss, &len) < 0) {
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
on_listen(struct kvp_node *n, void *arg, uint32_t events)
{
	(void)arg;
	(void)events;
	kvp_peer_accept(n);
}

static void
on_pending(struct kvp_node *n, void *arg, uint32_t events)
{
	struct kvp_pending_conn *pc = arg;

	(void)events;
	kvp_peer_pending_input(n, (uint32_t)(pc - n->pending));
}

/* Same remote IP (port aside)? */
static bool
same_source(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->ss_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr,
			      sizeof(struct in6_addr)) == 0;
	return false;
}

int
peer_take_pending(struct kvp_node *n, int fd)
{
	struct sockaddr_storage from = { 0 };
	socklen_t fl = sizeof(from);
	uint32_t same = 0;

	if (getpeername(fd, (struct sockaddr *)&from, &fl) < 0)
		from.ss_family = AF_UNSPEC;
	for (uint32_t i = 0; i < KVP_PENDING_MAX; i++)
		same += n->pending[i].fd >= 0 && same_source(&n->pending[i].from, &from);
	if (same >= KVP_PENDING_PER_SOURCE) {
		n->bad_handshakes++;
		KVP_LOG_RL(WARNING, core,
			   "%u peer handshakes in progress from one address; connection refused",
			   same);
		close(fd);
		return -EBUSY;
	}
	for (uint32_t i = 0; i < KVP_PENDING_MAX; i++) {
		struct kvp_pending_conn *pc = &n->pending[i];

		if (pc->fd >= 0)
			continue;
		pc->fd = fd;
		pc->from = from;
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

/*
 * accept() found no descriptor: the spare one takes the connection off the
 * backlog to close it (the listener would fire again at once); without a
 * spare the listener leaves the epoll set for ACCEPT_RETRY_NS.
 */
static void
accept_out_of_fds(struct kvp_node *n)
{
	int fd = ctrl_accept_spare(n, n->peer_lfd);

	if (fd >= 0) {
		n->bad_handshakes++;
		KVP_LOG_RL(WARNING, core, "peer connection refused: out of file descriptors");
		close(fd);
	}
	if (!ctrl_spare_restore(n) && !n->peer_accept_paused) {
		loop_unwatch(n, &n->peer_lw);
		n->peer_accept_paused = true;
		n->peer_accept_retry_ns = kvp_mono_ns() + ACCEPT_RETRY_NS;
	}
}

void
kvp_peer_accept(struct kvp_node *n)
{
	int fd = accept4(n->peer_lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd >= 0)
		peer_take_pending(n, fd);
	else if (errno == EMFILE || errno == ENFILE)
		accept_out_of_fds(n);
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
	uint8_t buf[PEER_HELLO_LEN];

	n->bad_handshakes++;
	if (status == PEER_HELLO_AUTH)
		n->auth_failures++;
	peer_fill_hello(n, buf, who, pc->link, 0, status, NULL, NULL);
	if (send(pc->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		/* The refusal is a courtesy; the close says the same. */
	}
	/* The id is the remote's, unchecked: only a well-formed one reaches the log. */
	KVP_LOG_RL(WARNING, core, "peer '%s' refused: %s",
		   kvp_config_node_id_ok(who) ? who : "(malformed node id)",
		   peer_hello_err_str(status));
	pending_close(n, pc, false);
}

static void
pending_accept(struct kvp_node *n, struct kvp_pending_conn *pc)
{
	int fd = pc->fd, idx = pc->peer;
	char why[160];

	pending_close(n, pc, true);
	/* Removed while it shook hands: the slot is not its any more. */
	if (idx >= 0 &&
	    (n->peers[idx].slot_state != KVP_PS_ACTIVE || n->peers[idx].gen != pc->gen)) {
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
	if (peer_hand_over(n, (uint16_t)idx, pc->link, fd, false, pc->epoch) < 0) {
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
	int rc = peer_read_hello(pc->fd, pc->buf, &pc->have);

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

		peer_hello_mac(n, 'D', pc->nonce, pc->their_nonce, who, n->cfg.node_id, want);
		if (strcmp(m.node_id, who) != 0 || !peer_mac_ok(want, m.mac)) {
			n->bad_handshakes++;
			n->auth_failures++;
			KVP_LOG_RL(WARNING, core, "peer '%s' refused: bad authentication proof",
				   who);
			pending_close(n, pc, false);
			return;
		}
		pending_accept(n, pc);
		return;
	}
	int idx = peer_find(n, m.node_id, false);
	uint32_t status = PEER_HELLO_OK;

	pc->link = (uint8_t)KVP_HELLO_LINK(m.flags);
	pc->unknown = false;
	/*
	 * A node not in the table may join (accept_unknown_peers) once it
	 * authenticates; one being removed may not until its slot is free.
	 */
	if (idx < 0 &&
	    (!n->cfg.accept_unknown || !kvp_config_node_id_ok(m.node_id) ||
	     strcmp(m.node_id, n->cfg.node_id) == 0 || peer_find(n, m.node_id, true) >= 0))
		status = PEER_HELLO_UNKNOWN_NODE;
	else if (idx < 0 && !table_has_room(n))
		status = PEER_HELLO_FULL;
	/* No target: the dialer named this node by its address. */
	else if (m.to_node[0] && strcmp(m.to_node, n->cfg.node_id) != 0)
		status = PEER_HELLO_WRONG_TARGET;
	else if (m.max_inflight > n->cfg.max_inflight || m.frame_max > n->cfg.tcp_frame_max)
		status = PEER_HELLO_LIMITS;
	else if (secret != ((m.flags & KVP_HELLO_F_AUTH) != 0))
		status = PEER_HELLO_AUTH;
	else if (pc->link >= peer_node_links(n))
		status = PEER_HELLO_LINK;
	if (status != PEER_HELLO_OK) {
		if (status == PEER_HELLO_FULL)
			n->peers_refused_full++;
		pending_refuse(n, pc, m.node_id, status);
		return;
	}

	uint8_t buf[PEER_HELLO_LEN], mac[32];
	pc->peer = idx;
	pc->gen = idx >= 0 ? n->peers[idx].gen : 0;
	pc->unknown = idx < 0;
	snprintf(pc->node_id, sizeof(pc->node_id), "%s", m.node_id);
	pc->epoch = m.epoch;
	if (secret) {
		memcpy(pc->their_nonce, m.nonce, sizeof(pc->their_nonce));
		peer_random_bytes(pc->nonce, sizeof(pc->nonce));
		peer_hello_mac(n, 'A', pc->their_nonce, pc->nonce, n->cfg.node_id, m.node_id, mac);
	}
	peer_fill_hello(n, buf, m.node_id, pc->link, m.epoch, PEER_HELLO_OK,
			secret ? pc->nonce : NULL, secret ? mac : NULL);
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

/* Handshakes not complete by their deadline are dropped. */
void
peer_pending_timers(struct kvp_node *n, uint64_t now)
{
	if (n->peer_accept_paused && now >= n->peer_accept_retry_ns) {
		n->peer_accept_paused = false;
		loop_watch(n, &n->peer_lw, n->peer_lfd, EPOLLIN, on_listen, NULL);
	}
	for (uint32_t i = 0; i < KVP_PENDING_MAX; i++) {
		struct kvp_pending_conn *pc = &n->pending[i];

		if (pc->fd >= 0 && now >= pc->deadline_ns) {
			n->bad_handshakes++;
			pending_close(n, pc, false);
		}
	}
}

/* At exit: the pending connections and the listener. */
void
peer_accept_close_all(struct kvp_node *n)
{
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
