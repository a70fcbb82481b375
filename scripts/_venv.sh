# Sourced by scripts/serve and scripts/test: make sure .venv exists and holds
# kestreld with the given extras.  Re-installs only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KESTRELD_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
extras="${1:-}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.kestreld-installed-${extras:-base}"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  if [ -n "$extras" ]; then
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$extras]"
  else
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT"
  fi
  touch "$stamp"
fi
