/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rdma_write_imm: the wire operation kvproxy's RDMA transport is built on,
 * run on two Soft-RoCE devices inside one guest (tools/rdma-vm.sh).
 *
 * rxe0 holds the source region, rxe1 the destination, registered for remote
 * write. Each device gets a PD, a CQ and an RC queue pair; the two QPs are
 * connected to each other in process (both devices live in this process, so
 * neither rdma_cm nor a socket is needed to swap QP numbers and GIDs). Each
 * round the sender writes the whole region in chunks, several in flight,
 * the last chunk as RDMA WRITE WITH IMMEDIATE. The receiver waits for that
 * immediate: RC delivers a QP's writes in order, so its completion promises
 * that every earlier chunk has landed. Then every byte is compared.
 *
 * It also checks that ibv_reg_dmabuf_mr() fails cleanly, with "not
 * supported", on rxe: that refusal is what sends GPU memory down the
 * staging path when GPUDirect RDMA is not available.
 *
 * The MB/s printed is for information only: under TCG it measures the
 * emulator. Nothing here asserts a rate.
 *
 * usage: rdma_write_imm [--size BYTES] [--chunk BYTES] [--rounds N]
 * Exit: 0 pass, 1 fail, 77 skipped (no RDMA devices, outside the VM).
 */
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "kvp_test.h"

#define EXIT_SKIP 77
#define SQ_DEPTH  16 /* writes in flight per round */
#define CQ_DEPTH  (2 * SQ_DEPTH)
#define WAIT_S    30.0        /* per completion; generous for TCG on a busy host */
#define IMM_TAG   0x4b560000u /* "KV" + round number */

/* One side of the connection: a device and everything opened on it. */
struct end {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
	size_t len;
	uint8_t port;
	enum ibv_mtu mtu;
	int gid_index;
	union ibv_gid gid;
	uint32_t psn;
};

static bool
gid_is_ipv4(const union ibv_gid *g)
{
	static const uint8_t prefix[12] = { [10] = 0xff, [11] = 0xff };

	return memcmp(g->raw, prefix, sizeof(prefix)) == 0;
}

static void
gid_str(const union ibv_gid *g, char *s, size_t n)
{
	if (gid_is_ipv4(g))
		snprintf(s, n, "::ffff:%u.%u.%u.%u", g->raw[12], g->raw[13], g->raw[14],
			 g->raw[15]);
	else
		snprintf(s, n, "%016" PRIx64 ":%016" PRIx64, be64toh(g->global.subnet_prefix),
			 be64toh(g->global.interface_id));
}

/*
 * Pick the RoCE v2 GID that carries the port's IPv4 address. The harness
 * exports the index it found in sysfs; without it, scan the table.
 */
static int
find_gid(struct end *e, int tbl_len)
{
	const char *env = getenv("KVP_RDMA_GID_INDEX");
	struct ibv_gid_entry ent;

	if (env && *env) {
		e->gid_index = atoi(env);
		if (ibv_query_gid(e->ctx, e->port, e->gid_index, &e->gid))
			return -errno;
		return 0;
	}
	for (int i = 0; i < tbl_len; i++) {
		if (ibv_query_gid_ex(e->ctx, e->port, (uint32_t)i, &ent, 0) != 0)
			continue; /* empty slot */
		if (ent.gid_type != IBV_GID_TYPE_ROCE_V2 || !gid_is_ipv4(&ent.gid))
			continue;
		e->gid_index = i;
		e->gid = ent.gid;
		return 0;
	}
	return -ENOENT;
}

static struct ibv_context *
open_by_name(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	if (!list)
		return NULL;
	errno = ENODEV;
	for (int i = 0; list[i]; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
			ctx = ibv_open_device(list[i]);
			break;
		}
	ibv_free_device_list(list);
	return ctx;
}

