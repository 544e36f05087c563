/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * How the worker (lib/core/worker.c) ends transfers the transport still
 * holds or has not been handed, through its public API (kvp_worker.h) on
 * the harness of worker_harness.h: deadlines (cancelled with timeout in
 * flight, or expired while queued in the ring; defaults and saturation),
 * cancel by user id from the client and from the admin socket, draining
 * (shutdown) and QUIT; and the poll loop's spin after the last DONE.
 * Every case asserts exact statuses and counts, and that every slot and
 * region reference comes back.
 */
#include "worker_harness.h"

/* The poll loop spins after a DONE only while nothing else is in flight, and briefly. */
static void
test_spin_after_done(void)
{
	struct client a;
	uint64_t win = 2000;

	client_open(&a, CLIENT_A, CQ_BIG);
	submit(&a, 1, kvp_mono_ns(), HOUR_NS);
	submit(&a, 2, kvp_mono_ns(), HOUR_NS);
	CHECK_EQ(poll_worker(), 4);
	end_xfer(held_of(CLIENT_A, 1), KVP_OK);
	uint64_t now = kvp_mono_ns();
	CHECK(!kvp_worker_spin_after_done(&w, now, win)); /* 2 still in flight */
	end_xfer(held_of(CLIENT_A, 2), KVP_OK);
	/* From the DONE's own stamp: a clock read here could be preempted past the window. */
	now = w.done_ns;
	CHECK(now != 0);
	CHECK(kvp_worker_spin_after_done(&w, now, win));
	CHECK(kvp_worker_spin_after_done(&w, now + win - 1, win));
	CHECK(!kvp_worker_spin_after_done(&w, now + win, win));
	EXPECT_DONE(&a, 1, KVP_OK);
	EXPECT_DONE(&a, 2, KVP_OK);
	/* A transfer picked up since: in flight again, no spin. */
	submit(&a, 3, kvp_mono_ns(), HOUR_NS);
	CHECK_EQ(poll_worker(), 2);
	CHECK(!kvp_worker_spin_after_done(&w, kvp_mono_ns(), win));
	end_all(KVP_OK);
	EXPECT_DONE(&a, 3, KVP_OK);
	client_close(&a);
	expect_reclaimed();
}

/* Deadlines run from the client's submit; a transfer past it ends "timeout". */
static void
test_deadlines(void)
{
	struct client a;
	uint64_t misses = w.stats.deadline_misses, timeouts = w.stats.completions[KVP_ETIMEDOUT];
	uint64_t now = kvp_mono_ns();
	struct kvp_xfer *x;

	client_open(&a, CLIENT_A, CQ_BIG);
	posts = cancels = 0;

	/* Expired while queued in the ring: failed at pickup, never handed to a transport. */
	submit(&a, 1, now - 10 * MS, 1 * MS);
	CHECK_EQ(poll_worker(), 2);
	CHECK_EQ(posts, 0);
	EXPECT_DONE(&a, 1, KVP_ETIMEDOUT);
	CHECK_EQ(w.stats.deadline_misses - misses, 1);

	/* In flight: cancelled by the timer scan once its deadline passes, not before. */
	now = kvp_mono_ns();
	submit(&a, 2, now, 2 * MS);
	CHECK_EQ(poll_worker(), 2);
	x = held_of(CLIENT_A, 2);
	REQUIRE(x != NULL, "transfer 2 not posted");
	CHECK_EQ(x->deadline_ns, now + 2 * MS);
	CHECK_EQ(x->ts[KVP_TS_SUBMIT], now);
	timers(now + 1 * MS);
	CHECK_EQ(cancels, 0);
	/* Bounded wait on the clock, so that the deadline has passed for account() too. */
	while (kvp_mono_ns() <= now + 2 * MS)
		;
	timers(kvp_mono_ns());
	CHECK_EQ(cancels, 1);
	EXPECT_DONE(&a, 2, KVP_ETIMEDOUT);
	CHECK_EQ(w.stats.deadline_misses - misses, 2);
	CHECK_EQ(w.stats.completions[KVP_ETIMEDOUT] - timeouts, 2);

	/* timeout_ns 0: the daemon's default; no (or a future) submit stamp: from the pickup. */
	now = kvp_mono_ns();
	submit(&a, 3, now, 0);
	submit(&a, 4, 0, 5 * MS);
	submit(&a, 5, now + HOUR_NS, 5 * MS);
	submit(&a, 6, now, UINT64_MAX);
	CHECK_EQ(poll_worker(), 8);
	CHECK_EQ(posts, 5);
	x = held_of(CLIENT_A, 3);
	CHECK(x != NULL && x->deadline_ns == now + DEFAULT_MS * MS);
	for (uint64_t u = 4; u <= 5; u++) {
		x = held_of(CLIENT_A, u);
		CHECK(x != NULL && x->ts[KVP_TS_SUBMIT] == 0 && x->ts[KVP_TS_PICKUP] >= now &&
		      x->deadline_ns == x->ts[KVP_TS_PICKUP] + 5 * MS);
	}
	/* UINT64_MAX saturates: no deadline, rather than one wrapped into the past. */
	x = held_of(CLIENT_A, 6);
	CHECK(x != NULL && x->deadline_ns == UINT64_MAX);
	timers(UINT64_MAX - 1);
	CHECK_EQ(cancels, 4);
	CHECK(held_of(CLIENT_A, 6) != NULL);
	/* The scan goes by slot, not by submission: any order. */
	unsigned seen = 0;
	for (int i = 0; i < 3; i++) {
		struct kvp_cqe e;

		CHECK_EQ(read_cq(&a, &e, 1), 1);
		CHECK(e.kind == KVP_CQE_DONE && e.status == KVP_ETIMEDOUT && e.user_id >= 3 &&
		      e.user_id <= 5);
		seen |= 1u << (e.user_id & 7);
	}
	CHECK_EQ(seen, 0x38); /* 3, 4 and 5, once each */
	end_all(KVP_OK);
	EXPECT_DONE(&a, 6, KVP_OK);
	CHECK_EQ(w.stats.completions[KVP_ETIMEDOUT] - timeouts, 5);
	client_close(&a);
	expect_reclaimed();
}

