# SPDX-License-Identifier: BSD-3-Clause
"""The worker half of the connector: KV cache regions, the kvproxy client, completions.

``register_kv_caches`` describes vLLM's tensors as planes
(:mod:`kvproxy.vllm.layout`), connects to the local kvproxyd and registers
the fewest regions that cover them: one per CUDA allocation (IPC handle),
one per memfd for host memory (:class:`kvproxy._memory.RegionMap`). A
reaper thread reads the completion ring and hands ``done`` completions to
the prefill half (:mod:`.sending`) and ``landed`` ones to the decode half
(:mod:`.receiving`). Everything the engine thread calls returns at once:
``start_load_kv`` hands work to the halves' threads, ``get_finished`` and
``get_block_ids_with_load_errors`` collect what they finished.

KV moves once per request, after the forward: vLLM's disaggregated flow
finishes a request on the prefill instance before the decode instance even
sees it (the proxy forwards the prefill's ``kv_transfer_params``), so there
is no decode-side registration to push layers to while they are computed,
and kvproxy coalesces a request's blocks into few large transfers anyway.
``save_kv_layer`` and ``wait_for_layer_load`` do nothing; ``wait_for_save``
does nothing because the blocks stay held by vLLM (``delay_free``) until
the request is reported sent.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from .._addr import advertised_addr
from .._client import Client
from .._errors import ConnectError, Disconnected, KvproxyError, PeerNotFound
from .._memory import RegionMap
from ._compat import spec_kind, tp_rank_of_vllm
from .config import KvproxyVllmConfig
from . import tp_map
from .layout import Layout, blocks_per_transfer, build_layout
from .receiving import Receiver
from .sending import Sender
from .slicing import Template
from .stats import KvproxyConnectorStats

__all__ = ["WorkerSide"]

log = logging.getLogger("kvproxy.vllm")

def _connect(sock: str, cfg: KvproxyVllmConfig) -> Client:
    """A client of the local kvproxyd with the configured rings (0: the daemon's own sizes)."""
    try:
        return Client(sock, sq_entries=cfg.sq_entries, cq_entries=cfg.cq_entries)
    except ConnectError as e:
        if e.errno == errno.EINVAL and (cfg.sq_entries or cfg.cq_entries):
            raise ConnectError(e.errno, "connect", reason=e.reason,
                               detail=f"kvproxyd at {sock} refused rings of {cfg.sq_entries}/"
                                      f"{cfg.cq_entries} entries (kvproxy_sq_entries/cq_entries "
                                      f"may be at most its limits.sq_entries/cq_entries)") from None
        raise


def _kv_heads_of(vllm_config: Any) -> Optional[int]:
    """The model's KV heads over all ranks (vLLM's ModelConfig.get_total_num_kv_heads), or None."""
    fn = getattr(getattr(vllm_config, "model_config", None), "get_total_num_kv_heads", None)
    try:
        return int(fn()) if callable(fn) else None
    except Exception:  # noqa: BLE001 - a model config that cannot say
        return None


def _mla_of(vllm_config: Any) -> Optional[bool]:
    v = getattr(getattr(vllm_config, "model_config", None), "use_mla", None)
    return v if isinstance(v, bool) else None


def _device_of(t: Any) -> Tuple[bool, int]:
    """(is CUDA memory, device index) of a tensor-like object."""
    dev = getattr(t, "device", None)
    kind = str(getattr(dev, "type", dev) or "")
    return kind.startswith("cuda"), int(getattr(dev, "index", 0) or 0)


class WorkerSide:
    """Worker-side state of one vLLM worker (one TP rank)."""

    def __init__(self, vllm_config: Any, cfg: KvproxyVllmConfig, kv_cache_config: Any) -> None:
        pc = vllm_config.parallel_config
        self.cfg = cfg
        self.block_size = int(vllm_config.cache_config.block_size)
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        rank = cfg.tp_rank if cfg.tp_rank is not None else tp_rank_of_vllm()
        self.tp_rank = int(rank or 0)
        self.dp_rank = int(getattr(pc, "data_parallel_rank", 0) or 0)
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.tp_rank))
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        if groups:
            bad = [spec_kind(g.kv_cache_spec) for g in groups if spec_kind(g.kv_cache_spec) != "full"]
            if bad:
                raise NotImplementedError(f"kvproxy.vllm: KV-cache groups of {sorted(set(bad))} are not supported")
            self.groups: Optional[List[List[str]]] = [list(g.layer_names) for g in groups]
        else:
            self.groups = None  # one group of every layer (vLLM without kv_cache_config)
        nb = getattr(kv_cache_config, "num_blocks", None) or getattr(vllm_config.cache_config, "num_gpu_blocks", None)
        self.num_blocks = int(nb or 0)
        # Heterogeneous TP (see tp_map): the model's KV heads, MLA or not, and
        # why head slices cannot be cut (None: they can).
        self.kv_heads = _kv_heads_of(vllm_config)
        self._mla_cfg = _mla_of(vllm_config)
        self.mla = bool(self._mla_cfg)
        self.slice_why: Optional[str] = None
        self._per_xfer_by_tp: Dict[int, int] = {}
        self._templates: Dict[Tuple[bool, int, int, int, int], List[Template]] = {}
        self.max_segs = 1
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.stop = threading.Event()
        self.client: Any = None
        self.layout: Optional[Layout] = None
        self.regions: Optional[RegionMap] = None
        self.src_regions: List[Tuple[int, int]] = []
        self.per_xfer = 1
        self.gone: Optional[str] = None
        self.stats = KvproxyConnectorStats()
        self.done_sending: Set[str] = set()
        self.done_recving: Set[str] = set()
        self.failed_recving: Set[str] = set()  # of done_recving: blocks missing, several groups
        self.load_errors: Set[int] = set()
        self._seen_finished: Set[str] = set()
        self._peers: Dict[str, int] = {}
        self.kvp_addr: Optional[str] = None  # where remote kvproxyds reach ours (after registration)
        self.sender = Sender(self)
        self.receiver = Receiver(self)
        self._reaper: Optional[threading.Thread] = None

    # ---- registration ----

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        """Describe, connect, register (see the module docstring).

        :raises LayoutError: a tensor kvproxy cannot describe.
        :raises KvproxyError: no kvproxyd on the socket, or it refused a region.
        """
        if self.client is not None:
            raise RuntimeError("register_kv_caches was called twice")
        if not kv_caches:
            raise ValueError("register_kv_caches got no KV caches")
        if self.num_blocks < 1:
            raise ValueError("kvproxy.vllm needs the number of KV cache blocks (kv_cache_config.num_blocks)")
        groups = self.groups or [list(kv_caches)]
        layout = build_layout(kv_caches, groups, self.num_blocks, self.block_size)
        first = next(iter(kv_caches.values()))
        cuda, device = _device_of(first)
        sock = self.cfg.socket_for(self.tp_rank, self.local_rank, self.dp_rank, device)
        client = _connect(sock, self.cfg)
        try:
            regions = RegionMap(client, layout.buffers(), gpu_id=device)
        except BaseException:
            client.close()
            raise
        self.client, self.layout, self.regions = client, layout, regions
        self.kvp_addr = self._kvp_addr()
        self.src_regions = [(p.key, p.offset) for p in regions.placements]
        max_segs = min(self.cfg.max_segments or client.max_segments, client.max_segments)
        self.max_segs = max_segs
        self.per_xfer = blocks_per_transfer(layout, max_segs, self.cfg.max_transfer_bytes)
        self._heads_of(layout)
        log.info("kvproxy: rank %d on %s (%s): %d planes of %d blocks in %d regions (%s), %d blocks per transfer",
                 self.tp_rank, client.node_id, sock, len(layout.planes), self.num_blocks, regions.region_count,
                 f"cuda:{device}" if cuda else "host", self.per_xfer)
        self._reaper = threading.Thread(target=self._reap, name="kvproxy-vllm-reap", daemon=True)
        self._reaper.start()

    def _heads_of(self, layout: Layout) -> None:
        """Settle MLA or not, the model's KV heads and whether blocks can be head-sliced."""
        h = layout.heads()
        if self._mla_cfg is None:
            self.mla = all(p.geom is None or p.geom.heads is None for p in layout.planes)
        if self.mla:
            return
        if h is None:
            self.slice_why = "the KV cache planes have no common heads dimension to slice"
            return
        if self.kv_heads is None:
            self.kv_heads = h * self.tp_size  # no replication: vLLM's model config did not say
        why = tp_map.check_tp(self.tp_size, 1, self.kv_heads, False)
        if why is None:
            lo, hi = tp_map.head_range(self.tp_rank, self.tp_size, self.kv_heads)
            if hi - lo != h:
                why = f"{h} KV heads per block, but {self.kv_heads} heads over TP {self.tp_size} give {hi - lo}"
        self.slice_why = why

    def sources(self, p_tp: int) -> List[tp_map.Source]:
        """The prefill ranks (TP ``p_tp``) this decode rank takes its KV from.

        :raises ValueError: they cannot be mapped, or the blocks cannot be head-sliced.
        """
        if p_tp != self.tp_size and not self.mla and self.slice_why:
            raise ValueError(f"prefill TP {p_tp}, decode TP {self.tp_size}: {self.slice_why}")
        return tp_map.sources(self.tp_rank, p_tp, self.tp_size, self.kv_heads, self.mla)

    def templates(self, sending: bool, mine: int, other_heads: int, other: int, n: int) -> List[Template]:
        """Per plane, the head slice between this rank's blocks (its local head
        ``mine`` on) and the other side's (``other_heads`` per block, from its
        local head ``other``), ``n`` heads, in the direction of ``sending``."""
        assert self.layout is not None
        key = (sending, mine, other_heads, other, n)
        got = self._templates.get(key)  # the same few per peer TP size: built once
        if got is not None:
            return got
        out = []
        for p in self.layout.planes:
            assert p.geom is not None
            g, o = p.geom, p.geom.with_heads(other_heads)
            out.append(Template(g, mine, o, other, n) if sending else Template(o, other, g, mine, n))
        if len(self._templates) < 64:
            self._templates[key] = out
        return out

    def per_xfer_for(self, p_tp: int) -> int:
        """Block positions per transfer of requests from a prefill instance of TP
        ``p_tp``: head slices may take more descriptors per block than whole blocks.

        :raises ValueError: as :meth:`sources`.
        """
        got = self._per_xfer_by_tp.get(p_tp)
        if got is not None:
            return got
        assert self.layout is not None
        per_block: Optional[List[int]] = None
        for p, lo, hi in self.sources(p_tp):
            if lo is None or hi is None:
                continue
            assert self.kv_heads is not None
            plo, phi = tp_map.head_range(p, p_tp, self.kv_heads)
            dlo, _ = tp_map.head_range(self.tp_rank, self.tp_size, self.kv_heads)
            pb = [t.per_block for t in self.templates(False, lo - dlo, phi - plo, lo - plo, hi - lo)]
            per_block = pb if per_block is None else [max(a, b) for a, b in zip(per_block, pb)]
        got = blocks_per_transfer(self.layout, self.max_segs, self.cfg.max_transfer_bytes, per_block)
        self._per_xfer_by_tp[p_tp] = got
        return got

    def fan_of(self, p: int, p_tp: int, d_tp: int) -> int:
        """How many decode ranks prefill rank ``p`` sends to (1 when the sizes
        cannot be mapped: one pair key still reaches it)."""
        try:
            return len(tp_map.targets(p, p_tp, d_tp, self.kv_heads or max(p_tp, d_tp), self.mla))
        except ValueError:
            return 1

    def _kvp_addr(self) -> Optional[str]:
        """Where remote kvproxyds reach ours: sent with the decode side's registrations."""
        assert self.client is not None
        listen = None
        if not self.cfg.addr:
            try:
                listen = self.client.listen_addr()
            except KvproxyError as e:
                log.info("kvproxy: kvproxyd %s does not say its listen address (%s): remote nodes need "
                         "it in their peer lists, or set kvproxy_addr", self.client.node_id, e)
        from .scheduler import outgoing_ip  # this host's address, for a wildcard listener

        return advertised_addr(listen, self.cfg.addr, outgoing_ip())

    def peer_index(self, node_id: str, addr: Optional[str] = None) -> int:
        """The local kvproxyd's index of a peer node: by node id (a peer of the
        daemon), else by the address the decode side sent (dialled on demand).
        Cached until a transfer to it ends with no-peer (forget_peer)."""
        idx = self._peers.get(node_id)
        if idx is None:
            assert self.client is not None
            try:
                idx = self.client.peer(node_id)
            except PeerNotFound:
                if not addr:
                    raise
                idx = self.client.peer(addr)
            self._peers[node_id] = idx
        return idx

    def forget_peer(self, index: int) -> None:
        """A transfer to peer ``index`` ended with no-peer: it left the table; look it up again next time."""
        for node in [k for k, v in self._peers.items() if v == index]:
            self._peers.pop(node, None)

    # ---- threads ----

    def _reap(self) -> None:
        while not self.stop.is_set():
            try:
                comps = self.client.wait(timeout=0.2, max=256)
            except Disconnected as e:
                self._daemon_gone(f"kvproxyd went away: {e}")
                return
            except KvproxyError as e:
                if self.stop.is_set() or self.client.closed:
                    return
                self._daemon_gone(f"kvproxy client failed: {e}")
                return
            for c in comps:
                if c.kind == "done":
                    self.sender.on_done(c)
                elif c.kind == "landed":
                    self.receiver.on_landed(c)
                elif c.kind == "fence":
                    self.receiver.on_fence(c)

    def _daemon_gone(self, why: str) -> None:
        log.error("kvproxy: %s; its requests fail", why)
        with self.lock:
            self.gone = why
            self.sender.daemon_gone_locked(why)
            self.receiver.daemon_gone_locked(why)

    # ---- engine thread ----

    def start_load_kv(self, meta: Any) -> None:
        if meta is None:
            return
        if getattr(meta, "bootstrap", None) and self.sender.addr is None:
            self.sender.addr = meta.bootstrap
        if (meta.sends or meta.recvs) and self.client is None:
            raise RuntimeError("kvproxy.vllm: KV transfers requested before register_kv_caches")
        for rid, spec in meta.sends.items():
            self.sender.add(rid, spec)
        for rid, spec in meta.recvs.items():
            self.receiver.add(rid, spec)
        for rid in meta.give_ups:
            self.receiver.give_up(rid)
        for addr, remote_rid, remote_tp, reason in meta.releases:
            self.receiver.release(addr, remote_rid, int(remote_tp), str(reason))

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        """Requests sent (blocks may be freed) and received since the last call."""
        sending, recving, _ = self.get_transfer_results(finished_req_ids)
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids: Set[str]) -> Tuple[Set[str], Set[str], Set[str]]:
        """Requests sent, received, and of those received the ones that failed
        (a model of several KV-cache groups; with one, the missing blocks go to
        get_block_ids_with_load_errors instead), since the last call.

        A send is reported only once vLLM named the request finished (the
        contract of ``get_finished``); the halves' threads enforce leases
        and deadlines on their own, this only collects.
        """
        with self.lock:
            self.receiver.check_orphans_locked(time.monotonic())
            for rid in finished_req_ids or ():
                if rid in self.sender.sends or rid in self.done_sending:
                    self._seen_finished.add(rid)
            sending = {r for r in self.done_sending if r in self._seen_finished}
            self.done_sending -= sending
            self._seen_finished -= sending
            recving, self.done_recving = self.done_recving, set()
            failed, self.failed_recving = self.failed_recving, set()
        return sending, recving, failed

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self.lock:
            out, self.load_errors = self.load_errors, set()
        return out

    def get_stats(self) -> Optional[KvproxyConnectorStats]:
        with self.lock:
            if self.stats.is_empty():
                return None
            return self.stats.clone_and_reset()

    def shutdown(self) -> None:
        """Stop the threads and disconnect (kvproxyd reclaims the regions and
        anything still in flight). Idempotent."""
        self.stop.set()
        with self.lock:
            self.cond.notify_all()
        self.sender.stop()
        self.receiver.stop()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
            self._reaper = None
        if self.regions is not None:
            self.regions.close()
            self.regions = None
        if self.client is not None:
            self.client.close()
