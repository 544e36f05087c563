# SPDX-License-Identifier: BSD-3-Clause
"""sglang's bootstrap-server protocol: a standard-library server and client.

The adapter rides sglang's own bootstrap registry instead of a side channel
of its own, so whatever serves that registry works: sglang's Python
``CommonKVBootstrapServer``, the Rust port of it that sglang's rust-server
mode starts on the API port, or :class:`KvproxyKVBootstrapServer` here
(which sglang starts for ``--disaggregation-transfer-backend kvproxy``). The
registry only maps a prefill rank to an address; the request-level exchange
(metadata, outcome, abort) runs directly between the managers over
:mod:`kvproxy.sglang.channel`, one message each way.

Routes (the wire contract of ``CommonKVBootstrapServer``):

``PUT /route``
    a prefill rank registers: attention TP/CP/DP sizes and ranks, PP,
    system DP, ``rank_ip``/``rank_port`` (where its manager listens),
    ``page_size``, ``kv_cache_dtype``, ``load_balance_method``,
    ``prefill_http_port``. The first registration sets the server-wide sizes.
``GET /route?prefill_dp_rank=&prefill_cp_rank=&target_tp_rank=&target_pp_rank=``
    ``{"rank_ip", "rank_port"}`` of one rank; all four ``-1``: the server's
    topology (``PrefillServerInfo``). 503 until ``dp x cp x tp x pp`` ranks
    registered, 404 for an unknown rank, 400 for missing parameters.
``POST /register_dp_rank`` ``{"bootstrap_room", "dp_rank"}``; ``POST
/query_dp_ranks`` ``{"bootstrap_rooms": [...]}`` -> ``{"<room>": dp_rank}``
    which prefill DP rank took a request (entries expire after
    ``SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL`` seconds, 120).
``GET /health``
    ``OK``.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

from .topology import split_hostport

__all__ = ["KvproxyKVBootstrapServer", "PrefillInfo", "RegistryError", "registry_call"]

log = logging.getLogger("kvproxy.sglang")

_MAX_BODY = 1 << 20


@dataclass
class PrefillInfo:
    """A prefill server's topology as its bootstrap server reports it (the
    values of the decode manager's ``prefill_info_table``; sglang's decode
    scheduler reads ``dp_size`` and ``follow_bootstrap_room``)."""

    attn_tp_size: int = 1
    attn_cp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    page_size: Optional[int] = None
    kv_cache_dtype: Optional[str] = None
    follow_bootstrap_room: bool = True
    enable_dsa_cache_layer_split: bool = False
    prefill_http_port: Optional[int] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "PrefillInfo":
        def opt(v: Any, f: Any) -> Any:
            return None if v is None else f(v)

        return cls(
            attn_tp_size=int(d["attn_tp_size"]), attn_cp_size=int(d.get("attn_cp_size", 1)),
            dp_size=int(d.get("dp_size", 1)), pp_size=int(d.get("pp_size", 1)),
            page_size=opt(d.get("page_size"), int), kv_cache_dtype=opt(d.get("kv_cache_dtype"), str),
            follow_bootstrap_room=bool(d.get("follow_bootstrap_room", True)),
            enable_dsa_cache_layer_split=bool(d.get("enable_dsa_cache_layer_split", False)),
            prefill_http_port=opt(d.get("prefill_http_port"), int),
        )


class RegistryError(OSError):
    """The bootstrap server could not be reached or answered with an error.

    ``status`` is the HTTP status (0: no answer); ``not_ready`` is True for
    503 (not every prefill rank registered yet)."""

    def __init__(self, msg: str, status: int = 0) -> None:
        super().__init__(msg)
        self.status = status

    @property
    def not_ready(self) -> bool:
        return self.status == 503


def registry_call(addr: str, method: str, path: str, body: Any = None, timeout: float = 2.0) -> Any:
    """One request to the bootstrap server at ``addr`` (``host:port``): the
    decoded JSON reply (or the text, for plain replies).

    :raises RegistryError: no connection, a timeout, or a status other than 200.
    """
    host, port = split_hostport(addr)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise RegistryError(f"bootstrap server {addr}: {method} {path}: {e}") from None
    finally:
        conn.close()
    text = raw.decode(errors="replace")
    if resp.status != 200:
        raise RegistryError(f"bootstrap server {addr}: {method} {path}: HTTP {resp.status}: {text.strip()[:200]}",
                            resp.status)
    try:
        return json.loads(text) if text.strip() and text.lstrip()[:1] in "{[" else text
    except ValueError:
        return text


class _Registry:
    """The state of :class:`KvproxyKVBootstrapServer` (one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sizes: Dict[str, Any] = {}
        self.ranks: Dict[Tuple[int, int, int, int], Dict[str, Any]] = {}
        self.registered = 0
        self.rooms: Dict[int, Tuple[int, float]] = {}
        self.ttl = float(os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL") or 120)
        self._next_sweep = time.monotonic() + self.ttl

    def ready(self) -> bool:
        s = self.sizes
        if not all(k in s for k in ("dp_size", "attn_cp_size", "attn_tp_size", "pp_size")):
            return False
        return self.registered >= s["dp_size"] * s["attn_cp_size"] * s["attn_tp_size"] * s["pp_size"]

    def register(self, d: Dict[str, Any]) -> None:
        system_dp = int(d["system_dp_size"])
        first = {
            "attn_tp_size": int(d["attn_tp_size"]), "attn_cp_size": int(d["attn_cp_size"]),
            "dp_size": int(d["attn_dp_size"]) if system_dp == 1 else system_dp, "pp_size": int(d["pp_size"]),
            "page_size": None if d.get("page_size") is None else int(d["page_size"]),
            "kv_cache_dtype": d.get("kv_cache_dtype"),
            "prefill_http_port": None if d.get("prefill_http_port") is None else int(d["prefill_http_port"]),
            "follow_bootstrap_room": (d.get("load_balance_method") or "follow_bootstrap_room") == "follow_bootstrap_room",
            "enable_dsa_cache_layer_split": bool(d.get("enable_dsa_cache_layer_split", False)),
        }
        group = int(d["attn_dp_rank"]) if system_dp == 1 else int(d["system_dp_rank"])
        key = (group, int(d["attn_cp_rank"]), int(d["attn_tp_rank"]), int(d["pp_rank"]))
        info = {"rank_ip": str(d["rank_ip"]), "rank_port": int(d["rank_port"])}
        with self.lock:
            for k, v in first.items():
                if self.sizes.get(k) is None and v is not None:
                    self.sizes[k] = v
            self.ranks[key] = info
            self.registered += 1

    def info(self) -> Dict[str, Any]:
        s = dict(self.sizes)
        return asdict(PrefillInfo(
            attn_tp_size=s["attn_tp_size"], attn_cp_size=s["attn_cp_size"], dp_size=s["dp_size"],
            pp_size=s["pp_size"], page_size=s.get("page_size"), kv_cache_dtype=s.get("kv_cache_dtype"),
            follow_bootstrap_room=s.get("follow_bootstrap_room", True),
            enable_dsa_cache_layer_split=s.get("enable_dsa_cache_layer_split", False),
            prefill_http_port=s.get("prefill_http_port")))

    def sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.ttl
        for room in [r for r, (_, t) in self.rooms.items() if now - t > self.ttl]:
            del self.rooms[room]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("bootstrap %s: " + fmt, self.address_string(), *args)

    def _reply(self, code: int, body: Any) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > _MAX_BODY:
            raise ValueError(f"body of {n} bytes")
        return json.loads(self.rfile.read(n) or b"null")

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        url = urlsplit(self.path)
        reg = self.server.registry
        if url.path == "/health":
            self._reply(200, "OK")
            return
        if url.path != "/route":
            self._reply(404, f"no such resource {url.path}")
            return
        q = parse_qs(url.query)
        try:
            key = tuple(int(q[k][0]) for k in ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"))
        except (KeyError, ValueError, IndexError):
            self._reply(400, "Missing inputs for bootstrap server.")
            return
        with reg.lock:
            if not reg.ready():
                self._reply(503, f"Prefill server not fully registered yet ({reg.registered} workers registered).")
                return
            if key == (-1, -1, -1, -1):
                self._reply(200, reg.info())
                return
            info = reg.ranks.get(key)  # type: ignore[arg-type]
        if info is None:
            self._reply(404, "Bootstrap info not found for dp_rank={} cp_rank={} tp_rank={} pp_rank={}".format(*key))
        else:
            self._reply(200, info)

    def do_PUT(self) -> None:  # noqa: N802
        if urlsplit(self.path).path != "/route":
            self._reply(404, f"no such resource {self.path}")
            return
        try:
            self.server.registry.register(self._json())
        except (ValueError, KeyError, TypeError) as e:
            self._reply(400, f"bad registration: {e!r}")
            return
        self._reply(200, "OK")

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        reg = self.server.registry
        try:
            body = self._json()
            if path == "/register_dp_rank":
                with reg.lock:
                    reg.rooms[int(body["bootstrap_room"])] = (int(body["dp_rank"]), time.monotonic())
                    reg.sweep(time.monotonic())
                self._reply(200, "OK")
            elif path == "/query_dp_ranks":
                rooms = [int(r) for r in body["bootstrap_rooms"]]
                with reg.lock:
                    self._reply(200, {str(r): reg.rooms[r][0] for r in rooms if r in reg.rooms})
            else:
                self._reply(404, f"no such resource {path}")
        except (ValueError, KeyError, TypeError) as e:
            self._reply(400, f"bad request: {e!r}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: _Registry


class _Server6(_Server):
    address_family = socket.AF_INET6


class KvproxyKVBootstrapServer:
    """sglang's ``KVBootstrapServer`` for this backend: the bootstrap registry
    above, served from a daemon thread (``KvproxyKVBootstrapServer(host, port)``,
    as sglang's ``start_disagg_service`` creates it on the prefill node).

    :param host: address to bind (``""``, ``0.0.0.0``, ``::``: all).
    :param port: TCP port; 0 picks a free one (see :attr:`port`).
    :raises OSError: the address cannot be bound.
    """

    def __init__(self, host: str = "", port: int = 8998) -> None:
        host = (host or "").strip("[]")
        cls = _Server6 if ":" in host else _Server
        self._httpd = cls((host, int(port)), _Handler)
        self._httpd.registry = _Registry()
        self.host = host
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kvproxy-bootstrap", daemon=True)
        self._thread.start()
        log.info("kvproxy bootstrap server on %s:%d", host or "*", self.port)

    @property
    def thread(self) -> threading.Thread:
        """The serving thread (sglang's bootstrap child checks and joins it)."""
        return self._thread

    def registered(self) -> List[Dict[str, Any]]:
        """The ranks registered so far (for operators and tests)."""
        reg = self._httpd.registry
        with reg.lock:
            return [{"dp": k[0], "cp": k[1], "tp": k[2], "pp": k[3], **v} for k, v in sorted(reg.ranks.items())]

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def poll(self) -> None:
        """sglang's bootstrap servers have it; nothing to report."""
        return None

    def __enter__(self) -> "KvproxyKVBootstrapServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
