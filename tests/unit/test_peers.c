/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer table (lib/ctrl/peer_table.c) without workers or sockets: which
 * slot a peer takes, what it may not be (a duplicate, this node, a bad id
 * or address, one too many), that removing frees the slot and moves its
 * generation on so that an old handle names nothing, and the admin methods
 * that refuse bad input with the reason and change nothing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ctrl_priv.h"
#include "kvp_test.h"

static struct kvp_node node;
static const struct kvp_transport_ops ops = { .name = "tcp" };

static int
add(int origin, const char *id, const char *host, uint16_t port)
{
	char why[192];
	int rc = peer_add(&node, origin, id, host, port, why, sizeof(why));

	if (rc < 0)
		fprintf(stderr, "  peer_add %s %s:%u: %s\n", id, host, port, why);
	return rc;
}

/* An admin call; @return the error code (0 for a result) and the message in @p msg. */
static int
rpc(const char *req, char *msg, size_t len)
{
	static char out[1 << 16];
	size_t n = kvp_admin_handle(&node, req, strlen(req), out, sizeof(out));
	json_t *r = json_loadb(out, n, 0, NULL);
	json_t *e = json_object_get(r, "error");
	int code = e ? (int)json_integer_value(json_object_get(e, "code")) : 0;

	snprintf(msg, len, "%s", e ? json_string_value(json_object_get(e, "message")) : "");
	json_decref(r);
	return code;
}

static void
slots(void)
{
	CHECK_EQ(node.npeers, 1);
	CHECK_EQ(peer_find(&node, "p0", false), 0); /* the file's peer: slot 0, handle 0 */
	CHECK_EQ(peer_handle(&node, 0), 0);
	CHECK_EQ(add(KVP_PEER_ADMIN, "p1", "10.0.0.2", 7400), 1);
	CHECK_EQ(add(KVP_PEER_ADMIN, "p1", "10.0.0.9", 7400), -EEXIST);
	CHECK_EQ(add(KVP_PEER_ADMIN, "unit0", "10.0.0.9", 7400), -EINVAL);
	CHECK_EQ(add(KVP_PEER_ADMIN, "p2", "127.0.0.1", 7400), -EINVAL); /* our listen address */
	CHECK_EQ(add(KVP_PEER_ADMIN, "p2", "10.0.0.1", 7400), -EEXIST);	  /* p0's address */
	CHECK_EQ(add(KVP_PEER_ADMIN, "a b", "10.0.0.9", 7400), -EINVAL);
	/* By address: no id yet; the name is its address, host names compare without case. */
	CHECK_EQ(add(KVP_PEER_ON_DEMAND, "", "Decode.Example", 7400), 2);
	CHECK_EQ(peer_find_addr(&node, "decode.example", 7400), 2);
	CHECK(strcmp(peer_label(&node, 2), "Decode.Example:7400") == 0);
	CHECK_EQ(peer_find_addr(&node, "decode.example", 7401), -1);
	/* Inbound: an id, no address. */
	CHECK_EQ(add(KVP_PEER_INBOUND, "p9", "", 0), 3);
	CHECK_EQ(peer_find_addr(&node, "", 0), -1);
	CHECK_EQ(add(KVP_PEER_ADMIN, "p4", "10.0.0.4", 7400), -ENOSPC);
	CHECK_EQ(node.peers_refused_full, 1);
	CHECK_EQ(node.npeers, 4);

	/* Without workers a removal drains at once: the slot is free, its generation moved on. */
	CHECK_EQ(peer_remove(&node, 1, "test"), 0);
	CHECK_EQ(peer_remove(&node, 1, "test"), -ENOENT);
	CHECK(!peer_live(&node, 1));
	CHECK_EQ(peer_find(&node, "p1", true), -1);
	CHECK_EQ(node.npeers, 3);
	/* The lowest free slot; its handle is not the old one's. */
	CHECK_EQ(add(KVP_PEER_ADMIN, "p5", "10.0.0.5", 7400), 1);
	CHECK_EQ(peer_handle(&node, 1), 1 | (1 << KVP_PEER_SLOT_BITS));
	CHECK_EQ(kvp_peer_handle_slot(peer_handle(&node, 1)), 1);
	/* 64 generations fit in the handle; then the count wraps. */
	for (int i = 0; i < 63; i++) {
		CHECK_EQ(peer_remove(&node, 1, "test"), 0);
		CHECK_EQ(add(KVP_PEER_ADMIN, "p5", "10.0.0.5", 7400), 1);
	}
	CHECK_EQ(peer_handle(&node, 1), 1);
}

