/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp-fair-bench: several clients of one kvproxyd overloading it at once,
 * driven from one thread so that none of them has a head start but the one
 * the daemon gives it.
 *
 * --clients N heavy clients each keep --queue transfers (of --segs
 * segments of --seg bytes) submitted until --count have completed; with
 * --light-count L, one more client sends L transfers of --light-seg bytes
 * one at a time, --light-gap-ms apart, once the heavy ones are queued.
 * Every transfer goes to the region a `kvp-latency-bench sink` published
 * (--key-file). Reports, as JSON, per client its completions by status and
 * its share of the completions up to the moment the first heavy client
 * finished ("prefix": while every heavy client still had work waiting), as
 * a fraction of an equal share; for the light client its statuses and
 * latencies. Exit status 0 when every transfer completed (whatever its
 * status), 1 otherwise.
 */
#include <err.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvp_test.h"
#include "kvproxy.h"

/* "PROGRAM: message" and exit 1 (glibc err.h). */
#define die(...) errx(1, __VA_ARGS__)

#define MAX_CLIENTS 64
#define MAX_SEGS    64

struct opts {
	const char *sock;
	const char *peer;
	const char *key_file;
	const char *linger_file; /* keep the clients connected until it exists (after the report) */
	uint64_t clients, seg, segs, count, queue;
	uint64_t light_seg, light_count, light_gap_ms;
	uint64_t timeout_ms;
	double run_s;
};

struct cl {
	struct kvp_client *c;
	int fd;
	void *mem;
	uint64_t key;
	uint64_t len;
	uint64_t submitted, completed, inflight;
	uint64_t prefix; /* completions before the first heavy client finished */
	uint64_t status[KVP_STATUS_MAX + 1];
	uint64_t t_sub; /* light: submit time of the transfer in flight */
};

static void
cl_open(struct cl *k, const struct opts *o, uint64_t len)
{
	int rc = kvp_connect(o->sock, 0, 0, &k->c);

	if (rc < 0)
		die("connect %s: %s", o->sock, strerror(-rc));
	if ((rc = kvp_host_alloc(len, &k->fd, &k->mem)) < 0)
		die("allocating %" PRIu64 " bytes: %s", len, strerror(-rc));
	memset(k->mem, 0x3c, len);
	k->len = len;
	if ((rc = kvp_region_register(k->c, k->fd, 0, len, KVP_REGION_HOST, &k->key)) < 0)
		die("register: %s (%s)", strerror(-rc), kvp_last_error(k->c));
}

/* Submit transfer number k->submitted of @p nseg segments of @p seg bytes. @return false if the SQ is full */
static bool
submit(struct cl *k, uint16_t peer, uint64_t dst, uint64_t seg, uint64_t nseg, uint64_t timeout_ms)
{
	struct kvp_segment s[MAX_SEGS];
	struct kvp_xfer_desc x = { .user_id = k->submitted, .peer = peer,
				   .timeout_ns = timeout_ms * 1000000ull };

	for (uint64_t i = 0; i < nseg; i++)
		s[i] = (struct kvp_segment){ k->key, i * seg, dst, i * seg, seg };
	int rc = kvp_submit(k->c, &x, s, (uint32_t)nseg);

	if (rc == -EAGAIN)
		return false;
	if (rc < 0)
		die("submit: %s", strerror(-rc));
	k->submitted++;
	k->inflight++;
	return true;
}

/* Reap @p k's completions; @return how many. */
static int
reap(struct cl *k, uint64_t *lat, uint64_t *nlat)
{
	struct kvp_cqe cqes[64];
	int n = kvp_poll(k->c, cqes, 64), got = 0;

	if (n < 0)
		die("poll: %s", strerror(-n));
	for (int i = 0; i < n; i++) {
		if (cqes[i].kind != KVP_CQE_DONE)
			continue;
		int st = cqes[i].status;

		k->status[st >= 0 && st < KVP_STATUS_MAX ? st : KVP_STATUS_MAX]++;
		k->completed++;
		k->inflight--;
		got++;
		if (lat)
			lat[(*nlat)++] = kvp_test_now_ns() - k->t_sub;
	}
	return got;
}

