/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Configuration: one table drives parsing, defaults, bounds, runtime get/set
 * and the dump (the shape of Redis' standardConfig). Unknown keys are
 * errors, and every error reads "FILE:LINE: message". Rows flagged RT may
 * change while running (admin config_set, main lcore); workers read those
 * fields with relaxed loads.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libconfig.h>

#include "config_priv.h"
#include "kvp_config.h"
#include "kvp_log.h"

#define F(field) offsetof(struct kvp_config, field), sizeof(((struct kvp_config *)0)->field)
#define U32(p, field, lo, hi, d)    { p, CT_U32, F(field), lo, hi, d, NULL, 0 }
#define U32_RT(p, field, lo, hi, d) { p, CT_U32, F(field), lo, hi, d, NULL, RT }
#define STR(p, field, d)	    { p, CT_STR, F(field), 0, 0, 0, d, 0 }

const struct conf_row config_rows[] = {
	STR("node_id", node_id, ""),
	STR("client_socket", client_socket, "/run/kvproxy/kvproxy.sock"),
	STR("admin_socket", admin_socket, "/run/kvproxy/admin.sock"),
	{ "client_group", CT_GROUP, F(client_group), 0, 0, 0, "", 0 },
	{ "admin_group", CT_GROUP, F(admin_group), 0, 0, 0, "", 0 },
	{ "listen", CT_HOSTPORT, F(listen_host), 0, 0, 0, "127.0.0.1:7400", 0 },
	{ "transport", CT_TRANSPORT, F(transport), 0, 0, 0, "tcp", 0 },
	{ "cores", CT_CORES, F(cores), 0, 0, 0, "", 0 },
	U32("workers", workers, 0, KVP_WORKERS_MAX, 0),
	{ "log_level", CT_LOGLEVEL, F(log_level), 0, 0, 0, "info", RT },
	U32("limits.max_clients", max_clients, 1, 1024, 16),
	U32("limits.max_peers", max_peers, 1, KVP_PEERS_MAX, 64),
	U32("limits.max_regions", max_regions, 1, 65535, 1024),
	U32("limits.max_inflight", max_inflight, 1, 65536, 256),
	U32("limits.max_segments", max_segments, 1, KVP_XFER_SEGS_MAX, 1024),
	U32("limits.max_blocks", max_blocks, 1, 1u << 24, 65536),
	U32("limits.max_fences", max_fences, 1, 65536, 1024),
	U32("limits.client_fences", client_fences, 1, 65536, 256),
	U32("limits.sq_entries", sq_entries, 2, 1u << 20, 4096),
	U32("limits.cq_entries", cq_entries, 2, 1u << 20, 1024),
	U32_RT("timeouts.default_ms", default_timeout_ms, 1, 3600000, 30000),
	U32("timeouts.connect_ms", connect_timeout_ms, 10, 600000, 1000),
	U32("timeouts.peer_ms", peer_timeout_ms, 10, 600000, 1000),
	U32("timeouts.reconnect_ms", reconnect_ms, 1, 60000, 200),
	U32("timeouts.peer_forget_ms", peer_forget_ms, 1000, 86400000, 300000),
	U32_RT("timeouts.admission_ms", admission_timeout_ms, 1, 3600000, 1000),
	U32_RT("timeouts.admin_ms", admin_timeout_ms, 10, 600000, 5000),
	U32_RT("timeouts.admin_idle_ms", admin_idle_ms, 10, 86400000, 60000),
	U32_RT("timeouts.fence_hold_ms", fence_hold_ms, 1, 86400000, 60000),
	U32_RT("timeouts.fence_hold_max_ms", fence_hold_max_ms, 1, 86400000, 3600000),
	{ "poll.busy", CT_BOOL, F(busy_poll), 0, 0, 0, NULL, RT },
	U32_RT("poll.idle_us", idle_us, 0, 10000000, 20),
	U32_RT("poll.idle_max_us", idle_max_us, 0, 10000000, 1000),
	U32("tcp.frame_max", tcp_frame_max, 4096, 1u << 30, 4u << 20),
	U32("tcp.rx_buffer", tcp_rx_buffer, 4096, 1u << 30, 256u << 10),
	U32("tcp.tx_frames", tcp_tx_frames, 8, 65536, 512),
	U32("tcp.send_iov", tcp_send_iov, 2, 512, 64),
	U32("tcp.connections", tcp_conns, 1, KVP_TCP_CONNS_MAX, 2),
	{ "tcp.zerocopy", CT_BOOL, F(tcp_zerocopy), 0, 0, 0, NULL, 0 },
	{ "tcp.fixed_buffers", CT_BOOL, F(tcp_fixed), 0, 0, 1, NULL, 0 },
	STR("tcp.congestion", tcp_congestion, ""),
	U32("stage.pool", stage_pool, 65536, 1u << 31, 64u << 20),
	U32("stage.buffer", stage_buf, 4096, 1u << 28, 1u << 20),
	{ "stage.host", CT_BOOL, F(stage_host), 0, 0, 0, NULL, 0 },
	STR("rdma.devices", rdma_devices, ""),
	STR("rdma.gid", rdma_gid, "auto"),
	U32("rdma.qps_per_rail", rdma_qps_per_rail, 1, 8, 1),
	U32("rdma.sq_depth", rdma_sq_depth, 8, 16384, 256),
	U32("rdma.rq_depth", rdma_rq_depth, 8, 16384, 256),
	U32("rdma.inline", rdma_inline, 0, 1024, 64),
	U32("rdma.chunk", rdma_chunk, 4096, 1u << 30, 1u << 20),
	U32("rdma.window", rdma_window, 4096, 1u << 30, 4u << 20),
	U32("rdma.signal_every", rdma_signal_every, 1, 16384, 16),
	U32("rdma.timeout", rdma_timeout, 1, 31, 14),
	U32("rdma.retry", rdma_retry, 0, 7, 7),
	{ "rdma.dmabuf_host", CT_BOOL, F(rdma_dmabuf_host), 0, 0, 0, NULL, 0 },
	{ "accept_unknown_peers", CT_BOOL, F(accept_unknown), 0, 0, 1, NULL, RT },
	{ "auth", CT_AUTH, F(auth_none), 0, 0, 0, "", 0 },
	{ "auth.secret", CT_STR, F(auth_secret), 0, 0, 0, "", SECRET },
	{ "auth.secret_file", CT_SECRET_FILE, F(auth_secret), 0, 0, 0, "", SECRET },
	{ "stats.enabled", CT_BOOL, F(stats_enabled), 0, 0, 1, NULL, RT },
	{ "stats.file", CT_STR, F(stats_file), 0, 0, 0, "", RT },
	U32_RT("stats.interval_ms", stats_interval_ms, 0, 86400000, 5000),
	U32_RT("stats.slowest_window_s", slowest_window_s, 1, 86400, 300),
};

const size_t config_nrows = sizeof(config_rows) / sizeof(config_rows[0]);

struct errctx {
	const char *path;
	char *buf;
	size_t len;
	/* Which of auth.secret / auth.secret_file the file set: never both. */
	config_setting_t *secret;
	config_setting_t *secret_file;
	config_setting_t *listen;
};

static int __attribute__((format(printf, 3, 4)))
fail_at(struct errctx *e, const config_setting_t *s, const char *fmt, ...)
{
	const char *file = s ? config_setting_source_file(s) : NULL;
	unsigned line = s ? config_setting_source_line(s) : 0;
	int n = snprintf(e->buf, e->len, "%s:%u: ", file ? file : e->path, line);
	va_list ap;

	if (n < 0 || (size_t)n >= e->len)
		return -EINVAL;
	va_start(ap, fmt);
	vsnprintf(e->buf + n, e->len - (size_t)n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

int
kvp_config_parse_hostport(const char *s, char *host, size_t hlen, uint16_t *port)
{
	const char *colon = strrchr(s, ':');
	char *end;

	if (!colon || colon == s || (size_t)(colon - s) >= hlen)
		return -EINVAL;
	/* Names, IPv4 and bracketed IPv6 (with a zone): nothing a resolver would read otherwise. */
	for (const char *c = s; c < colon; c++)
		if (!isalnum((unsigned char)*c) && !strchr(".-_:[]%", *c))
			return -EINVAL;
	if (colon[1] < '0' || colon[1] > '9')
		return -EINVAL;
	unsigned long p = strtoul(colon + 1, &end, 10);
	if (*end != '\0' || p == 0 || p > 65535)
		return -EINVAL;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	*port = (uint16_t)p;
	return 0;
}

static int
parse_transport(const char *s)
{
	if (strcmp(s, "tcp") == 0)
		return KVP_TRANSPORT_TCP;
	if (strcmp(s, "rdma") == 0)
		return KVP_TRANSPORT_RDMA;
	if (strcmp(s, "auto") == 0)
		return KVP_TRANSPORT_AUTO;
	return -EINVAL;
}

/* Strict decimal: digits only, no sign, no blanks, no overflow. */
int
config_parse_u64(const char *v, unsigned long long *out)
{
	unsigned long long x = 0;

	if (*v == '\0')
		return -EINVAL;
	for (; *v; v++) {
		if (*v < '0' || *v > '9' || x > (~0ull - 9) / 10)
			return -EINVAL;
		x = x * 10 + (unsigned)(*v - '0');
	}
	*out = x;
	return 0;
}

/*
 * A group by name (group database, so NSS sources count) or by number; ""
 * is none. Looked up when the file is read, so that a typo is an error at
 * its line rather than a socket owned by the wrong group.
 */
static int
lookup_group(const char *v, struct kvp_group *g, const char **why)
{
	struct group gr, *res = NULL;
	unsigned long long id;
	size_t cap = 4096;
	char *buf = NULL;
	int rc;

	memset(g, 0, sizeof(*g));
	if (v[0] == '\0')
		return 0;
	if (strlen(v) >= sizeof(g->name)) {
		*why = "group name too long";
		return -EINVAL;
	}
	if (config_parse_u64(v, &id) == 0) {
		if (id >= UINT32_MAX) {
			*why = "group number out of range";
			return -EINVAL;
		}
		g->gid = (uint32_t)id;
		strcpy(g->name, v);
		return 0;
	}
	/* Groups with many members need a larger buffer: grow on ERANGE. */
	do {
		char *nb = realloc(buf, cap);

		if (!nb) {
			rc = ENOMEM;
			break;
		}
		buf = nb;
		rc = getgrnam_r(v, &gr, buf, cap, &res);
		cap *= 2;
	} while (rc == ERANGE && cap <= (1u << 24));
	free(buf);
	if (!res) {
		/* Some NSS modules report "not found" as ENOENT or ESRCH. */
		*why = rc == 0 || rc == ENOENT || rc == ESRCH ? "no such group"
							     : "cannot read the group database";
		return -EINVAL;
	}
	g->gid = (uint32_t)gr.gr_gid;
	strcpy(g->name, v);
	return 0;
}

/* Apply a string value to a row; shared by defaults and the file. */
static int
set_str(struct kvp_config *cfg, const struct conf_row *r, const char *v, const char **why)
{
	char *dst = (char *)cfg + r->off;
	int t;

	switch (r->type) {
	case CT_STR:
		if (strlen(v) >= r->size) {
			*why = "string too long";
			return -EINVAL;
		}
		strcpy(dst, v);
		return 0;
	case CT_HOSTPORT:
		if (kvp_config_parse_hostport(v, cfg->listen_host, sizeof(cfg->listen_host),
				   &cfg->listen_port) < 0) {
			*why = "expected \"host:port\"";
			return -EINVAL;
		}
		return 0;
	case CT_TRANSPORT:
		t = parse_transport(v);
		if (t < 0) {
			*why = "expected \"tcp\", \"rdma\" or \"auto\"";
			return -EINVAL;
		}
		cfg->transport = t;
		return 0;
	case CT_LOGLEVEL:
		t = kvp_log_level_parse(v);
		if (t < 0) {
			*why = "expected a log level (emerg..debug)";
			return -EINVAL;
		}
		cfg->log_level = t;
		return 0;
	case CT_GROUP:
		return lookup_group(v, (struct kvp_group *)dst, why);
	case CT_AUTH:
		if (v[0] != '\0' && strcmp(v, "none") != 0) {
			*why = "expected \"none\" (or a group: auth = { secret_file = \"...\"; })";
			return -EINVAL;
		}
		cfg->auth_none = v[0] != '\0';
		return 0;
	case CT_CORES: {
		unsigned a, b;
		int n = -1;

		if (v[0] != '\0' && strcmp(v, "auto") != 0 &&
		    (strspn(v, "0123456789,") != strlen(v) || !isdigit((unsigned char)v[0]) ||
		     sscanf(v, "%u,%u%n", &a, &b, &n) != 2 || (size_t)n != strlen(v) || a >= 1024 ||
		     b >= 1024 || strlen(v) >= r->size)) {
			*why = "expected \"auto\" or \"MAIN_CPU,WORKER_CPU\"";
			return -EINVAL;
		}
		strcpy(dst, v);
		return 0;
	}
	case CT_SECRET_FILE: {
		FILE *f;

		if (v[0] == '\0')
			return 0;
		f = fopen(v, "r");
		if (!f) {
			*why = "cannot read the secret file";
			return -EINVAL;
		}
		if (!fgets(dst, (int)r->size, f))
			dst[0] = '\0';
		fclose(f);
		dst[strcspn(dst, "\r\n")] = '\0';
		if (dst[0] == '\0') {
			*why = "the secret file is empty";
			return -EINVAL;
		}
		return 0;
	}
	default:
		*why = "not a string setting";
		return -EINVAL;
	}
}

void
kvp_config_defaults(struct kvp_config *cfg)
{
	const char *why;

	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < config_nrows; i++) {
		const struct conf_row *r = &config_rows[i];

		if (r->type == CT_U32)
			*(uint32_t *)((char *)cfg + r->off) = r->idef;
		else if (r->type == CT_BOOL)
			*(bool *)((char *)cfg + r->off) = r->idef != 0;
		else
			set_str(cfg, r, r->sdef, &why);
	}
}

const struct conf_row *
config_find_row(const char *path)
{
	for (size_t i = 0; i < config_nrows; i++)
		if (strcmp(config_rows[i].path, path) == 0)
			return &config_rows[i];
	return NULL;
}

static bool
is_group_prefix(const char *path)
{
	size_t n = strlen(path);

	for (size_t i = 0; i < config_nrows; i++)
		if (strncmp(config_rows[i].path, path, n) == 0 && config_rows[i].path[n] == '.')
			return true;
	return false;
}

static int
apply_setting(struct kvp_config *cfg, const struct conf_row *r, config_setting_t *s,
	      struct errctx *e)
{
	const char *why = NULL;
	int type = config_setting_type(s);

	if (r->type == CT_U32) {
		long long v;

		if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
			return fail_at(e, s, "%s: expected an integer", r->path);
		v = config_setting_get_int64(s);
		if (v < r->min || v > r->max)
			return fail_at(e, s, "%s: %lld out of range [%u, %u]", r->path, v, r->min,
				       r->max);
		*(uint32_t *)((char *)cfg + r->off) = (uint32_t)v;
		return 0;
	}
	if (r->type == CT_BOOL) {
		if (type != CONFIG_TYPE_BOOL)
			return fail_at(e, s, "%s: expected true or false", r->path);
		*(bool *)((char *)cfg + r->off) = config_setting_get_bool(s);
		return 0;
	}
	if (type != CONFIG_TYPE_STRING)
		return fail_at(e, s, "%s: expected a string", r->path);
	if (set_str(cfg, r, config_setting_get_string(s), &why) < 0) {
		/* Name the group: the reason alone does not say which word was wrong. */
		if (r->type == CT_GROUP)
			return fail_at(e, s, "%s: %s: '%.64s'", r->path, why,
				       config_setting_get_string(s));
		return fail_at(e, s, "%s: %s", r->path, why);
	}
	return 0;
}

bool
kvp_config_node_id_ok(const char *id)
{
	if (id[0] == '\0' || strlen(id) >= KVP_NODE_ID_MAX)
		return false;
	for (const char *p = id; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
			return false;
	return true;
}

static int
load_peers(struct kvp_config *cfg, config_setting_t *list, struct errctx *e)
{
	if (!config_setting_is_list(list) && !config_setting_is_array(list))
		return fail_at(e, list, "peers: expected a list ( { node_id = ...; addr = ...; }, ... )");
	int n = config_setting_length(list);

	if ((uint32_t)n > cfg->max_peers)
		return fail_at(e, list, "peers: %d peers, but limits.max_peers is %u", n,
			       cfg->max_peers);
	for (int i = 0; i < n; i++) {
		config_setting_t *g = config_setting_get_elem(list, (unsigned)i);
		struct kvp_peer_conf *p = &cfg->peers[i];
		const char *id = NULL, *addr = NULL;

		if (!config_setting_is_group(g))
			return fail_at(e, g, "peers[%d]: expected a group", i);
		for (int k = 0; k < config_setting_length(g); k++) {
			config_setting_t *m = config_setting_get_elem(g, (unsigned)k);
			const char *name = config_setting_name(m);
			const char **dst;

			if (strcmp(name, "node_id") == 0)
				dst = &id;
			else if (strcmp(name, "addr") == 0)
				dst = &addr;
			else
				return fail_at(e, m, "peers[%d]: unknown key '%s'", i, name);
			if (config_setting_type(m) != CONFIG_TYPE_STRING)
				return fail_at(e, m, "peers[%d].%s: expected a string", i, name);
			*dst = config_setting_get_string(m);
		}
		if (!id || !addr)
			return fail_at(e, g, "peers[%d]: node_id and addr are required", i);
		if (strlen(id) >= sizeof(p->node_id) || !kvp_config_node_id_ok(id))
			return fail_at(e, g, "peers[%d]: bad node_id '%s'", i, id);
		if (kvp_config_parse_hostport(addr, p->host, sizeof(p->host), &p->port) < 0)
			return fail_at(e, g, "peers[%d]: addr: expected \"host:port\"", i);
		strcpy(p->node_id, id);
		if (strcmp(id, cfg->node_id) == 0)
			return fail_at(e, g, "peers[%d]: '%s' is this node's own id", i, id);
		for (int j = 0; j < i; j++)
			if (strcmp(cfg->peers[j].node_id, id) == 0)
				return fail_at(e, g, "peers[%d]: duplicate node_id '%s'", i, id);
	}
	cfg->npeers = (uint32_t)n;
	return 0;
}

/* Walk the file and apply every setting; anything not in the table is an error. */
static int
walk(struct kvp_config *cfg, config_setting_t *grp, const char *prefix, struct errctx *e)
{
	for (int i = 0; i < config_setting_length(grp); i++) {
		config_setting_t *s = config_setting_get_elem(grp, (unsigned)i);
		char path[128];
		const struct conf_row *r;
		int rc;

		snprintf(path, sizeof(path), "%s%s%s", prefix, prefix[0] ? "." : "",
			 config_setting_name(s));
		if (prefix[0] == '\0' && strcmp(path, "peers") == 0)
			continue; /* after node_id is known */
		r = config_find_row(path);
		/* "auth" is a row ("none") and a group of rows: the type decides. */
		if (config_setting_is_group(s) && is_group_prefix(path)) {
			rc = walk(cfg, s, path, e);
		} else if (r) {
			rc = apply_setting(cfg, r, s, e);
		} else {
			return fail_at(e, s, "unknown key '%s'", path);
		}
		if (rc < 0)
			return rc;
		if (strcmp(path, "auth.secret") == 0)
			e->secret = s;
		else if (strcmp(path, "auth.secret_file") == 0)
			e->secret_file = s;
		else if (strcmp(path, "listen") == 0)
			e->listen = s;
		else if (strcmp(path, "poll.busy") == 0)
			cfg->busy_poll_set = true;
	}
	return 0;
}

static bool
pow2(uint32_t v)
{
	return (v & (v - 1)) == 0;
}

/* 127.0.0.0/8, ::1 (bracketed or not) or "localhost": only this host can connect. */
static bool
loopback_host(const char *host)
{
	char h[64];
	struct in_addr a4;
	struct in6_addr a6;
	size_t n = strlen(host);

	if (strcmp(host, "localhost") == 0)
		return true;
	if (n >= 2 && n < sizeof(h) + 2 && host[0] == '[' && host[n - 1] == ']') {
		memcpy(h, host + 1, n - 2);
		h[n - 2] = '\0';
		host = h;
	}
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	return inet_pton(AF_INET6, host, &a6) == 1 && memcmp(&a6, &in6addr_loopback, sizeof(a6)) == 0;
}

/* The directory part of an absolute path ("/" for "/x"); "" if @p p ends in '/'. */
void
config_dir_of(const char *p, char *dir, size_t len)
{
	const char *slash = strrchr(p, '/');
	size_t n = slash ? (size_t)(slash - p) : 0;

	dir[0] = '\0';
	if (!slash || slash[1] == '\0' || n >= len)
		return;
	if (n == 0)
		n = 1; /* the root directory */
	memcpy(dir, p, n);
	dir[n] = '\0';
}

/*
 * Authentication cannot be switched off by accident: the two ways of giving
 * the secret exclude each other (else the later key silently wins, even an
 * empty one), and a node that peers can reach from other hosts needs a
 * secret unless auth = "none" says otherwise.
 */
static int
check_auth(struct kvp_config *cfg, config_t *lc, struct errctx *e)
{
	if (e->secret && e->secret_file) {
		config_setting_t *later = config_setting_source_line(e->secret) >
						  config_setting_source_line(e->secret_file)
					  ? e->secret
					  : e->secret_file;

		return fail_at(e, later,
			       "auth: secret and secret_file are both set; keep one (the secret "
			       "must not depend on the order of the keys)");
	}
	if (!cfg->auth_none && cfg->auth_secret[0] == '\0' && !loopback_host(cfg->listen_host))
		return fail_at(e, e->listen ? e->listen : config_lookup(lc, "auth"),
			       "listen = \"%s:%u\" is not a loopback address and no auth.secret "
			       "or auth.secret_file is set: any host that reaches the port could "
			       "exchange KV with this node. Set a secret, or auth = \"none\" to "
			       "run unauthenticated on purpose",
			       cfg->listen_host, cfg->listen_port);
	return 0;
}

int
kvp_config_load(const char *path, struct kvp_config *cfg, char *err, size_t errlen)
{
	struct errctx e = { .path = path, .buf = err, .len = errlen };
	config_t lc;
	config_setting_t *root, *peers;
	int rc = 0;

	char *text = NULL;
	size_t tlen = 0;
	FILE *f;

	kvp_config_defaults(cfg);
	rc = config_text_load(path, &text, &tlen, err, errlen);
	if (rc < 0)
		return rc;
	config_init(&lc);
	f = fmemopen(text, tlen, "r");
	if (!f || config_read(&lc, f) != CONFIG_TRUE) {
		if (!f || config_error_type(&lc) == CONFIG_ERR_FILE_IO) {
			snprintf(err, errlen, "%s:0: cannot read file", path);
			rc = -ENOENT;
		} else {
			snprintf(err, errlen, "%s:%d: %s",
				 config_error_file(&lc) ? config_error_file(&lc) : path,
				 config_error_line(&lc), config_error_text(&lc));
			rc = -EINVAL;
		}
		goto out;
	}
	root = config_root_setting(&lc);
	rc = walk(cfg, root, "", &e);
	if (rc < 0)
		goto out;
	if (!kvp_config_node_id_ok(cfg->node_id)) {
		rc = fail_at(&e, config_lookup(&lc, "node_id"),
			     "node_id: required, letters, digits, '-', '_', '.'");
		goto out;
	}
	peers = config_lookup(&lc, "peers");
	if (peers) {
		rc = load_peers(cfg, peers, &e);
		if (rc < 0)
			goto out;
	}
	if (!pow2(cfg->sq_entries) || !pow2(cfg->cq_entries)) {
		rc = fail_at(&e, config_lookup(&lc, "limits"),
			     "limits: sq_entries and cq_entries must be powers of two");
		goto out;
	}
	if (cfg->sq_entries <= cfg->max_segments) {
		rc = fail_at(&e, config_lookup(&lc, "limits"),
			     "limits: sq_entries (%u) must exceed max_segments (%u)",
			     cfg->sq_entries, cfg->max_segments);
		goto out;
	}
	if ((uint64_t)cfg->max_inflight * cfg->max_segments > (1u << 24)) {
		rc = fail_at(&e, config_lookup(&lc, "limits"),
			     "limits: max_inflight * max_segments must not exceed 16M");
		goto out;
	}
	if (cfg->stage_pool / cfg->stage_buf < 4) {
		rc = fail_at(&e, config_lookup(&lc, "stage"),
			     "stage: pool must hold at least 4 buffers (pool %u / buffer %u)",
			     cfg->stage_pool, cfg->stage_buf);
		goto out;
	}
	if (cfg->stats_file[0]) {
		config_dir_of(cfg->stats_file, cfg->stats_dir, sizeof(cfg->stats_dir));
		if (cfg->stats_file[0] != '/' || cfg->stats_dir[0] == '\0') {
			rc = fail_at(&e, config_lookup(&lc, "stats.file"),
				     "stats.file: expected an absolute path of a file or \"\"");
			goto out;
		}
	}
	if (cfg->workers > 1 && cfg->cores[0] && strcmp(cfg->cores, "auto") != 0) {
		rc = fail_at(&e, config_lookup(&lc, "workers"),
			     "workers = %u: cores = \"%s\" names one worker CPU; use cores = \"auto\" "
			     "or the EAL's -l/--lcores for more",
			     cfg->workers, cfg->cores);
		goto out;
	}
	if ((uint64_t)(cfg->workers ? cfg->workers : 1) * cfg->tcp_conns > KVP_LINKS_MAX) {
		rc = fail_at(&e, config_lookup(&lc, "workers"),
			     "workers (%u) x tcp.connections (%u): at most %u links per peer",
			     cfg->workers, cfg->tcp_conns, KVP_LINKS_MAX);
		goto out;
	}
	rc = check_auth(cfg, &lc, &e);
	if (rc < 0)
		goto out;
	if (cfg->client_socket[0] == '\0' || cfg->admin_socket[0] == '\0') {
		rc = fail_at(&e, NULL, "client_socket and admin_socket must be set");
		goto out;
	}
out:
	if (f)
		fclose(f);
	free(text);
	config_destroy(&lc);
	return rc;
}

int
kvp_config_peer_index(const struct kvp_config *cfg, const char *node_id)
{
	for (uint32_t i = 0; i < cfg->npeers; i++)
		if (strcmp(cfg->peers[i].node_id, node_id) == 0)
			return (int)i;
	return -1;
}

