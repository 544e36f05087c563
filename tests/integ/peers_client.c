/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * peers_client: the clients of test_peers.sh, built on the public kvproxy.h
 * only. Every transfer fills its own range of the destination region (a
 * range is never reused within one region), with bytes derived from its
 * user id, so the receiver can check every byte of every transfer that
 * landed, whatever happened to the others.
 *
 *   dest -s SOCK --size BYTES --xfer BYTES --key-file PATH --status PATH --stop PATH
 *        register a region, publish its key, verify each landed transfer;
 *        the status file (rewritten as it goes) and the last line say
 *        "dest key K verified N bytes B mismatches M overflow O first_ns T"
 *        (T: CLOCK_MONOTONIC when the first transfer landed); ends when PATH
 *        exists, or when the daemon goes away (after its last landing notices)
 *   src -s SOCK --xfer BYTES --rate N --inflight W --stop PATH --out PATH
 *       NAME=PEER=KEYFILE=SLOTS...
 *        send to every target (PEER a node id or host:port, looked up again
 *        whenever the daemon says no-peer; KEYFILE re-read when it changes:
 *        a new region), at most N transfers per second and W in flight
 *        each, until PATH exists; then wait for every completion and write
 *        per target and region key: ok, bytes, every status seen
 *   first -s SOCK --peer PEER --key-file PATH --xfer BYTES [--admin SOCK --add ID]
 *        with --add, peer_add ID=PEER on the admin socket first; then look
 *        PEER up and send one transfer: "first ms T status S t0_ns N", T from
 *        the start (add or lookup) to its completion, N that start
 *        (CLOCK_MONOTONIC, to compare with the receiver's first_ns)
 *
 * Exit status: 0 ok, 1 a check failed, 2 usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kvp_test.h"
#include "kvproxy.h"

#define TARGETS_MAX 16
#define KEYS_MAX    8 /* regions (incarnations) per target */

static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "peers_client: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

/* user id: target (8 bits) | region incarnation (16) | sequence (40). */
static uint64_t
uid_make(unsigned target, unsigned inc, uint64_t seq)
{
	return ((uint64_t)target << 56) | ((uint64_t)(inc & 0xffff) << 40) |
	       (seq & 0xffffffffffull);
}

static uint64_t
uid_seq(uint64_t uid)
{
	return uid & 0xffffffffffull;
}

static bool
exists(const char *path)
{
	return access(path, F_OK) == 0;
}

/* Write @p text to @p path whole (a temporary file renamed over it). */
static void
publish(const char *path, const char *text)
{
	char tmp[512];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) < 0)
		die("cannot write %s: %s", path, strerror(errno));
}

struct opts {
	const char *sock, *key_file, *status, *stop, *out, *peer, *admin, *add;
	uint64_t size, xfer, rate, inflight;
	char **targets;
	int ntargets;
};

static uint64_t
num(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 0);

	if (end == s)
		die("not a number: '%s'", s);
	if (*end == 'k')
		v <<= 10;
	else if (*end == 'm')
		v <<= 20;
	return v;
}

static void
parse(int argc, char **argv, struct opts *o)
{
	memset(o, 0, sizeof(*o));
	o->rate = 100;
	o->inflight = 2;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (a[0] != '-') {
			o->targets = &argv[i];
			o->ntargets = argc - i;
			return;
		}
		if (!v)
			die("%s needs a value", a);
		i++;
		if (!strcmp(a, "-s"))
			o->sock = v;
		else if (!strcmp(a, "--key-file"))
			o->key_file = v;
		else if (!strcmp(a, "--status"))
			o->status = v;
		else if (!strcmp(a, "--stop"))
			o->stop = v;
		else if (!strcmp(a, "--out"))
			o->out = v;
		else if (!strcmp(a, "--peer"))
			o->peer = v;
		else if (!strcmp(a, "--admin"))
			o->admin = v;
		else if (!strcmp(a, "--add"))
			o->add = v;
		else if (!strcmp(a, "--size"))
			o->size = num(v);
		else if (!strcmp(a, "--xfer"))
			o->xfer = num(v);
		else if (!strcmp(a, "--rate"))
			o->rate = num(v);
		else if (!strcmp(a, "--inflight"))
			o->inflight = num(v);
		else
			die("unknown option %s", a);
	}
}

