/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * TCP send side: turn transfers into frames (large segments split at
 * frame_max, small contiguous ones coalesced), gather queued frames into one
 * sendmsg per connection, and account for what the kernel took.
 *
 * Framing runs at most FRAME_AHEAD bytes ahead of the wire and takes turns
 * among the clients whose transfers wait on the connection: a round gives
 * each of them up to FILL_QUANTUM bytes of frames (its transfers in the
 * order they came), so a client with a deep backlog does not queue
 * gigabytes in front of another's transfer, and staging buffers go to the
 * clients in turn (stage_get_tx()).
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "kvp_guard.h"
#include "tcp_priv.h"

/*
 * Gathers stop once they hold this much: 1 MiB sendmsgs still fill the
 * link. On a 2-vCPU VM a 1 MiB transfer whose END rode in the DATA's
 * sendmsg took twice as long (loopback p50 316-602 -> 183-232 us with the
 * END sent on its own); a 16-CPU host saw no difference either way.
 */
#define SEND_GATHER_MAX (1u << 20)
/* Bytes of frames a client may queue per round: one largest frame. */
#define FILL_QUANTUM(t) ((uint64_t)(t)->frame_max)
/* Payload framed and not yet sent, per connection: a gather in flight and the next one. */
#define FRAME_AHEAD(t) (2 * (uint64_t)(t)->frame_max > (1u << 20) ? 2 * (uint64_t)(t)->frame_max \
								 : (1u << 20))

static inline struct tx_frame *
frame_at(struct tcp_conn *c, uint32_t i)
{
	return &c->txq[i & c->txq_mask];
}

static inline uint64_t
frame_bytes(const struct tx_frame *f)
{
	return sizeof(f->hdr) + (f->payload || f->pad ? f->hdr.len : 0);
}

/* What a padded frame sends in place of its payload, this much per send at most. */
#define PAD_BYTES (64u << 10)
static const uint8_t pad_zeros[PAD_BYTES];

static struct tx_frame *
push_frame(struct tcp_conn *c, uint8_t type, uint32_t len, uint64_t tag, uint32_t xfer)
{
	struct tx_frame *f = frame_at(c, c->tx_tail++);

	kvp_wire_hdr_init(&f->hdr, type, len, tag);
	f->payload = NULL;
	f->xfer = xfer;
	f->stage = -1;
	f->nblk = 0;
	f->owner = UINT16_MAX;
	f->pad = false;
	return f;
}

/* A sent, dropped or aborted frame gives its staging buffer back to its client's share. */
static void
frame_unstage(struct tcp_ctx *t, struct tx_frame *f)
{
	if (f->stage < 0)
		return;
	stage_put_tx(&t->stage, &t->w->stats, f->stage, f->owner);
	f->stage = -1;
}

/* iovecs f's payload takes. */
static inline uint32_t
payload_iovs(const struct tx_frame *f)
{
	return f->pad ? 1 : !f->payload ? 0 : f->nblk > 1 ? f->nblk : 1;
}

/* The iovecs of f's payload from byte @p skip on (a pad's next PAD_BYTES at most). @return how many */
static uint32_t
payload_iov(const struct tx_frame *f, uint32_t skip, struct iovec *iov)
{
	if (f->pad) {
		iov->iov_base = (void *)pad_zeros;
		iov->iov_len = f->hdr.len - skip < PAD_BYTES ? f->hdr.len - skip : PAD_BYTES;
		return 1;
	}
	if (f->nblk <= 1) {
		iov->iov_base = f->payload + skip;
		iov->iov_len = f->hdr.len - skip;
		return 1;
	}
	uint32_t n = 0;

	for (uint32_t b = skip / f->blk, in = skip % f->blk; b < f->nblk; b++, in = 0) {
		iov[n].iov_base = f->payload + b * f->sstride + in;
		iov[n++].iov_len = f->blk - in;
	}
	return n;
}

