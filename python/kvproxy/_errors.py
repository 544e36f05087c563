# SPDX-License-Identifier: BSD-3-Clause
"""Exceptions raised by the kvproxy binding.

Every negative return of libkvproxy becomes one of these. All of them are
:class:`KvproxyError`, itself an :class:`OSError`, so ``e.errno`` holds the
errno the C library returned; ``e.reason`` holds the daemon's (or the
library's) explanation from ``kvp_last_error()`` where there is one.
"""


import errno as _errno
import os
from typing import TYPE_CHECKING, Optional, Type

from ._status import status_errno

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Completion

__all__ = [
    "KvproxyError",
    "ConnectError",
    "Disconnected",
    "ProtocolError",
    "InvalidArgument",
    "RegionError",
    "PeerNotFound",
    "RingFull",
    "TransferError",
]


class KvproxyError(OSError):
    """Base class of every error of the binding.

    Attributes:
        errno: the (positive) errno value, e.g. ``errno.ENOENT``.
        strerror: the full message: what failed, the errno text, the reason.
        reason: the daemon's or library's reason text (``kvp_last_error()``),
            or ``""`` if there is none.
        op: the operation that failed, e.g. ``"register"``.
    """

    def __init__(
        self,
        err: int,
        op: str,
        reason: str = "",
        detail: str = "",
        filename: Optional[str] = None,
    ) -> None:
        text = f"{op}: {os.strerror(err)}" if op else os.strerror(err)
        if detail:
            text += f": {detail}"
        if reason:
            text += f" ({reason})"
        if filename is not None:
            super().__init__(err, text, filename)
        else:
            super().__init__(err, text)
        self.reason = reason
        self.op = op


class ConnectError(KvproxyError):
    """Could not connect to kvproxyd (no daemon on the socket, refused, protocol mismatch)."""


class Disconnected(KvproxyError, ConnectionError):
    """kvproxyd went away (EPIPE): the daemon died or closed this client's connection.

    Completions the daemon posted before it went away are still returned
    first; this is raised once there are none left.
    """


class ProtocolError(KvproxyError):
    """The channel or the control protocol is corrupt or of another ABI version (EPROTO)."""


class InvalidArgument(KvproxyError, ValueError):
    """A call was refused before reaching the daemon (EINVAL): bad segment count, value out of range, ..."""


class RegionError(KvproxyError):
    """Registering or deregistering a region failed; ``reason`` says why (from the daemon)."""


class PeerNotFound(KvproxyError):
    """The node id is not a configured peer of the daemon this client is connected to (ENOENT)."""


class RingFull(KvproxyError):
    """The submission ring is full (EAGAIN): reap completions with poll()/wait() and retry."""


class TransferError(KvproxyError):
    """A transfer completed with a status other than ok (see :meth:`Completion.raise_for_status`).

    Attributes:
        completion: the :class:`Completion` that carried the failure.
        status_name: the transfer status name, e.g. ``"timeout"``.
    """

    def __init__(self, completion: "Completion") -> None:
        err = status_errno(completion.status_name)
        super().__init__(
            err,
            f"transfer {completion.user_id}",
            detail=f"status {completion.status_name} ({completion.status})",
        )
        self.completion = completion
        self.status_name = completion.status_name


def error_for(
    rc: int,
    op: str,
    reason: str = "",
    cls: Type[KvproxyError] = KvproxyError,
    detail: str = "",
    filename: Optional[str] = None,
) -> KvproxyError:
    """The exception for a negative return @p rc of the C API.

    EPIPE, EPROTO and EAGAIN map to their own classes whatever the call
    (but a failed connect stays a ConnectError); everything else becomes
    @p cls.
    """
    err = -rc if rc < 0 else rc
    if err == _errno.EPIPE and cls is not ConnectError:
        cls = Disconnected
        if not reason and not detail:
            detail = "kvproxyd went away"
    elif err == _errno.EPROTO and cls is not ConnectError:
        cls = ProtocolError
    elif err == _errno.EAGAIN:
        cls = RingFull
    return cls(err, op, reason=reason, detail=detail, filename=filename)
