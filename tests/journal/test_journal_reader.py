"""A reader's journal side on its own (sans-IO, no journal): what it consumed and what it owes.

libkestrel's ``Journal.Reader``: the head below which every id is done, the ids confirmed out
of order above it, and the ids still owed below it after a flush passed open reads.
"""

from __future__ import annotations

from kestreld.journal.journal_reader import JournalReader


def _reader() -> JournalReader:
    return JournalReader("q", None, None)


def test_ids_confirmed_out_of_order_wait_above_the_head_until_the_gap_closes():
    jr = _reader()
    for id_ in (2, 3, 5):
        jr.commit(id_)
    assert (jr.head, jr.done) == (0, {2, 3, 5})
    jr.commit(1)
    assert (jr.head, jr.done) == (3, {5})
    jr.commit(4)
    assert (jr.head, jr.done) == (5, set())


def test_an_id_at_or_below_the_head_was_put_before_the_reader_existed():
    jr = _reader()
    jr.start_at(10)
    assert not jr.seen(10)
    assert jr.seen(11) and jr.tail == 11


def test_a_flush_jumps_the_head_to_the_tail_and_holds_only_the_open_reads():
    jr = _reader()
    for id_ in range(1, 8):
        jr.seen(id_)
    jr.commit(1)
    jr.commit(5)
    jr.flush(open_ids=[2, 3])
    assert (jr.head, jr.done, jr.held) == (7, set(), {2, 3})
    assert jr.floor() == 0  # the held ids keep their segment until the next rewrite
    jr.commit(2)  # a held read confirmed
    assert jr.held == {3}


def test_a_read_reopened_after_a_flush_passed_it_is_owed_again():
    jr = _reader()
    for id_ in range(1, 4):
        jr.seen(id_)
    jr.flush(open_ids=[])
    jr.hold(2)
    assert jr.held == {2} and jr.dirty
    jr.hold(9)  # above the head: nothing to hold
    assert jr.held == {2}


def test_a_range_lost_to_damage_is_consumed_in_one_step():
    jr = _reader()
    jr.commit(7)
    jr.commit_range(1, 5)
    assert (jr.head, jr.done) == (5, {7})
    jr.commit_range(6, 6)
    assert (jr.head, jr.done) == (7, set())
