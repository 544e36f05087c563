#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""tools/kvp-waterfall on real transfers, and the paging of
examples/hf_disagg without a model (no torch needed).

Two kvproxyd on 127.0.0.1 (limits.max_segments = 16, so that long requests
need several transfers). Paged KV pools in host memory, laid out as the
example lays them (per layer a K and a V buffer of [tokens, heads, dim],
pages of 16 tokens), move three requests (77, 300 and 1000 tokens) with the
example's own code: page allocation, runs consecutive on both sides,
segments (contiguous; Segment2D head slices for two decode "ranks" holding
half of the heads each), transfers cut at max_segments, the aux row, the
completions and the records. Every token's bytes are checked at their
destination slot. Then the tool, over the records of both modes:

- its text shows the slowest requests by TTFT, each lane's phases, the
  transfer's share of TTFT, and says every transfer adds up within 1 % on
  both nodes (the test checks the same from the records itself);
- --json agrees with the records; --svg writes the picture; --png writes a
  PNG where matplotlib is installed, else exits 3 and says why;
- a record whose phases were tampered with fails the check (exit 1), a
  malformed line is refused with its line number (exit 2), and the prefill
  node's admin `slowest` goes through --slowest.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both). Exit status: 0 pass,
1 fail, 77 skip.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(ROOT / "examples" / "hf_disagg"))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

import common as C  # noqa: E402  (the example's plumbing)
import kvproxy  # noqa: E402

WATERFALL = str(ROOT / "tools" / "kvp-waterfall")
LAYERS, HEADS, DIM, ELT, PAGE = 2, 4, 16, 2, 16
TOK = HEADS * DIM * ELT
LENGTHS = [77, 300, 1000]
MAX_SEGS = 16


