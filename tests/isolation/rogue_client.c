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
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kvp_rings.h"

struct conn {
	int sock;
	int doorbell;
	int notify;
	uint8_t *chan;
	size_t chan_len;
	struct kvp_chan_hdr *hdr;
	struct kvp_ring sq;
	struct kvp_ring cq;
	uint32_t id;
	uint32_t max_segs;
	uint64_t seq;
};

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

static uint64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t
rng(void)
{
	/* xorshift64*: reproducible from --seed */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

/* ---- control protocol ---- */

static int
ctrl(struct conn *c, struct kvp_ctrl_req *req, int send_fd, struct kvp_ctrl_rep *rep, int *fds,
     unsigned want)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 4)];
	} u;
	struct iovec iov = { .iov_base = req, .iov_len = sizeof(*req) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	size_t got = 0;
	unsigned nfds = 0;

	req->magic = KVP_CTRL_MAGIC;
	req->abi_version = KVP_ABI_VERSION;
	req->seq = ++c->seq;
	if (send_fd >= 0) {
		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &send_fd, sizeof(int));
	}
	if (sendmsg(c->sock, &msg, MSG_NOSIGNAL) != (ssize_t)sizeof(*req))
		return -EPIPE;
	while (got < sizeof(*rep)) {
		iov = (struct iovec){ .iov_base = (uint8_t *)rep + got,
				      .iov_len = sizeof(*rep) - got };
		msg = (struct msghdr){ .msg_iov = &iov,
				       .msg_iovlen = 1,
				       .msg_control = u.buf,
				       .msg_controllen = sizeof(u.buf) };
		ssize_t r = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -EPIPE;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

			for (unsigned i = 0; i < k; i++) {
				int fd;

				memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
				if (nfds < want)
					fds[nfds++] = fd;
				else
					close(fd);
			}
		}
		got += (size_t)r;
	}
	if (rep->magic != KVP_CTRL_MAGIC || rep->seq != req->seq)
		return -EPROTO;
	if (rep->err)
		return rep->err;
	return nfds == want ? 0 : -EPROTO;
}

static void
conn_open(struct conn *c, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int fds[3], rc;

	memset(c, 0, sizeof(*c));
	if (strlen(path) >= sizeof(sa.sun_path))
		die(2, "socket path too long");
	strcpy(sa.sun_path, path);
	c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->sock < 0 || connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die(99, "connect %s: %s", path, strerror(errno));
	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_HELLO;
	req.u.hello.pid = (int32_t)getpid();
	rc = ctrl(c, &req, -1, &rep, fds, 3);
	if (rc < 0)
		die(99, "HELLO: %s (%.*s)", strerror(-rc), KVP_ERRMSG_MAX, rep.errmsg);
	c->id = rep.u.hello.client_id;
	c->max_segs = rep.u.hello.max_segs;
	c->doorbell = fds[1];
	c->notify = fds[2];
	c->chan_len = rep.u.hello.chan_size;
	c->chan = mmap(NULL, c->chan_len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	close(fds[0]);
	if (c->chan == MAP_FAILED)
		die(99, "mmap channel: %s", strerror(errno));
	c->hdr = (struct kvp_chan_hdr *)c->chan;
	rc = kvp_chan_attach(c->chan, c->chan_len, false, &c->sq, &c->cq);
	if (rc < 0)
		die(99, "channel: %s", strerror(-rc));
}

static uint64_t
region_register(struct conn *c, int fd, uint64_t len)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int rc;

	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_REG;
	req.u.reg.len = len;
	req.u.reg.flags = KVP_REGION_HOST;
	rc = ctrl(c, &req, fd, &rep, NULL, 0);
	if (rc < 0)
		die(99, "REG: %s (%.*s)", strerror(-rc), KVP_ERRMSG_MAX, rep.errmsg);
	return rep.u.reg.key;
}

static uint16_t
peer_lookup(struct conn *c, const char *node)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int rc;

	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_PEER_LOOKUP;
	snprintf(req.u.peer.node_id, sizeof(req.u.peer.node_id), "%s", node);
	rc = ctrl(c, &req, -1, &rep, NULL, 0);
	if (rc < 0)
		die(99, "PEER_LOOKUP %s: %s", node, strerror(-rc));
	return rep.u.peer.peer;
}

