/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * RDMA rails on the admin socket: "rails" (the "rdma" section of the stats
 * table: placement, state and counters of each rail, memory registrations,
 * work-completion errors), "rail_pause" and "rail_resume".
 */
#include <string.h>

#include "ctrl_priv.h"

static json_t *
m_rails(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "rails takes no params");
	if (!n->env.rail_pause)
		return admin_fail(e, RPC_REFUSED, "this node does not use RDMA (transport %s)",
				  n->tops->name);
	return stats_json(n, "rdma");
}

static json_t *
rail_set(struct kvp_node *n, json_t *params, struct rpc_err *e, bool pause)
{
	json_int_t rail = -1;

	if (!params || json_unpack(params, "{s:I !}", "rail", &rail) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "params: {\"rail\": N}");
	if (!n->env.rail_pause)
		return admin_fail(e, RPC_REFUSED, "this node does not use RDMA (transport %s)",
				  n->tops->name);
	struct kvp_rail_info *p = NULL;
	for (unsigned i = 0; i < n->env.nrails && i < KVP_RAILS_MAX; i++)
		if (rail >= 0 && n->env.rails[i].rail == rail)
			p = &n->env.rails[i];
	if (!p || n->env.rail_pause((unsigned)rail, pause) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS, "no rail %" JSON_INTEGER_FORMAT, rail);
	p->paused = pause;
	unsigned active = 0;
	for (unsigned i = 0; i < n->env.nrails && i < KVP_RAILS_MAX; i++)
		active += n->env.rails[i].rail >= 0 && !n->env.rails[i].paused;
	return json_pack("{s:I, s:b, s:i}", "rail", rail, "paused", pause, "active_rails",
			 (int)active);
}

static json_t *
m_rail_pause(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	return rail_set(n, params, e, true);
}

static json_t *
m_rail_resume(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	return rail_set(n, params, e, false);
}

void
rails_init(struct kvp_node *n)
{
	(void)n;
	rpc_register("rails", m_rails);
	rpc_register("rail_pause", m_rail_pause);
	rpc_register("rail_resume", m_rail_resume);
}
