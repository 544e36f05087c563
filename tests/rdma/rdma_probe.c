/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rdma_probe: kvp_gdr_probe() against real verbs devices.
 *
 * Inside the Soft-RoCE VM (tools/rdma-vm.sh sets KVP_RDMA_VM=1): the probe
 * must list both rxe devices, each with an ACTIVE port whose link layer is
 * Ethernet, i.e. RoCE.
 *
 * With --expect-none, on a host without RDMA: the probe must fail with
 * -ENOSYS or -ENODEV and say why, which is what lets kvproxyd fall back to
 * TCP with a reason instead of failing obscurely.
 *
 * Exit: 0 pass, 1 fail, 77 skipped (this machine cannot show what is asked).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "kvp_gdr.h"

#define MAX_RAILS 64
#define EXIT_SKIP 77

static const char *
port_state_name(int s)
{
	switch (s) {
	case IBV_PORT_DOWN:
		return "DOWN";
	case IBV_PORT_INIT:
		return "INIT";
	case IBV_PORT_ARMED:
		return "ARMED";
	case IBV_PORT_ACTIVE:
		return "ACTIVE";
	case IBV_PORT_ACTIVE_DEFER:
		return "ACTIVE_DEFER";
	default:
		return "NOP/unknown";
	}
}

static const char *
link_layer_name(int ll)
{
	switch (ll) {
	case IBV_LINK_LAYER_INFINIBAND:
		return "InfiniBand";
	case IBV_LINK_LAYER_ETHERNET:
		return "Ethernet (RoCE)";
	default:
		return "unspecified";
	}
}

static void
print_rail(const struct kvp_gdr_rail *r)
{
	printf("  %s port %u: state %s, link layer %s, active MTU %d, numa %d, pci '%s'\n", r->dev,
	       r->port, port_state_name(r->state), link_layer_name(r->link_layer),
	       r->active_mtu >= IBV_MTU_256 && r->active_mtu <= IBV_MTU_4096 ?
		       128 << r->active_mtu :
		       0,
	       r->numa_node, r->pci);
}

/* The probe on a host without RDMA: a clean refusal with a reason. */
static int
expect_none(void)
{
	struct kvp_gdr_rail rails[MAX_RAILS];
	char why[256] = "";
	int n = kvp_gdr_probe(rails, MAX_RAILS, why, sizeof(why));

	if (n > 0) {
		printf("SKIP: this host has %d RDMA port(s); the no-RDMA check needs a host without:\n",
		       n);
		for (int i = 0; i < n; i++)
			print_rail(&rails[i]);
		return EXIT_SKIP;
	}
	printf("kvp_gdr_probe() = %d (%s), why: \"%s\"\n", n, n < 0 ? strerror(-n) : "no ports",
	       why);
	if (n != -ENOSYS && n != -ENODEV) {
		printf("FAIL: expected -ENOSYS or -ENODEV\n");
		return 1;
	}
	if (why[0] == '\0') {
		printf("FAIL: the probe gave no reason\n");
		return 1;
	}
	printf("PASS: no RDMA on this host, and the probe says why\n");
	return 0;
}

static bool
check_dev(const struct kvp_gdr_rail *rails, int n, const char *dev)
{
	bool seen = false, ok = false;

	for (int i = 0; i < n; i++) {
		const struct kvp_gdr_rail *r = &rails[i];

		if (strcmp(r->dev, dev) != 0)
			continue;
		seen = true;
		if (r->state != IBV_PORT_ACTIVE)
			printf("FAIL: %s port %u is %s, not ACTIVE\n", dev, r->port,
			       port_state_name(r->state));
		else if (r->link_layer != IBV_LINK_LAYER_ETHERNET)
			printf("FAIL: %s port %u link layer is %s, not Ethernet (RoCE)\n", dev,
			       r->port, link_layer_name(r->link_layer));
		else if (r->active_mtu < IBV_MTU_256 || r->active_mtu > IBV_MTU_4096)
			printf("FAIL: %s port %u reports no valid active MTU (%d)\n", dev, r->port,
			       r->active_mtu);
		else
			ok = true;
	}
	if (!seen)
		printf("FAIL: %s not among the probed ports\n", dev);
	return seen && ok;
}

static const char *
env_or(const char *name, const char *dflt)
{
	const char *v = getenv(name);

	return v && *v ? v : dflt;
}

int
main(int argc, char **argv)
{
	struct kvp_gdr_rail rails[MAX_RAILS];
	char why[256] = "";
	bool in_vm = getenv("KVP_RDMA_VM") != NULL;
	const char *dev0 = env_or("KVP_RDMA_DEV0", "rxe0");
	const char *dev1 = env_or("KVP_RDMA_DEV1", "rxe1");
	int n, fails = 0;

	if (argc == 2 && strcmp(argv[1], "--expect-none") == 0)
		return expect_none();
	if (argc != 1) {
		fprintf(stderr, "usage: %s [--expect-none]\n", argv[0]);
		return 2;
	}

	n = kvp_gdr_probe(rails, MAX_RAILS, why, sizeof(why));
	if (n <= 0) {
		if (!in_vm) {
			printf("SKIP: no RDMA here (%s); run it through tools/rdma-vm.sh\n", why);
			return EXIT_SKIP;
		}
		printf("FAIL: kvp_gdr_probe() = %d in the Soft-RoCE VM: %s\n", n, why);
		return 1;
	}
	printf("kvp_gdr_probe() found %d port(s):\n", n);
	for (int i = 0; i < n; i++)
		print_rail(&rails[i]);
	fails += !check_dev(rails, n, dev0);
	fails += !check_dev(rails, n, dev1);
	if (fails)
		return 1;
	printf("PASS: %s and %s are ACTIVE RoCE ports\n", dev0, dev1);
	return 0;
}
