#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""kvproxy.sglang.layout without a daemon: which bytes go where.

Every plan is checked against a model of the global cache computed here,
independently of the adapter (sglang_model.heads_of: sglang's split of KV
heads, with replication when heads < TP): for every pair of attention-TP
sizes in {1, 2, 4, 8, 16} and 1 to 16 KV heads, each decode rank's every
head position receives exactly the global head it holds, from one prefill
rank, and the sources' plans tile its buffers (check_coverage). The same for
Mamba-style state (dims and GDN-like sub-blocks resliced), MLA replicas,
pipeline stages (decode PP 1 or equal), refusals (non-dividing TP sizes,
MLA against MHA, a same-TP-only state type), and how head slices become
strided segments and transfers. Exit status: 0 pass, 1 fail.
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from sglang_model import heads_of, pp_layers  # noqa: E402

from kvproxy.sglang import layout as L  # noqa: E402

HB = 32  # bytes per head and token
PAGE = 4


def ann(tp: int, rank: int, heads: int, layers: Tuple[int, int] = (0, 2), pp: Tuple[int, int] = (1, 0),
        mla: bool = False, states: Optional[List[Dict[str, Any]]] = None, give_heads: bool = True) -> Dict[str, Any]:
    local = 1 if mla else len(heads_of(heads, tp, rank))
    n = layers[1] - layers[0]
    item = PAGE * (64 if mla else local * HB)
    return {"attn_tp_size": tp, "attn_tp_rank": rank, "pp_size": pp[0], "pp_rank": pp[1], "page_size": PAGE,
            "kv_cache_dtype": "auto", "is_mla": mla, "layers": list(layers), "kv_item_lens": [item] * (n * (1 if mla else 2)),
            "kv_layer_ids": [], "total_kv_heads": None if mla or not give_heads else heads,
            "local_kv_heads": None if mla or not give_heads else local, "aux_item_lens": [64, 192],
            "states": states or []}


