#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Daemon helpers of the Python tests: start kvproxyd on 127.0.0.1 and wait for it.

A test script imports this module (``import daemon_harness as tb``) to start
kvproxyd (free ports, sockets in a temp dir, no namespaces and no root
needed), wait by bounded polling until each client socket accepts a
connection and each admin socket reports its peer "up", and stop the daemons
it started, checking they exit cleanly. ``setup_pair``/``teardown_started``
and ``PairTestCase`` are the fixture of the binding tests (test_binding_*.py):
a prefill0/decode0 pair shared by the cases of one script, with a client and
a registered buffer on each side.

Environment:
    KVPROXYD      path of the kvproxyd binary (meson sets it); unset: exit 77
    KVPROXY_LIB   path of libkvproxy.so (meson sets it; else the usual search)
    KVP_KEEP=1    keep the temp dir (configs, daemon logs)
    KVP_WORKERS   worker lcores per daemon (default 1)

Exit status of the test scripts: 0 pass, 1 fail, 77 skip (with the reason on
stderr).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Callable, Dict, List, Optional

SKIP = 77
HERE = Path(__file__).resolve().parent
# Run from the source tree without PYTHONPATH too.
sys.path.insert(0, str(HERE.parent))

import kvproxy  # noqa: E402
from kvproxy import Completion  # noqa: E402

START_TIMEOUT = 60.0  # daemon start-up and peer link up
XFER_TIMEOUT = 30.0  # one transfer's completions
POLL = 0.05  # interval of the bounded polling loops
# KVP_WORKERS=N: N worker lcores per daemon, free to run on any CPU here (as tests/integ/lib.sh).
WORKERS = int(os.environ.get("KVP_WORKERS", "1") or "1")
if WORKERS > 1:
    _cpus = f"(0-{(os.cpu_count() or 1) - 1})"
    EAL = ["--lcores", ",".join(f"{i}@{_cpus}" for i in range(WORKERS + 1))]
else:
    EAL = ["-l", "0,1"]
EAL += ["--no-huge", "--no-shconf", "-m", "256", "--log-level=lib.eal:error"]
# e.g. "-d /path/librte_mempool_ring.so.23" where DPDK's plugin directory is absent
EAL += os.environ.get("KVP_EAL_EXTRA", "").split()
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
# log()'s tag: the script that runs (this module is imported by many).
_SCRIPT = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "daemon_harness"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} {_SCRIPT}] {msg}", file=sys.stderr, flush=True)


def skip_all(reason: str) -> None:
    log(f"SKIP: {reason}")
    sys.exit(SKIP)


# Set when this script re-executed itself to preload the ASan runtime: the
# caller's values of the variables it changed (JSON; null = was unset).
ASAN_SAVED = "KVP_PY_ASAN_SAVED"


