/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The worker's admission (lib/core/worker.c), through its public API
 * (kvp_worker.h) on the harness of worker_harness.h: admission when the
 * slot table is full and its timeout (no-buffers), the CQ room every
 * in-flight transfer keeps, the backlog of completions that found the CQ
 * full, the parking of a client whose CQ is full (room_wakeup), and fair
 * admission: clients with work waiting take the slots in turn, a light
 * client's transfer beside a heavy backlog takes the next slot that frees,
 * and each client's admitted/waited/refused counts.
 * Every case asserts exact statuses and counts, and that every slot and
 * region reference comes back.
 */
#include "worker_harness.h"

/* ---- the cases ---- */

/* A full slot table: the ring is the queue; its head waits at most admission_ms. */
static void
test_admission(void)
{
	struct client a;
	uint64_t now = kvp_mono_ns(), enobufs = w.stats.completions[KVP_ENOBUFS];
	uint64_t submitted = w.stats.xfers_submitted;

	client_open(&a, CLIENT_A, CQ_BIG);
	posts = 0;
	for (uint64_t u = 0; u < SLOTS + 1; u++)
		submit(&a, u, now, HOUR_NS);
	CHECK_EQ(poll_worker(), 2 * SLOTS);
	CHECK_EQ(posts, SLOTS);
	CHECK_EQ(w.nfree, 0);
	CHECK_EQ(a.ch.inflight, SLOTS);
	CHECK_EQ(w.stats.inflight_hwm, SLOTS);
	CHECK_EQ(w.stats.xfers_submitted - submitted, SLOTS);
	CHECK_EQ(sq_left(&a), 2); /* transfer SLOTS waits in the ring */
	CHECK_EQ(cq_count(&a), 0);
	CHECK_EQ(poll_worker(), 0); /* still within admission_ms: it keeps waiting */

	/* A slot frees: the head is admitted. */
	end_xfer(held_of(CLIENT_A, 3), KVP_OK);
	EXPECT_DONE(&a, 3, KVP_OK);
	CHECK_EQ(poll_worker(), 2);
	CHECK_EQ(posts, SLOTS + 1);
	CHECK(held_of(CLIENT_A, SLOTS) != NULL);

	/*
	 * Full again. A head queued longer than admission_ms is refused with
	 * no-buffers; the one behind it, younger, waits; one without a submit
	 * stamp has no age and waits however long.
	 */
	submit(&a, 100, now - 2 * ADMIT_MS * MS, HOUR_NS);
	submit(&a, 101, kvp_mono_ns(), HOUR_NS);
	CHECK_EQ(poll_worker(), 2);
	EXPECT_DONE(&a, 100, KVP_ENOBUFS);
	CHECK_EQ(cq_count(&a), 0);
	CHECK_EQ(sq_left(&a), 2);
	CHECK_EQ(w.stats.completions[KVP_ENOBUFS] - enobufs, 1);
	CHECK_EQ(posts, SLOTS + 1);
	end_xfer(held_of(CLIENT_A, 0), KVP_OK);
	EXPECT_DONE(&a, 0, KVP_OK);
	CHECK_EQ(poll_worker(), 2);
	CHECK(held_of(CLIENT_A, 101) != NULL);
	submit(&a, 102, 0, HOUR_NS);
	CHECK_EQ(poll_worker(), 0);
	CHECK_EQ(sq_left(&a), 2);
	end_xfer(held_of(CLIENT_A, 1), KVP_EREMOTE);
	EXPECT_DONE(&a, 1, KVP_EREMOTE);
	CHECK_EQ(poll_worker(), 2);
	CHECK(held_of(CLIENT_A, 102) != NULL);

	CHECK_EQ(w.stats.completions[KVP_ENOBUFS] - enobufs, 1);
	CHECK_EQ(posts, SLOTS + 3);
	end_all(KVP_OK);
	CHECK_EQ(cq_count(&a), SLOTS);
	client_close(&a);
	expect_reclaimed();
}

/*
 * Every transfer in flight keeps a CQ entry for its completion: a client
 * with a CQ of 4 has at most 4 in flight, and none admitted while its CQ
 * holds unread completions that leave no room. Landing notices are not
 * owed: they may take the room, and a completion that then finds the CQ
 * full waits in the backlog (its slot kept) until the client reads.
 */
