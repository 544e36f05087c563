# SPDX-License-Identifier: BSD-3-Clause
"""Client, Region, Segment, Completion: the binding of lib/client/kvproxy.h."""


import ctypes
import errno
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

from . import _lib
from ._buffer import HostBuffer
from ._errors import (
    ConnectError,
    InvalidArgument,
    KvproxyError,
    PeerNotFound,
    RegionError,
    TransferError,
    error_for,
)
from ._status import Status, invalid_detail, peer_detail, status_name

__all__ = [
    "Client",
    "Region",
    "Segment",
    "Segment2D",
    "Completion",
    "Status",
    "status_name",
]

_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1
# kvp_set_wait_spin(): KVP_WAIT_SPIN_AUTO, and the largest fixed spin it takes.
_WAIT_SPIN_AUTO = _U32_MAX
_WAIT_SPIN_MAX_US = 1000000
# kvp_wait() is called in slices of at most this long, so that Ctrl-C, close()
# from another thread and a finite timeout are all noticed promptly.
_WAIT_SLICE_MS = 200


def _check_u64(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _U64_MAX:
        raise InvalidArgument(errno.EINVAL, "", detail=f"{name} {value} is outside [0, 2**64)")
    return value


class Segment(NamedTuple):
    """One segment of a transfer: ``length`` bytes from ``src_off`` of region
    ``src_key`` (local) land at ``dst_off`` of region ``dst_key`` (on the peer).

    A plain 5-tuple in this order is accepted wherever a Segment is.
    """

    src_key: int
    src_off: int
    dst_key: int
    dst_off: int
    length: int


class Segment2D(NamedTuple):
    """A strided segment: ``count`` blocks of ``length`` bytes, block ``i``
    from ``src_off + i * src_stride`` of ``src_key`` to ``dst_off + i *
    dst_stride`` of ``dst_key`` (a 2-D copy: e.g. one KV head of every token
    of a page). One descriptor however many blocks; kvproxyd walks them.
    Strides are at least ``length``.

    An 8-tuple in this order is accepted wherever a Segment2D is.
    """

    src_key: int
    src_off: int
    dst_key: int
    dst_off: int
    length: int
    count: int
    src_stride: int
    dst_stride: int


SegmentLike = Union[Segment, Segment2D, Tuple[int, ...]]

_PHASES = _lib.PHASE_NAMES


@dataclass(frozen=True)
class Completion:
    """One completion read from the completion ring.

    Attributes:
        kind: ``"done"`` (a transfer this client submitted has ended),
            ``"landed"`` (a transfer into one of this client's regions has
            landed) or ``"fence"`` (a fence of :meth:`Client.fence` holds:
            ``user_id`` is its fence id, ``bytes`` what it refused so far).
        status: the transfer status (a :class:`Status`; 0 is ok).
        status_name: its name (``"ok"``, ``"invalid"``, ``"timeout"``, ``"remote"``, ...).
        ok: ``status == 0``.
        user_id: the submitter's transfer id (also on ``landed``).
        peer: ``done``: the destination peer index; ``landed``: the source peer index.
        bytes: payload bytes moved.
        nseg: segments in the transfer.
        dst_key: ``landed``: the destination region of the first segment (0 on ``done``).
        detail: on a ``done`` with status ``invalid``: what was wrong with
            the descriptor; with ``peer`` or ``no-peer``: why the peer could not
            be had where the daemon knew it (not connected within its
            ``timeouts.connect_ms``, authentication failed, removed, ...);
            the daemon's words, else ``""``.
        bad_seg: on a ``done`` with status ``invalid``: the index of the
            segment at fault.
        phases: seconds spent per phase (0 where a phase did not happen). On
            ``done``: ``queue`` (submit -> daemon pickup), ``admit`` (pickup ->
            admitted), ``first`` (admitted -> first byte handed to the
            transport), ``post`` (admitted -> last byte handed to the
            transport), ``wire`` (-> acknowledged by the destination),
            ``deliver`` (acknowledged -> completion posted), ``total`` (pickup
            -> completion posted) and ``e2e`` (submit -> completion posted);
            queue + admit + post + wire + deliver == e2e. On ``landed``:
            ``wire`` (first byte received -> last byte landed), ``deliver``
            (landed -> notice posted) and ``total``.
    """

    kind: str
    status: int
    status_name: str
    ok: bool
    user_id: int
    peer: int
    bytes: int
    nseg: int
    dst_key: int
    phases: Dict[str, float] = field(default_factory=dict, hash=False)
    detail: str = ""
    bad_seg: int = 0

    @classmethod
    def _from_cqe(cls, e: _lib.Cqe_t) -> "Completion":
        kind = {_lib.CQE_DONE: "done", _lib.CQE_LANDED: "landed", _lib.CQE_FENCE: "fence"}.get(
            e.kind, f"unknown({e.kind})")
        try:
            status: int = Status(e.status)
        except ValueError:
            status = int(e.status)
        return cls(
            kind=kind,
            status=status,
            status_name=status_name(e.status),
            ok=e.status == 0,
            user_id=e.user_id,
            peer=e.peer,
            bytes=e.bytes,
            nseg=e.nseg,
            dst_key=e.dst_key,
            phases={name: e.phase_ns[i] / 1e9 for i, name in enumerate(_PHASES)},
            detail=(invalid_detail(e.detail) if e.status == Status.INVALID
                    else peer_detail(e.detail) if e.status in (Status.PEER, Status.NO_PEER) else ""),
            bad_seg=e.bad_seg if e.status == Status.INVALID else 0,
        )

    def raise_for_status(self) -> "Completion":
        """Return self if the transfer succeeded, else raise :class:`TransferError`."""
        if not self.ok:
            raise TransferError(self)
        return self


class Region:
    """A registered region: memory the daemon has mapped, named by :attr:`key`.

    Returned by :meth:`Client.register`. Use it as a context manager to
    deregister on exit, or call :meth:`deregister`.

    Attributes:
        key: the 64-bit region key (name it in segments, or hand it to a
            prefill node when this is a destination).
        offset: offset into the fd where the region starts.
        length: region length in bytes.
        buffer: the :class:`HostBuffer` it was registered from, or None for a raw fd.
    """

    def __init__(
        self, client: "Client", key: int, offset: int, length: int, buffer: Optional[HostBuffer]
    ) -> None:
        self._client = client
        self.key = key
        self.offset = offset
        self.length = length
        self.buffer = buffer
        self._registered = True

    @property
    def registered(self) -> bool:
        """False once :meth:`deregister` succeeded (or the client was closed)."""
        return self._registered and not self._client.closed

    def deregister(self) -> None:
        """Deregister the region from the daemon.

        Each call goes to the daemon, so a second call raises the daemon's
        refusal.

        :raises RegionError: e.g. ``errno.ENOENT`` (not this client's key, or
            already deregistered) or ``errno.EBUSY`` (transfers still use it).
        """
        self._client.deregister(self.key)
        self._registered = False

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc: Any) -> None:
        # The daemon reclaims every region of a closed client by itself.
        if self.registered:
            self.deregister()

    def __repr__(self) -> str:
        state = "" if self.registered else " deregistered"
        return f"<kvproxy.Region key={self.key:#018x} offset={self.offset} length={self.length}{state}>"