static uint8_t *
region_alloc(uint64_t len, int *fd)
{
	uint8_t *p;

	/* Sealed against shrinking, as kvproxyd requires. */
	*fd = memfd_create("rogue-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (*fd < 0 || ftruncate(*fd, (off_t)len) < 0 ||
	    fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		die(99, "memfd: %s", strerror(errno));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (p == MAP_FAILED)
		die(99, "mmap region: %s", strerror(errno));
	return p;
}

static void
fill(uint8_t *p, uint64_t len, uint64_t seed)
{
	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
	for (uint64_t i = 0; i + 8 <= len; i += 8) {
		uint64_t v = rng();

		memcpy(p + i, &v, 8);
	}
}

static void
ring_doorbell(struct conn *c)
{
	uint64_t one = 1;

	/* Always, whether or not the daemon sleeps: a rogue need not be polite. */
	if (write(c->doorbell, &one, sizeof(one)) < 0) {
		/* EAGAIN: counter saturated; the daemon wakes anyway. */
	}
}

/* Wait up to @p ms for the daemon to close our socket. @return ms waited, or -1. */
static long
wait_eof(struct conn *c, long ms)
{
	uint64_t t0 = now_ms();

	for (;;) {
		long left = ms - (long)(now_ms() - t0);
		struct pollfd p = { .fd = c->sock, .events = POLLIN };

		if (left <= 0)
			return -1;
		if (poll(&p, 1, (int)left) <= 0)
			continue;
		char b[256];
		ssize_t r = recv(c->sock, b, sizeof(b), MSG_DONTWAIT);

		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
			return (long)(now_ms() - t0);
		/* A reply we did not ask for would be odd; keep waiting for the close. */
	}
}

/* Wait for the DONE completion of @p user_id. @return its status, or -ETIMEDOUT/-EPIPE. */
static int
wait_done(struct conn *c, uint64_t user_id, long ms)
{
	uint64_t t0 = now_ms();
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
		long left = ms - (long)(now_ms() - t0);
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
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s || (*end != '\0' && *end != '\n'))
		die(2, "bad %s '%s'", what, s);
	return v;
}

static uint64_t
read_key(const char *path)
{
	char line[64];
	FILE *f = fopen(path, "r");

	if (!f || !fgets(line, sizeof(line), f))
		die(99, "key file %s: %s", path, strerror(errno));
	fclose(f);
	return parse_u64(line, "key");
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
	struct conn c;
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
shrink_attack(struct conn *c, const struct opts *o)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int fd = memfd_create("rogue-unsealed", MFD_CLOEXEC), sfd, rc;

	if (fd < 0 || ftruncate(fd, (off_t)o->size) < 0)
		die(99, "memfd: %s", strerror(errno));
	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_REG;
	req.u.reg.len = o->size;
	req.u.reg.flags = KVP_REGION_HOST;
	rc = ctrl(c, &req, fd, &rep, NULL, 0);
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
	struct conn c;
	int fd;
	char tmp[4096];

	if (!o->key_file || !o->stop_file || !o->size)
		die(2, "hold needs --key-file, --stop-file and --size");
	signal(SIGTERM, on_term);
	conn_open(&c, o->sock);
	if (o->truncate)
		return shrink_attack(&c, o);
	uint8_t *p = region_alloc(o->size, &fd);
	uint8_t *copy = malloc(o->size);
	if (!copy)
		die(99, "out of memory");
	fill(p, o->size, o->seed);
	memcpy(copy, p, o->size);
	uint64_t key = region_register(&c, fd, o->size);
	snprintf(tmp, sizeof(tmp), "%s.tmp", o->key_file);
	FILE *f = fopen(tmp, "w");
	if (!f || fprintf(f, "0x%016" PRIx64 "\n", key) < 0 || fclose(f) != 0 ||
	    rename(tmp, o->key_file) != 0)
		die(99, "key file: %s", strerror(errno));
	uint64_t deadline = now_ms() + (uint64_t)(o->timeout_s * 1000);
	while (!stop && access(o->stop_file, F_OK) != 0 && now_ms() < deadline)
		usleep(20000);
	uint64_t diff = 0, first = 0;
	for (uint64_t i = 0; i < o->size; i++)
		if (p[i] != copy[i] && diff++ == 0)
			first = i;
	unlink(o->key_file);
	if (diff)
		printf("rogue_client hold: region 0x%016" PRIx64 " CHANGED: %" PRIu64
		       " bytes differ, first at %" PRIu64 "\n",
		       key, diff, first);
	else
		printf("rogue_client hold: region 0x%016" PRIx64 " intact (%" PRIu64 " bytes)\n",
		       key, o->size);
	free(copy);
	return diff ? 1 : 0;
}

