/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_test: what the tests, the fuzzers and the client tools (kvproxy-bench,
 * kvp-ring-bench) would otherwise each write again: checks, clocks,
 * deterministic byte patterns, key files, sealed memfds, file-descriptor
 * passing, a raw speaker of the client control protocol (written from
 * kvp_rings.h, no libkvproxy: for rogue and fuzzing clients), the peer
 * HELLO proof, and (libkvp_test_replay) a libFuzzer-style replay main.
 *
 * It needs neither DPDK nor lib/core, so programs built on libkvproxy alone
 * use it; the few lib/rings calls it makes resolve to whichever of lib/rings
 * or libkvproxy the program links. What needs DPDK and lib/core (the EAL,
 * a stub transport, for tests that run a worker) is kvp_test_core.h
 * (libkvp_test_core).
 *
 * Threading: nothing here keeps state but the failure counter of the checks
 * (per process; a forked child counts its own). Memory: the caller owns
 * every buffer; nothing allocates but kvp_test_conn_open() (the mapping of
 * the channel, released by kvp_test_conn_close()).
 */
#ifndef KVP_TEST_H
#define KVP_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "kvp_rings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- checks ---- */

/** Checks failed so far in this process. */
extern int kvp_test_failures;

/** Report a failed check at @p file:@p line and count it; the test goes on. */
void kvp_test_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/** Report an unmet requirement and abort (a fuzzer reports it as a crash). */
_Noreturn void kvp_test_abort(const char *file, int line, const char *cond, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/** The test's own set-up broke: say why and exit 99 (meson: ERROR). */
_Noreturn void kvp_test_setup_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/** The test cannot run here: say why and exit 77 (meson: SKIP). */
_Noreturn void kvp_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/**
 * End of a test: "NAME: all checks passed" on stdout, or the count of
 * failures on stderr. @return the exit status: 0 passed, 1 failed
 */
int kvp_test_result(const char *name);

/** A condition that must hold; the test goes on either way. */
#define CHECK(c)                                                     \
	do {                                                         \
		if (!(c))                                            \
			kvp_test_fail(__FILE__, __LINE__, "%s", #c); \
	} while (0)

/** @p got must equal @p want (compared as long long, both printed). */
#define CHECK_EQ(got, want)                                                                   \
	do {                                                                                  \
		long long got_ = (long long)(got), want_ = (long long)(want);                 \
		if (got_ != want_)                                                            \
			kvp_test_fail(__FILE__, __LINE__, "%s is %lld, want %s (%lld)", #got, \
				      got_, #want, want_);                                    \
	} while (0)

/** An invariant (fuzzers) or a set-up step: print why and abort if @p c is false. */
#define REQUIRE(c, ...)                                                      \
	do {                                                                 \
		if (!(c))                                                    \
			kvp_test_abort(__FILE__, __LINE__, #c, __VA_ARGS__); \
	} while (0)

/* ---- clocks (CLOCK_MONOTONIC, the clock of submit_ns and kvp_mono_ns()) ---- */

static inline uint64_t
kvp_test_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t
kvp_test_now_us(void)
{
	return kvp_test_now_ns() / 1000;
}

static inline uint64_t
kvp_test_now_ms(void)
{
	return kvp_test_now_ns() / 1000000;
}

static inline double
kvp_test_now_s(void)
{
	return (double)kvp_test_now_ns() / 1e9;
}

/* ---- deterministic numbers and byte patterns ---- */

/** splitmix64's output function: a bijective mix of @p z. */
uint64_t kvp_test_mix64(uint64_t z);

/** splitmix64: the next number of the sequence in @p state. */
uint64_t kvp_test_splitmix64(uint64_t *state);

/** Uniform in [0, @p n) from @p state: integer arithmetic only, the same on any machine. */
uint64_t kvp_test_below(uint64_t *state, uint64_t n);

/**
 * Bytes [@p off, @p off + @p n) of pattern @p pat into @p buf (any
 * alignment): byte o is byte o % 8 (little-endian) of mix64(pat ^ o / 8),
 * so both ends of a transfer derive any byte from (pat, offset) alone.
 */
void kvp_test_pattern_fill(uint64_t pat, uint64_t off, void *buf, size_t n);

/**
 * Compare @p n bytes at @p buf with the pattern from offset @p off.
 * @return how many differ; with one or more, *@p first (if not NULL) is the
 *   index in @p buf of the first
 */
uint64_t kvp_test_pattern_check(uint64_t pat, uint64_t off, const void *buf, size_t n,
				size_t *first);

/** Bytes that differ between @p a and @p b; *@p first (if not NULL): the first, when any. */
uint64_t kvp_test_bytes_diff(const void *a, const void *b, size_t n, size_t *first);

/* ---- numbers, key files, memory ---- */

/**
 * Parse a whole unsigned number (decimal, 0x hex, 0 octal), with an optional
 * k, m or g suffix (powers of 1024, either case).
 * @return 0; -EINVAL (not a number, a sign, trailing text); -ERANGE (above 64 bits)
 */
int kvp_test_parse_u64(const char *s, uint64_t *v);

struct sockaddr_in;
/**
 * Parse "IPV4:PORT" (port 1-65535) into @p sa.
 * @return 0; -EINVAL (no colon, a host that is not an IPv4 address, a bad port)
 */
int kvp_test_parse_ipv4(const char *s, struct sockaddr_in *sa);

/** Sort @p n numbers in ascending order (latencies, before percentiles). */
void kvp_test_sort_u64(uint64_t *v, size_t n);

/**
 * Publish a region key for another process: "0x%016x\n" written to
 * @p path.tmp and renamed over @p path, so a reader never sees half a key.
 * @return 0; -ENAMETOOLONG; or the -errno of the step that failed
 */
int kvp_test_key_write(const char *path, uint64_t key);

/**
 * Read the key another process published at @p path (kvp_test_key_write()),
 * waiting up to @p wait_s seconds for the file to appear. This polls the
 * file system with short sleeps: set-up between processes, never a data path.
 * @return 0; -ETIMEDOUT (no file by then); -EBADMSG (not a key); -errno of fopen()
 */
int kvp_test_key_read(const char *path, double wait_s, uint64_t *key);

/** What kvp_test_key_read()'s negative @p rc means, for a message ("timed out", "not a key"). */
const char *kvp_test_key_error(int rc);

/**
 * A memfd of @p len bytes; with @p seal, sealed against shrinking
 * (kvproxyd refuses registrations that could lose pages under its mapping).
 * Mapped shared at *@p map unless @p map is NULL.
 * @return 0 or -errno (nothing left open)
 */
int kvp_test_memfd(const char *name, size_t len, bool seal, int *fd, void **map);

/* ---- file-descriptor passing (UNIX sockets) ---- */

/** Most descriptors kvp_test_send_fds() and kvp_test_recv_fds() carry at once. */
#define KVP_TEST_FDS_MAX 8

/**
 * sendmsg() @p n bytes with @p nfds descriptors (SCM_RIGHTS) attached, with
 * MSG_NOSIGNAL | @p flags. @return sendmsg()'s result (-1 and errno on failure)
 */
long kvp_test_send_fds(int sock, const void *buf, size_t n, const int *fds, unsigned nfds,
		       int flags);

/**
 * recvmsg() up to @p n bytes with MSG_CMSG_CLOEXEC | @p flags. Descriptors
 * that came along are stored at @p fds[*@p nfds ...] while there is room
 * for @p max in all, and closed beyond (max 0: close them all).
 * @return recvmsg()'s result (-1 and errno on failure)
 */
long kvp_test_recv_fds(int sock, void *buf, size_t n, int *fds, unsigned *nfds, unsigned max,
		       int flags);

/* ---- the client control protocol, spoken by hand ---- */

/** A client of kvproxyd's client socket, without libkvproxy. */
struct kvp_test_conn {
	int sock;
	int doorbell; /**< SQ doorbell eventfd (written by the client) */
	int notify;   /**< CQ notify eventfd (the client waits on it) */
	void *chan;   /**< the channel, mapped */
	size_t chan_len;
	struct kvp_chan_hdr *hdr;
	struct kvp_ring sq; /**< client view: producer */
	struct kvp_ring cq; /**< client view: consumer */
	uint32_t id;        /**< client id from the HELLO reply */
	uint32_t max_segs;
	uint64_t seq; /**< of the last request */
	/**
	 * Run while a reply is awaited, by a harness that is the daemon too
	 * (one thread: it polls the node here); NULL: block in recvmsg().
	 */
	void (*pump)(void *arg);
	void *pump_arg;
};

/**
 * One request: @p req gets magic, ABI version and the next seq; @p send_fd
 * (>= 0) travels with it. Waits for the whole reply; the first @p want
 * descriptors that come with it go to @p fds, others are closed.
 * @return rep->err when the reply says so (its reason in rep->errmsg); 0;
 *   -EPIPE (the daemon hung up); -EPROTO (a reply to another request, or
 *   not @p want descriptors); -ETIMEDOUT (with pump: no reply after 100 rounds)
 */
int kvp_test_ctrl_call(struct kvp_test_conn *c, struct kvp_ctrl_req *req, int send_fd,
		       struct kvp_ctrl_rep *rep, int *fds, unsigned want);

/**
 * Connect to the client socket at @p path, say HELLO and map the channel.
 * @p pump and @p arg: see kvp_test_conn. On failure, @p rep (if not NULL)
 * holds the daemon's reply and its reason.
 * @return 0; -ENAMETOOLONG; -errno of socket/connect/mmap; kvp_test_ctrl_call()'s errors;
 *   kvp_chan_attach()'s
 */
int kvp_test_conn_open(struct kvp_test_conn *c, const char *path, void (*pump)(void *arg),
		       void *arg, struct kvp_ctrl_rep *rep);

/** Unmap the channel and close every descriptor of @p c. */
void kvp_test_conn_close(struct kvp_test_conn *c);

/** REG: register @p len bytes of @p fd with @p flags (enum kvp_region_flags). @return as kvp_test_ctrl_call() */
int kvp_test_region_register(struct kvp_test_conn *c, int fd, uint64_t len, uint32_t flags,
			     uint64_t *key, struct kvp_ctrl_rep *rep);

/** PEER_LOOKUP: the peer index of node @p node_id. @return as kvp_test_ctrl_call() */
int kvp_test_peer_lookup(struct kvp_test_conn *c, const char *node_id, uint16_t *peer);

/** Ring the SQ doorbell, whether or not the daemon sleeps (a rogue need not be polite). */
void kvp_test_doorbell(struct kvp_test_conn *c);

/** One transfer of one contiguous segment, as a client puts it on its SQ. */
struct kvp_test_xfer {
	uint16_t peer;
	uint64_t user_id;
	uint64_t submit_ns;  /**< 0: none (the daemon stamps its pickup) */
	uint64_t timeout_ns; /**< 0: the daemon's default */
	uint64_t src_key;
	uint64_t src_off;
	uint64_t dst_key;
	uint64_t dst_off;
	uint64_t len;
};

/**
 * Publish @p x on @p sq (a client's producer view) by hand: header and
 * segment entry at once, as the ABI requires.
 * @return 2 (entries published); 0 (no room); -EPROTO (the ring's indices are corrupt)
 */
int kvp_test_submit(struct kvp_ring *sq, const struct kvp_test_xfer *x);

/* ---- the peer handshake ---- */

/**
 * The HELLO proof of the shared secret, computed as the peer handshake
 * defines it, independently of lib/core: HMAC-SHA256 with @p secret over
 * the role ('D' dialer, 'A' acceptor), the 32-byte challenge answered, the
 * prover's own 32-byte challenge, then both node ids (from, to), each
 * NUL-padded to KVP_NODE_ID_MAX (at most KVP_NODE_ID_MAX - 1 bytes of it).
 */
void kvp_test_hello_mac(const char *secret, char role, const uint8_t challenge[32],
			const uint8_t own[32], const char *from, const char *to, uint8_t mac[32]);

/* ---- fuzz harnesses (LLVMFuzzer* entry points; libkvp_test_replay has a main for them) ---- */

/** Defined by each harness: set-up once (optional for the replay main). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
/** Defined by each harness: run one input. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* KVP_TEST_H */
