/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_admin_handle() with every output size: a reply never runs past the
 * buffer; one that does not fit becomes a complete "reply too large" error
 * that keeps the request's id, and where even that does not fit there is
 * no reply at all (never half a line).
 *
 * JSON-RPC 2.0 conformance: ids of every kind echoed exactly, invalid ids
 * refused and not executed, notifications never answered (even failing
 * ones), batches answered with an array (none for notifications only, one
 * error for an empty batch).
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ctrl_priv.h"
#include "kvp_test.h"

#define CANARY 0xa5

static struct kvp_node node;
static const struct kvp_transport_ops ops = { .name = "tcp" };

/* The reply is one JSON-RPC object with @p want_id: a result, or the "reply too large" error. */
static void
check_reply(const char *what, const char *buf, size_t len, json_t *want_id, bool want_result)
{
	json_error_t jerr;
	json_t *r = json_loadb(buf, len, 0, &jerr);

	if (!r) {
		fprintf(stderr, "%s: reply of %zu bytes is not JSON: %s\n", what, len, jerr.text);
		kvp_test_failures++;
		return;
	}
	json_t *err = json_object_get(r, "error"), *v = json_object_get(r, "jsonrpc");

	CHECK(json_is_string(v) && strcmp(json_string_value(v), "2.0") == 0);
	CHECK(json_equal(json_object_get(r, "id"), want_id));
	if (want_result) {
		CHECK(json_is_object(json_object_get(r, "result")) && !err);
	} else {
		CHECK(json_is_object(err) && !json_object_get(r, "result"));
		CHECK_EQ(json_integer_value(json_object_get(err, "code")), -32603);
		v = json_object_get(err, "message");
		CHECK(json_is_string(v) && strcmp(json_string_value(v), "reply too large") == 0);
	}
	json_decref(r);
}

/*
 * Run @p req with every buffer size from 0 to its full reply and a little
 * more: the reply fits in full, or is the error (when at least @p err_len
 * bytes are there), or is absent.
 */
static void
sweep(const char *what, const char *req, json_t *want_id, bool result, size_t err_len)
{
	static char big[1 << 16];
	size_t full = kvp_admin_handle(&node, req, strlen(req), big, sizeof(big));
	char *buf = malloc(full + 64);
	unsigned errors = 0;

	CHECK(full > err_len);
	check_reply(what, big, full, want_id, result);
	for (size_t outlen = 0; outlen <= full + 8; outlen++) {
		memset(buf, CANARY, full + 64);
		size_t rl = kvp_admin_handle(&node, req, strlen(req), buf, outlen);

		CHECK(rl <= outlen);
		for (size_t i = outlen; i < full + 64; i++)
			if ((unsigned char)buf[i] != CANARY) {
				fprintf(stderr, "%s: outlen %zu: byte %zu written\n", what, outlen,
					i);
				kvp_test_failures++;
				break;
			}
		if (outlen >= full) {
			CHECK_EQ(rl, full);
			check_reply(what, buf, rl, want_id, result);
		} else if (outlen >= err_len) {
			CHECK_EQ(rl, err_len);
			check_reply(what, buf, rl, want_id, false);
			errors++;
		} else {
			CHECK_EQ(rl, 0);
		}
	}
	CHECK_EQ(errors, full - err_len);
	free(buf);
}

static char rbuf[1 << 16];

/* Handle the @p len bytes at @p req; the reply text (NUL-terminated) is in rbuf. @return its length */
static size_t
rpc_n(const char *req, size_t len)
{
	size_t rlen = kvp_admin_handle(&node, req, len, rbuf, sizeof(rbuf) - 1);

	rbuf[rlen] = '\0';
	return rlen;
}

static size_t
rpc(const char *req)
{
	return rpc_n(req, strlen(req));
}

static void
expect_contains(const char *what, const char *needle)
{
	if (!strstr(rbuf, needle)) {
		fprintf(stderr, "%s: reply '%s' lacks '%s'\n", what, rbuf, needle);
		kvp_test_failures++;
	}
}

