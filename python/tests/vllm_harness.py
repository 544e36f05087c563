# SPDX-License-Identifier: BSD-3-Clause
"""A stand-in for vLLM that drives kvproxy.vllm through the calls vLLM makes.

vLLM cannot be installed on the build machines, so the tests play its
parts: the objects the connector reads (VllmConfig, KVCacheConfig, Request,
KVCacheBlocks, SchedulerOutput, KVConnectorOutput, duck-typed with the
attributes vLLM's have) and the call sequence of one engine step, as
vLLM's scheduler (vllm/v1/core/sched/scheduler.py) and the worker's
KV-connector mixin (vllm/v1/worker/kv_connector_model_runner_mixin.py)
make it:

    scheduler: get_num_new_matched_tokens -> update_state_after_alloc ->
               build_connector_meta (every step)
    worker:    bind_connector_metadata -> start_load_kv -> (forward) ->
               wait_for_save -> get_finished(finished_req_ids) ->
               get_block_ids_with_load_errors -> get_kv_connector_stats ->
               clear_connector_metadata
    scheduler: update_connector_output (finished_* once every TP worker
               reported them, as vLLM's KVOutputAggregator counts),
               request_finished(_all_groups) when a request ends

KV caches live in host memory (memfds, kvproxy.HostBuffer) behind tensor
stand-ins with vLLM's shapes; the GPU test passes real torch tensors.
"""

from __future__ import annotations

import collections
import ctypes
import enum
import json
import random
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import kvproxy
from kvproxy.vllm import KvproxyConnector, KvproxyConnectorStats


class Role(enum.Enum):
    """vLLM's KVConnectorRole."""

    SCHEDULER = 0
    WORKER = 1


class RequestStatus(enum.Enum):
    """The members of vLLM's RequestStatus the connector looks at."""

    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5


class FullAttentionSpec:
    """Stands for vLLM's FullAttentionSpec (the connector checks class names)."""


class SlidingWindowSpec(FullAttentionSpec):
    """Stands for vLLM's SlidingWindowSpec (refused)."""


class FakeTensor:
    """A tensor stand-in over memory at ``addr``: what the connector reads of a torch tensor."""

    def __init__(self, addr: int, shape: Sequence[int], es: int = 2, strides: Optional[Sequence[int]] = None,
                 dtype: str = "torch.bfloat16") -> None:
        self.shape = tuple(shape)
        if strides is None:
            st, acc = [], 1
            for n in reversed(self.shape):
                st.append(acc)
                acc *= n
            strides = list(reversed(st))
        self._strides = tuple(strides)
        self._es = es
        self._addr = addr
        self.dtype = dtype
        self.device = SimpleNamespace(type="cpu", index=None)

    def stride(self) -> Tuple[int, ...]:
        return self._strides

    def element_size(self) -> int:
        return self._es

    def data_ptr(self) -> int:
        return self._addr


