/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit test for lib/rings, the client ABI channel: both rings driven from
 * one process, producer and consumer views of one channel side by side.
 * It pins what kvproxyd relies on when a client misbehaves: full and empty
 * rings, bulks that straddle the end of the slots, wrap of both the slot
 * index and the free-running 32-bit counters (against a model of the ring),
 * -EPROTO on indices that cannot happen (and not trusted by the next call
 * either), a producer re-attaching to a ring that still holds entries, and
 * the need_wakeup flag. Channels live in heap memory, so ASan sees any
 * access past the slots. (Layout: test_rings_chan; two processes at once:
 * test_rings_stress.)
 *
 * Exit: 0 pass, 1 fail, 99 when the test's own setup broke.
 */
#include <assert.h> /* static_assert in kvp_rings.h, C11 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_rings.h"
#include "kvp_test.h"
#include "ring_entries.h"

struct tchan {
	void *mem;
	size_t len;
	struct kvp_chan_hdr *h;
	struct kvp_ring dsq, dcq; /* daemon: SQ consumer, CQ producer */
	struct kvp_ring csq, ccq; /* client: SQ producer, CQ consumer */
};

static void
tchan_attach(struct tchan *c)
{
	if (kvp_chan_attach(c->mem, c->len, true, &c->dsq, &c->dcq) != 0 ||
	    kvp_chan_attach(c->mem, c->len, false, &c->csq, &c->ccq) != 0) {
		errno = EINVAL;
		setup_failed("kvp_chan_attach");
	}
}

/* @p start presets all four indices, to run the counters across 2^32. */
static void
tchan_open(struct tchan *c, uint32_t sqn, uint32_t cqn, uint32_t start)
{
	c->len = kvp_chan_size(sqn, cqn);
	c->mem = aligned_alloc(PAGE, c->len);
	if (c->mem == NULL)
		setup_failed("aligned_alloc");
	memset(c->mem, 0, c->len);
	c->h = c->mem;
	if (kvp_chan_init(c->mem, c->len, sqn, cqn, 7) != 0) {
		errno = EINVAL;
		setup_failed("kvp_chan_init");
	}
	atomic_store(&c->h->sq.prod, start);
	atomic_store(&c->h->sq.cons, start);
	atomic_store(&c->h->cq.prod, start);
	atomic_store(&c->h->cq.cons, start);
	tchan_attach(c);
}

static void
tchan_close(struct tchan *c)
{
	free(c->mem);
	c->mem = NULL;
}

static void
check_seq(const uint8_t *buf, uint32_t esize, uint64_t first, uint32_t n, int line)
{
	for (uint32_t i = 0; i < n; i++) {
		const char *why = entry_bad(buf + (size_t)i * esize, esize, first + i);

		if (why != NULL) {
			kvp_test_fail(__FILE__, line, "entry %" PRIu64 ": %s (got seq %" PRIu64 ")",
				      first + i, why, entry_seq(buf + (size_t)i * esize));
			return;
		}
	}
}

static void
test_full_empty(void)
{
	uint8_t in[9 * KVP_SQE_SIZE], out[9 * KVP_SQE_SIZE];
	struct tchan c;

	tchan_open(&c, 8, 4, 0);

	/* Empty: nothing to dequeue, the consumer index does not move. */
	CHECK_EQ(kvp_ring_count(&c.dsq), 0);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 8), 0);
	CHECK_EQ(atomic_load(&c.h->sq.cons), 0);
	CHECK_EQ(kvp_ring_free(&c.csq), 8);

	/* More than the ring holds is refused even when the ring is empty. */
	fill_seq(in, KVP_SQE_SIZE, 0, 9);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 9), 0);
	CHECK_EQ(atomic_load(&c.h->sq.prod), 0);

	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 5), 5);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in + 5 * KVP_SQE_SIZE, 3), 3);
	CHECK_EQ(atomic_load(&c.h->sq.prod), 8);
	CHECK_EQ(kvp_ring_free(&c.csq), 0);

	/* Full: a bulk is all or nothing and leaves both indices alone. */
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 1), 0);
	CHECK_EQ(atomic_load(&c.h->sq.prod), 8);
	CHECK_EQ(c.csq.local, 8);
	CHECK_EQ(atomic_load(&c.h->sq.cons), 0);
	CHECK_EQ(kvp_ring_count(&c.dsq), 8);

	/* Three free: a bulk of four is refused whole, a bulk of three fits. */
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 3), 3);
	check_seq(out, KVP_SQE_SIZE, 0, 3, __LINE__);
	fill_seq(in, KVP_SQE_SIZE, 8, 4);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 4), 0);
	CHECK_EQ(atomic_load(&c.h->sq.prod), 8);
	CHECK_EQ(kvp_ring_free(&c.csq), 3);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 3), 3);
	CHECK_EQ(atomic_load(&c.h->sq.prod), 11);

	/*
	 * A burst larger than what is ready returns at most what is ready. It
	 * may return less: prod is re-read only once the entries seen at the
	 * last read are used up (5 of them here), so drain in two calls.
	 */
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 9), 5);
	check_seq(out, KVP_SQE_SIZE, 3, 5, __LINE__);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 9), 3);
	check_seq(out, KVP_SQE_SIZE, 8, 3, __LINE__);
	CHECK_EQ(atomic_load(&c.h->sq.cons), 11);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 1), 0);
	CHECK_EQ(atomic_load(&c.h->sq.cons), 11);

	/* Zero-sized calls are no-ops. */
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 0), 0);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 0), 0);
	CHECK_EQ(atomic_load(&c.h->sq.prod), 11);
	CHECK_EQ(atomic_load(&c.h->sq.cons), 11);
	tchan_close(&c);
}

