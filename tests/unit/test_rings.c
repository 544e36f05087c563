/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit test for lib/rings, the client ABI channel.
 *
 * The single-process part pins what kvproxyd relies on when a client
 * misbehaves: layout validation at attach, full and empty rings, wrap of both
 * the slot index and the free-running 32-bit counters, and -EPROTO on indices
 * that cannot happen. Channels live in heap memory there, so ASan sees any
 * access past the slots.
 *
 * The two-process part runs both rings at once across fork() over a memfd,
 * each side with its own mapping. Consumers block only through the
 * need_wakeup protocol and an eventfd, never on a timer, so a lost wakeup
 * becomes a failure after WAIT_TIMEOUT_MS instead of a hang or a slow pass.
 *
 * Usage: test_rings [ENTRIES]	(entries per direction in the stress part)
 * Exit: 0 pass, 1 fail, 99 when the test's own setup broke.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <assert.h> /* static_assert in kvp_rings.h, C11 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvp_rings.h"
#include "kvp_test.h"

#define PAGE            4096u
#define WAIT_TIMEOUT_MS 30000
#define STRESS_RING     64 /* small: the stress run wraps constantly and is often full */
#define STRESS_BULK_MAX 33
#define STRESS_DEFAULT  2000000ull
#define ESIZE_MAX       KVP_CQE_SIZE

/* The test's own set-up broke (exit 99), with the errno of the step. */
static _Noreturn void
setup_failed(const char *what)
{
	kvp_test_setup_failed("%s: %s", what, strerror(errno));
}

static uint32_t
fnv1a(const uint8_t *p, size_t n)
{
	uint32_t h = 2166136261u;

	while (n--)
		h = (h ^ *p++) * 16777619u;
	return h;
}

/*
 * Entry layout for every test: sequence number, checksum of the payload,
 * then payload bytes derived from the sequence number. A torn, stale or
 * misplaced copy fails either the sequence, the checksum or the payload.
 */
#define ENTRY_HDR 16

static void
entry_fill(uint8_t *e, uint32_t esize, uint64_t seq)
{
	uint64_t st = seq ^ ((uint64_t)esize << 56);
	uint32_t csum;

	memcpy(e, &seq, sizeof(seq));
	for (uint32_t off = ENTRY_HDR; off < esize; off += 8) {
		uint64_t v = kvp_test_splitmix64(&st);

		memcpy(e + off, &v, sizeof(v));
	}
	csum = fnv1a(e + ENTRY_HDR, esize - ENTRY_HDR);
	memcpy(e + 8, &csum, sizeof(csum));
	memset(e + 12, 0, 4);
}

/* Returns NULL if @p e is entry @p seq, else why not. */
static const char *
entry_bad(const uint8_t *e, uint32_t esize, uint64_t seq)
{
	uint8_t want[ESIZE_MAX];
	uint64_t got_seq;
	uint32_t csum;

	memcpy(&got_seq, e, sizeof(got_seq));
	if (got_seq != seq)
		return got_seq < seq ? "duplicate or stale entry" : "entry lost or reordered";
	memcpy(&csum, e + 8, sizeof(csum));
	if (csum != fnv1a(e + ENTRY_HDR, esize - ENTRY_HDR))
		return "payload checksum mismatch";
	entry_fill(want, esize, seq);
	if (memcmp(want, e, esize) != 0)
		return "payload differs from what was sent";
	return NULL;
}

static uint64_t
entry_seq(const uint8_t *e)
{
	uint64_t s;

	memcpy(&s, e, sizeof(s));
	return s;
}

/* ---- single process ---- */

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
test_chan_size(void)
{
	/* Zero, one, not powers of two, and powers of two above 2^20. */
	static const uint32_t bad[] = {
		0, 1, 3, 6, 12, 1000, (1u << 20) + 1, 1u << 21, 1u << 31, UINT32_MAX,
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK_EQ(kvp_chan_size(bad[i], 4), 0);
		CHECK_EQ(kvp_chan_size(4, bad[i]), 0);
	}
	/* Header page, then each ring's slots rounded up to a page. */
	CHECK_EQ(kvp_chan_size(2, 2), 3 * PAGE);
	CHECK_EQ(kvp_chan_size(64, 32), PAGE + PAGE + PAGE);
	CHECK_EQ(kvp_chan_size(128, 64), PAGE + 2 * PAGE + 2 * PAGE);
	CHECK_EQ(kvp_chan_size(1u << 20, 1u << 20),
		 PAGE + (1ull << 20) * KVP_SQE_SIZE + (1ull << 20) * KVP_CQE_SIZE);
}

