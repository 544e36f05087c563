/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CUDA driver API, resolved with dlopen/dlsym at run time. The prototypes
 * (and the _v2 symbol names behind them) come from cuda.h at build time;
 * nothing links against libcuda.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvp_cuda.h"
#include "kvp_guard.h"

#ifndef KVP_HAVE_CUDA_H

int
kvp_cuda_init(char *why, size_t whylen)
{
	snprintf(why, whylen, "built without CUDA headers (cuda.h): GPU memory unsupported");
	return -ENOTSUP;
}

int
kvp_cuda_driver_version(void)
{
	return 0;
}

int
kvp_cuda_device(int ordinal, struct kvp_cuda_dev *out)
{
	(void)ordinal;
	(void)out;
	return -ENODEV;
}

int
kvp_cuda_import(uint32_t flags, int device, int fd, const uint8_t ipc[64], uint64_t offset,
		uint64_t len, uint64_t *dptr, void **cookie, char *why, size_t whylen)
{
	(void)flags, (void)device, (void)fd, (void)ipc, (void)offset, (void)len, (void)dptr;
	(void)cookie;
	return kvp_cuda_init(why, whylen);
}

void
kvp_cuda_release(void *cookie)
{
	(void)cookie;
}

uint64_t
kvp_cuda_imported_bytes(void)
{
	return 0;
}

#else /* KVP_HAVE_CUDA_H */

#include <cuda.h>

#define XSTR(x) STR(x)
#define STR(x)	#x
/* One pointer per driver call, typed from cuda.h, named as the driver exports it. */
#define CU_FNS(X)                                                                          \
	X(cuInit)                                                                          \
	X(cuDriverGetVersion)                                                              \
	X(cuGetErrorString)                                                                \
	X(cuDeviceGetCount)                                                                \
	X(cuDeviceGet)                                                                     \
	X(cuDeviceGetName)                                                                 \
	X(cuDeviceGetAttribute)                                                            \
	X(cuDeviceGetPCIBusId)                                                             \
	X(cuDeviceTotalMem)                                                                \
	X(cuDevicePrimaryCtxRetain)                                                        \
	X(cuDevicePrimaryCtxRelease)                                                       \
	X(cuCtxSetCurrent)                                                                 \
	X(cuIpcOpenMemHandle)                                                              \
	X(cuIpcCloseMemHandle)                                                             \
	X(cuMemGetAddressRange)                                                            \
	X(cuMemImportFromShareableHandle)                                                  \
	X(cuMemAddressReserve)                                                             \
	X(cuMemAddressFree)                                                                \
	X(cuMemMap)                                                                        \
	X(cuMemUnmap)                                                                      \
	X(cuMemSetAccess)                                                                  \
	X(cuMemRelease)                                                                    \
	X(cuMemcpyDtoH)                                                                    \
	X(cuMemcpyHtoD)                                                                    \
	X(cuMemcpyDtoHAsync)                                                               \
	X(cuMemcpy2D)                                                                      \
	X(cuMemcpy2DAsync)                                                                 \
	X(cuStreamCreate)                                                                  \
	X(cuStreamSynchronize)                                                             \
	X(cuMemHostRegister)                                                               \
	X(cuMemHostUnregister)
/* Newer calls (GPUDirect RDMA): without them GPU regions are only staged. */
#define CU_OPT_FNS(X)                                                                      \
	X(cuMemGetHandleForAddressRange)                                                   \
	X(cuFlushGPUDirectRDMAWrites)

static struct {
#define DECL(fn) __typeof__(&fn) fn;
	CU_FNS(DECL)
	CU_OPT_FNS(DECL)
#undef DECL
} cu;

#define MAX_DEVS  64
#define MAX_POOLS 64

static void *lib;
static int ndevs = -1;
static int driver_version;
static CUcontext ctx[MAX_DEVS];
static uint64_t imported;
static struct {
	void *base;
	size_t len;
	bool pinned;
} pools[MAX_POOLS];
static unsigned npools;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread CUcontext cur_ctx;
/* Per thread and GPU: the stream asynchronous staging copies go on, and whether it has work. */
static __thread CUstream streams[MAX_DEVS];
static __thread uint64_t pending[MAX_DEVS / 64 + 1];

