/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp-latency-bench: latency of one transfer at a time, and the floor it is
 * measured against.
 *
 *   sink  registers a destination region, publishes its key in a file and
 *         reads landing notices until a stop file appears (the receiver)
 *   run   sends one transfer of --size bytes at a time to the sink and times
 *         each from before kvp_submit() to kvp_wait() returning its DONE;
 *         the daemon's phase stamps (queue, admit, post, wire, deliver) come
 *         with every completion and are summarised beside it
 *   pong  a plain TCP server: reads --size bytes, answers 8 (an ACK)
 *   ping  its client: sends --size bytes, waits for the 8, times each round
 *
 * ping/pong is the floor any TCP transport pays for moving --size bytes and
 * learning that they arrived, between two processes over the same path.
 * Results: percentiles in microseconds (JSON with --json), and with
 * --samples FILE every latency in nanoseconds, one per line, for plots.
 */
#include <arpa/inet.h>
#include <err.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvp_test.h"
#include "kvproxy.h"

/* "PROGRAM: message" and exit 1 (glibc err.h). */
#define die(...) errx(1, __VA_ARGS__)

#define ACK_LEN 8

struct opts {
	const char *sock;
	const char *peer;
	const char *key_file;
	const char *stop_file;
	const char *samples;
	const char *addr; /* pong: listen, ping: connect (HOST:PORT) */
	uint64_t size;
	uint64_t iters;
	uint64_t warmup;
	double timeout_s;
	bool json;
	bool spin; /* ping/pong: poll the socket (yielding) instead of blocking in recv */
};

static bool spin_io;

/* Nearest-rank quantile @p q (0..1] of sorted @p v, in microseconds. */
static double
q_us(const uint64_t *v, size_t n, double q)
{
	size_t r = (size_t)((double)n * q + 0.999999);

	return n == 0 ? 0 : (double)v[r ? (r > n ? n : r) - 1 : 0] / 1e3;
}

static void
write_samples(const char *path, const uint64_t *v, size_t n)
{
	FILE *f = fopen(path, "w");

	if (!f)
		die("%s: %s", path, strerror(errno));
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%" PRIu64 "\n", v[i]);
	if (fclose(f) != 0)
		die("%s: %s", path, strerror(errno));
}

/* Prints {"p50_us":..,"p99_us":..,"p999_us":..,"max_us":..,"mean_us":..}; sorts @p v. */
static void
print_quantiles(FILE *f, uint64_t *v, size_t n)
{
	double sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += (double)v[i];
	kvp_test_sort_u64(v, n);
	fprintf(f, "{\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f}",
		q_us(v, n, 0.5), q_us(v, n, 0.99), q_us(v, n, 0.999), q_us(v, n, 1.0),
		n ? sum / (double)n / 1e3 : 0);
}

/* ---- kvproxy ---- */

struct side {
	struct kvp_client *c;
	int fd;
	void *mem;
	uint64_t key;
};

static void
side_open(struct side *s, const struct opts *o)
{
	int rc = kvp_connect(o->sock, 0, 0, &s->c);

	if (rc < 0)
		die("connect %s: %s", o->sock, strerror(-rc));
	rc = kvp_host_alloc(o->size, &s->fd, &s->mem);
	if (rc < 0)
		die("allocating %" PRIu64 " bytes: %s", o->size, strerror(-rc));
	memset(s->mem, 0x5a, o->size);
	rc = kvp_region_register(s->c, s->fd, 0, o->size, KVP_REGION_HOST, &s->key);
	if (rc < 0)
		die("register: %s (%s)", strerror(-rc), kvp_last_error(s->c));
}

static int
cmd_sink(const struct opts *o)
{
	struct kvp_cqe cqes[64];
	struct side s;
	uint64_t landed = 0, deadline = kvp_test_now_ns() + (uint64_t)(o->timeout_s * 1e9);
	int rc;

	side_open(&s, o);
	rc = kvp_test_key_write(o->key_file, s.key);
	if (rc < 0)
		die("key file %s: %s", o->key_file, strerror(-rc));
	while (kvp_test_now_ns() < deadline && !(o->stop_file && access(o->stop_file, F_OK) == 0)) {
		int n = kvp_wait(s.c, cqes, 64, 100);

		if (n < 0)
			die("wait: %s", strerror(-n));
		for (int i = 0; i < n; i++)
			landed += cqes[i].kind == KVP_CQE_LANDED;
	}
	unlink(o->key_file);
	printf("sink: %" PRIu64 " transfers landed\n", landed);
	kvp_close(s.c);
	return 0;
}

static uint64_t
key_read(const char *path, double wait_s)
{
	uint64_t key;
	int rc = kvp_test_key_read(path, wait_s, &key);

	if (rc < 0)
		die("key file %s: %s", path, kvp_test_key_error(rc));
	return key;
}