static void
test_chan_init(void)
{
	size_t len = kvp_chan_size(128, 64);
	uint8_t *mem = aligned_alloc(PAGE, len);
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)mem;

	if (mem == NULL)
		setup_failed("aligned_alloc");
	memset(mem, 0, len);
	CHECK_EQ(kvp_chan_init(mem, len, 0, 64, 1), -EINVAL);
	CHECK_EQ(kvp_chan_init(mem, len, 1, 64, 1), -EINVAL);
	CHECK_EQ(kvp_chan_init(mem, len, 96, 64, 1), -EINVAL);
	CHECK_EQ(kvp_chan_init(mem, len, 128, 48, 1), -EINVAL);
	CHECK_EQ(kvp_chan_init(mem, len, 1u << 21, 64, 1), -EINVAL);
	CHECK_EQ(kvp_chan_init(mem, len, 128, 1u << 31, 1), -EINVAL);
	CHECK_EQ(kvp_chan_init(mem, len - 1, 128, 64, 1), -EINVAL);
	/* A rejected init must not leave something attachable behind. */
	CHECK(h->magic != KVP_CHAN_MAGIC);

	memset(mem, 0xa5, len);
	CHECK_EQ(kvp_chan_init(mem, len, 128, 64, 42), 0);
	CHECK(h->magic == KVP_CHAN_MAGIC);
	CHECK_EQ(h->version, KVP_ABI_VERSION);
	CHECK_EQ(h->hdr_size, sizeof(*h));
	CHECK_EQ(h->sq_entries, 128);
	CHECK_EQ(h->cq_entries, 64);
	CHECK_EQ(h->sq_esize, KVP_SQE_SIZE);
	CHECK_EQ(h->cq_esize, KVP_CQE_SIZE);
	CHECK_EQ(h->sq_off, PAGE);
	CHECK_EQ(h->cq_off, 3 * PAGE);
	CHECK_EQ(h->size, len);
	CHECK_EQ(h->client_id, 42);
	/* The header is cleared even when the caller's memory was not. */
	CHECK_EQ(atomic_load(&h->sq.prod), 0);
	CHECK_EQ(atomic_load(&h->sq.cons), 0);
	CHECK_EQ(atomic_load(&h->cq.need_wakeup), 0);
	CHECK_EQ(atomic_load(&h->cq.overflow), 0);
	free(mem);
}

static void
test_chan_attach(void)
{
	size_t len = kvp_chan_size(8, 4);
	uint8_t *mem = aligned_alloc(PAGE, len);
	uint8_t *saved = malloc(PAGE);
	struct kvp_chan_hdr *h = (struct kvp_chan_hdr *)mem;
	struct kvp_ring sq, cq;

	if (mem == NULL || saved == NULL)
		setup_failed("malloc");
	memset(mem, 0, len);
	CHECK_EQ(kvp_chan_init(mem, len, 8, 4, 3), 0);
	memcpy(saved, mem, PAGE);

	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), 0);
	CHECK_EQ(sq.size, 8);
	CHECK_EQ(sq.mask, 7);
	CHECK_EQ(sq.esize, KVP_SQE_SIZE);
	CHECK(sq.slots == mem + PAGE);
	CHECK(sq.shm == &h->sq);
	CHECK_EQ(cq.size, 4);
	CHECK_EQ(cq.esize, KVP_CQE_SIZE);
	CHECK(cq.slots == mem + 2 * PAGE);
	CHECK(cq.shm == &h->cq);
	CHECK_EQ(kvp_chan_attach(mem, len, true, &sq, &cq), 0);

