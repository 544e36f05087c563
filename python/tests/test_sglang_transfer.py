#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Tests of kvproxy.sglang (the sglang transfer-backend adapter): the call sequence
with the bytes checked, and the manager's life (back-pressure, memory saver,
set-up refusals, the provider), one prefill and one decode worker.

The fixture (three kvproxyd and a bootstrap server), the environment and the
exit status: sglang_fixture.py.
"""

from __future__ import annotations

import array
import ctypes
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)
import sglang_fixture as sf  # noqa: E402
from sglang_fixture import DAEMONS, XFER_TIMEOUT, PagedKV, SglangKVClassType, config, failure_of, log, new_room, poll_until, \
    server_args, worker  # noqa: E402

import kvproxy  # noqa: E402
from kvproxy import sglang as ks  # noqa: E402
from kvproxy.sglang import KVPoll  # noqa: E402

setUpModule = sf.setup_daemons
tearDownModule = sf.teardown_daemons


class TransferTest(sf.AdapterTestCase):
    """Requests through the adapter end to end, every byte checked."""

    # ---- the sglang call sequence, bytes checked ----

    def test_chunked_transfer_pages_and_aux(self) -> None:
        rnd = random.Random(81)
        room = new_room()
        sender, receiver = self.handshake(self.dm, room)
        # A request of 240 pages: scattered on both sides (every other page
        # here, shuffled runs there), so 8 buffers need well over
        # max_segments segments: several kvproxy transfers.
        src = list(range(1, 481, 2))
        src[10:20] = range(500, 510)  # a run of consecutive pages on both sides: one segment per buffer
        dst = rnd.sample(range(600), len(src))
        dst[10:20] = range(600, 610)
        self.pkv.fill_pages(src, rnd)
        row = [rnd.randbytes(it) for it in self.pkv.aux_items]
        for j, data in enumerate(row):
            self.pkv.set_aux_row(j, 3, data)

        receiver.send_metadata(array.array("i", dst), 5, [], decode_prefix_len=0)
        self.assertEqual(receiver.poll(), KVPoll.Transferring)
        poll_until(sender, [KVPoll.WaitingForInput])
        self.assertEqual(sender.pop_decode_prefix_len(), 0)
        sender.init(len(src), 3)
        self.assertTrue(sender.should_send_kv_chunk(100, False))
        sender.send(array.array("q", src[:100]), None)
        self.assertIn(sender.poll(), (KVPoll.Transferring, KVPoll.Success))
        self.assertNotEqual(sender.poll(), KVPoll.Success, "Success before the last chunk")
        sender.send(src[100:], [], 0)  # base/conn.py's positional token_position_offset
        self.assertEqual(poll_until(sender, [KVPoll.Success]), KVPoll.Success)
        self.assertEqual(poll_until(receiver, [KVPoll.Success]), KVPoll.Success)
        self.assertGreaterEqual(sender.transfers_made, 3, "expected several kvproxy transfers (max_segments each)")
        self.assertEqual(receiver.conclude_state, KVPoll.Success)

        nbuf = 2 * self.LAYERS
        for b in range(nbuf):
            for s, d in zip(src, dst):
                self.assertEqual(self.dkv.page(b, d), self.pkv.page(b, s), f"buffer {b}: page {s} -> {d}")
        untouched = sorted(set(range(self.D_PAGES)) - set(dst))[:50]
        for b in range(nbuf):
            for d in untouched:
                self.assertEqual(self.dkv.page(b, d), bytes(self.dkv.items[b]), f"buffer {b}: page {d} was written")
        for j, data in enumerate(row):
            self.assertEqual(self.dkv.aux_row(j, 5), data, f"aux buffer {j} row")
            self.assertEqual(self.dkv.aux_row(j, 4), bytes(self.dkv.aux_items[j]), f"aux buffer {j}: other row written")
        sender.clear()  # sglang reads the metric after clear()
        m = sender.get_transfer_metric()
        want = len(src) * sum(self.pkv.items) + sum(self.pkv.aux_items)
        self.assertEqual(m.transfer_total_bytes, want)
        self.assertGreater(m.transfer_latency_s, 0)
        receiver.clear()

    def test_decode_prefix_and_producer_event(self) -> None:
        """The decode side holds a prefix (sent only the rest); a chunk's
        producer event holds its transfers back until it completed."""
        rnd = random.Random(82)
        sender, receiver = self.handshake(self.dm, new_room())
        receiver.send_metadata([20, 21], 1, None, decode_prefix_len=32)
        poll_until(sender, [KVPoll.WaitingForInput])
        self.assertEqual(sender.pop_decode_prefix_len(), 32)
        self.assertEqual(sender.pop_decode_prefix_len(), 0, "pop_decode_prefix_len() pops")
        src = [7, 8]
        self.pkv.fill_pages(src, rnd)
        sender.init(2, 1)
        self.assertTrue(sender.should_send_kv_chunk(0, True), "an empty last chunk still carries the aux row")

        class Event:  # a CUDA event's query(), as sglang hands it over
            done = False

            def query(self) -> bool:
                return self.done

        ev = Event()
        submitted = DAEMONS["prefill0"].admin_call("stats")["totals"]["xfers_submitted"]
        sender.send(src, None, producer_event=ev)
        self.assertEqual(sender.poll(), KVPoll.Transferring)
        self.assertEqual(len(self.pm.side.queue), 1, "the chunk should wait for its producer event")
        self.assertEqual(DAEMONS["prefill0"].admin_call("stats")["totals"]["xfers_submitted"], submitted)
        ev.done = True
        poll_until(sender, [KVPoll.Success])
        poll_until(receiver, [KVPoll.Success])
        self.assertEqual(self.dkv.page(0, 20), self.pkv.page(0, 7))
        self.assertEqual(self.dkv.page(2 * self.LAYERS - 1, 21), self.pkv.page(2 * self.LAYERS - 1, 8))
        sender.clear()
        receiver.clear()

    def test_new_sender_after_ended_and_sweep(self) -> None:
        """A sender sglang never clears is swept once it ended; a later sender
        for the same room (PD rebootstrap) works."""
        room = new_room()
        for round_ in range(2):
            sender, receiver = self.handshake(self.dm, room)
            receiver.send_metadata([30 + round_], 0, [])
            poll_until(sender, [KVPoll.WaitingForInput])
            sender.init(1, 0)
            sender.send([40 + round_])
            poll_until(sender, [KVPoll.Success])
            poll_until(receiver, [KVPoll.Success])
            self.assertEqual(self.dkv.page(0, 30 + round_), self.pkv.page(0, 40 + round_))
            # No clear() on either: the managers forget them by themselves.
            deadline = time.monotonic() + XFER_TIMEOUT
            while room in self.pm.side.senders or room in self.dm.side.receivers:
                self.assertLess(time.monotonic(), deadline, "ended requests never swept")
                self.pm.wait_for_change(0.05)
        # A sender still open for a room refuses a second one for it.
        s1 = ks.KVSender(self.pm, self.addr, room, [0], 0)
        s2 = ks.KVSender(self.pm, self.addr, room, [0], 0)
        self.assertEqual(failure_of(s2).code, "protocol")
        s1.abort()
        self.assertEqual(failure_of(s1).code, "aborted")
        s1.clear()

    def test_peer_by_address(self) -> None:
        """decode1 is not a peer of prefill0, but the decode side sends its
        kvproxyd's address through the bootstrap: prefill0's kvproxyd dials it
        on demand, learns its node id, and the KV lands, every byte as sent."""
        rnd = random.Random(61)
        with worker(ks.DisaggregationMode.DECODE, "decode1") as (kv, dm):
            self.assertTrue(dm.kvp_addr and dm.kvp_addr.endswith(f":{DAEMONS['decode1'].port}"), dm.kvp_addr)
            src, dst = [40, 41, 43], [7, 3, 9]
            self.pkv.fill_pages(src, rnd)
            sender, receiver = self.handshake(dm, new_room())
            self.send_pages(sender, receiver, src, dst)
            for b in range(2 * self.LAYERS):
                for sp, dp in zip(src, dst):
                    self.assertEqual(kv.page(b, dp), self.pkv.page(b, sp), f"buffer {b}: page {sp} -> {dp}")
            sender.clear()
            receiver.clear()
        peers = DAEMONS["prefill0"].admin_call("peers")["peers"]
        self.assertIn(("decode1", "on_demand"), [(p["node_id"], p["origin"]) for p in peers])
        # Gone again, for the tests where prefill0 must not know decode1 (the
        # adapter would learn it from the next transfer's no-peer: tell it now).
        DAEMONS["prefill0"].admin_call("peer_remove", params={"node_id": "decode1"})
        self.pm.side.forget_peer("decode1")

    # ---- the manager's life ----

    def test_no_buffers_is_back_pressure(self) -> None:
        """A prefill worker's own backlog outwaits kvproxyd's admission_ms
        (one transfer slot, admission_ms = 1, four 32 MiB transfers asked for
        at once: each waiting one is refused no-buffers, since a 32 MiB
        transfer cannot end within 1 ms). The adapter sends those again with
        fewer in flight: the request succeeds, every byte lands, and the
        daemon counted the refusals the adapter retried."""
        extra = "limits = { max_inflight = 1; };"
        # Both ends: peers must agree on the limits.
        pd, dd = tb.start_pair(tb.TMP, "prefill9", "decode9", extra, "admission_ms = 1;")
        DAEMONS.update({"prefill9": pd, "decode9": dd})
        with worker(ks.DisaggregationMode.PREFILL, "prefill9", pages=64, item_k=1 << 18, max_inflight=4) as (pkv, pm), \
                worker(ks.DisaggregationMode.DECODE, "decode9", pages=64, item_k=1 << 18) as (dkv, dm):
            self.assertTrue(pm.side.registered.wait(XFER_TIMEOUT))
            rnd = random.Random(89)
            src = list(range(64))
            dst = rnd.sample(range(64), 64)
            pkv.fill_pages(src, rnd)
            sender, receiver = self.handshake(dm, new_room(), pm=pm)
            self.send_pages(sender, receiver, src, dst)
            for b in range(len(dkv.ptrs)):
                for s_, d_ in zip(src, dst):
                    self.assertEqual(dkv.page(b, d_), pkv.page(b, s_), f"buffer {b}: page {s_} -> {d_}")
            refused = sum(c["refused"] for c in pd.admin_call("stats")["clients"])
            log(f"no-buffers as back-pressure: {pm.side.requeued} transfers sent again, "
                f"{refused} refused by kvproxyd, {sender.transfers_made} transfers made")
            self.assertGreater(pm.side.requeued, 0, "no transfer was refused: the test did not overload the slot")
            self.assertEqual(refused, pm.side.requeued, "the daemon's refusals are not the adapter's retries")
            sender.clear()
            receiver.clear()

    def test_memory_saver(self) -> None:
        """release/resume_memory_occupation: open requests fail, the KV regions
        are deregistered, then registered again (new keys), and transfers work."""
        with worker(ks.DisaggregationMode.DECODE, "decode0") as (kv, dm):
            keys = [p.key for p in dm._kv.placements]
            open_one, _ = self.handshake(dm, new_room())[::-1]
            before = DAEMONS["decode0"].admin_call("status")["regions"]
            dm.deregister_buffer_to_engine()
            self.assertEqual(failure_of(open_one).code, "memory-released")
            self.assertEqual(DAEMONS["decode0"].admin_call("status")["regions"], before - 2)  # K and V memfds
            refused = ks.KVReceiver(dm, self.addr, new_room())
            self.assertEqual(failure_of(refused).code, "memory-released")
            dm.register_buffer_to_engine()
            self.assertEqual(DAEMONS["decode0"].admin_call("status")["regions"], before)
            self.assertNotEqual([p.key for p in dm._kv.placements], keys)
            sender, receiver = self.handshake(dm, new_room())
            receiver.send_metadata([9], 0, [])
            poll_until(sender, [KVPoll.WaitingForInput])
            sender.init(1, 0)
            sender.send([11])
            poll_until(receiver, [KVPoll.Success])
            self.assertEqual(kv.page(3, 9), self.pkv.page(3, 11))
            for r in (open_one, refused, receiver, sender):
                r.clear()

    # ---- set-up errors ----

    def test_setup_refusals(self) -> None:
        kv = PagedKV(1, 4)
        try:
            # A state type kvproxy.sglang does not move is refused by name
            # (the supported ones move: test_sglang_topo.py).
            args = kv.args()
            args.state_types = ["qsa_pending"]
            args.state_data_ptrs, args.state_data_lens, args.state_item_lens = [[]], [[]], [[]]
            with self.assertRaises(NotImplementedError) as cm:
                ks.KvproxyKVManager(args, "decode", server_args(), config=config("decode0"))
            self.assertIn("qsa_pending", str(cm.exception))
            args = kv.args()
            args.state_type = "mamba"  # the single state type of older sglang releases
            with self.assertRaises(NotImplementedError) as cm:
                ks.KvproxyKVManager(args, "decode", server_args(), config=config("decode0"))
            self.assertIn("state_type", str(cm.exception))
            for field in ({"attn_cp_size": 2}, {"dcp_size": 2}):
                with self.assertRaises(NotImplementedError) as cm:
                    ks.KvproxyKVManager(kv.args(), "prefill", server_args(**field), config=config("prefill0"))
                self.assertIn(next(iter(field)), str(cm.exception))
            plain = (ctypes.c_char * 4096)()
            args = kv.args()
            args.kv_data_ptrs = [ctypes.addressof(plain)] * 2
            args.kv_data_lens = [4096, 4096]
            args.kv_item_lens = [1024, 1024]
            with self.assertRaises(kvproxy.InvalidArgument) as cm:
                ks.KvproxyKVManager(args, "decode", server_args(), config=config("decode0"))
            self.assertIn("plain host memory", str(cm.exception))
            with self.assertRaises(kvproxy.ConnectError):
                ks.KvproxyKVManager(kv.args(), "decode", server_args(),
                                    config=ks.KvproxyConfig(socket=str(tb.TMP / "nosuch.sock")))
            with self.assertRaises(ValueError):
                ks.KvproxyKVManager(kv.args(), "null", server_args(), config=config("decode0"))
            with self.assertRaises(ValueError) as cm2:
                ks.KvproxyKVManager(kv.args(), "decode", server_args(), config=ks.KvproxyConfig.from_env({}))
            self.assertIn("KVPROXY_SOCKET", str(cm2.exception))
        finally:
            kv.close()
        # The daemon holds no region of the refused managers.
        self.wait_decode0_regions()

    def test_regions_and_provider(self) -> None:
        # K buffers share one memfd, V buffers another; each aux buffer has a mirror.
        self.assertEqual(self.dm._kv.region_count, 2)
        self.assertEqual(self.dm._aux.region_count, 2)
        provider = ks.KvproxyBackend()
        self.assertIs(provider.get_kv_class(SglangKVClassType.SENDER), ks.KvproxyKVSender)
        self.assertIs(provider.get_kv_class(SglangKVClassType.RECEIVER), ks.KvproxyKVReceiver)
        self.assertIs(provider.get_kv_class(SglangKVClassType.BOOTSTRAP_SERVER), ks.KvproxyKVBootstrapServer)
        self.assertIs(provider.get_kv_class(SglangKVClassType.KVARGS), ks.KVArgs)
        self.assertIsNone(provider.get_kv_class("nosuch"))
        self.assertEqual(int(KVPoll.Transferring), 3)
        self.assertEqual([int(p) for p in KVPoll], [0, 1, 2, 3, 4])
        self.assertEqual(self.pm.kv_transfer_protocol(), "kvproxy")
        self.assertFalse(self.pm.uses_terminal_source_publication())


if __name__ == "__main__":
    sys.exit(sf.run_cases(TransferTest))
