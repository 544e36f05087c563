/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyctl: the node as a whole — status, drain, undrain; and the raw call. */
#include <getopt.h>
#include <poll.h>
#include <string.h>

#include "ctl.h"

bool
node_usage(FILE *f, const char *cmd)
{
	if (strcmp(cmd, "status") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] status [--json]\n"
			"\n"
			"Show the node summary: id, version, uptime, transport, workers,\n"
			"clients, regions, transfers in flight, peers up, draining.\n",
			prog);
	else if (strcmp(cmd, "drain") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] drain [--json] [--no-wait] [--wait SEC]\n"
			"\n"
			"Stop admitting: new submissions complete at once with status \"shutdown\";\n"
			"transfers in flight finish. Waits (up to --wait SEC, default 60) until\n"
			"nothing is in flight, then reports how many submissions were refused.\n"
			"Exit status 3 if transfers are still in flight when the wait ends.\n"
			"\n"
			"  --no-wait  report at once\n",
			prog);
	else if (strcmp(cmd, "undrain") == 0 || strcmp(cmd, "resume") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] undrain [--json]\n"
			"\n"
			"End a drain: new submissions are admitted again.\n",
			prog);
	else if (strcmp(cmd, "call") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] call METHOD [JSON-PARAMS]\n"
			"\n"
			"Send one raw JSON-RPC request and print its result as JSON.\n"
			"JSON-PARAMS defaults to {}. Example:\n"
			"  %s call stats '{\"format\":\"prometheus\"}'\n",
			prog, prog);
	else
		return false;
	return true;
}

static const char *const order_status[] = {
	"node_id", "version",  "pid",   "uptime_s", "transport", "workers", "clients",
	"regions", "inflight", "peers", "peers_up", "draining",  NULL,
};

int
render_status(const struct cmd_opts *co, json_t *res)
{
	(void)co;
	show_text(res, order_status);
	return 0;
}

static const char *const order_drain[] = {
	"draining", "since_s", "inflight", "refused", "idle", NULL,
};

int
cmd_drain(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res;
	int r = parse_args("drain", argc, argv, o, &co, 0, 0, NULL);

	if (r >= 0)
		return r;
	double deadline = now_s() + co.wait_s;

	for (;;) {
		r = rpc_call(o, "drain", json_object(), &res);
		if (r != 0)
			return r;
		if (co.no_wait || json_is_true(json_object_get(res, "idle")) || now_s() >= deadline)
			break;
		json_decref(res);
		poll(NULL, 0, 100);
	}
	bool idle = json_is_true(json_object_get(res, "idle"));

	show(o, res, order_drain);
	json_decref(res);
	if (!co.no_wait && !idle) {
		fprintf(stderr, "%s: drain: transfers still in flight after %.0f s\n", prog,
			co.wait_s);
		return EXIT_CONN;
	}
	return 0;
}

int
cmd_undrain(struct opts *o, int argc, char **argv)
{
	int r = parse_args("undrain", argc, argv, o, NULL, 0, 0, NULL);

	if (r >= 0)
		return r;
	return simple_call(o, "undrain", json_object(), order_drain);
}

/* call prints JSON with or without --json. */
int
render_json(const struct cmd_opts *co, json_t *res)
{
	(void)co;
	print_json(res);
	return 0;
}

int
cmd_call(struct opts *o, int argc, char **argv)
{
	json_t *params;
	json_error_t jerr;
	int r = parse_args("call", argc, argv, o, NULL, 1, 2, "METHOD [JSON-PARAMS]");

	if (r >= 0)
		return r;
	if (argc - optind == 2) {
		/* Any JSON value is sent as given, so scripts can probe bad params too. */
		params = json_loads(argv[optind + 1], JSON_DECODE_ANY, &jerr);
		if (params == NULL)
			return usage_error("call: JSON-PARAMS is not valid JSON: %s", jerr.text);
	} else {
		params = json_object();
	}
	return query(o, argv[optind], params, NULL, render_json);
}
