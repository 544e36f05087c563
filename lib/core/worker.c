/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Worker data plane, transport-independent part: the transfer table and its
 * accounting, completions, the main lcore's messages, deadlines, and
 * sleeping. Submissions are read in submit.c, client channels handled in
 * chan.c, landing notices and other workers' messages in xmsg.c. Everything
 * here runs on the worker's lcore; tables are sized at start and nothing
 * allocates.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "kvp_transport.h"
#include "worker_priv.h"

#define TIMER_PERIOD_NS 1000000ull /* deadline scan: 1 ms */
/* Room for a message per peer slot at once (a reload that adds or removes many). */
#define MSG_RING_SIZE   4096

int
kvp_worker_init(struct kvp_worker *w, unsigned idx, const struct kvp_config *cfg,
		struct kvp_region_table *regions, struct rte_mempool *msg_pool)
{
	char name[RTE_RING_NAMESIZE];
	int socket = rte_socket_id();

	memset(w, 0, sizeof(*w));
	w->idx = idx;
	w->nworkers = 1;
	w->all = w;
	w->cfg = cfg;
	w->regions = regions;
	w->conn_tp = w->pchan_tp = -1;
	w->msg_pool = msg_pool;
	w->evfd = -1;
	w->main_evfd = -1;
	w->nxfers = cfg->max_inflight;
	w->chan_slots = cfg->max_clients;

	w->xfers = rte_zmalloc_socket("kvp_xfers", sizeof(*w->xfers) * w->nxfers, 64, socket);
	w->free_idx = rte_zmalloc_socket("kvp_xfer_free", sizeof(uint32_t) * w->nxfers, 64,
					 socket);
	w->segs = rte_zmalloc_socket("kvp_segs",
				     sizeof(struct kvp_seg) * w->nxfers * cfg->max_segments, 64,
				     socket);
	w->sqe_scratch = rte_zmalloc_socket("kvp_sqe", KVP_SQE_SIZE * (cfg->max_segments + 1),
					    64, socket);
	w->chans = rte_zmalloc_socket("kvp_chans", sizeof(*w->chans) * w->chan_slots, 64, socket);
	w->act = rte_zmalloc_socket("kvp_act", sizeof(*w->act) * w->chan_slots, 64, socket);
	/* Every per-peer table has limits.max_peers rows from the start: a peer that joins takes one. */
	w->npeers = cfg->max_peers;
	w->peers = rte_zmalloc_socket("kvp_wpeers", sizeof(*w->peers) * w->npeers, 64, socket);
	w->stats.peer = rte_zmalloc_socket("kvp_peer_stats", sizeof(*w->stats.peer) * w->npeers, 64,
					   socket);
	w->hist = rte_zmalloc_socket("kvp_hist", sizeof(*w->hist) * KVP_HP_MAX * w->npeers, 64,
				     socket);
	w->fences =
		rte_zmalloc_socket("kvp_fences", sizeof(*w->fences) * cfg->max_fences, 64, socket);
	if (!w->xfers || !w->free_idx || !w->segs || !w->sqe_scratch || !w->chans || !w->act ||
	    !w->hist || !w->fences || !w->peers || !w->stats.peer)
		goto err_free;
	for (uint32_t i = 0; i < w->npeers; i++)
		w->peers[i].handle = KVP_PEER_NONE;
	for (uint32_t i = 0; i < w->nxfers; i++) {
		w->xfers[i].idx = i;
		w->xfers[i].segs = &w->segs[(size_t)i * cfg->max_segments];
		w->free_idx[i] = w->nxfers - 1 - i;
	}
	w->nfree = w->nxfers;

	snprintf(name, sizeof(name), "kvp_in_%u", idx);
	w->inbox = rte_ring_create(name, MSG_RING_SIZE, socket, RING_F_SP_ENQ | RING_F_SC_DEQ);
	snprintf(name, sizeof(name), "kvp_out_%u", idx);
	w->outbox = rte_ring_create(name, MSG_RING_SIZE, socket, RING_F_SP_ENQ | RING_F_SC_DEQ);
	if (!w->inbox || !w->outbox)
		goto err_free;
	w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->evfd < 0)
		goto err_free;
	return 0;

err_free:
	kvp_worker_fini(w);
	return -ENOMEM;
}


