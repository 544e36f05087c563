/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The main lcore's event loop: one epoll set whose sources (listeners,
 * client, admin and peer connections) each carry their own callback, the
 * periodic jobs of the control plane, and the messages to and from the
 * workers (a handler per message type). Modules register what they own
 * from their init; the loop calls them, never the other way round, so no
 * module knows the others' events. Sources and timers are the callers'
 * (embedded in their connection structs): nothing here allocates.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_mempool.h>
#include <rte_ring.h>

#include "ctrl_priv.h"

static int
watch_ctl(struct kvp_node *n, int op, struct kvp_watch *w, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = w };

	return epoll_ctl(n->loop.epfd, op, w->fd, &ev) < 0 ? -errno : 0;
}

int
loop_watch(struct kvp_node *n, struct kvp_watch *w, int fd, uint32_t events, kvp_watch_fn fn,
	   void *arg)
{
	*w = (struct kvp_watch){ .fd = fd, .fn = fn, .arg = arg };
	int rc = watch_ctl(n, EPOLL_CTL_ADD, w, events);

	if (rc < 0)
		w->fd = -1;
	return rc;
}

int
loop_rewatch(struct kvp_node *n, struct kvp_watch *w, uint32_t events)
{
	return w->fd < 0 ? -EBADF : watch_ctl(n, EPOLL_CTL_MOD, w, events);
}

void
loop_unwatch(struct kvp_node *n, struct kvp_watch *w)
{
	if (w->fd >= 0)
		epoll_ctl(n->loop.epfd, EPOLL_CTL_DEL, w->fd, NULL);
	w->fd = -1;
}

void
loop_every(struct kvp_node *n, struct kvp_timer *t, uint64_t period_ns, kvp_timer_fn fn)
{
	*t = (struct kvp_timer){ .period_ns = period_ns, .fn = fn, .next = n->loop.timers };
	n->loop.timers = t;
}

void
loop_on_msg(struct kvp_node *n, int type, kvp_msg_fn fn)
{
	if (type > 0 && type < KVP_MSG_TYPES)
		n->loop.on_msg[type] = fn;
}

struct kvp_msg *
ctrl_msg(struct kvp_node *n, int type)
{
	struct kvp_msg *m;

	if (rte_mempool_get(n->msg_pool, (void **)&m) < 0)
		return NULL;
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->fd = -1;
	return m;
}

int
ctrl_send(struct kvp_node *n, unsigned worker, struct kvp_msg *m)
{
	struct kvp_worker *w = &n->workers[worker];
	uint64_t one = 1;

	if (rte_ring_enqueue(w->inbox, m) < 0) {
		rte_mempool_put(n->msg_pool, m);
		return -ENOBUFS;
	}
	if (write(w->evfd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is saturated; the worker wakes anyway. */
	}
	return 0;
}

/* The workers rang: their outboxes hold messages for the handlers. */
static void
outboxes(struct kvp_node *n, void *arg, uint32_t events)
{
	uint64_t v;

	(void)arg;
	(void)events;
	if (read(n->loop.evfd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing rang; outboxes are drained anyway. */
	}
	for (unsigned i = 0; i < n->nworkers; i++) {
		struct kvp_msg *msgs[32];
		unsigned cnt;

		while ((cnt = rte_ring_dequeue_burst(n->workers[i].outbox, (void **)msgs, 32,
						     NULL)) > 0) {
			for (unsigned k = 0; k < cnt; k++) {
				struct kvp_msg *m = msgs[k];

				if (m->type > 0 && m->type < KVP_MSG_TYPES && n->loop.on_msg[m->type])
					n->loop.on_msg[m->type](n, m);
				rte_mempool_put(n->msg_pool, m);
			}
		}
	}
}

int
ctrl_accept_spare(struct kvp_node *n, int lfd)
{
	int fd = -1;

	if (n->loop.spare_fd >= 0) {
		close(n->loop.spare_fd);
		n->loop.spare_fd = -1;
		fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	}
	return fd;
}

bool
ctrl_spare_restore(struct kvp_node *n)
{
	if (n->loop.spare_fd < 0)
		n->loop.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return n->loop.spare_fd >= 0;
}

int
loop_init(struct kvp_node *n)
{
	struct kvp_loop *l = &n->loop;

	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	/* Kept to accept (and refuse, with the reason) a connection when no fd is left. */
	l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	l->evfd_watch.fd = -1;
	if (l->epfd < 0 || l->evfd < 0)
		return -errno;
	return loop_watch(n, &l->evfd_watch, l->evfd, EPOLLIN, outboxes, NULL);
}

void
loop_fini(struct kvp_node *n)
{
	struct kvp_loop *l = &n->loop;

	if (l->spare_fd >= 0)
		close(l->spare_fd);
	if (l->evfd >= 0)
		close(l->evfd);
	if (l->epfd >= 0)
		close(l->epfd);
	l->spare_fd = l->evfd = l->epfd = -1;
	l->timers = NULL;
}

void
loop_run(struct kvp_node *n, int timeout_ms)
{
	struct epoll_event evs[32];
	int cnt = epoll_wait(n->loop.epfd, evs, 32, timeout_ms);
	uint64_t t0 = kvp_mono_ns();

	for (int i = 0; i < cnt; i++) {
		struct kvp_watch *w = evs[i].data.ptr;

		/* A callback earlier in this batch may have closed this source. */
		if (w->fd >= 0)
			w->fn(n, w->arg, evs[i].events);
	}
	uint64_t now = kvp_mono_ns();
	for (struct kvp_timer *t = n->loop.timers; t; t = t->next) {
		if (now >= t->due_ns) {
			t->due_ns = now + t->period_ns;
			t->fn(n, now);
		}
	}
	/* How long everyone else waited for this pass: nothing slow belongs here (jobs.c). */
	uint64_t pass = kvp_mono_ns() - t0;
	if (pass > n->loop_max_ns)
		__atomic_store_n(&n->loop_max_ns, pass, __ATOMIC_RELAXED);
}
