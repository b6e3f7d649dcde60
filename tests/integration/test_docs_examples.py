# SPDX-License-Identifier: Apache-2.0
"""The documentation's runnable examples, run against real sidecars and a real nats-server.

A code block in README.md or docs/**/*.md is runnable when the line before its opening fence (blank
lines allowed between) is one of

    <!-- run: python -->    Debian's /usr/bin/python3, with the rdma_sidecar package importable
    <!-- run: c -->         compiled with cc -std=c11 -Wall -Werror against the built
                            librdma-sidecar-client (include/, build/client), then run
    <!-- run: sh -->        bash -euo pipefail, with rdma-sidecar-ctl and /usr/bin/python3 on PATH

When the fence right after it (blank lines allowed between) opens a ```text block, that block is the
sample's expected standard output: line by line, where `...` inside a line matches any text. Every
sample runs in a fresh directory with two sidecars (stage-a, stage-b) that share a key file and a
nats-server, and this environment:

    A, B               the sidecars' addresses (unix:/...); RDMA_SIDECAR_ADDR=$A
    NATS               the nats-server's URL
    METADATA, OPID     a fresh readable on A: 1 MiB, byte i is i % 251; its rsm1. text and id

A sample that exits non-zero, or prints other output than its page shows, fails this test (one test
method per sample, named after its page and position). Pages without any marker are not touched.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from harness import SLOW, SidecarTest, desc, main, pb

SRC = os.environ.get("SC_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.dirname(os.path.abspath(os.environ.get("SC_BINARY", os.path.join(SRC, "build", "rdma-sidecar"))))
CLIENT_DIR = os.path.join(BUILD, "client")
STUBS = os.path.abspath(os.environ.get("SC_PYTHON_STUBS", os.path.join(BUILD, "python")))
MARKER = re.compile(r"^<!--\s*run:\s*(python|c|sh)\s*-->\s*$")
FENCE = re.compile(r"^(```+)\s*([\w+-]*)")
PATTERN_SIZE = 1 << 20


def pages():
    files = [os.path.join(SRC, "README.md")]
    files += sorted(glob.glob(os.path.join(SRC, "docs", "**", "*.md"), recursive=True))
    return [f for f in files if os.path.exists(f)]


def extract(text, where):
    """[(lang, code, expected output or None, line)] of the runnable blocks of one page."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        if not m:
            i += 1
            continue
        lang, at = m.group(1), i + 1
        i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
        f = FENCE.match(lines[i]) if i < len(lines) else None
        if not f:
            raise AssertionError("%s:%d: <!-- run: %s --> is not followed by a code block" % (where, at, lang))
        code, i = fenced(lines, i, where)
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        expected = None
        f = FENCE.match(lines[j]) if j < len(lines) else None
        if f and f.group(2) == "text":
            expected, i = fenced(lines, j, where)
        out.append((lang, code, expected, at))
    return out


def fenced(lines, i, where):
    """The body of the fence opening at line i, and the index after its closing fence."""
    fence = FENCE.match(lines[i]).group(1)
    body = []
    i += 1
    while i < len(lines) and not lines[i].startswith(fence):
        body.append(lines[i])
        i += 1
    if i >= len(lines):
        raise AssertionError("%s:%d: unclosed code block" % (where, i))
    return "\n".join(body) + "\n", i + 1


def output_matches(expected, actual):
    """None when `actual` matches `expected` line by line (`...` = any text), else why not."""
    exp = expected.rstrip("\n").split("\n")
    act = actual.rstrip("\n").split("\n") if actual.strip() else []
    if len(exp) != len(act):
        return "expected %d lines, got %d" % (len(exp), len(act))
    for n, (e, a) in enumerate(zip(exp, act), 1):
        rx = ".*".join(re.escape(part) for part in e.rstrip().split("..."))
        if not re.fullmatch(rx, a.rstrip()):
            return "line %d: expected %r, got %r" % (n, e, a)
    return None


def compile_flags():
    flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(SRC, "include"),
             "-L", CLIENT_DIR, "-Wl,-rpath," + CLIENT_DIR, "-lrdma-sidecar-client"]
    cache = os.path.join(BUILD, "CMakeCache.txt")
    with open(cache) if os.path.exists(cache) else open(os.devnull) as f:
        sanitize = "SANITIZE:BOOL=ON" in f.read()
    if sanitize:
        flags.append("-fsanitize=address,undefined")  # the library needs the runtime in the program
    return flags


