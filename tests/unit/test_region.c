/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Region table: random keys, bounds, ownership, deferred unmap under
 * references. Guarded copies: memory gone under a mapping (a page past the
 * end of a file cut short) fails the copy with -EFAULT, twice in a row (SIGBUS
 * is not left blocked), and a probe of a range finds the page; a SIGBUS
 * outside a guarded copy still kills, and so does one sent with kill(),
 * also with the handler installed twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvp_guard.h"
#include "kvp_region.h"
#include "kvp_test.h"

static void
guard_checks(void)
{
	long page = sysconf(_SC_PAGESIZE);
	char buf[64] = "guarded";
	uint8_t *m;
	int fd, st = 0;

	if (kvp_test_memfd("kvp-guard", (size_t)page * 2, false, &fd, NULL) < 0)
		kvp_test_setup_failed("memfd");
	m = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	REQUIRE(m != MAP_FAILED, "mmap");
	CHECK_EQ(kvp_guard_init(), 0);
	CHECK_EQ(ftruncate(fd, page), 0); /* the second page is gone under the mapping */
	CHECK_EQ(kvp_guard_copy(m + 8, buf, sizeof(buf)), 0);
	CHECK(memcmp(m + 8, buf, sizeof(buf)) == 0);
	CHECK_EQ(kvp_guard_copy(m + page + 8, buf, sizeof(buf)), -EFAULT);
	CHECK_EQ(kvp_guard_copy(buf, m + page, sizeof(buf)), -EFAULT);
	CHECK_EQ(kvp_guard_copy(buf, m, sizeof(buf)), 0);
	/* A probe finds a gone page wherever the range meets it, even by its last byte only. */
	CHECK_EQ(kvp_guard_probe(m, (size_t)page), 0);
	CHECK_EQ(kvp_guard_probe(m + 1, (size_t)page - 1), 0);
	CHECK_EQ(kvp_guard_probe(m + 8, (size_t)page), -EFAULT);
	CHECK_EQ(kvp_guard_probe(m + page + 100, 1), -EFAULT);
	CHECK_EQ(kvp_guard_probe(m + page, 0), 0);
	pid_t pid = fork();

	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		if (null >= 0)
			dup2(null, 2); /* a sanitizer's report of it is expected */
		m[page] = 1; /* not guarded: the handler before ours, or the default action */
		_exit(0);
	}
	REQUIRE(pid > 0, "fork");
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	/* SIGBUS, or SIGABRT from a sanitizer's handler (abort_on_error). */
	CHECK(WIFSIGNALED(st) && (WTERMSIG(st) == SIGBUS || WTERMSIG(st) == SIGABRT));
	/* Installed twice: still one handler; a SIGBUS sent (not a fault) is not swallowed. */
	CHECK_EQ(kvp_guard_init(), 0);
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		if (null >= 0)
			dup2(null, 2);
		kill(getpid(), SIGBUS);
		_exit(0);
	}
	REQUIRE(pid > 0, "fork");
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	CHECK(WIFSIGNALED(st) && (WTERMSIG(st) == SIGBUS || WTERMSIG(st) == SIGABRT));
	CHECK_EQ(kvp_guard_copy(m + page, buf, sizeof(buf)), -EFAULT);
	munmap(m, (size_t)page * 2);
	close(fd);
}

