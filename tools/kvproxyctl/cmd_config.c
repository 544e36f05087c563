/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyctl: configuration — config_get, config_set, log_level. */
#include <getopt.h>
#include <string.h>

#include "ctl.h"

bool
config_usage(FILE *f, const char *cmd)
{
	if (strcmp(cmd, "config_get") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] config_get [--json] [KEY]\n"
			"\n"
			"Without KEY, every configuration key with its value; RUNTIME says\n"
			"whether config_set can change it. With KEY, that key, its bounds and,\n"
			"for a key fixed at start, why. Secrets show as \"(set)\".\n",
			prog);
	else if (strcmp(cmd, "config_set") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] config_set [--json] KEY VALUE\n"
			"\n"
			"Change a runtime knob, e.g. log_level, timeouts.default_ms,\n"
			"timeouts.admission_ms, timeouts.admin_ms, timeouts.admin_idle_ms,\n"
			"poll.busy, poll.idle_us, poll.idle_max_us, stats.enabled, stats.file,\n"
			"stats.interval_ms, stats.slowest_window_s. VALUE is checked against\n"
			"the same bounds as the configuration file. Keys fixed at start are\n"
			"refused with the reason (exit status 1).\n",
			prog);
	else if (strcmp(cmd, "log_level") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] log_level [--json] [LEVEL]\n"
			"\n"
			"Show the log level of the kvp.* log types, or set it to LEVEL: emerg,\n"
			"alert, crit, err, warning, notice, info or debug.\n",
			prog);
	else
		return false;
	return true;
}

static const char *const cols_config[] = { "key", "value", "runtime", NULL };
static const char *const order_config_key[] = { "key", "value", "runtime",  "min",
						"max", "fixed", "previous", NULL };

static int
render_config(const struct cmd_opts *co, json_t *res)
{
	(void)co;
	show_table(res, "config", cols_config);
	return 0;
}

int
cmd_config_get(struct opts *o, int argc, char **argv)
{
	int r = parse_args("config_get", argc, argv, o, NULL, 0, 1, "at most one KEY");

	if (r >= 0)
		return r;
	if (argc - optind == 1)
		return simple_call(o, "config_get", json_pack("{s:s}", "key", argv[optind]),
				   order_config_key);
	return query(o, "config_get", json_object(), NULL, render_config);
}

/* The daemon parses VALUE with the key's own rules (integer, boolean, name). */
const struct call_spec config_set_spec = {
	.what = "KEY VALUE",
	.min = 2,
	.args = { { "key", "KEY", 0 }, { "value", "VALUE", 0 } },
	.order = order_config_key,
};

const struct call_spec log_level_spec = {
	.what = "at most one LEVEL",
	.args = { { "level", "LEVEL", 0 } },
};
