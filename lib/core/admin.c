/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Admin socket (main lcore): JSON-RPC 2.0, one object per line. Requests
 * are parsed with jansson; every malformed request gets a JSON-RPC error
 * and the connection stays usable, except a line longer than
 * KVP_ADMIN_LINEMAX, which closes it (nothing sane follows it).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "kvp_core.h"

#define RPC_PARSE_ERROR	     -32700
#define RPC_INVALID_REQUEST  -32600
#define RPC_METHOD_NOT_FOUND -32601
#define RPC_INVALID_PARAMS   -32602

#define REPLY_MAX (1u << 20)

/* Totals across workers, read with relaxed loads. */
struct totals {
	struct kvp_peer_stats peer[KVP_PEERS_MAX];
	struct kvp_peer_stats all;
	uint64_t completions[KVP_STATUS_MAX];
	uint64_t submitted;
	uint64_t landed;
	uint64_t done;
	uint64_t hwm;
	uint64_t stage_bufs;
	uint64_t stage_used;
	uint64_t stage_hwm;
	uint64_t stage_waits;
	uint32_t inflight;
};

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
}

static void
gather(const struct kvp_node *n, struct totals *t)
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
		t->stage_used += KVP_STAT_READ(s->stage_used);
		t->stage_hwm += KVP_STAT_READ(s->stage_hwm);
		t->stage_waits += KVP_STAT_READ(s->stage_waits);
		t->inflight += n->workers[w].nxfers -
			       __atomic_load_n(&n->workers[w].nfree, __ATOMIC_RELAXED);
	}
}

static double
uptime_s(const struct kvp_node *n)
{
	return (double)(kvp_mono_ns() - n->start_ns) / 1e9;
}

static unsigned
peers_up(const struct kvp_node *n)
{
	unsigned up = 0;

	for (uint16_t i = 0; i < n->cfg.npeers; i++)
		up += n->peers[i].out_state == KVP_LINK_UP;
	return up;
}

static json_t *
m_status(struct kvp_node *n, json_t *params)
{
	struct totals t;

	(void)params;
	gather(n, &t);
	return json_pack("{s:s, s:s, s:i, s:f, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:b}", "node_id",
			 n->cfg.node_id, "version", KVP_VERSION, "pid", (int)getpid(), "uptime_s",
			 uptime_s(n), "transport", n->tops->name, "workers", (int)n->nworkers,
			 "clients", (int)n->nclients, "regions", (int)n->regions.used, "inflight",
			 (int)t.inflight, "peers", (int)n->cfg.npeers, "peers_up",
			 (int)peers_up(n), "draining", 0);
}

static json_t *
peer_stats_json(const struct kvp_node *n, uint16_t i, const struct kvp_peer_stats *s)
{
	return json_pack("{s:s, s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "node_id",
			 n->cfg.peers[i].node_id, "index", (int)i, "state",
			 kvp_peer_state_name(n, i), "tx_bytes", (json_int_t)s->tx_bytes,
			 "rx_bytes", (json_int_t)s->rx_bytes, "tx_xfers", (json_int_t)s->tx_xfers,
			 "rx_xfers", (json_int_t)s->rx_xfers, "tx_frames",
			 (json_int_t)s->tx_frames, "rx_frames", (json_int_t)s->rx_frames,
			 "connects", (json_int_t)n->peers[i].connects, "disconnects",
			 (json_int_t)n->peers[i].disconnects, "bad_frames",
			 (json_int_t)s->bad_frames);
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

static json_t *
m_stats(struct kvp_node *n, json_t *params)
{
	const char *fmt = "json";
	struct totals t;

	if (params && json_unpack(params, "{s?:s}", "format", &fmt) < 0)
		return NULL;
	if (strcmp(fmt, "prometheus") == 0) {
		char *buf = malloc(REPLY_MAX / 2);
		json_t *r;

		if (!buf)
			return json_pack("{s:s}", "text", "");
		kvp_stats_prometheus(n, buf, REPLY_MAX / 2);
		r = json_pack("{s:s}", "text", buf);
		free(buf);
		return r;
	}
	if (strcmp(fmt, "json") != 0)
		return NULL;
	gather(n, &t);
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
	json_t *totals = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:I, s:I, s:I, s:i}",
				   "tx_bytes",
				   (json_int_t)t.all.tx_bytes, "rx_bytes",
				   (json_int_t)t.all.rx_bytes, "xfers_submitted",
				   (json_int_t)t.submitted, "xfers_done", (json_int_t)t.done,
				   "xfers_landed", (json_int_t)t.landed, "frames_tx",
				   (json_int_t)t.all.tx_frames, "frames_rx",
				   (json_int_t)t.all.rx_frames, "inflight", (int)t.inflight,
				   "bad_handshakes", (json_int_t)n->bad_handshakes, "auth_failures",
				   (json_int_t)n->auth_failures, "inflight_hwm", (json_int_t)t.hwm,
				   "inflight_max", (int)(n->cfg.max_inflight * n->nworkers));
	json_t *stage = json_pack("{s:I, s:I, s:I, s:I, s:I, s:b}", "buffers",
				  (json_int_t)t.stage_bufs, "buffer_bytes",
				  (json_int_t)n->cfg.stage_buf, "in_use", (json_int_t)t.stage_used,
				  "high_water", (json_int_t)t.stage_hwm, "waits",
				  (json_int_t)t.stage_waits, "host", n->cfg.stage_host);
	return json_pack("{s:s, s:f, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:i}", "node_id",
			 n->cfg.node_id, "uptime_s", uptime_s(n), "transport", n->tops->name,
			 "totals", totals, "completions", comp, "staging", stage, "peers", peers,
			 "clients", clients_json(n), "workers", workers, "regions",
			 (int)n->regions.used);
}

