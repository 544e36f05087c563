/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_config: the node configuration (struct kvp_config), its limits, and
 * loading, describing, reading and changing it.
 *
 * Threading: written only on the main lcore; workers read runtime knobs
 * with relaxed loads.
 */
#ifndef KVP_CONFIG_H
#define KVP_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvp_rings.h"

/* ---- configuration ---- */

/**
 * Peer slots: limits.max_peers is at most KVP_PEERS_MAX. A peer's handle
 * (what clients name it by, kvp_peer_lookup()) is its slot in the low
 * KVP_PEER_SLOT_BITS bits and the slot's generation above them, so that a
 * handle of a removed peer never names the one that reuses its slot.
 */
#define KVP_PEER_SLOT_BITS 10
#define KVP_PEERS_MAX	   (1u << KVP_PEER_SLOT_BITS)
/** Most worker lcores per node. */
#define KVP_WORKERS_MAX 64
/** Most TCP connections per worker, peer and direction (tcp.connections). */
#define KVP_TCP_CONNS_MAX 8
/** Most TCP connections (links) per peer and direction: workers x tcp.connections. */
#define KVP_LINKS_MAX 64
#define KVP_PATH_MAX  108 /* sun_path */

struct kvp_peer_conf {
	char node_id[KVP_NODE_ID_MAX];
	char host[64];
	uint16_t port;
};

enum kvp_transport_kind {
	KVP_TRANSPORT_TCP = 0,
	KVP_TRANSPORT_RDMA,
	KVP_TRANSPORT_AUTO,
};

/** A group named in the configuration, looked up when the file is read. */
struct kvp_group {
	char name[64]; /**< as configured (a name or a number); "" = none */
	uint32_t gid;
};

struct kvp_config {
	char node_id[KVP_NODE_ID_MAX];
	char client_socket[KVP_PATH_MAX];
	char admin_socket[KVP_PATH_MAX];
	struct kvp_group client_group; /**< owns the client socket; its members may connect */
	struct kvp_group admin_group;  /**< owns the admin socket (mode 0660) */
	char listen_host[64];
	uint16_t listen_port;
	int transport; /**< enum kvp_transport_kind */
	char cores[16]; /**< "" (EAL arguments decide), "auto" (device-local), "MAIN,WORKER" */
	uint32_t workers; /**< worker lcores: with cores = "auto" how many to place; with EAL
			       lcore arguments how many of them to run; 0 = the default (auto: 1,
			       EAL: every worker lcore given) */
	int log_level; /**< RTE_LOG_* */

	uint32_t max_clients;
	uint32_t max_peers; /**< peer slots: every per-peer table is sized from it at start */
	uint32_t max_regions;
	uint32_t max_inflight; /**< transfers in flight (per worker) */
	uint32_t max_segments;
	uint32_t max_blocks; /**< blocks in one strided segment */
	uint32_t max_fences; /**< fences held at once (per worker) */
	uint32_t client_fences; /**< of them, one client's at most */
	uint32_t sq_entries;
	uint32_t cq_entries;

	uint32_t default_timeout_ms;
	uint32_t connect_timeout_ms;
	uint32_t peer_timeout_ms;
	uint32_t reconnect_ms;
	uint32_t peer_forget_ms; /**< an on-demand or inbound peer without links this long is removed */
	uint32_t admission_timeout_ms;
	uint32_t admin_timeout_ms; /**< an admin request line or reply must finish within this */
	uint32_t admin_idle_ms;	   /**< an admin connection with nothing to do is closed after this */
	uint32_t fence_hold_ms;	   /**< a fence refuses matching transfers this long by default */
	uint32_t fence_hold_max_ms; /**< the longest hold a client may ask for */

	bool busy_poll;
	bool busy_poll_set; /**< poll.busy was given in the file (else cores = "auto" may choose it) */
	uint32_t idle_us;     /**< an idle worker polls at least this long before it blocks */
	uint32_t idle_max_us; /**< and up to this long while work keeps coming soon (0: idle_us only) */

	uint32_t tcp_frame_max;
	uint32_t tcp_rx_buffer;
	uint32_t tcp_tx_frames;
	uint32_t tcp_send_iov;
	uint32_t tcp_conns;	/**< TCP connections per worker, peer and direction (links) */
	bool tcp_zerocopy;	/**< IORING_OP_SENDMSG_ZC instead of copying sends */
	bool tcp_fixed;		/**< receive buffers as io_uring registered buffers (read_fixed) */
	char tcp_congestion[16];   /**< TCP congestion control of peer links; "" = the system's */
	uint32_t stage_pool;	/**< bytes of staging buffers per worker */
	uint32_t stage_buf;	/**< bytes per staging buffer */
	bool stage_host;	/**< stage host regions too (no zero-copy) */

