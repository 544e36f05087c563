/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The stats table: every counter and gauge the node exports, once. A row
 * says where its value lives (a worker counter summed over the workers, a
 * node field, a function), where it sits in the JSON replies ("status",
 * "stats" and its sections) and its Prometheus family. stats.c walks the
 * table to build both forms, so they cannot drift apart: a row without a
 * JSON key or a Prometheus family says what that form derives from instead
 * (test_admin checks every row).
 *
 * The order of the rows is the order of the JSON keys; a Prometheus family
 * is its rows' consecutive run.
 */
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "ctrl_priv.h"

/* enum ibv_wc_status, in order (core does not link libibverbs). */
static const char *const wc_names[KVP_WC_STATUS_MAX] = {
	"success", "loc_len_err", "loc_qp_op_err", "loc_eec_op_err", "loc_prot_err",
	"wr_flush_err", "mw_bind_err", "bad_resp_err", "loc_access_err", "rem_inv_req_err",
	"rem_access_err", "rem_op_err", "retry_exc_err", "rnr_retry_exc_err", "loc_rdd_viol_err",
	"rem_inv_rd_req_err", "rem_abort_err", "inv_eecn_err", "inv_eec_state_err", "fatal_err",
	"resp_timeout_err", "general_err", "tm_err", "tm_rndv_incomplete",
};

const char *
stats_wc_name(unsigned st)
{
	return st < KVP_WC_STATUS_MAX ? wc_names[st] : "unknown";
}

const struct kvp_rail_info *
stats_rail_port(const struct kvp_node *n, unsigned rail)
{
	for (unsigned i = 0; i < n->env.nrails && i < KVP_RAILS_MAX; i++)
		if (n->env.rails[i].rail >= 0 && (unsigned)n->env.rails[i].rail == rail)
			return &n->env.rails[i];
	return NULL;
}

void
stats_hist_of(const struct kvp_node *n, uint16_t peer, int phase, struct kvp_hist *h)
{
	memset(h, 0, sizeof(*h));
	for (unsigned w = 0; w < n->nworkers; w++)
		kvp_hist_merge(h, kvp_worker_hist(&n->workers[w], peer, phase));
}

/* ---- values that are not one counter ---- */

static uint64_t
uptime_ns(const struct kvp_node *n, unsigned i)
{
	(void)i;
	return kvp_mono_ns() - n->start_ns;
}

static uint64_t
peers_up(const struct kvp_node *n, unsigned i)
{
	unsigned up = 0;

	(void)i;
	for (uint32_t p = 0; p < n->cfg.max_peers; p++)
		up += n->peers[p].slot_state == KVP_PS_ACTIVE && n->peers[p].out_up != 0;
	return up;
}

/* GPU memory this node has mapped for clients' regions (its GPU footprint beyond contexts). */
static uint64_t
gpu_region_bytes(const struct kvp_node *n, unsigned i)
{
	uint64_t sum = 0;

	(void)i;
	for (uint32_t k = 0; k < n->regions.size; k++) {
		const struct kvp_region *r = &n->regions.slots[k];

		uint32_t st = atomic_load((_Atomic uint32_t *)&r->state);

		/* A BUSY slot's fields belong to the helper mapping or unmapping it. */
		if ((st == KVP_REGION_ACTIVE || st == KVP_REGION_DEAD) &&
		    (r->flags & KVP_REGION_F_GPU))
			sum += r->len;
	}
	return sum;
}

static uint64_t
ngpus(const struct kvp_node *n, unsigned i)
{
	(void)i;
	return n->env.ngpus > 0 ? (uint64_t)n->env.ngpus : 0;
}

static uint64_t
xfers_done(const struct kvp_node *n, unsigned i)
{
	uint64_t sum = 0;

	(void)i;
	for (unsigned w = 0; w < n->nworkers; w++)
		for (int c = 0; c < KVP_STATUS_MAX; c++)
			sum += KVP_STAT_READ(n->workers[w].stats.completions[c]);
	return sum;
}

static uint64_t
inflight(const struct kvp_node *n, unsigned i)
{
	uint64_t sum = 0;

	(void)i;
	for (unsigned w = 0; w < n->nworkers; w++)
		sum += n->workers[w].nxfers - __atomic_load_n(&n->workers[w].nfree, __ATOMIC_RELAXED);
	return sum;
}

