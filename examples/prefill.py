#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Prefill side of the kvproxy example: send KV bytes to a decode node's region.

Reads the destination region key that decode.py wrote, fills a registered
source buffer with the pattern (from --seed), sends it to the decode node as
one transfer of --segment sized segments, and waits for the done completion.

    python3 examples/prefill.py --socket /tmp/kvp-demo/prefill0.sock --peer decode0 --key-file /tmp/kvp-demo/key
"""

import argparse
import random
import sys
import time

import kvproxy


def pattern(seed: int, size: int) -> bytes:
    """The bytes to send (decode.py derives the same from the seed)."""
    return random.Random(seed).randbytes(size)


def read_key(path: str, wait_s: float) -> int:
    """The key decode.py publishes; polls until the file exists (bounded)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path) as f:
                return int(f.read(), 0)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise SystemExit(f"prefill: no key in {path} after {wait_s}s (is decode.py running?)")
            time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True, help="prefill node's client_socket")
    ap.add_argument("--peer", required=True, help="node_id of the decode node")
    ap.add_argument("--key-file", required=True, help="file decode.py writes the region key to")
    ap.add_argument("--size", type=int, default=16 << 20, help="bytes to send (default 16 MiB)")
    ap.add_argument("--segment", type=int, default=1 << 20, help="segment size (default 1 MiB)")
    ap.add_argument("--seed", type=int, default=1, help="pattern seed (same as decode.py)")
    ap.add_argument("--wait-key", type=float, default=30.0, help="seconds to wait for the key file")
    ap.add_argument("--timeout", type=float, default=60.0, help="transfer deadline in seconds")
    args = ap.parse_args()

    dst_key = read_key(args.key_file, args.wait_key)
    with kvproxy.Client(args.socket) as client, kvproxy.HostBuffer(args.size) as buf:
        buf[:] = pattern(args.seed, args.size)
        with client.register(buf) as src:
            peer = client.peer(args.peer)
            # Same offsets on both sides here; any (src_off, dst_off) pairs work.
            segments = [
                kvproxy.Segment(src.key, off, dst_key, off, min(args.segment, args.size - off))
                for off in range(0, args.size, args.segment)
            ]
            if len(segments) > client.max_segments:
                raise SystemExit(f"prefill: {len(segments)} segments; raise --segment (max {client.max_segments})")
            client.submit(peer, segments, user_id=1, timeout=args.timeout)
            # buf belongs to kvproxy until the done completion: do not touch it before.
            done = None
            deadline = time.monotonic() + args.timeout + 5  # the daemon ends it by its deadline
            while done is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SystemExit("prefill: no completion (is the daemon alive?)")
                for c in client.wait(timeout=left):
                    if c.kind == "done" and c.user_id == 1:
                        done = c
            print(f"prefill: {client.node_id} -> {args.peer}: {done.status_name}, {done.bytes} bytes, {done.nseg} segments")
            print("prefill: phases (ms): " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in done.phases.items()))
            done.raise_for_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
