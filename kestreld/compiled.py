"""Which implementation runs: the hot path compiled by Cython, or the same files as Python.

The modules in :data:`MODULES` are plain Python; when a C compiler is present
at install time, ``setup.py`` also compiles each of them with Cython, using
the ``.pxd`` file beside it (typed ``cdef`` classes and locals; aiohttp's
pattern: one source, two implementations).  Python's import system prefers
the compiled module when both are there.  ``KESTRELD_NO_EXTENSIONS=1`` puts a
finder in front that loads the ``.py`` files instead, so both implementations
can be run (and tested) from one install.  In a source checkout, an
extension older than its ``.py`` or ``.pxd`` is skipped (the edit runs, as Python), and
then every one is: the compiled modules call each other's C functions.

This file is read by ``setup.py`` as well: it must import nothing but the
standard library.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import Any

#: The modules compiled when a compiler is present, chosen by profiles of the request path.
MODULES: tuple[str, ...] = (
    "kestreld.journal.clock",
    "kestreld.queues.item",
    "kestreld.queues.blocking",
    "kestreld.journal.codec",
    "kestreld.journal.fileio",
    "kestreld.journal.write_thread",
    "kestreld.journal.batch",
    "kestreld.journal.progress",
    "kestreld.journal.periodic_sync",
    "kestreld.journal.segment",
    "kestreld.journal.tick",
    "kestreld.journal.writer",
    "kestreld.journal.journal_reader",
    "kestreld.queues.reader",
    "kestreld.queues.journaled_queue",
    "kestreld.queues.collection",
    "kestreld.stats.queue_lines",
    "kestreld.session.traffic",
    "kestreld.session.gate",
    "kestreld.session.reply",
    "kestreld.session.fetch",
    "kestreld.session.session",
    "kestreld.loop.busy_poll",
    "kestreld.frontends.memcache.framing",
    "kestreld.frontends.memcache.direct_send",
    "kestreld.frontends.memcache.connection",
    "kestreld.frontends.memcache.commands",
)

#: The module that holds the C helpers every compiled module imports instead of repeating
#: them (setup.py); a compiled module does not load without it.
SHARED_UTILITY = "kestreld._cython_utility"

#: Set to 1 (or any value but 0 or empty) to run the plain Python even when compiled.
ENV_VAR = "KESTRELD_NO_EXTENSIONS"

COMPILED = "compiled"
PYTHON = "python"


def extensions_disabled() -> bool:
    """True when ``KESTRELD_NO_EXTENSIONS`` asks for the plain Python."""
    return os.environ.get(ENV_VAR, "").strip() not in ("", "0")


class _HotModuleFinder:
    """A meta-path finder for the listed modules: the compiled file, or the ``.py`` one.

    The ``.py`` file is loaded when ``source_only`` is set (``KESTRELD_NO_EXTENSIONS``),
    when there is no extension, and in a source checkout (a ``.pxd`` beside it) when the
    ``.py`` or ``.pxd`` changed after the extension was built: a stale build never runs
    old code after an edit or a checkout.
    """

    def __init__(self, source_only: bool) -> None:
        self.source_only = source_only
        self.stale: list[str] = []
        self._scanned = False

    def _scan(self) -> None:
        """Once, before the first hot module loads: is any of them stale in this checkout?
        Then none runs compiled.  The compiled modules share C declarations (a ``.pxd``
        cimports another's functions and types): one loaded as Python leaves the others
        without the C functions they call, and they fail to import."""
        self._scanned = True
        root = _package_root()
        for name in MODULES:
            source = os.path.join(root, *name.split(".")) + ".py"
            if not os.path.isfile(source):
                continue  # not under this package (a test's): judged when it is found
            built = _extension(os.path.dirname(source), name.rpartition(".")[2])
            if built is not None:
                self._is_stale(name, source, built)

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in MODULES or not path:
            return None
        leaf = name.rpartition(".")[2]
        for folder in path:
            source = os.path.join(folder, leaf + ".py")
            if not os.path.isfile(source):
                continue
            if not self.source_only and not self._scanned:
                self._scan()
            if not self.source_only and not self.stale and _shared_utility_built():
                built = _extension(folder, leaf)
                if built is not None and not self._is_stale(name, source, built):
                    return importlib.util.spec_from_file_location(name, built)
            return importlib.util.spec_from_file_location(name, source)
        return None

    def _is_stale(self, name: str, source: str, built: str) -> bool:
        declarations = source[:-3] + ".pxd"
        if not os.path.isfile(declarations):
            return False  # an installed wheel: no sources to compare with
        edited = max(os.path.getmtime(source), os.path.getmtime(declarations))
        if edited <= os.path.getmtime(built):
            return False
        if name not in self.stale:
            self.stale.append(name)
        return True


def _package_root() -> str:
    """The folder that holds the package ``kestreld`` (this file is in it)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _extension(folder: str, leaf: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = os.path.join(folder, leaf + suffix)
        if os.path.isfile(candidate):
            return candidate
    return None


def _shared_utility_built() -> bool:
    """True when the extension every compiled module imports is there (a failed compile of
    it, or a checkout built before it, runs the plain Python)."""
    # Beside this file: both are in the package kestreld.
    folder = os.path.dirname(os.path.abspath(__file__))
    return _extension(folder, SHARED_UTILITY.rpartition(".")[2]) is not None


def _finder() -> _HotModuleFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, _HotModuleFinder)), None)


