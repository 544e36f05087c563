/* SPDX-License-Identifier: BSD-3-Clause */
/* Configuration internals shared by config.c (table, loader), config_rt.c (get/set) and config_text.c. */
#ifndef CONFIG_PRIV_H
#define CONFIG_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ctype {
	CT_STR,	      /* char[size] */
	CT_U32,	      /* uint32_t in [min, max] */
	CT_BOOL,      /* bool */
	CT_HOSTPORT,  /* "host:port" into listen_host/listen_port */
	CT_TRANSPORT, /* "tcp" | "rdma" | "auto" */
	CT_LOGLEVEL,  /* rte_log level name */
	CT_SECRET_FILE, /* path whose first line becomes auth_secret */
	CT_GROUP,	/* group name or number into struct kvp_group */
	CT_CORES,	/* "" | "auto" | "MAIN,WORKER" CPU numbers */
	CT_AUTH,	/* auth = "none": no peer authentication, on purpose */
};

/* Row flags. */
#define RT     0x1u /* config_set may change it while running */
#define SECRET 0x2u /* never shown by config_get */

struct conf_row {
	const char *path;
	enum ctype type;
	size_t off;
	size_t size;
	uint32_t min;
	uint32_t max;
	uint32_t idef;
	const char *sdef;
	uint32_t flags;
};

/** The table (config.c): one row per key, in file order. */
extern const struct conf_row config_rows[];
extern const size_t config_nrows;

/** The row of @p path ("limits.max_clients"), or NULL. */
const struct conf_row *config_find_row(const char *path);

/** Strict decimal: digits only, no sign, no blanks, no overflow. @return 0, -EINVAL */
int config_parse_u64(const char *v, unsigned long long *out);

/** The directory of absolute path @p p ("/" for "/x"); "" if it ends in '/'. */
void config_dir_of(const char *p, char *dir, size_t len);

/**
 * Read the configuration file at @p path into a new buffer (freed by the
 * caller), with every integer literal suffixed "L" so that libconfig reads
 * it as 64 bits on every version. Line numbers are unchanged.
 *
 * @param err  receives "PATH:LINE: message" on failure
 * @return 0; -ENOENT (cannot read the file); -EINVAL (@include, an integer
 *   past 64 bits, file too large); -ENOMEM
 */
int config_text_load(const char *path, char **out, size_t *outlen, char *err, size_t errlen);

#endif /* CONFIG_PRIV_H */
