"""The image, built from the real Dockerfile and run for real, with podman.

No Docker engine and no image registry are needed: a Debian 12 base (its
python3 is 3.11) is made with ``debootstrap`` from Debian's packages, given a
virtual environment on PATH (``python``, ``pip`` and the C headers, as the
official Python image has them), and imported into podman.  Then the repository's Dockerfile
is built on it (``--build-arg BASE=...``), and the container is:

- run on a named volume, and set/get through from this machine (into the
  container's own network namespace, so the real production.conf and its
  ports are used unchanged and no host port is taken);
- checked with its HEALTHCHECK (``podman healthcheck run``);
- stopped with ``podman stop``: SIGTERM to kestreld as PID 1, exit 0,
  ``stopped`` logged, well within the stop timeout;
- replaced by a new container on the same volume, which finds the queue
  intact with nothing repaired;
- asked ``kestreld ping`` and ``kestreld --check-config`` inside;
- run with a ``[zookeeper]`` config against a real ZooKeeper on this machine
  (tests/support/zookeeper.py; the container shares the host's network), where
  its member appears in both server sets and is gone after ``podman stop``.

Everything lives in podman storage under a folder the test creates
(``--root``/``--runroot``), so nothing outside it is touched, and the folder
(the debootstrap base included) is removed afterwards.  podman runs with
``runc``: ``crun`` fails on some kernels' hybrid cgroups.  Needs root; CI
(.ci/run) installs podman, runc and debootstrap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import repo
from kazoo.client import KazooClient
from waiting import wait_until
from zookeeper import ZooKeeperProcess, available, free_port

ROOT = repo.ROOT
MIRROR = os.environ.get("KESTRELD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_TAG = "localhost/kestreld-test-base:bookworm"
IMAGE_TAG = "localhost/kestreld-test:latest"
VENV = "/opt/python"
#: Limits podman passes explicitly: its defaults fail under some container hosts.
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _missing() -> str | None:
    if not sys.platform.startswith("linux"):
        return "podman and debootstrap need Linux"
    if os.geteuid() != 0:
        return "debootstrap and rootful podman need root"
    absent = [
        tool for tool in ("podman", "runc", "debootstrap", "nsenter") if not shutil.which(tool)
    ]
    if absent:
        return f"not installed: {', '.join(absent)} (.ci/run installs them with apt)"
    return None


if (_reason := _missing()) is not None:
    pytest.skip(_reason, allow_module_level=True)


@dataclass(slots=True)
class Podman:
    """podman with its own storage under ``folder`` (nothing global is touched)."""

    folder: Path

    def command(self, *args: str) -> list[str]:
        f = self.folder
        return [
            "podman",
            "--root", str(f / "storage"),
            "--runroot", str(f / "run"),
            "--tmpdir", str(f / "tmp"),
            "--runtime", "runc",
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "file",
            *args,
        ]  # fmt: skip

    def run(
        self, *args: str, check: bool = True, timeout: float = 600, **kw
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=timeout, **kw
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}"
            )
        return result

    def inspect(self, container: str, template: str) -> str:
        return self.run("inspect", "--format", template, container).stdout.strip()

    def events(self, container: str) -> list[dict]:
        """kestreld's JSON log lines (stderr) of a container, parsed."""
        out = []
        for line in self.run("logs", container).stderr.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def build_base(podman: Podman, folder: Path) -> float:
    """Debian 12 with python3, its C headers and a venv on PATH, imported as BASE_TAG; seconds taken.

    The headers are there as in the official Python image: the Dockerfile's build stage
    compiles the hot path against them, and the build fails if the image runs plain Python.
    """
    started = time.monotonic()
    rootfs = folder / "rootfs"
    subprocess.run(
        ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,python3-dev,ca-certificates",
         "bookworm", str(rootfs), MIRROR],
        check=True, capture_output=True, timeout=1200,
    )  # fmt: skip
    # This machine's trust store: pip in the build must reach the package index as we do.
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", rootfs / "etc/ssl/certs/ca-certificates.crt")
    subprocess.run(["chroot", str(rootfs), "python3", "-m", "venv", VENV], check=True, timeout=300)
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / leftover).glob("*"):
            if path.is_file():
                path.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    podman.run(
        "import",
        "--change", f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change", "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
        "-", BASE_TAG,
        stdin=tar.stdout,
    )  # fmt: skip
    assert tar.wait(60) == 0
    shutil.rmtree(rootfs)
    return time.monotonic() - started


