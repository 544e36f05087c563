/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Admin connections (main lcore): request lines in, reply lines out, and
 * the bounds that keep any one client from holding the control plane:
 *  - at most KVP_ADMIN_CONNS open; one more gets an error line and is closed;
 *  - a request line is at most KVP_ADMIN_LINEMAX bytes, and must be complete
 *    within timeouts.admin_ms of its first byte (slow-loris);
 *  - a reply must be read within timeouts.admin_ms;
 *  - a connection with nothing to do is closed after timeouts.admin_idle_ms.
 * Nothing here waits: a reply the socket does not take at once stays in the
 * connection's output buffer, and the connection is not read again until
 * the client has taken it. One read per readiness event, so a client that
 * writes without pause gets its turn and no more. Out of file descriptors, a
 * connection gets an error line through the node's spare descriptor, and
 * without one the listener leaves the epoll set for ACCEPT_RETRY_NS: never
 * a spin on a listener that cannot be served.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctrl_priv.h"

/* Fixed replies for connections cut off before a request could be parsed. */
#define BUSY_LINE                                                                             \
	"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32001,\"message\":\"too many " \
	"admin connections\"}}\n"
#define NO_FDS_LINE                                                                           \
	"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32001,\"message\":\"kvproxyd " \
	"is out of file descriptors\"}}\n"
#define TOO_LONG_LINE                                                                        \
	"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32600,\"message\":\"request " \
	"line too long\"}}\n"

#define ADMIN_TIMER_NS 10000000ull /* connection bounds are checked this often */

static uint64_t
ms_ns(uint32_t ms)
{
	return (uint64_t)ms * 1000000;
}

static void on_listen(struct kvp_node *n, void *arg, uint32_t events);
static void on_conn(struct kvp_node *n, void *arg, uint32_t events);

static void
conn_close(struct kvp_node *n, struct kvp_admin_conn *a)
{
	loop_unwatch(n, &a->watch);
	close(a->fd);
	a->fd = -1;
	a->len = 0;
	a->partial_ns = 0;
	free(a->out);
	a->out = NULL;
}

