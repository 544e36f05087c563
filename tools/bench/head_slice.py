#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Benchmark, not a test: a head-sliced KV transfer (prefill TP < decode TP)
against an unsliced transfer of the same bytes, through two running kvproxyd.

The KV cache of one prefill rank is shaped like sglang's MHA pool: per layer
a K and a V buffer of [tokens, heads / ptp, head_dim] elements. One decode
rank of a larger TP holds heads / dtp of those heads: from every token of
every page of the request it needs a slice of the prefill rank's heads. The
sliced transfer moves exactly that with strided segments (one descriptor per
buffer and run of consecutive pages); the reference moves the same number of
bytes in the same pages as contiguous segments (as if the prefill rank held
just those heads). Both are timed from the first submit to the
last ``done`` completion, alternated --reps times, and reported with their
ratio and the descriptor counts (also the count a per-token, per-head-range
layout would need).

    head_slice.py --prefill-sock S --decode-sock S --peer decode0
        [--layers 64] [--heads 8] [--head-dim 128] [--dtype-bytes 2]
        [--page 64] [--tokens 32768] [--ptp 4] [--dtp 8] [--scatter]
        [--gpu] [--reps 3] [--json FILE]

--scatter places the request's pages at random in both pools (one
descriptor per page and buffer); --gpu puts both pools in GPU memory (torch
tensors, registered by CUDA IPC). Every sliced run is verified on a sample
of pages. tools/bench/head_slice.sh starts the daemons.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import kvproxy  # noqa: E402
from kvproxy import Segment, Segment2D  # noqa: E402

PIECE = 32 << 20  # bytes per kvproxy transfer (as the engine adapters cut them)


class Pool:
    """2 * layers buffers of pool_tokens x heads x head bytes, host or GPU."""

    def __init__(self, client: kvproxy.Client, nbuf: int, tokens: int, tok_bytes: int, gpu: bool) -> None:
        self.nbuf, self.buf_bytes = nbuf, tokens * tok_bytes
        size = nbuf * self.buf_bytes
        if gpu:
            import torch

            self.t = torch.zeros(size, dtype=torch.uint8, device="cuda")
            self.region = client.register_cuda(self.t)
            self.host = None
        else:
            self.t = None
            self.host = kvproxy.HostBuffer(size)
            self.region = client.register(self.host)

    def fill(self, seed: int) -> None:
        if self.t is not None:
            import torch

            g = torch.Generator(device="cuda").manual_seed(seed)
            self.t.copy_(torch.randint(0, 256, self.t.shape, dtype=torch.uint8, device="cuda", generator=g))
        else:
            rnd = random.Random(seed)
            block = bytes(rnd.getrandbits(8) for _ in range(1 << 16))
            n = len(self.host)
            for off in range(0, n, len(block)):
                self.host[off:off + len(block)] = block[:n - off]

    def read(self, off: int, n: int) -> bytes:
        if self.t is not None:
            return bytes(self.t[off:off + n].cpu().numpy().tobytes())
        return bytes(self.host[off:off + n])


