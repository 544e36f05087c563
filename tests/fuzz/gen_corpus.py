#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Write the seed corpus of every fuzz target into tests/fuzz/corpus/<target>/.

Each seed is a small valid (or deliberately almost-valid) input in the
format its harness reads; see the comment at the top of each fuzz_*.c.
Re-run after a wire/ABI change:  python3 tests/fuzz/gen_corpus.py
"""
import hashlib
import hmac
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

# Must match fuzz_common.h / fuzz_common.c (deterministic getrandom, config).
RND = 0x5A
NONCE = bytes([RND]) * 32


def key(slot):
    return ((0x5A5A5A5A5A5A5A5A << 16) & (2**64 - 1)) | slot


NODE = "fuzz0"
PEERS = ["peer0", "peer1"]
MAX_INFLIGHT = 16
SECRET = b"fuzz-secret"

# ---- wire format (lib/core/kvp_wire.h) ----
MAGIC, VERSION = 0x564B, 2
W_HELLO, W_DATA, W_END, W_ACK, W_ABORT, W_PING, W_PONG = range(1, 8)
F_AUTH = 1


def hdr(type_, length=0, tag=0, key_=0, off=0, aux=0, aux2=0, magic=MAGIC, version=VERSION):
    return struct.pack("<HBBIQQQQII", magic, version, type_, length, tag, key_, off, aux, aux2, 0)


W_DATA2D = 14


def hdr2d(length, tag, key_, off, blk, stride, aux=0):
    return struct.pack("<HBBIQQQQII", MAGIC, VERSION, W_DATA2D, length, tag, key_, off, aux, blk, stride)


def hello(node_id, to_node, epoch=1, max_inflight=MAX_INFLIGHT, frame_max=65536, status=0,
          flags=0, nonce=bytes(32), mac=bytes(32)):
    body = struct.pack("<32s32sQIIII32s32s", node_id.encode(), to_node.encode(), epoch,
                       max_inflight, frame_max, status, flags, nonce, mac)
    assert len(body) == 152
    return hdr(W_HELLO, 152) + body


def hello_mac(role, challenge, own, frm, to):
    msg = bytes([ord(role)]) + challenge + own + frm.encode().ljust(32, b"\0")[:31] + b"\0" \
        + to.encode().ljust(32, b"\0")[:31] + b"\0"
    return hmac.new(SECRET, msg, hashlib.sha256).digest()


def chunks_hello(stream, sizes=None):
    """fuzz_wire_hello chunk format: a byte L, then 2L+1 bytes."""
    out = b""
    i = 0
    while i < len(stream):
        n = min(len(stream) - i, 511)
        if sizes:
            n = min(n, sizes.pop(0)) if sizes else n
        if n % 2 == 0:
            n -= 1
        out += bytes([(n - 1) // 2]) + stream[i:i + n]
        i += n
    return out


def chunks_rx(stream, size=None):
    """fuzz_wire_rx chunk format: a 16-bit length-1, then the bytes."""
    out = b""
    i = 0
    while i < len(stream):
        n = min(len(stream) - i, size or 65536)
        out += struct.pack("<H", n - 1) + stream[i:i + n]
        i += n
    return out


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def gen_wire_hello():
    t = "wire_hello"
    # mode 0: frame_max (u32) + one header
    write(t, "check_data", b"\0" + struct.pack("<I", 65536) + hdr(W_DATA, 4096, 7, key(0), 0))
    write(t, "check_hello", b"\0" + struct.pack("<I", 0) + hdr(W_HELLO, 152))
    write(t, "check_wrap", b"\0" + struct.pack("<I", 65536) + hdr(W_DATA, 4096, 7, 1, 2**64 - 100))
    write(t, "check_ack", b"\0" + struct.pack("<I", 0) + hdr(W_ACK, 0, 3, aux=1))
    # strided DATA2D: 4 blocks of 1 KiB landing 4 KiB apart, and one whose span wraps
    write(t, "check_data2d", b"\0" + struct.pack("<I", 65536) + hdr2d(4096, 7, key(0), 0, 1024, 4096))
    write(t, "check_data2d_wrap", b"\0" + struct.pack("<I", 65536) + hdr2d(4096, 7, 1, 2**64 - 8192, 1024, 4096))
    # mode 1: acceptor, no secret: a good HELLO in two chunks, and refusals
    good = hello("peer0", NODE, epoch=9)
    write(t, "accept_ok", b"\x01" + chunks_hello(good, [99, 200]))
    write(t, "accept_peer1", b"\x01" + chunks_hello(hello("peer1", NODE)))
    write(t, "accept_unknown", b"\x01" + chunks_hello(hello("stranger", NODE)))
    write(t, "accept_target", b"\x01" + chunks_hello(hello("peer0", "other")))
    write(t, "accept_limits", b"\x01" + chunks_hello(hello("peer0", NODE, max_inflight=1 << 20)))
    write(t, "accept_trailing", b"\x01" + chunks_hello(good + hdr(W_PING)))
    # mode 5: acceptor with the secret: HELLO with a nonce, then the proof
    their = bytes(range(32))
    first = hello("peer0", NODE, flags=F_AUTH, nonce=their)
    proof = hello("peer0", NODE, flags=F_AUTH, nonce=their,
                  mac=hello_mac("D", NONCE, their, "peer0", NODE))
    write(t, "accept_auth_ok", b"\x05" + chunks_hello(first + proof))
    write(t, "accept_auth_bad", b"\x05" + chunks_hello(first + hello("peer0", NODE, flags=F_AUTH)))
    write(t, "accept_auth_missing", b"\x05" + chunks_hello(hello("peer0", NODE)))
    # mode 2: dialer (peer0), the acceptor's reply; mode 10: dialer to peer1
    write(t, "dial_ok", b"\x02" + chunks_hello(hello("peer0", "peer0")))
    write(t, "dial_peer1", b"\x0a" + chunks_hello(hello("peer1", NODE)))
    write(t, "dial_refused", b"\x02" + chunks_hello(hello("peer0", NODE, status=4)))
    write(t, "dial_wrong_node", b"\x02" + chunks_hello(hello("peer1", NODE)))
    mine = bytes(range(100, 132))
    write(t, "dial_auth_ok", b"\x06" + chunks_hello(
        hello("peer0", NODE, flags=F_AUTH, nonce=mine,
              mac=hello_mac("A", NONCE, mine, "peer0", NODE))))
    write(t, "dial_auth_bad", b"\x06" + chunks_hello(hello("peer0", NODE, flags=F_AUTH, nonce=mine)))


def gen_wire_rx():
    t = "wire_rx"
    direct, staged = key(1), key(2)
    pay = bytes((i * 7) & 0xFF for i in range(4096))
    # incoming: one transfer into the direct region, one into the staged one
    s = hdr(W_DATA, len(pay), 0x100, direct, 0) + pay + hdr(W_END, 0, 0x100, direct, len(pay), 1, 1)
    write(t, "in_direct", b"\0" + chunks_rx(s))
    s = hdr(W_DATA, len(pay), 0x101, staged, 500) + pay + hdr(W_END, 0, 0x101, staged, len(pay), 2, 1)
    write(t, "in_staged", b"\0" + chunks_rx(s, 1000))
    big = bytes(70000)
    s = hdr(W_DATA, len(big), 0x102, direct, 1000) + big + hdr(W_END, 0, 0x102, direct, len(big), 3, 1)
    write(t, "in_direct_recv", b"\0" + chunks_rx(s, 8192))
    s = (hdr(W_DATA, 100, 0x103, direct, 0) + bytes(100) + hdr(W_DATA, 100, 0x103, direct, 100)
         + bytes(100) + hdr(W_END, 0, 0x103, direct, 200, 4, 2) + hdr(W_PING, 0, 5))
    write(t, "in_two_frames_ping", b"\0" + chunks_rx(s))
    s = hdr(W_DATA, 64, 0x104, direct, 200000 - 10) + bytes(64) + hdr(W_END, 0, 0x104, direct, 64, 5, 1)
    write(t, "in_out_of_bounds", b"\0" + chunks_rx(s))
    s = hdr(W_DATA, 64, 0x105, key(9), 0) + bytes(64) + hdr(W_ABORT, 0, 0x105)
    write(t, "in_unknown_key_abort", b"\0" + chunks_rx(s))
    write(t, "in_bad_magic", b"\0" + chunks_rx(hdr(W_PING, magic=0x1234)))
    write(t, "in_ack_unexpected", b"\0" + chunks_rx(hdr(W_ACK, 0, 1)))
    write(t, "in_hello_late", b"\0" + chunks_rx(hello("peer0", NODE)))
    # outgoing: our transfer (slot 0, generation 0: tag 0) acknowledged, or refused
    write(t, "out_ack_ok", b"\x01" + chunks_rx(hdr(W_ACK, 0, 0, aux=0)))
    write(t, "out_ack_remote", b"\x01" + chunks_rx(hdr(W_ACK, 0, 0, aux=6) + hdr(W_PONG)))
    write(t, "out_ack_stale", b"\x01" + chunks_rx(hdr(W_ACK, 0, 5 << 32) + hdr(W_PING, 0, 1)))
    write(t, "out_data_unexpected", b"\x01" + chunks_rx(hdr(W_DATA, 8, 0, direct) + bytes(8)))
    # DATA2D: 16 blocks of 256 bytes landing 1000 apart, in place and staged; one out of bounds
    blocks = bytes((i * 11) & 0xFF for i in range(4096))
    for name, k, ck in (("in_2d_direct", direct, None), ("in_2d_staged", staged, 700)):
        s = hdr2d(len(blocks), 0x106, k, 10, 256, 1000) + blocks + hdr(W_END, 0, 0x106, k, 4096, 6, 1)
        write(t, name, b"\0" + chunks_rx(s, ck))
    s = hdr2d(4096, 0x107, direct, 190000, 256, 1000) + blocks + hdr(W_END, 0, 0x107, direct, 4096, 7, 1)
    write(t, "in_2d_out_of_bounds", b"\0" + chunks_rx(s))


# ---- ring harness (fuzz_ring.c) ----
OP_RAW, OP_XFER, OP_PROD, OP_POLL, OP_CQREAD, OP_CQCONS, OP_COMPLETE, OP_CANCEL, OP_TIMER, OP_WAKE, \
    OP_FENCE = 0, 1, 3, 4, 6, 7, 8, 9, 10, 11, 12
SRC_OWN, SRC_OTHER, SRC_GONE, SRC_OLDGEN, SRC_RANDOM, SRC_ZERO = range(6)


def u16(v):
    return bytes([5]) + struct.pack("<H", v)  # pick_u64 case 5: 2 bytes


def seg(src=SRC_OWN, off=0, length=256, dst=True, dst_off=0, bad_op=False):
    b = bytes([0 if bad_op else 1]) + (bytes([7]) if bad_op else b"")
    b += bytes([src]) + (struct.pack("<Q", 0x1234) if src == SRC_RANDOM else b"")
    b += u16(off) if off != "len" else bytes([1])
    b += u16(length) if not isinstance(length, bytes) else length
    b += bytes([1 if dst else 0])
    b += u16(dst_off)
    return b


def seg2d(length=16, count=8, sstride=32, dstride=16, src_off=None):
    """A strided segment (kind byte 5), small shape: len 1 + byte, count byte % 64,
    strides len + byte % 64; src_off small when given."""
    b = bytes([5, SRC_OWN]) + u16(0) + u16(256) + bytes([1]) + u16(0)
    b += bytes([1, length - 1, 1, count, 1, sstride - length, 1, dstride - length])
    b += bytes([0, src_off]) if src_off is not None else bytes([1])
    return b


def fence(mask=0xFFFFFFFFFFFF0000, value=0x10000, hold=1, busy=0):
    return bytes([OP_FENCE, 1]) + struct.pack("<Q", mask) + struct.pack("<Q", value) + bytes([hold, busy])


def xfer(segs, peer=0, timeout=3, submit=3):
    b = bytes([OP_XFER, len(segs) - 1])
    b += bytes([1]) if peer == 0 else bytes([0]) + struct.pack("<H", peer)
    b += bytes([timeout]) + bytes([submit])
    return b + b"".join(segs)


def ring(sq=3, cq=3, body=b""):
    return bytes([sq, cq]) + body


def gen_ring():
    t = "ring"
    ok = xfer([seg()])
    # post byte 0: the stub ends the transfer at once, ok
    write(t, "one_ok", ring(body=ok + bytes([OP_POLL, 0, OP_CQREAD, 15])))
    write(t, "multi_seg", ring(body=xfer([seg(off=0, length=100), seg(off=100, length=100),
                                          seg(off=19000, length=1000)])
                               + bytes([OP_POLL, 0, OP_CQREAD, 15])))
    bad = (xfer([seg(src=SRC_OTHER)]) + xfer([seg(src=SRC_GONE)]) + xfer([seg(src=SRC_OLDGEN)])
           + xfer([seg(src=SRC_RANDOM)]) + xfer([seg(off=19990, length=100)])
           + xfer([seg(length=0)]) + xfer([seg(dst=False)]) + xfer([seg(bad_op=True)]))
    write(t, "invalid_mix", ring(body=bad + bytes([OP_POLL, OP_CQREAD, 15, OP_POLL, OP_CQREAD, 15])))
    write(t, "no_peer", ring(body=xfer([seg()], peer=5) + bytes([OP_POLL, OP_CQREAD, 15])))
    write(t, "too_many_segs", ring(body=xfer([seg()] * 9) + bytes([OP_POLL, OP_CQREAD, 15])))
    # post byte 3: the transfer stays in flight; then cancel / complete / deadline
    write(t, "cancel", ring(body=ok + bytes([OP_POLL, 3, OP_CANCEL, 0, OP_POLL, OP_CQREAD, 15])))
    write(t, "complete_later", ring(body=ok + ok + bytes([OP_POLL, 3, 3, OP_COMPLETE, 1, 0, 0, 0, 2,
                                                          OP_CQREAD, 15])))
    write(t, "deadline", ring(body=ok + bytes([OP_POLL, 3, OP_TIMER, 1, OP_CQREAD, 15])))
    write(t, "peer_down", ring(body=bytes([OP_TIMER, 2]) + ok + bytes([OP_POLL, OP_CQREAD, 15])))
    # a small CQ that fills: completions wait in the backlog
    many = ok * 6
    step = bytes([OP_POLL, 0, 0, OP_CQREAD, 15])
    write(t, "cq_small", ring(sq=3, cq=0, body=many + step * 3))
    # rogue clients: garbage entries, indices backwards / past the ring, CQ cons backwards
    write(t, "raw_garbage", ring(body=bytes([OP_RAW, 1]) + bytes(range(128))
                                 + bytes([OP_POLL])))
    write(t, "prod_backwards", ring(body=ok + bytes([OP_PROD, 0, 5, OP_POLL])))
    write(t, "prod_past", ring(body=bytes([OP_PROD, 1, 0, OP_POLL])))
    write(t, "prod_random", ring(body=bytes([OP_PROD, 3]) + struct.pack("<I", 0xDEADBEEF) + bytes([OP_POLL])))
    write(t, "cq_cons_backwards", ring(cq=0, body=ok + ok + bytes([OP_POLL, 3, 3, OP_CQCONS, 0, 1,
                                                                   OP_COMPLETE, 1, 0, 0, OP_TIMER, 0, OP_POLL])))
    write(t, "cq_cons_forward", ring(body=ok + bytes([OP_CQCONS, 1, 40, OP_POLL, 0, OP_POLL])))
    write(t, "wakeup", ring(body=bytes([OP_WAKE, 1]) + ok + bytes([OP_POLL, 0, OP_CQREAD, 15])))
    # strided segments: a few shapes, one overlapping (stride < block), one beyond the region
    write(t, "seg2d", ring(body=xfer([seg2d(), seg2d(64, 40, 100, 64, 7), seg()])
                           + bytes([OP_POLL, 0, OP_CQREAD, 15])))
    write(t, "seg2d_bad", ring(body=xfer([seg2d(length=64, sstride=64, dstride=64)])
                               + xfer([seg2d(length=200, count=63, sstride=250, dstride=250)])
                               + bytes([OP_POLL, 0, OP_POLL, 0, OP_CQREAD, 15])))
    # fences: held at once, busy for two timer ticks, refused with mask 0
    write(t, "fence", ring(body=fence() + fence(busy=2) + bytes([OP_POLL, OP_TIMER, 0, OP_TIMER, 0,
                                                                   OP_CQREAD, 15])
                           + bytes([OP_FENCE, 0]) + bytes(17) + bytes([OP_POLL, OP_CQREAD, 15])))


def gen_admin():
    t = "admin"
    reqs = [
        '{"jsonrpc":"2.0","id":1,"method":"status"}',
        '{"jsonrpc":"2.0","id":"s","method":"stats"}',
        '{"jsonrpc":"2.0","id":2,"method":"stats","params":{"format":"prometheus"}}',
        '{"jsonrpc":"2.0","id":3,"method":"peers"}',
        '{"jsonrpc":"2.0","id":4,"method":"transfers","params":{"limit":5}}',
        '{"jsonrpc":"2.0","id":5,"method":"slowest"}',
        '{"jsonrpc":"2.0","id":6,"method":"cancel","params":{"client":65536,"user_id":1}}',
        '{"jsonrpc":"2.0","id":7,"method":"drain"}\n{"jsonrpc":"2.0","id":8,"method":"undrain"}',
        '{"jsonrpc":"2.0","id":9,"method":"config_get"}',
        '{"jsonrpc":"2.0","id":10,"method":"config_get","params":{"key":"timeouts.default_ms"}}',
        '{"jsonrpc":"2.0","id":11,"method":"config_set","params":{"key":"poll.idle_us","value":50}}',
        '{"jsonrpc":"2.0","id":12,"method":"config_set","params":{"key":"stats.enabled","value":false}}',
        '{"jsonrpc":"2.0","id":13,"method":"log_level","params":{"level":"debug"}}',
        '{"jsonrpc":"2.0","id":14,"method":"doctor"}',
        '{"jsonrpc":"2.0","method":"status"}',
        '{"jsonrpc":"2.0","id":null,"method":"nope","params":[1]}',
        '[1,2,3]',
        '{"jsonrpc":"1.0","id":1}',
        '{"jsonrpc":"2.0","id":{"x":1},"method":"status","params":"x"}',
        '{"jsonrpc":"2.0","id":1,"id":2,"method":"status"}',
        '{"jsonrpc":"2.0","id":1,"method":"stats"}',
    ]
    for i, r in enumerate(reqs):
        write(t, "req%02d" % i, bytes([i % 4]) + r.encode())
    write(t, "pipeline", b"\0" + "\n".join(reqs).encode())
    # JSON-RPC 2.0 conformance (issue 16): ids of every kind, invalid ids, notifications, batches.
    rpc = {
        "id_real": '{"jsonrpc":"2.0","id":1.5,"method":"status"}',
        "id_exp": '{"jsonrpc":"2.0","id":1e3,"method":"config_get","params":{"key":"poll.busy"}}',
        "id_neg_exp": '{"id":-2.50E+1,"jsonrpc":"2.0","method":"status"}',
        "id_escaped_key": '{"jsonrpc":"2.0","\\u0069d":"a\\u0062","method":"peers"}',
        "id_true_drain": '{"jsonrpc":"2.0","id":true,"method":"drain"}',
        "id_object": '{"jsonrpc":"2.0","id":{},"method":"drain"}',
        "id_array": '{"jsonrpc":"2.0","id":[1],"method":"config_set","params":{"key":"poll.idle_us","value":7}}',
        "notify_fail": '{"jsonrpc":"2.0","method":"nope"}\n{"jsonrpc":"2.0","method":"config_set","params":{"key":"x"}}',
        "notify_drain": '{"jsonrpc":"2.0","method":"drain"}\n{"jsonrpc":"2.0","method":"undrain"}',
        "batch": '[{"jsonrpc":"2.0","id":1,"method":"status"},{"jsonrpc":"2.0","method":"drain"},'
                 '{"jsonrpc":"2.0","id":"x","method":"nope"},5,{"jsonrpc":"2.0","id":true,"method":"undrain"},'
                 '{"jsonrpc":"2.0","id":2.0,"method":"stats","params":{"format":"prometheus"}}]',
        "batch_notify": '[{"jsonrpc":"2.0","method":"status"},{"jsonrpc":"2.0","method":"undrain"}]',
        "batch_empty": '[]\n [ ] ',
        "batch_big": "[" + ",".join(['{"jsonrpc":"2.0","method":"status"}'] * 257) + "]",
        "batch_nested": '[[{"jsonrpc":"2.0","id":1,"method":"status"}],[]]',
    }
    for i, (name, r) in enumerate(sorted(rpc.items())):
        write(t, "rpc_" + name, bytes([i % 4]) + r.encode())


def gen_config():
    t = "config"
    conf = open(os.path.join(HERE, "..", "..", "conf", "kvproxy.conf"), "rb").read()
    write(t, "sample.conf", b"\0" + conf)
    write(t, "minimal.conf", b'\0node_id = "a";\n')
    write(t, "peers.conf", b""" node_id = "prefill0";
