"""A benchmark script (not a package module) imported for its tests, under a name of its own."""

from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def script_module(path: Path, name: str):
    """The script at `path` imported as module `name`, registered in sys.modules while in use
    (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
