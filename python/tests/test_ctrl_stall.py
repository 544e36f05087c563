#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A control plane that a big registration never stalls (issue 17).

One client of decode0 registers a 2 GiB region (an untouched memfd: kvproxyd
maps and populates every page of it, the slowest registration host memory
has) while ten more clients connect to decode0, each registering a small
region, and ``status`` is polled on decode0's admin socket. kvproxyd maps
on a helper thread, so:

- every client connects (within ``timeouts.connect_ms``, set to 500 ms here:
  a loop blocked by the mapping would time their HELLOs out) and registers;
- every ``status`` answers within 1 s, and at least one answered while the
  big registration was under way (``registering``), so the polls did
  overlap it;
- the main loop's longest pass (``totals.control_loop_max_ms``) stays under
  half the time the big registration took (had the loop mapped it, the pass
  would have lasted all of it);
- no peer link of either node went down (no heartbeat missed), and both
  still see each other up; the big region works (a transfer lands in it).

Environment: as daemon_harness.py (KVPROXYD, KVPROXY_LIB); KVP_STALL_BYTES
overrides the big region's size. Exit 0 pass, 1 fail, 77 skip.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

import kvproxy  # noqa: E402
from kvproxy import Segment  # noqa: E402

BIG = int(os.environ.get("KVP_STALL_BYTES", str(2 << 30)))
CLIENTS = 10
STATUS_TIMEOUT = 1.0


class CtrlStallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = Path(tempfile.mkdtemp(prefix="kvp-ctrl-stall."))
        tb.log(f"temp dir {cls.tmp}; big region {BIG} bytes")
        cls.prefill, cls.decode = tb.start_pair(
            cls.tmp, "prefill0", "decode0", "limits = { max_clients = 16; };", "connect_ms = 500;"
        )

    @classmethod
    def tearDownClass(cls) -> None:
        problems = [p for p in (d.stop() for d in reversed(tb.STARTED)) if p]
        if problems:
            raise AssertionError("\n".join(problems))

    def peer_counts(self, d: tb.Daemon) -> Dict[str, int]:
        p = d.admin_call("stats")["peers"][0]
        return {"conn_errors": int(p["conn_errors"]), "disconnects": int(p["disconnects"])}

    def test_big_registration_stalls_nothing(self) -> None:
        before = {d.node_id: self.peer_counts(d) for d in (self.prefill, self.decode)}
        big_client = kvproxy.Client(self.decode.sock)
        buf = kvproxy.HostBuffer(BIG)
        result: Dict[str, object] = {}

        def register() -> None:
            t0 = time.monotonic()
            try:
                result["region"] = big_client.register(buf)
            except Exception as e:  # reported below, in the test's thread
                result["error"] = e
            result["seconds"] = time.monotonic() - t0

        th = threading.Thread(target=register)
        th.start()
        statuses: List[float] = []
        overlapped = 0
        clients: List[kvproxy.Client] = []
        small: List[kvproxy.HostBuffer] = []
        try:
            deadline = time.monotonic() + 120
            while (th.is_alive() or len(clients) < CLIENTS) and time.monotonic() < deadline:
                t0 = time.monotonic()
                st = self.decode.admin_call("status", timeout=STATUS_TIMEOUT)
                statuses.append(time.monotonic() - t0)
                if int(st["registering"]) > 0 and th.is_alive():
                    overlapped += 1
                if overlapped and len(clients) < CLIENTS:
                    # Connect and register while the big one maps.
                    c = kvproxy.Client(self.decode.sock)
                    clients.append(c)
                    b = kvproxy.HostBuffer(1 << 20)
                    small.append(b)
                    c.register(b)
                time.sleep(0.01)
            th.join(timeout=120)
            self.assertFalse(th.is_alive(), "the big registration did not return")
            self.assertNotIn("error", result, f"the big registration failed: {result.get('error')}")
            secs = float(result["seconds"])
            tb.log(
                f"big registration {secs:.3f} s; {len(statuses)} status answers (slowest "
                f"{max(statuses) * 1e3:.1f} ms), {overlapped} while it ran; {len(clients)} clients"
            )
            self.assertEqual(len(clients), CLIENTS)
            self.assertGreater(overlapped, 0, "no status answered while the registration ran")
            self.assertLess(max(statuses), STATUS_TIMEOUT)
            stats = self.decode.admin_call("stats")
            loop_ms = float(stats["totals"]["control_loop_max_ms"])
            tb.log(f"decode0's longest control-loop pass: {loop_ms:.1f} ms")
            self.assertLess(loop_ms, secs * 1e3 / 2, "the control loop waited for the registration")
            self.assertEqual(int(stats["totals"]["client_handshake_failures"]), 0)
            self.assertEqual(int(self.decode.admin_call("status")["clients"]), CLIENTS + 1)

            # The big region is usable: one transfer into its last MiB lands.
            self.big_region_works(result["region"], big_client)
            for d in (self.prefill, self.decode):
                self.assertEqual(self.peer_counts(d), before[d.node_id], f"{d.node_id} lost a peer link")
                self.assertEqual(d.peer_state(), "up")
        finally:
            th.join(timeout=120)
            for c in clients:
                c.close()
            for b in small:
                b.close()
            region = result.get("region")
            if region is not None:
                region.deregister()
            big_client.close()
            buf.close()

    def big_region_works(self, region: "kvproxy.Region", dst_client: kvproxy.Client) -> None:
        with kvproxy.Client(self.prefill.sock) as src:
            sbuf = kvproxy.HostBuffer(1 << 20)
            sbuf[:] = os.urandom(1 << 20)
            sreg = src.register(sbuf)
            uid = 17
            src.submit("decode0", [Segment(sreg.key, 0, region.key, BIG - (1 << 20), 1 << 20)], uid)
            done = tb.wait_for(src, tb.done_of(uid))
            self.assertTrue(done.ok, f"transfer into the big region: {done.status_name}")
            tb.wait_for(dst_client, tb.landed_of(uid))
            sreg.deregister()
            sbuf.close()


def main() -> int:
    tb.require_daemon_and_library()
    suite = unittest.TestLoader().loadTestsFromTestCase(CtrlStallTest)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
