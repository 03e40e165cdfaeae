"""A function run on a module right after its first import, in whichever process imports it.

The faults (sitecustomize.py, busyhang.py, illegal_access.py) patch one of SGLang's own functions
this way, so the fault runs inside real SGLang code in every process of the tree, and nothing is
imported before SGLang imports it. Several hooks on one module chain: each finder steps aside, finds
the module's spec through the ones after it, and wraps what they return.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, wrap: Callable[[ModuleType], None]) -> None:
        self._target = target
        self._wrap = wrap

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != self._target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        wrap = self._wrap

        def exec_and_wrap(module):  # type: ignore[no-untyped-def]
            exec_module(module)
            wrap(module)

        loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        return spec


def after_import(target: str, wrap: Callable[[ModuleType], None]) -> None:
    """Call `wrap(module)` once `target` (a dotted module name) has been executed."""
    sys.meta_path.insert(0, _Finder(target, wrap))
