"""Benchmark the kestrel_journal data source against the plain-Python codec.

Generates writer segments (about --size bytes in --segment-size files, item
sizes spread over --min-item..--max-item), then, in the same run and over the
same files (warm in the page cache):

1. the plain-Python codec: ``codec.scan`` over every segment in one process;
   (for reference, the data source's own decoding into Arrow batches, also in
   one process, without Spark);
2. the Spark data source under --master (default local[2]): every column of
   every row, written to Spark's ``noop`` sink.

Each is measured with payloads (``include_data`` / ``includeData=true``) and
without; records/s of both and their ratio are printed.  Spark start-up and
Python-worker start-up are excluded (a warm-up read runs first).

    scripts/bench-pipeline --size 1GiB
    scripts/bench-pipeline --size 256MiB --keep --dir /tmp/bench
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from kestreld.config.model import parse_size
from kestreld.journal import codec


def generate(folder: str, total: int, segment_size: int, min_item: int, max_item: int) -> int:
    """Segments of queue ``bench`` holding about ``total`` bytes; returns the record count."""
    os.makedirs(folder, exist_ok=True)
    span = max_item - min_item + 1
    # A pool of payloads (sizes spread evenly) keeps generation cheap.
    pool = [bytes([65 + i % 26]) * (min_item + (i * 7919) % span) for i in range(4096)]
    next_id, written, stamp = 1, 0, 1_700_000_000_000
    add_time = 1_700_000_000_000
    while written < total:
        parts = [codec.WRITER_MAGIC]
        size = codec.MAGIC_SIZE
        while size < segment_size and written + size < total:
            data = pool[next_id % 4096]
            expire = add_time + 60_000 if next_id % 3 == 0 else 0
            rec = codec.encode_put(next_id, add_time, data, expire, next_id % 4)
            parts.append(rec)
            size += len(rec)
            next_id += 1
            add_time += 1
        with open(os.path.join(folder, f"bench.{stamp}"), "wb") as f:
            f.write(b"".join(parts))
        written += size
        stamp += 1
    return next_id - 1


def codec_rate(folder: str, include_data: bool) -> tuple[int, float]:
    """(records, seconds) for codec.scan over every segment, one process."""
    names = sorted(n for n in os.listdir(folder) if n.startswith("bench."))
    records = 0
    started = time.perf_counter()
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            buf = f.read()
        pos = codec.MAGIC_SIZE
        while True:
            res = codec.scan(buf, pos, include_data=include_data, limit=65536)
            records += sum(1 for r in res.records if type(r) is codec.Put)
            pos = res.pos
            if res.status != codec.Status.MORE or len(res.records) < 65536:
                break
    return records, time.perf_counter() - started


def columnar_rate(folder: str, include_data: bool) -> tuple[int, float]:
    """(records, seconds) for the data source's own decoding (Arrow batches), one process."""
    from kestreld.pipeline.columnar import read_file
    from kestreld.pipeline.listing import list_journal_files

    started = time.perf_counter()
    records = 0
    for jf in list_journal_files([folder]).files:
        for batch in read_file(jf, include_data=include_data):
            records += batch.num_rows
    return records, time.perf_counter() - started


def source_rate(spark, folder: str, include_data: bool) -> tuple[int, float]:
    """(records, seconds) for the data source reading every column into the noop sink."""
    reader = spark.read.format("kestrel_journal").option("includeData", str(include_data).lower())
    started = time.perf_counter()
    reader.load(folder).write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - started
    records = reader.load(folder).filter("op = 'PUT'").count()
    return records, elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="scripts/bench-pipeline",
        description="records/s of the kestrel_journal data source vs the plain-Python codec",
    )
    p.add_argument("--size", default="1GiB", help="bytes of segments to generate (default 1GiB)")
    p.add_argument("--segment-size", default="16MiB", help="segment size (default 16MiB)")
    p.add_argument("--min-item", type=int, default=16, help="smallest payload (default 16)")
    p.add_argument("--max-item", type=int, default=512, help="largest payload (default 512)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--dir", help="folder for the segments (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the generated segments")
    args = p.parse_args(argv)

    folder = args.dir or tempfile.mkdtemp(prefix="kestreld-bench-")
    total = parse_size("--size", args.size)
    try:
        started = time.perf_counter()
        n = generate(
            folder,
            total,
            parse_size("--segment-size", args.segment_size),
            args.min_item,
            args.max_item,
        )
        files = len(os.listdir(folder))
        on_disk = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(
            f"generated {n:,} records, {on_disk / 2**20:,.0f} MiB in {files} segments "
            f"({time.perf_counter() - started:.1f}s) in {folder}"
        )

        from kestreld.pipeline.session import spark_session

        spark = spark_session(args.master, "bench-pipeline", {"spark.sql.shuffle.partitions": "2"})
        spark.sparkContext.setLogLevel("ERROR")
        warm = tempfile.mkdtemp(prefix="kestreld-bench-warm-")
        generate(warm, 1 << 16, 1 << 14, args.min_item, args.max_item)
        source_rate(spark, warm, True)  # starts the Python workers
        shutil.rmtree(warm)

        print(f"{'':36}{'records':>14}{'seconds':>10}{'records/s':>14}")
        results = {}
        for include_data in (True, False):
            label = "with data" if include_data else "without data"
            c_n, c_s = codec_rate(folder, include_data)
            a_n, a_s = columnar_rate(folder, include_data)
            s_n, s_s = source_rate(spark, folder, include_data)
            if c_n != n or s_n != n or a_n != n:
                print(f"record count mismatch: generated {n}, codec {c_n}, source {s_n}")
                return 1
            results[label] = (c_n / c_s, s_n / s_s)
            print(f"{'codec.scan, ' + label:36}{c_n:>14,}{c_s:>10.2f}{c_n / c_s:>14,.0f}")
            print(f"{'  Arrow batches, 1 process':36}{a_n:>14,}{a_s:>10.2f}{a_n / a_s:>14,.0f}")
            print(
                f"{'data source ' + args.master + ', ' + label:36}{s_n:>14,}{s_s:>10.2f}{s_n / s_s:>14,.0f}"
            )
        for label, (c, s) in results.items():
            print(f"ratio data source / codec, {label}: {s / c:.2f}x")
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
