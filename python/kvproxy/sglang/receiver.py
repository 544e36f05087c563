# SPDX-License-Identifier: BSD-3-Clause
"""Decode side: the receiver of one request.

A receiver hears from every prefill rank that holds part of its data (its
attention-TP source ranks, in every pipeline stage: :mod:`kvproxy.sglang.decode`).
Once each of them said hello, the receiver checks that their plans together
write each of its buffers exactly once (:func:`kvproxy.sglang.layout.check_coverage`);
``send_metadata()`` then sends each of them the same one message, and the
request succeeds once every expected byte landed or every source reported
success. A source that fails, or whose channel closes (its process or its
kvproxyd died), fails the request with that source named: its pipeline
stage and attention-TP rank.

No late bytes: once a receiver's metadata may have reached the prefill side,
giving the request up (``abort()``, ``clear()`` of an open receiver, a
timeout, a failure reported by either side, another rank's failure) tells
the prefill side to stop and *fences* the receiver's tag in kvproxyd: from
the fence on, kvproxyd drops whatever of the request still arrives, and
confirms once nothing of it can land any more. ``abort()`` and ``clear()``
return only after that confirmation; failures noticed in the background
report ``Failed`` only after it. Where kvproxyd has no fence (or its fence
table is full) the receiver waits instead until the prefill side reports
that its transfers ended (or until the last moment one could land).
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any, Dict, List, Optional, Tuple

from .._client import Completion
from ._common import (
    DEFAULT_TRANSFER_TIMEOUT,
    FINAL,
    LAND_SLACK,
    PROTO_VERSION,
    TAG_BITS,
    KVPoll,
    RequestBase,
    int_list,
    runs,
)
from .bootstrap import RegistryError
from .channel import Conn
from .layout import LayoutError, check_coverage

__all__ = ["KvproxyKVReceiver"]

log = logging.getLogger("kvproxy.sglang")


class _Src:
    """One prefill rank a request's data comes from."""

    __slots__ = ("key", "conn", "done")

    def __init__(self, key: Tuple[int, int, int, int], conn: Conn) -> None:
        self.key = key
        self.conn = conn
        self.done = False  # it reported its outcome: none of its transfers is in flight

    @property
    def name(self) -> str:
        dp, _cp, tp, pp = self.key
        return f"prefill PP stage {pp}, attention TP rank {tp} (DP {dp}) at {self.conn.name}"

