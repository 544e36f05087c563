/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp_wait()'s adaptive spin (KVP_WAIT_SPIN_AUTO), as pure arithmetic:
 *  - a value set with kvp_set_wait_spin() is used as it is;
 *  - the spin is twice the recent average wait, KVP_WAIT_SPIN_US at least,
 *    and only KVP_WAIT_SPIN_US once the average is above half of
 *    KVP_WAIT_SPIN_MAX_US;
 *  - the average follows the waits, and one long idle wait is forgotten
 *    after a few quick ones.
 * The timing itself (what a wake-up costs) belongs to tools/bench/latency.sh.
 */
#include "client_priv.h"
#include "kvp_test.h"

#define US 1000ull

int
main(void)
{
	const uint64_t lo = KVP_WAIT_SPIN_US * US, hi = KVP_WAIT_SPIN_MAX_US * US;

	/* Fixed values, 0 (block at once) among them. */
	CHECK_EQ(client_wait_spin_ns(0, 80 * US), 0);
	CHECK_EQ(client_wait_spin_ns(7, 80 * US), 7 * US);
	CHECK_EQ(client_wait_spin_ns(1000000, 0), 1000000 * US);

	/* Adaptive: the floor, twice the average, the floor again past hi / 2. */
	CHECK_EQ(client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, 0), lo);
	CHECK_EQ(client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, lo / 2), lo);
	CHECK_EQ(client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, 80 * US), 160 * US);
	CHECK_EQ(client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, hi / 2), hi);
	CHECK_EQ(client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, hi / 2 + 1), lo);
	CHECK_EQ(client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, UINT64_MAX), lo);

	/* The average moves an eighth of the way, both ways. */
	CHECK_EQ(client_wait_avg(0, 80 * US), 10 * US);
	CHECK_EQ(client_wait_avg(80 * US, 0), 70 * US);
	CHECK_EQ(client_wait_avg(80 * US, 80 * US), 80 * US);

	/* Steady 80 us waits: the spin settles at twice that, from the floor. */
	uint64_t avg = 0;
	for (int i = 0; i < 100; i++)
		avg = client_wait_avg(avg, 80 * US);
	CHECK(avg > 79 * US && avg <= 80 * US);
	uint64_t spin = client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, avg);
	CHECK(spin > 158 * US && spin <= 160 * US);

	/* An hour asleep counts as 4 * hi: the spin drops to the floor... */
	uint64_t slept = client_wait_avg(avg, 3600ull * 1000000 * US);
	CHECK_EQ(slept, avg + (4 * hi - avg) / 8);
	CHECK_EQ(client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, slept), lo);
	/* ...and comes back within a dozen quick waits. */
	int quick = 0;
	avg = slept;
	while (client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, avg) == lo && quick++ < 100)
		avg = client_wait_avg(avg, 80 * US);
	CHECK(quick <= 12);

	/* Waits longer than hi keep it at the floor: no spinning through them. */
	for (int i = 0; i < 100; i++)
		avg = client_wait_avg(avg, 2 * hi);
	CHECK_EQ(client_wait_spin_ns(KVP_WAIT_SPIN_AUTO, avg), lo);

	return kvp_test_result("client_wait");
}
