# SPDX-License-Identifier: BSD-3-Clause
"""Talking to the prefill scheduler's mailbox (:mod:`kvproxy._bootstrap`) from worker threads.

Keys are ``<quoted request id>.<prefill tp rank>.<n>`` (:func:`pair_key`:
the ``n``-th decode rank that prefill rank sends to); the kinds are the mailbox's:
``meta`` (a decode worker's registration), ``abort`` (a decode worker gives
a request up, or will never register) and ``status`` (a prefill worker's
progress and outcome).

:class:`LongPoll` is the mailbox's ``POST /kvproxy/v1/wait`` long poll, made
interruptible: a worker thread waits on the reply and on a pipe at once, so
a request that arrives while it waits (a new key to watch, a registration
to store) is served at once instead of after the poll's ``wait_ms``. The
other calls (PUT, DELETE) go through :class:`kvproxy._bootstrap.BootstrapClient`.
A :class:`BootstrapError` it raises has ``refused`` set when nothing listens
on the mailbox's port any more (the prefill scheduler is gone).
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import select
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from .._bootstrap import BootstrapError

__all__ = ["LongPoll", "mailbox_key", "pair_key"]

_WAIT_PATH = "/kvproxy/v1/wait"


def mailbox_key(request_id: str, rank: int) -> str:
    """The mailbox key of one request and TP rank (URL-safe whatever the id)."""
    return f"{urllib.parse.quote(str(request_id), safe='')}.{int(rank)}"


class LongPoll:
    """An interruptible long poll of one mailbox (one thread uses it; :meth:`wake` from any).

    A wait that :meth:`wake` interrupts leaves its request in flight: its
    connection is kept, and its reply (due within the request's
    ``wait_ms``) is read and dropped by a later :meth:`wait`, so the
    mailbox never writes into a closed connection.

    :param addr: ``host:port`` (``[v6]:port`` too).
    :param io_timeout: seconds allowed to connect, send, and for the reply
        beyond ``wait_ms``.
    """

    _MAX_STALE = 4

    def __init__(self, addr: str, io_timeout: float = 2.0) -> None:
        host, sep, port = addr.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"mailbox address {addr!r} is not HOST:PORT")
        self.addr = addr
        self._host = host.strip("[]")
        self._port = int(port)
        self._io = io_timeout
        self._idle: List[http.client.HTTPConnection] = []
        self._stale: List[http.client.HTTPConnection] = []
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def wake(self) -> None:
        """Make a :meth:`wait` in progress (or the next one) return None at once."""
        try:
            os.write(self._w, b"!")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending (or the poller is closed)

    def _drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    @staticmethod
    def _read(conn: http.client.HTTPConnection) -> Tuple[int, bytes]:
        resp = conn.getresponse()
        return resp.status, resp.read()

    def _settle_stale(self, conn: http.client.HTTPConnection) -> None:
        """Read and drop the reply of an interrupted wait; keep the connection if it is sound."""
        self._stale.remove(conn)
        try:
            self._read(conn)
            self._idle.append(conn)
        except (OSError, http.client.HTTPException):
            conn.close()

    def _send(self, body: bytes) -> http.client.HTTPConnection:
        for attempt in (0, 1):
            conn = self._idle.pop() if self._idle else http.client.HTTPConnection(self._host, self._port,
                                                                                  timeout=self._io)
            try:
                conn.request("POST", _WAIT_PATH, body=body, headers={"Content-Type": "application/json"})
                return conn
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                # A kept-alive connection the server closed fails once: retry on a new one.
                if attempt == 1 or not isinstance(e, (BrokenPipeError, ConnectionResetError,
                                                      http.client.RemoteDisconnected)):
                    err = BootstrapError(f"mailbox {self.addr}: wait: {e}")
                    # Nothing listens on the port: the process that hosted the
                    # mailbox (the prefill scheduler) is gone.
                    err.refused = getattr(e, "errno", None) == errno.ECONNREFUSED  # type: ignore[attr-defined]
                    raise err from None
        raise AssertionError("unreachable")

    def wait(self, keys: Dict[str, List[str]], wait_ms: int) -> Optional[Tuple[Dict[str, Dict[str, Any]], Dict[str, Dict[str, int]]]]:
        """``(found, ages)`` as :meth:`BootstrapClient.wait` returns them, or
        None when :meth:`wake` interrupted the wait.

        :raises BootstrapError: the mailbox cannot be reached or answers badly.
        """
        body = json.dumps({"keys": keys, "wait_ms": int(wait_ms)}).encode()
        conn = self._send(body)
        deadline = time.monotonic() + wait_ms / 1000 + self._io
        while True:
            left = deadline - time.monotonic()
            socks = {c.sock: c for c in self._stale if c.sock is not None}
            try:
                ready, _, _ = select.select([conn.sock, self._r, *socks], [], [], max(0.0, left))
            except (OSError, ValueError) as e:
                conn.close()
                raise BootstrapError(f"mailbox {self.addr}: wait: {e}") from None
            for s in ready:
                if s in socks:
                    self._settle_stale(socks[s])
            if conn.sock in ready:
                break
            if self._r in ready:
                self._drain()
                self._stale.append(conn)
                while len(self._stale) > self._MAX_STALE:
                    self._stale.pop(0).close()
                return None
            if not ready and time.monotonic() >= deadline:
                conn.close()
                raise BootstrapError(f"mailbox {self.addr}: no reply within {wait_ms / 1000 + self._io:.1f} s")
        try:
            status, raw = self._read(conn)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise BootstrapError(f"mailbox {self.addr}: wait: {e}") from None
        self._idle.append(conn)
        try:
            reply = json.loads(raw or b"null")
        except ValueError:
            raise BootstrapError(f"mailbox {self.addr}: wait: reply is not JSON") from None
        if status != 200 or not isinstance(reply, dict):
            raise BootstrapError(f"mailbox {self.addr}: wait: HTTP {status}: {reply!r}")
        return reply.get("found") or {}, reply.get("age_ms") or {}

    def idle(self, timeout: float) -> None:
        """Sleep until :meth:`wake` or ``timeout`` seconds pass."""
        try:
            select.select([self._r], [], [], timeout)
        except (OSError, ValueError):
            return
        self._drain()

    def clear_wakeups(self) -> None:
        """Forget pending wake-ups (call before collecting what to wait for)."""
        self._drain()

    def close(self) -> None:
        for c in self._idle + self._stale:
            c.close()
        self._idle, self._stale = [], []
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1


def pair_key(request_id: str, prefill_rank: int, index: int) -> str:
    """The mailbox key of one (prefill rank, decode rank) pair of a request:
    ``index`` counts the decode ranks that prefill rank sends to (0 for the
    first; :func:`kvproxy.vllm.tp_map.targets`), so that the prefill rank
    finds the first registration before it knows the decode side's TP size."""
    return f"{mailbox_key(request_id, prefill_rank)}.{int(index)}"
