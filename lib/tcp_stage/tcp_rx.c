/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * TCP receive side: parse frames out of the staging buffer, land payloads
 * in their destination regions (large ones by direct recv), acknowledge
 * complete transfers and complete acknowledged ones.
 */
#include <errno.h>
#include <string.h>

#include "kvp_guard.h"
#include "tcp_priv.h"

#define MEM_GONE "its memory went away under a receive (a hole punched in its file?)"

int
tcp_start_recv(struct tcp_ctx *t, struct tcp_conn *c)
{
	void *buf;
	size_t len;

	if (c->recv_busy || c->state != CONN_UP)
		return 0;
	if (c->rx_state == RX_DIRECT) {
		buf = c->rx_dst;
		len = c->rx_win < DIRECT_RECV_MAX ? c->rx_win : DIRECT_RECV_MAX;
		/* Direct mode starts with rxbuf drained (tcp_process_rx). */
		c->rx_start = c->rx_end = 0;
	} else {
		if (c->rx_start == c->rx_end) {
			c->rx_start = c->rx_end = 0;
		} else if (c->rx_start > 0 && c->rx_cap - c->rx_end < sizeof(struct kvp_wire_hdr)) {
			memmove(c->rxbuf, c->rxbuf + c->rx_start, c->rx_end - c->rx_start);
			c->rx_end -= c->rx_start;
			c->rx_start = 0;
		}
		if (c->rx_end == c->rx_cap)
			return 0; /* stalled until the parser frees room */
		buf = c->rxbuf + c->rx_end;
		len = c->rx_cap - c->rx_end;
		/*
		 * The socket ran dry last time: what comes next is likely the
		 * first frame of a transfer. Read its header and a little, so
		 * a large payload lands by direct recv instead of through
		 * rxbuf and a copy (64 KiB one at a time: 0.7 us less).
		 */
		if (c->rx_drained && c->rx_end == 0 && len > RECV_NEXT_LEN)
			len = RECV_NEXT_LEN;
	}
	struct io_uring_sqe *sqe = tcp_sqe(t);
	if (!sqe)
		return 0;
	/*
	 * Into rxbuf (registered) by read_fixed. Payload windows, staged or
	 * not, by recv with WAITALL: read_fixed has no WAITALL, and the
	 * completions of its short reads cost more than pinning saves.
	 */
	if (c->fixed && c->rx_state != RX_DIRECT)
		io_uring_prep_read_fixed(sqe, c->fd, buf, (unsigned)len, 0, c->id);
	else
		io_uring_prep_recv(sqe, c->fd, buf, len, c->rx_state == RX_DIRECT ? MSG_WAITALL : 0);
	io_uring_sqe_set_data64(sqe, tcp_udata(c, UOP_RECV));
	c->recv_busy = true;
	c->recv_direct = c->rx_state == RX_DIRECT;
	c->rx_asked = (uint32_t)len;
	c->ops++;
	if (c->rx_state != RX_DIRECT || len < c->rx_win)
		return 1;
	/*
	 * The next header is read by a recv linked behind the payload's, so
	 * the kernel starts it without a round trip through this loop. It is
	 * kept short: after a large payload the next frame is likely large
	 * too, and its payload should land directly, not through rxbuf. A
	 * failed or short payload recv cancels it.
	 */
	/*
	 * Only from this SQ: tcp_sqe() would submit the payload's recv unlinked
	 * to make room, and two recvs of one socket in flight unordered can
	 * take each other's bytes.
	 */
	if (io_uring_sq_space_left(&t->ring) == 0)
		return 1;
	struct io_uring_sqe *next = tcp_sqe(t);
	if (!next)
		return 1;
	sqe->flags |= IOSQE_IO_LINK;
	unsigned nlen = c->rx_cap < RECV_NEXT_LEN ? c->rx_cap : RECV_NEXT_LEN;
	if (c->fixed)
		io_uring_prep_read_fixed(next, c->fd, c->rxbuf, nlen, 0, c->id);
	else
		io_uring_prep_recv(next, c->fd, c->rxbuf, nlen, 0);
	io_uring_sqe_set_data64(next, tcp_udata(c, UOP_RECV_NEXT));
	c->recv_next = true;
	c->ops++;
	return 1;
}