bool
tcp_queue_ctrl(struct tcp_conn *c, uint8_t type, uint64_t tag, uint64_t aux)
{
	if (c->state != CONN_UP || txq_room(c) == 0)
		return false;
	push_frame(c, type, 0, tag, NO_XFER)->hdr.aux = aux;
	return true;
}

bool
tcp_queue_frame(struct tcp_conn *c, const struct kvp_wire_hdr *h, const void *payload)
{
	if (c->state != CONN_UP || txq_room(c) == 0)
		return false;
	struct tx_frame *f = push_frame(c, h->type, h->len, h->tag, NO_XFER);

	f->hdr = *h;
	if (h->len) {
		memcpy(f->inl, payload, h->len);
		f->payload = f->inl;
	}
	return true;
}

/*
 * Queue the next DATA (or DATA2D) frame of x, as the planner cuts it:
 * zero-copy from the source region (the blocks of a strided source gathered
 * by the send's iovec), or, for a region that must be staged, copied into a
 * staging buffer first (one 2-D copy for a strided piece).
 * @return false if the frame needs a staging buffer and none is free.
 */
static bool
frame_data(struct tcp_ctx *t, struct tcp_conn *c, struct kvp_xfer *x)
{
	const struct kvp_seg *s = &x->segs[x->t_seg];
	bool strided = s->count > 1 && s->src_stride != s->len;
	/*
	 * Small strided blocks are gathered by a copy into a staging buffer:
	 * an iovec each would cut sends to iov_max blocks (measured: 256-byte
	 * head slices at a third of the contiguous rate).
	 */
	bool must_stage = (s->src->flags & KVP_REGION_F_STAGE) != 0;
	bool staged = must_stage || (strided && s->len < GATHER_IOV_MIN);
	int32_t b = -1;

	uint16_t owner = (uint16_t)kvp_client_slot(x->client);

	if (staged) {
		b = stage_get_tx(&t->stage, &t->w->stats, owner, must_stage);
		/* Host memory never waits for a buffer: its blocks go by iovec then. */
		if (b < 0 && must_stage) {
			kvp_worker_xfer_waited(x);
			return false;
		}
		staged = b >= 0;
	}
	uint64_t limit = staged && t->stage.buf_size < t->frame_max ? t->stage.buf_size
								       : t->frame_max;
	/* A gathered payload takes one iovec per block; its header one more. */
	uint64_t max_blocks = !staged && strided ? t->iov_max - 2 : UINT64_MAX;
	/* DATA2D carries its stride and block in 32 bits. */
	if (s->count > 1 && (s->dst_stride > UINT32_MAX || s->len > UINT32_MAX))
		max_blocks = 1;
	struct kvp_piece p;
	kvp_plan_next(x, limit, max_blocks, 0, &p);
	uint64_t bytes = p.len * p.nblk;
	bool scatter = p.nblk > 1 && p.dst_stride != p.len;
	bool gather = p.nblk > 1 && p.src_stride != p.len;
	/* Window and buffer granted for the first time: the transfer is admitted. */
	if (!x->ts[KVP_TS_ADMIT])
		x->ts[KVP_TS_ADMIT] = kvp_mono_ns();
	struct tx_frame *f = push_frame(c, scatter ? KVP_W_DATA2D : KVP_W_DATA, (uint32_t)bytes,
					kvp_xfer_tag(x), x->idx);
	f->hdr.key = p.seg->dst_key;
	f->hdr.off = p.dst_off;
	f->hdr.aux = x->user_id; /* the receiver's fences match it */
	if (scatter) {
		f->hdr.aux2 = (uint32_t)p.len;
		f->hdr.rsvd = (uint32_t)p.dst_stride;
	}
	c->framed += bytes;
	if (staged) {
		bool async = false;

		f->stage = b;
		f->owner = owner;
		f->payload = stage_buf(&t->stage, b);
		/* Started now, waited for once per pass (tcp_fill_tx), before anything is sent. */
		int rc = kvp_copy_to_host(f->payload, p.seg->src, p.src_off, p.src_stride, p.len,
					  p.nblk, &async);
		t->copies |= async;
		t->copy_failed |= rc < 0;
	} else {
		f->payload = p.seg->src->base + p.src_off;
		if (gather) {
			f->nblk = (uint32_t)p.nblk;
			f->blk = (uint32_t)p.len;
			f->sstride = p.src_stride;
		}
	}
	x->t_frames++;
	return true;
}

