/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Client socket (main lcore): HELLO creates the client's channel and hands
 * it to a worker; REG/DEREG manage regions; PEER_LOOKUP resolves node ids,
 * PEER_ADDR addresses (a new one becomes an on-demand peer, dialled at once:
 * the reply does not wait for it, the first transfer does), NODE_ADDR says
 * where peers reach this node.
 * Every request gets a reply with an errno and a reason; a client that
 * breaks the protocol is disconnected and its resources reclaimed.
 *
 * Registering a region (mapping and populating it, importing GPU memory,
 * the transports' registration hooks) runs on a helper thread (jobs.c):
 * the client's reply comes when it is done, its further requests wait in
 * its socket meanwhile, and the loop serves everyone else. A connection
 * whose HELLO has arrived is never timed out: the HELLO deadline reads
 * what is waiting before it gives up.
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
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_mempool.h>

#include "ctrl_priv.h"

#define ACCEPT_RETRY_NS 100000000ull /* a paused listener tries again this often */
#define CLIENT_TIMER_NS 10000000ull  /* HELLO deadlines are checked this often */

static int
send_reply(struct kvp_client_conn *c, struct kvp_ctrl_rep *rep, const int *fds, unsigned nfds)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 4)];
	} u;
	struct iovec iov = { .iov_base = rep, .iov_len = sizeof(*rep) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds) {
		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	/* 256 bytes into an idle stream socket: a short write means the client is gone. */
	ssize_t r = sendmsg(c->sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	return r == (ssize_t)sizeof(*rep) ? 0 : -EPIPE;
}

static void __attribute__((format(printf, 3, 4)))
rep_error(struct kvp_ctrl_rep *rep, int err, const char *fmt, ...)
{
	va_list ap;

	rep->err = err;
	va_start(ap, fmt);
	vsnprintf(rep->errmsg, sizeof(rep->errmsg), fmt, ap);
	va_end(ap);
}

/*
 * A ring size the client may ask for: a power of two no larger than the
 * configured default, so that max_clients channels stay within the memory
 * the configuration plans for.
 */
static bool
ring_size_ok(uint32_t v, uint32_t max)
{
	return v >= 2 && v <= max && (v & (v - 1)) == 0;
}

/*
 * The worker a new client goes to: the one with the fewest clients (the
 * lowest index among equals), so clients spread over the workers in the
 * order they connect. The client then lives there: its submissions,
 * transfers, completions and fences.
 */
static unsigned
pick_worker(const struct kvp_node *n)
{
	unsigned best = 0;

	for (unsigned i = 1; i < n->nworkers; i++)
		if (n->worker_clients[i] < n->worker_clients[best])
			best = i;
	return best;
}

static void
do_hello(struct kvp_node *n, struct kvp_client_conn *c, const struct kvp_ctrl_req *req,
	 struct kvp_ctrl_rep *rep)
{
	uint32_t sqn = req->u.hello.sq_entries ? req->u.hello.sq_entries : n->cfg.sq_entries;
	uint32_t cqn = req->u.hello.cq_entries ? req->u.hello.cq_entries : n->cfg.cq_entries;
	struct kvp_chan *ch = NULL;
	int memfd = -1;

	if (c->state != KVP_CL_OPEN) {
		n->client_handshake_failures++;
		rep_error(rep, -EALREADY, "HELLO already done on this connection");
		return;
	}
	if (!ring_size_ok(sqn, n->cfg.sq_entries) || !ring_size_ok(cqn, n->cfg.cq_entries)) {
		n->client_handshake_failures++;
		rep_error(rep, -EINVAL,
			  "ring sizes sq %u, cq %u: each must be a power of two from 2 up to this "
			  "node's limits.sq_entries (%u) and limits.cq_entries (%u)",
			  sqn, cqn, n->cfg.sq_entries, n->cfg.cq_entries);
		return;
	}
	size_t len = kvp_chan_size(sqn, cqn);
	ch = calloc(1, sizeof(*ch));
	memfd = memfd_create("kvp-chan", MFD_CLOEXEC);
	if (!ch || memfd < 0 || ftruncate(memfd, (off_t)len) < 0)
		goto err_sys;
	ch->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (ch->mem == MAP_FAILED) {
		ch->mem = NULL;
		goto err_sys;
	}
	ch->len = len;
	ch->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ch->notify_fd < 0)
		goto err_unmap;
	ch->id = c->id;
	ch->pid = req->u.hello.pid;
	kvp_chan_init(ch->mem, len, sqn, cqn, c->id);
	kvp_chan_attach(ch->mem, len, true, &ch->sq, &ch->cq);

	c->worker = pick_worker(n);
	struct kvp_msg *m = ctrl_msg(n, KVP_MSG_CHAN_ADD);
	if (!m)
		goto err_close_notify;
	m->chan = ch;

	rep->u.hello.chan_size = len;
	rep->u.hello.client_id = c->id;
	rep->u.hello.max_segs = n->cfg.max_segments < sqn - 1 ? n->cfg.max_segments : sqn - 1;
	snprintf(rep->u.hello.node_id, sizeof(rep->u.hello.node_id), "%s", n->cfg.node_id);
	int fds[3] = { memfd, n->workers[c->worker].evfd, ch->notify_fd };
	if (send_reply(c, rep, fds, 3) < 0) {
		rte_mempool_put(n->msg_pool, m);
		goto err_close_notify;
	}
	close(memfd);
	c->chan = ch;
	c->pid = req->u.hello.pid;
	c->state = KVP_CL_ACTIVE;
	n->worker_clients[c->worker]++;
	/* Before it has regions: other workers route its landing notices by this. */
	__atomic_store_n(&n->client_worker[kvp_client_slot(c->id)], (uint8_t)c->worker,
			 __ATOMIC_RELEASE);
	ctrl_send(n, c->worker, m);
	KVP_LOG(INFO, core, "client %u (pid %d) connected: sq %u cq %u, worker %u", c->id, c->pid,
		sqn, cqn, c->worker);
	rep->op = 0; /* already replied */
	return;

err_close_notify:
	close(ch->notify_fd);
err_unmap:
	munmap(ch->mem, len);
err_sys:;
	int e = errno ? errno : ENOMEM;

	n->client_handshake_failures++;
	if (e == EMFILE || e == ENFILE) {
		n->clients_refused_fds++;
		rep_error(rep, -EMFILE,
			  "kvproxyd %s is out of file descriptors (RLIMIT_NOFILE); try again later",
			  n->cfg.node_id);
		KVP_LOG_RL(WARNING, core, "client %u (pid %d) refused: out of file descriptors",
			   c->id, (int)req->u.hello.pid);
	} else {
		rep_error(rep, -ENOMEM, "cannot create the channel: %s", strerror(e));
	}
	if (memfd >= 0)
		close(memfd);
	free(ch);
}

