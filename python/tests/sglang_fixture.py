#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""In-process fixture of the single-rank kvproxy.sglang tests (test_sglang_transfer.py,
test_sglang_failures.py, test_sglang_abort.py).

Three kvproxyd on 127.0.0.1 (daemon_harness.py): prefill0 and decode0, peers
of each other, and decode1, which prefill0 does not know. A bootstrap server
of the adapter runs in the test process. ``AdapterTestCase`` holds one
prefill and one decode worker for the cases of a script and drives the
adapter through the calls sglang's schedulers make (prefill: KVSender ->
poll until WaitingForInput -> pop_decode_prefix_len -> init -> send per
chunk -> poll until Success; decode: KVReceiver -> try_ensure_parallel_info
-> init(dp rank) -> poll until WaitingForInput -> send_metadata -> poll until
Success), on KV caches in host memory (per-layer K and V buffers in memfds,
aux rows in plain memory); ``worker()`` gives a case a worker of its own.

Each case drives the adapter through those calls and checks the bytes of
the pages moved, or the typed failure.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir. Exit status of the test scripts: 0 pass, 1 fail, 77 skip (with the
reason).

The multi-process harness (several ranks per side, each a process of its
own) is sglang_harness.py; this module keeps every rank in the test process.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import random
import sys
import tempfile
import time
import unittest
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Iterator, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

import kvproxy  # noqa: E402
from kvproxy import sglang as ks  # noqa: E402
from kvproxy.sglang import KVPoll  # noqa: E402

XFER_TIMEOUT = 30.0
BOOT: Optional[ks.KvproxyKVBootstrapServer] = None
DAEMONS: Dict[str, tb.Daemon] = {}
log = tb.log  # tagged with the running script's name


def addr_of(buf: kvproxy.HostBuffer) -> int:
    # The temporary export ends with the expression, so buf.close() still works.
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class PagedKV:
    """A worker's paged KV cache in host memory, shaped like sglang's MHA pool:
    ``layers`` K buffers in one memfd and ``layers`` V buffers in another
    (page ``i`` of buffer ``b`` at ``ptr[b] + i * item[b]``), plus aux
    (metadata) rows in plain memory, as sglang's CPU tensors are."""

    def __init__(self, layers: int, pages: int, item_k: int = 4096, item_v: int = 2048,
                 aux_rows: int = 16, aux_items: Sequence[int] = (64, 192)) -> None:
        self.pages = pages
        self.k = kvproxy.HostBuffer(layers * pages * item_k)
        self.v = kvproxy.HostBuffer(layers * pages * item_v)
        kb, vb = addr_of(self.k), addr_of(self.v)
        self.ptrs = [kb + l * pages * item_k for l in range(layers)] + [vb + l * pages * item_v for l in range(layers)]
        self.items = [item_k] * layers + [item_v] * layers
        self.lens = [pages * it for it in self.items]
        self.aux_items = list(aux_items)
        self.aux = [(ctypes.c_char * (aux_rows * it))() for it in self.aux_items]

    def args(self, engine_rank: int = 0) -> ks.KVArgs:
        return ks.KVArgs(
            engine_rank=engine_rank, gpu_id=0, page_size=16,
            kv_data_ptrs=list(self.ptrs), kv_data_lens=list(self.lens), kv_item_lens=list(self.items),
            aux_data_ptrs=[ctypes.addressof(a) for a in self.aux], aux_data_lens=[len(a) for a in self.aux],
            aux_item_lens=list(self.aux_items),
        )

    def page(self, b: int, i: int) -> bytes:
        return ctypes.string_at(self.ptrs[b] + i * self.items[b], self.items[b])

    def fill_pages(self, pages: Sequence[int], rnd: random.Random) -> None:
        for b in range(len(self.ptrs)):
            for i in pages:
                data = rnd.randbytes(self.items[b])
                ctypes.memmove(self.ptrs[b] + i * self.items[b], data, len(data))

    def aux_row(self, j: int, r: int) -> bytes:
        it = self.aux_items[j]
        return bytes(self.aux[j][r * it:(r + 1) * it])

    def set_aux_row(self, j: int, r: int, data: bytes) -> None:
        it = self.aux_items[j]
        self.aux[j][r * it:(r + 1) * it] = data

    def close(self) -> None:
        self.k.close()
        self.v.close()


