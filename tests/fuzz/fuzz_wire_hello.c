/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target: the frame header check and the peer handshake state machine.
 *
 * Byte 0 picks the mode:
 *   mode 0: kvp_wire_check() on a header from the input, against an
 *           independent statement of the rules;
 *   mode 1: the accepting side (kvp_peer_pending_input) reading a dialer's
 *           HELLO (and, with a secret, its proof) from a socket;
 *   mode 2: the dialing side (kvp_peer_out_event) reading the acceptor's
 *           HELLO reply (and, with a secret, checking its proof).
 * Bit 2 of byte 0 sets a shared secret; in mode 2, bit 3 picks the peer dialed. The rest is the byte stream the
 * remote sends, cut into chunks (a length byte, then that many bytes), each
 * written to a socketpair before the handler runs again — so partial HELLOs,
 * split headers and trailing garbage are all covered. The node is real
 * (kvp_node_init); handshaken sockets reach a stub transport through the
 * worker inbox, as in kvproxyd.
 *
 * Invariants: a connection is handed to the transport only after a HELLO
 * that passes every check (configured peer, right target, limits, auth flag,
 * HMAC proof recomputed by kvp_test_hello_mac()); otherwise it is closed; the handler never
 * reads outside its buffer (ASan); no fd or control message leaks.
 * getrandom() is deterministic in fuzz builds, so nonces are 0x5a bytes and
 * seeds can carry valid proofs.
 */
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_mempool.h>

#include "fuzz_common.h"

#define SECRET    "fuzz-secret"
#define HELLO_LEN (sizeof(struct kvp_wire_hdr) + sizeof(struct kvp_wire_hello))

static struct kvp_node node;
static struct kvp_worker *w;
static int attached_peer = -1;
static bool attached_out;
static struct kvp_transport_ops stub_ops;

static int
stub_attach(void *tctx, uint16_t peer, uint8_t link, int fd, bool outgoing, uint64_t epoch)
{
	(void)tctx;
	(void)link;
	(void)epoch;
	REQUIRE(attached_peer < 0, "two connections handed over for one handshake");
	attached_peer = peer;
	attached_out = outgoing;
	close(fd);
	return 0;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct kvp_config cfg;

	(void)argc;
	(void)argv;
	fuzz_config(&cfg);
	/* The model is the peer list: a node outside it is refused, not given a slot. */
	cfg.accept_unknown = false;
	cfg.npeers = 2;
	snprintf(cfg.peers[1].node_id, sizeof(cfg.peers[1].node_id), "peer1");
	snprintf(cfg.peers[1].host, sizeof(cfg.peers[1].host), "127.0.0.1");
	cfg.peers[1].port = 2;
	stub_ops = kvp_test_stub_ops;
	stub_ops.attach = stub_attach; /* records what the handshake handed over */
	fuzz_node_init(&node, &cfg, &stub_ops);
	w = &node.workers[0];
	/* Nobody dials during the run: no timers run, so no reconnect starts. */
	return 0;
}

/* ---- mode 0: the header rules, restated ---- */

/* DATA2D: whole blocks of aux2 bytes, rsvd apart (never overlapping), not wrapping. */
static bool
data2d_ok(const struct kvp_wire_hdr *h, uint32_t frame_max)
{
	if (h->len == 0 || h->len > frame_max || h->aux2 == 0 || h->len % h->aux2 != 0 ||
	    h->rsvd < h->aux2)
		return false;
	unsigned __int128 span = (unsigned __int128)(h->len / h->aux2 - 1) * h->rsvd + h->aux2;

	return (unsigned __int128)h->off + span <= UINT64_MAX;
}

static void
fuzz_check(struct fuzz_in *in)
{
	struct kvp_wire_hdr h;
	uint32_t frame_max = (uint32_t)fuzz_bytes_le(in, 4);
	int rc;

	fuzz_copy(in, &h, sizeof(h));
	rc = kvp_wire_check(&h, frame_max);

	bool magic = h.magic == KVP_WIRE_MAGIC, ver = h.version == KVP_WIRE_VERSION;
	bool type = h.type >= KVP_W_HELLO && h.type < KVP_W_TYPE_MAX;
	if (rc == 0) {
		REQUIRE(magic && ver && type, "accepted a bad magic/version/type");
		if (h.type == KVP_W_HELLO)
			REQUIRE(h.len == sizeof(struct kvp_wire_hello), "HELLO len %u", h.len);
		else if (h.type == KVP_W_DATA)
			REQUIRE(h.len > 0 && h.len <= frame_max && h.off + h.len >= h.off,
				"DATA len %u off %" PRIu64 " frame_max %u", h.len, h.off,
				frame_max);
		else if (h.type == KVP_W_DATA2D)
			REQUIRE(data2d_ok(&h, frame_max),
				"DATA2D len %u block %u stride %u off %" PRIu64 " frame_max %u",
				h.len, h.aux2, h.rsvd, h.off, frame_max);
		else if (h.type == KVP_W_RDMA_QP || h.type == KVP_W_RDMA_QP_OK)
			REQUIRE(h.len == sizeof(struct kvp_wire_qp), "QP len %u", h.len);
		else if (h.type == KVP_W_RDMA_GRANT)
			REQUIRE(h.len == sizeof(struct kvp_wire_grant), "GRANT len %u", h.len);
		else
			REQUIRE(h.len == 0, "control frame with payload %u", h.len);
	} else {
		REQUIRE(rc == -EBADMSG || rc == -EPROTONOSUPPORT || rc == -EMSGSIZE, "rc %d", rc);
		REQUIRE(!(magic && ver && type) || rc != -EPROTONOSUPPORT,
			"good version refused as unsupported");
	}
}

