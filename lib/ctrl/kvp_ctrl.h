/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_ctrl: the node: control plane on the main lcore (sockets, peers,
 * clients, admin), on top of the data plane (kvp_worker.h), the transports'
 * interface (kvp_transport.h) and regions (kvp_region.h).
 *
 * Threading: the node is touched only on the main lcore. Statistics are
 * written by one lcore each and read by the main lcore with relaxed loads.
 *
 * Memory: everything here is sized from the configuration at start-up.
 */
#ifndef KVP_CTRL_H
#define KVP_CTRL_H

#include <pthread.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "kvp_config.h"
#include "kvp_log.h"
#include "kvp_region.h"
#include "kvp_stats.h"
#include "kvp_topo.h"
#include "kvp_transport.h"
#include "kvp_wire.h"
#include "kvp_worker.h"

/* ---- the node: control plane on the main lcore ---- */

struct kvp_node;

/** An fd of the main lcore's event loop and what to do when it is ready (owned by its module). */
typedef void (*kvp_watch_fn)(struct kvp_node *n, void *arg, uint32_t events);

struct kvp_watch {
	int fd; /**< -1 while not watched */
	kvp_watch_fn fn;
	void *arg;
};

/** A periodic job of the main lcore (owned by its module). */
typedef void (*kvp_timer_fn)(struct kvp_node *n, uint64_t now);

struct kvp_timer {
	uint64_t period_ns; /**< 0: every loop pass */
	uint64_t due_ns;
	kvp_timer_fn fn;
	struct kvp_timer *next;
};

/** What the main lcore does with one type of message from the workers. */
typedef void (*kvp_msg_fn)(struct kvp_node *n, const struct kvp_msg *m);

/** The main lcore's event loop (loop.c). */
struct kvp_loop {
	int epfd;
	int evfd; /**< workers ring it after posting to their outbox */
	struct kvp_watch evfd_watch;
	struct kvp_timer *timers;
	kvp_msg_fn on_msg[KVP_MSG_TYPES];
	int spare_fd; /**< given up to accept (and refuse) a connection when out of fds */
};

/**
 * A slow step of the control plane (mapping a region, registering it,
 * unmapping it): run() on a helper thread, then done() back on the main
 * lcore's loop. The caller owns the job (embedded in what it works for)
 * until done() runs.
 */
struct kvp_job {
	void (*run)(struct kvp_job *j);
	void (*done)(struct kvp_node *n, struct kvp_job *j);
	struct kvp_job *next;
};

#define KVP_JOB_THREADS 2

/** The helper threads and their queues (jobs.c); the lists are under lock. */
struct kvp_jobs {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct kvp_job *q_head, *q_tail;       /**< waiting for a helper */
	struct kvp_job *done_head, *done_tail; /**< run, waiting for the main lcore */
	pthread_t th[KVP_JOB_THREADS];
	unsigned nth;	      /**< helpers started (0: jobs run inline) */
	bool quit;
	int evfd;	      /**< a helper rings it after a job ran */
	struct kvp_watch watch;
	uint32_t busy;	      /**< jobs posted and not yet done (main lcore) */
	uint64_t ran;	      /**< jobs done (main lcore) */
};

/** KVP_LINK_UP: no dial in progress; every link up or waiting for a retry. */
enum kvp_peer_link {
	KVP_LINK_DOWN = 0,
	KVP_LINK_CONNECTING, /**< TCP connect in progress */
	KVP_LINK_HELLO,	     /**< connected, handshake in progress */
	KVP_LINK_RESOLVING,  /**< its host name is being (or waits to be) resolved (peer_dns.c) */
	KVP_LINK_UP,	     /**< handed to a worker */
};

/** Where a peer came from ("origin" in kvproxyctl peers). */
enum kvp_peer_origin {
	KVP_PEER_CONFIG = 1, /**< the configuration file, at start or on reload */
	KVP_PEER_ADMIN,	     /**< peer_add */
	KVP_PEER_ON_DEMAND,  /**< a client named it by address (kvp_peer_lookup "host:port") */
	KVP_PEER_INBOUND,    /**< it connected to this node (accept_unknown_peers) */
};

/** A peer slot's life (peer_table.c). */
enum kvp_peer_slot_state {
	KVP_PS_FREE = 0,
	KVP_PS_ACTIVE,
	KVP_PS_DRAINING, /**< removed: new transfers refused, those in flight end, links close */
};

