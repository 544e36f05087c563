/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Runtime get/set of the configuration (admin config_get / config_set, main
 * lcore), driven by the same table as the loader (config.c). Runtime knobs
 * are stored with relaxed atomics: workers read them with relaxed loads.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "config_priv.h"
#include "kvp_config.h"
#include "kvp_log.h"

/* Why a key is fixed at start, by key prefix (first match wins). */
static const struct {
	const char *prefix;
	const char *why;
} fixed_reasons[] = {
	{ "node_id", "the node's identity: peers know it by this id" },
	{ "client_socket", "the socket is bound at start" },
	{ "admin_socket", "the socket is bound at start" },
	{ "client_group", "the client socket is created with its group at start" },
	{ "admin_group", "the admin socket is created with its group at start" },
	{ "listen", "the peer listener is bound at start" },
	{ "transport", "the transport is chosen and built at start" },
	{ "cores", "lcores are placed when the EAL starts" },
	{ "workers", "worker lcores are launched at start" },
	{ "limits.", "tables and rings are sized from it at start (memory never grows)" },
	{ "timeouts.", "peer links and transports take it at start" },
	{ "tcp.", "connection buffers are allocated from it at start" },
	{ "stage.", "the staging pool is allocated at start" },
	{ "rdma.", "queue pairs and registrations are built from it at start" },
	{ "auth.", "peers are authenticated with it when they connect" },
	{ "", "fixed at start" },
};

static const char *
fixed_reason(const char *path)
{
	for (size_t i = 0; i < sizeof(fixed_reasons) / sizeof(fixed_reasons[0]); i++)
		if (strncmp(path, fixed_reasons[i].prefix, strlen(fixed_reasons[i].prefix)) == 0)
			return fixed_reasons[i].why;
	return "fixed at start";
}

static void
describe(const struct conf_row *r, struct kvp_config_info *info)
{
	memset(info, 0, sizeof(*info));
	info->key = r->path;
	info->kind = r->type == CT_U32  ? KVP_CONF_INT :
		     r->type == CT_BOOL ? KVP_CONF_BOOL :
					  KVP_CONF_STR;
	info->runtime = (r->flags & RT) != 0;
	info->secret = (r->flags & SECRET) != 0;
	info->min = r->min;
	info->max = r->max;
	info->fixed = info->runtime ? NULL : fixed_reason(r->path);
}

int
kvp_config_describe(unsigned i, struct kvp_config_info *info)
{
	if (i >= config_nrows)
		return -ENOENT;
	describe(&config_rows[i], info);
	return 0;
}

int
kvp_config_get(const struct kvp_config *cfg, const char *key, char *buf, size_t len,
	       struct kvp_config_info *info)
{
	const struct conf_row *r = config_find_row(key);
	const char *p;

	if (!r)
		return -ENOENT;
	if (info)
		describe(r, info);
	p = (const char *)cfg + r->off;
	if (r->flags & SECRET) {
		snprintf(buf, len, "%s", cfg->auth_secret[0] ? "(set)" : "");
		return 0;
	}
	switch (r->type) {
	case CT_U32:
		snprintf(buf, len, "%u", __atomic_load_n((const uint32_t *)p, __ATOMIC_RELAXED));
		break;
	case CT_BOOL:
		snprintf(buf, len, "%s",
			 __atomic_load_n((const bool *)p, __ATOMIC_RELAXED) ? "true" : "false");
		break;
	case CT_HOSTPORT:
		snprintf(buf, len, "%s:%u", cfg->listen_host, cfg->listen_port);
		break;
	case CT_TRANSPORT:
		snprintf(buf, len, "%s",
			 cfg->transport == KVP_TRANSPORT_RDMA ? "rdma" :
			 cfg->transport == KVP_TRANSPORT_AUTO ? "auto" :
								"tcp");
		break;
	case CT_LOGLEVEL:
		snprintf(buf, len, "%s",
			 kvp_log_level_name(__atomic_load_n(&cfg->log_level, __ATOMIC_RELAXED)));
		break;
	case CT_GROUP:
		snprintf(buf, len, "%s", ((const struct kvp_group *)p)->name);
		break;
	case CT_AUTH:
		snprintf(buf, len, "%s",
			 cfg->auth_none      ? "none" :
			 cfg->auth_secret[0] ? "secret" :
					       "");
		break;
	default:
		snprintf(buf, len, "%s", p);
		break;
	}
	return 0;
}

int
kvp_config_set(struct kvp_config *cfg, const char *key, const char *value, char *why, size_t whylen)
{
	const struct conf_row *r = config_find_row(key);
	char *dst;

	if (!r) {
		snprintf(why, whylen, "unknown key '%.64s'", key);
		return -ENOENT;
	}
	if (!(r->flags & RT)) {
		snprintf(why, whylen, "%s cannot change at run time: %s; edit the file and restart",
			 r->path, fixed_reason(r->path));
		return -EPERM;
	}
	dst = (char *)cfg + r->off;
	switch (r->type) {
	case CT_U32: {
		unsigned long long v;

		if (config_parse_u64(value, &v) < 0 || v < r->min || v > r->max) {
			snprintf(why, whylen, "%s: expected an integer in [%u, %u], got '%.32s'",
				 r->path, r->min, r->max, value);
			return -EINVAL;
		}
		__atomic_store_n((uint32_t *)dst, (uint32_t)v, __ATOMIC_RELAXED);
		return 0;
	}
	case CT_BOOL: {
		bool b;

		if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0) {
			b = true;
		} else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0) {
			b = false;
		} else {
			snprintf(why, whylen, "%s: expected true or false, got '%.32s'", r->path,
				 value);
			return -EINVAL;
		}
		__atomic_store_n((bool *)dst, b, __ATOMIC_RELAXED);
		return 0;
	}
	case CT_LOGLEVEL: {
		int lvl = kvp_log_level_parse(value);

		if (lvl < 0) {
			snprintf(why, whylen,
				 "%s: expected a log level (emerg, alert, crit, err, warning, "
				 "notice, info, debug), got '%.32s'",
				 r->path, value);
			return -EINVAL;
		}
		__atomic_store_n(&cfg->log_level, lvl, __ATOMIC_RELAXED);
		return 0;
	}
	case CT_STR:
		/* Only the main lcore reads runtime strings: a plain copy is enough. */
		if (strlen(value) >= r->size) {
			snprintf(why, whylen, "%s: longer than %zu bytes", r->path, r->size - 1);
			return -EINVAL;
		}
		if (r->off == offsetof(struct kvp_config, stats_file) && value[0]) {
			char dir[sizeof(cfg->stats_dir)];

			/*
			 * The daemon replaces this file (often as root): at run time it
			 * may only move within the directory the file at start named.
			 */
			config_dir_of(value, dir, sizeof(dir));
			if (cfg->stats_dir[0] == '\0') {
				snprintf(why, whylen,
					 "%s: no stats.file was configured at start; set it in the "
					 "file and restart",
					 r->path);
				return -EPERM;
			}
			const char *base =
				value + strlen(cfg->stats_dir) + (strcmp(cfg->stats_dir, "/") != 0);

			if (value[0] != '/' || strcmp(dir, cfg->stats_dir) != 0 ||
			    strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
				snprintf(why, whylen,
					 "%s: at run time only a file in %.128s (the directory "
					 "configured at start), or \"\"",
					 r->path, cfg->stats_dir);
				return -EPERM;
			}
		}
		strcpy(dst, value);
		return 0;
	default:
		snprintf(why, whylen, "%s cannot change at run time", r->path);
		return -EPERM;
	}
}
