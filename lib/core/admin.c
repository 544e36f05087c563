/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Admin methods (main lcore). The JSON-RPC 2.0 framing (ids, notifications,
 * batches) is in admin_rpc.c; connections and their bounds in admin_conn.c.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <jansson.h>
#include <rte_lcore.h>

#include "admin_priv.h"
#include "kvp_core.h"


json_t *
admin_fail(struct rpc_err *e, int code, const char *fmt, ...)
{
	va_list ap;

	e->code = code;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return NULL;
}


static void
add_peer(struct kvp_peer_stats *d, struct kvp_peer_stats *s)
{
	d->tx_bytes += KVP_STAT_READ(s->tx_bytes);
	d->rx_bytes += KVP_STAT_READ(s->rx_bytes);
	d->tx_xfers += KVP_STAT_READ(s->tx_xfers);
	d->rx_xfers += KVP_STAT_READ(s->rx_xfers);
	d->tx_frames += KVP_STAT_READ(s->tx_frames);
	d->rx_frames += KVP_STAT_READ(s->rx_frames);
	d->bad_frames += KVP_STAT_READ(s->bad_frames);
	d->conn_errors += KVP_STAT_READ(s->conn_errors);
	d->tcp_retrans += KVP_STAT_READ(s->tcp_retrans);
	for (unsigned l = 0; l < KVP_LINKS_MAX; l++)
		d->link_tx_bytes[l] += KVP_STAT_READ(s->link_tx_bytes[l]);
}

void
admin_gather(const struct kvp_node *n, struct totals *t)
{
	memset(t, 0, sizeof(*t));
	for (unsigned w = 0; w < n->nworkers; w++) {
		struct kvp_worker_stats *s = &n->workers[w].stats;

		for (uint32_t p = 0; p < n->cfg.npeers; p++) {
			add_peer(&t->peer[p], &s->peer[p]);
			add_peer(&t->all, &s->peer[p]);
		}
		for (int c = 0; c < KVP_STATUS_MAX; c++) {
			t->completions[c] += KVP_STAT_READ(s->completions[c]);
			t->done += KVP_STAT_READ(s->completions[c]);
		}
		t->submitted += KVP_STAT_READ(s->xfers_submitted);
		t->landed += KVP_STAT_READ(s->xfers_landed);
		t->hwm += KVP_STAT_READ(s->inflight_hwm);
		t->stage_bufs += KVP_STAT_READ(s->stage_bufs);
		t->fixed_bufs += KVP_STAT_READ(s->fixed_bufs);
		t->stage_used += KVP_STAT_READ(s->stage_used);
		t->stage_hwm += KVP_STAT_READ(s->stage_hwm);
		t->stage_waits += KVP_STAT_READ(s->stage_waits);
		t->drain_refused += KVP_STAT_READ(s->drain_refused);
		t->deadline_misses += KVP_STAT_READ(s->deadline_misses);
		t->fences += KVP_STAT_READ(s->fences);
		t->fences_forced += KVP_STAT_READ(s->fences_forced);
		t->fences_refused += KVP_STAT_READ(s->fences_refused);
		t->fenced_xfers += KVP_STAT_READ(s->fenced_xfers);
		t->fenced_bytes += KVP_STAT_READ(s->fenced_bytes);
		if (KVP_STAT_READ(s->fence_ns_max) > t->fence_ns_max)
			t->fence_ns_max = KVP_STAT_READ(s->fence_ns_max);
		t->fences_held += __atomic_load_n(&n->workers[w].nfences, __ATOMIC_RELAXED);
		t->inflight += n->workers[w].nxfers -
			       __atomic_load_n(&n->workers[w].nfree, __ATOMIC_RELAXED);
	}
}

double
admin_uptime_s(const struct kvp_node *n)
{
	return (double)(kvp_mono_ns() - n->start_ns) / 1e9;
}

