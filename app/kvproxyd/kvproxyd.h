/* SPDX-License-Identifier: BSD-3-Clause */
/* kvproxyd internals shared between main.c and worker_loop.c. */
#ifndef KVPROXYD_H
#define KVPROXYD_H

#include <stdbool.h>

/** Why the lcores run where they do ("auto: ...", "configured: ...", "EAL arguments"). */
extern char kvp_cores_why[512];
/** cores = "auto" found cores to spare: the workers may poll without sleeping (poll.busy). */
extern bool kvp_cores_dedicated;
/** CPUs "auto" wanted for that: the workers' count + 3 (0: not looked). */
extern int kvp_cores_dedicated_min;
/** CPUs in the process's affinity, as cores = "auto" found them (0: not looked). */
extern int kvp_cores_ncpus;

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
