"""The zip of the ``kestreld`` package that a Spark cluster's Python workers import.

Executors (and the driver-side Python worker that plans a Python data source)
import ``kestreld.pipeline.source`` to read journals.  On a cluster nothing
has ``kestreld`` installed, so the driver ships it: ``kestreld analyze
--master spark://...`` builds this zip on the fly, ``scripts/package-pipeline``
builds it for ``spark-submit --py-files`` and notebooks.

    python -m kestreld.pipeline.package [OUTPUT.zip]   (default dist/kestreld-pipeline.zip)
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

#: The folder holding the ``kestreld`` package this module belongs to.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def build_zip(out: str | os.PathLike[str]) -> tuple[Path, int]:
    """Write ``kestreld/**/*.py`` (no tests, no caches) to ``out``; return it and the module count.

    Written to a temporary name first, so a reader never sees half a zip.
    """
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    count = 0
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for folder, dirs, files in os.walk(PACKAGE_ROOT / "kestreld"):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = Path(folder) / name
                    zf.write(path, path.relative_to(PACKAGE_ROOT).as_posix())
                    count += 1
    os.replace(tmp, target)
    return target, count


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else Path("dist") / "kestreld-pipeline.zip"
    path, count = build_zip(out)
    print(f"{path}: {count} modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
