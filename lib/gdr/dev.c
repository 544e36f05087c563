/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Node RDMA resources: the rails this node uses (from rdma.devices, or every
 * active port), one protection domain per device, and each port's GID:
 * RoCE v2 of the listen address family, so that the peers' IP routes are
 * the RDMA routes too.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdma_priv.h"

struct gdr_node gdr;

static int
dev_index(struct ibv_device *d, char *why, size_t whylen)
{
	const char *name = ibv_get_device_name(d);

	for (unsigned i = 0; i < gdr.ndevs; i++)
		if (strcmp(gdr.devs[i].name, name) == 0)
			return (int)i;
	if (gdr.ndevs == GDR_DEVS) {
		snprintf(why, whylen, "more than %d RDMA devices", GDR_DEVS);
		return -EINVAL;
	}
	struct gdr_dev *g = &gdr.devs[gdr.ndevs];
	g->ctx = ibv_open_device(d);
	if (!g->ctx) {
		snprintf(why, whylen, "%s: cannot open: %s", name, strerror(errno));
		return -ENODEV;
	}
	if (ibv_query_device(g->ctx, &g->attr) != 0 || !(g->pd = ibv_alloc_pd(g->ctx))) {
		snprintf(why, whylen, "%s: cannot query it or allocate a protection domain: %s",
			 name, strerror(errno));
		ibv_close_device(g->ctx);
		g->ctx = NULL;
		return -ENODEV;
	}
	snprintf(g->name, sizeof(g->name), "%s", name);
	return (int)gdr.ndevs++;
}

static bool
gid_is_v4mapped(const union ibv_gid *g)
{
	static const uint8_t pfx[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	return memcmp(g->raw, pfx, sizeof(pfx)) == 0;
}

/* Pick the GID of a RoCE port: RoCE v2, IPv4-mapped when the node listens on IPv4. */
static int
pick_gid(struct gdr_dev *d, uint8_t port, int tbl_len, bool v4, union ibv_gid *gid)
{
	int fallback = -1;
	union ibv_gid fb;

	for (int i = 0; i < tbl_len; i++) {
		struct ibv_gid_entry e;

		if (ibv_query_gid_ex(d->ctx, port, (uint32_t)i, &e, 0) != 0)
			continue;
		if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
			continue;
		bool link_local = e.gid.raw[0] == 0xfe && (e.gid.raw[1] & 0xc0) == 0x80;
		if (gid_is_v4mapped(&e.gid) == v4 && !link_local) {
			*gid = e.gid;
			return i;
		}
		if (fallback < 0) {
			fallback = i;
			fb = e.gid;
		}
	}
	if (fallback >= 0)
		*gid = fb;
	return fallback;
}

static int
add_rail(struct ibv_device *d, uint8_t port, const struct kvp_config *cfg, char *why,
	 size_t whylen)
{
	const char *name = ibv_get_device_name(d);
	struct ibv_port_attr pa;

	if (gdr.nrails == GDR_RAILS) {
		snprintf(why, whylen, "more than %d rails", GDR_RAILS);
		return -EINVAL;
	}
	int di = dev_index(d, why, whylen);
	if (di < 0)
		return di;
	struct gdr_dev *g = &gdr.devs[di];
	if (port == 0 || port > g->attr.phys_port_cnt || ibv_query_port(g->ctx, port, &pa) != 0) {
		snprintf(why, whylen, "%s has no port %u", name, port);
		return -EINVAL;
	}
	if (pa.state != IBV_PORT_ACTIVE) {
		snprintf(why, whylen, "%s port %u is not active (state %s)", name, port,
			 ibv_port_state_str(pa.state));
		return -ENODEV;
	}
	struct gdr_rail *r = &gdr.rails[gdr.nrails];
	memset(r, 0, sizeof(*r));
	r->dev = (unsigned)di;
	r->port = port;
	r->link_layer = pa.link_layer;
	r->mtu = (uint8_t)pa.active_mtu;
	r->lid = pa.lid;
	if (strcmp(cfg->rdma_gid, "auto") == 0) {
		if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
			r->gid_index = pick_gid(g, port, pa.gid_tbl_len,
						strchr(cfg->listen_host, ':') == NULL, &r->gid);
			if (r->gid_index < 0) {
				snprintf(why, whylen, "%s port %u has no RoCE v2 GID (is an IP address "
					 "configured on its network interface?)", name, port);
				return -ENODEV;
			}
		} else {
			r->gid_index = 0;
		}
	} else {
		char *end;
		long v = strtol(cfg->rdma_gid, &end, 10);

		if (*end != '\0' || v < 0 || v >= pa.gid_tbl_len) {
			snprintf(why, whylen, "rdma.gid \"%s\": expected \"auto\" or a GID index below %d",
				 cfg->rdma_gid, pa.gid_tbl_len);
			return -EINVAL;
		}
		r->gid_index = (int)v;
	}
	if (ibv_query_gid(g->ctx, port, r->gid_index, &r->gid) != 0) {
		snprintf(why, whylen, "%s port %u: cannot read GID %d", name, port, r->gid_index);
		return -ENODEV;
	}
	atomic_store(&r->paused, false);
	gdr_sysfs_pci(d, r->pci, sizeof(r->pci));
	gdr.nrails++;
	return 0;
}

