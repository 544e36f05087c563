#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Multi-rank harness for kvproxy.sglang: several worker processes per side,
each with its own manager (its own kvproxy client), driven through the call
sequence of sglang's schedulers, with the MIN all-reduce of ``poll()`` across
the ranks of a request's attention group.

Layout:

* ``Coordinator`` (in the test process) listens on a UNIX socket (a path, so
  ranks in other network namespaces reach it too). Every rank process joins
  a *group* (the attention-TP ranks of one DP rank on one side: sglang's
  ``attn_tp_cpu_group``). Per scheduler iteration each rank calls ``sync``
  (a barrier of its group that hands every member the same new commands,
  as sglang broadcasts new requests to its TP ranks) and ``allreduce`` (MIN
  over the group, element-wise: sglang's ``poll_and_all_reduce``).
* ``rank`` mode (this file run as a script) is one worker: its KV cache in
  host memory (memfds), its manager, and a scheduler loop modelled on
  ``disaggregation/prefill.py`` (bootstrap queue -> init -> chunked
  ``send`` -> inflight queue, ``clear()`` on Success, ``failure_exception()``
  only on Failed) or ``decode.py`` (receiver -> resolve prefill DP rank ->
  ``init`` -> handshake waiters -> ``send_metadata`` (+
  ``submit_prefill_recompute`` on rebootstrap) -> transfer queue ->
  ``clear()``). Ranks report events (done, failed, timings, page checks) to
  the coordinator.

Page contents: page ``i`` of a request in buffer ``b`` on attention-TP rank
``t`` holds a 32-byte block (room, t, b, i) repeated; the decode side checks
every byte of every page it received. With a ``model`` in the rank's config
the KV cache and state are instead the rank's shard of a global cache
(sglang_model.py): the decode side checks every byte of its shard, and that
every page and state row outside the requests in flight stays zero.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import queue
import struct
import sys
import threading
import time
import traceback
from multiprocessing.connection import Client as ConnClient
from multiprocessing.connection import Listener, wait as conn_wait
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

AUTH = b"kvproxy-harness"
FAILED, BOOTSTRAPPING, WAITING, TRANSFERRING, SUCCESS = 0, 1, 2, 3, 4


# ---------------------------------------------------------------- coordinator

class Coordinator:
    """Barriers, all-reduces and command fan-out for the rank processes.

    :param path: the UNIX socket path.
    :param groups: group name -> number of ranks in it.
    """

    def __init__(self, path: str, groups: Dict[str, int]) -> None:
        self.path = path
        self.groups = dict(groups)
        self.listener = Listener(address=path, family="AF_UNIX", authkey=AUTH)
        self.conns: Dict[str, Any] = {}  # rank name -> connection
        self.member: Dict[str, str] = {}  # rank name -> group
        self.events: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.seen: List[Dict[str, Any]] = []
        self._lock = threading.Lock()
        self._commands: Dict[str, List[Dict[str, Any]]] = {g: [] for g in groups}
        self._sync: Dict[str, Dict[str, bool]] = {g: {} for g in groups}
        self._reduce: Dict[str, Dict[str, List[int]]] = {g: {} for g in groups}
        self._stop = False
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()
        self._loop = threading.Thread(target=self._serve, daemon=True)
        self._loop.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                c = self.listener.accept()
            except OSError:
                return
            name, group = c.recv()
            with self._lock:
                self.conns[name] = c
                self.member[name] = group

    def wait_joined(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if len(self.conns) >= n:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.conns)} of {n} ranks joined within {timeout}s: "
                                     f"{sorted(self.conns)}; events: {self.drain()[-5:]}")
            e = self._next_event(0.05)
            if e is not None:
                self.seen.append(e)

    def command(self, group: str, cmd: Dict[str, Any]) -> None:
        """Hand ``cmd`` to every rank of ``group`` at their next common iteration."""
        with self._lock:
            self._commands[group].append(cmd)

    def direct(self, rank: str, cmd: Dict[str, Any]) -> None:
        """``cmd`` to one rank only, at its next iteration (e.g. an injected failure)."""
        with self._lock:
            self._commands.setdefault("@" + rank, []).append(cmd)

    def _send_locked(self, name: str, msg: Any) -> None:
        """Send to a rank (self._lock held); a rank killed meanwhile is gone, not an error of the server."""
        c = self.conns.get(name)
        if c is None:
            return
        try:
            c.send(msg)
        except (OSError, EOFError):
            self.conns.pop(name, None)
            self.events.put({"ev": "gone", "rank": name})

    def _serve(self) -> None:
        idle_since: Dict[str, float] = {}
        while not self._stop:
            with self._lock:
                conns = dict(self.conns)
            if not conns:
                time.sleep(0.01)  # nothing joined yet: no connection to wait on
                continue
            ready = conn_wait(list(conns.values()), timeout=0.02)
            now = time.monotonic()
            for c in ready:
                name = next(k for k, v in conns.items() if v is c)
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    with self._lock:
                        self.conns.pop(name, None)
                    self.events.put({"ev": "gone", "rank": name})
                    continue
                g = self.member[name]
                kind = msg[0]
                if kind == "sync":
                    self._sync[g][name] = msg[1]  # idle?
                elif kind == "allreduce":
                    self._reduce[g][name] = msg[1]
                elif kind == "event":
                    self.events.put(msg[1])
            with self._lock:
                for g, n in self.groups.items():
                    members = [k for k, v in self.member.items() if v == g and k in self.conns]
                    if len(self._sync[g]) == n and len(members) == n:
                        cmds = self._commands[g]
                        idle = all(self._sync[g].values()) and not cmds and not any(
                            self._commands.get("@" + m) for m in members)
                        # An idle group waits here (up to 50 ms) for work rather than spinning.
                        if idle and now - idle_since.setdefault(g, now) < 0.05:
                            continue
                        idle_since.pop(g, None)
                        self._commands[g] = []
                        for m in members:
                            own = self._commands.pop("@" + m, [])
                            self._send_locked(m, ("cmds", cmds + own))
                        self._sync[g] = {}
                    if len(self._reduce[g]) == n and len(members) == n:
                        vecs = list(self._reduce[g].values())
                        if len({len(v) for v in vecs}) != 1:
                            self.events.put({"ev": "error", "rank": g, "error": f"all-reduce lengths differ: {vecs}"})
                        out = [min(col) for col in zip(*vecs)]
                        for m in members:
                            self._send_locked(m, ("reduced", out))
                        self._reduce[g] = {}

    def _next_event(self, timeout: float) -> Optional[Dict[str, Any]]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def wait_event(self, pred: Callable[[Dict[str, Any]], bool], timeout: float, what: str = "") -> Dict[str, Any]:
        """The first event (seen before or arriving within ``timeout``) matching ``pred``; errors raise."""
        for e in self.seen:
            if pred(e):
                self.seen.remove(e)
                return e
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no event {what} within {timeout}s; recent: {self.seen[-8:]}")
            e = self._next_event(min(left, 0.1))
            if e is None:
                continue
            if e.get("ev") == "error":
                raise AssertionError(f"rank {e.get('rank')} failed: {e.get('error')}")
            if pred(e):
                return e
            self.seen.append(e)

    def drain(self) -> List[Dict[str, Any]]:
        while True:
            e = self._next_event(0)
            if e is None:
                return self.seen
            self.seen.append(e)

    def close(self, timeout: float = 30.0) -> None:
        """Every rank exits at its group's next barrier (not in the middle of an
        all-reduce); bounded, then the coordinator stops."""
        for g in self.groups:
            self.command(g, {"op": "exit"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self.conns:
                    break
            e = self._next_event(0.05)
            if e is not None:
                self.seen.append(e)
        self._stop = True
        try:
            self.listener.close()
        except OSError:
            pass


# ------------------------------------------------------------------ rank side

def pattern(room: int, tp: int, b: int, i: int, n: int) -> bytes:
    blk = struct.pack("<QQQQ", room & (2**64 - 1), tp, b, i)
    return (blk * (n // 32 + 1))[:n]


class Kv:
    """A worker's paged KV cache: K buffers in one memfd, V buffers in another, aux rows in plain memory."""

    def __init__(self, layers: int, pages: int, item: int, aux_rows: int, aux_items: List[int]) -> None:
        import kvproxy

        self.pages, self.item, self.nbuf = pages, item, 2 * layers
        self.bufs = [kvproxy.HostBuffer(layers * pages * item) for _ in range(2)]
        bases = [ctypes.addressof(ctypes.c_char.from_buffer(h)) for h in self.bufs]
        self.ptrs = [bases[b // layers] + (b % layers) * pages * item for b in range(self.nbuf)]
        self.aux_items = aux_items
        self.aux = [(ctypes.c_char * (aux_rows * it))() for it in aux_items]

    def write(self, b: int, page: int, data: bytes) -> None:
        ctypes.memmove(self.ptrs[b] + page * self.item, data, len(data))

    def read(self, b: int, page: int) -> bytes:
        return ctypes.string_at(self.ptrs[b] + page * self.item, self.item)

    def digest(self, pages: List[int]) -> str:
        h = hashlib.sha256()
        for b in range(self.nbuf):
            for p in pages:
                h.update(self.read(b, p))
        return h.hexdigest()


class Rank:
    """One worker process: manager + scheduler loop."""

    def __init__(self, cfg: Dict[str, Any]) -> None:
        self.cfg = cfg
        self.name = cfg["name"]
        self.conn = ConnClient(cfg["coord"], family="AF_UNIX", authkey=AUTH)
        self.conn.send((self.name, cfg["group"]))
        import kvproxy.sglang as ks

        self.ks = ks
        self.model = cfg.get("model")
        aux_items = cfg.get("aux_items", [64, 192])
        if self.model:
            from sglang_model import ShardedKv

            self.kv = ShardedKv(self.model, cfg["tp_size"], cfg["engine_rank"] % cfg["tp_size"], cfg.get("pp_size", 1),
                                cfg.get("pp_rank", 0), bool(cfg.get("gpu")))
            self.aux = [(ctypes.c_char * (cfg.get("aux_rows", 16) * it))() for it in aux_items]
            fields = self.kv.kv_args_fields()
        else:
            self.kv = Kv(cfg["layers"], cfg["pages"], cfg["item"], cfg.get("aux_rows", 16), aux_items)
            self.aux = self.kv.aux
            fields = dict(page_size=cfg.get("page_size", 16), kv_data_ptrs=list(self.kv.ptrs),
                          kv_data_lens=[cfg["pages"] * cfg["item"]] * self.kv.nbuf,
                          kv_item_lens=[cfg["item"]] * self.kv.nbuf)
        self.aux_items = list(aux_items)
        args = ks.KVArgs(engine_rank=cfg["engine_rank"], gpu_id=0, system_dp_rank=cfg.get("system_dp_rank", 0),
                         pp_rank=cfg.get("pp_rank", 0), aux_data_ptrs=[ctypes.addressof(a) for a in self.aux],
                         aux_data_lens=[len(a) for a in self.aux], aux_item_lens=list(aux_items), **fields)
        self.sa = SimpleNamespace(
            host=cfg.get("host", "127.0.0.1"), port=cfg.get("http_port", 30000),
            disaggregation_bootstrap_port=cfg["bootstrap_port"], dist_init_addr=cfg.get("dist_init_addr"),
            tp_size=cfg["tp_size"], dp_size=cfg.get("dp_size", 1), enable_dp_attention=cfg.get("dp_attention", False),
            pp_size=cfg.get("pp_size", 1), kv_cache_dtype=cfg.get("kv_cache_dtype", "auto"),
            load_balance_method=cfg.get("lb_method", "follow_bootstrap_room"), nnodes=1)
        mode = ks.DisaggregationMode.PREFILL if cfg["role"] == "prefill" else ks.DisaggregationMode.DECODE
        cls = ks.KvproxyBackend().get_kv_class("manager")
        mla = bool(self.model and self.model.get("kind") == "mla")
        self.mgr = cls(args, mode, self.sa, mla)  # settings from $KVPROXY_* as in sglang
        self.tp = self.mgr.attn_tp_rank
        self.bootstrap_queue: List[Dict[str, Any]] = []
        self.forward: List[Dict[str, Any]] = []
        self.inflight: List[Dict[str, Any]] = []
        self.prealloc: List[Dict[str, Any]] = []
        self.pending: List[Dict[str, Any]] = []
        self.transfer: List[Dict[str, Any]] = []
        self.force_fail: set = set()
        self.stalled: set = set()
        self.snapshots: Dict[int, Dict[str, Any]] = {}
        self.ensure_last: Dict[str, float] = {}
        self.ensure_tries: Dict[str, int] = {}
        if cfg["role"] == "prefill" and not self.mgr.side.registered.wait(60):
            raise RuntimeError(f"{self.name} did not register at its bootstrap server within 60 s")
        self.event({"ev": "up", "tp": self.tp})  # a prefill server is ready once its ranks registered

    # ---- coordinator calls ----

    def event(self, e: Dict[str, Any]) -> None:
        e.setdefault("rank", self.name)
        self.conn.send(("event", e))

    def sync(self, idle: bool) -> List[Dict[str, Any]]:
        self.conn.send(("sync", idle))
        kind, cmds = self.conn.recv()
        assert kind == "cmds"
        return cmds

    def allreduce(self, vec: List[int]) -> List[int]:
        """sglang's poll_and_all_reduce: MIN over the attention group (an
        injected failure turns this rank's value for a room into Failed, as
        DISAGGREGATION_TEST_FAILURE_PROB does)."""
        self.conn.send(("allreduce", vec))
        kind, out = self.conn.recv()
        assert kind == "reduced"
        return out

    def polls(self, reqs: List[Dict[str, Any]], obj: str) -> List[int]:
        vec = [FAILED if r["room"] in self.force_fail else int(r[obj].poll()) for r in reqs]
        return self.allreduce(vec)

    # ---- the loop ----

    def run(self) -> None:
        while True:
            idle = not (self.bootstrap_queue or self.forward or self.inflight or self.prealloc or self.pending
                        or self.transfer)
            for cmd in self.sync(idle):
                op = cmd["op"]
                if op == "exit":
                    self.mgr.close()
                    return
                getattr(self, "op_" + op)(cmd)
            if self.cfg["role"] == "prefill":
                self.prefill_step()
            else:
                self.decode_step()
            if not idle:
                self.mgr.wait_for_change(0.002)  # an iteration of a busy scheduler

    # ---- commands ----

    def op_add(self, cmd: Dict[str, Any]) -> None:
        req = dict(cmd["req"])
        ks = self.ks
        addr = f"{req['host']}:{req['port']}"
        if self.cfg["role"] == "prefill":
            req["sender"] = ks.KVSender(mgr=self.mgr, bootstrap_addr=addr, bootstrap_room=req["room"],
                                        dest_tp_ranks=[self.cfg["engine_rank"]], pp_rank=self.cfg.get("pp_rank", 0),
                                        req_has_disagg_prefill_dp_rank=False)
            req["sent"] = 0
            self.bootstrap_queue.append(req)
        else:
            req["receiver"] = ks.KVReceiver(mgr=self.mgr, bootstrap_addr=addr, bootstrap_room=req["room"])
            req["addr"] = addr
            req["waiting"] = False
            self.prealloc.append(req)
            dp = self.resolve_dp(req)
            if dp is None:
                self.pending.append(req)
            else:
                req["receiver"].init(dp)

    def op_fail(self, cmd: Dict[str, Any]) -> None:
        self.force_fail.add(cmd["room"])

    def op_abort(self, cmd: Dict[str, Any]) -> None:
        """sglang's abort_request: abort() on the request's sender/receiver."""
        for q in (self.bootstrap_queue, self.forward, self.inflight, self.prealloc, self.transfer):
            for r in q:
                if r["room"] == cmd["room"]:
                    (r.get("sender") or r.get("receiver")).abort()

    def op_stall(self, cmd: Dict[str, Any]) -> None:
        """Hold the request's later chunks back (prefill) until resumed."""
        if cmd.get("resume"):
            self.stalled.discard(cmd["room"])
        else:
            self.stalled.add(cmd["room"])

    def op_recheck(self, cmd: Dict[str, Any]) -> None:
        """Compare the request's pages with their snapshot taken when clear() returned."""
        snap = self.snapshots.get(cmd["room"])
        same = snap is not None and self.kv.digest(snap["req"] if self.model else snap["pages"]) == snap["digest"]
        self.event({"ev": "recheck", "room": cmd["room"], "same": same, "had": snap is not None})

    def op_stats(self, cmd: Dict[str, Any]) -> None:
        side = self.mgr.side
        tables = {"senders": len(side.senders), "stash": len(side.stash_meta),
                  "inflight": len(side.inflight)} if self.cfg["role"] == "prefill" else {
            "receivers": len(side.receivers), "tags": len(side.by_tag), "fences": len(side.fences)}
        self.event({"ev": "stats", "tables": tables, "can_fence": getattr(side, "can_fence", None),
                    "rooms": sorted(side.senders if self.cfg["role"] == "prefill" else side.receivers)})

    # ---- prefill scheduler (prefill.py) ----

    def prefill_step(self) -> None:
        if self.bootstrap_queue:  # pop_bootstrapped
            polls = self.polls(self.bootstrap_queue, "sender")
            keep = []
            for req, poll in zip(self.bootstrap_queue, polls):
                s = req["sender"]
                if poll == BOOTSTRAPPING:
                    keep.append(req)
                elif poll == FAILED:
                    self.report_failure(req, "sender", "bootstrap")
                elif poll == WAITING:
                    prefix = s.pop_decode_prefix_len()
                    s.init(len(req["src"]), req.get("aux_src", 0))
                    self.event({"ev": "bootstrapped", "room": req["room"], "t_waiting": s.t_waiting,
                                "prefix": prefix})
                    self.write_source(req)
                    self.forward.append(req)
                else:
                    raise ValueError(f"unexpected poll {poll} in the bootstrap queue")
            self.bootstrap_queue = keep
        still = []
        for req in self.forward:  # chunked prefill: one chunk per iteration (send_kv_chunk)
            if req["room"] in self.stalled and req["sent"] > 0:
                still.append(req)
                continue
            s, chunk = req["sender"], req.get("chunk", len(req["src"]))
            start, end = req["sent"], min(req["sent"] + chunk, len(req["src"]))
            last = end == len(req["src"])
            if s.should_send_kv_chunk(end - start, last):
                state = self.kv.state_indices(req, "src") if last and self.model else None
                s.send(req["src"][start:end], state)
            req["sent"] = end
            if last:
                self.inflight.append(req)
            else:
                still.append(req)
        self.forward = still
        if self.inflight:  # process_disagg_prefill_inflight_queue
            polls = self.polls(self.inflight, "sender")
            keep = []
            for req, poll in zip(self.inflight, polls):
                s = req["sender"]
                if poll in (WAITING, TRANSFERRING):
                    keep.append(req)
                elif poll == SUCCESS:
                    s.clear()
                    m = s.get_transfer_metric()
                    self.event({"ev": "done", "room": req["room"], "bytes": m.transfer_total_bytes,
                                "segments": s.segments_submitted, "transfers": s.transfers_made})
                elif poll == FAILED:
                    self.report_failure(req, "sender", "transfer")  # no clear(): sglang does not call it here
                else:
                    raise ValueError(f"unexpected poll {poll} in the inflight queue")
            self.inflight = keep

    def write_source(self, req: Dict[str, Any]) -> None:
        if self.model:
            self.kv.write_source(req)
        else:
            n = self.kv.item
            for b in range(self.kv.nbuf):
                for i, p in enumerate(req["src"]):
                    self.kv.write(b, p, pattern(req["room"], self.tp, b, i, n))
        for j, it in enumerate(self.aux_items):
            row = req.get("aux_src", 0)
            # The aux row (first output token) is the same on every rank of a request.
            self.aux[j][row * it:(row + 1) * it] = pattern(req["room"], 0, 1000 + j, 0, it)

    def report_failure(self, req: Dict[str, Any], obj: str, where: str) -> None:
        code, reason, another = None, None, None
        try:
            req[obj].failure_exception()
        except self.ks.KVTransferError as e:
            code, reason, another = e.code, e.failure_reason, e.is_from_another_rank
        self.event({"ev": "failed", "room": req["room"], "where": where, "code": code, "reason": reason,
                    "another": another, "t": time.monotonic()})

    # ---- decode scheduler (decode.py) ----

    def resolve_dp(self, req: Dict[str, Any]) -> Optional[int]:
        info = self.mgr.prefill_info_table.get(req["addr"])
        if info is None:
            return None
        if info.dp_size == 1:
            return 0
        if info.follow_bootstrap_room:
            return req["room"] % info.dp_size
        return None

    def resolve_pending(self) -> None:
        from kvproxy.sglang.bootstrap import RegistryError, registry_call

        now = time.monotonic()
        by_addr: Dict[str, List[Dict[str, Any]]] = {}
        for req in self.pending:
            by_addr.setdefault(req["addr"], []).append(req)
        remaining = []
        for addr, reqs in by_addr.items():
            last = self.ensure_last.get(addr)
            if last is not None and now - last < 1.0:
                remaining += reqs
                continue
            self.ensure_last[addr] = now
            if not self.mgr.try_ensure_parallel_info(addr):
                self.ensure_tries[addr] = self.ensure_tries.get(addr, 0) + 1
                if self.ensure_tries[addr] >= 15:
                    for r in reqs:
                        r["receiver"].abort()
                else:
                    remaining += reqs
                continue
            self.ensure_last.pop(addr, None)
            need = []
            for r in reqs:
                dp = self.resolve_dp(r)
                if dp is None:
                    need.append(r)
                else:
                    r["receiver"].init(dp)
            if need:  # CommonKVReceiver.query_prefill_dp_ranks
                try:
                    ranks = registry_call(addr, "POST", "/query_dp_ranks",
                                          {"bootstrap_rooms": [r["room"] for r in need]})
                except RegistryError:
                    ranks = {}
                for r in need:
                    dp = ranks.get(str(r["room"]))
                    if dp is None:
                        remaining.append(r)
                    else:
                        r["receiver"].init(int(dp))
        self.pending = remaining

    def decode_step(self) -> None:
        self.resolve_pending()
        if self.prealloc and (not all(r["waiting"] for r in self.prealloc)
                              or any(r["receiver"].conclude_state == FAILED for r in self.prealloc)):
            polls = self.polls(self.prealloc, "receiver")  # _update_handshake_waiters
            for req, poll in zip(self.prealloc, polls):
                if poll == BOOTSTRAPPING:
                    pass
                elif poll == WAITING:
                    req["waiting"] = True
                elif poll == FAILED:
                    req["aborted"] = True
                    self.report_failure(req, "receiver", "handshake")
                else:
                    raise ValueError(f"Unexpected poll case: {poll}")
        keep = []
        for req in self.prealloc:  # pop_preallocated
            r = req["receiver"]
            if req.get("aborted"):
                r.clear()
                self.pending = [p for p in self.pending if p is not req]
                continue
            if not req["waiting"]:
                keep.append(req)
                continue
            if self.model:
                self.kv.prepare_dst(req)
                state = self.kv.state_indices(req, "dst")
            else:
                state = []
                for b in range(self.kv.nbuf):  # "allocated" pages: stale contents
                    for p in req["dst"]:
                        self.kv.write(b, p, b"\xee" * self.kv.item)
            r.send_metadata(req["dst"], req.get("aux_dst", 0), state, decode_prefix_len=0)
            if req.get("rebootstrap"):
                self.mgr.submit_prefill_recompute(r, {"rid": req.get("rid"), "bootstrap_room": req["room"]})
            self.transfer.append(req)
        self.prealloc = keep
        if self.transfer:  # pop_transferred
            polls = self.polls(self.transfer, "receiver")
            keep = []
            for req, poll in zip(self.transfer, polls):
                r = req["receiver"]
                if poll == FAILED:
                    t0 = time.monotonic()
                    self.report_failure(req, "receiver", "transfer")
                    r.clear()  # after release_kv_cache(): the pages are free from here on
                    took = time.monotonic() - t0  # failure_exception() + clear()
                    if self.model:
                        # Nothing of it can land any more: zero its pages, so every
                        # later check also proves that no late byte arrived.
                        self.kv.reset(req)
                    self.snapshots[req["room"]] = {"pages": list(req["dst"]), "req": req,
                                                   "digest": self.kv.digest(req if self.model else req["dst"])}
                    self.event({"ev": "cleared", "room": req["room"], "clear_s": took,
                                "fence_s": r.fence_seconds, "landed": r._landed_bytes, "expected": r._expected})
                elif poll == SUCCESS:
                    bad, why = self.check(req)
                    r.clear()
                    if self.model:
                        self.kv.reset(req)
                    self.event({"ev": "done", "room": req["room"], "bad": bad, "why": why, "t_init": r.t_init,
                                "t_meta": r._t_meta, "expected": r._expected, "landed": r._landed_bytes,
                                "sources": [src.key for src in r._srcs]})
                elif poll in (BOOTSTRAPPING, WAITING, TRANSFERRING):
                    keep.append(req)
                    if poll == TRANSFERRING and r._landed_bytes and not req.get("progress"):
                        req["progress"] = True
                        self.event({"ev": "progress", "room": req["room"], "landed": r._landed_bytes})
                else:
                    raise ValueError(f"Unexpected poll case: {poll}")
            self.transfer = keep

    def check(self, req: Dict[str, Any]) -> Tuple[int, List[str]]:
        bad, why = 0, []
        if self.model:
            bad, why = self.kv.check(req, [r for r in self.prealloc + self.transfer if r.get("waiting")])
        else:
            n = self.kv.item
            for b in range(self.kv.nbuf):
                for i, p in enumerate(req["dst"]):
                    bad += self.kv.read(b, p) != pattern(req["room"], self.tp, b, i, n)
        for j, it in enumerate(self.aux_items):
            row = req.get("aux_dst", 0)
            if bytes(self.aux[j][row * it:(row + 1) * it]) != pattern(req["room"], 0, 1000 + j, 0, it):
                bad += 1
                why.append(f"aux buffer {j} row {row} differs")
        return bad, why


def rank_main(cfg: Dict[str, Any]) -> int:
    rank = None
    try:
        rank = Rank(cfg)
        rank.run()
        return 0
    except Exception:  # noqa: BLE001 - reported to the coordinator, then exit 1
        err = traceback.format_exc()
        try:
            if rank is not None:
                rank.event({"ev": "error", "error": err})
            else:
                c = ConnClient(cfg["coord"], family="AF_UNIX", authkey=AUTH)
                c.send((cfg["name"], cfg["group"]))
                c.send(("event", {"ev": "error", "rank": cfg["name"], "error": err}))
        except OSError:
            pass
        print(err, file=sys.stderr)
        if rank is not None:
            rank.mgr.close()  # its threads must not outlive the interpreter's teardown
        return 1


def bootstrap_main(host: str, port: int, ready: str) -> int:
    """A bootstrap server in its own process (e.g. inside a network namespace)."""
    import signal

    import kvproxy.sglang as ks

    srv = ks.KvproxyKVBootstrapServer(host, port)
    Path(ready).write_text(str(srv.port))
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    srv.close()
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["rank", "bootstrap"])
    ap.add_argument("--config")
    ap.add_argument("--host", default="")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ready")
    a = ap.parse_args()
    if a.what == "rank":
        sys.exit(rank_main(json.loads(a.config)))
    sys.exit(bootstrap_main(a.host, a.port, a.ready))