struct import {
	uint32_t kind;
	int device;
	CUdeviceptr base;
	uint64_t len;
	CUmemGenericAllocationHandle handle;
};

static const char *
cu_err(CUresult r)
{
	const char *s = NULL;

	if (cu.cuGetErrorString && cu.cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown CUDA error";
}

static int
pin_pool(unsigned i)
{
	CUresult r = cu.cuMemHostRegister(pools[i].base, pools[i].len, CU_MEMHOSTREGISTER_PORTABLE);

	if (r != CUDA_SUCCESS) {
		KVP_LOG(WARNING, core, "cannot pin the staging pool (%zu bytes): %s", pools[i].len,
			cu_err(r));
		return -ENOMEM;
	}
	pools[i].pinned = true;
	KVP_LOG(INFO, core, "staging pool pinned for DMA (%zu bytes)", pools[i].len);
	return 0;
}

/* Make the primary context of @p dev current on this thread (retaining it once). */
static int
use_device(int dev)
{
	CUdevice d;
	CUresult r;

	if (dev < 0 || dev >= ndevs || dev >= MAX_DEVS)
		return -ENODEV;
	if (!ctx[dev]) {
		r = cu.cuDeviceGet(&d, dev);
		if (r == CUDA_SUCCESS)
			r = cu.cuDevicePrimaryCtxRetain(&ctx[dev], d);
		if (r != CUDA_SUCCESS) {
			KVP_LOG(ERR, core, "GPU %d: no context: %s", dev, cu_err(r));
			return -ENODEV;
		}
		/* The first context exists: pin pools registered before it. */
		pthread_mutex_lock(&pool_lock);
		cu.cuCtxSetCurrent(ctx[dev]);
		cur_ctx = ctx[dev];
		for (unsigned i = 0; i < npools; i++)
			if (!pools[i].pinned)
				pin_pool(i);
		pthread_mutex_unlock(&pool_lock);
	}
	if (cur_ctx != ctx[dev]) {
		r = cu.cuCtxSetCurrent(ctx[dev]);
		if (r != CUDA_SUCCESS)
			return -ENODEV;
		cur_ctx = ctx[dev];
	}
	return 0;
}

static int
gpu_to_host(void *dst, const struct kvp_region *r, uint64_t off, size_t len)
{
	if (!(r->flags & KVP_REGION_F_GPU)) {
		return kvp_guard_copy(dst, r->base + off, len);
	}
	if (use_device(r->device) < 0)
		return -ENODEV;
	return cu.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)r->base + off, len) == CUDA_SUCCESS
		       ? 0
		       : -EIO;
}

/* Device-to-host on this thread's stream for the region's GPU; waited for by gpu_sync(). */
static int
gpu_to_host_async(void *dst, const struct kvp_region *r, uint64_t off, size_t len)
{
	int dev = r->device;

	if (!(r->flags & KVP_REGION_F_GPU)) {
		return kvp_guard_copy(dst, r->base + off, len);
	}
	if (use_device(dev) < 0)
		return -ENODEV;
	if (!streams[dev] && cu.cuStreamCreate(&streams[dev], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return -ENOMEM;
	if (cu.cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)r->base + off, len, streams[dev]) !=
	    CUDA_SUCCESS)
		return -EIO;
	pending[dev / 64] |= 1ull << (dev % 64);
	return 0;
}

/* CUDA's 2-D copies take pitches below 2^31 (CU_DEVICE_ATTRIBUTE_MAX_PITCH); larger ones loop. */
#define PITCH_MAX 0x7fffffffull

