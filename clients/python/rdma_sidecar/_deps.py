# SPDX-License-Identifier: Apache-2.0
"""The runtime versions the package needs, checked when it is imported (before anything imports
grpc.aio or the generated modules), so an environment with an older grpcio or protobuf (a conda or
pip-torch environment pins its own) fails at once with a message saying what to install, not later
with an AttributeError from inside grpc or the generated code. The range is the one in
pyproject.toml's dependencies (SUPPORTED below; keep the two equal)."""
import re as _re

# (package, import name, lowest supported, first unsupported): pyproject.toml says the same.
SUPPORTED = (("grpcio", "grpc", (1, 51), (2,)),
             ("protobuf", "google.protobuf", (3, 20), (7,)))


def _version_tuple(text):
    return tuple(int(x) for x in _re.findall(r"\d+", text)[:3])


def _fmt(v):
    return ".".join(str(x) for x in v)


def check_versions(found=None):
    """Raises ImportError naming the package, the version found and the range supported when a
    runtime dependency is outside it. found: {package: version text} (default: the imported ones)."""
    import importlib
    bad = []
    for name, module, low, high in SUPPORTED:
        if found is not None:
            text = found.get(name)
        else:
            try:
                text = getattr(importlib.import_module(module), "__version__", None)
            except ImportError:
                text = None
        if text is None:
            bad.append("%s is not installed" % name)
            continue
        v = _version_tuple(text)
        if not (low <= v < high):
            bad.append("%s %s is installed" % (name, text))
    if bad:
        raise ImportError("rdma_sidecar needs %s; %s. Install a supported version, e.g. "
                          "pip install %s (or python3-grpcio and python3-protobuf on Debian bookworm)"
                          % (" and ".join("%s>=%s,<%s" % (n, _fmt(lo), _fmt(hi)) for n, _, lo, hi in SUPPORTED),
                             "; ".join(bad),
                             " ".join("'%s>=%s,<%s'" % (n, _fmt(lo), _fmt(hi)) for n, _, lo, hi in SUPPORTED)))
