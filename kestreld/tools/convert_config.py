"""``kestreld convert-config FILE.scala``: Kestrel's Scala config as kestreld TOML.

    kestreld convert-config production.scala > kestreld.conf

Reads the shapes Kestrel's own ``config/*.scala`` files use (2.4 and 3.0):
assignments in the ``new KestrelConfig { ... }`` body, ``default.KEY`` (and
3.0's ``default.defaultReader.KEY``), ``queues = new QueueBuilder { ... } ::
...`` (or ``List(...)``), ``aliases = new AliasBuilder { ... } :: ...``,
3.0's ``readers = Map("name" -> new QueueReaderBuilder { ... })``, 2.4's
``zookeeper = Some(new ZooKeeperBuilder { ... })`` (as ``[zookeeper]``), sizes
such as ``16.megabytes``, durations such as ``1.second``, ``Some(...)`` and
``None``; :mod:`kestreld.tools.scala_config` reads the Scala.  It prints the
TOML of everything it could translate on stdout and names every line it could
not (a setting without a kestreld equivalent, or Scala it does not evaluate:
``sys.props``, ``if``, helper ``def``s) on stderr with its line number.  Exit
status 0 when everything was translated, 1 when some line was not (the TOML is
still printed), 2 when the file cannot be read or holds no
``new KestrelConfig { ... }``.  The queue key mapping is
:mod:`kestreld.config.kestrel`; the server settings kestreld gained since
(ports, session trace, statuses, connection limits) are :data:`SERVER_SETTINGS`.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field

from kestreld.config import kestrel
from kestreld.tools.scala_config import (
    Assignment,
    Duration,
    GiB,
    KiB,
    MiB,
    New,
    Opaque,
    ScalaError,
    Size,
    read_config,
)

#: How convert-config reads the value of each Kestrel server setting kestreld has (the
#: names are :data:`kestreld.config.kestrel.SERVER_KEYS`): ``port`` (an ``Option[Int]``,
#: None = off), ``count`` (``Option[Int]``, None = no limit), ``bool``, ``str``,
#: ``duration`` or ``status`` (Kestrel's ``Up``, ``ReadOnly``, ...).
SERVER_SETTINGS: dict[str, str] = {
    "memcacheListenPort": "port",
    "textListenPort": "port",
    "thriftListenPort": "port",
    "enableSessionTrace": "bool",
    "defaultStatus": "status",
    "statusFile": "str",
    "statusChangeGracePeriod": "duration",
    "connectionLimitRefuseWrites": "count",
    "connectionLimitRefuseReads": "count",
}
_STATUSES = ("up", "readonly", "quiescent", "writeavoid")  # Kestrel's Up, ReadOnly, ...
#: Kestrel 2.4's ZooKeeperBuilder ACLs -> kestreld's zookeeper.acl.
ZOOKEEPER_ACLS = {
    "OpenUnsafeACL": "open_unsafe",
    "EveryoneReadCreatorAllACL": "everyone_read_creator_all",
}
ZOOKEEPER_PORT = 2181  # ZooKeeperBuilder.port's default


# --- translation ---------------------------------------------------------------------------


@dataclass(slots=True)
class Problem:
    line: int
    text: str
    reason: str


@dataclass
class Translation:
    server: dict[str, object] = field(default_factory=dict)
    defaults: dict[str, object] = field(default_factory=dict)
    queues: dict[str, dict[str, object]] = field(default_factory=dict)
    aliases: dict[str, list[str]] = field(default_factory=dict)
    zookeeper: dict[str, object] = field(default_factory=dict)
    comments: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


class Translator:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.out = Translation()

    def source(self, a: Assignment) -> str:
        return " ".join(line.strip() for line in self.lines[a.line - 1 : a.line])

    def problem(self, a: Assignment, reason: str) -> None:
        self.out.problems.append(Problem(a.line, self.source(a), reason))

    def not_needed(self, a: Assignment, reason: str) -> None:
        self.out.comments.append(f"# line {a.line}: {self.source(a)}  -- not needed: {reason}")

    def config(self, top: New, also_set: frozenset[str] = frozenset()) -> Translation:
        for a in top.body:
            self.server_assignment(a)
        # Where Kestrel's defaults differ from kestreld's, keep Kestrel's behaviour (unless
        # the key is set, even by a line not translated: a default would hide that line).
        server = self.out.server
        written = {a.path for a in top.body} | also_set
        if "listenAddress" not in written:
            server["listen_address"] = "0.0.0.0"
            self.out.comments.append("# Kestrel's default listenAddress: 0.0.0.0")
        if "maxOpenTransactions" not in written:
            server["max_open_reads"] = 1
            self.out.comments.append("# Kestrel's default maxOpenTransactions: 1")
        for key, port in (("textListenPort", 2222), ("thriftListenPort", 2229)):
            if key not in written:
                self.out.comments.append(
                    f"# Kestrel 2.4's default {key} was {port}: off here unless set"
                )
        return self.out

    def server_assignment(self, a: Assignment) -> None:
        path = a.path
        if path.startswith("default.defaultReader."):
            self.queue_key(a, path.removeprefix("default.defaultReader."), self.out.defaults, "")
            return
        if path.startswith("default."):
            self.queue_key(a, path.removeprefix("default."), self.out.defaults, "")
            return
        if path == "queues":
            for builder in _builders(a.value):
                self.queue_builder(a, builder)
            return
        if path == "aliases":
            for builder in _builders(a.value):
                self.alias_builder(a, builder)
            return
        if path == "loggers":
            self.loggers(a)
            return
        if path == "zookeeper":
            self.zookeeper(a)
            return
        if path in SERVER_SETTINGS:
            self.server_setting(a, kestrel.SERVER_KEYS[path], SERVER_SETTINGS[path])
            return
        if path == "admin.httpPort":
            port = a.value
            if isinstance(port, int):
                self.out.server["metrics_port"] = port
                self.out.comments.append(
                    f"# line {a.line}: admin.httpPort -> metrics_port (/metrics and /stats.json)"
                )
            else:
                self.problem(a, "expected a port number")
            return
        if path == "debugLogQueues":
            if a.value in ([], None, "Nil"):
                return
            self.not_needed(a, kestrel.NOT_NEEDED[path])
            return
        if path in kestrel.NOT_NEEDED:
            self.not_needed(a, kestrel.NOT_NEEDED[path])
            return
        if path in kestrel.UNTRANSLATED:
            if a.value is None and path not in ("loggers",):
                return  # None: the feature is off, as in kestreld
            self.problem(a, kestrel.UNTRANSLATED[path])
            return
        key = kestrel.SERVER_KEYS.get(path)
        if key is None:
            self.problem(a, "unknown Kestrel setting")
            return
        value = a.value
        if key in ("client_timeout", "expiration_timer_frequency"):
            value = 0 if value is None else value
            if isinstance(value, Duration):
                value = 0 if value.ms is None else value.ms
        if isinstance(value, Opaque):
            self.problem(a, f"cannot evaluate {value.text}")
            return
        if isinstance(value, Duration | Size):
            self.problem(a, "expected a plain value")
            return
        self.out.server[key] = value

    def server_setting(self, a: Assignment, key: str, kind: str) -> None:
        value = a.value
        if isinstance(value, Opaque) and kind == "status":
            status = value.text.rpartition(".")[2].lower()
            if status in _STATUSES:
                self.out.server[key] = status
            else:
                self.problem(a, f"unknown status {value.text} (expected Up, ReadOnly, ...)")
            return
        if isinstance(value, Opaque):
            self.problem(a, f"cannot evaluate {value.text}")
        elif isinstance(value, bool) and kind != "bool":
            self.problem(a, f"expected {_KINDS[kind]}")
        elif kind == "port" and (value is None or isinstance(value, int)):
            self.out.server[key] = 0 if value is None else value  # None: that port is off
        elif kind == "count" and (value is None or isinstance(value, int)):
            if value is not None:
                self.out.server[key] = value
        elif kind == "bool" and isinstance(value, bool):
            self.out.server[key] = value
        elif kind == "str" and isinstance(value, str):
            self.out.server[key] = value
        elif kind == "duration" and isinstance(value, Duration) and value.ms is not None:
            self.out.server[key] = _toml_value(value)
        else:
            self.problem(a, f"expected {_KINDS[kind]}")

    def zookeeper(self, a: Assignment) -> None:
        """``zookeeper = Some(new ZooKeeperBuilder { ... })``: the ``[zookeeper]`` table."""
        builder = a.value
        if builder is None:
            return  # None: no server sets, as in kestreld without [zookeeper]
        if not isinstance(builder, New) or builder.cls != "ZooKeeperBuilder":
            self.problem(a, "expected Some(new ZooKeeperBuilder { ... })")
            return
        table: dict[str, object] = {}
        guarded = True  # False when the ACL or credentials were not translated
        host: str | None = None
        port: int = ZOOKEEPER_PORT
        for inner in builder.body:
            key, value = inner.path, inner.value
            if key == "host" and isinstance(value, str) and value:
                host = value
            elif key == "port" and isinstance(value, int):
                port = value
            elif key == "pathPrefix" and isinstance(value, str):
                table["path_prefix"] = value
            elif key == "sessionTimeout" and isinstance(value, Duration) and value.ms:
                table["session_timeout"] = _toml_value(value)
            elif key == "credentials" and value is None:
                pass
            elif key == "credentials" and _is_pair(value):
                user, password = value  # type: ignore[misc]
                table["credentials"] = f"{user}:{password}"
            elif key == "acl" and isinstance(value, Opaque) and value.text in ZOOKEEPER_ACLS:
                table["acl"] = ZOOKEEPER_ACLS[value.text]
            elif key in ("clientInitializer", "serverSetInitializer") and value is None:
                pass
            elif key in ("clientInitializer", "serverSetInitializer"):
                self.problem(inner, "kestreld runs no code from its config")
            elif key == "acl":
                self.problem(inner, "expected OpenUnsafeACL or EveryoneReadCreatorAllACL")
                guarded = False
            elif key in ("host", "port", "pathPrefix", "sessionTimeout", "credentials"):
                self.problem(inner, f"cannot translate this {key}")
                guarded = guarded and key != "credentials"
            else:
                self.problem(inner, "unknown ZooKeeperBuilder setting")
        if not guarded:
            # Written without them, the members would be open to any ZooKeeper session.
            self.problem(a, "[zookeeper] left out: its acl or credentials were not translated")
            return
        if host is None:
            self.problem(a, "ZooKeeperBuilder needs a host")
            return
        if "path_prefix" not in table:
            self.problem(a, "ZooKeeperBuilder needs a pathPrefix")
            return
        # Kestrel's host is one name (often a DNS name for the ensemble) and one port.
        table = {"hosts": f"{host}:{port}", **table}
        self.out.zookeeper = table

    def loggers(self, a: Assignment) -> None:
        levels = []
        others = False
        for builder in _builders(a.value):
            for inner in builder.body:
                if inner.path == "level" and isinstance(inner.value, Opaque):
                    levels.append(inner.value.text.rpartition(".")[2].lower())
                elif inner.path != "node":
                    others = True
        if levels:
            level = {"fatal": "critical", "trace": "debug", "all": "debug"}.get(
                levels[0], levels[0]
            )
            if level in ("debug", "info", "warning", "error", "critical"):
                self.out.server["log_level"] = level
        if others:
            self.problem(a, kestrel.UNTRANSLATED["loggers"])

    def queue_builder(self, a: Assignment, builder: New) -> None:
        if builder.cls not in ("QueueBuilder",):
            self.problem(a, f"expected new QueueBuilder, found {builder.cls}")
            return
        names = [x for x in builder.body if x.path == "name"]
        if not names or not isinstance(names[0].value, str):
            self.problem(a, f"the QueueBuilder of line {builder.line} has no name")
            return
        name = names[0].value
        table = self.out.queues.setdefault(name, {})
        for inner in builder.body:
            if inner.path == "name":
                continue
            if inner.path.startswith("defaultReader."):
                self.queue_key(inner, inner.path.removeprefix("defaultReader."), table, name)
            elif inner.path == "readers":
                self.readers(inner, name)
            else:
                self.queue_key(inner, inner.path, table, name)

    def readers(self, a: Assignment, queue: str) -> None:
        if not isinstance(a.value, dict):
            self.problem(a, 'expected readers = Map("name" -> new QueueReaderBuilder { ... })')
            return
        for rname, builder in a.value.items():
            if not isinstance(rname, str) or not isinstance(builder, New):
                self.problem(a, 'expected "name" -> new QueueReaderBuilder { ... }')
                continue
            table = self.out.queues.setdefault(f"{queue}+{rname}", {})
            for inner in builder.body:
                self.queue_key(inner, inner.path, table, f"{queue}+{rname}")

    def alias_builder(self, a: Assignment, builder: New) -> None:
        values = {x.path: x for x in builder.body}
        name = values.get("name")
        dests = values.get("destinationQueues")
        if builder.cls != "AliasBuilder" or name is None or not isinstance(name.value, str):
            self.problem(a, "expected new AliasBuilder { name = ...; destinationQueues = ... }")
            return
        if dests is None or not isinstance(dests.value, list):
            self.problem(dests or a, 'expected destinationQueues = List("queue", ...)')
            return
        for key, inner in values.items():
            if key not in ("name", "destinationQueues"):
                self.problem(inner, "unknown AliasBuilder setting")
        self.out.aliases[name.value] = [str(d) for d in dests.value]

    def queue_key(self, a: Assignment, key: str, table: dict[str, object], queue: str) -> None:
        value = a.value
        if key in ("saveArchivedJournals", "checkpointTimer"):
            self.server_wide(a, key, value, queue)
            return
        if key in kestrel.NOT_NEEDED:
            self.not_needed(a, kestrel.NOT_NEEDED[key])
            return
        if key in kestrel.UNTRANSLATED:
            if value is None:
                return
            self.problem(a, kestrel.UNTRANSLATED[key])
            return
        target = kestrel.QUEUE_KEYS.get(key)
        if target is None:
            self.problem(a, "unknown Kestrel queue setting")
            return
        if isinstance(value, Opaque):
            self.problem(a, f"cannot evaluate {value.text}")
            return
        if target == "sync_journal" and isinstance(value, bool):
            value = Duration(0 if value else None)  # Kestrel 2.x's boolean form
        if target == "max_item_size" and isinstance(value, Size) and value.bytes is not None:
            if value.bytes > 16 * MiB:
                self.problem(a, "kestreld's journal format caps items at 16 MiB")
                return
        if target in ("max_items", "max_expire_sweep") and value is None:
            table[target] = "unlimited"
            return
        table[target] = _toml_value(value)

    def server_wide(self, a: Assignment, key: str, value: object, queue: str) -> None:
        target = "archive_path" if key == "saveArchivedJournals" else "checkpoint_interval"
        if queue:
            self.problem(a, f"{target} is server-wide in kestreld; set it at the top level")
            return
        if key == "saveArchivedJournals":
            if value is None:
                return
            if isinstance(value, Opaque) and (m := re.fullmatch(r'File\("(.*)"\)', value.text)):
                self.out.server[target] = m.group(1)
                return
            if isinstance(value, str):
                self.out.server[target] = value
                return
            self.problem(a, 'expected Some(new File("/path"))')
            return
        if isinstance(value, Duration) and value.ms is not None:
            self.out.server[target] = _toml_value(value)
        else:
            self.problem(a, "expected a duration")


_KINDS = {
    "port": "a port number or None",
    "count": "a number or None",
    "bool": "true or false",
    "str": "a string",
    "duration": "a duration such as 10.seconds",
}


def _is_pair(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _builders(value: object) -> list[New]:
    if isinstance(value, New):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, New)]
    return []


def _toml_value(value: object) -> object:
    if isinstance(value, Size):
        if value.bytes is None:
            return "unlimited"
        for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
            if value.bytes >= size and value.bytes % size == 0:
                return f"{value.bytes // size}{unit}"
        return value.bytes
    if isinstance(value, Duration):
        if value.ms is None:
            return "never"
        for unit, ms in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if value.ms >= ms and value.ms % ms == 0:
                return f"{value.ms // ms}{unit}"
        return f"{value.ms}ms"
    if value is None:
        return "none"
    return value


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _render_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_render_value(v) for v in value) + "]"
    return json.dumps(str(value))


def render_toml(t: Translation, source: str) -> str:
    lines = [f"# kestreld config converted from {source} by kestreld convert-config"]
    lines += t.comments
    if t.server:
        lines.append("")
        lines += [f"{k} = {_render_value(v)}" for k, v in t.server.items()]
    if t.defaults:
        lines.append("")
        lines.append("# defaults of every queue")
        lines += [f"{k} = {_render_value(v)}" for k, v in t.defaults.items()]
    if t.zookeeper:
        lines.append("")
        lines.append("[zookeeper]")
        lines += [f"{k} = {_render_value(v)}" for k, v in t.zookeeper.items()]
    for name, table in t.queues.items():
        lines.append("")
        lines.append(f"[queues.{_key(name)}]")
        lines += [f"{k} = {_render_value(v)}" for k, v in table.items()]
    for name, dests in t.aliases.items():
        lines.append("")
        lines.append(f"[aliases.{_key(name)}]")
        lines.append(f"destination_queues = {_render_value(dests)}")
    return "\n".join(lines) + "\n"


def convert(text: str, source: str = "config") -> tuple[str, list[Problem]]:
    """The TOML and every line not translated; raises ScalaError when there is no config to read.

    A statement the Scala reader cannot read is named like a setting without a
    kestreld equivalent: the rest of the file is translated all the same.
    """
    scala = read_config(text)
    lines = text.splitlines()
    also_set = frozenset(s.key for s in scala.skipped if s.key is not None)
    translation = Translator(lines).config(scala.top, also_set)
    problems = list(translation.problems)
    for skipped in scala.skipped:
        reason = skipped.reason
        if skipped.end_line > skipped.line:
            reason += f"; lines {skipped.line}-{skipped.end_line}"
        problems.append(Problem(skipped.line, _line(lines, skipped.line), reason))
    problems.sort(key=lambda p: p.line)
    return render_toml(translation, source), problems


def _line(lines: list[str], number: int) -> str:
    return lines[number - 1].strip() if 0 < number <= len(lines) else ""


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: kestreld convert-config FILE.scala > kestreld.conf", file=sys.stderr)
        return 2
    path = argv[0]
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        print(f"kestreld: {path}: {e.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError:
        print(f"kestreld: {path}: not a Kestrel config: not UTF-8 text", file=sys.stderr)
        return 2
    try:
        toml, problems = convert(text, path)
    except ScalaError as e:
        print(f"kestreld: {path}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(toml)
    for p in problems:
        print(f"{path}:{p.line}: not translated: {p.text}  ({p.reason})", file=sys.stderr)
    return 1 if problems else 0
