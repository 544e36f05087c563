/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libkvproxy's public calls without a kvproxyd:
 *  - every call given a NULL client (or a NULL pointer it needs) returns
 *    -EINVAL instead of crashing, and the accessors return "" / 0;
 *  - kvp_connect_ex() is bounded: against a listener that never answers
 *    (a daemon stopped after listen()) and against one whose backlog is full,
 *    it returns -ETIMEDOUT within its timeout;
 *  - a daemon's refusal (a HELLO reply with an error, then close) reaches
 *    the caller as the errno and the daemon's own text, even when the HELLO
 *    could not be sent any more.
 * The fake daemons are sockets of this process (and one child for the
 * refusal), so the test needs no root and no EAL.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvp_test.h"
#include "kvproxy.h"

static char dir[] = "/tmp/kvp-test-client-XXXXXX";

static int
listener(const char *path, int backlog)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, backlog) < 0) {
		perror("listener");
		exit(99);
	}
	return fd;
}

static void
null_arguments(void)
{
	struct kvp_xfer_desc x = { 0 };
	struct kvp_segment s = { 0 };
	struct kvp_cqe cqe;
	struct kvp_client *c = NULL;
	uint64_t key;
	uint16_t peer;
	char err[64];
	uint8_t ipc[64] = { 0 };

	CHECK_EQ(kvp_connect(NULL, 0, 0, &c), -EINVAL);
	CHECK_EQ(kvp_connect("/nonexistent", 0, 0, NULL), -EINVAL);
	CHECK_EQ(kvp_connect_ex(NULL, NULL, &c, err, sizeof(err)), -EINVAL);
	CHECK_EQ(kvp_connect_ex("/x", NULL, NULL, NULL, 0), -EINVAL);
	struct kvp_connect_opts bad = { .rsvd = { 1 } }, bad2 = { .timeout_ms = -2 };
	CHECK_EQ(kvp_connect_ex("/x", &bad, &c, err, sizeof(err)), -EINVAL);
	CHECK_EQ(kvp_connect_ex("/x", &bad2, &c, err, sizeof(err)), -EINVAL);
	CHECK_EQ(kvp_set_ctrl_timeout(NULL, 100), -EINVAL);
	CHECK_EQ(kvp_set_wait_spin(NULL, KVP_WAIT_SPIN_AUTO), -EINVAL);
	kvp_close(NULL);
	CHECK(strcmp(kvp_last_error(NULL), "no client") == 0);
	CHECK(strcmp(kvp_node_id(NULL), "") == 0);
	CHECK_EQ(kvp_max_segments(NULL), 0);
	CHECK_EQ(kvp_overflow(NULL), 0);
	CHECK_EQ(kvp_region_register(NULL, 0, 0, 4096, KVP_REGION_HOST, &key), -EINVAL);
	CHECK_EQ(kvp_region_register_cuda_ipc(NULL, ipc, 0, 4096, 0, &key), -EINVAL);
	CHECK_EQ(kvp_region_register_cuda_fd(NULL, 0, 4096, 0, &key), -EINVAL);
	CHECK_EQ(kvp_region_deregister(NULL, 1), -EINVAL);
	CHECK_EQ(kvp_peer_lookup(NULL, "x", &peer), -EINVAL);
	CHECK_EQ(kvp_submit(NULL, &x, &s, 1), -EINVAL);
	CHECK_EQ(kvp_cancel(NULL, 1), -EINVAL);
	CHECK_EQ(kvp_poll(NULL, &cqe, 1), -EINVAL);
	CHECK_EQ(kvp_wait(NULL, &cqe, 1, 0), -EINVAL);
	CHECK_EQ(kvp_host_alloc(4096, NULL, NULL), -EINVAL);
	kvp_host_free(-1, NULL, 0);
}

static void
no_daemon(void)
{
	struct kvp_client *c = NULL;
	char err[KVP_ERRMSG_MAX], path[96];

	snprintf(path, sizeof(path), "%s/none.sock", dir);
	CHECK_EQ(kvp_connect_ex(path, NULL, &c, err, sizeof(err)), -ENOENT);
	CHECK(strstr(err, "none.sock") != NULL);
	CHECK(c == NULL);
}

