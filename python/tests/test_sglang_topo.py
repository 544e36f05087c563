#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""kvproxy.sglang across the topologies the field runs, one process per rank.

Each scenario is a prefill server (its own bootstrap server) and a decode
server whose ranks are processes of their own (``sglang_harness.py rank``),
driven as sglang's schedulers drive them (MIN all-reduce of ``poll()`` per
attention group and pipeline stage). Every rank's KV cache and state hold
its shard of one global cache with known contents (sglang_model.py: layers
x tokens x KV heads x head bytes, MLA latents, SWA window pages, Mamba-style
slots), sharded as sglang shards it; after each request every decode rank's
pages and state rows equal its shard byte for byte, its aux row arrived,
and every page and row outside the request is still zero. The bytes the
prefill ranks report add up to what the decode ranks expected.

Scenarios (all at once, on one pair of kvproxyd):

* ``tp2_tp4``: MHA, 8 KV heads, prefill TP 2 -> decode TP 4 (each prefill
  rank serves two decode ranks; one strided segment per buffer and run of
  pages: the descriptor count is asserted);
* ``tp4_tp2``: GQA with 2 KV heads, prefill TP 4 (heads replicated: ranks
  0 and 1 hold head 0) -> decode TP 2 (only one replica sends);
* ``tp2pp2_tp4``: prefill TP 2 x PP 2 (layers [0, 2) and [2, 4)) -> decode
  TP 4 (2 KV heads, replicated on the decode side), the field's shape in small;
* ``mla_tp4_tp2``, ``mla_tp1_tp4``: MLA, one prefill rank writes each decode
  rank, the others reach Success sending nothing;
* ``mamba_tp1_tp2``: a hybrid model (attention layers 1, 3; Mamba-style
  layers 0, 2 with a conv state of three independently sharded sub-blocks
  and a temporal state), prefill TP 1 -> decode TP 2: KV head-sliced and
  the slots resliced;
* ``swa_tp2_tp1``: an SWA model (sliding-window layers 0, 2 in a pool of
  their own, window pages only), prefill TP 2 -> decode TP 1;
* ``pp_kill``: a prefill server of two PP stages and another prefill server
  feeding one decode rank; the second stage is killed (SIGKILL) in the
  middle of a request: the decode rank fails that request naming
  "PP stage 1", stage 0's sender ends ``aborted-by-decode``; a request on the
  other server in flight at the same time, and one after, succeed.

