"""Config of Kestrel's queue rules: aliases, punt keys, and Kestrel key names in TOML."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kestreld.config import ConfigError, build_config


def check(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "kestreld.conf"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "kestreld", "--check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_punt_keys_are_inherited_like_the_others():
    config = build_config(
        {
            "punt_many_errors_count": 4,
            "queues": {
                "work": {"punt_error_to_queue": "retry", "punt_many_errors_to_queue": "poison"},
                "work+audit": {"punt_many_errors_count": 9},
            },
        }
    )
    assert config.queue("other").punt_many_errors_count == 4
    audit = config.queue("work+audit")
    assert (audit.punt_error_to_queue, audit.punt_many_errors_count) == ("retry", 9)
    assert config.queue("work").punt_target(3) == "retry"
    assert config.queue("work").punt_target(4) == "poison"
    assert config.queue("other").punt_target(1000) is None
    assert build_config({}).default_queue.punt_many_errors_count == 100


def test_only_many_errors_set_leaves_fewer_errors_at_the_head():
    cfg = build_config({"queues": {"q": {"punt_many_errors_to_queue": "p"}}}).queue("q")
    assert cfg.punt_target(99) is None and cfg.punt_target(100) == "p"


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"maxItems": 10}, "Kestrel's maxItems is max_items in kestreld"),
        ({"queues": {"q": {"expireToQueue": "x"}}}, "Kestrel's expireToQueue is expire_to_queue"),
        ({"maxOpenTransactions": 5}, "Kestrel's maxOpenTransactions is max_open_reads"),
        ({"maxJournalSize": "1GiB"}, "compaction threshold"),
        ({"textListenPort": 2222}, "Kestrel's textListenPort is text_port in kestreld"),
    ],
)
def test_a_kestrel_key_name_is_refused_with_what_it_probably_meant(doc, message):
    with pytest.raises(ConfigError, match=message):
        build_config(doc)


def test_check_config_warns_about_a_kestrel_sized_max_journal_size(tmp_path):
    result = check(tmp_path, 'max_journal_size = "1GiB"\n[queues.q]\nmax_journal_size = "16MiB"\n')
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if line.startswith("# warning")]
    assert len(warnings) == 1 and "maxJournalSize" in warnings[0]
    assert "max_journal_size = 1073741824 is the size of one journal segment" in warnings[0]


def test_check_config_shows_aliases_and_warns_about_a_masked_queue(tmp_path):
    result = check(
        tmp_path,
        '[queues.jobs]\nmax_items = 5\n[aliases.jobs]\ndestination_queues = ["a", "b"]\n',
    )
    assert result.returncode == 0, result.stderr
    assert "alias 'jobs' {\n  destination_queues=a,b\n}" in result.stdout
    assert "# warning: the alias 'jobs' masks the configured queue 'jobs'" in result.stdout


@pytest.mark.parametrize(
    "text, message",
    [
        ('[aliases.a]\ndestination_queues = ["a"]\n', "points at itself"),
        ('[aliases.a]\ndestination_queues = ["b"]\n[aliases.b]\ndestination_queues = ["c"]\n',
         "'b' is itself an alias"),
        ("[aliases.a]\ndestination_queues = []\n", "non-empty list"),
        ('[aliases.a]\ndestinations = ["b"]\n', "did you mean destination_queues"),
        ("punt_many_errors_count = 0\n", "must be at least 1"),
        ('[queues.q]\npunt_error_to_queue = "q"\n', "is the queue itself"),
    ],
)  # fmt: skip
def test_check_config_refuses_bad_rules_with_exit_2(tmp_path, text, message):
    result = check(tmp_path, text)
    assert result.returncode == 2
    assert message in result.stderr


# --- where items go: error queues and expire_to_queue name one queue ---------------------------

#: (config, the message): a target that is not one other queue.
BAD_TARGETS = [
    ('[queues.q]\npunt_error_to_queue = "fanq+r"\n',
     "queues.q.punt_error_to_queue: 'fanq+r' is a fanout reader"),
    ('[queues.q]\npunt_many_errors_to_queue = "other+r"\n',
     "queues.q.punt_many_errors_to_queue: 'other+r' is a fanout reader"),
    ('[queues.q]\nexpire_to_queue = "dead+r"\n',
     "queues.q.expire_to_queue: 'dead+r' is a fanout reader"),
    ('[queues.q]\nexpire_to_queue = "q"\n', "queues.q.expire_to_queue: 'q' is the queue itself"),
    ('[queues."q+r"]\nexpire_to_queue = "q"\n',
     "queues.q+r.expire_to_queue: 'q' is the queue itself"),
    ('[queues.q]\npunt_error_to_queue = "both"\n[aliases.both]\ndestination_queues = ["a", "b"]\n',
     "queues.q.punt_error_to_queue: 'both' is an alias; name a queue (one of a, b)"),
    ('[queues.q]\nexpire_to_queue = "both"\n[aliases.both]\ndestination_queues = ["a"]\n',
     "queues.q.expire_to_queue: 'both' is an alias"),
    ('punt_error_to_queue = "errors+r"\n', "punt_error_to_queue: 'errors+r' is a fanout reader"),
    ('expire_to_queue = "al"\n[aliases.al]\ndestination_queues = ["a"]\n',
     "expire_to_queue: 'al' is an alias"),
]  # fmt: skip


@pytest.mark.parametrize("text, message", BAD_TARGETS)
def test_a_target_that_is_not_one_other_queue_is_refused_naming_the_key(text, message):
    import tomllib

    with pytest.raises(ConfigError) as e:
        build_config(tomllib.loads(text))
    assert message in str(e.value)


def test_a_default_target_may_name_a_queue_that_inherits_it():
    config = build_config({"expire_to_queue": "dead", "punt_error_to_queue": "errors"})
    assert config.queue("dead").expire_to_queue == "dead"  # that queue keeps its expired items


def test_a_server_with_a_fanout_reader_as_error_queue_does_not_start(tmp_path):
    path = tmp_path / "kestreld.conf"
    path.write_text('[queues.jobs]\npunt_error_to_queue = "fanq+r"\n')
    result = subprocess.run(
        [sys.executable, "-m", "kestreld", "--config", str(path), "--port", "0",
         "--queue-path", str(tmp_path / "queues")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "queues.jobs.punt_error_to_queue: 'fanq+r' is a fanout reader" in result.stderr


def test_check_config_refuses_an_expire_to_queue_naming_its_own_queue(tmp_path):
    result = check(tmp_path, '[queues.q]\nexpire_to_queue = "q"\n')
    assert result.returncode == 2
    assert "queues.q.expire_to_queue: 'q' is the queue itself" in result.stderr


def test_reload_refuses_a_bad_target_and_keeps_the_old_config(make_server):
    from kestreld_process import Conn

    proc = make_server('[queues.jobs]\npunt_error_to_queue = "retry"\n')
    proc.config_path.write_text('[queues.jobs]\npunt_error_to_queue = "fanq+r"\nmax_items = 3\n')
    c = Conn(proc.connect())
    c.send("reload\r\n")
    reply = c.line()
    assert reply.startswith(b"SERVER_ERROR config not reloaded: "), reply
    assert b"punt_error_to_queue" in reply and b"fanout reader" in reply
    c.send("dump_config jobs\r\n")
    lines = c.until_end()
    assert b"  punt_error_to_queue=retry" in lines
    assert b"  max_items=(none)" in lines
    c.close()
