/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Latency histograms (log-linear buckets, fixed memory) and the table of the
 * slowest recent transfers. Both are written by one worker lcore and read by
 * the main lcore: histogram buckets with relaxed loads, slowest entries
 * under a per-entry sequence lock. Nothing here allocates.
 */
#include <string.h>

#include "kvp_worker.h"

static const char *const hphase_names[KVP_HP_MAX] = {
	[KVP_HP_QUEUE] = "queue", [KVP_HP_ADMIT] = "admit",     [KVP_HP_FIRST] = "first_byte",
	[KVP_HP_SEND] = "send",   [KVP_HP_WIRE] = "wire",       [KVP_HP_DELIVER] = "deliver",
	[KVP_HP_TOTAL] = "total", [KVP_HP_RX_RECV] = "receive", [KVP_HP_RX_DELIVER] = "deliver",
};

const char *
kvp_hphase_name(int ph)
{
	return ph >= 0 && ph < KVP_HP_MAX ? hphase_names[ph] : "?";
}

uint64_t
kvp_hist_upper(unsigned i)
{
	if (i >= KVP_HIST_BUCKETS - 1)
		return UINT64_MAX;
	if (i < KVP_HIST_SUB)
		return (uint64_t)(i + 1) << (KVP_HIST_MIN_SHIFT - KVP_HIST_SUB_BITS);
	unsigned j = i - KVP_HIST_SUB;
	unsigned e = KVP_HIST_MIN_SHIFT + j / KVP_HIST_SUB;
	unsigned s = j % KVP_HIST_SUB;

	return (uint64_t)(KVP_HIST_SUB + s + 1) << (e - KVP_HIST_SUB_BITS);
}

uint64_t
kvp_hist_count(const struct kvp_hist *h)
{
	uint64_t n = 0;

	for (unsigned i = 0; i < KVP_HIST_BUCKETS; i++)
		n += KVP_STAT_READ(h->b[i]);
	return n;
}

void
kvp_hist_merge(struct kvp_hist *dst, const struct kvp_hist *src)
{
	dst->sum_ns += KVP_STAT_READ(src->sum_ns);
	for (unsigned i = 0; i < KVP_HIST_BUCKETS; i++)
		dst->b[i] += KVP_STAT_READ(src->b[i]);
}

uint64_t
kvp_hist_quantile(const struct kvp_hist *h, double q)
{
	uint64_t n = kvp_hist_count(h), rank, seen = 0;

	if (n == 0)
		return 0;
	if (q <= 0)
		q = 1e-9;
	if (q > 1)
		q = 1;
	rank = (uint64_t)(q * (double)n);
	if ((double)rank < q * (double)n)
		rank++;
	if (rank == 0)
		rank = 1;
	for (unsigned i = 0; i < KVP_HIST_BUCKETS; i++) {
		seen += KVP_STAT_READ(h->b[i]);
		if (seen >= rank)
			return i == KVP_HIST_BUCKETS - 1 ? kvp_hist_upper(i - 1) :
							   kvp_hist_upper(i);
	}
	return kvp_hist_upper(KVP_HIST_BUCKETS - 2);
}

/* ---- slowest recent transfers ---- */

static void
slow_write(struct kvp_slow *e, const struct kvp_xfer *x, uint64_t total_ns)
{
	uint32_t seq = e->seq;

	/* Odd: readers retry. The release fence orders it before the field stores. */
	__atomic_store_n(&e->seq, seq + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	e->client = x->client;
	e->user_id = x->user_id;
	e->tag = kvp_xfer_tag(x);
	e->bytes = x->bytes;
	e->deadline_ns = x->deadline_ns;
	e->total_ns = total_ns;
	memcpy(e->ts, x->ts, sizeof(e->ts));
	e->nseg = x->nseg;
	e->peer = x->handle;
	e->status = (int16_t)x->status;
	/* Pairs with the acquire load of seq in kvp_slowest_read(). */
	__atomic_store_n(&e->seq, seq + 2, __ATOMIC_RELEASE);
}

/* Recompute the fastest entry and the oldest one. */
static void
slow_rescan(struct kvp_slowest *t)
{
	uint64_t min = UINT64_MAX, oldest = UINT64_MAX;

	for (uint32_t i = 0; i < t->used; i++) {
		if (t->e[i].total_ns < min) {
			min = t->e[i].total_ns;
			t->min_i = i;
		}
		if (t->e[i].ts[KVP_TS_DONE] < oldest)
			oldest = t->e[i].ts[KVP_TS_DONE];
	}
	t->oldest_done = oldest;
}

void
kvp_slowest_offer(struct kvp_slowest *t, const struct kvp_xfer *x, uint64_t total_ns, uint64_t now,
		  uint64_t window_ns)
{
	uint32_t victim;

	if (t->used < KVP_SLOWEST_N) {
		victim = t->used;
		slow_write(&t->e[victim], x, total_ns);
		/* Publish the entry before the count that makes readers look at it. */
		__atomic_store_n(&t->used, t->used + 1, __ATOMIC_RELEASE);
		slow_rescan(t);
		return;
	}
	bool stale = now - t->oldest_done > window_ns;

	/* The common case: a full table of recent, slower transfers. */
	if (!stale && total_ns <= t->e[t->min_i].total_ns)
		return;
	victim = t->min_i;
	if (stale) {
		/* Age first: a stale entry makes room whatever its duration. */
		for (uint32_t i = 0; i < t->used; i++)
			if (now - t->e[i].ts[KVP_TS_DONE] > window_ns) {
				victim = i;
				break;
			}
	}
	slow_write(&t->e[victim], x, total_ns);
	slow_rescan(t);
}

bool
kvp_slowest_read(const struct kvp_slowest *t, unsigned i, struct kvp_slow *out)
{
	if (i >= __atomic_load_n(&t->used, __ATOMIC_ACQUIRE))
		return false;
	const struct kvp_slow *e = &t->e[i];

	for (int tries = 0; tries < 100; tries++) {
		uint32_t s1 = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);

		if (s1 & 1)
			continue;
		memcpy(out, (const void *)e, sizeof(*out));
		/* Pairs with the release fence in slow_write(): the copy precedes the re-check. */
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&e->seq, __ATOMIC_RELAXED) == s1)
			return true;
	}
	return false;
}
