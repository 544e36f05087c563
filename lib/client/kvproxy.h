/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libkvproxy: the client library an inference worker links to hand KV
 * segments to its local kvproxyd and to learn when they have landed.
 *
 * Threading: a struct kvp_client may be used by one submitting thread and
 * one completion thread at a time (the rings are SPSC); control calls
 * (register, deregister, peer lookup) are serialised by the caller.
 *
 * Blocking: no call waits longer than a bound the caller can set.
 *  - kvp_connect(), kvp_connect_ex(): at most the connect timeout
 *    (KVP_CONNECT_TIMEOUT_MS unless kvp_connect_opts.timeout_ms says
 *    otherwise) for the connection and the daemon's HELLO reply; -ETIMEDOUT.
 *  - Control calls (kvp_region_register*, kvp_region_deregister,
 *    kvp_peer_lookup): at most the client's control timeout
 *    (KVP_CTRL_TIMEOUT_MS, kvp_connect_opts.ctrl_timeout_ms,
 *    kvp_set_ctrl_timeout()); -ETIMEDOUT. A call that timed out may still
 *    take effect in the daemon (a region registered then is reclaimed when
 *    the client closes); its late reply is skipped by the next call.
 *  - kvp_wait(): at most its timeout_ms (-1: until a completion arrives or
 *    the daemon goes away; a daemon that is alive but stopped keeps it
 *    waiting).
 *  - Everything else (kvp_submit, kvp_cancel, kvp_poll, kvp_close, the
 *    accessors, kvp_host_alloc) never blocks.
 *
 * Daemon gone: once kvproxyd has closed the connection (exited, killed,
 * dropped this client), every call returns -EPIPE: control calls and
 * kvp_wait() at once, kvp_submit(), kvp_cancel() and kvp_poll() within
 * KVP_GONE_CHECK_US of the hang-up (they look at the socket at most that
 * often, so the data path makes no system call in between); kvp_poll()
 * and kvp_wait() first return the completions the daemon posted before.
 *
 * Arguments: a NULL client, or a NULL pointer where a call needs one, gives
 * -EINVAL (kvp_node_id() "", kvp_max_segments() and kvp_overflow() 0).
 *
 * Ownership: memory passed in a submitted transfer belongs to kvproxy until
 * that transfer's KVP_CQE_DONE completion has been read; the caller must not
 * modify it before. Nothing on the submit or completion path allocates.
 * Plain C, no DPDK: the ABI is lib/rings/kvp_rings.h.
 */
#ifndef KVPROXY_H
#define KVPROXY_H

#include <stddef.h>
#include <stdint.h>

#include "kvp_rings.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvp_client;

/** Default bound of kvp_connect(): connection plus HELLO reply. */
#define KVP_CONNECT_TIMEOUT_MS 5000
/** Default bound of every control call after connecting (registration may pin GBs). */
#define KVP_CTRL_TIMEOUT_MS 30000
/** The data path notices a daemon that hung up within this many microseconds. */
#define KVP_GONE_CHECK_US 1000

/** One segment of a transfer (see struct kvp_sqe_seg). */
struct kvp_segment {
	uint64_t src_key;
	uint64_t src_off;
	uint64_t dst_key;
	uint64_t dst_off;
	uint64_t len;
};

/**
 * One segment of kvp_submit2d(): @p count blocks of @p len bytes, block i
 * from src_off + i * src_stride of src_key to dst_off + i * dst_stride of
 * dst_key (a 2-D copy, e.g. the heads of every token of a page). count 1
 * is a contiguous segment (the strides are then ignored). Strides are at
 * least @p len; count at most the daemon's limits.max_blocks.
 */
struct kvp_segment2d {
	uint64_t src_key;
	uint64_t src_off;
	uint64_t dst_key;
	uint64_t dst_off;
	uint64_t len;
	uint64_t count;
	uint64_t src_stride;
	uint64_t dst_stride;
};

/** Transfer header for kvp_submit(). */
struct kvp_xfer_desc {
	uint64_t user_id;    /**< echoed in the completion; unique among in-flight transfers */
	uint16_t peer;	     /**< from kvp_peer_lookup() */
	uint64_t timeout_ns; /**< relative deadline, 0 = daemon default */
};

