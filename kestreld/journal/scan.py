"""What a journal's segments hold, read from their files at start-up.

The writer journal recovers its newest segments' tails (:func:`recover_tail`) and learns
the id ranges of the others (:func:`learn_ranges`); each reader restored from a checkpoint
asks what it has left (:func:`unread`).  They read files once, before the server listens:
nothing here runs per request.
"""

from __future__ import annotations

import bisect

from kestreld.journal import codec
from kestreld.journal.segment import Segment

#: Start-up scans the segments past a reader's head whole up to this size (exact counts).
EXACT_SCAN_BYTES = 64 * 1024 * 1024


def learn_ranges(older: list[Segment], segments: list[Segment]) -> None:
    """The id range of each segment of ``older`` (all of ``segments`` but the newest ones,
    scanned whole): from its first record and the next segment's first id."""
    for seg in older:
        with open(seg.path, "rb") as f:
            head = f.read(codec.MAGIC_SIZE + codec.PUT_EXPIRY_HEADER_SIZE)
        first = codec.first_put_id(head)
        # Something other than a PUT first (unknown records): scan for it.
        seg.starts_at(first if first is not None else _first_id_slow(seg.path))
    for i, seg in enumerate(older):
        nxt = next((s.first_id for s in segments[i + 1 :] if s.first_id), 0)
        if seg.first_id and nxt > seg.first_id:
            items = nxt - seg.first_id
            data_bytes = max(0, seg.size - codec.MAGIC_SIZE - codec.PUT_HEADER_SIZE * items)
            seg.holds(seg.first_id, nxt - 1, items, data_bytes)
        elif seg.first_id:
            # No later segment holds a put (a crash right after a rotation
            # leaves an empty newest one): only the segment itself knows.
            _scan_range(seg)


def _scan_range(seg: Segment) -> None:
    """Learn a segment's id range by reading it whole (data skipped)."""
    with open(seg.path, "rb") as f:
        data = f.read()
    res = codec.scan(data, codec.MAGIC_SIZE, include_data=False)
    puts = [r for r in res.records if isinstance(r, codec.Put)]
    if puts:
        seg.holds(puts[0].id, max(p.id for p in puts), len(puts), sum(p.size for p in puts))


def _first_id_slow(path: str) -> int:
    with open(path, "rb") as f:
        data = f.read(codec.MAGIC_SIZE + codec.PUT_EXPIRY_HEADER_SIZE + codec.MAX_DATA_SIZE)
    for rec in codec.scan(data, codec.MAGIC_SIZE, include_data=False, limit=1).records:
        if isinstance(rec, codec.Put):
            return rec.id
    return 0


def recover_tail(seg: Segment) -> list[str]:
    """Scan the newest segment; cut it at the last complete record (warnings say what was cut).

    The segment learns what it holds and where appends go through its own verbs.
    """
    with open(seg.path, "rb") as f:
        data = f.read()
    pos = codec.MAGIC_SIZE
    first = last = items = nbytes = 0
    problem = None
    while True:
        res = codec.scan(data, pos, include_data=False)
        for rec in res.records:
            if isinstance(rec, codec.Put):
                if last and rec.id <= last:
                    problem = f"id {rec.id} after {last} at offset {rec.offset}"
                    res.pos = rec.offset
                    break
                first = first or rec.id
                last = rec.id
                items += 1
                nbytes += rec.size
        pos = res.pos
        if problem:
            break
        if res.status == codec.Status.CORRUPT:
            problem = f"corrupt record at offset {pos}: {res.problem}"
        elif res.status == codec.Status.MORE and pos < len(data):
            problem = f"torn record at offset {pos}"
        elif res.status == codec.Status.END and any(data[pos:]):
            problem = f"data after the end marker at offset {pos}"
        break
    warnings = []
    if pos < len(data):
        if problem:
            warnings.append(f"{seg.path}: {problem}; cut {len(data) - pos} bytes")
        with open(seg.path, "r+b") as f:
            f.truncate(pos)
    seg.holds(first, last, items, nbytes)
    seg.opened(pos)
    return warnings


def unread(
    segments: list[Segment], head: int, done: set[int], held: set[int]
) -> tuple[int, int, list[codec.Put]]:
    """What a reader restored at ``head`` has left: (items, data bytes, held puts).

    Exact when the segments past ``head`` hold at most :data:`EXACT_SCAN_BYTES`
    (their record headers are scanned, so ids confirmed out of order, ids
    lost to a failed batch and expiry headers never skew the counts).  Past
    that, only the segment holding the head and those holding done or held
    ids are scanned; the counts of the others come from their size (each
    item with an expiry counts 8 bytes too many until it is read), so a
    large backlog does not delay start-up.
    """
    items = nbytes = 0
    found: list[codec.Put] = []
    low = min(held) if held else head + 1
    wanted = [s for s in segments if s.first_id and s.last_id >= low]
    exact = sum(s.size for s in wanted) <= EXACT_SCAN_BYTES
    marked = sorted(done | held)
    for seg in wanted:
        if not exact and seg.first_id > head and not _any_within(marked, seg):
            items += seg.items
            nbytes += seg.data_bytes
            continue
        with open(seg.path, "rb") as f:
            data = f.read(seg.visible)
        res = codec.scan(data, codec.MAGIC_SIZE, include_data=bool(held))
        for rec in res.records:
            if not isinstance(rec, codec.Put):
                continue
            id_ = rec.id
            if id_ > head:
                if id_ not in done:
                    items += 1
                    nbytes += rec.size
            elif id_ in held:
                found.append(rec)
    found.sort(key=_put_id)
    return items, nbytes, found


def _put_id(put: codec.Put) -> int:
    return put.id


def _any_within(ids: list[int], seg: Segment) -> bool:
    """Some id of the sorted ``ids`` falls in ``seg``'s range."""
    i = bisect.bisect_left(ids, seg.first_id)
    return i < len(ids) and ids[i] <= seg.last_id
