# SPDX-License-Identifier: BSD-3-Clause
"""Prefill side: the sender of one request.

A sender learns from each decode rank it serves (one, or ``decode TP //
prefill TP`` of them) where that rank's pages, aux row and state rows are,
and pairs its own layout with that rank's (:func:`kvproxy.sglang.layout.build_plan`:
head slices for different TP sizes, the layer range of its pipeline stage,
MLA replicas, state reslicing). Each ``send()`` turns the chunk's pages into
segments per decode rank (one strided segment per buffer and run of pages
where only some heads move), grouped into kvproxy transfers of at most
``max_segments`` and 32 MiB. Each decode rank gets the outcome once none of
its transfers is queued or in flight.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Dict, List, Optional

from .._client import Completion
from .._errors import Disconnected, KvproxyError, PeerNotFound
from ._common import FINAL, PROTO_VERSION, KVPoll, RequestBase, TransferMetric, expand_runs, int_list, pair_runs
from .channel import Conn
from .layout import LayoutError, Plan, Seg, build_plan, dests_per_source, segments

__all__ = ["KvproxyKVSender"]

log = logging.getLogger("kvproxy.sglang")


class _Dest:
    """One decode rank of a request: its metadata, its plan, its transfers."""

    def __init__(self, conn: Conn, meta: Dict[str, Any], tag: int, peer: int, plan: Plan, pages: List[int],
                 arrived: float, xfer_timeout: Optional[float]) -> None:
        self.conn = conn
        self.meta = meta
        self.tag = tag
        self.peer = peer
        self.node = str(meta.get("node_id", "?"))
        self.plan = plan
        self.pages = pages
        layout = (conn.hello or {}).get("layout") or {}
        self.tp_rank = int(layout.get("attn_tp_rank", 0))
        self.kv = [(int(k), int(o), int(n)) for k, o, _i, n in meta["kv"]]
        self.aux = [(int(k), int(o), int(n)) for k, o, _i, n in meta.get("aux") or []]
        self.state = [[(int(k), int(o), int(n)) for k, o, _i, n in comp] for comp in meta.get("state") or []]
        self.state_idx = [None if x is None else int_list(x) for x in meta.get("state_indices") or []]
        self.next_piece = 0
        self.pending = 0
        self.bytes = 0
        self.segments = 0
        self.outcome_posted = False
        # No submission from submit_by on, every transfer ended by land_by
        # (this clock; inf: the decode side gave no bound).
        self.submit_by = math.inf
        self.land_by = math.inf
        self.xfer_timeout = xfer_timeout
        within, xfer_ms = meta.get("submit_within_ms"), meta.get("transfer_timeout_ms")
        if within is not None:
            self.submit_by = arrived + int(within) / 1000
        if xfer_ms is not None:
            # No transfer outlives what the decode side assumes (its fence holds that long).
            self.land_by = self.submit_by + int(xfer_ms) / 1000
            self.xfer_timeout = min(xfer_timeout or math.inf, int(xfer_ms) / 1000)


class KvproxyKVSender(RequestBase):
    """Prefill side of one request (sglang's ``KVSender``; ``KVSender(mgr,
    bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank,
    req_has_disagg_prefill_dp_rank=False)``, positionally or by keyword).

    Call sequence (sglang's prefill scheduler): ``poll()`` until
    ``WaitingForInput`` (the decode side's metadata arrived),
    ``pop_decode_prefix_len()``, ``init(num_pages, aux_index)``, ``send()``
    once per chunk of page indices, ``poll()`` until ``Success`` or
    ``Failed``, ``clear()``. The manager also ends and forgets senders sglang
    never clears (timeouts, sweeps).
    """

    def __init__(self, mgr: Any, bootstrap_addr: Optional[str], bootstrap_room: int,
                 dest_tp_ranks: Optional[List[int]] = None, pp_rank: int = 0,
                 req_has_disagg_prefill_dp_rank: bool = False, **_ignored: Any) -> None:
        if mgr.mode != "prefill":
            raise ValueError("a KVSender needs a prefill manager")
        self._init_request(mgr, bootstrap_addr, bootstrap_room)
        self.dest_tp_ranks = dest_tp_ranks
        self.pp_rank = pp_rank
        self._dests: List[_Dest] = []
        self._required: Optional[int] = None  # decode ranks this rank serves for the request
        self._prefix_len = 0
        self._num_pages: Optional[int] = None
        self._aux_index: Optional[int] = None
        self._state_src: Optional[List[Optional[List[int]]]] = None
        self._sent_pages = 0
        self._all_sent = False
        self._pending = 0
        self._ended_recorded = False
        self._t_send: Optional[float] = None
        self._t_done: Optional[float] = None
        self.t_waiting: Optional[float] = None  # when the last decode rank's metadata arrived (bootstrap latency)
        with mgr._lock:
            mgr.side.add_sender_locked(self, bool(req_has_disagg_prefill_dp_rank))

    # ---- bookkeeping ----

    def dest_of(self, tag: Any) -> Optional[_Dest]:
        return next((d for d in self._dests if d.tag == tag), None)

    @property
    def submit_by(self) -> float:
        """The earliest moment a decode rank of the request stops waiting for it."""
        return min((d.submit_by for d in self._dests), default=math.inf)

    @property
    def transfers_made(self) -> int:
        """kvproxy transfers this request was cut into so far, all its decode ranks together."""
        return sum(d.next_piece for d in self._dests)

    @property
    def segments_submitted(self) -> int:
        """kvproxy segments (descriptors) this request used so far, all its decode ranks together."""
        return sum(d.segments for d in self._dests)

    # manager lock held (channel thread)
    def _on_meta_locked(self, meta: Dict[str, Any], conn: Conn, arrived: float) -> None:
        mgr = self.kv_mgr
        try:
            tag = int(meta["tag"])
            if meta.get("v") != PROTO_VERSION:
                raise ValueError(f"metadata version {meta.get('v')}, this adapter speaks {PROTO_VERSION}")
            if self.dest_of(tag) is not None:
                return  # a duplicate
            theirs = (conn.hello or {}).get("layout") or {}
            plan = build_plan(mgr.layout_announce(), theirs)
            required = dests_per_source(mgr.attn_tp_size, int(theirs["attn_tp_size"]))
            node = str(meta["node_id"])
            pages = expand_runs(meta["pages"])
            if meta.get("aux_index") is not None and [int(x[2]) for x in meta["aux"]] != mgr.aux_item_lens:
                raise LayoutError(f"aux buffers differ: prefill {mgr.aux_item_lens}, decode "
                                  f"{[int(x[2]) for x in meta['aux']]} bytes per row")
            if len(meta.get("state") or []) != len(mgr.states):
                raise LayoutError(f"state components differ: prefill {len(mgr.states)}, decode "
                                  f"{len(meta.get('state') or [])}")
        except LayoutError as e:
            self._refuse_locked(conn, meta, "layout", f"{e} (decode rank {meta.get('engine_rank')} at "
                                f"{meta.get('node_id')})")
            return
        except (KeyError, TypeError, ValueError) as e:
            self._refuse_locked(conn, meta, "protocol", f"bad metadata from the decode side: {e!r}")
            return
        try:
            addr = meta.get("kvp_addr") or (conn.hello or {}).get("kvp_addr")
            peer = mgr.side.peer_index(node, str(addr) if addr else None)
        except PeerNotFound as e:
            self._refuse_locked(conn, meta, "peer-unknown", f"decode node {node!r} is not a peer of kvproxyd "
                                f"{mgr.node_id} and sent no kvproxyd address (KVPROXY_ADDR): "
                                f"{e.reason or e.strerror}")
            return
        except KvproxyError as e:
            self._refuse_locked(conn, meta, "daemon-gone" if isinstance(e, Disconnected) else "protocol", str(e))
            return
        try:
            dest = _Dest(conn, meta, tag, peer, plan, pages, arrived, mgr.config.transfer_timeout)
        except (KeyError, TypeError, ValueError) as e:
            self._refuse_locked(conn, meta, "protocol", f"bad metadata from the decode side: {e!r}")
            return
        self._dests.append(dest)
        if self._required is not None and required != self._required:
            self._fail_locked("layout", f"decode ranks of one request differ in attention TP size "
                              f"({self._required} and {required} per prefill rank)")
            return
        self._required = required
        if len(self._dests) > required:
            self._fail_locked("protocol", f"metadata from {len(self._dests)} decode ranks, this prefill rank "
                              f"serves {required}")
            return
        if self._num_pages is not None and len(pages) != self._num_pages:
            self._fail_locked("layout", f"prefill sends {self._num_pages} pages, the decode side "
                              f"(rank {dest.tp_rank}) allocated {len(pages)}")
            return
        self._prefix_len = int(meta.get("decode_prefix_len") or 0)
        if len(self._dests) == required:
            self.t_waiting = time.monotonic()
            self._set_locked(KVPoll.WaitingForInput)

    def _refuse_locked(self, conn: Conn, meta: Dict[str, Any], code: str, reason: str) -> None:
        """Fail the request over one decode rank's metadata, and tell that rank
        (it is not one of the destinations: nothing was queued for it)."""
        self._fail_locked(code, reason)
        self.kv_mgr.side._status(conn, self.bootstrap_room, meta.get("tag"), self._outcome(None))

    def _on_abort_locked(self, msg: Dict[str, Any]) -> None:
        code, reason = str(msg.get("code", "?")), str(msg.get("reason", "?"))
        if code == "layout":
            self._fail_locked("layout", reason)
        else:
            self._fail_locked("aborted-by-decode", f"the decode side ({msg.get('node_id', '?')}) gave the "
                              f"request up: {code}: {reason}")

    def _outcome(self, dest: Optional[_Dest]) -> Dict[str, Any]:
        if self._state == KVPoll.Success:
            return {"state": "success", "bytes": dest.bytes if dest else 0}
        f = self._failure
        code = f.code if f else "?"
        return {"state": "aborted" if code == "aborted-by-decode" else "failed", "code": code,
                "reason": f.failure_reason if f else "?"}

    def _post_outcomes_locked(self, force: bool = False) -> None:
        """Tell each decode rank the outcome once none of its transfers is queued
        or in flight (kvproxyd completes a cancelled transfer only after its
        last byte); ``force``: now (the client is closing)."""
        side = self.kv_mgr.side
        for d in self._dests:
            if not d.outcome_posted and (force or d.pending == 0):
                d.outcome_posted = True
                side._status(d.conn, self.bootstrap_room, d.tag, self._outcome(d))
        if not self._dests and not self._ended_recorded and self._state in FINAL:
            self._ended_recorded = True  # metadata arriving later gets this outcome
            side.ended[self.bootstrap_room] = (self._outcome(None), time.monotonic())

    def _settle_locked(self) -> None:
        if self._state == KVPoll.Failed:
            self._post_outcomes_locked()

    def _fail_locked(self, code: str, reason: str, completion: Optional[Completion] = None,
                     from_prefill: bool = False) -> bool:
        if not super()._fail_locked(code, reason, completion, from_prefill):
            return False
        side = self.kv_mgr.side
        side.drop_queued_locked(self)
        side.cancel_inflight_locked(self)
        self._settle_locked()  # now, or when the last cancelled transfer's completion is in
        return True

    def _check_done_locked(self) -> None:
        if self._all_sent and self._pending == 0 and self._state not in FINAL:
            self._t_done = time.monotonic()
            self._set_locked(KVPoll.Success)
            self._post_outcomes_locked()

    # reaper thread, manager lock held
    def _piece_done_locked(self, piece: Any, c: Completion) -> None:
        self._pending -= 1
        dest = piece.dest
        dest.pending -= 1
        if c.ok:
            dest.bytes += c.bytes
            self._check_done_locked()
            self._settle_locked()
            return
        hint = " (the decode side refused it: it gave the request up and fenced it, or the region is gone)" \
            if c.status_name == "remote" else f": {c.detail}" if c.detail else ""
        if c.status_name == "no-peer":
            self.kv_mgr.side.forget_peer(dest.node)
        if not self._fail_locked(c.status_name, f"kvproxy transfer {c.user_id:#x} ({c.nseg} segments) from "
                                 f"{self.kv_mgr.node_id} to {dest.node} ended with status {c.status_name}{hint}",
                                 completion=c):
            self._settle_locked()

    # ---- sglang's calls ----

    def poll(self) -> KVPoll:
        """The request's state (timeouts are enforced by the manager's reaper)."""
        return self._state

    def pop_decode_prefix_len(self) -> int:
        """Tokens of the request the decode side already holds (it is sent only the rest); 0 after the first call."""
        with self.kv_mgr._lock:
            n, self._prefix_len = self._prefix_len, 0
            return n

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        """True for a chunk with pages, and for the last chunk even without (it carries the aux row and state)."""
        return num_pages > 0 or bool(last_chunk)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        """Announce the request's size: ``num_kv_indices`` pages in all, and its aux row.

        The page count must equal what every decode rank allocated, else the request fails (``layout``).
        """
        with self.kv_mgr._lock:
            if self._state in FINAL:
                return
            self._num_pages = int(num_kv_indices)
            self._aux_index = None if aux_index is None else int(aux_index)
            for d in self._dests:
                if self._num_pages != len(d.pages):
                    self._fail_locked("layout", f"prefill sends {self._num_pages} pages, the decode side "
                                      f"(rank {d.tp_rank}) allocated {len(d.pages)}")
                    return

    def send(self, kv_indices: Any, state_indices: Any = None, token_position_offset: int = 0, **kw: Any) -> None:
        """Send one chunk: the pages ``kv_indices`` (page indices, in request
        order) go to the decode side's next pages; the chunk that completes
        the count given to :meth:`init` also sends the aux row and the state
        rows ``state_indices`` (one list per state component, sglang passes
        them with the last chunk). A ``producer_event`` keyword (the forward
        that wrote the pages) holds the chunk's transfers back until it
        completed. Errors fail the request (see :meth:`poll`); nothing is raised."""
        pages = int_list(kv_indices)
        event = kw.get("producer_event")
        mgr = self.kv_mgr
        with mgr._lock:
            if self._state in FINAL:
                return
            if self._required is None or len(self._dests) < self._required or self._num_pages is None:
                self._fail_locked("protocol", "send() before the decode side's metadata arrived and init() was called")
                return
            if state_indices is not None and any(x is not None for x in state_indices):
                sidx = [None if x is None else int_list(x) for x in state_indices]
                if len(sidx) != len(mgr.states):
                    self._fail_locked("layout", f"send() got state indices for {len(sidx)} components, the "
                                      f"manager has {len(mgr.states)} ({[c['type'] for c in mgr.states]})")
                    return
                self._state_src = sidx
            start, end = self._sent_pages, self._sent_pages + len(pages)
            if end > self._num_pages:
                self._fail_locked("layout", f"{end} pages sent, init() announced {self._num_pages}")
                return
            if mgr._kv is None:
                self._fail_locked("memory-released", "send() while the engine's KV memory is released")
                return
            last = end == self._num_pages
            try:
                per_dest = [(d, self._segments(d, pages, start, end, last)) for d in self._dests]
            except ValueError as e:
                self._fail_locked("layout", str(e))
                return
            self._sent_pages = end
            self._all_sent = last
            if self._t_send is None:
                self._t_send = time.monotonic()
            self._set_locked(KVPoll.Transferring)
            for d, segs in per_dest:
                if segs and self._state not in FINAL:
                    mgr.side.enqueue_locked(self, d, segs, event)
            mgr.side.flush_locked()
            self._check_done_locked()

    def _segments(self, d: _Dest, pages: List[int], start: int, end: int, last: bool) -> List[Seg]:
        """This chunk's segments for decode rank ``d``.

        :raises ValueError: an index is outside a buffer, or the state lists do not pair.
        """
        mgr = self.kv_mgr
        kv_src = [(p.key, p.offset, p.length) for p in mgr.kv_placements()]
        segs = segments(d.plan.kv, kv_src, d.kv, pair_runs(pages, d.pages[start:end]), "KV pages")
        if not last:
            return segs
        daux = d.meta.get("aux_index")
        if d.plan.aux and daux is not None and mgr.aux_item_lens:
            if self._aux_index is None:
                raise ValueError("the decode side expects an aux row, init() gave no aux_index")
            assert mgr._aux is not None
            for p, item in zip(mgr._aux.placements, mgr.aux_item_lens):
                p.to_mirror(self._aux_index * item, item)
            aux_src = [(p.key, p.offset, p.length) for p in mgr._aux.placements]
            segs += segments(d.plan.aux, aux_src, d.aux, [(self._aux_index, int(daux), 1)], "aux rows")
        for k, (comp, places) in enumerate(zip(mgr.states, mgr.state_placements())):
            src = self._state_src[k] if self._state_src and k < len(self._state_src) else None
            dst = d.state_idx[k] if k < len(d.state_idx) else None
            if not src or not dst or not d.plan.states[k]:
                continue
            if len(src) != len(dst):
                if d.plan.exact[k]:
                    raise ValueError(f"state {comp['type']}: prefill {len(src)} indices, decode {len(dst)}")
                log.warning("bootstrap room %d: state %s: prefill %d indices, decode %d: moving the first %d",
                            self.bootstrap_room, comp["type"], len(src), len(dst), min(len(src), len(dst)))
                src, dst = src[:len(dst)], dst[:len(src)]
            segs += segments(d.plan.states[k], [(p.key, p.offset, p.length) for p in places], d.state[k],
                             pair_runs(src, dst), f"state {comp['type']} rows")
        return segs

    def get_transfer_metric(self) -> TransferMetric:
        """Seconds from the first send() to Success, and the bytes moved to all
        the request's decode ranks (also after clear())."""
        lat = self._t_done - self._t_send if self._t_done is not None and self._t_send is not None else None
        return TransferMetric(transfer_latency_s=lat, transfer_total_bytes=sum(d.bytes for d in self._dests))

    def failure_exception(self) -> None:
        """Raise the request's :class:`KVTransferError`. sglang calls it when the
        MIN of its ranks' polls is Failed: a sender that has not failed itself
        then ends as ``another-rank`` (its transfers cancelled) and the error
        says ``is_from_another_rank``."""
        with self.kv_mgr._lock:
            err = self._another_rank_error()
            if self._state not in FINAL:
                self._fail_locked("another-rank", err.failure_reason)
            if self._state == KVPoll.Failed and self._failure is not None:
                err = self._failure
                err.is_from_another_rank = err.code == "another-rank"
        raise err

    def abort(self) -> None:
        """Give the request up: ``Failed`` with code ``aborted``; its transfers
        are cancelled and the decode side is told."""
        with self.kv_mgr._lock:
            self._fail_locked("aborted", "aborted by the engine")

    def clear(self) -> None:
        """Forget the request (normally after Success or Failed; an open one is aborted first)."""
        mgr = self.kv_mgr
        with mgr._lock:
            if self._state not in FINAL:
                self._fail_locked("aborted", "cleared by the engine before the transfer ended")
            if self._pending == 0 and mgr.side.senders.get(self.bootstrap_room) is self:
                del mgr.side.senders[self.bootstrap_room]