class KvproxyKVReceiver(RequestBase):
    """Decode side of one request (sglang's ``KVReceiver``; ``KVReceiver(mgr,
    bootstrap_addr, bootstrap_room=None)``, positionally or by keyword).

    Call sequence (sglang's decode scheduler): ``init(prefill_dp_rank)``
    (after ``try_ensure_parallel_info``), ``poll()`` until
    ``WaitingForInput``, ``send_metadata(page_indices, aux_index,
    state_indices, decode_prefix_len)``, ``poll()`` until ``Success`` or
    ``Failed``, ``clear()``. After ``clear()``, ``abort()`` or a ``Failed``
    poll, nothing more of the request lands in its pages.
    """

    tag: int

    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: Optional[int] = None, **_ignored: Any) -> None:
        if mgr.mode != "decode":
            raise ValueError("a KVReceiver needs a decode manager")
        self._init_request(mgr, bootstrap_addr, bootstrap_room)
        if not self.bootstrap_addr:
            raise ValueError("no bootstrap address: pass bootstrap_addr (HOST:PORT of the prefill's bootstrap server)")
        self.prefill_dp_rank: Optional[int] = None
        self.require_staging = False  # sglang's staging path is not used
        self.target_pp_ranks = [0]
        self._srcs: List[_Src] = []
        self._inited = False
        self._expected: Optional[int] = None
        self._landed_bytes = 0
        self._aux_index: Optional[int] = None
        self._meta_sent = False
        self._t_meta: Optional[float] = None
        self._land_within = 0.0
        # Giving up after the metadata may have gone out: (code, reason,
        # completion, from_prefill), reported once nothing can land any more.
        self._ending: Optional[Tuple[str, str, Optional[Completion], bool]] = None
        self._fence_id: Optional[int] = None
        self._fence_retry = False
        self._fallback = False
        self._t_fence: Optional[float] = None
        self._t_fenced: Optional[float] = None
        self.t_init: Optional[float] = None  # when init() was called (bootstrap latency)
        side = mgr.side
        with mgr._lock:
            while True:
                tag = secrets.randbits(TAG_BITS)
                if tag and tag not in side.by_tag:
                    break
            self.tag = tag
            refusal = mgr.refusal_locked()
            old = side.receivers.get(self.bootstrap_room)
            if refusal is not None:
                self._fail_locked(*refusal)
            elif old is not None and old._state not in FINAL:
                self._fail_locked("protocol", f"a second receiver for bootstrap room {self.bootstrap_room} "
                                  "while the first is open")
            else:
                side.receivers[self.bootstrap_room] = self
                side.by_tag[tag] = self

    # ---- sglang's calls ----

    def init(self, prefill_dp_rank: Any = 0, *_legacy: Any, **_kw: Any) -> None:
        """Resolve the prefill rank of DP rank ``prefill_dp_rank`` and connect to
        it; ``WaitingForInput`` follows once its hello was checked."""
        mgr, side = self.kv_mgr, self.kv_mgr.side
        self.t_init = time.monotonic()
        with mgr._lock:
            if self._state in FINAL or self._inited:
                return
            self._inited = True
            self.prefill_dp_rank = int(prefill_dp_rank or 0)
        addr = self.bootstrap_addr
        info = side.prefill_info_table.get(addr)
        if info is None and side.try_ensure_parallel_info(addr):
            info = side.prefill_info_table.get(addr)
        with mgr._lock:
            if self._state in FINAL:
                return
            if info is None:
                self._give_up_locked("unreachable", f"the prefill server's bootstrap server {addr} cannot be reached")
                return
            keys = side.targets(info, self.prefill_dp_rank)
            self.target_pp_ranks = sorted({k[3] for k in keys})
            why = side.mismatch.get(addr)
            if why is not None:
                self._give_up_locked("layout", why)
                side.notify_locked(self, keys, "layout", why)
                return
        eps = []
        for key in keys:
            try:
                eps.append(side.route(addr, key))
            except RegistryError as e:
                with mgr._lock:
                    self._give_up_locked("unreachable", f"no route to prefill PP stage {key[3]}, attention TP rank "
                                         f"{key[2]} (DP {key[0]}): {e}")
                    side.notify_locked(self, keys, "unreachable", str(e))
                return
        with mgr._lock:
            if self._state in FINAL:
                return
            for key, ep in zip(keys, eps):
                conn = side.conn_for_locked(ep)
                self._srcs.append(_Src(key, conn))
                conn.data["receivers"].add(self)
            self._on_hello_locked()

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Any = None,
                      decode_prefix_len: Optional[int] = None, **_kw: Any) -> None:
        """Tell the prefill side where the request's pages go: ``kv_indices``
        (page indices here, in request order, after the ``decode_prefix_len``
        tokens already held) and the aux row ``aux_index``. One message."""
        pages = int_list(kv_indices)
        mgr = self.kv_mgr
        with mgr._lock:
            if self._state in FINAL or self._ending is not None:
                return
            if self._state != KVPoll.WaitingForInput or not self._srcs:
                self._give_up_locked("protocol", f"send_metadata() in state {self._state.name}")
                return
            sidx: List[Optional[List[int]]] = [None] * len(mgr.states)
            if state_indices is not None and any(x is not None and len(x) for x in state_indices):
                if len(state_indices) != len(mgr.states):
                    self._give_up_locked("layout", f"send_metadata() got state indices for {len(state_indices)} "
                                         f"components, the manager has {len(mgr.states)} "
                                         f"({[c['type'] for c in mgr.states]})")
                    return
                sidx = [None if x is None else int_list(x) for x in state_indices]
            refusal = mgr.refusal_locked()
            if refusal is not None:
                self._give_up_locked(*refusal)
                return
            self._aux_index = None if aux_index is None or not mgr.aux_item_lens else int(aux_index)
            counts = [len(x or []) for x in sidx]
            self._expected = sum(src.conn.data["plan"].bytes(len(pages), self._aux_index is not None, counts)
                                 for src in self._srcs)
            xfer_s = mgr.config.transfer_timeout or DEFAULT_TRANSFER_TIMEOUT
            self._land_within = mgr.config.waiting_timeout + xfer_s
            regions = mgr._regions_layout()
            meta = {
                "t": "meta", "v": PROTO_VERSION, "room": self.bootstrap_room, "tag": self.tag,
                "node_id": mgr.node_id, "kvp_addr": mgr.kvp_addr, "engine_rank": mgr.engine_rank,
                "kv": regions["kv"], "aux": regions["aux"], "state": regions["state"], "pages": runs(pages),
                "aux_index": self._aux_index, "state_indices": sidx,
                "decode_prefix_len": int(decode_prefix_len or 0),
                # The prefill side submits nothing later than this after the
                # metadata arrived, each transfer ending this soon after.
                "submit_within_ms": int(mgr.config.waiting_timeout * 1000),
                "transfer_timeout_ms": int(xfer_s * 1000),
            }
            self._t_meta = time.monotonic()
            for src in self._srcs:
                if not mgr.side.channel.send(src.conn, meta):
                    self._give_up_locked("unreachable", f"the channel to {src.name} is closed")
                    return
                self._meta_sent = True  # from here on the prefill side may hold it
            self._set_locked(KVPoll.Transferring)
            if self._expected == 0:
                self._finish_locked()

    def poll(self) -> KVPoll:
        """The request's state (``Transferring`` while a give-up waits for its fence)."""
        with self.kv_mgr._lock:
            if self._state == KVPoll.Transferring and self._complete():
                self._finish_locked()
            return self._state

    def _complete(self) -> bool:
        """Every expected byte landed (or the prefill side reported success) and no give-up is under way."""
        return self._ending is None and self._expected is not None and (
            self._landed_bytes >= self._expected or self._prefill_done)

    @property
    def _prefill_done(self) -> bool:
        """Every source reported its outcome (none of their transfers is in flight)."""
        return bool(self._srcs) and all(src.done for src in self._srcs)

    def failure_exception(self) -> None:
        """Raise the request's :class:`KVTransferError`. sglang calls it when the
        MIN of its ranks' polls is Failed: a receiver that has not failed itself
        then gives the request up first (abort and fence, so nothing more of it
        lands), and the error says ``is_from_another_rank``."""
        with self.kv_mgr._lock:
            err = self._another_rank_error()
            if self._state != KVPoll.Success:
                self._give_up_locked("another-rank", err.failure_reason)
                self._wait_ended_locked()
                if self._failure is not None:
                    err = self._failure
                    err.is_from_another_rank = err.code == "another-rank"
        raise err

    def abort(self) -> None:
        """Give the request up (code ``aborted``); returns once nothing more of it can land."""
        with self.kv_mgr._lock:
            self._give_up_locked("aborted", "aborted by the engine")
            self._wait_ended_locked()

    def clear(self) -> None:
        """Forget the request. An open receiver is aborted first: returns once
        nothing more of it can land in its pages."""
        with self.kv_mgr._lock:
            if self._state != KVPoll.Success:
                self._give_up_locked("aborted", "cleared by the engine while the transfer was open")
                self._wait_ended_locked()
            self.kv_mgr.side.forget_locked(self)

    # ---- giving up ----

    def _abort_msg(self, code: str, reason: str) -> Dict[str, Any]:
        return {"t": "abort", "room": self.bootstrap_room, "tag": self.tag, "node_id": self.kv_mgr.node_id,
                "code": code, "reason": reason}

    def _post_abort_locked(self, code: str, reason: str) -> None:
        if self._state not in FINAL:
            for src in self._srcs:
                if not src.done:
                    self.kv_mgr.side.channel.send(src.conn, self._abort_msg(code, reason))

    def _give_up_locked(self, code: str, reason: str, completion: Optional[Completion] = None,
                        from_prefill: bool = False) -> None:
        """Fail the request; once its metadata may have reached the prefill side,
        only after the fence (see the module docstring)."""
        if self._state in FINAL or self._ending is not None:
            return
        self._post_abort_locked(code, reason)  # to every source that has not ended
        if not self._meta_sent or self.kv_mgr._gone is not None:
            self._fail_locked(code, reason, completion, from_prefill)
            self.kv_mgr.side.forget_locked(self)
            return
        self._ending = (code, reason, completion, from_prefill)
        log.info("bootstrap room %d: %s: %s; fencing", self.bootstrap_room, code, reason)
        self.kv_mgr.side.start_fence_locked(self)
        if self._fallback:
            self._check_fallback_locked(time.monotonic())

    def _end_locked(self) -> None:
        """Nothing of the request can land any more: report the failure."""
        if self._ending is None:
            return
        ending, self._ending = self._ending, None
        self._fail_locked(*ending)
        self.kv_mgr.side.forget_locked(self)

    def _check_fallback_locked(self, now: float) -> None:
        """Without a fence: ended once the prefill side said its transfers
        ended, or once the last moment one could land passed."""
        if self._ending is not None and self._fallback and (
                self._prefill_done or (self._t_meta is not None and now > self._t_meta + self._land_within + LAND_SLACK)):
            self._end_locked()

    def _wait_ended_locked(self) -> None:
        """Block (bounded) until a give-up in progress ended."""
        cfg = self.kv_mgr.config
        if self._ending is None:
            return
        if self._fallback:
            assert self._t_meta is not None
            deadline = self._t_meta + self._land_within + LAND_SLACK
        else:
            deadline = time.monotonic() + cfg.fence_timeout
        while self._ending is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                if not self._fallback:
                    log.error("kvproxy decode: kvproxyd did not confirm the fence of room %d within %g s",
                              self.bootstrap_room, cfg.fence_timeout)
                self._end_locked()
                return
            self.kv_mgr._changed.wait(min(left, 0.1))
            if self._fallback:
                self._check_fallback_locked(time.monotonic())
                deadline = self._t_meta + self._land_within + LAND_SLACK  # type: ignore[operator]

    # ---- events (manager lock held) ----

    def _on_hello_locked(self) -> None:
        """Once every source's hello is in: their plans must pair with this
        rank's layout and together write each of its buffers exactly once."""
        if self._state != KVPoll.Bootstrapping or not self._srcs or any(s.conn.hello is None for s in self._srcs):
            return
        for src in self._srcs:
            why = src.conn.data.get("mismatch")
            if why:
                self._give_up_locked("layout", f"{why}; {src.name}")
                return
        try:
            check_coverage(self.kv_mgr.layout_announce(), [src.conn.data["plan"] for src in self._srcs])
        except LayoutError as e:
            self._give_up_locked("layout", f"{e} (sources: {', '.join(src.name for src in self._srcs)})")
            return
        self._set_locked(KVPoll.WaitingForInput)

    def _src_of(self, conn: Conn) -> Optional[_Src]:
        return next((s for s in self._srcs if s.conn is conn), None)

    def _source_lost_locked(self, conn: Conn, reason: str) -> None:
        src = self._src_of(conn)
        if src is not None and not src.done:
            self._give_up_locked("unreachable", f"the channel to {src.name} closed: {reason}")

    def _on_status_locked(self, conn: Conn, msg: Dict[str, Any]) -> None:
        state = msg.get("state")
        src = self._src_of(conn)
        if src is None or state not in ("success", "failed", "aborted"):
            return
        src.done = True  # none of its transfers is in flight any more
        if self._ending is not None:
            self._check_fallback_locked(time.monotonic())  # what the fallback waits for
            return
        if state == "success":
            self.kv_mgr._changed.notify_all()
            return
        self._give_up_locked(str(msg.get("code", "?")), f"{src.name} ({msg.get('node_id', '?')}): "
                             f"{msg.get('reason', '?')}", from_prefill=True)

    def _landed_locked(self, c: Completion) -> None:
        if not c.ok:
            self._give_up_locked(c.status_name, f"kvproxy transfer {c.user_id:#x} landed with status {c.status_name}",
                                 completion=c)
            return
        self._landed_bytes += c.bytes
        self.kv_mgr._changed.notify_all()

    def _finish_locked(self) -> None:
        mgr = self.kv_mgr
        if self._aux_index is not None and mgr._aux is not None:
            for p, item in zip(mgr._aux.placements, mgr.aux_item_lens):
                p.from_mirror(self._aux_index * item, item)
        self._set_locked(KVPoll.Success)
        mgr.side.forget_locked(self)

    @property
    def fence_seconds(self) -> Optional[float]:
        """Seconds from the fence's submission to kvproxyd's confirmation (None: no fence ran)."""
        if self._t_fence is None or self._t_fenced is None:
            return None
        return self._t_fenced - self._t_fence

