/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The stats table (stats_table.c) read two ways: as the JSON of the
 * "status" and "stats" admin methods, and as the Prometheus text
 * exposition (stats with format "prometheus", the stats file). Main lcore;
 * counters of the workers are read with relaxed loads.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "ctrl_priv.h"

/* Sections that exist only with the RDMA transport. */
static bool
sect_on(const struct kvp_node *n, const char *sect)
{
	if (strcmp(sect, "rdma") == 0 || strcmp(sect, "rails") == 0 ||
	    strcmp(sect, "registrations") == 0)
		return n->env.rail_pause != NULL;
	return true;
}

/* What a section has one of: the node, each peer, each worker, each rail, each client. */
enum scope { SC_NODE, SC_PEER, SC_WORKER, SC_RAIL, SC_CLIENT };

static enum scope
sect_scope(const char *sect)
{
	if (strcmp(sect, "peers") == 0)
		return SC_PEER;
	if (strcmp(sect, "workers") == 0)
		return SC_WORKER;
	if (strcmp(sect, "rails") == 0)
		return SC_RAIL;
	if (strcmp(sect, "clients") == 0)
		return SC_CLIENT;
	return SC_NODE;
}

/*
 * Instance @p i of the scope, or false past the last (rails: only those in
 * use; clients: the slots of connected clients with a channel).
 */
static bool
instance(const struct kvp_node *n, enum scope sc, unsigned *i)
{
	switch (sc) {
	case SC_PEER:
		/* The slots in use: a free one has no series (its rows are zero). */
		while (*i < n->cfg.max_peers && !peer_live(n, *i))
			(*i)++;
		return *i < n->cfg.max_peers;
	case SC_WORKER:
		return *i < n->nworkers;
	case SC_RAIL:
		while (*i < KVP_WIRE_RAILS_MAX && !stats_rail_port(n, *i))
			(*i)++;
		return *i < KVP_WIRE_RAILS_MAX;
	case SC_CLIENT:
		while (*i < n->cfg.max_clients && !stats_client_chan(n, *i))
			(*i)++;
		return *i < n->cfg.max_clients;
	default:
		return *i == 0;
	}
}

static uint64_t
ld(const void *base, size_t off)
{
	return __atomic_load_n((const uint64_t *)((const char *)base + off), __ATOMIC_RELAXED);
}

/* The value of row @p r for instance @p i, element offset @p eoff of a vector row. */
static uint64_t
row_value(const struct kvp_node *n, const struct stat_row *r, unsigned i, size_t eoff)
{
	size_t off = r->off + eoff;
	uint64_t v = 0;

	switch (r->src) {
	case SS_WORKERS:
	case SS_WORKERS_MAX:
		for (unsigned w = 0; w < n->nworkers; w++) {
			uint64_t x = ld(&n->workers[w].stats, off);

			v = r->src == SS_WORKERS ? v + x : x > v ? x : v;
		}
		return v;
	case SS_WORKER:
		return ld(&n->workers[i].stats, off);
	case SS_PEERS:
		for (unsigned w = 0; w < n->nworkers; w++)
			for (uint32_t p = 0; p < n->cfg.max_peers; p++)
				if (peer_live(n, p))
					v += ld(&n->workers[w].stats.peer[p], off);
		return v;
	case SS_PEER_STATS:
		for (unsigned w = 0; w < n->nworkers; w++)
			v += ld(&n->workers[w].stats.peer[i], off);
		return v;
	case SS_PEER:
		return ld(&n->peers[i], off);
	case SS_RAIL_STATS:
		for (unsigned w = 0; w < n->nworkers; w++)
			v += ld(&n->workers[w].stats.rail[i], off);
		return v;
	case SS_NODE: {
		const char *f = (const char *)n + off;

		switch (r->size) {
		case 1:
			return *(const uint8_t *)f;
		case 2:
			return *(const uint16_t *)f;
		case 4:
			return *(const uint32_t *)f;
		default:
			return ld(n, off);
		}
	}
	case SS_MR:
		return n->env.mr_stats ? ld(n->env.mr_stats, off) : 0;
	case SS_CHAN: {
		const struct kvp_chan *ch = stats_client_chan(n, i);

		return ch ? ld(&ch->stats, off) : 0;
	}
	case SS_FN:
		return r->fn(n, i);
	}
	return 0;
}

