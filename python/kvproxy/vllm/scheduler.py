# SPDX-License-Identifier: BSD-3-Clause
"""The scheduler half of the connector: which requests move, and what workers are told.

Prefill side (``do_remote_decode`` in a request's ``kv_transfer_params``):
``request_finished`` keeps the request's blocks (``delay_free``) and
returns the ``kv_transfer_params`` the decode side needs; the next
``build_connector_meta`` hands the blocks and the lease to the workers;
``update_connector_output`` forgets the request once every worker reported
it sent (or its lease expired); ``has_pending_push_work`` keeps the engine
stepping meanwhile. The scheduler process also hosts the mailbox
(:class:`kvproxy._bootstrap.BootstrapServer`) through which the decode
workers' registrations reach the prefill workers; its address travels in
``kv_transfer_params``.

Decode side (``do_remote_prefill``): ``get_num_new_matched_tokens``
answers "all the prompt tokens the local prefix cache lacks, loaded
asynchronously", so the request waits in ``WAITING_FOR_REMOTE_KVS``;
``update_state_after_alloc`` records the blocks allocated for them and the
next ``build_connector_meta`` hands them to the workers, which register
with the prefill ranks they take KV from (:mod:`.tp_map`; the prefill's TP
size travels in ``kv_transfer_params``) and count the landed transfers. A request aborted
while it waits (``request_finished``) is given up by the workers, which
still report it received once nothing more can land in its blocks.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from .._bootstrap import BootstrapServer
from ._compat import KVConnectorMetadata, spec_kind, status_name
from .config import KvproxyVllmConfig

__all__ = ["KvproxyConnectorMetadata", "SchedulerSide", "PROTOCOL", "outgoing_ip"]

log = logging.getLogger("kvproxy.vllm")

# Version of kv_transfer_params and of the mailbox records (2: pair keys
# <request>.<prefill rank>.<n> and head-sliced registrations, heterogeneous TP).
PROTOCOL = 2
# A finished prefill request counts as sent only in these states (others were aborted).
_SENDABLE = ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")


class KvproxyConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells every worker in one step (plain data: pickled by vLLM).

    Attributes:
        bootstrap: ``host:port`` of this (prefill) scheduler's mailbox, or None.
        sends: prefill requests finished since the last step:
            ``{req_id: {"blocks": [[block ids] per group], "lease_s": s}}``.
        recvs: decode requests whose blocks were allocated:
            ``{req_id: {"blocks": [[ids] per group], "addr": mailbox,
            "remote_request_id": id, "remote_tp_size": n,
            "remote_block_counts": [n per group]}}``.
        give_ups: decode requests aborted while their data was expected.
        releases: prefill requests a decode side will never register for
            (refused, or aborted before its blocks were allocated):
            ``[[addr, remote_request_id, remote_tp_size, reason], ...]``.
    """

    def __init__(self) -> None:
        self.bootstrap: Optional[str] = None
        self.sends: Dict[str, Dict[str, Any]] = {}
        self.recvs: Dict[str, Dict[str, Any]] = {}
        self.give_ups: List[str] = []
        self.releases: List[List[Any]] = []

    def __repr__(self) -> str:
        return (f"<KvproxyConnectorMetadata sends={len(self.sends)} recvs={len(self.recvs)} "
                f"give_ups={len(self.give_ups)} releases={len(self.releases)}>")


def outgoing_ip() -> str:
    """An address of this host that other hosts can reach: ``$VLLM_HOST_IP``, else
    the source address of a route to a public address (no packet is sent), else 127.0.0.1."""
    ip = os.environ.get("VLLM_HOST_IP")
    if ip:
        return ip
    for family, probe in ((socket.AF_INET, ("192.0.2.1", 9)), (socket.AF_INET6, ("2001:db8::1", 9))):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(probe)
                return str(s.getsockname()[0])
        except OSError:
            continue
    return "127.0.0.1"


def block_ids_of(blocks: Any) -> List[List[int]]:
    """The block ids allocated for the tokens to load, per group (newest vLLM API first)."""
    for name in ("get_unhashed_block_ids_all_groups", "get_unhashed_block_ids", "get_block_ids"):
        fn = getattr(blocks, name, None)
        if fn is None:
            continue
        ids = fn()
        if ids and not isinstance(ids[0], (list, tuple)):
            return [list(ids)]
        return [list(g) for g in ids]
    raise TypeError(f"{type(blocks).__name__} has no block-id accessor vLLM's KVCacheBlocks has")


