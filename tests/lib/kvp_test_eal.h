/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_test_eal: DPDK for tests that run kvproxyd's code in-process (a
 * worker, a node): the one part of the test-helper library that needs DPDK
 * (libkvp_test_eal). Call from the main thread, before anything allocates
 * with rte_malloc.
 */
#ifndef KVP_TEST_EAL_H
#define KVP_TEST_EAL_H

#include <stdbool.h>

/**
 * Initialise the EAL once per process: no hugepages, no PCI, no telemetry,
 * one lcore (0), stdin from /dev/null, and every kvp.* log type at debug
 * level into /dev/null (every line is formatted, none printed).
 * @return 0 (also when already done), or the EAL's negative errno
 */
int kvp_test_eal_init(void);

#endif /* KVP_TEST_EAL_H */