/* A registration on a helper thread: the client's request, and what came of it. */
struct kvp_reg_job {
	struct kvp_job job;
	struct kvp_region_table *t;
	uint32_t client; /* slot of the client conn (held until done) */
	uint32_t slot;	 /* the region slot reserved for it */
	int fd;		 /* the client's fd, closed once mapped (the mapping keeps the memory) */
	bool gpu;
	uint32_t flags;	 /* host: flags to map with */
	struct kvp_ctrl_req req;
	int rc;
	char why[KVP_ERRMSG_MAX];
};

static void
reg_run(struct kvp_job *j)
{
	struct kvp_reg_job *r = (struct kvp_reg_job *)j;
	const struct kvp_ctrl_req *req = &r->req;

	if (r->gpu)
		r->rc = kvp_region_import_gpu(r->t, r->slot, req->u.reg.flags, req->u.reg.device, r->fd,
					      req->u.reg.ipc, req->u.reg.fd_offset, req->u.reg.len,
					      r->why, sizeof(r->why));
	else
		r->rc = kvp_region_map_host(r->t, r->slot, r->fd, req->u.reg.fd_offset,
					    req->u.reg.len, r->flags);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

static void client_release(struct kvp_node *n, struct kvp_client_conn *c);

/* The registration came back: publish and reply, or undo if the client has gone. */
static void
reg_done(struct kvp_node *n, struct kvp_job *j)
{
	struct kvp_reg_job *r = (struct kvp_reg_job *)j;
	struct kvp_client_conn *c = &n->clients[r->client];
	const struct kvp_ctrl_req *req = &r->req;
	struct kvp_ctrl_rep rep;
	int rc = r->rc;

	c->job_busy = false;
	n->registering--;
	if (c->state != KVP_CL_ACTIVE) {
		kvp_region_discard(&n->regions, r->slot);
		if (c->release_after_job)
			client_release(n, c);
		return;
	}
	memset(&rep, 0, sizeof(rep));
	rep.magic = KVP_CTRL_MAGIC;
	rep.op = req->op;
	rep.seq = req->seq;
	if (rc == 0) {
		kvp_region_publish(&n->regions, r->slot, &rep.u.reg.key);
		if (r->gpu)
			KVP_LOG(INFO, core, "client %u: GPU %d region of %" PRIu64 " bytes (%s)", c->id,
				req->u.reg.device, req->u.reg.len,
				req->u.reg.flags == KVP_REGION_CUDA_IPC ? "IPC" : "VMM fd");
	} else {
		kvp_region_discard(&n->regions, r->slot);
		if (r->gpu)
			rep_error(&rep, rc, "GPU %d: %s", req->u.reg.device, r->why);
		else if (rc == -EPERM)
			/* kvp_region_map_host() refuses files that could shrink under the mapping. */
			rep_error(&rep, rc,
				  "the region fd must be a memfd sealed against shrinking "
				  "(memfd_create(MFD_ALLOW_SEALING) + fcntl(F_ADD_SEALS, F_SEAL_SHRINK); "
				  "kvp_host_alloc() does this)");
		else if (rc == -EINVAL)
			rep_error(&rep, rc,
				  "cannot map offset %" PRIu64 " length %" PRIu64
				  " (flags %#x): empty, beyond the end of the fd, or not host memory",
				  req->u.reg.fd_offset, req->u.reg.len, req->u.reg.flags);
		else
			rep_error(&rep, rc, "cannot map region: %s", strerror(-rc));
	}
	if (send_reply(c, &rep, NULL, 0) < 0) {
		kvp_client_drop(n, c, "reply failed");
		return;
	}
	/* Its next request, if one waits in the socket, comes with the next loop pass. */
	loop_rewatch(n, &c->watch, EPOLLIN | EPOLLRDHUP);
}

/* Checks that need no mapping; @return false with @p rep set if the request is refused. */
static bool
reg_gpu_ok(const struct kvp_ctrl_req *req, struct kvp_ctrl_rep *rep, int fd)
{
	uint32_t kind = req->u.reg.flags;

	if (!kvp_memops->import) {
		rep_error(rep, -ENODEV, "GPU regions unsupported here: %s", kvp_gpu_unavailable);
		return false;
	}
	if (kind == KVP_REGION_CUDA_VMM && fd < 0) {
		rep_error(rep, -EBADF, "a VMM region needs its POSIX fd attached");
		return false;
	}
	if (req->u.reg.len == 0) {
		rep_error(rep, -EINVAL, "empty region");
		return false;
	}
	if (kind == KVP_REGION_CUDA_VMM && req->u.reg.fd_offset != 0) {
		rep_error(rep, -EINVAL, "a VMM region covers its whole allocation (offset must be 0)");
		return false;
	}
	return true;
}

static void
do_reg(struct kvp_node *n, struct kvp_client_conn *c, const struct kvp_ctrl_req *req,
       struct kvp_ctrl_rep *rep)
{
	int fd = c->pending_fd;
	bool gpu = req->u.reg.flags == KVP_REGION_CUDA_IPC || req->u.reg.flags == KVP_REGION_CUDA_VMM;
	uint32_t flags = req->u.reg.flags;

	c->pending_fd = -1;
	if (c->state != KVP_CL_ACTIVE)
		rep_error(rep, -EPROTO, "HELLO first");
	else if (gpu && !reg_gpu_ok(req, rep, fd))
		;
	else if (!gpu && fd < 0)
		rep_error(rep, -EBADF, "REG needs the region's fd attached");
	if (rep->err) {
		if (fd >= 0)
			close(fd);
		return;
	}
	int slot = kvp_region_reserve(&n->regions, c->id);

	if (slot < 0) {
		rep_error(rep, slot, "region table full (limits.max_regions = %u)", n->cfg.max_regions);
		if (fd >= 0)
			close(fd);
		return;
	}
	/* Internal flags are the daemon's to set, never the client's. */
	if (flags & KVP_REGION_F_INTERNAL)
		flags = 0;
	else if (n->cfg.stage_host)
		flags |= KVP_REGION_F_STAGE;
	struct kvp_reg_job *r = &n->reg_jobs[c - n->clients];

	*r = (struct kvp_reg_job){ .job = { .run = reg_run, .done = reg_done },
				   .t = &n->regions,
				   .client = (uint32_t)(c - n->clients),
				   .slot = (uint32_t)slot,
				   .fd = fd,
				   .gpu = gpu,
				   .flags = gpu ? 0 : flags,
				   .req = *req };
	/* Nothing more is read from this client until the reply: only its hang-up. */
	c->job_busy = true;
	n->registering++;
	loop_rewatch(n, &c->watch, EPOLLRDHUP);
	rep->op = 0; /* reg_done() replies */
	job_post(n, &r->job);
}

/*
 * A peer named by address: the one dialled there, else a new on-demand peer
 * (its node id comes from its handshake). The reply is at once; a transfer
 * to a peer without a link yet waits for one up to timeouts.connect_ms.
 */
static void
peer_by_addr(struct kvp_node *n, const struct kvp_ctrl_req *req, struct kvp_ctrl_rep *rep)
{
	char addr[KVP_ADDR_MAX], host[64], why[192];
	uint16_t port;
	int slot;

	memcpy(addr, req->u.peer_addr.addr, sizeof(addr));
	addr[sizeof(addr) - 1] = '\0';
	if (kvp_config_parse_hostport(addr, host, sizeof(host), &port) < 0) {
		rep_error(rep, -EINVAL, "'%.80s': expected \"host:port\" (port 1-65535)", addr);
		return;
	}
	slot = peer_find_addr(n, host, port);
	if (slot < 0)
		slot = peer_add(n, KVP_PEER_ON_DEMAND, "", host, port, why, sizeof(why));
	if (slot < 0) {
		/* Own address, a full table, workers that cannot be told: the reason says which. */
		rep_error(rep, slot == -ENOSPC ? -ENOSPC : slot == -ENOBUFS ? -EAGAIN : -EINVAL,
			  "%s", why);
		return;
	}
	rep->u.peer.peer = peer_handle(n, (uint32_t)slot);
	snprintf(rep->u.peer.node_id, sizeof(rep->u.peer.node_id), "%s", n->peers[slot].node_id);
}

static void
handle_req(struct kvp_node *n, struct kvp_client_conn *c, const struct kvp_ctrl_req *req)
{
	struct kvp_ctrl_rep rep;
	int rc;

	memset(&rep, 0, sizeof(rep));
	rep.magic = KVP_CTRL_MAGIC;
	rep.op = req->op;
	rep.seq = req->seq;
	if (req->magic != KVP_CTRL_MAGIC || req->abi_version != KVP_ABI_VERSION) {
		n->client_handshake_failures++;
		rep_error(&rep, -EPROTO, "bad magic or ABI version %u (daemon speaks %u)",
			  req->abi_version, KVP_ABI_VERSION);
		send_reply(c, &rep, NULL, 0);
		kvp_client_drop(n, c, "protocol mismatch");
		return;
	}
	switch (req->op) {
	case KVP_CTRL_HELLO:
		do_hello(n, c, req, &rep);
		break;
	case KVP_CTRL_REG:
		do_reg(n, c, req, &rep);
		break;
	case KVP_CTRL_DEREG:
		rc = kvp_region_remove(&n->regions, req->u.dereg.key, c->id);
		if (rc == -ENOENT)
			rep_error(&rep, rc, "no region %016" PRIx64 " of this client",
				  req->u.dereg.key);
		else if (rc == -EBUSY)
			rep_error(&rep, rc, "region %016" PRIx64 " is used by transfers in flight",
				  req->u.dereg.key);
		break;
	case KVP_CTRL_PEER_LOOKUP: {
		char id[KVP_NODE_ID_MAX];

		memcpy(id, req->u.peer.node_id, sizeof(id));
		id[sizeof(id) - 1] = '\0';
		rc = peer_find(n, id, false);
		if (rc < 0)
			rep_error(&rep, -ENOENT, "'%s' is not a configured peer of %s%s", id,
				  n->cfg.node_id,
				  peer_find(n, id, true) >= 0 ? " (it is being removed)" : "");
		else if (!n->peers[rc].host[0])
			/* It dialled us; nothing can be sent to it until it is named by address. */
			rep_error(&rep, -ENOENT,
				  "'%s' is not a configured peer of %s: it connected to it (inbound) "
				  "and has no address to be dialled at; name it by its address",
				  id, n->cfg.node_id);
		else
			rep.u.peer.peer = peer_handle(n, (uint32_t)rc);
		break;
	}
	case KVP_CTRL_PEER_ADDR:
		peer_by_addr(n, req, &rep);
		break;
	case KVP_CTRL_NODE_ADDR:
		snprintf(rep.u.node_addr.addr, sizeof(rep.u.node_addr.addr), "%s:%u",
			 n->cfg.listen_host, n->cfg.listen_port);
		break;
	default:
		rep_error(&rep, -EOPNOTSUPP, "unknown request %u", req->op);
		break;
	}
	if (rep.op != 0 && send_reply(c, &rep, NULL, 0) < 0)
		kvp_client_drop(n, c, "reply failed");
}

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
			handle_req(n, c, &req);
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
