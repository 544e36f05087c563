/* SPDX-License-Identifier: BSD-3-Clause */
/* TCP transport internals shared by tcp.c, tcp_tx.c and tcp_rx.c. */
#ifndef TCP_PRIV_H
#define TCP_PRIV_H

#include <stdalign.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <liburing.h>

#include "kvp_tcp_stage.h"
#include "kvp_transport.h"

/* Payloads at least this large skip the staging buffer and land by direct recv. */
#define DIRECT_RECV_MIN (64u << 10)
/*
 * ... and at most this much per direct recv: whole 4 MiB WAITALL recvs
 * measured at half the throughput of 1 MiB pieces over veth.
 */
#define DIRECT_RECV_MAX (1u << 20)
/* Bytes the recv linked behind a direct one asks for: the next header and a little more. */
#define RECV_NEXT_LEN (4u << 10)
#define NO_XFER		UINT32_MAX
/* Strided source blocks at least this large go out by iovec; smaller ones are copied together. */
#define GATHER_IOV_MIN (4u << 10)
/*
 * SENDMSG_ZC sends per connection whose notification is still to come
 * (a power of two): each waits for the peer's ACK of its bytes, so one at
 * a time made every gather a round trip (and on loopback a delayed ACK:
 * 2 Gbit/s with 4 MiB transfers).
 */
#define ZC_SENDS 8
/*
 * Smaller gathers (ACKs, control frames, small payloads) are copied:
 * pinning costs more than the copy (msg_zerocopy.rst: below ~10 KB).
 */
#define ZC_MIN_BYTES (16u << 10)
/* Linux 6.2 ABI; liburing 2.3's header predates it. */
#ifndef IORING_SEND_ZC_REPORT_USAGE
#define IORING_SEND_ZC_REPORT_USAGE (1U << 3)
#endif
#ifndef IORING_NOTIF_USAGE_ZC_COPIED
#define IORING_NOTIF_USAGE_ZC_COPIED (1U << 31)
#endif

enum conn_state {
	CONN_FREE = 0,
	CONN_UP,
	CONN_CLOSING, /* shut down; waiting for its io_uring operations to return */
};

enum uop {
	UOP_SEND = 1,
	UOP_RECV = 2,
	UOP_RECV_NEXT = 3, /* linked after a direct recv: what follows, into rxbuf */
};

/* Transport-private transfer progress (kvp_xfer.t_state). */
enum tx_xstate {
	TX_PEND = 0, /* on the connection's pending list, not fully framed */
	TX_FRAMED,   /* every frame queued, END included */
	TX_WAIT_ACK, /* last frame (END, or a cancelled one's ABORT) on the wire; waiting for
			the receiver's ACK. Cancelled: t_off = when the wait began */
	TX_DRAIN,    /* cancelled; waiting for its queued frames to leave */
};

struct tx_frame {
	struct kvp_wire_hdr hdr;
	uint8_t *payload; /* NULL for control frames */
	uint32_t xfer;	  /* worker transfer slot, NO_XFER for control frames */
	int32_t stage;	  /* staging buffer holding the payload, -1 if none */
	/* A payload gathered from blocks (nblk > 1): blk bytes each, sstride apart from payload. */
	uint32_t nblk;
	uint32_t blk;
	uint64_t sstride;
	uint16_t owner; /* client slot whose share the staging buffer counts against */
	bool pad;	/* payload gone from under a partly sent frame: the rest goes as zeros */
	alignas(8) uint8_t inl[KVP_PCHAN_PAYLOAD]; /* payload of peer control frames */
};

/* Frames that carry transfer payload. */
static inline bool
is_data(uint8_t type)
{
	return type == KVP_W_DATA || type == KVP_W_DATA2D;
}

enum { STAGE_RX = 0, STAGE_TX = 1 };

struct stage_pool {
	uint8_t *base;
	uint32_t buf_size;
	uint32_t nbufs;
	uint32_t owner_rx; /* buffers [0, owner_rx) belong to the receive list */
	uint32_t *free[2];
	uint32_t nfree[2];
	/*
	 * Fair shares of the sending buffers among the worker's clients (by
	 * client slot): while a client waits for one, a client that holds
	 * its share (the sending buffers / the clients holding or waiting)
	 * gets none, so a buffer that frees goes to the one waiting.
	 */
	uint32_t nclients;
	uint32_t *held;	  /* sending buffers each client's frames hold */
	uint8_t *waiting; /* refused a buffer since the last tick */
	uint32_t nusers;  /* clients holding or waiting */
	uint32_t nwaiting;
};

static inline uint8_t *
stage_buf(const struct stage_pool *p, int32_t b)
{
	return p->base + (size_t)b * p->buf_size;
}

enum rx_state {
	RX_HDR = 0,
	RX_BODY,    /* payload copied out of the staging buffer */
	RX_DIRECT,  /* payload recv'd straight into the region */
	RX_DISCARD, /* payload for a refused destination */
};