static void
test_cq_room(void)
{
	struct client a;
	struct kvp_cqe e[CQ_SMALL];

	client_open(&a, CLIENT_A, CQ_SMALL);
	posts = 0;
	for (uint64_t u = 0; u < 6; u++)
		submit(&a, u, kvp_mono_ns(), HOUR_NS);
	CHECK_EQ(poll_worker(), 2 * CQ_SMALL);
	CHECK_EQ(posts, CQ_SMALL);
	CHECK_EQ(a.ch.inflight, CQ_SMALL);
	CHECK_EQ(w.nfree, SLOTS - CQ_SMALL);
	CHECK_EQ(sq_left(&a), 4);

	end_all(KVP_OK);
	CHECK_EQ(cq_count(&a), CQ_SMALL);
	CHECK_EQ(a.ch.inflight, 0);
	CHECK_EQ(poll_worker(), 0); /* no room at all */
	EXPECT_DONE(&a, 0, KVP_OK);
	CHECK_EQ(poll_worker(), 2); /* one entry free: exactly one admitted */
	CHECK_EQ(posts, CQ_SMALL + 1);
	CHECK_EQ(sq_left(&a), 2);

	/* The CQ holds 3 completions, 1 entry is kept for transfer 4: a landing takes it. */
	uint32_t overflow = atomic_load(&a.hdr->cq.overflow);
	kvp_worker_landed(&w, 0, CLIENT_A, 900, a.key, 64, 1, 0);
	CHECK_EQ(cq_count(&a), CQ_SMALL);
	kvp_worker_landed(&w, 0, CLIENT_A, 901, a.key, 64, 1, 0);
	CHECK_EQ(atomic_load(&a.hdr->cq.overflow) - overflow, 1); /* dropped, counted */
	end_xfer(held_of(CLIENT_A, 4), KVP_OK);
	CHECK_EQ(w.nbacklog, 1);
	CHECK_EQ(w.nfree, SLOTS - 1); /* its slot stays taken until delivered */
	CHECK(a.ch.backlog_head != NULL);
	timers(kvp_mono_ns());
	CHECK_EQ(w.nbacklog, 1); /* still no room */

	/*
	 * One entry read: transfer 5 is admitted (nothing is in flight), and
	 * its completion, though there is room, queues behind 4's: completions
	 * keep their order.
	 */
	EXPECT_DONE(&a, 3, KVP_OK);
	CHECK_EQ(poll_worker(), 2);
	end_xfer(held_of(CLIENT_A, 5), KVP_OK);
	CHECK_EQ(w.nbacklog, 2);
	CHECK_EQ(cq_count(&a), CQ_SMALL - 1);
	timers(kvp_mono_ns());
	CHECK_EQ(w.nbacklog, 1); /* 4 delivered, 5 waits for room again */
	CHECK_EQ(read_cq(&a, e, CQ_SMALL), CQ_SMALL);
	CHECK(e[2].kind == KVP_CQE_LANDED && e[2].user_id == 900);
	CHECK(e[3].kind == KVP_CQE_DONE && e[3].user_id == 4);
	timers(kvp_mono_ns());
	CHECK_EQ(w.nbacklog, 0);
	EXPECT_DONE(&a, 5, KVP_OK);
	CHECK_EQ(cq_count(&a), 0);
	client_close(&a);
	expect_reclaimed();
}

/*
 * Sleeping: an idle client arms its SQ doorbell; one whose CQ is full with
 * work waiting is parked instead: the worker may sleep however long its SQ,
 * and asks the client (room_wakeup) to ring when it has read.
 */
