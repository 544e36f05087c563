/* SPDX-License-Identifier: BSD-3-Clause */
/* Numbers from the command line, sorting, key files between processes, sealed memfds. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "kvp_test.h"

int
kvp_test_parse_u64(const char *s, uint64_t *v)
{
	char *end;
	unsigned long long x;

	errno = 0;
	x = strtoull(s, &end, 0);
	if (errno == ERANGE)
		return -ERANGE;
	if (errno != 0 || end == s || *s == '-')
		return -EINVAL;
	const char *suf = *end ? strchr("kmg", *end | 0x20) : NULL;
	int shift = suf ? 10 * (int)(suf - "kmg" + 1) : 0;

	end += suf != NULL;
	if (*end != '\0')
		return -EINVAL;
	if (shift && x > (UINT64_MAX >> shift))
		return -ERANGE;
	*v = (uint64_t)x << shift;
	return 0;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

void
kvp_test_sort_u64(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
}

int
kvp_test_key_write(const char *path, uint64_t key)
{
	char tmp[4096];
	FILE *f;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	f = fopen(tmp, "w");
	if (f == NULL)
		return -errno;
	if (fprintf(f, "0x%016llx\n", (unsigned long long)key) < 0) {
		int rc = -errno;

		fclose(f);
		return rc;
	}
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		return -errno;
	return 0;
}

int
kvp_test_parse_ipv4(const char *s, struct sockaddr_in *sa)
{
	char host[64];
	const char *colon = strrchr(s, ':');
	uint64_t port;

	if (!colon || (size_t)(colon - s) >= sizeof(host) ||
	    kvp_test_parse_u64(colon + 1, &port) < 0 || port == 0 || port > 65535)
		return -EINVAL;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -EINVAL;
}

int
kvp_test_key_read(const char *path, double wait_s, uint64_t *key)
{
	uint64_t deadline = kvp_test_now_ns() + (uint64_t)(wait_s * 1e9);
	char line[64], *end = line;
	FILE *f;

	while ((f = fopen(path, "r")) == NULL) {
		if (errno != ENOENT)
			return -errno;
		if (kvp_test_now_ns() >= deadline)
			return -ETIMEDOUT;
		nanosleep(&(struct timespec){ .tv_nsec = 20 * 1000 * 1000 }, NULL);
	}
	bool ok = fgets(line, sizeof(line), f) != NULL;
	uint64_t k = ok ? strtoull(line, &end, 16) : 0;

	fclose(f);
	if (!ok || end == line || (*end != '\n' && *end != '\0'))
		return -EBADMSG;
	*key = k;
	return 0;
}

const char *
kvp_test_key_error(int rc)
{
	return rc == -ETIMEDOUT ? "timed out" : rc == -EBADMSG ? "not a key" : strerror(-rc);
}

int
kvp_test_memfd(const char *name, size_t len, bool seal, int *fd, void **map)
{
	int f = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING), rc;

	if (f < 0)
		return -errno;
	if (ftruncate(f, (off_t)len) < 0 || (seal && fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK) < 0))
		goto err_close;
	if (map) {
		void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);

		if (p == MAP_FAILED)
			goto err_close;
		*map = p;
	}
	*fd = f;
	return 0;

err_close:
	rc = -errno;
	close(f);
	return rc;
}
