/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvproxyctl: admin CLI for kvproxyd.
 *
 * Speaks JSON-RPC 2.0 over the daemon's admin UNIX stream socket, one JSON
 * object per line: one request, one reply, then the connection is closed.
 * Replies are rendered as aligned text, or printed as JSON with --json.
 * Unknown result fields are rendered generically, so the daemon can add
 * fields without breaking this tool.
 *
 * Exit status: 0 ok; 1 the daemon answered with a JSON-RPC error; 2 usage;
 * 3 cannot connect, timeout, or no usable reply.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ctl.h"

#define DEFAULT_SOCKET  "/run/kvproxy/admin.sock"
#define DEFAULT_TIMEOUT 10.0
/* A reply larger than this is treated as a broken daemon, not buffered forever. */
#define REPLY_MAX       (64u << 20)
#define REQUEST_ID      1

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
		"  peers                        configured peers and their connection state\n"
		"  transfers [--limit N]        transfers in flight: age, phase, bytes\n"
		"  slowest [--limit N]          slowest recent transfers with their phase breakdown\n"
		"  cancel CLIENT USER_ID        cancel a client's in-flight transfer\n"
		"  drain [--no-wait] [--wait S] stop admitting new transfers, let in-flight ones finish\n"
		"  undrain                      admit new transfers again (alias: resume)\n"
		"  config_get [KEY]             configuration values (runtime knobs marked)\n"
		"  config_set KEY VALUE         change a runtime knob\n"
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
	if (rails_usage(f, cmd))
		return;
	if (strcmp(cmd, "status") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] status [--json]\n"
			"\n"
			"Show the node summary: id, version, uptime, transport, workers,\n"
			"clients, regions, transfers in flight, peers up, draining.\n",
			prog);
	else if (strcmp(cmd, "stats") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] stats [--json] [--prometheus]\n"
			"\n"
			"Show counters: totals, completions by status, and tables per peer,\n"
			"per client and per worker lcore.\n"
			"\n"
			"  --prometheus  print the Prometheus text exposition format, verbatim\n",
			prog);
	else if (strcmp(cmd, "peers") == 0)
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
	else if (strcmp(cmd, "config_get") == 0)
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
			"poll.busy, poll.idle_us, stats.enabled, stats.file, stats.interval_ms,\n"
			"stats.slowest_window_s. VALUE is checked against the same bounds as\n"
			"the configuration file. Keys fixed at start are refused with the\n"
			"reason (exit status 1).\n",
			prog);
	else if (strcmp(cmd, "log_level") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] log_level [--json] [LEVEL]\n"
			"\n"
			"Show the log level of the kvp.* log types, or set it to LEVEL: emerg,\n"
			"alert, crit, err, warning, notice, info or debug.\n",
			prog);
	else if (strcmp(cmd, "doctor") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] doctor [--json]\n"
			"\n"
			"Preflight report: the transport in use and why, the RDMA probe, the\n"
			"network interfaces that carry peer traffic with their PCI device, NUMA\n"
			"node and device-local CPUs, whether each worker lcore is local to them,\n"
			"and GPUs. Warnings say what to change.\n",
			prog);
	else if (strcmp(cmd, "watch") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] watch [--count N] [--interval SEC]\n"
			"\n"
			"Refresh a compact live view: transfers in flight, staging pool use,\n"
			"completions, and per peer the throughput (from byte deltas between\n"
			"refreshes) in both directions. Ctrl-C stops it.\n"
			"\n"
			"  --count N       stop after N refreshes\n"
			"  --interval SEC  time between refreshes (default 1)\n",
			prog);
	else if (strcmp(cmd, "call") == 0)
		fprintf(f,
			"Usage: %s [GLOBAL-OPTIONS] call METHOD [JSON-PARAMS]\n"
			"\n"
			"Send one raw JSON-RPC request and print its result as JSON.\n"
			"JSON-PARAMS defaults to {}. Example:\n"
			"  %s call stats '{\"format\":\"prometheus\"}'\n",
			prog, prog);
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

