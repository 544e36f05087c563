/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Submissions: read a client's SQ, check each descriptor (copied out of the
 * shared ring first), admit transfers into the worker's slot table (the ring
 * is the admission queue; its head waits only limits.admission_timeout_ms),
 * refuse while draining, and hand admitted transfers to the transports.
 *
 * Fairness: the worker's clients take turns for slots, one transfer per
 * turn, round the worker's channel list from where the last turn ended, so
 * a client with a deep backlog cannot take every slot that frees while
 * another waits: under overload each of N clients with work waiting gets
 * every N-th slot. Each client's admitted, waited and refused transfers are
 * counted (struct kvp_chan_stats). The worker's lcore only; nothing
 * allocates.
 */
#include <string.h>

#include "kvp_transport.h"
#include "worker_priv.h"

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
	chan_notify(ch);
	return true;
}

/* Refuse the transfer at the head of the SQ and consume it; false if the CQ has no room. */
static bool
refuse_head(struct kvp_worker *w, struct kvp_chan *ch, const struct kvp_sqe_xfer *h, int status,
	    int *n, int *consumed)
{
	if (!refuse(ch, h, status))
		return false;
	ch->head_waited = false;
	if (status == KVP_ENOBUFS)
		KVP_STAT_ADD(ch->stats.refused, 1);
	kvp_ring_consume(&ch->sq, 1 + h->nseg);
	*n -= (int)(1 + h->nseg);
	*consumed += (int)(1 + h->nseg);
	KVP_STAT_ADD(w->stats.completions[status], 1);
	return true;
}

/*
 * Consume @p ch's SQ entries: cancels, fences and (while draining)
 * refusals as far as they go, transfers until @p max_admit of them took a
 * slot (counted in *admitted) or none is free. @return SQ entries consumed
 */
static int
poll_chan(struct kvp_worker *w, struct kvp_chan *ch, uint64_t now, unsigned max_admit,
	  unsigned *admitted)
{
	int consumed = 0;
	int n = kvp_ring_count(&ch->sq);

	while (n > 0 && *admitted < max_admit) {
		struct kvp_sqe_xfer h;

		memcpy(&h, kvp_ring_peek(&ch->sq, 0), sizeof(h));
		if (h.op == KVP_OP_CANCEL) {
			kvp_ring_consume(&ch->sq, 1);
			worker_cancel_user(w, ch, h.user_id);
			n--;
			consumed++;
			continue;
		}
		if (h.op == KVP_OP_FENCE) {
			/* Its completion, like a transfer's, must find room in the CQ. */
			int room = kvp_ring_free(&ch->cq);
			if (room < 0) {
				chan_cq_broken(ch);
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
			chan_cq_broken(ch);
			return consumed;
		}
		if ((uint32_t)room <= ch->inflight)
			break;
		if (__atomic_load_n(&w->draining, __ATOMIC_RELAXED)) {
			/* Draining: in-flight work finishes, new work is refused at once. */
			if (!refuse_head(w, ch, &h, KVP_ESHUTDOWN, &n, &consumed))
				break;
			KVP_STAT_ADD(w->stats.drain_refused, 1);
			continue;
		}
		if (w->nfree == 0) {
			if (!ch->head_waited) {
				ch->head_waited = true;
				KVP_STAT_ADD(ch->stats.waited, 1);
			}
			/* The ring is the admission queue; its head may wait only so long. */
			if (h.submit_ns && now > h.submit_ns &&
			    now - h.submit_ns >
				    (uint64_t)KVP_STAT_READ(w->cfg->admission_timeout_ms) * 1000000 &&
			    refuse_head(w, ch, &h, KVP_ENOBUFS, &n, &consumed))
				continue;
			break;
		}

		struct kvp_xfer *x = &w->xfers[w->free_idx[--w->nfree]];
		if (w->nxfers - w->nfree > w->stats.inflight_hwm)
			KVP_STAT_ADD(w->stats.inflight_hwm, w->nxfers - w->nfree - w->stats.inflight_hwm);
		x->chan = ch;
		x->client = ch->id;
		x->waited = ch->head_waited;
		ch->head_waited = false;
		(*admitted)++;
		KVP_STAT_ADD(ch->stats.admitted, 1);
		x->peer = KVP_PEER_NONE; /* until wpeer_admit() finds the handle's slot open */
		x->handle = h.peer;
		x->tp = 0;
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
		if (st == KVP_OK)
			st = wpeer_admit(w, x, now);
		if (st == WPEER_WAIT)
			continue; /* posted when its peer's first link comes up */
		if (st != KVP_OK) {
			fail_now(w, x, st);
			continue;
		}
		/* The transport stamps ADMIT, FIRST, POSTED and ACKED as it gets there. */
		if (route_post(w, x) < 0)
			fail_now(w, x, KVP_EPEER);
	}
	if (n < 0)
		chan_sq_broken(ch); /* from kvp_ring_count(): the loop never takes n below 0 */
	return consumed;
}

/*
 * Rounds of turns: each channel, from w->rr on, admits at most one transfer
 * per turn; rounds go on while one of them admitted something (and so
 * while slots and work are left: at most nfree + 1 rounds). The next call
 * starts after the channel that took the last slot, so when slots free one
 * at a time they go round the clients with work waiting.
 */
int
kvp_worker_poll_chans(struct kvp_worker *w)
{
	int work = 0;
	bool more = true;

	if (w->nchans == 0)
		return 0;
	uint64_t now = kvp_mono_ns();
	while (more) {
		uint32_t start = w->rr < w->nchans ? w->rr : 0;

		more = false;
		for (uint32_t k = 0; k < w->nchans; k++) {
			uint32_t i = (start + k) % w->nchans;
			struct kvp_chan *ch = w->act[i];
			unsigned admitted = 0;

			if (!ch->broken)
				work += poll_chan(w, ch, now, 1, &admitted);
			if (ch->broken && !ch->broken_sent) {
				ch->broken_sent = true;
				worker_send_main(w, KVP_MSG_CHAN_BROKEN, 0, 0, false, ch, ch->broken_why);
			}
			if (admitted) {
				more = true;
				w->rr = (i + 1) % w->nchans;
			}
		}
	}
	worker_flush_notify(w);
	return work;
}
