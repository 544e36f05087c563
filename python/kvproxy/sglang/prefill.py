# SPDX-License-Identifier: BSD-3-Clause
"""Prefill side: the manager's prefill state (:class:`PrefillSide`).

A prefill manager registers at the bootstrap server (``PUT /route``, with
the address of its channel listener), answers each decode connection's
hello with its layout, hands each decode rank's metadata for a room to the
room's sender (:mod:`kvproxy.sglang.sender`), and submits the senders'
kvproxy transfers: at most ``max_inflight`` in flight, the rest queued.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Tuple

from .._client import Completion
from .._errors import KvproxyError, PeerNotFound, RingFull
from ._common import FINAL, PIECE_BITS, PIECE_MAX, PROTO_VERSION, KVPoll
from .bootstrap import RegistryError, registry_call
from .channel import Channel, Conn
from .config import env_flag
from .layout import Seg, split
from .topology import advertised_ip, registry_addr

if TYPE_CHECKING:
    from .sender import KvproxyKVSender, _Dest

__all__ = ["PrefillSide"]

log = logging.getLogger("kvproxy.sglang")

# Bytes per kvproxy transfer: many medium transfers keep the daemon's window
# full and pipeline; a few huge ones (a long run of contiguous pages) do not.
PIECE_BYTES = 32 << 20


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
    """One kvproxy transfer of a request to one of its decode ranks."""

    __slots__ = ("sender", "dest", "uid", "peer", "segs", "event")

    def __init__(self, sender: "KvproxyKVSender", dest: "_Dest", uid: int, peer: int, segs: List[Seg],
                 event: Any) -> None:
        self.sender = sender
        self.dest = dest
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
        # Metadata for rooms with no sender (yet), one per decode rank: room -> [(msg, conn, arrival)].
        self.stash_meta: Dict[int, List[Tuple[Dict[str, Any], Conn, float]]] = {}
        self.stash_abort: Dict[int, Tuple[Dict[str, Any], float]] = {}
        # Rooms whose sender failed before any metadata came: room -> (status, time).
        self.ended: Dict[int, Tuple[Dict[str, Any], float]] = {}
        self.queue: Deque[_Piece] = deque()
        self.inflight: Dict[int, _Piece] = {}
        # Transfers in flight allowed now: max_inflight, halved when kvproxyd
        # answers no-buffers (our own backlog outwaited its admission_ms),
        # one more per transfer that ends ok; requeued counts the retries.
        self.window = mgr.config.max_inflight
        self.requeued = 0
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
            # Metadata beyond the decode ranks this rank serves for the room.
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
        self.stash_meta.setdefault(room, []).append((msg, conn, now))  # its sender comes later

    def _abort_locked(self, room: int, msg: Dict[str, Any], conn: Conn) -> None:
        s = self.senders.get(room)
        tag = msg.get("tag")
        if s is not None and s._state not in FINAL and (s.dest_of(tag) is not None or not s._dests):
            s._on_abort_locked(msg)  # its outcome follows once none of its transfers is in flight
            return
        if s is not None and s.dest_of(tag) is not None and s._pending:
            return  # it ended already; its outcome follows with its last completion
        stashed = [m for m in self.stash_meta.get(room, []) if m[0].get("tag") != tag]
        if stashed:
            self.stash_meta[room] = stashed
        else:
            self.stash_meta.pop(room, None)
        self.stash_abort[room] = (msg, time.monotonic())
        # Nothing of this request is in flight here (the channel is ordered:
        # its metadata, if any, came first): the decode side may stop waiting.
        self._status(conn, room, tag, {"state": "aborted", "code": "aborted-by-decode",
                                       "reason": "the prefill rank holds nothing of the request"})

    def _on_close(self, conn: Conn, reason: str) -> None:
        with self.mgr._lock:
            for s in list(self.senders.values()):
                if s._state not in FINAL and any(d.conn is conn for d in s._dests):
                    s._fail_locked("unreachable", f"the decode side's channel from {conn.name} closed: {reason}")
            for room in list(self.stash_meta):
                kept = [m for m in self.stash_meta[room] if m[1] is not conn]
                if kept:
                    self.stash_meta[room] = kept
                else:
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
        for meta in self.stash_meta.pop(room, []):
            s._on_meta_locked(*meta)
        if ab is not None:
            s._on_abort_locked(ab[0])

    @staticmethod
    def _register_dp_rank(addr: str, room: int, dp: int) -> None:
        try:
            registry_call(addr, "POST", "/register_dp_rank", {"bootstrap_room": room, "dp_rank": dp})
        except RegistryError as e:
            log.error("kvproxy prefill: register DP rank of room %d: %s", room, e)

    def peer_index(self, node: str, addr: Optional[str] = None) -> int:
        """kvproxyd's index of decode node ``node``: by its node id (a peer of
        our kvproxyd), else by the address its bootstrap carried (dialled on
        demand: no peer lists needed). Cached until a transfer says no-peer."""
        idx = self.peers.get(node)
        if idx is None:
            try:
                idx = self.mgr.client.peer(node)
            except PeerNotFound:
                if not addr:
                    raise
                idx = self.mgr.client.peer(addr)
            self.peers[node] = idx
        return idx

    def forget_peer(self, node: str) -> None:
        """A transfer to ``node`` ended with no-peer: it left the table; look it up again next time."""
        self.peers.pop(node, None)

    # ---- submission ----

    def enqueue_locked(self, s: "KvproxyKVSender", dest: "_Dest", segs: List[Seg], event: Any) -> None:
        """Queue ``segs`` for one decode rank of ``s`` as kvproxy transfers
        (submitted by :meth:`flush_locked`)."""
        for piece in split(segs, self.mgr.max_segments, PIECE_BYTES, self.mgr.config.max_blocks):
            if dest.next_piece > PIECE_MAX:
                s._fail_locked("unsupported", f"a request needs more than {PIECE_MAX + 1} kvproxy transfers")
                return
            uid = (dest.tag << PIECE_BITS) | dest.next_piece
            dest.next_piece += 1
            if uid in self.inflight:
                s._fail_locked("protocol", f"transfer id {uid:#x} is already in flight (two decode receivers drew one tag)")
                return
            self.queue.append(_Piece(s, dest, uid, dest.peer, piece, event))
            s._pending += 1
            dest.pending += 1
            dest.segments += len(piece)

    def flush_locked(self) -> None:
        """Submit queued transfers while fewer than the window are in flight."""
        self.ring_full = self.waiting_event = False
        mgr = self.mgr
        while self.queue and len(self.inflight) < self.window:
            piece = self.queue[0]
            s, dest = piece.sender, piece.dest
            if s._state in FINAL:
                self.queue.popleft()
                s._pending -= 1
                dest.pending -= 1
                s._settle_locked()
                continue
            if piece.event is not None:
                if not _event_done(piece.event):
                    self.waiting_event = True  # the reaper looks again in a millisecond
                    return
                piece.event = None
            now = time.monotonic()
            if now >= dest.submit_by:
                s._fail_locked("waiting-timeout", "the decode side stopped waiting for this request "
                               "(its waiting_timeout passed) before it was submitted")
                continue
            timeout = dest.xfer_timeout
            if not math.isinf(dest.land_by):
                timeout = min(timeout or math.inf, max(dest.land_by - now, 1e-3))
            try:
                mgr.client.submit(piece.peer, piece.segs, piece.uid, timeout=timeout)
            except RingFull:
                self.ring_full = True  # the reaper retries soon: no completion may come to wake it
                return
            except KvproxyError as e:
                self.queue.popleft()
                s._pending -= 1
                dest.pending -= 1
                s._fail_locked("submit", str(e))
                continue
            self.queue.popleft()
            self.inflight[piece.uid] = piece

    def drop_queued_locked(self, s: "KvproxyKVSender") -> None:
        kept: Deque[_Piece] = deque()
        for p in self.queue:
            if p.sender is s:
                s._pending -= 1
                p.dest.pending -= 1
            else:
                kept.append(p)
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
            if piece is None:
                return
            if c.ok:
                self.window = min(self.window + 1, self.mgr.config.max_inflight)
            elif c.status_name == "no-buffers" and c.bytes == 0 and piece.sender._state not in FINAL:
                # kvproxyd wrote nothing of it: it waited for a slot or staging
                # buffers behind our own transfers for longer than its
                # admission_ms. That is back-pressure, not a failed request:
                # send it again first, with fewer in flight. flush_locked's
                # deadline checks (submit_by, land_by) still bound it.
                self.window = max(1, len(self.inflight) // 2)
                self.requeued += 1
                self.queue.appendleft(piece)
                return
            piece.sender._piece_done_locked(piece, c)

    def after_reap_locked(self) -> None:
        self.flush_locked()

    def tick_locked(self, now: float) -> None:
        cfg = self.mgr.config
        for room, s in list(self.senders.items()):
            if s._state == KVPoll.Bootstrapping and now - s._t0 > cfg.bootstrap_timeout:
                s._fail_locked("bootstrap-timeout", f"no metadata from the decode side within "
                               f"{cfg.bootstrap_timeout:g} s (bootstrap server {s.bootstrap_addr})")
            elif s._state in (KVPoll.WaitingForInput, KVPoll.Transferring) and not s._all_sent and now >= s.submit_by:
                s._fail_locked("waiting-timeout", "the decode side's waiting_timeout passed before the last chunk")
            if s._state in FINAL and s._pending == 0 and self.senders.get(room) is s:
                del self.senders[room]  # swept: sglang need not call clear()
        horizon = now - cfg.bootstrap_timeout
        for table in (self.stash_abort, self.ended):
            for room in [r for r, v in table.items() if v[-1] < horizon]:
                del table[room]
        for room in [r for r, v in self.stash_meta.items() if v[0][-1] < horizon]:
            del self.stash_meta[room]

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
            for d in s._dests:
                d.pending = 0
        self.fail_all_locked("daemon-gone", why)

    def close_locked(self) -> None:
        self._stop.set()
        self.fail_all_locked("closed", "the kvproxy manager is closed")
        for s in self.senders.values():
            s._post_outcomes_locked(force=True)  # its client closes now: the daemon ends its transfers

    def shutdown(self) -> None:
        self._stop.set()
        self.channel.flush(1.0)
        self.channel.close()


