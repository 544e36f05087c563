/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_test_core: for tests and fuzzers that run kvproxyd's code in-process
 * (a worker, a node): the DPDK EAL and a transport that moves nothing. The
 * part of the test-helper library that needs DPDK and lib/core
 * (libkvp_test_core). Call from the main thread, before anything
 * allocates with rte_malloc.
 */
#ifndef KVP_TEST_CORE_H
#define KVP_TEST_CORE_H

#include "kvp_transport.h"

/**
 * Initialise the EAL once per process: no hugepages, no PCI, no telemetry,
 * one lcore (0), stdin from /dev/null; then kvproxyd's log types, every
 * one at debug level into /dev/null (each line is formatted, none printed).
 * @return 0 (also when already done), or the EAL's negative errno
 */
int kvp_test_eal_init(void);

/**
 * A transport that moves nothing, named "tcp" as a real node reports: its
 * context is the worker; attach refuses the connection, post answers
 * -ENOTCONN, cancel ends the transfer at once (kvp_worker_xfer_end()), the
 * other ops do nothing. A test that exercises an op copies this table and
 * replaces that op.
 */
extern const struct kvp_transport_ops kvp_test_stub_ops;

#endif /* KVP_TEST_CORE_H */
