/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Several workers in one node, driven by hand on one thread: a node of two
 * workers with a stub transport (whose fence op reports the landings each
 * worker still has under way), two real clients over the client socket.
 *
 * Asserts: clients go to the worker with the fewest; a transfer landing on
 * the other worker reaches its client as a LANDED completion only through
 * the client's worker, fields intact; a fence set on one worker is mirrored
 * on the other (which then refuses the client's bytes), completes only once
 * both workers' transports are clear, after any landing notice the other
 * worker sent before its clear, with the bytes the mirror refused; a mirror
 * that cannot clear is forced after timeouts.peer_ms and the fence says so;
 * expiry and a client that goes drop the mirrors; the fence table, a
 * client's share of it and a full ring towards the other worker refuse a
 * fence with no-buffers, a hold above the longest allowed is invalid; a
 * landing notice that found that ring full is counted in the client's CQ
 * overflow once there is room, ahead of a fence's completion. A
 * peer added at run time is opened on both workers; removed, each worker
 * zeroes its own rows of the slot as it closes it, and the slot is free
 * (its generation moved on) only once both have closed it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_ring.h>

#include "ctrl_priv.h"
#include "kvp_test.h"
#include "kvp_test_core.h"

#define MS 1000000ull

static struct kvp_node node;
static char tmpdir[64];
static uint32_t busy[2]; /* landings each worker's transport reports for any fence */
static bool forced[2];	 /* a fence op was called with force on that worker */

/* A forced fence always holds: what a transport does by tearing connections down. */
static uint32_t
stub_fence(void *tctx, const struct kvp_fence *f, bool force)
{
	struct kvp_worker *w = tctx;

	(void)f;
	if (force) {
		forced[w->idx] = true;
		busy[w->idx] = 0;
	}
	return busy[w->idx];
}

/* The library's stub, whose fence op reports what the test says (set up in setup()). */
static struct kvp_transport_ops stub_ops;

/* ---- clients over the real client socket (the test is the daemon too: it pumps) ---- */

struct client {
	struct kvp_test_conn conn;
	struct kvp_ring *sq, *cq;
	uint32_t id;
	uint64_t key;
	int region_fd;
	void *region;
};

static void
pump(void *arg)
{
	(void)arg;
	kvp_node_poll(&node, 10);
}

static void
client_open(struct client *c)
{
	struct kvp_ctrl_rep rep;
	int rc;

	memset(c, 0, sizeof(*c));
	rc = kvp_test_conn_open(&c->conn, node.cfg.client_socket, pump, NULL, &rep);
	REQUIRE(rc == 0, "HELLO: %d %s", rc, rep.errmsg);
	c->id = c->conn.id;
	c->sq = &c->conn.sq;
	c->cq = &c->conn.cq;
	REQUIRE(kvp_test_memfd("test-workers", 1 << 20, true, &c->region_fd, &c->region) == 0,
		"memfd");
	rc = kvp_test_region_register(&c->conn, c->region_fd, 1 << 20, KVP_REGION_HOST, &c->key,
				      &rep);
	REQUIRE(rc == 0, "REG: %d %s", rc, rep.errmsg);
}

static void
fence(struct client *c, uint64_t id, uint64_t value, uint64_t mask, uint32_t hold_ms)
{
	struct kvp_sqe_fence f = { .op = KVP_OP_FENCE, .hold_ms = hold_ms, .fence_id = id,
				   .value = value, .mask = mask };

	CHECK_EQ(kvp_ring_enqueue_bulk(c->sq, &f, 1), 1);
}

/* The next completion of @p c, or kind 0 if there is none. */
static struct kvp_cqe
next_cqe(struct client *c)
{
	struct kvp_cqe e;

	memset(&e, 0, sizeof(e));
	if (kvp_ring_dequeue_burst(c->cq, &e, 1) != 1)
		e.kind = 0;
	return e;
}

/* Completions the client's CQ could not take (what kvp_overflow() reads). */
static uint32_t
overflow(const struct client *c)
{
	return atomic_load_explicit(&c->cq->shm->overflow, memory_order_relaxed);
}

static struct kvp_worker *
W(unsigned i)
{
	return &node.workers[i];
}

/* One pass of both workers' loops, timers at @p now. */
static void
run(uint64_t now)
{
	for (unsigned i = 0; i < 2; i++) {
		kvp_worker_inbox(W(i));
		kvp_worker_poll_chans(W(i));
		W(i)->next_timer_ns = 0;
		kvp_worker_timers(W(i), now);
	}
	for (unsigned i = 0; i < 2; i++)
		kvp_worker_inbox(W(i));
}

static void
setup(void)
{
	static struct kvp_node_env env;
	struct kvp_config cfg;
	char err[256];

	if (kvp_test_eal_init() < 0)
		kvp_test_skip("no EAL here");
	stub_ops = kvp_test_stub_ops;
	stub_ops.fence = stub_fence;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvp-workers.XXXXXX");
	if (!mkdtemp(tmpdir))
		kvp_test_setup_failed("mkdtemp: %s", strerror(errno));
	kvp_config_defaults(&cfg);
	snprintf(cfg.node_id, sizeof(cfg.node_id), "unit0");
	snprintf(cfg.listen_host, sizeof(cfg.listen_host), "127.0.0.1");
	cfg.listen_port = 0;
	snprintf(cfg.client_socket, sizeof(cfg.client_socket), "%s/c.sock", tmpdir);
	snprintf(cfg.admin_socket, sizeof(cfg.admin_socket), "%s/a.sock", tmpdir);
	cfg.max_clients = 4;
	cfg.max_regions = 8;
	cfg.max_inflight = 16;
	cfg.max_segments = 8;
	cfg.max_fences = 2;
	cfg.sq_entries = 64;
	cfg.cq_entries = 1024;
	cfg.stage_pool = 256 << 10;
	cfg.stage_buf = 16 << 10;
	cfg.npeers = 1;
	snprintf(cfg.peers[0].node_id, sizeof(cfg.peers[0].node_id), "peer0");
	snprintf(cfg.peers[0].host, sizeof(cfg.peers[0].host), "127.0.0.1");
	cfg.peers[0].port = 1;
	kvp_node_env_init(&env);
	env.tps[0] = &stub_ops;
	env.ntps = 1;
	env.nworkers = 2;
	if (kvp_node_init(&node, &cfg, &env, err, sizeof(err)) < 0)
		kvp_test_setup_failed("kvp_node_init: %s", err);
}

int
main(void)
{
	struct client a, b;
	struct kvp_cqe e;
	uint64_t t = kvp_mono_ns();

	setup();
	client_open(&a);
	client_open(&b);
	run(t);
	/* Fewest clients first: a on worker 0, b on worker 1. */
	CHECK_EQ(node.clients[kvp_client_slot(a.id)].worker, 0);
	CHECK_EQ(node.clients[kvp_client_slot(b.id)].worker, 1);
	CHECK_EQ(node.client_worker[kvp_client_slot(b.id)], 1);
	CHECK_EQ(node.worker_clients[0], 1);
	CHECK_EQ(node.worker_clients[1], 1);
	CHECK_EQ(W(1)->nchans, 1);

	/* 1. Bytes for b land on worker 0: the notice reaches b through worker 1. */
	kvp_worker_landed(W(0), 0, b.id, 77, b.key, 4096, 3, t);
	CHECK_EQ(next_cqe(&b).kind, 0);
	CHECK_EQ(W(0)->stats.xlanded, 1);
	CHECK_EQ(W(0)->stats.xfers_landed, 1);
	kvp_worker_inbox(W(1));
	e = next_cqe(&b);
	CHECK_EQ(e.kind, KVP_CQE_LANDED);
	CHECK_EQ(e.user_id, 77);
	CHECK_EQ(e.bytes, 4096);
	CHECK_EQ(e.dst_key, b.key);
	CHECK_EQ(e.nseg, 3);
	CHECK_EQ(next_cqe(&a).kind, 0);
	/* ... and for a, on its own worker, directly. */
	kvp_worker_landed(W(0), 0, a.id, 78, a.key, 1, 1, t);
	CHECK_EQ(next_cqe(&a).kind, KVP_CQE_LANDED);
	CHECK_EQ(W(0)->stats.xlanded, 1);

	/* 2. b fences tag 0x100 while worker 0 still has a landing under way. */
	t = kvp_mono_ns();
	busy[0] = 1;
	fence(&b, 500, 0x100, ~0xffull, 0);
	kvp_worker_poll_chans(W(1));
	CHECK_EQ(W(1)->nfences_own, 1);
	CHECK_EQ(next_cqe(&b).kind, 0); /* worker 0 has not answered */
	CHECK(!kvp_worker_fenced(W(0), b.id, 0x1a5, 10, 1)); /* it has not heard yet */
	kvp_worker_inbox(W(0));
	CHECK_EQ(W(0)->nfences, 1);
	CHECK_EQ(W(0)->nfences_own, 0);
	CHECK(kvp_worker_fenced(W(0), b.id, 0x1a5, 10, 1)); /* its links refuse b's bytes now */
	CHECK(!kvp_worker_fenced(W(0), b.id, 0x2a5, 10, 1)); /* not this request's */
	CHECK(!kvp_worker_fenced(W(0), a.id, 0x1a5, 10, 1)); /* not this client's */
	/* A notice worker 0 sends before it is clear comes first. */
	kvp_worker_landed(W(0), 0, b.id, 0x200, b.key, 8, 1, t);
	run(t + MS);
	CHECK_EQ(next_cqe(&b).kind, KVP_CQE_LANDED);
	CHECK_EQ(next_cqe(&b).kind, 0); /* still pending on worker 0 */
	busy[0] = 0;
	run(t + 2 * MS);
	e = next_cqe(&b);
	CHECK_EQ(e.kind, KVP_CQE_FENCE);
	CHECK_EQ(e.user_id, 500);
	CHECK_EQ(e.status, KVP_OK);
	CHECK_EQ(e.bytes, 10); /* what the mirror refused */
	CHECK(!forced[0] && !forced[1]);
	CHECK_EQ(W(1)->fences_pending, 0);
	CHECK_EQ(W(0)->fences_pending, 0);

	/* 3. A mirror that cannot clear is forced after timeouts.peer_ms. */
	uint64_t peer_ns = (uint64_t)node.cfg.peer_timeout_ms * MS;
	uint64_t t3 = kvp_mono_ns();
	busy[0] = 5;
	fence(&b, 501, 0x300, ~0xffull, 0);
	run(t3);
	run(t3 + peer_ns / 2);
	CHECK_EQ(next_cqe(&b).kind, 0);
	CHECK(!forced[0]);
	run(t3 + peer_ns + MS);
	CHECK(forced[0]);
	CHECK(!forced[1]);
	e = next_cqe(&b);
	CHECK_EQ(e.kind, KVP_CQE_FENCE);
	CHECK_EQ(e.user_id, 501);
	CHECK_EQ(e.status, KVP_OK);
	CHECK_EQ(W(1)->stats.fences_forced, 1);
	CHECK_EQ(W(0)->stats.fences_forced, 0);

	/* 4. The table holds limits.max_fences (2) of b's: a third is refused. */
	fence(&b, 502, 0x400, ~0xffull, 0);
	run(t3 + peer_ns + 2 * MS);
	e = next_cqe(&b);
	CHECK_EQ(e.kind, KVP_CQE_FENCE);
	CHECK_EQ(e.status, KVP_ENOBUFS);
	CHECK_EQ(W(1)->stats.fences_refused, 1);
	/* 4b. A hold above timeouts.fence_hold_max_ms is invalid; limits.client_fences caps a's share. */
	node.cfg.client_fences = 1;
	busy[0] = 0;
	fence(&a, 510, 0x800, ~0xffull, node.cfg.fence_hold_max_ms + 1);
	fence(&a, 511, 0x800, ~0xffull, 0);
	fence(&a, 512, 0x900, ~0xffull, 0);
	run(t3 + peer_ns + 3 * MS);
	run(t3 + peer_ns + 4 * MS);
	e = next_cqe(&a);
	CHECK(e.kind == KVP_CQE_FENCE && e.user_id == 510 && e.status == KVP_EINVAL);
	e = next_cqe(&a);
	CHECK(e.kind == KVP_CQE_FENCE && e.user_id == 512 && e.status == KVP_ENOBUFS);
	e = next_cqe(&a);
	CHECK(e.kind == KVP_CQE_FENCE && e.user_id == 511 && e.status == KVP_OK);
	CHECK_EQ(W(0)->stats.fences_refused, 1);
	node.cfg.client_fences = 256;

	/* 5. Expiry (timeouts.fence_hold_ms): both fences go, mirrors too. */
	uint64_t later = t3 + (uint64_t)node.cfg.fence_hold_ms * MS + peer_ns + 10 * MS;
	run(later);
	run(later + MS);
	CHECK_EQ(W(1)->nfences, 0);
	CHECK_EQ(W(0)->nfences, 0);
	CHECK(!kvp_worker_fenced(W(0), b.id, 0x1a5, 1, 1));

	/* 6. A full ring towards worker 0 refuses a fence (its mirror could not be set). */
	unsigned room = kvp_worker_xroom(W(1), 0), lost0 = (unsigned)W(1)->stats.xmsg_lost;
	CHECK(room > 0);
	for (unsigned i = 0; i <= room; i++)
		kvp_worker_landed(W(1), 0, a.id, 1000 + i, a.key, 1, 1, later);
	CHECK_EQ(kvp_worker_xroom(W(1), 0), 0);
	CHECK_EQ(W(1)->stats.xmsg_lost, lost0 + 1);
	fence(&b, 503, 0x500, ~0xffull, 0);
	kvp_worker_poll_chans(W(1));
	e = next_cqe(&b);
	CHECK_EQ(e.kind, KVP_CQE_FENCE);
	CHECK_EQ(e.status, KVP_ENOBUFS);
	CHECK_EQ(W(0)->nfences, 0);
	unsigned got = 0;
	kvp_worker_inbox(W(0));
	while (next_cqe(&a).kind == KVP_CQE_LANDED)
		got++;
	CHECK_EQ(got, room);
	/* The notice that found the ring full reaches a's CQ as an overflow once there is room. */
	CHECK_EQ(overflow(&a), 0);
	CHECK(W(1)->xlost_to & 1);
	run(later + 2 * MS);
	CHECK_EQ(overflow(&a), 1);
	CHECK_EQ(W(1)->xlost_to, 0);

	/* 6b. Notices lost before a fence's mirror clears are counted before the fence completes. */
	for (unsigned i = 0; i < room + 2; i++)
		kvp_worker_landed(W(1), 0, a.id, 2000 + i, a.key, 1, 1, later);
	kvp_worker_inbox(W(0));
	for (got = 0; next_cqe(&a).kind == KVP_CQE_LANDED;)
		got++;
	CHECK_EQ(got, room);
	CHECK_EQ(overflow(&a), 1);
	uint64_t t6 = kvp_mono_ns();
	fence(&a, 600, 0x700, ~0xffull, 1);
	kvp_worker_poll_chans(W(0)); /* SET to worker 1 */
	kvp_worker_inbox(W(1));	     /* its mirror clears at once: LOST, then CLEAR */
	struct kvp_xmsg q[4];
	unsigned nq = rte_ring_dequeue_burst_elem(W(0)->xin[1], q, sizeof(q[0]), 4, NULL);

	CHECK_EQ(nq, 2);
	CHECK_EQ(q[0].type, KVP_XM_LOST);
	CHECK_EQ(q[0].bytes, 2);
	CHECK_EQ(q[1].type, KVP_XM_FENCE_CLEAR);
	CHECK_EQ(rte_ring_enqueue_burst_elem(W(0)->xin[1], q, sizeof(q[0]), nq, NULL), nq);
	kvp_worker_inbox(W(0));
	e = next_cqe(&a);
	CHECK_EQ(e.kind, KVP_CQE_FENCE);
	CHECK_EQ(e.user_id, 600);
	CHECK_EQ(e.status, KVP_OK);
	CHECK_EQ(overflow(&a), 3);
	run(t6 + 10 * MS); /* hold_ms 1: both go */
	run(t6 + 11 * MS);
	CHECK_EQ(W(0)->nfences, 0);
	CHECK_EQ(W(1)->nfences, 0);

	/* 7. b goes with a fence set: the mirror goes with it. */
	uint64_t t7 = kvp_mono_ns();
	fence(&b, 504, 0x600, ~0xffull, 0);
	run(t7);
	CHECK_EQ(W(0)->nfences, 1);
	CHECK_EQ(next_cqe(&b).kind, KVP_CQE_FENCE);
	kvp_test_conn_close(&b.conn);
	for (int i = 0; i < 20 && W(1)->nchans; i++) {
		kvp_node_poll(&node, 10);
		run(t7 + MS);
	}
	CHECK_EQ(W(1)->nchans, 0);
	CHECK_EQ(W(1)->nfences, 0);
	CHECK_EQ(W(0)->nfences, 0);
	for (int i = 0; i < 20 && node.worker_clients[1]; i++)
		kvp_node_poll(&node, 10);
	CHECK_EQ(node.worker_clients[1], 0);
	/* The next client goes where there are fewest: worker 1 again. */
	struct client c;
	client_open(&c);
	CHECK_EQ(node.clients[kvp_client_slot(c.id)].worker, 1);

	/* 8. A peer slot on both workers: opened on each, freed once each has closed it. */
	char why[192];
	int slot = peer_add(&node, KVP_PEER_ADMIN, "peer1", "127.0.0.1", 2, why, sizeof(why));
	CHECK_EQ(slot, 1);
	uint16_t handle = peer_handle(&node, 1);
	run(kvp_mono_ns());
	for (unsigned i = 0; i < 2; i++) {
		CHECK_EQ(W(i)->peers[1].state, KVP_WP_OPEN);
		CHECK_EQ(W(i)->peers[1].handle, handle);
		W(i)->stats.peer[1].tx_bytes = 100 + i; /* each worker's own share of its rows */
		kvp_hist_record(kvp_worker_hist(W(i), 1, KVP_HP_RX_RECV), 1000);
	}
	CHECK_EQ(peer_remove(&node, 1, "unit test"), 0);
	kvp_worker_inbox(W(0)); /* worker 0 closes; worker 1 has not looked yet */
	for (int i = 0; i < 3; i++)
		kvp_node_poll(&node, 1);
	CHECK(peer_live(&node, 1)); /* draining until worker 1 closes too */
	CHECK_EQ(W(0)->peers[1].state, KVP_WP_FREE);
	CHECK_EQ(W(0)->stats.peer[1].tx_bytes, 0);
	CHECK_EQ(kvp_worker_hist(W(0), 1, KVP_HP_RX_RECV)->sum_ns, 0);
	CHECK_EQ(W(1)->stats.peer[1].tx_bytes, 101);
	kvp_worker_inbox(W(1));
	for (int i = 0; i < 20 && peer_live(&node, 1); i++)
		kvp_node_poll(&node, 10);
	CHECK(!peer_live(&node, 1));
	CHECK_EQ(W(1)->peers[1].state, KVP_WP_FREE);
	CHECK_EQ(W(1)->stats.peer[1].tx_bytes, 0);
	CHECK_EQ(kvp_worker_hist(W(1), 1, KVP_HP_RX_RECV)->sum_ns, 0);
	CHECK(peer_handle(&node, 1) != handle); /* the old handle names nothing now */

	kvp_test_conn_close(&a.conn);
	kvp_test_conn_close(&c.conn);
	kvp_node_fini(&node);
	char p[sizeof(tmpdir) + 16];
	snprintf(p, sizeof(p), "%s/c.sock.lock", tmpdir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/a.sock.lock", tmpdir);
	unlink(p);
	rmdir(tmpdir);
	return kvp_test_result("test_workers");
}
