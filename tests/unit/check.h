/* SPDX-License-Identifier: BSD-3-Clause */
/* Minimal assertion helpers for the unit tests: report, count, keep going. */
#ifndef CHECK_H
#define CHECK_H

#include <stdio.h>

static int check_failures;

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,   \
				#cond);                                                    \
			check_failures++;                                                  \
		}                                                                          \
	} while (0)

#define CHECK_EQ(a, b)                                                                     \
	do {                                                                               \
		long long a_ = (long long)(a), b_ = (long long)(b);                        \
		if (a_ != b_) {                                                            \
			fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld vs %lld)\n",  \
				__FILE__, __LINE__, #a, #b, a_, b_);                       \
			check_failures++;                                                  \
		}                                                                          \
	} while (0)

static inline int
check_result(const char *name)
{
	if (check_failures) {
		fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
		return 1;
	}
	printf("%s: all checks passed\n", name);
	return 0;
}

#endif /* CHECK_H */
