#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/check-layers on small fixture trees: a clean tree passes, an include cycle is found
(with a path through it), a layer violation and a direct engine call are found, an interface
header and its static inline wrappers are allowed. Standard library only."""

import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "check-layers")


def make_tree(files):
    root = tempfile.mkdtemp(prefix="check-layers-")
    os.mkdir(os.path.join(root, "sidecar"))
    for name, text in files.items():
        with open(os.path.join(root, "sidecar", name), "w") as f:
            f.write(text)
    return root


def run(root, *extra):
    p = subprocess.run([sys.executable, SCRIPT, "--root", root, *extra], capture_output=True,
                       text=True)
    return p.returncode, p.stdout + p.stderr


# engine > backends > base, without a cycle or a violation.
CLEAN = {
    "engine.h": '#include "status.h"\nint sc_engine_create(void);\n',
    "engine.c": '#include "engine.h"\n#include "backend.h"\n'
                "int sc_engine_create(void) { return sc_backend_go(0); }\n",
    "backend.h": '#include "status.h"\nint sc_backend_go(int x);\n',
    "backend.c": '#include "backend.h"\n#include "log.h"\n'
                 "/* sc_engine_create() in a comment is no call */\n"
                 'int sc_backend_go(int x) { log_it("sc_engine_id(x)"); return x; }\n',
    "status.h": "enum sc_status { SC_OK };\n",
    "log.h": "void log_it(const char *s);\n",
    "log.c": '#include "log.h"\nvoid log_it(const char *s) { (void)s; }\n',
}


class CheckLayers(unittest.TestCase):
    def test_help(self):
        rc, out = run(make_tree(CLEAN), "--help")
        self.assertEqual(rc, 0, out)
        self.assertIn("--quiet", out)
        self.assertIn("Layers, highest first", out)

    def test_clean_tree_passes(self):
        rc, out = run(make_tree(CLEAN))
        self.assertEqual(rc, 0, out)
        self.assertIn("check-layers: clean", out)

    def test_cycle_found_with_path(self):
        files = dict(CLEAN)
        files["log.h"] = '#include "timer.h"\nvoid log_it(const char *s);\n'
        files["timer.h"] = "void timer_go(void);\n"
        files["timer.c"] = '#include "timer.h"\n#include "log.h"\nvoid timer_go(void) {}\n'
        rc, out = run(make_tree(files))
        self.assertEqual(rc, 1, out)
        self.assertIn("cycle: log -> timer -> log  (2 nodes: log timer)", out)

    def test_x_c_with_x_h_is_one_node(self):
        # backend.c includes engine.h and engine.c includes backend.h: one cycle of two nodes,
        # and a layer violation.
        files = dict(CLEAN)
        files["backend.c"] = '#include "backend.h"\n#include "engine.h"\n' \
                             "int sc_backend_go(int x) { return x; }\n"
        rc, out = run(make_tree(files))
        self.assertEqual(rc, 1, out)
        self.assertIn("cycle: backend -> engine -> backend", out)
        self.assertIn('layer: sidecar/backend/backend.c:2 (backends) includes "engine.h" (engine)', out)

    def test_layer_violation_without_cycle(self):
        files = dict(CLEAN)
        files["timer.c"] = '#include "backend.h"\nvoid timer_go(void) {}\n'
        rc, out = run(make_tree(files))
        self.assertEqual(rc, 1, out)
        self.assertIn('layer: sidecar/base/timer.c:1 (base) includes "backend.h" (backends)', out)
        self.assertNotIn("cycle:", out)

    def test_direct_engine_call_found(self):
        files = dict(CLEAN)
        files["backend.c"] = '#include "backend.h"\nint sc_engine_id(void);\n' \
                             "int sc_backend_go(int x) {\n\treturn sc_engine_id() + x;\n}\n"
        rc, out = run(make_tree(files))
        self.assertEqual(rc, 1, out)
        self.assertIn("call: sidecar/backend/backend.c:4 (backends) calls sc_engine_id() of the engine "
                      "layer", out)
        self.assertNotIn("backend.c:2", out)  # a declaration is no call

    def test_interface_header_and_wrappers_allowed(self):
        files = dict(CLEAN)
        files["passive.h"] = ("struct sc_passive_ops { int (*open)(void *ctx); };\n"
                              "struct sc_passive { const struct sc_passive_ops *ops; void *ctx; };\n"
                              "static inline int sc_passive_open(const struct sc_passive *p)\n"
                              "{\n\treturn p->ops->open(p->ctx);\n}\n")
        files["backend.c"] = '#include "backend.h"\n#include "passive.h"\n' \
                             "int sc_backend_go(int x) { return sc_passive_open(0) + x; }\n"
        rc, out = run(make_tree(files))
        self.assertEqual(rc, 0, out)

    def test_engine_header_below_engine_found(self):
        # passive.h declaring functions implemented by the engine is the engine's header.
        files = dict(CLEAN)
        files["passive.h"] = "int sc_passive_open(void *op);\n"
        files["backend.c"] = '#include "backend.h"\n#include "passive.h"\n' \
                             "int sc_backend_go(int x) { return sc_passive_open(0) + x; }\n"
        rc, out = run(make_tree(files))
        self.assertEqual(rc, 1, out)
        self.assertIn('layer: sidecar/backend/backend.c:2 (backends) includes "passive.h" (engine)', out)
        self.assertIn("calls sc_passive_open()", out)

    def test_unlisted_file_and_quiet(self):
        files = dict(CLEAN)
        files["mystery.c"] = "int x;\n"
        root = make_tree(files)
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("unlisted: sidecar/mystery.c", out)
        rc, out = run(root, "--quiet")
        self.assertEqual((rc, out), (1, ""))


if __name__ == "__main__":
    unittest.main(verbosity=2)