static void
body_done(struct tcp_ctx *t, struct tcp_conn *c)
{
	if (c->rx_stage >= 0) {
		stage_put(&t->stage, &t->w->stats, c->rx_stage);
		c->rx_stage = -1;
	}
	if (c->rx_region) {
		kvp_region_put(c->rx_region);
		c->rx_region = NULL;
	}
	c->rx_state = RX_HDR;
}

/* The transfer's landing ends here: the rest of its payload is read and dropped. */
static void
body_drop(struct tcp_ctx *t, struct tcp_conn *c)
{
	uint64_t left = c->rx_left;

	body_done(t, c);
	c->rx_left = left;
	c->rx_state = left ? RX_DISCARD : RX_HDR;
}

/*
 * A fence refuses the rest of the payload being received: nothing more of
 * it goes to the region (nor a staged window's copy); the rest is read and
 * dropped.
 */
static void
body_fenced(struct tcp_ctx *t, struct tcp_conn *c)
{
	kvp_worker_fenced(t->w, c->rx_ent->owner, c->rx_ent->user_id, c->rx_left, 0);
	body_drop(t, c);
}

/*
 * The payload cannot land: the region's memory is gone under it (a hole
 * punched in its file: kvp_guard_copy(), or -EFAULT from a recv into it),
 * or a staged window's copy failed. The transfer is refused and the rest
 * of the payload is read and dropped; the link and every other transfer on
 * it go on.
 */
static void
body_faulted(struct tcp_ctx *t, struct tcp_conn *c, const char *why)
{
	if (c->rx_ent->fenced) {
		body_fenced(t, c); /* refused already: counted as the fence's */
		return;
	}
	KVP_LOG_RL(ERR, tcp, "peer %u: region %016" PRIx64 ": %s: transfer refused", c->peer,
		   c->rx_hdr.key, why);
	c->rx_ent->status = KVP_EREMOTE;
	body_drop(t, c);
}

/*
 * Open the next window: for a payload landing in place, the rest of the
 * current block (DATA: the whole payload); for a staged one, as much as the
 * staging buffer holds.
 */
static void
open_window(struct tcp_ctx *t, struct tcp_conn *c)
{
	if (c->rx_stage >= 0) {
		c->rx_dst = stage_buf(&t->stage, c->rx_stage);
		c->rx_win = c->rx_left < t->stage.buf_size ? c->rx_left : t->stage.buf_size;
		return;
	}
	uint64_t blk = c->rx_pos / c->rx_blk, in = c->rx_pos % c->rx_blk;

	c->rx_dst = c->rx_region->base + c->rx_off + blk * c->rx_stride + in;
	c->rx_win = c->rx_blk - in < c->rx_left ? c->rx_blk - in : c->rx_left;
}

/*
 * A staging buffer holds @p n packed payload bytes from rx_pos on: copy them
 * to their blocks in the region (whole blocks in one 2-D copy).
 */
static int
land_staged(struct tcp_conn *c, const uint8_t *src, uint64_t n)
{
	while (n) {
		uint64_t blk = c->rx_pos / c->rx_blk, in = c->rx_pos % c->rx_blk;
		uint64_t dst = c->rx_off + blk * c->rx_stride + in, run;
		int rc;

		if (in == 0 && n >= 2 * c->rx_blk) {
			uint64_t rows = n / c->rx_blk;

			run = rows * c->rx_blk;
			rc = kvp_copy_from_host(c->rx_region, dst, c->rx_stride, src, c->rx_blk, rows);
		} else {
			run = c->rx_blk - in < n ? c->rx_blk - in : n;
			rc = kvp_copy_from_host(c->rx_region, dst, run, src, run, 1);
		}
		if (rc < 0)
			return rc;
		c->rx_pos += run;
		src += run;
		n -= run;
	}
	return 0;
}

/*
 * The window at rx_dst is full. A staged one is copied to the region; then
 * the payload is done, or the next window opens.
 */
static void
window_full(struct tcp_ctx *t, struct tcp_conn *c)
{
	if (c->rx_ent->fenced) {
		body_fenced(t, c);
		return;
	}
	if (c->rx_stage >= 0) {
		uint8_t *buf = stage_buf(&t->stage, c->rx_stage);

		if (land_staged(c, buf, (uint64_t)(c->rx_dst - buf)) < 0) {
			/* Later windows would land at offsets this one did not reach. */
			body_faulted(t, c, "a staged window's copy into it failed");
			return;
		}
	}
	if (c->rx_left == 0) {
		body_done(t, c);
		return;
	}
	open_window(t, c);
	if (c->rx_state == RX_DIRECT)
		c->rx_state = RX_BODY;
}

