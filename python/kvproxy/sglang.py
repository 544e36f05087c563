# SPDX-License-Identifier: BSD-3-Clause
"""kvproxy as an sglang disaggregation transfer backend.

sglang's prefill/decode disaggregation moves each request's KV cache through
a *transfer backend*: a manager per worker, a sender per request on the
prefill side, a receiver per request on the decode side, and a bootstrap
server on the prefill node (``sglang/srt/disaggregation/base/conn.py``).
This module implements that contract on top of kvproxy; it needs nothing
but the standard library and a ``kvproxyd`` beside each worker.

Selecting it (sglang's dynamic backend, on both the prefill and the decode
servers)::

    python -m sglang.launch_server ... --disaggregation-mode prefill \\
        --disaggregation-transfer-backend dynamic \\
        --disaggregation-transfer-backend-extra-config \\
        '{"backend_name": "kvproxy", "module_path": "kvproxy.sglang",
          "class_name": "KvproxyBackend",
          "kvproxy_socket": "/run/kvproxy/prefill0.sock"}'

The ``kvproxy_*`` keys of that JSON (or environment variables) configure the
adapter, see :class:`KvproxyConfig`. The kvproxyd of a prefill node must
list the decode nodes' kvproxyd as peers (and the other way round).

How sglang's objects map onto kvproxy
-------------------------------------

==========================  ==================================================
sglang                      kvproxy
==========================  ==================================================
``KVArgs.kv_data_ptrs``     one buffer per layer (K and V apart); page ``i``
``kv_data_lens``            of buffer ``b`` lives at ``ptr[b] + i *
``kv_item_lens``            item_len[b]``. The manager registers the fewest
                            regions covering them: one per CUDA allocation
                            (IPC handle), one per memfd for host memory.
``aux_data_ptrs`` ...       per-request metadata rows (``aux_index``); plain
                            host memory (a CPU tensor) goes through a
                            registered mirror buffer: copied in before the
                            send, copied out before ``Success``.
``sender.send(kv_indices)`` page indices of one chunk -> segments: runs of
                            consecutive source pages landing on consecutive
                            destination pages are coalesced, one segment per
                            run and buffer; segments are grouped into
                            transfers of at most ``max_segments`` and 32 MiB;
                            the last chunk adds one segment per aux buffer.
``KVPoll.Bootstrapping``    waiting for the bootstrap exchange
``KVPoll.WaitingForInput``  the other side is known: prefill has the decode
                            side's metadata / decode knows the prefill rank
``KVPoll.Transferring``     transfers submitted (prefill) / metadata sent,
                            data expected (decode)
``KVPoll.Success``          prefill: every transfer's ``done`` completion was
                            ok (the destination acknowledged every byte);
                            decode: the ``landed`` notices add up to every
                            expected byte, or the prefill side reported
                            success (a notice can be dropped on a full ring)
``KVPoll.Failed``           a transfer ended with a kvproxy status
                            (``timeout``, ``remote``, ``peer``, ...), the
                            peer is unknown, layouts differ, a timeout of the
                            adapter passed, kvproxyd went away; the decode
                            side learns the prefill side's failure through
                            the bootstrap server. ``failure_exception()``
                            raises :class:`KVTransferError` with the typed
                            ``code`` and the reason.
==========================  ==================================================

No request stays in ``Transferring`` for ever: every kvproxy transfer ends
by its deadline (``kvproxy_transfer_timeout``, else the daemon's
``timeouts.default_ms``), and the decode side gives up after
``kvproxy_waiting_timeout``.

When the decode side gives a request up (``waiting_timeout``, ``abort()``,
any failure of its own) after its metadata may have reached the prefill
side (a put of it was tried), the prefill side may still write into its
pages, which sglang reuses after ``Failed``. So the receiver stores an
``abort`` entry in the mailbox and keeps reporting ``Transferring`` until
either the prefill side answers (its sender ends ``Failed`` with code
``aborted-by-decode``: queued transfers are dropped, in-flight ones
cancelled, and its ``aborted`` status is stored only once their completions
are in; any outcome the prefill side stores comes only with none of its
transfers in flight), or the last moment a transfer could still land has
passed: the metadata tells the prefill side to submit nothing later than
``waiting_timeout`` after the entry was stored (the mailbox reports the
entries' ages) and to end each transfer ``transfer_timeout`` (the decode
side's setting, else 30 s) after that at the latest; the receiver waits
that long after its last put of the metadata, plus 2 s. Only then does it
report ``Failed`` with its own code. Metadata never sent is dropped, no
abort needed; ``close()`` posts the aborts and fails at once (the daemon
drops the closed manager's regions), as does a dead kvproxyd. kvproxyd
completes a cancelled transfer only once nothing more of it can land (TCP:
the receiving kvproxyd acknowledged its last frame; RDMA: its posted writes
completed), so the prefill side's ``aborted`` comes after its last byte; a
connection that fails first is the exception (the peer timeout bounds it).

Bootstrap exchange (side channel)
---------------------------------

:class:`KvproxyKVBootstrapServer` (started by sglang on the prefill node at
``--disaggregation-bootstrap-port``) is an HTTP mailbox
(:mod:`kvproxy._bootstrap`); workers are its clients, over plain
``http.client``, from one background thread per manager:

1. each prefill manager announces itself (kvproxyd node id, layout);
2. a decode receiver learns that its prefill rank is there
   (``WaitingForInput``), then, in ``send_metadata()``, stores under
   ``<bootstrap_room>.<engine_rank>``: its kvproxyd node id, its region keys
   and offsets per buffer, its page indices (as runs), its aux index, a
   48-bit transfer tag and the prefix length it already holds;
3. the prefill sender long-polls for that entry; its kvproxy transfers carry
   user ids ``tag << 16 | n``, so the decode side attributes the ``landed``
   notices to the request;
4. the prefill sender stores its outcome under the same key (``success``,
   ``failed`` with code and reason, or ``aborted``); the decode receiver
   long-polls for it;
5. a decode receiver that gives up after its metadata may have gone out
   stores ``abort`` under the key; prefill managers long-poll for it with
   the metadata (one request per server and pass). The receiver deletes the
   key's entries when it is cleared.

Supported: equal attention-TP on both sides (rank ``r`` sends to rank
``r``), data parallelism (the mailbox is keyed by bootstrap room, so the
decode side never needs the prefill DP rank), chunked prefill, a prefix the
decode side already holds. Not supported (refused at start with the
reason): model state buffers (mamba, SWA, DSA), pipeline-parallel prefill,
decode context parallelism, different TP sizes on the two sides.
"""

from __future__ import annotations

import enum
import errno
import json
import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple, Type, Union

from ._bootstrap import BootstrapClient, BootstrapError, BootstrapServer
from ._client import Client, Completion
from ._errors import _STATUS_ERRNO, ConnectError, Disconnected, KvproxyError, PeerNotFound, RingFull
from ._memory import RegionMap

__all__ = [
    "KVPoll",
    "KVArgs",
    "DisaggregationMode",
    "KvproxyConfig",
    "KVTransferError",
    "TransferMetric",
    "PrefillInfo",
    "KvproxyKVManager",
    "KvproxyKVSender",
    "KvproxyKVReceiver",
    "KvproxyKVBootstrapServer",
    "KvproxyBackend",
    "KVManager",
    "KVSender",
    "KVReceiver",
    "KVBootstrapServer",
]

log = logging.getLogger("kvproxy.sglang")

# Transfer user ids: the decode side's tag in the high 48 bits, the
# transfer's number within the request in the low 16.
_TAG_BITS = 48
_PIECE_BITS = 16
_PIECE_MAX = (1 << _PIECE_BITS) - 1
_META_VERSION = 1
# Submission ring per manager: room for max_inflight full transfers
# (1 + max_segments entries each); the daemon accepts at most 65536.
_SQ_ENTRIES = 32768
# Landing notices of many small transfers must not overflow the ring.
_CQ_ENTRIES = 4096

