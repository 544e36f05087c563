/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The planner: cuts a transfer's segments into the pieces a transport puts
 * on the wire (a TCP frame, an RDMA WRITE), the same way for every
 * transport. Large ranges are split at the transport's limit, contiguous
 * successors are absorbed, and the blocks of a strided segment travel
 * together as one 2-D piece where the transport can take it.
 */
#include "kvp_worker.h"

/* Move x's cursor @p n bytes into the current block; past its end to the next block or segment. */
static void
advance(struct kvp_xfer *x, const struct kvp_seg *s, uint64_t n)
{
	x->t_off += n;
	if (x->t_off < s->len)
		return;
	x->t_off = 0;
	if (++x->t_blk < s->count)
		return;
	x->t_blk = 0;
	x->t_seg++;
}

bool
kvp_plan_next(struct kvp_xfer *x, uint64_t limit, uint64_t max_blocks, unsigned flags,
	      struct kvp_piece *p)
{
	if (x->t_seg >= x->nseg || limit == 0)
		return false;
	const struct kvp_seg *s = &x->segs[x->t_seg];
	uint64_t off = x->t_off, blk = x->t_blk;

	p->seg = s;
	p->src_off = s->src_off + blk * s->src_stride + off;
	p->dst_off = s->dst_off + blk * s->dst_stride + off;
	p->src_stride = s->src_stride;
	p->dst_stride = s->dst_stride;
	if (s->count > 1 && off == 0 && s->len < limit) {
		/* Whole blocks of a strided segment, as many as fit. */
		uint64_t k = s->count - blk;

		if (k > limit / s->len)
			k = limit / s->len;
		if (k > max_blocks)
			k = max_blocks;
		if ((flags & KVP_PLAN_DST_CONTIG) && s->dst_stride != s->len)
			k = 1;
		if (k == 0)
			k = 1;
		p->len = s->len;
		p->nblk = k;
		x->t_blk += k;
		if (x->t_blk == s->count) {
			x->t_blk = 0;
			x->t_seg++;
		}
		return true;
	}
	uint64_t len = s->len - off;

	if (len > limit)
		len = limit;
	p->len = len;
	p->nblk = 1;
	advance(x, s, len);
	/* A whole contiguous segment may absorb its contiguous successors. */
	while (off == 0 && s->count == 1 && len == s->len && x->t_seg < x->nseg &&
	       kvp_seg_contiguous(&x->segs[x->t_seg - 1], &x->segs[x->t_seg]) &&
	       p->len + x->segs[x->t_seg].len <= limit) {
		p->len += x->segs[x->t_seg].len;
		x->t_seg++;
	}
	return true;
}

uint64_t
kvp_plan_left(const struct kvp_xfer *x)
{
	uint64_t n = 0;

	if (x->t_seg >= x->nseg)
		return 0;
	for (uint32_t i = x->t_seg; i < x->nseg; i++)
		n += kvp_seg_bytes(&x->segs[i]);
	return n - x->t_blk * x->segs[x->t_seg].len - x->t_off;
}