/* Phase stamps of the completions: (name, KVP_PH_* index). */
static const struct {
	const char *name;
	int ph;
} phases[] = {
	{ "queue", KVP_PH_QUEUE }, { "admit", KVP_PH_ADMIT },	  { "first", KVP_PH_FIRST },
	{ "post", KVP_PH_POST },   { "wire", KVP_PH_WIRE },	  { "deliver", KVP_PH_DELIVER },
	{ "e2e", KVP_PH_E2E },
};
#define NPHASES (sizeof(phases) / sizeof(phases[0]))

static int
cmd_run(const struct opts *o)
{
	size_t n = o->iters;
	uint64_t *lat = calloc(n, sizeof(*lat)), *ph[NPHASES + 1];
	struct kvp_cqe cqes[16];
	struct side s;
	uint16_t peer;
	int rc;

	for (size_t p = 0; p <= NPHASES; p++)
		if (!(ph[p] = calloc(n, sizeof(uint64_t))))
			die("out of memory");
	if (!lat)
		die("out of memory");
	side_open(&s, o);
	uint64_t dst = key_read(o->key_file, 30);
	if ((rc = kvp_peer_lookup(s.c, o->peer, &peer)) < 0)
		die("peer %s: %s (%s)", o->peer, strerror(-rc), kvp_last_error(s.c));
	struct kvp_segment seg = { s.key, 0, dst, 0, o->size };

	for (uint64_t i = 0; i < o->warmup + n; i++) {
		struct kvp_xfer_desc x = { .user_id = i, .peer = peer };
		uint64_t t0 = kvp_test_now_ns(), deadline = t0 + 10000000000ull;

		if ((rc = kvp_submit(s.c, &x, &seg, 1)) < 0)
			die("submit: %s", strerror(-rc));
		for (bool done = false; !done;) {
			int got = kvp_wait(s.c, cqes, 16, 1000);

			if (got < 0)
				die("wait: %s", strerror(-got));
			if (got == 0 && kvp_test_now_ns() > deadline)
				die("transfer %" PRIu64 " did not complete in 10 s", i);
			for (int k = 0; k < got; k++) {
				const struct kvp_cqe *e = &cqes[k];

				if (e->kind != KVP_CQE_DONE || e->user_id != i)
					continue;
				if (e->status != KVP_OK)
					die("transfer %" PRIu64 ": %s", i, kvp_status_str(e->status));
				done = true;
				if (i < o->warmup)
					break;
				uint64_t t = kvp_test_now_ns() - t0;
				size_t j = i - o->warmup;

				lat[j] = t;
				for (size_t p = 0; p < NPHASES; p++)
					ph[p][j] = e->phase_ns[phases[p].ph];
				/* From the completion posted to this process having it. */
				ph[NPHASES][j] = t > e->phase_ns[KVP_PH_E2E] ? t - e->phase_ns[KVP_PH_E2E]
									 : 0;
			}
		}
	}
	if (o->samples)
		write_samples(o->samples, lat, n);
	FILE *f = o->json ? stdout : stderr;

	fprintf(f, "{\"kind\":\"kvproxy\",\"size\":%" PRIu64 ",\"iters\":%zu,\"latency\":", o->size,
		n);
	print_quantiles(f, lat, n);
	fprintf(f, ",\"phases\":{");
	for (size_t p = 0; p <= NPHASES; p++) {
		fprintf(f, "%s\"%s\":", p ? "," : "", p < NPHASES ? phases[p].name : "client_wake");
		print_quantiles(f, ph[p], n);
	}
	fprintf(f, "}}\n");
	for (size_t p = 0; p <= NPHASES; p++)
		free(ph[p]);
	free(lat);
	kvp_close(s.c);
	return 0;
}

/* ---- the TCP ping-pong reference ---- */

static bool
io_all(int fd, void *buf, size_t len, bool wr)
{
	for (size_t done = 0; done < len;) {
		ssize_t r = wr ? send(fd, (char *)buf + done, len - done, MSG_NOSIGNAL)
			       : recv(fd, (char *)buf + done, len - done, spin_io ? MSG_DONTWAIT : 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && spin_io && !wr && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			/* Spin as kvproxy's workers do before they sleep: yielding to whoever is runnable. */
			sched_yield();
			continue;
		}
		if (r <= 0)
			return false;
		done += (size_t)r;
	}
	return true;
}

static void
nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int
cmd_pong(const struct opts *o)
{
	struct sockaddr_in sa;
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	uint8_t *buf = malloc(o->size), ack[ACK_LEN] = { 0 };

	if (kvp_test_parse_ipv4(o->addr, &sa) < 0)
		die("address '%s': expected IPV4:PORT", o->addr);
	if (!buf || lfd < 0)
		die("socket: %s", strerror(errno));
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0)
		die("listen %s: %s", o->addr, strerror(errno));
	/* One client at a time, until killed. */
	for (;;) {
		int fd = accept(lfd, NULL, NULL);

		if (fd < 0)
			continue;
		nodelay(fd);
		while (io_all(fd, buf, o->size, false) && io_all(fd, ack, ACK_LEN, true))
			;
		close(fd);
	}
}

