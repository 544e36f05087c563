/* SPDX-License-Identifier: BSD-3-Clause */
/* The worker tests' harness (worker_harness.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rte_mempool.h>
#include <rte_ring.h>

#include "worker_harness.h"

struct kvp_config cfg;
struct kvp_region_table regions;
struct rte_mempool *pool;
struct kvp_worker w;
static int region_fd = -1;

/* ---- the transport: holds what it is handed until the test ends it ---- */

struct kvp_xfer *held[SLOTS];
unsigned nheld, posts, cancels;

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
struct kvp_xfer *
held_of(uint32_t id, uint64_t user_id)
{
	for (unsigned i = 0; i < nheld; i++)
		if (held[i]->client == id && held[i]->user_id == user_id)
			return held[i];
	return NULL;
}

/* The transport finishes a transfer it holds. */
void
end_xfer(struct kvp_xfer *x, int status)
{
	REQUIRE(x != NULL, "no such transfer in flight");
	unhold(x);
	kvp_worker_xfer_end(&w, x, status);
}

void
end_all(int status)
{
	while (nheld)
		end_xfer(held[0], status);
}

/* ---- messages from and to the main lcore ---- */

void
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
unsigned
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

void
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
void
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

void
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

void
submit_cancel(struct client *c, uint64_t user_id)
{
	struct kvp_sqe_xfer e = { .op = KVP_OP_CANCEL, .user_id = user_id };

	REQUIRE(kvp_ring_enqueue_bulk(&c->sq, &e, 1) == 1, "client SQ full");
}

/* SQ entries the worker has not consumed yet. */
uint32_t
sq_left(const struct client *c)
{
	return atomic_load(&c->hdr->sq.prod) - atomic_load(&c->hdr->sq.cons);
}

/* Read up to @p n completions (a burst returns what the cached index shows: loop). */
uint32_t
read_cq(struct client *c, struct kvp_cqe *e, uint32_t n)
{
	uint32_t got = 0;
	int k;

	while (got < n && (k = kvp_ring_dequeue_burst(&c->cq, e + got, n - got)) > 0)
		got += (uint32_t)k;
	return got;
}

/* Read the next completion: it must be the DONE of @p user_id with @p status. */
void
expect_done(struct client *c, uint64_t user_id, int status, const char *file, int line)
{
	struct kvp_cqe e;

	if (read_cq(c, &e, 1) != 1) {
		kvp_test_fail(file, line, "no completion for user_id %llu",
			      (unsigned long long)user_id);
		return;
	}
	if (e.kind != KVP_CQE_DONE || e.user_id != user_id || e.status != status)
		kvp_test_fail(file, line,
			      "completion kind %u user_id %llu status %s, want DONE %llu %s",
			      e.kind, (unsigned long long)e.user_id, kvp_status_str(e.status),
			      (unsigned long long)user_id, kvp_status_str(status));
	CHECK_EQ(e.bytes, status == KVP_OK ? SEG_LEN : 0);
	CHECK_EQ(e.nseg, 1);
}

/* Completions waiting in the CQ. */
uint32_t
cq_count(const struct client *c)
{
	return atomic_load(&c->hdr->cq.prod) - atomic_load(&c->hdr->cq.cons);
}

int
poll_worker(void)
{
	return kvp_worker_poll_chans(&w);
}

/* One deadline scan at @p now (the 1 ms period is not what is under test). */
void
timers(uint64_t now)
{
	w.next_timer_ns = 0;
	kvp_worker_timers(&w, now);
}

/* After each case: nothing in flight, no backlog, every region reference back. */
void
expect_reclaimed(void)
{
	CHECK_EQ(nheld, 0);
	CHECK_EQ(w.nfree, SLOTS);
	CHECK_EQ(w.nbacklog, 0);
	for (uint32_t i = 0; i < regions.size; i++)
		CHECK_EQ(atomic_load(&regions.slots[i].refs), 0);
}

/* PEER_OPEN of @p slot, generation @p gen, as the main lcore sends it. */
void
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

void
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
teardown(const char *name)
{
	CHECK_EQ(rte_mempool_avail_count(pool), 255);
	kvp_worker_fini(&w);
	kvp_region_table_fini(&regions);
	close(region_fd);
	close(w.main_evfd);
	return kvp_test_result(name);
}
