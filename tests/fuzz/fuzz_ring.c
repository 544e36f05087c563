/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target: the submission-ring path of a worker (poll_chan,
 * take_segments, admission, completions, backlog, cancel, deadlines).
 *
 * A real channel lives in this process's memory; the input is a program of
 * client actions — raw bytes into SQ slots, well-formed or subtly wrong
 * transfers, producer-index jumps, CQ reads and CQ-index tampering, cancels,
 * timer ticks — interleaved with kvp_worker_poll_chans() on a worker built by
 * kvp_node_init(). A stub transport checks every transfer it is handed and
 * ends it (at once or later, as the input says) through kvp_worker_xfer_end().
 *
 * Invariants checked (abort = crash report):
 *  - the transport only ever sees transfers whose every segment lies inside
 *    a region owned by the submitting client, with a configured peer;
 *  - a transfer this harness built well-formed never fails "invalid", and
 *    one it built malformed never succeeds (status class predicted exactly);
 *  - a producer index the daemon cannot trust marks the channel broken at
 *    the next poll, and a broken channel is never read again;
 *  - every transfer picked up (and every admission refusal) produces exactly
 *    one completion, unless the channel broke; strided segments (SEG2D) are
 *    predicted by the rules restated here, every block inside the region;
 *  - every fence the client submits gets exactly one FENCE completion, once
 *    the transport says nothing can land (or it was refused);
 *  - at the end every transfer slot, region reference, control message and
 *    fd is back.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rte_mempool.h>

#include "fuzz_common.h"

#define CLIENT_ID    ((1u << 16) | 1u) /* slot 1, generation 1 */
#define OTHER_ID     ((1u << 16) | 2u) /* another live client */
#define OLDGEN_ID    (1u)              /* an earlier client in our slot */
#define REG_OFF      1000u
#define REG_LEN      20000u
#define MEMFD_LEN    65536u
#define MAX_OPS      256
#define UID_TAG      (1ull << 40) /* user ids of transfers this harness built */
#define NPEND        64
#define NOWED        512
#define MAX_INFLIGHT 8u

enum seg_src { SRC_OWN = 0, SRC_OTHER, SRC_GONE, SRC_OLDGEN, SRC_RANDOM, SRC_ZERO, SRC_N };

/* What the harness predicts for a transfer it built (index: uid - UID_TAG). */
enum expect { EXP_INVALID = 1, EXP_NOPEER, EXP_POSTABLE };

static struct kvp_node node;
static struct kvp_worker *w;
static uint64_t key_own, key_other, key_gone, key_oldgen;
static struct kvp_region *reg_own;
static int notify_fd = -1;

/* Stub transport state. */
static struct kvp_transport_ops stub_ops;
static struct kvp_xfer *pend[NPEND];
static unsigned npend;
static struct kvp_chan *cur_chan;

/* Completions owed with status OK: (user_id, bytes, nseg). */
static struct owed {
	uint64_t user_id;
	uint64_t bytes;
	uint32_t nseg;
} owed[NOWED];
static unsigned nowed;

static uint8_t expect_of[MAX_OPS]; /* built transfers, by uid - UID_TAG */
static unsigned nbuilt;
static unsigned fences_sent, fences_done; /* FENCE entries published / completed */
static unsigned fence_busy_calls;	  /* the stub's fence op: busy for this many calls */
static bool winding;			  /* end of input: the stub lets every fence hold */

