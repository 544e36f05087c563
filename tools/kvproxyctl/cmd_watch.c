/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyctl: watch, a live view refreshed from status and stats. */
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"

bool
watch_usage(FILE *f, const char *cmd)
{
	if (strcmp(cmd, "watch") != 0)
		return false;
	fprintf(f,
		"Usage: %s [GLOBAL-OPTIONS] watch [--count N] [--interval SEC]\n"
		"\n"
		"Refresh a compact live view: transfers in flight, staging pool use,\n"
		"completions, per peer the throughput (from byte deltas between\n"
		"refreshes) in both directions, and per worker lcore its clients,\n"
		"transfers in flight, throughput and how busy it was (time doing work\n"
		"over time; blocked waits count as idle). Ctrl-C stops it.\n"
		"\n"
		"  --count N       stop after N refreshes\n"
		"  --interval SEC  time between refreshes (default 1)\n",
		prog);
	return true;
}

struct peer_sample {
	char node_id[64];
	double tx, rx, txx, rxx; /* bytes, transfers */
};

#define WATCH_WORKERS 64

static double num(json_t *o, const char *key);

/* One row per worker: clients, in flight, throughput and busy share since the last refresh. */
static void
watch_workers(json_t *stats, double dt)
{
	static double prev_busy[WATCH_WORKERS], prev_idle[WATCH_WORKERS];
	static double prev_tx[WATCH_WORKERS], prev_rx[WATCH_WORKERS];
	json_t *ws = json_object_get(stats, "workers"), *w;
	size_t i;

	if (!json_is_array(ws) || json_array_size(ws) == 0)
		return;
	printf("%-6s %5s %7s %8s %10s %10s %6s\n", "WORKER", "LCORE", "CLIENTS", "INFLIGHT",
	       "TX Gbit/s", "RX Gbit/s", "BUSY");
	json_array_foreach(ws, i, w)
	{
		if (i >= WATCH_WORKERS)
			break;
		double busy = num(w, "busy_ns"), idle = num(w, "idle_ns");
		double tx = num(w, "tx_bytes"), rx = num(w, "rx_bytes");

		printf("%-6zu %5.0f %7.0f %8.0f ", i, num(w, "lcore"), num(w, "clients"),
		       num(w, "inflight"));
		double db = busy - prev_busy[i], di = idle - prev_idle[i];
		if (dt > 0)
			printf("%10.3f %10.3f %5.0f%%\n", (tx - prev_tx[i]) * 8 / dt / 1e9,
			       (rx - prev_rx[i]) * 8 / dt / 1e9, db + di > 0 ? 100 * db / (db + di) : 0);
		else
			printf("%10s %10s %6s\n", "-", "-", "-");
		prev_busy[i] = busy;
		prev_idle[i] = idle;
		prev_tx[i] = tx;
		prev_rx[i] = rx;
	}
}

static double
num(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_number(v) ? json_number_value(v) : 0;
}

static void
human_bytes(double b, char *buf, size_t len)
{
	static const char *const u[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	unsigned i = 0;

	while (b >= 1024 && i + 1 < sizeof(u) / sizeof(u[0])) {
		b /= 1024;
		i++;
	}
	snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

int
cmd_watch(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	struct peer_sample prev[64];
	size_t nprev = 0;
	double prev_up = -1, prev_done = 0;
	bool tty = isatty(STDOUT_FILENO);
	int r = parse_args("watch", argc, argv, o, &co, 0, 0, NULL);

	if (r >= 0)
		return r;
	for (long k = 0; co.count == 0 || k < co.count; k++) {
		json_t *st, *stat;

		if (k > 0)
			poll(NULL, 0, (int)(co.interval * 1000));
		r = rpc_call(o, "status", json_object(), &st);
		if (r != 0)
			return r;
		r = rpc_call(o, "stats", json_object(), &stat);
		if (r != 0) {
			json_decref(st);
			return r;
		}
		json_t *tot = json_object_get(stat, "totals"),
		       *stage = json_object_get(stat, "staging");
		double up = num(stat, "uptime_s"), dt = prev_up >= 0 ? up - prev_up : 0;
		double done = num(tot, "xfers_done");
		char b1[32], b2[32];

		if (tty)
			printf("\033[H\033[2J");
		else if (k > 0)
			printf("\n");
		printf("%s  node %s  transport %s  up %.0f s%s\n", prog,
		       json_string_value(json_object_get(st, "node_id")),
		       json_string_value(json_object_get(st, "transport")), up,
		       json_is_true(json_object_get(st, "draining")) ? "  DRAINING" : "");
		printf("inflight %.0f/%.0f  staging %.0f/%.0f buffers (high %.0f)  clients %.0f  "
		       "done %.0f",
		       num(tot, "inflight"), num(tot, "inflight_max"), num(stage, "in_use"),
		       num(stage, "buffers"), num(stage, "high_water"), num(st, "clients"), done);
		if (dt > 0)
			printf(" (%.0f/s)", (done - prev_done) / dt);
		printf("\n%-16s %-10s %10s %10s %8s %8s %11s %11s\n", "PEER", "STATE", "TX Gbit/s",
		       "RX Gbit/s", "TX x/s", "RX x/s", "TX TOTAL", "RX TOTAL");

		struct peer_sample cur[64];
		size_t ncur = 0, i;
		json_t *p;

		json_array_foreach(json_object_get(stat, "peers"), i, p)
		{
			if (ncur == 64)
				break;
			struct peer_sample *c = &cur[ncur++], *old = NULL;

			snprintf(c->node_id, sizeof(c->node_id), "%s",
				 json_string_value(json_object_get(p, "node_id")));
			c->tx = num(p, "tx_bytes");
			c->rx = num(p, "rx_bytes");
			c->txx = num(p, "tx_xfers");
			c->rxx = num(p, "rx_xfers");
			for (size_t j = 0; j < nprev; j++)
				if (strcmp(prev[j].node_id, c->node_id) == 0)
					old = &prev[j];
			human_bytes(c->tx, b1, sizeof(b1));
			human_bytes(c->rx, b2, sizeof(b2));
			printf("%-16s %-10s ", c->node_id,
			       json_string_value(json_object_get(p, "state")));
			if (old && dt > 0)
				printf("%10.3f %10.3f %8.0f %8.0f",
				       (c->tx - old->tx) * 8 / dt / 1e9,
				       (c->rx - old->rx) * 8 / dt / 1e9, (c->txx - old->txx) / dt,
				       (c->rxx - old->rxx) / dt);
			else
				printf("%10s %10s %8s %8s", "-", "-", "-", "-");
			printf(" %11s %11s\n", b1, b2);
		}
		watch_workers(stat, dt);
		watch_rails(stat, dt);
		memcpy(prev, cur, sizeof(cur[0]) * ncur);
		nprev = ncur;
		prev_up = up;
		prev_done = done;
		fflush(stdout);
		json_decref(st);
		json_decref(stat);
	}
	return 0;
}
