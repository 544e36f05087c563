/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp-tcp-stream: one plain TCP stream, the reference for kvproxy's large
 * blocks at a chosen memory footprint.
 *
 *   sink    listens, and for each connection (one at a time, until killed)
 *           recv()s into its buffer until the sender closes
 *   source  connects, send()s --warmup bytes and then --total bytes from
 *           its buffer, closes its side and waits for the sink to close:
 *           Gbit/s of --total from the end of the warm-up to the sink's
 *           close (every byte was read by then)
 *
 * Each side's buffer is --span bytes, walked cyclically in --chunk pieces.
 * The span is the footprint: iperf3 -l 1M (and ucx_perftest) send one
 * 1 MiB buffer again and again and read into one, so their bytes stay in
 * the CPU caches; kvproxy-bench moves distinct bytes from a --size region
 * to a --size region. --span 1m measures the former, --span = --size the
 * latter. The buffers are the memory kvproxy's clients register (a memfd
 * mapped shared, as kvp_host_alloc() makes it), populated and written
 * before timing, so no page fault is timed.
 *
 * Sockets as kvproxyd's peer links: TCP_NODELAY, blocking, the kernel's
 * buffer autotuning; --cc sets TCP_CONGESTION. The source also reports its
 * socket's TCP_INFO (retransmissions, reordering, time limited by the
 * receive window or the send buffer), which says why a stream retransmits.
 */
#include <arpa/inet.h>
#include <err.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvp_test.h"

/* "kvp-tcp-stream: message" and exit 1 (glibc err.h). */
#define die(...) errx(1, __VA_ARGS__)

#define DEF_CHUNK (1ull << 20)

struct opts {
	const char *addr; /* IPV4:PORT: sink listens, source connects */
	const char *cc;   /* TCP_CONGESTION, NULL: the namespace's default */
	uint64_t span;
	uint64_t total;
	uint64_t warmup; /* source: bytes sent before the timing starts */
	uint64_t chunk;
	bool json;
};

struct buf {
	uint8_t *mem;
	uint64_t span;
	uint64_t off; /* where the next piece starts */
};

/* The span, in the memory kvproxy's clients register, resident and written. */
static void
buf_open(struct buf *b, uint64_t span)
{
	int fd = memfd_create("kvp-tcp-stream", MFD_CLOEXEC);

	if (fd < 0 || ftruncate(fd, (off_t)span) < 0)
		err(1, "memfd of %" PRIu64 " bytes", span);
	b->mem = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (b->mem == MAP_FAILED)
		err(1, "mapping %" PRIu64 " bytes", span);
	close(fd);
	/* MAP_POPULATE maps the pages; writing them makes sure none is faulted in while timed. */
	kvp_test_pattern_fill(0x6b7670, 0, b->mem, span);
	b->span = span;
	b->off = 0;
}

/* Length of the next piece: up to @p chunk, never past the span's end nor @p left. */
static size_t
piece(const struct buf *b, uint64_t chunk, uint64_t left)
{
	uint64_t n = b->span - b->off;

	n = n < chunk ? n : chunk;
	return (size_t)(n < left ? n : left);
}

static void
advance(struct buf *b, size_t n)
{
	b->off += n;
	if (b->off == b->span)
		b->off = 0;
}

/* As kvproxyd sets its peer links (peer_hand_over()), plus --cc. */
static void
sock_setup(int fd, const struct opts *o)
{
	int one = 1;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
		err(1, "TCP_NODELAY");
	if (o->cc &&
	    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, o->cc, (socklen_t)strlen(o->cc)) < 0)
		err(1, "TCP_CONGESTION %s", o->cc);
}

static void
sock_names(int fd, char *cc, size_t cc_len, int *sndbuf, int *rcvbuf)
{
	socklen_t l = (socklen_t)cc_len;

	memset(cc, 0, cc_len);
	if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &l) < 0)
		snprintf(cc, cc_len, "?");
	cc[cc_len - 1] = '\0';
	l = sizeof(*sndbuf);
	if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, sndbuf, &l) < 0)
		*sndbuf = -1;
	l = sizeof(*rcvbuf);
	if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, rcvbuf, &l) < 0)
		*rcvbuf = -1;
}

static double
gbps(uint64_t bytes, uint64_t ns)
{
	return ns ? (double)bytes * 8 / (double)ns : 0;
}

/* ---- sink ---- */

