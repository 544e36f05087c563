#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Tests of kvproxy.vllm (the vLLM KV connector) against live kvproxyd.

Three kvproxyd on 127.0.0.1 (started by daemon_harness.py): prefill0 and
decode0, peers of each other, and decode1, which prefill0 does not know.
Each case builds vLLM instances of its own (vllm_harness.Engine: the
scheduler-side connector and one worker-side connector per TP rank, KV
caches in memfds shaped like vLLM's) and steps them through the calls
vLLM's scheduler and model runner make, then checks the blocks byte by
byte, the load errors vLLM is told about, and the prefill side's release
of its blocks. The "prefill killed" case runs the prefill instance in a
child process (this script with --prefill-child) and SIGKILLs it while its
transfers are in flight.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir. Exit status: 0 pass, 1 fail, 77 skip (with the reason).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)
import vllm_harness as vh  # noqa: E402

import kvproxy  # noqa: E402
from kvproxy.vllm import KvproxyConnector, KvproxyConnectorStats, KvproxyPromMetrics, KvproxyVllmConfig  # noqa: E402
from kvproxy.vllm import layout as kl  # noqa: E402

XFER_TIMEOUT = 30.0
DAEMONS: Dict[str, tb.Daemon] = {}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} test_vllm] {msg}", file=sys.stderr, flush=True)


def sock(node: str) -> str:
    return DAEMONS[node].sock


def setUpModule() -> None:
    tb.TMP = Path(tempfile.mkdtemp(prefix="kvp-vllm."))
    log(f"temp dir {tb.TMP}")
    DAEMONS.update(tb.start_trio(tb.TMP))


tearDownModule = tb.teardown_started


class Pair:
    """A prefill and a decode instance (TP ``tp``), their KV caches, closed after the case."""

    def __init__(self, tc: unittest.TestCase, p_blocks: int = 64, d_blocks: int = 96, tp: int = 1,
                 decode_node: str = "decode0", p_extra: Optional[Dict[str, Any]] = None,
                 d_extra: Optional[Dict[str, Any]] = None, groups: int = 1, **kv: Any) -> None:
        self.pkv = [vh.HostKV(num_blocks=p_blocks, **kv) for _ in range(tp)]
        self.dkv = [vh.HostKV(num_blocks=d_blocks, **kv) for _ in range(tp)]
        tc.addCleanup(self.close)
        self.pe: Optional[vh.Engine] = None
        self.de: Optional[vh.Engine] = None
        self.pe = vh.Engine("kv_both", [sock("prefill0")] * tp, [k.tensors for k in self.pkv], p_blocks,
                            extra=p_extra, groups=groups)
        self.de = vh.Engine("kv_both", [sock(decode_node)] * tp, [k.tensors for k in self.dkv], d_blocks,
                            extra=d_extra, groups=groups)

    def run(self, done, timeout: float = XFER_TIMEOUT, what: str = "") -> float:
        return vh.run_until([self.pe, self.de], done, timeout, what)

    def check_blocks(self, tc: unittest.TestCase, src: Sequence[int], dst: Sequence[int], seed: int,
                     skip: Sequence[int] = ()) -> None:
        """Every decode block of the request holds the prefill block's bytes (but ``skip``), on every rank."""
        for r, (pk, dk) in enumerate(zip(self.pkv, self.dkv)):
            for s, d in zip(src, dst):
                if d in skip:
                    continue
                for p in range(len(dk.planes)):
                    want = vh.pattern(seed + r, p, s, dk.planes[p][1])
                    tc.assertEqual(pk.block(p, s), want, f"rank {r} prefill block {s} plane {p} changed")
                    tc.assertEqual(dk.block(p, d), want, f"rank {r} block {s} -> {d} plane {p} differs")

    def check_untouched(self, tc: unittest.TestCase, dst: Sequence[int]) -> None:
        for dk in self.dkv:
            for b in set(range(dk.num_blocks)) - set(dst):
                for p in range(len(dk.planes)):
                    if any(dk.block(p, b)):
                        tc.fail(f"decode block {b} (plane {p}) outside the request was written")

    def fill(self, src: Sequence[int], seed: int) -> None:
        for r, pk in enumerate(self.pkv):
            pk.fill(src, seed + r)

    def close(self) -> None:
        threads = [threading.Thread(target=e.close) for e in (self.de, self.pe) if e is not None]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in self.pkv + self.dkv:
            k.close()


_ids = iter(range(1, 1 << 30))


def rid(prefix: str = "req") -> str:
    return f"{prefix}-{next(_ids)}-{random.getrandbits(24):06x}"


