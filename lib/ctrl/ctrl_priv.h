/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * lib/ctrl internals: the event loop (loop.c) every module registers with,
 * the JSON-RPC registry and its helpers (admin_rpc.c), the stats table
 * (stats_table.c, stats.c), and each module's init. Layering: node.c
 * puts the modules together; the modules use loop.c and admin_rpc.c, and
 * never node.c.
 */
#ifndef CTRL_PRIV_H
#define CTRL_PRIV_H

#include <jansson.h>
#include <sys/socket.h>

#include "kvp_ctrl.h"

#define RPC_PARSE_ERROR	     -32700
#define RPC_INVALID_REQUEST  -32600
#define RPC_METHOD_NOT_FOUND -32601
#define RPC_INVALID_PARAMS   -32602
#define RPC_INTERNAL_ERROR   -32603

/* Application errors (JSON-RPC reserves -32000..-32099 for servers). */
#define RPC_REFUSED -32001 /* a well-formed request the node will not carry out */

/* ---- the event loop (loop.c) ---- */

int loop_init(struct kvp_node *n);
void loop_fini(struct kvp_node *n);
/** One epoll round, then the timers that are due. */
void loop_run(struct kvp_node *n, int timeout_ms);
/** Watch @p fd through @p w (the caller's) for @p events. @return 0 or negative errno */
int loop_watch(struct kvp_node *n, struct kvp_watch *w, int fd, uint32_t events, kvp_watch_fn fn,
	       void *arg);
/** Change what @p w waits for. @return 0 or negative errno */
int loop_rewatch(struct kvp_node *n, struct kvp_watch *w, uint32_t events);
/** Stop watching (before the fd is closed). */
void loop_unwatch(struct kvp_node *n, struct kvp_watch *w);
/** Run @p fn every @p period_ns (0: every pass) through @p t (the caller's). */
void loop_every(struct kvp_node *n, struct kvp_timer *t, uint64_t period_ns, kvp_timer_fn fn);
/** Handle the workers' messages of @p type with @p fn. */
void loop_on_msg(struct kvp_node *n, int type, kvp_msg_fn fn);
/** A message from the pool for a worker. NULL if the pool is empty. */
struct kvp_msg *ctrl_msg(struct kvp_node *n, int type);
/** Post a message to a worker and ring its doorbell. @return 0, -ENOBUFS */
int ctrl_send(struct kvp_node *n, unsigned worker, struct kvp_msg *m);
/**
 * Out of file descriptors: give up the loop's spare one and accept one
 * connection on @p lfd, to refuse it with the reason (the caller closes it).
 * @return the connection, or -1 (no spare, or nothing to accept)
 */
int ctrl_accept_spare(struct kvp_node *n, int lfd);
/** A listener paused for want of descriptors tries again this often. */
#define ACCEPT_RETRY_NS 100000000ull
/** Take the spare descriptor back after ctrl_accept_spare(). @return false if none was left */
bool ctrl_spare_restore(struct kvp_node *n);

/* ---- helper threads for slow steps (jobs.c) ---- */

/** Start the helpers (none with env.ctrl_inline); regions removed from now on unmap there. */
int jobs_init(struct kvp_node *n);
/** Run what is queued, join the helpers, run the done() of what they ran. */
void jobs_fini(struct kvp_node *n);
/** Run @p j on a helper; its done() follows on the main lcore (at once without helpers). */
void job_post(struct kvp_node *n, struct kvp_job *j);

/* ---- JSON-RPC (admin_rpc.c) ---- */

/* Why a method returned no result: code and message of the JSON-RPC error. */
struct rpc_err {
	int code;
	char msg[256];
};

/** A method: a result, or NULL with the error in @p e (invalid params unless set otherwise). */
typedef json_t *(*admin_method_fn)(struct kvp_node *n, json_t *params, struct rpc_err *e);

