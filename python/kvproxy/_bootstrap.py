# SPDX-License-Identifier: BSD-3-Clause
"""The bootstrap side channel of the engine adapters: a small HTTP mailbox.

Before a KV transfer the decode side must tell the prefill side where the
data goes (its kvproxyd node id, region keys, page indices), and the prefill
side should tell the decode side when it failed. kvproxy itself carries
only the data, so this exchange needs a side channel. :class:`BootstrapServer`
is one an adapter hosts where its engine gives it a place (``kvproxy.vllm``:
the prefill scheduler): a standard-library ``ThreadingHTTPServer`` holding
four tables, and every participant is a client of it (no listening socket
on any worker). ``kvproxy.sglang`` does not use it: it speaks sglang's own
bootstrap-server protocol (:mod:`kvproxy.sglang.bootstrap`).

``PUT /kvproxy/v1/ranks/<id>``
    a prefill worker announces itself (node id, layout); ``GET
    /kvproxy/v1/info`` lists the announced workers.
``PUT /kvproxy/v1/<meta|abort|status>/<key>``
    store a JSON object under ``<key>`` (``<room>.<rank>``): the decode
    side's transfer metadata, the decode side giving the request up, the
    prefill side's outcome.
``POST /kvproxy/v1/wait``
    ``{"keys": {kind: [key, ...], ...}, "wait_ms": N}``: long poll over
    several kinds at once; returns ``{"found": {kind: {key: object}},
    "age_ms": {kind: {key: ms}}}`` (``age_ms``: how long ago each entry was
    stored) as soon as one of the keys is present, or empty after
    ``wait_ms`` (at most 1000). ``POST /kvproxy/v1/<kind>/wait`` with
    ``{"keys": [...]}`` is the one-kind form (``{"found": {key: object}}``).
``DELETE /kvproxy/v1/rooms/<key>``
    drop every entry of a key (the reader is done with it).
``GET /health``
    ``{"ok": true}``.

Entries not deleted expire after ``ttl`` seconds. The server trusts its
clients, as the engine's own bootstrap server does: bind it to an address
only the cluster can reach.
"""

from __future__ import annotations

import errno
import http.client
import json
import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["BootstrapServer", "BootstrapClient", "BootstrapError", "KINDS"]

log = logging.getLogger("kvproxy.bootstrap")

KINDS = ("meta", "abort", "status")
_PREFIX = "/kvproxy/v1/"
_MAX_BODY = 64 << 20
_MAX_WAIT_MS = 1000
# Connection errors after which the server certainly did not see the request.
_NOT_CONNECTED = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)


class BootstrapError(OSError):
    """The bootstrap server could not be reached or answered with an error.

    ``maybe_done`` is False when the request certainly had no effect (the
    connection was refused, the server answered with an error)."""

    maybe_done = True


