/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hard_client: the client side of test_hardening.sh, built only on the
 * public kvproxy.h. Each mode prints what it saw, one line per step, and
 * exits 0 when every step matched; the script drives the daemon (SIGSTOP,
 * SIGKILL, limits) between steps, which it announces on stdin.
 *
 *   bounds SOCK        control calls against a stopped daemon return
 *                      -ETIMEDOUT within their bound; after its death every
 *                      call returns -EPIPE ("ready", then "stopped" and
 *                      "killed" on stdin)
 *   stuck SOCK N CQ    submit N transfers that fail at once, never read the
 *                      CQ of CQ entries ("stuck"), then on "read" read all N
 *                      and say how long that took
 *   latency SOCK N     N transfers one at a time (each fails at once at the
 *                      worker): round-trip percentiles
 *   many SOCK N        open N clients; count those connected and those
 *                      refused, with the daemon's reasons ("held", then EOF
 *                      on stdin closes them)
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "kvp_test.h"
#include "kvproxy.h"

static int failures;

/* Block until the script writes @p word on a line of its own. */
static void
wait_word(const char *word)
{
	char line[64];

	printf("waiting for '%s'\n", word);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\n")] = '\0';
		if (strcmp(line, word) == 0)
			return;
	}
	fprintf(stderr, "hard_client: stdin closed before '%s'\n", word);
	exit(99);
}

static void
expect(const char *what, int rc, int want, uint64_t ms, uint64_t max_ms)
{
	bool ok = rc == want && ms <= max_ms;

	printf("%-4s %-34s rc %d (%s), want %d, %" PRIu64 " ms (bound %" PRIu64 " ms)\n",
	       ok ? "ok" : "FAIL", what, rc, rc < 0 ? strerror(-rc) : "-", want, ms, max_ms);
	failures += !ok;
}

/* A transfer the worker fails at once: its source key names no region. */
static int
submit_bad(struct kvp_client *c, uint64_t user_id)
{
	struct kvp_xfer_desc x = { .user_id = user_id, .peer = 0, .timeout_ns = 0 };
	struct kvp_segment s = {
		.src_key = 1, .src_off = 0, .dst_key = 2, .dst_off = 0, .len = 4096
	};

	return kvp_submit(c, &x, &s, 1);
}