/* ---- the handshake, both sides ---- */

/* Would an acceptor with this config take this dialer HELLO (first message)? */
static int
acceptable_hello(const uint8_t *buf, size_t have, bool secret)
{
	struct kvp_wire_hdr h;
	struct kvp_wire_hello m;

	if (have < HELLO_LEN)
		return -1;
	memcpy(&h, buf, sizeof(h));
	memcpy(&m, buf + sizeof(h), sizeof(m));
	m.node_id[KVP_NODE_ID_MAX - 1] = m.to_node[KVP_NODE_ID_MAX - 1] = '\0';
	if (h.magic != KVP_WIRE_MAGIC || h.version != KVP_WIRE_VERSION || h.type != KVP_W_HELLO ||
	    h.len != sizeof(m))
		return -1;
	int idx = kvp_config_peer_index(&node.cfg, m.node_id);
	/* An empty target: the dialer named us by address. */
	if (idx < 0 || (m.to_node[0] && strcmp(m.to_node, node.cfg.node_id) != 0) ||
	    m.max_inflight > node.cfg.max_inflight || m.frame_max > node.cfg.tcp_frame_max ||
	    secret != ((m.flags & KVP_HELLO_F_AUTH) != 0) ||
	    KVP_HELLO_LINK(m.flags) >= node.cfg.tcp_conns)
		return -1;
	return idx;
}

static const uint8_t fixed_nonce[32] = {
	0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
	0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
	0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a,
};

static void
discard(int fd)
{
	uint8_t b[1024];

	while (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0)
		;
}

/* Feed the chunks of the input to @p step until the handshake leaves its slot. */
static size_t
feed(struct fuzz_in *in, int remote, uint8_t *sent, size_t cap, bool (*step)(void))
{
	size_t total = 0;

	for (int chunks = 0; chunks < 8 && fuzz_more(in); chunks++) {
		uint8_t b[512];
		size_t n = fuzz_u8(in) * 2u + 1;

		if (n > in->len - in->off)
			n = in->len - in->off;
		fuzz_copy(in, b, n);
		if (send(remote, b, n, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)n)
			break;
		if (total < cap) {
			size_t k = n < cap - total ? n : cap - total;

			memcpy(sent + total, b, k);
		}
		total += n;
		bool more = step();
		discard(remote);
		if (!more)
			break;
	}
	return total;
}

static bool
accept_step(void)
{
	kvp_peer_pending_input(&node, 0);
	return node.pending[0].fd >= 0;
}

static void
run_acceptor(struct fuzz_in *in, bool secret)
{
	struct kvp_pending_conn *pc = &node.pending[0];
	uint8_t sent[2 * HELLO_LEN];
	int sp[2];

	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp) == 0,
		"socketpair");
	/* What kvp_peer_accept() does with a new connection. */
	REQUIRE(peer_take_pending(&node, sp[0]) == 0, "pending slot 0 is taken");

	memset(sent, 0, sizeof(sent));
	size_t total = feed(in, sp[1], sent, sizeof(sent), accept_step);
	if (pc->fd >= 0) {
		/* The dialer gives up: the close ends the handshake. */
		shutdown(sp[1], SHUT_WR);
		/* As epoll would: called again while the socket stays readable (data, then EOF). */
		for (int i = 0; i < 4 && pc->fd >= 0; i++)
			kvp_peer_pending_input(&node, 0);
		REQUIRE(pc->fd < 0, "a closed handshake kept its slot");
	}
	close(sp[1]);
	kvp_worker_inbox(w);

	int want = acceptable_hello(sent, total, secret);
	if (attached_peer >= 0) {
		REQUIRE(!attached_out, "accepted connection handed over as outgoing");
		REQUIRE(want == attached_peer,
			"handed over a connection the HELLO did not earn (peer %d, expected %d)",
			attached_peer, want);
		if (secret) {
			struct kvp_wire_hello first, proof;
			uint8_t mac[32];

			REQUIRE(total >= 2 * HELLO_LEN, "authenticated without a proof message");
			memcpy(&first, sent + sizeof(struct kvp_wire_hdr), sizeof(first));
			memcpy(&proof, sent + HELLO_LEN + sizeof(struct kvp_wire_hdr),
			       sizeof(proof));
			kvp_test_hello_mac(SECRET, 'D', fixed_nonce, first.nonce,
					   node.cfg.peers[want].node_id, node.cfg.node_id, mac);
			REQUIRE(memcmp(mac, proof.mac, 32) == 0, "accepted a wrong proof");
		}
		node.peers[attached_peer].in_up = 0;
	}
}

