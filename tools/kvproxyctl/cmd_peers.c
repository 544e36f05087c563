/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyctl: peers and the transfers to them — peers, transfers, slowest, cancel. */
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
			"Show the configured peers: address, state (up, connecting, down),\n"
			"connection epoch, connects, disconnects and the last error.\n",
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