#define RESTORE() memcpy(mem, saved, PAGE)
	h->magic ^= 1;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EBADMSG);
	h->magic = 0;
	CHECK_EQ(kvp_chan_attach(mem, len, true, &sq, &cq), -EBADMSG);
	RESTORE();
	h->version = KVP_ABI_VERSION + 1;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EPROTONOSUPPORT);
	h->version = 0;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EPROTONOSUPPORT);
	RESTORE();

	/* Mapping shorter than the layout: one byte short, header only. */
	CHECK_EQ(kvp_chan_attach(mem, len - 1, false, &sq, &cq), -EINVAL);
	CHECK_EQ(kvp_chan_attach(mem, sizeof(*h), false, &sq, &cq), -EINVAL);
	/*
	 * Shorter than the header: the magic cannot even be read, so any error
	 * will do (rings.c says -EBADMSG, the header's comment -EINVAL).
	 */
	CHECK(kvp_chan_attach(mem, sizeof(*h) - 1, false, &sq, &cq) < 0);
	CHECK(kvp_chan_attach(mem, 0, false, &sq, &cq) < 0);

	/* Sizes the mapping cannot hold, or that are not powers of two. */
	h->sq_entries = 128;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->cq_entries = 1u << 22;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->sq_entries = 6;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->cq_entries = 0;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->sq_esize = 32;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->cq_esize = 256;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();

	/* Inconsistent offsets: slots over the header, overlapping, past the end. */
	h->sq_off = 0;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->sq_off = 64;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->cq_off = h->sq_off + 8 * KVP_SQE_SIZE - 64;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->cq_off = len - 4 * KVP_CQE_SIZE + 1;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->sq_off = len;
	h->cq_off = len;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	/* Offsets chosen so that offset + slot bytes wraps around 2^64. */
	h->sq_off = 0 - (uint64_t)8 * KVP_SQE_SIZE;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
	h->cq_off = 0 - (uint64_t)4 * KVP_CQE_SIZE;
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), -EINVAL);
	RESTORE();
#undef RESTORE

	/* The restored header still attaches: the checks above were not sticky. */
	CHECK_EQ(kvp_chan_attach(mem, len, false, &sq, &cq), 0);
	free(saved);
	free(mem);
}