unsigned
admin_peers_up(const struct kvp_node *n)
{
	unsigned up = 0;

	for (uint16_t i = 0; i < n->cfg.npeers; i++)
		up += n->peers[i].out_up != 0;
	return up;
}

/* No params, or an empty object/array. */
bool
admin_no_params(json_t *params)
{
	return !params || (json_is_object(params) && json_object_size(params) == 0);
}

/* GPU memory this node has mapped for clients' regions (its GPU footprint beyond contexts). */
uint64_t
admin_gpu_region_bytes(const struct kvp_node *n)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < n->regions.size; i++) {
		const struct kvp_region *r = &n->regions.slots[i];

		if (atomic_load((_Atomic uint32_t *)&r->state) != KVP_REGION_FREE &&
		    (r->flags & KVP_REGION_F_GPU))
			sum += r->len;
	}
	return sum;
}

static json_t *
m_status(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	struct totals t;

	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "status takes no params");
	admin_gather(n, &t);
	return json_pack("{s:s, s:s, s:i, s:f, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:I, s:i}",
			 "node_id", n->cfg.node_id, "version", KVP_VERSION, "pid", (int)getpid(),
			 "uptime_s", admin_uptime_s(n), "transport", n->tops->name, "workers",
			 (int)n->nworkers, "clients", (int)n->nclients, "regions",
			 (int)n->regions.used, "inflight", (int)t.inflight, "peers",
			 (int)n->cfg.npeers, "peers_up", (int)admin_peers_up(n), "draining",
			 n->draining, "stats_enabled", n->cfg.stats_enabled, "gpu_region_bytes",
			 (json_int_t)admin_gpu_region_bytes(n), "gpus", n->ngpus > 0 ? n->ngpus : 0);
}

static json_t *
peer_stats_json(const struct kvp_node *n, uint16_t i, const struct kvp_peer_stats *s)
{
	json_t *links = json_array();

	for (unsigned l = 0; l < n->cfg.tcp_conns && l < KVP_LINKS_MAX; l++)
		json_array_append_new(links, json_integer((json_int_t)s->link_tx_bytes[l]));
	return json_pack("{s:s, s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:o}",
			 "node_id",
			 n->cfg.peers[i].node_id, "index", (int)i, "state",
			 kvp_peer_state_name(n, i), "tx_bytes", (json_int_t)s->tx_bytes,
			 "rx_bytes", (json_int_t)s->rx_bytes, "tx_xfers", (json_int_t)s->tx_xfers,
			 "rx_xfers", (json_int_t)s->rx_xfers, "tx_frames",
			 (json_int_t)s->tx_frames, "rx_frames", (json_int_t)s->rx_frames,
			 "connects", (json_int_t)n->peers[i].connects, "disconnects",
			 (json_int_t)n->peers[i].disconnects, "bad_frames",
			 (json_int_t)s->bad_frames, "tcp_retransmits", (json_int_t)s->tcp_retrans,
			 "links_up",
			 __builtin_popcount(n->peers[i].out_up), "link_tx_bytes", links);
}

static json_t *
clients_json(const struct kvp_node *n)
{
	json_t *arr = json_array();

	for (uint32_t i = 0; i < n->cfg.max_clients; i++) {
		const struct kvp_client_conn *c = &n->clients[i];

		if (c->state != KVP_CL_ACTIVE || !c->chan)
			continue;
		struct kvp_chan_hdr *h = c->chan->mem;
		uint32_t sqd = atomic_load_explicit(&h->sq.prod, memory_order_relaxed) -
			       atomic_load_explicit(&h->sq.cons, memory_order_relaxed);
		uint32_t cqd = atomic_load_explicit(&h->cq.prod, memory_order_relaxed) -
			       atomic_load_explicit(&h->cq.cons, memory_order_relaxed);
		json_array_append_new(
			arr, json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "id", (int)c->id,
				       "pid", (int)c->pid, "sq_depth", (int)sqd, "cq_depth",
				       (int)cqd, "inflight",
				       (int)__atomic_load_n(&c->chan->inflight, __ATOMIC_RELAXED),
				       "regions", (int)kvp_region_count(&n->regions, c->id),
				       "cq_overflow",
				       (int)atomic_load_explicit(&h->cq.overflow,
								 memory_order_relaxed)));
	}
	return arr;
}

