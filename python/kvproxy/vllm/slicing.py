# SPDX-License-Identifier: BSD-3-Clause
"""A KV head range of every block as few kvproxy descriptors as the layout allows.

With different TP sizes on the two sides, a decode rank's block holds a
head slice of a prefill rank's block, or the other way round (see
:mod:`.tp_map`). Inside one kernel block of a plane the slice is a set of
*pieces*: one contiguous run of ``heads x (what is inside a head)`` bytes
for every index of the dimensions outside the heads dimension. NHD
(``[block_size, heads, head_dim]``) gives one piece per token, ``token
pitch`` apart; HND (``[heads, block_size, head_dim]``) one piece per kernel
block; FlashInfer's combined ``[2, ...]`` doubles either. The pieces of both
sides pair up in order (both sides have the same dimensions but the heads'
count, in the same order).

Runs of pieces that are evenly spaced on both sides become one strided
segment (:class:`kvproxy.Segment2D`: ``count`` pieces of ``length`` bytes,
``src_stride``/``dst_stride`` apart), or a contiguous one when the pieces
touch on both sides. For the dense layouts vLLM uses, the pieces of a run
of blocks that are consecutive on both sides are evenly spaced across the
kernel and logical block boundaries too, so such a run is *one* descriptor
per plane, whatever its token count: NHD a Segment2D of ``block_size x
run`` tokens with the token pitches as strides, HND a Segment2D of
``kernel blocks x run`` with the block pitches as strides. A
:class:`Template` works this out once per plane and pair of ranks; emitting
a run's segments is then arithmetic.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence, Tuple

__all__ = ["Geom", "Template", "MAX_BLOCKS"]

# kvproxyd's limits.max_blocks default (and maximum): blocks in one strided segment.
MAX_BLOCKS = 65536


@dataclass(frozen=True)
class Geom:
    """The inside of one kernel block of a plane: dimension sizes (logical
    order), their order in memory (outermost first), element size, kernel
    blocks per logical block, and which dimension counts KV heads (None:
    no heads dimension, e.g. MLA's latent cache)."""

    dtype: str
    es: int
    r: int
    sizes: Tuple[int, ...]
    order: Tuple[int, ...]
    heads: Optional[int]

    @classmethod
    def of(cls, dtype: Any, es: int, r: int, dims: Sequence[Tuple[int, int]], heads: Optional[int]) -> "Geom":
        """From ``(size, stride)`` pairs of the inner dimensions (strides in elements)."""
        order = tuple(sorted(range(len(dims)), key=lambda j: (-dims[j][1], j)))
        return cls(str(dtype), int(es), int(r), tuple(int(s) for s, _ in dims), order, heads)

    @property
    def head_count(self) -> Optional[int]:
        return None if self.heads is None else self.sizes[self.heads]

    def with_heads(self, n: int) -> "Geom":
        """The same layout holding ``n`` heads (the other side's block)."""
        if self.heads is None:
            return self
        sizes = list(self.sizes)
        sizes[self.heads] = int(n)
        return replace(self, sizes=tuple(sizes))

    def strides(self) -> List[int]:
        """Element strides of a dense block in this order."""
        st = [0] * len(self.sizes)
        acc = 1
        for j in reversed(self.order):
            st[j] = acc
            acc *= self.sizes[j]
        return st

    def kernel_bytes(self) -> int:
        n = self.es
        for s in self.sizes:
            n *= s
        return n

    def sig(self) -> str:
        """What both sides must share for their pieces to pair up: all but the
        heads' count ('H')."""
        sizes = ",".join("H" if j == self.heads else str(s) for j, s in enumerate(self.sizes))
        return (f"{self.dtype}:e{self.es}:r{self.r}:[{sizes}]:o{','.join(map(str, self.order))}"
                f":h{'-' if self.heads is None else self.heads}")

    def pieces(self, first: int, n: int) -> Tuple[List[int], int]:
        """Byte offsets (in one kernel block, in memory order) and length of
        the pieces that hold heads ``[first, first + n)`` (local indices)."""
        if self.heads is None:
            return [0], self.kernel_bytes()
        st = self.strides()
        hs = st[self.heads]
        # The dimensions outside the heads in memory (by position in the
        # order, not by stride: a dimension of size 1 ties with its neighbour).
        outer = list(self.order[:self.order.index(self.heads)])
        base = first * hs * self.es
        offs = [base + sum(i * st[j] * self.es for i, j in zip(idx, outer))
                for idx in itertools.product(*(range(self.sizes[j]) for j in outer))]
        return offs, n * hs * self.es


# A run of evenly spaced pieces: (src_off, dst_off, count, src_stride, dst_stride).
_Prog = Tuple[int, int, int, int, int]


def _compress(so: Sequence[int], do: Sequence[int], length: int) -> List[_Prog]:
    """Greedy runs of pieces evenly spaced on both sides (strides 0 for single pieces)."""
    out: List[_Prog] = []
    i = 0
    while i < len(so):
        if i + 1 < len(so):
            ss, ds = so[i + 1] - so[i], do[i + 1] - do[i]
            if ss >= length and ds >= length:
                n = 2
                while (i + n < len(so) and so[i + n] - so[i + n - 1] == ss and do[i + n] - do[i + n - 1] == ds):
                    n += 1
                out.append((so[i], do[i], n, ss, ds))
                i += n
                continue
        out.append((so[i], do[i], 1, 0, 0))
        i += 1
    return out


class Template:
    """The segments of one plane's head slice for a pair of ranks, per run of blocks.

    :param src: the sending side's block geometry; ``src_first``: the first
        of its local heads to send.
    :param dst: the receiving side's; ``dst_first``: where they land.
    :param n: how many heads (ignored without a heads dimension).
    :raises ValueError: the two geometries do not pair up.
    """

    def __init__(self, src: Geom, src_first: int, dst: Geom, dst_first: int, n: int) -> None:
        if src.sig() != dst.sig():
            raise ValueError(f"block layouts {src.sig()} and {dst.sig()} do not pair up")
        so, length = src.pieces(src_first, n)
        do, dlen = dst.pieces(dst_first, n)
        assert length == dlen and len(so) == len(do)
        self.length = length
        self.r = src.r
        self.kb_s, self.kb_d = src.kernel_bytes(), dst.kernel_bytes()
        self.pieces = list(zip(so, do))
        self.progs = _compress(so, do, length)
        self.run: Optional[_Prog] = None
        if len(self.progs) == 1:
            o_s, o_d, cnt, ss, ds = self.progs[0]
            if cnt == 1:
                ss, ds = self.kb_s, self.kb_d
            if cnt * ss == self.kb_s and cnt * ds == self.kb_d:
                # Evenly spaced across kernel (and so logical) blocks too.
                self.run = (o_s, o_d, cnt, ss, ds)
        per_kernel = self.r * len(self.progs)
        self.by_piece = len(self.pieces) < per_kernel
        self.per_block = 1 if self.run else min(per_kernel, len(self.pieces))

    @property
    def whole(self) -> bool:
        """One contiguous segment per run (whole blocks on both sides)."""
        return self.run is not None and self.run[3] == self.length and self.run[4] == self.length

    def emit(self, out: List[Tuple[int, ...]], sk: int, s_at: int, dk: int, d_at: int, n: int) -> None:
        """Append the segments of ``n`` blocks consecutive on both sides, the
        first at byte ``s_at`` of region ``sk`` and ``d_at`` of ``dk``."""
        ln = self.length
        if self.run is not None:
            o_s, o_d, cnt, ss, ds = self.run
            count = cnt * self.r * n
            s, d = s_at + o_s, d_at + o_d
            if ss == ln and ds == ln:
                out.append((sk, s, dk, d, ln * count))
                return
            while count > 0:
                c = min(count, MAX_BLOCKS)
                out.append((sk, s, dk, d, ln, c, ss, ds) if c > 1 else (sk, s, dk, d, ln))
                s, d, count = s + c * ss, d + c * ds, count - c
            return
        kernels = self.r * n
        if self.by_piece:
            # Each piece, across the run's kernel blocks.
            for o_s, o_d in self.pieces:
                _strided(out, sk, s_at + o_s, dk, d_at + o_d, ln, kernels, self.kb_s, self.kb_d)
            return
        for k in range(kernels):
            for o_s, o_d, cnt, ss, ds in self.progs:
                _strided(out, sk, s_at + k * self.kb_s + o_s, dk, d_at + k * self.kb_d + o_d, ln, cnt, ss, ds)


def _strided(out: List[Tuple[int, ...]], sk: int, s: int, dk: int, d: int, ln: int, count: int, ss: int,
             ds: int) -> None:
    while count > 0:
        c = min(count, MAX_BLOCKS)
        out.append((sk, s, dk, d, ln, c, ss, ds) if c > 1 else (sk, s, dk, d, ln))
        s, d, count = s + c * ss, d + c * ds, count - c
