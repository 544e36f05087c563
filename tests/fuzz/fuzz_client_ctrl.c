/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target: the client socket protocol of kvproxyd (client_srv.c, client_req.c:
 * HELLO, REG with an fd, DEREG, PEER_LOOKUP; fixed 256-byte requests), the
 * surface every local process that can reach the client socket touches.
 *
 * Each input is one client connection to a real node (kvp_node_init, stub
 * transport, the real accept path). The input is a list of chunks: a flags
 * byte, a length byte, then that many bytes written to the socket; the flags
 * attach file descriptors to the chunk (a mappable memfd, a second memfd, a
 * pipe — not mappable — or several at once). The control plane runs
 * (kvp_node_poll, worker 0's inbox) after every chunk; replies are read and
 * checked. Then the client hangs up.
 *
 * Invariants: every reply is a whole 256-byte message with the magic and a
 * NUL-terminated reason; once the client has gone, its slot, channel and
 * regions are reclaimed (no client, no region, no control message left) and
 * every fd it passed has been closed (no fd leak; the on-demand peers its
 * PEER_ADDR requests made are removed first: their dial sockets are the
 * node's); ASan/UBSan watch the rest.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <rte_mempool.h>

#include "fuzz_common.h"

static struct kvp_node node;
static struct kvp_worker *w;

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct kvp_config cfg;

	(void)argc;
	(void)argv;
	fuzz_config(&cfg);
	cfg.max_clients = 2;
	fuzz_node_init(&node, &cfg, &kvp_test_stub_ops);
	w = &node.workers[0];
	return 0;
}

/* Everything the daemon does in its loop for a client: control plane, then the worker's inbox. */
static void
run_node(void)
{
	for (int i = 0; i < 3; i++) {
		kvp_node_poll(&node, 0);
		kvp_worker_inbox(w);
	}
}

static uint8_t part[KVP_CTRL_MSGLEN]; /* a reply being read */
static size_t have;

static void
read_replies(int sock)
{
	for (;;) {
		/* The daemon's fds (channel, doorbell, notify) are ours now: max 0 closes them. */
		long r = kvp_test_recv_fds(sock, part + have, sizeof(part) - have, NULL, NULL, 0,
					   MSG_DONTWAIT);

		if (r <= 0) {
			if (r == 0)
				have = 0;
			return;
		}
		have += (size_t)r;
		if (have == sizeof(part)) {
			struct kvp_ctrl_rep rep;

			memcpy(&rep, part, sizeof(rep));
			REQUIRE(rep.magic == KVP_CTRL_MAGIC, "reply without the magic");
			REQUIRE(memchr(rep.errmsg, '\0', sizeof(rep.errmsg)) != NULL,
				"reply reason not NUL-terminated");
			REQUIRE(rep.err <= 0, "positive errno %d in a reply", rep.err);
			if (fuzz_verbose())
				fprintf(stderr, "client_ctrl: reply op %u err %d %.*s\n", rep.op,
					rep.err, KVP_ERRMSG_MAX, rep.errmsg);
			have = 0;
		}
	}
}

static int
mk_memfd(size_t len)
{
	int fd, rc = kvp_test_memfd("fuzz-ctrl-region", len, true, &fd, NULL);

	REQUIRE(rc == 0, "memfd: %d", rc);
	return fd;
}

/* Send @p n bytes with the fds that @p flags asks for. */
static void
send_chunk(int sock, const uint8_t *b, size_t n, uint8_t flags)
{
	int fds[4], nfd = 0, p[2] = { -1, -1 };

	if (flags & 1)
		fds[nfd++] = mk_memfd(65536);
	if (flags & 2)
		fds[nfd++] = mk_memfd(4096);
	if ((flags & 4) && pipe2(p, O_CLOEXEC) == 0) {
		fds[nfd++] = p[0];
		close(p[1]);
	}
	if (flags & 8)
		fds[nfd++] = mk_memfd(0); /* empty: any range is beyond its end */
	if (kvp_test_send_fds(sock, b, n, fds, (unsigned)nfd, MSG_DONTWAIT) < 0) {
		/* The daemon hung up on us: fine, the fds below are ours to close. */
	}
	for (int i = 0; i < nfd; i++)
		close(fds[i]);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size, 0 };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd0 = fuzz_lowest_fd();
	unsigned pool0 = rte_mempool_avail_count(node.msg_pool);
	uint32_t peers0 = node.npeers;
	int sock;

	have = 0;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", node.cfg.client_socket);
	sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	REQUIRE(sock >= 0 && connect(sock, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect");
	run_node(); /* accept */

	for (int chunks = 0; chunks < 32 && fuzz_more(&in); chunks++) {
		uint8_t flags = fuzz_u8(&in);
		size_t n = (size_t)fuzz_u8(&in) + 1;
		uint8_t b[256];

		if (flags & 0x80) /* a whole request in one go */
			n = KVP_CTRL_MSGLEN;
		fuzz_copy(&in, b, n);
		send_chunk(sock, b, n, flags);
		run_node();
		read_replies(sock);
	}

	/* The client goes away; the node must give back everything it held for it. */
	close(sock);
	for (int i = 0; i < 50 && (node.nclients || node.regions.used); i++)
		run_node();
	if (fuzz_verbose())
		fprintf(stderr, "client_ctrl: clients %u regions %u after the hang-up\n",
			node.nclients, node.regions.used);
	REQUIRE(node.nclients == 0, "%u client slots still held", node.nclients);
	REQUIRE(node.regions.used == 0, "%u regions still mapped", node.regions.used);
	REQUIRE(w->nchans == 0, "the worker still polls %u channels", w->nchans);
	/*
	 * PEER_ADDR makes on-demand peers, which the node keeps dialling (a
	 * socket each) until timeouts.peer_forget_ms: node state this input
	 * made, not the client's. Removed here, so the next input starts from
	 * the same table and the fd check below sees only the client's.
	 */
	for (uint32_t i = 0; i < node.cfg.max_peers; i++)
		if (node.peers[i].slot_state == KVP_PS_ACTIVE &&
		    node.peers[i].origin == KVP_PEER_ON_DEMAND)
			REQUIRE(peer_remove(&node, i, "fuzz input done") == 0, "peer_remove");
	for (int i = 0; i < 50 && node.npeers != peers0; i++)
		run_node();
	REQUIRE(node.npeers == peers0, "%u peer slots left of the input's on-demand peers",
		node.npeers - peers0);
	fuzz_drain_outbox(&node, 0, NULL);
	REQUIRE(rte_mempool_avail_count(node.msg_pool) == pool0, "control messages leaked");
	REQUIRE(fuzz_lowest_fd() == fd0, "fd leaked (one the client passed, or a channel's)");
	return 0;
}
