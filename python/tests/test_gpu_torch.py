#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""GPU test of the binding: PyTorch tensors shaped like a paged KV cache
(layers x pages x page bytes) on the prefill side, a set of page indices
moved through two kvproxyd into a decode-side tensor, checked with
torch.equal. Also times a 1 GiB paged-KV transfer from Python. Exits 77
(skip) without PyTorch or a CUDA GPU.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

try:
    import torch
except Exception as e:  # noqa: BLE001
    tb.skip_all(f"PyTorch is not installed ({e})")
if not torch.cuda.is_available():
    tb.skip_all("no CUDA GPU visible to PyTorch")

import kvproxy  # noqa: E402
from kvproxy import Segment  # noqa: E402


def paged_segments(src, dst, layers, pages, page_bytes, chosen, max_segs):
    """One segment per (layer, chosen page), batched into transfers of max_segs."""
    segs = [
        Segment(src.key, (l * pages + p) * page_bytes, dst.key, (l * pages + p) * page_bytes, page_bytes)
        for l in range(layers)
        for p in chosen
    ]
    return [segs[i:i + max_segs] for i in range(0, len(segs), max_segs)]


def move(pc, dc, peer, batches, timeout=120.0):
    """Submit every batch (bounded in flight), wait for every done; returns seconds."""
    t0 = time.monotonic()
    inflight, uid, total = set(), 0, len(batches)
    done = 0
    while done < total:
        while uid < total and len(inflight) < 8:
            pc.submit(peer, batches[uid], user_id=uid)
            inflight.add(uid)
            uid += 1
        for c in pc.wait(timeout=timeout):
            if c.kind == "done":
                assert c.ok, f"transfer {c.user_id}: {c.status_name}"
                inflight.discard(c.user_id)
                done += 1
    return time.monotonic() - t0


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="kvp-gpu-py."))
    prefill, decode = tb.start_pair(tmp, "prefill0", "decode0")
    rc = 1
    try:
        with kvproxy.Client(prefill.sock) as pc, kvproxy.Client(decode.sock) as dc:
            layers, pages, page_bytes = 8, 512, 64 * 1024
            torch.manual_seed(7)
            kv_p = torch.randint(0, 256, (layers, pages, page_bytes), dtype=torch.uint8, device="cuda")
            kv_d = torch.zeros_like(kv_p)
            src, dst = pc.register_cuda(kv_p), dc.register_cuda(kv_d)
            peer = pc.peer("decode0")
            chosen = list(range(3, pages, 7))  # a request's pages, not contiguous
            batches = paged_segments(src, dst, layers, pages, page_bytes, chosen, pc.max_segments)
            move(pc, dc, peer, batches)
            idx = torch.tensor(chosen, device="cuda")
            assert torch.equal(kv_d[:, idx], kv_p[:, idx]), "moved pages differ"
            others = torch.tensor([p for p in range(pages) if p not in set(chosen)], device="cuda")
            assert int(kv_d[:, others].count_nonzero()) == 0, "pages outside the request were written"
            print(f"paged KV: {layers}x{len(chosen)} pages of {page_bytes} B verified with torch.equal")

            # 1 GiB of contiguous pages (all of them), timed from Python.
            layers, pages = 16, 1024
            big_p = torch.randint(0, 256, (layers, pages, page_bytes), dtype=torch.uint8, device="cuda")
            big_d = torch.zeros_like(big_p)
            bsrc, bdst = pc.register_cuda(big_p), dc.register_cuda(big_d)
            batches = paged_segments(bsrc, bdst, layers, pages, page_bytes, range(pages), pc.max_segments)
            secs = move(pc, dc, peer, batches)
            assert torch.equal(big_d, big_p), "1 GiB transfer differs"
            gib = layers * pages * page_bytes
            print(f"python: {gib} bytes of paged KV (GPU->GPU) in {secs:.3f} s: {gib / secs / 1e9:.2f} GB/s")
            rc = 0
    finally:
        for d in reversed(tb.STARTED):
            p = d.stop()
            if p:
                print(p + "\n" + d.log_tail(), file=sys.stderr)
                rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
