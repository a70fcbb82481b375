"""The repository's instruments (``scripts/lab/``) and build steps (``scripts/build/``),
imported by the tests that keep them working.

They are programs run from the repository, not modules of the package: each
imports its siblings by their plain names, so their folder goes on the path.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
LAB = ROOT / "scripts" / "lab"
BUILD = ROOT / "scripts" / "build"


def _module(folder: Path, name: str) -> ModuleType:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return importlib.import_module(name)


def instrument(name: str) -> ModuleType:
    """``scripts/lab/<name>.py`` as a module (e.g. ``instrument("pingpong")``)."""
    return _module(LAB, name)


def build_step(name: str) -> ModuleType:
    """``scripts/build/<name>.py`` as a module (e.g. ``build_step("pgo_train")``)."""
    return _module(BUILD, name)
