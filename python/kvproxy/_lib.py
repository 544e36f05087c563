# SPDX-License-Identifier: BSD-3-Clause
"""ctypes declarations for libkvproxy (lib/client/kvproxy.h, lib/rings/kvp_rings.h).

Internal module: the public API is in :mod:`kvproxy`. The library is loaded
lazily, on the first call to :func:`load`, so that ``import kvproxy`` and
``help(kvproxy)`` work on a machine without libkvproxy.

Search order for the shared library:

1. ``$KVPROXY_LIB`` (a path to ``libkvproxy.so``); if it is set, nothing else
   is tried.
2. The build tree next to the source tree this package lives in:
   ``<repo>/build/lib/client/libkvproxy.so``.
3. ``ctypes.util.find_library("kvproxy")`` (an installed library).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path
from typing import List, Optional

__all__ = [
    "LibraryNotFoundError",
    "Segment_t",
    "Segment2D_t",
    "XferDesc_t",
    "Cqe_t",
    "load",
    "library_path",
    "ABI_VERSION",
    "NODE_ID_MAX",
    "ADDR_MAX",
    "XFER_SEGS_MAX",
    "PH_MAX",
    "REGION_HOST",
    "CQE_DONE",
    "CQE_LANDED",
    "CQE_FENCE",
]

# ---- constants from kvp_rings.h (the client ABI) ----

ABI_VERSION = 2
NODE_ID_MAX = 32  # including the terminating NUL
ADDR_MAX = 80  # "host:port" of kvp_peer_lookup and kvp_listen_addr, NUL included
XFER_SEGS_MAX = 4096
PH_MAX = 8
REGION_HOST = 0x1
CQE_DONE = 1
CQE_LANDED = 2
CQE_FENCE = 3

# enum kvp_phase, in order
PHASE_NAMES = ("queue", "admit", "post", "wire", "total", "first", "deliver", "e2e")


class LibraryNotFoundError(ImportError):
    """libkvproxy.so could not be found or loaded (see the message for what was tried)."""


class Segment_t(ctypes.Structure):
    """struct kvp_segment."""

    _fields_ = [
        ("src_key", ctypes.c_uint64),
        ("src_off", ctypes.c_uint64),
        ("dst_key", ctypes.c_uint64),
        ("dst_off", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
    ]


class Segment2D_t(ctypes.Structure):
    """struct kvp_segment2d."""

    _fields_ = [
        ("src_key", ctypes.c_uint64),
        ("src_off", ctypes.c_uint64),
        ("dst_key", ctypes.c_uint64),
        ("dst_off", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("count", ctypes.c_uint64),
        ("src_stride", ctypes.c_uint64),
        ("dst_stride", ctypes.c_uint64),
    ]


class XferDesc_t(ctypes.Structure):
    """struct kvp_xfer_desc."""

    _fields_ = [
        ("user_id", ctypes.c_uint64),
        ("peer", ctypes.c_uint16),
        ("timeout_ns", ctypes.c_uint64),
    ]


class Cqe_t(ctypes.Structure):
    """struct kvp_cqe (128 bytes)."""

    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("rsvd0", ctypes.c_uint8),
        ("peer", ctypes.c_uint16),
        ("status", ctypes.c_int32),
        ("user_id", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("dst_key", ctypes.c_uint64),
        ("nseg", ctypes.c_uint32),
        ("detail", ctypes.c_uint16),
        ("rsvd1", ctypes.c_uint16),
        ("phase_ns", ctypes.c_uint64 * PH_MAX),
        ("bad_seg", ctypes.c_uint32),
        ("rsvd2", ctypes.c_uint8 * 20),
    ]


# The same pins as the static_asserts in kvp_rings.h / kvproxy.h.
assert ctypes.sizeof(Segment_t) == 40
assert ctypes.sizeof(Segment2D_t) == 64
assert ctypes.sizeof(XferDesc_t) == 24
assert ctypes.sizeof(Cqe_t) == 128
assert Cqe_t.phase_ns.offset == 40
assert Cqe_t.bad_seg.offset == 104

_c_client_p = ctypes.c_void_p

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _candidates() -> List[str]:
    """Paths tried when $KVPROXY_LIB is not set, in order."""
    here = Path(__file__).resolve().parent  # <repo>/python/kvproxy
    out = [str(here.parent.parent / "build" / "lib" / "client" / "libkvproxy.so")]
    found = ctypes.util.find_library("kvproxy")
    if found:
        out.append(found)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    """Set argtypes/restype of every function the binding uses."""
    P = ctypes.POINTER
    u16, u32, u64 = ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
    c_int, c_char_p = ctypes.c_int, ctypes.c_char_p

    def fn(name: str, restype, *argtypes) -> None:
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = list(argtypes)

    fn("kvp_connect", c_int, c_char_p, u32, u32, P(_c_client_p))
    fn("kvp_close", None, _c_client_p)
    fn("kvp_last_error", c_char_p, _c_client_p)
    fn("kvp_node_id", c_char_p, _c_client_p)
    fn("kvp_max_segments", u32, _c_client_p)
    fn("kvp_region_register", c_int, _c_client_p, c_int, u64, u64, u32, P(u64))
    fn("kvp_region_register_cuda_ipc", c_int, _c_client_p, ctypes.c_void_p, u64, u64, c_int, P(u64))
    fn("kvp_region_deregister", c_int, _c_client_p, u64)
    fn("kvp_peer_lookup", c_int, _c_client_p, c_char_p, P(u16))
    fn("kvp_submit", c_int, _c_client_p, P(XferDesc_t), P(Segment_t), u32)
    fn("kvp_submit2d", c_int, _c_client_p, P(XferDesc_t), P(Segment2D_t), u32)
    fn("kvp_cancel", c_int, _c_client_p, u64)
    fn("kvp_fence", c_int, _c_client_p, u64, u64, u32, u64)
    fn("kvp_poll", c_int, _c_client_p, P(Cqe_t), u32)
    fn("kvp_wait", c_int, _c_client_p, P(Cqe_t), u32, c_int)
    fn("kvp_overflow", u32, _c_client_p)
    fn("kvp_set_wait_spin", c_int, _c_client_p, u32)
    fn("kvp_host_alloc", c_int, ctypes.c_size_t, P(c_int), P(ctypes.c_void_p))
    fn("kvp_host_free", None, c_int, ctypes.c_void_p, ctypes.c_size_t)
    fn("kvp_status_str", c_char_p, c_int)
    fn("kvp_invalid_str", c_char_p, c_int)
    fn("kvp_peer_why_str", c_char_p, c_int)
    fn("kvp_listen_addr", c_int, _c_client_p, c_char_p, ctypes.c_size_t)


def load() -> ctypes.CDLL:
    """Load libkvproxy once and return it.

    :raises LibraryNotFoundError: with every path that was tried and why it failed.
    """
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        env = os.environ.get("KVPROXY_LIB")
        if env:
            tried = [env]
        else:
            tried = _candidates()
        errors = []
        for path in tried:
            # A bare name (from find_library) goes to the dynamic loader as is.
            if os.sep in path and not os.path.exists(path):
                errors.append(f"{path}: does not exist")
                continue
            try:
                lib = ctypes.CDLL(path, use_errno=True)
                _declare(lib)
            except (OSError, AttributeError) as e:
                errors.append(f"{path}: {e}")
                continue
            _lib, _lib_path = lib, path
            return lib
        how = (
            "$KVPROXY_LIB is set"
            if env
            else "set $KVPROXY_LIB to the path of libkvproxy.so, build the C tree "
            "('meson setup build && ninja -C build' in the repository), or install libkvproxy"
        )
        if not errors:
            errors.append("find_library('kvproxy') found nothing")
        elif not env and len(tried) == 1:
            errors.append("find_library('kvproxy') found nothing")
        raise LibraryNotFoundError(
            "cannot load libkvproxy (" + how + "); tried: " + "; ".join(errors)
        )


def library_path() -> Optional[str]:
    """The path (or name) libkvproxy was loaded from, or None if not loaded yet."""
    return _lib_path
