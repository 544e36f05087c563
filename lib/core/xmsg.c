/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Messages between workers: the ring per ordered pair, landing notices
 * that cross to the client's worker, the counts of those a full ring lost,
 * and the inbox that delivers them (fence messages go on to fence.c).
 * Each ring has one producer and one consumer lcore; nothing allocates
 * after kvp_workers_join().
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_ring.h>

#include "kvp_transport.h"
#include "worker_priv.h"

#define XRING_MAX (1u << 16) /* cross-worker messages queued per ordered pair, at most */

/*
 * A ring per ordered pair of workers, so each has one producer and one
 * consumer and its producer can trust the room it sees: fence messages are
 * sent only where they fit (see fence.c). Sized for landing notices of a
 * few windows of transfers; a full ring loses a landing notice (counted),
 * never a fence message.
 */
int
kvp_workers_join(struct kvp_worker *all, unsigned n, const uint8_t *client_worker)
{
	char name[RTE_RING_NAMESIZE];

	for (unsigned i = 0; i < n; i++) {
		struct kvp_worker *w = &all[i];
		const struct kvp_config *cfg = w->cfg;
		int socket = rte_socket_id();
		uint32_t size = kvp_pow2_ceil(4 * cfg->max_inflight + 256);

		w->nworkers = n;
		w->all = all;
		w->client_worker = client_worker;
		if (n == 1)
			continue;
		if (size > XRING_MAX)
			size = XRING_MAX;
		/* Room for a mirror of every other worker's fences as well as its own. */
		struct kvp_fence *f = rte_zmalloc_socket(
			"kvp_fences", sizeof(*f) * (size_t)cfg->max_fences * n, 64, socket);
		w->xin = rte_zmalloc_socket("kvp_xin", sizeof(*w->xin) * n, 64, socket);
		w->xlost = rte_zmalloc_socket("kvp_xlost", sizeof(*w->xlost) * n * w->chan_slots,
					      64, socket);
		if (!f || !w->xin || !w->xlost) {
			rte_free(f);
			return -ENOMEM;
		}
		rte_free(w->fences);
		w->fences = f;
		for (unsigned from = 0; from < n; from++) {
			if (from == i)
				continue;
			snprintf(name, sizeof(name), "kvp_x_%u_%u", i, from);
			w->xin[from] = rte_ring_create_elem(name, sizeof(struct kvp_xmsg), size, socket,
							    RING_F_SP_ENQ | RING_F_SC_DEQ);
			if (!w->xin[from])
				return -ENOMEM;
		}
	}
	return 0;
}

unsigned
kvp_worker_xroom(const struct kvp_worker *w, unsigned to)
{
	const struct kvp_worker *d = &w->all[to];

	return to < w->nworkers && to != w->idx ? rte_ring_free_count(d->xin[w->idx]) : 0;
}

int
kvp_worker_xsend(struct kvp_worker *w, unsigned to, const struct kvp_xmsg *m)
{
	struct kvp_worker *d = &w->all[to];
	uint64_t one = 1;

	if (to >= w->nworkers || to == w->idx ||
	    rte_ring_enqueue_elem(d->xin[w->idx], (void *)m, sizeof(*m)) < 0) {
		KVP_STAT_ADD(w->stats.xmsg_lost, 1);
		KVP_LOG_RL(ERR, core, "worker %u: ring to worker %u full, message %u lost", w->idx,
			   to, m->type);
		return -ENOBUFS;
	}
	/*
	 * Pairs with the fence in kvp_worker_prepare_sleep(): either it sees
	 * the message, or this sees it asleep and rings its doorbell.
	 */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&d->sleeping, __ATOMIC_RELAXED) && write(d->evfd, &one, sizeof(one)) < 0) {
		/* EAGAIN: already rung. */
	}
	return 0;
}

/*
 * The landing notice reaches the client's worker: post it to the client's
 * CQ. @p peer is the slot (for this worker's histograms), @p handle the
 * peer's handle as the worker it landed on knew it.
 */
static void
deliver_landed(struct kvp_worker *w, uint16_t peer, uint16_t handle, uint32_t owner,
	       uint64_t user_id, uint64_t dst_key, uint64_t bytes, uint32_t nseg, uint64_t first_ns,
	       uint64_t landed)
{
	uint32_t slot = kvp_client_slot(owner);
	struct kvp_chan *ch = slot < w->chan_slots ? w->chans[slot] : NULL;
	bool stats = KVP_STAT_READ(w->cfg->stats_enabled) && peer < w->npeers;
	struct kvp_cqe c;

	if (!ch || ch->id != owner || ch->broken)
		return;
	memset(&c, 0, sizeof(c));
	c.kind = KVP_CQE_LANDED;
	c.peer = handle;
	c.status = KVP_OK;
	c.user_id = user_id;
	c.bytes = bytes;
	c.dst_key = dst_key;
	c.nseg = nseg;
	uint64_t delivered = kvp_mono_ns();
	c.phase_ns[KVP_PH_WIRE] = landed - first_ns;
	c.phase_ns[KVP_PH_DELIVER] = delivered - landed;
	c.phase_ns[KVP_PH_TOTAL] = delivered - first_ns;
	int rc = kvp_ring_enqueue_bulk(&ch->cq, &c, 1);
	if (rc < 0) {
		chan_cq_broken(ch);
		return;
	}
	if (rc == 0) {
		/* Landing notices are not owed: count the drop where the client sees it. */
		atomic_fetch_add_explicit(&ch->cq.shm->overflow, 1, memory_order_relaxed);
		return;
	}
	if (stats)
		kvp_hist_record(kvp_worker_hist(w, peer, KVP_HP_RX_DELIVER), delivered - landed);
	chan_notify(ch);
}