static struct kvp_client *
connect_to(const char *sock)
{
	struct kvp_client *c = NULL;
	int rc = kvp_connect(sock, 0, 0, &c);

	if (rc < 0)
		die("connect %s: %s", sock, strerror(-rc));
	return c;
}

/* ---- dest ---- */

static int
cmd_dest(const struct opts *o)
{
	if (!o->sock || !o->size || !o->xfer || !o->key_file || !o->status || !o->stop)
		die("dest: -s, --size, --xfer, --key-file, --status and --stop are required");
	struct kvp_client *c = connect_to(o->sock);
	uint64_t nslots = o->size / o->xfer, key, verified = 0, bytes = 0, bad = 0, last = 0,
		 first_ns = 0;
	void *mem;
	int fd, rc;
	char line[256];

	if (kvp_host_alloc(o->size, &fd, &mem) < 0)
		die("dest: cannot allocate %" PRIu64 " bytes", o->size);
	rc = kvp_region_register(c, fd, 0, o->size, KVP_REGION_HOST, &key);
	if (rc < 0)
		die("dest: register: %s (%s)", strerror(-rc), kvp_last_error(c));
	if (kvp_test_key_write(o->key_file, key) < 0)
		die("dest: cannot write %s", o->key_file);
	for (;;) {
		struct kvp_cqe e[64];
		int n = kvp_wait(c, e, 64, 50);
		bool gone = n == -EPIPE; /* the notices it posted came first */

		if (gone)
			n = 0;
		else if (n < 0)
			die("dest: wait: %s", strerror(-n));
		for (int i = 0; i < n; i++) {
			if (e[i].kind != KVP_CQE_LANDED)
				continue;
			if (!first_ns)
				first_ns = kvp_test_now_ns();
			uint64_t slot = uid_seq(e[i].user_id) % nslots;

			/* The bytes of a transfer are the pattern of its user id. */
			if (e[i].bytes != o->xfer || e[i].dst_key != key ||
			    kvp_test_pattern_check(e[i].user_id, 0, (uint8_t *)mem + slot * o->xfer,
						   o->xfer, NULL) != 0) {
				bad++;
				fprintf(stderr,
					"dest: transfer %" PRIx64 " (%" PRIu64
					" bytes) does not match\n",
					e[i].user_id, e[i].bytes);
			} else {
				verified++;
				bytes += e[i].bytes;
			}
		}
		uint64_t now = kvp_test_now_ns();

		if (n > 0 || gone || now - last > 100000000ull) {
			snprintf(line, sizeof(line),
				 "dest key %" PRIu64 " verified %" PRIu64 " bytes %" PRIu64
				 " mismatches %" PRIu64 " overflow %u first_ns %" PRIu64 "\n",
				 key, verified, bytes, bad, kvp_overflow(c), first_ns);
			publish(o->status, line);
			last = now;
		}
		if (gone || (n == 0 && exists(o->stop)))
			break;
	}
	printf("%s", line);
	uint32_t overflow = kvp_overflow(c);

	kvp_close(c);
	kvp_host_free(fd, mem, o->size);
	return bad == 0 && overflow == 0 ? 0 : 1;
}

/* ---- src ---- */

struct region_count {
	uint64_t key;
	uint64_t ok, bytes, submitted;
	uint64_t status[KVP_STATUS_MAX + 1];
};

struct target {
	char name[64], peer[96], key_file[256];
	uint64_t slots;
	bool have_peer;
	uint16_t handle;
	uint64_t next_lookup_ns, next_key_ns, next_submit_ns;
	struct stat key_st;
	int nkeys; /* regions seen; the last is the current one */
	struct region_count keys[KEYS_MAX];
	uint64_t seq, inflight, lookups;
	char last_why[160];
};

static struct target tg[TARGETS_MAX];
static int ntg;