/* Histogram of (peer, phase) summed over the workers. */
void
admin_hist_of(const struct kvp_node *n, uint16_t peer, int phase, struct kvp_hist *h)
{
	memset(h, 0, sizeof(*h));
	for (unsigned w = 0; w < n->nworkers; w++)
		kvp_hist_merge(h, kvp_worker_hist(&n->workers[w], peer, phase));
}

/* Phase latency summaries (microseconds) of every (peer, phase) with observations. */
static json_t *
latency_json(const struct kvp_node *n)
{
	json_t *arr = json_array();
	struct kvp_hist h;

	for (uint16_t p = 0; p < n->cfg.npeers; p++) {
		for (int ph = 0; ph < KVP_HP_MAX; ph++) {
			admin_hist_of(n, p, ph, &h);
			uint64_t cnt = kvp_hist_count(&h);

			if (cnt == 0)
				continue;
			json_array_append_new(
				arr,
				json_pack("{s:s, s:s, s:s, s:I, s:f, s:f, s:f, s:f}", "peer",
					  n->cfg.peers[p].node_id, "direction",
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

static json_t *
m_stats(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	const char *fmt = "json";
	struct totals t;

	if (params && json_unpack(params, "{s?:s !}", "format", &fmt) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "params: {\"format\": \"json\"|\"prometheus\"}");
	if (strcmp(fmt, "prometheus") == 0) {
		kvp_stats_prometheus(n, n->stats_buf, KVP_STATS_TEXT_MAX);
		return json_pack("{s:s}", "text", n->stats_buf);
	}
	if (strcmp(fmt, "json") != 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "format: expected \"json\" or \"prometheus\"");
	admin_gather(n, &t);
	json_t *comp = json_object();
	for (int c = 0; c < KVP_STATUS_MAX; c++)
		json_object_set_new(comp, kvp_status_str(c), json_integer((json_int_t)t.completions[c]));
	json_t *peers = json_array();
	for (uint16_t i = 0; i < n->cfg.npeers; i++)
		json_array_append_new(peers, peer_stats_json(n, i, &t.peer[i]));
	json_t *workers = json_array();
	for (unsigned w = 0; w < n->nworkers; w++) {
		struct kvp_worker_stats *s = &n->workers[w].stats;

		json_array_append_new(
			workers, json_pack("{s:i, s:I, s:I, s:I, s:I}", "lcore",
					   (int)n->workers[w].lcore, "loops",
					   (json_int_t)KVP_STAT_READ(s->loops), "busy_ns",
					   (json_int_t)KVP_STAT_READ(s->busy_ns), "idle_ns",
					   (json_int_t)KVP_STAT_READ(s->idle_ns), "sleeps",
					   (json_int_t)KVP_STAT_READ(s->sleeps)));
	}
	json_t *totals = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:I, s:I, s:I, s:i, "
				   "s:I, s:I, s:I, s:I}",
				   "drain_refused", (json_int_t)t.drain_refused, "deadline_misses",
				   (json_int_t)t.deadline_misses, "tx_bytes",
				   (json_int_t)t.all.tx_bytes, "rx_bytes",
				   (json_int_t)t.all.rx_bytes, "xfers_submitted",
				   (json_int_t)t.submitted, "xfers_done", (json_int_t)t.done,
				   "xfers_landed", (json_int_t)t.landed, "frames_tx",
				   (json_int_t)t.all.tx_frames, "frames_rx",
				   (json_int_t)t.all.rx_frames, "inflight", (int)t.inflight,
				   "bad_handshakes", (json_int_t)n->bad_handshakes, "auth_failures",
				   (json_int_t)n->auth_failures, "inflight_hwm", (json_int_t)t.hwm,
				   "inflight_max", (int)(n->cfg.max_inflight * n->nworkers),
				   "client_handshake_failures", (json_int_t)n->client_handshake_failures,
				   "ring_violations", (json_int_t)n->ring_violations);
	json_t *stage = json_pack("{s:I, s:I, s:I, s:I, s:I, s:b, s:I}", "buffers",
				  (json_int_t)t.stage_bufs, "buffer_bytes",
				  (json_int_t)n->cfg.stage_buf, "in_use", (json_int_t)t.stage_used,
				  "high_water", (json_int_t)t.stage_hwm, "waits",
				  (json_int_t)t.stage_waits, "host", n->cfg.stage_host,
				  "registered_buffers", (json_int_t)t.fixed_bufs);
	json_t *fences = json_pack("{s:I, s:i, s:I, s:I, s:I, s:I, s:f}", "set",
				   (json_int_t)t.fences, "held", (int)t.fences_held, "forced",
				   (json_int_t)t.fences_forced, "refused", (json_int_t)t.fences_refused,
				   "fenced_xfers", (json_int_t)t.fenced_xfers, "fenced_bytes",
				   (json_int_t)t.fenced_bytes, "max_ms", (double)t.fence_ns_max / 1e6);
	const struct kvp_admin_stats *as = &n->admin_stats;
	json_t *refused = json_pack("{s:I, s:I, s:I, s:I}", "credentials",
				    (json_int_t)n->clients_refused_cred, "limit",
				    (json_int_t)n->clients_refused_limit, "fds",
				    (json_int_t)n->clients_refused_fds, "accept_pauses",
				    (json_int_t)n->client_accept_pauses);
	json_t *admin = json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:I}", "connections",
				  (int)kvp_admin_open(n), "accepted", (json_int_t)as->accepted,
				  "refused", (json_int_t)as->refused, "slow", (json_int_t)as->slow,
				  "idle", (json_int_t)as->idle, "too_long", (json_int_t)as->too_long,
				  "no_fds", (json_int_t)as->no_fds);
	return json_pack("{s:s, s:f, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:i, s:o, s:o, s:o, s:o, "
			 "s:o}",
			 "node_id", n->cfg.node_id, "uptime_s", admin_uptime_s(n), "transport",
			 n->tops->name, "totals", totals, "completions", comp, "staging", stage,
			 "peers", peers, "clients", clients_json(n), "workers", workers, "regions",
			 (int)n->regions.used, "latency", latency_json(n), "clients_refused", refused,
			 "admin", admin, "rdma", admin_rdma_json(n), "fences", fences);
}

static json_t *
m_peers(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	json_t *arr;
	char addr[80], epoch[24];

	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "peers takes no params");
	arr = json_array();
	for (uint16_t i = 0; i < n->cfg.npeers; i++) {
		const struct kvp_peer *p = &n->peers[i];

		snprintf(addr, sizeof(addr), "%s:%u", n->cfg.peers[i].host, n->cfg.peers[i].port);
		snprintf(epoch, sizeof(epoch), "%016" PRIx64, p->epoch);
		json_array_append_new(
			arr, json_pack("{s:s, s:i, s:s, s:s, s:b, s:i, s:i, s:i, s:s, s:I, s:I, s:I, s:s}",
				       "node_id", n->cfg.peers[i].node_id, "index", (int)i, "addr",
				       addr, "state", kvp_peer_state_name(n, i), "inbound_up",
				       p->in_up != 0, "links", (int)p->links, "links_up",
				       __builtin_popcount(p->out_up), "inbound_links",
				       __builtin_popcount(p->in_up), "epoch", epoch, "connects",
				       (json_int_t)p->connects, "disconnects",
				       (json_int_t)p->disconnects, "handshake_failures",
				       (json_int_t)p->handshake_failures, "last_error",
				       p->last_error));
	}
	return json_pack("{s:o}", "peers", arr);
}

static json_t *
m_cancel(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	json_int_t client = -1, user_id = -1;

	if (!params ||
	    json_unpack(params, "{s:I, s:I !}", "client", &client, "user_id", &user_id) < 0 ||
	    client < 0 || client > UINT32_MAX || user_id < 0)
		return admin_fail(e, RPC_INVALID_PARAMS,
				"params: {\"client\": ID >= 0, \"user_id\": ID >= 0}");
	uint32_t slot = kvp_client_slot((uint32_t)client);
	if (slot >= n->cfg.max_clients || n->clients[slot].state != KVP_CL_ACTIVE ||
	    n->clients[slot].id != (uint32_t)client)
		return json_pack("{s:b, s:s}", "sent", 0, "reason", "no such client");
	struct kvp_msg *m = kvp_node_msg(n, KVP_MSG_CANCEL);
	if (!m)
		return json_pack("{s:b, s:s}", "sent", 0, "reason", "control message pool empty");
	m->client = (uint32_t)client;
	m->user_id = (uint64_t)user_id;
	if (kvp_node_send(n, n->clients[slot].worker, m) < 0)
		return json_pack("{s:b, s:s}", "sent", 0, "reason", "worker inbox full");
	/* The client sees the outcome as the transfer's completion ("canceled"). */
	return json_pack("{s:b}", "sent", 1);
}

/* ---- transfers in flight, slowest transfers ---- */

static uint64_t
span_of(const uint64_t *t, int a, int b)
{
	return t[a] && t[b] >= t[a] ? t[b] - t[a] : 0;
}

/* Where an in-flight transfer is, from the stamps it has reached. */
static const char *
xfer_phase(uint8_t state, int status, const uint64_t *ts)
{
	if (state == KVP_XS_BACKLOG)
		return "delivering"; /* ended; its completion waits for room in the CQ */
	if (status != KVP_OK)
		return "aborting";
	if (!ts[KVP_TS_ADMIT])
		return "waiting"; /* for window or staging buffers */
	if (!ts[KVP_TS_FIRST])
		return "admitted";
	if (!ts[KVP_TS_POSTED])
		return "sending";
	if (!ts[KVP_TS_ACKED])
		return "wire"; /* every byte posted; waiting for the ACK */
	return "acked";
}

static const char *
peer_name(const struct kvp_node *n, uint16_t peer)
{
	return peer < n->cfg.npeers ? n->cfg.peers[peer].node_id : "?";
}

/* Optional {"limit": N}: false if params are malformed or N is out of range. */
static bool
limit_param(json_t *params, json_int_t *limit)
{
	if (params && json_unpack(params, "{s?:I !}", "limit", limit) < 0)
		return false;
	return *limit >= 1 && *limit <= 100000;
}

static json_t *
m_transfers(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	json_int_t limit = 1000;
	uint64_t now = kvp_mono_ns();
	unsigned total = 0;
	char id[24];

	if (!limit_param(params, &limit))
		return admin_fail(e, RPC_INVALID_PARAMS, "params: {\"limit\": 1..100000} or none");
	json_t *arr = json_array();
	for (unsigned wi = 0; wi < n->nworkers; wi++) {
		const struct kvp_worker *w = &n->workers[wi];

		for (uint32_t i = 0; i < w->nxfers; i++) {
			const struct kvp_xfer *x = &w->xfers[i];
			uint8_t state = __atomic_load_n(&x->state, __ATOMIC_ACQUIRE);
			uint64_t ts[KVP_TS_MAX];

			if (state == KVP_XS_FREE)
				continue;
			/* The worker owns the slot: copy, then check it was not reused meanwhile. */
			uint32_t gen = __atomic_load_n(&x->gen, __ATOMIC_RELAXED);
			for (int k = 0; k < KVP_TS_MAX; k++)
				ts[k] = __atomic_load_n(&x->ts[k], __ATOMIC_RELAXED);
			uint32_t client = __atomic_load_n(&x->client, __ATOMIC_RELAXED);
			uint64_t user_id = __atomic_load_n(&x->user_id, __ATOMIC_RELAXED);
			uint64_t bytes = __atomic_load_n(&x->bytes, __ATOMIC_RELAXED);
			uint64_t deadline = __atomic_load_n(&x->deadline_ns, __ATOMIC_RELAXED);
			uint32_t nseg = __atomic_load_n(&x->nseg, __ATOMIC_RELAXED);
			uint16_t peer = __atomic_load_n(&x->peer, __ATOMIC_RELAXED);
			int status = __atomic_load_n(&x->status, __ATOMIC_RELAXED);
			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			if (__atomic_load_n(&x->gen, __ATOMIC_RELAXED) != gen ||
			    __atomic_load_n(&x->state, __ATOMIC_RELAXED) == KVP_XS_FREE)
				continue;
			total++;
			if (json_array_size(arr) >= (size_t)limit)
				continue;
			uint64_t start = ts[KVP_TS_SUBMIT] ? ts[KVP_TS_SUBMIT] : ts[KVP_TS_PICKUP];
			snprintf(id, sizeof(id), "%u.%" PRIx64, wi,
				 ((uint64_t)gen << 32) | x->idx);
			json_array_append_new(
				arr,
				json_pack("{s:s, s:i, s:I, s:s, s:s, s:f, s:f, s:I, s:i, s:s}", "id", id,
					  "client", (int)client, "user_id", (json_int_t)user_id, "peer",
					  peer_name(n, peer), "phase", xfer_phase(state, status, ts),
					  "age_ms", now > start ? (double)(now - start) / 1e6 : 0.0,
					  "deadline_in_ms",
					  ((double)deadline - (double)now) / 1e6, "bytes",
					  (json_int_t)bytes, "nseg", (int)nseg, "status",
					  kvp_status_str(status)));
		}
	}
	return json_pack("{s:i, s:b, s:o}", "count", (int)total, "truncated",
			 total > json_array_size(arr), "transfers", arr);
}

static int
cmp_slow(const void *a, const void *b)
{
	const struct kvp_slow *x = a, *y = b;

	return x->total_ns < y->total_ns ? 1 : x->total_ns > y->total_ns ? -1 : 0;
}

static json_t *
slow_json(const struct kvp_node *n, const struct kvp_slow *s, uint64_t now)
{
	const uint64_t *t = s->ts;
	char tag[24];

	snprintf(tag, sizeof(tag), "%" PRIx64, s->tag);
	json_t *ph = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "queue_us",
			       (double)span_of(t, KVP_TS_SUBMIT, KVP_TS_PICKUP) / 1e3, "admit_us",
			       (double)span_of(t, KVP_TS_PICKUP, KVP_TS_ADMIT) / 1e3,
			       "first_byte_us", (double)span_of(t, KVP_TS_ADMIT, KVP_TS_FIRST) / 1e3,
			       "send_us", (double)span_of(t, KVP_TS_FIRST, KVP_TS_POSTED) / 1e3,
			       "wire_us", (double)span_of(t, KVP_TS_POSTED, KVP_TS_ACKED) / 1e3,
			       "deliver_us", (double)span_of(t, KVP_TS_ACKED, KVP_TS_DONE) / 1e3);
	return json_pack("{s:s, s:i, s:I, s:s, s:s, s:I, s:i, s:f, s:b, s:f, s:o}", "tag", tag,
			 "client", (int)s->client, "user_id", (json_int_t)s->user_id, "peer",
			 peer_name(n, s->peer), "status", kvp_status_str(s->status), "bytes",
			 (json_int_t)s->bytes, "nseg", (int)s->nseg, "total_us",
			 (double)s->total_ns / 1e3, "deadline_missed",
			 t[KVP_TS_DONE] > s->deadline_ns, "ended_s_ago",
			 now > t[KVP_TS_DONE] ? (double)(now - t[KVP_TS_DONE]) / 1e9 : 0.0, "phases",
			 ph);
}