def runs(src: Sequence[int], dst: Sequence[int]) -> List[Tuple[int, int, int]]:
    out: List[Tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if out and s == out[-1][0] + out[-1][2] and d == out[-1][1] + out[-1][2]:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((s, d, 1))
    return out


def group(segs: List[Tuple[int, ...]], max_segs: int) -> List[List[Tuple[int, ...]]]:
    """Transfers of at most max_segs segments and about PIECE bytes."""
    out, cur, size = [], [], 0
    for s in segs:
        cur.append(s)
        size += s[4] * (s[5] if len(s) == 8 else 1)
        if len(cur) == max_segs or size >= PIECE:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def timed(src: kvproxy.Client, peer: int, xfers: List[List[Tuple[int, ...]]], base_uid: int,
          inflight: int = 16) -> float:
    t0 = time.monotonic()
    pending: Dict[int, None] = {}
    nxt = 0
    while nxt < len(xfers) or pending:
        while nxt < len(xfers) and len(pending) < inflight:
            try:
                src.submit(peer, xfers[nxt], base_uid + nxt, timeout=120)
            except kvproxy.RingFull:
                break
            pending[base_uid + nxt] = None
            nxt += 1
        for c in src.wait(timeout=1.0):
            if c.kind == "done" and c.user_id in pending:
                if not c.ok:
                    raise RuntimeError(f"transfer {c.user_id} failed: {c.status_name} {c.detail}")
                del pending[c.user_id]
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill-sock", required=True)
    ap.add_argument("--decode-sock", required=True)
    ap.add_argument("--peer", default="decode0")
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype-bytes", type=int, default=2)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--ptp", type=int, default=4)
    ap.add_argument("--dtp", type=int, default=8)
    ap.add_argument("--scatter", action="store_true")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--only", choices=("sliced", "unsliced"), help="time one series (for profiling)")
    a = ap.parse_args()
    if a.dtp <= a.ptp or a.dtp % a.ptp or a.heads % a.dtp:
        ap.error("this benchmark slices: dtp must be a multiple of ptp and divide heads")

    hb = a.head_dim * a.dtype_bytes
    src_heads, dst_heads = a.heads // a.ptp, a.heads // a.dtp
    src_tok, dst_tok = src_heads * hb, dst_heads * hb
    npages = (a.tokens + a.page - 1) // a.page
    pool_pages = 2 * npages if a.scatter else npages  # room to scatter into
    nbuf = 2 * a.layers
    rnd = random.Random(1)
    spages = rnd.sample(range(pool_pages), npages) if a.scatter else list(range(npages))
    dpages = rnd.sample(range(pool_pages), npages) if a.scatter else list(range(npages))

    src = kvproxy.Client(a.prefill_sock)
    dst = kvproxy.Client(a.decode_sock)
    sp = Pool(src, nbuf, pool_pages * a.page, src_tok, a.gpu)
    dp = Pool(dst, nbuf, pool_pages * a.page, dst_tok, a.gpu)
    sp.fill(7)
    peer = src.peer(a.peer)
    # Decode rank 1 of the dtp/ptp that prefill rank 0 serves: its heads start this far in.
    head_off = (1 % (a.dtp // a.ptp)) * dst_tok

    sliced: List[Tuple[int, ...]] = []
    for b in range(nbuf):
        for s0, d0, n in runs(spages, dpages):
            sliced.append(Segment2D(sp.region.key, b * sp.buf_bytes + s0 * a.page * src_tok + head_off,
                                    dp.region.key, b * dp.buf_bytes + d0 * a.page * dst_tok,
                                    dst_tok, n * a.page, src_tok, dst_tok))
    total = sum(s[4] * s[5] for s in sliced)
    # The reference: the same bytes in the same pages, unsliced (as if the prefill
    # rank held just these heads): one contiguous segment per buffer and run.
    plain = [Segment(sp.region.key, b * sp.buf_bytes + s0 * a.page * dst_tok,
                     dp.region.key, b * dp.buf_bytes + d0 * a.page * dst_tok, n * a.page * dst_tok)
             for b in range(nbuf) for s0, d0, n in runs(spages, dpages)]
    per_token = nbuf * a.tokens
    xs, xp = group(sliced, src.max_segments), group(plain, src.max_segments)

    res: Dict[str, List[float]] = {"sliced": [], "unsliced": []}
    uid = 1 << 20
    for r in range(a.reps):
        for name, xfers in (("sliced", xs), ("unsliced", xp)):
            if a.only and name != a.only:
                res[name].append(float("nan"))
                continue
            dt = timed(src, peer, xfers, uid)
            uid += len(xfers)
            res[name].append(total / dt / 1e9)
            print(f"rep {r} {name}: {total / dt / 1e9:.2f} GB/s ({dt * 1e3:.0f} ms)", file=sys.stderr)
        # Verify the sliced layout on a sample of pages (the unsliced run overwrote the start).
        dt = timed(src, peer, xs, uid)
        uid += len(xs)
        for i in rnd.sample(range(npages), min(16, npages)):
            b = rnd.randrange(nbuf)
            got = dp.read(b * dp.buf_bytes + dpages[i] * a.page * dst_tok, a.page * dst_tok)
            page = sp.read(b * sp.buf_bytes + spages[i] * a.page * src_tok, a.page * src_tok)
            want = b"".join(page[t * src_tok + head_off:t * src_tok + head_off + dst_tok] for t in range(a.page))
            if got != want:
                print(f"MISMATCH: buffer {b} page {i}", file=sys.stderr)
                return 1
    best = {k: max(v) for k, v in res.items()}
    med = {k: statistics.median(v) for k, v in res.items()}
    out: Dict[str, Any] = {
        "shape": {k: getattr(a, k) for k in ("layers", "heads", "head_dim", "dtype_bytes", "page", "tokens", "ptp",
                                              "dtp", "scatter", "gpu")},
        "bytes": total,
        "descriptors": {"strided": len(sliced), "per_token_head_range": per_token, "unsliced": len(plain)},
        "transfers": {"sliced": len(xs), "unsliced": len(xp)},
        "gbps_best": best, "gbps_median": med,
        "ratio_best": best["sliced"] / best["unsliced"], "ratio_median": med["sliced"] / med["unsliced"],
    }
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    src.close()
    dst.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