static uint64_t
inflight_max(const struct kvp_node *n, unsigned i)
{
	(void)i;
	return (uint64_t)n->cfg.max_inflight * n->nworkers;
}

static uint64_t
fences_held(const struct kvp_node *n, unsigned i)
{
	uint64_t sum = 0;

	(void)i;
	/* Each worker's own clients' fences (the mirrors other workers hold are copies). */
	for (unsigned w = 0; w < n->nworkers; w++)
		sum += __atomic_load_n(&n->workers[w].nfences_own, __ATOMIC_RELAXED);
	return sum;
}

/* ---- per worker ---- */

static uint64_t
worker_clients(const struct kvp_node *n, unsigned i)
{
	return n->worker_clients[i];
}

static uint64_t
worker_inflight(const struct kvp_node *n, unsigned i)
{
	const struct kvp_worker *w = &n->workers[i];

	return w->nxfers - __atomic_load_n(&w->nfree, __ATOMIC_RELAXED);
}

/* Outgoing TCP links up on the worker, over all peers. */
static uint64_t
worker_links(const struct kvp_node *n, unsigned i)
{
	uint64_t sum = 0;

	/* Every slot: a free one holds none. */
	for (uint32_t p = 0; p < n->workers[i].npeers; p++)
		sum += __atomic_load_n(&n->workers[i].peers[p].links, __ATOMIC_RELAXED);
	return sum;
}

uint64_t
stats_worker_peer_sum(const struct kvp_node *n, unsigned i, size_t off)
{
	uint64_t sum = 0;

	/* Every slot: a closed peer's rows were zeroed (a removed peer's bytes leave the sum). */
	for (uint32_t p = 0; p < n->workers[i].npeers; p++)
		sum += __atomic_load_n((const uint64_t *)((const char *)&n->workers[i].stats.peer[p] +
							   off),
				       __ATOMIC_RELAXED);
	return sum;
}

static uint64_t
worker_tx_bytes(const struct kvp_node *n, unsigned i)
{
	return stats_worker_peer_sum(n, i, offsetof(struct kvp_peer_stats, tx_bytes));
}

static uint64_t
worker_rx_bytes(const struct kvp_node *n, unsigned i)
{
	return stats_worker_peer_sum(n, i, offsetof(struct kvp_peer_stats, rx_bytes));
}

static uint64_t
admin_open(const struct kvp_node *n, unsigned i)
{
	(void)i;
	return kvp_admin_open(n);
}

static uint64_t
peer_up(const struct kvp_node *n, unsigned i)
{
	return n->peers[i].out_up != 0;
}

static uint64_t
peer_links_up(const struct kvp_node *n, unsigned i)
{
	return (uint64_t)__builtin_popcountll(n->peers[i].out_up);
}

static uint64_t
rail_paused(const struct kvp_node *n, unsigned i)
{
	const struct kvp_rail_info *p = stats_rail_port(n, i);

	return p && p->paused;
}

/* ---- JSON members that are not counters ---- */

static json_t *
status_ident(const struct kvp_node *n, unsigned i)
{
	(void)i;
	return json_pack("{s:s, s:s, s:i}", "node_id", n->cfg.node_id, "version", KVP_VERSION, "pid",
			 (int)getpid());
}

static json_t *
transport(const struct kvp_node *n, unsigned i)
{
	(void)i;
	return json_string(n->tops->name);
}

static json_t *
node_id(const struct kvp_node *n, unsigned i)
{
	(void)i;
	return json_string(n->cfg.node_id);
}

static json_t *
peer_ident(const struct kvp_node *n, unsigned i)
{
	return json_pack("{s:s, s:i, s:s, s:s}", "node_id", peer_label(n, i), "index",
			 (int)peer_handle(n, i), "state", kvp_peer_state_name(n, (uint16_t)i),
			 "origin", peer_origin_name(n->peers[i].origin));
}

static json_t *
worker_ident(const struct kvp_node *n, unsigned i)
{
	return json_pack("{s:i, s:i}", "worker", (int)i, "lcore", (int)n->workers[i].lcore);
}

static json_t *
rail_ident(const struct kvp_node *n, unsigned i)
{
	const struct kvp_rail_info *p = stats_rail_port(n, i);

	return json_pack("{s:i, s:s, s:i, s:i, s:i, s:s, s:i}", "rail", (int)i, "dev", p->dev,
			 "port", p->port, "gid_index", p->gid_index, "mtu", p->mtu, "pci", p->pci,
			 "numa_node", p->numa_node);
}

