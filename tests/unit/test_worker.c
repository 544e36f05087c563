/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The worker's admission, deadline and cancel logic (lib/core/worker.c),
 * through its public API (kvp_worker.h): one worker built by
 * kvp_worker_init() (no node, no sockets), a stub transport that holds
 * every transfer it is handed until the test ends it, and real channels in
 * this process's memory, driven as the worker lcore drives them (inbox,
 * poll_chans, timers, prepare_sleep). The test plays the client on the
 * other side of each channel (SQ producer, CQ consumer, as the ABI has it).
 *
 * Covered: admission when the slot table is full and its timeout
 * (no-buffers), the CQ room every in-flight transfer keeps, the backlog of
 * completions that found the CQ full, deadlines (cancelled with timeout in
 * flight, or expired while queued in the ring; defaults and saturation),
 * cancel by user id from the client and from the admin socket, draining
 * (shutdown), the parking of a client whose CQ is full (room_wakeup), and
 * fair admission: clients with work waiting take the slots in turn, a
 * light client's transfer beside a heavy backlog takes the next slot that
 * frees, and each client's admitted/waited/refused counts; and the peer
 * slots (lib/core/wpeer.c): a new peer's transfers wait for its first link
 * up to the main lcore's bound, a closing peer refuses new transfers at
 * once and closes (rows zeroed, PEER_CLOSED) once those in flight end, and
 * an old handle of a reused slot names nothing.
 * Every case asserts exact statuses and counts, and that every slot and
 * region reference comes back.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rte_mempool.h>
#include <rte_ring.h>

#include "kvp_test.h"
#include "kvp_test_core.h"

#define SLOTS      8u /* limits.max_inflight */
#define SQN        64u
#define CQ_BIG     16u /* more than SLOTS: the slot table limits admission */
#define CQ_SMALL   4u  /* fewer than SLOTS: CQ room limits admission */
#define REG_LEN    (1u << 20)
#define SEG_LEN    4096u
#define DST_KEY    0x1234000000000001ull
#define ADMIT_MS   50u   /* timeouts.admission_ms */
#define DEFAULT_MS 1000u /* timeouts.default_ms */
#define MS         1000000ull
#define HOUR_NS    (3600ull * 1000 * MS)
#define CLIENT_A   ((1u << 16) | 1u) /* slot 1, generation 1 */
#define CLIENT_B   ((1u << 16) | 2u) /* slot 2, generation 1 */
#define CLIENT_C   ((1u << 16) | 3u) /* slot 3, generation 1 */

static struct kvp_config cfg;
static struct kvp_region_table regions;
static struct rte_mempool *pool;
static struct kvp_worker w;
static int region_fd = -1;

/* ---- the transport: holds what it is handed until the test ends it ---- */

static struct kvp_xfer *held[SLOTS];
static unsigned nheld, posts, cancels;

static int
stub_post(void *tctx, struct kvp_xfer *x)
{
	(void)tctx;
	posts++;
	REQUIRE(nheld < SLOTS, "more transfers in flight than slots");
	held[nheld++] = x;
	return 0;
}

static void
unhold(struct kvp_xfer *x)
{
	for (unsigned i = 0; i < nheld; i++)
		if (held[i] == x) {
			held[i] = held[--nheld];
			return;
		}
	REQUIRE(false, "the transport was asked about a transfer it does not hold");
}

static void
stub_cancel(void *tctx, struct kvp_xfer *x, int status)
{
	cancels++;
	unhold(x);
	kvp_worker_xfer_end(tctx, x, status);
}

/* The library's stub, holding what it is handed (set up in setup()). */
static struct kvp_transport_ops stub_ops;

/* The held transfer of @p user_id (of client @p id), or NULL. */
static struct kvp_xfer *
held_of(uint32_t id, uint64_t user_id)
{
	for (unsigned i = 0; i < nheld; i++)
		if (held[i]->client == id && held[i]->user_id == user_id)
			return held[i];
	return NULL;
}

/* The transport finishes a transfer it holds. */
static void
end_xfer(struct kvp_xfer *x, int status)
{
	REQUIRE(x != NULL, "no such transfer in flight");
	unhold(x);
	kvp_worker_xfer_end(&w, x, status);
}

static void
end_all(int status)
{
	while (nheld)
		end_xfer(held[0], status);
}

/* ---- messages from and to the main lcore ---- */

static void
send_msg(int type, struct kvp_chan *ch, uint32_t client, uint64_t user_id)
{
	struct kvp_msg *m;

	REQUIRE(rte_mempool_get(pool, (void **)&m) == 0, "message pool empty");
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->chan = ch;
	m->fd = -1;
	m->client = client;
	m->user_id = user_id;
	REQUIRE(rte_ring_enqueue(w.inbox, m) == 0, "inbox full");
}

