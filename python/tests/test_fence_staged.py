#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A fence that meets a receive into a staging buffer (kvp_fence, TCP).

decode0 stages every host region (stage.host) through a pool of four 1 MiB
buffers and prefill0 opens five links, so with transfers in flight on all of
them one link waits for a buffer with a header read. prefill0 is frozen and
request A's transfers are fenced. The fence may complete at once (a staged
receive never writes the region), but a buffer is its receive's until that
recv returns: handed to the waiting link instead, both recvs write it and a
transfer of request B, never fenced, lands the other's bytes with status ok.
Every B transfer that ends ok is checked byte for byte. The race is timing's
(the fence must meet a recv still filling), so it is run 24 times; before the
fix 5 runs of 6 caught it.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir. Exit status: 0 pass, 1 fail, 77 skip (with the reason).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Dict, Set

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

import kvproxy  # noqa: E402

MIB = 1 << 20
SIZE = 4 * MIB
N = 6  # transfers per request per round
TAG_MASK = ~0xFFFF & ((1 << 64) - 1)
ROUNDS = 24


class StagedFenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = Path(tempfile.mkdtemp(prefix="kvp-fence-staged."))
        tb.log(f"temp dir {cls.tmp}")
        pp, pd = tb.free_ports(2)
        timeouts = "fence_hold_ms = 60000;"
        links = "tcp = { connections = 5; };"
        cls.prefill = tb.Daemon(cls.tmp, "prefill0", pp, "decode0", pd, links, timeouts)
        cls.decode = tb.Daemon(cls.tmp, "decode0", pd, "prefill0", pp,
                               links + " stage = { host = true; pool = 4194304; buffer = 1048576; };", timeouts)
        for d in (cls.prefill, cls.decode):
            tb.STARTED.append(d)
            d.start()
        for d in (cls.prefill, cls.decode):
            d.wait_ready()
        cls.src = kvproxy.Client(cls.prefill.sock)
        cls.dst = kvproxy.Client(cls.decode.sock)
        cls.sbuf = kvproxy.HostBuffer(2 * N * SIZE)
        cls.dbuf = kvproxy.HostBuffer(2 * N * SIZE)
        cls.sreg = cls.src.register(cls.sbuf)
        cls.dreg = cls.dst.register(cls.dbuf)
        cls.peer = cls.src.peer("decode0")
        cls.sbuf[:] = os.urandom(2 * N * SIZE)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.src.close()
        cls.dst.close()
        cls.sbuf.close()
        cls.dbuf.close()
        tb.stop_and_clean(cls.tmp, (cls.decode, cls.prefill))

    def round(self, r: int) -> int:
        """One round; returns how many of A's transfers the fence met in flight."""
        a, b = (2 * r + 2) << 16, (2 * r + 3) << 16
        self.dbuf[:] = b"\0" * (2 * N * SIZE)
        for i in range(N):  # interleaved: A to the first half, B to the second
            for tag, off in ((a, i * SIZE), (b, (N + i) * SIZE)):
                self.src.submit(self.peer, [(self.sreg.key, off, self.dreg.key, off, SIZE)], tag | i, timeout=30)
        deadline = time.monotonic() + 20
        while not any(c.kind == "landed" for c in self.dst.wait(timeout=0.2)):
            self.assertLess(time.monotonic(), deadline, "nothing landed")
        before = self.decode.admin_call("stats")["fences"]["fenced_xfers"]
        os.kill(self.prefill.proc.pid, signal.SIGSTOP)
        try:
            self.dst.fence(a, TAG_MASK, 100 + r)
            deadline = time.monotonic() + 20
            while not any(c.kind == "fence" and c.user_id == 100 + r for c in self.dst.wait(timeout=0.2)):
                self.assertLess(time.monotonic(), deadline, "the fence never completed")
            met = self.decode.admin_call("stats")["fences"]["fenced_xfers"] - before
        finally:
            os.kill(self.prefill.proc.pid, signal.SIGCONT)
        done: Dict[int, str] = {}
        left: Set[int] = {t | i for t in (a, b) for i in range(N)}
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            for c in self.src.wait(timeout=0.2):
                if c.kind == "done" and c.user_id in left:
                    left.discard(c.user_id)
                    done[c.user_id] = c.status_name
        self.assertFalse(left, f"transfers never ended: {sorted(left)}")
        self.dst.poll()
        ok_b = [i for i in range(N) if done[b | i] == "ok"]
        tb.log(f"round {r}: fence met {met} in flight; B ok {len(ok_b)}/{N}; statuses {sorted(done.values())}")
        for i in ok_b:
            off = (N + i) * SIZE
            self.assertTrue(bytes(self.dbuf[off:off + SIZE]) == bytes(self.sbuf[off:off + SIZE]),
                            f"round {r}: B|{i} ended ok but its bytes differ (a fenced recv's buffer was reused)")
        self.assertEqual(set(done[b | i] for i in range(N)) - {"ok"}, set(), "an unfenced transfer failed")
        return met

    def test_bystander_intact(self) -> None:
        met = sum(self.round(r) for r in range(ROUNDS))
        self.assertGreater(met, 0, f"the fence met nothing in flight in {ROUNDS} rounds")


if __name__ == "__main__":
    sys.exit(tb.run_cases(StagedFenceTest))
