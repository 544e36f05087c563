/* SPDX-License-Identifier: BSD-3-Clause */
/* TCP transport: per-worker io_uring, connection slots, completion dispatch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_lcore.h>
#include <rte_malloc.h>

#include "tcp_priv.h"

/*
 * SENDMSG_ZC notifications come once the peer has ACKed the bytes, which
 * a dead peer or a downed link never does: the slot would not drain until
 * TCP gave up (minutes). connect(AF_UNSPEC) aborts the connection instead
 * (RST, queues dropped): the kernel lets go of the pages now, and none of
 * their bytes can still leave later, from memory given back by then.
 */
static void
conn_abort_zc(struct tcp_ctx *t, struct tcp_conn *c)
{
	struct sockaddr sa = { .sa_family = AF_UNSPEC };

	if (!t->zerocopy || (!c->send_busy && !zc_waiting(c)))
		return;
	if (connect(c->fd, &sa, sizeof(sa)) < 0)
		KVP_LOG_RL(WARNING, tcp, "worker %u: link %u: abort for zero-copy sends: %s",
			   t->w->idx, c->link, strerror(errno));
}

static void
tcp_destroy(void *tctx)
{
	struct tcp_ctx *t = tctx;

	if (!t)
		return;
	/* Operations and zero-copy sends end before the memory they use goes. */
	for (uint32_t i = 0; t->conns && i < t->nconns; i++)
		if (t->conns[i].fd >= 0)
			conn_abort_zc(t, &t->conns[i]);
	if (t->ring.ring_fd > 0)
		io_uring_queue_exit(&t->ring);
	for (uint32_t i = 0; t->conns && i < t->nconns; i++)
		if (t->conns[i].fd >= 0)
			close(t->conns[i].fd);
	rte_free(t->conns);
	rte_free(t->live);
	if (t->mem)
		munmap(t->mem, t->mem_len);
	rte_free(t->q_round);
	rte_free(t->q_used);
	rte_free(t->q_blocked);
	stage_fini(&t->stage);
	rte_free(t);
}

/*
 * A sparse table of registered buffers, one entry per connection: a
 * connection's rxbuf is registered when it comes up (its reads of headers
 * and small payloads then skip per-op page pinning) and dropped when it
 * closes, so only the buffers of connections up are pinned, whatever
 * limits.max_peers reserves. Refused (e.g. RLIMIT_MEMLOCK): plain recv.
 */
static void
register_fixed(struct tcp_ctx *t)
{
	int rc = io_uring_register_buffers_sparse(&t->ring, t->nconns);

	if (rc < 0) {
		KVP_LOG(WARNING, tcp, "worker %u: io_uring buffer table refused (%s): plain recv",
			t->w->idx, strerror(-rc));
		return;
	}
	t->fixed = true;
}

/* Register (or, @p on false, drop) @p c's rxbuf in the ring's buffer table. */
static void
conn_fixed(struct tcp_ctx *t, struct tcp_conn *c, bool on)
{
	struct iovec iov = { .iov_base = on ? c->rxbuf : NULL, .iov_len = on ? c->rx_cap : 0 };
	__u64 tag = 0;

	if (!t->fixed || c->fixed == on)
		return;
	if (io_uring_register_buffers_update_tag(&t->ring, c->id, &iov, &tag, 1) != 1) {
		if (on)
			KVP_LOG_RL(WARNING, tcp, "worker %u: cannot register a receive buffer: plain recv",
				   t->w->idx);
		return;
	}
	c->fixed = on;
	KVP_STAT_SET(t->w->stats.fixed_bufs, t->w->stats.fixed_bufs + (on ? 1 : -1));
}

static size_t
align_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

/*
 * Queues and buffers of every connection limits.max_peers allows, carved
 * from one anonymous mapping made at start: nothing is allocated when a
 * peer joins, and pages are only backed once a connection uses them, so an
 * idle slot costs its address space, not memory.
 */
