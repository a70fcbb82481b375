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
the job sets ``spark.log.level=ERROR`` on the context it creates, so only its
progress is printed.  ``--verbose`` keeps Spark's logging.
"""

from __future__ import annotations

import sys


def run(argv: list[str]) -> int:
    """Create the submitted session, then run ``kestreld analyze`` inside it."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName("kestreld analyze")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if "--verbose" not in argv:
        # Applied first thing in the SparkContext, before its INFO lines.  The two or
        # three lines spark-submit's JVM prints before this script runs stay.
        builder = builder.config("spark.log.level", "ERROR")
    spark = builder.getOrCreate()
    try:
        from kestreld.pipeline.analyze import main

        return main(argv)
    finally:
        spark.stop()


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
