"""Kestrel's queue-name rule: any printable ASCII name without ``/ . ~``, ``+`` for readers.

Every allowed character goes on disk (as part of journal and checkpoint file
names), comes back across a restart, and shows in ``kestreld journal dump``,
``kestreld queues`` and the Spark source's listing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kestreld_process import Conn
from pipeline_fixtures import spark_fixture  # noqa: F401 - provides `spark`

from kestreld.names import MAX_FANOUT_NAME, split_queue_name
from kestreld.pipeline.listing import FileKind, list_journal_files
from kestreld.tools.dump import preview

ALLOWED = [chr(c) for c in range(0x21, 0x7F) if chr(c) not in "/.~+"]
#: Each allowed character in a queue name of its own, and all of them in one name.
QUEUES = [f"q{ch}" for ch in ALLOWED] + ["".join(ALLOWED)]
#: A fanout reader whose name holds every allowed character.
READER = "r+" + "".join(ALLOWED)


def test_the_rule_is_kestrels_with_safe_file_names():
    assert len(ALLOWED) == 90
    for name in QUEUES + [READER, "jobs@high", "user#42", "a\\b", "[x]", '"q"', "-x", "%2e%2e"]:
        assert split_queue_name(name) is not None, name
    for name in ["", "a.b", "a/b", "~q", "q~", "a b", "a\tb", "q\x7f", "q\x00", "caf\u00e9", "+r"]:
        assert split_queue_name(name) is None, repr(name)
    assert split_queue_name("q+r+s") is None and split_queue_name("q+") is None
    assert split_queue_name("x" * 200) and split_queue_name("x" * 201) is None
    assert MAX_FANOUT_NAME == 234
    assert split_queue_name("a" * 200 + "+" + "b" * 34)
    assert split_queue_name("a" * 200 + "+" + "b" * 35) is None


def _dump_stats_names(c: Conn) -> set[str]:
    c.send("dump_stats\r\n")
    return {
        line[len("queue '") : -len("' {")].decode()
        for line in c.until_end()
        if line.startswith(b"queue '")
    }


def _fill(c: Conn) -> None:
    assert c.get(READER) is None  # creates the reader
    for name in QUEUES:
        assert c.set(name, f"data of {name}") == b"STORED", name
    assert c.set("r", "for the reader") == b"STORED"


def _drain(c: Conn) -> None:
    for name in QUEUES:
        assert c.get(name) == f"data of {name}".encode(), name
        assert c.get(name) is None
    assert c.get(READER) == b"for the reader"


@pytest.fixture
def filled(make_server):
    srv = make_server('checkpoint_interval = "50ms"\n')
    c = Conn(srv.connect())
    _fill(c)
    c.close()
    return srv


def test_every_allowed_character_is_a_queue_that_survives_a_restart(filled):
    srv = filled
    files = {p.name for p in srv.queue_path.iterdir()}
    for name in QUEUES:
        assert any(f.startswith(name + ".") and f[len(name) + 1 :].isdigit() for f in files), name
    assert f"r.read.{READER[2:]}" in files
    srv.restart()
    c = Conn(srv.connect())
    assert set(QUEUES) | {"r", READER} <= _dump_stats_names(c)
    stats = c.stats()
    for name in QUEUES:
        assert stats[f"queue_{name}_items"] == "1", name
    _drain(c)
    srv.restart(crash=True)  # and after a kill -9 the consumption is kept
    c = Conn(srv.connect())
    assert all(c.get(name) is None for name in QUEUES)


def test_journal_dump_reads_every_name(filled):
    srv = filled
    srv.stop()  # no checkpoint rewrite (and its temporary file) under the dump
    paths = sorted(str(p) for p in srv.queue_path.iterdir() if not p.name.startswith("."))
    result = subprocess.run(
        [sys.executable, "-m", "kestreld", "journal", "dump", *paths],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for name in QUEUES:
        segment = next(p for p in paths if p.rpartition("/")[2].startswith(name + "."))
        assert f"== {segment}: writer segment" in result.stdout, name
        assert f" data={preview(f'data of {name}'.encode())}" in result.stdout, name
    assert f"/r.read.{READER[2:]}: " in result.stdout


def test_kestreld_queues_lists_every_name(filled):
    srv = filled
    result = subprocess.run(
        [sys.executable, "-m", "kestreld", "queues", "--port", str(srv.port), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    rows = {r["name"]: r for r in map(json.loads, result.stdout.splitlines())}
    for name in QUEUES:
        assert rows[name]["items"] == 1, name
    assert rows[READER]["items"] == 1


def test_the_spark_listing_names_every_queue_and_reader(filled):
    srv = filled
    srv.stop()
    listing = list_journal_files([str(srv.queue_path)])
    assert listing.problems == []
    segments = {jf.queue for jf in listing.files if jf.kind is FileKind.SEGMENT}
    assert set(QUEUES) <= segments
    readers = {(jf.queue, jf.reader) for jf in listing.files if jf.kind is FileKind.CHECKPOINT}
    assert ("r", READER[2:]) in readers


@pytest.mark.spark
def test_the_spark_source_reads_every_name(filled, spark):
    filled.stop()
    df = spark.read.format("kestrel_journal").load(str(filled.queue_path))
    puts = {(r["queue"], bytes(r["data"]).decode()) for r in df.filter("op = 'PUT'").collect()}
    for name in QUEUES:
        assert (name, f"data of {name}") in puts, name
