"""The Docker image, checked without a Docker engine.

The Dockerfile is parsed, and its promises are checked against the repository:
the files it copies exist and pass ``.dockerignore``, the config path in CMD
and HEALTHCHECK is where the config is copied, the VOLUME is production.conf's
``queue_path``, EXPOSE lists its ports, the user is created and not root.

Then the image is re-enacted: a wheel is built from exactly the files the
build stage copies, installed into a fresh virtual environment (as the image
installs it), and the image's ENTRYPOINT + CMD run with production.conf
adapted to a temporary folder and free loopback ports.  Its HEALTHCHECK
command must pass while it serves and fail once it stopped, and SIGTERM must
stop it cleanly well within ``docker stop``'s 10 seconds.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import repo
from kestreld_process import Conn, KestreldProcess
from prometheus_client.parser import text_string_to_metric_families

ROOT = repo.ROOT
DOCKERFILE = ROOT / "Dockerfile"
PRODUCTION_CONF = ROOT / "config" / "production.conf"
DOCKER_STOP_TIMEOUT = 10.0


@dataclass(slots=True)
class Instruction:
    keyword: str  # upper case
    args: str  # the rest, continuation lines joined


def parse_dockerfile(text: str) -> list[list[Instruction]]:
    """Instructions grouped by build stage (one list per FROM); ARGs before the first FROM are dropped
    (see :func:`global_args`)."""
    stages: list[list[Instruction]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        keyword, _, args = logical.strip().partition(" ")
        logical = ""
        instruction = Instruction(keyword.upper(), args.strip())
        if instruction.keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def global_args(text: str) -> dict[str, str]:
    """``ARG NAME=default`` lines before the first FROM (what ``${NAME}`` in FROM means)."""
    out = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["FROM"]:
            break
        if words[:1] == ["ARG"]:
            name, _, default = words[1].partition("=")
            out[name] = default
    return out


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form instruction (fails for shell form)."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def healthcheck_command(stage: list[Instruction]) -> list[str]:
    args = only(stage, "HEALTHCHECK").args
    options, _, command = args.partition("CMD ")
    assert options.strip() == "" or options.strip().startswith("--"), args
    return exec_form(command)


def copies(stage: list[Instruction]) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context (not --from=)."""
    out = []
    for instruction in stage:
        if instruction.keyword != "COPY":
            continue
        words = shlex.split(instruction.args)
        if any(w.startswith("--from") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        out.append((words[:-1], words[-1]))
    return out


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (last match wins)."""
    parents = [str(p) for p in Path(path).parents if str(p) != "."]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase(p, pattern) for p in [path, *parents]):
            excluded = not negate
    return excluded


def ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.fixture(scope="module")
def stages() -> list[list[Instruction]]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def image(stages) -> list[Instruction]:
    """The final stage: what `docker run` runs."""
    return stages[-1]


@pytest.fixture(scope="module")
def production() -> dict:
    return tomllib.loads(PRODUCTION_CONF.read_text())


def config_path_of(command: list[str]) -> str:
    return command[command.index("--config") + 1]


# --- the Dockerfile's promises ------------------------------------------------------------


def test_image_is_slim_python_3_11_or_newer(stages):
    defaults = global_args(DOCKERFILE.read_text())
    assert set(defaults) == {"BASE"}  # --build-arg BASE=... swaps the base of both stages
    for stage in stages:
        base = stage[0].args.split()[0]
        assert base == "${BASE}"
        base = defaults["BASE"]
        m = re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?", base)
        assert m and int(m.group(1)) >= 11, base


def test_copied_files_exist_and_pass_dockerignore(stages):
    patterns = ignore_patterns()
    checked = 0
    for stage in stages:
        for sources, _ in copies(stage):
            for source in sources:
                path = ROOT / source
                assert path.exists(), f"COPY {source}: no such file"
                files = [path] if path.is_file() else [p for p in path.rglob("*.py")]
                for f in files:
                    rel = str(f.relative_to(ROOT))
                    assert not dockerignored(rel, patterns), f"{rel} is excluded by .dockerignore"
                    checked += 1
    assert checked > 10
    assert dockerignored(".venv/bin/python", patterns)
    assert dockerignored("kestreld/__pycache__/cli.cpython-311.pyc", patterns)
    assert dockerignored("tests/conftest.py", patterns)


def test_entrypoint_cmd_and_healthcheck_are_exec_form(image):
    # exec form: kestreld is PID 1 and receives docker stop's SIGTERM itself
    assert exec_form(only(image, "ENTRYPOINT").args) == ["kestreld"]
    assert exec_form(only(image, "CMD").args)[0].startswith("--")
    assert healthcheck_command(image)[:2] == ["kestreld", "ping"]
    stop_signal = [i.args for i in image if i.keyword == "STOPSIGNAL"]
    assert stop_signal in ([], ["SIGTERM"])


def test_config_is_copied_where_cmd_and_healthcheck_read_it(image):
    cmd_config = config_path_of(exec_form(only(image, "CMD").args))
    assert config_path_of(healthcheck_command(image)) == cmd_config
    assert (["config/production.conf"], cmd_config) in copies(image)


def test_volume_is_the_production_queue_path(image, production):
    volume = only(image, "VOLUME").args
    volumes = exec_form(volume) if volume.startswith("[") else volume.split()
    assert volumes == [production["queue_path"]]


def test_exposed_ports_are_the_production_ports(image, production):
    exposed = {int(p.split("/")[0]) for p in only(image, "EXPOSE").args.split()}
    ports = ("port", "text_port", "thrift_port", "metrics_port")
    assert exposed == {production[key] for key in ports if production.get(key)}
    assert all(port >= 1024 for port in exposed)  # no privilege needed to bind them
    assert production["listen_address"] == "0.0.0.0"  # reachable through -p


def test_runs_as_an_unprivileged_user_the_image_creates(image, production):
    user = only(image, "USER").args.split(":")[0]
    assert user not in ("root", "0")
    runs = " ".join(i.args for i in image if i.keyword == "RUN")
    assert re.search(rf"useradd .*\b{user}\b", runs)
    assert re.search(rf"chown {user}(:\w+)? {re.escape(production['queue_path'])}", runs)
    keywords = [i.keyword for i in image]
    # the volume's folder belongs to the user before VOLUME (later changes would be lost)
    assert keywords.index("USER") < keywords.index("VOLUME")


def test_image_installs_the_server_and_zookeeper_without_spark(stages):
    runs = " ".join(i.args for stage in stages for i in stage if i.keyword == "RUN")
    assert "spark" not in runs.lower()
    # The one extra is ZooKeeper's ([zookeeper] server sets work in a docker run deployment).
    assert set(re.findall(r"kestreld\[([^\]]*)\]|\.\[([^\]]*)\]", runs)) <= {
        ("zookeeper", ""),
        ("", "zookeeper"),
    }
    assert "kazoo.client" in runs


# --- the image re-enacted -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class Installed:
    venv: Path
    image_paths: dict[str, str]  # path in the image -> path here
    entrypoint: list[str]
    cmd: list[str]
    healthcheck: list[str]
    queue_path: Path
    port: int
    metrics_port: int

    def adapt(self, command: list[str]) -> list[str]:
        """An image command with the image's paths and programs mapped to this machine."""
        out = [self.image_paths.get(word, word) for word in command]
        out[0] = str(self.venv / "bin" / out[0])
        return out

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.venv / 'bin'}:{env.get('PATH', '')}"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env