static void
test_park(void)
{
	struct client a;
	struct kvp_cqe e;
	uint64_t now = kvp_mono_ns();

	client_open(&a, CLIENT_A, CQ_SMALL);
	CHECK(kvp_worker_prepare_sleep(&w));
	CHECK_EQ(atomic_load(&a.hdr->sq.need_wakeup), 1);
	CHECK_EQ(atomic_load(&a.hdr->cq.room_wakeup), 0);
	kvp_worker_finish_sleep(&w);
	CHECK_EQ(atomic_load(&a.hdr->sq.need_wakeup), 0);

	/* Work waiting and room for it: no sleep. */
	submit(&a, 0, now, HOUR_NS);
	CHECK(!kvp_worker_prepare_sleep(&w));
	CHECK_EQ(atomic_load(&a.hdr->sq.need_wakeup), 0);
	for (uint64_t u = 1; u < CQ_SMALL; u++)
		submit(&a, u, now, HOUR_NS);
	CHECK_EQ(poll_worker(), 2 * CQ_SMALL);
	end_all(KVP_OK);
	CHECK_EQ(cq_count(&a), CQ_SMALL);

	/* The CQ is full and a transfer waits in the SQ: parked. */
	submit(&a, 10, now, HOUR_NS);
	CHECK_EQ(poll_worker(), 0);
	CHECK(kvp_worker_prepare_sleep(&w));
	CHECK_EQ(atomic_load(&a.hdr->cq.room_wakeup), 1);
	CHECK_EQ(atomic_load(&a.hdr->sq.need_wakeup), 0); /* its doorbell is not what wakes it */
	/* The client reads one: it sees that the worker waits for room, and rings. */
	CHECK_EQ(read_cq(&a, &e, 1), 1);
	CHECK(kvp_ring_room_wakeup_needed(&a.cq));
	CHECK_EQ(atomic_load(&a.hdr->cq.room_wakeup), 0);
	CHECK(!kvp_ring_room_wakeup_needed(&a.cq)); /* one wakeup per sleep */
	kvp_worker_finish_sleep(&w);
	CHECK(!kvp_worker_prepare_sleep(&w)); /* room for it now */
	CHECK_EQ(poll_worker(), 2);
	CHECK_EQ(nheld, 1);

	/* A backlogged completion parks it too (it needs one entry). */
	kvp_worker_landed(&w, 0, CLIENT_A, 900, a.key, 64, 1, 0);
	CHECK_EQ(cq_count(&a), CQ_SMALL);
	end_all(KVP_OK);
	CHECK_EQ(w.nbacklog, 1);
	CHECK(kvp_worker_prepare_sleep(&w));
	CHECK_EQ(atomic_load(&a.hdr->cq.room_wakeup), 1);
	kvp_worker_finish_sleep(&w);
	CHECK_EQ(atomic_load(&a.hdr->cq.room_wakeup), 0);

	/* A message from the main lcore is work too. */
	send_msg(KVP_MSG_CANCEL, NULL, CLIENT_B, 1);
	CHECK(!kvp_worker_prepare_sleep(&w));
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	client_close(&a);
	expect_reclaimed();
}

/* The client whose transfer the stub was handed last. */
static uint32_t
last_posted(void)
{
	REQUIRE(nheld > 0, "nothing in flight");
	return held[nheld - 1]->client;
}

/*
 * Three clients with deep backlogs: the slots go round them, one each in
 * turn, however the slots free; a client that runs dry drops out of the
 * round and the others share; nobody waits past its turn.
 */
