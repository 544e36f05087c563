/* SPDX-License-Identifier: BSD-3-Clause */
/* Shared fuzz harness set-up: EAL, a real node, deterministic randomness. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_log.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "fuzz_common.h"

/*
 * Fuzz builds replace getrandom(): kvproxyd's region keys, handshake nonces
 * and epochs come from it, and a fuzzer cannot guess 48 random bits. The
 * daemon's own code is unchanged; only this executable's symbol wins.
 */
ssize_t
getrandom(void *buf, size_t len, unsigned int flags)
{
	(void)flags;
	memset(buf, FUZZ_RANDOM_BYTE, len);
	return (ssize_t)len;
}

static char tmpdir[64];
static bool eal_done;

bool
fuzz_verbose(void)
{
	static int v = -1;

	if (v < 0)
		v = getenv("KVP_FUZZ_VERBOSE") != NULL;
	return v;
}

void
fuzz_eal_init(void)
{
	char *argv[] = {
		"kvp-fuzz", "--no-huge",      "--no-shconf", "-m", "128",
		"--no-pci", "--no-telemetry", "-l",          "0",  "--log-level=*:error",
		NULL,
	};
	int argc = (int)(sizeof(argv) / sizeof(argv[0])) - 1;

	if (eal_done)
		return;
	/* A config or the fuzzer itself must never block on a terminal. */
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, 0);
		close(null);
	}
	if (rte_eal_init(argc, argv) < 0) {
		fprintf(stderr, "fuzz: rte_eal_init failed: %s\n", strerror(rte_errno));
		abort();
	}
	kvp_log_init();
	/* Format every log line (format bugs are bugs) but print none of them. */
	FILE *devnull = fopen("/dev/null", "w");
	if (devnull)
		rte_openlog_stream(devnull);
	rte_log_set_level_pattern("kvp.*", RTE_LOG_DEBUG);
	eal_done = true;
}

void
fuzz_config(struct kvp_config *cfg)
{
	kvp_config_defaults(cfg);
	snprintf(cfg->node_id, sizeof(cfg->node_id), "fuzz0");
	snprintf(cfg->listen_host, sizeof(cfg->listen_host), "127.0.0.1");
	cfg->listen_port = 0; /* any free port */
	cfg->max_clients = 4;
	cfg->max_regions = 8;
	cfg->max_inflight = 16;
	cfg->max_segments = 8;
	cfg->sq_entries = 64;
	cfg->cq_entries = 16;
	cfg->tcp_frame_max = 64 << 10;
	cfg->tcp_rx_buffer = 16 << 10;
	cfg->tcp_tx_frames = 16;
	cfg->tcp_send_iov = 4;
	cfg->stage_pool = 256 << 10;
	cfg->stage_buf = 16 << 10;
	cfg->npeers = 1;
	snprintf(cfg->peers[0].node_id, sizeof(cfg->peers[0].node_id), "peer0");
	snprintf(cfg->peers[0].host, sizeof(cfg->peers[0].host), "127.0.0.1");
	cfg->peers[0].port = 1;
}

static void
rm_tmpdir(void)
{
	DIR *d = opendir(tmpdir);
	struct dirent *e;
	char p[sizeof(tmpdir) + 256];

	if (!d)
		return;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", tmpdir, e->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(tmpdir);
}

void
fuzz_node_init(struct kvp_node *n, struct kvp_config *cfg, const struct kvp_transport_ops *tops)
{
	char err[256];

	fuzz_eal_init();
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvp-fuzz.XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("fuzz: mkdtemp");
		abort();
	}
	atexit(rm_tmpdir);
	snprintf(cfg->client_socket, sizeof(cfg->client_socket), "%s/client.sock", tmpdir);
	snprintf(cfg->admin_socket, sizeof(cfg->admin_socket), "%s/admin.sock", tmpdir);
	static struct kvp_node_env env;

	kvp_node_env_init(&env);
	env.tps[0] = tops;
	env.ntps = env.nworkers = 1;
	if (kvp_node_init(n, cfg, &env, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz: kvp_node_init: %s\n", err);
		abort();
	}
	/* The configured peers' slots, opened as the running worker would. */
	kvp_worker_inbox(&n->workers[0]);
	/* No new-peer wait: a transfer to a peer without links fails at once, as the models say. */
	for (uint32_t i = 0; i < n->workers[0].npeers; i++)
		n->workers[0].peers[i].wait_until_ns = 0;
}

