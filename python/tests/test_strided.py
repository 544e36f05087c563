#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Strided (2-D) segments against live kvproxyd: every path lands every block
at its place and nothing in between.

Each case builds segments of one shape (a strided source gathered into a
contiguous destination, the reverse, both strided, blocks larger than a
frame, tiny blocks by the thousand, strided next to contiguous segments),
fills the source with a known pattern, moves it, and checks the whole
destination region byte for byte against a model of what the blocks must
write (the gaps between blocks stay as they were). Bad descriptors (block
beyond the region, stride smaller than its block, count above
limits.max_blocks, a span overflowing 64 bits) fail with ``invalid``, the
right detail and segment index, and write nothing.

Pairs: TCP zero-copy (host memory straight from and into the regions), TCP
staged (``stage.host``: the 2-D copies through staging buffers smaller than
a frame), and, inside the Soft-RoCE VM (``KVP_RDMA_VM=1``, rdma suite), the
RDMA transport (gathered WRITEs, one WRITE per destination block).

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir. Exit status: 0 pass, 1 fail, 77 skip (with the reason).
"""

from __future__ import annotations

import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import List, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)
import test_fence as tf  # noqa: E402  (the RDMA pair)

import kvproxy  # noqa: E402
from kvproxy import Segment, Segment2D  # noqa: E402

MIB = 1 << 20
REGION = 32 * MIB
MAX_BLOCKS = 65536

PAIRS = {
    "zerocopy": f"limits = {{ max_blocks = {MAX_BLOCKS}; }};",
    # Staging buffers smaller than a frame: windows end inside blocks.
    "staged": f"limits = {{ max_blocks = {MAX_BLOCKS}; }}; stage = {{ host = true; buffer = 12288; }}; "
              "tcp = { frame_max = 65536; };",
    # prefill0 sends through four staging buffers with a 5 ms admission
    # timeout (decode0 receives in place): a strided transfer waits for
    # buffers between its blocks, with bytes already on the wire.
    "admission": "stage = { host = true; pool = 1048576; buffer = 262144; };",
}


def pattern(n: int, seed: int) -> bytearray:
    block = bytes((seed * 131 + i * 7 + (i >> 8)) & 0xFF for i in range(65536))
    return bytearray((block * (n // len(block) + 1))[:n])


def model(dst: bytearray, src: bytes, segs: Sequence[Tuple[int, ...]]) -> None:
    """What the segments write into dst (a copy of the destination before)."""
    for s in segs:
        _, so, _, do, ln, cnt, ss, ds = s if len(s) == 8 else (*s, 1, 0, 0)
        for i in range(cnt):
            dst[do + i * ds:do + i * ds + ln] = src[so + i * ss:so + i * ss + ln]


class StridedBase(unittest.TestCase):
    """One pair of daemons per subclass (PAIR names its configuration)."""

    PAIR = "zerocopy"
    TIMEOUTS = ""
    DECODE_EXTRA = None  # decode0's configuration where it differs
    tmp: Path
    uid = 1  # transfer ids, shared by every pair

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = Path(tempfile.mkdtemp(prefix=f"kvp-strided-{cls.PAIR}."))
        if cls.PAIR == "rdma":
            tf.EXTRA = f"limits = {{ max_blocks = {MAX_BLOCKS}; }};"
            cls.prefill, cls.decode = tf.start_pair(cls.tmp)
        else:
            cls.prefill, cls.decode = tb.start_pair(cls.tmp, "prefill0", "decode0", PAIRS[cls.PAIR],
                                                   cls.TIMEOUTS, cls.DECODE_EXTRA)
        cls.src = kvproxy.Client(cls.prefill.sock)
        cls.dst = kvproxy.Client(cls.decode.sock)
        cls.sbuf = kvproxy.HostBuffer(REGION)
        cls.dbuf = kvproxy.HostBuffer(REGION)
        cls.sreg = cls.src.register(cls.sbuf)
        cls.dreg = cls.dst.register(cls.dbuf)
        cls.peer = cls.src.peer("decode0")
        cls.sbuf[:] = pattern(REGION, 7)

    @classmethod
    def tearDownClass(cls) -> None:
        for c in (cls.src, cls.dst):
            c.close()
        cls.sbuf.close()
        cls.dbuf.close()
        tb.stop_and_clean(cls.tmp, (cls.decode, cls.prefill))

    def move(self, segs: List[Tuple[int, ...]], expect: str = "ok") -> kvproxy.Completion:
        """Submit one transfer of segs (offsets relative to the regions) and wait for its end."""
        StridedBase.uid += 1
        uid = StridedBase.uid
        full = [(self.sreg.key, s[1], self.dreg.key, *s[3:]) for s in segs]
        t0 = time.monotonic()
        self.src.submit(self.peer, full, uid, timeout=60)
        done = tb.wait_for(self.src, tb.done_of(uid), timeout=90)
        self.assertEqual(done.status_name, expect, f"{self.PAIR}: {done.detail}")
        if expect == "ok":
            landed = tb.wait_for(self.dst, tb.landed_of(uid), timeout=90)
            self.assertEqual(landed.bytes, sum(s[4] * (s[5] if len(s) == 8 else 1) for s in segs))
            dt = time.monotonic() - t0
            tb.log(f"{self.PAIR}: {done.bytes} bytes in {len(segs)} descriptors, {dt * 1e3:.1f} ms")
        return done

    def check(self, segs: List[Tuple[int, ...]]) -> None:
        self.dbuf[:] = b"\0" * REGION
        want = bytearray(REGION)
        model(want, bytes(self.sbuf), segs)
        self.move(segs)
        got = bytes(self.dbuf)
        if got != want:
            bad = next(i for i in range(REGION) if got[i] != want[i])
            self.fail(f"{self.PAIR}: destination differs first at byte {bad}")
        if self.PAIR == "rdma":
            rdma = self.prefill.admin_call("stats")["rdma"]
            self.assertGreater(rdma["xfers"], 0, "nothing went by RDMA")
            self.assertEqual(rdma["tcp_fallbacks"], 0, "a strided transfer fell back to TCP")

    # ---- shapes ----

    def test_gather_into_contiguous(self) -> None:
        """One head of two per token (256 of 512 bytes), landing packed: prefill TP < decode TP."""
        self.check([Segment2D(0, 256, 0, 4096, 256, 8192, 512, 256)])

    def test_scatter_from_contiguous(self) -> None:
        """Packed heads landing every other 256 bytes: prefill TP > decode TP."""
        self.check([Segment2D(0, 0, 0, 256, 256, 8192, 256, 512)])

    def test_both_strided(self) -> None:
        self.check([Segment2D(0, 100, 0, 7, 300, 5000, 1000, 700)])

    def test_large_blocks(self) -> None:
        """Blocks larger than a frame (and than a staging buffer), 128 KiB apart: direct receives."""
        self.check([Segment2D(0, 0, 0, 64, 96 * 1024, 48, 128 * 1024, 200 * 1024)])

    def test_many_tiny_blocks(self) -> None:
        """65536 blocks of 16 bytes: one descriptor."""
        self.check([Segment2D(0, 3, 0, 5, 16, MAX_BLOCKS, 48, 32)])

    def test_mixed_with_contiguous(self) -> None:
        self.check([
            Segment(0, 0, 0, 0, 4096),
            Segment2D(0, 8192, 0, 8192, 512, 64, 1024, 2048),
            Segment(0, 4096, 0, 4096, 4096),  # contiguous with the first: coalesced
            Segment2D(0, 1 << 20, 0, 2 << 20, 1024, 1024, 1024, 4096),
            Segment2D(0, 3 << 20, 0, 6 << 20, 4096, 16, 4096, 4096),  # blocks touch: one range
        ])

    def test_kv_pages_head_slices(self) -> None:
        """A paged KV layer, 64 pages of 64 tokens x 8 heads x 128 x 2 bytes: the heads
        2..3 of every token of 16 scattered pages, one descriptor per page."""
        tok, page = 8 * 128 * 2, 64 * 8 * 128 * 2
        pages = [3, 4, 5, 9, 10, 17, 30, 31, 32, 33, 40, 44, 50, 51, 60, 63]
        segs = [Segment2D(0, p * page + 2 * 256, 0, i * (page // 4), 2 * 256, 64, tok, 2 * 256)
                for i, p in enumerate(pages)]
        self.check(segs)

    # ---- bad descriptors ----

    def refused(self, segs: List[Tuple[int, ...]], detail: str, bad_seg: int) -> None:
        self.dbuf[:1 << 20] = b"\0" * (1 << 20)
        done = self.move(segs, expect="invalid")
        self.assertIn(detail, done.detail)
        self.assertEqual(done.bad_seg, bad_seg)
        self.assertEqual(bytes(self.dbuf[:1 << 20]), b"\0" * (1 << 20), "a refused transfer wrote")

    def test_refused(self) -> None:
        ok = Segment(0, 0, 0, 0, 4096)
        self.refused([ok, Segment2D(0, REGION - 1000, 0, 0, 256, 8, 256, 256)], "outside the source", 1)
        self.refused([Segment2D(0, 0, 0, 0, 512, 4, 256, 512)], "stride smaller", 0)
        self.refused([Segment2D(0, 0, 0, 0, 512, 4, 512, 256)], "stride smaller", 0)
        self.refused([ok, ok, Segment2D(0, 0, 0, 0, 16, MAX_BLOCKS + 1, 16, 16)], "block count", 2)
        self.refused([Segment2D(0, 0, 0, 0, 16, MAX_BLOCKS, 1 << 50, 16)], "overflows", 0)
        self.refused([Segment2D(0, 0, 0, (1 << 64) - 4096, 16, 1024, 16, 64)], "destination range", 0)
        self.refused([Segment2D(0, 0, 0, 0, 0, 4, 16, 16)], "zero length", 0)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.src.submit(self.peer, [(self.sreg.key, 0, self.dreg.key, 0, 16, 0, 16, 16)], 1)


class StagedTest(StridedBase):
    PAIR = "staged"


class RdmaTest(StridedBase):
    PAIR = "rdma"


class AdmissionTest(StridedBase):
    PAIR = "admission"
    TIMEOUTS = "admission_ms = 5; peer_ms = 400;"  # ticks (admission checks) every 25 ms
    DECODE_EXTRA = ""

    def link_bytes(self) -> List[int]:
        peer = [p for p in self.prefill.admin_call("stats")["peers"] if p.get("node_id") == "decode0"][0]
        return peer["link_tx_bytes"]

    def test_admission_after_first_block(self) -> None:
        """Admission fails only a transfer with nothing on the wire: one whose first
        blocks went is not ended as if it never started (no ABORT, its link's
        count of bytes to send wrapped so the link was never picked again)."""
        kib = 1 << 10
        for _ in range(16):  # a tick meets a transfer between blocks in about 1 of 3
            self.check([(0, 0, 0, 0, 64 * kib, 256, 128 * kib, 128 * kib)])
        before = self.link_bytes()
        for _ in range(20):
            self.move([(0, 0, 0, 0, 256 * kib)])
        moved = [b - a for a, b in zip(before, self.link_bytes())]
        tb.log(f"admission: 20 contiguous transfers, bytes per link {moved}")
        self.assertTrue(all(moved), f"a link carried nothing: {moved}")


def main() -> int:
    tb.require_daemon_and_library()
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    classes = [RdmaTest] if tf.RDMA else [StridedBase, StagedTest]
    for cls in classes:
        suite.addTests(loader.loadTestsFromTestCase(cls))
    if not tf.RDMA:
        suite.addTest(AdmissionTest("test_admission_after_first_block"))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
