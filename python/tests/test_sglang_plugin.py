#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""How sglang loads kvproxy: the wheel's entry point and the plugin.

1. The in-tree build backend writes ``entry_points.txt`` with the
   ``sglang.srt.plugins`` entry point ``kvproxy`` into the wheel.
2. Against a stand-in of the parts of sglang the plugin touches (written for
   this test from the contract sglang's sources show: ``load_plugins()``
   over the entry-point group, a hook registry with REPLACE/AROUND hooks that
   rebinds ``from X import Y`` importers, ``DISAGG_TRANSFER_BACKEND_CHOICES``
   with its adder, ``TransferBackend``/``get_kv_class``, the base classes of
   ``base/conn.py``), with and without the hook registry: the choice exists,
   argparse takes it, ``TransferBackend("kvproxy")`` works in every module
   that imported the enum, ``get_kv_class`` answers kvproxy's classes and
   still sglang's for the others, and every call shape sglang's schedulers
   use binds to kvproxy's classes.
3. Against the real sglang, when it is importable (it cannot be installed on
   the development machines; the GPU machine may have it): the same checks,
   with sglang's own ``load_plugins()``; skipped with the reason otherwise.

Each case runs in a subprocess (plugins patch process-wide state).
Exit status: 0 pass, 1 fail, 77 skip (no case could run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYROOT = HERE.parent
sys.path.insert(0, str(PYROOT))

SKIP = 77

# ---- a stand-in of sglang's plugin surface (not sglang's code) ----

STUB = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/server_args.py": '''
        import argparse
        DISAGG_TRANSFER_BACKEND_CHOICES = ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]
        def add_disagg_transfer_backend_choices(choices):
            DISAGG_TRANSFER_BACKEND_CHOICES.extend(choices)
        class ServerArgs:
            def __init__(self, **kw):
                self.__dict__.update(kw)
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"])
                parser.add_argument("--disaggregation-transfer-backend", default="mooncake",
                                    choices=DISAGG_TRANSFER_BACKEND_CHOICES)
    ''',
    "sglang/srt/plugins/__init__.py": '''
        from importlib.metadata import entry_points
        _loaded = False
        def load_plugins():
            global _loaded
            if _loaded:
                return
            _loaded = True
            for ep in entry_points(group="sglang.srt.plugins"):
                ep.load()()
            try:
                from sglang.srt.plugins.hook_registry import HookRegistry
            except ImportError:
                return
            HookRegistry.apply_hooks()
    ''',
    "sglang/srt/plugins/hook_registry.py": '''
        import enum, functools, importlib, sys, types
        class HookType(enum.Enum):
            AROUND = "around"
            REPLACE = "replace"
        class HookRegistry:
            _hooks = []
            @classmethod
            def register(cls, target, hook, hook_type):
                cls._hooks.append((target, hook, hook_type))
            @classmethod
            def apply_hooks(cls):
                order = sorted(cls._hooks, key=lambda h: h[2] != HookType.REPLACE)
                for target, hook, kind in order:
                    modname, name = target.rsplit(".", 1)
                    mod = importlib.import_module(modname)
                    old = getattr(mod, name)
                    if kind == HookType.REPLACE:
                        new = hook
                    else:
                        def new(*a, _o=old, _h=hook, **k):
                            return _h(_o, *a, **k)
                    setattr(mod, name, new)
                    for m in list(sys.modules.values()):
                        if isinstance(m, types.ModuleType) and m is not mod:
                            for k, v in list(vars(m).items()):
                                if v is old:
                                    setattr(m, k, new)
                cls._hooks = []
    ''',
    "sglang/srt/disaggregation/__init__.py": "",
    "sglang/srt/disaggregation/utils.py": '''
        from enum import Enum
        class TransferBackend(Enum):
            MOONCAKE = "mooncake"
            MORI = "mori"
            NIXL = "nixl"
            ASCEND = "ascend"
            FAKE = "fake"
        class KVClassType(Enum):
            KVARGS = "kvargs"
            MANAGER = "manager"
            SENDER = "sender"
            RECEIVER = "receiver"
            BOOTSTRAP_SERVER = "bootstrap_server"
        def get_kv_class(transfer_backend, class_type):
            if transfer_backend == TransferBackend.MOONCAKE:
                return "mooncake-" + class_type.value
            raise ValueError(f"Unsupported transfer backend: {transfer_backend}")
    ''',
    "sglang/srt/disaggregation/base/__init__.py": '''
        from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll, BaseKVManager, BaseKVSender, BaseKVReceiver, BaseKVBootstrapServer
    ''',
    "sglang/srt/disaggregation/base/conn.py": '''
        # The signatures of base/conn.py @0094505d (what kvproxy must bind).
        from abc import ABC, abstractmethod
        class KVArgs:
            engine_rank: int
        class KVPoll:
            Failed, Bootstrapping, WaitingForInput, Transferring, Success = 0, 1, 2, 3, 4
        class BaseKVManager(ABC):
            @abstractmethod
            def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False): ...
            @abstractmethod
            def register_to_bootstrap(self): ...
        class BaseKVSender(ABC):
            @abstractmethod
            def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank,
                         req_has_disagg_prefill_dp_rank=False): ...
            @abstractmethod
            def init(self, num_kv_indices, aux_index=None): ...
            @abstractmethod
            def send(self, kv_indices, state_indices=None, token_position_offset=0): ...
            def pop_decode_prefix_len(self): return 0
            def should_send_kv_chunk(self, num_pages, last_chunk): return num_pages > 0
            @abstractmethod
            def get_transfer_metric(self): ...
            @abstractmethod
            def poll(self): ...
            @abstractmethod
            def failure_exception(self): ...
            def clear(self): pass
            def abort(self): pass
        class BaseKVReceiver(ABC):
            @abstractmethod
            def __init__(self, mgr, bootstrap_addr, bootstrap_room=None): ...
            @abstractmethod
            def init(self, prefill_dp_rank): ...
            @abstractmethod
            def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None): ...
            @abstractmethod
            def poll(self): ...
            @abstractmethod
            def failure_exception(self): ...
            def clear(self): pass
            def abort(self): pass
        class BaseKVBootstrapServer(ABC):
            @abstractmethod
            def __init__(self, host, port): ...
    ''',
    "sglang/srt/managers/__init__.py": "",
    # Newer sglang serves the bootstrap registry from a spawned child that
    # re-imports sglang and never loads plugins: the child resolves the
    # backend's class, checks the thread and /health, reports ready or the
    # error through a pipe, then joins the serving thread.
    "sglang/srt/managers/disagg_service.py": '''
        import multiprocessing as mp, urllib.request
        from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class
        def bootstrap_class(name):
            return get_kv_class(TransferBackend(name), KVClassType.BOOTSTRAP_SERVER)
        class Handle:
            def __init__(self, proc):
                self.proc = proc
            def close(self):
                self.proc.kill()
                self.proc.join()
        def _run_bootstrap_server_process(server_args, writer):
            try:
                cls = get_kv_class(TransferBackend(server_args.disaggregation_transfer_backend),
                                   KVClassType.BOOTSTRAP_SERVER)
                server = cls(host=server_args.host, port=server_args.disaggregation_bootstrap_port)
                if not server.thread.is_alive():
                    raise RuntimeError("the serving thread died")
                url = f"http://{server_args.host}:{server_args.disaggregation_bootstrap_port}/health"
                if urllib.request.urlopen(url, timeout=10).status != 200:
                    raise RuntimeError("no /health")
            except Exception as e:
                writer.send({"status": "error", "message": f"{type(e).__name__}: {e}"})
                raise SystemExit(1)
            writer.send({"status": "ready"})
            server.thread.join()
        def _start_bootstrap_server_subprocess(server_args):
            ctx = mp.get_context("spawn")
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_run_bootstrap_server_process, args=(server_args, writer), daemon=True)
            proc.start()
            writer.close()
            msg = reader.recv() if reader.poll(120) else None
            if not msg or msg.get("status") != "ready":
                proc.kill()
                raise RuntimeError(f"bootstrap server failed to start: {msg}")
            return Handle(proc)
        def start_disagg_service(server_args):
            if server_args.disaggregation_mode != "prefill":
                return None
            return _start_bootstrap_server_subprocess(server_args)
    ''',
}

# Runs in the subprocess: load the plugins as sglang does, check everything.
CHECK = '''
import argparse, inspect, json, sys
from sglang.srt.plugins import load_plugins
import sglang.srt.disaggregation.utils as utils
import sglang.srt.managers.disagg_service as ds  # imported the old names before the plugin ran
load_plugins()
import sglang.srt.server_args as sa
import sglang.srt.disaggregation.base.conn as base
import kvproxy.sglang as ks
out = {}
out["choice"] = "kvproxy" in sa.DISAGG_TRANSFER_BACKEND_CHOICES
if hasattr(sa, "ServerArgs") and hasattr(sa.ServerArgs, "add_cli_args"):
    p = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(p)
    try:
        ns, _ = p.parse_known_args(["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "kvproxy"])
        out["argparse"] = ns.disaggregation_transfer_backend
    except SystemExit:
        out["argparse"] = "refused"
tb = utils.TransferBackend("kvproxy")
out["enum"] = tb.name
out["enum_rebound"] = ds.TransferBackend is utils.TransferBackend
out["classes"] = {t.value: getattr(utils.get_kv_class(tb, t), "__name__", None) for t in utils.KVClassType}
out["via_importer"] = getattr(ds.get_kv_class(ds.TransferBackend("kvproxy"), ds.KVClassType.MANAGER), "__name__", None)
mooncake = utils.get_kv_class(utils.TransferBackend.MOONCAKE, utils.KVClassType.MANAGER)
out["mooncake"] = mooncake if isinstance(mooncake, str) else getattr(mooncake, "__name__", repr(mooncake))
out["isinstance"] = [issubclass(ks.KvproxyKVManager, base.BaseKVManager), issubclass(ks.KvproxyKVSender, base.BaseKVSender),
                     issubclass(ks.KvproxyKVReceiver, base.BaseKVReceiver),
                     issubclass(ks.KvproxyKVBootstrapServer, base.BaseKVBootstrapServer)]

# Every call shape: each base method's parameters, positionally and by
# keyword, and the shapes sglang's schedulers use (prefill.py, decode.py,
# disagg_service.py).
problems = []
def bind(fn, label, *args, **kw):
    try:
        inspect.signature(fn).bind(None, *args, **kw)
    except TypeError as e:
        problems.append(f"{label}: {e}")
for name, ours in (("BaseKVManager", ks.KvproxyKVManager), ("BaseKVSender", ks.KvproxyKVSender),
                   ("BaseKVReceiver", ks.KvproxyKVReceiver), ("BaseKVBootstrapServer", ks.KvproxyKVBootstrapServer)):
    cls = getattr(base, name)
    for meth, fn in vars(cls).items():
        if not callable(fn) or (meth.startswith("_") and meth != "__init__"):
            continue
        params = [p for p in list(inspect.signature(fn).parameters.values())[1:]
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        mine = getattr(ours, meth, None)
        if mine is None:
            problems.append(f"{ours.__name__}.{meth} is missing")
            continue
        bind(mine, f"{ours.__name__}.{meth} positional", *[object()] * len(params))
        bind(mine, f"{ours.__name__}.{meth} keywords", **{p.name: object() for p in params})
        required = [p for p in params if p.default is p.empty]
        bind(mine, f"{ours.__name__}.{meth} required only", *[object()] * len(required))
o = object()
shapes = [
    (ks.KvproxyKVManager.__init__, (o, o, o, o), {}),
    (ks.KvproxyKVSender.__init__, (), dict(mgr=o, bootstrap_addr=o, bootstrap_room=o, dest_tp_ranks=o, pp_rank=o)),
    (ks.KvproxyKVSender.__init__, (), dict(mgr=o, bootstrap_addr=o, bootstrap_room=o, dest_tp_ranks=o, pp_rank=o,
                                           req_has_disagg_prefill_dp_rank=o)),
    (ks.KvproxyKVSender.init, (o, o), {}),
    (ks.KvproxyKVSender.send, (o, o), {}),
    (ks.KvproxyKVSender.send, (o, o), dict(producer_event=o)),
    (ks.KvproxyKVSender.send, (o,), dict(state_indices=o, num_kv_tokens=o)),
    (ks.KvproxyKVSender.should_send_kv_chunk, (o, o), {}),
    (ks.KvproxyKVSender.pop_decode_prefix_len, (), {}),
    (ks.KvproxyKVSender.get_transfer_metric, (), {}),
    (ks.KvproxyKVReceiver.__init__, (), dict(mgr=o, bootstrap_addr=o, bootstrap_room=o)),
    (ks.KvproxyKVReceiver.init, (o,), {}),
    (ks.KvproxyKVReceiver.send_metadata, (o, o, o), dict(decode_prefix_len=o)),
    (ks.KvproxyKVReceiver.send_metadata, (o, o, o), dict(decode_prefix_len=o, spec_metadata=o)),
    (ks.KvproxyKVBootstrapServer.__init__, (), dict(host=o, port=o)),
    (ks.KvproxyKVManager.try_ensure_parallel_info, (o,), {}),
    (ks.KvproxyKVManager.submit_prefill_recompute, (o, o), {}),
    (ks.KvproxyKVManager.kv_transfer_protocol, (), {}),
    (ks.KvproxyKVManager.uses_terminal_source_publication, (), {}),
    (ks.KvproxyKVManager.register_buffer_to_engine, (), {}),
    (ks.KvproxyKVManager.deregister_buffer_to_engine, (), {}),
]
for fn, a, k in shapes:
    bind(fn, f"{fn.__qualname__}{a!r}{sorted(k)}", *a, **k)
out["problems"] = problems

# The bootstrap server, started as sglang's start_disagg_service() starts it
# (in a spawned child, where sglang has one): it answers /health, elsewhere.
import os, socket, urllib.request
if hasattr(ds, "start_disagg_service"):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    args = sa.ServerArgs(disaggregation_mode="prefill", disaggregation_transfer_backend="kvproxy", host="127.0.0.1",
                         disaggregation_bootstrap_port=port, node_rank=0)
    try:
        handle = ds.start_disagg_service(args)
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).status
        proc = getattr(handle, "proc", None)
        out["bootstrap"] = {"health": health, "child": proc is not None and proc.pid != os.getpid()}
        handle.close()
    except Exception as e:
        out["bootstrap"] = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps(out))
'''


def write_tree(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


def dist_info(root: Path) -> None:
    """A dist-info for kvproxy whose entry points are the wheel's: importlib.metadata finds the plugin."""
    sys.path.insert(0, str(PYROOT / "_build_backend"))
    import kvproxy_build

    info = root / "kvproxy-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvproxy\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(kvproxy_build._entry_points(kvproxy_build._project()))


def run_check(paths: list, env_extra: dict = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(PYROOT), env.get("PYTHONPATH", "")])
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"plugin check failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


WANT_CLASSES = {"kvargs": "KVArgs", "manager": "KvproxyKVManager", "sender": "KvproxyKVSender",
                "receiver": "KvproxyKVReceiver", "bootstrap_server": "KvproxyKVBootstrapServer"}


class WheelTest(unittest.TestCase):
    def test_entry_point_in_wheel(self) -> None:
        sys.path.insert(0, str(PYROOT / "_build_backend"))
        import kvproxy_build

        saved, kvproxy_build._st = kvproxy_build._st, None  # the standard-library path pip takes offline
        try:
            with tempfile.TemporaryDirectory() as d:
                for build in (kvproxy_build.build_wheel, kvproxy_build.build_editable):
                    name = build(d)
                    with zipfile.ZipFile(os.path.join(d, name)) as z:
                        eps = z.read("kvproxy-0.1.0.dist-info/entry_points.txt").decode()
                        record = z.read("kvproxy-0.1.0.dist-info/RECORD").decode()
                        self.assertIn("kvproxy-0.1.0.dist-info/entry_points.txt,sha256=", record)
                        if build is kvproxy_build.build_wheel:
                            self.assertIn("kvproxy/sglang/plugin.py", z.namelist())
                    self.assertEqual(eps.splitlines()[:2], ["[sglang.srt.plugins]",
                                                            "kvproxy = kvproxy.sglang.plugin:register"])
        finally:
            kvproxy_build._st = saved


class StandInTest(unittest.TestCase):
    """The plugin against the stand-in of sglang's plugin surface."""

    def check(self, with_registry: bool) -> None:
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            files = dict(STUB)
            if not with_registry:
                del files["sglang/srt/plugins/hook_registry.py"]
            write_tree(root, files)
            dist_info(root)
            out = run_check([root])
        self.assertTrue(out["choice"])
        self.assertEqual(out["argparse"], "kvproxy")
        self.assertEqual(out["enum"], "KVPROXY")
        self.assertTrue(out["enum_rebound"], "a module that imported TransferBackend kept the old enum")
        self.assertEqual(out["classes"], WANT_CLASSES)
        self.assertEqual(out["via_importer"], "KvproxyKVManager")
        self.assertEqual(out["mooncake"], "mooncake-manager", "get_kv_class no longer defers to sglang's chain")
        self.assertEqual(out["isinstance"], [True] * 4)
        self.assertEqual(out["problems"], [])
        self.assertEqual(out["bootstrap"], {"health": 200, "child": True},
                         "sglang's spawned bootstrap child cannot start kvproxy's server")

    def test_with_hook_registry(self) -> None:
        self.check(True)

    def test_without_hook_registry(self) -> None:
        self.check(False)


class RealSglangTest(unittest.TestCase):
    """The plugin against the real sglang (skipped where it is not importable)."""

    def test_real_sglang(self) -> None:
        probe = subprocess.run([sys.executable, "-c", "import sglang.srt.plugins, sglang.srt.disaggregation.utils"],
                               capture_output=True, text=True, timeout=300)
        if probe.returncode != 0:
            raise unittest.SkipTest("sglang is not importable here: "
                                    + (probe.stderr.strip().splitlines() or ["?"])[-1])
        with tempfile.TemporaryDirectory() as d:
            from importlib.metadata import entry_points

            if not any(e.name == "kvproxy" for e in entry_points(group="sglang.srt.plugins")):
                dist_info(Path(d))  # kvproxy is not pip-installed here: its entry points from the source tree
            out = run_check([d], {"SGLANG_PLUGINS": os.environ.get("SGLANG_PLUGINS", "kvproxy")})
        self.assertTrue(out["choice"])
        if "argparse" in out:
            self.assertEqual(out["argparse"], "kvproxy")
        self.assertEqual(out["enum"], "KVPROXY")
        self.assertTrue(out["enum_rebound"])
        self.assertEqual({k: v for k, v in out["classes"].items() if k != "kvargs"},
                         {k: v for k, v in WANT_CLASSES.items() if k != "kvargs"})
        self.assertEqual(out["via_importer"], "KvproxyKVManager")
        self.assertEqual(out["isinstance"], [True] * 4)
        self.assertEqual(out["problems"], [])


def main() -> int:
    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    for case in (WheelTest, StandInTest, RealSglangTest):
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    if not result.wasSuccessful():
        return 1
    return SKIP if result.testsRun and len(result.skipped) == result.testsRun else 0


if __name__ == "__main__":
    sys.exit(main())
