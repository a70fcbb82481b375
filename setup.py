"""Build hook: compile the hot modules with Cython when a C compiler is present.

Everything else about the package is in pyproject.toml.  The modules to
compile are listed in kestreld/compiled.py; each is a plain Python file with
a ``.pxd`` beside it that declares its classes and hot functions with C types.
Without Cython or a compiler (or with ``KESTRELD_NO_EXTENSIONS=1`` at build
time) the install is pure Python and works the same, only slower; the server
says so in a warning at start-up.

With ``KESTRELD_PGO=1`` and GCC the build is profile-guided (the image and CI ask
for it): the extensions are compiled instrumented, ``scripts/build/pgo_train.py``
runs a real server on a loopback port with them, and they are compiled again from
the counts.  That takes two compiles and a training run, so a checkout's first
``scripts/serve`` gets the plain compile.  Any failure on that way (another
compiler, no loopback, a training error) falls back to the plain compile, never
to a failed install.

Each step prints a ``kestreld:`` line on stderr (``scripts/_venv.sh`` shows them
while pip runs): what is being done, and each module as it is compiled.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _compiled_settings():
    """kestreld/compiled.py, loaded by path: the package's dependencies may be missing here."""
    namespace: dict = {"__name__": "kestreld_compiled_settings"}
    source = (HERE / "kestreld" / "compiled.py").read_text()
    exec(compile(source, "kestreld/compiled.py", "exec"), namespace)
    return namespace


PGO_ENV_VAR = "KESTRELD_PGO"


def say(message: str) -> None:
    """One progress line on stderr: pip shows it with -v, scripts/_venv.sh always."""
    print(f"kestreld: {message}", file=sys.stderr, flush=True)