/* Everything the transport is handed must be a validated transfer. */
static void
check_posted(const struct kvp_xfer *x)
{
	uint64_t bytes = 0;

	REQUIRE(x->chan == cur_chan, "transfer of an unknown channel");
	REQUIRE(x->nseg >= 1 && x->nseg <= node.cfg.max_segments, "nseg %u", x->nseg);
	REQUIRE(x->peer < node.cfg.npeers, "peer %u not configured", x->peer);
	REQUIRE(w->peers[x->peer].links, "posted to a peer that is down");
	for (uint32_t i = 0; i < x->nseg; i++) {
		const struct kvp_seg *s = &x->segs[i];

		REQUIRE(s->src != NULL, "segment %u without a source region", i);
		REQUIRE(s->src->owner == x->chan->id,
			"segment %u reads region of client %#x for client %#x", i, s->src->owner,
			x->chan->id);
		REQUIRE(s->src == reg_own, "segment %u: not the client's region", i);
		REQUIRE(s->count >= 1 && s->count <= node.cfg.max_blocks,
			"segment %u: %" PRIu64 " blocks", i, s->count);
		REQUIRE(s->count == 1 || (s->src_stride >= s->len && s->dst_stride >= s->len),
			"segment %u: overlapping blocks", i);
		/* Small values by construction of the checks: no overflow here. */
		uint64_t last = (s->count - 1) * s->src_stride;
		REQUIRE(kvp_region_contains(s->src, s->src_off + last, s->len) &&
				s->src_off + last >= s->src_off,
			"segment %u [%" PRIu64 ", +%" PRIu64 " x %" PRIu64 ") outside the region",
			i, s->src_off, s->len, s->count);
		REQUIRE(s->dst_key != 0 &&
				s->dst_off + (s->count - 1) * s->dst_stride + s->len >= s->dst_off,
			"segment %u: bad destination", i);
		/* Touch both ends of the first and the last block: outside the mapping this faults. */
		volatile const uint8_t *b = s->src->base;
		(void)b[s->src_off];
		(void)b[s->src_off + last + s->len - 1];
		bytes += s->len * s->count;
	}
	REQUIRE(bytes == x->bytes, "bytes %" PRIu64 " vs segments %" PRIu64, x->bytes, bytes);
}

static void
owe(const struct kvp_xfer *x)
{
	REQUIRE(nowed < NOWED, "owed list overflow");
	owed[nowed++] = (struct owed){ x->user_id, x->bytes, x->nseg };
}

static void
stub_end(struct kvp_xfer *x, int status)
{
	for (unsigned i = 0; i < npend; i++) {
		if (pend[i] == x) {
			pend[i] = pend[--npend];
			break;
		}
	}
	if (status == KVP_OK && x->status == KVP_OK && x->chan)
		owe(x);
	if (fuzz_verbose())
		fprintf(stderr,
			"ring: transport ends user_id %#" PRIx64 " (%u seg, %" PRIu64
			" bytes): %s\n",
			x->user_id, x->nseg, x->bytes, kvp_status_str(status));
	kvp_worker_xfer_end(w, x, status);
}

/* The input being run: the stub reads from it how each transfer ends. */
static struct fuzz_in *cur_in;

static int
stub_post(void *tctx, struct kvp_xfer *x)
{
	(void)tctx;
	check_posted(x);
	REQUIRE(npend < NPEND, "stub pending list overflow");
	pend[npend++] = x;
	switch (fuzz_u8(cur_in) % 4) {
	case 0:
	case 1:
		stub_end(x, KVP_OK);
		break;
	case 2:
		stub_end(x, KVP_EREMOTE);
		break;
	default:
		break; /* completes later (COMPLETE op or the end of the input) */
	}
	return 0;
}

static void
stub_cancel(void *tctx, struct kvp_xfer *x, int status)
{
	(void)tctx;
	stub_end(x, status);
}

/* Landings may still happen for a while (as the input said); forced or winding down, none. */
static uint32_t
stub_fence(void *tctx, const struct kvp_fence *f, bool force)
{
	(void)tctx;
	REQUIRE(f->mask != 0 && (f->value & ~f->mask) == 0 && f->owner == CLIENT_ID,
		"fence %#" PRIx64 "/%#" PRIx64 " of client %#x", f->value, f->mask, f->owner);
	if (force || winding || fence_busy_calls == 0)
		return 0;
	fence_busy_calls--;
	return 1;
}