/* Nothing of @p x framed yet (a strided one is between blocks at t_off 0, t_blk > 0). */
static bool
never_framed(const struct kvp_xfer *x)
{
	return x->t_frames == 0 && x->t_seg == 0 && x->t_blk == 0 && x->t_off == 0;
}

/* Unlink @p x, which follows @p prev (NULL: the head), from the pending list. */
static void
pend_unlink(struct tcp_conn *c, struct kvp_xfer *prev, struct kvp_xfer *x)
{
	if (prev)
		prev->next = x->next;
	else
		c->pend_head = x->next;
	if (c->pend_tail == x)
		c->pend_tail = prev;
	x->next = NULL;
}

/*
 * The staging copies of this pass are done (or one failed): a transfer
 * whose data may be wrong is cancelled, which turns its queued frames —
 * none sent yet — into ABORTs.
 */
static void
copies_done(struct tcp_ctx *t, struct tcp_conn *c, uint32_t pass_start)
{
	if (t->copies && kvp_memops->sync() < 0)
		t->copy_failed = true;
	t->copies = false;
	if (!t->copy_failed)
		return;
	t->copy_failed = false;
	KVP_LOG_RL(ERR, tcp,
		   "peer %u: staging copy out of a region failed (GPU, or host memory gone "
		   "under it): its transfers fail",
		   c->peer);
	for (uint32_t i = pass_start; i != c->tx_tail; i++) {
		struct tx_frame *f = frame_at(c, i);

		if (f->stage < 0 || f->xfer == NO_XFER)
			continue;
		struct kvp_xfer *x = &t->w->xfers[f->xfer];
		if (x->state == KVP_XS_ACTIVE && kvp_xfer_tag(x) == f->hdr.tag && x->status == KVP_OK)
			tcp_tx_cancel(t, c, x, KVP_EINVAL);
	}
}

/* Room to frame more on @p c: one txq slot stays free so a transfer's END or ABORT always fits. */
static inline bool
fill_room(const struct tcp_ctx *t, const struct tcp_conn *c)
{
	return txq_room(c) >= 2 && c->framed < FRAME_AHEAD(t);
}

/*
 * Frame @p x (of client @p slot) until it is framed, its client's quantum
 * of this round is used, or there is no room. @return false if it is
 * unlinked (framed, or cancelled and aborted)
 */
static bool
fill_xfer(struct tcp_ctx *t, struct tcp_conn *c, struct kvp_xfer *prev, struct kvp_xfer *x,
	  uint32_t slot, int *work)
{
	if (x->status != KVP_OK) {
		/* Cancelled mid-framing: tell the receiver to forget the tag. */
		c->unsent -= kvp_plan_left(x);
		push_frame(c, KVP_W_ABORT, 0, kvp_xfer_tag(x), x->idx)->hdr.rsvd = KVP_ABORT_F_ACK;
		x->t_frames++;
		x->t_state = TX_DRAIN;
		pend_unlink(c, prev, x);
		(*work)++;
		return false;
	}
	while (fill_room(t, c) && t->q_used[slot] < FILL_QUANTUM(t)) {
		uint64_t before = c->framed;

		if (!frame_data(t, c, x)) {
			/* No staging buffer for this client now: the others go on. */
			t->stage_blocked = true;
			t->q_blocked[slot] = t->fill_pass;
			return true;
		}
		t->q_used[slot] += c->framed - before;
		(*work)++;
		if (x->t_seg == x->nseg) {
			struct tx_frame *f = push_frame(c, KVP_W_END, 0, kvp_xfer_tag(x), x->idx);

			f->hdr.key = x->segs[0].dst_key;
			f->hdr.off = x->bytes;
			f->hdr.aux = x->user_id;
			f->hdr.aux2 = x->nseg;
			x->t_frames++;
			x->t_state = TX_FRAMED;
			pend_unlink(c, prev, x);
			return false;
		}
	}
	return true;
}