/* Open @p name and set up PD, buffer, MR (with @p access), CQ and an RC QP. */
static int
end_open(struct end *e, const char *name, size_t len, int access)
{
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = {
			.max_send_wr = SQ_DEPTH,
			.max_recv_wr = 4,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
	};
	struct ibv_port_attr pa;
	char gs[64];
	int ret;

	memset(e, 0, sizeof(*e));
	e->name = name;
	e->len = len;
	e->port = 1;
	e->psn = (uint32_t)lrand48() & 0xffffff;

	e->ctx = open_by_name(name);
	if (!e->ctx) {
		ret = -errno;
		printf("%s: cannot open: %s\n", name, strerror(errno));
		return ret;
	}
	if ((ret = ibv_query_port(e->ctx, e->port, &pa)) != 0) {
		printf("%s: ibv_query_port: %s\n", name, strerror(ret));
		ret = -ret;
		goto err_close;
	}
	if (pa.state != IBV_PORT_ACTIVE || pa.link_layer != IBV_LINK_LAYER_ETHERNET) {
		printf("%s: port %u is not an ACTIVE RoCE port (state %d, link layer %d)\n", name,
		       e->port, pa.state, pa.link_layer);
		ret = -ENETDOWN;
		goto err_close;
	}
	e->mtu = pa.active_mtu;
	if ((ret = find_gid(e, pa.gid_tbl_len)) != 0) {
		printf("%s: no IPv4 RoCE v2 GID: %s\n", name, strerror(-ret));
		goto err_close;
	}
	gid_str(&e->gid, gs, sizeof(gs));
	printf("%s: port %u ACTIVE, MTU %d, GID[%d] %s\n", name, e->port, 128 << e->mtu,
	       e->gid_index, gs);

	e->pd = ibv_alloc_pd(e->ctx);
	if (!e->pd) {
		ret = -errno;
		printf("%s: ibv_alloc_pd: %s\n", name, strerror(errno));
		goto err_close;
	}
	e->buf = aligned_alloc(4096, len);
	if (!e->buf) {
		ret = -ENOMEM;
		goto err_dealloc_pd;
	}
	memset(e->buf, 0, len);
	e->mr = ibv_reg_mr(e->pd, e->buf, len, access);
	if (!e->mr) {
		ret = -errno;
		printf("%s: ibv_reg_mr(%zu bytes): %s\n", name, len, strerror(errno));
		goto err_free_buf;
	}
	e->cq = ibv_create_cq(e->ctx, CQ_DEPTH, NULL, NULL, 0);
	if (!e->cq) {
		ret = -errno;
		printf("%s: ibv_create_cq: %s\n", name, strerror(errno));
		goto err_dereg_mr;
	}
	qa.send_cq = e->cq;
	qa.recv_cq = e->cq;
	e->qp = ibv_create_qp(e->pd, &qa);
	if (!e->qp) {
		ret = -errno;
		printf("%s: ibv_create_qp: %s\n", name, strerror(errno));
		goto err_destroy_cq;
	}
	return 0;

err_destroy_cq:
	ibv_destroy_cq(e->cq);
err_dereg_mr:
	ibv_dereg_mr(e->mr);
err_free_buf:
	free(e->buf);
err_dealloc_pd:
	ibv_dealloc_pd(e->pd);
err_close:
	ibv_close_device(e->ctx);
	memset(e, 0, sizeof(*e));
	return ret;
}

static void
end_close(struct end *e)
{
	if (!e->ctx)
		return;
	ibv_destroy_qp(e->qp);
	ibv_destroy_cq(e->cq);
	ibv_dereg_mr(e->mr);
	free(e->buf);
	ibv_dealloc_pd(e->pd);
	ibv_close_device(e->ctx);
	memset(e, 0, sizeof(*e));
}

