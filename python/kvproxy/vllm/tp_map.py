# SPDX-License-Identifier: BSD-3-Clause
"""Which prefill ranks write which KV heads into which decode ranks (heterogeneous TP).

vLLM shards a model's ``K`` KV heads over the ``T`` ranks of an instance:
with ``T <= K`` rank ``r`` holds heads ``[r*K/T, (r+1)*K/T)``; with ``T > K``
every rank holds one head, ``r*K//T``, replicated ``T/K`` times. Prefill
(``P`` ranks) and decode (``D`` ranks) may shard differently; the TP sizes
must divide one another, as vLLM's own NIXL connector requires. This module
decides, the same way on both sides and without talking, who sends what:

- ``D >= P`` (fan-out): decode rank ``d`` takes all its heads from prefill
  rank ``d*P//D``, which so serves ``D/P`` decode ranks.
- ``D < P`` (fan-in): decode rank ``d`` takes its heads from the prefill
  ranks ``[d*P/D, (d+1)*P/D)``, each head from the first of them that holds
  it (where prefill replicates heads, ``P > K``, the others send nothing);
  several prefill ranks so write different head ranges of the same decode
  blocks.
- MLA (one latent cache, replicated on every rank): decode rank ``d`` takes
  the whole cache from prefill rank ``d*P//D``.

These are the rules of vLLM's ``TransferTopology.get_target_remote_ranks``
and ``compute_tp_mapping`` (the GQA de-duplication included), so a decode
rank reads from the prefill ranks vLLM's connectors would pick. A prefill
rank no decode rank takes from (MLA or replicated heads with ``P > D``) is
told so by the decode side and frees its blocks at once.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

__all__ = ["check_tp", "head_range", "sources", "targets"]

# A source: (prefill rank, first global head, end head); heads None for MLA.
Source = Tuple[int, Optional[int], Optional[int]]


def check_tp(p: int, d: int, kv_heads: Optional[int], mla: bool) -> Optional[str]:
    """None if prefill TP ``p`` and decode TP ``d`` can be mapped, else why not."""
    if p < 1 or d < 1:
        return f"TP sizes {p} and {d} must be >= 1"
    if max(p, d) % min(p, d):
        return f"prefill TP {p} and decode TP {d} do not divide one another"
    if mla or p == d:
        return None
    if not kv_heads or kv_heads < 1:
        return "the number of KV heads is unknown"
    for t in (p, d):
        if (t <= kv_heads and kv_heads % t) or (t > kv_heads and t % kv_heads):
            return f"TP {t} does not divide {kv_heads} KV heads (nor they it)"
    return None


def head_range(rank: int, tp: int, kv_heads: int) -> Tuple[int, int]:
    """The global KV heads ``[lo, hi)`` that rank ``rank`` of ``tp`` holds."""
    if tp <= kv_heads:
        h = kv_heads // tp
        return rank * h, rank * h + h
    head = rank * kv_heads // tp
    return head, head + 1


def sources(d: int, p_tp: int, d_tp: int, kv_heads: Optional[int], mla: bool) -> List[Source]:
    """The prefill ranks decode rank ``d`` takes its KV from, in order, with the
    global head range each sends (None, None for MLA and for equal TP sizes,
    where whole blocks move).

    :raises ValueError: the sizes cannot be mapped (:func:`check_tp`).
    """
    why = check_tp(p_tp, d_tp, kv_heads, mla)
    if why:
        raise ValueError(why)
    if mla or p_tp == d_tp:
        return [(d * p_tp // d_tp, None, None)]
    assert kv_heads is not None
    lo, hi = head_range(d, d_tp, kv_heads)
    cands = range(d * p_tp // d_tp, (d + 1) * p_tp // d_tp) if p_tp > d_tp else [d * p_tp // d_tp]
    out: List[Source] = []
    cur = lo
    for p in cands:
        plo, phi = head_range(p, p_tp, kv_heads)
        if plo <= cur < phi:
            end = min(phi, hi)
            out.append((p, cur, end))
            cur = end
        if cur == hi:
            break
    if cur != hi:  # pragma: no cover - check_tp rules this out
        raise ValueError(f"decode rank {d}: heads [{cur}, {hi}) are on no prefill rank")
    return out


def targets(p: int, p_tp: int, d_tp: int, kv_heads: Optional[int], mla: bool) -> List[int]:
    """The decode ranks prefill rank ``p`` sends to, in order (empty: none)."""
    if p_tp >= d_tp:
        cands = [p * d_tp // p_tp]
    else:
        cands = list(range(p * d_tp // p_tp, (p + 1) * d_tp // p_tp))
    return [d for d in cands if any(s[0] == p for s in sources(d, p_tp, d_tp, kv_heads, mla))]