/**
 * Connect to kvproxyd and map the channel; kvp_connect_ex() with default
 * bounds (KVP_CONNECT_TIMEOUT_MS, KVP_CTRL_TIMEOUT_MS) and no reason text.
 *
 * @param sock_path  the daemon's client socket
 * @param sq_entries, cq_entries  ring sizes (powers of two), 0 = daemon default
 * @param out  the new client
 * @return as kvp_connect_ex()
 */
int kvp_connect(const char *sock_path, uint32_t sq_entries, uint32_t cq_entries,
		struct kvp_client **out);

/** Options of kvp_connect_ex(); all zero means the defaults. */
struct kvp_connect_opts {
	uint32_t sq_entries;	 /**< submission ring entries (power of two), 0 = daemon default */
	uint32_t cq_entries;	 /**< completion ring entries (power of two), 0 = daemon default */
	int32_t timeout_ms;	 /**< connect + HELLO bound; 0 = KVP_CONNECT_TIMEOUT_MS, -1 = none */
	int32_t ctrl_timeout_ms; /**< later control calls; 0 = KVP_CTRL_TIMEOUT_MS, -1 = none */
	uint32_t rsvd[4];	 /**< must be zero (room for options to come) */
};

/**
 * Connect to kvproxyd within a bound and map the channel.
 *
 * @param opts  NULL for the defaults
 * @param err, errlen  if not NULL, receives the reason of a failure: the
 *   daemon's own text when it refused the client (ring sizes, the client
 *   limit, its file descriptors, credentials), else what failed here
 * @return 0; -EINVAL (NULL path or out, bad opts, or the daemon refused the
 *   ring sizes); -ENOENT/-ECONNREFUSED if no daemon listens; -ETIMEDOUT if
 *   the daemon did not accept or answer within the bound; -EUSERS (client
 *   limit reached); -EMFILE (daemon out of file descriptors); -EPERM (not
 *   allowed to use this daemon); -EPIPE (closed on us); -EPROTO on a
 *   protocol mismatch; -ENOMEM; other negative errno from the socket
 */
int kvp_connect_ex(const char *sock_path, const struct kvp_connect_opts *opts,
		   struct kvp_client **out, char *err, size_t errlen);

/**
 * Bound every later control call of @p c to @p timeout_ms.
 *
 * @param timeout_ms  > 0; 0 = KVP_CTRL_TIMEOUT_MS; -1 = no bound
 * @return 0; -EINVAL (NULL client, timeout_ms < -1)
 */
int kvp_set_ctrl_timeout(struct kvp_client *c, int timeout_ms);

/**
 * kvp_set_wait_spin() value (and $KVPROXY_WAIT_SPIN_US=auto), the default:
 * kvp_wait() spins about twice as long as this client's recent waits took
 * (KVP_WAIT_SPIN_US at least), but only KVP_WAIT_SPIN_US once they take
 * longer than KVP_WAIT_SPIN_MAX_US / 2, where a wake-up is a small part of
 * the wait and spinning would only burn the CPU.
 */
#define KVP_WAIT_SPIN_AUTO   UINT32_MAX
#define KVP_WAIT_SPIN_US     50
#define KVP_WAIT_SPIN_MAX_US 1000

/**
 * Let kvp_wait() look at the completion ring for up to @p us microseconds
 * (yielding the CPU between looks) before it blocks until the daemon wakes
 * it: a completion that comes that soon costs no wake-up, which on a host
 * whose CPUs are busy or virtual can cost tens of microseconds. The
 * environment variable KVPROXY_WAIT_SPIN_US (0 to 1000000, or "auto") sets
 * the value each new client starts with.
 *
 * @param us  0: block at once; KVP_WAIT_SPIN_AUTO: adapt (the default)
 * @return 0; -EINVAL (NULL client, us above 1000000 and not KVP_WAIT_SPIN_AUTO)
 */
int kvp_set_wait_spin(struct kvp_client *c, uint32_t us);

/** Disconnect; the daemon reclaims the channel, regions and in-flight transfers. */
void kvp_close(struct kvp_client *c);

/** The reason text of the last failed control call (never NULL). */
const char *kvp_last_error(const struct kvp_client *c);

/** Name of the node this client is connected to. */
const char *kvp_node_id(const struct kvp_client *c);

/** Most segments the daemon accepts in one transfer. */
uint32_t kvp_max_segments(const struct kvp_client *c);

