/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rogue_client: a kvproxyd client written by hand from the ABI in
 * kvp_rings.h (no libkvproxy), for the client-isolation tests. It speaks
 * the control protocol (HELLO, REG, PEER_LOOKUP), maps its channel, and then
 * does what an honest client must not: scribble on its rings, name other
 * clients' regions, pin transfer slots by faking a full completion ring.
 *
 *   keys     -s SOCK                       two registrations; keys must differ in
 *                                          their random high bits
 *   hold     -s SOCK --key-file F --size N --seed S --stop-file P [--timeout SEC]
 *            [--truncate]                  honest owner: register a region filled
 *                                          with a pattern, publish its key, wait
 *                                          for P, then check nothing changed it;
 *                                          with --truncate, a rogue one: shrink the
 *                                          region's memfd to 0 bytes once registered
 *                                          (the daemon's mapping then faults)
 *   garbage  -s SOCK --mode M [--seed S] [--timeout SEC]
 *                                          M: random (random SQ entries), backwards
 *                                          (prod moves back), past (prod beyond the
 *                                          ring), nseg (a header promising more
 *                                          entries than published), cqcons (CQ
 *                                          consumer index past the producer);
 *                                          succeeds if the daemon hangs up on us;
 *                                          prints the index or count it wrote
 *                                          ("wrote sq.prod = N") for the log check
 *   steal    -s SOCK --peer NODE --src-key K|own --dst-key K --expect STATUS
 *            [--len N] [--own-size N] [--timeout SEC] [--truncate]
 *            [--xfer-timeout-ns N]         one transfer (with deadline N ns after
 *                                          its submit; default: the daemon's);
 *                                          succeeds if it completes with STATUS
 *                                          (invalid, remote, ok, ...)
 *   pin      -s SOCK --peer NODE --dst-key K [--count N] [--seg N] [--hold SEC]
 *                                          submit N transfers, then move the CQ
 *                                          consumer index back so the ring looks
 *                                          full (an index that never goes back for an
 *                                          honest client); hold the channel open
 *
 * Every subcommand prints one line "rogue_client CMD: ..." saying what happened.
 * Exit: 0 as expected, 1 not as expected, 2 usage, 99 setup failed.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvp_rings.h"
#include "kvp_test.h"

static const char *cmd = "?";

static void __attribute__((format(printf, 2, 3), noreturn)) die(int code, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "rogue_client %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(code);
}

/* Random SQ bytes and indices: reproducible from --seed. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t
rng(void)
{
	return kvp_test_splitmix64(&rng_state);
}

/* ---- control protocol (the test-helper library speaks it from kvp_rings.h) ---- */

static void
conn_open(struct kvp_test_conn *c, const char *path)
{
	struct kvp_ctrl_rep rep;
	int rc = kvp_test_conn_open(c, path, NULL, NULL, &rep);

	if (rc == -ENAMETOOLONG)
		die(2, "socket path too long");
	if (rc < 0)
		die(99, "HELLO %s: %s (%.*s)", path, strerror(-rc), KVP_ERRMSG_MAX, rep.errmsg);
}

static uint64_t
region_register(struct kvp_test_conn *c, int fd, uint64_t len)
{
	struct kvp_ctrl_rep rep;
	uint64_t key = 0;
	int rc = kvp_test_region_register(c, fd, len, KVP_REGION_HOST, &key, &rep);

	if (rc < 0)
		die(99, "REG: %s (%.*s)", strerror(-rc), KVP_ERRMSG_MAX, rep.errmsg);
	return key;
}

static uint16_t
peer_lookup(struct kvp_test_conn *c, const char *node)
{
	uint16_t peer = 0;
	int rc = kvp_test_peer_lookup(c, node, &peer);

	if (rc < 0)
		die(99, "PEER_LOOKUP %s: %s", node, strerror(-rc));
	return peer;
}

static uint8_t *
region_alloc(uint64_t len, int *fd)
{
	void *p;
	/* Sealed against shrinking, as kvproxyd requires. */
	int rc = kvp_test_memfd("rogue-region", len, true, fd, &p);

	if (rc < 0)
		die(99, "memfd: %s", strerror(-rc));
	return p;
}

/* Wait up to @p ms for the daemon to close our socket. @return ms waited, or -1. */
static long
wait_eof(struct kvp_test_conn *c, long ms)
{
	uint64_t t0 = kvp_test_now_ms();

	for (;;) {
		long left = ms - (long)(kvp_test_now_ms() - t0);
		struct pollfd p = { .fd = c->sock, .events = POLLIN };

		if (left <= 0)
			return -1;
		if (poll(&p, 1, (int)left) <= 0)
			continue;
		char b[256];
		ssize_t r = recv(c->sock, b, sizeof(b), MSG_DONTWAIT);

		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
			return (long)(kvp_test_now_ms() - t0);
		/* A reply we did not ask for would be odd; keep waiting for the close. */
	}
}

/* Wait for the DONE completion of @p user_id. @return its status, or -ETIMEDOUT/-EPIPE. */
static int
wait_done(struct kvp_test_conn *c, uint64_t user_id, long ms)
{
	uint64_t t0 = kvp_test_now_ms();
	struct kvp_cqe e[16];

	for (;;) {
		int n = kvp_ring_dequeue_burst(&c->cq, e, 16);

		if (n < 0)
			return -EPROTO;
		for (int i = 0; i < n; i++)
			if (e[i].kind == KVP_CQE_DONE && e[i].user_id == user_id)
				return e[i].status;
		if (n > 0)
			continue;
		long left = ms - (long)(kvp_test_now_ms() - t0);
		if (left <= 0)
			return -ETIMEDOUT;
		if (!kvp_ring_prepare_wait(&c->cq))
			continue;
		struct pollfd p[2] = { { .fd = c->notify, .events = POLLIN },
				       { .fd = c->sock, .events = POLLIN } };
		poll(p, 2, left < 100 ? (int)left : 100);
		kvp_ring_finish_wait(&c->cq);
		if (p[0].revents & POLLIN) {
			uint64_t v;

			if (read(c->notify, &v, sizeof(v)) < 0) {
				/* raced with another reader: fine */
			}
		}
		if (p[1].revents & (POLLIN | POLLHUP)) {
			char b;

			if (recv(c->sock, &b, 1, MSG_DONTWAIT | MSG_PEEK) == 0)
				return -EPIPE;
		}
	}
}

static int
status_of(const char *name)
{
	for (int s = 0; s < KVP_STATUS_MAX; s++)
		if (strcmp(kvp_status_str(s), name) == 0)
			return s;
	die(2, "unknown status '%s'", name);
}

static uint64_t
parse_u64(const char *s, const char *what)
{
	uint64_t v;

	if (kvp_test_parse_u64(s, &v) < 0)
		die(2, "bad %s '%s'", what, s);
	return v;
}

static uint64_t
read_key(const char *path)
{
	uint64_t key;
	int rc = kvp_test_key_read(path, 0, &key);

	if (rc < 0)
		die(99, "key file %s: %s", path,
		    rc == -ETIMEDOUT ? "no such file" :
		    rc == -EBADMSG   ? "not a key" :
				       strerror(-rc));
	return key;
}

/* ---- subcommands ---- */

struct opts {
	const char *sock;
	const char *key_file;
	const char *stop_file;
	const char *mode;
	const char *peer;
	const char *src_key;
	const char *dst_key;
	const char *expect;
	uint64_t size;
	uint64_t seed;
	uint64_t len;
	uint64_t own_size;
	uint64_t count;
	uint64_t seg;
	uint64_t xfer_timeout_ns;
	double timeout_s;
	double hold_s;
	bool truncate;
};

static int
cmd_keys(const struct opts *o)
{
	struct kvp_test_conn c;
	int fd;
	uint64_t k[3];

	conn_open(&c, o->sock);
	region_alloc(1 << 16, &fd);
	for (int i = 0; i < 3; i++)
		k[i] = region_register(&c, fd, 1 << 16);
	printf("rogue_client keys: 0x%016" PRIx64 " 0x%016" PRIx64 " 0x%016" PRIx64 "\n", k[0],
	       k[1], k[2]);
	/* Above the 16-bit slot index the bits are random: never equal, never a counter. */
	bool ok = true;
	for (int i = 0; i < 3; i++)
		for (int j = i + 1; j < 3; j++)
			if ((k[i] >> 16) == (k[j] >> 16) || (k[i] >> 16) + 1 == (k[j] >> 16) ||
			    (k[j] >> 16) + 1 == (k[i] >> 16))
				ok = false;
	/* And they are spread: at least 8 differing bits between any two high parts. */
	for (int i = 0; i < 3; i++)
		for (int j = i + 1; j < 3; j++)
			if (__builtin_popcountll((k[i] ^ k[j]) >> 16) < 8)
				ok = false;
	printf("rogue_client keys: high bits %s\n", ok ? "random (differ)" : "NOT RANDOM");
	return ok ? 0 : 1;
}

static volatile sig_atomic_t stop;

static void
on_term(int sig)
{
	(void)sig;
	stop = 1;
}


/*
 * A region that shrinks under the daemon's mapping would crash it (SIGBUS):
 * an unsealed memfd must be refused at registration, and a sealed one
 * cannot shrink. Exit 0 when both hold.
 */
static int
shrink_attack(struct kvp_test_conn *c, const struct opts *o)
{
	struct kvp_ctrl_rep rep;
	uint64_t key;
	int fd, sfd, rc = kvp_test_memfd("rogue-unsealed", o->size, false, &fd, NULL);

	if (rc < 0)
		die(99, "memfd: %s", strerror(-rc));
	rc = kvp_test_region_register(c, fd, o->size, KVP_REGION_HOST, &key, &rep);
	if (rc != -EPERM) {
		fprintf(stderr, "rogue_client: unsealed memfd registration: %d, expected -EPERM\n", rc);
		return 1;
	}
	printf("rogue_client hold: unsealed memfd refused (%.*s)\n", KVP_ERRMSG_MAX, rep.errmsg);
	region_alloc(o->size, &sfd);
	region_register(c, sfd, o->size);
	if (ftruncate(sfd, 0) == 0 || errno != EPERM) {
		fprintf(stderr, "rogue_client: a sealed region could shrink\n");
		return 1;
	}
	printf("rogue_client hold: sealed region cannot shrink (EPERM)\n");
	return 0;
}

static int
cmd_hold(const struct opts *o)
{
	struct kvp_test_conn c;
	size_t first = 0;
	int fd, rc;

	if (!o->key_file || !o->stop_file || !o->size)
		die(2, "hold needs --key-file, --stop-file and --size");
	signal(SIGTERM, on_term);
	conn_open(&c, o->sock);
	if (o->truncate)
		return shrink_attack(&c, o);
	uint8_t *p = region_alloc(o->size, &fd);
	kvp_test_pattern_fill(o->seed, 0, p, o->size);
	uint64_t key = region_register(&c, fd, o->size);
	rc = kvp_test_key_write(o->key_file, key);
	if (rc < 0)
		die(99, "key file: %s", strerror(-rc));
	uint64_t deadline = kvp_test_now_ms() + (uint64_t)(o->timeout_s * 1000);
	while (!stop && access(o->stop_file, F_OK) != 0 && kvp_test_now_ms() < deadline)
		usleep(20000);
	/* The pattern is a function of (seed, offset): nothing else may have written it. */
	uint64_t diff = kvp_test_pattern_check(o->seed, 0, p, o->size, &first);
	unlink(o->key_file);
	if (diff)
		printf("rogue_client hold: region 0x%016" PRIx64 " CHANGED: %" PRIu64
		       " bytes differ, first at %zu\n",
		       key, diff, first);
	else
		printf("rogue_client hold: region 0x%016" PRIx64 " intact (%" PRIu64 " bytes)\n",
		       key, o->size);
	return diff ? 1 : 0;
}

static int
cmd_garbage(const struct opts *o)
{
	struct kvp_test_conn c;
	const char *m = o->mode ? o->mode : "random";
	uint32_t size;

	conn_open(&c, o->sock);
	size = c.sq.size;
	rng_state = o->seed * 0x9e3779b97f4a7c15ull + 7;
	uint32_t prod = atomic_load(&c.hdr->sq.prod);

	if (strcmp(m, "random") == 0) {
		/* Random bytes in every slot, published a few at a time until the daemon gives up. */
		for (uint32_t i = 0; i < size * (uint32_t)KVP_SQE_SIZE; i += 8) {
			uint64_t v = rng();

			memcpy(c.sq.slots + i, &v, 8);
		}
		long waited = -1;
		for (uint32_t published = 0; published < size && waited < 0;) {
			uint32_t k = 1 + (uint32_t)(rng() % 8);

			if (published + k > size)
				k = size - published;
			published += k;
			atomic_store_explicit(&c.hdr->sq.prod, prod + published,
					      memory_order_release);
			kvp_test_doorbell(&c);
			waited = wait_eof(&c, 300);
		}
		if (waited < 0)
			waited = wait_eof(&c, (long)(o->timeout_s * 1000));
		printf("rogue_client garbage random: %s\n",
		       waited >= 0 ? "disconnected by the daemon" : "STILL CONNECTED");
		return waited >= 0 ? 0 : 1;
	}
	if (strcmp(m, "backwards") == 0 || strcmp(m, "past") == 0) {
		uint32_t v = m[0] == 'b' ? prod - 1 - (uint32_t)(rng() % 1000)
					 : prod + size + 1 + (uint32_t)(rng() % 1000);

		atomic_store_explicit(&c.hdr->sq.prod, v, memory_order_release);
		printf("rogue_client garbage %s: wrote sq.prod = %u\n", m, v);
	} else if (strcmp(m, "nseg") == 0) {
		struct kvp_sqe_xfer h;

		memset(&h, 0, sizeof(h));
		h.op = KVP_OP_XFER;
		h.nseg = size; /* more than the ring can have published behind it */
		h.user_id = 1;
		memcpy(c.sq.slots + (prod & c.sq.mask) * KVP_SQE_SIZE, &h, sizeof(h));
		atomic_store_explicit(&c.hdr->sq.prod, prod + 1, memory_order_release);
		printf("rogue_client garbage %s: wrote nseg = %u\n", m, size);
	} else if (strcmp(m, "cqcons") == 0) {
		/* Claim to have consumed completions that were never produced... */
		uint32_t v = atomic_load(&c.hdr->cq.prod) + 100;

		atomic_store_explicit(&c.hdr->cq.cons, v, memory_order_release);
		printf("rogue_client garbage %s: wrote cq.cons = %u\n", m, v);
		/* ...then submit, so the daemon looks at the CQ. */
		kvp_test_submit(&c.sq,
				&(struct kvp_test_xfer){ .user_id = 1, .dst_key = 1, .len = 1 });
	} else {
		die(2, "unknown --mode %s", m);
	}
	kvp_test_doorbell(&c);
	long waited = wait_eof(&c, (long)(o->timeout_s * 1000));
	if (waited >= 0)
		printf("rogue_client garbage %s: disconnected by the daemon after %ld ms\n", m,
		       waited);
	else
		printf("rogue_client garbage %s: STILL CONNECTED after %.0f s\n", m, o->timeout_s);
	return waited >= 0 ? 0 : 1;
}

static int
cmd_steal(const struct opts *o)
{
	struct kvp_test_conn c;
	uint64_t src, dst, len = o->len ? o->len : 4096;
	int fd, want;

	if (!o->peer || !o->src_key || !o->dst_key || !o->expect)
		die(2, "steal needs --peer, --src-key, --dst-key and --expect");
	want = status_of(o->expect);
	conn_open(&c, o->sock);
	uint16_t peer = peer_lookup(&c, o->peer);
	if (strcmp(o->src_key, "own") == 0) {
		uint64_t n = o->own_size ? o->own_size : len;
		uint8_t *p = region_alloc(n, &fd);

		kvp_test_pattern_fill(99, 0, p, n);
		src = region_register(&c, fd, n);
	} else {
		src = parse_u64(o->src_key, "--src-key");
	}
	dst = strncmp(o->dst_key, "file:", 5) == 0 ? read_key(o->dst_key + 5) :
						     parse_u64(o->dst_key, "--dst-key");

	struct kvp_test_xfer x = { .peer = peer,
				   .user_id = 4242,
				   .submit_ns = kvp_test_now_ns(),
				   .timeout_ns = o->xfer_timeout_ns,
				   .src_key = src,
				   .dst_key = dst,
				   .len = len };
	if (kvp_test_submit(&c.sq, &x) != 2)
		die(99, "SQ full");
	kvp_test_doorbell(&c);
	int st = wait_done(&c, 4242, (long)(o->timeout_s * 1000));
	printf("rogue_client steal: src 0x%016" PRIx64 "%s -> dst 0x%016" PRIx64
	       ": %s (expected %s)\n",
	       src, o->truncate ? " (truncated to 0 bytes)" : "", dst,
	       st >= 0 ? kvp_status_str(st) : strerror(-st), o->expect);
	return st == want ? 0 : 1;
}

static int
cmd_pin(const struct opts *o)
{
	struct kvp_test_conn c;
	uint64_t count = o->count ? o->count : 256, seg = o->seg ? o->seg : 4u << 20, dst;
	int fd;

	if (!o->peer || !o->dst_key)
		die(2, "pin needs --peer and --dst-key");
	signal(SIGTERM, on_term);
	conn_open(&c, o->sock);
	uint16_t peer = peer_lookup(&c, o->peer);
	uint8_t *p = region_alloc(seg, &fd);
	kvp_test_pattern_fill(5, 0, p, seg);
	uint64_t src = region_register(&c, fd, seg);
	dst = strncmp(o->dst_key, "file:", 5) == 0 ? read_key(o->dst_key + 5) :
						     parse_u64(o->dst_key, "--dst-key");
	uint64_t sent = 0;
	for (; sent < count; sent++) {
		struct kvp_test_xfer x = { .peer = peer,
					   .user_id = sent,
					   .submit_ns = kvp_test_now_ns(),
					   .timeout_ns = 3600ull * 1000000000,
					   .src_key = src,
					   .dst_key = dst,
					   .len = seg };

		if (kvp_test_submit(&c.sq, &x) != 2)
			break;
	}
	/* Let the daemon admit them all first (it refuses new work while the CQ looks full). */
	kvp_test_doorbell(&c);
	uint64_t until = kvp_test_now_ms() + 10000;
	while (atomic_load(&c.hdr->sq.cons) != atomic_load(&c.hdr->sq.prod) &&
	       kvp_test_now_ms() < until)
		usleep(200);
	/*
	 * The CQ now "looks full" from the daemon's side: cons sits one ring
	 * behind prod. Completions of the transfers just submitted cannot be
	 * posted; whether their transfer slots stay taken is the question.
	 */
	uint32_t cqprod = atomic_load(&c.hdr->cq.prod);
	atomic_store_explicit(&c.hdr->cq.cons, cqprod - c.cq.size, memory_order_release);
	/*
	 * The daemon caches the consumer index and re-reads it when it admits
	 * work: one more submission makes it look (it then waits for CQ room).
	 */
	kvp_test_submit(&c.sq, &(struct kvp_test_xfer){ .peer = peer,
							.user_id = sent,
							.submit_ns = kvp_test_now_ns(),
							.src_key = src,
							.dst_key = dst,
							.len = 4096 });
	kvp_test_doorbell(&c);
	printf("rogue_client pin: %" PRIu64 " transfers of %" PRIu64
	       " bytes submitted and picked up (%u completions already posted), CQ consumer index "
	       "moved back a whole ring\n",
	       sent, seg, cqprod);
	fflush(stdout);
	uint64_t deadline = kvp_test_now_ms() + (uint64_t)((o->hold_s ? o->hold_s : 20) * 1000);
	long closed = -1;
	while (!stop && kvp_test_now_ms() < deadline && closed < 0) {
		/* Keep the lie in place if the daemon ever resets it. */
		atomic_store_explicit(&c.hdr->cq.cons, cqprod - c.cq.size, memory_order_release);
		closed = wait_eof(&c, 100);
	}
	printf("rogue_client pin: %s\n",
	       closed >= 0 ? "the daemon disconnected us" : "held the channel until the end");
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "key-file", required_argument, NULL, 'k' },
		{ "stop-file", required_argument, NULL, 'S' },
		{ "mode", required_argument, NULL, 'm' },
		{ "peer", required_argument, NULL, 'p' },
		{ "src-key", required_argument, NULL, 'a' },
		{ "dst-key", required_argument, NULL, 'b' },
		{ "expect", required_argument, NULL, 'e' },
		{ "size", required_argument, NULL, 'z' },
		{ "seed", required_argument, NULL, 'r' },
		{ "len", required_argument, NULL, 'l' },
		{ "own-size", required_argument, NULL, 'o' },
		{ "count", required_argument, NULL, 'c' },
		{ "seg", required_argument, NULL, 'g' },
		{ "timeout", required_argument, NULL, 't' },
		{ "hold", required_argument, NULL, 'H' },
		{ "truncate", no_argument, NULL, 'T' },
		{ "xfer-timeout-ns", required_argument, NULL, 'X' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .timeout_s = 10 };
	int ch;

	if (argc < 2)
		die(2, "usage: rogue_client keys|hold|garbage|steal|pin -s SOCK [options]");
	cmd = argv[1];
	optind = 2;
	while ((ch = getopt_long(argc, argv, "s:", lo, NULL)) != -1) {
		switch (ch) {
		case 's':
			o.sock = optarg;
			break;
		case 'k':
			o.key_file = optarg;
			break;
		case 'S':
			o.stop_file = optarg;
			break;
		case 'm':
			o.mode = optarg;
			break;
		case 'p':
			o.peer = optarg;
			break;
		case 'a':
			o.src_key = optarg;
			break;
		case 'b':
			o.dst_key = optarg;
			break;
		case 'e':
			o.expect = optarg;
			break;
		case 'z':
			o.size = parse_u64(optarg, "--size");
			break;
		case 'r':
			o.seed = parse_u64(optarg, "--seed");
			break;
		case 'l':
			o.len = parse_u64(optarg, "--len");
			break;
		case 'o':
			o.own_size = parse_u64(optarg, "--own-size");
			break;
		case 'c':
			o.count = parse_u64(optarg, "--count");
			break;
		case 'g':
			o.seg = parse_u64(optarg, "--seg");
			break;
		case 't':
			o.timeout_s = strtod(optarg, NULL);
			break;
		case 'H':
			o.hold_s = strtod(optarg, NULL);
			break;
		case 'T':
			o.truncate = true;
			break;
		case 'X':
			o.xfer_timeout_ns = parse_u64(optarg, "--xfer-timeout-ns");
			break;
		default:
			die(2, "bad option");
		}
	}
	if (!o.sock)
		die(2, "-s SOCK is required");
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (strcmp(cmd, "keys") == 0)
		return cmd_keys(&o);
	if (strcmp(cmd, "hold") == 0)
		return cmd_hold(&o);
	if (strcmp(cmd, "garbage") == 0)
		return cmd_garbage(&o);
	if (strcmp(cmd, "steal") == 0)
		return cmd_steal(&o);
	if (strcmp(cmd, "pin") == 0)
		return cmd_pin(&o);
	die(2, "unknown command '%s'", cmd);
}