/* The worker that owns client @p owner (this one with a single worker). */
static unsigned
owner_worker(const struct kvp_worker *w, uint32_t owner)
{
	uint32_t slot = kvp_client_slot(owner);

	if (w->nworkers == 1 || slot >= w->chan_slots)
		return w->idx;
	unsigned o = __atomic_load_n(&w->client_worker[slot], __ATOMIC_RELAXED);
	return o < w->nworkers ? o : w->idx;
}

/* A landing notice for @p owner found the ring towards worker @p to full. */
static void
xlost_add(struct kvp_worker *w, unsigned to, uint32_t owner)
{
	uint32_t slot = kvp_client_slot(owner);

	if (!w->xlost || slot >= w->chan_slots)
		return;
	struct kvp_xlost *e = &w->xlost[(size_t)to * w->chan_slots + slot];

	if (e->owner != owner)
		*e = (struct kvp_xlost){ .owner = owner }; /* the slot's last client is gone */
	if (e->count != UINT32_MAX)
		e->count++;
	w->xlost_to |= 1ull << to;
}

void
kvp_worker_landed(struct kvp_worker *w, uint16_t peer, uint32_t owner, uint64_t user_id,
		  uint64_t dst_key, uint64_t bytes, uint32_t nseg, uint64_t first_ns)
{
	bool known = peer < w->npeers;
	bool stats = KVP_STAT_READ(w->cfg->stats_enabled) && known;
	uint16_t handle = known ? w->peers[peer].handle : KVP_PEER_NONE;
	uint64_t landed = kvp_mono_ns();
	unsigned to = owner_worker(w, owner);

	KVP_STAT_ADD(w->stats.xfers_landed, 1);
	if (known)
		KVP_STAT_ADD(w->stats.peer[peer].rx_xfers, 1);
	if (first_ns == 0 || first_ns > landed)
		first_ns = landed; /* no payload (or a clock oddity): nothing to time */
	if (stats)
		kvp_hist_record(kvp_worker_hist(w, peer, KVP_HP_RX_RECV), landed - first_ns);
	if (to == w->idx) {
		deliver_landed(w, peer, handle, owner, user_id, dst_key, bytes, nseg, first_ns,
			       landed);
		return;
	}
	/* The bytes are in place; only the notice crosses to the client's worker. */
	struct kvp_xmsg m = {
		.type = KVP_XM_LANDED,
		.from = (uint8_t)w->idx,
		.peer = peer,
		.handle = handle,
		.owner = owner,
		.user_id = user_id,
		.key = dst_key,
		.bytes = bytes,
		.t0 = first_ns,
		.t1 = landed,
		.nseg = nseg,
	};
	if (kvp_worker_xsend(w, to, &m) == 0)
		KVP_STAT_ADD(w->stats.xlanded, 1);
	else
		xlost_add(w, to, owner);
}

bool
kvp_worker_xlost_flush(struct kvp_worker *w, unsigned to)
{
	struct kvp_xlost *row = w->xlost ? &w->xlost[(size_t)to * w->chan_slots] : NULL;

	if (!(w->xlost_to & (1ull << to)))
		return true;
	for (uint32_t i = 0; i < w->chan_slots; i++) {
		if (row[i].count == 0)
			continue;
		if (kvp_worker_xroom(w, to) == 0)
			return false;
		struct kvp_xmsg m = {
			.type = KVP_XM_LOST,
			.from = (uint8_t)w->idx,
			.owner = row[i].owner,
			.bytes = row[i].count,
		};
		kvp_worker_xsend(w, to, &m); /* room checked */
		row[i].count = 0;
	}
	w->xlost_to &= ~(1ull << to);
	return true;
}

/* The owner learns what its client's CQ missed: the count the client reads. */
static void
deliver_lost(struct kvp_worker *w, uint32_t owner, uint64_t count)
{
	uint32_t slot = kvp_client_slot(owner);
	struct kvp_chan *ch = slot < w->chan_slots ? w->chans[slot] : NULL;

	if (ch && ch->id == owner && !ch->broken)
		atomic_fetch_add_explicit(&ch->cq.shm->overflow, (uint32_t)count,
					  memory_order_relaxed);
}

/* Messages from the other workers, in the order each sent them (worker_priv.h). */
int
worker_xinbox(struct kvp_worker *w)
{
	struct kvp_xmsg msgs[32];
	int n = 0;

	for (unsigned from = 0; w->xin && from < w->nworkers; from++) {
		unsigned cnt;

		if (!w->xin[from])
			continue;
		while ((cnt = rte_ring_dequeue_burst_elem(w->xin[from], msgs, sizeof(msgs[0]), 32,
							  NULL)) > 0) {
			for (unsigned i = 0; i < cnt; i++) {
				const struct kvp_xmsg *m = &msgs[i];

				if (m->type == KVP_XM_LANDED)
					deliver_landed(w, m->peer, m->handle, m->owner, m->user_id,
						       m->key, m->bytes, m->nseg, m->t0, m->t1);
				else if (m->type == KVP_XM_LOST)
					deliver_lost(w, m->owner, m->bytes);
				else
					fence_xmsg(w, m);
			}
			n += (int)cnt;
		}
	}
	return n;
}

/* Cross-worker messages waiting (a reason not to sleep). */
bool
worker_xpending(const struct kvp_worker *w)
{
	for (unsigned from = 0; w->xin && from < w->nworkers; from++)
		if (w->xin[from] && rte_ring_count(w->xin[from]) != 0)
			return true;
	return false;
}