def asan_reexec() -> None:
    """Re-execute under LD_PRELOAD=libasan if libkvproxy is an ASan build.

    A sanitizer build's libkvproxy.so cannot be dlopen()ed by an
    uninstrumented python3 ("ASan runtime does not come first"), so preload
    the runtime it names; leak checks are off for python3 itself (its own
    allocations at exit are not ours) and UBSan reports are fatal; the
    daemons get the caller's environment back (see daemon_env).
    """
    lib = os.environ.get("KVPROXY_LIB")
    if not lib or not os.path.isfile(lib):
        return
    with open(lib, "rb") as f:
        m = re.search(rb"libasan\.so(?:\.[0-9]+)*", f.read())
    if not m:
        return
    with open("/proc/self/maps") as f:
        if "libasan" in f.read():
            return  # already preloaded
    if ASAN_SAVED in os.environ:
        skip_all(f"{lib} is an ASan build and preloading {m.group().decode()} did not work")
    env = dict(os.environ)
    env[ASAN_SAVED] = json.dumps({k: os.environ.get(k) for k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")})
    env["LD_PRELOAD"] = " ".join(filter(None, [m.group().decode(), os.environ.get("LD_PRELOAD")]))
    env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    # A UBSan report from libkvproxy fails the run instead of scrolling by.
    env["UBSAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("UBSAN_OPTIONS"), "halt_on_error=1:print_stacktrace=1"]))
    log(f"{lib} is an ASan build: re-running with LD_PRELOAD={env['LD_PRELOAD']}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def daemon_env() -> Dict[str, str]:
    """The environment for kvproxyd: the caller's, without asan_reexec()'s changes."""
    env = dict(os.environ)
    saved = env.pop(ASAN_SAVED, None)
    if saved is not None:
        for k, v in json.loads(saved).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
    return env


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when this test process dies, however it
    dies (e.g. killed by meson's timeout), so no kvproxyd outlives it."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def free_ports(n: int) -> List[int]:
    """n distinct free TCP ports on 127.0.0.1 (bound to port 0, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Daemon:
    """One kvproxyd this test started, with its config, sockets and log."""

    def __init__(self, tmp: Path, node_id: str, port: int, peer_id: Optional[str], peer_port: int, extra: str = "",
                 timeouts: str = "") -> None:
        """A node whose one configured peer is @p peer_id on 127.0.0.1:@p peer_port (None: no peers)."""
        self.node_id = node_id
        self.port = port
        self.sock = str(tmp / f"{node_id}.sock")
        self.admin = str(tmp / f"{node_id}.admin")
        self.conf = tmp / f"{node_id}.conf"
        self.logfile = tmp / f"{node_id}.log"
        self.peer_id = peer_id
        self.conf.write_text(
            f"""# generated by daemon_harness.py
node_id = "{node_id}";
client_socket = "{self.sock}";
admin_socket = "{self.admin}";
listen = "127.0.0.1:{port}";
transport = "tcp";
log_level = "info";
timeouts = {{
	{"" if "peer_ms" in timeouts else "peer_ms = 1000;"}
	reconnect_ms = 100;
	{timeouts}
}};
{extra}
peers = ( {f'{{ node_id = "{peer_id}"; addr = "127.0.0.1:{peer_port}"; }}' if peer_id else ""} );
"""
        )
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        with open(self.logfile, "wb") as out:
            self.proc = subprocess.Popen(
                [os.environ["KVPROXYD"], *EAL, "--", "-c", str(self.conf)],
                stdin=subprocess.DEVNULL,
                env=daemon_env(),
                preexec_fn=die_with_parent,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        log(f"started kvproxyd {self.node_id} (pid {self.proc.pid})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.logfile.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def admin_call(self, method: str, timeout: float = 2.0, params: Optional[Dict] = None) -> Dict:
        """One JSON-RPC call on the admin socket; returns its result."""
        req: Dict = {"jsonrpc": "2.0", "id": 1, "method": method}
        if params is not None:
            req["params"] = params
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(self.admin)
            s.sendall(json.dumps(req).encode() + b"\n")
            buf = b""
            while b"\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("admin socket closed without a reply")
                buf += chunk
        reply = json.loads(buf.split(b"\n", 1)[0])
        if "result" not in reply:
            raise RuntimeError(f"admin {method}: {reply.get('error')}")
        return reply["result"]

    def client_socket_ready(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2.0)
                s.connect(self.sock)
            return True
        except OSError:
            return False

    def peer_state(self) -> str:
        try:
            peers = self.admin_call("peers")["peers"]
        except (OSError, ValueError, RuntimeError, KeyError):
            return "no answer"
        for p in peers:
            if p.get("node_id") == self.peer_id:
                return str(p.get("state", "?"))
        return "absent"

    def clients(self) -> int:
        try:
            return int(self.admin_call("status")["clients"])
        except (OSError, ValueError, RuntimeError, KeyError, TypeError):
            return -1

    def wait_ready(self, need_peer: bool = True, timeout: float = START_TIMEOUT) -> None:
        """Until the client socket accepts, the daemon has let go of that probe
        connection again (status: 0 clients), and (need_peer) the peer link is
        up; bounded."""
        deadline = time.monotonic() + timeout
        state = "not checked"
        sock_ok = False
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"kvproxyd {self.node_id} exited with {self.proc.returncode} during start-up:\n{self.log_tail()}"
                )
            sock_ok = sock_ok or self.client_socket_ready()
            if sock_ok and self.clients() == 0:
                state = self.peer_state() if need_peer else "up"
                if state == "up":
                    log(f"{self.node_id}: client socket ready" + (f", peer {self.peer_id} up" if need_peer else ""))
                    return
            time.sleep(POLL)
        raise RuntimeError(
            f"kvproxyd {self.node_id} not ready within {timeout}s (peer {self.peer_id}: {state}):\n{self.log_tail()}"
        )

    def kill(self) -> None:
        """SIGKILL and reap (daemon death)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> Optional[str]:
        """SIGTERM, bounded wait, SIGKILL if needed. Returns a problem, or None if it stopped cleanly."""
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            return f"kvproxyd {self.node_id} had already exited with {self.proc.returncode}"
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            return f"kvproxyd {self.node_id} did not stop within {timeout}s of SIGTERM"
        if rc != 0:
            return f"kvproxyd {self.node_id} exited with {rc} after SIGTERM"
        text = self.logfile.read_text(errors="replace")
        if any(m in text for m in SANITIZER_MARKS):
            return f"kvproxyd {self.node_id}: sanitizer report in its log"
        return None


# Module state of the script that runs: its temp dir, the shared pair of
# setup_pair(), and every daemon started (stopped by teardown_started()).
TMP: Optional[Path] = None
PREFILL: Optional[Daemon] = None
DECODE: Optional[Daemon] = None
STARTED: List[Daemon] = []


def start_pair(tmp: Path, a: str, b: str, extra: str = "", timeouts: str = "",
               extra_b: Optional[str] = None) -> tuple:
    """Daemons a and b, each the other's peer; b's extra configuration is
    @p extra_b where given."""
    pa, pb = free_ports(2)
    da = Daemon(tmp, a, pa, b, pb, extra, timeouts)
    db = Daemon(tmp, b, pb, a, pa, extra if extra_b is None else extra_b, timeouts)
    for d in (da, db):
        STARTED.append(d)
        d.start()
    da.wait_ready()
    db.wait_ready()
    return da, db


def start_trio(tmp: Path) -> Dict[str, "Daemon"]:
    """prefill0 and decode0, peers of each other, and decode1, which lists
    prefill0 as its peer while prefill0 does not know it; by node id."""
    p, d = start_pair(tmp, "prefill0", "decode0")
    stray = Daemon(tmp, "decode1", free_ports(1)[0], "prefill0", p.port)
    STARTED.append(stray)
    stray.start()
    stray.wait_ready(need_peer=False)
    return {"prefill0": p, "decode0": d, "decode1": stray}


def setup_pair() -> None:
    """setUpModule of the binding tests: a temp dir and the prefill0/decode0 pair."""
    global TMP, PREFILL, DECODE
    TMP = Path(tempfile.mkdtemp(prefix="kvp-python."))
    log(f"temp dir {TMP}; libkvproxy {os.environ.get('KVPROXY_LIB', '(search)')}")
    PREFILL, DECODE = start_pair(TMP, "prefill0", "decode0")


def teardown_started() -> None:
    """tearDownModule of the binding tests: stop every daemon started, each
    cleanly but doomed0 (killed on purpose); keep the temp dir on a problem."""
    problems = []
    for d in reversed(STARTED):
        p = d.stop()
        if p and d.node_id != "doomed0":  # doomed0 is killed on purpose
            problems.append(p + "\n" + d.log_tail())
    finish(TMP, problems)


def finish(tmp: Optional[Path], problems: List[str]) -> None:
    """Remove @p tmp unless there are @p problems or KVP_KEEP is set; then fail with the problems."""
    if tmp is not None:
        if problems or os.environ.get("KVP_KEEP"):
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if problems:
        raise AssertionError("\n".join(problems))


def stop_and_clean(tmp: Path, daemons) -> None:
    """tearDownClass of a case's own daemons: stop each (in the order given), then finish()."""
    finish(tmp, [p for p in (d.stop() for d in daemons) if p])


_next_id = [1000]


def new_id() -> int:
    """A user_id no other case of this run uses."""
    _next_id[0] += 1
    return _next_id[0]


def wait_for(client: kvproxy.Client, pred: Callable[[Completion], bool], timeout: float = XFER_TIMEOUT) -> Completion:
    """The first completion on client matching pred (others are dropped), bounded."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no matching completion within {timeout}s; saw {seen}")
        for c in client.wait(timeout=left):
            if pred(c):
                return c
            seen.append(c)


def done_of(uid: int) -> Callable[[Completion], bool]:
    return lambda c: c.kind == "done" and c.user_id == uid


def landed_of(uid: int) -> Callable[[Completion], bool]:
    return lambda c: c.kind == "landed" and c.user_id == uid


class PairTestCase(unittest.TestCase):
    """Cases against the shared prefill0/decode0 pair of setup_pair(): a client
    on each side, a registered SIZE-byte buffer on each, decode0's peer index."""

    SIZE = 4 << 20

    @classmethod
    def setUpClass(cls) -> None:
        cls.p = kvproxy.Client(PREFILL.sock)
        cls.d = kvproxy.Client(DECODE.sock)
        cls.src_buf = kvproxy.HostBuffer(cls.SIZE)
        cls.dst_buf = kvproxy.HostBuffer(cls.SIZE)
        cls.src = cls.p.register(cls.src_buf)
        cls.dst = cls.d.register(cls.dst_buf)
        cls.peer = cls.p.peer("decode0")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.src.deregister()
        cls.dst.deregister()
        cls.p.close()
        cls.d.close()
        cls.src_buf.close()
        cls.dst_buf.close()

    def run_xfer(self, segs, uid: Optional[int] = None, **kw) -> Completion:
        uid = new_id() if uid is None else uid
        self.p.submit(self.peer, segs, uid, **kw)
        return wait_for(self.p, done_of(uid))


def require_daemon_and_library() -> None:
    """Skip (77) unless $KVPROXYD is an executable and libkvproxy loads (under ASan where it is an ASan build)."""
    if not os.environ.get("KVPROXYD"):
        skip_all("$KVPROXYD is not set (meson sets it from kvproxyd_exe; run through 'meson test', "
                 "or point it into a tools/bundle.sh bundle)")
    if not os.access(os.environ["KVPROXYD"], os.X_OK):
        skip_all(f"$KVPROXYD={os.environ['KVPROXYD']} is not an executable")
    asan_reexec()
    try:
        kvproxy.HostBuffer(4096).close()
    except kvproxy.LibraryNotFoundError as e:
        skip_all(str(e))


def run_cases(*cases: type) -> int:
    """Run the TestCase classes in this order (unittest would sort them); 0 pass, 1 fail."""
    require_daemon_and_library()
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for case in cases:
        suite.addTests(loader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1
