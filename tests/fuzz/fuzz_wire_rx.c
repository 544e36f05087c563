/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target: the TCP transport's frame decoder, end to end. The transport
 * is the real one (kvp_tcp_stage_ops: io_uring, staging pool, framing); a
 * handshaken connection is attached with one end of a socketpair, and the
 * input is what the remote node sends on it: frame headers, payloads, ACKs,
 * PINGs, ENDs, garbage, cut into chunks written between progress calls.
 *
 * Byte 0: bit 0 picks the connection's direction. Incoming (bit 0 clear):
 * the remote sends DATA/END/ABORT/PING into two regions of a connected
 * client, one landed in place, one through the staging pool. Outgoing: a
 * transfer of ours is in flight on it and the remote answers with ACKs (and
 * whatever else the input says). Bit 1: the client that owns the regions
 * has shrunk their memfds to 0 bytes (ftruncate: it may, they are its
 * files) — landing must not fault.
 *
 * Invariants: bytes land only inside regions (canary bytes around each
 * region never change; ASan checks the rest); a malformed or unexpected
 * frame closes the connection and is counted; every connection closes
 * within a bounded number of progress calls once the remote hangs up; after
 * that the staging pool is whole, no region is referenced, no transfer slot
 * or control message or fd is leaked; completions seen by the client are
 * well-formed.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_mempool.h>

#include "fuzz_common.h"
#include "kvp_tcp_stage.h"
#include "tcp_priv.h"

#define MEMFD_LEN (256u << 10)
#define REG_OFF   1000u
#define REG_LEN   200000u
#define CANARY    0xc3
#define SEND_LEN  6000u

static struct kvp_node node;
static struct kvp_worker *w;
static struct tcp_ctx *tc;
static struct fuzz_client cl;
static uint8_t *view[2]; /* our mappings of the direct (0) and staged (1) regions */
static int region_fd[2];
static uint64_t keys[2];

static void
paint(uint8_t *v)
{
	memset(v, CANARY, REG_OFF);
	memset(v + REG_OFF + REG_LEN, CANARY, MEMFD_LEN - REG_OFF - REG_LEN);
}

static void
check_canaries(int r)
{
	const uint8_t *v = view[r];

	for (uint32_t i = 0; i < MEMFD_LEN; i++) {
		if (i == REG_OFF)
			i = REG_OFF + REG_LEN;
		REQUIRE(v[i] == CANARY, "region %d: byte %u outside [%u, %u) written", r, i,
			REG_OFF, REG_OFF + REG_LEN);
	}
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct kvp_config cfg;

	(void)argc;
	(void)argv;
	fuzz_config(&cfg);
	/* Frames large enough for the direct-receive path (>= 64 KiB windows). */
	cfg.tcp_frame_max = 1u << 20;
	cfg.tcp_rx_buffer = 64u << 10;
	cfg.peer_timeout_ms = 60000; /* no heartbeat failures within an input */
	fuzz_node_init(&node, &cfg, &kvp_tcp_stage_ops);
	w = &node.workers[0];
	tc = w->tp[0].tctx;
	fuzz_client_open(&node, &cl, 1 << 16);
	for (int r = 0; r < 2; r++) {
		uint32_t flags = KVP_REGION_HOST | (r ? KVP_REGION_F_STAGE : 0);
		void *map;
		int fd;

		REQUIRE(kvp_test_memfd("fuzz-rx-region", MEMFD_LEN, false, &fd, &map) == 0,
			"memfd");
		view[r] = map;
		paint(view[r]);
		/* Unsealed, as a careless client would; sealed if the daemon insists. */
		int rc = kvp_region_add(&node.regions, cl.conn.id, fd, REG_OFF, REG_LEN, flags,
					&keys[r]);
		if (rc < 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0)
			rc = kvp_region_add(&node.regions, cl.conn.id, fd, REG_OFF, REG_LEN, flags,
					    &keys[r]);
		REQUIRE(rc == 0, "region: %d", rc);
		region_fd[r] = fd; /* the owner keeps its files (and may resize them) */
	}
	return 0;
}

static void
discard(int fd)
{
	uint8_t b[65536];

	while (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0)
		;
}

/* Progress until nothing moves for a while; @return true if the connection is free again. */
static bool
settle(struct tcp_conn *c, int remote, int rounds)
{
	int idle = 0;

	for (int i = 0; i < rounds && idle < 4; i++) {
		int work = kvp_worker_poll_chans(w) + kvp_worker_progress(w);

		discard(remote);
		if (c->state == CONN_FREE)
			return true;
		idle = work ? 0 : idle + 1;
	}
	return c->state == CONN_FREE;
}

/* One transfer of ours in flight to the peer, so ACKs have something to acknowledge. */
static void
submit_one(void)
{
	static uint64_t uid;
	struct kvp_test_xfer x = { .user_id = ++uid,
				   .submit_ns = kvp_mono_ns(),
				   .timeout_ns = 3600ull * 1000000000,
				   .src_key = keys[0],
				   .dst_key = FUZZ_KEY(7),
				   .len = SEND_LEN };

	REQUIRE(kvp_test_submit(&cl.conn.sq, &x) == 2, "client SQ full");
}

