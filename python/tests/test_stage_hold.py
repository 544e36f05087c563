#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A receive that waits for a staging buffer is not a stalled link (KVP_PING_RXWAIT, TCP).

A kvproxyd that has no receive staging buffer free leaves the next DATA
header unread, so the sender's send stops moving by design. The receiver
says so with PINGs flagged RXWAIT every peer_ms / 4, and a sender that gets
them does not cut the link as "send stalled" after peer_ms (before, under
staging overload, a wait longer than peer_ms failed every transfer on it).

- sender side: a scripted peer (wire_peer.FakeNode) stops reading a 32 MiB
  transfer for three times peer_ms while vouching: the link stays up and the
  transfer ends ok once it reads again. Vouching for ever, it is cut after
  8 x peer_ms; pinging without the flag, after peer_ms ("send stalled").
- receiver side: a kvproxyd with one staging buffer, held by a scripted
  link's unfinished DATA frame, sends a second scripted link whose header
  waits the flagged PING, and no plain one; once the first link goes, the second's bytes
  land in place and its END is acknowledged ok.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir. Exit status: 0 pass, 1 fail, 77 skip (with the reason).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)
import wire_peer as wp  # noqa: E402

import kvproxy  # noqa: E402

MIB = 1 << 20
SEND_PEER_MS = 500  # the sender's timeouts.peer_ms: the stall it would cut
RECV_PEER_MS = 4000  # the receiver's: how long the held buffer's link lasts


def node(tmp: Path, node_id: str, port: int, peer_ms: int, extra: str = "") -> tb.Daemon:
    """A node of no configured peers that takes the scripted ones (one link each)."""
    return tb.Daemon(tmp, node_id, port, None, 0, "accept_unknown_peers = true; tcp = { connections = 1; }; " + extra,
                     f"peer_ms = {peer_ms}; connect_ms = 5000;")


class StageHoldTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = Path(tempfile.mkdtemp(prefix="kvp-stage-hold."))
        tb.log(f"temp dir {cls.tmp}")
        ps, pr = tb.free_ports(2)
        cls.snd = node(cls.tmp, "sender0", ps, SEND_PEER_MS)
        # A pool of four buffers: one of them for receives.
        cls.rcv = node(cls.tmp, "receiver0", pr, RECV_PEER_MS, f"stage = {{ host = true; pool = {4 * MIB}; buffer = {MIB}; }};")
        for d in (cls.snd, cls.rcv):
            tb.STARTED.append(d)
            d.start()
        for d in (cls.snd, cls.rcv):
            d.wait_ready(need_peer=False)
        cls.src = kvproxy.Client(cls.snd.sock)
        cls.sbuf = kvproxy.HostBuffer(32 * MIB)
        cls.sbuf[:] = os.urandom(32 * MIB)
        cls.sreg = cls.src.register(cls.sbuf)
        cls.dst = kvproxy.Client(cls.rcv.sock)
        cls.dbuf = kvproxy.HostBuffer(4 * MIB)
        cls.dreg = cls.dst.register(cls.dbuf)

    @classmethod
    def tearDownClass(cls) -> None:
        for c in (cls.src, cls.dst):
            c.close()
        cls.sbuf.close()
        cls.dbuf.close()
        tb.stop_and_clean(cls.tmp, (cls.snd, cls.rcv))

    def conn_errors(self, node_id: str) -> int:
        rows = [p for p in self.snd.admin_call("stats")["peers"] if p.get("node_id") == node_id]
        return int(rows[0].get("conn_errors", 0)) if rows else 0

    def held_send(self, name: str, mode: str, uid: int) -> kvproxy.Completion:
        """A 32 MiB transfer to a FakeNode that stops reading (pause @p mode) for 3 x peer_ms."""
        fake = wp.FakeNode(name, ack=True)
        self.addCleanup(fake.close)
        peer = self.src.peer(f"127.0.0.1:{fake.port}")
        self.src.submit(peer, [(self.sreg.key, 0, 0x1000, 0, 4096)], uid - 1, timeout=10)
        self.assertEqual(tb.wait_for(self.src, tb.done_of(uid - 1), 15).status_name, "ok", "the link never came up")
        fake.pause(mode)
        self.src.submit(peer, [(self.sreg.key, 0, 0x1000, 0, 32 * MIB)], uid, timeout=30)
        early = None
        deadline = time.monotonic() + 3 * SEND_PEER_MS / 1000  # the wait under test, not a sync
        while early is None and time.monotonic() < deadline:
            early = next((c for c in self.src.wait(timeout=0.1) if c.user_id == uid), None)
        fake.resume()
        return early if early is not None else tb.wait_for(self.src, tb.done_of(uid), 20)

    def test_vouched_wait_is_not_a_stall(self) -> None:
        before = self.conn_errors("vouch0")
        c = self.held_send("vouch0", "rxwait", 11)
        self.assertEqual(c.status_name, "ok", f"the held transfer ended {c.status_name}")
        self.assertEqual(self.conn_errors("vouch0"), before, "the link was cut while the peer vouched")

    def test_vouching_is_bounded(self) -> None:
        """A peer that vouches for ever (and never reads) is cut after 8 peer timeouts."""
        fake = wp.FakeNode("forever0", ack=True)
        self.addCleanup(fake.close)
        peer = self.src.peer(f"127.0.0.1:{fake.port}")
        self.src.submit(peer, [(self.sreg.key, 0, 0x1000, 0, 4096)], 30, timeout=10)
        self.assertEqual(tb.wait_for(self.src, tb.done_of(30), 15).status_name, "ok", "the link never came up")
        fake.pause("rxwait")
        self.src.submit(peer, [(self.sreg.key, 0, 0x1000, 0, 32 * MIB)], 31, timeout=60)
        c = tb.wait_for(self.src, tb.done_of(31), 8 * SEND_PEER_MS / 1000 + 20)
        self.assertEqual(c.status_name, "peer", "a send the peer vouched for without end was not cut")
        self.assertIn("(the peer waits for buffers)", self.snd.logfile.read_text(errors="replace"))

    def test_unvouched_stall_is_cut(self) -> None:
        c = self.held_send("stall0", "ping", 21)
        self.assertNotEqual(c.status_name, "ok", "a send stalled for 3 x peer_ms was not cut")
        self.assertGreaterEqual(self.conn_errors("stall0"), 1)
        log = self.snd.logfile.read_text(errors="replace")
        self.assertIn("send stalled", log)

    def test_receiver_vouches_while_held(self) -> None:
        key = self.dreg.key
        holder = wp.dial(self.rcv.port, b"holdA")
        self.addCleanup(holder.close)
        holder.sendall(wp.frame(wp.DATA, MIB, tag=1, key=key, off=0, aux=0x100) + b"h" * 1000)
        deadline = time.monotonic() + 10
        while not self.rx_frames("holdA"):  # its header took the only buffer
            self.assertLess(time.monotonic(), deadline, "holdA's DATA header was never read")
            time.sleep(tb.POLL)
        waiter = wp.dial(self.rcv.port, b"waitB")
        self.addCleanup(waiter.close)
        payload = os.urandom(4096)
        waiter.sendall(wp.frame(wp.DATA, 4096, tag=2, key=key, off=MIB, aux=0x200) + payload)
        waiter.settimeout(0.2)
        pings = {True: 0, False: 0}  # flagged RXWAIT or not
        # Longer than the idle-PING interval (peer_ms / 4), shorter than holdA's life (peer_ms).
        deadline = time.monotonic() + (RECV_PEER_MS / 1000) * 0.6
        while time.monotonic() < deadline:
            try:
                h, _ = wp.read_frame(waiter)
            except socket.timeout:
                continue
            if h[2] == wp.PING:
                pings[bool(h[7] & wp.PING_RXWAIT)] += 1
        self.assertGreater(pings[True], 0, "no PING with RXWAIT while waitB's header waited for a buffer")
        self.assertEqual(pings[False], 0, "plain PINGs (answered from the stalled sender's queue) during the hold")
        holder.close()  # frees the buffer
        waiter.settimeout(10)
        waiter.sendall(wp.frame(wp.END, 0, tag=2, key=key, off=4096, aux=0x200, aux2=1))
        while True:
            h, _ = wp.read_frame(waiter)
            if h[2] == wp.ACK and h[4] == 2:
                break
        self.assertEqual(h[7], 0, f"waitB's transfer was acknowledged with status {h[7]}")
        self.assertEqual(bytes(self.dbuf[MIB:MIB + 4096]), payload, "waitB's bytes are not in place")

    def rx_frames(self, node_id: str) -> int:
        rows = [p for p in self.rcv.admin_call("stats")["peers"] if p.get("node_id") == node_id]
        return int(rows[0].get("rx_frames", 0)) if rows else 0


if __name__ == "__main__":
    sys.exit(tb.run_cases(StageHoldTest))
