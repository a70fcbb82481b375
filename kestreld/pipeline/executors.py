"""Can the executors' Python run the ``kestrel_journal`` source?  Asked before reading.

On a cluster every executor runs the interpreter named by ``PYSPARK_PYTHON``
(``spark.pyspark.python``) on its own node.  It needs Python 3.11+ (the same
minor version as the driver: Spark refuses a mismatch), pyarrow, and
``kestreld`` (shipped as a zip by the driver).  Without this check a missing
piece shows up as a failure of every read task, deep in a JVM stack trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(slots=True)
class ExecutorCheck:
    """What the executors' Python reported, and what is wrong with it (empty: nothing)."""

    python: str
    found: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _spark_error(error: BaseException) -> str:
    """The line of a Spark failure that says why (not the JVM stack)."""
    text = str(error)
    for pattern in (
        r"\[PYTHON_VERSION_MISMATCH\][^\n]*",
        r"Cannot run program[^\n]*",
        r"(?:ModuleNotFoundError|ImportError)[^\n]*",
    ):
        match = re.search(pattern, text)
        if match:
            return match.group(0).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else type(error).__name__


def check_executors(spark: SparkSession, python: str) -> ExecutorCheck:
    """Run one small task per core: import pyarrow and kestreld, report versions."""

    def probe(_: Any) -> Any:  # nested, so Spark pickles it by value
        import platform
        import sys

        report = {
            "host": platform.node(),
            "python": sys.executable,
            "version": ".".join(map(str, sys.version_info[:3])),
        }
        try:
            import pyarrow

            report["pyarrow"] = pyarrow.__version__
        except ImportError as e:
            report["pyarrow_error"] = str(e)
        try:
            import kestreld.pipeline.source  # noqa: F401

            report["kestreld"] = "ok"
        except ImportError as e:
            report["kestreld_error"] = str(e)
        yield report

    check = ExecutorCheck(python)
    sc = spark.sparkContext
    tasks = max(1, sc.defaultParallelism)
    try:
        check.found = sc.parallelize(range(tasks), tasks).mapPartitions(probe).collect()
    except Exception as e:  # Py4JJavaError: the executors could not start that Python
        check.problems.append(f"the executors cannot run {python}: {_spark_error(e)}")
        return check
    seen = set()
    for report in check.found:
        where = f"{report['python']} on {report['host']}"
        if (where, report.get("pyarrow_error"), report.get("kestreld_error")) in seen:
            continue
        seen.add((where, report.get("pyarrow_error"), report.get("kestreld_error")))
        if tuple(int(n) for n in report["version"].split(".")[:2]) < (3, 11):
            check.problems.append(f"{where} is Python {report['version']}; 3.11+ is needed")
        if "pyarrow_error" in report:
            check.problems.append(f"{where} has no pyarrow ({report['pyarrow_error']})")
        if "kestreld_error" in report:
            check.problems.append(
                f"{where} cannot import the shipped kestreld ({report['kestreld_error']})"
            )
    return check