/* Re-read the key file if it changed: a new region (a restarted receiver) starts at slot 0. */
static void
refresh_key(struct target *t, uint64_t now)
{
	struct stat st;
	uint64_t key = 0;

	if (now < t->next_key_ns)
		return;
	t->next_key_ns = now + 20000000ull;
	if (stat(t->key_file, &st) < 0 || (t->nkeys && st.st_ino == t->key_st.st_ino &&
					   st.st_mtim.tv_sec == t->key_st.st_mtim.tv_sec &&
					   st.st_mtim.tv_nsec == t->key_st.st_mtim.tv_nsec))
		return;
	if (kvp_test_key_read(t->key_file, 0, &key) < 0 || (t->nkeys && t->keys[t->nkeys - 1].key == key))
		return;
	if (t->nkeys == KEYS_MAX)
		die("src: %s: more than %d regions", t->name, KEYS_MAX);
	t->key_st = st;
	t->keys[t->nkeys++].key = key;
	t->seq = 0;
}

static void
lookup(struct kvp_client *c, struct target *t, uint64_t now)
{
	if (t->have_peer || now < t->next_lookup_ns)
		return;
	t->lookups++;
	int rc = kvp_peer_lookup(c, t->peer, &t->handle);

	if (rc == 0) {
		t->have_peer = true;
		return;
	}
	/* Not a peer (yet, or any more): ask again soon. */
	snprintf(t->last_why, sizeof(t->last_why), "%s (%s)", strerror(-rc), kvp_last_error(c));
	t->next_lookup_ns = now + 50000000ull;
}

static struct region_count *
region_of(struct target *t, unsigned inc)
{
	return inc < (unsigned)t->nkeys ? &t->keys[inc] : NULL;
}

static void
complete(struct kvp_cqe *e)
{
	unsigned ti = (unsigned)(e->user_id >> 56), inc = (unsigned)((e->user_id >> 40) & 0xffff);

	if (e->kind != KVP_CQE_DONE || ti >= (unsigned)ntg)
		return;
	struct target *t = &tg[ti];
	struct region_count *r = region_of(t, inc);

	t->inflight--;
	if (!r)
		die("src: completion for an unknown region");
	r->status[e->status >= 0 && e->status < KVP_STATUS_MAX ? e->status : KVP_STATUS_MAX]++;
	if (e->status == KVP_OK) {
		r->ok++;
		r->bytes += e->bytes;
	} else if (e->status == KVP_ENOPEER) {
		/* Removed or replaced: name it again (an address finds its new slot). */
		t->have_peer = false;
	} else if (e->status == KVP_EREMOTE) {
		t->next_key_ns = 0; /* the region may have gone with its receiver */
	}
}

static void
report(const struct opts *o)
{
	FILE *f = fopen(o->out, "w");

	if (!f)
		die("src: cannot write %s", o->out);
	for (int i = 0; i < ntg; i++) {
		const struct target *t = &tg[i];

		for (int k = 0; k < t->nkeys; k++) {
			const struct region_count *r = &t->keys[k];

			fprintf(f,
				"{\"name\": \"%s\", \"key\": %" PRIu64 ", \"submitted\": %" PRIu64
				", \"ok\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"status\": {",
				t->name, r->key, r->submitted, r->ok, r->bytes);
			for (int s = 0, first = 1; s <= KVP_STATUS_MAX; s++) {
				if (!r->status[s])
					continue;
				fprintf(f, "%s\"%s\": %" PRIu64, first ? "" : ", ",
					s < KVP_STATUS_MAX ? kvp_status_str(s) : "unknown",
					r->status[s]);
				first = 0;
			}
			fprintf(f, "}, \"lookups\": %" PRIu64 "}\n", t->lookups);
		}
		if (t->nkeys == 0)
			fprintf(f,
				"{\"name\": \"%s\", \"key\": 0, \"submitted\": 0, \"ok\": 0, "
				"\"bytes\": 0, \"status\": {}, \"lookups\": %" PRIu64 "}\n",
				t->name, t->lookups);
	}
	fclose(f);
}

