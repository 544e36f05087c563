#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""GPU test and benchmark of kvproxy.vllm: PyTorch tensors in vLLM's FlashAttention layout.

1. Correctness: each side's KV cache is one CUDA tensor per layer shaped
   ``[2, num_blocks, block_size, kv_heads, head_dim]`` (bf16), as vLLM's
   FlashAttention backend allocates it. A request of scattered blocks goes
   through the connector, driven as vLLM's scheduler and model runner drive
   it (tests/vllm_harness.py), between two kvproxyd; every layer's moved
   blocks are checked with torch.equal, the other blocks stay zero.
2. Rate: 1 GiB of paged KV (16 layers x K,V x 1024 blocks x 32 KiB),
   timed from the decode side's registration (update_state_after_alloc) to
   the request being received, beside the same bytes moved from C
   (``gpu_client``: 32 KiB pages, 1024 per transfer, 16 in flight), median
   of three runs each, with the ratio (goal >= 0.95); contiguous block ids
   on both sides (the connector coalesces them as gpu_client's pages are),
   and shuffled decode block ids (a fragmented pool; no C tool sends that
   layout from GPU memory).

With KVP_GPU_TEST_HOST_ONLY=1 (no GPU needed) the rate runs on host memory
(memfds) against ``kvproxy-bench --linear`` instead.

Environment: KVPROXYD, KVPROXY_LIB, GPU_CLIENT (meson sets them; from a
bundle of tools/bundle.sh, point them into BUNDLE/build and set
LD_LIBRARY_PATH=BUNDLE/libs and KVP_EAL_EXTRA="-d
BUNDLE/libs/librte_mempool_ring.so.23"), KVPROXY_BENCH for the host mode;
KVP_BENCH_JSON=PATH writes the rates as JSON. Exits 77 without PyTorch or
a CUDA GPU (unless host-only).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

HOST_ONLY = os.environ.get("KVP_GPU_TEST_HOST_ONLY") == "1"
torch: Any = None
if not HOST_ONLY:
    try:
        import torch  # type: ignore[no-redef]
    except Exception as e:  # noqa: BLE001
        tb.skip_all(f"PyTorch is not installed ({e})")
    if not torch.cuda.is_available():
        tb.skip_all("no CUDA GPU visible to PyTorch")

import vllm_harness as vh  # noqa: E402

LAYERS, BLOCKS, BS, HEADS, DIM = 16, 1024, 16, 8, 128  # 32 KiB per block and plane; 1 GiB in all
PAGE = BS * HEADS * DIM * 2
GIB = LAYERS * 2 * BLOCKS * PAGE
INFLIGHT = 16
REPEAT = 3
XFER_TIMEOUT = 120.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} test_gpu_vllm] {msg}", file=sys.stderr, flush=True)


def build_path(env: str, rel: str) -> str:
    p = os.environ.get(env) or str(Path(os.environ["KVPROXYD"]).resolve().parents[1] / rel)
    if not os.access(p, os.X_OK):
        raise RuntimeError(f"{p} is not an executable (set ${env})")
    return p


