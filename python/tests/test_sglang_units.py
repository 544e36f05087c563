#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Unit tests of kvproxy.sglang that need no kvproxyd: the bootstrap server's
protocol (sglang's CommonKVBootstrapServer routes), attention ranks as sglang
computes them, layout comparison, page runs and transfer splitting, settings
from $KVPROXY_*.

Exit status: 0 pass, 1 fail.
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kvproxy.sglang as ks  # noqa: E402
from kvproxy.sglang import _common as kc  # noqa: E402
from kvproxy.sglang.layout import split  # noqa: E402


class BootstrapServerTest(unittest.TestCase):
    """The bootstrap server speaks sglang's CommonKVBootstrapServer protocol."""

    def test_protocol(self) -> None:
        from kvproxy.sglang.bootstrap import RegistryError, registry_call

        with ks.KvproxyKVBootstrapServer("127.0.0.1", 0) as srv:
            addr = f"127.0.0.1:{srv.port}"
            self.assertEqual(registry_call(addr, "GET", "/health"), "OK")
            info = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
            with self.assertRaises(RegistryError) as cm:
                registry_call(addr, "GET", info)
            self.assertTrue(cm.exception.not_ready)
            base = {"attn_tp_size": 2, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0,
                    "pp_size": 1, "pp_rank": 0, "system_dp_size": 2, "page_size": 16, "kv_cache_dtype": "auto",
                    "load_balance_method": "round_robin", "prefill_http_port": 30000}
            for dp in (0, 1):
                for tp in (0, 1):
                    if (dp, tp) == (1, 1):
                        with self.assertRaises(RegistryError) as cm:
                            registry_call(addr, "GET", info)
                        self.assertEqual(cm.exception.status, 503)  # 3 of 4 ranks
                    registry_call(addr, "PUT", "/route", {**base, "attn_tp_rank": tp, "system_dp_rank": dp,
                                                          "rank_ip": "10.0.0.1", "rank_port": 7000 + 10 * dp + tp})
            got = registry_call(addr, "GET", info)
            self.assertEqual((got["attn_tp_size"], got["dp_size"], got["page_size"], got["follow_bootstrap_room"],
                              got["prefill_http_port"]), (2, 2, 16, False, 30000))
            self.assertEqual(registry_call(addr, "GET", "/route?prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=1"
                                                        "&target_pp_rank=0"), {"rank_ip": "10.0.0.1", "rank_port": 7011})
            with self.assertRaises(RegistryError) as cm:
                registry_call(addr, "GET", "/route?prefill_dp_rank=2&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0")
            self.assertEqual(cm.exception.status, 404)
            with self.assertRaises(RegistryError) as cm:
                registry_call(addr, "GET", "/route?prefill_dp_rank=0")
            self.assertEqual(cm.exception.status, 400)
            registry_call(addr, "POST", "/register_dp_rank", {"bootstrap_room": 41, "dp_rank": 1})
            self.assertEqual(registry_call(addr, "POST", "/query_dp_ranks", {"bootstrap_rooms": [40, 41]}), {"41": 1})
            self.assertEqual(len(srv.registered()), 4)


class HelpersTest(unittest.TestCase):
    def test_runs_and_split(self) -> None:
        self.assertEqual(kc.runs([4, 5, 6, 9, 10, 2]), [[4, 3], [9, 2], [2, 1]])
        self.assertEqual(kc.expand_runs([[4, 3], [9, 2]]), [4, 5, 6, 9, 10])
        self.assertEqual(kc.pair_runs([1, 2, 3, 7], [10, 11, 5, 6]), [(1, 10, 2), (3, 5, 1), (7, 6, 1)])
        segs = [(1, 0, 2, 100, 10), (1, 50, 2, 0, 25), (1, 90, 2, 40, 3)]
        pieces = split(segs, 2, 16, 65536)
        self.assertTrue(all(len(p) <= 2 and sum(s[4] for s in p) <= 16 for p in pieces), pieces)
        flat = [s for p in pieces for s in p]
        self.assertEqual(sum(s[4] for s in flat), 38)
        # Cut segments stay contiguous on both sides.
        self.assertEqual([s for s in flat if s[1] >= 50 and s[1] < 90],
                         [(1, 50, 2, 0, 6), (1, 56, 2, 6, 16), (1, 72, 2, 22, 3)])
        self.assertEqual(split([], 4, 16, 65536), [])

    def test_topology(self) -> None:
        """Attention ranks as sglang computes them: prefill's engine_rank is the
        global TP rank, decode's the attention-TP rank."""
        from kvproxy.sglang.topology import topology_of

        sa = SimpleNamespace(tp_size=4, dp_size=2, enable_dp_attention=True, pp_size=1)
        for rank, (dp, tp) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
            t = topology_of(SimpleNamespace(engine_rank=rank), sa, "prefill")
            self.assertEqual((t.attn_tp_size, t.attn_dp_rank, t.attn_tp_rank, t.dp_group, t.dp_size), (2, dp, tp, dp, 2))
            t = topology_of(SimpleNamespace(engine_rank=rank % 2), sa, "decode")
            self.assertEqual((t.attn_tp_size, t.attn_tp_rank), (2, tp))
        plain = topology_of(SimpleNamespace(engine_rank=1, system_dp_rank=1),
                            SimpleNamespace(tp_size=2, dp_size=2, enable_dp_attention=False), "prefill")
        self.assertEqual((plain.attn_tp_size, plain.attn_tp_rank, plain.system_dp_size, plain.dp_group, plain.dp_size),
                         (2, 1, 2, 1, 2))

    def test_layout_mismatch(self) -> None:
        from kvproxy.sglang.topology import layout_mismatch

        a = {"attn_tp_size": 2, "page_size": 16, "kv_cache_dtype": "auto", "layers": [0, 32], "kv_item_lens": [4096] * 64}
        self.assertIsNone(layout_mismatch(a, dict(a), "decode", "prefill"))
        why = layout_mismatch(a, {**a, "kv_cache_dtype": "fp8_e4m3"}, "decode", "prefill")
        self.assertEqual(why, "KV cache dtype differs: decode auto, prefill fp8_e4m3")
        why = layout_mismatch(a, {**a, "layers": [0, 16]}, "decode", "prefill")
        self.assertIn("[0, 32)", why)
        self.assertIn("[0, 16)", why)


class ConfigTest(unittest.TestCase):
    def test_from_env(self) -> None:
        c = ks.KvproxyConfig.from_env({"KVPROXY_SOCKET": "/s{engine_rank}", "KVPROXY_MAX_INFLIGHT": "4",
                                       "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "7"})
        self.assertEqual((c.socket, c.max_inflight, c.waiting_timeout, c.transfer_timeout), ("/s{engine_rank}", 4, 7.0, None))
        self.assertEqual(c.socket_for(3, 1), "/s3")
        c = ks.KvproxyConfig.from_env({"KVPROXY_SOCKET": "/env", "KVPROXY_TRANSFER_TIMEOUT": "2.5",
                                       "KVPROXY_WAITING_TIMEOUT": "9", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "7"})
        self.assertEqual((c.socket, c.transfer_timeout, c.bootstrap_timeout, c.waiting_timeout), ("/env", 2.5, 300.0, 9.0))
        self.assertEqual((c.sq_entries, c.cq_entries), (0, 0), "ring sizes: the daemon's by default")
        for bad in ({"KVPROXY_WAITING_TIMEOUT": "-1"}, {"KVPROXY_MAX_INFLIGHT": "0"}, {"KVPROXY_SQ_ENTRIES": "1000"}):
            with self.assertRaises(ValueError) as cm:
                ks.KvproxyConfig.from_env(bad)
            self.assertIn(next(iter(bad)), str(cm.exception))
        with self.assertRaises(ValueError):
            ks.KvproxyConfig(socket="/s{rank}").socket_for(0, 0)


def main() -> int:
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for case in (HelpersTest, ConfigTest, BootstrapServerTest):
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
