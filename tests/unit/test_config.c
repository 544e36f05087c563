/* SPDX-License-Identifier: BSD-3-Clause */
/* Config loader: the sample loads; every kind of bad input names file and line. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kvp_core.h"

static char path[] = "/tmp/kvp-test-config-XXXXXX";

static int
load_text(const char *text, struct kvp_config *cfg, char *err, size_t errlen)
{
	FILE *f = fopen(path, "w");

	fputs(text, f);
	fclose(f);
	err[0] = '\0';
	return kvp_config_load(path, cfg, err, errlen);
}

/* The error must read "<path>:<line>: ..." and mention @p what. */
static void
expect_error(const char *text, int line, const char *what)
{
	struct kvp_config cfg;
	char err[512], prefix[128];

	CHECK_EQ(load_text(text, &cfg, err, sizeof(err)), -EINVAL);
	snprintf(prefix, sizeof(prefix), "%s:%d: ", path, line);
	if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, what)) {
		fprintf(stderr, "unexpected error text '%s' (want prefix '%s' and '%s')\n", err,
			prefix, what);
		check_failures++;
	}
}

int
main(int argc, char **argv)
{
	struct kvp_config cfg;
	char err[512];
	int fd = mkstemp(path);

	if (fd < 0)
		return 99;
	close(fd);

	/* The shipped sample is valid and documents real keys. */
	if (argc > 1) {
		CHECK_EQ(kvp_config_load(argv[1], &cfg, err, sizeof(err)), 0);
		CHECK(strcmp(cfg.node_id, "prefill0") == 0);
		CHECK_EQ(cfg.npeers, 1);
	}
	/* Defaults fill in what the file leaves out. */
	CHECK_EQ(load_text("node_id = \"n1\";\n", &cfg, err, sizeof(err)), 0);
	CHECK_EQ(cfg.max_inflight, 256);
	CHECK_EQ(cfg.tcp_frame_max, 4u << 20);
	CHECK_EQ(cfg.listen_port, 7400);
	CHECK_EQ(cfg.transport, KVP_TRANSPORT_TCP);
	CHECK(!cfg.busy_poll);
	CHECK_EQ(load_text("node_id = \"n1\";\npoll = { busy = true; idle_us = 5; };\n"
			   "limits = { max_inflight = 8; };\nlisten = \"[::1]:9000\";\n",
			   &cfg, err, sizeof(err)),
		 0);
	CHECK(cfg.busy_poll);
	CHECK_EQ(cfg.idle_us, 5);
	CHECK_EQ(cfg.max_inflight, 8);
	CHECK_EQ(cfg.listen_port, 9000);
	CHECK(strcmp(cfg.listen_host, "[::1]") == 0);

	expect_error("node_id = \"n1\";\nbogus = 1;\n", 2, "unknown key 'bogus'");
	expect_error("node_id = \"n1\";\nlimits = {\n  max_inflight = 1;\n  nope = 2;\n};\n", 4,
		     "unknown key 'limits.nope'");
	expect_error("node_id = \"n1\";\nlimits = { max_inflight = \"many\"; };\n", 2,
		     "expected an integer");
	expect_error("node_id = \"n1\";\n\nlimits = { max_inflight = 0; };\n", 3, "out of range");
	expect_error("node_id = \"n1\";\ntcp = { frame_max = 100; };\n", 2, "out of range");
	expect_error("node_id = \"n1\";\npoll = { busy = 1; };\n", 2, "expected true or false");
	expect_error("node_id = \"n1\";\nlimits = { max_inflight = ; };\n", 2, "syntax error");
	expect_error("node_id = \"n1\";\nlisten = \"nocolon\";\n", 2, "host:port");
	expect_error("node_id = \"n1\";\nlisten = \"h:70000\";\n", 2, "host:port");
	expect_error("node_id = \"n1\";\ntransport = \"carrier-pigeon\";\n", 2, "\"tcp\"");
	expect_error("node_id = \"n1\";\nlog_level = \"loud\";\n", 2, "log level");
	expect_error("listen = \"a:1\";\n", 0, "node_id");
	expect_error("node_id = \"bad id!\";\n", 1, "node_id");
	expect_error("node_id = \"n1\";\npeers = ( { node_id = \"n1\"; addr = \"h:1\"; } );\n", 2,
		     "own id");
	expect_error("node_id = \"n1\";\npeers = (\n { node_id = \"p\"; addr = \"h:1\"; },\n"
		     " { node_id = \"p\"; addr = \"h:2\"; }\n);\n",
		     4, "duplicate");
	expect_error("node_id = \"n1\";\npeers = ( { node_id = \"p\"; port = 3; } );\n", 2,
		     "unknown key 'port'");
	expect_error("node_id = \"n1\";\npeers = ( { node_id = \"p\"; } );\n", 2, "required");
	expect_error("node_id = \"n1\";\nlimits = { sq_entries = 1000; };\n", 2, "powers of two");
	expect_error("node_id = \"n1\";\nlimits = { sq_entries = 512; max_segments = 512; };\n",
		     2, "must exceed");

	/* The shared secret comes inline or from the first line of a file. */
	CHECK_EQ(load_text("node_id = \"n1\";\nauth = { secret = \"abc\"; };\n", &cfg, err,
			   sizeof(err)),
		 0);
	CHECK(strcmp(cfg.auth_secret, "abc") == 0);
	char sf[] = "/tmp/kvp-test-secret-XXXXXX", text[256];
	int sfd = mkstemp(sf);
	CHECK(sfd >= 0 && write(sfd, "from-file\nignored\n", 19) == 19);
	close(sfd);
	snprintf(text, sizeof(text), "node_id = \"n1\";\nauth = { secret_file = \"%s\"; };\n", sf);
	CHECK_EQ(load_text(text, &cfg, err, sizeof(err)), 0);
	CHECK(strcmp(cfg.auth_secret, "from-file") == 0);
	unlink(sf);
	expect_error(text, 2, "cannot read the secret file");

	/* Socket groups: a name from the group database or a number; a typo names its line. */
	CHECK_EQ(load_text("node_id = \"n1\";\n", &cfg, err, sizeof(err)), 0);
	CHECK(cfg.admin_group.name[0] == '\0' && cfg.client_group.name[0] == '\0');
	CHECK_EQ(cfg.admin_timeout_ms, 5000);
	CHECK_EQ(cfg.admin_idle_ms, 60000);
	CHECK_EQ(load_text("node_id = \"n1\";\nadmin_group = \"root\";\nclient_group = \"4242\";\n"
			   "timeouts = { admin_ms = 250; admin_idle_ms = 900; };\n",
			   &cfg, err, sizeof(err)),
		 0);
	CHECK(strcmp(cfg.admin_group.name, "root") == 0);
	CHECK_EQ(cfg.admin_group.gid, 0);
	CHECK_EQ(cfg.client_group.gid, 4242);
	CHECK_EQ(cfg.admin_timeout_ms, 250);
	CHECK_EQ(cfg.admin_idle_ms, 900);
	char val[64];
	CHECK_EQ(kvp_config_get(&cfg, "client_group", val, sizeof(val), NULL), 0);
	CHECK(strcmp(val, "4242") == 0);
	CHECK_EQ(kvp_config_set(&cfg, "admin_group", "0", text, sizeof(text)), -EPERM);
	CHECK_EQ(kvp_config_set(&cfg, "timeouts.admin_ms", "700", text, sizeof(text)), 0);
	CHECK_EQ(cfg.admin_timeout_ms, 700);
	expect_error("node_id = \"n1\";\n\nadmin_group = \"no-such-group-kvp\";\n", 3,
		     "admin_group: no such group: 'no-such-group-kvp'");
	expect_error("node_id = \"n1\";\nclient_group = \"4294967295\";\n", 2, "out of range");
	expect_error("node_id = \"n1\";\nclient_group = 100;\n", 2, "expected a string");
	expect_error("node_id = \"n1\";\ntimeouts = { admin_ms = 0; };\n", 2, "out of range");

	/* A missing file is ENOENT, not a crash. */
	CHECK_EQ(kvp_config_load("/nonexistent/kvp.conf", &cfg, err, sizeof(err)), -ENOENT);
	CHECK(strstr(err, "/nonexistent/kvp.conf:0:") == err);

	unlink(path);
	return check_result("test_config");
}
