/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_log: logging of every part of kvproxyd (the kvp.* DPDK log types,
 * rate-limited data-path lines) and the monotonic clock they stamp with.
 */
#ifndef KVP_LOG_H
#define KVP_LOG_H

#include <inttypes.h>
#include <stdint.h>

#include <rte_log.h>

/* ---- logging ---- */

extern int kvp_logtype_core;
extern int kvp_logtype_tcp;
extern int kvp_logtype_gdr;
extern int kvp_logtype_app;

#define KVP_LOG(level, mod, fmt, ...)                                                      \
	rte_log(RTE_LOG_##level, kvp_logtype_##mod, "kvp.%s: " fmt "\n", #mod, ##__VA_ARGS__)

/*
 * Data-path logging: at most one line per second per call site, with the
 * number of lines suppressed since the last one.
 */
#define KVP_LOG_RL(level, mod, fmt, ...)                                                   \
	do {                                                                               \
		static uint64_t kvp_rl_last_;                                              \
		static uint64_t kvp_rl_dropped_;                                           \
		uint64_t kvp_rl_now_ = kvp_mono_ns();                                      \
		if (kvp_rl_now_ - kvp_rl_last_ >= 1000000000ull || kvp_rl_last_ == 0) {    \
			KVP_LOG(level, mod, fmt " (%" PRIu64 " similar suppressed)",       \
				##__VA_ARGS__, kvp_rl_dropped_);                           \
			kvp_rl_last_ = kvp_rl_now_;                                        \
			kvp_rl_dropped_ = 0;                                               \
		} else {                                                                   \
			kvp_rl_dropped_++;                                                 \
		}                                                                          \
	} while (0)

/** Register the kvp.* log types (idempotent). */
void kvp_log_init(void);

/**
 * Set the level of all kvp.* log types by name ("err", "info", "debug", ...).
 *
 * @return 0, or -EINVAL for an unknown name
 */
int kvp_log_set_level(const char *name);

/** RTE_LOG_* level for a name, or -EINVAL. */
int kvp_log_level_parse(const char *name);

/** Name of an RTE_LOG_* level. */
const char *kvp_log_level_name(int level);

/** CLOCK_MONOTONIC in nanoseconds (comparable with the client's submit_ns). */
uint64_t kvp_mono_ns(void);

/** @p t + @p rel, saturating: a relative time near UINT64_MAX means "never", not the past. */
static inline uint64_t
kvp_time_after(uint64_t t, uint64_t rel)
{
	return rel > UINT64_MAX - t ? UINT64_MAX : t + rel;
}

#endif /* KVP_LOG_H */