/* Best effort, never waiting: for short lines on a connection about to close. */
static void
send_now(int fd, const char *line, size_t len)
{
	if (send(fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		/* The client is gone or not reading; it is being closed anyway. */
	}
}

static void
accept_out_of_fds(struct kvp_node *n)
{
	int fd = ctrl_accept_spare(n, n->admin_lfd);

	if (fd >= 0) {
		n->admin_stats.no_fds++;
		KVP_LOG_RL(WARNING, core, "admin connection refused: out of file descriptors");
		send_now(fd, NO_FDS_LINE, sizeof(NO_FDS_LINE) - 1);
		close(fd);
	}
	if (!ctrl_spare_restore(n) && !n->admin_accept_paused) {
		loop_unwatch(n, &n->admin_lw);
		n->admin_accept_paused = true;
		n->admin_accept_retry_ns = kvp_mono_ns() + ACCEPT_RETRY_NS;
	}
}

void
kvp_admin_accept(struct kvp_node *n)
{
	int fd = accept4(n->admin_lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0) {
		if (errno == EMFILE || errno == ENFILE)
			accept_out_of_fds(n);
		return;
	}
	for (uint32_t i = 0; i < KVP_ADMIN_CONNS; i++) {
		struct kvp_admin_conn *a = &n->admin[i];

		if (a->fd >= 0)
			continue;
		if (loop_watch(n, &a->watch, fd, EPOLLIN | EPOLLRDHUP, on_conn, a) < 0)
			break;
		a->fd = fd;
		a->len = 0;
		a->partial_ns = 0;
		a->active_ns = kvp_mono_ns();
		n->admin_stats.accepted++;
		return;
	}
	n->admin_stats.refused++;
	KVP_LOG_RL(WARNING, core, "admin connection refused: %u already open", KVP_ADMIN_CONNS);
	send_now(fd, BUSY_LINE, sizeof(BUSY_LINE) - 1);
	close(fd);
}

/* Keep what the socket did not take; @return false if the connection is dead. */
static bool
send_reply(struct kvp_node *n, uint32_t slot, const char *buf, size_t len, uint64_t now)
{
	struct kvp_admin_conn *a = &n->admin[slot];
	ssize_t w = send(a->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);

	if (w < 0 && errno != EAGAIN && errno != EINTR)
		return false;
	if (w < 0)
		w = 0;
	if ((size_t)w == len)
		return true;
	a->out = malloc(len - (size_t)w);
	if (!a->out)
		return false;
	memcpy(a->out, buf + w, len - (size_t)w);
	a->out_len = len - (size_t)w;
	a->out_off = 0;
	a->out_ns = now;
	/* Not EPOLLRDHUP: a client that has shut down its side still gets the rest. */
	return loop_rewatch(n, &a->watch, EPOLLOUT) == 0;
}

/* Answer the complete lines in buf until a reply has to wait. @return false: close it. */
static bool
serve(struct kvp_node *n, uint32_t slot, uint64_t now)
{
	struct kvp_admin_conn *a = &n->admin[slot];
	char *start = a->buf, *nl;
	bool answered = false;

	while (!a->out && (nl = memchr(start, '\n', a->len - (uint32_t)(start - a->buf)))) {
		char *reply = n->admin_reply;
		size_t rl = kvp_admin_handle(n, start, (size_t)(nl - start), reply,
					     n->admin_reply_len - 1);

		start = nl + 1;
		answered = true;
		if (rl) {
			reply[rl++] = '\n';
			if (!send_reply(n, slot, reply, rl, now))
				return false;
		}
	}
	a->len -= (uint32_t)(start - a->buf);
	memmove(a->buf, start, a->len);
	if (answered) {
		a->active_ns = now;
		a->partial_ns = 0;
	}
	if (a->len && !a->partial_ns)
		a->partial_ns = now;
	return true;
}

/* Send more of a waiting reply. @return false: close the connection. */
static bool
flush(struct kvp_node *n, uint32_t slot, uint64_t now)
{
	struct kvp_admin_conn *a = &n->admin[slot];

	while (a->out_off < a->out_len) {
		ssize_t w = send(a->fd, a->out + a->out_off, a->out_len - a->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (w > 0)
			a->out_off += (size_t)w;
		else if (w < 0 && errno == EINTR)
			continue;
		else
			return w < 0 && errno == EAGAIN;
	}
	free(a->out);
	a->out = NULL;
	a->active_ns = now;
	return loop_rewatch(n, &a->watch, EPOLLIN | EPOLLRDHUP) == 0;
}

void
kvp_admin_event(struct kvp_node *n, uint32_t slot, uint32_t events)
{
	struct kvp_admin_conn *a = &n->admin[slot];
	uint64_t now = kvp_mono_ns();

	(void)events; /* level-triggered: send and recv say what is ready */
	if (a->fd < 0)
		return;
	if (a->out) {
		/* Lines that came with the request wait for its reply to go. */
		if (!flush(n, slot, now) || (!a->out && !serve(n, slot, now)))
			conn_close(n, a);
		return;
	}
	ssize_t r = recv(a->fd, a->buf + a->len, KVP_ADMIN_LINEMAX - a->len, MSG_DONTWAIT);

	if (r < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (r <= 0) {
		conn_close(n, a);
		return;
	}
	a->len += (uint32_t)r;
	if (!serve(n, slot, now)) {
		conn_close(n, a);
		return;
	}
	if (a->len == KVP_ADMIN_LINEMAX) {
		/* A full buffer without a newline: nothing sane follows. */
		n->admin_stats.too_long++;
		KVP_LOG_RL(WARNING, core, "admin connection closed: request line over %u bytes",
			   KVP_ADMIN_LINEMAX);
		send_now(a->fd, TOO_LONG_LINE, sizeof(TOO_LONG_LINE) - 1);
		conn_close(n, a);
	}
}

void
kvp_admin_timers(struct kvp_node *n, uint64_t now)
{
	uint64_t bound = ms_ns(__atomic_load_n(&n->cfg.admin_timeout_ms, __ATOMIC_RELAXED));
	uint64_t idle = ms_ns(__atomic_load_n(&n->cfg.admin_idle_ms, __ATOMIC_RELAXED));

	if (n->admin_accept_paused && now >= n->admin_accept_retry_ns) {
		n->admin_accept_paused = false;
		loop_watch(n, &n->admin_lw, n->admin_lfd, EPOLLIN, on_listen, NULL);
	}

	for (uint32_t i = 0; i < KVP_ADMIN_CONNS; i++) {
		struct kvp_admin_conn *a = &n->admin[i];
		const char *why = NULL;

		if (a->fd < 0)
			continue;
		if (a->out && now - a->out_ns >= bound)
			why = "its reply was not read within timeouts.admin_ms";
		else if (!a->out && a->partial_ns && now - a->partial_ns >= bound)
			why = "a request line was not completed within timeouts.admin_ms";
		if (why) {
			n->admin_stats.slow++;
		} else if (!a->out && !a->len && now - a->active_ns >= idle) {
			n->admin_stats.idle++;
			why = "idle for timeouts.admin_idle_ms";
		} else {
			continue;
		}
		KVP_LOG_RL(NOTICE, core, "admin connection closed: %s", why);
		conn_close(n, a);
	}
}

unsigned
kvp_admin_open(const struct kvp_node *n)
{
	unsigned open = 0;

	for (uint32_t i = 0; i < KVP_ADMIN_CONNS; i++)
		open += n->admin[i].fd >= 0;
	return open;
}

void
kvp_admin_close_all(struct kvp_node *n)
{
	for (uint32_t i = 0; i < KVP_ADMIN_CONNS; i++)
		if (n->admin[i].fd >= 0)
			conn_close(n, &n->admin[i]);
}

static void
on_listen(struct kvp_node *n, void *arg, uint32_t events)
{
	(void)arg;
	(void)events;
	kvp_admin_accept(n);
}

static void
on_conn(struct kvp_node *n, void *arg, uint32_t events)
{
	struct kvp_admin_conn *a = arg;

	kvp_admin_event(n, (uint32_t)(a - n->admin), events);
}

int
admin_conn_init(struct kvp_node *n)
{
	/* The largest reply line: the Prometheus text with JSON escaping; one for all connections. */
	n->admin_reply_len = 2 * n->stats_len;
	n->admin_reply = malloc(n->admin_reply_len);
	if (!n->admin_reply)
		return -ENOMEM;
	loop_every(n, &n->admin_timer, ADMIN_TIMER_NS, kvp_admin_timers);
	return loop_watch(n, &n->admin_lw, n->admin_lfd, EPOLLIN, on_listen, NULL);
}
