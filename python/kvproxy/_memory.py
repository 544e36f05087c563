# SPDX-License-Identifier: BSD-3-Clause
"""Buffers given as raw addresses (what inference engines hand out) -> kvproxy regions.

An engine describes its KV cache as a list of ``(pointer, length)`` buffers.
kvproxyd needs regions: memory it can map itself, named by a key. This
module finds out what each pointer is and registers the fewest regions
that cover all the buffers:

* **host memory of a memfd** (a :class:`kvproxy.HostBuffer`, or any
  ``memfd_create`` mapping sealed against shrinking whose fd this process
  holds open): found in ``/proc/self/maps``, its fd in ``/proc/self/fd``;
  one region per memfd, spanning the buffers in it;
* **CUDA device memory** (a pointer in no readable host mapping, in a
  mapping of an NVIDIA device file, or, where no mirror is allowed, any other
  pointer the CUDA driver knows): one region per CUDA allocation
  (``cuMemGetAddressRange``), spanning the buffers in it, registered by IPC
  handle (:meth:`kvproxy.Client.register_cuda`);
* **other host memory** (anonymous or private: ``malloc``, a CPU torch
  tensor), which the daemon cannot map: where the caller allows it, the
  buffer gets a *mirror* (a HostBuffer of the same size, registered), and
  the caller copies items between the buffer and its mirror
  (:meth:`Placement.to_mirror`, :meth:`Placement.from_mirror`). Meant for
  small per-request metadata, not for KV pages.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ._buffer import HostBuffer
from ._errors import InvalidArgument, KvproxyError

__all__ = ["Placement", "RegionMap"]


@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    readable: bool
    shared: bool
    offset: int
    dev: int
    inode: int
    path: str


def _read_maps() -> List[_Mapping]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 5:
                continue
            lo, hi = parts[0].split("-")
            major, minor = parts[3].split(":")
            out.append(
                _Mapping(
                    start=int(lo, 16),
                    end=int(hi, 16),
                    readable=parts[1][0] == "r",
                    shared=parts[1][3] == "s",
                    offset=int(parts[2], 16),
                    dev=os.makedev(int(major, 16), int(minor, 16)),
                    inode=int(parts[4]),
                    path=parts[5].strip() if len(parts) > 5 else "",
                )
            )
    return out


def _fd_of(dev: int, inode: int) -> Optional[int]:
    """An fd of this process open on the file (dev, inode), or None."""
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if st.st_ino == inode and st.st_dev == dev:
            return int(name)
    return None


@dataclass
class Placement:
    """Where one buffer lives in kvproxy terms.

    Attributes:
        key: the region key to name in segments.
        offset: the buffer's first byte, as an offset into that region.
        length: the buffer's length.
        ptr: the buffer's address (as given).
        mirror: the mirror's address when the buffer is copied through a
            mirror (the region is then the mirror's), else None.
    """

    key: int
    offset: int
    length: int
    ptr: int
    mirror: Optional[int] = None

    def to_mirror(self, off: int, n: int) -> None:
        """Copy ``n`` bytes at ``off`` of the buffer into its mirror (no-op without one)."""
        if self.mirror is not None:
            ctypes.memmove(self.mirror + off, self.ptr + off, n)

    def from_mirror(self, off: int, n: int) -> None:
        """Copy ``n`` bytes at ``off`` of the mirror back into the buffer (no-op without one)."""
        if self.mirror is not None:
            ctypes.memmove(self.ptr + off, self.mirror + off, n)


class RegionMap:
    """Registers ``(pointer, length)`` buffers with a :class:`kvproxy.Client`.

    ``RegionMap(client, buffers, gpu_id, allow_mirror)``: after construction
    :attr:`placements` holds one :class:`Placement` per buffer, in order.
    :meth:`close` deregisters the regions and frees the mirrors.

    :raises InvalidArgument: a buffer is plain host memory and mirrors are
        not allowed, or a buffer straddles two host mappings.
    :raises RegionError: the daemon refused a region (its reason attached).
    :raises KvproxyError: a pointer is neither host memory nor CUDA memory.
    """

    def __init__(self, client, buffers: Sequence[Tuple[int, int]], gpu_id: int = 0, allow_mirror: bool = False) -> None:
        self._client = client
        self._regions: List = []
        self._mirrors: List[HostBuffer] = []
        self.placements: List[Placement] = []
        try:
            self._place(buffers, gpu_id, allow_mirror)
        except BaseException:
            self.close()
            raise

    def _place(self, buffers: Sequence[Tuple[int, int]], gpu_id: int, allow_mirror: bool) -> None:
        maps = _read_maps() if buffers else []
        memfd: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}  # (dev, ino) -> [(i, file offset)]
        cuda: List[int] = []
        plain: List[int] = []
        for i, (ptr, length) in enumerate(buffers):
            if length <= 0:
                raise InvalidArgument(errno.EINVAL, "register", detail=f"buffer {i} at {ptr:#x} has length {length}")
            m = next((m for m in maps if m.start <= ptr < m.end), None)
            if m is None or not m.readable or m.path.startswith("/dev/nvidia"):
                cuda.append(i)
            elif m.shared and m.path.startswith("/memfd:"):
                if ptr + length > m.end:
                    raise InvalidArgument(
                        errno.EINVAL, "register", detail=f"buffer {i} [{ptr:#x}, +{length}) runs past its memfd mapping",
                    )
                memfd.setdefault((m.dev, m.inode), []).append((i, m.offset + ptr - m.start))
            elif allow_mirror:
                plain.append(i)
            else:
                cuda.append(i)  # host memory unless the CUDA driver knows it (checked there)
        self.placements = [None] * len(buffers)  # type: ignore[list-item]
        for (dev, ino), items in memfd.items():
            fd = _fd_of(dev, ino)
            if fd is None:
                if not allow_mirror:
                    raise InvalidArgument(
                        errno.EBADF, "register",
                        detail=f"buffer {items[0][0]} is a memfd mapping whose fd this process no longer holds open",
                    )
                plain.extend(i for i, _ in items)
                continue
            lo = min(off for _, off in items)
            hi = max(off + buffers[i][1] for i, off in items)
            region = self._client.register(fd, lo, hi - lo)
            self._regions.append(region)
            for i, off in items:
                self.placements[i] = Placement(region.key, off - lo, buffers[i][1], buffers[i][0])
        if cuda:
            self._place_cuda(buffers, cuda, gpu_id)
        for i in plain:
            ptr, length = buffers[i]
            mirror = HostBuffer(length)
            self._mirrors.append(mirror)
            region = self._client.register(mirror)
            self._regions.append(region)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mirror))
            self.placements[i] = Placement(region.key, 0, length, ptr, mirror=addr)

    def _place_cuda(self, buffers: Sequence[Tuple[int, int]], idx: List[int], gpu_id: int) -> None:
        from . import _cuda

        bases: Dict[int, List[int]] = {}
        for i in idx:
            try:
                base, _size = _cuda.allocation_range(buffers[i][0], gpu_id)
            except KvproxyError as e:
                raise InvalidArgument(
                    errno.EINVAL, "register",
                    detail=f"buffer {i} at {buffers[i][0]:#x} is neither a memfd mapping nor CUDA memory "
                    f"({e.strerror}): kvproxyd cannot map plain host memory; allocate it as a memfd "
                    "(kvproxy.HostBuffer) or in GPU memory",
                ) from None
            bases.setdefault(base, []).append(i)
        for items in bases.values():
            lo = min(buffers[i][0] for i in items)
            hi = max(buffers[i][0] + buffers[i][1] for i in items)
            region = self._client.register_cuda(lo, hi - lo, device=gpu_id)
            self._regions.append(region)
            for i in items:
                self.placements[i] = Placement(region.key, buffers[i][0] - lo, buffers[i][1], buffers[i][0])

    @property
    def region_count(self) -> int:
        """Regions registered (memfds + CUDA allocations + mirrors)."""
        return len(self._regions)

    def close(self) -> None:
        """Deregister the regions (best effort: the daemon also reclaims them
        when the client closes) and free the mirrors."""
        for r in self._regions:
            try:
                if r.registered:
                    r.deregister()
            except OSError:
                pass
        self._regions = []
        for m in self._mirrors:
            try:
                m.close()
            except BufferError:
                pass
        self._mirrors = []
