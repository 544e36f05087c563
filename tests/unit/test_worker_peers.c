/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The worker's peer slots (lib/core/wpeer.c), through its public API
 * (kvp_worker.h) on the harness of worker_harness.h: a new peer's transfers
 * wait for its first link up to the main lcore's bound, a closing peer
 * refuses new transfers at once and closes (rows zeroed, PEER_CLOSED) once
 * those in flight end, and an old handle of a reused slot names nothing.
 * Every case asserts exact statuses and counts, and that every slot and
 * region reference comes back.
 */
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rte_mempool.h>
#include <rte_ring.h>

#include "worker_harness.h"

static void
peer_msg(int type, uint32_t slot, bool outgoing)
{
	struct kvp_msg *m;

	REQUIRE(rte_mempool_get(pool, (void **)&m) == 0, "message pool empty");
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->peer = (uint16_t)slot;
	m->outgoing = outgoing;
	m->fd = -1;
	if (type == KVP_MSG_CONN_ADD)
		REQUIRE((m->fd = eventfd(0, EFD_CLOEXEC)) >= 0, "eventfd");
	REQUIRE(rte_ring_enqueue(w.inbox, m) == 0, "inbox full");
}

static void
submit_to(struct client *c, uint16_t peer, uint64_t user_id, uint64_t timeout_ns)
{
	struct kvp_test_xfer x = { .peer = peer,
				   .user_id = user_id,
				   .submit_ns = kvp_mono_ns(),
				   .timeout_ns = timeout_ns,
				   .src_key = c->key,
				   .dst_key = DST_KEY,
				   .len = SEG_LEN };

	REQUIRE(kvp_test_submit(&c->sq, &x) == 2, "client SQ full");
}

/* The next completion: DONE of @p user_id with @p status and peer reason @p why, naming @p peer. */
static void
expect_peer_done(struct client *c, uint64_t user_id, int status, int why, uint16_t peer)
{
	struct kvp_cqe e;

	if (read_cq(c, &e, 1) != 1) {
		kvp_test_fail(__FILE__, __LINE__, "no completion for user_id %llu",
			      (unsigned long long)user_id);
		return;
	}
	CHECK_EQ(e.user_id, user_id);
	CHECK_EQ(e.status, status);
	CHECK_EQ(e.detail, why);
	CHECK_EQ(e.peer, peer);
}

/*
 * Peer slots: waiting for a first link, its bound, a close that drains,
 * zeroed rows, a stale handle, a reused slot.
 */