static uint64_t
add_region(int fd, uint32_t owner, uint32_t flags)
{
	uint64_t key = 0;
	int rc = kvp_region_add(&node.regions, owner, fd, REG_OFF, REG_LEN, flags, &key);

	REQUIRE(rc == 0, "kvp_region_add: %d", rc);
	return key;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct kvp_config cfg;
	int fd;

	(void)argc;
	(void)argv;
	fuzz_config(&cfg);
	cfg.max_inflight = MAX_INFLIGHT;
	cfg.admission_timeout_ms = 1000;
	stub_ops = kvp_test_stub_ops;
	stub_ops.name = "stub";
	stub_ops.post = stub_post;
	stub_ops.cancel = stub_cancel;
	stub_ops.fence = stub_fence;
	fuzz_node_init(&node, &cfg, &stub_ops);
	w = &node.workers[0];

	REQUIRE(kvp_test_memfd("fuzz-region", MEMFD_LEN, true, &fd, NULL) == 0, "memfd");
	key_own = add_region(fd, CLIENT_ID, KVP_REGION_HOST);
	key_other = add_region(fd, OTHER_ID, KVP_REGION_HOST);
	key_oldgen = add_region(fd, OLDGEN_ID, KVP_REGION_HOST);
	/* A client that has gone away: its region is dead and reaped, its key stale. */
	key_gone = add_region(fd, (2u << 16) | 3u, KVP_REGION_HOST);
	kvp_region_remove_owner(&node.regions, (2u << 16) | 3u);
	REQUIRE(kvp_region_get(&node.regions, key_gone) == NULL, "gone region still found");
	reg_own = kvp_region_get(&node.regions, key_own);
	REQUIRE(reg_own != NULL, "own region");
	kvp_region_put(reg_own);
	close(fd);
	notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	return 0;
}

/* ---- the client side of the channel ---- */

struct client {
	struct kvp_chan *ch;
	struct kvp_chan_hdr *hdr;
	struct kvp_ring sq; /* client view: producer */
	struct kvp_ring cq; /* client view: consumer */
	bool sq_clean;      /* only well-formed publishes so far: predictions hold */
	bool cq_clean;      /* CQ indices never tampered: the owed list is exact */
	uint64_t cqes;      /* DONE completions read */
};

static uint64_t
pick_key(struct fuzz_in *in, enum seg_src *src)
{
	*src = (enum seg_src)(fuzz_u8(in) % SRC_N);
	switch (*src) {
	case SRC_OWN:
		return key_own;
	case SRC_OTHER:
		return key_other;
	case SRC_GONE:
		return key_gone;
	case SRC_OLDGEN:
		return key_oldgen;
	case SRC_RANDOM:
		return fuzz_bytes_le(in, 8);
	default:
		return 0;
	}
}

static uint64_t
pick_u64(struct fuzz_in *in, uint64_t region_len)
{
	switch (fuzz_u8(in) % 8) {
	case 0:
		return 0;
	case 1:
		return region_len;
	case 2:
		return region_len - 1;
	case 3:
		return UINT64_MAX - fuzz_u8(in);
	case 4:
		return fuzz_bytes_le(in, 8);
	default:
		return fuzz_bytes_le(in, 2);
	}
}

/* The daemon's rules for one strided segment, restated: true if it must be accepted. */
static bool
seg2d_ok(const struct kvp_sqe_seg2d *s)
{
	if (s->len == 0 || s->count == 0 || s->count > node.cfg.max_blocks || s->dst_key == 0 ||
	    s->src_key != key_own)
		return false;
	unsigned __int128 n = s->count - 1;
	unsigned __int128 sspan = n * s->src_stride + s->len, dspan = n * s->dst_stride + s->len;
	if (s->count > 1 && (s->src_stride < s->len || s->dst_stride < s->len))
		return false;
	return sspan <= UINT64_MAX && dspan <= UINT64_MAX && s->src_off <= REG_LEN &&
	       sspan <= REG_LEN - s->src_off && (unsigned __int128)s->dst_off + dspan <= UINT64_MAX;
}