/**
 * Register [fd_offset, fd_offset+len) of a memfd as a region; the daemon
 * maps it once. The memfd must be sealed against shrinking
 * (MFD_ALLOW_SEALING + F_ADD_SEALS F_SEAL_SHRINK, as kvp_host_alloc() does):
 * a file that could shrink under the daemon's mapping is refused (-EPERM).
 *
 * @param flags  KVP_REGION_HOST
 * @param key    the region key, to name it in segments (source) or to give
 *   to a prefill node (destination)
 * @return 0; -EINVAL (bad range, unmappable fd); -EPERM (not sealed against
 *   shrinking); -ENOSPC (region table full); -EPIPE if the daemon went away;
 *   -ETIMEDOUT (no answer within the control timeout); -EPROTO (the
 *   connection is out of step after an earlier timeout: reconnect)
 */
int kvp_region_register(struct kvp_client *c, int fd, uint64_t fd_offset, uint64_t len,
			uint32_t flags, uint64_t *key);

/**
 * Register GPU memory allocated with cudaMalloc/cuMemAlloc by its CUDA IPC
 * handle (cuIpcGetMemHandle: 64 opaque bytes); the daemon opens it once.
 * The allocation must stay alive until the region is deregistered.
 *
 * @param offset  where the region starts inside the allocation the handle names
 * @param device  CUDA device ordinal of the allocation
 * @return 0; -ENODEV (daemon has no CUDA driver or GPU: see kvp_last_error());
 *   -EINVAL (handle cannot be opened, or len larger than the allocation);
 *   -ENOSPC; -EPIPE; -ETIMEDOUT; -EPROTO
 */
int kvp_region_register_cuda_ipc(struct kvp_client *c, const void *ipc_handle, uint64_t offset,
				 uint64_t len, int device, uint64_t *key);

/**
 * Register a CUDA VMM allocation exported as a POSIX file descriptor
 * (cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
 * the daemon imports and maps all @p len bytes (a multiple of the allocation
 * granularity) once.
 *
 * @return as kvp_region_register_cuda_ipc()
 */
int kvp_region_register_cuda_fd(struct kvp_client *c, int fd, uint64_t len, int device,
				uint64_t *key);

/**
 * Deregister a region.
 *
 * @return 0; -ENOENT (not this client's key); -EBUSY (transfers still use it);
 *   -EINVAL (NULL client); -EPIPE; -ETIMEDOUT; -EPROTO
 */
int kvp_region_deregister(struct kvp_client *c, uint64_t key);

/**
 * Resolve a peer to the index used in kvp_xfer_desc.peer: by node id (a
 * peer in the daemon's table: configured, added, or learned), or by address
 * "host:port" (its kvproxyd's listen address). An address no peer has is
 * dialled on demand: the daemon authenticates it, learns its node id from
 * the handshake and keeps it as a peer; this call does not wait for that,
 * the first transfer does (up to the daemon's timeouts.connect_ms, then it
 * fails with KVP_EPEER and the reason in its detail, kvp_peer_why_str()).
 * An index stays the peer's while it is in the table; once it is removed,
 * transfers naming the index fail with KVP_ENOPEER.
 *
 * @return 0; -ENOENT if no peer has that node id; -EINVAL (NULL argument,
 *   empty or too long id or address, malformed address, the daemon's own);
 *   -ENOSPC (the daemon's peer table is full: limits.max_peers); -EAGAIN
 *   (the daemon cannot take it now); -EOPNOTSUPP (a daemon too old for
 *   addresses); -EPIPE; -ETIMEDOUT; -EPROTO. kvp_last_error() says why.
 */
int kvp_peer_lookup(struct kvp_client *c, const char *node_id, uint16_t *peer);

/**
 * The address ("host:port") this client's kvproxyd listens on for peers:
 * what a remote client names it by in kvp_peer_lookup() (a wildcard address
 * such as 0.0.0.0 must be replaced by one the remote can reach).
 *
 * @return 0; -EINVAL (NULL); -ENOSPC (@p len too small); -EOPNOTSUPP (an
 *   older daemon); -EPIPE; -ETIMEDOUT; -EPROTO
 */
int kvp_listen_addr(struct kvp_client *c, char *buf, size_t len);

