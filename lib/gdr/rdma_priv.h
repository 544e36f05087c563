/* SPDX-License-Identifier: BSD-3-Clause */
/* RDMA transport internals shared by dev.c, mr.c and the rdma_*.c files. */
#ifndef RDMA_PRIV_H
#define RDMA_PRIV_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#include "kvp_gdr.h"
#include "kvp_topo.h"
#include "kvp_transport.h"

#define GDR_RAILS   KVP_WIRE_RAILS_MAX
#define GDR_DEVS    KVP_WIRE_RAILS_MAX
#define GDR_QPR_MAX 8			 /* rdma.qps_per_rail bound */
#define GDR_SLOTS   (GDR_RAILS * GDR_QPR_MAX) /* QP slots per peer and direction */
#define GDR_DST_MAX 8			 /* destination regions per RDMA transfer */
#define GDR_BATCH   32			 /* WRs chained into one post per QP */
#define GDR_SGE	    16			 /* gather entries per WRITE (strided sources) */

/* ---- node resources (dev.c, mr.c): written at start, read by workers ---- */

struct gdr_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr attr;
	char name[64];
};

struct gdr_rail {
	unsigned dev; /* index into gdr_node.devs */
	uint8_t port;
	uint8_t link_layer;
	uint8_t mtu; /* IBV_MTU_* */
	uint16_t lid;
	int gid_index;
	union ibv_gid gid;
	_Atomic bool paused;
	char pci[32]; /* the port's PCI device, "" for a virtual one */
};

/* One region's registrations, one per device (an MR belongs to a PD). */
struct gdr_mrs {
	struct ibv_mr *mr[GDR_DEVS];
	bool gpu;
};

struct gdr_node {
	unsigned ndevs;
	struct gdr_dev devs[GDR_DEVS];
	unsigned nrails;
	struct gdr_rail rails[GDR_RAILS];
	struct gdr_mrs *mrs; /* by region slot */
	uint32_t nmrs;
	struct kvp_mr_stats mr_stats;
	uint32_t gpu_rails[KVP_GPUS_MAX]; /* rails behind the same PCIe switch as each GPU */
	bool dmabuf_host; /* rdma.dmabuf_host */
	struct kvp_region_hooks hooks;
};

extern struct gdr_node gdr;

/* gdr.c: the PCI address of a verbs device from sysfs ("" for a virtual one). */
void gdr_sysfs_pci(struct ibv_device *dev, char *pci, size_t len);

/* mr.c */
int gdr_mr_init(uint32_t max_regions, bool dmabuf_host);
void gdr_mr_fini(void);

/* ---- per-worker transport (rdma*.c) ---- */

/* kvp_xfer.t_state of the transfers this transport owns (kvp_xfer.tp == rdma_ctx.idx). */
enum rdma_xstate {
	RS_GRANT = 1,		   /* REQs queued; waiting for every grant */
	RS_POST,		   /* granted; WRITEs being posted (on the peer's post list) */
	RS_FLUSH,		   /* every WRITE posted; waiting for their completions */
	RS_WAIT_ACK,		   /* WRITE_WITH_IMM posted; waiting for the receiver's ACK */
	RS_DRAIN,		   /* failed or cancelled: waiting for posted WRs, then ends */
};

enum qp_state {
	QP_DOWN = 0,
	QP_CONNECTING, /* our end built, QP frame sent, waiting for QP_OK */
	QP_UP,
};

/* What a posted send WR belongs to; retired in order when a later signaled WR completes. */
struct wr_rec {
	uint32_t xfer; /* worker slot */
	uint32_t gen;  /* its generation when posted */
	uint32_t bytes;
	bool imm;
};

