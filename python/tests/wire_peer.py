# SPDX-License-Identifier: BSD-3-Clause
"""A scripted peer node on kvproxy's TCP wire (lib/core/kvp_wire.h), for tests
that need a peer to misbehave on purpose: unauthenticated handshakes only.

FakeNode listens like a kvproxyd (answers HELLO, PINGs, and ENDs with an ACK
when told to, or a transfer's first DATA frame with an ACK and a pause:
``early_ack``) and records the END tags it saw; pause() stops it reading
(its links' bytes back up into the sender), optionally vouching for the wait
as a kvproxyd waiting for a staging buffer does. dial() opens a link to a
kvproxyd as a named node would.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import List, Optional, Tuple

MAGIC, VERSION = 0x564B, 2
HELLO, DATA, END, ACK, ABORT, PING, PONG = range(1, 8)
PING_RXWAIT = 0x1  # PING aux: "your bytes wait for my staging buffer" (KVP_PING_RXWAIT)
HDR = struct.Struct("<HBBIQQQQII")  # struct kvp_wire_hdr, 48 bytes
HELLO_BODY = struct.Struct("<32s32sQIIII32s32s")  # struct kvp_wire_hello, 152 bytes
HELLO_LEN = HDR.size + HELLO_BODY.size


def frame(ftype: int, length: int = 0, tag: int = 0, key: int = 0, off: int = 0, aux: int = 0,
          aux2: int = 0) -> bytes:
    return HDR.pack(MAGIC, VERSION, ftype, length, tag, key, off, aux, aux2, 0)


def hello(node_id: bytes, to_node: bytes = b"", link: int = 0, links: int = 1, epoch: int = 1) -> bytes:
    """A HELLO (no authentication): the dialer's opens @p link of @p links."""
    flags = (link << 8) | (links << 16)
    return frame(HELLO, HELLO_BODY.size) + HELLO_BODY.pack(node_id, to_node, epoch, 256, 4 << 20, 0, flags,
                                                           b"\0" * 32, b"\0" * 32)


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(view[got:])
        if not k:
            raise EOFError(f"closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def read_frame(s: socket.socket) -> Tuple[tuple, bytes]:
    h = HDR.unpack(recv_exact(s, HDR.size))
    return h, recv_exact(s, h[3]) if h[3] else b""


def hello_status(reply: bytes) -> int:
    return HELLO_BODY.unpack_from(reply, HDR.size)[5]


def dial(port: int, node_id: bytes, link: int = 0, links: int = 1, timeout: float = 10.0,
         source: str = "127.0.0.1") -> socket.socket:
    """A link to the kvproxyd on 127.0.0.1:@p port from @p source, handshaken (raises if refused)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    s.sendall(hello(node_id, b"", link, links))
    status = hello_status(recv_exact(s, HELLO_LEN))
    if status:
        s.close()
        raise ConnectionRefusedError(f"HELLO refused with status {status}")
    return s


class FakeNode:
    """A peer node kvproxyd dials: one thread per link it opens."""

    def __init__(self, node_id: str, ack: bool = True, early_ack: bool = False,
                 rcvbuf: Optional[int] = None) -> None:
        self.node_id = node_id.encode()
        self.ack = ack
        self.early_ack = early_ack
        self.acked_early: List[int] = []  # tags acknowledged on their first DATA frame
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.links: List[socket.socket] = []
        self.ends: List[int] = []  # END tags, in arrival order
        self.reading = threading.Event()
        self.reading.set()
        self.ls = socket.socket()
        if rcvbuf:
            self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # links inherit it
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def send(self, c: socket.socket, data: bytes) -> None:
        with self.lock:
            c.sendall(data)

    def _serve(self, c: socket.socket) -> None:
        try:
            their = recv_exact(c, HELLO_LEN)
            flags = HELLO_BODY.unpack_from(their, HDR.size)[6]
            self.send(c, hello(self.node_id, b"", (flags >> 8) & 0xFF, 1))
            with self.cond:
                self.links.append(c)
            while True:
                self.reading.wait()
                _, _, ftype, length, tag, _, _, _, _, _ = HDR.unpack(recv_exact(c, HDR.size))
                if ftype == DATA and self.early_ack and tag not in self.acked_early:
                    # Claims every byte on seeing the header, then stops reading.
                    self.reading.clear()
                    self.send(c, frame(ACK, 0, tag))
                    with self.cond:
                        self.acked_early.append(tag)
                        self.cond.notify_all()
                    self.reading.wait()
                if length:
                    recv_exact(c, length)
                if ftype == PING:
                    self.send(c, frame(PONG, 0, tag))
                elif ftype == END:
                    with self.cond:
                        self.ends.append(tag)
                        self.cond.notify_all()
                    if self.ack:
                        self.send(c, frame(ACK, 0, tag))
        except (OSError, EOFError):
            pass

    def pause(self, mode: str, every: float = 0.1) -> None:
        """Stop reading every link. Meanwhile, every @p every seconds, @p mode "ping" sends
        each a plain PING, "rxwait" a PING_RXWAIT (a kvproxyd waiting for a staging buffer);
        "silent" sends nothing."""
        self.reading.clear()
        if mode != "silent":
            aux = PING_RXWAIT if mode == "rxwait" else 0
            threading.Thread(target=self._ping, args=(every, aux), daemon=True).start()

    def _ping(self, every: float, aux: int) -> None:
        while not self.reading.wait(every):
            with self.cond:
                links = list(self.links)
            for c in links:
                try:
                    self.send(c, frame(PING, aux=aux))
                except OSError:
                    pass

    def resume(self) -> None:
        self.reading.set()

    def wait_end(self, count: int, timeout: float = 10.0) -> Optional[int]:
        """The tag of the @p count-th END seen, once it came (None after @p timeout)."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.ends) >= count, timeout)
            return self.ends[count - 1] if len(self.ends) >= count else None

    def wait_early_ack(self, timeout: float = 10.0) -> Optional[int]:
        """The tag of the first transfer acknowledged early, once it was (None after @p timeout)."""
        with self.cond:
            self.cond.wait_for(lambda: self.acked_early, timeout)
            return self.acked_early[0] if self.acked_early else None

    def ack_on_every_link(self, tag: int, status: int = 0) -> None:
        with self.cond:
            links = list(self.links)
        for c in links:
            self.send(c, frame(ACK, 0, tag, aux=status))

    def close(self) -> None:
        self.reading.set()
        self.ls.close()
        with self.cond:
            for c in self.links:
                c.close()
