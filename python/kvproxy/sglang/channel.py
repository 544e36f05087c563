# SPDX-License-Identifier: BSD-3-Clause
"""The managers' request channel: framed JSON messages over TCP.

Each prefill manager listens on one port (the ``rank_ip``/``rank_port`` it
registers at the bootstrap server, as sglang's own managers do with their
ZMQ sockets); each decode manager keeps one connection per prefill rank it
talks to. A request's exchange is one message each way: the decode side's
metadata (or abort) and the prefill side's outcome, so a request's
bootstrap costs one network trip, not a poll interval.

One I/O thread per :class:`Channel` (``selectors``) does all socket work;
other threads queue messages with :meth:`Channel.send` and wake it through a
socket pair. Handlers (``on_message``, ``on_close``) run on the I/O thread.
Frames: a 4-byte big-endian length, then a UTF-8 JSON object.
"""

from __future__ import annotations

import errno
import json
import logging
import selectors
import socket
import struct
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional, Tuple

__all__ = ["Channel", "Conn", "DEAD_PEER_S"]

log = logging.getLogger("kvproxy.sglang")

_MAX_FRAME = 64 << 20
_HDR = struct.Struct(">I")


class Conn:
    """One channel connection (either direction).

    Attributes:
        endpoint: ``(host, port)`` of the other side (as dialled, or as accepted).
        outgoing: True when this side dialled.
        open: False once closed (no more messages either way).
        hello: the other side's ``hello`` message, once it arrived.
        data: free for the owner (what requests use this connection).
    """

    def __init__(self, sock: socket.socket, endpoint: Tuple[str, int], outgoing: bool) -> None:
        self.sock = sock
        self.endpoint = endpoint
        self.outgoing = outgoing
        self.connecting = outgoing
        self.open = True
        self.hello: Optional[Dict[str, Any]] = None
        self.data: Dict[str, Any] = {}
        self.close_reason = ""
        self._out: Deque[bytes] = deque()
        self._sent = 0  # bytes of _out[0] already written
        self._in = bytearray()

    @property
    def name(self) -> str:
        h, p = self.endpoint
        return f"[{h}]:{p}" if ":" in h else f"{h}:{p}"

    def __repr__(self) -> str:
        return f"<kvproxy.sglang channel {'to' if self.outgoing else 'from'} {self.name}{'' if self.open else ' closed'}>"


