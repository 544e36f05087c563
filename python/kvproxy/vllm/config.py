# SPDX-License-Identifier: BSD-3-Clause
"""The connector's settings: ``kv_connector_extra_config`` keys and environment variables."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional

__all__ = ["KvproxyVllmConfig"]


@dataclass
class KvproxyVllmConfig:
    """Settings of :class:`kvproxy.vllm.KvproxyConnector`.

    Each comes from the ``kvproxy_<name>`` key of vLLM's
    ``kv_connector_extra_config``, else from the environment variable
    ``KVPROXY_<NAME>``, else the default below.

    Attributes:
        socket: the local kvproxyd's ``client_socket``. ``{rank}`` (TP rank),
            ``{local_rank}``, ``{dp_rank}`` and ``{device}`` (CUDA device
            index) are replaced, for one kvproxyd per GPU. Required on workers.
        bootstrap_host: the address the prefill scheduler's mailbox binds and
            advertises to the decode side (default: bind all addresses,
            advertise ``$VLLM_HOST_IP`` or this host's outgoing address).
        bootstrap_port: its TCP port; 0 picks a free one (it travels in
            ``kv_transfer_params``); a fixed port gets the data-parallel
            index added, like vLLM's own side channels.
        lease_s: how long a prefill instance holds a finished request's
            blocks for a decode side that has not registered yet.
        transfer_timeout_s: deadline of each kvproxy transfer (the decode
            side's value applies to its requests).
        submit_window_s: the prefill side starts no transfer later than this
            after the decode side's registration was stored (the decode side's
            value applies).
        peer_timeout_s: the kvproxyd ``timeouts.peer_ms`` the decode side
            allows for a cancelled transfer's last acknowledgement.
        max_inflight: kvproxy transfers one prefill worker keeps in flight.
        max_transfer_bytes: bytes per kvproxy transfer (a block is never split).
        max_segments: segments per transfer; 0: the local kvproxyd's
            ``limits.max_segments``. Both sides' daemons must accept the
            decode side's choice.
        addr: the ``"host:port"`` remote kvproxyds reach this worker's kvproxyd
            at; the decode side sends it with its registration, and a prefill
            kvproxyd that does not know the decode node by id dials it there
            (no peer lists needed). Default: the daemon's listen address, a
            wildcard host replaced by this host's address (``$VLLM_HOST_IP``,
            else its outgoing one); ``"none"``: send none (the prefill nodes
            must list this one as a peer).
        sq_entries, cq_entries: ring sizes asked of the local kvproxyd
            (powers of two); 0: its ``limits.sq_entries``/``cq_entries``,
            which are also the most it grants. A full submission ring only
            delays a transfer (it is retried as completions come back).
        tp_rank: override of the worker's TP rank (drivers without vLLM's
            parallel state, tests); None: vLLM's.
    """

    socket: Optional[str] = None
    bootstrap_host: Optional[str] = None
    bootstrap_port: int = 0
    lease_s: float = 60.0
    transfer_timeout_s: float = 30.0
    submit_window_s: float = 10.0
    peer_timeout_s: float = 1.0
    max_inflight: int = 16
    max_transfer_bytes: int = 32 << 20
    max_segments: int = 0
    addr: Optional[str] = None
    sq_entries: int = 0
    cq_entries: int = 0
    tp_rank: Optional[int] = None

    _SECONDS = ("lease_s", "transfer_timeout_s", "submit_window_s", "peer_timeout_s")
    _COUNTS = {"bootstrap_port": 0, "max_inflight": 1, "max_transfer_bytes": 1, "max_segments": 0, "sq_entries": 0,
               "cq_entries": 0, "tp_rank": 0}

    @classmethod
    def from_sources(cls, extra: Optional[Mapping[str, Any]] = None,
                     env: Optional[Mapping[str, str]] = None) -> "KvproxyVllmConfig":
        """The settings from ``kv_connector_extra_config`` and the environment.

        :raises ValueError: an unknown ``kvproxy_*`` key (a typo would
            otherwise be ignored silently) or a value out of range.
        """
        env = os.environ if env is None else env
        extra = dict(extra or {})
        names = [f.name for f in fields(cls)]
        known = {f"kvproxy_{n}" for n in names}
        unknown = sorted(k for k in extra if str(k).startswith("kvproxy_") and k not in known)
        if unknown:
            raise ValueError(f"unknown kvproxy settings {unknown} in kv_connector_extra_config; known: {sorted(known)}")
        cfg = cls()
        for name in names:
            raw: Any = extra.get(f"kvproxy_{name}")
            where = f"kv_connector_extra_config[kvproxy_{name}]"
            if raw is None and env.get(f"KVPROXY_{name.upper()}"):
                raw, where = env[f"KVPROXY_{name.upper()}"], f"KVPROXY_{name.upper()}"
            if raw is None:
                continue
            try:
                value: Any
                if name in ("socket", "bootstrap_host", "addr"):
                    value = str(raw)
                    if not value:
                        raise ValueError("must not be empty")
                elif name in cls._SECONDS:
                    value = float(raw)
                    if not value > 0 or math.isinf(value):
                        raise ValueError("must be a finite number of seconds > 0")
                else:
                    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                        raise ValueError("must be an integer")
                    value = int(raw)
                    if value < cls._COUNTS[name]:
                        raise ValueError(f"must be >= {cls._COUNTS[name]}")
                    if name == "bootstrap_port" and value > 65535:
                        raise ValueError("must be a TCP port (<= 65535)")
                    if name in ("sq_entries", "cq_entries") and value & (value - 1):
                        raise ValueError("must be 0 or a power of two")
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}={raw!r}: {e}") from None
            setattr(cfg, name, value)
        return cfg

    def socket_for(self, rank: int, local_rank: int, dp_rank: int, device: int) -> str:
        """The client socket of this worker, its placeholders filled in.

        :raises ValueError: no socket configured, or an unknown placeholder.
        """
        if not self.socket:
            raise ValueError("kvproxy needs the local kvproxyd's client socket: set kvproxy_socket in "
                             "kv_connector_extra_config or KVPROXY_SOCKET")
        try:
            return self.socket.format(rank=rank, local_rank=local_rank, dp_rank=dp_rank, device=device)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"kvproxy_socket {self.socket!r}: placeholders are {{rank}}, {{local_rank}}, "
                             f"{{dp_rank}}, {{device}} ({e})") from None

    def as_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
