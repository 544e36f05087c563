# SPDX-License-Identifier: BSD-3-Clause
"""Prefill worker: wait for the decode side's registration, push the blocks, report.

One thread per worker talks to the prefill scheduler's mailbox. For each
finished request the scheduler handed over (``sends`` in the connector
metadata) it long-polls for the decode worker's registration (``meta``,
key ``<request>.<rank>``) and for an ``abort``. With the registration it
pairs its blocks with the decode side's, submits the request's kvproxy
transfers (``per_xfer`` block positions each, ids ``tag << 16 | n``), and
stores ``status`` entries: ``<key>~s`` once every transfer was submitted
(the decode side then knows when the last one must end) and ``<key>`` with
the outcome once every ``done`` completion is in. The request is reported
sent (its blocks may be freed) only then, or when the lease passes with no
registration, or when the decode side gave it up before registering.

Rules that bound the decode side's wait (it cannot learn of a prefill
worker that died): no transfer is submitted later than the decode side's
``window_s`` after its registration was stored (the mailbox reports each
entry's age), and each transfer's deadline is the decode side's
``xfer_timeout_s``. kvproxyd completes a cancelled or timed-out transfer
only once nothing more of it can land.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .._bootstrap import BootstrapClient, BootstrapError
from .._errors import KvproxyError, PeerNotFound, RingFull
from .layout import LayoutError, pair_blocks, plan_transfers
from .mailbox import LongPoll, mailbox_key
from .scheduler import PROTOCOL

if TYPE_CHECKING:  # pragma: no cover
    from .worker import WorkerSide

__all__ = ["Sender"]

log = logging.getLogger("kvproxy.vllm")

WAITING, SENDING, CLOSING, DONE = "waiting", "sending", "closing", "done"
_TAG_MAX = 1 << 48
_XFERS_MAX = 1 << 16
_IO_TIMEOUT = 2.0
# Long polls end this soon, so an interrupted one's connection is soon reused.
_WAIT_MS = 250


class _Send:
    """One finished prefill request, from the scheduler's hand-over to ``done_sending``."""

    def __init__(self, rid: str, key: str, blocks: List[List[int]], lease_s: float) -> None:
        self.rid = rid
        self.key = key
        self.blocks = blocks
        self.deadline = time.monotonic() + lease_s
        self.state = WAITING
        self.total = 0
        self.submitted = 0
        self.outstanding: Dict[int, int] = {}  # uid -> n
        self.failed: Dict[int, str] = {}
        self.code: Optional[str] = None
        self.reason = ""
        self.aborted = False