/* The reply is one object with @p code (0: a result) and id text @p id. */
static void
expect_reply(const char *what, const char *req, const char *id, int code)
{
	char want[96];
	json_t *r;

	CHECK(rpc(req) > 0);
	r = json_loads(rbuf, 0, NULL);
	CHECK(json_is_object(r));
	snprintf(want, sizeof(want), "{\"jsonrpc\":\"2.0\",\"id\":%s,", id);
	if (strncmp(rbuf, want, strlen(want)) != 0) {
		fprintf(stderr, "%s: reply '%s' does not start '%s'\n", what, rbuf, want);
		kvp_test_failures++;
	}
	if (code)
		CHECK_EQ(json_integer_value(json_object_get(json_object_get(r, "error"), "code")),
			 code);
	else
		CHECK(json_object_get(r, "result") != NULL);
	json_decref(r);
}

static void
jsonrpc_conformance(void)
{
	/* Ids: strings, numbers of any form (echoed as written), null. */
	expect_reply("id 1.5", "{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"config_get\"}", "1.5", 0);
	expect_reply("id 1e3", "{\"jsonrpc\":\"2.0\",\"id\":1e3,\"method\":\"config_get\"}", "1e3", 0);
	expect_reply("id -2.50E+1", "{\"id\" : -2.50E+1, \"jsonrpc\":\"2.0\",\"method\":\"status\"}",
		     "-2.50E+1", 0);
	expect_reply("id string", "{\"jsonrpc\":\"2.0\",\"id\":\"a\\u0062c\",\"method\":\"status\"}",
		     "\"a\\u0062c\"", 0);
	expect_reply("id null", "{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"status\"}", "null", 0);
	expect_reply("escaped key", "{\"jsonrpc\":\"2.0\",\"\\u0069d\":7,\"method\":\"status\"}", "7", 0);

	/* Invalid ids: -32600 with a null id, and the request is not executed. */
	static const char *bad_ids[] = { "true", "{}", "[1]", "false", "{\"a\":1}" };
	for (size_t i = 0; i < sizeof(bad_ids) / sizeof(bad_ids[0]); i++) {
		char req[128];

		snprintf(req, sizeof(req), "{\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"drain\"}",
			 bad_ids[i]);
		expect_reply(bad_ids[i], req, "null", -32600);
		CHECK(!node.draining);
	}

	/* Notifications: never a reply, whether they fail or not; executed when valid. */
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"method\":\"no_such_method\"}"), 0);
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"method\":\"config_set\",\"params\":{\"key\":\"x\"}}"), 0);
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"method\":\"status\",\"params\":[1,2]}"), 0);
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"method\":\"drain\"}"), 0);
	CHECK(node.draining);
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"method\":\"undrain\"}"), 0);
	CHECK(!node.draining);
	/* Not a valid request, so not a notification: answered (id null). */
	expect_reply("no jsonrpc", "{\"method\":\"status\"}", "null", -32600);
	expect_reply("method not a string", "{\"jsonrpc\":\"2.0\",\"method\":1,\"params\":\"bar\"}",
		     "null", -32600);
	expect_reply("a number", "5", "null", -32600);
	expect_reply("parse error", "{\"jsonrpc\":\"2.0\",\"method\"", "null", -32700);
	expect_reply("failing request", "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"nope\"}", "3", -32601);
	/* A NUL byte (which jansson alone would skip) is a parse error, and nothing runs. */
	{
		static const char nul[] = "{\"jsonrpc\":\"2.0\",\"method\":\"drain\",\"a\":1\0,\"id\":7}";

		CHECK(rpc_n(nul, sizeof(nul) - 1) > 0);
		CHECK(strstr(rbuf, "\"id\":null,\"error\":{\"code\":-32700") != NULL);
		CHECK(!node.draining);
	}
	/* An error quoting a request's string cut mid-character still encodes (as '?'). */
	expect_reply("cut character",
		     "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\u00e9\"}",
		     "4", -32601);
	expect_contains("cut character", "aaa?'");

	/* Batches: an array of the replies, in order; notifications leave no entry. */
	CHECK(rpc("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"config_get\",\"params\":{\"key\":"
		  "\"limits.max_clients\"}}, {\"jsonrpc\":\"2.0\",\"method\":\"status\"},"
		  "{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"nope\"}, 5, {\"jsonrpc\":\"2.0\","
		  "\"id\":true,\"method\":\"drain\"},{\"jsonrpc\":\"2.0\",\"id\":2.0,\"method\":\"status\"}]") > 0);
	json_t *r = json_loads(rbuf, 0, NULL);
	CHECK(json_is_array(r) && json_array_size(r) == 5);
	CHECK_EQ(json_integer_value(json_object_get(json_array_get(r, 0), "id")), 1);
	CHECK(json_object_get(json_array_get(r, 0), "result") != NULL);
	CHECK(strcmp(json_string_value(json_object_get(json_array_get(r, 1), "id")), "x") == 0);
	CHECK_EQ(json_integer_value(json_object_get(json_object_get(json_array_get(r, 1), "error"), "code")), -32601);
	CHECK(json_is_null(json_object_get(json_array_get(r, 2), "id")));
	CHECK_EQ(json_integer_value(json_object_get(json_object_get(json_array_get(r, 2), "error"), "code")), -32600);
	CHECK_EQ(json_integer_value(json_object_get(json_object_get(json_array_get(r, 3), "error"), "code")), -32600);
	CHECK(json_object_get(json_array_get(r, 4), "result") != NULL);
	expect_contains("batch id 2.0", "\"id\":2.0,");
	json_decref(r);
	CHECK(!node.draining);
	/* Notifications only: no reply at all (they still run). */
	CHECK_EQ(rpc("[{\"jsonrpc\":\"2.0\",\"method\":\"drain\"},{\"jsonrpc\":\"2.0\",\"method\":\"nope\"}]"), 0);
	CHECK(node.draining);
	CHECK_EQ(rpc("[{\"jsonrpc\":\"2.0\",\"method\":\"undrain\"}]"), 0);
	CHECK(!node.draining);
	/* An empty batch is one Invalid Request, not an array. */
	expect_reply("empty batch", "[]", "null", -32600);
	expect_reply("empty batch with blanks", " [ ] ", "null", -32600);
	/* More than 256 requests: one error, nothing executed. */
	static char big[300 * 40];
	size_t off = 0;
	off += (size_t)snprintf(big + off, sizeof(big) - off, "[");
	for (int i = 0; i < 257; i++)
		off += (size_t)snprintf(big + off, sizeof(big) - off,
					"%s{\"jsonrpc\":\"2.0\",\"method\":\"drain\"}", i ? "," : "");
	snprintf(big + off, sizeof(big) - off, "]");
	expect_reply("batch of 257", big, "null", -32600);
	CHECK(!node.draining);
}

