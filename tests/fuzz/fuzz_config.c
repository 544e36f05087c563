/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target: the configuration loader, kvp_config_load() (libconfig text
 * in, validated struct or "FILE:LINE: message" out), plus kvp_config_get()
 * and kvp_config_set() on what it loaded.
 *
 * Invariants: the result is 0 or -EINVAL (-ENOENT never: the file exists);
 * on failure the message starts with "PATH:LINE: " and is NUL-terminated
 * within the buffer, however small; on success every integer key lies in its
 * table bounds, node ids are valid and unique, ports non-zero, ring sizes
 * powers of two, sq_entries > max_segments, the staging pool holds at least
 * 4 buffers, every string is terminated; config_set never takes an out-of-
 * bounds value.
 *
 * Inputs naming /dev/ or /proc/ are skipped: auth.secret_file would read
 * other files (a terminal would block). "@include" is fuzzed: the loader
 * refuses it before libconfig could open anything.
 */
#include <ctype.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"

/*
 * libconfig 1.5 (Debian 12) leaks the string it was scanning when it meets a
 * syntax error (strbuf_append). kvproxyd loads its config once at start, so
 * this costs nothing there; here it would stop the fuzzer at every such input.
 */
const char *__lsan_default_suppressions(void);

const char *
__lsan_default_suppressions(void)
{
	return "leak:libconfig.so\n";
}

static int cfd = -1;
static char path[64];

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	/* Logging is not used by the loader; the EAL is not needed. */
	cfd = memfd_create("fuzz-config", MFD_CLOEXEC);
	REQUIRE(cfd >= 0, "memfd_create");
	snprintf(path, sizeof(path), "/proc/self/fd/%d", cfd);
	return 0;
}

static bool
valid_id(const char *id, size_t size)
{
	size_t n = strnlen(id, size);

	if (n == 0 || n == size)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)id[i]) && id[i] != '-' && id[i] != '_' && id[i] != '.')
			return false;
	return true;
}

static bool
pow2(uint32_t v)
{
	return v && (v & (v - 1)) == 0;
}

static void
check_loaded(struct kvp_config *cfg)
{
	struct kvp_config_info info;
	char v[512], why[256];

	REQUIRE(valid_id(cfg->node_id, sizeof(cfg->node_id)), "node_id '%.32s'", cfg->node_id);
	REQUIRE(cfg->npeers <= KVP_PEERS_MAX, "npeers %u", cfg->npeers);
	for (uint32_t i = 0; i < cfg->npeers; i++) {
		const struct kvp_peer_conf *p = &cfg->peers[i];

		REQUIRE(valid_id(p->node_id, sizeof(p->node_id)), "peer %u id", i);
		REQUIRE(strcmp(p->node_id, cfg->node_id) != 0, "peer %u is this node", i);
		REQUIRE(p->port != 0 && strnlen(p->host, sizeof(p->host)) < sizeof(p->host) &&
				p->host[0] != '\0',
			"peer %u address", i);
		for (uint32_t j = 0; j < i; j++)
			REQUIRE(strcmp(cfg->peers[j].node_id, p->node_id) != 0, "duplicate peer %s",
				p->node_id);
	}
	REQUIRE(cfg->listen_port != 0 && cfg->listen_host[0] != '\0', "listen address");
	REQUIRE(strnlen(cfg->listen_host, sizeof(cfg->listen_host)) < sizeof(cfg->listen_host),
		"listen host unterminated");
	REQUIRE(strnlen(cfg->client_socket, sizeof(cfg->client_socket)) <
				sizeof(cfg->client_socket) &&
			strnlen(cfg->admin_socket, sizeof(cfg->admin_socket)) <
				sizeof(cfg->admin_socket) &&
			cfg->client_socket[0] && cfg->admin_socket[0],
		"socket paths");
	REQUIRE(strnlen(cfg->auth_secret, sizeof(cfg->auth_secret)) < sizeof(cfg->auth_secret),
		"secret unterminated");
	REQUIRE(pow2(cfg->sq_entries) && pow2(cfg->cq_entries), "ring sizes");
	REQUIRE(cfg->sq_entries > cfg->max_segments, "sq_entries <= max_segments");
	REQUIRE(cfg->stage_buf && cfg->stage_pool / cfg->stage_buf >= 4, "staging pool");
	REQUIRE(cfg->transport >= KVP_TRANSPORT_TCP && cfg->transport <= KVP_TRANSPORT_AUTO,
		"transport %d", cfg->transport);

	/* Every key through the table: integers within their bounds, values printable. */
	for (unsigned i = 0; kvp_config_describe(i, &info) == 0; i++) {
		REQUIRE(kvp_config_get(cfg, info.key, v, sizeof(v), NULL) == 0, "get %s", info.key);
		if (info.kind == KVP_CONF_INT) {
			char *end;
			unsigned long long x = strtoull(v, &end, 10);

			REQUIRE(*end == '\0' && x >= info.min && x <= info.max,
				"%s = %s outside [%u, %u]", info.key, v, info.min, info.max);
		}
	}
	/* Out-of-bounds runtime values are refused and change nothing. */
	for (unsigned i = 0; kvp_config_describe(i, &info) == 0; i++) {
		if (!info.runtime || info.kind != KVP_CONF_INT)
			continue;
		char before[64], after[64], big[32];

		kvp_config_get(cfg, info.key, before, sizeof(before), NULL);
		snprintf(big, sizeof(big), "%llu", (unsigned long long)info.max + 1);
		REQUIRE(kvp_config_set(cfg, info.key, big, why, sizeof(why)) == -EINVAL,
			"%s accepted %s", info.key, big);
		kvp_config_get(cfg, info.key, after, sizeof(after), NULL);
		REQUIRE(strcmp(before, after) == 0, "refused set of %s changed it", info.key);
	}
}

static void
check_error(const char *err, size_t errlen)
{
	size_t plen = strlen(path);

	REQUIRE(memchr(err, '\0', errlen) != NULL, "error message unterminated");
	if (errlen < plen + 32)
		return;
	REQUIRE(strncmp(err, path, plen) == 0 && err[plen] == ':',
		"error does not start with the path: '%s'", err);
	const char *p = err + plen + 1;
	REQUIRE(isdigit((unsigned char)*p), "error without a line number: '%s'", err);
	while (isdigit((unsigned char)*p))
		p++;
	REQUIRE(p[0] == ':' && p[1] == ' ' && p[2] != '\0', "error without a message: '%s'", err);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t errlens[] = { 512, 40, 16, 1 };
	struct kvp_config cfg;
	char *err;
	size_t errlen;
	int rc;

	if (size == 0)
		return 0;
	errlen = errlens[data[0] % 4];
	data++;
	size--;
	if (memmem(data, size, "/dev/", 5) || memmem(data, size, "/proc/", 6))
		return 0;
	REQUIRE(ftruncate(cfd, 0) == 0 && pwrite(cfd, data, size, 0) == (ssize_t)size,
		"writing the config");
	err = malloc(errlen); /* exact size: ASan sees any overrun */
	REQUIRE(err != NULL, "out of memory");
	memset(err, 0x7f, errlen);
	rc = kvp_config_load(path, &cfg, err, errlen);
	REQUIRE(rc == 0 || rc == -EINVAL, "kvp_config_load returned %d", rc);
	if (rc == 0)
		check_loaded(&cfg);
	else
		check_error(err, errlen);
	free(err);
	return 0;
}