static void
admin_refusals(void)
{
	char msg[256];
	struct {
		const char *params;
		int code;
		const char *says;
	} cases[] = {
		{ "{}", RPC_INVALID_PARAMS, "params" },
		{ "{\"node_id\":\"x\"}", RPC_INVALID_PARAMS, "params" },
		{ "{\"node_id\":\"x\",\"addr\":\"h:1\",\"more\":1}", RPC_INVALID_PARAMS, "params" },
		{ "{\"node_id\":7,\"addr\":\"h:1\"}", RPC_INVALID_PARAMS, "params" },
		{ "{\"node_id\":\"x y\",\"addr\":\"h:1\"}", RPC_INVALID_PARAMS, "node_id" },
		{ "{\"node_id\":\"x\",\"addr\":\"h\"}", RPC_INVALID_PARAMS, "host:port" },
		{ "{\"node_id\":\"x\",\"addr\":\"h:99999\"}", RPC_INVALID_PARAMS, "host:port" },
		{ "{\"node_id\":\"unit0\",\"addr\":\"h:1\"}", RPC_INVALID_PARAMS, "own id" },
		{ "{\"node_id\":\"p0\",\"addr\":\"h:1\"}", RPC_REFUSED, "already a peer" },
		{ "{\"node_id\":\"x\",\"addr\":\"10.0.0.1:7400\"}", RPC_REFUSED, "already peer 'p0'" },
		{ "{\"node_id\":\"x\",\"addr\":\"h:1\"}", RPC_REFUSED, "table is full" },
	};
	char req[512];
	uint32_t before = node.npeers;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(req, sizeof(req),
			 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"peer_add\",\"params\":%s}",
			 cases[i].params);
		int code = rpc(req, msg, sizeof(msg));

		if (code != cases[i].code || !strstr(msg, cases[i].says))
			kvp_test_fail(__FILE__, __LINE__, "peer_add %s: %d '%s', want %d '%s'",
				      cases[i].params, code, msg, cases[i].code, cases[i].says);
	}
	CHECK_EQ(node.npeers, before);
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"peer_remove\",\"params\":"
		     "{\"node_id\":\"nope\"}}",
		     msg, sizeof(msg)),
		 RPC_REFUSED);
	CHECK(strstr(msg, "is not a peer") != NULL);
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"peer_remove\",\"params\":"
		     "{\"node_id\":\"p0\",\"addr\":\"10.0.0.1:7400\"}}",
		     msg, sizeof(msg)),
		 RPC_INVALID_PARAMS);
	CHECK_EQ(node.npeers, before);
	/* By address: the on-demand peer whose id is not known. */
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"peer_remove\",\"params\":"
		     "{\"addr\":\"decode.example:7400\"}}",
		     msg, sizeof(msg)),
		 0);
	CHECK_EQ(node.npeers, before - 1);
	CHECK_EQ(rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"peer_add\",\"params\":"
		     "{\"node_id\":\"x\",\"addr\":\"[fd00::7]:7400\"}}",
		     msg, sizeof(msg)),
		 0);
	CHECK_EQ(node.npeers, before);
}

int
main(void)
{
	char err[256];

	kvp_config_defaults(&node.cfg);
	snprintf(node.cfg.node_id, sizeof(node.cfg.node_id), "unit0");
	node.cfg.max_peers = 4;
	node.cfg.npeers = 1;
	snprintf(node.cfg.peers[0].node_id, sizeof(node.cfg.peers[0].node_id), "p0");
	snprintf(node.cfg.peers[0].host, sizeof(node.cfg.peers[0].host), "10.0.0.1");
	node.cfg.peers[0].port = 7400;
	node.tops = &ops;
	node.start_ns = kvp_mono_ns();
	CHECK_EQ(peer_table_init(&node, err, sizeof(err)), 0);
	peer_admin_init(&node);
	slots();
	admin_refusals();
	peer_table_fini(&node);
	return kvp_test_result("test_peers");
}