/* Rows of a GPU region (pitch apart) into packed host memory, on this thread's stream. */
static int
gpu_to_host_2d_async(void *dst, const struct kvp_region *r, uint64_t off, uint64_t pitch,
		     size_t width, size_t rows)
{
	int dev = r->device;

	if (!(r->flags & KVP_REGION_F_GPU) || pitch > PITCH_MAX) {
		for (size_t i = 0; i < rows; i++) {
			int rc = gpu_to_host_async((uint8_t *)dst + i * width, r, off + i * pitch, width);

			if (rc < 0)
				return rc;
		}
		return 0;
	}
	if (use_device(dev) < 0)
		return -ENODEV;
	if (!streams[dev] && cu.cuStreamCreate(&streams[dev], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return -ENOMEM;
	CUDA_MEMCPY2D c = {
		.srcMemoryType = CU_MEMORYTYPE_DEVICE,
		.srcDevice = (CUdeviceptr)(uintptr_t)r->base + off,
		.srcPitch = pitch,
		.dstMemoryType = CU_MEMORYTYPE_HOST,
		.dstHost = dst,
		.dstPitch = width,
		.WidthInBytes = width,
		.Height = rows,
	};
	if (cu.cuMemcpy2DAsync(&c, streams[dev]) != CUDA_SUCCESS)
		return -EIO;
	pending[dev / 64] |= 1ull << (dev % 64);
	return 0;
}

static int
gpu_from_host(const struct kvp_region *r, uint64_t off, const void *src, size_t len);

/* Packed host memory into rows of a GPU region, pitch apart: one copy, not one per row. */
static int
gpu_from_host_2d(const struct kvp_region *r, uint64_t off, uint64_t pitch, const void *src,
		 size_t width, size_t rows)
{
	if (!(r->flags & KVP_REGION_F_GPU) || pitch > PITCH_MAX) {
		for (size_t i = 0; i < rows; i++) {
			int rc = gpu_from_host(r, off + i * pitch, (const uint8_t *)src + i * width,
					       width);

			if (rc < 0)
				return rc;
		}
		return 0;
	}
	if (use_device(r->device) < 0)
		return -ENODEV;
	CUDA_MEMCPY2D c = {
		.srcMemoryType = CU_MEMORYTYPE_HOST,
		.srcHost = src,
		.srcPitch = width,
		.dstMemoryType = CU_MEMORYTYPE_DEVICE,
		.dstDevice = (CUdeviceptr)(uintptr_t)r->base + off,
		.dstPitch = pitch,
		.WidthInBytes = width,
		.Height = rows,
	};
	return cu.cuMemcpy2D(&c) == CUDA_SUCCESS ? 0 : -EIO;
}

static int
gpu_sync(void)
{
	int rc = 0;

	for (int w = 0; w < MAX_DEVS / 64 + 1; w++) {
		while (pending[w]) {
			int dev = w * 64 + __builtin_ctzll(pending[w]);

			pending[w] &= pending[w] - 1;
			if (use_device(dev) < 0 || cu.cuStreamSynchronize(streams[dev]) != CUDA_SUCCESS)
				rc = -EIO;
		}
	}
	return rc;
}

static int
gpu_from_host(const struct kvp_region *r, uint64_t off, const void *src, size_t len)
{
	if (!(r->flags & KVP_REGION_F_GPU)) {
		return kvp_guard_copy(r->base + off, src, len);
	}
	if (use_device(r->device) < 0)
		return -ENODEV;
	return cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)r->base + off, src, len) == CUDA_SUCCESS
		       ? 0
		       : -EIO;
}

/* Pools are pinned once: now if a context exists, else when the first one does. */
static int
gpu_register_pool(void *base, size_t len)
{
	int rc = 0;

	pthread_mutex_lock(&pool_lock);
	if (npools < MAX_POOLS) {
		pools[npools].base = base;
		pools[npools].len = len;
		pools[npools].pinned = false;
		npools++;
		for (int d = 0; d < ndevs && d < MAX_DEVS; d++) {
			if (ctx[d]) {
				cu.cuCtxSetCurrent(ctx[d]);
				rc = pin_pool(npools - 1);
				break;
			}
		}
	}
	pthread_mutex_unlock(&pool_lock);
	(void)rc; /* an unpinned pool still works, only slower: pin_pool() logged it */
	return 0;
}

static int gpu_import(uint32_t kind, int device, int fd, const uint8_t ipc[64], uint64_t offset,
		      uint64_t len, uint64_t *dptr, void **cookie, char *why, size_t whylen);

/*
 * GPUDirect RDMA: the region as a dma-buf for ibv_reg_dmabuf_mr. The driver
 * exports whole host pages, so the range is widened to them and the
 * region's offset inside returned.
 */