def token_bytes(buf: int, slot: int) -> bytes:
    """A source token's K or V bytes: distinct for every buffer, slot and head."""
    return bytes(((buf * 7 + slot * 13 + i * 3 + (i // (DIM * ELT)) * 101) & 0xFF) for i in range(TOK))


class HostPool:
    """The example's pool layout in a HostBuffer (what C.Pool is without torch)."""

    def __init__(self, client: kvproxy.Client, pages: int, heads: int) -> None:
        self.buf = kvproxy.HostBuffer(2 * LAYERS * pages * PAGE * heads * DIM * ELT)
        self.pages = pages
        self.layout = C.Layout(client.register(self.buf).key, 2 * LAYERS, pages * PAGE, PAGE, heads * DIM * ELT)

    def slot(self, b: int, s: int) -> memoryview:
        off = (b * self.layout.tokens + s) * self.layout.tok_bytes
        return memoryview(self.buf)[off:off + self.layout.tok_bytes]


class WaterfallTest(unittest.TestCase):
    tmp: Path
    records: Dict[int, Path] = {}

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = Path(tempfile.mkdtemp(prefix="kvp-waterfall."))
        cls.prefill, cls.decode = tb.start_pair(cls.tmp, "prefill0", "decode0", f"limits = {{ max_segments = {MAX_SEGS}; }};")
        cls.pc = kvproxy.Client(cls.prefill.sock)
        total = C.pool_pages(LENGTHS, PAGE)
        cls.src = HostPool(cls.pc, total, HEADS)
        for b in range(cls.src.layout.nbuf):
            for s in range(cls.src.layout.tokens):
                cls.src.slot(b, s)[:] = token_bytes(b, s)
        cls.aux = kvproxy.HostBuffer(C.AUX_ROW * C.AUX_ROWS)
        cls.aux_key = cls.pc.register(cls.aux).key
        for ranks in (1, 2):
            cls.records[ranks] = cls.tmp / f"records-{ranks}.jsonl"
            cls.run_requests(ranks, total)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.pc.close()
        tb.stop_and_clean(cls.tmp, reversed(tb.STARTED))

    @classmethod
    def run_requests(cls, ranks: int, total: int) -> None:
        """The example's prefill/decode loop, with byte checks where the model would be."""
        dcs = [kvproxy.Client(cls.decode.sock) for _ in range(ranks)]
        dst = [HostPool(dc, total, HEADS // ranks) for dc in dcs]
        daux = [kvproxy.HostBuffer(C.AUX_ROW * C.AUX_ROWS) for _ in range(ranks)]
        aux_keys = [dc.register(a).key for dc, a in zip(dcs, daux)]
        rnd_p, rnds = random.Random(1), [random.Random(2 + r) for r in range(ranks)]
        head_bytes = DIM * ELT
        for i, n in enumerate(LENGTHS):
            np_ = C.npages(n, PAGE)
            dpages = [C.take_pages(np_, total, rnds[r], C.EXTENT["decode"]) for r in range(ranks)]
            ph = C.Phases("prefill prefill0")
            t0 = C.now()
            with ph("prefill forward"):
                pages = C.take_pages(np_, total, rnd_p, C.EXTENT["prefill"])
            with ph("pool write"):
                aux_off = C.put_aux(cls.aux, i, 1000 + i, n)
            submitted = {}
            for r in range(ranks):
                segs = C.kv_segments(cls.src.layout, dst[r].layout, C.runs(pages, dpages[r]), r * HEADS // ranks,
                                     head_bytes)
                if r == 0:
                    segs.append(kvproxy.Segment(cls.aux_key, aux_off, aux_keys[0], aux_off, C.AUX_ROW))
                for j, batch in enumerate(C.batches(segs, cls.pc.max_segments)):
                    uid = C.user_id(i, r, j)
                    submitted[uid] = C.now()
                    cls.pc.submit("decode0", batch, uid, timeout=30)
            send = C.wait_done(cls.pc, submitted, 60)
            landed, lanes = [], []
            for r, dc in enumerate(dcs):
                lane = "decode decode0" + (f" rank {r}" if ranks > 1 else "")
                want = dst[r].layout.request_bytes(np_) + (C.AUX_ROW if r == 0 else 0)
                landed += C.wait_landed(dc, want, 60, lane)
                lanes.append(lane)
            dph = C.Phases(lanes[0])
            with dph("rebuild cache"):
                first, n_aux = C.get_aux(daux[0], i)
                bad = cls.misplaced(pages, dpages, dst, n)
            t_ready = C.now()
            assert (first, n_aux, bad) == (1000 + i, n, 0), f"request {i}: aux {first, n_aux}, {bad} tokens misplaced"
            rec = C.record(i, n, ranks, (t0, t_ready), ph.items + dph.items, send, landed,
                           {"tokens_equal": True})
            with open(cls.records[ranks], "a") as f:
                f.write(json.dumps(rec) + "\n")
        for dc in dcs:
            dc.close()

    @classmethod
    def misplaced(cls, pages: List[int], dpages: List[List[int]], dst: List[HostPool], n: int) -> int:
        """Tokens whose bytes (this rank's heads of them) are not at their destination slot."""
        bad, ranks = 0, len(dst)
        per = TOK // ranks
        for b in range(2 * LAYERS):
            for t in range(n):
                want = token_bytes(b, pages[t // PAGE] * PAGE + t % PAGE)
                for r in range(ranks):
                    got = dst[r].slot(b, dpages[r][t // PAGE] * PAGE + t % PAGE)
                    bad += bytes(got) != want[r * per:(r + 1) * per]
        return bad

    def tool(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, WATERFALL, *args], capture_output=True, text=True, timeout=60)

    def recs(self, ranks: int) -> List[Dict]:
        return [json.loads(x) for x in self.records[ranks].read_text().splitlines()]

    # ---- the records themselves ----

    def test_records_add_up(self) -> None:
        """kvproxy's phases add up to each transfer's end-to-end time on both nodes (1 %)."""
        for ranks in (1, 2):
            recs = self.recs(ranks)
            self.assertEqual([r["tokens"] for r in recs], LENGTHS)
            self.assertGreater(len(recs[-1]["send"]), ranks, "the 1000-token request should need several transfers")
            for r in recs:
                self.assertEqual(r["kv_bytes"], 2 * LAYERS * C.npages(r["tokens"], PAGE) * PAGE * TOK)
                for e in r["send"]:
                    s = sum(e["phases"][k] for k in C.SEND_PHASES)
                    self.assertLessEqual(abs(s - e["phases"]["e2e"]), 0.01 * e["phases"]["e2e"], e)
                for e in r["landed"]:
                    s = sum(e["phases"][k] for k in C.LANDED_PHASES)
                    self.assertLessEqual(abs(s - e["phases"]["total"]), 0.01 * e["phases"]["total"], e)
                self.assertEqual({e["user_id"] for e in r["send"]}, {e["user_id"] for e in r["landed"]})

    # ---- the tool ----

    def test_text(self) -> None:
        for ranks in (1, 2):
            r = self.tool(str(self.records[ranks]), "--top", "2")
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            out = r.stdout
            self.assertIn(f"{len(LENGTHS)} requests from", out)
            self.assertIn("the slowest 2 by TTFT", out)
            recs = sorted(self.recs(ranks), key=lambda x: x["ttft"]["end"] - x["ttft"]["start"], reverse=True)
            heads = [line for line in out.splitlines() if line.startswith("request ")]
            self.assertEqual([h.split(":")[0] for h in heads], [f"request {x['request']}" for x in recs[:2]])
            for h in heads:
                self.assertRegex(h, r"transfer \d+\.\d+ ms, TTFT \d+\.\d+ ms: the transfer is \d+\.\d % of TTFT")
            for phase in ("prefill forward", "pool write", "kvp queue", "kvp post", "kvp wire", "kvp deliver",
                          "kvp land", "kvp notify", "rebuild cache"):
                self.assertIn(phase, out)
            if ranks == 2:
                self.assertIn("decode decode0 rank 1", out)
            n = sum(len(x["send"]) + len(x["landed"]) for x in recs)
            self.assertIn(f"\n{n} of {n} transfer records add up within 1 % on their node", out)
            self.assertNotIn("BAD", out)

    def test_json_and_pictures(self) -> None:
        svg, png = self.tmp / "w.svg", self.tmp / "w.png"
        r = self.tool(str(self.records[2]), "--json", "--top", "3", "--svg", str(svg), "--png", str(png))
        try:
            import matplotlib  # noqa: F401
            have_mpl = True
        except ImportError:
            have_mpl = False
        if have_mpl:
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(png.read_bytes()[:8], b"\x89PNG\r\n\x1a\n")
        else:
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn("matplotlib is not installed", r.stderr)
            self.assertFalse(png.exists())
        doc = json.loads(r.stdout)
        self.assertEqual(doc["bad"], 0)
        ttfts = [x["ttft_ms"] for x in doc["requests"]]
        self.assertEqual(ttfts, sorted(ttfts, reverse=True))
        for x in doc["requests"]:
            self.assertTrue(x["add_up"])
            self.assertTrue(0 < x["transfer_share"] <= 1, x)
        text = svg.read_text()
        self.assertTrue(text.startswith("<svg"))
        for needle in ("kvp post", "kvp land", "rebuild cache", "request 2, 1000 tokens", "decode decode0 rank 1"):
            self.assertIn(needle, text)

    def test_tampered_and_malformed(self) -> None:
        recs = self.recs(1)
        recs[1]["send"][0]["phases"]["wire"] += recs[1]["send"][0]["phases"]["e2e"] * 0.05
        bad = self.tmp / "tampered.jsonl"
        bad.write_text("".join(json.dumps(x) + "\n" for x in recs))
        r = self.tool(str(bad))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("BAD  request 1: prefill0 sent transfer", r.stdout)
        self.assertIn("1 do not add up", r.stdout)
        bad.write_text(json.dumps(recs[0]) + "\n{not json\n")
        r = self.tool(str(bad))
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{bad}:2:", r.stderr)
        r = self.tool(str(bad), "--slowest", str(bad))
        self.assertEqual(r.returncode, 2)

    def test_slowest(self) -> None:
        """The prefill node's admin 'slowest' (what kvproxyctl --json slowest prints) through the tool."""
        path = self.tmp / "slowest.json"
        path.write_text(json.dumps(self.prefill.admin_call("slowest")))
        r = self.tool("--slowest", str(path), "--node", "prefill0", "--top", "2")
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        self.assertIn("the slowest 2 by transfer time", r.stdout)
        self.assertIn("prefill0 sent transfer", r.stdout)
        self.assertNotIn("BAD", r.stdout)


def main() -> int:
    tb.require_daemon_and_library()
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(
        unittest.TestLoader().loadTestsFromTestCase(WaterfallTest))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
