#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Prefill side of an sglang-style transfer through kvproxy.sglang.

Does what sglang's prefill server does with the kvproxy backend: runs the
bootstrap server, creates a KV manager over its paged KV cache (it registers
at the bootstrap server), and for one request (a bootstrap room) waits for
the decode side's metadata, then sends the request's pages in two chunks
plus its aux (metadata) row.

    python3 examples/sglang_prefill.py --socket /tmp/kvp-demo/prefill0.sock --bootstrap-port 8998 --room 42
"""

import argparse
import ctypes
import sys

import kvproxy
from kvproxy import sglang
from kvproxy.sglang import KVPoll

LAYERS, PAGES, PAGE_BYTES = 4, 64, 4096  # K and V buffers per layer: 8 buffers


def pattern(buf: int, i: int) -> bytes:
    """What page i of the request holds in buffer buf (decode checks the same)."""
    return bytes([(buf * 31 + i * 7 + k) % 251 for k in range(PAGE_BYTES)])


def wait(req, want) -> KVPoll:
    """Poll like sglang's scheduler loop, until one of the states in ``want`` (or Failed)."""
    while (state := req.poll()) not in (*want, KVPoll.Failed):
        req.kv_mgr.wait_for_change(0.1)
    if state == KVPoll.Failed:
        req.failure_exception()  # raises kvproxy.sglang.KVTransferError with code and reason
    return state


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True, help="client_socket of the prefill node's kvproxyd")
    ap.add_argument("--bootstrap-port", type=int, default=8998, help="sglang's --disaggregation-bootstrap-port")
    ap.add_argument("--room", type=int, required=True, help="the request's bootstrap room (same on both sides)")
    args = ap.parse_args()

    # sglang starts this once per prefill node (--disaggregation-bootstrap-port).
    server = sglang.KVBootstrapServer(host="127.0.0.1", port=args.bootstrap_port)

    # The KV cache: one buffer per layer for K and for V, page i at ptr + i * PAGE_BYTES.
    cache = kvproxy.HostBuffer(2 * LAYERS * PAGES * PAGE_BYTES)
    base = ctypes.addressof(ctypes.c_char.from_buffer(cache))
    aux = (ctypes.c_char * (8 * 64))()  # 8 metadata rows of 64 bytes (a CPU tensor in sglang)
    kv_args = sglang.KVArgs(
        kv_data_ptrs=[base + b * PAGES * PAGE_BYTES for b in range(2 * LAYERS)],
        kv_data_lens=[PAGES * PAGE_BYTES] * (2 * LAYERS), kv_item_lens=[PAGE_BYTES] * (2 * LAYERS),
        aux_data_ptrs=[ctypes.addressof(aux)], aux_data_lens=[len(aux)], aux_item_lens=[64])
    # What the manager reads of sglang's ServerArgs (here: where the bootstrap server runs).
    server_args = argparse.Namespace(host="127.0.0.1", disaggregation_bootstrap_port=args.bootstrap_port)
    config = sglang.KvproxyConfig(socket=args.socket)  # under sglang: $KVPROXY_SOCKET
    mgr = sglang.KVManager(kv_args, sglang.DisaggregationMode.PREFILL, server_args, config=config)

    # "Run the forward pass": the request's 12 pages land in scattered cache pages.
    pages = [5, 6, 7, 8, 20, 21, 40, 41, 42, 43, 44, 60]
    for i, p in enumerate(pages):
        for b in range(2 * LAYERS):
            ctypes.memmove(kv_args.kv_data_ptrs[b] + p * PAGE_BYTES, pattern(b, i), PAGE_BYTES)
    note = b"first token of room %d" % args.room
    aux[0:len(note)] = note

    sender = sglang.KVSender(mgr, f"127.0.0.1:{args.bootstrap_port}", args.room, dest_tp_ranks=[0], pp_rank=0)
    print(f"prefill: waiting for the decode side of room {args.room}")
    wait(sender, [KVPoll.WaitingForInput])
    sender.init(len(pages), aux_index=0)  # page count and our aux row
    sender.send(pages[:8])  # chunked prefill: first chunk
    sender.send(pages[8:])  # last chunk (also sends the aux row)
    wait(sender, [KVPoll.Success])
    m = sender.get_transfer_metric()
    print(f"prefill: room {args.room}: {m.transfer_total_bytes} bytes sent in {m.transfer_latency_s * 1e3:.2f} ms")
    sender.clear()
    mgr.close()
    server.close()
    cache.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