void
kvp_worker_fini(struct kvp_worker *w)
{
	route_destroy(w);
	for (unsigned i = 0; w->xin && i < w->nworkers; i++)
		rte_ring_free(w->xin[i]);
	rte_free(w->xin);
	w->xin = NULL;
	rte_free(w->xlost);
	w->xlost = NULL;
	if (w->evfd >= 0)
		close(w->evfd);
	w->evfd = -1;
	rte_ring_free(w->inbox);
	rte_ring_free(w->outbox);
	w->inbox = w->outbox = NULL;
	rte_free(w->fences);
	w->fences = NULL;
	rte_free(w->hist);
	rte_free(w->peers);
	rte_free(w->stats.peer);
	w->peers = NULL;
	w->stats.peer = NULL;
	rte_free(w->act);
	w->act = NULL;
	rte_free(w->chans);
	rte_free(w->sqe_scratch);
	rte_free(w->segs);
	rte_free(w->free_idx);
	rte_free(w->xfers);
	w->hist = NULL;
	w->chans = NULL;
	w->sqe_scratch = NULL;
	w->segs = NULL;
	w->free_idx = NULL;
	w->xfers = NULL;
}

void
worker_send_main(struct kvp_worker *w, int type, uint16_t peer, uint8_t link, bool outgoing,
	  struct kvp_chan *ch, const char *reason)
{
	struct kvp_msg *m;

	if (rte_mempool_get(w->msg_pool, (void **)&m) < 0) {
		KVP_LOG_RL(ERR, core, "worker %u: message pool empty, event %d lost", w->idx, type);
		return;
	}
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->link = link;
	m->peer = peer;
	m->outgoing = outgoing;
	m->chan = ch;
	m->fd = -1;
	if (reason)
		snprintf(m->reason, sizeof(m->reason), "%s", reason);
	if (rte_ring_enqueue(w->outbox, m) < 0) {
		KVP_LOG_RL(ERR, core, "worker %u: outbox full, event %d lost", w->idx, type);
		rte_mempool_put(w->msg_pool, m);
		return;
	}
	uint64_t one = 1;
	if (write(w->main_evfd, &one, sizeof(one)) < 0) {
		/* EAGAIN: already rung. */
	}
}


/* t[b] - t[a] when both stamps were reached (in order), else 0. */
static inline uint64_t
span(const uint64_t *t, int a, int b)
{
	return t[a] && t[b] >= t[a] ? t[b] - t[a] : 0;
}

/* Start of a transfer's end-to-end time: the client's submit, else our pickup. */
static inline uint64_t
xfer_start(const struct kvp_xfer *x)
{
	return x->ts[KVP_TS_SUBMIT] ? x->ts[KVP_TS_SUBMIT] : x->ts[KVP_TS_PICKUP];
}

/* Consecutive stamps: each histogram phase runs from ph_from[p] to the stamp of p + 1. */
static const uint8_t ph_from[KVP_HP_TX_MAX] = {
	[KVP_HP_QUEUE] = KVP_TS_SUBMIT, [KVP_HP_ADMIT] = KVP_TS_PICKUP,
	[KVP_HP_FIRST] = KVP_TS_ADMIT,	[KVP_HP_SEND] = KVP_TS_FIRST,
	[KVP_HP_WIRE] = KVP_TS_POSTED,	[KVP_HP_DELIVER] = KVP_TS_ACKED,
};

static void
log_deadline_miss(struct kvp_worker *w, const struct kvp_xfer *x)
{
	const uint64_t *t = x->ts;

	KVP_LOG_RL(WARNING, core,
		   "transfer client %u user_id %" PRIu64 " to %s (%" PRIu64 " bytes, %u seg) "
		   "missed its deadline by %" PRIu64 " us, status %s; us: queue %" PRIu64
		   " admit %" PRIu64 " first_byte %" PRIu64 " send %" PRIu64 " wire %" PRIu64
		   " deliver %" PRIu64 " total %" PRIu64 "%s",
		   x->client, x->user_id, x->peer < w->npeers ? w->peers[x->peer].node_id : "?",
		   x->bytes,
		   x->nseg, (t[KVP_TS_DONE] - x->deadline_ns) / 1000, kvp_status_str(x->status),
		   span(t, KVP_TS_SUBMIT, KVP_TS_PICKUP) / 1000,
		   span(t, KVP_TS_PICKUP, KVP_TS_ADMIT) / 1000,
		   span(t, KVP_TS_ADMIT, KVP_TS_FIRST) / 1000,
		   span(t, KVP_TS_FIRST, KVP_TS_POSTED) / 1000,
		   span(t, KVP_TS_POSTED, KVP_TS_ACKED) / 1000,
		   span(t, KVP_TS_ACKED, KVP_TS_DONE) / 1000, (t[KVP_TS_DONE] - xfer_start(x)) / 1000,
		   t[KVP_TS_ADMIT] ? "" : " (never admitted)");
}

