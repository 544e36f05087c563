#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Peers that misbehave on the wire, scripted (wire_peer.py) against one kvproxyd.

- An ACK for a transfer that went to another peer ends nothing: it is
  counted as a bad frame of the peer that sent it, and the transfer ends when
  its own peer ACKs it.
- An ACK that comes before the transfer's END was sent (the peer claims
  bytes it cannot have had) does not end it while its frames are queued
  (their region could go with its end): it ends once END is sent.
- A second inbound link of a number that is up is refused and the live one
  stays up (it answers PINGs, the peer still shows inbound).
- A node id with a newline (a forged log line) is refused and never reaches
  the log as such.
- A peer named by a host name (resolved on a helper thread) is dialled.
- Idle connections from one address cannot take every handshake slot, and
  eight under way from one address leave room for more nodes behind it.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir. Exit status: 0 pass, 1 fail, 77 skip (with the reason).
"""

from __future__ import annotations

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


PENDING_MAX = 64  # KVP_PENDING_MAX: peer handshakes under way at once
BIG = 24 << 20  # one DATA frame (tcp.frame_max 32 MiB): framed at once, with its END


class WirePeersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = Path(tempfile.mkdtemp(prefix="kvp-wire-peers."))
        tb.log(f"temp dir {cls.tmp}")
        (port,) = tb.free_ports(1)
        cls.node = tb.Daemon(cls.tmp, "nodeA", port, None, 0, "accept_unknown_peers = true; tcp = { connections = 1; frame_max = 33554432; };",
                             "peer_ms = 5000; connect_ms = 5000;")
        tb.STARTED.append(cls.node)
        cls.node.start()
        cls.node.wait_ready(need_peer=False)
        cls.client = kvproxy.Client(cls.node.sock)
        cls.buf = kvproxy.HostBuffer(1 << 16)
        cls.reg = cls.client.register(cls.buf)
        cls.big = kvproxy.HostBuffer(BIG)
        cls.big_reg = cls.client.register(cls.big)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.close()
        cls.buf.close()
        cls.big.close()
        tb.stop_and_clean(cls.tmp, (cls.node,))

    def peer_row(self, node_id: str) -> dict:
        rows = [p for p in self.node.admin_call("stats")["peers"] if p.get("node_id") == node_id]
        return rows[0] if rows else {}

    def test_ack_from_another_peer(self) -> None:
        p, q = wp.FakeNode("fakeP", ack=True), wp.FakeNode("fakeQ", ack=False)
        self.addCleanup(p.close)
        self.addCleanup(q.close)
        to_p, to_q = self.client.peer(f"127.0.0.1:{p.port}"), self.client.peer(f"127.0.0.1:{q.port}")
        self.client.submit(to_p, [(self.reg.key, 0, 0x1234, 0, 4096)], 1, timeout=10)
        self.assertEqual(tb.wait_for(self.client, tb.done_of(1), 15).status_name, "ok")
        self.client.submit(to_q, [(self.reg.key, 0, 0x5678, 0, 4096)], 2, timeout=10)
        tag = q.wait_end(1)
        self.assertIsNotNone(tag, "fakeQ saw no END")
        before = self.peer_row("fakeP").get("bad_frames", 0)
        p.ack_on_every_link(tag)  # fakeP claims fakeQ's transfer
        deadline = time.monotonic() + 10
        while self.peer_row("fakeP").get("bad_frames", 0) == before:
            self.assertLess(time.monotonic(), deadline, "fakeP's ACK for fakeQ's tag was not refused")
            time.sleep(tb.POLL)
        early = [c for c in self.client.poll() if c.user_id == 2]
        self.assertEqual(early, [], "an ACK from fakeP ended a transfer sent to fakeQ")
        q.ack_on_every_link(tag)
        self.assertEqual(tb.wait_for(self.client, tb.done_of(2), 15).status_name, "ok")

    def test_ack_before_end(self) -> None:
        # A small receive buffer: the kernel takes part of the DATA frame, END waits behind it.
        node = wp.FakeNode("fakeE", ack=False, early_ack=True, rcvbuf=64 << 10)
        self.addCleanup(node.close)
        to = self.client.peer(f"127.0.0.1:{node.port}")
        self.client.submit(to, [(self.big_reg.key, 0, 0x9abc, 0, BIG)], 3, timeout=30)
        self.assertIsNotNone(node.wait_early_ack(), "fakeE saw no DATA")
        # fakeE reads nothing more: the END cannot have left, so nothing may end the transfer.
        early = [c for c in self.client.wait(timeout=0.5) if c.user_id == 3]
        self.assertEqual(early, [], "an ACK ended a transfer whose frames were still queued")
        node.resume()
        self.assertEqual(tb.wait_for(self.client, tb.done_of(3), 30).status_name, "ok")
        self.assertIsNotNone(node.wait_end(1), "the transfer ended before its END was sent")

    def test_peer_by_host_name(self) -> None:
        """A name (not an address) is resolved on a helper thread; the dial then goes on."""
        node = wp.FakeNode("fakeH", ack=True)
        self.addCleanup(node.close)
        self.client.submit(self.client.peer(f"localhost:{node.port}"), [(self.reg.key, 0, 0x9abc, 0, 4096)], 3,
                           timeout=10)
        self.assertEqual(tb.wait_for(self.client, tb.done_of(3), 15).status_name, "ok")
        self.assertIsNotNone(node.wait_end(1), "fakeH saw no END")

    def test_duplicate_inbound_link(self) -> None:
        live = wp.dial(self.node.port, b"inbound1")
        self.addCleanup(live.close)
        deadline = time.monotonic() + 10
        while not self.peer_row("inbound1"):
            self.assertLess(time.monotonic(), deadline, "inbound1 never joined")
            time.sleep(tb.POLL)
        dup = wp.dial(self.node.port, b"inbound1")  # handshaken, then refused by the worker
        self.addCleanup(dup.close)
        with self.assertRaises(EOFError):
            wp.read_frame(dup)  # closed without a frame
        live.sendall(wp.frame(wp.PING, 0, 77))
        (_, _, ftype, _, tag, *_), _ = wp.read_frame(live)
        self.assertEqual((ftype, tag), (wp.PONG, 77), "the live link stopped answering")
        peers = {p["node_id"]: p for p in self.node.admin_call("peers")["peers"]}
        self.assertTrue(peers["inbound1"]["inbound_up"], "the refused duplicate took the live link's state down")

    def test_idle_handshakes_from_one_address(self) -> None:
        """As many connections from one address as there are handshake slots (64), none
        saying HELLO, hold at most a quarter of them: a node dialling from another address
        gets in."""
        self.dial_past_idle(PENDING_MAX, "127.0.0.1", b"inbound2", "127.0.0.2")

    def test_many_nodes_behind_one_address(self) -> None:
        """Eight handshakes under way from one address (eight sidecars of one host dialling
        at once after a restart) leave room for a ninth node there."""
        self.dial_past_idle(8, "127.0.0.3", b"inbound3", "127.0.0.3")

    def dial_past_idle(self, count: int, idle_from: str, node_id: bytes, dial_from: str) -> None:
        """@p count connections from @p idle_from that never say HELLO, then a node's
        handshake from @p dial_from (raises if it is refused)."""
        idle = [socket.create_connection(("127.0.0.1", self.node.port), source_address=(idle_from, 0))
                for _ in range(count)]
        try:
            wp.dial(self.node.port, node_id, source=dial_from).close()
        finally:
            for s in idle:
                s.close()

    def test_node_id_with_newline(self) -> None:
        forged = b"x\nFORGED: peer decode0 ok"
        with self.assertRaises(ConnectionRefusedError):
            wp.dial(self.node.port, forged)
        self.node.admin_call("status")  # the refusal was logged before this answer
        text = self.node.logfile.read_text(errors="replace")
        self.assertNotIn("\nFORGED:", text, "a peer's node id wrote a line of its own into the log")
        self.assertIn("'(malformed node id)' refused", text)
        # Unknown peers without a secret on loopback: said at start.
        self.assertIn("accept_unknown_peers without auth.secret: any local process", text)


if __name__ == "__main__":
    sys.exit(tb.run_cases(WirePeersTest))