def addr_of(buf: kvproxy.HostBuffer) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class HostKV:
    """One worker's paged KV cache in one memfd, ``layers`` layers shaped like vLLM's.

    ``layout``: ``flash`` ([2, blocks, block_size, heads, dim] per layer, K
    and V planes), ``flashinfer`` ([blocks, 2, block_size, heads, dim], one
    plane), ``mla`` ([blocks, block_size, dim], one plane). ``kernel_block``
    below ``block_size`` makes the tensors count kernel blocks. ``hnd``
    keeps the logical shape but lays heads out before tokens in memory (as
    vLLM permutes the strides). ``planes`` lists ``(ptr, stride)`` of every
    plane, computed here independently of the connector.
    """

    def __init__(self, layers: int = 4, num_blocks: int = 64, block_size: int = 16, heads: int = 2,
                 head_dim: int = 32, es: int = 2, layout: str = "flash", kernel_block: Optional[int] = None,
                 prefix: str = "model.layers", hnd: bool = False) -> None:
        kb = kernel_block or block_size
        r = block_size // kb
        nk = num_blocks * r
        self.num_blocks, self.block_size = num_blocks, block_size
        self.layout, self.kb, self.r, self.heads, self.head_dim, self.es, self.hnd = \
            layout, kb, r, heads, head_dim, es, hnd
        self.kvparts = 2 if layout == "flashinfer" else 1
        strides: Optional[Tuple[int, ...]] = None
        if layout == "flash":
            shape, nplanes, blk = (2, nk, kb, heads, head_dim), 2, kb * heads * head_dim
            if hnd:  # memory order [2, blocks, heads, tokens, dim]
                strides = (nk * blk, blk, head_dim, kb * head_dim, 1)
        elif layout == "flashinfer":
            shape, nplanes, blk = (nk, 2, kb, heads, head_dim), 1, 2 * kb * heads * head_dim
            if hnd:  # memory order [blocks, 2, heads, tokens, dim]
                strides = (blk, blk // 2, head_dim, kb * head_dim, 1)
        elif layout == "mla":
            shape, nplanes, blk = (nk, kb, head_dim), 1, kb * head_dim
        else:
            raise ValueError(layout)
        per_layer = es
        for n in shape:
            per_layer *= n
        self.buf = kvproxy.HostBuffer(layers * per_layer)
        base = addr_of(self.buf)
        self.tensors: Dict[str, Any] = {}
        self.planes: List[Tuple[int, int]] = []
        for lyr in range(layers):
            lbase = base + lyr * per_layer
            self.tensors[f"{prefix}.{lyr}.self_attn.attn"] = FakeTensor(lbase, shape, es, strides)
            for p in range(nplanes):
                self.planes.append((lbase + p * nk * blk * es, r * blk * es))
        self.block_bytes = sum(st for _p, st in self.planes)

    def block(self, plane: int, b: int) -> bytes:
        ptr, st = self.planes[plane]
        return ctypes.string_at(ptr + b * st, st)

    def fill(self, blocks: Iterable[int], seed: int) -> None:
        for b in blocks:
            for p, (ptr, st) in enumerate(self.planes):
                data = pattern(seed, p, b, st)
                ctypes.memmove(ptr + b * st, data, st)

    def shard(self, seed: int, plane: int, block: int, kv_heads: int, lo: int, hi: int) -> bytes:
        """Heads ``[lo, hi)`` of the model's block ``block`` of ``plane`` (the
        bytes of :func:`global_block`), laid out as this cache holds a block."""
        row = self.head_dim * self.es
        g = global_block(seed, plane, block, self.kvparts, self.block_size, kv_heads, row)
        out = []
        for kk in range(self.r):
            for kv in range(self.kvparts):
                toks = range(kk * self.kb, (kk + 1) * self.kb)
                order = [(t, h) for h in range(lo, hi) for t in toks] if self.hnd else \
                    [(t, h) for t in toks for h in range(lo, hi)]
                for t, h in order:
                    at = ((kv * self.block_size + t) * kv_heads + h) * row
                    out.append(g[at:at + row])
        return b"".join(out)

    def fill_shard(self, blocks: Iterable[int], seed: int, kv_heads: int, lo: int, hi: int) -> None:
        """Fill ``blocks`` with this rank's heads ``[lo, hi)`` of the model's KV."""
        for b in blocks:
            for p, (ptr, st) in enumerate(self.planes):
                data = self.shard(seed, p, b, kv_heads, lo, hi)
                assert len(data) == st
                ctypes.memmove(ptr + b * st, data, st)

    def zero(self) -> None:
        ctypes.memset(addr_of(self.buf), 0, len(self.buf))

    def close(self) -> None:
        self.buf.close()


def global_block(seed: int, plane: int, block: int, kvparts: int, tokens: int, kv_heads: int, row: int) -> bytes:
    """The model's (all heads') bytes of one block of one plane, as
    ``[kvparts][tokens][kv_heads][row bytes]``; every rank's shard is cut from it."""
    return random.Random(f"g{seed}:{plane}:{block}").randbytes(kvparts * tokens * kv_heads * row)


def pattern(seed: int, plane: int, block: int, n: int) -> bytes:
    """The bytes the prefill side holds in ``block`` of ``plane`` (any side can compute them)."""
    return random.Random(f"{seed}:{plane}:{block}").randbytes(n)


def make_vllm_config(role: str, sock: str, tp: int = 1, block_size: int = 16, num_blocks: int = 64,
                     extra: Optional[Dict[str, Any]] = None, kv_heads: Optional[int] = None, mla: bool = False,
                     **parallel: Any) -> SimpleNamespace:
    cfg = {"kvproxy_socket": sock, "kvproxy_bootstrap_host": "127.0.0.1"}
    cfg.update(extra or {})
    kvt = SimpleNamespace(kv_connector="KvproxyConnector", kv_connector_module_path="kvproxy.vllm",
                          kv_role=role, engine_id=f"engine-{random.getrandbits(32):08x}",
                          kv_buffer_device="cuda", kv_connector_extra_config=cfg)
    kvt.get_from_extra_config = lambda k, d: kvt.kv_connector_extra_config.get(k, d)
    pc = SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1, data_parallel_index=0,
                         data_parallel_rank=0, decode_context_parallel_size=1, prefill_context_parallel_size=1)
    for k, v in parallel.items():
        setattr(pc, k, v)
    model = SimpleNamespace(use_mla=mla)
    if kv_heads is not None:  # vLLM's ModelConfig.get_total_num_kv_heads
        model.get_total_num_kv_heads = lambda: kv_heads
    return SimpleNamespace(kv_transfer_config=kvt, parallel_config=pc,
                           cache_config=SimpleNamespace(block_size=block_size, num_gpu_blocks=num_blocks),
                           model_config=model)


