/* SPDX-License-Identifier: BSD-3-Clause */
/**
 * @file
 * Copies that touch a client's memory from user space, guarded against the
 * client taking its pages away (see guard.c).
 */
#ifndef KVP_GUARD_H
#define KVP_GUARD_H

#include <stddef.h>

/**
 * Install the SIGBUS handler (process-wide, at start; again: nothing). A
 * handler installed before, a sanitizer's, still gets every other SIGBUS;
 * without one, they take the default action.
 *
 * @return 0, -errno
 */
int kvp_guard_init(void);

/**
 * memcpy() where one side is a client's memory: @return 0; -EFAULT if a
 * page of it was gone (SIGBUS), with the copy partly done
 */
int kvp_guard_copy(void *dst, const void *src, size_t n);

/**
 * Read a byte of every 4 KiB page of [p, p + n) (any larger page is made of
 * them): @return 0; -EFAULT if a page of it was gone (SIGBUS)
 */
int kvp_guard_probe(const void *p, size_t n);

#endif
