/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the worker tests (test_worker_admit, test_worker_ends,
 * test_worker_peers) share: one worker built by kvp_worker_init() (no node,
 * no sockets), a stub transport that holds every transfer it is handed until
 * the test ends it, and real channels in this process's memory, driven as
 * the worker lcore drives them (inbox, poll_chans, timers, prepare_sleep).
 * The test plays the client on the other side of each channel (SQ producer,
 * CQ consumer, as the ABI has it).
 *
 * Threading: one thread, the test's, plays both the worker lcore and the
 * main lcore. Memory: setup() makes the worker, its message pool and
 * region table; teardown() checks every message came back and frees them.
 */
#ifndef WORKER_HARNESS_H
#define WORKER_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "kvp_test.h"
#include "kvp_test_core.h"

#define SLOTS      8u /* limits.max_inflight */
#define SQN        64u
#define CQ_BIG     16u /* more than SLOTS: the slot table limits admission */
#define CQ_SMALL   4u  /* fewer than SLOTS: CQ room limits admission */
#define REG_LEN    (1u << 20)
#define SEG_LEN    4096u
#define DST_KEY    0x1234000000000001ull
#define ADMIT_MS   50u   /* timeouts.admission_ms */
#define DEFAULT_MS 1000u /* timeouts.default_ms */
#define MS         1000000ull
#define HOUR_NS    (3600ull * 1000 * MS)
#define CLIENT_A   ((1u << 16) | 1u) /* slot 1, generation 1 */
#define CLIENT_B   ((1u << 16) | 2u) /* slot 2, generation 1 */
#define CLIENT_C   ((1u << 16) | 3u) /* slot 3, generation 1 */

/* The worker under test, its configuration, regions and message pool (setup()). */
extern struct kvp_config cfg;
extern struct kvp_region_table regions;
extern struct rte_mempool *pool;
extern struct kvp_worker w;

/* The transfers the stub transport holds: the last handed is held[nheld - 1] (one ending takes the last one's place). */
extern struct kvp_xfer *held[SLOTS];
/* How many it holds; transfers posted to it and cancels asked of it (tests reset these). */
extern unsigned nheld, posts, cancels;

/* A client: its channel in memory, its region, its side of the rings. */
struct client {
	struct kvp_chan ch;       /* the worker's view */
	struct kvp_chan_hdr *hdr; /* the shared header */
	struct kvp_ring sq, cq;   /* the client's views: SQ producer, CQ consumer */
	uint64_t key;             /* its region */
};

/** The held transfer of @p user_id (of client @p id), or NULL. */
struct kvp_xfer *held_of(uint32_t id, uint64_t user_id);
/** The transport finishes a transfer it holds. */
void end_xfer(struct kvp_xfer *x, int status);
/** The transport finishes every transfer it holds with @p status. */
void end_all(int status);

/** A message from the main lcore into the worker's inbox. */
void send_msg(int type, struct kvp_chan *ch, uint32_t client, uint64_t user_id);
/** Messages of @p type the worker posted to the main lcore (all are taken out). */
unsigned drain_outbox(int type);
/** PEER_OPEN of @p slot, generation @p gen, as the main lcore sends it. */
void peer_open(uint32_t slot, uint32_t gen, uint8_t why, uint64_t until_ns);

/** Client @p id with a CQ of @p cqn entries and a region, added to the worker. */
void client_open(struct client *c, uint32_t id, uint32_t cqn);
/** The client goes; everything it had must come back. */
void client_close(struct client *c);
/** One transfer of SEG_LEN bytes from the client's region to peer 0. */
void submit(struct client *c, uint64_t user_id, uint64_t submit_ns, uint64_t timeout_ns);
/** A cancel entry for @p user_id on the client's SQ. */
void submit_cancel(struct client *c, uint64_t user_id);
/** SQ entries the worker has not consumed yet. */
uint32_t sq_left(const struct client *c);
/** Read up to @p n completions. */
uint32_t read_cq(struct client *c, struct kvp_cqe *e, uint32_t n);
/** Completions waiting in the CQ. */
uint32_t cq_count(const struct client *c);

/* Read the next completion: it must be the DONE of @p user_id with @p status. */
#define EXPECT_DONE(c, uid, st) expect_done(c, uid, st, __FILE__, __LINE__)

void expect_done(struct client *c, uint64_t user_id, int status, const char *file, int line);

/** One pass of the worker over its channels. */
int poll_worker(void);
/** One deadline scan at @p now. */
void timers(uint64_t now);
/** After each case: nothing in flight, no backlog, every region reference back. */
void expect_reclaimed(void);

/** The EAL, the worker, its stub transport, peer slot 0 open with a link up. */
void setup(void);
/** Every message back in the pool; the worker and its tables freed. @return kvp_test_result(@p name) */
int teardown(const char *name);

#endif