static uint16_t dial_peer;

static bool
dial_step(void)
{
	kvp_peer_out_event(&node, dial_peer, EPOLLIN);
	return node.peers[dial_peer].out_state == KVP_LINK_HELLO;
}

static void
run_dialer(struct fuzz_in *in, bool secret, uint16_t i)
{
	struct kvp_peer *p = &node.peers[i];
	uint8_t sent[HELLO_LEN];
	int sp[2];

	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp) == 0,
		"socketpair");
	/* Where kvp_peer_out_event() stands after connecting and sending our HELLO. */
	p->out_fd = sp[0];
	p->out_state = KVP_LINK_HELLO;
	/* One link, so a handover leaves nothing else to dial. */
	p->links = 1;
	p->out_link = 0;
	p->out_up = 0;
	p->have = 0;
	p->epoch = 0x5a5a5a5a5a5a5a5aull;
	memcpy(p->nonce, fixed_nonce, sizeof(p->nonce));
	p->deadline_ns = kvp_mono_ns() + 1000000000ull;
	p->backoff_ms = node.cfg.reconnect_ms;
	peer_out_watch(&node, i, EPOLLIN | EPOLLRDHUP);
	dial_peer = i;

	memset(sent, 0, sizeof(sent));
	size_t total = feed(in, sp[1], sent, sizeof(sent), dial_step);
	if (p->out_state == KVP_LINK_HELLO) {
		shutdown(sp[1], SHUT_WR);
		for (int k = 0; k < 4 && p->out_state == KVP_LINK_HELLO; k++)
			kvp_peer_out_event(&node, i, EPOLLIN | EPOLLRDHUP);
		REQUIRE(p->out_state == KVP_LINK_DOWN, "a closed handshake stayed open");
	}
	close(sp[1]);
	kvp_worker_inbox(w);

	if (attached_peer >= 0) {
		struct kvp_wire_hdr h;
		struct kvp_wire_hello m;

		REQUIRE(attached_out && attached_peer == i, "handed over the wrong connection");
		REQUIRE(p->out_state == KVP_LINK_UP, "handed over but not up");
		REQUIRE(total >= HELLO_LEN, "handed over before a whole HELLO");
		memcpy(&h, sent, sizeof(h));
		memcpy(&m, sent + sizeof(h), sizeof(m));
		REQUIRE(h.magic == KVP_WIRE_MAGIC && h.type == KVP_W_HELLO && m.status == 0 &&
				strncmp(m.node_id, node.cfg.peers[i].node_id, sizeof(m.node_id)) ==
					0,
			"handed over after a HELLO reply that should fail");
		if (secret) {
			uint8_t mac[32];

			kvp_test_hello_mac(SECRET, 'A', fixed_nonce, m.nonce,
					   node.cfg.peers[i].node_id, node.cfg.node_id, mac);
			REQUIRE((m.flags & KVP_HELLO_F_AUTH) && memcmp(mac, m.mac, 32) == 0,
				"accepted a reply with a wrong proof");
		}
	} else {
		REQUIRE(p->out_state == KVP_LINK_DOWN && p->out_fd < 0,
			"failed handshake left state %d fd %d", p->out_state, p->out_fd);
	}
	w->peers[i].links = 0;
	p->out_up = 0;
	p->out_state = KVP_LINK_DOWN;
	p->out_fd = -1;
	p->last_error[0] = '\0';
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size, 0 };
	int fd0 = fuzz_lowest_fd();
	unsigned pool0 = rte_mempool_avail_count(node.msg_pool);
	uint8_t mode;
	bool secret;

	if (size == 0)
		return 0;
	mode = fuzz_u8(&in);
	secret = (mode & 4) != 0;
	snprintf(node.cfg.auth_secret, sizeof(node.cfg.auth_secret), "%s", secret ? SECRET : "");
	attached_peer = -1;
	switch (mode % 4) {
	case 0:
		fuzz_check(&in);
		break;
	case 1:
	case 3:
		run_acceptor(&in, secret);
		break;
	default:
		run_dialer(&in, secret, (mode >> 3) & 1);
		break;
	}
	if (fuzz_verbose())
		fprintf(stderr,
			"wire_hello: mode %u secret %d: %s (bad handshakes %" PRIu64
			", auth failures %" PRIu64 ")\n",
			mode % 4, secret, attached_peer >= 0 ? "handed over" : "not handed over",
			node.bad_handshakes, node.auth_failures);
	fuzz_drain_outbox(&node, 0, NULL);
	REQUIRE(rte_mempool_avail_count(node.msg_pool) == pool0, "control messages leaked");
	REQUIRE(fuzz_lowest_fd() == fd0, "fd leaked");
	return 0;
}
