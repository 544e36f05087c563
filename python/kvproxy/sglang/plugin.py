# SPDX-License-Identifier: BSD-3-Clause
"""The sglang plugin: makes ``--disaggregation-transfer-backend kvproxy`` exist.

``pip install ./python`` registers :func:`register` as the entry point
``kvproxy`` of sglang's general plugin group ``sglang.srt.plugins``;
sglang's ``load_plugins()`` (called by ``sglang.launch_server``, ``sglang
serve`` and every scheduler process before anything else) runs it, then
applies the hooks it registered. :func:`register`

1. adds ``kvproxy`` to ``DISAGG_TRANSFER_BACKEND_CHOICES``
   (``add_disagg_transfer_backend_choices``), so argparse accepts it;
2. replaces ``sglang.srt.disaggregation.utils.TransferBackend`` (a REPLACE
   hook) by the same enum plus ``KVPROXY = "kvproxy"``, so
   ``TransferBackend(server_args.disaggregation_transfer_backend)`` works;
3. wraps ``get_kv_class`` (an AROUND hook): for the kvproxy member it
   answers with this package's classes, for every other backend it defers to
   sglang's own chain;
4. wraps ``disagg_service._start_bootstrap_server_subprocess`` (AROUND),
   where sglang has it: it serves the bootstrap registry from a spawned
   child that re-imports sglang without loading plugins, so there
   ``TransferBackend("kvproxy")`` would fail; for kvproxy the child's entry
   point becomes :func:`bootstrap_server_process`, which installs the plugin
   in the child first and then runs sglang's own.

sglang's hook registry rebinds every module that imported either name with
``from ... import``. On an sglang without the hook registry,
:func:`install` patches the modules directly the same way (and can be
called by hand, e.g. from ``sitecustomize``). With ``SGLANG_PLUGINS`` set,
it must name ``kvproxy``.

Checked against sglang's sources (repository sgl-project/sglang):
``plugins/__init__.py`` @0298b5b4, ``plugins/hook_registry.py`` @106f37ce,
``disaggregation/utils.py`` @000eaffa and the ``MORI`` variant with typed
``get_kv_class`` overloads, ``server_args.py``/``arg_groups/choices.py``
@0099dee6 (``add_disagg_transfer_backend_choices``).
"""

from __future__ import annotations

import enum
import functools
import importlib
import logging
import sys
import threading
import types
from typing import Any, Callable, Optional

__all__ = ["register", "install", "bootstrap_server_process", "BACKEND", "PLUGIN_NAME"]

log = logging.getLogger("kvproxy.sglang")

PLUGIN_NAME = "kvproxy"
BACKEND = "kvproxy"
_UTILS = "sglang.srt.disaggregation.utils"
_ENUM = _UTILS + ".TransferBackend"
_GET = _UTILS + ".get_kv_class"
_SERVICE = "sglang.srt.managers.disagg_service"
_SPAWN = _SERVICE + "._start_bootstrap_server_subprocess"
_CHILD = "_run_bootstrap_server_process"
_lock = threading.Lock()
_done = False


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def kv_class(class_type: Any) -> Optional[type]:
    """This backend's class for sglang's ``KVClassType`` (compared by value)."""
    from . import KvproxyKVBootstrapServer, KvproxyKVManager, KvproxyKVReceiver, KvproxyKVSender
    from ._common import KVArgs

    kind = str(_value(class_type)).lower()
    if kind == "kvargs":
        try:  # sglang's own, which its schedulers fill in
            from sglang.srt.disaggregation.base import KVArgs as SglangKVArgs  # type: ignore[import-not-found]

            return SglangKVArgs
        except ImportError:
            return KVArgs
    return {"manager": KvproxyKVManager, "sender": KvproxyKVSender, "receiver": KvproxyKVReceiver,
            "bootstrap_server": KvproxyKVBootstrapServer}.get(kind)


