"""``workers = 2`` with Kestrel's text and thrift ports: a request runs at its queue's
owner, whichever worker the client landed on, checked from outside with raw text
connections and thrift clients."""

from __future__ import annotations

import os
import signal
import socket
import struct
import time

import pytest
from kestrel_fronts import TextConn, kestrel, start_fronts, thrift_client
from kestreld_process import Conn, KestreldProcess
from thriftpy2.protocol import TBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport import TMemoryBuffer
from worker_box import owned_by, until

WORKERS = 2


@pytest.fixture
def box(tmp_path) -> KestreldProcess:
    proc = start_fronts(tmp_path / "queues", workers=WORKERS)
    yield proc
    proc.stop()


@pytest.fixture
def names(qname) -> tuple[str, str]:
    """Two fresh queues: the first owned by worker 0, the second by worker 1."""
    return owned_by(0, f"{qname}_a"), owned_by(1, f"{qname}_b")


def _stats(box: KestreldProcess) -> dict[str, str]:
    conn = Conn(box.connect())
    try:
        return conn.stats()
    finally:
        conn.close()


def _crossed(box: KestreldProcess) -> int:
    return int(_stats(box)["worker_requests_crossed"])


def _text_on(box: KestreldProcess, index: int) -> TextConn:
    """A text connection worker ``index`` accepted: a peek of a queue worker 1 owns
    crosses from worker 0 only (the box's ``worker_requests_crossed`` tells)."""
    probe = owned_by(1, "probe")
    for _ in range(100):
        batch = [TextConn(box.text_port) for _ in range(4)]
        found = None
        for conn in batch:
            before = _crossed(box)
            assert conn.ask(f"peek {probe}") == b"*"
            landed = 0 if _crossed(box) > before else 1
            if found is None and landed == index:
                found = conn
            else:
                conn.close()
        if found is not None:
            return found
    pytest.fail(f"no text connection landed on worker {index}")


def _thrift_on(box: KestreldProcess, index: int):
    probe = owned_by(1, "probe")
    for _ in range(100):
        batch = [thrift_client(box.thrift_port) for _ in range(4)]
        found = None
        for client in batch:
            before = _crossed(box)
            client.peek(probe)
            landed = 0 if _crossed(box) > before else 1
            if found is None and landed == index:
                found = client
            else:
                client.close()
        if found is not None:
            return found
    pytest.fail(f"no thrift connection landed on worker {index}")


def _raw_thrift_call(method: str, args) -> bytes:
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin(method, TMessageType.CALL, 1)
    args.write(proto)
    proto.write_message_end()
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


# --- text -------------------------------------------------------------------------------------


def test_the_listening_event_names_the_text_and_thrift_ports(box):
    [event] = box.events("listening")
    assert event["text"].endswith(f":{box.text_port}")
    assert event["thrift"].endswith(f":{box.thrift_port}")


def test_a_text_put_through_one_worker_to_a_queue_another_owns_is_got_through_either(box, names):
    _, theirs = names
    here, there = _text_on(box, 0), _text_on(box, 1)
    assert here.put(theirs, "one", "two") == b"+2"
    assert here.ask(f"get {theirs}") == b":one"
    assert there.ask(f"get {theirs}") == b":two"


def test_text_open_reads_of_a_client_that_leaves_come_back_in_order(box, names):
    _, theirs = names
    here = _text_on(box, 0)
    assert here.put(theirs, "first") == b"+1"
    other = TextConn(box.text_port)
    assert other.put(theirs, "second") == b"+1"
    assert here.ask(f"get {theirs}") == b":first"  # opened at the owner, held by `here`
    here.close()
    assert until(lambda: _stats(box)[f"queue_{theirs}_open_transactions"] == "0")
    assert other.ask(f"get {theirs}") == b":first"
    assert other.ask(f"confirm {theirs} 1") == b"+1"
    assert other.ask(f"get {theirs}") == b":second"


def test_a_text_get_confirms_the_previous_read_at_the_owner(box, names):
    _, theirs = names
    here = _text_on(box, 0)
    assert here.put(theirs, "a", "b") == b"+2"
    assert here.ask(f"get {theirs}") == b":a"
    assert here.ask(f"get {theirs}") == b":b"  # confirms a
    here.close()
    other = TextConn(box.text_port)
    assert other.ask(f"get {theirs} 2000") == b":b"
    assert other.ask(f"get {theirs}") == b"*"


def test_a_text_get_with_a_timeout_on_a_foreign_queue_gets_an_item_put_later(box, names):
    _, theirs = names
    here = _text_on(box, 0)
    here.send(f"get {theirs} 5000\n")
    time.sleep(0.2)
    other = TextConn(box.text_port)
    assert other.put(theirs, "late") == b"+1"
    assert here.line() == b":late"


def test_a_text_monitor_of_a_foreign_queue_relays_items_then_star(box, names):
    _, theirs = names
    here = _text_on(box, 0)
    assert here.put(theirs, "x", "y") == b"+2"
    here.send(f"monitor {theirs} 300\n")
    assert [here.line(), here.line(), here.line()] == [b":x", b":y", b"*"]