/* Account for @p n payload bytes that have just landed at rx_dst. */
static void
landed(struct tcp_ctx *t, struct tcp_conn *c, uint64_t n)
{
	KVP_STAT_ADD(t->w->stats.peer[c->peer].rx_bytes, n);
	c->rx_dst += n;
	c->rx_left -= n;
	c->rx_win -= n;
	c->rx_ent->bytes += n;
	if (c->rx_stage < 0)
		c->rx_pos += n;
	if (c->rx_win == 0)
		window_full(t, c);
	else if (c->rx_ent->fenced)
		body_fenced(t, c); /* fenced while this recv was in flight: it was the last */
}

/* @p n bytes arrived in rxbuf; a body waiting for a direct recv takes them first. */
static void
rxbuf_filled(struct tcp_conn *c, int n)
{
	c->rx_end += (uint32_t)n;
	if (c->rx_state == RX_DIRECT)
		c->rx_state = RX_BODY;
}

/* A recv completed: the one in flight (@p next false) or the one linked behind it. */
void
tcp_recv_done(struct tcp_ctx *t, struct tcp_conn *c, int res, bool next)
{
	if (next)
		c->recv_next = false;
	c->recv_busy = c->recv_next; /* the linked recv, if any, is still to come */
	/* Linked recv cancelled: the payload recv before it fell short; the loop asks again. */
	if (c->state != CONN_UP || (next && res == -ECANCELED))
		return;
	if (res == -EFAULT && !next && c->recv_direct && c->rx_stage < 0 && c->rx_region) {
		body_faulted(t, c, MEM_GONE); /* nothing read: the payload is still in the socket */
		return;
	}
	if (res <= 0) {
		tcp_conn_fail(t, c, res == 0 ? "closed by peer" : strerror(-res));
		return;
	}
	c->last_rx_ns = kvp_mono_ns();
	if (!next && c->recv_direct) {
		landed(t, c, (uint64_t)res);
	} else {
		c->rx_drained = (uint32_t)res < (next ? RECV_NEXT_LEN : c->rx_asked);
		rxbuf_filled(c, res);
	}
}

/* @return false if the payload must wait for a receive staging buffer. */
static bool
on_data(struct tcp_ctx *t, struct tcp_conn *c, const struct kvp_wire_hdr *h)
{
	struct rx_entry *e = &c->rxt[h->tag & c->rxt_mask];
	/* DATA2D: len / aux2 blocks of aux2 bytes, rsvd apart (kvp_wire_check() vouched for it). */
	bool two_d = h->type == KVP_W_DATA2D;
	uint64_t blk = two_d ? h->aux2 : h->len, stride = two_d ? h->rsvd : h->len;
	uint64_t span = (h->len / blk - 1) * stride + blk;

	c->rx_held = false;
	if (e->tag != h->tag) {
		e->tag = h->tag;
		e->bytes = 0;
		e->status = KVP_OK;
		e->fenced = false;
		e->first_ns = c->last_rx_ns; /* when the bytes holding this header arrived */
	}
	e->user_id = h->aux;
	c->rx_ent = e;
	if (e->fenced) {
		kvp_worker_fenced(t->w, e->owner, e->user_id, h->len, 0); /* counted */
	} else if (e->status == KVP_OK) {
		struct kvp_region *r = kvp_region_get(t->w->regions, h->key);

		if (r)
			e->owner = r->owner;
		if (r && kvp_worker_fenced(t->w, r->owner, h->aux, h->len, 1)) {
			kvp_region_put(r);
			e->fenced = true;
			e->status = KVP_EREMOTE;
		} else if (r && kvp_region_contains(r, h->off, span)) {
			if (r->flags & KVP_REGION_F_STAGE) {
				/* No buffer: leave the header unread; TCP pushes back on the sender. */
				c->rx_stage = stage_get(&t->stage, &t->w->stats, STAGE_RX);
				if (c->rx_stage < 0) {
					kvp_region_put(r);
					c->rx_held = true; /* see liveness() */
					return false;
				}
			}
			c->rx_region = r;
			c->rx_state = RX_BODY;
			c->rx_off = h->off;
			c->rx_blk = blk;
			c->rx_stride = stride;
			c->rx_pos = 0;
			open_window(t, c);
			return true;
		} else {
			if (r)
				kvp_region_put(r);
			KVP_LOG_RL(WARNING, tcp, "peer %u: data for unknown region %016" PRIx64
				   " or out of bounds (off %" PRIu64 " span %" PRIu64 "): refused",
				   c->peer, h->key, h->off, span);
			e->status = KVP_EREMOTE;
		}
	}
	c->rx_state = RX_DISCARD;
	return true;
}

