"""spark-submit entry point for ``kestreld analyze`` on a cluster.

    scripts/package-pipeline                      # builds dist/kestreld-pipeline.zip
    export SPARK_HOME=... PYSPARK_PYTHON=...      # docs/pipeline.md, "Running on a cluster"
    $SPARK_HOME/bin/spark-submit --master spark://HOST:7077 \\
        --py-files dist/kestreld-pipeline.zip \\
        scripts/analyze_job.py /shared/kestrel/queues --out /shared/reports/today

Arguments are those of ``kestreld analyze`` (``--master`` is spark-submit's
here).  The session spark-submit configured is used as it is; the job sets
its time zone to UTC, registers the ``kestrel_journal`` data source and checks
the executors' Python.  Queue folders and ``--out`` must be paths every
executor and the driver can read (a shared file system): the data source
opens journal files by path.

Spark logs at INFO under spark-submit (thousands of lines of query plans);
the job turns that down to errors as soon as it can, so only its progress is
printed.  ``--verbose`` keeps Spark's logging.
"""

from __future__ import annotations

import sys


def quiet_spark_logging() -> None:
    """Errors only, from now on: set on the JVM spark-submit started, before the context logs."""
    from pyspark import SparkContext

    SparkContext._ensure_initialized()
    jvm = SparkContext._jvm
    jvm.org.apache.logging.log4j.core.config.Configurator.setRootLevel(
        jvm.org.apache.logging.log4j.Level.ERROR
    )


def run(argv: list[str]) -> int:
    """Create the submitted session, then run ``kestreld analyze`` inside it."""
    if "--verbose" not in argv:
        quiet_spark_logging()
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName("kestreld analyze")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    if "--verbose" not in argv:
        spark.sparkContext.setLogLevel("ERROR")
    try:
        from kestreld.pipeline.analyze import main

        return main(argv)
    finally:
        spark.stop()


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
