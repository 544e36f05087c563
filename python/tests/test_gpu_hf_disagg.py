#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""GPU test of examples/hf_disagg: a transformers model's prefill and decode
in separate processes, joined by two kvproxyd on loopback, produce exactly
the tokens of the same model run in one process; and the waterfall of every
request adds up.

For each mode (one decode rank; the KV heads split over two decode ranks,
Segment2D head slices, reassembled on rank 0) it runs prefill.py and
decode.py for prompts of $KVP_HF_PROMPTS tokens (default 77,1000,8192: one
not a multiple of the 16-token page, one 8k), checks that the decode side
reports equal tokens for every request and exits 0, then runs
tools/kvp-waterfall over the requests' records: every transfer's kvproxy
phases must add up to its end-to-end time within 1 % on each node. The
prefill node's `slowest` (admin) goes through the tool too. The waterfall
text, PNG (where matplotlib is installed), SVG and the records are written
to $KVP_HF_OUT (default: a new temp dir, kept), and the longest request's
figures (KV bytes, each node's phases, the transfer's share of TTFT) are
printed at the end.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both; from a bundle of
tools/bundle.sh point them into BUNDLE/build and set
LD_LIBRARY_PATH=BUNDLE/libs and KVP_EAL_EXTRA="-d
BUNDLE/libs/librte_mempool_ring.so.23"), KVP_HF_PROMPTS, KVP_HF_OUT,
KVP_HF_TOKENS (16), KVP_HF_MODEL (small), KVP_HF_DEVICE (cuda; cpu runs it
on a host with transformers and no GPU). Exit status: 0 pass, 1 fail, 77 no
GPU, no PyTorch or no transformers (with the reason).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLE = ROOT / "examples" / "hf_disagg"
WATERFALL = ROOT / "tools" / "kvp-waterfall"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

DEVICE = os.environ.get("KVP_HF_DEVICE", "cuda")
try:
    import torch
except Exception as e:  # noqa: BLE001
    tb.skip_all(f"PyTorch is not installed ({e})")
try:
    import transformers
except Exception as e:  # noqa: BLE001
    tb.skip_all(f"transformers is not installed ({e})")
if DEVICE == "cuda" and not torch.cuda.is_available():
    tb.skip_all("no CUDA GPU visible to PyTorch")

PROMPTS = os.environ.get("KVP_HF_PROMPTS", "77,1000,8192")
TOKENS = os.environ.get("KVP_HF_TOKENS", "16")
MODEL = os.environ.get("KVP_HF_MODEL", "small")
RUN_TIMEOUT = 420.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} test_gpu_hf_disagg] {msg}", file=sys.stderr, flush=True)