static int
carve(struct tcp_ctx *t, const struct kvp_config *cfg, uint32_t txq, uint32_t rxt)
{
	size_t rx = align_up(cfg->tcp_rx_buffer, 4096);
	size_t txq_len = align_up(sizeof(struct tx_frame) * txq, 64);
	size_t iov_len = align_up(sizeof(struct iovec) * t->iov_max, 64);
	size_t rxt_len = align_up(sizeof(struct rx_entry) * rxt, 64);
	/* Page-aligned per connection: one that is never used keeps no page. */
	size_t per = rx + align_up(txq_len + iov_len + rxt_len, 4096);
	size_t len = (size_t)t->nconns * per;
	uint8_t *base = mmap(NULL, len, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (base == MAP_FAILED)
		return -ENOMEM;
	t->mem = base;
	t->mem_len = len;
	for (uint32_t i = 0; i < t->nconns; i++) {
		struct tcp_conn *c = &t->conns[i];
		uint8_t *p = base + (size_t)i * per;

		c->rxbuf = p;
		c->rx_cap = cfg->tcp_rx_buffer;
		c->txq = (struct tx_frame *)(p + rx);
		c->iov = (struct iovec *)(p + rx + txq_len);
		c->rxt = (struct rx_entry *)(p + rx + txq_len + iov_len);
	}
	return 0;
}

/* SENDMSG_ZC came with Linux 6.1: older kernels refuse the opcode on every send. */
static bool
zc_supported(struct io_uring *ring)
{
	struct io_uring_probe *p = io_uring_get_probe_ring(ring);
	bool ok = p && io_uring_opcode_supported(p, IORING_OP_SENDMSG_ZC);

	if (p)
		io_uring_free_probe(p);
	return ok;
}

/*
 * IORING_SEND_ZC_REPORT_USAGE came with Linux 6.2; 6.1 refuses the flag
 * (-EINVAL) on every send. Ask once, with an empty send on a socket pair
 * (AF_UNIX has no zero-copy: a kernel that knows the flag says so instead).
 */
static bool
zc_report_supported(struct io_uring *ring)
{
	struct msghdr msg = { 0 };
	struct io_uring_cqe *cqe;
	int sv[2], res = -EINVAL;
	bool more = false;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return false;
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	if (sqe) {
		io_uring_prep_sendmsg_zc(sqe, sv[0], &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		sqe->ioprio |= IORING_SEND_ZC_REPORT_USAGE;
		io_uring_sqe_set_data64(sqe, UINT64_MAX);
		/* The result, then a notification if it had F_MORE (a signal may interrupt a wait). */
		int rc = io_uring_submit(ring);

		for (bool first = true; rc >= 0 && (first || more); first = false) {
			while ((rc = io_uring_wait_cqe(ring, &cqe)) == -EINTR)
				;
			if (rc < 0)
				break;
			if (first) {
				res = cqe->res;
				more = cqe->flags & IORING_CQE_F_MORE;
			} else {
				more = false;
			}
			io_uring_cqe_seen(ring, cqe);
		}
	}
	close(sv[0]);
	close(sv[1]);
	return res != -EINVAL;
}

static int
tcp_create(struct kvp_worker *w, unsigned idx, void **tctx)
{
	const struct kvp_config *cfg = w->cfg;
	int socket = rte_socket_id();
	struct tcp_ctx *t = rte_zmalloc_socket("kvp_tcp", sizeof(*t), 64, socket);
	int rc;

	if (!t)
		return -ENOMEM;
	t->w = w;
	t->idx = (uint8_t)idx;
	t->links = cfg->tcp_conns ? cfg->tcp_conns : 1;
	/* Every peer slot, both directions: a peer that joins at run time finds its connections. */
	t->nconns = 2 * cfg->max_peers * t->links;
	t->iov_max = 2 * cfg->tcp_send_iov;
	t->frame_max = cfg->tcp_frame_max;
	t->zerocopy = cfg->tcp_zerocopy;
	t->peer_ns = (uint64_t)cfg->peer_timeout_ms * 1000000;
	t->conns = rte_zmalloc_socket("kvp_tcp_conns", sizeof(*t->conns) * t->nconns, 64, socket);
	t->live = rte_zmalloc_socket("kvp_tcp_live", sizeof(*t->live) * t->nconns, 64, socket);
	t->q_round =
		rte_zmalloc_socket("kvp_tcp_q", sizeof(uint32_t) * cfg->max_clients, 64, socket);
	t->q_used =
		rte_zmalloc_socket("kvp_tcp_q", sizeof(uint64_t) * cfg->max_clients, 64, socket);
	t->q_blocked =
		rte_zmalloc_socket("kvp_tcp_q", sizeof(uint32_t) * cfg->max_clients, 64, socket);
	if (!t->conns || !t->live || !t->q_round || !t->q_used || !t->q_blocked) {
		rc = -ENOMEM;
		goto err;
	}
	for (uint32_t i = 0; i < t->nconns; i++)
		t->conns[i].fd = -1;
	rc = stage_init(&t->stage, cfg, socket);
	if (rc < 0)
		goto err;
	KVP_STAT_SET(w->stats.stage_bufs, t->stage.nbufs);
	/* Room too for the peer control channel: a grant or an ACK per transfer (RDMA). */
	uint32_t txq = kvp_pow2_ceil(cfg->tcp_tx_frames + 2 * cfg->max_inflight);
	uint32_t rxt = kvp_pow2_ceil(cfg->max_inflight);
	rc = carve(t, cfg, txq, rxt);
	if (rc < 0)
		goto err;
	for (uint32_t i = 0; i < t->nconns; i++) {
		struct tcp_conn *c = &t->conns[i];

		c->rx_stage = -1;
		c->id = i;
		c->peer = (uint16_t)(i / (2 * t->links));
		c->outgoing = (i / t->links) % 2 == 0;
		c->slot = (uint8_t)(i % t->links);
		c->link = c->slot;
		c->txq_mask = txq - 1;
		c->rxt_mask = rxt - 1;
	}
	/*
	 * Each connection up has at most one send and two (linked) recvs in
	 * flight; tcp_sqe() submits and retries if more are ever prepared at
	 * once. With tcp.zerocopy up to ZC_SENDS notifications per connection
	 * come on top: the CQ is sized for them rather than left to the
	 * kernel's overflow list.
	 * COOP_TASKRUN: a completion that needs this thread's task work
	 * (every recv that had to wait for data) no longer interrupts it
	 * with an IPI; a sleeping worker is still woken, and a spinning one
	 * sees IORING_SQ_TASKRUN (TASKRUN_FLAG) and enters the kernel.
	 */
	uint32_t entries = kvp_pow2_ceil(2 * t->nconns + 8);
	if (entries > 32768)
		entries = 32768;
	struct io_uring_params up = {
		.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
	};
	if (t->zerocopy) {
		up.flags |= IORING_SETUP_CQSIZE;
		up.cq_entries = kvp_pow2_ceil(t->nconns * (3 + ZC_SENDS) + 8);
		if (up.cq_entries > 65536)
			up.cq_entries = 65536;
		if (up.cq_entries < 2 * entries)
			up.cq_entries = 2 * entries;
	}
	rc = io_uring_queue_init_params(entries, &t->ring, &up);
	if (rc == -EINVAL) { /* kernels before 5.19 */
		up.flags &= ~(IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG);
		rc = io_uring_queue_init_params(entries, &t->ring, &up);
	}
	if (rc < 0) {
		t->ring.ring_fd = -1;
		goto err;
	}
	if (t->zerocopy && !zc_supported(&t->ring)) {
		/* Failing every send would only flap the links: copy instead, and say so. */
		KVP_LOG(WARNING, tcp,
			"worker %u: tcp.zerocopy: this kernel's io_uring has no SENDMSG_ZC "
			"(Linux 6.1+): sending by copy",
			w->idx);
		t->zerocopy = false;
	}
	if (t->zerocopy)
		t->zc_report = zc_report_supported(&t->ring);
	if (cfg->tcp_fixed)
		register_fixed(t);
	*tctx = t;
	return 0;
err:
	tcp_destroy(t);
	return rc;
}

/*
 * Link @p link of a peer is this worker's (kvp_link_worker()); it takes
 * the slot kvp_link_slot() says: a node dials workers x tcp.connections
 * links and accepts as many, so every slot index stays below
 * tcp.connections.
 */
static int
tcp_attach(void *tctx, uint16_t peer, uint8_t link, int fd, bool outgoing, uint64_t epoch)
{
	struct tcp_ctx *t = tctx;
	unsigned nw = t->w->nworkers, slot = kvp_link_slot(link, nw);
	uint32_t id = conn_index(t, peer, slot, outgoing);

	if (kvp_link_worker(link, nw) != t->w->idx || slot >= t->links || id >= t->nconns ||
	    link >= KVP_LINKS_MAX)
		return -EINVAL;
	struct tcp_conn *c = &t->conns[id];
	if (c->state == CONN_UP)
		return -EEXIST; /* the link is up: a duplicate */
	if (c->state != CONN_FREE)
		return -EBUSY; /* the old connection is still draining */
	c->state = CONN_UP;
	c->live_pos = t->nlive;
	t->live[t->nlive++] = id;
	c->link = link;
	c->fd = fd;
	c->epoch = epoch;
	c->ops = 0;
	c->tx_zc = c->tx_done = c->tx_head = c->tx_tail = 0;
	c->tx_partial = 0;
	c->zc_head = c->zc_tail = 0;
	c->send_busy = c->recv_busy = c->recv_next = false;
	c->pend_head = c->pend_tail = NULL;
	c->unsent = 0;
	c->framed = 0;
	c->rx_start = c->rx_end = 0;
	c->rx_state = RX_HDR;
	c->rx_region = NULL;
	c->rx_stage = -1;
	c->last_rx_ns = c->last_tx_ns = c->send_ok_ns = c->send_moved_ns = kvp_mono_ns();
	c->held_ping_ns = 0;
	c->rx_held = false;
	c->retrans_seen = 0;
	memset(c->rxt, 0, sizeof(*c->rxt) * (c->rxt_mask + 1));
	conn_fixed(t, c, true);
	KVP_LOG(INFO, tcp, "worker %u: %s link %u to peer %u up (epoch %016" PRIx64 ")",
		t->w->idx, outgoing ? "outgoing" : "incoming", link, peer, epoch);
	/* Each worker's first link of a peer carries its peer control channel. */
	if (slot == 0)
		kvp_pchan_conn(t->w, peer, outgoing, true);
	return 0;
}

/*
 * A transfer stays on one link (its END must follow its DATA): the up link
 * with the fewest bytes still to send, ties rotated.
 */
static struct tcp_conn *
pick_link(struct tcp_ctx *t, uint16_t peer)
{
	struct tcp_conn *best = NULL;
	uint32_t base = conn_index(t, peer, 0, true);

	for (uint32_t k = 0; k < t->links; k++) {
		struct tcp_conn *c = &t->conns[base + (t->rr + k) % t->links];

		if (c->state == CONN_UP && (!best || c->unsent < best->unsent))
			best = c;
	}
	t->rr++;
	return best;
}

static int
tcp_post(void *tctx, struct kvp_xfer *x)
{
	struct tcp_ctx *t = tctx;

	if (conn_index(t, x->peer, 0, true) >= t->nconns)
		return -ENOTCONN;
	struct tcp_conn *c = pick_link(t, x->peer);
	if (!c)
		return -ENOTCONN;
	x->t_conn = (uint16_t)c->id;
	x->t_acked = false;
	c->unsent += x->bytes;
	x->t_state = TX_PEND;
	x->next = NULL;
	if (c->pend_tail)
		c->pend_tail->next = x;
	else
		c->pend_head = x;
	c->pend_tail = x;
	return 0;
}

/* Close once nothing in the ring refers to the connection any more. */
static void
conn_finish_close(struct tcp_ctx *t, struct tcp_conn *c)
{
	struct kvp_worker *w = t->w;

	tcp_tx_reset(t, c);
	tcp_rx_reset(t, c);
	if (c->outgoing) {
		/* Its transfers; the channel's subscriber ends its own (told by kvp_pchan_conn()). */
		for (uint32_t i = 0; i < w->nxfers; i++) {
			struct kvp_xfer *x = &w->xfers[i];

			if (x->state == KVP_XS_ACTIVE && x->tp == t->idx && x->peer == c->peer &&
			    x->t_conn == c->id)
				kvp_worker_xfer_end(w, x, KVP_EPEER);
		}
	}
	close(c->fd);
	c->fd = -1;
	conn_fixed(t, c, false);
	c->state = CONN_FREE;
	/* Out of the live list: the last one takes its place. */
	uint32_t last = t->live[--t->nlive];

	t->live[c->live_pos] = last;
	t->conns[last].live_pos = c->live_pos;
}

void
tcp_conn_fail(struct tcp_ctx *t, struct tcp_conn *c, const char *why)
{
	if (c->state != CONN_UP)
		return;
	KVP_LOG(WARNING, tcp, "worker %u: %s link %u to peer %u closed: %s", t->w->idx,
		c->outgoing ? "outgoing" : "incoming", c->link, c->peer, why);
	c->state = CONN_CLOSING;
	/* Makes the in-flight send and recv return so the slot can drain. */
	shutdown(c->fd, SHUT_RDWR);
	conn_abort_zc(t, c);
	kvp_worker_conn_down(t->w, c->peer, c->link, c->outgoing, why);
	if (c->slot == 0)
		kvp_pchan_conn(t->w, c->peer, c->outgoing, false);
	if (c->ops == 0)
		conn_finish_close(t, c);
}

static void
handle_cqe(struct tcp_ctx *t, const struct io_uring_cqe *cqe)
{
	uint32_t id = (uint32_t)(cqe->user_data >> 8);
	enum uop op = (enum uop)(cqe->user_data & 0xff);

	if (id >= t->nconns)
		return;
	struct tcp_conn *c = &t->conns[id];
	if (op == UOP_SEND && (cqe->flags & IORING_CQE_F_MORE)) {
		/*
		 * SENDMSG_ZC's result: the bytes are the socket's (the next
		 * send may go), their memory the kernel's until the notification.
		 */
		tcp_send_done(t, c, cqe->res, true);
		return;
	}
	c->ops--;
	if (op == UOP_SEND && (cqe->flags & IORING_CQE_F_NOTIF))
		tcp_zc_notif(t, c, (uint32_t)(cqe->user_data >> 40),
			     t->zc_report && ((uint32_t)cqe->res & IORING_NOTIF_USAGE_ZC_COPIED));
	else if (op == UOP_SEND)
		tcp_send_done(t, c, cqe->res, false);
	else if (op == UOP_RECV || op == UOP_RECV_NEXT)
		tcp_recv_done(t, c, cqe->res, op == UOP_RECV_NEXT);
	if (c->state == CONN_CLOSING && c->ops == 0)
		conn_finish_close(t, c);
}

/*
 * Liveness, every few milliseconds: ping connections we have not sent on for
 * a quarter of the peer timeout (both ends do, so each direction carries
 * traffic), and fail a connection that has been silent, or whose send has
 * not moved, for the whole timeout. A slow but live peer keeps reading and
 * pinging, so only a dead or wedged one is cut off; one that holds our
 * bytes back on purpose (no receive staging buffer yet) says so with
 * KVP_PING_RXWAIT (believed for RXWAIT_MAX timeouts at most), and we say
 * so to our senders while we do (those PINGs stand for the idle ones).
 */
/* A peer may vouch for a stalled send (KVP_PING_RXWAIT) this many peer timeouts, not more. */
#define RXWAIT_MAX 8

static void
liveness(struct tcp_ctx *t, uint64_t now)
{
	char why[96];

	for (uint32_t i = 0; i < t->nlive; i++) {
		struct tcp_conn *c = &t->conns[t->live[i]];
		struct tcp_info ti;
		socklen_t tl = sizeof(ti);

		if (c->state != CONN_UP)
			continue;
		/* The kernel's retransmissions, a sign of loss on the path. */
		if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 &&
		    ti.tcpi_total_retrans > c->retrans_seen) {
			KVP_STAT_ADD(t->w->stats.peer[c->peer].tcp_retrans,
				     ti.tcpi_total_retrans - c->retrans_seen);
			c->retrans_seen = ti.tcpi_total_retrans;
		}
		/* A held header: its bytes wait for us, not we for them. */
		if (now - c->last_rx_ns > t->peer_ns && !c->rx_held) {
			snprintf(why, sizeof(why), "peer silent for %" PRIu64 " ms",
				 (now - c->last_rx_ns) / 1000000);
			tcp_conn_fail(t, c, why);
		} else if ((c->send_busy || zc_waiting(c)) &&
			   (now - c->send_ok_ns > t->peer_ns ||
			    now - c->send_moved_ns > RXWAIT_MAX * t->peer_ns)) {
			snprintf(why, sizeof(why), "send stalled for %" PRIu64 " ms%s",
				 (now - c->send_moved_ns) / 1000000,
				 c->send_ok_ns != c->send_moved_ns ?
					 " (the peer waits for buffers)" :
					 "");
			tcp_conn_fail(t, c, why);
		} else if (!c->send_busy && c->tx_head == c->tx_tail && !c->rx_held &&
			   now - c->last_tx_ns > t->peer_ns / 4) {
			/* Not behind queued frames (a full zero-copy window): they say as much. */
			tcp_queue_ctrl(c, KVP_W_PING, 0, 0);
		}
		if (c->rx_held && now - c->held_ping_ns >= t->peer_ns / 4 &&
		    tcp_queue_ctrl(c, KVP_W_PING, 0, KVP_PING_RXWAIT))
			c->held_ping_ns = now; /* the sender's send waits for us: say so */
	}
}

static int
tcp_progress(void *tctx)
{
	struct tcp_ctx *t = tctx;
	struct io_uring_cqe *cqes[64];
	int work = 0;
	unsigned n;

	/* Completions waiting for task work are posted only once this thread enters the kernel. */
	if (IO_URING_READ_ONCE(*t->ring.sq.kflags) & IORING_SQ_TASKRUN)
		io_uring_get_events(&t->ring);
	while ((n = io_uring_peek_batch_cqe(&t->ring, cqes, 64)) > 0) {
		for (unsigned i = 0; i < n; i++)
			handle_cqe(t, cqes[i]);
		io_uring_cq_advance(&t->ring, n);
		work += (int)n;
	}
	uint64_t now = kvp_mono_ns();
	if (now >= t->next_tick_ns) {
		t->next_tick_ns = now + t->peer_ns / 16;
		liveness(t, now);
		tcp_tx_sweep(t, now);
		stage_tick(&t->stage);
		if (t->stage_blocked) {
			for (uint32_t i = 0; i < t->nlive; i++) {
				struct tcp_conn *c = &t->conns[t->live[i]];

				if (c->state == CONN_UP && c->outgoing)
					tcp_tx_admission(t, c, now);
			}
			t->stage_blocked = false;
		}
	}
	for (uint32_t i = 0; i < t->nlive; i++) {
		struct tcp_conn *c = &t->conns[t->live[i]];

		if (c->state != CONN_UP)
			continue;
		work += tcp_process_rx(t, c);
		work += tcp_fill_tx(t, c);
		if (c->state == CONN_UP && !c->send_busy)
			work += tcp_start_send(t, c);
		if (c->state == CONN_UP && !c->recv_busy)
			tcp_start_recv(t, c);
	}
	if (t->sqes) {
		io_uring_submit(&t->ring);
		t->sqes = 0;
	}
	return work;
}

static void
tcp_cancel(void *tctx, struct kvp_xfer *x, int status)
{
	struct tcp_ctx *t = tctx;

	if (x->t_conn < t->nconns)
		tcp_tx_cancel(t, &t->conns[x->t_conn], x, status);
}

static int
tcp_sleep_fd(void *tctx)
{
	struct tcp_ctx *t = tctx;

	if (t->sqes) {
		io_uring_submit(&t->ring);
		t->sqes = 0;
	}
	return t->ring.ring_fd;
}

static void
tcp_disconnect(void *tctx, uint16_t peer)
{
	struct tcp_ctx *t = tctx;
	uint32_t base = conn_index(t, peer, 0, true); /* both directions' links follow */

	if (base >= t->nconns)
		return;
	for (uint32_t i = 0; i < 2 * t->links; i++)
		tcp_conn_fail(t, &t->conns[base + i], "disconnect requested");
}

static uint32_t
tcp_fence(void *tctx, const struct kvp_fence *f, bool force)
{
	return tcp_rx_fence(tctx, f, force);
}

/*
 * The peer control channel: this worker's first link (slot 0) each way. A
 * peer's worker reaches its namesake here (the same index), so RDMA queue
 * pairs pair worker i of one node with worker i of the other; a peer's
 * worker without a namesake here is told UNSUPPORTED (tcp_rx.c) and sends
 * over TCP.
 */
static struct tcp_conn *
conn_of(struct tcp_ctx *t, uint16_t peer, bool outgoing)
{
	uint32_t id = conn_index(t, peer, 0, outgoing);

	return id < t->nconns ? &t->conns[id] : NULL;
}

static bool
pchan_send(void *tctx, uint16_t peer, bool outgoing, const struct kvp_wire_hdr *h,
	   const void *payload)
{
	struct tcp_conn *c = conn_of(tctx, peer, outgoing);

	if (!c || h->len > KVP_PCHAN_PAYLOAD)
		return false;
	return tcp_queue_frame(c, h, payload);
}

static uint32_t
pchan_room(void *tctx, uint16_t peer, bool outgoing)
{
	struct tcp_conn *c = conn_of(tctx, peer, outgoing);

	return c && c->state == CONN_UP ? txq_room(c) : 0;
}

static void
pchan_fail(void *tctx, uint16_t peer, bool outgoing, const char *why)
{
	struct tcp_conn *c = conn_of(tctx, peer, outgoing);

	if (c)
		tcp_conn_fail(tctx, c, why);
}

static const struct kvp_pchan_ops tcp_pchan = {
	.send = pchan_send,
	.room = pchan_room,
	.fail = pchan_fail,
};

const struct kvp_transport_ops kvp_tcp_stage_ops = {
	.name = "tcp",
	.caps = KVP_TCAP_HOST_MEM,
	.create = tcp_create,
	.destroy = tcp_destroy,
	.attach = tcp_attach,
	.post = tcp_post,
	.progress = tcp_progress,
	.cancel = tcp_cancel,
	.sleep_fd = tcp_sleep_fd,
	.disconnect = tcp_disconnect,
	.fence = tcp_fence,
	.pchan = &tcp_pchan,
};
