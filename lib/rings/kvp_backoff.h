/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Poll, then block: how long a poller of these rings (a client in
 * kvp_wait(), a kvproxyd worker with nothing to do) keeps polling before it
 * blocks on its event fd. Blocking costs a wake-up when the work comes
 * (microseconds on one CPU; on a VM whose idle vCPU halts, tens to hundreds
 * when it comes from another CPU), so a poller that sees work come soon
 * after it went idle polls for about twice the recent wait. Header only:
 * the client library and kvproxyd each inline it.
 */
#ifndef KVP_BACKOFF_H
#define KVP_BACKOFF_H

#include <stdint.h>

/*
 * Polling time for an average wait of @p avg_ns: twice that, at least
 * @p lo_ns. An average above @p hi_ns / 2 means waits so long that one more
 * wake-up hardly shows, so only @p lo_ns is left; so does @p hi_ns <= @p lo_ns
 * (adapting off).
 */
static inline uint64_t
kvp_backoff_spin_ns(uint64_t avg_ns, uint64_t lo_ns, uint64_t hi_ns)
{
	if (hi_ns <= lo_ns || avg_ns > hi_ns / 2)
		return lo_ns;
	return 2 * avg_ns > lo_ns ? 2 * avg_ns : lo_ns;
}

/*
 * The running average of waits: @p took_ns counts 1/8, and as no more than
 * @p cap_ns, so that after one long idle wait a few quick ones bring the
 * polling back.
 */
static inline uint64_t
kvp_backoff_avg(uint64_t avg_ns, uint64_t took_ns, uint64_t cap_ns)
{
	if (took_ns > cap_ns)
		took_ns = cap_ns;
	if (took_ns >= avg_ns)
		return avg_ns + (took_ns - avg_ns) / 8;
	return avg_ns - (avg_ns - took_ns) / 8;
}

#endif /* KVP_BACKOFF_H */