class OptionalBuildExt(build_ext):
    """A failed compile is a warning and a pure-Python install, never a failed install."""

    #: Compile and link flags the current pass adds (-g0 plain, the profile-guided ones).
    _pgo_flags: tuple[list[str], list[str]] = ([], [])
    #: Modules compiled in the current pass (the compiler runs one thread per core).
    _done = 0
    _done_lock = threading.Lock()
    _pass_started = 0.0

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1  # one compiler per core

    def run(self) -> None:
        try:
            if self.extensions and self._profile_guided():
                self._run_profile_guided()
            else:
                if self.extensions:
                    asked = os.environ.get(PGO_ENV_VAR, "").strip()
                    hint = "" if asked else "; KESTRELD_PGO=1 compiles it profile-guided"
                    self._pass(f"compiling the fast path (plain{hint})")
                if os.name == "posix":
                    # No debug info: a third less compile time, the same machine code.  -O2,
                    # not Python's -O3: 9 % less code to page in (0.2 MiB of an idle server),
                    # the same cost per request (scripts/bench-hotpath).  A profile-guided
                    # build optimizes its cold code for size by itself.
                    self._pgo_flags = (["-g0", "-O2"], [])
                try:
                    super().run()
                finally:
                    self._pgo_flags = ([], [])
        except Exception as e:  # noqa: BLE001 - no compiler, no headers: fall back
            self._skip(e)

    # --- the profile-guided build ------------------------------------------------------

    def _pass(self, what: str) -> None:
        """Announce a compile pass over every extension."""
        self._done = 0
        self._pass_started = time.monotonic()
        jobs = self.parallel if isinstance(self.parallel, int) and self.parallel > 1 else 1
        say(f"{what}: {len(self.extensions)} modules, {jobs} at a time")

    def _profile_guided(self) -> bool:
        """Asked for (KESTRELD_PGO=1), with GCC on Linux."""
        if os.environ.get(PGO_ENV_VAR, "").strip() != "1" or not sys.platform.startswith("linux"):
            return False
        cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
        try:
            out = subprocess.run([cc[0], "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return False
        version = out.stdout.lower()
        return (
            out.returncode == 0
            and "clang" not in version
            and ("gcc" in version or "free software foundation" in version)
        )

    def _run_profile_guided(self) -> None:
        profile_dir = tempfile.mkdtemp(prefix="kestreld-pgo-")
        try:
            generate = f"-fprofile-generate={profile_dir}"
            # Atomic counters: the fsync thread runs compiled code beside the event loop.
            self._pgo_flags = ([generate, "-fprofile-update=atomic"], [generate])
            compiler = self.compiler  # the option: run() replaces it with the compiler it made
            self.force = True  # an up-to-date plain build is not instrumented
            self._pass("profile-guided build, 1/3: compiling the fast path instrumented")
            super().run()
            say("profile-guided build, 2/3: training (a real server on a loopback port)")
            started = time.monotonic()
            trained = self._train()
            say(f"training done in {time.monotonic() - started:.0f} s")
            # The counts are files the instrumented modules write when the server exits.
            if trained and not any(Path(profile_dir).rglob("*.gcda")):
                print("kestreld: the training run left no counts; plain compile", file=sys.stderr)
                trained = False
            use = [
                f"-fprofile-use={profile_dir}",
                "-frecord-gcc-switches",  # kestreld.compiled.profile_guided()
                "-fprofile-correction",
                "-Wno-missing-profile",
            ]
            self._pgo_flags = (use, []) if trained else ([], [])
            self.compiler = compiler  # compile again, from the counts
            how = "from the profile" if trained else "plain"
            self._pass(f"profile-guided build, 3/3: compiling the fast path {how}")
            super().run()
        finally:
            self._pgo_flags = ([], [])
            shutil.rmtree(profile_dir, ignore_errors=True)

    def _train(self) -> bool:
        """Run ``scripts/build/pgo_train.py`` on the instrumented extensions: True when it ran."""
        # A build step of the repository, not a module of the package: an sdist without
        # scripts/ compiles plain.
        training = HERE / "scripts" / "build" / "pgo_train.py"
        if not training.is_file():
            print(f"kestreld: no {training} to train with; plain compile", file=sys.stderr)
            return False
        with tempfile.TemporaryDirectory(prefix="kestreld-train-") as tmp:
            package = Path(tmp, "kestreld")
            shutil.copytree(
                HERE / "kestreld",
                package,
                ignore=shutil.ignore_patterns("*.c", "*.so", "*.pyd", "__pycache__"),
            )
            for ext in self.extensions:
                built = Path(self.get_ext_fullpath(ext.name))
                if not built.exists():
                    print(f"kestreld: no {ext.name} to train; plain compile", file=sys.stderr)
                    return False
                # Copied after the sources, so newer than them: the compiled module runs.
                shutil.copyfile(built, Path(tmp, *ext.name.split(".")).parent / built.name)
            env = {k: v for k, v in os.environ.items() if k != _compiled_settings()["ENV_VAR"]}
            # First on the path; what follows stays (pip's build environment is on it).
            path = [tmp, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
            env.update(PYTHONPATH=os.pathsep.join(path), PYTHONDONTWRITEBYTECODE="1")
            try:
                run = subprocess.run(
                    [sys.executable, str(training)],
                    cwd=tmp,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            except (OSError, subprocess.SubprocessError) as e:
                print(f"kestreld: the training run failed ({e}); plain compile", file=sys.stderr)
                return False
            if run.returncode != 0:
                tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
                print(f"kestreld: the training run failed; plain compile:\n{tail}", file=sys.stderr)
                return False
            print(run.stdout.strip(), file=sys.stderr)
            return True

    def build_extension(self, ext) -> None:
        compile_args, link_args = self._pgo_flags
        base = ext.extra_compile_args, ext.extra_link_args
        try:
            ext.extra_compile_args = [*base[0], *compile_args]
            ext.extra_link_args = [*base[1], *link_args]
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001
                if not compile_args:
                    raise
                # An instrumented or profile-guided module is never what a failure leaves
                # (nor one a flag broke).
                print(f"kestreld: {ext.name}: {e}; plain compile", file=sys.stderr)
                ext.extra_compile_args, ext.extra_link_args = base
                super().build_extension(ext)
            with self._done_lock:
                self._done += 1
                took = time.monotonic() - self._pass_started
                say(f"  [{self._done}/{len(self.extensions)}] {ext.name} ({took:.0f} s)")
        except Exception as e:  # noqa: BLE001
            self._skip(e, ext.name)
        finally:
            ext.extra_compile_args, ext.extra_link_args = base

    @staticmethod
    def _skip(error: Exception, name: str = "the extensions") -> None:
        print(
            f"kestreld: could not compile {name} ({error}); installing the pure-Python "
            "implementation",
            file=sys.stderr,
        )


def _stale_c(source: str, shared: str) -> bool:
    """True when Cython will (re)write the C file of ``source`` (a ``.py`` beside a ``.pxd``).

    A C file that does not import the shared utility module ``shared`` (translated before
    there was one) is deleted here, so that it is translated again.
    """
    py = HERE / source
    c = py.with_suffix(".c")
    if not c.exists():
        return True
    if shared.encode() not in c.read_bytes():
        c.unlink()
        return True
    return max(py.stat().st_mtime, py.with_suffix(".pxd").stat().st_mtime) > c.stat().st_mtime


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
    # The C helpers every module would repeat (function and extension types, argument
    # parsing, ...) are compiled once, into this module, which the others import: 0.4 MiB
    # less of an idle server's memory, the same cost per request.
    shared = settings["SHARED_UTILITY"]
    shared_module = Extension(shared, [str(Path(*shared.split("."))) + ".c"])
    stale = sum(_stale_c(source, shared) for source in sources)
    if stale:
        # pip runs this file several times per install: only the run that translates says so.
        say(f"translating {stale} modules to C (Cython), {os.cpu_count() or 1} at a time")
    started = time.monotonic()
    try:
        modules = cythonize(
            [shared_module, *sources],
            shared_utility_qualified_name=shared,
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
            nthreads=os.cpu_count() or 1,
        )
    except Exception as e:  # noqa: BLE001 - a Cython error must not break the install
        print(f"kestreld: Cython failed ({e}); pure-Python install", file=sys.stderr)
        return []
    if stale:
        say(f"translated in {time.monotonic() - started:.0f} s")
    return modules


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