static int
cmd_sink(const struct opts *o)
{
	struct sockaddr_in sa;
	struct buf b;
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (kvp_test_parse_ipv4(o->addr, &sa) < 0)
		die("address '%s': expected IPV4:PORT", o->addr);
	buf_open(&b, o->span);
	if (lfd < 0)
		err(1, "socket");
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* Accepted sockets inherit the listener's congestion control. */
	sock_setup(lfd, o);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0)
		err(1, "listen %s", o->addr);
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		uint64_t got = 0, t0 = 0;
		ssize_t r;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			err(1, "accept");
		}
		sock_setup(fd, o);
		while ((r = recv(fd, b.mem + b.off, piece(&b, o->chunk, UINT64_MAX), 0)) != 0) {
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				warn("recv");
				break;
			}
			if (got == 0)
				t0 = kvp_test_now_ns();
			got += (uint64_t)r;
			advance(&b, (size_t)r);
		}
		uint64_t ns = got ? kvp_test_now_ns() - t0 : 0;
		struct tcp_info ti = { 0 };
		socklen_t l = sizeof(ti);

		getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l);
		close(fd);
		if (o->json)
			printf("{\"side\":\"sink\",\"bytes\":%" PRIu64 ",\"seconds\":%.6f,"
			       "\"gbps\":%.3f,\"span\":%" PRIu64 ",\"chunk\":%" PRIu64
			       ",\"rcv_ooopack\":%u,\"rcv_space\":%u}\n",
			       got, (double)ns / 1e9, gbps(got, ns), o->span, o->chunk,
			       ti.tcpi_rcv_ooopack, ti.tcpi_rcv_space);
		else
			printf("sink: %" PRIu64 " bytes, %.2f Gbit/s (first byte to close), "
			       "%u segments out of order\n",
			       got, gbps(got, ns), ti.tcpi_rcv_ooopack);
	}
}

/* ---- source ---- */

static int
connect_retry(const struct opts *o)
{
	struct sockaddr_in sa;
	uint64_t deadline = kvp_test_now_ns() + 10000000000ull;

	if (kvp_test_parse_ipv4(o->addr, &sa) < 0)
		die("address '%s': expected IPV4:PORT", o->addr);
	/* The sink may not listen yet. */
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			err(1, "socket");
		sock_setup(fd, o);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		if (kvp_test_now_ns() > deadline)
			err(1, "connect %s", o->addr);
		close(fd);
		nanosleep(&(struct timespec){ .tv_nsec = 20000000 }, NULL);
	}
}

static void
print_source(const struct opts *o, int fd, uint64_t ns)
{
	struct tcp_info ti = { 0 };
	socklen_t l = sizeof(ti);
	char cc[32];
	int sndbuf, rcvbuf;

	getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l);
	sock_names(fd, cc, sizeof(cc), &sndbuf, &rcvbuf);
	if (o->json) {
		printf("{\"side\":\"source\",\"bytes\":%" PRIu64 ",\"warmup\":%" PRIu64
		       ",\"seconds\":%.6f,\"gbps\":%.3f,"
		       "\"span\":%" PRIu64 ",\"chunk\":%" PRIu64 ",\"cc\":\"%s\",\"sndbuf\":%d,"
		       "\"rcvbuf\":%d,\"tcp_info\":{\"total_retrans\":%u,\"bytes_retrans\":%llu,"
		       "\"dsack_dups\":%u,\"reord_seen\":%u,\"reordering\":%u,\"snd_cwnd\":%u,"
		       "\"snd_mss\":%u,\"rtt_us\":%u,\"min_rtt_us\":%u,\"snd_wnd\":%u,"
		       "\"busy_us\":%llu,\"rwnd_limited_us\":%llu,\"sndbuf_limited_us\":%llu}}\n",
		       o->total, o->warmup, (double)ns / 1e9, gbps(o->total, ns), o->span, o->chunk,
		       cc, sndbuf, rcvbuf, ti.tcpi_total_retrans,
		       (unsigned long long)ti.tcpi_bytes_retrans, ti.tcpi_dsack_dups,
		       ti.tcpi_reord_seen, ti.tcpi_reordering, ti.tcpi_snd_cwnd, ti.tcpi_snd_mss,
		       ti.tcpi_rtt, ti.tcpi_min_rtt, ti.tcpi_snd_wnd,
		       (unsigned long long)ti.tcpi_busy_time,
		       (unsigned long long)ti.tcpi_rwnd_limited,
		       (unsigned long long)ti.tcpi_sndbuf_limited);
		return;
	}
	printf("source: %" PRIu64 " bytes (after %" PRIu64 " of warm-up) from a %" PRIu64
	       "-byte span in %" PRIu64 "-byte pieces, %.2f Gbit/s, %s\n",
	       o->total, o->warmup, o->span, o->chunk, gbps(o->total, ns), cc);
	printf("source: %u segments retransmitted (%llu bytes), %u DSACKs, reordering seen %u, "
	       "cwnd %u x %u B, rtt %u us, limited by the receive window %.1f%% and the send "
	       "buffer %.1f%% of the time (SO_SNDBUF %d)\n",
	       ti.tcpi_total_retrans, (unsigned long long)ti.tcpi_bytes_retrans, ti.tcpi_dsack_dups,
	       ti.tcpi_reord_seen, ti.tcpi_snd_cwnd, ti.tcpi_snd_mss, ti.tcpi_rtt,
	       ti.tcpi_busy_time ?
		       100.0 * (double)ti.tcpi_rwnd_limited / (double)ti.tcpi_busy_time :
		       0,
	       ti.tcpi_busy_time ?
		       100.0 * (double)ti.tcpi_sndbuf_limited / (double)ti.tcpi_busy_time :
		       0,
	       sndbuf);
}

