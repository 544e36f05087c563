/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * doctor: what this node runs on and why — transport choice, RDMA rails,
 * the interfaces peers are reached through, GPUs, and whether the worker
 * lcores sit on the devices' local CPUs.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <jansson.h>
#include <rte_lcore.h>

#include "ctrl_priv.h"


static void
check(json_t *checks, bool ok, const char *what, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void
check(json_t *checks, bool ok, const char *what, const char *fmt, ...)
{
	char detail[384];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	json_array_append_new(checks, json_pack("{s:s, s:s, s:s}", "check", what, "result",
						ok ? "ok" : "warning", "detail", detail));
}

/* Worker lcores against the device-local CPUs of a device named @p what. */
static void
placement(const struct kvp_node *n, json_t *checks, const char *what,
	  const struct kvp_topo_dev *d)
{
	if (d->pci[0] == '\0') {
		check(checks, true, what,
		      "virtual device (no PCI device): no placement to check");
		return;
	}
	if (d->cpulist[0] == '\0') {
		check(checks, true, what, "PCI %s: sysfs gives no local CPU list", d->pci);
		return;
	}
	for (unsigned w = 0; w < n->nworkers; w++) {
		unsigned lc = n->workers[w].lcore;
		int cpu = rte_lcore_to_cpu_id((int)lc);

		if (cpu >= 0 && kvp_topo_cpulist_has(d->cpulist, (unsigned)cpu))
			check(checks, true, what,
			      "PCI %s (NUMA %d): worker lcore %u (cpu %d) is device-local (%s)",
			      d->pci, d->numa_node, lc, cpu, d->cpulist);
		else
			check(checks, false, what,
			      "PCI %s (NUMA %d): worker lcore %u (cpu %d) is not device-local; "
			      "pin workers to CPUs %s with EAL -l",
			      d->pci, d->numa_node, lc, cpu, d->cpulist);
	}
}

static json_t *
netdev_json(const char *role, const char *addr, const char *ifname, int rc,
	    const struct kvp_topo_dev *d)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:i, s:s}", "role", role, "addr", addr, "iface",
			 rc == 0 ? ifname : "?", "pci", d->pci[0] ? d->pci : "virtual",
			 "numa_node", d->numa_node, "local_cpus", d->cpulist);
}

/*
 * GPUs: driver, dma-buf and GPUDirect support, PCIe location, local CPUs,
 * rails behind the same switch, and the path each peer's GPU data takes.
 */
static json_t *
gpus_json(const struct kvp_node *n, json_t *checks)
{
	json_t *arr = json_array();
	char what[64], bus[32];

	if (n->env.ngpus <= 0) {
		check(checks, true, "gpu", "GPU regions refused: %s", kvp_gpu_unavailable);
		return arr;
	}
	for (int i = 0; i < n->env.ngpus && i < KVP_GPUS_MAX; i++) {
		const struct kvp_gpu_info *g = &n->env.gpus[i];
		struct kvp_topo_dev d;
		json_t *pix = json_array();

		/* The driver prints 00000000:19:00.0; sysfs names it 0000:19:00.0. */
		snprintf(bus, sizeof(bus), "%s", strlen(g->pci) > 12 ? g->pci + strlen(g->pci) - 12
								     : g->pci);
		for (char *c = bus; *c; c++)
			*c = (char)tolower((unsigned char)*c);
		memset(&d, 0, sizeof(d));
		d.numa_node = -1;
		kvp_topo_pcidev(bus, &d);
		for (unsigned r = 0; r < n->env.nrails && r < KVP_RAILS_MAX; r++)
			if (n->env.rails[r].pci[0] && kvp_topo_same_switch(bus, n->env.rails[r].pci))
				json_array_append_new(pix, json_string(n->env.rails[r].dev));
		snprintf(what, sizeof(what), "gpu %d", i);
		placement(n, checks, what, &d);
		/* RDMA registers GPU regions through a dma-buf (or peer memory) when the
		 * driver offers it; where registration fails, that region is staged. */
		bool direct = n->env.rail_pause && (g->dmabuf || g->gpudirect_rdma);
		unsigned used = 0;
		for (unsigned r = 0; r < n->env.nrails && r < KVP_RAILS_MAX; r++)
			used += n->env.rails[r].rail >= 0;
		const char *path = direct ? "gpudirect" : "staging";
		if (direct)
			check(checks, true, what,
			      "%s at %s (CUDA driver %d): GPU data goes by GPUDirect RDMA over %u rail(s) "
			      "%s(dma-buf %s, GPUDirect RDMA %s); a region that cannot be registered "
			      "is staged over TCP",
			      g->name, bus, n->env.cuda_driver, used,
			      json_array_size(pix) ? "" : "none of them PIX-local ",
			      g->dmabuf ? "supported" : "unsupported",
			      g->gpudirect_rdma ? "supported" : "unsupported");
		else
			check(checks, true, what,
			      "%s at %s (CUDA driver %d): GPU data of every peer is staged through the "
			      "pinned pool over tcp (%s); GPUDirect needs the RDMA transport and driver "
			      "support (dma-buf %s, GPUDirect RDMA %s)",
			      g->name, bus, n->env.cuda_driver, n->tops->name,
			      g->dmabuf ? "supported" : "unsupported",
			      g->gpudirect_rdma ? "supported" : "unsupported");
		json_array_append_new(
			arr, json_pack("{s:i, s:s, s:s, s:i, s:b, s:b, s:I, s:s, s:o, s:s}", "ordinal",
				       i, "name", g->name, "pci", bus, "numa_node", d.numa_node,
				       "dmabuf", g->dmabuf, "gpudirect_rdma", g->gpudirect_rdma,
				       "memory_bytes", (json_int_t)g->total_mem, "local_cpus",
				       d.cpulist, "pix_rails", pix, "path", path));
	}
	return arr;
}

