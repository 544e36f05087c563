/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libkvproxy internals shared by client.c (channel, data path, public calls)
 * and ctrl.c (the control socket: bounded sends and receives, control calls,
 * connect, liveness). Hidden from the shared library's symbol table; the
 * client_ prefix keeps them clear of an application's names when it links
 * the static library.
 */
#ifndef CLIENT_PRIV_H
#define CLIENT_PRIV_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvp_backoff.h"
#include "kvproxy.h"

#define HELLO_FDS     3
#define CTRL_FDS_MAX  HELLO_FDS
#define NSEC_PER_SEC  1000000000ull
#define NSEC_PER_MSEC 1000000ull
#define GONE_CHECK_NS ((uint64_t)KVP_GONE_CHECK_US * 1000)
#define NO_DEADLINE   UINT64_MAX

struct kvp_client {
	int sock;
	int sq_doorbell; /* we write it when the daemon sleeps on the SQ */
	int cq_notify;   /* the daemon writes it when we sleep on the CQ */
	void *chan;
	size_t chan_len;
	struct kvp_ring sq;
	struct kvp_ring cq;
	uint64_t seq;
	/*
	 * Non-zero while a control call waits for its reply: kvp_wait() may run
	 * on another thread and must then not mistake that reply for garbage.
	 */
	atomic_uint ctrl_gen; /* odd while a control call runs; bumped at its start and end */
	/* The socket hung up: the daemon is gone. Set by any thread, never cleared. */
	atomic_bool gone;
	/* A timeout left half a message on the socket: request/reply framing is lost. */
	bool ctrl_broken;
	int ctrl_timeout_ms; /* -1: no bound */
	/* kvp_wait() polls this long before it blocks, or KVP_WAIT_SPIN_AUTO. */
	uint32_t wait_spin_us;
	/* How long kvp_wait() took to get a completion, averaged (KVP_WAIT_SPIN_AUTO). */
	_Atomic uint64_t wait_avg_ns;
	/* Last liveness check of the submit thread and of the completion thread. */
	uint64_t sq_check_ns;
	uint64_t cq_check_ns;
	uint32_t client_id;
	uint32_t max_segs; /* daemon limit, clamped to what the SQ can hold */
	/* Header plus max_segs segments, staged for one bulk enqueue. */
	struct kvp_sqe_seg *scratch;
	char node_id[KVP_NODE_ID_MAX];
	char errmsg[KVP_ERRMSG_MAX];
};

/*
 * The adaptive spin (KVP_WAIT_SPIN_AUTO, kvp_backoff.h): from
 * KVP_WAIT_SPIN_US up to twice the average wait while that stays under
 * KVP_WAIT_SPIN_MAX_US / 2.
 */
static inline uint64_t
client_wait_spin_ns(uint32_t spin_us, uint64_t avg_ns)
{
	if (spin_us != KVP_WAIT_SPIN_AUTO)
		return (uint64_t)spin_us * 1000;
	return kvp_backoff_spin_ns(avg_ns, (uint64_t)KVP_WAIT_SPIN_US * 1000,
				   (uint64_t)KVP_WAIT_SPIN_MAX_US * 1000);
}

/* The average kvp_wait() keeps: one wait counts as no more than 4 * KVP_WAIT_SPIN_MAX_US. */
static inline uint64_t
client_wait_avg(uint64_t avg_ns, uint64_t took_ns)
{
	return kvp_backoff_avg(avg_ns, took_ns, (uint64_t)KVP_WAIT_SPIN_MAX_US * 4000);
}

#pragma GCC visibility push(hidden)

/** Record @p msg as the reason kvp_last_error() returns. */
void client_set_error(struct kvp_client *c, const char *msg);

/** CLOCK_MONOTONIC in nanoseconds. */
uint64_t client_now_ns(void);

/** The deadline @p timeout_ms from now; NO_DEADLINE for a negative timeout. */
uint64_t client_deadline(int timeout_ms);

/** The daemon hung up: from now on every call says -EPIPE. */
void client_mark_gone(struct kvp_client *c);

/**
 * Has the daemon hung up? A poll() of the socket at most every
 * KVP_GONE_CHECK_US per calling thread (@p last is that thread's stamp).
 */
bool client_gone_check(struct kvp_client *c, uint64_t *last, uint64_t now);

void client_close_fds(int *fds, unsigned int n);

/**
 * One request/reply exchange within @p deadline. On success with
 * @p want_fds > 0, exactly that many fds are returned in @p fds; in every
 * other case none are left open.
 *
 * @return 0; -ETIMEDOUT; -EPIPE (the daemon is gone); -EPROTO (malformed
 *   reply, or the connection is out of step after an earlier timeout); the
 *   daemon's negative errno
 */
int client_ctrl_call_until(struct kvp_client *c, struct kvp_ctrl_req *req, int send_fd,
			   struct kvp_ctrl_rep *rep, int *fds, unsigned int want_fds,
			   uint64_t deadline);

/** client_ctrl_call_until() bounded by the client's control timeout. */
int client_ctrl_call(struct kvp_client *c, struct kvp_ctrl_req *req, int send_fd,
		     struct kvp_ctrl_rep *rep, int *fds, unsigned int want_fds);

void client_ctrl_init(struct kvp_ctrl_req *req, uint16_t op);

/** Connect to @p path within @p deadline. @return 0 with *out; -ETIMEDOUT; -errno */
int client_sock_connect(const char *path, int *out, uint64_t deadline);

#pragma GCC visibility pop

#endif /* CLIENT_PRIV_H */
