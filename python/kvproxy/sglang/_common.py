# SPDX-License-Identifier: BSD-3-Clause
"""Types and helpers shared by the sglang adapter's modules.

sglang's own names (``KVPoll``, ``KVArgs``, ``KVTransferMetric``,
``DisaggregationMode``) are mirrored here with the same values, so the
adapter runs without sglang installed (tests, examples) and compares equal
to sglang's objects when it is.
"""

from __future__ import annotations

import enum
import errno
import logging
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from .._client import Completion
from .._errors import KvproxyError
from .._status import status_errno

log = logging.getLogger("kvproxy.sglang")
_now = time.monotonic

# Transfer user ids: the decode receiver's tag in the high 48 bits, the
# transfer's number within the request in the low 16. The receiver's fence
# covers exactly its tag: value tag << 16, mask ~0xffff.
TAG_BITS = 48
PIECE_BITS = 16
PIECE_MAX = (1 << PIECE_BITS) - 1
FENCE_MASK = ~PIECE_MAX & ((1 << 64) - 1)
# Version of the messages on the manager-to-manager channel (3: several
# prefill ranks per decode rank and the other way round, state components).
PROTO_VERSION = 3
# What the decode side assumes of the prefill side's transfer deadline when
# KVPROXY_TRANSFER_TIMEOUT is not set (kvproxyd's shipped timeouts.default_ms),
# and the slack it adds before trusting that a request's data can no longer land.
DEFAULT_TRANSFER_TIMEOUT = 30.0
LAND_SLACK = 2.0


class KVPoll(enum.IntEnum):
    """Transfer states, the values of sglang's ``KVPoll`` (plain ints compare equal)."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


FINAL = (KVPoll.Failed, KVPoll.Success)


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
    (per-request metadata rows), ``page_size``, ``system_dp_rank``,
    ``pp_rank``, ``prefill_start_layer``, ``kv_head_num``/``total_kv_head_num``
    (MHA/GQA with different TP sizes), ``kv_layer_ids``, and the state
    components: ``state_types`` with ``state_data_ptrs``/``state_data_lens``/
    ``state_item_lens`` (one list per component), ``state_dim_per_tensor``,
    ``state_slice_outer_counts``, ``state_conv_shard_groups``, ``state_layer_ids``.
    """

    engine_rank: int = 0
    gpu_id: int = 0
    page_size: int = 1
    system_dp_rank: int = 0
    pp_rank: int = 0
    prefill_start_layer: int = 0
    dcp_size: int = 1
    dcp_rank: int = 0
    kv_data_ptrs: List[int]
    kv_data_lens: List[int]
    kv_item_lens: List[int]
    aux_data_ptrs: List[int]
    aux_data_lens: List[int]
    aux_item_lens: List[int]
    state_types: List[Any]

    def __init__(self, **kw: Any) -> None:
        for name in ("kv_data_ptrs", "kv_data_lens", "kv_item_lens", "aux_data_ptrs", "aux_data_lens",
                     "aux_item_lens", "state_types", "state_data_ptrs", "state_data_lens", "state_item_lens",
                     "state_dim_per_tensor"):
            setattr(self, name, [])
        for k, v in kw.items():
            setattr(self, k, v)


@dataclass
class TransferMetric:
    """What ``get_transfer_metric()`` returns (the fields of sglang's ``KVTransferMetric``)."""

    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


# Typed failure codes beyond kvproxy's transfer statuses, and their errno
# (a transfer status's errno is the binding's: status_errno()).
ADAPTER_CODE_ERRNO = {
    "peer-unknown": errno.ENOENT,
    "layout": errno.EINVAL,
    "bootstrap-timeout": errno.ETIMEDOUT,
    "waiting-timeout": errno.ETIMEDOUT,
    "unreachable": errno.EHOSTUNREACH,
    "daemon-gone": errno.EPIPE,
    "aborted": errno.ECANCELED,
    "aborted-by-decode": errno.ECANCELED,
    "another-rank": errno.ECANCELED,
    "rebootstrap": errno.EIO,
    "memory-released": errno.ESHUTDOWN,
    "closed": errno.ESHUTDOWN,
    "protocol": errno.EPROTO,
    "unsupported": errno.EOPNOTSUPP,
    "submit": errno.EIO,
}


def code_errno(code: str) -> int:
    """The errno of a failure code: an adapter code's, else a transfer status's (EIO if neither)."""
    e = ADAPTER_CODE_ERRNO.get(code)
    return e if e is not None else status_errno(code)


