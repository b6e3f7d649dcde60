# SPDX-License-Identifier: Apache-2.0
"""Limits from the system (issue 25): the sidecar raises its soft open-file limit to the hard one
at start, says so in the log with how many peer connections that leaves room for, and reports the
limit in GetInfo; a hard limit too low for a large cluster is a warning that says what to raise.
The limits are set on the sidecar's process alone, with prlimit(1) in front of it."""
import os
import shutil
import sys

from harness import SidecarTest, main

if not shutil.which("prlimit"):
    print("SKIP: prlimit (util-linux) is not installed")
    sys.exit(77)


class LimitsTest(SidecarTest):
    def with_nofile(self, name, soft, hard):
        old = os.environ.get("SC_WRAPPER")
        os.environ["SC_WRAPPER"] = ("prlimit --nofile=%d:%d -- " % (soft, hard)) + (old or "")
        try:
            return self.sidecar(name)
        finally:
            if old is None:
                del os.environ["SC_WRAPPER"]
            else:
                os.environ["SC_WRAPPER"] = old

    def test_soft_limit_raised_to_the_hard_one(self):
        s = self.with_nofile("raised", 512, 8192)
        self.assertEqual(s.info().open_files_limit, 8192)
        log = s.read_log()
        self.assertIn("open files: 8192, raised from 512 (room for about 7936 peer connections)", log)

    def test_a_low_hard_limit_is_a_warning_that_says_what_to_do(self):
        s = self.with_nofile("low", 600, 600)
        self.assertEqual(s.info().open_files_limit, 600)
        log = s.read_log()
        self.assertIn("WARN  [engine] open files: 600; that leaves room for about 344 peer connections: "
                      "raise the hard limit (ulimit -Hn, LimitNOFILE=) for a large cluster", log)


if __name__ == "__main__":
    main()
