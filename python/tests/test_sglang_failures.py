#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Tests of kvproxy.sglang's failures: typed, on both sides, never an endless
Transferring (unknown peer, region gone, timeouts, unreachable bootstrap,
layout mismatch, the decode worker's kvproxyd dying).

The fixture (three kvproxyd and a bootstrap server), the environment and the
exit status: sglang_fixture.py.
"""

from __future__ import annotations

import errno
import sys
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)
import sglang_fixture as sf  # noqa: E402
from sglang_fixture import DAEMONS, XFER_TIMEOUT, failure_of, log, new_room, poll_until, worker  # noqa: E402

import kvproxy  # noqa: E402
from kvproxy import sglang as ks  # noqa: E402
from kvproxy.sglang import KVPoll  # noqa: E402

setUpModule = sf.setup_daemons
tearDownModule = sf.teardown_daemons


class FailureTest(sf.AdapterTestCase):
    """Every failure typed, with the reason, on both sides."""

    # ---- failures: typed, on both sides, never an endless Transferring ----

    def test_peer_unknown(self) -> None:
        """The decode worker's kvproxyd (decode1) is not a peer of prefill0 and
        the decode side sends no address to dial it by (KVPROXY_ADDR=none)."""
        with worker(ks.DisaggregationMode.DECODE, "decode1", addr="none") as (kv, dm):
            sender, receiver = self.handshake(dm, new_room())
            receiver.send_metadata([1, 2, 3], 0, [])
            e = failure_of(sender)
            self.assertEqual(e.code, "peer-unknown")
            self.assertEqual(e.errno, errno.ENOENT)
            self.assertIn("decode1", e.failure_reason)
            self.assertIn("not a configured peer", e.failure_reason)  # the daemon's reason
            self.assertIsInstance(e, kvproxy.KvproxyError)
            sender.init(3, 0)  # what the scheduler may still call: harmless
            sender.send([1, 2, 3])
            self.assertEqual(sender.poll(), KVPoll.Failed)
            d = failure_of(receiver)
            self.assertEqual(d.code, "peer-unknown")
            self.assertTrue(d.from_prefill)
            self.assertIn("prefill0", d.failure_reason)
            self.assertEqual(receiver.conclude_state, KVPoll.Failed)
            sender.clear()
            receiver.clear()

    def test_destination_region_gone(self) -> None:
        """The decode worker went away after sending its metadata: its close()
        tells the prefill side, which then sends nothing into its pages."""
        with worker(ks.DisaggregationMode.DECODE, "decode0") as (_kv, dm):
            sender, receiver = self.handshake(dm, new_room())
            receiver.send_metadata([4, 5], 0, [])
            poll_until(sender, [KVPoll.WaitingForInput])
        self.assertEqual(receiver.poll(), KVPoll.Failed)  # its manager closed
        self.assertEqual(failure_of(receiver).code, "closed")
        self.wait_decode0_regions()
        e = failure_of(sender)
        self.assertEqual(e.code, "aborted-by-decode")
        self.assertIn("closed", e.failure_reason)
        sender.init(2, 0)
        sender.send([9, 10])
        self.assertEqual(sender.transfers_made, 0, "transfers into the pages of a closed worker")
        sender.clear()

    def test_transfer_timeout(self) -> None:
        """Every kvproxy transfer of this prefill worker has a 1 ns deadline:
        both sides end Failed with code timeout."""
        with worker(ks.DisaggregationMode.PREFILL, "prefill0", transfer_timeout=1e-9) as (kv, pm):
            self.assertTrue(pm.side.registered.wait(XFER_TIMEOUT))
            sender, receiver = self.handshake(self.dm, new_room(), pm=pm)
            receiver.send_metadata([30, 31, 32], 2, [])
            poll_until(sender, [KVPoll.WaitingForInput])
            sender.init(3, 0)
            sender.send([0, 1, 2])
            e = failure_of(sender)
            self.assertEqual(e.code, "timeout")
            self.assertEqual(e.errno, errno.ETIMEDOUT)
            self.assertIn("status timeout", e.failure_reason)
            d = failure_of(receiver)
            self.assertEqual(d.code, "timeout")
            self.assertTrue(d.from_prefill)
            sender.clear()
            receiver.clear()

    def test_decode_waiting_timeout(self) -> None:
        """The prefill side never creates a sender: the decode side gives up
        after waiting_timeout (and the prefill rank, which holds nothing of
        the request, says so at once)."""
        with worker(ks.DisaggregationMode.DECODE, "decode0", waiting_timeout=1.0, transfer_timeout=1.0) as (kv, dm):
            self.assertTrue(dm.try_ensure_parallel_info(self.addr))
            receiver = ks.KVReceiver(dm, self.addr, new_room())
            receiver.init(0)
            poll_until(receiver, [KVPoll.WaitingForInput])
            receiver.send_metadata([1], 0, [])
            t0 = time.monotonic()
            e = failure_of(receiver)
            took = time.monotonic() - t0
            self.assertEqual(e.code, "waiting-timeout")
            self.assertEqual(e.errno, errno.ETIMEDOUT)
            self.assertGreaterEqual(took, 0.9)
            self.assertLess(took, 5.0)
            receiver.clear()

    def test_prefill_bootstrap_timeout(self) -> None:
        with worker(ks.DisaggregationMode.PREFILL, "prefill0", bootstrap_timeout=0.5) as (kv, pm):
            sender = ks.KVSender(pm, pm.side.registry, new_room(), dest_tp_ranks=[0], pp_rank=0)
            t0 = time.monotonic()
            while sender.state != KVPoll.Failed:  # enforced without poll() (the reaper)
                self.assertLess(time.monotonic() - t0, XFER_TIMEOUT)
                pm.wait_for_change(0.05)
            self.assertEqual(failure_of(sender).code, "bootstrap-timeout")
            sender.clear()

    def test_unreachable_bootstrap_server(self) -> None:
        """A request whose prefill server does not answer fails at once
        (unreachable) and does not hold up the others of the manager; one
        never init()ed ends by bootstrap_timeout."""
        with worker(ks.DisaggregationMode.DECODE, "decode0", bootstrap_timeout=2.0) as (kv, dm):
            dead = f"127.0.0.1:{tb.free_ports(1)[0]}"  # nothing listens there
            self.assertFalse(dm.try_ensure_parallel_info(dead))
            lost = ks.KVReceiver(dm, dead, new_room())
            lost.init(0)
            e = failure_of(lost)
            self.assertEqual(e.code, "unreachable")
            self.assertIn(dead, e.failure_reason)
            forgotten = ks.KVReceiver(dm, dead, new_room())  # sglang never calls init() on it
            sender, receiver = self.handshake(dm, new_room())
            receiver.send_metadata([3], 0, [])
            poll_until(sender, [KVPoll.WaitingForInput])
            sender.init(1, 0)
            sender.send([3])
            poll_until(receiver, [KVPoll.Success])
            self.assertEqual(kv.page(0, 3), self.pkv.page(0, 3))
            e = failure_of(forgotten)
            self.assertEqual(e.code, "bootstrap-timeout")
            for r in (lost, forgotten, receiver):
                r.clear()
            sender.clear()

    def test_layout_and_page_count_mismatch(self) -> None:
        """Another model or TP size on the decode side (KV buffers of other sizes):
        both sides fail at once with code layout, the reason naming both values."""
        with worker(ks.DisaggregationMode.DECODE, "decode0", item_k=8192) as (kv, dm):
            sender = ks.KVSender(self.pm, self.addr, new_room(), [0], 0)
            receiver = ks.KVReceiver(dm, self.addr, sender.bootstrap_room)
            self.assertTrue(dm.try_ensure_parallel_info(self.addr))
            t0 = time.monotonic()
            receiver.init(0)
            e = failure_of(receiver)
            self.assertEqual((e.code, e.errno), ("layout", errno.EINVAL))
            self.assertIn("KV buffers", e.failure_reason)
            self.assertIn("8192", e.failure_reason)
            self.assertIn("4096", e.failure_reason)
            e = failure_of(sender)
            self.assertLess(time.monotonic() - t0, 1.0, "the prefill side learnt of the mismatch late")
            self.assertEqual(e.code, "layout")
            self.assertIn("8192", e.failure_reason)
            sender.clear()
            receiver.clear()
        sender, receiver = self.handshake(self.dm, new_room())
        receiver.send_metadata([1, 2], 0, [])
        poll_until(sender, [KVPoll.WaitingForInput])
        sender.init(3, 0)  # prefill has 3 pages, decode allocated 2
        e = failure_of(sender)
        self.assertEqual(e.code, "layout")
        self.assertIn("allocated 2", e.failure_reason)
        self.assertEqual(failure_of(receiver).code, "layout")
        sender.clear()
        receiver.clear()


class DaemonGoneTest(unittest.TestCase):
    """Runs last: a decode worker's kvproxyd dies while the request waits for data."""

    def test_daemon_gone_fails_requests(self) -> None:
        doomed = tb.Daemon(tb.TMP, "doomed0", tb.free_ports(1)[0], "prefill0", DAEMONS["prefill0"].port)
        tb.STARTED.append(doomed)
        doomed.start()
        doomed.wait_ready(need_peer=False)
        DAEMONS["doomed0"] = doomed
        with worker(ks.DisaggregationMode.PREFILL, "prefill0", layers=2, pages=8) as (_pkv, pm), \
                worker(ks.DisaggregationMode.DECODE, "doomed0", layers=2, pages=8) as (_kv, dm):
            addr = pm.side.registry
            self.assertTrue(pm.side.registered.wait(XFER_TIMEOUT))
            self.assertTrue(dm.try_ensure_parallel_info(addr))
            receiver = ks.KVReceiver(dm, addr, new_room())
            receiver.init(0)
            poll_until(receiver, [KVPoll.WaitingForInput])
            receiver.send_metadata([1], 0, [])
            self.assertEqual(receiver.poll(), KVPoll.Transferring)
            doomed.kill()
            log("killed kvproxyd doomed0 (SIGKILL)")
            e = failure_of(receiver)
            self.assertEqual(e.code, "daemon-gone")
            self.assertEqual(e.errno, errno.EPIPE)
            late = ks.KVReceiver(dm, addr, new_room())
            self.assertEqual(failure_of(late).code, "daemon-gone")


if __name__ == "__main__":
    sys.exit(sf.run_cases(FailureTest, DaemonGoneTest))  # DaemonGoneTest last: it kills a daemon
