# SPDX-License-Identifier: BSD-3-Clause
"""What prefill.py and decode.py share: the model, the paged KV pool, page
runs turned into kvproxy segments, a file mailbox for the side channel, and
the per-request record that tools/kvp-waterfall reads.

torch and transformers are imported inside the functions that need them, so
the plumbing (pages, runs, segments, records) also runs, and is tested,
where neither is installed (python/tests/test_waterfall.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from kvproxy import Completion, Segment, Segment2D

SKIP = 77
# Random-weight Llama configs (GQA: fewer KV heads than query heads). "small"
# is the default on a GPU; "tiny" keeps a CPU run to seconds.
MODELS = {
    "small": dict(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=8),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}
AUX_ROW = 64  # one aux row per request (first token, prompt length), as sglang's aux buffers
AUX_ROWS = 64
AUX_MAGIC = 0x6B767078  # "kvpx"
# Pages come in extents of this many pages from each side's free list; the two
# differ so that only some consecutive pages coalesce on both sides.
EXTENT = {"prefill": 16, "decode": 24}
SEND_PHASES = ("queue", "admit", "post", "wire", "deliver")  # add up to e2e on the sender
LANDED_PHASES = ("wire", "deliver")  # add up to total on the receiver

now = time.monotonic  # CLOCK_MONOTONIC, the clock kvproxy's phases use too


def skip(reason: str) -> None:
    print(f"SKIP: {reason}", file=sys.stderr, flush=True)
    sys.exit(SKIP)


def require(device: str) -> Any:
    """torch (and transformers, and a GPU for --device cuda), else exit 77 with the reason."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        skip(f"PyTorch is not installed ({e})")
    try:
        import transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001
        skip(f"transformers is not installed ({e})")
    if device == "cuda" and not torch.cuda.is_available():
        skip("no CUDA GPU visible to PyTorch")
    return torch


def parser(role: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=f"{role} side of the transformers + kvproxy example")
    ap.add_argument("--socket", required=True, help=f"the {role} node's kvproxyd client_socket")
    ap.add_argument("--mailbox", required=True, type=Path, help="folder both sides share (the side channel)")
    ap.add_argument("--prompts", default="77,1000,8192", help="prompt lengths in tokens, one request each")
    ap.add_argument("--ranks", type=int, default=1, choices=(1, 2), help="decode ranks the KV heads split over")
    ap.add_argument("--page", type=int, default=16, help="tokens per KV page")
    ap.add_argument("--model", default="small", choices=sorted(MODELS))
    ap.add_argument("--seed", type=int, default=1234, help="weights and prompts (same on both sides)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per wait (transfer, mailbox)")
    return ap


def prompt_lengths(spec: str) -> List[int]:
    return [int(x) for x in spec.split(",") if x.strip()]


def prompt(seed: int, i: int, n: int, vocab: int) -> List[int]:
    """Request i's token ids (no tokenizer: nothing is downloaded); both sides derive them."""
    rnd = random.Random(seed * 7919 + i)
    return [rnd.randrange(vocab) for _ in range(n)]


# ---- the model ----

def build_model(name: str, seed: int, device: str) -> Any:
    """A Llama causal LM from a config with random weights: made on the CPU in
    float32 from the seed, so every process holds the same weights."""
    import torch
    import transformers

    # sdpa: flash-style kernels on the GPU, no [tokens x tokens] score matrix for long prompts.
    cfg = transformers.LlamaConfig(**MODELS[name], max_position_embeddings=32768, attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(device=device, dtype=dtype).eval()


def dims(model: Any) -> Tuple[int, int, int]:
    """(layers, KV heads, head dim) of the model."""
    c = model.config
    return c.num_hidden_layers, c.num_key_value_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def sync(model: Any) -> None:
    """Wait for the GPU, so that a phase's time is its own."""
    import torch

    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def forward(model: Any, ids: Sequence[int], start: int, cache: Any = None) -> Tuple[Any, Any]:
    """One forward of ``ids`` at positions start.. (batch 1) on ``cache``;
    returns the last position's logits (float32) and the cache. Positions are
    passed explicitly: a cache rebuilt from pages then continues exactly where
    the prompt ended, whatever the transformers version derives by itself."""
    import torch

    dev = next(model.parameters()).device
    x = torch.tensor([list(ids)], device=dev)
    pos = torch.arange(start, start + len(ids), device=dev)[None]
    out = model(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True)
    return out.logits[0, -1].float(), out.past_key_values


def greedy(model: Any, cache: Any, first: int, start: int, m: int) -> Tuple[List[int], Any]:
    """m tokens: ``first`` (the prefill's) and m - 1 more, greedily, from a
    cache holding ``start`` tokens; also the logits of the first decode step."""
    toks, step1 = [first], None
    for i in range(m - 1):
        logits, cache = forward(model, [toks[-1]], start + i, cache)
        step1 = logits if step1 is None else step1
        toks.append(int(logits.argmax()))
    return toks, step1


def cache_layers(cache: Any) -> List[Tuple[Any, Any]]:
    """(K, V) per layer, each [1, kv_heads, tokens, head_dim], from a transformers cache."""
    if hasattr(cache, "layers"):  # 4.56 and later (5.x): one CacheLayer per layer
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):  # 4.36 .. 4.55
        return list(zip(cache.key_cache, cache.value_cache))
    return [(kv[0], kv[1]) for kv in cache]  # legacy tuples


