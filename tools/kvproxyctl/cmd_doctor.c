/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyctl: doctor, the preflight report. */
#include <string.h>

#include "ctl.h"

bool
doctor_usage(FILE *f, const char *cmd)
{
	if (strcmp(cmd, "doctor") != 0)
		return false;
	fprintf(f,
		"Usage: %s [GLOBAL-OPTIONS] doctor [--json]\n"
		"\n"
		"Preflight report: the transport in use and why, the RDMA probe, the\n"
		"network interfaces that carry peer traffic with their PCI device, NUMA\n"
		"node and device-local CPUs, whether each worker lcore is local to them,\n"
		"GPUs, and with tcp.zerocopy how much the kernel copied anyway.\n"
		"Warnings say what to change.\n",
		prog);
	return true;
}

int
render_doctor(const struct cmd_opts *co, json_t *res)
{
	json_t *checks = json_object_get(res, "checks"), *c;
	size_t i;

	(void)co;
	if (!json_is_array(checks)) {
		print_json(res);
		return 0;
	}
	/* Checks first, as sentences; the facts behind them follow. */
	json_array_foreach(checks, i, c)
	{
		const char *res_s = json_string_value(json_object_get(c, "result"));

		printf("[%-7s] %s: %s\n", res_s ? res_s : "?",
		       json_string_value(json_object_get(c, "check")),
		       json_string_value(json_object_get(c, "detail")));
	}
	json_object_del(res, "checks");
	printf("\n");
	print_object(res, NULL, 0);
	return 0;
}