static json_t *
mr_last_error(const struct kvp_node *n, unsigned i)
{
	(void)i;
	return json_string(n->env.mr_stats ? n->env.mr_stats->last_error : "");
}

/* ---- each client: its rings, what it has queued and what waits for it ---- */

const struct kvp_chan *
stats_client_chan(const struct kvp_node *n, unsigned slot)
{
	const struct kvp_client_conn *c;

	if (!n->clients || slot >= n->cfg.max_clients)
		return NULL;
	c = &n->clients[slot];
	return c->state == KVP_CL_ACTIVE ? c->chan : NULL;
}

static struct kvp_chan_hdr *
client_hdr(const struct kvp_node *n, unsigned i)
{
	const struct kvp_chan *ch = stats_client_chan(n, i);

	return ch ? ch->mem : NULL;
}

static json_t *
client_ident(const struct kvp_node *n, unsigned i)
{
	return json_pack("{s:I, s:i, s:i}", "id", (json_int_t)n->clients[i].id, "pid",
			 (int)n->clients[i].pid, "worker", (int)n->clients[i].worker);
}

static uint64_t
client_sq_depth(const struct kvp_node *n, unsigned i)
{
	struct kvp_chan_hdr *h = client_hdr(n, i);

	return h ? (uint32_t)(atomic_load_explicit(&h->sq.prod, memory_order_relaxed) -
			      atomic_load_explicit(&h->sq.cons, memory_order_relaxed))
		 : 0;
}

static uint64_t
client_cq_depth(const struct kvp_node *n, unsigned i)
{
	struct kvp_chan_hdr *h = client_hdr(n, i);

	return h ? (uint32_t)(atomic_load_explicit(&h->cq.prod, memory_order_relaxed) -
			      atomic_load_explicit(&h->cq.cons, memory_order_relaxed))
		 : 0;
}

static uint64_t
client_inflight(const struct kvp_node *n, unsigned i)
{
	const struct kvp_chan *ch = stats_client_chan(n, i);

	return ch ? __atomic_load_n(&ch->inflight, __ATOMIC_RELAXED) : 0;
}

static uint64_t
client_regions(const struct kvp_node *n, unsigned i)
{
	return kvp_region_count(&n->regions, n->clients[i].id);
}

static uint64_t
client_cq_overflow(const struct kvp_node *n, unsigned i)
{
	struct kvp_chan_hdr *h = client_hdr(n, i);

	return h ? atomic_load_explicit(&h->cq.overflow, memory_order_relaxed) : 0;
}

/* Phase latency summaries (microseconds) of every (peer, phase) with observations. */
static json_t *
latency_json(const struct kvp_node *n, unsigned i)
{
	json_t *arr = json_array();
	struct kvp_hist h;

	(void)i;
	for (uint16_t p = 0; p < n->cfg.max_peers; p++) {
		if (!peer_live(n, p))
			continue;
		for (int ph = 0; ph < KVP_HP_MAX; ph++) {
			stats_hist_of(n, p, ph, &h);
			uint64_t cnt = kvp_hist_count(&h);

			if (cnt == 0)
				continue;
			json_array_append_new(
				arr,
				json_pack("{s:s, s:s, s:s, s:I, s:f, s:f, s:f, s:f}", "peer",
					  peer_label(n, p), "direction",
					  ph < KVP_HP_TX_MAX ? "send" : "receive", "phase",
					  kvp_hphase_name(ph), "count", (json_int_t)cnt, "mean_us",
					  (double)h.sum_ns / (double)cnt / 1e3, "p50_us",
					  (double)kvp_hist_quantile(&h, 0.5) / 1e3, "p99_us",
					  (double)kvp_hist_quantile(&h, 0.99) / 1e3, "sum_us",
					  (double)h.sum_ns / 1e3));
		}
	}
	return arr;
}

/* ---- the rows ---- */

