# SPDX-License-Identifier: Apache-2.0
"""STAND-IN for Ray in tests (see ../README.md): not Ray. ray.get returns its argument."""


def get(x, timeout=None):
    return x


class StandInActor:
    """An actor handle whose __ray_call__.remote(fn) runs fn(None) here (Ray runs it in the actor)."""

    class _Call:
        @staticmethod
        def remote(fn, *args):
            return fn(None, *args)

    __ray_call__ = _Call()