static int
cmd_source(const struct opts *o)
{
	struct buf b;
	char one;

	buf_open(&b, o->span);
	int fd = connect_retry(o);
	uint64_t left = o->warmup + o->total, t0 = kvp_test_now_ns();

	/*
	 * kvproxy's links are long-lived: a fresh connection's slow start and
	 * receive-buffer autotuning are no part of what it pays per transfer.
	 * Timing starts once the warm-up bytes are in the socket; the few MiB
	 * of them still in flight then make the figure a little low, never high.
	 */
	while (left > 0) {
		/* No send straddles the end of the warm-up. */
		uint64_t upto = left > o->total ? left - o->total : left;
		ssize_t r = send(fd, b.mem + b.off, piece(&b, o->chunk, upto), MSG_NOSIGNAL);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			err(1, "send (%" PRIu64 " of %" PRIu64 " bytes sent)",
			    o->warmup + o->total - left, o->warmup + o->total);
		left -= (uint64_t)r;
		advance(&b, (size_t)r);
		if (left == o->total)
			t0 = kvp_test_now_ns();
	}
	/* The sink closes once it has read everything: its close ends the timing. */
	if (shutdown(fd, SHUT_WR) < 0)
		err(1, "shutdown");
	for (ssize_t r; (r = recv(fd, &one, 1, 0)) != 0;)
		if (r < 0 && errno != EINTR)
			err(1, "waiting for the sink to close");
		else if (r > 0)
			die("the sink sent data");
	print_source(o, fd, kvp_test_now_ns() - t0);
	close(fd);
	munmap(b.mem, b.span);
	return 0;
}

/* ---- command line ---- */

static void
usage(FILE *f)
{
	fputs("usage:\n"
	      "  kvp-tcp-stream sink   --addr IPV4:PORT --span BYTES [--chunk BYTES] [--cc ALGO]\n"
	      "                        [--json]\n"
	      "  kvp-tcp-stream source --addr IPV4:PORT --span BYTES --total BYTES [--chunk BYTES]\n"
	      "                        [--warmup BYTES] [--cc ALGO] [--json]\n"
	      "One TCP stream; each side's buffer is --span bytes, walked cyclically in --chunk\n"
	      "pieces (1m): --span 1m is iperf3 -l 1M's footprint (cache-hot), a span as large\n"
	      "as kvproxy-bench's --size is kvproxy's (distinct bytes). The sink serves one\n"
	      "connection at a time until killed. --warmup: bytes sent before the timed --total\n"
	      "(slow start and buffer autotuning out of the figure). --cc: TCP_CONGESTION\n"
	      "(default: the system's).\n"
	      "Sizes take k/m/g suffixes (powers of 1024).\n",
	      f);
}

static uint64_t
parse_size(const char *s, const char *name)
{
	uint64_t v;

	if (kvp_test_parse_u64(s, &v) < 0 || v == 0)
		errx(2, "bad value '%s' for --%s (a size above 0)", s, name);
	return v;
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "addr", required_argument, NULL, 'a' },
		{ "span", required_argument, NULL, 's' },
		{ "total", required_argument, NULL, 't' },
		{ "chunk", required_argument, NULL, 'c' },
		{ "cc", required_argument, NULL, 'C' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .chunk = DEF_CHUNK };
	const char *cmd = argc > 1 ? argv[1] : "";
	bool sink = !strcmp(cmd, "sink"), source = !strcmp(cmd, "source");
	int c;

	if (!sink && !source) {
		usage(strcmp(cmd, "-h") && strcmp(cmd, "--help") ? stderr : stdout);
		return strcmp(cmd, "-h") && strcmp(cmd, "--help") ? 2 : 0;
	}
	while ((c = getopt_long(argc - 1, argv + 1, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'a':
			o.addr = optarg;
			break;
		case 's':
			o.span = parse_size(optarg, "span");
			break;
		case 't':
			o.total = parse_size(optarg, "total");
			break;
		case 'c':
			o.chunk = parse_size(optarg, "chunk");
			break;
		case 'C':
			o.cc = optarg;
			break;
		case 'w':
			if (kvp_test_parse_u64(optarg, &o.warmup) < 0)
				errx(2, "bad value '%s' for --warmup", optarg);
			break;
		case 'j':
			o.json = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind + 1 != argc)
		errx(2, "unexpected argument '%s'", argv[optind + 1]);
	if (o.addr == NULL || o.span == 0 || (source && o.total == 0))
		errx(2, "%s needs %s (see --help)", cmd,
		     source ? "--addr, --span and --total" : "--addr and --span");
	if (o.warmup > UINT64_MAX - o.total)
		errx(2, "--warmup + --total is past 64 bits");
	if (o.span > SIZE_MAX / 2)
		errx(2, "--span %" PRIu64 " is too large", o.span);
	return sink ? cmd_sink(&o) : cmd_source(&o);
}
