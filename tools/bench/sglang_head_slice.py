#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Benchmark, not a test: kvproxy.sglang's own head-sliced transfer (prefill
TP < decode TP) against an unsliced transfer of the same bytes, both driven
through the adapter as sglang's schedulers drive it, through two running kvproxyd.

One prefill rank (attention-TP rank 0 of --ptp) holds an MHA pool shaped like
sglang's (per layer a K and a V buffer of [tokens, heads / ptp, head_dim]).
"sliced": it serves the --dtp / --ptp decode ranks of a --dtp decode server,
each taking its heads of every token (the adapter's plan: one strided segment
per buffer, run of pages and chunk); "unsliced": the same source pages go to
rank 0 of a decode server of the same TP size (whole tokens, contiguous
segments): the same bytes from the same memory. Timed from the first send()
to the sender's Success (every byte acknowledged by the decode kvproxyd),
alternated --reps times; each sliced run is verified on a sample of pages.
Prints the rates, their ratio, and the descriptors the adapter submitted
(beside what one descriptor per token and head range would need).

    sglang_head_slice.py --prefill-sock S --decode-sock S
        [--layers 64] [--heads 8] [--head-dim 128] [--dtype-bytes 2] [--page 64]
        [--tokens 32768] [--ptp 4] [--dtp 8] [--chunk PAGES] [--scatter]
        [--gpu] [--reps 3] [--json FILE]

tools/bench/head_slice.sh runs it after the raw kvproxy figure (head_slice.py)
on the same pair of daemons.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import kvproxy  # noqa: E402
from kvproxy import sglang as ks  # noqa: E402
from kvproxy.sglang import KVPoll  # noqa: E402

TIMEOUT = 300.0


class Worker:
    """One sglang worker: its MHA pool in a memfd, an aux row buffer, its manager."""

    def __init__(self, mode: str, sock: str, boot: int, a: argparse.Namespace, tp: int, rank: int, pool_pages: int) -> None:
        self.heads = a.heads // tp
        self.tok = self.heads * a.head_dim * a.dtype_bytes
        self.item = a.page * self.tok
        self.nbuf = 2 * a.layers
        self.buf_bytes = pool_pages * self.item
        self.t = self.mem = None
        if a.gpu:
            import torch

            self.t = torch.zeros(self.nbuf * self.buf_bytes, dtype=torch.uint8, device="cuda")
            base = self.t.data_ptr()
        else:
            self.mem = kvproxy.HostBuffer(self.nbuf * self.buf_bytes)
            base = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        self.aux = (ctypes.c_char * (16 * 64))()
        args = ks.KVArgs(engine_rank=rank, gpu_id=0, page_size=a.page,
                         kv_data_ptrs=[base + b * self.buf_bytes for b in range(self.nbuf)],
                         kv_data_lens=[self.buf_bytes] * self.nbuf, kv_item_lens=[self.item] * self.nbuf,
                         kv_head_num=self.heads, total_kv_head_num=a.heads,
                         aux_data_ptrs=[ctypes.addressof(self.aux)], aux_data_lens=[len(self.aux)], aux_item_lens=[64])
        sa = SimpleNamespace(host="127.0.0.1", port=30000, disaggregation_bootstrap_port=boot, tp_size=tp, dp_size=1,
                             enable_dp_attention=False, pp_size=1, kv_cache_dtype="auto",
                             load_balance_method="follow_bootstrap_room", dist_init_addr=None)
        cfg = ks.KvproxyConfig(socket=sock, max_inflight=16, transfer_timeout=TIMEOUT, host_ip="127.0.0.1",
                               waiting_timeout=TIMEOUT, bootstrap_timeout=TIMEOUT)
        self.mgr = ks.KvproxyKVManager(args, mode, sa, False, config=cfg)
        if mode == "prefill" and not self.mgr.side.registered.wait(TIMEOUT):
            raise RuntimeError("the prefill manager did not register")

    def read(self, off: int, n: int) -> bytes:
        if self.t is not None:
            return bytes(self.t[off:off + n].cpu().numpy().tobytes())
        return bytes(self.mem[off:off + n])

    def fill(self) -> None:
        if self.t is not None:
            import torch

            g = torch.Generator(device="cuda").manual_seed(7)
            self.t.copy_(torch.randint(0, 256, self.t.shape, dtype=torch.uint8, device="cuda", generator=g))
            torch.cuda.synchronize()
            return
        block = random.Random(7).randbytes(1 << 20)
        for off in range(0, len(self.mem), len(block)):
            self.mem[off:off + len(block)] = block[:len(self.mem) - off]

    def close(self) -> None:
        self.mgr.close()
        if self.mem is not None:
            self.mem.close()
        else:
            del self.t
            import torch

            torch.cuda.empty_cache()


def poll_until(obj: Any, want: KVPoll, mgr: Any) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        st = obj.poll()
        if st == want:
            return
        if st == KVPoll.Failed:
            obj.failure_exception()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{type(obj).__name__} still {st.name}")
        mgr.wait_for_change(0.01)


_room = iter(range(1 << 40, 1 << 41, 7919))


