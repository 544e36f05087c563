#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Decode side of an sglang-style transfer through kvproxy.sglang.

Does what sglang's decode server does with the kvproxy backend: creates a KV
manager over its paged KV cache, and for one request (a bootstrap room)
resolves the prefill server, allocates pages, sends their indices to the
prefill side, and polls until the pages and the aux row have landed; then
checks them.

    python3 examples/sglang_decode.py --socket /tmp/kvp-demo/decode0.sock --bootstrap 127.0.0.1:8998 --room 42
"""

import argparse
import ctypes
import sys

import kvproxy
from kvproxy import sglang
from kvproxy.sglang import KVPoll

from sglang_prefill import LAYERS, PAGE_BYTES, pattern, wait

PAGES = 96  # a larger cache than prefill's: page numbers differ on the two sides


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True, help="client_socket of the decode node's kvproxyd")
    ap.add_argument("--bootstrap", default="127.0.0.1:8998", help="HOST:PORT of the prefill's bootstrap server")
    ap.add_argument("--room", type=int, required=True, help="the request's bootstrap room (same on both sides)")
    args = ap.parse_args()

    cache = kvproxy.HostBuffer(2 * LAYERS * PAGES * PAGE_BYTES)
    base = ctypes.addressof(ctypes.c_char.from_buffer(cache))
    aux = (ctypes.c_char * (8 * 64))()
    kv_args = sglang.KVArgs(
        kv_data_ptrs=[base + b * PAGES * PAGE_BYTES for b in range(2 * LAYERS)],
        kv_data_lens=[PAGES * PAGE_BYTES] * (2 * LAYERS), kv_item_lens=[PAGE_BYTES] * (2 * LAYERS),
        aux_data_ptrs=[ctypes.addressof(aux)], aux_data_lens=[len(aux)], aux_item_lens=[64])
    config = sglang.KvproxyConfig(socket=args.socket)  # under sglang: $KVPROXY_SOCKET
    mgr = sglang.KVManager(kv_args, sglang.DisaggregationMode.DECODE, None, config=config)

    receiver = sglang.KVReceiver(mgr, args.bootstrap, args.room)
    while not mgr.try_ensure_parallel_info(args.bootstrap):  # sglang retries this too
        mgr.wait_for_change(0.2)
    receiver.init(0)  # prefill DP rank
    wait(receiver, [KVPoll.WaitingForInput])
    pages = [90, 91, 92, 93, 10, 11, 12, 13, 50, 2, 3, 70]  # "allocated" for the request's 12 pages
    receiver.send_metadata(pages, aux_index=1)
    print(f"decode: room {args.room}: metadata sent, waiting for {len(pages)} pages")
    wait(receiver, [KVPoll.Success])

    bad = sum(ctypes.string_at(kv_args.kv_data_ptrs[b] + p * PAGE_BYTES, PAGE_BYTES) != pattern(b, i)
              for i, p in enumerate(pages) for b in range(2 * LAYERS))
    note = aux[64:128].rstrip(b"\0").decode()
    print(f"decode: room {args.room}: {len(pages)} pages x {2 * LAYERS} buffers landed, {bad} differ; aux row: {note!r}")
    receiver.clear()
    mgr.close()
    cache.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
