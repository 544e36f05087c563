# SPDX-License-Identifier: BSD-3-Clause
"""Which bytes of which prefill rank land where on which decode rank.

Pure functions, no I/O: both sides run the same code on the two layout
announces (:meth:`KvproxyKVManager.layout_announce`), so the prefill side
knows what to send and the decode side knows, before anything moves, that
the sources it will hear from cover each of its buffers exactly once, and
how many bytes a request brings.

The cases, as sglang lays its pools out:

* **MHA/GQA KV**, per layer a K and a V buffer of ``[pool_tokens,
  local_kv_heads, head_dim]``; a page is ``page_size`` consecutive tokens.
  With different attention-TP sizes a decode rank takes from each of its
  prefill ranks the heads both hold: per buffer and run of pages ONE strided
  segment (``count`` = tokens, ``length`` = the heads' bytes, strides = the
  token sizes on the two sides). Heads are split as sglang's
  ``QKVParallelLinear`` splits them: ``total // tp`` per rank, or, with fewer
  KV heads than ranks, head ``rank // (tp // total)`` replicated; of
  several prefill replicas of a head only the lowest rank sends it.
* **MLA** (one latent buffer per layer, the same on every rank): one prefill
  rank writes each decode rank (the first of sglang's target ranks), the
  others send nothing.
* **Pipeline-parallel prefill**: each stage holds layers ``[start, end)``
  and writes the decode buffers of those layers only; buffers pair by layer
  (sglang's ``kv_layer_ids``/``state_layer_ids`` when given, else by the
  stage's ``prefill_start_layer``).
* **State** (sglang's ``state_types``, indexed by ``state_indices``): see
  :data:`STATE_KINDS`.

A :class:`LayoutError` says why a pair of layouts cannot be served; the
adapter reports it as code ``layout``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["LayoutError", "Pair", "Plan", "STATE_KINDS", "kv_heads", "source_ranks", "dests_per_source",
           "build_plan", "check_coverage", "segments", "state_kind"]


class LayoutError(ValueError):
    """The two sides' layouts cannot be paired (the message names both values)."""


# What the adapter does with each sglang StateType (by value; sglang's enum
# is a str enum, older releases call DSA "nsa"):
#   "sliced":     one slot per request (mamba: conv and temporal state),
#                 TP-sharded along ``state_dim_per_tensor`` and resliced when
#                 the TP sizes differ;
#   "heads":      paged like the KV cache (SWA window pages): head-sliced like
#                 the KV buffers on an MHA model, replicated on an MLA one;
#   "replicated": indexed items the same on every TP rank (DSA/NSA indexer
#                 pages, DeepSeek-V4's SWA ring rows and C128 request state,
#                 the NSA kpool tail row): one prefill rank writes each
#                 decode rank;
#   "same-tp":    indexed items moved only between equal TP sizes and without
#                 pipeline parallelism (MiniMax's sparse index K: compacted
#                 sparse-layer lists, as sglang's own backends restrict it).
# Every other type is refused when the manager starts, with its name.
STATE_KINDS: Dict[str, str] = {
    "mamba": "sliced",
    "swa": "heads",
    "dsa": "replicated",
    "nsa": "replicated",
    "swa_ring": "replicated",
    "c128_state": "replicated",
    "nsa_tail": "replicated",
    "minimax_index_k": "same-tp",
}
# Types whose source and destination index lists must have the same length
# (one slot or ring row per request); the paged ones are cut to the shorter
# list, as sglang's backends do (a window may differ by a page).
_EXACT_INDICES = {"mamba", "swa_ring", "c128_state", "nsa_tail"}


def state_kind(type_value: str) -> Optional[str]:
    """How the adapter moves a state type (see :data:`STATE_KINDS`), or None."""
    return STATE_KINDS.get(str(type_value).lower())


def exact_indices(type_value: str) -> bool:
    return str(type_value).lower() in _EXACT_INDICES


# ---------------------------------------------------------------- ranks

def check_tp_sizes(ptp: int, dtp: int) -> None:
    if ptp < 1 or dtp < 1 or (ptp % dtp and dtp % ptp):
        raise LayoutError(f"attention TP sizes must divide one another: prefill {ptp}, decode {dtp}")


