#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Decode side of the kvproxy example: receive KV bytes into a registered buffer.

Registers a destination buffer with the local kvproxyd, writes its region key
to a file (in a real deployment the key travels through the engine's own
bootstrap), waits until transfers totalling --size bytes have landed, and
checks the bytes against the pattern prefill.py sends (same --seed).

    python3 examples/decode.py --socket /tmp/kvp-demo/decode0.sock --key-file /tmp/kvp-demo/key
"""

import argparse
import os
import random
import sys
import time

import kvproxy


def pattern(seed: int, size: int) -> bytes:
    """The bytes prefill.py sends (both sides derive them from the seed)."""
    return random.Random(seed).randbytes(size)


def write_key(path: str, key: int) -> None:
    """Publish the key atomically: a reader never sees half of it."""
    with open(path + ".tmp", "w") as f:
        f.write(f"{key:#018x}\n")
    os.replace(path + ".tmp", path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True, help="decode node's client_socket")
    ap.add_argument("--key-file", required=True, help="where to write the destination region key")
    ap.add_argument("--size", type=int, default=16 << 20, help="bytes to expect (default 16 MiB)")
    ap.add_argument("--seed", type=int, default=1, help="pattern seed (same as prefill.py)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the data")
    args = ap.parse_args()

    with kvproxy.Client(args.socket) as client, kvproxy.HostBuffer(args.size) as buf:
        with client.register(buf) as region:
            write_key(args.key_file, region.key)
            print(f"decode: {client.node_id}: region {region.key:#018x} ({args.size} bytes), key in {args.key_file}")
            try:
                landed = 0
                deadline = time.monotonic() + args.timeout
                while landed < args.size:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        print(f"decode: timed out with {landed} of {args.size} bytes landed", file=sys.stderr)
                        return 1
                    for c in client.wait(timeout=left):
                        if c.kind == "landed" and c.dst_key == region.key:
                            c.raise_for_status()
                            landed += c.bytes
                            print(f"decode: transfer {c.user_id} landed: {c.bytes} bytes in {c.nseg} segments")
            finally:
                os.unlink(args.key_file)  # the key dies with the region

            if bytes(buf) != pattern(args.seed, args.size):
                print("decode: MISMATCH: the data is not what prefill sent", file=sys.stderr)
                return 1
            print(f"decode: verified {args.size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
