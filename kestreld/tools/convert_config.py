"""``kestreld convert-config FILE.scala``: Kestrel's Scala config as kestreld TOML.

    kestreld convert-config production.scala > kestreld.conf

Reads the shapes Kestrel's own ``config/*.scala`` files use (2.4 and 3.0):
assignments in the ``new KestrelConfig { ... }`` body, ``default.KEY`` (and
3.0's ``default.defaultReader.KEY``), ``queues = new QueueBuilder { ... } ::
...`` (or ``List(...)``), ``aliases = new AliasBuilder { ... } :: ...``,
3.0's ``readers = Map("name" -> new QueueReaderBuilder { ... })``, sizes such
as ``16.megabytes``, durations such as ``1.second``, ``Some(...)`` and
``None``.  It prints the TOML on stdout and names every line it could not
translate on stderr.  Exit status 0 when everything was translated, 1 when
some line was not (the TOML is still printed), 2 when the file cannot be read.
The key mapping is :mod:`kestreld.config.kestrel`.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field

from kestreld.config import kestrel

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_SIZE_UNITS = {
    "byte": 1, "bytes": 1, "kilobyte": KiB, "kilobytes": KiB, "megabyte": MiB,
    "megabytes": MiB, "gigabyte": GiB, "gigabytes": GiB, "terabyte": GiB * 1024,
    "terabytes": GiB * 1024,
}  # fmt: skip
_DURATION_UNITS = {
    "nanosecond": 0.000001, "nanoseconds": 0.000001, "microsecond": 0.001,
    "microseconds": 0.001, "millisecond": 1, "milliseconds": 1, "second": 1000,
    "seconds": 1000, "minute": 60_000, "minutes": 60_000, "hour": 3_600_000,
    "hours": 3_600_000, "day": 86_400_000, "days": 86_400_000,
}  # fmt: skip
_FOREVER = {"Duration.MaxValue", "Duration.Top", "Duration.forever", "Duration.Inf"}
_UNLIMITED_SIZE = {"Long.MaxValue.bytes", "Long.MaxValue"}
_MAX_INT = {"Int.MaxValue"}

_TOKEN_RE = re.compile(
    r"""
    (?P<space>[ \t\r]+)
  | (?P<newline>\n)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<number>\d+(?:\.\d+)?[LlDdFf]?(?=[^\w]|$))
  | (?P<word>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)
  | (?P<op>::|->|[{}()=,+.])
    """,
    re.VERBOSE | re.DOTALL,
)


class ScalaError(Exception):
    """A construct this converter does not read (names the line)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(slots=True)
class Token:
    kind: str
    text: str
    line: int


def tokenize(text: str) -> list[Token]:
    tokens = []
    line = 1
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            tokens.append(Token("other", text[pos], line))
            pos += 1
            continue
        kind = m.lastgroup or "other"
        value = m.group()
        if kind not in ("space", "newline", "line_comment", "block_comment"):
            tokens.append(Token(kind, value, line))
        line += value.count("\n")
        pos = m.end()
    return tokens


# --- values ------------------------------------------------------------------------------


@dataclass(slots=True)
class Size:
    bytes: int | None  # None = unlimited


@dataclass(slots=True)
class Duration:
    ms: int | None  # None = forever


@dataclass(slots=True)
class Opaque:
    """An expression this converter cannot evaluate (kept as text for the report)."""

    text: str


@dataclass(slots=True)
class Assignment:
    path: str
    value: object
    line: int
    end_line: int


@dataclass(slots=True)
class New:
    cls: str
    body: list[Assignment]
    line: int


class Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self, offset: int = 0) -> Token | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def take(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise ScalaError(self.tokens[-1].line if self.tokens else 1, "unexpected end of file")
        self.pos += 1
        return tok

    def expect(self, text: str) -> Token:
        tok = self.take()
        if tok.text != text:
            raise ScalaError(tok.line, f"expected {text!r}, found {tok.text!r}")
        return tok

    def config(self) -> New:
        """``import ...`` lines, then ``new KestrelConfig { ... }``."""
        while (tok := self.peek()) is not None and tok.text == "import":
            line = tok.line
            while (t := self.peek()) is not None and t.line == line:
                self.pos += 1
        tok = self.peek()
        if tok is None or tok.text != "new":
            raise ScalaError(tok.line if tok else 1, "expected new KestrelConfig { ... }")
        value = self.expression()
        if not isinstance(value, New):
            raise ScalaError(tok.line, "expected new KestrelConfig { ... }")
        return value

    def body(self) -> list[Assignment]:
        """Assignments up to the closing brace (consumed)."""
        out = []
        while True:
            tok = self.peek()
            if tok is None:
                raise ScalaError(self.tokens[-1].line, "missing '}'")
            if tok.text == "}":
                self.pos += 1
                return out
            start = self.take()
            if start.kind != "word":
                raise ScalaError(start.line, f"expected an assignment, found {start.text!r}")
            self.expect("=")
            value = self.expression()
            end = self.tokens[self.pos - 1].line
            out.append(Assignment(start.text, value, start.line, end))

    def expression(self) -> object:
        first = self.operand()
        if (tok := self.peek()) is not None and tok.text == "::":
            items = [first]
            while (tok := self.peek()) is not None and tok.text == "::":
                self.pos += 1
                nxt = self.operand()
                if nxt != "Nil":
                    items.append(nxt)
            return items
        if (tok := self.peek()) is not None and tok.text == "+":
            # String concatenation, e.g. System.getenv("HOME") + "/queues": not evaluated.
            parts = [first]
            while (tok := self.peek()) is not None and tok.text == "+":
                self.pos += 1
                parts.append(self.operand())
            return Opaque(" + ".join(_show(p) for p in parts))
        return first

    def operand(self) -> object:
        tok = self.take()
        if tok.kind == "string":
            return json.loads(tok.text)
        if tok.kind == "number":
            number = tok.text.rstrip("LlDdFf")
            value: float | int = float(number) if "." in number else int(number)
            nxt = self.peek()
            if nxt is not None and nxt.text == "." and (unit := self.peek(1)) is not None:
                self.pos += 2
                return _with_unit(value, unit.text, tok.line)
            return value
        if tok.text == "new":
            cls = self.take()
            args: list[object] = []
            if (nxt := self.peek()) is not None and nxt.text == "(":
                self.pos += 1
                args = self.arguments()
            if (nxt := self.peek()) is None or nxt.text != "{":
                if args:  # new File("/path"): kept as text
                    return Opaque(f"{cls.text}({', '.join(_show(a) for a in args)})")
                return New(cls.text, [], cls.line)
            self.pos += 1
            return New(cls.text, self.body(), cls.line)
        if tok.kind == "word":
            word = tok.text
            if word in ("true", "false"):
                return word == "true"
            if word in ("None", "Nil"):
                return None if word == "None" else "Nil"
            if word in _FOREVER:
                return Duration(None)
            if word in _UNLIMITED_SIZE:
                return Size(None)
            if word in _MAX_INT:
                return None
            if word in ("Some", "List", "Map", "Seq") and (nxt := self.peek()) is not None:
                if nxt.text == "(":
                    self.pos += 1
                    args = self.arguments()
                    if word == "Some":
                        if len(args) != 1:
                            raise ScalaError(tok.line, "Some(...) takes one value")
                        return args[0]
                    if word == "Map":
                        return dict(args)  # type: ignore[arg-type]
                    return list(args)
            if (nxt := self.peek()) is not None and nxt.text == "(":
                self.pos += 1
                args = self.arguments()
                return Opaque(f"{word}({', '.join(_show(a) for a in args)})")
            return Opaque(word)
        if tok.text == "(":
            value = self.expression()
            self.expect(")")
            return value
        raise ScalaError(tok.line, f"unexpected {tok.text!r}")

    def arguments(self) -> list[object]:
        """Comma-separated expressions (``a -> b`` pairs too) up to ``)`` (consumed)."""
        args: list[object] = []
        while True:
            tok = self.peek()
            if tok is None:
                raise ScalaError(self.tokens[-1].line, "missing ')'")
            if tok.text == ")":
                self.pos += 1
                return args
            value = self.expression()
            if (nxt := self.peek()) is not None and nxt.text == "->":
                self.pos += 1
                value = (value, self.expression())
            args.append(value)
            if (nxt := self.peek()) is not None and nxt.text == ",":
                self.pos += 1


def _with_unit(value: float | int, unit: str, line: int) -> object:
    if unit in _SIZE_UNITS:
        return Size(int(value * _SIZE_UNITS[unit]))
    if unit in _DURATION_UNITS:
        return Duration(int(value * _DURATION_UNITS[unit]))
    raise ScalaError(line, f"unknown unit .{unit}")


def _show(value: object) -> str:
    if isinstance(value, Opaque):
        return value.text
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


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

    def config(self, top: New) -> Translation:
        for a in top.body:
            self.server_assignment(a)
        # Where Kestrel's defaults differ from kestreld's, keep Kestrel's behaviour.
        server = self.out.server
        if "listen_address" not in server:
            server["listen_address"] = "0.0.0.0"
            self.out.comments.append("# Kestrel's default listenAddress: 0.0.0.0")
        if "max_open_reads" not in server:
            server["max_open_reads"] = 1
            self.out.comments.append("# Kestrel's default maxOpenTransactions: 1")
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
        if key == "port" and value is None:
            self.problem(a, "kestreld always listens for memcache clients")
            return
        self.out.server[key] = value

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
    """The TOML and the lines not translated; raises ScalaError for an unreadable file."""
    top = Parser(tokenize(text)).config()
    if top.cls != "KestrelConfig":
        raise ScalaError(top.line, f"expected new KestrelConfig, found new {top.cls}")
    translation = Translator(text.splitlines()).config(top)
    return render_toml(translation, source), translation.problems


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
    try:
        toml, problems = convert(text, path)
    except ScalaError as e:
        print(f"kestreld: {path}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(toml)
    for p in problems:
        print(f"{path}:{p.line}: not translated: {p.text}  ({p.reason})", file=sys.stderr)
    return 1 if problems else 0
