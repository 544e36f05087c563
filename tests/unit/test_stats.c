/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The stats table (lib/ctrl/stats_table.c) and its two readings.
 *
 * The table's rules: every counter has a JSON key and a Prometheus family,
 * or says what stands for the missing one; a family's rows are consecutive
 * and its first carries the HELP; references and sections resolve.
 *
 * The readings, on a node of two workers, two peers and one RDMA rail whose
 * counters all differ: sums, maxima and per-instance values come out as
 * computed here from the structs, and every row reads the same in the JSON
 * ("status", "stats") as in the Prometheus text.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kvp_test.h"
#include "ctrl_priv.h"

static struct kvp_node node;
static const struct kvp_transport_ops ops = { .name = "tcp" };
static struct kvp_mr_stats mr;
#define MAX_PEERS 4 /* limits.max_peers: two slots in use, two free */
static char text[4u << 20];
static struct kvp_peer peers[MAX_PEERS];
static struct kvp_peer_stats peer_stats[2][MAX_PEERS];
static struct kvp_worker_peer wpeers[2][MAX_PEERS];

static int
no_pause(unsigned rail, bool pause)
{
	(void)rail;
	(void)pause;
	return 0;
}

static const struct stat_row *
row_of(const char *sect, const char *key)
{
	for (unsigned k = 0; k < stat_nrows; k++)
		if (strcmp(stat_rows[k].sect, sect) == 0 && stat_rows[k].key &&
		    strcmp(stat_rows[k].key, key) == 0)
			return &stat_rows[k];
	return NULL;
}

static bool
is_section(const char *name)
{
	for (unsigned k = 0; k < stat_nrows; k++)
		if (strcmp(stat_rows[k].sect, name) == 0)
			return true;
	return false;
}

static void
table_rules(void)
{
	for (unsigned k = 0; k < stat_nrows; k++) {
		const struct stat_row *r = &stat_rows[k];

		if (r->kind == SK_VALUE) {
			if (!(r->key || r->derived) || !(r->prom || r->derived))
				fprintf(stderr, "row %u (%s.%s): no JSON key or family, and no "
					"derived\n", k, r->sect, r->key ? r->key : r->prom);
			CHECK(r->key || r->derived);
			CHECK(r->prom || r->derived);
			CHECK(!r->prom || strncmp(r->prom, "kvproxy_", 8) == 0);
		}
		if (r->kind == SK_REF)
			CHECK(r->key && row_of(r->ref, r->key) != NULL);
		if (r->kind == SK_SUB)
			CHECK(r->key && is_section(r->key));
		if (r->kind == SK_JSON)
			CHECK(r->json != NULL);
		if (r->src == SS_FN && r->kind == SK_VALUE)
			CHECK(r->fn != NULL);
		if (r->src == SS_NODE && r->kind == SK_VALUE)
			CHECK(r->size == 1 || r->size == 2 || r->size == 4 || r->size == 8);
		if (r->key)
			CHECK(row_of(r->sect, r->key) == r); /* one row per key of a section */
		if (!r->prom || r->kind != SK_VALUE)
			continue;
		/* A family: consecutive rows, HELP on the first, one type. */
		bool first = true;
		for (unsigned j = 0; j < k; j++)
			if (stat_rows[j].prom && strcmp(stat_rows[j].prom, r->prom) == 0) {
				first = false;
				CHECK(j == k - 1 || (stat_rows[j + 1].prom &&
						     strcmp(stat_rows[j + 1].prom, r->prom) == 0));
				CHECK(stat_rows[j].gauge == r->gauge);
			}
		if (first)
			CHECK(r->help != NULL);
		/* Counters end in _total, as Prometheus names them. */
		size_t l = strlen(r->prom);
		if (!r->gauge)
			CHECK(l > 6 && strcmp(r->prom + l - 6, "_total") == 0);
	}
}

