# SPDX-License-Identifier: BSD-3-Clause
"""Python binding of libkvproxy, the client library of the kvproxy KV-cache sidecar.

A worker connects to its local ``kvproxyd`` (a :class:`Client`), registers
memory as regions (:meth:`Client.register`), and submits transfers of
segments from its regions into a peer node's region (:meth:`Client.submit`).
Completions come back on a shared-memory ring (:meth:`Client.poll`,
:meth:`Client.wait`): ``done`` on the submitting client when the destination
has acknowledged every byte, ``landed`` on the client that owns the
destination region.

Decode side (owns the destination)::

    import kvproxy

    with kvproxy.Client("/run/kvproxy/decode0.sock") as c, \\
         kvproxy.HostBuffer(64 << 20) as buf, c.register(buf) as region:
        publish(region.key)                     # hand the key to prefill (your bootstrap)
        for comp in c.wait(timeout=30):
            if comp.kind == "landed":
                comp.raise_for_status()
                use(memoryview(buf)[:comp.bytes])

Prefill side (owns the source)::

    with kvproxy.Client("/run/kvproxy/prefill0.sock") as c, \\
         kvproxy.HostBuffer(64 << 20) as buf, c.register(buf) as src:
        buf[:4] = b"KV!!"
        peer = c.peer("decode0")
        c.submit(peer, [kvproxy.Segment(src.key, 0, dst_key, 0, len(buf))], user_id=1)
        done = [x for x in c.wait(timeout=30) if x.kind == "done"]
        print(done[0].status_name, done[0].phases)

Errors: every negative return of the C library raises a :class:`KvproxyError`
(an :class:`OSError` with ``errno`` and the daemon's ``reason``), or one of
its subclasses: :class:`ConnectError`, :class:`Disconnected` (EPIPE: the
daemon went away), :class:`RegionError`, :class:`PeerNotFound`,
:class:`RingFull` (EAGAIN from submit: reap completions and retry),
:class:`InvalidArgument` (also a :class:`ValueError`), :class:`ProtocolError`.
A transfer that fails in the daemon is not an exception: its completion
carries the status (``status_name`` ``"invalid"``, ``"timeout"``,
``"remote"``, ...); :meth:`Completion.raise_for_status` turns it into a
:class:`TransferError`.

``kvproxy.sglang`` (imported on its own) is a transfer backend for sglang's
prefill/decode disaggregation on top of this binding.

The shared library is found through ``$KVPROXY_LIB``, else the source tree's
``build/lib/client/libkvproxy.so``, else ``ctypes.util.find_library``; it is
loaded on first use, and :class:`LibraryNotFoundError` says what was tried.
"""

from ._buffer import HostBuffer
from ._client import Client, Completion, Region, Segment, Segment2D, Status, status_name
from ._errors import (
    ConnectError,
    Disconnected,
    InvalidArgument,
    KvproxyError,
    PeerNotFound,
    ProtocolError,
    RegionError,
    RingFull,
    TransferError,
)
from ._lib import LibraryNotFoundError, library_path

__version__ = "0.1.0"

__all__ = [
    "Client",
    "HostBuffer",
    "Region",
    "Segment",
    "Segment2D",
    "Completion",
    "Status",
    "status_name",
    "library_path",
    "KvproxyError",
    "ConnectError",
    "Disconnected",
    "ProtocolError",
    "InvalidArgument",
    "RegionError",
    "PeerNotFound",
    "RingFull",
    "TransferError",
    "LibraryNotFoundError",
]

# Public names report this package as their home (help(), reprs, tracebacks).
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("kvproxy."):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
