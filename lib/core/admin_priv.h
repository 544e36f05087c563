/* SPDX-License-Identifier: BSD-3-Clause */
/* Admin internals shared by admin.c (JSON-RPC, methods), admin_conn.c, doctor.c and prom.c. */
#ifndef ADMIN_PRIV_H
#define ADMIN_PRIV_H

#include <jansson.h>

#include "kvp_core.h"

#define RPC_PARSE_ERROR	     -32700
#define RPC_INVALID_REQUEST  -32600
#define RPC_METHOD_NOT_FOUND -32601
#define RPC_INVALID_PARAMS   -32602
#define RPC_INTERNAL_ERROR   -32603
/* The largest reply line: the Prometheus text with JSON escaping. */
#define ADMIN_REPLY_MAX (2 * KVP_STATS_TEXT_MAX)

/* Application errors (JSON-RPC reserves -32000..-32099 for servers). */
#define RPC_REFUSED -32001 /* a well-formed request the node will not carry out */

/* Why a method returned no result: code and message of the JSON-RPC error. */
struct rpc_err {
	int code;
	char msg[256];
};

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
	uint64_t fixed_bufs;
	uint64_t stage_used;
	uint64_t stage_hwm;
	uint64_t stage_waits;
	uint64_t drain_refused;
	uint64_t deadline_misses;
	uint32_t inflight;
	/* Fences (kvp_fence) of the clients here. */
	uint64_t fences;
	uint64_t fences_forced;
	uint64_t fences_refused;
	uint64_t fenced_xfers;
	uint64_t fenced_bytes;
	uint64_t fence_ns_max;
	uint32_t fences_held; /* set and not yet expired */
};

/** A method: a result, or NULL with the error in @p e (invalid params unless set otherwise). */
typedef json_t *(*admin_method_fn)(struct kvp_node *n, json_t *params, struct rpc_err *e);

/** The method table's entry for @p name (admin.c), or NULL. */
admin_method_fn admin_method(const char *name);

/** Record a JSON-RPC error for a method; @return NULL (the method's result). */
json_t *admin_fail(struct rpc_err *e, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/** Sum the workers' counters. */
void admin_gather(const struct kvp_node *n, struct totals *t);
double admin_uptime_s(const struct kvp_node *n);
unsigned admin_peers_up(const struct kvp_node *n);
/** No params, or an empty object/array. */
bool admin_no_params(json_t *params);
/** Histogram of (peer, phase) summed over the workers. */
void admin_hist_of(const struct kvp_node *n, uint16_t peer, int phase, struct kvp_hist *h);
uint64_t admin_gpu_region_bytes(const struct kvp_node *n);
/** RDMA rails (rails.c): per-rail counters summed over the workers. */
void admin_rail_totals(const struct kvp_node *n, struct kvp_rail_stats *r, uint64_t *wc_err,
		       uint64_t *xfers, uint64_t *fallbacks);
/** Name of an ibv_wc_status value ("retry_exc_err", ...). */
const char *admin_wc_status_name(unsigned st);
/** The "rdma" object of stats (null without RDMA). */
json_t *admin_rdma_json(const struct kvp_node *n);
json_t *admin_rails(struct kvp_node *n, json_t *params, struct rpc_err *e);
json_t *admin_rail_pause(struct kvp_node *n, json_t *params, struct rpc_err *e);
json_t *admin_rail_resume(struct kvp_node *n, json_t *params, struct rpc_err *e);
/** The doctor method (doctor.c). */
json_t *admin_doctor(struct kvp_node *n, json_t *params, struct rpc_err *e);

#endif /* ADMIN_PRIV_H */
