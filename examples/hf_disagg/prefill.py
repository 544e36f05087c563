#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Prefill side: run a transformers causal LM on each prompt, lay its KV cache
out in a paged pool (sglang's MHA layout) and send the request's pages to
the decode side with kvproxy.

Per request: the decode side's page indices read from the mailbox (decode.py
writes them: its region, its pages, which KV heads it holds), the prompt's
forward (the first output token comes from its last logits), the cache
written into pages of this side's pool, then one kvproxy transfer per
decode rank (more if the segments exceed the daemon's max_segments): each
stretch of pages consecutive on both sides is one segment per layer and K/V
buffer (a Segment2D of head slices when a rank holds half of the heads),
plus the aux row (first token, prompt length) for rank 0. Once every
transfer is done, the engine's phases and kvproxy's send phases go back
through the mailbox for decode.py's record, with a digest of the bytes each
rank should hold.

    python3 examples/hf_disagg/prefill.py --socket PREFILL.sock --mailbox DIR [--ranks 2]

Exit status: 0 every request sent, 1 a failure, 77 no GPU / torch / transformers.
"""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def main() -> int:
    a = C.parser("prefill").parse_args()
    lengths = C.prompt_lengths(a.prompts)
    C.require(a.device)
    import kvproxy

    model = C.build_model(a.model, a.seed, a.device)
    layers, heads, head_dim = C.dims(model)
    client = kvproxy.Client(a.socket)
    pool = C.Pool(client, layers, C.pool_pages(lengths, a.page), a.page, heads, head_dim, model)
    aux = kvproxy.HostBuffer(C.AUX_ROW * C.AUX_ROWS)
    aux_key = client.register(aux).key
    head_bytes = pool.layout.tok_bytes // heads
    mailbox, rnd = C.Mailbox(a.mailbox), random.Random(a.seed)
    lane = f"prefill {client.node_id}"
    C.warmup(model)
    print(f"prefill: {client.node_id}: {a.model} model, {layers} layers x {heads} KV heads x {head_dim}, "
          f"pool of {pool.pages} pages of {a.page} tokens; {len(lengths)} requests", flush=True)

    for i, n in enumerate(lengths):
        # The decode side takes its pages first: with sglang too the bootstrap
        # (decode's metadata) is done while the prefill computes, off the TTFT path.
        metas = [mailbox.get(f"{i}.meta.{r}", a.timeout) for r in range(a.ranks)]
        ph = C.Phases(lane, model)
        ids = C.prompt(a.seed, i, n, model.config.vocab_size)
        t0 = C.now()
        with ph("prefill forward"):
            logits, cache = C.forward(model, ids, 0)
            first = int(logits.argmax())
        pages = C.take_pages(C.npages(n, a.page), pool.pages, rnd, C.EXTENT["prefill"])
        with ph("pool write"):
            pool.write(C.cache_layers(cache), pages)
        del cache
        aux_off = C.put_aux(aux, i, first, n)
        xfers, dst_heads = [], []
        with ph("build segments"):
            for r, m in enumerate(metas):
                dst = C.Layout(**m["layout"])
                dst_heads.append(dst.tok_bytes // head_bytes)
                segs = C.kv_segments(pool.layout, dst, C.runs(pages, m["pages"]), m["head0"], head_bytes)
                if r == 0:
                    segs.append(kvproxy.Segment(aux_key, aux_off, m["aux_key"], aux_off, C.AUX_ROW))
                xfers += [(m["node"], C.user_id(i, r, j), b) for j, b in enumerate(C.batches(segs, client.max_segments))]
        submitted = {}
        with ph("submit"):  # the binding turns the segments into descriptors
            for node, uid, batch in xfers:
                client.submit(node, batch, uid, timeout=a.timeout)
                submitted[uid] = C.now()  # kvproxy's clock for it starts within this call
        # The pages belong to kvproxy until every done completion is in.
        send = C.wait_done(client, submitted, a.timeout + 5)
        kv = pool.gather(pages, n)
        digests = [C.digest(kv[:, :, :, m["head0"]:m["head0"] + dst_heads[r]]) for r, m in enumerate(metas)]
        mailbox.put(f"{i}.outcome", {"t0": t0, "phases": ph.items, "send": send, "digests": digests})
        span = max(e["t_seen"] for e in send) - min(e["t_submit"] for e in send)
        print(f"prefill: request {i}: {n} tokens, first token {first}, {sum(e['bytes'] for e in send)} bytes "
              f"in {len(send)} transfer(s) of {sum(e['nseg'] for e in send)} segments, {span * 1e3:.2f} ms",
              flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