def _connect(sock: str) -> Client:
    """Connect with rings sized for the adapter, or the daemon's own limits.

    kvproxyd bounds client rings by its limits.sq_entries/cq_entries; below
    what the adapter asks for, it takes the daemon's defaults (submissions
    then wait on RingFull, which the manager handles).
    """
    try:
        return Client(sock, sq_entries=_SQ_ENTRIES, cq_entries=_CQ_ENTRIES)
    except ConnectError as e:
        if e.errno != errno.EINVAL:
            raise
        log.warning("kvproxyd at %s refused %d/%d ring entries (limits.sq_entries/cq_entries); "
                     "using its defaults", sock, _SQ_ENTRIES, _CQ_ENTRIES)
        return Client(sock)


# Bootstrap server I/O: connect/read timeout, and the backoff after a failure.
_BOOTSTRAP_IO_TIMEOUT = 2.0
_BACKOFF_MIN, _BACKOFF_MAX = 0.2, 5.0
# What the decode side assumes of the prefill side's transfer deadline when
# kvproxy_transfer_timeout is not set (kvproxyd's shipped timeouts.default_ms),
# and the slack it adds before trusting that a request's data can no longer land.
_DEFAULT_TRANSFER_TIMEOUT = 30.0
_LAND_SLACK = 2.0
# Bytes per kvproxy transfer: many medium transfers keep the daemon's window
# full and pipeline; a few huge ones (a long run of contiguous pages) do not.
_PIECE_BYTES = 32 << 20


class KVPoll(enum.IntEnum):
    """Transfer states, the values of sglang's ``KVPoll`` (plain ints compare equal)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


_FINAL = (KVPoll.Failed, KVPoll.Success)


class DisaggregationMode(enum.Enum):
    """sglang's ``DisaggregationMode`` values, for use without sglang; the
    manager also accepts sglang's own enum (compared by value)."""

    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class KVArgs:
    """What a worker tells its manager about its memory (sglang's ``KVArgs``).

    sglang creates it with no arguments and sets attributes; the manager
    reads ``engine_rank``, ``gpu_id``, ``kv_data_ptrs``/``kv_data_lens``/
    ``kv_item_lens`` (one entry per layer buffer; ``item_len`` is the bytes
    of one page), ``aux_data_ptrs``/``aux_data_lens``/``aux_item_lens``
    (per-request metadata rows), ``page_size`` and ``system_dp_rank``;
    state buffers (``state_types``, ``state_data_ptrs``) must be empty.
    """

    engine_rank: int = 0
    gpu_id: int = 0
    page_size: int = 1
    system_dp_rank: int = 0
    pp_rank: int = 0
    kv_data_ptrs: List[int]
    kv_data_lens: List[int]
    kv_item_lens: List[int]
    aux_data_ptrs: List[int]
    aux_data_lens: List[int]
    aux_item_lens: List[int]
    state_types: List[Any]

    def __init__(self, **kw: Any) -> None:
        for name in ("kv_data_ptrs", "kv_data_lens", "kv_item_lens", "aux_data_ptrs", "aux_data_lens",
                     "aux_item_lens", "state_types"):
            setattr(self, name, [])
        for k, v in kw.items():
            setattr(self, k, v)


@dataclass
class TransferMetric:
    """What ``get_transfer_metric()`` returns (the fields of sglang's ``KVTransferMetric``)."""

    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


@dataclass
class PrefillInfo:
    """What the decode side knows of a prefill server (``prefill_info_table`` values).

    ``dp_size`` is always 1 and ``follow_bootstrap_room`` True: the mailbox
    is keyed by bootstrap room, so whichever DP rank of the prefill server
    took the request finds the metadata; sglang then passes DP rank 0.
    """

    engine_ranks: Set[int] = field(default_factory=set)
    node_ids: Dict[int, str] = field(default_factory=dict)
    page_size: Optional[int] = None
    dp_size: int = 1
    follow_bootstrap_room: bool = True

    @property
    def attn_tp_size(self) -> int:
        return len(self.engine_ranks)


# Typed failure codes beyond kvproxy's transfer statuses, and their errno.
_CODE_ERRNO = dict(_STATUS_ERRNO)
_CODE_ERRNO.update(
    {
        "peer-unknown": errno.ENOENT,
        "layout": errno.EINVAL,
        "bootstrap-timeout": errno.ETIMEDOUT,
        "waiting-timeout": errno.ETIMEDOUT,
        "daemon-gone": errno.EPIPE,
        "aborted": errno.ECANCELED,
        "aborted-by-decode": errno.ECANCELED,
        "closed": errno.ESHUTDOWN,
        "protocol": errno.EPROTO,
        "unsupported": errno.EOPNOTSUPP,
        "submit": errno.EIO,
    }
)


class KVTransferError(KvproxyError):
    """A request's KV transfer failed; raised by ``failure_exception()``.

    Attributes:
        code: what failed, typed: a kvproxy transfer status (``"timeout"``,
            ``"remote"``, ``"peer"``, ``"no-buffers"``, ``"invalid"``,
            ``"canceled"``, ``"shutdown"``, ``"no-peer"``) or one of the
            adapter's: ``"peer-unknown"`` (the other side's kvproxyd is not a
            configured peer), ``"layout"`` (page counts or buffer layouts
            differ), ``"bootstrap-timeout"``, ``"waiting-timeout"``,
            ``"daemon-gone"`` (kvproxyd went away), ``"aborted"``,
            ``"aborted-by-decode"`` (prefill side: the decode side gave the
            request up), ``"closed"``, ``"protocol"``, ``"unsupported"``, ``"submit"``.
        failure_reason: the text: the daemon's reason where it gave one.
        bootstrap_room: the request's bootstrap room.
        completion: the failed :class:`kvproxy.Completion`, if a transfer failed.
        from_prefill: on the decode side, True when the prefill side reported it.
        is_from_another_rank: always False (sglang reads it).
    """

    def __init__(self, code: str, reason: str, bootstrap_room: int, completion: Optional[Completion] = None,
                 from_prefill: bool = False) -> None:
        super().__init__(_CODE_ERRNO.get(code, errno.EIO), f"KV transfer of bootstrap room {bootstrap_room}",
                         reason=reason, detail=code)
        self.code = code
        self.status_name = code
        self.failure_reason = reason
        self.bootstrap_room = bootstrap_room
        self.completion = completion
        self.from_prefill = from_prefill
        self.is_from_another_rank = False