/* A transfer built through the ABI, with a predicted outcome. */
static void
op_xfer(struct client *c, struct fuzz_in *in)
{
	struct kvp_sqe_seg e[1 + 12];
	struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&e[0];
	uint8_t b = fuzz_u8(in);
	uint32_t nseg = 1 + b % 12; /* up to 12 > max_segments (8) */
	bool valid = nseg <= node.cfg.max_segments;
	uint64_t now = kvp_mono_ns();

	if (nbuilt >= MAX_OPS)
		return;
	memset(e, 0, sizeof(e));
	h->op = KVP_OP_XFER;
	h->nseg = nseg;
	h->peer = (uint16_t)(fuzz_u8(in) % 3 == 0 ? fuzz_bytes_le(in, 2) : 0);
	h->user_id = UID_TAG + nbuilt;
	switch (fuzz_u8(in) % 4) {
	case 0:
		h->timeout_ns = 0;
		break;
	case 1:
		h->timeout_ns = 1;
		break;
	case 2:
		h->timeout_ns = fuzz_bytes_le(in, 8);
		break;
	default:
		h->timeout_ns = 10ull * 1000000000;
		break;
	}
	switch (fuzz_u8(in) % 4) {
	case 0:
		h->submit_ns = 0;
		break;
	case 1:
		h->submit_ns = now - 10ull * 1000000000; /* queued for ages */
		break;
	case 2:
		h->submit_ns = fuzz_bytes_le(in, 8);
		break;
	default:
		h->submit_ns = now;
		break;
	}
	for (uint32_t i = 0; i < nseg; i++) {
		struct kvp_sqe_seg *s = &e[1 + i];
		enum seg_src src;
		uint8_t kind = fuzz_u8(in) % 16;

		s->op = kind == 0 ? (uint8_t)fuzz_u8(in) : kind >= 5 && kind < 9 ? KVP_OP_SEG2D : KVP_OP_SEG;
		s->src_key = pick_key(in, &src);
		s->src_off = pick_u64(in, REG_LEN);
		s->len = pick_u64(in, REG_LEN);
		s->dst_key = fuzz_u8(in) % 8 == 0 ? 0 : 0x1234000000000001ull;
		s->dst_off = pick_u64(in, REG_LEN);
		bool ok;
		if (s->op == KVP_OP_SEG2D) {
			struct kvp_sqe_seg2d *g = (struct kvp_sqe_seg2d *)s;

			/* Small shapes mostly, edge values sometimes. */
			g->len = fuzz_u8(in) % 4 == 0 ? pick_u64(in, REG_LEN) : 1u + fuzz_u8(in);
			g->count = fuzz_u8(in) % 8 == 0 ? (uint32_t)fuzz_bytes_le(in, 4)
							 : fuzz_u8(in) % 64u;
			g->src_stride = fuzz_u8(in) % 8 == 0 ? pick_u64(in, REG_LEN)
							     : g->len + fuzz_u8(in) % 64u;
			g->dst_stride = fuzz_u8(in) % 8 == 0 ? pick_u64(in, REG_LEN)
							     : g->len + fuzz_u8(in) % 64u;
			if (fuzz_u8(in) % 4 == 0)
				g->src_off = fuzz_u8(in);
			ok = seg2d_ok(g);
		} else {
			ok = s->op == KVP_OP_SEG && s->src_key == key_own && s->len > 0 &&
			     s->src_off <= REG_LEN && s->len <= REG_LEN - s->src_off &&
			     s->dst_key != 0 && s->dst_off + s->len >= s->dst_off;
		}
		valid = valid && ok;
	}
	int rc = kvp_ring_enqueue_bulk(&c->sq, e, 1 + nseg);
	if (rc <= 0)
		return; /* no room (or our own index tampering): not submitted */
	expect_of[nbuilt++] = !valid                     ? EXP_INVALID :
			      h->peer >= node.cfg.npeers ? EXP_NOPEER :
							   EXP_POSTABLE;
}

/* Raw bytes as SQ entries, published as they are. */
static void
op_raw(struct client *c, struct fuzz_in *in)
{
	uint32_t k = 1 + fuzz_u8(in) % 4;
	uint8_t e[4 * KVP_SQE_SIZE];

	fuzz_copy(in, e, (size_t)k * KVP_SQE_SIZE);
	if (kvp_ring_enqueue_bulk(&c->sq, e, k) > 0)
		c->sq_clean = false;
}

