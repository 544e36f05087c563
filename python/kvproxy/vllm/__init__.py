# SPDX-License-Identifier: BSD-3-Clause
"""kvproxy as a vLLM v1 KV connector: prefill instances push KV blocks to decode instances.

vLLM loads it by module path, on both instances (prefill and decode), with
vLLM's disaggregated-serving proxy in front::

    vllm serve MODEL --port 8100 --kv-transfer-config '{"kv_connector": "KvproxyConnector",
        "kv_connector_module_path": "kvproxy.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"kvproxy_socket": "/run/kvproxy/prefill0.sock"}}'

(and the same with the decode node's socket). The ``kvproxy_*`` keys of
``kv_connector_extra_config``, or ``KVPROXY_*`` environment variables,
configure it (:class:`KvproxyVllmConfig`). The kvproxyd beside the prefill
workers must list the decode nodes' kvproxyd as peers, and the other way
round.

How a request moves
-------------------

1. The proxy sends the request to the prefill instance with
   ``kv_transfer_params = {"do_remote_decode": true}`` and ``max_tokens=1``.
   When it finishes, ``request_finished`` keeps its blocks (``delay_free``)
   and returns ``kv_transfer_params`` naming the prefill scheduler's mailbox
   (an HTTP mailbox, :mod:`kvproxy._bootstrap`, that this scheduler hosts),
   the request id, the TP size and the block counts; the proxy forwards
   them to the decode instance.
2. The decode scheduler answers ``get_num_new_matched_tokens`` with the
   prompt tokens its prefix cache lacks, loaded asynchronously: the request
   waits in ``WAITING_FOR_REMOTE_KVS``. Its blocks allocated, each decode
   worker stores a registration in the prefill's mailbox for every prefill
   rank it takes KV from (:mod:`.tp_map`: rank ``r`` with equal TP sizes):
   its kvproxyd node id, region keys and offsets, block ids per KV-cache
   group, a 48-bit tag.
3. That prefill worker reads it, pairs its blocks with the decode side's
   (the last ones, when the decode side's prefix cache already holds the
   first), and submits kvproxy transfers of a fixed number of block
   positions each, ids ``tag << 16 | j << shift | n``; consecutive blocks
   coalesce into one segment per plane (a K or V cache of one layer), or,
   with different TP sizes, one strided segment per plane carrying the
   decode rank's KV heads (:mod:`.slicing`).
4. kvproxyd posts a ``landed`` completion on the decode worker per whole
   transfer; when all landed, the request is reported received. The prefill
   worker reports the request sent when every ``done`` completion is in;
   vLLM then frees its blocks.

Failures end every request within bounded time, typed: a transfer that
fails, a peer kvproxyd that is not configured, a layout mismatch, a
prefill instance that dies, all surface on the decode side as load errors
for exactly the blocks of the transfers that did not land
(``get_block_ids_with_load_errors``; vLLM keeps what did land, recomputes
the rest or fails the request per its ``kv_load_failure_policy``), or, for
a model of several KV-cache groups (where vLLM refuses block-level errors),
as the request named in ``get_transfer_results``' ``failed_recving``. The decode side gives such a request
up with kvproxyd's receiver-side fence (the fence's completion, within
``timeouts.peer_ms``, says that nothing of it can land any more); without
one, at its deadline (registration + submit window + transfer deadline +
``peer_timeout_s`` + 1 s; once the prefill side stored that everything is
submitted, that time + transfer deadline + ``peer_timeout_s`` + 1 s). A
decode instance that never registers cannot strand prefill blocks: the
lease (``kvproxy_lease_s``) releases them.

Supported: full-attention and MLA KV caches (FlashAttention's K/V split,
FlashInfer's combined layout, MLA's latent cache, HND or NHD), kernel
blocks smaller than the scheduler's, tensor-parallel sizes equal or
dividing one another (fan-out to more decode ranks, fan-in from more
prefill ranks, MLA's replicated cache from one prefill rank per decode
rank; ranks mapped as vLLM's NIXL connector maps them), data parallelism
(each engine's own mailbox), a decode-side prefix cache hit, GPU memory
(CUDA IPC) and memfd host memory. Refused at start with the reason:
pipeline parallelism, context parallelism, hybrid models (sliding-window
or mamba groups), ``kv_buffer_device`` other than ``cuda``; refused per
request (the decode side prefills locally and releases the prefill's
blocks): a prefill instance whose TP size and ours do not divide one
another, or one that is not a kvproxy.vllm instance of this protocol.
"""

from __future__ import annotations

from ._compat import VLLM_IMPORT_ERROR
from .config import KvproxyVllmConfig
from .connector import KvproxyConnector
from .layout import LayoutError
from .scheduler import PROTOCOL, KvproxyConnectorMetadata
from .stats import KvproxyConnectorStats, KvproxyPromMetrics

__all__ = [
    "KvproxyConnector",
    "KvproxyConnectorMetadata",
    "KvproxyConnectorStats",
    "KvproxyPromMetrics",
    "KvproxyVllmConfig",
    "LayoutError",
    "PROTOCOL",
    "VLLM_IMPORT_ERROR",
]