class TransferTest(unittest.TestCase):
    """Requests through both instances, verified block by block."""

    def test_request_moved_block_by_block(self) -> None:
        pair = Pair(self, d_extra={"kvproxy_max_transfer_bytes": 3 * vh.HostKV().block_bytes})
        rnd = random.Random(1)
        # Runs that coalesce on both sides, runs that only one side has, and singles.
        src = [5, 6, 7, 8, 20, 21, 22, 40, 41, 13, 60, 2, 3, 33, 34, 35, 36, 50, 11, 12]
        dst = [70, 71, 72, 73, 9, 10, 30, 31, 32, 80, 81, 1, 2, 3, 4, 5, 60, 90, 91, 95]
        pair.fill(src, 7)
        r = rid()
        delay, params = pair.pe.prefill(r, src)
        self.assertTrue(delay, "the prefill side must hold the blocks")
        self.assertEqual(params["remote_request_id"], r)
        self.assertEqual(params["remote_block_counts"], [len(src)])
        self.assertTrue(params["do_remote_prefill"])
        self.assertTrue(pair.pe.sched.has_pending_push_work())
        d = rid("dec")
        req, n, is_async = pair.de.decode(d, params, dst)
        self.assertTrue(is_async)
        self.assertEqual(n, len(req.prompt_token_ids))
        secs = pair.run(lambda: d in pair.de.received and r in pair.pe.sent, what="request moved")
        log(f"{len(src)} blocks x {len(pair.pkv[0].planes)} planes moved in {secs * 1000:.1f} ms "
            f"({pair.pe.steps} prefill steps)")
        self.assertEqual(pair.de.errors, set())
        self.assertEqual(pair.de.failed, set(), "get_transfer_results named a landed request failed")
        pair.check_blocks(self, src, dst, 7)
        pair.check_untouched(self, dst)
        self.assertFalse(pair.pe.sched.has_pending_push_work())
        self.assertEqual(pair.pe.sched.scheduler.held, 0)
        st = pair.de.workers[0].worker.receiver.debug_state(d)
        self.assertEqual((st["per_xfer"], st["total"], st["how"]), (3, 7, "landed"))
        self.assertEqual(pair.pe.stats.data["transfers"], 7)
        self.assertEqual(pair.pe.stats.data["bytes"], len(src) * pair.pkv[0].block_bytes)
        self.assertEqual(pair.de.stats.data["landed"], 7)
        self.assertEqual(pair.pe.stats.data["requests_sent"], 1)
        self.assertEqual(pair.de.stats.data["requests_received"], 1)

    def test_decode_prefix_hit(self) -> None:
        """The decode side's prefix cache holds the first blocks: it allocates only
        the rest, which pair with the prefill side's last blocks."""
        pair = Pair(self)
        src = list(range(10, 22))
        dst = [40, 41, 42, 43, 44, 45, 46, 47]
        pair.fill(src, 11)
        r = rid()
        _, params = pair.pe.prefill(r, src)
        d = rid("dec")
        req, n, is_async = pair.de.decode(d, params, dst, local_hit_tokens=4 * 16)
        self.assertTrue(is_async)
        self.assertEqual(n, len(req.prompt_token_ids) - 64)
        pair.run(lambda: d in pair.de.received and r in pair.pe.sent, what="prefix-hit request")
        self.assertEqual(pair.de.errors, set())
        pair.check_blocks(self, src[4:], dst, 11)
        pair.check_untouched(self, dst)

    def test_concurrent_interleaved_requests(self) -> None:
        """Six requests in flight at once, their block ids interleaved on both sides
        (driven through get_finished, as vLLM before get_transfer_results does)."""
        pair = Pair(self, p_blocks=128, d_blocks=128,
                    d_extra={"kvproxy_max_transfer_bytes": 4 * vh.HostKV().block_bytes})
        pair.pe.transfer_results = pair.de.transfer_results = False
        k = 6
        srcs = [[1 + i + k * j for j in range(12)] for i in range(k)]
        dsts = [list(reversed([2 + (k - 1 - i) + k * j for j in range(12)])) for i in range(k)]
        for i, src in enumerate(srcs):
            pair.fill(src, 100 + i)
        prs, drs = [], []
        for i in range(k):
            r = rid()
            _, params = pair.pe.prefill(r, srcs[i])
            prs.append((r, params))
        for i, (r, params) in enumerate(prs):
            d = rid("dec")
            pair.de.decode(d, params, dsts[i])
            drs.append(d)
        pair.run(lambda: set(drs) <= pair.de.received and {r for r, _ in prs} <= pair.pe.sent,
                 what="six interleaved requests")
        self.assertEqual(pair.de.errors, set())
        for i in range(k):
            pair.check_blocks(self, srcs[i], dsts[i], 100 + i)
        pair.check_untouched(self, [b for d in dsts for b in d])
        self.assertFalse(pair.pe.sched.has_pending_push_work())

    def test_tensor_parallel_two_ranks(self) -> None:
        """TP 2 on both sides: rank r sends to rank r; a request counts as sent or
        received only once both ranks reported it (vLLM's aggregation)."""
        pair = Pair(self, tp=2)
        src, dst = [3, 4, 5, 9, 30], [7, 8, 50, 51, 52]
        pair.fill(src, 21)
        r = rid()
        _, params = pair.pe.prefill(r, src)
        self.assertEqual(params["remote_tp_size"], 2)
        d = rid("dec")
        pair.de.decode(d, params, dst)
        pair.run(lambda: d in pair.de.received and r in pair.pe.sent, what="TP 2 request")
        self.assertEqual(pair.de.errors, set())
        pair.check_blocks(self, src, dst, 21)

    def test_other_layouts(self) -> None:
        """FlashInfer's combined K/V layout and kernel blocks half the scheduler's block size."""
        for kv in ({"layout": "flashinfer"}, {"layout": "flash", "kernel_block": 8}, {"layout": "mla"}):
            with self.subTest(**kv):
                pair = Pair(self, **kv)
                src, dst = [1, 2, 3, 17], [5, 6, 7, 9]
                pair.fill(src, 31)
                r = rid()
                _, params = pair.pe.prefill(r, src)
                d = rid("dec")
                pair.de.decode(d, params, dst)
                pair.run(lambda: d in pair.de.received and r in pair.pe.sent, what=f"{kv} request")
                self.assertEqual(pair.de.errors, set())
                pair.check_blocks(self, src, dst, 31)
                pair.check_untouched(self, dst)


