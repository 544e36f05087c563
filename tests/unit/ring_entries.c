/* SPDX-License-Identifier: BSD-3-Clause */
/* The ring tests' entries (ring_entries.h). */
#include <errno.h>
#include <string.h>

#include "kvp_test.h"
#include "ring_entries.h"

/* The test's own set-up broke (exit 99), with the errno of the step. */
_Noreturn void
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

void
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
const char *
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

uint64_t
entry_seq(const uint8_t *e)
{
	uint64_t s;

	memcpy(&s, e, sizeof(s));
	return s;
}

void
fill_seq(uint8_t *buf, uint32_t esize, uint64_t first, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		entry_fill(buf + (size_t)i * esize, esize, first + i);
}
