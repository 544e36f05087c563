/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * cores = "auto" | "MAIN,WORKER": where the lcores run, decided before the
 * EAL starts (it pins them). "auto" takes CPUs local to the devices the
 * node moves data through (the RDMA ports' PCI devices, else the network
 * interface of the listen address or of the route to the first peer),
 * within this process's CPU affinity; the worker lcore gets the first such
 * CPU, the main lcore another one if there is one. Explicit EAL lcore
 * arguments (-l, -c, --lcores) win; doctor then warns about lcores that are
 * not device-local.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_ctrl.h"
#include "kvproxyd.h"

char kvp_cores_why[512] = "EAL arguments";
bool kvp_cores_dedicated;
int kvp_cores_ncpus;

/*
 * CPUs this process may use for "auto" to give the worker a core of its own:
 * its own, the main lcore's, and two left for the clients and the kernel's
 * network work. Fewer, and a spinning worker starves what it waits for.
 */
#define DEDICATED_MIN_CPUS 4
static char **args; /* the argv we built, freed at exit */

static void
free_args(void)
{
	free(args);
}

static const char *
conf_path(int argc, char **argv)
{
	int i = 1;

	while (i < argc && strcmp(argv[i], "--") != 0)
		i++;
	for (i++; i < argc; i++) {
		if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--config") == 0) && i + 1 < argc)
			return argv[i + 1];
		if (strncmp(argv[i], "--config=", 9) == 0)
			return argv[i] + 9;
	}
	return NULL;
}

static bool
eal_sets_lcores(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
		if (strcmp(argv[i], "-l") == 0 || strcmp(argv[i], "-c") == 0 ||
		    strncmp(argv[i], "--lcores", 8) == 0 || strncmp(argv[i], "-l", 2) == 0)
			return true;
	return false;
}

/* CPUs local to the devices this node uses; "" if none is known. */
static void
local_cpus(const struct kvp_config *cfg, char *list, size_t len, char *what, size_t wlen)
{
	char ifname[64], path[256];
	struct kvp_topo_dev d;

	list[0] = '\0';
	if (cfg->transport != KVP_TRANSPORT_TCP) {
		char devs[sizeof(cfg->rdma_devices)], *save = NULL;

		snprintf(devs, sizeof(devs), "%s", cfg->rdma_devices[0] ? cfg->rdma_devices : "");
		for (char *t = strtok_r(devs, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
			t[strcspn(t, ":")] = '\0';
			snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/local_cpulist", t);
			FILE *f = fopen(path, "r");
			if (f) {
				if (fgets(list, (int)len, f))
					list[strcspn(list, "\n")] = '\0';
				fclose(f);
				snprintf(what, wlen, "RDMA device %s", t);
				if (list[0])
					return;
			}
		}
	}
	if (kvp_topo_iface_of_addr(cfg->listen_host, ifname, sizeof(ifname)) < 0 &&
	    (cfg->npeers == 0 || kvp_topo_route_iface(cfg->peers[0].host, cfg->peers[0].port,
						      ifname, sizeof(ifname)) < 0)) {
		snprintf(what, wlen, "no network interface found for the listen address or peers");
		return;
	}
	if (kvp_topo_netdev(ifname, &d) < 0 || d.cpulist[0] == '\0') {
		snprintf(what, wlen, "%s has no device-local CPUs (virtual interface)", ifname);
		return;
	}
	snprintf(list, len, "%s", d.cpulist);
	snprintf(what, wlen, "%s (PCI %s)", ifname, d.pci);
}

/* Choose MAIN and WORKER CPUs for "auto". @return 0, or -ENOENT with no usable CPU. */
static int
pick_auto(const struct kvp_config *cfg, unsigned *main_cpu, unsigned *worker_cpu)
{
	char list[256], what[160];
	cpu_set_t set;
	int local[2] = { -1, -1 }, any[2] = { -1, -1 };

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return -errno;
	kvp_cores_ncpus = CPU_COUNT(&set);
	kvp_cores_dedicated = kvp_cores_ncpus >= DEDICATED_MIN_CPUS;
	local_cpus(cfg, list, sizeof(list), what, sizeof(what));
	for (unsigned c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, &set))
			continue;
		int *slot = list[0] && kvp_topo_cpulist_has(list, c) ? local : any;
		if (slot[0] < 0)
			slot[0] = (int)c;
		else if (slot[1] < 0)
			slot[1] = (int)c;
	}
	if (local[0] >= 0) {
		*worker_cpu = (unsigned)local[0];
		*main_cpu = (unsigned)(local[1] >= 0 ? local[1] : any[0] >= 0 ? any[0] : local[0]);
		snprintf(kvp_cores_why, sizeof(kvp_cores_why),
			 "auto: worker on CPU %u, main on CPU %u; local to %s: %s", *worker_cpu,
			 *main_cpu, what, list);
		return 0;
	}
	if (any[0] < 0)
		return -ENOENT;
	*worker_cpu = (unsigned)any[0];
	*main_cpu = (unsigned)(any[1] >= 0 ? any[1] : any[0]);
	snprintf(kvp_cores_why, sizeof(kvp_cores_why),
		 "auto: worker on CPU %u, main on CPU %u; no device-local CPU allowed (%s%s%s)",
		 *worker_cpu, *main_cpu, what, list[0] ? ", local: " : "", list);
	return 0;
}

char **
kvp_cores_eal_args(int *argc, char **argv)
{
	static char opt[] = "--lcores";
	static char map[64];
	struct kvp_config cfg;
	char err[512];
	unsigned m, w;
	const char *conf = conf_path(*argc, argv);

	if (!conf || eal_sets_lcores(*argc, argv))
		return argv;
	/* Errors are reported again, properly, once the EAL is up. */
	if (kvp_config_load(conf, &cfg, err, sizeof(err)) < 0 || cfg.cores[0] == '\0')
		return argv;
	if (strcmp(cfg.cores, "auto") == 0) {
		if (pick_auto(&cfg, &m, &w) < 0)
			return argv;
	} else {
		if (sscanf(cfg.cores, "%u,%u", &m, &w) != 2)
			return argv;
		snprintf(kvp_cores_why, sizeof(kvp_cores_why),
			 "configured: worker on CPU %u, main on CPU %u", w, m);
	}
	char **v = calloc((size_t)*argc + 3, sizeof(*v));
	if (!v)
		return argv;
	args = v;
	atexit(free_args);
	snprintf(map, sizeof(map), "0@%u,1@%u", m, w);
	v[0] = argv[0];
	v[1] = opt;
	v[2] = map;
	memcpy(&v[3], &argv[1], sizeof(*v) * (size_t)(*argc - 1));
	*argc += 2;
	return v;
}