def server_args(**fields) -> SimpleNamespace:
    """What the adapter reads of sglang's ServerArgs (sglang's defaults for the rest)."""
    sa = SimpleNamespace(host="127.0.0.1", port=30000, disaggregation_bootstrap_port=BOOT.port, pp_size=1,
                         tp_size=1, dp_size=1, enable_dp_attention=False, kv_cache_dtype="auto",
                         load_balance_method="follow_bootstrap_room", dist_init_addr=None)
    for k, v in fields.items():
        setattr(sa, k, v)
    return sa


def config(node: str, **settings) -> ks.KvproxyConfig:
    """The adapter's settings as sglang's processes read them ($KVPROXY_*), for one daemon."""
    env = {"KVPROXY_SOCKET": DAEMONS[node].sock}
    env.update({f"KVPROXY_{k.upper()}": str(v) for k, v in settings.items()})
    return ks.KvproxyConfig.from_env(env)


def manager(kv: "PagedKV", mode: ks.DisaggregationMode, node: str, sa: Optional[SimpleNamespace] = None,
            **settings) -> ks.KvproxyKVManager:
    cls = ks.KvproxyBackend().get_kv_class(SglangKVClassType.MANAGER)
    return cls(kv.args(), mode, sa or server_args(), False, config=config(node, **settings))


@contextlib.contextmanager
def worker(mode: ks.DisaggregationMode, node: str, layers: int = 4, pages: int = 32, item_k: int = 4096,
           sa: Optional[SimpleNamespace] = None, **settings) -> Iterator[Tuple["PagedKV", ks.KvproxyKVManager]]:
    """A worker of one test case's own: its KV cache and manager, both closed
    after; a prefill worker gets a bootstrap server of its own (one per
    prefill server, as sglang runs them)."""
    kv = PagedKV(layers, pages, item_k=item_k)
    boot = None
    try:
        if mode == ks.DisaggregationMode.PREFILL and sa is None:
            boot = ks.KvproxyKVBootstrapServer("127.0.0.1", 0)
            sa = server_args(disaggregation_bootstrap_port=boot.port)
        mgr = manager(kv, mode, node, sa, **settings)
        try:
            yield kv, mgr
        finally:
            mgr.close()
    finally:
        kv.close()
        if boot is not None:
            boot.close()


class SglangKVClassType(enum.Enum):
    """A stand-in for sglang's KVClassType (the provider compares values)."""

    KVARGS = "kvargs"
    MANAGER = "manager"
    SENDER = "sender"
    RECEIVER = "receiver"
    BOOTSTRAP_SERVER = "bootstrap_server"


def poll_until(obj, want: Sequence[KVPoll], timeout: float = XFER_TIMEOUT) -> KVPoll:
    """poll() as a scheduler does, until a state in ``want``; bounded; Failed is an error unless wanted."""
    deadline = time.monotonic() + timeout
    while True:
        st = obj.poll()
        if st in want:
            return st
        if st == KVPoll.Failed:
            try:
                obj.failure_exception()
            except ks.KVTransferError as e:
                raise AssertionError(f"{type(obj).__name__} failed: {e}") from e
            raise AssertionError(f"{type(obj).__name__} failed without an exception")
        if time.monotonic() > deadline:
            raise AssertionError(f"{type(obj).__name__} still {st.name} after {timeout}s, wanted {[w.name for w in want]}")
        obj.kv_mgr.wait_for_change(0.05)


def failure_of(obj) -> ks.KVTransferError:
    st = poll_until(obj, [KVPoll.Failed])
    assert st == KVPoll.Failed
    try:
        obj.failure_exception()
    except ks.KVTransferError as e:
        return e
    raise AssertionError("failure_exception() did not raise")


_rooms = iter(range(1 << 40, 1 << 41, 7919))


def new_room() -> int:
    return next(_rooms)


