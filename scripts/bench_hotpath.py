"""The server's own Python cost per request, in process: ``kestreld bench hotpath``.

    .venv/bin/python scripts/bench_hotpath.py --help

The code is kestreld/bench/hotpath.py; this file keeps the old command working.
"""

from kestreld.bench.hotpath import main

if __name__ == "__main__":
    raise SystemExit(main())
