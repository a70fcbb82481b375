"""The journal tick: one flush callback per event-loop turn for every writer, or none at all
when a lone client's read is written before its callback returns.

Sans-IO: the writers here only record their flushes (the real writer journal's use of the
tick is covered by tests/frontends/test_connection_state.py and every server test)."""

from __future__ import annotations

import asyncio

from kestreld.journal.tick import Flushing, Tick


class Writer(Flushing):
    """Records when it was flushed; may ask the tick again while flushing."""

    def __init__(self, name: str, log: list[str], tick: Tick, again: Writer | None = None):
        self.name = name
        self.log = log
        self.tick = tick
        self.again = again

    def flush(self) -> None:
        self.log.append(self.name)
        if self.again is not None:
            again, self.again = self.again, None
            self.tick.add(again)


async def _turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_without_a_running_loop_the_caller_flushes_itself():
    tick = Tick()
    assert tick.add(Writer("a", [], tick)) is False
    assert tick.writers == [] and not tick.scheduled


async def test_writers_of_one_turn_share_one_callback_and_flush_in_order():
    tick, log = Tick(), []
    a, b = Writer("a", log, tick), Writer("b", log, tick)
    assert tick.add(a) and tick.scheduled
    assert tick.add(b)
    assert log == []  # nothing before the loop's next turn
    await _turn()
    assert log == ["a", "b"] and not tick.scheduled and tick.writers == []


async def test_a_held_batch_is_written_at_its_release_when_nobody_else_could_join():
    tick, log = Tick(), []
    tick.hold()
    tick.add(Writer("a", log, tick))
    assert not tick.scheduled and log == []
    tick.release(True)
    assert log == ["a"] and not tick.scheduled and tick.held == 0


async def test_a_held_batch_goes_on_the_next_turn_when_others_may_join():
    tick, log = Tick(), []
    tick.hold()
    tick.add(Writer("a", log, tick))
    tick.release(False)
    assert log == [] and tick.scheduled
    tick.add(Writer("b", log, tick))  # another connection's request, same turn
    await _turn()
    assert log == ["a", "b"]


async def test_only_the_outermost_release_flushes_and_joiners_go_in_the_same_pass():
    tick, log = Tick(), []
    late = Writer("late", log, tick)
    tick.hold()
    tick.hold()
    tick.add(Writer("a", log, tick, again=late))
    tick.release(True)
    assert log == []
    tick.release(True)
    assert log == ["a", "late"] and not tick.scheduled and tick.writers == []
    await _turn()
    assert log == ["a", "late"]  # no callback was left behind


class Broken(Flushing):
    def flush(self) -> None:
        raise RuntimeError("a bug in a flush")


async def test_a_failing_flush_leaves_the_writers_after_it_for_the_next_turn():
    tick, log = Tick(), []
    tick.hold()
    tick.add(Writer("a", log, tick))
    tick.add(Broken())
    tick.add(Writer("c", log, tick))
    try:
        tick.release(True)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the flush's error is not swallowed")
    assert log == ["a"] and tick.held == 0 and tick.scheduled
    await _turn()
    assert log == ["a", "c"] and tick.writers == [] and not tick.scheduled


class Serving(Flushing):
    """A flush whose acknowledgement serves a waiting consumer: what that sets off is asked
    for with soon() and must not run inside the flush."""

    def __init__(self, log: list[str], tick: Tick) -> None:
        self.log = log
        self.tick = tick

    def flush(self) -> None:
        self.log.append("flush")
        self.tick.soon(lambda: self.log.append("served"))
        self.log.append("flushed")


async def test_what_a_flush_sets_off_runs_after_it_in_the_same_pass():
    tick, log = Tick(), []
    tick.hold()
    tick.add(Serving(log, tick))
    tick.release(True)
    assert log == ["flush", "flushed", "served"]  # no loop turn in between
    assert tick.after == [] and not tick.scheduled and tick.held == 0


async def test_what_runs_after_may_write_again_in_the_same_pass():
    tick, log = Tick(), []

    def consumer_runs_its_next_request() -> None:
        log.append("served")
        tick.hold()  # the consumer's connection runs what it had buffered
        tick.add(Writer("confirm", log, tick))
        tick.release(True)  # nested: the outer pass writes it

    tick.hold()
    tick.add(Writer("put", log, tick))
    tick.soon(consumer_runs_its_next_request)
    tick.release(True)
    assert log == ["put", "served", "confirm"] and tick.writers == [] and tick.after == []


async def test_soon_outside_a_batch_runs_on_the_next_turn():
    tick, log = Tick(), []
    tick.soon(lambda: log.append("x"))
    assert log == [] and tick.scheduled
    await _turn()
    assert log == ["x"] and not tick.scheduled


async def test_soon_waits_for_a_flush_deferred_to_the_next_turn():
    tick, log = Tick(), []
    tick.hold()
    tick.add(Writer("a", log, tick))
    tick.soon(lambda: log.append("after"))
    tick.release(False)  # others may join: the write, and what follows it, on the next turn
    assert log == [] and tick.scheduled
    await _turn()
    assert log == ["a", "after"]


def test_soon_without_a_running_loop_is_refused():
    tick = Tick()
    try:
        tick.soon(lambda: None)
    except RuntimeError:
        pass
    else:
        raise AssertionError("nothing would ever run it")
