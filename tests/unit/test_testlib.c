/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The test-helper library (tests/lib) itself: the tools (kvproxy-bench) and
 * the tests trust its patterns, numbers, key files, fd passing and HELLO
 * proof, so they are pinned here: the pattern against values computed
 * independently, the proof against Python's hmac (the vectors below), the
 * number parser's edges, a key file round trip, descriptors over a
 * socketpair.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvp_test.h"

static void
test_pattern(void)
{
	uint8_t a[100], b[100];
	size_t first = 12345;

	/* Byte o is byte o % 8 of mix64(pat ^ o / 8), little-endian, whatever the start. */
	kvp_test_pattern_fill(7, 0, a, sizeof(a));
	for (unsigned o = 0; o < sizeof(a); o++)
		CHECK_EQ(a[o], (uint8_t)(kvp_test_mix64(7 ^ (o / 8)) >> (8 * (o % 8))));
	kvp_test_pattern_fill(7, 3, b, 50);
	CHECK(memcmp(a + 3, b, 50) == 0);
	CHECK_EQ(kvp_test_pattern_check(7, 0, a, sizeof(a), &first), 0);
	CHECK_EQ(first, 12345); /* untouched without a mismatch */
	a[40] ^= 1;
	a[70] ^= 0xff;
	CHECK_EQ(kvp_test_pattern_check(7, 0, a, sizeof(a), &first), 2);
	CHECK_EQ(first, 40);
	CHECK_EQ(kvp_test_pattern_check(7, 41, a + 41, 59, &first), 1);
	CHECK_EQ(first, 29);
	CHECK_EQ(kvp_test_pattern_check(8, 0, b, 0, NULL), 0);
	/* Across the internal chunk: a mismatch past 4 KiB is found and placed. */
	static uint8_t big[10000];
	kvp_test_pattern_fill(99, 5, big, sizeof(big));
	big[9000] ^= 0x10;
	CHECK_EQ(kvp_test_pattern_check(99, 5, big, sizeof(big), &first), 1);
	CHECK_EQ(first, 9000);
	CHECK_EQ(kvp_test_bytes_diff(a, a, sizeof(a), NULL), 0);
	memcpy(b, a, sizeof(b));
	b[99] = (uint8_t)~b[99];
	CHECK_EQ(kvp_test_bytes_diff(a, b, sizeof(a), &first), 1);
	CHECK_EQ(first, 99);
	/* splitmix64 (Steele et al.) from seed 0: its published first outputs. */
	uint64_t s = 0;
	CHECK(kvp_test_splitmix64(&s) == 0xe220a8397b1dcdafull);
	CHECK(kvp_test_splitmix64(&s) == 0x6e789e6aa1b965f4ull);
	for (int i = 0; i < 1000; i++)
		CHECK(kvp_test_below(&s, 10) < 10);
	CHECK_EQ(kvp_test_below(&s, 1), 0);
}

static void
test_numbers(void)
{
	static const struct {
		const char *s;
		int rc;
		uint64_t v;
	} cases[] = {
		{ "0", 0, 0 },
		{ "4096", 0, 4096 },
		{ "0x10", 0, 16 },
		{ "4k", 0, 4096 },
		{ "2M", 0, 2u << 20 },
		{ "1g", 0, 1u << 30 },
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "18446744073709551616", -ERANGE, 0 },
		{ "17179869184g", -ERANGE, 0 },
		{ "", -EINVAL, 0 },
		{ "-1", -EINVAL, 0 },
		{ "4x", -EINVAL, 0 },
		{ "4kb", -EINVAL, 0 },
		{ "k", -EINVAL, 0 },
	};
	uint64_t v;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		v = 77;
		int rc = kvp_test_parse_u64(cases[i].s, &v);

		if (rc != cases[i].rc || (rc == 0 && v != cases[i].v) || (rc != 0 && v != 77))
			kvp_test_fail(__FILE__, __LINE__, "parse \"%s\": rc %d value %llu",
				      cases[i].s, rc, (unsigned long long)v);
	}
	uint64_t lat[] = { 5, 1, UINT64_MAX, 3, 0 };
	kvp_test_sort_u64(lat, 5);
	CHECK(lat[0] == 0 && lat[1] == 1 && lat[2] == 3 && lat[3] == 5 && lat[4] == UINT64_MAX);
}

