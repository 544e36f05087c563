/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The planner (lib/core/plan.c): how transfers are cut into wire pieces.
 * Every case also checks the invariants both transports rely on: the pieces
 * cover every byte of every block exactly once, in order, and
 * kvp_plan_left() counts down to 0.
 */
#include <string.h>

#include "kvp_worker.h"
#include "kvp_test.h"

#define MAXP 4096

static struct kvp_region ra, rb; /* two source regions (only their identity matters) */
static struct kvp_seg segs[16];
static struct kvp_xfer x;
static struct kvp_piece pieces[MAXP];

static struct kvp_seg
seg(struct kvp_region *r, uint64_t so, uint64_t dk, uint64_t doff, uint64_t len, uint64_t n,
    uint64_t ss, uint64_t ds)
{
	return (struct kvp_seg){ .src = r, .src_off = so, .dst_key = dk, .dst_off = doff, .len = len,
				 .count = n, .src_stride = n > 1 ? ss : len,
				 .dst_stride = n > 1 ? ds : len };
}

/* Cut x completely; check coverage. @return pieces */
static unsigned
cut(uint32_t nseg, uint64_t limit, uint64_t max_blocks, unsigned flags)
{
	unsigned np = 0;
	uint64_t total = 0;

	memset(&x, 0, sizeof(x));
	x.segs = segs;
	x.nseg = nseg;
	for (uint32_t i = 0; i < nseg; i++)
		total += kvp_seg_bytes(&segs[i]);
	x.bytes = total;
	CHECK_EQ(kvp_plan_left(&x), total);
	/* Walk every byte the segments name, in order, against the pieces. */
	uint32_t si = 0;
	uint64_t bi = 0, oi = 0, done = 0;
	while (np < MAXP && kvp_plan_next(&x, limit, max_blocks, flags, &pieces[np])) {
		const struct kvp_piece *p = &pieces[np++];
		uint64_t bytes = p->len * p->nblk;

		CHECK(bytes > 0 && bytes <= limit);
		CHECK(p->nblk <= max_blocks || p->nblk == 1);
		if (flags & KVP_PLAN_DST_CONTIG)
			CHECK(p->nblk == 1 || p->dst_stride == p->len);
		for (uint64_t k = 0; k < p->nblk; k++) {
			for (uint64_t left = p->len, at = 0; left;) {
				const struct kvp_seg *s = &segs[si];
				uint64_t run = s->len - oi < left ? s->len - oi : left;

				CHECK_EQ(p->src_off + k * p->src_stride + at,
					 s->src_off + bi * s->src_stride + oi);
				CHECK_EQ(p->dst_off + k * p->dst_stride + at,
					 s->dst_off + bi * s->dst_stride + oi);
				CHECK(p->seg->src == s->src && p->seg->dst_key == s->dst_key);
				at += run;
				left -= run;
				oi += run;
				if (oi == s->len) {
					oi = 0;
					if (++bi == s->count) {
						bi = 0;
						si++;
					}
				}
			}
		}
		done += bytes;
		CHECK_EQ(kvp_plan_left(&x), total - done);
	}
	CHECK_EQ(done, total);
	CHECK_EQ(si, nseg);
	CHECK(!kvp_plan_next(&x, limit, max_blocks, flags, &pieces[0]));
	return np;
}

int
main(void)
{
	/* Contiguous: cut at the limit. */
	segs[0] = seg(&ra, 0, 7, 0, 10000, 1, 0, 0);
	CHECK_EQ(cut(1, 4096, 64, 0), 3);
	CHECK_EQ(pieces[2].len, 10000 - 8192);

	/* Contiguous successors absorbed while they fit; a gap or another region stops it. */
	segs[0] = seg(&ra, 0, 7, 0, 1000, 1, 0, 0);
	segs[1] = seg(&ra, 1000, 7, 1000, 1000, 1, 0, 0);
	segs[2] = seg(&ra, 2000, 7, 2000, 1000, 1, 0, 0);
	segs[3] = seg(&ra, 3000, 7, 3500, 1000, 1, 0, 0); /* dst gap */
	segs[4] = seg(&rb, 4000, 7, 4500, 1000, 1, 0, 0); /* other region */
	CHECK_EQ(cut(5, 1 << 20, 64, 0), 3);
	CHECK_EQ(pieces[0].len, 3000);
	CHECK_EQ(cut(5, 2500, 64, 0), 4); /* the limit stops absorbing */

	/* Strided, blocks below the limit: as many as fit, then max_blocks. */
	segs[0] = seg(&ra, 100, 9, 0, 256, 100, 512, 256);
	CHECK_EQ(cut(1, 4096, 1000, 0), 7); /* 16 per piece */
	CHECK_EQ(pieces[0].nblk, 16);
	CHECK_EQ(pieces[6].nblk, 4);
	CHECK_EQ(cut(1, 1 << 20, 30, 0), 4); /* 30, 30, 30, 10 */
	CHECK_EQ(pieces[3].nblk, 10);

	/* Destination blocks apart: one block per piece under DST_CONTIG. */
	segs[0] = seg(&ra, 0, 9, 0, 256, 50, 256, 512);
	CHECK_EQ(cut(1, 1 << 20, 16, KVP_PLAN_DST_CONTIG), 50);
	CHECK_EQ(cut(1, 1 << 20, 64, 0), 1);
	/* ... but gathered when they land contiguously. */
	segs[0] = seg(&ra, 0, 9, 0, 256, 50, 512, 256);
	CHECK_EQ(cut(1, 1 << 20, 16, KVP_PLAN_DST_CONTIG), 4); /* 16, 16, 16, 2 */

	/* Blocks larger than the limit: cut inside each block. */
	segs[0] = seg(&ra, 0, 9, 0, 10000, 3, 20000, 30000);
	CHECK_EQ(cut(1, 4096, 64, 0), 9);

	/* Strided beside contiguous: never coalesced across kinds. */
	segs[0] = seg(&ra, 0, 9, 0, 512, 1, 0, 0);
	segs[1] = seg(&ra, 512, 9, 512, 64, 8, 128, 64);
	segs[2] = seg(&ra, 2000, 9, 2000, 512, 1, 0, 0);
	CHECK_EQ(cut(3, 1 << 20, 64, 0), 3);
	return kvp_test_result("test_plan");
}