/**
 * Control-plane state of one peer slot (limits.max_peers of them). Its links
 * are dialled one at a time, lowest missing first; the out_* dial state is
 * the current one's. A peer without an address (inbound) is never dialled.
 */
struct kvp_peer {
	uint8_t slot_state; /**< enum kvp_peer_slot_state */
	uint8_t origin;	    /**< enum kvp_peer_origin */
	uint8_t gen;	    /**< the slot's generation: part of the handle clients hold */
	uint8_t why;	    /**< enum kvp_peer_why as the workers were last told */
	uint16_t closing;   /**< DRAINING: workers that have not closed it yet */
	uint64_t close_unsent; /**< DRAINING: workers (bits) the close message could not reach yet */
	char node_id[KVP_NODE_ID_MAX]; /**< "" until its handshake told it (on demand) */
	char host[64];		       /**< "" : no address (inbound) */
	uint16_t port;
	char addr[72];		  /**< "host:port", or "" */
	uint64_t added_ns;
	uint64_t first_up_ns;	  /**< its first outgoing link came up (0: not yet) */
	uint64_t idle_since_ns;	  /**< without any link since then (0: linked); forgetting */
	char removed_why[96];	  /**< DRAINING: why it was removed */
	int out_state; /**< enum kvp_peer_link, the dial in progress */
	int out_fd;
	struct kvp_watch out_watch;
	uint8_t out_link;  /**< link being dialled */
	uint8_t links;	   /**< links kept: ours (workers x tcp.connections), or fewer if the
			        peer accepts fewer */
	uint64_t out_up;   /**< bit per outgoing link handed to a worker */
	uint64_t in_up;	   /**< bit per link of the peer's connections to us */
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
	/* A host name's address, resolved on a helper; kept until a dial to it fails. */
	struct sockaddr_storage dns_addr;
	socklen_t dns_len;
	bool dns_ok;
};

struct kvp_dns_box;

/* Names resolved at once, a thread each: a resolver that never answers holds one. */
#define KVP_DNS_THREADS 4

/** One resolver thread and the name it resolves (peer_dns.c). */
struct kvp_dns_slot {
	struct kvp_dns_box *box; /**< shared with the thread; NULL until it is started */
	pthread_t thread;
	struct kvp_watch watch; /**< the box's eventfd: an answer is in */
	bool busy;		/**< a name is being resolved */
	uint16_t peer;		/**< whose, at its slot's generation gen */
	uint8_t gen;
	uint16_t port;
	char host[64];
};

/** Peers' host names, resolved off the main lcore by up to KVP_DNS_THREADS threads. */
struct kvp_dns {
	struct kvp_dns_slot s[KVP_DNS_THREADS];
	bool stopped; /**< the node stops: no more names */
};

/** An accepted peer connection whose HELLO has not arrived yet. */
struct kvp_pending_conn {
	int fd;
	struct kvp_watch watch;
	int peer;      /**< -1 until the HELLO named a peer in the table (or a new one) */
	uint8_t gen;   /**< the slot's generation when the HELLO named it */
	bool unknown;  /**< a node not in the table: it gets an inbound slot once authenticated */
	char node_id[KVP_NODE_ID_MAX]; /**< who the HELLO says it is */
	uint8_t link;
	bool auth;     /**< HELLO answered; waiting for the peer's proof */
	uint64_t epoch;
	uint8_t nonce[32]; /**< our challenge */
	uint8_t their_nonce[32];
	uint64_t deadline_ns;
	uint32_t have;
	alignas(8) uint8_t buf[sizeof(struct kvp_wire_hdr) + sizeof(struct kvp_wire_hello)];
	struct sockaddr_storage from; /**< the remote address (IP only compared) */
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
	struct kvp_watch watch;
	int32_t pid;
	unsigned worker;
	struct kvp_chan *chan;
	int pending_fd; /**< fd received ahead of its message */
	uint64_t hello_deadline_ns; /**< an OPEN client must say HELLO by then */
	uint32_t rlen;
	uint8_t rbuf[KVP_CTRL_MSGLEN];
	/*
	 * A registration under way on a helper: further requests wait in the
	 * socket, and the slot is not freed until it has come back.
	 */
	bool job_busy;
	bool release_after_job; /**< the client left meanwhile: release the slot when it ends */
};