class GpuKV:
    """vLLM's FlashAttention KV cache on the GPU: one tensor per layer."""

    def __init__(self, layers: int, blocks: int) -> None:
        self.blocks = self.num_blocks = blocks
        self.tensors = {f"model.layers.{i}.self_attn.attn":
                        torch.zeros((2, blocks, BS, HEADS, DIM), dtype=torch.bfloat16, device="cuda")
                        for i in range(layers)}

    def fill_random(self, seed: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        for t in self.tensors.values():
            t.normal_(generator=g)

    def zero(self) -> None:
        for t in self.tensors.values():
            t.zero_()

    def close(self) -> None:
        self.tensors.clear()
        torch.cuda.empty_cache()


def check_gpu(pkv: GpuKV, dkv: GpuKV, src: Sequence[int], dst: Sequence[int], what: str) -> None:
    s = torch.tensor(list(src), device="cuda")
    d = torch.tensor(list(dst), device="cuda")
    rest = torch.ones(dkv.blocks, dtype=torch.bool, device="cuda")
    rest[d] = False
    for name, pt in pkv.tensors.items():
        dt = dkv.tensors[name]
        assert torch.equal(dt[:, d], pt[:, s]), f"{what}: {name}: moved blocks differ"
        assert int(dt[:, rest].count_nonzero()) == 0, f"{what}: {name}: blocks outside the request were written"


def check_host(pkv: vh.HostKV, dkv: vh.HostKV, src: Sequence[int], dst: Sequence[int], what: str) -> None:
    for p in range(len(pkv.planes)):
        for s, d in zip(src, dst):
            if pkv.block(p, s) != dkv.block(p, d):
                raise AssertionError(f"{what}: plane {p} block {s} -> {d} differs")


def engines(psock: str, dsock: str, pkv: Any, dkv: Any) -> Tuple[vh.Engine, vh.Engine]:
    """A prefill and a decode instance over the two caches (each with its own block count)."""
    extra = {"kvproxy_max_inflight": INFLIGHT, "kvproxy_transfer_timeout_s": XFER_TIMEOUT}
    pe = vh.Engine("kv_both", [psock], [pkv.tensors], pkv.num_blocks, BS, extra)
    try:
        de = vh.Engine("kv_both", [dsock], [dkv.tensors], dkv.num_blocks, BS, extra)
    except BaseException:
        pe.close()
        raise
    return pe, de


_ids = iter(range(1, 1 << 30))


def one_request(pe: vh.Engine, de: vh.Engine, src: Sequence[int], dst: Sequence[int]) -> float:
    """One request through both instances; seconds from the decode side's
    allocation (its registration) to the request being received."""
    n = next(_ids)
    r, d = f"bench-{n}", f"bench-dec-{n}"
    delay, params = pe.prefill(r, src)
    assert delay and params is not None
    t0 = time.monotonic()
    de.decode(d, params, dst)
    vh.run_until([de, pe], lambda: d in de.received, XFER_TIMEOUT, "1 GiB request")
    secs = time.monotonic() - t0
    vh.run_until([pe], lambda: r in pe.sent, XFER_TIMEOUT, "prefill release")
    assert not de.errors, f"load errors: {sorted(de.errors)[:10]}"
    return secs


def c_rate(tool: str, dec_cmd: List[str], pre_cmd: List[str], parse: Callable[[str], float], tmp: Path) -> List[float]:
    """GB/s of REPEAT runs of a C client pair (its decode side checks every byte)."""
    rates = []
    for rep in range(REPEAT):
        key = tmp / f"key.{tool}.{rep}"
        dec_log = tmp / f"dec.{tool}.{rep}.log"
        with open(dec_log, "wb") as out:
            dec = subprocess.Popen([a.replace("@KEY@", str(key)) for a in dec_cmd], stdout=out,
                                   stderr=subprocess.STDOUT, preexec_fn=tb.die_with_parent)
        try:
            pre = subprocess.run([a.replace("@KEY@", str(key)) for a in pre_cmd], capture_output=True, text=True,
                                 timeout=XFER_TIMEOUT * 2)
            if pre.returncode != 0:
                raise AssertionError(f"{tool} prefill failed ({pre.returncode}):\n{pre.stdout}{pre.stderr}")
            rc = dec.wait(timeout=XFER_TIMEOUT * 2)
        finally:
            if dec.poll() is None:
                dec.kill()
                dec.wait()
        if rc != 0:
            raise AssertionError(f"{tool} decode failed ({rc}):\n{dec_log.read_text(errors='replace')}")
        rates.append(parse(pre.stdout))
    return rates


def wait_regions_released(daemons: Sequence[tb.Daemon]) -> None:
    deadline = time.monotonic() + XFER_TIMEOUT
    for dmn in daemons:
        while dmn.admin_call("status")["regions"] != 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"{dmn.node_id} still holds regions of closed workers")
            time.sleep(tb.POLL)  # bounded poll of the daemon's state


