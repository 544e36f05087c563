/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU client for the gpu suite and the staging benchmark: KV pages in GPU
 * memory, registered with kvproxyd by CUDA IPC handle or VMM POSIX fd.
 *
 *   gpu_client probe                       exit 0 if a GPU is usable, 77 if not
 *   gpu_client decode  -s SOCK -k KEYFILE -n BYTES [--vmm] [--seed S] [--timeout SEC]
 *   gpu_client prefill -s SOCK -k KEYFILE -n BYTES -p PEER [--vmm] [--seed S]
 *                      [--page BYTES] [--pages-per-xfer N] [--inflight N] [--timeout-ms MS]
 *                      [--expect ok|fail]
 *   gpu_client copybench                   raw pinned cuMemcpyDtoHAsync rates (reference)
 *
 * The driver API is loaded with dlopen so that the binary runs (and skips
 * with 77) where there is no GPU. Data: byte o of the transfer is a function
 * of (seed, o) (kvp_test_pattern_fill()); decode copies its region back
 * and checks every byte.
 */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include "kvp_test.h"
#include "kvproxy.h"

#define XSTR(x) STR(x)
#define STR(x)	#x
#define CU_FNS(X)                                                                          \
	X(cuInit)                                                                          \
	X(cuDeviceGet)                                                                     \
	X(cuDevicePrimaryCtxRetain)                                                        \
	X(cuCtxSetCurrent)                                                                 \
	X(cuMemAlloc)                                                                      \
	X(cuMemFree)                                                                       \
	X(cuMemcpyHtoD)                                                                    \
	X(cuMemcpyDtoH)                                                                    \
	X(cuMemcpyDtoHAsync)                                                               \
	X(cuMemsetD8)                                                                      \
	X(cuIpcGetMemHandle)                                                               \
	X(cuMemGetAllocationGranularity)                                                   \
	X(cuMemCreate)                                                                     \
	X(cuMemExportToShareableHandle)                                                    \
	X(cuMemAddressReserve)                                                             \
	X(cuMemMap)                                                                        \
	X(cuMemSetAccess)                                                                  \
	X(cuMemHostAlloc)                                                                  \
	X(cuStreamCreate)                                                                  \
	X(cuStreamSynchronize)

static struct {
#define DECL(fn) __typeof__(&fn) fn;
	CU_FNS(DECL)
#undef DECL
} cu;

