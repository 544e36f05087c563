/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Client socket connections (main lcore): accepting and checking who
 * connects, reading requests (client_req.c serves them and says what the
 * connection does next), and dropping and releasing clients: a client that
 * breaks the protocol is disconnected and its resources reclaimed.
 *
 * A region registration runs on a helper thread (jobs.c): the connection
 * posts the job client_req.c prepared, reads nothing more of the client but
 * its hang-up until the job is back, and the loop serves everyone else; a
 * client that left meanwhile is released when it is. A connection whose
 * HELLO has arrived is never timed out: the HELLO deadline reads what is
 * waiting before it gives up.
 *
 * A connection refused before its HELLO was read (credentials, the client
 * limit, no file descriptor left) gets a HELLO reply with the reason and is
 * closed: libkvproxy reads it even when its own HELLO could not be sent.
 * Out of file descriptors, a spare one is given up to accept and refuse the
 * next client; if even that fails, the listener leaves the epoll set until
 * a client leaves or ACCEPT_RETRY_NS passes, so the main loop never spins
 * on a listener it cannot serve.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_req.h"

#define CLIENT_TIMER_NS 10000000ull  /* HELLO deadlines are checked this often */

/* True if @p gid is among the peer's supplementary groups (as of its connect()). */
static bool
peer_in_group(int fd, gid_t gid)
{
	gid_t small[64], *g = small;
	socklen_t len = sizeof(small);
	bool found = false;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
		/* ERANGE: len now says how much room the list needs. */
		if (errno != ERANGE || !(g = malloc(len)))
			return false;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0)
			len = 0;
	}
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		found |= g[i] == gid;
	if (g != small)
		free(g);
	return found;
}

/*
 * Only our own user, root, or a member of client_group may hand us memory.
 * The socket file's mode keeps others out already; this check holds even
 * where a looser file mode or a passed descriptor would let them in.
 */
static bool
peer_allowed(const struct kvp_node *n, int fd, struct ucred *cred)
{
	socklen_t clen = sizeof(*cred);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &clen) < 0) {
		memset(cred, 0xff, sizeof(*cred));
		return false;
	}
	if (cred->uid == geteuid() || cred->uid == 0)
		return true;
	if (n->cfg.client_group.name[0] == '\0')
		return false;
	return cred->gid == n->cfg.client_group.gid || peer_in_group(fd, n->cfg.client_group.gid);
}

