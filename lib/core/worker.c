/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Worker data plane, transport-independent part: pick up submissions from
 * client channels, validate them, hand them to the transport, and post
 * completions. Everything here runs on the worker's lcore; tables are sized
 * at start and nothing allocates.
 */
#include <errno.h>
#include <stdarg.h>
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
#define MSG_RING_SIZE	1024

int
kvp_worker_init(struct kvp_worker *w, unsigned idx, const struct kvp_config *cfg,
		struct kvp_region_table *regions, struct rte_mempool *msg_pool)
{
	char name[RTE_RING_NAMESIZE];
	int socket = rte_socket_id();

	memset(w, 0, sizeof(*w));
	w->idx = idx;
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
	w->hist = rte_zmalloc_socket("kvp_hist",
				     sizeof(*w->hist) * KVP_HP_MAX * (cfg->npeers ? cfg->npeers : 1),
				     64, socket);
	w->fences = rte_zmalloc_socket("kvp_fences", sizeof(*w->fences) * cfg->max_fences, 64,
				       socket);
	if (!w->xfers || !w->free_idx || !w->segs || !w->sqe_scratch || !w->chans || !w->hist ||
	    !w->fences)
		goto err_free;
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
	if (w->evfd >= 0)
		close(w->evfd);
	w->evfd = -1;
	rte_ring_free(w->inbox);
	rte_ring_free(w->outbox);
	w->inbox = w->outbox = NULL;
	rte_free(w->fences);
	w->fences = NULL;
	rte_free(w->hist);
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

static void
send_main(struct kvp_worker *w, int type, uint16_t peer, uint8_t link, bool outgoing,
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

static void
notify_client(struct kvp_chan *ch)
{
	uint64_t one = 1;

	if (kvp_ring_wakeup_needed(&ch->cq) && write(ch->notify_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is saturated, the client is awake anyway. */
	}
}

/*
 * The client broke the ring protocol: say what, with the values, for the
 * main lcore's log line when it disconnects the client. The first reason wins.
 */
static void __attribute__((format(printf, 2, 3)))
chan_break(struct kvp_chan *ch, const char *fmt, ...)
{
	va_list ap;

	if (ch->broken)
		return;
	ch->broken = true;
	va_start(ap, fmt);
	vsnprintf(ch->broken_why, sizeof(ch->broken_why), fmt, ap);
	va_end(ap);
}

/* kvp_ring_count() refused the SQ producer index the client published. */
static void
sq_prod_broken(struct kvp_chan *ch)
{
	const struct kvp_ring *r = &ch->sq;

	if ((int32_t)(r->bad - r->local) < 0)
		chan_break(ch, "SQ producer index %u is behind the consumer index %u (ring of %u)",
			   r->bad, r->local, r->size);
	else
		chan_break(ch,
			   "SQ producer index %u is %u entries past the consumer index %u (ring of "
			   "%u)",
			   r->bad, r->bad - r->local, r->local, r->size);
}

/* kvp_ring_free() refused the CQ consumer index the client published. */
static void
cq_cons_broken(struct kvp_chan *ch)
{
	const struct kvp_ring *r = &ch->cq;

	int32_t ahead = (int32_t)(r->bad - r->local);

	if (ahead > 0)
		chan_break(ch,
			   "CQ consumer index %u is %d entries past the producer index %u (ring of "
			   "%u)",
			   r->bad, ahead, r->local, r->size);
	else
		chan_break(ch,
			   "CQ consumer index %u moved back (last seen %u, producer index %u, ring "
			   "of %u)",
			   r->bad, r->cached, r->local, r->size);
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
		   x->client, x->user_id,
		   x->peer < w->cfg->npeers ? w->cfg->peers[x->peer].node_id : "?", x->bytes,
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

	if (x->status == KVP_OK && x->peer < w->cfg->npeers) {
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
	c.peer = x->peer;
	c.status = x->status;
	c.user_id = x->user_id;
	c.bytes = x->status == KVP_OK ? x->bytes : 0;
	c.nseg = x->nseg;
	if (x->status == KVP_EINVAL) {
		c.detail = x->detail;
		c.bad_seg = x->bad_seg;
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

bool
chan_post(struct kvp_chan *ch, const struct kvp_cqe *c)
{
	int rc = kvp_ring_enqueue_bulk(&ch->cq, c, 1);

	if (rc < 0) {
		cq_cons_broken(ch);
		return true; /* the client is being dropped; nothing to deliver to */
	}
	if (rc == 0)
		return false;
	notify_client(ch);
	return true;
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

void
kvp_worker_xfer_end(struct kvp_worker *w, struct kvp_xfer *x, int status)
{
	uint64_t now = kvp_mono_ns();

	if (x->status == KVP_OK)
		x->status = status;
	for (uint32_t i = 0; i < x->nseg; i++) {
		if (x->segs[i].src) {
			kvp_region_put(x->segs[i].src);
			x->segs[i].src = NULL;
		}
	}
	KVP_STAT_ADD(w->stats.completions[x->status], 1);
	if (x->status == KVP_OK)
		KVP_STAT_ADD(w->stats.peer[x->peer].tx_xfers, 1);
	if (!x->chan) {
		xfer_free(w, x, now);
		return;
	}
	x->chan->inflight--;
	if (x->chan->backlog_head || !post_done(x, now)) {
		x->ts[KVP_TS_DONE] = 0;
		backlog_push(w, x->chan, x);
		return;
	}
	xfer_free(w, x, now);
}

void
kvp_worker_landed(struct kvp_worker *w, uint16_t peer, uint32_t owner, uint64_t user_id,
		  uint64_t dst_key, uint64_t bytes, uint32_t nseg, uint64_t first_ns)
{
	uint32_t slot = kvp_client_slot(owner);
	struct kvp_chan *ch = slot < w->chan_slots ? w->chans[slot] : NULL;
	bool stats = KVP_STAT_READ(w->cfg->stats_enabled) && peer < w->cfg->npeers;
	uint64_t landed = kvp_mono_ns();
	struct kvp_cqe c;

	KVP_STAT_ADD(w->stats.xfers_landed, 1);
	KVP_STAT_ADD(w->stats.peer[peer].rx_xfers, 1);
	if (first_ns == 0 || first_ns > landed)
		first_ns = landed; /* no payload (or a clock oddity): nothing to time */
	if (stats)
		kvp_hist_record(kvp_worker_hist(w, peer, KVP_HP_RX_RECV), landed - first_ns);
	if (!ch || ch->id != owner || ch->broken)
		return;
	memset(&c, 0, sizeof(c));
	c.kind = KVP_CQE_LANDED;
	c.peer = peer;
	c.status = KVP_OK;
	c.user_id = user_id;
	c.bytes = bytes;
	c.dst_key = dst_key;
	c.nseg = nseg;
	uint64_t delivered = kvp_mono_ns();
	c.phase_ns[KVP_PH_WIRE] = landed - first_ns;
	c.phase_ns[KVP_PH_DELIVER] = delivered - landed;
	c.phase_ns[KVP_PH_TOTAL] = delivered - first_ns;
	int rc = kvp_ring_enqueue_bulk(&ch->cq, &c, 1);
	if (rc < 0) {
		cq_cons_broken(ch);
		return;
	}
	if (rc == 0) {
		/* Landing notices are not owed: count the drop where the client sees it. */
		atomic_fetch_add_explicit(&ch->cq.shm->overflow, 1, memory_order_relaxed);
		return;
	}
	if (stats)
		kvp_hist_record(kvp_worker_hist(w, peer, KVP_HP_RX_DELIVER), delivered - landed);
	notify_client(ch);
}

void
kvp_worker_conn_down(struct kvp_worker *w, uint16_t peer, uint8_t link, bool outgoing,
		     const char *reason)
{
	if (outgoing && w->peer_links[peer] > 0)
		w->peer_links[peer]--;
	KVP_STAT_ADD(w->stats.peer[peer].conn_errors, 1);
	send_main(w, KVP_MSG_CONN_DOWN, peer, link, outgoing, NULL, reason);
}

static void
chan_add(struct kvp_worker *w, struct kvp_chan *ch)
{
	uint32_t slot = kvp_client_slot(ch->id);

	w->chans[slot] = ch;
	w->nchans++;
}

static void
chan_del(struct kvp_worker *w, struct kvp_chan *ch)
{
	uint32_t slot = kvp_client_slot(ch->id);

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
		w->chans[slot] = NULL;
		w->nchans--;
	}
	send_main(w, KVP_MSG_CHAN_GONE, 0, 0, false, ch, NULL);
}

static void cancel_user(struct kvp_worker *w, struct kvp_chan *ch, uint64_t user_id);

int
kvp_worker_inbox(struct kvp_worker *w)
{
	struct kvp_msg *msgs[32];
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
			rc = route_attach(w, m->peer, m->link, m->fd, m->outgoing, m->epoch);
			if (rc < 0) {
				close(m->fd);
				send_main(w, KVP_MSG_CONN_DOWN, m->peer, m->link, m->outgoing, NULL,
					  "transport refused the connection");
			} else if (m->outgoing) {
				w->peer_links[m->peer]++;
			}
			break;
		case KVP_MSG_QUIT:
			w->quit = true;
			break;
		case KVP_MSG_CANCEL: {
			uint32_t slot = kvp_client_slot(m->client);
			struct kvp_chan *ch = slot < w->chan_slots ? w->chans[slot] : NULL;

			if (ch && ch->id == m->client) {
				KVP_STAT_ADD(w->stats.admin_cancels, 1);
				cancel_user(w, ch, m->user_id);
			}
			break;
		}
		default:
			break;
		}
		rte_mempool_put(w->msg_pool, m);
	}
	return (int)n;
}

static void
fail_now(struct kvp_worker *w, struct kvp_xfer *x, int status)
{
	x->state = KVP_XS_ACTIVE;
	kvp_worker_xfer_end(w, x, status);
}

/*
 * Bytes a strided range spans: (count - 1) * stride + len, or 0 if that
 * overflows 64 bits or the stride is smaller than a block.
 */
static uint64_t
span_of(uint64_t count, uint64_t len, uint64_t stride)
{
	if (count == 1)
		return len;
	if (stride < len || count - 1 > (UINT64_MAX - len) / stride)
		return 0;
	return (count - 1) * stride + len;
}

/* Check one descriptor (copied out of the ring) into @p d. @return KVP_OK or a detail code. */
static int
take_segment(struct kvp_worker *w, struct kvp_chan *ch, const struct kvp_sqe_seg2d *s,
	     struct kvp_seg *d)
{
	bool strided = s->op == KVP_OP_SEG2D;
	uint64_t count = strided ? s->count : 1;

	d->src_off = s->src_off;
	d->dst_key = s->dst_key;
	d->dst_off = s->dst_off;
	d->len = s->len;
	d->count = count;
	d->src_stride = strided ? s->src_stride : s->len;
	d->dst_stride = strided ? s->dst_stride : s->len;
	if (s->op != KVP_OP_SEG && s->op != KVP_OP_SEG2D)
		return KVP_INVAL_OP;
	if (s->len == 0)
		return KVP_INVAL_LEN;
	if (s->dst_key == 0)
		return KVP_INVAL_DST;
	if (count == 0 || count > w->cfg->max_blocks)
		return KVP_INVAL_COUNT;
	uint64_t sspan = span_of(count, s->len, d->src_stride);
	uint64_t dspan = span_of(count, s->len, d->dst_stride);
	if (sspan == 0 || dspan == 0)
		return KVP_INVAL_STRIDE;
	if (s->dst_off + dspan < s->dst_off)
		return KVP_INVAL_BOUNDS;
	d->src = kvp_region_get(w->regions, s->src_key);
	/* A client may only send from its own regions. */
	if (!d->src || d->src->owner != ch->id)
		return KVP_INVAL_SRC;
	if (!kvp_region_contains(d->src, s->src_off, sspan))
		return KVP_INVAL_BOUNDS;
	if (count > 1 && d->src_stride == s->len && d->dst_stride == s->len) {
		/* The blocks touch on both sides: one contiguous range. */
		d->len = sspan;
		d->count = 1;
		d->src_stride = d->dst_stride = sspan;
	}
	return KVP_OK;
}

/*
 * Copy and check the segments of one transfer. @return KVP_OK, or KVP_EINVAL
 * with x->detail and x->bad_seg saying what and where.
 */
static int
take_segments(struct kvp_worker *w, struct kvp_chan *ch, struct kvp_xfer *x, uint32_t nseg)
{
	x->nseg = nseg;
	x->bytes = 0;
	for (uint32_t i = 0; i < nseg; i++)
		x->segs[i].src = NULL;
	for (uint32_t i = 0; i < nseg; i++) {
		struct kvp_sqe_seg2d s;

		/* Copy first: the client can rewrite its ring while we look. */
		memcpy(&s, kvp_ring_peek(&ch->sq, 1 + i), sizeof(s));
		int d = take_segment(w, ch, &s, &x->segs[i]);
		if (d != KVP_OK) {
			x->detail = (uint16_t)d;
			x->bad_seg = i;
			return KVP_EINVAL;
		}
		x->bytes += kvp_seg_bytes(&x->segs[i]);
	}
	return KVP_OK;
}

static void
cancel_user(struct kvp_worker *w, struct kvp_chan *ch, uint64_t user_id)
{
	for (uint32_t i = 0; i < w->nxfers; i++) {
		struct kvp_xfer *x = &w->xfers[i];

		if (x->state == KVP_XS_ACTIVE && x->chan == ch && x->user_id == user_id) {
			route_cancel(w, x, KVP_ECANCELED);
			return;
		}
	}
}

/* Complete a submission that never got a slot; false if the CQ has no room. */
static bool
refuse(struct kvp_chan *ch, const struct kvp_sqe_xfer *h, int status)
{
	struct kvp_cqe c;

	memset(&c, 0, sizeof(c));
	c.kind = KVP_CQE_DONE;
	c.peer = h->peer;
	c.status = status;
	c.user_id = h->user_id;
	c.nseg = h->nseg;
	if (kvp_ring_enqueue_bulk(&ch->cq, &c, 1) != 1)
		return false;
	notify_client(ch);
	return true;
}

static int
poll_chan(struct kvp_worker *w, struct kvp_chan *ch, uint64_t now)
{
	int consumed = 0;
	int n = kvp_ring_count(&ch->sq);

	while (n > 0) {
		struct kvp_sqe_xfer h;

		memcpy(&h, kvp_ring_peek(&ch->sq, 0), sizeof(h));
		if (h.op == KVP_OP_CANCEL) {
			kvp_ring_consume(&ch->sq, 1);
			cancel_user(w, ch, h.user_id);
			n--;
			consumed++;
			continue;
		}
		if (h.op == KVP_OP_FENCE) {
			/* Its completion, like a transfer's, must find room in the CQ. */
			int room = kvp_ring_free(&ch->cq);
			if (room < 0) {
				cq_cons_broken(ch);
				return consumed;
			}
			if ((uint32_t)room <= ch->inflight)
				break;
			struct kvp_sqe_fence f;
			memcpy(&f, kvp_ring_peek(&ch->sq, 0), sizeof(f));
			kvp_ring_consume(&ch->sq, 1);
			fence_add(w, ch, &f, now);
			n--;
			consumed++;
			continue;
		}
		/* The client publishes a header and its segments at once. */
		if (h.op != KVP_OP_XFER || h.nseg == 0 || h.nseg > (uint32_t)n - 1) {
			chan_break(ch, "SQ entry at index %u: op %u nseg %u, but %d entries published",
				   ch->sq.local, h.op, h.nseg, n);
			return consumed;
		}
		/* Every in-flight transfer must be able to complete: keep CQ room. */
		int room = kvp_ring_free(&ch->cq);
		if (room < 0) {
			cq_cons_broken(ch);
			return consumed;
		}
		if ((uint32_t)room <= ch->inflight)
			break;
		if (__atomic_load_n(&w->draining, __ATOMIC_RELAXED)) {
			/* Draining: in-flight work finishes, new work is refused at once. */
			if (!refuse(ch, &h, KVP_ESHUTDOWN))
				break;
			kvp_ring_consume(&ch->sq, 1 + h.nseg);
			n -= (int)(1 + h.nseg);
			consumed += (int)(1 + h.nseg);
			KVP_STAT_ADD(w->stats.completions[KVP_ESHUTDOWN], 1);
			KVP_STAT_ADD(w->stats.drain_refused, 1);
			continue;
		}
		if (w->nfree == 0) {
			/* The ring is the admission queue; its head may wait only so long. */
			if (h.submit_ns && now > h.submit_ns &&
			    now - h.submit_ns >
				    (uint64_t)KVP_STAT_READ(w->cfg->admission_timeout_ms) * 1000000 &&
			    refuse(ch, &h, KVP_ENOBUFS)) {
				kvp_ring_consume(&ch->sq, 1 + h.nseg);
				n -= (int)(1 + h.nseg);
				consumed += (int)(1 + h.nseg);
				KVP_STAT_ADD(w->stats.completions[KVP_ENOBUFS], 1);
				continue;
			}
			break;
		}

		struct kvp_xfer *x = &w->xfers[w->free_idx[--w->nfree]];
		if (w->nxfers - w->nfree > w->stats.inflight_hwm)
			KVP_STAT_ADD(w->stats.inflight_hwm, w->nxfers - w->nfree - w->stats.inflight_hwm);
		x->chan = ch;
		x->client = ch->id;
		x->peer = h.peer;
		x->status = KVP_OK;
		x->detail = KVP_INVAL_NONE;
		x->bad_seg = 0;
		x->user_id = h.user_id;
		x->next = NULL;
		x->t_seg = 0;
		x->t_blk = 0;
		x->t_off = 0;
		x->t_frames = 0;
		x->t_state = 0;
		memset(x->ts, 0, sizeof(x->ts));
		/*
		 * The client may have submitted after this poll read the clock:
		 * read it again. A stamp still from the future is no stamp.
		 */
		if (h.submit_ns > now)
			now = kvp_mono_ns();
		x->ts[KVP_TS_SUBMIT] = h.submit_ns <= now ? h.submit_ns : 0;
		x->ts[KVP_TS_PICKUP] = now;
		/* Deadlines run from the client's submit. */
		uint64_t start = x->ts[KVP_TS_SUBMIT] ? x->ts[KVP_TS_SUBMIT] : now;
		x->deadline_ns = kvp_time_after(
			start, h.timeout_ns ? h.timeout_ns
					    : (uint64_t)KVP_STAT_READ(w->cfg->default_timeout_ms) *
						      1000000);
		/* Visible to the admin "transfers" listing once its fields are set. */
		__atomic_store_n(&x->state, KVP_XS_ACTIVE, __ATOMIC_RELEASE);
		ch->inflight++;
		KVP_STAT_ADD(w->stats.xfers_submitted, 1);

		uint32_t nseg = h.nseg;
		int st;
		if (nseg > w->cfg->max_segments) {
			x->nseg = 0;
			x->detail = KVP_INVAL_NSEG;
			st = KVP_EINVAL;
		} else {
			st = take_segments(w, ch, x, nseg);
		}
		kvp_ring_consume(&ch->sq, 1 + nseg);
		n -= (int)(1 + nseg);
		consumed += (int)(1 + nseg);

		if (st == KVP_OK && now >= x->deadline_ns)
			st = KVP_ETIMEDOUT; /* expired while queued in the ring */
		if (st == KVP_OK && h.peer >= w->cfg->npeers)
			st = KVP_ENOPEER;
		if (st == KVP_OK && !w->peer_links[h.peer])
			st = KVP_EPEER;
		if (st != KVP_OK) {
			fail_now(w, x, st);
			continue;
		}
		/* The transport stamps ADMIT, FIRST, POSTED and ACKED as it gets there. */
		if (route_post(w, x) < 0)
			fail_now(w, x, KVP_EPEER);
	}
	if (n < 0)
		sq_prod_broken(ch); /* from kvp_ring_count(): the loop never takes n below 0 */
	return consumed;
}

int
kvp_worker_poll_chans(struct kvp_worker *w)
{
	int work = 0;

	if (w->nchans == 0)
		return 0;
	uint64_t now = kvp_mono_ns();
	for (uint32_t i = 0; i < w->chan_slots; i++) {
		struct kvp_chan *ch = w->chans[i];

		if (ch && !ch->broken)
			work += poll_chan(w, ch, now);
		if (ch && ch->broken && !ch->broken_sent) {
			ch->broken_sent = true;
			send_main(w, KVP_MSG_CHAN_BROKEN, 0, 0, false, ch, ch->broken_why);
		}
	}
	return work;
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
	if (w->nfences)
		work += fence_timers(w, now);
	for (uint32_t i = 0; i < w->chan_slots; i++) {
		struct kvp_chan *ch = w->chans[i];

		if (ch && ch->backlog_head)
			work += drain_backlog(w, ch, now);
	}
	if (w->nfree == w->nxfers)
		return work;
	for (uint32_t i = 0; i < w->nxfers; i++) {
		struct kvp_xfer *x = &w->xfers[i];

		if (x->state == KVP_XS_ACTIVE && now >= x->deadline_ns && x->status == KVP_OK) {
			route_cancel(w, x, KVP_ETIMEDOUT);
			work++;
		}
	}
	return work;
}

/*
 * CQ entries @p ch must have free before the worker can move it on: one
 * for its oldest backlogged completion, else (submissions waiting) one more
 * than its transfers in flight, as poll_chan() keeps; 0 if it needs none.
 */
static uint32_t
cq_room_needed(struct kvp_chan *ch)
{
	if (ch->backlog_head)
		return 1;
	int n = kvp_ring_count(&ch->sq);

	/* An impossible index is work: poll_chan() reports it. */
	if (n < 0)
		return UINT32_MAX;
	return n > 0 ? ch->inflight + 1 : 0;
}

/*
 * Arm one channel's wakeups. A channel stuck on a full CQ is parked: the
 * client rings the worker's doorbell when it reads (room_wakeup), so it
 * costs nothing until then, however long its SQ or backlog.
 * @return false if the channel has work now
 */
static bool
chan_prepare_sleep(struct kvp_chan *ch)
{
	uint32_t want = cq_room_needed(ch);

	if (want == UINT32_MAX)
		return false;
	if (want == 0)
		return kvp_ring_prepare_wait(&ch->sq);
	return kvp_ring_prepare_wait_room(&ch->cq, want);
}

bool
kvp_worker_prepare_sleep(struct kvp_worker *w)
{
	bool ok = true;

	for (uint32_t i = 0; i < w->chan_slots && ok; i++) {
		struct kvp_chan *ch = w->chans[i];

		if (ch && !ch->broken && !chan_prepare_sleep(ch))
			ok = false;
	}
	/* An inbox message also means there is work. */
	if (ok && rte_ring_count(w->inbox) != 0)
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
}
