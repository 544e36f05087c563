/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Staging pool: one allocation per worker at start, cut into fixed buffers,
 * registered once through the memops hook. Two free lists — sending and
 * receiving — so that buffers held by frames waiting for the wire can never
 * starve the receive path (two nodes sending to each other would deadlock).
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
	if (!p->base || !p->free[0] || !p->free[1])
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
	p->base = NULL;
	p->free[0] = p->free[1] = NULL;
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
