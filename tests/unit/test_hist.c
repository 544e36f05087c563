/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Latency histograms and the slowest-transfers table: bucket bounds are
 * contiguous and monotonic, every value lands in the bucket whose bounds
 * hold it (Prometheus "le" semantics), relative width stays within 25 %,
 * quantiles, merge, overflow; the slowest table keeps the N slowest, lets
 * stale entries go, and reads back consistently.
 */
#include <stdlib.h>
#include <string.h>

#include "kvp_worker.h"
#include "kvp_test.h"

/* Bucket i holds (upper(i-1), upper(i)]. */
static void
test_bounds(void)
{
	uint64_t prev = 0;

	CHECK_EQ(kvp_hist_bucket(0), 0);
	CHECK_EQ(kvp_hist_bucket(1), 0);
	CHECK_EQ(kvp_hist_upper(0), 256);
	for (unsigned i = 0; i + 1 < KVP_HIST_BUCKETS; i++) {
		uint64_t up = kvp_hist_upper(i);

		CHECK(up > prev);
		/* The bound itself belongs to its bucket, one more to the next. */
		CHECK_EQ(kvp_hist_bucket(up), i);
		CHECK_EQ(kvp_hist_bucket(up + 1), i + 1);
		if (i > 0)
			CHECK_EQ(kvp_hist_bucket(prev + 1), i);
		/* Log-linear: a bucket above 1 us is at most 25 % of its lower bound wide. */
		if (prev >= 1024)
			CHECK((up - prev) * 4 <= prev);
		prev = up;
	}
	CHECK_EQ(kvp_hist_upper(KVP_HIST_BUCKETS - 1), UINT64_MAX);
	CHECK_EQ(kvp_hist_upper(KVP_HIST_BUCKETS - 2), 1ull << (KVP_HIST_MAX_SHIFT + 1));
	CHECK_EQ(kvp_hist_bucket(UINT64_MAX), KVP_HIST_BUCKETS - 1);
	CHECK_EQ(kvp_hist_bucket((1ull << (KVP_HIST_MAX_SHIFT + 1)) + 1), KVP_HIST_BUCKETS - 1);
	/* Every power of two from 256 ns is a bucket bound (the Prometheus "le" set). */
	for (unsigned s = 8; s <= KVP_HIST_MAX_SHIFT + 1; s++)
		CHECK_EQ(kvp_hist_upper(kvp_hist_bucket(1ull << s)), 1ull << s);
	/* A pseudo-random sweep: value within its bucket's bounds. */
	uint64_t x = 88172645463325252ull;
	for (int k = 0; k < 100000; k++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		uint64_t v = x >> (x & 63);
		unsigned b = kvp_hist_bucket(v);

		CHECK(b < KVP_HIST_BUCKETS);
		CHECK(v <= kvp_hist_upper(b));
		CHECK(b == 0 || v > kvp_hist_upper(b - 1));
	}
}

