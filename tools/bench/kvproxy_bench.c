/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvproxy-bench: a libkvproxy client for the demo, the integration tests and
 * benchmarks.
 *
 *   decode   registers a destination region, publishes its key in a file,
 *            waits for the plan's transfers to land and verifies every byte
 *   prefill  fills a source region and sends the plan to the decode node
 *   bad      submits malformed transfers and checks each one's status
 *
 * Both sides derive the same plan from (--seed, --size, --min-seg, --max-seg,
 * --segs-per-xfer, --linear; bench_plan.c): segment lengths, a shuffled
 * destination layout, and the source pattern, so decode can check what
 * landed without a side channel.
 */
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_plan.h"
#include "kvp_test.h"
#include "kvproxy.h"

#define DEF_MIN_SEG       4096ull
#define DEF_MAX_SEG       (8ull << 20)
#define DEF_SEGS_PER_XFER 16u
#define DEF_INFLIGHT      8u
#define DEF_BAD_SIZE      (1ull << 20)
#define CQ_BATCH          64
#define BAD_USER_ID       1000u

struct opts {
	const char *sock;
	const char *peer;
	const char *key_file;
	uint64_t size;
	uint64_t seed;
	uint64_t min_seg;
	uint64_t max_seg;
	uint64_t timeout_ms; /* prefill: per-transfer deadline, 0 = daemon default */
	uint64_t segs_per_xfer;
	uint64_t inflight;
	uint64_t expect_xfers; /* decode: 0 = the whole plan, every round */
	uint64_t rounds;       /* prefill and decode: how many times the plan is sent */
	double timeout_s;      /* decode: whole run; bad: per case */
	double wait_key_s;
	bool json;
	bool linear;           /* destination layout = source layout (KV pages of one request) */
	const char *stop_file; /* decode: stop waiting once this file exists */
};

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Errors end the process: the daemon reclaims the client, its regions and transfers. */
#define die(...)         (fail(__VA_ARGS__), exit(1))
#define usage_error(...) (fail(__VA_ARGS__), exit(2))

