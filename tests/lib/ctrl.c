/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The client protocol spoken by hand from kvp_rings.h: fixed 256-byte
 * control requests and replies on a UNIX stream socket, descriptors by
 * SCM_RIGHTS, and transfers on the SQ. For clients that must not be
 * libkvproxy (rogue clients, fuzz harnesses that play both ends on one
 * thread, the worker's unit test).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvp_test.h"

/* Rounds of pump-then-read before a harness's reply counts as lost. */
#define PUMP_ROUNDS 100

int
kvp_test_ctrl_call(struct kvp_test_conn *c, struct kvp_ctrl_req *req, int send_fd,
		   struct kvp_ctrl_rep *rep, int *fds, unsigned want)
{
	size_t got = 0;
	unsigned nfds = 0;
	int rounds = 0, rc;

	req->magic = KVP_CTRL_MAGIC;
	req->abi_version = KVP_ABI_VERSION;
	req->seq = ++c->seq;
	memset(rep, 0, sizeof(*rep));
	if (kvp_test_send_fds(c->sock, req, sizeof(*req), &send_fd, send_fd >= 0 ? 1 : 0, 0) !=
	    (long)sizeof(*req))
		return -EPIPE;
	while (got < sizeof(*rep)) {
		if (c->pump) {
			rc = -ETIMEDOUT;
			if (rounds++ == PUMP_ROUNDS)
				goto err_close_fds;
			c->pump(c->pump_arg);
		}
		long r = kvp_test_recv_fds(c->sock, (uint8_t *)rep + got, sizeof(*rep) - got, fds,
					   &nfds, want, c->pump ? MSG_DONTWAIT : 0);

		if (r < 0 && (errno == EINTR || (c->pump && errno == EAGAIN)))
			continue;
		rc = -EPIPE;
		if (r <= 0)
			goto err_close_fds;
		got += (size_t)r;
	}
	rep->errmsg[KVP_ERRMSG_MAX - 1] = '\0';
	rc = -EPROTO;
	if (rep->magic != KVP_CTRL_MAGIC || rep->seq != req->seq)
		goto err_close_fds;
	rc = rep->err;
	if (rc == 0 && nfds != want)
		rc = -EPROTO;
	if (rc < 0)
		goto err_close_fds;
	return 0;

err_close_fds:
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	return rc;
}

int
kvp_test_conn_open(struct kvp_test_conn *c, const char *path, void (*pump)(void *arg), void *arg,
		   struct kvp_ctrl_rep *rep)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep own;
	int fds[3], rc;

	memset(c, 0, sizeof(*c));
	c->sock = c->doorbell = c->notify = -1;
	c->pump = pump;
	c->pump_arg = arg;
	if (!rep)
		rep = &own;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->sock < 0 || connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto err_errno;
	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_HELLO;
	req.u.hello.pid = (int32_t)getpid();
	rc = kvp_test_ctrl_call(c, &req, -1, rep, fds, 3);
	if (rc < 0)
		goto err_close;
	c->id = rep->u.hello.client_id;
	c->max_segs = rep->u.hello.max_segs;
	c->doorbell = fds[1];
	c->notify = fds[2];
	c->chan_len = rep->u.hello.chan_size;
	c->chan = mmap(NULL, c->chan_len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	close(fds[0]);
	if (c->chan == MAP_FAILED) {
		c->chan = NULL;
		goto err_errno;
	}
	c->hdr = c->chan;
	rc = kvp_chan_attach(c->chan, c->chan_len, false, &c->sq, &c->cq);
	if (rc < 0)
		goto err_close;
	return 0;

err_errno:
	rc = -errno;
err_close:
	kvp_test_conn_close(c);
	return rc;
}

void
kvp_test_conn_close(struct kvp_test_conn *c)
{
	if (c->chan)
		munmap(c->chan, c->chan_len);
	c->chan = NULL;
	c->hdr = NULL;
	if (c->sock >= 0)
		close(c->sock);
	if (c->doorbell >= 0)
		close(c->doorbell);
	if (c->notify >= 0)
		close(c->notify);
	c->sock = c->doorbell = c->notify = -1;
}

int
kvp_test_region_register(struct kvp_test_conn *c, int fd, uint64_t len, uint32_t flags,
			 uint64_t *key, struct kvp_ctrl_rep *rep)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep own;
	int rc;

	if (!rep)
		rep = &own;
	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_REG;
	req.u.reg.len = len;
	req.u.reg.flags = flags;
	rc = kvp_test_ctrl_call(c, &req, fd, rep, NULL, 0);
	if (rc == 0)
		*key = rep->u.reg.key;
	return rc;
}

int
kvp_test_peer_lookup(struct kvp_test_conn *c, const char *node_id, uint16_t *peer)
{
	struct kvp_ctrl_req req;
	struct kvp_ctrl_rep rep;
	int rc;

	memset(&req, 0, sizeof(req));
	req.op = KVP_CTRL_PEER_LOOKUP;
	snprintf(req.u.peer.node_id, sizeof(req.u.peer.node_id), "%s", node_id);
	rc = kvp_test_ctrl_call(c, &req, -1, &rep, NULL, 0);
	if (rc == 0)
		*peer = rep.u.peer.peer;
	return rc;
}

void
kvp_test_doorbell(struct kvp_test_conn *c)
{
	uint64_t one = 1;

	if (write(c->doorbell, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is saturated; the daemon wakes anyway. */
	}
}

int
kvp_test_submit(struct kvp_ring *sq, const struct kvp_test_xfer *x)
{
	struct kvp_sqe_seg e[2];
	struct kvp_sqe_xfer *h = (struct kvp_sqe_xfer *)&e[0];

	memset(e, 0, sizeof(e));
	h->op = KVP_OP_XFER;
	h->peer = x->peer;
	h->nseg = 1;
	h->user_id = x->user_id;
	h->submit_ns = x->submit_ns;
	h->timeout_ns = x->timeout_ns;
	e[1].op = KVP_OP_SEG;
	e[1].src_key = x->src_key;
	e[1].src_off = x->src_off;
	e[1].dst_key = x->dst_key;
	e[1].dst_off = x->dst_off;
	e[1].len = x->len;
	return kvp_ring_enqueue_bulk(sq, e, 2);
}
