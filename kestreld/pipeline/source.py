"""The ``kestrel_journal`` Spark data source (PySpark 4 Python Data Source API).

    from kestreld.pipeline.source import KestrelJournalDataSource
    spark.dataSource.register(KestrelJournalDataSource)
    df = spark.read.format("kestrel_journal").load("/var/spool/kestrel")
    stream = spark.readStream.format("kestrel_journal").load("/var/spool/kestrel")

Options (all optional):

- ``includeData`` (default ``true``): ``false`` leaves ``data`` null and skips
  reading payloads (PROBLEM rows keep their text).
- ``archivePath``: the server's ``archive_path``; its segments are read too
  (batch), and followed when they move there (streaming).
- ``kestrel20`` (default ``false``): read 2.x opcode 8 as Kestrel 2.0's
  STATE_DUMP instead of 2.1's CONTINUE.
- ``partitionBytes`` (default 32 MiB): with more than 32 files, small files
  are packed into partitions of about this size (otherwise one partition per
  file).
- streaming only: ``startingOffsets`` ``earliest`` (default) or ``latest``.

Batch reads cover writer segments, reader checkpoints and Kestrel 2.x
journals; columns are described in :mod:`kestreld.pipeline.schema`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from kestreld.pipeline.columnar import problem_batch, read_file
from kestreld.pipeline.listing import JournalFile, group_files, list_journal_files
from kestreld.pipeline.options import option, option_bool, option_paths
from kestreld.pipeline.schema import SCHEMA_DDL

if TYPE_CHECKING:
    import pyarrow as pa

SOURCE_NAME = "kestrel_journal"


@dataclass
class FilesPartition(InputPartition):
    """Whole files read by one task, plus problems found while listing."""

    files: list[JournalFile]
    problems: list[tuple[str, str, int, str]] = field(
        default_factory=list
    )  # queue, name, offset, why

    def __post_init__(self) -> None:
        InputPartition.__init__(self, None)


class KestrelJournalDataSource(DataSource):
    """``spark.read.format("kestrel_journal")`` and ``spark.readStream.format(...)``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return KestrelJournalReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from kestreld.pipeline.stream import KestrelJournalStreamReader

        return KestrelJournalStreamReader(self.options)


class KestrelJournalReader(DataSourceReader):
    """Batch reader: lists files on the driver, decodes them in tasks."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.paths = option_paths(options)
        self.archive_path = option(options, "archivePath") or None
        self.include_data = option_bool(options, "includeData", True)
        self.kestrel_2_0 = option_bool(options, "kestrel20", False)
        self.partition_bytes = int(option(options, "partitionBytes") or 32 << 20)

    def partitions(self) -> list[InputPartition]:
        listing = list_journal_files(self.paths, self.archive_path)
        parts: list[InputPartition] = [
            FilesPartition(group) for group in group_files(listing.files, self.partition_bytes)
        ]
        if listing.problems:
            problems = [
                (_queue_of(path), _name_of(path), offset, why)
                for path, offset, why in listing.problems
            ]
            if parts:
                parts[0].problems.extend(problems)  # type: ignore[attr-defined]
            else:
                parts.append(FilesPartition([], problems))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilesPartition):
            return
        for queue, name, offset, why in partition.problems:
            yield problem_batch(queue, None, name, offset, why)
        for jf in partition.files:
            yield from read_file(jf, include_data=self.include_data, kestrel_2_0=self.kestrel_2_0)


def _name_of(path: str) -> str:
    import os

    return os.path.basename(path.rstrip("/")) or path


def _queue_of(path: str) -> str:
    """The queue a listed file belongs to, or "" when its name says none."""
    from kestreld.journal.files import is_legal_name

    queue, dot, _ = _name_of(path).partition(".")
    return queue if dot and is_legal_name(queue) else ""
