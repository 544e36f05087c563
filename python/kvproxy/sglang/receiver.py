# SPDX-License-Identifier: BSD-3-Clause
"""Decode side: the receiver of one request, and the manager's decode state.

A decode manager learns a prefill server's topology from its bootstrap
server (``try_ensure_parallel_info``), resolves each request's prefill rank
(``GET /route``, cached), and keeps one channel connection per prefill rank.
The first exchange on a connection is a hello each way: the layouts are
compared there (and the topology at ``try_ensure_parallel_info``), so a
mismatch fails every affected request on both sides at once, with code
``layout`` and a reason naming both values.

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

import http.client
import itertools
import json
import logging
import secrets
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .._client import Completion
from .._errors import KvproxyError, RingFull
from ._common import FENCE_MASK, FINAL, PIECE_BITS, PROTO_VERSION, TAG_BITS, KVPoll, RequestBase, has_items, int_list, runs
from .bootstrap import PrefillInfo, RegistryError, registry_call
from .channel import DEAD_PEER_S, Channel, Conn
from .topology import layout_mismatch, split_hostport

__all__ = ["KvproxyKVReceiver", "DecodeSide"]

log = logging.getLogger("kvproxy.sglang")

# What the decode side assumes of the prefill side's transfer deadline when
# KVPROXY_TRANSFER_TIMEOUT is not set (kvproxyd's shipped timeouts.default_ms),
# and the slack it adds before trusting that a request's data can no longer land.
_DEFAULT_TRANSFER_TIMEOUT = 30.0
_LAND_SLACK = 2.0
_ROUTE_TIMEOUT = 2.0


class DecodeSide:
    """A decode manager's state: receivers, the prefill servers' topologies,
    routes to prefill ranks, channel connections, fences."""

    def __init__(self, mgr: Any) -> None:
        self.mgr = mgr
        self.receivers: Dict[int, KvproxyKVReceiver] = {}
        self.by_tag: Dict[int, KvproxyKVReceiver] = {}
        self.prefill_info_table: Dict[str, PrefillInfo] = {}
        self.mismatch: Dict[str, Optional[str]] = {}
        self.routes: Dict[Tuple[str, int, int, int, int], Tuple[str, int]] = {}
        self.conns: Dict[Tuple[str, int], Conn] = {}
        self.fences: Dict[int, KvproxyKVReceiver] = {}
        self._fence_ids = itertools.count(1)
        self.can_fence = callable(getattr(mgr.client, "fence", None))
        self.channel = Channel(f"d{mgr.engine_rank}", self._on_message, self._on_open, self._on_close)

    # ---- prefill servers ----

    def try_ensure_parallel_info(self, addr: str) -> bool:
        if addr in self.prefill_info_table:
            return True
        path = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
        try:
            info = PrefillInfo.from_json(registry_call(addr, "GET", path, timeout=_ROUTE_TIMEOUT))
        except (RegistryError, KeyError, TypeError, ValueError) as e:
            log.debug("kvproxy decode: prefill info from %s: %s", addr, e)
            return False
        mine = self.mgr.layout_announce()
        theirs = {"attn_tp_size": info.attn_tp_size, "attn_cp_size": info.attn_cp_size, "pp_size": info.pp_size,
                  "page_size": info.page_size, "kv_cache_dtype": info.kv_cache_dtype}
        why = layout_mismatch({k: mine[k] for k in theirs}, theirs, "decode", f"prefill ({addr})")
        with self.mgr._lock:
            self.prefill_info_table[addr] = info
            self.mismatch[addr] = why
            self.mgr._changed.notify_all()
        if why:
            log.error("kvproxy decode: prefill server %s cannot serve this decode server: %s", addr, why)
        return True

    def targets(self, info: PrefillInfo, dp: int) -> List[Tuple[int, int, int, int]]:
        """The prefill ranks (dp, cp, tp, pp) that would send to this decode
        rank, by sglang's mapping (one of them when the layouts agree)."""
        me = self.mgr.topology
        mine, theirs = me.attn_tp_size, max(info.attn_tp_size, 1)
        r = me.attn_tp_rank
        if mine == theirs:
            tps = [r]
        elif mine > theirs:
            tps = [r // max(mine // theirs, 1)]
        else:
            n = theirs // mine
            tps = list(range(r * n, (r + 1) * n))
        cps = list(range(max(info.attn_cp_size, 1)))
        pps = list(range(max(info.pp_size, 1)))
        return [(dp, cp, tp, pp) for cp in cps for tp in tps for pp in pps]

    def route(self, addr: str, key: Tuple[int, int, int, int]) -> Tuple[str, int]:
        """Where prefill rank ``key`` of the server at ``addr`` listens (cached).

        :raises RegistryError: the bootstrap server does not know it or cannot be reached.
        """
        full = (addr, *key)
        ep = self.routes.get(full)
        if ep is None:
            dp, cp, tp, pp = key
            d = registry_call(addr, "GET", f"/route?prefill_dp_rank={dp}&prefill_cp_rank={cp}"
                              f"&target_tp_rank={tp}&target_pp_rank={pp}", timeout=_ROUTE_TIMEOUT)
            try:
                ep = (str(d["rank_ip"]), int(d["rank_port"]))
            except (KeyError, TypeError, ValueError):
                raise RegistryError(f"bootstrap server {addr}: bad route {d!r}") from None
            self.routes[full] = ep
        return ep

    def conn_for_locked(self, ep: Tuple[str, int]) -> Conn:
        """The channel connection to a prefill rank, dialled on first use (hello first)."""
        conn = self.conns.get(ep)
        if conn is None or not conn.open:
            mgr = self.mgr
            hello = {"t": "hello", "v": PROTO_VERSION, "role": "decode", "node_id": mgr.node_id,
                     "layout": mgr.layout_announce(), "topology": mgr.topology.as_dict()}
            conn = self.channel.connect(ep, first=hello)
            conn.data["receivers"] = set()
            self.conns[ep] = conn
        return conn

    def notify_locked(self, r: "KvproxyKVReceiver", keys: List[Tuple[int, int, int, int]], code: str,
                      reason: str) -> None:
        """Tell the prefill ranks ``keys`` that request ``r`` is dead (in the
        background: routes may have to be fetched), so their senders fail now."""
        addr, msg = r.bootstrap_addr, r._abort_msg(code, reason)

        def run() -> None:
            for key in keys:
                try:
                    ep = self.route(addr, key)
                except RegistryError as e:
                    log.debug("kvproxy decode: cannot tell prefill rank %s of room %d: %s", key, r.bootstrap_room, e)
                    continue
                with self.mgr._lock:
                    conn = self.conn_for_locked(ep)
                self.channel.send(conn, msg)

        self.mgr.background(run)

    # ---- channel (I/O thread) ----

    def _on_open(self, conn: Conn) -> None:
        pass  # the hello went out first

    def _on_message(self, conn: Conn, msg: Dict[str, Any]) -> None:
        kind = msg.get("t")
        mgr = self.mgr
        with mgr._lock:
            if kind == "hello":
                if msg.get("v") != PROTO_VERSION:
                    conn.data["mismatch"] = f"channel version differs: decode {PROTO_VERSION}, prefill {msg.get('v')}"
                else:
                    conn.data["mismatch"] = layout_mismatch(mgr.layout_announce(), msg.get("layout") or {},
                                                            "decode", f"prefill rank {conn.name}")
                conn.hello = msg
                for r in list(conn.data.get("receivers", ())):
                    r._on_hello_locked()
            elif kind == "status":
                r = self.by_tag.get(msg.get("tag")) if isinstance(msg.get("tag"), int) else None
                if r is not None and r.bootstrap_room == msg.get("room"):
                    r._on_status_locked(msg)
            elif kind == "error":
                conn.data["mismatch"] = f"prefill rank {conn.name} refused the channel: {msg.get('reason')}"

    def _on_close(self, conn: Conn, reason: str) -> None:
        with self.mgr._lock:
            if self.conns.get(conn.endpoint) is conn:
                del self.conns[conn.endpoint]
            # The rank may come back elsewhere (a restarted prefill server).
            for k in [k for k, ep in self.routes.items() if ep == conn.endpoint]:
                del self.routes[k]
            for r in list(conn.data.get("receivers", ())):
                r._give_up_locked("unreachable", f"the channel to prefill rank {conn.name} closed: {reason}")

    # ---- fences ----

    def start_fence_locked(self, r: "KvproxyKVReceiver") -> None:
        """Fence ``r``'s tag in kvproxyd (completion: :meth:`on_completion`);
        without a fence, fall back to waiting for the prefill side."""
        if not self.can_fence:
            r._fallback = True
            return
        if r._fence_id is None:
            r._fence_id = next(self._fence_ids)
            self.fences[r._fence_id] = r
        r._t_fence = time.monotonic()
        # How long the fence must refuse the request's bytes: the prefill side
        # submits nothing more once it has the abort or saw the channel close
        # (at most DEAD_PEER_S for a dead peer), and each transfer it already
        # submitted ends by its deadline.
        cfg = self.mgr.config
        hold = DEAD_PEER_S + (cfg.transfer_timeout or _DEFAULT_TRANSFER_TIMEOUT) + _LAND_SLACK
        try:
            self.mgr.client.fence(r.tag << PIECE_BITS, FENCE_MASK, r._fence_id, hold=hold)
            r._fence_retry = False
        except RingFull:
            r._fence_retry = True  # the reaper tries again within a tick
        except KvproxyError as e:
            log.warning("kvproxy decode: fence of room %d refused (%s): waiting for the prefill side instead",
                        r.bootstrap_room, e)
            self.fences.pop(r._fence_id, None)
            r._fallback = True

    def on_completion(self, c: Completion) -> None:
        if c.kind == "landed":
            r = self.by_tag.get(c.user_id >> PIECE_BITS)
            if r is not None:
                r._landed_locked(c)
        elif c.kind == "fence":
            r = self.fences.pop(c.user_id, None)
            if r is None:
                return
            r._t_fenced = time.monotonic()
            if c.ok:
                r._end_locked()
            else:
                # e.g. no-buffers: the daemon's fence table was full, nothing was fenced.
                log.warning("kvproxy decode: fence of room %d ended with %s: waiting for the prefill side instead",
                            r.bootstrap_room, c.status_name)
                r._fallback = True
                r._check_fallback_locked(time.monotonic())

    # ---- manager hooks ----

    def wants_fast_poll(self) -> bool:
        return False

    def after_reap_locked(self) -> None:
        pass

    def tick_locked(self, now: float) -> None:
        cfg = self.mgr.config
        for r in list(self.receivers.values()):
            if r._ending is not None:
                if r._fence_retry:
                    self.start_fence_locked(r)
                elif r._fallback:
                    r._check_fallback_locked(now)
                elif r._t_fence is not None and now - r._t_fence > cfg.fence_timeout:
                    log.error("kvproxy decode: kvproxyd did not confirm the fence of room %d within %g s",
                              r.bootstrap_room, cfg.fence_timeout)
                    r._end_locked()
            elif r._state in (KVPoll.Bootstrapping, KVPoll.WaitingForInput) and now - r._t0 > cfg.bootstrap_timeout:
                what = "the prefill rank never answered" if r._state == KVPoll.Bootstrapping else "no send_metadata()"
                r._give_up_locked("bootstrap-timeout", f"{what} within {cfg.bootstrap_timeout:g} s "
                                  f"(bootstrap server {r.bootstrap_addr})")
            elif r._state == KVPoll.Transferring and r._complete():
                r._finish_locked()  # sglang reads the aux row only after Success: copying it here is safe
            elif r._state == KVPoll.Transferring and r._t_meta is not None and now - r._t_meta > cfg.waiting_timeout:
                r._give_up_locked("waiting-timeout", f"{r._landed_bytes} of {r._expected} bytes landed within "
                                  f"{cfg.waiting_timeout:g} s")

    def forget_locked(self, r: "KvproxyKVReceiver") -> None:
        """Drop a receiver that ended (sglang need not call clear())."""
        if self.receivers.get(r.bootstrap_room) is r:
            del self.receivers[r.bootstrap_room]
        if self.by_tag.get(r.tag) is r:
            del self.by_tag[r.tag]
        if r._conn is not None:
            r._conn.data.get("receivers", set()).discard(r)

    def fail_all_locked(self, code: str, reason: str) -> None:
        for r in list(self.receivers.values()):
            r._give_up_locked(code, reason)

    def quiescent_locked(self) -> bool:
        return all(r._ending is None for r in self.receivers.values())

    def on_daemon_gone_locked(self, why: str) -> None:
        for r in list(self.receivers.values()):
            r._post_abort_locked("daemon-gone", why)
            r._ending = None
            r._fail_locked("daemon-gone", why)  # its regions went with the daemon: nothing can land

    def close_locked(self) -> None:
        for r in list(self.receivers.values()):
            r._post_abort_locked("closed", "the kvproxy manager is closed")
            r._ending = None
            r._fail_locked("closed", "the kvproxy manager is closed")  # the daemon drops our regions now

    def shutdown(self) -> None:
        self.channel.flush(1.0)
        self.channel.close()

    # ---- PD rebootstrap ----

    def submit_prefill_recompute(self, r: "KvproxyKVReceiver", payload: Dict[str, Any]) -> None:
        t = self.mgr.topology
        if t.attn_tp_rank != 0 or t.attn_cp_rank != 0 or t.pp_rank != 0:
            return  # the prefill frontend fans the request out to all its ranks: the leader posts once
        info = self.prefill_info_table.get(r.bootstrap_addr)
        if info is None or info.prefill_http_port is None:
            with self.mgr._lock:
                r._give_up_locked("rebootstrap", "could not resolve the prefill /generate URL from the bootstrap "
                                  f"info of {r.bootstrap_addr} (no prefill_http_port)")
            return
        host, _ = split_hostport(r.bootstrap_addr)
        port, timeout = info.prefill_http_port, self.mgr.config.waiting_timeout

        def run() -> None:
            try:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
                try:
                    conn.request("POST", "/generate", body=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    body = resp.read()[:512].decode(errors="replace")
                finally:
                    conn.close()
                if resp.status >= 400:
                    raise OSError(f"HTTP {resp.status}: {body}")
            except (OSError, http.client.HTTPException) as e:
                with self.mgr._lock:
                    r._give_up_locked("rebootstrap", f"PD rebootstrap: POST http://{host}:{port}/generate for "
                                      f"rid={payload.get('rid')} failed: {e}")

        # Not the shared background thread: /generate answers only once the
        # prefill server finished the request, and others must not queue behind it.
        threading.Thread(target=run, name="kvproxy-rebootstrap", daemon=True).start()


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
        self._conn: Optional[Conn] = None
        self._inited = False
        self._expected: Optional[int] = None
        self._landed_bytes = 0
        self._prefill_done = False
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
            why = side.mismatch.get(addr)
            if why is None and len(keys) != 1:
                why = f"attention TP size differs: decode {mgr.topology.attn_tp_size}, prefill {info.attn_tp_size}"
            if why is not None:
                self._give_up_locked("layout", why)
                side.notify_locked(self, keys, "layout", why)
                return
        try:
            ep = side.route(addr, keys[0])
        except RegistryError as e:
            with mgr._lock:
                self._give_up_locked("unreachable", f"no route to prefill rank (DP {keys[0][0]}, TP {keys[0][2]}): {e}")
            return
        with mgr._lock:
            if self._state in FINAL:
                return
            conn = side.conn_for_locked(ep)
            self._conn = conn
            conn.data["receivers"].add(self)
            if conn.hello is not None:
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
            if self._state != KVPoll.WaitingForInput or self._conn is None:
                self._give_up_locked("protocol", f"send_metadata() in state {self._state.name}")
                return
            if has_items(state_indices):
                self._give_up_locked("unsupported", "state buffers (mamba/SWA/DSA) are not moved by kvproxy.sglang")
                return
            refusal = mgr.refusal_locked()
            if refusal is not None:
                self._give_up_locked(*refusal)
                return
            self._aux_index = None if aux_index is None or not mgr.aux_item_lens else int(aux_index)
            self._expected = len(pages) * mgr.kv_page_bytes + (
                sum(mgr.aux_item_lens) if self._aux_index is not None else 0)
            xfer_s = mgr.config.transfer_timeout or _DEFAULT_TRANSFER_TIMEOUT
            self._land_within = mgr.config.waiting_timeout + xfer_s
            regions = mgr._regions_layout()
            meta = {
                "t": "meta", "v": PROTO_VERSION, "room": self.bootstrap_room, "tag": self.tag,
                "node_id": mgr.node_id, "engine_rank": mgr.engine_rank,
                "kv": regions["kv"], "aux": regions["aux"], "pages": runs(pages), "aux_index": self._aux_index,
                "decode_prefix_len": int(decode_prefix_len or 0),
                # The prefill side submits nothing later than this after the
                # metadata arrived, each transfer ending this soon after.
                "submit_within_ms": int(mgr.config.waiting_timeout * 1000),
                "transfer_timeout_ms": int(xfer_s * 1000),
            }
            self._t_meta = time.monotonic()
            if not mgr.side.channel.send(self._conn, meta):
                self._give_up_locked("unreachable", f"the channel to prefill rank {self._conn.name} is closed")
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
        if self._conn is not None and self._state not in FINAL:
            self.kv_mgr.side.channel.send(self._conn, self._abort_msg(code, reason))

    def _give_up_locked(self, code: str, reason: str, completion: Optional[Completion] = None,
                        from_prefill: bool = False) -> None:
        """Fail the request; once its metadata may have reached the prefill side,
        only after the fence (see the module docstring)."""
        if self._state in FINAL or self._ending is not None:
            return
        if not from_prefill:
            self._post_abort_locked(code, reason)
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
                self._prefill_done or (self._t_meta is not None and now > self._t_meta + self._land_within + _LAND_SLACK)):
            self._end_locked()

    def _wait_ended_locked(self) -> None:
        """Block (bounded) until a give-up in progress ended."""
        cfg = self.kv_mgr.config
        if self._ending is None:
            return
        if self._fallback:
            assert self._t_meta is not None
            deadline = self._t_meta + self._land_within + _LAND_SLACK
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
                deadline = self._t_meta + self._land_within + _LAND_SLACK  # type: ignore[operator]

    # ---- events (manager lock held) ----

    def _on_hello_locked(self) -> None:
        conn = self._conn
        if conn is None or self._state != KVPoll.Bootstrapping or conn.hello is None:
            return
        why = conn.data.get("mismatch")
        if why:
            self._give_up_locked("layout", why)
        else:
            self._set_locked(KVPoll.WaitingForInput)

    def _on_status_locked(self, msg: Dict[str, Any]) -> None:
        state = msg.get("state")
        if state not in ("success", "failed", "aborted"):
            return
        self._prefill_done = True  # none of its transfers is in flight any more
        if self._ending is not None:
            self._check_fallback_locked(time.monotonic())  # what the fallback waits for
            return
        if state == "success":
            self.kv_mgr._changed.notify_all()
            return
        self._give_up_locked(str(msg.get("code", "?")), f"prefill side ({msg.get('node_id', '?')}): "
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

