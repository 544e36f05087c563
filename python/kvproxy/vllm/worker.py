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

from .._client import Client
from .._errors import ConnectError, Disconnected, KvproxyError
from .._memory import RegionMap
from ._compat import spec_kind, tp_rank_of_vllm
from .config import KvproxyVllmConfig
from .layout import Layout, blocks_per_transfer, build_layout
from .receiving import Receiver
from .sending import Sender
from .stats import KvproxyConnectorStats

__all__ = ["WorkerSide"]

log = logging.getLogger("kvproxy.vllm")

# Submission ring: room for max_inflight full transfers; the daemon bounds it.
_SQ_ENTRIES = 32768
# Landing notices of many small transfers must not overflow the completion ring.
_CQ_ENTRIES = 4096


def _connect(sock: str) -> Client:
    try:
        return Client(sock, sq_entries=_SQ_ENTRIES, cq_entries=_CQ_ENTRIES)
    except ConnectError as e:
        if e.errno != errno.EINVAL:
            raise
        log.warning("kvproxyd at %s refused %d/%d ring entries (limits.sq_entries/cq_entries); using its "
                    "defaults", sock, _SQ_ENTRIES, _CQ_ENTRIES)
        return Client(sock)


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
        self.load_errors: Set[int] = set()
        self._seen_finished: Set[str] = set()
        self._peers: Dict[str, int] = {}
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
        client = _connect(sock)
        try:
            regions = RegionMap(client, layout.buffers(), gpu_id=device)
        except BaseException:
            client.close()
            raise
        self.client, self.layout, self.regions = client, layout, regions
        self.src_regions = [(p.key, p.offset) for p in regions.placements]
        max_segs = min(self.cfg.max_segments or client.max_segments, client.max_segments)
        self.per_xfer = blocks_per_transfer(layout, max_segs, self.cfg.max_transfer_bytes)
        log.info("kvproxy: rank %d on %s (%s): %d planes of %d blocks in %d regions (%s), %d blocks per transfer",
                 self.tp_rank, client.node_id, sock, len(layout.planes), self.num_blocks, regions.region_count,
                 f"cuda:{device}" if cuda else "host", self.per_xfer)
        self._reaper = threading.Thread(target=self._reap, name="kvproxy-vllm-reap", daemon=True)
        self._reaper.start()

    def peer_index(self, node_id: str) -> int:
        """The local kvproxyd's index of a peer node (looked up once)."""
        idx = self._peers.get(node_id)
        if idx is None:
            idx = self._peers[node_id] = self.client.peer(node_id)
        return idx

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
        """Requests sent (blocks may be freed) and received since the last call.

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
        return sending or None, recving or None

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