/* Send QP: this node -> peer, one per (rail, index). */
struct sqp {
	struct ibv_qp *qp;
	uint8_t state; /* enum qp_state */
	uint8_t rail;
	uint8_t rrail; /* the receiver's rail at the other end (rkey index) */
	uint16_t gen;
	uint32_t psn;
	uint32_t depth; /* WRITEs outstanding at most (one more entry for an imm) */
	uint32_t inl;	/* inline bytes the QP takes */
	uint32_t nsge;	/* gather entries per WR the QP takes */
	uint32_t head;	/* sequence of the next WR */
	uint32_t tail;	/* oldest WR not yet retired */
	uint32_t unsig; /* WRs posted since the last signaled one */
	uint64_t bytes_out; /* bytes of WRITEs posted and not yet retired */
	struct wr_rec *ring; /* depth entries */
	uint64_t since_ns;   /* CONNECTING since */
	/* batch being built this iteration */
	uint32_t nb;
	struct ibv_send_wr wr[GDR_BATCH];
	struct ibv_sge sge[GDR_BATCH][GDR_SGE];
};

/* Receive QP: peer -> this node; takes the WRITEs and WRITE_WITH_IMM notices. */
struct rqp {
	struct ibv_qp *qp;
	uint16_t gen; /* the peer's generation of the slot */
	uint8_t rail;
	bool up;
};

enum grant_state {
	G_FREE = 0,
	G_OPEN, /* some destination regions granted, more may come */
};

/* Receiver side of one incoming RDMA transfer, indexed by the sender's slot. */
struct rgrant {
	uint64_t tag;
	uint16_t seq; /* high half of the imm: a late notice for an older transfer is ignored */
	uint8_t state;
	uint8_t nkeys;	  /* destination regions the sender announced */
	uint8_t ngranted; /* of them granted */
	bool revoked;	  /* a fence asked the sender to stop (RDMA_REVOKE sent) */
	uint32_t nseg;
	uint64_t user_id;
	uint64_t bytes;
	uint64_t first_ns;
	uint64_t key0; /* first destination: the landing notice names it */
	struct kvp_region *r[GDR_DST_MAX];
};

/* Sender side of one RDMA transfer, by worker slot. */
struct txs {
	uint8_t nkeys;
	uint8_t reqs;	 /* REQ frames queued */
	uint8_t granted; /* grants received */
	bool fallback;	 /* a grant sent it to the TCP path */
	uint32_t imm;
	uint32_t outstanding; /* posted WRs not yet retired; the posting cursor is the planner's */
	int last_slot; /* QP of the last WRITE: the imm follows it there */
	uint64_t keys[GDR_DST_MAX];
	/* Filled by grants; tx_post() clears everything above. */
	uint64_t raddr[GDR_DST_MAX];
	uint64_t rlen[GDR_DST_MAX];
	uint32_t rkey[GDR_DST_MAX][GDR_RAILS];
};

struct rpeer {
	bool out_up;   /* our outgoing TCP connection (REQ, QP; answers come back on it) */
	bool in_up;    /* the peer's connection to us */
	bool no_rdma;  /* the peer said it has no RDMA: everything goes over TCP */
	uint8_t rnrails;
	uint32_t rr; /* striping cursor */
	struct sqp *sq; /* nslots entries */
	struct rqp rq[GDR_SLOTS];
	struct rgrant *g; /* gmask + 1 entries */
	struct kvp_xfer *post_head; /* RS_POST transfers, in order */
	struct kvp_xfer *post_tail;
};

struct rcq {
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	bool armed;
	uint32_t size;
};

struct rdma_ctx {
	struct kvp_worker *w;
	uint8_t idx; /* this transport's index in the worker's list (kvp_xfer.tp) */
	uint32_t npeers;
	uint32_t nslots; /* send QPs per peer: rails * qps_per_rail */
	uint32_t gmask;
	uint32_t sq_depth;
	uint32_t rq_depth;
	uint32_t signal_every;
	uint32_t chunk;
	uint64_t window; /* bytes outstanding per QP (at least one chunk) */
	uint32_t inline_max;
	struct rpeer *peers;
	struct txs *txs; /* by worker slot */
	struct rcq cq[GDR_DEVS];
	int epfd;  /* sleep: completion channels, stash doorbell */
	int evfd;
	unsigned nstash;
	bool stash_rung; /* evfd written for the stash */
	struct ibv_wc stash[GDR_DEVS];
	uint64_t next_tick_ns;
};

