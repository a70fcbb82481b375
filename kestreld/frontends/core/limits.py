"""What one connection may hold, on every front end: the connection core's contract.

Every front end keeps these alike (tests/frontends/test_front_ends_core.py runs each case
against the memcache, text and thrift ports):

- **Input**: the request being answered and at most :data:`REQUESTS_AHEAD` more
  are held; a client that pipelines beyond that is paused (``pause_reading``:
  its bytes wait in the kernel) and served in order afterwards, never
  disconnected for it.  Before authentication the same bound holds.
- **One request** is held whole before it runs, so its size bounds the input:
  a request line is at most ``max_line_length``; the items of one text ``put``
  or one thrift frame at most :data:`MAX_REQUEST_ITEM_BYTES` (a memcache data
  block at most ``max_item_size``, streamed to a skip when refused).  Over the
  limit: the protocol's own error, then the one close path; a thrift frame
  announcing more is refused from its length, before its body is read.
- **Output**: no request runs while the transport's buffer is over its high
  water mark (``pause_writing``): a client that never reads stops being served.
- **Closing** is one path per connection: the replies owed are sent first, then
  the session ends and gives back its open reads and its wait.  A client that
  leaves during a wait ends it at once; nothing taken for it outlives it.
- **Reading is shared**: once a connection has read :data:`READ_SLICE_BYTES` since
  its last pause, its reading ends for this turn of the event loop (it pauses and
  resumes on the next turn, unless paused meanwhile for one of the reasons above), so
  a client streaming a large item is read a slice per turn, not whole in one.

The memcache connection (compiled, :mod:`kestreld.frontends.memcache.connection`)
keeps the same contract with byte counts of its own (``INPUT_PAUSE_LIMIT``,
``OUTPUT_HOLD_LIMIT``): its requests are judged in the read that brings them.
The text and thrift connections share :mod:`kestreld.frontends.core.request_loop`.
"""

from __future__ import annotations

#: Requests held beyond the one being answered before reading from the socket pauses.
REQUESTS_AHEAD = 1
#: Item bytes one request (a text ``put``, a thrift frame) may carry whatever
#: ``max_item_size`` is: a request is held whole before it runs.
MAX_REQUEST_ITEM_BYTES = 64 * 1024 * 1024
#: Bytes a connection reads before it yields the rest of the loop's turn.  The event loop
#: reads a socket again in the same turn after every read that filled its buffer (libuv:
#: up to 32 reads of uvloop's 256,000 B, a whole 8 MiB item in one turn, 2 to 3.5 ms);
#: a slice is at most this plus one buffer (3 reads, 0.6 to 0.8 ms on a loaded 2-core VM).
#: Slices of one buffer (64 KiB) cost the small client of the fairness test 15 to 30 % of
#: its sets (each of its requests shared a turn with a slice); 512 KiB kept its pace, 1 MiB
#: (5 reads) held the loop 1.0 to 1.3 ms.  A read of small requests pays an add and a compare.
READ_SLICE_BYTES = 512 * 1024

__all__ = ["MAX_REQUEST_ITEM_BYTES", "READ_SLICE_BYTES", "REQUESTS_AHEAD"]
