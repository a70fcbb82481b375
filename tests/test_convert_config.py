"""``kestreld convert-config FILE.scala``: Kestrel 2.4 and 3.0 configs as kestreld TOML."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kestreld.config import build_config
from kestreld.tools.convert_config import convert

DATA = Path(__file__).resolve().parent / "data" / "kestrel_configs"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kestreld", "convert-config", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def converted(name: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = run(str(DATA / name))
    return result, tomllib.loads(result.stdout)


def untranslated_lines(result: subprocess.CompletedProcess) -> list[int]:
    return [int(line.split(":")[1]) for line in result.stderr.splitlines()]


def test_a_kestrel_2_4_development_config_translates_completely():
    result, doc = converted("kestrel24_development.scala")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    config = build_config(doc)
    assert config.listen_address == "127.0.0.1"
    assert config.queue_path == "/tmp/kestrel-dev"
    assert config.client_timeout == 30_000
    assert config.max_open_reads == 100
    assert config.default_queue.max_journal_size == 16 * 1024 * 1024  # defaultJournalSize
    orders = config.queue("orders")
    assert (orders.max_age, orders.max_items) == (3_600_000, 2_000_000)
    assert config.queue("delayed").expire_to_queue == "ready"
    assert config.queue("ready").sync_journal == 0
    assert config.queue("events").fanout_only is True
    bounded = config.queue("bounded")
    assert bounded.max_size == 64 * 1024 * 1024 and bounded.discard_old_when_full
    # maxJournalSize is Kestrel 2.4's compaction threshold: never kestreld's segment size.
    assert bounded.max_journal_size == 16 * 1024 * 1024
    assert "maxJournalSize = 64.megabytes  -- not needed" in result.stdout
    assert config.queue("careful").open_transaction_timeout == 120_000
    assert config.aliases == {"order_alias": ("orders",), "mail_all": ("mail", "mail_backup")}


def test_a_kestrel_2_4_production_config_names_the_lines_it_cannot_translate():
    result, doc = converted("kestrel24_production.scala")
    assert result.returncode == 1
    assert untranslated_lines(result) == [11, 12, 45]  # text port, thrift port, loggers
    assert "textListenPort = 2222" in result.stderr
    assert "loggers = new LoggerConfig" in result.stderr
    config = build_config(doc)  # what was translated is a usable config
    assert config.metrics_port == 2223
    assert config.log_level == "info"
    assert config.default_queue.sync_journal == 100
    assert config.default_queue.max_journal_size == 16 * 1024 * 1024
    assert config.queue("clicks").journal is False
    assert config.client_timeout == 0


def test_a_kestrel_3_0_production_config_reads_default_reader_keys():
    result, doc = converted("kestrel30_production.scala")
    assert result.returncode == 1
    assert untranslated_lines(result) == [11, 12, 41]
    config = build_config(doc)
    assert config.default_queue.max_memory_size == 128 * 1024 * 1024  # default.defaultReader.
    assert config.default_queue.max_journal_size == 16 * 1024 * 1024  # default.journalSize
    orders = config.queue("orders")
    assert (orders.max_items, orders.max_age) == (2_000_000, 3_600_000)
    assert config.queue("clicks").journal is False


def test_a_kestrel_3_0_development_config_brings_punt_keys_and_readers():
    result, doc = converted("kestrel30_development.scala")
    assert result.returncode == 1
    assert untranslated_lines(result) == [12, 56]  # System.getenv(...) + ..., loggers
    config = build_config(doc)
    ready = config.queue("ready")
    assert ready.punt_error_to_queue == "delayed"
    assert ready.punt_many_errors_to_queue == "poison"
    assert ready.punt_many_errors_count == 5
    audit = config.queue("bounded+audit")
    assert audit.max_items == 1000 and audit.discard_old_when_full
    assert audit.max_size == 64 * 1024 * 1024  # inherited from bounded's default reader
    assert config.queue("bounded").max_journal_size == 1024 * 1024
    assert config.queue("scratch").max_queue_age == 15_000
    assert config.log_level == "debug"


def test_kestrel_defaults_that_differ_are_written_out():
    toml, problems = convert('new KestrelConfig {\n  queuePath = "/q"\n}\n')
    assert problems == []
    config = build_config(tomllib.loads(toml))
    assert config.max_open_reads == 1  # Kestrel's maxOpenTransactions default
    assert config.listen_address == "0.0.0.0"


@pytest.mark.parametrize(
    "line, reason",
    [
        ("maxItemSize = 64.megabytes", "caps items at 16 MiB"),
        ("enableTrace = true", "tracing"),
        ("noSuchKey = 3", "unknown Kestrel queue setting"),
    ],
)
def test_a_queue_key_without_a_kestreld_setting_is_named(tmp_path, line, reason):
    path = tmp_path / "k.scala"
    path.write_text(
        "new KestrelConfig {\n  queues = new QueueBuilder {\n"
        f'    name = "q"\n    {line}\n  }}\n}}\n'
    )
    result = run(str(path))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}:4: not translated: {line}")
    assert reason in result.stderr


def test_an_unreadable_file_exits_2(tmp_path):
    path = tmp_path / "broken.scala"
    path.write_text("new KestrelConfig {\n  queues = new QueueBuilder {\n")
    result = run(str(path))
    assert result.returncode == 2 and "missing" in result.stderr
    assert run(str(tmp_path / "absent.scala")).returncode == 2