int
tcp_fill_tx(struct tcp_ctx *t, struct tcp_conn *c)
{
	uint32_t pass_start = c->tx_tail;
	int work = 0;
	bool more = c->pend_head != NULL;

	t->fill_pass++;
	/* Rounds: each client with transfers pending frames up to its quantum, in list order. */
	while (more && c->pend_head && fill_room(t, c)) {
		uint32_t round = ++t->fill_round;
		int before = work;

		for (struct kvp_xfer *x = c->pend_head, *prev = NULL, *next; x && fill_room(t, c);
		     x = next) {
			uint32_t slot = kvp_client_slot(x->client);

			next = x->next;
			if (slot >= t->stage.nclients)
				slot = 0;
			if (t->q_round[slot] != round) {
				t->q_round[slot] = round;
				t->q_used[slot] = 0;
			}
			if ((t->q_blocked[slot] == t->fill_pass && x->status == KVP_OK) ||
			    t->q_used[slot] >= FILL_QUANTUM(t) ||
			    fill_xfer(t, c, prev, x, slot, &work))
				prev = x; /* still pending */
		}
		more = work != before;
	}
	if (t->copies || t->copy_failed)
		copies_done(t, c, pass_start);
	return work;
}

/* Frame @p f is the socket's now: counted as sent, and framing may run ahead again. */
static void
frame_wire(struct tcp_ctx *t, struct tcp_conn *c, const struct tx_frame *f)
{
	struct kvp_peer_stats *ps = &t->w->stats.peer[c->peer];

	if (is_data(f->hdr.type)) {
		c->unsent -= f->hdr.len;
		c->framed -= f->hdr.len;
		KVP_STAT_ADD(ps->tx_bytes, f->hdr.len);
		KVP_STAT_ADD(ps->link_tx_bytes[c->link], f->hdr.len);
	}
	KVP_STAT_ADD(ps->tx_frames, 1);
}

void
tcp_ack_posted(struct tcp_ctx *t, struct kvp_xfer *x, int status)
{
	if (!x->ts[KVP_TS_POSTED] || x->ts[KVP_TS_POSTED] > x->ts[KVP_TS_ACKED])
		x->ts[KVP_TS_POSTED] = x->ts[KVP_TS_ACKED];
	if (!x->ts[KVP_TS_FIRST])
		x->ts[KVP_TS_FIRST] = x->ts[KVP_TS_POSTED];
	kvp_worker_xfer_end(t->w, x, status);
}

/* The kernel let go of frame @p f's memory: its staging buffer goes back, its transfer goes on. */
static void
frame_release(struct tcp_ctx *t, struct tx_frame *f, uint64_t now)
{
	struct kvp_worker *w = t->w;

	frame_unstage(t, f);
	if (f->xfer == NO_XFER)
		return;
	struct kvp_xfer *x = &w->xfers[f->xfer];
	/*
	 * The receiver may acknowledge a transfer before the sendmsg that
	 * carried its END returns (the same gather holds later frames): the
	 * transfer has then ended and its slot may already be reused.
	 */
	if (x->state != KVP_XS_ACTIVE || kvp_xfer_tag(x) != f->hdr.tag)
		return;
	x->t_frames--;
	if (is_data(f->hdr.type) && !x->ts[KVP_TS_FIRST])
		x->ts[KVP_TS_FIRST] = now;
	if (f->hdr.type == KVP_W_END && x->t_state == TX_FRAMED) {
		x->ts[KVP_TS_POSTED] = now;
		x->t_state = TX_WAIT_ACK;
		if (x->t_acked)
			tcp_ack_posted(t, x, x->status); /* its ACK came first */
	} else if (x->t_state == TX_DRAIN && x->t_frames == 0) {
		bool last = f->hdr.type == KVP_W_END ||
			    (f->hdr.type == KVP_W_ABORT && (f->hdr.rsvd & KVP_ABORT_F_ACK));

		/* Nothing of it may land after it completes: wait for the receiver's word. */
		if (last && !x->t_acked) {
			x->t_state = TX_WAIT_ACK;
			x->t_off = now;
		} else {
			kvp_worker_xfer_end(w, x, x->status);
		}
	}
}

