#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Tests of kvproxy.sglang's aborts: a decode rank giving up before the prefill
side sent, and with 64 MiB in flight (prefill kvproxyd alive or frozen): no
byte lands after abort() returned; another rank's failure ends a healthy request.

The fixture (three kvproxyd and a bootstrap server), the environment and the
exit status: sglang_fixture.py.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import sglang_fixture as sf  # noqa: E402
from sglang_fixture import DAEMONS, XFER_TIMEOUT, failure_of, log, new_room, poll_until, worker  # noqa: E402

from kvproxy import sglang as ks  # noqa: E402
from kvproxy.sglang import KVPoll  # noqa: E402

setUpModule = sf.setup_daemons
tearDownModule = sf.teardown_daemons


class AbortTest(sf.AdapterTestCase):
    """Aborts on the decode side, and the MIN all-reduce's failure from another rank."""

    # ---- aborts ----

    def test_abort_and_another_rank(self) -> None:
        sender, receiver = self.handshake(self.dm, new_room())
        receiver.abort()
        self.assertEqual(failure_of(receiver).code, "aborted")
        self.assertEqual(failure_of(sender).code, "aborted-by-decode")  # told at once
        sender.clear()
        receiver.clear()
        # sglang's MIN all-reduce: another rank failed; failure_exception() on
        # this rank's healthy request ends it and says so.
        sender, receiver = self.handshake(self.dm, new_room())
        with self.assertRaises(ks.KVTransferError) as cm:
            sender.failure_exception()
        self.assertTrue(cm.exception.is_from_another_rank)
        self.assertEqual(sender.poll(), KVPoll.Failed)
        with self.assertRaises(ks.KVTransferError) as cm:
            receiver.failure_exception()
        self.assertTrue(cm.exception.is_from_another_rank)
        self.assertEqual(receiver.poll(), KVPoll.Failed)
        sender.clear()
        receiver.clear()

    def test_decode_abort_before_send(self) -> None:
        """The decode side gives up after its metadata reached the prefill side,
        which has not sent yet: the sender ends aborted-by-decode and never
        submits; abort() returns only once nothing can land."""
        sender, receiver = self.handshake(self.dm, new_room())
        receiver.send_metadata([40, 41, 42], 0, [])
        poll_until(sender, [KVPoll.WaitingForInput])
        submitted = DAEMONS["prefill0"].admin_call("stats")["totals"]["xfers_submitted"]
        receiver.abort()
        self.assertEqual(receiver.poll(), KVPoll.Failed, "abort() returned before the request ended")
        self.assertEqual(failure_of(receiver).code, "aborted")
        e = failure_of(sender)
        self.assertEqual((e.code, e.errno), ("aborted-by-decode", errno.ECANCELED))
        self.assertIn("decode0", e.failure_reason)
        sender.init(3, 0)  # what the prefill scheduler still calls
        sender.send([1, 2, 3])
        self.assertEqual(sender.poll(), KVPoll.Failed)
        self.assertEqual(sender.transfers_made, 0, "the aborted sender made kvproxy transfers")
        self.assertEqual(DAEMONS["prefill0"].admin_call("stats")["totals"]["xfers_submitted"], submitted)
        sender.clear()
        receiver.clear()

    def abort_in_flight(self, freeze: bool) -> None:
        """The decode side gives up while 64 MiB of the prefill side's transfers
        are in flight (2 x 32 MiB, max_inflight 2). ``freeze``: the prefill
        kvproxyd is stopped (SIGSTOP) first, so nothing can be cancelled
        there. abort() returns once kvproxyd fenced the request (without a
        fence: once the prefill side acknowledged, after the thaw), and no
        byte lands after it returned, checked once the sender's transfers ended."""
        pd = DAEMONS["prefill0"]
        with worker(ks.DisaggregationMode.PREFILL, "prefill0", pages=256, item_k=1 << 18, max_inflight=2) as (pkv, pm), \
                worker(ks.DisaggregationMode.DECODE, "decode0", pages=256, item_k=1 << 18) as (dkv, dm):
            self.assertTrue(pm.side.registered.wait(XFER_TIMEOUT))
            fenced = dm.side.can_fence
            rnd = random.Random(83)
            pages = list(range(256))
            pkv.fill_pages(pages, rnd)
            nbuf = len(dkv.ptrs)
            for b in range(nbuf):  # a sentinel where the data goes
                ctypes.memset(dkv.ptrs[b], 0xA5, dkv.lens[b])
            tx0 = self.prefill_tx()
            sender, receiver = self.handshake(dm, new_room(), pm=pm)
            receiver.send_metadata(pages, 0, [])
            poll_until(sender, [KVPoll.WaitingForInput])
            sender.init(len(pages), 0)
            sender.send(pages)
            deadline = time.monotonic() + XFER_TIMEOUT
            while receiver._landed_bytes == 0:  # the first transfer is in: the others are under way
                self.assertLess(time.monotonic(), deadline, "nothing landed")
                dm.wait_for_change(0.001)
            if freeze:
                os.kill(pd.proc.pid, signal.SIGSTOP)
            done = threading.Event()
            took = []

            def abort() -> None:
                t0 = time.monotonic()
                receiver.abort()
                took.append(time.monotonic() - t0)
                done.set()

            aborter = threading.Thread(target=abort)
            try:
                in_flight = len(pm.side.inflight)
                outstanding = receiver._expected - receiver._landed_bytes
                self.assertLess(receiver._landed_bytes, receiver._expected, "the transfer ended before the abort")
                aborter.start()
                # The prefill manager saw the abort and cancelled, or the decode
                # side's fence refused a transfer of it before the abort arrived.
                e = failure_of(sender)
                self.assertIn(e.code, ("aborted-by-decode", "remote"))
                if fenced:
                    self.assertTrue(done.wait(XFER_TIMEOUT), "abort() did not return with the fence")
                elif freeze:
                    # No completion can come back from the stopped daemon: the
                    # prefill side has not acknowledged, the receiver must wait.
                    self.assertGreater(sender._pending, 0)
                    self.assertFalse(done.is_set(), "abort() returned before the prefill side stopped")
            finally:
                if freeze:
                    os.kill(pd.proc.pid, signal.SIGCONT)
            self.assertTrue(done.wait(XFER_TIMEOUT))
            aborter.join()
            at_abort = [ctypes.string_at(dkv.ptrs[b], dkv.lens[b]) for b in range(nbuf)]
            self.assertEqual(failure_of(receiver).code, "aborted")
            deadline = time.monotonic() + XFER_TIMEOUT
            while sender._pending:  # every transfer of the sender ended (cancelled, or refused by the fence)
                self.assertLess(time.monotonic(), deadline, "the sender's transfers never ended")
                pm.wait_for_change(0.05)
            moved = self.prefill_tx() - tx0
            fence = f"fence confirmed {receiver.fence_seconds * 1e3:.2f} ms after submission" if fenced else "no fence"
            log(f"abort in flight ({'prefill kvproxyd frozen' if freeze else 'prefill alive'}): abort() took "
                f"{took[0] * 1e3:.2f} ms ({fence}); {in_flight} transfers in flight, {outstanding / (1 << 20):.1f} MiB "
                f"not landed yet; {moved} of "
                f"{len(pages) * sum(dkv.items)} bytes sent")
            self.assertLess(moved, len(pages) * sum(dkv.items), "the transfer was not cut short")
            for b in range(nbuf):
                self.assertEqual(ctypes.string_at(dkv.ptrs[b], dkv.lens[b]), at_abort[b],
                                 f"buffer {b}: bytes landed after abort() returned")
            if fenced and freeze:
                self.assertLess(took[0], 1.0 + 1.0, "the fence took longer than the daemon's peer_ms bound")
            sender.clear()
            receiver.clear()

    def prefill_tx(self) -> int:
        return [p["tx_bytes"] for p in DAEMONS["prefill0"].admin_call("stats")["peers"] if p["node_id"] == "decode0"][0]

    def test_decode_abort_in_flight(self) -> None:
        self.abort_in_flight(freeze=False)

    def test_decode_abort_in_flight_frozen_prefill(self) -> None:
        self.abort_in_flight(freeze=True)


if __name__ == "__main__":
    sys.exit(sf.run_cases(AbortTest))
