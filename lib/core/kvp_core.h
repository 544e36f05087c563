/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_core: what every part of kvproxyd shares — configuration, logging,
 * the region table, the wire protocol between nodes, per-worker statistics
 * and the transport interface.
 *
 * Threading: the configuration and the region table are written only on the
 * main lcore; worker lcores read regions through kvp_region_get()/put(),
 * which is safe against concurrent removal (refcount + state re-check).
 * Statistics are written by one lcore each and read by the main lcore with
 * relaxed loads.
 *
 * Memory: everything here is sized from the configuration at start-up.
 */
#ifndef KVP_CORE_H
#define KVP_CORE_H

#include <assert.h>
#include <inttypes.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <rte_log.h>

#include "kvp_rings.h"

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

/** Smallest power of two >= @p v (1 for 0). */
static inline uint32_t
kvp_pow2_ceil(uint32_t v)
{
	uint32_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

/** CLOCK_MONOTONIC in nanoseconds (comparable with the client's submit_ns). */
uint64_t kvp_mono_ns(void);

/** @p t + @p rel, saturating: a relative time near UINT64_MAX means "never", not the past. */
static inline uint64_t
kvp_time_after(uint64_t t, uint64_t rel)
{
	return rel > UINT64_MAX - t ? UINT64_MAX : t + rel;
}

/* ---- configuration ---- */

#define KVP_PEERS_MAX 64
/** Most TCP connections (links) per peer and direction. */
#define KVP_LINKS_MAX 8
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
	int log_level; /**< RTE_LOG_* */

	uint32_t max_clients;
	uint32_t max_regions;
	uint32_t max_inflight;
	uint32_t max_segments;
	uint32_t sq_entries;
	uint32_t cq_entries;

	uint32_t default_timeout_ms;
	uint32_t connect_timeout_ms;
	uint32_t peer_timeout_ms;
	uint32_t reconnect_ms;
	uint32_t admission_timeout_ms;
	uint32_t admin_timeout_ms; /**< an admin request line or reply must finish within this */
	uint32_t admin_idle_ms;	   /**< an admin connection with nothing to do is closed after this */

	bool busy_poll;
	uint32_t idle_us;

	uint32_t tcp_frame_max;
	uint32_t tcp_rx_buffer;
	uint32_t tcp_tx_frames;
	uint32_t tcp_send_iov;
	uint32_t tcp_conns;	/**< TCP connections per peer and direction (links) */
	bool tcp_zerocopy;	/**< IORING_OP_SENDMSG_ZC instead of copying sends */
	bool tcp_fixed;		/**< receive buffers as io_uring registered buffers (read_fixed) */
	uint32_t stage_pool;	/**< bytes of staging buffers per worker */
	uint32_t stage_buf;	/**< bytes per staging buffer */
	bool stage_host;	/**< stage host regions too (no zero-copy) */

	char auth_secret[256]; /**< shared secret; empty = peers are not authenticated */

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
	uint32_t stats_interval_ms; /**< period of the stats file; 0 = only on SIGUSR1 */
	uint32_t slowest_window_s;  /**< the slowest-transfers table keeps this recent a past */

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

/* ---- region table ---- */

enum kvp_region_state {
	KVP_REGION_FREE = 0,
	KVP_REGION_ACTIVE,
	KVP_REGION_DEAD, /**< removed; unmapped once refs drops to 0 */
};

struct kvp_region {
	_Atomic uint64_t key;
	_Atomic uint32_t state;
	_Atomic uint32_t refs; /**< in-flight operations using the mapping */
	uint8_t *base;
	uint64_t len;
	uint32_t owner; /**< client id */
	uint32_t flags;
	void *map; /**< what to munmap (page-aligned start) */
	size_t map_len;
	int device;   /**< CUDA device of a GPU region */
	void *cookie; /**< GPU import, released through kvp_memops->release */
	void *xp;     /**< transport registration (RDMA memory regions), NULL if none */
	/* Only while kvp_region_hooks->on_add runs (host regions; -1 otherwise): */
	int fd;		   /**< the client's file */
	uint64_t fd_off;   /**< file offset of map */
};

/**
 * Registration hooks a transport installs to register regions with its
 * hardware once, when they are added (main lcore), not on the data path.
 */
struct kvp_region_hooks {
	void *arg;
	/**
	 * A region is about to be published. Failure is not fatal: the hook
	 * leaves r->xp NULL and the region's data takes the staging path.
	 */
	void (*on_add)(void *arg, struct kvp_region *r, uint32_t slot);
	/** The region is about to be unmapped (no transfer uses it any more). */
	void (*on_remove)(void *arg, struct kvp_region *r, uint32_t slot);
};

/** Registration counters a transport keeps (main lcore writes, readers relaxed). */
struct kvp_mr_stats {
	uint64_t regs;	   /**< memory regions registered */
	uint64_t failures; /**< regions left unregistered (their data is staged) */
	uint64_t dmabuf;   /**< of regs, GPU memory through dma-buf */
	uint64_t peermem;  /**< of regs, GPU memory through peer memory (device pointer) */
	uint64_t deregs;
	uint64_t reg_ns;   /**< total time spent registering */
	uint64_t reg_max_ns;
	char last_error[128];
};

/** Hooks in force (NULL: none). Set before the first region is added. */
extern const struct kvp_region_hooks *kvp_region_hooks;

/** Internal region flag: data moves through the staging pool, never zero-copy. */
#define KVP_REGION_F_STAGE 0x80000000u
/** Internal region flag: base is a device address (never dereferenced by the CPU). */
#define KVP_REGION_F_GPU 0x40000000u
#define KVP_REGION_F_INTERNAL (KVP_REGION_F_STAGE | KVP_REGION_F_GPU)

/**
 * Copies between a region and host memory, for regions that must be
 * staged (GPU memory; host memory when tcp.stage_host is set). The host
 * implementation is memcpy; the CUDA one replaces it without touching the
 * transports.
 */
struct kvp_memops {
	/** Copy [off, off+len) of @p r into @p dst. @return 0 or negative errno */
	int (*to_host)(void *dst, const struct kvp_region *r, uint64_t off, size_t len);
	/**
	 * Start the same copy without waiting (optional): @p dst is valid only
	 * after sync(). Lets many small copies share one wait.
	 * @return 0 or negative errno
	 */
	int (*to_host_async)(void *dst, const struct kvp_region *r, uint64_t off, size_t len);
	/** Wait for every copy this thread started with to_host_async. @return 0 or negative errno */
	int (*sync)(void);
	/** Copy @p len bytes of @p src to [off, off+len) of @p r. @return 0 or negative errno */
	int (*from_host)(const struct kvp_region *r, uint64_t off, const void *src, size_t len);
	/** Called once for the whole staging pool at start (e.g. to pin it for DMA). */
	int (*register_pool)(void *base, size_t len);
	/**
	 * Import a client's GPU allocation (KVP_REGION_CUDA_IPC: @p ipc, the
	 * region starting @p offset bytes into it; KVP_REGION_CUDA_VMM: @p fd,
	 * offset 0). NULL where GPU memory is unsupported.
	 * @return 0 with *dptr and *cookie set; -ENODEV, -EINVAL with @p why
	 */
	int (*import)(uint32_t kind, int device, int fd, const uint8_t ipc[64], uint64_t offset,
		      uint64_t len, uint64_t *dptr, void **cookie, char *why, size_t whylen);
	/** Undo import(). */
	void (*release)(void *cookie);
	/**
	 * Export GPU region @p r as a dma-buf for RDMA registration (optional).
	 * @return 0 with *fd (the caller closes it) and *offset of r->base in
	 *   the buffer; negative errno when the driver cannot
	 */
	int (*dmabuf_fd)(const struct kvp_region *r, int *fd, uint64_t *offset);
	/**
	 * Make RDMA writes into GPU memory of @p device visible to the GPU
	 * before the data is reported landed (optional). @return 0 or negative errno
	 */
	int (*flush_writes)(int device);
};

/** Why GPU regions are refused on this node (set at start when CUDA is unusable). */
extern char kvp_gpu_unavailable[160];

/** The memops in force (host memcpy by default). */
extern const struct kvp_memops *kvp_memops;

struct kvp_region_table {
	uint32_t size;
	uint32_t used;
	struct kvp_region *slots;
};

/**
 * Allocate a table of @p max regions (max <= 65536).
 *
 * @return 0, -EINVAL, -ENOMEM
 */
int kvp_region_table_init(struct kvp_region_table *t, uint32_t max);

/** Unmap everything and free the table (no lcore may still use it). */
void kvp_region_table_fini(struct kvp_region_table *t);

/**
 * Map [off, off+len) of @p fd and publish it under a new random key (main lcore).
 *
 * @return 0; -EINVAL (empty or overflowing range, fd not mappable);
 *   -EPERM (fd not sealed against shrinking: F_SEAL_SHRINK); -ENOSPC
 *   (table full); -ENOMEM
 */
int kvp_region_add(struct kvp_region_table *t, uint32_t owner, int fd, uint64_t off,
		   uint64_t len, uint32_t flags, uint64_t *key);

/**
 * Publish GPU memory that kvp_memops->import() mapped (main lcore); the
 * region owns @p cookie from now on.
 *
 * @return 0; -ENOSPC (table full)
 */
int kvp_region_add_gpu(struct kvp_region_table *t, uint32_t owner, uint64_t dptr, uint64_t len,
		       int device, void *cookie, uint64_t *key);

/**
 * Remove one region of @p owner (main lcore).
 *
 * @return 0; -ENOENT if @p key is not an active region of @p owner;
 *   -EBUSY if transfers still use it
 */
int kvp_region_remove(struct kvp_region_table *t, uint64_t key, uint32_t owner);

/** Mark every region of @p owner dead (client gone); unmapping is deferred. */
void kvp_region_remove_owner(struct kvp_region_table *t, uint32_t owner);

/** Unmap dead regions nobody uses any more (main lcore, periodically). @return unmapped */
unsigned kvp_region_reap(struct kvp_region_table *t);

/** Regions of @p owner still present (active or dead). */
unsigned kvp_region_count(const struct kvp_region_table *t, uint32_t owner);

/**
 * Look up an active region and take a reference (any lcore).
 *
 * @return the region, or NULL if @p key is unknown or being removed
 */
struct kvp_region *kvp_region_get(struct kvp_region_table *t, uint64_t key);

/** Drop a reference taken by kvp_region_get(). */
static inline void
kvp_region_put(struct kvp_region *r)
{
	/* Pairs with the main lcore's load of refs in reap/remove. */
	atomic_fetch_sub_explicit(&r->refs, 1, memory_order_release);
}

/** True if [off, off+len) lies inside the region and len > 0. */
static inline bool
kvp_region_contains(const struct kvp_region *r, uint64_t off, uint64_t len)
{
	return len > 0 && off <= r->len && len <= r->len - off;
}

/* ---- wire protocol between nodes (little-endian, TCP control/data stream) ---- */

#define KVP_WIRE_MAGIC	 0x564bu /* "KV" */
#define KVP_WIRE_VERSION 1u

enum kvp_wire_type {
	KVP_W_HELLO = 1, /**< payload struct kvp_wire_hello; first frame each way */
	KVP_W_DATA,	 /**< payload bytes for [off, off+len) of region key */
	KVP_W_END,	 /**< transfer tag complete: aux = user_id, off = bytes, aux2 = nseg */
	KVP_W_ACK,	 /**< receiver -> sender: tag landed, aux = enum kvp_status */
	KVP_W_ABORT,	 /**< sender gave up on tag; receiver forgets it */
	KVP_W_PING,	 /**< liveness; answered by PONG */
	KVP_W_PONG,
	/* RDMA transport control, over the same TCP connections (lib/gdr). */
	KVP_W_RDMA_QP,	  /**< sender -> receiver: connect this QP (struct kvp_wire_qp) */
	KVP_W_RDMA_QP_OK, /**< receiver -> sender: its end of the QP (struct kvp_wire_qp) */
	KVP_W_RDMA_REQ,	  /**< sender -> receiver: grant key; off = bytes, aux = user_id,
			       aux2 = nseg, rsvd = destination regions in this transfer */
	KVP_W_RDMA_GRANT, /**< receiver -> sender: struct kvp_wire_grant for key */
	KVP_W_RDMA_RESET, /**< either way: QP slot aux (generation aux2) failed; rebuild it */
	KVP_W_TYPE_MAX
};

#define KVP_WIRE_RAILS_MAX 8 /**< rails a node may offer to one peer */
#define KVP_RESET_NO_RDMA  1u /**< RDMA_RESET rsvd: this node has no RDMA; send over TCP */

/** Payload of RDMA_QP and RDMA_QP_OK: one end of an RC queue pair. */
struct kvp_wire_qp {
	uint8_t gid[16];
	uint32_t qpn;
	uint32_t psn;
	uint32_t gen;	  /**< the sender's generation of this QP slot (echoed) */
	uint16_t lid;
	uint8_t slot;	  /**< QP slot among the sender's QPs to this peer */
	uint8_t rail;	  /**< rail (local to the frame's sender) the QP lives on */
	uint8_t nrails;	  /**< rails of the frame's sender */
	uint8_t mtu;	  /**< IBV_MTU_* of the port */
	uint8_t status;	  /**< QP_OK: 0, or 1 when the receiver could not build its end */
	uint8_t link_layer;
	uint32_t rsvd;
};

static_assert(sizeof(struct kvp_wire_qp) == 40, "wire ABI");

/** Payload of RDMA_GRANT: where the sender may write, per receiver rail. */
struct kvp_wire_grant {
	uint64_t addr; /**< region base as the receiver's NIC sees it */
	uint64_t len;  /**< region length */
	uint32_t imm;  /**< WRITE_WITH_IMM value that completes the transfer */
	uint8_t status; /**< enum kvp_grant_status */
	uint8_t nrails;
	uint16_t rsvd;
	uint32_t rkey[KVP_WIRE_RAILS_MAX];
};

static_assert(sizeof(struct kvp_wire_grant) == 56, "wire ABI");

enum kvp_grant_status {
	KVP_GRANT_OK = 0,
	KVP_GRANT_NOREGION, /**< unknown region: the transfer fails (remote refusal) */
	KVP_GRANT_NOMR,	    /**< region not registered for RDMA: the sender stages it over TCP */
	KVP_GRANT_BUSY,	    /**< no grant slot free: the sender stages it over TCP */
};

struct kvp_wire_hdr {
	uint16_t magic;
	uint8_t version;
	uint8_t type;
	uint32_t len;  /**< payload bytes after the header */
	uint64_t tag;  /**< sender's transfer tag */
	uint64_t key;  /**< DATA: destination region; END: first destination region */
	uint64_t off;  /**< DATA: destination offset; END: total bytes */
	uint64_t aux;  /**< END: user_id; ACK: status */
	uint32_t aux2; /**< END: segment count */
	uint32_t rsvd;
};

static_assert(sizeof(struct kvp_wire_hdr) == 48, "wire ABI");

struct kvp_wire_hello {
	char node_id[KVP_NODE_ID_MAX]; /**< sender's node id */
	char to_node[KVP_NODE_ID_MAX]; /**< node id the sender believes it talks to */
	uint64_t epoch;		       /**< random per connection attempt */
	uint32_t max_inflight;	       /**< transfers the sender may have in flight */
	uint32_t frame_max;	       /**< largest DATA payload the sender will send */
	uint32_t status;	       /**< reply only: 0 or a kvp_hello_err */
	uint32_t flags;		       /**< KVP_HELLO_F_* */
	uint8_t nonce[32];	       /**< random challenge (authenticated handshakes) */
	uint8_t mac[32];	       /**< HMAC-SHA256 answer to the other side's nonce */
};

#define KVP_HELLO_F_AUTH 0x1u /**< the sender holds the shared secret */
/* Bits 8-15: the link a dialer's HELLO opens; bits 16-23: the sender's tcp.connections. */
#define KVP_HELLO_LINK(f)  (((f) >> 8) & 0xffu)
#define KVP_HELLO_LINKS(f) (((f) >> 16) & 0xffu)
#define KVP_HELLO_F_LINK(l, n) (((uint32_t)(l) << 8) | ((uint32_t)(n) << 16))

static_assert(sizeof(struct kvp_wire_hello) == 152, "wire ABI");

/**
 * Check a received header before trusting any field.
 *
 * @return 0; -EBADMSG (magic, type), -EPROTONOSUPPORT (version),
 *   -EMSGSIZE (payload larger than allowed for the type)
 */
int kvp_wire_check(const struct kvp_wire_hdr *h, uint32_t frame_max);

/** Fill a header (magic/version set, the rest as given). */
static inline void
kvp_wire_hdr_init(struct kvp_wire_hdr *h, uint8_t type, uint32_t len, uint64_t tag)
{
	*h = (struct kvp_wire_hdr){ .magic = KVP_WIRE_MAGIC,
				    .version = KVP_WIRE_VERSION,
				    .type = type,
				    .len = len,
				    .tag = tag };
}

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
	uint64_t completions[KVP_STATUS_MAX];
	struct kvp_peer_stats peer[KVP_PEERS_MAX];
	/* RDMA transport. */
	uint64_t rdma_xfers;	 /**< transfers sent by RDMA (the rest went over TCP) */
	uint64_t rdma_fallbacks; /**< transfers that took TCP although RDMA was up */
	uint64_t rdma_grant_waits; /**< transfers that waited for the receiver's grant */
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


/* ---- transfers, client channels, workers ---- */

struct kvp_worker;
struct rte_ring;
struct rte_mempool;

/** A validated segment; src holds a region reference until the transfer ends. */
struct kvp_seg {
	struct kvp_region *src;
	uint64_t src_off;
	uint64_t dst_key;
	uint64_t dst_off;
	uint64_t len;
};

/** Segments @p a then @p b can move as one: same regions, both ranges contiguous. */
static inline bool
kvp_seg_contiguous(const struct kvp_seg *a, const struct kvp_seg *b)
{
	return a->src == b->src && a->src_off + a->len == b->src_off && a->dst_key == b->dst_key &&
	       a->dst_off + a->len == b->dst_off;
}

/** Timestamps kept per transfer (kvp_mono_ns()); 0 = not reached. */
enum kvp_ts {
	KVP_TS_SUBMIT = 0, /**< client's submit_ns */
	KVP_TS_PICKUP,	   /**< taken from the submission ring (a slot was free) */
	KVP_TS_ADMIT,	   /**< the transport granted window and buffers (first frame queued) */
	KVP_TS_FIRST,	   /**< first byte handed to the transport (kernel took the first frame) */
	KVP_TS_POSTED,	   /**< last byte handed to the transport */
	KVP_TS_ACKED,	   /**< the destination acknowledged every byte */
	KVP_TS_DONE,	   /**< completion delivered to the client (or dropped: client gone) */
	KVP_TS_MAX
};

/**
 * Phases kept in histograms, per peer. Sending side: consecutive,
 * non-overlapping intervals between the timestamps above (QUEUE .. DELIVER
 * add up to TOTAL). Receiving side: RX_RECV and RX_DELIVER.
 */
enum kvp_hphase {
	KVP_HP_QUEUE = 0, /**< submit -> pickup */
	KVP_HP_ADMIT,	  /**< pickup -> admitted */
	KVP_HP_FIRST,	  /**< admitted -> first byte posted */
	KVP_HP_SEND,	  /**< first byte -> last byte posted */
	KVP_HP_WIRE,	  /**< last byte posted -> acknowledged */
	KVP_HP_DELIVER,	  /**< acknowledged -> completion delivered */
	KVP_HP_TOTAL,	  /**< submit -> completion delivered */
	KVP_HP_RX_RECV,	  /**< receiver: first byte received -> last byte landed (END) */
	KVP_HP_RX_DELIVER, /**< receiver: landed -> landing notice delivered */
	KVP_HP_MAX
};

#define KVP_HP_TX_MAX KVP_HP_RX_RECV

/** Name of a histogram phase ("queue", "wire", "rx_receive", ...). */
const char *kvp_hphase_name(int ph);

/** Slowest transfers kept per worker, with their timestamps. */
#define KVP_SLOWEST_N 32

/** One ended transfer in the slowest table (written under its seqlock). */
struct kvp_slow {
	uint32_t seq; /**< odd while the worker rewrites the entry */
	uint32_t client;
	uint64_t user_id;
	uint64_t tag;
	uint64_t bytes;
	uint64_t deadline_ns;
	uint64_t total_ns; /**< submit (or pickup) -> done */
	uint64_t ts[KVP_TS_MAX];
	uint32_t nseg;
	uint16_t peer;
	int16_t status;
};

struct kvp_slowest {
	struct kvp_slow e[KVP_SLOWEST_N];
	uint32_t used;
	uint32_t min_i;	      /**< entry with the smallest total */
	uint64_t oldest_done; /**< earliest TS_DONE among the entries */
};

struct kvp_xfer;

/**
 * Offer an ended transfer to the slowest table (writer lcore). It enters if
 * the table has room, or if it is slower than the fastest entry, or if an
 * entry is older than @p window_ns (which it then replaces).
 */
void kvp_slowest_offer(struct kvp_slowest *t, const struct kvp_xfer *x, uint64_t total_ns,
		       uint64_t now, uint64_t window_ns);

/**
 * Consistent copy of entry @p i (reader lcore).
 *
 * @return true if the entry is in use and was copied without a concurrent write
 */
bool kvp_slowest_read(const struct kvp_slowest *t, unsigned i, struct kvp_slow *out);

enum kvp_xfer_state {
	KVP_XS_FREE = 0,
	KVP_XS_ACTIVE,	 /**< owned by the transport */
	KVP_XS_BACKLOG, /**< ended; its completion waits for room in the CQ */
};

/** A transfer in flight on the sending node; slots are preallocated per worker. */
struct kvp_xfer {
	uint32_t idx; /**< slot in the worker's table; low half of the wire tag */
	uint32_t gen; /**< bumped on reuse; high half of the wire tag */
	uint8_t state;
	uint16_t peer;
	int status; /**< first failure seen, KVP_OK otherwise */
	struct kvp_chan *chan; /**< NULL once the client has gone */
	uint32_t client;       /**< submitting client's id (kept when chan goes) */
	uint64_t user_id;
	uint64_t bytes;
	uint32_t nseg;
	struct kvp_seg *segs;
	uint64_t deadline_ns;
	uint64_t ts[KVP_TS_MAX];
	struct kvp_xfer *next; /**< backlog / transport queue link */
	/* Transport-private progress. */
	uint32_t t_seg;
	uint32_t t_frames; /**< frames of this transfer not yet on the wire */
	uint64_t t_off;
	uint8_t t_state;
	uint16_t t_conn; /**< the connection that carries it */
};

static inline uint64_t
kvp_xfer_tag(const struct kvp_xfer *x)
{
	return ((uint64_t)x->gen << 32) | x->idx;
}

/** A connected client as its worker sees it. */
struct kvp_chan {
	uint32_t id; /**< client id (slot | generation << 16) */
	int32_t pid;
	void *mem;
	size_t len;
	struct kvp_ring sq;
	struct kvp_ring cq;
	int notify_fd; /**< eventfd the client blocks on */
	uint32_t inflight;
	bool broken; /**< protocol violation; the main lcore disconnects it */
	bool broken_sent;
	char broken_why[128]; /**< which index or entry was impossible, with its value */
	struct kvp_xfer *backlog_head;
	struct kvp_xfer *backlog_tail;
};

/** Transport capabilities. */
#define KVP_TCAP_HOST_MEM  0x1u /**< moves host memory */
#define KVP_TCAP_GPU_DIRECT 0x2u /**< reads/writes GPU memory without staging */

/**
 * A transport: one instance per worker lcore; every op is called on that
 * lcore except create/destroy.
 */
struct kvp_transport_ops {
	const char *name;
	uint32_t caps;
	/** Create the per-worker instance. @return 0 or negative errno */
	int (*create)(struct kvp_worker *w, void **tctx);
	void (*destroy)(void *tctx);
	/**
	 * Take over handshaken connection @p link (< tcp.connections) of a
	 * peer (fd ownership passes). @return 0 or negative errno
	 */
	int (*attach)(void *tctx, uint16_t peer, uint8_t link, int fd, bool outgoing,
		      uint64_t epoch);
	/**
	 * Queue a transfer. The transport stamps x->ts[KVP_TS_ADMIT] (window and
	 * buffers granted), FIRST and POSTED (first and last byte handed over)
	 * and ACKED as it gets there; completions and histograms are built from them.
	 * @return 0; -ENOTCONN (no connection to the peer)
	 */
	int (*post)(void *tctx, struct kvp_xfer *x);
	/** Move data and reap completions. @return units of work done (0 = idle) */
	int (*progress)(void *tctx);
	/** Abort a transfer; the transport ends it through kvp_worker_xfer_end(). */
	void (*cancel)(void *tctx, struct kvp_xfer *x, int status);
	/** Before sleeping: flush submissions; @return an fd that turns readable on work */
	int (*sleep_fd)(void *tctx);
	/** Close every connection to @p peer (main lcore asked). */
	void (*disconnect)(void *tctx, uint16_t peer);
};

/** Messages between the main lcore and a worker (rte_ring of pointers). */
enum kvp_msg_type {
	KVP_MSG_CHAN_ADD = 1, /**< main -> worker: poll this channel */
	KVP_MSG_CHAN_DEL,     /**< main -> worker: client gone; reply CHAN_GONE */
	KVP_MSG_CHAN_GONE,    /**< worker -> main: channel no longer referenced */
	KVP_MSG_CHAN_BROKEN,  /**< worker -> main: client broke the ring protocol */
	KVP_MSG_CONN_ADD,     /**< main -> worker: handshaken connection */
	KVP_MSG_CONN_DOWN,    /**< worker -> main: connection closed */
	KVP_MSG_QUIT,
	KVP_MSG_CANCEL, /**< main -> worker: cancel (client, user_id) from the admin socket */
};

struct kvp_msg {
	int type;
	uint16_t peer;
	uint8_t link;
	bool outgoing;
	int fd;
	uint64_t epoch;
	struct kvp_chan *chan;
	uint32_t client;  /**< CANCEL: client id */
	uint64_t user_id; /**< CANCEL */
	char reason[128];
};

struct kvp_worker {
	unsigned idx;
	unsigned lcore;
	const struct kvp_config *cfg;
	struct kvp_region_table *regions;
	const struct kvp_transport_ops *tops;
	void *tctx;
	struct rte_ring *inbox;	 /**< from the main lcore */
	struct rte_ring *outbox; /**< to the main lcore */
	struct rte_mempool *msg_pool; /**< struct kvp_msg, shared with the main lcore */
	int evfd;		 /**< doorbell: clients and the main lcore write it */
	int main_evfd;		 /**< the main lcore's doorbell, rung after an outbox post */

	struct kvp_xfer *xfers;
	uint32_t nxfers;
	uint32_t *free_idx;
	uint32_t nfree;
	struct kvp_seg *segs; /**< nxfers * max_segments */
	struct kvp_sqe_seg *sqe_scratch;

	struct kvp_chan **chans; /**< by client slot */
	uint32_t nchans;
	uint32_t chan_slots;
	uint8_t peer_links[KVP_PEERS_MAX]; /**< outgoing connections up per peer */

	uint64_t next_timer_ns;
	volatile bool quit;
	bool draining; /**< set by the main lcore: refuse new submissions (relaxed) */
	struct kvp_worker_stats stats;
	struct kvp_hist *hist; /**< [peer * KVP_HP_MAX + phase], one row per configured peer */
	struct kvp_slowest slowest;
};

/** Histogram of @p phase for @p peer on worker @p w. */
static inline struct kvp_hist *
kvp_worker_hist(const struct kvp_worker *w, uint16_t peer, int phase)
{
	return &w->hist[(size_t)peer * KVP_HP_MAX + (size_t)phase];
}

/**
 * Allocate a worker's tables from the configuration (start-up only).
 *
 * @return 0, -ENOMEM
 */
int kvp_worker_init(struct kvp_worker *w, unsigned idx, const struct kvp_config *cfg,
		    struct kvp_region_table *regions, const struct kvp_transport_ops *tops,
		    struct rte_mempool *msg_pool);

/** Free what kvp_worker_init() allocated. */
void kvp_worker_fini(struct kvp_worker *w);

/** Handle messages from the main lcore. @return messages handled */
int kvp_worker_inbox(struct kvp_worker *w);

/** Pick up submissions from every channel. @return SQ entries consumed */
int kvp_worker_poll_chans(struct kvp_worker *w);

/** Fail transfers past their deadline, retry CQ backlogs. @return work done */
int kvp_worker_timers(struct kvp_worker *w, uint64_t now);

/** Before sleeping: arm every channel's wakeup. @return false if work arrived */
bool kvp_worker_prepare_sleep(struct kvp_worker *w);

/** After sleeping. */
void kvp_worker_finish_sleep(struct kvp_worker *w);

/** The active transfer with wire tag @p tag, or NULL (ended, reused, or no such slot). */
static inline struct kvp_xfer *
kvp_worker_xfer_of(struct kvp_worker *w, uint64_t tag)
{
	uint32_t idx = (uint32_t)tag;

	if (idx >= w->nxfers)
		return NULL;
	struct kvp_xfer *x = &w->xfers[idx];
	if (x->state != KVP_XS_ACTIVE || kvp_xfer_tag(x) != tag)
		return NULL;
	return x;
}

/** Transport callback: a transfer has ended (acked or failed). */
void kvp_worker_xfer_end(struct kvp_worker *w, struct kvp_xfer *x, int status);

/**
 * Transport callback: a transfer from @p peer landed in region @p dst_key of
 * client @p owner; its first byte arrived at @p first_ns (kvp_mono_ns()).
 */
void kvp_worker_landed(struct kvp_worker *w, uint16_t peer, uint32_t owner, uint64_t user_id,
		       uint64_t dst_key, uint64_t bytes, uint32_t nseg, uint64_t first_ns);

/** Transport callback: a connection closed; the main lcore reconnects. */
void kvp_worker_conn_down(struct kvp_worker *w, uint16_t peer, uint8_t link, bool outgoing,
			  const char *reason);

/** Client slot of a client id (index into kvp_worker.chans). */
static inline uint32_t
kvp_client_slot(uint32_t id)
{
	return id & 0xffffu;
}

/* ---- the node: control plane on the main lcore ---- */

/** KVP_LINK_UP: no dial in progress; every link up or waiting for a retry. */
enum kvp_peer_link {
	KVP_LINK_DOWN = 0,
	KVP_LINK_CONNECTING, /**< TCP connect in progress */
	KVP_LINK_HELLO,	     /**< connected, handshake in progress */
	KVP_LINK_UP,	     /**< handed to a worker */
};


/**
 * Control-plane state of one configured peer. Its links are dialled one at
 * a time, lowest missing first; the out_* dial state is the current one's.
 */
struct kvp_peer {
	int out_state; /**< enum kvp_peer_link, the dial in progress */
	int out_fd;
	uint8_t out_link;  /**< link being dialled */
	uint8_t links;	   /**< links kept: ours, or fewer if the peer accepts fewer */
	uint32_t out_up;   /**< bit per outgoing link handed to the worker */
	uint32_t in_up;	   /**< bit per link of the peer's connections to us */
	uint64_t epoch;
	uint64_t deadline_ns;  /**< connect/handshake deadline */
	uint64_t next_try_ns;  /**< reconnect time while down */
	uint32_t backoff_ms;
	uint8_t nonce[32];     /**< our challenge */
	uint32_t have;	       /**< handshake bytes received */
	alignas(8) uint8_t buf[sizeof(struct kvp_wire_hdr) + sizeof(struct kvp_wire_hello)];
	uint64_t connects;
	uint64_t disconnects;
	uint64_t handshake_failures;
	char last_error[96];
};

/** An accepted peer connection whose HELLO has not arrived yet. */
struct kvp_pending_conn {
	int fd;
	int peer;      /**< -1 until the HELLO named a configured peer */
	uint8_t link;
	bool auth;     /**< HELLO answered; waiting for the peer's proof */
	uint64_t epoch;
	uint8_t nonce[32]; /**< our challenge */
	uint8_t their_nonce[32];
	uint64_t deadline_ns;
	uint32_t have;
	alignas(8) uint8_t buf[sizeof(struct kvp_wire_hdr) + sizeof(struct kvp_wire_hello)];
};

enum kvp_client_state {
	KVP_CL_FREE = 0,
	KVP_CL_OPEN,	  /**< connected, no channel yet */
	KVP_CL_ACTIVE,	  /**< channel handed to a worker */
	KVP_CL_DETACHING, /**< socket closed; waiting for the worker to let go */
};

/** Control-plane state of one client. */
struct kvp_client_conn {
	int state; /**< enum kvp_client_state */
	uint32_t id;
	uint16_t gen;
	int sock;
	int32_t pid;
	unsigned worker;
	struct kvp_chan *chan;
	int pending_fd; /**< fd received ahead of its message */
	uint64_t hello_deadline_ns; /**< an OPEN client must say HELLO by then */
	uint32_t rlen;
	uint8_t rbuf[KVP_CTRL_MSGLEN];
};

#define KVP_ADMIN_CONNS	  16
#define KVP_ADMIN_LINEMAX (64u << 10)
#define KVP_PENDING_MAX	  16

/** One admin connection (main lcore); see admin_conn.c for its bounds. */
struct kvp_admin_conn {
	int fd;
	uint32_t len;	     /**< bytes of unanswered input in buf */
	char *buf;	     /**< KVP_ADMIN_LINEMAX bytes, allocated at start */
	uint64_t active_ns;  /**< accepted or last answered: the idle bound runs from here */
	uint64_t partial_ns; /**< first byte of the unfinished request line; 0 = none */
	char *out;	     /**< reply bytes the socket has not taken yet (malloc'd), or NULL */
	size_t out_len;
	size_t out_off;
	uint64_t out_ns; /**< since when out waits for the client to read */
};

/** Admin connections cut off, by reason (main lcore). */
struct kvp_admin_stats {
	uint64_t accepted;
	uint64_t refused;  /**< KVP_ADMIN_CONNS already open */
	uint64_t slow;	   /**< a request line or a reply took longer than timeouts.admin_ms */
	uint64_t idle;	   /**< nothing to do for timeouts.admin_idle_ms */
	uint64_t too_long; /**< a request line longer than KVP_ADMIN_LINEMAX */
};

/** An RDMA port as found at start (filled by the application from its probe). */
struct kvp_rail_info {
	char dev[64];
	uint8_t port;
	bool active;
	int numa_node; /**< -1 if unknown */
	char pci[32];  /**< "" if unknown */
	int rail;      /**< index among the RDMA transport's rails, -1 if it does not use the port */
	int gid_index; /**< GID the transport uses on it, -1 if none */
	int mtu;       /**< active MTU in bytes */
	bool paused;   /**< rail_pause: no new writes go through it */
};

#define KVP_RAILS_MAX 16

#define KVP_GPUS_MAX 16

/** A GPU as the CUDA driver describes it (filled at start, for doctor). */
struct kvp_gpu_info {
	int ordinal;
	char name[96];
	char pci[32];
	int dmabuf;	    /**< dma-buf export supported */
	int gpudirect_rdma; /**< GPUDirect RDMA supported */
	uint64_t total_mem;
};

struct kvp_node {
	struct kvp_config cfg;
	uint64_t start_ns;
	int epfd;
	int evfd; /**< workers ring it after posting to their outbox */
	int client_lfd;
	int admin_lfd;
	int peer_lfd;
	int lock_fd;
	struct kvp_region_table regions;
	const struct kvp_transport_ops *tops;
	struct rte_mempool *msg_pool;
	struct kvp_worker *workers;
	unsigned nworkers;
	unsigned next_worker;
	struct kvp_client_conn *clients;
	uint32_t nclients;
	struct kvp_peer peers[KVP_PEERS_MAX];
	struct kvp_pending_conn pending[KVP_PENDING_MAX];
	struct kvp_admin_conn admin[KVP_ADMIN_CONNS];
	struct kvp_admin_stats admin_stats;
	uint64_t bad_handshakes;
	uint64_t auth_failures;
	uint64_t clients_refused_cred;	/**< client connections from a uid/group not allowed */
	uint64_t clients_refused_limit; /**< client connections beyond limits.max_clients */
	uint64_t next_reap_ns;
	volatile bool quit;

	/* Observability (main lcore). */
	bool draining;
	uint64_t drain_since_ns;
	uint64_t next_stats_ns;	 /**< next periodic write of cfg.stats_file */
	uint64_t stats_writes;	 /**< stats files written */
	uint64_t stats_write_errors;
	char *stats_buf;	 /**< KVP_STATS_TEXT_MAX bytes, allocated at start */
	char transport_why[256]; /**< why this transport was chosen (for doctor) */
	const char *cores_why;	 /**< where the lcores run and why (for doctor), or NULL */
	int rdma_ports;		 /**< RDMA probe result: ports found, or -errno */
	char rdma_why[160];	 /**< the probe's reason when it found nothing */
	unsigned nrails;
	struct kvp_rail_info rails[KVP_RAILS_MAX];
	/** Pause or resume an RDMA rail (NULL without the RDMA transport). @return 0, -ENOENT */
	int (*rail_pause)(unsigned rail, bool pause);
	/** RDMA memory registrations so far (main lcore; NULL without RDMA). */
	const struct kvp_mr_stats *mr_stats;
	int cuda_driver;	 /**< CUDA driver version, 0 if none */
	int ngpus;		 /**< GPUs found, or -errno (kvp_gpu_unavailable says why) */
	struct kvp_gpu_info gpus[KVP_GPUS_MAX];
};

/** Size of the Prometheus text buffer (stats file, admin "stats" with format prometheus). */
#define KVP_STATS_TEXT_MAX (4u << 20)

/**
 * Build the node: sockets, region table, message pool, workers and their
 * transports (not launched). Call after rte_eal_init().
 *
 * @param err  receives the reason on failure
 * @return 0 or negative errno
 */
int kvp_node_init(struct kvp_node *n, const struct kvp_config *cfg,
		  const struct kvp_transport_ops *tops, unsigned nworkers, char *err,
		  size_t errlen);

/** Run the control plane for up to @p timeout_ms (one epoll round plus timers). */
void kvp_node_poll(struct kvp_node *n, int timeout_ms);

/** Ask every worker to stop (their loops return). */
void kvp_node_stop_workers(struct kvp_node *n);

/** Tear down after the workers have returned. */
void kvp_node_fini(struct kvp_node *n);

/** Post a message to a worker and ring its doorbell. @return 0, -ENOBUFS */
int kvp_node_send(struct kvp_node *n, unsigned worker, struct kvp_msg *m);

/** A message from the pool (main lcore). NULL if the pool is empty. */
struct kvp_msg *kvp_node_msg(struct kvp_node *n, int type);

/* client_srv.c */
void kvp_client_accept(struct kvp_node *n);
void kvp_client_input(struct kvp_node *n, uint32_t slot);
void kvp_client_drop(struct kvp_node *n, struct kvp_client_conn *c, const char *why);
void kvp_client_gone(struct kvp_node *n, struct kvp_chan *ch);
void kvp_client_broken(struct kvp_node *n, struct kvp_chan *ch, const char *why);
void kvp_client_timers(struct kvp_node *n, uint64_t now);

/* peer.c */
int kvp_peer_listen(struct kvp_node *n, char *err, size_t errlen);
void kvp_peer_accept(struct kvp_node *n);
void kvp_peer_pending_input(struct kvp_node *n, uint32_t slot);
void kvp_peer_out_event(struct kvp_node *n, uint16_t peer, uint32_t events);
void kvp_peer_conn_down(struct kvp_node *n, uint16_t peer, uint8_t link, bool outgoing,
			const char *why);
void kvp_peer_timers(struct kvp_node *n, uint64_t now);
void kvp_peer_close_all(struct kvp_node *n);
const char *kvp_peer_state_name(const struct kvp_node *n, uint16_t peer);

/* admin_conn.c */
void kvp_admin_accept(struct kvp_node *n);
/** Input or output room on admin connection @p slot (epoll @p events). */
void kvp_admin_event(struct kvp_node *n, uint32_t slot, uint32_t events);
/** Close admin connections past their bounds (timeouts.admin_ms, admin_idle_ms). */
void kvp_admin_timers(struct kvp_node *n, uint64_t now);
void kvp_admin_close_all(struct kvp_node *n);
/** Admin connections open now. */
unsigned kvp_admin_open(const struct kvp_node *n);

/* admin.c */

/**
 * Handle one JSON-RPC request line; the reply (one line, no newline) is
 * written to @p out. A result that does not fit becomes a "reply too large"
 * error with the request's id. Used by the admin socket and by tests.
 *
 * @return reply length (at most @p outlen); 0 when the request was a
 *   notification, or when @p outlen cannot hold even the error reply
 */
size_t kvp_admin_handle(struct kvp_node *n, const char *line, size_t len, char *out,
			size_t outlen);

/** Render every metric in Prometheus text format. @return bytes written (truncated at outlen) */
size_t kvp_stats_prometheus(const struct kvp_node *n, char *out, size_t outlen);

/**
 * Write the Prometheus text to cfg.stats_file (temporary file + rename, the
 * node_exporter textfile convention). Main lcore.
 *
 * @return 0; -ENOENT if no file is configured; negative errno on I/O failure
 */
int kvp_stats_write_file(struct kvp_node *n);

/** Run the doctor's checks and log them (warnings for misplaced lcores); main lcore. */
void kvp_node_log_doctor(struct kvp_node *n);

/** Start (true) or stop (false) draining: new submissions fail with "shutdown". */
void kvp_node_set_draining(struct kvp_node *n, bool on);

/* topo.c: host topology from sysfs, for doctor and the start-up checks (main lcore) */

/**
 * Name of the interface that owns local address @p ip (getifaddrs).
 *
 * @return 0; -ENOENT if no interface has it (or it is a wildcard)
 */
int kvp_topo_iface_of_addr(const char *ip, char *ifname, size_t len);

/**
 * Interface the kernel would use to reach @p host (a connected UDP socket's
 * local address, nothing is sent).
 *
 * @return 0, or negative errno
 */
int kvp_topo_route_iface(const char *host, uint16_t port, char *ifname, size_t len);

/** Where a network interface sits: its PCI device, NUMA node and device-local CPUs. */
struct kvp_topo_dev {
	char pci[32];	    /**< PCI address, "" for a virtual interface */
	int numa_node;	    /**< -1 if unknown or none */
	char cpulist[128];  /**< CPUs local to the device (sysfs local_cpulist), "" if unknown */
};

/**
 * Look up @p ifname under /sys/class/net.
 *
 * @return 0; -ENOENT (no such interface)
 */
int kvp_topo_netdev(const char *ifname, struct kvp_topo_dev *d);

/**
 * Look up PCI device @p pci (e.g. "0000:3b:00.0") under /sys/bus/pci/devices.
 *
 * @return 0; -ENOENT (no such device)
 */
int kvp_topo_pcidev(const char *pci, struct kvp_topo_dev *d);

/**
 * True if PCI devices @p pci_a and @p pci_b sit behind the same PCIe switch
 * (PIX: their sysfs paths share the bridge above both ports).
 */
bool kvp_topo_same_switch(const char *pci_a, const char *pci_b);

/** True if @p cpu appears in a sysfs CPU list such as "0-3,8,10-11". */
bool kvp_topo_cpulist_has(const char *list, unsigned cpu);

/* epoll tags: kind << 32 | index */
enum kvp_ep_kind {
	KVP_EP_EVFD = 1,
	KVP_EP_CLIENT_LISTEN,
	KVP_EP_CLIENT,
	KVP_EP_ADMIN_LISTEN,
	KVP_EP_ADMIN,
	KVP_EP_PEER_LISTEN,
	KVP_EP_PEER_PENDING,
	KVP_EP_PEER_OUT,
};

static inline uint64_t
kvp_ep_tag(enum kvp_ep_kind k, uint32_t idx)
{
	return ((uint64_t)k << 32) | idx;
}

/** Add @p fd to the node's epoll set. @return 0 or negative errno */
int kvp_node_watch(struct kvp_node *n, int fd, uint32_t events, enum kvp_ep_kind k, uint32_t idx);

/** Change the events watched on @p fd (tag as given). @return 0 or negative errno */
int kvp_node_rewatch(struct kvp_node *n, int fd, uint32_t events, enum kvp_ep_kind k,
		     uint32_t idx);

/** Remove @p fd from the epoll set. */
void kvp_node_unwatch(struct kvp_node *n, int fd);

#endif /* KVP_CORE_H */
