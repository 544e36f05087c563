/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libkvproxy: the control socket. Control calls are one fixed-size request
 * and one fixed-size reply on the UNIX socket (fds ride along with
 * SCM_RIGHTS). Every wait here is a poll() against a deadline (the connect
 * timeout for HELLO, the control timeout afterwards); a hang-up is the
 * daemon's death, sticky in c->gone.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_priv.h"

void
client_set_error(struct kvp_client *c, const char *msg)
{
	size_t n = 0;

	/* Copied by hand: msg may be a short literal or the daemon's bounded errmsg. */
	while (n < sizeof(c->errmsg) - 1 && msg[n] != '\0') {
		c->errmsg[n] = msg[n];
		n++;
	}
	c->errmsg[n] = '\0';
}

uint64_t
client_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t
client_deadline(int timeout_ms)
{
	return timeout_ms < 0 ? NO_DEADLINE :
				client_now_ns() + (uint64_t)timeout_ms * NSEC_PER_MSEC;
}

/* Milliseconds until @p deadline for poll(), rounded up; -1 for none; 0 once passed. */
static int
ms_left(uint64_t deadline)
{
	uint64_t now;

	if (deadline == NO_DEADLINE)
		return -1;
	now = client_now_ns();
	if (now >= deadline)
		return 0;
	uint64_t ms = (deadline - now + NSEC_PER_MSEC - 1) / NSEC_PER_MSEC;

	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

void
client_mark_gone(struct kvp_client *c)
{
	atomic_store_explicit(&c->gone, true, memory_order_relaxed);
}

/*
 * Wait until the socket is ready for @p events or the deadline passes.
 * @return 0 ready (or hung up: the next send/recv says so); -ETIMEDOUT; -errno
 */
static int
wait_sock(struct kvp_client *c, short events, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = c->sock, .events = events };
		int ms = ms_left(deadline);
		int rc = poll(&p, 1, ms);

		if (rc > 0)
			return 0;
		if (rc == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

/*
 * Data-path liveness: has the daemon hung up? One poll() of the socket at
 * most every KVP_GONE_CHECK_US per calling thread (@p last is that thread's
 * stamp), so the submit and completion paths stay free of system calls.
 */
bool
client_gone_check(struct kvp_client *c, uint64_t *last, uint64_t now)
{
	if (atomic_load_explicit(&c->gone, memory_order_relaxed))
		return true;
	if (now - *last < GONE_CHECK_NS)
		return false;
	*last = now;

	/* No events asked for: POLLHUP and POLLERR are reported anyway. */
	struct pollfd p = { .fd = c->sock, .events = 0 };

	if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) {
		client_mark_gone(c);
		return true;
	}
	return false;
}

void
client_close_fds(int *fds, unsigned int n)
{
	for (unsigned int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static int
send_all(struct kvp_client *c, const void *buf, size_t len, int fd, uint64_t deadline)
{
	const uint8_t *p = buf;
	size_t total = len;
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
		ssize_t n = sendmsg(c->sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				int rc = wait_sock(c, POLLOUT, deadline);

				if (rc == -ETIMEDOUT) {
					client_set_error(
						c, "kvproxyd did not take the request within the "
						   "timeout (daemon stopped or stuck?)");
					/* Half a request on the socket: nothing after it parses. */
					c->ctrl_broken = len != total;
					return rc;
				}
				if (rc < 0) {
					client_set_error(c, "waiting to send to kvproxyd failed");
					return rc;
				}
				continue;
			}
			if (errno == EPIPE || errno == ECONNRESET) {
				client_mark_gone(c);
				client_set_error(c, "kvproxyd closed the connection");
				return -EPIPE;
			}
			client_set_error(c, "sending to kvproxyd failed");
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
recv_all(struct kvp_client *c, void *buf, size_t len, int *fds, unsigned int *nfds,
	 uint64_t deadline)
{
	uint8_t *p = buf;
	size_t total = len;
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
		ssize_t n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			int err = errno == ECONNRESET ? EPIPE : errno;

			if (err == EAGAIN || err == EWOULDBLOCK) {
				err = -wait_sock(c, POLLIN, deadline);
				if (err == 0)
					continue;
				if (err == ETIMEDOUT) {
					client_set_error(
						c, "kvproxyd did not answer within the timeout "
						   "(daemon stopped or stuck?)");
					/* Half a reply read: the next one would start mid-message. */
					c->ctrl_broken = len != total;
				} else {
					client_set_error(c, "waiting for kvproxyd failed");
				}
			} else {
				if (err == EPIPE)
					client_mark_gone(c);
				client_set_error(c, "receiving from kvproxyd failed");
			}
			client_close_fds(fds, *nfds);
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
			client_mark_gone(c);
			client_set_error(c, "kvproxyd closed the connection");
			client_close_fds(fds, *nfds);
			*nfds = 0;
			return -EPIPE;
		}
		p += n;
		len -= (size_t)n;
	}
	if (extra) {
		client_set_error(c, "kvproxyd sent more fds than the protocol allows");
		client_close_fds(fds, *nfds);
		*nfds = 0;
		return -EPROTO;
	}
	return 0;
}

/*
 * One request/reply exchange. On success with @p want_fds > 0, exactly that
 * many fds are returned in @p fds; in every other case none are left open.
 */
int
client_ctrl_call_until(struct kvp_client *c, struct kvp_ctrl_req *req, int send_fd,
		       struct kvp_ctrl_rep *rep, int *fds, unsigned int want_fds, uint64_t deadline)
{
	int rfds[CTRL_FDS_MAX];
	unsigned int nfds = 0;
	int rc;

	if (atomic_load_explicit(&c->gone, memory_order_relaxed)) {
		client_set_error(c, "kvproxyd closed the connection");
		return -EPIPE;
	}
	if (c->ctrl_broken) {
		client_set_error(c, "the control connection is out of step after a timed-out call; "
				    "close the client and connect again");
		return -EPROTO;
	}
	req->magic = KVP_CTRL_MAGIC;
	req->abi_version = KVP_ABI_VERSION;
	req->seq = ++c->seq;
	/* Pairs with the loads in check_sock(): odd before the reply can arrive. */
	atomic_fetch_add(&c->ctrl_gen, 1);
	rc = send_all(c, req, sizeof(*req), send_fd, deadline);
	if (rc == -EPIPE && req->op == KVP_CTRL_HELLO) {
		/* A daemon that refuses a connection answers and closes: read why. */
		if (recv_all(c, rep, sizeof(*rep), rfds, &nfds, client_now_ns()) == 0 &&
		    rep->magic == KVP_CTRL_MAGIC && rep->op == req->op && rep->err != 0) {
			rc = 0;
		} else {
			client_close_fds(rfds, nfds);
			nfds = 0;
			client_set_error(c, "kvproxyd closed the connection");
		}
	} else {
		while (rc == 0) {
			rc = recv_all(c, rep, sizeof(*rep), rfds, &nfds, deadline);
			/* The late reply of a call that timed out before: not ours. */
			if (rc == 0 && rep->magic == KVP_CTRL_MAGIC && rep->seq < req->seq &&
			    req->op != KVP_CTRL_HELLO) {
				client_close_fds(rfds, nfds);
				nfds = 0;
				continue;
			}
			break;
		}
	}
	atomic_fetch_add(&c->ctrl_gen, 1);
	if (rc < 0)
		return rc;

	/* A refusal sent before the daemon read our HELLO cannot know its seq. */
	if (req->op == KVP_CTRL_HELLO && rep->magic == KVP_CTRL_MAGIC && rep->op == req->op &&
	    rep->err != 0)
		rep->seq = req->seq;
	if (rep->magic != KVP_CTRL_MAGIC || rep->op != req->op || rep->seq != req->seq) {
		client_set_error(c, "malformed reply from kvproxyd");
		rc = -EPROTO;
	} else if (rep->err != 0) {
		rep->errmsg[KVP_ERRMSG_MAX - 1] = '\0';
		client_set_error(c, rep->errmsg[0] ? rep->errmsg : "kvproxyd refused the request");
		/* The protocol says negative errno; do not let a sign slip become success. */
		rc = rep->err < 0 ? rep->err : -rep->err;
	} else if (nfds != want_fds) {
		client_set_error(c, "reply from kvproxyd carries the wrong number of fds");
		rc = -EPROTO;
	}
	if (rc < 0) {
		client_close_fds(rfds, nfds);
		return rc;
	}
	if (nfds > 0)
		memcpy(fds, rfds, nfds * sizeof(int));
	return 0;
}

/* A control call after kvp_connect(), bounded by the client's control timeout. */
int
client_ctrl_call(struct kvp_client *c, struct kvp_ctrl_req *req, int send_fd,
		 struct kvp_ctrl_rep *rep, int *fds, unsigned int want_fds)
{
	return client_ctrl_call_until(c, req, send_fd, rep, fds, want_fds,
				      client_deadline(c->ctrl_timeout_ms));
}

void
client_ctrl_init(struct kvp_ctrl_req *req, uint16_t op)
{
	memset(req, 0, sizeof(*req));
	req->op = op;
}

/*
 * Connect within @p deadline. A UNIX connect() waits while the listener's
 * backlog is full (a stopped daemon), bounded by SO_SNDTIMEO, after which it
 * fails with EAGAIN.
 */
int
client_sock_connect(const char *path, int *out, uint64_t deadline)
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
	for (;;) {
		int ms = ms_left(deadline);

		if (ms == 0) {
			rc = -ETIMEDOUT;
			break;
		}
		/* 0 means no bound to SO_SNDTIMEO, as -1 does to us. */
		struct timeval tv = { .tv_sec = ms < 0 ? 0 : ms / 1000,
				      .tv_usec = ms < 0 ? 0 : (ms % 1000) * 1000 };

		if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
			rc = -errno;
			break;
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			rc = 0;
			break;
		}
		if (errno != EINTR) {
			/* EAGAIN: the backlog stayed full until SO_SNDTIMEO ran out. */
			rc = errno == EAGAIN ? -ETIMEDOUT : -errno;
			break;
		}
	}
	if (rc == 0) {
		/* Later sends wait through poll() against their own deadlines. */
		struct timeval none = { 0 };

		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
		*out = fd;
		return 0;
	}
	close(fd);
	return rc;
}