def request(pre: Worker, decs: List[Worker], addr: str, src: Sequence[int], dst: Sequence[int], chunk: int) -> Dict[str, Any]:
    room = next(_room)
    sender = ks.KVSender(pre.mgr, addr, room, dest_tp_ranks=[0], pp_rank=0)
    receivers = [ks.KVReceiver(d.mgr, addr, room) for d in decs]
    for d, r in zip(decs, receivers):
        while not d.mgr.try_ensure_parallel_info(addr):
            d.mgr.wait_for_change(0.05)
        r.init(0)
    for d, r in zip(decs, receivers):
        poll_until(r, KVPoll.WaitingForInput, d.mgr)
        r.send_metadata(list(dst), 1, [], decode_prefix_len=0)
    poll_until(sender, KVPoll.WaitingForInput, pre.mgr)
    sender.init(len(src), 0)
    t0 = time.monotonic()
    for i in range(0, len(src), chunk):
        sender.send(list(src[i:i + chunk]), [])
    poll_until(sender, KVPoll.Success, pre.mgr)
    secs = time.monotonic() - t0
    for d, r in zip(decs, receivers):
        poll_until(r, KVPoll.Success, d.mgr)
        r.clear()
    m = sender.get_transfer_metric()
    out = {"secs": secs, "bytes": m.transfer_total_bytes, "segments": sender.segments_submitted,
           "transfers": sender.transfers_made}
    sender.clear()
    return out


def verify(pre: Worker, decs: List[Worker], a: argparse.Namespace, src: Sequence[int], dst: Sequence[int],
           rnd: random.Random) -> None:
    """Decode rank j of the prefill rank's len(decs) holds heads [j*h, (j+1)*h) of the prefill rank's."""
    for _ in range(16):
        i, b = rnd.randrange(len(src)), rnd.randrange(pre.nbuf)
        page = pre.read(b * pre.buf_bytes + src[i] * pre.item, pre.item)
        for j, d in enumerate(decs):
            got = d.read(b * d.buf_bytes + dst[i] * d.item, d.item)
            want = b"".join(page[t * pre.tok + j * d.tok:t * pre.tok + (j + 1) * d.tok] for t in range(a.page))
            if got != want:
                raise RuntimeError(f"MISMATCH: buffer {b} page {i} on decode rank {j}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill-sock", required=True)
    ap.add_argument("--decode-sock", required=True)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype-bytes", type=int, default=2)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--ptp", type=int, default=4)
    ap.add_argument("--dtp", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=0, help="pages per send() (default: the whole request at once)")
    ap.add_argument("--scatter", action="store_true")
    ap.add_argument("--gpu", action="store_true", help="KV pools in GPU memory (torch), staged by kvproxyd")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.dtp <= a.ptp or a.dtp % a.ptp or a.heads % a.dtp:
        ap.error("this benchmark slices: dtp must be a multiple of ptp and divide heads")
    npages = (a.tokens + a.page - 1) // a.page
    chunk = a.chunk or npages
    pool = 2 * npages if a.scatter else npages
    rnd = random.Random(1)
    src = rnd.sample(range(pool), npages) if a.scatter else list(range(npages))
    dst = rnd.sample(range(pool), npages) if a.scatter else list(range(npages))
    boot = ks.KvproxyKVBootstrapServer("127.0.0.1", 0)
    addr = f"127.0.0.1:{boot.port}"
    pre = Worker("prefill", a.prefill_sock, boot.port, a, a.ptp, 0, pool)
    # The prefill server's other ranks (decode ranks 0..dtp/ptp-1 never reach them):
    # registered so that the bootstrap server reports the server complete.
    from kvproxy.sglang.bootstrap import registry_call

    for r in range(1, a.ptp):
        registry_call(addr, "PUT", "/route", {**pre.mgr.topology.as_dict(), "attn_tp_rank": r, "rank_ip": "127.0.0.1",
                                              "rank_port": 9, "page_size": a.page, "kv_cache_dtype": "auto"})
    pre.fill()
    res: Dict[str, List[Dict[str, Any]]] = {"sliced": [], "unsliced": []}
    try:
        for rep in range(a.reps):
            for name in ("sliced", "unsliced"):
                if name == "sliced":
                    decs = [Worker("decode", a.decode_sock, boot.port, a, a.dtp, r, pool) for r in range(a.dtp // a.ptp)]
                else:
                    decs = [Worker("decode", a.decode_sock, boot.port, a, a.ptp, 0, pool)]
                try:
                    r = request(pre, decs, addr, src, dst, chunk)
                    if name == "sliced":
                        verify(pre, decs, a, src, dst, rnd)
                finally:
                    for d in decs:
                        d.close()
                res[name].append(r)
                print(f"rep {rep} {name}: {r['bytes'] / r['secs'] / 1e9:.2f} GB/s ({r['secs'] * 1e3:.0f} ms, "
                      f"{r['segments']} segments in {r['transfers']} transfers)", file=sys.stderr)
    finally:
        pre.close()
        boot.close()
    rate = {k: [x["bytes"] / x["secs"] / 1e9 for x in v] for k, v in res.items()}
    med = {k: statistics.median(v) for k, v in rate.items()}
    chunks = (npages + chunk - 1) // chunk
    out = {
        "shape": {k: getattr(a, k) for k in ("layers", "heads", "head_dim", "dtype_bytes", "page", "tokens", "ptp",
                                              "dtp", "scatter", "gpu")},
        "chunk_pages": chunk, "bytes_per_prefill_rank": res["sliced"][0]["bytes"],
        "descriptors_per_prefill_rank": {"adapter_sliced": res["sliced"][0]["segments"],
                                         "adapter_unsliced": res["unsliced"][0]["segments"],
                                         "per_token_and_head_range": (a.dtp // a.ptp) * 2 * a.layers * a.tokens},
        "descriptors_per_request": {"adapter_sliced": a.ptp * res["sliced"][0]["segments"],
                                    "per_token_and_head_range": a.dtp * 2 * a.layers * a.tokens},
        "send_chunks": chunks,
        "gbps": rate, "gbps_median": med, "ratio_median": med["sliced"] / med["unsliced"],
    }
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