class FailureTest(unittest.TestCase):
    """Every failure ends the request on both sides, typed, within bounded time."""

    def test_decode_never_registers_lease(self) -> None:
        """No decode side comes: the lease releases the prefill side's blocks; a
        decode side that registers late learns at once that nothing will come."""
        pair = Pair(self, p_extra={"kvproxy_lease_s": 1.0})
        src, dst = [4, 5, 6], [10, 11, 12]
        r = rid()
        t0 = time.monotonic()
        delay, params = pair.pe.prefill(r, src)
        self.assertTrue(delay)
        vh.run_until([pair.pe], lambda: r in pair.pe.sent, 10.0, "lease expiry")
        held = time.monotonic() - t0
        log(f"prefill blocks released by the lease after {held:.2f} s (lease 1.0 s)")
        self.assertGreaterEqual(held, 1.0)
        self.assertLess(held, 3.0)
        self.assertFalse(pair.pe.sched.has_pending_push_work())
        self.assertEqual(pair.pe.stats.data["lease_expired"], 1)
        d = rid("dec")
        pair.de.decode(d, params, dst)
        secs = pair.run(lambda: d in pair.de.received, 10.0, "late decode")
        self.assertEqual(pair.de.errors, set(dst))
        self.assertLess(secs, 3.0, "the late decode side waited for its deadline instead of the prefill's answer")

    def test_peer_by_address(self) -> None:
        """decode1 is not a peer of prefill0, but the decode side sends its
        kvproxyd's address with its registration: prefill0's kvproxyd dials it
        on demand and every block lands as sent."""
        pair = Pair(self, decode_node="decode1")
        src, dst = [3, 4, 9, 10, 11], [20, 21, 5, 6, 7]
        pair.fill(src, 23)
        r = rid()
        _, params = pair.pe.prefill(r, src)
        d = rid("dec")
        pair.de.decode(d, params, dst)
        pair.run(lambda: d in pair.de.received and r in pair.pe.sent, what="peer by address")
        self.assertEqual(pair.de.errors, set())
        pair.check_blocks(self, src, dst, 23)
        peers = DAEMONS["prefill0"].admin_call("peers")["peers"]
        self.assertIn(("decode1", "on_demand"), [(p["node_id"], p["origin"]) for p in peers])
        # Gone again, for the cases where prefill0 must not know decode1.
        DAEMONS["prefill0"].admin_call("peer_remove", params={"node_id": "decode1"})

    def test_peer_unknown(self) -> None:
        """The decode side's kvproxyd is not a peer of the prefill side's and the
        decode side sends no address to dial it by: load errors for every
        block, and the prefill side releases at once."""
        pair = Pair(self, decode_node="decode1", d_extra={"kvproxy_addr": "none"})
        src, dst = [1, 2, 3, 4], [5, 6, 7, 8]
        r = rid()
        _, params = pair.pe.prefill(r, src)
        d = rid("dec")
        pair.de.decode(d, params, dst)
        secs = pair.run(lambda: d in pair.de.received and r in pair.pe.sent, 10.0, "peer unknown")
        self.assertEqual(pair.de.errors, set(dst))
        self.assertLess(secs, 3.0)
        self.assertEqual(pair.pe.stats.data["failed"].get("peer-unknown"), 1)

    def test_transfer_failure_exact_blocks(self) -> None:
        """A decode region that disappears under a request: the transfers into it
        fail (kvproxy status remote), the decode side reports those blocks."""
        pair = Pair(self, d_extra={"kvproxy_max_transfer_bytes": 2 * vh.HostKV().block_bytes})
        src, dst = [1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 15, 16]
        pair.fill(src, 41)
        r = rid()
        _, params = pair.pe.prefill(r, src)
        dw = pair.de.workers[0].worker
        # Point plane 3 of the registration at a region key that does not exist.
        real = dw.src_regions[3]
        dw.src_regions[3] = (real[0] ^ 0x5A5A5A5A00000000, real[1])
        d = rid("dec")
        try:
            pair.de.decode(d, params, dst)
            pair.run(lambda: d in pair.de.received and r in pair.pe.sent, 15.0, "failing transfers")
        finally:
            dw.src_regions[3] = real
        self.assertEqual(pair.de.errors, set(dst), "every transfer carries plane 3")
        # One KV-cache group: the block ids, not the request (vLLM then keeps what landed).
        self.assertEqual(pair.de.failed, set(), "get_transfer_results named a one-group receive failed")
        self.assertEqual(pair.de.workers[0].worker.receiver.debug_state(d)["how"], "final")
        self.assertEqual(pair.de.stats.data["fences"], 1)
        failed = pair.pe.stats.data["failed"]
        self.assertEqual(sum(v for k, v in failed.items() if k not in ("submit",)), 3, failed)

    def test_transfer_failure_two_groups(self) -> None:
        """A model of two KV-cache groups: a receive that lands whole is not named
        failed; one whose transfers fail is named in failed_recving and reports no
        block ids (vLLM refuses block-level load errors for several groups: a
        RuntimeError that would stop the engine)."""
        pair = Pair(self, groups=2, d_extra={"kvproxy_max_transfer_bytes": 2 * vh.HostKV().block_bytes})
        src, dst = [[1, 2, 3], [4, 5, 6]], [[11, 12, 13], [14, 15, 16]]
        pair.fill([b for g in src for b in g], 43)
        r, d = rid(), rid("dec")
        _, params = pair.pe.prefill(r, src)
        pair.de.decode(d, params, dst)
        pair.run(lambda: d in pair.de.received and r in pair.pe.sent, 15.0, "two groups")
        self.assertEqual((pair.de.errors, pair.de.failed), (set(), set()), "a whole two-group receive failed")
        dw = pair.de.workers[0].worker
        real = dw.src_regions[3]
        dw.src_regions[3] = (real[0] ^ 0x5A5A5A5A00000000, real[1])
        r, d = rid(), rid("dec")
        try:
            _, params = pair.pe.prefill(r, src)
            pair.de.decode(d, params, dst)
            pair.run(lambda: d in pair.de.received and r in pair.pe.sent, 15.0, "failing transfers, two groups")
        finally:
            dw.src_regions[3] = real
        self.assertEqual(pair.de.failed, {d}, "get_transfer_results did not name the failed receive")
        self.assertEqual(pair.de.errors, set(), "block-level load errors reported for a two-group model")
        self.assertGreater(pair.de.stats.data["load_error_blocks"], 0)

    def test_decode_abort(self) -> None:
        """vLLM aborts a waiting decode request: before the workers saw it, and
        after it registered. Both end received (vLLM frees the blocks then), with
        no load errors, and the prefill side releases its blocks (not the lease)."""
        pair = Pair(self)
        for when in ("before", "after"):
            with self.subTest(when=when):
                src, dst = [1, 2, 3], [4, 5, 6]
                r = rid()
                _, params = pair.pe.prefill(r, src)
                d = rid("dec")
                req, _, _ = pair.de.decode(d, params, dst)
                if when == "after":
                    pair.de.step()
                self.assertEqual(pair.de.abort(req, dst), (False, None))
                secs = pair.run(lambda: d in pair.de.received and r in pair.pe.sent, 10.0, f"abort {when}")
                self.assertEqual(pair.de.errors, set())
                self.assertLess(secs, 5.0)
                st = pair.de.workers[0].worker.receiver.debug_state(d)
                self.assertTrue(st["give_up"])
                log(f"abort {when} registration: ended '{st['how']}' after {secs * 1000:.0f} ms")
        self.assertFalse(pair.pe.sched.has_pending_push_work())

    def test_tp_mismatch_refused_per_request(self) -> None:
        """A prefill instance whose TP size and the decode side's do not divide
        one another (3 and 2): the decode side prefills locally (no async load)
        and releases every prefill rank's blocks."""
        pkv = [vh.HostKV() for _ in range(3)]
        dkv = [vh.HostKV() for _ in range(2)]
        self.addCleanup(lambda: [k.close() for k in pkv + dkv])
        pe = vh.Engine("kv_both", [sock("prefill0")] * 3, [k.tensors for k in pkv], 64)
        self.addCleanup(pe.close)
        de = vh.Engine("kv_both", [sock("decode0")] * 2, [k.tensors for k in dkv], 64)
        self.addCleanup(de.close)
        r = rid()
        _, params = pe.prefill(r, [1, 2])
        d = rid("dec")
        _, n, is_async = de.decode(d, params, [3, 4])
        self.assertEqual((n, is_async), (0, False))
        secs = vh.run_until([pe, de], lambda: r in pe.sent, 10.0, "release after TP mismatch")
        self.assertLess(secs, 3.0, "released by the lease, not by the decode side")
        self.assertEqual(pe.stats.data["lease_expired"], 0)

    def test_prefill_killed_mid_transfer(self) -> None:
        """The prefill instance dies with transfers in flight: the decode side
        reports load errors for exactly the blocks of the transfers that did not
        land, within timeouts.peer_ms (it fences the request once the prefill's
        mailbox is gone), and every other block holds the prefill's bytes."""
        self._kill_prefill(fence=True)

    def test_prefill_killed_no_fence(self) -> None:
        """The same where kvproxyd sets no fence (fence table full): the request
        ends at its deadline (registration + submit window + transfer deadline +
        peer timeout + 1 s), the same blocks reported."""
        self._kill_prefill(fence=False)

    def _kill_prefill(self, fence: bool) -> None:
        window, xfer, peer = 2.0, 3.0, 1.0
        dkv = vh.HostKV(num_blocks=256)
        self.addCleanup(dkv.close)
        de = vh.Engine("kv_both", [sock("decode0")], [dkv.tensors], 256,
                       extra={"kvproxy_max_transfer_bytes": dkv.block_bytes, "kvproxy_submit_window_s": window,
                              "kvproxy_transfer_timeout_s": xfer, "kvproxy_peer_timeout_s": peer})
        self.addCleanup(de.close)
        client = de.workers[0].worker.client
        if not fence:
            def no_fence(*_a: Any, **_k: Any) -> None:
                raise kvproxy.KvproxyError(105, "fence", detail="fence table full (test)")
            client.fence = no_fence
        nblk = 200
        src = list(range(1, nblk + 1))
        dst = list(range(255, 255 - nblk, -1))
        spec = {"sock": sock("prefill0"), "blocks": src, "seed": 51, "rid": rid(), "num_blocks": 256,
                "extra": {"kvproxy_max_inflight": 1}}
        # This process's environment: under ASan it preloads the runtime the
        # child's libkvproxy needs.
        child = subprocess.Popen([sys.executable, __file__, "--prefill-child", json.dumps(spec)],
                                 stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(HERE.parent)),
                                 preexec_fn=tb.die_with_parent)
        self.addCleanup(lambda: child.poll() is None and (child.kill(), child.wait()))
        ready, _, _ = select.select([child.stdout], [], [], 30)
        line = child.stdout.readline() if ready else b""
        self.assertTrue(line, f"the prefill child printed no kv_transfer_params (exit status {child.poll()})")
        params = json.loads(line)
        d = rid("dec")
        t_reg = time.monotonic()
        de.decode(d, params, dst)
        rx = de.workers[0].worker.receiver
        vh.run_until([de], lambda: len((rx.debug_state(d) or {}).get("landed", ())) >= 1, 20.0, "first landing")
        child.send_signal(signal.SIGKILL)
        child.wait()
        t_kill = time.monotonic()
        st = rx.debug_state(d)
        log(f"killed the prefill instance after {len(st['landed'])} of {st['total']} transfers landed")
        vh.run_until([de], lambda: d in de.received, 30.0, "decode side after the prefill died")
        waited = time.monotonic() - t_kill
        end = rx.debug_state(d)
        log(f"decode reported {len(de.errors)} of {nblk} blocks as load errors {waited:.2f} s after the kill "
            f"({end['how']})")
        if fence:
            # The prefill's mailbox is gone with it: the decode side fences
            # the request; the fence holds within the daemons' timeouts.peer_ms.
            self.assertEqual(end["how"], "prefill-gone")
            self.assertLess(waited, peer + 2.0)
            self.assertEqual(de.stats.data["fences"], 1)
        else:
            self.assertEqual(end["how"], "deadline")
            self.assertLess(time.monotonic() - t_reg, window + xfer + peer + 1.0 + 1.5)
            self.assertGreaterEqual(time.monotonic() - t_reg, window + xfer + peer + 1.0 - 0.1)
        landed = set(end["landed"])
        self.assertTrue(0 < len(landed) < end["total"], f"not a partial transfer: {len(landed)} of {end['total']}")
        want_errors = {dst[n] for n in range(end["total"]) if n not in landed}  # per_xfer == 1
        self.assertEqual(end["per_xfer"], 1)
        self.assertEqual(de.errors, want_errors)
        for n in landed:
            for p in range(len(dkv.planes)):
                self.assertEqual(dkv.block(p, dst[n]), vh.pattern(51, p, src[n], dkv.planes[p][1]),
                                 f"landed block {src[n]} -> {dst[n]} plane {p} differs")


