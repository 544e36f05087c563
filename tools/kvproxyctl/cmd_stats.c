/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyctl: stats, and the layout of its sections wherever they appear. */
#include <string.h>

#include "ctl.h"
#include "kvp_rings.h"

bool
stats_usage(FILE *f, const char *cmd)
{
	if (strcmp(cmd, "stats") != 0)
		return false;
	fprintf(f,
		"Usage: %s [GLOBAL-OPTIONS] stats [--json] [--prometheus]\n"
		"\n"
		"Show counters: totals, completions by status, and tables per peer,\n"
		"per client and per worker lcore.\n"
		"\n"
		"  --prometheus  print the Prometheus text exposition format, verbatim\n",
		prog);
	return true;
}

/* Preferred order of keys and columns; fields not listed follow in reply order. */
static const char *const order_stats[] = {
	"node_id", "uptime_s", "totals",  "completions", "peers",
	"latency", "clients",  "workers", NULL,
};
static const char *const order_totals[] = {
	"tx_bytes",     "rx_bytes",  "xfers_submitted", "xfers_done",
	"xfers_landed", "frames_tx", "frames_rx",       NULL,
};
/* Completions by status, in status order: the names are lib/rings' (kvp_status_str()). */
static const char *order_completions[KVP_STATUS_MAX + 1];
static const char *const cols_peers[] = {
	"node_id",  "index",    "origin",   "addr",        "state",      "epoch",
	"tx_bytes", "rx_bytes", "tx_xfers", "rx_xfers",    "connects",   "disconnects",
	"bad_frames", "last_error", NULL,
};
static const char *const cols_clients[] = {
	"id",	    "pid",	"worker",   "sq_depth", "cq_depth", "inflight", "regions",
	"cq_overflow", "admitted", "waited", "refused", NULL,
};
static const char *const cols_workers[] = {
	"worker",   "lcore",    "clients",  "inflight",	      "links_up",      "tx_bytes",
	"rx_bytes", "busy_ns",	"idle_ns",  "sleeps",	      "idle_spin_ns",  "loops",
	"xfers_submitted", "xfers_landed", "landings_forwarded", "messages_lost", NULL,
};
static const char *const cols_latency[] = {
	"peer", "direction", "phase", "count", "mean_us", "p50_us", "p99_us", "sum_us", NULL,
};

struct order_map {
	const char *name;
	const char *const *order;
};

/* Nested sections and tables by key name, in any result. */
static const struct order_map section_orders[] = {
	{ "totals", order_totals },
	{ "completions", order_completions },
	{ "peers", cols_peers },
	{ "clients", cols_clients },
	{ "workers", cols_workers },
	{ "latency", cols_latency },
	{ NULL, NULL },
};

const char *const *
section_order(const char *name)
{
	if (order_completions[0] == NULL)
		for (int s = 0; s < KVP_STATUS_MAX; s++)
			order_completions[s] = kvp_status_str(s);
	for (const struct order_map *m = section_orders; m->name != NULL; m++)
		if (strcmp(m->name, name) == 0)
			return m->order;
	return NULL;
}

int
render_stats(const struct cmd_opts *co, json_t *res)
{
	if (!co->prometheus) {
		show_text(res, order_stats);
		return 0;
	}
	json_t *text = json_object_get(res, "text");

	if (!json_is_string(text)) {
		fprintf(stderr, "%s: stats reply has no \"text\" string\n", prog);
		return EXIT_CONN;
	}
	fwrite(json_string_value(text), 1, json_string_length(text), stdout);
	return 0;
}