static int
cmd_garbage(const struct opts *o)
{
	struct conn c;
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
			ring_doorbell(&c);
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
		struct kvp_sqe_seg e[2];
		struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&e[0];

		memset(e, 0, sizeof(e));
		h->op = KVP_OP_XFER;
		h->nseg = 1;
		h->user_id = 1;
		e[1].op = KVP_OP_SEG;
		e[1].len = 1;
		e[1].dst_key = 1;
		kvp_ring_enqueue_bulk(&c.sq, e, 2);
	} else {
		die(2, "unknown --mode %s", m);
	}
	ring_doorbell(&c);
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
	struct conn c;
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

		fill(p, n, 99);
		src = region_register(&c, fd, n);
	} else {
		src = parse_u64(o->src_key, "--src-key");
	}
	dst = strncmp(o->dst_key, "file:", 5) == 0 ? read_key(o->dst_key + 5) :
						     parse_u64(o->dst_key, "--dst-key");

	struct kvp_sqe_seg e[2];
	struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&e[0];
	memset(e, 0, sizeof(e));
	h->op = KVP_OP_XFER;
	h->peer = peer;
	h->nseg = 1;
	h->user_id = 4242;
	h->submit_ns = now_ns();
	h->timeout_ns = o->xfer_timeout_ns;
	e[1].op = KVP_OP_SEG;
	e[1].src_key = src;
	e[1].len = len;
	e[1].dst_key = dst;
	if (kvp_ring_enqueue_bulk(&c.sq, e, 2) != 2)
		die(99, "SQ full");
	ring_doorbell(&c);
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
	struct conn c;
	uint64_t count = o->count ? o->count : 256, seg = o->seg ? o->seg : 4u << 20, dst;
	int fd;

	if (!o->peer || !o->dst_key)
		die(2, "pin needs --peer and --dst-key");
	signal(SIGTERM, on_term);
	conn_open(&c, o->sock);
	uint16_t peer = peer_lookup(&c, o->peer);
	uint8_t *p = region_alloc(seg, &fd);
	fill(p, seg, 5);
	uint64_t src = region_register(&c, fd, seg);
	dst = strncmp(o->dst_key, "file:", 5) == 0 ? read_key(o->dst_key + 5) :
						     parse_u64(o->dst_key, "--dst-key");
	uint64_t sent = 0;
	for (; sent < count; sent++) {
		struct kvp_sqe_seg e[2];
		struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&e[0];

		memset(e, 0, sizeof(e));
		h->op = KVP_OP_XFER;
		h->peer = peer;
		h->nseg = 1;
		h->user_id = sent;
		h->submit_ns = now_ns();
		h->timeout_ns = 3600ull * 1000000000;
		e[1].op = KVP_OP_SEG;
		e[1].src_key = src;
		e[1].len = seg;
		e[1].dst_key = dst;
		if (kvp_ring_enqueue_bulk(&c.sq, e, 2) != 2)
			break;
	}
	/* Let the daemon admit them all first (it refuses new work while the CQ looks full). */
	ring_doorbell(&c);
	uint64_t until = now_ms() + 10000;
	while (atomic_load(&c.hdr->sq.cons) != atomic_load(&c.hdr->sq.prod) && now_ms() < until)
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
	struct kvp_sqe_seg e[2];
	struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&e[0];

	memset(e, 0, sizeof(e));
	h->op = KVP_OP_XFER;
	h->peer = peer;
	h->nseg = 1;
	h->user_id = sent;
	h->submit_ns = now_ns();
	e[1].op = KVP_OP_SEG;
	e[1].src_key = src;
	e[1].len = 4096;
	e[1].dst_key = dst;
	kvp_ring_enqueue_bulk(&c.sq, e, 2);
	ring_doorbell(&c);
	printf("rogue_client pin: %" PRIu64 " transfers of %" PRIu64
	       " bytes submitted and picked up (%u completions already posted), CQ consumer index "
	       "moved back a whole ring\n",
	       sent, seg, cqprod);
	fflush(stdout);
	uint64_t deadline = now_ms() + (uint64_t)((o->hold_s ? o->hold_s : 20) * 1000);
	long closed = -1;
	while (!stop && now_ms() < deadline && closed < 0) {
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