int
tcp_start_send(struct tcp_ctx *t, struct tcp_conn *c)
{
	uint32_t i = c->tx_done, niov = 0;

	if (c->send_busy || c->state != CONN_UP || i == c->tx_tail)
		return 0;
	uint64_t bytes = 0;

	/*
	 * Gather at most about frame_max or SEND_GATHER_MAX bytes, whichever
	 * is less: enough for line rate, and a cancelled transfer never waits
	 * long for frames already given to the kernel.
	 */
	/* The planner keeps a frame within iov_max; gathers stop before one that does not fit. */
	uint64_t gmax = t->frame_max < SEND_GATHER_MAX ? t->frame_max : SEND_GATHER_MAX;
	while (i != c->tx_tail && bytes < gmax) {
		struct tx_frame *f = frame_at(c, i);
		uint32_t skip = i == c->tx_done ? c->tx_partial : 0;
		uint32_t hlen = sizeof(f->hdr);

		if (niov + 1 + payload_iovs(f) > t->iov_max)
			break;
		if (skip < hlen) {
			c->iov[niov].iov_base = (uint8_t *)&f->hdr + skip;
			c->iov[niov++].iov_len = hlen - skip;
			skip = 0;
		} else {
			skip -= hlen;
		}
		if (f->payload || f->pad)
			niov += payload_iov(f, skip, &c->iov[niov]);
		/* What is left of it: a 1 KiB tail is not a 4 MiB send. */
		bytes += frame_bytes(f) - (i == c->tx_done ? c->tx_partial : 0);
		i++;
		if (f->pad)
			break; /* its iovec may hold only part of what is left: nothing may follow it */
	}
	bool zc = t->zerocopy && bytes >= ZC_MIN_BYTES;

	if (zc && zc_waiting(c) == ZC_SENDS)
		return 0; /* the oldest notifications first */
	struct io_uring_sqe *sqe = tcp_sqe(t);
	if (!sqe)
		return 0;
	memset(&c->msg, 0, sizeof(c->msg));
	c->msg.msg_iov = c->iov;
	c->msg.msg_iovlen = niov;
	/* No WAITALL: a partial send comes back, so a stuck peer is visible as no progress. */
	if (zc) {
		/* Its notification names it by the zc[] sequence its result will take. */
		io_uring_prep_sendmsg_zc(sqe, c->fd, &c->msg, MSG_NOSIGNAL);
		if (t->zc_report)
			sqe->ioprio |= IORING_SEND_ZC_REPORT_USAGE;
		io_uring_sqe_set_data64(sqe, tcp_udata(c, UOP_SEND) | (uint64_t)c->zc_tail << 40);
	} else {
		io_uring_prep_sendmsg(sqe, c->fd, &c->msg, MSG_NOSIGNAL);
		io_uring_sqe_set_data64(sqe, tcp_udata(c, UOP_SEND));
	}
	c->tx_head = i;
	c->send_busy = true;
	c->send_ok_ns = c->send_moved_ns = c->last_tx_ns = kvp_mono_ns();
	c->ops++;
	return 1;
}

/*
 * The flag is advisory: since Linux 6.10 a send whose bytes all joined the
 * previous send's skb shares its notification and reports copied without
 * a copy. So the log speaks only once most of ZC_COPIED_SAY bytes or more
 * to the peer were reported copied.
 */
#define ZC_COPIED_SAY (64ull << 20)

