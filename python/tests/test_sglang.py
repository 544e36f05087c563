#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Tests of kvproxy.sglang (the sglang transfer-backend adapter) against live kvproxyd.

Three kvproxyd on 127.0.0.1 (started as in test_binding.py): prefill0 and
decode0, peers of each other, and decode1, which prefill0 does not know. A
bootstrap server of the adapter runs in this process. Each case drives the
adapter through the calls sglang's schedulers make (prefill:
KVSender -> poll until WaitingForInput -> pop_decode_prefix_len -> init ->
send per chunk -> poll until Success; decode: KVReceiver ->
try_ensure_parallel_info -> init(dp rank) -> poll until WaitingForInput ->
send_metadata -> poll until Success), on KV caches in host memory (per-layer
K and V buffers in memfds, aux rows in plain memory), and checks the bytes of
the selected pages, or the typed failure.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir. Exit status: 0 pass, 1 fail, 77 skip (with the reason).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import enum
import errno
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Iterator, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

import kvproxy  # noqa: E402
from kvproxy import sglang as ks  # noqa: E402
from kvproxy.sglang import KVPoll  # noqa: E402

XFER_TIMEOUT = 30.0
BOOT: Optional[ks.KvproxyKVBootstrapServer] = None
DAEMONS: Dict[str, tb.Daemon] = {}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} test_sglang] {msg}", file=sys.stderr, flush=True)


def addr_of(buf: kvproxy.HostBuffer) -> int:
    # The temporary export ends with the expression, so buf.close() still works.
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class PagedKV:
    """A worker's paged KV cache in host memory, shaped like sglang's MHA pool:
    ``layers`` K buffers in one memfd and ``layers`` V buffers in another
    (page ``i`` of buffer ``b`` at ``ptr[b] + i * item[b]``), plus aux
    (metadata) rows in plain memory, as sglang's CPU tensors are."""

    def __init__(self, layers: int, pages: int, item_k: int = 4096, item_v: int = 2048,
                 aux_rows: int = 16, aux_items: Sequence[int] = (64, 192)) -> None:
        self.pages = pages
        self.k = kvproxy.HostBuffer(layers * pages * item_k)
        self.v = kvproxy.HostBuffer(layers * pages * item_v)
        kb, vb = addr_of(self.k), addr_of(self.v)
        self.ptrs = [kb + l * pages * item_k for l in range(layers)] + [vb + l * pages * item_v for l in range(layers)]
        self.items = [item_k] * layers + [item_v] * layers
        self.lens = [pages * it for it in self.items]
        self.aux_items = list(aux_items)
        self.aux = [(ctypes.c_char * (aux_rows * it))() for it in self.aux_items]

    def args(self, engine_rank: int = 0) -> ks.KVArgs:
        return ks.KVArgs(
            engine_rank=engine_rank, gpu_id=0, page_size=16,
            kv_data_ptrs=list(self.ptrs), kv_data_lens=list(self.lens), kv_item_lens=list(self.items),
            aux_data_ptrs=[ctypes.addressof(a) for a in self.aux], aux_data_lens=[len(a) for a in self.aux],
            aux_item_lens=list(self.aux_items),
        )

    def page(self, b: int, i: int) -> bytes:
        return ctypes.string_at(self.ptrs[b] + i * self.items[b], self.items[b])

    def fill_pages(self, pages: Sequence[int], rnd: random.Random) -> None:
        for b in range(len(self.ptrs)):
            for i in pages:
                data = rnd.randbytes(self.items[b])
                ctypes.memmove(self.ptrs[b] + i * self.items[b], data, len(data))

    def aux_row(self, j: int, r: int) -> bytes:
        it = self.aux_items[j]
        return bytes(self.aux[j][r * it:(r + 1) * it])

    def set_aux_row(self, j: int, r: int, data: bytes) -> None:
        it = self.aux_items[j]
        self.aux[j][r * it:(r + 1) * it] = data

    def close(self) -> None:
        self.k.close()
        self.v.close()


