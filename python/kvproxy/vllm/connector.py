# SPDX-License-Identifier: BSD-3-Clause
"""``KvproxyConnector``: the class vLLM's KVConnectorFactory loads from ``kvproxy.vllm``."""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Set, Tuple

from ._compat import KVConnectorBase_V1, KVConnectorTransferResults, SupportsHMA, role_name
from .config import KvproxyVllmConfig
from .scheduler import KvproxyConnectorMetadata, SchedulerSide
from .stats import KvproxyConnectorStats, KvproxyPromMetrics

__all__ = ["KvproxyConnector"]

log = logging.getLogger("kvproxy.vllm")


def _check_supported(vllm_config: Any) -> None:
    """Refuse, at start and with the reason, what the connector cannot move."""
    pc = vllm_config.parallel_config
    kvt = vllm_config.kv_transfer_config
    if int(getattr(pc, "pipeline_parallel_size", 1) or 1) > 1:
        raise NotImplementedError("kvproxy.vllm: pipeline parallelism is not supported (each PP stage holds "
                                  "other layers; the registration would need a PP rank)")
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if int(getattr(pc, name, 1) or 1) > 1:
            raise NotImplementedError(f"kvproxy.vllm: {name} > 1 is not supported (context-parallel ranks "
                                      "hold slices of each block's tokens)")
    dev = getattr(kvt, "kv_buffer_device", "cuda")
    if dev not in (None, "cuda"):
        raise NotImplementedError(f"kvproxy.vllm: kv_buffer_device {dev!r} is not supported: kvproxyd reads "
                                  "and writes the KV cache where vLLM keeps it (GPU memory), no host buffer")
    role = getattr(kvt, "kv_role", None)
    if role not in ("kv_producer", "kv_consumer", "kv_both"):
        raise ValueError(f"kvproxy.vllm: kv_role must be kv_producer, kv_consumer or kv_both, not {role!r}")


class KvproxyConnector(KVConnectorBase_V1, SupportsHMA):
    """A vLLM v1 KV connector that moves KV blocks from prefill to decode instances through kvproxy.

    Launch both instances with::

        --kv-transfer-config '{"kv_connector": "KvproxyConnector",
            "kv_connector_module_path": "kvproxy.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": {"kvproxy_socket": "/run/kvproxy/node.sock"}}'

    and put vLLM's disaggregated-serving proxy in front. See
    :mod:`kvproxy.vllm` and :class:`KvproxyVllmConfig` for the settings.
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # pragma: no cover - vLLM releases whose base takes (vllm_config, role)
            super().__init__(vllm_config, role)  # type: ignore[call-arg]
        _check_supported(vllm_config)
        kvt = vllm_config.kv_transfer_config
        self.kvproxy_config = KvproxyVllmConfig.from_sources(getattr(kvt, "kv_connector_extra_config", None))
        self.engine_id = str(getattr(kvt, "engine_id", None) or "")
        self._scheduler: Optional[SchedulerSide] = None
        self._worker: Any = None
        if role_name(role) == "SCHEDULER":
            self._scheduler = SchedulerSide(vllm_config, self.kvproxy_config, kv_cache_config, self.engine_id)
        else:
            from .worker import WorkerSide

            self._worker = WorkerSide(vllm_config, self.kvproxy_config, kv_cache_config)

    # ==== scheduler side ====

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KvproxyConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        assert self._scheduler is not None
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, [list(block_ids or [])])

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[Dict[str, Any]]]:
        assert self._scheduler is not None
        return self._scheduler.request_finished(request, [list(g) for g in block_ids])

    def has_pending_push_work(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_push_work()

    def get_finished_count(self) -> Optional[int]:
        # Every TP worker reports its own sends and receives: vLLM's default
        # (the world size) is the count.
        return None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        # Blocks move whole, whatever the layout inside them, and head slices
        # (different TP sizes) are cut from HND and NHD alike (kvproxy.vllm.slicing);
        # both sides' layouts are compared at registration.
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        return False  # nothing runs per layer

    # ==== worker side ====

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self._worker is not None
        meta = self._connector_metadata
        if meta is not None and not isinstance(meta, KvproxyConnectorMetadata):
            raise TypeError(f"kvproxy.vllm got connector metadata of type {type(meta).__name__}")
        self._worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads are asynchronous, whole requests (see kvproxy.vllm.worker)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None  # pushed once per request, after the forward

    def wait_for_save(self) -> None:
        return None  # the blocks stay held (delay_free) until reported sent

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        assert self._worker is not None
        return self._worker.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: Set[str]) -> KVConnectorTransferResults:
        """Newer vLLM's form of get_finished: failed receives named as such."""
        assert self._worker is not None
        sending, recving, failed = self._worker.get_transfer_results(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        if self._worker is None:
            return set()
        return self._worker.get_block_ids_with_load_errors()

    def get_kv_connector_stats(self) -> Optional[KvproxyConnectorStats]:
        return self._worker.get_stats() if self._worker is not None else None

    def get_handshake_metadata(self) -> Any:
        return None  # registrations travel per request, through the prefill's mailbox

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()

    # ==== stats ====

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> KvproxyConnectorStats:
        return KvproxyConnectorStats(data=data)

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Dict[Any, Any], labelnames: Any,
                           per_engine_labelvalues: Dict[int, Any]) -> KvproxyPromMetrics:
        return KvproxyPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ==== for drivers and tests ====

    @property
    def worker(self) -> Any:
        """The worker half (None in the scheduler process)."""
        return self._worker

    @property
    def scheduler(self) -> Optional[SchedulerSide]:
        """The scheduler half (None in worker processes)."""
        return self._scheduler