/* ---- transport: one request line out, one reply line back ---- */

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/** Milliseconds left until @p deadline for poll(), at least 0. */
static int
ms_left(double deadline)
{
	double left = deadline - now_s();

	if (left <= 0)
		return 0;
	if (left > 3600)
		return 3600 * 1000;
	/* Round up so a positive remainder never becomes a zero poll timeout. */
	return (int)(left * 1000.0) + 1;
}

/*
 * Connect within the deadline. A non-blocking connect on a UNIX socket
 * either completes at once or fails with EAGAIN when the listen backlog is
 * full; the latter is retried until the deadline.
 */
static int
connect_admin(const char *path, double deadline)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "%s: socket path too long: %s\n", prog, path);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);

	for (;;) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0) {
			fprintf(stderr, "%s: socket: %s\n", prog, strerror(errno));
			return -errno;
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		int err = errno;

		close(fd);
		if (err != EAGAIN || now_s() >= deadline) {
			fprintf(stderr, "%s: cannot connect to %s: %s\n", prog, path,
				err == EAGAIN ? "timed out (backlog full)" : strerror(err));
			return -err;
		}
		/* Backlog full: nothing to poll on for a UNIX connect; retry shortly. */
		poll(NULL, 0, 10);
	}
}

static int
send_all(int fd, const char *buf, size_t len, double deadline, const char *path)
{
	while (len > 0) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n > 0) {
			buf += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int timeout = ms_left(deadline);

			if (timeout == 0 || poll(&p, 1, timeout) == 0) {
				fprintf(stderr, "%s: %s: timed out sending the request\n", prog,
					path);
				return -ETIMEDOUT;
			}
			continue;
		}
		fprintf(stderr, "%s: %s: send: %s\n", prog, path, strerror(errno));
		return -errno;
	}
	return 0;
}

/** Read one '\n'-terminated line; *out is NUL-terminated without the newline. */
static int
recv_line(int fd, char **out, size_t *outlen, double deadline, const char *path)
{
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap);

	if (buf == NULL)
		return -ENOMEM;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int timeout = ms_left(deadline);
		int r = timeout > 0 ? poll(&p, 1, timeout) : 0;

		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0) {
			fprintf(stderr, "%s: %s: timed out waiting for the reply\n", prog, path);
			free(buf);
			return -ETIMEDOUT;
		}
		if (len + 1 >= cap) {
			if (cap >= REPLY_MAX) {
				fprintf(stderr, "%s: %s: reply longer than %u bytes\n", prog, path,
					REPLY_MAX);
				free(buf);
				return -EMSGSIZE;
			}
			char *nb = realloc(buf, cap * 2);

			if (nb == NULL) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);

		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0) {
			fprintf(stderr, "%s: %s: recv: %s\n", prog, path, strerror(errno));
			free(buf);
			return -errno;
		}
		if (n == 0) {
			fprintf(stderr, "%s: %s: connection closed before a complete reply\n", prog,
				path);
			free(buf);
			return -ECONNRESET;
		}
		char *nl = memchr(buf + len, '\n', (size_t)n);

		len += (size_t)n;
		if (nl != NULL) {
			*nl = '\0';
			*out = buf;
			*outlen = (size_t)(nl - buf);
			return 0;
		}
	}
}

/*
 * Send @p method with @p params (reference stolen) and return the result.
 *
 * @return 0 with *result set (caller decrefs); EXIT_RPC_ERROR after printing
 *   the error; EXIT_CONN after printing why there is no usable reply
 */
