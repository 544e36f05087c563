/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The transfer plan of kvproxy-bench: both sides derive it from the same
 * numbers (seed, size, segment bounds, segments per transfer, layout), so
 * the decode side can check what landed without a side channel.
 *
 * Segment lengths are log-uniform between min_seg and max_seg; destination
 * offsets lay the same segments out in a shuffled order (or, linear, at the
 * source offsets). The source pattern is the test-helper library's
 * (kvp_test_pattern_fill() with the plan's pattern key), so byte o of the
 * source is a function of (pat, o) on any machine.
 *
 * Threading: none (one plan per process, built once). Memory: plan_build()
 * allocates the segment array, plan_free() releases it.
 */
#ifndef KVP_BENCH_PLAN_H
#define KVP_BENCH_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvproxy.h"

/** What a plan is derived from (the "plan flags", equal on both sides). */
struct plan_params {
	uint64_t seed;
	uint64_t size; /**< bytes of each region */
	uint64_t min_seg;
	uint64_t max_seg;
	uint32_t segs_per_xfer;
	bool linear; /**< destination layout = source layout (KV pages of one request) */
};

struct seg {
	uint64_t src_off;
	uint64_t dst_off;
	uint64_t len;
};

struct plan {
	struct seg *segs; /**< in source order */
	size_t nseg;
	size_t nxfer;
	uint32_t k;   /**< segments per transfer */
	uint64_t pat; /**< pattern key derived from the seed */
};

/**
 * Build the plan for @p pp (size > 0, 0 < min_seg <= max_seg,
 * segs_per_xfer > 0: the caller checked).
 * @return 0; -ENOMEM (nothing left allocated)
 */
int plan_build(struct plan *p, const struct plan_params *pp);

/** Release what plan_build() allocated. */
void plan_free(struct plan *p);

/**
 * Segments of transfer @p t are plan segments [*first, *first + return),
 * *@p bytes long in all; with @p out, also build them as kvp_segments from
 * region @p src_key to region @p dst_key.
 */
uint32_t plan_xfer(const struct plan *p, size_t t, size_t *first, uint64_t *bytes,
		   struct kvp_segment *out, uint64_t src_key, uint64_t dst_key);

#endif /* KVP_BENCH_PLAN_H */
