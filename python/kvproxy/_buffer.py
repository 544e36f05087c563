# SPDX-License-Identifier: BSD-3-Clause
"""HostBuffer: shareable host memory (a memfd) that kvproxyd can map as a region."""


import ctypes
import mmap
import os
import weakref
from typing import Any

from . import _lib
from ._errors import InvalidArgument, KvproxyError

__all__ = ["HostBuffer"]


class HostBuffer(mmap.mmap):
    """``size`` bytes of shareable host memory, allocated with ``kvp_host_alloc()``.

    The memory is a memfd: give the buffer to :meth:`Client.register` and the
    daemon maps the same pages, so transfers read from or land in it without
    a copy through the client. A HostBuffer *is* a writable, shared
    :class:`mmap.mmap`, so it supports the buffer protocol directly::

        buf = kvproxy.HostBuffer(1 << 20)
        buf[:5] = b"hello"                       # slice assignment
        view = memoryview(buf)                   # zero-copy view (format "B")
        arr = numpy.frombuffer(buf, numpy.uint8) # numpy / torch.frombuffer work too

    The contents start zeroed. :meth:`close` unmaps the memory and closes the
    memfd; it raises :class:`BufferError` while views of it (memoryviews,
    numpy arrays) are alive, instead of leaving them pointing at freed memory.
    A region registered from the buffer stays valid in the daemon after
    close() (the daemon holds its own mapping) until it is deregistered.

    Do not modify memory that is the source of a transfer in flight: it
    belongs to kvproxy until the transfer's ``done`` completion is read.
    """

    _fd: int
    _fd_closer: "weakref.finalize"

    def __new__(cls, size: int) -> "HostBuffer":
        """Allocate ``size`` (> 0) bytes.

        :raises InvalidArgument: size is not a positive integer.
        :raises KvproxyError: the allocation failed (errno from memfd_create/ftruncate/mmap).
        """
        if not isinstance(size, int) or isinstance(size, bool):
            raise TypeError(f"size must be an int, not {type(size).__name__}")
        if size <= 0:
            raise InvalidArgument(22, "HostBuffer", detail=f"size must be > 0, got {size}")
        lib = _lib.load()
        fd = ctypes.c_int(-1)
        addr = ctypes.c_void_p()
        rc = lib.kvp_host_alloc(size, ctypes.byref(fd), ctypes.byref(addr))
        if rc < 0:
            raise KvproxyError(-rc, "HostBuffer", detail=f"cannot allocate {size} bytes")
        try:
            # Python's own shared mapping of the same memfd: it tracks exported
            # buffers, so close() cannot pull memory from under a live view.
            self = super().__new__(
                cls, fd.value, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except BaseException:
            lib.kvp_host_free(fd.value, addr, size)
            raise
        # The library's mapping is not needed any more; the memfd stays open.
        lib.kvp_host_free(-1, addr, size)
        self._fd = fd.value
        self._fd_closer = weakref.finalize(self, os.close, fd.value)
        return self

    @property
    def fd(self) -> int:
        """The memfd behind the buffer (what :meth:`Client.register` sends to the daemon)."""
        if self.closed:
            raise ValueError("HostBuffer is closed")
        return self._fd

    def fileno(self) -> int:
        """Same as :attr:`fd`."""
        return self.fd

    @property
    def size(self) -> int:
        """Size in bytes."""
        return len(self)

    def close(self) -> None:
        """Unmap the memory and close the memfd (idempotent).

        :raises BufferError: views of the buffer (memoryview, numpy arrays) are still alive.
        """
        if self.closed:
            return
        try:
            super().close()
        except BufferError:
            raise BufferError(
                "HostBuffer has live views (memoryview, numpy/torch arrays): release them before close()"
            ) from None
        self._fd_closer()

    def resize(self, newsize: int) -> None:  # noqa: D401 - mmap API
        """Not supported: a registered region's size is fixed."""
        raise OSError(95, "HostBuffer cannot be resized")

    def __enter__(self) -> "HostBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<kvproxy.HostBuffer closed>"
        return f"<kvproxy.HostBuffer size={len(self)} fd={self._fd}>"
