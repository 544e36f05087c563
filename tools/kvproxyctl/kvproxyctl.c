/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvproxyctl: admin CLI for kvproxyd.
 *
 * Speaks JSON-RPC 2.0 over the daemon's admin UNIX socket (rpc.c).
 * Replies are rendered as aligned text (render.c), or printed as JSON with
 * --json. The commands live in the cmd_*.c files; this file holds main(),
 * option parsing, the command table and the plumbing they share.
 *
 * Exit status: 0 ok; 1 the daemon answered with a JSON-RPC error; 2 usage;
 * 3 cannot connect, timeout, or no usable reply.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ctl.h"

#define DEFAULT_SOCKET  "/run/kvproxy/admin.sock"
#define DEFAULT_TIMEOUT 10.0

const char *prog = "kvproxyctl";

/* ---- usage ---- */

static void
usage_main(FILE *f)
{
	fprintf(f,
		"Usage: %s [-s SOCKET] [--json] [--timeout SEC] COMMAND [ARGS]\n"
		"\n"
		"Admin client for kvproxyd (JSON-RPC 2.0 over its admin UNIX socket).\n"
		"\n"
		"Options:\n"
		"  -s, --socket SOCKET  admin socket (default: $KVPROXY_ADMIN, else %s)\n"
		"  -j, --json           print the result object as JSON\n"
		"  -t, --timeout SEC    give up after SEC seconds (default %.0f)\n"
		"  -h, --help           this help\n"
		"\n"
		"Commands:\n"
		"  status                       node summary\n"
		"  stats [--prometheus]         counters: totals, completions, peers, latency, ...\n"
		"  peers                        peers (configured, added, on demand, inbound) and their state\n"
		"  peer add NODE_ID HOST:PORT   add a peer and connect it at once\n"
		"  peer remove NODE_ID          drain a peer, then close its links and free its slot\n"
		"  transfers [--limit N]        transfers in flight: age, phase, bytes\n"
		"  slowest [--limit N]          slowest recent transfers with their phase breakdown\n"
		"  cancel CLIENT USER_ID        cancel a client's in-flight transfer\n"
		"  drain [--no-wait] [--wait S] stop admitting new transfers, let in-flight ones finish\n"
		"  undrain                      admit new transfers again (alias: resume)\n"
		"  config_get [KEY]             configuration values (runtime knobs marked)\n"
		"  config_set KEY VALUE         change a runtime knob\n"
		"  config_reload                re-read the configuration file (as SIGHUP; alias: reload)\n"
		"  log_level [LEVEL]            show or set the log level\n"
		"  doctor                       transport, NIC/CPU placement and GPU checks, with reasons\n"
		"  watch [--count N]            live view (throughput per peer and RDMA rail, pool, in flight), 1/s\n"
		"  rails                        RDMA rails: placement, traffic, queue pairs, errors\n"
		"  rail_pause RAIL | rail_resume RAIL  move traffic off an RDMA rail, and back\n"
		"  call METHOD [JSON-PARAMS]    raw JSON-RPC call; prints the result as JSON\n"
		"\n"
		"Run '%s COMMAND --help' for a command's options.\n"
		"Exit status: 0 ok, 1 JSON-RPC error, 2 usage, 3 cannot connect or timeout.\n",
		prog, DEFAULT_SOCKET, DEFAULT_TIMEOUT, prog);
}

static void
usage_cmd(FILE *f, const char *cmd)
{
	static bool (*const usages[])(FILE *, const char *) = {
		node_usage,   stats_usage, peers_usage, config_usage,
		doctor_usage, watch_usage, rails_usage,
	};

	for (size_t i = 0; i < sizeof(usages) / sizeof(usages[0]); i++)
		if (usages[i](f, cmd))
			return;
}

int
usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '%s --help'.\n", prog);
	return EXIT_USAGE;
}

/* ---- options ---- */

/* Command-specific options: which command accepts which. */
static const struct {
	int opt;
	const char *cmds;
} cmd_only[] = {
	{ 'p', " stats " }, { 'l', " transfers slowest " },
	{ 'n', " drain " }, { 'w', " drain " },
	{ 'c', " watch " }, { 'i', " watch " },
};

static bool
opt_allowed(int opt, const char *cmd)
{
	char key[40];

	snprintf(key, sizeof(key), " %s ", cmd);
	for (size_t i = 0; i < sizeof(cmd_only) / sizeof(cmd_only[0]); i++)
		if (cmd_only[i].opt == opt)
			return strstr(cmd_only[i].cmds, key) != NULL;
	return true;
}

