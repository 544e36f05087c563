/* SPDX-License-Identifier: BSD-3-Clause */
/* File descriptors over UNIX sockets (SCM_RIGHTS), for clients written by hand. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvp_test.h"

union fd_cmsg {
	struct cmsghdr h;
	char buf[CMSG_SPACE(sizeof(int) * KVP_TEST_FDS_MAX)];
};

long
kvp_test_send_fds(int sock, const void *buf, size_t n, const int *fds, unsigned nfds, int flags)
{
	union fd_cmsg u;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = n };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (nfds > KVP_TEST_FDS_MAX) {
		errno = EINVAL;
		return -1;
	}
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
	return (long)sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
}

long
kvp_test_recv_fds(int sock, void *buf, size_t n, int *fds, unsigned *nfds, unsigned max, int flags)
{
	union fd_cmsg u;
	struct iovec iov = { .iov_base = buf, .iov_len = n };
	struct msghdr msg = { .msg_iov = &iov,
			      .msg_iovlen = 1,
			      .msg_control = u.buf,
			      .msg_controllen = sizeof(u.buf) };
	ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);

	if (r < 0)
		return -1;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		unsigned k = (unsigned)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));

		for (unsigned i = 0; i < k; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (nfds && *nfds < max)
				fds[(*nfds)++] = fd;
			else
				close(fd);
		}
	}
	return (long)r;
}