int
rpc_call(const struct opts *o, const char *method, json_t *params, json_t **result)
{
	double deadline = now_s() + o->timeout_s;
	json_t *req = json_pack("{s:s, s:i, s:s, s:o}", "jsonrpc", "2.0", "id", REQUEST_ID,
				"method", method, "params", params);
	char *line = NULL, *reply = NULL;
	size_t reply_len = 0;
	json_t *rep = NULL;
	json_error_t jerr;
	int fd, ret = EXIT_CONN;

	if (req == NULL) {
		fprintf(stderr, "%s: cannot build the request\n", prog);
		return EXIT_CONN;
	}
	line = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	if (line == NULL)
		return EXIT_CONN;
	/* json_dumps never emits a raw newline, so one line is one request. */
	size_t len = strlen(line);
	char *framed = realloc(line, len + 2);

	if (framed == NULL)
		goto err_free_line;
	line = framed;
	line[len] = '\n';
	line[len + 1] = '\0';

	fd = connect_admin(o->socket, deadline);
	if (fd < 0)
		goto err_free_line;
	if (send_all(fd, line, len + 1, deadline, o->socket) < 0)
		goto err_close;
	if (recv_line(fd, &reply, &reply_len, deadline, o->socket) < 0)
		goto err_close;

	rep = json_loadb(reply, reply_len, 0, &jerr);
	if (rep == NULL) {
		fprintf(stderr, "%s: %s: reply is not JSON: %s\n", prog, o->socket, jerr.text);
		goto err_free_reply;
	}
	if (!json_is_object(rep) || !json_is_string(json_object_get(rep, "jsonrpc")) ||
	    strcmp(json_string_value(json_object_get(rep, "jsonrpc")), "2.0") != 0) {
		fprintf(stderr, "%s: %s: reply is not a JSON-RPC 2.0 object\n", prog, o->socket);
		goto err_decref;
	}

	json_t *err = json_object_get(rep, "error");
	json_t *res = json_object_get(rep, "result");
	json_t *id = json_object_get(rep, "id");

	if (err != NULL) {
		json_t *code = json_object_get(err, "code");
		json_t *msg = json_object_get(err, "message");

		if (!json_is_integer(code) || !json_is_string(msg)) {
			fprintf(stderr, "%s: %s: malformed error object in reply\n", prog,
				o->socket);
			goto err_decref;
		}
		/* An error may carry a null id (e.g. the daemon could not parse us). */
		fprintf(stderr, "error %" JSON_INTEGER_FORMAT ": %s\n", json_integer_value(code),
			json_string_value(msg));
		json_t *data = json_object_get(err, "data");

		if (data != NULL) {
			char *d = json_dumps(data, JSON_COMPACT | JSON_ENCODE_ANY);

			if (d != NULL)
				fprintf(stderr, "  data: %s\n", d);
			free(d);
		}
		ret = EXIT_RPC_ERROR;
		goto err_decref;
	}
	if (res == NULL) {
		fprintf(stderr, "%s: %s: reply has neither result nor error\n", prog, o->socket);
		goto err_decref;
	}
	if (!json_is_integer(id) || json_integer_value(id) != REQUEST_ID) {
		fprintf(stderr, "%s: %s: reply id does not match the request\n", prog, o->socket);
		goto err_decref;
	}
	*result = json_incref(res);
	ret = 0;

err_decref:
	json_decref(rep);
err_free_reply:
	free(reply);
err_close:
	close(fd);
err_free_line:
	free(line);
	return ret;
}

/* ---- rendering ---- */

/** Text for one value in a table cell or a key/value line; caller frees. */
static char *
value_str(const json_t *v)
{
	char *s = NULL;

	switch (json_typeof(v)) {
	case JSON_STRING:
		s = strdup(json_string_length(v) > 0 ? json_string_value(v) : "-");
		break;
	case JSON_INTEGER:
		if (asprintf(&s, "%" JSON_INTEGER_FORMAT, json_integer_value(v)) < 0)
			s = NULL;
		break;
	case JSON_REAL:
		if (asprintf(&s, "%.6g", json_real_value(v)) < 0)
			s = NULL;
		break;
	case JSON_TRUE:
		s = strdup("true");
		break;
	case JSON_FALSE:
		s = strdup("false");
		break;
	case JSON_NULL:
		s = strdup("-");
		break;
	default:
		s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		break;
	}
	return s != NULL ? s : strdup("?");
}

