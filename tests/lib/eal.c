/* SPDX-License-Identifier: BSD-3-Clause */
/* The DPDK EAL for tests and fuzzers that run a worker or a node in-process. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_log.h>

#include "kvp_test_eal.h"

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
	/*
	 * Format every kvp.* log line (format bugs are bugs) but print none:
	 * the level pattern is saved, so types registered later pick it too.
	 */
	FILE *devnull = fopen("/dev/null", "w");
	if (devnull)
		rte_openlog_stream(devnull);
	rte_log_set_level_pattern("kvp.*", RTE_LOG_DEBUG);
	eal_done = true;
	return 0;
}