static int
mode_bounds(const char *sock)
{
	struct kvp_connect_opts o = { .ctrl_timeout_ms = 500 };
	struct kvp_client *c, *c2 = NULL;
	char err[KVP_ERRMSG_MAX];
	uint64_t key = 0, t;
	uint16_t peer;
	void *mem;
	int fd, rc;

	rc = kvp_connect_ex(sock, &o, &c, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "connect: %s (%s)\n", strerror(-rc), err);
		return 99;
	}
	if (kvp_host_alloc(1 << 20, &fd, &mem) < 0 ||
	    kvp_region_register(c, fd, 0, 1 << 20, KVP_REGION_HOST, &key) < 0) {
		fprintf(stderr, "setup: %s\n", kvp_last_error(c));
		return 99;
	}
	printf("ready: connected to %s, region %016" PRIx64 "\n", kvp_node_id(c), key);
	wait_word("stopped");

	/* The daemon is stopped: it accepted us but will not answer. */
	t = kvp_test_now_ms();
	rc = kvp_region_register(c, fd, 0, 4096, KVP_REGION_HOST, &key);
	expect("region_register (stopped)", rc, -ETIMEDOUT, kvp_test_now_ms() - t, 1500);
	printf("     reason: %s\n", kvp_last_error(c));
	t = kvp_test_now_ms();
	rc = kvp_peer_lookup(c, "nobody", &peer);
	expect("peer_lookup (stopped)", rc, -ETIMEDOUT, kvp_test_now_ms() - t, 1500);
	t = kvp_test_now_ms();
	kvp_set_ctrl_timeout(c, 200);
	rc = kvp_region_deregister(c, key);
	expect("region_deregister (stopped, 200ms)", rc, -ETIMEDOUT, kvp_test_now_ms() - t, 1200);
	t = kvp_test_now_ms();
	struct kvp_connect_opts o2 = { .timeout_ms = 500 };
	rc = kvp_connect_ex(sock, &o2, &c2, err, sizeof(err));
	expect("connect_ex (stopped, 500ms)", rc, -ETIMEDOUT, kvp_test_now_ms() - t, 1500);
	printf("     reason: %s\n", err);
	if (rc == 0)
		kvp_close(c2);
	t = kvp_test_now_ms();
	rc = submit_bad(c, 1);
	expect("submit (stopped)", rc < 0 ? rc : 0, 0, kvp_test_now_ms() - t, 50);
	struct kvp_cqe cqe[4];
	t = kvp_test_now_ms();
	rc = kvp_poll(c, cqe, 4);
	expect("poll (stopped)", rc, 0, kvp_test_now_ms() - t, 50);
	t = kvp_test_now_ms();
	rc = kvp_wait(c, cqe, 4, 300);
	expect("wait 300ms (stopped)", rc, 0, kvp_test_now_ms() - t, 1300);

	printf("timed-out\n");
	wait_word("killed");
	/* The daemon is dead: every call says so. */
	t = kvp_test_now_ms();
	do {
		rc = submit_bad(c, 2);
	} while (rc != -EPIPE && kvp_test_now_ms() - t < 100);
	expect("submit (dead)", rc, -EPIPE, kvp_test_now_ms() - t, 100);
	t = kvp_test_now_ms();
	rc = kvp_cancel(c, 2);
	expect("cancel (dead)", rc, -EPIPE, kvp_test_now_ms() - t, 50);
	t = kvp_test_now_ms();
	rc = submit_bad(c, 3);
	expect("submit again (dead)", rc, -EPIPE, kvp_test_now_ms() - t, 50);
	t = kvp_test_now_ms();
	do {
		rc = kvp_poll(c, cqe, 4);
	} while (rc >= 0 && kvp_test_now_ms() - t < 100);
	expect("poll (dead)", rc, -EPIPE, kvp_test_now_ms() - t, 100);
	t = kvp_test_now_ms();
	rc = kvp_wait(c, cqe, 4, -1);
	expect("wait forever (dead)", rc, -EPIPE, kvp_test_now_ms() - t, 100);
	t = kvp_test_now_ms();
	rc = kvp_region_register(c, fd, 0, 4096, KVP_REGION_HOST, &key);
	expect("region_register (dead)", rc, -EPIPE, kvp_test_now_ms() - t, 100);
	rc = kvp_peer_lookup(c, "nobody", &peer);
	expect("peer_lookup (dead)", rc, -EPIPE, kvp_test_now_ms() - t, 100);
	rc = kvp_region_deregister(c, key);
	expect("region_deregister (dead)", rc, -EPIPE, kvp_test_now_ms() - t, 100);
	printf("     reason: %s\n", kvp_last_error(c));
	kvp_close(c);
	kvp_host_free(fd, mem, 1 << 20);
	return failures ? 1 : 0;
}

