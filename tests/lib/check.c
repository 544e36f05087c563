/* SPDX-License-Identifier: BSD-3-Clause */
/* Checks: count and go on (CHECK), or stop (REQUIRE, set-up failures, skips). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvp_test.h"

int kvp_test_failures;

void
kvp_test_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAIL %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	kvp_test_failures++;
}

void
kvp_test_abort(const char *file, int line, const char *cond, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s:%d: invariant failed: %s: ", file, line, cond);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

static void
vsay(const char *what, const char *fmt, va_list ap)
{
	fprintf(stderr, "%s: ", what);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

void
kvp_test_setup_failed(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay("SETUP FAILED", fmt, ap);
	va_end(ap);
	exit(99);
}

void
kvp_test_skip(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsay("SKIP", fmt, ap);
	va_end(ap);
	exit(77);
}

int
kvp_test_result(const char *name)
{
	if (kvp_test_failures) {
		fprintf(stderr, "%s: %d check(s) failed\n", name, kvp_test_failures);
		return 1;
	}
	printf("%s: all checks passed\n", name);
	return 0;
}