def main() -> int:
    tb.require_daemon_and_library()
    tmp = Path(tempfile.mkdtemp(prefix="kvp-gpu-vllm."))
    log(f"temp dir {tmp}")
    prefill, decode = tb.start_pair(tmp, "prefill0", "decode0", timeouts="admission_ms = 10000;")
    results: Dict[str, Dict[str, Any]] = {}
    rc = 1
    try:
        # 1. Correctness: scattered blocks, caches of different sizes.
        if HOST_ONLY:
            pkv, dkv = vh.HostKV(8, 256, BS, HEADS, DIM), vh.HostKV(8, 320, BS, HEADS, DIM)
        else:
            pkv, dkv = GpuKV(8, 256), GpuKV(8, 320)
        pe, de = engines(prefill.sock, decode.sock, pkv, dkv)
        try:
            rnd = random.Random(5)
            src = rnd.sample(range(1, 256), 90)
            dst = rnd.sample(range(1, 320), 90)
            if HOST_ONLY:
                pkv.fill(src, 5)
            else:
                pkv.fill_random(5)
            one_request(pe, de, src, dst)
            if HOST_ONLY:
                check_host(pkv, dkv, src, dst, "scattered blocks")
                print(f"FlashAttention-layout KV in host memory: 8 layers x {len(src)} scattered blocks moved "
                      "by kvproxy.vllm, verified byte by byte")
            else:
                check_gpu(pkv, dkv, src, dst, "scattered blocks")
                print(f"FlashAttention KV on GPU: 8 layers x {len(src)} scattered blocks of 2 x {PAGE} B moved by "
                      "kvproxy.vllm, verified with torch.equal; untouched blocks stay zero")
        finally:
            pe.close()
            de.close()
            pkv.close()
            dkv.close()
            wait_regions_released((prefill, decode))

        # 2. 1 GiB rates, the connector beside C.
        cases = ["contiguous", "shuffled"]
        for pattern in cases:
            if HOST_ONLY:
                pkv, dkv = (vh.HostKV(LAYERS, BLOCKS, BS, HEADS, DIM) for _ in range(2))
            else:
                pkv, dkv = GpuKV(LAYERS, BLOCKS), GpuKV(LAYERS, BLOCKS)
            pe, de = engines(prefill.sock, decode.sock, pkv, dkv)
            rates = []
            try:
                src = list(range(BLOCKS))
                if HOST_ONLY:
                    pkv.fill(src, 9)
                else:
                    pkv.fill_random(9)
                rnd = random.Random(11)
                for rep in range(REPEAT):
                    dst = list(range(BLOCKS))
                    if pattern == "shuffled":
                        rnd.shuffle(dst)
                    dkv.zero()
                    secs = one_request(pe, de, src, dst)
                    if HOST_ONLY:
                        check_host(pkv, dkv, src, dst, f"{pattern} run {rep}")
                    else:
                        check_gpu(pkv, dkv, src, dst, f"{pattern} run {rep}")
                    rates.append(GIB / secs / 1e9)
            finally:
                pe.close()
                de.close()
                pkv.close()
                dkv.close()
                wait_regions_released((prefill, decode))
            r: Dict[str, Any] = {"python_gbytes_per_s": rates, "python_median": statistics.median(rates)}
            results[pattern] = r
            log(f"{pattern}: connector runs {['%.2f' % x for x in rates]} GB/s")

        if HOST_ONLY:
            bench = build_path("KVPROXY_BENCH", "tools/bench/kvproxy-bench")
            common = ["--size", str(GIB), "--seed", "1", "--key-file", "@KEY@", "--min-seg", str(PAGE),
                      "--max-seg", str(PAGE), "--segs-per-xfer", "1024", "--linear"]
            ctool = "kvproxy-bench --linear"
            c = c_rate("bench", [bench, "decode", "-s", decode.sock, "--timeout", str(XFER_TIMEOUT), *common],
                       [bench, "prefill", "-s", prefill.sock, "--peer", "decode0", "--inflight", str(INFLIGHT),
                        "--json", *common],
                       lambda out: float(json.loads(out.strip().splitlines()[-1])["gbytes_per_s"]), tmp)
        else:
            gpu_client = build_path("GPU_CLIENT", "tests/gpu/gpu_client")
            ctool = "gpu_client"

            def parse(out: str) -> float:
                m = re.search(r"in ([0-9.]+) s: ([0-9.]+) GB/s", out)
                if not m:
                    raise AssertionError(f"gpu_client prefill printed no rate:\n{out}")
                return float(m.group(2))

            c = c_rate("gpu_client", [gpu_client, "decode", "-s", decode.sock, "-k", "@KEY@", "-n", str(GIB)],
                       [gpu_client, "prefill", "-s", prefill.sock, "-k", "@KEY@", "-n", str(GIB), "-p", "decode0",
                        "--page", str(PAGE), "--pages-per-xfer", "1024", "--inflight", str(INFLIGHT)], parse, tmp)
        cmed = statistics.median(c)
        where = "host" if HOST_ONLY else "gpu"
        for pattern, r in results.items():
            line = f"{where} {pattern:10s} connector {r['python_median']:6.2f} GB/s"
            if pattern == "contiguous":
                r.update({"c_tool": ctool, "c_gbytes_per_s": c, "c_median": cmed,
                          "ratio_python_to_c": r["python_median"] / cmed})
                line += f"   C ({ctool}) {cmed:6.2f} GB/s   connector/C {r['ratio_python_to_c']:.2f}"
            print(line, flush=True)
        print(f"(1 GiB = {LAYERS} layers x K,V x {BLOCKS} blocks x {PAGE} B; {INFLIGHT} kvproxy transfers in "
              f"flight; median of {REPEAT}; connector: decode registration to received)")
        if os.environ.get("KVP_BENCH_JSON"):
            Path(os.environ["KVP_BENCH_JSON"]).write_text(json.dumps(results, indent=2) + "\n")
        rc = 0
    finally:
        for dmn in reversed(tb.STARTED):
            p = dmn.stop()
            if p:
                print(p + "\n" + dmn.log_tail(), file=sys.stderr)
                rc = 1
        if rc == 0 and not os.environ.get("KVP_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