static void
test_fair(void)
{
	struct client c[3];
	const uint32_t ids[3] = { CLIENT_A, CLIENT_B, CLIENT_C };
	unsigned got[3] = { 0 }, per = 20;
	uint64_t now = kvp_mono_ns();

	for (unsigned i = 0; i < 3; i++) {
		client_open(&c[i], ids[i], SQN / 2);
		for (uint64_t u = 0; u < per; u++)
			submit(&c[i], u, now, HOUR_NS);
	}
	/* The first 8 slots: 3, 3 and 2, in turn. */
	poll_worker();
	CHECK_EQ(nheld, SLOTS);
	for (unsigned k = 0; k < nheld; k++) {
		CHECK_EQ(held[k]->client, ids[k % 3]);
		got[k % 3]++;
	}
	/* One slot frees at a time: each goes to the next client in turn. */
	for (unsigned k = 0; k < 24; k++) {
		struct kvp_xfer *x = held[0];
		uint32_t from = x->client;
		uint64_t uid = x->user_id;

		end_xfer(x, KVP_OK);
		for (unsigned i = 0; i < 3; i++)
			if (ids[i] == from)
				EXPECT_DONE(&c[i], uid, KVP_OK);
		poll_worker();
		CHECK_EQ(last_posted(), ids[(SLOTS + k) % 3]);
		for (unsigned i = 0; i < 3; i++)
			got[i] += last_posted() == ids[i];
	}
	CHECK_EQ(got[0], 11);
	CHECK_EQ(got[1], 11);
	CHECK_EQ(got[2], 10);
	/* The waits were counted once per transfer; nothing refused. */
	for (unsigned i = 0; i < 3; i++) {
		CHECK_EQ(c[i].ch.stats.admitted, got[i]);
		CHECK(c[i].ch.stats.waited >= got[i] - 3);
		CHECK(c[i].ch.stats.waited <= per);
		CHECK_EQ(c[i].ch.stats.refused, 0);
	}
	end_all(KVP_OK);
	for (unsigned i = 0; i < 3; i++) {
		struct kvp_cqe e[SQN];

		read_cq(&c[i], e, SQN);
	}
	/* The rest drains, nobody starved; then every slot comes back. */
	for (unsigned round = 0; round < 3 * per && (sq_left(&c[0]) || sq_left(&c[1]) ||
						    sq_left(&c[2]) || nheld);
	     round++) {
		poll_worker();
		end_all(KVP_OK);
		for (unsigned i = 0; i < 3; i++) {
			struct kvp_cqe e[SQN];

			read_cq(&c[i], e, SQN);
		}
	}
	for (unsigned i = 0; i < 3; i++) {
		CHECK_EQ(sq_left(&c[i]), 0);
		CHECK_EQ(c[i].ch.stats.admitted, per);
		client_close(&c[i]);
	}
	expect_reclaimed();
}

/*
 * A heavy client (every slot, a backlog behind) and a light one that sends
 * one transfer: the light one takes the next slot that frees, whatever the
 * heavy one has queued, and never waits long enough for no-buffers.
 */
static void
test_light_beside_heavy(void)
{
	struct client h, l;
	uint64_t now = kvp_mono_ns();

	client_open(&h, CLIENT_A, SQN / 2);
	client_open(&l, CLIENT_B, SQN / 2);
	for (uint64_t u = 0; u < 30; u++)
		submit(&h, u, now, HOUR_NS);
	poll_worker();
	CHECK_EQ(nheld, SLOTS);
	for (uint64_t u = 0; u < 5; u++) {
		submit(&l, 1000 + u, kvp_mono_ns(), HOUR_NS);
		poll_worker();
		CHECK(held_of(CLIENT_B, 1000 + u) == NULL); /* no slot yet */
		end_xfer(held_of(CLIENT_A, h.ch.stats.admitted - SLOTS), KVP_OK);
		poll_worker();
		/* The freed slot went to the light client, not to the backlog. */
		struct kvp_xfer *x = held_of(CLIENT_B, 1000 + u);
		CHECK(x != NULL);
		end_xfer(x, KVP_OK);
		EXPECT_DONE(&l, 1000 + u, KVP_OK);
		poll_worker(); /* the heavy client refills the slot */
		CHECK_EQ(nheld, SLOTS);
	}
	CHECK_EQ(l.ch.stats.admitted, 5);
	CHECK_EQ(l.ch.stats.waited, 5);
	CHECK_EQ(l.ch.stats.refused, 0);
	CHECK_EQ(h.ch.stats.refused, 0);
	while (sq_left(&h) || nheld) {
		struct kvp_cqe e[SQN];

		end_all(KVP_OK);
		read_cq(&h, e, SQN);
		poll_worker();
	}
	CHECK_EQ(h.ch.stats.admitted, 30);
	client_close(&h);
	client_close(&l);
	expect_reclaimed();
}

int
main(void)
{
	setup();
	test_admission();
	test_cq_room();
	test_park();
	/* Turn order, not the timeout (test_admission has that): a loaded or
	 * sanitized run must not reach admission_ms while the turns are walked. */
	cfg.admission_timeout_ms = 3600000;
	test_fair();
	test_light_beside_heavy();
	cfg.admission_timeout_ms = ADMIT_MS;
	return teardown("test_worker_admit");
}