static void
print_status(const uint64_t *st)
{
	bool first = true;

	printf("{");
	for (int s = 0; s <= KVP_STATUS_MAX; s++) {
		if (!st[s] && s != KVP_OK && s != KVP_ENOBUFS)
			continue;
		printf("%s\"%s\":%" PRIu64, first ? "" : ",", kvp_status_str(s), st[s]);
		first = false;
	}
	printf("}");
}

static int
run(const struct opts *o)
{
	static struct cl cls[MAX_CLIENTS + 1];
	unsigned n = (unsigned)o->clients, nall = n + (o->light_count ? 1 : 0);
	struct cl *light = o->light_count ? &cls[n] : NULL;
	uint64_t *lat = calloc(o->light_count + 1, sizeof(*lat)), nlat = 0, prefix = 0;
	bool first_done = false;
	uint64_t key = 0;
	uint16_t peer;
	FILE *f;
	int rc;

	if (!lat)
		die("out of memory");
	for (unsigned i = 0; i < n; i++)
		cl_open(&cls[i], o, o->seg * o->segs);
	if (light)
		cl_open(light, o, o->light_seg);
	if (!(f = fopen(o->key_file, "r")) || fscanf(f, "%" SCNx64, &key) != 1)
		die("key file %s: cannot read a key", o->key_file);
	fclose(f);
	if ((rc = kvp_peer_lookup(cls[0].c, o->peer, &peer)) < 0)
		die("peer %s: %s", o->peer, strerror(-rc));

	/* Every heavy client's queue filled one transfer each in turn before anything is reaped. */
	for (uint64_t q = 0; q < o->queue; q++)
		for (unsigned i = 0; i < n; i++)
			if (cls[i].submitted < o->count)
				submit(&cls[i], peer, key, o->seg, o->segs, o->timeout_ms);
	uint64_t t0 = kvp_test_now_ns(), deadline = t0 + (uint64_t)(o->run_s * 1e9), next_light = t0;

	for (;;) {
		bool all = true;
		int got = 0;

		for (unsigned i = 0; i < n; i++) {
			struct cl *k = &cls[i];
			int r = reap(k, NULL, NULL);

			got += r;
			if (!first_done) {
				k->prefix += (uint64_t)r;
				prefix += (uint64_t)r;
				if (k->completed == o->count)
					first_done = true;
			}
			while (k->submitted < o->count && k->inflight < o->queue &&
			       submit(k, peer, key, o->seg, o->segs, o->timeout_ms))
				;
			all &= k->completed == o->count;
		}
		if (light) {
			got += reap(light, lat, &nlat);
			if (light->inflight == 0 && light->submitted < o->light_count &&
			    kvp_test_now_ns() >= next_light) {
				light->t_sub = kvp_test_now_ns();
				submit(light, peer, key, o->light_seg, 1, o->timeout_ms);
				next_light = light->t_sub + o->light_gap_ms * 1000000ull;
			}
			all &= light->completed == o->light_count;
		}
		if (all)
			break;
		if (kvp_test_now_ns() > deadline)
			die("not every transfer completed within %.0f s", o->run_s);
		if (!got)
			nanosleep(&(struct timespec){ .tv_nsec = 100000 }, NULL);
	}
	double secs = (double)(kvp_test_now_ns() - t0) / 1e9, min_share = 1e9;

	printf("{\"seconds\":%.3f,\"prefix\":%" PRIu64 ",\"clients\":[", secs, prefix);
	for (unsigned i = 0; i < n; i++) {
		double share = prefix ? (double)cls[i].prefix * n / (double)prefix : 0;

		min_share = share < min_share ? share : min_share;
		printf("%s{\"completed\":%" PRIu64 ",\"prefix\":%" PRIu64 ",\"share\":%.3f,\"status\":",
		       i ? "," : "", cls[i].completed, cls[i].prefix, share);
		print_status(cls[i].status);
		printf("}");
	}
	printf("],\"min_share\":%.3f", n ? min_share : 0);
	if (light) {
		kvp_test_sort_u64(lat, nlat);
		printf(",\"light\":{\"completed\":%" PRIu64 ",\"p50_us\":%.1f,\"max_us\":%.1f,\"status\":",
		       light->completed, nlat ? (double)lat[nlat / 2] / 1e3 : 0,
		       nlat ? (double)lat[nlat - 1] / 1e3 : 0);
		print_status(light->status);
		printf("}");
	}
	printf("}\n");
	fflush(stdout);
	/* A test reads the daemon's per-client counts while the clients are still there. */
	while (o->linger_file && access(o->linger_file, F_OK) != 0 && kvp_test_now_ns() < deadline)
		nanosleep(&(struct timespec){ .tv_nsec = 20000000 }, NULL);
	for (unsigned i = 0; i < nall; i++)
		kvp_close(cls[i].c);
	free(lat);
	return 0;
}