/* Messages of @p type the worker posted to the main lcore (all are taken out). */
static unsigned
drain_outbox(int type)
{
	void *msgs[32];
	unsigned n, hits = 0;

	while ((n = rte_ring_dequeue_burst(w.outbox, msgs, 32, NULL)) > 0)
		for (unsigned i = 0; i < n; i++) {
			hits += ((struct kvp_msg *)msgs[i])->type == type;
			rte_mempool_put(pool, msgs[i]);
		}
	return hits;
}

/* ---- a client: its channel in memory, its region, its side of the rings ---- */

struct client {
	struct kvp_chan ch;       /* the worker's view */
	struct kvp_chan_hdr *hdr; /* the shared header */
	struct kvp_ring sq, cq;   /* the client's views: SQ producer, CQ consumer */
	uint64_t key;             /* its region */
};

static void
client_open(struct client *c, uint32_t id, uint32_t cqn)
{
	size_t len = kvp_chan_size(SQN, cqn);
	void *mem = aligned_alloc(4096, len);

	memset(c, 0, sizeof(*c));
	REQUIRE(mem != NULL, "out of memory");
	memset(mem, 0, len);
	REQUIRE(kvp_chan_init(mem, len, SQN, cqn, id) == 0, "kvp_chan_init");
	c->hdr = mem;
	c->ch.id = id;
	c->ch.pid = 1;
	c->ch.mem = mem;
	c->ch.len = len;
	c->ch.notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	REQUIRE(c->ch.notify_fd >= 0, "eventfd");
	REQUIRE(kvp_chan_attach(mem, len, true, &c->ch.sq, &c->ch.cq) == 0, "attach (worker)");
	REQUIRE(kvp_chan_attach(mem, len, false, &c->sq, &c->cq) == 0, "attach (client)");
	REQUIRE(kvp_region_add(&regions, id, region_fd, 0, REG_LEN, KVP_REGION_HOST, &c->key) == 0,
		"region");
	send_msg(KVP_MSG_CHAN_ADD, &c->ch, 0, 0);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
}

/* The client goes; everything it had must come back. */
static void
client_close(struct client *c)
{
	send_msg(KVP_MSG_CHAN_DEL, &c->ch, 0, 0);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	CHECK_EQ(drain_outbox(KVP_MSG_CHAN_GONE), 1);
	kvp_region_remove_owner(&regions, c->ch.id);
	kvp_region_reap(&regions);
	close(c->ch.notify_fd);
	free(c->ch.mem);
}

static void
submit(struct client *c, uint64_t user_id, uint64_t submit_ns, uint64_t timeout_ns)
{
	struct kvp_test_xfer x = { .user_id = user_id,
				   .submit_ns = submit_ns,
				   .timeout_ns = timeout_ns,
				   .src_key = c->key,
				   .dst_key = DST_KEY,
				   .len = SEG_LEN };

	REQUIRE(kvp_test_submit(&c->sq, &x) == 2, "client SQ full");
}

static void
submit_cancel(struct client *c, uint64_t user_id)
{
	struct kvp_sqe_xfer e = { .op = KVP_OP_CANCEL, .user_id = user_id };

	REQUIRE(kvp_ring_enqueue_bulk(&c->sq, &e, 1) == 1, "client SQ full");
}

/* SQ entries the worker has not consumed yet. */
static uint32_t
sq_left(const struct client *c)
{
	return atomic_load(&c->hdr->sq.prod) - atomic_load(&c->hdr->sq.cons);
}

/* Read up to @p n completions (a burst returns what the cached index shows: loop). */
static uint32_t
read_cq(struct client *c, struct kvp_cqe *e, uint32_t n)
{
	uint32_t got = 0;
	int k;

	while (got < n && (k = kvp_ring_dequeue_burst(&c->cq, e + got, n - got)) > 0)
		got += (uint32_t)k;
	return got;
}

/* Read the next completion: it must be the DONE of @p user_id with @p status. */
#define EXPECT_DONE(c, uid, st) expect_done(c, uid, st, __LINE__)

static void
expect_done(struct client *c, uint64_t user_id, int status, int line)
{
	struct kvp_cqe e;

	if (read_cq(c, &e, 1) != 1) {
		kvp_test_fail(__FILE__, line, "no completion for user_id %llu",
			      (unsigned long long)user_id);
		return;
	}
	if (e.kind != KVP_CQE_DONE || e.user_id != user_id || e.status != status)
		kvp_test_fail(__FILE__, line,
			      "completion kind %u user_id %llu status %s, want DONE %llu %s",
			      e.kind, (unsigned long long)e.user_id, kvp_status_str(e.status),
			      (unsigned long long)user_id, kvp_status_str(status));
	CHECK_EQ(e.bytes, status == KVP_OK ? SEG_LEN : 0);
	CHECK_EQ(e.nseg, 1);
}