static bool
ends_with(const char *s, const char *suffix)
{
	size_t ls = strlen(s), lx = strlen(suffix);

	return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

/** Readable annotation for some well-known numeric keys ("" if none). */
static void
annotate(const char *key, const json_t *v, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };

	buf[0] = '\0';
	if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 9.2e18)
		return;
	/* Whole units are enough for these notes; uptime may come as a real. */
	long long n = (long long)json_number_value(v);

	if ((ends_with(key, "_bytes") || strcmp(key, "bytes") == 0) && n >= 1024) {
		double x = (double)n;
		unsigned u = 0;

		x /= 1024.0;
		while (x >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
			x /= 1024.0;
			u++;
		}
		snprintf(buf, len, " (%.1f %s)", x, units[u]);
	} else if (ends_with(key, "uptime_s") && n >= 60) {
		long long d = n / 86400, h = n / 3600 % 24, m = n / 60 % 60, sec = n % 60;

		if (d > 0)
			snprintf(buf, len, " (%lldd%02lldh%02lldm)", d, h, m);
		else if (h > 0)
			snprintf(buf, len, " (%lldh%02lldm%02llds)", h, m, sec);
		else
			snprintf(buf, len, " (%lldm%02llds)", m, sec);
	}
}

/** True if @p v is a non-empty array of objects, or an empty array (a table). */
bool
is_table(const json_t *v)
{
	if (!json_is_array(v))
		return false;
	for (size_t i = 0; i < json_array_size(v); i++)
		if (!json_is_object(json_array_get(v, i)))
			return false;
	return true;
}

/* Preferred order of keys and columns; fields not listed follow in reply order. */
static const char *const order_status[] = {
	"node_id", "version",  "pid",   "uptime_s", "transport", "workers", "clients",
	"regions", "inflight", "peers", "peers_up", "draining",  NULL,
};
static const char *const order_stats[] = {
	"node_id", "uptime_s", "totals",  "completions", "peers",
	"latency", "clients",  "workers", NULL,
};
static const char *const order_totals[] = {
	"tx_bytes",     "rx_bytes",  "xfers_submitted", "xfers_done",
	"xfers_landed", "frames_tx", "frames_rx",       NULL,
};
static const char *const order_completions[] = {
	"ok",       "invalid", "no-buffers", "timeout", "peer",
	"canceled", "remote",  "shutdown",   "no-peer", NULL,
};
static const char *const cols_peers[] = {
	"node_id",  "index",    "addr",     "state",       "epoch",      "tx_bytes",   "rx_bytes",
	"tx_xfers", "rx_xfers", "connects", "disconnects", "bad_frames", "last_error", NULL,
};
static const char *const cols_clients[] = {
	"id", "pid", "sq_depth", "cq_depth", "inflight", "regions", "cq_overflow", NULL,
};
static const char *const cols_workers[] = {
	"lcore", "loops", "busy_ns", "idle_ns", "sleeps", NULL,
};
static const char *const cols_latency[] = {
	"peer", "direction", "phase", "count", "mean_us", "p50_us", "p99_us", "sum_us", NULL,
};

struct order_map {
	const char *name;
	const char *const *order;
};

/* Nested sections and tables by key name. */
static const struct order_map section_orders[] = {
	{ "totals", order_totals },
	{ "completions", order_completions },
	{ "peers", cols_peers },
	{ "clients", cols_clients },
	{ "workers", cols_workers },
	{ "latency", cols_latency },
	{ NULL, NULL },
};

static const char *const *
order_for(const char *name)
{
	for (const struct order_map *m = section_orders; m->name != NULL; m++)
		if (strcmp(m->name, name) == 0)
			return m->order;
	return NULL;
}

/*
 * Keys of @p obj in display order: those in @p order that are present, then
 * the rest in the order the daemon sent them. Returns a NULL-terminated
 * array (caller frees; the strings belong to @p obj).
 */