int
main(void)
{
	struct kvp_region_table t;
	uint64_t k1 = 0, k2 = 0, k3 = 0, k4 = 0;
	int fd, rc = kvp_test_memfd("kvp-test", 1 << 20, false, &fd, NULL);

	if (rc < 0)
		kvp_test_setup_failed("memfd: %s", strerror(-rc));
	/* Init sets every field: the release below must not jump through stack garbage. */
	memset(&t, 0xa5, sizeof(t));
	CHECK_EQ(kvp_region_table_init(&t, 0), -EINVAL);
	CHECK_EQ(kvp_region_table_init(&t, 3), 0);

	/* A memfd that could shrink under the mapping is refused. */
	CHECK_EQ(kvp_region_add(&t, 1, fd, 0, 4096, KVP_REGION_HOST, &k1), -EPERM);
	CHECK_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);

	/* Bad ranges never map. */
	CHECK_EQ(kvp_region_add(&t, 1, fd, 0, 0, KVP_REGION_HOST, &k1), -EINVAL);
	CHECK_EQ(kvp_region_add(&t, 1, fd, 4096, 1 << 20, KVP_REGION_HOST, &k1), -EINVAL);
	CHECK_EQ(kvp_region_add(&t, 1, fd, UINT64_MAX - 10, 100, KVP_REGION_HOST, &k1), -EINVAL);
	CHECK_EQ(kvp_region_add(&t, 1, fd, 0, 4096, 0x80, &k1), -EINVAL);
	CHECK_EQ(kvp_region_add(&t, 1, -1, 0, 4096, KVP_REGION_HOST, &k1), -EINVAL);

	/* Unaligned offsets map; the view starts where asked. */
	uint8_t *mine = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	mine[5000] = 0xab;
	CHECK_EQ(kvp_region_add(&t, 1, fd, 5000, 8192, KVP_REGION_HOST, &k1), 0);
	CHECK_EQ(kvp_region_add(&t, 1, fd, 0, 1 << 20, KVP_REGION_HOST, &k2), 0);
	CHECK_EQ(kvp_region_add(&t, 2, fd, 0, 4096, KVP_REGION_HOST, &k3), 0);
	CHECK_EQ(kvp_region_add(&t, 2, fd, 0, 4096, KVP_REGION_HOST, &k4), -ENOSPC);
	CHECK(k1 != 0 && k1 != k2 && k2 != k3);
	/* Keys carry random bits above the slot index. */
	CHECK((k1 >> 16) != (k2 >> 16) || (k2 >> 16) != (k3 >> 16));

	struct kvp_region *r = kvp_region_get(&t, k1);
	CHECK(r != NULL);
	if (r) {
		CHECK_EQ(r->base[0], 0xab);
		CHECK(kvp_region_contains(r, 0, 8192));
		CHECK(!kvp_region_contains(r, 1, 8192));
		CHECK(!kvp_region_contains(r, 0, 0));
		CHECK(!kvp_region_contains(r, 8192, 1));
		CHECK(!kvp_region_contains(r, UINT64_MAX, 2));
	}
	/* A guessed key with the right slot but wrong random bits is unknown. */
	CHECK(kvp_region_get(&t, k1 ^ (1ull << 40)) == NULL);
	CHECK(kvp_region_get(&t, 0) == NULL);

	/* Only the owner removes; a referenced region is busy. */
	CHECK_EQ(kvp_region_remove(&t, k1, 2), -ENOENT);
	CHECK_EQ(kvp_region_remove(&t, k1, 1), -EBUSY);
	CHECK(kvp_region_get(&t, k1) != NULL); /* still active after EBUSY */
	kvp_region_put(r);
	kvp_region_put(r);
	CHECK_EQ(kvp_region_remove(&t, k1, 1), 0);
	CHECK(kvp_region_get(&t, k1) == NULL);
	CHECK_EQ(kvp_region_remove(&t, k1, 1), -ENOENT);

	/* Owner teardown: unmapped only after the last reference goes. */
	struct kvp_region *r2 = kvp_region_get(&t, k2);
	kvp_region_remove_owner(&t, 1);
	CHECK(kvp_region_get(&t, k2) == NULL);
	CHECK_EQ(kvp_region_count(&t, 1), 1);
	CHECK_EQ(kvp_region_reap(&t), 0);
	kvp_region_put(r2);
	CHECK_EQ(kvp_region_reap(&t), 1);
	CHECK_EQ(kvp_region_count(&t, 1), 0);
	CHECK_EQ(kvp_region_count(&t, 2), 1);
	CHECK_EQ(t.used, 1);

	kvp_region_table_fini(&t);
	munmap(mine, 1 << 20);
	close(fd);
	guard_checks();
	return kvp_test_result("test_region");
}