	char auth_secret[256]; /**< shared secret; empty = peers are not authenticated */
	bool auth_none;	       /**< auth = "none": unauthenticated on purpose (any listen address) */
	bool accept_unknown;   /**< accept_unknown_peers: a node not in the table may connect [runtime] */

	/* RDMA transport (lib/gdr). */
	char rdma_devices[256];	   /**< "dev[:port],..." rails to use; "" = every active port */
	char rdma_gid[16];	   /**< "auto" (RoCE v2 of the listen address family) or an index */
	uint32_t rdma_qps_per_rail; /**< RC QPs per (peer, rail) and direction */
	uint32_t rdma_sq_depth;	   /**< send WRs outstanding per QP */
	uint32_t rdma_rq_depth;	   /**< receive WRs posted per QP (WRITE_WITH_IMM notices) */
	uint32_t rdma_inline;	   /**< writes up to this size go inline */
	uint32_t rdma_chunk;	   /**< striping unit: larger segments are split across rails */
	uint32_t rdma_window;	   /**< bytes of WRITEs outstanding per QP */
	uint32_t rdma_signal_every; /**< request a completion at least every N WRs */
	uint32_t rdma_timeout;	   /**< QP ack timeout exponent (4.096 us * 2^N) */
	uint32_t rdma_retry;	   /**< QP retry count */
	bool rdma_dmabuf_host;	   /**< register host regions through a udmabuf dma-buf (tests) */

	bool stats_enabled;	    /**< phase histograms and slowest transfers [runtime] */
	char stats_file[256];	    /**< Prometheus text file written periodically; "" = none */
	/** Directory of stats_file at start: config_set may only move the file within it. */
	char stats_dir[256];
	uint32_t stats_interval_ms; /**< period of the stats file; 0 = only on SIGUSR1 */
	uint32_t slowest_window_s;  /**< the slowest-transfers table keeps this recent a past */

	/** The file's peer list: the starting set (the node's table changes at run time). */
	uint32_t npeers;
	struct kvp_peer_conf peers[KVP_PEERS_MAX];
};

/** Fill @p cfg with the defaults of every key. */
void kvp_config_defaults(struct kvp_config *cfg);

/**
 * Load and validate a libconfig file over the defaults.
 *
 * @param err  receives "FILE:LINE: message" on failure
 * @return 0; -EINVAL on any error (syntax, unknown key, wrong type, out of
 *   range, missing node_id, bad peer list); -ENOENT if the file is missing
 */
int kvp_config_load(const char *path, struct kvp_config *cfg, char *err, size_t errlen);

/** Index of @p node_id among the configured peers, or -1. */
int kvp_config_peer_index(const struct kvp_config *cfg, const char *node_id);

/** A node id as the configuration accepts it: 1..31 of letters, digits, '-', '_', '.'. */
bool kvp_config_node_id_ok(const char *id);

/**
 * Split "host:port" (the last ':' separates; "[v6]:port" keeps its brackets
 * in @p host) as the configuration's addresses are read.
 *
 * @return 0; -EINVAL (no port, port 0 or above 65535, empty or too long host)
 */
int kvp_config_parse_hostport(const char *s, char *host, size_t hlen, uint16_t *port);

/** Kinds of configuration values, as config_get reports them. */
enum kvp_config_kind {
	KVP_CONF_INT = 0,
	KVP_CONF_BOOL,
	KVP_CONF_STR,
};

/** What config_get tells about one key besides its value. */
struct kvp_config_info {
	const char *key;
	int kind;	   /**< enum kvp_config_kind */
	bool runtime;	   /**< config_set may change it while running */
	bool secret;	   /**< the value is never shown */
	uint32_t min, max; /**< bounds of KVP_CONF_INT keys */
	const char *fixed; /**< why it cannot change at run time (NULL if it can) */
};

/**
 * Describe the @p i-th key of the configuration table (table order).
 *
 * @return 0; -ENOENT past the last key
 */
int kvp_config_describe(unsigned i, struct kvp_config_info *info);

/**
 * Current value of @p key as text: integers in decimal, booleans as
 * "true"/"false", log levels and transports by name, secrets as "(set)" or "".
 *
 * @param info  if not NULL, receives the key's description
 * @return 0; -ENOENT for an unknown key
 */
int kvp_config_get(const struct kvp_config *cfg, const char *key, char *buf, size_t len,
		   struct kvp_config_info *info);

/**
 * Change a runtime knob (main lcore). The value is parsed and bounded by the
 * same table row that parses the file; workers see the new value with a
 * relaxed load. Side effects (log level) are the caller's.
 *
 * @param why  receives the reason on failure
 * @return 0; -ENOENT (unknown key); -EPERM (fixed at start: @p why says
 *   why); -EINVAL (bad value: @p why says what is expected)
 */
int kvp_config_set(struct kvp_config *cfg, const char *key, const char *value, char *why,
		   size_t whylen);

#endif /* KVP_CONFIG_H */
