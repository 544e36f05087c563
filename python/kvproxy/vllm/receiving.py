# SPDX-License-Identifier: BSD-3-Clause
"""Decode worker: register with the prefill side, count what lands, report.

For each request whose blocks the scheduler allocated (``recvs`` in the
connector metadata), a thread per prefill mailbox stores the registration
(``meta`` under ``<remote request>.<rank>``: this kvproxyd's node id, the
region key and offset of every plane, the block ids per KV-cache group,
the block positions per transfer, a random 48-bit tag, the submit window
and the transfer deadline) and long-polls for the prefill worker's
``status`` entries. kvproxyd's ``landed`` completions (ids ``tag << 16 |
n``) say which transfers arrived whole.

A request ends, and is reported received, when:

- every transfer landed (no load errors);
- the prefill side's final status arrived: transfers it reports ok count
  as landed (a landing notice can be dropped on a full completion ring),
  the blocks of the others that did not land are load errors;
- its deadline passed: the registration time plus the submit window, the
  transfer deadline, ``peer_timeout_s`` and a second of slack (once the
  prefill side stored that it submitted everything, that time plus the
  transfer deadline, ``peer_timeout_s`` and the slack). The prefill side
  submits nothing after the window and every transfer ends by its
  deadline, a cancelled one only once nothing more of it can land, so
  after this nothing can land in the request's blocks any more: the blocks
  of every transfer that did not land are load errors.

Giving a request up before its deadline uses kvproxyd's receiver-side
fence (:meth:`kvproxy.Client.fence` on the request's tag, ``(user_id &
~0xffff) == tag << 16``): from the call on kvproxyd drops whatever of the
request arrives, and its ``fence`` completion says that nothing of it can
land any more (within ``timeouts.peer_ms``); the request is reported then.
The fence holds until the request's deadline, past which the prefill side
submits nothing. Requests are given up so:

- vLLM aborts a waiting request: an ``abort`` entry makes the prefill side
  stop (cancelling what is in flight), and the fence ends it (without load
  errors: vLLM frees its blocks then);
- the prefill side reports a failure: transfers that failed after bytes
  left may still be landing (when the connection broke first), so the
  fence ends it;
- the prefill's mailbox refuses connections: the prefill instance is gone,
  so nothing but its last bytes on the wire can come; the fence ends it,
  with load errors for the blocks of the transfers that did not land.

When a fence cannot be set (fence table full, kvproxyd refused), the
request waits for its deadline instead.
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .._bootstrap import BootstrapClient, BootstrapError
from .._errors import KvproxyError
from .layout import positions_to_blocks, transfer_count
from .mailbox import LongPoll, mailbox_key
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


class _Recv:
    """One decode request, from the scheduler's hand-over to ``done_recving``."""

    def __init__(self, rid: str, addr: str, key: str, blocks: List[List[int]], tag: int, per_xfer: int) -> None:
        self.rid = rid
        self.addr = addr
        self.key = key
        self.blocks = blocks
        self.tag = tag
        self.per_xfer = per_xfer
        self.total = transfer_count(blocks, per_xfer)
        self.landed: set = set()
        self.state = QUEUED
        self.deadline = float("inf")
        self.give_up = False
        self.seen_submitted = False
        self.final_seen = False
        self.unwatched = False
        self.fenced = False
        self.fence_why = ""
        self.t0 = time.monotonic()