static bool
parse_num(const char *s, double lo, double hi, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(s, &end);
	return errno == 0 && end != s && *end == '\0' && *out >= lo && *out <= hi;
}

/*
 * Parse a command's own options (--help, --json, and --prometheus for
 * stats); the positional arguments are left at argv[optind..].
 *
 * @return -1 to continue, or an exit status
 */
static int
parse_cmd_opts(const char *cmd, int argc, char **argv, struct opts *o, struct cmd_opts *co)
{
	static const struct option lo[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "json", no_argument, NULL, 'j' },
		{ "prometheus", no_argument, NULL, 'p' },
		{ "limit", required_argument, NULL, 'l' },
		{ "no-wait", no_argument, NULL, 'n' },
		{ "wait", required_argument, NULL, 'w' },
		{ "count", required_argument, NULL, 'c' },
		{ "interval", required_argument, NULL, 'i' },
		{ NULL, 0, NULL, 0 },
	};
	double v;
	int c;

	co->interval = 1.0;
	co->wait_s = 60.0;

	optind = 1;
	/* "+": stop at the first positional so JSON params starting with '-' stay intact. */
	while ((c = getopt_long(argc, argv, "+hj", lo, NULL)) != -1) {
		switch (c) {
		case 'h':
			usage_cmd(stdout, cmd);
			return 0;
		case 'j':
			o->json = true;
			break;
		case 'p':
		case 'l':
		case 'n':
		case 'w':
		case 'c':
		case 'i':
			if (!opt_allowed(c, cmd))
				return usage_error("%s: unknown option %s", cmd, argv[optind - 1]);
			if (c == 'p') {
				co->prometheus = true;
			} else if (c == 'n') {
				co->no_wait = true;
			} else if (c == 'l') {
				if (!parse_num(optarg, 1, 100000, &v) || v != (long)v)
					return usage_error("%s: --limit: expected 1..100000", cmd);
				co->limit = (long)v;
			} else if (c == 'c') {
				if (!parse_num(optarg, 1, 1e9, &v) || v != (long)v)
					return usage_error(
						"%s: --count: expected a positive integer", cmd);
				co->count = (long)v;
			} else if (c == 'i') {
				if (!parse_num(optarg, 0.05, 3600, &v))
					return usage_error("%s: --interval: expected seconds in "
							   "[0.05, 3600]",
							   cmd);
				co->interval = v;
			} else {
				if (!parse_num(optarg, 0, 86400, &v))
					return usage_error(
						"%s: --wait: expected seconds in [0, 86400]", cmd);
				co->wait_s = v;
			}
			break;
		default:
			fprintf(stderr, "Try '%s %s --help'.\n", prog, cmd);
			return EXIT_USAGE;
		}
	}
	return -1;
}

int
parse_args(const char *cmd, int argc, char **argv, struct opts *o, struct cmd_opts *co, int min,
	   int max, const char *what)
{
	struct cmd_opts unused = { 0 };
	int r = parse_cmd_opts(cmd, argc, argv, o, co != NULL ? co : &unused);

	if (r >= 0)
		return r;
	if (max == 0 && optind != argc)
		return usage_error("%s: unexpected argument '%s'", cmd, argv[optind]);
	if (argc - optind < min || argc - optind > max)
		return usage_error("%s: expected %s", cmd, what);
	return -1;
}

/* ---- calls ---- */

int
query(struct opts *o, const char *method, json_t *params, const struct cmd_opts *co,
      render_fn render)
{
	json_t *res;
	int r = rpc_call(o, method, params, &res);

	if (r != 0)
		return r;
	if (o->json)
		print_json(res);
	else
		r = render(co, res);
	json_decref(res);
	return r;
}

/*
 * The params of a query are its options: opt_allowed() lets each command
 * have only those its method takes.
 */
static json_t *
query_params(const struct cmd_opts *co)
{
	if (co->prometheus)
		return json_pack("{s:s}", "format", "prometheus");
	if (co->limit)
		return json_pack("{s:I}", "limit", (json_int_t)co->limit);
	return json_object();
}

/* A command without arguments: its options are its params. */
static int
query_cmd(struct opts *o, const char *cmd, int argc, char **argv, render_fn render)
{
	struct cmd_opts co = { 0 };
	int r = parse_args(cmd, argc, argv, o, &co, 0, 0, NULL);

	if (r >= 0)
		return r;
	return query(o, cmd, query_params(&co), &co, render);
}

/* Run a method with @p params (stolen) and show its result. */
int
simple_call(struct opts *o, const char *method, json_t *params, const char *const *order)
{
	json_t *res;
	int r = rpc_call(o, method, params, &res);

	if (r != 0)
		return r;
	show(o, res, order);
	json_decref(res);
	return 0;
}