static void
on_end(struct tcp_ctx *t, struct tcp_conn *c, const struct kvp_wire_hdr *h)
{
	struct rx_entry *e = &c->rxt[h->tag & c->rxt_mask];
	int status = e->tag == h->tag ? e->status : KVP_EREMOTE;

	if (status == KVP_OK && e->bytes != h->off)
		status = KVP_EREMOTE;
	if (status == KVP_OK) {
		struct kvp_region *r = kvp_region_get(t->w->regions, h->key);

		if (r) {
			uint32_t owner = r->owner;

			kvp_region_put(r);
			/*
			 * Every byte came before a fence that now matches, but the
			 * END after it: the fence may have completed already, and
			 * its client must see no landing after that. Refused.
			 */
			if (kvp_worker_fenced(t->w, owner, h->aux, 0, 1))
				status = KVP_EREMOTE;
			else
				kvp_worker_landed(t->w, c->peer, owner, h->aux, h->key, e->bytes,
						  h->aux2, e->first_ns);
		} else {
			status = KVP_EREMOTE; /* deregistered while landing */
		}
	}
	e->tag = 0;
	tcp_queue_ctrl(c, KVP_W_ACK, h->tag, (uint64_t)status);
}

/*
 * A frame for the peer control channel: a control frame (checked, payload
 * whole), the ACK of a transfer another transport owns, an ABORT. Without
 * a subscriber a control frame is answered UNSUPPORTED (never one itself).
 * @return false if the connection failed
 */
static bool
ctl_frame(struct tcp_ctx *t, struct tcp_conn *c, const struct kvp_wire_hdr *h, const void *payload)
{
	struct kvp_peer_stats *ps = &t->w->stats.peer[c->peer];
	int rc = kvp_pchan_deliver(t->w, c->peer, c->outgoing, h, payload);

	if (rc == -ENOTSUP) {
		if (kvp_wire_is_ctl(h->type) && h->type != KVP_W_UNSUPPORTED)
			tcp_queue_ctrl(c, KVP_W_UNSUPPORTED, 0, h->type);
		return true;
	}
	if (rc < 0) {
		KVP_STAT_ADD(ps->bad_frames, 1);
		tcp_conn_fail(t, c, "bad peer control frame");
		return false;
	}
	return true;
}

static void
on_ack(struct tcp_ctx *t, struct tcp_conn *c, const struct kvp_wire_hdr *h)
{
	struct kvp_xfer *x = kvp_worker_xfer_of(t->w, h->tag);

	if (x && x->tp != t->idx) {
		ctl_frame(t, c, h, NULL); /* another transport's transfer */
		return;
	}
	/* Tags are this node's, not the peer's: only the link that carried a transfer ends it. */
	if (x && (x->peer != c->peer || x->t_conn != c->id)) {
		if (x->peer != c->peer) {
			KVP_STAT_ADD(t->w->stats.peer[c->peer].bad_frames, 1);
			KVP_LOG_RL(WARNING, tcp,
				   "peer %u: ACK for tag %016" PRIx64 " sent to peer %u: ignored",
				   c->peer, h->tag, x->peer);
		}
		return;
	}
	/* A stale tag is a transfer that already ended (cancelled, timed out). */
	if (x && x->t_state == TX_DRAIN) {
		x->t_acked = true; /* its last frame's ACK overtook that frame's send completion */
		return;
	}
	if (!x || (x->t_state != TX_WAIT_ACK && x->t_state != TX_FRAMED))
		return;
	x->ts[KVP_TS_ACKED] = kvp_mono_ns();
	if (x->t_state == TX_FRAMED) {
		/*
		 * The ACK overtook the completion of the send that carried END,
		 * or a peer acknowledged what it cannot have had: either way
		 * the transfer ends once its END is the kernel's
		 * (tcp_ack_posted()), so that no frame of it still queued
		 * reads a region its end lets go.
		 */
		x->t_acked = true;
		x->status = h->aux == KVP_OK ? KVP_OK : KVP_EREMOTE;
		return;
	}
	tcp_ack_posted(t, x, h->aux == KVP_OK ? KVP_OK : KVP_EREMOTE);
}

