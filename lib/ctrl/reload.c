/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reloading the configuration file (SIGHUP, admin config_reload; main
 * lcore). The file is loaded into a copy first: one that does not load
 * changes nothing. Then its peer list is compared with the table's
 * configured peers (added ones connect, removed ones drain, a new address
 * is dialled from the next connection on), runtime keys take their new
 * values, and every other key that differs is reported and left alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ctrl_priv.h"

static bool
in_file(const struct kvp_config *c, const char *node_id)
{
	return kvp_config_peer_index(c, node_id) >= 0;
}

static bool
peer_moved(const struct kvp_peer *p, const struct kvp_peer_conf *pc)
{
	return !p->host[0] || p->port != pc->port || strcasecmp(p->host, pc->host) != 0;
}

/*
 * A reload's address moves: each file peer's table slot (-1: not in the
 * table) and whether it moves; each active table slot's file peer (-1: not
 * in the file), found once so that checking a move costs no lookups.
 */
struct moves {
	int slot_of[KVP_PEERS_MAX];
	int file_of[KVP_PEERS_MAX];
	bool move[KVP_PEERS_MAX];
};

/* The table's peer @p j is to be dialled at HOST:PORT once the reload is done. */
static bool
final_at(const struct kvp_node *n, const struct kvp_config *nc, const struct moves *mv, uint32_t j,
	 const char *host, uint16_t port)
{
	const struct kvp_peer *p = &n->peers[j];
	int k = mv->file_of[j];

	if (p->slot_state != KVP_PS_ACTIVE)
		return false;
	if (k >= 0 && mv->move[k])
		return nc->peers[k].port == port && strcasecmp(nc->peers[k].host, host) == 0;
	return p->host[0] && p->port == port && strcasecmp(p->host, host) == 0;
}

/* The table's peer that will be at file peer @p k's new address, other than itself; -1 none. */
static int
final_holder(const struct kvp_node *n, const struct kvp_config *nc, const struct moves *mv,
	     uint32_t k)
{
	const struct kvp_peer_conf *pc = &nc->peers[k];

	for (uint32_t j = 0; j < n->cfg.max_peers; j++)
		if ((int)j != mv->slot_of[k] && final_at(n, nc, mv, j, pc->host, pc->port))
			return (int)j;
	return -1;
}

static bool
own_addr(const struct kvp_node *n, const struct kvp_peer_conf *pc)
{
	return pc->port == n->cfg.listen_port && strcasecmp(pc->host, n->cfg.listen_host) == 0;
}

/*
 * Which of the file's moves can be made: a moved peer's new address must
 * be neither this node's own nor where another peer will be once the
 * reload is done. A peer that the file moves away is not in the way, so
 * swaps and chains apply whatever their order in the file; a refused move
 * keeps its peer where it is, which can refuse a move onto that address
 * in turn: repeat until nothing changes.
 */
static void
reload_moves(const struct kvp_node *n, const struct kvp_config *nc, struct moves *mv)
{
	bool again = true;

	for (uint32_t j = 0; j < n->cfg.max_peers; j++)
		mv->file_of[j] = n->peers[j].slot_state == KVP_PS_ACTIVE ?
					 kvp_config_peer_index(nc, n->peers[j].node_id) :
					 -1;
	for (uint32_t k = 0; k < nc->npeers; k++) {
		int slot = peer_find(n, nc->peers[k].node_id, true);

		mv->slot_of[k] = slot;
		mv->move[k] = slot >= 0 && n->peers[slot].slot_state == KVP_PS_ACTIVE &&
			      peer_moved(&n->peers[slot], &nc->peers[k]);
	}
	while (again) {
		again = false;
		for (uint32_t k = 0; k < nc->npeers; k++) {
			if (mv->move[k] &&
			    (own_addr(n, &nc->peers[k]) || final_holder(n, nc, mv, k) >= 0)) {
				mv->move[k] = false;
				again = true;
			}
		}
	}
}

