# SPDX-License-Identifier: BSD-3-Clause
"""vLLM's base classes where vLLM is importable, stand-ins where it is not.

The connector must load into vLLM as released (vLLM's factory imports
``kvproxy.vllm`` by module path and checks the class against
``KVConnectorBase_V1``), and it must also import without vLLM, so that its
tests and other drivers can run it through vLLM's call sequence. Everything
vLLM-specific is looked up here, once, by name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

log = logging.getLogger("kvproxy.vllm")

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found]
        KVConnectorBase_V1,
        KVConnectorMetadata,
    )

    VLLM_IMPORT_ERROR: Optional[str] = None
except Exception as e:  # noqa: BLE001 - any failure means "no usable vLLM"
    VLLM_IMPORT_ERROR = f"{type(e).__name__}: {e}"

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorMetadata (no vLLM here)."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]  # noqa: N801 - vLLM's name
        """Stand-in for the parts of vLLM's KVConnectorBase_V1 the connector relies on."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
            if self._kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> Any:
            return self._role

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def take_events(self) -> Any:
            return ()

        def get_kv_connector_kv_cache_events(self) -> Any:
            return None

        def build_connector_worker_meta(self) -> Any:
            return None

        def handle_preemptions(self, kv_connector_metadata: Any) -> None:
            return None

        def on_new_request(self, request: Any) -> None:
            return None

        def reset_cache(self) -> Optional[bool]:
            return None

try:  # pragma: no cover
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001

    class SupportsHMA:  # type: ignore[no-redef]
        """Stand-in for vLLM's marker of connectors that take block ids of every KV-cache group."""

try:  # pragma: no cover
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found]
        KVConnectorTransferResults,
    )
except Exception:  # noqa: BLE001

    @dataclass
    class KVConnectorTransferResults:  # type: ignore[no-redef]
        """Stand-in for newer vLLM's snapshot of a step's transfers (failed
        receives are in finished_recving too, so the request leaves its wait)."""

        finished_sending: set = field(default_factory=set)
        finished_recving: set = field(default_factory=set)
        failed_recving: set = field(default_factory=set)

try:  # pragma: no cover
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # type: ignore[import-not-found]
        KVConnectorPromMetrics,
        KVConnectorStats,
    )
except Exception:  # noqa: BLE001

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        """Stand-in for vLLM's KVConnectorStats: a serialisable ``data`` dict."""

        data: Dict[str, Any] = field(default_factory=dict)

    class KVConnectorPromMetrics:  # type: ignore[no-redef]
        """Stand-in for vLLM's per-connector Prometheus base."""

        def __init__(self, vllm_config: Any, metric_types: Dict[Any, Any], labelnames: Any,
                     per_engine_labelvalues: Dict[int, Any]) -> None:
            self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
            self._metric_types = metric_types
            self._labelnames = labelnames
            self.per_engine_labelvalues = per_engine_labelvalues


def role_name(role: Any) -> str:
    """``"SCHEDULER"`` or ``"WORKER"`` for vLLM's KVConnectorRole (or a stand-in)."""
    name = getattr(role, "name", None) or str(role).rsplit(".", 1)[-1]
    return str(name).upper()


def status_name(status: Any) -> str:
    """The name of a vLLM RequestStatus (an enum) or a stand-in."""
    return str(getattr(status, "name", status)).rsplit(".", 1)[-1].upper()


def tp_rank_of_vllm() -> Optional[int]:
    """This worker's tensor-parallel rank from vLLM's parallel state, or None."""
    try:  # pragma: no cover
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore[import-not-found]

        return int(get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001
        return None


def spec_kind(spec: Any) -> str:
    """``"full"`` for full-attention KV-cache groups (MLA included), else the spec's class name.

    vLLM's FullAttentionSpec subclasses (MLAAttentionSpec) count as full;
    SlidingWindowSpec, ChunkedLocalAttentionSpec and MambaSpec do not.
    """
    names = [c.__name__ for c in type(spec).__mro__]
    if any(n in ("SlidingWindowSpec", "ChunkedLocalAttentionSpec", "MambaSpec", "SinkFullAttentionSpec")
           for n in names):
        return type(spec).__name__
    if "FullAttentionSpec" in names:
        return "full"
    return type(spec).__name__