static int
gpu_dmabuf_fd(const struct kvp_region *r, int *fd, uint64_t *offset)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)r->base;
	CUdeviceptr lo = p & ~(CUdeviceptr)(page - 1);
	uint64_t hi = (p + r->len + page - 1) & ~(page - 1);
	int h = -1;

	if (!cu.cuMemGetHandleForAddressRange)
		return -EOPNOTSUPP;
	if (!(r->flags & KVP_REGION_F_GPU) || use_device(r->device) < 0)
		return -ENODEV;
	CUresult rc = cu.cuMemGetHandleForAddressRange(&h, lo, hi - lo,
						       CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (rc != CUDA_SUCCESS) {
		KVP_LOG_RL(INFO, core, "GPU %d: no dma-buf for %" PRIu64 " bytes: %s", r->device,
			   r->len, cu_err(rc));
		return -EOPNOTSUPP;
	}
	*fd = h;
	*offset = p - lo;
	return 0;
}

/* Before data written by the NIC into GPU memory is reported landed. */
static int
gpu_flush_writes(int device)
{
	if (!cu.cuFlushGPUDirectRDMAWrites)
		return 0; /* drivers before the call order GPUDirect writes themselves */
	if (use_device(device) < 0)
		return -ENODEV;
	return cu.cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
					     CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER) == CUDA_SUCCESS
		       ? 0
		       : -EIO;
}

static const struct kvp_memops cuda_memops = {
	.to_host = gpu_to_host,
	.to_host_async = gpu_to_host_async,
	.sync = gpu_sync,
	.from_host = gpu_from_host,
	.to_host_2d_async = gpu_to_host_2d_async,
	.from_host_2d = gpu_from_host_2d,
	.register_pool = gpu_register_pool,
	.import = gpu_import,
	.release = kvp_cuda_release,
	.dmabuf_fd = gpu_dmabuf_fd,
	.flush_writes = gpu_flush_writes,
};

int
kvp_cuda_init(char *why, size_t whylen)
{
	CUresult r;

	if (ndevs > 0)
		return ndevs;
	if (!lib) {
		lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
		if (!lib) {
			snprintf(why, whylen, "no CUDA driver (libcuda.so.1: %s)", dlerror());
			return -ENOENT;
		}
#define LOAD(fn)                                                                           \
	cu.fn = (__typeof__(cu.fn))dlsym(lib, XSTR(fn));                                   \
	if (!cu.fn) {                                                                      \
		snprintf(why, whylen, "CUDA driver lacks %s", XSTR(fn));                   \
		dlclose(lib);                                                              \
		lib = NULL;                                                                \
		return -ENOENT;                                                            \
	}
		CU_FNS(LOAD)
#undef LOAD
#define LOAD_OPT(fn) cu.fn = (__typeof__(cu.fn))dlsym(lib, XSTR(fn));
		CU_OPT_FNS(LOAD_OPT)
#undef LOAD_OPT
	}
	r = cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		snprintf(why, whylen, "cuInit failed: %s", cu_err(r));
		return -ENODEV;
	}
	cu.cuDriverGetVersion(&driver_version);
	int n = 0;
	if (cu.cuDeviceGetCount(&n) != CUDA_SUCCESS || n <= 0) {
		snprintf(why, whylen, "CUDA driver %d: no GPU", driver_version);
		return -ENODEV;
	}
	ndevs = n;
	kvp_memops = &cuda_memops;
	return n;
}

int
kvp_cuda_driver_version(void)
{
	return driver_version;
}

int
kvp_cuda_device(int ordinal, struct kvp_cuda_dev *out)
{
	CUdevice d;
	size_t total = 0;

	if (ndevs <= 0 || ordinal < 0 || ordinal >= ndevs ||
	    cu.cuDeviceGet(&d, ordinal) != CUDA_SUCCESS)
		return -ENODEV;
	memset(out, 0, sizeof(*out));
	out->ordinal = ordinal;
	cu.cuDeviceGetName(out->name, sizeof(out->name), d);
	cu.cuDeviceGetPCIBusId(out->pci, sizeof(out->pci), d);
	cu.cuDeviceGetAttribute(&out->dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d);
	cu.cuDeviceGetAttribute(&out->gpudirect_rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
				d);
	cu.cuDeviceTotalMem(&total, d);
	out->total_mem = total;
	return 0;
}

