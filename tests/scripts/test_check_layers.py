#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/check-layers on small fixture trees laid out as sidecar/<folder>/x.c: a clean tree
passes; an include cycle is found (with a path through it); an include that climbs, one between
siblings, an engine header below the engine and a direct engine call are found; an interface
header and its static inline wrappers are allowed; a file directly in sidecar/ and an unlisted
folder are found; and, with --build over objects made by `cc -c` in a CMake-like build tree, a
call loop is found with the symbols of each edge, as is a call that climbs. Standard library
only."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "check-layers")
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
NM = shutil.which("nm")


TEMPS = []


def temp_dir():
    d = tempfile.mkdtemp(prefix="check-layers-")
    TEMPS.append(d)
    return d


def make_tree(files):
    root = temp_dir()
    for name, text in files.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


def run(root, *extra):
    p = subprocess.run([sys.executable, SCRIPT, "--root", root, *extra], capture_output=True,
                       text=True)
    return p.returncode, p.stdout + p.stderr


# engine/ > backend/ > base/, without a cycle or a violation; main.c on top.
CLEAN = {
    "sidecar/main.c": '#include "engine/engine.h"\nint main(void) { return sc_engine_create(); }\n',
    "sidecar/engine/engine.h": '#include "base/status.h"\nint sc_engine_create(void);\n',
    "sidecar/engine/engine.c": '#include "engine/engine.h"\n#include "backend/backend.h"\n'
                               "int sc_engine_create(void) { return sc_backend_go(0); }\n",
    "sidecar/backend/backend.h": '#include "base/status.h"\nint sc_backend_go(int x);\n',
    "sidecar/backend/backend.c": '#include "backend/backend.h"\n#include "base/log.h"\n'
                                 "/* sc_engine_create() in a comment is no call */\n"
                                 'int sc_backend_go(int x) { log_it("sc_engine_id(x)"); '
                                 "return x; }\n",
    "sidecar/base/status.h": "#ifndef STATUS_H\n#define STATUS_H\nenum sc_status { SC_OK };\n"
                             "#endif\n",
    "sidecar/base/log.h": "void log_it(const char *s);\n",
    "sidecar/base/log.c": '#include "base/log.h"\nvoid log_it(const char *s) { (void)s; }\n',
}


def with_files(extra):
    files = dict(CLEAN)
    files.update(extra)
    return make_tree(files)