static void
fail(const char *fmt, ...)
{
	va_list ap;

	fputs("kvproxy-bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- setup shared by the subcommands ---- */

struct side {
	struct kvp_client *c;
	int fd;
	uint8_t *mem;
	uint64_t key;
};

/* Connect, allocate and register the region (filled with the pattern for a source). */
static void
side_open(struct side *sd, const struct opts *o, const struct plan *fill)
{
	void *mem;
	int rc = kvp_connect(o->sock, 0, 0, &sd->c);

	if (rc < 0)
		die("connect %s: %s", o->sock, strerror(-rc));
	rc = kvp_host_alloc(o->size, &sd->fd, &mem);
	if (rc < 0)
		die("allocating %" PRIu64 " bytes: %s", o->size, strerror(-rc));
	sd->mem = mem;
	if (fill != NULL)
		kvp_test_pattern_fill(fill->pat, 0, sd->mem, o->size);
	rc = kvp_region_register(sd->c, sd->fd, 0, o->size, KVP_REGION_HOST, &sd->key);
	if (rc < 0)
		die("register region: %s (%s)", strerror(-rc), kvp_last_error(sd->c));
}

static void
side_close(struct side *sd, const struct opts *o)
{
	int rc = kvp_region_deregister(sd->c, sd->key);

	if (rc < 0)
		fail("deregister: %s (%s)", strerror(-rc), kvp_last_error(sd->c));
	kvp_host_free(sd->fd, sd->mem, o->size);
	kvp_close(sd->c);
}

static const char *key_written;

/* A key file outlives its region only by mistake: a later prefill would read a stale key. */
static void
key_unlink(void)
{
	unlink(key_written);
}

/* Written to a temporary name and renamed, so a reader never sees half a key. */
static void
key_write(const char *path, uint64_t key)
{
	int rc = kvp_test_key_write(path, key);

	if (rc == -ENAMETOOLONG)
		die("key file name too long");
	if (rc < 0)
		die("writing key file %s: %s", path, strerror(-rc));
	key_written = path;
	atexit(key_unlink);
}

/* The key comes from another process with no event to wait on: the file is polled. */
static uint64_t
key_read_wait(const char *path, double wait_s)
{
	uint64_t key = 0;
	int rc = kvp_test_key_read(path, wait_s, &key);

	if (rc < 0)
		die("key file %s: %s", path, kvp_test_key_error(rc));
	return key;
}

/* Wait until @p deadline (CLOCK_MONOTONIC ns) for completions; dies if the daemon does. */
static int
wait_until(struct kvp_client *c, struct kvp_cqe *cqes, uint64_t deadline)
{
	uint64_t now = kvp_test_now_ns();

	if (now >= deadline)
		return 0;
	uint64_t ms = (deadline - now + 999999) / 1000000;
	int n = kvp_wait(c, cqes, CQ_BATCH, ms > 1000 ? 1000 : (int)ms);

	if (n < 0)
		die("waiting for completions: %s", strerror(-n));
	return n;
}

/* ---- decode ---- */

static void
verify_seg(const struct plan *p, const uint8_t *region, const struct seg *s, uint64_t *mism,
	   uint64_t *first_bad)
{
	size_t first = 0;
	uint64_t bad =
		kvp_test_pattern_check(p->pat, s->src_off, region + s->dst_off, s->len, &first);

	if (bad == 0)
		return;
	if (*mism == 0 || s->dst_off + first < *first_bad)
		*first_bad = s->dst_off + first;
	*mism += bad;
}

static uint64_t
checksum(const uint8_t *m, uint64_t len)
{
	uint64_t h = 0xcbf29ce484222325ull, v, i = 0;

	for (; i + 8 <= len; i += 8) {
		memcpy(&v, m + i, 8);
		h = (h ^ le64toh(v)) * 0x100000001b3ull;
	}
	for (; i < len; i++)
		h = (h ^ m[i]) * 0x100000001b3ull;
	return h;
}

static int
cmd_decode(const struct opts *o, const struct plan *p)
{
	struct kvp_cqe cqes[CQ_BATCH];
	size_t total = (size_t)o->rounds * p->nxfer;
	size_t got = 0, first, expect = o->expect_xfers ? o->expect_xfers : total;
	uint64_t bytes = 0, mism = 0, first_bad = 0, want;
	/* Landings of each plan transfer, and (a bit per user_id) which ids landed. */
	uint64_t *seen = calloc(p->nxfer, sizeof(*seen));
	uint8_t *ids = calloc((total + 7) / 8, 1);
	struct side sd;

	if (seen == NULL || ids == NULL)
		die("out of memory");
	if (expect > total)
		die("--expect-xfers %zu is above the plan's %zu transfers x %" PRIu64 " rounds",
		    expect, p->nxfer, o->rounds);
	side_open(&sd, o, NULL);
	key_write(o->key_file, sd.key);

	uint64_t deadline = kvp_test_now_ns() + (uint64_t)(o->timeout_s * 1e9);

	bool stopped = false;

	while (got < expect) {
		int n = stopped ? kvp_poll(sd.c, cqes, CQ_BATCH) : wait_until(sd.c, cqes, deadline);

		if (stopped && n <= 0)
			break;
		/*
		 * A test that expects some transfers to fail says when the rest
		 * has landed by creating the stop file; what landed is verified.
		 */
		if (n == 0 && o->stop_file && access(o->stop_file, F_OK) == 0) {
			stopped = true;
			continue;
		}
		if (n == 0 && kvp_test_now_ns() >= deadline)
			die("timed out: %zu of %zu transfers landed (%" PRIu64
			    " bytes, %u completions dropped)",
			    got, expect, bytes, kvp_overflow(sd.c));
		for (int i = 0; i < n; i++) {
			const struct kvp_cqe *e = &cqes[i];

			if (e->kind != KVP_CQE_LANDED)
				continue;
			bool dup =
				e->user_id < total && (ids[e->user_id / 8] >> e->user_id % 8) & 1;

			if (e->status != KVP_OK || e->user_id >= total || dup)
				die("bad LANDED completion: user_id %" PRIu64 " status %s%s",
				    e->user_id, kvp_status_str(e->status),
				    dup ? " (duplicate)" : "");
			/* Transfer t of round t / nxfer is plan transfer t % nxfer. */
			plan_xfer(p, e->user_id % p->nxfer, &first, &want, NULL, 0, 0);
			if (e->bytes != want)
				die("transfer %" PRIu64 " landed %" PRIu64
				    " bytes, plan says %" PRIu64,
				    e->user_id, e->bytes, want);
			ids[e->user_id / 8] |= (uint8_t)(1u << e->user_id % 8);
			seen[e->user_id % p->nxfer]++;
			got++;
			bytes += e->bytes;
		}
	}
	if (kvp_overflow(sd.c) != 0)
		fail("warning: the completion ring overflowed %u times", kvp_overflow(sd.c));
	if (o->expect_xfers == 0 && !stopped && bytes != o->rounds * o->size)
		die("landed %" PRIu64 " bytes, expected %" PRIu64, bytes, o->rounds * o->size);
	/*
	 * Once, at the end: every round writes the same bytes to the same place,
	 * so the region equals the plan whichever round landed last. Only plan
	 * transfers that landed: --expect-xfers may ask for part of the plan.
	 */
	for (size_t t = 0; t < p->nxfer; t++) {
		uint32_t n = seen[t] ? plan_xfer(p, t, &first, &want, NULL, 0, 0) : 0;

		for (uint32_t i = 0; i < n; i++)
			verify_seg(p, sd.mem, &p->segs[first + i], &mism, &first_bad);
	}

	uint64_t sum = checksum(sd.mem, o->size);
	FILE *hf = o->json ? stderr : stdout;

	if (o->json)
		printf("{\"bytes\":%" PRIu64 ",\"xfers\":%zu,\"rounds\":%" PRIu64
		       ",\"checksum\":\"0x%016" PRIx64 "\",\"mismatches\":%" PRIu64
		       ",\"first_mismatch\":%" PRId64 "}\n",
		       bytes, got, o->rounds, sum, mism, mism ? (int64_t)first_bad : (int64_t)-1);
	fprintf(hf,
		"decode: %s %" PRIu64 " bytes in %zu transfers, checksum 0x%016" PRIx64 ", %" PRIu64
		" mismatches",
		mism ? "checked" : "verified", bytes, got, sum, mism);
	fprintf(hf, mism ? ", first at dst offset %" PRIu64 "\n" : "\n", first_bad);
	if (mism != 0)
		fail("verification failed: %" PRIu64 " bytes differ from the plan", mism);
	side_close(&sd, o);
	free(seen);
	free(ids);
	return mism == 0 ? 0 : 1;
}

/* ---- prefill ---- */

/* Nearest-rank percentile of a sorted array, in microseconds. */
static double
pct_us(const uint64_t *v, size_t n, unsigned int pct)
{
	size_t r = (n * pct + 99) / 100;

	return n == 0 ? 0 : (double)v[r ? r - 1 : 0] / 1e3;
}

/*
 * The summary; with --json also start_ns and end_ns (CLOCK_MONOTONIC): the
 * first submission and the last completion, so that several clients' runs
 * add up to one span.
 */
static void
print_prefill(const struct opts *o, size_t nxfer, uint64_t bytes, uint64_t t0, uint64_t t1,
	      const uint64_t *status, uint64_t *lat)
{
	double secs = (double)(t1 - t0) / 1e9;
	double gBps = secs > 0 ? (double)bytes / secs / 1e9 : 0;
	FILE *hf = o->json ? stderr : stdout;

	kvp_test_sort_u64(lat, nxfer);
	if (o->json) {
		printf("{\"xfers\":%zu,\"rounds\":%" PRIu64 ",\"bytes\":%" PRIu64
		       ",\"seconds\":%.6f,\"gbps\":%.3f,\"gbytes_per_s\":%.3f,\"status\":{",
		       nxfer, o->rounds, bytes, secs, gBps * 8, gBps);
		for (int s = 0; s <= KVP_STATUS_MAX; s++)
			printf("%s\"%s\":%" PRIu64, s ? "," : "", kvp_status_str(s), status[s]);
		printf("},\"lat_us\":{\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f},"
		       "\"start_ns\":%" PRIu64 ",\"end_ns\":%" PRIu64 "}\n",
		       pct_us(lat, nxfer, 50), pct_us(lat, nxfer, 99), pct_us(lat, nxfer, 100), t0,
		       t1);
	}
	fprintf(hf,
		"prefill: %zu transfers, %" PRIu64
		" bytes, %.2f GB/s (%.2f Gbit/s), failures by status:",
		nxfer, bytes, gBps, gBps * 8);
	for (int s = 1; s <= KVP_STATUS_MAX; s++)
		if (status[s] != 0)
			fprintf(hf, " %s=%" PRIu64, kvp_status_str(s), status[s]);
	fprintf(hf, "%s\n", status[KVP_OK] == nxfer ? " none" : "");
}

static int
cmd_prefill(const struct opts *o, const struct plan *p)
{
	struct kvp_cqe cqes[CQ_BATCH];
	struct kvp_segment *segs = calloc(p->k, sizeof(*segs));
	size_t total = (size_t)o->rounds * p->nxfer;
	uint64_t *t_sub = calloc(total, sizeof(*t_sub)), *lat = calloc(total, sizeof(*lat));
	uint64_t status[KVP_STATUS_MAX + 1] = { 0 }, ok_bytes = 0, want;
	size_t next = 0, done = 0, inflight = 0, first;
	struct side sd;
	uint16_t peer;

	if (segs == NULL || t_sub == NULL || lat == NULL)
		die("out of memory");
	side_open(&sd, o, p);

	uint64_t dst_key = key_read_wait(o->key_file, o->wait_key_s);
	int rc = kvp_peer_lookup(sd.c, o->peer, &peer);

	if (rc < 0)
		die("peer %s: %s (%s)", o->peer, strerror(-rc), kvp_last_error(sd.c));
	if (p->k > kvp_max_segments(sd.c))
		die("--segs-per-xfer %u is above the daemon's limit of %u", p->k,
		    kvp_max_segments(sd.c));

	/* No completion for this long means stuck, not slow: every transfer has a deadline. */
	uint64_t stall_ns = ((o->timeout_ms ? o->timeout_ms : 60000) + 30000) * 1000000ull;
	uint64_t t0 = kvp_test_now_ns(), t_end = t0;

	/* Transfer t (user_id t) is plan transfer t % nxfer: round t / nxfer. */
	while (done < total) {
		while (next < total && inflight < o->inflight) {
			struct kvp_xfer_desc x = { .user_id = next,
						   .peer = peer,
						   .timeout_ns = o->timeout_ms * 1000000ull };
			uint32_t n =
				plan_xfer(p, next % p->nxfer, &first, &want, segs, sd.key, dst_key);

			t_sub[next] = kvp_test_now_ns();
			rc = kvp_submit(sd.c, &x, segs, n);
			if (rc == -EAGAIN)
				break; /* SQ full: completions free it */
			if (rc < 0)
				die("submit: %s", strerror(-rc));
			next++;
			inflight++;
		}
		int n = wait_until(sd.c, cqes, kvp_test_now_ns() + 1000000000ull);
		uint64_t now = kvp_test_now_ns();

		if (n == 0 && now - t_end > stall_ns)
			die("stalled: %zu of %zu transfers done, %zu in flight", done, total,
			    inflight);
		for (int i = 0; i < n; i++) {
			const struct kvp_cqe *e = &cqes[i];

			if (e->kind != KVP_CQE_DONE)
				continue;
			if (e->user_id >= next || lat[e->user_id] != 0)
				die("unexpected DONE completion for user_id %" PRIu64, e->user_id);
			/* +1: zero marks "not completed yet" for the duplicate check. */
			lat[e->user_id] = now - t_sub[e->user_id] + 1;
			status[e->status >= 0 && e->status < KVP_STATUS_MAX ? e->status :
									      KVP_STATUS_MAX]++;
			plan_xfer(p, e->user_id % p->nxfer, &first, &want, NULL, 0, 0);
			if (e->status == KVP_OK && e->bytes != want)
				die("transfer %" PRIu64 " reports %" PRIu64
				    " bytes, plan says %" PRIu64,
				    e->user_id, e->bytes, want);
			ok_bytes += e->status == KVP_OK ? want : 0;
			inflight--;
			done++;
			t_end = now;
		}
	}
	print_prefill(o, total, ok_bytes, t0, t_end, status, lat);
	if (kvp_overflow(sd.c) != 0)
		fail("warning: the completion ring overflowed %u times", kvp_overflow(sd.c));
	side_close(&sd, o);
	free(segs);
	free(t_sub);
	free(lat);
	return status[KVP_OK] == total ? 0 : 1;
}

/* ---- bad ---- */

/* Submit one transfer and wait for its DONE; returns its status or -errno. */
static int
run_one(struct kvp_client *c, uint64_t user_id, uint16_t peer, const struct kvp_segment *segs,
	uint32_t nseg, double timeout_s)
{
	struct kvp_xfer_desc x = { .user_id = user_id, .peer = peer };
	struct kvp_cqe cqes[CQ_BATCH];
	uint64_t deadline = kvp_test_now_ns() + (uint64_t)(timeout_s * 1e9);
	int rc = kvp_submit(c, &x, segs, nseg);

	while (rc == 0) {
		int n = wait_until(c, cqes, deadline);

		if (n == 0 && kvp_test_now_ns() >= deadline)
			return -ETIMEDOUT;
		for (int i = 0; i < n; i++)
			if (cqes[i].kind == KVP_CQE_DONE && cqes[i].user_id == user_id)
				return cqes[i].status;
	}
	return rc;
}

static bool
report(const char *name, int want, int got)
{
	char w[32], g[64];

	snprintf(w, sizeof(w), "%s", want < 0 ? strerror(-want) : kvp_status_str(want));
	snprintf(g, sizeof(g), "%s", got < 0 ? strerror(-got) : kvp_status_str(got));
	printf("%s  %-28s expected %s, got %s\n", want == got ? "PASS" : "FAIL", name, w, g);
	return want == got;
}

static int
cmd_bad(const struct opts *o, const struct plan *p)
{
	struct side sd;
	uint16_t peer;
	int failed = 0;

	if (o->size < 8192)
		usage_error("bad needs --size of at least 8192 bytes");
	side_open(&sd, o, p);

	uint64_t dk = key_read_wait(o->key_file, o->wait_key_s), sk = sd.key, sz = o->size;
	int rc = kvp_peer_lookup(sd.c, o->peer, &peer);

	if (rc < 0)
		die("peer %s: %s (%s)", o->peer, strerror(-rc), kvp_last_error(sd.c));

	const struct {
		const char *name;
		struct kvp_segment seg;
		uint16_t peer;
		int want;
	} cases[] = {
		/* clang-format off */
		{ "unknown src key", { sk ^ 0x5a5a5a5a00000000ull, 0, dk, 0, 4096 }, peer, KVP_EINVAL },
		{ "src offset out of bounds", { sk, sz, dk, 0, 4096 }, peer, KVP_EINVAL },
		{ "src range past the end", { sk, sz - 64, dk, 0, 4096 }, peer, KVP_EINVAL },
		{ "zero-length segment", { sk, 0, dk, 0, 0 }, peer, KVP_EINVAL },
		{ "length overflow (wraps)", { sk, 4096, dk, 0, UINT64_MAX - 4095 }, peer, KVP_EINVAL },
		{ "unknown dst key at remote", { sk, 0, dk ^ 0x5a5a5a5a00000000ull, 0, 4096 }, peer, KVP_EREMOTE },
		{ "peer not configured (999)", { sk, 0, dk, 0, 4096 }, 999, KVP_ENOPEER },
		/* clang-format on */
	};
	size_t ncases = sizeof(cases) / sizeof(cases[0]);

	for (size_t i = 0; i < ncases; i++)
		failed += !report(cases[i].name, cases[i].want,
				  run_one(sd.c, BAD_USER_ID + i, cases[i].peer, &cases[i].seg, 1,
					  o->timeout_s));

	/* Rejected by the library before anything reaches the ring. */
	struct kvp_xfer_desc x = { .user_id = BAD_USER_ID + ncases, .peer = peer };
	uint32_t max = kvp_max_segments(sd.c);
	struct kvp_segment *segs = calloc((size_t)max + 1 + p->k, sizeof(*segs));

	if (segs == NULL)
		die("out of memory");
	failed += !report("nseg = 0 (local)", -EINVAL, kvp_submit(sd.c, &x, segs, 0));
	failed += !report("nseg > max (local)", -EINVAL, kvp_submit(sd.c, &x, segs, max + 1));

	/* Transfer 0 of the plan, so `decode --expect-xfers 1` on the same plan verifies it. */
	size_t first;
	uint64_t bytes;
	uint32_t n = plan_xfer(p, 0, &first, &bytes, segs, sk, dk);

	failed += !report("good transfer after errors", KVP_OK,
			  n <= max ? run_one(sd.c, 0, peer, segs, n, o->timeout_s) : -E2BIG);
	printf("bad: %d of %zu cases failed\n", failed, ncases + 3);
	free(segs);
	side_close(&sd, o);
	return failed ? 1 : 0;
}

/* ---- command line ---- */

enum opt_kind { O_STR, O_U64, O_SEC, O_FLAG };

static const struct optdef {
	const char *name;
	enum opt_kind kind;
	size_t off;
} optdefs[] = {
	{ "socket", O_STR, offsetof(struct opts, sock) },
	{ "peer", O_STR, offsetof(struct opts, peer) },
	{ "key-file", O_STR, offsetof(struct opts, key_file) },
	{ "size", O_U64, offsetof(struct opts, size) },
	{ "seed", O_U64, offsetof(struct opts, seed) },
	{ "min-seg", O_U64, offsetof(struct opts, min_seg) },
	{ "max-seg", O_U64, offsetof(struct opts, max_seg) },
	{ "timeout-ms", O_U64, offsetof(struct opts, timeout_ms) },
	{ "segs-per-xfer", O_U64, offsetof(struct opts, segs_per_xfer) },
	{ "inflight", O_U64, offsetof(struct opts, inflight) },
	{ "expect-xfers", O_U64, offsetof(struct opts, expect_xfers) },
	{ "rounds", O_U64, offsetof(struct opts, rounds) },
	{ "timeout", O_SEC, offsetof(struct opts, timeout_s) },
	{ "wait-key", O_SEC, offsetof(struct opts, wait_key_s) },
	{ "json", O_FLAG, offsetof(struct opts, json) },
	{ "linear", O_FLAG, offsetof(struct opts, linear) },
	{ "stop-file", O_STR, offsetof(struct opts, stop_file) },
};

#define NOPTS (sizeof(optdefs) / sizeof(optdefs[0]))

static void
usage(FILE *f)
{
	fputs("usage:\n"
	      "  kvproxy-bench decode  -s SOCK --size BYTES --seed N --key-file PATH\n"
	      "                        [--expect-xfers N] [--timeout SEC] [--stop-file PATH]\n"
	      "                        [--json] [plan flags]\n"
	      "  kvproxy-bench prefill -s SOCK --peer NODE_ID --key-file PATH --size BYTES\n"
	      "                        --seed N [--inflight Q] [--timeout-ms MS] [--wait-key SEC]\n"
	      "                        [--json] [plan flags]\n"
	      "  kvproxy-bench bad     -s SOCK --peer NODE_ID --key-file PATH [--size BYTES]\n"
	      "                        [--seed N] [--timeout SEC] [--wait-key SEC] [plan flags]\n"
	      "plan flags (must match on both sides): --min-seg BYTES (4096)\n"
	      "  --max-seg BYTES (8388608) --segs-per-xfer K (16)\n"
	      "  --rounds R (1, prefill and decode): the plan R times over the same regions\n"
	      "  (user_id t is plan transfer t % nxfer; decode expects every transfer R times\n"
	      "  and verifies once at the end); gbps counts R x --size bytes\n"
	      "  --linear: destination offsets equal source offsets (contiguous KV pages,\n"
	      "  which the daemon may coalesce), instead of a shuffled layout\n"
	      "Sizes take k/m/g suffixes (powers of 1024). In prefill --json, gbps is Gbit/s.\n"
	      "bad's good transfer is transfer 0 of the plan for its --size (1m) and --seed.\n",
	      f);
}

static bool
set_opt(struct opts *o, const struct optdef *d, const char *arg)
{
	char *field = (char *)o + d->off, *end;
	double sec;

	switch (d->kind) {
	case O_STR:
		*(const char **)field = arg;
		return true;
	case O_FLAG:
		*(bool *)field = true;
		return true;
	case O_SEC:
		sec = strtod(arg, &end);
		*(double *)field = sec;
		return end != arg && *end == '\0' && sec >= 0;
	case O_U64:
		return kvp_test_parse_u64(arg, (uint64_t *)field) == 0;
	}
	return false;
}

static void
parse_args(int argc, char **argv, struct opts *o)
{
	struct option lo[NOPTS + 2] = { [NOPTS] = { "help", no_argument, NULL, 'h' } };
	int c;

	for (size_t i = 0; i < NOPTS; i++)
		lo[i] = (struct option){ optdefs[i].name,
					 optdefs[i].kind == O_FLAG ? no_argument :
								     required_argument,
					 NULL, 256 + (int)i };
	while ((c = getopt_long(argc, argv, "s:h", lo, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			exit(0);
		}
		if (c == '?') {
			usage(stderr);
			exit(2);
		}
		const struct optdef *d = c == 's' ? &optdefs[0] : &optdefs[c - 256];

		if (!set_opt(o, d, optarg))
			usage_error("bad value '%s' for --%s", optarg, d->name);
	}
	if (optind != argc)
		usage_error("unexpected argument '%s'", argv[optind]);
	if (o->size == 0 || o->min_seg == 0 || o->max_seg < o->min_seg || o->segs_per_xfer == 0 ||
	    o->segs_per_xfer > KVP_XFER_SEGS_MAX || o->inflight == 0)
		usage_error(
			"need --size > 0, 0 < --min-seg <= --max-seg, 0 < --segs-per-xfer <= %u "
			"and --inflight > 0",
			KVP_XFER_SEGS_MAX);
}

int
main(int argc, char **argv)
{
	struct opts o = {
		.seed = 1,
		.min_seg = DEF_MIN_SEG,
		.max_seg = DEF_MAX_SEG,
		.segs_per_xfer = DEF_SEGS_PER_XFER,
		.inflight = DEF_INFLIGHT,
		.timeout_s = -1,
		.wait_key_s = 30,
		.rounds = 1,
	};
	const char *cmd = argc > 1 ? argv[1] : "";
	bool dec = !strcmp(cmd, "decode"), pre = !strcmp(cmd, "prefill"), bad = !strcmp(cmd, "bad");
	struct plan p;
	int rc;

	if (!dec && !pre && !bad) {
		usage(stderr);
		return 2;
	}
	if (bad)
		o.size = DEF_BAD_SIZE;
	parse_args(argc - 1, argv + 1, &o);
	if (o.timeout_s < 0)
		o.timeout_s = bad ? 10 : 60;
	if (o.rounds == 0)
		usage_error("--rounds must be at least 1");
	if (bad && o.rounds != 1)
		usage_error("--rounds is for prefill and decode");
	if (o.rounds > UINT64_MAX / o.size)
		usage_error("--rounds %" PRIu64 " x --size %" PRIu64 " is past 64 bits", o.rounds,
			    o.size);
	/* Milliseconds become nanoseconds (and a stall limit) below: keep them in range. */
	if (o.timeout_ms > 86400000ull * 365)
		usage_error("--timeout-ms %" PRIu64 " is above a year", o.timeout_ms);
	if (o.sock == NULL || o.key_file == NULL || (!dec && o.peer == NULL))
		usage_error("%s needs -s SOCK, --key-file PATH%s", cmd,
			    dec ? "" : " and --peer NODE_ID");
	struct plan_params pp = { .seed = o.seed,
				  .size = o.size,
				  .min_seg = o.min_seg,
				  .max_seg = o.max_seg,
				  .segs_per_xfer = (uint32_t)o.segs_per_xfer,
				  .linear = o.linear };

	if (plan_build(&p, &pp) < 0)
		die("out of memory");
	rc = dec ? cmd_decode(&o, &p) : pre ? cmd_prefill(&o, &p) : cmd_bad(&o, &p);
	plan_free(&p);
	return rc;
}