/* Receive-side state of one incoming transfer, indexed by the sender's slot. */
struct rx_entry {
	uint64_t tag;
	uint64_t bytes;
	uint64_t first_ns; /* when its first DATA frame arrived */
	uint64_t user_id;  /* from its DATA frames: what fences match */
	uint32_t owner;	   /* client owning the region its last DATA frame named */
	int status;
	bool fenced; /* a fence refuses its bytes */
};

struct tcp_conn {
	enum conn_state state;
	int fd;
	uint16_t peer;
	uint8_t link;  /* the link's index between the two nodes (stats, the main lcore) */
	uint8_t slot;  /* its place among this worker's links of the peer; 0 carries the pchan */
	bool outgoing;
	bool fixed;	   /* rxbuf is registered with the ring now (read_fixed) */
	uint32_t id;
	uint32_t live_pos; /* index in tcp_ctx.live while not CONN_FREE */
	uint64_t epoch;
	uint32_t ops; /* io_uring operations in flight */
	uint64_t last_rx_ns;   /* any byte received */
	uint64_t last_tx_ns;   /* a frame last handed to the kernel */
	uint64_t send_ok_ns;   /* the in-flight send last made progress, or the peer vouched */
	uint64_t send_moved_ns; /* ... really made progress (bounds how long a peer may vouch) */
	uint64_t held_ping_ns; /* a PING with KVP_PING_RXWAIT last queued */
	bool rx_held;	       /* a DATA header waits for a receive staging buffer */
	uint32_t retrans_seen; /* tcpi_total_retrans already counted */

	/*
	 * Send side: frames [tx_done, tx_tail) are queued; [tx_done, tx_head)
	 * are in flight. With SENDMSG_ZC, [tx_zc, tx_done) are sent but their
	 * memory (headers in txq, payloads) is the kernel's until the
	 * notifications of the sends that carried them, which come only once
	 * the peer has ACKed those bytes: the next send does not wait for them.
	 */
	struct tx_frame *txq;
	uint32_t txq_mask;
	uint32_t tx_zc;
	uint32_t tx_done;
	uint32_t tx_head;
	uint32_t tx_tail;
	uint32_t tx_partial; /* bytes of frame tx_done already sent */
	bool send_busy;
	uint32_t zc_head; /* zc[]: SENDMSG_ZC sends waiting for their notification, in send order */
	uint32_t zc_tail;
	struct {
		uint32_t end;	/* tx_done after that send: its frames are the ones before */
		uint32_t bytes; /* what the send took (tcp_zc_copied_bytes if the kernel copied) */
		bool done;	/* its notification came (they may come out of order) */
	} zc[ZC_SENDS];
	struct iovec *iov;
	struct msghdr msg;
	struct kvp_xfer *pend_head; /* transfers still being framed */
	struct kvp_xfer *pend_tail;
	uint64_t unsent; /* payload bytes posted here and not yet sent: picks links */
	uint64_t framed; /* of them, framed into txq: framing stops FRAME_AHEAD ahead of the wire */

	/* Receive side. */
	uint8_t *rxbuf;
	uint32_t rx_cap;
	uint32_t rx_start;
	uint32_t rx_end;
	bool recv_busy;
	bool recv_direct; /* the recv in flight lands at rx_dst, not in rxbuf */
	bool recv_next;	  /* a UOP_RECV_NEXT is linked behind it */
	bool rx_drained;  /* the last recv into rxbuf came back short: the socket was empty */
	uint32_t rx_asked; /* bytes the recv into rxbuf in flight asked for */
	enum rx_state rx_state;
	struct kvp_wire_hdr rx_hdr;
	struct rx_entry *rx_ent;
	uint8_t *rx_dst;
	uint64_t rx_left;  /* payload bytes still to come */
	uint64_t rx_win;   /* bytes until rx_dst's window is full */
	int32_t rx_stage;  /* staging buffer of a staged payload, -1 if none */
	/*
	 * Where the payload goes: blocks of rx_blk bytes (the whole payload for
	 * DATA) rx_stride apart from rx_off of rx_region; rx_pos payload bytes
	 * have landed (staged: have been copied to the region).
	 */
	uint64_t rx_off;
	uint64_t rx_blk;
	uint64_t rx_stride;
	uint64_t rx_pos;
	struct kvp_region *rx_region;
	struct rx_entry *rxt;
	uint32_t rxt_mask;
};

