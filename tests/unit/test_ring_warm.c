/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit test for the producer's write a page ahead (kvp_ring_warm_ahead()):
 * it must land only in a slot the consumer has released, whatever the
 * consumer's lag, and it must land there when that slot is free (a warm
 * that never writes is the 8 us page-crossing cost back).
 *
 * A 128-entry CQ of 128-byte entries (4 pages; the warm writes 32 slots
 * ahead) is filled with the consumer holding back 0 to 127 entries; after
 * every enqueue each unconsumed entry must read as written.
 *
 * Exit: 0 pass, 1 fail, 99 when the test's own setup broke.
 */
#include <assert.h> /* static_assert in kvp_rings.h, C11 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_rings.h"
#include "kvp_test.h"

#define CQN   128u
#define AHEAD (4096u / KVP_CQE_SIZE)

/* Entry @p seq: every byte from the sequence number, the first never 0. */
static void
entry_fill(uint8_t *e, uint32_t seq)
{
	for (uint32_t i = 0; i < KVP_CQE_SIZE; i++)
		e[i] = (uint8_t)(0x80 | ((seq * 31 + i) & 0x7f));
}

static bool
entry_ok(const uint8_t *e, uint32_t seq)
{
	uint8_t want[KVP_CQE_SIZE];

	entry_fill(want, seq);
	return memcmp(e, want, sizeof(want)) == 0;
}

static const uint8_t *
slot(const struct kvp_ring *r, uint32_t idx)
{
	return r->slots + (size_t)(idx & r->mask) * r->esize;
}

/* One channel; the consumer keeps @p lag entries unconsumed. */
static void
run_lag(uint32_t lag)
{
	size_t len = kvp_chan_size(8, CQN);
	void *mem = aligned_alloc(4096, len);
	struct kvp_ring dsq, dcq, csq, ccq;
	uint8_t e[KVP_CQE_SIZE], out[KVP_CQE_SIZE];
	uint32_t bad = 0, warmed = 0, cons = 0;

	if (!mem)
		kvp_test_setup_failed("aligned_alloc: %s", strerror(errno));
	memset(mem, 0, len);
	if (kvp_chan_init(mem, len, 8, CQN, 1) != 0 ||
	    kvp_chan_attach(mem, len, true, &dsq, &dcq) != 0 ||
	    kvp_chan_attach(mem, len, false, &csq, &ccq) != 0)
		kvp_test_setup_failed("channel setup failed");
	for (uint32_t seq = 0; seq < 6 * CQN; seq++) {
		entry_fill(e, seq);
		if (kvp_ring_enqueue_bulk(&dcq, e, 1) != 1) {
			kvp_test_fail(__FILE__, __LINE__, "lag %u: enqueue %u refused with %u pending", lag, seq,
				      seq - cons);
			break;
		}
		/* Every entry not yet consumed reads as written. */
		for (uint32_t i = cons; i <= seq; i++)
			bad += !entry_ok(slot(&dcq, i), i);
		/* The slot a page ahead, when the consumer is past it, was written. */
		uint32_t q = seq + 1 + AHEAD;

		if (q - dcq.cached < CQN) {
			warmed++;
			if (*slot(&dcq, q) != 0 && seq >= AHEAD)
				kvp_test_fail(__FILE__, __LINE__, "lag %u: after entry %u the free slot %u ahead was not "
					      "written", lag, seq, AHEAD);
		}
		/* The consumer takes entries once more than lag wait. */
		while (seq + 1 - cons > lag) {
			if (kvp_ring_dequeue_burst(&ccq, out, 1) != 1 || !entry_ok(out, cons))
				bad++;
			cons++;
		}
	}
	CHECK_EQ(bad, 0);
	/* A consumer that keeps the ring nearly full leaves no slot to warm. */
	if (lag < CQN - AHEAD - 1)
		CHECK(warmed > 0);
	free(mem);
}

int
main(void)
{
	static const uint32_t lags[] = { 0, 1, 31, 32, 33, 64, 95, 96, 97, 126, 127 };

	for (size_t i = 0; i < sizeof(lags) / sizeof(lags[0]); i++)
		run_lag(lags[i]);
	return kvp_test_result("test_ring_warm");
}