/* rdma.devices: "dev[:port],dev[:port]..." */
static int
open_listed(struct ibv_device **list, int ndev, const struct kvp_config *cfg, char *why,
	    size_t whylen)
{
	char buf[sizeof(cfg->rdma_devices)];
	char *save = NULL;

	snprintf(buf, sizeof(buf), "%s", cfg->rdma_devices);
	for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		char *colon = strchr(tok, ':');
		long port = 1;

		if (colon) {
			char *end;

			*colon = '\0';
			port = strtol(colon + 1, &end, 10);
			if (*end != '\0' || port < 1 || port > 255) {
				snprintf(why, whylen, "rdma.devices: bad port in \"%s:%s\"", tok,
					 colon + 1);
				return -EINVAL;
			}
		}
		int d;
		for (d = 0; d < ndev; d++)
			if (strcmp(ibv_get_device_name(list[d]), tok) == 0)
				break;
		if (d == ndev) {
			snprintf(why, whylen, "rdma.devices: no RDMA device \"%s\"", tok);
			return -ENODEV;
		}
		int rc = add_rail(list[d], (uint8_t)port, cfg, why, whylen);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static void
open_all(struct ibv_device **list, int ndev, const struct kvp_config *cfg)
{
	char why[160];

	for (int d = 0; d < ndev && gdr.nrails < GDR_RAILS; d++) {
		struct ibv_context *ctx = ibv_open_device(list[d]);
		struct ibv_device_attr da;
		uint8_t nports = 0;

		if (!ctx)
			continue;
		if (ibv_query_device(ctx, &da) == 0)
			nports = da.phys_port_cnt;
		ibv_close_device(ctx);
		for (uint8_t p = 1; p <= nports && gdr.nrails < GDR_RAILS; p++)
			if (add_rail(list[d], p, cfg, why, sizeof(why)) < 0)
				KVP_LOG(INFO, gdr, "not a rail: %s", why);
	}
}

int
kvp_gdr_open(const struct kvp_config *cfg, struct kvp_gdr_rail_use *use, char *why,
	     size_t whylen)
{
	int ndev = 0, rc = 0;
	struct ibv_device **list = ibv_get_device_list(&ndev);

	memset(&gdr, 0, sizeof(gdr));
	if (!list || ndev == 0) {
		snprintf(why, whylen, "no RDMA devices");
		if (list)
			ibv_free_device_list(list);
		return -ENODEV;
	}
	if (cfg->rdma_devices[0])
		rc = open_listed(list, ndev, cfg, why, whylen);
	else
		open_all(list, ndev, cfg);
	ibv_free_device_list(list);
	if (rc == 0 && gdr.nrails == 0) {
		snprintf(why, whylen, "no active RDMA port with a usable GID");
		rc = -ENODEV;
	}
	if (rc == 0)
		rc = gdr_mr_init(cfg->max_regions, cfg->rdma_dmabuf_host);
	if (rc < 0) {
		if (rc == -ENOMEM)
			snprintf(why, whylen, "out of memory");
		kvp_gdr_close();
		return rc;
	}
	for (unsigned i = 0; i < gdr.nrails; i++) {
		const struct gdr_rail *r = &gdr.rails[i];

		snprintf(use[i].dev, sizeof(use[i].dev), "%s", gdr.devs[r->dev].name);
		use[i].port = r->port;
		use[i].gid_index = r->gid_index;
		use[i].mtu_bytes = 128 << r->mtu;
		KVP_LOG(INFO, gdr, "rail %u: %s port %u, GID index %d, MTU %d", i,
			gdr.devs[r->dev].name, r->port, r->gid_index, 128 << r->mtu);
	}
	return (int)gdr.nrails;
}

void
kvp_gdr_close(void)
{
	gdr_mr_fini();
	for (unsigned i = 0; i < gdr.ndevs; i++) {
		if (gdr.devs[i].pd)
			ibv_dealloc_pd(gdr.devs[i].pd);
		if (gdr.devs[i].ctx)
			ibv_close_device(gdr.devs[i].ctx);
	}
	memset(&gdr, 0, sizeof(gdr));
}

int
kvp_gdr_bind_gpu(int gpu, const char *gpu_pci)
{
	char bus[32];
	size_t len = strlen(gpu_pci);
	uint32_t mask = 0;

	if (gpu < 0 || gpu >= KVP_GPUS_MAX)
		return 0;
	/* The driver prints 00000000:19:00.0; sysfs names it 0000:19:00.0. */
	snprintf(bus, sizeof(bus), "%s", len > 12 ? gpu_pci + len - 12 : gpu_pci);
	for (char *p = bus; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	for (unsigned r = 0; r < gdr.nrails; r++)
		if (gdr.rails[r].pci[0] && kvp_topo_same_switch(bus, gdr.rails[r].pci))
			mask |= 1u << r;
	gdr.gpu_rails[gpu] = mask;
	if (mask)
		KVP_LOG(INFO, gdr, "GPU %d (%s): its data goes through the rails behind its PCIe "
			"switch (mask %#x)", gpu, bus, mask);
	return __builtin_popcount(mask);
}

int
kvp_gdr_rail_pause(unsigned rail, bool pause)
{
	if (rail >= gdr.nrails)
		return -ENOENT;
	atomic_store(&gdr.rails[rail].paused, pause);
	KVP_LOG(NOTICE, gdr, "rail %u (%s port %u) %s", rail, gdr.devs[gdr.rails[rail].dev].name,
		gdr.rails[rail].port, pause ? "paused" : "resumed");
	return 0;
}

const struct kvp_mr_stats *
kvp_gdr_mr_stats(void)
{
	return &gdr.mr_stats;
}
