#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Decode side: receive each request's KV pages into this side's pool (other
page indices than the prefill side's), rebuild the model's cache from them
and generate --tokens tokens greedily; then check them against the same
model generating from the same prompt in this one process.

Per request: take pages from this side's pool and post them in the mailbox
(with the pool's region key and, for rank 0, the aux row's), wait until the
request's bytes have landed (kvproxy's landing notices), read the first
token from the aux row, gather the pages into a transformers DynamicCache
and continue from position len(prompt). With --ranks 2 each rank is its own
process holding half of the KV heads (a TP split): rank 1 hands its heads to
rank 0 through the mailbox, and rank 0 puts the heads back together before
decoding. Rank 0 prints the check, appends the request's record (both
nodes' kvproxy phases and the engine's) to --records for tools/kvp-waterfall,
and exits 1 if any request's tokens differ.

    python3 examples/hf_disagg/decode.py --socket DECODE.sock --mailbox DIR --records R.jsonl [--ranks 2 --rank 0]

Exit status: 0 every request matched, 1 a mismatch or failure, 77 no GPU / torch / transformers.
"""

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402


def main() -> int:
    ap = C.parser("decode")
    ap.add_argument("--rank", type=int, default=0, help="this process's decode rank (0 .. ranks-1)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens to generate per request")
    ap.add_argument("--records", type=Path, help="rank 0: append one JSON line per request here")
    a = ap.parse_args()
    if not 0 <= a.rank < a.ranks or a.tokens < 2:
        ap.error("--rank must be below --ranks, --tokens at least 2")
    lengths = C.prompt_lengths(a.prompts)
    torch = C.require(a.device)
    import kvproxy

    model = C.build_model(a.model, a.seed, a.device)
    layers, heads, head_dim = C.dims(model)
    mine = heads // a.ranks
    client = kvproxy.Client(a.socket)
    pool = C.Pool(client, layers, C.pool_pages(lengths, a.page), a.page, mine, head_dim, model)
    aux = kvproxy.HostBuffer(C.AUX_ROW * C.AUX_ROWS)
    aux_key = client.register(aux).key
    mailbox, rnd = C.Mailbox(a.mailbox), random.Random(a.seed * 31 + a.rank + 1)
    # Nothing of this run can be there yet: the prefill side answers only once rank 0 posted.
    mailbox.refuse_leftovers(f"*.meta.{a.rank}", *(("*.outcome", "*.heads.*", "*.landed.*") if a.rank == 0 else ()))
    lane = f"decode {client.node_id}" + (f" rank {a.rank}" if a.ranks > 1 else "")
    C.warmup(model)
    # The monolithic runs to compare with, before anything is timed.
    refs = [C.reference(model, C.prompt(a.seed, i, n, model.config.vocab_size), a.tokens)
            for i, n in enumerate(lengths)] if a.rank == 0 else []
    print(f"decode: {lane}: KV heads {a.rank * mine}..{a.rank * mine + mine - 1} of {heads}", flush=True)
    failed = 0

    for i, n in enumerate(lengths):
        pages = C.take_pages(C.npages(n, a.page), pool.pages, rnd, C.EXTENT["decode"])
        mailbox.put(f"{i}.meta.{a.rank}", {"node": client.node_id, "layout": C.as_dict(pool.layout),
                                           "pages": pages, "head0": a.rank * mine, "aux_key": aux_key})
        want = pool.layout.request_bytes(len(pages)) + (C.AUX_ROW if a.rank == 0 else 0)
        landed = C.wait_landed(client, want, a.timeout, lane)
        ph = C.Phases(lane, model)
        if a.rank > 0:
            with ph("hand heads to rank 0"):
                mailbox.put_tensor(f"{i}.heads.{a.rank}", pool.gather(pages, n))
            mailbox.put(f"{i}.landed.{a.rank}", {"landed": landed, "phases": ph.items, "digest": C.digest(
                pool.gather(pages, n)), "outside": pool.written_outside(pages)})
            pool.clear(pages)
            continue

        first, n_aux = C.get_aux(aux, i)
        with ph("rebuild cache"):
            kv = pool.gather(pages, n)
            for r in range(1, a.ranks):
                kv = torch.cat([kv, mailbox.get_tensor(f"{i}.heads.{r}", a.timeout, kv.device)], dim=3)
            cache = C.make_cache(model, C.to_layers(kv))
        t_ready = C.now()
        with ph("decode first step"):
            logits, cache = C.forward(model, [first], n, cache)
        toks = [first, int(logits.argmax())]
        toks += C.greedy(model, cache, toks[-1], n + 1, a.tokens - 1)[0][1:]
        outside = pool.written_outside(pages)  # the checks once the clock has stopped
        pool.clear(pages)

        ref, ref_logits, ref_kv = refs[i]
        kv_diff = max(float((x - y).abs().max()) for got, want_kv in zip(C.to_layers(kv), ref_kv)
                      for x, y in zip(got, want_kv))
        logit_diff = float((logits - ref_logits).abs().max())
        others = [mailbox.get(f"{i}.landed.{r}", a.timeout) for r in range(1, a.ranks)]
        outside += sum(o["outside"] for o in others)
        out = mailbox.get(f"{i}.outcome", a.timeout)
        exact = out["digests"] == [C.digest(kv[:, :, :, :mine])] + [o["digest"] for o in others]
        # Same weights, same inputs, same kernels: the logits agree (in practice bit for bit). A
        # position off by one or a page of zeros moves the small model's by 0.4 % of the largest or more.
        ok = toks == ref and exact and n_aux == n and outside == 0 and logit_diff <= 1e-3 * float(ref_logits.abs().max())
        failed += not ok
        print(f"decode: request {i}: {n} tokens, {a.tokens} generated: "
              f"{'tokens equal' if toks == ref else 'TOKENS DIFFER'} to one process's ({toks[:6]}...); "
              f"KV bytes {'identical to' if exact else 'DIFFERENT FROM'} the prefill side's; first decode step's "
              f"logits differ by {logit_diff:.3g}, KV from a prefill here by {kv_diff:.3g}; {outside} elements "
              "written outside the request's pages"
              + ("" if ok else f"\n  disaggregated {toks}\n  one process    {ref}"), flush=True)
        if a.records:
            rec = C.record(i, n, a.ranks, (out["t0"], t_ready),
                           out["phases"] + ph.items + [p for o in others for p in o["phases"]], out["send"],
                           landed + [e for o in others for e in o["landed"]],
                           {"tokens_equal": toks == ref, "logits_max_diff": logit_diff, "kv_max_diff": kv_diff})
            with open(a.records, "a") as f:
                f.write(json.dumps(rec) + "\n")
    client.close()
    if a.rank == 0:
        print(f"decode: {lane}: {len(lengths) - failed} of {len(lengths)} requests passed every check", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
