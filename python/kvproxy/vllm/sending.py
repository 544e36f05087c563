# SPDX-License-Identifier: BSD-3-Clause
"""Prefill worker: wait for the decode side's registration, push the blocks, report.

One thread per worker talks to the prefill scheduler's mailbox. For each
finished request the scheduler handed over (``sends`` in the connector
metadata) it long-polls for the registrations of the decode ranks it
sends to (``meta``) and for ``abort`` entries. A request is one or more
*pairs* of this rank and a decode rank (:mod:`.tp_map`): with equal TP
sizes one, rank ``r`` to rank ``r``; with more decode ranks (fan-out) one
per decode rank that takes heads (or MLA's latent cache) from this rank.
Pair ``i``'s key is ``<request>.<rank>.<i>``; this rank knows only the
first until that registration names the decode side's TP size.

With a pair's registration it pairs its blocks with the decode rank's,
submits the pair's kvproxy transfers (``per_xfer`` block positions each,
whole blocks or the decode rank's head slice, :mod:`.slicing`; ids ``tag <<
16 | j << shift | n``, ``j`` this rank's index among the decode rank's
sources), and stores ``status`` entries: ``<key>~s`` once every transfer
was submitted (the decode side then knows when the last one must end) and
``<key>`` with the outcome once every ``done`` completion is in. The
request is reported sent (its blocks may be freed) when every pair ended
so, or when the lease passed with no registration, or when the decode side
gave it up (or said that no decode rank takes anything from this rank).

Rules that bound the decode side's wait (it cannot learn of a prefill
worker that died): no transfer is submitted later than the decode side's
``window_s`` after its registration was stored (the mailbox reports each
entry's age), and each transfer's deadline is the decode side's
``xfer_timeout_s``. kvproxyd completes a cancelled or timed-out transfer
only once nothing more of it can land.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .._bootstrap import BootstrapClient, BootstrapError
from .._errors import KvproxyError, PeerNotFound, RingFull
from . import tp_map
from .layout import LayoutError, pair_blocks, plan_transfers
from .mailbox import LongPoll, pair_key
from .scheduler import PROTOCOL

if TYPE_CHECKING:  # pragma: no cover
    from .worker import WorkerSide

__all__ = ["Sender"]

log = logging.getLogger("kvproxy.vllm")

WAITING, SENDING, CLOSING, DONE = "waiting", "sending", "closing", "done"
_TAG_MAX = 1 << 48
_XFERS_MAX = 1 << 16
_FAN_MAX = 1024  # decode ranks one prefill rank sends to
_RECENT = 256
_IO_TIMEOUT = 2.0
# Long polls end this soon, so an interrupted one's connection is soon reused.
_WAIT_MS = 250


class _Pair:
    """What one prefill rank sends to one decode rank for a request (one of
    ``fan`` when the decode side has more ranks, see :mod:`.tp_map`)."""

    def __init__(self, key: str, index: int) -> None:
        self.key = key
        self.index = index
        self.state = WAITING
        self.total = 0
        self.submitted = 0
        self.segments = 0
        self.outstanding: Dict[int, int] = {}  # uid -> n
        self.failed: Dict[int, str] = {}
        self.code: Optional[str] = None
        self.reason = ""
        self.aborted = False
        self.quiet = False  # ended without a status entry (no decode rank reads one)


class _Send:
    """One finished prefill request, from the scheduler's hand-over to ``done_sending``."""

    def __init__(self, rid: str, blocks: List[List[int]], lease_s: float) -> None:
        self.rid = rid
        self.blocks = blocks
        self.deadline = time.monotonic() + lease_s
        self.pairs: List[_Pair] = []
        self.fan_known = False  # pairs beyond the first are known once its registration names the decode TP
        self.state = WAITING