/* Distinct values in every counter of the workers, peers, the node and the registrations. */
static void
fill(void)
{
	uint64_t v = 1;

	for (unsigned w = 0; w < node.nworkers; w++) {
		uint64_t *p = (uint64_t *)&node.workers[w].stats;

		for (size_t i = 0; i < sizeof(struct kvp_worker_stats) / 8; i++)
			if (i * 8 != offsetof(struct kvp_worker_stats, peer))
				p[i] = v++ * 3;
		/* The free slots too: a free slot's rows must not show, whatever they hold. */
		for (unsigned k = 0; k < MAX_PEERS; k++) {
			uint64_t *q = (uint64_t *)&node.workers[w].stats.peer[k];

			for (size_t i = 0; i < sizeof(struct kvp_peer_stats) / 8; i++)
				q[i] = v++ * 3;
		}
	}
	for (unsigned i = 0; i < MAX_PEERS; i++) {
		node.peers[i].connects = v++;
		node.peers[i].disconnects = v++;
		node.peers[i].handshake_failures = v++;
	}
	node.bad_handshakes = v++;
	node.auth_failures = v++;
	node.clients_refused_cred = v++;
	node.clients_refused_limit = v++;
	node.clients_refused_fds = v++;
	node.client_handshake_failures = v++;
	node.ring_violations = v++;
	node.client_accept_pauses = v++;
	node.worker_clients[0] = (uint32_t)v++;
	node.worker_clients[1] = (uint32_t)v++;
	node.admin_stats = (struct kvp_admin_stats){ v, v + 1, v + 2, v + 3, v + 4, v + 5 };
	mr = (struct kvp_mr_stats){ .regs = 11, .failures = 12, .dmabuf = 13, .peermem = 14,
				    .deregs = 15, .reg_ns = 1600000, .reg_max_ns = 17000 };
}

/* The value of the Prometheus series @p name whose labels hold @p l1 and @p l2. */
static bool
prom_value(const char *name, const char *l1, const char *l2, double *out)
{
	size_t nl = strlen(name);

	for (const char *p = text; *p;) {
		const char *e = strchr(p, '\n');
		size_t len = e ? (size_t)(e - p) : strlen(p);

		if (strncmp(p, name, nl) == 0 && p[nl] == '{') {
			char line[512];

			snprintf(line, sizeof(line), "%.*s", (int)len, p);
			char *sp = strrchr(line, ' ');
			if (sp && (!l1 || strstr(line, l1)) && (!l2 || strstr(line, l2))) {
				*out = strtod(sp + 1, NULL);
				return true;
			}
		}
		p += len + (e != NULL);
	}
	return false;
}

static double
json_num(json_t *v)
{
	if (json_is_boolean(v))
		return json_is_true(v);
	return json_number_value(v);
}

/* Where a section's objects are in the replies. */
static json_t *
sect_obj(json_t *status, json_t *stats, const char *sect, unsigned i)
{
	if (strcmp(sect, "status") == 0)
		return status;
	if (strcmp(sect, "") == 0)
		return stats;
	if (strcmp(sect, "peers") == 0 || strcmp(sect, "workers") == 0 ||
	    strcmp(sect, "clients") == 0)
		return json_array_get(json_object_get(stats, sect), i);
	if (strcmp(sect, "rails") == 0)
		return json_array_get(json_object_get(json_object_get(stats, "rdma"), "rails"), i);
	if (strcmp(sect, "registrations") == 0)
		return json_object_get(json_object_get(stats, "rdma"), sect);
	return json_object_get(stats, sect);
}

/* Every row with both forms reads the same in each. */
static void
both_forms_agree(json_t *status, json_t *stats)
{
	static const char *const peer_l[] = { "peer=\"p0\"", "peer=\"p1\"" };
	static const char *const worker_l[] = { "lcore=\"3\"", "lcore=\"5\"" };
	static const char *const client_l[] = { "client=\"65536\"", "client=\"65538\"" };

	for (unsigned k = 0; k < stat_nrows; k++) {
		const struct stat_row *r = &stat_rows[k];
		unsigned ninst = 1;
		const char *const *inst_l = NULL;

		if (r->kind != SK_VALUE || !r->key || !r->prom)
			continue;
		if (strcmp(r->sect, "peers") == 0)
			ninst = 2, inst_l = peer_l;
		else if (strcmp(r->sect, "workers") == 0)
			ninst = 2, inst_l = worker_l;
		else if (strcmp(r->sect, "clients") == 0)
			ninst = 2, inst_l = client_l;
		for (unsigned i = 0; i < ninst; i++) {
			json_t *o = sect_obj(status, stats, r->sect, i);
			json_t *v = json_object_get(o, r->key);
			const char *il = inst_l ? inst_l[i] : NULL;
			double scale = r->unit == SU_NS ? 1e9 : r->unit == SU_NS_MS ? 1e3 : 1;
			double pv;

			if (!v) {
				fprintf(stderr, "%s.%s: not in the JSON\n", r->sect, r->key);
				kvp_test_failures++;
				continue;
			}
			if (r->vec != SV_NONE) {
				/* Each element is a series of its own. */
				size_t n = json_is_array(v) ? json_array_size(v) : json_object_size(v);
				CHECK(n > 0 || r->vec == SV_WC);
				const char *ek;
				json_t *ev;
				if (json_is_object(v)) {
					json_object_foreach(v, ek, ev) {
						char sl[64];

						snprintf(sl, sizeof(sl), "status=\"%s\"", ek);
						CHECK(prom_value(r->prom, sl, il, &pv));
						CHECK_EQ(pv, json_integer_value(ev));
					}
				} else {
					for (size_t e = 0; e < n; e++) {
						char ll[64];

						snprintf(ll, sizeof(ll), "link=\"%zu\"", e);
						CHECK(prom_value(r->prom, ll, il, &pv));
						CHECK_EQ(pv, json_integer_value(json_array_get(v, e)));
					}
				}
				continue;
			}
			if (!prom_value(r->prom, r->label, il, &pv)) {
				fprintf(stderr, "%s: no series%s%s\n", r->prom, il ? " with " : "",
					il ? il : "");
				kvp_test_failures++;
				continue;
			}
			if (strcmp(r->key, "uptime_s") == 0)
				continue; /* a clock: read twice */
			if (fabs(json_num(v) / scale - pv) > 1e-6 * (pv > 1 ? pv : 1)) {
				fprintf(stderr, "%s.%s = %g in JSON, %s = %g\n", r->sect, r->key,
					json_num(v), r->prom, pv);
				kvp_test_failures++;
			}
		}
	}
}