/* ---- the stub transport: tctx is the worker itself ---- */

static int
stub_create(struct kvp_worker *wk, unsigned idx, void **tctx)
{
	(void)idx;
	*tctx = wk;
	return 0;
}

static void
stub_destroy(void *tctx)
{
	(void)tctx;
}

static int
stub_attach(void *tctx, uint16_t peer, uint8_t link, int fd, bool outgoing, uint64_t epoch)
{
	(void)tctx;
	(void)peer;
	(void)link;
	(void)fd;
	(void)outgoing;
	(void)epoch;
	return -EINVAL;
}

static int
stub_post(void *tctx, struct kvp_xfer *x)
{
	(void)tctx;
	(void)x;
	return -ENOTCONN;
}

static int
stub_progress(void *tctx)
{
	(void)tctx;
	return 0;
}

static void
stub_cancel(void *tctx, struct kvp_xfer *x, int status)
{
	kvp_worker_xfer_end(tctx, x, status);
}

static int
stub_sleep_fd(void *tctx)
{
	(void)tctx;
	return -1;
}

static void
stub_disconnect(void *tctx, uint16_t peer)
{
	(void)tctx;
	(void)peer;
}

const struct kvp_transport_ops fuzz_stub_ops = {
	.name = "tcp",
	.caps = KVP_TCAP_HOST_MEM,
	.create = stub_create,
	.destroy = stub_destroy,
	.attach = stub_attach,
	.post = stub_post,
	.progress = stub_progress,
	.cancel = stub_cancel,
	.sleep_fd = stub_sleep_fd,
	.disconnect = stub_disconnect,
};

void
fuzz_assert_reclaimed(const struct kvp_node *n, unsigned pool0)
{
	const struct kvp_worker *w = &n->workers[0];

	FUZZ_ASSERT(w->nfree == w->nxfers, "%u transfer slots leaked", w->nxfers - w->nfree);
	for (uint32_t i = 0; i < n->regions.size; i++)
		FUZZ_ASSERT(atomic_load(&n->regions.slots[i].refs) == 0,
			    "region slot %u keeps %u references", i,
			    atomic_load(&n->regions.slots[i].refs));
	FUZZ_ASSERT(rte_mempool_avail_count(n->msg_pool) == pool0, "control messages leaked");
}

void
fuzz_drain_outbox(struct kvp_node *n, unsigned w, struct fuzz_outbox *ob)
{
	void *msgs[32];
	unsigned cnt;

	while ((cnt = rte_ring_dequeue_burst(n->workers[w].outbox, msgs, 32, NULL)) > 0) {
		for (unsigned i = 0; i < cnt; i++) {
			struct kvp_msg *m = msgs[i];

			if (ob) {
				ob->conn_down += m->type == KVP_MSG_CONN_DOWN;
				ob->chan_gone += m->type == KVP_MSG_CHAN_GONE;
				ob->chan_broken += m->type == KVP_MSG_CHAN_BROKEN;
				if (m->chan)
					ob->last_chan = m->chan;
			}
			rte_mempool_put(n->msg_pool, m);
		}
	}
}

void
fuzz_send_worker(struct kvp_node *n, int type, struct kvp_chan *ch)
{
	struct kvp_msg *m = ctrl_msg(n, type);

	FUZZ_ASSERT(m != NULL, "control message pool empty (a message leaked)");
	m->chan = ch;
	FUZZ_ASSERT(ctrl_send(n, 0, m) == 0, "worker inbox full");
}