class KVTransferError(KvproxyError):
    """A request's KV transfer failed; raised by ``failure_exception()``.

    Attributes:
        code: what failed, typed: a kvproxy transfer status (``"timeout"``,
            ``"remote"``, ``"peer"``, ``"no-buffers"``, ``"invalid"``,
            ``"canceled"``, ``"shutdown"``, ``"no-peer"``) or one of the
            adapter's: ``"peer-unknown"`` (the other side's kvproxyd is not a
            configured peer), ``"layout"`` (attention TP/CP sizes, page size,
            KV dtype, layer range or buffer layout differ; the reason names
            both values), ``"bootstrap-timeout"``, ``"waiting-timeout"``,
            ``"unreachable"`` (the other side's manager or the bootstrap
            server cannot be reached, or the connection to it was lost),
            ``"daemon-gone"`` (kvproxyd went away), ``"aborted"``,
            ``"aborted-by-decode"`` (prefill side: the decode side gave the
            request up), ``"another-rank"`` (another rank of the request
            failed: sglang's MIN all-reduce), ``"rebootstrap"`` (the prefill
            recompute request failed), ``"memory-released"`` (the engine
            released its KV memory), ``"closed"``, ``"protocol"``,
            ``"unsupported"``, ``"submit"``.
        failure_reason: the text: the daemon's or the other side's reason where it gave one.
        bootstrap_room: the request's bootstrap room.
        completion: the failed :class:`kvproxy.Completion`, if a transfer failed.
        from_prefill: on the decode side, True when the prefill side reported it.
        is_from_another_rank: True when this rank did not fail itself (sglang
            reads it to mute duplicate logs).
    """

    def __init__(self, code: str, reason: str, bootstrap_room: int, completion: Optional[Completion] = None,
                 from_prefill: bool = False, is_from_another_rank: bool = False) -> None:
        super().__init__(code_errno(code), f"KV transfer of bootstrap room {bootstrap_room}",
                         reason=reason, detail=code)
        self.code = code
        self.status_name = code
        self.failure_reason = reason
        self.bootstrap_room = bootstrap_room
        self.completion = completion
        self.from_prefill = from_prefill
        self.is_from_another_rank = is_from_another_rank


def mode_of(mode: Any) -> str:
    """``"prefill"`` or ``"decode"`` from sglang's enum, ours, or a string."""
    value = str(getattr(mode, "value", mode)).lower()
    if value not in ("prefill", "decode"):
        raise ValueError(f"disaggregation mode must be prefill or decode, not {mode!r}")
    return value


def int_list(x: Any) -> List[int]:
    """Page indices from a numpy array, a torch tensor, or any iterable of ints."""
    if x is None:
        return []
    if hasattr(x, "tolist"):
        x = x.tolist()
    return [int(v) for v in x]


def runs(pages: Sequence[int]) -> List[List[int]]:
    """[[first, count], ...] of consecutive page indices."""
    out: List[List[int]] = []
    for p in pages:
        if out and p == out[-1][0] + out[-1][1]:
            out[-1][1] += 1
        else:
            out.append([p, 1])
    return out


def expand_runs(rs: Sequence[Sequence[int]]) -> List[int]:
    """The page indices of ``runs()`` output."""
    return [p for first, n in rs for p in range(int(first), int(first) + int(n))]


def pair_runs(src: Sequence[int], dst: Sequence[int]) -> List[Tuple[int, int, int]]:
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


class RequestBase:
    """What senders and receivers share: the poll state, the typed failure,
    the request's key. Every method runs under the manager's lock."""

    kv_mgr: Any
    bootstrap_room: int
    bootstrap_addr: str
    _state: KVPoll
    _failure: Optional[KVTransferError]

    def _init_request(self, mgr: Any, bootstrap_addr: Optional[str], bootstrap_room: Optional[int]) -> None:
        if bootstrap_room is None:
            raise ValueError("kvproxy.sglang needs a bootstrap_room for every request")
        self.kv_mgr = mgr
        self.bootstrap_room = int(bootstrap_room)
        self.bootstrap_addr = str(bootstrap_addr or "")
        self._state = KVPoll.Bootstrapping
        self._failure = None
        self._t0 = _now()

    @property
    def state(self) -> KVPoll:
        """The current state, as :meth:`poll` last saw it."""
        return self._state

    @property
    def conclude_state(self) -> Optional[KVPoll]:
        """``Success`` or ``Failed`` once the request ended, else None (sglang reads it)."""
        return self._state if self._state in FINAL else None

    def _set_locked(self, state: KVPoll) -> None:
        if self._state not in FINAL and state != self._state:
            self._state = state
            self.kv_mgr._changed.notify_all()

    def _fail_locked(self, code: str, reason: str, completion: Optional[Completion] = None,
                     from_prefill: bool = False) -> bool:
        """Report the request Failed (once). Returns True if this call failed it."""
        if self._state in FINAL:
            return False
        self._failure = KVTransferError(code, reason, self.bootstrap_room, completion, from_prefill)
        self._state = KVPoll.Failed
        log.info("bootstrap room %d: %s: %s", self.bootstrap_room, code, reason)
        self.kv_mgr._changed.notify_all()
        return True

    def _another_rank_error(self) -> KVTransferError:
        return KVTransferError("another-rank", "the request failed on another rank of its attention group "
                               f"(this rank: {self._state.name})", self.bootstrap_room, is_from_another_rank=True)