/*
 * A transfer leaves the table: deadline check, phase histograms (successful
 * transfers only: a failure's phases stop where it failed) and the slowest
 * table. Timestamps stay cheap and always on (completions carry them);
 * stats.enabled switches the aggregation.
 */
static void
account(struct kvp_worker *w, struct kvp_xfer *x, uint64_t now)
{
	uint64_t *t = x->ts;

	if (!t[KVP_TS_DONE] || t[KVP_TS_DONE] < t[KVP_TS_PICKUP])
		t[KVP_TS_DONE] = now;
	if (t[KVP_TS_DONE] > x->deadline_ns) {
		KVP_STAT_ADD(w->stats.deadline_misses, 1);
		log_deadline_miss(w, x);
	}
	if (!KVP_STAT_READ(w->cfg->stats_enabled))
		return;
	uint64_t total = t[KVP_TS_DONE] - xfer_start(x);

	if (x->status == KVP_OK && x->peer < w->npeers) {
		for (int p = 0; p < KVP_HP_TOTAL; p++)
			if (t[ph_from[p]])
				kvp_hist_record(kvp_worker_hist(w, x->peer, p),
						span(t, ph_from[p], ph_from[p] + 1));
		kvp_hist_record(kvp_worker_hist(w, x->peer, KVP_HP_TOTAL), total);
	}
	kvp_slowest_offer(&w->slowest, x, total, now,
			  (uint64_t)KVP_STAT_READ(w->cfg->slowest_window_s) * 1000000000ull);
}

static void
xfer_free(struct kvp_worker *w, struct kvp_xfer *x, uint64_t now)
{
	account(w, x, now);
	__atomic_store_n(&x->state, KVP_XS_FREE, __ATOMIC_RELAXED);
	x->chan = NULL;
	__atomic_store_n(&x->gen, x->gen + 1, __ATOMIC_RELAXED);
	w->free_idx[w->nfree++] = x->idx;
}

/* Post x's completion; false if the CQ is full (the caller backlogs it). */
static bool
post_done(struct kvp_xfer *x, uint64_t now)
{
	struct kvp_chan *ch = x->chan;
	struct kvp_cqe c;

	memset(&c, 0, sizeof(c));
	c.kind = KVP_CQE_DONE;
	c.peer = x->handle;
	c.status = x->status;
	c.user_id = x->user_id;
	c.bytes = x->status == KVP_OK ? x->bytes : 0;
	c.nseg = x->nseg;
	if (x->status == KVP_EINVAL) {
		c.detail = x->detail;
		c.bad_seg = x->bad_seg;
	} else if (x->status == KVP_EPEER || x->status == KVP_ENOPEER) {
		c.detail = x->detail; /* enum kvp_peer_why, where it was known */
	}
	uint64_t *t = x->ts;
	t[KVP_TS_DONE] = now;
	c.phase_ns[KVP_PH_QUEUE] = span(t, KVP_TS_SUBMIT, KVP_TS_PICKUP);
	c.phase_ns[KVP_PH_ADMIT] = span(t, KVP_TS_PICKUP, KVP_TS_ADMIT);
	c.phase_ns[KVP_PH_POST] = span(t, KVP_TS_ADMIT, KVP_TS_POSTED);
	c.phase_ns[KVP_PH_WIRE] = span(t, KVP_TS_POSTED, KVP_TS_ACKED);
	c.phase_ns[KVP_PH_TOTAL] = span(t, KVP_TS_PICKUP, KVP_TS_DONE);
	c.phase_ns[KVP_PH_FIRST] = span(t, KVP_TS_ADMIT, KVP_TS_FIRST);
	c.phase_ns[KVP_PH_DELIVER] = span(t, KVP_TS_ACKED, KVP_TS_DONE);
	c.phase_ns[KVP_PH_E2E] = now - xfer_start(x);
	return chan_post(ch, &c);
}

static void
backlog_push(struct kvp_worker *w, struct kvp_chan *ch, struct kvp_xfer *x)
{
	w->nbacklog++;
	x->state = KVP_XS_BACKLOG;
	x->next = NULL;
	if (ch->backlog_tail)
		ch->backlog_tail->next = x;
	else
		ch->backlog_head = x;
	ch->backlog_tail = x;
}

bool
kvp_worker_spin_after_done(const struct kvp_worker *w, uint64_t now, uint64_t window_ns)
{
	return kvp_worker_inflight(w) == 0 && now - w->done_ns < window_ns;
}

