/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared set-up for the fuzz harnesses: DPDK EAL without hugepages, a real
 * kvp_node built by kvp_node_init() in a private temp dir, deterministic
 * "random" bytes (so region keys are reachable by the fuzzer), and helpers
 * to drain the control-plane message rings between inputs. What is not
 * about the node (REQUIRE, the client protocol, the HELLO proof, the
 * replay main) is the test-helper library's (tests/lib, kvp_test.h).
 *
 * Everything here runs on one thread (the fuzzer's), which plays both the
 * main lcore and the worker lcore.
 */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ctrl_priv.h"
#include "kvp_test.h"
#include "kvp_test_core.h"

/*
 * The byte that getrandom() returns in fuzz builds. Region keys become
 * (0x5a5a5a5a5a5a << 16) | slot, which seed inputs (and the fuzzer's
 * comparison tracing) can name.
 */
#define FUZZ_RANDOM_BYTE 0x5a
#define FUZZ_KEY(slot)   ((0x5a5a5a5a5a5a5a5aull << 16) | (uint64_t)(slot))

/** True when KVP_FUZZ_VERBOSE is set: harnesses print what each input did. */
bool fuzz_verbose(void);

/** Config defaults sized for a fuzzer: small pools, one peer "peer0" at 127.0.0.1:1. */
void fuzz_config(struct kvp_config *cfg);

/**
 * Build a node with kvp_node_init() and one worker; sockets live in a
 * private temp dir removed at exit. Aborts on failure (harness set-up).
 */
void fuzz_node_init(struct kvp_node *n, struct kvp_config *cfg,
		    const struct kvp_transport_ops *tops);

/** Messages counted while draining a worker's outbox. */
struct fuzz_outbox {
	unsigned conn_down;
	unsigned chan_gone;
	unsigned chan_broken;
	struct kvp_chan *last_chan;
};

/** Take every message out of worker @p w's outbox and return it to the pool. */
void fuzz_drain_outbox(struct kvp_node *n, unsigned w, struct fuzz_outbox *ob);

/**
 * After an input: every transfer slot of worker 0 is free, no region keeps a
 * reference, and the message pool holds @p pool0 messages again.
 */
void fuzz_assert_reclaimed(const struct kvp_node *n, unsigned pool0);

/** Post a message to worker 0's inbox (aborts if the pool or ring is exhausted). */
void fuzz_send_worker(struct kvp_node *n, int type, struct kvp_chan *ch);

/** A client of the node, connected through the real client socket protocol. */
struct fuzz_client {
	struct kvp_test_conn conn; /* HELLO'd, channel mapped (sq, cq: the client's views) */
	int region_fd;
	uint8_t *region; /* the client's own mapping of its region */
	size_t region_len;
	uint64_t key; /* the region's key */
};

/**
 * Connect a client (HELLO, channel mapped) and register one memfd region of
 * @p region_len bytes, driving the node's control plane (kvp_node_poll) and
 * worker 0's inbox as needed. Aborts on failure (harness set-up).
 */
void fuzz_client_open(struct kvp_node *n, struct fuzz_client *fc, size_t region_len);

/** Lowest free fd number: equal before and after an input means no fd leaked. */
int fuzz_lowest_fd(void);

/** Little reader over the fuzz input; reads past the end return zeros. */
struct fuzz_in {
	const uint8_t *p;
	size_t len;
	size_t off;
};

static inline bool
fuzz_more(const struct fuzz_in *in)
{
	return in->off < in->len;
}

static inline uint8_t
fuzz_u8(struct fuzz_in *in)
{
	return in->off < in->len ? in->p[in->off++] : 0;
}

static inline uint64_t
fuzz_bytes_le(struct fuzz_in *in, unsigned n)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < n; i++)
		v |= (uint64_t)fuzz_u8(in) << (8 * i);
	return v;
}

/** Copy up to @p n bytes (zero-filled past the end of the input). */
static inline void
fuzz_copy(struct fuzz_in *in, void *dst, size_t n)
{
	uint8_t *d = dst;

	for (size_t i = 0; i < n; i++)
		d[i] = fuzz_u8(in);
}

#endif /* FUZZ_COMMON_H */