def server_args(**fields) -> SimpleNamespace:
    """What the adapter reads of sglang's ServerArgs (sglang's defaults for the rest)."""
    sa = SimpleNamespace(host="127.0.0.1", port=30000, disaggregation_bootstrap_port=BOOT.port, pp_size=1,
                         tp_size=1, dp_size=1, enable_dp_attention=False, kv_cache_dtype="auto",
                         load_balance_method="follow_bootstrap_room", dist_init_addr=None)
    for k, v in fields.items():
        setattr(sa, k, v)
    return sa


def config(node: str, **settings) -> ks.KvproxyConfig:
    """The adapter's settings as sglang's processes read them ($KVPROXY_*), for one daemon."""
    env = {"KVPROXY_SOCKET": DAEMONS[node].sock}
    env.update({f"KVPROXY_{k.upper()}": str(v) for k, v in settings.items()})
    return ks.KvproxyConfig.from_env(env)


def manager(kv: "PagedKV", mode: ks.DisaggregationMode, node: str, sa: Optional[SimpleNamespace] = None,
            **settings) -> ks.KvproxyKVManager:
    cls = ks.KvproxyBackend().get_kv_class(SglangKVClassType.MANAGER)
    return cls(kv.args(), mode, sa or server_args(), False, config=config(node, **settings))


@contextlib.contextmanager
def worker(mode: ks.DisaggregationMode, node: str, layers: int = 4, pages: int = 32, item_k: int = 4096,
           sa: Optional[SimpleNamespace] = None, **settings) -> Iterator[Tuple["PagedKV", ks.KvproxyKVManager]]:
    """A worker of one test case's own: its KV cache and manager, both closed
    after; a prefill worker gets a bootstrap server of its own (one per
    prefill server, as sglang runs them)."""
    kv = PagedKV(layers, pages, item_k=item_k)
    boot = None
    try:
        if mode == ks.DisaggregationMode.PREFILL and sa is None:
            boot = ks.KvproxyKVBootstrapServer("127.0.0.1", 0)
            sa = server_args(disaggregation_bootstrap_port=boot.port)
        mgr = manager(kv, mode, node, sa, **settings)
        try:
            yield kv, mgr
        finally:
            mgr.close()
    finally:
        kv.close()
        if boot is not None:
            boot.close()


class SglangKVClassType(enum.Enum):
    """A stand-in for sglang's KVClassType (the provider compares values)."""

    KVARGS = "kvargs"
    MANAGER = "manager"
    SENDER = "sender"
    RECEIVER = "receiver"
    BOOTSTRAP_SERVER = "bootstrap_server"


def poll_until(obj, want: Sequence[KVPoll], timeout: float = XFER_TIMEOUT) -> KVPoll:
    """poll() as a scheduler does, until a state in ``want``; bounded; Failed is an error unless wanted."""
    deadline = time.monotonic() + timeout
    while True:
        st = obj.poll()
        if st in want:
            return st
        if st == KVPoll.Failed:
            try:
                obj.failure_exception()
            except ks.KVTransferError as e:
                raise AssertionError(f"{type(obj).__name__} failed: {e}") from e
            raise AssertionError(f"{type(obj).__name__} failed without an exception")
        if time.monotonic() > deadline:
            raise AssertionError(f"{type(obj).__name__} still {st.name} after {timeout}s, wanted {[w.name for w in want]}")
        obj.kv_mgr.wait_for_change(0.05)


def failure_of(obj) -> ks.KVTransferError:
    st = poll_until(obj, [KVPoll.Failed])
    assert st == KVPoll.Failed
    try:
        obj.failure_exception()
    except ks.KVTransferError as e:
        return e
    raise AssertionError("failure_exception() did not raise")


_rooms = iter(range(1 << 40, 1 << 41, 7919))


def new_room() -> int:
    return next(_rooms)


def setUpModule() -> None:
    global BOOT
    tb.TMP = Path(tempfile.mkdtemp(prefix="kvp-sglang."))
    log(f"temp dir {tb.TMP}")
    p, d = tb.start_pair(tb.TMP, "prefill0", "decode0")
    # decode1 lists prefill0 as a peer, prefill0 does not know decode1.
    stray = tb.Daemon(tb.TMP, "decode1", tb.free_ports(1)[0], "prefill0", p.port)
    tb.STARTED.append(stray)
    stray.start()
    stray.wait_ready(need_peer=False)
    DAEMONS.update({"prefill0": p, "decode0": d, "decode1": stray})
    BOOT = ks.KvproxyKVBootstrapServer(host="127.0.0.1", port=0)


