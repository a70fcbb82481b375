"""Messages that need an extra name the command that installs it from where kestreld runs."""

from __future__ import annotations

import subprocess
import sys

import repo

from kestreld.extras import install_command

ROOT = repo.ROOT


def test_in_the_clone_the_hint_is_scripts_install(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert install_command("spark") == "scripts/install spark"


def test_elsewhere_the_hint_reaches_the_clones_script(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    command, extra = install_command("zookeeper").split(" ")
    assert extra == "zookeeper"
    assert (tmp_path / command).resolve() == ROOT / "scripts" / "install"


def test_analyze_without_spark_says_how_to_install_it(tmp_path):
    # pyspark hidden from the import system, as in an install without the extra.
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "from kestreld.cli import main\n"
        f"sys.exit(main(['analyze', {str(tmp_path)!r}, '--out', {str(tmp_path / 'report')!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "needs Spark: scripts/install spark (and Java 17+)" in done.stderr