static void
test_peer_slots(void)
{
	struct client a;
	uint64_t now = kvp_mono_ns();
	uint16_t h1 = kvp_peer_handle(1, 0), h1b = kvp_peer_handle(1, 1), h2 = kvp_peer_handle(2, 0);

	client_open(&a, CLIENT_A, CQ_BIG);
	posts = 0;
	/* Never opened: no-peer, whatever the slot. */
	submit_to(&a, h1, 1, HOUR_NS);
	submit_to(&a, 999, 2, HOUR_NS);
	poll_worker();
	expect_peer_done(&a, 1, KVP_ENOPEER, KVP_PEER_WHY_UNKNOWN, h1);
	expect_peer_done(&a, 2, KVP_ENOPEER, KVP_PEER_WHY_UNKNOWN, 999);

	/* A new peer without a link: its transfer waits, no transport has it. */
	peer_open(1, 0, KVP_PEER_WHY_CONNECT, now + HOUR_NS);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	submit_to(&a, h1, 3, HOUR_NS);
	poll_worker();
	CHECK_EQ(cq_count(&a), 0);
	CHECK_EQ(posts, 0);
	CHECK_EQ(w.nwaiting, 1);
	/* Its first link: the waiting transfer goes to the transport. */
	peer_msg(KVP_MSG_CONN_ADD, 1, true);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	CHECK_EQ(w.nwaiting, 0);
	CHECK_EQ(posts, 1);
	end_xfer(held_of(CLIENT_A, 3), KVP_OK);
	expect_peer_done(&a, 3, KVP_OK, 0, h1);
	CHECK_EQ(w.stats.peer[1].tx_xfers, 1);

	/* Closing with one in flight: new ones are refused at once; it closes once that one ends. */
	submit_to(&a, h1, 4, HOUR_NS);
	poll_worker();
	CHECK_EQ(posts, 2);
	peer_msg(KVP_MSG_PEER_CLOSE, 1, false);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	submit_to(&a, h1, 5, HOUR_NS);
	poll_worker();
	expect_peer_done(&a, 5, KVP_ENOPEER, KVP_PEER_WHY_REMOVED, h1);
	timers(kvp_mono_ns());
	CHECK_EQ(drain_outbox(KVP_MSG_PEER_CLOSED), 0);
	end_xfer(held_of(CLIENT_A, 4), KVP_OK);
	expect_peer_done(&a, 4, KVP_OK, 0, h1);
	timers(kvp_mono_ns());
	/* Closed: its connections were closed on the transports, its rows zeroed, the main lcore told. */
	CHECK_EQ(drain_outbox(KVP_MSG_PEER_CLOSED), 1);
	CHECK_EQ(w.peers[1].state, KVP_WP_FREE);
	CHECK_EQ(w.stats.peer[1].tx_xfers, 0);
	CHECK_EQ(kvp_hist_count(kvp_worker_hist(&w, 1, KVP_HP_TOTAL)), 0);

	/* Reused with the next generation: the old handle names nothing. */
	peer_open(1, 1, KVP_PEER_WHY_CONNECT, now + HOUR_NS);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	submit_to(&a, h1, 6, HOUR_NS);
	poll_worker();
	expect_peer_done(&a, 6, KVP_ENOPEER, KVP_PEER_WHY_UNKNOWN, h1);

	/* The wait is bounded: past the main lcore's bound the transfer fails, with the reason. */
	peer_open(2, 0, KVP_PEER_WHY_CONNECT, kvp_mono_ns() + 50 * MS);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	submit_to(&a, h2, 7, HOUR_NS);
	submit_to(&a, h1b, 8, HOUR_NS);
	submit_to(&a, h1b, 9, HOUR_NS);
	poll_worker();
	CHECK_EQ(w.nwaiting, 3);
	submit_cancel(&a, 9); /* cancelled while it waits */
	poll_worker();
	expect_peer_done(&a, 9, KVP_ECANCELED, 0, h1b);
	timers(kvp_mono_ns() + 100 * MS);
	expect_peer_done(&a, 7, KVP_EPEER, KVP_PEER_WHY_CONNECT, h2);
	CHECK_EQ(w.nwaiting, 1);
	/* Past its bound and no link: a transfer fails at once (the reason the main lcore gave). */
	uint16_t h3 = kvp_peer_handle(3, 0);

	peer_open(3, 0, KVP_PEER_WHY_AUTH, 1);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	submit_to(&a, h3, 10, HOUR_NS);
	poll_worker();
	expect_peer_done(&a, 10, KVP_EPEER, KVP_PEER_WHY_AUTH, h3);
	/* Closing fails the waiting ones with no-peer. */
	peer_msg(KVP_MSG_PEER_CLOSE, 1, false);
	peer_msg(KVP_MSG_PEER_CLOSE, 2, false);
	peer_msg(KVP_MSG_PEER_CLOSE, 3, false);
	CHECK_EQ(kvp_worker_inbox(&w), 3);
	expect_peer_done(&a, 8, KVP_ENOPEER, KVP_PEER_WHY_REMOVED, h1b);
	CHECK_EQ(drain_outbox(KVP_MSG_PEER_CLOSED), 3);
	CHECK_EQ(w.nwaiting, 0);
	CHECK_EQ(cq_count(&a), 0);
	CHECK_EQ(posts, 2);
	client_close(&a);
	expect_reclaimed();
}

int
main(void)
{
	setup();
	test_peer_slots();
	return teardown("test_worker_peers");
}
