#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ctest docs.man: the man pages rdma-sidecar(8) and rdma-sidecar-ctl(1) that the build made with
help2man (build/man) are installed by `cmake --install` (share/man/man8, man1), render with man(1),
and name every flag of `rdma-sidecar --help`. Exit 77 (skipped) when the build had no help2man.

  check_man.py BUILD_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def main():
    build = os.path.abspath(sys.argv[1])
    if not os.path.exists(os.path.join(build, "man", "rdma-sidecar.8")):
        print("no build/man/rdma-sidecar.8: the build found no help2man (Debian: help2man), so the man "
              "pages were skipped")
        return 77
    with tempfile.TemporaryDirectory(prefix="sc-man-") as prefix:
        r = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            print("cmake --install failed:\n" + r.stdout + r.stderr)
            return 1
        pages = {"rdma-sidecar": os.path.join(prefix, "share", "man", "man8", "rdma-sidecar.8"),
                 "rdma-sidecar-ctl": os.path.join(prefix, "share", "man", "man1", "rdma-sidecar-ctl.1")}
        for name, path in pages.items():
            if not os.path.exists(path):
                print("cmake --install put no %s" % path)
                return 1
        text = open(pages["rdma-sidecar"]).read()
        help_ = subprocess.run([os.path.join(build, "rdma-sidecar"), "--help"], capture_output=True,
                               text=True, timeout=30).stdout
        flags = set(re.findall(r"^  (?:-\w, )?(--[a-z0-9-]+)", help_, re.M))
        # groff escapes '-' as '\-' in the page source
        missing = sorted(f for f in flags if f.replace("-", "\\-") not in text and f not in text)
        if len(flags) < 40 or missing:
            print("rdma-sidecar.8 lacks %s (of %d flags)" % (missing, len(flags)))
            return 1
        if shutil.which("man"):
            env = dict(os.environ, MANPATH=os.path.join(prefix, "share", "man"), MANPAGER="cat",
                       PAGER="cat", MANWIDTH="100")
            for name, section in (("rdma-sidecar", "8"), ("rdma-sidecar-ctl", "1")):
                r = subprocess.run(["man", section, name], capture_output=True, text=True, env=env,
                                   timeout=60)
                if r.returncode != 0 or name.upper() not in r.stdout:
                    print("man %s %s failed (%d): %s" % (section, name, r.returncode, r.stderr))
                    return 1
            print("man rdma-sidecar and man rdma-sidecar-ctl render from the installed pages")
        print("installed share/man/man8/rdma-sidecar.8 (all %d flags) and share/man/man1/rdma-sidecar-ctl.1"
              % len(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