static const char **
ordered_keys(json_t *obj, const char *const *order)
{
	size_t n = json_object_size(obj), k = 0;
	const char **keys = calloc(n + 1, sizeof(*keys));

	if (keys == NULL)
		return NULL;
	for (size_t i = 0; order != NULL && order[i] != NULL; i++)
		if (json_object_get(obj, order[i]) != NULL)
			keys[k++] = json_object_iter_key(json_object_iter_at(obj, order[i]));
	for (void *it = json_object_iter(obj); it != NULL; it = json_object_iter_next(obj, it)) {
		const char *key = json_object_iter_key(it);
		bool listed = false;

		for (size_t i = 0; order != NULL && order[i] != NULL; i++)
			if (strcmp(order[i], key) == 0)
				listed = true;
		if (!listed && k < n)
			keys[k++] = key;
	}
	keys[k] = NULL;
	return keys;
}

/** Print an array of objects as an aligned table; columns are the union of keys. */
void
print_table(json_t *rows, const char *const *order, int indent)
{
	size_t nrows = json_array_size(rows), ncols = 0, i, c;
	json_t *all = json_object(), *row;
	const char **cols = NULL;
	char ***cells = NULL;
	size_t *width = NULL;
	bool *right = NULL;

	if (nrows == 0) {
		printf("%*s(none)\n", indent, "");
		json_decref(all);
		return;
	}
	/* Union of keys, in row order, for the generic columns. */
	for (i = 0; i < nrows; i++) {
		row = json_array_get(rows, i);
		for (void *it = json_object_iter(row); it != NULL;
		     it = json_object_iter_next(row, it))
			if (json_object_get(all, json_object_iter_key(it)) == NULL)
				json_object_set_new(all, json_object_iter_key(it), json_null());
	}
	cols = ordered_keys(all, order);
	if (cols == NULL)
		goto out;
	while (cols[ncols] != NULL)
		ncols++;
	cells = calloc(nrows, sizeof(*cells));
	width = calloc(ncols, sizeof(*width));
	right = calloc(ncols, sizeof(*right));

	if (cells == NULL || width == NULL || right == NULL)
		goto out_free;
	for (c = 0; c < ncols; c++) {
		width[c] = strlen(cols[c]);
		right[c] = true;
	}
	for (i = 0; i < nrows; i++) {
		row = json_array_get(rows, i);
		cells[i] = calloc(ncols, sizeof(**cells));
		if (cells[i] == NULL)
			goto out_free;
		for (c = 0; c < ncols; c++) {
			json_t *v = json_object_get(row, cols[c]);

			cells[i][c] = v != NULL ? value_str(v) : strdup("-");
			if (cells[i][c] == NULL)
				goto out_free;
			if (v != NULL && !json_is_number(v))
				right[c] = false;
			if (strlen(cells[i][c]) > width[c])
				width[c] = strlen(cells[i][c]);
		}
	}
	printf("%*s", indent, "");
	for (c = 0; c < ncols; c++) {
		char hdr[256];
		size_t l = strlen(cols[c]);

		if (l >= sizeof(hdr))
			l = sizeof(hdr) - 1;
		for (size_t j = 0; j < l; j++)
			hdr[j] = (char)(cols[c][j] >= 'a' && cols[c][j] <= 'z' ? cols[c][j] - 32 :
										 cols[c][j]);
		hdr[l] = '\0';
		if (c + 1 == ncols && !right[c])
			printf("%s", hdr);
		else
			printf(right[c] ? "%*s" : "%-*s", (int)width[c], hdr);
		printf(c + 1 < ncols ? "  " : "\n");
	}
	for (i = 0; i < nrows; i++) {
		printf("%*s", indent, "");
		for (c = 0; c < ncols; c++) {
			if (c + 1 == ncols && !right[c])
				printf("%s", cells[i][c]);
			else
				printf(right[c] ? "%*s" : "%-*s", (int)width[c], cells[i][c]);
			printf(c + 1 < ncols ? "  " : "\n");
		}
	}

out_free:
	if (cells != NULL)
		for (i = 0; i < nrows; i++) {
			if (cells[i] != NULL)
				for (c = 0; c < ncols; c++)
					free(cells[i][c]);
			free(cells[i]);
		}
	free(cells);
	free(width);
	free(right);
	free(cols);
out:
	json_decref(all);
}

