"""A real ZooKeeper for the tests: Debian's ``zookeeper`` package, run by hand.

:class:`ZooKeeperProcess` starts ``org.apache.zookeeper.server.ZooKeeperServerMain``
(a standalone server) with ``java -cp /usr/share/java/zookeeper.jar`` — the
jar's manifest names its dependencies — on a free loopback port with its own
data folder and config, never the system service.  ``tickTime`` is 200 ms so
that sessions may be as short as 400 ms: a test of session expiry need not
wait ten seconds.  ``stop()`` kills it; ``start()`` again serves on the same
port (with the same data, or a wiped folder for an ensemble that lost it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ports import free_port

JAR = Path(os.environ.get("KESTRELD_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


def available() -> str | None:
    """None when a ZooKeeper can be started here, else why not."""
    if not JAR.exists():
        return f"{JAR} missing (apt-get install zookeeper)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no java (apt-get install openjdk-17-jre-headless)"
    return None


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else "java"


class ZooKeeperProcess:
    """One standalone ZooKeeper on 127.0.0.1; ``hosts`` is its connect string."""

    def __init__(self, folder: Path, tick_ms: int = 200) -> None:
        self.folder = folder
        self.port = free_port()
        self.tick_ms = tick_ms
        self.proc: subprocess.Popen | None = None
        self.log_path = folder / "zookeeper.log"

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.folder / "zoo.cfg"
        cfg.write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "maxClientCnxns=0\n"
            f"minSessionTimeout={2 * self.tick_ms}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr\n"
        )
        return cfg

    def start(self, wipe: bool = False, timeout: float = 60.0) -> None:
        """Start (again, on the same port); ``wipe`` forgets every node and session first."""
        assert self.proc is None, "already running"
        if wipe:
            shutil.rmtree(self.folder / "data", ignore_errors=True)
        cfg = self._write_config()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [_java(), "-Xmx128m", "-XX:+UseSerialGC", "-cp", str(JAR), MAIN, str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self._ruok():
            if self.proc.poll() is not None:
                raise RuntimeError(f"zookeeper exited: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"zookeeper did not start in {timeout}s")
            time.sleep(0.1)

    def _ruok(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"ruok")
                return s.recv(16) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        """Kill it (SIGKILL: a crashed ensemble member); nothing to wait for afterwards."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
