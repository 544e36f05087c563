# SPDX-License-Identifier: BSD-3-Clause
"""Where a worker sits in sglang's parallelism, and what its KV layout is.

sglang keys the KV exchange by *attention* ranks: with
``--enable-dp-attention`` the TP group of ``tp_size`` ranks splits into
``dp_size`` attention-DP groups of ``tp_size // dp_size // attn_cp_size``
attention-TP ranks (rank layout (dp, cp, tp), tp fastest). The prefill
scheduler hands its manager the global ``tp_rank`` as ``engine_rank``, the
decode scheduler ``tp_rank % attn_tp_size``; both are turned into the same
attention-TP rank here, the way sglang's ``compute_dp_attention_world_info``
does (or read from sglang's own parallel state when it is importable).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

log = logging.getLogger("kvproxy.sglang")

__all__ = ["Topology", "topology_of", "registry_addr", "advertised_ip", "split_hostport", "join_hostport",
           "layout_mismatch"]


@dataclass(frozen=True)
class Topology:
    """One worker's attention ranks (the fields sglang registers at ``/route``)."""

    attn_tp_size: int = 1
    attn_tp_rank: int = 0
    attn_cp_size: int = 1
    attn_cp_rank: int = 0
    attn_dp_size: int = 1
    attn_dp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    system_dp_size: int = 1
    system_dp_rank: int = 0

    @property
    def dp_group(self) -> int:
        """The DP rank the bootstrap server files this worker under (sglang's ``dp_group``)."""
        return self.attn_dp_rank if self.system_dp_size == 1 else self.system_dp_rank

    @property
    def dp_size(self) -> int:
        return self.attn_dp_size if self.system_dp_size == 1 else self.system_dp_size

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


def _int(obj: Any, name: str, default: int) -> int:
    v = getattr(obj, name, None)
    return default if v is None else int(v)


def _sglang_parallel() -> Optional[Tuple[int, int, int, int, int, int]]:
    """(attn_tp_size, attn_tp_rank, attn_cp_size, attn_cp_rank, attn_dp_size,
    attn_dp_rank) from sglang's initialised parallel state, or None."""
    try:
        from sglang.srt.layers import dp_attention as dpa  # type: ignore[import-not-found]

        dp = (int(dpa.get_attention_dp_size()), int(dpa.get_attention_dp_rank()))
    except Exception:  # noqa: BLE001 - not sglang, or not initialised: compute it
        return None
    try:
        from sglang.srt.runtime_context import get_parallel  # type: ignore[import-not-found]

        p = get_parallel()
        tp = (int(p.attn_tp_size), int(p.attn_tp_rank), int(p.attn_cp_size), int(p.attn_cp_rank))
    except Exception:  # noqa: BLE001 - older sglang: the getters of dp_attention
        try:
            tp = (int(dpa.get_attention_tp_size()), int(dpa.get_attention_tp_rank()),
                  int(getattr(dpa, "get_attention_cp_size", lambda: 1)()),
                  int(getattr(dpa, "get_attention_cp_rank", lambda: 0)()))
        except Exception:  # noqa: BLE001
            return None
    return tp + dp