def make_kv_cache_config(num_blocks: int, layers: Sequence[str], spec: Any = None, groups: int = 1) -> SimpleNamespace:
    """One full-attention group of every layer, or ``groups`` groups of consecutive layers."""
    per = -(-len(layers) // groups)
    return SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=[
        SimpleNamespace(layer_names=list(layers[g * per:(g + 1) * per]), kv_cache_spec=spec or FullAttentionSpec())
        for g in range(groups)])


def group_lists(blocks: Sequence[Any]) -> List[List[int]]:
    """A request's block ids per KV-cache group: a flat list is the one group's."""
    if blocks and isinstance(blocks[0], (list, tuple)):
        return [list(g) for g in blocks]
    return [list(blocks)]


class Blocks:
    """vLLM's KVCacheBlocks, reduced to the accessor the connector uses."""

    def __init__(self, groups: Sequence[Sequence[int]]) -> None:
        self._groups = [list(g) for g in groups]

    def get_unhashed_block_ids_all_groups(self) -> List[List[int]]:
        return [list(g) for g in self._groups]


class Request:
    """vLLM's Request, reduced to what the connector reads."""

    def __init__(self, rid: str, ntokens: int, params: Optional[Dict[str, Any]]) -> None:
        self.request_id = rid
        self.prompt_token_ids = list(range(ntokens))
        self.num_prompt_tokens = ntokens
        self.kv_transfer_params = params
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0


