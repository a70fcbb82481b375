"""Where the repository's files are, for tests in any folder of tests/.

Tests live one or two folders deep (a mirror of the package), so counting parents
of ``__file__`` breaks whenever a test moves; these paths do not.
"""

from __future__ import annotations

from pathlib import Path

# The clone's root: the nearest folder above this file that holds pyproject.toml.
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
TESTS = ROOT / "tests"
DATA = TESTS / "data"
DOCS = ROOT / "docs"