class SchedulerOverheadTest(unittest.TestCase):
    """Per-request cost of the scheduler-side calls (no daemon involved), printed
    beside a connector whose methods do nothing, timed in the same run."""

    N = 1000
    BLOCKS = 64  # a 1k-token prompt

    def test_overhead(self) -> None:
        class Null:
            def get_num_new_matched_tokens(self, r, n):
                return 0, False

            def update_state_after_alloc(self, r, b, n):
                return None

            def request_finished_all_groups(self, r, b):
                return False, None

            def build_connector_meta(self, so):
                return None

            def update_connector_output(self, o):
                return None

        cfg = vh.make_vllm_config("kv_both", "/x.sock")
        kvcc = vh.make_kv_cache_config(4096, ["l0"])
        conn = KvproxyConnector(cfg, vh.Role.SCHEDULER, kvcc)
        self.addCleanup(conn.shutdown)
        so = SimpleNamespace(finished_req_ids=set())
        blocks = [list(range(1 + i, 1 + i + self.BLOCKS)) for i in range(self.N)]

        def prefill_side(c) -> float:
            reqs = [vh.Request(f"p{i}", self.BLOCKS * 16, {"do_remote_decode": True}) for i in range(self.N)]
            outs = [SimpleNamespace(finished_sending={f"p{i}"}, finished_recving=None) for i in range(self.N)]
            t0 = time.perf_counter()
            for i, r in enumerate(reqs):
                c.get_num_new_matched_tokens(r, 0)
                c.update_state_after_alloc(r, vh.Blocks([blocks[i]]), 0)
                r.status = vh.RequestStatus.FINISHED_LENGTH_CAPPED
                r.num_computed_tokens = self.BLOCKS * 16
                c.request_finished_all_groups(r, (blocks[i],))
                c.build_connector_meta(so)
                c.update_connector_output(outs[i])
            return (time.perf_counter() - t0) / self.N * 1e6, reqs

        def decode_side(c, params) -> float:
            reqs = [vh.Request(f"d{i}", self.BLOCKS * 16, dict(params[i])) for i in range(self.N)]
            outs = [SimpleNamespace(finished_sending=None, finished_recving={f"d{i}"}) for i in range(self.N)]
            t0 = time.perf_counter()
            for i, r in enumerate(reqs):
                n, _ = c.get_num_new_matched_tokens(r, 0)
                c.update_state_after_alloc(r, vh.Blocks([blocks[i]]), n)
                c.build_connector_meta(so)
                c.update_connector_output(outs[i])
            return (time.perf_counter() - t0) / self.N * 1e6

        best = {}
        for _ in range(3):
            p_us, _ = prefill_side(conn)
            reqs = [vh.Request(f"q{i}", self.BLOCKS * 16, {"do_remote_decode": True}) for i in range(self.N)]
            params = []
            for i, r in enumerate(reqs):
                r.status = vh.RequestStatus.FINISHED_LENGTH_CAPPED
                params.append(conn.request_finished_all_groups(r, (blocks[i],))[1])
            conn.update_connector_output(SimpleNamespace(finished_sending={r.request_id for r in reqs}))
            conn.build_connector_meta(so)
            d_us = decode_side(conn, params)
            n_p, _ = prefill_side(Null())
            n_d = decode_side(Null(), params)
            for k, v in (("prefill", p_us), ("decode", d_us), ("null_prefill", n_p), ("null_decode", n_d)):
                best[k] = min(best.get(k, 1e9), v)
        self.assertEqual(conn.scheduler.held, 0)
        print(f"scheduler-side calls, {self.N} requests of {self.BLOCKS} blocks (best of 3): "
              f"prefill {best['prefill']:.1f} us/request, decode {best['decode']:.1f} us/request; "
              f"the same calls on a do-nothing connector: {best['null_prefill']:.1f} / {best['null_decode']:.1f} us",
              file=sys.stderr, flush=True)
        self.assertLess(best["prefill"], 1000)
        self.assertLess(best["decode"], 1000)


