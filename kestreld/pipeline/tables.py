"""The tables of ``kestreld analyze``, as Spark DataFrames (see docs/pipeline.md).

Input is the ``kestrel_journal`` data source's DataFrame.  Times are UTC;
``*_ms`` values are milliseconds.  Every function here is a pure
transformation, so tests can check them on any journal.

- ``per_minute``: items added per queue and minute.  Percentiles are exact
  with linear interpolation between ranks (``percentile`` in Spark SQL,
  numpy's default): ``size_p50``, ``size_p99`` and ``ttl_p50_ms`` (of
  ``expire_time - add_time``, over items with an expiry; null when none).
  ``peak_items_per_s`` is the busiest second of the minute.  Sizes are
  rounded to 0.01 byte, TTLs to whole milliseconds.
- ``consumer_lag``: per reader checkpoint, the items the writer holds that the
  reader has not consumed: id above the head and not in the done set.  A
  queue with segments and no checkpoint at all has an implied default reader
  with head 0 (what the server does).  A checkpoint without a readable head
  counts as head 0 and no done ids.  ``oldest_unread_age_ms`` is measured
  against an ``as_of`` time given by the caller.
- ``error_counts``: items per queue and ``error_count``.
- ``id_gaps``: ids absent between two present ids of a queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kestreld.pipeline.schema import KESTREL2_ITEM_OPS, OP_PUT, OP_READ_DONE, OP_READ_HEAD

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

MINUTE_FORMAT = "yyyy-MM-dd'T'HH:mm:ss'Z'"


def items(rows: DataFrame) -> DataFrame:
    """One row per item added: ``queue, id, add_ms, expire_ms, error_count, size, native``.

    Native PUTs, plus the item operations of Kestrel 2.x parent journals
    (``id`` null: 2.x items have no ids; ``add_ms`` null for 2.x ADD).
    """
    from pyspark.sql import functions as F

    native = rows.filter(F.col("op") == OP_PUT).select(
        "queue",
        "id",
        F.unix_millis("add_time").alias("add_ms"),
        F.unix_millis("expire_time").alias("expire_ms"),
        "error_count",
        "size",
        F.lit(True).alias("native"),
    )
    old = rows.filter(
        F.col("op").isin(*KESTREL2_ITEM_OPS)
        & (F.col("reader") == "")
        & ~F.col("segment").contains(".read.")
    ).select(
        "queue",
        F.lit(None).cast("bigint").alias("id"),
        F.unix_millis("add_time").alias("add_ms"),
        F.unix_millis("expire_time").alias("expire_ms"),
        F.lit(None).cast("int").alias("error_count"),
        "size",
        F.lit(False).alias("native"),
    )
    return native.unionByName(old)


def in_window(item_rows: DataFrame, since_ms: int | None, until_ms: int | None) -> DataFrame:
    """Items added in ``[since, until)`` (an item without add time is kept only without bounds)."""
    from pyspark.sql import functions as F

    if since_ms is not None:
        item_rows = item_rows.filter(F.col("add_ms") >= since_ms)
    if until_ms is not None:
        item_rows = item_rows.filter(F.col("add_ms") < until_ms)
    return item_rows


def per_minute(item_rows: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    timed = item_rows.filter(F.col("add_ms").isNotNull()).withColumn(
        "minute_ms", F.floor(F.col("add_ms") / 60000) * 60000
    )
    peaks = (
        timed.groupBy("queue", "minute_ms", F.floor(F.col("add_ms") / 1000).alias("second"))
        .count()
        .groupBy("queue", "minute_ms")
        .agg(F.max("count").alias("peak_items_per_s"))
    )
    ttl = F.when(F.col("expire_ms").isNotNull(), F.col("expire_ms") - F.col("add_ms"))
    minutes = timed.groupBy("queue", "minute_ms").agg(
        F.count(F.lit(1)).alias("items"),
        F.sum("size").cast("bigint").alias("bytes"),
        F.percentile("size", F.lit(0.5)).alias("size_p50"),
        F.percentile("size", F.lit(0.99)).alias("size_p99"),
        F.percentile(ttl, F.lit(0.5)).alias("ttl_p50_ms"),
    )
    return (
        minutes.join(peaks, ["queue", "minute_ms"])
        .select(
            "queue",
            F.date_format(
                F.timestamp_millis(F.col("minute_ms").cast("bigint")), MINUTE_FORMAT
            ).alias("minute"),
            F.col("items").cast("bigint").alias("items"),
            "bytes",
            # Rounded to what they mean: hundredths of a byte, whole milliseconds
            # (interpolated percentiles otherwise print as 1981.4299999999998).
            F.round(F.col("size_p50").cast("double"), 2).alias("size_p50"),
            F.round(F.col("size_p99").cast("double"), 2).alias("size_p99"),
            F.col("peak_items_per_s").cast("bigint").alias("peak_items_per_s"),
            F.round(F.col("ttl_p50_ms").cast("double"), 0).alias("ttl_p50_ms"),
        )
        .orderBy("queue", "minute")
    )


def readers(rows: DataFrame, item_rows: DataFrame) -> DataFrame:
    """``queue, reader, head, has_head``: every checkpoint, plus implied default readers."""
    from pyspark.sql import functions as F

    checkpoint_rows = rows.filter(F.col("segment").contains(".read.") & F.col("reader").isNotNull())
    heads = (
        checkpoint_rows.filter(F.col("op") == OP_READ_HEAD)
        .groupBy("queue", "reader")
        .agg(F.max_by("id", "offset").alias("head"))
    )
    named = (
        checkpoint_rows.select("queue", "reader")
        .distinct()
        .join(heads, ["queue", "reader"], "left")
        .select(
            "queue",
            "reader",
            F.coalesce("head", F.lit(0)).cast("bigint").alias("head"),
            F.col("head").isNotNull().alias("has_head"),
        )
    )
    implied = (
        item_rows.filter("native")
        .select("queue")
        .distinct()
        .join(named.select("queue").distinct(), "queue", "left_anti")
        .select(
            "queue",
            F.lit("").alias("reader"),
            F.lit(0).cast("bigint").alias("head"),
            F.lit(True).alias("has_head"),
        )
    )
    return named.unionByName(implied)


def consumer_lag(rows: DataFrame, item_rows: DataFrame, as_of_ms: int) -> DataFrame:
    """Unread items per reader (over every item, whatever the time window)."""
    from pyspark.sql import functions as F

    who = readers(rows, item_rows)
    done = (
        rows.filter((F.col("op") == OP_READ_DONE) & F.col("segment").contains(".read."))
        .select("queue", "reader", "id")
        .join(who.filter("has_head").select("queue", "reader", "head"), ["queue", "reader"])
        .filter(F.col("id") > F.col("head"))
        .select("queue", "reader", "id")
        .distinct()
    )
    native = item_rows.filter("native").select("queue", "id", "add_ms", "size")
    unread = (
        native.join(F.broadcast(who.select("queue", "reader", "head")), "queue")
        .filter(F.col("id") > F.col("head"))
        .join(done, ["queue", "reader", "id"], "left_anti")
        .groupBy("queue", "reader")
        .agg(
            F.count(F.lit(1)).alias("unread_items"),
            F.sum("size").alias("unread_bytes"),
            F.min("add_ms").alias("oldest_add_ms"),
        )
    )
    return (
        who.join(unread, ["queue", "reader"], "left")
        .select(
            "queue",
            "reader",
            "head",
            F.coalesce("unread_items", F.lit(0)).cast("bigint").alias("unread_items"),
            F.coalesce("unread_bytes", F.lit(0)).cast("bigint").alias("unread_bytes"),
            (F.lit(as_of_ms) - F.col("oldest_add_ms")).cast("bigint").alias("oldest_unread_age_ms"),
        )
        .orderBy("queue", "reader")
    )


def error_counts(item_rows: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        item_rows.filter(F.col("error_count").isNotNull())
        .groupBy("queue", "error_count")
        .agg(F.count(F.lit(1)).cast("bigint").alias("items"))
        .select("queue", F.col("error_count").cast("int"), "items")
        .orderBy("queue", "error_count")
    )


def id_gaps(item_rows: DataFrame) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ids = item_rows.filter(F.col("native") & F.col("id").isNotNull()).select("queue", "id")
    previous = F.lag("id").over(Window.partitionBy("queue").orderBy("id"))
    return (
        ids.withColumn("after_id", previous)
        .filter(F.col("id") - F.col("after_id") > 1)
        .select(
            "queue",
            F.col("after_id").cast("bigint").alias("after_id"),
            F.col("id").cast("bigint").alias("before_id"),
            (F.col("id") - F.col("after_id") - 1).cast("bigint").alias("missing"),
        )
        .orderBy("queue", "after_id")
    )


def queue_totals(item_rows: DataFrame) -> DataFrame:
    """``queue, items, bytes, first_add_ms, last_add_ms`` for the summary."""
    from pyspark.sql import functions as F

    return item_rows.groupBy("queue").agg(
        F.count(F.lit(1)).cast("bigint").alias("items"),
        F.coalesce(F.sum("size"), F.lit(0)).cast("bigint").alias("bytes"),
        F.min("add_ms").alias("first_add_ms"),
        F.max("add_ms").alias("last_add_ms"),
    )


def size_histogram(item_rows: DataFrame) -> DataFrame:
    """``queue, bucket, items``: bucket 0 holds empty items, bucket b sizes [2^(b-1), 2^b)."""
    from pyspark.sql import functions as F

    bucket = F.when(F.col("size") <= 0, 0).otherwise(
        F.floor(F.log2("size") + 1e-9) + 1
    )  # log2 of 2^k may round below k
    return (
        item_rows.filter(F.col("size").isNotNull())
        .groupBy("queue", bucket.cast("int").alias("bucket"))
        .agg(F.count(F.lit(1)).cast("bigint").alias("items"))
        .orderBy("queue", "bucket")
    )
