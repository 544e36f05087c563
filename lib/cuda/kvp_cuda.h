/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_cuda: GPU memory through the CUDA driver API, loaded at run time
 * (dlopen("libcuda.so.1")), so one build runs on hosts with and without
 * GPUs. It imports client GPU allocations (CUDA IPC handles, VMM POSIX
 * fds), provides the staging copies for them (struct kvp_memops), and pins
 * the staging pool once.
 *
 * Contexts: only the primary context of a device that a region lives on is
 * retained — never an implicit context on GPU 0. Threading: init, import
 * and release on the main lcore; the memops on worker lcores (each thread
 * makes the region's context current on first use).
 */
#ifndef KVP_CUDA_H
#define KVP_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvp_transport.h"

struct kvp_cuda_dev {
	int ordinal;
	char name[96];
	char pci[32];	     /**< PCI bus id, e.g. 0000:19:00.0 */
	int dmabuf;	     /**< CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
	int gpudirect_rdma;  /**< CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED */
	uint64_t total_mem;
};

/**
 * Load the driver and initialise it (idempotent); installs the CUDA-aware
 * memops on success.
 *
 * @param why  the reason when CUDA cannot be used
 * @return number of devices (> 0); -ENOENT (no libcuda.so.1), -ENODEV (no
 *   device or cuInit failed), -ENOTSUP (built without CUDA headers)
 */
int kvp_cuda_init(char *why, size_t whylen);

/** Driver version (e.g. 13000), 0 if not loaded. */
int kvp_cuda_driver_version(void);

/** Describe device @p ordinal. @return 0 or -ENODEV */
int kvp_cuda_device(int ordinal, struct kvp_cuda_dev *out);

/**
 * Import a client's GPU allocation (main lcore).
 *
 * @param flags   KVP_REGION_CUDA_IPC (@p ipc used) or KVP_REGION_CUDA_VMM (@p fd used)
 * @param offset  IPC: where the region starts inside the allocation
 * @param dptr    device address of the mapping
 * @param cookie  pass to kvp_cuda_release() when the region goes
 * @return 0; -ENODEV (no CUDA / bad device); -EINVAL (cannot import) with @p why
 */
int kvp_cuda_import(uint32_t flags, int device, int fd, const uint8_t ipc[64], uint64_t offset,
		    uint64_t len, uint64_t *dptr, void **cookie, char *why, size_t whylen);

/** Undo kvp_cuda_import(). */
void kvp_cuda_release(void *cookie);

/** Bytes of GPU memory this process holds through imports (stats). */
uint64_t kvp_cuda_imported_bytes(void);

#endif /* KVP_CUDA_H */