static int
mode_stuck(const char *sock, unsigned n, unsigned cq)
{
	struct kvp_connect_opts o = { .cq_entries = cq };
	struct kvp_client *c;
	char err[KVP_ERRMSG_MAX];
	struct kvp_cqe cqe[64];
	unsigned got = 0, bad = 0;
	int rc = kvp_connect_ex(sock, &o, &c, err, sizeof(err));

	if (rc < 0) {
		fprintf(stderr, "connect: %s (%s)\n", strerror(-rc), err);
		return 99;
	}
	for (unsigned i = 0; i < n; i++) {
		rc = submit_bad(c, i + 1);
		if (rc < 0) {
			fprintf(stderr, "submit %u: %s\n", i, strerror(-rc));
			return 99;
		}
	}
	printf("stuck: %u transfers submitted, CQ of %u never read\n", n, cq);
	wait_word("read");
	uint64_t t = kvp_test_now_ms();

	while (got < n && kvp_test_now_ms() - t < 20000) {
		rc = kvp_wait(c, cqe, 64, 1000);
		if (rc < 0) {
			fprintf(stderr, "wait: %s\n", strerror(-rc));
			return 1;
		}
		for (int i = 0; i < rc; i++)
			bad += cqe[i].kind != KVP_CQE_DONE || cqe[i].status == KVP_OK;
		got += (unsigned)rc;
	}
	printf("drained %u of %u completions in %" PRIu64 " ms (%u unexpected)\n", got, n,
	       kvp_test_now_ms() - t, bad);
	kvp_close(c);
	return got == n && bad == 0 ? 0 : 1;
}

static int
mode_latency(const char *sock, unsigned n)
{
	struct kvp_client *c;
	char err[KVP_ERRMSG_MAX];
	uint64_t *lat = calloc(n, sizeof(*lat));
	int rc = kvp_connect_ex(sock, NULL, &c, err, sizeof(err));

	if (rc < 0 || !lat) {
		fprintf(stderr, "connect: %s (%s)\n", strerror(-rc), err);
		return 99;
	}
	for (unsigned i = 0; i < n; i++) {
		struct kvp_cqe cqe;
		uint64_t t = kvp_test_now_us();

		rc = submit_bad(c, i + 1);
		if (rc == 0)
			rc = kvp_wait(c, &cqe, 1, 5000);
		if (rc != 1) {
			fprintf(stderr, "transfer %u: %d\n", i, rc);
			return 1;
		}
		lat[i] = kvp_test_now_us() - t;
	}
	kvp_test_sort_u64(lat, n);
	printf("latency us: p50 %" PRIu64 " p99 %" PRIu64 " max %" PRIu64 " (%u transfers)\n",
	       lat[n / 2], lat[n * 99 / 100], lat[n - 1], n);
	free(lat);
	kvp_close(c);
	return 0;
}

static int
mode_many(const char *sock, unsigned n)
{
	struct kvp_client **c = calloc(n, sizeof(*c));
	struct rlimit rl;
	unsigned ok = 0, refused = 0;
	char err[KVP_ERRMSG_MAX], last[KVP_ERRMSG_MAX] = "";

	/* Three descriptors per client here as well. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	for (unsigned i = 0; i < n && c; i++) {
		struct kvp_connect_opts o = { .timeout_ms = 3000,
					      .sq_entries = 64,
					      .cq_entries = 64 };
		int rc = kvp_connect_ex(sock, &o, &c[i], err, sizeof(err));

		if (rc == 0) {
			ok++;
			continue;
		}
		c[i] = NULL;
		refused++;
		if (strcmp(err, last) != 0)
			printf("refused %s: %s\n", strerror(-rc), err);
		snprintf(last, sizeof(last), "%s", err);
	}
	printf("held: %u connected, %u refused\n", ok, refused);
	fflush(stdout);
	while (getchar() != EOF)
		;
	for (unsigned i = 0; i < n && c; i++)
		kvp_close(c[i]);
	free(c);
	return 0;
}

int
main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && strcmp(argv[1], "bounds") == 0)
		return mode_bounds(argv[2]);
	if (argc == 5 && strcmp(argv[1], "stuck") == 0)
		return mode_stuck(argv[2], (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]));
	if (argc == 4 && strcmp(argv[1], "latency") == 0)
		return mode_latency(argv[2], (unsigned)atoi(argv[3]));
	if (argc == 4 && strcmp(argv[1], "many") == 0)
		return mode_many(argv[2], (unsigned)atoi(argv[3]));
	fprintf(stderr, "usage: hard_client bounds|stuck|latency|many SOCK [ARGS]\n");
	return 2;
}
