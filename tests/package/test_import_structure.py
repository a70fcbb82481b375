"""Dependencies point one way: frontends -> session -> queues -> journal; stats reads state only;
cluster (ZooKeeper server sets) and client beside them.  Inside the front ends each wire format
(memcache, text, thrift) sits on the connection core and never on another wire format; event-loop
scheduling (loop) sits below them.

Two checks anyone can run: each layer imports alone in a fresh interpreter
(without pulling in the layers above it), and a walk over the package's own
import statements finds no cycle between modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import repo

ROOT = repo.ROOT
PACKAGE = ROOT / "kestreld"

#: What a leaf of the session layer (read on every request) may not load.
SESSION_LEAF = [
    "kestreld.queues",
    "kestreld.journal",
    "kestreld.frontends",
    "kestreld.session.session",
    "kestreld.server",
    "kestreld.stats",
]

#: layer -> layers it must not load (directly or through anything it imports).
FORBIDDEN = {
    # The clocks: a leaf of the journal every layer reads.
    "kestreld.journal.clock": [
        "kestreld.journal.writer",
        "kestreld.journal.batch",
        "kestreld.queues",
        "kestreld.session",
        "kestreld.frontends",
        "kestreld.server",
        "kestreld.stats",
    ],
    "kestreld.names": [
        "kestreld.journal",
        "kestreld.queues",
        "kestreld.frontends",
        "kestreld.server",
    ],
    "kestreld.journal": [
        "kestreld.queues",
        "kestreld.frontends",
        "kestreld.server",
        "kestreld.stats",
    ],
    "kestreld.queues": [
        "kestreld.frontends",
        "kestreld.session",
        "kestreld.server",
        "kestreld.stats",
    ],
    "kestreld.frontends.memcache.framing": [
        "kestreld.queues",
        "kestreld.journal",
        "kestreld.server",
    ],
    # Sending to a socket knows descriptors and bytes: no session, no queue, no server.
    "kestreld.frontends.memcache.direct_send": [
        "kestreld.session",
        "kestreld.queues",
        "kestreld.journal",
        "kestreld.server",
    ],
    # The server passes the command table in: the connection never loads it.
    "kestreld.frontends.memcache.connection": [
        "kestreld.server",
        "kestreld.stats",
        "kestreld.frontends.memcache.commands",
    ],
    "kestreld.session": [
        "kestreld.frontends",
        "kestreld.server",
        "kestreld.stats",
        "kestreld.cluster",
    ],
    # The session trace is a leaf: the server makes it, the session holds one per client.
    "kestreld.session.trace": [
        "kestreld.queues",
        "kestreld.journal",
        "kestreld.frontends",
        "kestreld.server",
        "kestreld.stats",
    ],
    "kestreld.stats": ["kestreld.frontends", "kestreld.server"],
    # The per-request counters: a leaf the front ends and sessions add to, stats reads.
    "kestreld.session.traffic": SESSION_LEAF,
    # What the server lets sessions do now: a leaf the server keeps current, sessions read.
    "kestreld.session.gate": SESSION_LEAF,
    "kestreld.stats.collector": ["kestreld.frontends", "kestreld.server"],
    "kestreld.state": ["kestreld.frontends", "kestreld.server", "kestreld.queues"],
    "kestreld.config": ["kestreld.queues", "kestreld.frontends", "kestreld.server", "kazoo"],
    # Who may connect and do what: beside the queues, below every front end.
    "kestreld.security": [
        "kestreld.frontends",
        "kestreld.server",
        "kestreld.queues",
        "kestreld.journal",
        "kestreld.stats",
    ],
    # Cluster membership (ZooKeeper server sets) sits beside the server: the server hands
    # it endpoints and statuses; the member codec is shared with the client without kazoo.
    "kestreld.cluster.membership": [
        "kestreld.server",
        "kestreld.frontends",
        "kestreld.queues",
        "kestreld.journal",
        "kestreld.stats",
    ],
    "kestreld.cluster.member": ["kazoo", "kestreld.config", "kestreld.server"],
    "kestreld.status": ["kestreld.frontends", "kestreld.server", "kestreld.queues"],
    "kestreld.client": ["kazoo", "kestreld.server", "kestreld.frontends", "kestreld.queues"],
    # Kestrel's text and thrift front ends: framing and replies over the session.
    "kestreld.frontends.text.parser": ["kestreld.queues", "kestreld.session", "kestreld.server"],
    "kestreld.frontends.thrift.codec": ["kestreld.queues", "kestreld.session", "kestreld.server"],
    "kestreld.frontends.text.connection": ["kestreld.server", "kestreld.stats"],
    "kestreld.frontends.thrift.connection": ["kestreld.server", "kestreld.stats"],
    "kestreld.session.open_ids": ["kestreld.frontends", "kestreld.server"],
    # The connection core knows no wire format; the event loop's scheduling knows no front end.
    "kestreld.frontends.core.request_loop": [
        "kestreld.frontends.memcache",
        "kestreld.frontends.text",
        "kestreld.frontends.thrift",
        "kestreld.server",
    ],
    "kestreld.frontends.core.limits": ["kestreld.session", "kestreld.queues", "kestreld.server"],
    "kestreld.loop": ["kestreld.frontends", "kestreld.session", "kestreld.server"],
    "kestreld.admin.http": ["kestreld.frontends", "kestreld.server"],
    # Which worker owns a queue: a pure function every side may ask.
    "kestreld.workers.ownership": [
        "kestreld.queues",
        "kestreld.journal",
        "kestreld.session",
        "kestreld.frontends",
        "kestreld.server",
    ],
    # The supervisor forks before any event loop exists: it loads no queue side.
    "kestreld.workers.supervisor": ["kestreld.queues", "kestreld.frontends", "kestreld.server"],
}


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_each_layer_imports_alone(module):
    code = (
        "import sys, importlib\n"
        f"importlib.import_module({module!r})\n"
        f"bad = sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') "
        f"for f in {FORBIDDEN[module]!r}))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"{module} loads {result.stdout.strip()}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """Modules of the package this file imports when it loads (not under TYPE_CHECKING,
    not inside functions: those run later and cannot make a load-time cycle)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in [node] if not isinstance(node, ast.If | ast.Try) else ast.walk(node):
            if isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names)
            elif isinstance(sub, ast.ImportFrom):
                base = sub.module or ""
                if sub.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - sub.level + 1])
                    base = f"{base}.{sub.module}" if sub.module else base
                found.add(base)
                found.update(f"{base}.{a.name}" for a in sub.names)
    return {m for m in found if m == "kestreld" or m.startswith("kestreld.")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in _imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
    }


