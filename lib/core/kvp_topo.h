/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_topo: host topology from sysfs (interfaces, PCI devices, NUMA nodes,
 * CPU lists), for doctor and the start-up checks (main lcore). Implemented
 * in topo.c.
 */
#ifndef KVP_TOPO_H
#define KVP_TOPO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/**
 * Name of the interface that owns local address @p ip (getifaddrs).
 *
 * @return 0; -ENOENT if no interface has it (or it is a wildcard)
 */
int kvp_topo_iface_of_addr(const char *ip, char *ifname, size_t len);

/**
 * Interface the kernel would use to reach @p host (a connected UDP socket's
 * local address, nothing is sent).
 *
 * @return 0, or negative errno
 */
int kvp_topo_route_iface(const char *host, uint16_t port, char *ifname, size_t len);

/** Where a network interface sits: its PCI device, NUMA node and device-local CPUs. */
struct kvp_topo_dev {
	char pci[32];	    /**< PCI address, "" for a virtual interface */
	int numa_node;	    /**< -1 if unknown or none */
	char cpulist[128];  /**< CPUs local to the device (sysfs local_cpulist), "" if unknown */
};

/**
 * Look up @p ifname under /sys/class/net.
 *
 * @return 0; -ENOENT (no such interface)
 */
int kvp_topo_netdev(const char *ifname, struct kvp_topo_dev *d);

/**
 * Look up PCI device @p pci (e.g. "0000:3b:00.0") under /sys/bus/pci/devices.
 *
 * @return 0; -ENOENT (no such device)
 */
int kvp_topo_pcidev(const char *pci, struct kvp_topo_dev *d);

/**
 * True if PCI devices @p pci_a and @p pci_b sit behind the same PCIe switch
 * (PIX: their sysfs paths share the bridge above both ports).
 */
bool kvp_topo_same_switch(const char *pci_a, const char *pci_b);

/** True if @p cpu appears in a sysfs CPU list such as "0-3,8,10-11". */
bool kvp_topo_cpulist_has(const char *list, unsigned cpu);

#endif /* KVP_TOPO_H */