class ImageProcess(KestreldProcess):
    """The image's ENTRYPOINT + CMD, run from the fresh environment."""

    def __init__(self, installed: Installed) -> None:
        super().__init__(installed.queue_path, env=installed.env())
        self.installed = installed

    def command(self) -> list[str]:
        return self.installed.adapt(self.installed.entrypoint + self.installed.cmd)


@pytest.fixture(scope="module")
def installed(image, production, tmp_path_factory) -> Installed:
    tmp = tmp_path_factory.mktemp("image")
    # The build stage: a context holding only what its COPY lines copy.
    context = tmp / "context"
    for sources, _ in copies(parse_dockerfile(DOCKERFILE.read_text())[0]):
        for source in sources:
            src = ROOT / source
            if src.is_dir():
                # as .dockerignore: no caches, no build products of an in-place build
                ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.c")
                shutil.copytree(src, context / source, ignore=ignore)
            else:
                (context / source).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, context / source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels = tmp / "wheels"
    # as the image's build stage: no KESTRELD_NO_EXTENSIONS there (CI's second run sets it).
    # Without the profile-guided training run (CI sets KESTRELD_PGO=1): the image compiles
    # the same modules, and the training would double a build that shares the machine.
    dropped = ("KESTRELD_NO_EXTENSIONS", "KESTRELD_PGO")
    build_env = {k: v for k, v in os.environ.items() if k not in dropped}
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(wheels), str(context)],
        check=True,
        timeout=300,
        env=build_env,
    )
    (wheel,) = wheels.glob("kestreld-*.whl")
    # The server stage: a fresh environment with the wheel and its dependencies only.
    venv = tmp / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    subprocess.run(
        [*pip, "--python", str(venv / "bin" / "python"), "install", str(wheel)],
        check=True,
        timeout=300,
    )
    # production.conf as mounted at its image path, with this test's folder and ports.
    queue_path = tmp / "spool" / "kestrel"
    queue_path.mkdir(parents=True)  # the image creates it (and owns it to its user)
    port, metrics_port = free_port(), free_port()
    text = PRODUCTION_CONF.read_text()
    for key, value in [
        ("listen_address", '"127.0.0.1"'),
        ("port", str(port)),
        # Kestrel's text and thrift ports: free ones too (2222/2229 may be taken here).
        ("text_port", str(free_port())),
        ("thrift_port", str(free_port())),
        ("queue_path", json.dumps(str(queue_path))),
        ("metrics_port", str(metrics_port)),
    ]:
        text, n = re.subn(rf"(?m)^{key}\s*=.*$", f"{key} = {value}", text)
        assert n == 1, key
    config = tmp / "etc" / "kestreld" / "production.conf"
    config.parent.mkdir(parents=True)
    config.write_text(text)
    cmd = exec_form(only(image, "CMD").args)
    return Installed(
        venv=venv,
        image_paths={config_path_of(cmd): str(config), production["queue_path"]: str(queue_path)},
        entrypoint=exec_form(only(image, "ENTRYPOINT").args),
        cmd=cmd,
        healthcheck=healthcheck_command(image),
        queue_path=queue_path,
        port=port,
        metrics_port=metrics_port,
    )