def sources(ptp: int, dtp: int, d: int) -> List[int]:
    return [d // (dtp // ptp)] if dtp >= ptp else list(range(d * (ptp // dtp), (d + 1) * (ptp // dtp)))


class HeadsTest(unittest.TestCase):
    def test_every_head_from_the_right_rank(self) -> None:
        sizes = (1, 2, 4, 8, 16)
        cases = 0
        for heads in range(1, 17):
            for ptp in sizes:
                for dtp in sizes:
                    if (heads % ptp and ptp % heads) or (heads % dtp and dtp % heads):
                        continue  # sglang cannot shard this model so
                    for d in range(dtp):
                        dst = ann(dtp, d, heads, give_heads=d % 2 == 0)  # decode managers may not know their heads
                        dheads = heads_of(heads, dtp, d)
                        got: Dict[int, int] = {}
                        plans = []
                        for p in sources(ptp, dtp, d):
                            plan = L.build_plan(ann(ptp, p, heads), dst)
                            plans.append(plan)
                            pheads = heads_of(heads, ptp, p)
                            for pr in plan.kv:
                                # A whole page (equal TP), or one head range of each of its tokens.
                                self.assertIn(pr.blocks, (1, PAGE) if pr.whole else (PAGE,))
                                n, so, do = (len(pheads), 0, 0) if pr.blocks == 1 else (pr.length // HB, pr.src_off // HB,
                                                                                         pr.dst_off // HB)
                                for k in range(n):
                                    self.assertNotIn((pr.dst, do + k), got, f"head {do + k} written twice")
                                    got[(pr.dst, do + k)] = pheads[so + k]
                        L.check_coverage(dst, plans)
                        for b in range(4):
                            for pos, h in enumerate(dheads):
                                self.assertEqual(got.get((b, pos)), h,
                                                 f"{heads} heads, P TP{ptp} -> D TP{dtp} rank {d}, buffer {b} position {pos}")
                        cases += 1
        self.assertGreater(cases, 500)

    def test_replicas_send_once(self) -> None:
        # 2 KV heads over prefill TP 4: ranks 0 and 1 hold head 0; decode TP 2 rank 0 hears from both.
        dst = ann(2, 0, 2)
        p0, p1 = L.build_plan(ann(4, 0, 2), dst), L.build_plan(ann(4, 1, 2), dst)
        self.assertEqual(len(p0.kv), 4)
        self.assertEqual((p1.kv, p1.aux), ([], []), "the second replica sends nothing")
        self.assertTrue(p0.aux)


class MlaAndPipelineTest(unittest.TestCase):
    def test_mla_one_writer(self) -> None:
        for ptp, dtp in ((4, 2), (1, 4), (2, 2), (8, 1)):
            for d in range(dtp):
                dst = ann(dtp, d, 0, mla=True)
                plans = [L.build_plan(ann(ptp, p, 0, mla=True), dst) for p in sources(ptp, dtp, d)]
                self.assertEqual(sum(bool(pl.kv) for pl in plans), 1, (ptp, dtp, d))
                self.assertTrue(all(pr.whole for pl in plans for pr in pl.kv))
                L.check_coverage(dst, plans)

    def test_stages_cover_the_decode_layers(self) -> None:
        layers = 5
        for pps in (2, 3):
            dst = ann(4, 1, 8, layers=(0, layers))
            plans = []
            for s in range(pps):
                lay = pp_layers(layers, pps, s)
                for p in sources(2, 4, 1):
                    plans.append(L.build_plan(ann(2, p, 8, layers=lay, pp=(pps, s)), dst))
            L.check_coverage(dst, plans)
            self.assertEqual(sum(bool(pl.aux) for pl in plans), 1, "the last stage writes the aux row")
            # Without the last stage: its layers stay unwritten.
            with self.assertRaises(L.LayoutError) as cm:
                L.check_coverage(dst, plans[:-1])
            self.assertIn("written by none", str(cm.exception))

    def test_same_pipeline_on_both_sides(self) -> None:
        # Decode PP 2 = prefill PP 2: stage 1 to stage 1; sglang does not tell decode its first layer.
        src = ann(2, 0, 4, layers=(2, 4), pp=(2, 1))
        plan = L.build_plan(src, ann(2, 0, 4, layers=(0, 2), pp=(2, 1)))
        self.assertEqual([(p.src, p.dst) for p in plan.kv], [(0, 0), (1, 1), (2, 2), (3, 3)])
        with self.assertRaises(L.LayoutError):
            L.build_plan(src, ann(2, 0, 4, layers=(0, 3), pp=(2, 1)))
        with self.assertRaises(L.LayoutError):
            L.build_plan(src, ann(2, 0, 4, layers=(0, 4), pp=(3, 1)))


class StateTest(unittest.TestCase):
    def mamba(self, tp: int, groups: Optional[List[int]], dim: int = 24, rows: int = 3, unit: int = 8) -> Dict[str, Any]:
        local = dim // tp
        return {"type": "mamba", "items": [rows * local * unit] * 2, "dims": [local] * 2, "outer": [rows] * 2,
                "groups": [groups, groups], "layer_ids": [0, 1]}

    def test_mamba_resliced(self) -> None:
        unit, rows, dim = 8, 3, 24
        for groups in (None, [8, 8, 8], [12, 4, 8]):
            for ptp, dtp in ((1, 2), (2, 1), (4, 2), (2, 4), (1, 4), (2, 2)):
                if groups and any(g % ptp or g % dtp for g in groups):
                    continue
                gl = groups or [dim]

                def units(tp: int, r: int) -> List[int]:  # global unit of each local position
                    out, base = [], 0
                    for g in gl:
                        out += [base + r * (g // tp) + i for i in range(g // tp)]
                        base += g
                    return out

                for d in range(dtp):
                    dst = ann(dtp, d, 4, states=[self.mamba(dtp, groups)])
                    got: Dict[Tuple[int, int, int], int] = {}
                    plans = []
                    for p in sources(ptp, dtp, d):
                        plan = L.build_plan(ann(ptp, p, 4, states=[self.mamba(ptp, groups)]), dst)
                        plans.append(plan)
                        mine = units(ptp, p)
                        for pr in plan.states[0]:
                            self.assertEqual(pr.blocks, 1 if pr.whole else rows)
                            n, so, do = (len(mine), 0, 0) if pr.whole else (pr.length // unit, pr.src_off // unit,
                                                                             pr.dst_off // unit)
                            for r in range(rows):
                                for k in range(n):
                                    key = (pr.dst, r, do + k)
                                    self.assertNotIn(key, got)
                                    got[key] = mine[so + k]
                    L.check_coverage(dst, plans)
                    want = units(dtp, d)
                    for b in range(2):
                        for r in range(rows):
                            self.assertEqual([got[(b, r, i)] for i in range(len(want))], want,
                                             f"groups {groups} P TP{ptp} -> D TP{dtp} rank {d}")

    def test_replicated_and_refused_state(self) -> None:
        rows = {"type": "swa_ring", "items": [256, 256], "dims": [], "outer": [], "groups": [], "layer_ids": []}
        dst = ann(1, 0, 0, mla=True, states=[rows])
        plans = [L.build_plan(ann(4, p, 0, mla=True, states=[rows]), dst) for p in range(4)]
        self.assertEqual([bool(pl.states[0]) for pl in plans], [True, False, False, False])
        self.assertTrue(plans[0].exact[0], "ring rows must pair exactly")
        L.check_coverage(dst, plans)
        mm = {"type": "minimax_index_k", "items": [64], "dims": [], "outer": [], "groups": [], "layer_ids": []}
        with self.assertRaises(L.LayoutError) as cm:
            L.build_plan(ann(2, 0, 4, states=[mm]), ann(1, 0, 4, states=[mm]))
        self.assertIn("minimax_index_k", str(cm.exception))
        L.build_plan(ann(2, 1, 4, states=[mm]), ann(2, 1, 4, states=[mm]))
        with self.assertRaises(L.LayoutError) as cm:
            L.build_plan(ann(2, 0, 4, states=[rows]), ann(2, 0, 4))
        self.assertIn("state components differ", str(cm.exception))
        self.assertIsNone(L.state_kind("qsa_pending"))
        self.assertEqual(L.state_kind("nsa"), L.state_kind("dsa"))


class RefusalTest(unittest.TestCase):
    def test_refusals(self) -> None:
        for src, dst, words in ((ann(3, 0, 6), ann(2, 0, 6), "divide"),
                                (ann(2, 0, 4, mla=True), ann(2, 0, 4), "MLA"),
                                (ann(2, 0, 4), dict(ann(2, 0, 4), page_size=8), "page size"),
                                (ann(2, 0, 4), dict(ann(2, 0, 4), kv_item_lens=[999] * 4), "999"),
                                (ann(2, 0, 4, give_heads=False), ann(4, 0, 4, give_heads=False), "KV heads"),
                                (ann(2, 1, 4), ann(4, 0, 4), "does not serve")):
            with self.assertRaises(L.LayoutError, msg=words) as cm:
                L.build_plan(src, dst)
            self.assertIn(words, str(cm.exception))


class SegmentsTest(unittest.TestCase):
    def test_head_slice_is_one_strided_segment_per_run(self) -> None:
        plan = L.build_plan(ann(1, 0, 4), ann(2, 1, 4))  # decode rank 1 takes heads 2, 3 of 4
        pr = plan.kv[0]
        self.assertEqual((pr.blocks, pr.src_off, pr.dst_off, pr.length), (PAGE, 2 * HB, 0, 2 * HB))
        segs = L.segments([pr], [(7, 1000, 1 << 20)], [(9, 50, 1 << 20)], [(3, 10, 5), (20, 0, 1)], "KV")
        self.assertEqual(segs, [(7, 1000 + 3 * pr.src_item + 2 * HB, 9, 50 + 10 * pr.dst_item, 2 * HB, 5 * PAGE, 4 * HB, 2 * HB),
                                (7, 1000 + 20 * pr.src_item + 2 * HB, 9, 50, 2 * HB, PAGE, 4 * HB, 2 * HB)])
        whole = L.segments(L.build_plan(ann(2, 0, 4), ann(2, 0, 4)).kv[:1], [(7, 0, 1 << 20)], [(9, 0, 1 << 20)],
                           [(0, 4, 6)], "KV")
        self.assertEqual(whole, [(7, 0, 9, 4 * 2 * HB * PAGE, 6 * 2 * HB * PAGE)], "equal TP: contiguous pages")
        with self.assertRaises(ValueError):
            L.segments([pr], [(7, 0, 100)], [(9, 0, 1 << 20)], [(0, 0, 1)], "KV")

    def test_split_strided(self) -> None:
        seg = (1, 0, 2, 0, 256, 10000, 512, 256)
        pieces = L.split([seg], 4, 1 << 20, 3000)
        flat = [s for p in pieces for s in p]
        self.assertTrue(all(len(s) == 5 or s[5] <= 3000 for s in flat), "at most max_blocks per segment")
        self.assertEqual(sum(L.seg_bytes(s) for s in flat), 256 * 10000)
        self.assertTrue(all(sum(L.seg_bytes(s) for s in p) <= 1 << 20 for p in pieces))
        pos = 0
        for s in flat:  # the cut pieces continue where the previous ended, on both sides
            self.assertEqual((s[1], s[3]), (pos * 512, pos * 256))
            pos += s[5] if len(s) == 8 else 1
        self.assertEqual(pos, 10000)


def main() -> int:
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for case in (HeadsTest, MlaAndPipelineTest, StateTest, RefusalTest, SegmentsTest):
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