/* Check a header against the wire rules and this connection's direction; fails it if bad. */
static bool
hdr_ok(struct tcp_ctx *t, struct tcp_conn *c, const struct kvp_wire_hdr *h)
{
	struct kvp_peer_stats *ps = &t->w->stats.peer[c->peer];
	int rc = kvp_wire_check(h, t->frame_max);

	if (rc < 0 || h->type == KVP_W_HELLO || (h->type == KVP_W_ACK && !c->outgoing) ||
	    (is_data(h->type) && c->outgoing)) {
		KVP_STAT_ADD(ps->bad_frames, 1);
		tcp_conn_fail(t, c, rc < 0 ? "malformed frame" : "unexpected frame type");
		return false;
	}
	return true;
}

/* Handle one header; false if it must wait (no room to answer) or the connection failed. */
static bool
on_header(struct tcp_ctx *t, struct tcp_conn *c, const struct kvp_wire_hdr *h)
{
	struct kvp_peer_stats *ps = &t->w->stats.peer[c->peer];

	if (!hdr_ok(t, c, h))
		return false;
	if ((h->type == KVP_W_END || (h->type == KVP_W_PING && !(h->aux & KVP_PING_RXWAIT)) ||
	     (h->type == KVP_W_ABORT && (h->rsvd & KVP_ABORT_F_ACK))) &&
	    txq_room(c) == 0)
		return false;
	if (is_data(h->type)) {
		bool held = c->rx_held;

		c->rx_left = h->len;
		if (!on_data(t, c, h))
			return false;
		if (held)
			c->last_rx_ns =
				kvp_mono_ns(); /* the hold is over: the rest is due from now */
		KVP_STAT_ADD(ps->rx_frames, 1);
		return true;
	}
	KVP_STAT_ADD(ps->rx_frames, 1);
	switch (h->type) {
	case KVP_W_END:
		on_end(t, c, h);
		break;
	case KVP_W_ACK:
		on_ack(t, c, h);
		break;
	case KVP_W_ABORT:
		if (c->rxt[h->tag & c->rxt_mask].tag == h->tag)
			c->rxt[h->tag & c->rxt_mask].tag = 0;
		/* Every earlier byte of the tag has been handled: the sender may complete. */
		if (h->rsvd & KVP_ABORT_F_ACK)
			tcp_queue_ctrl(c, KVP_W_ACK, h->tag, KVP_ECANCELED);
		return c->slot != 0 || ctl_frame(t, c, h, NULL); /* e.g. an RDMA grant to free */
	case KVP_W_PING:
		if (!(h->aux & KVP_PING_RXWAIT))
			tcp_queue_ctrl(c, KVP_W_PONG, h->tag, 0);
		else if (c->outgoing)
			c->send_ok_ns = kvp_mono_ns(); /* our bytes wait for its staging buffer */
		break;
	default:
		break;
	}
	return true;
}