/**
 * Submit one transfer (header and segments published atomically).
 *
 * @return 0; -EAGAIN if the submission ring is full (reap completions and
 *   retry); -EINVAL if nseg is 0 or above kvp_max_segments() or an argument
 *   is NULL; -EPIPE if the daemon went away; -EPROTO if the channel is corrupt
 */
int kvp_submit(struct kvp_client *c, const struct kvp_xfer_desc *x,
	       const struct kvp_segment *segs, uint32_t nseg);

/**
 * Submit one transfer of contiguous and strided segments (one descriptor
 * each, however many blocks: kvproxyd walks the blocks). The daemon checks
 * every block's bounds; a bad one fails the transfer with KVP_EINVAL, the
 * completion's detail (kvp_invalid_str()) and bad_seg saying what and where.
 *
 * @return 0; -EAGAIN (ring full); -EINVAL (nseg 0 or above
 *   kvp_max_segments(), a count of 0 or above 2^32 - 1, NULL pointers);
 *   -EPIPE if the daemon went away; -EPROTO if the channel is corrupt
 */
int kvp_submit2d(struct kvp_client *c, const struct kvp_xfer_desc *x,
		 const struct kvp_segment2d *segs, uint32_t nseg);

/**
 * Ask the daemon to cancel an in-flight transfer; its completion follows.
 *
 * @return 0; -EAGAIN (submission ring full); -EINVAL; -EPIPE; -EPROTO
 */
int kvp_cancel(struct kvp_client *c, uint64_t user_id);

/**
 * Fence the transfers landing in this client's regions whose user_id
 * matches: (user_id & mask) == (value & mask), from any peer. From the call
 * on, kvproxyd drops (and counts) their bytes instead of writing them,
 * refuses RDMA grants for them and revokes grants already given; the
 * senders' transfers fail with KVP_EREMOTE. A KVP_CQE_FENCE completion with
 * user_id == @p fence_id follows once nothing of a matching transfer can
 * land any more: at once, or when receives and RDMA writes already under way
 * have ended (bounded by the daemon's timeouts.peer_ms, after which it tears
 * down what it must). Its status is KVP_OK; KVP_ENOBUFS if the daemon's
 * fence table (limits.max_fences) or this client's share of it
 * (limits.client_fences) was full, then nothing was fenced; KVP_EINVAL
 * for a @p hold_ms above timeouts.fence_hold_max_ms; KVP_ETIMEDOUT if it
 * could not be made to hold. The fence keeps refusing matching transfers
 * for @p hold_ms after the call (0: the daemon's timeouts.fence_hold_ms),
 * or until this client disconnects.
 *
 * @return 0; -EINVAL (NULL client or mask 0); -EAGAIN (submission ring
 *   full: reap completions and retry); -EPIPE if the daemon went away;
 *   -EPROTO if the channel is corrupt
 */
int kvp_fence(struct kvp_client *c, uint64_t value, uint64_t mask, uint32_t hold_ms,
	      uint64_t fence_id);

/**
 * Reap up to @p max completions without blocking.
 *
 * @return completions copied (0 if none); -EPIPE if none are left and the
 *   daemon went away; -EINVAL (NULL client, or NULL @p out with max > 0);
 *   -EPROTO if the channel is corrupt
 */
int kvp_poll(struct kvp_client *c, struct kvp_cqe *out, uint32_t max);

/**
 * Like kvp_poll(), but block up to @p timeout_ms (-1 = forever) for at
 * least one completion; it first polls for up to the client's wait spin
 * (kvp_set_wait_spin()) within that bound.
 *
 * @return completions copied; 0 on timeout; -EPIPE if the daemon went away;
 *   -EINVAL (NULL client or @p out, max 0); -EPROTO
 */
int kvp_wait(struct kvp_client *c, struct kvp_cqe *out, uint32_t max, int timeout_ms);

/**
 * Landing notices the daemon had to drop: the completion ring was full, or
 * (with several workers) the ring between the worker the bytes landed on
 * and this client's worker was. Transfers the client submitted always get
 * their completion; only LANDED ones are dropped.
 */
uint32_t kvp_overflow(const struct kvp_client *c);

/**
 * Allocate @p len bytes of shareable host memory (a memfd, mapped here).
 *
 * @return 0 with *fd and *addr set; negative errno
 */
int kvp_host_alloc(size_t len, int *fd, void **addr);

/** Free memory from kvp_host_alloc(). */
void kvp_host_free(int fd, void *addr, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVPROXY_H */
