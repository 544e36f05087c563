#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Tests of the kvproxy Python binding against a live pair of kvproxyd.

The script starts two kvproxyd on 127.0.0.1 (free ports, sockets in a temp
dir, no namespaces and no root needed): prefill0 and decode0, peers of each
other. It waits, by bounded polling, until each client socket accepts a
connection and each admin socket reports the other node "up", runs the
cases, and stops the daemons it started (checking they exit cleanly).

Environment:
    KVPROXYD      path of the kvproxyd binary (meson sets it); unset: exit 77
    KVPROXY_LIB   path of libkvproxy.so (meson sets it; else the usual search)
    KVP_KEEP=1    keep the temp dir (configs, daemon logs)

Exit status: 0 pass, 1 fail, 77 skip (with the reason on stderr).
"""

from __future__ import annotations

import errno
import json
import os
import random
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
from kvproxy import Completion, Segment  # noqa: E402

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


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} test_binding] {msg}", file=sys.stderr, flush=True)


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

    def __init__(self, tmp: Path, node_id: str, port: int, peer_id: str, peer_port: int, extra: str = "",
                 timeouts: str = "") -> None:
        self.node_id = node_id
        self.port = port
        self.sock = str(tmp / f"{node_id}.sock")
        self.admin = str(tmp / f"{node_id}.admin")
        self.conf = tmp / f"{node_id}.conf"
        self.logfile = tmp / f"{node_id}.log"
        self.peer_id = peer_id
        self.conf.write_text(
            f"""# generated by test_binding.py
node_id = "{node_id}";
client_socket = "{self.sock}";
admin_socket = "{self.admin}";
listen = "127.0.0.1:{port}";
transport = "tcp";
log_level = "info";
timeouts = {{
	peer_ms = 1000;
	reconnect_ms = 100;
	{timeouts}
}};
{extra}
peers = (
	{{ node_id = "{peer_id}"; addr = "127.0.0.1:{peer_port}"; }}
);
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


TMP: Optional[Path] = None
PREFILL: Optional[Daemon] = None
DECODE: Optional[Daemon] = None
STARTED: List[Daemon] = []


def start_pair(tmp: Path, a: str, b: str, extra: str = "", timeouts: str = "") -> tuple:
    pa, pb = free_ports(2)
    da = Daemon(tmp, a, pa, b, pb, extra, timeouts)
    db = Daemon(tmp, b, pb, a, pa, extra, timeouts)
    for d in (da, db):
        STARTED.append(d)
        d.start()
    da.wait_ready()
    db.wait_ready()
    return da, db


def setUpModule() -> None:
    global TMP, PREFILL, DECODE
    TMP = Path(tempfile.mkdtemp(prefix="kvp-python."))
    log(f"temp dir {TMP}; libkvproxy {os.environ.get('KVPROXY_LIB', '(search)')}")
    PREFILL, DECODE = start_pair(TMP, "prefill0", "decode0")


def tearDownModule() -> None:
    problems = []
    for d in reversed(STARTED):
        p = d.stop()
        if p and d.node_id != "doomed0":  # doomed0 is killed on purpose
            problems.append(p + "\n" + d.log_tail())
    if TMP is not None:
        if problems or os.environ.get("KVP_KEEP"):
            log(f"kept {TMP}")
        else:
            shutil.rmtree(TMP, ignore_errors=True)
    if problems:
        raise AssertionError("\n".join(problems))


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