def tearDownModule() -> None:
    if BOOT is not None:
        BOOT.close()
    problems = []
    for d in reversed(tb.STARTED):
        p = d.stop()
        if p and d.node_id != "doomed0":  # killed on purpose
            problems.append(p + "\n" + d.log_tail())
    if problems or os.environ.get("KVP_KEEP"):
        log(f"kept {tb.TMP}")
    else:
        shutil.rmtree(tb.TMP, ignore_errors=True)
    if problems:
        raise AssertionError("\n".join(problems))


class SglangAdapterTest(unittest.TestCase):
    """Transfers and failures through the adapter, one prefill and one decode worker."""

    LAYERS = 4
    P_PAGES = 600
    D_PAGES = 700

    @classmethod
    def setUpClass(cls) -> None:
        cls.pkv = PagedKV(cls.LAYERS, cls.P_PAGES)
        cls.dkv = PagedKV(cls.LAYERS, cls.D_PAGES)
        cls.pm = manager(cls.pkv, ks.DisaggregationMode.PREFILL, "prefill0")
        cls.dm = manager(cls.dkv, ks.DisaggregationMode.DECODE, "decode0")
        cls.addr = f"127.0.0.1:{BOOT.port}"
        assert cls.pm.side.registered.wait(XFER_TIMEOUT), "the prefill manager never registered"

    @classmethod
    def tearDownClass(cls) -> None:
        cls.pm.close()
        cls.dm.close()
        cls.pkv.close()
        cls.dkv.close()

    def handshake(self, dm: ks.KvproxyKVManager, room: int, pm: Optional[ks.KvproxyKVManager] = None):
        """Sender and receiver for ``room``, the receiver bootstrapped (WaitingForInput)."""
        addr = pm.side.registry if pm is not None else self.addr
        sender = ks.KVSender(pm or self.pm, addr, room, dest_tp_ranks=[0], pp_rank=0)
        self.assertEqual(sender.poll(), KVPoll.Bootstrapping)
        receiver = ks.KVReceiver(dm, addr, room)
        deadline = time.monotonic() + XFER_TIMEOUT
        while not dm.try_ensure_parallel_info(addr):  # the decode scheduler retries this too
            self.assertLess(time.monotonic(), deadline, "prefill info never available")
            dm.wait_for_change(0.05)
        self.assertEqual(dm.prefill_info_table[addr].dp_size, 1)
        self.assertTrue(dm.prefill_info_table[addr].follow_bootstrap_room)
        receiver.init(0)
        poll_until(receiver, [KVPoll.WaitingForInput])
        return sender, receiver

    def send_pages(self, sender, receiver, src: Sequence[int], dst: Sequence[int]) -> None:
        """The call sequence of one request sent in one chunk, both ends to Success."""
        receiver.send_metadata(dst, 0, [])
        poll_until(sender, [KVPoll.WaitingForInput])
        sender.init(len(src), 0)
        sender.send(src)
        self.assertEqual(poll_until(sender, [KVPoll.Success]), KVPoll.Success)
        self.assertEqual(poll_until(receiver, [KVPoll.Success]), KVPoll.Success)

    def wait_decode0_regions(self) -> None:
        """Until decode0 holds only the regions of the shared decode worker
        (the daemon reclaims those of a closed client when it sees it go); bounded."""
        want = self.dm._kv.region_count + self.dm._aux.region_count
        deadline = time.monotonic() + XFER_TIMEOUT
        while (n := DAEMONS["decode0"].admin_call("status")["regions"]) != want:
            self.assertLess(time.monotonic(), deadline, f"decode0 holds {n} regions, the live workers {want}")
            self.dm.wait_for_change(0.05)

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


def main() -> int:
    tb.require_daemon_and_library()
    if not hasattr(random.Random, "randbytes"):
        tb.skip_all("Python >= 3.9 needed (random.randbytes)")
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for case in (SglangAdapterTest, DaemonGoneTest):  # DaemonGoneTest last
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