def make_cache(model: Any, layers: Sequence[Tuple[Any, Any]]) -> Any:
    """A DynamicCache holding these (K, V) per layer, as the model's own prefill leaves it."""
    import transformers

    try:
        cache = transformers.DynamicCache(config=model.config)
    except TypeError:  # before config= existed
        cache = transformers.DynamicCache()
    for i, (k, v) in enumerate(layers):
        cache.update(k, v, i)
    return cache


def reference(model: Any, ids: Sequence[int], m: int) -> Tuple[List[int], Any, List[Tuple[Any, Any]]]:
    """The monolithic run: prefill and m greedy tokens in this process; also
    the first decode step's logits and the prompt's KV."""
    logits, cache = forward(model, ids, 0)
    toks, step1 = greedy(model, cache, int(logits.argmax()), len(ids), m)
    n = len(ids)
    return toks, step1, [(k[..., :n, :], v[..., :n, :]) for k, v in cache_layers(cache)]


def warmup(model: Any) -> None:
    """Load the kernels before anything is timed."""
    _, cache = forward(model, list(range(32)), 0)
    forward(model, [1], 32, cache)
    sync(model)


# ---- the paged pool ----

@dataclass
class Layout:
    """Where a pool's pages lie in its kvproxy region: ``nbuf`` buffers (layer
    l's K is buffer 2l, its V 2l + 1) of ``tokens`` slots of ``tok_bytes``."""

    key: int
    nbuf: int
    tokens: int
    page: int
    tok_bytes: int

    def offset(self, buf: int, page: int) -> int:
        return (buf * self.tokens + page * self.page) * self.tok_bytes

    def request_bytes(self, npages: int) -> int:
        return self.nbuf * npages * self.page * self.tok_bytes


