/* SPDX-License-Identifier: BSD-3-Clause */
/* Shared fuzz harness set-up: EAL, a real node, deterministic randomness. */
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>
#include <unistd.h>

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

bool
fuzz_verbose(void)
{
	static int v = -1;

	if (v < 0)
		v = getenv("KVP_FUZZ_VERBOSE") != NULL;
	return v;
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
	int rc = kvp_test_eal_init();

	if (rc < 0) {
		fprintf(stderr, "fuzz: rte_eal_init failed: %s\n", strerror(-rc));
		abort();
	}
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
	/* Each input's replies are read right after the loop ran: no helper threads. */
	env.ctrl_inline = true;
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

void
fuzz_assert_reclaimed(const struct kvp_node *n, unsigned pool0)
{
	const struct kvp_worker *w = &n->workers[0];

	REQUIRE(w->nfree == w->nxfers, "%u transfer slots leaked", w->nxfers - w->nfree);
	for (uint32_t i = 0; i < n->regions.size; i++)
		REQUIRE(atomic_load(&n->regions.slots[i].refs) == 0,
			"region slot %u keeps %u references", i,
			atomic_load(&n->regions.slots[i].refs));
	REQUIRE(rte_mempool_avail_count(n->msg_pool) == pool0, "control messages leaked");
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

	REQUIRE(m != NULL, "control message pool empty (a message leaked)");
	m->chan = ch;
	REQUIRE(ctrl_send(n, 0, m) == 0, "worker inbox full");
}

int
fuzz_lowest_fd(void)
{
	int fd = dup(0);

	if (fd >= 0)
		close(fd);
	return fd;
}

/* The node answers while the client waits: one thread plays both. */
static void
pump_node(void *arg)
{
	kvp_node_poll(arg, 10);
}

void
fuzz_client_open(struct kvp_node *n, struct fuzz_client *fc, size_t region_len)
{
	struct kvp_ctrl_rep rep;
	void *map;
	int rc;

	memset(fc, 0, sizeof(*fc));
	rc = kvp_test_conn_open(&fc->conn, n->cfg.client_socket, pump_node, n, &rep);
	REQUIRE(rc == 0, "HELLO: %d %s", rc, rep.errmsg);
	kvp_worker_inbox(&n->workers[0]); /* CHAN_ADD */

	fc->region_len = region_len;
	rc = kvp_test_memfd("fuzz-client-region", region_len, true, &fc->region_fd, &map);
	REQUIRE(rc == 0, "memfd: %d", rc);
	fc->region = map;
	rc = kvp_test_region_register(&fc->conn, fc->region_fd, region_len, KVP_REGION_HOST,
				      &fc->key, &rep);
	REQUIRE(rc == 0, "REG: %d %s", rc, rep.errmsg);
}