class _Store:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.cond = threading.Condition()
        self.ranks: Dict[str, Any] = {}
        self.boxes: Dict[str, Dict[str, Tuple[float, Any]]] = {k: {} for k in KINDS}
        self._next_prune = time.monotonic() + ttl

    def _prune(self, now: float) -> None:
        if now < self._next_prune:
            return
        self._next_prune = now + self.ttl / 4
        for box in self.boxes.values():
            for key in [k for k, (t, _) in box.items() if now - t > self.ttl]:
                del box[key]

    def put(self, kind: str, key: str, value: Any) -> None:
        with self.cond:
            now = time.monotonic()
            self._prune(now)
            self.boxes[kind][key] = (now, value)
            self.cond.notify_all()

    def delete(self, key: str) -> None:
        with self.cond:
            for box in self.boxes.values():
                box.pop(key, None)

    def wait(self, keys: Dict[str, List[str]], wait_s: float) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Dict[str, int]]]:
        """The entries present for ``keys`` (kind -> key list) and their ages in
        ms, waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + wait_s
        with self.cond:
            while True:
                now = time.monotonic()
                found: Dict[str, Dict[str, Any]] = {}
                ages: Dict[str, Dict[str, int]] = {}
                for kind, ks in keys.items():
                    box = self.boxes[kind]
                    for k in ks:
                        if k in box:
                            t, value = box[k]
                            found.setdefault(kind, {})[k] = value
                            ages.setdefault(kind, {})[k] = int((now - t) * 1000)
                left = deadline - now
                if found or left <= 0:
                    return found, ages
                self.cond.wait(left)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("bootstrap %s: " + fmt, self.address_string(), *args)

    def _reply(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > _MAX_BODY:
            raise ValueError(f"body of {n} bytes")
        return json.loads(self.rfile.read(n) or b"null")

    def _route(self) -> Tuple[str, str]:
        path = self.path.split("?", 1)[0]
        if not path.startswith(_PREFIX):
            return "", path
        what, _, rest = path[len(_PREFIX):].partition("/")
        return what, rest

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        store = self.server.store
        if self.path == "/health":
            self._reply(200, {"ok": True})
        elif self._route() == ("info", ""):
            with store.cond:
                self._reply(200, {"ranks": list(store.ranks.values())})
        else:
            self._reply(404, {"error": f"no such resource {self.path}"})

    def do_PUT(self) -> None:  # noqa: N802
        store = self.server.store
        what, key = self._route()
        try:
            body = self._body()
        except ValueError as e:
            self._reply(400, {"error": f"bad JSON body: {e}"})
            return
        if what == "ranks" and key:
            with store.cond:
                store.ranks[key] = body
            self._reply(200, {"ok": True})
        elif what in KINDS and key and "/" not in key:
            store.put(what, key, body)
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"error": f"no such resource {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        what, rest = self._route()
        one = what in KINDS and rest == "wait"  # the one-kind form
        if not one and (what, rest) != ("wait", ""):
            self._reply(404, {"error": f"no such resource {self.path}"})
            return
        try:
            body = self._body()
            raw = {what: body["keys"]} if one else dict(body["keys"])
            keys = {str(kind): [str(k) for k in ks] for kind, ks in raw.items()}
            if not set(keys) <= set(KINDS):
                raise ValueError(f"kinds {sorted(keys)}, known: {list(KINDS)}")
            wait_ms = min(max(int(body.get("wait_ms", 0)), 0), _MAX_WAIT_MS)
        except (ValueError, KeyError, TypeError) as e:
            self._reply(400, {"error": f"bad wait request: {e}"})
            return
        found, ages = self.server.store.wait(keys, wait_ms / 1000)
        self._reply(200, {"found": found.get(what, {})} if one else {"found": found, "age_ms": ages})

    def do_DELETE(self) -> None:  # noqa: N802
        what, key = self._route()
        if what != "rooms" or not key:
            self._reply(404, {"error": f"no such resource {self.path}"})
            return
        self.server.store.delete(key)
        self._reply(200, {"ok": True})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    store: _Store

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that goes away (a worker shutting down, a long poll it
        # abandoned) is normal: say so at debug level instead of printing a
        # traceback on stderr; anything else keeps the default report.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("bootstrap %s: client went away: %s", client_address, exc)
            return
        super().handle_error(request, client_address)


class BootstrapServer:
    """The mailbox server (see the module docstring), serving from a daemon thread.

    :param host: address to bind (``""`` or ``0.0.0.0``: all).
    :param port: TCP port; 0 picks a free one (see :attr:`port`).
    :param ttl: seconds after which entries nobody deleted are dropped.
    :raises OSError: the address cannot be bound.
    """

    def __init__(self, host: str, port: int, ttl: float = 600.0) -> None:
        self._httpd = _Server((host, int(port)), _Handler)
        self._httpd.store = _Store(ttl)
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kvproxy-bootstrap", daemon=True)
        self._thread.start()
        log.info("kvproxy bootstrap server on %s:%d", host or "*", self.port)

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> "BootstrapServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class BootstrapClient:
    """A client of one :class:`BootstrapServer` (``host:port``), one connection
    kept alive. Not thread-safe: one thread per client.

    Every method raises :class:`BootstrapError` when the server cannot be
    reached or refuses the request.
    """

    def __init__(self, addr: str, timeout: float = 5.0) -> None:
        host, sep, port = addr.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"bootstrap address {addr!r} is not HOST:PORT")
        self.addr = addr
        self._host = host.strip("[]")
        self._port = int(port)
        self._timeout = timeout
        self._conn: Optional[http.client.HTTPConnection] = None

    def _call(self, method: str, path: str, body: Any = None, extra_timeout: float = 0.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            self._conn.timeout = self._timeout + extra_timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(self._conn.timeout)
            try:
                self._conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                resp = self._conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                # A kept-alive connection the server already closed fails once: retry on a new one.
                if attempt == 0 and isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)):
                    continue
                err = BootstrapError(f"bootstrap server {self.addr}: {method} {path}: {e}")
                err.maybe_done = getattr(e, "errno", None) not in _NOT_CONNECTED
                raise err from None
            try:
                reply = json.loads(raw or b"null")
            except ValueError:
                raise BootstrapError(f"bootstrap server {self.addr}: {method} {path}: not JSON") from None
            if resp.status != 200:
                err = reply.get("error") if isinstance(reply, dict) else reply
                refused = BootstrapError(f"bootstrap server {self.addr}: {method} {path}: HTTP {resp.status}: {err}")
                refused.maybe_done = False
                raise refused
            return reply
        raise AssertionError("unreachable")

    def health(self) -> bool:
        return bool(self._call("GET", "/health").get("ok"))

    def info(self) -> Dict[str, Any]:
        """``{"ranks": [announced worker records]}``."""
        return self._call("GET", _PREFIX + "info")

    def announce(self, rank_id: str, record: Dict[str, Any]) -> None:
        self._call("PUT", _PREFIX + "ranks/" + rank_id, record)

    def put(self, kind: str, key: str, value: Any) -> None:
        self._call("PUT", f"{_PREFIX}{kind}/{key}", value)

    def wait(self, keys: Dict[str, List[str]], wait_ms: int) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Dict[str, int]]]:
        """The entries present for ``keys`` (kind -> key list), waiting up to
        ``wait_ms`` for one: ``({kind: {key: object}}, {kind: {key: age in ms}})``."""
        reply = self._call("POST", _PREFIX + "wait", {"keys": keys, "wait_ms": wait_ms}, wait_ms / 1000)
        return reply.get("found") or {}, reply.get("age_ms") or {}

    def delete(self, key: str) -> None:
        self._call("DELETE", f"{_PREFIX}rooms/{key}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
