/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer handshake's pieces, shared by the dialling (peer.c) and the
 * accepting (peer_accept.c) side: the HELLO message, its refusal reasons,
 * the shared-secret proof, address resolution, and handing a handshaken
 * socket to the worker that owns its link.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <rte_mempool.h>

#include "ctrl_priv.h"

const char *
peer_hello_err_str(uint32_t e)
{
	switch (e) {
	case PEER_HELLO_UNKNOWN_NODE:
		return "we are not a configured peer of the remote node";
	case PEER_HELLO_WRONG_TARGET:
		return "the remote node has a different node_id than configured";
	case PEER_HELLO_LIMITS:
		return "limits mismatch (max_inflight / tcp.frame_max larger than the remote's)";
	case PEER_HELLO_AUTH:
		return "authentication failed (auth secrets differ or are set on one side only)";
	case PEER_HELLO_LINK:
		return "link index beyond the remote's workers x tcp.connections";
	case PEER_HELLO_FULL:
		return "the remote's peer table is full (limits.max_peers)";
	default:
		return "refused";
	}
}

int
peer_resolve(const char *host, uint16_t port, bool passive, bool numeric,
	     struct sockaddr_storage *ss, socklen_t *len)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	char pstr[8];
	int rc;

	hints.ai_flags =
		(passive ? AI_PASSIVE : 0) | (numeric ? AI_NUMERICHOST : 0) | AI_NUMERICSERV;
	snprintf(pstr, sizeof(pstr), "%u", port);
	rc = getaddrinfo(host, pstr, &hints, &res);
	if (rc == EAI_NONAME && numeric)
		return -EAGAIN;
	if (rc != 0)
		return -EHOSTUNREACH;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

/* The worker that owns link @p link of peer @p peer, in either direction. */
static unsigned
link_worker(const struct kvp_node *n, uint16_t peer, uint8_t link)
{
	(void)peer; /* every peer's links go round the workers alike */
	return kvp_link_worker(link, n->nworkers);
}

void
peer_fill_hello(struct kvp_node *n, uint8_t *buf, const char *to, uint8_t link, uint64_t epoch,
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
void
peer_hello_mac(const struct kvp_node *n, char role, const uint8_t *challenge, const uint8_t *own,
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

bool
peer_mac_ok(const uint8_t *a, const uint8_t *b)
{
	return CRYPTO_memcmp(a, b, 32) == 0;
}

void
peer_random_bytes(void *p, size_t len)
{
	while (getrandom(p, len, 0) != (ssize_t)len)
		;
}

/* Read what is available of a HELLO; @return 1 complete, 0 partial, <0 error. */
int
peer_read_hello(int fd, uint8_t *buf, uint32_t *have)
{
	ssize_t r = recv(fd, buf + *have, PEER_HELLO_LEN - *have, MSG_DONTWAIT);

	if (r < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	if (r == 0)
		return -ECONNRESET;
	*have += (uint32_t)r;
	if (*have < PEER_HELLO_LEN)
		return 0;
	const struct kvp_wire_hdr *h = (const struct kvp_wire_hdr *)buf;
	if (kvp_wire_check(h, 0) < 0 || h->type != KVP_W_HELLO)
		return -EBADMSG;
	return 1;
}

/* Hand a handshaken socket to the worker; the socket becomes blocking for io_uring. */
int
peer_hand_over(struct kvp_node *n, uint16_t peer, uint8_t link, int fd, bool outgoing,
	       uint64_t epoch)
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
		KVP_LOG_RL(WARNING, core,
			   "peer %u link %u: tcp.congestion \"%s\" refused (%s); "
			   "the system's default stays",
			   peer, link, n->cfg.tcp_congestion, strerror(errno));
	m->peer = peer;
	m->link = link;
	m->fd = fd;
	m->outgoing = outgoing;
	m->epoch = epoch;
	return ctrl_send(n, link_worker(n, peer, link), m);
}
