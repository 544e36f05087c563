# SPDX-License-Identifier: BSD-3-Clause
"""Talking to the prefill scheduler's mailbox (:mod:`kvproxy._bootstrap`) from worker threads.

Keys are ``<quoted request id>.<tp rank>``; the kinds are the mailbox's:
``meta`` (a decode worker's registration), ``abort`` (a decode worker gives
a request up, or will never register) and ``status`` (a prefill worker's
progress and outcome).

:class:`LongPoll` is the mailbox's ``POST /kvproxy/v1/wait`` long poll, made
interruptible: a worker thread waits on the reply and on a pipe at once, so
a request that arrives while it waits (a new key to watch, a registration
to store) is served at once instead of after the poll's ``wait_ms``. The
other calls (PUT, DELETE) go through :class:`kvproxy._bootstrap.BootstrapClient`.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from .._bootstrap import BootstrapError

__all__ = ["LongPoll", "mailbox_key"]

_WAIT_PATH = "/kvproxy/v1/wait"


def mailbox_key(request_id: str, rank: int) -> str:
    """The mailbox key of one request and TP rank (URL-safe whatever the id)."""
    return f"{urllib.parse.quote(str(request_id), safe='')}.{int(rank)}"


class LongPoll:
    """An interruptible long poll of one mailbox (one thread uses it; :meth:`wake` from any).

    :param addr: ``host:port`` (``[v6]:port`` too).
    :param io_timeout: seconds allowed to connect, send, and for the reply
        beyond ``wait_ms``.
    """

    def __init__(self, addr: str, io_timeout: float = 2.0) -> None:
        host, sep, port = addr.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"mailbox address {addr!r} is not HOST:PORT")
        self.addr = addr
        self._host = host.strip("[]")
        self._port = int(port)
        self._io = io_timeout
        self._conn: Optional[http.client.HTTPConnection] = None
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

    def wait(self, keys: Dict[str, List[str]], wait_ms: int) -> Optional[Tuple[Dict[str, Dict[str, Any]], Dict[str, Dict[str, int]]]]:
        """``(found, ages)`` as :meth:`BootstrapClient.wait` returns them, or
        None when :meth:`wake` interrupted the wait.

        :raises BootstrapError: the mailbox cannot be reached or answers badly.
        """
        body = json.dumps({"keys": keys, "wait_ms": int(wait_ms)}).encode()
        for attempt in (0, 1):
            try:
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._io)
                self._conn.request("POST", _WAIT_PATH, body=body, headers={"Content-Type": "application/json"})
                break
            except (OSError, http.client.HTTPException) as e:
                self.close_conn()
                # A kept-alive connection the server closed fails once: retry on a new one.
                if attempt == 1 or not isinstance(e, (BrokenPipeError, ConnectionResetError,
                                                      http.client.RemoteDisconnected)):
                    raise BootstrapError(f"mailbox {self.addr}: wait: {e}") from None
        sock = self._conn.sock
        try:
            ready, _, _ = select.select([sock, self._r], [], [], wait_ms / 1000 + self._io)
        except (OSError, ValueError) as e:
            self.close_conn()
            raise BootstrapError(f"mailbox {self.addr}: wait: {e}") from None
        if sock not in ready:
            # Woken (or no reply in time): this connection has a request in
            # flight, so it cannot carry the next one.
            self.close_conn()
            if self._r in ready:
                self._drain()
                return None
            raise BootstrapError(f"mailbox {self.addr}: no reply within {wait_ms / 1000 + self._io:.1f} s")
        try:
            resp = self._conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self.close_conn()
            raise BootstrapError(f"mailbox {self.addr}: wait: {e}") from None
        try:
            reply = json.loads(raw or b"null")
        except ValueError:
            self.close_conn()
            raise BootstrapError(f"mailbox {self.addr}: wait: reply is not JSON") from None
        if resp.status != 200 or not isinstance(reply, dict):
            raise BootstrapError(f"mailbox {self.addr}: wait: HTTP {resp.status}: {reply!r}")
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

    def close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        self.close_conn()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._r = self._w = -1