/** Offer method @p name (from a module's init). */
void rpc_register(const char *name, admin_method_fn fn);
/** Record a JSON-RPC error for a method; @return NULL (the method's result). */
json_t *admin_fail(struct rpc_err *e, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/** No params, or an empty object/array. */
bool admin_no_params(json_t *params);

/* ---- the stats table (stats_table.c) and its walks (stats.c) ---- */

enum stat_kind {
	SK_VALUE = 0, /* a counter or gauge: JSON value and Prometheus series */
	SK_JSON,      /* a JSON member that is no counter (a name, a list); key NULL: merged */
	SK_SUB,	      /* the section named by key: an object, or an array of its instances */
	SK_REF,	      /* the row of the same key in section ref */
};

/* Where a value lives. */
enum stat_src {
	SS_WORKERS = 0,	/* kvp_worker_stats field, summed over the workers */
	SS_WORKERS_MAX, /* ... the largest */
	SS_WORKER,	/* ... of the instance's worker */
	SS_PEERS,	/* kvp_peer_stats field, summed over workers and peers */
	SS_PEER_STATS,	/* ... of the instance's peer, summed over workers */
	SS_PEER,	/* kvp_peer field (main lcore) */
	SS_RAIL_STATS,	/* kvp_rail_stats field of the instance's rail, summed over workers */
	SS_NODE,	/* kvp_node field of .size bytes (main lcore) */
	SS_MR,		/* kvp_mr_stats field (RDMA registrations) */
	SS_CHAN,	/* kvp_chan_stats field of the instance's client (its worker writes it) */
	SS_FN,		/* fn(node, instance) */
};

enum stat_unit {
	SU_COUNT = 0,
	SU_BOOL,  /* JSON true/false, Prometheus 1/0 */
	SU_NS,	  /* JSON nanoseconds, Prometheus seconds */
	SU_NS_MS, /* JSON milliseconds, Prometheus seconds */
	SU_NS_S,  /* JSON seconds, Prometheus seconds */
};

/* A row whose value is an array: one element per status, WC status or link. */
enum stat_vec { SV_NONE = 0, SV_STATUS, SV_WC, SV_LINK };

#define SF_SHORT 1 /* Prometheus labels name the instance only (no transport; no dev, port) */

struct stat_row {
	const char *sect;  /* "status", "" (the stats reply) or a section of it */
	const char *key;   /* JSON key; NULL: none (derived says what shows it) */
	const char *prom;  /* Prometheus family; NULL: none (derived says what it sums) */
	const char *label; /* the label that tells the rows of one family apart */
	const char *help;  /* the family's HELP, on its first row */
	const char *derived;
	const char *ref;   /* SK_REF: the section holding the row */
	uint8_t kind, src, unit, vec, flags;
	bool gauge;
	size_t off;
	uint8_t size; /* SS_NODE: of the field (1, 2, 4 or 8) */
	uint64_t (*fn)(const struct kvp_node *n, unsigned inst);
	json_t *(*json)(const struct kvp_node *n, unsigned inst);
};

extern const struct stat_row stat_rows[];
extern const unsigned stat_nrows;

/** Name of an ibv_wc_status value ("retry_exc_err", ...). */
const char *stats_wc_name(unsigned st);
/** The channel of the client in slot @p slot, or NULL if none is connected there. */
const struct kvp_chan *stats_client_chan(const struct kvp_node *n, unsigned slot);
/** The port behind rail index @p rail, or NULL. */
const struct kvp_rail_info *stats_rail_port(const struct kvp_node *n, unsigned rail);
/** Worker @p i's struct kvp_peer_stats counter at offset @p off, summed over its peers. */
uint64_t stats_worker_peer_sum(const struct kvp_node *n, unsigned i, size_t off);
/** Histogram of (peer, phase) summed over the workers. */
void stats_hist_of(const struct kvp_node *n, uint16_t peer, int phase, struct kvp_hist *h);

/** Section @p sect of the replies as JSON (null for the RDMA sections without RDMA). */
json_t *stats_json(const struct kvp_node *n, const char *sect);
/** The value of row @p key of section @p sect (0 if there is none). */
uint64_t stats_get(const struct kvp_node *n, const char *sect, const char *key);

/* ---- the modules, put together by node.c ---- */

/* client_srv.c: the client socket's connections (its requests: client_req.c, client_req.h) */
int client_srv_init(struct kvp_node *n);
void kvp_client_accept(struct kvp_node *n);
/** Watch the client listener again after a pause for want of file descriptors. */
void kvp_client_accept_resume(struct kvp_node *n);
void kvp_client_input(struct kvp_node *n, uint32_t slot);
void kvp_client_drop(struct kvp_node *n, struct kvp_client_conn *c, const char *why);
void kvp_client_gone(struct kvp_node *n, struct kvp_chan *ch);
void kvp_client_broken(struct kvp_node *n, struct kvp_chan *ch, const char *why);
void kvp_client_timers(struct kvp_node *n, uint64_t now);

/* peer_table.c: the peer slots (see the file's head for their life) */
int peer_table_init(struct kvp_node *n, char *err, size_t errlen);
void peer_table_fini(struct kvp_node *n);
/** Slot @p slot is taken (active or draining). */
bool peer_live(const struct kvp_node *n, uint32_t slot);
/** The handle clients name slot @p slot by now. */
uint16_t peer_handle(const struct kvp_node *n, uint32_t slot);
/** Its node id, or "host:port" while that is not known. */
const char *peer_label(const struct kvp_node *n, uint32_t slot);
const char *peer_origin_name(int origin);
/** The active slot of @p node_id (with @p draining, a draining one too), or -1. */
int peer_find(const struct kvp_node *n, const char *node_id, bool draining);
/** The active slot dialled at @p host : @p port, or -1. */
int peer_find_addr(const struct kvp_node *n, const char *host, uint16_t port);
/** Say why host:port is refused: it is peer @p holder's (-1: our own listen address). @return -EEXIST, -EINVAL */
int peer_addr_refused(const struct kvp_node *n, int holder, const char *host, uint16_t port,
		      char *why, size_t whylen);
/** May slot @p self (-1: a new one) dial host:port? Not our own, nor another slot's. @return 0 or -errno, with @p why */
int peer_addr_check(const struct kvp_node *n, int self, const char *host, uint16_t port, char *why,
		    size_t whylen);
/**
 * Take a slot for a peer and open it on the workers. @p node_id "" : learned
 * from its handshake (on demand); @p host "" : no address (inbound).
 * @return the slot; -EINVAL (bad or own id or address), -EEXIST (the id or
 *   address is a peer already), -ENOSPC (table full), -ENOBUFS (workers
 *   unreachable); @p why says it in words
 */
int peer_add(struct kvp_node *n, int origin, const char *node_id, const char *host, uint16_t port,
	     char *why, size_t whylen);
/** Drain and free an active slot (see the file's head). @return 0, -ENOENT */
int peer_remove(struct kvp_node *n, uint32_t slot, const char *why);
/** Why transfers to @p slot fail while it has no link (enum kvp_peer_why): told to the workers. */
void peer_set_why(struct kvp_node *n, uint32_t slot, uint8_t why);
/** The node id its handshake told (on demand): kept and told to the workers. */
void peer_set_node_id(struct kvp_node *n, uint32_t slot, const char *node_id);

/** Links kept to each peer and accepted from each: workers x tcp.connections. */
unsigned peer_node_links(const struct kvp_node *n);

/* peer_hello.c: the handshake, shared by both sides */
#define PEER_HELLO_LEN (sizeof(struct kvp_wire_hdr) + sizeof(struct kvp_wire_hello))
/** HELLO reply status: why the acceptor refused. */
enum peer_hello_err {
	PEER_HELLO_OK = 0,
	PEER_HELLO_UNKNOWN_NODE = 1,
	PEER_HELLO_WRONG_TARGET = 2,
	PEER_HELLO_LIMITS = 3,
	PEER_HELLO_AUTH = 4,
	PEER_HELLO_LINK = 5,
	PEER_HELLO_FULL = 6,
};
const char *peer_hello_err_str(uint32_t e);
/**
 * Resolve host:port; with @p numeric only an address (never the resolver,
 * so it cannot block). @return 0, -EAGAIN (numeric, and @p host is a name)
 * or -EHOSTUNREACH
 */
int peer_resolve(const char *host, uint16_t port, bool passive, bool numeric,
		 struct sockaddr_storage *ss, socklen_t *len);
/** A peer's name resolved (peer_dns.c): dial the answer, or fail the dial (@p rc < 0). */
void peer_resolved(struct kvp_node *n, uint16_t i, int rc, const struct sockaddr_storage *ss,
		   socklen_t len);
/** Resolve the next peer waiting in KVP_LINK_RESOLVING, unless a name is being resolved. */
void peer_dns_next(struct kvp_node *n);
/** At stop: no more names; a thread inside the resolver is left to finish alone. */
void peer_dns_stop(struct kvp_node *n);
void peer_fill_hello(struct kvp_node *n, uint8_t *buf, const char *to, uint8_t link,
		     uint64_t epoch, uint32_t status, const uint8_t *nonce, const uint8_t *mac);
void peer_hello_mac(const struct kvp_node *n, char role, const uint8_t *challenge,
		    const uint8_t *own, const char *from, const char *to, uint8_t mac[32]);
bool peer_mac_ok(const uint8_t *a, const uint8_t *b);
void peer_random_bytes(void *p, size_t len);
/** Read what is available of a HELLO. @return 1 complete, 0 partial, <0 error */
int peer_read_hello(int fd, uint8_t *buf, uint32_t *have);
/** Hand a handshaken socket to the worker owning @p link. @return 0 or negative errno */
int peer_hand_over(struct kvp_node *n, uint16_t peer, uint8_t link, int fd, bool outgoing,
		   uint64_t epoch);

/* peer_accept.c: the listener and the handshakes it accepts */
int kvp_peer_listen(struct kvp_node *n, char *err, size_t errlen);
void kvp_peer_accept(struct kvp_node *n);
/** Take an accepted connection as a pending handshake. @return its slot, -ENOSPC (closed) */
int peer_take_pending(struct kvp_node *n, int fd);
void kvp_peer_pending_input(struct kvp_node *n, uint32_t slot);
void peer_pending_timers(struct kvp_node *n, uint64_t now);
void peer_accept_close_all(struct kvp_node *n);

/* peer.c: dialling, link state, timers */
int peer_init(struct kvp_node *n, char *err, size_t errlen);
/** Watch peer @p i's dial (out_fd) for @p events. @return 0 or negative errno */
int peer_out_watch(struct kvp_node *n, uint16_t i, uint32_t events);
void kvp_peer_out_event(struct kvp_node *n, uint16_t peer, uint32_t events);
void kvp_peer_conn_down(struct kvp_node *n, uint16_t peer, uint8_t link, bool outgoing,
			const char *why);
void kvp_peer_timers(struct kvp_node *n, uint64_t now);
void kvp_peer_close_all(struct kvp_node *n);
const char *kvp_peer_state_name(const struct kvp_node *n, uint16_t peer);

/* admin_conn.c */
int admin_conn_init(struct kvp_node *n);
void kvp_admin_accept(struct kvp_node *n);
/** Input or output room on admin connection @p slot (epoll @p events). */
void kvp_admin_event(struct kvp_node *n, uint32_t slot, uint32_t events);
/** Close admin connections past their bounds (timeouts.admin_ms, admin_idle_ms). */
void kvp_admin_timers(struct kvp_node *n, uint64_t now);
void kvp_admin_close_all(struct kvp_node *n);
/** Admin connections open now. */
unsigned kvp_admin_open(const struct kvp_node *n);

/* peer_admin.c: peers, peer_add, peer_remove */
void peer_admin_init(struct kvp_node *n);
/* reload.c: config_reload (and kvp_node_reload()) */
void reload_init(struct kvp_node *n);

/* Each registers its admin methods. */
void admin_methods_init(struct kvp_node *n);
/** What a runtime change of @p key must also do besides storing the value (admin.c). */
void admin_config_applied(struct kvp_node *n, const char *key);
void rails_init(struct kvp_node *n);
void doctor_init(struct kvp_node *n);
void stats_init(struct kvp_node *n);
/* The periodic stats file. */
void stats_file_init(struct kvp_node *n);

#endif /* CTRL_PRIV_H */
