/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libkvproxy: client side of the kvproxyd client socket and channel.
 *
 * The data path is the SPSC rings of the channel that HELLO hands over; it
 * never waits. Control calls go through ctrl.c, each bounded. A hang-up of
 * the socket is the daemon's death: it is sticky (c->gone) and every call
 * reports it with -EPIPE. Only kvp_connect() allocates.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_priv.h"

/* Map and validate the channel; the memfd is closed either way (the mapping keeps it). */
static int
chan_map(struct kvp_client *c, int memfd, uint64_t chan_size)
{
	struct stat st;
	void *mem;
	int rc;

	/* A file shorter than the announced size would SIGBUS us on access. */
	if (chan_size == 0 || chan_size > SIZE_MAX || fstat(memfd, &st) < 0 ||
	    (uint64_t)st.st_size < chan_size) {
		client_set_error(c, "channel from kvproxyd is smaller than announced");
		close(memfd);
		return -EPROTO;
	}
	mem = mmap(NULL, (size_t)chan_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	rc = mem == MAP_FAILED ? -errno : 0;
	close(memfd);
	if (rc < 0) {
		client_set_error(c, "cannot map the channel");
		return rc;
	}
	rc = kvp_chan_attach(mem, (size_t)chan_size, false, &c->sq, &c->cq);
	if (rc < 0) {
		client_set_error(c, rc == -EPROTONOSUPPORT ? "channel ABI version mismatch" :
						      "channel from kvproxyd is malformed");
		munmap(mem, (size_t)chan_size);
		return -EPROTO;
	}
	c->chan = mem;
	c->chan_len = (size_t)chan_size;
	return 0;
}

/* The reason of a failed connect, for the caller's buffer (the client is gone by then). */
static void
connect_error(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void
connect_error(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static bool
opts_valid(const struct kvp_connect_opts *o)
{
	for (size_t i = 0; i < sizeof(o->rsvd) / sizeof(o->rsvd[0]); i++)
		if (o->rsvd[i] != 0)
			return false;
	return o->timeout_ms >= -1 && o->ctrl_timeout_ms >= -1;
}

int
kvp_connect_ex(const char *sock_path, const struct kvp_connect_opts *opts, struct kvp_client **out,
	       char *err, size_t errlen)
{
	static const struct kvp_connect_opts defaults;
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	struct kvp_client *c;
	int fds[HELLO_FDS];
	uint64_t deadline;
	int rc;

	if (err != NULL && errlen > 0)
		err[0] = '\0';
	if (opts == NULL)
		opts = &defaults;
	if (sock_path == NULL || out == NULL || !opts_valid(opts)) {
		connect_error(err, errlen, "invalid arguments");
		return -EINVAL;
	}
	deadline = client_deadline(opts->timeout_ms ? opts->timeout_ms : KVP_CONNECT_TIMEOUT_MS);
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		connect_error(err, errlen, "out of memory");
		return -ENOMEM;
	}
	c->sock = c->sq_doorbell = c->cq_notify = -1;
	c->ctrl_timeout_ms = opts->ctrl_timeout_ms ? opts->ctrl_timeout_ms : KVP_CTRL_TIMEOUT_MS;
	c->wait_spin_us = KVP_WAIT_SPIN_AUTO;
	const char *spin = getenv("KVPROXY_WAIT_SPIN_US");
	if (spin && *spin && strcmp(spin, "auto") != 0) {
		char *end;
		unsigned long v = strtoul(spin, &end, 10);

		if (*end == '\0' && v <= 1000000)
			c->wait_spin_us = (uint32_t)v;
	}
	atomic_init(&c->wait_avg_ns, 0);
	atomic_init(&c->ctrl_gen, 0);
	atomic_init(&c->gone, false);

	rc = client_sock_connect(sock_path, &c->sock, deadline);
	if (rc < 0) {
		connect_error(err, errlen, "%s: %s", sock_path,
			      rc == -ETIMEDOUT ? "kvproxyd did not accept the connection in time "
						 "(daemon stopped or overloaded?)"
					       : strerror(-rc));
		goto err_free;
	}

	client_ctrl_init(&req, KVP_CTRL_HELLO);
	req.u.hello.sq_entries = opts->sq_entries;
	req.u.hello.cq_entries = opts->cq_entries;
	req.u.hello.pid = (int32_t)getpid();
	rc = client_ctrl_call_until(c, &req, -1, &rep, fds, HELLO_FDS, deadline);
	if (rc < 0) {
		/* The daemon's own reason when it refused us, else what went wrong here. */
		connect_error(err, errlen, "%s", c->errmsg);
		goto err_close_sock;
	}
	c->sq_doorbell = fds[1];
	c->cq_notify = fds[2];
	rc = chan_map(c, fds[0], rep.u.hello.chan_size);
	if (rc < 0) {
		connect_error(err, errlen, "%s", c->errmsg);
		goto err_close_fds;
	}

	c->client_id = rep.u.hello.client_id;
	memcpy(c->node_id, rep.u.hello.node_id, KVP_NODE_ID_MAX);
	c->node_id[KVP_NODE_ID_MAX - 1] = '\0';
	/* One transfer is published in one enqueue, so it must fit the SQ. */
	c->max_segs = rep.u.hello.max_segs;
	if (c->max_segs > KVP_XFER_SEGS_MAX)
		c->max_segs = KVP_XFER_SEGS_MAX;
	if (c->max_segs > c->sq.size - 1)
		c->max_segs = c->sq.size - 1;
	if (c->max_segs == 0) {
		connect_error(err, errlen, "kvproxyd announced 0 segments per transfer");
		rc = -EPROTO;
		goto err_unmap;
	}
	c->scratch = calloc(1 + (size_t)c->max_segs, sizeof(*c->scratch));
	if (c->scratch == NULL) {
		connect_error(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto err_unmap;
	}
	*out = c;
	return 0;

err_unmap:
	munmap(c->chan, c->chan_len);
err_close_fds:
	close(c->cq_notify);
	close(c->sq_doorbell);
err_close_sock:
	close(c->sock);
err_free:
	free(c);
	return rc;
}

int
kvp_connect(const char *sock_path, uint32_t sq_entries, uint32_t cq_entries,
	    struct kvp_client **out)
{
	struct kvp_connect_opts o = { .sq_entries = sq_entries, .cq_entries = cq_entries };

	return kvp_connect_ex(sock_path, &o, out, NULL, 0);
}

int
kvp_set_wait_spin(struct kvp_client *c, uint32_t us)
{
	if (c == NULL || (us > 1000000 && us != KVP_WAIT_SPIN_AUTO))
		return -EINVAL;
	c->wait_spin_us = us;
	return 0;
}

int
kvp_set_ctrl_timeout(struct kvp_client *c, int timeout_ms)
{
	if (c == NULL || timeout_ms < -1)
		return -EINVAL;
	c->ctrl_timeout_ms = timeout_ms ? timeout_ms : KVP_CTRL_TIMEOUT_MS;
	return 0;
}

void
kvp_close(struct kvp_client *c)
{
	if (c == NULL)
		return;
	/* Closing the socket first is what tells the daemon to reclaim. */
	close(c->sock);
	munmap(c->chan, c->chan_len);
	close(c->sq_doorbell);
	close(c->cq_notify);
	free(c->scratch);
	free(c);
}

const char *
kvp_last_error(const struct kvp_client *c)
{
	return c != NULL ? c->errmsg : "no client";
}

const char *
kvp_node_id(const struct kvp_client *c)
{
	return c != NULL ? c->node_id : "";
}

uint32_t
kvp_max_segments(const struct kvp_client *c)
{
	return c != NULL ? c->max_segs : 0;
}

/* One region registration call: host memory (fd), or GPU memory (an IPC handle or a dma-buf fd). */
static int
register_region(struct kvp_client *c, int fd, const void *ipc, uint64_t offset, uint64_t len,
		int device, uint32_t flags, uint64_t *key)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int rc;

	client_ctrl_init(&req, KVP_CTRL_REG);
	req.u.reg.fd_offset = offset;
	req.u.reg.len = len;
	req.u.reg.flags = flags;
	req.u.reg.device = device;
	if (ipc)
		memcpy(req.u.reg.ipc, ipc, sizeof(req.u.reg.ipc));
	rc = client_ctrl_call(c, &req, fd, &rep, NULL, 0);
	if (rc < 0)
		return rc;
	*key = rep.u.reg.key;
	return 0;
}

int
kvp_region_register(struct kvp_client *c, int fd, uint64_t fd_offset, uint64_t len, uint32_t flags,
		    uint64_t *key)
{
	if (c == NULL)
		return -EINVAL;
	if (fd < 0 || len == 0 || key == NULL) {
		client_set_error(c, "invalid region arguments");
		return -EINVAL;
	}
	return register_region(c, fd, NULL, fd_offset, len, 0, flags, key);
}

static int
register_gpu(struct kvp_client *c, int fd, const void *ipc, uint64_t offset, uint64_t len,
	     int device, uint32_t flags, uint64_t *key)
{
	if (len == 0 || key == NULL || device < 0) {
		client_set_error(c, "invalid GPU region arguments");
		return -EINVAL;
	}
	return register_region(c, fd, ipc, offset, len, device, flags, key);
}

int
kvp_region_register_cuda_ipc(struct kvp_client *c, const void *ipc_handle, uint64_t offset,
			     uint64_t len, int device, uint64_t *key)
{
	if (c == NULL)
		return -EINVAL;
	if (ipc_handle == NULL) {
		client_set_error(c, "no IPC handle");
		return -EINVAL;
	}
	return register_gpu(c, -1, ipc_handle, offset, len, device, KVP_REGION_CUDA_IPC, key);
}

int
kvp_region_register_cuda_fd(struct kvp_client *c, int fd, uint64_t len, int device,
			    uint64_t *key)
{
	if (c == NULL)
		return -EINVAL;
	if (fd < 0) {
		client_set_error(c, "invalid fd");
		return -EINVAL;
	}
	return register_gpu(c, fd, NULL, 0, len, device, KVP_REGION_CUDA_VMM, key);
}

int
kvp_region_deregister(struct kvp_client *c, uint64_t key)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;

	if (c == NULL)
		return -EINVAL;
	client_ctrl_init(&req, KVP_CTRL_DEREG);
	req.u.dereg.key = key;
	return client_ctrl_call(c, &req, -1, &rep, NULL, 0);
}

int
kvp_peer_lookup(struct kvp_client *c, const char *node_id, uint16_t *peer)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	size_t n;
	int rc;

	if (c == NULL)
		return -EINVAL;
	if (node_id == NULL || peer == NULL) {
		client_set_error(c, "invalid peer lookup arguments");
		return -EINVAL;
	}
	/* Node ids have no ':': a name with one is an address, dialled on demand. */
	if (strchr(node_id, ':') != NULL) {
		n = strnlen(node_id, KVP_ADDR_MAX);
		if (n >= KVP_ADDR_MAX) {
			client_set_error(c, "peer address is too long");
			return -EINVAL;
		}
		client_ctrl_init(&req, KVP_CTRL_PEER_ADDR);
		memcpy(req.u.peer_addr.addr, node_id, n + 1);
	} else {
		n = strnlen(node_id, KVP_NODE_ID_MAX);
		if (n == 0 || n >= KVP_NODE_ID_MAX) {
			client_set_error(c, "node id is empty or too long");
			return -EINVAL;
		}
		client_ctrl_init(&req, KVP_CTRL_PEER_LOOKUP);
		memcpy(req.u.peer.node_id, node_id, n + 1);
	}
	rc = client_ctrl_call(c, &req, -1, &rep, NULL, 0);
	if (rc < 0)
		return rc;
	*peer = rep.u.peer.peer;
	return 0;
}