int
fuzz_lowest_fd(void)
{
	int fd = dup(0);

	if (fd >= 0)
		close(fd);
	return fd;
}

/* One control request: send (with an fd), let the node answer, receive (with fds). */
static int
ctrl_call(struct kvp_node *n, int sock, struct kvp_ctrl_req *req, int send_fd,
	  struct kvp_ctrl_rep *rep, int *fds, unsigned want_fds)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 4)];
	} u;
	struct iovec iov = { .iov_base = req, .iov_len = sizeof(*req) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	static uint64_t seq;

	req->magic = KVP_CTRL_MAGIC;
	req->abi_version = KVP_ABI_VERSION;
	req->seq = ++seq;
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
	if (sendmsg(sock, &msg, MSG_NOSIGNAL) != (ssize_t)sizeof(*req))
		return -EIO;
	for (int tries = 0; tries < 100; tries++) {
		kvp_node_poll(n, 10);
		iov = (struct iovec){ .iov_base = rep, .iov_len = sizeof(*rep) };
		msg = (struct msghdr){ .msg_iov = &iov,
				       .msg_iovlen = 1,
				       .msg_control = u.buf,
				       .msg_controllen = sizeof(u.buf) };
		ssize_t r = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (r < 0)
			continue;
		if (r != (ssize_t)sizeof(*rep))
			return -EPROTO;
		unsigned got = 0;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

			for (unsigned i = 0; i < k && got < want_fds; i++, got++)
				memcpy(&fds[got], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
		}
		if (got != want_fds)
			return -EPROTO;
		return rep->err;
	}
	return -ETIMEDOUT;
}

void
fuzz_client_open(struct kvp_node *n, struct fuzz_client *fc, size_t region_len)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int fds[3], rc;

	memset(fc, 0, sizeof(*fc));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", n->cfg.client_socket);
	fc->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	FUZZ_ASSERT(fc->sock >= 0 && connect(fc->sock, (struct sockaddr *)&sa, sizeof(sa)) == 0,
		    "connect %s", sa.sun_path);
	kvp_node_poll(n, 10); /* accept */

	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_HELLO;
	req.u.hello.pid = (int32_t)getpid();
	rc = ctrl_call(n, fc->sock, &req, -1, &rep, fds, 3);
	FUZZ_ASSERT(rc == 0, "HELLO: %d %s", rc, rep.errmsg);
	fc->id = rep.u.hello.client_id;
	fc->sq_doorbell = fds[1];
	fc->cq_notify = fds[2];
	fc->chan_len = rep.u.hello.chan_size;
	fc->chan = mmap(NULL, fc->chan_len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	close(fds[0]);
	FUZZ_ASSERT(fc->chan != MAP_FAILED, "mmap channel");
	FUZZ_ASSERT(kvp_chan_attach(fc->chan, fc->chan_len, false, &fc->sq, &fc->cq) == 0,
		    "attach channel");
	kvp_worker_inbox(&n->workers[0]); /* CHAN_ADD */

	fc->region_len = region_len;
	fc->region_fd = memfd_create("fuzz-client-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	FUZZ_ASSERT(fc->region_fd >= 0 && ftruncate(fc->region_fd, (off_t)region_len) == 0 &&
			    fcntl(fc->region_fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0,
		    "memfd");
	fc->region = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_SHARED, fc->region_fd, 0);
	FUZZ_ASSERT(fc->region != MAP_FAILED, "mmap region");
	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_REG;
	req.u.reg.len = region_len;
	req.u.reg.flags = KVP_REGION_HOST;
	rc = ctrl_call(n, fc->sock, &req, fc->region_fd, &rep, NULL, 0);
	FUZZ_ASSERT(rc == 0, "REG: %d %s", rc, rep.errmsg);
	fc->key = rep.u.reg.key;
}