static void
op_prod(struct client *c, struct fuzz_in *in)
{
	uint32_t prod = atomic_load(&c->hdr->sq.prod), v;

	switch (fuzz_u8(in) % 4) {
	case 0:
		v = prod - 1 - fuzz_u8(in); /* backwards */
		break;
	case 1:
		v = prod + c->sq.size + 1 + fuzz_u8(in); /* past the ring */
		break;
	case 2:
		v = prod + fuzz_u8(in) % 4; /* forward over stale slots */
		break;
	default:
		v = (uint32_t)fuzz_bytes_le(in, 4);
		break;
	}
	atomic_store(&c->hdr->sq.prod, v);
	c->sq.local = v;
	c->sq_clean = false;
}

static void
check_cqe(struct client *c, const struct kvp_cqe *e)
{
	/* After CQ tampering the client reads stale or never-written slots. */
	if (!c->cq_clean) {
		c->cqes++;
		return;
	}
	if (e->kind == KVP_CQE_FENCE) {
		REQUIRE(e->status == KVP_OK || e->status == KVP_EINVAL || e->status == KVP_ENOBUFS,
			"fence %#" PRIx64 " ended %s", e->user_id, kvp_status_str(e->status));
		fences_done++;
		return;
	}
	c->cqes++;
	REQUIRE(e->kind == KVP_CQE_DONE, "unexpected CQE kind %u", e->kind);
	REQUIRE(e->status >= 0 && e->status < KVP_STATUS_MAX, "status %d", e->status);
	if (e->status == KVP_OK) {
		unsigned i;

		for (i = 0; i < nowed; i++)
			if (owed[i].user_id == e->user_id && owed[i].bytes == e->bytes &&
			    owed[i].nseg == e->nseg)
				break;
		REQUIRE(i < nowed,
			"success completion (user_id %#" PRIx64 ", %" PRIu64
			" bytes) for a transfer the transport never completed",
			e->user_id, e->bytes);
		owed[i] = owed[--nowed];
	}
	if (c->sq_clean && e->user_id >= UID_TAG && e->user_id < UID_TAG + nbuilt) {
		int s = e->status;

		switch (expect_of[e->user_id - UID_TAG]) {
		case EXP_INVALID:
			REQUIRE(s == KVP_EINVAL || s == KVP_ENOBUFS,
				"malformed transfer %#" PRIx64 " ended %s", e->user_id,
				kvp_status_str(s));
			break;
		case EXP_NOPEER:
			REQUIRE(s == KVP_ENOPEER || s == KVP_ENOBUFS || s == KVP_ETIMEDOUT,
				"transfer %#" PRIx64 " to an unknown peer ended %s", e->user_id,
				kvp_status_str(s));
			break;
		default:
			REQUIRE(s != KVP_EINVAL && s != KVP_ENOPEER,
				"well-formed transfer %#" PRIx64 " ended %s", e->user_id,
				kvp_status_str(s));
			break;
		}
	}
}

static void
op_cq_read(struct client *c, uint32_t max)
{
	struct kvp_cqe e[16];
	int n;

	if (max > 16)
		max = 16;
	n = kvp_ring_dequeue_burst(&c->cq, e, max);
	if (n < 0) {
		REQUIRE(!c->cq_clean, "daemon published an impossible CQ index");
		return;
	}
	for (int i = 0; i < n; i++)
		check_cqe(c, &e[i]);
}

static void
op_cq_cons(struct client *c, struct fuzz_in *in)
{
	uint32_t cons = atomic_load(&c->hdr->cq.cons), v;

	switch (fuzz_u8(in) % 3) {
	case 0:
		v = cons - 1 - fuzz_u8(in) % 32; /* backwards: "the ring is full again" */
		break;
	case 1:
		v = cons + 1 + fuzz_u8(in) % 32; /* past what was produced */
		break;
	default:
		v = (uint32_t)fuzz_bytes_le(in, 4);
		break;
	}
	atomic_store(&c->hdr->cq.cons, v);
	c->cq.local = v;
	c->cq.cached = v;
	c->cq_clean = false;
}

static void
op_cancel(struct client *c, struct fuzz_in *in)
{
	struct kvp_sqe_xfer h;

	memset(&h, 0, sizeof(h));
	h.op = KVP_OP_CANCEL;
	h.user_id = UID_TAG + (nbuilt ? fuzz_u8(in) % nbuilt : 0);
	kvp_ring_enqueue_bulk(&c->sq, &h, 1);
}