static int
cmd_ping(const struct opts *o)
{
	struct sockaddr_in sa;
	size_t n = o->iters;
	uint64_t *lat = calloc(n, sizeof(*lat)), deadline = kvp_test_now_ns() + 10000000000ull;
	uint8_t *buf = malloc(o->size), ack[ACK_LEN];
	int fd = -1;

	if (kvp_test_parse_ipv4(o->addr, &sa) < 0)
		die("address '%s': expected IPV4:PORT", o->addr);
	if (!lat || !buf)
		die("out of memory");
	memset(buf, 0x5a, o->size);
	/* The server may not listen yet. */
	for (;;) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		if (kvp_test_now_ns() > deadline)
			die("connect %s: %s", o->addr, strerror(errno));
		close(fd);
		nanosleep(&(struct timespec){ .tv_nsec = 20000000 }, NULL);
	}
	nodelay(fd);
	for (uint64_t i = 0; i < o->warmup + n; i++) {
		uint64_t t0 = kvp_test_now_ns();

		if (!io_all(fd, buf, o->size, true) || !io_all(fd, ack, ACK_LEN, false))
			die("ping-pong: connection lost");
		if (i >= o->warmup)
			lat[i - o->warmup] = kvp_test_now_ns() - t0;
	}
	close(fd);
	if (o->samples)
		write_samples(o->samples, lat, n);
	FILE *f = o->json ? stdout : stderr;

	fprintf(f, "{\"kind\":\"pingpong\",\"spin\":%s,\"size\":%" PRIu64 ",\"iters\":%zu,\"latency\":",
		o->spin ? "true" : "false", o->size, n);
	print_quantiles(f, lat, n);
	fprintf(f, "}\n");
	free(lat);
	free(buf);
	return 0;
}

/* ---- command line ---- */

static uint64_t
parse_size(const char *s)
{
	uint64_t v;

	if (kvp_test_parse_u64(s, &v) < 0)
		die("bad number '%s'", s);
	return v;
}

static void
usage(FILE *f)
{
	fputs("usage:\n"
	      "  kvp-latency-bench sink -s SOCK --size BYTES --key-file PATH [--stop-file PATH]\n"
	      "                         [--timeout SEC]\n"
	      "  kvp-latency-bench run  -s SOCK --peer NODE_ID --key-file PATH --size BYTES\n"
	      "                         [--iters N] [--warmup N] [--samples FILE] [--json]\n"
	      "  kvp-latency-bench pong --addr IPV4:PORT --size BYTES [--spin]\n"
	      "  kvp-latency-bench ping --addr IPV4:PORT --size BYTES [--iters N] [--warmup N]\n"
	      "                         [--samples FILE] [--json] [--spin]\n"
	      "--spin: ping/pong poll their socket, yielding the CPU between tries, instead of\n"
	      "blocking in recv (as kvproxy's workers do before they sleep).\n"
	      "Sizes take k/m/g suffixes. Latencies: microseconds; samples: nanoseconds.\n",
	      f);
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },  { "peer", required_argument, NULL, 'p' },
		{ "key-file", required_argument, NULL, 'k' }, { "stop-file", required_argument, NULL, 'x' },
		{ "samples", required_argument, NULL, 'o' },  { "addr", required_argument, NULL, 'a' },
		{ "size", required_argument, NULL, 'z' },     { "iters", required_argument, NULL, 'n' },
		{ "warmup", required_argument, NULL, 'w' },   { "timeout", required_argument, NULL, 't' },
		{ "json", no_argument, NULL, 'j' },	      { "help", no_argument, NULL, 'h' },
		{ "spin", no_argument, NULL, 'S' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .iters = 1000, .warmup = 100, .timeout_s = 3600 };
	const char *cmd = argc > 1 ? argv[1] : "";
	int c;

	while ((c = getopt_long(argc - 1, argv + 1, "s:h", lo, NULL)) != -1) {
		switch (c) {
		case 's': o.sock = optarg; break;
		case 'p': o.peer = optarg; break;
		case 'k': o.key_file = optarg; break;
		case 'x': o.stop_file = optarg; break;
		case 'o': o.samples = optarg; break;
		case 'a': o.addr = optarg; break;
		case 'z': o.size = parse_size(optarg); break;
		case 'n': o.iters = parse_size(optarg); break;
		case 'w': o.warmup = parse_size(optarg); break;
		case 't': o.timeout_s = strtod(optarg, NULL); break;
		case 'j': o.json = true; break;
		case 'S': o.spin = spin_io = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (o.size == 0 || o.iters == 0) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(cmd, "sink") && o.sock && o.key_file)
		return cmd_sink(&o);
	if (!strcmp(cmd, "run") && o.sock && o.key_file && o.peer)
		return cmd_run(&o);
	if (!strcmp(cmd, "pong") && o.addr)
		return cmd_pong(&o);
	if (!strcmp(cmd, "ping") && o.addr)
		return cmd_ping(&o);
	usage(stderr);
	return 2;
}
