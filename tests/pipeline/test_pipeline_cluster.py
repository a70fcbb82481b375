"""The pipeline on a real Spark standalone cluster, as docs/pipeline.md tells a user to run it.

A master and one worker from PySpark's own ``bin/spark-class`` on 127.0.0.1;
the executors run a Python with pyarrow and without kestreld or PySpark (a
node of a plain cluster).  On a queue folder written by a real kestreld:

- ``kestreld analyze --master spark://...`` (ships its own code),
- the documented ``scripts/package-pipeline`` + ``spark-submit ... analyze_job.py`` line,

each give byte-for-byte the tables of a ``local[2]`` run; a notebook-style
stream reads every item; an executor Python without pyarrow is a clear error.
Every driver runs in a folder of its own with no ``PYTHONPATH``, so nothing
but the shipped zip can give the cluster's Python workers ``kestreld``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import repo
from kestreld_process import KestreldProcess
from pipeline_fixtures import pymemcache_items, spark_missing
from spark_cluster import StandaloneCluster, clean_env, executor_python, spark_home

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = repo.ROOT
UNTIL = "2100-01-01T00:00:00Z"  # a fixed --until: lag ages are the same in every run
TABLES = ("per_minute", "consumer_lag", "error_counts", "id_gaps")
QUEUES = {"jobs": 1200, "mail": 60, "tiny": 3}


def driver(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    """``kestreld ...`` as its console script runs it, importing kestreld from this checkout only."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from kestreld.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def own_lines_only(stderr: str, allowed_foreign: int = 0) -> None:
    """Progress lines of analyze only (plus at most ``allowed_foreign`` others)."""
    foreign = [line for line in stderr.splitlines() if not line.startswith("analyze [")]
    assert len(foreign) <= allowed_foreign, "\n".join(foreign[:40])


def same_report(got: Path, want: Path) -> None:
    for name in TABLES:
        assert (got / f"{name}.csv").read_bytes() == (want / f"{name}.csv").read_bytes(), name
        import pyarrow.parquet as pq

        assert pq.read_table(got / f"{name}.parquet").equals(
            pq.read_table(want / f"{name}.parquet")
        ), name
    a, b = (json.loads((p / "summary.json").read_text()) for p in (got, want))
    del a["generated_at"], b["generated_at"]
    assert a == b
    for chart in ("throughput.png", "sizes.png", "lag.png"):
        assert (got / chart).stat().st_size > 1000


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    reason = spark_missing()
    if reason:
        pytest.skip(reason)
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="module")
def queue_folder(work) -> Path:
    """Three queues of very different sizes, a fanout reader, some items read."""
    srv = KestreldProcess(
        work / "queues",
        'max_journal_size = "16KiB"\ncheckpoint_interval = "100ms"\n[queues."jobs+audit"]\n',
    )
    srv.start()
    try:
        client = srv.client()
        for queue, n in QUEUES.items():
            for data in pymemcache_items(n, queue):
                assert client.set(queue, data, noreply=False)
        assert len([client.get("jobs") for _ in range(400)]) == 400
        assert client.get("tiny") is not None
        client.close()
    finally:
        assert srv.stop() == 0
    return srv.queue_path