/* A non-negative decimal integer argument. */
static bool
parse_id(const char *s, json_int_t max, json_int_t *out)
{
	char *end;

	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);

	if (errno || end == s || *end || s[0] == '-' || v > (unsigned long long)max)
		return false;
	*out = (json_int_t)v;
	return true;
}

/* A command whose positional arguments, checked against @p spec, are its params. */
static int
call_cmd(struct opts *o, const char *cmd, const struct call_spec *spec, int argc, char **argv)
{
	int max = 0, r;

	while (max < (int)(sizeof(spec->args) / sizeof(spec->args[0])) &&
	       spec->args[max].name != NULL)
		max++;
	r = parse_args(cmd, argc, argv, o, NULL, spec->min, max, spec->what);
	if (r >= 0)
		return r;

	json_t *params = json_object();

	for (int i = 0; optind + i < argc; i++) {
		const struct call_arg *a = &spec->args[i];
		const char *s = argv[optind + i];
		json_int_t v = 0;
		json_t *p;

		if (a->max > 0 && !parse_id(s, a->max, &v)) {
			json_decref(params);
			return usage_error("%s: bad %s '%s'", cmd, a->label, s);
		}
		p = a->max > 0 ? json_integer(v) : json_string(s);
		if (p == NULL) {
			/* Not UTF-8: rpc_call() then says it cannot build the request. */
			json_decref(params);
			params = NULL;
			break;
		}
		json_object_set_new(params, a->name, p);
	}
	return simple_call(o, cmd, params, spec->order);
}

/* ---- dispatch ---- */

/* A command runs its own fn, or is a query (render) or a call (call) of the method of its name. */
struct command {
	const char *name;
	int (*fn)(struct opts *o, int argc, char **argv);
	render_fn render;
	const struct call_spec *call;
};

static const struct command commands[] = {
	{ "status", .render = render_status },
	{ "stats", .render = render_stats },
	{ "peers", .render = render_peers },
	{ "peer", cmd_peer },
	{ "transfers", .render = render_transfers },
	{ "slowest", .render = render_slowest },
	{ "cancel", .call = &cancel_spec },
	{ "drain", cmd_drain },
	{ "undrain", cmd_undrain },
	{ "resume", cmd_undrain },
	{ "config_get", cmd_config_get },
	{ "config_set", .call = &config_set_spec },
	{ "config_reload", cmd_config_reload },
	{ "reload", cmd_config_reload },
	{ "log_level", .call = &log_level_spec },
	{ "doctor", .render = render_doctor },
	{ "watch", cmd_watch },
	{ "call", cmd_call },
	{ "rails", .render = render_rails },
	{ "rail_pause", .call = &rail_spec },
	{ "rail_resume", .call = &rail_spec },
	{ NULL },
};

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .timeout_s = DEFAULT_TIMEOUT };
	const char *env = getenv("KVPROXY_ADMIN");
	char *end;
	int c;

	o.socket = env != NULL && env[0] != '\0' ? env : DEFAULT_SOCKET;
	/* A vanished daemon must become an error return, not a signal. */
	signal(SIGPIPE, SIG_IGN);

	while ((c = getopt_long(argc, argv, "+s:jt:h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			o.socket = optarg;
			break;
		case 'j':
			o.json = true;
			break;
		case 't':
			errno = 0;
			o.timeout_s = strtod(optarg, &end);
			if (errno != 0 || end == optarg || *end != '\0' || !(o.timeout_s > 0) ||
			    o.timeout_s > 86400)
				return usage_error("--timeout: expected seconds in (0, 86400], got "
						   "'%s'",
						   optarg);
			break;
		case 'h':
			usage_main(stdout);
			return 0;
		default:
			fprintf(stderr, "Try '%s --help'.\n", prog);
			return EXIT_USAGE;
		}
	}
	if (optind >= argc)
		return usage_error("missing COMMAND");

	const char *name = argv[optind];

	if (strcmp(name, "help") == 0) {
		if (optind + 1 < argc)
			usage_cmd(stdout, argv[optind + 1]);
		else
			usage_main(stdout);
		return 0;
	}
	for (const struct command *cmd = commands; cmd->name != NULL; cmd++) {
		if (strcmp(cmd->name, name) != 0)
			continue;
		argc -= optind;
		argv += optind;
		if (cmd->render != NULL)
			return query_cmd(&o, name, argc, argv, cmd->render);
		if (cmd->call != NULL)
			return call_cmd(&o, name, cmd->call, argc, argv);
		return cmd->fn(&o, argc, argv);
	}
	return usage_error("unknown command '%s'", name);
}