int
tcp_process_rx(struct tcp_ctx *t, struct tcp_conn *c)
{
	int work = 0;

	while (c->state == CONN_UP) {
		uint32_t avail = c->rx_end - c->rx_start;
		uint32_t n;

		switch (c->rx_state) {
		case RX_HDR: {
			struct kvp_wire_hdr h;

			if (avail < sizeof(h))
				return work;
			memcpy(&h, c->rxbuf + c->rx_start, sizeof(h));
			if (kvp_wire_is_ctl(h.type) && h.len <= KVP_PCHAN_PAYLOAD) {
				/*
				 * Small fixed payload: handled whole, from the buffer,
				 * with room kept for an answer (UNSUPPORTED).
				 */
				if (avail < sizeof(h) + h.len || txq_room(c) == 0)
					return work;
				if (!hdr_ok(t, c, &h))
					return work;
				KVP_STAT_ADD(t->w->stats.peer[c->peer].rx_frames, 1);
				/*
				 * Control frames travel on slot 0 (in order). Elsewhere they
				 * come from a peer's worker that has no namesake here (the
				 * peer runs more workers): nobody takes them.
				 */
				if (c->slot != 0) {
					if (h.type != KVP_W_UNSUPPORTED)
						tcp_queue_ctrl(c, KVP_W_UNSUPPORTED, 0, h.type);
				} else if (!ctl_frame(t, c, &h,
						      h.len ? c->rxbuf + c->rx_start + sizeof(h) : NULL)) {
					return work;
				}
				c->rx_start += sizeof(h) + h.len;
				work++;
				break;
			}
			if (!on_header(t, c, &h))
				return work;
			c->rx_start += sizeof(h);
			c->rx_hdr = h;
			work++;
			break;
		}
		case RX_BODY:
			n = avail < c->rx_win ? avail : (uint32_t)c->rx_win;
			if (c->rx_stage >= 0) {
				memcpy(c->rx_dst, c->rxbuf + c->rx_start, n);
			} else if (kvp_guard_copy(c->rx_dst, c->rxbuf + c->rx_start, n) < 0) {
				/* These n bytes are dropped with the rest. */
				body_faulted(t, c, MEM_GONE);
				work++;
				break;
			}
			c->rx_start += n;
			landed(t, c, n);
			if (c->rx_state == RX_BODY && c->rx_start == c->rx_end) {
				/*
				 * The rest of the window comes straight from the
				 * socket, once no recv into rxbuf is in flight: a
				 * large window, or the rest of a large contiguous
				 * payload whose first bytes came with its header
				 * (after a drained socket that recv was kept short,
				 * tcp_start_recv()).
				 */
				if ((c->rx_win >= DIRECT_RECV_MIN ||
				     (c->rx_hdr.type == KVP_W_DATA && c->rx_hdr.len >= DIRECT_RECV_MIN &&
				      c->rx_win >= RECV_NEXT_LEN)) &&
				    !c->recv_busy)
					c->rx_state = RX_DIRECT;
				return work + 1;
			}
			work++;
			break;
		case RX_DISCARD:
			n = avail < c->rx_left ? avail : (uint32_t)c->rx_left;
			c->rx_start += n;
			c->rx_left -= n;
			if (c->rx_left == 0)
				c->rx_state = RX_HDR;
			else if (n == 0)
				return work;
			work++;
			break;
		default: /* RX_DIRECT: the recv in flight owns the data */
			return work;
		}
	}
	return work;
}

/*
 * Fence @p f: payloads now being received for its transfers stop landing.
 * One whose recv into the region is in flight lands that recv's bytes (at
 * most DIRECT_RECV_MAX) and is counted until it returns; forced, its
 * connection is shut down so that it returns at once.
 */
uint32_t
tcp_rx_fence(struct tcp_ctx *t, const struct kvp_fence *f, bool force)
{
	uint32_t busy = 0;

	for (uint32_t i = 0; i < t->nlive; i++) {
		struct tcp_conn *c = &t->conns[t->live[i]];

		if (c->outgoing || c->state == CONN_FREE || !c->rx_region ||
		    (c->rx_state != RX_BODY && c->rx_state != RX_DIRECT) ||
		    !kvp_fence_match(f, c->rx_region->owner, c->rx_ent->user_id))
			continue;
		if (!c->rx_ent->fenced) {
			c->rx_ent->fenced = true;
			c->rx_ent->status = KVP_EREMOTE;
			KVP_STAT_ADD(t->w->stats.fenced_xfers, 1);
		}
		if (c->recv_busy && c->recv_direct) {
			/* A recv into a staging buffer is harmless (its copy is skipped), but the
			 * buffer is its own until it returns: landed() ends the body then. */
			if (c->rx_stage >= 0)
				continue;
			if (force)
				tcp_conn_fail(t, c, "fence forced: a receive into the region did not end");
			busy++;
			continue;
		}
		if (c->state == CONN_UP)
			body_fenced(t, c);
	}
	return busy;
}

void
tcp_rx_reset(struct tcp_ctx *t, struct tcp_conn *c)
{
	body_done(t, c);
	c->rx_start = c->rx_end = 0;
	c->recv_busy = c->recv_next = false;
	c->rx_drained = false;
	c->rx_left = 0;
}