static uint64_t
parse_size(const char *s)
{
	uint64_t v;

	if (kvp_test_parse_u64(s, &v) < 0)
		die("bad number '%s'", s);
	return v;
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "peer", required_argument, NULL, 'p' },
		{ "key-file", required_argument, NULL, 'k' },
		{ "clients", required_argument, NULL, 'c' },
		{ "seg", required_argument, NULL, 'z' },
		{ "segs", required_argument, NULL, 'g' },
		{ "count", required_argument, NULL, 'n' },
		{ "queue", required_argument, NULL, 'q' },
		{ "light-seg", required_argument, NULL, 'Z' },
		{ "light-count", required_argument, NULL, 'N' },
		{ "light-gap-ms", required_argument, NULL, 'G' },
		{ "timeout-ms", required_argument, NULL, 't' },
		{ "run-timeout", required_argument, NULL, 'T' },
		{ "linger-file", required_argument, NULL, 'L' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .clients = 6, .seg = 1 << 20, .segs = 1, .count = 64, .queue = 16,
			  .light_seg = 64 << 10, .light_gap_ms = 2, .run_s = 120 };
	int c;

	while ((c = getopt_long(argc, argv, "s:h", lo, NULL)) != -1) {
		switch (c) {
		case 's': o.sock = optarg; break;
		case 'p': o.peer = optarg; break;
		case 'k': o.key_file = optarg; break;
		case 'c': o.clients = parse_size(optarg); break;
		case 'z': o.seg = parse_size(optarg); break;
		case 'g': o.segs = parse_size(optarg); break;
		case 'n': o.count = parse_size(optarg); break;
		case 'q': o.queue = parse_size(optarg); break;
		case 'Z': o.light_seg = parse_size(optarg); break;
		case 'N': o.light_count = parse_size(optarg); break;
		case 'G': o.light_gap_ms = parse_size(optarg); break;
		case 't': o.timeout_ms = parse_size(optarg); break;
		case 'T': o.run_s = strtod(optarg, NULL); break;
		case 'L': o.linger_file = optarg; break;
		case 'h':
			puts("usage: kvp-fair-bench -s SOCK --peer NODE_ID --key-file PATH [--clients N]\n"
			     "  [--seg BYTES] [--segs K] [--count C] [--queue Q] [--light-count L]\n"
			     "  [--light-seg BYTES] [--light-gap-ms MS] [--timeout-ms MS] [--run-timeout SEC]\n"
			     "  [--linger-file PATH]\n"
			     "The sink's region (kvp-latency-bench sink) must hold segs x seg bytes.");
			return 0;
		default: return 2;
		}
	}
	if (!o.sock || !o.peer || !o.key_file || o.clients > MAX_CLIENTS || o.segs == 0 ||
	    o.segs > MAX_SEGS || o.queue == 0 || (o.clients == 0 && o.light_count == 0))
		die("need -s, --peer, --key-file, --clients <= %d, 0 < --segs <= %d, --queue > 0",
		    MAX_CLIENTS, MAX_SEGS);
	return run(&o);
}
