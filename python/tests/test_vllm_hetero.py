#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""kvproxy.vllm with different TP sizes on the prefill and the decode instance.

Each rank's KV cache holds its shard of one model's KV: block ``b`` of
plane ``p`` of the model has bytes for every KV head
(:func:`vllm_harness.global_block`), and a rank holds the heads vLLM gives
it (``head_range`` below, written here from vLLM's rule, not taken from the
connector). The cases move requests P TP1 -> D TP2, P TP2 -> D TP1, P TP4
-> D TP1 (replicated heads: two prefill ranks send nothing), P TP2 -> D TP4
(NHD and HND, FlashInfer, kernel blocks smaller than the scheduler's) and
MLA's replicated latent cache both ways, then check that every decode
rank's blocks hold exactly its heads of the prefill blocks, byte for byte,
that no other block was written, that each prefill rank frees its blocks
(the unneeded ones at once, not by the lease) and how many descriptors a
request took. One case kills one of two prefill ranks (a child process)
mid-transfer into one decode rank (fan-in): the decode side reports exactly
the blocks that rank's missing transfers carry, and the other rank's data
is all there.

The first cases need no daemon: the head-slice planner's segments applied
in memory (as kvproxyd would) against the model.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir. Exit status: 0 pass, 1 fail, 77 skip (with the reason).
"""

from __future__ import annotations

import ctypes
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)
import vllm_harness as vh  # noqa: E402

from kvproxy.vllm import KvproxyConnectorMetadata, tp_map  # noqa: E402
from kvproxy.vllm import layout as kl  # noqa: E402
from kvproxy.vllm.slicing import Template  # noqa: E402

DAEMONS: Dict[str, tb.Daemon] = {}
XFER_TIMEOUT = 20.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} test_vllm_hetero] {msg}", file=sys.stderr, flush=True)


def sock(node: str) -> str:
    return DAEMONS[node].sock


def head_range(rank: int, tp: int, kv_heads: int) -> Tuple[int, int]:
    """vLLM's sharding: K/T heads per rank, or one head per rank replicated when T > K."""
    if tp <= kv_heads:
        h = kv_heads // tp
        return rank * h, rank * h + h
    return rank * kv_heads // tp, rank * kv_heads // tp + 1


def setUpModule() -> None:
    tb.TMP = Path(tempfile.mkdtemp(prefix="kvp-vllm-hetero."))
    log(f"temp dir {tb.TMP}")
    p, d = tb.start_pair(tb.TMP, "prefill0", "decode0")
    DAEMONS.update({"prefill0": p, "decode0": d})


tearDownModule = tb.teardown_started


_ids = iter(range(1, 1 << 30))


def rid(prefix: str = "req") -> str:
    return f"{prefix}-{next(_ids)}-{random.getrandbits(24):06x}"


def kv_of(tp: int, rank: int, kv_heads: int, mla: bool, **kv: Any) -> vh.HostKV:
    if mla:
        return vh.HostKV(layout="mla", head_dim=64, **kv)
    lo, hi = head_range(rank, tp, kv_heads)
    return vh.HostKV(heads=hi - lo, **kv)


def fill(kvs: Sequence[vh.HostKV], blocks: Sequence[int], seed: int, kv_heads: int, mla: bool) -> None:
    for r, k in enumerate(kvs):
        if mla:
            k.fill(blocks, seed)  # replicated: the same latent cache on every rank
        else:
            k.fill_shard(blocks, seed, kv_heads, *head_range(r, len(kvs), kv_heads))


def check(tc: unittest.TestCase, dkvs: Sequence[vh.HostKV], src: Sequence[int], dst: Sequence[int], seed: int,
          kv_heads: int, mla: bool, skip: Sequence[int] = ()) -> None:
    """Every decode rank's blocks ``dst`` hold its shard of the prefill blocks ``src`` (but ``skip``),
    and no other block of it was written."""
    for d, dk in enumerate(dkvs):
        lo, hi = head_range(d, len(dkvs), kv_heads) if not mla else (0, 0)
        for s, b in zip(src, dst):
            if b in skip:
                continue
            for p, (_ptr, st) in enumerate(dk.planes):
                want = vh.pattern(seed, p, s, st) if mla else dk.shard(seed, p, s, kv_heads, lo, hi)
                if dk.block(p, b) != want:
                    tc.fail(f"decode rank {d} block {b} (prefill block {s}) plane {p}: not its heads [{lo}, {hi})")
        for b in set(range(dk.num_blocks)) - set(dst):
            for p in range(len(dk.planes)):
                if any(dk.block(p, b)):
                    tc.fail(f"decode rank {d} block {b} (plane {p}) outside the request was written")


class SliceTest(unittest.TestCase):
    """The rank mapping and the head-slice segments, applied in memory (no daemon)."""

    def test_rank_mapping(self) -> None:
        """The sources of each decode rank (vLLM's get_target_remote_ranks with
        its GQA de-duplication) and their inverse."""
        cases = {
            (1, 2, 4): [[(0, 0, 2)], [(0, 2, 4)]],
            (2, 1, 4): [[(0, 0, 2), (1, 2, 4)]],
            (2, 4, 4): [[(0, 0, 1)], [(0, 1, 2)], [(1, 2, 3)], [(1, 3, 4)]],
            (4, 1, 2): [[(0, 0, 1), (2, 1, 2)]],  # prefill replicates each head twice
            (2, 4, 1): [[(0, 0, 1)], [(0, 0, 1)], [(1, 0, 1)], [(1, 0, 1)]],
            (8, 2, 4): [[(0, 0, 1), (2, 1, 2)], [(4, 2, 3), (6, 3, 4)]],
        }
        for (p, d, k), want in cases.items():
            got = [tp_map.sources(r, p, d, k, False) for r in range(d)]
            self.assertEqual(got, want, f"P{p} D{d} K{k}")
            for pr in range(p):
                self.assertEqual(tp_map.targets(pr, p, d, k, False),
                                 [r for r in range(d) if any(s[0] == pr for s in want[r])])
        self.assertEqual([tp_map.sources(r, 2, 1, None, True) for r in range(1)], [[(0, None, None)]])
        self.assertEqual([tp_map.targets(r, 2, 1, None, True) for r in range(2)], [[0], []])
        self.assertEqual([tp_map.sources(r, 1, 2, None, True) for r in range(2)], [[(0, None, None)]] * 2)
        self.assertIn("divide", tp_map.check_tp(3, 2, 6, False))
        self.assertIn("KV heads", tp_map.check_tp(4, 2, 6, False))

    def move(self, src: vh.HostKV, dst: vh.HostKV, segs: Sequence[Tuple[int, ...]]) -> None:
        """What kvproxyd does with the segments (offsets relative to each buffer)."""
        sb, db = vh.addr_of(src.buf), vh.addr_of(dst.buf)
        for s in segs:
            _, so, _, do, ln, cnt, ss, ds = s if len(s) == 8 else (*s, 1, 0, 0)
            for i in range(cnt):
                ctypes.memmove(db + do + i * ds, sb + so + i * ss, ln)

    def test_slices_in_memory(self) -> None:
        """For each layout and TP pair, the planned segments put exactly each decode
        rank's heads into its blocks, in as many descriptors as expected."""
        k = 4
        cases = [
            # (kv options, P, D, descriptors per plane and run of blocks)
            ({"layout": "flash"}, 1, 2, 1),
            ({"layout": "flash"}, 2, 1, 1),
            ({"layout": "flash", "hnd": True}, 2, 4, 1),
            ({"layout": "flash", "hnd": True, "kernel_block": 8}, 1, 4, 1),
            ({"layout": "flashinfer"}, 2, 1, 1),
            ({"layout": "flashinfer", "hnd": True}, 1, 2, 1),
            ({"layout": "flash", "kernel_block": 4}, 4, 2, 1),
        ]
        src_blocks, dst_blocks = [3, 4, 5, 9, 20, 21], [30, 31, 7, 8, 9, 40]
        for kv, p_tp, d_tp, per_run in cases:
            with self.subTest(**kv, P=p_tp, D=d_tp):
                pk = [kv_of(p_tp, r, k, False, num_blocks=48, layers=2, **kv) for r in range(p_tp)]
                dk = [kv_of(d_tp, r, k, False, num_blocks=48, layers=2, **kv) for r in range(d_tp)]
                self.addCleanup(lambda ks=pk + dk: [x.close() for x in ks])
                fill(pk, src_blocks, 5, k, False)
                lays = {id(x): kl.build_layout(x.tensors, [list(x.tensors)], 48, 16) for x in pk + dk}
                for d in range(d_tp):
                    dl = lays[id(dk[d])]
                    dlo, dhi = head_range(d, d_tp, k)
                    for p, lo, hi in tp_map.sources(d, p_tp, d_tp, k, False):
                        pl = lays[id(pk[p])]
                        plo, phi = head_range(p, p_tp, k)
                        tmpl = [Template(a.geom, lo - plo, b.geom, lo - dlo, hi - lo)
                                for a, b in zip(pl.planes, dl.planes)]
                        self.assertEqual({t.per_block for t in tmpl}, {1})
                        sreg = [(0, a.ptr - vh.addr_of(pk[p].buf)) for a in pl.planes]
                        dreg = [(0, b.ptr - vh.addr_of(dk[d].buf)) for b in dl.planes]
                        pairs = kl.pair_blocks([src_blocks], [dst_blocks])
                        plan = kl.plan_transfers(pl, pairs, 64, sreg, dreg, tmpl, [b.stride for b in dl.planes])
                        self.assertEqual(len(plan), 1)
                        nruns = _runs(src_blocks, dst_blocks)
                        self.assertEqual(len(plan[0]), per_run * nruns * len(pl.planes), plan[0][:4])
                        self.move(pk[p], dk[d], plan[0])
                check(self, dk, src_blocks, dst_blocks, 5, k, False)

    def test_descriptor_counts(self) -> None:
        """A 64-layer GQA model (8 KV heads x 128, bf16, 16-token blocks, NHD),
        prefill TP4 -> decode TP8, a 32k-token request as the connector plans it
        (1024 segments and 32 MiB per transfer at most): descriptors with
        contiguous and with scattered blocks, against one per token and head range."""
        layers, blocks, nb = 64, 32768 // 16, 4096

        def lay(heads: int) -> kl.Layout:
            t = {f"l{i}": vh.FakeTensor((1 << 40) + (i << 32), (2, nb, 16, heads, 128)) for i in range(layers)}
            return kl.build_layout(t, [list(t)], nb, 16)

        src, dst = lay(2), lay(1)  # prefill rank 0 holds heads 0-1, decode rank 1 head 1
        tmpl = [Template(a.geom, 1, b.geom, 0, 1) for a, b in zip(src.planes, dst.planes)]
        per = kl.blocks_per_transfer(dst, 1024, 32 << 20, [t.per_block for t in tmpl])
        regions = [(1, i * nb * p.stride) for i, p in enumerate(src.planes)]
        counts = {}
        rnd = random.Random(3)
        for name, ids in (("contiguous", list(range(blocks))), ("scattered", rnd.sample(range(0, nb, 2), blocks))):
            plan = kl.plan_transfers(src, [list(zip(ids, ids))], per, regions, regions, tmpl,
                                     [p.stride for p in dst.planes])
            counts[name] = (len(plan), sum(len(x) for x in plan))
            self.assertEqual(sum(x[4] * (x[5] if len(x) == 8 else 1) for p in plan for x in p),
                             blocks * 16 * 128 * 2 * len(src.planes), "not the slice's bytes")
        planes = len(src.planes)
        self.assertEqual(per, 1024 // planes)
        self.assertEqual(counts["contiguous"], (blocks // per, blocks // per * planes))
        self.assertEqual(counts["scattered"], (blocks // per, blocks * planes))
        log(f"P TP4 -> D TP8, 32k tokens, 64 layers, {per} blocks per transfer: {counts['contiguous'][1]} "
            f"descriptors in {counts['contiguous'][0]} transfers (contiguous blocks), {counts['scattered'][1]} "
            f"(every block scattered); one per token and head range: {blocks * 16 * planes}")


def _runs(src: Sequence[int], dst: Sequence[int]) -> int:
    n = 1
    for i in range(1, len(src)):
        if not (src[i] == src[i - 1] + 1 and dst[i] == dst[i - 1] + 1):
            n += 1
    return n


class Hetero:
    """A prefill instance of TP ``p_tp`` and a decode instance of TP ``d_tp``, one
    model (``kv_heads`` KV heads, or MLA), closed after the case."""

    def __init__(self, tc: unittest.TestCase, p_tp: int, d_tp: int, kv_heads: int = 4, mla: bool = False,
                 p_blocks: int = 64, d_blocks: int = 96, p_extra: Optional[Dict[str, Any]] = None,
                 d_extra: Optional[Dict[str, Any]] = None, **kv: Any) -> None:
        self.k, self.mla = kv_heads, mla
        self.pkv = [kv_of(p_tp, r, kv_heads, mla, num_blocks=p_blocks, **kv) for r in range(p_tp)]
        self.dkv = [kv_of(d_tp, r, kv_heads, mla, num_blocks=d_blocks, **kv) for r in range(d_tp)]
        tc.addCleanup(self.close)
        self.pe: Optional[vh.Engine] = None
        self.de: Optional[vh.Engine] = None
        self.pe = vh.Engine("kv_both", [sock("prefill0")] * p_tp, [x.tensors for x in self.pkv], p_blocks,
                            extra=p_extra, kv_heads=None if mla else kv_heads, mla=mla)
        self.de = vh.Engine("kv_both", [sock("decode0")] * d_tp, [x.tensors for x in self.dkv], d_blocks,
                            extra=d_extra, kv_heads=None if mla else kv_heads, mla=mla)

    def move(self, tc: unittest.TestCase, src: Sequence[int], dst: Sequence[int], seed: int) -> Tuple[str, str]:
        assert self.pe is not None and self.de is not None
        fill(self.pkv, src, seed, self.k, self.mla)
        r = rid()
        delay, params = self.pe.prefill(r, src)
        tc.assertTrue(delay)
        tc.assertEqual(params["remote_tp_size"], len(self.pkv))
        d = rid("dec")
        _req, n, is_async = self.de.decode(d, params, dst)
        tc.assertTrue(is_async, "the decode side refused the prefill instance")
        secs = vh.run_until([self.pe, self.de], lambda: d in self.de.received and r in self.pe.sent, XFER_TIMEOUT,
                            f"P TP{len(self.pkv)} -> D TP{len(self.dkv)}")
        log(f"P TP{len(self.pkv)} -> D TP{len(self.dkv)} ({'mla' if self.mla else f'{self.k} KV heads'}): "
            f"{len(src)} blocks in {secs * 1000:.0f} ms; descriptors per prefill rank and pair: "
            f"{self.segments(r)}")
        tc.assertEqual(self.de.errors, set())
        check(tc, self.dkv, src, dst, seed, self.k, self.mla)
        tc.assertFalse(self.pe.sched.has_pending_push_work())
        tc.assertEqual(self.pe.stats.data["lease_expired"], 0)
        tc.assertEqual(self.pe.stats.data["failed"], {})
        tc.assertEqual(self.de.stats.data["load_error_blocks"], 0)
        return r, d

    def segments(self, r: str) -> List[List[int]]:
        """Per prefill rank, the descriptors of each pair it sent (empty: not needed)."""
        assert self.pe is not None
        return [[p["segments"] for p in w.worker.sender.recent.get(r, []) if p["total"]] for w in self.pe.workers]

    def close(self) -> None:
        engines = [e for e in (self.de, self.pe) if e is not None]
        threads = [threading.Thread(target=e.close) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for x in self.pkv + self.dkv:
            x.close()


# Runs consecutive on both sides, runs only one side has, and singles.
SRC = [5, 6, 7, 8, 20, 21, 22, 40, 41, 13, 60, 2, 3]
DST = [70, 71, 72, 73, 9, 10, 30, 31, 32, 80, 81, 1, 2]


class HeteroTransferTest(unittest.TestCase):
    """Requests between instances of different TP sizes, verified per decode rank."""

    def test_fan_out_p1_d2(self) -> None:
        """One prefill rank writes each of two decode ranks its half of the heads:
        one strided descriptor per plane and run of blocks."""
        h = Hetero(self, 1, 2)
        r, _d = h.move(self, SRC, DST, 11)
        planes = len(h.pkv[0].planes)
        self.assertEqual(h.segments(r), [[planes * _runs(SRC, DST)] * 2])

    def test_fan_in_p2_d1(self) -> None:
        """Two prefill ranks write different head ranges of the same decode blocks
        (NHD; FlashInfer HND with kernel blocks of 8); the decode side reports the
        request only once both ranks' transfers landed."""
        for kv in ({}, {"layout": "flashinfer", "hnd": True, "kernel_block": 8}):
            with self.subTest(**kv):
                h = Hetero(self, 2, 1, **kv)
                r, d = h.move(self, SRC, DST, 12)
                st = h.de.workers[0].worker.receiver.debug_state(d)
                # "final": a source's status came before its last landing notice.
                self.assertEqual(st["sources"], 2)
                self.assertIn(st["how"], ("landed", "final"))
                self.assertEqual(len(st["landed"]), 2 * st["total"])
                self.assertEqual(h.segments(r), [[len(h.pkv[0].planes) * _runs(SRC, DST)]] * 2)

    def test_fan_in_replicated_heads_p4_d1(self) -> None:
        """Prefill TP4 over 2 KV heads holds each head twice: ranks 0 and 2 send, ranks
        1 and 3 are told at once that nobody needs them (not by the lease)."""
        h = Hetero(self, 4, 1, kv_heads=2, p_extra={"kvproxy_lease_s": 30.0})
        r, _d = h.move(self, SRC, DST, 13)
        segs = h.segments(r)
        self.assertEqual([len(s) for s in segs], [1, 0, 1, 0])

    def test_fan_out_p2_d4(self) -> None:
        """Prefill TP2 to decode TP4: NHD and HND over 4 KV heads (one head per decode
        rank), and over 2 KV heads (decode ranks hold replicated heads: whole blocks)."""
        for k, kv in ((4, {}), (4, {"hnd": True}), (2, {"hnd": True})):
            with self.subTest(kv_heads=k, **kv):
                h = Hetero(self, 2, 4, kv_heads=k, **kv)
                r, _d = h.move(self, SRC, DST, 14)
                per = len(h.pkv[0].planes) * _runs(SRC, DST)
                self.assertEqual(h.segments(r), [[per, per], [per, per]])

    def test_mla(self) -> None:
        """MLA's latent cache is the same on every rank: one prefill rank serves each
        decode rank (P TP2 -> D TP1: rank 1 is released at once; P TP1 -> D TP2: rank 0
        writes both decode ranks)."""
        for p_tp, d_tp, want in ((2, 1, [[1], []]), (1, 2, [[1, 1]])):
            with self.subTest(P=p_tp, D=d_tp):
                h = Hetero(self, p_tp, d_tp, mla=True, p_extra={"kvproxy_lease_s": 30.0})
                r, _d = h.move(self, SRC, DST, 15)
                self.assertEqual([[1 for _ in s] for s in h.segments(r)], want)


class HeteroFailureTest(unittest.TestCase):
    def test_one_source_fails_fan_in(self) -> None:
        """P TP2 -> D TP1 where every transfer of prefill rank 1 is refused (a bad
        source region key): that source is fenced on its own and closes; rank 0's
        heads all land; every block is a load error (each lacks rank 1's heads)."""
        h = Hetero(self, 2, 1, d_extra={"kvproxy_max_transfer_bytes": 3 * vh.HostKV(heads=4).block_bytes})
        assert h.pe is not None and h.de is not None
        pw = h.pe.workers[1].worker
        real = pw.src_regions[3]
        pw.src_regions[3] = (real[0] ^ 0x5A5A5A5A00000000, real[1])
        self.addCleanup(lambda: pw.src_regions.__setitem__(3, real))
        src, dst = SRC[:7], DST[:7]
        fill(h.pkv, src, 16, 4, False)
        r = rid()
        _, params = h.pe.prefill(r, src)
        d = rid("dec")
        h.de.decode(d, params, dst)
        secs = vh.run_until([h.pe, h.de], lambda: d in h.de.received and r in h.pe.sent, 15.0, "one source fails")
        end = h.de.workers[0].worker.receiver.debug_state(d)
        log(f"one of two sources refused: ended '{end['how']}' after {secs * 1000:.0f} ms, sources {end['srcs']}")
        self.assertEqual(h.de.errors, set(dst))
        self.assertEqual(end["srcs"][1], (1, "final"))
        self.assertIn(end["srcs"][0], ((0, "landed"), (0, "final")))  # its status may beat its last landing
        self.assertEqual(h.de.stats.data["fences"], 1)
        self.assertLess(secs, 5.0)
        self.assertEqual({n for n in end["landed"] if n >> end["shift"] == 0}, set(range(end["total"])))
        self.assertEqual(sum(h.pe.stats.data["failed"].values()), end["total"], h.pe.stats.data["failed"])

    def test_decode_abort_fan_in(self) -> None:
        """vLLM aborts a waiting decode request after it registered with two prefill
        ranks: both stop and free their blocks (not by the lease), the request ends
        received once the fence holds, with no load errors."""
        h = Hetero(self, 2, 1, p_extra={"kvproxy_lease_s": 30.0})
        assert h.pe is not None and h.de is not None
        r = rid()
        _, params = h.pe.prefill(r, SRC)
        d = rid("dec")
        req, _, _ = h.de.decode(d, params, DST)
        h.de.step()
        self.assertEqual(h.de.abort(req, DST), (False, None))
        secs = vh.run_until([h.pe, h.de], lambda: d in h.de.received and r in h.pe.sent, 10.0, "abort fan-in")
        self.assertEqual(h.de.errors, set())
        self.assertLess(secs, 5.0)
        self.assertTrue(h.de.workers[0].worker.receiver.debug_state(d)["give_up"])
        self.assertEqual(h.pe.stats.data["lease_expired"], 0)

    def test_prefill_rank_killed_fan_in(self) -> None:
        """P TP2 -> D TP1; prefill rank 1 runs in a child process and is SIGKILLed
        while its transfers are in flight. Rank 0's data all lands; the decode
        side reports load errors for exactly the blocks whose rank-1 transfer did
        not land, by rank 1's deadline (the prefill scheduler, and with it the
        mailbox, lives on: nothing else tells the decode side)."""
        window, xfer, peer = 1.5, 2.0, 0.5
        nblk, k = 160, 4
        src = list(range(1, nblk + 1))
        dst = list(range(255, 255 - nblk, -1))
        pk0 = kv_of(2, 0, k, False, num_blocks=256)
        dk = kv_of(1, 0, k, False, num_blocks=256)
        self.addCleanup(lambda: [x.close() for x in (pk0, dk)])
        pk0.fill_shard(src, 21, k, *head_range(0, 2, k))
        de = vh.Engine("kv_both", [sock("decode0")], [dk.tensors], 256, kv_heads=k,
                       extra={"kvproxy_max_transfer_bytes": dk.block_bytes, "kvproxy_submit_window_s": window,
                              "kvproxy_transfer_timeout_s": xfer, "kvproxy_peer_timeout_s": peer})
        self.addCleanup(de.close)
        spec = {"sock": sock("prefill0"), "blocks": src, "seed": 21, "kv_heads": k, "num_blocks": 256,
                "extra": {"kvproxy_max_inflight": 1}}
        child = subprocess.Popen([sys.executable, __file__, "--prefill-rank-child", json.dumps(spec)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env=dict(os.environ, PYTHONPATH=str(HERE.parent)), preexec_fn=tb.die_with_parent)
        self.addCleanup(lambda: child.poll() is None and (child.kill(), child.wait()))
        ready, _, _ = select.select([child.stdout], [], [], 30)
        self.assertTrue(ready and child.stdout.readline().strip() == b"ready",
                        f"the prefill rank child did not start (exit status {child.poll()})")

        def forward(meta: Any) -> None:
            if meta.sends and child.poll() is None:
                child.stdin.write(json.dumps({"bootstrap": meta.bootstrap, "sends": meta.sends}).encode() + b"\n")
                child.stdin.flush()

        pe = vh.Engine("kv_both", [sock("prefill0")], [pk0.tensors], 256, kv_heads=k, tp=2, ranks=[0],
                       extra={"kvproxy_max_inflight": 1}, on_meta=forward)
        self.addCleanup(pe.close)
        r = rid()
        _, params = pe.prefill(r, src)
        d = rid("dec")
        t_reg = time.monotonic()
        de.decode(d, params, dst)
        rx = de.workers[0].worker.receiver

        def rank1_landed() -> int:
            st = rx.debug_state(d) or {}
            return sum(1 for n in st.get("landed", ()) if n >> st["shift"] == 1)

        vh.run_until([pe, de], lambda: rank1_landed() >= 1, 20.0, "first landing from prefill rank 1")
        child.send_signal(signal.SIGKILL)
        child.wait()
        log(f"killed prefill rank 1 after {rank1_landed()} of {nblk} of its transfers landed")
        vh.run_until([pe, de], lambda: d in de.received and r in pe.sent, 30.0, "decode side after the kill")
        waited = time.monotonic() - t_reg
        end = rx.debug_state(d)
        log(f"decode reported {len(de.errors)} of {nblk} blocks as load errors {waited:.2f} s after registering "
            f"({end['how']}, sources {end['srcs']})")
        self.assertEqual(end["per_xfer"], 1)
        self.assertEqual(end["how"], "deadline")
        self.assertLess(waited, window + xfer + peer + 1.0 + 1.5)
        shift, total = end["shift"], end["total"]
        landed = set(end["landed"])
        self.assertEqual({n for n in landed if n >> shift == 0}, set(range(total)), "prefill rank 0's data is missing")
        got1 = {n & ((1 << shift) - 1) for n in landed if n >> shift == 1}
        self.assertTrue(0 < len(got1) < total, f"not a partial transfer: {len(got1)} of {total}")
        self.assertEqual(de.errors, {dst[n] for n in range(total) if n not in got1})
        # Blocks both ranks landed hold all 4 heads; the others hold rank 0's two.
        for n in range(total):
            for p, (_ptr, st) in enumerate(dk.planes):
                have = dk.block(p, dst[n])
                want = dk.shard(21, p, src[n], k, 0, 4)
                if n in got1:
                    self.assertEqual(have, want, f"block {dst[n]} plane {p}")
                else:
                    half = dk.shard(21, p, src[n], k, 0, 2)
                    row = dk.head_dim * dk.es
                    self.assertEqual(b"".join(have[t * 4 * row:t * 4 * row + 2 * row] for t in range(16)), half,
                                     f"rank 0's heads of block {dst[n]} plane {p}")


def prefill_rank_child(spec: Dict[str, Any]) -> int:
    """Prefill rank 1 of 2 (test_prefill_rank_killed_fan_in): its worker only; the
    parent's scheduler hands it each step's sends on stdin."""
    k = spec["kv_heads"]
    kv = kv_of(2, 1, k, False, num_blocks=spec["num_blocks"])
    kv.fill_shard(spec["blocks"], spec["seed"], k, *head_range(1, 2, k))
    eng = vh.Engine("kv_both", [spec["sock"]], [kv.tensors], spec["num_blocks"], kv_heads=k, tp=2, ranks=[1],
                    scheduler=False, extra=spec["extra"])
    queued: List[Any] = []

    def next_meta() -> Any:
        meta = KvproxyConnectorMetadata()
        if queued:
            m = queued.pop(0)
            meta.bootstrap, meta.sends = m["bootstrap"], m["sends"]
        return meta

    eng.next_meta = next_meta  # type: ignore[method-assign]
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the parent kills us long before
        ready, _, _ = select.select([sys.stdin], [], [], 0.001)
        if ready:
            line = sys.stdin.readline()
            if not line:
                return 1
            queued.append(json.loads(line))
        eng.step()
    return 1


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--prefill-rank-child":
        return prefill_rank_child(json.loads(sys.argv[2]))
    tb.require_daemon_and_library()
    if not hasattr(random.Random, "randbytes"):
        tb.skip_all("Python >= 3.9 needed (random.randbytes)")
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for case in (SliceTest, HeteroTransferTest, HeteroFailureTest):
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