static void
read_cq(bool outgoing)
{
	struct kvp_cqe c[16];
	int n;

	while ((n = kvp_ring_dequeue_burst(&cl.conn.cq, c, 16)) > 0) {
		for (int i = 0; i < n; i++) {
			REQUIRE(c[i].status >= 0 && c[i].status < KVP_STATUS_MAX, "status %d",
				c[i].status);
			if (c[i].kind == KVP_CQE_LANDED) {
				REQUIRE(!outgoing, "landing notice from an outgoing connection");
				REQUIRE(c[i].status == KVP_OK &&
						(c[i].dst_key == keys[0] ||
						 c[i].dst_key == keys[1]) &&
						c[i].bytes <= (uint64_t)REG_LEN * 64,
					"bad landing notice (key %#" PRIx64 ", %" PRIu64 " bytes)",
					c[i].dst_key, c[i].bytes);
			} else {
				REQUIRE(c[i].kind == KVP_CQE_DONE, "CQE kind %u", c[i].kind);
				REQUIRE(c[i].status != KVP_OK || c[i].bytes == SEND_LEN,
					"done with %" PRIu64 " bytes", c[i].bytes);
			}
		}
	}
	REQUIRE(n == 0, "client CQ index impossible");
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size, 0 };
	int fd0 = fuzz_lowest_fd();
	unsigned pool0 = rte_mempool_avail_count(node.msg_pool);
	uint64_t bad0 = w->stats.peer[0].bad_frames;
	struct fuzz_outbox ob = { 0 };
	bool outgoing;
	int sp[2];

	if (size == 0)
		return 0;
	uint8_t mode = fuzz_u8(&in);
	outgoing = (mode & 1) != 0;
	bool shrunk = (mode & 2) != 0;
	/* A sealed file cannot shrink (EPERM): nothing to test then. */
	for (int r = 0; r < 2 && shrunk; r++)
		if (ftruncate(region_fd[r], 0) < 0)
			shrunk = false;
	struct tcp_conn *c = &tc->conns[outgoing ? 0 : 1];
	REQUIRE(c->state == CONN_FREE, "connection slot still busy from the last input");
	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0, "socketpair");
	/* What the worker does with a CONN_ADD from the handshake. */
	REQUIRE(w->tp[0].ops->attach(w->tp[0].tctx, 0, 0, sp[0], outgoing, 0x5a5a5a5a5a5a5a5aull) ==
			0,
		"attach");
	/* Every slot is free between inputs: restart generations so tags repeat (ACK tag 0). */
	for (uint32_t i = 0; i < w->nxfers; i++)
		w->xfers[i].gen = 0;
	if (outgoing) {
		w->peers[0].links = 1;
		submit_one();
	}
	settle(c, sp[1], 64);

	/* The remote's bytes, chunk by chunk; the transport runs between chunks. */
	for (int chunks = 0; chunks < 16 && fuzz_more(&in) && c->state == CONN_UP; chunks++) {
		size_t n = (size_t)fuzz_bytes_le(&in, 2) + 1;
		uint8_t *b;

		if (n > in.len - in.off)
			n = in.len - in.off;
		b = (uint8_t *)in.p + in.off;
		in.off += n;
		for (size_t done = 0; done < n && c->state == CONN_UP;) {
			ssize_t k = send(sp[1], b + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);

			if (k > 0)
				done += (size_t)k;
			settle(c, sp[1], 64);
		}
		settle(c, sp[1], 64);
	}
	bool failed = c->state != CONN_UP;

	/* The remote hangs up: the connection must drain and free its slot. */
	shutdown(sp[1], SHUT_WR);
	REQUIRE(settle(c, sp[1], 10000),
		"connection did not close after the remote hung up "
		"(rx_state %d, ops %u)",
		c->rx_state, c->ops);
	close(sp[1]);
	w->peers[0].links = 0;
	kvp_worker_inbox(w);
	fuzz_drain_outbox(&node, 0, &ob);
	REQUIRE(ob.conn_down >= 1, "closed connection not reported to the main lcore");
	if (w->stats.peer[0].bad_frames != bad0)
		REQUIRE(failed, "bad frame counted but the connection stayed up");

	if (fuzz_verbose())
		fprintf(stderr,
			"wire_rx: %s connection %s; rx frames %" PRIu64 ", bad frames %" PRIu64
			", rx bytes %" PRIu64 ", landed %" PRIu64 ", completions ok %" PRIu64 "\n",
			outgoing ? "outgoing" : "incoming", failed ? "failed" : "stayed up",
			w->stats.peer[0].rx_frames, w->stats.peer[0].bad_frames,
			w->stats.peer[0].rx_bytes, w->stats.xfers_landed,
			w->stats.completions[KVP_OK]);
	read_cq(outgoing);
	if (mode & 2) {
		/* Back to full size (zero-filled), canaries repainted. */
		for (int r = 0; r < 2; r++) {
			REQUIRE(ftruncate(region_fd[r], MEMFD_LEN) == 0, "ftruncate");
			paint(view[r]);
		}
	}
	check_canaries(0);
	check_canaries(1);
	REQUIRE(w->stats.stage_used == 0, "%" PRIu64 " staging buffers still held",
		w->stats.stage_used);
	fuzz_assert_reclaimed(&node, pool0);
	REQUIRE(fuzz_lowest_fd() == fd0, "fd leaked");
	return 0;
}
