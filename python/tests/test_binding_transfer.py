#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The kvproxy Python binding's transfers: client info, HostBuffer, bytes moved and checked.

Against a prefill0/decode0 pair of kvproxyd on 127.0.0.1 that this script
starts and stops; the fixture, the environment and the exit status:
daemon_harness.py.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402
from daemon_harness import XFER_TIMEOUT, done_of, landed_of, new_id, wait_for  # noqa: E402

import kvproxy  # noqa: E402
from kvproxy import Segment  # noqa: E402

setUpModule = tb.setup_pair
tearDownModule = tb.teardown_started


class TransferTest(tb.PairTestCase):
    """Transfers between the shared prefill0/decode0 pair, every byte checked."""

    # ---- basics ----

    def test_client_info(self) -> None:
        self.assertEqual(self.p.node_id, "prefill0")
        self.assertEqual(self.d.node_id, "decode0")
        self.assertGreater(self.p.max_segments, 0)
        self.assertLessEqual(self.p.max_segments, 4096)
        self.assertIn("prefill0", repr(self.p))
        self.assertEqual(self.p.overflow, 0)
        self.assertIsInstance(self.p.peer("decode0"), int)
        self.assertIsInstance(self.d.peer("prefill0"), int)

    def test_host_buffer(self) -> None:
        with kvproxy.HostBuffer(12345) as b:
            self.assertEqual(len(b), 12345)
            self.assertEqual(b.size, 12345)
            self.assertGreaterEqual(b.fd, 0)
            self.assertEqual(bytes(b[:16]), bytes(16))  # starts zeroed
            mv = memoryview(b)
            self.assertFalse(mv.readonly)
            self.assertEqual(mv.format, "B")
            mv[100:104] = b"abcd"
            self.assertEqual(b[100:104], b"abcd")
            with self.assertRaises(BufferError):
                b.close()  # a live view: refused, not freed under it
            mv.release()
            fd = b.fd
        self.assertTrue(b.closed)
        with self.assertRaises(OSError):
            os.fstat(fd)  # the memfd was closed
        b.close()  # idempotent
        with self.assertRaises(kvproxy.InvalidArgument):
            kvproxy.HostBuffer(0)

    # ---- transfers ----

    def test_host_transfer_verified(self) -> None:
        n = 3 << 20
        data = os.urandom(n)
        self.src_buf[:n] = data
        uid = new_id()
        self.p.submit("decode0", [Segment(self.src.key, 0, self.dst.key, 0, n)], uid, timeout=XFER_TIMEOUT)
        done = wait_for(self.p, done_of(uid))
        landed = wait_for(self.d, landed_of(uid))

        self.assertEqual(done.kind, "done")
        self.assertTrue(done.ok, done)
        self.assertEqual(done.status, 0)
        self.assertEqual(done.status, kvproxy.Status.OK)
        self.assertEqual(done.status_name, "ok")
        self.assertEqual(done.bytes, n)
        self.assertEqual(done.nseg, 1)
        self.assertEqual(done.peer, self.peer)
        done.raise_for_status()

        self.assertEqual(landed.kind, "landed")
        self.assertTrue(landed.ok, landed)
        self.assertEqual(landed.bytes, n)
        self.assertEqual(landed.nseg, 1)
        self.assertEqual(landed.dst_key, self.dst.key)
        self.assertEqual(landed.peer, self.d.peer("prefill0"))

        self.assertEqual(set(done.phases),
                         {"queue", "admit", "post", "wire", "total", "first", "deliver", "e2e"})
        for name, v in done.phases.items():
            self.assertGreaterEqual(v, 0.0, name)
            self.assertLess(v, XFER_TIMEOUT, f"{name} = {v}s: an unsigned underflow?")
        # queue is submit -> pickup and lies before total (pickup -> completion).
        for name in ("admit", "post", "wire", "first", "deliver"):
            self.assertGreaterEqual(done.phases["total"], done.phases[name], name)
        self.assertGreater(done.phases["total"], 0.0)
        parts = sum(done.phases[k] for k in ("queue", "admit", "post", "wire", "deliver"))
        self.assertAlmostEqual(parts, done.phases["e2e"], delta=1e-6)

        got = bytes(self.dst_buf[:n])
        if got != data:
            first = next(i for i in range(n) if got[i] != data[i])
            self.fail(f"landed data differs from the source, first at offset {first}")

    def test_multiple_segments_offsets(self) -> None:
        rnd = random.Random(1234)
        data = os.urandom(self.SIZE)
        self.src_buf[:] = data
        self.dst_buf[:] = b"\xee" * self.SIZE
        # Unaligned lengths, shuffled destinations with gaps between them.
        lens = [1, 63, 4096, 4097, 65536 + 17, 300000, 1 << 20]
        src_offs, off = [], 7
        for ln in lens:
            src_offs.append(off)
            off += ln + 13
        order = list(range(len(lens)))
        rnd.shuffle(order)
        dst_offs = [0] * len(lens)
        off = 5
        for i in order:
            dst_offs[i] = off
            off += lens[i] + 101
        self.assertLessEqual(off, self.SIZE)
        segs = [
            Segment(self.src.key, s, self.dst.key, d, ln) if i % 2 else (self.src.key, s, self.dst.key, d, ln)
            for i, (s, d, ln) in enumerate(zip(src_offs, dst_offs, lens))
        ]
        uid = new_id()
        done = self.run_xfer(segs, uid)
        self.assertTrue(done.ok, done)
        self.assertEqual(done.nseg, len(segs))
        self.assertEqual(done.bytes, sum(lens))
        landed = wait_for(self.d, landed_of(uid))
        self.assertEqual(landed.bytes, sum(lens))
        self.assertEqual(landed.nseg, len(segs))

        got = bytes(self.dst_buf)
        expect = bytearray(b"\xee" * self.SIZE)
        for s, d, ln in zip(src_offs, dst_offs, lens):
            expect[d : d + ln] = data[s : s + ln]
        if got != bytes(expect):
            first = next(i for i in range(self.SIZE) if got[i] != expect[i])
            self.fail(f"destination differs from the expected layout, first at offset {first}")

    def test_several_transfers_in_flight(self) -> None:
        chunk = 256 << 10
        data = os.urandom(16 * chunk)
        self.src_buf[: len(data)] = data
        uids = []
        for i in range(16):
            uid = new_id()
            seg = (self.src.key, i * chunk, self.dst.key, (15 - i) * chunk, chunk)
            while True:
                try:
                    self.p.submit(self.peer, [seg], uid)
                    break
                except kvproxy.RingFull:
                    self.p.wait(timeout=1)  # reap something, retry
            uids.append(uid)
        pending = set(uids)
        deadline = time.monotonic() + XFER_TIMEOUT
        while pending and time.monotonic() < deadline:
            for c in self.p.wait(timeout=max(0.0, deadline - time.monotonic())):
                if c.kind == "done" and c.user_id in pending:
                    self.assertTrue(c.ok, c)
                    pending.discard(c.user_id)
        self.assertFalse(pending, "transfers without a done completion")
        for i in range(16):
            d = (15 - i) * chunk
            self.assertEqual(bytes(self.dst_buf[d : d + chunk]), data[i * chunk : (i + 1) * chunk], f"chunk {i}")


if __name__ == "__main__":
    sys.exit(tb.run_cases(TransferTest))
