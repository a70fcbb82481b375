"""``workers = 2``: one port and one folder served by two worker processes and their
supervisor, checked from outside with raw memcache connections."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from kestreld_process import Conn, KestreldProcess
from worker_box import owned_by, until

WORKERS = 2


@pytest.fixture
def box(make_server) -> KestreldProcess:
    return make_server(args=["--workers", str(WORKERS)])


@pytest.fixture
def names() -> tuple[str, str]:
    """Two queues: the first owned by worker 0, the second by worker 1."""
    return owned_by(0, "jobs"), owned_by(1, "jobs")


def _conn(server: KestreldProcess) -> Conn:
    return Conn(server.connect())


def _stats(conn: Conn) -> dict[str, str]:
    return conn.stats()


def _on_worker(server: KestreldProcess, index: int, rounds: int = 100) -> Conn:
    """A connection the given worker accepted.  The kernel picks; connections opened
    together are spread between the workers waiting in accept, so each round opens a
    few at once and keeps the one that landed where wanted."""
    for _ in range(rounds):
        batch = [_conn(server) for _ in range(8)]
        found = None
        for conn in batch:
            if found is None and _stats(conn)["worker"] == str(index):
                found = conn
            else:
                conn.close()
        if found is not None:
            return found
        time.sleep(0.01)
    pytest.fail(f"no connection landed on worker {index} in {rounds} rounds of 8")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_box_starts_one_worker_per_count_and_says_so(box):
    assert sorted(box.worker_pids()) == [0, 1]
    assert box.events("listening")[0]["workers"] == WORKERS
    stats = _stats(_conn(box))
    assert stats["workers"] == "2" and stats["workers_answering"] == "2"


def test_queues_land_on_both_workers(box, names):
    conn = _conn(box)
    for name in names:
        assert conn.set(name, b"x") == b"STORED"
    expected = {names[0]: 0, names[1]: 1}

    def created() -> dict[str, int]:  # each worker writes its own log lines: wait for both
        return {e["queue"]: e["worker"] for e in box.events("queue_created")}

    assert until(lambda: created() == expected), created()


def test_each_worker_loads_only_its_own_queues_after_a_restart(box, names):
    conn = _conn(box)
    for name in names:
        conn.set(name, b"x")
    conn.close()
    box.restart()
    loaded = [(e["queue"], e["worker"]) for e in box.events("queue_loaded")]
    assert sorted(loaded) == sorted([(names[0], 0), (names[1], 1)])
    conn = _conn(box)
    assert [conn.get(name) for name in names] == [b"x", b"x"]


def test_fifo_per_queue_across_many_connections(box, names):
    conns = [_conn(box) for _ in range(8)]
    for name in names:
        for i in range(80):
            assert conns[i % 8].set(name, f"{i}") == b"STORED"
    for name in names:
        got = [conns[(i * 3) % 8].get(name) for i in range(80)]
        assert got == [f"{i}".encode() for i in range(80)]
        assert conns[0].get(name) is None


def test_a_crossed_reliable_read_comes_back_in_order_when_the_client_leaves(box, names):
    # Whichever worker accepts the connection, one of the two queues is the other's.
    conn = _conn(box)
    for name in names:
        for i in range(3):
            conn.set(name, f"{name}-{i}")
    reader = _conn(box)
    for name in names:
        assert reader.get(f"{name}/open") == f"{name}-0".encode()
        reader.send(f"get {name}/close/open\r\n")
        assert reader.read_value() == f"{name}-1".encode()
    reader.close()
    for name in names:
        back = f"{name}-1".encode()  # the open read is back at the head, in order
        assert until(lambda n=name, b=back: conn.get(f"{n}/peek") == b)
        assert [conn.get(name) for _ in range(2)] == [f"{name}-1".encode(), f"{name}-2".encode()]
    assert int(_stats(conn)["worker_requests_crossed"]) > 0


def test_a_crossed_set_waits_for_the_owners_stored_and_keeps_reply_order(box, names):
    conn = _conn(box)
    payload = b"".join(
        f"set {name} 0 0 1\r\n{i}\r\nget {name}\r\n".encode() for i in range(5) for name in names
    )
    conn.send(payload)
    for i in range(5):
        for name in names:
            assert conn.line() == b"STORED"
            assert conn.read_value() == f"{i}".encode(), name


def test_noreply_requests_cross_without_a_reply(box, names):
    conn = _conn(box)
    for name in names:
        conn.send(f"set {name} 0 0 2 noreply\r\nhi\r\n")
    for name in names:
        assert conn.get(name) == b"hi"


def _half_closed(conn: Conn, request: str) -> bytes:
    """Send ``request`` and the end of the stream (``nc -N``); all the server sent."""
    conn.send(request)
    conn.sock.shutdown(socket.SHUT_WR)
    out = conn.buf
    while data := conn.sock.recv(65536):
        out += data
    conn.close()
    return out


def test_a_crossed_monitor_ended_by_the_clients_half_close_sends_its_items(box, names):
    other = names[1]
    conn = _conn(box)
    assert conn.set(other, "a") == b"STORED"
    out = _half_closed(_on_worker(box, 0), f"monitor {other} 10 5\r\n")
    assert out == f"VALUE {other} 0 1\r\na\r\nEND\r\n".encode()  # whole items, no END after
    assert until(lambda: conn.get(f"{other}/peek") == b"a")  # its read went back at the close


def test_a_crossed_monitor_ended_by_the_clients_half_close_before_any_item_sends_nothing(
    box, names
):
    other = names[1]
    assert _half_closed(_on_worker(box, 0), f"monitor {other} 10 5\r\n") == b""


def test_a_crossed_wait_of_a_half_closed_client_ends_at_once_with_a_quit_behind_it(box, names):
    other = names[1]
    conn = _on_worker(box, 0)
    started = time.monotonic()
    out = _half_closed(conn, f"get {other}/t=60000\r\nquit\r\n")
    assert out.startswith(b"END\r\n")
    assert time.monotonic() - started < 5, "the wait ended with the stream, not with /t="


def test_kill_9_of_a_worker_restarts_it_and_its_items_come_back(box, names):
    victim_queue, other_queue = names  # worker 0 owns the first
    survivor = _on_worker(box, 1)
    writer = _conn(box)  # (with worker_handoff it may move to worker 0: it leaves first)
    for i in range(5):
        writer.set(victim_queue, f"v{i}")
        survivor.set(other_queue, f"o{i}")
    writer.close()
    old = box.worker_pids()
    os.kill(old[0], signal.SIGKILL)
    killed = time.monotonic()
    # The other worker's client goes on with its own worker's queue meanwhile.
    assert survivor.get(other_queue) == b"o0"
    restarted = until(lambda: box.worker_pids().get(0, old[0]) != old[0], timeout=5)
    assert restarted, "worker 0 was not restarted"
    assert time.monotonic() - killed < 2.5  # restarted within about a second
    assert box.events("worker_died")
    assert [survivor.get(other_queue) for _ in range(4)] == [f"o{i}".encode() for i in range(1, 5)]
    fresh = _conn(box)
    assert [fresh.get(victim_queue) for _ in range(5)] == [f"v{i}".encode() for i in range(5)]


def test_kill_9_of_the_supervisor_leaves_no_worker_and_frees_the_port(box, make_server):
    pids = box.worker_pids()
    port = box.port
    box.kill()
    assert until(lambda: not any(_alive(pid) for pid in pids.values()), timeout=5)
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("127.0.0.1", port))  # free: no worker holds it
    probe.close()
    # The folder is free too: a new box starts on it.
    again = make_server(queue_path=box.queue_path, args=["--workers", str(WORKERS)])
    assert _stats(_conn(again))["workers_answering"] == "2"


def test_sigterm_stops_every_worker_gracefully_and_keeps_everything(box, names):
    conn = _conn(box)
    for name in names:
        conn.set(name, f"kept-{name}")
    pids = box.worker_pids()
    assert box.stop() == 0
    assert not any(_alive(pid) for pid in pids.values())
    assert len(box.events("worker_stopped")) == WORKERS
    box.start()
    conn = _conn(box)
    assert [conn.get(name) for name in names] == [f"kept-{name}".encode() for name in names]


def test_stats_totals_are_the_sum_over_the_workers(box, names):
    conn = _conn(box)
    for _ in range(3):
        conn.set(names[0], b"a")
    for _ in range(5):
        conn.set(names[1], b"bb")
    stats = _stats(conn)
    assert stats["curr_items"] == "8"
    assert stats[f"queue_{names[0]}_items"] == "3"
    assert stats[f"queue_{names[1]}_items"] == "5"
    assert stats["bytes"] == str(3 + 10)
    assert stats["curr_connections"] == "1"  # the workers' own channels are not clients
    assert stats["cmd_set"] == "8"


def test_flush_all_empties_the_queues_of_every_worker(box, names):
    conn = _conn(box)
    for name in names:
        conn.set(name, b"x")
    conn.send("flush_all\r\n")
    assert conn.line() == b"Flushed all queues."
    assert [conn.get(name) for name in names] == [None, None]


def test_flush_all_noreply_runs_on_every_worker_before_the_next_request(box, names):
    conn = _conn(box)
    for name in names:
        conn.set(name, b"x")
    conn.send("flush_all noreply\r\nversion\r\n")
    assert conn.line().startswith(b"VERSION")  # nothing was sent for the flush_all
    assert [conn.get(name) for name in names] == [None, None]


def test_dump_stats_lists_the_queues_of_every_worker(box, names):
    conn = _conn(box)
    for name in names:
        conn.set(name, b"x")
    conn.send("dump_stats\r\n")
    lines = conn.until_end()
    assert f"queue '{names[0]}' {{".encode() in lines
    assert f"queue '{names[1]}' {{".encode() in lines


def test_status_set_on_one_worker_holds_on_every_worker(box, names):
    conn = _conn(box)
    conn.send("status readonly\r\n")
    assert conn.line() == b"END"
    for name in names:
        assert conn.set(name, b"x").startswith(b"SERVER_ERROR")
    conn.send("status up\r\n")
    assert conn.line() == b"END"


def test_shutdown_stops_the_box(box):
    conn = _conn(box)
    conn.send("shutdown\r\n")
    assert box.proc.wait(15) == 0


def test_a_reload_that_changes_workers_keeps_the_running_count(make_server, monkeypatch):
    monkeypatch.delenv("KESTRELD_TEST_WORKERS", raising=False)  # --workers would pin it
    server = make_server(config="workers = 2\n")
    server.config_path.write_text("workers = 3\nmax_items = 5\n")
    conn = _conn(server)
    conn.send("reload\r\n")
    reply = conn.line()
    assert b"needs a restart to apply" in reply and b"workers" in reply
    assert _stats(conn)["workers"] == "2"

    def said() -> list[dict]:
        events = server.events("config_reload_needs_restart")
        return [e for e in events if "workers" in e["keys"]]

    assert len(until(lambda: len(said()) == WORKERS and said())) == WORKERS  # each worker


def test_a_get_of_keys_on_both_workers_answers_in_key_order(box, names):
    conn = _conn(box)
    first, second = names
    conn.set(first, b"1")
    conn.set(second, b"2")
    conn.send(f"get {second} {first} {second}_empty\r\n")
    assert conn.until_end() == [
        f"VALUE {second} 0 1".encode(),
        b"2",
        f"VALUE {first} 0 1".encode(),
        b"1",
        b"END",
    ]


def test_a_set_to_an_alias_reaches_destinations_on_both_workers(make_server, names):
    first, second = names
    box = make_server(
        config=f'[aliases.both]\ndestination_queues = ["{first}", "{second}"]\n',
        args=["--workers", str(WORKERS)],
    )
    conn = _conn(box)
    assert conn.set("both", b"fan") == b"STORED"  # once every destination has it
    assert [conn.get(first), conn.get(second)] == [b"fan", b"fan"]


def test_an_aborted_item_is_punted_to_an_error_queue_on_the_other_worker(make_server, names):
    source, errors = names
    box = make_server(
        config=f'[queues.{source}]\npunt_error_to_queue = "{errors}"\n',
        args=["--workers", str(WORKERS)],
    )
    conn = _conn(box)
    conn.set(source, b"bad")
    assert conn.get(f"{source}/open") == b"bad"
    conn.send(f"get {source}/abort\r\n")
    assert conn.line() == b"END"
    assert until(lambda: conn.get(errors)) == b"bad"
    assert conn.get(source) is None  # it left the source once the error queue had it


def test_a_set_to_an_alias_whose_destination_on_the_other_worker_is_full_is_not_stored(
    make_server, names
):
    first, second = names
    box = make_server(
        config=(
            f"[queues.{second}]\nmax_items = 1\n"
            f'[aliases.both]\ndestination_queues = ["{first}", "{second}"]\n'
        ),
        args=["--workers", str(WORKERS)],
    )
    conn = _conn(box)  # wherever it lands: the source is worker 0's, the target 1's
    assert conn.set(second, b"first") == b"STORED"
    assert conn.set("both", b"x") == b"NOT_STORED"
    assert conn.get(first) == b"x"  # the other destination still got it (Kestrel's rule)


def test_an_abort_that_punts_across_is_answered_once_the_target_has_the_item(make_server, names):
    source, errors = names
    box = make_server(
        config=f'[queues.{source}]\npunt_error_to_queue = "{errors}"\n',
        args=["--workers", str(WORKERS)],
    )
    conn = _conn(box)  # wherever it lands: the source is worker 0's, the target 1's
    conn.set(source, b"bad")
    assert conn.get(f"{source}/open") == b"bad"
    conn.send(f"get {source}/abort\r\n")
    assert conn.line() == b"END"
    assert conn.get(errors) == b"bad"  # no wait: the reply came after the owner stored it


def test_an_item_punted_across_keeps_its_error_count(make_server, names):
    source, errors = names
    poison = owned_by(0, "poison")
    box = make_server(
        config=(
            f'[queues.{source}]\npunt_error_to_queue = "{errors}"\n'
            f'[queues.{errors}]\npunt_many_errors_to_queue = "{poison}"\n'
            "punt_many_errors_count = 2\n"
        ),
        args=["--workers", str(WORKERS)],
    )
    conn = _conn(box)
    conn.set(source, b"bad")
    for queue in (source, errors):  # its first abort on worker 0, its second on worker 1
        assert conn.get(f"{queue}/open") == b"bad"
        conn.send(f"get {queue}/abort\r\n")
        assert conn.line() == b"END"
    assert conn.get(poison) == b"bad"  # 2 errors: counted on both workers
    assert conn.get(errors) is None


def test_max_queues_counts_the_queues_of_the_whole_box(make_server):
    box = make_server(config="max_queues = 3\n", args=["--workers", str(WORKERS)])
    conn = _conn(box)
    names = [owned_by(0, "a"), owned_by(1, "b"), owned_by(0, "c")]
    for name in names:
        assert conn.set(name, b"x") == b"STORED"
    for index in (0, 1):  # refused on either worker: the box holds three
        name = owned_by(index, "more")
        assert conn.set(name, b"x") == (
            f"SERVER_ERROR too many queues (max_queues = 3); {name} not created".encode()
        )
    conn.send(f"delete {names[1]}\r\n")
    assert conn.line() == b"DELETED"
    # A deleted queue frees the budget of every worker (each writes its count every second).
    other = owned_by(0, "more")
    assert until(lambda: conn.set(other, b"x") == b"STORED")


def test_an_authenticated_user_s_roles_hold_on_queues_of_every_worker(make_server, names, tmp_path):
    from kestreld.security import hash_password

    users = tmp_path / "users"
    hashed = hash_password("r", log2_n=4)
    users.write_text(f"alice:{hash_password('a', log2_n=4)}\nreader:{hashed}:read\n")
    box = make_server(config=f'auth_file = "{users}"\n', args=["--workers", str(WORKERS)])

    def login(name: str, password: str) -> Conn:
        conn = _conn(box)
        token = f"{name} {password}".encode()
        conn.send(b"set any 0 0 %d\r\n%s\r\n" % (len(token), token))
        assert conn.line() == b"STORED"
        return conn

    alice, reader = login("alice", "a"), login("reader", "r")
    for name in names:
        assert alice.set(name, b"x") == b"STORED"
        assert reader.set(name, b"y") == b"CLIENT_ERROR permission denied"
        assert reader.get(name) == b"x"
    unauthenticated = _conn(box)
    unauthenticated.send(f"get {names[1]}\r\n")
    assert unauthenticated.line() == b"CLIENT_ERROR unauthenticated"


def test_a_declared_size_above_the_limit_is_refused_before_its_block_crosses(make_server, names):
    box = make_server(config='max_item_size = "1KiB"\n', args=["--workers", str(WORKERS)])
    conn = _conn(box)
    for name in names:
        conn.send(f"set {name} 0 0 2000\r\n" + "x" * 2000 + "\r\n")
        assert conn.line() == b"NOT_STORED"
    assert [conn.get(name) for name in names] == [None, None]


def test_a_worker_that_cannot_start_is_retried_until_it_can(make_server, tmp_path):
    folder = tmp_path / "damaged"
    folder.mkdir()
    (folder / "oldq").write_bytes(b"\x01")  # a Kestrel 2.x journal: a worker refuses to start
    box = make_server(queue_path=folder, args=["--workers", str(WORKERS)])
    assert until(lambda: len(box.events("worker_failed_to_start")) >= 2 * WORKERS)
    assert box.events("listening")[0]["workers_serving"] == 0
    (folder / "oldq").unlink()  # repaired: the next try serves
    assert until(lambda: sorted(box.worker_pids()) == [0, 1], timeout=15)
    conn = _conn(box)
    assert conn.set("after", b"ok") == b"STORED"
    retries = [e["retry_in"] for e in box.events("worker_failed_to_start") if e["worker"] == 0]
    assert retries == sorted(retries) and retries[0] < retries[-1]  # backing off


def test_sighup_reloads_every_worker(make_server, monkeypatch):
    monkeypatch.delenv("KESTRELD_TEST_WORKERS", raising=False)
    box = make_server(config="workers = 2\nmax_items = 1\n")
    conn = _conn(box)
    first = owned_by(0, "hup")
    box.config_path.write_text("workers = 2\nmax_items = 2\n")
    box.proc.send_signal(signal.SIGHUP)
    assert until(lambda: len(box.events("config_reloaded")) == WORKERS)
    for name in (first, owned_by(1, "hup")):
        assert [conn.set(name, b"x") for _ in range(3)] == [b"STORED", b"STORED", b"NOT_STORED"]


def test_a_crossed_monitor_sends_each_item_as_it_comes(box, names):
    watcher = _conn(box)
    crossed = names[1 - int(_stats(watcher)["worker"])]  # owned by the other worker
    producer = _conn(box)
    assert producer.set(crossed, b"first") == b"STORED"
    started = time.monotonic()
    watcher.send(f"monitor {crossed} 3\r\n")
    assert watcher.read_value() == b"first"
    assert time.monotonic() - started < 2.0  # not held until the monitor's end
    assert producer.set(crossed, b"second") == b"STORED"
    assert watcher.read_value() == b"second"
    assert watcher.line() == b"END"  # the monitor's own, after its 3 seconds
    assert time.monotonic() - started >= 2.5
    watcher.send(f"confirm {crossed} 2\r\n")
    assert watcher.line() == b"END"