client_socket = "/tmp/k/prefill0.sock";
admin_socket = "/tmp/k/prefill0.admin";
listen = "10.77.1.1:7400";
transport = "auto";
log_level = "debug";
limits = { max_clients = 4; max_segments = 16; sq_entries = 32; cq_entries = 8; max_inflight = 65536; };
timeouts = { peer_ms = 1000; reconnect_ms = 100; default_ms = 5000; };
stage = { pool = 65536; buffer = 16384; host = true; };
stats = { enabled = false; interval_ms = 0; slowest_window_s = 10; file = "/tmp/k/stats.prom"; };
auth = { secret = "s3cret"; };
peers = (
	{ node_id = "decode0"; addr = "10.77.1.2:7400"; },
	{ node_id = "decode1"; addr = "[::1]:7401"; }
);
""")
    write(t, "bad_limits.conf", b'\0node_id = "x";\nlimits = { sq_entries = 8; max_segments = 8; };\n')
    write(t, "bad_peer.conf", b'\0node_id = "x";\npeers = ( { node_id = "x"; addr = "h:1"; } );\n')
    write(t, "unknown_key.conf", b'\0node_id = "x";\nlimits = { max_clientz = 3; };\n')
    write(t, "out_of_range.conf", b'\0node_id = "x";\ntimeouts = { peer_ms = 5; };\n')
    write(t, "syntax.conf", b'\0node_id = "x" \nlisten = 7400;\n')
    write(t, "types.conf", b'\0node_id = "x";\nauth = { secret_file = "/etc/hostname"; };\n'
          b'tcp = { frame_max = 4096L; rx_buffer = 0x10000; tx_frames = 8; send_iov = 2; };\n'
          b'poll = { busy = true; idle_us = 0; };\n')
    write(t, "small_err.conf", b'\x02node_id = 5;\n')
    # Integers past 32 bits, both secrets, no secret on a public address (issue 16).
    write(t, "int64.conf", b'\0node_id = "x";\ntcp = { frame_max = 99999999999999; };\n')
    write(t, "int64_wrap.conf", b'\0node_id = "x";\ntcp = { frame_max = 4294971392; };\n')
    write(t, "int64_max.conf", b'\0node_id = "x";\nstage = { pool = 2147483648; buffer = 0x100000; };\n')
    write(t, "int_past64.conf", b'\0node_id = "x";\nlimits = { max_clients = 99999999999999999999; };\n')
    write(t, "hex_past64.conf", b'\0node_id = "x";\nlimits = { max_clients = 0x1FFFFFFFFFFFFFFFF; };\n')
    write(t, "float_int.conf", b'\0node_id = "x";\nlimits = { max_clients = 1e3; };\n')
    write(t, "both_secrets.conf", b'\0node_id = "x";\nauth = { secret_file = "/etc/hostname"; secret = ""; };\n')
    write(t, "public_nosecret.conf", b'\0node_id = "x";\nlisten = "0.0.0.0:7400";\n')
    write(t, "auth_none.conf", b'\0node_id = "x";\nlisten = "[::]:7400";\nauth = "none";\n')
    write(t, "auth_bad.conf", b'\0node_id = "x";\nauth = "off";\n')
    write(t, "include.conf", b'\0node_id = "x";\n@include "other.conf"\n')
    write(t, "comments_digits.conf", b'\0node_id = "x-1"; # 99999999999999\n/* 4294967296\n */ '
          b'rdma = { devices = "mlx5_0:1"; timeout = 14L; };\nstats = { file = "/tmp/k/a.prom"; };\n')


# ---- client socket protocol (fuzz_client_ctrl.c) ----
CTRL_MAGIC, ABI = 0x4B56, 2
C_HELLO, C_REG, C_DEREG, C_PEER = 1, 2, 3, 4


def ctrl(op, body=b"", magic=CTRL_MAGIC, abi=ABI, seq=1):
    m = struct.pack("<HHIQ", magic, op, abi, seq) + body
    return m + bytes(256 - len(m))


def hello_req(sq=0, cq=0, pid=1):
    return ctrl(C_HELLO, struct.pack("<IIi", sq, cq, pid))


def reg_req(off=0, length=65536, flags=1, device=0):
    return ctrl(C_REG, struct.pack("<QQIi", off, length, flags, device) + bytes(64))


def whole(req, fds=0):
    """A chunk carrying a whole request (flag 0x80), with fds (flag bits 0-3)."""
    return bytes([0x80 | fds, 0]) + req


def gen_client_ctrl():
    t = "client_ctrl"
    write(t, "hello", whole(hello_req()))
    write(t, "hello_reg_dereg_lookup", whole(hello_req()) + whole(reg_req(), 1)
          + whole(ctrl(C_DEREG, struct.pack("<Q", key(0))))
          + whole(ctrl(C_PEER, b"peer0".ljust(32, b"\0"))))
    write(t, "reg_kept", whole(hello_req(sq=64, cq=16)) + whole(reg_req(4096, 8192), 1)
          + whole(reg_req(0, 4096), 2))
    write(t, "reg_before_hello", whole(reg_req(), 1) + whole(hello_req()))
    write(t, "reg_bad", whole(hello_req()) + whole(reg_req()) + whole(reg_req(), 4)
          + whole(reg_req(), 3) + whole(reg_req(0, 1 << 20), 1) + whole(reg_req(2**64 - 10, 100), 1)
          + whole(reg_req(flags=0x80000001), 1) + whole(reg_req(flags=2)) + whole(reg_req(flags=4), 1)
          + whole(reg_req(), 8) + whole(reg_req(length=0), 1))
    write(t, "bad_magic", whole(ctrl(C_HELLO, magic=0x1234)))
    write(t, "bad_abi", whole(ctrl(C_HELLO, abi=7)))
    write(t, "hello_twice", whole(hello_req()) + whole(hello_req()))
    write(t, "hello_sizes", whole(hello_req(sq=3)) + whole(hello_req(sq=1 << 20, cq=2)))
    write(t, "unknown_op", whole(hello_req()) + whole(ctrl(99)) + whole(ctrl(C_DEREG, bytes(8))))
    h = hello_req()
    write(t, "hello_split", bytes([0, 99]) + h[:100] + bytes([1, 155]) + h[100:])
    write(t, "lookup_unknown", whole(hello_req()) + whole(ctrl(C_PEER, b"x" * 32)))


def main():
    gens = {"client_ctrl": gen_client_ctrl,"wire_hello": gen_wire_hello, "wire_rx": gen_wire_rx, "ring": gen_ring,
            "admin": gen_admin, "config": gen_config}
    for name in sys.argv[1:] or gens:
        gens[name]()
        print("corpus/%s: %d seeds" % (name, len(os.listdir(os.path.join(CORPUS, name)))))


if __name__ == "__main__":
    main()