static void
test_record_quantile_merge(void)
{
	struct kvp_hist *h = calloc(1, sizeof(*h)), *m = calloc(1, sizeof(*m));
	uint64_t sum = 0;

	CHECK_EQ(kvp_hist_count(h), 0);
	CHECK_EQ(kvp_hist_quantile(h, 0.5), 0);
	/* 1..1000 us: the median is 500 us, p99 990 us, within a bucket's 25 %. */
	for (uint64_t us = 1; us <= 1000; us++) {
		kvp_hist_record(h, us * 1000);
		sum += us * 1000;
	}
	CHECK_EQ(kvp_hist_count(h), 1000);
	CHECK_EQ(h->sum_ns, sum);
	uint64_t p50 = kvp_hist_quantile(h, 0.5), p99 = kvp_hist_quantile(h, 0.99);

	CHECK(p50 >= 500000 && p50 <= 625000);
	CHECK(p99 >= 990000 && p99 <= 1237500);
	CHECK(kvp_hist_quantile(h, 1.0) >= 1000000);
	CHECK(kvp_hist_quantile(h, 0.001) <= 1280);
	/* Quantiles never decrease with q. */
	uint64_t last = 0;
	for (double q = 0.01; q <= 1.0; q += 0.01) {
		uint64_t v = kvp_hist_quantile(h, q);

		CHECK(v >= last);
		last = v;
	}
	/* Merge adds counts and sums. */
	kvp_hist_merge(m, h);
	kvp_hist_merge(m, h);
	CHECK_EQ(kvp_hist_count(m), 2000);
	CHECK_EQ(m->sum_ns, 2 * sum);
	CHECK_EQ(kvp_hist_quantile(m, 0.5), p50);
	/* The overflow bucket: its quantile reports the largest finite bound. */
	memset(h, 0, sizeof(*h));
	kvp_hist_record(h, UINT64_MAX / 2);
	CHECK_EQ(h->b[KVP_HIST_BUCKETS - 1], 1);
	CHECK_EQ(kvp_hist_quantile(h, 0.5), 1ull << (KVP_HIST_MAX_SHIFT + 1));
	free(h);
	free(m);
}

static struct kvp_xfer *
xfer(uint64_t user_id, uint64_t done)
{
	static struct kvp_xfer x;

	memset(&x, 0, sizeof(x));
	x.user_id = user_id;
	x.client = 7;
	x.ts[KVP_TS_PICKUP] = done - 1;
	x.ts[KVP_TS_DONE] = done;
	return &x;
}

static void
test_slowest(void)
{
	struct kvp_slowest *t = calloc(1, sizeof(*t));
	struct kvp_slow e;
	const uint64_t win = 1000;
	uint64_t now = 10000;

	CHECK(!kvp_slowest_read(t, 0, &e));
	/* 100 transfers of increasing duration: the table keeps the 32 slowest. */
	for (uint64_t i = 1; i <= 100; i++)
		kvp_slowest_offer(t, xfer(i, now), i * 10, now, win);
	CHECK_EQ(t->used, KVP_SLOWEST_N);
	uint64_t seen = 0;
	for (unsigned i = 0; i < KVP_SLOWEST_N; i++) {
		CHECK(kvp_slowest_read(t, i, &e));
		CHECK(e.user_id > 100 - KVP_SLOWEST_N);
		CHECK_EQ(e.total_ns, e.user_id * 10);
		CHECK_EQ(e.client, 7);
		CHECK_EQ(e.seq & 1, 0);
		seen |= 1ull << (e.user_id - (100 - KVP_SLOWEST_N) - 1);
	}
	CHECK_EQ(seen, (1ull << KVP_SLOWEST_N) - 1);
	CHECK(!kvp_slowest_read(t, KVP_SLOWEST_N, &e));
	/* A fast transfer does not displace recent slow ones. */
	kvp_slowest_offer(t, xfer(500, now + 1), 5, now + 1, win);
	for (unsigned i = 0; i < KVP_SLOWEST_N; i++)
		CHECK(kvp_slowest_read(t, i, &e) && e.user_id != 500);
	/* Once the entries are older than the window, even a fast one gets in. */
	now += 2 * win;
	kvp_slowest_offer(t, xfer(600, now), 5, now, win);
	bool found = false;
	for (unsigned i = 0; i < KVP_SLOWEST_N; i++)
		if (kvp_slowest_read(t, i, &e) && e.user_id == 600)
			found = true;
	CHECK(found);
	/* An entry caught mid-write (odd sequence) is not returned. */
	t->e[3].seq |= 1;
	CHECK(!kvp_slowest_read(t, 3, &e));
	free(t);
}

int
main(void)
{
	test_bounds();
	test_record_quantile_merge();
	test_slowest();
	CHECK(strcmp(kvp_hphase_name(KVP_HP_WIRE), "wire") == 0);
	CHECK(strcmp(kvp_hphase_name(KVP_HP_MAX), "?") == 0);
	return kvp_test_result("hist");
}