/* A fence on this client's landings; mask 0 sometimes (refused). */
static void
op_fence(struct client *c, struct fuzz_in *in)
{
	struct kvp_sqe_fence f;

	memset(&f, 0, sizeof(f));
	f.op = KVP_OP_FENCE;
	f.fence_id = fences_sent;
	f.mask = fuzz_u8(in) % 8 == 0 ? 0 : fuzz_bytes_le(in, 8) | 1;
	f.value = fuzz_bytes_le(in, 8) & f.mask;
	f.hold_ms = fuzz_u8(in) % 3;
	fence_busy_calls = fuzz_u8(in) % 3;
	if (kvp_ring_enqueue_bulk(&c->sq, &f, 1) > 0)
		fences_sent++;
}

static void
op_complete(struct fuzz_in *in)
{
	static const int st[] = { KVP_OK, KVP_OK, KVP_EPEER, KVP_EREMOTE, KVP_ETIMEDOUT };
	unsigned k = 1 + fuzz_u8(in) % 4;

	while (k-- && npend)
		stub_end(pend[fuzz_u8(in) % npend], st[fuzz_u8(in) % 5]);
}

static void
timers(uint64_t now)
{
	w->next_timer_ns = 0;
	kvp_worker_timers(w, now);
	w->next_timer_ns = 0;
}

