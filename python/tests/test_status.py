#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The binding's transfer statuses against libkvproxy's table (no daemon needed).

The names come from the library (kvp_status_str(), kvp_invalid_str()); the
numbers are spelled in Python by kvproxy.Status, and the errno of each
failure by kvproxy._status. This test fails when either drifts from the
library it loads: a status the library names that Status lacks (or names
differently), a Status member the library does not know, a failure status
without an errno, or an sglang adapter code that shadows a status name.

Exit status: 0 pass, 1 fail, 77 when libkvproxy cannot be loaded here.
"""

from __future__ import annotations

import errno
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import kvproxy  # noqa: E402
import daemon_harness as tb  # noqa: E402  (asan_reexec: a sanitized libkvproxy needs the ASan runtime first)
from kvproxy import _status  # noqa: E402


class StatusTableTest(unittest.TestCase):
    """kvproxy.Status and the errno table follow libkvproxy's status table."""

    def test_enum_matches_library(self) -> None:
        names = _status.status_names()
        self.assertEqual(names.get(0), "ok", "status 0 is success")
        self.assertEqual(sorted(names), list(range(len(names))), "the library's statuses are 0..N-1")
        for number, name in names.items():
            with self.subTest(status=number, name=name):
                self.assertIn(number, {int(s) for s in kvproxy.Status},
                              f"libkvproxy names status {number} {name!r}; kvproxy.Status lacks it")
                member = kvproxy.Status(number)
                self.assertEqual(member.name.lower().replace("_", "-"), name,
                                 f"kvproxy.Status.{member.name} is {number}, which libkvproxy calls {name!r}")
                self.assertEqual(kvproxy.status_name(number), name)
        for member in kvproxy.Status:
            self.assertIn(int(member), names, f"kvproxy.Status.{member.name} is not a status of libkvproxy")
        for outside in (-1, len(names), len(names) + 1, 1 << 20):
            self.assertEqual(kvproxy.status_name(outside), "unknown")

    def test_every_failure_has_an_errno(self) -> None:
        names = _status.status_names()
        self.assertEqual(set(_status._ERRNO), set(names) - {0}, "an errno for every failure status, none for ok")
        for number, name in names.items():
            want = _status._ERRNO.get(number, errno.EIO)
            self.assertEqual(_status.status_errno(name), want, name)
        self.assertEqual(_status.status_errno("no-such-status"), errno.EIO)
        self.assertEqual(_status.status_errno("no-buffers"), errno.ENOBUFS)

    def test_transfer_error_carries_the_errno(self) -> None:
        for number, name in _status.status_names().items():
            if number == 0:
                continue
            c = kvproxy.Completion(kind="done", status=number, status_name=name, ok=False, user_id=7,
                                   peer=0, bytes=0, nseg=1, dst_key=0)
            with self.assertRaises(kvproxy.TransferError) as cm:
                c.raise_for_status()
            self.assertEqual(cm.exception.errno, _status._ERRNO[number], name)
            self.assertEqual(cm.exception.status_name, name)

    def test_invalid_details(self) -> None:
        self.assertEqual(_status.invalid_detail(0), "", "detail 0: nothing was wrong")
        details = []
        for d in range(1, 256):
            text = _status.invalid_detail(d)
            if text == "unknown":
                break
            details.append(text)
        self.assertGreater(len(details), 0, "libkvproxy explains invalid descriptors")
        self.assertTrue(all(details), "every detail code has words")
        self.assertEqual(len(set(details)), len(details), "no two detail codes say the same")

    def test_sglang_codes_do_not_shadow_statuses(self) -> None:
        from kvproxy.sglang import _common as kc

        names = set(_status.status_names().values())
        self.assertEqual(names & set(kc.ADAPTER_CODE_ERRNO), set(),
                         "an adapter code with a status's name would change that status's errno")
        for name in names - {"ok"}:
            self.assertEqual(kc.code_errno(name), _status.status_errno(name), name)
        self.assertEqual(kc.code_errno("daemon-gone"), errno.EPIPE)
        self.assertEqual(kc.code_errno("no-such-code"), errno.EIO)


def main() -> int:
    tb.asan_reexec()
    try:
        kvproxy._lib.load()
    except kvproxy.LibraryNotFoundError as e:
        print(f"SKIP: {e}", file=sys.stderr)
        return 77
    suite = unittest.TestLoader().loadTestsFromTestCase(StatusTableTest)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stderr).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
