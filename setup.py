"""Build hook: compile the hot modules with Cython when a C compiler is present.

Everything else about the package is in pyproject.toml.  The modules to
compile are listed in kestreld/compiled.py; each is a plain Python file with
a ``.pxd`` beside it that declares its classes and hot functions with C types.
Without Cython or a compiler (or with ``KESTRELD_NO_EXTENSIONS=1`` at build
time) the install is pure Python and works the same, only slower; the server
says so in a warning at start-up.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _compiled_settings():
    """kestreld/compiled.py, loaded by path: the package's dependencies may be missing here."""
    namespace: dict = {"__name__": "kestreld_compiled_settings"}
    source = (HERE / "kestreld" / "compiled.py").read_text()
    exec(compile(source, "kestreld/compiled.py", "exec"), namespace)
    return namespace


class OptionalBuildExt(build_ext):
    """A failed compile is a warning and a pure-Python install, never a failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - no compiler, no headers: fall back
            self._skip(e)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            self._skip(e, ext.name)

    @staticmethod
    def _skip(error: Exception, name: str = "the extensions") -> None:
        print(
            f"kestreld: could not compile {name} ({error}); installing the pure-Python "
            "implementation",
            file=sys.stderr,
        )


def extensions() -> list:
    settings = _compiled_settings()
    if os.environ.get(settings["ENV_VAR"], "").strip() not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("kestreld: Cython is not installed; pure-Python install", file=sys.stderr)
        return []
    sources = [str(Path(*name.split("."))) + ".py" for name in settings["MODULES"]]
    try:
        return cythonize(
            sources,
            language_level=3,
            quiet=True,
            compiler_directives={
                # Indexes that come from the wire keep their checks: no boundscheck=False,
                # no wraparound=False anywhere.
                # The .pxd files alone give the C types; the .py annotations are for readers.
                "annotation_typing": False,
                "embedsignature": True,
                # A None where a typed object belongs is an exception, never a crash.
                "nonecheck": True,
            },
        )
    except Exception as e:  # noqa: BLE001 - a Cython error must not break the install
        print(f"kestreld: Cython failed ({e}); pure-Python install", file=sys.stderr)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