static int
import_vmm(struct import *im, int fd, char *why, size_t whylen)
{
	CUmemAccessDesc acc = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE,
					      .id = im->device },
				.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUresult r;

	r = cu.cuMemImportFromShareableHandle(&im->handle, (void *)(uintptr_t)fd,
					       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		snprintf(why, whylen, "cuMemImportFromShareableHandle: %s", cu_err(r));
		return -EINVAL;
	}
	r = cu.cuMemAddressReserve(&im->base, im->len, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		goto err_release;
	r = cu.cuMemMap(im->base, im->len, 0, im->handle, 0);
	if (r != CUDA_SUCCESS)
		goto err_free;
	r = cu.cuMemSetAccess(im->base, im->len, &acc, 1);
	if (r != CUDA_SUCCESS)
		goto err_unmap;
	return 0;
err_unmap:
	cu.cuMemUnmap(im->base, im->len);
err_free:
	cu.cuMemAddressFree(im->base, im->len);
err_release:
	snprintf(why, whylen, "cannot map the VMM allocation (%" PRIu64 " bytes; a multiple of "
		 "the allocation granularity?): %s", im->len, cu_err(r));
	cu.cuMemRelease(im->handle);
	return -EINVAL;
}

static int
gpu_import(uint32_t kind, int device, int fd, const uint8_t ipc[64], uint64_t offset,
	   uint64_t len, uint64_t *dptr, void **cookie, char *why, size_t whylen)
{
	return kvp_cuda_import(kind, device, fd, ipc, offset, len, dptr, cookie, why, whylen);
}

int
kvp_cuda_import(uint32_t flags, int device, int fd, const uint8_t ipc[64], uint64_t offset,
		uint64_t len, uint64_t *dptr, void **cookie, char *why, size_t whylen)
{
	struct import *im;
	int rc = kvp_cuda_init(why, whylen);

	if (rc < 0)
		return -ENODEV;
	if (use_device(device) < 0) {
		snprintf(why, whylen, "no GPU %d (this host has %d)", device, ndevs);
		return -ENODEV;
	}
	im = calloc(1, sizeof(*im));
	if (!im)
		return -ENOMEM;
	im->kind = flags;
	im->device = device;
	im->len = len;
	if (flags == KVP_REGION_CUDA_IPC) {
		CUipcMemHandle h;
		CUdeviceptr base = 0;
		size_t size = 0;

		memcpy(&h, ipc, sizeof(h));
		CUresult r = cu.cuIpcOpenMemHandle(&im->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		if (r != CUDA_SUCCESS) {
			snprintf(why, whylen, "cuIpcOpenMemHandle: %s", cu_err(r));
			free(im);
			return -EINVAL;
		}
		/* The handle names a whole allocation: the region must fit inside it. */
		if (cu.cuMemGetAddressRange(&base, &size, im->base) != CUDA_SUCCESS ||
		    offset > size || len > size - offset) {
			snprintf(why, whylen,
				 "region [%" PRIu64 ", +%" PRIu64 ") exceeds the allocation (%zu bytes)",
				 offset, len, size);
			cu.cuIpcCloseMemHandle(im->base);
			free(im);
			return -EINVAL;
		}
	} else {
		rc = import_vmm(im, fd, why, whylen);
		if (rc < 0) {
			free(im);
			return rc;
		}
	}
	imported += len;
	*dptr = im->base + (im->kind == KVP_REGION_CUDA_IPC ? offset : 0);
	*cookie = im;
	return 0;
}

void
kvp_cuda_release(void *cookie)
{
	struct import *im = cookie;

	if (!im)
		return;
	use_device(im->device);
	if (im->kind == KVP_REGION_CUDA_IPC) {
		cu.cuIpcCloseMemHandle(im->base);
	} else {
		cu.cuMemUnmap(im->base, im->len);
		cu.cuMemAddressFree(im->base, im->len);
		cu.cuMemRelease(im->handle);
	}
	imported -= im->len;
	free(im);
}

uint64_t
kvp_cuda_imported_bytes(void)
{
	return imported;
}

#endif /* KVP_HAVE_CUDA_H */