#define KVP_ADMIN_CONNS	  16
#define KVP_ADMIN_LINEMAX (64u << 10)
#define KVP_PENDING_MAX	  64
/*
 * Of those, from one address: a node dials one link at a time, but a host
 * runs a sidecar per GPU (and pods behind SNAT share an address), all
 * dialling at once after a restart; idle connections from one source still
 * cannot hold more than a quarter of the handshake slots.
 */
#define KVP_PENDING_PER_SOURCE 16

/** One admin connection (main lcore); see admin_conn.c for its bounds. */
struct kvp_admin_conn {
	int fd;
	struct kvp_watch watch;
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

/** A GPU as the CUDA driver describes it (filled at start, for doctor). */
struct kvp_gpu_info {
	int ordinal;
	char name[96];
	char pci[32];
	int dmabuf;	    /**< dma-buf export supported */
	int gpudirect_rdma; /**< GPUDirect RDMA supported */
	uint64_t total_mem;
};

/**
 * What the application chose and found at start (transports, worker lcores,
 * the RDMA and CUDA probes), handed to kvp_node_init() and kept by the node
 * for the doctor, rails and stats.
 */
struct kvp_node_env {
	/** The transports, in the order transfers are offered to them (the first names the node's). */
	const struct kvp_transport_ops *tps[KVP_TP_MAX];
	unsigned ntps;
	unsigned nworkers;
	unsigned lcores[KVP_WORKERS_MAX]; /**< worker i runs on lcores[i] */
	/** Run the control plane's slow steps inline on the main lcore (tests, fuzzing). */
	bool ctrl_inline;
	char transport_why[256]; /**< why this transport was chosen */
	const char *cores_why;	 /**< where the lcores run and why, or NULL */
	int rdma_ports;		 /**< RDMA probe result: ports found, or -errno */
	char rdma_why[160];	 /**< the probe's reason when it found nothing */
	unsigned nrails;
	struct kvp_rail_info rails[KVP_RAILS_MAX]; /**< .paused changes at run time (rail_pause) */
	/** Pause or resume an RDMA rail (NULL without the RDMA transport). @return 0, -ENOENT */
	int (*rail_pause)(unsigned rail, bool pause);
	/** RDMA memory registrations so far (NULL without RDMA). */
	const struct kvp_mr_stats *mr_stats;
	const char *config_path; /**< the file the configuration came from (reload), or NULL */
	int cuda_driver; /**< CUDA driver version, 0 if none */
	int ngpus;	 /**< GPUs found, or -errno */
	struct kvp_gpu_info gpus[KVP_GPUS_MAX];
};

/** The environment of a node without probes: "not probed" reasons, no rails, no GPUs. */
void kvp_node_env_init(struct kvp_node_env *env);

struct kvp_node {
	struct kvp_config cfg;
	uint64_t start_ns;
	struct kvp_loop loop;
	int client_lfd;
	int admin_lfd;
	int peer_lfd;
	struct kvp_watch client_lw, admin_lw, peer_lw; /**< the listeners */
	struct kvp_timer reap_timer, client_timer, admin_timer, peer_timer, peer_table_timer, stats_timer;
	int lock_fd;
	struct kvp_region_table regions;
	const struct kvp_transport_ops *tops;
	struct rte_mempool *msg_pool;
	struct kvp_worker *workers;
	unsigned nworkers;
	/** By client slot: the worker owning the client (the workers read it for landing notices). */
	uint8_t *client_worker;
	uint32_t worker_clients[KVP_WORKERS_MAX]; /**< clients each worker owns */
	struct kvp_client_conn *clients;
	uint32_t nclients;
	struct kvp_peer *peers;	 /**< cfg.max_peers slots (peer_table.c) */
	uint32_t npeers;	 /**< slots not free */
	uint64_t peers_refused_full; /**< peers refused: every slot was taken */
	uint64_t peers_forgotten;    /**< on-demand and inbound peers removed after timeouts.peer_forget_ms */
	struct kvp_pending_conn pending[KVP_PENDING_MAX];
	struct kvp_admin_conn admin[KVP_ADMIN_CONNS];
	struct kvp_admin_stats admin_stats;
	struct kvp_jobs jobs;
	struct kvp_dns dns;
	struct kvp_reg_job *reg_jobs;  /**< one per client slot (a client registers one at a time) */
	struct kvp_rel_job *rel_jobs;  /**< one per region slot (its unmapping) */
	uint64_t loop_max_ns;	       /**< longest pass of the event loop (callbacks and timers) */
	uint32_t registering;	       /**< region registrations running on the helpers */
	uint64_t bad_handshakes;
	uint64_t auth_failures;
	uint64_t clients_refused_cred;	/**< client connections from a uid/group not allowed */
	uint64_t clients_refused_limit; /**< client connections beyond limits.max_clients */
	uint64_t clients_refused_fds;	/**< clients refused for want of file descriptors */
	uint64_t client_handshake_failures; /**< HELLOs refused or missing (protocol, rings, time) */
	uint64_t ring_violations;	/**< clients disconnected for breaking the ring protocol */
	uint64_t client_accept_pauses;	/**< times the client listener left epoll (no fds) */
	bool client_accept_paused;
	uint64_t client_accept_retry_ns;
	bool admin_accept_paused;
	uint64_t admin_accept_retry_ns;
	bool peer_accept_paused;
	uint64_t peer_accept_retry_ns;
	volatile bool quit;