/* Bulks that straddle the end of the slots land split, in order. */
static void
test_straddle(void)
{
	uint8_t in[8 * KVP_SQE_SIZE], out[8 * KVP_SQE_SIZE];
	struct tchan c;
	const uint8_t *slots;

	tchan_open(&c, 8, 4, 0);
	slots = (const uint8_t *)c.mem + c.h->sq_off;
	fill_seq(in, KVP_SQE_SIZE, 0, 5);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 5), 5);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 5), 5);
	fill_seq(in, KVP_SQE_SIZE, 5, 6);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 6), 6);
	/* Seq 5..7 in slots 5..7, seq 8..10 in slots 0..2. */
	for (uint32_t i = 0; i < 6; i++)
		CHECK_EQ(entry_seq(slots + (size_t)((5 + i) & 7) * KVP_SQE_SIZE), 5 + i);
	CHECK_EQ(kvp_ring_count(&c.dsq), 6);
	CHECK_EQ(entry_seq(kvp_ring_peek(&c.dsq, 0)), 5);
	CHECK_EQ(entry_seq(kvp_ring_peek(&c.dsq, 3)), 8);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 4), 4);
	check_seq(out, KVP_SQE_SIZE, 5, 4, __LINE__);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 8), 2);
	check_seq(out, KVP_SQE_SIZE, 9, 2, __LINE__);

	/* Same on the CQ, 4 entries of 128 bytes: peek then consume in place. */
	slots = (const uint8_t *)c.mem + c.h->cq_off;
	fill_seq(in, KVP_CQE_SIZE, 0, 3);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.dcq, in, 3), 3);
	CHECK_EQ(kvp_ring_count(&c.ccq), 3);
	kvp_ring_consume(&c.ccq, 3);
	CHECK_EQ(atomic_load(&c.h->cq.cons), 3);
	fill_seq(in, KVP_CQE_SIZE, 3, 4);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.dcq, in, 4), 4);
	CHECK_EQ(entry_seq(slots + 3 * KVP_CQE_SIZE), 3);
	CHECK_EQ(entry_seq(slots + 0 * KVP_CQE_SIZE), 4);
	CHECK_EQ(entry_seq(slots + 2 * KVP_CQE_SIZE), 6);
	CHECK_EQ(kvp_ring_count(&c.ccq), 4);
	for (uint32_t i = 0; i < 4; i++)
		CHECK(entry_bad(kvp_ring_peek(&c.ccq, i), KVP_CQE_SIZE, 3 + i) == NULL);
	kvp_ring_consume(&c.ccq, 4);
	CHECK_EQ(kvp_ring_count(&c.ccq), 0);
	tchan_close(&c);
}

/*
 * Random enqueue/dequeue against a model of the ring. Sizes go up to
 * size + 1 so every call hits full, partial and straddling cases; the
 * free/count probes are sparse so the cached-index fast paths run too.
 */