def source_ranks(ptp: int, dtp: int, d: int) -> List[int]:
    """The prefill attention-TP ranks that decode rank ``d`` hears from (sglang's
    ``target_tp_ranks``): one when decode TP >= prefill TP, ``ptp // dtp`` otherwise."""
    check_tp_sizes(ptp, dtp)
    if dtp >= ptp:
        return [d // (dtp // ptp)]
    n = ptp // dtp
    return list(range(d * n, (d + 1) * n))


def dests_per_source(ptp: int, dtp: int) -> int:
    """How many decode ranks of a request one prefill rank serves (sglang's ``required_dst_info_num``)."""
    check_tp_sizes(ptp, dtp)
    return max(1, dtp // ptp)


def kv_heads(total: int, tp: int, rank: int) -> Tuple[int, int]:
    """(first global KV head, count) that attention-TP rank ``rank`` of ``tp`` holds."""
    if total >= tp:
        if total % tp:
            raise LayoutError(f"{total} KV heads do not split over attention TP {tp}")
        n = total // tp
        return rank * n, n
    if tp % total:
        raise LayoutError(f"{total} KV heads cannot be replicated over attention TP {tp}")
    return rank // (tp // total), 1


def head_slice(total: int, ptp: int, p: int, dtp: int, d: int) -> Optional[Tuple[int, int, int]]:
    """(first head in the source's local heads, first in the destination's, count)
    that prefill rank ``p`` writes to decode rank ``d``; None: nothing (no common
    head, or a lower source rank holds the same heads: replicas send once)."""
    ps, pn = kv_heads(total, ptp, p)
    ds, dn = kv_heads(total, dtp, d)
    lo, hi = max(ps, ds), min(ps + pn, ds + dn)
    # Head ranges grow with the rank: what lower source ranks hold of the
    # destination's heads is a prefix of them, which they send.
    for q in source_ranks(ptp, dtp, d):
        if q >= p:
            break
        qs, qn = kv_heads(total, ptp, q)
        if max(qs, ds) < min(qs + qn, ds + dn):
            lo = max(lo, min(qs + qn, ds + dn))
    if lo >= hi:
        return None
    return lo - ps, lo - ds, hi - lo


# ---------------------------------------------------------------- pairing

def _ids(announce: Dict[str, Any], explicit: Optional[Sequence[int]], count: int, per_layer: int,
         what: str) -> List[int]:
    if explicit:
        if len(explicit) != count:
            raise LayoutError(f"{what}: {len(explicit)} layer ids for {count} buffers")
        return [int(x) for x in explicit]
    if count % per_layer:
        raise LayoutError(f"{what}: {count} buffers is not a multiple of {per_layer} per layer")
    start = int(announce["layers"][0])
    return [start + i for i in range(count // per_layer)] * per_layer


def pair_by_ids(src: Sequence[int], dst: Sequence[int], what: str) -> List[Tuple[int, int]]:
    """(source buffer, destination buffer) by layer id; the k-th buffer of a
    layer on one side pairs with the k-th of it on the other (K, then V)."""
    where: Dict[Tuple[int, int], int] = {}
    seen: Dict[int, int] = {}
    for j, lid in enumerate(dst):
        k = seen.get(lid, 0)
        seen[lid] = k + 1
        where[(lid, k)] = j
    out = []
    seen = {}
    for i, lid in enumerate(src):
        k = seen.get(lid, 0)
        seen[lid] = k + 1
        j = where.get((lid, k))
        if j is None:
            raise LayoutError(f"{what}: layer {lid} (buffer {i} of the prefill rank) has no buffer on the decode side")
        out.append((i, j))
    return out


# ---------------------------------------------------------------- plans

@dataclass(frozen=True)
class Pair:
    """One source buffer to one destination buffer: of every item (page, slot,
    row) ``blocks`` blocks are moved, each ``length`` bytes at ``src_off`` of
    the source block and ``dst_off`` of the destination block; a block is
    ``item // blocks`` bytes on each side."""

    src: int
    dst: int
    src_item: int
    dst_item: int
    blocks: int
    src_off: int
    dst_off: int
    length: int

    @property
    def item_bytes(self) -> int:
        return self.blocks * self.length

    @property
    def whole(self) -> bool:
        return self.blocks * self.length == self.src_item == self.dst_item


@dataclass
class Plan:
    """What one prefill rank sends one decode rank: KV pairs, aux pairs (empty
    unless this rank writes the aux row), per state component its pairs and
    whether its index lists must match exactly."""

    kv: List[Pair]
    aux: List[Pair]
    states: List[List[Pair]]
    exact: List[bool]

    def kv_bytes_per_page(self) -> int:
        return sum(p.item_bytes for p in self.kv)

    def bytes(self, pages: int, aux: bool, state_counts: Sequence[int]) -> int:
        n = pages * self.kv_bytes_per_page() + (sum(p.item_bytes for p in self.aux) if aux else 0)
        return n + sum(c * sum(p.item_bytes for p in pairs) for c, pairs in zip(state_counts, self.states))


def _whole(i: int, j: int, si: int, di: int, what: str) -> Pair:
    if si != di:
        raise LayoutError(f"{what} differ: prefill {si}, decode {di} bytes per item (buffer {i} -> {j})")
    return Pair(i, j, si, di, 1, 0, 0, si)


def _head_pairs(pairs: Iterable[Tuple[int, int]], sitems: Sequence[int], ditems: Sequence[int], page: int,
                sheads: int, dheads: int, sl: Tuple[int, int, int], what: str) -> List[Pair]:
    soff, doff, n = sl
    out = []
    for i, j in pairs:
        si, di = int(sitems[i]), int(ditems[j])
        if si % (page * sheads) or di % (page * dheads) or si // (page * sheads) != di // (page * dheads):
            raise LayoutError(f"{what}: prefill {si} bytes per page ({sheads} KV heads), decode {di} "
                              f"({dheads} KV heads), page size {page}: not the same head size")
        hb = si // (page * sheads)
        out.append(Pair(i, j, si, di, page, soff * hb, doff * hb, n * hb))
    return out


def _at(values: Optional[Sequence[Any]], i: int, default: Any) -> Any:
    return values[i] if values and i < len(values) else default


def _sliced_pairs(pairs: Iterable[Tuple[int, int]], s: Dict[str, Any], d: Dict[str, Any], ptp: int, p: int,
                  dtp: int, dr: int, what: str) -> List[Pair]:
    """Mamba-style slot state: each tensor's slot is ``outer`` rows of ``dim``
    units, ``dim`` TP-sharded (or, with ``groups``, each of several
    concatenated sub-blocks sharded on its own, as GDN's conv state)."""
    out = []
    for i, j in pairs:
        si, di = int(s["items"][i]), int(d["items"][j])
        if ptp == dtp:
            out.append(_whole(i, j, si, di, what))
            continue
        try:
            sd, dd = int(s["dims"][i]), int(d["dims"][j])
        except (IndexError, KeyError, TypeError, ValueError):
            raise LayoutError(f"{what}: attention TP sizes differ (prefill {ptp}, decode {dtp}) and "
                              "state_dim_per_tensor is missing: cannot reslice the state") from None
        rows = max(int(_at(s.get("outer"), i, 1) or 1), 1)
        if sd <= 0 or dd <= 0 or sd * ptp != dd * dtp or si % (rows * sd) or di % (rows * dd) or \
                si // (rows * sd) != di // (rows * dd):
            raise LayoutError(f"{what} tensor {i}: prefill {sd} of {si} bytes, decode {dd} of {di} bytes "
                              f"per slot do not reslice from TP {ptp} to TP {dtp}")
        unit = si // (rows * sd)
        groups = _at(s.get("groups"), i, None) or [sd * ptp]
        if sum(int(g) for g in groups) != sd * ptp or any(int(g) % ptp or int(g) % dtp for g in groups):
            raise LayoutError(f"{what} tensor {i}: sub-blocks {groups} do not shard over TP {ptp} and {dtp}")
        sbase = dbase = 0
        for g in (int(x) for x in groups):
            gs, gd = g // ptp, g // dtp
            lo, hi = max(p * gs, dr * gd), min((p + 1) * gs, (dr + 1) * gd)
            if lo < hi:
                out.append(Pair(i, j, si, di, rows, (sbase + lo - p * gs) * unit, (dbase + lo - dr * gd) * unit,
                                (hi - lo) * unit))
            sbase, dbase = sbase + gs, dbase + gd
    return out


def _state_pairs(s: Dict[str, Any], d: Dict[str, Any], src: Dict[str, Any], dst: Dict[str, Any],
                 what: str) -> List[Tuple[int, int]]:
    ns, nd = len(s["items"]), len(d["items"])
    if s.get("layer_ids") and d.get("layer_ids"):
        return pair_by_ids(s["layer_ids"], d["layer_ids"], what)
    if ns == nd and (list(src["layers"]) == list(dst["layers"]) or int(src.get("pp_size", 1)) == 1):
        return [(i, i) for i in range(ns)]
    raise LayoutError(f"{what}: prefill {ns} buffers (layers [{src['layers'][0]}, {src['layers'][1]})), decode "
                      f"{nd} (layers [{dst['layers'][0]}, {dst['layers'][1]})): pairing them needs "
                      "KVArgs.state_layer_ids on both sides")


def build_plan(src: Dict[str, Any], dst: Dict[str, Any]) -> Plan:
    """The plan of prefill rank ``src`` for decode rank ``dst`` (two layout announces).

    :raises LayoutError: they cannot be paired (the reason names both values).
    """
    ptp, p = int(src["attn_tp_size"]), int(src["attn_tp_rank"])
    dtp, dr = int(dst["attn_tp_size"]), int(dst["attn_tp_rank"])
    check_tp_sizes(ptp, dtp)
    for key, what in (("page_size", "page size"), ("kv_cache_dtype", "KV cache dtype"), ("is_mla", "MLA layout")):
        if src.get(key) is not None and dst.get(key) is not None and src[key] != dst[key]:
            raise LayoutError(f"{what} differs: prefill {src[key]}, decode {dst[key]}")
    pps, dps = int(src.get("pp_size", 1)), int(dst.get("pp_size", 1))
    if dps != 1 and dps != pps:
        raise LayoutError(f"pipeline-parallel sizes: prefill {pps}, decode {dps} (decode must be 1 or the same)")
    (s0, s1), (d0, d1) = src["layers"], dst["layers"]
    if dps == pps and s1 - s0 != d1 - d0:
        raise LayoutError(f"layer range differs: prefill [{s0}, {s1}), decode [{d0}, {d1})")
    if dps == pps > 1 and d0 != s0:
        # sglang's decode managers are not told their stage's first layer: the
        # same stage on both sides holds the same layers.
        dst = dict(dst, layers=[s0, s1])
    if p not in source_ranks(ptp, dtp, dr):
        raise LayoutError(f"prefill attention-TP rank {p} does not serve decode rank {dr}")
    mla = bool(src.get("is_mla"))
    writer = p == source_ranks(ptp, dtp, dr)[0]  # of replicated data (MLA KV, aux, replicated state)
    page = int(src.get("page_size") or 1)
    sitems, ditems = [int(x) for x in src["kv_item_lens"]], [int(x) for x in dst["kv_item_lens"]]
    per_layer = 1 if mla else 2
    if pps == 1 and len(sitems) == len(ditems) and bool(src.get("kv_layer_ids")) != bool(dst.get("kv_layer_ids")):
        kvpairs = [(i, i) for i in range(len(sitems))]  # one side names its layers, the other not: the same model
    else:
        kvpairs = pair_by_ids(_ids(src, src.get("kv_layer_ids"), len(sitems), per_layer, "KV buffers"),
                              _ids(dst, dst.get("kv_layer_ids"), len(ditems), per_layer, "KV buffers"), "KV buffers")

    heads: Optional[Tuple[int, int, Tuple[int, int, int]]] = None
    if not mla and ptp != dtp:
        # sglang tells prefill managers the model's KV heads (decode managers
        # only with its staging buffers): either side's count serves both.
        total = int(src.get("total_kv_heads") or dst.get("total_kv_heads") or 0)
        if total <= 0 or int(dst.get("total_kv_heads") or total) != total:
            raise LayoutError(f"attention TP sizes differ (prefill {ptp}, decode {dtp}): KV heads prefill "
                              f"{src.get('total_kv_heads')}, decode {dst.get('total_kv_heads')} (KVArgs.total_kv_head_num)")
        sh, dh = kv_heads(total, ptp, p)[1], kv_heads(total, dtp, dr)[1]
        for side, ann, n in (("prefill", src, sh), ("decode", dst, dh)):
            if ann.get("local_kv_heads") and int(ann["local_kv_heads"]) != n:
                raise LayoutError(f"{side} rank holds {ann['local_kv_heads']} KV heads, {total} over TP "
                                  f"{ann['attn_tp_size']} gives {n}")
        sl = head_slice(total, ptp, p, dtp, dr)
        heads = (sh, dh, sl) if sl is not None else None
        kv = [] if sl is None else _head_pairs(kvpairs, sitems, ditems, page, sh, dh, sl, "KV buffers")
    elif mla and not writer:
        kv = []
    else:
        kv = [_whole(i, j, sitems[i], ditems[j], "KV buffers (bytes per page)") for i, j in kvpairs]

    aux_writer = writer and (dps == pps or int(src.get("pp_rank", 0)) == pps - 1)
    sa, da = [int(x) for x in src.get("aux_item_lens") or []], [int(x) for x in dst.get("aux_item_lens") or []]
    if len(sa) != len(da):
        raise LayoutError(f"aux buffers differ: prefill {sa}, decode {da} bytes per row")
    aux = [_whole(i, i, sa[i], da[i], "aux buffers (bytes per row)") for i in range(len(sa))] if aux_writer else []

    sst, dst_st = src.get("states") or [], dst.get("states") or []
    if [c["type"] for c in sst] != [c["type"] for c in dst_st]:
        raise LayoutError(f"state components differ: prefill {[c['type'] for c in sst]}, decode "
                          f"{[c['type'] for c in dst_st]}")
    states, exact = [], []
    for k, (s, d) in enumerate(zip(sst, dst_st)):
        t = str(s["type"])
        kind, what = state_kind(t), f"state {t} (component {k})"
        if kind is None:
            raise LayoutError(f"{what}: kvproxy.sglang does not move this state type")
        pairs = _state_pairs(s, d, src, dst, what)
        if kind == "sliced":
            got = _sliced_pairs(pairs, s, d, ptp, p, dtp, dr, what)
        elif kind == "heads" and not mla and ptp != dtp:
            got = [] if heads is None else _head_pairs(pairs, s["items"], d["items"], page, heads[0], heads[1],
                                                       heads[2], what)
        elif kind == "same-tp" and ptp != dtp:
            raise LayoutError(f"{what}: moved only between equal attention TP sizes (prefill {ptp}, decode {dtp})")
        elif kind == "same-tp" and pps > 1:
            raise LayoutError(f"{what}: not moved with pipeline-parallel prefill")
        elif (kind in ("replicated", "heads") or mla) and not writer:
            got = []
        else:
            got = [_whole(i, j, int(s["items"][i]), int(d["items"][j]), what) for i, j in pairs]
        states.append(got)
        exact.append(exact_indices(t))
    return Plan(kv, aux, states, exact)


def check_coverage(dst: Dict[str, Any], plans: Sequence[Plan], has_aux: bool = True) -> None:
    """The plans of all the sources of one decode rank write each of its buffers
    (KV, aux, state) exactly once, every byte of every item.

    :raises LayoutError: a byte would be written twice or not at all.
    """
    def tile(what: str, items: Sequence[int], contrib: Iterable[Pair]) -> None:
        by: Dict[int, List[Pair]] = {}
        for c in contrib:
            by.setdefault(c.dst, []).append(c)
        for j, item in enumerate(items):
            got = by.get(j, [])
            if not got:
                raise LayoutError(f"{what} buffer {j} of the decode rank is written by none of its prefill ranks")
            blocks = {c.blocks for c in got}
            if len(blocks) != 1 or item % next(iter(blocks)):
                raise LayoutError(f"{what} buffer {j}: prefill ranks write it in different shapes")
            block = item // next(iter(blocks))
            pos = 0
            for c in sorted(got, key=lambda c: c.dst_off):
                if c.dst_off != pos:
                    raise LayoutError(f"{what} buffer {j}: bytes {min(pos, c.dst_off)}..{max(pos, c.dst_off)} of "
                                      f"each {block}-byte block {'overlap' if c.dst_off < pos else 'stay unwritten'}")
                pos += c.length
            if pos != block:
                raise LayoutError(f"{what} buffer {j}: {block - pos} bytes of each {block}-byte block stay unwritten")

    tile("KV", [int(x) for x in dst["kv_item_lens"]], (c for pl in plans for c in pl.kv))
    if has_aux:
        tile("aux", [int(x) for x in dst.get("aux_item_lens") or []], (c for pl in plans for c in pl.aux))
    for k, comp in enumerate(dst.get("states") or []):
        tile(f"state {comp['type']}", [int(x) for x in comp["items"]],
             (c for pl in plans for c in pl.states[k]))


# ---------------------------------------------------------------- segments

Region = Tuple[int, int, int]  # (key, offset of the buffer in the region, buffer length)
Seg = Tuple[int, ...]  # a 5-tuple (contiguous) or an 8-tuple (strided)


def segments(pairs: Sequence[Pair], srcs: Sequence[Region], dsts: Sequence[Region],
             runs: Sequence[Tuple[int, int, int]], what: str) -> List[Seg]:
    """kvproxy segments moving the items of ``runs`` ((first source item, first
    destination item, count)) through ``pairs``: per pair and run one segment,
    strided where only a part of each block moves.

    :raises ValueError: an item is outside a buffer.
    """
    out: List[Seg] = []
    for pr in pairs:
        skey, soff, slen = srcs[pr.src]
        dkey, doff, dlen = dsts[pr.dst]
        sblk, dblk = pr.src_item // pr.blocks, pr.dst_item // pr.blocks
        for s0, d0, n in runs:
            if s0 < 0 or d0 < 0 or (s0 + n) * pr.src_item > slen or (d0 + n) * pr.dst_item > dlen:
                raise ValueError(f"{what} items {s0}..{s0 + n - 1} -> {d0}..{d0 + n - 1} are outside buffer "
                                 f"{pr.src} -> {pr.dst} ({slen // pr.src_item} items here, {dlen // pr.dst_item} there)")
            so, do = soff + s0 * pr.src_item + pr.src_off, doff + d0 * pr.dst_item + pr.dst_off
            if pr.length == sblk == dblk:
                out.append((skey, so, dkey, do, n * pr.src_item))
            elif pr.blocks * n == 1:
                out.append((skey, so, dkey, do, pr.length))
            else:
                out.append((skey, so, dkey, do, pr.length, pr.blocks * n, sblk, dblk))
    return out


def seg_bytes(s: Seg) -> int:
    return s[4] * (s[5] if len(s) == 8 else 1)


def split(segs: Sequence[Seg], max_segs: int, max_bytes: int, max_blocks: int) -> List[List[Seg]]:
    """Segments grouped into transfers of at most ``max_segs`` segments and
    about ``max_bytes`` bytes; a contiguous segment longer than what is left
    is cut, a strided one is cut at block boundaries (and to ``max_blocks``
    blocks)."""
    out: List[List[Seg]] = []
    cur: List[Seg] = []
    size = 0

    def close() -> None:
        nonlocal cur, size
        if cur:
            out.append(cur)
        cur, size = [], 0

    for s in segs:
        if len(s) == 5:
            sk, so, dk, do, n = s
            while n:
                take = min(n, max_bytes - size)
                cur.append((sk, so, dk, do, take))
                so, do, n, size = so + take, do + take, n - take, size + take
                if len(cur) == max_segs or size >= max_bytes:
                    close()
            continue
        sk, so, dk, do, ln, count, ss, ds = s
        while count:
            room = max((max_bytes - size) // ln, 0)
            if room == 0 and cur:
                close()
                continue
            take = min(count, max(room, 1), max_blocks)
            cur.append((sk, so, dk, do, ln, take, ss, ds) if take > 1 else (sk, so, dk, do, ln))
            so, do, count, size = so + take * ss, do + take * ds, count - take, size + take * ln
            if len(cur) == max_segs or size >= max_bytes:
                close()
    close()
    return out
