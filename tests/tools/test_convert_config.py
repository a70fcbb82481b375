"""``kestreld convert-config FILE.scala``: Kestrel 2.4 and 3.0 configs as kestreld TOML."""

from __future__ import annotations

import socket
import subprocess
import sys
import tomllib

import pytest
import repo
from kazoo.client import KazooClient
from kestreld_process import Conn
from waiting import wait_until
from zookeeper import ZooKeeperProcess, free_port
from zookeeper import available as zookeeper_available

from kestreld.config import build_config
from kestreld.tools.convert_config import convert

DATA = repo.DATA / "kestrel_configs"


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
    assert untranslated_lines(result) == [45]  # loggers
    assert "loggers = new LoggerConfig" in result.stderr
    config = build_config(doc)  # what was translated is a usable config
    assert (config.port, config.text_port, config.thrift_port) == (22133, 2222, 2229)
    assert config.metrics_port == 2223
    assert config.log_level == "info"
    assert config.default_queue.sync_journal == 100
    assert config.default_queue.max_journal_size == 16 * 1024 * 1024
    assert config.queue("clicks").journal is False
    assert config.client_timeout == 0


def test_a_kestrel_3_0_production_config_reads_default_reader_keys():
    result, doc = converted("kestrel30_production.scala")
    assert result.returncode == 1
    assert untranslated_lines(result) == [41]
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


# --- every server setting kestreld has --------------------------------------------------

EVERY_SERVER_SETTING = """\
import com.twitter.conversions.time._
import net.lag.kestrel.config._

new KestrelConfig {{
  listenAddress = "127.0.0.1"
  memcacheListenPort = 22133
  textListenPort = {text_port}
  thriftListenPort = Some({thrift_port})
  queuePath = "/srv/kestrel"
  enableSessionTrace = true
  defaultStatus = ReadOnly
  statusFile = "{status_file}"
  statusChangeGracePeriod = 2.seconds
  connectionLimitRefuseWrites = Some(100)
  connectionLimitRefuseReads = Some(200)
  zookeeper = Some(new ZooKeeperBuilder {{
    host = "127.0.0.1"
    port = {zk_port}
    pathPrefix = "/kestrel/converted"
    sessionTimeout = 4.seconds
    credentials = Some(("kestrel", "secret"))
    acl = EveryoneReadCreatorAllACL
  }})
}}
"""


def every_setting(tmp_path, zk_port: int = 2181) -> str:
    return EVERY_SERVER_SETTING.format(
        text_port=free_port(),
        thrift_port=free_port(),
        status_file=tmp_path / "kestrel-status",
        zk_port=zk_port,
    )


def test_every_kestrel_server_setting_kestreld_has_is_translated(tmp_path):
    scala = every_setting(tmp_path)
    toml, problems = convert(scala)
    assert problems == []
    config = build_config(tomllib.loads(toml))
    assert config.port == 22133
    assert str(config.text_port) in scala and str(config.thrift_port) in scala
    assert config.enable_session_trace is True
    assert config.default_status == "READONLY"
    assert config.status_file == str(tmp_path / "kestrel-status")
    assert config.status_change_grace_period == 2000
    assert config.connection_limit_refuse_writes == 100
    assert config.connection_limit_refuse_reads == 200
    zk = config.zookeeper
    assert (zk.hosts, zk.path_prefix, zk.session_timeout) == (
        "127.0.0.1:2181",
        "/kestrel/converted",
        4000,
    )
    assert (zk.credentials, zk.acl) == ("kestrel:secret", "everyone_read_creator_all")


@pytest.mark.parametrize(
    "line, key, value",
    [
        ("memcacheListenPort = None", "port", 0),
        ("textListenPort = None", "text_port", 0),
        ("defaultStatus = Quiescent", "default_status", "quiescent"),
        ("defaultStatus = WriteAvoid", "default_status", "writeavoid"),
        ("enableSessionTrace = false", "enable_session_trace", False),
    ],
)
def test_optional_and_status_values_translate(line, key, value):
    toml, problems = convert(f"new KestrelConfig {{\n  {line}\n}}\n")
    assert problems == []
    assert tomllib.loads(toml)[key] == value