def npages(tokens: int, page: int) -> int:
    return -(-tokens // page)


def pool_pages(lengths: Sequence[int], page: int) -> int:
    """Room for the longest request in extents of either side, and spare."""
    return -(-npages(max(lengths), page) // 48) * 48 + 48


class Pool:
    """A paged KV pool laid out like sglang's MHA pool: per layer one K and one
    V buffer of [pool_tokens, kv_heads, head_dim], pages of ``page`` tokens.
    The 2 x layers buffers are slices of one allocation (GPU memory, or a
    HostBuffer on the CPU), so the pool is one kvproxy region."""

    def __init__(self, client: Any, layers: int, pages: int, page: int, heads: int, head_dim: int, model: Any) -> None:
        import torch

        p = next(model.parameters())
        self.page, self.pages = page, pages
        shape = (layers, 2, pages * page, heads, head_dim)
        if p.is_cuda:
            self.kv = torch.zeros(shape, dtype=p.dtype, device=p.device)
            region = client.register_cuda(self.kv)
        else:
            import kvproxy

            self.buf = kvproxy.HostBuffer(p.element_size() * heads * head_dim * 2 * layers * pages * page)
            self.kv = torch.frombuffer(self.buf, dtype=torch.uint8).view(p.dtype).view(shape)
            region = client.register(self.buf)
        self.layout = Layout(region.key, 2 * layers, pages * page, page, heads * head_dim * p.element_size())

    def slots(self, pages: Sequence[int], n: int) -> Any:
        """Pool slots of a request's first n tokens."""
        import torch

        t = torch.arange(n, device=self.kv.device)
        return torch.tensor(pages, device=self.kv.device)[t // self.page] * self.page + t % self.page

    def write(self, layers: Sequence[Tuple[Any, Any]], pages: Sequence[int]) -> None:
        """The prompt's K and V of every layer into the request's pages."""
        import torch

        kv = torch.stack([torch.stack([k[0], v[0]]) for k, v in layers])  # [L, 2, heads, n, dim]
        self.kv[:, :, self.slots(pages, kv.shape[3])] = kv.transpose(2, 3)

    def gather(self, pages: Sequence[int], n: int) -> Any:
        """The request's KV, [L, 2, n, heads, dim], out of its pages."""
        return self.kv[:, :, self.slots(pages, n)]

    def clear(self, pages: Sequence[int]) -> None:
        self.kv[:, :, self.slots(pages, len(pages) * self.page)] = 0

    def written_outside(self, pages: Sequence[int]) -> int:
        """Nonzero elements outside the request's pages (the pool is zero between requests)."""
        return int(self.kv.count_nonzero()) - int(self.gather(pages, len(pages) * self.page).count_nonzero())


def digest(kv: Any) -> int:
    """A position-weighted sum of the raw bits of a request's KV ([L, 2, n,
    heads, dim]): equal on both sides only if every byte moved exactly,
    whatever the model computes from them."""
    import torch

    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[kv.element_size()]
    total = 0
    for layer in kv:  # a layer at a time: bounded temporary memory
        x = layer.contiguous().view(bits).reshape(-1).long()
        w = torch.arange(x.numel(), device=x.device) % 65521 + 1
        total = (total * 1000003 + int((x * w).sum())) % (1 << 61)
    return total


def to_layers(kv: Any) -> List[Tuple[Any, Any]]:
    """[L, 2, n, heads, dim] -> (K, V) per layer as a transformers cache holds them."""
    return [(kv[i, 0].transpose(0, 1)[None], kv[i, 1].transpose(0, 1)[None]) for i in range(kv.shape[0])]


def take_pages(n: int, total: int, rnd: random.Random, extent: int) -> List[int]:
    """n page indices for a request: extents of ``extent`` pages in random order
    (a free list after some churn), so runs are neither one block nor single pages."""
    starts = list(range(0, total - extent + 1, extent))
    rnd.shuffle(starts)
    pages = [s + i for s in starts for i in range(extent)][:n]
    if len(pages) < n:
        raise ValueError(f"{n} pages do not fit a pool of {total}")
    return pages


def runs(src: Sequence[int], dst: Sequence[int]) -> List[Tuple[int, int, int]]:
    """(first source page, first destination page, count) of each stretch of
    pages that are consecutive on both sides: one segment per buffer each."""
    out: List[Tuple[int, int, int]] = []
    for s, d in zip(src, dst):
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((s, d, 1))
    return out


def kv_segments(src: Layout, dst: Layout, page_runs: Sequence[Tuple[int, int, int]], head0: int,
                head_bytes: int) -> List[Any]:
    """The segments of every buffer and run. Where the destination holds every
    head, a run is one contiguous segment; where it holds a slice of the heads
    (a decode rank of a TP split), each token's slice is one block of a
    Segment2D, the source's token size apart, packed at the destination."""
    segs: List[Any] = []
    for b in range(src.nbuf):
        for s, d, cnt in page_runs:
            so, do = src.offset(b, s), dst.offset(b, d)
            if dst.tok_bytes == src.tok_bytes:
                segs.append(Segment(src.key, so, dst.key, do, cnt * src.page * src.tok_bytes))
            else:
                segs.append(Segment2D(src.key, so + head0 * head_bytes, dst.key, do, dst.tok_bytes,
                                      cnt * src.page, src.tok_bytes, dst.tok_bytes))
    return segs


def batches(segs: Sequence[Any], most: int) -> List[List[Any]]:
    """Transfers of at most ``most`` segments (the daemon's max_segments)."""
    return [list(segs[i:i + most]) for i in range(0, len(segs), most)]


def user_id(req: int, rank: int, n: int) -> int:
    """Transfer ids: request, decode rank and the transfer's number in the request."""
    return (req + 1) << 16 | rank << 8 | n


def put_aux(buf: Any, req: int, first: int, tokens: int) -> int:
    """Write request req's aux row; returns its offset."""
    off = (req % AUX_ROWS) * AUX_ROW
    buf[off:off + 24] = struct.pack("<QqQ", AUX_MAGIC, first, tokens)
    return off


def get_aux(buf: Any, req: int) -> Tuple[int, int]:
    """(first token, prompt length) from request req's aux row, which is then cleared."""
    off = (req % AUX_ROWS) * AUX_ROW
    magic, first, tokens = struct.unpack("<QqQ", buf[off:off + 24])
    if magic != AUX_MAGIC:
        raise RuntimeError(f"request {req}: aux row did not land (magic {magic:#x})")
    buf[off:off + AUX_ROW] = bytes(AUX_ROW)
    return first, tokens


# ---- completions ----

def wait_done(client: Any, uids: Dict[int, float], timeout: float) -> List[Dict[str, Any]]:
    """Every submitted transfer's done completion (uid -> submit time) as send
    entries of the record; a failed transfer raises TransferError."""
    out: Dict[int, Dict[str, Any]] = {}
    deadline = now() + timeout
    while len(out) < len(uids):
        left = deadline - now()
        if left <= 0:
            raise TimeoutError(f"no done completion for {sorted(set(uids) - set(out))} within {timeout}s")
        for c in client.wait(timeout=left):
            if c.kind == "done" and c.user_id in uids:
                out[c.user_id] = send_entry(c.raise_for_status(), client.node_id, uids[c.user_id], now())
    return [out[u] for u in uids]


def wait_landed(client: Any, want: int, timeout: float, lane: str) -> List[Dict[str, Any]]:
    """Landing notices until ``want`` bytes landed in this client's regions."""
    got: List[Dict[str, Any]] = []
    deadline = now() + timeout
    while sum(e["bytes"] for e in got) < want:
        left = deadline - now()
        if left <= 0:
            raise TimeoutError(f"{sum(e['bytes'] for e in got)} of {want} bytes landed within {timeout}s")
        for c in client.wait(timeout=left):
            if c.kind == "landed":
                got.append(landed_entry(c.raise_for_status(), client.node_id, lane, now()))
    return got


def send_entry(c: Completion, node: str, t_submit: float, t_seen: float) -> Dict[str, Any]:
    return {"user_id": c.user_id, "node": node, "status": c.status_name, "bytes": c.bytes, "nseg": c.nseg, "t_submit": t_submit,
            "t_seen": t_seen, "phases": {k: c.phases[k] for k in SEND_PHASES + ("first", "total", "e2e")}}


def landed_entry(c: Completion, node: str, lane: str, t_seen: float) -> Dict[str, Any]:
    return {"user_id": c.user_id, "node": node, "lane": lane, "status": c.status_name, "bytes": c.bytes, "nseg": c.nseg,
            "t_seen": t_seen, "phases": {k: c.phases[k] for k in LANDED_PHASES + ("total",)}}


# ---- engine phases, the record, the mailbox ----

class Phases:
    """The engine's own phases of one request, on one lane of the picture."""

    def __init__(self, lane: str, model: Any = None) -> None:
        self.lane, self.model, self.items = lane, model, []  # type: ignore[var-annotated]

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = now()
        yield
        if self.model is not None:
            sync(self.model)
        self.items.append({"lane": self.lane, "name": name, "start": t, "dur": now() - t})


def record(req: int, tokens: int, ranks: int, ttft: Tuple[float, float], phases: List[Dict[str, Any]],
           send: List[Dict[str, Any]], landed: List[Dict[str, Any]], check: Dict[str, Any]) -> Dict[str, Any]:
    """One JSON line of tools/kvp-waterfall's input (its header describes the fields)."""
    return {"v": 1, "request": req, "tokens": tokens, "ranks": ranks,
            "kv_bytes": sum(e["bytes"] for e in landed) - AUX_ROW, "ttft": {"start": ttft[0], "end": ttft[1]},
            "phases": phases, "send": send, "landed": landed, "check": check}


class Mailbox:
    """The side channel: JSON files (and tensors) in a folder both sides
    share, each written whole and renamed into place; a read polls (bounded)
    and takes the entry away, so a finished run leaves the folder empty."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def refuse_leftovers(self, *patterns: str) -> None:
        """Exit if entries like ours are already there: an earlier run's would be read as this one's."""
        old = sorted(p.name for pat in patterns for p in self.path.glob(pat))
        if old:
            sys.exit(f"{self.path} holds {', '.join(old[:4])} from an earlier run: give each run an empty --mailbox")

    def _put(self, name: str, write: Any) -> None:
        tmp = self.path / f".{name}.{os.getpid()}"
        write(tmp)
        os.replace(tmp, self.path / name)

    def _wait(self, name: str, timeout: float) -> Path:
        p, deadline = self.path / name, now() + timeout
        while not p.exists():
            if now() > deadline:
                raise TimeoutError(f"nothing in {p} within {timeout}s (is the other side running?)")
            time.sleep(0.0005)
        return p

    def put(self, name: str, obj: Any) -> None:
        self._put(name, lambda p: p.write_text(json.dumps(obj)))

    def get(self, name: str, timeout: float) -> Any:
        p = self._wait(name, timeout)
        obj = json.loads(p.read_text())
        p.unlink()
        return obj

    def put_tensor(self, name: str, t: Any) -> None:
        import torch

        self._put(name, lambda p: torch.save(t, p))

    def get_tensor(self, name: str, timeout: float, device: Any) -> Any:
        import torch

        p = self._wait(name, timeout)
        t = torch.load(p, map_location=device)
        p.unlink()
        return t


def as_dict(layout: Layout) -> Dict[str, int]:
    return asdict(layout)
