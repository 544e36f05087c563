#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A client takes a registered region's memory away under the daemon (TCP).

A region must be a memfd sealed against shrinking, but no seal short of
F_SEAL_WRITE stops a hole being punched in it. In a hugetlbfs memfd whose
huge page pool is then empty, the daemon's next access to that page has
no page to fault in: SIGBUS, which killed the decode kvproxyd and every
client with it. Now a guarded copy fails only that transfer: a 4 KiB
transfer into the hole (copied from the connection's buffer) and a 1 MiB
one that runs into it (received straight into the region: the kernel's
copy says -EFAULT) end ``remote``, the link stays up, and a transfer into
the region's intact page lands byte for byte.

The sending side: the same file is a source region of the prefill node. A
send out of the hole (the kernel's send says -EFAULT for the whole gather)
cut the link, and every other transfer on it ended ``peer``. Now only that
transfer ends ``invalid`` (detail: the memory is gone), whether nothing of
its frame had gone yet (4 KiB) or its first half had (1 MiB: the rest goes
as zeros, then an ABORT), and the link goes on. KVP_FAULT_ZC=1 runs it with
``tcp.zerocopy`` on the prefill node (SENDMSG_ZC pins the pages instead).

Needs root (it reserves three 2 MiB huge pages, empties the pool and gives
them back); skipped where huge pages are reserved already (others may need
them) or the kernel cannot reserve them.

Environment: KVPROXYD, KVPROXY_LIB (meson sets both), KVP_KEEP=1 keeps the
temp dir, KVP_FAULT_ZC=1 (above). Exit status: 0 pass, 1 fail, 77 skip (with the reason).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import daemon_harness as tb  # noqa: E402  (daemon helpers)

import kvproxy  # noqa: E402

HUGE = 2 << 20
NR = Path("/proc/sys/vm/nr_hugepages")
PUNCH = 0x2 | 0x1  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def fallocate(fd: int, mode: int, off: int, length: int) -> None:
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def free_huge() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("HugePages_Free:"):
            return int(line.split()[1])
    return 0


class RegionFaultTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        if os.geteuid() != 0:
            tb.skip_all("needs root to reserve huge pages")
        old_nr = int(NR.read_text())
        if old_nr:
            tb.skip_all(f"{old_nr} huge pages are reserved here: this test empties the pool, so it runs "
                        "only where no other program has any")
        NR.write_text(str(old_nr + 3))
        cls.addClassCleanup(NR.write_text, str(old_nr))
        if free_huge() < 3:
            NR.write_text(str(old_nr))
            tb.skip_all("the kernel could not reserve three 2 MiB huge pages")
        cls.tmp = Path(tempfile.mkdtemp(prefix="kvp-region-fault."))
        tb.log(f"temp dir {cls.tmp}")
        zc = "tcp = { zerocopy = true; };" if os.environ.get("KVP_FAULT_ZC") == "1" else ""
        cls.prefill, cls.decode = tb.start_pair(cls.tmp, "prefill0", "decode0", extra=zc, extra_b="")
        cls.src = kvproxy.Client(cls.prefill.sock)
        cls.dst = kvproxy.Client(cls.decode.sock)
        cls.sbuf = kvproxy.HostBuffer(2 * HUGE)
        cls.sbuf[:] = os.urandom(2 * HUGE)
        cls.sreg = cls.src.register(cls.sbuf)
        # Two huge pages, sealed as the daemon asks, allocated now.
        cls.fd = os.memfd_create("kvp-region-fault", os.MFD_HUGETLB | os.MFD_ALLOW_SEALING)
        os.ftruncate(cls.fd, 2 * HUGE)
        fcntl.fcntl(cls.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        fallocate(cls.fd, 0, 0, 2 * HUGE)
        cls.dreg = cls.dst.register(cls.fd, 0, 2 * HUGE)
        # The same file as a source, and a plain destination for what is sent out of it.
        cls.hreg = cls.src.register(cls.fd, 0, 2 * HUGE)
        cls.dbuf = kvproxy.HostBuffer(2 * HUGE)
        cls.dbreg = cls.dst.register(cls.dbuf)
        cls.peer = cls.src.peer("decode0")
        cls.hog = -1

    @classmethod
    def tearDownClass(cls) -> None:
        for c in (cls.src, cls.dst):
            c.close()
        cls.sbuf.close()
        cls.dbuf.close()
        for fd in (cls.fd, cls.hog):
            if fd >= 0:
                os.close(fd)
        tb.stop_and_clean(cls.tmp, (cls.decode, cls.prefill))

    def send(self, uid: int, src_off: int, dst_off: int, n: int, src=None, dst=None) -> str:
        return self.send_c(uid, src_off, dst_off, n, src, dst).status_name

    def send_c(self, uid: int, src_off: int, dst_off: int, n: int, src=None, dst=None):
        """Transfer @p n bytes (default: sbuf into the hugetlbfs region); its completion."""
        src, dst = src or self.sreg, dst or self.dreg
        self.src.submit(self.peer, [(src.key, src_off, dst.key, dst_off, n)], uid, timeout=10)
        while True:
            for c in self.src.wait(timeout=1.0):
                if c.kind == "done" and c.user_id == uid:
                    return c
            for d in (self.decode, self.prefill):
                self.assertTrue(d.alive(), f"{d.node_id} died (SIGBUS?): " + d.log_tail(5))

    def conn_errors(self) -> int:
        return sum(int(p.get("conn_errors", 0)) for p in self.prefill.admin_call("stats")["peers"])

    def test_hole_in_a_hugetlbfs_region(self) -> None:
        self.assertEqual(self.send(1, 0, 0, 4096), "ok")
        # Empty the pool (fallocate says ENOSPC where a touch would raise SIGBUS), then
        # punch the region's first page and take the page that frees too.
        RegionFaultTest.hog = os.memfd_create("kvp-region-fault-hog", os.MFD_HUGETLB)
        pages = 0

        def grab() -> bool:
            nonlocal pages
            os.ftruncate(self.hog, (pages + 1) * HUGE)
            try:
                fallocate(self.hog, 0, pages * HUGE, HUGE)
            except OSError as e:
                self.assertEqual(e.errno, errno.ENOSPC)
                return False
            pages += 1
            return True

        while grab():
            pass
        fallocate(self.fd, PUNCH, HUGE, HUGE)  # the region's second page
        self.assertTrue(grab(), "punching the hole freed no huge page")
        self.assertFalse(grab())
        errors = self.conn_errors()
        self.assertEqual(self.send(2, 0, HUGE + 100, 4096), "remote", "a copy into the hole")
        # Its first bytes land in the first page (through the connection's buffer), the
        # rest is received straight into the region and runs into the hole.
        self.assertEqual(self.send(3, 0, HUGE - (512 << 10), 1 << 20), "remote",
                         "a receive straight into the hole")
        self.assertTrue(self.decode.alive())
        self.assertEqual(self.conn_errors(), errors, "the link was cut")
        # Sent out of the hole: nothing of it sent yet, then half of it sent already.
        for uid, off, n in ((5, HUGE + 100, 4096), (6, HUGE - (512 << 10), 1 << 20)):
            c = self.send_c(uid, off, 0, n, src=self.hreg, dst=self.dbreg)
            self.assertEqual(c.status_name, "invalid", f"a send of {n} bytes out of the hole")
            self.assertIn("memory is gone", c.detail)
            self.assertEqual(c.bad_seg, 0)
        self.assertTrue(self.prefill.alive())
        self.assertEqual(self.conn_errors(), errors, "a send out of the hole cut the link")
        # The page left in place still takes transfers, and still sends them.
        self.assertEqual(self.send(4, HUGE, 0, 1 << 20), "ok")
        self.assertEqual(self.send(7, 0, 0, 1 << 20, src=self.hreg, dst=self.dbreg), "ok")
        with mmap.mmap(self.fd, HUGE, offset=0) as m:
            self.assertEqual(self.dbuf[:1 << 20], m[:1 << 20], "bytes sent out of the intact page differ")
        with mmap.mmap(self.fd, HUGE, offset=0) as m:
            self.assertEqual(m[:1 << 20], self.sbuf[HUGE:HUGE + (1 << 20)], "the intact page's bytes differ")


if __name__ == "__main__":
    sys.exit(tb.run_cases(RegionFaultTest))
