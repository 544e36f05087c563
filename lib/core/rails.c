/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * RDMA rails on the admin socket: "rails" (placement, state and counters of
 * each rail, memory registrations, work-completion errors), "rail_pause"
 * and "rail_resume", and the "rdma" section of "stats".
 */
#include <string.h>

#include "admin_priv.h"

/* enum ibv_wc_status, in order (core does not link libibverbs). */
static const char *const wc_names[KVP_WC_STATUS_MAX] = {
	"success", "loc_len_err", "loc_qp_op_err", "loc_eec_op_err", "loc_prot_err",
	"wr_flush_err", "mw_bind_err", "bad_resp_err", "loc_access_err", "rem_inv_req_err",
	"rem_access_err", "rem_op_err", "retry_exc_err", "rnr_retry_exc_err", "loc_rdd_viol_err",
	"rem_inv_rd_req_err", "rem_abort_err", "inv_eecn_err", "inv_eec_state_err", "fatal_err",
	"resp_timeout_err", "general_err", "tm_err", "tm_rndv_incomplete",
};

const char *
admin_wc_status_name(unsigned st)
{
	return st < KVP_WC_STATUS_MAX ? wc_names[st] : "unknown";
}

void
admin_rail_totals(const struct kvp_node *n, struct kvp_rail_stats *r, uint64_t *wc_err,
		  uint64_t *xfers, uint64_t *fallbacks)
{
	memset(r, 0, sizeof(*r) * KVP_WIRE_RAILS_MAX);
	memset(wc_err, 0, sizeof(*wc_err) * KVP_WC_STATUS_MAX);
	*xfers = *fallbacks = 0;
	for (unsigned w = 0; w < n->nworkers; w++) {
		const struct kvp_worker_stats *s = &n->workers[w].stats;

		for (unsigned i = 0; i < KVP_WIRE_RAILS_MAX; i++) {
			r[i].tx_bytes += KVP_STAT_READ(s->rail[i].tx_bytes);
			r[i].tx_wrs += KVP_STAT_READ(s->rail[i].tx_wrs);
			r[i].rx_imms += KVP_STAT_READ(s->rail[i].rx_imms);
			r[i].qps_up += KVP_STAT_READ(s->rail[i].qps_up);
			r[i].qp_resets += KVP_STAT_READ(s->rail[i].qp_resets);
			r[i].wc_errors += KVP_STAT_READ(s->rail[i].wc_errors);
		}
		for (unsigned i = 0; i < KVP_WC_STATUS_MAX; i++)
			wc_err[i] += KVP_STAT_READ(s->wc_errors[i]);
		*xfers += KVP_STAT_READ(s->rdma_xfers);
		*fallbacks += KVP_STAT_READ(s->rdma_fallbacks);
	}
}

/* The port behind rail index @p rail, or NULL. */
static const struct kvp_rail_info *
rail_port(const struct kvp_node *n, int rail)
{
	for (unsigned i = 0; i < n->nrails && i < KVP_RAILS_MAX; i++)
		if (n->rails[i].rail == rail)
			return &n->rails[i];
	return NULL;
}

json_t *
admin_rdma_json(const struct kvp_node *n)
{
	struct kvp_rail_stats r[KVP_WIRE_RAILS_MAX];
	uint64_t wc[KVP_WC_STATUS_MAX], xfers, fallbacks;

	if (!n->rail_pause)
		return json_null();
	json_t *rails = json_array(), *wcj = json_object();
	admin_rail_totals(n, r, wc, &xfers, &fallbacks);
	for (int i = 0; i < KVP_WIRE_RAILS_MAX; i++) {
		const struct kvp_rail_info *p = rail_port(n, i);

		if (!p)
			continue;
		json_array_append_new(
			rails, json_pack("{s:i, s:s, s:i, s:i, s:i, s:s, s:i, s:b, s:I, s:I, s:I, s:I, "
					 "s:I, s:I}",
					 "rail", i, "dev", p->dev, "port", p->port, "gid_index",
					 p->gid_index, "mtu", p->mtu, "pci", p->pci, "numa_node",
					 p->numa_node, "paused", p->paused, "tx_bytes",
					 (json_int_t)r[i].tx_bytes, "tx_writes",
					 (json_int_t)r[i].tx_wrs, "rx_notices",
					 (json_int_t)r[i].rx_imms, "qps_up", (json_int_t)r[i].qps_up,
					 "qp_resets", (json_int_t)r[i].qp_resets, "wc_errors",
					 (json_int_t)r[i].wc_errors));
	}
	for (unsigned i = 0; i < KVP_WC_STATUS_MAX; i++)
		if (wc[i])
			json_object_set_new(wcj, admin_wc_status_name(i), json_integer((json_int_t)wc[i]));
	const struct kvp_mr_stats *m = n->mr_stats;
	json_t *mr = json_pack("{s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:s}", "registered",
			       (json_int_t)KVP_STAT_READ(m->regs), "failed",
			       (json_int_t)KVP_STAT_READ(m->failures), "dmabuf",
			       (json_int_t)KVP_STAT_READ(m->dmabuf), "peer_memory",
			       (json_int_t)KVP_STAT_READ(m->peermem), "deregistered",
			       (json_int_t)KVP_STAT_READ(m->deregs), "time_s",
			       (double)KVP_STAT_READ(m->reg_ns) / 1e9, "max_s",
			       (double)KVP_STAT_READ(m->reg_max_ns) / 1e9, "last_error",
			       m->last_error);
	return json_pack("{s:I, s:I, s:o, s:o, s:o}", "xfers", (json_int_t)xfers, "tcp_fallbacks",
			 (json_int_t)fallbacks, "rails", rails, "registrations", mr, "wc_errors",
			 wcj);
}

json_t *
admin_rails(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "rails takes no params");
	if (!n->rail_pause)
		return admin_fail(e, RPC_REFUSED, "this node does not use RDMA (transport %s)",
				  n->tops->name);
	return admin_rdma_json(n);
}

static json_t *
rail_set(struct kvp_node *n, json_t *params, struct rpc_err *e, bool pause)
{
	json_int_t rail = -1;

	if (!params || json_unpack(params, "{s:I !}", "rail", &rail) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "params: {\"rail\": N}");
	if (!n->rail_pause)
		return admin_fail(e, RPC_REFUSED, "this node does not use RDMA (transport %s)",
				  n->tops->name);
	struct kvp_rail_info *p = NULL;
	for (unsigned i = 0; i < n->nrails && i < KVP_RAILS_MAX; i++)
		if (rail >= 0 && n->rails[i].rail == rail)
			p = &n->rails[i];
	if (!p || n->rail_pause((unsigned)rail, pause) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "no rail %" JSON_INTEGER_FORMAT, rail);
	p->paused = pause;
	unsigned active = 0;
	for (unsigned i = 0; i < n->nrails && i < KVP_RAILS_MAX; i++)
		active += n->rails[i].rail >= 0 && !n->rails[i].paused;
	return json_pack("{s:I, s:b, s:i}", "rail", rail, "paused", pause, "active_rails",
			 (int)active);
}

json_t *
admin_rail_pause(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	return rail_set(n, params, e, true);
}

json_t *
admin_rail_resume(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	return rail_set(n, params, e, false);
}