def _unmount_under(folder: Path) -> None:
    """Mounts podman may leave under its storage (overlay, shm), deepest first."""
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1].startswith(str(folder))]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def podman(tmp_path_factory) -> Iterator[Podman]:
    folder = tmp_path_factory.mktemp("podman-image")
    engine = Podman(folder)
    try:
        yield engine
    finally:
        engine.run("rm", "--all", "--force", check=False)
        engine.run("rmi", "--all", "--force", check=False)
        engine.run("volume", "rm", "--all", "--force", check=False)
        _unmount_under(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def image(podman: Podman) -> str:
    base_seconds = build_base(podman, podman.folder)
    started = time.monotonic()
    podman.run(
        "build", "--format", "docker", "--network=host", *ULIMITS,
        "--build-arg", f"BASE={BASE_TAG}", "-t", IMAGE_TAG, str(ROOT),
        timeout=1200,
    )  # fmt: skip
    print(
        f"\nimage test: base {base_seconds:.0f}s, build {time.monotonic() - started:.0f}s",
        file=sys.stderr,
    )
    return IMAGE_TAG


def start(podman: Podman, image: str, name: str, volume: str) -> None:
    podman.run(
        "run", "-d", "--name", name, "--network=none", *ULIMITS,
        "-v", f"{volume}:/var/spool/kestrel", image,
    )  # fmt: skip


def wait_healthy(podman: Podman, name: str, timeout: float = 60) -> None:
    """Run the image's HEALTHCHECK until it passes (the server is starting)."""
    deadline = time.monotonic() + timeout
    while podman.run("healthcheck", "run", name, check=False).returncode != 0:
        assert time.monotonic() < deadline, podman.run("logs", name).stderr[-3000:]
        time.sleep(0.5)
    assert podman.inspect(name, "{{.State.Health.Status}}") == "healthy"


def client(podman: Podman, name: str, script: str) -> str:
    """Run a Python client on this machine inside the container's network namespace."""
    pid = podman.inspect(name, "{{.State.Pid}}")
    result = subprocess.run(
        ["nsenter", "-t", pid, "-n", "--", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


SETS = """
import socket
s = socket.create_connection(("127.0.0.1", 22133), timeout=10)
for i in range(100):
    s.sendall(b"set jobs 0 0 %d\\r\\njob%d\\r\\n" % (len(b"job%d" % i), i))
    reply = b""
    while not reply.endswith(b"\\r\\n"):
        reply += s.recv(100)
    assert reply == b"STORED\\r\\n", reply
print("ok")
"""

GETS = """
import socket
s = socket.create_connection(("127.0.0.1", 22133), timeout=10)
f = s.makefile("rb")
for i in range(%d):
    s.sendall(b"get jobs\\r\\n")
    header = f.readline().split()
    if header == [b"END"]:
        print("empty")
        break
    data = f.read(int(header[3]) + 2)[:-2]
    assert f.readline() == b"END\\r\\n"
    print(data.decode())
"""


def test_the_image_builds_serves_stops_gracefully_and_keeps_its_queue(podman, image):
    started = time.monotonic()
    podman.run("volume", "create", "kestreld-spool")
    start(podman, image, "kestreld-1", "kestreld-spool")
    wait_healthy(podman, "kestreld-1")
    assert podman.inspect("kestreld-1", "{{.Config.User}}") == "kestrel"
    assert client(podman, "kestreld-1", SETS).strip() == "ok"
    assert client(podman, "kestreld-1", GETS % 10).split() == [f"job{i}" for i in range(10)]

    # podman stop: SIGTERM to PID 1 (kestreld), which syncs, checkpoints and exits 0
    stop_started = time.monotonic()
    podman.run("stop", "--time", "10", "kestreld-1")
    assert time.monotonic() - stop_started < 8  # not the SIGKILL after 10 s
    assert podman.inspect("kestreld-1", "{{.State.ExitCode}}") == "0"
    events = [e["event"] for e in podman.events("kestreld-1")]
    assert events[-2:] == ["shutdown_requested", "stopped"]
    assert podman.run("healthcheck", "run", "kestreld-1", check=False).returncode != 0

    # a new container on the same volume: the 90 items are there, nothing was repaired
    start(podman, image, "kestreld-2", "kestreld-spool")
    wait_healthy(podman, "kestreld-2")
    events = podman.events("kestreld-2")
    loaded = [e for e in events if e["event"] == "queue_loaded"]
    assert [(e["queue"], e["items"]) for e in loaded] == [("jobs", 90)]
    # Nothing repaired, nothing wrong.  The one warning the image's config earns by design:
    # its admin port listens beyond loopback (a container's loopback is unreachable to a
    # scraper) without an admin_token, which the operator sets (docs/operations.md).
    problems = [
        e
        for e in events
        if e.get("level") in ("warning", "error") and e["event"] != "admin_port_unprotected"
    ]
    assert not problems, events
    assert [e["event"] for e in events if e["event"] == "admin_port_unprotected"] == [
        "admin_port_unprotected"
    ]
    got = client(podman, "kestreld-2", GETS % 91).split()
    assert got == [f"job{i}" for i in range(10, 100)] + ["empty"]

    # the tools inside the image
    ping = podman.run(
        "exec", "kestreld-2", "kestreld", "ping", "--config", "/etc/kestreld/production.conf"
    )
    assert ping.stdout.split("\n")[:2] == ["1.0.0", "status: UP"]
    check = podman.run(
        "exec", "kestreld-2", "kestreld", "--check-config", "/etc/kestreld/production.conf"
    )
    assert "queue_path=/var/spool/kestrel" in check.stdout and check.stdout.rstrip().endswith("OK")
    bad = podman.run(
        "exec", "kestreld-2", "kestreld", "--check-config", "/etc/hostname", check=False
    )
    assert bad.returncode == 2 and "not valid TOML" in bad.stderr
    podman.run("stop", "--time", "10", "kestreld-2")
    assert podman.inspect("kestreld-2", "{{.State.ExitCode}}") == "0"
    print(f"\nimage test: containers {time.monotonic() - started:.0f}s", file=sys.stderr)


def zookeeper_config(port: int, zk_hosts: str, prefix: str) -> str:
    """A config for a container on the host's network: free ports, the sets under ``prefix``."""
    return (
        'listen_address = "127.0.0.1"\n'
        f"port = {port}\n"
        'queue_path = "/var/spool/kestrel"\n'
        'log_format = "json"\n'
        "\n[zookeeper]\n"
        f'hosts = "{zk_hosts}"\n'
        f'path_prefix = "{prefix}"\n'
        'session_timeout = "4s"\n'
    )


def test_the_image_joins_zookeeper_server_sets(podman, image, tmp_path):
    if (reason := available()) is not None:
        pytest.skip(reason)
    zk = ZooKeeperProcess(tmp_path / "zookeeper")
    zk.start()
    reader = KazooClient(hosts=zk.hosts, timeout=10.0)
    try:
        reader.start(timeout=30)
        port = free_port()
        conf = tmp_path / "kestreld.conf"
        conf.write_text(zookeeper_config(port, zk.hosts, "/kestrel/image"))
        conf.chmod(0o644)  # read by the image's unprivileged user
        podman.run(
            "run", "-d", "--name", "kestreld-zk", "--network=host", *ULIMITS,
            "-v", "kestreld-zk-spool:/var/spool/kestrel",
            "-v", f"{conf}:/etc/kestreld/production.conf:ro", image,
        )  # fmt: skip
        wait_healthy(podman, "kestreld-zk")

        def members(name: str) -> list[dict]:
            path = f"/kestrel/image/{name}"
            if reader.exists(path) is None:
                return []
            return [json.loads(reader.get(f"{path}/{c}")[0]) for c in reader.get_children(path)]

        wait_until(lambda: members("read") and members("write"), "the image's member", 30)
        endpoint = {"host": "127.0.0.1", "port": port}
        for name in ("read", "write"):
            [member] = members(name)
            assert member["serviceEndpoint"] == endpoint
            assert member["status"] == "ALIVE"
        assert "zookeeper_connected" in [e["event"] for e in podman.events("kestreld-zk")]

        # a graceful stop leaves both sets at once (not a session timeout later)
        podman.run("stop", "--time", "10", "kestreld-zk")
        assert podman.inspect("kestreld-zk", "{{.State.ExitCode}}") == "0"
        assert members("read") == [] == members("write")
    finally:
        reader.stop()
        reader.close()
        zk.stop()