/* tcp.zerocopy: does the kernel copy anyway on the paths this node sends over? */
static void
zerocopy(const struct kvp_node *n, json_t *checks)
{
	uint64_t zc = 0, copied = 0;

	if (!n->cfg.tcp_zerocopy)
		return;
	for (unsigned w = 0; w < n->nworkers; w++) {
		zc += stats_worker_peer_sum(n, w, offsetof(struct kvp_peer_stats, tcp_zc_bytes));
		copied += stats_worker_peer_sum(n, w, offsetof(struct kvp_peer_stats, tcp_zc_copied));
	}
	if (zc == 0)
		check(checks, true, "tcp.zerocopy", "on; no zero-copy sends yet");
	else if (copied * 2 >= zc)
		check(checks, false, "tcp.zerocopy",
		      "the kernel copied %" PRIu64 " of %" PRIu64 " zero-copy bytes (%.0f %%): "
		      "on these paths (local delivery: loopback, veth; or a NIC without "
		      "scatter-gather) zero-copy saves nothing; tcp.zerocopy = false copies "
		      "without waiting for the peer's ACKs",
		      copied, zc, 100.0 * (double)copied / (double)zc);
	else
		check(checks, true, "tcp.zerocopy",
		      "the kernel copied %" PRIu64 " of %" PRIu64
		      " zero-copy bytes (Linux 6.2+ reports copies)",
		      copied, zc);
}

