/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * cores = "auto" | "MAIN,WORKER": where the lcores run, decided before the
 * EAL starts (it pins them). "auto" takes CPUs local to the devices the
 * node moves data through (the RDMA ports' PCI devices, else the network
 * interface of the listen address or of the route to the first peer),
 * within this process's CPU affinity; the worker lcores (workers = N, 1 by
 * default) get the first such CPUs, one each, then other allowed CPUs;
 * the main lcore the next one if there is one. Explicit EAL lcore
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
int kvp_cores_dedicated_min;

/*
 * CPUs beyond the workers' that "auto" needs before a worker counts as
 * having a core of its own: the main lcore's, and two left for the clients
 * and the kernel's network work. Fewer, and a spinning worker starves what
 * it waits for. With one worker that is 4 CPUs (#17's rule); each further
 * worker needs one more, or N spinning workers would share the spare CPUs.
 */
#define DEDICATED_SPARE_CPUS 3
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

/* "0,1,2" for @p n CPUs. */
static void
cpu_list(const unsigned *cpus, unsigned n, char *out, size_t len)
{
	size_t off = 0;

	out[0] = '\0';
	for (unsigned i = 0; i < n && off < len; i++)
		off += (size_t)snprintf(out + off, len - off, "%s%u", i ? "," : "", cpus[i]);
}

/*
 * Choose the MAIN CPU and @p nw WORKER CPUs for "auto": device-local CPUs
 * first, then the other allowed ones, one CPU each while they last (then
 * the workers share them, in turn). @return 0, or -ENOENT with no usable CPU.
 */
static int
pick_auto(const struct kvp_config *cfg, unsigned nw, unsigned *main_cpu, unsigned *workers)
{
	char list[256], what[160], wl[256];
	static unsigned order[CPU_SETSIZE];
	unsigned n = 0, nlocal = 0;
	cpu_set_t set;

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return -errno;
	kvp_cores_ncpus = CPU_COUNT(&set);
	kvp_cores_dedicated_min = (int)nw + DEDICATED_SPARE_CPUS;
	kvp_cores_dedicated = kvp_cores_ncpus >= kvp_cores_dedicated_min;
	local_cpus(cfg, list, sizeof(list), what, sizeof(what));
	for (int pass = 0; pass < 2; pass++)
		for (unsigned c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &set) &&
			    (list[0] && kvp_topo_cpulist_has(list, c)) == (pass == 0)) {
				order[n++] = c;
				nlocal += pass == 0;
			}
	if (n == 0)
		return -ENOENT;
	for (unsigned i = 0; i < nw; i++)
		workers[i] = order[i % n];
	*main_cpu = order[nw < n ? nw : n > 1 ? 1 : 0];
	cpu_list(workers, nw, wl, sizeof(wl));
	if (nw == 1)
		snprintf(kvp_cores_why, sizeof(kvp_cores_why), "auto: worker on CPU %s, main on CPU %u",
			 wl, *main_cpu);
	else
		snprintf(kvp_cores_why, sizeof(kvp_cores_why),
			 "auto: %u workers on CPUs %s, main on CPU %u%s", nw, wl, *main_cpu,
			 nw > n ? " (fewer CPUs allowed than workers: they share)" : "");
	size_t l = strlen(kvp_cores_why);
	if (nlocal)
		snprintf(kvp_cores_why + l, sizeof(kvp_cores_why) - l, "; local to %s: %s", what, list);
	else
		snprintf(kvp_cores_why + l, sizeof(kvp_cores_why) - l,
			 "; no device-local CPU allowed (%s%s%s)", what, list[0] ? ", local: " : "",
			 list);
	return 0;
}

char **
kvp_cores_eal_args(int *argc, char **argv)
{
	static char opt[] = "--lcores";
	static char map[16 * (KVP_WORKERS_MAX + 1)];
	static unsigned w[KVP_WORKERS_MAX];
	struct kvp_config cfg;
	char err[512];
	unsigned m, nw = 1;
	const char *conf = conf_path(*argc, argv);

	if (!conf || eal_sets_lcores(*argc, argv))
		return argv;
	/* Errors are reported again, properly, once the EAL is up. */
	if (kvp_config_load(conf, &cfg, err, sizeof(err)) < 0 || cfg.cores[0] == '\0')
		return argv;
	if (strcmp(cfg.cores, "auto") == 0) {
		nw = cfg.workers ? cfg.workers : 1;
		if (pick_auto(&cfg, nw, &m, w) < 0)
			return argv;
	} else {
		if (sscanf(cfg.cores, "%u,%u", &m, &w[0]) != 2)
			return argv;
		snprintf(kvp_cores_why, sizeof(kvp_cores_why),
			 "configured: worker on CPU %u, main on CPU %u", w[0], m);
	}
	char **v = calloc((size_t)*argc + 3, sizeof(*v));
	if (!v)
		return argv;
	args = v;
	atexit(free_args);
	size_t off = (size_t)snprintf(map, sizeof(map), "0@%u", m);
	for (unsigned i = 0; i < nw && off < sizeof(map); i++)
		off += (size_t)snprintf(map + off, sizeof(map) - off, ",%u@%u", i + 1, w[i]);
	v[0] = argv[0];
	v[1] = opt;
	v[2] = map;
	memcpy(&v[3], &argv[1], sizeof(*v) * (size_t)(*argc - 1));
	*argc += 2;
	return v;
}
