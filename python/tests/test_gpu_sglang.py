#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""GPU test of kvproxy.sglang: PyTorch tensors shaped like a paged KV cache.

1. Correctness: each side holds a KV cache tensor of ``2 * layers x pages x
   page_bytes`` (K and V buffers per layer, as sglang's MHA pool) on the GPU
   and aux rows in CPU tensors (as sglang's metadata buffers). The adapter is
   driven through the calls sglang's schedulers make (bootstrap, init, send
   in chunks, poll until Success) to move a scattered set of page indices
   through two kvproxyd; the decode-side pages are checked with torch.equal,
   the untouched ones stay zero, the aux row arrives.
2. Rate: 1 GiB of paged KV (32 buffers x 1024 pages x 32 KiB), timed from
   Python (first send() to the sender's Success) beside the same transfer
   driven from C, median of three runs each, with the ratio:
   host memory, scattered pages vs ``kvproxy-bench`` (32 KiB segments,
   shuffled destinations, 1024 per transfer, 16 in flight); host memory,
   contiguous pages vs ``kvproxy-bench --linear``; GPU memory, contiguous
   pages vs ``gpu_client`` (C, 32 KiB pages, 1024 per transfer, 16 in
   flight); GPU memory, scattered pages (no C tool sends that layout from GPU
   memory: printed without a ratio).

Environment: KVPROXYD, KVPROXY_LIB, KVPROXY_BENCH, GPU_CLIENT (meson sets
them; from a bundle of tools/bundle.sh, point them into BUNDLE/build and set
LD_LIBRARY_PATH=BUNDLE/libs and KVP_EAL_EXTRA="-d
BUNDLE/libs/librte_mempool_ring.so.23"); KVP_BENCH_JSON=PATH writes the rates
as JSON; KVP_GPU_TEST_HOST_ONLY=1 runs only the host-memory rates (to try the
script on a machine without a GPU). Exits 77 without PyTorch or a CUDA GPU.
"""

from __future__ import annotations

import ctypes
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
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

HOST_ONLY = os.environ.get("KVP_GPU_TEST_HOST_ONLY") == "1"
torch = None
if not HOST_ONLY:
    try:
        import torch  # type: ignore[no-redef]
    except Exception as e:  # noqa: BLE001
        tb.skip_all(f"PyTorch is not installed ({e})")
    if not torch.cuda.is_available():
        tb.skip_all("no CUDA GPU visible to PyTorch")

import kvproxy  # noqa: E402
from kvproxy import sglang as ks  # noqa: E402
from kvproxy.sglang import KVPoll  # noqa: E402
from sglang_fixture import poll_until  # noqa: E402

PAGE = 32 << 10
BUFS = 32  # 16 layers, K and V
PAGES = 1024  # BUFS * PAGES * PAGE = 1 GiB
CHUNK = 256  # pages per send(), as chunked prefill sends them
INFLIGHT = 16
REPEAT = 3
XFER_TIMEOUT = 120.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} test_gpu_sglang] {msg}", file=sys.stderr, flush=True)


def build_path(env: str, rel: str) -> str:
    """A binary from $env, else next to kvproxyd in the same build tree."""
    p = os.environ.get(env) or str(Path(os.environ["KVPROXYD"]).resolve().parents[1] / rel)
    if not os.access(p, os.X_OK):
        raise RuntimeError(f"{p} is not an executable (set ${env})")
    return p


class Side:
    """One worker: its KV cache (2 x layers buffers), aux rows, manager."""

    def __init__(self, mode: str, node: tb.Daemon, boot_port: int, nbuf: int, pages: int, where: str) -> None:
        self.where = where
        self.nbuf, self.pages = nbuf, pages
        self.hostbufs: List[kvproxy.HostBuffer] = []
        if where == "gpu":
            self.kv = torch.zeros((nbuf, pages, PAGE), dtype=torch.uint8, device="cuda")
            ptrs = [self.kv[b].data_ptr() for b in range(nbuf)]
            # sglang's metadata rows are CPU tensors: plain host memory, the mirror path.
            self.aux = torch.zeros((16, 16), dtype=torch.int32)
            aux_ptr, aux_len, aux_item = self.aux.data_ptr(), self.aux.nbytes, self.aux[0].nbytes
        else:
            half = nbuf // 2  # K buffers in one memfd, V buffers in another
            self.hostbufs = [kvproxy.HostBuffer(half * pages * PAGE) for _ in range(2)]
            bases = [ctypes.addressof(ctypes.c_char.from_buffer(h)) for h in self.hostbufs]
            ptrs = [bases[b // half] + (b % half) * pages * PAGE for b in range(nbuf)]
            self.aux_host = (ctypes.c_char * (16 * 64))()
            aux_ptr, aux_len, aux_item = ctypes.addressof(self.aux_host), 16 * 64, 64
        self.ptrs = ptrs
        args = ks.KVArgs(engine_rank=0, gpu_id=0, page_size=16,
                         kv_data_ptrs=ptrs, kv_data_lens=[pages * PAGE] * nbuf, kv_item_lens=[PAGE] * nbuf,
                         aux_data_ptrs=[aux_ptr], aux_data_lens=[aux_len], aux_item_lens=[aux_item])
        sa = SimpleNamespace(host="127.0.0.1", disaggregation_bootstrap_port=boot_port, pp_size=1)
        # What sglang's processes get from their environment ($KVPROXY_*).
        config = ks.KvproxyConfig.from_env({"KVPROXY_SOCKET": node.sock, "KVPROXY_MAX_INFLIGHT": str(INFLIGHT),
                                            "KVPROXY_TRANSFER_TIMEOUT": str(XFER_TIMEOUT)})
        self.mgr = ks.KvproxyBackend().get_kv_class("manager")(args, mode, sa, False, config=config)
        if mode == "prefill":
            assert self.mgr.side.registered.wait(XFER_TIMEOUT), "the prefill manager never registered"

    def page(self, b: int, i: int) -> bytes:
        return ctypes.string_at(self.ptrs[b] + i * PAGE, PAGE)

    def fill_random(self, seed: int) -> None:
        if self.where == "gpu":
            g = torch.Generator(device="cuda").manual_seed(seed)
            self.kv.random_(0, 256, generator=g)
            self.aux[3] = torch.arange(16, dtype=torch.int32) * seed
            return
        rnd = random.Random(seed)
        for h in self.hostbufs:
            for off in range(0, len(h), 64 << 20):
                n = min(64 << 20, len(h) - off)
                h[off:off + n] = rnd.randbytes(n)
        self.aux_host[3 * 64:4 * 64] = rnd.randbytes(64)

    def zero(self) -> None:
        if self.where == "gpu":
            self.kv.zero_()
            self.aux.zero_()
            return
        for h in self.hostbufs:
            ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(h)), 0, len(h))
        ctypes.memset(ctypes.addressof(self.aux_host), 0, len(self.aux_host))

    def close(self) -> None:
        self.mgr.close()
        for h in self.hostbufs:
            h.close()
        if self.where == "gpu":
            # New tensors must not reuse these allocations while a daemon may
            # still hold them open (an IPC handle is opened once per process).
            del self.kv, self.aux
            torch.cuda.empty_cache()


def close_pair(pre: Side, dec: Side, daemons: Sequence[tb.Daemon]) -> None:
    """Close both workers and wait (bounded) until the daemons released their regions."""
    pre.close()
    dec.close()
    deadline = time.monotonic() + XFER_TIMEOUT
    for d in daemons:
        while d.admin_call("status")["regions"] != 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"{d.node_id} still holds regions of closed workers")
            time.sleep(tb.POLL)  # bounded poll of the daemon's state, as daemon_harness's waits


_rooms = iter(range(7 << 40, 8 << 40, 104729))


def request(pre: Side, dec: Side, addr: str, src: Sequence[int], dst: Sequence[int], chunk: int,
            aux: Tuple[int, int] = (3, 5)) -> float:
    """One request through the adapter, as sglang's schedulers drive it.
    Returns the seconds from the first send() to the prefill side's Success."""
    room = next(_rooms)
    sender = ks.KVSender(pre.mgr, addr, room, dest_tp_ranks=[0], pp_rank=0)
    receiver = ks.KVReceiver(dec.mgr, addr, room)
    deadline = time.monotonic() + XFER_TIMEOUT
    while not dec.mgr.try_ensure_parallel_info(addr):
        assert time.monotonic() < deadline, "prefill info never available"
        dec.mgr.wait_for_change(0.05)
    receiver.init(0)
    poll_until(receiver, [KVPoll.WaitingForInput])
    receiver.send_metadata(list(dst), aux[1], [], decode_prefix_len=0)
    poll_until(sender, [KVPoll.WaitingForInput])
    assert sender.pop_decode_prefix_len() == 0
    sender.init(len(src), aux[0])
    t0 = time.monotonic()
    for i in range(0, len(src), chunk):
        sender.send(src[i:i + chunk], [])
    poll_until(sender, [KVPoll.Success], XFER_TIMEOUT)
    secs = time.monotonic() - t0
    poll_until(receiver, [KVPoll.Success], XFER_TIMEOUT)
    m = sender.get_transfer_metric()
    want = len(src) * pre.nbuf * PAGE + sum(pre.mgr.aux_item_lens)
    assert m.transfer_total_bytes == want, (m.transfer_total_bytes, want)
    sender.clear()
    receiver.clear()
    return secs


def check_gpu(pre: Side, dec: Side, src: Sequence[int], dst: Sequence[int], what: str) -> None:
    s = torch.tensor(list(src), device="cuda")
    d = torch.tensor(list(dst), device="cuda")
    assert torch.equal(dec.kv[:, d], pre.kv[:, s]), f"{what}: moved pages differ"
    rest = torch.ones(dec.pages, dtype=torch.bool, device="cuda")
    rest[d] = False
    assert int(dec.kv[:, rest].count_nonzero()) == 0, f"{what}: pages outside the request were written"
    assert torch.equal(dec.aux[5], pre.aux[3]), f"{what}: aux row differs"
    assert int(dec.aux[4].count_nonzero()) == 0, f"{what}: another aux row was written"


def check_host(pre: Side, dec: Side, src: Sequence[int], dst: Sequence[int], what: str) -> None:
    for b in range(pre.nbuf):
        for s, d in zip(src, dst):
            if pre.page(b, s) != dec.page(b, d):
                raise AssertionError(f"{what}: buffer {b} page {s} -> {d} differs")
    assert bytes(dec.aux_host[5 * 64:6 * 64]) == bytes(pre.aux_host[3 * 64:4 * 64]), f"{what}: aux row differs"


def python_rate(pre: Side, dec: Side, addr: str, pattern: str, check: Callable) -> List[float]:
    """GB/s of REPEAT 1 GiB requests (all pages), each verified."""
    rates = []
    rnd = random.Random(11)
    for rep in range(REPEAT):
        src = list(range(PAGES))
        dst = list(range(PAGES))
        if pattern == "scattered":
            rnd.shuffle(dst)  # every page its own segment, as in a fragmented KV pool
        dec.zero()
        secs = request(pre, dec, addr, src, dst, CHUNK)
        check(pre, dec, src, dst, f"{pre.where} {pattern} run {rep}")
        rates.append(PAGES * pre.nbuf * PAGE / secs / 1e9)
    return rates


def c_rate(tool: str, dec_cmd: List[str], pre_cmd: List[str], parse: Callable[[str], float], tmp: Path) -> List[float]:
    """GB/s of REPEAT runs of a C client pair (decode verifies every byte)."""
    rates = []
    for rep in range(REPEAT):
        key = tmp / f"key.{tool}.{rep}"
        dec_log = tmp / f"dec.{tool}.{rep}.log"
        with open(dec_log, "wb") as out:
            dec = subprocess.Popen([a.replace("@KEY@", str(key)) for a in dec_cmd], stdout=out,
                                   stderr=subprocess.STDOUT, preexec_fn=tb.die_with_parent)
        try:
            pre = subprocess.run([a.replace("@KEY@", str(key)) for a in pre_cmd], capture_output=True,
                                 text=True, timeout=XFER_TIMEOUT * 2)
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


def main() -> int:
    tb.require_daemon_and_library()
    bench = build_path("KVPROXY_BENCH", "tools/bench/kvproxy-bench")
    gpu_client = None if HOST_ONLY else build_path("GPU_CLIENT", "tests/gpu/gpu_client")
    tmp = Path(tempfile.mkdtemp(prefix="kvp-gpu-sglang."))
    log(f"temp dir {tmp}")
    # Up to 16 x 32 MiB queued per connection: give staging more than the
    # default second before a transfer that has not started counts as
    # "no-buffers" (the same for the Python and the C runs).
    prefill, decode = tb.start_pair(tmp, "prefill0", "decode0", timeouts="admission_ms = 10000;")
    boot = ks.KvproxyKVBootstrapServer(host="127.0.0.1", port=0)
    addr = f"127.0.0.1:{boot.port}"
    results: Dict[str, Dict[str, object]] = {}
    rc = 1
    try:
        if not HOST_ONLY:
            # 1. Correctness: scattered pages of a 16-buffer cache, chunked, torch.equal.
            pre = Side("prefill", prefill, boot.port, 16, 512, "gpu")
            dec = Side("decode", decode, boot.port, 16, 640, "gpu")
            try:
                pre.fill_random(5)
                rnd = random.Random(5)
                src = rnd.sample(range(512), 150)
                dst = rnd.sample(range(640), 150)
                request(pre, dec, addr, src, dst, 64)
                check_gpu(pre, dec, src, dst, "paged KV")
                print(f"paged KV on GPU: 16 buffers x {len(src)} scattered pages of {PAGE} B "
                      "moved by kvproxy.sglang, verified with torch.equal; aux row verified")
            finally:
                close_pair(pre, dec, (prefill, decode))

        # 2. 1 GiB rates, Python beside C.
        gib = BUFS * PAGES * PAGE
        sock_p, sock_d = prefill.sock, decode.sock
        bench_common = ["--size", str(gib), "--seed", "1", "--key-file", "@KEY@", "--min-seg", str(PAGE),
                        "--max-seg", str(PAGE), "--segs-per-xfer", "1024"]
        parse_bench = lambda out: float(json.loads(out.strip().splitlines()[-1])["gbytes_per_s"])  # noqa: E731

        def parse_gpu_client(out: str) -> float:
            m = re.search(r"in ([0-9.]+) s: ([0-9.]+) GB/s", out)
            if not m:
                raise AssertionError(f"gpu_client prefill printed no rate:\n{out}")
            return float(m.group(2))

        cases = [("host", "scattered", []), ("host", "contiguous", ["--linear"])]
        if not HOST_ONLY:
            cases += [("gpu", "contiguous", None), ("gpu", "scattered", None)]
        for where, pattern, bench_flags in cases:
            pre = Side("prefill", prefill, boot.port, BUFS, PAGES, where)
            dec = Side("decode", decode, boot.port, BUFS, PAGES, where)
            try:
                pre.fill_random(9)
                py = python_rate(pre, dec, addr, pattern, check_gpu if where == "gpu" else check_host)
            finally:
                close_pair(pre, dec, (prefill, decode))
            c: Optional[List[float]] = None
            ctool = ""
            if where == "host":
                ctool = "kvproxy-bench" + (" --linear" if bench_flags else "")
                c = c_rate("bench", [bench, "decode", "-s", sock_d, "--timeout", str(XFER_TIMEOUT), *bench_common, *bench_flags],
                           [bench, "prefill", "-s", sock_p, "--peer", "decode0", "--inflight", str(INFLIGHT), "--json",
                            *bench_common, *bench_flags], parse_bench, tmp)
            elif pattern == "contiguous":
                ctool = "gpu_client"
                c = c_rate("gpu_client", [gpu_client, "decode", "-s", sock_d, "-k", "@KEY@", "-n", str(gib)],
                           [gpu_client, "prefill", "-s", sock_p, "-k", "@KEY@", "-n", str(gib), "-p", "decode0",
                            "--page", str(PAGE), "--pages-per-xfer", "1024", "--inflight", str(INFLIGHT)],
                           parse_gpu_client, tmp)
            name = f"{where} {pattern}"
            r: Dict[str, object] = {"python_gbytes_per_s": py, "python_median": statistics.median(py)}
            line = f"{name:16s} python {statistics.median(py):6.2f} GB/s"
            if c is not None:
                r.update({"c_tool": ctool, "c_gbytes_per_s": c, "c_median": statistics.median(c),
                          "ratio_python_to_c": statistics.median(py) / statistics.median(c)})
                line += f"   C ({ctool}) {statistics.median(c):6.2f} GB/s   python/C {r['ratio_python_to_c']:.2f}"
            else:
                line += "   (no C tool sends this layout from GPU memory)"
            results[name] = r
            print(line, flush=True)
            log(f"{name}: python runs {['%.2f' % x for x in py]}" + (f", C runs {['%.2f' % x for x in c]}" if c else ""))
        print(f"(1 GiB = {BUFS} buffers x {PAGES} pages x {PAGE} B, {CHUNK}-page send() chunks, "
              f"{INFLIGHT} kvproxy transfers in flight, median of {REPEAT}; python: first send() to Success)")
        if os.environ.get("KVP_BENCH_JSON"):
            Path(os.environ["KVP_BENCH_JSON"]).write_text(json.dumps(results, indent=2) + "\n")
        rc = 0
    finally:
        boot.close()
        for d in reversed(tb.STARTED):
            p = d.stop()
            if p:
                print(p + "\n" + d.log_tail(), file=sys.stderr)
                rc = 1
        if rc == 0 and not os.environ.get("KVP_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
