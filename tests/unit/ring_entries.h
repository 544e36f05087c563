/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the ring tests (test_rings_chan, test_rings_spsc, test_rings_stress)
 * share: entries that a torn, stale or misplaced copy cannot pass for, and
 * the exit for a broken set-up. Single-threaded state: none.
 */
#ifndef RING_ENTRIES_H
#define RING_ENTRIES_H

#include <stdint.h>

#include "kvp_rings.h"

#define PAGE      4096u
#define ESIZE_MAX KVP_CQE_SIZE /* the largest entry of either ring */

/** The test's own set-up broke (exit 99), with the errno of the step. */
_Noreturn void setup_failed(const char *what);

/** Entry @p seq of @p esize bytes into @p e (sequence, checksum, payload from @p seq). */
void entry_fill(uint8_t *e, uint32_t esize, uint64_t seq);

/** @return NULL if @p e is entry @p seq, else why not */
const char *entry_bad(const uint8_t *e, uint32_t esize, uint64_t seq);

/** The sequence number @p e carries. */
uint64_t entry_seq(const uint8_t *e);

/** Entries @p first .. @p first + @p n - 1, back to back in @p buf. */
void fill_seq(uint8_t *buf, uint32_t esize, uint64_t first, uint32_t n);

#endif
