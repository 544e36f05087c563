/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Config loader: the sample loads; every kind of bad input names file and
 * line. Integers are read as 64 bits whatever libconfig does with them;
 * authentication cannot be switched off by the order of keys or by leaving
 * it out on a public address; stats.file cannot be moved anywhere at run time.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvp_config.h"
#include "kvp_log.h"
#include "kvp_test.h"

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
		kvp_test_failures++;
	}
}

/*
 * libconfig 1.5 reads unsuffixed literals as int: 99999999999999 became
 * 276447231 and 2147483648 became negative. Every value past 32 bits must be
 * seen as written: refused when out of range, accepted when in it.
 */
static void
integers_64(void)
{
	struct kvp_config cfg;
	char err[512];

	expect_error("node_id = \"n1\";\ntcp = { frame_max = 99999999999999; };\n", 2,
		     "tcp.frame_max: 99999999999999 out of range");
	expect_error("node_id = \"n1\";\ntcp = { frame_max = 4294967296; };\n", 2,
		     "4294967296 out of range");
	expect_error("node_id = \"n1\";\ntcp = { frame_max = 4294971392; };\n", 2,
		     "4294971392 out of range"); /* 2^32 + 4096: wrapped, it would be in range */
	expect_error("node_id = \"n1\";\nlimits = { max_clients = 0x100000010; };\n", 2,
		     "4294967312 out of range");
	expect_error("node_id = \"n1\";\nstage = { pool = 2147483649; };\n", 2,
		     "2147483649 out of range");
	expect_error("node_id = \"n1\";\n\ntcp = { frame_max = 99999999999999999999; };\n", 3,
		     "does not fit in 64 bits");
	expect_error("node_id = \"n1\";\ntcp = { frame_max = 0x1FFFFFFFFFFFFFFFF; };\n", 2,
		     "does not fit in 64 bits");
	expect_error("node_id = \"n1\";\ntcp = { frame_max = -1; };\n", 2, "-1 out of range");
	expect_error("node_id = \"n1\";\ntcp = { frame_max = 1e3; };\n", 2, "expected an integer");
	expect_error("node_id = \"n1\";\n@include \"/etc/passwd\"\n", 2, "@include is not supported");
	/* The documented maximum, as written: no "L" needed. */
	CHECK_EQ(load_text("node_id = \"n1\";\nstage = { pool = 2147483648; };\n", &cfg, err,
			   sizeof(err)),
		 0);
	CHECK_EQ(cfg.stage_pool, 2147483648u);
	CHECK_EQ(load_text("node_id = \"n1\";\nstage = { pool = 2147483648L; buffer = 0x100000; };\n",
			   &cfg, err, sizeof(err)),
		 0);
	CHECK_EQ(cfg.stage_buf, 1u << 20);
	/* Digits inside names, strings and comments are not numbers. */
	CHECK_EQ(load_text("node_id = \"n1-2x3\"; # 99999999999999\n/* 4294967296 */ "
			   "rdma = { devices = \"mlx5_0:1\"; };\n",
			   &cfg, err, sizeof(err)),
		 0);
	CHECK(strcmp(cfg.node_id, "n1-2x3") == 0 && strcmp(cfg.rdma_devices, "mlx5_0:1") == 0);
}