#define W(f)  .src = SS_WORKERS, .off = offsetof(struct kvp_worker_stats, f)
#define WMAX(f) .src = SS_WORKERS_MAX, .off = offsetof(struct kvp_worker_stats, f)
#define W1(f) .src = SS_WORKER, .off = offsetof(struct kvp_worker_stats, f)
#define PALL(f) .src = SS_PEERS, .off = offsetof(struct kvp_peer_stats, f)
#define P(f)  .src = SS_PEER_STATS, .off = offsetof(struct kvp_peer_stats, f)
#define PN(f) .src = SS_PEER, .off = offsetof(struct kvp_peer, f)
#define R(f)  .src = SS_RAIL_STATS, .off = offsetof(struct kvp_rail_stats, f)
#define N(f)  .src = SS_NODE, .off = offsetof(struct kvp_node, f), .size = sizeof(((struct kvp_node *)0)->f)
#define MR(f) .src = SS_MR, .off = offsetof(struct kvp_mr_stats, f)
#define CH(f) .src = SS_CHAN, .off = offsetof(struct kvp_chan_stats, f)
#define FN(f) .src = SS_FN, .fn = f
#define G     .gauge = true
#define JSON(f) .kind = SK_JSON, .json = f
#define SUB   .kind = SK_SUB
#define REF(s) .kind = SK_REF, .ref = s