/* RESET -> INIT -> RTR -> RTS, aimed at @p peer. */
static int
end_connect(struct end *e, const struct end *peer)
{
	enum ibv_mtu mtu = e->mtu < peer->mtu ? e->mtu : peer->mtu;
	struct ibv_qp_attr init = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = e->port,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	struct ibv_qp_attr rtr = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu,
		.dest_qp_num = peer->qp->qp_num,
		.rq_psn = peer->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			/* RoCE addresses by GID; there are no LIDs */
			.is_global = 1,
			.port_num = e->port,
			.grh = {
				.dgid = peer->gid,
				.sgid_index = (uint8_t)e->gid_index,
				.hop_limit = 64,
			},
		},
	};
	struct ibv_qp_attr rts = {
		.qp_state = IBV_QPS_RTS,
		.sq_psn = e->psn,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.max_rd_atomic = 1,
	};
	int ret;

	/* ibv_modify_qp returns a positive errno */
	ret = ibv_modify_qp(e->qp, &init,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (ret) {
		printf("%s: QP to INIT: %s\n", e->name, strerror(ret));
		return -ret;
	}
	ret = ibv_modify_qp(e->qp, &rtr,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER);
	if (ret) {
		printf("%s: QP to RTR: %s\n", e->name, strerror(ret));
		return -ret;
	}
	ret = ibv_modify_qp(e->qp, &rts,
			    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				    IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
	if (ret) {
		printf("%s: QP to RTS: %s\n", e->name, strerror(ret));
		return -ret;
	}
	return 0;
}

/*
 * Wait for one completion. Spins a little, then naps: rxe does its work in
 * the guest kernel, which a pure busy-poll would starve on 2 vCPUs.
 */
static int
wait_wc(const struct end *e, struct ibv_wc *wc)
{
	double deadline = kvp_test_now_s() + WAIT_S;
	struct timespec nap = { .tv_nsec = 20 * 1000 };

	for (unsigned spins = 0;; spins++) {
		int n = ibv_poll_cq(e->cq, 1, wc);

		if (n < 0) {
			printf("%s: ibv_poll_cq failed (%d)\n", e->name, n);
			return -EIO;
		}
		if (n == 1)
			return 0;
		if (kvp_test_now_s() > deadline) {
			struct ibv_qp_attr a;
			struct ibv_qp_init_attr ia;

			ibv_query_qp(e->qp, &a, IBV_QP_STATE, &ia);
			printf("%s: no completion within %.0f s (QP state %d)\n", e->name, WAIT_S,
			       a.qp_state);
			return -ETIMEDOUT;
		}
		if (spins > 100)
			nanosleep(&nap, NULL);
	}
}

static int
verify(const struct end *src, const struct end *dst)
{
	size_t first = 0;
	uint64_t bad = kvp_test_bytes_diff(src->buf, dst->buf, src->len, &first);

	if (bad == 0)
		return 0;
	printf("FAIL: %" PRIu64 " of %zu bytes differ; first at offset %zu (0x%02x sent, 0x%02x "
	       "landed)\n",
	       bad, src->len, first, src->buf[first], dst->buf[first]);
	return -EIO;
}

/* One round: write all of src into dst, the last chunk with an immediate. */
static int
run_round(struct end *s, struct end *r, unsigned round, size_t chunk, double *busy_s)
{
	size_t nchunks = (s->len + chunk - 1) / chunk;
	size_t posted = 0, reaped = 0;
	uint32_t imm = IMM_TAG | (round & 0xffff);
	struct ibv_recv_wr rwr = { .wr_id = round, .num_sge = 0 }, *bad_rwr;
	struct ibv_wc wc;
	double t0;
	int ret;

	/* Per-round content, so that stale data from a previous round shows. */
	kvp_test_pattern_fill(round + 1, 0, s->buf, s->len);
	memset(r->buf, 0xa5 ^ (int)round, r->len);

	/* WRITE WITH IMM consumes a receive; it carries no payload into it */
	if ((ret = ibv_post_recv(r->qp, &rwr, &bad_rwr)) != 0) {
		printf("FAIL: ibv_post_recv: %s\n", strerror(ret));
		return -ret;
	}
	t0 = kvp_test_now_s();
	while (reaped < nchunks) {
		while (posted < nchunks && posted - reaped < SQ_DEPTH) {
			size_t off = posted * chunk;
			bool last = posted == nchunks - 1;
			struct ibv_sge sge = {
				.addr = (uintptr_t)(s->buf + off),
				.length = (uint32_t)(last ? s->len - off : chunk),
				.lkey = s->mr->lkey,
			};
			struct ibv_send_wr wr = {
				.wr_id = posted,
				.sg_list = &sge,
				.num_sge = 1,
				.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED,
				.imm_data = htobe32(imm),
				.wr.rdma = {
					.remote_addr = (uintptr_t)(r->buf + off),
					.rkey = r->mr->rkey,
				},
			}, *bad_wr;

			if ((ret = ibv_post_send(s->qp, &wr, &bad_wr)) != 0) {
				printf("FAIL: ibv_post_send (chunk %zu): %s\n", posted,
				       strerror(ret));
				return -ret;
			}
			posted++;
		}
		if ((ret = wait_wc(s, &wc)) != 0)
			return ret;
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RDMA_WRITE) {
			printf("FAIL: sender completion %" PRIu64 ": %s, opcode %d\n", wc.wr_id,
			       ibv_wc_status_str(wc.status), wc.opcode);
			return -EIO;
		}
		reaped++;
	}
	if ((ret = wait_wc(r, &wc)) != 0)
		return ret;
	*busy_s += kvp_test_now_s() - t0;
	if (wc.status != IBV_WC_SUCCESS) {
		printf("FAIL: receiver completion: %s\n", ibv_wc_status_str(wc.status));
		return -EIO;
	}
	if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM)) {
		printf("FAIL: receiver completion opcode %d flags 0x%x, expected RECV_RDMA_WITH_IMM\n",
		       wc.opcode, wc.wc_flags);
		return -EIO;
	}
	if (be32toh(wc.imm_data) != imm) {
		printf("FAIL: immediate 0x%08x, expected 0x%08x\n", be32toh(wc.imm_data), imm);
		return -EIO;
	}
	if ((ret = verify(s, r)) != 0)
		return ret;
	printf("round %u: %zu chunks of %zu bytes landed, immediate 0x%08x (byte_len %u), all %zu bytes match\n",
	       round, nchunks, chunk, imm, wc.byte_len, s->len);
	return 0;
}

