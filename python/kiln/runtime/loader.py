"""Loading a compiled module (a Python extension) from a file, under the name it was built with."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType


def import_library(name: str, path: Path) -> ModuleType:
    """The extension module `name` (its PyInit_<name>) from the library at `path`."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    mspec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if mspec is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(mspec)
    loader.exec_module(module)
    return module