def test_text_status_is_set_in_every_worker(box, names):
    mine, theirs = names
    here = _text_on(box, 0)
    assert here.ask("status readonly") == b"+0"
    try:
        for queue in (mine, theirs):
            assert here.put(queue, "refused").startswith(b"-")
        assert here.ask("status") == b":READONLY"
    finally:
        assert here.ask("status up") == b"+0"
    assert here.put(theirs, "ok") == b"+1"


def test_box_stats_count_text_clients_once_and_items_wherever_they_live(box, names):
    here = _text_on(box, 0)
    for queue in names:
        assert here.put(queue, "1", "2", "3") == b"+3"
    stats = _stats(box)
    for queue in names:
        assert stats[f"queue_{queue}_items"] == "3"
    # the text client, the probes still open and this stats connection: never a channel
    assert int(stats["curr_connections"]) <= 3
    assert int(stats["worker_requests_crossed"]) >= 2


def test_a_text_wait_at_an_owner_that_dies_is_answered_and_the_next_request_reaches_its_successor(
    box, names
):
    _, theirs = names
    here = _text_on(box, 0)
    here.send(f"get {theirs} 10000\n")
    time.sleep(0.2)
    old = box.worker_pids()
    os.kill(old[1], signal.SIGKILL)
    assert here.line().startswith(b"-Worker 1 is not serving")
    assert until(lambda: box.worker_pids().get(1, old[1]) != old[1])
    assert until(lambda: here.put(theirs, "after") == b"+1")
    assert here.ask(f"get {theirs}") == b":after"


def test_text_shutdown_stops_the_whole_box(box):
    here = _text_on(box, 1)
    assert here.ask("shutdown") == b"+0"
    assert box.proc.wait(timeout=20) == 0


# --- thrift -----------------------------------------------------------------------------------


def test_a_thrift_put_through_one_worker_to_a_queue_another_owns_is_got_through_either(box, names):
    _, theirs = names
    here, there = _thrift_on(box, 0), _thrift_on(box, 1)
    assert here.put(theirs, [b"one", b"two"], 0) == 2
    assert [i.data for i in here.get(theirs, 1, 0, 0)] == [b"one"]
    assert [i.data for i in there.get(theirs, 1, 0, 0)] == [b"two"]


def test_thrift_reads_held_by_a_waiting_get_of_a_client_that_leaves_come_back_in_order(box, names):
    _, theirs = names
    other = thrift_client(box.thrift_port)
    assert other.put(theirs, [b"first", b"second"], 0) == 2
    raw = None
    for _ in range(100):  # a raw connection worker 0 accepted
        sock = socket.create_connection(("127.0.0.1", box.thrift_port), timeout=20)
        before = _crossed(box)
        args = kestrel.Kestrel.get_args(queue_name=theirs, max_items=3, timeout_msec=10000)
        sock.sendall(_raw_thrift_call("get", args))
        if until(lambda b=before: _crossed(box) > b, 0.5):
            raw = sock
            break
        sock.close()  # it landed on the owner: its reads go back there as well
    assert raw is not None
    assert until(lambda: _stats(box)[f"queue_{theirs}_open_transactions"] == "2")
    raw.close()
    assert until(lambda: _stats(box)[f"queue_{theirs}_open_transactions"] == "0")
    assert [i.data for i in other.get(theirs, 2, 0, 0)] == [b"first", b"second"]


def test_a_thrift_get_with_timeout_on_a_foreign_queue_gets_an_item_put_later(box, names):
    _, theirs = names
    here = _thrift_on(box, 0)
    other = thrift_client(box.thrift_port)
    # The call is sent now and its reply read after the put (thriftpy2's two halves).
    here._send("get", queue_name=theirs, max_items=1, timeout_msec=5000)
    time.sleep(0.2)
    assert other.put(theirs, [b"late"], 0) == 1
    assert [i.data for i in here._recv("get")] == [b"late"]


def test_thrift_ids_of_a_foreign_queue_are_confirmed_from_another_connection(box, names):
    _, theirs = names
    here, there = _thrift_on(box, 0), _thrift_on(box, 1)
    assert here.put(theirs, [b"held"], 0) == 1
    [item] = here.get(theirs, 1, 0, 60000)
    assert item.id > 0
    assert there.confirm(theirs, {item.id}) == 1
    assert there.peek(theirs).items == 0


def test_thrift_flush_all_queues_flushes_every_workers_queues(box, names):
    here = _thrift_on(box, 0)
    for queue in names:
        assert here.put(queue, [b"x"], 0) == 1
    here.flush_all_queues()
    for queue in names:
        assert here.peek(queue).items == 0


def test_thrift_set_status_is_set_in_every_worker(box, names):
    here, there = _thrift_on(box, 0), _thrift_on(box, 1)
    here.set_status(kestrel.Status.READ_ONLY)
    try:
        assert there.current_status() == kestrel.Status.READ_ONLY
    finally:
        here.set_status(kestrel.Status.UP)
    assert there.current_status() == kestrel.Status.UP