void
kvp_worker_xfer_end(struct kvp_worker *w, struct kvp_xfer *x, int status)
{
	uint64_t now = kvp_mono_ns();
	uint16_t slot = x->peer;

	if (x->status == KVP_OK)
		x->status = status;
	for (uint32_t i = 0; i < x->nseg; i++) {
		if (x->segs[i].src) {
			kvp_region_put(x->segs[i].src);
			x->segs[i].src = NULL;
		}
	}
	KVP_STAT_ADD(w->stats.completions[x->status], 1);
	if (x->status == KVP_OK && slot < w->npeers)
		KVP_STAT_ADD(w->stats.peer[slot].tx_xfers, 1);
	if (x->status == KVP_ENOBUFS && x->chan)
		KVP_STAT_ADD(x->chan->stats.refused, 1);
	if (!x->chan) {
		xfer_free(w, x, now);
	} else {
		x->chan->inflight--;
		if (x->chan->backlog_head || !post_done(x, now)) {
			x->ts[KVP_TS_DONE] = 0;
			backlog_push(w, x->chan, x);
		} else {
			w->done_ns = now;
			xfer_free(w, x, now);
		}
	}
	/* Last: a closing peer may close once its last transfer has left the table. */
	if (slot < w->npeers)
		wpeer_ended(w, slot);
}

void
kvp_worker_conn_down(struct kvp_worker *w, uint16_t peer, uint8_t link, bool outgoing,
		     const char *reason)
{
	if (outgoing)
		wpeer_link_down(w, peer);
	if (peer < w->npeers)
		KVP_STAT_ADD(w->stats.peer[peer].conn_errors, 1);
	worker_send_main(w, KVP_MSG_CONN_DOWN, peer, link, outgoing, NULL, reason);
}

static void
chan_add(struct kvp_worker *w, struct kvp_chan *ch)
{
	uint32_t slot = kvp_client_slot(ch->id);

	ch->w = w;
	ch->act_idx = w->nchans;
	w->act[w->nchans] = ch;
	w->chans[slot] = ch;
	w->nchans++;
}

static void
chan_del(struct kvp_worker *w, struct kvp_chan *ch)
{
	uint32_t slot = kvp_client_slot(ch->id);

	/* Nothing may stay on the notify list: the main lcore frees the channel after GONE. */
	worker_flush_notify(w);
	/* In-flight transfers finish without a client; their memory stays referenced. */
	for (uint32_t i = 0; i < w->nxfers; i++)
		if (w->xfers[i].chan == ch && w->xfers[i].state == KVP_XS_ACTIVE)
			w->xfers[i].chan = NULL;
	uint64_t now = kvp_mono_ns();

	for (struct kvp_xfer *x = ch->backlog_head, *n; x; x = n) {
		n = x->next;
		w->nbacklog--;
		xfer_free(w, x, now);
	}
	ch->backlog_head = ch->backlog_tail = NULL;
	fence_chan_gone(w, ch);
	if (w->chans[slot] == ch) {
		/* The last channel takes its place in the admission round. */
		struct kvp_chan *last = w->act[--w->nchans];

		w->act[ch->act_idx] = last;
		last->act_idx = ch->act_idx;
		w->act[w->nchans] = NULL;
		w->chans[slot] = NULL;
	}
	worker_send_main(w, KVP_MSG_CHAN_GONE, 0, 0, false, ch, NULL);
}