static int
cmd_src(const struct opts *o)
{
	if (!o->sock || !o->xfer || !o->stop || !o->out || o->ntargets < 1 ||
	    o->ntargets > TARGETS_MAX)
		die("src: -s, --xfer, --stop, --out and 1..%d NAME=PEER=KEYFILE=SLOTS",
		    TARGETS_MAX);
	struct kvp_client *c = connect_to(o->sock);
	uint64_t size = o->xfer * 64, src_key, gap = 1000000000ull / (o->rate ? o->rate : 1);
	uint8_t *mem;
	int fd, rc;

	/* 64 source buffers, each filled right before its transfer goes. */
	if (kvp_host_alloc(size, &fd, (void **)&mem) < 0)
		die("src: cannot allocate");
	rc = kvp_region_register(c, fd, 0, size, KVP_REGION_HOST, &src_key);
	if (rc < 0)
		die("src: register: %s (%s)", strerror(-rc), kvp_last_error(c));
	if (o->inflight * (uint64_t)o->ntargets >= 64)
		die("src: --inflight x targets must stay under the 64 source buffers");
	for (int i = 0; i < o->ntargets; i++) {
		struct target *t = &tg[ntg++];
		char *spec = strdup(o->targets[i]), *p1, *p2, *p3;

		if (!spec || !(p1 = strchr(spec, '=')) || !(p2 = strchr(p1 + 1, '=')) ||
		    !(p3 = strchr(p2 + 1, '=')))
			die("src: target '%s': expected NAME=PEER=KEYFILE=SLOTS", o->targets[i]);
		*p1 = *p2 = *p3 = '\0';
		snprintf(t->name, sizeof(t->name), "%s", spec);
		snprintf(t->peer, sizeof(t->peer), "%s", p1 + 1);
		snprintf(t->key_file, sizeof(t->key_file), "%s", p2 + 1);
		t->slots = num(p3 + 1);
		free(spec);
	}
	uint64_t buf = 0, inflight = 0;
	bool stopping = false;
	uint64_t stop_deadline = 0;

	for (;;) {
		uint64_t now = kvp_test_now_ns();

		if (!stopping && exists(o->stop)) {
			stopping = true;
			/* Every transfer ends by its deadline (5 s): wait that and more. */
			stop_deadline = now + 30000000000ull;
		}
		inflight = 0;
		for (int i = 0; i < ntg; i++) {
			struct target *t = &tg[i];

			inflight += t->inflight;
			if (stopping)
				continue;
			refresh_key(t, now);
			lookup(c, t, now);
			while (t->have_peer && t->nkeys && t->inflight < o->inflight &&
			       t->seq < t->slots && now >= t->next_submit_ns) {
				unsigned inc = (unsigned)t->nkeys - 1;
				uint64_t uid = uid_make((unsigned)i, inc, t->seq);
				uint8_t *b = mem + (buf % 64) * o->xfer;
				struct kvp_segment seg = { src_key, (buf % 64) * o->xfer,
							   t->keys[inc].key,
							   (t->seq % t->slots) * o->xfer, o->xfer };
				struct kvp_xfer_desc x = { .user_id = uid,
							   .peer = t->handle,
							   .timeout_ns = 5000000000ull };

				/* A buffer is refilled only after 64 others: far more than in flight. */
				kvp_test_pattern_fill(uid, 0, b, o->xfer);
				rc = kvp_submit(c, &x, &seg, 1);
				if (rc == -EAGAIN)
					break;
				if (rc < 0)
					die("src: submit: %s", strerror(-rc));
				buf++;
				t->seq++;
				t->inflight++;
				t->keys[inc].submitted++;
				t->next_submit_ns =
					(t->next_submit_ns > now - gap ? t->next_submit_ns : now) +
					gap;
			}
		}
		if (stopping && inflight == 0)
			break;
		if (stopping && now > stop_deadline)
			die("src: %" PRIu64 " transfers did not complete within 30 s of the stop",
			    inflight);
		struct kvp_cqe e[64];
		int n = kvp_wait(c, e, 64, 5);

		if (n < 0)
			die("src: wait: %s", strerror(-n));
		for (int k = 0; k < n; k++)
			complete(&e[k]);
	}
	report(o);
	kvp_close(c);
	kvp_host_free(fd, mem, size);
	return 0;
}