const struct stat_row stat_rows[] = {
	/* "status" */
	{ "status", NULL, JSON(status_ident) },
	{ "status", "uptime_s", "kvproxy_uptime_seconds", FN(uptime_ns), G, .unit = SU_NS_S,
	  .help = "Seconds since kvproxyd started." },
	{ "status", "transport", JSON(transport) },
	{ "status", "workers", "kvproxy_workers", N(nworkers), G, .help = "Worker lcores." },
	{ "status", "clients", "kvproxy_clients", N(nclients), G, .help = "Connected clients." },
	{ "status", "regions", "kvproxy_regions", N(regions.used), G, .help = "Registered regions." },
	{ "status", "registering", "kvproxy_regions_registering", N(registering), G,
	  .help = "Region registrations under way (mapping, GPU import, RDMA registration run on "
		  "helper threads, off the control loop)." },
	{ "status", "inflight", REF("totals") },
	{ "status", "peers", "kvproxy_peers", N(npeers), G,
	  .help = "Peers in the table (configured, added, on demand, inbound; draining ones too)." },
	{ "status", "max_peers", "kvproxy_peers_max", N(cfg.max_peers), G,
	  .help = "Peer slots (limits.max_peers)." },
	{ "status", "peers_up", FN(peers_up), .derived = "the count of kvproxy_peer_up at 1" },
	{ "status", "draining", "kvproxy_draining", N(draining), G, .unit = SU_BOOL,
	  .help = "1 while the node refuses new submissions (drain)." },
	{ "status", "stats_enabled", "kvproxy_stats_enabled", N(cfg.stats_enabled), G,
	  .unit = SU_BOOL, .help = "1 if phase histograms are collected (stats.enabled)." },
	{ "status", "gpu_region_bytes", "kvproxy_gpu_region_bytes", FN(gpu_region_bytes), G,
	  .help = "GPU memory mapped for clients' regions." },
	{ "status", "gpus", "kvproxy_gpus", FN(ngpus), G,
	  .help = "GPUs the CUDA driver offers (0 without one)." },

	/* "stats" */
	{ "", "node_id", JSON(node_id) },
	{ "", "uptime_s", REF("status") },
	{ "", "transport", REF("status") },
	{ "", "totals", SUB },
	{ "", "completions", "kvproxy_completions_total", W(completions), .vec = SV_STATUS,
	  .help = "Transfers ended on this node, by status." },
	{ "", "staging", SUB },
	{ "", "peers", SUB },
	{ "", "clients", SUB },
	{ "", "workers", SUB },
	{ "", "regions", REF("status") },
	{ "", "latency", JSON(latency_json) },
	{ "", "clients_refused", SUB },
	{ "", "admin", SUB },
	{ "", "rdma", SUB },
	{ "", "fences", SUB },

	{ "totals", "drain_refused", "kvproxy_drain_refused_total", W(drain_refused),
	  .help = "Submissions refused with status shutdown while draining." },
	{ "totals", "deadline_misses", "kvproxy_deadline_misses_total", W(deadline_misses),
	  .help = "Transfers that ended after their deadline." },
	{ "totals", "tx_bytes", PALL(tx_bytes), .derived = "the sum of kvproxy_peer_tx_bytes_total" },
	{ "totals", "rx_bytes", PALL(rx_bytes), .derived = "the sum of kvproxy_peer_rx_bytes_total" },
	{ "totals", "xfers_submitted", "kvproxy_transfers_submitted_total", W(xfers_submitted),
	  .help = "Transfers picked up from clients." },
	{ "totals", "xfers_done", FN(xfers_done), .derived = "the sum of kvproxy_completions_total" },
	{ "totals", "xfers_landed", "kvproxy_transfers_landed_total", W(xfers_landed),
	  .help = "Transfers landed into local regions." },
	{ "totals", "frames_tx", PALL(tx_frames),
	  .derived = "the sum of kvproxy_peer_tx_frames_total" },
	{ "totals", "frames_rx", PALL(rx_frames),
	  .derived = "the sum of kvproxy_peer_rx_frames_total" },
	{ "totals", "inflight", "kvproxy_transfers_inflight", FN(inflight), G,
	  .help = "Transfers in flight." },
	{ "totals", "bad_handshakes", "kvproxy_bad_handshakes_total", N(bad_handshakes),
	  .help = "Peer handshakes refused or failed." },
	{ "totals", "auth_failures", "kvproxy_auth_failures_total", N(auth_failures),
	  .help = "Peers refused for failed authentication." },
	{ "totals", "peers_refused_full", "kvproxy_peers_refused_full_total", N(peers_refused_full),
	  .help = "Peers not taken (added, named by address, connecting): every slot was in use." },
	{ "totals", "peers_forgotten", "kvproxy_peers_forgotten_total", N(peers_forgotten),
	  .help = "On-demand and inbound peers removed after timeouts.peer_forget_ms without a link." },
	{ "totals", "inflight_hwm", "kvproxy_transfers_inflight_high_water", W(inflight_hwm), G,
	  .help = "Most transfer slots in use at once." },
	{ "totals", "inflight_max", "kvproxy_transfers_inflight_max", FN(inflight_max), G,
	  .help = "Transfer slots (limits.max_inflight)." },
	{ "totals", "client_handshake_failures", "kvproxy_client_handshake_failures_total",
	  N(client_handshake_failures),
	  .help = "Client HELLOs refused (protocol, ring sizes, resources) or not sent in time." },
	{ "totals", "ring_violations", "kvproxy_ring_violations_total", N(ring_violations),
	  .help = "Clients disconnected for breaking the shared-ring protocol." },
	{ "totals", "admin_cancels", "kvproxy_admin_cancels_total", W(admin_cancels),
	  .help = "Transfers canceled through the admin socket (cancel)." },
	{ "totals", "control_loop_max_ms", "kvproxy_control_loop_pass_seconds_max", N(loop_max_ns),
	  G, .unit = SU_NS_MS,
	  .help = "Longest pass of the main lcore's event loop (its callbacks and timers): how "
		  "long admin replies and client and peer handshakes may have waited." },

	{ "staging", "buffers", "kvproxy_staging_buffers", W(stage_bufs), G,
	  .help = "Staging buffers in the pool." },
	{ "staging", "buffer_bytes", "kvproxy_staging_buffer_bytes", N(cfg.stage_buf), G,
	  .help = "Bytes of one staging buffer (stage.buffer)." },
	{ "staging", "in_use", "kvproxy_staging_buffers_in_use", W(stage_used), G,
	  .help = "Staging buffers held by transfers." },
	{ "staging", "high_water", "kvproxy_staging_buffers_high_water", W(stage_hwm), G,
	  .help = "Most staging buffers in use at once." },
	{ "staging", "waits", "kvproxy_staging_waits_total", W(stage_waits),
	  .help = "Times a frame waited for a staging buffer." },
	{ "staging", "host", "kvproxy_staging_host", N(cfg.stage_host), G, .unit = SU_BOOL,
	  .help = "1 if host memory is staged too (stage.host)." },
	{ "staging", "registered_buffers", "kvproxy_staging_registered_buffers", W(fixed_bufs), G,
	  .help = "Staging buffers registered with io_uring (0: plain recv and send)." },

	{ "peers", NULL, JSON(peer_ident) },
	{ "peers", "tx_bytes", "kvproxy_peer_tx_bytes_total", P(tx_bytes),
	  .help = "Payload bytes sent to the peer." },
	{ "peers", "rx_bytes", "kvproxy_peer_rx_bytes_total", P(rx_bytes),
	  .help = "Payload bytes received from the peer." },
	{ "peers", "tx_xfers", "kvproxy_peer_tx_transfers_total", P(tx_xfers),
	  .help = "Transfers sent to the peer and acknowledged." },
	{ "peers", "rx_xfers", "kvproxy_peer_rx_transfers_total", P(rx_xfers),
	  .help = "Transfers from the peer landed here." },
	{ "peers", "tx_frames", "kvproxy_peer_tx_frames_total", P(tx_frames),
	  .help = "Wire frames sent to the peer." },
	{ "peers", "rx_frames", "kvproxy_peer_rx_frames_total", P(rx_frames),
	  .help = "Wire frames received from the peer." },
	{ "peers", "connects", "kvproxy_peer_connects_total", PN(connects), .flags = SF_SHORT,
	  .help = "Outgoing links to the peer that completed the handshake." },
	{ "peers", "disconnects", "kvproxy_peer_disconnects_total", PN(disconnects),
	  .flags = SF_SHORT, .help = "Outgoing links to the peer lost." },
	{ "peers", "bad_frames", "kvproxy_peer_bad_frames_total", P(bad_frames),
	  .help = "Malformed frames received from the peer." },
	{ "peers", "tcp_retransmits", "kvproxy_peer_tcp_retransmits_total", P(tcp_retrans),
	  .help = "TCP segments the kernel retransmitted on connections to the peer." },
	{ "peers", "tcp_zerocopy_bytes", "kvproxy_peer_tcp_zerocopy_bytes_total", P(tcp_zc_bytes),
	  .help = "Bytes (frames and payloads) handed to the kernel by zero-copy sends "
		  "(tcp.zerocopy; 0 when off or the kernel has no SENDMSG_ZC)." },
	{ "peers", "tcp_zerocopy_copied_bytes", "kvproxy_peer_tcp_zerocopy_copied_bytes_total",
	  P(tcp_zc_copied),
	  .help = "Of those, bytes the kernel reported copied after all (local delivery: "
		  "loopback, veth; a NIC without scatter-gather): zero-copy gains nothing there. "
		  "Linux 6.2+; advisory (6.10+ may report a small send merged into the previous "
		  "one as copied)." },
	{ "peers", "links_up", "kvproxy_peer_links_up", FN(peer_links_up), G, .flags = SF_SHORT,
	  .help = "Outgoing TCP connections to the peer that are up." },
	{ "peers", "link_tx_bytes", "kvproxy_peer_link_tx_bytes_total", P(link_tx_bytes),
	  .vec = SV_LINK, .flags = SF_SHORT,
	  .help = "Payload bytes sent to the peer per TCP connection (link)." },
	{ "peers", "conn_errors", "kvproxy_peer_connection_errors_total", P(conn_errors),
	  .help = "Connections to or from the peer lost." },
	{ "peers", "handshake_failures", "kvproxy_peer_handshake_failures_total",
	  PN(handshake_failures), .flags = SF_SHORT,
	  .help = "Outgoing handshakes with the peer that failed." },
	{ "peers", NULL, "kvproxy_peer_up", FN(peer_up), G, .flags = SF_SHORT,
	  .derived = "\"state\": \"up\"", .help = "1 if an outgoing connection to the peer is up." },

	{ "clients", NULL, JSON(client_ident) },
	{ "clients", "sq_depth", "kvproxy_client_sq_depth", FN(client_sq_depth), G,
	  .help = "Submission ring entries the client published and kvproxyd has not taken." },
	{ "clients", "cq_depth", "kvproxy_client_cq_depth", FN(client_cq_depth), G,
	  .help = "Completions waiting for the client to read them." },
	{ "clients", "inflight", "kvproxy_client_transfers_inflight", FN(client_inflight), G,
	  .help = "The client's transfers in flight." },
	{ "clients", "regions", "kvproxy_client_regions", FN(client_regions), G,
	  .help = "The client's registered regions." },
	{ "clients", "cq_overflow", "kvproxy_client_cq_overflow_total", FN(client_cq_overflow),
	  .help = "Landing notices dropped because the client's completion ring was full." },
	{ "clients", "admitted", "kvproxy_client_admitted_total", CH(admitted),
	  .help = "The client's transfers given a transfer slot." },
	{ "clients", "waited", "kvproxy_client_waited_total", CH(waited),
	  .help = "The client's transfers that waited for a transfer slot or a staging buffer "
		  "(the worker's clients take turns for both)." },
	{ "clients", "refused", "kvproxy_client_refused_total", CH(refused),
	  .help = "The client's transfers refused with no-buffers after timeouts.admission_ms." },

	{ "workers", NULL, JSON(worker_ident) },
	{ "workers", "loops", "kvproxy_worker_loops_total", W1(loops),
	  .help = "Passes of the worker loop." },
	{ "workers", "busy_ns", "kvproxy_worker_busy_seconds_total", W1(busy_ns), .unit = SU_NS,
	  .help = "Time worker loops found work." },
	{ "workers", "idle_ns", "kvproxy_worker_idle_seconds_total", W1(idle_ns), .unit = SU_NS,
	  .help = "Time worker loops found none." },
	{ "workers", "sleeps", "kvproxy_worker_sleeps_total", W1(sleeps),
	  .help = "Times a worker blocked when idle." },
	{ "workers", "idle_spin_ns", "kvproxy_worker_idle_spin_seconds", W1(idle_spin_ns), G,
	  .unit = SU_NS,
	  .help = "How long the worker now polls when idle before it blocks: poll.idle_us, or "
		  "twice the recent wait for work up to poll.idle_max_us." },
	{ "workers", "clients", "kvproxy_worker_clients", FN(worker_clients), G,
	  .help = "Clients the worker owns (their transfers, completions and fences)." },
	{ "workers", "inflight", "kvproxy_worker_transfers_inflight", FN(worker_inflight), G,
	  .help = "Transfers in flight on the worker." },
	{ "workers", "links_up", "kvproxy_worker_links_up", FN(worker_links), G,
	  .help = "Outgoing TCP links the worker holds, over all peers." },
	{ "workers", "xfers_submitted", "kvproxy_worker_transfers_submitted_total",
	  W1(xfers_submitted), .help = "Transfers the worker picked up from its clients." },
	{ "workers", "xfers_landed", "kvproxy_worker_transfers_landed_total", W1(xfers_landed),
	  .help = "Transfers landed through the worker's links." },
	{ "workers", "tx_bytes", "kvproxy_worker_tx_bytes_total", FN(worker_tx_bytes),
	  .help = "Payload bytes the worker sent, over all peers (a removed peer's leave the sum)." },
	{ "workers", "rx_bytes", "kvproxy_worker_rx_bytes_total", FN(worker_rx_bytes),
	  .help = "Payload bytes received through the worker's links, over all peers (a removed "
		  "peer's leave the sum)." },
	{ "workers", "landings_forwarded", "kvproxy_worker_landings_forwarded_total", W1(xlanded),
	  .help = "Landing notices the worker handed to the worker owning the client." },
	{ "workers", "messages_lost", "kvproxy_worker_messages_lost_total", W1(xmsg_lost),
	  .help = "Messages to another worker lost because its ring was full." },

	{ "clients_refused", "credentials", "kvproxy_clients_refused_total",
	  N(clients_refused_cred), .label = "reason=\"credentials\"",
	  .help = "Client connections refused: credentials (not our uid, root or client_group), "
		  "limit (limits.max_clients), fds (no file descriptor left)." },
	{ "clients_refused", "limit", "kvproxy_clients_refused_total", N(clients_refused_limit),
	  .label = "reason=\"limit\"" },
	{ "clients_refused", "fds", "kvproxy_clients_refused_total", N(clients_refused_fds),
	  .label = "reason=\"fds\"" },
	{ "clients_refused", "accept_pauses", "kvproxy_client_accept_pauses_total",
	  N(client_accept_pauses),
	  .help = "Times the client listener stopped accepting for want of file descriptors." },

	{ "admin", "connections", "kvproxy_admin_connections", FN(admin_open), G,
	  .help = "Admin connections open." },
	{ "admin", "accepted", "kvproxy_admin_accepted_total", N(admin_stats.accepted),
	  .help = "Admin connections accepted." },
	{ "admin", "refused", "kvproxy_admin_refused_total", N(admin_stats.refused),
	  .help = "Admin connections refused: the connection limit was reached." },
	{ "admin", "slow", "kvproxy_admin_cut_total", N(admin_stats.slow),
	  .label = "reason=\"slow\"",
	  .help = "Admin connections closed by the daemon: slow (request line or reply beyond "
		  "timeouts.admin_ms), idle (timeouts.admin_idle_ms), too_long (request line)." },
	{ "admin", "idle", "kvproxy_admin_cut_total", N(admin_stats.idle),
	  .label = "reason=\"idle\"" },
	{ "admin", "too_long", "kvproxy_admin_cut_total", N(admin_stats.too_long),
	  .label = "reason=\"too_long\"" },
	{ "admin", "no_fds", "kvproxy_admin_refused_fds_total", N(admin_stats.no_fds),
	  .help = "Admin connections refused: no file descriptor left." },

	/* The RDMA transport's: null (and no Prometheus families) without it. */
	{ "rdma", "xfers", "kvproxy_rdma_transfers_total", W(rdma_xfers),
	  .help = "Transfers sent by RDMA." },
	{ "rdma", "tcp_fallbacks", "kvproxy_rdma_tcp_fallbacks_total", W(rdma_fallbacks),
	  .help = "Transfers that took the TCP path although RDMA was up." },
	{ "rdma", "rails", SUB },
	{ "rdma", "registrations", SUB },
	{ "rdma", "wc_errors", "kvproxy_rdma_wc_errors_total", W(wc_errors), .vec = SV_WC,
	  .help = "Work-completion errors by status." },

	{ "rails", NULL, JSON(rail_ident) },
	{ "rails", "paused", "kvproxy_rail_paused", FN(rail_paused), G, .unit = SU_BOOL,
	  .flags = SF_SHORT, .help = "1 while the rail is paused (rail_pause)." },
	{ "rails", "tx_bytes", "kvproxy_rail_tx_bytes_total", R(tx_bytes),
	  .help = "Bytes written to peers through the rail." },
	{ "rails", "tx_writes", "kvproxy_rail_tx_writes_total", R(tx_wrs),
	  .help = "RDMA WRITEs posted on the rail." },
	{ "rails", "rx_notices", "kvproxy_rail_rx_notices_total", R(rx_imms),
	  .help = "Transfers completed here through the rail." },
	{ "rails", "qps_up", "kvproxy_rail_qps_up", R(qps_up), G,
	  .help = "Send queue pairs connected on the rail." },
	{ "rails", "qp_resets", "kvproxy_rail_qp_resets_total", R(qp_resets),
	  .help = "Queue pairs torn down and rebuilt." },
	{ "rails", "wc_errors", "kvproxy_rail_wc_errors_total", R(wc_errors),
	  .help = "Work-completion errors on the rail." },

	{ "registrations", "registered", "kvproxy_rdma_registrations_total", MR(regs),
	  .help = "Regions registered for RDMA." },
	{ "registrations", "failed", "kvproxy_rdma_registration_failures_total", MR(failures),
	  .help = "Regions left unregistered (their data is staged over TCP)." },
	{ "registrations", "dmabuf", "kvproxy_rdma_registrations_dmabuf_total", MR(dmabuf),
	  .help = "Of the registrations, GPU memory through dma-buf." },
	{ "registrations", "peer_memory", "kvproxy_rdma_registrations_peer_memory_total",
	  MR(peermem), .help = "Of the registrations, GPU memory through peer memory." },
	{ "registrations", "deregistered", "kvproxy_rdma_deregistrations_total", MR(deregs),
	  .help = "Registrations released." },
	{ "registrations", "time_s", "kvproxy_rdma_registration_seconds_total", MR(reg_ns),
	  .unit = SU_NS_S, .help = "Time spent registering memory." },
	{ "registrations", "max_s", "kvproxy_rdma_registration_seconds_max", MR(reg_max_ns), G,
	  .unit = SU_NS_S, .help = "Longest registration." },
	{ "registrations", "last_error", JSON(mr_last_error) },

	{ "fences", "set", "kvproxy_fences_total", W(fences),
	  .help = "Fences clients set on transfers landing here." },
	{ "fences", "held", "kvproxy_fences_held", FN(fences_held), G,
	  .help = "Fences set and not yet expired." },
	{ "fences", "forced", "kvproxy_fences_forced_total", W(fences_forced),
	  .help = "Fences that had to tear down queue pairs or connections after timeouts.peer_ms." },
	{ "fences", "refused", "kvproxy_fences_refused_total", W(fences_refused),
	  .help = "Fences refused: the fence table was full." },
	{ "fences", "fenced_xfers", "kvproxy_fenced_transfers_total", W(fenced_xfers),
	  .help = "Incoming transfers a fence refused." },
	{ "fences", "fenced_bytes", "kvproxy_fenced_bytes_total", W(fenced_bytes),
	  .help = "Bytes of incoming transfers a fence dropped." },
	{ "fences", "max_ms", "kvproxy_fence_seconds_max", WMAX(fence_ns_max), G,
	  .unit = SU_NS_MS, .help = "Longest time from a fence to nothing more landing." },
};

const unsigned stat_nrows = sizeof(stat_rows) / sizeof(stat_rows[0]);
