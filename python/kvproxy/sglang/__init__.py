# SPDX-License-Identifier: BSD-3-Clause
"""kvproxy as an sglang disaggregation transfer backend.

sglang's prefill/decode disaggregation moves each request's KV cache through
a *transfer backend*: a manager per worker, a sender per request on the
prefill side, a receiver per request on the decode side, and a bootstrap
server on the prefill node (``sglang/srt/disaggregation/base/conn.py``).
This package implements that contract on top of kvproxy with nothing but
the standard library and a ``kvproxyd`` beside each worker.

Selecting it: ``pip install ./python`` on the sglang hosts registers the
sglang plugin (:mod:`kvproxy.sglang.plugin`, entry point ``kvproxy`` of
``sglang.srt.plugins``), then, on both servers::

    KVPROXY_SOCKET=/run/kvproxy/prefill0.sock \\
    python -m sglang.launch_server --model-path ... --disaggregation-mode prefill \\
        --disaggregation-transfer-backend kvproxy

Settings come from ``KVPROXY_*`` environment variables
(:class:`KvproxyConfig`). The kvproxyd of a prefill node must list the
decode nodes' kvproxyd as peers (and the other way round).

Modules: :mod:`.manager` (the per-worker manager: client, regions, reaper),
:mod:`.sender` (prefill side), :mod:`.receiver` (decode side, fences),
:mod:`.bootstrap` (sglang's bootstrap-server protocol: server and client),
:mod:`.channel` (the managers' direct request channel), :mod:`.topology`
(attention ranks, addresses, layout comparison), :mod:`.config`,
:mod:`.plugin`. The README's "sglang" section describes the design:
how pages become segments, the states, the bootstrap, the fence.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

from ._common import DisaggregationMode, KVArgs, KVPoll, KVTransferError, TransferMetric
from .bootstrap import KvproxyKVBootstrapServer, PrefillInfo
from .config import KvproxyConfig
from .manager import KvproxyKVManager
from .receiver import KvproxyKVReceiver
from .sender import KvproxyKVSender

__all__ = [
    "KVPoll",
    "KVArgs",
    "DisaggregationMode",
    "KvproxyConfig",
    "KVTransferError",
    "TransferMetric",
    "PrefillInfo",
    "KvproxyKVManager",
    "KvproxyKVSender",
    "KvproxyKVReceiver",
    "KvproxyKVBootstrapServer",
    "KvproxyBackend",
    "KVManager",
    "KVSender",
    "KVReceiver",
    "KVBootstrapServer",
]


class KvproxyBackend:
    """The backend's classes by sglang's ``KVClassType`` (what the plugin's
    ``get_kv_class`` hook answers): ``get_kv_class(class_type)`` maps
    ``kvargs``, ``manager``, ``sender``, ``receiver``, ``bootstrap_server``
    (compared by value) to a class, anything else to None."""

    def get_kv_class(self, class_type: Any) -> Optional[Type]:
        return _CLASSES.get(str(getattr(class_type, "value", class_type)).lower())


_CLASSES: Dict[str, type] = {
    "kvargs": KVArgs,
    "manager": KvproxyKVManager,
    "sender": KvproxyKVSender,
    "receiver": KvproxyKVReceiver,
    "bootstrap_server": KvproxyKVBootstrapServer,
}

# sglang's generic names.
KVManager = KvproxyKVManager
KVSender = KvproxyKVSender
KVReceiver = KvproxyKVReceiver
KVBootstrapServer = KvproxyKVBootstrapServer