def install_finder() -> None:
    """Put the hot-module finder first on ``sys.meta_path`` (once, before any hot import)."""
    if _finder() is None:
        sys.meta_path.insert(0, _HotModuleFinder(source_only=extensions_disabled()))


def stale_modules() -> list[str]:
    """Modules loaded as Python because their extension is older than the source."""
    finder = _finder()
    return list(finder.stale) if finder is not None else []


def is_compiled(module_name: str) -> bool:
    """True when this (imported) module is a compiled extension."""
    module = importlib.import_module(module_name)
    origin = getattr(module, "__file__", None) or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def python_modules() -> list[str]:
    """The modules of :data:`MODULES` that run as plain Python in this process."""
    return [name for name in MODULES if not is_compiled(name)]


#: What setup.py records (``-frecord-gcc-switches``) in an extension compiled from a training
#: run's counts.
PROFILE_GUIDED_SWITCH = b"-fprofile-use"


def profile_guided() -> bool:
    """True when the compiled modules that run were built from a training run's counts
    (setup.py's profile-guided build); False for a plain compile and for plain Python."""
    for name in MODULES:
        if not is_compiled(name):
            return False
        path = importlib.import_module(name).__file__
        try:
            with open(path, "rb") as f:
                if PROFILE_GUIDED_SWITCH not in f.read():
                    return False
        except OSError:
            return False
    return True


def implementation() -> str:
    """``"compiled"`` when every hot module is compiled, else ``"python"``."""
    return PYTHON if python_modules() else COMPILED


def report_implementation(log: Any) -> None:
    """Log once at start-up when the plain Python runs: a warning unless it was asked for."""
    missing = python_modules()
    if not missing:
        return
    if extensions_disabled():
        log.info("implementation", implementation=PYTHON, reason=f"{ENV_VAR}=1")
    elif stale := stale_modules():
        log.warning(
            "compiled_implementation_stale",
            implementation=PYTHON,
            modules=",".join(stale),
            hint=f"the sources changed after the build: {sys.executable} setup.py build_ext "
            "--inplace (in the checkout) rebuilds them",
        )
    else:
        log.warning(
            "compiled_implementation_unavailable",
            implementation=PYTHON,
            modules=",".join(missing),
            hint="install with a C compiler and the Python headers present to compile them",
        )