def topology_of(kv_args: Any, server_args: Any, mode: str) -> Topology:
    """The worker's attention ranks from its KVArgs and sglang's ServerArgs.

    :param mode: ``"prefill"`` (``engine_rank`` is the global TP rank) or
        ``"decode"`` (``engine_rank`` is already the attention-TP rank).
    :raises ValueError: sizes that do not divide.
    """
    tp_size = _int(server_args, "tp_size", 1)
    dp_size = _int(server_args, "dp_size", 1)
    cp_size = _int(server_args, "attn_cp_size", 1)
    dp_attn = bool(getattr(server_args, "enable_dp_attention", False))
    engine_rank = _int(kv_args, "engine_rank", 0)
    attn_dp_size = dp_size if dp_attn else 1
    if tp_size % (attn_dp_size * cp_size):
        raise ValueError(f"tp_size {tp_size} is not a multiple of attention DP {attn_dp_size} x CP {cp_size}")
    attn_tp_size = max(tp_size // attn_dp_size // cp_size, 1)
    if mode == "prefill":
        attn_tp_rank = engine_rank % attn_tp_size
        attn_cp_rank = (engine_rank // attn_tp_size) % cp_size
        attn_dp_rank = engine_rank // (attn_tp_size * cp_size) if dp_attn else 0
    else:
        attn_tp_rank, attn_cp_rank, attn_dp_rank = engine_rank % attn_tp_size, 0, 0
    computed = (attn_tp_size, attn_tp_rank, cp_size, attn_cp_rank, attn_dp_size, attn_dp_rank)
    live = _sglang_parallel()
    if live is not None and server_args is not None and live[:4] != computed[:4]:
        log.warning("sglang's parallel state %s differs from the one computed from server_args %s; using sglang's",
                    live, computed)
    if live is not None and server_args is not None:
        computed = live
    system_dp_size = 1 if dp_attn else dp_size
    return Topology(
        attn_tp_size=computed[0], attn_tp_rank=computed[1], attn_cp_size=computed[2], attn_cp_rank=computed[3],
        attn_dp_size=computed[4], attn_dp_rank=computed[5],
        pp_size=_int(server_args, "pp_size", 1), pp_rank=_int(kv_args, "pp_rank", 0),
        system_dp_size=system_dp_size, system_dp_rank=_int(kv_args, "system_dp_rank", 0) if system_dp_size > 1 else 0,
    )


def split_hostport(addr: str) -> Tuple[str, int]:
    """``("host", port)`` of ``host:port`` or ``[v6]:port``.

    :raises ValueError: no port.
    """
    host, sep, port = str(addr).rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def join_hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _loopback_for(host: Optional[str]) -> str:
    if not host or host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host.strip("[]")


def registry_addr(server_args: Any, port: Optional[int] = None) -> Optional[str]:
    """``host:port`` of the bootstrap server this prefill worker registers with.

    As sglang's own managers do: the host of ``dist_init_addr`` for a
    multi-node server (the bootstrap server runs where rank 0 and the
    tokenizer manager run), else ``host``; a wildcard host becomes loopback.
    ``port`` overrides ``disaggregation_bootstrap_port`` (world rank 0's).
    """
    port = port or getattr(server_args, "disaggregation_bootstrap_port", None)
    if not port:
        return None
    dist = getattr(server_args, "dist_init_addr", None)
    if dist:
        host = str(dist)
        try:
            host, _ = split_hostport(host)
        except ValueError:
            host = host.strip("[]")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            try:
                host = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
            except OSError:
                pass
    else:
        host = _loopback_for(getattr(server_args, "host", None))
    return join_hostport(host, int(port))


def advertised_ip(configured: Optional[str], toward: Optional[str]) -> str:
    """The address decode workers use to reach this prefill worker's channel.

    ``configured`` (``KVPROXY_HOST_IP``/``SGLANG_HOST_IP``) wins; else the
    source address of the route toward the bootstrap server ``toward``
    (``host:port``), or, when that is loopback, of the default route (as
    sglang's ``get_local_ip_auto`` picks it); else loopback. No packet is sent.
    """
    if configured:
        return configured.strip().strip("[]")
    targets: List[str] = []
    if toward:
        host, _ = split_hostport(toward)
        try:
            if not ipaddress.ip_address(host).is_loopback:
                targets.append(host)
        except ValueError:
            targets.append(host)
    targets.append("8.8.8.8")
    for host in targets:
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            with socket.socket(fam, socket.SOCK_DGRAM) as s:
                s.connect((host, 9))
                return s.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


def layout_mismatch(mine: Dict[str, Any], theirs: Dict[str, Any], me: str, them: str) -> Optional[str]:
    """The first difference between two layout announces, naming both values, or None.

    An announce has ``attn_tp_size``, ``attn_cp_size``, ``page_size``,
    ``kv_cache_dtype``, ``layers`` ([first, end)), ``kv_item_lens``,
    ``aux_item_lens``, ``is_mla`` (keys missing on either side are skipped).
    """
    names = {
        "attn_tp_size": "attention TP size",
        "attn_cp_size": "attention CP size",
        "pp_size": "pipeline-parallel size",
        "page_size": "page size",
        "kv_cache_dtype": "KV cache dtype",
        "is_mla": "MLA layout",
        "layers": "layer range",
        "kv_item_lens": "KV buffers (bytes per page)",
        "aux_item_lens": "aux buffers (bytes per row)",
    }
    for key, what in names.items():
        if key not in mine or key not in theirs or mine[key] is None or theirs[key] is None:
            continue
        a, b = mine[key], theirs[key]
        if isinstance(a, list):
            a, b = [int(x) for x in a], [int(x) for x in b]
        elif key != "kv_cache_dtype":
            a, b = (bool(a), bool(b)) if key == "is_mla" else (int(a), int(b))
        else:
            a, b = str(a), str(b)
        if a != b:
            def show(v: Any) -> str:
                if key == "layers":
                    return f"[{v[0]}, {v[1]})"
                if isinstance(v, list) and len(v) > 6:
                    return f"{len(v)} x {v[:3]}..."
                return str(v)
            return f"{what} differs: {me} {show(a)}, {them} {show(b)}"
    return None