class Client:
    """A connection to the local kvproxyd: regions, transfers, completions.

    ``Client(socket_path)`` connects to the daemon's ``client_socket`` and maps
    the shared-memory channel (a submission ring and a completion ring).
    Close it with :meth:`close` or use it as a context manager; the daemon
    then reclaims its regions and in-flight transfers.

    Threading: one thread may submit (:meth:`submit`, :meth:`cancel`) while
    another reaps (:meth:`poll`, :meth:`wait`); control calls (register,
    deregister, peer) may come from any thread. The binding serialises each
    of the three groups with a lock, so misuse costs waiting, not corruption.
    Blocking calls release the GIL.

    Attributes:
        socket_path: the socket this client connected to.
    """

    def __init__(self, socket_path: Union[str, os.PathLike], sq_entries: int = 0, cq_entries: int = 0) -> None:
        """Connect to kvproxyd.

        :param socket_path: the daemon's client socket (``client_socket`` in its config).
        :param sq_entries: submission ring entries (a power of two), 0 = the daemon's default.
        :param cq_entries: completion ring entries (a power of two), 0 = the daemon's default.
        :raises ConnectError: no daemon listens (``errno.ENOENT``, ``errno.ECONNREFUSED``),
            the daemon refused this client (``errno.EUSERS``: ``limits.max_clients``
            reached; ``errno.EMFILE``: it is out of file descriptors; ``errno.EPERM``:
            not allowed), did not answer within libkvproxy's connect bound
            (``errno.ETIMEDOUT``), hung up (``errno.EPIPE``), refused the ring
            sizes, or speaks another ABI version.
        :raises InvalidArgument: a ring size is not 0 or a power of two.
        """
        self._ptr: Optional[int] = None
        self.socket_path = os.fspath(socket_path)
        for name, v in (("sq_entries", sq_entries), ("cq_entries", cq_entries)):
            _check_u64(name, v)
            if v != 0 and (v < 2 or v > _U32_MAX or v & (v - 1)):
                raise InvalidArgument(
                    errno.EINVAL, "connect", detail=f"{name} must be 0 or a power of two >= 2, got {v}"
                )
        lib = _lib.load()
        self._lib = lib
        out = ctypes.c_void_p()
        rc = lib.kvp_connect(os.fsencode(self.socket_path), sq_entries, cq_entries, ctypes.byref(out))
        if rc < 0:
            err = -rc
            detail = ""
            if err in (errno.ENOENT, errno.ECONNREFUSED):
                detail = "is kvproxyd running with this client_socket?"
            elif err == errno.ENAMETOOLONG:
                detail = "socket path is empty or too long for a UNIX socket"
            elif err == errno.EINVAL:
                detail = "kvproxyd refused the connection (ring sizes too large?)"
            elif err == errno.EPROTO:
                detail = "kvproxyd speaks another protocol or ABI version"
            elif err == errno.EUSERS:
                detail = "kvproxyd serves no more clients (limits.max_clients reached)"
            elif err == errno.EMFILE:
                detail = "kvproxyd is out of file descriptors (RLIMIT_NOFILE); see its log"
            elif err == errno.EPERM:
                detail = "kvproxyd does not serve this user (not its user, root or client_group)"
            elif err == errno.ETIMEDOUT:
                detail = "kvproxyd did not answer in time (stopped or stuck?)"
            elif err == errno.EPIPE:
                detail = "kvproxyd closed the connection (see its log)"
            raise error_for(rc, "connect to kvproxyd", cls=ConnectError, detail=detail, filename=self.socket_path)
        self._ptr = out.value
        self._node_id = (lib.kvp_node_id(self._ptr) or b"").decode(errors="replace")
        self._max_segments = int(lib.kvp_max_segments(self._ptr))
        self._finalizer = weakref.finalize(self, lib.kvp_close, ctypes.c_void_p(self._ptr))
        self._ctrl_lock = threading.Lock()
        self._sq_lock = threading.Lock()
        self._cq_lock = threading.Lock()
        self._cqes = (_lib.Cqe_t * 64)()
        self._peers: Dict[str, int] = {}
        self._closing = False
        # Odd while a control call is in progress; see wait().
        self._ctrl_gen = 0

    # ---- lifetime ----

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._ptr is None

    def close(self) -> None:
        """Disconnect (idempotent). The daemon reclaims this client's regions,
        channel and in-flight transfers. Waits for calls in other threads to
        return (a blocking :meth:`wait` notices within a fraction of a second).
        """
        if self._ptr is None:
            return
        # Makes wait() loops in other threads stop re-taking the lock.
        self._closing = True
        with self._ctrl_lock, self._sq_lock, self._cq_lock:
            if self._ptr is None:
                return
            self._ptr = None
            self._finalizer()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._ptr is None:
            return f"<kvproxy.Client closed socket={self.socket_path!r}>"
        return f"<kvproxy.Client node_id={self._node_id!r} socket={self.socket_path!r}>"

    def _handle(self, op: str) -> int:
        ptr = self._ptr
        if ptr is None or self._closing:
            raise KvproxyError(errno.EBADF, op, detail="the client is closed")
        return ptr

    def _reason(self, ptr: int) -> str:
        raw = self._lib.kvp_last_error(ptr)
        return raw.decode(errors="replace") if raw else ""

    # ---- properties ----

    @property
    def node_id(self) -> str:
        """Name of the node (kvproxyd) this client is connected to."""
        return self._node_id

    @property
    def max_segments(self) -> int:
        """Most segments one :meth:`submit` accepts (the daemon's limit, bounded by the ring)."""
        return self._max_segments

    @property
    def overflow(self) -> int:
        """Landing notices the daemon had to drop (a full completion ring, or a full
        ring between two of its workers); a submitted transfer's completion is never dropped."""
        return int(self._lib.kvp_overflow(self._handle("overflow")))

    # ---- control calls ----

    def register(
        self, buf_or_fd: Union[HostBuffer, int, Any], offset: int = 0, length: Optional[int] = None
    ) -> Region:
        """Register ``[offset, offset + length)`` of a buffer or fd as a region.

        :param buf_or_fd: a :class:`HostBuffer`, a shareable fd (memfd, shm,
            hugetlbfs) as an int, or any object with ``fileno()``.
        :param offset: byte offset into the buffer/fd.
        :param length: bytes to register; None = to the end of the buffer/fd.
        :returns: the :class:`Region`; its ``key`` names it in segments.
        :raises RegionError: the daemon refused (range beyond the fd, region
            table full, ...); ``reason`` is the daemon's text.
        :raises Disconnected: the daemon went away.
        """
        buffer = buf_or_fd if isinstance(buf_or_fd, HostBuffer) else None
        if isinstance(buf_or_fd, int) and not isinstance(buf_or_fd, bool):
            fd = buf_or_fd
        elif hasattr(buf_or_fd, "fileno"):
            fd = buf_or_fd.fileno()
        else:
            raise TypeError(f"register() needs a HostBuffer, an fd or an object with fileno(), not {type(buf_or_fd).__name__}")
        _check_u64("offset", offset)
        if length is None:
            size = len(buffer) if buffer is not None else os.fstat(fd).st_size
            if offset >= size:
                raise InvalidArgument(
                    errno.EINVAL, "register", detail=f"offset {offset} is not below the size {size} of the buffer/fd"
                )
            length = size - offset
        _check_u64("length", length)
        key = ctypes.c_uint64()
        with self._ctrl_lock:
            ptr = self._handle("register")
            self._ctrl_gen += 1
            try:
                rc = self._lib.kvp_region_register(ptr, fd, offset, length, _lib.REGION_HOST, ctypes.byref(key))
            finally:
                self._ctrl_gen += 1
            if rc < 0:
                raise error_for(rc, "register", self._reason(ptr), cls=RegionError, detail=f"offset {offset} length {length}")
        return Region(self, key.value, offset, length, buffer)

    def register_cuda(self, tensor_or_ptr: Any, length: Optional[int] = None, device: Optional[int] = None) -> Region:
        """Register GPU memory: a CUDA tensor (anything with ``data_ptr()``,
        e.g. a PyTorch tensor) or a raw device pointer.

        The binding obtains the allocation's CUDA IPC handle itself through
        the CUDA runtime (``cudaIpcGetMemHandle``), so callers never touch CUDA
        APIs. The region starts at the pointer and spans ``length`` bytes
        (default: the tensor's ``numel() * element_size()``). The memory must
        stay allocated until the region is deregistered.

        :raises RegionError: the daemon refused (no CUDA driver or GPU there,
            handle not importable, region larger than the allocation), with
            the daemon's reason.
        :raises KvproxyError: the CUDA runtime could not be loaded or the
            pointer is not device memory.
        """
        from . import _cuda

        ptr, length, device = _cuda.describe(tensor_or_ptr, length, device)
        handle, base = _cuda.ipc_handle(ptr, device)
        # An IPC handle names a whole allocation; the region starts at the
        # tensor, ``ptr - base`` bytes into it.
        offset = ptr - base
        key = ctypes.c_uint64()
        buf = ctypes.create_string_buffer(bytes(handle), 64)
        with self._ctrl_lock:
            cptr = self._handle("register_cuda")
            self._ctrl_gen += 1
            try:
                rc = self._lib.kvp_region_register_cuda_ipc(cptr, buf, offset, length, device, ctypes.byref(key))
            finally:
                self._ctrl_gen += 1
            if rc < 0:
                raise error_for(rc, "register_cuda", self._reason(cptr), cls=RegionError,
                                detail=f"device {device} length {length}")
        return Region(self, key.value, 0, length, None)

    def deregister(self, key: Union[int, Region]) -> None:
        """Deregister a region by key (or :class:`Region`); see :meth:`Region.deregister`.

        :raises RegionError: ``errno.ENOENT`` (not this client's key),
            ``errno.EBUSY`` (transfers still use it), with the daemon's reason.
        """
        if isinstance(key, Region):
            key.deregister()
            return
        _check_u64("key", key)
        with self._ctrl_lock:
            ptr = self._handle("deregister")
            self._ctrl_gen += 1
            try:
                rc = self._lib.kvp_region_deregister(ptr, key)
            finally:
                self._ctrl_gen += 1
            if rc < 0:
                raise error_for(rc, "deregister", self._reason(ptr), cls=RegionError, detail=f"key {key:#018x}")

    def peer(self, node_id: str) -> int:
        """The peer index of a peer node (for :meth:`submit`), by node id or by address.

        ``node_id`` is a node id of the daemon's peer table (configured,
        added, or learned), or the ``"host:port"`` a remote kvproxyd listens
        on (its :meth:`listen_addr`): an address no peer has is dialled on
        demand, authenticated, and kept as a peer. This returns at once; the
        first transfer waits for the connection (up to the daemon's
        ``timeouts.connect_ms``) and fails with ``peer`` and the reason in
        :attr:`Completion.detail` if it cannot be had. An index stays valid
        while the peer is in the table: after a ``no-peer`` completion, look
        it up again (an address finds the node now there).

        :raises PeerNotFound: ``node_id`` is not a peer of the daemon.
        :raises KvproxyError: the address is malformed or the daemon's own
            (EINVAL), its peer table is full (ENOSPC), or the daemon is too
            old for addresses (EOPNOTSUPP); ``reason`` says which.
        """
        if not isinstance(node_id, str):
            raise TypeError(f"node_id must be a str, not {type(node_id).__name__}")
        raw = node_id.encode()
        limit = _lib.ADDR_MAX if ":" in node_id else _lib.NODE_ID_MAX
        if not raw or b"\0" in raw or len(raw) >= limit:
            raise InvalidArgument(
                errno.EINVAL, "peer", detail=f"node id or address {node_id!r} is empty, contains NUL or is longer than {limit - 1} bytes"
            )
        idx = ctypes.c_uint16()
        with self._ctrl_lock:
            ptr = self._handle("peer")
            self._ctrl_gen += 1
            try:
                rc = self._lib.kvp_peer_lookup(ptr, raw, ctypes.byref(idx))
            finally:
                self._ctrl_gen += 1
            if rc < 0:
                cls = PeerNotFound if rc == -errno.ENOENT else KvproxyError
                raise error_for(rc, f"peer {node_id!r}", self._reason(ptr), cls=cls)
            self._peers[node_id] = idx.value
        return idx.value

    def listen_addr(self) -> str:
        """The ``"host:port"`` this client's kvproxyd listens on for peers: what a
        remote client names it by in :meth:`peer`. A wildcard host (``0.0.0.0``,
        ``[::]``) must be replaced by one the remote can reach.

        :raises KvproxyError: EOPNOTSUPP from a daemon older than peers by address.
        """
        buf = ctypes.create_string_buffer(_lib.ADDR_MAX)
        with self._ctrl_lock:
            ptr = self._handle("listen_addr")
            self._ctrl_gen += 1
            try:
                rc = self._lib.kvp_listen_addr(ptr, buf, _lib.ADDR_MAX)
            finally:
                self._ctrl_gen += 1
            if rc < 0:
                raise error_for(rc, "listen_addr", self._reason(ptr))
        return buf.value.decode()

    def forget_peer(self, name: str) -> None:
        """Drop the index :meth:`submit` cached for ``name`` (after a ``no-peer``
        completion: the next submit looks it up again)."""
        self._peers.pop(name, None)

    # ---- data path ----

    def submit(
        self,
        peer: Union[int, str],
        segments: Iterable[SegmentLike],
        user_id: int,
        timeout: Optional[float] = None,
    ) -> None:
        """Submit one transfer: every segment moves to ``peer``, one ``done``
        completion (with ``user_id``) follows on this client, and a ``landed``
        one on the destination region's client.

        The source memory belongs to kvproxy until the ``done`` completion has
        been read: do not modify it before.

        :param peer: a peer index from :meth:`peer`, or the peer's node id (looked up once).
        :param segments: :class:`Segment` objects or 5-tuples
            ``(src_key, src_off, dst_key, dst_off, length)``, and
            :class:`Segment2D` objects or 8-tuples (strided); 1 to
            :attr:`max_segments`.
        :param user_id: your id for the transfer (unique among those in flight), echoed in completions.
        :param timeout: deadline in seconds from now; None = the daemon's default.
        :raises RingFull: the submission ring is full; reap completions and retry.
        :raises InvalidArgument: no segments, more than :attr:`max_segments`, or a
            value out of range (checked here; nothing is submitted).
        :raises PeerNotFound: ``peer`` is a node id that is not configured.

        Bad descriptors the library cannot see (unknown keys, out-of-bounds
        offsets, zero lengths) are reported by the daemon as a ``done``
        completion with status ``invalid`` or ``remote``.
        """
        if isinstance(peer, str):
            pidx = self._peers.get(peer)
            if pidx is None:
                pidx = self.peer(peer)
        elif isinstance(peer, int) and not isinstance(peer, bool):
            if not 0 <= peer <= 0xFFFF:
                raise InvalidArgument(errno.EINVAL, "submit", detail=f"peer index {peer} is outside [0, 65535]")
            pidx = peer
        else:
            raise TypeError(f"peer must be an int index or a str node id, not {type(peer).__name__}")
        _check_u64("user_id", user_id)
        if timeout is None:
            timeout_ns = 0
        else:
            if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0 or math.isinf(timeout):
                raise InvalidArgument(errno.EINVAL, "submit", detail=f"timeout must be a finite number of seconds > 0 or None, got {timeout!r}")
            timeout_ns = min(max(1, math.ceil(timeout * 1e9)), _U64_MAX)
        segs = list(segments)
        n = len(segs)
        if n == 0 or n > self._max_segments:
            raise InvalidArgument(
                errno.EINVAL, "submit", detail=f"{n} segments; a transfer takes 1 to {self._max_segments} on {self._node_id}"
            )
        two_d = any(len(s) == 8 for s in segs if isinstance(s, tuple))
        arr = (_lib.Segment2D_t * n)() if two_d else (_lib.Segment_t * n)()
        for i, s in enumerate(segs):
            if not isinstance(s, tuple) or len(s) not in (5, 8):
                raise TypeError(f"segment {i} is not a Segment, a Segment2D, a 5- or an 8-tuple: {s!r}")
            d = arr[i]
            for name, value in zip(("src_key", "src_off", "dst_key", "dst_off", "len"), s[:5]):
                setattr(d, name, _check_u64(f"segment {i} {name}", value))
            if not two_d:
                continue
            count, sstride, dstride = s[5:] if len(s) == 8 else (1, 0, 0)
            if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= _U32_MAX:
                raise InvalidArgument(errno.EINVAL, "submit", detail=f"segment {i}: count {count!r} is outside [1, 2**32)")
            d.count = count
            d.src_stride = _check_u64(f"segment {i} src_stride", sstride)
            d.dst_stride = _check_u64(f"segment {i} dst_stride", dstride)
        desc = _lib.XferDesc_t(user_id=user_id, peer=pidx, timeout_ns=timeout_ns)
        with self._sq_lock:
            ptr = self._handle("submit")
            submit = self._lib.kvp_submit2d if two_d else self._lib.kvp_submit
            rc = submit(ptr, ctypes.byref(desc), arr, n)
        if rc < 0:
            cls = InvalidArgument if rc == -errno.EINVAL else KvproxyError
            detail = "submission ring full" if rc == -errno.EAGAIN else ""
            raise error_for(rc, f"submit {user_id}", cls=cls, detail=detail)

    def cancel(self, user_id: int) -> None:
        """Ask the daemon to cancel the in-flight transfer ``user_id``.

        Its ``done`` completion (status ``canceled``, or whatever it ended
        with first) follows. Cancelling an id that is not in flight does nothing.

        :raises RingFull: the submission ring is full; reap completions and retry.
        """
        _check_u64("user_id", user_id)
        with self._sq_lock:
            ptr = self._handle("cancel")
            rc = self._lib.kvp_cancel(ptr, user_id)
        if rc < 0:
            raise error_for(rc, f"cancel {user_id}", detail="submission ring full" if rc == -errno.EAGAIN else "")

    def fence(self, value: int, mask: int, fence_id: int, hold: Optional[float] = None) -> None:
        """Fence the transfers landing in this client's regions whose user id
        matches ``(user_id & mask) == (value & mask)``: from now on kvproxyd
        drops their bytes instead of writing them (the senders' transfers
        fail with ``remote``). A ``fence`` completion with ``user_id ==
        fence_id`` follows once nothing of them can land any more (bounded by
        the daemon's ``timeouts.peer_ms``); its status is ``ok``, or
        ``no-buffers`` when the daemon's fence table or this client's share
        of it (``limits.client_fences``) was full (nothing was fenced),
        ``invalid`` for a hold above ``timeouts.fence_hold_max_ms``, or
        ``timeout`` if it could not be made to hold.

        :param hold: seconds the fence keeps refusing matching transfers; None
            = the daemon's ``timeouts.fence_hold_ms``.
        :raises RingFull: the submission ring is full; reap completions and retry.
        :raises InvalidArgument: ``mask`` is 0, or a value is out of range.
        """
        _check_u64("value", value)
        _check_u64("mask", mask)
        _check_u64("fence_id", fence_id)
        if mask == 0:
            raise InvalidArgument(errno.EINVAL, "fence", detail="mask 0 would fence every transfer")
        if hold is None:
            hold_ms = 0
        else:
            if not isinstance(hold, (int, float)) or isinstance(hold, bool) or not hold > 0 or math.isinf(hold):
                raise InvalidArgument(errno.EINVAL, "fence", detail=f"hold must be a finite number of seconds > 0 or None, got {hold!r}")
            hold_ms = min(max(1, math.ceil(hold * 1000)), _U32_MAX)
        with self._sq_lock:
            ptr = self._handle("fence")
            rc = self._lib.kvp_fence(ptr, value, mask, hold_ms, fence_id)
        if rc < 0:
            raise error_for(rc, f"fence {fence_id}", detail="submission ring full" if rc == -errno.EAGAIN else "")

    def _cqe_buf(self, max: int) -> ctypes.Array:
        if not isinstance(max, int) or isinstance(max, bool) or not 1 <= max <= _U32_MAX:
            raise InvalidArgument(errno.EINVAL, "", detail=f"max must be an int >= 1, got {max!r}")
        if len(self._cqes) < max:
            self._cqes = (_lib.Cqe_t * max)()
        return self._cqes

    def poll(self, max: int = 64) -> List[Completion]:
        """Reap up to ``max`` completions without blocking (an empty list if none).

        :raises ProtocolError: the channel is corrupt.
        """
        with self._cq_lock:
            ptr = self._handle("poll")
            buf = self._cqe_buf(max)
            n = self._lib.kvp_poll(ptr, buf, max)
            if n < 0:
                raise error_for(n, "poll")
            return self._completions(buf, n)

    def _completions(self, buf: Any, n: int) -> List[Completion]:
        out = [Completion._from_cqe(buf[i]) for i in range(n)]
        # A peer that left the table: the names submit() cached for it name nothing now.
        gone = {c.peer for c in out if c.kind == "done" and c.status == Status.NO_PEER}
        if gone:
            for name in [k for k, v in list(self._peers.items()) if v in gone]:
                self._peers.pop(name, None)
        return out

    def wait(self, timeout: Optional[float] = None, max: int = 64) -> List[Completion]:
        """Block until at least one completion is there, then reap up to ``max``.

        :param timeout: seconds; None = no limit; 0 = just poll (like
            :meth:`poll`, which does not look at the socket, so it cannot
            notice that the daemon died: use a timeout > 0 for that).
        :returns: the completions; an empty list if ``timeout`` passed first.
        :raises Disconnected: the daemon went away (``errno.EPIPE``) and no
            completions it posted before are left.
        :raises ProtocolError: the channel or control socket is corrupt.
        """
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0 or math.isnan(timeout)):
            raise InvalidArgument(errno.EINVAL, "wait", detail=f"timeout must be None or seconds >= 0, got {timeout!r}")
        deadline = None if timeout is None or math.isinf(timeout) else time.monotonic() + timeout
        while True:
            if deadline is None:
                slice_ms = _WAIT_SLICE_MS
            else:
                left = deadline - time.monotonic()
                slice_ms = 0 if left <= 0 else min(_WAIT_SLICE_MS, math.ceil(left * 1000))
            if self._closing:
                self._handle("wait")  # raises: closed while we waited
            with self._cq_lock:
                ptr = self._handle("wait")
                buf = self._cqe_buf(max)
                gen = self._ctrl_gen
                n = self._lib.kvp_wait(ptr, buf, max, slice_ms)
                if n == -errno.EPROTO and (gen & 1 or self._ctrl_gen != gen):
                    # libkvproxy's kvp_wait() can mistake the reply to a control
                    # call that another thread made meanwhile for garbage on the
                    # socket (it peeks, then reads ctrl_busy: a race). A control
                    # call overlapped this wait, so this EPROTO is not evidence
                    # of corruption: wait again (a real one shows up next time).
                    n = 0
                if n < 0:
                    raise error_for(n, "wait")
                if n > 0:
                    return self._completions(buf, n)
            if slice_ms == 0:
                return []

    def set_wait_spin(self, us: Optional[int]) -> None:
        """Let :meth:`wait` look at the completion ring for up to ``us``
        microseconds before it blocks until the daemon wakes it (a completion
        that comes that soon costs no wake-up).

        :param us: 0 to 1000000; 0 = block at once; None = adapt to this
            client's recent waits (the default, and what
            ``$KVPROXY_WAIT_SPIN_US=auto`` starts a client with).
        :raises InvalidArgument: ``us`` is not None or an int in that range.
        """
        if us is None:
            val = _WAIT_SPIN_AUTO
        elif isinstance(us, int) and not isinstance(us, bool) and 0 <= us <= _WAIT_SPIN_MAX_US:
            val = us
        else:
            raise InvalidArgument(errno.EINVAL, "set_wait_spin",
                                  detail=f"us must be None or an int in [0, {_WAIT_SPIN_MAX_US}], got {us!r}")
        with self._cq_lock:
            rc = self._lib.kvp_set_wait_spin(self._handle("set_wait_spin"), val)
        if rc < 0:
            raise error_for(rc, "set_wait_spin")