class Engine:
    """One vLLM instance: a scheduler-side connector and one worker-side connector per TP rank.

    ``tp`` (default: one rank per KV cache) with ``ranks`` (default: all)
    runs only some of the instance's workers here, e.g. when another
    process runs the others; then a request counts as sent or received
    once the local workers reported it. ``on_meta`` sees every step's
    connector metadata (to hand it to such a process).
    """

    def __init__(self, role: str, socks: Sequence[str], kv_caches: Sequence[Dict[str, Any]],
                 num_blocks: int, block_size: int = 16, extra: Optional[Dict[str, Any]] = None,
                 kv_heads: Optional[int] = None, mla: bool = False, tp: Optional[int] = None,
                 ranks: Optional[Sequence[int]] = None, scheduler: bool = True,
                 on_meta: Optional[Callable[[Any], None]] = None, groups: int = 1) -> None:
        tp = tp or len(kv_caches)
        ranks = list(ranks if ranks is not None else range(tp))
        self.tp, self.block_size, self.on_meta = tp, block_size, on_meta
        layers = list(kv_caches[0])
        self.kvcc = make_kv_cache_config(num_blocks, layers, groups=groups)
        self.sched: Optional[KvproxyConnector] = None
        self.workers: List[KvproxyConnector] = []
        try:
            if scheduler:
                self.sched = KvproxyConnector(make_vllm_config(role, socks[0], tp, block_size, num_blocks, extra,
                                                               kv_heads, mla), Role.SCHEDULER, self.kvcc)
            for i, r in enumerate(ranks):
                e = dict(extra or {}, kvproxy_tp_rank=r)
                w = KvproxyConnector(make_vllm_config(role, socks[i], tp, block_size, num_blocks, e, kv_heads, mla),
                                     Role.WORKER, self.kvcc)
                self.workers.append(w)
                w.register_kv_caches(kv_caches[i])
        except BaseException:
            self.close()
            raise
        self.finished_ids: Set[str] = set()
        self._counts: Dict[str, collections.Counter] = {"s": collections.Counter(), "r": collections.Counter()}
        self.sent: Set[str] = set()
        self.received: Set[str] = set()
        self.errors: Set[int] = set()
        self.failed: Set[str] = set()  # receives get_transfer_results named failed
        self.transfer_results = True
        self.stats = KvproxyConnectorStats()
        self.steps = 0

    def step(self) -> SimpleNamespace:
        """One engine step through the connector (no forward work of its own)."""
        so = SimpleNamespace(finished_req_ids=self.finished_ids, scheduled_new_reqs=[], num_scheduled_tokens={})
        self.finished_ids = set()
        meta = self.sched.build_connector_meta(so) if self.sched is not None else self.next_meta()
        if self.on_meta is not None:
            self.on_meta(meta)
        fin_s: Set[str] = set()
        fin_r: Set[str] = set()
        invalid: Set[int] = set()
        for w in self.workers:
            w.bind_connector_metadata(meta)
            w.start_load_kv(SimpleNamespace(no_compile_layers={}))
            w.wait_for_save()
            # Newer vLLM asks get_transfer_results (failed receives named), older get_finished.
            if self.transfer_results:
                res = w.get_transfer_results(so.finished_req_ids)
                s, r = res.finished_sending, res.finished_recving
                self.failed |= res.failed_recving
            else:
                s, r = w.get_finished(so.finished_req_ids)
            invalid |= w.get_block_ids_with_load_errors()
            st = w.get_kv_connector_stats()
            if st is not None:
                self.stats.aggregate(st)
            w.clear_connector_metadata()
            for kind, ids, out in (("s", s, fin_s), ("r", r, fin_r)):
                for x in ids or ():
                    self._counts[kind][x] += 1
                    if self._counts[kind][x] == len(self.workers):
                        del self._counts[kind][x]
                        out.add(x)
        out = SimpleNamespace(finished_sending=fin_s or None, finished_recving=fin_r or None,
                              invalid_block_ids=invalid, kv_connector_stats=None)
        if self.sched is not None:
            self.sched.update_connector_output(out)
        self.sent |= fin_s
        self.received |= fin_r
        self.errors |= invalid
        self.steps += 1
        return out

    def prefill(self, rid: str, blocks: Sequence[int], ntokens: Optional[int] = None,
                status: RequestStatus = RequestStatus.FINISHED_LENGTH_CAPPED) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """A request through the prefill instance, as the proxy sends it; returns
        ``request_finished``'s answer with the params JSON-round-tripped (as the proxy forwards them).
        ``blocks``: the block ids, or a list of them per KV-cache group."""
        groups = group_lists(blocks)
        n = ntokens if ntokens is not None else len(groups[0]) * self.block_size - 3
        req = Request(rid, n, {"do_remote_decode": True, "do_remote_prefill": False})
        assert self.sched.get_num_new_matched_tokens(req, 0) == (0, False)
        self.sched.update_state_after_alloc(req, Blocks(groups), 0)
        self.step()  # the step that runs the prefill's forward
        req.status = status
        req.num_computed_tokens = n
        delay, params = self.sched.request_finished_all_groups(req, tuple(groups))
        self.finished_ids.add(rid)
        return delay, (json.loads(json.dumps(params)) if params is not None else None)

    def decode(self, rid: str, params: Dict[str, Any], blocks: Sequence[int],
               local_hit_tokens: int = 0) -> Tuple[Request, Optional[int], bool]:
        """A request arriving at the decode instance with the prefill's params (``blocks`` as for prefill)."""
        groups = group_lists(blocks)
        req = Request(rid, int(params.get("remote_num_tokens") or len(groups[0]) * self.block_size), dict(params))
        n, is_async = self.sched.get_num_new_matched_tokens(req, local_hit_tokens)
        if is_async:
            req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.sched.update_state_after_alloc(req, Blocks(groups), n or 0)
        return req, n, is_async

    def abort(self, req: Request, blocks: Sequence[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """vLLM's finish_requests(FINISHED_ABORTED) for a waiting decode request."""
        req.status = RequestStatus.FINISHED_ABORTED
        self.finished_ids.add(req.request_id)
        return self.sched.request_finished_all_groups(req, (list(blocks),))

    def next_meta(self) -> Any:
        """The metadata of a step without a local scheduler (a worker-only process): empty."""
        from kvproxy.vllm import KvproxyConnectorMetadata

        return KvproxyConnectorMetadata()

    def close(self) -> None:
        # In parallel: each shutdown waits for its threads' polls (up to half a second).
        conns = self.workers + ([self.sched] if self.sched is not None else [])
        threads = [threading.Thread(target=c.shutdown) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def run_until(engines: Sequence[Engine], done: Callable[[], bool], timeout: float, what: str = "") -> float:
    """Step the engines (as their busy loops do) until ``done()``; bounded. Returns the seconds taken."""
    t0 = time.monotonic()
    while not done():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not done within {timeout} s: {what}")
        for e in engines:
            e.step()
        time.sleep(0.001)  # an idle engine loop's pace; the condition is what is waited for
    return time.monotonic() - t0
