# SPDX-License-Identifier: BSD-3-Clause
"""The address remote kvproxyds dial a node's kvproxyd at, as the engine adapters advertise it.

An adapter's decode side sends this address through the engine's own
bootstrap; the prefill side's kvproxyd dials it when it does not know the
decode node by id (peers by address: no peer lists needed).
"""

from __future__ import annotations

from typing import Optional

__all__ = ["advertised_addr"]

_WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def advertised_addr(listen: Optional[str], configured: Optional[str], host_ip: Optional[str]) -> Optional[str]:
    """The ``"host:port"`` to advertise, or None when none is reachable.

    :param listen: the daemon's listen address (``Client.listen_addr()``), or None.
    :param configured: an explicit address (``KVPROXY_ADDR``): it wins;
        ``"none"`` advertises nothing (remote nodes must list this one).
    :param host_ip: this host's address for a daemon listening on a wildcard
        (``0.0.0.0``, ``[::]``), whose listen address names no host.
    """
    if configured:
        return None if configured == "none" else configured
    if not listen or ":" not in listen:
        return None
    host, _, port = listen.rpartition(":")
    if host in _WILDCARDS:
        if not host_ip:
            return None
        host = f"[{host_ip}]" if ":" in host_ip and not host_ip.startswith("[") else host_ip
    return f"{host}:{port}"
