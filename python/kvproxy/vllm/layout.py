# SPDX-License-Identifier: BSD-3-Clause
"""vLLM's paged KV cache tensors in kvproxy terms: planes, block pairs, transfer plans.

vLLM hands a worker ``{layer_name: tensor}``. Whatever the attention
backend, each tensor has one dimension that counts *kernel blocks*; the
dimensions after it make up one block, the dimensions before it (if any)
select separate caches that share the block index:

=================================  ==========================================
backend                            shape (logical order)
=================================  ==========================================
FlashAttention (K/V split)         ``[2, num_blocks, block_size, heads, dim]``
FlashInfer                         ``[num_blocks, 2, block_size, heads, dim]``
MLA (one latent cache)             ``[num_blocks, block_size, latent_dim]``
=================================  ==========================================

(HND/NHD differ only in the strides of the dimensions after the block
dimension.) A *plane* is the run of blocks selected by one index of the
leading dimensions: logical block ``b`` of a plane lives at ``ptr + b *
stride`` and is ``stride`` bytes long. The attention kernel may use blocks
smaller than the scheduler's (``block_size`` tokens): then the tensor has
``r = num_kernel_blocks / num_blocks`` kernel blocks per logical block, and
logical block ``b`` is kernel blocks ``b*r .. b*r+r-1``, contiguous, so a
plane's logical stride is ``r`` kernel strides. Nothing here imports torch:
a tensor is anything with ``shape``, ``stride()``, ``element_size()`` and
``data_ptr()``.

A request moves as *transfers* of at most ``per_xfer`` consecutive block
positions (positions count through the KV-cache groups in order), so that
both sides know, without talking, which blocks each transfer carries: the
decode side maps each landed transfer, and each one that did not land, to
its blocks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .slicing import Geom, Template

__all__ = [
    "LayoutError",
    "Plane",
    "Layout",
    "planes_of_tensor",
    "build_layout",
    "pair_blocks",
    "blocks_per_transfer",
    "plan_transfers",
    "positions_to_blocks",
    "transfer_count",
]

# A segment as the binding takes it: (src_key, src_off, dst_key, dst_off, length).
Seg = Tuple[int, int, int, int, int]


class LayoutError(ValueError):
    """A KV cache tensor kvproxy cannot describe, or two sides that do not match."""


@dataclass(frozen=True)
class Plane:
    """One run of logical blocks: block ``b`` at ``ptr + b * stride``, ``stride`` bytes.

    ``sig`` describes the bytes inside a block (element size, inner sizes and
    strides, kernel blocks per logical block): two planes with equal ``sig``
    hold the same token/head/dim at the same byte.
    """

    layer: str
    index: int  # which index of the leading dimensions (0 when none)
    group: int
    ptr: int
    stride: int
    blocks: int
    sig: str
    geom: Optional[Geom] = None  # the inside of a kernel block (head slicing)


def _shape_of(t: Any) -> List[int]:
    return [int(s) for s in t.shape]


def _strides_of(t: Any) -> List[int]:
    st = t.stride
    return [int(s) for s in (st() if callable(st) else st)]


def planes_of_tensor(layer: str, t: Any, num_blocks: int, block_size: int, group: int = 0) -> List[Plane]:
    """The planes of one layer's KV cache tensor.

    :param num_blocks: logical blocks (the scheduler's ``num_blocks``).
    :param block_size: tokens per logical block (``cache_config.block_size``).
    :raises LayoutError: no dimension counts the blocks, the blocks are not
        dense (padding or overlap inside a block), the leading dimensions
        overlap, or the block dimension is ambiguous.
    """
    shape, strides = _shape_of(t), _strides_of(t)
    es = int(t.element_size())
    ptr = int(t.data_ptr())
    if len(shape) != len(strides) or not shape:
        raise LayoutError(f"layer {layer}: shape {shape} and strides {strides} do not match")
    if num_blocks < 1 or block_size < 1:
        raise LayoutError(f"layer {layer}: num_blocks {num_blocks} and block_size {block_size} must be >= 1")
    # The block dimension: its size is r * num_blocks with r dividing
    # block_size, and some later dimension holds the block_size / r tokens of
    # a kernel block. The outermost such dimension wins (a leading K/V
    # dimension of size 2 only qualifies for caches of one or two blocks).
    cands = []
    for k, n in enumerate(shape):
        if n % num_blocks or block_size % (n // num_blocks or 1):
            continue
        r = n // num_blocks
        if r >= 1 and (block_size // r) in shape[k + 1:]:
            cands.append((k, r))
    if not cands:
        raise LayoutError(
            f"layer {layer}: no dimension of shape {shape} counts the {num_blocks} blocks "
            f"(of {block_size} tokens, or a whole number of kernel blocks per block)"
        )
    if len(cands) > 1 and num_blocks <= 2:
        raise LayoutError(f"layer {layer}: cannot tell the block dimension of shape {shape} apart "
                          f"with only {num_blocks} blocks")
    k, r = cands[0]
    inner = list(range(k + 1, len(shape)))
    # The inner dimensions must pack one block densely (any order of them):
    # then a logical block is one run of r * strides[k] elements.
    elems = 1
    for j in sorted(inner, key=lambda j: strides[j]):
        if shape[j] == 1:
            continue
        if strides[j] != elems:
            raise LayoutError(
                f"layer {layer}: the blocks of shape {shape} strides {strides} are not dense "
                f"(dimension {j} has stride {strides[j]}, expected {elems})"
            )
        elems *= shape[j]
    if strides[k] != elems:
        raise LayoutError(
            f"layer {layer}: block stride {strides[k]} of shape {shape} is not the block's "
            f"{elems} elements (padded or overlapping blocks)"
        )
    span = shape[k] * strides[k]
    outer = list(range(k))
    for j in outer:
        if shape[j] > 1 and strides[j] < span:
            raise LayoutError(f"layer {layer}: leading dimension {j} of shape {shape} strides {strides} "
                              "overlaps the block dimension")
    sig = f"e{es}:r{r}:" + ",".join(f"{shape[j]}/{strides[j]}" for j in inner)
    dtype = getattr(t, "dtype", None)
    if dtype is not None:
        sig = f"{dtype}:" + sig
    # vLLM's attention backends give the logical shape [..., tokens, heads,
    # head_dim] (HND/NHD only permute the strides); MLA's [blocks, tokens,
    # latent] has no heads dimension.
    dims = [(shape[j], strides[j]) for j in inner]
    heads = len(dims) - 2 if len(dims) >= 3 and dims[-3][0] == block_size // r else None
    geom = Geom.of(dtype, es, r, dims, heads)
    planes = []
    for n, idx in enumerate(itertools.product(*(range(shape[j]) for j in outer))):
        off = sum(i * strides[j] for i, j in zip(idx, outer)) * es
        planes.append(Plane(layer, n, group, ptr + off, r * strides[k] * es, num_blocks, sig, geom))
    return planes


@dataclass(frozen=True)
class Layout:
    """A worker's planes in a fixed order (group, layer order, leading index).

    Both sides of a transfer build it from the same model, so plane ``i`` of
    the prefill side pairs with plane ``i`` of the decode side.
    """

    planes: Tuple[Plane, ...]
    groups: int

    def signature(self) -> List[List[Any]]:
        """What must be equal on both sides: per plane its group, length and sig."""
        return [[p.group, p.stride, p.sig] for p in self.planes]

    def slice_signature(self) -> List[List[Any]]:
        """What must be equal on both sides when their TP sizes differ: per plane
        its group and block layout but the heads' count, and that count."""
        return [[p.group, p.geom.sig() if p.geom else p.sig, p.geom.head_count if p.geom else None]
                for p in self.planes]

    def heads(self) -> Optional[int]:
        """KV heads per block (equal in every plane), or None when some plane
        has no heads dimension (MLA) or they differ."""
        counts = {p.geom.head_count if p.geom else None for p in self.planes}
        return counts.pop() if len(counts) == 1 else None

    def group_planes(self, g: int) -> List[int]:
        return [i for i, p in enumerate(self.planes) if p.group == g]

    def block_bytes(self, g: int) -> int:
        return sum(p.stride for p in self.planes if p.group == g)

    def buffers(self) -> List[Tuple[int, int]]:
        """``(ptr, length)`` of every plane, for :class:`kvproxy._memory.RegionMap`."""
        return [(p.ptr, p.blocks * p.stride) for p in self.planes]


def build_layout(kv_caches: Mapping[str, Any], groups: Sequence[Sequence[str]], num_blocks: int,
                 block_size: int) -> Layout:
    """The layout of a worker's KV caches.

    :param groups: the layer names of each KV-cache group, in vLLM's order
        (``kv_cache_config.kv_cache_groups[g].layer_names``); layers missing
        from ``kv_caches`` are skipped, layers that share one tensor count once.
    :raises LayoutError: a tensor kvproxy cannot describe, or no KV cache at all.
    """
    planes: List[Plane] = []
    seen: Dict[Tuple[int, int], str] = {}
    for g, names in enumerate(groups):
        for name in names:
            t = kv_caches.get(name)
            if t is None:
                continue
            for p in planes_of_tensor(name, t, num_blocks, block_size, g):
                if (p.ptr, p.stride) in seen:
                    continue  # a layer that shares another layer's cache (KV sharing)
                seen[(p.ptr, p.stride)] = name
                planes.append(p)
    if not planes:
        raise LayoutError(f"no KV cache tensors among {sorted(kv_caches)[:8]} for the groups' layers")
    return Layout(tuple(planes), max(1, len(groups)))


def pair_blocks(src: Sequence[Sequence[int]], dst: Sequence[Sequence[int]]) -> List[List[Tuple[int, int]]]:
    """Per group, ``(src_block, dst_block)`` for each decode block position.

    The decode side allocates blocks only for what its own prefix cache does
    not hold, so it may have fewer blocks than the prefill side: its blocks
    pair with the prefill side's last ones.

    :raises LayoutError: group counts differ, or the decode side has more
        blocks in a group than the prefill side computed.
    """
    if len(src) != len(dst):
        raise LayoutError(f"{len(src)} KV-cache groups on the prefill side, {len(dst)} on the decode side")
    out = []
    for g, (s, d) in enumerate(zip(src, dst)):
        if len(d) > len(s):
            raise LayoutError(f"group {g}: the decode side expects {len(d)} blocks, the prefill side has {len(s)}")
        out.append(list(zip(s[len(s) - len(d):], d)))
    return out


def blocks_per_transfer(layout: Layout, max_segments: int, max_bytes: int,
                        per_block: Optional[Sequence[int]] = None) -> int:
    """Block positions per transfer: every block may be a run of its own, so
    one transfer needs at most ``per_xfer`` times the descriptors of one
    block (``per_block``: per plane; 1 each, whole blocks, by default)."""
    descs = per_block or [1] * len(layout.planes)
    planes = max(sum(descs[i] for i in layout.group_planes(g)) for g in range(layout.groups)) or 1
    block = max(layout.block_bytes(g) for g in range(layout.groups)) or 1
    return max(1, min(max_segments // planes, max_bytes // block))


def plan_transfers(layout: Layout, pairs: Sequence[Sequence[Tuple[int, int]]], per_xfer: int,
                   src_regions: Sequence[Tuple[int, int]], dst_regions: Sequence[Tuple[int, int]],
                   templates: Optional[Sequence[Template]] = None,
                   dst_strides: Optional[Sequence[int]] = None) -> List[List[Tuple[int, ...]]]:
    """The segments of each transfer of a request.

    Transfer ``n`` carries block positions ``[n * per_xfer, (n+1) * per_xfer)``
    (counted through the groups in order). Within a transfer, blocks that
    are consecutive on both sides coalesce into one segment per plane, or,
    with ``templates`` (head slices, :mod:`.slicing`), into the template's
    few segments per plane.

    :param src_regions: per plane, ``(key, offset)`` of block 0 in the local region.
    :param dst_regions: per plane, ``(key, offset)`` on the decode side.
    :param templates: per plane, the head slice to send (None: whole blocks).
    :param dst_strides: per plane, the decode side's block length (default: ours).
    """
    flat = [(g, s, d) for g, ps in enumerate(pairs) for s, d in ps]
    out: List[List[Tuple[int, ...]]] = []
    gplanes = [layout.group_planes(g) for g in range(layout.groups)]
    for start in range(0, len(flat), per_xfer):
        segs: List[Seg] = []
        items = flat[start:start + per_xfer]
        i = 0
        while i < len(items):
            g, s0, d0 = items[i]
            n = 1
            while (i + n < len(items) and items[i + n][0] == g and items[i + n][1] == s0 + n
                   and items[i + n][2] == d0 + n):
                n += 1
            for pi in gplanes[g]:
                st = layout.planes[pi].stride
                dst_st = dst_strides[pi] if dst_strides is not None else st
                sk, so = src_regions[pi]
                dk, do = dst_regions[pi]
                if templates is None or templates[pi].whole:
                    segs.append((sk, so + s0 * st, dk, do + d0 * dst_st, n * st))
                else:
                    templates[pi].emit(segs, sk, so + s0 * st, dk, do + d0 * dst_st, n)
            i += n
        out.append(segs)
    return out


def positions_to_blocks(blocks: Sequence[Sequence[int]], start: int, end: int) -> List[int]:
    """The block ids at flat positions ``[start, end)`` of per-group block lists."""
    out: List[int] = []
    base = 0
    for ids in blocks:
        lo, hi = max(start - base, 0), min(end - base, len(ids))
        if lo < hi:
            out.extend(ids[lo:hi])
        base += len(ids)
    return out


def transfer_count(blocks: Sequence[Sequence[int]], per_xfer: int) -> int:
    total = sum(len(b) for b in blocks)
    return (total + per_xfer - 1) // per_xfer
