/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Memory registration, once per region and device, when the client
 * registers the region (main lcore) — never on the data path. Host memory:
 * ibv_reg_mr. GPU memory: a dma-buf exported by the CUDA driver
 * (ibv_reg_dmabuf_mr), else peer memory (ibv_reg_mr on the device pointer,
 * nvidia-peermem). A region that cannot be registered stays usable: its
 * data takes the TCP staging path, and the reason is logged and counted.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "rdma_priv.h"

#define MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static void
mr_release(struct gdr_mrs *m)
{
	for (unsigned d = 0; d < gdr.ndevs; d++) {
		if (m->mr[d]) {
			ibv_dereg_mr(m->mr[d]);
			m->mr[d] = NULL;
		}
	}
}

/* Register GPU memory on device @p d: dma-buf first, then peer memory. */
static struct ibv_mr *
reg_gpu(const struct kvp_region *r, unsigned d, bool *dmabuf, char *why, size_t whylen)
{
	struct ibv_pd *pd = gdr.devs[d].pd;
	uint64_t va = (uint64_t)(uintptr_t)r->base;
	int e_dmabuf = EOPNOTSUPP;

	if (kvp_memops->dmabuf_fd) {
		int fd = -1;
		uint64_t off = 0;

		if (kvp_memops->dmabuf_fd(r, &fd, &off) == 0) {
			struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, off, r->len, va, fd, MR_ACCESS);

			e_dmabuf = errno;
			close(fd); /* the MR holds its own reference to the buffer */
			if (mr) {
				*dmabuf = true;
				return mr;
			}
		}
	}
	struct ibv_mr *mr = ibv_reg_mr(pd, r->base, r->len, MR_ACCESS);
	if (mr) {
		*dmabuf = false;
		return mr;
	}
	snprintf(why, whylen, "%s: GPU memory cannot be registered: dma-buf: %s; peer memory: %s",
		 gdr.devs[d].name, strerror(e_dmabuf), strerror(errno));
	return NULL;
}

/*
 * Host memory through ibv_reg_dmabuf_mr (rdma.dmabuf_host, for tests): the
 * call a GPU region makes, so that path and its refusal can be exercised
 * without a GPU. The client's memfd is wrapped by udmabuf where the kernel
 * has it; elsewhere the memfd goes as it is, which a driver that supports
 * dma-bufs rejects as not being one. No fallback to ibv_reg_mr: a refusal
 * must show.
 */
static struct ibv_mr *
reg_host_dmabuf(const struct kvp_region *r, unsigned d, char *why, size_t whylen)
{
	struct udmabuf_create uc = {
		.memfd = (uint32_t)r->fd,
		.flags = UDMABUF_FLAGS_CLOEXEC,
		.offset = r->fd_off,
		.size = r->map_len,
	};
	int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	int fd = dev >= 0 ? ioctl(dev, UDMABUF_CREATE, &uc) : fcntl(r->fd, F_DUPFD_CLOEXEC, 0);
	int e = errno;

	if (dev >= 0)
		close(dev);
	if (fd < 0) {
		snprintf(why, whylen, "dma-buf registration: %s: %s",
			 dev >= 0 ? "UDMABUF_CREATE" : "dup", strerror(e));
		return NULL;
	}
	uint64_t off = (uint64_t)(r->base - (uint8_t *)r->map);
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(gdr.devs[d].pd, off, r->len,
					      (uint64_t)(uintptr_t)r->base, fd, MR_ACCESS);
	e = errno;
	close(fd);
	if (!mr)
		snprintf(why, whylen, "%s: dma-buf registration (ibv_reg_dmabuf_mr%s): %s",
			 gdr.devs[d].name, dev >= 0 ? "" : " of a memfd, no udmabuf here",
			 strerror(e));
	return mr;
}

static void
mr_on_add(void *arg, struct kvp_region *r, uint32_t slot)
{
	struct gdr_mrs *m = &gdr.mrs[slot];
	uint64_t t0 = kvp_mono_ns();
	bool gpu = (r->flags & KVP_REGION_F_GPU) != 0, dmabuf = false;
	char why[sizeof(gdr.mr_stats.last_error)] = "";

	(void)arg;
	if (slot >= gdr.nmrs)
		return;
	memset(m, 0, sizeof(*m));
	m->gpu = gpu;
	for (unsigned d = 0; d < gdr.ndevs; d++) {
		if (gpu)
			m->mr[d] = reg_gpu(r, d, &dmabuf, why, sizeof(why));
		else if (gdr.dmabuf_host)
			m->mr[d] = reg_host_dmabuf(r, d, why, sizeof(why));
		else if (!(m->mr[d] = ibv_reg_mr(gdr.devs[d].pd, r->base, r->len, MR_ACCESS)))
			snprintf(why, sizeof(why), "%s: ibv_reg_mr of %" PRIu64 " bytes: %s",
				 gdr.devs[d].name, r->len, strerror(errno));
		if (!m->mr[d]) {
			mr_release(m);
			KVP_STAT_ADD(gdr.mr_stats.failures, 1);
			snprintf(gdr.mr_stats.last_error, sizeof(gdr.mr_stats.last_error), "%s", why);
			KVP_LOG(WARNING, gdr, "region of client %08x not registered for RDMA, its data "
				"will be staged over TCP: %s", r->owner, why);
			return;
		}
	}
	uint64_t dt = kvp_mono_ns() - t0;
	KVP_STAT_ADD(gdr.mr_stats.regs, 1);
	if (gpu)
		KVP_STAT_ADD(*(dmabuf ? &gdr.mr_stats.dmabuf : &gdr.mr_stats.peermem), 1);
	KVP_STAT_ADD(gdr.mr_stats.reg_ns, dt);
	if (dt > gdr.mr_stats.reg_max_ns)
		KVP_STAT_SET(gdr.mr_stats.reg_max_ns, dt);
	r->xp = m;
}

static void
mr_on_remove(void *arg, struct kvp_region *r, uint32_t slot)
{
	(void)arg;
	(void)slot;
	mr_release(region_mrs(r));
	KVP_STAT_ADD(gdr.mr_stats.deregs, 1);
}

int
gdr_mr_init(uint32_t max_regions, bool dmabuf_host)
{
	gdr.dmabuf_host = dmabuf_host;
	gdr.mrs = calloc(max_regions, sizeof(*gdr.mrs));
	if (!gdr.mrs)
		return -ENOMEM;
	gdr.nmrs = max_regions;
	gdr.hooks.on_add = mr_on_add;
	gdr.hooks.on_remove = mr_on_remove;
	kvp_region_hooks = &gdr.hooks;
	return 0;
}

void
gdr_mr_fini(void)
{
	if (kvp_region_hooks == &gdr.hooks)
		kvp_region_hooks = NULL;
	free(gdr.mrs);
	gdr.mrs = NULL;
	gdr.nmrs = 0;
}
