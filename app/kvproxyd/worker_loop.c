/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Worker lcore poll loop. One iteration: control messages, client
 * submissions, transport progress (one io_uring submit), timers. A loop that
 * finds nothing for a while blocks on the worker's doorbell and the
 * transport's completion fd, so that idle sidecars leave the CPU to others:
 * after poll.idle_us, or after about twice the recent gaps between going
 * idle and finding work again while those stay under poll.idle_max_us / 2
 * (kvp_backoff.h: the next transfer's bytes or its ACK are then due soon,
 * and a wake-up from another CPU costs more than the wait).
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>

#include <rte_pause.h>

#include "kvp_backoff.h"
#include "kvp_ctrl.h"
#include "kvproxyd.h"

/* While transfers are in flight (or fences pending), wake at least this often to check. */
#define SLEEP_BUSY_MS 1
#define SLEEP_IDLE_MS 100
/*
 * After the last transfer in flight has completed, spin this long before
 * the first yield: the client's next submission usually follows within a
 * microsecond or two, and a yield then hands the CPU to whatever else runs
 * here (on one CPU, the peer node's idle worker) for a whole turn first.
 * Never after handing bytes to the kernel: then the thread that must run
 * next is the receiver's.
 */
#define SPIN_AFTER_DONE_NS 2000

static void
worker_sleep(struct kvp_worker *w)
{
	if (!kvp_worker_prepare_sleep(w))
		return;
	struct pollfd pfd[1 + KVP_TP_MAX] = { { .fd = w->evfd, .events = POLLIN } };
	int fds[KVP_TP_MAX];
	unsigned n = kvp_worker_sleep_fds(w, fds, KVP_TP_MAX);

	for (unsigned i = 0; i < n; i++)
		pfd[1 + i] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
	/* Heartbeats are due every peer_ms / 4: wake often enough to send them. */
	int idle = (int)(w->cfg->peer_timeout_ms / 8);
	/*
	 * Ended transfers waiting for CQ room have no deadline left to watch;
	 * lost-notice counts wait for room towards another worker.
	 */
	bool busy = kvp_worker_inflight(w) > 0 || w->fences_pending || w->xlost_to;
	int timeout = busy ? SLEEP_BUSY_MS : idle < SLEEP_IDLE_MS ? idle : SLEEP_IDLE_MS;

	poll(pfd, 1 + n, timeout);
	kvp_worker_finish_sleep(w);
	KVP_STAT_ADD(w->stats.sleeps, 1);
}

int
kvp_worker_loop(void *arg)
{
	struct kvp_worker *w = arg;
	uint64_t prev = kvp_mono_ns(), idle_since = prev, gap_avg = 0;

	KVP_LOG(INFO, app, "worker %u running on lcore %u (%s transport, %s)", w->idx, w->lcore,
		w->tp[0].ops->name, w->cfg->busy_poll ? "busy-poll" : "adaptive polling");
	while (!w->quit) {
		int work = kvp_worker_inbox(w);

		work += kvp_worker_poll_chans(w);
		work += kvp_worker_progress(w);
		uint64_t now = kvp_mono_ns();
		work += kvp_worker_timers(w, now);

		KVP_STAT_ADD(w->stats.loops, 1);
		if (work) {
			KVP_STAT_ADD(w->stats.busy_ns, now - prev);
			/*
			 * The pass before found nothing (it left prev past the last
			 * busy pass): one sample of how long the work took to come,
			 * counted as 4x the cap at most.
			 */
			if (prev != idle_since) {
				uint64_t cap = (uint64_t)KVP_STAT_READ(w->cfg->idle_max_us) * 4000;

				gap_avg = kvp_backoff_avg(gap_avg, now - idle_since, cap);
			}
			idle_since = now;
		} else {
			KVP_STAT_ADD(w->stats.idle_ns, now - prev);
			/* Runtime knobs (config_set): relaxed loads of the main lcore's stores. */
			bool busy = KVP_STAT_READ(w->cfg->busy_poll);

			if (busy) {
				rte_pause();
			} else {
				uint64_t spin = kvp_backoff_spin_ns(
					gap_avg, (uint64_t)KVP_STAT_READ(w->cfg->idle_us) * 1000,
					(uint64_t)KVP_STAT_READ(w->cfg->idle_max_us) * 1000);

				KVP_STAT_SET(w->stats.idle_spin_ns, spin);
				if (now - idle_since >= spin)
					worker_sleep(w);
				else if (kvp_worker_spin_after_done(w, now, SPIN_AFTER_DONE_NS))
					rte_pause();
				else
					/*
					 * The spin before sleeping gives way to whatever
					 * is runnable here: on a shared CPU that is often
					 * the very thread that must answer (a client
					 * reading its completion, the peer's worker),
					 * which a spin would hold off for the whole spin.
					 */
					sched_yield();
				/*
				 * Blocked, or yielded the CPU, with nothing to do: idle.
				 * Counted here, so the pass that wakes up measures only
				 * its own work.
				 */
				uint64_t woke = kvp_mono_ns();

				KVP_STAT_ADD(w->stats.idle_ns, woke - now);
				now = woke;
			}
		}
		prev = now;
	}
	KVP_LOG(INFO, app, "worker %u stopped", w->idx);
	return 0;
}
