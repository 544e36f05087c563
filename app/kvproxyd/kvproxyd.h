/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyd internals shared between main.c and worker_loop.c. */
#ifndef KVPROXYD_H
#define KVPROXYD_H

/** Worker lcore entry point (rte_eal_remote_launch); arg is a struct kvp_worker. */
int kvp_worker_loop(void *arg);

#endif /* KVPROXYD_H */