/* Values computed here from the structs, one of each kind of source. */
static void
spot_checks(json_t *status, json_t *stats)
{
	const struct kvp_worker_stats *a = &node.workers[0].stats, *b = &node.workers[1].stats;
	json_t *t = json_object_get(stats, "totals");
	json_t *p1 = json_array_get(json_object_get(stats, "peers"), 1);
	json_t *w1 = json_array_get(json_object_get(stats, "workers"), 1);
	json_t *rdma = json_object_get(stats, "rdma");

	CHECK_EQ(json_integer_value(json_object_get(t, "drain_refused")),
		 a->drain_refused + b->drain_refused);
	CHECK_EQ(json_integer_value(json_object_get(t, "admin_cancels")),
		 a->admin_cancels + b->admin_cancels);
	CHECK_EQ(json_integer_value(json_object_get(t, "tx_bytes")),
		 a->peer[0].tx_bytes + a->peer[1].tx_bytes + b->peer[0].tx_bytes +
			 b->peer[1].tx_bytes);
	uint64_t done = 0;
	for (int c = 0; c < KVP_STATUS_MAX; c++)
		done += a->completions[c] + b->completions[c];
	CHECK_EQ(json_integer_value(json_object_get(t, "xfers_done")), done);
	CHECK_EQ(json_integer_value(json_object_get(t, "inflight")), 7 + 9);
	CHECK_EQ(json_integer_value(json_object_get(status, "inflight")), 7 + 9);
	CHECK_EQ(json_integer_value(json_object_get(t, "auth_failures")), node.auth_failures);
	CHECK_EQ(json_integer_value(json_object_get(json_object_get(stats, "completions"), "ok")),
		 a->completions[KVP_OK] + b->completions[KVP_OK]);
	CHECK(strcmp(json_string_value(json_object_get(p1, "node_id")), "p1") == 0);
	/* The slots in use, not limits.max_peers of them. */
	CHECK_EQ(json_array_size(json_object_get(stats, "peers")), 2);
	CHECK_EQ(json_integer_value(json_object_get(status, "peers")), 2);
	CHECK_EQ(json_integer_value(json_object_get(status, "max_peers")), MAX_PEERS);
	CHECK(!strstr(text, "peer=\"\""));
	CHECK_EQ(json_integer_value(json_object_get(p1, "rx_bytes")),
		 a->peer[1].rx_bytes + b->peer[1].rx_bytes);
	CHECK_EQ(json_integer_value(json_object_get(p1, "conn_errors")),
		 a->peer[1].conn_errors + b->peer[1].conn_errors);
	CHECK_EQ(json_integer_value(json_object_get(p1, "connects")), node.peers[1].connects);
	/* tcp.connections per worker: a peer's links are every worker's. */
	CHECK_EQ(json_array_size(json_object_get(p1, "link_tx_bytes")),
		 node.cfg.tcp_conns * node.nworkers);
	CHECK_EQ(json_integer_value(json_array_get(json_object_get(p1, "link_tx_bytes"), 1)),
		 a->peer[1].link_tx_bytes[1] + b->peer[1].link_tx_bytes[1]);
	CHECK_EQ(json_integer_value(json_object_get(w1, "lcore")), 5);
	CHECK_EQ(json_integer_value(json_object_get(w1, "busy_ns")), b->busy_ns);
	CHECK_EQ(json_integer_value(json_object_get(w1, "worker")), 1);
	CHECK_EQ(json_integer_value(json_object_get(w1, "inflight")), 9);
	CHECK_EQ(json_integer_value(json_object_get(w1, "clients")), node.worker_clients[1]);
	/*
	 * A worker's sums run over every slot: a slot is zeroed on each worker
	 * when its peer closes there, so a removed peer's bytes leave them.
	 */
	uint64_t w1_tx = 0;
	for (unsigned k = 0; k < MAX_PEERS; k++)
		w1_tx += b->peer[k].tx_bytes;
	CHECK_EQ(json_integer_value(json_object_get(w1, "tx_bytes")), w1_tx);
	CHECK_EQ(json_integer_value(json_object_get(w1, "links_up")), 2 + 1);
	CHECK_EQ(json_integer_value(json_object_get(w1, "landings_forwarded")), b->xlanded);
	double max_ms = (double)(a->fence_ns_max > b->fence_ns_max ? a->fence_ns_max
								 : b->fence_ns_max) / 1e6;
	CHECK(fabs(json_real_value(json_object_get(json_object_get(stats, "fences"), "max_ms")) -
		   max_ms) < 1e-9);
	CHECK_EQ(json_integer_value(json_object_get(json_object_get(stats, "admin"), "idle")),
		 node.admin_stats.idle);
	/* RDMA: the rail in use, its counters summed, the registrations, WC errors by name. */
	json_t *rail = json_array_get(json_object_get(rdma, "rails"), 0);
	CHECK_EQ(json_array_size(json_object_get(rdma, "rails")), 1);
	CHECK_EQ(json_integer_value(json_object_get(rail, "rail")), 2);
	CHECK(strcmp(json_string_value(json_object_get(rail, "dev")), "rxe0") == 0);
	CHECK_EQ(json_integer_value(json_object_get(rail, "tx_writes")),
		 a->rail[2].tx_wrs + b->rail[2].tx_wrs);
	CHECK(json_is_true(json_object_get(rail, "paused")));
	CHECK_EQ(json_integer_value(json_object_get(json_object_get(rdma, "registrations"), "dmabuf")),
		 13);
	CHECK_EQ(json_integer_value(json_object_get(json_object_get(rdma, "wc_errors"),
						    "retry_exc_err")),
		 a->wc_errors[12] + b->wc_errors[12]);
	double v;
	CHECK(prom_value("kvproxy_rail_paused", "rail=\"2\"", NULL, &v) && v == 1);
	CHECK(prom_value("kvproxy_rail_tx_writes_total", "dev=\"rxe0\"", NULL, &v));
	CHECK(prom_value("kvproxy_admin_cut_total", "reason=\"idle\"", NULL, &v) &&
	      v == (double)node.admin_stats.idle);
	/* Every family once: HELP and TYPE lines are not repeated. */
	for (unsigned k = 0; k < stat_nrows; k++) {
		char h[160];

		if (!stat_rows[k].prom || stat_rows[k].kind != SK_VALUE)
			continue;
		snprintf(h, sizeof(h), "# TYPE %s ", stat_rows[k].prom);
		const char *first = strstr(text, h);
		CHECK(first != NULL);
		CHECK(first && !strstr(first + 1, h));
	}
}