static void
zc_copied(struct tcp_ctx *t, struct tcp_conn *c, uint32_t bytes)
{
	struct kvp_peer_stats *ps = &t->w->stats.peer[c->peer];

	KVP_STAT_ADD(ps->tcp_zc_copied, bytes);
	if (t->zc_copy_seen || ps->tcp_zc_copied < ZC_COPIED_SAY ||
	    ps->tcp_zc_copied * 2 < ps->tcp_zc_bytes)
		return;
	t->zc_copy_seen = true;
	KVP_LOG(NOTICE, tcp,
		"worker %u: tcp.zerocopy: the kernel copied zero-copy sends to peer %u "
		"(as it does for local delivery: loopback, veth; or a NIC without scatter-gather): "
		"zero-copy saves nothing on this path (stats peers[].tcp_zerocopy_copied_bytes)",
		t->w->idx, c->peer);
}

/* Release the sent frames before @p end, in order (tx_zc moves up to it). */
static void
release_to(struct tcp_ctx *t, struct tcp_conn *c, uint32_t end, uint64_t now)
{
	for (; c->tx_zc != end; c->tx_zc++)
		frame_release(t, frame_at(c, c->tx_zc), now);
}

/*
 * x's frames not yet handed to the kernel are dropped: a DATA frame shrinks
 * to a header-only ABORT (no payload read, the stream stays framed), END
 * becomes the ABORT the receiver acknowledges. A partly sent frame (tx_done
 * with tx_partial) stays whole.
 */
static void
abort_unsent(struct tcp_ctx *t, struct tcp_conn *c, struct kvp_xfer *x)
{
	uint32_t from = c->tx_head;

	if (from == c->tx_done && c->tx_partial)
		from++;
	for (uint32_t i = from; i != c->tx_tail; i++) {
		struct tx_frame *f = frame_at(c, i);

		if (f->xfer != x->idx || f->hdr.tag != kvp_xfer_tag(x))
			continue;
		if (is_data(f->hdr.type)) {
			frame_unstage(t, f);
			c->unsent -= f->hdr.len;
			c->framed -= f->hdr.len;
			f->payload = NULL;
			f->nblk = 0;
			f->pad = false;
			f->hdr.type = KVP_W_ABORT;
			f->hdr.len = 0;
			f->hdr.aux2 = f->hdr.rsvd = 0;
		} else if (f->hdr.type == KVP_W_END) {
			f->hdr.type = KVP_W_ABORT;
			f->hdr.rsvd = KVP_ABORT_F_ACK;
		}
	}
}

/* The source segment of @p x whose bytes are at @p p (0 if none is: a reused slot). */
static uint32_t
seg_at(const struct kvp_xfer *x, const uint8_t *p)
{
	for (uint32_t i = 0; i < x->nseg; i++) {
		const struct kvp_seg *s = &x->segs[i];
		const uint8_t *b = s->src->base + s->src_off;

		if (p >= b && p < b + (s->count - 1) * s->src_stride + s->len)
			return i;
	}
	return 0;
}

/*
 * The kernel's send said -EFAULT: none of it went, and some frame's payload
 * has memory gone under it (a hole punched in a host region's hugetlbfs
 * file with no page left to fault back in). Guarded reads find the first
 * such frame of the gather, and only its transfer fails (invalid, memory):
 * its unsent frames become ABORTs, and a frame already partly sent is
 * finished with zeros, so the stream stays framed and the ABORT after it
 * makes the receiver forget the transfer. Frames before it go out again.
 * @return false if no frame's memory is gone (the link fails as for any
 * other send error)
 */