class _Loop:
    """The thread that talks to one prefill mailbox for all requests from it."""

    def __init__(self, rx: "Receiver", addr: str) -> None:
        self.rx = rx
        self.addr = addr
        self.recvs: Dict[str, _Recv] = {}  # by mailbox key
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
                    for r in [r for r in self.recvs.values() if r.state == REGISTERED and now >= r.deadline]:
                        rx.finish_locked(r, "final" if r.final_seen else "deadline", cleanup=r.final_seen)
                    new = [r for r in self.recvs.values() if r.state == QUEUED]
                    for r in new:
                        # From here on the registration may be stored: a give-up
                        # must wait for what could land (see give_up).
                        r.state = REGISTERING
                    posts, self.posts = self.posts, []
                    watch = [r for r in self.recvs.values() if r.state == REGISTERED]
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
                    watch = [r for r in self.recvs.values() if r.state == REGISTERED]
                    keys = [r.key for r in watch if not (r.final_seen or r.unwatched)]
                    keys += [r.key + "~s" for r in watch if not (r.seen_submitted or r.final_seen or r.unwatched)]
                    nxt = min((r.deadline for r in watch), default=None)
                if not keys:
                    self.poll.idle(1.0 if nxt is None else max(0.001, min(1.0, nxt - time.monotonic())))
                    continue
                now = time.monotonic()
                wait_ms = max(1, min(_WAIT_MS, int((nxt - now) * 1000) + 1))
                try:
                    res = self.poll.wait({"status": keys}, wait_ms)
                except BootstrapError as e:
                    if getattr(e, "refused", False):
                        # The prefill instance is gone: fence its requests.
                        with w.lock:
                            for r in [r for r in self.recvs.values() if r.state == REGISTERED]:
                                if not rx.fence_locked(r, "prefill-gone"):
                                    r.unwatched = True  # no status will come: only the deadline ends it
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
                for r in list(self.recvs.values()):
                    if r.state in (REGISTERING, REGISTERED):
                        if r.deadline == float("inf"):
                            r.deadline = time.monotonic() + rx.wait_after_register()
                        rx.orphans.append(r)
                    else:
                        rx.finish_locked(r, "internal")
                rx.loops.pop(self.addr, None)
        finally:
            bs.close()
            self.poll.close()

    def _register(self, bs: BootstrapClient, r: _Recv) -> None:
        rx, w = self.rx, self.rx.w
        meta = rx.meta_for(r)
        try:
            bs.put("meta", r.key, meta)
        except BootstrapError as e:
            with w.lock:
                if r.state != REGISTERING:
                    return
                if not e.maybe_done:
                    log.warning("kvproxy: request %s: cannot register with the prefill side: %s", r.rid, e)
                    rx.finish_locked(r, "unreachable")
                    return
                # The entry may have been stored: ask the prefill side to drop
                # it should it read it, and fence what could come meanwhile.
                r.state = REGISTERED
                r.deadline = time.monotonic() + rx.wait_after_register()
                self.posts.append(("abort", r.key, {"v": PROTOCOL, "reason": f"registration failed: {e}"}))
                rx.fence_locked(r, "unreachable")
            return
        with w.lock:
            if r.state != REGISTERING:
                return  # it ended meanwhile (all landed, or our kvproxyd went away)
            r.state = REGISTERED
            r.deadline = time.monotonic() + rx.wait_after_register()
            if r.give_up:
                self.posts.append(("abort", r.key, {"v": PROTOCOL, "reason": "the decode request was aborted"}))
                rx.fence_locked(r, "aborted")


