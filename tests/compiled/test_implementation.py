"""Which implementation runs: compiled (Cython) or plain Python, and how a user can tell.

The whole suite runs once with the compiled modules (when the install built
them) and once with ``KESTRELD_NO_EXTENSIONS=1`` (.ci/run); these tests check
the switch itself, ``kestreld --version`` and the ``listening`` event.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kestreld_process import KestreldProcess

import kestreld
from kestreld import compiled

PACKAGE_ROOT = Path(kestreld.__file__).resolve().parent.parent


def built_extensions() -> list[str]:
    """The modules of compiled.MODULES with an extension file beside their source."""
    out = []
    for name in compiled.MODULES:
        folder = PACKAGE_ROOT.joinpath(*name.split(".")[:-1])
        leaf = name.rpartition(".")[2]
        if any((folder / f"{leaf}{s}").exists() for s in importlib.machinery.EXTENSION_SUFFIXES):
            out.append(name)
    return out


def run_python(code: str, *, no_extensions: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != compiled.ENV_VAR}
    if no_extensions:
        env[compiled.ENV_VAR] = "1"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def test_every_compiled_module_is_a_python_file_with_a_pxd_beside_it():
    for name in compiled.MODULES:
        source = PACKAGE_ROOT.joinpath(*name.split("."))
        assert source.with_suffix(".py").is_file(), name
        assert source.with_suffix(".pxd").is_file(), name


def test_no_extensions_loads_every_hot_module_from_its_python_file():
    code = (
        "import importlib; from kestreld import compiled\n"
        "for n in compiled.MODULES: print(importlib.import_module(n).__file__)\n"
        "print(compiled.implementation())"
    )
    lines = run_python(code, no_extensions=True).splitlines()
    assert lines[-1] == "python"
    assert all(line.endswith(".py") for line in lines[:-1]), lines


def test_the_built_extensions_are_used_unless_disabled():
    built = built_extensions()
    if not built:
        pytest.skip("no compiled modules in this install (no C compiler when it was built)")
    code = "from kestreld import compiled; print(compiled.python_modules())"
    assert run_python(code, no_extensions=False) == repr(
        [n for n in compiled.MODULES if n not in built]
    )


def test_a_compiled_install_is_built_from_the_training_runs_counts():
    """With KESTRELD_PGO=1 (CI, the image) and GCC, setup.py compiles the extensions
    profile-guided (scripts/build/pgo_train.py); a plain compile here means the training run
    failed and the build fell back."""
    if len(built_extensions()) < len(compiled.MODULES):
        pytest.skip("no compiled modules in this install (no C compiler when it was built)")
    if os.environ.get("KESTRELD_PGO", "").strip() != "1":
        pytest.skip("KESTRELD_PGO is not 1: the install was built without a training run")
    code = "from kestreld import compiled; print(compiled.profile_guided())"
    assert run_python(code, no_extensions=False) == "True"
    assert run_python(code, no_extensions=True) == "False"


@pytest.mark.parametrize("no_extensions", [False, True], ids=["default", "no_extensions"])
def test_version_names_the_implementation(no_extensions):
    code = "from kestreld.cli import main; main(['--version'])"
    out = run_python(code, no_extensions=no_extensions)
    complete = len(built_extensions()) == len(compiled.MODULES)
    expected = "compiled" if complete and not no_extensions else "python"
    assert out == f"kestreld {kestreld.__version__} ({expected})"


def test_listening_event_names_the_implementation_and_python_is_announced(tmp_path, monkeypatch):
    monkeypatch.setenv(compiled.ENV_VAR, "1")
    with KestreldProcess(tmp_path / "queues") as srv:
        (listening,) = srv.events("listening")
        assert listening["implementation"] == "python"
        assert listening["profile_guided"] is False
        (note,) = srv.events("implementation")
        assert note["reason"] == f"{compiled.ENV_VAR}=1"
        assert not srv.events("compiled_implementation_unavailable")
    if len(built_extensions()) < len(compiled.MODULES):
        return  # a pure-Python install: the default run is the warning's case, below
    monkeypatch.delenv(compiled.ENV_VAR)
    with KestreldProcess(tmp_path / "queues2") as srv:
        assert srv.events("listening")[0]["implementation"] == "compiled"
        guided = run_python(
            "from kestreld import compiled; print(compiled.profile_guided())", no_extensions=False
        )
        assert srv.events("listening")[0]["profile_guided"] is (guided == "True")
        assert not srv.events("implementation")
        assert not srv.events("compiled_implementation_unavailable")


def test_a_python_run_that_was_not_asked_for_warns_once(tmp_path):
    """Without the extensions (here: hidden by the finder) and without the variable: a warning."""
    code = (
        "import sys; from kestreld import compiled\n"
        "sys.meta_path.insert(0, compiled._HotModuleFinder(source_only=True))\n"
        "events = []\n"
        "class L:\n"
        "    def warning(self, e, **kw): events.append(('warning', e, kw))\n"
        "    def info(self, e, **kw): events.append(('info', e, kw))\n"
        "compiled.report_implementation(L()); print(events)"
    )
    out = run_python(code, no_extensions=False)
    assert out.startswith("[('warning', 'compiled_implementation_unavailable'")
    assert out.count("warning") == 1


def test_the_compiled_modules_share_one_module_of_c_helpers():
    if len(built_extensions()) < len(compiled.MODULES):
        pytest.skip("no compiled modules in this install (no C compiler when it was built)")
    code = f"import sys, kestreld.server\nprint(sys.modules['{compiled.SHARED_UTILITY}'].__file__)"
    loaded = run_python(code, no_extensions=False)
    assert loaded.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def test_without_the_shared_c_helpers_an_extension_is_skipped(tmp_path, monkeypatch):
    """A compiled module does not load without them: the .py runs, never an ImportError."""
    monkeypatch.setattr(compiled, "MODULES", ("fakepkg.hot",))
    monkeypatch.setattr(compiled, "_shared_utility_built", lambda: False)
    folder = tmp_path / "fakepkg"
    folder.mkdir()
    for leaf in ("hot.py", "hot.pxd", f"hot{importlib.machinery.EXTENSION_SUFFIXES[0]}"):
        (folder / leaf).write_text("")
    spec = compiled._HotModuleFinder(source_only=False).find_spec("fakepkg.hot", [str(folder)])
    assert spec is not None
    assert Path(spec.origin).name == "hot.py"


def test_an_extension_older_than_its_source_is_skipped_in_a_checkout(tmp_path, monkeypatch):
    """After an edit (or a checkout) the .py runs until the next build, never stale code."""
    monkeypatch.setattr(compiled, "MODULES", ("fakepkg.hot",))
    monkeypatch.setattr(compiled, "_shared_utility_built", lambda: True)
    folder = tmp_path / "fakepkg"
    folder.mkdir()
    source, declarations = folder / "hot.py", folder / "hot.pxd"
    built = folder / f"hot{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    for f in (source, declarations, built):
        f.write_text("")

    def origin(**kw) -> str:
        finder = compiled._HotModuleFinder(**kw)
        spec = finder.find_spec("fakepkg.hot", [str(folder)])
        assert spec is not None
        return Path(spec.origin).name + (" stale" if finder.stale else "")

    os.utime(source, (1000, 1000))
    os.utime(declarations, (1000, 1000))
    os.utime(built, (2000, 2000))
    assert origin(source_only=False) == built.name
    assert origin(source_only=True) == "hot.py"
    os.utime(declarations, (3000, 3000))  # the .pxd edited after the build
    assert origin(source_only=False) == "hot.py stale"
    declarations.unlink()  # an installed wheel: nothing to compare, the extension runs
    os.utime(source, (3000, 3000))
    assert origin(source_only=False) == built.name
    built.unlink()
    assert origin(source_only=False) == "hot.py"
    assert (
        compiled._HotModuleFinder(source_only=False).find_spec("other.mod", [str(folder)]) is None
    )


def test_one_stale_extension_makes_every_hot_module_run_as_python(tmp_path, monkeypatch):
    """The compiled modules call each other's C functions: a fresh one beside a stale one
    loaded as Python would not import (found when a cimported module was edited)."""
    monkeypatch.setattr(compiled, "MODULES", ("fakepkg.hot", "fakepkg.cold"))
    monkeypatch.setattr(compiled, "_shared_utility_built", lambda: True)
    monkeypatch.setattr(compiled, "_package_root", lambda: str(tmp_path))
    folder = tmp_path / "fakepkg"
    folder.mkdir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for leaf in ("hot", "cold"):
        for name, stamp in ((f"{leaf}.py", 1000), (f"{leaf}.pxd", 1000), (leaf + suffix, 2000)):
            (folder / name).write_text("")
            os.utime(folder / name, (stamp, stamp))

    def origin() -> tuple[str, list[str]]:
        finder = compiled._HotModuleFinder(source_only=False)
        spec = finder.find_spec("fakepkg.hot", [str(folder)])
        assert spec is not None
        return Path(spec.origin).name, finder.stale

    assert origin() == ("hot" + suffix, [])
    os.utime(folder / "cold.py", (3000, 3000))  # the other module edited after the build
    assert origin() == ("hot.py", ["fakepkg.cold"])


def _pxd_classes(text: str) -> dict[str, set[str]]:
    """``cdef class`` name -> the attributes it declares, from a .pxd file."""
    classes: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in text.splitlines():
        if m := re.match(r"cdef class (\w+)", line):
            current = classes.setdefault(m.group(1), set())
        elif line and not line[0].isspace() and not line.startswith("#"):
            current = None
        elif current is not None and (m := re.match(r"\s+cdef (?:public |readonly )?(.+)", line)):
            if "(" not in m.group(1):  # a field, not a method
                # "long long id" or "bint a, b": the last word of each comma-separated part
                current.update(part.split()[-1] for part in m.group(1).split(","))
    return classes


def _assigned_attributes(cls: ast.ClassDef) -> tuple[set[str], set[str] | None]:
    """(attributes assigned through ``self``, the ``__slots__`` names or None) of a class."""
    assigned: set[str] = set()
    slots = None
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    assigned.add(t.attr)
    for node in cls.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            slots = {ast.literal_eval(e) for e in node.value.elts}  # type: ignore[attr-defined]
    return assigned, slots


@pytest.mark.parametrize("module", compiled.MODULES)
def test_every_attribute_a_compiled_class_sets_is_declared_in_its_pxd(module):
    """A field added to the .py but not to the .pxd fails here, in both CI runs, clearly
    (compiled, it would be an AttributeError at run time)."""
    source = PACKAGE_ROOT.joinpath(*module.split("."))
    declared = _pxd_classes(source.with_suffix(".pxd").read_text())
    tree = ast.parse(source.with_suffix(".py").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name, fields in declared.items():
        assert name in classes, f"{module}: the .pxd declares {name}, the .py has no such class"
        assigned, slots = _assigned_attributes(classes[name])
        missing = assigned - fields
        assert not missing, f"{module}.{name}: declare {sorted(missing)} in the .pxd"
        if slots is not None:
            assert slots == fields, f"{module}.{name}: __slots__ and the .pxd differ"
