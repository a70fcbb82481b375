"""A real Spark standalone cluster on 127.0.0.1 for tests: a master and one worker.

Started from PySpark's own ``bin/spark-class`` (``SPARK_HOME`` is the pyspark
package folder, as docs/pipeline.md says).  The worker's executors run a
separate Python that has pyarrow but neither kestreld nor PySpark installed,
as a node of a real cluster would: :func:`executor_python` builds it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ports import free_port

#: What the executors' Python may import beyond the standard library (pyarrow and the
#: packages pyarrow's pandas conversions use).  Not kestreld, not pyspark.
EXECUTOR_PACKAGES = (
    "pyarrow",
    "numpy",
    "numpy.libs",
    "pandas",
    "dateutil",
    "pytz",
    "tzdata",
    "six",
)


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would let a Python find kestreld or Spark's
    settings of the test run; with ``SPARK_HOME`` and a loopback address."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONF_DIR")
        and not k.startswith("PYSPARK_SUBMIT")
    }
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", **extra)
    return env


def executor_python(folder: Path) -> str:
    """A virtualenv (no pip, no system site-packages) that can import pyarrow, and not kestreld.

    pyarrow is taken from this interpreter's site-packages through a ``.pth``
    file naming a folder of links (no download); a real node would
    ``pip install pyarrow``.
    """
    import pyarrow

    venv = folder / "executor-venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            env=clean_env(),
        ).stdout.strip()
    )
    source = Path(pyarrow.__file__).resolve().parent.parent
    links = folder / "executor-packages"
    links.mkdir()
    for name in EXECUTOR_PACKAGES:
        if (source / name).exists():
            (links / name).symlink_to(source / name)
    (site / "executor-packages.pth").write_text(f"{links}\n")
    return str(python)


class StandaloneCluster:
    """``spark://127.0.0.1:PORT`` with one worker (1 core); :meth:`stop` ends both."""

    def __init__(self, folder: Path, executor_python: str) -> None:
        self.folder = folder
        self.executor_python = executor_python
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        env = clean_env(SPARK_WORKER_DIR=str(self.folder / "work"), SPARK_NO_DAEMONIZE="1")
        proc = subprocess.Popen(
            [os.path.join(spark_home(), "bin", "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stop() ends the JVM's children too
        )
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--webui-port", str(self.ui_port),
            ],
        )  # fmt: skip
        self._spawn(
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--webui-port", str(free_port()),
                "--work-dir", str(self.folder / "work"),
                self.url,
            ],
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc, name in zip(self.procs, ("master", "worker"), strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"spark {name} exited: {self.log(name)[-2000:]}")
            if self.alive_workers() >= 1:
                return self
            time.sleep(0.5)
        raise RuntimeError(f"no worker registered in {timeout}s: {self.log('worker')[-2000:]}")

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                state = json.load(r)
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        """SIGTERM each process group (the JVM and whatever it started), SIGKILL if it lingers."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.procs.clear()