def prefill_child(spec: Dict[str, Any]) -> int:
    """The prefill instance of test_prefill_killed_mid_transfer: prints its
    kv_transfer_params, then steps until it is killed."""
    kv = vh.HostKV(num_blocks=spec["num_blocks"])
    kv.fill(spec["blocks"], spec["seed"])
    eng = vh.Engine("kv_producer", [spec["sock"]], [kv.tensors], spec["num_blocks"], extra=spec["extra"])
    _, params = eng.prefill(spec["rid"], spec["blocks"])
    print(json.dumps(params), flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the parent kills us long before
        eng.step()
        time.sleep(0.001)
    return 1


class StartRefusalTest(unittest.TestCase):
    """What the connector cannot move is refused at start, with the reason."""

    def make(self, role=vh.Role.SCHEDULER, spec=None, extra=None, **parallel):
        cfg = vh.make_vllm_config("kv_both", "/nonexistent.sock", extra=extra, **parallel)
        return KvproxyConnector(cfg, role, vh.make_kv_cache_config(64, ["l0"], spec))

    def test_refusals(self) -> None:
        cases = [
            ({"pipeline_parallel_size": 2}, "pipeline parallelism"),
            ({"decode_context_parallel_size": 2}, "decode_context_parallel_size"),
        ]
        for parallel, why in cases:
            with self.assertRaisesRegex(NotImplementedError, why):
                self.make(**parallel)
        with self.assertRaisesRegex(NotImplementedError, "SlidingWindowSpec"):
            self.make(spec=vh.SlidingWindowSpec())
        with self.assertRaisesRegex(NotImplementedError, "SlidingWindowSpec"):
            self.make(role=vh.Role.WORKER, spec=vh.SlidingWindowSpec())
        with self.assertRaisesRegex(ValueError, "unknown kvproxy settings"):
            self.make(extra={"kvproxy_leese_s": 3})
        cfg = vh.make_vllm_config("kv_both", "/x.sock")
        cfg.kv_transfer_config.kv_buffer_device = "cpu"
        with self.assertRaisesRegex(NotImplementedError, "kv_buffer_device"):
            KvproxyConnector(cfg, vh.Role.WORKER, vh.make_kv_cache_config(64, ["l0"]))

    def test_worker_without_daemon(self) -> None:
        kv = vh.HostKV()
        self.addCleanup(kv.close)
        w = self.make(role=vh.Role.WORKER, extra={"kvproxy_socket": str(tb.TMP / "none.sock")})
        w.worker.groups = [list(kv.tensors)]
        with self.assertRaises(kvproxy.ConnectError):
            w.register_kv_caches(kv.tensors)


class LayoutTest(unittest.TestCase):
    """vLLM's tensor layouts as planes (no daemon)."""

    def planes(self, shape, strides=None, nb=10, bs=16, es=2):
        return kl.planes_of_tensor("l", vh.FakeTensor(1 << 20, shape, es, strides), nb, bs)

    def test_layouts(self) -> None:
        fa = self.planes((2, 10, 16, 4, 8))
        self.assertEqual([(p.ptr - (1 << 20), p.stride, p.blocks) for p in fa],
                         [(0, 16 * 4 * 8 * 2, 10), (10 * 16 * 4 * 8 * 2, 16 * 4 * 8 * 2, 10)])
        fi = self.planes((10, 2, 16, 4, 8))
        self.assertEqual([(p.ptr - (1 << 20), p.stride) for p in fi], [(0, 2 * 16 * 4 * 8 * 2)])
        mla = self.planes((10, 16, 576))
        self.assertEqual([p.stride for p in mla], [16 * 576 * 2])
        # Kernel blocks of 4 tokens: 40 of them make the 10 logical blocks of 16.
        kb = self.planes((2, 40, 4, 4, 8))
        self.assertEqual([p.stride for p in kb], [4 * 4 * 4 * 8 * 2] * 2)
        # HND: the same dims, heads before tokens in memory.
        hnd = self.planes((2, 10, 16, 4, 8), strides=(10 * 512, 512, 8, 128, 1))
        self.assertEqual([p.stride for p in hnd], [1024, 1024])
        self.assertNotEqual(hnd[0].sig, fa[0].sig, "NHD and HND blocks hold different bytes")

    def test_refused(self) -> None:
        with self.assertRaisesRegex(kl.LayoutError, "not dense"):
            self.planes((2, 10, 16, 4, 8), strides=(10 * 1024, 1024, 64, 16, 1))
        with self.assertRaisesRegex(kl.LayoutError, "no dimension"):
            self.planes((2, 7, 16, 4, 8))
        with self.assertRaisesRegex(kl.LayoutError, "cannot tell"):
            self.planes((2, 2, 16, 4, 8), nb=2)

    def test_pairs_and_plan(self) -> None:
        self.assertEqual(kl.pair_blocks([[1, 2, 3, 4]], [[8, 9]]), [[(3, 8), (4, 9)]])
        with self.assertRaises(kl.LayoutError):
            kl.pair_blocks([[1]], [[1, 2]])
        lay = kl.build_layout({"a": vh.FakeTensor(0, (2, 10, 16, 1, 1), 1)}, [["a"]], 10, 16)
        self.assertEqual(len(lay.planes), 2)
        pairs = [[(1, 5), (2, 6), (3, 7), (7, 8), (8, 9)]]
        plan = kl.plan_transfers(lay, pairs, 4, [(100, 0), (101, 1000)], [(200, 0), (201, 2000)])
        self.assertEqual(plan, [
            [(100, 16, 200, 80, 48), (101, 1016, 201, 2080, 48), (100, 112, 200, 128, 16), (101, 1112, 201, 2128, 16)],
            [(100, 128, 200, 144, 16), (101, 1128, 201, 2144, 16)],
        ])
        self.assertEqual(kl.positions_to_blocks([[1, 2], [3, 4, 5]], 1, 4), [2, 3, 4])
        self.assertEqual(kl.blocks_per_transfer(lay, 1024, 64), 2)


class ConfigStatsTest(unittest.TestCase):
    def test_config(self) -> None:
        c = KvproxyVllmConfig.from_sources({"kvproxy_socket": "/run/kvp{rank}.sock", "kvproxy_lease_s": "5"},
                                           env={"KVPROXY_MAX_INFLIGHT": "4"})
        self.assertEqual((c.lease_s, c.max_inflight), (5.0, 4))
        self.assertEqual(c.socket_for(3, 0, 0, 1), "/run/kvp3.sock")
        self.assertEqual((c.sq_entries, c.cq_entries), (0, 0))  # the daemon's own sizes
        self.assertEqual(KvproxyVllmConfig.from_sources({"kvproxy_sq_entries": 2048}, env={}).sq_entries, 2048)
        for bad in ({"kvproxy_lease_s": 0}, {"kvproxy_max_inflight": "x"}, {"kvproxy_bootstrap_port": 70000},
                    {"kvproxy_max_segments": 1.5}, {"kvproxy_sq_entries": 1000}, {"kvproxy_cq_entries": -4}):
            with self.assertRaises(ValueError):
                KvproxyVllmConfig.from_sources(bad, env={})
        with self.assertRaisesRegex(ValueError, "placeholders"):
            KvproxyVllmConfig.from_sources({"kvproxy_socket": "/x{gpu}"}, env={}).socket_for(0, 0, 0, 0)
        with self.assertRaisesRegex(ValueError, "KVPROXY_SOCKET"):
            KvproxyVllmConfig.from_sources({}, env={}).socket_for(0, 0, 0, 0)

    def test_stats(self) -> None:
        a = KvproxyConnectorStats()
        self.assertTrue(a.is_empty())
        a.record_done(True, "ok", 1000, 0.002)
        a.record_done(False, "timeout", 0, 0)
        b = KvproxyConnectorStats({"transfers": 2, "bytes": 3000, "failed": {"timeout": 1, "peer": 2},
                                   "xfer_s": [0.001, 0.003]})
        a.aggregate(b)
        self.assertEqual((a.data["transfers"], a.data["bytes"]), (3, 4000))
        self.assertEqual(a.data["failed"], {"timeout": 2, "peer": 2})
        red = a.reduce()
        self.assertEqual(red["Num failed transfers"], 4)
        self.assertAlmostEqual(red["Avg xfer time (ms)"], 2.0)
        copy = a.clone_and_reset()
        self.assertTrue(a.is_empty())
        self.assertFalse(copy.is_empty())
        self.assertEqual(KvproxyConnector.build_kv_connector_stats(copy.data).data["transfers"], 3)

        class Metric:
            made: List["Metric"] = []

            def __init__(self, name, documentation, labelnames, buckets=None):
                self.name, self.labelnames, self.values = name, labelnames, {}
                Metric.made.append(self)

            def labels(self, *vals):
                m = self

                class Child:
                    def inc(self, v=1):
                        m.values[vals] = m.values.get(vals, 0) + v

                    def observe(self, v):
                        m.values.setdefault(vals, []).append(v)
                return Child()

        Counter = type("Counter", (Metric,), {})
        Histogram = type("Histogram", (Metric,), {})
        Gauge = type("Gauge", (Metric,), {})
        prom = KvproxyConnector.build_prom_metrics(vh.make_vllm_config("kv_both", "/x"),
                                                   {Counter: Counter, Histogram: Histogram, Gauge: Gauge},
                                                   ["model_name", "engine"], {0: ["m", "0"]})
        self.assertIsInstance(prom, KvproxyPromMetrics)
        prom.observe(copy.data, 0)
        by = {m.name: m.values for m in Metric.made}
        self.assertEqual(by["vllm:kvproxy_transfers"], {("m", "0"): 3})
        self.assertEqual(by["vllm:kvproxy_failed_transfers"][("m", "0", "peer")], 2)
        self.assertEqual(len(by["vllm:kvproxy_transfer_time_seconds"][("m", "0")]), 3)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--prefill-child":
        return prefill_child(json.loads(sys.argv[2]))
    tb.require_daemon_and_library()
    if not hasattr(random.Random, "randbytes"):
        tb.skip_all("Python >= 3.9 needed (random.randbytes)")
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for case in (LayoutTest, ConfigStatsTest, StartRefusalTest, SchedulerOverheadTest, TransferTest, FailureTest):
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