static void
fill_seq(uint8_t *buf, uint32_t esize, uint64_t first, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		entry_fill(buf + (size_t)i * esize, esize, first + i);
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

static void
test_status_str(void)
{
	static const char *const want[KVP_STATUS_MAX] = {
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
	static const int out_of_range[] = {
		-1, KVP_STATUS_MAX, KVP_STATUS_MAX + 1, 255, INT_MIN, INT_MAX, -EINVAL,
	};

	for (int s = 0; s < KVP_STATUS_MAX; s++) {
		const char *got = kvp_status_str(s);

		if (want[s] == NULL || got == NULL || strcmp(got, want[s]) != 0)
			kvp_test_fail(__FILE__, __LINE__,
				      "kvp_status_str(%d) is \"%s\", want \"%s\"", s,
				      got ? got : "(null)", want[s] ? want[s] : "(test table)");
	}
	for (size_t i = 0; i < sizeof(out_of_range) / sizeof(out_of_range[0]); i++) {
		const char *got = kvp_status_str(out_of_range[i]);

		if (got == NULL || strcmp(got, "unknown") != 0)
			kvp_test_fail(__FILE__, __LINE__,
				      "kvp_status_str(%d) is \"%s\", want \"unknown\"",
				      out_of_range[i], got ? got : "(null)");
	}
}

/* ---- two processes ---- */

/* Shared between parent and child, outside the channel. */
struct stress_ctl {
	_Atomic int abort; /* set by whichever side fails first */
};

static struct stress_ctl *g_ctl;
static int g_efd[2]; /* SQ doorbell (client -> daemon), CQ notify (daemon -> client) */

struct stress {
	const char *name;
	struct kvp_ring *r;
	uint64_t total;
	uint64_t seed; /* bulk and burst sizes */
	int efd;       /* written by the producer, read by the consumer */
	int peer_fd;   /* read end of a pipe whose writer is the other process */
	uint64_t waits, wakes, full_spins;
	char err[320];
};

static void __attribute__((format(printf, 2, 3)))
stress_fail(struct stress *s, const char *fmt, ...)
{
	static const uint64_t one = 1;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
	/* Wake every blocked consumer on both sides so nobody waits out the timeout. */
	atomic_store(&g_ctl->abort, 1);
	for (int i = 0; i < 2; i++)
		if (write(g_efd[i], &one, sizeof(one)) < 0)
			continue;
}

static bool
peer_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

/* The ring stayed full: say whether the consumer is asleep on it. */
static void
stress_full_stuck(struct stress *s, uint64_t seq)
{
	if (peer_gone(s->peer_fd))
		stress_fail(s, "%s: consumer exited, ring full at seq %" PRIu64, s->name, seq);
	else if (atomic_load(&s->r->shm->need_wakeup))
		stress_fail(s,
			    "%s: LOST WAKEUP: ring full at seq %" PRIu64 " and the consumer is "
			    "blocked (need_wakeup set)",
			    s->name, seq);
	else
		stress_fail(s, "%s: ring full at seq %" PRIu64 " past the timeout, consumer stuck",
			    s->name, seq);
}

static void *
stress_produce(void *arg)
{
	static const uint64_t one = 1;
	struct stress *s = arg;
	uint32_t esize = s->r->esize;
	uint8_t buf[STRESS_BULK_MAX * ESIZE_MAX];
	uint64_t seq = 0;

	while (seq < s->total) {
		uint32_t n = 1 + (uint32_t)(kvp_test_splitmix64(&s->seed) % STRESS_BULK_MAX);
		uint64_t deadline = 0;
		unsigned spins = 0;
		int rc;

		if (n > s->total - seq)
			n = (uint32_t)(s->total - seq);
		fill_seq(buf, esize, seq, n);
		/* Full: spin politely; the ring has no producer-side wakeup. */
		while ((rc = kvp_ring_enqueue_bulk(s->r, buf, n)) == 0) {
			uint32_t prod =
				atomic_load_explicit(&s->r->shm->prod, memory_order_relaxed);

			if (prod != s->r->local) {
				stress_fail(s, "%s: refused bulk moved prod %u -> %u", s->name,
					    s->r->local, prod);
				return NULL;
			}
			s->full_spins++;
			if (++spins % 256 == 0) {
				if (atomic_load(&g_ctl->abort))
					return NULL;
				/* Later than the consumer's timeout: its report is sharper. */
				if (deadline == 0)
					deadline = kvp_test_now_ms() + WAIT_TIMEOUT_MS + 5000;
				if (peer_gone(s->peer_fd) || kvp_test_now_ms() > deadline) {
					stress_full_stuck(s, seq);
					return NULL;
				}
			}
			sched_yield();
		}
		if (rc != (int)n) {
			stress_fail(s, "%s: enqueue_bulk(%u) returned %d at seq %" PRIu64, s->name,
				    n, rc, seq);
			return NULL;
		}
		seq += n;
		if (kvp_ring_wakeup_needed(s->r)) {
			s->wakes++;
			if (write(s->efd, &one, sizeof(one)) != sizeof(one)) {
				stress_fail(s, "%s: eventfd write: %s", s->name, strerror(errno));
				return NULL;
			}
		}
	}
	return NULL;
}

/* Block until the producer rings; false (with s->err set) if it never does. */
static bool
stress_wait(struct stress *s, uint64_t got)
{
	struct pollfd p[2] = {
		{ .fd = s->efd, .events = POLLIN },
		{ .fd = s->peer_fd, .events = POLLIN },
	};
	uint64_t v;
	int rc;

	do
		rc = poll(p, 2, WAIT_TIMEOUT_MS);
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		stress_fail(s, "%s: poll: %s", s->name, strerror(errno));
		return false;
	}
	if (p[0].revents & POLLIN) {
		if (read(s->efd, &v, sizeof(v)) != sizeof(v)) {
			stress_fail(s, "%s: eventfd read: %s", s->name, strerror(errno));
			return false;
		}
		return true;
	}
	/*
	 * No doorbell. Entries in the ring now mean the producer published
	 * after our flag was visible and did not ring: a lost wakeup.
	 */
	int ready = kvp_ring_count(s->r);

	const char *why = rc == 0 ? "no doorbell within the timeout" : "producer process exited";

	if (ready > 0)
		stress_fail(s,
			    "%s: LOST WAKEUP: %d entries ready, %s (%" PRIu64 "/%" PRIu64
			    " received, need_wakeup=%u)",
			    s->name, ready, why, got, s->total,
			    atomic_load(&s->r->shm->need_wakeup));
	else
		stress_fail(s, "%s: ring empty, %s (%" PRIu64 "/%" PRIu64 " received, count %d)",
			    s->name, why, got, s->total, ready);
	return false;
}

static void *
stress_consume(void *arg)
{
	struct stress *s = arg;
	uint32_t esize = s->r->esize;
	uint8_t buf[STRESS_BULK_MAX * ESIZE_MAX];
	uint64_t seq = 0;

	while (seq < s->total) {
		uint32_t n = 1 + (uint32_t)(kvp_test_splitmix64(&s->seed) % STRESS_BULK_MAX);
		int rc = kvp_ring_dequeue_burst(s->r, buf, n);

		if (rc < 0 || rc > (int)n) {
			stress_fail(s, "%s: dequeue_burst(%u) returned %d at seq %" PRIu64, s->name,
				    n, rc, seq);
			return NULL;
		}
		for (int i = 0; i < rc; i++) {
			const uint8_t *e = buf + (size_t)i * esize;
			const char *why = entry_bad(e, esize, seq);

			if (why != NULL) {
				stress_fail(s, "%s: at seq %" PRIu64 ": %s (got seq %" PRIu64 ")",
					    s->name, seq, why, entry_seq(e));
				return NULL;
			}
			seq++;
		}
		if (rc > 0)
			continue;
		if (atomic_load(&g_ctl->abort))
			return NULL;
		if (!kvp_ring_prepare_wait(s->r))
			continue;
		s->waits++;
		bool ok = stress_wait(s, seq);

		kvp_ring_finish_wait(s->r);
		if (!ok || atomic_load(&g_ctl->abort))
			return NULL;
	}
	/* The producer sent exactly total: anything more is a duplicate. */
	int extra = kvp_ring_count(s->r);

	if (extra != 0)
		stress_fail(s, "%s: %d entries after the last one", s->name, extra);
	return NULL;
}

/* Run @p a on a new thread and @p b here; false if any of it failed. */
static bool
stress_pair(void *(*fa)(void *), struct stress *a, void *(*fb)(void *), struct stress *b)
{
	pthread_t t;
	int rc = pthread_create(&t, NULL, fa, a);

	if (rc != 0) {
		errno = rc;
		setup_failed("pthread_create");
	}
	fb(b);
	pthread_join(t, NULL);
	for (int i = 0; i < 2; i++) {
		struct stress *s = i ? b : a;

		if (s->err[0])
			fprintf(stderr, "FAIL [pid %d] %s\n", (int)getpid(), s->err);
	}
	return !a->err[0] && !b->err[0];
}

static void
stress_child(int fd, size_t len, uint64_t total, int parent_fd)
{
	struct kvp_ring sq, cq;
	/* Map afresh: the client's view is at another address than the daemon's. */
	void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	struct stress prod = { .name = "SQ producer (client)",
			       .r = &sq,
			       .total = total,
			       .seed = 11,
			       .efd = g_efd[0],
			       .peer_fd = parent_fd };
	struct stress cons = { .name = "CQ consumer (client)",
			       .r = &cq,
			       .total = total,
			       .seed = 22,
			       .efd = g_efd[1],
			       .peer_fd = parent_fd };
	int rc;

	if (mem == MAP_FAILED)
		setup_failed("child mmap");
	rc = kvp_chan_attach(mem, len, false, &sq, &cq);
	if (rc != 0) {
		fprintf(stderr, "FAIL child: kvp_chan_attach: %d\n", rc);
		_exit(1);
	}
	rc = stress_pair(stress_consume, &cons, stress_produce, &prod) ? 0 : 1;
	printf("  client: SQ producer %" PRIu64 " doorbells, %" PRIu64
	       " full spins; CQ consumer %" PRIu64 " waits\n",
	       prod.wakes, prod.full_spins, cons.waits);
	fflush(NULL);
	_exit(rc);
}

static void
test_two_process(uint64_t total)
{
	uint32_t sqn = STRESS_RING, cqn = STRESS_RING;
	size_t len = kvp_chan_size(sqn, cqn);
	int fd = memfd_create("kvp-test-chan", MFD_CLOEXEC);
	int child_alive[2], parent_alive[2], status;
	struct kvp_ring sq, cq;
	uint64_t t0 = kvp_test_now_ms();
	void *mem;
	pid_t pid;

	if (fd < 0)
		setup_failed("memfd_create");
	if (ftruncate(fd, (off_t)len) != 0)
		setup_failed("ftruncate");
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (mem == MAP_FAILED)
		setup_failed("mmap");
	g_ctl = mmap(NULL, sizeof(*g_ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
		     0);
	if (g_ctl == MAP_FAILED)
		setup_failed("mmap ctl");
	atomic_store(&g_ctl->abort, 0);
	for (int i = 0; i < 2; i++) {
		g_efd[i] = eventfd(0, EFD_CLOEXEC);
		if (g_efd[i] < 0)
			setup_failed("eventfd");
	}
	if (pipe2(child_alive, O_CLOEXEC) != 0 || pipe2(parent_alive, O_CLOEXEC) != 0)
		setup_failed("pipe2");
	if (kvp_chan_init(mem, len, sqn, cqn, 5) != 0 ||
	    kvp_chan_attach(mem, len, true, &sq, &cq) != 0) {
		errno = EINVAL;
		setup_failed("channel");
	}

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		setup_failed("fork");
	if (pid == 0) {
		close(child_alive[0]);
		close(parent_alive[1]);
		stress_child(fd, len, total, parent_alive[0]);
	}
	close(child_alive[1]);
	close(parent_alive[0]);

	struct stress cons = { .name = "SQ consumer (daemon)",
			       .r = &sq,
			       .total = total,
			       .seed = 33,
			       .efd = g_efd[0],
			       .peer_fd = child_alive[0] };
	struct stress prod = { .name = "CQ producer (daemon)",
			       .r = &cq,
			       .total = total,
			       .seed = 44,
			       .efd = g_efd[1],
			       .peer_fd = child_alive[0] };

	bool ok = stress_pair(stress_produce, &prod, stress_consume, &cons);

	if (!ok)
		kvp_test_failures++;
	if (waitpid(pid, &status, 0) != pid)
		setup_failed("waitpid");
	if (WIFSIGNALED(status))
		kvp_test_fail(__FILE__, __LINE__, "client process killed by signal %d",
			      WTERMSIG(status));
	else if (WEXITSTATUS(status) != 0)
		kvp_test_fail(__FILE__, __LINE__, "client process exited with %d",
			      WEXITSTATUS(status));
	if (ok) {
		CHECK_EQ(atomic_load(&((struct kvp_chan_hdr *)mem)->sq.prod), (uint32_t)total);
		CHECK_EQ(atomic_load(&((struct kvp_chan_hdr *)mem)->cq.cons), (uint32_t)total);
	}
	printf("two-process: %" PRIu64 " entries each way through %u-entry rings in %.2f s\n"
	       "  daemon: SQ consumer %" PRIu64 " waits; CQ producer %" PRIu64
	       " doorbells, %" PRIu64 " full spins\n",
	       total, STRESS_RING, (double)(kvp_test_now_ms() - t0) / 1000, cons.waits, prod.wakes,
	       prod.full_spins);
	munmap(mem, len);
	close(fd);
	close(child_alive[0]);
	close(parent_alive[1]);
	for (int i = 0; i < 2; i++)
		close(g_efd[i]);
}

int
main(int argc, char **argv)
{
	uint64_t total = STRESS_DEFAULT;

	if (argc > 1) {
		char *end;

		total = strtoull(argv[1], &end, 0);
		if (*end != '\0' || total == 0) {
			fprintf(stderr, "usage: %s [ENTRIES]\n", argv[0]);
			return 99;
		}
	}
	test_chan_size();
	test_chan_init();
	test_chan_attach();
	test_full_empty();
	test_straddle();
	test_wrap();
	test_corrupt();
	test_corrupt_sticky();
	test_reattach_nonempty();
	test_wakeup_flag();
	test_status_str();
	if (kvp_test_failures == 0)
		printf("single-process checks passed\n");
	test_two_process(total);
	return kvp_test_result("test_rings");
}