/* Without RDMA: "rdma" is null and no RDMA family is exported. */
static void
without_rdma(void)
{
	node.env.rail_pause = NULL;
	json_t *stats = stats_json(&node, "");
	CHECK(json_is_null(json_object_get(stats, "rdma")));
	kvp_stats_prometheus(&node, text, sizeof(text));
	CHECK(!strstr(text, "kvproxy_rdma_") && !strstr(text, "kvproxy_rail_"));
	json_decref(stats);
}

/* Clients in slots 0 and 2 (slot 1 free), their rings and admission counts all different. */
static struct kvp_client_conn clients[3];
static struct kvp_chan chans[3];

static void
clients_fill(void)
{
	static const uint32_t slots[] = { 0, 2 };

	node.clients = clients;
	for (unsigned k = 0; k < 2; k++) {
		uint32_t i = slots[k];
		size_t len = kvp_chan_size(8, 8);
		void *mem = aligned_alloc(4096, len);
		struct kvp_chan_hdr *h = mem;

		REQUIRE(mem && kvp_chan_init(mem, len, 8, 8, i | 1u << 16) == 0, "channel");
		atomic_store(&h->sq.prod, 5 + k);
		atomic_store(&h->cq.prod, 3 + k);
		atomic_store(&h->cq.cons, 1);
		atomic_store(&h->cq.overflow, 7 + k);
		chans[i] = (struct kvp_chan){ .id = i | 1u << 16, .mem = mem, .len = len,
					      .inflight = 2 + k };
		chans[i].stats = (struct kvp_chan_stats){ 100 + k, 50 + k, 10 + k };
		clients[i] = (struct kvp_client_conn){ .state = KVP_CL_ACTIVE, .id = i | 1u << 16,
						       .pid = 4000 + (int)i, .chan = &chans[i],
						       .worker = k };
	}
}

