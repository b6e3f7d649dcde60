#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ctest docs.site: `mkdocs build --strict` of the documentation site, into the build directory.

Broken links, pages missing from the navigation's files, and bad configuration fail the build.
Writes the site to SITE_DIR (argument 1, under the build directory), never into the source tree:
the tree's `git status` must be the same before and after. Exit 77 (skipped) without mkdocs
(Debian: mkdocs, mkdocs-material; scripts/install-deps.sh installs them).
"""
import os
import shutil
import subprocess
import sys

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def status():
    r = subprocess.run(["git", "-C", SRC, "status", "--porcelain", "--ignored", "--", "docs", "mkdocs.yml"],
                       capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def main():
    site = os.path.abspath(sys.argv[1])
    mkdocs = shutil.which("mkdocs")
    if not mkdocs:
        print("mkdocs is not installed (Debian: mkdocs mkdocs-material): the site is not built")
        return 77
    before = status()
    shutil.rmtree(site, ignore_errors=True)
    r = subprocess.run([mkdocs, "build", "--strict", "--config-file", os.path.join(SRC, "mkdocs.yml"),
                        "--site-dir", site], capture_output=True, text=True, timeout=300, cwd=SRC)
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        print("mkdocs build --strict failed (above): fix the page or mkdocs.yml; build it by hand with\n"
              "  mkdocs build --strict -d build/site")
        return 1
    for page in ("index.html", "reference/flags.html", "reference/rpc.html", "howto/python.html"):
        if not os.path.exists(os.path.join(site, page)):
            print("the site has no %s" % page)
            return 1
    after = status()
    if before != after:
        print("mkdocs wrote into the source tree:\nbefore:\n%s\nafter:\n%s" % (before, after))
        return 1
    print("site built strictly into %s" % site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
