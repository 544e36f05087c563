# SPDX-License-Identifier: BSD-3-Clause
"""Decode worker: register with the prefill side, count what lands, report.

For each request whose blocks the scheduler allocated (``recvs`` in the
connector metadata) this rank takes its KV from one or more prefill ranks,
its *sources* (:mod:`.tp_map`: one with equal TP sizes, fan-out and MLA;
several, each a head range, when the prefill side has more ranks). A
thread per prefill mailbox stores a registration per source (``meta``
under the pair key ``<remote request>.<prefill rank>.<i>``: this kvproxyd's
node id, the region key, offset and block length of every plane, the
block ids per KV-cache group, the block positions per transfer, a random
48-bit tag, the source's index ``j`` and id base, the submit window and the
transfer deadline) and long-polls for each source's ``status`` entries.
Decode rank 0 also tells the prefill ranks no decode rank takes anything
from that they are not needed. kvproxyd's ``landed`` completions (ids
``tag << 16 | j << shift | n``) say which transfer of which source arrived
whole; a block is loaded once the transfers of every source that carry it
landed.

A source is *closed* (nothing more of it can land) when:

- every one of its transfers landed;
- its final status arrived: transfers it reports ok count as landed (a
  landing notice can be dropped on a full completion ring); when some
  that were submitted did not land, a fence on that source's transfers
  closes it once it holds (without one, ``peer_timeout_s`` later);
- its deadline passed: the registration time plus the submit window, the
  transfer deadline, ``peer_timeout_s`` and a second of slack (once the
  source stored that it submitted everything, that time plus the transfer
  deadline, ``peer_timeout_s`` and the slack). The prefill side submits
  nothing after the window and every transfer ends by its deadline, a
  cancelled one only once nothing more of it can land, so after this
  nothing of it can land in the request's blocks any more.

A request ends, and is reported received, when every source is closed;
the blocks of every transfer that did not land are load errors. So a
prefill rank that dies in a fan-in request costs exactly the blocks its
missing transfers carry, at the source's deadline, while the other
sources' data lands.

Giving a whole request up before that uses kvproxyd's receiver-side fence
(:meth:`kvproxy.Client.fence` on the request's tag, ``(user_id & ~0xffff)
== tag << 16``): from the call on kvproxyd drops whatever of the request
arrives, and its ``fence`` completion says that nothing of it can land any
more (within ``timeouts.peer_ms``); the request is reported then. The
fence holds until the request's deadline, past which the prefill side
submits nothing. Requests are given up so:

- vLLM aborts a waiting request: ``abort`` entries make the prefill ranks
  stop (cancelling what is in flight), and the fence ends it (without load
  errors: vLLM frees its blocks then);
- the prefill's mailbox refuses connections: the prefill instance is gone,
  so nothing but its last bytes on the wire can come; the fence ends it,
  with load errors for the blocks of the transfers that did not land.

When a fence cannot be set (fence table full, kvproxyd refused), the
request (or source) waits for its deadline instead.
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .._bootstrap import BootstrapClient, BootstrapError
from .._errors import KvproxyError
from . import tp_map
from .layout import positions_to_blocks, transfer_count
from .mailbox import LongPoll, pair_key
from .scheduler import PROTOCOL

if TYPE_CHECKING:  # pragma: no cover
    from .worker import WorkerSide

__all__ = ["Receiver"]

log = logging.getLogger("kvproxy.vllm")

QUEUED, REGISTERING, REGISTERED, DONE = "queued", "registering", "registered", "done"
_SLACK = 1.0
_TAG_MASK = ((1 << 48) - 1) << 16  # the tag bits of a transfer id
_IO_TIMEOUT = 2.0
# Long polls end this soon, so an interrupted one's connection is soon reused.
_WAIT_MS = 250
_IDLE_EXIT = 30.0  # a mailbox thread with nothing to do for this long ends
_RECENT = 256
_XFERS_MAX = 1 << 16
_SOURCES_MAX = 1024
_INF = float("inf")


def load_failure(blocks: Sequence[Sequence[int]], missing: Iterable[int], per_xfer: int) -> Tuple[List[int], bool]:
    """How to tell vLLM that a receive's transfers ``missing`` did not arrive:
    the blocks they carry, and whether to name the whole request failed
    (``failed_recving``) instead of reporting those block ids.

    Block ids are per KV-cache group, so vLLM refuses block-level load errors
    for a model of several groups (``_handle_invalid_blocks`` raises
    RuntimeError, which stops the engine): those name the request. With one
    group the block ids let vLLM keep the prefix that did arrive and
    recompute from the first missing block (older vLLM knows nothing else);
    naming the request as well would recompute all of it.
    """
    bad: List[int] = []
    for n in sorted(missing):
        bad.extend(positions_to_blocks(blocks, n * per_xfer, (n + 1) * per_xfer))
    return bad, len(blocks) > 1

class _Src:
    """One prefill rank this request takes KV from."""

    def __init__(self, j: int, prank: int, key: str, base: int, heads: Optional[Tuple[int, int]]) -> None:
        self.j = j
        self.prank = prank
        self.key = key
        self.base = base
        self.heads = heads
        self.deadline = _INF
        self.seen_submitted = False
        self.final_seen = False
        self.closed = False
        self.how = ""


class _Recv:
    """One decode request, from the scheduler's hand-over to ``done_recving``."""

    def __init__(self, rid: str, addr: str, blocks: List[List[int]], tag: int, per_xfer: int) -> None:
        self.rid = rid
        self.addr = addr
        self.blocks = blocks
        self.tag = tag
        self.per_xfer = per_xfer
        self.total = transfer_count(blocks, per_xfer)  # transfers from each source
        self.shift = (max(self.total, 1) - 1).bit_length()
        self.srcs: List[_Src] = []
        self.landed: Set[int] = set()  # j << shift | n
        self.state = QUEUED
        self.give_up = False
        self.unwatched = False
        self.fenced = False
        self.fence_why = ""
        self.t0 = time.monotonic()

    def open_srcs(self) -> List[_Src]:
        return [s for s in self.srcs if not s.closed]

    def deadline(self) -> float:
        """When nothing more of the request can land, whatever happens."""
        return max((s.deadline for s in self.open_srcs()), default=time.monotonic())

    def landed_all(self, s: _Src) -> bool:
        return all((s.base | n) in self.landed for n in range(self.total))


