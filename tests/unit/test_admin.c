/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_admin_handle() with every output size: a reply never runs past the
 * buffer; one that does not fit becomes a complete "reply too large" error
 * that keeps the request's id, and where even that does not fit there is
 * no reply at all (never half a line).
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "kvp_core.h"

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
		check_failures++;
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
				check_failures++;
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

int
main(void)
{
	kvp_config_defaults(&node.cfg);
	snprintf(node.cfg.node_id, sizeof(node.cfg.node_id), "unit0");
	node.tops = &ops;
	node.start_ns = kvp_mono_ns();

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
	json_decref(id7);
	json_decref(idabc);
	json_decref(idnull);
	return check_result("test_admin");
}