int
main(void)
{
	kvp_config_defaults(&node.cfg);
	snprintf(node.cfg.node_id, sizeof(node.cfg.node_id), "unit0");
	node.tops = &ops;
	node.start_ns = kvp_mono_ns();
	node.peers = calloc(node.cfg.max_peers, sizeof(*node.peers));
	/* What kvp_node_init() has the modules do: register their methods. */
	admin_methods_init(&node);
	stats_init(&node);
	rails_init(&node);
	doctor_init(&node);

	static const char err7[] =
		"{\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32603,\"message\":\"reply too large\"}}";
	static const char errstr[] =
		"{\"jsonrpc\":\"2.0\",\"id\":\"abc\",\"error\":{\"code\":-32603,"
		"\"message\":\"reply too large\"}}";
	static const char errnull[] = "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32603,"
				      "\"message\":\"reply too large\"}}";
	json_t *id7 = json_integer(7), *idabc = json_string("abc"), *idnull = json_null();

	/* Methods whose replies do not change between calls (no clocks in them). */
	sweep("config_get key",
	      "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"config_get\",\"params\":{\"key\":"
	      "\"limits.max_clients\"}}",
	      id7, true, sizeof(err7) - 1);
	sweep("string id", "{\"jsonrpc\":\"2.0\",\"id\":\"abc\",\"method\":\"config_get\"}", idabc,
	      true, sizeof(errstr) - 1);
	/* Errors are replies too: a parse error that does not fit shrinks the same way. */
	static char big[4096];
	size_t full = kvp_admin_handle(&node, "{nope", 5, big, sizeof(big));
	CHECK(full > sizeof(errnull) - 1);
	CHECK_EQ(kvp_admin_handle(&node, "{nope", 5, big, full - 1), sizeof(errnull) - 1);
	CHECK(memcmp(big, errnull, sizeof(errnull) - 1) == 0);
	CHECK_EQ(kvp_admin_handle(&node, "{nope", 5, big, sizeof(errnull) - 2), 0);
	/* A notification is never answered, whatever the room. */
	CHECK_EQ(kvp_admin_handle(&node, "{\"jsonrpc\":\"2.0\",\"method\":\"status\"}", 35, big,
				  sizeof(big)),
		 0);
	jsonrpc_conformance();
	json_decref(id7);
	json_decref(idabc);
	json_decref(idnull);
	return kvp_test_result("test_admin");
}