With KVP_TOPO_GPU=1 the caches are CUDA tensors (test_gpu_sglang_topo.py).
Environment: KVPROXYD, KVPROXY_LIB (meson sets both); KVP_KEEP=1 keeps the
temp dir. Exit status: 0 pass, 1 fail, 77 skip.
"""

from __future__ import annotations

import os
import random
import sys
import time
import unittest
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402
import test_sglang_ranks as tr  # noqa: E402

T = 90.0
GPU = os.environ.get("KVP_TOPO_GPU") == "1"
PAGE = 16

MHA8 = {"kind": "mha", "layers": 4, "heads": 8, "head_bytes": 32, "page": PAGE, "pages": 48}
GQA2 = {"kind": "mha", "layers": 4, "heads": 2, "head_bytes": 32, "page": PAGE, "pages": 48}
MLA = {"kind": "mla", "layers": 4, "latent_bytes": 64, "page": PAGE, "pages": 48}
MAMBA = {"kind": "mha", "layers": 4, "heads": 2, "head_bytes": 32, "page": PAGE, "pages": 48,
         "mamba": {"layers": [0, 2], "slots": 8,
                   "tensors": [{"dim": 24, "outer": 3, "groups": [8, 8, 8]}, {"dim": 4, "unit": 64}]}}
SWA = {"kind": "mha", "layers": 4, "heads": 4, "head_bytes": 32, "page": PAGE, "pages": 48,
       "swa": {"layers": [0, 2], "pages": 24}}

# name: (model, prefill TP, prefill PP, decode TP)
SCENARIOS = {
    "tp2_tp4": (MHA8, 2, 1, 4),
    "tp4_tp2": (GQA2, 4, 1, 2),
    "tp2pp2_tp4": (GQA2, 2, 2, 4),
    "mla_tp4_tp2": (MLA, 4, 1, 2),
    "mla_tp1_tp4": (MLA, 1, 1, 4),
    "mamba_tp1_tp2": (MAMBA, 1, 1, 2),
    "swa_tp2_tp1": (SWA, 2, 1, 1),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} test_sglang_topo] {msg}", file=sys.stderr, flush=True)


class TopoTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        t0 = time.monotonic()
        c = cls.cluster = tr.Cluster("topo")
        p = c.daemon("prefill0", [("decode0", "127.0.0.1:0")])
        d = c.daemon("decode0", [("prefill0", f"127.0.0.1:{p.port}")])
        p.conf.write_text(p.conf.read_text().replace("127.0.0.1:0", f"127.0.0.1:{d.port}"))
        for x in (p, d):  # ~40 rank processes, each a client
            x.conf.write_text(x.conf.read_text() + "limits = { max_clients = 64; };\n")
        cls.ports: Dict[str, int] = {}
        for name, (model, ptp, pps, dtp) in SCENARIOS.items():
            port = cls.ports[name] = c.bootstrap()
            common = dict(model=model, bootstrap_port=port, gpu=GPU)
            for pp in range(pps):
                for r in range(ptp):
                    c.rank(name=f"{name}/p{pp}.{r}", role="prefill", group=f"{name}/p{pp}", engine_rank=r,
                           tp_size=ptp, pp_size=pps, pp_rank=pp, socket=p.sock, **common)
            for r in range(dtp):
                c.rank(name=f"{name}/d{r}", role="decode", group=f"{name}/d", engine_rank=r, tp_size=dtp,
                       socket=d.sock, **common)
        # pp_kill: server "k" of 2 PP stages and server "o", one decode rank for both.
        cls.ports["k"], cls.ports["o"] = c.bootstrap(), c.bootstrap()
        for pp in range(2):
            c.rank(name=f"k/p{pp}", role="prefill", group=f"k/p{pp}", engine_rank=0, tp_size=1, pp_size=2,
                   pp_rank=pp, socket=p.sock, model=GQA2, bootstrap_port=cls.ports["k"], gpu=GPU)
        c.rank(name="o/p", role="prefill", group="o/p", engine_rank=0, tp_size=1, socket=p.sock, model=GQA2,
               bootstrap_port=cls.ports["o"], gpu=GPU)
        c.rank(name="k/d", role="decode", group="k/d", engine_rank=0, tp_size=1, socket=d.sock, model=GQA2,
               bootstrap_port=cls.ports["k"], gpu=GPU)
        cls.coord = c.start()
        log(f"{len(c.ranks)} rank processes up in {time.monotonic() - t0:.1f} s")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.cluster.close()

    # ---- helpers ----

    def req(self, name: str, room: int, src: List[int], dst: List[int], chunk: int, port: int,
            model: Dict[str, Any]) -> Dict[str, Any]:
        r: Dict[str, Any] = {"room": room, "host": "127.0.0.1", "port": port, "src": src, "dst": dst, "chunk": chunk,
                             "aux_src": room % 16, "aux_dst": (room + 5) % 16}
        if model.get("swa"):
            w = min(2, len(src))  # the window: the request's last two pages, in the SWA pool's own pages
            rnd = random.Random(room)
            r["swa_pages"] = list(range(len(src) - w, len(src)))
            r["swa_src"] = rnd.sample(range(model["swa"]["pages"]), w)
            r["swa_dst"] = rnd.sample(range(model["swa"]["pages"]), w)
        if model.get("mamba"):
            r["mamba_src"], r["mamba_dst"] = room % 8, (room + 3) % 8
        return r

    def run_request(self, name: str, r: Dict[str, Any]) -> None:
        """Hand one request to every rank of a scenario."""
        for pp in range(SCENARIOS[name][2]):
            self.coord.command(f"{name}/p{pp}", {"op": "add", "req": r})
        self.coord.command(f"{name}/d", {"op": "add", "req": r})

    def collect(self, name: str, r: Dict[str, Any]) -> int:
        """Wait for every rank of the request; check every decode rank's shard;
        the segments the prefill ranks used."""
        model, ptp, pps, dtp = SCENARIOS[name]
        expected = 0
        for d in range(dtp):
            e = tr.done(self.coord, r["room"], f"{name}/d{d}")
            self.assertEqual(e["bad"], 0, f"{name} room {r['room']} decode rank {d}: {e['why']}")
            want_sources = len(sh_sources(ptp, dtp, d)) * pps
            self.assertEqual(len(e["sources"]), want_sources, e["sources"])
            expected += e["expected"]
        sent, segs = 0, 0
        for pp in range(pps):
            for p in range(ptp):
                e = tr.done(self.coord, r["room"], f"{name}/p{pp}.{p}")
                sent += e["bytes"]
                segs += e["segments"]
        self.assertEqual(sent, expected, f"{name}: the prefill ranks sent {sent} bytes, the decode ranks expected "
                         f"{expected}")
        return segs

    # ---- scenarios ----

    def test_topologies(self) -> None:
        """Every scenario, a contiguous and a scattered request each, all
        scenarios at once; every decode rank's shard checked byte for byte."""
        rnd = random.Random(14)
        reqs = []
        for k, (name, (model, ptp, pps, dtp)) in enumerate(SCENARIOS.items()):
            contiguous = self.req(name, 14000 + 10 * k, list(range(2, 9)), list(range(20, 27)), 3,
                                  self.ports[name], model)
            scattered = self.req(name, 14001 + 10 * k, rnd.sample(range(48), 9), rnd.sample(range(48), 9), 4,
                                 self.ports[name], model)
            reqs.append((name, contiguous, scattered))
            self.run_request(name, contiguous)
        t0 = time.monotonic()
        for name, contiguous, scattered in reqs:
            segs = self.collect(name, contiguous)
            model, ptp, pps, dtp = SCENARIOS[name]
            if name == "tp2_tp4":
                # 7 pages in chunks of 3, 3, 1: per chunk one strided segment per
                # KV buffer (8) and decode rank (2 per prefill rank), plus the aux
                # row (2 buffers) to each decode rank: per prefill rank 52.
                self.assertEqual(segs, 2 * (3 * 8 * 2 + 2 * 2), f"{name}: {segs} segments")
                log(f"{name}: 7 contiguous pages of 8 KV buffers to 4 decode ranks took {segs} segments "
                    f"({7 * PAGE * 8 * 4} with one per token and head range)")
            self.run_request(name, scattered)
        for name, contiguous, scattered in reqs:
            self.collect(name, scattered)
        log(f"all scenarios verified ({time.monotonic() - t0:.1f} s for the requests)")

    def test_pp_stage_killed(self) -> None:
        """PP stage 1 of server k dies mid-request: the decode rank fails that
        request naming the stage; stage 0 ends aborted-by-decode; requests on
        server o (one in flight at the same time, one after) succeed."""
        r = self.req("k", 15000, list(range(0, 6)), list(range(10, 16)), 2, self.ports["k"], GQA2)
        other = self.req("o", 15001, list(range(20, 30)), list(range(30, 40)), 5, self.ports["o"], GQA2)
        for g in ("k/p0", "k/p1"):  # both stages hold their later chunks back
            self.coord.command(g, {"op": "stall", "room": r["room"]})
        for g in ("k/p0", "k/p1"):
            self.coord.command(g, {"op": "add", "req": r})
        self.coord.command("o/p", {"op": "add", "req": other})
        self.coord.command("k/d", {"op": "add", "req": r})
        self.coord.command("k/d", {"op": "add", "req": other})
        self.coord.wait_event(lambda e: e.get("ev") == "progress" and e["room"] == r["room"], T, "first bytes")
        self.cluster.kill_rank("k/p1")
        log("killed PP stage 1 of server k (SIGKILL)")
        e = tr.failed(self.coord, r["room"], "k/d")
        self.assertEqual(e["code"], "unreachable", e)
        self.assertIn("PP stage 1", e["reason"])
        log(f"decode failed the request: {e['code']}: {e['reason']}")
        self.coord.command("k/p0", {"op": "stall", "room": r["room"], "resume": True})
        e = tr.failed(self.coord, r["room"], "k/p0")
        self.assertIn(e["code"], ("aborted-by-decode", "remote"), e)
        e = tr.done(self.coord, other["room"], "k/d")
        self.assertEqual(e["bad"], 0, e["why"])
        tr.done(self.coord, other["room"], "o/p")
        after = self.req("o", 15002, list(range(40, 44)), list(range(0, 4)), 4, self.ports["o"], GQA2)
        self.coord.command("o/p", {"op": "add", "req": after})
        self.coord.command("k/d", {"op": "add", "req": after})
        self.assertEqual(tr.done(self.coord, after["room"], "k/d")["bad"], 0)


def sh_sources(ptp: int, dtp: int, d: int) -> List[int]:
    """sglang's target TP ranks of decode rank d (computed here, not by the adapter)."""
    if dtp >= ptp:
        return [d // (dtp // ptp)]
    n = ptp // dtp
    return list(range(d * n, (d + 1) * n))


def main() -> int:
    tb.require_daemon_and_library()
    if GPU:
        try:
            import torch
        except Exception as e:  # noqa: BLE001
            tb.skip_all(f"PyTorch is not installed ({e})")
        if not torch.cuda.is_available():
            tb.skip_all("no CUDA GPU visible to PyTorch")
    suite = unittest.TestLoader().loadTestsFromTestCase(TopoTest)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