/* Completions waiting in the CQ. */
static uint32_t
cq_count(const struct client *c)
{
	return atomic_load(&c->hdr->cq.prod) - atomic_load(&c->hdr->cq.cons);
}

static int
poll_worker(void)
{
	return kvp_worker_poll_chans(&w);
}

/* One deadline scan at @p now (the 1 ms period is not what is under test). */
static void
timers(uint64_t now)
{
	w.next_timer_ns = 0;
	kvp_worker_timers(&w, now);
}

/* After each case: nothing in flight, no backlog, every region reference back. */
static void
expect_reclaimed(void)
{
	CHECK_EQ(nheld, 0);
	CHECK_EQ(w.nfree, SLOTS);
	CHECK_EQ(w.nbacklog, 0);
	for (uint32_t i = 0; i < regions.size; i++)
		CHECK_EQ(atomic_load(&regions.slots[i].refs), 0);
}

/* PEER_OPEN of @p slot, generation @p gen, as the main lcore sends it. */
static void
peer_open(uint32_t slot, uint32_t gen, uint8_t why, uint64_t until_ns)
{
	struct kvp_msg *m;

	REQUIRE(rte_mempool_get(pool, (void **)&m) == 0, "message pool empty");
	memset(m, 0, sizeof(*m));
	m->type = KVP_MSG_PEER_OPEN;
	m->fd = -1;
	m->peer = (uint16_t)slot;
	m->handle = kvp_peer_handle(slot, gen);
	m->why = why;
	m->until_ns = until_ns;
	snprintf(m->node_id, sizeof(m->node_id), "peer%u", slot);
	REQUIRE(rte_ring_enqueue(w.inbox, m) == 0, "inbox full");
}

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

/* The stub takes a connection (and closes its fd: nothing is sent on it here). */
static int
stub_attach_ok(void *tctx, uint16_t peer, uint8_t link, int fd, bool outgoing, uint64_t epoch)
{
	(void)tctx;
	(void)peer;
	(void)link;
	(void)outgoing;
	(void)epoch;
	close(fd);
	return 0;
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
	now = kvp_mono_ns();
	CHECK(kvp_worker_spin_after_done(&w, now, win));
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

static void
setup(void)
{
	static const struct kvp_transport_ops *const ops[] = { &stub_ops };
	int rc = kvp_test_eal_init();

	if (rc < 0)
		kvp_test_setup_failed("EAL: %s", strerror(-rc));
	stub_ops = kvp_test_stub_ops;
	stub_ops.name = "stub";
	stub_ops.post = stub_post;
	stub_ops.cancel = stub_cancel;
	stub_ops.attach = stub_attach_ok;
	kvp_config_defaults(&cfg);
	cfg.max_inflight = SLOTS;
	cfg.max_segments = 4;
	cfg.max_clients = 4;
	cfg.max_regions = 8;
	cfg.admission_timeout_ms = ADMIT_MS;
	cfg.default_timeout_ms = DEFAULT_MS;
	cfg.npeers = 1;
	snprintf(cfg.peers[0].node_id, sizeof(cfg.peers[0].node_id), "peer0");
	pool = rte_mempool_create("test_worker_msgs", 255, sizeof(struct kvp_msg), 0, 0, NULL, NULL,
				  NULL, NULL, SOCKET_ID_ANY, 0);
	if (!pool || kvp_region_table_init(&regions, cfg.max_regions) < 0)
		kvp_test_setup_failed("message pool or region table");
	rc = kvp_test_memfd("test-worker-region", REG_LEN, true, &region_fd, NULL);
	if (rc < 0)
		kvp_test_setup_failed("memfd: %s", strerror(-rc));
	if (kvp_worker_init(&w, 0, &cfg, &regions, pool) < 0 ||
	    kvp_worker_transports(&w, ops, 1) < 0)
		kvp_test_setup_failed("worker");
	w.main_evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	/* Peer slot 0 open (handle 0), a link to it up. */
	peer_open(0, 0, KVP_PEER_WHY_DOWN, 0);
	CHECK_EQ(kvp_worker_inbox(&w), 1);
	w.peers[0].links = 1;
}

int
main(void)
{
	setup();
	test_peer_slots();
	test_admission();
	test_cq_room();
	test_spin_after_done();
	test_deadlines();
	test_cancel();
	test_drain();
	test_park();
	/* Turn order, not the timeout (test_admission has that): a loaded or
	 * sanitized run must not reach admission_ms while the turns are walked. */
	cfg.admission_timeout_ms = 3600000;
	test_fair();
	test_light_beside_heavy();
	cfg.admission_timeout_ms = ADMIT_MS;
	CHECK_EQ(rte_mempool_avail_count(pool), 255);
	kvp_worker_fini(&w);
	kvp_region_table_fini(&regions);
	close(region_fd);
	close(w.main_evfd);
	return kvp_test_result("test_worker");
}