/*
 * GPU memory reaches a NIC through ibv_reg_dmabuf_mr(). rxe cannot do that;
 * it must say "not supported" (and not crash or succeed), which is the
 * signal to fall back to staging. A memfd stands in for the dma-buf: a
 * provider that does support dma-buf would reject it with a different error.
 */
static int
check_dmabuf_refused(const struct end *e)
{
	const size_t len = 1 << 20;
	struct ibv_mr *mr;
	int fd, err;

	fd = memfd_create("kvp-not-a-dmabuf", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
		printf("FAIL: memfd: %s\n", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	errno = 0;
	mr = ibv_reg_dmabuf_mr(e->pd, 0, len, 0, fd,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	err = errno;
	close(fd);
	if (mr) {
		ibv_dereg_mr(mr);
		printf("FAIL: %s: ibv_reg_dmabuf_mr succeeded on a memfd\n", e->name);
		return -EPROTO;
	}
	if (err != EOPNOTSUPP && err != ENOSYS && err != EPROTONOSUPPORT) {
		printf("FAIL: %s: ibv_reg_dmabuf_mr failed with %s (%d), expected EOPNOTSUPP\n",
		       e->name, strerror(err), err);
		return -EPROTO;
	}
	printf("%s: ibv_reg_dmabuf_mr refused cleanly: %s (the GPUDirect fallback trigger)\n",
	       e->name, strerror(err));
	return 0;
}

/* BYTES with an optional k, m or g suffix; 0 if it is not one. */
static size_t
parse_size(const char *s)
{
	uint64_t v = 0;

	return kvp_test_parse_u64(s, &v) == 0 ? (size_t)v : 0;
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "size", required_argument, NULL, 's' },
		{ "chunk", required_argument, NULL, 'c' },
		{ "rounds", required_argument, NULL, 'r' },
		{ NULL, 0, NULL, 0 },
	};
	const char *dev0 = getenv("KVP_RDMA_DEV0"), *dev1 = getenv("KVP_RDMA_DEV1");
	size_t size = 4u << 20, chunk = 256u << 10;
	unsigned rounds = 3;
	struct end src, dst;
	double busy_s = 0;
	int opt, ret, fails = 0;

	while ((opt = getopt_long(argc, argv, "s:c:r:", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			size = parse_size(optarg);
			break;
		case 'c':
			chunk = parse_size(optarg);
			break;
		case 'r':
			rounds = (unsigned)atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: %s [--size BYTES] [--chunk BYTES] [--rounds N]\n",
				argv[0]);
			return 2;
		}
	}
	if (size == 0 || chunk == 0 || rounds == 0 || size > (1ull << 30) || chunk > (1u << 30)) {
		fprintf(stderr, "%s: size, chunk and rounds must be positive (size <= 1 GiB)\n",
			argv[0]);
		return 2;
	}
	if (!dev0 || !*dev0)
		dev0 = "rxe0";
	if (!dev1 || !*dev1)
		dev1 = "rxe1";
	srand48((long)getpid() ^ (long)time(NULL));
	setvbuf(stdout, NULL, _IOLBF, 0);

	if ((ret = end_open(&src, dev0, size, IBV_ACCESS_LOCAL_WRITE)) != 0) {
		if (!getenv("KVP_RDMA_VM")) {
			printf("SKIP: cannot open %s here; run it through tools/rdma-vm.sh\n",
			       dev0);
			return EXIT_SKIP;
		}
		printf("FAIL: cannot set up %s\n", dev0);
		return 1;
	}
	if ((ret = end_open(&dst, dev1, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) !=
	    0) {
		printf("FAIL: cannot set up %s\n", dev1);
		goto out_close_src;
	}
	if ((ret = end_connect(&src, &dst)) != 0 || (ret = end_connect(&dst, &src)) != 0) {
		printf("FAIL: cannot connect the queue pairs\n");
		goto out_close_dst;
	}
	printf("connected: %s QP %u -> %s QP %u; %zu bytes per round in %zu-byte chunks, %d in flight\n",
	       dev0, src.qp->qp_num, dev1, dst.qp->qp_num, size, chunk, SQ_DEPTH);

	for (unsigned i = 0; i < rounds; i++) {
		if ((ret = run_round(&src, &dst, i, chunk, &busy_s)) != 0)
			goto out_close_dst;
	}
	printf("throughput (informational, emulated): %.1f MB/s over %u x %zu bytes in %.3f s\n",
	       (double)size * rounds / busy_s / 1e6, rounds, size, busy_s);

	fails += check_dmabuf_refused(&src) != 0;
	fails += check_dmabuf_refused(&dst) != 0;
	ret = fails ? -EPROTO : 0;

out_close_dst:
	end_close(&dst);
out_close_src:
	end_close(&src);
	printf("%s\n", ret == 0 ? "PASS" : "FAIL");
	return ret == 0 ? 0 : 1;
}
