"""spark-submit entry point for ``kestreld analyze`` on a cluster.

    scripts/package-pipeline                      # builds dist/kestreld-pipeline.zip
    spark-submit --master spark://HOST:7077 \\
        --py-files dist/kestreld-pipeline.zip \\
        scripts/analyze_job.py /shared/kestrel/queues --out /shared/reports/today

Arguments are those of ``kestreld analyze`` (``--master`` is spark-submit's
here).  The session spark-submit configured is used as it is; the job sets
its time zone to UTC and registers the ``kestrel_journal`` data source.
Queue folders and ``--out`` must be paths every executor and the driver can
read (a shared file system): the data source opens journal files by path.
"""

from __future__ import annotations

import sys


def run(argv: list[str]) -> int:
    """Create the submitted session, then run ``kestreld analyze`` inside it."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName("kestreld analyze")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    try:
        from kestreld.pipeline.analyze import main

        return main(argv)
    finally:
        spark.stop()


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