static unsigned
vec_len(const struct kvp_node *n, const struct stat_row *r)
{
	switch (r->vec) {
	case SV_STATUS:
		return KVP_STATUS_MAX;
	case SV_WC:
		return KVP_WC_STATUS_MAX;
	case SV_LINK:
		/* Links of a peer: tcp.connections per worker. */
		return n->nworkers * n->cfg.tcp_conns < KVP_LINKS_MAX ? n->nworkers * n->cfg.tcp_conns
								      : KVP_LINKS_MAX;
	}
	return 1;
}

/* ---- JSON ---- */

static const struct stat_row *
find_row(const char *sect, const char *key)
{
	for (unsigned k = 0; k < stat_nrows; k++)
		if (strcmp(stat_rows[k].sect, sect) == 0 && stat_rows[k].key &&
		    strcmp(stat_rows[k].key, key) == 0)
			return &stat_rows[k];
	return NULL;
}

static json_t *
scalar_json(const struct stat_row *r, uint64_t v)
{
	switch (r->unit) {
	case SU_BOOL:
		return json_boolean(v != 0);
	case SU_NS_MS:
		return json_real((double)v / 1e6);
	case SU_NS_S:
		return json_real((double)v / 1e9);
	default:
		return json_integer((json_int_t)v);
	}
}

static json_t *
value_json(const struct kvp_node *n, const struct stat_row *r, unsigned i)
{
	if (r->vec == SV_NONE)
		return scalar_json(r, row_value(n, r, i, 0));
	if (r->vec == SV_LINK) {
		json_t *arr = json_array();

		for (unsigned e = 0; e < vec_len(n, r); e++)
			json_array_append_new(arr, scalar_json(r, row_value(n, r, i, e * 8)));
		return arr;
	}
	json_t *o = json_object();
	for (unsigned e = 0; e < vec_len(n, r); e++) {
		uint64_t v = row_value(n, r, i, e * 8);

		if (r->vec == SV_STATUS)
			json_object_set_new(o, kvp_status_str((int)e), scalar_json(r, v));
		else if (v) /* work-completion errors: the statuses that occurred */
			json_object_set_new(o, stats_wc_name(e), scalar_json(r, v));
	}
	return o;
}

static json_t *sect_json(const struct kvp_node *n, const char *sect, unsigned inst);

static json_t *
row_json(const struct kvp_node *n, const struct stat_row *r, unsigned inst)
{
	switch (r->kind) {
	case SK_JSON:
		return r->json(n, inst);
	case SK_REF: {
		const struct stat_row *t = find_row(r->ref, r->key);

		return t ? row_json(n, t, inst) : json_null();
	}
	case SK_SUB: {
		if (!sect_on(n, r->key))
			return json_null();
		enum scope sc = sect_scope(r->key);
		if (sc == SC_NODE)
			return sect_json(n, r->key, 0);
		json_t *arr = json_array();
		for (unsigned i = 0; instance(n, sc, &i); i++)
			json_array_append_new(arr, sect_json(n, r->key, i));
		return arr;
	}
	default:
		return value_json(n, r, inst);
	}
}

/* The object of section @p sect for instance @p inst: its rows in table order. */
static json_t *
sect_json(const struct kvp_node *n, const char *sect, unsigned inst)
{
	json_t *o = json_object();

	for (unsigned k = 0; k < stat_nrows; k++) {
		const struct stat_row *r = &stat_rows[k];

		if (strcmp(r->sect, sect) != 0)
			continue;
		if (r->key) {
			json_object_set_new(o, r->key, row_json(n, r, inst));
		} else if (r->kind == SK_JSON) {
			json_t *m = r->json(n, inst);

			json_object_update(o, m);
			json_decref(m);
		}
	}
	return o;
}