def setup_daemons() -> None:
    """setUpModule: prefill0, decode0, decode1 and the bootstrap server."""
    global BOOT
    tb.TMP = Path(tempfile.mkdtemp(prefix="kvp-sglang."))
    log(f"temp dir {tb.TMP}")
    DAEMONS.update(tb.start_trio(tb.TMP))
    BOOT = ks.KvproxyKVBootstrapServer(host="127.0.0.1", port=0)


def teardown_daemons() -> None:
    """tearDownModule: every daemon stopped cleanly but doomed0 (killed on purpose)."""
    if BOOT is not None:
        BOOT.close()
    tb.teardown_started()


class AdapterTestCase(unittest.TestCase):
    """One prefill worker (prefill0) and one decode worker (decode0) shared by
    the cases of a script, and the handshake and call sequence of a request."""

    LAYERS = 4
    P_PAGES = 600
    D_PAGES = 700

    @classmethod
    def setUpClass(cls) -> None:
        cls.pkv = PagedKV(cls.LAYERS, cls.P_PAGES)
        cls.dkv = PagedKV(cls.LAYERS, cls.D_PAGES)
        cls.pm = manager(cls.pkv, ks.DisaggregationMode.PREFILL, "prefill0")
        cls.dm = manager(cls.dkv, ks.DisaggregationMode.DECODE, "decode0")
        cls.addr = f"127.0.0.1:{BOOT.port}"
        assert cls.pm.side.registered.wait(XFER_TIMEOUT), "the prefill manager never registered"

    @classmethod
    def tearDownClass(cls) -> None:
        cls.pm.close()
        cls.dm.close()
        cls.pkv.close()
        cls.dkv.close()

    def handshake(self, dm: ks.KvproxyKVManager, room: int, pm: Optional[ks.KvproxyKVManager] = None):
        """Sender and receiver for ``room``, the receiver bootstrapped (WaitingForInput)."""
        addr = pm.side.registry if pm is not None else self.addr
        sender = ks.KVSender(pm or self.pm, addr, room, dest_tp_ranks=[0], pp_rank=0)
        self.assertEqual(sender.poll(), KVPoll.Bootstrapping)
        receiver = ks.KVReceiver(dm, addr, room)
        deadline = time.monotonic() + XFER_TIMEOUT
        while not dm.try_ensure_parallel_info(addr):  # the decode scheduler retries this too
            self.assertLess(time.monotonic(), deadline, "prefill info never available")
            dm.wait_for_change(0.05)
        self.assertEqual(dm.prefill_info_table[addr].dp_size, 1)
        self.assertTrue(dm.prefill_info_table[addr].follow_bootstrap_room)
        receiver.init(0)
        poll_until(receiver, [KVPoll.WaitingForInput])
        return sender, receiver

    def send_pages(self, sender, receiver, src: Sequence[int], dst: Sequence[int]) -> None:
        """The call sequence of one request sent in one chunk, both ends to Success."""
        receiver.send_metadata(dst, 0, [])
        poll_until(sender, [KVPoll.WaitingForInput])
        sender.init(len(src), 0)
        sender.send(src)
        self.assertEqual(poll_until(sender, [KVPoll.Success]), KVPoll.Success)
        self.assertEqual(poll_until(receiver, [KVPoll.Success]), KVPoll.Success)

    def wait_decode0_regions(self) -> None:
        """Until decode0 holds only the regions of the shared decode worker
        (the daemon reclaims those of a closed client when it sees it go); bounded."""
        want = self.dm._kv.region_count + self.dm._aux.region_count
        deadline = time.monotonic() + XFER_TIMEOUT
        while (n := DAEMONS["decode0"].admin_call("status")["regions"]) != want:
            self.assertLess(time.monotonic(), deadline, f"decode0 holds {n} regions, the live workers {want}")
            self.dm.wait_for_change(0.05)


def run_cases(*cases: type) -> int:
    """Run the TestCase classes in this order (unittest would sort them); 0 pass, 1 fail, 77 skip."""
    tb.require_daemon_and_library()
    if not hasattr(random.Random, "randbytes"):
        tb.skip_all("Python >= 3.9 needed (random.randbytes)")
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for case in cases:
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1