/* One poll, with the index invariants around it. */
static void
op_poll(struct client *c)
{
	struct kvp_chan *ch = c->ch;
	uint32_t prod = atomic_load(&c->hdr->sq.prod);
	uint32_t cons = atomic_load(&c->hdr->sq.cons);
	bool was_broken = ch->broken;

	kvp_worker_poll_chans(w);
	if (was_broken) {
		REQUIRE(atomic_load(&c->hdr->sq.cons) == cons, "a broken channel was read again");
	} else if (prod - cons > c->sq.size) {
		REQUIRE(ch->broken, "SQ prod %u with cons %u (size %u) not flagged", prod, cons,
			c->sq.size);
	}
	REQUIRE(atomic_load(&c->hdr->sq.cons) - cons <= c->sq.size,
		"daemon consumed more than the ring holds");
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size, 0 };
	struct fuzz_outbox ob = { 0 };
	struct client c;
	int fd0 = fuzz_lowest_fd();
	unsigned pool0 = rte_mempool_avail_count(node.msg_pool);
	uint64_t sub0 = w->stats.xfers_submitted;
	uint64_t refused0 = w->stats.completions[KVP_ENOBUFS];
	uint32_t sqn = 4u << (fuzz_u8(&in) % 4); /* 4 .. 32 */
	uint32_t cqn = 2u << (fuzz_u8(&in) % 4); /* 2 .. 16 */
	size_t len = kvp_chan_size(sqn, cqn);
	uint64_t v;

	memset(&c, 0, sizeof(c));
	c.sq_clean = c.cq_clean = true;
	nowed = 0;
	nbuilt = 0;
	npend = 0;
	fences_sent = fences_done = 0;
	fence_busy_calls = 0;
	winding = false;
	cur_in = &in;
	w->peers[0].links = 1;

	c.ch = calloc(1, sizeof(*c.ch));
	void *mem = aligned_alloc(4096, len);
	REQUIRE(c.ch && mem, "out of memory");
	memset(mem, 0, len);
	REQUIRE(kvp_chan_init(mem, len, sqn, cqn, CLIENT_ID) == 0, "chan_init");
	c.hdr = mem;
	c.ch->id = CLIENT_ID;
	c.ch->pid = 1;
	c.ch->mem = mem;
	c.ch->len = len;
	c.ch->notify_fd = notify_fd;
	REQUIRE(kvp_chan_attach(mem, len, true, &c.ch->sq, &c.ch->cq) == 0, "attach daemon");
	REQUIRE(kvp_chan_attach(mem, len, false, &c.sq, &c.cq) == 0, "attach client");
	cur_chan = c.ch;
	fuzz_send_worker(&node, KVP_MSG_CHAN_ADD, c.ch);
	kvp_worker_inbox(w);

	for (int ops = 0; ops < MAX_OPS && fuzz_more(&in); ops++) {
		uint8_t op = fuzz_u8(&in);

		switch (op % 13) {
		case 0:
			op_raw(&c, &in);
			break;
		case 1:
		case 2:
			op_xfer(&c, &in);
			break;
		case 3:
			op_prod(&c, &in);
			break;
		case 4:
		case 5:
			op_poll(&c);
			break;
		case 6:
			op_cq_read(&c, 1 + fuzz_u8(&in) % 16);
			break;
		case 7:
			op_cq_cons(&c, &in);
			break;
		case 8:
			op_complete(&in);
			break;
		case 9:
			op_cancel(&c, &in);
			break;
		case 10:
			switch (fuzz_u8(&in) % 3) {
			case 0:
				timers(kvp_mono_ns());
				break;
			case 1:
				timers(kvp_mono_ns() + 3600ull * 1000000000);
				break;
			default:
				w->peers[0].links = !w->peers[0].links;
				break;
			}
			break;
		case 12:
			op_fence(&c, &in);
			break;
		default:
			atomic_store(&c.hdr->cq.need_wakeup, fuzz_u8(&in) & 1);
			break;
		}
	}
	winding = true;

	/*
	 * Wind down as a well-behaved client and transport would: the transport
	 * finishes what it holds, the worker picks up what is left in the SQ,
	 * the client reads every completion — until nothing moves.
	 */
	for (int round = 0; round < 256; round++) {
		uint32_t sq_cons = atomic_load(&c.hdr->sq.cons);
		uint64_t cqes = c.cqes + fences_done;
		bool had = npend != 0;

		while (npend)
			stub_end(pend[0], KVP_OK);
		op_poll(&c);
		op_cq_read(&c, 16);
		timers(kvp_mono_ns());
		op_cq_read(&c, 16);
		if (!had && npend == 0 && cqes == c.cqes + fences_done &&
		    sq_cons == atomic_load(&c.hdr->sq.cons))
			break;
	}
	while (npend)
		stub_end(pend[0], KVP_OK);
	uint64_t picked = w->stats.xfers_submitted - sub0;
	uint64_t refused = w->stats.completions[KVP_ENOBUFS] - refused0;
	if (fuzz_verbose())
		fprintf(stderr,
			"ring: sq %u cq %u: %" PRIu64 " picked up, %" PRIu64 " refused, %" PRIu64
			" completions read, %u built, broken %d, backlog %d\n",
			sqn, cqn, picked, refused, c.cqes, nbuilt, c.ch->broken,
			c.ch->backlog_head != NULL);
	if (!c.ch->broken && c.cq_clean) {
		REQUIRE(c.ch->backlog_head == NULL, "completions stuck in the backlog");
		REQUIRE(c.cqes == picked + refused,
			"%" PRIu64 " completions for %" PRIu64 " transfers + %" PRIu64 " refusals",
			c.cqes, picked, refused);
		REQUIRE(nowed == 0, "%u successful transfers never completed", nowed);
		if (c.sq_clean)
			REQUIRE(fences_done == fences_sent, "%u fences, %u fence completions",
				fences_sent, fences_done);
	}
	REQUIRE(c.ch->inflight == 0, "channel still counts %u in flight", c.ch->inflight);
	/* A channel that broke outside a poll (CQ tampering seen by a timer) is reported at the next one. */
	if (c.ch->broken)
		kvp_worker_poll_chans(w);

	fuzz_send_worker(&node, KVP_MSG_CHAN_DEL, c.ch);
	kvp_worker_inbox(w);
	fuzz_drain_outbox(&node, 0, &ob);
	REQUIRE(ob.chan_gone == 1, "no CHAN_GONE after CHAN_DEL");
	REQUIRE(ob.chan_broken == (c.ch->broken ? 1u : 0u), "CHAN_BROKEN sent %u times",
		ob.chan_broken);
	REQUIRE(w->nchans == 0, "worker still holds %u channels", w->nchans);
	fuzz_assert_reclaimed(&node, pool0);
	if (read(notify_fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nobody was woken. */
	}
	free(mem);
	free(c.ch);
	cur_chan = NULL;
	REQUIRE(fuzz_lowest_fd() == fd0, "fd leaked");
	return 0;
}