struct tcp_ctx {
	struct kvp_worker *w;
	struct io_uring ring;
	/* Per peer slot: this worker's links outgoing, then incoming (conn_index(), by slot). */
	struct tcp_conn *conns;
	uint32_t nconns;
	/* The connections not CONN_FREE, in no order: what the loop walks (few of nconns). */
	uint32_t *live;
	uint32_t nlive;
	/* Every connection's queues and buffers: one reservation, touched only as used. */
	void *mem;
	size_t mem_len;
	uint32_t links; /* slots per peer and direction: tcp.connections */
	uint32_t rr; /* rotates ties between equally loaded links */
	uint32_t iov_max;
	uint32_t frame_max;
	bool zerocopy;
	bool zc_report;	   /* notifications say whether the kernel copied (Linux 6.2+) */
	bool zc_copy_seen; /* ... and it was said in the log once */
	bool fixed;	   /* the ring has a (sparse) table of registered buffers, one per connection */
	uint32_t sqes; /* prepared since the last submit */
	uint64_t next_tick_ns;
	struct stage_pool stage;
	bool stage_blocked; /* framing waited for a buffer since the last tick */
	bool copies;	    /* staging copies started in this fill pass (to_host_async) */
	bool copy_failed;   /* a staging copy of this fill pass failed */
	uint64_t peer_ns; /* silence (or a stuck send) longer than this kills a connection */
	uint8_t idx; /* this transport's index in the worker's list (kvp_xfer.tp) */
	/*
	 * Framing takes turns among the clients with transfers pending on a
	 * connection: per round each frames at most a quantum of bytes
	 * (by client slot: the round it last framed in, bytes framed in it,
	 * the fill pass in which it found no staging buffer).
	 */
	uint32_t fill_round;
	uint32_t fill_pass;
	uint32_t *q_round;
	uint64_t *q_used;
	uint32_t *q_blocked;
};

static inline struct io_uring_sqe *
tcp_sqe(struct tcp_ctx *t)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);

	if (!sqe) {
		/* The ring is sized for every connection's ops; submit and retry once. */
		io_uring_submit(&t->ring);
		t->sqes = 0;
		sqe = io_uring_get_sqe(&t->ring);
	}
	if (sqe)
		t->sqes++;
	return sqe;
}

/* user_data: op in bits 0-7, the connection in 8-39, a SENDMSG_ZC send's zc[] sequence above. */
static inline uint64_t
tcp_udata(const struct tcp_conn *c, enum uop op)
{
	return ((uint64_t)c->id << 8) | op;
}

static inline uint32_t
conn_index(const struct tcp_ctx *t, uint16_t peer, uint32_t slot, bool outgoing)
{
	return (2u * peer + (outgoing ? 0 : 1)) * t->links + slot;
}

static inline uint32_t
txq_used(const struct tcp_conn *c)
{
	return c->tx_tail - c->tx_zc;
}

/* SENDMSG_ZC sends of @p c whose notification is still to come. */
static inline uint32_t
zc_waiting(const struct tcp_conn *c)
{
	return c->zc_tail - c->zc_head;
}

static inline uint32_t
txq_room(const struct tcp_conn *c)
{
	return c->txq_mask + 1 - txq_used(c);
}

/* stage.c */
int stage_init(struct stage_pool *p, const struct kvp_config *cfg, int socket);
void stage_fini(struct stage_pool *p);
int32_t stage_get(struct stage_pool *p, struct kvp_worker_stats *st, int side);
void stage_put(struct stage_pool *p, struct kvp_worker_stats *st, int32_t b);
/* A sending buffer for client @p slot within its fair share; -1 if none (waiting counted). */
int32_t stage_get_tx(struct stage_pool *p, struct kvp_worker_stats *st, uint16_t slot, bool wait);
/* Give back a sending buffer of client @p slot. */
void stage_put_tx(struct stage_pool *p, struct kvp_worker_stats *st, int32_t b, uint16_t slot);
/* Forget who waited (each waiter says so again at its next try). */
void stage_tick(struct stage_pool *p);

/* tcp.c */
void tcp_conn_fail(struct tcp_ctx *t, struct tcp_conn *c, const char *why);

/* tcp_tx.c */
bool tcp_queue_ctrl(struct tcp_conn *c, uint8_t type, uint64_t tag, uint64_t aux);
bool tcp_queue_frame(struct tcp_conn *c, const struct kvp_wire_hdr *h, const void *payload);
int tcp_fill_tx(struct tcp_ctx *t, struct tcp_conn *c);
int tcp_start_send(struct tcp_ctx *t, struct tcp_conn *c);
void tcp_send_done(struct tcp_ctx *t, struct tcp_conn *c, int res, bool zc_held);
/* x's ACK is in and its END the kernel's: it ends with @p status. */
void tcp_ack_posted(struct tcp_ctx *t, struct kvp_xfer *x, int status);
void tcp_zc_notif(struct tcp_ctx *t, struct tcp_conn *c, uint32_t seq, bool copied);
void tcp_tx_cancel(struct tcp_ctx *t, struct tcp_conn *c, struct kvp_xfer *x, int status);
void tcp_tx_reset(struct tcp_ctx *t, struct tcp_conn *c);
void tcp_tx_admission(struct tcp_ctx *t, struct tcp_conn *c, uint64_t now);
void tcp_tx_sweep(struct tcp_ctx *t, uint64_t now);

/* tcp_rx.c */
int tcp_start_recv(struct tcp_ctx *t, struct tcp_conn *c);
void tcp_recv_done(struct tcp_ctx *t, struct tcp_conn *c, int res, bool next);
int tcp_process_rx(struct tcp_ctx *t, struct tcp_conn *c);
void tcp_rx_reset(struct tcp_ctx *t, struct tcp_conn *c);
uint32_t tcp_rx_fence(struct tcp_ctx *t, const struct kvp_fence *f, bool force);

#endif /* TCP_PRIV_H */
