/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_core: the node: control plane on the main lcore (sockets, peers,
 * clients, admin), on top of the data plane (kvp_worker.h), the transports'
 * interface (kvp_transport.h) and regions (kvp_region.h).
 *
 * Threading: the node is touched only on the main lcore. Statistics are
 * written by one lcore each and read by the main lcore with relaxed loads.
 *
 * Memory: everything here is sized from the configuration at start-up.
 */
#ifndef KVP_CORE_H
#define KVP_CORE_H

#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvp_config.h"
#include "kvp_log.h"
#include "kvp_region.h"
#include "kvp_stats.h"
#include "kvp_topo.h"
#include "kvp_transport.h"
#include "kvp_wire.h"
#include "kvp_worker.h"

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
	uint64_t no_fds;   /**< refused: kvproxyd had no file descriptor left */
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
	uint64_t clients_refused_fds;	/**< clients refused for want of file descriptors */
	uint64_t client_handshake_failures; /**< HELLOs refused or missing (protocol, rings, time) */
	uint64_t ring_violations;	/**< clients disconnected for breaking the ring protocol */
	uint64_t client_accept_pauses;	/**< times the client listener left epoll (no fds) */
	int spare_fd;			/**< given up to accept (and refuse) a connection when out of fds */
	bool client_accept_paused;
	uint64_t client_accept_retry_ns;
	bool admin_accept_paused;
	uint64_t admin_accept_retry_ns;
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
 * @param tps  the transports, in the order transfers are offered to them
 *   (the first names the node's transport)
 * @param err  receives the reason on failure
 * @return 0 or negative errno
 */
int kvp_node_init(struct kvp_node *n, const struct kvp_config *cfg,
		  const struct kvp_transport_ops *const *tps, unsigned ntps, unsigned nworkers,
		  char *err, size_t errlen);

/**
 * Open files a node with this configuration may need at once: per client
 * its socket, completion eventfd and one fd it sent ahead of its request;
 * per peer both directions' links and a dial; admin connections, pending
 * peer handshakes, and a reserve for the EAL, the transports and the CUDA
 * driver.
 */
uint64_t kvp_node_fd_need(const struct kvp_config *cfg);

/**
 * Settle RLIMIT_NOFILE before start: with @p raise, lift the soft limit to
 * the hard one (never lowers it); then compare with kvp_node_fd_need().
 *
 * @param msg  receives what was found (and done), or why it is not enough
 * @return 0; -EMFILE if the limit cannot cover the configuration
 */
int kvp_node_fd_limit(const struct kvp_config *cfg, bool raise, char *msg, size_t msglen);

/**
 * Out of file descriptors: give up the node's spare one and accept one
 * connection on @p lfd, to refuse it with the reason (the caller closes it).
 * @return the connection, or -1 (no spare, or nothing to accept)
 */
int kvp_node_accept_spare(struct kvp_node *n, int lfd);

/** Take the spare descriptor back after kvp_node_accept_spare(). @return false if none was left */
bool kvp_node_spare_restore(struct kvp_node *n);

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
/** Watch the client listener again after a pause for want of file descriptors. */
void kvp_client_accept_resume(struct kvp_node *n);
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
 * node_exporter textfile convention). The temporary file gets an
 * unpredictable name in the target's directory and is created with O_EXCL |
 * O_NOFOLLOW; rename() replaces the target name itself, never what a link
 * there points to. Main lcore.
 *
 * @return 0; -ENOENT if no file is configured; negative errno on I/O failure
 */
int kvp_stats_write_file(struct kvp_node *n);

/** Run the doctor's checks and log them (warnings for misplaced lcores); main lcore. */
void kvp_node_log_doctor(struct kvp_node *n);

/** Start (true) or stop (false) draining: new submissions fail with "shutdown". */
void kvp_node_set_draining(struct kvp_node *n, bool on);

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
