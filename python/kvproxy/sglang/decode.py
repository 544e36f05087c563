# SPDX-License-Identifier: BSD-3-Clause
"""Decode side: the manager's decode state (:class:`DecodeSide`).

A decode manager learns a prefill server's topology from its bootstrap
server (``try_ensure_parallel_info``), resolves each request's prefill ranks
(sglang's mapping: one rank, or ``prefill TP // decode TP`` of them, times
every pipeline stage; ``GET /route``, cached), and keeps one channel
connection per prefill rank. The first exchange on a connection is a hello
each way: the two layouts are paired there
(:func:`kvproxy.sglang.layout.build_plan`), so a mismatch fails every
affected request on both sides at once, with code ``layout`` and a reason
naming both values. Fences: see :mod:`kvproxy.sglang.receiver`.
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .._client import Completion
from .._errors import KvproxyError, RingFull
from ._common import (
    DEFAULT_TRANSFER_TIMEOUT,
    FENCE_MASK,
    LAND_SLACK,
    PIECE_BITS,
    PROTO_VERSION,
    KVPoll,
)
from .bootstrap import PrefillInfo, RegistryError, registry_call
from .channel import DEAD_PEER_S, Channel, Conn
from .layout import LayoutError, build_plan, check_tp_sizes, source_ranks
from .topology import layout_mismatch, split_hostport

if TYPE_CHECKING:
    from .receiver import KvproxyKVReceiver

__all__ = ["DecodeSide"]

log = logging.getLogger("kvproxy.sglang")

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
        why = self._server_mismatch(info, f"prefill ({addr})")
        with self.mgr._lock:
            self.prefill_info_table[addr] = info
            self.mismatch[addr] = why
            self.mgr._changed.notify_all()
        if why:
            log.error("kvproxy decode: prefill server %s cannot serve this decode server: %s", addr, why)
        return True

    def _server_mismatch(self, info: PrefillInfo, them: str) -> Optional[str]:
        """Why a prefill server (as its bootstrap server describes it) cannot serve this decode rank, or None."""
        me = self.mgr.topology
        mine = self.mgr.layout_announce()
        theirs = {"page_size": info.page_size, "kv_cache_dtype": info.kv_cache_dtype}
        why = layout_mismatch({k: mine[k] for k in theirs}, theirs, "decode", them)
        if why:
            return why
        if info.attn_cp_size != 1:
            return f"attention CP size differs: decode 1, {them} {info.attn_cp_size} (not supported by kvproxy.sglang)"
        try:
            check_tp_sizes(info.attn_tp_size, me.attn_tp_size)
        except LayoutError as e:
            return f"{e} ({them})"
        if me.pp_size not in (1, info.pp_size):
            return (f"pipeline-parallel size differs: decode {me.pp_size}, {them} {info.pp_size} "
                    "(decode must be 1 or the same)")
        return None

    def targets(self, info: PrefillInfo, dp: int) -> List[Tuple[int, int, int, int]]:
        """The prefill ranks (dp, cp, tp, pp) that send to this decode rank, by
        sglang's mapping: its TP source ranks, in every pipeline stage (or
        the same stage, when decode runs the same pipeline)."""
        me = self.mgr.topology
        try:
            tps = source_ranks(max(info.attn_tp_size, 1), me.attn_tp_size, me.attn_tp_rank)
        except LayoutError:
            tps = [me.attn_tp_rank]
        pps = [me.pp_rank] if me.pp_size > 1 else list(range(max(info.pp_size, 1)))
        return [(dp, 0, tp, pp) for tp in tps for pp in pps]

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
            # kvp_addr: where the prefill side's kvproxyd can dial ours when it does not know our node id.
            hello = {"t": "hello", "v": PROTO_VERSION, "role": "decode", "node_id": mgr.node_id,
                     "kvp_addr": mgr.kvp_addr, "layout": mgr.layout_announce(),
                     "topology": mgr.topology.as_dict()}
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
                    try:
                        conn.data["plan"] = build_plan(msg.get("layout") or {}, mgr.layout_announce())
                        conn.data["mismatch"] = None
                    except (LayoutError, KeyError, TypeError, ValueError) as e:
                        conn.data["mismatch"] = f"{e} (prefill rank {conn.name})"
                conn.hello = msg
                for r in list(conn.data.get("receivers", ())):
                    r._on_hello_locked()
            elif kind == "status":
                r = self.by_tag.get(msg.get("tag")) if isinstance(msg.get("tag"), int) else None
                if r is not None and r.bootstrap_room == msg.get("room"):
                    r._on_status_locked(conn, msg)
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
                r._source_lost_locked(conn, reason)

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
        hold = DEAD_PEER_S + (cfg.transfer_timeout or DEFAULT_TRANSFER_TIMEOUT) + LAND_SLACK
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
        for src in r._srcs:
            src.conn.data.get("receivers", set()).discard(r)

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