/* ---- first: the time to the first byte landed ---- */

/* One JSON-RPC line on the admin socket; @return 0 if the reply carries a result. */
static int
admin_call(const char *path, const char *line, char *reply, size_t len)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	size_t got = 0;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    write(fd, line, strlen(line)) != (ssize_t)strlen(line))
		die("admin %s: %s", path, strerror(errno));
	while (got < len - 1) {
		ssize_t r = read(fd, reply + got, len - 1 - got);

		if (r <= 0)
			break;
		got += (size_t)r;
		if (memchr(reply, '\n', got))
			break;
	}
	reply[got] = '\0';
	close(fd);
	return strstr(reply, "\"result\"") ? 0 : -1;
}

static int
cmd_first(const struct opts *o)
{
	if (!o->sock || !o->peer || !o->key_file || !o->xfer)
		die("first: -s, --peer, --key-file and --xfer are required");
	struct kvp_client *c = connect_to(o->sock);
	uint64_t key, dst_key = 0;
	uint8_t *mem;
	int fd, rc;
	if (kvp_test_key_read(o->key_file, 10, &dst_key) < 0)
		die("first: no key in %s", o->key_file);
	if (kvp_host_alloc(o->xfer, &fd, (void **)&mem) < 0)
		die("first: cannot allocate");
	rc = kvp_region_register(c, fd, 0, o->xfer, KVP_REGION_HOST, &key);
	if (rc < 0)
		die("first: register: %s", strerror(-rc));
	kvp_test_pattern_fill(uid_make(0, 0, 0), 0, mem, o->xfer);

	uint64_t t0 = kvp_test_now_ns();
	if (o->add) {
		char line[512], reply[1024];

		snprintf(line, sizeof(line),
			 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"peer_add\",\"params\":"
			 "{\"node_id\":\"%s\",\"addr\":\"%s\"}}\n",
			 o->add, o->peer);
		if (admin_call(o->admin, line, reply, sizeof(reply)) < 0)
			die("first: peer_add: %s", reply);
	}
	uint16_t peer;

	rc = kvp_peer_lookup(c, o->add ? o->add : o->peer, &peer);
	if (rc < 0)
		die("first: lookup %s: %s (%s)", o->peer, strerror(-rc), kvp_last_error(c));
	struct kvp_segment seg = { key, 0, dst_key, 0, o->xfer };
	struct kvp_xfer_desc x = { .user_id = uid_make(0, 0, 0), .peer = peer };

	rc = kvp_submit(c, &x, &seg, 1);
	if (rc < 0)
		die("first: submit: %s", strerror(-rc));
	struct kvp_cqe e;

	do
		rc = kvp_wait(c, &e, 1, 10000);
	while (rc == 1 && e.kind != KVP_CQE_DONE);
	if (rc != 1)
		die("first: no completion within 10 s");
	double ms = (double)(kvp_test_now_ns() - t0) / 1e6;

	printf("first ms %.3f status %s t0_ns %" PRIu64 "%s%s\n", ms, kvp_status_str(e.status), t0,
	       e.status == KVP_EPEER || e.status == KVP_ENOPEER ? " why: " : "",
	       e.status == KVP_EPEER || e.status == KVP_ENOPEER ? kvp_peer_why_str(e.detail) : "");
	kvp_close(c);
	kvp_host_free(fd, mem, o->xfer);
	return e.status == KVP_OK ? 0 : 1;
}

int
main(int argc, char **argv)
{
	struct opts o;

	if (argc < 2) {
		fprintf(stderr, "usage: peers_client dest|src|first ... (see the source's head)\n");
		return 2;
	}
	parse(argc, argv, &o);
	if (!strcmp(argv[1], "dest"))
		return cmd_dest(&o);
	if (!strcmp(argv[1], "src"))
		return cmd_src(&o);
	if (!strcmp(argv[1], "first"))
		return cmd_first(&o);
	fprintf(stderr, "peers_client: unknown mode '%s'\n", argv[1]);
	return 2;
}