def test_a_server_starts_on_the_translated_settings_and_joins_its_server_set(tmp_path, make_server):
    if (reason := zookeeper_available()) is not None:
        pytest.skip(reason)
    zk = ZooKeeperProcess(tmp_path / "zookeeper")
    zk.start()
    try:
        scala = tmp_path / "kestrel.scala"
        scala.write_text(every_setting(tmp_path, zk.port))
        result = run(str(scala))
        assert (result.returncode, result.stderr) == (0, "")
        proc = make_server(result.stdout, queue_path=tmp_path / "queues", start=False)
        proc.port = free_port()  # the harness's --port 0 would turn memcache off
        proc.start()
        config = build_config(tomllib.loads(result.stdout))
        for port in (config.text_port, config.thrift_port):  # Kestrel's other front ends
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        conn = Conn(proc.connect())
        assert conn.stats()["status"] == "READONLY"  # Kestrel's defaultStatus
        conn.close()
        reader = KazooClient(hosts=zk.hosts, timeout=10.0)
        reader.start(timeout=30)
        try:
            # READONLY: a member of the read set only
            wait_until(lambda: reader.exists("/kestrel/converted/read"), "the read set", 30)
            wait_until(lambda: reader.get_children("/kestrel/converted/read"), "a member", 30)
            assert reader.exists("/kestrel/converted/write") is None or (
                reader.get_children("/kestrel/converted/write") == []
            )
        finally:
            reader.stop()
            reader.close()
    finally:
        zk.stop()


# --- Scala it does not evaluate ------------------------------------------------------------

WITH_SCALA = """\
import com.twitter.conversions.storage._
import net.lag.kestrel.config._

val base = "/srv/kestrel"
def env(name: String) = sys.env.getOrElse(name, "dev")

new KestrelConfig {
  import com.twitter.conversions.time._
  queuePath = base
  maxOpenTransactions = sys.props.getOrElse("tuned.open", "10").toInt
  if (env("STAGE") == "prod") {
    clientTimeout = 30.seconds
  }
  val big = 64.megabytes
  queues = new QueueBuilder {
    name = "jobs"
    maxItems = sys.props.getOrElse("tuned.max_items", "5000").toInt
    maxSize = big
    maxAge = 1.hour
  } :: new QueueBuilder {
    name = "other"; maxItems = 10
  }
}
"""


def test_scala_it_cannot_evaluate_is_named_line_by_line_and_the_rest_translated(tmp_path):
    path = tmp_path / "kestrel.scala"
    path.write_text(WITH_SCALA)
    result = run(str(path))
    assert result.returncode == 1
    assert untranslated_lines(result) == [5, 10, 11, 17]
    errors = result.stderr.splitlines()
    assert errors[0].startswith(f"{path}:5: not translated: def env(name: String) = ")
    assert errors[1].startswith(
        f'{path}:10: not translated: maxOpenTransactions = sys.props.getOrElse("tuned.open", '
    )
    assert "cannot evaluate" in errors[1]
    assert errors[2].startswith(f'{path}:11: not translated: if (env("STAGE") == "prod") {{')
    assert "lines 11-13" in errors[2]
    assert "tuned.max_items" in errors[3]
    doc = tomllib.loads(result.stdout)
    config = build_config(doc)
    assert config.queue_path == "/srv/kestrel"  # val base, a literal, is used
    assert config.queue("jobs").max_size == 64 * 1024 * 1024
    assert config.queue("jobs").max_age == 3_600_000
    assert config.queue("other").max_items == 10
    assert "max_open_reads" not in doc  # not Kestrel's default: the line that sets it is named


@pytest.mark.parametrize(
    "text",
    [
        'queue_path = "/srv/kestrel"\n[queues.jobs]\nmax_items = 5\n',
        "just some notes\nabout the queues\n",
        "",
        "object Main { def main() = println(1) }\n",
        "hello = [1, 2\n",
        b"\x00\xff\xfe binary \x9c",
    ],
)
def test_a_file_that_is_not_a_kestrel_config_exits_2(tmp_path, text):
    path = tmp_path / "not.scala"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    result = run(str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "not a Kestrel config" in result.stderr


def test_a_server_set_whose_acl_cannot_be_translated_is_left_out_not_opened():
    toml, problems = convert(
        "new KestrelConfig {\n"
        "  zookeeper = Some(new ZooKeeperBuilder {\n"
        '    host = "zk"\n'
        '    pathPrefix = "/kestrel"\n'
        "    acl = CustomACL(myAcls)\n"
        "  })\n"
        "}\n"
    )
    assert "zookeeper" not in tomllib.loads(toml)
    assert [(p.line, p.reason) for p in problems] == [
        (2, "[zookeeper] left out: its acl or credentials were not translated"),
        (5, "expected OpenUnsafeACL or EveryoneReadCreatorAllACL"),
    ]


def test_a_config_held_by_a_val_is_read():
    toml, problems = convert(
        'val config = new KestrelConfig {\n  queuePath = "/q"\n  maxOpenTransactions = 5\n}\n'
        "config\n"
    )
    assert problems == []
    config = build_config(tomllib.loads(toml))
    assert (config.queue_path, config.max_open_reads) == ("/q", 5)
