/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * JSON-RPC 2.0 on the admin socket (main lcore): the method registry (each
 * module registers its own methods from its init: admin.c, rails.c,
 * doctor.c) and the framing, one request or one batch per line, parsed with
 * jansson.
 *
 * As the specification says:
 *  - an id is a string, a number or null, and comes back exactly as it was
 *    written (1.5 as 1.5, 1e3 as 1e3: the reply splices the request's own
 *    text of it); any other id (true, {}, [1]) is an Invalid Request
 *    (-32600) and nothing is executed;
 *  - a notification (a valid request without "id") is executed and never
 *    answered, not even with an error;
 *  - a batch (an array) gets an array of the replies of its requests, in
 *    order, notifications leaving no entry; a batch of notifications only
 *    gets no reply at all; an empty array gets one -32600 error. A batch of
 *    more than ADMIN_BATCH_MAX requests is refused with one -32600 error
 *    (bounded work per line).
 * Integers beyond 64 bits and reals beyond a double are parse errors
 * (jansson's limits), for ids as for everything else; so is a NUL byte
 * anywhere in the line (jansson would skip it).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "ctrl_priv.h"

#define ADMIN_BATCH_MAX 256
#define METHODS_MAX	32

/* The registry: one process, one node (re-registering a name replaces it). */
static struct {
	const char *name;
	admin_method_fn fn;
} methods[METHODS_MAX];
static unsigned nmethods;

void
rpc_register(const char *name, admin_method_fn fn)
{
	for (unsigned i = 0; i < nmethods; i++) {
		if (strcmp(methods[i].name, name) == 0) {
			methods[i].fn = fn;
			return;
		}
	}
	if (nmethods == METHODS_MAX) {
		KVP_LOG(ERR, core, "admin method %s not registered: %u methods at most", name,
			METHODS_MAX);
		return;
	}
	methods[nmethods].name = name;
	methods[nmethods++].fn = fn;
}

static admin_method_fn
method_of(const char *name)
{
	for (unsigned i = 0; i < nmethods; i++)
		if (strcmp(methods[i].name, name) == 0)
			return methods[i].fn;
	return NULL;
}

json_t *
admin_fail(struct rpc_err *e, int code, const char *fmt, ...)
{
	va_list ap;

	e->code = code;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return NULL;
}

/* No params, or an empty object/array. */
bool
admin_no_params(json_t *params)
{
	return !params || (json_is_object(params) && json_object_size(params) == 0);
}

/* The "reply too large" error without its id: what every reply can shrink to. */
#define TOO_LARGE_BASE  80

struct span {
	const char *p;
	size_t len;
};

static const char *
skip_ws(const char *p, const char *end)
{
	while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

static const char *
skip_string(const char *p, const char *end)
{
	for (p++; p < end && *p != '"'; p++)
		if (*p == '\\')
			p++;
	return p < end ? p + 1 : end;
}

/* End of the JSON value starting at @p p (text that jansson accepted). */
static const char *
skip_value(const char *p, const char *end)
{
	int depth = 0;

	if (p < end && *p == '"')
		return skip_string(p, end);
	if (p < end && *p != '{' && *p != '[') {
		while (p < end && !strchr(",}] \t\r\n", *p))
			p++;
		return p;
	}
	while (p < end) {
		if (*p == '"') {
			p = skip_string(p, end);
			continue;
		}
		if (*p == '{' || *p == '[')
			depth++;
		else if (*p == '}' || *p == ']')
			depth--;
		p++;
		if (depth == 0)
			break;
	}
	return p;
}

/* Is the JSON string text [p, p+len) (quotes included) the key "id"? */
static bool
key_is_id(const char *p, size_t len)
{
	if (len == 4 && memcmp(p, "\"id\"", 4) == 0)
		return true;
	if (!memchr(p, '\\', len))
		return false;
	/* Written with escapes ("\u0069d"): decode it. */
	json_t *k = json_loadb(p, len, JSON_DECODE_ANY, NULL);
	bool is = json_is_string(k) && strcmp(json_string_value(k), "id") == 0;

	json_decref(k);
	return is;
}

/* The text of member "id" of the object written at @p obj; false if it has none. */
static bool
raw_id(struct span obj, struct span *id)
{
	const char *p = skip_ws(obj.p, obj.p + obj.len), *end = obj.p + obj.len;

	if (p >= end || *p != '{')
		return false;
	p++;
	while (p < end) {
		p = skip_ws(p, end);
		if (p >= end || *p != '"')
			return false;
		const char *k = p;

		p = skip_string(p, end);
		size_t klen = (size_t)(p - k);

		p = skip_ws(p, end);
		if (p >= end || *p != ':')
			return false;
		p = skip_ws(p + 1, end);
		const char *v = p;

		p = skip_value(p, end);
		if (key_is_id(k, klen)) {
			id->p = v;
			id->len = (size_t)(p - v);
			return true;
		}
		p = skip_ws(p, end);
		if (p >= end || *p != ',')
			return false;
		p++;
	}
	return false;
}

/*
 * One reply line: {"jsonrpc":"2.0","id":ID,"KEY":BODY} with ID the
 * request's own text (null without one). @return its length, 0 if it does
 * not fit (nothing past @p outlen is written)
 */
static size_t
reply_line(const struct span *id, const char *key, json_t *body, char *out, size_t outlen)
{
	int n = snprintf(out, outlen,
			 "{\"jsonrpc\":\"2.0\",\"id\":%.*s,\"%s\":", id ? (int)id->len : 4,
			 id ? id->p : "null", key);

	if (n < 0 || (size_t)n >= outlen || !body)
		return 0;
	size_t bl = json_dumpb(body, out + n, outlen - (size_t)n, JSON_COMPACT | JSON_ENCODE_ANY);

	if (bl == 0 || (size_t)n + bl + 1 > outlen)
		return 0;
	out[(size_t)n + bl] = '}';
	return (size_t)n + bl + 1;
}

/*
 * The message as a JSON string. It may quote the request's own text, cut
 * short by a bounded snprintf in the middle of a character or taken from
 * bytes that are not UTF-8 at all (a parse error's "near '...'"); then its
 * non-ASCII bytes become '?', rather than the reply a misleading "reply too
 * large".
 */
static json_t *
message_string(const char *msg)
{
	json_t *s = json_string(msg);
	char text[sizeof(((struct rpc_err *)0)->msg)];

	if (s)
		return s;
	snprintf(text, sizeof(text), "%s", msg);
	for (char *c = text; *c; c++)
		if ((unsigned char)*c >= 0x80)
			*c = '?';
	return json_string(text);
}

static size_t
error_line(const struct span *id, int code, const char *msg, char *out, size_t outlen)
{
	json_t *e = json_pack("{s:i, s:o}", "code", code, "message", message_string(msg));
	size_t len = reply_line(id, "error", e, out, outlen);

	json_decref(e);
	return len;
}

/*
 * A result, or the error of a reply that does not fit: "reply too large"
 * with the request's id; where even that does not fit there is no reply
 * (0): half a line is never sent.
 */
static size_t
result_line(const struct span *id, json_t *result, char *out, size_t outlen)
{
	size_t len = result ? reply_line(id, "result", result, out, outlen) : 0;
	const char *why = result ? "reply too large" : "cannot build the reply";

	json_decref(result);
	if (len > 0)
		return len;
	return error_line(id, RPC_INTERNAL_ERROR, why, out, outlen);
}

/* An error reply that shrinks like a result when it does not fit. */
static size_t
fail_line(const struct span *id, int code, const char *msg, char *out, size_t outlen)
{
	size_t len = error_line(id, code, msg, out, outlen);

	return len > 0 ? len : error_line(id, RPC_INTERNAL_ERROR, "reply too large", out, outlen);
}

/* One request object (parsed, and its text for the id). @return reply length; 0: none */
static size_t
handle_one(struct kvp_node *n, json_t *req, struct span text, char *out, size_t outlen)
{
	struct span idtext, *id = NULL;
	json_t *jid, *jv, *jm, *params;

	if (!json_is_object(req))
		return fail_line(NULL, RPC_INVALID_REQUEST, "request must be a JSON object", out,
				 outlen);
	jid = json_object_get(req, "id");
	if (jid && !json_is_string(jid) && !json_is_number(jid) && !json_is_null(jid))
		return fail_line(NULL, RPC_INVALID_REQUEST,
				 "id must be a string, a number or null; request not executed", out,
				 outlen);
	if (jid && raw_id(text, &idtext))
		id = &idtext;
	jv = json_object_get(req, "jsonrpc");
	jm = json_object_get(req, "method");
	if (!json_is_string(jv) || strcmp(json_string_value(jv), "2.0") != 0 || !json_is_string(jm))
		return fail_line(id, RPC_INVALID_REQUEST,
				 "need \"jsonrpc\":\"2.0\" and a string \"method\"", out, outlen);
	params = json_object_get(req, "params");
	if (params && !json_is_object(params) && !json_is_array(params))
		return fail_line(id, RPC_INVALID_REQUEST, "params must be an object or array", out,
				 outlen);

	/* A valid request: from here on a notification is executed if it can be, never answered. */
	const char *name = json_string_value(jm);
	admin_method_fn fn = method_of(name);

	if (!fn) {
		char msg[128];

		snprintf(msg, sizeof(msg), "unknown method '%.64s'", name);
		return jid ? fail_line(id, RPC_METHOD_NOT_FOUND, msg, out, outlen) : 0;
	}
	if (params && !json_is_object(params))
		return jid ? fail_line(id, RPC_INVALID_PARAMS, "params must be an object", out,
				       outlen) :
			     0;

	struct rpc_err err = { 0 };
	json_t *result = fn(n, params, &err);

	if (!jid) {
		json_decref(result);
		return 0;
	}
	if (!result)
		return fail_line(id, err.code ? err.code : RPC_INVALID_PARAMS,
				 err.msg[0] ? err.msg : "invalid params", out, outlen);
	return result_line(id, result, out, outlen);
}

/* The elements of the array written at @p text; -1 past @p max. */
static int
batch_spans(struct span text, struct span *el, int max)
{
	const char *p = skip_ws(text.p, text.p + text.len), *end = text.p + text.len;
	int k = 0;

	p = skip_ws(p + 1, end); /* '[' */
	while (p < end && *p != ']') {
		const char *v = p;

		p = skip_value(p, end);
		if (k == max)
			return -1;
		el[k].p = v;
		el[k].len = (size_t)(p - v);
		k++;
		p = skip_ws(p, end);
		if (p < end && *p == ',')
			p = skip_ws(p + 1, end);
	}
	return k;
}

static size_t
handle_batch(struct kvp_node *n, json_t *batch, struct span text, char *out, size_t outlen)
{
	static struct span el[ADMIN_BATCH_MAX];
	int k = batch_spans(text, el, ADMIN_BATCH_MAX);
	size_t pos = 1, reserve = 0;
	bool any = false;

	if (k < 0 || (size_t)k != json_array_size(batch))
		return fail_line(NULL, RPC_INVALID_REQUEST,
				 k < 0 ? "batch of more than 256 requests" :
					 "cannot split the batch into its requests",
				 out, outlen);
	/*
	 * Keep room for every later request's shortest reply ("reply too large",
	 * its id, a comma), so that one large reply cannot take the place of the
	 * others.
	 */
	for (int i = 0; i < k; i++)
		reserve += TOO_LARGE_BASE + el[i].len + 1;
	if (outlen < 2)
		return 0;
	out[0] = '[';
	for (int i = 0; i < k; i++) {
		reserve -= TOO_LARGE_BASE + el[i].len + 1;

		size_t room = outlen - pos - 1; /* the closing ']' */
		size_t sep = any ? 1 : 0;

		if (room <= sep + reserve)
			break;
		size_t len = handle_one(n, json_array_get(batch, (size_t)i), el[i], out + pos + sep,
					room - sep - reserve);

		if (len == 0)
			continue;
		if (sep)
			out[pos] = ',';
		pos += sep + len;
		any = true;
	}
	if (!any)
		return 0; /* notifications only (or nothing fitted): no reply */
	out[pos++] = ']';
	return pos;
}

size_t
kvp_admin_handle(struct kvp_node *n, const char *line, size_t len, char *out, size_t outlen)
{
	const char *nul = memchr(line, '\0', len);
	struct span text = { line, len };
	json_error_t jerr;
	json_t *req;
	size_t rlen;

	if (nul) {
		/* jansson reads past a NUL byte as if it were not there; the ids' own scan would not. */
		char msg[64];

		snprintf(msg, sizeof(msg), "a NUL byte at offset %zu of the request",
			 (size_t)(nul - line));
		return fail_line(NULL, RPC_PARSE_ERROR, msg, out, outlen);
	}
	req = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	if (!req)
		return fail_line(NULL, RPC_PARSE_ERROR, jerr.text, out, outlen);
	if (json_is_array(req))
		rlen = json_array_size(req) == 0 ?
			       fail_line(NULL, RPC_INVALID_REQUEST, "empty batch", out, outlen) :
			       handle_batch(n, req, text, out, outlen);
	else
		rlen = handle_one(n, req, text, out, outlen);
	json_decref(req);
	return rlen;
}
