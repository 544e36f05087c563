/* SPDX-License-Identifier: BSD-3-Clause */
/* Verbs device and port discovery, with the PCIe placement read from sysfs. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "rdma_priv.h"

void
gdr_sysfs_pci(struct ibv_device *dev, char *pci, size_t len)
{
	char path[PATH_MAX], link[PATH_MAX];
	ssize_t n;

	pci[0] = '\0';
	snprintf(path, sizeof(path), "%s/device", dev->ibdev_path);
	n = readlink(path, link, sizeof(link) - 1);
	if (n > 0) {
		link[n] = '\0';
		const char *base = strrchr(link, '/');
		snprintf(pci, len, "%.31s", base ? base + 1 : link);
	}
}

static void
sysfs_placement(struct ibv_device *dev, struct kvp_gdr_rail *r)
{
	char path[PATH_MAX];
	FILE *f;

	r->numa_node = -1;
	snprintf(path, sizeof(path), "%s/device/numa_node", dev->ibdev_path);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%d", &r->numa_node) != 1)
			r->numa_node = -1;
		fclose(f);
	}
	gdr_sysfs_pci(dev, r->pci, sizeof(r->pci));
}

int
kvp_gdr_probe(struct kvp_gdr_rail *rails, unsigned max, char *why, size_t whylen)
{
	int ndev = 0;
	struct ibv_device **list = ibv_get_device_list(&ndev);
	unsigned found = 0;

	if (!list) {
		int e = errno;

		snprintf(why, whylen, "no RDMA support: %s", e == ENOSYS ? "the kernel has no InfiniBand/RDMA subsystem" : strerror(e));
		return e == ENOSYS ? -ENOSYS : -ENODEV;
	}
	for (int d = 0; d < ndev && found < max; d++) {
		struct ibv_context *ctx = ibv_open_device(list[d]);
		struct ibv_device_attr da;

		if (!ctx)
			continue;
		if (ibv_query_device(ctx, &da) == 0) {
			for (uint8_t p = 1; p <= da.phys_port_cnt && found < max; p++) {
				struct ibv_port_attr pa;
				struct kvp_gdr_rail *r = &rails[found];

				if (ibv_query_port(ctx, p, &pa) != 0)
					continue;
				snprintf(r->dev, sizeof(r->dev), "%s", ibv_get_device_name(list[d]));
				r->port = p;
				r->state = pa.state;
				r->link_layer = pa.link_layer;
				r->active_mtu = pa.active_mtu;
				sysfs_placement(list[d], r);
				found++;
			}
		}
		ibv_close_device(ctx);
	}
	ibv_free_device_list(list);
	if (found == 0) {
		snprintf(why, whylen, "no RDMA devices found");
		return -ENODEV;
	}
	return (int)found;
}
