/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyd internals shared between main.c and worker_loop.c. */
#ifndef KVPROXYD_H
#define KVPROXYD_H

/** Why the lcores run where they do ("auto: ...", "configured: ...", "EAL arguments"). */
extern char kvp_cores_why[512];

/**
 * Before rte_eal_init(): with cores = "auto" or "MAIN,WORKER" in the
 * configuration and no lcore arguments of the EAL's own, prepend
 * "--lcores 0@MAIN,1@WORKER[,2@WORKER...]" (workers = N with "auto").
 * @return argv, or a new array (freed at exit)
 */
char **kvp_cores_eal_args(int *argc, char **argv);

/** Worker lcore entry point (rte_eal_remote_launch); arg is a struct kvp_worker. */
int kvp_worker_loop(void *arg);

#endif /* KVPROXYD_H */