/* Answer the HELLO that has not been read yet with @p err and close. */
static void __attribute__((format(printf, 3, 4)))
refuse_conn(int fd, int err, const char *fmt, ...)
{
	struct kvp_ctrl_rep rep;
	va_list ap;

	memset(&rep, 0, sizeof(rep));
	rep.magic = KVP_CTRL_MAGIC;
	rep.op = KVP_CTRL_HELLO;
	rep.err = err;
	rep.seq = 1; /* a connection's first request, libkvproxy's HELLO, is seq 1 */
	va_start(ap, fmt);
	vsnprintf(rep.errmsg, sizeof(rep.errmsg), fmt, ap);
	va_end(ap);
	if (send(fd, &rep, sizeof(rep), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		/* The client is gone already; it is refused either way. */
	}
	close(fd);
}

static void on_listen(struct kvp_node *n, void *arg, uint32_t events);
static void on_input(struct kvp_node *n, void *arg, uint32_t events);
static void client_release(struct kvp_node *n, struct kvp_client_conn *c);

static void
accept_pause(struct kvp_node *n)
{
	if (n->client_accept_paused)
		return;
	loop_unwatch(n, &n->client_lw);
	n->client_accept_paused = true;
	n->client_accept_pauses++;
	n->client_accept_retry_ns = kvp_mono_ns() + ACCEPT_RETRY_NS;
	KVP_LOG_RL(WARNING, core,
		   "out of file descriptors: not accepting clients until one leaves (retry every "
		   "%llu ms)",
		   ACCEPT_RETRY_NS / 1000000);
}

void
kvp_client_accept_resume(struct kvp_node *n)
{
	if (!n->client_accept_paused)
		return;
	n->client_accept_paused = false;
	loop_watch(n, &n->client_lw, n->client_lfd, EPOLLIN, on_listen, NULL);
}

/*
 * accept() found no file descriptor: give up the spare one to take the
 * client and tell it why, then take the spare back. Without a spare, stop
 * watching the listener (queued clients wait; their own timeouts bound it).
 */
static void
accept_out_of_fds(struct kvp_node *n)
{
	struct rlimit rl = { 0 };
	int fd = -1;

	getrlimit(RLIMIT_NOFILE, &rl);
	fd = ctrl_accept_spare(n, n->client_lfd);
	if (fd >= 0) {
		n->clients_refused_fds++;
		KVP_LOG_RL(WARNING, core,
			   "client refused: out of file descriptors (RLIMIT_NOFILE %llu, %u clients)",
			   (unsigned long long)rl.rlim_cur, n->nclients);
		refuse_conn(fd, -EMFILE,
			    "kvproxyd %s is out of file descriptors (RLIMIT_NOFILE %llu); try again "
			    "later",
			    n->cfg.node_id, (unsigned long long)rl.rlim_cur);
	}
	if (!ctrl_spare_restore(n))
		accept_pause(n);
}

void
kvp_client_accept(struct kvp_node *n)
{
	int fd = accept4(n->client_lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	struct ucred cred;

	if (fd < 0) {
		if (errno == EMFILE || errno == ENFILE)
			accept_out_of_fds(n);
		return;
	}
	if (!peer_allowed(n, fd, &cred)) {
		n->clients_refused_cred++;
		KVP_LOG_RL(WARNING, core,
			   "client connection refused: pid %d uid %u gid %u is not uid %u, not root "
			   "and not in client_group %s",
			   (int)cred.pid, cred.uid, cred.gid, (unsigned)geteuid(),
			   n->cfg.client_group.name[0] ? n->cfg.client_group.name : "(none set)");
		refuse_conn(fd, -EPERM,
			    "kvproxyd %s does not serve uid %u: not its user, not root and not in "
			    "its client_group",
			    n->cfg.node_id, cred.uid);
		return;
	}
	for (uint32_t i = 0; i < n->cfg.max_clients; i++) {
		struct kvp_client_conn *c = &n->clients[i];

		if (c->state != KVP_CL_FREE)
			continue;
		/* The generation makes a stale id of a departed client never match. */
		uint16_t gen = (uint16_t)(c->gen + 1);

		memset(c, 0, sizeof(*c));
		c->gen = gen;
		c->id = i | ((uint32_t)gen << 16);
		c->state = KVP_CL_OPEN;
		c->sock = fd;
		c->pending_fd = -1;
		c->hello_deadline_ns = kvp_mono_ns() + (uint64_t)n->cfg.connect_timeout_ms * 1000000;
		n->nclients++;
		loop_watch(n, &c->watch, fd, EPOLLIN | EPOLLRDHUP, on_input, c);
		return;
	}
	n->clients_refused_limit++;
	KVP_LOG_RL(WARNING, core, "client (pid %d) refused: limits.max_clients (%u) reached",
		   (int)cred.pid, n->cfg.max_clients);
	refuse_conn(fd, -EUSERS, "kvproxyd %s serves at most %u clients (limits.max_clients)",
		    n->cfg.node_id, n->cfg.max_clients);
}

/* A registration came back: answer it, or release a client that left while it ran. */
static void
reg_job_done(struct kvp_node *n, struct kvp_job *j)
{
	struct kvp_reg_job *r = (struct kvp_reg_job *)j;
	struct kvp_client_conn *c = &n->clients[r->client];

	c->job_busy = false;
	n->registering--;
	if (c->state != KVP_CL_ACTIVE) {
		client_reg_discard(n, r);
		if (c->release_after_job)
			client_release(n, c);
		return;
	}
	if (client_reg_reply(n, c, r) < 0) {
		kvp_client_drop(n, c, "reply failed");
		return;
	}
	/* Its next request, if one waits in the socket, comes with the next loop pass. */
	loop_rewatch(n, &c->watch, EPOLLIN | EPOLLRDHUP);
}

/* One whole request of @p c: client_req.c answers it; what follows for the connection is ours. */
static void
serve(struct kvp_node *n, struct kvp_client_conn *c, const struct kvp_ctrl_req *req)
{
	const char *why = NULL;
	struct kvp_reg_job *r;

	switch (client_req(n, c, req, &why)) {
	case CLIENT_NEXT_READ:
		break;
	case CLIENT_NEXT_JOB:
		r = &n->reg_jobs[c - n->clients];
		r->job.done = reg_job_done;
		/* Nothing more is read from this client until the reply: only its hang-up. */
		c->job_busy = true;
		n->registering++;
		loop_rewatch(n, &c->watch, EPOLLRDHUP);
		job_post(n, &r->job); /* without helpers, reg_job_done() has run on return */
		break;
	case CLIENT_NEXT_DROP:
		kvp_client_drop(n, c, why);
		break;
	}
}

void
kvp_client_input(struct kvp_node *n, uint32_t slot)
{
	struct kvp_client_conn *c = &n->clients[slot];
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 4)];
	} u;

	while ((c->state == KVP_CL_OPEN || c->state == KVP_CL_ACTIVE) && !c->job_busy) {
		struct iovec iov = { .iov_base = c->rbuf + c->rlen,
				     .iov_len = sizeof(c->rbuf) - c->rlen };
		struct msghdr msg = { .msg_iov = &iov,
				      .msg_iovlen = 1,
				      .msg_control = u.buf,
				      .msg_controllen = sizeof(u.buf) };
		ssize_t r = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);

		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (r <= 0) {
			kvp_client_drop(n, c, r == 0 ? "disconnected" : strerror(errno));
			return;
		}
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			int nfd = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int fds[4];

			memcpy(fds, CMSG_DATA(cm), sizeof(int) * (size_t)nfd);
			for (int k = 0; k < nfd; k++) {
				/* One fd per request; extras are a client bug, not a leak. */
				if (c->pending_fd < 0)
					c->pending_fd = fds[k];
				else
					close(fds[k]);
			}
		}
		c->rlen += (uint32_t)r;
		if (c->rlen == sizeof(c->rbuf)) {
			struct kvp_ctrl_req req;

			memcpy(&req, c->rbuf, sizeof(req));
			c->rlen = 0;
			serve(n, c, &req);
		}
	}
}