static void
test_files(void)
{
	char dir[] = "/tmp/kvp-testlib.XXXXXX", path[64];
	uint64_t key = 0;
	void *map;
	int fd;

	if (!mkdtemp(dir))
		kvp_test_setup_failed("mkdtemp: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/key", dir);
	CHECK_EQ(kvp_test_key_read(path, 0, &key), -ETIMEDOUT);
	CHECK_EQ(kvp_test_key_write(path, 0x5a5a5a5a00010002ull), 0);
	CHECK_EQ(kvp_test_key_read(path, 0, &key), 0);
	CHECK(key == 0x5a5a5a5a00010002ull);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL && fputs("not a key\n", f) >= 0 && fclose(f) == 0);
	CHECK_EQ(kvp_test_key_read(path, 0, &key), -EBADMSG);
	CHECK(strcmp(kvp_test_key_error(-EBADMSG), "not a key") == 0);
	CHECK(strcmp(kvp_test_key_error(-ETIMEDOUT), "timed out") == 0);
	CHECK(strcmp(kvp_test_key_error(-EACCES), strerror(EACCES)) == 0);
	unlink(path);
	rmdir(dir);

	CHECK_EQ(kvp_test_memfd("kvp-testlib", 8192, true, &fd, &map), 0);
	CHECK_EQ(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, F_SEAL_SHRINK);
	CHECK(ftruncate(fd, 4096) < 0 && errno == EPERM);
	((uint8_t *)map)[8191] = 1; /* mapped, writable, whole */
	close(fd);
	CHECK_EQ(kvp_test_memfd("kvp-testlib", 8192, false, &fd, NULL), 0);
	CHECK_EQ(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, 0);
	close(fd);
}

static void
test_fds(void)
{
	int sp[2], p[2], got[KVP_TEST_FDS_MAX];
	unsigned n = 0;
	char buf[8];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0 || pipe2(p, O_CLOEXEC) < 0)
		kvp_test_setup_failed("socketpair/pipe: %s", strerror(errno));
	int fds[3] = { p[0], p[1], p[0] };

	CHECK_EQ(kvp_test_send_fds(sp[0], "abc", 3, fds, 3, 0), 3);
	/* Room for two: the third is closed on arrival. */
	CHECK_EQ(kvp_test_recv_fds(sp[1], buf, sizeof(buf), got, &n, 2, 0), 3);
	CHECK_EQ(n, 2);
	CHECK(memcmp(buf, "abc", 3) == 0);
	CHECK(write(got[1], "z", 1) == 1 && read(got[0], buf, 1) == 1 && buf[0] == 'z');
	close(got[0]);
	close(got[1]);
	CHECK_EQ(kvp_test_send_fds(sp[0], "x", 1, fds, KVP_TEST_FDS_MAX + 1, 0), -1);
	CHECK_EQ(errno, EINVAL);
	close(p[0]);
	close(p[1]);
	close(sp[0]);
	close(sp[1]);
}

/* Vectors from Python: hmac.new(secret, role + challenge + own + from + to, sha256). */
static void
test_hello_mac(void)
{
	static const uint8_t want_d[32] = {
		0xfd, 0xef, 0xc9, 0xc9, 0x07, 0x85, 0x2f, 0x86, 0x75, 0x61, 0x98,
		0x52, 0xa0, 0xa3, 0xb3, 0xca, 0x35, 0x94, 0xc1, 0xed, 0x4e, 0xed,
		0x97, 0xff, 0x51, 0x09, 0x96, 0x22, 0xed, 0xae, 0x66, 0x1d,
	};
	/* A 40-character id: only its first KVP_NODE_ID_MAX - 1 bytes count. */
	static const uint8_t want_a[32] = {
		0x37, 0x9f, 0x3f, 0x48, 0x5c, 0x15, 0xb0, 0xce, 0xe1, 0x4e, 0x2e,
		0xc2, 0xc0, 0xc7, 0xea, 0x44, 0x99, 0xc6, 0x52, 0xc9, 0x86, 0xd9,
		0x69, 0x16, 0xb9, 0x77, 0x85, 0x34, 0xac, 0x9c, 0xd9, 0x82,
	};
	uint8_t ch[32], own[32], mac[32];

	for (int i = 0; i < 32; i++) {
		ch[i] = (uint8_t)i;
		own[i] = (uint8_t)(32 + i);
	}
	kvp_test_hello_mac("s3cret", 'D', ch, own, "prefill0", "decode0", mac);
	CHECK(memcmp(mac, want_d, 32) == 0);
	kvp_test_hello_mac("s3cret", 'A', ch, own, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
			   "decode0", mac);
	CHECK(memcmp(mac, want_a, 32) == 0);
	kvp_test_hello_mac("s3cret", 'A', ch, own, "prefill0", "decode0", mac);
	CHECK(memcmp(mac, want_d, 32) != 0); /* the role is bound in */
}

int
main(void)
{
	test_pattern();
	test_numbers();
	test_files();
	test_fds();
	test_hello_mac();
	return kvp_test_result("test_testlib");
}