@dataclass
class _Held:
    """A finished prefill request whose blocks the workers still send from."""

    since: float
    blocks: List[List[int]] = field(default_factory=list)


class SchedulerSide:
    """Scheduler-side state of one engine (see the module docstring)."""

    def __init__(self, vllm_config: Any, cfg: KvproxyVllmConfig, kv_cache_config: Any, engine_id: str) -> None:
        kvt = vllm_config.kv_transfer_config
        pc = vllm_config.parallel_config
        self.cfg = cfg
        self.engine_id = engine_id
        self.block_size = int(vllm_config.cache_config.block_size)
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        self.dp_index = int(getattr(pc, "data_parallel_index", getattr(pc, "data_parallel_rank", 0)) or 0)
        role = str(getattr(kvt, "kv_role", "kv_both") or "kv_both")
        self.producer = role in ("kv_producer", "kv_both")
        self.consumer = role in ("kv_consumer", "kv_both")
        self.groups = self._group_count(kv_cache_config)
        self._held: Dict[str, _Held] = {}
        self._new_sends: Dict[str, Dict[str, Any]] = {}
        self._new_recvs: Dict[str, Dict[str, Any]] = {}
        self._recving: Set[str] = set()
        self._give_ups: List[str] = []
        self._releases: List[List[Any]] = []
        self._warned: Set[str] = set()
        self.server: Optional[BootstrapServer] = None
        self.bootstrap: Optional[str] = None
        if self.producer:
            port = cfg.bootstrap_port + self.dp_index if cfg.bootstrap_port else 0
            bind = cfg.bootstrap_host or ""
            # Mailbox entries live until read (meta: within the lease; status:
            # within the decode side's wait), then expire.
            ttl = max(cfg.lease_s, cfg.submit_window_s + cfg.transfer_timeout_s + cfg.peer_timeout_s) + 60.0
            self.server = BootstrapServer(bind, port, ttl=ttl)
            host = cfg.bootstrap_host if cfg.bootstrap_host not in (None, "", "0.0.0.0", "::") else outgoing_ip()
            self.bootstrap = f"[{host}]:{self.server.port}" if ":" in str(host) else f"{host}:{self.server.port}"
            log.info("kvproxy: prefill mailbox of engine %s on %s", engine_id, self.bootstrap)

    @staticmethod
    def _group_count(kv_cache_config: Any) -> int:
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        if not groups:
            return 1
        bad = [spec_kind(g.kv_cache_spec) for g in groups if spec_kind(g.kv_cache_spec) != "full"]
        if bad:
            raise NotImplementedError(
                f"kvproxy.vllm moves full-attention (and MLA) KV caches only; this model has "
                f"KV-cache groups of {sorted(set(bad))} (hybrid models: sliding-window and mamba state "
                "need the groups' block clipping, not supported yet)")
        return len(groups)

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    # ---- decode side ----

    def _ours(self, params: Any) -> Optional[str]:
        """None if these kv_transfer_params come from a kvproxy prefill we can load
        from, else why not."""
        if params.get("kvproxy") != PROTOCOL:
            return (f"kv_transfer_params of protocol {params.get('kvproxy')!r} (not a kvproxy.vllm "
                    f"prefill instance of protocol {PROTOCOL})")
        if not self.consumer:
            return "this instance's kv_role is kv_producer"
        if not params.get("remote_bootstrap") or params.get("remote_request_id") is None:
            return "kv_transfer_params lack remote_bootstrap/remote_request_id"
        rtp = params.get("remote_tp_size")
        if not isinstance(rtp, int) or isinstance(rtp, bool) or rtp < 1:
            return f"kv_transfer_params carry a bad remote_tp_size {rtp!r}"
        if max(rtp, self.tp_size) % min(rtp, self.tp_size):
            # Heterogeneous TP maps ranks as vLLM's NIXL connector does: one
            # size must divide the other (see kvproxy.vllm.tp_map).
            return (f"the prefill instance runs tensor parallel size {rtp}, this one {self.tp_size}: "
                    "one must divide the other")
        counts = params.get("remote_block_counts")
        if not isinstance(counts, list) or len(counts) != self.groups:
            return f"the prefill instance has {counts!r} blocks per KV-cache group, this one {self.groups} groups"
        return None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return 0, False
        why = self._ours(params)
        if why is not None:
            self._warn_once(why, "kvproxy: request %s is prefilled locally: %s", request.request_id, why)
            return 0, False
        prompt = request.prompt_token_ids
        n = (len(prompt) if prompt is not None else int(getattr(request, "num_prompt_tokens", 0))) - num_computed_tokens
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return
        # The first call only: a second one (after the load, or after a
        # preemption) must not register again.
        params["do_remote_prefill"] = False
        why = self._ours(params)
        if num_external_tokens <= 0 or why is not None:
            if why is None or params.get("kvproxy") == PROTOCOL:
                self._release(params, why or "the decode side's prefix cache holds the whole prompt")
            return
        rid = request.request_id
        self._new_recvs[rid] = {
            "blocks": block_ids_of(blocks),
            "addr": params["remote_bootstrap"],
            "remote_request_id": params["remote_request_id"],
            "remote_tp_size": params["remote_tp_size"],
            "remote_block_counts": params["remote_block_counts"],
        }
        self._recving.add(rid)

    def _release(self, params: Dict[str, Any], reason: str) -> None:
        if params.get("remote_bootstrap") and params.get("remote_request_id") is not None:
            self._releases.append([params["remote_bootstrap"], params["remote_request_id"],
                                   int(params.get("remote_tp_size") or 1), reason])

    # ---- prefill side ----

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        params = request.kv_transfer_params
        if not params:
            return False, None
        rid = request.request_id
        if params.get("do_remote_prefill"):
            # A decode request finished before its blocks were allocated
            # (aborted): let the prefill side free its blocks now.
            params["do_remote_prefill"] = False
            if params.get("kvproxy") == PROTOCOL:
                self._release(params, "the decode request was aborted before it was scheduled")
            return False, None
        if rid in self._recving:
            # Aborted while its data was expected. vLLM frees its blocks only
            # once the workers report it received, so they must hear of it
            # even if it never reached them: they give it up and report it
            # once nothing more can land in its blocks.
            pending = self._new_recvs.get(rid)
            if pending is not None:
                pending["give_up"] = True
            else:
                self._give_ups.append(rid)
            return False, None
        if not params.get("do_remote_decode") or not self.producer:
            return False, None
        if status_name(request.status) not in _SENDABLE:
            return False, None
        groups = [list(g) for g in block_ids] if block_ids and isinstance(block_ids[0], (list, tuple)) \
            else [list(block_ids or [])]
        if not any(groups):
            return False, None
        self._held[rid] = _Held(time.monotonic(), groups)
        self._new_sends[rid] = {"blocks": groups, "lease_s": self.cfg.lease_s}
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "kvproxy": PROTOCOL,
            "remote_engine_id": self.engine_id,
            "remote_request_id": rid,
            "remote_bootstrap": self.bootstrap,
            "remote_tp_size": self.tp_size,
            "remote_block_counts": [len(g) for g in groups],
            "remote_num_tokens": int(getattr(request, "num_computed_tokens", 0) or 0),
        }

    # ---- both ----

    def build_connector_meta(self, scheduler_output: Any = None) -> KvproxyConnectorMetadata:
        meta = KvproxyConnectorMetadata()
        meta.bootstrap = self.bootstrap
        if self._new_sends:
            meta.sends, self._new_sends = self._new_sends, {}
        if self._new_recvs:
            meta.recvs, self._new_recvs = self._new_recvs, {}
        if self._give_ups:
            meta.give_ups, self._give_ups = self._give_ups, []
        if self._releases:
            meta.releases, self._releases = self._releases, []
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        for rid in getattr(connector_output, "finished_sending", None) or ():
            self._held.pop(rid, None)
        for rid in getattr(connector_output, "finished_recving", None) or ():
            self._recving.discard(rid)

    def has_pending_push_work(self) -> bool:
        # Keep the engine stepping while workers still send from held blocks
        # (their completions and the lease are polled in get_finished), and
        # until queued registrations/releases reach the workers.
        return bool(self._held or self._new_recvs or self._give_ups or self._releases)

    @property
    def held(self) -> int:
        """Prefill requests whose blocks are still held."""
        return len(self._held)

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