class Sender:
    """The prefill half of a worker (see the module docstring). Thread-safe through ``w.lock``."""

    def __init__(self, w: "WorkerSide") -> None:
        self.w = w
        self.sends: Dict[str, _Send] = {}
        self._by_key: Dict[str, Tuple[_Send, _Pair]] = {}
        self._by_uid: Dict[int, Tuple[_Send, _Pair, int, float]] = {}
        self.inflight = 0
        self.addr: Optional[str] = None
        self._posts: List[Tuple[str, str, Dict[str, Any]]] = []
        self._poll: Optional[LongPoll] = None
        self._thread: Optional[threading.Thread] = None
        self._warned: Dict[str, float] = {}
        # How the last requests went (diagnostics, tests): per pair its key,
        # transfers, segments and code.
        self.recent: "collections.OrderedDict[str, List[Dict[str, Any]]]" = collections.OrderedDict()

    # ---- engine thread ----

    def add(self, rid: str, spec: Dict[str, Any]) -> None:
        """A request the scheduler handed over (``sends`` of the metadata)."""
        w = self.w
        with w.lock:
            if rid in self.sends:
                return
            s = _Send(rid, [list(g) for g in spec["blocks"]], float(spec.get("lease_s") or w.cfg.lease_s))
            self.sends[rid] = s
            self._add_pair_locked(s, 0)
            if w.gone is not None:
                self._fail_pair_locked(s, s.pairs[0], "daemon-gone", w.gone)
                return
            if self.addr is None:
                self._fail_pair_locked(s, s.pairs[0], "no-mailbox", "the scheduler advertised no mailbox address")
                return
            self._ensure_thread_locked()
        assert self._poll is not None
        self._poll.wake()

    def _add_pair_locked(self, s: _Send, index: int) -> _Pair:
        pr = _Pair(pair_key(s.rid, self.w.tp_rank, index), index)
        s.pairs.append(pr)
        self._by_key[pr.key] = (s, pr)
        return pr

    def _ensure_thread_locked(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        assert self.addr is not None
        if self._poll is None:
            self._poll = LongPoll(self.addr, _IO_TIMEOUT)
        self._thread = threading.Thread(target=self._run, name="kvproxy-vllm-send", daemon=True)
        self._thread.start()

    # ---- reaper thread ----

    def on_done(self, c: Any) -> None:
        """A ``done`` completion of one of our transfers."""
        w = self.w
        with w.lock:
            ent = self._by_uid.pop(c.user_id, None)
            if ent is None:
                return
            s, pr, n, _t = ent
            self.inflight -= 1
            pr.outstanding.pop(c.user_id, None)
            secs = c.phases.get("e2e", 0.0) if c.phases else 0.0
            w.stats.record_done(c.ok, c.status_name, c.bytes, secs)
            if not c.ok:
                pr.failed[n] = c.status_name
            if c.status_name == "no-peer":
                w.forget_peer(c.peer)  # it left the daemon's table: look it up again next time
            w.cond.notify_all()
            if pr.state == CLOSING and not pr.outstanding:
                self._finish_pair_locked(s, pr)

    def daemon_gone_locked(self, why: str) -> None:
        """kvproxyd went away: nothing of ours is in flight any more."""
        for s in list(self.sends.values()):
            for pr in s.pairs:
                for n in pr.outstanding.values():
                    pr.failed[n] = "daemon-gone"
                pr.outstanding.clear()
                self._fail_pair_locked(s, pr, pr.code or "daemon-gone", why)
        self._by_uid.clear()
        self.inflight = 0
        self.w.cond.notify_all()

    # ---- bookkeeping (w.lock held) ----

    def _fail_pair_locked(self, s: _Send, pr: _Pair, code: Optional[str], reason: str) -> None:
        if code and not pr.code:
            pr.code, pr.reason = code, reason
        pr.state = CLOSING
        if not pr.outstanding:
            self._finish_pair_locked(s, pr)

    def _finish_pair_locked(self, s: _Send, pr: _Pair) -> None:
        """One pair ended (nothing of it in flight); the request ends with its last pair."""
        if pr.state == DONE:
            return
        pr.state = DONE
        self._by_key.pop(pr.key, None)
        w = self.w
        if pr.code:
            w.stats.record_failed(pr.code)
        if not pr.quiet:
            self._posts.append(("status", pr.key, {
                "v": PROTOCOL, "state": "final", "submitted": pr.submitted, "total": pr.total,
                "failed": {str(n): st for n, st in pr.failed.items()}, "code": pr.code, "reason": pr.reason,
            }))
        if self._poll is not None:
            self._poll.wake()
        if s.state == DONE or any(p.state != DONE for p in s.pairs):
            return
        s.state = DONE
        self.sends.pop(s.rid, None)
        w.done_sending.add(s.rid)
        w.stats.count("requests_sent")
        self.recent[s.rid] = [{"key": p.key, "total": p.total, "submitted": p.submitted, "segments": p.segments,
                               "code": p.code} for p in s.pairs]
        while len(self.recent) > _RECENT:
            self.recent.popitem(last=False)

    def _expire_locked(self, now: float) -> Optional[float]:
        """End pairs whose lease passed with no registration; the next lease end."""
        nxt = None
        for s in list(self.sends.values()):
            waiting = [pr for pr in s.pairs if pr.state == WAITING]
            if not waiting:
                continue
            if now >= s.deadline:
                for pr in waiting:
                    self.w.stats.count("lease_expired")
                    log.warning("kvproxy: request %s: no decode side registered at %s within the %.0f s lease; "
                                "its blocks are released", s.rid, pr.key, self.w.cfg.lease_s)
                    self._fail_pair_locked(s, pr, "lease-expired", "no decode side registered within the lease")
            elif nxt is None or s.deadline < nxt:
                nxt = s.deadline
        return nxt

    def _warn(self, key: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._warned.get(key, -1e9) > 30.0:
            self._warned[key] = now
            log.warning(msg, *args)

    # ---- mailbox thread ----

    def _run(self) -> None:
        w = self.w
        assert self._poll is not None and self.addr is not None
        poll = self._poll
        bs = BootstrapClient(self.addr, timeout=_IO_TIMEOUT)
        backoff = 0.05
        try:
            while not w.stop.is_set():
                poll.clear_wakeups()
                now = time.monotonic()
                with w.lock:
                    nxt = self._expire_locked(now)
                    posts, self._posts = self._posts, []
                    pairs = [pr for s in self.sends.values() for pr in s.pairs]
                    meta_keys = [pr.key for pr in pairs if pr.state == WAITING]
                    abort_keys = [pr.key for pr in pairs if pr.state != DONE and not pr.aborted]
                for kind, key, value in posts:
                    try:
                        bs.put(kind, key, value)
                    except BootstrapError as e:
                        self._warn("put", "kvproxy: cannot store %s %s in the mailbox: %s", kind, key, e)
                if not abort_keys:
                    poll.idle(1.0)
                    continue
                wait_ms = _WAIT_MS if nxt is None else max(1, min(_WAIT_MS, int((nxt - now) * 1000) + 1))
                try:
                    res = poll.wait({"meta": meta_keys, "abort": abort_keys}, wait_ms)
                except BootstrapError as e:
                    self._warn("wait", "kvproxy: prefill mailbox unreachable: %s", e)
                    poll.idle(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
                backoff = 0.05
                if res is None:
                    continue
                found, ages = res
                t = time.monotonic()
                for key, ab in (found.get("abort") or {}).items():
                    self._on_abort(key, ab)
                for key, meta in (found.get("meta") or {}).items():
                    age = (ages.get("meta") or {}).get(key, 0) / 1000.0
                    self._on_meta(bs, key, meta, t - age)
        except Exception:  # noqa: BLE001 - a bug here must not hang requests silently
            log.exception("kvproxy: prefill mailbox thread failed")
            with w.lock:
                for s in list(self.sends.values()):
                    for pr in s.pairs:
                        if pr.state in (WAITING, SENDING):
                            self._fail_pair_locked(s, pr, "internal", "the connector's mailbox thread failed")
        finally:
            bs.close()

    def _on_abort(self, key: str, ab: Any) -> None:
        w = self.w
        with w.lock:
            ent = self._by_key.get(key)
            if ent is None or ent[1].aborted:
                return
            s, pr = ent
            pr.aborted = True
            ab = ab if isinstance(ab, dict) else {}
            why = str(ab.get("reason") or "the decode side gave the request up")
            if ab.get("unneeded") and pr.index == 0 and not s.fan_known and pr.state == WAITING:
                # No decode rank takes anything from this rank (MLA, or heads
                # it replicates): free the blocks, nobody reads a status.
                s.fan_known, pr.quiet = True, True
                self._fail_pair_locked(s, pr, None, "")
                return
            if pr.state == WAITING:
                self._fail_pair_locked(s, pr, "aborted-by-decode", why)
                return
            pr.code, pr.reason = pr.code or "aborted-by-decode", pr.reason or why
            uids = list(pr.outstanding)
        for uid in uids:
            try:
                w.client.cancel(uid)
            except RingFull:
                pass  # the transfer still ends by its deadline
            except KvproxyError as e:
                self._warn("cancel", "kvproxy: cancel %#x: %s", uid, e)

    def _fail(self, s: _Send, pr: _Pair, code: str, reason: str) -> None:
        log.warning("kvproxy: request %s (%s) not sent: %s: %s", s.rid, pr.key, code, reason)
        with self.w.lock:
            self._fail_pair_locked(s, pr, code, reason)

    def _learn_fan(self, s: _Send, pr: _Pair, meta: Any) -> None:
        """The first registration names the decode side's TP size: add the pairs
        of the other decode ranks this rank sends to."""
        w = self.w
        if s.fan_known or pr.index != 0 or not isinstance(meta, dict):
            return
        d_tp = meta.get("tp")
        if not isinstance(d_tp, int) or isinstance(d_tp, bool) or d_tp < 1:
            return
        fan = w.fan_of(w.tp_rank, w.tp_size, d_tp)
        with w.lock:
            s.fan_known = True
            for i in range(1, min(fan, _FAN_MAX)):
                self._add_pair_locked(s, i)
        if self._poll is not None:
            self._poll.wake()

    def _validate(self, pr: _Pair, meta: Any) -> Tuple[Optional[str], str, Any]:
        """(code, reason, (source index, templates, destination strides)) of a registration."""
        w = self.w
        v = meta.get("v") if isinstance(meta, dict) else None
        if v != PROTOCOL:
            return "protocol", f"registration of protocol {v!r}, expected {PROTOCOL}", None
        d, d_tp = meta.get("rank"), meta.get("tp")
        if not isinstance(d, int) or not isinstance(d_tp, int) or not 0 <= d < d_tp:
            return "protocol", f"bad decode rank {d!r}/{d_tp!r}", None
        if meta.get("mla") != w.mla or (not w.mla and meta.get("kv_heads") != w.kv_heads):
            return "layout", (f"decode side: {meta.get('kv_heads')} KV heads, mla {meta.get('mla')}; prefill side: "
                              f"{w.kv_heads}, mla {w.mla}"), None
        if d_tp != w.tp_size and not w.mla and w.slice_why:
            return "layout", f"prefill TP {w.tp_size}, decode TP {d_tp}: {w.slice_why}", None
        try:
            srcs = tp_map.sources(d, w.tp_size, d_tp, w.kv_heads, w.mla)
            tgts = tp_map.targets(w.tp_rank, w.tp_size, d_tp, w.kv_heads, w.mla)
        except ValueError as e:
            return "layout", str(e), None
        mine = [j for j, src in enumerate(srcs) if src[0] == w.tp_rank]
        if not mine or pr.index >= len(tgts) or tgts[pr.index] != d or meta.get("src") != mine[0]:
            return "layout", (f"decode rank {d}/{d_tp} registered at {pr.key}, but prefill rank "
                              f"{w.tp_rank}/{w.tp_size} sends to decode ranks {tgts}"), None
        j = mine[0]
        planes = meta.get("planes")
        if not isinstance(planes, list) or len(planes) != len(w.layout.planes):
            return "layout", "the decode side sent another number of planes", None
        _p, lo, hi = srcs[j]
        if lo is None or hi is None:
            if meta.get("layout") != w.layout.signature():
                return "layout", "the KV cache layouts differ (planes, block bytes, dtype or kernel block size)", None
            return None, "", (j, len(srcs), None, None)
        assert w.kv_heads is not None
        plo, _ = tp_map.head_range(w.tp_rank, w.tp_size, w.kv_heads)
        dlo, dhi = tp_map.head_range(d, d_tp, w.kv_heads)
        mine_sig = w.layout.slice_signature()
        theirs = meta.get("slices")
        def same(t: Any, m: List[Any]) -> bool:
            return isinstance(t, list) and len(t) == 3 and t[:2] == m[:2] and t[2] == dhi - dlo

        if not isinstance(theirs, list) or len(theirs) != len(mine_sig) or not all(map(same, theirs, mine_sig)):
            return "layout", ("the KV cache layouts differ beyond the heads (planes, dtype, kernel block size, "
                              "HND/NHD) or the decode blocks do not hold its heads"), None
        try:
            templates = w.templates(True, lo - plo, dhi - dlo, lo - dlo, hi - lo)
        except ValueError as e:
            return "layout", str(e), None
        strides = []
        for pl, t in zip(planes, templates):
            want = t.r * t.kb_d
            if not isinstance(pl, list) or len(pl) < 3 or pl[2] != want:
                return "layout", f"decode block length {pl[2] if isinstance(pl, list) and len(pl) > 2 else pl!r}, " \
                                 f"expected {want}", None
            strides.append(want)
        return None, "", (j, len(srcs), templates, strides)

    def _on_meta(self, bs: BootstrapClient, key: str, meta: Any, stored_at: float) -> None:
        w = self.w
        with w.lock:
            ent = self._by_key.get(key)
            if ent is None or ent[1].state != WAITING:
                return
            s, pr = ent
            pr.state = SENDING
        self._learn_fan(s, pr, meta)
        code, why, how = self._validate(pr, meta)
        if code:
            self._fail(s, pr, code, why)
            return
        j, nsrc, templates, dst_strides = how
        tag = meta.get("tag")
        if not isinstance(tag, int) or not 0 <= tag < _TAG_MAX:
            self._fail(s, pr, "protocol", f"bad tag {tag!r}")
            return
        per = meta.get("per_xfer")
        if not isinstance(per, int) or per < 1:
            self._fail(s, pr, "protocol", f"bad per_xfer {per!r}")
            return
        window = min(float(meta.get("window_s") or w.cfg.submit_window_s), 3600.0)
        timeout = float(meta.get("xfer_timeout_s") or w.cfg.transfer_timeout_s)
        submit_by = stored_at + window
        try:
            pairs = pair_blocks(s.blocks, meta["blocks"])
            dst = [(int(x[0]), int(x[1])) for x in meta["planes"]]
            plan = plan_transfers(w.layout, pairs, per, w.src_regions, dst, templates, dst_strides)
        except (LayoutError, TypeError, ValueError, KeyError, IndexError) as e:
            self._fail(s, pr, "layout", str(e))
            return
        # Transfer ids: tag << 16 | j << shift | n, j the index of this rank
        # among the decode rank's sources (fan-in), so their landings add up.
        shift = (max(len(plan), 1) - 1).bit_length()
        if (nsrc << shift) > _XFERS_MAX or meta.get("base") != j << shift:
            self._fail(s, pr, "layout", f"{len(plan)} transfers from each of {nsrc} prefill ranks for one "
                                        f"request (at most {_XFERS_MAX} in all), or a base other than {j << shift}")
            return
        widest = max((len(p) for p in plan), default=0)
        if widest > w.client.max_segments:
            self._fail(s, pr, "layout", f"a transfer needs {widest} segments, kvproxyd {w.client.node_id} "
                                        f"allows {w.client.max_segments} (limits.max_segments must match on "
                                        "both sides)")
            return
        try:
            addr = meta.get("kvp_addr")
            peer = w.peer_index(str(meta.get("node")), str(addr) if addr else None)
        except PeerNotFound:
            self._fail(s, pr, "peer-unknown", f"kvproxyd {w.client.node_id} has no peer {meta.get('node')!r} and "
                                              "the decode side sent no kvproxyd address: list the decode node "
                                              "in its peers or give it kvproxy_addr")
            return
        except KvproxyError as e:
            self._fail(s, pr, "daemon-gone", str(e))
            return
        pr.total = len(plan)
        pr.segments = sum(len(p) for p in plan)
        base = (tag << 16) | (j << shift)
        for n, segs in enumerate(plan):
            err = self._submit_one(s, pr, peer, base | n, n, segs, timeout, submit_by)
            if err is not None:
                pr.code, pr.reason = pr.code or err[0], pr.reason or err[1]
                break
        try:
            bs.put("status", key + "~s", {"v": PROTOCOL, "state": "submitted", "submitted": pr.submitted,
                                           "total": pr.total})
        except BootstrapError as e:
            self._warn("put", "kvproxy: cannot store the submitted status of %s: %s", s.rid, e)
        with w.lock:
            self._fail_pair_locked(s, pr, None, "")

    def _submit_one(self, s: _Send, pr: _Pair, peer: int, uid: int, n: int, segs: List[Any], timeout: float,
                    submit_by: float) -> Optional[Tuple[str, str]]:
        """Submit transfer ``n`` (waiting for a slot and for ring space until ``submit_by``).
        None, or the (code, reason) that stops the pair's submissions."""
        w = self.w
        with w.lock:
            while self.inflight >= w.cfg.max_inflight and w.gone is None and not w.stop.is_set():
                left = submit_by - time.monotonic()
                if left <= 0:
                    break
                w.cond.wait(min(left, 0.5))
            if w.gone is not None:
                return "daemon-gone", w.gone
            if time.monotonic() > submit_by:
                return "too-late", "no kvproxy slot within the decode side's submit window"
            if pr.aborted:
                return "aborted-by-decode", "the decode side gave the request up"
            if uid in self._by_uid:
                return "tag-collision", f"transfer id {uid:#x} is in flight for another request"
            self._by_uid[uid] = (s, pr, n, time.monotonic())
            pr.outstanding[uid] = n
            self.inflight += 1
        while True:
            try:
                w.client.submit(peer, segs, uid, timeout=timeout)
                pr.submitted = n + 1
                return None
            except RingFull:
                with w.lock:
                    if time.monotonic() > submit_by or w.gone is not None:
                        self._unsubmit_locked(pr, uid)
                        return "too-late", "the submission ring stayed full past the submit window"
                    w.cond.wait(0.001)  # the daemon drains the ring continuously
            except KvproxyError as e:
                with w.lock:
                    self._unsubmit_locked(pr, uid)
                return "submit", f"kvproxy refused transfer {n}: {e}"

    def _unsubmit_locked(self, pr: _Pair, uid: int) -> None:
        if self._by_uid.pop(uid, None) is not None:
            self.inflight -= 1
        pr.outstanding.pop(uid, None)
        self.w.cond.notify_all()

    def stop(self) -> None:
        if self._poll is not None:
            self._poll.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._poll is not None:
            self._poll.close()
