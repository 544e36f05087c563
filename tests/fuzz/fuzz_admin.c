/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target: the admin JSON-RPC handler, kvp_admin_handle().
 *
 * The node is real (kvp_node_init with a stub transport named "tcp"), with
 * one connected client that has a region and, at the start of every input,
 * one transfer in flight — so status/stats/peers/transfers/slowest/cancel/
 * drain/config_* all have something to look at and change. The input is
 * split into lines, as the admin socket does, and each line is one request;
 * state changes (drain, config_set, cancel) carry over to the next line and
 * are undone after the input.
 *
 * Invariants: every reply fits the buffer, is one JSON object with
 * "jsonrpc":"2.0" and exactly one of "result"/"error" (integer code), or
 * for a batch an array of such objects, one per request that is not a
 * notification; a request whose "id" is a string or a number gets that id
 * back; a notification never gets a reply, and everything else always does
 * (given room); a request with an invalid id (true, {}, [1]) changes
 * nothing; no control message, transfer slot or fd leaks.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <rte_log.h>
#include <rte_mempool.h>

#include "fuzz_common.h"

#define REPLY_MAX (1u << 20)
#define SEG_LEN   4096u

static struct kvp_node node;
static struct kvp_worker *w;
static struct fuzz_client cl;
static struct kvp_config saved_cfg;
static char *reply;
static struct kvp_xfer *held; /* the transfer the stub transport keeps in flight */
static struct kvp_transport_ops stub_ops;
static uint64_t next_uid = 1;

static int
stub_post(void *tctx, struct kvp_xfer *x)
{
	(void)tctx;
	REQUIRE(held == NULL, "a second transfer reached the transport");
	x->ts[KVP_TS_ADMIT] = kvp_mono_ns();
	held = x;
	return 0;
}

static void
stub_cancel(void *tctx, struct kvp_xfer *x, int status)
{
	(void)tctx;
	REQUIRE(x == held, "cancel of a transfer the transport does not hold");
	held = NULL;
	kvp_worker_xfer_end(w, x, status);
}

/* Keep one transfer in flight: submitted through the client's ring, picked up by the worker. */
static void
ensure_inflight(void)
{
	if (held)
		return;
	struct kvp_test_xfer x = { .user_id = next_uid++,
				   .submit_ns = kvp_mono_ns(),
				   .timeout_ns = 3600ull * 1000000000,
				   .src_key = cl.key,
				   .dst_key = 0x1234000000000001ull,
				   .len = SEG_LEN };
	REQUIRE(kvp_test_submit(&cl.conn.sq, &x) == 2, "client SQ full");
	kvp_worker_poll_chans(w);
	REQUIRE(held != NULL, "the worker did not pick up the transfer");
}

/* Completions are the client's business; read them so the CQ never fills. */
static void
drain_cq(void)
{
	struct kvp_cqe c[16];

	while (kvp_ring_dequeue_burst(&cl.conn.cq, c, 16) > 0)
		;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct kvp_config cfg;

	(void)argc;
	(void)argv;
	fuzz_config(&cfg);
	/* Post keeps one transfer in flight, for status, transfers and cancel to see. */
	stub_ops = kvp_test_stub_ops;
	stub_ops.post = stub_post;
	stub_ops.cancel = stub_cancel;
	fuzz_node_init(&node, &cfg, &stub_ops);
	w = &node.workers[0];
	w->peers[0].links = 1;
	fuzz_client_open(&node, &cl, 1 << 20);
	reply = malloc(REPLY_MAX);
	REQUIRE(reply != NULL, "out of memory");
	ensure_inflight();
	saved_cfg = node.cfg;
	return 0;
}

/* One reply object: "jsonrpc":"2.0", an id, exactly one of result/error. */
static void
check_shape(json_t *r)
{
	REQUIRE(json_is_object(r), "reply is not an object");
	REQUIRE(json_is_string(json_object_get(r, "jsonrpc")) &&
			strcmp(json_string_value(json_object_get(r, "jsonrpc")), "2.0") == 0,
		"reply without \"jsonrpc\":\"2.0\"");
	json_t *res = json_object_get(r, "result"), *err = json_object_get(r, "error");
	REQUIRE((res != NULL) != (err != NULL), "reply needs exactly one of result/error");
	if (err)
		REQUIRE(json_is_integer(json_object_get(err, "code")) &&
				json_is_string(json_object_get(err, "message")),
			"error without an integer code and a message");
	REQUIRE(json_object_get(r, "id") != NULL, "reply without an id");
}

/* A valid request without an id: JSON-RPC forbids any reply to it. */
static bool
is_notification(json_t *q)
{
	json_t *v = json_object_get(q, "jsonrpc"), *m = json_object_get(q, "method");
	json_t *p = json_object_get(q, "params");

	return json_is_object(q) && !json_object_get(q, "id") && json_is_string(v) &&
	       strcmp(json_string_value(v), "2.0") == 0 && json_is_string(m) &&
	       (!p || json_is_object(p) || json_is_array(p));
}

static bool
valid_id(json_t *id)
{
	return json_is_string(id) || json_is_number(id) || json_is_null(id);
}

