/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A client's channel as the worker sees it: completions posted to its CQ and
 * its wakeups, protocol breaches recorded for the main lcore, and the arming
 * of its wakeups before the worker sleeps. The worker's lcore only.
 */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "kvp_transport.h"
#include "worker_priv.h"

/*
 * The client is woken once the worker's current pass has handed its own
 * work to the kernel (worker_flush_notify()): on the receiving side the
 * ACK then leaves before the eventfd write, which can cost an IPI, and
 * several completions of one pass cost one wake-up.
 */
void
chan_notify(struct kvp_chan *ch)
{
	if (ch->notify_owed || !ch->w)
		return;
	ch->notify_owed = true;
	ch->notify_next = ch->w->notify;
	ch->w->notify = ch;
}

void
worker_flush_notify(struct kvp_worker *w)
{
	uint64_t one = 1;

	while (w->notify) {
		struct kvp_chan *ch = w->notify;

		w->notify = ch->notify_next;
		ch->notify_next = NULL;
		ch->notify_owed = false;
		if (kvp_ring_wakeup_needed(&ch->cq) && write(ch->notify_fd, &one, sizeof(one)) < 0) {
			/* EAGAIN: the counter is saturated, the client is awake anyway. */
		}
	}
}

/*
 * The client broke the ring protocol: say what, with the values, for the
 * main lcore's log line when it disconnects the client. The first reason wins.
 */
void
chan_break(struct kvp_chan *ch, const char *fmt, ...)
{
	va_list ap;

	if (ch->broken)
		return;
	ch->broken = true;
	va_start(ap, fmt);
	vsnprintf(ch->broken_why, sizeof(ch->broken_why), fmt, ap);
	va_end(ap);
}

/* kvp_ring_count() refused the SQ producer index the client published. */
void
chan_sq_broken(struct kvp_chan *ch)
{
	const struct kvp_ring *r = &ch->sq;

	if ((int32_t)(r->bad - r->local) < 0)
		chan_break(ch, "SQ producer index %u is behind the consumer index %u (ring of %u)",
			   r->bad, r->local, r->size);
	else
		chan_break(ch,
			   "SQ producer index %u is %u entries past the consumer index %u (ring of "
			   "%u)",
			   r->bad, r->bad - r->local, r->local, r->size);
}

/* kvp_ring_free() refused the CQ consumer index the client published. */
void
chan_cq_broken(struct kvp_chan *ch)
{
	const struct kvp_ring *r = &ch->cq;

	int32_t ahead = (int32_t)(r->bad - r->local);

	if (ahead > 0)
		chan_break(ch,
			   "CQ consumer index %u is %d entries past the producer index %u (ring of "
			   "%u)",
			   r->bad, ahead, r->local, r->size);
	else
		chan_break(ch,
			   "CQ consumer index %u moved back (last seen %u, producer index %u, ring "
			   "of %u)",
			   r->bad, r->cached, r->local, r->size);
}

bool
chan_post(struct kvp_chan *ch, const struct kvp_cqe *c)
{
	int rc = kvp_ring_enqueue_bulk(&ch->cq, c, 1);

	if (rc < 0) {
		chan_cq_broken(ch);
		return true; /* the client is being dropped; nothing to deliver to */
	}
	if (rc == 0)
		return false;
	chan_notify(ch);
	return true;
}

/*
 * CQ entries @p ch must have free before the worker can move it on: one
 * for its oldest backlogged completion, else (submissions waiting) one more
 * than its transfers in flight, as poll_chan() keeps; 0 if it needs none.
 */
static uint32_t
cq_room_needed(struct kvp_chan *ch)
{
	if (ch->backlog_head)
		return 1;
	int n = kvp_ring_count(&ch->sq);

	/* An impossible index is work: poll_chan() reports it. */
	if (n < 0)
		return UINT32_MAX;
	return n > 0 ? ch->inflight + 1 : 0;
}

/*
 * Arm one channel's wakeups. A channel stuck on a full CQ is parked: the
 * client rings the worker's doorbell when it reads (room_wakeup), so it
 * costs nothing until then, however long its SQ or backlog.
 * @return false if the channel has work now
 */
bool
chan_prepare_sleep(struct kvp_chan *ch)
{
	uint32_t want = cq_room_needed(ch);

	if (want == UINT32_MAX)
		return false;
	if (want == 0)
		return kvp_ring_prepare_wait(&ch->sq);
	return kvp_ring_prepare_wait_room(&ch->cq, want);
}
