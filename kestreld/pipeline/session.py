"""A SparkSession set up for the pipeline, with the data source registered."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def is_local(master: str) -> bool:
    return master.startswith("local")


def register(spark: SparkSession) -> None:
    """Make ``format("kestrel_journal")`` available in ``spark`` (classic or Connect)."""
    from kestreld.pipeline.source import KestrelJournalDataSource

    spark.dataSource.register(KestrelJournalDataSource)


@contextlib.contextmanager
def _stderr_to(path: str | None) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the JVM starts, so the JVM keeps it.

    The JVM prints to its inherited stderr before any log level applies (the
    incubator-module warning, log4j's profile line, NativeCodeLoader); this is
    the only place to catch those.  Python's own stderr is back when this exits.
    """
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


def spark_session(
    master: str | None = None,
    app_name: str = "kestreld",
    conf: dict[str, str] | None = None,
    *,
    py_files: Sequence[str] = (),
    jvm_log: str | None = None,
) -> SparkSession:
    """Get or create a session: UTC time zone, no UI port, data source registered.

    Local masters run Python workers with this interpreter (``PYSPARK_PYTHON``)
    and bind to 127.0.0.1.  For a cluster, ``PYSPARK_PYTHON`` is left as the
    caller set it (default: this interpreter's path) and ``py_files`` (the
    kestreld zip) are shipped to the executors *before* the source is
    registered (a registered source remembers the files shipped so far), and
    put on ``PYTHONPATH`` for the Python worker Spark starts on the driver to
    plan a Python data source.  ``jvm_log``: a file for the JVM's own stderr
    (start-up noise and logging) instead of this terminal.
    """
    master = master or DEFAULT_MASTER
    if is_local(master):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if py_files:
            # The driver-side worker inherits the JVM's environment; Spark adds it to the
            # worker's path.  Executors get the files through addPyFile below.
            paths = [os.path.abspath(p) for p in py_files]
            if os.environ.get("PYTHONPATH"):
                paths.append(os.environ["PYTHONPATH"])
            os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    with _stderr_to(jvm_log):
        spark = builder.getOrCreate()
    if not is_local(master):
        for path in py_files:
            spark.sparkContext.addPyFile(os.path.abspath(path))
    register(spark)
    return spark
