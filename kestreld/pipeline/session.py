"""A SparkSession set up for the pipeline, with the data source registered."""

from __future__ import annotations

import os
import sys
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


def spark_session(
    master: str | None = None,
    app_name: str = "kestreld",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Get or create a session: UTC time zone, no UI port, data source registered.

    Local masters run Python workers with this interpreter (``PYSPARK_PYTHON``)
    and bind to 127.0.0.1; for a cluster both are left to the environment.
    """
    master = master or DEFAULT_MASTER
    if is_local(master):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
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
    spark = builder.getOrCreate()
    register(spark)
    return spark