class SelfTest(unittest.TestCase):
    """The extractor and the output rule, on text of its own (a broken rule would pass every page)."""

    def test_extract_and_match(self):
        page = ("x\n<!-- run: sh -->\n\n```sh\necho hi\n```\n\n```text\nh...\n```\n"
                "```sh\nnot run\n```\n<!-- run: python -->\n```python\nprint(1)\n```\n")
        got = extract(page, "page")
        self.assertEqual(got, [("sh", "echo hi\n", "h...\n", 2), ("python", "print(1)\n", None, 14)])
        self.assertIsNone(output_matches("h...\n", "hi\n"))
        self.assertIsNotNone(output_matches("h...\n", "no\n"))
        self.assertIsNotNone(output_matches("a\nb\n", "a\n"))
        with self.assertRaises(AssertionError):
            extract("<!-- run: c -->\ntext\n", "page")

    def test_every_kind_is_covered(self):
        kinds = set()
        for f in pages():
            with open(f) as fh:
                kinds |= {lang for lang, _, _, _ in extract(fh.read(), f)}
        self.assertEqual(kinds, {"python", "c", "sh"}, "the docs must keep a runnable sample of each kind")


class DocsExamples(SidecarTest):
    """One test method per runnable sample (added below)."""

    def run_sample(self, page, lang, code, expected, line):
        where = "%s:%d" % (os.path.relpath(page, SRC), line)
        nats = self.nats()
        keys = self.key_file()
        a = self.sidecar("stage-a", key_file=keys, nats_url=nats.url)
        b = self.sidecar("stage-b", key_file=keys, nats_url=nats.url)
        region = a.create_region(PATTERN_SIZE, name="docs-sample")
        pattern = bytes(i % 251 for i in range(PATTERN_SIZE))
        a.fill(region, 0, pattern)
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(region, 0, PATTERN_SIZE)],
                                                            timeout_ms=120000), timeout=10)
        work = tempfile.mkdtemp(prefix="sample-", dir=self.workdir)
        env = dict(os.environ,
                   A="unix:" + a.sock, B="unix:" + b.sock, RDMA_SIDECAR_ADDR="unix:" + a.sock,
                   NATS=nats.url, METADATA=ro.metadata, OPID=ro.operation_id,
                   PATH=os.pathsep.join([CLIENT_DIR, BUILD, "/usr/bin", "/bin", os.environ.get("PATH", "")]),
                   PYTHONPATH=os.pathsep.join([os.path.join(SRC, "clients", "python"), STUBS]))
        env.pop("PYTHONHOME", None)
        if lang == "python":
            path = os.path.join(work, "sample.py")
            cmd = ["/usr/bin/python3", path]
        elif lang == "sh":
            path = os.path.join(work, "sample.sh")
            cmd = ["bash", "-euo", "pipefail", path]
        else:
            path = os.path.join(work, "sample.c")
            exe = os.path.join(work, "sample")
            cc = shutil.which("cc")
            if not cc:
                self.skipTest("no C compiler")
            with open(path, "w") as f:
                f.write(code)
            r = subprocess.run([cc, "-o", exe, path] + compile_flags(), capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, "%s: the C sample does not compile:\n%s" % (where, r.stderr))
            cmd = [exe]
        if lang != "c":
            with open(path, "w") as f:
                f.write(code)
        r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=120 * SLOW)
        print("%s (%s): exit %d\n%s" % (where, lang, r.returncode, r.stdout), end="")
        self.assertEqual(r.returncode, 0, "%s: the %s sample failed (exit %d):\nstdout:\n%s\nstderr:\n%s"
                         % (where, lang, r.returncode, r.stdout, r.stderr))
        if expected is not None:
            why = output_matches(expected, r.stdout)
            self.assertIsNone(why, "%s: the output differs from the page's (%s):\n--- page\n%s--- got\n%s"
                              % (where, why, expected, r.stdout))


def add_tests():
    for page in pages():
        rel = os.path.relpath(page, SRC)
        with open(page) as f:
            samples = extract(f.read(), rel)
        for n, (lang, code, expected, line) in enumerate(samples, 1):
            name = "test_%s_%d_%s" % (re.sub(r"\W+", "_", rel[:-3]).strip("_"), n, lang)

            def t(self, page=page, lang=lang, code=code, expected=expected, line=line):
                self.run_sample(page, lang, code, expected, line)
            setattr(DocsExamples, name, t)


add_tests()

if __name__ == "__main__":
    if not os.path.exists(os.path.join(SRC, "docs")):
        print("no docs/ beside the tests", file=sys.stderr)
        sys.exit(77)
    main()
