/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libkvproxy: client side of the kvproxyd client socket and channel.
 *
 * Control calls are one fixed-size request and one fixed-size reply on the
 * UNIX socket (fds ride along with SCM_RIGHTS); the data path is the SPSC
 * rings of the channel that HELLO hands over. Only kvp_connect() allocates.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kvproxy.h"

#define HELLO_FDS     3
#define CTRL_FDS_MAX  HELLO_FDS
#define NSEC_PER_SEC  1000000000ull
#define NSEC_PER_MSEC 1000000ull

struct kvp_client {
	int sock;
	int sq_doorbell; /* we write it when the daemon sleeps on the SQ */
	int cq_notify;   /* the daemon writes it when we sleep on the CQ */
	void *chan;
	size_t chan_len;
	struct kvp_ring sq;
	struct kvp_ring cq;
	uint64_t seq;
	/*
	 * Non-zero while a control call waits for its reply: kvp_wait() may run
	 * on another thread and must then not mistake that reply for garbage.
	 */
	atomic_uint ctrl_gen; /* odd while a control call runs; bumped at its start and end */
	uint32_t client_id;
	uint32_t max_segs; /* daemon limit, clamped to what the SQ can hold */
	/* Header plus max_segs segments, staged for one bulk enqueue. */
	struct kvp_sqe_seg *scratch;
	char node_id[KVP_NODE_ID_MAX];
	char errmsg[KVP_ERRMSG_MAX];
};

static void
set_error(struct kvp_client *c, const char *msg)
{
	size_t n = 0;

	/* Copied by hand: msg may be a short literal or the daemon's bounded errmsg. */
	while (n < sizeof(c->errmsg) - 1 && msg[n] != '\0') {
		c->errmsg[n] = msg[n];
		n++;
	}
	c->errmsg[n] = '\0';
}

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static void
close_fds(int *fds, unsigned int n)
{
	for (unsigned int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static int
send_all(struct kvp_client *c, const void *buf, size_t len, int fd)
{
	const uint8_t *p = buf;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} cbuf;

	while (len > 0) {
		struct iovec iov = { .iov_base = (void *)p, .iov_len = len };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

		/* The fd goes with the first byte only; it must not be sent twice. */
		if (fd >= 0) {
			memset(&cbuf, 0, sizeof(cbuf));
			msg.msg_control = cbuf.buf;
			msg.msg_controllen = sizeof(cbuf.buf);
			struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		}
		ssize_t n = sendmsg(c->sock, &msg, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EPIPE || errno == ECONNRESET) {
				set_error(c, "kvproxyd closed the connection");
				return -EPIPE;
			}
			set_error(c, "sending to kvproxyd failed");
			return -errno;
		}
		fd = -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Read exactly @p len bytes, collecting fds from every segment: the daemon
 * sends them with the reply, but a short read could split the reply, and
 * fds we did not ask for must still be closed rather than leaked.
 */
static int
recv_all(struct kvp_client *c, void *buf, size_t len, int *fds, unsigned int *nfds)
{
	uint8_t *p = buf;
	bool extra = false;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * CTRL_FDS_MAX)];
	} cbuf;

	*nfds = 0;
	while (len > 0) {
		struct iovec iov = { .iov_base = p, .iov_len = len };
		struct msghdr msg = {
			.msg_iov = &iov,
			.msg_iovlen = 1,
			.msg_control = cbuf.buf,
			.msg_controllen = sizeof(cbuf.buf),
		};
		ssize_t n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			int err = errno == ECONNRESET ? EPIPE : errno;

			set_error(c, "receiving from kvproxyd failed");
			close_fds(fds, *nfds);
			*nfds = 0;
			return -err;
		}
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			unsigned int k = (unsigned int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

			for (unsigned int i = 0; i < k; i++) {
				int fd;

				memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
				if (*nfds < CTRL_FDS_MAX) {
					fds[(*nfds)++] = fd;
				} else {
					close(fd);
					extra = true;
				}
			}
		}
		if (msg.msg_flags & MSG_CTRUNC)
			extra = true;
		if (n == 0) {
			set_error(c, "kvproxyd closed the connection");
			close_fds(fds, *nfds);
			*nfds = 0;
			return -EPIPE;
		}
		p += n;
		len -= (size_t)n;
	}
	if (extra) {
		set_error(c, "kvproxyd sent more fds than the protocol allows");
		close_fds(fds, *nfds);
		*nfds = 0;
		return -EPROTO;
	}
	return 0;
}

/*
 * One request/reply exchange. On success with @p want_fds > 0, exactly that
 * many fds are returned in @p fds; in every other case none are left open.
 */
