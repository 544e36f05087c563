/* SPDX-License-Identifier: BSD-3-Clause */
/* For tests and fuzzers that run a worker or a node in-process: the EAL, a stub transport. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_log.h>

#include "kvp_test_core.h"

static bool eal_done;

int
kvp_test_eal_init(void)
{
	char *argv[] = {
		"kvp-test", "--no-huge",      "--no-shconf", "-m", "128",
		"--no-pci", "--no-telemetry", "-l",          "0",  "--log-level=*:error",
		NULL,
	};
	int argc = (int)(sizeof(argv) / sizeof(argv[0])) - 1;

	if (eal_done)
		return 0;
	/* Nothing under test may ever block on a terminal. */
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, 0);
		close(null);
	}
	if (rte_eal_init(argc, argv) < 0)
		return -rte_errno;
	kvp_log_init();
	/* Format every kvp.* log line (format bugs are bugs) but print none. */
	FILE *devnull = fopen("/dev/null", "w");
	if (devnull)
		rte_openlog_stream(devnull);
	rte_log_set_level_pattern("kvp.*", RTE_LOG_DEBUG);
	eal_done = true;
	return 0;
}

/* ---- the stub transport: its context is the worker itself ---- */

static int
stub_create(struct kvp_worker *wk, unsigned idx, void **tctx)
{
	(void)idx;
	*tctx = wk;
	return 0;
}

static void
stub_destroy(void *tctx)
{
	(void)tctx;
}

static int
stub_attach(void *tctx, uint16_t peer, uint8_t link, int fd, bool outgoing, uint64_t epoch)
{
	(void)tctx;
	(void)peer;
	(void)link;
	(void)fd;
	(void)outgoing;
	(void)epoch;
	return -EINVAL;
}

static int
stub_post(void *tctx, struct kvp_xfer *x)
{
	(void)tctx;
	(void)x;
	return -ENOTCONN;
}

static int
stub_progress(void *tctx)
{
	(void)tctx;
	return 0;
}

static void
stub_cancel(void *tctx, struct kvp_xfer *x, int status)
{
	kvp_worker_xfer_end(tctx, x, status);
}

static int
stub_sleep_fd(void *tctx)
{
	(void)tctx;
	return -1;
}

static void
stub_disconnect(void *tctx, uint16_t peer)
{
	(void)tctx;
	(void)peer;
}

const struct kvp_transport_ops kvp_test_stub_ops = {
	.name = "tcp",
	.caps = KVP_TCAP_HOST_MEM,
	.create = stub_create,
	.destroy = stub_destroy,
	.attach = stub_attach,
	.post = stub_post,
	.progress = stub_progress,
	.cancel = stub_cancel,
	.sleep_fd = stub_sleep_fd,
	.disconnect = stub_disconnect,
};