static json_t *
m_slowest(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	json_int_t limit = KVP_SLOWEST_N;
	struct kvp_slow all[KVP_SLOWEST_N * 8];
	unsigned cnt = 0;
	uint64_t now = kvp_mono_ns(), window = (uint64_t)n->cfg.slowest_window_s * 1000000000ull;

	if (!limit_param(params, &limit))
		return admin_fail(e, RPC_INVALID_PARAMS, "params: {\"limit\": 1..100000} or none");
	for (unsigned w = 0; w < n->nworkers && w < 8; w++)
		for (unsigned i = 0; i < KVP_SLOWEST_N; i++)
			if (kvp_slowest_read(&n->workers[w].slowest, i, &all[cnt]) &&
			    now - all[cnt].ts[KVP_TS_DONE] <= window)
				cnt++;
	qsort(all, cnt, sizeof(all[0]), cmp_slow);
	json_t *arr = json_array();
	for (unsigned i = 0; i < cnt && i < (unsigned)limit; i++)
		json_array_append_new(arr, slow_json(n, &all[i], now));
	return json_pack("{s:i, s:b, s:o}", "window_s", (int)n->cfg.slowest_window_s, "enabled",
			 n->cfg.stats_enabled, "transfers", arr);
}

/* ---- drain ---- */