static json_t *
m_peers(struct kvp_node *n, json_t *params)
{
	json_t *arr = json_array();
	char addr[80], epoch[24];

	(void)params;
	for (uint16_t i = 0; i < n->cfg.npeers; i++) {
		const struct kvp_peer *p = &n->peers[i];

		snprintf(addr, sizeof(addr), "%s:%u", n->cfg.peers[i].host, n->cfg.peers[i].port);
		snprintf(epoch, sizeof(epoch), "%016" PRIx64, p->epoch);
		json_array_append_new(
			arr, json_pack("{s:s, s:i, s:s, s:s, s:b, s:s, s:I, s:I, s:I, s:s}",
				       "node_id", n->cfg.peers[i].node_id, "index", (int)i, "addr",
				       addr, "state", kvp_peer_state_name(n, i), "inbound_up",
				       p->in_up, "epoch", epoch, "connects",
				       (json_int_t)p->connects, "disconnects",
				       (json_int_t)p->disconnects, "handshake_failures",
				       (json_int_t)p->handshake_failures, "last_error",
				       p->last_error));
	}
	return json_pack("{s:o}", "peers", arr);
}

static json_t *
m_cancel(struct kvp_node *n, json_t *params)
{
	json_int_t client = -1, user_id = -1;

	if (!params || json_unpack(params, "{s:I, s:I}", "client", &client, "user_id", &user_id) < 0 ||
	    client < 0 || user_id < 0)
		return NULL;
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

struct method {
	const char *name;
	json_t *(*fn)(struct kvp_node *n, json_t *params); /* NULL result = invalid params */
};

static const struct method methods[] = {
	{ "status", m_status },
	{ "stats", m_stats },
	{ "peers", m_peers },
	{ "cancel", m_cancel },
};

static size_t
emit(json_t *reply, char *out, size_t outlen)
{
	size_t len = json_dumpb(reply, out, outlen, JSON_COMPACT);

	json_decref(reply);
	if (len > outlen) {
		/* Never sent half a reply: say it did not fit instead. */
		len = (size_t)snprintf(out, outlen,
				       "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32603,"
				       "\"message\":\"reply too large\"}}");
	}
	return len;
}

static size_t
rpc_error(json_t *id, int code, const char *msg, char *out, size_t outlen)
{
	json_t *r = json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id",
			      id ? id : json_null(), "error", "code", code, "message", msg);
	return emit(r, out, outlen);
}

