/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host topology from sysfs and the routing table, for "doctor" and the
 * start-up placement checks: which interface carries an address or a
 * route, which PCI device and NUMA node sit behind it, which CPUs are local
 * to that device. Main lcore only; nothing here is on the data path.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvp_topo.h"
#include "kvp_log.h"

/* Strip the brackets of "[v6]" into @p out. */
static void
bare_host(const char *host, char *out, size_t len)
{
	size_t n = strlen(host);

	if (n >= 2 && host[0] == '[' && host[n - 1] == ']')
		snprintf(out, len, "%.*s", (int)(n - 2), host + 1);
	else
		snprintf(out, len, "%s", host);
}

static bool
same_addr(const struct sockaddr *a, const struct sockaddr_storage *b)
{
	if (!a || a->sa_family != b->ss_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->sa_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
	return false;
}

static int
iface_of(const struct sockaddr_storage *ss, char *ifname, size_t len)
{
	struct ifaddrs *ifa, *i;
	int rc = -ENOENT;

	if (getifaddrs(&ifa) < 0)
		return -errno;
	for (i = ifa; i; i = i->ifa_next) {
		if (same_addr(i->ifa_addr, ss)) {
			snprintf(ifname, len, "%s", i->ifa_name);
			rc = 0;
			break;
		}
	}
	freeifaddrs(ifa);
	return rc;
}

int
kvp_topo_iface_of_addr(const char *ip, char *ifname, size_t len)
{
	struct sockaddr_storage ss;
	char h[64];

	memset(&ss, 0, sizeof(ss));
	bare_host(ip, h, sizeof(h));
	if (inet_pton(AF_INET, h, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		ss.ss_family = AF_INET;
		if (((struct sockaddr_in *)&ss)->sin_addr.s_addr == htonl(INADDR_ANY))
			return -ENOENT;
	} else if (inet_pton(AF_INET6, h, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		ss.ss_family = AF_INET6;
	} else {
		return -EINVAL;
	}
	return iface_of(&ss, ifname, len);
}

int
kvp_topo_route_iface(const char *host, uint16_t port, char *ifname, size_t len)
{
	struct addrinfo hints = { .ai_socktype = SOCK_DGRAM,
				  .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV };
	struct addrinfo *res;
	struct sockaddr_storage local;
	socklen_t sl = sizeof(local);
	char h[64], p[8];
	int fd, rc;

	bare_host(host, h, sizeof(h));
	snprintf(p, sizeof(p), "%u", port);
	/* Numeric only: the control plane never blocks on a resolver. */
	if (getaddrinfo(h, p, &hints, &res) != 0)
		return -EINVAL;
	fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	/* A UDP connect only asks the routing table; nothing is sent. */
	if (connect(fd, res->ai_addr, res->ai_addrlen) < 0 ||
	    getsockname(fd, (struct sockaddr *)&local, &sl) < 0) {
		rc = -errno;
		close(fd);
		goto out;
	}
	close(fd);
	rc = iface_of(&local, ifname, len);
out:
	freeaddrinfo(res);
	return rc;
}

static void
read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");

	buf[0] = '\0';
	if (!f)
		return;
	if (!fgets(buf, (int)len, f))
		buf[0] = '\0';
	fclose(f);
	buf[strcspn(buf, "\r\n")] = '\0';
}

/* Fill @p d from a PCI device directory in sysfs. */
static void
read_pcidir(const char *dir, struct kvp_topo_dev *d)
{
	char path[PATH_MAX], v[32];

	snprintf(path, sizeof(path), "%s/numa_node", dir);
	read_line(path, v, sizeof(v));
	d->numa_node = v[0] ? atoi(v) : -1;
	snprintf(path, sizeof(path), "%s/local_cpulist", dir);
	read_line(path, d->cpulist, sizeof(d->cpulist));
}

int
kvp_topo_netdev(const char *ifname, struct kvp_topo_dev *d)
{
	char path[PATH_MAX], link[PATH_MAX];
	ssize_t n;

	memset(d, 0, sizeof(*d));
	d->numa_node = -1;
	if (strchr(ifname, '/') || strcmp(ifname, "..") == 0)
		return -EINVAL;
	snprintf(path, sizeof(path), "/sys/class/net/%s", ifname);
	if (access(path, F_OK) < 0)
		return -ENOENT;
	/* Virtual interfaces (veth, bridges, lo) have no device link. */
	snprintf(path, sizeof(path), "/sys/class/net/%s/device/subsystem", ifname);
	n = readlink(path, link, sizeof(link) - 1);
	if (n <= 0)
		return 0;
	link[n] = '\0';
	if (!strstr(link, "/pci"))
		return 0;
	snprintf(path, sizeof(path), "/sys/class/net/%s/device", ifname);
	n = readlink(path, link, sizeof(link) - 1);
	if (n > 0) {
		link[n] = '\0';
		const char *base = strrchr(link, '/');

		snprintf(d->pci, sizeof(d->pci), "%.31s", base ? base + 1 : link);
	}
	read_pcidir(path, d);
	return 0;
}

int
kvp_topo_pcidev(const char *pci, struct kvp_topo_dev *d)
{
	char path[PATH_MAX];

	memset(d, 0, sizeof(*d));
	d->numa_node = -1;
	if (pci[0] == '\0' || strchr(pci, '/'))
		return -EINVAL;
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", pci);
	if (access(path, F_OK) < 0)
		return -ENOENT;
	snprintf(d->pci, sizeof(d->pci), "%.31s", pci);
	read_pcidir(path, d);
	return 0;
}

bool
kvp_topo_cpulist_has(const char *list, unsigned cpu)
{
	const char *p = list;

	while (*p) {
		char *end;
		unsigned long lo = strtoul(p, &end, 10), hi;

		if (end == p)
			return false;
		hi = lo;
		if (*end == '-') {
			p = end + 1;
			hi = strtoul(p, &end, 10);
			if (end == p)
				return false;
		}
		if (cpu >= lo && cpu <= hi)
			return true;
		p = *end == ',' ? end + 1 : end;
		if (*end != ',' && *end != '\0')
			return false;
	}
	return false;
}

bool
kvp_topo_same_switch(const char *pci_a, const char *pci_b)
{
	char a[512], b[512], pa[256], pb[256];

	snprintf(pa, sizeof(pa), "/sys/bus/pci/devices/%s", pci_a);
	snprintf(pb, sizeof(pb), "/sys/bus/pci/devices/%s", pci_b);
	if (!realpath(pa, a) || !realpath(pb, b))
		return false;
	/* Drop the device and its own port: what remains is the switch above both. */
	for (int k = 0; k < 2; k++) {
		char *sa = strrchr(a, '/'), *sb = strrchr(b, '/');

		if (!sa || !sb)
			return false;
		*sa = '\0';
		*sb = '\0';
	}
	return strcmp(a, b) == 0 && strcmp(a, "/sys/devices") != 0;
}