static json_t *
drain_state(struct kvp_node *n)
{
	struct totals t;

	admin_gather(n, &t);
	return json_pack("{s:b, s:f, s:i, s:I, s:b}", "draining", n->draining, "since_s",
			 n->draining ? (double)(kvp_mono_ns() - n->drain_since_ns) / 1e9 : 0.0,
			 "inflight", (int)t.inflight, "refused", (json_int_t)t.drain_refused,
			 "idle", n->draining && t.inflight == 0);
}

static json_t *
m_drain(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "drain takes no params");
	if (!n->draining)
		kvp_node_set_draining(n, true);
	return drain_state(n);
}

static json_t *
m_undrain(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "undrain takes no params");
	if (n->draining)
		kvp_node_set_draining(n, false);
	return drain_state(n);
}

/* ---- configuration ---- */

static json_t *
conf_value(const struct kvp_config_info *info, const char *text)
{
	if (info->kind == KVP_CONF_INT)
		return json_integer((json_int_t)strtoull(text, NULL, 10));
	if (info->kind == KVP_CONF_BOOL)
		return json_boolean(strcmp(text, "true") == 0);
	return json_string(text);
}

static json_t *
conf_entry(const struct kvp_node *n, const char *key, bool full)
{
	struct kvp_config_info info;
	char v[512];

	if (kvp_config_get(&n->cfg, key, v, sizeof(v), &info) < 0)
		return NULL;
	json_t *o = json_pack("{s:s, s:o, s:b}", "key", info.key, "value", conf_value(&info, v),
			      "runtime", info.runtime);
	if (full && info.kind == KVP_CONF_INT) {
		json_object_set_new(o, "min", json_integer(info.min));
		json_object_set_new(o, "max", json_integer(info.max));
	}
	if (full && info.fixed)
		json_object_set_new(o, "fixed", json_string(info.fixed));
	return o;
}