/*
 * Print an object: scalars (and arrays of scalars) as aligned key/value
 * lines first, then nested objects as indented sections and arrays of
 * objects as tables, each under a "name:" heading.
 */
static void
print_object(json_t *obj, const char *const *order, int indent)
{
	const char **keys = ordered_keys(obj, order);
	size_t kw = 0, i;
	bool first_section = true;

	if (keys == NULL)
		return;
	for (i = 0; keys[i] != NULL; i++) {
		json_t *v = json_object_get(obj, keys[i]);

		if (!json_is_object(v) && !is_table(v) && strlen(keys[i]) > kw)
			kw = strlen(keys[i]);
	}
	for (i = 0; keys[i] != NULL; i++) {
		json_t *v = json_object_get(obj, keys[i]);
		char note[64];

		if (json_is_object(v) || is_table(v))
			continue;
		char *s = value_str(v);

		annotate(keys[i], v, note, sizeof(note));
		printf("%*s%-*s  %s%s\n", indent, "", (int)kw, keys[i], s, note);
		free(s);
	}
	for (i = 0; keys[i] != NULL; i++) {
		json_t *v = json_object_get(obj, keys[i]);

		if (!json_is_object(v) && !is_table(v))
			continue;
		if (kw > 0 || !first_section)
			printf("\n");
		first_section = false;
		printf("%*s%s:\n", indent, "", keys[i]);
		if (json_is_object(v))
			print_object(v, order_for(keys[i]), indent + 2);
		else
			print_table(v, order_for(keys[i]), indent + 2);
	}
	free(keys);
}

void
print_json(json_t *v)
{
	/* 15 digits: reals (uptime) print as the daemon meant them, not as 3725.4200000000001. */
	char *s = json_dumps(v, JSON_INDENT(2) | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));

	if (s != NULL)
		printf("%s\n", s);
	free(s);
}

/* ---- commands ---- */


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
int
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

