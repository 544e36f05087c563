/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Client socket requests (main lcore): HELLO creates the client's channel
 * and hands it to a worker; REG/DEREG manage regions; PEER_LOOKUP resolves
 * node ids, PEER_ADDR addresses (a new one becomes an on-demand peer,
 * dialled at once: the reply does not wait for it, the first transfer does),
 * NODE_ADDR says where peers reach this node.
 * Every request gets a reply with an errno and a reason; what a broken
 * request or a failed reply means for the connection, the connection side
 * (client_srv.c) decides from what client_req() returns.
 *
 * Registering a region (mapping and populating it, importing GPU memory,
 * the transports' registration hooks) runs on a helper thread (jobs.c):
 * the request side prepares the job and runs it there (reg_run); the
 * connection side posts it, stops reading the client meanwhile, and when it
 * comes back has client_reg_reply() publish and answer, or
 * client_reg_discard() undo it if the client left.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_mempool.h>

#include "client_req.h"

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

/* On a helper thread: the slow part of REG (the main lcore touches nothing of @p j meanwhile). */
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

void
client_reg_discard(struct kvp_node *n, struct kvp_reg_job *r)
{
	kvp_region_discard(&n->regions, r->slot);
}

int
client_reg_reply(struct kvp_node *n, struct kvp_client_conn *c, struct kvp_reg_job *r)
{
	const struct kvp_ctrl_req *req = &r->req;
	struct kvp_ctrl_rep rep;
	int rc = r->rc;

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
	return send_reply(c, &rep, NULL, 0);
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

/* @return true if n->reg_jobs[] holds the job for it, false if @p rep answers it */
static bool
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
		return false;
	}
	int slot = kvp_region_reserve(&n->regions, c->id);

	if (slot < 0) {
		rep_error(rep, slot, "region table full (limits.max_regions = %u)", n->cfg.max_regions);
		if (fd >= 0)
			close(fd);
		return false;
	}
	/* Internal flags are the daemon's to set, never the client's. */
	if (flags & KVP_REGION_F_INTERNAL)
		flags = 0;
	else if (n->cfg.stage_host)
		flags |= KVP_REGION_F_STAGE;
	struct kvp_reg_job *r = &n->reg_jobs[c - n->clients];

	*r = (struct kvp_reg_job){ .job = { .run = reg_run },
				   .t = &n->regions,
				   .client = (uint32_t)(c - n->clients),
				   .slot = (uint32_t)slot,
				   .fd = fd,
				   .gpu = gpu,
				   .flags = gpu ? 0 : flags,
				   .req = *req };
	return true;
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

enum client_next
client_req(struct kvp_node *n, struct kvp_client_conn *c, const struct kvp_ctrl_req *req,
	   const char **why)
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
		*why = "protocol mismatch";
		return CLIENT_NEXT_DROP;
	}
	switch (req->op) {
	case KVP_CTRL_HELLO:
		do_hello(n, c, req, &rep);
		break;
	case KVP_CTRL_REG:
		if (do_reg(n, c, req, &rep))
			return CLIENT_NEXT_JOB; /* client_reg_reply() answers */
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
	if (rep.op != 0 && send_reply(c, &rep, NULL, 0) < 0) {
		*why = "reply failed";
		return CLIENT_NEXT_DROP;
	}
	return CLIENT_NEXT_READ;
}
