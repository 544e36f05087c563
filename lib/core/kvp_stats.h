/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_stats: per-peer, per-rail and per-worker counters, latency
 * histograms, and the KVP_STAT_* accessors.
 *
 * Threading: each counter and histogram is written by one lcore and read
 * by the main lcore with relaxed loads.
 */
#ifndef KVP_STATS_H
#define KVP_STATS_H

#include <stdint.h>

#include "kvp_config.h"
#include "kvp_rings.h"
#include "kvp_wire.h"

/* ---- statistics (one writer lcore each) ---- */

struct kvp_peer_stats {
	uint64_t tx_bytes;
	uint64_t rx_bytes;
	uint64_t tx_xfers; /**< transfers sent and acknowledged */
	uint64_t rx_xfers; /**< transfers landed here from this peer */
	uint64_t tx_frames;
	uint64_t rx_frames;
	uint64_t bad_frames;
	uint64_t conn_errors;
	uint64_t tcp_retrans; /**< TCP segments the kernel retransmitted on our sockets to it */
	uint64_t tcp_zc_bytes; /**< bytes handed to the kernel by SENDMSG_ZC (tcp.zerocopy) */
	uint64_t tcp_zc_copied; /**< ... of which the kernel copied after all (loopback, veth, ...) */
	uint64_t link_tx_bytes[KVP_LINKS_MAX]; /**< payload bytes sent per TCP link */
};

/** Per-rail counters of the RDMA transport. */
struct kvp_rail_stats {
	uint64_t tx_bytes;  /**< bytes written to peers through this rail */
	uint64_t tx_wrs;    /**< RDMA WRITEs posted */
	uint64_t rx_imms;   /**< transfers completed here (WRITE_WITH_IMM received) */
	uint64_t qps_up;    /**< send QPs connected now */
	uint64_t qp_resets; /**< QPs torn down after an error and rebuilt */
	uint64_t wc_errors;
};

#define KVP_WC_STATUS_MAX 24 /**< ibv_wc_status values counted (IBV_WC_TM_RNDV_INCOMPLETE + 1) */

struct kvp_worker_stats {
	uint64_t loops;
	uint64_t busy_ns;
	uint64_t idle_ns;
	uint64_t sleeps;
	uint64_t idle_spin_ns; /**< how long the worker now polls when idle before it blocks */
	uint64_t xfers_submitted;
	uint64_t xfers_landed;
	uint64_t inflight_hwm; /**< most transfer slots ever in use at once */
	uint64_t stage_bufs;   /**< staging buffers (tx + rx shares) */
	uint64_t fixed_bufs;   /**< io_uring registered buffers (0: plain recv/send) */
	uint64_t stage_used;
	uint64_t stage_hwm;
	uint64_t stage_waits;  /**< times framing or landing waited for a buffer */
	uint64_t admin_cancels;
	uint64_t drain_refused;	  /**< submissions refused with "shutdown" while draining */
	uint64_t deadline_misses; /**< transfers that ended after their deadline */
	uint64_t fences;	  /**< fences set */
	uint64_t fences_forced;	  /**< fences that had to tear down queue pairs after timeouts.peer_ms */
	uint64_t fences_refused;  /**< fences refused: the table was full */
	uint64_t fenced_xfers;	  /**< incoming transfers (or parts) a fence refused */
	uint64_t fenced_bytes;	  /**< bytes of them */
	uint64_t fence_ns_max;	  /**< longest time from a fence to nothing more landing */
	uint64_t xlanded;	  /**< landing notices handed to the client's own worker */
	uint64_t xmsg_lost;	  /**< messages to another worker lost: its ring was full */
	uint64_t completions[KVP_STATUS_MAX];
	struct kvp_peer_stats *peer; /**< limits.max_peers rows, by peer slot */
	/* RDMA transport. */
	uint64_t rdma_xfers;	 /**< transfers sent by RDMA (the rest went over TCP) */
	uint64_t rdma_fallbacks; /**< transfers that took TCP although RDMA was up */
	struct kvp_rail_stats rail[KVP_WIRE_RAILS_MAX];
	uint64_t wc_errors[KVP_WC_STATUS_MAX]; /**< work-completion errors by ibv_wc_status */
};

/*
 * Latency histograms: log-linear buckets over nanoseconds, fixed memory.
 * Values up to 1024 ns fall in 4 linear buckets of 256 ns; above that each
 * power of two is split into KVP_HIST_SUB linear buckets (at most 25 %
 * wide), up to 2^(KVP_HIST_MAX_SHIFT+1) ns (~550 s); the last bucket holds
 * everything larger. Bucket i holds values in (upper(i-1), upper(i)], the
 * Prometheus "le" convention. One writer lcore per histogram
 * (kvp_hist_record), any reader (kvp_hist_merge, relaxed loads).
 */
#define KVP_HIST_SUB_BITS  2
#define KVP_HIST_SUB	   (1u << KVP_HIST_SUB_BITS)
#define KVP_HIST_MIN_SHIFT 10
#define KVP_HIST_MAX_SHIFT 38
#define KVP_HIST_BUCKETS   (KVP_HIST_SUB * (KVP_HIST_MAX_SHIFT - KVP_HIST_MIN_SHIFT + 2) + 1)

struct kvp_hist {
	uint64_t sum_ns;
	uint64_t b[KVP_HIST_BUCKETS];
};

/** Bucket of a value in nanoseconds. */
static inline unsigned
kvp_hist_bucket(uint64_t ns)
{
	uint64_t v = ns ? ns - 1 : 0;

	if (v < (1ull << KVP_HIST_MIN_SHIFT))
		return (unsigned)(v >> (KVP_HIST_MIN_SHIFT - KVP_HIST_SUB_BITS));
	unsigned e = 63u - (unsigned)__builtin_clzll(v);
	if (e > KVP_HIST_MAX_SHIFT)
		return KVP_HIST_BUCKETS - 1;
	return KVP_HIST_SUB + (e - KVP_HIST_MIN_SHIFT) * KVP_HIST_SUB +
	       (unsigned)((v >> (e - KVP_HIST_SUB_BITS)) & (KVP_HIST_SUB - 1));
}

/** Inclusive upper bound of bucket @p i in ns; UINT64_MAX for the last one. */
uint64_t kvp_hist_upper(unsigned i);

/** Observations in @p h (sum of its buckets). */
uint64_t kvp_hist_count(const struct kvp_hist *h);

/** Add @p src (read with relaxed loads; it may be live) into @p dst (private). */
void kvp_hist_merge(struct kvp_hist *dst, const struct kvp_hist *src);

/**
 * Upper bound of the bucket that holds the @p q quantile (0 < q <= 1).
 *
 * @return ns; 0 for an empty histogram; for the overflow bucket its lower bound
 */
uint64_t kvp_hist_quantile(const struct kvp_hist *h, double q);

/** Relaxed read of a counter written by another lcore. */
#define KVP_STAT_READ(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
/** Single-writer store visible to relaxed readers without tearing. */
#define KVP_STAT_SET(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
/** Single-writer increment visible to relaxed readers without tearing. */
#define KVP_STAT_ADD(x, v) __atomic_store_n(&(x), (x) + (v), __ATOMIC_RELAXED)

/** Record one observation (the histogram's writer lcore only). */
static inline void
kvp_hist_record(struct kvp_hist *h, uint64_t ns)
{
	KVP_STAT_ADD(h->b[kvp_hist_bucket(ns)], 1);
	KVP_STAT_ADD(h->sum_ns, ns);
}

#endif /* KVP_STATS_H */