class BindingTest(unittest.TestCase):
    """Everything but daemon death, against the shared prefill0/decode0 pair."""

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

    # ---- basics ----

    def test_client_info(self) -> None:
        self.assertEqual(self.p.node_id, "prefill0")
        self.assertEqual(self.d.node_id, "decode0")
        self.assertGreater(self.p.max_segments, 0)
        self.assertLessEqual(self.p.max_segments, 4096)
        self.assertIn("prefill0", repr(self.p))
        self.assertEqual(self.p.overflow, 0)
        self.assertIsInstance(self.p.peer("decode0"), int)
        self.assertIsInstance(self.d.peer("prefill0"), int)

    def test_host_buffer(self) -> None:
        with kvproxy.HostBuffer(12345) as b:
            self.assertEqual(len(b), 12345)
            self.assertEqual(b.size, 12345)
            self.assertGreaterEqual(b.fd, 0)
            self.assertEqual(bytes(b[:16]), bytes(16))  # starts zeroed
            mv = memoryview(b)
            self.assertFalse(mv.readonly)
            self.assertEqual(mv.format, "B")
            mv[100:104] = b"abcd"
            self.assertEqual(b[100:104], b"abcd")
            with self.assertRaises(BufferError):
                b.close()  # a live view: refused, not freed under it
            mv.release()
            fd = b.fd
        self.assertTrue(b.closed)
        with self.assertRaises(OSError):
            os.fstat(fd)  # the memfd was closed
        b.close()  # idempotent
        with self.assertRaises(kvproxy.InvalidArgument):
            kvproxy.HostBuffer(0)

    # ---- transfers ----

    def test_host_transfer_verified(self) -> None:
        n = 3 << 20
        data = os.urandom(n)
        self.src_buf[:n] = data
        uid = new_id()
        self.p.submit("decode0", [Segment(self.src.key, 0, self.dst.key, 0, n)], uid, timeout=XFER_TIMEOUT)
        done = wait_for(self.p, done_of(uid))
        landed = wait_for(self.d, landed_of(uid))

        self.assertEqual(done.kind, "done")
        self.assertTrue(done.ok, done)
        self.assertEqual(done.status, 0)
        self.assertEqual(done.status, kvproxy.Status.OK)
        self.assertEqual(done.status_name, "ok")
        self.assertEqual(done.bytes, n)
        self.assertEqual(done.nseg, 1)
        self.assertEqual(done.peer, self.peer)
        done.raise_for_status()

        self.assertEqual(landed.kind, "landed")
        self.assertTrue(landed.ok, landed)
        self.assertEqual(landed.bytes, n)
        self.assertEqual(landed.nseg, 1)
        self.assertEqual(landed.dst_key, self.dst.key)
        self.assertEqual(landed.peer, self.d.peer("prefill0"))

        self.assertEqual(set(done.phases),
                         {"queue", "admit", "post", "wire", "total", "first", "deliver", "e2e"})
        for name, v in done.phases.items():
            self.assertGreaterEqual(v, 0.0, name)
            self.assertLess(v, XFER_TIMEOUT, f"{name} = {v}s: an unsigned underflow?")
        # queue is submit -> pickup and lies before total (pickup -> completion).
        for name in ("admit", "post", "wire", "first", "deliver"):
            self.assertGreaterEqual(done.phases["total"], done.phases[name], name)
        self.assertGreater(done.phases["total"], 0.0)
        parts = sum(done.phases[k] for k in ("queue", "admit", "post", "wire", "deliver"))
        self.assertAlmostEqual(parts, done.phases["e2e"], delta=1e-6)

        got = bytes(self.dst_buf[:n])
        if got != data:
            first = next(i for i in range(n) if got[i] != data[i])
            self.fail(f"landed data differs from the source, first at offset {first}")

    def test_multiple_segments_offsets(self) -> None:
        rnd = random.Random(1234)
        data = os.urandom(self.SIZE)
        self.src_buf[:] = data
        self.dst_buf[:] = b"\xee" * self.SIZE
        # Unaligned lengths, shuffled destinations with gaps between them.
        lens = [1, 63, 4096, 4097, 65536 + 17, 300000, 1 << 20]
        src_offs, off = [], 7
        for ln in lens:
            src_offs.append(off)
            off += ln + 13
        order = list(range(len(lens)))
        rnd.shuffle(order)
        dst_offs = [0] * len(lens)
        off = 5
        for i in order:
            dst_offs[i] = off
            off += lens[i] + 101
        self.assertLessEqual(off, self.SIZE)
        segs = [
            Segment(self.src.key, s, self.dst.key, d, ln) if i % 2 else (self.src.key, s, self.dst.key, d, ln)
            for i, (s, d, ln) in enumerate(zip(src_offs, dst_offs, lens))
        ]
        uid = new_id()
        done = self.run_xfer(segs, uid)
        self.assertTrue(done.ok, done)
        self.assertEqual(done.nseg, len(segs))
        self.assertEqual(done.bytes, sum(lens))
        landed = wait_for(self.d, landed_of(uid))
        self.assertEqual(landed.bytes, sum(lens))
        self.assertEqual(landed.nseg, len(segs))

        got = bytes(self.dst_buf)
        expect = bytearray(b"\xee" * self.SIZE)
        for s, d, ln in zip(src_offs, dst_offs, lens):
            expect[d : d + ln] = data[s : s + ln]
        if got != bytes(expect):
            first = next(i for i in range(self.SIZE) if got[i] != expect[i])
            self.fail(f"destination differs from the expected layout, first at offset {first}")

    def test_several_transfers_in_flight(self) -> None:
        chunk = 256 << 10
        data = os.urandom(16 * chunk)
        self.src_buf[: len(data)] = data
        uids = []
        for i in range(16):
            uid = new_id()
            seg = (self.src.key, i * chunk, self.dst.key, (15 - i) * chunk, chunk)
            while True:
                try:
                    self.p.submit(self.peer, [seg], uid)
                    break
                except kvproxy.RingFull:
                    self.p.wait(timeout=1)  # reap something, retry
            uids.append(uid)
        pending = set(uids)
        deadline = time.monotonic() + XFER_TIMEOUT
        while pending and time.monotonic() < deadline:
            for c in self.p.wait(timeout=max(0.0, deadline - time.monotonic())):
                if c.kind == "done" and c.user_id in pending:
                    self.assertTrue(c.ok, c)
                    pending.discard(c.user_id)
        self.assertFalse(pending, "transfers without a done completion")
        for i in range(16):
            d = (15 - i) * chunk
            self.assertEqual(bytes(self.dst_buf[d : d + chunk]), data[i * chunk : (i + 1) * chunk], f"chunk {i}")

    # ---- error paths: completions ----

    def test_unknown_dst_key_is_remote(self) -> None:
        bad = self.dst.key ^ 0x5A5A5A5A00000000
        done = self.run_xfer([(self.src.key, 0, bad, 0, 4096)])
        self.assertFalse(done.ok)
        self.assertEqual(done.status, kvproxy.Status.REMOTE)
        self.assertEqual(done.status_name, "remote")
        with self.assertRaises(kvproxy.TransferError) as cm:
            done.raise_for_status()
        self.assertEqual(cm.exception.status_name, "remote")
        self.assertEqual(cm.exception.errno, errno.EREMOTEIO)

    def test_bad_src_key_is_invalid(self) -> None:
        done = self.run_xfer([(self.src.key ^ 0x5A5A5A5A00000000, 0, self.dst.key, 0, 4096)])
        self.assertEqual(done.status_name, "invalid")
        self.assertEqual(done.status, kvproxy.Status.INVALID)
        self.assertEqual(done.bytes, 0)

    def test_src_out_of_bounds_is_invalid(self) -> None:
        done = self.run_xfer([(self.src.key, self.SIZE - 64, self.dst.key, 0, 4096)])
        self.assertEqual(done.status_name, "invalid")

    def test_zero_length_segment_is_invalid(self) -> None:
        done = self.run_xfer([(self.src.key, 0, self.dst.key, 0, 0)])
        self.assertEqual(done.status_name, "invalid")

    def test_unconfigured_peer_index(self) -> None:
        uid = new_id()
        self.p.submit(999, [(self.src.key, 0, self.dst.key, 0, 4096)], uid)
        done = wait_for(self.p, done_of(uid))
        self.assertEqual(done.status_name, "no-peer")

    def test_good_transfer_after_errors(self) -> None:
        self.run_xfer([(self.src.key, 0, 0x1234, 0, 4096)])  # whatever it ends with
        self.src_buf[:4096] = b"\x42" * 4096
        done = self.run_xfer([(self.src.key, 0, self.dst.key, 8192, 4096)])
        self.assertTrue(done.ok, done)
        self.assertEqual(bytes(self.dst_buf[8192 : 8192 + 4096]), b"\x42" * 4096)

    # ---- error paths: exceptions ----

    def test_unknown_peer_name(self) -> None:
        with self.assertRaises(kvproxy.PeerNotFound) as cm:
            self.p.peer("nosuchnode")
        e = cm.exception
        self.assertIsInstance(e, kvproxy.KvproxyError)
        self.assertIsInstance(e, OSError)
        self.assertEqual(e.errno, errno.ENOENT)
        self.assertIn("not a configured peer", e.reason)
        self.assertIn("nosuchnode", str(e))
        with self.assertRaises(kvproxy.PeerNotFound):
            self.p.submit("nosuchnode", [(self.src.key, 0, self.dst.key, 0, 1)], new_id())
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.peer("x" * 40)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.peer("")

    def test_too_many_segments(self) -> None:
        n = self.p.max_segments + 1
        segs = [(self.src.key, i, self.dst.key, i, 1) for i in range(n)]
        with self.assertRaises(kvproxy.InvalidArgument) as cm:
            self.p.submit(self.peer, segs, new_id())
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertIn(str(self.p.max_segments), str(cm.exception))
        self.assertIsInstance(cm.exception, ValueError)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(self.peer, [], new_id())
        # The largest allowed transfer goes through.
        done = self.run_xfer(segs[:-1])
        self.assertTrue(done.ok, done)
        self.assertEqual(done.nseg, n - 1)

    def test_bad_argument_values(self) -> None:
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(self.peer, [(self.src.key, -1, self.dst.key, 0, 1)], new_id())
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(self.peer, [(self.src.key, 0, self.dst.key, 0, 1)], 1 << 64)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(self.peer, [(self.src.key, 0, self.dst.key, 0, 1)], new_id(), timeout=-1)
        with self.assertRaises(TypeError):
            self.p.submit(self.peer, [(self.src.key, 0, self.dst.key)], new_id())
        with self.assertRaises(TypeError):
            self.p.submit(self.peer, [(self.src.key, 0, self.dst.key, 0, "1")], new_id())
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.submit(70000, [(self.src.key, 0, self.dst.key, 0, 1)], new_id())
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.poll(max=0)
        with self.assertRaises(kvproxy.InvalidArgument):
            self.p.wait(timeout=-1)

    def test_deregister_twice(self) -> None:
        with kvproxy.HostBuffer(65536) as b:
            r = self.p.register(b)
            self.assertTrue(r.registered)
            self.assertEqual(r.length, 65536)
            self.assertIs(r.buffer, b)
            r.deregister()
            self.assertFalse(r.registered)
            with self.assertRaises(kvproxy.RegionError) as cm:
                r.deregister()
        e = cm.exception
        self.assertEqual(e.errno, errno.ENOENT)
        self.assertIn("no region", e.reason)  # the daemon's words
        self.assertIn(f"{r.key:016x}", e.reason)
        self.assertIn(e.reason, str(e))

    def test_region_context_manager(self) -> None:
        with kvproxy.HostBuffer(8192) as b:
            with self.p.register(b, offset=4096) as r:
                self.assertEqual(r.length, 4096)
                self.assertEqual(r.offset, 4096)
                self.assertIn(f"{r.key:#018x}", repr(r))
            self.assertFalse(r.registered)
            with self.assertRaises(kvproxy.RegionError):
                self.p.deregister(r.key)  # already gone in the daemon

    def test_register_beyond_buffer(self) -> None:
        with kvproxy.HostBuffer(65536) as b:
            with self.assertRaises(kvproxy.RegionError) as cm:
                self.p.register(b, 0, 65536 + 4096)
            e = cm.exception
            self.assertEqual(e.errno, errno.EINVAL)
            self.assertIn("beyond the end", e.reason)
            with self.assertRaises(kvproxy.RegionError):
                self.p.register(b, 61440, 8192)
            with self.assertRaises(kvproxy.InvalidArgument):
                self.p.register(b, 65536)  # offset at the end, length to the end = 0
            with self.assertRaises(kvproxy.RegionError):
                self.p.register(b, 0, 0)  # refused by the library, with its reason
            # A raw fd works as well as a HostBuffer.
            r = self.p.register(b.fd, 0, 4096)
            self.assertIsNone(r.buffer)
            r.deregister()

    def test_connect_missing_socket(self) -> None:
        path = str(TMP / "nobody.sock")
        with self.assertRaises(kvproxy.ConnectError) as cm:
            kvproxy.Client(path)
        self.assertIn(cm.exception.errno, (errno.ENOENT, errno.ECONNREFUSED))
        self.assertEqual(cm.exception.filename, path)
        # A socket file nobody listens on.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            dead = str(TMP / "dead.sock")
            s.bind(dead)
        with self.assertRaises(kvproxy.ConnectError) as cm:
            kvproxy.Client(dead)
        self.assertIn(cm.exception.errno, (errno.ENOENT, errno.ECONNREFUSED))
        with self.assertRaises(kvproxy.InvalidArgument):
            kvproxy.Client(PREFILL.sock, sq_entries=3)

    def test_small_rings(self) -> None:
        with kvproxy.Client(PREFILL.sock, sq_entries=8, cq_entries=8) as c:
            self.assertEqual(c.max_segments, 7)  # header + segments fit the SQ
            with kvproxy.HostBuffer(4096) as b, c.register(b) as r:
                uid = new_id()
                c.submit("decode0", [(r.key, 0, self.dst.key, 0, 64)] * 7, uid)
                done = wait_for(c, done_of(uid))
                self.assertTrue(done.ok, done)

    def test_cancel_unknown_id_is_harmless(self) -> None:
        self.p.cancel(987654321)
        self.p.cancel(0)
        self.src_buf[:1024] = b"\x17" * 1024
        done = self.run_xfer([(self.src.key, 0, self.dst.key, 0, 1024)])
        self.assertTrue(done.ok, done)
        self.assertEqual(bytes(self.dst_buf[:1024]), b"\x17" * 1024)

    def test_wait_timeout_and_poll_empty(self) -> None:
        with kvproxy.Client(PREFILL.sock) as c:
            self.assertEqual(c.poll(), [])
            t0 = time.monotonic()
            self.assertEqual(c.wait(timeout=0.3), [])
            self.assertGreaterEqual(time.monotonic() - t0, 0.29)
            self.assertEqual(c.wait(timeout=0), [])

    def test_threads(self) -> None:
        """A completion thread and a control thread at once; close() from another thread."""
        import threading

        with kvproxy.Client(PREFILL.sock) as c, kvproxy.HostBuffer(4096) as b:
            errors: List[BaseException] = []
            stop = time.monotonic() + 1.0

            def reaper() -> None:
                try:
                    while time.monotonic() < stop:
                        c.wait(timeout=0.002)
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            t = threading.Thread(target=reaper)
            t.start()
            calls = 0
            while time.monotonic() < stop:
                c.peer("decode0")
                with c.register(b):
                    pass
                calls += 1
            t.join(10)
            self.assertFalse(t.is_alive())
            self.assertEqual(errors, [], f"wait() failed while control calls ran ({calls} rounds)")

        c = kvproxy.Client(PREFILL.sock)
        out: List[object] = []

        def blocked() -> None:
            try:
                out.append(c.wait())  # no timeout: only close() ends it
            except kvproxy.KvproxyError as e:
                out.append(e)

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.1)  # let it block (not a synchronisation: close() works either way)
        c.close()
        t.join(10)
        self.assertFalse(t.is_alive(), "wait() still blocked after close()")
        self.assertEqual(len(out), 1)
        self.assertIsInstance(out[0], kvproxy.KvproxyError)
        self.assertEqual(out[0].errno, errno.EBADF)

    def test_closed_client(self) -> None:
        c = kvproxy.Client(PREFILL.sock)
        c.close()
        c.close()  # idempotent
        self.assertTrue(c.closed)
        for call in (lambda: c.poll(), lambda: c.wait(0), lambda: c.peer("decode0"), lambda: c.cancel(1)):
            with self.assertRaises(kvproxy.KvproxyError) as cm:
                call()
            self.assertEqual(cm.exception.errno, errno.EBADF)


