# SPDX-License-Identifier: BSD-3-Clause
"""Transfer statuses: the numbers of ``enum kvp_status``, the names of libkvproxy.

Why the names are read from the library rather than typed here: they are
lib/rings' table (``kvp_status_str()``), the one kvproxyd keys its
``completions`` counters with and kvproxyctl orders its columns by, so a
name the binding reports is always the name the daemon and the CLI use.
The library is loaded on first use (not at import), so each table is built
on first use too. The numbers are the ABI, like the ctypes structures of
``_lib``: :class:`Status` spells them for Python code, and
``python/tests/test_status.py`` fails when it and the library's table drift.
"""

import enum
import errno
from typing import Dict, Optional

from . import _lib

__all__ = ["Status", "status_name", "status_names", "status_errno", "invalid_detail", "peer_detail"]

# kvp_status_str() answers this for a number outside the table.
_UNKNOWN = "unknown"
# More statuses than enum kvp_status will ever hold (its values fit a byte of the CQE's int32).
_SCAN_MAX = 256


class Status(enum.IntEnum):
    """Transfer status of a completion (enum kvp_status). 0 is success."""

    OK = 0  #: every byte landed and was acknowledged
    INVALID = 1  #: bad descriptor: unknown region, out of bounds, bad length
    NO_BUFFERS = 2  #: no staging buffers / send window within admission_timeout
    TIMEOUT = 3  #: the transfer's deadline passed
    PEER = 4  #: peer unreachable, dead, or the connection was lost
    CANCELED = 5  #: cancelled by the client or the admin
    REMOTE = 6  #: the destination node refused the data (e.g. unknown dst key)
    SHUTDOWN = 7  #: the node is draining or stopping
    NO_PEER = 8  #: the destination peer index is not configured


# The errno a failed transfer's TransferError carries, by status. Keyed by
# number; status_errno() looks it up by the library's name of that number.
_ERRNO: Dict[int, int] = {
    Status.INVALID: errno.EINVAL,
    Status.NO_BUFFERS: errno.ENOBUFS,
    Status.TIMEOUT: errno.ETIMEDOUT,
    Status.PEER: errno.EHOSTUNREACH,
    Status.CANCELED: errno.ECANCELED,
    Status.REMOTE: errno.EREMOTEIO,
    Status.SHUTDOWN: errno.ESHUTDOWN,
    Status.NO_PEER: errno.ENOENT,
}

_names: Optional[Dict[int, str]] = None
_errno_by_name: Optional[Dict[str, int]] = None


def status_name(status: int) -> str:
    """The daemon's name of a transfer status: ``"ok"``, ``"invalid"``, ``"timeout"``, ...

    Unknown values give ``"unknown"``.
    """
    raw = _lib.load().kvp_status_str(int(status))
    return raw.decode() if raw else _UNKNOWN


def status_names() -> Dict[int, str]:
    """Every status the loaded libkvproxy names, number -> name, in order (its whole table)."""
    global _names
    if _names is None:
        names: Dict[int, str] = {}
        for s in range(_SCAN_MAX):
            name = status_name(s)
            if name == _UNKNOWN:
                break
            names[s] = name
        _names = names
    return dict(_names)


def status_errno(name: str) -> int:
    """The errno of a failed transfer whose status has this (library) name; EIO for any other."""
    global _errno_by_name
    if _errno_by_name is None:
        _errno_by_name = {status_name(s): e for s, e in _ERRNO.items()}
    return _errno_by_name.get(name, errno.EIO)


def invalid_detail(detail: int) -> str:
    """What a completion's ``invalid`` detail code means, in the daemon's words (``""`` for none)."""
    raw = _lib.load().kvp_invalid_str(int(detail))
    return raw.decode() if raw else ""


def peer_detail(detail: int) -> str:
    """Why a transfer failed with ``peer`` or ``no-peer`` (enum kvp_peer_why), in the
    daemon's words (``""`` where it did not say)."""
    raw = _lib.load().kvp_peer_why_str(int(detail))
    return raw.decode() if raw else ""