size_t
kvp_admin_handle(struct kvp_node *n, const char *line, size_t len, char *out, size_t outlen)
{
	json_error_t jerr;
	json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	json_t *id, *params, *jm, *jv;
	size_t rlen;

	if (!req)
		return rpc_error(NULL, RPC_PARSE_ERROR, jerr.text, out, outlen);
	id = json_object_get(req, "id");
	if (!json_is_object(req)) {
		rlen = rpc_error(NULL, RPC_INVALID_REQUEST, "request must be a JSON object", out,
				 outlen);
		goto out;
	}
	if (id && !json_is_string(id) && !json_is_integer(id) && !json_is_null(id))
		id = NULL;
	jv = json_object_get(req, "jsonrpc");
	jm = json_object_get(req, "method");
	if (!json_is_string(jv) || strcmp(json_string_value(jv), "2.0") != 0 ||
	    !json_is_string(jm)) {
		rlen = rpc_error(id, RPC_INVALID_REQUEST,
				 "need \"jsonrpc\":\"2.0\" and a string \"method\"", out, outlen);
		goto out;
	}
	params = json_object_get(req, "params");
	if (params && !json_is_object(params) && !json_is_array(params)) {
		rlen = rpc_error(id, RPC_INVALID_REQUEST, "params must be an object or array", out,
				 outlen);
		goto out;
	}
	const char *name = json_string_value(jm);
	const struct method *m = NULL;
	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
		if (strcmp(methods[i].name, name) == 0)
			m = &methods[i];
	if (!m) {
		char msg[128];

		snprintf(msg, sizeof(msg), "unknown method '%.64s'", name);
		rlen = rpc_error(id, RPC_METHOD_NOT_FOUND, msg, out, outlen);
		goto out;
	}
	if (params && !json_is_object(params)) {
		rlen = rpc_error(id, RPC_INVALID_PARAMS, "params must be an object", out, outlen);
		goto out;
	}
	json_t *result = m->fn(n, params);
	if (!result) {
		rlen = rpc_error(id, RPC_INVALID_PARAMS, "invalid params", out, outlen);
		goto out;
	}
	if (!id) {
		/* A notification: executed, not answered. */
		json_decref(result);
		rlen = 0;
		goto out;
	}
	rlen = emit(json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result), out,
		    outlen);
out:
	json_decref(req);
	return rlen;
}

void
kvp_admin_accept(struct kvp_node *n)
{
	int fd = accept4(n->admin_lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0)
		return;
	for (uint32_t i = 0; i < KVP_ADMIN_CONNS; i++) {
		if (n->admin[i].fd >= 0)
			continue;
		n->admin[i].fd = fd;
		n->admin[i].len = 0;
		kvp_node_watch(n, fd, EPOLLIN | EPOLLRDHUP, KVP_EP_ADMIN, i);
		return;
	}
	KVP_LOG_RL(WARNING, core, "admin connection refused: %u already open", KVP_ADMIN_CONNS);
	close(fd);
}

static void
admin_close(struct kvp_node *n, struct kvp_admin_conn *a)
{
	kvp_node_unwatch(n, a->fd);
	close(a->fd);
	a->fd = -1;
}

/* Replies are small and the socket is local: a blocking-free best effort with a bound. */
static bool
admin_write(int fd, const char *buf, size_t len)
{
	size_t off = 0;
	int spins = 0;

	while (off < len) {
		ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (w > 0) {
			off += (size_t)w;
			continue;
		}
		if (w < 0 && errno == EAGAIN && spins++ < 1000) {
			struct timeval tv = { 0, 1000 };

			select(0, NULL, NULL, NULL, &tv);
			continue;
		}
		return false;
	}
	return true;
}

void
kvp_admin_input(struct kvp_node *n, uint32_t slot)
{
	struct kvp_admin_conn *a = &n->admin[slot];
	static char reply[REPLY_MAX];

	for (;;) {
		ssize_t r = recv(a->fd, a->buf + a->len, KVP_ADMIN_LINEMAX - a->len, MSG_DONTWAIT);

		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (r <= 0) {
			admin_close(n, a);
			return;
		}
		a->len += (uint32_t)r;
		char *start = a->buf, *nl;
		while ((nl = memchr(start, '\n', a->len - (uint32_t)(start - a->buf)))) {
			size_t rl = kvp_admin_handle(n, start, (size_t)(nl - start), reply,
						     sizeof(reply) - 1);

			if (rl) {
				reply[rl++] = '\n';
				if (!admin_write(a->fd, reply, rl)) {
					admin_close(n, a);
					return;
				}
			}
			start = nl + 1;
		}
		a->len -= (uint32_t)(start - a->buf);
		memmove(a->buf, start, a->len);
		if (a->len == KVP_ADMIN_LINEMAX) {
			size_t rl = rpc_error(NULL, RPC_INVALID_REQUEST, "request line too long",
					      reply, sizeof(reply) - 1);

			reply[rl++] = '\n';
			admin_write(a->fd, reply, rl);
			admin_close(n, a);
			return;
		}
	}
}

