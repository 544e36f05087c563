/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_gdr: the RDMA side of kvproxy. So far it discovers verbs devices and
 * their ports (rails), so that the node can say whether RDMA is usable here
 * and why not; the RDMA transport itself builds on this.
 *
 * Threading: main lcore only. Memory: the caller owns the output array.
 */
#ifndef KVP_GDR_H
#define KVP_GDR_H

#include <stdint.h>

#include "kvp_core.h"

struct kvp_gdr_rail {
	char dev[64];	 /**< verbs device name, e.g. mlx5_0 or rxe0 */
	uint8_t port;	 /**< port number (1-based) */
	int state;	 /**< IBV_PORT_* */
	int link_layer;	 /**< IBV_LINK_LAYER_* */
	int active_mtu;	 /**< IBV_MTU_* */
	int numa_node;	 /**< from sysfs, -1 if unknown */
	char pci[32];	 /**< PCI address from sysfs, "" if unknown */
};

/**
 * List verbs ports.
 *
 * @param rails  filled with up to @p max entries
 * @param why    receives the reason when nothing usable was found
 * @return number of ports found (>= 0), or -ENODEV / -ENOSYS with @p why set
 */
int kvp_gdr_probe(struct kvp_gdr_rail *rails, unsigned max, char *why, size_t whylen);

#endif /* KVP_GDR_H */
