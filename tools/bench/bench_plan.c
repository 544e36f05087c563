/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxy-bench's deterministic plan (bench_plan.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench_plan.h"
#include "kvp_test.h"

/*
 * The plan's numbers come from splitmix64 (kvp_test_below()): integer
 * arithmetic only, so both sides agree on any machine.
 *
 * Segment lengths: a uniform power of two, then uniform within it. A
 * shuffled destination layout makes a transport that ignored dst_off fail
 * verification.
 */
int
plan_build(struct plan *p, const struct plan_params *pp)
{
	uint64_t s = kvp_test_mix64(pp->seed ^ 0x6b7670726f787931ull);
	uint64_t minr = (pp->min_seg + 63) & ~63ull;
	bool round64 = pp->min_seg >= 64 && minr <= pp->max_seg;
	unsigned int lo = 63 - __builtin_clzll(pp->min_seg), hi = 63 - __builtin_clzll(pp->max_seg);
	size_t cap = 1024, *perm = NULL;
	struct seg *grown;

	memset(p, 0, sizeof(*p));
	p->pat = kvp_test_mix64(pp->seed ^ 0x5061747465726e21ull);
	p->k = pp->segs_per_xfer;
	p->segs = malloc(cap * sizeof(*p->segs));
	if (p->segs == NULL)
		goto err_free;
	for (uint64_t off = 0; off < pp->size;) {
		uint64_t base = 1ull << (lo + kvp_test_below(&s, hi - lo + 1));
		uint64_t len = base + kvp_test_below(&s, base);

		len = len < pp->min_seg ? pp->min_seg : len > pp->max_seg ? pp->max_seg : len;
		if (round64)
			len = (len & ~63ull) < minr ? minr : len & ~63ull;
		if (len > pp->size - off)
			len = pp->size - off;
		if (p->nseg == cap) {
			grown = realloc(p->segs, 2 * cap * sizeof(*p->segs));
			if (grown == NULL)
				goto err_free;
			p->segs = grown;
			cap *= 2;
		}
		p->segs[p->nseg++] = (struct seg){ .src_off = off, .len = len };
		off += len;
	}

	perm = malloc(p->nseg * sizeof(*perm));
	if (perm == NULL)
		goto err_free;
	s = kvp_test_mix64(pp->seed ^ 0x53687566666c6521ull);
	for (size_t i = 0; i < p->nseg; i++)
		perm[i] = i;
	for (size_t i = p->nseg - 1; i > 0 && !pp->linear; i--) {
		size_t j = (size_t)kvp_test_below(&s, i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	uint64_t dst = 0;

	for (size_t i = 0; i < p->nseg; i++) {
		p->segs[perm[i]].dst_off = dst;
		dst += p->segs[perm[i]].len;
	}
	free(perm);
	p->nxfer = (p->nseg + p->k - 1) / p->k;
	return 0;

err_free:
	plan_free(p);
	return -ENOMEM;
}

void
plan_free(struct plan *p)
{
	free(p->segs);
	p->segs = NULL;
	p->nseg = p->nxfer = 0;
}

uint32_t
plan_xfer(const struct plan *p, size_t t, size_t *first, uint64_t *bytes, struct kvp_segment *out,
	  uint64_t src_key, uint64_t dst_key)
{
	size_t a = t * p->k, b = a + p->k < p->nseg ? a + p->k : p->nseg;

	*first = a;
	*bytes = 0;
	for (size_t i = a; i < b; i++) {
		const struct seg *s = &p->segs[i];

		*bytes += s->len;
		if (out != NULL)
			out[i - a] = (struct kvp_segment){ src_key, s->src_off, dst_key, s->dst_off,
							   s->len };
	}
	return (uint32_t)(b - a);
}