static void
run_model(struct kvp_ring *p, struct kvp_ring *c, uint32_t start, uint64_t seed, unsigned iters)
{
	uint32_t size = p->size, esize = p->esize;
	uint8_t *in = malloc((size_t)(size + 1) * esize), *out = malloc((size_t)(size + 1) * esize);
	uint64_t pseq = 0, cseq = 0;
	int before = kvp_test_failures;

	if (in == NULL || out == NULL)
		setup_failed("malloc");
	for (unsigned i = 0; i < iters && kvp_test_failures == before; i++) {
		uint64_t r = kvp_test_splitmix64(&seed);
		uint32_t n = 1 + (uint32_t)((r >> 8) % (size + 1));
		uint32_t used = (uint32_t)(pseq - cseq);
		int rc;

		if (r & 1) {
			fill_seq(in, esize, pseq, n);
			rc = kvp_ring_enqueue_bulk(p, in, n);
			CHECK_EQ(rc, size - used >= n ? n : 0);
			pseq += rc > 0 ? (uint32_t)rc : 0;
			CHECK_EQ(atomic_load(&p->shm->prod), (uint32_t)(start + pseq));
		} else {
			rc = kvp_ring_dequeue_burst(c, out, n);
			/* Less than ready is fine (see test_full_empty), none is not. */
			if (used == 0)
				CHECK_EQ(rc, 0);
			else
				CHECK(rc >= 1 && (uint32_t)rc <= (n < used ? n : used));
			if (rc > 0)
				check_seq(out, esize, cseq, (uint32_t)rc, __LINE__);
			cseq += rc > 0 ? (uint32_t)rc : 0;
			CHECK_EQ(atomic_load(&c->shm->cons), (uint32_t)(start + cseq));
		}
		if (r % 7 == 0) {
			CHECK_EQ(kvp_ring_count(c), pseq - cseq);
			CHECK_EQ(kvp_ring_free(p), size - (pseq - cseq));
		}
	}
	free(in);
	free(out);
}

static void
test_wrap(void)
{
	/* Indices from 0, then from just below 2^32 so the counters wrap. */
	static const uint32_t starts[] = { 0, UINT32_MAX - 37 };

	for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++) {
		struct tchan c;

		tchan_open(&c, 8, 4, starts[i]);
		CHECK_EQ(c.csq.local, starts[i]);
		CHECK_EQ(c.dsq.local, starts[i]);
		run_model(&c.csq, &c.dsq, starts[i], 1 + i, 4000);
		run_model(&c.dcq, &c.ccq, starts[i], 100 + i, 4000);
		tchan_close(&c);
	}
}

/* Impossible indices written by the peer are reported, never followed. */
static void
test_corrupt(void)
{
	uint8_t in[8 * KVP_SQE_SIZE], out[8 * KVP_SQE_SIZE];
	struct tchan c;

	tchan_open(&c, 8, 4, 0);
	fill_seq(in, KVP_SQE_SIZE, 0, 2);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 2), 2);

	/* prod more than a ring ahead of cons, or behind it. */
	atomic_store(&c.h->sq.prod, 0 + 8 + 1);
	CHECK_EQ(kvp_ring_count(&c.dsq), -EPROTO);
	CHECK_EQ(c.dsq.bad, 9); /* what the daemon's log line names */
	tchan_attach(&c);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 8), -EPROTO);
	CHECK_EQ(atomic_load(&c.h->sq.cons), 0);
	atomic_store(&c.h->sq.prod, UINT32_MAX);
	tchan_attach(&c);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 1), -EPROTO);
	CHECK_EQ(kvp_ring_count(&c.dsq), -EPROTO);
	/* prod exactly a ring ahead is a full ring, not an error. */
	atomic_store(&c.h->sq.prod, 8);
	CHECK_EQ(kvp_ring_count(&c.dsq), 8);
	atomic_store(&c.h->sq.prod, 2);
	tchan_attach(&c);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 8), 2);
	check_seq(out, KVP_SQE_SIZE, 0, 2, __LINE__);
	CHECK_EQ(atomic_load(&c.h->sq.cons), 2);

	/*
	 * cons ahead of prod, or more than a ring behind it. First through an
	 * enqueue that must look at cons (8 > the 6 free it saw last), which
	 * must write nothing; then through kvp_ring_free().
	 */
	CHECK_EQ(kvp_ring_free(&c.csq), 8);
	fill_seq(in, KVP_SQE_SIZE, 2, 2);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 2), 2);
	atomic_store(&c.h->sq.cons, 5);
	fill_seq(in, KVP_SQE_SIZE, 4, 8);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 8), -EPROTO);
	CHECK_EQ(atomic_load(&c.h->sq.prod), 4);
	CHECK_EQ(c.csq.local, 4);
	CHECK_EQ(kvp_ring_free(&c.csq), -EPROTO);
	atomic_store(&c.h->sq.cons, 4 - 8 - 1);
	CHECK_EQ(kvp_ring_free(&c.csq), -EPROTO);
	CHECK_EQ(c.csq.bad, (uint32_t)(4 - 8 - 1));
	/* In range, but behind what the producer already saw: a consumer never un-consumes. */
	atomic_store(&c.h->sq.cons, 4 - 8);
	CHECK_EQ(kvp_ring_free(&c.csq), -EPROTO);
	atomic_store(&c.h->sq.cons, 4);
	CHECK_EQ(kvp_ring_free(&c.csq), 8);

	/* Same on the CQ, where the client is the one reading indices. */
	atomic_store(&c.h->cq.prod, 4 + 1);
	CHECK_EQ(kvp_ring_count(&c.ccq), -EPROTO);
	atomic_store(&c.h->cq.prod, 0);
	atomic_store(&c.h->cq.cons, 1);
	CHECK_EQ(kvp_ring_free(&c.dcq), -EPROTO);
	tchan_close(&c);
}