/* Why file peer @p k's move was refused (after reload_moves()). */
static void
move_why(const struct kvp_node *n, const struct kvp_config *nc, const struct moves *mv, uint32_t k,
	 char *why, size_t whylen)
{
	const struct kvp_peer_conf *pc = &nc->peers[k];
	int j = own_addr(n, pc) ? -1 : final_holder(n, nc, mv, k);

	peer_addr_refused(n, j, pc->host, pc->port, why, whylen);
}

/* The file's peers against the table: @p o gets "added", "removed", "changed", "failed". */
static void
reload_peers(struct kvp_node *n, const struct kvp_config *nc, json_t *o)
{
	json_t *added = json_array(), *removed = json_array(), *changed = json_array();
	json_t *failed = json_object_get(o, "failed");
	char why[192];

	for (uint32_t i = 0; i < n->cfg.max_peers; i++) {
		struct kvp_peer *p = &n->peers[i];

		if (p->slot_state == KVP_PS_ACTIVE && p->origin == KVP_PEER_CONFIG &&
		    !in_file(nc, p->node_id)) {
			json_array_append_new(removed, json_string(p->node_id));
			peer_remove(n, i, "removed from the configuration file");
		}
	}
	struct moves mv;

	reload_moves(n, nc, &mv);
	/* Moves first: a peer added at an address that another one leaves finds it free. */
	for (uint32_t k = 0; k < nc->npeers; k++) {
		const struct kvp_peer_conf *pc = &nc->peers[k];
		int slot = mv.slot_of[k];

		if (slot < 0)
			continue;
		struct kvp_peer *p = &n->peers[slot];

		if (p->slot_state == KVP_PS_DRAINING) {
			json_array_append_new(
				failed,
				json_pack("{s:s, s:s}", "peer", pc->node_id, "why",
					  "being removed: reload again once it has drained"));
			continue;
		}
		bool moved = peer_moved(p, pc);

		if (!moved && p->origin == KVP_PEER_CONFIG)
			continue;
		if (moved && !mv.move[k]) {
			move_why(n, nc, &mv, k, why, sizeof(why));
			json_array_append_new(failed, json_pack("{s:s, s:s}", "peer", pc->node_id,
								"why", why));
			continue;
		}
		json_t *c = json_pack("{s:s}", "peer", pc->node_id);

		if (p->origin != KVP_PEER_CONFIG) {
			/* Added at run time and now in the file: the file owns it from here on. */
			json_object_set_new(c, "origin_was",
					    json_string(peer_origin_name(p->origin)));
			p->origin = KVP_PEER_CONFIG;
		}
		if (moved) {
			json_object_set_new(c, "addr_was", json_string(p->addr));
			snprintf(p->host, sizeof(p->host), "%s", pc->host);
			p->port = pc->port;
			p->dns_ok = false; /* the old name's address */
			snprintf(p->addr, sizeof(p->addr), "%s:%u", pc->host, pc->port);
			json_object_set_new(c, "addr", json_string(p->addr));
			/* Links up stay; the next dial goes to the new address. */
			KVP_LOG(NOTICE, core, "peer %s: address now %s (from its next connection)",
				pc->node_id, p->addr);
		}
		json_array_append_new(changed, c);
	}
	for (uint32_t k = 0; k < nc->npeers; k++) {
		const struct kvp_peer_conf *pc = &nc->peers[k];

		if (mv.slot_of[k] >= 0)
			continue;
		int slot = peer_add(n, KVP_PEER_CONFIG, pc->node_id, pc->host, pc->port, why,
				    sizeof(why));
		if (slot < 0)
			json_array_append_new(failed, json_pack("{s:s, s:s}", "peer", pc->node_id,
								"why", why));
		else
			json_array_append_new(added, json_string(pc->node_id));
	}
	json_object_set_new(o, "added", added);
	json_object_set_new(o, "removed", removed);
	json_object_set_new(o, "changed", changed);
}