int
kvp_worker_inbox(struct kvp_worker *w)
{
	struct kvp_msg *msgs[32];
	int x = w->nworkers > 1 ? worker_xinbox(w) : 0;
	unsigned n = rte_ring_dequeue_burst(w->inbox, (void **)msgs, 32, NULL);

	for (unsigned i = 0; i < n; i++) {
		struct kvp_msg *m = msgs[i];
		int rc;

		switch (m->type) {
		case KVP_MSG_CHAN_ADD:
			chan_add(w, m->chan);
			break;
		case KVP_MSG_CHAN_DEL:
			chan_del(w, m->chan);
			break;
		case KVP_MSG_CONN_ADD:
			/* Only an open slot takes connections (the main lcore opens it first). */
			rc = m->peer < w->npeers && w->peers[m->peer].state == KVP_WP_OPEN
				     ? route_attach(w, m->peer, m->link, m->fd, m->outgoing, m->epoch)
				     : -ENOENT;
			if (rc == -EEXIST && !m->outgoing) {
				/* A second inbound link of one number: the live one stays up. */
				close(m->fd);
				KVP_LOG_RL(WARNING, core,
					   "peer %u: a second link %u while it is up: refused",
					   m->peer, m->link);
			} else if (rc < 0) {
				close(m->fd);
				worker_send_main(w, KVP_MSG_CONN_DOWN, m->peer, m->link, m->outgoing, NULL,
					  "transport refused the connection");
			} else if (m->outgoing) {
				wpeer_link_up(w, m->peer);
			}
			break;
		case KVP_MSG_PEER_OPEN:
			kvp_worker_peer_open(w, m);
			break;
		case KVP_MSG_PEER_WHY:
			wpeer_why(w, m);
			break;
		case KVP_MSG_PEER_CLOSE:
			wpeer_close(w, m->peer);
			break;
		case KVP_MSG_QUIT:
			w->quit = true;
			break;
		case KVP_MSG_CANCEL: {
			uint32_t slot = kvp_client_slot(m->client);
			struct kvp_chan *ch = slot < w->chan_slots ? w->chans[slot] : NULL;

			if (ch && ch->id == m->client) {
				KVP_STAT_ADD(w->stats.admin_cancels, 1);
				worker_cancel_user(w, ch, m->user_id);
			}
			break;
		}
		default:
			break;
		}
		rte_mempool_put(w->msg_pool, m);
	}
	worker_flush_notify(w);
	return (int)n + x;
}

void
worker_cancel_user(struct kvp_worker *w, struct kvp_chan *ch, uint64_t user_id)
{
	for (uint32_t i = 0; i < w->nxfers; i++) {
		struct kvp_xfer *x = &w->xfers[i];

		if (x->state == KVP_XS_ACTIVE && x->chan == ch && x->user_id == user_id) {
			route_cancel(w, x, KVP_ECANCELED);
			return;
		}
	}
}

static int
drain_backlog(struct kvp_worker *w, struct kvp_chan *ch, uint64_t now)
{
	int n = 0;

	while (ch->backlog_head) {
		struct kvp_xfer *x = ch->backlog_head;

		if (!post_done(x, now))
			break;
		ch->backlog_head = x->next;
		if (!ch->backlog_head)
			ch->backlog_tail = NULL;
		w->nbacklog--;
		xfer_free(w, x, now);
		n++;
	}
	return n;
}

int
kvp_worker_timers(struct kvp_worker *w, uint64_t now)
{
	int work = 0;

	if (now < w->next_timer_ns)
		return 0;
	w->next_timer_ns = now + TIMER_PERIOD_NS;
	work += wpeer_timers(w, now);
	for (unsigned o = 0; w->xlost_to && o < w->nworkers; o++)
		kvp_worker_xlost_flush(w, o);
	if (w->nfences)
		work += fence_timers(w, now);
	for (uint32_t i = 0; i < w->chan_slots; i++) {
		struct kvp_chan *ch = w->chans[i];

		if (ch && ch->backlog_head)
			work += drain_backlog(w, ch, now);
	}
	for (uint32_t i = 0; w->nfree != w->nxfers && i < w->nxfers; i++) {
		struct kvp_xfer *x = &w->xfers[i];

		if (x->state == KVP_XS_ACTIVE && now >= x->deadline_ns && x->status == KVP_OK) {
			route_cancel(w, x, KVP_ETIMEDOUT);
			work++;
		}
	}
	worker_flush_notify(w);
	return work;
}

bool
kvp_worker_prepare_sleep(struct kvp_worker *w)
{
	bool ok = true;

	worker_flush_notify(w);
	/* Pairs with the fence in kvp_worker_xsend(): see the ring, or be rung. */
	__atomic_store_n(&w->sleeping, 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	for (uint32_t i = 0; i < w->chan_slots && ok; i++) {
		struct kvp_chan *ch = w->chans[i];

		if (ch && !ch->broken && !chan_prepare_sleep(ch))
			ok = false;
	}
	/* An inbox message, or one from another worker, also means there is work. */
	if (ok && (rte_ring_count(w->inbox) != 0 || worker_xpending(w)))
		ok = false;
	if (!ok)
		kvp_worker_finish_sleep(w);
	return ok;
}

void
kvp_worker_finish_sleep(struct kvp_worker *w)
{
	uint64_t v;

	for (uint32_t i = 0; i < w->chan_slots; i++)
		if (w->chans[i]) {
			kvp_ring_finish_wait(&w->chans[i]->sq);
			kvp_ring_finish_wait_room(&w->chans[i]->cq);
		}
	if (read(w->evfd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nobody rang. */
	}
	__atomic_store_n(&w->sleeping, 0, __ATOMIC_RELAXED);
}