json_t *
stats_json(const struct kvp_node *n, const char *sect)
{
	return sect_on(n, sect) ? sect_json(n, sect, 0) : json_null();
}

uint64_t
stats_get(const struct kvp_node *n, const char *sect, const char *key)
{
	const struct stat_row *r = find_row(sect, key);

	if (r && r->kind == SK_REF)
		r = find_row(r->ref, key);
	return r && r->kind == SK_VALUE ? row_value(n, r, 0, 0) : 0;
}

/* ---- Prometheus ---- */

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

/* The labels of instance @p i of a row's scope (after node="..."). */
static void
scope_labels(const struct kvp_node *n, const struct stat_row *r, unsigned i, char *out,
	     size_t len)
{
	const struct kvp_rail_info *p;

	out[0] = '\0';
	switch (sect_scope(r->sect)) {
	case SC_PEER:
		/* By node id (its address until the handshake told it): a reused slot is another peer. */
		if (r->flags & SF_SHORT)
			snprintf(out, len, ",peer=\"%s\"", peer_label(n, i));
		else
			snprintf(out, len, ",peer=\"%s\",transport=\"%s\"", peer_label(n, i),
				 n->tops->name);
		break;
	case SC_WORKER:
		snprintf(out, len, ",lcore=\"%u\"", n->workers[i].lcore);
		break;
	case SC_CLIENT:
		snprintf(out, len, ",client=\"%u\",pid=\"%d\",worker=\"%u\"", n->clients[i].id,
			 (int)n->clients[i].pid, n->clients[i].worker);
		break;
	case SC_RAIL:
		p = stats_rail_port(n, i);
		if (r->flags & SF_SHORT)
			snprintf(out, len, ",rail=\"%u\"", i);
		else
			snprintf(out, len, ",rail=\"%u\",dev=\"%s\",port=\"%u\"", i, p->dev, p->port);
		break;
	default:
		if (r->label)
			snprintf(out, len, ",%s", r->label);
		break;
	}
}

static void
series(struct pbuf *b, const struct stat_row *r, const char *node, const char *labels,
       const char *elem, uint64_t v)
{
	if (r->unit == SU_NS || r->unit == SU_NS_MS || r->unit == SU_NS_S)
		pb(b, "%s{node=\"%s\"%s%s} %.6f\n", r->prom, node, labels, elem, (double)v / 1e9);
	else
		pb(b, "%s{node=\"%s\"%s%s} %" PRIu64 "\n", r->prom, node, labels, elem, v);
}

static void
row_prom(struct pbuf *b, const struct kvp_node *n, const struct stat_row *r)
{
	const char *node = n->cfg.node_id;
	char labels[192], elem[64];
	enum scope sc = sect_scope(r->sect);

	for (unsigned i = 0; instance(n, sc, &i); i++) {
		scope_labels(n, r, i, labels, sizeof(labels));
		if (r->vec == SV_NONE) {
			series(b, r, node, labels, "", row_value(n, r, i, 0));
			continue;
		}
		for (unsigned e = 0; e < vec_len(n, r); e++) {
			uint64_t v = row_value(n, r, i, e * 8);

			if (r->vec == SV_LINK)
				snprintf(elem, sizeof(elem), ",link=\"%u\"", e);
			else if (r->vec == SV_STATUS)
				snprintf(elem, sizeof(elem), ",status=\"%s\"", kvp_status_str((int)e));
			else if (v)
				snprintf(elem, sizeof(elem), ",status=\"%s\"", stats_wc_name(e));
			else
				continue;
			series(b, r, node, labels, elem, v);
		}
	}
}