#: (importer prefix, imported prefix): a direct import the layering forbids.
DIRECT_FORBIDDEN = [
    ("kestreld.frontends", "kestreld.journal"),  # the queue layer gives them what they need
    ("kestreld.frontends", "kestreld.queues"),  # front ends reach the queues through the session
    (
        "kestreld.frontends.memcache.connection",
        "kestreld.frontends.memcache.commands",
    ),  # the table is passed in
    ("kestreld.session", "kestreld.frontends"),  # the session knows no wire syntax
    ("kestreld.session", "kestreld.server"),
    ("kestreld.session", "kestreld.stats"),
    ("kestreld.session", "kestreld.cluster"),
    ("kestreld.queues", "kestreld.session"),
    ("kestreld.journal", "kestreld.session"),
    ("kestreld.frontends", "kestreld.server"),
    ("kestreld.frontends", "kestreld.stats"),
    ("kestreld.stats", "kestreld.frontends"),
    ("kestreld.stats", "kestreld.server"),
    ("kestreld.queues", "kestreld.frontends"),
    ("kestreld.queues", "kestreld.server"),
    ("kestreld.journal", "kestreld.queues"),
    ("kestreld.journal", "kestreld.frontends"),
    ("kestreld.cluster", "kestreld.server"),
    ("kestreld.cluster", "kestreld.frontends"),
    ("kestreld.cluster", "kestreld.queues"),
    ("kestreld.cluster", "kestreld.client"),
    ("kestreld.client", "kestreld.server"),
    ("kestreld.client", "kestreld.frontends"),
    ("kestreld.security", "kestreld.frontends"),
    ("kestreld.security", "kestreld.server"),
    ("kestreld.security", "kestreld.queues"),
    ("kestreld.admin", "kestreld.frontends"),  # the admin port sees the server as state
    # One folder per wire format, over the core: no wire format reads another's syntax.
    ("kestreld.frontends.memcache", "kestreld.frontends.text"),
    ("kestreld.frontends.memcache", "kestreld.frontends.thrift"),
    ("kestreld.frontends.text", "kestreld.frontends.memcache"),
    ("kestreld.frontends.text", "kestreld.frontends.thrift"),
    ("kestreld.frontends.thrift", "kestreld.frontends.memcache"),
    ("kestreld.frontends.thrift", "kestreld.frontends.text"),
    ("kestreld.frontends.core", "kestreld.frontends.memcache"),
    ("kestreld.frontends.core", "kestreld.frontends.text"),
    ("kestreld.frontends.core", "kestreld.frontends.thrift"),
    ("kestreld.loop", "kestreld.frontends"),
    ("kestreld.loop", "kestreld.session"),
    # Workers sit above the front ends, beside the server: nothing below knows of them.
    ("kestreld.frontends", "kestreld.workers"),
    ("kestreld.session", "kestreld.workers"),
    ("kestreld.queues", "kestreld.workers"),
    ("kestreld.journal", "kestreld.workers"),
    ("kestreld.admin", "kestreld.server"),
    ("kestreld.queues", "kestreld.admin"),
    ("kestreld.stats", "kestreld.admin"),
]

#: Leaves of a lower layer that every layer may read: the clocks (a compiled module, so it
#: lives in a package that installs the hot-module finder, kestreld/compiled.py).
SHARED_LEAVES = ("kestreld.journal.clock",)


def test_no_layer_imports_what_it_must_not():
    bad = [
        f"{name} imports {dep}"
        for name, deps in _graph().items()
        for dep in deps
        if dep not in SHARED_LEAVES
        for importer, imported in DIRECT_FORBIDDEN
        if (name == importer or name.startswith(importer + "."))
        and (dep == imported or dep.startswith(imported + "."))
    ]
    assert bad == []