class _Loop:
    """The thread that talks to one prefill mailbox for all requests from it."""

    def __init__(self, rx: "Receiver", addr: str) -> None:
        self.rx = rx
        self.addr = addr
        self.reqs: Dict[str, _Recv] = {}  # by request id
        self.keys: Dict[str, Tuple[_Recv, _Src]] = {}  # pair key -> source
        self.posts: List[Tuple[str, str, Any]] = []  # (kind, key, value); value None = delete
        self.poll = LongPoll(addr, _IO_TIMEOUT)
        self.thread = threading.Thread(target=self._run, name="kvproxy-vllm-recv", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rx, w = self.rx, self.rx.w
        bs = BootstrapClient(self.addr, timeout=_IO_TIMEOUT)
        idle_since = time.monotonic()
        warned = 0.0
        try:
            while not w.stop.is_set():
                self.poll.clear_wakeups()
                now = time.monotonic()
                with w.lock:
                    for r in [r for r in self.reqs.values() if r.state == REGISTERED]:
                        for s in r.open_srcs():
                            if now >= s.deadline:
                                rx.close_src_locked(r, s, "final" if s.final_seen else "deadline")
                    new = [r for r in self.reqs.values() if r.state == QUEUED]
                    for r in new:
                        # From here on the registration may be stored: a give-up
                        # must wait for what could land (see give_up).
                        r.state = REGISTERING
                    posts, self.posts = self.posts, []
                    watch = [r for r in self.reqs.values() if r.state == REGISTERED]
                    if not new and not posts and not watch:
                        if now - idle_since > _IDLE_EXIT:
                            rx.loops.pop(self.addr, None)
                            return
                    else:
                        idle_since = now
                for r in new:
                    self._register(bs, r)
                for kind, key, value in posts:
                    try:
                        if value is None:
                            bs.delete(key)
                        else:
                            bs.put(kind, key, value)
                    except BootstrapError as e:
                        if time.monotonic() - warned > 30:
                            warned = time.monotonic()
                            log.warning("kvproxy: prefill mailbox %s: %s", self.addr, e)
                with w.lock:
                    watch = [r for r in self.reqs.values() if r.state == REGISTERED]
                    keys: List[str] = []
                    for r in watch:
                        if r.unwatched:
                            continue
                        for s in r.open_srcs():
                            if not s.final_seen:
                                keys.append(s.key)
                                if not s.seen_submitted:
                                    keys.append(s.key + "~s")
                    nxt = min((s.deadline for r in watch for s in r.open_srcs()), default=None)
                if not keys:
                    self.poll.idle(1.0 if nxt is None else max(0.001, min(1.0, nxt - time.monotonic())))
                    continue
                now = time.monotonic()
                wait_ms = _WAIT_MS if nxt is None else max(1, min(_WAIT_MS, int((nxt - now) * 1000) + 1))
                try:
                    res = self.poll.wait({"status": keys}, wait_ms)
                except BootstrapError as e:
                    if getattr(e, "refused", False):
                        # The prefill instance is gone: fence its requests.
                        with w.lock:
                            for r in [r for r in self.reqs.values() if r.state == REGISTERED]:
                                if not rx.fence_locked(r, "prefill-gone"):
                                    r.unwatched = True  # no status will come: only the deadlines end it
                    if time.monotonic() - warned > 30:
                        warned = time.monotonic()
                        log.warning("kvproxy: prefill mailbox %s unreachable: %s", self.addr, e)
                    self.poll.idle(0.2)
                    continue
                if res is None:
                    continue
                found, ages = res
                t = time.monotonic()
                with w.lock:
                    for key, st in (found.get("status") or {}).items():
                        age = (ages.get("status") or {}).get(key, 0) / 1000.0
                        rx.on_status_locked(self, key, st, t - age)
        except Exception:  # noqa: BLE001 - end the requests rather than leave them waiting
            log.exception("kvproxy: decode mailbox thread for %s failed", self.addr)
            with w.lock:
                for r in list(self.reqs.values()):
                    if r.state in (REGISTERING, REGISTERED):
                        rx.set_deadlines_locked(r)
                        rx.orphans.append(r)
                    else:
                        rx.finish_locked(r, "internal")
                rx.loops.pop(self.addr, None)
        finally:
            bs.close()
            self.poll.close()

    def _register(self, bs: BootstrapClient, r: _Recv) -> None:
        rx, w = self.rx, self.rx.w
        stored, err = False, None
        for s in r.srcs:
            try:
                bs.put("meta", s.key, rx.meta_for(r, s))
                stored = True
            except BootstrapError as e:
                err = e
                stored = stored or e.maybe_done
                break
        with w.lock:
            if r.state != REGISTERING:
                return  # it ended meanwhile (all landed, or our kvproxyd went away)
            if err is not None and not stored:
                log.warning("kvproxy: request %s: cannot register with the prefill side: %s", r.rid, err)
                rx.finish_locked(r, "unreachable")
                return
            r.state = REGISTERED
            rx.set_deadlines_locked(r)
            if err is not None or r.give_up:
                # A registration may have been stored: ask the prefill ranks to
                # drop it should they read it, and fence what could come meanwhile.
                why = f"registration failed: {err}" if err is not None else "the decode request was aborted"
                for s in r.srcs:
                    self.posts.append(("abort", s.key, {"v": PROTOCOL, "reason": why}))
                rx.fence_locked(r, "unreachable" if err is not None else "aborted")


class Receiver:
    """The decode half of a worker (see the module docstring). Thread-safe through ``w.lock``."""

    def __init__(self, w: "WorkerSide") -> None:
        self.w = w
        self.recvs: Dict[str, _Recv] = {}
        self.by_tag: Dict[int, _Recv] = {}
        self.by_fence: Dict[int, Tuple[_Recv, Optional[_Src]]] = {}
        self.loops: Dict[str, _Loop] = {}
        self.orphans: List[_Recv] = []  # requests of a failed mailbox thread: only their deadline ends them
        # How the last requests ended (diagnostics, tests).
        self.recent: "collections.OrderedDict[str, Dict[str, Any]]" = collections.OrderedDict()

    def wait_after_register(self) -> float:
        c = self.w.cfg
        return c.submit_window_s + c.transfer_timeout_s + c.peer_timeout_s + _SLACK

    def wait_after_submit(self) -> float:
        c = self.w.cfg
        return c.transfer_timeout_s + c.peer_timeout_s + _SLACK

    def set_deadlines_locked(self, r: _Recv) -> None:
        end = time.monotonic() + self.wait_after_register()
        for s in r.srcs:
            if s.deadline == _INF:
                s.deadline = end

    def _loop_locked(self, addr: str) -> _Loop:
        lp = self.loops.get(addr)
        if lp is None or not lp.thread.is_alive():
            lp = self.loops[addr] = _Loop(self, addr)
        return lp

    # ---- engine thread ----

    def add(self, rid: str, spec: Dict[str, Any]) -> None:
        w = self.w
        blocks = [list(g) for g in spec["blocks"]]
        remote, p_tp = spec["remote_request_id"], int(spec.get("remote_tp_size") or 1)
        with w.lock:
            if rid in self.recvs:
                return
            tag = secrets.randbits(48)
            while tag in self.by_tag:
                tag = secrets.randbits(48)
            why = ""
            try:
                srcs = w.sources(p_tp)
                per_xfer = w.per_xfer_for(p_tp)
            except ValueError as e:
                srcs, per_xfer, why = [], w.per_xfer, str(e)
            r = _Recv(rid, spec["addr"], blocks, tag, per_xfer)
            if srcs and ((len(srcs) << r.shift) > _XFERS_MAX or len(srcs) > _SOURCES_MAX):
                why = f"{r.total} transfers from each of {len(srcs)} prefill ranks (at most {_XFERS_MAX} in all)"
            for j, (p, lo, hi) in enumerate(srcs):
                i = tp_map.targets(p, p_tp, w.tp_size, w.kv_heads, w.mla).index(w.tp_rank)
                heads = (lo, hi) if lo is not None and hi is not None else None
                r.srcs.append(_Src(j, p, pair_key(remote, p, i), j << r.shift, heads))
            self.recvs[rid] = r
            self.by_tag[tag] = r
            counts = spec.get("remote_block_counts") or []
            short = [g for g, ids in enumerate(blocks) if g >= len(counts) or len(ids) > counts[g]]
            if w.gone is not None or short or why or spec.get("give_up"):
                r.give_up = bool(spec.get("give_up"))
                if why:
                    log.warning("kvproxy: request %s cannot be loaded: %s", rid, why)
                self.release_locked(spec["addr"], remote, p_tp, "the decode side cannot load this request")
                self.finish_locked(r, "daemon-gone" if w.gone else ("layout" if short or why else "aborted"))
                return
            lp = self._loop_locked(r.addr)
            lp.reqs[rid] = r
            for s in r.srcs:
                lp.keys[s.key] = (r, s)
            if w.tp_rank == 0:
                # Prefill ranks no decode rank takes anything from (MLA, or
                # heads replicated over several prefill ranks) free their blocks.
                for p in range(p_tp):
                    if w.fan_of(p, p_tp, w.tp_size) == 0:
                        lp.posts.append(("abort", pair_key(remote, p, 0), {
                            "v": PROTOCOL, "unneeded": True, "reason": "no decode rank takes KV from this rank"}))
        lp.poll.wake()

    def give_up(self, rid: str) -> None:
        w = self.w
        with w.lock:
            r = self.recvs.get(rid)
            if r is None or r.give_up:
                return
            r.give_up = True
            lp = self.loops.get(r.addr)
            abort = {"v": PROTOCOL, "reason": "the decode request was aborted"}
            if r.state == QUEUED:
                # Not stored, and it will not be: nothing can come; let the
                # prefill ranks free their blocks.
                if lp is not None:
                    lp.reqs.pop(r.rid, None)
                    for s in r.srcs:
                        lp.posts.append(("abort", s.key, abort))
                self.finish_locked(r, "aborted")
            elif r.state == REGISTERED and lp is not None:
                for s in r.srcs:
                    lp.posts.append(("abort", s.key, abort))
                self.fence_locked(r, "aborted")
            # REGISTERING: the mailbox thread posts the aborts once its stores return.
        if lp is not None:
            lp.poll.wake()

    def release(self, addr: str, remote_rid: str, remote_tp: int, reason: str) -> None:
        with self.w.lock:
            lp = self.release_locked(addr, remote_rid, remote_tp, reason)
        if lp is not None:
            lp.poll.wake()

    def release_locked(self, addr: str, remote_rid: str, remote_tp: int, reason: str) -> Optional[_Loop]:
        """Tell every prefill rank that no decode rank will register for this request
        (every pair key of each). Only TP rank 0 does it (the message is the same
        from every rank)."""
        w = self.w
        if w.tp_rank != 0 or not addr:
            return None
        lp = self._loop_locked(addr)
        for p in range(max(1, remote_tp)):
            for i in range(max(1, w.fan_of(p, remote_tp, w.tp_size))):
                lp.posts.append(("abort", pair_key(remote_rid, p, i), {"v": PROTOCOL, "reason": reason}))
        return lp

    def meta_for(self, r: _Recv, s: _Src) -> Dict[str, Any]:
        w = self.w
        assert w.layout is not None
        return {
            "v": PROTOCOL, "node": w.client.node_id, "kvp_addr": w.kvp_addr, "tag": r.tag, "rank": w.tp_rank,
            "tp": w.tp_size,
            "kv_heads": w.kv_heads, "mla": w.mla, "src": s.j, "base": s.base,
            "layout": w.layout.signature(), "slices": w.layout.slice_signature(),
            "planes": [[k, o, p.stride] for (k, o), p in zip(w.src_regions, w.layout.planes)],
            "blocks": r.blocks, "per_xfer": r.per_xfer,
            "window_s": w.cfg.submit_window_s, "xfer_timeout_s": w.cfg.transfer_timeout_s,
        }

    # ---- reaper thread ----

    def on_landed(self, c: Any) -> None:
        w = self.w
        with w.lock:
            w.stats.count("landed")
            w.stats.count("landed_bytes", int(c.bytes))
            r = self.by_tag.get(c.user_id >> 16)
            if r is None:
                return
            n = c.user_id & 0xFFFF
            j, k = n >> r.shift, n & ((1 << r.shift) - 1)
            if j >= len(r.srcs) or k >= r.total:
                return
            r.landed.add(n)
            s = r.srcs[j]
            if not s.closed and r.landed_all(s):
                self.close_src_locked(r, s, "landed")

    def on_fence(self, c: Any) -> None:
        """A ``fence`` completion: nothing of that request (or source) can land any more."""
        w = self.w
        with w.lock:
            ent = self.by_fence.pop(c.user_id, None)
            if ent is None or ent[0].state == DONE:
                return
            r, s = ent
            if c.ok:
                if s is None:
                    self.finish_locked(r, r.fence_why)
                else:
                    self.close_src_locked(r, s, "final")
                return
            w.stats.record_failed(f"fence-{c.status_name}")
            log.warning("kvproxy: request %s: the fence did not hold (%s); waiting for its deadline", r.rid,
                        c.status_name)

    def daemon_gone_locked(self, why: str) -> None:
        """kvproxyd went away: nothing more can land in our memory."""
        self.by_fence.clear()
        for r in list(self.recvs.values()):
            self.finish_locked(r, "daemon-gone")

    def check_orphans_locked(self, now: float) -> None:
        for r in [r for r in self.orphans if now >= r.deadline()]:
            self.orphans.remove(r)
            self.finish_locked(r, "deadline")

    # ---- w.lock held ----

    def _fence_call(self, r: _Recv, value: int, mask: int, fence_id: int, end: float) -> bool:
        now = time.monotonic()
        try:
            self.w.client.fence(value, mask, fence_id, hold=min(3600.0, max(1.0, end - now + _SLACK)))
        except KvproxyError as e:
            log.warning("kvproxy: request %s: cannot fence (%s); waiting for its deadline", r.rid, e)
            return False
        self.w.stats.count("fences")
        return True

    def fence_locked(self, r: _Recv, why: str) -> bool:
        """Fence all of ``r``'s transfers; it ends on the fence's completion. False if
        no fence could be set (then only its deadlines or the prefill's answers end it)."""
        if r.fenced:
            return True
        end = r.deadline() if r.open_srcs() else time.monotonic() + self.wait_after_register()
        fid = (r.tag << 16) | 0xFFFF
        if not self._fence_call(r, r.tag << 16, _TAG_MASK, fid, end):
            return False
        r.fenced, r.fence_why = True, why
        self.by_fence[fid] = (r, None)
        return True

    def _fence_src_locked(self, r: _Recv, s: _Src) -> bool:
        """Fence one source's transfers (ids ``j << shift | n``); it closes on the
        fence's completion. The other sources' data keeps landing."""
        if r.fenced:
            return True
        if len(r.srcs) == 1:
            return self.fence_locked(r, "final")
        low = 0xFFFF & ~((1 << r.shift) - 1)
        fid = (r.tag << 16) | s.base
        if not self._fence_call(r, (r.tag << 16) | s.base, _TAG_MASK | low, fid, s.deadline):
            return False
        self.by_fence[fid] = (r, s)
        return True

    def close_src_locked(self, r: _Recv, s: _Src, how: str) -> None:
        """Nothing more of source ``s`` can land; the request ends with its last source."""
        if s.closed or r.state == DONE:
            return
        s.closed, s.how = True, how
        lp = self.loops.get(r.addr)
        if lp is not None and s.final_seen:
            lp.posts.append(("", s.key, None))
            lp.posts.append(("", s.key + "~s", None))
        if not r.open_srcs():
            # How it ended: by the last source's close, unless that one landed
            # whole after another did not.
            others = [x.how for x in r.srcs if x.how != "landed"]
            self.finish_locked(r, how if how != "landed" or not others else others[0])

    def on_status_locked(self, lp: _Loop, key: str, st: Any, stored_at: float) -> None:
        if not isinstance(st, dict):
            return
        if key.endswith("~s"):
            ent = lp.keys.get(key[:-2])
            if ent is not None and ent[0].state == REGISTERED and not ent[1].seen_submitted:
                ent[1].seen_submitted = True
                ent[1].deadline = min(ent[1].deadline, stored_at + self.wait_after_submit())
            return
        ent = lp.keys.get(key)
        if ent is None:
            return
        r, s = ent
        if r.state != REGISTERED or s.closed or s.final_seen or st.get("state") != "final":
            return
        try:
            submitted = int(st.get("submitted") or 0)
            failed = {int(n) for n in (st.get("failed") or {})}
        except (TypeError, ValueError):
            submitted, failed = 0, set()
        for n in range(min(submitted, r.total)):
            if n not in failed:
                r.landed.add(s.base | n)  # ok per the prefill side: acknowledged by our kvproxyd
        if st.get("code") and st.get("code") != "aborted-by-decode":
            log.warning("kvproxy: request %s: prefill rank %d reports %s: %s", r.rid, s.prank, st.get("code"),
                        st.get("reason"))
        s.final_seen = True
        if not r.landed_all(s) and (failed or submitted):
            # Some transfer failed after bytes may have left: kvproxyd ends a
            # failed transfer only once nothing more of it can land, unless
            # the connection broke first; then our kvproxyd may still write
            # what it had received until it sees the break. The fence says
            # when nothing can land; without one, allow peer_timeout_s.
            if not self._fence_src_locked(r, s):
                s.deadline = min(s.deadline, time.monotonic() + self.w.cfg.peer_timeout_s)
            return
        self.close_src_locked(r, s, "final")

    def finish_locked(self, r: _Recv, how: str) -> None:
        if r.state == DONE:
            return
        r.state = DONE
        w = self.w
        self.recvs.pop(r.rid, None)
        self.by_tag.pop(r.tag, None)
        for fid in [f for f, (x, _s) in self.by_fence.items() if x is r]:
            self.by_fence.pop(fid, None)
        lp = self.loops.get(r.addr)
        if lp is not None:
            lp.reqs.pop(r.rid, None)
            for s in r.srcs:
                lp.keys.pop(s.key, None)
        if not r.give_up:
            everything = how in ("unreachable", "layout", "daemon-gone", "internal") or not r.srcs
            missing: Set[int] = set()
            for n in range(r.total):
                if everything or any((s.base | n) not in r.landed for s in r.srcs):
                    missing.add(n)
            bad, whole = load_failure(r.blocks, missing, r.per_xfer)
            if bad:
                if whole:
                    w.failed_recving.add(r.rid)
                else:
                    w.load_errors.update(bad)
                w.stats.count("load_error_blocks", len(bad))
                log.warning("kvproxy: request %s: %d of %d blocks did not arrive (%s)", r.rid, len(bad),
                            sum(len(b) for b in r.blocks), how)
        w.done_recving.add(r.rid)
        w.stats.count("requests_received")
        self.recent[r.rid] = {"how": how, "total": r.total, "landed": sorted(r.landed), "per_xfer": r.per_xfer,
                              "give_up": r.give_up, "seconds": time.monotonic() - r.t0, "sources": len(r.srcs),
                              "shift": r.shift, "srcs": [(s.prank, s.how) for s in r.srcs]}
        while len(self.recent) > _RECENT:
            self.recent.popitem(last=False)

    def stop(self) -> None:
        with self.w.lock:
            loops = list(self.loops.values())
        for lp in loops:
            lp.poll.wake()
        for lp in loops:
            lp.thread.join(timeout=5)

    def debug_state(self, rid: str) -> Optional[Dict[str, Any]]:
        """A request's transfer count (per source), landed transfers (``j << shift
        | n``), sources and state (for tests and diagnostics); for an ended one,
        how it ended."""
        with self.w.lock:
            r = self.recvs.get(rid)
            if r is None:
                done = self.recent.get(rid)
                return dict(done, state=DONE) if done is not None else None
            return {"total": r.total, "landed": sorted(r.landed), "state": r.state, "per_xfer": r.per_xfer,
                    "sources": len(r.srcs), "shift": r.shift,
                    "deadline_in": r.deadline() - time.monotonic() if r.srcs else None}
