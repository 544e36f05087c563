/* SPDX-License-Identifier: BSD-3-Clause */
/* Channel layout: header page, SQ slots, CQ slots, each page aligned. */
#include "kvp_rings.h"

#define PAGE 4096u

static size_t
align_up(size_t v, size_t a)
{
	return (v + a - 1) & ~(a - 1);
}

static bool
pow2_in_range(uint32_t v)
{
	return v >= 2 && v <= (1u << 20) && (v & (v - 1)) == 0;
}

size_t
kvp_chan_size(uint32_t sq_entries, uint32_t cq_entries)
{
	if (!pow2_in_range(sq_entries) || !pow2_in_range(cq_entries))
		return 0;
	return align_up(sizeof(struct kvp_chan_hdr), PAGE) +
	       align_up((size_t)sq_entries * KVP_SQE_SIZE, PAGE) +
	       align_up((size_t)cq_entries * KVP_CQE_SIZE, PAGE);
}

int
kvp_chan_init(void *mem, size_t len, uint32_t sq_entries, uint32_t cq_entries, uint32_t client_id)
{
	struct kvp_chan_hdr *h = mem;
	size_t need = kvp_chan_size(sq_entries, cq_entries);

	if (need == 0 || len < need)
		return -EINVAL;
	memset(h, 0, sizeof(*h));
	h->version = KVP_ABI_VERSION;
	h->hdr_size = sizeof(*h);
	h->sq_entries = sq_entries;
	h->sq_esize = KVP_SQE_SIZE;
	h->cq_entries = cq_entries;
	h->cq_esize = KVP_CQE_SIZE;
	h->sq_off = align_up(sizeof(*h), PAGE);
	h->cq_off = h->sq_off + align_up((size_t)sq_entries * KVP_SQE_SIZE, PAGE);
	h->size = need;
	h->client_id = client_id;
	/* Magic last: a half-initialised channel never validates. */
	atomic_thread_fence(memory_order_release);
	h->magic = KVP_CHAN_MAGIC;
	return 0;
}

static void
ring_view(struct kvp_ring *r, struct kvp_ring_shm *shm, uint8_t *slots, uint32_t n, uint32_t esz)
{
	r->shm = shm;
	r->slots = slots;
	r->size = n;
	r->mask = n - 1;
	r->esize = esz;
	r->local = 0;
	r->cached = 0;
}

/* Start from the side's own shared index (zero on a fresh channel). */
static void
ring_start(struct kvp_ring *r, bool producer)
{
	r->local = atomic_load_explicit(producer ? &r->shm->prod : &r->shm->cons,
					memory_order_acquire);
	/*
	 * A producer has seen no cons yet: assume the ring full so that the
	 * first enqueue reads (and checks) cons instead of trusting prod.
	 */
	r->cached = producer ? r->local - r->size : r->local;
}

int
kvp_chan_attach(void *mem, size_t len, bool daemon, struct kvp_ring *sq, struct kvp_ring *cq)
{
	struct kvp_chan_hdr *h = mem;

	if (len < sizeof(*h) || h->magic != KVP_CHAN_MAGIC)
		return -EBADMSG;
	if (h->version != KVP_ABI_VERSION)
		return -EPROTONOSUPPORT;
	/* Copy every size once: the other side could rewrite the header later. */
	uint32_t sqn = h->sq_entries, cqn = h->cq_entries;
	uint64_t sq_off = h->sq_off, cq_off = h->cq_off;
	size_t need = kvp_chan_size(sqn, cqn);

	if (need == 0 || need > len || h->sq_esize != KVP_SQE_SIZE ||
	    h->cq_esize != KVP_CQE_SIZE || sq_off < sizeof(*h) || sq_off > len || cq_off > len ||
	    sq_off + (uint64_t)sqn * KVP_SQE_SIZE > cq_off ||
	    cq_off + (uint64_t)cqn * KVP_CQE_SIZE > len)
		return -EINVAL;
	ring_view(sq, &h->sq, (uint8_t *)mem + sq_off, sqn, KVP_SQE_SIZE);
	ring_view(cq, &h->cq, (uint8_t *)mem + cq_off, cqn, KVP_CQE_SIZE);
	/* The client produces SQ entries and consumes CQ entries. */
	ring_start(sq, !daemon);
	ring_start(cq, daemon);
	return 0;
}

static const char *const status_names[KVP_STATUS_MAX] = {
	[KVP_OK] = "ok",
	[KVP_EINVAL] = "invalid",
	[KVP_ENOBUFS] = "no-buffers",
	[KVP_ETIMEDOUT] = "timeout",
	[KVP_EPEER] = "peer",
	[KVP_ECANCELED] = "canceled",
	[KVP_EREMOTE] = "remote",
	[KVP_ESHUTDOWN] = "shutdown",
	[KVP_ENOPEER] = "no-peer",
};

const char *
kvp_status_str(int status)
{
	if (status < 0 || status >= KVP_STATUS_MAX)
		return "unknown";
	return status_names[status];
}

static const char *const invalid_names[KVP_INVAL_MAX] = {
	[KVP_INVAL_NONE] = "",
	[KVP_INVAL_OP] = "a segment entry of unknown type",
	[KVP_INVAL_LEN] = "a segment of zero length",
	[KVP_INVAL_DST] = "destination region key 0",
	[KVP_INVAL_COUNT] = "block count 0 or above limits.max_blocks",
	[KVP_INVAL_STRIDE] = "a stride smaller than its block, or count x stride overflows",
	[KVP_INVAL_BOUNDS] = "outside the source region, or the destination range overflows",
	[KVP_INVAL_SRC] = "unknown source region, or not this client's",
	[KVP_INVAL_NSEG] = "more segments than limits.max_segments",
	[KVP_INVAL_MEMORY] = "the source region's memory is gone (a hole punched in its file)",
};

const char *
kvp_invalid_str(int detail)
{
	if (detail < 0 || detail >= KVP_INVAL_MAX)
		return "unknown";
	return invalid_names[detail];
}

static const char *const peer_why_names[KVP_PEER_WHY_MAX] = {
	[KVP_PEER_WHY_NONE] = "",
	[KVP_PEER_WHY_UNKNOWN] = "no peer has this index (any more)",
	[KVP_PEER_WHY_REMOVED] = "the peer is being removed",
	[KVP_PEER_WHY_DOWN] = "its links are down (reconnecting)",
	[KVP_PEER_WHY_CONNECT] = "no connection within timeouts.connect_ms (refused or unreachable)",
	[KVP_PEER_WHY_HANDSHAKE] = "the peer refused the handshake (node id, limits)",
	[KVP_PEER_WHY_AUTH] = "authentication failed (the shared secrets differ)",
	[KVP_PEER_WHY_NO_ADDR] = "it connected to this node and there is no address to dial it",
};

const char *
kvp_peer_why_str(int detail)
{
	if (detail < 0 || detail >= KVP_PEER_WHY_MAX)
		return "unknown";
	return peer_why_names[detail];
}
