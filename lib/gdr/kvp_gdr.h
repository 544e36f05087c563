/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_gdr: the RDMA side of kvproxy.
 *
 * - Discovery: verbs devices and ports (rails) with their PCIe placement.
 * - Node resources (kvp_gdr_open): the rails this node uses, one protection
 *   domain per device, the RoCE v2 GID of each port, and the region hooks
 *   that register every region once, when a client registers it (host
 *   memory with ibv_reg_mr, GPU memory through a dma-buf or peer memory).
 * - The RDMA transport (kvp_rdma_ops): RC queue pairs per (peer, rail),
 *   built by the sidecars over their TCP connections; data moves as RDMA
 *   WRITEs striped over the rails, a WRITE_WITH_IMM tells the receiver the
 *   transfer is complete, and the receiver's ACK completes it. Transfers
 *   that cannot go by RDMA (a region without a registration, a peer without
 *   RDMA, every rail paused) take the TCP staging path of the same instance.
 *
 * Threading: discovery, kvp_gdr_open/close and the region hooks on the main
 * lcore; kvp_gdr_rail_pause from the main lcore while workers read the flag;
 * the transport ops on their worker lcore. Memory: sized at start from the
 * configuration.
 */
#ifndef KVP_GDR_H
#define KVP_GDR_H

#include <stdbool.h>
#include <stdint.h>

#include "kvp_transport.h"

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

/** What kvp_gdr_open() chose for one rail. */
struct kvp_gdr_rail_use {
	char dev[64];
	uint8_t port;
	int gid_index;
	int mtu_bytes;
};

/**
 * Open the rails named by cfg->rdma_devices (every active port if empty),
 * pick each port's GID (cfg->rdma_gid), allocate protection domains and
 * install the region hooks. Call before the node adds regions.
 *
 * @param use  receives up to KVP_WIRE_RAILS_MAX entries, rail order
 * @return number of rails (> 0); -ENODEV / -EINVAL with @p why set
 */
int kvp_gdr_open(const struct kvp_config *cfg, struct kvp_gdr_rail_use *use, char *why,
		 size_t whylen);

/** Release what kvp_gdr_open() took (after the workers and the region table are gone). */
void kvp_gdr_close(void);

/**
 * Tell the planner which rails sit behind GPU @p gpu's PCIe switch (PIX):
 * data of that GPU's regions stripes over those rails while any of them is
 * usable. @p gpu_pci as the CUDA driver prints it. @return rails found
 */
int kvp_gdr_bind_gpu(int gpu, const char *gpu_pci);

/** Pause (no new writes) or resume a rail. @return 0; -ENOENT for an unknown rail */
int kvp_gdr_rail_pause(unsigned rail, bool pause);

/** Registration counters (main lcore). */
const struct kvp_mr_stats *kvp_gdr_mr_stats(void);

/** The RDMA transport (requires kvp_gdr_open()). */
extern const struct kvp_transport_ops kvp_rdma_ops;

#endif /* KVP_GDR_H */