def run_mode(tmp: Path, out: Path, prefill: tb.Daemon, decode: tb.Daemon, ranks: int) -> List[str]:
    """prefill.py and decode.py (one process per rank); returns the problems found."""
    mailbox, records = tmp / f"mailbox.{ranks}", out / f"records-{ranks}rank.jsonl"
    records.unlink(missing_ok=True)
    common = ["--mailbox", str(mailbox), "--prompts", PROMPTS, "--ranks", str(ranks), "--model", MODEL,
              "--device", DEVICE]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    procs = []
    for r in range(ranks):
        extra = ["--records", str(records)] if r == 0 else []
        procs.append((f"decode rank {r}", subprocess.Popen(
            [sys.executable, str(EXAMPLE / "decode.py"), "--socket", decode.sock, "--rank", str(r),
             "--tokens", TOKENS, *common, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, preexec_fn=tb.die_with_parent)))
    procs.append(("prefill", subprocess.Popen(
        [sys.executable, str(EXAMPLE / "prefill.py"), "--socket", prefill.sock, *common], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=tb.die_with_parent)))
    problems, outputs = [], {}
    deadline = time.monotonic() + RUN_TIMEOUT
    for name, p in procs:
        try:
            outputs[name], _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            outputs[name], _ = p.communicate()
            problems.append(f"{ranks} rank(s): {name} did not finish within {RUN_TIMEOUT}s")
        sys.stderr.write("".join(f"  {name}| {line}\n" for line in outputs[name].splitlines()))
        if p.returncode != 0 and not problems:
            problems.append(f"{ranks} rank(s): {name} exited with {p.returncode}")
    if problems:
        return problems
    n = len(PROMPTS.split(","))
    equal = outputs["decode rank 0"].count("tokens equal")
    if equal != n:
        problems.append(f"{ranks} rank(s): {equal} of {n} requests report tokens equal to one process")
    lines = records.read_text().splitlines() if records.exists() else []
    if len(lines) != n or not all(json.loads(x)["check"]["tokens_equal"] for x in lines):
        problems.append(f"{ranks} rank(s): {len(lines)} records of {n}, or one says the tokens differ")
    return problems or waterfall(records, out / f"waterfall-{ranks}rank", n)


def waterfall(records: Path, stem: Path, n: int) -> List[str]:
    """The tool over the records: exit 0 (3: no matplotlib, then the SVG must be there), all add up."""
    r = subprocess.run([sys.executable, str(WATERFALL), str(records), "--top", str(n), "--png", f"{stem}.png",
                        "--svg", f"{stem}.svg"], capture_output=True, text=True, timeout=120)
    Path(f"{stem}.txt").write_text(r.stdout)
    sys.stderr.write(r.stdout + r.stderr)
    problems = []
    if r.returncode not in (0, 3) or (r.returncode == 3 and "matplotlib" not in r.stderr):
        problems.append(f"kvp-waterfall {records.name}: exit {r.returncode}")
    if "add up within 1 % on their node" not in r.stdout or "do not add up" in r.stdout:
        problems.append(f"kvp-waterfall {records.name}: phases do not add up on every node")
    if not Path(f"{stem}.svg").exists() or (r.returncode == 0 and not Path(f"{stem}.png").exists()):
        problems.append(f"kvp-waterfall {records.name}: no picture written")
    return problems


def report(out: Path) -> None:
    """The longest request of the one-rank run: the figures the issue asks for."""
    recs = [json.loads(x) for x in (out / "records-1rank.jsonl").read_text().splitlines()]
    r = max(recs, key=lambda x: x["tokens"])
    ttft = r["ttft"]["end"] - r["ttft"]["start"]
    start = min(e["t_submit"] for e in r["send"])
    end = max(e["t_seen"] for e in r["landed"])
    print(f"\n== {r['tokens']}-token request ({MODEL} model, {DEVICE}, 1 decode rank) ==")
    print(f"KV bytes per request: {r['kv_bytes']} ({r['kv_bytes'] / 2**20:.1f} MiB) in {len(r['send'])} transfer(s)")
    for e in r["send"]:
        print(f"  {e['node']} (sender) transfer {e['user_id']:#x}: "
              + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in e["phases"].items()) + " ms")
    for e in r["landed"]:
        print(f"  {e['node']} (receiver) transfer {e['user_id']:#x}: "
              + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in e["phases"].items()) + " ms")
    for p in r["phases"]:
        print(f"  {p['lane']}: {p['name']} {p['dur'] * 1e3:.3f} ms")
    print(f"TTFT {ttft * 1e3:.2f} ms; transfer (first submit -> last landing) {(end - start) * 1e3:.2f} ms "
          f"= {(end - start) / ttft * 100:.1f} % of TTFT")
    print(f"outputs in {out}")


def main() -> int:
    tb.require_daemon_and_library()
    tmp = Path(tempfile.mkdtemp(prefix="kvp-hf."))
    out = Path(os.environ.get("KVP_HF_OUT") or tempfile.mkdtemp(prefix="kvp-hf-out."))
    out.mkdir(parents=True, exist_ok=True)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, prompts {PROMPTS}; output in {out}")
    prefill, decode = tb.start_pair(tmp, "prefill0", "decode0")
    problems: List[str] = []
    try:
        for ranks in (1, 2):
            t = time.monotonic()
            found = run_mode(tmp, out, prefill, decode, ranks)
            log(f"{ranks} decode rank(s): {'ok' if not found else 'FAILED'} in {time.monotonic() - t:.1f} s")
            problems += found
        slow = out / "slowest-prefill0.json"
        slow.write_text(json.dumps(prefill.admin_call("slowest")))
        r = subprocess.run([sys.executable, str(WATERFALL), "--slowest", str(slow), "--node", "prefill0", "--top", "3"],
                           capture_output=True, text=True, timeout=60)
        sys.stderr.write(r.stdout + r.stderr)
        if r.returncode != 0:
            problems.append(f"kvp-waterfall --slowest: exit {r.returncode}")
        if not problems:
            report(out)
    finally:
        for d in reversed(tb.STARTED):
            p = d.stop()
            if p:
                problems.append(p + "\n" + d.log_tail())
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    if problems or os.environ.get("KVP_KEEP"):
        log(f"kept {tmp} (daemon configs and logs, mailboxes)")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
