"""README.md runs as printed: every ``sh`` and ``python`` block, pasted into a shell in a clone.

The blocks are read with pytest-codeblocks' extractor (fences, indentation, and the marks
written as HTML comments before a block, which GitHub does not show); this file runs them,
because they need what its plugin cannot give: a server in the background for the blocks
after it.  The README's marks:

- ``serves``: the set-up block.  It is started as printed (``scripts/serve``, on
  127.0.0.1:22133) and left running; the blocks after it talk to it; it is stopped
  (SIGTERM) at the end and must exit 0.
- ``needs("docker")``, ``needs("spark")``: run where the machine has Docker or PySpark and
  Java (CI has Spark, not Docker).  Elsewhere the block is not collected, so CI's strict mode
  (a skip is a failure) does not count it, and a warning in pytest's summary says which
  block was left out and why.
- ``is_the_suite``: ``scripts/test`` itself, which is what runs this file (``.ci/run``).

Each block runs under ``bash -e -o pipefail`` (a ``python`` block with ``.venv/bin/python``)
in a folder laid out as a fresh clone after its first command: the repository's files, and
``.venv`` being the environment running these tests.  The venv's ``bin`` is not on PATH, as
in a new shell: a command printed bare that only ``.venv`` has fails here as it would there.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import repo
from pytest_codeblocks import extract_from_file

ROOT = repo.ROOT
README = ROOT / "README.md"
#: Where the README's server listens, as printed.
PORT = 22133
#: What a clone has that the blocks use (the rest of the repository is not needed).
CLONE_FILES = (
    "scripts",
    "config",
    "kestreld",
    "tests",
    "docs",
    "pyproject.toml",
    "setup.py",
    "README.md",
)
RUNNABLE = {"sh": "sh", "bash": "sh", "python": "python"}
#: The marks README.md may carry (this module's docstring says what each means).
MARKS = ("serves", "needs", "is_the_suite")
NEEDS = ("docker", "spark")


class ReadmeBlockNotRun(UserWarning):
    """A README block that this machine cannot run (it says why)."""


@dataclass(slots=True, frozen=True)
class Block:
    """One runnable block of the README, with its marks as (name, argument) pairs."""

    line: int
    language: str
    code: str
    marks: tuple[tuple[str, str | None], ...]

    def has(self, name: str) -> bool:
        return any(mark == name for mark, _ in self.marks)

    def needs(self) -> list[str]:
        return [arg for mark, arg in self.marks if mark == "needs" and arg is not None]

    @property
    def id(self) -> str:
        return f"line{self.line}"


def _mark(text: str) -> tuple[str, str | None]:
    """``pytest.mark.needs("docker")`` -> ``("needs", "docker")``."""
    found = re.fullmatch(r"\s*pytest\.mark\.(\w+)(?:\((.*)\))?\s*", text)
    if found is None:
        raise ValueError(f"README.md: unreadable mark {text!r}")
    name, argument = found.groups()
    if name not in MARKS:
        raise ValueError(f"README.md: unknown mark {name!r} (known: {', '.join(MARKS)})")
    return name, ast.literal_eval(argument) if argument else None


def readme_blocks() -> list[Block]:
    blocks = []
    for found in extract_from_file(README):
        language = RUNNABLE.get((found.syntax or "").split(" ")[0])
        if language is not None:
            marks = tuple(_mark(m) for m in found.marks)
            blocks.append(Block(found.lineno, language, found.code, marks))
    return blocks


def missing(need: str) -> str | None:
    """Why this machine cannot run a block that needs ``need``, or None when it can."""
    if need == "docker":
        if shutil.which("docker") is None:
            return "Docker is not installed"
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
        if info.returncode != 0:
            return "the Docker daemon does not answer"
        # The Dockerfile's base image, here or from a registry (CI reaches none).
        base = re.search(r"^ARG BASE=(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
        assert base is not None, "Dockerfile: no ARG BASE"
        for probe in (["image", "inspect"], ["pull", "--quiet"]):
            probed = subprocess.run(["docker", *probe, base[1]], capture_output=True, timeout=600)
            if probed.returncode == 0:
                return None
        return f"the base image {base[1]} is neither here nor pullable"
    if need == "spark":
        if importlib.util.find_spec("pyspark") is None:
            return "PySpark is not installed (scripts/install spark)"
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            return "Java is not installed"
        return None
    raise ValueError(f"README.md: unknown need {need!r} (known: {', '.join(NEEDS)})")


BLOCKS = readme_blocks()
SERVES = [b for b in BLOCKS if b.has("serves")]


def _runnable_here() -> list[Block]:
    """The blocks this machine can run; a warning names each one it cannot, and why."""
    run = []
    for block in BLOCKS:
        if block.has("serves") or block.has("is_the_suite"):
            continue
        reasons = [r for r in map(missing, block.needs()) if r is not None]
        if reasons:
            warnings.warn(
                f"README.md line {block.line} not run here: {'; '.join(reasons)}",
                ReadmeBlockNotRun,
                stacklevel=1,
            )
            continue
        run.append(block)
    return run


RUN = _runnable_here()
#: Docker blocks publish the README's ports themselves: they run after the README's server.
ON_THE_SERVER = [b for b in RUN if "docker" not in b.needs()]
IN_DOCKER = [b for b in RUN if "docker" in b.needs()]


def shell_env() -> dict[str, str]:
    """A new shell's environment: no KESTRELD_VENV, the venv's bin not on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("KESTRELD_VENV", "VIRTUAL_ENV")}
    venv_bin = str(Path(sys.prefix, "bin"))
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return env


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A folder laid out as a clone after scripts/serve's first run (.venv is this venv).

    Copies (ruff does not follow a symlinked folder) with their times, so that
    scripts/_venv.sh finds the venv's install stamp newer and installs nothing."""
    where = tmp_path_factory.mktemp("clone")
    for name in CLONE_FILES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.c")
            shutil.copytree(ROOT / name, where / name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(ROOT / name, where / name)
    (where / ".venv").symlink_to(sys.prefix)
    return where


def _port_open() -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", PORT)) == 0


@pytest.fixture(scope="class")
def readme_server(clone):
    """The set-up block, running in the background as it would in the reader's first shell."""
    assert len(SERVES) == 1, "README.md: exactly one block is marked serves"
    if _port_open():
        pytest.fail(f"something already listens on 127.0.0.1:{PORT}: the README's server cannot")
    log = clone / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", SERVES[0].code],
            cwd=clone,
            env=shell_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # A first start compiles the fast path (about a minute on a quiet 2-core machine; a
        # busy one has taken over two): long enough for that, short enough to catch a hang.
        deadline = time.monotonic() + 300
        while "listening" not in log.read_text(errors="replace") or not _port_open():
            if proc.poll() is not None:
                pytest.fail(f"scripts/serve exited {proc.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"scripts/serve not listening after 300 s:\n{log.read_text()}")
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert code == 0, f"scripts/serve exited {code} on SIGTERM:\n{log.read_text()}"


def run_block(block: Block, clone: Path) -> subprocess.CompletedProcess:
    if block.language == "python":
        argv = [str(clone / ".venv" / "bin" / "python"), "-c", block.code]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.code]
    return subprocess.run(
        argv,
        cwd=clone,
        env=shell_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600 if {"spark", "docker"} & set(block.needs()) else 60,
    )


def assert_ran(block: Block, done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, (
        f"README.md line {block.line} exited {done.returncode}:\n{block.code}\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )


def test_the_readme_marks_one_set_up_block_that_starts_the_server() -> None:
    (serves,) = SERVES
    assert serves.code.split()[0] == "scripts/serve"
    assert serves is BLOCKS[0], "the set-up block is the README's first command"


class TestWithTheReadmesServer:
    """The blocks after the set-up, in a second shell, while scripts/serve runs."""

    @pytest.mark.parametrize(
        "block",
        # The suite's spark marker too: -m "not spark" leaves the Spark block out as well.
        [
            pytest.param(b, id=b.id, marks=[pytest.mark.spark] if "spark" in b.needs() else [])
            for b in ON_THE_SERVER
        ],
    )
    def test_readme_block_runs_as_printed(self, block: Block, clone: Path, readme_server) -> None:
        assert_ran(block, run_block(block, clone))

    def test_the_try_it_block_gets_the_item_back(self, clone: Path, readme_server) -> None:
        (try_it,) = [b for b in RUN if "printf" in b.code and "nc " in b.code]
        done = run_block(try_it, clone)
        assert "STORED\nVALUE q 0 5\nhello\nEND\n" in done.stdout  # text mode: \r\n as \n


# Defined only where a Docker block can run: an empty parameter set would be a skip.
if IN_DOCKER:

    @pytest.mark.parametrize("block", IN_DOCKER, ids=[b.id for b in IN_DOCKER])
    def test_readme_docker_block_runs_as_printed(block: Block, clone: Path) -> None:
        assert not _port_open(), f"127.0.0.1:{PORT} is taken: the container publishes it"
        try:
            assert_ran(block, run_block(block, clone))
        finally:
            # The block leaves its container running, as a reader's would.
            subprocess.run(["docker", "rm", "-f", "kestreld"], capture_output=True, timeout=60)
