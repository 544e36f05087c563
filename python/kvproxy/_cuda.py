# SPDX-License-Identifier: BSD-3-Clause
"""CUDA IPC handles for GPU regions, through the CUDA runtime loaded with ctypes.

Only what Client.register_cuda() needs: the allocation's IPC handle and base
address for a device pointer. Nothing here is imported unless GPU memory is
registered, so the binding works on hosts without CUDA.
"""

import ctypes
import ctypes.util
import errno
from typing import Any, Optional, Tuple

from ._errors import KvproxyError

_rt = None


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def _runtime() -> ctypes.CDLL:
    global _rt
    if _rt is not None:
        return _rt
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    found = ctypes.util.find_library("cudart")
    if found:
        names.insert(0, found)
    # PyTorch wheels carry their own runtime: prefer the one already loaded.
    try:
        import torch  # noqa: F401
        import torch.cuda  # noqa: F401
    except Exception:
        pass
    last = None
    for name in names:
        try:
            _rt = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError as e:
            last = e
    else:
        try:
            import glob
            import os
            import nvidia.cuda_runtime as ncr  # pip's CUDA runtime package, if present

            libs = glob.glob(os.path.join(list(ncr.__path__)[0], "lib", "libcudart.so*"))
            _rt = ctypes.CDLL(libs[0], mode=ctypes.RTLD_GLOBAL)
        except Exception:
            raise KvproxyError(errno.ENODEV, "register_cuda", detail=f"cannot load the CUDA runtime: {last}")
    _rt.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(_IpcHandle), ctypes.c_void_p]
    _rt.cudaIpcGetMemHandle.restype = ctypes.c_int
    _rt.cudaSetDevice.argtypes = [ctypes.c_int]
    _rt.cudaSetDevice.restype = ctypes.c_int
    _rt.cudaGetErrorString.argtypes = [ctypes.c_int]
    _rt.cudaGetErrorString.restype = ctypes.c_char_p
    return _rt


def _cuda_driver() -> ctypes.CDLL:
    drv = ctypes.CDLL("libcuda.so.1")
    drv.cuMemGetAddressRange_v2.argtypes = [
        ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64,
    ]
    drv.cuMemGetAddressRange_v2.restype = ctypes.c_int
    return drv


def describe(obj: Any, length: Optional[int], device: Optional[int]) -> Tuple[int, int, int]:
    """(device pointer, length, device) for a tensor-like object or an int pointer."""
    if hasattr(obj, "data_ptr"):
        ptr = int(obj.data_ptr())
        if length is None:
            length = int(obj.numel()) * int(obj.element_size())
        if device is None:
            dev = getattr(obj, "device", None)
            device = int(getattr(dev, "index", 0) or 0)
    else:
        ptr = int(obj)
        if length is None:
            raise ValueError("register_cuda(ptr) needs length")
    if device is None:
        device = 0
    if length <= 0:
        raise ValueError("GPU region length must be > 0")
    return ptr, length, device


def _set_device(device: int) -> ctypes.CDLL:
    rt = _runtime()
    err = rt.cudaSetDevice(device)
    if err:
        raise KvproxyError(errno.ENODEV, "register_cuda", detail=f"cudaSetDevice({device}): {rt.cudaGetErrorString(err).decode()}")
    return rt


def allocation_range(ptr: int, device: int) -> Tuple[int, int]:
    """(base, size) of the CUDA allocation holding device pointer ``ptr``.

    :raises KvproxyError: ENODEV: no CUDA runtime or driver here, or ``ptr``
        is not device memory of ``device``.
    """
    _set_device(device)
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    try:
        rc = _cuda_driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr)
    except OSError as e:
        raise KvproxyError(errno.ENODEV, "register_cuda", detail=f"cannot load the CUDA driver: {e}") from None
    if rc != 0:
        raise KvproxyError(
            errno.ENODEV, "register_cuda",
            detail=f"{ptr:#x} is not CUDA memory of device {device} (cuMemGetAddressRange: {rc})",
        )
    return base.value, size.value


def ipc_handle(ptr: int, device: int) -> Tuple[bytes, int]:
    """The IPC handle of the allocation holding ``ptr``, and that allocation's base."""
    base, _size = allocation_range(ptr, device)  # also makes ``device`` current
    rt = _runtime()
    h = _IpcHandle()
    # The handle names the whole allocation: ask with its base, as PyTorch's
    # own IPC does (a tensor of the caching allocator may start inside one).
    err = rt.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base))
    if err:
        raise KvproxyError(errno.ENODEV, "register_cuda", detail=f"cudaIpcGetMemHandle: {rt.cudaGetErrorString(err).decode()}")
    # string_at, not h.reserved: the handle is binary and may hold NUL bytes.
    return ctypes.string_at(ctypes.addressof(h), 64), base