static int
ctrl_call(struct kvp_client *c, struct kvp_ctrl_req *req, int send_fd, struct kvp_ctrl_rep *rep,
	  int *fds, unsigned int want_fds)
{
	int rfds[CTRL_FDS_MAX];
	unsigned int nfds = 0;
	int rc;

	req->magic = KVP_CTRL_MAGIC;
	req->abi_version = KVP_ABI_VERSION;
	req->seq = ++c->seq;
	/* Pairs with the loads in check_sock(): odd before the reply can arrive. */
	atomic_fetch_add(&c->ctrl_gen, 1);
	rc = send_all(c, req, sizeof(*req), send_fd);
	if (rc == 0)
		rc = recv_all(c, rep, sizeof(*rep), rfds, &nfds);
	atomic_fetch_add(&c->ctrl_gen, 1);
	if (rc < 0)
		return rc;

	if (rep->magic != KVP_CTRL_MAGIC || rep->op != req->op || rep->seq != req->seq) {
		set_error(c, "malformed reply from kvproxyd");
		rc = -EPROTO;
	} else if (rep->err != 0) {
		rep->errmsg[KVP_ERRMSG_MAX - 1] = '\0';
		set_error(c, rep->errmsg[0] ? rep->errmsg : "kvproxyd refused the request");
		/* The protocol says negative errno; do not let a sign slip become success. */
		rc = rep->err < 0 ? rep->err : -rep->err;
	} else if (nfds != want_fds) {
		set_error(c, "reply from kvproxyd carries the wrong number of fds");
		rc = -EPROTO;
	}
	if (rc < 0) {
		close_fds(rfds, nfds);
		return rc;
	}
	if (nfds > 0)
		memcpy(fds, rfds, nfds * sizeof(int));
	return 0;
}

static void
ctrl_init(struct kvp_ctrl_req *req, uint16_t op)
{
	memset(req, 0, sizeof(*req));
	req->op = op;
}

static int
sock_connect(const char *path, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = strlen(path);
	int fd, rc;

	if (n == 0 || n >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, n + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	do {
		rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	} while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	*out = fd;
	return 0;
}

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
		set_error(c, "channel from kvproxyd is smaller than announced");
		close(memfd);
		return -EPROTO;
	}
	mem = mmap(NULL, (size_t)chan_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	rc = mem == MAP_FAILED ? -errno : 0;
	close(memfd);
	if (rc < 0) {
		set_error(c, "cannot map the channel");
		return rc;
	}
	rc = kvp_chan_attach(mem, (size_t)chan_size, false, &c->sq, &c->cq);
	if (rc < 0) {
		set_error(c, rc == -EPROTONOSUPPORT ? "channel ABI version mismatch" :
						      "channel from kvproxyd is malformed");
		munmap(mem, (size_t)chan_size);
		return -EPROTO;
	}
	c->chan = mem;
	c->chan_len = (size_t)chan_size;
	return 0;
}

int
kvp_connect(const char *sock_path, uint32_t sq_entries, uint32_t cq_entries,
	    struct kvp_client **out)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	struct kvp_client *c;
	int fds[HELLO_FDS];
	int rc;

	if (sock_path == NULL || out == NULL)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	c->sock = c->sq_doorbell = c->cq_notify = -1;
	atomic_init(&c->ctrl_gen, 0);

	rc = sock_connect(sock_path, &c->sock);
	if (rc < 0)
		goto err_free;

	ctrl_init(&req, KVP_CTRL_HELLO);
	req.u.hello.sq_entries = sq_entries;
	req.u.hello.cq_entries = cq_entries;
	req.u.hello.pid = (int32_t)getpid();
	rc = ctrl_call(c, &req, -1, &rep, fds, HELLO_FDS);
	if (rc < 0)
		goto err_close_sock;
	c->sq_doorbell = fds[1];
	c->cq_notify = fds[2];
	rc = chan_map(c, fds[0], rep.u.hello.chan_size);
	if (rc < 0)
		goto err_close_fds;

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
		rc = -EPROTO;
		goto err_unmap;
	}
	c->scratch = calloc(1 + (size_t)c->max_segs, sizeof(*c->scratch));
	if (c->scratch == NULL) {
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
	return c->node_id;
}

uint32_t
kvp_max_segments(const struct kvp_client *c)
{
	return c->max_segs;
}

int
kvp_region_register(struct kvp_client *c, int fd, uint64_t fd_offset, uint64_t len, uint32_t flags,
		    uint64_t *key)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int rc;

	if (fd < 0 || len == 0 || key == NULL) {
		set_error(c, "invalid region arguments");
		return -EINVAL;
	}
	ctrl_init(&req, KVP_CTRL_REG);
	req.u.reg.fd_offset = fd_offset;
	req.u.reg.len = len;
	req.u.reg.flags = flags;
	rc = ctrl_call(c, &req, fd, &rep, NULL, 0);
	if (rc < 0)
		return rc;
	*key = rep.u.reg.key;
	return 0;
}