	/* Observability (main lcore). */
	bool draining;
	uint64_t drain_since_ns;
	uint64_t next_stats_ns;	 /**< next periodic write of cfg.stats_file */
	uint64_t stats_writes;	 /**< stats files written */
	int stats_dfd;		 /**< the stats file's directory, opened once (-1: not yet) */
	uid_t stats_duid;	 /**< its owner: a directory made anew in its place must match */
	uint64_t stats_write_errors;
	char *stats_buf;	 /**< stats_len bytes, allocated at start */
	size_t stats_len;	 /**< kvp_stats_text_max() of the configuration */
	char *admin_reply;	 /**< a reply line being built (2 * stats_len: JSON escaping) */
	size_t admin_reply_len;
	struct kvp_node_env env; /**< what the application chose and found at start */
};

/**
 * Size of the Prometheus text buffer (stats file, admin "stats" with format
 * prometheus): room for every peer slot's series and histograms.
 */
size_t kvp_stats_text_max(const struct kvp_config *cfg);

/**
 * Build the node: sockets, region table, message pool, workers and their
 * transports (not launched: the application launches kvp_worker_loop on
 * env->lcores). Call after rte_eal_init().
 *
 * @param env  transports, workers and probe results (copied)
 * @param err  receives the reason on failure
 * @return 0 or negative errno
 */
int kvp_node_init(struct kvp_node *n, const struct kvp_config *cfg,
		  const struct kvp_node_env *env, char *err, size_t errlen);

/**
 * Open files a node with this configuration and @p nworkers workers may
 * need at once: per client its socket, completion eventfd and one fd it
 * sent ahead of its request; per peer both directions' links (tcp.connections
 * per worker) and a dial; admin connections, pending peer handshakes, and a
 * reserve for the EAL, the transports and the CUDA driver.
 */
uint64_t kvp_node_fd_need(const struct kvp_config *cfg, unsigned nworkers);

/**
 * Settle RLIMIT_NOFILE before start: with @p raise, lift the soft limit to
 * the hard one (never lowers it); then compare with kvp_node_fd_need().
 *
 * @param msg  receives what was found (and done), or why it is not enough
 * @return 0; -EMFILE if the limit cannot cover the configuration
 */
int kvp_node_fd_limit(const struct kvp_config *cfg, unsigned nworkers, bool raise, char *msg,
		      size_t msglen);

/** Run the control plane for up to @p timeout_ms (one round of the event loop, timers). */
void kvp_node_poll(struct kvp_node *n, int timeout_ms);

/**
 * Re-read the configuration file (env.config_path; SIGHUP, admin
 * config_reload): peers added to its list connect, peers removed from it
 * drain, runtime keys take their new values, and keys that cannot change
 * at run time are reported and left alone. A file that does not load
 * changes nothing. What was done is logged. Main lcore.
 *
 * @param err  receives the reason on failure
 * @return 0; -ENOENT (no file to reload, or it cannot be read); -EINVAL
 *   (the file does not load: err reads "FILE:LINE: message")
 */
int kvp_node_reload(struct kvp_node *n, char *err, size_t errlen);

/** Ask every worker to stop (their loops return). */
void kvp_node_stop_workers(struct kvp_node *n);

/** Tear down after the workers have returned. */
void kvp_node_fini(struct kvp_node *n);

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

#endif /* KVP_CTRL_H */