/* A listener that accepts (in the kernel's backlog) but never answers. */
static void
silent_daemon(void)
{
	struct kvp_connect_opts o = { .timeout_ms = 300 };
	struct kvp_client *c = NULL;
	char err[KVP_ERRMSG_MAX], path[96];
	uint64_t t0;
	int l, rc;

	snprintf(path, sizeof(path), "%s/silent.sock", dir);
	l = listener(path, 16);
	t0 = kvp_test_now_ms();
	rc = kvp_connect_ex(path, &o, &c, err, sizeof(err));
	long ms = (long)(kvp_test_now_ms() - t0);

	CHECK_EQ(rc, -ETIMEDOUT);
	CHECK(ms >= 250 && ms < 1500);
	CHECK(strstr(err, "did not answer") != NULL);
	printf("silent daemon: -ETIMEDOUT after %ld ms (%s)\n", ms, err);
	close(l);
	unlink(path);
}

/* A listener whose backlog is full: connect() itself would wait forever. */
static void
full_backlog(void)
{
	struct kvp_connect_opts o = { .timeout_ms = 300 };
	struct kvp_client *c = NULL;
	char err[KVP_ERRMSG_MAX], path[96];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uint64_t t0;
	int l, fill[8], nfill = 0, rc;

	snprintf(path, sizeof(path), "%s/full.sock", dir);
	l = listener(path, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	/* Fill the backlog with non-blocking connects until one would wait. */
	for (; nfill < 8; nfill++) {
		fill[nfill] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (connect(fill[nfill], (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			close(fill[nfill]);
			break;
		}
	}
	CHECK(nfill < 8);
	t0 = kvp_test_now_ms();
	rc = kvp_connect_ex(path, &o, &c, err, sizeof(err));
	long ms = (long)(kvp_test_now_ms() - t0);

	CHECK_EQ(rc, -ETIMEDOUT);
	CHECK(ms >= 250 && ms < 1500);
	printf("full backlog: -ETIMEDOUT after %ld ms (%s)\n", ms, err);
	for (int i = 0; i < nfill; i++)
		close(fill[i]);
	close(l);
	unlink(path);
}

/*
 * A daemon that refuses: after reading our HELLO, or at accept time without
 * reading it, as kvproxyd does (our HELLO may then meet a closed socket:
 * the reply waiting in ours is read all the same).
 */
static void
refusing_daemon(bool before_hello)
{
	struct kvp_client *c = NULL;
	char err[KVP_ERRMSG_MAX], path[96];
	int l, rc, st;
	pid_t pid;

	snprintf(path, sizeof(path), "%s/refuse%d.sock", dir, before_hello);
	l = listener(path, 4);
	pid = fork();
	if (pid == 0) {
		struct kvp_ctrl_rep rep;
		struct kvp_ctrl_req req;
		int fd = accept(l, NULL, NULL);

		if (!before_hello && recv(fd, &req, sizeof(req), MSG_WAITALL) != sizeof(req))
			_exit(1);
		memset(&rep, 0, sizeof(rep));
		rep.magic = KVP_CTRL_MAGIC;
		rep.op = KVP_CTRL_HELLO;
		rep.err = -EUSERS;
		rep.seq = 1;
		snprintf(rep.errmsg, sizeof(rep.errmsg), "kvproxyd test0 serves at most 1 clients");
		if (send(fd, &rep, sizeof(rep), MSG_NOSIGNAL) != sizeof(rep))
			_exit(1);
		close(fd);
		_exit(0);
	}
	rc = kvp_connect_ex(path, NULL, &c, err, sizeof(err));
	CHECK_EQ(rc, -EUSERS);
	CHECK(strcmp(err, "kvproxyd test0 serves at most 1 clients") == 0);
	printf("refusal (%s HELLO): %d '%s'\n", before_hello ? "before" : "after", rc, err);
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(l);
	unlink(path);
}

int
main(void)
{
	signal(SIGPIPE, SIG_IGN);
	if (!mkdtemp(dir))
		return 99;
	null_arguments();
	no_daemon();
	silent_daemon();
	full_backlog();
	refusing_daemon(false);
	refusing_daemon(true);
	rmdir(dir);
	return kvp_test_result("test_client_api");
}
