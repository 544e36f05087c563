#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""One figure of tools/bench/scale_workers.sh, and the report at the end.

``run``: W client pairs (one per worker: clients go to the worker with the
fewest) move SIZE bytes between two running kvproxyd, host or GPU memory,
all starting together; prints one JSON line: bytes, the span from the first
submission to the last completion over all pairs, GB/s, and the CPU seconds
both daemons spent in that span (from /proc) per GB. The decode clients
verify every byte.

``iperf``: W iperf3 processes x 1 stream over loopback at once (servers and
clients pinned one per CPU of the given lists when taskset exists); prints
one JSON line: GB/s of the sum, CPU seconds of all iperf3 processes per GB.

``stream``: W plain TCP streams at once (``kvp-tcp-stream``), each moving
SIZE / W distinct bytes from a buffer of that size into another (the
footprint of one kvproxy client pair: iperf3 resends one hot 128 KiB
buffer), pinned as iperf3 is; prints one JSON line: GB/s of the sum, CPU
seconds per GB.

``report``: the table, the JSON file and the PNG chart from the JSON lines.

Standard library only (matplotlib for the chart, when present).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} scale_workers] {msg}", file=sys.stderr, flush=True)


def admin(sock: str, method: str) -> Dict:
    """One JSON-RPC call on a kvproxyd admin socket (why not kvproxyctl: no fork per poll)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(sock)
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method}).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    reply = json.loads(buf)
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")
    return reply["result"]


def wait_for(what: str, pred, timeout: float = 120.0, procs: Sequence[subprocess.Popen] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                raise RuntimeError(f"a client exited with {p.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.02)


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of @p pid."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def pinned(cmd: List[str], cpus: Optional[str]) -> List[str]:
    if cpus and shutil.which("taskset"):
        return ["taskset", "-c", cpus] + cmd
    return cmd


def kill_all(procs: Sequence[subprocess.Popen]) -> None:
    """Kill the ones still running and reap every one (their CPU time then counts as the children's)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def run_figure(a: argparse.Namespace) -> Dict:
    tmp = Path(a.tmp)
    w, size = a.workers, a.size
    per = size // w
    per -= per % a.seg  # whole blocks / pages per pair
    decs: List[subprocess.Popen] = []
    pres: List[subprocess.Popen] = []
    outs: List[Path] = []
    tag = f"{a.mode}-{a.seg}-{a.rep}"
    keys = [tmp / f"key.{tag}.{i}" for i in range(w)]
    gos = [tmp / f"go.{tag}.{i}" for i in range(w)]
    for k in keys + gos:
        k.unlink(missing_ok=True)
    base = admin(a.decode_admin, "status")["clients"]
    try:
        # Decode clients one at a time: each goes to the next worker.
        for i in range(w):
            if a.mode == "host":
                cmd = [a.bench, "decode", "-s", a.decode_sock, "--size", str(per), "--seed", str(i + 1),
                       "--key-file", str(keys[i]), "--min-seg", str(a.seg), "--max-seg", str(a.seg),
                       "--segs-per-xfer", str(a.per_xfer), "--linear", "--timeout", "300"]
            else:
                cmd = [a.gpu_client, "decode", "-s", a.decode_sock, "-k", str(keys[i]), "-n", str(per),
                       "--seed", str(i + 1), "--timeout", "300"]
            decs.append(subprocess.Popen(pinned(cmd, a.client_cpus), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True))
            wait_for(f"decode client {i} registered", keys[i].exists, procs=decs)
        wait_for("decode clients connected",
                 lambda: admin(a.decode_admin, "status")["clients"] == base + w, procs=decs)
        pbase = admin(a.prefill_admin, "status")
        for i in range(w):
            out = tmp / f"prefill.{tag}.{i}.out"
            outs.append(out)
            if a.mode == "host":
                cmd = [a.bench, "prefill", "-s", a.prefill_sock, "--peer", a.peer, "--key-file", str(gos[i]),
                       "--size", str(per), "--seed", str(i + 1), "--min-seg", str(a.seg), "--max-seg",
                       str(a.seg), "--segs-per-xfer", str(a.per_xfer), "--linear", "--inflight",
                       str(a.inflight), "--wait-key", "120", "--json"]
            else:
                cmd = [a.gpu_client, "prefill", "-s", a.prefill_sock, "-k", str(gos[i]), "-n", str(per),
                       "-p", a.peer, "--seed", str(i + 1), "--page", str(a.seg), "--pages-per-xfer",
                       str(a.per_xfer), "--inflight", str(a.inflight)]
            pres.append(subprocess.Popen(pinned(cmd, a.client_cpus), stdout=open(out, "w"),
                                         stderr=subprocess.STDOUT))
            # One at a time, as the decode side: clients spread in connection order.
            want = pbase["clients"] + i + 1
            wait_for(f"prefill client {i} connected",
                     lambda: admin(a.prefill_admin, "status")["clients"] == want, procs=pres)
        # Registered (its source filled): each then waits for its key.
        wait_for("prefill clients registered",
                 lambda: admin(a.prefill_admin, "status")["regions"] == pbase["regions"] + w, procs=pres)
        st = admin(a.prefill_admin, "stats")
        placed = sorted(c["worker"] for c in st["clients"])
        if placed != list(range(w)):
            log(f"warning: prefill clients on workers {placed}, expected one per worker")
        cpu0 = cpu_seconds(a.prefill_pid) + cpu_seconds(a.decode_pid)
        for k, g in zip(keys, gos):
            os.link(k, g)  # every prefill client sees its key within one poll (20 ms)
        for i, p in enumerate(pres):
            if p.wait(timeout=600) != 0:
                raise RuntimeError(f"prefill client {i} failed: {outs[i].read_text()[-2000:]}")
        cpu1 = cpu_seconds(a.prefill_pid) + cpu_seconds(a.decode_pid)
        for i, p in enumerate(decs):
            out, _ = p.communicate(timeout=600)
            ok = "decode: verified" in out if a.mode == "host" else re.search(r", 0 mismatches", out)
            if p.returncode != 0 or not ok:
                raise RuntimeError(f"decode client {i} did not verify its bytes: {out[-2000:]}")
    finally:
        kill_all(decs + pres)
    starts, ends = [], []
    for out in outs:
        text = out.read_text()
        if a.mode == "host":
            d = json.loads(next(l for l in text.splitlines() if l.startswith("{")))
            starts.append(d["start_ns"])
            ends.append(d["end_ns"])
        else:
            m = re.search(r"prefill-clock: start_ns (\d+) end_ns (\d+)", text)
            if not m:
                raise RuntimeError(f"no clock line from gpu_client: {text[-500:]}")
            starts.append(int(m.group(1)))
            ends.append(int(m.group(2)))
    span = (max(ends) - min(starts)) / 1e9
    total = per * w
    return {"kind": "kvproxy", "mode": a.mode, "workers": w, "seg": a.seg, "rep": a.rep, "bytes": total,
            "seconds": span, "gbytes_per_s": total / span / 1e9, "cpu_s": cpu1 - cpu0,
            "cpu_s_per_gb": (cpu1 - cpu0) / (total / 1e9), "placement": placed}


def free_ports(n: int) -> List[int]:
    """@p n loopback ports free now (bound and let go)."""
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def nth_cpu(cpus: Optional[str], i: int) -> Optional[str]:
    """The i-th CPU of a comma list, round robin (None: no list, unpinned)."""
    lst = cpus.split(",") if cpus else []
    return lst[i % len(lst)] if lst else None


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_iperf(a: argparse.Namespace) -> Dict:
    w = a.workers
    ports = free_ports(w)
    servers = []
    cpu0 = children_cpu_s()
    try:
        for i, port in enumerate(ports):
            servers.append(subprocess.Popen(
                pinned(["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(port)], nth_cpu(a.server_cpus, i)),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.3)  # let the servers listen; a client that comes too early retries below
        clients = [subprocess.Popen(
            pinned(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-t", str(a.seconds), "-J"],
                   nth_cpu(a.client_cpus, i)),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i, port in enumerate(ports)]
        bps = 0.0
        nbytes = 0
        for c in clients:
            out, _ = c.communicate(timeout=a.seconds + 60)
            d = json.loads(out)
            if "error" in d:
                raise RuntimeError(f"iperf3: {d['error']}")
            bps += d["end"]["sum_received"]["bits_per_second"]
            nbytes += d["end"]["sum_received"]["bytes"]
        for s in servers:
            s.wait(timeout=30)
    finally:
        kill_all(servers)
    cpu = children_cpu_s() - cpu0
    return {"kind": "iperf3", "workers": w, "rep": a.rep, "bytes": nbytes, "gbytes_per_s": bps / 8e9,
            "cpu_s": cpu, "cpu_s_per_gb": cpu / (nbytes / 1e9) if nbytes else None}


def run_stream(a: argparse.Namespace) -> Dict:
    w = a.workers
    per = a.size // w
    ports = free_ports(w)
    cpu0 = children_cpu_s()
    sinks: List[subprocess.Popen] = []
    try:
        for i, port in enumerate(ports):
            sinks.append(subprocess.Popen(
                pinned([a.stream, "sink", "--addr", f"127.0.0.1:{port}", "--span", str(per)],
                       nth_cpu(a.server_cpus, i)),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # A source retries its connect until its sink listens (10 s).
        srcs = [subprocess.Popen(
            pinned([a.stream, "source", "--addr", f"127.0.0.1:{port}", "--span", str(per), "--total", str(per),
                    "--warmup", str(min(per, 256 << 20)), "--json"], nth_cpu(a.client_cpus, i)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i, port in enumerate(ports)]
        gbps = 0.0
        for c in srcs:
            out, err = c.communicate(timeout=600)
            if c.returncode != 0:
                raise RuntimeError(f"kvp-tcp-stream source failed: {err[-500:]}")
            gbps += json.loads(next(l for l in out.splitlines() if l.startswith("{")))["gbps"]
    finally:
        kill_all(sinks)
    cpu = children_cpu_s() - cpu0
    moved = per * w + min(per, 256 << 20) * w
    return {"kind": "stream", "workers": w, "rep": a.rep, "bytes": per * w, "gbytes_per_s": gbps / 8,
            "cpu_s": cpu, "cpu_s_per_gb": cpu / (moved / 1e9)}


SERIES = [("host", 4194304, "host 4 MiB blocks"), ("host", 65536, "host 64 KiB pages"),
          ("gpu", 4194304, "GPU 4 MiB blocks"), ("gpu", 65536, "GPU 64 KiB pages")]


def report(a: argparse.Namespace) -> int:
    rows = [json.loads(l) for l in open(a.results) if l.strip().startswith("{")]
    notes = [json.loads(l) for l in open(a.results) if l.strip().startswith('"')]
    ws = sorted({r["workers"] for r in rows})
    out: Dict = {"size": a.size, "reps": a.reps, "notes": notes, "cpus": a.cpus, "figures": []}
    print("\nW workers per daemon, loopback, %s per figure, best and median of %d; "
          "x iperf3: best over iperf3's best at that W; CPU s/GB: median" %
          (f"{a.size / (1 << 30):g} GiB", a.reps))
    hdr = "%-3s %-22s %10s %10s %9s %9s" % ("W", "series", "GB/s", "median", "x iperf3", "CPU s/GB")
    print(hdr)
    for w in ws:
        ip = [r for r in rows if r["kind"] == "iperf3" and r["workers"] == w]
        ipb = max((r["gbytes_per_s"] for r in ip), default=None)
        if ip:
            cpu = statistics.median(r["cpu_s_per_gb"] for r in ip)
            print("%-3d %-22s %10.2f %10.2f %9s %9.3f" % (w, f"iperf3 {w} x 1 stream", ipb,
                                                         statistics.median(r["gbytes_per_s"] for r in ip),
                                                         "1.00", cpu))
            out["figures"].append({"workers": w, "series": "iperf3", "gbytes_per_s": ipb,
                                   "median_gbytes_per_s": statistics.median(r["gbytes_per_s"] for r in ip),
                                   "cpu_s_per_gb": cpu, "samples": [r["gbytes_per_s"] for r in ip]})
        else:
            print("%-3d %-22s %10s" % (w, "iperf3", "skipped"))
        st = [r for r in rows if r["kind"] == "stream" and r["workers"] == w]
        stb = max((r["gbytes_per_s"] for r in st), default=None)
        if st:
            med = statistics.median(r["gbytes_per_s"] for r in st)
            cpu = statistics.median(r["cpu_s_per_gb"] for r in st)
            print("%-3d %-22s %10.2f %10.2f %9.2f %9.3f   (x stream 1.00)" % (
                w, f"TCP {w} x 1, same bytes", stb, med, stb / ipb if ipb else 0, cpu))
            out["figures"].append({"workers": w, "series": "stream", "gbytes_per_s": stb,
                                   "median_gbytes_per_s": med, "ratio_iperf3": stb / ipb if ipb else None,
                                   "cpu_s_per_gb": cpu, "samples": [r["gbytes_per_s"] for r in st]})
        for mode, seg, name in SERIES:
            rs = [r for r in rows if r["kind"] == "kvproxy" and r["workers"] == w and r["mode"] == mode
                  and r["seg"] == seg]
            if not rs:
                continue
            best = max(r["gbytes_per_s"] for r in rs)
            med = statistics.median(r["gbytes_per_s"] for r in rs)
            cpu = statistics.median(r["cpu_s_per_gb"] for r in rs)
            ratio = best / ipb if ipb else None
            host = [r for r in rows if r["kind"] == "kvproxy" and r["workers"] == w and r["mode"] == "host"
                    and r["seg"] == seg]
            vs_host = best / max(r["gbytes_per_s"] for r in host) if mode == "gpu" and host else None
            vs_stream = best / stb if stb else None
            print("%-3d %-22s %10.2f %10.2f %9s %9.3f%s%s" % (
                w, name, best, med, f"{ratio:.2f}" if ratio else "-", cpu,
                f"   (x stream {vs_stream:.2f})" if vs_stream else "",
                f"   GPU/host {vs_host:.2f}" if vs_host else ""))
            out["figures"].append({"workers": w, "series": name, "mode": mode, "seg": seg,
                                   "gbytes_per_s": best, "median_gbytes_per_s": med, "ratio_iperf3": ratio,
                                   "ratio_stream": vs_stream,
                                   "ratio_gpu_host": vs_host, "cpu_s_per_gb": cpu,
                                   "samples": [r["gbytes_per_s"] for r in rs],
                                   "placement": rs[0].get("placement")})
    for n in notes:
        print(f"note: {n}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {a.json}")
    if a.png:
        chart(out, a.png)
    return 0


def chart(out: Dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib here: no chart (apt-get install python3-matplotlib, or pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = {"iperf3": ("k", "--", "o"), "stream": ("tab:gray", "-.", "d"), "host 4 MiB blocks": ("tab:blue", "-", "s"),
              "host 64 KiB pages": ("tab:blue", ":", "^"), "GPU 4 MiB blocks": ("tab:green", "-", "s"),
              "GPU 64 KiB pages": ("tab:green", ":", "^")}
    for name, (col, ls, mk) in styles.items():
        pts = sorted((f["workers"], f["gbytes_per_s"]) for f in out["figures"] if f["series"] == name)
        if pts:
            label = {"iperf3": "iperf3, W processes x 1 stream",
                     "stream": "W TCP streams, kvproxy's bytes"}.get(name, "kvproxy " + name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=col, linestyle=ls, marker=mk, label=label)
    ax.set_xlabel("worker lcores per kvproxyd (W)")
    ax.set_ylabel("GB/s")
    ax.set_title("kvproxy over loopback vs iperf3, %g GiB per figure" % (out["size"] / (1 << 30)))
    ax.set_xticks(sorted({f["workers"] for f in out["figures"]}))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", choices=["host", "gpu"], required=True)
    r.add_argument("--workers", type=int, required=True)
    r.add_argument("--size", type=int, required=True)
    r.add_argument("--seg", type=int, required=True)
    r.add_argument("--per-xfer", type=int, required=True)
    r.add_argument("--inflight", type=int, default=8)
    r.add_argument("--rep", type=int, default=0)
    for k in ("prefill-sock", "decode-sock", "prefill-admin", "decode-admin", "tmp"):
        r.add_argument("--" + k, required=True)
    r.add_argument("--prefill-pid", type=int, required=True)
    r.add_argument("--decode-pid", type=int, required=True)
    r.add_argument("--peer", default="decode0")
    r.add_argument("--bench")
    r.add_argument("--gpu-client")
    r.add_argument("--client-cpus")
    i = sub.add_parser("iperf")
    i.add_argument("--workers", type=int, required=True)
    i.add_argument("--seconds", type=int, default=5)
    i.add_argument("--rep", type=int, default=0)
    i.add_argument("--client-cpus")
    i.add_argument("--server-cpus")
    t = sub.add_parser("stream")
    t.add_argument("--workers", type=int, required=True)
    t.add_argument("--size", type=int, required=True)
    t.add_argument("--stream", required=True)
    t.add_argument("--rep", type=int, default=0)
    t.add_argument("--client-cpus")
    t.add_argument("--server-cpus")
    p = sub.add_parser("report")
    p.add_argument("--results", required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--reps", type=int, required=True)
    p.add_argument("--cpus", default="")
    p.add_argument("--json")
    p.add_argument("--png")
    a = ap.parse_args()
    if a.cmd == "report":
        return report(a)
    res = run_figure(a) if a.cmd == "run" else run_stream(a) if a.cmd == "stream" else run_iperf(a)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