/* Every key of the table: runtime ones take the file's value, fixed ones are reported. */
static void
reload_keys(struct kvp_node *n, const struct kvp_config *nc, json_t *o)
{
	json_t *applied = json_array(), *fixed = json_array();
	json_t *failed = json_object_get(o, "failed");
	struct kvp_config_info info;
	char now[512], file[512], why[256];
	bool secret_seen = false;

	for (unsigned i = 0; kvp_config_describe(i, &info) == 0; i++) {
		kvp_config_get(&n->cfg, info.key, now, sizeof(now), NULL);
		kvp_config_get(nc, info.key, file, sizeof(file), NULL);
		/* Secrets read "(set)" either way: compare what they hold. */
		bool differ = info.secret ? strcmp(n->cfg.auth_secret, nc->auth_secret) != 0 :
					    strcmp(now, file) != 0;

		/* auth.secret and auth.secret_file hold one secret: report it once. */
		if (!differ || (info.secret && secret_seen))
			continue;
		secret_seen |= info.secret;
		if (!info.runtime) {
			json_t *f = json_pack("{s:s, s:s}", "key", info.key, "why", info.fixed);

			if (!info.secret) {
				json_object_set_new(f, "value", json_string(now));
				json_object_set_new(f, "file", json_string(file));
			}
			json_array_append_new(fixed, f);
			KVP_LOG(WARNING, core, "reload: %s not changed: %s (restart to apply)",
				info.key, info.fixed);
			continue;
		}
		if (kvp_config_set(&n->cfg, info.key, file, why, sizeof(why)) < 0) {
			json_array_append_new(failed,
					      json_pack("{s:s, s:s}", "key", info.key, "why", why));
			continue;
		}
		admin_config_applied(n, info.key);
		KVP_LOG(NOTICE, core, "reload: %s: %s -> %s", info.key, now, file);
		json_array_append_new(applied, json_pack("{s:s, s:s, s:s}", "key", info.key,
							 "previous", now, "value", file));
	}
	json_object_set_new(o, "applied", applied);
	json_object_set_new(o, "not_applied", fixed);
}

/* Reload; @return 0 with *report (what was done), or negative with @p err. */
static int
reload_run(struct kvp_node *n, json_t **report, char *err, size_t errlen)
{
	const char *path = n->env.config_path;
	struct kvp_config *nc;
	int rc;

	if (!path) {
		snprintf(err, errlen, "this node was not started from a configuration file");
		return -ENOENT;
	}
	/* A few hundred KiB with the peer list: not on the stack. */
	nc = malloc(sizeof(*nc));
	if (!nc) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rc = kvp_config_load(path, nc, err, errlen);
	if (rc < 0) {
		free(nc);
		return rc;
	}
	json_t *o = json_pack("{s:s, s:[]}", "file", path, "failed");

	reload_peers(n, nc, o);
	reload_keys(n, nc, o);
	free(nc);
	*report = o;
	return 0;
}

int
kvp_node_reload(struct kvp_node *n, char *err, size_t errlen)
{
	json_t *report = NULL;
	int rc = reload_run(n, &report, err, errlen);

	if (rc < 0) {
		KVP_LOG(ERR, core, "reload refused, nothing changed: %s", err);
		return rc;
	}
	char *text = json_dumps(report, JSON_COMPACT);

	KVP_LOG(NOTICE, core, "reloaded: %s", text ? text : "(no memory for the report)");
	free(text);
	json_decref(report);
	return 0;
}

static json_t *
m_config_reload(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	json_t *report = NULL;
	char err[512];

	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "config_reload takes no params");
	int rc = reload_run(n, &report, err, sizeof(err));

	if (rc < 0)
		return admin_fail(e, RPC_REFUSED, "nothing changed: %s", err);
	return report;
}

void
reload_init(struct kvp_node *n)
{
	(void)n;
	rpc_register("config_reload", m_config_reload);
}