def around_get_kv_class(original: Callable[..., Any], transfer_backend: Any, class_type: Any,
                        *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook of ``get_kv_class``: kvproxy's classes for the kvproxy
    member (by value, so any enum that carries it works), sglang's otherwise."""
    if _value(transfer_backend) == BACKEND:
        return kv_class(class_type)
    return original(transfer_backend, class_type, *args, **kwargs)


def around_start_bootstrap(original: Callable[..., Any], server_args: Any, *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook of ``_start_bootstrap_server_subprocess``: for kvproxy,
    sglang's spawned bootstrap child runs :func:`bootstrap_server_process`
    (spawn pickles the target by name, so it is looked up in the child)."""
    if _value(getattr(server_args, "disaggregation_transfer_backend", None)) != BACKEND:
        return original(server_args, *args, **kwargs)
    service = sys.modules[_SERVICE]
    inner = getattr(service, _CHILD)
    setattr(service, _CHILD, bootstrap_server_process)
    try:
        return original(server_args, *args, **kwargs)
    finally:
        setattr(service, _CHILD, inner)


def bootstrap_server_process(server_args: Any, ready_writer: Any) -> None:
    """sglang's bootstrap child, for kvproxy: the plugin installed in this fresh
    process, then sglang's own child entry point (it resolves the backend's
    class, checks /health and reports through @p ready_writer)."""
    install()
    service = importlib.import_module(_SERVICE)
    getattr(service, _CHILD)(server_args, ready_writer)


def _bootstrap_spawner() -> Optional[Callable[..., Any]]:
    """sglang's ``_start_bootstrap_server_subprocess``, where this sglang has one."""
    try:
        service = importlib.import_module(_SERVICE)
    except ImportError:
        return None
    fn = getattr(service, _SPAWN.rsplit(".", 1)[1], None)
    return fn if callable(fn) and hasattr(service, _CHILD) else None


def extended_enum(orig: type) -> type:
    """``orig`` (an Enum) with one more member ``KVPROXY = "kvproxy"``, under the
    same module and name (pickling and reprs stay as sglang's)."""
    members = {m.name: m.value for m in orig}  # type: ignore[attr-defined]
    if "KVPROXY" in members:
        return orig
    members["KVPROXY"] = BACKEND
    mixin = getattr(orig, "_member_type_", object)
    kw = {"type": mixin} if mixin is not object else {}
    new = enum.Enum(orig.__name__, members, module=orig.__module__,  # type: ignore[call-overload]
                    qualname=getattr(orig, "__qualname__", orig.__name__), **kw)
    new.__doc__ = orig.__doc__
    return new


def _add_choice() -> None:
    """``kvproxy`` among the choices of ``--disaggregation-transfer-backend``."""
    for modname in ("sglang.srt.server_args", "sglang.srt.arg_groups.choices"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        choices = getattr(mod, "DISAGG_TRANSFER_BACKEND_CHOICES", None)
        if choices is not None and BACKEND in choices:
            return
        add = getattr(mod, "add_disagg_transfer_backend_choices", None)
        if add is not None:
            add([BACKEND])
            return
        if isinstance(choices, list):
            choices.append(BACKEND)
            return
    log.warning("kvproxy plugin: no DISAGG_TRANSFER_BACKEND_CHOICES in this sglang: "
                "--disaggregation-transfer-backend kvproxy may be refused")


def _register_virtual_subclasses() -> None:
    """isinstance() of sglang's base classes holds for kvproxy's (ABC.register)."""
    try:
        base = importlib.import_module("sglang.srt.disaggregation.base.conn")
    except ImportError:
        return
    from . import KvproxyKVBootstrapServer, KvproxyKVManager, KvproxyKVReceiver, KvproxyKVSender

    for name, cls in (("BaseKVManager", KvproxyKVManager), ("BaseKVSender", KvproxyKVSender),
                      ("BaseKVReceiver", KvproxyKVReceiver), ("BaseKVBootstrapServer", KvproxyKVBootstrapServer)):
        abc = getattr(base, name, None)
        if abc is not None and hasattr(abc, "register"):
            abc.register(cls)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point (idempotent per process).

    :raises ImportError: sglang is not installed.
    """
    global _done
    with _lock:
        if _done:
            return
        utils = importlib.import_module(_UTILS)
        _add_choice()
        _register_virtual_subclasses()
        try:
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # type: ignore[import-not-found]
        except ImportError:
            _install(utils)
        else:
            if not hasattr(utils.TransferBackend, "KVPROXY"):
                HookRegistry.register(_ENUM, extended_enum(utils.TransferBackend), HookType.REPLACE)
            if not getattr(utils.get_kv_class, "_kvproxy", False):
                HookRegistry.register(_GET, around_get_kv_class, HookType.AROUND)
            spawner = _bootstrap_spawner()
            if spawner is not None and not getattr(spawner, "_kvproxy", False):
                HookRegistry.register(_SPAWN, around_start_bootstrap, HookType.AROUND)
        _done = True
        log.info("kvproxy plugin registered: --disaggregation-transfer-backend %s", BACKEND)


def install() -> None:
    """Patch sglang directly (no hook registry needed): the choice, the enum
    member and ``get_kv_class``, rebinding every loaded module that imported
    the old objects. Idempotent.

    :raises ImportError: sglang is not installed.
    """
    global _done
    with _lock:
        utils = importlib.import_module(_UTILS)
        _add_choice()
        _register_virtual_subclasses()
        _install(utils)
        _done = True


def _install(utils: types.ModuleType) -> None:
    old_enum = utils.TransferBackend
    new_enum = extended_enum(old_enum)
    if new_enum is not old_enum:
        utils.TransferBackend = new_enum
        _rebind(old_enum, new_enum, utils)
    old_get = utils.get_kv_class
    if not getattr(old_get, "_kvproxy", False):
        @functools.wraps(old_get)
        def get_kv_class(*args: Any, **kwargs: Any) -> Any:
            return around_get_kv_class(old_get, *args, **kwargs)

        get_kv_class._kvproxy = True  # type: ignore[attr-defined]
        utils.get_kv_class = get_kv_class
        _rebind(old_get, get_kv_class, utils)
    spawner = _bootstrap_spawner()
    if spawner is not None and not getattr(spawner, "_kvproxy", False):
        @functools.wraps(spawner)
        def start_bootstrap(*args: Any, **kwargs: Any) -> Any:
            return around_start_bootstrap(spawner, *args, **kwargs)

        start_bootstrap._kvproxy = True  # type: ignore[attr-defined]
        service = sys.modules[_SERVICE]
        setattr(service, _SPAWN.rsplit(".", 1)[1], start_bootstrap)


def _rebind(old: Any, new: Any, home: types.ModuleType) -> None:
    """Every loaded module's global that is ``old`` (a ``from X import Y``) becomes ``new``."""
    for mod in list(sys.modules.values()):
        if mod is None or mod is home or not isinstance(mod, types.ModuleType):
            continue
        try:
            names = [k for k, v in vars(mod).items() if v is old]
        except TypeError:
            continue
        for k in names:
            try:
                setattr(mod, k, new)
            except (AttributeError, TypeError):
                pass