static json_t *
m_config_get(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	const char *key = NULL;
	struct kvp_config_info info;

	if (params && json_unpack(params, "{s?:s !}", "key", &key) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "params: {\"key\": \"name\"} or none");
	if (key) {
		json_t *o = conf_entry(n, key, true);

		return o ? o : admin_fail(e, RPC_INVALID_PARAMS, "unknown key '%.64s'", key);
	}
	json_t *arr = json_array();
	for (unsigned i = 0; kvp_config_describe(i, &info) == 0; i++)
		json_array_append_new(arr, conf_entry(n, info.key, false));
	return json_pack("{s:o}", "config", arr);
}

/* A JSON scalar as the text the config table parses. */
static int
value_text(json_t *v, char *buf, size_t len)
{
	if (json_is_string(v))
		snprintf(buf, len, "%s", json_string_value(v));
	else if (json_is_integer(v))
		snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
	else if (json_is_boolean(v))
		snprintf(buf, len, "%s", json_is_true(v) ? "true" : "false");
	else
		return -EINVAL;
	return 0;
}

/* What a runtime change must also do besides storing the value. */
static void
config_applied(struct kvp_node *n, const char *key)
{
	if (strcmp(key, "log_level") == 0)
		rte_log_set_level_pattern("kvp.*", (uint32_t)n->cfg.log_level);
	else if (strncmp(key, "stats.", 6) == 0)
		n->next_stats_ns = 0; /* a new file or period takes effect now */
	else if (strncmp(key, "poll.", 5) == 0)
		for (unsigned i = 0; i < n->nworkers; i++) {
			uint64_t one = 1;

			/* A sleeping worker picks up the new polling mode at once. */
			if (write(n->workers[i].evfd, &one, sizeof(one)) < 0) {
				/* EAGAIN: already rung */
			}
		}
}