class Sources(unittest.TestCase):
    def test_help(self):
        rc, out = run(make_tree(CLEAN), "--help")
        self.assertEqual(rc, 0, out)
        for text in ("--quiet", "--build", "highest first",
                     "main.c > fast > engine > tcp | ib | ofi > peer > backend > "
                     "gpu | nats | meta > net > os > conf > base"):
            self.assertIn(text, out)

    def test_usage_error(self):
        rc, out = run(temp_dir())
        self.assertEqual(rc, 2, out)
        self.assertIn("no sidecar/ directory", out)
        rc, out = run(make_tree(CLEAN), "--build", "/nonexistent/build")
        self.assertEqual(rc, 2, out)
        self.assertIn("is no directory", out)

    def test_clean_tree_passes_and_says_calls_were_skipped(self):
        rc, out = run(make_tree(CLEAN))
        self.assertEqual(rc, 0, out)
        self.assertIn("check-layers: clean", out)
        self.assertIn("call check skipped: no --build DIR given", out)

    def test_cycle_found_with_path(self):
        root = with_files({
            "sidecar/base/log.h": '#include "base/timer.h"\nvoid log_it(const char *s);\n',
            "sidecar/base/timer.h": "void timer_go(void);\n",
            "sidecar/base/timer.c": '#include "base/timer.h"\n#include "base/log.h"\n'
                                    "void timer_go(void) {}\n",
        })
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("cycle: base/log -> base/timer -> base/log  (2 nodes: base/log base/timer)",
                      out)

    def test_folder_internal_h_makes_no_cycle(self):
        # gpu/internal.h needs gpu/gpu.h's types and every gpu/*.c includes it: no cycle.
        root = with_files({
            "sidecar/gpu/gpu.h": "struct sc_gpu;\nint sc_gpu_open(struct sc_gpu **g);\n",
            "sidecar/gpu/internal.h": '#include "gpu/gpu.h"\nvoid gpu_fail(struct sc_gpu *g);\n',
            "sidecar/gpu/gpu.c": '#include "gpu/internal.h"\n'
                                 "int sc_gpu_open(struct sc_gpu **g) { gpu_fail(*g); return 0; }\n",
            "sidecar/gpu/stage.c": '#include "gpu/internal.h"\nvoid gpu_fail(struct sc_gpu *g) '
                                   "{ (void)g; }\n",
        })
        rc, out = run(root)
        self.assertEqual(rc, 0, out)

    def test_x_c_with_x_h_is_one_node(self):
        # backend.c includes engine.h and engine.c includes backend.h: one cycle of two nodes,
        # and an engine header below the engine.
        root = with_files({
            "sidecar/backend/backend.c": '#include "backend/backend.h"\n'
                                         '#include "engine/engine.h"\n'
                                         "int sc_backend_go(int x) { return x; }\n",
        })
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("cycle: backend/backend -> engine/engine -> backend/backend", out)
        self.assertIn('layer: sidecar/backend/backend.c:2 includes "engine/engine.h": only '
                      "main.c, fast/, engine/ and service/ may include the engine's headers", out)

    def test_include_that_climbs(self):
        root = with_files({
            "sidecar/base/timer.c": '#include "backend/backend.h"\nvoid timer_go(void) {}\n',
        })
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn('layer: sidecar/base/timer.c:1 includes "backend/backend.h": backend/ is '
                      "above base/", out)
        self.assertNotIn("cycle:", out)

    def test_include_between_siblings(self):
        root = with_files({
            "sidecar/ib/internal.h": "int ib_go(void);\n",
            "sidecar/ib/qp.c": '#include "ib/internal.h"\nint ib_go(void) { return 0; }\n',
            "sidecar/tcp/tcp.c": '#include "base/log.h"\n#include "ib/internal.h"\n'
                                 "int tcp_go(void) { return ib_go(); }\n",
        })
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn('layer: sidecar/tcp/tcp.c:2 includes "ib/internal.h": tcp/ and ib/ are '
                      "siblings", out)
        self.assertNotIn("ib/qp.c", out)  # a folder's own files may include its internal.h

    def test_downward_include_passes(self):
        root = with_files({
            "sidecar/ib/qp.c": '#include "backend/backend.h"\n#include "base/log.h"\n'
                               "int ib_go(void) { return sc_backend_go(1); }\n",
        })
        rc, out = run(root)
        self.assertEqual(rc, 0, out)

    def test_direct_engine_call_found(self):
        root = with_files({
            "sidecar/backend/backend.c": '#include "backend/backend.h"\n'
                                         "int sc_engine_id(void);\n"
                                         "int sc_backend_go(int x) {\n"
                                         "\treturn sc_engine_id() + x;\n}\n",
        })
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("call: sidecar/backend/backend.c:4 calls sc_engine_id() of engine/ "
                      "directly from backend/", out)
        self.assertNotIn("backend.c:2", out)  # a declaration is no call

    def test_interface_header_and_wrappers_allowed(self):
        root = with_files({
            "sidecar/backend/passive.h":
                "struct sc_passive_ops { int (*open)(void *ctx); };\n"
                "struct sc_passive { const struct sc_passive_ops *ops; void *ctx; };\n"
                "static inline int sc_passive_open(const struct sc_passive *p)\n"
                "{\n\treturn p->ops->open(p->ctx);\n}\n",
            "sidecar/base/log.c": '#include "base/log.h"\n#include "backend/passive.h"\n'
                                  "void log_it(const char *s) { (void)s; "
                                  "(void)sc_passive_open(0); }\n",
        })
        rc, out = run(root)
        self.assertEqual(rc, 0, out)

    def test_engine_header_declaring_functions_is_no_interface(self):
        root = with_files({
            "sidecar/engine/passive.h": "int sc_passive_open(void *op);\n",
            "sidecar/backend/backend.c": '#include "backend/backend.h"\n'
                                         '#include "engine/passive.h"\n'
                                         "int sc_backend_go(int x) "
                                         "{ return sc_passive_open(0) + x; }\n",
        })
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn('layer: sidecar/backend/backend.c:2 includes "engine/passive.h": engine/ '
                      "is above backend/", out)
        self.assertIn("calls sc_passive_open()", out)

    def test_file_directly_in_sidecar_and_quiet(self):
        root = with_files({"sidecar/mystery.c": "int x;\n"})
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("unlisted: sidecar/mystery.c sits directly in sidecar/, where only main.c "
                      "may", out)
        rc, out = run(root, "--quiet")
        self.assertEqual((rc, out), (1, ""))

    def test_unlisted_folder(self):
        root = with_files({"sidecar/shm/shm.c": "int x;\n", "sidecar/shm/shm.h": "int y;\n"})
        rc, out = run(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("unlisted: sidecar/shm/ (sidecar/shm/shm.c and the rest of the folder) is "
                      "in no layer: add the folder to the order in scripts/check-layers", out)
        self.assertEqual(out.count("unlisted:"), 1, out)


def compile_into(build, root, target, sources):
    """Compile root/<source> to build/CMakeFiles/<target>.dir/<source>.o, as CMake lays it out."""
    for src in sources:
        obj = os.path.join(build, "CMakeFiles", target + ".dir", src + ".o")
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        p = subprocess.run([CC, "-c", "-I", os.path.join(root, "sidecar"), "-o", obj,
                            os.path.join(root, src)], capture_output=True, text=True)
        if p.returncode != 0:
            raise AssertionError("%s -c %s failed:\n%s" % (CC, src, p.stderr))


@unittest.skipUnless(CC and NM, "no C compiler or nm")
class Calls(unittest.TestCase):
    def build(self, files, target_sources):
        root = with_files(files)
        build = os.path.join(root, "build")
        for target, sources in target_sources.items():
            compile_into(build, root, target, sources)
        return root, build

    def test_clean_calls_pass(self):
        root, build = self.build({}, {
            "sc_engine": ["sidecar/engine/engine.c", "sidecar/backend/backend.c",
                          "sidecar/base/log.c"],
            "rdma-sidecar": ["sidecar/main.c"]})
        rc, out = run(root, "--build", build)
        self.assertEqual(rc, 0, out)
        self.assertIn("check-layers: clean", out)
        self.assertNotIn("skipped", out)

    def test_call_loop_reported_with_its_symbols(self):
        root, build = self.build({
            "sidecar/gpu/internal.h": "int sc_gpu_fail(void);\nint sc_gpu_use(void);\n"
                                      "void sc_stager_free(void);\n",
            "sidecar/gpu/gpu.c": '#include "gpu/internal.h"\n'
                                 "int sc_gpu_fail(void) { return 1; }\n"
                                 "int sc_gpu_use(void) { sc_stager_free(); return 0; }\n",
            "sidecar/gpu/stage.c": '#include "gpu/internal.h"\n'
                                   "void sc_stager_free(void) { sc_gpu_fail(); sc_gpu_use(); }\n",
        }, {"sc_engine": ["sidecar/gpu/gpu.c", "sidecar/gpu/stage.c", "sidecar/base/log.c"]})
        rc, out = run(root, "--build", build)
        self.assertEqual(rc, 1, out)
        self.assertIn("loop: sidecar/gpu/gpu.c -> sidecar/gpu/stage.c (sc_stager_free) -> "
                      "sidecar/gpu/gpu.c (sc_gpu_fail, sc_gpu_use)", out)
        self.assertNotIn("climb:", out)

    def test_longer_loop_names_every_edge(self):
        root, build = self.build({
            "sidecar/base/a.c": "void b1(void);\nvoid a1(void) { b1(); }\n",
            "sidecar/base/b.c": "void c1(void);\nvoid b1(void) { c1(); }\n",
            "sidecar/base/c.c": "void a1(void);\nvoid b1(void);\n"
                                "void c1(void) { a1(); b1(); }\n",
        }, {"sc_engine": ["sidecar/base/a.c", "sidecar/base/b.c", "sidecar/base/c.c"]})
        rc, out = run(root, "--build", build)
        self.assertEqual(rc, 1, out)
        self.assertIn("loop: sidecar/base/a.c -> sidecar/base/b.c (b1) -> sidecar/base/c.c (c1) "
                      "-> sidecar/base/a.c (a1)", out)
        self.assertIn("sidecar/base/c.c -> sidecar/base/b.c (b1)", out)
        self.assertIn("check-layers: 1 finding(s)", out)

    def test_call_that_climbs(self):
        # base/log.c calls backend/backend.c's function (declared by hand: no include to see).
        root, build = self.build({
            "sidecar/base/log.c": "int sc_backend_go(int x);\n"
                                  "void log_it(const char *s) { (void)s; sc_backend_go(0); }\n",
        }, {"sc_engine": ["sidecar/engine/engine.c", "sidecar/backend/backend.c",
                          "sidecar/base/log.c"]})
        rc, out = run(root, "--build", build)
        self.assertEqual(rc, 1, out)
        self.assertIn("loop: sidecar/backend/backend.c -> sidecar/base/log.c (log_it) -> "
                      "sidecar/backend/backend.c (sc_backend_go)", out)
        self.assertIn("climb: sidecar/base/log.c calls sidecar/backend/backend.c "
                      "(sc_backend_go): backend/ is above base/", out)

    def test_service_objects_and_stale_objects(self):
        # service/ is above every folder but main.c; an object whose source is gone is skipped.
        root, build = self.build({
            "service/server.c": '#include "engine/engine.h"\n'
                                "int sc_service_go(void) { return sc_engine_create(); }\n",
            "sidecar/gone.c": "int gone(void) { return 0; }\n",
        }, {"sc_engine": ["sidecar/engine/engine.c", "sidecar/backend/backend.c",
                          "sidecar/base/log.c", "sidecar/gone.c"],
            "sc_service": ["service/server.c"]})
        os.remove(os.path.join(root, "sidecar", "gone.c"))
        rc, out = run(root, "--build", build)
        self.assertEqual(rc, 0, out)
        self.assertIn("note: skipped 1 object(s) whose source is gone (left by an older build): "
                      "sidecar/gone.c", out)

    def test_empty_build_is_a_usage_error(self):
        root = make_tree(CLEAN)
        rc, out = run(root, "--build", root)
        self.assertEqual(rc, 2, out)
        self.assertIn("no objects under", out)


def tearDownModule():
    for d in TEMPS:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