static void
client_release(struct kvp_node *n, struct kvp_client_conn *c)
{
	if (c->job_busy) {
		/* Its registration still runs on a helper: the slot goes when it comes back. */
		c->release_after_job = true;
		return;
	}
	/* Counted once, when the slot really goes (the job's return may be that time). */
	if (c->state == KVP_CL_DETACHING || c->state == KVP_CL_ACTIVE)
		n->worker_clients[c->worker]--;
	if (c->chan) {
		munmap(c->chan->mem, c->chan->len);
		close(c->chan->notify_fd);
		free(c->chan);
		c->chan = NULL;
	}
	kvp_region_remove_owner(&n->regions, c->id);
	c->state = KVP_CL_FREE;
	n->nclients--;
	/* Its descriptors are back: a listener paused for want of them may go on. */
	kvp_client_accept_resume(n);
}

void
kvp_client_drop(struct kvp_node *n, struct kvp_client_conn *c, const char *why)
{
	if (c->state != KVP_CL_OPEN && c->state != KVP_CL_ACTIVE)
		return;
	KVP_LOG(INFO, core, "client %u (pid %d) %s", c->id, c->pid, why);
	loop_unwatch(n, &c->watch);
	close(c->sock);
	c->sock = -1;
	if (c->pending_fd >= 0) {
		close(c->pending_fd);
		c->pending_fd = -1;
	}
	if (c->state == KVP_CL_ACTIVE) {
		struct kvp_msg *m = ctrl_msg(n, KVP_MSG_CHAN_DEL);

		c->state = KVP_CL_DETACHING;
		if (m) {
			m->chan = c->chan;
			if (ctrl_send(n, c->worker, m) == 0)
				return;
		}
		/* The worker cannot be told: keep the slot rather than free what it uses. */
		KVP_LOG(ERR, core, "client %u: cannot reach worker %u; slot leaked", c->id,
			c->worker);
		return;
	}
	client_release(n, c);
}