static json_t *
doctor_json(struct kvp_node *n)
{
	json_t *checks = json_array(), *nets = json_array(), *rails = json_array(),
	       *workers = json_array();
	char ifname[64], addr[96], what[192];
	struct kvp_topo_dev d;
	int rc;

	check(checks, true, "transport", "%s: %s", n->tops->name, n->env.transport_why);
	if (n->env.cores_why)
		check(checks, true, "cores", "%s", n->env.cores_why);
	if (n->env.rdma_ports < 0)
		check(checks, true, "rdma", "no RDMA: %s", n->env.rdma_why);
	zerocopy(n, checks);
	for (unsigned i = 0; i < n->env.nrails && i < KVP_RAILS_MAX; i++) {
		const struct kvp_rail_info *r = &n->env.rails[i];

		kvp_topo_pcidev(r->pci, &d);
		json_array_append_new(rails, json_pack("{s:s, s:i, s:b, s:s, s:i, s:s}", "dev",
						       r->dev, "port", (int)r->port, "active",
						       r->active, "pci", r->pci, "numa_node",
						       r->numa_node, "local_cpus", d.cpulist));
		snprintf(what, sizeof(what), "rail %s/%u", r->dev, r->port);
		placement(n, checks, what, &d);
	}
	/* The interfaces that carry peer traffic: the listener's and each peer's route. */
	memset(&d, 0, sizeof(d));
	d.numa_node = -1;
	rc = kvp_topo_iface_of_addr(n->cfg.listen_host, ifname, sizeof(ifname));
	snprintf(addr, sizeof(addr), "%s:%u", n->cfg.listen_host, n->cfg.listen_port);
	if (rc == 0) {
		kvp_topo_netdev(ifname, &d);
		snprintf(what, sizeof(what), "listen %s (%s)", addr, ifname);
		placement(n, checks, what, &d);
	}
	json_array_append_new(nets, netdev_json("listen", addr, rc == -ENOENT ? "any" : ifname,
						rc == -ENOENT ? 0 : rc, &d));
	for (uint32_t p = 0; p < n->cfg.max_peers; p++) {
		const struct kvp_peer *pc = &n->peers[p];

		/* The peers this node dials (an inbound one has no address). */
		if (pc->slot_state != KVP_PS_ACTIVE || !pc->host[0])
			continue;
		memset(&d, 0, sizeof(d));
		d.numa_node = -1;
		snprintf(addr, sizeof(addr), "%s", pc->addr);
		rc = kvp_topo_route_iface(pc->host, pc->port, ifname, sizeof(ifname));
		if (rc == 0) {
			kvp_topo_netdev(ifname, &d);
			snprintf(what, sizeof(what), "route to %s (%s)", peer_label(n, p), ifname);
			placement(n, checks, what, &d);
		} else {
			snprintf(what, sizeof(what), "route to %s", peer_label(n, p));
			check(checks, false, what, "%s: no route found (%s)", addr, strerror(-rc));
		}
		json_array_append_new(nets, netdev_json(peer_label(n, p), addr, ifname, rc, &d));
	}
	for (unsigned w = 0; w < n->nworkers; w++) {
		unsigned lc = n->workers[w].lcore;

		json_array_append_new(workers, json_pack("{s:i, s:i, s:i}", "lcore", (int)lc, "cpu",
							 rte_lcore_to_cpu_id((int)lc), "numa_node",
							 (int)rte_lcore_to_socket_id(lc)));
	}
	json_t *gpus = gpus_json(n, checks);
	return json_pack("{s:s, s:s, s:s, s:s, s:i, s:s, s:o, s:o, s:o, s:o, s:o}", "cores",
			 n->env.cores_why ? n->env.cores_why : "", "transport",
			 n->tops->name, "transport_why", n->env.transport_why, "configured",
			 n->cfg.transport == KVP_TRANSPORT_RDMA ? "rdma"
			 : n->cfg.transport == KVP_TRANSPORT_AUTO ? "auto"
								   : "tcp",
			 "rdma_ports", n->env.rdma_ports, "rdma_why",
			 n->env.rdma_ports < 0 ? n->env.rdma_why : "", "rails", rails, "network", nets,
			 "workers", workers, "gpus", gpus, "checks", checks);
}

static json_t *
m_doctor(struct kvp_node *n, json_t *params, struct rpc_err *e)
{
	if (!admin_no_params(params))
		return admin_fail(e, RPC_INVALID_PARAMS, "doctor takes no params");
	return doctor_json(n);
}

void
kvp_node_log_doctor(struct kvp_node *n)
{
	json_t *d = doctor_json(n), *c;
	size_t i;

	json_array_foreach(json_object_get(d, "checks"), i, c)
	{
		const char *what = json_string_value(json_object_get(c, "check"));
		const char *detail = json_string_value(json_object_get(c, "detail"));

		if (strcmp(json_string_value(json_object_get(c, "result")), "ok") == 0)
			KVP_LOG(INFO, core, "doctor: %s: %s", what, detail);
		else
			KVP_LOG(WARNING, core, "doctor: %s: %s", what, detail);
	}
	json_decref(d);
}


void
doctor_init(struct kvp_node *n)
{
	(void)n;
	rpc_register("doctor", m_doctor);
}
