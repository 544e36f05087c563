/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvproxyctl: peers and the transfers to them — peers, peer add|remove,
 * transfers, slowest, cancel.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "ctl.h"

bool
peers_usage(FILE *f, const char *cmd)
{
	if (strcmp(cmd, "peers") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] peers [--json]\n"
			"\n"
			"Show the peers: node id, index (what clients name it by), origin\n"
			"(config, admin, on_demand, inbound), address, state (up, connecting,\n"
			"down, inbound, draining), connection epoch, connects, disconnects and\n"
			"the last error.\n",
			prog);
	else if (strcmp(cmd, "peer") == 0 || strncmp(cmd, "peer ", 5) == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] peer add [--json] NODE_ID HOST:PORT\n"
			"       %s [GLOBAL-OPTIONS] peer remove [--json] NODE_ID|HOST:PORT\n"
			"\n"
			"add: make NODE_ID at HOST:PORT a peer and connect it at once (admin\n"
			"peer_add). Refused with the reason, changing nothing: a node id that\n"
			"is a peer already or this node's own, a malformed address or one\n"
			"that is a peer already, a full table (limits.max_peers).\n"
			"remove: drain the peer (admin peer_remove): new transfers to it fail\n"
			"with \"no-peer\" at once, those in flight end by their deadline or\n"
			"complete, then its links close and its slot is free again. A peer of\n"
			"the configuration file comes back with the next reload if the file\n"
			"still lists it.\n",
			prog, prog);
	else if (strcmp(cmd, "config_reload") == 0 || strcmp(cmd, "reload") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] config_reload [--json]\n"
			"\n"
			"Re-read the configuration file, as SIGHUP does: peers added to its\n"
			"list connect, peers removed from it drain, runtime keys take their\n"
			"new values; keys that cannot change at run time are listed with the\n"
			"reason and left alone. A file that does not load changes nothing\n"
			"(exit status 1, with FILE:LINE: reason). Alias: reload.\n",
			prog);
	else if (strcmp(cmd, "transfers") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] transfers [--json] [--limit N]\n"
			"\n"
			"List the transfers in flight on this node: id, client, user id, peer,\n"
			"phase (waiting, admitted, sending, wire, acked, aborting, delivering),\n"
			"age and time left to the deadline (ms), bytes and segments.\n"
			"\n"
			"  --limit N  list at most N (default 1000); COUNT is always the full number\n",
			prog);
	else if (strcmp(cmd, "slowest") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] slowest [--json] [--limit N]\n"
			"\n"
			"The slowest transfers that ended within stats.slowest_window_s, slowest\n"
			"first, with the time of each phase in microseconds: queue (client submit\n"
			"to pickup), admit (to window/buffers), first_byte, send (first to last\n"
			"byte posted), wire (to the ACK), deliver (to the completion).\n"
			"\n"
			"  --limit N  show at most N (default 32)\n",
			prog);
	else if (strcmp(cmd, "cancel") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] cancel CLIENT USER_ID\n"
			"\n"
			"Cancel the in-flight transfer USER_ID of client CLIENT (ids as listed by\n"
			"'transfers'). The client sees the transfer complete as \"canceled\".\n",
			prog);
	else
		return false;
	return true;
}

int
render_peers(const struct cmd_opts *co, json_t *res)
{
	(void)co;
	/* The same columns as the peers table in stats. */
	if (!show_table(res, "peers", section_order("peers")))
		return 0;
	/* Anything else the daemon adds goes below the table. */
	json_object_del(res, "peers");
	if (json_object_size(res) > 0) {
		printf("\n");
		print_object(res, NULL, 0);
	}
	return 0;
}

static const char *const cols_transfers[] = {
	"id",    "client", "user_id", "peer", "phase", "age_ms", "deadline_in_ms",
	"bytes", "nseg",   "status",  NULL,
};

int
render_transfers(const struct cmd_opts *co, json_t *res)
{
	(void)co;
	if (!show_table(res, "transfers", cols_transfers))
		return 0;
	printf("\n%" JSON_INTEGER_FORMAT " in flight%s\n",
	       json_integer_value(json_object_get(res, "count")),
	       json_is_true(json_object_get(res, "truncated")) ? " (list truncated)" : "");
	return 0;
}

static const char *const cols_slowest[] = {
	"tag",        "client",          "user_id",     "peer",
	"status",     "bytes",           "total_us",    "queue_us",
	"admit_us",   "first_byte_us",   "send_us",     "wire_us",
	"deliver_us", "deadline_missed", "ended_s_ago", NULL,
};

int
render_slowest(const struct cmd_opts *co, json_t *res)
{
	json_t *rows = json_object_get(res, "transfers"), *row;
	size_t i;

	(void)co;
	if (!is_table(rows)) {
		print_json(res);
		return 0;
	}
	/* One line per transfer: the phases become columns. */
	json_t *flat = json_array();

	json_array_foreach(rows, i, row)
	{
		json_t *f = json_deep_copy(row);

		json_object_update(f, json_object_get(row, "phases"));
		json_object_del(f, "phases");
		json_object_del(f, "nseg");
		json_array_append_new(flat, f);
	}
	print_table(flat, cols_slowest, 0);
	printf("\nwindow %" JSON_INTEGER_FORMAT " s%s\n",
	       json_integer_value(json_object_get(res, "window_s")),
	       json_is_false(json_object_get(res, "enabled")) ? ", stats.enabled is false" : "");
	json_decref(flat);
	return 0;
}

const struct call_spec cancel_spec = {
	.what = "CLIENT USER_ID",
	.min = 2,
	.args = { { "client", "CLIENT", UINT32_MAX }, { "user_id", "USER_ID", INT64_MAX } },
};

static const char *const order_peer[] = {
	"node_id", "index", "origin", "addr", "state", "last_error", NULL,
};

/* peer add NODE_ID HOST:PORT | peer remove NODE_ID|HOST:PORT */
int
cmd_peer(struct opts *o, int argc, char **argv)
{
	const char *sub = argc > 1 ? argv[1] : "";
	int r;

	if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
		peers_usage(stdout, "peer");
		return 0;
	}
	if (strcmp(sub, "add") == 0) {
		r = parse_args("peer add", argc - 1, argv + 1, o, NULL, 2, 2, "NODE_ID HOST:PORT");
		if (r >= 0)
			return r;
		return simple_call(o, "peer_add",
				   json_pack("{s:s, s:s}", "node_id", argv[1 + optind], "addr",
					     argv[1 + optind + 1]),
				   order_peer);
	}
	if (strcmp(sub, "remove") == 0) {
		r = parse_args("peer remove", argc - 1, argv + 1, o, NULL, 1, 1, "NODE_ID or HOST:PORT");
		if (r >= 0)
			return r;
		const char *who = argv[1 + optind];

		/* Node ids have no ':'; an address names an on-demand peer whose id is not known yet. */
		return simple_call(o, "peer_remove",
				   json_pack("{s:s}", strchr(who, ':') ? "addr" : "node_id", who),
				   order_peer);
	}
	return usage_error("peer: expected \"add NODE_ID HOST:PORT\" or \"remove NODE_ID\"%s%s%s",
			   sub[0] ? ", not '" : "", sub, sub[0] ? "'" : "");
}

static const char *const order_reload[] = {
	"file", "added", "removed", "changed", "applied", "not_applied", "failed", NULL,
};

int
cmd_config_reload(struct opts *o, int argc, char **argv)
{
	int r = parse_args("config_reload", argc, argv, o, NULL, 0, 0, NULL);

	if (r >= 0)
		return r;
	return simple_call(o, "config_reload", json_object(), order_reload);
}