void
kvp_admin_close_all(struct kvp_node *n)
{
	for (uint32_t i = 0; i < KVP_ADMIN_CONNS; i++)
		if (n->admin[i].fd >= 0)
			admin_close(n, &n->admin[i]);
}

/* ---- Prometheus text exposition ---- */

struct pbuf {
	char *p;
	size_t len;
	size_t cap;
};

static void __attribute__((format(printf, 2, 3)))
pb(struct pbuf *b, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (b->len >= b->cap)
		return;
	va_start(ap, fmt);
	w = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (w > 0)
		b->len = b->len + (size_t)w < b->cap ? b->len + (size_t)w : b->cap;
}

static void
head(struct pbuf *b, const char *name, const char *type, const char *help)
{
	pb(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

size_t
kvp_stats_prometheus(const struct kvp_node *n, char *out, size_t outlen)
{
	struct pbuf b = { out, 0, outlen ? outlen - 1 : 0 };
	const char *node = n->cfg.node_id, *tr = n->tops->name;
	struct totals t;

	if (outlen == 0)
		return 0;
	gather(n, &t);
	head(&b, "kvproxy_uptime_seconds", "gauge", "Seconds since kvproxyd started.");
	pb(&b, "kvproxy_uptime_seconds{node=\"%s\"} %.3f\n", node, uptime_s(n));

	static const struct {
		const char *name, *help;
		size_t off;
	} pc[] = {
		{ "kvproxy_peer_tx_bytes_total", "Payload bytes sent to the peer.",
		  offsetof(struct kvp_peer_stats, tx_bytes) },
		{ "kvproxy_peer_rx_bytes_total", "Payload bytes received from the peer.",
		  offsetof(struct kvp_peer_stats, rx_bytes) },
		{ "kvproxy_peer_tx_transfers_total", "Transfers sent to the peer and acknowledged.",
		  offsetof(struct kvp_peer_stats, tx_xfers) },
		{ "kvproxy_peer_rx_transfers_total", "Transfers from the peer landed here.",
		  offsetof(struct kvp_peer_stats, rx_xfers) },
		{ "kvproxy_peer_tx_frames_total", "Wire frames sent to the peer.",
		  offsetof(struct kvp_peer_stats, tx_frames) },
		{ "kvproxy_peer_rx_frames_total", "Wire frames received from the peer.",
		  offsetof(struct kvp_peer_stats, rx_frames) },
		{ "kvproxy_peer_bad_frames_total", "Malformed frames received from the peer.",
		  offsetof(struct kvp_peer_stats, bad_frames) },
		{ "kvproxy_peer_connection_errors_total", "Connections to or from the peer lost.",
		  offsetof(struct kvp_peer_stats, conn_errors) },
	};
	for (size_t k = 0; k < sizeof(pc) / sizeof(pc[0]); k++) {
		head(&b, pc[k].name, "counter", pc[k].help);
		for (uint16_t i = 0; i < n->cfg.npeers; i++)
			pb(&b, "%s{node=\"%s\",peer=\"%s\",transport=\"%s\"} %" PRIu64 "\n",
			   pc[k].name, node, n->cfg.peers[i].node_id, tr,
			   *(const uint64_t *)((const char *)&t.peer[i] + pc[k].off));
	}
	head(&b, "kvproxy_peer_up", "gauge", "1 if the outgoing connection to the peer is up.");
	for (uint16_t i = 0; i < n->cfg.npeers; i++)
		pb(&b, "kvproxy_peer_up{node=\"%s\",peer=\"%s\"} %d\n", node,
		   n->cfg.peers[i].node_id, n->peers[i].out_state == KVP_LINK_UP);
	head(&b, "kvproxy_completions_total", "counter", "Transfers ended on this node, by status.");
	for (int c = 0; c < KVP_STATUS_MAX; c++)
		pb(&b, "kvproxy_completions_total{node=\"%s\",status=\"%s\"} %" PRIu64 "\n", node,
		   kvp_status_str(c), t.completions[c]);
	head(&b, "kvproxy_transfers_submitted_total", "counter", "Transfers picked up from clients.");
	pb(&b, "kvproxy_transfers_submitted_total{node=\"%s\"} %" PRIu64 "\n", node, t.submitted);
	head(&b, "kvproxy_transfers_landed_total", "counter", "Transfers landed into local regions.");
	pb(&b, "kvproxy_transfers_landed_total{node=\"%s\"} %" PRIu64 "\n", node, t.landed);
	head(&b, "kvproxy_transfers_inflight", "gauge", "Transfers in flight.");
	pb(&b, "kvproxy_transfers_inflight{node=\"%s\"} %u\n", node, t.inflight);
	head(&b, "kvproxy_transfers_inflight_max", "gauge", "Transfer slots (limits.max_inflight).");
	pb(&b, "kvproxy_transfers_inflight_max{node=\"%s\"} %u\n", node,
	   n->cfg.max_inflight * n->nworkers);
	head(&b, "kvproxy_transfers_inflight_high_water", "gauge", "Most transfer slots in use at once.");
	pb(&b, "kvproxy_transfers_inflight_high_water{node=\"%s\"} %" PRIu64 "\n", node, t.hwm);
	head(&b, "kvproxy_staging_buffers", "gauge", "Staging buffers in the pool.");
	pb(&b, "kvproxy_staging_buffers{node=\"%s\"} %" PRIu64 "\n", node, t.stage_bufs);
	head(&b, "kvproxy_staging_buffers_in_use", "gauge", "Staging buffers held by transfers.");
	pb(&b, "kvproxy_staging_buffers_in_use{node=\"%s\"} %" PRIu64 "\n", node, t.stage_used);
	head(&b, "kvproxy_staging_buffers_high_water", "gauge", "Most staging buffers in use at once.");
	pb(&b, "kvproxy_staging_buffers_high_water{node=\"%s\"} %" PRIu64 "\n", node, t.stage_hwm);
	head(&b, "kvproxy_staging_waits_total", "counter", "Times a frame waited for a staging buffer.");
	pb(&b, "kvproxy_staging_waits_total{node=\"%s\"} %" PRIu64 "\n", node, t.stage_waits);
	head(&b, "kvproxy_clients", "gauge", "Connected clients.");
	pb(&b, "kvproxy_clients{node=\"%s\"} %u\n", node, n->nclients);
	head(&b, "kvproxy_regions", "gauge", "Registered regions.");
	pb(&b, "kvproxy_regions{node=\"%s\"} %u\n", node, n->regions.used);
	head(&b, "kvproxy_bad_handshakes_total", "counter", "Peer handshakes refused or failed.");
	pb(&b, "kvproxy_bad_handshakes_total{node=\"%s\"} %" PRIu64 "\n", node, n->bad_handshakes);
	head(&b, "kvproxy_auth_failures_total", "counter", "Peers refused for failed authentication.");
	pb(&b, "kvproxy_auth_failures_total{node=\"%s\"} %" PRIu64 "\n", node, n->auth_failures);
	head(&b, "kvproxy_worker_busy_seconds_total", "counter", "Time worker loops found work.");
	for (unsigned w = 0; w < n->nworkers; w++)
		pb(&b, "kvproxy_worker_busy_seconds_total{node=\"%s\",lcore=\"%u\"} %.6f\n", node,
		   n->workers[w].lcore, (double)KVP_STAT_READ(n->workers[w].stats.busy_ns) / 1e9);
	head(&b, "kvproxy_worker_idle_seconds_total", "counter", "Time worker loops found none.");
	for (unsigned w = 0; w < n->nworkers; w++)
		pb(&b, "kvproxy_worker_idle_seconds_total{node=\"%s\",lcore=\"%u\"} %.6f\n", node,
		   n->workers[w].lcore, (double)KVP_STAT_READ(n->workers[w].stats.idle_ns) / 1e9);
	head(&b, "kvproxy_worker_sleeps_total", "counter", "Times a worker blocked when idle.");
	for (unsigned w = 0; w < n->nworkers; w++)
		pb(&b, "kvproxy_worker_sleeps_total{node=\"%s\",lcore=\"%u\"} %" PRIu64 "\n", node,
		   n->workers[w].lcore, KVP_STAT_READ(n->workers[w].stats.sleeps));
	out[b.len] = '\0';
	return b.len;
}
