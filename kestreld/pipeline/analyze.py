"""``kestreld analyze SOURCE --out DIR``: queue statistics from journals, with Spark.

Reads a queue folder (live or archive), journal files, or Kestrel 2.x
journals through the ``kestrel_journal`` data source and writes, in ``DIR``:

- ``per_minute``, ``consumer_lag``, ``error_counts``, ``id_gaps``: each as
  ``<name>.parquet`` (one file) and ``<name>.csv`` (header row);
- ``summary.json``; ``throughput.png``, ``sizes.png``, ``lag.png``.

The output files and columns are described in docs/pipeline.md; the column
definitions are in :mod:`kestreld.pipeline.tables`.  ``--since``/``--until``
keep items added in ``[since, until)`` for every table except
``consumer_lag``, which always describes the readers' current state over
every item; its ages are measured at ``--until`` when given, else at
``generated_at``.  Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

TABLES = ("per_minute", "consumer_lag", "error_counts", "id_gaps")

#: Table queries run at once (see _report).
QUERY_THREADS = 4

#: Below this many journal bytes a local run's JVM compiles with C1 only
#: (-XX:TieredStopAtLevel=1): on a small folder most of the JVM's CPU time is the
#: C2 compiler optimising Spark's own code for a run that ends in seconds; C1
#: alone halved the table phase (30 s -> 18 s wall, 18 s -> 10 s JVM CPU).
SMALL_INPUT_BYTES = 256 << 20

#: Shuffle partitions for a local master: the tables are small; more only adds tasks.
LOCAL_SHUFFLE_PARTITIONS = 8


def parse_time(text: str) -> int:
    """A time bound in ms since the epoch, from ISO-8601 (UTC unless it says
    otherwise; ``Z`` allowed; a date alone is midnight) or epoch seconds / ms
    (numbers above 10^11 are ms)."""
    value = text.strip()
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        return int(number if number > 1e11 else number * 1000)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (use ISO-8601 like 2026-11-21T14:05:00Z, or epoch ms)"
        ) from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def iso_ms(ms: int | None) -> str | None:
    """``2026-11-21T14:05:00.123Z`` (UTC, milliseconds), or None."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kestreld analyze",
        description="Queue statistics from kestreld journals (or Kestrel 2.x journals) with Spark.",
    )
    p.add_argument(
        "source", nargs="+", metavar="SOURCE", help="queue folder, archive folder or journal files"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument(
        "--master", default=None, help="Spark master URL (default local[*]; e.g. spark://host:7077)"
    )
    p.add_argument("--since", type=parse_time, metavar="T", help="only items added at or after T")
    p.add_argument("--until", type=parse_time, metavar="T", help="only items added before T")
    p.add_argument(
        "--archive", metavar="DIR", help="the server's archive_path: archived segments are read too"
    )
    p.add_argument(
        "--executor-python",
        metavar="PATH",
        help="cluster masters: the Python executors run (PYSPARK_PYTHON; default: "
        "$PYSPARK_PYTHON, else this interpreter's path); 3.11+ with pyarrow on every node",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's own log on stderr (default: kept in a temporary file, shown on failure)",
    )
    p.add_argument(
        "--kestrel-2.0",
        dest="kestrel_2_0",
        action="store_true",
        help="read 2.x opcode 8 as Kestrel 2.0's STATE_DUMP",
    )
    return p


class Progress:
    """Progress lines on stderr, with the elapsed time."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        print(
            f"analyze [{time.monotonic() - self.started:6.1f}s] {message}",
            file=sys.stderr,
            flush=True,
        )


def write_table(table: pa.Table, out: str, name: str) -> None:
    """``<name>.parquet`` (one file) and ``<name>.csv`` (header row, nulls empty)."""
    import pandas as pd
    import pyarrow.parquet as pq

    pq.write_table(table, os.path.join(out, f"{name}.parquet"))
    # ArrowDtype keeps integer columns with nulls as integers (not 1.0).
    table.to_pandas(types_mapper=pd.ArrowDtype).to_csv(
        os.path.join(out, f"{name}.csv"), index=False
    )


def _arrow(df: DataFrame) -> pa.Table:
    table = df.toArrow()
    # Spark may hand strings back as large_string; the files use plain string.
    import pyarrow as pa

    fields = [
        pa.field(f.name, pa.string() if pa.types.is_large_string(f.type) else f.type, f.nullable)
        for f in table.schema
    ]
    return table.cast(pa.schema(fields))


def _problems(rows: DataFrame, names: dict[str, str], sources: list[str]) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    from kestreld.pipeline.schema import OP_PROBLEM

    found = (
        rows.filter(F.col("op") == OP_PROBLEM)
        .select("queue", "segment", "offset", "data")
        .collect()
    )
    problems = []
    for row in found:
        path = names.get(row["segment"]) or os.path.join(sources[0], row["segment"])
        problems.append(
            {
                "path": path,
                "offset": row["offset"],
                "queue": row["queue"] or None,
                "problem": bytes(row["data"] or b"").decode("utf-8", "replace"),
            }
        )
    problems.sort(key=lambda p: (p["path"], p["offset"]))
    return problems


def _usage_error(message: str) -> int:
    print(f"kestreld analyze: {message}", file=sys.stderr)
    return 2


def _check_out(out: str) -> str | None:
    """Why ``--out`` cannot be the output folder, or None (it is created when missing)."""
    if os.path.exists(out) and not os.path.isdir(out):
        return f"--out {out} is a file, not a folder: give a folder for the report"
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        return f"cannot create --out {out}: {e.strerror or e}"
    if not os.access(out, os.W_OK):
        return f"cannot write into --out {out}: permission denied"
    return None


def _spark_reason(error: BaseException) -> str:
    """The first meaningful line of a Spark failure (no JVM stack)."""
    for line in str(error).splitlines():
        line = line.strip()
        if line and not line.startswith(("at ", "JVM stacktrace")):
            return line[:400]
    return type(error).__name__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = Progress()
    sources = [os.path.abspath(s) for s in args.source]
    missing = [s for s in sources if not os.path.exists(s)]
    if missing:
        return _usage_error(f"no such file or folder: {', '.join(missing)}")
    problem = _check_out(args.out)
    if problem:
        return _usage_error(problem)
    try:
        import pyspark  # noqa: F401
    except ImportError:
        from kestreld.extras import install_command

        return _usage_error(f"needs Spark: {install_command('spark')} (and Java 17+)")
    from pyspark.sql import SparkSession

    from kestreld.pipeline.listing import list_journal_files
    from kestreld.pipeline.session import is_local

    listing = list_journal_files(sources, args.archive)
    progress(f"{len(listing.files)} journal files under {', '.join(sources)}")

    spark = SparkSession.getActiveSession()
    owned = spark is None
    jvm_log = None
    with contextlib.ExitStack() as cleanup:
        if spark is None:
            master = args.master or "local[*]"
            spark, jvm_log = _start_spark(args, master, listing, progress, cleanup)
            if spark is None:
                return 2
        else:
            # spark-submit (scripts/analyze_job.py) or a caller's session: use it as it is.
            progress(f"using the running Spark session ({spark.sparkContext.master})")
            _prepare_session(spark)
            if not is_local(spark.sparkContext.master) and not _executors_ready(spark, progress):
                return 2
        try:
            _report(spark, args, sources, listing, progress)
        except Exception as e:
            if type(e).__module__.startswith(("py4j", "pyspark")):
                where = f"; Spark's log: {jvm_log}" if jvm_log else ""
                print(f"kestreld analyze: Spark failed: {_spark_reason(e)}{where}", file=sys.stderr)
                if jvm_log:
                    cleanup.pop_all()  # keep the log for the operator
                return 1
            raise
        finally:
            if owned:
                spark.stop()
    progress(f"done: {args.out}")
    return 0


def _prepare_session(spark: SparkSession) -> None:
    from kestreld.pipeline.session import register

    spark.conf.set("spark.sql.session.timeZone", "UTC")  # minutes are UTC
    register(spark)


def _start_spark(
    args: argparse.Namespace,
    master: str,
    listing: Any,
    progress: Progress,
    cleanup: contextlib.ExitStack,
) -> tuple[SparkSession | None, str | None]:
    """Start a session for ``master``; on a cluster ship kestreld and check the executors."""
    from kestreld.pipeline.session import is_local, spark_session

    work = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="kestreld-analyze-"))
    jvm_log = None if args.verbose else os.path.join(work, "spark.log")
    conf = {"spark.sql.shuffle.partitions": str(LOCAL_SHUFFLE_PARTITIONS)}
    if sum(jf.size for jf in listing.files) < SMALL_INPUT_BYTES:
        conf["spark.driver.extraJavaOptions"] = "-XX:TieredStopAtLevel=1"
    py_files: list[str] = []
    if not is_local(master):
        from kestreld.pipeline.package import build_zip

        python = args.executor_python or os.environ.get("PYSPARK_PYTHON") or sys.executable
        os.environ["PYSPARK_PYTHON"] = python
        zip_path, modules = build_zip(os.path.join(work, "kestreld-pipeline.zip"))
        py_files.append(str(zip_path))
        conf = {}
        progress(f"shipping kestreld ({modules} modules); executors run {python}")
    progress(f"starting Spark ({master})")
    started = time.monotonic()
    spark = spark_session(master, "kestreld analyze", conf, py_files=py_files, jvm_log=jvm_log)
    if jvm_log is not None:
        spark.sparkContext.setLogLevel("WARN")  # into the log file, not the terminal
    progress(f"Spark started in {time.monotonic() - started:.1f}s")
    if not is_local(master) and not _executors_ready(spark, progress):
        spark.stop()
        return None, jvm_log
    return spark, jvm_log


def _executors_ready(spark: SparkSession, progress: Progress) -> bool:
    """Check the executors' Python (cluster masters only); say what is wrong."""
    from kestreld.pipeline.executors import check_executors

    python = os.environ.get("PYSPARK_PYTHON") or "python3"
    check = check_executors(spark, python)
    if not check.ok:
        for problem in check.problems:
            print(f"kestreld analyze: {problem}", file=sys.stderr)
        print(
            "kestreld analyze: executors need Python 3.11+ (the driver's minor version) "
            "with pyarrow at the same path on every node; name it with --executor-python "
            "or PYSPARK_PYTHON (docs/pipeline.md, 'Running on a cluster')",
            file=sys.stderr,
        )
        return False
    hosts = sorted({r["host"] for r in check.found})
    pyarrows = sorted({r["pyarrow"] for r in check.found})
    progress(
        f"executors ready: Python {check.found[0]['version']} with pyarrow "
        f"{', '.join(pyarrows)} on {', '.join(hosts)}"
    )
    return True


def _report(
    spark: SparkSession,
    args: argparse.Namespace,
    sources: list[str],
    listing: Any,
    progress: Progress,
) -> None:
    """Read the journals and write every output file."""
    from kestreld.pipeline import charts, tables

    names = {jf.name: jf.paths[0] for jf in listing.files}
    names.update({os.path.basename(path): path for path, _, _ in listing.problems})
    generated_ms = int(time.time() * 1000)
    as_of_ms = args.until if args.until is not None else generated_ms
    reader = spark.read.format("kestrel_journal").option("includeData", "false")
    if args.archive:
        reader = reader.option("archivePath", os.path.abspath(args.archive))
    if args.kestrel_2_0:
        reader = reader.option("kestrel20", "true")
    started = time.monotonic()
    rows = reader.load(sources if len(sources) > 1 else sources[0]).persist()
    # One job reads every file into the cache and names the queues; every table
    # below is a query over the cached rows (items are a filter of them, not a second cache).
    per_queue = rows.groupBy("queue").count().collect()
    all_queues = {r["queue"] for r in per_queue if r["queue"]}
    progress(
        f"read {sum(r['count'] for r in per_queue)} records of {len(all_queues)} queues "
        f"from {len(listing.files)} files in {time.monotonic() - started:.1f}s"
    )
    all_items = tables.items(rows)
    window = tables.in_window(all_items, args.since, args.until)

    started = time.monotonic()
    queries = {
        "per_minute": tables.per_minute(window),
        "consumer_lag": tables.consumer_lag(rows, all_items, as_of_ms),
        "error_counts": tables.error_counts(window),
        "id_gaps": tables.id_gaps(window),
        "totals": tables.queue_totals(window),
        "sizes": tables.size_histogram(window),
    }
    # Small tables: Spark's time goes to planning, code generation and scheduling, not
    # to data.  Submitted together, one query's planning overlaps another's tasks.
    with ThreadPoolExecutor(max_workers=QUERY_THREADS) as pool:
        futures = {name: pool.submit(_arrow, df) for name, df in queries.items()}
        problem_rows = _problems(rows, names, sources)
        results = {name: future.result() for name, future in futures.items()}
    items_total = sum(results["totals"].column("items").to_pylist())
    progress(
        f"computed {len(queries)} tables of {items_total} items in {time.monotonic() - started:.1f}s"
    )
    for name in TABLES:
        write_table(results[name], args.out, name)
        progress(f"wrote {name} ({results[name].num_rows} rows)")

    totals = {r["queue"]: r for r in results["totals"].to_pylist()}
    lag_rows = results["consumer_lag"].to_pylist()
    queues: dict[str, Any] = {}
    for queue in sorted(all_queues | set(totals)):
        t = totals.get(queue, {})
        queues[queue] = {
            "items": t.get("items", 0),
            "bytes": t.get("bytes", 0),
            "first_add": iso_ms(t.get("first_add_ms")),
            "last_add": iso_ms(t.get("last_add_ms")),
            "readers": {
                r["reader"]: {
                    "head": r["head"],
                    "unread_items": r["unread_items"],
                    "unread_bytes": r["unread_bytes"],
                    "oldest_unread_age_ms": r["oldest_unread_age_ms"],
                }
                for r in lag_rows
                if r["queue"] == queue
            },
        }
    problems = problem_rows
    gaps = results["id_gaps"]
    summary = {
        "source": sources[0] if len(sources) == 1 else sources,
        "generated_at": iso_ms(generated_ms),
        "since": iso_ms(args.since),
        "until": iso_ms(args.until),
        "lag_as_of": iso_ms(as_of_ms),
        "queues": queues,
        "id_gaps": gaps.num_rows,
        "missing_ids": sum(gaps.column("missing").to_pylist()) if gaps.num_rows else 0,
        "problems": problems,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    progress(f"wrote summary.json ({len(queues)} queues, {len(problems)} problems)")

    started = time.monotonic()
    charts.throughput(results["per_minute"], os.path.join(args.out, "throughput.png"))
    charts.sizes(results["sizes"], os.path.join(args.out, "sizes.png"))
    charts.lag(results["consumer_lag"], os.path.join(args.out, "lag.png"))
    progress(f"wrote throughput.png, sizes.png, lag.png in {time.monotonic() - started:.1f}s")
    rows.unpersist()


if __name__ == "__main__":
    raise SystemExit(main())
