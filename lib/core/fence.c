/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fences: a client that gives a request up (its pages go back to the
 * engine at once) asks that nothing more of that request's transfers land
 * in its regions. The worker keeps the fence; the transports refuse the
 * matching bytes from then on and report what may still land (a TCP recv
 * already posted into the region, an RDMA grant already given out), and
 * the fence's completion is posted once nothing can. After
 * timeouts.peer_ms the transport is asked to force it (tear down what it
 * cannot stop otherwise). The fence keeps refusing matching transfers
 * until it expires, so a sender that learns late still lands nothing.
 *
 * Fences sit densely in w->fences[0, nfences): the landing check scans
 * only the live ones, and none at all in the common case.
 */
#include <string.h>

#include "kvp_transport.h"
#include "worker_priv.h"

static struct kvp_chan *
chan_of(struct kvp_worker *w, uint32_t owner)
{
	uint32_t slot = kvp_client_slot(owner);
	struct kvp_chan *ch = slot < w->chan_slots ? w->chans[slot] : NULL;

	return ch && ch->id == owner ? ch : NULL;
}

static bool
post_fence(struct kvp_chan *ch, uint64_t id, int status, uint64_t bytes)
{
	struct kvp_cqe c;

	memset(&c, 0, sizeof(c));
	c.kind = KVP_CQE_FENCE;
	c.status = status;
	c.user_id = id;
	c.bytes = bytes;
	return chan_post(ch, &c);
}

/* Nothing of f's transfers can land any more (or it gave up: @p status): tell its client. */
static void
fence_done(struct kvp_worker *w, struct kvp_fence *f, uint64_t now, int status)
{
	struct kvp_chan *ch = chan_of(w, f->owner);

	if (f->state == KVP_FENCE_PENDING) {
		f->state = KVP_FENCE_HOLD;
		w->fences_pending--;
		if (now - f->started_ns > w->stats.fence_ns_max)
			KVP_STAT_SET(w->stats.fence_ns_max, now - f->started_ns);
	}
	f->owed = false;
	f->status = (uint8_t)status;
	if (!ch)
		return;
	if (!post_fence(ch, f->id, f->status, f->dropped)) {
		f->owed = true; /* room is kept for it (inflight); a reader frees it */
		return;
	}
	ch->inflight--;
}

/* What may still land for f: the transport knows; one without the op lands nothing late. */
static uint32_t
landings(struct kvp_worker *w, const struct kvp_fence *f, bool force)
{
	return route_fence(w, f, force);
}

static void
fence_free(struct kvp_worker *w, uint32_t i)
{
	if (w->fences[i].state == KVP_FENCE_PENDING)
		w->fences_pending--;
	w->fences[i] = w->fences[--w->nfences];
	memset(&w->fences[w->nfences], 0, sizeof(w->fences[0]));
}

void
fence_add(struct kvp_worker *w, struct kvp_chan *ch, const struct kvp_sqe_fence *sqe,
	  uint64_t now)
{
	if (sqe->mask == 0 || w->nfences == w->cfg->max_fences) {
		int status = sqe->mask == 0 ? KVP_EINVAL : KVP_ENOBUFS;

		if (status == KVP_ENOBUFS)
			KVP_STAT_ADD(w->stats.fences_refused, 1);
		KVP_LOG_RL(WARNING, core, "client %u: fence %" PRIu64 " refused: %s", ch->id,
			   sqe->fence_id,
			   status == KVP_EINVAL ? "mask 0" : "fence table full (limits.max_fences)");
		post_fence(ch, sqe->fence_id, status, 0);
		return;
	}
	uint32_t hold_ms = sqe->hold_ms ? sqe->hold_ms : KVP_STAT_READ(w->cfg->fence_hold_ms);
	struct kvp_fence *f = &w->fences[w->nfences++];

	*f = (struct kvp_fence){
		.state = KVP_FENCE_PENDING,
		.owner = ch->id,
		.value = sqe->value & sqe->mask,
		.mask = sqe->mask,
		.id = sqe->fence_id,
		.started_ns = now,
		.expires_ns = kvp_time_after(now, (uint64_t)hold_ms * 1000000),
	};
	w->fences_pending++;
	ch->inflight++;
	KVP_STAT_ADD(w->stats.fences, 1);
	if (landings(w, f, false) == 0)
		fence_done(w, f, now, KVP_OK);
}

int
fence_timers(struct kvp_worker *w, uint64_t now)
{
	uint64_t force_ns = (uint64_t)w->cfg->peer_timeout_ms * 1000000;
	int work = 0;

	for (uint32_t i = 0; i < w->nfences;) {
		struct kvp_fence *f = &w->fences[i];

		if (f->state == KVP_FENCE_PENDING) {
			uint64_t age = now - f->started_ns;
			bool force = age >= force_ns;

			if (force && !f->forced) {
				f->forced = true;
				KVP_STAT_ADD(w->stats.fences_forced, 1);
			}
			if (landings(w, f, force) == 0) {
				fence_done(w, f, now, KVP_OK);
				work++;
			} else if (age >= 4 * force_ns) {
				/* A transport that cannot stop a landing even forced: say so, loudly. */
				KVP_LOG_RL(ERR, core, "client %u: fence %" PRIu64 " could not be made to "
					   "hold in %" PRIu64 " ms", f->owner, f->id, age / 1000000);
				fence_done(w, f, now, KVP_ETIMEDOUT);
				work++;
			}
		} else if (f->owed) {
			fence_done(w, f, now, f->status);
		}
		if (f->state == KVP_FENCE_HOLD && !f->owed && now >= f->expires_ns) {
			fence_free(w, i);
			continue;
		}
		i++;
	}
	return work;
}

void
fence_chan_gone(struct kvp_worker *w, struct kvp_chan *ch)
{
	/* Its regions are going away with it: nothing is left to protect. */
	for (uint32_t i = 0; i < w->nfences;) {
		if (w->fences[i].owner == ch->id)
			fence_free(w, i);
		else
			i++;
	}
}

bool
kvp_worker_fence_drop(struct kvp_worker *w, uint32_t owner, uint64_t user_id, uint64_t bytes,
		      unsigned xfers)
{
	for (uint32_t i = 0; i < w->nfences; i++) {
		struct kvp_fence *f = &w->fences[i];

		if (kvp_fence_match(f, owner, user_id)) {
			f->dropped += bytes;
			KVP_STAT_ADD(w->stats.fenced_xfers, xfers);
			KVP_STAT_ADD(w->stats.fenced_bytes, bytes);
			return true;
		}
	}
	return false;
}