def _encode(msg: Dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    if len(body) > _MAX_FRAME:
        raise ValueError(f"channel message of {len(body)} bytes (at most {_MAX_FRAME})")
    return _HDR.pack(len(body)) + body


# A dead peer (host gone, half-open connection) is noticed this soon even on
# an idle connection: TCP keepalive 10 s idle + 5 probes 2 s apart. The decode
# side's fences hold at least this long past a transfer's deadline.
DEAD_PEER_S = 20.0


def _keepalive(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, v in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, opt):
            s.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), v)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Channel:
    """The I/O thread and its connections.

    :param on_message: ``(conn, msg)`` for each message received.
    :param on_open: ``(conn)`` when a connection is up (dialled: connected;
        accepted: accepted); send a hello here.
    :param on_close: ``(conn, reason)`` once per connection, when it closed.
    :param listen: ``(host, port)`` to listen on (port 0: a free one), or None.
    :raises OSError: the listening address cannot be bound.
    """

    def __init__(self, name: str, on_message: Callable[[Conn, Dict[str, Any]], None],
                 on_open: Callable[[Conn], None], on_close: Callable[[Conn, str], None],
                 listen: Optional[Tuple[str, int]] = None) -> None:
        self._on_message, self._on_open, self._on_close = on_message, on_open, on_close
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._conns: Dict[int, Conn] = {}
        self._pending: Deque[Conn] = deque()  # dialled, not yet registered with the selector
        self._dirty: Deque[Conn] = deque()  # output queued, or close requested
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._flush_waiters: list = []
        self._listener: Optional[socket.socket] = None
        self.port = 0
        if listen is not None:
            host, port = listen
            fam = socket.AF_INET6 if ":" in host else socket.AF_INET
            ls = socket.socket(fam, socket.SOCK_STREAM)
            try:
                ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                ls.bind((host, port))
                ls.listen(256)
                ls.setblocking(False)
            except OSError:
                ls.close()
                raise
            self._listener = ls
            self.port = ls.getsockname()[1]
            self._sel.register(ls, selectors.EVENT_READ, "listen")
        self._thread = threading.Thread(target=self._loop, name=f"kvproxy-chan-{name}", daemon=True)
        self._thread.start()

    # ---- any thread ----

    def connect(self, endpoint: Tuple[str, int], first: Optional[Dict[str, Any]] = None) -> Conn:
        """Dial ``endpoint`` without waiting; ``on_open`` (or ``on_close``) follows on the I/O thread.
        ``first`` (a hello) goes out before anything :meth:`send` queues;
        messages sent before the connection is up wait for it."""
        host, port = endpoint
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setblocking(False)
        conn = Conn(s, (host, int(port)), outgoing=True)
        if first is not None:
            conn._out.append(_encode(first))
        with self._lock:
            if self._closing:
                s.close()
                conn.open = False
                conn.close_reason = "the channel is closed"
                return conn
            self._pending.append(conn)
        self._wake()
        return conn

    def send(self, conn: Conn, msg: Dict[str, Any]) -> bool:
        """Queue ``msg`` on ``conn``; False if the connection is closed (nothing queued)."""
        frame = _encode(msg)
        with self._lock:
            if not conn.open or self._closing:
                return False
            conn._out.append(frame)
            self._dirty.append(conn)
        self._wake()
        return True

    def drop(self, conn: Conn, reason: str) -> None:
        """Close ``conn`` (queued output is discarded); ``on_close`` follows."""
        with self._lock:
            if not conn.open:
                return
            conn.close_reason = conn.close_reason or reason
            conn.data["_drop"] = True
            self._dirty.append(conn)
        self._wake()

    def close(self) -> None:
        """Close every connection and the listener, stop the thread (idempotent).
        ``on_close`` runs for every connection still open."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def flush(self, timeout: float) -> None:
        """Wait (bounded) until every queued message was written out (used before close)."""
        done = threading.Event()
        with self._lock:
            if self._closing:
                return
            self._flush_waiters.append(done)
        self._wake()
        done.wait(timeout)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending already, or we are closing

    # ---- I/O thread ----

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    closing = self._closing
                if closing:
                    break
                for key, ev in self._sel.select(timeout=1.0):
                    if key.data is None:
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except (BlockingIOError, OSError):
                            pass
                    elif key.data == "listen":
                        self._accept()
                    else:
                        self._io(key.data, ev)
                self._service()
        except Exception:  # noqa: BLE001 - a bug here must not leave the peers hanging
            log.exception("kvproxy.sglang channel thread failed")
        finally:
            for conn in list(self._conns.values()):
                self._close(conn, "the manager closed its channel")
            with self._lock:
                pending = list(self._pending)
                self._pending.clear()
            for conn in pending:
                conn.sock.close()
                conn.open = False
                self._notify_close(conn, "the manager closed its channel")
            if self._listener is not None:
                self._listener.close()
            with self._lock:
                waiters, self._flush_waiters = self._flush_waiters, []
            for w in waiters:
                w.set()
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _service(self) -> None:
        with self._lock:
            pending = list(self._pending)
            self._pending.clear()
            dirty = list(self._dirty)
            self._dirty.clear()
            waiters = list(self._flush_waiters)
        for conn in pending:
            try:
                conn.sock.connect((conn.endpoint[0], conn.endpoint[1]))
            except BlockingIOError:
                pass
            except OSError as e:
                conn.sock.close()
                conn.open = False
                self._notify_close(conn, f"connect to {conn.name}: {e.strerror or e}")
                continue
            self._conns[id(conn)] = conn
            self._sel.register(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        for conn in dirty:
            if conn.data.get("_drop"):
                self._close(conn, conn.close_reason)
            elif conn.open and not conn.connecting:
                self._write(conn)
        if waiters and not any(c._out for c in self._conns.values() if c.open):
            with self._lock:
                self._flush_waiters = [w for w in self._flush_waiters if w not in waiters]
            for w in waiters:
                w.set()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                s, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("kvproxy.sglang channel: accept: %s", e)
                return
            s.setblocking(False)
            _keepalive(s)
            conn = Conn(s, (addr[0], addr[1]), outgoing=False)
            self._conns[id(conn)] = conn
            self._sel.register(s, selectors.EVENT_READ, conn)
            self._call(self._on_open, conn)

    def _io(self, conn: Conn, ev: int) -> None:
        if not conn.open:
            return
        if conn.connecting and ev & selectors.EVENT_WRITE:
            err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._close(conn, f"connect to {conn.name}: {errno.errorcode.get(err, err)}")
                return
            conn.connecting = False
            _keepalive(conn.sock)
            self._call(self._on_open, conn)
            if not conn.open:
                return
        if ev & selectors.EVENT_READ:
            self._read(conn)
        if conn.open and ev & selectors.EVENT_WRITE and not conn.connecting:
            self._write(conn)
        if conn.open and not conn.connecting:
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn._out else 0)
            self._sel.modify(conn.sock, want, conn)

    def _read(self, conn: Conn) -> None:
        while conn.open:
            try:
                chunk = conn.sock.recv(1 << 18)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._close(conn, f"{conn.name}: {e.strerror or e}")
                return
            if not chunk:
                self._close(conn, f"{conn.name} closed the connection")
                return
            conn._in += chunk
            while conn.open and len(conn._in) >= _HDR.size:
                (n,) = _HDR.unpack_from(conn._in)
                if n > _MAX_FRAME:
                    self._close(conn, f"{conn.name} sent a frame of {n} bytes")
                    return
                if len(conn._in) < _HDR.size + n:
                    break
                body = bytes(conn._in[_HDR.size:_HDR.size + n])
                del conn._in[:_HDR.size + n]
                try:
                    msg = json.loads(body)
                    if not isinstance(msg, dict):
                        raise ValueError("not an object")
                except ValueError as e:
                    self._close(conn, f"{conn.name} sent a malformed message ({e})")
                    return
                self._call(self._on_message, conn, msg)

    def _write(self, conn: Conn) -> None:
        while conn._out:
            head = conn._out[0]
            try:
                n = conn.sock.send(memoryview(head)[conn._sent:])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._close(conn, f"{conn.name}: {e.strerror or e}")
                return
            conn._sent += n
            if conn._sent < len(head):
                break
            with self._lock:
                conn._out.popleft()
            conn._sent = 0
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn._out else 0)
        try:
            self._sel.modify(conn.sock, want, conn)
        except (KeyError, ValueError):
            pass

    def _close(self, conn: Conn, reason: str) -> None:
        if not conn.open:
            return
        with self._lock:
            conn.open = False
            conn._out.clear()
        self._conns.pop(id(conn), None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        self._notify_close(conn, reason)

    def _notify_close(self, conn: Conn, reason: str) -> None:
        conn.close_reason = conn.close_reason or reason
        self._call(self._on_close, conn, conn.close_reason)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - one bad message must not stop the channel
            log.exception("kvproxy.sglang channel handler failed")
