# Sourced by scripts/serve and scripts/test: make sure .venv exists and holds
# kestreld with the given extras.  One stamp records which extras are
# installed: it re-installs only when pyproject.toml changed or an extra is
# missing, so scripts/serve after scripts/test (whose extras include the
# server's) installs nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KESTRELD_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
extras="${1:-}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.kestreld-installed"
installed=""
if [ -f "$stamp" ] && [ ! "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  installed="$(cat "$stamp")"
fi
# The extras wanted now, plus those installed before (an install replaces them).
wanted="$(printf '%s\n' ${installed//,/ } ${extras//,/ } | sort -u | paste -sd, -)"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] || [ "$wanted" != "$installed" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  if [ -n "$wanted" ]; then
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$wanted]"
  else
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT"
  fi
  printf '%s' "$wanted" >"$stamp"
fi