/* One histogram series: buckets at the power-of-two bounds, cumulative, then sum and count. */
static void
hist_prom(struct pbuf *b, const struct kvp_node *n, const char *name, uint16_t peer, int ph,
	  const struct kvp_hist *hp)
{
	const struct kvp_hist h = *hp;
	uint64_t cum = 0;
	char labels[160];

	snprintf(labels, sizeof(labels), "node=\"%s\",peer=\"%s\",transport=\"%s\",phase=\"%s\"",
		 n->cfg.node_id, peer_label(n, peer), n->tops->name, kvp_hphase_name(ph));
	for (unsigned i = 0; i < KVP_HIST_BUCKETS - 1; i++) {
		uint64_t up = kvp_hist_upper(i);

		cum += h.b[i];
		if (up & (up - 1))
			continue; /* exposed at powers of two; finer buckets feed the quantiles */
		pb(b, "%s_bucket{%s,le=\"%.9g\"} %" PRIu64 "\n", name, labels, (double)up / 1e9, cum);
	}
	cum += h.b[KVP_HIST_BUCKETS - 1];
	pb(b, "%s_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", name, labels, cum);
	pb(b, "%s_sum{%s} %.9f\n", name, labels, (double)h.sum_ns / 1e9);
	pb(b, "%s_count{%s} %" PRIu64 "\n", name, labels, cum);
}

/*
 * The histograms of phases [from, to) of every peer that has observations in
 * them: an idle peer (dozens may be) costs no series, and a new one's appear
 * with its first transfer.
 */
static void
hists_prom(struct pbuf *b, const struct kvp_node *n, const char *name, int from, int to)
{
	struct kvp_hist h[KVP_HP_MAX];

	for (uint32_t p = 0; p < n->cfg.max_peers; p++) {
		uint64_t seen = 0;

		if (!peer_live(n, p))
			continue;
		for (int ph = from; ph < to; ph++) {
			stats_hist_of(n, (uint16_t)p, ph, &h[ph]);
			seen += kvp_hist_count(&h[ph]);
		}
		for (int ph = from; ph < to && seen; ph++)
			hist_prom(b, n, name, (uint16_t)p, ph, &h[ph]);
	}
}

size_t
kvp_stats_prometheus(const struct kvp_node *n, char *out, size_t outlen)
{
	struct pbuf b = { out, 0, outlen ? outlen - 1 : 0 };
	const char *family = NULL;

	if (outlen == 0)
		return 0;
	for (unsigned k = 0; k < stat_nrows; k++) {
		const struct stat_row *r = &stat_rows[k];

		if (r->kind != SK_VALUE || !r->prom || !sect_on(n, r->sect))
			continue;
		if (!family || strcmp(family, r->prom) != 0)
			head(&b, r->prom, r->gauge ? "gauge" : "counter", r->help);
		family = r->prom;
		row_prom(&b, n, r);
	}
	head(&b, "kvproxy_send_phase_seconds", "histogram",
	     "Phases of successful transfers sent to the peer: queue, admit, first_byte, send, "
	     "wire, deliver add up to total.");
	hists_prom(&b, n, "kvproxy_send_phase_seconds", 0, KVP_HP_TX_MAX);
	head(&b, "kvproxy_receive_phase_seconds", "histogram",
	     "Phases of transfers received from the peer: receive (first byte to last byte "
	     "landed), deliver (landed to notice posted).");
	hists_prom(&b, n, "kvproxy_receive_phase_seconds", KVP_HP_TX_MAX, KVP_HP_MAX);
	out[b.len] = '\0';
	return b.len;
}

size_t
kvp_stats_text_max(const struct kvp_config *cfg)
{
	/* The node's series, then ~48 KiB per peer slot (its series and both histogram families). */
	return (1u << 20) + (size_t)cfg->max_peers * (48u << 10);
}

/* ---- the methods ---- */

static json_t *
m_status(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "status takes no params");
	return stats_json(n, "status");
}

static json_t *
m_stats(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	const char *fmt = "json";

	if (params && json_unpack(params, "{s?:s !}", "format", &fmt) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "params: {\"format\": \"json\"|\"prometheus\"}");
	if (strcmp(fmt, "prometheus") == 0) {
		kvp_stats_prometheus(n, n->stats_buf, n->stats_len);
		return json_pack("{s:s}", "text", n->stats_buf);
	}
	if (strcmp(fmt, "json") != 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "format: expected \"json\" or \"prometheus\"");
	return stats_json(n, "");
}

void
stats_init(struct kvp_node *n)
{
	(void)n;
	rpc_register("status", m_status);
	rpc_register("stats", m_stats);
}