static void
clients_check(json_t *stats)
{
	json_t *arr = json_object_get(stats, "clients"), *c2 = json_array_get(arr, 1);

	CHECK_EQ(json_array_size(arr), 2);
	CHECK_EQ(json_integer_value(json_object_get(c2, "id")), 2 | 1u << 16);
	CHECK_EQ(json_integer_value(json_object_get(c2, "pid")), 4002);
	CHECK_EQ(json_integer_value(json_object_get(c2, "worker")), 1);
	CHECK_EQ(json_integer_value(json_object_get(c2, "sq_depth")), 6);
	CHECK_EQ(json_integer_value(json_object_get(c2, "cq_depth")), 3);
	CHECK_EQ(json_integer_value(json_object_get(c2, "inflight")), 3);
	CHECK_EQ(json_integer_value(json_object_get(c2, "admitted")), 101);
	CHECK_EQ(json_integer_value(json_object_get(c2, "waited")), 51);
	CHECK_EQ(json_integer_value(json_object_get(c2, "refused")), 11);
	double v;
	CHECK(prom_value("kvproxy_client_refused_total", "client=\"65538\"", "pid=\"4002\"", &v) &&
	      v == 11);
	CHECK(prom_value("kvproxy_client_refused_total", "client=\"65538\"", "worker=\"1\"", &v) &&
	      v == 11);
}

int
main(void)
{
	static struct kvp_worker workers[2];
	static struct kvp_hist hist[2][MAX_PEERS * KVP_HP_MAX];

	table_rules();

	kvp_config_defaults(&node.cfg);
	snprintf(node.cfg.node_id, sizeof(node.cfg.node_id), "unit0");
	node.cfg.max_peers = MAX_PEERS;
	node.cfg.max_clients = 3;
	node.cfg.tcp_conns = 2;
	node.peers = peers;
	node.npeers = 2;
	for (unsigned i = 0; i < 2; i++) {
		peers[i].slot_state = KVP_PS_ACTIVE;
		peers[i].origin = KVP_PEER_CONFIG;
		snprintf(peers[i].node_id, sizeof(peers[i].node_id), "p%u", i);
	}
	node.tops = &ops;
	node.start_ns = kvp_mono_ns();
	node.workers = workers;
	node.nworkers = 2;
	for (unsigned w = 0; w < 2; w++) {
		workers[w].stats.peer = peer_stats[w];
		workers[w].peers = wpeers[w];
		workers[w].npeers = MAX_PEERS;
		workers[w].hist = hist[w];
		workers[w].lcore = 3 + 2 * w;
		workers[w].nxfers = 64;
		workers[w].nfree = 64 - (7 + 2 * w);
	}
	node.env.rail_pause = no_pause;
	node.env.mr_stats = &mr;
	node.env.nrails = 2;
	node.env.rails[0] = (struct kvp_rail_info){ .dev = "eth9", .rail = -1 };
	node.env.rails[1] = (struct kvp_rail_info){ .dev = "rxe0", .port = 1, .rail = 2,
						.paused = true, .numa_node = -1 };
	fill();
	clients_fill();
	wpeers[1][1].links = 2; /* worker 1: two links to p1, one to a slot being drained */
	wpeers[1][3].links = 1;

	kvp_stats_prometheus(&node, text, sizeof(text));
	json_t *status = stats_json(&node, "status"), *stats = stats_json(&node, "");
	CHECK(json_is_object(status) && json_is_object(stats));
	both_forms_agree(status, stats);
	spot_checks(status, stats);
	clients_check(stats);
	json_decref(status);
	json_decref(stats);
	without_rdma();
	free(chans[0].mem);
	free(chans[2].mem);
	return kvp_test_result("test_stats");
}
