"""Reading a Kestrel Scala config: the statements ``kestreld convert-config`` translates.

A Kestrel config is a Scala script whose value is ``new KestrelConfig { ... }``.
:func:`read_config` finds that expression and reads the assignments of its body
(and of the ``new QueueBuilder { ... }`` and other builders inside it) into
:class:`Assignment` records whose values are Python values, :class:`Size`,
:class:`Duration`, :class:`New` or, for an expression it cannot evaluate,
:class:`Opaque`.

Real configs also carry Scala this reader does not evaluate: ``sys.props``
look-ups, ``if``s, helper ``def``s, ``val``s, ``object``s.  A statement it
cannot read is skipped up to its end (the next line outside brackets, or a
``;``) and returned as a :class:`Skipped` naming its first line, so that the
rest of the file is still read.  ``val NAME = <literal>`` is remembered and
its value used where ``NAME`` appears later.  Only a file with no
``new KestrelConfig { ... }`` at all, or with brackets that never close, is
refused (:class:`ScalaError`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

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
_OPEN = {"(": ")", "{": "}", "[": "]"}
#: A line ending in one of these goes on with the next line (Scala's rule, roughly).
_CONTINUES = {"=", "::", "+", "-", "*", "/", ".", ",", "->", "=>", "(", "{", "[", "&&", "||"}

_TOKEN_RE = re.compile(
    r"""
    (?P<space>[ \t\r]+)
  | (?P<newline>\n)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<number>\d+(?:\.\d+)?[LlDdFf]?(?=[^\w]|$))
  | (?P<word>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)
  | (?P<op>::|->|=>|&&|\|\||==|!=|[{}()\[\]=,+.;])
    """,
    re.VERBOSE | re.DOTALL,
)


class ScalaError(Exception):
    """A statement not read (names the line); ``fatal`` when the whole file cannot be read."""

    def __init__(self, line: int, message: str, fatal: bool = False) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.reason = message
        self.fatal = fatal


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
    """An expression this reader cannot evaluate (kept as text for the report)."""

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


@dataclass(slots=True)
class Skipped:
    """A statement not read: its first and last line, and why."""

    line: int
    end_line: int
    reason: str
    key: str | None = None  # the setting it assigns, when it reads as ``key = ...``


@dataclass(slots=True)
class ScalaConfig:
    """The ``new KestrelConfig { ... }`` of a file, and every statement not read."""

    top: New
    skipped: list[Skipped] = field(default_factory=list)
    values: dict[str, tuple[int, object]] = field(default_factory=dict)  # val name -> line, value


class Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.skipped: list[Skipped] = []
        self.values: dict[str, tuple[int, object]] = {}
        self.top: New | None = None  # a KestrelConfig held by a top-level val
        self.top_name: str | None = None  # ... and that val's name

    def peek(self, offset: int = 0) -> Token | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def take(self) -> Token:
        tok = self.peek()
        if tok is None:
            line = self.tokens[-1].line if self.tokens else 1
            raise ScalaError(line, "unexpected end of file", fatal=True)
        self.pos += 1
        return tok

    def expect(self, text: str) -> Token:
        tok = self.take()
        if tok.text != text:
            raise ScalaError(tok.line, f"expected {text!r}, found {tok.text!r}")
        return tok

    # --- statements -----------------------------------------------------------------------

    def config(self) -> ScalaConfig:
        """Top-level statements up to ``new KestrelConfig { ... }``; what follows is skipped."""
        top: New | None = None
        while (tok := self.peek()) is not None:
            if top is None and self.top is not None:
                top = self.top  # val config = new KestrelConfig { ... }
            if tok.text == "import":
                self.skip_statement()
            elif top is None and tok.text == "new" and (cls := self.peek(1)) is not None:
                if cls.text != "KestrelConfig":
                    raise ScalaError(
                        tok.line, f"expected new KestrelConfig, found new {cls.text}", fatal=True
                    )
                value = self.operand()
                assert isinstance(value, New)
                top = value
            elif tok.text == ";" or tok.text == self.top_name:
                self.pos += 1  # the script's value: the val holding the config
            else:
                self.statement_or_skip(top_level=True)
        top = top or self.top
        if top is None:
            raise ScalaError(1, "not a Kestrel config: no new KestrelConfig { ... }", fatal=True)
        return ScalaConfig(top, sorted(self.skipped, key=lambda s: s.line), self.values)

    def body(self) -> list[Assignment]:
        """Assignments up to the closing brace (consumed); other statements are skipped."""
        out = []
        while True:
            tok = self.peek()
            if tok is None:
                raise ScalaError(self.tokens[-1].line, "missing '}'", fatal=True)
            if tok.text == "}":
                self.pos += 1
                return out
            if tok.text == ";":
                self.pos += 1
                continue
            if tok.text == "import":
                self.skip_statement()
                continue
            assignment = self.statement_or_skip(top_level=False)
            if assignment is not None:
                out.append(assignment)

    def statement_or_skip(self, top_level: bool) -> Assignment | None:
        """One ``key = value`` (or literal ``val``); anything else is skipped and recorded."""
        start, skipped, values = self.pos, len(self.skipped), dict(self.values)
        first = self.tokens[start]
        try:
            if first.text in ("val", "var", "lazy"):
                self.value_definition()
                return None
            nxt = self.peek(1)
            if top_level or first.kind != "word" or nxt is None or nxt.text != "=":
                raise ScalaError(first.line, _what(first, top_level))
            self.pos += 2
            value = self.expression()
            self.end_of_statement()
            return Assignment(first.text, value, first.line, self.tokens[self.pos - 1].line)
        except ScalaError as e:
            if e.fatal:
                raise
            # Forget what was read inside the statement: it is reported once, as a whole.
            self.pos, self.values = start, values
            del self.skipped[skipped:]
            end_line = self.skip_statement()
            nxt = self.tokens[start + 1] if start + 1 < len(self.tokens) else None
            key = (
                first.text if first.kind == "word" and nxt is not None and nxt.text == "=" else None
            )
            self.skipped.append(Skipped(first.line, end_line, e.reason, key))
            return None

    def value_definition(self) -> None:
        """``val NAME = <literal>``: remembered; anything else is a ScalaError (skipped)."""
        first = self.take()
        if first.text == "lazy":
            self.take()
        name = self.take()
        if name.kind != "word" or (nxt := self.peek()) is None or nxt.text != "=":
            raise ScalaError(first.line, f"a Scala {first.text} definition, not a setting")
        self.pos += 1
        value = self.expression()
        self.end_of_statement()
        if isinstance(value, New) and value.cls == "KestrelConfig" and self.top is None:
            self.top, self.top_name = value, name.text
            return
        if isinstance(value, Opaque | New):
            raise ScalaError(first.line, f"a Scala {first.text} this converter cannot evaluate")
        self.values[name.text] = (first.line, value)

    def end_of_statement(self) -> None:
        """The statement just read must end here (a new line, ``;`` or ``}``)."""
        tok = self.peek()
        if tok is None or tok.text in ("}", ";") or tok.line > self.tokens[self.pos - 1].line:
            return
        raise ScalaError(tok.line, f"cannot read the expression at {tok.text!r}")

    def skip_statement(self) -> int:
        """Skip to the end of the statement at ``pos`` (brackets balanced); its last line."""
        depth: list[str] = []
        last = self.tokens[self.pos].line
        consumed = False
        while (tok := self.peek()) is not None:
            if consumed and not depth:
                prev = self.tokens[self.pos - 1]
                ends = tok.line > prev.line and prev.text not in _CONTINUES
                if tok.text in ("}", ";") or ends and tok.text not in (".", "else", "{"):
                    return last
            if tok.text in _OPEN:
                depth.append(_OPEN[tok.text])
            elif depth and tok.text == depth[-1]:
                depth.pop()
            elif tok.text in (")", "]", "}"):
                raise ScalaError(tok.line, f"unbalanced {tok.text!r}", fatal=True)
            last = tok.line
            consumed = True
            self.pos += 1
        if depth:
            raise ScalaError(last, f"missing {depth[-1]!r}", fatal=True)
        return last

    # --- expressions ----------------------------------------------------------------------

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
            return Opaque(" + ".join(show(p) for p in parts))
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
                    return Opaque(f"{cls.text}({', '.join(show(a) for a in args)})")
                return New(cls.text, [], cls.line)
            self.pos += 1
            return New(cls.text, self.body(), cls.line)
        if tok.kind == "word":
            return self.word(tok)
        if tok.text == "(":
            value = self.expression()
            if (nxt := self.peek()) is not None and nxt.text == ",":  # a tuple: ("user", "pw")
                items = [value]
                while (nxt := self.peek()) is not None and nxt.text == ",":
                    self.pos += 1
                    items.append(self.expression())
                value = tuple(items)
            self.expect(")")
            return value
        raise ScalaError(tok.line, f"unexpected {tok.text!r}")

    def word(self, tok: Token) -> object:
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
        if word in ("if", "match", "try", "while", "for", "def", "object", "class"):
            raise ScalaError(tok.line, f"Scala {word!r} is not evaluated by this converter")
        nxt = self.peek()
        if word in ("Some", "List", "Map", "Seq") and nxt is not None and nxt.text == "(":
            self.pos += 1
            args = self.arguments()
            if word == "Some":
                if len(args) != 1:
                    raise ScalaError(tok.line, "Some(...) takes one value")
                return args[0]
            if word == "Map":
                return dict(args)  # type: ignore[arg-type]
            return list(args)
        if nxt is not None and nxt.text == "(":
            self.pos += 1
            args = self.arguments()
            text = f"{word}({', '.join(show(a) for a in args)})"
            # A method called on the result, e.g. sys.props.getOrElse("k", "5").toInt
            while (dot := self.peek()) is not None and dot.text == "." and self.peek(1):
                text += "." + self.tokens[self.pos + 1].text
                self.pos += 2
            return Opaque(text)
        if word in self.values:
            return self.values[word][1]
        return Opaque(word)

    def arguments(self) -> list[object]:
        """Comma-separated expressions (``a -> b`` pairs too) up to ``)`` (consumed)."""
        args: list[object] = []
        while True:
            tok = self.peek()
            if tok is None:
                raise ScalaError(self.tokens[-1].line, "missing ')'", fatal=True)
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
            elif (nxt := self.peek()) is not None and nxt.text != ")":
                raise ScalaError(nxt.line, f"expected ',' or ')', found {nxt.text!r}")


def _what(tok: Token, top_level: bool) -> str:
    if tok.text in ("def", "object", "class", "trait"):
        return f"a Scala {tok.text} (helper code is not evaluated)"
    if tok.text in ("if", "match", "for", "while", "try"):
        return f"Scala {tok.text!r} is not evaluated by this converter"
    if top_level:
        return "a statement outside new KestrelConfig { ... }, not a setting"
    return f"expected an assignment, found {tok.text!r}"


def _with_unit(value: float | int, unit: str, line: int) -> object:
    if unit in _SIZE_UNITS:
        return Size(int(value * _SIZE_UNITS[unit]))
    if unit in _DURATION_UNITS:
        return Duration(int(value * _DURATION_UNITS[unit]))
    raise ScalaError(line, f"unknown unit .{unit}")


def show(value: object) -> str:
    """A value as Scala-ish text, for messages."""
    if isinstance(value, Opaque):
        return value.text
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def read_config(text: str) -> ScalaConfig:
    """The Kestrel config in ``text``; raises ScalaError when there is none to read."""
    tokens = tokenize(text)
    if not any(t.text == "KestrelConfig" for t in tokens):
        raise ScalaError(1, "not a Kestrel config: no new KestrelConfig { ... }", fatal=True)
    return Parser(tokens).config()