def healthcheck(installed: Installed) -> subprocess.CompletedProcess:
    return subprocess.run(
        installed.adapt(installed.healthcheck),
        capture_output=True,
        text=True,
        timeout=30,
        env=installed.env(),
        cwd=installed.queue_path.parent,
    )


def test_fresh_environment_has_the_server_and_uvloop_but_no_spark(installed):
    python = str(installed.venv / "bin" / "python")
    probe = (
        "import importlib.util as u, kestreld;"
        "print(kestreld.__file__);"
        "print(u.find_spec('uvloop') is not None, u.find_spec('pyspark') is not None)"
    )
    out = subprocess.run(
        [python, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env=installed.env(),
        cwd="/",
    ).stdout.split("\n")
    assert out[0].startswith(str(installed.venv))
    assert out[1] == "True False"


@pytest.mark.skipif(not shutil.which("gcc"), reason="no C compiler: the wheel is pure Python")
def test_image_runs_the_compiled_implementation(installed):
    # The build stage installs gcc, so the wheel holds the Cython-compiled hot path.
    env = {k: v for k, v in installed.env().items() if k != "KESTRELD_NO_EXTENSIONS"}
    version = subprocess.run(
        installed.adapt(["kestreld", "--version"]),
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd="/",
    ).stdout
    assert version.strip().endswith("(compiled)"), version


def test_image_command_serves_passes_its_healthcheck_and_stops_on_sigterm(installed):
    proc = ImageProcess(installed)
    assert healthcheck(installed).returncode != 0  # not up yet: unhealthy
    proc.start()
    try:
        assert proc.port == installed.port
        event = proc.events("listening")[0]
        assert event["queue_path"] == str(installed.queue_path)
        check = healthcheck(installed)
        assert check.returncode == 0, check.stderr
        # ping answers the version, then the status when it may read it
        assert check.stdout.splitlines()[0].strip() == event["version"]
        c = Conn(proc.connect())
        for i in range(100):
            assert c.set("jobs", f"job{i}") == b"STORED"
        assert c.get("jobs/open") == b"job0"  # an open read at shutdown goes back
        url = f"http://127.0.0.1:{installed.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
        items = families["kestreld_queue_items"].samples
        assert [(s.labels["queue"], s.value) for s in items] == [("jobs", 99)]
        started = time.monotonic()
        assert proc.stop(timeout=DOCKER_STOP_TIMEOUT) == 0
        seconds = time.monotonic() - started
        assert seconds < DOCKER_STOP_TIMEOUT / 2, f"SIGTERM to exit took {seconds:.1f}s"
        assert proc.events("stopped")
        assert healthcheck(installed).returncode != 0  # stopped: unhealthy
        proc.start()
        c = Conn(proc.connect())
        assert [c.get("jobs") for _ in range(100)] == [f"job{i}".encode() for i in range(100)]
        assert c.get("jobs") is None
    finally:
        proc.stop()