class Sender:
    """The prefill half of a worker (see the module docstring). Thread-safe through ``w.lock``."""

    def __init__(self, w: "WorkerSide") -> None:
        self.w = w
        self.sends: Dict[str, _Send] = {}
        self._by_key: Dict[str, _Send] = {}
        self._by_uid: Dict[int, Tuple[_Send, int, float]] = {}
        self.inflight = 0
        self.addr: Optional[str] = None
        self._posts: List[Tuple[str, str, Dict[str, Any]]] = []
        self._poll: Optional[LongPoll] = None
        self._thread: Optional[threading.Thread] = None
        self._warned: Dict[str, float] = {}

    # ---- engine thread ----

    def add(self, rid: str, spec: Dict[str, Any]) -> None:
        """A request the scheduler handed over (``sends`` of the metadata)."""
        w = self.w
        with w.lock:
            if rid in self.sends:
                return
            s = _Send(rid, mailbox_key(rid, w.tp_rank), [list(g) for g in spec["blocks"]],
                      float(spec.get("lease_s") or w.cfg.lease_s))
            self.sends[rid] = s
            self._by_key[s.key] = s
            if w.gone is not None:
                self._finish_locked(s, "daemon-gone", w.gone)
                return
            if self.addr is None:
                self._finish_locked(s, "no-mailbox", "the scheduler advertised no mailbox address")
                return
            self._ensure_thread_locked()
        assert self._poll is not None
        self._poll.wake()

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
            s, n, _t = ent
            self.inflight -= 1
            s.outstanding.pop(c.user_id, None)
            secs = c.phases.get("e2e", 0.0) if c.phases else 0.0
            w.stats.record_done(c.ok, c.status_name, c.bytes, secs)
            if not c.ok:
                s.failed[n] = c.status_name
            w.cond.notify_all()
            if s.state == CLOSING and not s.outstanding:
                self._finish_locked(s)

    def daemon_gone_locked(self, why: str) -> None:
        """kvproxyd went away: nothing of ours is in flight any more."""
        for s in list(self.sends.values()):
            for n in s.outstanding.values():
                s.failed[n] = "daemon-gone"
            s.outstanding.clear()
            self._finish_locked(s, s.code or "daemon-gone", why)
        self._by_uid.clear()
        self.inflight = 0
        self.w.cond.notify_all()

    # ---- bookkeeping (w.lock held) ----

    def _finish_locked(self, s: _Send, code: Optional[str] = None, reason: str = "") -> None:
        if s.state == DONE:
            return
        if code and not s.code:
            s.code, s.reason = code, reason
        s.state = DONE
        self.sends.pop(s.rid, None)
        self._by_key.pop(s.key, None)
        w = self.w
        w.done_sending.add(s.rid)
        w.stats.count("requests_sent")
        if s.code:
            w.stats.record_failed(s.code)
        self._posts.append(("status", s.key, {
            "v": PROTOCOL, "state": "final", "submitted": s.submitted, "total": s.total,
            "failed": {str(n): st for n, st in s.failed.items()}, "code": s.code, "reason": s.reason,
        }))
        if self._poll is not None:
            self._poll.wake()

    def _expire_locked(self, now: float) -> Optional[float]:
        """Finish requests whose lease passed with no registration; the next lease end."""
        nxt = None
        for s in [s for s in self.sends.values() if s.state == WAITING]:
            if now >= s.deadline:
                self.w.stats.count("lease_expired")
                log.warning("kvproxy: request %s: no decode side registered within the %.0f s lease; "
                            "its blocks are released", s.rid, self.w.cfg.lease_s)
                self._finish_locked(s, "lease-expired", "no decode side registered within the lease")
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
                    meta_keys = [s.key for s in self.sends.values() if s.state == WAITING]
                    abort_keys = [s.key for s in self.sends.values() if s.state != DONE and not s.aborted]
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
                    if s.state in (WAITING, SENDING):
                        s.state = CLOSING
                        if not s.outstanding:
                            self._finish_locked(s, "internal", "the connector's mailbox thread failed")
        finally:
            bs.close()

    def _on_abort(self, key: str, ab: Any) -> None:
        w = self.w
        with w.lock:
            s = self._by_key.get(key)
            if s is None or s.aborted:
                return
            s.aborted = True
            why = str((ab or {}).get("reason") or "the decode side gave the request up")
            if s.state == WAITING:
                self._finish_locked(s, "aborted-by-decode", why)
                return
            s.code, s.reason = s.code or "aborted-by-decode", why
            uids = list(s.outstanding)
        for uid in uids:
            try:
                w.client.cancel(uid)
            except RingFull:
                pass  # the transfer still ends by its deadline
            except KvproxyError as e:
                self._warn("cancel", "kvproxy: cancel %#x: %s", uid, e)

    def _fail(self, s: _Send, code: str, reason: str) -> None:
        log.warning("kvproxy: request %s not sent: %s: %s", s.rid, code, reason)
        with self.w.lock:
            s.state = CLOSING
            s.code, s.reason = s.code or code, s.reason or reason
            if not s.outstanding:
                self._finish_locked(s)

    def _validate(self, s: _Send, meta: Any) -> Tuple[Optional[str], str]:
        w = self.w
        v = meta.get("v") if isinstance(meta, dict) else None
        if v != PROTOCOL:
            return "protocol", f"registration of protocol {v!r}, expected {PROTOCOL}"
        if meta.get("rank") != w.tp_rank or meta.get("tp") != w.tp_size:
            return "layout", (f"decode rank {meta.get('rank')}/{meta.get('tp')} registered for prefill rank "
                              f"{w.tp_rank}/{w.tp_size}")
        if meta.get("layout") != w.layout.signature():
            return "layout", "the KV cache layouts differ (planes, block bytes, dtype or kernel block size)"
        planes = meta.get("planes")
        if not isinstance(planes, list) or len(planes) != len(w.layout.planes):
            return "layout", "the decode side sent another number of planes"
        tag = meta.get("tag")
        if not isinstance(tag, int) or not 0 <= tag < _TAG_MAX:
            return "protocol", f"bad tag {tag!r}"
        per = meta.get("per_xfer")
        if not isinstance(per, int) or per < 1:
            return "protocol", f"bad per_xfer {per!r}"
        return None, ""

    def _on_meta(self, bs: BootstrapClient, key: str, meta: Any, stored_at: float) -> None:
        w = self.w
        with w.lock:
            s = self._by_key.get(key)
            if s is None or s.state != WAITING:
                return
            s.state = SENDING
        code, why = self._validate(s, meta)
        if code:
            self._fail(s, code, why)
            return
        window = min(float(meta.get("window_s") or w.cfg.submit_window_s), 3600.0)
        timeout = float(meta.get("xfer_timeout_s") or w.cfg.transfer_timeout_s)
        submit_by = stored_at + window
        try:
            pairs = pair_blocks(s.blocks, meta["blocks"])
            dst = [(int(k), int(o)) for k, o in meta["planes"]]
            plan = plan_transfers(w.layout, pairs, meta["per_xfer"], w.src_regions, dst)
        except (LayoutError, TypeError, ValueError, KeyError) as e:
            self._fail(s, "layout", str(e))
            return
        if len(plan) >= _XFERS_MAX:
            self._fail(s, "layout", f"{len(plan)} transfers for one request (at most {_XFERS_MAX - 1})")
            return
        widest = max((len(p) for p in plan), default=0)
        if widest > w.client.max_segments:
            self._fail(s, "layout", f"a transfer needs {widest} segments, kvproxyd {w.client.node_id} allows "
                                    f"{w.client.max_segments} (limits.max_segments must match on both sides)")
            return
        try:
            peer = w.peer_index(str(meta.get("node")))
        except PeerNotFound:
            self._fail(s, "peer-unknown", f"kvproxyd {w.client.node_id} has no peer {meta.get('node')!r}: "
                                          "list the decode node in its peers")
            return
        except KvproxyError as e:
            self._fail(s, "daemon-gone", str(e))
            return
        s.total = len(plan)
        tag = meta["tag"] << 16
        for n, segs in enumerate(plan):
            err = self._submit_one(s, peer, tag | n, n, segs, timeout, submit_by)
            if err is not None:
                s.code, s.reason = s.code or err[0], s.reason or err[1]
                break
        try:
            bs.put("status", key + "~s", {"v": PROTOCOL, "state": "submitted", "submitted": s.submitted,
                                           "total": s.total})
        except BootstrapError as e:
            self._warn("put", "kvproxy: cannot store the submitted status of %s: %s", s.rid, e)
        with w.lock:
            s.state = CLOSING
            if not s.outstanding:
                self._finish_locked(s)

    def _submit_one(self, s: _Send, peer: int, uid: int, n: int, segs: List[Any], timeout: float,
                    submit_by: float) -> Optional[Tuple[str, str]]:
        """Submit transfer ``n`` (waiting for a slot and for ring space until ``submit_by``).
        None, or the (code, reason) that stops the request's submissions."""
        w = self.w
        nbytes = sum(x[4] for x in segs)
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
            if uid in self._by_uid:
                return "tag-collision", f"transfer id {uid:#x} is in flight for another request"
            self._by_uid[uid] = (s, n, time.monotonic())
            s.outstanding[uid] = n
            self.inflight += 1
        while True:
            try:
                w.client.submit(peer, segs, uid, timeout=timeout)
                s.submitted = n + 1
                return None
            except RingFull:
                with w.lock:
                    if time.monotonic() > submit_by or w.gone is not None:
                        self._unsubmit_locked(s, uid)
                        return "too-late", "the submission ring stayed full past the submit window"
                    w.cond.wait(0.001)  # the daemon drains the ring continuously
            except KvproxyError as e:
                with w.lock:
                    self._unsubmit_locked(s, uid)
                return "submit", f"kvproxy refused transfer {n}: {e}"

    def _unsubmit_locked(self, s: _Send, uid: int) -> None:
        if self._by_uid.pop(uid, None) is not None:
            self.inflight -= 1
        s.outstanding.pop(uid, None)
        self.w.cond.notify_all()

    def stop(self) -> None:
        if self._poll is not None:
            self._poll.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._poll is not None:
            self._poll.close()
