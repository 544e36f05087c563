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

#include "ctrl_priv.h"

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
	struct kvp_msg *m = ctrl_msg(n, KVP_MSG_CANCEL);
	if (!m)
		return json_pack("{s:b, s:s}", "sent", 0, "reason", "control message pool empty");
	m->client = (uint32_t)client;
	m->user_id = (uint64_t)user_id;
	if (ctrl_send(n, n->clients[slot].worker, m) < 0)
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
xfer_phase(uint8_t state, uint8_t tp, int status, const uint64_t *ts)
{
	if (state == KVP_XS_BACKLOG)
		return "delivering"; /* ended; its completion waits for room in the CQ */
	if (status != KVP_OK)
		return "aborting";
	if (tp == KVP_XFER_TP_WAIT)
		return "connecting"; /* its new peer has no link yet */
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

/* A transfer's peer by slot (in flight: its slot is still the peer's). */
static const char *
peer_name(const struct kvp_node *n, uint16_t peer)
{
	return peer_live(n, peer) ? peer_label(n, peer) : "?";
}

/* An ended transfer's peer by handle: a slot reused since is not its peer. */
static const char *
handle_name(const struct kvp_node *n, uint16_t handle)
{
	uint32_t slot = kvp_peer_handle_slot(handle);

	return peer_live(n, slot) && peer_handle(n, slot) == handle ? peer_label(n, slot)
								      : "(removed)";
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
			uint8_t tp = __atomic_load_n(&x->tp, __ATOMIC_RELAXED);
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
					  peer_name(n, peer), "phase", xfer_phase(state, tp, status, ts),
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
			 handle_name(n, s->peer), "status", kvp_status_str(s->status), "bytes",
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

/* New submissions fail with "shutdown" while draining. */
static void
set_draining(struct kvp_node *n, bool on)
{
	if (on && !n->draining)
		n->drain_since_ns = kvp_mono_ns();
	n->draining = on;
	/* Workers poll the flag with a relaxed load at their next submission. */
	for (unsigned i = 0; i < n->nworkers; i++)
		__atomic_store_n(&n->workers[i].draining, on, __ATOMIC_RELAXED);
	KVP_LOG(NOTICE, core, "%s", on ? "draining: new submissions are refused with \"shutdown\""
				       : "drain ended: admitting new submissions");
}

static json_t *
drain_state(struct kvp_node *n)
{
	uint64_t inflight = stats_get(n, "totals", "inflight");

	return json_pack("{s:b, s:f, s:i, s:I, s:b}", "draining", n->draining, "since_s",
			 n->draining ? (double)(kvp_mono_ns() - n->drain_since_ns) / 1e9 : 0.0,
			 "inflight", (int)inflight, "refused",
			 (json_int_t)stats_get(n, "totals", "drain_refused"), "idle",
			 n->draining && inflight == 0);
}

static json_t *
m_drain(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "drain takes no params");
	if (!n->draining)
		set_draining(n, true);
	return drain_state(n);
}

static json_t *
m_undrain(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "undrain takes no params");
	if (n->draining)
		set_draining(n, false);
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

void
admin_config_applied(struct kvp_node *n, const char *key)
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
	admin_config_applied(n, key);
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
	admin_config_applied(n, "log_level");
	KVP_LOG(NOTICE, core, "log level %s -> %s", prev, kvp_log_level_name(n->cfg.log_level));
	return json_pack("{s:s, s:s}", "level", kvp_log_level_name(n->cfg.log_level), "previous",
			 prev);
}

void
admin_methods_init(struct kvp_node *n)
{
	(void)n;
	rpc_register("transfers", m_transfers);
	rpc_register("slowest", m_slowest);
	rpc_register("cancel", m_cancel);
	rpc_register("drain", m_drain);
	rpc_register("undrain", m_undrain);
	rpc_register("config_get", m_config_get);
	rpc_register("config_set", m_config_set);
	rpc_register("log_level", m_log_level);
}
