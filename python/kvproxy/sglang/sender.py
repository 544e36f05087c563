# SPDX-License-Identifier: BSD-3-Clause
"""Prefill side: the sender of one request, and the manager's prefill state.

A prefill manager registers at the bootstrap server (``PUT /route``, with
the address of its channel listener), answers each decode connection's
hello with its layout, and turns the decode side's metadata for a room into
kvproxy transfers when sglang calls ``send()``: pages paired with the
decode side's pages, coalesced into segments, grouped into transfers of at
most ``max_segments`` and 32 MiB, at most ``max_inflight`` of them in
flight. The outcome goes back to the decode connection once none of the
request's transfers is queued or in flight.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

from .._client import Completion
from .._errors import Disconnected, KvproxyError, PeerNotFound, RingFull
from ._common import (FINAL, PIECE_BITS, PIECE_BYTES, PIECE_MAX, PROTO_VERSION, KVPoll, RequestBase, Seg,
                      TransferMetric, expand_runs, has_items, int_list, pair_runs, split)
from .bootstrap import RegistryError, registry_call
from .channel import Channel, Conn
from .config import env_flag
from .topology import advertised_ip, registry_addr

__all__ = ["KvproxyKVSender", "PrefillSide"]

log = logging.getLogger("kvproxy.sglang")


def _event_done(ev: Any) -> bool:
    """True once a producer event (a CUDA event: the forward that wrote the
    pages) completed; anything without ``query()`` counts as done."""
    try:
        return bool(ev.query())
    except Exception:  # noqa: BLE001 - not an event: nothing to wait for
        return True


def _leader_port(sa: Any) -> Optional[int]:
    """On a multi-node prefill server, world rank 0's bootstrap port, as sglang's
    own managers agree on it (launchers may reserve a different free port per
    host; the bootstrap server listens on rank 0's). Every prefill rank builds
    its manager at the same point of its start-up, so this collective matches
    up across ranks as sglang's does. None: single node, or no sglang."""
    if not getattr(sa, "dist_init_addr", None) or int(getattr(sa, "nnodes", 1) or 1) <= 1:
        return None
    try:
        import torch.distributed as dist  # type: ignore[import-not-found]
        from sglang.srt.distributed import get_world_group  # type: ignore[import-not-found]

        if not (dist.is_available() and dist.is_initialized()):
            return None
        port = int(get_world_group().broadcast_object(int(sa.disaggregation_bootstrap_port), src=0))
    except Exception as e:  # noqa: BLE001 - not sglang's processes: the configured port
        log.debug("kvproxy prefill: no bootstrap port from world rank 0 (%s)", e)
        return None
    return port


class _Piece:
    """One kvproxy transfer of a request."""

    __slots__ = ("sender", "uid", "peer", "segs", "event")

    def __init__(self, sender: "KvproxyKVSender", uid: int, peer: int, segs: List[Seg], event: Any) -> None:
        self.sender = sender
        self.uid = uid
        self.peer = peer
        self.segs = segs
        self.event = event


class PrefillSide:
    """A prefill manager's state: senders by room, metadata that arrived
    before its sender, the submission queue, the channel listener."""

    def __init__(self, mgr: Any) -> None:
        self.mgr = mgr
        sa = mgr.server_args
        self.senders: Dict[int, KvproxyKVSender] = {}
        # Messages for rooms with no sender (yet): room -> (msg, conn, arrival).
        self.stash_meta: Dict[int, Tuple[Dict[str, Any], Conn, float]] = {}
        self.stash_abort: Dict[int, Tuple[Dict[str, Any], float]] = {}
        # Rooms whose sender failed before any metadata came: room -> (status, time).
        self.ended: Dict[int, Tuple[Dict[str, Any], float]] = {}
        self.queue: Deque[_Piece] = deque()
        self.inflight: Dict[int, _Piece] = {}
        self.ring_full = False
        self.waiting_event = False
        self.peers: Dict[str, int] = {}
        self.lb_method = str(getattr(sa, "load_balance_method", None) or "follow_bootstrap_room")
        self.dp_size = int(getattr(sa, "dp_size", 1) or 1)
        self.registry = registry_addr(sa, _leader_port(sa))
        if not self.registry:
            raise ValueError("prefill manager: server_args.disaggregation_bootstrap_port is not set")
        self.rank_ip = advertised_ip(mgr.config.host_ip, self.registry)
        self.channel = Channel(f"p{mgr.engine_rank}", self._on_message, self._on_open, self._on_close,
                               listen=("::" if ":" in self.rank_ip else "0.0.0.0", 0))
        self.port = self.channel.port
        self.registered = threading.Event()
        self._stop = threading.Event()
        t = mgr.topology
        self._payload = {
            **t.as_dict(),
            "rank_ip": self.rank_ip,
            "rank_port": self.port,
            "page_size": mgr.page_size,
            "kv_cache_dtype": mgr.kv_cache_dtype,
            "load_balance_method": self.lb_method,
            "enable_dsa_cache_layer_split": False,
            "prefill_http_port": getattr(sa, "port", None),
        }
        self._reg_thread = threading.Thread(target=self._register_loop, name=f"kvproxy-reg-{mgr.engine_rank}",
                                            daemon=True)
        self._reg_thread.start()

    # ---- bootstrap registration ----

    def register_now(self, quiet: bool = False) -> bool:
        """One registration at the bootstrap server; True if it answered OK."""
        try:
            registry_call(self.registry, "PUT", "/route", self._payload, timeout=5.0)
        except RegistryError as e:
            (log.debug if quiet else log.warning)("kvproxy prefill rank %d: register at %s: %s",
                                                  self.mgr.engine_rank, self.registry, e)
            return False
        self.registered.set()
        log.info("kvproxy prefill rank (DP %d TP %d) registered at %s as %s:%d", self.mgr.topology.dp_group,
                 self.mgr.topology.attn_tp_rank, self.registry, self.rank_ip, self.port)
        return True

    def _register_loop(self) -> None:
        delay, warned = 0.1, False
        while not self._stop.is_set():
            if self.register_now(quiet=warned):
                return
            warned = True
            self._stop.wait(delay)
            delay = min(delay * 2, 5.0)

    # ---- channel (I/O thread) ----

    def _on_open(self, conn: Conn) -> None:
        pass  # the decode side speaks first (hello)

    def _on_message(self, conn: Conn, msg: Dict[str, Any]) -> None:
        kind = msg.get("t")
        mgr = self.mgr
        if kind == "hello":
            if msg.get("v") != PROTO_VERSION:
                self.channel.send(conn, {"t": "error", "reason": f"channel version {msg.get('v')}, "
                                                                 f"prefill rank speaks {PROTO_VERSION}"})
                self.channel.drop(conn, "incompatible channel version")
                return
            conn.hello = msg
            self.channel.send(conn, {"t": "hello", "v": PROTO_VERSION, "role": "prefill", "node_id": mgr.node_id,
                                     "layout": mgr.layout_announce(), "topology": mgr.topology.as_dict()})
            return
        if conn.hello is None:
            self.channel.drop(conn, f"{kind!r} before hello")
            return
        with mgr._lock:
            try:
                room = int(msg["room"])
            except (KeyError, TypeError, ValueError):
                log.warning("kvproxy prefill: malformed %r message from %s", kind, conn.name)
                return
            if kind == "meta":
                self._meta_locked(room, msg, conn, time.monotonic())
            elif kind == "abort":
                self._abort_locked(room, msg, conn)

    def _meta_locked(self, room: int, msg: Dict[str, Any], conn: Conn, now: float) -> None:
        s = self.senders.get(room)
        if s is not None and s._state == KVPoll.Bootstrapping:
            s._on_meta_locked(msg, conn, now)
            return
        if s is not None and s._state not in FINAL:
            # A second decode receiver for a room this rank already serves.
            self._status(conn, room, msg.get("tag"), {"state": "failed", "code": "protocol",
                                                       "reason": f"prefill rank already serves room {room}"})
            return
        ended = self.ended.get(room)
        if ended is not None:
            self._status(conn, room, msg.get("tag"), dict(ended[0]))
            return
        ab = self.stash_abort.get(room)
        if ab is not None and ab[0].get("tag") == msg.get("tag"):
            del self.stash_abort[room]
            return
        self.stash_meta[room] = (msg, conn, now)  # its sender comes later (or a rebootstrap's does)

    def _abort_locked(self, room: int, msg: Dict[str, Any], conn: Conn) -> None:
        s = self.senders.get(room)
        if s is not None and s._state not in FINAL and (s._tag == msg.get("tag") or s._meta is None):
            s._on_abort_locked(msg)  # its outcome follows once none of its transfers is in flight
            return
        if s is not None and s._tag == msg.get("tag") and s._pending:
            return  # it ended already; its outcome follows with its last completion
        stashed = self.stash_meta.get(room)
        if stashed is not None and stashed[0].get("tag") == msg.get("tag"):
            del self.stash_meta[room]
        self.stash_abort[room] = (msg, time.monotonic())
        # Nothing of this request is in flight here (the channel is ordered:
        # its metadata, if any, came first): the decode side may stop waiting.
        self._status(conn, room, msg.get("tag"), {"state": "aborted", "code": "aborted-by-decode",
                                                   "reason": "the prefill rank holds nothing of the request"})

    def _on_close(self, conn: Conn, reason: str) -> None:
        with self.mgr._lock:
            for s in list(self.senders.values()):
                if s._conn is conn and s._state not in FINAL:
                    s._fail_locked("unreachable", f"the decode side's channel from {conn.name} closed: {reason}")
            for room in [r for r, v in self.stash_meta.items() if v[1] is conn]:
                del self.stash_meta[room]

    def _status(self, conn: Optional[Conn], room: int, tag: Any, value: Dict[str, Any]) -> None:
        if conn is None:
            return
        value.update({"t": "status", "room": room, "tag": tag, "node_id": self.mgr.node_id})
        self.channel.send(conn, value)

    # ---- senders ----

    def add_sender_locked(self, s: "KvproxyKVSender", has_dp_rank: bool) -> None:
        refusal = self.mgr.refusal_locked()
        if refusal is not None:
            s._fail_locked(*refusal)
            return
        room = s.bootstrap_room
        old = self.senders.get(room)
        if old is not None and old._state not in FINAL:
            s._fail_locked("protocol", f"a second sender for bootstrap room {room} while the first is open")
            return
        self.senders[room] = s
        self.ended.pop(room, None)
        if self.dp_size > 1 and not has_dp_rank:
            dp = self.mgr.topology.dp_group
            if self.lb_method != "follow_bootstrap_room" or (
                    dp != room % self.dp_size and env_flag("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK")):
                addr = s.bootstrap_addr or self.registry
                self.mgr.background(lambda: self._register_dp_rank(addr, room, dp))
            elif dp != room % self.dp_size:
                s._fail_locked("protocol", f"follow_bootstrap_room conflict: dispatched to DP rank {dp}, but "
                                           f"bootstrap room {room} implies DP rank {room % self.dp_size} (set "
                                           "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing)")
                return
        ab = self.stash_abort.pop(room, None)
        meta = self.stash_meta.pop(room, None)
        if ab is not None:
            s._on_abort_locked(ab[0])
        elif meta is not None:
            s._on_meta_locked(*meta)

    @staticmethod
    def _register_dp_rank(addr: str, room: int, dp: int) -> None:
        try:
            registry_call(addr, "POST", "/register_dp_rank", {"bootstrap_room": room, "dp_rank": dp})
        except RegistryError as e:
            log.error("kvproxy prefill: register DP rank of room %d: %s", room, e)

    def peer_index(self, node: str) -> int:
        idx = self.peers.get(node)
        if idx is None:
            idx = self.peers[node] = self.mgr.client.peer(node)
        return idx

    # ---- submission ----

    def enqueue_locked(self, s: "KvproxyKVSender", segs: List[Seg], event: Any) -> None:
        for piece in split(segs, self.mgr.max_segments, PIECE_BYTES):
            if s._next_piece > PIECE_MAX:
                s._fail_locked("unsupported", f"a request needs more than {PIECE_MAX + 1} kvproxy transfers")
                return
            uid = (s._tag << PIECE_BITS) | s._next_piece
            s._next_piece += 1
            if uid in self.inflight:
                s._fail_locked("protocol", f"transfer id {uid:#x} is already in flight (two decode receivers drew one tag)")
                return
            self.queue.append(_Piece(s, uid, s._peer, piece, event))
            s._pending += 1
        self.flush_locked()

    def flush_locked(self) -> None:
        """Submit queued transfers while fewer than max_inflight are in flight."""
        self.ring_full = self.waiting_event = False
        mgr = self.mgr
        while self.queue and len(self.inflight) < mgr.config.max_inflight:
            piece = self.queue[0]
            s = piece.sender
            if s._state in FINAL:
                self.queue.popleft()
                s._pending -= 1
                s._settle_locked()
                continue
            if piece.event is not None:
                if not _event_done(piece.event):
                    self.waiting_event = True  # the reaper looks again in a millisecond
                    return
                piece.event = None
            now = time.monotonic()
            if now >= s._submit_by:
                s._fail_locked("waiting-timeout", "the decode side stopped waiting for this request "
                               "(its waiting_timeout passed) before it was submitted")
                continue
            timeout = s._xfer_timeout
            if not math.isinf(s._land_by):
                timeout = min(timeout or math.inf, max(s._land_by - now, 1e-3))
            try:
                mgr.client.submit(piece.peer, piece.segs, piece.uid, timeout=timeout)
            except RingFull:
                self.ring_full = True  # the reaper retries soon: no completion may come to wake it
                return
            except KvproxyError as e:
                self.queue.popleft()
                s._pending -= 1
                s._fail_locked("submit", str(e))
                continue
            self.queue.popleft()
            self.inflight[piece.uid] = piece

    def drop_queued_locked(self, s: "KvproxyKVSender") -> None:
        kept = deque(p for p in self.queue if p.sender is not s)
        s._pending -= len(self.queue) - len(kept)
        self.queue = kept

    def cancel_inflight_locked(self, s: "KvproxyKVSender") -> None:
        for uid, p in list(self.inflight.items()):
            if p.sender is s:
                try:
                    self.mgr.client.cancel(uid)
                except KvproxyError:
                    pass

    # ---- manager hooks ----

    def wants_fast_poll(self) -> bool:
        return bool(self.queue) and (self.ring_full or self.waiting_event)

    def on_completion(self, c: Completion) -> None:
        if c.kind == "done":
            piece = self.inflight.pop(c.user_id, None)
            if piece is not None:
                piece.sender._piece_done_locked(c)

    def after_reap_locked(self) -> None:
        self.flush_locked()

    def tick_locked(self, now: float) -> None:
        cfg = self.mgr.config
        for room, s in list(self.senders.items()):
            if s._state == KVPoll.Bootstrapping and now - s._t0 > cfg.bootstrap_timeout:
                s._fail_locked("bootstrap-timeout", f"no metadata from the decode side within "
                               f"{cfg.bootstrap_timeout:g} s (bootstrap server {s.bootstrap_addr})")
            elif s._state in (KVPoll.WaitingForInput, KVPoll.Transferring) and not s._all_sent and now >= s._submit_by:
                s._fail_locked("waiting-timeout", "the decode side's waiting_timeout passed before the last chunk")
            if s._state in FINAL and s._pending == 0 and self.senders.get(room) is s:
                del self.senders[room]  # swept: sglang need not call clear()
        horizon = now - cfg.bootstrap_timeout
        for table in (self.stash_meta, self.stash_abort, self.ended):
            for room in [r for r, v in table.items() if v[-1] < horizon]:
                del table[room]

    def fail_all_locked(self, code: str, reason: str) -> None:
        for s in list(self.senders.values()):
            s._fail_locked(code, reason)

    def quiescent_locked(self) -> bool:
        return not self.inflight and not self.queue

    def on_daemon_gone_locked(self, why: str) -> None:
        self.queue.clear()
        self.inflight.clear()
        for s in self.senders.values():
            s._pending = 0  # no completion comes any more, nothing moves any more
        self.fail_all_locked("daemon-gone", why)

    def close_locked(self) -> None:
        self._stop.set()
        self.fail_all_locked("closed", "the kvproxy manager is closed")
        for s in self.senders.values():
            if not s._outcome_posted:  # its client closes now: the daemon ends its transfers
                s._post_outcome_locked()

    def shutdown(self) -> None:
        self._stop.set()
        self.channel.flush(1.0)
        self.channel.close()


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
        self._meta: Optional[Dict[str, Any]] = None
        self._conn: Optional[Conn] = None
        self._peer = 0
        self._tag: Optional[int] = None
        self._dst_pages: List[int] = []
        self._prefix_len = 0
        self._num_pages: Optional[int] = None
        self._aux_index: Optional[int] = None
        self._sent_pages = 0
        self._all_sent = False
        self._next_piece = 0
        self._pending = 0
        self._bytes = 0
        self._outcome_posted = False
        self._t_send: Optional[float] = None
        self._t_done: Optional[float] = None
        self.t_waiting: Optional[float] = None  # when the metadata arrived (bootstrap latency)
        # From the decode side's metadata: no submission from _submit_by on,
        # every transfer ended by _land_by (this clock; inf: no bound given).
        self._submit_by = math.inf
        self._land_by = math.inf
        self._xfer_timeout = mgr.config.transfer_timeout
        with mgr._lock:
            mgr.side.add_sender_locked(self, bool(req_has_disagg_prefill_dp_rank))

    # manager lock held (channel thread)
    def _on_meta_locked(self, meta: Dict[str, Any], conn: Conn, arrived: float) -> None:
        mgr = self.kv_mgr
        self._conn = conn
        try:
            self._tag = int(meta["tag"])
            if meta.get("v") != PROTO_VERSION:
                raise ValueError(f"metadata version {meta.get('v')}, this adapter speaks {PROTO_VERSION}")
            kv, aux = meta["kv"], meta["aux"]
            theirs = [int(x[2]) for x in kv]
            if theirs != mgr.kv_item_lens:
                self._fail_locked("layout", f"KV buffers differ: prefill {len(mgr.kv_item_lens)} x "
                                  f"{mgr.kv_item_lens[:3]}..., decode ({meta.get('node_id')}) {len(theirs)} x "
                                  f"{theirs[:3]}... bytes per page")
                return
            if meta.get("aux_index") is not None and [int(x[2]) for x in aux] != mgr.aux_item_lens:
                self._fail_locked("layout", f"aux buffers differ: prefill {mgr.aux_item_lens}, decode "
                                  f"{[int(x[2]) for x in aux]} bytes per row")
                return
            node = str(meta["node_id"])
            pages = expand_runs(meta["pages"])
            within, xfer_ms = meta.get("submit_within_ms"), meta.get("transfer_timeout_ms")
            if within is not None:
                self._submit_by = arrived + int(within) / 1000
            if xfer_ms is not None:
                # No transfer outlives what the decode side assumes (its fence holds that long).
                self._land_by = self._submit_by + int(xfer_ms) / 1000
                self._xfer_timeout = min(self._xfer_timeout or math.inf, int(xfer_ms) / 1000)
        except (KeyError, TypeError, ValueError) as e:
            self._fail_locked("protocol", f"bad metadata from the decode side: {e}")
            return
        try:
            self._peer = mgr.side.peer_index(node)
        except PeerNotFound as e:
            self._fail_locked("peer-unknown", f"decode node {node!r} is not a peer of kvproxyd {mgr.node_id}: "
                              f"{e.reason or e.strerror}")
            return
        except KvproxyError as e:
            self._fail_locked("daemon-gone" if isinstance(e, Disconnected) else "protocol", str(e))
            return
        self._meta = meta
        self._dst_pages = pages
        self._prefix_len = int(meta.get("decode_prefix_len") or 0)
        self.t_waiting = time.monotonic()
        self._set_locked(KVPoll.WaitingForInput)

    def _on_abort_locked(self, msg: Dict[str, Any]) -> None:
        code, reason = str(msg.get("code", "?")), str(msg.get("reason", "?"))
        if code == "layout":
            self._fail_locked("layout", reason)
        else:
            self._fail_locked("aborted-by-decode", f"the decode side ({msg.get('node_id', '?')}) gave the "
                              f"request up: {code}: {reason}")

    def _post_outcome_locked(self) -> None:
        if self._state == KVPoll.Success:
            value: Dict[str, Any] = {"state": "success", "bytes": self._bytes}
        else:
            f = self._failure
            code = f.code if f else "?"
            value = {"state": "aborted" if code == "aborted-by-decode" else "failed", "code": code,
                     "reason": f.failure_reason if f else "?"}
        self._outcome_posted = True
        side = self.kv_mgr.side
        if self._meta is None:
            side.ended[self.bootstrap_room] = (dict(value), time.monotonic())
        side._status(self._conn, self.bootstrap_room, self._tag, value)

    def _settle_locked(self) -> None:
        """Report the failure once no transfer of the request is queued or in
        flight (kvproxyd completes a cancelled transfer only after its last byte)."""
        if self._state == KVPoll.Failed and self._pending == 0 and not self._outcome_posted:
            self._post_outcome_locked()

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
            self._post_outcome_locked()

    # reaper thread, manager lock held
    def _piece_done_locked(self, c: Completion) -> None:
        self._pending -= 1
        if c.ok:
            self._bytes += c.bytes
            self._check_done_locked()
            self._settle_locked()
            return
        dst = self._meta.get("node_id") if self._meta else "?"
        hint = " (the decode side refused it: it gave the request up and fenced it, or the region is gone)" \
            if c.status_name == "remote" else ""
        if not self._fail_locked(c.status_name, f"kvproxy transfer {c.user_id:#x} ({c.nseg} segments) from "
                                 f"{self.kv_mgr.node_id} to {dst} ended with status {c.status_name}{hint}", completion=c):
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
        """True for a chunk with pages, and for the last chunk even without (it carries the aux row)."""
        return num_pages > 0 or bool(last_chunk)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        """Announce the request's size: ``num_kv_indices`` pages in all, and its aux row.

        The page count must equal what the decode side allocated, else the request fails (``layout``).
        """
        with self.kv_mgr._lock:
            if self._state in FINAL:
                return
            self._num_pages = int(num_kv_indices)
            self._aux_index = None if aux_index is None else int(aux_index)
            if self._meta is not None and self._num_pages != len(self._dst_pages):
                self._fail_locked("layout", f"prefill sends {self._num_pages} pages, the decode side "
                                  f"allocated {len(self._dst_pages)}")

    def send(self, kv_indices: Any, state_indices: Any = None, token_position_offset: int = 0, **kw: Any) -> None:
        """Send one chunk: the pages ``kv_indices`` (page indices, in request
        order) go to the decode side's next pages; the chunk that completes
        the count given to :meth:`init` also sends the aux row. A
        ``producer_event`` keyword (the forward that wrote the pages) holds
        the chunk's transfers back until it completed. Errors fail the
        request (see :meth:`poll`); nothing is raised."""
        pages = int_list(kv_indices)
        event = kw.get("producer_event")
        mgr = self.kv_mgr
        with mgr._lock:
            if self._state in FINAL:
                return
            if self._meta is None or self._num_pages is None:
                self._fail_locked("protocol", "send() before the decode side's metadata arrived and init() was called")
                return
            if has_items(state_indices):
                self._fail_locked("unsupported", "state buffers (mamba/SWA/DSA) are not moved by kvproxy.sglang")
                return
            start, end = self._sent_pages, self._sent_pages + len(pages)
            if end > self._num_pages:
                self._fail_locked("layout", f"{end} pages sent, init() announced {self._num_pages}")
                return
            if mgr._kv is None:
                self._fail_locked("memory-released", "send() while the engine's KV memory is released")
                return
            try:
                segs = self._kv_segments(pages, self._dst_pages[start:end])
                last = end == self._num_pages
                daux = self._meta.get("aux_index")
                if last and daux is not None and mgr.aux_item_lens:
                    if self._aux_index is None:
                        raise ValueError("the decode side expects an aux row, init() gave no aux_index")
                    segs += self._aux_segments(self._aux_index, int(daux))
            except ValueError as e:
                self._fail_locked("layout", str(e))
                return
            self._sent_pages = end
            self._all_sent = last
            if self._t_send is None:
                self._t_send = time.monotonic()
            self._set_locked(KVPoll.Transferring)
            if segs:
                mgr.side.enqueue_locked(self, segs, event)
            self._check_done_locked()

    def _kv_segments(self, src: List[int], dst: List[int]) -> List[Seg]:
        """Segments moving source pages ``src`` onto destination pages ``dst``, every KV buffer.

        :raises ValueError: a page index is out of a buffer's bounds.
        """
        mgr = self.kv_mgr
        assert self._meta is not None and mgr._kv is not None
        layout = self._meta["kv"]
        prs = pair_runs(src, dst)
        segs: List[Seg] = []
        for b, (p, item) in enumerate(zip(mgr._kv.placements, mgr.kv_item_lens)):
            dkey, doff, _ditem, dlen = (int(x) for x in layout[b])
            for s0, d0, n in prs:
                if s0 < 0 or d0 < 0 or (s0 + n) * item > p.length or (d0 + n) * item > dlen:
                    raise ValueError(f"pages {s0}..{s0 + n - 1} -> {d0}..{d0 + n - 1} are outside buffer {b} "
                                     f"({p.length // item} pages here, {dlen // item} there)")
                segs.append((p.key, p.offset + s0 * item, dkey, doff + d0 * item, n * item))
        return segs

    def _aux_segments(self, src_index: int, dst_index: int) -> List[Seg]:
        """One segment per aux buffer (row ``src_index`` here -> row ``dst_index`` there),
        copying the rows into their mirrors first."""
        mgr = self.kv_mgr
        assert self._meta is not None and mgr._aux is not None
        layout = self._meta["aux"]
        segs: List[Seg] = []
        for b, (p, item) in enumerate(zip(mgr._aux.placements, mgr.aux_item_lens)):
            dkey, doff, _ditem, dlen = (int(x) for x in layout[b])
            if src_index < 0 or dst_index < 0 or (src_index + 1) * item > p.length or (dst_index + 1) * item > dlen:
                raise ValueError(f"aux row {src_index} -> {dst_index} is outside aux buffer {b}")
            p.to_mirror(src_index * item, item)
            segs.append((p.key, p.offset + src_index * item, dkey, doff + dst_index * item, item))
        return segs

    def get_transfer_metric(self) -> TransferMetric:
        """Seconds from the first send() to Success, and the bytes moved (also after clear())."""
        lat = self._t_done - self._t_send if self._t_done is not None and self._t_send is not None else None
        return TransferMetric(transfer_latency_s=lat, transfer_total_bytes=self._bytes)

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
