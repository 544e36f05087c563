/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Benchmark, not a test: kvproxy's staging copies alone, with the wire
 * taken out. GPU memory is copied to (and from) a pinned staging pool
 * through the same memops the TCP transport uses (lib/cuda), at the
 * granularity the transport copies: contiguous 64 KiB KV pages gathered
 * into stage-buffer-sized copies, scattered 64 KiB pages one copy each, and
 * 4 MiB segments split at the buffer size. Compare with gpu_client
 * copybench (raw pinned cuMemcpyDtoHAsync) in the same run
 * (tools/bench/gpu_staging.sh does both).
 *
 *   kvp-stage-copy-bench [--buffer BYTES] [--size BYTES]
 */
#include <dlfcn.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>

#include "kvp_transport.h"
#include "kvp_cuda.h"
#include "kvp_test.h"

/* The few driver calls the region needs (lib/cuda has no allocator: clients allocate). */
static int
gpu_alloc(uint64_t len, uint64_t *dptr)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	int (*get)(int *, int), (*retain)(void **, int), (*set)(void *), (*alloc)(uint64_t *, size_t);
	void *ctx;
	int dev;

	if (!lib)
		return -1;
	*(void **)&get = dlsym(lib, "cuDeviceGet");
	*(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
	*(void **)&set = dlsym(lib, "cuCtxSetCurrent");
	*(void **)&alloc = dlsym(lib, "cuMemAlloc_v2");
	if (!get || !retain || !set || !alloc || get(&dev, 0) || retain(&ctx, dev) || set(ctx))
		return -1;
	return alloc(dptr, len) == 0 ? 0 : -1;
}

/*
 * Copy @p total bytes of @p r to the pool in @p unit-sized copies from
 * @p stride-spaced offsets; @p batch > 0: asynchronous copies with one wait
 * per @p batch, as the TCP sender does per fill pass.
 */
static double
run(const struct kvp_region *r, uint8_t *pool, uint64_t pool_len, uint64_t buf, uint64_t total,
    uint64_t unit, uint64_t stride, bool to_gpu, unsigned batch)
{
	uint64_t t0 = kvp_test_now_ns(), n = total / unit, slot = 0, nslots = pool_len / buf;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t off = (i * stride) % (r->len - unit + 1);
		uint8_t *dst = pool + (slot++ % nslots) * buf;
		int rc = to_gpu	 ? kvp_memops->from_host(r, off, dst, unit)
			 : batch ? kvp_memops->to_host_async(dst, r, off, unit)
				 : kvp_memops->to_host(dst, r, off, unit);
		if (rc == 0 && batch && ((i + 1) % batch == 0 || i + 1 == n))
			rc = kvp_memops->sync();
		if (rc < 0) {
			fprintf(stderr, "copy failed: %d\n", rc);
			exit(1);
		}
	}
	return (double)(n * unit) / ((double)(kvp_test_now_ns() - t0) / 1e9) / 1e9;
}

int
main(int argc, char **argv)
{
	uint64_t buf = 1 << 20, size = 1ull << 30, pool_len = 64u << 20, dptr;
	char why[160];
	int c;

	while ((c = getopt(argc, argv, "b:s:")) != -1) {
		if (c == 'b')
			buf = strtoull(optarg, NULL, 0);
		else if (c == 's')
			size = strtoull(optarg, NULL, 0);
		else
			return 2;
	}
	if (kvp_cuda_init(why, sizeof(why)) <= 0) {
		fprintf(stderr, "kvp-stage-copy-bench: SKIP: %s\n", why);
		return 77;
	}
	if (gpu_alloc(size, &dptr) < 0) {
		fprintf(stderr, "kvp-stage-copy-bench: cannot allocate %" PRIu64 " bytes of GPU memory\n",
			size);
		return 1;
	}
	uint8_t *pool = mmap(NULL, pool_len, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (pool == MAP_FAILED)
		return 1;
	kvp_memops->register_pool(pool, pool_len); /* pinned once, as kvproxyd does at start */
	struct kvp_region r = { .base = (uint8_t *)(uintptr_t)dptr, .len = size,
				.flags = KVP_REGION_F_GPU | KVP_REGION_F_STAGE, .device = 0 };
	const uint64_t page = 65536;
	/* GPUDirect's half that needs no NIC: the region as a dma-buf, and the write flush. */
	int fd = -1;
	uint64_t fd_off = 0;
	int rc = kvp_memops->dmabuf_fd ? kvp_memops->dmabuf_fd(&r, &fd, &fd_off) : -EOPNOTSUPP;
	printf("dma-buf export of the region (for ibv_reg_dmabuf_mr): %s (offset %" PRIu64 "); "
	       "GPUDirect write flush: %s\n",
	       rc == 0 ? "ok" : strerror(-rc), fd_off,
	       kvp_memops->flush_writes && kvp_memops->flush_writes(0) == 0 ? "ok" : "failed");
	if (fd >= 0)
		close(fd);
	/* warm-up: context, first touches */
	run(&r, pool, pool_len, buf, 64u << 20, buf, buf, false, 0);
	printf("staging copies alone, stage.buffer %" PRIu64 " bytes, %" PRIu64 " bytes each:\n", buf,
	       size);
	printf("  kv pages 64 KiB contiguous (gathered into %" PRIu64 "-byte copies): DtoH %.2f GB/s  HtoD %.2f GB/s\n",
	       buf, run(&r, pool, pool_len, buf, size, buf, buf, false, 0),
	       run(&r, pool, pool_len, buf, size, buf, buf, true, 0));
	printf("  kv pages 64 KiB scattered (one copy per page):                DtoH %.2f GB/s  HtoD %.2f GB/s\n",
	       run(&r, pool, pool_len, buf, size, page, 7 * page, false, 0),
	       run(&r, pool, pool_len, buf, size, page, 7 * page, true, 0));
	printf("  kv pages 64 KiB scattered, asynchronous, one wait per 16 pages:  DtoH %.2f GB/s\n",
	       run(&r, pool, pool_len, buf, size, page, 7 * page, false, 16));
	printf("  kv pages 64 KiB contiguous, asynchronous, one wait per 16 copies: DtoH %.2f GB/s\n",
	       run(&r, pool, pool_len, buf, size, buf, buf, false, 16));
	return 0;
}