int
kvp_listen_addr(struct kvp_client *c, char *buf, size_t len)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int rc;

	if (c == NULL)
		return -EINVAL;
	if (buf == NULL || len == 0) {
		client_set_error(c, "invalid listen address arguments");
		return -EINVAL;
	}
	client_ctrl_init(&req, KVP_CTRL_NODE_ADDR);
	rc = client_ctrl_call(c, &req, -1, &rep, NULL, 0);
	if (rc < 0)
		return rc;
	rep.u.node_addr.addr[KVP_ADDR_MAX - 1] = '\0';
	if (strlen(rep.u.node_addr.addr) >= len) {
		client_set_error(c, "listen address longer than the buffer");
		return -ENOSPC;
	}
	strcpy(buf, rep.u.node_addr.addr);
	return 0;
}

/* Write the worker's doorbell (the SQ consumer's and the parked CQ producer's). */
static void
ring_doorbell(struct kvp_client *c)
{
	uint64_t one = 1;

	while (write(c->sq_doorbell, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

/*
 * Ring the SQ doorbell if the daemon announced it sleeps. A failed write is
 * not reported: the entries are already published, and a daemon that cannot
 * be woken is a dead daemon, which the next call reports as -EPIPE.
 */
static void
sq_kick(struct kvp_client *c)
{
	if (kvp_ring_wakeup_needed(&c->sq))
		ring_doorbell(c);
}

static int
sq_publish(struct kvp_client *c, const void *sqes, uint32_t n, uint64_t now)
{
	if (client_gone_check(c, &c->sq_check_ns, now))
		return -EPIPE;

	int rc = kvp_ring_enqueue_bulk(&c->sq, sqes, n);

	if (rc < 0)
		return rc;
	if (rc == 0)
		return -EAGAIN;
	sq_kick(c);
	return 0;
}

int
kvp_submit(struct kvp_client *c, const struct kvp_xfer_desc *x, const struct kvp_segment *segs,
	   uint32_t nseg)
{
	/* max_segs < sq.size, so nseg + 1 always fits the ring. */
	if (c == NULL || x == NULL || segs == NULL || nseg == 0 || nseg > c->max_segs)
		return -EINVAL;

	struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&c->scratch[0];
	uint64_t now = client_now_ns();

	memset(h, 0, sizeof(*h));
	h->op = KVP_OP_XFER;
	h->peer = x->peer;
	h->nseg = nseg;
	h->user_id = x->user_id;
	h->timeout_ns = x->timeout_ns;
	h->submit_ns = now;
	for (uint32_t i = 0; i < nseg; i++) {
		struct kvp_sqe_seg *s = &c->scratch[1 + i];

		memset(s, 0, sizeof(*s));
		s->op = KVP_OP_SEG;
		s->src_key = segs[i].src_key;
		s->src_off = segs[i].src_off;
		s->dst_key = segs[i].dst_key;
		s->dst_off = segs[i].dst_off;
		s->len = segs[i].len;
	}
	return sq_publish(c, c->scratch, 1 + nseg, now);
}

int
kvp_submit2d(struct kvp_client *c, const struct kvp_xfer_desc *x,
	     const struct kvp_segment2d *segs, uint32_t nseg)
{
	if (c == NULL || x == NULL || segs == NULL || nseg == 0 || nseg > c->max_segs)
		return -EINVAL;

	struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&c->scratch[0];

	memset(h, 0, sizeof(*h));
	h->op = KVP_OP_XFER;
	h->peer = x->peer;
	h->nseg = nseg;
	h->user_id = x->user_id;
	h->timeout_ns = x->timeout_ns;
	h->submit_ns = client_now_ns();
	for (uint32_t i = 0; i < nseg; i++) {
		struct kvp_sqe_seg2d *s = (struct kvp_sqe_seg2d *)&c->scratch[1 + i];
		const struct kvp_segment2d *g = &segs[i];

		if (g->count == 0 || g->count > UINT32_MAX)
			return -EINVAL;
		memset(s, 0, sizeof(*s));
		s->op = g->count > 1 ? KVP_OP_SEG2D : KVP_OP_SEG;
		s->src_key = g->src_key;
		s->src_off = g->src_off;
		s->dst_key = g->dst_key;
		s->dst_off = g->dst_off;
		s->len = g->len;
		if (g->count > 1) {
			s->count = (uint32_t)g->count;
			s->src_stride = g->src_stride;
			s->dst_stride = g->dst_stride;
		}
	}
	return sq_publish(c, c->scratch, 1 + nseg, h->submit_ns);
}

int
kvp_cancel(struct kvp_client *c, uint64_t user_id)
{
	struct kvp_sqe_xfer h;

	if (c == NULL)
		return -EINVAL;
	memset(&h, 0, sizeof(h));
	h.op = KVP_OP_CANCEL;
	h.user_id = user_id;
	h.submit_ns = client_now_ns();
	return sq_publish(c, &h, 1, h.submit_ns);
}

int
kvp_fence(struct kvp_client *c, uint64_t value, uint64_t mask, uint32_t hold_ms,
	  uint64_t fence_id)
{
	struct kvp_sqe_fence f;

	if (c == NULL || mask == 0)
		return -EINVAL;
	memset(&f, 0, sizeof(f));
	f.op = KVP_OP_FENCE;
	f.hold_ms = hold_ms;
	f.fence_id = fence_id;
	f.value = value & mask;
	f.mask = mask;
	return sq_publish(c, &f, 1, client_now_ns());
}

int
kvp_poll(struct kvp_client *c, struct kvp_cqe *out, uint32_t max)
{
	if (c == NULL || (out == NULL && max > 0))
		return -EINVAL;

	int n = kvp_ring_dequeue_burst(&c->cq, out, max);

	if (n > 0) {
		/* We freed CQ room: a worker parked on our full CQ wants to know. */
		if (kvp_ring_room_wakeup_needed(&c->cq))
			ring_doorbell(c);
		return n;
	}
	/* Completions posted before the daemon died come first; then say it died. */
	if (n == 0 && client_gone_check(c, &c->cq_check_ns, client_now_ns()))
		return -EPIPE;
	return n;
}

/*
 * The control socket is silent between control calls, so readable data
 * there is either EOF (daemon gone) or a protocol violation. A control call
 * running on another thread is the one legitimate exception. Not reported
 * through kvp_last_error(): that text belongs to the control-call thread.
 */
static int
check_sock(struct kvp_client *c, short revents)
{
	char b;
	ssize_t n;

	if (revents & (POLLHUP | POLLERR | POLLNVAL))
		return -EPIPE;
	/* Pairs with the increments in client_ctrl_call(). */
	unsigned g0 = atomic_load(&c->ctrl_gen);
	n = recv(c->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	unsigned g1 = atomic_load(&c->ctrl_gen);
	if (n == 0)
		return -EPIPE;
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -EPIPE;
	/* A call running at, or ending around, the peek owns what we saw. */
	return (g0 & 1) || g0 != g1 ? 0 : -EPROTO;
}

/* kvp_wait() with @p timeout_ms != 0 (0 is a plain kvp_poll()), begun at @p start. */
static int
wait_cq(struct kvp_client *c, struct kvp_cqe *out, uint32_t max, int timeout_ms, uint64_t start)
{
	uint64_t avg = atomic_load_explicit(&c->wait_avg_ns, memory_order_relaxed);
	uint64_t deadline = 0, spin = client_wait_spin_ns(c->wait_spin_us, avg);
	int n;

	if (timeout_ms > 0)
		deadline = start + (uint64_t)timeout_ms * NSEC_PER_MSEC;
	if (spin) {
		/*
		 * A completion due within the spin costs no wake-up; the
		 * yield leaves the CPU to whoever is runnable (on a shared
		 * CPU often the very worker that is to post it).
		 */
		uint64_t now = start, until = now + spin;

		if (deadline && until > deadline)
			until = deadline;
		while ((n = kvp_poll(c, out, max)) == 0 && (now = client_now_ns()) < until)
			sched_yield();
		if (n != 0)
			return n;
	}

	for (;;) {
		n = kvp_poll(c, out, max);
		if (n != 0)
			return n;

		struct timespec ts, *tsp = NULL;

		if (timeout_ms > 0) {
			uint64_t now = client_now_ns();

			if (now >= deadline)
				return 0;
			ts.tv_sec = (time_t)((deadline - now) / NSEC_PER_SEC);
			ts.tv_nsec = (long)((deadline - now) % NSEC_PER_SEC);
			tsp = &ts;
		}
		if (!kvp_ring_prepare_wait(&c->cq))
			continue;

		struct pollfd pfd[2] = {
			{ .fd = c->cq_notify, .events = POLLIN },
			/* POLLHUP is reported even with no events asked for. */
			{ .fd = c->sock, .events = (atomic_load(&c->ctrl_gen) & 1) ? 0 : POLLIN },
		};
		int rc = ppoll(pfd, 2, tsp, NULL);
		int err = errno;

		kvp_ring_finish_wait(&c->cq);
		if (rc < 0) {
			if (err == EINTR)
				continue;
			return -err;
		}
		if (pfd[0].revents & POLLNVAL)
			return -EBADF;
		if (pfd[0].revents & POLLIN) {
			uint64_t v;

			/* Only ever read after POLLIN: the eventfd may be blocking. */
			while (read(c->cq_notify, &v, sizeof(v)) < 0 && errno == EINTR)
				;
		}
		if (pfd[1].revents) {
			int err2 = check_sock(c, pfd[1].revents);

			if (err2 < 0) {
				if (err2 == -EPIPE)
					client_mark_gone(c);
				/* Completions posted before the daemon died are still the caller's. */
				n = kvp_poll(c, out, max);
				return n != 0 ? n : err2;
			}
		}
	}
}

int
kvp_wait(struct kvp_client *c, struct kvp_cqe *out, uint32_t max, int timeout_ms)
{
	if (c == NULL || out == NULL || max == 0)
		return -EINVAL;
	if (timeout_ms == 0)
		return kvp_poll(c, out, max);

	uint64_t start = client_now_ns();
	int n = wait_cq(c, out, max, timeout_ms, start);

	if (n >= 0 && c->wait_spin_us == KVP_WAIT_SPIN_AUTO) {
		/* A timeout counts too: it says the waits are long. Relaxed: a hint. */
		uint64_t avg = atomic_load_explicit(&c->wait_avg_ns, memory_order_relaxed);

		atomic_store_explicit(&c->wait_avg_ns, client_wait_avg(avg, client_now_ns() - start),
				      memory_order_relaxed);
	}
	return n;
}

uint32_t
kvp_overflow(const struct kvp_client *c)
{
	return c != NULL ? atomic_load_explicit(&c->cq.shm->overflow, memory_order_relaxed) : 0;
}

int
kvp_host_alloc(size_t len, int *fd, void **addr)
{
	int mfd, rc;
	void *p;

	if (len == 0 || fd == NULL || addr == NULL)
		return -EINVAL;
	mfd = memfd_create("kvp-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0)
		return -errno;
	/* kvproxyd maps regions only if they can never shrink under it. */
	if (ftruncate(mfd, (off_t)len) < 0 || fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		rc = -errno;
		goto err_close;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		goto err_close;
	}
	*fd = mfd;
	*addr = p;
	return 0;

err_close:
	close(mfd);
	return rc;
}

void
kvp_host_free(int fd, void *addr, size_t len)
{
	if (addr != NULL && len != 0)
		munmap(addr, len);
	if (fd >= 0)
		close(fd);
}
