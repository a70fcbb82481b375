"""Fixtures and journal writers for the Spark pipeline tests (tests/pipeline/).

Test modules import what they use; the ``spark`` fixture is imported as
``spark_fixture`` (``from pipeline_fixtures import spark_fixture``).
``spark`` is one local[2] SparkSession for the whole test session; tests that
need it are skipped, with the reason, when Java or PySpark is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kestreld.journal import codec

# 2026-11-21T14:05:00Z: the minute every scripted workload starts at.
BASE_MS = int(datetime(2026, 11, 21, 14, 5, tzinfo=UTC).timestamp() * 1000)


def spark_missing() -> str | None:
    """Why Spark tests cannot run here, or None."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install -e '.[spark,test]')"
    java_home = os.environ.get("JAVA_HOME")
    if not shutil.which("java") and not (
        java_home and os.path.exists(os.path.join(java_home, "bin", "java"))
    ):
        return "Java is not installed (Spark needs Java 17+)"
    return None


@pytest.fixture(scope="session", name="spark")
def spark_fixture():
    """The test session's SparkSession: local[2], 2 shuffle partitions, UTC, no UI."""
    reason = spark_missing()
    if reason:
        pytest.skip(reason)
    from kestreld.pipeline.session import spark_session

    session = spark_session(
        "local[2]",
        "kestreld-tests",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            "spark.sql.streaming.pollingDelay": "50ms",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def ts(ms: int) -> datetime:
    """A journal time (ms) as PySpark's collect() returns it: a naive local datetime."""
    return datetime.fromtimestamp(ms / 1000)


@dataclass
class Item:
    """An item to write with the codec (times in ms; expire 0 = never)."""

    id: int
    add_time: int
    data: bytes
    expire_time: int = 0
    error_count: int = 0

    def record(self) -> bytes:
        return codec.encode_put(
            self.id, self.add_time, self.data, self.expire_time, self.error_count
        )


def write_segment(
    folder: Path, queue: str, stamp: int, items: list[Item], tail: bytes = b""
) -> Path:
    """A writer segment ``<queue>.<stamp>``: magic, the items' PUTs, then ``tail`` bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{queue}.{stamp}"
    path.write_bytes(codec.WRITER_MAGIC + b"".join(i.record() for i in items) + tail)
    return path


def write_checkpoint(
    folder: Path, queue: str, reader: str, head: int, done: list[int] = ()
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{queue}.read.{reader}"
    path.write_bytes(codec.encode_checkpoint(head, list(done)))
    return path


def record_offsets(items: list[Item]) -> list[int]:
    """File offsets of the items' records in a segment written by :func:`write_segment`."""
    offsets, pos = [], codec.MAGIC_SIZE
    for item in items:
        offsets.append(pos)
        pos += len(item.record())
    return offsets


def rows_of(df, *columns: str) -> list[tuple]:
    """Sorted tuples of some columns of a DataFrame."""
    return sorted(tuple(r[c] for c in columns) for r in df.select(*columns).collect())


def stream_ids(spark, path: Path) -> list[int]:
    """Ids of PUT rows written by a streaming query's Parquet sink (with duplicates)."""
    if not path.exists():
        return []
    return [
        r["id"] for r in spark.read.parquet(str(path)).filter("op = 'PUT'").select("id").collect()
    ]


def drain(query, timeout: float = 60.0) -> None:
    """Wait until a streaming query has processed everything available, then stop it."""
    query.processAllAvailable()
    query.stop()


def pymemcache_items(n: int, prefix: str) -> Iterator[bytes]:
    """Distinct payloads of growing sizes, for server workloads."""
    for i in range(n):
        yield f"{prefix}-{i:05d}-".encode() + b"x" * (i % 37)