/*
 * After -EPROTO the bad index must not be trusted by the next call either:
 * "checked on every use". The fast paths of enqueue_bulk and dequeue_burst
 * use r->cached without re-reading, so it must only ever hold a checked value.
 */
static void
test_corrupt_sticky(void)
{
	uint8_t in[8 * KVP_SQE_SIZE], out[8 * KVP_SQE_SIZE];
	struct tchan c;

	tchan_open(&c, 8, 4, 0);
	fill_seq(in, KVP_SQE_SIZE, 0, 2);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 2), 2);

	atomic_store(&c.h->sq.prod, 8 + 1);
	CHECK_EQ(kvp_ring_count(&c.dsq), -EPROTO);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 4), -EPROTO);
	CHECK_EQ(atomic_load(&c.h->sq.cons), 0);
	atomic_store(&c.h->sq.prod, 2);

	tchan_attach(&c);
	atomic_store(&c.h->sq.cons, 3);
	CHECK_EQ(kvp_ring_free(&c.csq), -EPROTO);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 1), -EPROTO);
	CHECK_EQ(atomic_load(&c.h->sq.prod), 2);
	tchan_close(&c);
}

/*
 * A producer attaching to a ring that still holds entries (a client
 * re-attaching its channel) must not believe the ring is empty.
 */
static void
test_reattach_nonempty(void)
{
	uint8_t in[8 * KVP_SQE_SIZE], out[8 * KVP_SQE_SIZE];
	struct tchan c;

	tchan_open(&c, 8, 4, 0);
	fill_seq(in, KVP_SQE_SIZE, 0, 6);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 6), 6);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 1), 1);

	tchan_attach(&c);
	CHECK_EQ(c.csq.local, 6);
	CHECK_EQ(c.dsq.local, 1);
	fill_seq(in, KVP_SQE_SIZE, 6, 4);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 4), 0);
	CHECK_EQ(kvp_ring_free(&c.csq), 3);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.csq, in, 3), 3);
	CHECK_EQ(kvp_ring_dequeue_burst(&c.dsq, out, 8), 8);
	check_seq(out, KVP_SQE_SIZE, 1, 8, __LINE__);
	tchan_close(&c);
}

static void
test_wakeup_flag(void)
{
	uint8_t e[KVP_CQE_SIZE], out[KVP_CQE_SIZE];
	struct tchan c;

	tchan_open(&c, 8, 4, 0);
	CHECK(!kvp_ring_wakeup_needed(&c.dcq));
	/* Empty: the consumer may block, and the producer will see the flag. */
	CHECK(kvp_ring_prepare_wait(&c.ccq));
	CHECK_EQ(atomic_load(&c.h->cq.need_wakeup), 1);
	CHECK(kvp_ring_wakeup_needed(&c.dcq));
	entry_fill(e, KVP_CQE_SIZE, 0);
	CHECK_EQ(kvp_ring_enqueue_bulk(&c.dcq, e, 1), 1);
	CHECK(kvp_ring_wakeup_needed(&c.dcq));
	kvp_ring_finish_wait(&c.ccq);
	CHECK_EQ(atomic_load(&c.h->cq.need_wakeup), 0);
	CHECK(!kvp_ring_wakeup_needed(&c.dcq));
	/* Not empty: no wait, and the flag is left clear. */
	CHECK(!kvp_ring_prepare_wait(&c.ccq));
	CHECK_EQ(atomic_load(&c.h->cq.need_wakeup), 0);
	CHECK(!kvp_ring_wakeup_needed(&c.dcq));
	CHECK_EQ(kvp_ring_dequeue_burst(&c.ccq, out, 1), 1);
	CHECK(entry_bad(out, KVP_CQE_SIZE, 0) == NULL);
	/* The SQ's flag is its own. */
	CHECK(kvp_ring_prepare_wait(&c.dsq));
	CHECK_EQ(atomic_load(&c.h->sq.need_wakeup), 1);
	CHECK_EQ(atomic_load(&c.h->cq.need_wakeup), 0);
	kvp_ring_finish_wait(&c.dsq);
	tchan_close(&c);
}

int
main(void)
{
	test_full_empty();
	test_straddle();
	test_wrap();
	test_corrupt();
	test_corrupt_sticky();
	test_reattach_nonempty();
	test_wakeup_flag();
	return kvp_test_result("test_rings_spsc");
}