static struct kvp_client_conn *
client_of_chan(struct kvp_node *n, const struct kvp_chan *ch)
{
	uint32_t slot = kvp_client_slot(ch->id);

	if (slot >= n->cfg.max_clients || n->clients[slot].chan != ch)
		return NULL;
	return &n->clients[slot];
}

void
kvp_client_gone(struct kvp_node *n, struct kvp_chan *ch)
{
	struct kvp_client_conn *c = client_of_chan(n, ch);

	if (c && c->state == KVP_CL_DETACHING)
		client_release(n, c);
}

void
kvp_client_broken(struct kvp_node *n, struct kvp_chan *ch, const char *why)
{
	struct kvp_client_conn *c = client_of_chan(n, ch);
	char msg[192];

	if (!c)
		return;
	n->ring_violations++;
	snprintf(msg, sizeof(msg), "broke the ring protocol (%s); disconnected", why);
	kvp_client_drop(n, c, msg);
}

/*
 * A connection that never says HELLO must not hold a client slot. One whose
 * HELLO has arrived is served, however late the loop looks: what waits in
 * the socket is read before the deadline is enforced.
 */
void
kvp_client_timers(struct kvp_node *n, uint64_t now)
{
	for (uint32_t i = 0; i < n->cfg.max_clients; i++) {
		struct kvp_client_conn *c = &n->clients[i];

		if (c->state != KVP_CL_OPEN || now < c->hello_deadline_ns)
			continue;
		kvp_client_input(n, i);
		if (c->state == KVP_CL_OPEN) {
			n->client_handshake_failures++;
			kvp_client_drop(n, c, "sent no HELLO in time; disconnected");
		}
	}
	if (n->client_accept_paused && now >= n->client_accept_retry_ns)
		kvp_client_accept_resume(n);
}

static void
on_listen(struct kvp_node *n, void *arg, uint32_t events)
{
	(void)arg;
	(void)events;
	kvp_client_accept(n);
}

static void
on_input(struct kvp_node *n, void *arg, uint32_t events)
{
	struct kvp_client_conn *c = arg;

	if (c->job_busy) {
		/* Only a hang-up is watched while its registration runs. */
		if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
			kvp_client_drop(n, c, "disconnected");
		return;
	}
	kvp_client_input(n, (uint32_t)(c - n->clients));
}

static void
on_chan_gone(struct kvp_node *n, const struct kvp_msg *m)
{
	kvp_client_gone(n, m->chan);
}

static void
on_chan_broken(struct kvp_node *n, const struct kvp_msg *m)
{
	kvp_client_broken(n, m->chan, m->reason);
}

int
client_srv_init(struct kvp_node *n)
{
	n->reg_jobs = calloc(n->cfg.max_clients, sizeof(*n->reg_jobs));
	if (!n->reg_jobs)
		return -ENOMEM;
	loop_on_msg(n, KVP_MSG_CHAN_GONE, on_chan_gone);
	loop_on_msg(n, KVP_MSG_CHAN_BROKEN, on_chan_broken);
	loop_every(n, &n->client_timer, CLIENT_TIMER_NS, kvp_client_timers);
	return loop_watch(n, &n->client_lw, n->client_lfd, EPOLLIN, on_listen, NULL);
}
