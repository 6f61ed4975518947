"""Load a script of ``launch/`` (not a package) as a module, for tests of its functions."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str) -> ModuleType:
    """The module in ``REPO / relpath``, executed once under ``name`` (not put on sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, REPO / relpath)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