/* Cancel names a transfer by user id, of one client only; from the SQ or the admin socket. */
static void
test_cancel(void)
{
	struct client a, b;
	uint64_t admin0 = w.stats.admin_cancels, canceled = w.stats.completions[KVP_ECANCELED];
	uint64_t now = kvp_mono_ns();

	client_open(&a, CLIENT_A, CQ_BIG);
	client_open(&b, CLIENT_B, CQ_BIG);
	cancels = 0;
	submit(&a, 7, now, HOUR_NS);
	submit(&a, 8, now, HOUR_NS);
	submit(&b, 7, now, HOUR_NS);
	CHECK_EQ(poll_worker(), 6);
	CHECK_EQ(nheld, 3);

	/* A client cancels its own transfers only: B has no transfer 8. */
	submit_cancel(&b, 8);
	CHECK_EQ(poll_worker(), 1);
	CHECK_EQ(cancels, 0);
	CHECK(held_of(CLIENT_A, 8) != NULL);

	/* The client's own cancel entry: its transfer 7, not the other client's. */
	submit_cancel(&a, 7);
	submit_cancel(&a, 99); /* nothing of that id: nothing happens */
	CHECK_EQ(poll_worker(), 2);
	CHECK_EQ(sq_left(&a), 0);
	CHECK_EQ(cancels, 1);
	EXPECT_DONE(&a, 7, KVP_ECANCELED);
	CHECK_EQ(cq_count(&a), 0);
	CHECK(held_of(CLIENT_B, 7) != NULL && held_of(CLIENT_A, 8) != NULL);
	submit_cancel(&a, 7); /* already ended */
	CHECK_EQ(poll_worker(), 1);
	CHECK_EQ(cancels, 1);

	/* The admin's cancel: by client id, which must be the live one (generation too). */
	send_msg(KVP_MSG_CANCEL, NULL, CLIENT_B, 7);
	send_msg(KVP_MSG_CANCEL, NULL, (2u << 16) | 1u, 8); /* slot 1, an older generation */
	send_msg(KVP_MSG_CANCEL, NULL, CLIENT_A, 12345);
	CHECK_EQ(kvp_worker_inbox(&w), 3);
	CHECK_EQ(cancels, 2);
	EXPECT_DONE(&b, 7, KVP_ECANCELED);
	CHECK_EQ(cq_count(&a), 0);
	CHECK(held_of(CLIENT_A, 8) != NULL);
	CHECK_EQ(w.stats.admin_cancels - admin0, 2); /* counted for a live client only */
	send_msg(KVP_MSG_CANCEL, NULL, CLIENT_A, 8);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	EXPECT_DONE(&a, 8, KVP_ECANCELED);
	CHECK_EQ(w.stats.completions[KVP_ECANCELED] - canceled, 3);
	client_close(&b);
	client_close(&a);
	expect_reclaimed();
}

/* Draining: what is in flight finishes; new submissions end "shutdown" at once. */
static void
test_drain(void)
{
	struct client a;
	uint64_t refused = w.stats.drain_refused, shut = w.stats.completions[KVP_ESHUTDOWN];
	uint64_t now = kvp_mono_ns();

	client_open(&a, CLIENT_A, CQ_BIG);
	posts = 0;
	submit(&a, 1, now, HOUR_NS);
	submit(&a, 2, now, HOUR_NS);
	CHECK_EQ(poll_worker(), 4);
	w.draining = true;
	for (uint64_t u = 10; u < 13; u++)
		submit(&a, u, now, HOUR_NS);
	CHECK_EQ(poll_worker(), 6);
	CHECK_EQ(posts, 2);
	for (uint64_t u = 10; u < 13; u++)
		EXPECT_DONE(&a, u, KVP_ESHUTDOWN);
	CHECK_EQ(w.stats.drain_refused - refused, 3);
	CHECK_EQ(w.stats.completions[KVP_ESHUTDOWN] - shut, 3);
	CHECK_EQ(nheld, 2);
	end_xfer(held_of(CLIENT_A, 2), KVP_OK);
	end_xfer(held_of(CLIENT_A, 1), KVP_OK);
	EXPECT_DONE(&a, 2, KVP_OK);
	EXPECT_DONE(&a, 1, KVP_OK);
	w.draining = false;
	submit(&a, 20, now, HOUR_NS);
	CHECK_EQ(poll_worker(), 2);
	CHECK_EQ(posts, 3);
	end_all(KVP_OK);
	EXPECT_DONE(&a, 20, KVP_OK);

	/* Shutting down: the main lcore's QUIT stops the worker's loop. */
	CHECK(!w.quit);
	send_msg(KVP_MSG_QUIT, NULL, 0, 0);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	CHECK(w.quit);
	w.quit = false;
	client_close(&a);
	expect_reclaimed();
}

int
main(void)
{
	setup();
	test_spin_after_done();
	test_deadlines();
	test_cancel();
	test_drain();
	return teardown("test_worker_ends");
}