/* The shape every reply must have, and what it owes the request. */
static void
check_reply(json_t *q, const char *out, size_t rlen, size_t outlen)
{
	json_error_t jerr;
	json_t *r = json_loadb(out, rlen, JSON_REJECT_DUPLICATES, &jerr);

	REQUIRE(r != NULL, "reply is not JSON (%s): %.*s", jerr.text, (int)rlen, out);
	if (json_is_array(r)) {
		/* A batch: one reply per request that is not a notification, none empty. */
		size_t owed = 0, i;
		json_t *e;

		REQUIRE(json_is_array(q) && json_array_size(q) > 0, "array reply to a non-batch");
		json_array_foreach(q, i, e)
			owed += !is_notification(e);
		REQUIRE(json_array_size(r) > 0 && json_array_size(r) <= owed,
			"batch of %zu requests (%zu owed a reply) got %zu replies",
			json_array_size(q), owed, json_array_size(r));
		json_array_foreach(r, i, e)
			check_shape(e);
		json_decref(r);
		return;
	}
	check_shape(r);
	REQUIRE(!is_notification(q), "a notification got a reply");
	/* A well-formed id comes back as it was sent (unless the reply did not fit). */
	json_t *qid = json_is_object(q) ? json_object_get(q, "id") : NULL;
	json_t *err = json_object_get(r, "error");
	bool too_large = err && json_integer_value(json_object_get(err, "code")) == -32603;
	if (qid && valid_id(qid) && !too_large)
		REQUIRE(json_equal(qid, json_object_get(r, "id")), "reply id differs");
	/* Every reply to one request of a line this short fits the largest buffer. */
	REQUIRE(!too_large || outlen < REPLY_MAX, "\"reply too large\" in a %zu-byte buffer: %.*s",
		outlen, (int)(rlen < 300 ? rlen : 300), out);
	json_decref(r);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t outlens[] = { REPLY_MAX, 65536, 4096, 512 };
	int fd0 = fuzz_lowest_fd();
	unsigned pool0 = rte_mempool_avail_count(node.msg_pool);
	size_t outlen;

	if (size == 0)
		return 0;
	outlen = outlens[data[0] % 4];
	data++;
	size--;
	ensure_inflight();

	const char *p = (const char *)data, *end = p + size;
	for (int lines = 0; p < end && lines < 64; lines++) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
		/* A NUL byte makes the line a parse error (jansson alone would skip it). */
		bool has_nul = memchr(p, '\0', len) != NULL;
		json_t *q = has_nul ? NULL :
				      json_loadb(p, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, NULL);
		bool was_draining = node.draining;
		struct kvp_config cfg_before = node.cfg;
		size_t rlen = kvp_admin_handle(&node, p, len, reply, outlen);

		REQUIRE(rlen < outlen, "reply length %zu does not fit %zu", rlen, outlen);
		if (rlen)
			check_reply(q, reply, rlen, outlen);
		if (rlen && has_nul) {
			json_t *r = json_loadb(reply, rlen, 0, NULL);
			json_t *code = json_object_get(json_object_get(r, "error"), "code");

			REQUIRE(json_integer_value(code) == -32700 || json_integer_value(code) == -32603,
				"a line with a NUL byte was not a parse error: %.*s", (int)rlen, reply);
			json_decref(r);
		}
		/* Nothing but a notification (or a batch of them) goes unanswered. */
		if (!rlen && q && outlen == REPLY_MAX) {
			bool silent = is_notification(q);

			if (json_is_array(q) && json_array_size(q) > 0) {
				size_t i;
				json_t *e;

				silent = true;
				json_array_foreach(q, i, e)
					silent &= is_notification(e);
			}
			REQUIRE(silent, "a request got no reply: %.*s",
				(int)(len < 200 ? len : 200), p);
		}
		/* A request with an invalid id is not executed. */
		if (json_is_object(q) && json_object_get(q, "id") && !valid_id(json_object_get(q, "id")))
			REQUIRE(node.draining == was_draining &&
					memcmp(&cfg_before, &node.cfg, sizeof(cfg_before)) == 0,
				"a request with an invalid id was executed");
		json_decref(q);
		if (fuzz_verbose())
			fprintf(stderr, "admin: %.*s -> %.*s\n", (int)(len < 100 ? len : 100), p,
				(int)(rlen < 200 ? rlen : 200), reply);
		/* The worker acts on what the admin sent it (cancel), as its loop would. */
		kvp_worker_inbox(w);
		kvp_worker_poll_chans(w);
		drain_cq();
		p += len + (nl ? 1 : 0);
	}

	/* Undo what the requests changed, so every input starts from the same node. */
	if (node.draining) {
		static const char undrain[] =
			"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"undrain\"}";

		kvp_admin_handle(&node, undrain, sizeof(undrain) - 1, reply, REPLY_MAX);
		REQUIRE(!node.draining, "undrain did not end the drain");
	}
	node.cfg = saved_cfg;
	rte_log_set_level_pattern("kvp.*", RTE_LOG_DEBUG);
	kvp_worker_inbox(w);
	kvp_worker_poll_chans(w);
	drain_cq();
	fuzz_drain_outbox(&node, 0, NULL);
	REQUIRE(rte_mempool_avail_count(node.msg_pool) == pool0, "control messages leaked");
	REQUIRE(w->nxfers - w->nfree == (held ? 1u : 0u), "transfer slots leaked");
	REQUIRE(fuzz_lowest_fd() == fd0, "fd leaked");
	return 0;
}
