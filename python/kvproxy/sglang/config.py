# SPDX-License-Identifier: BSD-3-Clause
"""The adapter's settings, from ``KVPROXY_*`` environment variables.

sglang has no command-line field for a transfer backend's own settings
(``--disaggregation-transfer-backend`` is a bare name), so everything the
adapter needs comes from the environment of the sglang server; the
environment reaches every scheduler process sglang starts.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

__all__ = ["KvproxyConfig"]

log = logging.getLogger("kvproxy.sglang")


@dataclass
class KvproxyConfig:
    """The adapter's settings (see :meth:`from_env` for the variables).

    Attributes:
        socket: the local kvproxyd's ``client_socket`` (``KVPROXY_SOCKET``);
            ``{engine_rank}`` and ``{gpu_id}`` are replaced, for one daemon
            per GPU (``{gpu_id}``: with DP attention a decode server's
            ``engine_rank`` repeats in every DP group). Required.
        transfer_timeout: deadline of each kvproxy transfer in seconds
            (``KVPROXY_TRANSFER_TIMEOUT``); None: the daemon's ``timeouts.default_ms``.
        bootstrap_timeout: seconds a request may stay in ``Bootstrapping``
            (``KVPROXY_BOOTSTRAP_TIMEOUT``, else sglang's
            ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``; default 300).
        waiting_timeout: seconds the decode side waits for a request's data
            after sending its metadata (``KVPROXY_WAITING_TIMEOUT``, else
            ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``; default 300).
        max_inflight: kvproxy transfers a prefill manager keeps in flight
            (``KVPROXY_MAX_INFLIGHT``; default 16); more wait in a queue.
        fence_timeout: seconds a decode receiver's ``clear()``/``abort()``
            waits for kvproxyd to confirm its fence (``KVPROXY_FENCE_TIMEOUT``;
            default 5; kvproxyd confirms within ``timeouts.peer_ms``).
        host_ip: the address a prefill manager advertises for its channel
            (``KVPROXY_HOST_IP``, else sglang's ``SGLANG_HOST_IP``; default:
            the address of the interface that routes to the bootstrap server).
        max_blocks: blocks one strided segment may carry (``KVPROXY_MAX_BLOCKS``;
            default 65536, kvproxyd's default ``limits.max_blocks``: set it to
            the daemon's value where that is lower); a head slice of a longer
            run of pages becomes several segments.
        addr: the ``"host:port"`` remote kvproxyds reach the local one at
            (``KVPROXY_ADDR``); the decode side sends it through sglang's
            bootstrap, and a prefill kvproxyd that does not know the decode
            node by id dials it there (no peer lists needed). Default: the
            daemon's listen address, its host replaced by ``host_ip`` when it
            listens on a wildcard (``0.0.0.0``, ``[::]``); ``"none"``: send
            none (the prefill nodes must list this one as a peer).
        sq_entries, cq_entries: ring sizes asked of kvproxyd
            (``KVPROXY_SQ_ENTRIES``, ``KVPROXY_CQ_ENTRIES``; default 0: the
            daemon's ``limits.sq_entries``/``cq_entries``, which are also the
            largest it grants).
    """

    socket: Optional[str] = None
    transfer_timeout: Optional[float] = None
    bootstrap_timeout: float = 300.0
    waiting_timeout: float = 300.0
    max_inflight: int = 16
    fence_timeout: float = 5.0
    host_ip: Optional[str] = None
    max_blocks: int = 65536
    addr: Optional[str] = None
    sq_entries: int = 0
    cq_entries: int = 0

    # field -> (variables, first wins; kind)
    _ENV = {
        "socket": (("KVPROXY_SOCKET",), "str"),
        "transfer_timeout": (("KVPROXY_TRANSFER_TIMEOUT",), "seconds"),
        "bootstrap_timeout": (("KVPROXY_BOOTSTRAP_TIMEOUT", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"), "seconds"),
        "waiting_timeout": (("KVPROXY_WAITING_TIMEOUT", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"), "seconds"),
        "max_inflight": (("KVPROXY_MAX_INFLIGHT",), "count"),
        "fence_timeout": (("KVPROXY_FENCE_TIMEOUT",), "seconds"),
        "host_ip": (("KVPROXY_HOST_IP", "SGLANG_HOST_IP"), "str"),
        "max_blocks": (("KVPROXY_MAX_BLOCKS",), "count"),
        "addr": (("KVPROXY_ADDR",), "str"),
        "sq_entries": (("KVPROXY_SQ_ENTRIES",), "ring"),
        "cq_entries": (("KVPROXY_CQ_ENTRIES",), "ring"),
    }
    # KVPROXY_* variables of the binding and the tools, not of this adapter.
    _OTHERS = ("KVPROXY_LIB", "KVPROXY_BENCH", "KVPROXY_ADMIN")

    @classmethod
    def variables(cls) -> Tuple[str, ...]:
        """Every variable the adapter reads."""
        return tuple(v for names, _ in cls._ENV.values() for v in names)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, **overrides: Any) -> "KvproxyConfig":
        """The settings from the environment (``os.environ`` by default), then ``overrides``.

        :raises ValueError: a variable has a bad value (the message names it).
        """
        env = os.environ if env is None else env
        cfg = cls()
        known = set(cls.variables()) | set(cls._OTHERS)
        stray = sorted(k for k in env if k.startswith("KVPROXY_") and k not in known)
        if stray:
            log.warning("ignoring unknown environment variables %s (kvproxy.sglang reads %s)",
                        stray, sorted(k for k in known if k.startswith("KVPROXY_")))
        for name, (names, kind) in cls._ENV.items():
            for var in names:
                raw = env.get(var)
                if raw:
                    setattr(cfg, name, _parse(var, raw, kind))
                    break
        valid = {f.name for f in fields(cls)}
        for name, value in overrides.items():
            if name not in valid:
                raise ValueError(f"unknown kvproxy.sglang setting {name!r}; known: {sorted(valid)}")
            setattr(cfg, name, value)
        return cfg

    def socket_for(self, engine_rank: int, gpu_id: int) -> str:
        """The client socket with ``{engine_rank}`` and ``{gpu_id}`` replaced.

        :raises ValueError: no socket configured, or other placeholders in it.
        """
        if not self.socket:
            raise ValueError("kvproxy.sglang: no kvproxyd socket: set $KVPROXY_SOCKET "
                             "(the client_socket of the local kvproxyd)")
        try:
            return self.socket.format(engine_rank=engine_rank, gpu_id=gpu_id)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"KVPROXY_SOCKET={self.socket!r}: only {{engine_rank}} and {{gpu_id}} "
                             f"can be replaced ({e!r})") from None


def _parse(var: str, raw: str, kind: str) -> Any:
    try:
        if kind == "str":
            return raw
        if kind == "count":
            v = int(raw)
            if v < 1:
                raise ValueError("must be >= 1")
            return v
        if kind == "ring":
            v = int(raw)
            if v != 0 and (v < 2 or v & (v - 1)):
                raise ValueError("must be 0 (the daemon's default) or a power of two >= 2")
            return v
        v = float(raw)
        if not v > 0 or math.isinf(v):
            raise ValueError("must be a finite number of seconds > 0")
        return v
    except ValueError as e:
        raise ValueError(f"{var}={raw!r}: {e}") from None


def env_flag(name: str, env: Optional[Dict[str, str]] = None) -> bool:
    """sglang's truthy spelling of a boolean environment variable."""
    return str((env or os.environ).get(name, "")).strip().lower() in ("1", "true", "yes", "on")

