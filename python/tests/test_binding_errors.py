#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The kvproxy Python binding's error paths: failed completions and typed exceptions
(bad keys, bounds, peers, arguments, regions), each leaving the client usable.

Against a prefill0/decode0 pair of kvproxyd on 127.0.0.1 that this script
starts and stops; the fixture, the environment and the exit status:
daemon_harness.py.
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402
from daemon_harness import done_of, new_id, wait_for  # noqa: E402

import kvproxy  # noqa: E402


setUpModule = tb.setup_pair
tearDownModule = tb.teardown_started


class ErrorTest(tb.PairTestCase):
    """Bad input of every kind: a clear error, and nothing else changes."""

    # ---- error paths: completions ----

    def test_unknown_dst_key_is_remote(self) -> None:
        bad = self.dst.key ^ 0x5A5A5A5A00000000
        done = self.run_xfer([(self.src.key, 0, bad, 0, 4096)])
        self.assertFalse(done.ok)
        self.assertEqual(done.status, kvproxy.Status.REMOTE)
        self.assertEqual(done.status_name, "remote")
        with self.assertRaises(kvproxy.TransferError) as cm:
            done.raise_for_status()
        self.assertEqual(cm.exception.status_name, "remote")
        self.assertEqual(cm.exception.errno, errno.EREMOTEIO)

    def test_bad_src_key_is_invalid(self) -> None:
        done = self.run_xfer([(self.src.key ^ 0x5A5A5A5A00000000, 0, self.dst.key, 0, 4096)])
        self.assertEqual(done.status_name, "invalid")
        self.assertEqual(done.status, kvproxy.Status.INVALID)
        self.assertEqual(done.bytes, 0)

    def test_src_out_of_bounds_is_invalid(self) -> None:
        done = self.run_xfer([(self.src.key, self.SIZE - 64, self.dst.key, 0, 4096)])
        self.assertEqual(done.status_name, "invalid")

    def test_zero_length_segment_is_invalid(self) -> None:
        done = self.run_xfer([(self.src.key, 0, self.dst.key, 0, 0)])
        self.assertEqual(done.status_name, "invalid")

    def test_unconfigured_peer_index(self) -> None:
        uid = new_id()
        self.p.submit(999, [(self.src.key, 0, self.dst.key, 0, 4096)], uid)
        done = wait_for(self.p, done_of(uid))
        self.assertEqual(done.status_name, "no-peer")

    def test_good_transfer_after_errors(self) -> None:
        self.run_xfer([(self.src.key, 0, 0x1234, 0, 4096)])  # whatever it ends with
        self.src_buf[:4096] = b"\x42" * 4096
        done = self.run_xfer([(self.src.key, 0, self.dst.key, 8192, 4096)])
        self.assertTrue(done.ok, done)
        self.assertEqual(bytes(self.dst_buf[8192 : 8192 + 4096]), b"\x42" * 4096)

    # ---- error paths: exceptions ----

    def test_unknown_peer_name(self) -> None:
        with self.assertRaises(kvproxy.PeerNotFound) as cm:
            self.p.peer("nosuchnode")
        e = cm.exception
        self.assertIsInstance(e, kvproxy.KvproxyError)
        self.assertIsInstance(e, OSError)
        self.assertEqual(e.errno, errno.ENOENT)
        self.assertIn("not a configured peer", e.reason)
        self.assertIn("nosuchnode", str(e))
        with self.assertRaises(kvproxy.PeerNotFound):
            self.p.submit("nosuchnode", [(self.src.key, 0, self.dst.key, 0, 1)], new_id())
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.peer("x" * 40)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.peer("")

    def test_too_many_segments(self) -> None:
        n = self.p.max_segments + 1
        segs = [(self.src.key, i, self.dst.key, i, 1) for i in range(n)]
        with self.assertRaises(kvproxy.InvalidArgument) as cm:
            self.p.submit(self.peer, segs, new_id())
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertIn(str(self.p.max_segments), str(cm.exception))
        self.assertIsInstance(cm.exception, ValueError)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(self.peer, [], new_id())
        # The largest allowed transfer goes through.
        done = self.run_xfer(segs[:-1])
        self.assertTrue(done.ok, done)
        self.assertEqual(done.nseg, n - 1)

    def test_bad_argument_values(self) -> None:
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(self.peer, [(self.src.key, -1, self.dst.key, 0, 1)], new_id())
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(self.peer, [(self.src.key, 0, self.dst.key, 0, 1)], 1 << 64)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(self.peer, [(self.src.key, 0, self.dst.key, 0, 1)], new_id(), timeout=-1)
        with self.assertRaises(TypeError):
            self.p.submit(self.peer, [(self.src.key, 0, self.dst.key)], new_id())
        with self.assertRaises(TypeError):
            self.p.submit(self.peer, [(self.src.key, 0, self.dst.key, 0, "1")], new_id())
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(70000, [(self.src.key, 0, self.dst.key, 0, 1)], new_id())
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.poll(max=0)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.wait(timeout=-1)
        for bad in (-1, 1000001, 2.5, True, "50"):
            with self.assertRaises(kvproxy.InvalidArgument, msg=repr(bad)):
                self.p.set_wait_spin(bad)

    def test_wait_spin_settings(self) -> None:
        # Each accepted setting still delivers the completion (0: kvp_wait()
        # blocks at once and the daemon's wake-up must come).
        for i, us in enumerate((0, 1000000, 50, None)):
            self.p.set_wait_spin(us)
            self.src_buf[:4096] = bytes([i + 1]) * 4096
            done = self.run_xfer([(self.src.key, 0, self.dst.key, 0, 4096)])
            self.assertTrue(done.ok, done)
            self.assertEqual(bytes(self.dst_buf[:4096]), bytes(self.src_buf[:4096]))

    def test_deregister_twice(self) -> None:
        with kvproxy.HostBuffer(65536) as b:
            r = self.p.register(b)
            self.assertTrue(r.registered)
            self.assertEqual(r.length, 65536)
            self.assertIs(r.buffer, b)
            r.deregister()
            self.assertFalse(r.registered)
            with self.assertRaises(kvproxy.RegionError) as cm:
                r.deregister()
        e = cm.exception
        self.assertEqual(e.errno, errno.ENOENT)
        self.assertIn("no region", e.reason)  # the daemon's words
        self.assertIn(f"{r.key:016x}", e.reason)
        self.assertIn(e.reason, str(e))

    def test_region_context_manager(self) -> None:
        with kvproxy.HostBuffer(8192) as b:
            with self.p.register(b, offset=4096) as r:
                self.assertEqual(r.length, 4096)
                self.assertEqual(r.offset, 4096)
                self.assertIn(f"{r.key:#018x}", repr(r))
            self.assertFalse(r.registered)
            with self.assertRaises(kvproxy.RegionError):
                self.p.deregister(r.key)  # already gone in the daemon

    def test_register_beyond_buffer(self) -> None:
        with kvproxy.HostBuffer(65536) as b:
            with self.assertRaises(kvproxy.RegionError) as cm:
                self.p.register(b, 0, 65536 + 4096)
            e = cm.exception
            self.assertEqual(e.errno, errno.EINVAL)
            self.assertIn("beyond the end", e.reason)
            with self.assertRaises(kvproxy.RegionError):
                self.p.register(b, 61440, 8192)
            with self.assertRaises(kvproxy.InvalidArgument):
                self.p.register(b, 65536)  # offset at the end, length to the end = 0
            with self.assertRaises(kvproxy.RegionError):
                self.p.register(b, 0, 0)  # refused by the library, with its reason
            # A raw fd works as well as a HostBuffer.
            r = self.p.register(b.fd, 0, 4096)
            self.assertIsNone(r.buffer)
            r.deregister()


if __name__ == "__main__":
    sys.exit(tb.run_cases(ErrorTest))
