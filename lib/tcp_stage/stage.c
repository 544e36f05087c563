/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Staging pool: one allocation per worker at start, cut into fixed buffers,
 * registered once through the memops hook. Two free lists — sending and
 * receiving — so that buffers held by frames waiting for the wire can never
 * starve the receive path (two nodes sending to each other would deadlock).
 * The sending buffers are shared fairly among the worker's clients: one
 * that waits for a buffer gets the next that frees, unless it holds its
 * share already.
 */
#include <errno.h>

#include <rte_malloc.h>

#include "tcp_priv.h"

int
stage_init(struct stage_pool *p, const struct kvp_config *cfg, int socket)
{
	uint32_t n = cfg->stage_pool / cfg->stage_buf;
	uint32_t nrx = n / 4 ? n / 4 : 1;
	int rc;

	p->buf_size = cfg->stage_buf;
	p->nbufs = n;
	p->base = rte_malloc_socket("kvp_stage", (size_t)n * p->buf_size, 4096, socket);
	p->free[0] = rte_malloc_socket("kvp_stage_free", sizeof(uint32_t) * n, 64, socket);
	p->free[1] = rte_malloc_socket("kvp_stage_free", sizeof(uint32_t) * n, 64, socket);
	p->nclients = cfg->max_clients;
	p->held = rte_zmalloc_socket("kvp_stage_held", sizeof(uint32_t) * p->nclients, 64, socket);
	p->waiting = rte_zmalloc_socket("kvp_stage_wait", p->nclients, 64, socket);
	if (!p->base || !p->free[0] || !p->free[1] || !p->held || !p->waiting)
		return -ENOMEM;
	rc = kvp_memops->register_pool(p->base, (size_t)n * p->buf_size);
	if (rc < 0)
		return rc;
	p->nfree[STAGE_RX] = 0;
	p->nfree[STAGE_TX] = 0;
	for (uint32_t i = 0; i < n; i++) {
		int side = i < nrx ? STAGE_RX : STAGE_TX;

		p->free[side][p->nfree[side]++] = i;
	}
	p->owner_rx = nrx;
	return 0;
}

void
stage_fini(struct stage_pool *p)
{
	rte_free(p->base);
	rte_free(p->free[0]);
	rte_free(p->free[1]);
	rte_free(p->held);
	rte_free(p->waiting);
	p->base = NULL;
	p->free[0] = p->free[1] = NULL;
	p->held = NULL;
	p->waiting = NULL;
}

int32_t
stage_get(struct stage_pool *p, struct kvp_worker_stats *st, int side)
{
	if (p->nfree[side] == 0) {
		KVP_STAT_ADD(st->stage_waits, 1);
		return -1;
	}
	uint32_t b = p->free[side][--p->nfree[side]];
	uint64_t used = p->nbufs - p->nfree[STAGE_RX] - p->nfree[STAGE_TX];

	KVP_STAT_SET(st->stage_used, used);
	if (used > st->stage_hwm)
		KVP_STAT_SET(st->stage_hwm, used);
	return (int32_t)b;
}

void
stage_put(struct stage_pool *p, struct kvp_worker_stats *st, int32_t b)
{
	int side = (uint32_t)b < p->owner_rx ? STAGE_RX : STAGE_TX;

	p->free[side][p->nfree[side]++] = (uint32_t)b;
	KVP_STAT_SET(st->stage_used, p->nbufs - p->nfree[STAGE_RX] - p->nfree[STAGE_TX]);
}

/* Client @p slot starts or stops holding or waiting. */
static void
users_update(struct stage_pool *p, uint16_t slot, bool was)
{
	bool is = p->held[slot] || p->waiting[slot];

	if (is && !was)
		p->nusers++;
	else if (!is && was)
		p->nusers--;
}

int32_t
stage_get_tx(struct stage_pool *p, struct kvp_worker_stats *st, uint16_t slot, bool wait)
{
	if (slot >= p->nclients)
		return stage_get(p, st, STAGE_TX);
	bool was = p->held[slot] || p->waiting[slot];
	uint32_t ntx = p->nbufs - p->owner_rx;
	uint32_t others = p->nwaiting - p->waiting[slot];
	uint32_t share = ntx / (p->nusers + !was);
	int32_t b = -1;

	if (others == 0 || p->held[slot] < (share ? share : 1))
		b = stage_get(p, st, STAGE_TX);
	else
		KVP_STAT_ADD(st->stage_waits, 1); /* over its share while another waits */
	if (b >= 0) {
		p->held[slot]++;
		if (p->waiting[slot]) {
			p->waiting[slot] = 0;
			p->nwaiting--;
		}
	} else if (wait && !p->waiting[slot]) {
		p->waiting[slot] = 1;
		p->nwaiting++;
	}
	users_update(p, slot, was);
	return b;
}

void
stage_put_tx(struct stage_pool *p, struct kvp_worker_stats *st, int32_t b, uint16_t slot)
{
	stage_put(p, st, b);
	if (slot >= p->nclients || p->held[slot] == 0)
		return;
	bool was = true;

	p->held[slot]--;
	users_update(p, slot, was);
}

void
stage_tick(struct stage_pool *p)
{
	if (p->nwaiting == 0)
		return;
	for (uint32_t i = 0; i < p->nclients; i++) {
		if (!p->waiting[i])
			continue;
		p->waiting[i] = 0;
		users_update(p, (uint16_t)i, true);
	}
	p->nwaiting = 0;
}
