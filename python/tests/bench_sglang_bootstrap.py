#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Bootstrap latency of kvproxy.sglang: decode ``init()`` to prefill ``WaitingForInput``.

Eight attention-TP ranks per side (``--ranks``), each a process of its own
(``sglang_harness.py``) with its own manager and kvproxy client, driven as
sglang's schedulers drive them (MIN all-reduce of ``poll()`` per side);
``--requests`` requests of one page each, ``--inflight`` at a time. For
every (request, rank) it takes the decode rank's ``init()`` time and the
matching prefill rank's time of ``WaitingForInput`` (the metadata arrived;
CLOCK_MONOTONIC, one host), and prints p50/p99/max of:

* init -> WaitingForInput per rank pair (what the decode scheduler's loop
  adds: handshake all-reduce, prealloc, ``send_metadata``, plus the message);
* send_metadata -> WaitingForInput (the message alone: one trip over the
  manager channel);
* per request, the last rank's WaitingForInput after the first rank's init;

beside a reference measured in the same run: the round trip of a 1 KiB
message between two Python processes over loopback TCP.

Perf suite (not in CI): ``meson test -C build --suite perf bench-sglang-bootstrap -v``,
or run it directly with KVPROXYD/KVPROXY_LIB set. ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402
import test_sglang_ranks as tr  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(xs):
    ms = [x * 1e3 for x in xs]
    return {"n": len(ms), "p50_ms": round(pct(ms, 50), 3), "p99_ms": round(pct(ms, 99), 3), "max_ms": round(max(ms), 3),
            "mean_ms": round(statistics.mean(ms), 3)}


def tcp_rtt(n: int = 1000):
    """Round trips of 1 KiB between this process and an echo process over loopback TCP."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    echo = subprocess.Popen([sys.executable, "-c", f"""
import socket
s = socket.create_connection(("127.0.0.1", {port}))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    b = s.recv(1024)
    if not b:
        break
    s.sendall(b)
"""])
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(n):
        t0 = time.monotonic()
        c.sendall(b"x" * 1024)
        got = 0
        while got < 1024:
            got += len(c.recv(1024 - got))
        out.append(time.monotonic() - t0)
    c.close()
    srv.close()
    echo.wait(timeout=30)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args()
    tb.require_daemon_and_library()
    c = tr.Cluster("bench")
    try:
        p = c.daemon("prefill0", [("decode0", "127.0.0.1:0")])
        d = c.daemon("decode0", [("prefill0", f"127.0.0.1:{p.port}")])
        p.conf.write_text(p.conf.read_text().replace("127.0.0.1:0", f"127.0.0.1:{d.port}"))
        port = c.bootstrap()
        common = dict(tp_size=a.ranks, bootstrap_port=port, layers=1, pages=2 * a.inflight + 2, item=4096)
        for rank in range(a.ranks):
            c.rank(name=f"p{rank}", role="prefill", group="p", engine_rank=rank, socket=p.sock, **common)
            c.rank(name=f"d{rank}", role="decode", group="d", engine_rank=rank, socket=d.sock, **common)
        coord = c.start()
        ref = tcp_rtt()
        t_init, t_meta, t_wait = {}, {}, {}
        done_rooms = 0
        next_room = 1
        free = list(range(a.inflight))  # page and aux row of each request in flight: its own
        slot_of = {}
        t_start = time.monotonic()
        while done_rooms < a.requests:
            while free and next_room <= a.requests:
                slot = slot_of[next_room] = free.pop()
                r = {"room": next_room, "host": "127.0.0.1", "port": port, "src": [slot], "dst": [slot], "chunk": 1,
                     "aux_src": slot, "aux_dst": slot}
                coord.command("p", {"op": "add", "req": r})
                coord.command("d", {"op": "add", "req": r})
                next_room += 1
            e = coord.wait_event(lambda e: e.get("ev") in ("done", "bootstrapped", "failed"), tr.T, "a request event")
            if e["ev"] == "failed":
                raise AssertionError(f"request failed: {e}")
            tp = int(e["rank"][1:])
            if e["ev"] == "bootstrapped":
                t_wait[(e["room"], tp)] = e["t_waiting"]
            elif e["rank"].startswith("d"):
                if e["bad"]:
                    raise AssertionError(f"room {e['room']}: {e['bad']} pages differ on {e['rank']}")
                t_init[(e["room"], tp)] = e["t_init"]
                t_meta[(e["room"], tp)] = e["t_meta"]
                if sum(1 for k in t_init if k[0] == e["room"]) == a.ranks:
                    done_rooms += 1
                    free.append(slot_of.pop(e["room"]))
        wall = time.monotonic() - t_start
        pairs = [t_wait[k] - t_init[k] for k in t_init if k in t_wait]
        one_way = [t_wait[k] - t_meta[k] for k in t_meta if k in t_wait and t_meta[k] is not None]
        per_req = []
        for room in range(1, a.requests + 1):
            inits = [t_init[(room, t)] for t in range(a.ranks) if (room, t) in t_init]
            waits = [t_wait[(room, t)] for t in range(a.ranks) if (room, t) in t_wait]
            if len(inits) == len(waits) == a.ranks:
                per_req.append(max(waits) - min(inits))
        out = {"ranks_per_side": a.ranks, "requests": a.requests, "inflight": a.inflight, "wall_s": round(wall, 2),
               "init_to_waiting": summary(pairs), "send_metadata_to_waiting": summary(one_way),
               "per_request_first_init_to_last_waiting": summary(per_req), "reference_tcp_rtt_1k": summary(ref)}
        print(json.dumps(out, indent=2))
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