class DaemonDeathTest(unittest.TestCase):
    """Runs last, against a daemon of its own: kill it and see the client notice."""

    def test_daemon_death_raises_epipe(self) -> None:
        ports = free_ports(2)
        # The peer never comes up; one client at most.
        doomed = Daemon(TMP, "doomed0", ports[0], "decode0", ports[1], extra="limits = { max_clients = 1; };")
        STARTED.append(doomed)
        doomed.start()
        doomed.wait_ready(need_peer=False)
        c = kvproxy.Client(doomed.sock, sq_entries=16)
        buf = kvproxy.HostBuffer(4096)
        try:
            r = c.register(buf)
            # A second client is over limits.max_clients: the daemon refuses it and says why.
            with self.assertRaises(kvproxy.ConnectError) as cm0:
                kvproxy.Client(doomed.sock)
            self.assertEqual(cm0.exception.errno, errno.EUSERS)
            self.assertIn("max_clients", str(cm0.exception))
            doomed.kill()
            log("killed kvproxyd doomed0 (SIGKILL)")
            deadline = time.monotonic() + XFER_TIMEOUT
            with self.assertRaises(kvproxy.KvproxyError) as cm:
                while time.monotonic() < deadline:
                    c.wait(timeout=1)
            e = cm.exception
            self.assertEqual(e.errno, errno.EPIPE)
            self.assertIsInstance(e, kvproxy.Disconnected)
            self.assertIsInstance(e, ConnectionError)
            # Control calls see it as well.
            with self.assertRaises(kvproxy.Disconnected):
                c.register(buf)
            # Submitting says so too, at once (not a ring that merely fills up).
            with self.assertRaises(kvproxy.Disconnected) as cm2:
                c.submit(0, [(r.key, 0, 1, 0, 64)], 1)
            self.assertEqual(cm2.exception.errno, errno.EPIPE)
        finally:
            c.close()
            buf.close()


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


def main() -> int:
    require_daemon_and_library()
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    suite.addTests(loader.loadTestsFromTestCase(BindingTest))
    suite.addTests(loader.loadTestsFromTestCase(DaemonDeathTest))  # last
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