static int
cmd_status(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res;
	int r = parse_cmd_opts("status", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("status: unexpected argument '%s'", argv[optind]);
	r = rpc_call(o, "status", json_object(), &res);
	if (r != 0)
		return r;
	if (o->json || !json_is_object(res))
		print_json(res);
	else
		print_object(res, order_status, 0);
	json_decref(res);
	return 0;
}

static int
cmd_stats(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res, *params;
	int r = parse_cmd_opts("stats", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("stats: unexpected argument '%s'", argv[optind]);
	params = co.prometheus ? json_pack("{s:s}", "format", "prometheus") : json_object();
	r = rpc_call(o, "stats", params, &res);
	if (r != 0)
		return r;
	if (co.prometheus && !o->json) {
		json_t *text = json_object_get(res, "text");

		if (!json_is_string(text)) {
			fprintf(stderr, "%s: stats reply has no \"text\" string\n", prog);
			json_decref(res);
			return EXIT_CONN;
		}
		fwrite(json_string_value(text), 1, json_string_length(text), stdout);
	} else if (o->json || !json_is_object(res)) {
		print_json(res);
	} else {
		print_object(res, order_stats, 0);
	}
	json_decref(res);
	return 0;
}

static int
cmd_peers(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res;
	int r = parse_cmd_opts("peers", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("peers: unexpected argument '%s'", argv[optind]);
	r = rpc_call(o, "peers", json_object(), &res);
	if (r != 0)
		return r;
	json_t *peers = json_object_get(res, "peers");

	if (o->json || !json_is_object(res) || !is_table(peers)) {
		print_json(res);
	} else {
		print_table(peers, cols_peers, 0);
		/* Anything else the daemon adds goes below the table. */
		json_t *rest = json_deep_copy(res);

		json_object_del(rest, "peers");
		if (json_object_size(rest) > 0) {
			printf("\n");
			print_object(rest, NULL, 0);
		}
		json_decref(rest);
	}
	json_decref(res);
	return 0;
}

/* Print the result: JSON with --json, else @p render (or the generic object view). */
void
show(const struct opts *o, json_t *res, const char *const *order)
{
	if (o->json || !json_is_object(res))
		print_json(res);
	else
		print_object(res, order, 0);
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

static const char *const cols_transfers[] = {
	"id",    "client", "user_id", "peer", "phase", "age_ms", "deadline_in_ms",
	"bytes", "nseg",   "status",  NULL,
};

static int
cmd_transfers(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res;
	int r = parse_cmd_opts("transfers", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("transfers: unexpected argument '%s'", argv[optind]);
	r = rpc_call(o, "transfers",
		     co.limit ? json_pack("{s:I}", "limit", (json_int_t)co.limit) : json_object(),
		     &res);
	if (r != 0)
		return r;
	json_t *rows = json_object_get(res, "transfers");

	if (o->json || !is_table(rows)) {
		print_json(res);
	} else {
		print_table(rows, cols_transfers, 0);
		printf("\n%" JSON_INTEGER_FORMAT " in flight%s\n",
		       json_integer_value(json_object_get(res, "count")),
		       json_is_true(json_object_get(res, "truncated")) ? " (list truncated)" : "");
	}
	json_decref(res);
	return 0;
}

static const char *const cols_slowest[] = {
	"tag",        "client",          "user_id",     "peer",
	"status",     "bytes",           "total_us",    "queue_us",
	"admit_us",   "first_byte_us",   "send_us",     "wire_us",
	"deliver_us", "deadline_missed", "ended_s_ago", NULL,
};

static int
cmd_slowest(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res;
	int r = parse_cmd_opts("slowest", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("slowest: unexpected argument '%s'", argv[optind]);
	r = rpc_call(o, "slowest",
		     co.limit ? json_pack("{s:I}", "limit", (json_int_t)co.limit) : json_object(),
		     &res);
	if (r != 0)
		return r;
	json_t *rows = json_object_get(res, "transfers");

	if (o->json || !is_table(rows)) {
		print_json(res);
	} else {
		/* One line per transfer: the phases become columns. */
		json_t *flat = json_array(), *row;
		size_t i;

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
		       json_is_false(json_object_get(res, "enabled")) ? ", stats.enabled is false" :
									"");
		json_decref(flat);
	}
	json_decref(res);
	return 0;
}

/* A non-negative decimal integer argument. */
bool
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

static int
cmd_cancel(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_int_t client, user_id;
	int r = parse_cmd_opts("cancel", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (argc - optind != 2)
		return usage_error("cancel: expected CLIENT USER_ID");
	if (!parse_id(argv[optind], UINT32_MAX, &client))
		return usage_error("cancel: bad CLIENT '%s'", argv[optind]);
	if (!parse_id(argv[optind + 1], INT64_MAX, &user_id))
		return usage_error("cancel: bad USER_ID '%s'", argv[optind + 1]);
	return simple_call(o, "cancel",
			   json_pack("{s:I, s:I}", "client", client, "user_id", user_id), NULL);
}

static const char *const order_drain[] = {
	"draining", "since_s", "inflight", "refused", "idle", NULL,
};

static int
cmd_drain(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res;
	int r = parse_cmd_opts("drain", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("drain: unexpected argument '%s'", argv[optind]);
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

static int
cmd_undrain(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	int r = parse_cmd_opts("undrain", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("undrain: unexpected argument '%s'", argv[optind]);
	return simple_call(o, "undrain", json_object(), order_drain);
}

static const char *const cols_config[] = { "key", "value", "runtime", NULL };
static const char *const order_config_key[] = { "key", "value", "runtime",  "min",
						"max", "fixed", "previous", NULL };

static int
cmd_config_get(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res;
	int r = parse_cmd_opts("config_get", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (argc - optind > 1)
		return usage_error("config_get: expected at most one KEY");
	if (argc - optind == 1)
		return simple_call(o, "config_get", json_pack("{s:s}", "key", argv[optind]),
				   order_config_key);
	r = rpc_call(o, "config_get", json_object(), &res);
	if (r != 0)
		return r;
	json_t *rows = json_object_get(res, "config");

	if (o->json || !is_table(rows))
		print_json(res);
	else
		print_table(rows, cols_config, 0);
	json_decref(res);
	return 0;
}

static int
cmd_config_set(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	int r = parse_cmd_opts("config_set", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (argc - optind != 2)
		return usage_error("config_set: expected KEY VALUE");
	/* The daemon parses the text with the key's own rules (integer, boolean, name). */
	return simple_call(o, "config_set",
			   json_pack("{s:s, s:s}", "key", argv[optind], "value", argv[optind + 1]),
			   order_config_key);
}

static int
cmd_log_level(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	int r = parse_cmd_opts("log_level", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (argc - optind > 1)
		return usage_error("log_level: expected at most one LEVEL");
	return simple_call(o, "log_level",
			   argc - optind == 1 ? json_pack("{s:s}", "level", argv[optind]) :
						json_object(),
			   NULL);
}

static int
cmd_doctor(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res, *c;
	size_t i;
	int r = parse_cmd_opts("doctor", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("doctor: unexpected argument '%s'", argv[optind]);
	r = rpc_call(o, "doctor", json_object(), &res);
	if (r != 0)
		return r;
	json_t *checks = json_object_get(res, "checks");

	if (o->json || !json_is_array(checks)) {
		print_json(res);
		json_decref(res);
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
	json_t *rest = json_deep_copy(res);

	json_object_del(rest, "checks");
	printf("\n");
	print_object(rest, NULL, 0);
	json_decref(rest);
	json_decref(res);
	return 0;
}

/* ---- watch ---- */

struct peer_sample {
	char node_id[64];
	double tx, rx, txx, rxx; /* bytes, transfers */
};

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

static int
cmd_watch(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	struct peer_sample prev[64];
	size_t nprev = 0;
	double prev_up = -1, prev_done = 0;
	bool tty = isatty(STDOUT_FILENO);
	int r = parse_cmd_opts("watch", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (optind != argc)
		return usage_error("watch: unexpected argument '%s'", argv[optind]);
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

static int
cmd_call(struct opts *o, int argc, char **argv)
{
	struct cmd_opts co = { 0 };
	json_t *res, *params;
	json_error_t jerr;
	int r = parse_cmd_opts("call", argc, argv, o, &co);

	if (r >= 0)
		return r;
	if (argc - optind < 1 || argc - optind > 2)
		return usage_error("call: expected METHOD [JSON-PARAMS]");
	if (argc - optind == 2) {
		/* Any JSON value is sent as given, so scripts can probe bad params too. */
		params = json_loads(argv[optind + 1], JSON_DECODE_ANY, &jerr);
		if (params == NULL)
			return usage_error("call: JSON-PARAMS is not valid JSON: %s", jerr.text);
	} else {
		params = json_object();
	}
	r = rpc_call(o, argv[optind], params, &res);
	if (r != 0)
		return r;
	print_json(res);
	json_decref(res);
	return 0;
}

struct command {
	const char *name;
	int (*fn)(struct opts *o, int argc, char **argv);
};

static const struct command commands[] = {
	{ "status", cmd_status },
	{ "stats", cmd_stats },
	{ "peers", cmd_peers },
	{ "transfers", cmd_transfers },
	{ "slowest", cmd_slowest },
	{ "cancel", cmd_cancel },
	{ "drain", cmd_drain },
	{ "undrain", cmd_undrain },
	{ "resume", cmd_undrain },
	{ "config_get", cmd_config_get },
	{ "config_set", cmd_config_set },
	{ "log_level", cmd_log_level },
	{ "doctor", cmd_doctor },
	{ "watch", cmd_watch },
	{ "call", cmd_call },
	{ "rails", cmd_rails },
	{ "rail_pause", cmd_rail_pause },
	{ "rail_resume", cmd_rail_resume },
	{ NULL, NULL },
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
	for (const struct command *cmd = commands; cmd->name != NULL; cmd++)
		if (strcmp(cmd->name, name) == 0)
			return cmd->fn(&o, argc - optind, argv + optind);
	return usage_error("unknown command '%s'", name);
}
