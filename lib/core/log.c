/* SPDX-License-Identifier: BSD-3-Clause */
/* kvp.* log types on top of rte_log. */
#include <errno.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <rte_log.h>

#include "kvp_log.h"

int kvp_logtype_core = -1;
int kvp_logtype_tcp = -1;
int kvp_logtype_gdr = -1;
int kvp_logtype_app = -1;

void
kvp_log_init(void)
{
	if (kvp_logtype_core >= 0)
		return;
	kvp_logtype_core = rte_log_register_type_and_pick_level("kvp.core", RTE_LOG_INFO);
	kvp_logtype_tcp = rte_log_register_type_and_pick_level("kvp.tcp", RTE_LOG_INFO);
	kvp_logtype_gdr = rte_log_register_type_and_pick_level("kvp.gdr", RTE_LOG_INFO);
	kvp_logtype_app = rte_log_register_type_and_pick_level("kvp.app", RTE_LOG_INFO);
}

static const char *const level_names[] = {
	[RTE_LOG_EMERG] = "emerg", [RTE_LOG_ALERT] = "alert",	  [RTE_LOG_CRIT] = "crit",
	[RTE_LOG_ERR] = "err",	   [RTE_LOG_WARNING] = "warning", [RTE_LOG_NOTICE] = "notice",
	[RTE_LOG_INFO] = "info",   [RTE_LOG_DEBUG] = "debug",
};

int
kvp_log_level_parse(const char *name)
{
	for (int l = (int)RTE_LOG_EMERG; l <= (int)RTE_LOG_DEBUG; l++)
		if (strcasecmp(name, level_names[l]) == 0)
			return l;
	return -EINVAL;
}

const char *
kvp_log_level_name(int level)
{
	if (level < (int)RTE_LOG_EMERG || level > (int)RTE_LOG_DEBUG)
		return "unknown";
	return level_names[level];
}

int
kvp_log_set_level(const char *name)
{
	int l = kvp_log_level_parse(name);

	if (l < 0)
		return l;
	rte_log_set_level_pattern("kvp.*", (uint32_t)l);
	return 0;
}

uint64_t
kvp_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
