#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The kvproxy Python binding's client lifecycle: connecting, ring sizes, cancel,
waiting, threads, closing, and the daemon dying under a client.

Against a prefill0/decode0 pair of kvproxyd on 127.0.0.1 that this script
starts and stops; the fixture, the environment and the exit status:
daemon_harness.py.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
import unittest
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402
from daemon_harness import Daemon, XFER_TIMEOUT, done_of, free_ports, log, new_id, wait_for  # noqa: E402

import kvproxy  # noqa: E402


setUpModule = tb.setup_pair
tearDownModule = tb.teardown_started


class ClientTest(tb.PairTestCase):
    """A client's life against the shared prefill0/decode0 pair."""

    # ---- connecting, waiting, closing ----

    def test_connect_missing_socket(self) -> None:
        path = str(tb.TMP / "nobody.sock")
        with self.assertRaises(kvproxy.ConnectError) as cm:
            kvproxy.Client(path)
        self.assertIn(cm.exception.errno, (errno.ENOENT, errno.ECONNREFUSED))
        self.assertEqual(cm.exception.filename, path)
        # A socket file nobody listens on.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            dead = str(tb.TMP / "dead.sock")
            s.bind(dead)
        with self.assertRaises(kvproxy.ConnectError) as cm:
            kvproxy.Client(dead)
        self.assertIn(cm.exception.errno, (errno.ENOENT, errno.ECONNREFUSED))
        with self.assertRaises(kvproxy.InvalidArgument):
            kvproxy.Client(tb.PREFILL.sock, sq_entries=3)

    def test_small_rings(self) -> None:
        with kvproxy.Client(tb.PREFILL.sock, sq_entries=8, cq_entries=8) as c:
            self.assertEqual(c.max_segments, 7)  # header + segments fit the SQ
            with kvproxy.HostBuffer(4096) as b, c.register(b) as r:
                uid = new_id()
                c.submit("decode0", [(r.key, 0, self.dst.key, 0, 64)] * 7, uid)
                done = wait_for(c, done_of(uid))
                self.assertTrue(done.ok, done)

    def test_cancel_unknown_id_is_harmless(self) -> None:
        self.p.cancel(987654321)
        self.p.cancel(0)
        self.src_buf[:1024] = b"\x17" * 1024
        done = self.run_xfer([(self.src.key, 0, self.dst.key, 0, 1024)])
        self.assertTrue(done.ok, done)
        self.assertEqual(bytes(self.dst_buf[:1024]), b"\x17" * 1024)

    def test_wait_timeout_and_poll_empty(self) -> None:
        with kvproxy.Client(tb.PREFILL.sock) as c:
            self.assertEqual(c.poll(), [])
            t0 = time.monotonic()
            self.assertEqual(c.wait(timeout=0.3), [])
            self.assertGreaterEqual(time.monotonic() - t0, 0.29)
            self.assertEqual(c.wait(timeout=0), [])

    def test_threads(self) -> None:
        """A completion thread and a control thread at once; close() from another thread."""
        import threading

        with kvproxy.Client(tb.PREFILL.sock) as c, kvproxy.HostBuffer(4096) as b:
            errors: List[BaseException] = []
            stop = time.monotonic() + 1.0

            def reaper() -> None:
                try:
                    while time.monotonic() < stop:
                        c.wait(timeout=0.002)
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            t = threading.Thread(target=reaper)
            t.start()
            calls = 0
            while time.monotonic() < stop:
                c.peer("decode0")
                with c.register(b):
                    pass
                calls += 1
            t.join(10)
            self.assertFalse(t.is_alive())
            self.assertEqual(errors, [], f"wait() failed while control calls ran ({calls} rounds)")

        c = kvproxy.Client(tb.PREFILL.sock)
        out: List[object] = []

        def blocked() -> None:
            try:
                out.append(c.wait())  # no timeout: only close() ends it
            except kvproxy.KvproxyError as e:
                out.append(e)

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.1)  # let it block (not a synchronisation: close() works either way)
        c.close()
        t.join(10)
        self.assertFalse(t.is_alive(), "wait() still blocked after close()")
        self.assertEqual(len(out), 1)
        self.assertIsInstance(out[0], kvproxy.KvproxyError)
        self.assertEqual(out[0].errno, errno.EBADF)

    def test_closed_client(self) -> None:
        c = kvproxy.Client(tb.PREFILL.sock)
        c.close()
        c.close()  # idempotent
        self.assertTrue(c.closed)
        for call in (lambda: c.poll(), lambda: c.wait(0), lambda: c.peer("decode0"), lambda: c.cancel(1)):
            with self.assertRaises(kvproxy.KvproxyError) as cm:
                call()
            self.assertEqual(cm.exception.errno, errno.EBADF)

class DaemonDeathTest(unittest.TestCase):
    """Runs last, against a daemon of its own: kill it and see the client notice."""

    def test_daemon_death_raises_epipe(self) -> None:
        ports = free_ports(2)
        # The peer never comes up; one client at most.
        doomed = Daemon(tb.TMP, "doomed0", ports[0], "decode0", ports[1], extra="limits = { max_clients = 1; };")
        tb.STARTED.append(doomed)
        doomed.start()
        doomed.wait_ready(need_peer=False)
        c = kvproxy.Client(doomed.sock, sq_entries=16)
        buf = kvproxy.HostBuffer(4096)
        try:
            r = c.register(buf)
            # A second client is over limits.max_clients: the daemon refuses it and says why.
            with self.assertRaises(kvproxy.ConnectError) as cm0:
                kvproxy.Client(doomed.sock)
            self.assertEqual(cm0.exception.errno, errno.EUSERS)
            self.assertIn("max_clients", str(cm0.exception))
            doomed.kill()
            log("killed kvproxyd doomed0 (SIGKILL)")
            deadline = time.monotonic() + XFER_TIMEOUT
            with self.assertRaises(kvproxy.KvproxyError) as cm:
                while time.monotonic() < deadline:
                    c.wait(timeout=1)
            e = cm.exception
            self.assertEqual(e.errno, errno.EPIPE)
            self.assertIsInstance(e, kvproxy.Disconnected)
            self.assertIsInstance(e, ConnectionError)
            # Control calls see it as well.
            with self.assertRaises(kvproxy.Disconnected):
                c.register(buf)
            # Submitting says so too, at once (not a ring that merely fills up).
            with self.assertRaises(kvproxy.Disconnected) as cm2:
                c.submit(0, [(r.key, 0, 1, 0, 64)], 1)
            self.assertEqual(cm2.exception.errno, errno.EPIPE)
        finally:
            c.close()
            buf.close()


if __name__ == "__main__":
    sys.exit(tb.run_cases(ClientTest, DaemonDeathTest))  # DaemonDeathTest last: it kills a daemon