static bool
send_fault(struct tcp_ctx *t, struct tcp_conn *c)
{
	uint32_t end = c->tx_head, hlen = sizeof(struct kvp_wire_hdr);

	c->tx_head = c->tx_done;
	for (uint32_t i = c->tx_done; i != end; i++) {
		struct tx_frame *f = frame_at(c, i);
		uint32_t sent = i == c->tx_done ? c->tx_partial : 0;
		bool gone = false;

		/* Staged and control payloads are the daemon's own memory. */
		if (!is_data(f->hdr.type) || f->stage >= 0 || !f->payload || f->xfer == NO_XFER)
			continue;
		struct kvp_xfer *x = &t->w->xfers[f->xfer];

		/* A frame outliving its transfer may point at a mapping gone: never read it. */
		if (x->state != KVP_XS_ACTIVE || kvp_xfer_tag(x) != f->hdr.tag)
			return false;
		uint32_t n = payload_iov(f, sent > hlen ? sent - hlen : 0, c->iov);

		for (uint32_t k = 0; k < n && !gone; k++)
			gone = kvp_guard_probe(c->iov[k].iov_base, c->iov[k].iov_len) < 0;
		if (!gone)
			continue;
		KVP_LOG_RL(ERR, tcp,
			   "peer %u: transfer %" PRIu64 ": source memory gone (a hole punched in "
			   "its region's file): it fails, the link goes on",
			   c->peer, x->user_id);
		if (x->status == KVP_OK) {
			x->detail = KVP_INVAL_MEMORY;
			x->bad_seg = seg_at(x, f->payload);
		}
		if (sent) {
			f->pad = true;
			f->payload = NULL;
			f->nblk = 0;
		}
		tcp_tx_cancel(t, c, x, KVP_EINVAL);
		/* Cancelled while this gather was in flight (TX_DRAIN): its frames here are still DATA. */
		abort_unsent(t, c, x);
		return true;
	}
	return false;
}

/*
 * The send in flight took @p res bytes. @p zc_held: a SENDMSG_ZC whose
 * notification is to come; its whole frames are released then
 * (tcp_zc_notif()), the others now.
 */
void
tcp_send_done(struct tcp_ctx *t, struct tcp_conn *c, int res, bool zc_held)
{
	c->send_busy = false;
	if (c->state != CONN_UP)
		return;
	if (res == -EFAULT && send_fault(t, c))
		res = 0; /* none of it went; a ZC send's notification is still to come */
	if (res < 0) {
		tcp_conn_fail(t, c, strerror(-res));
		return;
	}
	uint64_t left = (uint64_t)res, now = kvp_mono_ns();

	c->send_ok_ns = c->send_moved_ns = now;
	while (c->tx_done != c->tx_head) {
		struct tx_frame *f = frame_at(c, c->tx_done);
		uint64_t need = frame_bytes(f) - c->tx_partial;

		if (left < need) {
			c->tx_partial += (uint32_t)left;
			break;
		}
		left -= need;
		c->tx_partial = 0;
		c->tx_done++;
		frame_wire(t, c, f);
	}
	/* Whatever was not taken goes out again from tx_done. */
	c->tx_head = c->tx_done;
	if (zc_held) {
		uint32_t k = c->zc_tail++ & (ZC_SENDS - 1);

		KVP_STAT_ADD(t->w->stats.peer[c->peer].tcp_zc_bytes, (uint64_t)res);
		c->zc[k].end = c->tx_done;
		c->zc[k].bytes = (uint32_t)res;
		c->zc[k].done = false;
		return;
	}
	/* Nothing held: released at once, after any earlier ZC sends' frames. */
	if (!zc_waiting(c))
		release_to(t, c, c->tx_done, now);
}

/*
 * The notification of ZC send @p seq: the kernel let go of its memory.
 * Frames are released in send order, once every earlier send's notice is
 * in too (a partly sent frame belongs to the send that finished it).
 * @p copied: the kernel copied the pages after all (tcp.zerocopy gains
 * nothing on this path); counted, and said once per worker.
 */
void
tcp_zc_notif(struct tcp_ctx *t, struct tcp_conn *c, uint32_t seq, bool copied)
{
	uint64_t now = kvp_mono_ns();

	c->send_ok_ns = c->send_moved_ns = now;
	/* seq is the low 24 bits of the sequence (tcp_start_send()). */
	if (((seq - c->zc_head) & 0xffffffu) < zc_waiting(c)) {
		c->zc[seq & (ZC_SENDS - 1)].done = true;
		if (copied)
			zc_copied(t, c, c->zc[seq & (ZC_SENDS - 1)].bytes);
	}
	while (zc_waiting(c) && c->zc[c->zc_head & (ZC_SENDS - 1)].done) {
		uint32_t end = c->zc[c->zc_head++ & (ZC_SENDS - 1)].end;

		/* Closing: tcp_tx_reset() gives the buffers back; the transfers end with the link. */
		if (c->state == CONN_UP)
			release_to(t, c, end, now);
	}
	/* The sends after the last ZC one were not held: theirs go now too. */
	if (c->state == CONN_UP && !zc_waiting(c))
		release_to(t, c, c->tx_done, now);
}

