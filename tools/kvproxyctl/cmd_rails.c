/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyctl: RDMA rails — rails, rail_pause, rail_resume. */
#include <string.h>

#include "ctl.h"

static const char *const cols_rails[] = {
	"rail", "dev", "port", "paused", "qps_up", "tx_bytes", "tx_writes", "rx_notices",
	"qp_resets", "wc_errors", "gid_index", "mtu", "numa_node", "pci", NULL,
};

bool
rails_usage(FILE *f, const char *cmd)
{
	if (strcmp(cmd, "rails") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] rails [--json]\n"
			"\n"
			"The RDMA rails (one verbs port each) this node uses: device, port, GID\n"
			"index, MTU, PCI placement, whether paused, send QPs up, bytes and WRITEs\n"
			"sent through it, completion notices received, QP resets and work-\n"
			"completion errors; then memory registrations and errors by status.\n",
			prog);
	else if (strcmp(cmd, "rail_pause") == 0 || strcmp(cmd, "rail_resume") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] %s [--json] RAIL\n"
			"\n"
			"rail_pause: no new RDMA WRITE goes through rail RAIL (as listed by\n"
			"'rails'); WRITEs already posted complete, later ones stripe over the\n"
			"remaining rails (over TCP when none is left). rail_resume undoes it.\n",
			prog, cmd);
	else
		return false;
	return true;
}

int
render_rails(const struct cmd_opts *co, json_t *res)
{
	(void)co;
	if (show_table(res, "rails", cols_rails)) {
		json_object_del(res, "rails");
		print_object(res, NULL, 0);
	}
	return 0;
}

static const char *const order_rail_set[] = { "rail", "paused", "active_rails", NULL };

/* rail_pause and rail_resume. */
const struct call_spec rail_spec = {
	.what = "RAIL",
	.min = 1,
	.args = { { "rail", "RAIL", 255 } },
	.order = order_rail_set,
};

void
watch_rails(json_t *stats, double dt)
{
	static double prev_tx[32];
	json_t *rails = json_object_get(json_object_get(stats, "rdma"), "rails"), *r;
	size_t i;

	if (!json_is_array(rails) || json_array_size(rails) == 0)
		return;
	printf("%-5s %-12s %-6s %4s %10s %10s %9s %7s\n", "RAIL", "DEVICE", "STATE", "QPS",
	       "TX Gbit/s", "TX GiB", "QP RESETS", "WC ERR");
	json_array_foreach(rails, i, r)
	{
		json_int_t rail = json_integer_value(json_object_get(r, "rail"));
		double tx = (double)json_integer_value(json_object_get(r, "tx_bytes"));
		char dev[32];

		snprintf(dev, sizeof(dev), "%s/%d", json_string_value(json_object_get(r, "dev")),
			 (int)json_integer_value(json_object_get(r, "port")));
		printf("%-5d %-12s %-6s %4d ", (int)rail, dev,
		       json_is_true(json_object_get(r, "paused")) ? "paused" : "active",
		       (int)json_integer_value(json_object_get(r, "qps_up")));
		if (dt > 0 && rail >= 0 && rail < 32)
			printf("%10.3f", (tx - prev_tx[rail]) * 8 / dt / 1e9);
		else
			printf("%10s", "-");
		printf(" %10.2f %9d %7d\n", tx / (1 << 30),
		       (int)json_integer_value(json_object_get(r, "qp_resets")),
		       (int)json_integer_value(json_object_get(r, "wc_errors")));
		if (rail >= 0 && rail < 32)
			prev_tx[rail] = tx;
	}
}
