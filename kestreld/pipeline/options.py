"""The options of the ``kestrel_journal`` source, as Spark passes them (batch and streaming).

Spark lower-cases option names; these helpers read them case-insensitively so
``includeData`` and ``includedata`` are one option.  Shared by
:mod:`kestreld.pipeline.source` and :mod:`kestreld.pipeline.stream`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping


def option(options: Mapping[str, str], key: str) -> str | None:
    """An option by case-insensitive name (Spark lower-cases option names)."""
    value = options.get(key)
    if value is None:
        wanted = key.lower()
        value = next((v for k, v in options.items() if k.lower() == wanted), None)
    return value


def option_bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    """A boolean option (``true``/``false``, case-insensitive)."""
    value = option(options, key)
    if value is None:
        return default
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def option_paths(options: Mapping[str, str]) -> list[str]:
    """The paths given to ``load``: ``path`` (one) or ``paths`` (a JSON list, several)."""
    paths: list[str] = []
    raw = option(options, "paths")
    if raw:
        try:
            value = json.loads(raw)
        except ValueError:
            value = [raw]
        paths.extend(value if isinstance(value, list) else [str(value)])
    single = option(options, "path")
    if single:
        paths.append(single)
    if not paths:
        raise ValueError("kestrel_journal: give a queue folder or journal files to load()")
    return paths
