"""How to install an optional extra (``spark``, ``zookeeper``), said so it works from here.

Messages that need an extra name this command.  In a clone (kestreld installed editable
from a checkout that has ``scripts/install``) the extra goes into the clone's ``.venv``
with ``scripts/install EXTRA``, which installs the extra's dependencies and compiles
nothing again; an installed package takes pip, the one of the Python running kestreld.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

#: The checkout kestreld runs from, when it runs from one (``kestreld/`` beside ``scripts/``).
_CHECKOUT = Path(__file__).resolve().parent.parent


def install_command(extra: str) -> str:
    """The shell command that installs ``kestreld[extra]`` for the kestreld running now."""
    script = _CHECKOUT / "scripts" / "install"
    if script.is_file() and (_CHECKOUT / "pyproject.toml").is_file():
        return f"{_shortest(script)} {extra}"
    requirement = shlex.quote(f"kestreld[{extra}]")
    pip = Path(sys.executable).with_name("pip")
    on_path = shutil.which("pip")
    if on_path and pip.exists() and Path(on_path).resolve() == pip.resolve():
        return f"pip install {requirement}"
    return f"{shlex.quote(sys.executable)} -m pip install {requirement}"


def _shortest(path: Path) -> str:
    """``path`` relative to the working directory when that is shorter, else absolute."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)
    if len(relative) >= len(str(path)):
        return shlex.quote(str(path))
    return shlex.quote(relative if "/" in relative else f"./{relative}")
