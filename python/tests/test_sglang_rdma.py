#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""kvproxy.sglang over the RDMA transport, inside the Soft-RoCE VM (rdma suite).

Kept small: the VM emulates its CPU (Python starts in seconds, RDMA moves
tens of MB/s).

1. One rank per side: a request's pages move by RDMA, every byte checked.
2. Two attention-TP ranks per side in processes of their own
   (``sglang_harness.py``, MIN all-reduce): decode rank d1 fails while d0's
   request is mid-transfer; both ranks clear() (the fence revokes the
   request's RDMA grants); the pages as clear() left them are unchanged
   once the prefill side's transfers ended.
3. abort() with 64 MiB in flight by RDMA (2 x 32 MiB, max_inflight 2): returns once the
   fence holds; no byte lands after it (the time is logged).

Run through meson (``meson test -C build rdma_sglang``), which boots the VM
with tools/rdma-vm.sh; outside the VM it exits 77.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time
import unittest
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402
import test_fence as tf  # noqa: E402  (the RDMA daemon pair)
import sglang_fixture as sf  # noqa: E402  (PagedKV, poll_until)
import test_sglang_ranks as tr  # noqa: E402  (Cluster)

import kvproxy.sglang as ks  # noqa: E402
from kvproxy.sglang import KVPoll  # noqa: E402

PAIR = ()


def rdma_xfers() -> int:
    return int((PAIR[0].admin_call("stats").get("rdma") or {}).get("xfers", 0))


class RdmaSglangTest(unittest.TestCase):
    def test_1_one_rank_per_side(self) -> None:
        boot = ks.KvproxyKVBootstrapServer("127.0.0.1", 0)
        pkv, dkv = sf.PagedKV(2, 64, item_k=16384), sf.PagedKV(2, 96, item_k=16384)
        sa = SimpleNamespace(host="127.0.0.1", port=30000, disaggregation_bootstrap_port=boot.port)
        pm = ks.KvproxyKVManager(pkv.args(), "prefill", sa, config=ks.KvproxyConfig(socket=PAIR[0].sock))
        dm = ks.KvproxyKVManager(dkv.args(), "decode", sa, config=ks.KvproxyConfig(socket=PAIR[1].sock))
        try:
            addr = f"127.0.0.1:{boot.port}"
            self.assertTrue(pm.side.registered.wait(60))
            before = rdma_xfers()
            sender = ks.KVSender(pm, addr, 77, [0], 0)
            receiver = ks.KVReceiver(dm, addr, 77)
            self.assertTrue(dm.try_ensure_parallel_info(addr))
            receiver.init(0)
            sf.poll_until(receiver, [KVPoll.WaitingForInput], 60)
            rnd = random.Random(7)
            src, dst = rnd.sample(range(64), 40), rnd.sample(range(96), 40)
            pkv.fill_pages(src, rnd)
            receiver.send_metadata(dst, 2, [])
            sf.poll_until(sender, [KVPoll.WaitingForInput], 60)
            sender.init(len(src), 1)
            sender.send(src[:20])
            sender.send(src[20:])
            sf.poll_until(receiver, [KVPoll.Success], 120)
            sf.poll_until(sender, [KVPoll.Success], 120)
            for b in range(4):
                for s, d in zip(src, dst):
                    self.assertEqual(dkv.page(b, d), pkv.page(b, s), f"buffer {b}: page {s} -> {d}")
            self.assertGreater(rdma_xfers() - before, 0, "nothing went by RDMA")
            sender.clear()
            receiver.clear()
        finally:
            pm.close()
            dm.close()
            boot.close()
            pkv.close()
            dkv.close()

    def test_2_decode_rank_fails_mid_transfer(self) -> None:
        c = tr.Cluster("rdma")
        try:
            port = c.bootstrap()
            common = dict(tp_size=2, bootstrap_port=port, layers=2, pages=128, item=32768)
            for rank in range(2):
                c.rank(name=f"p{rank}", role="prefill", group="p", engine_rank=rank, socket=PAIR[0].sock, **common)
                c.rank(name=f"d{rank}", role="decode", group="d", engine_rank=rank, socket=PAIR[1].sock, **common)
            coord = c.start()
            room = 9000
            # 2 chunks of 64 pages x 4 buffers x 32 KiB = 8 MiB per rank each.
            r = {"room": room, "host": "127.0.0.1", "port": port, "src": list(range(128)),
                 "dst": list(range(127, -1, -1)), "chunk": 64}
            coord.command("p", {"op": "stall", "room": room})
            coord.command("p", {"op": "add", "req": r})
            coord.command("d", {"op": "add", "req": r})
            coord.wait_event(lambda e: e.get("ev") == "progress" and e["room"] == room and e["rank"] == "d0", 300,
                             "first bytes on d0")
            coord.direct("d1", {"op": "fail", "room": room})
            for rank in ("d0", "d1"):
                e = tr.failed(coord, room, rank)
                self.assertEqual(e["code"], "another-rank")
                e = coord.wait_event(lambda e, n=rank: e.get("ev") == "cleared" and e["room"] == room and e["rank"] == n,
                                     300, f"cleared {rank}")
                tr.log(f"RDMA: {rank} failure_exception() + clear() took {e['clear_s'] * 1e3:.1f} ms "
                       f"(fence {e['fence_s'] * 1e3 if e['fence_s'] else float('nan'):.1f} ms); "
                       f"{e['landed']} of {e['expected']} bytes landed")
            coord.command("p", {"op": "stall", "room": room, "resume": True})
            for rank in ("p0", "p1"):
                tr.failed(coord, room, rank)
            deadline = time.monotonic() + 300
            while True:
                for rank in ("p0", "p1"):
                    coord.direct(rank, {"op": "stats"})
                stats = [coord.wait_event(lambda e, n=n: e.get("ev") == "stats" and e["rank"] == n, 300)
                         for n in ("p0", "p1")]
                if all(s["tables"]["inflight"] == 0 for s in stats):
                    break
                self.assertLess(time.monotonic(), deadline, f"transfers still in flight: {stats}")
                time.sleep(0.2)  # between two rounds of asking the ranks
            for rank in ("d0", "d1"):
                coord.direct(rank, {"op": "recheck", "room": room})
                e = coord.wait_event(lambda e, n=rank: e.get("ev") == "recheck" and e["rank"] == n, 300)
                self.assertTrue(e["same"], f"{rank}: bytes landed in the pages after clear() returned")
        finally:
            c.close()


class RdmaFenceTest(unittest.TestCase):
    def test_3_abort_with_64_mib_in_flight(self) -> None:
        """abort() while two 32 MiB transfers are in flight by RDMA: it returns
        once the fence holds (grants revoked, posted WRITEs completed), and no
        byte lands after it returned."""
        import ctypes

        boot = ks.KvproxyKVBootstrapServer("127.0.0.1", 0)
        pkv, dkv = sf.PagedKV(1, 128, item_k=1 << 20), sf.PagedKV(1, 128, item_k=1 << 20)
        sa = SimpleNamespace(host="127.0.0.1", port=30000, disaggregation_bootstrap_port=boot.port)
        pm = ks.KvproxyKVManager(pkv.args(), "prefill", sa, config=ks.KvproxyConfig(socket=PAIR[0].sock, max_inflight=2))
        dm = ks.KvproxyKVManager(dkv.args(), "decode", sa, config=ks.KvproxyConfig(socket=PAIR[1].sock))
        try:
            addr = f"127.0.0.1:{boot.port}"
            self.assertTrue(pm.side.registered.wait(60))
            self.assertTrue(dm.side.can_fence, "this kvproxyd has no fence")
            for b in range(len(dkv.ptrs)):
                ctypes.memset(dkv.ptrs[b], 0xA5, dkv.lens[b])
            sender = ks.KVSender(pm, addr, 78, [0], 0)
            receiver = ks.KVReceiver(dm, addr, 78)
            self.assertTrue(dm.try_ensure_parallel_info(addr))
            receiver.init(0)
            sf.poll_until(receiver, [KVPoll.WaitingForInput], 60)
            pages = list(range(128))  # 4 transfers of 32 MiB (K) and one of 256 KiB (V)
            pkv.fill_pages(pages, random.Random(8))
            receiver.send_metadata(pages, 0, [])
            sf.poll_until(sender, [KVPoll.WaitingForInput], 60)
            sender.init(len(pages), 0)
            sender.send(pages)
            deadline = time.monotonic() + 300
            while receiver._landed_bytes == 0:
                self.assertLess(time.monotonic(), deadline, "nothing landed")
                dm.wait_for_change(0.001)
            in_flight = len(pm.side.inflight)
            t0 = time.monotonic()
            receiver.abort()
            took = time.monotonic() - t0
            at_abort = [ctypes.string_at(dkv.ptrs[b], dkv.lens[b]) for b in range(len(dkv.ptrs))]
            outstanding = receiver._expected - receiver._landed_bytes
            tr.log(f"RDMA: abort() with {in_flight} transfers ({outstanding / (1 << 20):.1f} MiB) outstanding took "
                   f"{took * 1e3:.1f} ms (fence confirmed {receiver.fence_seconds * 1e3:.1f} ms after submission)")
            self.assertLess(receiver._landed_bytes, receiver._expected, "the transfer ended before the abort")
            while sender._pending:  # every transfer of the sender ended
                self.assertLess(time.monotonic(), deadline, "the sender's transfers never ended")
                pm.wait_for_change(0.05)
            for b in range(len(dkv.ptrs)):
                self.assertEqual(ctypes.string_at(dkv.ptrs[b], dkv.lens[b]), at_abort[b],
                                 f"buffer {b}: bytes landed after abort() returned")
            sender.clear()
            receiver.clear()
        finally:
            pm.close()
            dm.close()
            boot.close()
            pkv.close()
            dkv.close()


def main() -> int:
    global PAIR
    if not tf.RDMA:
        tb.skip_all("runs inside the Soft-RoCE VM: meson test -C build rdma_sglang (tools/rdma-vm.sh)")
    # The VM has 1 GiB: under ASan (build-san) every process would keep a
    # 256 MiB quarantine beside the 2 x 128 MiB of test_3's caches.
    if "quarantine_size_mb" not in os.environ.get("ASAN_OPTIONS", ""):
        os.environ["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "quarantine_size_mb=16"]))
    tb.require_daemon_and_library()
    tb.TMP = Path(tempfile.mkdtemp(prefix="kvp-sglang-rdma."))
    PAIR = tf.start_pair(tb.TMP)
    try:
        loader = unittest.TestLoader()
        suite = unittest.TestSuite([loader.loadTestsFromTestCase(RdmaSglangTest),
                                    loader.loadTestsFromTestCase(RdmaFenceTest)])
        ok = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite).wasSuccessful()
    finally:
        problems = [p for d in reversed(PAIR) if (p := d.stop())]
        if not os.environ.get("KVP_KEEP") and not problems:
            shutil.rmtree(tb.TMP, ignore_errors=True)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
