# SPDX-License-Identifier: BSD-3-Clause
"""A model's KV cache and state with known contents, sharded as sglang shards it.

The *global* cache of a request is a function: every 32-byte unit (one KV
head of one token of one layer, an MLA latent, one state unit) holds
``(room, kind << 32 | layer, token or row, head or unit)`` as four
little-endian u64, repeated to the unit's size. A rank's buffers hold its
shard of it, laid out as sglang's pools lay it out:

* MHA/GQA (``MHATokenToKVPool``): per layer of the rank's pipeline stage a
  K and a V buffer of ``[pages * page, local heads, head bytes]``; local
  heads as ``QKVParallelLinear`` splits them (``total // tp`` each, or with
  fewer heads than ranks head ``rank // (tp // total)``); ``kv_item_lens`` =
  bytes per page. Layers of a stage: ``get_pp_indices`` (an even split, the
  last stage takes the rest).
* MLA (``MLATokenToKVPool``): one latent buffer per layer, the same on every rank.
* SWA (``SWAKVPool``): the full-attention layers in ``kv_data_ptrs``, the
  sliding-window layers' K/V buffers as state component ``swa`` (window pages
  of their own pool, indexed by ``state_indices``).
* Mamba-style hybrid (``HybridLinearKVPool`` + ``MambaPool``): attention
  layers in ``kv_data_ptrs``, per state tensor and mamba layer one buffer of
  slots; a slot is ``outer`` rows of the tensor's TP-sharded dim
  (``state_dim_per_tensor`` = the local dim; with ``groups`` each
  concatenated sub-block is sharded on its own, as GDN's conv state).

Memory is host memory (memfds) or, with ``gpu``, CUDA tensors (torch).
Used by sglang_harness.py's rank processes (test_sglang_topo.py, test_gpu_sglang_topo.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from typing import Any, Dict, List, Sequence, Tuple

UNIT = 32
K, V, LATENT, SWA_K, SWA_V, MAMBA = 1, 2, 3, 4, 5, 16


def block(room: int, kind: int, layer: int, token: int, unit: int) -> bytes:
    return struct.pack("<QQQQ", room & (2**64 - 1), (kind << 32) | layer, token, unit)


def fill(n: int, blk: bytes) -> bytes:
    return (blk * (n // UNIT + 1))[:n]


def heads_of(total: int, tp: int, rank: int) -> List[int]:
    """The global KV heads a rank holds (sglang's QKVParallelLinear split)."""
    if total >= tp:
        n = total // tp
        return list(range(rank * n, (rank + 1) * n))
    return [rank // (tp // total)]


def pp_layers(layers: int, pp_size: int, pp_rank: int) -> Tuple[int, int]:
    """[start, end) of a pipeline stage, as sglang's get_pp_indices splits them."""
    part = layers // pp_size
    start = pp_rank * part
    return start, (layers if pp_rank == pp_size - 1 else start + part)


class Pool:
    """``size`` bytes of host memory (a memfd) or of GPU memory (a torch tensor)."""

    def __init__(self, size: int, gpu: bool) -> None:
        self.size = size
        self.t = None
        self.host = None
        if gpu:
            import torch

            self.t = torch.zeros(size, dtype=torch.uint8, device="cuda")
            self.base = self.t.data_ptr()
        else:
            import kvproxy

            self.host = kvproxy.HostBuffer(size)
            self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.host))

    def write(self, off: int, data: bytes) -> None:
        if self.t is not None:
            import torch

            self.t[off:off + len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        else:
            ctypes.memmove(self.base + off, data, len(data))

    def read_all(self) -> bytes:
        if self.t is not None:
            import torch

            torch.cuda.synchronize()
            return bytes(self.t.cpu().numpy().tobytes())
        return ctypes.string_at(self.base, self.size)


class Buf:
    """One buffer of the pool: what it holds (``what``, ``layer``), where, item size."""

    def __init__(self, pool: Pool, off: int, items: int, item: int, what: str, layer: int, tensor: int = 0) -> None:
        self.pool, self.off, self.items, self.item = pool, off, items, item
        self.what, self.layer, self.tensor = what, layer, tensor

    @property
    def ptr(self) -> int:
        return self.pool.base + self.off

    @property
    def length(self) -> int:
        return self.items * self.item


class ShardedKv:
    """One rank's shard of the model ``m`` (a dict, see test_sglang_topo.py):
    its buffers, the KVArgs fields describing them, the known contents."""

    def __init__(self, m: Dict[str, Any], tp: int, rank: int, pp_size: int, pp_rank: int, gpu: bool) -> None:
        self.m, self.tp, self.rank = m, tp, rank
        self.page = int(m["page"])
        self.mla = m.get("kind") == "mla"
        self.start, self.end = pp_layers(int(m["layers"]), pp_size, pp_rank)
        mine = range(self.start, self.end)
        swa = m.get("swa")
        mamba = m.get("mamba")
        special = set(swa["layers"]) if swa else set(mamba["layers"]) if mamba else set()
        self.attn_layers = [l for l in mine if l not in special]
        self.heads = [] if self.mla else heads_of(int(m["heads"]), tp, rank)
        hb = int(m.get("head_bytes", UNIT))
        tok = int(m["latent_bytes"]) if self.mla else len(self.heads) * hb
        kv_item = self.page * tok
        pages = int(m["pages"])
        self.bufs: List[Buf] = []
        kinds = [LATENT] if self.mla else [K, V]
        self.kv_pool = Pool(max(len(kinds) * len(self.attn_layers) * pages * kv_item, UNIT), gpu)
        at = 0
        for kind in kinds:
            for l in self.attn_layers:
                self.bufs.append(Buf(self.kv_pool, at, pages, kv_item, f"kv{kind}", l))
                at += pages * kv_item
        self.kv_layer_ids = [b.layer for b in self.bufs] if special else []
        self.states: List[Dict[str, Any]] = []
        if swa:
            layers = [l for l in mine if l in special]
            spages = int(swa["pages"])
            pool = Pool(max(2 * len(layers) * spages * kv_item, UNIT), gpu)
            bufs, at = [], 0
            for kind in (SWA_K, SWA_V):
                for l in layers:
                    bufs.append(Buf(pool, at, spages, kv_item, f"swa{kind}", l))
                    at += spages * kv_item
            self.states.append({"type": "swa", "pool": pool, "bufs": bufs, "dims": [], "outer": [], "groups": []})
        if mamba:
            layers = [l for l in mine if l in special]
            slots = int(mamba["slots"])
            tensors = mamba["tensors"]
            size = sum(self._slot_bytes(t) for t in tensors) * len(layers) * slots
            pool = Pool(max(size, UNIT), gpu)
            bufs, dims, outer, groups, at = [], [], [], [], 0
            for k, t in enumerate(tensors):
                for l in layers:
                    bufs.append(Buf(pool, at, slots, self._slot_bytes(t), "mamba", l, k))
                    dims.append(int(t["dim"]) // tp)
                    outer.append(int(t.get("outer", 1)))
                    groups.append(t.get("groups"))
                    at += slots * self._slot_bytes(t)
            self.states.append({"type": "mamba", "pool": pool, "bufs": bufs, "dims": dims, "outer": outer,
                                "groups": groups})

    def _slot_bytes(self, t: Dict[str, Any]) -> int:
        return int(t.get("outer", 1)) * (int(t["dim"]) // self.tp) * int(t.get("unit", UNIT))

    # ---- what the rank tells its manager ----

    def kv_args_fields(self) -> Dict[str, Any]:
        f: Dict[str, Any] = {
            "kv_data_ptrs": [b.ptr for b in self.bufs], "kv_data_lens": [b.length for b in self.bufs],
            "kv_item_lens": [b.item for b in self.bufs], "page_size": self.page,
            "prefill_start_layer": self.start, "prefill_end_layer": self.end,
            "state_types": [s["type"] for s in self.states],
            "state_data_ptrs": [[b.ptr for b in s["bufs"]] for s in self.states],
            "state_data_lens": [[b.length for b in s["bufs"]] for s in self.states],
            "state_item_lens": [[b.item for b in s["bufs"]] for s in self.states],
            "state_dim_per_tensor": [s["dims"] for s in self.states],
            "state_slice_outer_counts": [s["outer"] for s in self.states],
            "state_conv_shard_groups": [s["groups"] for s in self.states],
            "state_layer_ids": [[b.layer for b in s["bufs"]] for s in self.states],
        }
        if self.kv_layer_ids:
            f["kv_layer_ids"] = list(self.kv_layer_ids)
        if not self.mla:
            f["kv_head_num"] = len(self.heads)
            f["total_kv_head_num"] = int(self.m["heads"])
        return f

    # ---- contents ----

    def _page_bytes(self, b: Buf, room: int, page_in_req: int) -> bytes:
        kind = int(b.what[3:] if b.what.startswith("swa") else b.what[2:])
        out = []
        for t in range(self.page):
            tok = page_in_req * self.page + t
            if self.mla:
                out.append(fill(int(self.m["latent_bytes"]), block(room, LATENT, b.layer, tok, 0)))
            else:
                hb = int(self.m.get("head_bytes", UNIT))
                out.extend(fill(hb, block(room, kind, b.layer, tok, h)) for h in self.heads)
        return b"".join(out)

    def _slot(self, b: Buf, room: int) -> bytes:
        t = self.m["mamba"]["tensors"][b.tensor]
        unit = int(t.get("unit", UNIT))
        groups = [int(g) for g in (t.get("groups") or [t["dim"]])]
        out = []
        for r in range(int(t.get("outer", 1))):
            base = 0
            for g in groups:
                n = g // self.tp
                out.extend(fill(unit, block(room, MAMBA + b.tensor, b.layer, r, base + self.rank * n + i))
                           for i in range(n))
                base += g
        return b"".join(out)

    def items_of(self, req: Dict[str, Any], side: str) -> List[Tuple[Buf, int, bytes]]:
        """(buffer, item index, contents) of every item of the request on this
        rank (``side``: "src" or "dst" indices)."""
        room = int(req["room"])
        out = [(b, p, self._page_bytes(b, room, i)) for b in self.bufs for i, p in enumerate(req[side])]
        for s in self.states:
            if s["type"] == "swa":
                for b in s["bufs"]:
                    out += [(b, p, self._page_bytes(b, room, pi))
                            for p, pi in zip(req["swa_" + side], req["swa_pages"])]
            else:
                out += [(b, int(req["mamba_" + side]), self._slot(b, room)) for b in s["bufs"]]
        return out

    def state_indices(self, req: Dict[str, Any], side: str) -> List[List[int]]:
        return [list(req["swa_" + side]) if s["type"] == "swa" else [int(req["mamba_" + side])]
                for s in self.states]

    def write_source(self, req: Dict[str, Any]) -> None:
        for b, i, data in self.items_of(req, "src"):
            b.pool.write(b.off + i * b.item, data)

    def prepare_dst(self, req: Dict[str, Any]) -> None:
        """The request's destination items hold stale bytes (0xee), as freshly allocated pages do."""
        for b, i, _ in self.items_of(req, "dst"):
            b.pool.write(b.off + i * b.item, b"\xee" * b.item)

    def check(self, req: Dict[str, Any], others: Sequence[Dict[str, Any]]) -> Tuple[int, List[str]]:
        """(bad count, first problems): every item of the request equals its
        shard of the global cache; every item of no request in ``others``
        (those in flight, this one included) is zero."""
        images = {id(p): p.read_all() for p in self._pools()}
        bad, why = 0, []
        for b, i, want in self.items_of(req, "dst"):
            got = images[id(b.pool)][b.off + i * b.item:b.off + (i + 1) * b.item]
            if got != want:
                bad += 1
                if len(why) < 3:
                    why.append(f"{b.what} layer {b.layer} item {i}: {got[:32].hex()} != {want[:32].hex()}")
        busy = {(id(b), i) for r in others for b, i, _ in self.items_of(r, "dst")}
        zero: Dict[int, bytes] = {}
        for b in self._all_bufs():
            img = images[id(b.pool)]
            z = zero.setdefault(b.item, bytes(b.item))
            for i in range(b.items):
                if (id(b), i) not in busy and img[b.off + i * b.item:b.off + (i + 1) * b.item] != z:
                    bad += 1
                    if len(why) < 6:
                        why.append(f"{b.what} layer {b.layer} item {i} (not in the request) is not zero")
        return bad, why

    def digest(self, req: Dict[str, Any]) -> str:
        """A hash of the request's destination items as they are now."""
        images = {id(p): p.read_all() for p in self._pools()}
        h = hashlib.sha256()
        for b, i, _ in self.items_of(req, "dst"):
            h.update(images[id(b.pool)][b.off + i * b.item:b.off + (i + 1) * b.item])
        return h.hexdigest()

    def reset(self, req: Dict[str, Any]) -> None:
        """Zero the request's destination items again (the next request's check sees zeros)."""
        for b, i, _ in self.items_of(req, "dst"):
            b.pool.write(b.off + i * b.item, bytes(b.item))

    def _all_bufs(self) -> List[Buf]:
        return self.bufs + [b for s in self.states for b in s["bufs"]]

    def _pools(self) -> List[Pool]:
        return [self.kv_pool] + [s["pool"] for s in self.states]