class Receiver:
    """The decode half of a worker (see the module docstring). Thread-safe through ``w.lock``."""

    def __init__(self, w: "WorkerSide") -> None:
        self.w = w
        self.recvs: Dict[str, _Recv] = {}
        self.by_tag: Dict[int, _Recv] = {}
        self.by_fence: Dict[int, _Recv] = {}
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

    def _loop_locked(self, addr: str) -> _Loop:
        lp = self.loops.get(addr)
        if lp is None or not lp.thread.is_alive():
            lp = self.loops[addr] = _Loop(self, addr)
        return lp

    # ---- engine thread ----

    def add(self, rid: str, spec: Dict[str, Any]) -> None:
        w = self.w
        blocks = [list(g) for g in spec["blocks"]]
        with w.lock:
            if rid in self.recvs:
                return
            tag = secrets.randbits(48)
            while tag in self.by_tag:
                tag = secrets.randbits(48)
            key = mailbox_key(spec["remote_request_id"], w.tp_rank)
            r = _Recv(rid, spec["addr"], key, blocks, tag, w.per_xfer)
            self.recvs[rid] = r
            self.by_tag[tag] = r
            counts = spec.get("remote_block_counts") or []
            short = [g for g, ids in enumerate(blocks) if g >= len(counts) or len(ids) > counts[g]]
            if w.gone is not None or short or spec.get("give_up"):
                r.give_up = bool(spec.get("give_up"))
                self.release_locked(spec["addr"], spec["remote_request_id"], int(spec.get("remote_tp_size") or 1),
                                    "the decode side cannot load this request")
                self.finish_locked(r, "daemon-gone" if w.gone else ("layout" if short else "aborted"))
                return
            lp = self._loop_locked(r.addr)
            lp.recvs[key] = r
        lp.poll.wake()

    def give_up(self, rid: str) -> None:
        w = self.w
        with w.lock:
            r = self.recvs.get(rid)
            if r is None or r.give_up:
                return
            r.give_up = True
            lp = self.loops.get(r.addr)
            if r.state == QUEUED:
                # Not stored, and it will not be: nothing can come; let the
                # prefill side free its blocks.
                if lp is not None:
                    lp.recvs.pop(r.key, None)
                    lp.posts.append(("abort", r.key, {"v": PROTOCOL, "reason": "the decode request was aborted"}))
                self.finish_locked(r, "aborted")
            elif r.state == REGISTERED and lp is not None:
                lp.posts.append(("abort", r.key, {"v": PROTOCOL, "reason": "the decode request was aborted"}))
                self.fence_locked(r, "aborted")
            # REGISTERING: the mailbox thread posts the abort once its store returns.
        if lp is not None:
            lp.poll.wake()

    def release(self, addr: str, remote_rid: str, remote_tp: int, reason: str) -> None:
        with self.w.lock:
            lp = self.release_locked(addr, remote_rid, remote_tp, reason)
        if lp is not None:
            lp.poll.wake()

    def release_locked(self, addr: str, remote_rid: str, remote_tp: int, reason: str) -> Optional[_Loop]:
        """Tell every prefill rank that no decode side will register for this request.
        Only TP rank 0 does it (the message is the same from every rank)."""
        if self.w.tp_rank != 0 or not addr:
            return None
        lp = self._loop_locked(addr)
        for rank in range(max(1, remote_tp)):
            lp.posts.append(("abort", mailbox_key(remote_rid, rank), {"v": PROTOCOL, "reason": reason}))
        return lp

    def meta_for(self, r: _Recv) -> Dict[str, Any]:
        w = self.w
        return {
            "v": PROTOCOL, "node": w.client.node_id, "tag": r.tag, "rank": w.tp_rank, "tp": w.tp_size,
            "layout": w.layout.signature(), "planes": [list(x) for x in w.src_regions],
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
            n = c.user_id & 0xFFFF
            if r is None or n >= r.total:
                return
            r.landed.add(n)
            if len(r.landed) == r.total:
                self.finish_locked(r, "landed")

    def on_fence(self, c: Any) -> None:
        """A ``fence`` completion: nothing of that request can land any more."""
        w = self.w
        with w.lock:
            r = self.by_fence.pop(c.user_id, None)
            if r is None or r.state == DONE:
                return
            if c.ok:
                self.finish_locked(r, r.fence_why)
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
        for r in [r for r in self.orphans if now >= r.deadline]:
            self.orphans.remove(r)
            self.finish_locked(r, "deadline")

    # ---- w.lock held ----

    def fence_locked(self, r: _Recv, why: str) -> bool:
        """Fence ``r``'s transfers; it ends on the fence's completion. False if
        no fence could be set (then only its deadline or the prefill's
        answer ends it)."""
        if r.fenced:
            return True
        now = time.monotonic()
        end = r.deadline if r.deadline != float("inf") else now + self.wait_after_register()
        try:
            self.w.client.fence(r.tag << 16, _TAG_MASK, r.tag, hold=min(3600.0, max(1.0, end - now + _SLACK)))
        except KvproxyError as e:
            log.warning("kvproxy: request %s: cannot fence (%s); waiting for its deadline", r.rid, e)
            return False
        r.fenced, r.fence_why = True, why
        self.by_fence[r.tag] = r
        self.w.stats.count("fences")
        return True

    def on_status_locked(self, lp: _Loop, key: str, st: Any, stored_at: float) -> None:
        if not isinstance(st, dict):
            return
        if key.endswith("~s"):
            r = lp.recvs.get(key[:-2])
            if r is not None and r.state == REGISTERED and not r.seen_submitted:
                r.seen_submitted = True
                r.deadline = min(r.deadline, stored_at + self.wait_after_submit())
            return
        r = lp.recvs.get(key)
        if r is None or r.state != REGISTERED or r.final_seen or st.get("state") != "final":
            return
        try:
            submitted = int(st.get("submitted") or 0)
            failed = {int(n) for n in (st.get("failed") or {})}
        except (TypeError, ValueError):
            submitted, failed = 0, set()
        for n in range(min(submitted, r.total)):
            if n not in failed:
                r.landed.add(n)  # ok per the prefill side: acknowledged by our kvproxyd
        if st.get("code") and st.get("code") != "aborted-by-decode":
            log.warning("kvproxy: request %s: the prefill side reports %s: %s", r.rid, st.get("code"), st.get("reason"))
        if len(r.landed) < r.total and (failed or submitted):
            # Some transfer failed after bytes may have left: kvproxyd ends a
            # failed transfer only once nothing more of it can land, unless
            # the connection broke first; then our kvproxyd may still write
            # what it had received until it sees the break. The fence says
            # when nothing can land; without one, allow peer_timeout_s.
            r.final_seen = True
            if not self.fence_locked(r, "final"):
                r.deadline = min(r.deadline, time.monotonic() + self.w.cfg.peer_timeout_s)
            return
        self.finish_locked(r, "final", cleanup=True)

    def finish_locked(self, r: _Recv, how: str, cleanup: bool = False) -> None:
        if r.state == DONE:
            return
        r.state = DONE
        w = self.w
        self.recvs.pop(r.rid, None)
        self.by_tag.pop(r.tag, None)
        self.by_fence.pop(r.tag, None)
        lp = self.loops.get(r.addr)
        if lp is not None:
            lp.recvs.pop(r.key, None)
            if cleanup:
                lp.posts.append(("", r.key, None))
                lp.posts.append(("", r.key + "~s", None))
        if not r.give_up:
            missing = [n for n in range(r.total) if n not in r.landed]
            if how in ("unreachable", "layout", "daemon-gone", "internal"):
                missing = list(range(r.total))
            bad: List[int] = []
            for n in missing:
                bad.extend(positions_to_blocks(r.blocks, n * r.per_xfer, (n + 1) * r.per_xfer))
            if bad:
                w.load_errors.update(bad)
                w.stats.count("load_error_blocks", len(bad))
                log.warning("kvproxy: request %s: %d of %d blocks did not arrive (%s)", r.rid, len(bad),
                            sum(len(b) for b in r.blocks), how)
        w.done_recving.add(r.rid)
        w.stats.count("requests_received")
        self.recent[r.rid] = {"how": how, "total": r.total, "landed": sorted(r.landed), "per_xfer": r.per_xfer,
                              "give_up": r.give_up, "seconds": time.monotonic() - r.t0}
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
        """A request's transfer count, landed transfers and state (for tests and diagnostics);
        for an ended one, how it ended."""
        with self.w.lock:
            r = self.recvs.get(rid)
            if r is None:
                done = self.recent.get(rid)
                return dict(done, state=DONE) if done is not None else None
            return {"total": r.total, "landed": sorted(r.landed), "state": r.state, "per_xfer": r.per_xfer,
                    "deadline_in": r.deadline - time.monotonic()}
