// SPDX-License-Identifier: BSD-3-Clause
// A C++ consumer of the installed API: kvproxy.h (and kvp_rings.h) compile
// under the -std this file is built with (meson builds it for several), the
// layout C++ sees is the one C sees (compared with test_cxx_layout.c, built
// by the C compiler into the same program), and the header's inline ring
// code, compiled as C++, moves entries through a channel that the C library
// laid out. <atomic> comes first: C++'s atomics and the header must coexist.
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include <sys/mman.h>

#include "kvproxy.h"

extern "C" const size_t kvp_test_c_layout[];

static int failures;

#define EXPECT(cond)                                                                         \
	do {                                                                                 \
		if (!(cond)) {                                                               \
			std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                                          \
		}                                                                            \
	} while (0)

static_assert(sizeof(kvp_ring_shm) == 3 * KVP_CACHE_LINE, "ring layout");
static_assert(alignof(kvp_ring_shm) == KVP_CACHE_LINE, "ring alignment");

int
main()
{
	const size_t cxx[] = {
		sizeof(kvp_ring_shm),
		offsetof(kvp_ring_shm, prod),
		offsetof(kvp_ring_shm, cons),
		offsetof(kvp_ring_shm, need_wakeup),
		offsetof(kvp_ring_shm, overflow),
		offsetof(kvp_ring_shm, room_wakeup),
		alignof(kvp_ring_shm),
		sizeof(kvp_chan_hdr),
		offsetof(kvp_chan_hdr, sq),
		offsetof(kvp_chan_hdr, cq),
		sizeof(kvp_ring),
		sizeof(kvp_cqe),
		sizeof(kvp_sqe_xfer),
		sizeof(kvp_ctrl_req),
		sizeof(kvp_ctrl_rep),
		sizeof(kvp_connect_opts),
		sizeof(kvp_xfer_desc),
		sizeof(kvp_segment),
	};
	for (size_t i = 0; i < sizeof(cxx) / sizeof(cxx[0]); i++)
		if (cxx[i] != kvp_test_c_layout[i]) {
			std::fprintf(stderr, "layout item %zu: C++ %zu, C %zu\n", i, cxx[i],
				     kvp_test_c_layout[i]);
			failures++;
		}

	// A channel from the C library; both ends through the inline code compiled as C++.
	size_t len = kvp_chan_size(8, 8);
	void *mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	kvp_ring dsq, dcq, csq, ccq;

	EXPECT(mem != MAP_FAILED);
	EXPECT(kvp_chan_init(mem, len, 8, 8, 7) == 0);
	EXPECT(kvp_chan_attach(mem, len, true, &dsq, &dcq) == 0);
	EXPECT(kvp_chan_attach(mem, len, false, &csq, &ccq) == 0);
	kvp_cqe in[8], out[8];
	std::memset(in, 0, sizeof(in));
	for (unsigned i = 0; i < 8; i++)
		in[i].user_id = 100 + i;
	EXPECT(kvp_ring_enqueue_bulk(&dcq, in, 8) == 8);
	EXPECT(kvp_ring_enqueue_bulk(&dcq, in, 1) == 0); // full
	// The producer parks on the full ring; the consumer's dequeue asks for its wakeup.
	EXPECT(kvp_ring_prepare_wait_room(&dcq, 1));
	EXPECT(kvp_ring_dequeue_burst(&ccq, out, 8) == 8);
	EXPECT(out[7].user_id == 107);
	EXPECT(kvp_ring_room_wakeup_needed(&ccq));
	EXPECT(!kvp_ring_room_wakeup_needed(&ccq)); // one wakeup per sleep
	kvp_ring_finish_wait_room(&dcq);
	EXPECT(kvp_ring_free(&dcq) == 8);
	EXPECT(kvp_ring_prepare_wait(&dsq));
	EXPECT(kvp_ring_wakeup_needed(&csq));
	kvp_ring_finish_wait(&dsq);
	munmap(mem, len);

	// The library through its C ABI.
	kvp_client *c = nullptr;
	char err[KVP_ERRMSG_MAX];
	kvp_connect_opts o{};
	o.timeout_ms = 100;
	EXPECT(kvp_connect_ex("/nonexistent/kvproxy.sock", &o, &c, err, sizeof(err)) == -ENOENT);
	EXPECT(c == nullptr && err[0] != '\0');
	EXPECT(kvp_poll(nullptr, out, 1) == -EINVAL);
	EXPECT(std::strcmp(kvp_status_str(KVP_ETIMEDOUT), "timeout") == 0);
	std::printf("C++ %ld: %s\n", static_cast<long>(__cplusplus), failures ? "FAILED" : "ok");
	return failures ? 1 : 0;
}