@dataclass
class KvproxyConfig:
    """The adapter's settings.

    Each comes from the ``kvproxy_<name>`` key of sglang's
    ``--disaggregation-transfer-backend-extra-config`` JSON, else from the
    environment variable named below, else the default.

    Attributes:
        socket: the local kvproxyd's ``client_socket`` (``KVPROXY_SOCKET``);
            ``{engine_rank}`` and ``{gpu_id}`` are replaced, for one daemon
            per GPU. Required.
        transfer_timeout: deadline of each kvproxy transfer in seconds
            (``KVPROXY_TRANSFER_TIMEOUT``); None: the daemon's default.
        bootstrap_timeout: seconds a request may stay in ``Bootstrapping``
            (``KVPROXY_BOOTSTRAP_TIMEOUT``, else sglang's
            ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``; default 300).
        waiting_timeout: seconds the decode side waits for a request's data
            after sending its metadata (``KVPROXY_WAITING_TIMEOUT``, else
            ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``; default 300).
        max_inflight: kvproxy transfers a manager keeps in flight
            (``KVPROXY_MAX_INFLIGHT``; default 16); more wait in a queue.
    """

    socket: Optional[str] = None
    transfer_timeout: Optional[float] = None
    bootstrap_timeout: float = 300.0
    waiting_timeout: float = 300.0
    max_inflight: int = 16

    _ENV = {
        "socket": ("KVPROXY_SOCKET",),
        "transfer_timeout": ("KVPROXY_TRANSFER_TIMEOUT",),
        "bootstrap_timeout": ("KVPROXY_BOOTSTRAP_TIMEOUT", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"),
        "waiting_timeout": ("KVPROXY_WAITING_TIMEOUT", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"),
        "max_inflight": ("KVPROXY_MAX_INFLIGHT",),
    }

    @classmethod
    def from_sources(cls, extra: Union[None, str, Dict[str, Any]] = None,
                     env: Optional[Dict[str, str]] = None) -> "KvproxyConfig":
        """The settings from sglang's extra-config JSON (a string or dict) and the environment.

        :raises ValueError: bad JSON, an unknown ``kvproxy_*`` key, or a bad value.
        """
        env = os.environ if env is None else env
        if isinstance(extra, str):
            try:
                extra = json.loads(extra) if extra.strip() else {}
            except ValueError as e:
                raise ValueError(f"--disaggregation-transfer-backend-extra-config is not JSON: {e}") from None
        extra = dict(extra or {})
        known = {f"kvproxy_{n}" for n in cls._ENV}
        unknown = sorted(k for k in extra if k.startswith("kvproxy_") and k not in known)
        if unknown:
            raise ValueError(f"unknown kvproxy settings {unknown}; known: {sorted(known)}")
        cfg = cls()
        for name, env_names in cls._ENV.items():
            raw: Any = extra.get(f"kvproxy_{name}")
            where = f"kvproxy_{name}"
            if raw is None:
                for e in env_names:
                    if env.get(e):
                        raw, where = env[e], e
                        break
            if raw is None:
                continue
            try:
                if name == "socket":
                    value: Any = str(raw)
                elif name == "max_inflight":
                    value = int(raw)
                    if value < 1:
                        raise ValueError("must be >= 1")
                else:
                    value = float(raw)
                    if not value > 0 or math.isinf(value):
                        raise ValueError("must be a finite number of seconds > 0")
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}={raw!r}: {e}") from None
            setattr(cfg, name, value)
        return cfg


def _mode_of(mode: Any) -> str:
    value = str(getattr(mode, "value", mode)).lower()
    if value not in ("prefill", "decode"):
        raise ValueError(f"disaggregation mode must be prefill or decode, not {mode!r}")
    return value


def _int_list(x: Any) -> List[int]:
    """Page indices from a numpy array, a torch tensor, or any iterable of ints."""
    if x is None:
        return []
    if hasattr(x, "tolist"):
        x = x.tolist()
    return [int(v) for v in x]


def _is_index_list(x: Any) -> bool:
    """True for a list of page indices (sglang's older receiver.init), False for a DP rank."""
    return (hasattr(x, "tolist") and getattr(x, "ndim", 1) != 0) or isinstance(x, (list, tuple))


def _has_items(state_indices: Any) -> bool:
    """True if sglang's state_indices names any state to move."""
    return any(s is not None and len(s) > 0 for s in (state_indices or []))


def _runs(pages: Sequence[int]) -> List[List[int]]:
    """[[first, count], ...] of consecutive page indices."""
    out: List[List[int]] = []
    for p in pages:
        if out and p == out[-1][0] + out[-1][1]:
            out[-1][1] += 1
        else:
            out.append([p, 1])
    return out


def _pair_runs(src: Sequence[int], dst: Sequence[int]) -> List[Tuple[int, int, int]]:
    """(src_first, dst_first, count) runs where both sides are consecutive."""
    out: List[Tuple[int, int, int]] = []
    s0 = d0 = n = 0
    for s, d in zip(src, dst):
        if n and s == s0 + n and d == d0 + n:
            n += 1
            continue
        if n:
            out.append((s0, d0, n))
        s0, d0, n = s, d, 1
    if n:
        out.append((s0, d0, n))
    return out


def _split(segs: List[Tuple[int, int, int, int, int]], max_segs: int, max_bytes: int) -> List[List[Tuple[int, int, int, int, int]]]:
    """Segments grouped into transfers of at most ``max_segs`` segments and
    ``max_bytes`` bytes; a segment longer than what is left is cut."""
    out: List[List[Tuple[int, int, int, int, int]]] = []
    cur: List[Tuple[int, int, int, int, int]] = []
    size = 0
    for sk, so, dk, do, n in segs:
        while n:
            take = min(n, max_bytes - size)
            cur.append((sk, so, dk, do, take))
            so, do, n, size = so + take, do + take, n - take, size + take
            if len(cur) == max_segs or size == max_bytes:
                out.append(cur)
                cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def _connect_host(host: Optional[str]) -> str:
    """The address to reach a server bound to ``host`` from this machine."""
    if not host or host in ("0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return host


class _Piece:
    """One kvproxy transfer of a request."""

    __slots__ = ("sender", "uid", "peer", "segs")

    def __init__(self, sender: "KvproxyKVSender", uid: int, peer: int, segs: List[Tuple[int, int, int, int, int]]) -> None:
        self.sender = sender
        self.uid = uid
        self.peer = peer
        self.segs = segs


class _Request:
    """State shared by senders and receivers: poll state, failure, timing."""

    kv_mgr: "KvproxyKVManager"
    bootstrap_room: int
    bootstrap_addr: str
    key: str

    def _init_request(self, mgr: "KvproxyKVManager", bootstrap_addr: Optional[str], bootstrap_room: Optional[int]) -> None:
        if bootstrap_room is None:
            raise ValueError("kvproxy.sglang needs a bootstrap_room for every request")
        self.kv_mgr = mgr
        self.bootstrap_room = int(bootstrap_room)
        self.bootstrap_addr = bootstrap_addr or mgr.bootstrap_addr
        if not self.bootstrap_addr:
            raise ValueError("no bootstrap address: pass bootstrap_addr (HOST:PORT of the prefill's bootstrap server)")
        self.key = f"{self.bootstrap_room}.{mgr.engine_rank}"
        self._state = KVPoll.Bootstrapping
        self._failure: Optional[KVTransferError] = None
        self._t0 = time.monotonic()

    @property
    def state(self) -> KVPoll:
        """The current state, as :meth:`poll` last saw it (no timeout checks)."""
        return self._state

    @property
    def conclude_state(self) -> Optional[KVPoll]:
        """``Success`` or ``Failed`` once the request ended, else None (sglang reads it)."""
        return self._state if self._state in _FINAL else None

    def _set_locked(self, state: KVPoll) -> None:
        if self._state not in _FINAL and state != self._state:
            self._state = state
            self.kv_mgr._changed.notify_all()

    def _fail_locked(self, code: str, reason: str, completion: Optional[Completion] = None, from_prefill: bool = False) -> bool:
        """Fail the request (once). Returns True if this call failed it."""
        if self._state in _FINAL:
            return False
        self._failure = KVTransferError(code, reason, self.bootstrap_room, completion, from_prefill)
        self._state = KVPoll.Failed
        log.info("bootstrap room %d: %s: %s", self.bootstrap_room, code, reason)
        self.kv_mgr._changed.notify_all()
        return True

    def failure_exception(self) -> None:
        """Raise the request's :class:`KVTransferError` if it failed; return otherwise."""
        if self._failure is not None:
            raise self._failure

    def abort(self) -> None:
        """Give the request up: ``Failed`` with code ``aborted``."""
        with self.kv_mgr._lock:
            self._fail_locked("aborted", "aborted by the engine")


class KvproxyKVManager:
    """One per worker (TP rank): owns the kvproxy client, the registered
    regions, and two background threads (completions; bootstrap exchange).

    :param args: the worker's :class:`KVArgs` (sglang's works too).
    :param disaggregation_mode: ``prefill`` or ``decode`` (sglang's enum, ours, or a string).
    :param server_args: sglang's ``ServerArgs`` (read: ``host``,
        ``disaggregation_bootstrap_port``,
        ``disaggregation_transfer_backend_extra_config``, ``pp_size``); any
        object with those attributes, or None.
    :param is_mla_backend: accepted for the contract; MLA layouts move like any other.
    :param config: settings; default :meth:`KvproxyConfig.from_sources` of
        the extra-config JSON and the environment.
    :raises ValueError: bad settings, no socket configured, inconsistent KVArgs.
    :raises NotImplementedError: state buffers, pipeline-parallel prefill or DCP.
    :raises kvproxy.ConnectError: no kvproxyd at the socket.
    :raises kvproxy.KvproxyError: a buffer could not be registered (the daemon's reason).
    """

    def __init__(self, args: Any, disaggregation_mode: Any, server_args: Any = None,
                 is_mla_backend: Optional[bool] = False, config: Optional[KvproxyConfig] = None) -> None:
        self.kv_args = args
        self.mode = _mode_of(disaggregation_mode)
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.is_mla_backend = bool(is_mla_backend)
        self.config = config or KvproxyConfig.from_sources(
            getattr(server_args, "disaggregation_transfer_backend_extra_config", None))
        self.engine_rank = int(getattr(args, "engine_rank", 0) or 0)
        self.gpu_id = int(getattr(args, "gpu_id", 0) or 0)
        self.page_size = int(getattr(args, "page_size", 1) or 1)
        self.dp_rank = int(getattr(args, "system_dp_rank", 0) or 0)
        self._check_supported(args, server_args)

        kv_ptrs, kv_lens, kv_items = (list(getattr(args, n, None) or []) for n in ("kv_data_ptrs", "kv_data_lens", "kv_item_lens"))
        aux_ptrs, aux_lens, aux_items = (list(getattr(args, n, None) or []) for n in ("aux_data_ptrs", "aux_data_lens", "aux_item_lens"))
        if not kv_ptrs or not len(kv_ptrs) == len(kv_lens) == len(kv_items):
            raise ValueError(f"KVArgs: kv_data_ptrs/lens/item_lens must be non-empty lists of one length, "
                             f"got {len(kv_ptrs)}/{len(kv_lens)}/{len(kv_items)}")
        if not len(aux_ptrs) == len(aux_lens) == len(aux_items):
            raise ValueError(f"KVArgs: aux_data_ptrs/lens/item_lens differ in length: "
                             f"{len(aux_ptrs)}/{len(aux_lens)}/{len(aux_items)}")
        self.kv_item_lens = [int(x) for x in kv_items]
        self.aux_item_lens = [int(x) for x in aux_items]
        self.kv_page_bytes = sum(self.kv_item_lens)

        if not self.config.socket:
            raise ValueError("kvproxy.sglang: no kvproxyd socket: set kvproxy_socket in "
                             "--disaggregation-transfer-backend-extra-config or $KVPROXY_SOCKET")
        try:
            sock = self.config.socket.format(engine_rank=self.engine_rank, gpu_id=self.gpu_id)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"kvproxy_socket {self.config.socket!r}: only {{engine_rank}} and {{gpu_id}} "
                             f"can be replaced ({e!r})") from None

        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._closing = False
        self._gone: Optional[str] = None
        self._senders: Dict[str, KvproxyKVSender] = {}
        self._receivers: Dict[str, KvproxyKVReceiver] = {}
        self._by_tag: Dict[int, KvproxyKVReceiver] = {}
        self._queue: Deque[_Piece] = deque()
        self._inflight: Dict[int, _Piece] = {}
        self._ring_full = False
        self._posts: Deque[Tuple[str, str, str, Any, float]] = deque()  # (addr, kind, key, value, queued)
        self._bs_clients: Dict[str, BootstrapClient] = {}
        self._backoff: Dict[str, Tuple[float, float]] = {}  # addr -> (retry at, delay)
        self._announced = self.mode != "prefill"
        self.prefill_info_table: Dict[str, PrefillInfo] = {}
        self._want_info: Set[str] = set()
        self._kv: Optional[RegionMap] = None
        self._aux: Optional[RegionMap] = None

        host = _connect_host(getattr(server_args, "host", None))
        port = getattr(server_args, "disaggregation_bootstrap_port", None)
        self.bootstrap_addr: Optional[str] = f"{host}:{int(port)}" if port else None
        if self.mode == "prefill" and not self.bootstrap_addr:
            raise ValueError("prefill manager: server_args.disaggregation_bootstrap_port is not set")

        self.client = _connect(sock)
        try:
            self.node_id = self.client.node_id
            self.max_segments = self.client.max_segments
            self._kv = RegionMap(self.client, list(zip(kv_ptrs, kv_lens)), self.gpu_id, allow_mirror=False)
            self._aux = RegionMap(self.client, list(zip(aux_ptrs, aux_lens)), self.gpu_id, allow_mirror=True)
        except BaseException:
            self._release()
            raise
        self._threads = [
            threading.Thread(target=self._reap_loop, name=f"kvproxy-reap-{self.engine_rank}", daemon=True),
            threading.Thread(target=self._bootstrap_loop, name=f"kvproxy-boot-{self.engine_rank}", daemon=True),
        ]
        for t in self._threads:
            t.start()
        log.info("kvproxy %s manager rank %d on %s: %d KV buffers, %d aux buffers, %d regions",
                 self.mode, self.engine_rank, self.node_id, len(kv_ptrs), len(aux_ptrs),
                 self._kv.region_count + self._aux.region_count)

    @staticmethod
    def _check_supported(args: Any, server_args: Any) -> None:
        state_types = list(getattr(args, "state_types", None) or [])
        legacy = getattr(args, "state_type", "none")
        if state_types or (legacy not in (None, "none")):
            raise NotImplementedError(
                f"kvproxy.sglang does not move model state buffers ({state_types or legacy}): "
                "use it for models with a plain paged KV cache")
        if int(getattr(server_args, "pp_size", 1) or 1) > 1:
            raise NotImplementedError("kvproxy.sglang does not support pipeline-parallel prefill (pp_size > 1)")
        if int(getattr(args, "dcp_size", 1) or 1) > 1:
            raise NotImplementedError("kvproxy.sglang does not support decode context parallelism (dcp_size > 1)")

    # ---- layout ----

    def _layout(self) -> Dict[str, List[List[int]]]:
        """Per buffer [region key, offset in region, item bytes, buffer bytes]."""
        assert self._kv is not None and self._aux is not None
        return {
            "kv": [[p.key, p.offset, item, p.length] for p, item in zip(self._kv.placements, self.kv_item_lens)],
            "aux": [[p.key, p.offset, item, p.length] for p, item in zip(self._aux.placements, self.aux_item_lens)],
        }

    def register_to_bootstrap(self) -> None:
        """Announce this prefill worker to the bootstrap server (done in the
        background, retried until the server answers; sglang's contract)."""
        with self._lock:
            self._announced = self.mode != "prefill"
        self._wake.set()

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        """Decode side: fetch what the prefill server at ``bootstrap_addr`` runs,
        into :attr:`prefill_info_table`. Returns False if it cannot be reached yet."""
        if bootstrap_addr in self.prefill_info_table:
            return True
        try:
            info = BootstrapClient(bootstrap_addr, timeout=_BOOTSTRAP_IO_TIMEOUT)
            try:
                self._store_info(bootstrap_addr, info.info())
            finally:
                info.close()
        except BootstrapError as e:
            log.debug("prefill info from %s: %s", bootstrap_addr, e)
            return False
        return bootstrap_addr in self.prefill_info_table

    def _store_info(self, addr: str, reply: Dict[str, Any]) -> None:
        ranks = reply.get("ranks") or []
        info = PrefillInfo()
        for r in ranks:
            info.engine_ranks.add(int(r["engine_rank"]))
            info.node_ids[int(r["engine_rank"])] = str(r.get("node_id", ""))
            info.page_size = r.get("page_size")
        with self._lock:
            self.prefill_info_table[addr] = info
            self._want_info.discard(addr)
            self._changed.notify_all()

    # ---- requests ----

    def _add_sender(self, s: "KvproxyKVSender") -> None:
        with self._lock:
            if s.key in self._senders and self._senders[s.key] is not s:
                s._fail_locked("protocol", f"a second sender for bootstrap room {s.bootstrap_room} on rank {self.engine_rank}")
                return
            self._senders[s.key] = s
            self._fail_if_gone_locked(s)
        self._wake.set()

    def _add_receiver(self, r: "KvproxyKVReceiver") -> None:
        with self._lock:
            while True:
                tag = secrets.randbits(_TAG_BITS)
                if tag and tag not in self._by_tag:
                    break
            r.tag = tag
            self._by_tag[tag] = r
            if r.key in self._receivers and self._receivers[r.key] is not r:
                r._fail_locked("protocol", f"a second receiver for bootstrap room {r.bootstrap_room} on rank {self.engine_rank}")
                return
            self._receivers[r.key] = r
            if r.bootstrap_addr not in self.prefill_info_table:
                self._want_info.add(r.bootstrap_addr)
            self._fail_if_gone_locked(r)
        self._wake.set()

    def _fail_if_gone_locked(self, req: _Request) -> None:
        if self._gone is not None:
            req._fail_locked("daemon-gone", self._gone)
        elif self._closing:
            req._fail_locked("closed", "the kvproxy manager is closed")

    def _remove(self, req: _Request) -> None:
        with self._lock:
            if isinstance(req, KvproxyKVSender):
                if self._senders.get(req.key) is req:
                    del self._senders[req.key]
                self._drop_queued_locked(req)
            else:
                if self._receivers.get(req.key) is req:
                    del self._receivers[req.key]
                    # The receiver reads the status entry last: it deletes them all;
                    # not while its abort may still be unread (the entries expire).
                    if req._state in _FINAL or req._give_up is None:
                        self._post_locked(req.bootstrap_addr, "delete", req.key, None)
                self._by_tag.pop(getattr(req, "tag", None), None)
        self._wake.set()

    def _post_locked(self, addr: str, kind: str, key: str, value: Any) -> None:
        """Queue a put (``meta``, ``abort``, ``status``) or a ``delete`` for the bootstrapper."""
        self._posts.append((addr, kind, key, value, time.monotonic()))
        self._wake.set()

    # ---- data path (prefill) ----

    def _kv_segments(self, src: Sequence[int], dst: Sequence[int], layout: List[List[int]]) -> List[Tuple[int, int, int, int, int]]:
        """Segments moving source pages ``src`` onto destination pages ``dst``, every KV buffer.

        :raises ValueError: a page index is out of a buffer's bounds.
        """
        assert self._kv is not None
        runs = _pair_runs(src, dst)
        segs = []
        for b, (p, item) in enumerate(zip(self._kv.placements, self.kv_item_lens)):
            dkey, doff, _ditem, dlen = layout[b]
            for s0, d0, n in runs:
                if s0 < 0 or d0 < 0 or (s0 + n) * item > p.length or (d0 + n) * item > dlen:
                    raise ValueError(f"pages {s0}..{s0 + n - 1} -> {d0}..{d0 + n - 1} are outside buffer {b} "
                                     f"({p.length // item} pages here, {dlen // item} there)")
                segs.append((p.key, p.offset + s0 * item, dkey, doff + d0 * item, n * item))
        return segs

    def _aux_segments(self, src_index: int, dst_index: int, layout: List[List[int]]) -> List[Tuple[int, int, int, int, int]]:
        """One segment per aux buffer (row ``src_index`` here -> row ``dst_index`` there),
        copying the rows into their mirrors first."""
        assert self._aux is not None
        segs = []
        for b, (p, item) in enumerate(zip(self._aux.placements, self.aux_item_lens)):
            dkey, doff, _ditem, dlen = layout[b]
            if src_index < 0 or dst_index < 0 or (src_index + 1) * item > p.length or (dst_index + 1) * item > dlen:
                raise ValueError(f"aux row {src_index} -> {dst_index} is outside aux buffer {b}")
            p.to_mirror(src_index * item, item)
            segs.append((p.key, p.offset + src_index * item, dkey, doff + dst_index * item, item))
        return segs

    def _enqueue_locked(self, s: "KvproxyKVSender", segs: List[Tuple[int, int, int, int, int]]) -> None:
        for piece in _split(segs, self.max_segments, _PIECE_BYTES):
            if s._next_piece > _PIECE_MAX:
                s._fail_locked("unsupported", f"a request needs more than {_PIECE_MAX + 1} kvproxy transfers")
                return
            uid = (s._tag << _PIECE_BITS) | s._next_piece
            s._next_piece += 1
            if uid in self._inflight:
                s._fail_locked("protocol", f"transfer id {uid:#x} is already in flight (two decode ranks drew one tag)")
                return
            self._queue.append(_Piece(s, uid, s._peer, piece))
            s._pending += 1
        self._flush_locked()

    def _flush_locked(self) -> None:
        """Submit queued transfers while fewer than max_inflight are in flight."""
        self._ring_full = False
        while self._queue and len(self._inflight) < self.config.max_inflight:
            piece = self._queue[0]
            s = piece.sender
            if s._state in _FINAL:
                self._queue.popleft()
                s._pending -= 1
                s._settle_locked()
                continue
            now = time.monotonic()
            if now >= s._submit_by:
                s._fail_locked("waiting-timeout", "the decode side stopped waiting for this request "
                               "(its waiting_timeout passed) before it was submitted")
                continue
            timeout = s._xfer_timeout
            if not math.isinf(s._land_by):
                timeout = min(timeout or math.inf, s._land_by - now)
            try:
                self.client.submit(piece.peer, piece.segs, piece.uid, timeout=timeout)
            except RingFull:
                self._ring_full = True  # the reaper retries soon: no completion may come to wake it
                return
            except KvproxyError as e:
                self._queue.popleft()
                piece.sender._pending -= 1
                piece.sender._fail_locked("submit", str(e))
                continue
            self._queue.popleft()
            self._inflight[piece.uid] = piece

    def _drop_queued_locked(self, s: "KvproxyKVSender") -> None:
        kept = deque(p for p in self._queue if p.sender is not s)
        s._pending -= len(self._queue) - len(kept)
        self._queue = kept

    def _cancel_inflight_locked(self, s: "KvproxyKVSender") -> None:
        for uid, p in list(self._inflight.items()):
            if p.sender is s:
                try:
                    self.client.cancel(uid)
                except KvproxyError:
                    pass

    # ---- background threads ----

    def _reap_loop(self) -> None:
        """Reap completions and dispatch them; notice a dead daemon."""
        while not self._closing:
            try:
                comps = self.client.wait(timeout=0.001 if self._ring_full else 0.2)
            except KvproxyError as e:
                if not self._closing:
                    self._daemon_gone(f"kvproxyd at {self.client.socket_path} went away ({e})")
                return
            with self._lock:
                for c in comps:
                    if c.kind == "done":
                        piece = self._inflight.pop(c.user_id, None)
                        if piece is not None:
                            piece.sender._piece_done(c)
                    elif c.kind == "landed":
                        r = self._by_tag.get(c.user_id >> _PIECE_BITS)
                        if r is not None:
                            r._landed(c)
                self._flush_locked()

    def _daemon_gone(self, why: str) -> None:
        with self._lock:
            self._gone = why
            self._queue.clear()
            self._inflight.clear()
            for s in self._senders.values():
                s._pending = 0  # no completion comes any more, nothing moves any more
            for req in list(self._senders.values()) + list(self._receivers.values()):
                req._fail_locked("daemon-gone", why)

    def _bs_call(self, addr: str, call: Callable[[BootstrapClient], Any]) -> Tuple[bool, Any]:
        """``call`` on the client of ``addr``: (True, its result), or (False, the
        :class:`BootstrapError` or None) when the server did not answer now or
        is still left alone after an earlier failure (backing off, so one unreachable prefill server does
        not stall the exchange with the others)."""
        now = time.monotonic()
        retry_at, delay = self._backoff.get(addr, (0.0, 0.0))
        if now < retry_at:
            return False, None
        c = self._bs_clients.get(addr)
        if c is None:
            c = self._bs_clients[addr] = BootstrapClient(addr, timeout=_BOOTSTRAP_IO_TIMEOUT)
        try:
            result = call(c)
        except BootstrapError as e:
            delay = min(max(2 * delay, _BACKOFF_MIN), _BACKOFF_MAX)
            self._backoff[addr] = (now + delay, delay)
            log.debug("%s (next try in %.1f s)", e, delay)
            return False, e
        self._backoff.pop(addr, None)
        return True, result

    def _bootstrap_loop(self) -> None:
        """The side channel: announce, fetch prefill info, post, long-poll."""
        while not self._closing:
            if not self._bootstrap_round():
                # Nothing moved: ask again soon where something is pending (a
                # server backing off, prefill ranks still missing), else sleep
                # until woken.
                now = time.monotonic()
                # A server nothing asked for lately needs no retries.
                self._backoff = {a: v for a, v in self._backoff.items() if v[0] > now - _BACKOFF_MAX}
                pending = self._backoff or self._want_info or self._posts
                self._wake.wait(_BACKOFF_MIN if pending else 1.0)
            self._wake.clear()
        self._send_posts()  # once more: the aborts close() queued
        for c in self._bs_clients.values():
            c.close()

    def _bootstrap_round(self) -> bool:
        """One pass; True when the next one should start at once."""
        busy = False
        if not self._announced:
            record = {"engine_rank": self.engine_rank, "dp_rank": self.dp_rank, "node_id": self.node_id,
                      "page_size": self.page_size, "layout": self._layout(), "pid": os.getpid()}
            ok, _ = self._bs_call(self.bootstrap_addr, lambda c: c.announce(f"{self.dp_rank}.{self.engine_rank}", record))
            self._announced = busy = ok
        with self._lock:
            want = list(self._want_info)
        for addr in want:
            ok, reply = self._bs_call(addr, lambda c: c.info())
            if ok:
                self._store_info(addr, reply)
        busy = self._send_posts() or busy
        # One long poll per server and pass, over every kind this manager waits for.
        waits: Dict[str, Dict[str, List[str]]] = {}
        with self._lock:
            for s in self._senders.values():
                if s._state not in _FINAL:
                    kinds = waits.setdefault(s.bootstrap_addr, {})
                    if s._state == KVPoll.Bootstrapping:
                        kinds.setdefault("meta", []).append(s.key)
                    kinds.setdefault("abort", []).append(s.key)
            for r in self._receivers.values():
                if r._state == KVPoll.Transferring and (r._meta_posted or r._give_up is not None):
                    waits.setdefault(r.bootstrap_addr, {}).setdefault("status", []).append(r.key)
        wait_ms = 100 if len(waits) <= 1 else 20
        for addr, kinds in waits.items():
            asked = time.monotonic()
            ok, reply = self._bs_call(addr, lambda c: c.wait(kinds, wait_ms))
            if not ok:
                continue
            busy = True  # the long poll itself paced this round
            found, ages = reply
            with self._lock:
                for key, value in found.get("meta", {}).items():
                    if key in self._senders:  # stored at asked - age at the earliest, in this clock
                        self._senders[key]._on_meta(value, asked - ages.get("meta", {}).get(key, 0) / 1000)
                for key, value in found.get("abort", {}).items():
                    if key in self._senders:
                        self._senders[key]._on_abort(value)
                for key, value in found.get("status", {}).items():
                    if key in self._receivers:
                        self._receivers[key]._on_status(value)
        return busy

    def _send_posts(self) -> bool:
        """Send the queued puts and deletes, in order per server; keep those of
        servers that did not answer, drop those older than bootstrap_timeout
        and metadata of receivers that ended or gave up. True if any was sent."""
        with self._lock:
            posts = list(self._posts)
            self._posts.clear()
        keep: List[Tuple[str, str, str, Any, float]] = []
        blocked: Set[str] = set()
        sent = False
        now = time.monotonic()
        for post in posts:
            addr, kind, key, value, t = post
            if now - t > self.config.bootstrap_timeout:
                log.info("dropped %s %s for bootstrap server %s: unanswered for %g s", kind, key, addr,
                         self.config.bootstrap_timeout)
                continue
            if addr in blocked:
                keep.append(post)
                continue
            r = None
            if kind == "meta":
                with self._lock:
                    r = self._receivers.get(key)
                    if r is None or r._state in _FINAL or r._give_up is not None:
                        continue  # never sent: nothing to take back
                    r._meta_tried = True  # from now on the prefill side may hold it
            if kind == "delete":
                ok, err = self._bs_call(addr, lambda c: c.delete(key))
            else:
                ok, err = self._bs_call(addr, lambda c: c.put(kind, key, value))
            if r is not None:
                with self._lock:
                    if ok or (err is not None and err.maybe_done):
                        r._meta_put_end = time.monotonic()
                        r._meta_posted = r._meta_posted or ok
                    elif r._meta_put_end is None:  # no try reached the server
                        r._meta_tried = False
                        if r._give_up is not None and r._state not in _FINAL:
                            r._end_give_up_locked()
            if not ok:
                blocked.add(addr)
                keep.append(post)
                continue
            sent = True
        with self._lock:
            self._posts.extendleft(reversed(keep))
        return sent

    # ---- lifetime ----

    def wait_for_change(self, timeout: float) -> None:
        """Block until some request of this manager changes state (or ``timeout``
        seconds pass). For drivers outside sglang (tests, examples, benchmarks)
        that would otherwise spin on ``poll()``."""
        with self._changed:
            self._changed.wait(timeout)

    def close(self) -> None:
        """Fail what is still open (code ``closed``), stop the threads,
        disconnect from kvproxyd (which reclaims the regions). Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for req in list(self._senders.values()) + list(self._receivers.values()):
                if isinstance(req, KvproxyKVReceiver) and req._state not in _FINAL:
                    req._post_abort_locked("closed", "the kvproxy manager is closed")
                req._fail_locked("closed", "the kvproxy manager is closed")
        self._wake.set()
        self.client.close()
        for t in self._threads:
            t.join(timeout=10)
        self._release()

    def _release(self) -> None:
        for m in (self._kv, self._aux):
            if m is not None:
                m.close()
        self.client.close()

    def __enter__(self) -> "KvproxyKVManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class KvproxyKVSender(_Request):
    """Prefill side of one request (sglang's ``KVSender``).

    Call sequence (sglang's prefill scheduler): ``poll()`` until
    ``WaitingForInput`` (the decode side's metadata arrived),
    ``pop_decode_prefix_len()``, ``init(num_pages, aux_index)``, ``send()``
    once per chunk of page indices, ``poll()`` until ``Success`` or
    ``Failed``, ``clear()``.
    """

    def __init__(self, mgr: KvproxyKVManager, bootstrap_addr: Optional[str], bootstrap_room: int,
                 dest_tp_ranks: Optional[List[int]] = None, pp_rank: int = 0, **_ignored: Any) -> None:
        if mgr.mode != "prefill":
            raise ValueError("a KVSender needs a prefill manager")
        self._init_request(mgr, bootstrap_addr, bootstrap_room)
        self.dest_tp_ranks = dest_tp_ranks
        self._meta: Optional[Dict[str, Any]] = None
        self._peer = 0
        self._tag = 0
        self._dst_pages: List[int] = []
        self._prefix_len = 0
        self._num_pages: Optional[int] = None
        self._aux_index: Optional[int] = None
        self._sent_pages = 0
        self._all_sent = False
        self._next_piece = 0
        self._pending = 0
        self._bytes = 0
        self._t_send: Optional[float] = None
        self._t_done: Optional[float] = None
        # From the decode side's metadata: no submission from _submit_by on,
        # every transfer ended by _land_by (this clock; inf: no bound given).
        self._submit_by = math.inf
        self._land_by = math.inf
        self._xfer_timeout = mgr.config.transfer_timeout
        self._outcome_posted = False
        mgr._add_sender(self)

    # bootstrapper thread, manager lock held
    def _on_meta(self, meta: Dict[str, Any], stored_at: float) -> None:
        mgr = self.kv_mgr
        if self._state != KVPoll.Bootstrapping:
            return
        try:
            if meta.get("v") != _META_VERSION:
                raise ValueError(f"metadata version {meta.get('v')}, this adapter speaks {_META_VERSION}")
            kv, aux = meta["layout"]["kv"], meta["layout"]["aux"]
            theirs = [int(x[2]) for x in kv]
            if theirs != mgr.kv_item_lens:
                self._fail_locked("layout", f"KV buffers differ: {len(mgr.kv_item_lens)} here with page bytes "
                                  f"{mgr.kv_item_lens[:4]}..., {len(theirs)} on {meta.get('node_id')} with {theirs[:4]}... "
                                  "(same model, TP size and page size on both sides?)")
                return
            if meta.get("aux_index") is not None and [int(x[2]) for x in aux] != mgr.aux_item_lens:
                self._fail_locked("layout", "aux buffers differ between prefill and decode")
                return
            node = str(meta["node_id"])
            pages = [p for first, n in meta["pages"] for p in range(int(first), int(first) + int(n))]
            tag = int(meta["tag"])
            within, xfer_ms = meta.get("submit_within_ms"), meta.get("transfer_timeout_ms")
            if within is not None:
                self._submit_by = stored_at + int(within) / 1000
            if xfer_ms is not None:
                self._land_by = self._submit_by + int(xfer_ms) / 1000
                if self._xfer_timeout is None:
                    self._xfer_timeout = int(xfer_ms) / 1000
        except (KeyError, TypeError, ValueError) as e:
            self._fail_locked("protocol", f"bad metadata from the decode side: {e}")
            return
        try:
            self._peer = mgr.client.peer(node)
        except PeerNotFound as e:
            self._fail_locked("peer-unknown", f"decode node {node!r} is not a peer of kvproxyd {mgr.node_id}: "
                              f"{e.reason or e.strerror}")
            return
        except KvproxyError as e:
            self._fail_locked("daemon-gone" if isinstance(e, Disconnected) else "protocol", str(e))
            return
        self._meta = meta
        self._tag = tag
        self._dst_pages = pages
        self._prefix_len = int(meta.get("decode_prefix_len") or 0)
        self._set_locked(KVPoll.WaitingForInput)

    def _post_outcome_locked(self) -> None:
        if self._state == KVPoll.Success:
            value = {"state": "success", "bytes": self._bytes}
        else:
            f = self._failure
            code = f.code if f else "?"
            value = {"state": "aborted" if code == "aborted-by-decode" else "failed", "code": code,
                     "reason": f.failure_reason if f else "?"}
        value["node_id"] = self.kv_mgr.node_id
        self._outcome_posted = True
        self.kv_mgr._post_locked(self.bootstrap_addr, "status", self.key, value)

    def _settle_locked(self) -> None:
        """Post the failure once no transfer of the request is queued or in
        flight: the decode side may reuse its pages when it reads it."""
        if self._state == KVPoll.Failed and self._pending == 0 and not self._outcome_posted:
            self._post_outcome_locked()

    def _fail_locked(self, code: str, reason: str, completion: Optional[Completion] = None, from_prefill: bool = False) -> bool:
        if not super()._fail_locked(code, reason, completion, from_prefill):
            return False
        self.kv_mgr._drop_queued_locked(self)
        self.kv_mgr._cancel_inflight_locked(self)
        self._settle_locked()  # now, or when the last cancelled transfer's completion is in
        return True

    # bootstrapper thread, manager lock held
    def _on_abort(self, abort: Dict[str, Any]) -> None:
        self._fail_locked("aborted-by-decode", f"the decode side ({abort.get('node_id', '?')}) gave the request up: "
                          f"{abort.get('code', '?')}: {abort.get('reason', '?')}")

    def _check_done_locked(self) -> None:
        if self._all_sent and self._pending == 0 and self._state not in _FINAL:
            self._t_done = time.monotonic()
            self._set_locked(KVPoll.Success)
            self._post_outcome_locked()

    # reaper thread, manager lock held
    def _piece_done(self, c: Completion) -> None:
        self._pending -= 1
        if c.ok:
            self._bytes += c.bytes
            self._check_done_locked()
            self._settle_locked()
            return
        if not self._fail_locked(c.status_name, f"kvproxy transfer {c.user_id:#x} ({c.nseg} segments) from {self.kv_mgr.node_id} "
                          f"to {self._meta.get('node_id') if self._meta else '?'} ended with status {c.status_name}",
                          completion=c):
            self._settle_locked()

    def poll(self) -> KVPoll:
        """The request's state; fails it once ``bootstrap_timeout`` passed without metadata."""
        mgr = self.kv_mgr
        with mgr._lock:
            if self._state == KVPoll.Bootstrapping and time.monotonic() - self._t0 > mgr.config.bootstrap_timeout:
                self._fail_locked("bootstrap-timeout", f"no metadata from the decode side within "
                                  f"{mgr.config.bootstrap_timeout:g} s (bootstrap server {self.bootstrap_addr})")
            return self._state

    def pop_decode_prefix_len(self) -> int:
        """Tokens of the request the decode side already holds (sent only the rest); 0 after the first call."""
        with self.kv_mgr._lock:
            n, self._prefix_len = self._prefix_len, 0
            return n

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        """Announce the request's size: ``num_kv_indices`` pages in all, and its aux row.

        The page count must equal what the decode side allocated, else the request fails (``layout``).
        """
        with self.kv_mgr._lock:
            if self._state in _FINAL:
                return
            self._num_pages = int(num_kv_indices)
            self._aux_index = None if aux_index is None else int(aux_index)
            if self._meta is not None and self._num_pages != len(self._dst_pages):
                self._fail_locked("layout", f"prefill sends {self._num_pages} pages, the decode side "
                                  f"allocated {len(self._dst_pages)}")

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        """True for a chunk with pages, and for the last chunk even without (it carries the aux row)."""
        return num_pages > 0 or bool(last_chunk)

    def send(self, kv_indices: Any, state_indices: Any = None, *_args: Any, **_kw: Any) -> None:
        """Send one chunk: the pages ``kv_indices`` (page indices, in request
        order) go to the decode side's next pages. The chunk that completes
        the count given to :meth:`init` also sends the aux row. Errors fail
        the request (see :meth:`poll`); nothing is raised."""
        pages = _int_list(kv_indices)
        mgr = self.kv_mgr
        with mgr._lock:
            if self._state in _FINAL:
                return
            if self._meta is None or self._num_pages is None:
                self._fail_locked("protocol", "send() before the decode side's metadata arrived and init() was called")
                return
            if _has_items(state_indices):
                self._fail_locked("unsupported", "state buffers (mamba/SWA/DSA) are not moved by kvproxy.sglang")
                return
            if self._num_pages != len(self._dst_pages):
                self._fail_locked("layout", f"prefill sends {self._num_pages} pages, the decode side "
                                  f"allocated {len(self._dst_pages)}")
                return
            start, end = self._sent_pages, self._sent_pages + len(pages)
            if end > self._num_pages:
                self._fail_locked("layout", f"{end} pages sent, init() announced {self._num_pages}")
                return
            try:
                segs = mgr._kv_segments(pages, self._dst_pages[start:end], self._meta["layout"]["kv"])
                last = end == self._num_pages
                daux = self._meta.get("aux_index")
                if last and daux is not None and mgr.aux_item_lens:
                    if self._aux_index is None:
                        raise ValueError("the decode side expects an aux row, init() gave no aux_index")
                    segs += mgr._aux_segments(self._aux_index, int(daux), self._meta["layout"]["aux"])
            except ValueError as e:
                self._fail_locked("layout", str(e))
                return
            self._sent_pages = end
            self._all_sent = last
            if self._t_send is None:
                self._t_send = time.monotonic()
            self._set_locked(KVPoll.Transferring)
            mgr._enqueue_locked(self, segs)
            self._check_done_locked()

    def get_transfer_metric(self) -> TransferMetric:
        """Seconds from the first send() to Success, and the bytes moved."""
        lat = self._t_done - self._t_send if self._t_done is not None and self._t_send is not None else None
        return TransferMetric(transfer_latency_s=lat, transfer_total_bytes=self._bytes)

    def clear(self) -> None:
        """Forget the request (after Success or Failed)."""
        self.kv_mgr._remove(self)


class KvproxyKVReceiver(_Request):
    """Decode side of one request (sglang's ``KVReceiver``).

    Call sequence (sglang's decode scheduler): ``init(prefill_dp_rank)``,
    ``poll()`` until ``WaitingForInput`` (the prefill rank is known),
    ``send_metadata(page_indices, aux_index, state_indices,
    decode_prefix_len)``, ``poll()`` until ``Success`` or ``Failed``,
    ``clear()``. Older sglang releases call ``init(page_indices, aux_index)``
    instead of ``send_metadata``: that works too.
    """

    tag: int

    def __init__(self, mgr: KvproxyKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None,
                 **_ignored: Any) -> None:
        if mgr.mode != "decode":
            raise ValueError("a KVReceiver needs a decode manager")
        self._init_request(mgr, bootstrap_addr, bootstrap_room)
        self.prefill_dp_rank = 0
        self._expected: Optional[int] = None
        self._landed_bytes = 0
        self._prefill_done = False
        self._aux_index: Optional[int] = None
        self._meta_posted = False
        # The metadata may have reached the prefill side from the first try on;
        # when the latest try ended; how long after it data may still land.
        self._meta_tried = False
        self._meta_put_end: Optional[float] = None
        self._land_within = 0.0
        # Set when the request was given up after its metadata may have gone
        # out: (code, reason, completion), reported once nothing can land.
        self._give_up: Optional[Tuple[str, str, Optional[Completion]]] = None
        self._t_meta: Optional[float] = None
        mgr._add_receiver(self)

    def init(self, prefill_dp_rank: Any = 0, aux_index: Optional[int] = None, state_indices: Any = None) -> None:
        """``init(prefill_dp_rank)``; or, as older sglang calls it, ``init(page_indices, aux_index)``."""
        if _is_index_list(prefill_dp_rank):
            self.send_metadata(prefill_dp_rank, aux_index, state_indices)
        else:
            self.prefill_dp_rank = int(prefill_dp_rank or 0)

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Any = None,
                      decode_prefix_len: Optional[int] = None) -> None:
        """Tell the prefill side where the request's pages go: ``kv_indices``
        (page indices here, in request order, after the ``decode_prefix_len``
        tokens already held) and the aux row ``aux_index``."""
        pages = _int_list(kv_indices)
        mgr = self.kv_mgr
        with mgr._lock:
            if self._state in _FINAL:
                return
            if _has_items(state_indices):
                self._fail_locked("unsupported", "state buffers (mamba/SWA/DSA) are not moved by kvproxy.sglang")
                return
            self._aux_index = None if aux_index is None or not mgr.aux_item_lens else int(aux_index)
            self._expected = len(pages) * mgr.kv_page_bytes + (
                sum(mgr.aux_item_lens) if self._aux_index is not None else 0)
            xfer_s = mgr.config.transfer_timeout or _DEFAULT_TRANSFER_TIMEOUT
            self._land_within = mgr.config.waiting_timeout + xfer_s
            meta = {
                "v": _META_VERSION,
                "node_id": mgr.node_id,
                "engine_rank": mgr.engine_rank,
                "tag": self.tag,
                "layout": mgr._layout(),
                "pages": _runs(pages),
                "aux_index": self._aux_index,
                "decode_prefix_len": int(decode_prefix_len or 0),
                # The prefill side submits nothing later than this after the
                # entry was stored, each transfer ending this soon after.
                "submit_within_ms": int(mgr.config.waiting_timeout * 1000),
                "transfer_timeout_ms": int(xfer_s * 1000),
            }
            self._t_meta = time.monotonic()
            self._set_locked(KVPoll.Transferring)
            mgr._post_locked(self.bootstrap_addr, "meta", self.key, meta)

    # reaper thread, manager lock held
    def _landed(self, c: Completion) -> None:
        if not c.ok:
            self._fail_locked(c.status_name, f"kvproxy transfer {c.user_id:#x} landed with status {c.status_name}",
                              completion=c)
            return
        self._landed_bytes += c.bytes
        self.kv_mgr._changed.notify_all()

    def _fail_locked(self, code: str, reason: str, completion: Optional[Completion] = None, from_prefill: bool = False) -> bool:
        """Fail the request; once its metadata may have reached the prefill side,
        only post an abort there and report ``Failed`` when nothing can land
        any more (see :meth:`poll`), unless the failure says so already."""
        gone = code in ("daemon-gone", "closed")  # the regions go: nothing can land any more
        if self._give_up is not None and not gone:
            return False
        if from_prefill or gone or not self._post_abort_locked(code, reason):
            return super()._fail_locked(code, reason, completion, from_prefill)
        self._give_up = (code, reason, completion)
        log.info("bootstrap room %d: %s: %s; waiting for the prefill side to stop", self.bootstrap_room, code, reason)
        return True

    def _post_abort_locked(self, code: str, reason: str) -> bool:
        """Tell the prefill side to stop, if it may hold the metadata. True if posted."""
        if self._state in _FINAL or self._give_up is not None or not self._meta_tried:
            return False
        mgr = self.kv_mgr
        mgr._post_locked(self.bootstrap_addr, "abort", self.key, {"node_id": mgr.node_id, "code": code, "reason": reason})
        return True

    def _end_give_up_locked(self) -> None:
        assert self._give_up is not None
        _Request._fail_locked(self, *self._give_up)

    # bootstrapper thread, manager lock held
    def _on_status(self, status: Dict[str, Any]) -> None:
        if self._give_up is not None:
            # The prefill side posts its outcome only with none of its transfers in flight.
            if status.get("state") in ("success", "failed", "aborted"):
                self._end_give_up_locked()
        elif status.get("state") == "success":
            self._prefill_done = True
            self.kv_mgr._changed.notify_all()
        elif status.get("state") in ("failed", "aborted"):
            self._fail_locked(str(status.get("code", "?")),
                              f"prefill side ({status.get('node_id', '?')}): {status.get('reason', '?')}",
                              from_prefill=True)

    def _finish_locked(self) -> None:
        mgr = self.kv_mgr
        if self._aux_index is not None and mgr._aux is not None:
            for p, item in zip(mgr._aux.placements, mgr.aux_item_lens):
                p.from_mirror(self._aux_index * item, item)
        self._set_locked(KVPoll.Success)

    def poll(self) -> KVPoll:
        """The request's state; fails it once ``bootstrap_timeout`` passed in
        ``Bootstrapping`` or ``waiting_timeout`` passed without all its data."""
        mgr = self.kv_mgr
        with mgr._lock:
            now = time.monotonic()
            if self._give_up is not None:
                end = self._meta_put_end
                if self._state not in _FINAL and end is not None and now > end + self._land_within + _LAND_SLACK:
                    self._end_give_up_locked()  # the prefill side never answered; its transfers ended by now
            elif self._state == KVPoll.Bootstrapping:
                info = mgr.prefill_info_table.get(self.bootstrap_addr)
                if info is not None and mgr.engine_rank in info.engine_ranks:
                    self._set_locked(KVPoll.WaitingForInput)
                elif now - self._t0 <= mgr.config.bootstrap_timeout:
                    mgr._want_info.add(self.bootstrap_addr)  # ask (again) in the background
                else:
                    what = "is unreachable" if info is None else f"has no prefill rank {mgr.engine_rank}"
                    self._fail_locked("bootstrap-timeout", f"bootstrap server {self.bootstrap_addr} {what} "
                                      f"after {mgr.config.bootstrap_timeout:g} s")
            elif self._state == KVPoll.Transferring:
                assert self._expected is not None and self._t_meta is not None
                if self._landed_bytes >= self._expected or self._prefill_done:
                    self._finish_locked()
                elif not self._meta_posted and now - self._t_meta > mgr.config.bootstrap_timeout:
                    self._fail_locked("bootstrap-timeout", f"metadata not delivered to bootstrap server "
                                      f"{self.bootstrap_addr} within {mgr.config.bootstrap_timeout:g} s")
                elif now - self._t_meta > mgr.config.waiting_timeout:
                    self._fail_locked("waiting-timeout", f"{self._landed_bytes} of {self._expected} bytes landed "
                                      f"within {mgr.config.waiting_timeout:g} s")
            return self._state

    def clear(self) -> None:
        """Forget the request (after Success or Failed)."""
        self.kv_mgr._remove(self)


class KvproxyKVBootstrapServer(BootstrapServer):
    """sglang's ``KVBootstrapServer``: the side channel's mailbox, on the
    prefill node (``KvproxyKVBootstrapServer(host=..., port=...)``). See
    :mod:`kvproxy._bootstrap` for the protocol."""

    def __init__(self, host: str = "", port: int = 8998, **_ignored: Any) -> None:
        super().__init__(host, port)


class KvproxyBackend:
    """sglang's dynamic-backend provider: ``"class_name": "KvproxyBackend"``.

    ``get_kv_class(class_type)`` maps sglang's ``KVClassType`` (compared by
    value: ``kvargs``, ``manager``, ``sender``, ``receiver``,
    ``bootstrap_server``) to this module's classes.
    """

    _CLASSES: Dict[str, type] = {}

    def get_kv_class(self, class_type: Any) -> Optional[Type]:
        return self._CLASSES.get(str(getattr(class_type, "value", class_type)).lower())


KvproxyBackend._CLASSES = {
    "kvargs": KVArgs,
    "manager": KvproxyKVManager,
    "sender": KvproxyKVSender,
    "receiver": KvproxyKVReceiver,
    "bootstrap_server": KvproxyKVBootstrapServer,
}

# sglang's generic names.
KVManager = KvproxyKVManager
KVSender = KvproxyKVSender
KVReceiver = KvproxyKVReceiver
KVBootstrapServer = KvproxyKVBootstrapServer
