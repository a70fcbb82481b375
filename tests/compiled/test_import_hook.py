"""The hot-module finder is installed by the packages that hold compiled modules only.

A program that imports the client (or just ``kestreld``) gets no import hook on
``sys.meta_path``; importing the queues, the journal, the session or the memcache
front end installs it before their first compiled module loads.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
{imports}
from kestreld.compiled import _HotModuleFinder
print(any(isinstance(f, _HotModuleFinder) for f in sys.meta_path))
"""


def _hook_installed(imports: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(imports=imports)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return out[-1] == "True"


@pytest.mark.parametrize(
    "imports", ["import kestreld", "import kestreld.client", "from kestreld.client import Client"]
)
def test_a_client_user_gets_no_import_hook(imports):
    assert not _hook_installed(imports)


@pytest.mark.parametrize(
    "module",
    [
        "kestreld.journal.codec",
        "kestreld.queues.item",
        "kestreld.session.session",
        "kestreld.frontends.memcache.framing",
        "kestreld.server",
    ],
)
def test_the_hot_packages_install_it_before_their_modules(module):
    assert _hook_installed(f"import {module}")


def test_the_compiled_modules_still_load_compiled_or_as_python_on_request():
    # The finder decides per module: with KESTRELD_NO_EXTENSIONS=1 every hot module is the
    # .py file; without it, each is whatever is built (tests/compiled/test_implementation.py checks
    # the build).  Here only that the variable reaches the finder installed by the packages.
    code = (
        "import kestreld.server, kestreld.compiled as c, sys; "
        "print(c.python_modules() == list(c.MODULES))"
    )
    env_out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**__import__("os").environ, "KESTRELD_NO_EXTENSIONS": "1"},
    ).stdout.split()
    assert env_out[-1] == "True"