#define CK(call)                                                                           \
	do {                                                                               \
		CUresult r_ = (call);                                                      \
		if (r_ != CUDA_SUCCESS) {                                                  \
			fprintf(stderr, "gpu_client: %s failed: %d\n", #call, (int)r_);    \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static int
cuda_load(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	CUdevice d;
	CUcontext ctx;

	if (!lib) {
		fprintf(stderr, "gpu_client: SKIP: no CUDA driver (%s)\n", dlerror());
		return 77;
	}
#define LOAD(fn)                                                                           \
	if (!(cu.fn = (__typeof__(cu.fn))dlsym(lib, XSTR(fn)))) {                         \
		fprintf(stderr, "gpu_client: driver lacks %s\n", XSTR(fn));                \
		return 1;                                                                  \
	}
	CU_FNS(LOAD)
#undef LOAD
	if (cu.cuInit(0) != CUDA_SUCCESS || cu.cuDeviceGet(&d, 0) != CUDA_SUCCESS) {
		fprintf(stderr, "gpu_client: SKIP: no usable GPU (cuInit/cuDeviceGet failed)\n");
		return 77;
	}
	CK(cu.cuDevicePrimaryCtxRetain(&ctx, d));
	CK(cu.cuCtxSetCurrent(ctx));
	return 0;
}

struct gpu_mem {
	CUdeviceptr ptr;
	uint64_t len;
	int fd; /* VMM export, -1 for cuMemAlloc memory */
};

static void
gpu_alloc(struct gpu_mem *m, uint64_t len, int vmm)
{
	m->fd = -1;
	m->len = len;
	if (!vmm) {
		CK(cu.cuMemAlloc(&m->ptr, len));
		return;
	}
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
	};
	CUmemAccessDesc acc = { .location = prop.location,
				.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUmemGenericAllocationHandle h;
	size_t gran = 0;

	CK(cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	m->len = (len + gran - 1) / gran * gran;
	CK(cu.cuMemCreate(&h, m->len, &prop, 0));
	CK(cu.cuMemAddressReserve(&m->ptr, m->len, 0, 0, 0));
	CK(cu.cuMemMap(m->ptr, m->len, 0, h, 0));
	CK(cu.cuMemSetAccess(m->ptr, m->len, &acc, 1));
	CK(cu.cuMemExportToShareableHandle(&m->fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}

static uint64_t
gpu_register(struct kvp_client *c, struct gpu_mem *m)
{
	uint64_t key;
	int rc;

	if (m->fd >= 0) {
		rc = kvp_region_register_cuda_fd(c, m->fd, m->len, 0, &key);
	} else {
		CUipcMemHandle h;

		CK(cu.cuIpcGetMemHandle(&h, m->ptr));
		rc = kvp_region_register_cuda_ipc(c, &h, 0, m->len, 0, &key);
	}
	if (rc < 0) {
		fprintf(stderr, "gpu_client: register GPU region: %s (%s)\n", strerror(-rc),
			kvp_last_error(c));
		exit(1);
	}
	return key;
}

struct opts {
	const char *sock, *keyfile, *peer, *expect;
	uint64_t size, page, seed, timeout_ms;
	unsigned per_xfer, inflight;
	double timeout_s;
	int vmm;
};

static struct kvp_client *
connect_or_die(const struct opts *o)
{
	struct kvp_client *c;
	int rc = kvp_connect(o->sock, 0, 0, &c);

	if (rc < 0) {
		fprintf(stderr, "gpu_client: connect %s: %s\n", o->sock, strerror(-rc));
		exit(1);
	}
	return c;
}

static int
cmd_decode(const struct opts *o)
{
	struct kvp_client *c = connect_or_die(o);
	struct gpu_mem m;
	struct kvp_cqe cq[64];
	uint64_t got = 0, deadline = kvp_test_now_ns() + (uint64_t)(o->timeout_s * 1e9);

	gpu_alloc(&m, o->size, o->vmm);
	CK(cu.cuMemsetD8(m.ptr, 0, m.len));
	uint64_t key = gpu_register(c, &m);
	int rc = kvp_test_key_write(o->keyfile, key);
	if (rc < 0) {
		fprintf(stderr, "gpu_client: key file: %s\n", strerror(-rc));
		return 1;
	}
	while (got < o->size) {
		if (kvp_test_now_ns() > deadline) {
			fprintf(stderr, "gpu_client: timed out: %" PRIu64 " of %" PRIu64 " bytes\n",
				got, o->size);
			return 1;
		}
		int n = kvp_wait(c, cq, 64, 500);

		if (n < 0) {
			fprintf(stderr, "gpu_client: wait: %s\n", strerror(-n));
			return 1;
		}
		for (int i = 0; i < n; i++)
			if (cq[i].kind == KVP_CQE_LANDED)
				got += cq[i].bytes;
	}
	uint8_t *host = malloc(o->size);
	CK(cu.cuMemcpyDtoH(host, m.ptr, o->size));
	uint64_t bad = kvp_test_pattern_check(o->seed, 0, host, o->size, NULL);
	printf("decode: %" PRIu64 " bytes landed in GPU memory (%s), %" PRIu64 " mismatches\n",
	       got, o->vmm ? "VMM fd" : "IPC handle", bad);
	unlink(o->keyfile);
	kvp_close(c);
	return bad ? 1 : 0;
}

static uint64_t
read_key(const char *path, double wait_s)
{
	uint64_t key = 0;

	/* Polling for the file is the bootstrap here, not synchronisation of kvproxy. */
	if (kvp_test_key_read(path, wait_s, &key) < 0) {
		fprintf(stderr, "gpu_client: no key in %s\n", path);
		exit(1);
	}
	return key;
}

static int
cmd_prefill(const struct opts *o)
{
	struct kvp_client *c = connect_or_die(o);
	struct gpu_mem m;
	uint16_t peer;

	gpu_alloc(&m, o->size, o->vmm);
	uint8_t *host = malloc(o->size);
	kvp_test_pattern_fill(o->seed, 0, host, o->size);
	CK(cu.cuMemcpyHtoD(m.ptr, host, o->size));
	free(host);
	uint64_t src = gpu_register(c, &m), dst = read_key(o->keyfile, 60);
	if (kvp_peer_lookup(c, o->peer, &peer) < 0) {
		fprintf(stderr, "gpu_client: peer %s: %s\n", o->peer, kvp_last_error(c));
		return 1;
	}
	uint64_t npages = (o->size + o->page - 1) / o->page;
	uint64_t nx = (npages + o->per_xfer - 1) / o->per_xfer, sent = 0, done = 0, ok = 0;
	struct kvp_segment *segs = calloc(o->per_xfer, sizeof(*segs));
	struct kvp_cqe cq[64];
	uint64_t t0 = kvp_test_now_ns();

	while (done < nx) {
		while (sent < nx && sent - done < o->inflight) {
			uint32_t n = 0;

			for (uint64_t p = sent * o->per_xfer; p < npages && n < o->per_xfer; p++, n++) {
				uint64_t off = p * o->page;

				segs[n] = (struct kvp_segment){ src, off, dst, off,
								o->size - off < o->page ? o->size - off
											: o->page };
			}
			struct kvp_xfer_desc x = { .user_id = sent, .peer = peer,
						   .timeout_ns = o->timeout_ms * 1000000 };
			int rc = kvp_submit(c, &x, segs, n);
			if (rc == -EAGAIN)
				break;
			if (rc < 0) {
				fprintf(stderr, "gpu_client: submit: %s\n", strerror(-rc));
				return 1;
			}
			sent++;
		}
		int n = kvp_wait(c, cq, 64, 1000);
		if (n < 0) {
			fprintf(stderr, "gpu_client: wait: %s\n", strerror(-n));
			return 1;
		}
		for (int i = 0; i < n; i++) {
			if (cq[i].kind != KVP_CQE_DONE)
				continue;
			done++;
			ok += cq[i].status == KVP_OK;
			if (cq[i].status != KVP_OK)
				fprintf(stderr, "gpu_client: transfer %" PRIu64 ": %s\n", cq[i].user_id,
					kvp_status_str(cq[i].status));
		}
	}
	uint64_t t1 = kvp_test_now_ns();
	double s = (double)(t1 - t0) / 1e9;
	/* For benchmarks that add several clients' runs up (CLOCK_MONOTONIC); the summary stays last. */
	printf("prefill-clock: start_ns %" PRIu64 " end_ns %" PRIu64 "\n", t0, t1);
	printf("prefill: %" PRIu64 " transfers (%" PRIu64 " ok) of %" PRIu64 "-byte pages, %" PRIu64
	       " bytes from GPU memory (%s) in %.3f s: %.2f GB/s\n",
	       nx, ok, o->page, o->size, o->vmm ? "VMM fd" : "IPC handle", s,
	       (double)o->size / s / 1e9);
	kvp_close(c);
	if (strcmp(o->expect, "fail") == 0)
		return ok < nx ? 0 : 1;
	return ok == nx ? 0 : 1;
}

/* Reference: pinned device-to-host copies of one size, back to back on one stream. */
static int
cmd_copybench(void)
{
	static const uint64_t sizes[] = { 65536, 4194304 };
	const uint64_t total = 1ull << 30;
	CUdeviceptr d;
	void *h;
	CUstream st;

	CK(cu.cuMemAlloc(&d, total));
	CK(cu.cuMemHostAlloc(&h, total, CU_MEMHOSTALLOC_PORTABLE));
	CK(cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	for (unsigned k = 0; k < 2; k++) {
		for (int rep = 0; rep < 2; rep++) {
			uint64_t t0 = kvp_test_now_ns();

			for (uint64_t off = 0; off < total; off += sizes[k])
				CK(cu.cuMemcpyDtoHAsync((uint8_t *)h + off, d + off, sizes[k], st));
			CK(cu.cuStreamSynchronize(st));
			if (rep == 1)
				printf("copybench: pinned DtoH %" PRIu64
				       "-byte copies: %.2f GB/s\n",
				       sizes[k],
				       (double)total / ((double)(kvp_test_now_ns() - t0) / 1e9) /
					       1e9);
		}
	}
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "vmm", no_argument, NULL, 'V' },	  { "seed", required_argument, NULL, 'S' },
		{ "timeout", required_argument, NULL, 'T' }, { "page", required_argument, NULL, 'P' },
		{ "pages-per-xfer", required_argument, NULL, 'X' },
		{ "inflight", required_argument, NULL, 'I' },
		{ "timeout-ms", required_argument, NULL, 'M' },
		{ "expect", required_argument, NULL, 'E' }, { NULL, 0, NULL, 0 },
	};
	struct opts o = { .page = 65536, .seed = 1, .per_xfer = 256, .inflight = 8,
			  .timeout_s = 120, .expect = "ok" };
	int opt, rc;

	if (argc < 2) {
		fprintf(stderr, "usage: see the header of tests/gpu/gpu_client.c\n");
		return 2;
	}
	const char *cmd = argv[1];
	optind = 2;
	while ((opt = getopt_long(argc, argv, "s:k:n:p:", lo, NULL)) != -1) {
		switch (opt) {
		case 's': o.sock = optarg; break;
		case 'k': o.keyfile = optarg; break;
		case 'n': o.size = strtoull(optarg, NULL, 0); break;
		case 'p': o.peer = optarg; break;
		case 'V': o.vmm = 1; break;
		case 'S': o.seed = strtoull(optarg, NULL, 0); break;
		case 'T': o.timeout_s = atof(optarg); break;
		case 'P': o.page = strtoull(optarg, NULL, 0); break;
		case 'X': o.per_xfer = (unsigned)atoi(optarg); break;
		case 'I': o.inflight = (unsigned)atoi(optarg); break;
		case 'M': o.timeout_ms = strtoull(optarg, NULL, 0); break;
		case 'E': o.expect = optarg; break;
		default: return 2;
		}
	}
	rc = cuda_load();
	if (rc)
		return rc;
	if (strcmp(cmd, "probe") == 0)
		return 0;
	if (strcmp(cmd, "copybench") == 0)
		return cmd_copybench();
	if (!o.sock || !o.keyfile || !o.size || o.page == 0 || o.per_xfer == 0) {
		fprintf(stderr, "gpu_client: need -s SOCK -k KEYFILE -n BYTES\n");
		return 2;
	}
	if (strcmp(cmd, "decode") == 0)
		return cmd_decode(&o);
	if (strcmp(cmd, "prefill") == 0 && o.peer)
		return cmd_prefill(&o);
	fprintf(stderr, "gpu_client: unknown command or missing -p PEER\n");
	return 2;
}