/* wr_id layout: bit 63 recv | peer (15 bits) | slot (8) | gen (16) | seq (24 bits used of 32) */
#define WRID_RECV (1ull << 63)

static inline uint64_t
wrid_make(bool recv, uint32_t peer, uint32_t slot, uint16_t gen, uint32_t seq)
{
	return (recv ? WRID_RECV : 0) | ((uint64_t)(peer & 0x7fff) << 48) |
	       ((uint64_t)(slot & 0xff) << 40) | ((uint64_t)gen << 24) | (seq & 0xffffffu);
}

#define WRID_PEER(id) ((uint32_t)(((id) >> 48) & 0x7fff))
#define WRID_SLOT(id) ((uint32_t)(((id) >> 40) & 0xff))
#define WRID_GEN(id)  ((uint16_t)(((id) >> 24) & 0xffff))
#define WRID_SEQ(id)  ((uint32_t)((id) & 0xffffff))

static inline struct gdr_mrs *
region_mrs(const struct kvp_region *r)
{
	return (struct gdr_mrs *)r->xp;
}

/* rdma_qp.c */
void qp_peer_up(struct rdma_ctx *c, uint16_t peer);
void qp_send_down(struct rdma_ctx *c, uint16_t peer, const char *why);
void qp_send_fail(struct rdma_ctx *c, uint16_t peer, uint32_t slot);
void qp_recv_down(struct rdma_ctx *c, uint16_t peer);
void qp_send_reset(struct rdma_ctx *c, uint16_t peer, uint32_t slot, int status, const char *why);
int qp_on_qp(struct rdma_ctx *c, uint16_t peer, const struct kvp_wire_qp *q);
int qp_on_qp_ok(struct rdma_ctx *c, uint16_t peer, const struct kvp_wire_qp *q);
void qp_tick(struct rdma_ctx *c, uint64_t now);
int qp_post_recvs(struct rdma_ctx *c, uint16_t peer, uint32_t slot, uint32_t n);

/* rdma_tx.c */
int tx_post(struct rdma_ctx *c, struct kvp_xfer *x);
int tx_on_grant(struct rdma_ctx *c, uint16_t peer, const struct kvp_wire_hdr *h,
		const struct kvp_wire_grant *g);
int tx_on_ack(struct rdma_ctx *c, const struct kvp_wire_hdr *h);
void tx_on_revoke(struct rdma_ctx *c, uint16_t peer, uint64_t tag);
int tx_progress(struct rdma_ctx *c);
void tx_send_wc(struct rdma_ctx *c, const struct ibv_wc *wc);
void tx_retire_all(struct rdma_ctx *c, uint16_t peer, uint32_t slot, int status);
void tx_cancel(struct rdma_ctx *c, struct kvp_xfer *x, int status);
void tx_peer_down(struct rdma_ctx *c, uint16_t peer);

/* rdma_rx.c */
int rx_on_req(struct rdma_ctx *c, uint16_t peer, const struct kvp_wire_hdr *h);
uint32_t rx_fence(struct rdma_ctx *c, const struct kvp_fence *f, bool force);
void rx_on_abort(struct rdma_ctx *c, uint16_t peer, uint64_t tag);
void rx_recv_wc(struct rdma_ctx *c, const struct ibv_wc *wc);
void rx_release_all(struct rdma_ctx *c, uint16_t peer);

/* rdma.c */
void rdma_wc_error(struct rdma_ctx *c, const struct ibv_wc *wc);

#endif /* RDMA_PRIV_H */
