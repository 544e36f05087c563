/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit test for lib/rings, the client ABI channel: its layout. What
 * kvproxyd relies on when a client misbehaves before any entry moves: sizes
 * refused at kvp_chan_size() and kvp_chan_init(), and every header field
 * validated at attach (magic, version, sizes, offsets that overlap, run past
 * the mapping or wrap around 2^64); and the status names of the ABI.
 * Channels live in heap memory, so ASan sees any access past the header.
 * (Entries through the rings: test_rings_spsc and test_rings_stress.)
 *
 * Exit: 0 pass, 1 fail, 99 when the test's own setup broke.
 */
#include <assert.h> /* static_assert in kvp_rings.h, C11 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_rings.h"
#include "kvp_test.h"
#include "ring_entries.h"

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

int
main(void)
{
	test_chan_size();
	test_chan_init();
	test_chan_attach();
	test_status_str();
	return kvp_test_result("test_rings_chan");
}