static int
register_gpu(struct kvp_client *c, int fd, const void *ipc, uint64_t offset, uint64_t len,
	     int device, uint32_t flags, uint64_t *key)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int rc;

	if (len == 0 || key == NULL || device < 0) {
		set_error(c, "invalid GPU region arguments");
		return -EINVAL;
	}
	ctrl_init(&req, KVP_CTRL_REG);
	req.u.reg.fd_offset = offset;
	req.u.reg.len = len;
	req.u.reg.flags = flags;
	req.u.reg.device = device;
	if (ipc)
		memcpy(req.u.reg.ipc, ipc, sizeof(req.u.reg.ipc));
	rc = ctrl_call(c, &req, fd, &rep, NULL, 0);
	if (rc < 0)
		return rc;
	*key = rep.u.reg.key;
	return 0;
}

int
kvp_region_register_cuda_ipc(struct kvp_client *c, const void *ipc_handle, uint64_t offset,
			     uint64_t len, int device, uint64_t *key)
{
	if (ipc_handle == NULL) {
		set_error(c, "no IPC handle");
		return -EINVAL;
	}
	return register_gpu(c, -1, ipc_handle, offset, len, device, KVP_REGION_CUDA_IPC, key);
}

int
kvp_region_register_cuda_fd(struct kvp_client *c, int fd, uint64_t len, int device,
			    uint64_t *key)
{
	if (fd < 0) {
		set_error(c, "invalid fd");
		return -EINVAL;
	}
	return register_gpu(c, fd, NULL, 0, len, device, KVP_REGION_CUDA_VMM, key);
}

int
kvp_region_deregister(struct kvp_client *c, uint64_t key)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;

	ctrl_init(&req, KVP_CTRL_DEREG);
	req.u.dereg.key = key;
	return ctrl_call(c, &req, -1, &rep, NULL, 0);
}

int
kvp_peer_lookup(struct kvp_client *c, const char *node_id, uint16_t *peer)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	size_t n;
	int rc;

	if (node_id == NULL || peer == NULL)
		return -EINVAL;
	n = strnlen(node_id, KVP_NODE_ID_MAX);
	if (n == 0 || n >= KVP_NODE_ID_MAX) {
		set_error(c, "node id is empty or too long");
		return -EINVAL;
	}
	ctrl_init(&req, KVP_CTRL_PEER_LOOKUP);
	memcpy(req.u.peer.node_id, node_id, n + 1);
	rc = ctrl_call(c, &req, -1, &rep, NULL, 0);
	if (rc < 0)
		return rc;
	*peer = rep.u.peer.peer;
	return 0;
}

/*
 * Ring the SQ doorbell if the daemon announced it sleeps. A failed write is
 * not reported: the entries are already published, and a daemon that cannot
 * be woken is a dead daemon, which kvp_wait() reports as -EPIPE.
 */
static void
sq_kick(struct kvp_client *c)
{
	uint64_t one = 1;

	if (!kvp_ring_wakeup_needed(&c->sq))
		return;
	while (write(c->sq_doorbell, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

static int
sq_publish(struct kvp_client *c, const void *sqes, uint32_t n)
{
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
	if (x == NULL || segs == NULL || nseg == 0 || nseg > c->max_segs)
		return -EINVAL;

	struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&c->scratch[0];

	memset(h, 0, sizeof(*h));
	h->op = KVP_OP_XFER;
	h->peer = x->peer;
	h->nseg = nseg;
	h->user_id = x->user_id;
	h->timeout_ns = x->timeout_ns;
	h->submit_ns = now_ns();
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
	return sq_publish(c, c->scratch, 1 + nseg);
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
	h->submit_ns = now_ns();
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
	return sq_publish(c, c->scratch, 1 + nseg);
}

int
kvp_cancel(struct kvp_client *c, uint64_t user_id)
{
	struct kvp_sqe_xfer h;

	memset(&h, 0, sizeof(h));
	h.op = KVP_OP_CANCEL;
	h.user_id = user_id;
	h.submit_ns = now_ns();
	return sq_publish(c, &h, 1);
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
	return sq_publish(c, &f, 1);
}

int
kvp_poll(struct kvp_client *c, struct kvp_cqe *out, uint32_t max)
{
	return kvp_ring_dequeue_burst(&c->cq, out, max);
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
	/* Pairs with the increments in ctrl_call(). */
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

int
kvp_wait(struct kvp_client *c, struct kvp_cqe *out, uint32_t max, int timeout_ms)
{
	uint64_t deadline = 0;
	int n;

	if (max == 0)
		return -EINVAL;
	if (timeout_ms > 0)
		deadline = now_ns() + (uint64_t)timeout_ms * NSEC_PER_MSEC;

	for (;;) {
		n = kvp_poll(c, out, max);
		if (n != 0 || timeout_ms == 0)
			return n;

		struct timespec ts, *tsp = NULL;

		if (timeout_ms > 0) {
			uint64_t now = now_ns();

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
				/* Completions posted before the daemon died are still the caller's. */
				n = kvp_poll(c, out, max);
				return n != 0 ? n : err2;
			}
		}
	}
}

uint32_t
kvp_overflow(const struct kvp_client *c)
{
	return atomic_load_explicit(&c->cq.shm->overflow, memory_order_relaxed);
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
