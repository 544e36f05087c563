/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Admin methods of the peer table (main lcore): peers (every slot in use,
 * where it came from, its links), peer_add and peer_remove. Bad input is
 * refused with the reason before anything changes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ctrl_priv.h"

static json_t *
peer_json(const struct kvp_node *n, uint32_t i)
{
	const struct kvp_peer *p = &n->peers[i];
	char epoch[24];

	snprintf(epoch, sizeof(epoch), "%016" PRIx64, p->epoch);
	json_t *o =
		json_pack("{s:s, s:i, s:s, s:s, s:s, s:b, s:i, s:i, s:i, s:s, s:I, s:I, s:I, s:s}",
			  "node_id", p->node_id, "index", (int)peer_handle(n, i), "origin",
			  peer_origin_name(p->origin), "addr", p->addr, "state",
			  kvp_peer_state_name(n, (uint16_t)i), "inbound_up", p->in_up != 0, "links",
			  (int)p->links, "links_up", __builtin_popcountll(p->out_up), "inbound_links",
			  __builtin_popcountll(p->in_up), "epoch", epoch, "connects",
			  (json_int_t)p->connects, "disconnects", (json_int_t)p->disconnects,
			  "handshake_failures", (json_int_t)p->handshake_failures, "last_error",
			  p->slot_state == KVP_PS_DRAINING ? p->removed_why : p->last_error);

	if (p->first_up_ns)
		json_object_set_new(o, "first_up_ms",
				    json_real((double)(p->first_up_ns - p->added_ns) / 1e6));
	return o;
}

static json_t *
m_peers(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	json_t *arr;

	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "peers takes no params");
	arr = json_array();
	for (uint32_t i = 0; i < n->cfg.max_peers; i++)
		if (peer_live(n, i))
			json_array_append_new(arr, peer_json(n, i));
	return json_pack("{s:o, s:i, s:i}", "peers", arr, "count", (int)n->npeers, "max_peers",
			 (int)n->cfg.max_peers);
}

/* The error for a peer_add refusal: bad input is invalid params, the rest refused. */
static json_t *
add_refused(struct rpc_err *e, int rc, const char *why)
{
	return admin_fail(e, rc == -EINVAL ? RPC_INVALID_PARAMS : RPC_REFUSED, "%s", why);
}

static json_t *
m_peer_add(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	const char *id = NULL, *addr = NULL;
	char host[64], why[192];
	uint16_t port;

	if (!params || json_unpack(params, "{s:s, s:s !}", "node_id", &id, "addr", &addr) < 0)
		return admin_fail(e, RPC_INVALID_PARAMS,
				  "params: {\"node_id\": \"id\", \"addr\": \"host:port\"}");
	if (!kvp_config_node_id_ok(id))
		return admin_fail(
			e, RPC_INVALID_PARAMS,
			"node_id '%.40s': expected 1 to %d letters, digits, '-', '_', '.'", id,
			KVP_NODE_ID_MAX - 1);
	if (kvp_config_parse_hostport(addr, host, sizeof(host), &port) < 0)
		return admin_fail(
			e, RPC_INVALID_PARAMS,
			"addr '%.80s': expected \"host:port\" (port 1-65535, host of at most "
			"63 letters, digits, '.', '-', '_', or [IPv6])",
			addr);
	int slot = peer_add(n, KVP_PEER_ADMIN, id, host, port, why, sizeof(why));

	if (slot < 0)
		return add_refused(e, slot, why);
	/* Dialled at the next pass of the loop (its timer), at once. */
	return peer_json(n, (uint32_t)slot);
}

static json_t *
m_peer_remove(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	const char *id = NULL, *addr = NULL;
	char host[64];
	uint16_t port;
	int slot = -1;

	if (!params || json_unpack(params, "{s?:s, s?:s !}", "node_id", &id, "addr", &addr) < 0 ||
	    (id == NULL) == (addr == NULL))
		return admin_fail(e, RPC_INVALID_PARAMS,
				  "params: {\"node_id\": \"id\"} (or {\"addr\": \"host:port\"})");
	if (id) {
		slot = peer_find(n, id, false);
		if (slot < 0)
			return admin_fail(e, RPC_REFUSED, "'%.40s' is not a peer%s", id,
					  peer_find(n, id, true) >= 0 ?
						  " (it is being removed already)" :
						  "");
	} else {
		if (kvp_config_parse_hostport(addr, host, sizeof(host), &port) < 0)
			return admin_fail(e, RPC_INVALID_PARAMS,
					  "addr '%.80s': expected \"host:port\"", addr);
		slot = peer_find_addr(n, host, port);
		if (slot < 0)
			return admin_fail(e, RPC_REFUSED, "no peer is dialled at %.80s", addr);
	}
	json_t *o = peer_json(n, (uint32_t)slot);

	peer_remove(n, (uint32_t)slot, "peer_remove");
	/* New transfers fail at once; those in flight end; then its links close. */
	json_object_set_new(o, "state", json_string("draining"));
	return o;
}

void
peer_admin_init(struct kvp_node *n)
{
	(void)n;
	rpc_register("peers", m_peers);
	rpc_register("peer_add", m_peer_add);
	rpc_register("peer_remove", m_peer_remove);
}
