"""The columns of the ``kestrel_journal`` data source, for Spark and for Arrow.

One row per journal record (one per id for a checkpoint's READ_DONE):

=============  ===========  ===================================================
column         Spark type   meaning
=============  ===========  ===================================================
queue          STRING       queue name (a 2.x fanout child ``q+r`` gives ``q``)
reader         STRING       reader name for checkpoint rows (``""`` = default
                            reader) and 2.x rows (``""`` = the parent queue);
                            null for writer-segment rows
segment        STRING       file name (no folder) the record was read from
offset         BIGINT       byte offset of the record in that file
op             STRING       ``PUT``, ``READ_HEAD``, ``READ_DONE``, ``PROBLEM``
                            or a Kestrel 2.x opcode name (``ADD``, ``ADDX``,
                            ``REMOVE``, ``ADD_XID``, ``CONTINUE``, ...)
id             BIGINT       item id (PUT), head (READ_HEAD), confirmed id
                            (READ_DONE), xid (2.x), null otherwise
add_time       TIMESTAMP    UTC, millisecond precision; null when unknown
expire_time    TIMESTAMP    UTC; null when the item never expires
error_count    INT          PUT only
size           INT          item data length (PUT and 2.x item ops)
data           BINARY       item bytes; null with ``includeData=false``.  For
                            ``PROBLEM`` rows: the problem text (UTF-8), always
=============  ===========  ===================================================

A ``PROBLEM`` row marks where a file stopped being readable (corrupt record,
torn tail, unreadable file): ``offset`` is where the damage starts and every
record before it is still returned, like the server does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

COLUMNS = (
    "queue",
    "reader",
    "segment",
    "offset",
    "op",
    "id",
    "add_time",
    "expire_time",
    "error_count",
    "size",
    "data",
)

#: The schema as a Spark DDL string (every column nullable).
SCHEMA_DDL = (
    "queue STRING, reader STRING, segment STRING, offset BIGINT, op STRING, id BIGINT, "
    "add_time TIMESTAMP, expire_time TIMESTAMP, error_count INT, size INT, data BINARY"
)

OP_PUT = "PUT"
OP_READ_HEAD = "READ_HEAD"
OP_READ_DONE = "READ_DONE"
OP_PROBLEM = "PROBLEM"

#: 2.x opcodes that carry an item (an add to the queue).
KESTREL2_ITEM_OPS = ("ADD", "ADDX", "ADD_XID", "CONTINUE")


def arrow_schema() -> pa.Schema:
    """The Arrow schema of every record batch the source yields.

    Equal to ``pyspark.sql.pandas.types.to_arrow_schema(<SCHEMA_DDL>, timezone="UTC")``,
    which Spark checks batch by batch.
    """
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            ("queue", pa.string()),
            ("reader", pa.string()),
            ("segment", pa.string()),
            ("offset", pa.int64()),
            ("op", pa.string()),
            ("id", pa.int64()),
            ("add_time", ts),
            ("expire_time", ts),
            ("error_count", pa.int32()),
            ("size", pa.int32()),
            ("data", pa.binary()),
        ]
    )