def test_no_import_cycles_in_the_package():
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# --- objects change their own state through their own verbs ---------------------------------

#: Files whose code may only assign fields of ``self`` (never ``other.field = ...`` nor
#: ``self.other.field = ...``): the front ends, the session and the server.
OWN_FIELDS_ONLY = ["kestreld/frontends", "kestreld/session", "kestreld/server.py"]

#: (file, name) pairs allowed to assign fields of ``name``, and why.
FIELD_WRITES_ALLOWED = {
    # A Fetch is a record (a get's options, then its outcome): its fields are its interface.
    ("kestreld/frontends/memcache/commands.py", "opts"),
    ("kestreld/frontends/memcache/commands.py", "f"),
    ("kestreld/session/session.py", "f"),
    # The factory of PendingReply beside the class fills a new instance.
    ("kestreld/session/reply.py", "reply"),
    # Fetch.again fills a new Fetch (its own class) from the parsed one.
    ("kestreld/session/fetch.py", "f"),
    ("kestreld/frontends/text/connection.py", "f"),
    ("kestreld/frontends/thrift/connection.py", "f"),
    # OpenIds' own private record of one held read (_Held), changed only by OpenIds.
    ("kestreld/session/open_ids.py", "held"),
    # C structs filled for sendmsg(2) (direct_send.send_now).
    ("kestreld/frontends/memcache/direct_send.py", "msg"),
    ("kestreld/frontends/memcache/direct_send.py", "vec"),
}


def _field_writes(path: Path) -> list[str]:
    """``x.field = ...`` (and ``+=``) in ``path`` where x is not ``self``."""
    rel = str(path.relative_to(ROOT))
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        flat = []
        for t in targets:
            flat.extend(t.elts if isinstance(t, ast.Tuple) else [t])
        for t in flat:
            if not isinstance(t, ast.Attribute):
                continue
            owner = t.value
            if isinstance(owner, ast.Name) and owner.id == "self":
                continue
            if isinstance(owner, ast.Name) and (rel, owner.id) in FIELD_WRITES_ALLOWED:
                continue
            # Counters are plain tallies every layer adds to.
            if ast.unparse(owner).endswith(("stats", "traffic")):
                continue
            found.append(f"{rel}:{t.lineno}: {ast.unparse(t)} =")
    return found


def test_front_ends_session_and_server_write_only_their_own_fields():
    paths: list[Path] = []
    for entry in OWN_FIELDS_ONLY:
        p = ROOT / entry
        paths.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    bad = [w for p in paths for w in _field_writes(p)]
    assert bad == [], "write through the object's own verb instead:\n" + "\n".join(bad)


#: libkestrel's two readers: each changes its own state through its own verbs.  The records
#: each hands out are allowed: an OpenRead (the queue side's), a Compaction (the journal side's).
READER_FIELD_WRITES_ALLOWED = {
    ("kestreld/queues/reader.py", "read"),
    ("kestreld/journal/journal_reader.py", "job"),
}


def test_the_two_readers_write_only_their_own_fields():
    bad = [
        w
        for rel in ("kestreld/queues/reader.py", "kestreld/journal/journal_reader.py")
        for w in _field_writes(ROOT / rel)
        if (rel, w.split(": ", 1)[1].split(".", 1)[0]) not in READER_FIELD_WRITES_ALLOWED
    ]
    assert bad == [], "write through the object's own verb instead:\n" + "\n".join(bad)


def test_segments_and_the_read_behind_cursor_change_through_their_verbs():
    names = ("seg", "segment", "rb", "read_behind", "cursor")
    paths = sorted((PACKAGE / "journal").rglob("*.py")) + sorted((PACKAGE / "queues").rglob("*.py"))
    bad = [w for p in paths for w in _field_writes(p) if _owner(w).rsplit(".", 1)[-1] in names]
    assert bad == []


def _owner(write: str) -> str:
    """``x.y`` of ``path:line: x.y.field =``."""
    return write.split(": ", 1)[1].removesuffix(" =").rsplit(".", 1)[0]


# --- the package holds what users run -------------------------------------------------------

#: No module of the package is longer than this: a longer one holds more than one concept.
MAX_MODULE_LINES = 800


def test_no_module_of_the_package_is_over_800_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_the_package_ships_no_test_support_nor_instruments():
    """Test support (hypothesis, pytest), the crash soak, the build's training run and the
    performance instruments live in tests/ and scripts/, not in the package."""
    test_only = ("hypothesis", "pytest")
    bad = [
        f"{name} imports {dep}"
        for name, path in ((_module_name(p), p) for p in PACKAGE.rglob("*.py"))
        for dep in _all_imports(path)
        if dep.split(".")[0] in test_only
    ]
    assert bad == []
    bench = {p.stem for p in (PACKAGE / "bench").glob("*.py")}
    assert bench == {
        "__init__", "cli", "load", "workloads", "servers", "backlog", "report",
        "darner_suite", "many_queues", "every_core",
    }  # fmt: skip


def _all_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found
