/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Deterministic numbers and byte patterns: both ends of a transfer (two
 * processes, two hosts, a GPU) derive every byte from a key and its offset,
 * so what landed is checked without a side channel.
 */
#include <endian.h>
#include <string.h>

#include "kvp_test.h"

/* Pattern bytes are compared a chunk at a time against one generated on the stack. */
#define CHECK_CHUNK 4096

uint64_t
kvp_test_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t
kvp_test_splitmix64(uint64_t *state)
{
	return kvp_test_mix64(*state += 0x9e3779b97f4a7c15ull);
}

uint64_t
kvp_test_below(uint64_t *state, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)kvp_test_splitmix64(state) * n) >> 64);
}

static inline uint8_t
pattern_byte(uint64_t pat, uint64_t o)
{
	return (uint8_t)(kvp_test_mix64(pat ^ (o >> 3)) >> (8 * (o & 7)));
}

void
kvp_test_pattern_fill(uint64_t pat, uint64_t off, void *buf, size_t n)
{
	uint8_t *b = buf;

	for (; n > 0 && (off & 7) != 0; n--, off++)
		*b++ = pattern_byte(pat, off);
	for (; n >= 8; n -= 8, off += 8, b += 8) {
		uint64_t v = htole64(kvp_test_mix64(pat ^ (off >> 3)));

		memcpy(b, &v, 8);
	}
	for (; n > 0; n--, off++)
		*b++ = pattern_byte(pat, off);
}

uint64_t
kvp_test_bytes_diff(const void *a, const void *b, size_t n, size_t *first)
{
	const uint8_t *x = a, *y = b;
	uint64_t bad = 0;

	if (memcmp(x, y, n) == 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (x[i] == y[i])
			continue;
		if (bad++ == 0 && first)
			*first = i;
	}
	return bad;
}

uint64_t
kvp_test_pattern_check(uint64_t pat, uint64_t off, const void *buf, size_t n, size_t *first)
{
	uint8_t want[CHECK_CHUNK];
	const uint8_t *b = buf;
	uint64_t bad = 0;

	for (size_t done = 0; done < n;) {
		size_t k = n - done < CHECK_CHUNK ? n - done : CHECK_CHUNK, f = 0;

		kvp_test_pattern_fill(pat, off + done, want, k);
		uint64_t d = kvp_test_bytes_diff(b + done, want, k, &f);

		if (d && bad == 0 && first)
			*first = done + f;
		bad += d;
		done += k;
	}
	return bad;
}
