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
 * With several workers, bytes for the client's regions arrive on every
 * worker's links, so the client's worker (the owner) sends every other
 * worker a FENCE_SET; each keeps a mirror that refuses the bytes on its
 * own links and answers FENCE_CLEAR once nothing can land through them.
 * The fence completes when the owner's transports and every mirror are
 * clear. A landing notice a worker sent before its CLEAR travels on the
 * same ring ahead of it, so the client reads it before the fence's
 * completion. When the fence expires or its client goes, the owner sends
 * FENCE_DEL and frees its slot only once every worker has been told: a
 * mirror table (max_fences per worker) then never overflows. SETs are sent
 * only when every ring has room (else the fence is refused like one
 * beyond the table); DELs and CLEARs that find a ring full are retried.
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

/* Fences client @p owner holds on this worker (its own, not mirrors), in any state. */
static uint32_t
owned_by(const struct kvp_worker *w, uint32_t owner)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < w->nfences; i++)
		n += !w->fences[i].mirror && w->fences[i].owner == owner;
	return n;
}

/* The node's other workers, a bit each. */
static uint64_t
others(const struct kvp_worker *w)
{
	uint64_t all = w->nworkers >= 64 ? ~0ull : (1ull << w->nworkers) - 1;

	return all & ~(1ull << w->idx);
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

/* An own pending fence whose transports and mirrors are all clear completes. */
static void
own_check(struct kvp_worker *w, struct kvp_fence *f, uint64_t now)
{
	if (f->state == KVP_FENCE_PENDING && f->local_clear && f->waiting == 0)
		fence_done(w, f, now, KVP_OK);
}

static void
fence_free(struct kvp_worker *w, uint32_t i)
{
	if (w->fences[i].state == KVP_FENCE_PENDING)
		w->fences_pending--;
	if (!w->fences[i].mirror)
		w->nfences_own--;
	w->fences[i] = w->fences[--w->nfences];
	memset(&w->fences[w->nfences], 0, sizeof(w->fences[0]));
}

static struct kvp_fence *
find(struct kvp_worker *w, bool mirror, unsigned origin, uint32_t xid, uint32_t *at)
{
	for (uint32_t i = 0; i < w->nfences; i++) {
		struct kvp_fence *f = &w->fences[i];

		if (f->mirror == mirror && f->origin == origin && f->xid == xid &&
		    f->state != KVP_FENCE_FREE) {
			if (at)
				*at = i;
			return f;
		}
	}
	return NULL;
}

/* Tell the other workers still owed it to drop their mirror of own fence f. */
static void
send_dels(struct kvp_worker *w, struct kvp_fence *f)
{
	struct kvp_xmsg m = { .type = KVP_XM_FENCE_DEL, .from = (uint8_t)w->idx, .xid = f->xid };

	for (unsigned o = 0; o < w->nworkers; o++)
		if ((f->del_owed & (1ull << o)) && kvp_worker_xroom(w, o) > 0 &&
		    kvp_worker_xsend(w, o, &m) == 0)
			f->del_owed &= ~(1ull << o);
}

/*
 * Own fence i is over (expired, or its client went): it stops refusing at
 * once; its slot is freed when every mirror has been told. @return true if
 * the slot was freed (the caller looks at slot i again)
 */
static bool
retire(struct kvp_worker *w, uint32_t i)
{
	struct kvp_fence *f = &w->fences[i];

	if (f->state == KVP_FENCE_PENDING)
		w->fences_pending--;
	f->state = KVP_FENCE_DYING;
	f->del_owed = others(w);
	send_dels(w, f);
	if (f->del_owed)
		return false;
	fence_free(w, i);
	return true;
}

/* Every other worker's ring has room for a SET now (the pairs' only producer is us). */
static bool
rings_have_room(const struct kvp_worker *w)
{
	for (unsigned o = 0; o < w->nworkers; o++)
		if (o != w->idx && kvp_worker_xroom(w, o) == 0)
			return false;
	return true;
}

/* Why fence @p sqe cannot be set now (NULL: it can), and the status it then completes with. */
static const char *
refusal(const struct kvp_worker *w, const struct kvp_chan *ch, const struct kvp_sqe_fence *sqe,
	int *status)
{
	*status = KVP_EINVAL; /* bad arguments */
	if (sqe->mask == 0)
		return "mask 0";
	if (sqe->hold_ms > KVP_STAT_READ(w->cfg->fence_hold_max_ms))
		return "hold_ms above timeouts.fence_hold_max_ms";
	*status = KVP_ENOBUFS; /* a full table or ring may take it later */
	if (w->nfences_own == w->cfg->max_fences)
		return "fence table full (limits.max_fences)";
	if (owned_by(w, ch->id) >= w->cfg->client_fences)
		return "the client holds limits.client_fences already";
	if (!rings_have_room(w))
		return "no room to tell the other workers";
	return NULL;
}

void
fence_add(struct kvp_worker *w, struct kvp_chan *ch, const struct kvp_sqe_fence *sqe,
	  uint64_t now)
{
	int status;
	const char *why = refusal(w, ch, sqe, &status);

	if (why) {
		if (status == KVP_ENOBUFS)
			KVP_STAT_ADD(w->stats.fences_refused, 1);
		KVP_LOG_RL(WARNING, core, "client %u: fence %" PRIu64 " (hold_ms %u) refused: %s",
			   ch->id, sqe->fence_id, sqe->hold_ms, why);
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
		.xid = ++w->fence_xid,
		.origin = (uint8_t)w->idx,
		.waiting = others(w),
	};
	w->nfences_own++;
	w->fences_pending++;
	ch->inflight++;
	KVP_STAT_ADD(w->stats.fences, 1);
	struct kvp_xmsg m = {
		.type = KVP_XM_FENCE_SET,
		.from = (uint8_t)w->idx,
		.owner = f->owner,
		.user_id = f->value,
		.key = f->mask,
		.t0 = f->started_ns,
		.t1 = f->expires_ns,
		.xid = f->xid,
	};
	for (unsigned o = 0; o < w->nworkers; o++)
		if (o != w->idx)
			kvp_worker_xsend(w, o, &m); /* room checked above */
	f->local_clear = landings(w, f, false) == 0;
	own_check(w, f, now);
}

/* Mirror f can land nothing more: say so to its owner (retried while the ring is full). */
static void
mirror_clear(struct kvp_worker *w, struct kvp_fence *f)
{
	struct kvp_xmsg m = {
		.type = KVP_XM_FENCE_CLEAR,
		.from = (uint8_t)w->idx,
		.owner = f->owner,
		.bytes = f->dropped,
		.xid = f->xid,
		.flags = f->forced ? KVP_XM_F_FORCED : 0,
	};

	if (f->state == KVP_FENCE_PENDING) {
		f->state = KVP_FENCE_HOLD;
		w->fences_pending--;
	}
	/* Lost landing notices are counted before the fence completes. */
	f->clear_owed = !kvp_worker_xlost_flush(w, f->origin) ||
			kvp_worker_xroom(w, f->origin) == 0 ||
			kvp_worker_xsend(w, f->origin, &m) < 0;
}

void
fence_xmsg(struct kvp_worker *w, const struct kvp_xmsg *m)
{
	uint64_t now = kvp_mono_ns();
	struct kvp_fence *f;
	uint32_t i;

	switch (m->type) {
	case KVP_XM_FENCE_SET:
		if (w->nfences == w->cfg->max_fences * w->nworkers) {
			/* Cannot happen (see the top of this file); do not leave the owner waiting. */
			KVP_LOG_RL(ERR, core, "worker %u: no slot for a mirror of worker %u's fence", w->idx,
				   m->from);
			struct kvp_fence tmp = { .origin = m->from, .xid = m->xid, .owner = m->owner };
			mirror_clear(w, &tmp);
			return;
		}
		f = &w->fences[w->nfences++];
		*f = (struct kvp_fence){
			.state = KVP_FENCE_PENDING,
			.owner = m->owner,
			.value = m->user_id,
			.mask = m->key,
			.started_ns = m->t0,
			.expires_ns = m->t1,
			.xid = m->xid,
			.origin = m->from,
			.mirror = true,
		};
		w->fences_pending++;
		if (landings(w, f, false) == 0)
			mirror_clear(w, f);
		return;
	case KVP_XM_FENCE_DEL:
		if (find(w, true, m->from, m->xid, &i))
			fence_free(w, i);
		return;
	case KVP_XM_FENCE_CLEAR:
		f = find(w, false, w->idx, m->xid, NULL);
		if (!f || !(f->waiting & (1ull << m->from)))
			return; /* it ended meanwhile */
		f->waiting &= ~(1ull << m->from);
		f->dropped += m->bytes;
		if ((m->flags & KVP_XM_F_FORCED) && !f->forced) {
			f->forced = true;
			KVP_STAT_ADD(w->stats.fences_forced, 1);
		}
		own_check(w, f, now);
		return;
	default:
		return;
	}
}

/* A mirror's turn of the timers. @return work done */
static int
mirror_timer(struct kvp_worker *w, struct kvp_fence *f, uint64_t now, uint64_t force_ns)
{
	if (f->state == KVP_FENCE_PENDING) {
		/* Set on the owner's clock reading; this worker's may lag it by a hair. */
		bool force = now > f->started_ns && now - f->started_ns >= force_ns;

		f->forced |= force;
		if (landings(w, f, force) == 0) {
			mirror_clear(w, f);
			return 1;
		}
	} else if (f->clear_owed) {
		mirror_clear(w, f);
	}
	return 0;
}

/* An own fence's turn of the timers. @return work done */
static int
own_timer(struct kvp_worker *w, struct kvp_fence *f, uint64_t now, uint64_t force_ns)
{
	if (f->state == KVP_FENCE_PENDING) {
		uint64_t age = now > f->started_ns ? now - f->started_ns : 0;
		bool force = age >= force_ns;

		if (force && !f->forced) {
			f->forced = true;
			KVP_STAT_ADD(w->stats.fences_forced, 1);
		}
		if (!f->local_clear && landings(w, f, force) == 0)
			f->local_clear = true;
		if (f->local_clear && f->waiting == 0) {
			fence_done(w, f, now, KVP_OK);
			return 1;
		}
		if (age >= 4 * force_ns) {
			/* A transport that cannot stop a landing even forced: say so, loudly. */
			KVP_LOG_RL(ERR, core, "client %u: fence %" PRIu64 " could not be made to "
				   "hold in %" PRIu64 " ms%s", f->owner, f->id, age / 1000000,
				   f->local_clear ? " (another worker's links)" : "");
			fence_done(w, f, now, KVP_ETIMEDOUT);
			return 1;
		}
	} else if (f->owed) {
		fence_done(w, f, now, f->status);
	} else if (f->state == KVP_FENCE_DYING) {
		send_dels(w, f);
	}
	return 0;
}

int
fence_timers(struct kvp_worker *w, uint64_t now)
{
	uint64_t force_ns = (uint64_t)w->cfg->peer_timeout_ms * 1000000;
	int work = 0;

	for (uint32_t i = 0; i < w->nfences;) {
		struct kvp_fence *f = &w->fences[i];

		work += f->mirror ? mirror_timer(w, f, now, force_ns) : own_timer(w, f, now, force_ns);
		if (f->state == KVP_FENCE_DYING && f->del_owed == 0) {
			fence_free(w, i);
			continue;
		}
		if (f->state == KVP_FENCE_HOLD && !f->owed && !f->clear_owed && now >= f->expires_ns) {
			/* A mirror goes by itself at the same time; the owner's DEL then finds nothing. */
			if (f->mirror) {
				fence_free(w, i);
				continue;
			}
			if (retire(w, i))
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
		struct kvp_fence *f = &w->fences[i];

		if (!f->mirror && f->owner == ch->id && f->state != KVP_FENCE_DYING && retire(w, i))
			continue;
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
