# SPDX-License-Identifier: BSD-3-Clause
"""The KV manager: one per sglang worker (attention rank), both sides.

It owns the worker's kvproxy client and registered regions, the reaper
thread (completions, timers, sweeps) and a side object with the
mode-specific state: :class:`~kvproxy.sglang.sender.PrefillSide` (senders,
the submission queue, the listening channel, the bootstrap registration) or
:class:`~kvproxy.sglang.receiver.DecodeSide` (receivers, routes, channel
connections, fences). Every request object takes the manager's lock.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .._client import Client, Completion
from .._addr import advertised_addr
from .._errors import KvproxyError
from .._memory import RegionMap
from ._common import KVArgs, mode_of
from .config import KvproxyConfig
from .layout import STATE_KINDS, state_kind
from .topology import Topology, topology_of

__all__ = ["KvproxyKVManager"]

log = logging.getLogger("kvproxy.sglang")

# How often the reaper runs the timers (bootstrap/waiting timeouts, sweeps, fence retries).
_TICK = 0.1


class _Worker:
    """One background thread running queued calls in order (bootstrap HTTP
    calls the scheduler thread must not wait for)."""

    def __init__(self, name: str) -> None:
        self._q: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._t = threading.Thread(target=self._run, name=name, daemon=True)
        self._t.start()

    def submit(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def _run(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:  # noqa: BLE001 - a failed call must not stop the others
                log.exception("kvproxy.sglang background call failed")

    def close(self, timeout: float = 5.0) -> None:
        self._q.put(None)
        if threading.current_thread() is not self._t:
            self._t.join(timeout)


class KvproxyKVManager:
    """sglang's ``KVManager`` for kvproxy (``KVManager(args, disaggregation_mode,
    server_args, is_mla_backend=False)``, as base/conn.py declares it).

    :param args: the worker's :class:`KVArgs` (sglang's works too).
    :param disaggregation_mode: ``prefill`` or ``decode`` (sglang's enum, ours, or a string).
    :param server_args: sglang's ``ServerArgs`` (read: ``host``, ``port``,
        ``dist_init_addr``, ``disaggregation_bootstrap_port``, ``tp_size``,
        ``dp_size``, ``enable_dp_attention``, ``attn_cp_size``, ``pp_size``,
        ``kv_cache_dtype``, ``load_balance_method``); any object with those
        attributes (missing ones take sglang's defaults), or None.
    :param is_mla_backend: MLA KV layout (one latent buffer per layer).
    :param config: settings; default :meth:`KvproxyConfig.from_env`.
    :raises ValueError: bad settings, no socket configured, inconsistent KVArgs.
    :raises NotImplementedError: a model state type the adapter does not move
        (named), context parallelism, decode context parallelism (the reason says which).
    :raises kvproxy.ConnectError: no kvproxyd at the socket.
    :raises kvproxy.KvproxyError: a buffer could not be registered (the daemon's reason).
    :raises OSError: a prefill manager cannot listen for its channel.
    """

    def __init__(self, args: Any, disaggregation_mode: Any, server_args: Any = None,
                 is_mla_backend: Optional[bool] = False, *, config: Optional[KvproxyConfig] = None) -> None:
        self.kv_args = args if args is not None else KVArgs()
        self.mode = mode_of(disaggregation_mode)
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.is_mla_backend = bool(is_mla_backend)
        self.config = config or KvproxyConfig.from_env()
        self.engine_rank = int(getattr(args, "engine_rank", 0) or 0)
        self.gpu_id = int(getattr(args, "gpu_id", 0) or 0)
        self.page_size = int(getattr(args, "page_size", 1) or 1)
        self._check_supported(args, server_args)
        self.topology: Topology = topology_of(args, server_args, self.mode)
        t = self.topology
        self.attn_tp_size, self.attn_tp_rank = t.attn_tp_size, t.attn_tp_rank
        self.attn_cp_size, self.attn_cp_rank = t.attn_cp_size, t.attn_cp_rank
        self.attn_dp_size, self.attn_dp_rank = t.attn_dp_size, t.attn_dp_rank
        self.pp_size, self.pp_rank = t.pp_size, t.pp_rank
        self.system_dp_size, self.system_dp_rank = t.system_dp_size, t.system_dp_rank
        self.is_dummy_cp_rank = False  # context parallelism is refused at start
        self.kv_cache_dtype = str(getattr(server_args, "kv_cache_dtype", None) or "auto")
        self.states = self._state_components(args, self.pp_size)
        self.start_layer = int(getattr(args, "prefill_start_layer", 0) or 0)
        self.total_kv_heads = int(getattr(args, "total_kv_head_num", 0) or 0)
        self.local_kv_heads = int(getattr(args, "kv_head_num", 0) or 0)
        if not self.total_kv_heads and self.local_kv_heads and not self.is_mla_backend:
            self.total_kv_heads = self.local_kv_heads * self.attn_tp_size  # sglang's own fallback
        self.kv_layer_ids = [int(x) for x in getattr(args, "kv_layer_ids", None) or []]

        ptrs, lens, items = (list(getattr(args, n, None) or []) for n in ("kv_data_ptrs", "kv_data_lens", "kv_item_lens"))
        aptrs, alens, aitems = (list(getattr(args, n, None) or []) for n in ("aux_data_ptrs", "aux_data_lens", "aux_item_lens"))
        if not ptrs or not len(ptrs) == len(lens) == len(items):
            raise ValueError(f"KVArgs: kv_data_ptrs/lens/item_lens must be non-empty lists of one length, "
                             f"got {len(ptrs)}/{len(lens)}/{len(items)}")
        if not len(aptrs) == len(alens) == len(aitems):
            raise ValueError(f"KVArgs: aux_data_ptrs/lens/item_lens differ in length: "
                             f"{len(aptrs)}/{len(alens)}/{len(aitems)}")
        # KV and state buffers in one region map: one region per allocation
        # (sglang's unified pools report one allocation as both), released together.
        self._kv_buffers = [(int(p), int(n)) for p, n in zip(ptrs, lens)] + [
            b for c in self.states for b in c["buffers"]]
        self._nkv = len(ptrs)
        self._aux_buffers = [(int(p), int(n)) for p, n in zip(aptrs, alens)]
        self.kv_item_lens = [int(x) for x in items]
        self.aux_item_lens = [int(x) for x in aitems]
        self.kv_page_bytes = sum(self.kv_item_lens)
        sock = self.config.socket_for(self.engine_rank, self.gpu_id)

        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._closing = False
        self._gone: Optional[str] = None
        self._released = False  # KV memory handed back to the engine (memory saver)
        self._kv: Optional[RegionMap] = None
        self._aux: Optional[RegionMap] = None
        self._threads: List[threading.Thread] = []
        self.side: Any = None
        self.client = Client(sock, sq_entries=self.config.sq_entries, cq_entries=self.config.cq_entries)
        try:
            self.node_id = self.client.node_id
            self.max_segments = self.client.max_segments
            self.kvp_addr = self._kvp_addr()
            self._kv = RegionMap(self.client, self._kv_buffers, self.gpu_id, allow_mirror=False)
            self._aux = RegionMap(self.client, self._aux_buffers, self.gpu_id, allow_mirror=True)
            self._bg = _Worker(f"kvproxy-bg-{self.engine_rank}")
            if self.mode == "prefill":
                from .prefill import PrefillSide

                self.side = PrefillSide(self)
            else:
                from .decode import DecodeSide

                self.side = DecodeSide(self)
        except BaseException:
            self._closing = True
            if self.side is not None:
                self.side.shutdown()
            if hasattr(self, "_bg"):
                self._bg.close()
            self._release()
            raise
        reaper = threading.Thread(target=self._reap_loop, name=f"kvproxy-reap-{self.engine_rank}", daemon=True)
        self._threads.append(reaper)
        reaper.start()
        log.info("kvproxy %s manager (attention DP %d TP %d/%d, PP %d/%d) on %s: %d KV buffers, %d aux buffers, "
                 "state %s, %d regions", self.mode, t.dp_group, t.attn_tp_rank, t.attn_tp_size, t.pp_rank, t.pp_size,
                 self.node_id, len(ptrs), len(aptrs), [c["type"] for c in self.states] or "none",
                 self._kv.region_count + self._aux.region_count)

    def _kvp_addr(self) -> Optional[str]:
        """Where remote kvproxyds reach ours: carried by the bootstrap (see KvproxyConfig.addr)."""
        try:
            listen = None if self.config.addr else self.client.listen_addr()
        except KvproxyError as e:
            log.info("kvproxy: kvproxyd %s does not say its listen address (%s): remote nodes need it in "
                     "their peer lists, or set KVPROXY_ADDR", self.client.node_id, e)
            listen = None
        addr = advertised_addr(listen, self.config.addr, self.config.host_ip)
        if addr is None and listen:
            log.info("kvproxy: kvproxyd %s listens on %s (a wildcard): set KVPROXY_ADDR or KVPROXY_HOST_IP "
                     "so that remote nodes can dial it by address", self.client.node_id, listen)
        return addr

    @staticmethod
    def _check_supported(args: Any, server_args: Any) -> None:
        legacy = getattr(args, "state_type", "none")
        if legacy not in (None, "none") and not list(getattr(args, "state_types", None) or []):
            raise NotImplementedError(
                f"kvproxy.sglang does not read the single state_type {legacy!r} of older sglang releases "
                "(it reads KVArgs.state_types)")
        if int(getattr(server_args, "attn_cp_size", 1) or 1) > 1:
            raise NotImplementedError("kvproxy.sglang does not support attention context parallelism (attn_cp_size > 1)")
        if int(getattr(args, "dcp_size", 1) or 1) > 1 or int(getattr(server_args, "dcp_size", 1) or 1) > 1:
            raise NotImplementedError("kvproxy.sglang does not support decode context parallelism (dcp_size > 1)")

    @staticmethod
    def _state_components(args: Any, pp_size: int) -> List[Dict[str, Any]]:
        """sglang's state components (``state_types`` and the lists parallel to
        it), each with its buffers; a type the adapter does not move is refused
        here, by name, before any request."""
        types = list(getattr(args, "state_types", None) or [])

        def per(name: str) -> List[Any]:
            v = list(getattr(args, name, None) or [])
            return v + [None] * (len(types) - len(v))

        ptrs, lens, items = per("state_data_ptrs"), per("state_data_lens"), per("state_item_lens")
        dims, outer, groups, ids = (per("state_dim_per_tensor"), per("state_slice_outer_counts"),
                                    per("state_conv_shard_groups"), per("state_layer_ids"))
        out = []
        for k, t in enumerate(types):
            value = str(getattr(t, "value", t)).lower()
            kind = state_kind(value)
            if kind is None:
                raise NotImplementedError(
                    f"kvproxy.sglang does not move model state of type {value!r} (state component {k}); "
                    f"it moves {sorted(STATE_KINDS)}")
            if kind == "same-tp" and pp_size > 1:
                raise NotImplementedError(f"kvproxy.sglang does not move state {value!r} with pipeline parallelism "
                                          "(its buffers are compacted sparse-layer lists)")
            p, n, it = (list(x or []) for x in (ptrs[k], lens[k], items[k]))
            if not len(p) == len(n) == len(it):
                raise ValueError(f"KVArgs: state component {k} ({value}): state_data_ptrs/lens/item_lens differ in "
                                 f"length: {len(p)}/{len(n)}/{len(it)}")
            out.append({"type": value, "buffers": [(int(a), int(b)) for a, b in zip(p, n)],
                        "items": [int(x) for x in it], "dims": [int(x) for x in dims[k] or []],
                        "outer": [int(x or 1) for x in outer[k] or []],
                        "groups": [None if g is None else [int(x) for x in g] for g in groups[k] or []],
                        "layer_ids": [int(x) for x in ids[k] or []]})
        return out

    # ---- what both sides announce ----

    def layout_announce(self) -> Dict[str, Any]:
        """What the other side pairs its layout with before any request moves
        (:func:`kvproxy.sglang.layout.build_plan`; a mismatch's reason names both values)."""
        per_layer = 1 if self.is_mla_backend else 2
        return {
            "attn_tp_size": self.topology.attn_tp_size,
            "attn_tp_rank": self.topology.attn_tp_rank,
            "attn_cp_size": self.topology.attn_cp_size,
            "pp_size": self.topology.pp_size,
            "pp_rank": self.topology.pp_rank,
            "page_size": self.page_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "is_mla": self.is_mla_backend,
            "layers": [self.start_layer, self.start_layer + len(self.kv_item_lens) // per_layer],
            "kv_item_lens": list(self.kv_item_lens),
            "kv_layer_ids": list(self.kv_layer_ids),
            "total_kv_heads": self.total_kv_heads or None,
            "local_kv_heads": self.local_kv_heads or None,
            "aux_item_lens": list(self.aux_item_lens),
            "states": [{k: v for k, v in c.items() if k != "buffers"} for c in self.states],
        }

    def kv_placements(self) -> List[Any]:
        """The KV buffers' placements (region key, offset, length)."""
        assert self._kv is not None
        return self._kv.placements[:self._nkv]

    def state_placements(self) -> List[List[Any]]:
        """Per state component its buffers' placements."""
        assert self._kv is not None
        out, at = [], self._nkv
        for c in self.states:
            out.append(self._kv.placements[at:at + len(c["buffers"])])
            at += len(c["buffers"])
        return out

    def _regions_layout(self) -> Dict[str, Any]:
        """Per buffer [region key, offset in region, item bytes, buffer bytes]: KV, aux, per state component."""
        assert self._kv is not None and self._aux is not None
        return {
            "kv": [[p.key, p.offset, item, p.length] for p, item in zip(self.kv_placements(), self.kv_item_lens)],
            "aux": [[p.key, p.offset, item, p.length] for p, item in zip(self._aux.placements, self.aux_item_lens)],
            "state": [[[p.key, p.offset, item, p.length] for p, item in zip(ps, c["items"])]
                      for ps, c in zip(self.state_placements(), self.states)],
        }

    def refusal_locked(self) -> Optional[tuple]:
        """(code, reason) why no request can start now, or None."""
        if self._gone is not None:
            return ("daemon-gone", self._gone)
        if self._closing:
            return ("closed", "the kvproxy manager is closed")
        if self._released:
            return ("memory-released", "the engine released its KV memory (release_memory_occupation)")
        return None

    def background(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the manager's background thread (HTTP calls, in order)."""
        self._bg.submit(fn)

    # ---- sglang's manager API ----

    def register_to_bootstrap(self) -> None:
        """Prefill: register (again) at the bootstrap server (the manager also
        does it by itself at start, retrying until the server answers). Decode: nothing."""
        if self.mode == "prefill":
            self.side.register_now()

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        """Decode: fetch the topology of the prefill server at ``bootstrap_addr``
        into :attr:`prefill_info_table`; False if it cannot be had yet (one try, 2 s at most)."""
        if self.mode != "decode":
            return False
        return self.side.try_ensure_parallel_info(bootstrap_addr)

    @property
    def prefill_info_table(self) -> Dict[str, Any]:
        """Decode: ``{bootstrap_addr: PrefillInfo}`` (sglang's decode scheduler reads
        ``dp_size`` and ``follow_bootstrap_room``)."""
        return self.side.prefill_info_table if self.mode == "decode" else {}

    def submit_prefill_recompute(self, kv_receiver: Any, payload: Dict[str, Any]) -> None:
        """Decode: PD rebootstrap: ask the prefill server (``POST /generate`` at
        the HTTP port it registered) to recompute the request's KV, which then
        moves over the receiver's normal exchange. Only the attention leader
        (TP 0, CP 0, PP 0) posts; a failure aborts the receiver (code ``rebootstrap``)."""
        if self.mode != "decode":
            raise ValueError("submit_prefill_recompute() is a decode manager's call")
        self.side.submit_prefill_recompute(kv_receiver, payload)

    def kv_transfer_protocol(self) -> str:
        """The transfer protocol name sglang's prefill scheduler asks for (not ``packed-v4``)."""
        return "kvproxy"

    def uses_terminal_source_publication(self) -> bool:
        """sglang's terminal-source publication path is not used: the legacy sender calls are."""
        return False

    def get_kv_replica_factor(self) -> int:
        """1: a sender's ``transfer_total_bytes`` already counts every byte it
        sent to every decode rank it serves (MLA replicas included)."""
        return 1

    def deregister_buffer_to_engine(self) -> None:
        """Memory saver (``release_memory_occupation``): fail every open request
        (code ``memory-released``), wait (bounded) until none of their transfers
        can touch the KV memory any more, and deregister the KV regions, so
        kvproxyd holds no reference to memory the engine releases."""
        with self._lock:
            if self._released or self._closing:
                return
            self._released = True
            self.side.fail_all_locked("memory-released",
                                      "the engine released its KV memory (release_memory_occupation)")
            deadline = time.monotonic() + max(self.config.fence_timeout, 1.0) + (self.config.transfer_timeout or 30.0)
            while not self.side.quiescent_locked() and time.monotonic() < deadline:
                self._changed.wait(0.05)
            if not self.side.quiescent_locked():
                log.error("kvproxy.sglang: transfers still in flight when the KV memory is released")
            kv, self._kv = self._kv, None
        if kv is not None:
            kv.close()
        log.info("kvproxy %s manager: KV regions deregistered (memory released)", self.mode)

    def register_buffer_to_engine(self) -> None:
        """Memory saver (``resume_memory_occupation``): register the KV buffers
        again (same addresses, new physical memory, new region keys); requests
        work again from here on."""
        with self._lock:
            if not self._released or self._closing:
                return
        kv = RegionMap(self.client, self._kv_buffers, self.gpu_id, allow_mirror=False)
        with self._lock:
            self._kv = kv
            self._released = False
            self._changed.notify_all()
        log.info("kvproxy %s manager: KV regions registered again (memory resumed)", self.mode)

    # ---- completions and timers ----

    def _reap_loop(self) -> None:
        next_tick = 0.0
        while not self._closing:
            try:
                comps = self.client.wait(timeout=0.001 if self.side.wants_fast_poll() else _TICK)
            except KvproxyError as e:
                if not self._closing:
                    self._daemon_gone(f"kvproxyd at {self.client.socket_path} went away ({e})")
                return
            with self._lock:
                for c in comps:
                    self.side.on_completion(c)
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + _TICK
                    self.side.tick_locked(now)
                self.side.after_reap_locked()

    def _daemon_gone(self, why: str) -> None:
        with self._lock:
            self._gone = why
            self.side.on_daemon_gone_locked(why)
            self._changed.notify_all()

    def on_completion(self, c: Completion) -> None:  # for drivers that reap themselves (none today)
        with self._lock:
            self.side.on_completion(c)

    # ---- lifetime ----

    def wait_for_change(self, timeout: float) -> None:
        """Block until some request of this manager changes state (or ``timeout``
        seconds pass). For drivers outside sglang (tests, examples, benchmarks)
        that would otherwise spin on ``poll()``."""
        with self._changed:
            self._changed.wait(timeout)

    def close(self) -> None:
        """Fail what is still open (code ``closed``; the other side is told),
        stop the threads, disconnect from kvproxyd (which drops the regions, so
        nothing lands in them any more). Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self.side is not None:
                self.side.close_locked()
            self._changed.notify_all()
        if self.side is not None:
            self.side.shutdown()
        self.client.close()
        for t in self._threads:
            t.join(timeout=10)
        self._bg.close()
        self._release()

    def _release(self) -> None:
        for m in (self._kv, self._aux):
            if m is not None:
                m.close()
        self.client.close()

    def __enter__(self) -> "KvproxyKVManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