void
tcp_tx_cancel(struct tcp_ctx *t, struct tcp_conn *c, struct kvp_xfer *x, int status)
{
	struct kvp_worker *w = t->w;

	if (x->status == KVP_OK)
		x->status = status;
	switch (x->t_state) {
	case TX_WAIT_ACK:
		/*
		 * Nothing of it is queued any more, but bytes may still be on
		 * their way: the ACK, which follows them, completes it (with
		 * this status); tcp_tx_sweep() bounds the wait.
		 */
		x->t_off = kvp_mono_ns();
		return;
	case TX_PEND:
		if (never_framed(x)) {
			/* Never reached the wire: unlink it and end it now. */
			struct kvp_xfer **pp = &c->pend_head, *prev = NULL;

			while (*pp && *pp != x) {
				prev = *pp;
				pp = &(*pp)->next;
			}
			if (*pp) {
				*pp = x->next;
				if (c->pend_tail == x)
					c->pend_tail = prev;
				c->unsent -= kvp_plan_left(x);
			}
			kvp_worker_xfer_end(w, x, status);
			return;
		}
		break; /* tcp_fill_tx() queues the ABORT when it reaches it */
	case TX_FRAMED:
		x->t_state = TX_DRAIN;
		break;
	default:
		return;
	}
	abort_unsent(t, c, x);
	if (x->t_state == TX_DRAIN && x->t_frames == 0)
		kvp_worker_xfer_end(w, x, x->status);
}

void
tcp_tx_reset(struct tcp_ctx *t, struct tcp_conn *c)
{
	for (uint32_t i = c->tx_zc; i != c->tx_tail; i++)
		frame_unstage(t, frame_at(c, i));
	c->tx_zc = c->tx_done = c->tx_head = c->tx_tail = 0;
	c->tx_partial = 0;
	c->zc_head = c->zc_tail = 0;
	c->send_busy = false;
	c->pend_head = c->pend_tail = NULL;
	c->unsent = 0;
	c->framed = 0;
}

/*
 * A cancelled transfer waits for the receiver's ACK of its last frame at
 * most timeouts.peer_ms: a peer that does not answer that long is cut off
 * by the liveness checks anyway (or runs an older version that does not
 * acknowledge ABORTs).
 */
void
tcp_tx_sweep(struct tcp_ctx *t, uint64_t now)
{
	struct kvp_worker *w = t->w;

	for (uint32_t i = 0; i < w->nxfers; i++) {
		struct kvp_xfer *x = &w->xfers[i];

		/* t_state is this transport's only for its own transfers. */
		if (x->state == KVP_XS_ACTIVE && x->tp == t->idx && x->t_state == TX_WAIT_ACK &&
		    x->status != KVP_OK && now - x->t_off > t->peer_ns)
			kvp_worker_xfer_end(w, x, x->status);
	}
}

/*
 * Admission: while framing waits for staging buffers, a transfer that has
 * not put a byte on the wire for admission_ms fails with "no-buffers"
 * instead of waiting for its deadline.
 */
void
tcp_tx_admission(struct tcp_ctx *t, struct tcp_conn *c, uint64_t now)
{
	uint64_t limit = (uint64_t)KVP_STAT_READ(t->w->cfg->admission_timeout_ms) * 1000000;
	struct kvp_xfer *x = c->pend_head, *next;

	for (; x; x = next) {
		next = x->next;
		if (x->status == KVP_OK && never_framed(x) && now - x->ts[KVP_TS_PICKUP] > limit)
			tcp_tx_cancel(t, c, x, KVP_ENOBUFS);
	}
}