@pytest.fixture(scope="module")
def local_report(work, queue_folder) -> Path:
    out = work / "local"
    done = driver(
        "analyze", str(queue_folder), "--out", str(out), "--master", "local[2]",
        "--until", UNTIL, cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    own_lines_only(done.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert {q: v["items"] for q, v in summary["queues"].items()} == QUEUES
    return out


@pytest.fixture(scope="module")
def executors(work) -> str:
    python = executor_python(work)
    probe = subprocess.run(
        [python, "-c", "import pyarrow\ntry:\n import kestreld\nexcept ImportError: print('no')"],
        cwd=work,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0 and probe.stdout.strip() == "no", probe.stderr
    return python


@pytest.fixture(scope="module")
def cluster(work, executors):
    cluster = StandaloneCluster(work, executors)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()  # also when start() or a test failed


def test_analyze_on_the_cluster_ships_kestreld_and_matches_local(
    work, queue_folder, local_report, cluster
) -> None:
    out = work / "analyze-cluster"
    done = driver(
        "analyze", str(queue_folder), "--out", str(out), "--master", cluster.url,
        "--executor-python", cluster.executor_python, "--until", UNTIL, cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + cluster.log("worker")[-3000:]
    own_lines_only(done.stderr)
    assert "executors ready: Python 3." in done.stderr
    same_report(out, local_report)


def test_documented_spark_submit_line_matches_local(
    work, queue_folder, local_report, cluster
) -> None:
    """docs/pipeline.md: package-pipeline, SPARK_HOME, PYSPARK_PYTHON, spark-submit."""
    zip_path = work / "dist" / "kestreld-pipeline.zip"
    packaged = subprocess.run(
        [str(ROOT / "scripts" / "package-pipeline"), str(zip_path)],
        env=clean_env(PYTHON=sys.executable),
        capture_output=True,
        text=True,
    )
    assert packaged.returncode == 0, packaged.stderr
    out = work / "spark-submit"
    env = clean_env(PYSPARK_PYTHON=cluster.executor_python, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(
        [
            os.path.join(spark_home(), "bin", "spark-submit"),
            "--master", cluster.url,
            "--py-files", str(zip_path),
            str(ROOT / "scripts" / "analyze_job.py"),
            str(queue_folder), "--out", str(out), "--until", UNTIL,
        ],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # spark-submit's JVM prints a few lines before the job's context can set its level:
    # the JDK's incubator warning, log4j's profile, NativeCodeLoader, three SparkContext
    # INFO lines (version, OS, Java), "Setting Spark log level"; nothing after.
    own_lines_only(done.stdout + done.stderr, allowed_foreign=8)
    same_report(out, local_report)


def test_a_notebook_streams_from_the_cluster_with_the_zip(work, queue_folder, cluster) -> None:
    """The notebook recipe of docs/pipeline.md, in plain PySpark."""
    zip_path = work / "notebook" / "kestreld-pipeline.zip"
    sys.path.insert(0, str(ROOT))
    try:
        from kestreld.pipeline.package import build_zip
    finally:
        sys.path.remove(str(ROOT))
    build_zip(zip_path)
    script = work / "notebook" / "notebook.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            ZIP = {str(zip_path)!r}
            os.environ["PYTHONPATH"] = ZIP  # before the first session: Spark's driver-side workers
            sys.path.insert(0, ZIP)         # this Python

            from pyspark.sql import SparkSession

            spark = (
                SparkSession.builder.master({cluster.url!r})
                .config("spark.log.level", "ERROR")
                .getOrCreate()
            )
            spark.sparkContext.addPyFile(ZIP)  # the executors

            from kestreld.pipeline.source import KestrelJournalDataSource

            spark.dataSource.register(KestrelJournalDataSource)
            query = (
                spark.readStream.format("kestrel_journal").load({str(queue_folder)!r})
                .writeStream.format("parquet")
                .option("path", "puts").option("checkpointLocation", "checkpoint")
                .trigger(availableNow=True).start()
            )
            query.awaitTermination()
            puts = spark.read.parquet("puts").filter("op = 'PUT'")
            print(json.dumps({{r["queue"]: r["count"] for r in puts.groupBy("queue").count().collect()}}))
            spark.stop()
            """
        ).replace("import os, sys", "import json, os, sys")
    )
    env = clean_env(PYSPARK_PYTHON=cluster.executor_python)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=script.parent, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == QUEUES


def test_an_executor_python_without_pyarrow_is_a_clear_error(work, queue_folder, cluster) -> None:
    bare = work / "bare-venv"
    subprocess.run(
        [
            getattr(sys, "_base_executable", sys.executable),
            "-m",
            "venv",
            "--without-pip",
            str(bare),
        ],
        check=True,
    )
    done = driver(
        "analyze", str(queue_folder), "--out", str(work / "bare"), "--master", cluster.url,
        "--executor-python", str(bare / "bin" / "python"), cwd=work,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{bare / 'bin' / 'python'} on " in done.stderr
    assert "has no pyarrow" in done.stderr
    assert "--executor-python or PYSPARK_PYTHON" in done.stderr
    assert "Traceback" not in done.stderr