static json_t *
m_config_set(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	const char *key = NULL;
	json_t *val = NULL;
	char text[512], prev[512], why[256];

	if (!params || json_unpack(params, "{s:s, s:o !}", "key", &key, "value", &val) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS,
				"params: {\"key\": \"name\", \"value\": string|integer|boolean}");
	if (value_text(val, text, sizeof(text)) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "value: expected a string, integer or boolean");
	if (kvp_config_get(&n->cfg, key, prev, sizeof(prev), NULL) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "unknown key '%.64s'", key);
	int rc = kvp_config_set(&n->cfg, key, text, why, sizeof(why));
	if (rc == -EPERM)
		return admin_fail(e, RPC_REFUSED, "%s", why);
	if (rc < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "%s", why);
	config_applied(n, key);
	KVP_LOG(NOTICE, core, "config_set %s: %s -> %s", key, prev, text);
	json_t *o = conf_entry(n, key, false);
	struct kvp_config_info info;

	kvp_config_get(&n->cfg, key, text, sizeof(text), &info);
	json_object_set_new(o, "previous", conf_value(&info, prev));
	return o;
}

static json_t *
m_log_level(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	const char *level = NULL;
	const char *prev = kvp_log_level_name(n->cfg.log_level);
	char why[256];

	if (params && json_unpack(params, "{s?:s !}", "level", &level) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "params: {\"level\": \"name\"} or none");
	if (!level)
		return json_pack("{s:s}", "level", prev);
	if (kvp_config_set(&n->cfg, "log_level", level, why, sizeof(why)) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "%s", why);
	config_applied(n, "log_level");
	KVP_LOG(NOTICE, core, "log level %s -> %s", prev, kvp_log_level_name(n->cfg.log_level));
	return json_pack("{s:s, s:s}", "level", kvp_log_level_name(n->cfg.log_level), "previous",
			 prev);
}

struct method {
	const char *name;
	/* NULL result: the error is in the rpc_err (invalid params unless set otherwise) */
	json_t *(*fn)(struct kvp_node *n, json_t *params, struct rpc_err *e);
};

static const struct method methods[] = {
	{ "status", m_status },
	{ "stats", m_stats },
	{ "peers", m_peers },
	{ "transfers", m_transfers },
	{ "slowest", m_slowest },
	{ "cancel", m_cancel },
	{ "drain", m_drain },
	{ "undrain", m_undrain },
	{ "config_get", m_config_get },
	{ "config_set", m_config_set },
	{ "log_level", m_log_level },
	{ "doctor", admin_doctor },
	{ "rails", admin_rails },
	{ "rail_pause", admin_rail_pause },
	{ "rail_resume", admin_rail_resume },
};

/* The method called @p name, or NULL (admin_rpc.c dispatches through this). */
admin_method_fn
admin_method(const char *name)
{
	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
		if (strcmp(methods[i].name, name) == 0)
			return methods[i].fn;
	return NULL;
}