static void
authentication(const char *sf)
{
	struct kvp_config cfg;
	char err[512], text[512], val[32];
	int fd = open(sf, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	CHECK(fd >= 0 && write(fd, "from-file\n", 10) == 10);
	close(fd);
	/* Both ways of giving the secret: an error at the later one, in either order. */
	snprintf(text, sizeof(text),
		 "node_id = \"n1\";\nauth = {\n secret_file = \"%s\";\n secret = \"\";\n};\n", sf);
	expect_error(text, 4, "secret and secret_file are both set");
	snprintf(text, sizeof(text),
		 "node_id = \"n1\";\nauth = {\n secret = \"x\";\n secret_file = \"%s\";\n};\n", sf);
	expect_error(text, 4, "secret and secret_file are both set");
	/* No secret on a public address: refused, unless auth = "none" says so. */
	expect_error("node_id = \"n1\";\nlisten = \"0.0.0.0:7400\";\n", 2,
		     "is not a loopback address");
	expect_error("node_id = \"n1\";\nlisten = \"10.1.2.3:7400\";\nauth = { secret = \"\"; };\n", 2,
		     "is not a loopback address");
	expect_error("node_id = \"n1\";\nlisten = \"[::]:7400\";\n", 2, "is not a loopback address");
	expect_error("node_id = \"n1\";\nauth = \"off\";\n", 2, "expected \"none\"");
	CHECK_EQ(load_text("node_id = \"n1\";\nlisten = \"0.0.0.0:7400\";\nauth = \"none\";\n", &cfg,
			   err, sizeof(err)),
		 0);
	CHECK(cfg.auth_none && cfg.auth_secret[0] == '\0');
	CHECK_EQ(kvp_config_get(&cfg, "auth", val, sizeof(val), NULL), 0);
	CHECK(strcmp(val, "none") == 0);
	snprintf(text, sizeof(text),
		 "node_id = \"n1\";\nlisten = \"0.0.0.0:7400\";\nauth = { secret_file = \"%s\"; };\n", sf);
	CHECK_EQ(load_text(text, &cfg, err, sizeof(err)), 0);
	CHECK(!cfg.auth_none && strcmp(cfg.auth_secret, "from-file") == 0);
	/* Loopback needs no secret; the default listen address is loopback. */
	static const char *const lo[] = { "127.0.0.1:1", "127.9.9.9:1", "[::1]:1", "localhost:1" };
	for (size_t i = 0; i < sizeof(lo) / sizeof(lo[0]); i++) {
		snprintf(text, sizeof(text), "node_id = \"n1\";\nlisten = \"%s\";\n", lo[i]);
		CHECK_EQ(load_text(text, &cfg, err, sizeof(err)), 0);
	}
	CHECK_EQ(load_text("node_id = \"n1\";\n", &cfg, err, sizeof(err)), 0);
	CHECK(strcmp(cfg.listen_host, "127.0.0.1") == 0);
	unlink(sf);
}

/* stats.file: absolute at start; at run time only within its start directory. */
static void
stats_file(void)
{
	struct kvp_config cfg;
	char err[512], why[256];

	expect_error("node_id = \"n1\";\nstats = { file = \"/var/lib/x/\"; };\n", 2,
		     "absolute path of a file");
	CHECK_EQ(load_text("node_id = \"n1\";\n", &cfg, err, sizeof(err)), 0);
	CHECK_EQ(kvp_config_set(&cfg, "stats.file", "/tmp/x.prom", why, sizeof(why)), -EPERM);
	CHECK(strstr(why, "no stats.file was configured at start") != NULL);
	CHECK_EQ(kvp_config_set(&cfg, "stats.file", "", why, sizeof(why)), 0);
	CHECK_EQ(load_text("node_id = \"n1\";\nstats = { file = \"/var/lib/kvp/a.prom\"; };\n", &cfg,
			   err, sizeof(err)),
		 0);
	static const char *const refused[] = {
		"/etc/shadow", "/var/lib/kvp/../../../etc/shadow", "/var/lib/kvp/sub/a.prom",
		"relative.prom", "/var/lib/kvp/", "/var/lib/kvp/..", "/var/lib/kvpx/a.prom",
	};
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		CHECK_EQ(kvp_config_set(&cfg, "stats.file", refused[i], why, sizeof(why)), -EPERM);
		CHECK(strcmp(cfg.stats_file, "/var/lib/kvp/a.prom") == 0);
	}
	CHECK_EQ(kvp_config_set(&cfg, "stats.file", "/var/lib/kvp/b.prom", why, sizeof(why)), 0);
	CHECK(strcmp(cfg.stats_file, "/var/lib/kvp/b.prom") == 0);
	CHECK_EQ(kvp_config_set(&cfg, "stats.file", "", why, sizeof(why)), 0);
	CHECK_EQ(kvp_config_set(&cfg, "stats.file", "/var/lib/kvp/a.prom", why, sizeof(why)), 0);
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
	/* limits.max_peers bounds the file's list too (it sizes the tables the list fills). */
	expect_error("node_id = \"n1\";\nlimits = { max_peers = 1; };\npeers = (\n { node_id = \"p\"; "
		     "addr = \"h:1\"; },\n { node_id = \"q\"; addr = \"h:2\"; }\n);\n",
		     3, "2 peers, but limits.max_peers is 1");
	expect_error("node_id = \"n1\";\nlimits = { max_peers = 0; };\n", 2, "out of range");
	expect_error("node_id = \"n1\";\nlimits = { max_peers = 1025; };\n", 2, "out of range");
	/* Forgetting faster than a second would drop a peer between two reconnect tries. */
	expect_error("node_id = \"n1\";\ntimeouts = { peer_forget_ms = 999; };\n", 2,
		     "timeouts.peer_forget_ms: 999 out of range [1000, 86400000]");
	expect_error("node_id = \"n1\";\ntimeouts = { peer_forget_ms = 86400001; };\n", 2,
		     "out of range");
	expect_error("node_id = \"n1\";\npeers = ( { node_id = \"p\"; addr = \"a b:1\"; } );\n", 2,
		     "host:port");
	{
		char host[64];
		uint16_t port = 0;

		CHECK_EQ(kvp_config_parse_hostport("[fd00::1]:7400", host, sizeof(host), &port), 0);
		CHECK(strcmp(host, "[fd00::1]") == 0 && port == 7400);
		CHECK_EQ(kvp_config_parse_hostport("decode-0.svc:1", host, sizeof(host), &port), 0);
		static const char *const bad[] = { "h", "h:", ":1", "h:0", "h:65536", "h: 1", "h:+1",
						   "h:1x", "a/b:1", "", "h:-1" };
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
			CHECK_EQ(kvp_config_parse_hostport(bad[i], host, sizeof(host), &port), -EINVAL);
		CHECK(kvp_config_node_id_ok("decode-1.a_b"));
		CHECK(!kvp_config_node_id_ok("") && !kvp_config_node_id_ok("a:b") &&
		      !kvp_config_node_id_ok("0123456789012345678901234567890123"));
	}
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

	integers_64();
	authentication(sf);
	stats_file();

	/* A missing file is ENOENT, not a crash. */
	CHECK_EQ(kvp_config_load("/nonexistent/kvp.conf", &cfg, err, sizeof(err)), -ENOENT);
	CHECK(strstr(err, "/nonexistent/kvp.conf:0:") == err);

	unlink(path);
	return kvp_test_result("test_config");
}
