#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""kvproxy.vllm against the real vLLM package: loading, the base class, the call shapes.

Runs only where vLLM is importable (exit 77 with the reason otherwise):

- vLLM's KVConnectorFactory loads ``KvproxyConnector`` from
  ``kv_connector_module_path = "kvproxy.vllm"`` (and takes the
  three-argument constructor, not the deprecated two-argument one);
- the class is a ``KVConnectorBase_V1`` and a ``SupportsHMA`` with no
  abstract method left, its stats classes are vLLM's ``KVConnectorStats``
  and ``KVConnectorPromMetrics``;
- every method of the base class the connector overrides accepts the
  arguments the base class's signature names (positionally and by keyword);
- the names the connector looks up exist in this vLLM: RequestStatus's
  finished states, KVConnectorRole's members, a KVCacheBlocks block-id accessor.

Needs no kvproxyd. Exit status: 0 pass, 1 fail, 77 skip.
"""

from __future__ import annotations

import inspect
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SKIP = 77

try:
    import vllm  # noqa: F401
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
except Exception as e:  # noqa: BLE001
    print(f"SKIP: vLLM is not importable here ({type(e).__name__}: {e})", file=sys.stderr)
    sys.exit(SKIP)

import kvproxy.vllm as kv  # noqa: E402


def kv_transfer_config():
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="KvproxyConnector", kv_connector_module_path="kvproxy.vllm",
                            kv_role="kv_both", kv_connector_extra_config={"kvproxy_socket": "/run/kvproxy/x.sock"})


class RealVllmTest(unittest.TestCase):
    def test_factory_loads_the_connector(self) -> None:
        cls = KVConnectorFactory.get_connector_class(kv_transfer_config())
        self.assertIs(cls, kv.KvproxyConnector)
        compat = getattr(KVConnectorFactory, "_get_connector_class_with_compat", None)
        if compat is not None:
            _cls, old_signature = compat(kv_transfer_config())
            self.assertFalse(old_signature, "vLLM would use the deprecated two-argument constructor")
        self.assertEqual(kv.VLLM_IMPORT_ERROR, None)

    def test_base_classes(self) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
        from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

        self.assertTrue(issubclass(kv.KvproxyConnector, KVConnectorBase_V1))
        self.assertTrue(issubclass(kv.KvproxyConnector, SupportsHMA))
        self.assertEqual(set(getattr(kv.KvproxyConnector, "__abstractmethods__", ())), set())
        self.assertTrue(issubclass(kv.KvproxyConnectorStats, KVConnectorStats))
        self.assertTrue(issubclass(kv.KvproxyPromMetrics, KVConnectorPromMetrics))
        self.assertIsInstance(kv.KvproxyConnector.build_kv_connector_stats({"transfers": 1}), KVConnectorStats)

    def test_call_shapes_bind(self) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA

        checked = []
        for base in (KVConnectorBase_V1, SupportsHMA):
            for name, fn in vars(base).items():
                ours = kv.KvproxyConnector.__dict__.get(name)
                if ours is None or name.startswith("__") and name != "__init__":
                    continue
                raw_base = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
                raw_ours = ours.__func__ if isinstance(ours, (classmethod, staticmethod)) else ours
                if not callable(raw_base) or not callable(raw_ours):
                    continue
                params = list(inspect.signature(raw_base).parameters.values())
                pos = [object() for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                       and p.default is p.empty]
                kw = {p.name: object() for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
                sig = inspect.signature(raw_ours)
                with self.subTest(method=name):
                    sig.bind(*pos)
                    sig.bind(**kw)
                checked.append(name)
        for must in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                     "request_finished", "request_finished_all_groups", "start_load_kv", "save_kv_layer",
                     "wait_for_layer_load", "wait_for_save", "get_finished", "register_kv_caches",
                     "get_block_ids_with_load_errors", "build_kv_connector_stats", "shutdown"):
            self.assertIn(must, checked)

    def test_names_the_connector_uses(self) -> None:
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.request import RequestStatus

        for name in ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED", "FINISHED_ABORTED", "WAITING_FOR_REMOTE_KVS"):
            self.assertTrue(hasattr(RequestStatus, name), name)
        self.assertEqual({r.name for r in KVConnectorRole} >= {"SCHEDULER", "WORKER"}, True)
        self.assertTrue(any(hasattr(KVCacheBlocks, n) for n in
                            ("get_unhashed_block_ids_all_groups", "get_unhashed_block_ids", "get_block_ids")))


if __name__ == "__main__":
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(
        unittest.TestLoader().loadTestsFromTestCase(RealVllmTest))
    sys.exit(0 if result.wasSuccessful() else 1)
